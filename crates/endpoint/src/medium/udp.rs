//! The UDP medium's batched socket calls: segmentation offload on send
//! (`UDP_SEGMENT`: a run of equal-sized frames to one peer leaves in one
//! `sendmsg`, the kernel cuts it into datagrams), receive offload
//! (`UDP_GRO`: the kernel hands up several datagrams of one flow as one
//! buffer, split here by the `gso_size` it reports), and `sendmmsg` /
//! `recvmmsg` where the offloads do not apply or the kernel lacks them.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// `SOL_UDP` option: segmentation offload size (Linux 4.18).
const UDP_SEGMENT: libc::c_int = 103;
/// `SOL_UDP` option: receive offload (Linux 5.0).
const UDP_GRO: libc::c_int = 104;
/// Most segments the kernel accepts in one `UDP_SEGMENT` send.
const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes of one `UDP_SEGMENT` send (an IP packet's limit, less headers).
const GSO_MAX_BYTES: usize = 65_000;
/// Most pieces of one `sendmsg` (the kernel's `UIO_MAXIOV`).
const MAX_IOV: usize = 1024;
/// Messages per `sendmmsg` / `recvmmsg` call.
pub(crate) const MMSG_BATCH: usize = 64;
/// Bytes of each receive slot: a whole coalesced (GRO) buffer fits.
pub(crate) const RECV_SLOT: usize = 65_536;
/// Receive slots per `recvmmsg` with GRO on (each may hold many frames).
const GRO_SLOTS: usize = 8;
/// Room for one `int` control message.
const CMSG_ROOM: usize = 64;

/// Which offloads a UDP socket uses; detected once when the medium is made.
#[derive(Debug)]
pub struct Offload {
    /// `UDP_SEGMENT` sends; cleared if the kernel refuses one.
    gso: AtomicBool,
    /// `UDP_GRO` was accepted by the socket.
    gro: bool,
}

impl Offload {
    /// Turns on what the kernel offers for `socket`, unless `plain`
    /// (the fallback, forced: `sendmmsg` / `recvmmsg` only).
    pub(crate) fn detect(socket: &UdpSocket, plain: bool) -> Offload {
        let fd = socket.as_raw_fd();
        let gro = !plain && setsockopt_int(fd, libc::SOL_UDP, UDP_GRO, 1);
        // Setting a zero segment size is how a kernel without GSO says so
        // (ENOPROTOOPT) while leaving a kernel with it unchanged.
        let gso = !plain && setsockopt_int(fd, libc::SOL_UDP, UDP_SEGMENT, 0);
        tracing::debug!(
            gso,
            gro,
            "udp medium: offloads (fallback sendmmsg/recvmmsg)"
        );
        Offload {
            gso: AtomicBool::new(gso),
            gro,
        }
    }

    /// Whether sends use `UDP_SEGMENT`.
    pub fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// Whether receives use `UDP_GRO`.
    pub fn gro(&self) -> bool {
        self.gro
    }
}

/// Sets an `int` socket option; whether the kernel took it.
fn setsockopt_int(fd: RawFd, level: libc::c_int, opt: libc::c_int, value: libc::c_int) -> bool {
    // SAFETY: setsockopt on an fd the caller owns, with a pointer to a
    // c_int that lives across the call and its exact size.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

/// A socket address in the kernel's form.
fn to_raw(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in.
            let sin = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// A socket address from the kernel's form; `None` for another family.
fn from_raw(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Whether a send error means the frames are lost but the medium is fine
/// (the channel retransmits them).
fn dropped(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOBUFS)
            | Some(libc::ECONNREFUSED)
            | Some(libc::EHOSTUNREACH)
            | Some(libc::ENETUNREACH)
            | Some(libc::EMSGSIZE)
            | Some(libc::EPERM)
    )
}

/// One datagram to send: `head`, then the bytes of `tail` (a gather
/// list: the payload sent from where it lies).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Datagram<'a> {
    /// Its destination.
    pub(crate) to: SocketAddr,
    /// Its first bytes.
    pub(crate) head: &'a [u8],
    /// The rest, in order.
    pub(crate) tail: &'a [Bytes],
}

impl Datagram<'_> {
    /// Its length in bytes.
    fn len(&self) -> usize {
        self.head.len() + self.tail.iter().map(|b| b.len()).sum::<usize>()
    }

    /// Appends its pieces to a gather list.
    fn iovecs(&self, out: &mut Vec<libc::iovec>) {
        out.push(libc::iovec {
            iov_base: self.head.as_ptr() as *mut libc::c_void,
            iov_len: self.head.len(),
        });
        for b in self.tail.iter().filter(|b| !b.is_empty()) {
            out.push(libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            });
        }
    }
}

/// One message of a `sendmmsg`: `frames[start..end]` to one peer, cut by
/// the kernel into datagrams of `seg` bytes (`UDP_SEGMENT`) when `seg` is
/// not zero, else one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Planned {
    start: usize,
    end: usize,
    seg: usize,
}

/// Groups `frames[from..]` into messages: with `gso`, each run of frames
/// to one peer, of one size (the last may be shorter), within the
/// kernel's limits, is one segmented message; every other frame is a
/// message of its own.
fn plan(frames: &[Datagram<'_>], lens: &[usize], from: usize, gso: bool) -> Vec<Planned> {
    let mut out = Vec::new();
    let mut i = from;
    while i < frames.len() {
        let size = lens[i];
        let mut j = i + 1;
        if gso && size > 0 {
            let mut bytes = size;
            let mut pieces = 1 + frames[i].tail.len();
            while j < frames.len()
                && j - i < GSO_MAX_SEGMENTS
                && frames[j].to == frames[i].to
                && lens[j] <= size
                && lens[j] > 0
                && bytes + lens[j] <= GSO_MAX_BYTES
                && pieces + 1 + frames[j].tail.len() <= MAX_IOV
            {
                bytes += lens[j];
                pieces += 1 + frames[j].tail.len();
                j += 1;
                if lens[j - 1] < size {
                    break;
                }
            }
        }
        let seg = if j - i > 1 { size } else { 0 };
        out.push(Planned {
            start: i,
            end: j,
            seg,
        });
        i = j;
    }
    out
}

/// Sends `frames` (each to its peer) in as few `sendmmsg` calls as the
/// batch limit allows: runs of equal-sized frames to one peer as
/// `UDP_SEGMENT` messages when `off` allows, the rest one datagram per
/// message. Lost frames are not an error.
pub(crate) async fn send(
    socket: &UdpSocket,
    off: &Offload,
    frames: &[Datagram<'_>],
) -> std::io::Result<()> {
    let lens: Vec<usize> = frames.iter().map(Datagram::len).collect();
    let mut plans = plan(frames, &lens, 0, off.gso());
    let mut k = 0;
    while k < plans.len() {
        let end = (k + MMSG_BATCH).min(plans.len());
        match send_planned(socket, frames, &plans[k..end]).await {
            Ok(n) => k += n.max(1),
            Err(e)
                if plans[k].seg != 0
                    && matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL)) =>
            {
                // The device or kernel cannot segment: from now on every
                // frame is a datagram of its own.
                off.gso.store(false, Ordering::Relaxed);
                tracing::debug!(error = %e, "udp medium: UDP_SEGMENT refused, one datagram per frame");
                let from = plans[k].start;
                plans.truncate(k);
                plans.extend(plan(frames, &lens, from, false));
            }
            // The first message's error: its frames are lost, go on.
            Err(e) if dropped(&e) => k += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One `sendmmsg` of `plans` (at most [`MMSG_BATCH`]); how many messages
/// the kernel took.
async fn send_planned(
    socket: &UdpSocket,
    frames: &[Datagram<'_>],
    plans: &[Planned],
) -> std::io::Result<usize> {
    let mut addrs: Vec<(libc::sockaddr_storage, libc::socklen_t)> =
        plans.iter().map(|p| to_raw(&frames[p.start].to)).collect();
    let mut control = vec![[0u64; CMSG_ROOM / 8]; plans.len()];
    socket
        .async_io(Interest::WRITABLE, || {
            // Each message's pieces, consecutive in one list (made here:
            // raw pointers do not cross the await).
            let mut iov: Vec<libc::iovec> = Vec::with_capacity(plans.len() * 4);
            let mut runs: Vec<(usize, usize)> = Vec::with_capacity(plans.len());
            for p in plans {
                let at = iov.len();
                for f in &frames[p.start..p.end] {
                    f.iovecs(&mut iov);
                }
                runs.push((at, iov.len() - at));
            }
            let base = iov.as_mut_ptr();
            let mut msgs: Vec<libc::mmsghdr> = Vec::with_capacity(plans.len());
            for (k, p) in plans.iter().enumerate() {
                let (at, n) = runs[k];
                // SAFETY: mmsghdr is plain data; all-zero is valid.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = (&mut addrs[k].0 as *mut libc::sockaddr_storage).cast();
                m.msg_hdr.msg_namelen = addrs[k].1;
                // SAFETY: at + n <= iov.len(): the run was pushed above and
                // `iov` is not changed after.
                m.msg_hdr.msg_iov = unsafe { base.add(at) };
                m.msg_hdr.msg_iovlen = n as _;
                if p.seg != 0 {
                    m.msg_hdr.msg_control = control[k].as_mut_ptr().cast();
                    // SAFETY: CMSG_SPACE only computes a size.
                    m.msg_hdr.msg_controllen =
                        unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as _;
                    // SAFETY: msg_control points at control[k], 8-aligned
                    // and larger than CMSG_SPACE(2); CMSG_FIRSTHDR of it is
                    // in bounds.
                    unsafe {
                        let cmsg = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                        (*cmsg).cmsg_level = libc::SOL_UDP;
                        (*cmsg).cmsg_type = UDP_SEGMENT;
                        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
                        std::ptr::write_unaligned(
                            libc::CMSG_DATA(cmsg).cast::<u16>(),
                            p.seg as u16,
                        );
                    }
                }
                msgs.push(m);
            }
            // SAFETY: msgs and everything it points to (addresses, iovecs
            // over the caller's frames, control buffers) live across the
            // call.
            let rc = unsafe {
                libc::sendmmsg(socket.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as _, 0)
            };
            if rc < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(rc as usize)
            }
        })
        .await
}

/// Waits for at least one datagram, then receives what is there now (one
/// `recvmmsg`), giving each frame's sender and place in `rbuf` to `push`,
/// in ascending order; coalesced (GRO) buffers are split at their segment
/// size. `rbuf` is the receive area, grown once and kept. Cancel-safe.
pub(crate) async fn recv(
    socket: &UdpSocket,
    off: &Offload,
    rbuf: &mut Vec<u8>,
    slot: usize,
    mut push: impl FnMut(SocketAddr, std::ops::Range<usize>),
) -> std::io::Result<()> {
    let (slots, slot) = if off.gro() {
        (GRO_SLOTS, RECV_SLOT)
    } else {
        (MMSG_BATCH, slot.max(1))
    };
    if rbuf.len() < slots * slot {
        rbuf.resize(slots * slot, 0);
    }
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut addrs: Vec<libc::sockaddr_storage> = vec![unsafe { std::mem::zeroed() }; slots];
    let mut control = vec![[0u64; CMSG_ROOM / 8]; slots];
    socket
        .async_io(Interest::READABLE, || {
            let base = rbuf.as_mut_ptr();
            let mut iov: Vec<libc::iovec> = (0..slots)
                .map(|k| libc::iovec {
                    // SAFETY: k * slot + slot <= rbuf.len().
                    iov_base: unsafe { base.add(k * slot) }.cast(),
                    iov_len: slot,
                })
                .collect();
            let mut msgs: Vec<libc::mmsghdr> = iov
                .iter_mut()
                .zip(addrs.iter_mut().zip(control.iter_mut()))
                .map(|(v, (a, c))| {
                    // SAFETY: mmsghdr is plain data; all-zero is valid.
                    let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                    m.msg_hdr.msg_name = (a as *mut libc::sockaddr_storage).cast();
                    m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
                    m.msg_hdr.msg_iov = v;
                    m.msg_hdr.msg_iovlen = 1;
                    m.msg_hdr.msg_control = c.as_mut_ptr().cast();
                    m.msg_hdr.msg_controllen = CMSG_ROOM as _;
                    m
                })
                .collect();
            // SAFETY: msgs and everything it points to (addresses, iovecs
            // into rbuf, control buffers) live across the call.
            let rc = unsafe {
                libc::recvmmsg(
                    socket.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    msgs.len() as _,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            for (k, m) in msgs.iter().enumerate().take(rc as usize) {
                let len = (m.msg_len as usize).min(slot);
                // SAFETY: the kernel filled the address (msg_name points at
                // addrs[k]); reading it through the header's pointer.
                let Some(from) =
                    from_raw(unsafe { &*m.msg_hdr.msg_name.cast::<libc::sockaddr_storage>() })
                else {
                    continue;
                };
                let start = k * slot;
                let mut seg = len;
                // SAFETY: the control buffer was filled by the kernel up to
                // msg_controllen; the CMSG macros walk only within it.
                unsafe {
                    let mut c = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                    while !c.is_null() {
                        if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                            let v =
                                std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                            if v > 0 {
                                seg = v as usize;
                            }
                        }
                        c = libc::CMSG_NXTHDR(&m.msg_hdr, c);
                    }
                }
                if seg == 0 {
                    push(from, start..start + len);
                    continue;
                }
                let mut at = 0;
                while at < len {
                    let end = (at + seg).min(len);
                    push(from, start + at..start + end);
                    at = end;
                }
            }
            Ok(())
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of 9000-byte frames (and a short last one) over loopback
    /// arrives intact and in order, with the offloads and without.
    async fn round_trip(offload: bool) {
        let a = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        // As a medium does: a default receive buffer overflows with a
        // batch of 20 jumbo datagrams while the receiver is not scheduled.
        crate::medium::grow_buffers(&b, crate::medium::UDP_BUFFER);
        let oa = Offload::detect(&a, !offload);
        let ob = Offload::detect(&b, !offload);
        if !offload {
            assert!(!oa.gso() && !ob.gro());
        }
        let to = b.local_addr().unwrap();
        let frames: Vec<Vec<u8>> = (0..20u8)
            .map(|k| vec![k; if k == 19 { 1234 } else { 9000 }])
            .collect();
        // Half the frames as a header and a gathered payload.
        let tails: Vec<[Bytes; 2]> = frames
            .iter()
            .map(|f| {
                let b = Bytes::copy_from_slice(&f[f.len().min(16)..]);
                [b.slice(..b.len() / 2), b.slice(b.len() / 2..)]
            })
            .collect();
        let list: Vec<Datagram<'_>> = frames
            .iter()
            .zip(&tails)
            .enumerate()
            .map(|(k, (f, t))| {
                if k % 2 == 0 {
                    Datagram {
                        to,
                        head: f,
                        tail: &[],
                    }
                } else {
                    Datagram {
                        to,
                        head: &f[..f.len().min(16)],
                        tail: t,
                    }
                }
            })
            .collect();
        send(&a, &oa, &list).await.unwrap();
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut rbuf = Vec::new();
        let mut ranges = Vec::new();
        let from = a.local_addr().unwrap();
        while got.len() < frames.len() {
            tokio::time::timeout(
                std::time::Duration::from_secs(10),
                recv(&b, &ob, &mut rbuf, 9000, |src, r| {
                    assert_eq!(src, from);
                    ranges.push(r);
                }),
            )
            .await
            .expect("frames lost on loopback")
            .unwrap();
            for r in ranges.drain(..) {
                got.push(rbuf[r].to_vec());
            }
        }
        assert_eq!(got, frames);
    }

    /// Runs of one peer and one size (the last may be shorter) become one
    /// segmented message; a larger frame, another peer or a short frame
    /// ends a run; without GSO every frame is a message.
    #[test]
    fn plan_groups_runs_by_peer_and_size() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let big = [0u8; 9000];
        let small = [0u8; 100];
        let d = |to, head| Datagram {
            to,
            head,
            tail: &[],
        };
        let frames = [
            d(a, &big[..]),
            d(a, &big[..]),
            d(a, &small[..]),
            d(a, &big[..]),
            d(b, &big[..]),
            d(b, &big[..]),
            d(b, &big[..]),
            d(a, &small[..]),
            d(a, &big[..]),
        ];
        let lens: Vec<usize> = frames.iter().map(Datagram::len).collect();
        let p = |start, end, seg| Planned { start, end, seg };
        assert_eq!(
            plan(&frames, &lens, 0, true),
            vec![
                p(0, 3, 9000),
                p(3, 4, 0),
                p(4, 7, 9000),
                p(7, 8, 0),
                p(8, 9, 0)
            ]
        );
        assert_eq!(plan(&frames, &lens, 0, false).len(), frames.len());
        // At most 65,000 bytes per segmented message: 7 of 9000.
        let many: Vec<Datagram<'_>> = (0..10).map(|_| d(a, &big[..])).collect();
        let lens: Vec<usize> = many.iter().map(Datagram::len).collect();
        assert_eq!(
            plan(&many, &lens, 0, true),
            vec![p(0, 7, 9000), p(7, 10, 9000)]
        );
    }

    #[tokio::test]
    async fn gso_gro_batch_intact_in_order() {
        round_trip(true).await;
    }

    #[tokio::test]
    async fn fallback_batch_intact_in_order() {
        round_trip(false).await;
    }
}
