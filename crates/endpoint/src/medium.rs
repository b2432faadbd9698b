//! What an endpoint sends its frames over: raw Ethernet (any
//! [`ethersan_link::Link`]: an interface, QEMU's datagram socket, the
//! in-memory hub) or a UDP socket.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use ethersan_link::{EthernetHeader, Link, MacAddr, HEADER_LEN};
use tokio::net::UdpSocket;

pub mod mtu;
pub mod udp;

/// IPv4 and UDP headers: what a UDP datagram costs of the link's MTU.
const UDP_V4_OVERHEAD: usize = 28;
/// IPv6 and UDP headers.
const UDP_V6_OVERHEAD: usize = 48;

/// Socket buffer size asked for UDP media (each direction).
const UDP_BUFFER: libc::c_int = 8 << 20;

/// Sets the socket's receive and send buffers to `bytes`, past the
/// system's limit where allowed (root: SO_RCVBUFFORCE); failures leave
/// the defaults.
fn grow_buffers(socket: &UdpSocket, bytes: libc::c_int) {
    use std::os::fd::AsRawFd;
    let fd = socket.as_raw_fd();
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        for opt in [force, plain] {
            // SAFETY: setsockopt on a socket fd we own, with a pointer to a
            // c_int that lives across the call and its exact size.
            let rc = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    (&bytes as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc == 0 {
                break;
            }
        }
    }
}

/// A batch of received frames: each a sender and a range of one buffer,
/// handled in place (no copy per frame).
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    /// Where the frames are.
    buf: Vec<u8>,
    /// Each frame's sender and bytes in `buf`.
    frames: Vec<(PeerAddr, std::ops::Range<usize>)>,
}

impl Inbox {
    /// The frames received, in order, each writable (opened in place).
    pub(crate) fn frames(&mut self) -> impl Iterator<Item = (PeerAddr, &mut [u8])> + '_ {
        // Ranges of one batch are disjoint and ascending: split the buffer
        // as they go.
        let mut rest: &mut [u8] = &mut self.buf;
        let mut at = 0usize;
        self.frames.iter().filter_map(move |(peer, r)| {
            let skip = r.start.checked_sub(at)?;
            let len = r.end.checked_sub(r.start)?;
            if skip + len > rest.len() {
                return None;
            }
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
            let (frame, tail) = tail.split_at_mut(len);
            rest = tail;
            at = r.end;
            Some((*peer, frame))
        })
    }
}

/// A peer's address on the medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerAddr {
    /// A MAC address on an Ethernet link.
    Mac(MacAddr),
    /// A UDP socket address.
    Udp(SocketAddr),
}

impl std::fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerAddr::Mac(m) => write!(f, "{m}"),
            PeerAddr::Udp(a) => write!(f, "udp:{a}"),
        }
    }
}

/// The medium of an endpoint.
#[derive(Debug, Clone)]
pub enum Medium {
    /// Raw Ethernet frames of the link's EtherType.
    Ethernet(Arc<Link>),
    /// UDP datagrams; `max_payload` is the largest datagram payload sent
    /// (the path MTU less the IP and UDP headers).
    Udp {
        /// The socket.
        socket: Arc<UdpSocket>,
        /// Largest payload per datagram.
        max_payload: usize,
        /// The segmentation and receive offloads in use.
        offload: Arc<udp::Offload>,
    },
}

impl Medium {
    /// A UDP medium for a path of `mtu` bytes (IP packet size): frames are
    /// at most `mtu` less the IP and UDP headers.
    ///
    /// Sends use `UDP_SEGMENT` and receives `UDP_GRO` where the kernel has
    /// them, unless the environment variable `ETHERSAN_UDP_NO_OFFLOAD` is
    /// set (then `sendmmsg` / `recvmmsg` only, as on a kernel without).
    pub fn udp(socket: UdpSocket, mtu: usize) -> std::io::Result<Medium> {
        let plain = std::env::var_os("ETHERSAN_UDP_NO_OFFLOAD").is_some();
        Medium::udp_with(socket, mtu, !plain)
    }

    /// [`Medium::udp`] with the offloads chosen: `offload` false forces the
    /// fallback (`sendmmsg` / `recvmmsg` of single datagrams).
    pub fn udp_with(socket: UdpSocket, mtu: usize, offload: bool) -> std::io::Result<Medium> {
        let v6 = socket.local_addr()?.is_ipv6();
        let overhead = if v6 { UDP_V6_OVERHEAD } else { UDP_V4_OVERHEAD };
        socket.set_broadcast(true)?;
        // Bursts of a full window must not overflow the default socket
        // buffers (a few hundred KiB): a drop there is a retransmission.
        grow_buffers(&socket, UDP_BUFFER);
        let offload = Arc::new(udp::Offload::detect(&socket, !offload));
        Ok(Medium::Udp {
            offload,
            socket: Arc::new(socket),
            max_payload: mtu.saturating_sub(overhead).max(576),
        })
    }

    /// The largest frame (native transport bytes, without the Ethernet
    /// header) this medium carries.
    pub fn max_frame(&self) -> usize {
        match self {
            Medium::Ethernet(l) => l.mtu(),
            Medium::Udp { max_payload, .. } => *max_payload,
        }
    }

    /// Bytes every outgoing frame buffer leaves free at its start for the
    /// link header (the Ethernet header, written in place).
    pub fn headroom(&self) -> usize {
        match self {
            Medium::Ethernet(_) => HEADER_LEN,
            Medium::Udp { .. } => 0,
        }
    }

    /// Our own address, for messages.
    pub fn local(&self) -> String {
        match self {
            Medium::Ethernet(l) => l.mac().to_string(),
            Medium::Udp { socket, .. } => socket
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "udp".into()),
        }
    }

    /// Waits for frames. UDP frames are received into `inbox` (emptied
    /// first), where the kernel writes them; Ethernet frames stay in the
    /// link's receive ring until [`Medium::deliver`]. Cancel-safe.
    pub(crate) async fn recv_batch(&self, inbox: &mut Inbox) -> std::io::Result<()> {
        inbox.frames.clear();
        match self {
            Medium::Ethernet(link) => link.ready().await.map_err(std::io::Error::other),
            Medium::Udp {
                socket,
                max_payload,
                offload,
            } => {
                // The kernel's buffers land in the inbox's buffer (zeroed
                // once, kept); each frame is a range of it.
                let Inbox { buf, frames } = inbox;
                udp::recv(socket, offload, buf, *max_payload, |from, range| {
                    frames.push((PeerAddr::Udp(from), range));
                })
                .await
            }
        }
    }

    /// Hands each frame [`Medium::recv_batch`] waited for to `f` with its
    /// sender, writable and without the link header: UDP frames where
    /// they lie in `inbox`, Ethernet frames in the receive ring's slot
    /// itself (no copy: `f` opens, decrypts or places them there). Never
    /// waits; `f` must not receive on this medium.
    pub(crate) fn deliver(
        &self,
        inbox: &mut Inbox,
        mut f: impl FnMut(PeerAddr, &mut [u8]),
    ) -> std::io::Result<()> {
        match self {
            Medium::Ethernet(link) => {
                let ethertype = link.ethertype();
                link.try_recv_batch(|frame| {
                    let Some(h) = EthernetHeader::parse(frame) else {
                        return;
                    };
                    if h.ethertype == ethertype {
                        f(PeerAddr::Mac(h.src), &mut frame[HEADER_LEN..]);
                    }
                })
                .map_err(std::io::Error::other)?;
            }
            Medium::Udp { .. } => {
                for (peer, frame) in inbox.frames() {
                    f(peer, frame);
                }
            }
        }
        Ok(())
    }

    /// Sends every frame of `frames` to its peer. A frame the medium drops
    /// is not an error (the channel retransmits); a frame addressed in the
    /// other medium's kind is skipped.
    /// Every buffer starts with [`Medium::headroom`] bytes for the link
    /// header, filled in here (on an AF_PACKET link the frame is built in
    /// its transmit slot: the header written there, the buffer left as is).
    ///
    /// `tails` are gathered payloads, by index into `frames` (ascending):
    /// each goes after its frame's bytes in the same datagram (UDP sends
    /// it from where it lies; Ethernet appends it to the frame first).
    pub(crate) async fn send_batch(
        &self,
        frames: &mut [(PeerAddr, Vec<u8>)],
        tails: &[(usize, Vec<Bytes>)],
    ) -> std::io::Result<()> {
        match self {
            Medium::Ethernet(link) => {
                for (i, tail) in tails {
                    if let Some((_, f)) = frames.get_mut(*i) {
                        for b in tail {
                            f.extend_from_slice(b);
                        }
                    }
                }
                let src = link.mac();
                let ethertype = link.ethertype();
                if matches!(**link, Link::Packet(_)) {
                    // Built in the transmit slots: the header written
                    // there, the payload copied once, one kick per batch.
                    link.send_with(frames.len(), |i, slot| {
                        let (peer, f) = &frames[i];
                        let PeerAddr::Mac(dst) = *peer else {
                            return 0;
                        };
                        if f.len() <= HEADER_LEN || f.len() > slot.len() {
                            return 0;
                        }
                        let header = EthernetHeader {
                            dst,
                            src,
                            ethertype,
                        };
                        slot[..HEADER_LEN].copy_from_slice(&header.to_bytes());
                        slot[HEADER_LEN..f.len()].copy_from_slice(&f[HEADER_LEN..]);
                        f.len()
                    })
                    .await
                    .map_err(std::io::Error::other)?;
                    return Ok(());
                }
                for (peer, f) in frames.iter_mut() {
                    let PeerAddr::Mac(dst) = *peer else { continue };
                    if f.len() >= HEADER_LEN {
                        f[..HEADER_LEN].copy_from_slice(
                            &EthernetHeader {
                                dst,
                                src,
                                ethertype,
                            }
                            .to_bytes(),
                        );
                    }
                }
                link.send_batch(
                    frames
                        .iter()
                        .filter(|(p, f)| matches!(p, PeerAddr::Mac(_)) && f.len() > HEADER_LEN)
                        .map(|(_, f)| f),
                )
                .await
                .map_err(std::io::Error::other)?;
                Ok(())
            }
            Medium::Udp {
                socket, offload, ..
            } => {
                let mut tails = tails.iter().peekable();
                let list: Vec<udp::Datagram<'_>> = frames
                    .iter()
                    .enumerate()
                    .filter_map(|(i, (peer, f))| {
                        while tails.next_if(|(k, _)| *k < i).is_some() {}
                        let tail = tails
                            .next_if(|(k, _)| *k == i)
                            .map_or(&[][..], |(_, t)| t.as_slice());
                        match peer {
                            PeerAddr::Udp(to) => Some(udp::Datagram {
                                to: *to,
                                head: f.as_slice(),
                                tail,
                            }),
                            PeerAddr::Mac(_) => None,
                        }
                    })
                    .collect();
                udp::send(socket, offload, &list).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames are handed out as their own ranges of the buffer, in order,
    /// writable; gaps between them (the rest of a receive slot) are skipped.
    #[test]
    fn inbox_frames_are_their_ranges() {
        let a = PeerAddr::Mac(MacAddr([2, 0, 0, 0, 0, 1]));
        let b = PeerAddr::Mac(MacAddr([2, 0, 0, 0, 0, 2]));
        let mut inbox = Inbox {
            buf: (0..100u8).collect(),
            frames: vec![(a, 0..10), (b, 10..15), (a, 40..42), (b, 99..100)],
        };
        let mut got = Vec::new();
        for (peer, f) in inbox.frames() {
            f[0] ^= 0xff;
            got.push((peer, f.to_vec()));
        }
        let want: Vec<(PeerAddr, Vec<u8>)> = vec![
            (a, (0..10).collect()),
            (b, (10..15).collect()),
            (a, vec![40, 41]),
            (b, vec![99]),
        ]
        .into_iter()
        .map(|(p, mut v)| {
            v[0] ^= 0xff;
            (p, v)
        })
        .collect();
        assert_eq!(got, want);
        assert_eq!(inbox.buf[40], 40 ^ 0xff, "written in place");
    }
}
