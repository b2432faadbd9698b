//! ethersan's raw Ethernet link layer: the medium under the AoE target
//! (EtherType 0x88A2) and ethersan's own Ethernet transport.
//!
//! A [`Link`] carries whole Ethernet frames (header included, no FCS) of
//! one EtherType, chosen when it is opened. It knows its [`MacAddr`] and
//! MTU (payload bytes per frame; a frame is at most MTU + 14 bytes), hands
//! received frames to the caller in batches ([`Link::recv_batch`]), and
//! sends one frame or a batch ([`Link::send`], [`Link::send_batch`]), or
//! builds a batch of frames in place ([`Link::send_with`]: straight in the
//! AF_PACKET transmit ring, with no intermediate buffer). Only
//! frames of the link's EtherType addressed to its MAC or to broadcast (and
//! multicast if asked) reach the caller; the rest are dropped as early as
//! the medium allows (in the kernel for AF_PACKET, by a BPF filter).
//!
//! Three media, one type:
//! - [`packet::PacketLink`]: an `AF_PACKET` socket on a named interface
//!   with a TPACKET_V3 receive ring and a transmit ring (needs
//!   CAP_NET_RAW);
//! - [`unix::UnixDgramLink`]: one unix datagram per frame, the wire format
//!   of QEMU's `-netdev dgram` with unix addresses, so a VM's NIC connects
//!   straight to ethersan without root or tap devices;
//! - [`memory::MemoryHub`] / [`memory::MemoryPort`]: an in-process switch
//!   for tests, with seeded loss, duplication, reordering and corruption.
//!
//! Every link is `Send + Sync` and is meant to be shared as `Arc<Link>`:
//! one task receives, any number send.
//!
//! A task that answers every frame to its sender (here on the in-memory
//! hub; `Link::from(PacketLink::open(PacketConfig::new("eth0",
//! ETHERTYPE_AOE))?)` is the same on a real interface):
//!
//! ```
//! use std::sync::Arc;
//! use ethersan_link::memory::MemoryHub;
//! use ethersan_link::{EthernetHeader, Link, MacAddr, ETHERTYPE_AOE, HEADER_LEN};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), ethersan_link::LinkError> {
//! let hub = MemoryHub::new(1);
//! let target = Arc::new(Link::from(hub.port(MacAddr([2, 0, 0, 0, 0, 1]), ETHERTYPE_AOE, 1500)?));
//! let client = Link::from(hub.port(MacAddr([2, 0, 0, 0, 0, 2]), ETHERTYPE_AOE, 1500)?);
//!
//! let responder = tokio::spawn({
//!     let link = target.clone();
//!     async move {
//!         loop {
//!             // Build the answers while the frames are borrowed from the
//!             // ring, then send them as one batch.
//!             let mut answers = Vec::new();
//!             link.recv_batch(|frame| {
//!                 let Some(h) = EthernetHeader::parse(frame) else { return };
//!                 let mut answer = EthernetHeader { dst: h.src, src: link.mac(), ethertype: h.ethertype }
//!                     .to_bytes()
//!                     .to_vec();
//!                 answer.extend_from_slice(&frame[HEADER_LEN..]);
//!                 answers.push(answer);
//!             })
//!             .await?;
//!             link.send_batch(&answers).await?;
//!         }
//!         #[allow(unreachable_code)]
//!         Ok::<(), ethersan_link::LinkError>(())
//!     }
//! });
//!
//! let mut request = EthernetHeader { dst: target.mac(), src: client.mac(), ethertype: ETHERTYPE_AOE }
//!     .to_bytes()
//!     .to_vec();
//! request.extend_from_slice(b"ping");
//! client.send(&request).await?;
//! let mut reply = Vec::new();
//! client.recv_batch(|f| reply = f.to_vec()).await?;
//! assert_eq!(&reply[HEADER_LEN..], b"ping");
//! responder.abort();
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs, unreachable_pub)]

pub mod error;
pub mod frame;
pub mod mac;
pub mod memory;
pub mod packet;
pub mod spec;
pub mod unix;

pub use error::LinkError;
pub use frame::{EthernetHeader, RxFilter, DEFAULT_MTU, ETHERTYPE_AOE, HEADER_LEN, MAX_MTU};
pub use mac::{MacAddr, MacAddrParseError};

use memory::MemoryPort;
use packet::PacketLink;
use unix::UnixDgramLink;

/// Most frames one [`Link::recv_batch`] call hands over (the AF_PACKET
/// link may exceed it by the rest of one ring block).
pub const RECV_BATCH: usize = 256;

/// A raw Ethernet link of one EtherType, over one of the media.
#[derive(Debug)]
pub enum Link {
    /// An `AF_PACKET` socket on a network interface.
    Packet(PacketLink),
    /// A unix datagram socket speaking QEMU's `-netdev dgram` format.
    UnixDgram(UnixDgramLink),
    /// A port of an in-memory hub.
    Memory(MemoryPort),
}

impl Link {
    /// Our MAC address: the source of frames we send, the destination of
    /// unicast frames we receive.
    pub fn mac(&self) -> MacAddr {
        self.filter().mac
    }

    /// The MTU: payload bytes per frame, not counting the 14-byte header.
    pub fn mtu(&self) -> usize {
        match self {
            Link::Packet(l) => l.mtu(),
            Link::UnixDgram(l) => l.mtu(),
            Link::Memory(l) => l.mtu(),
        }
    }

    /// The largest frame sent or received: MTU + 14.
    pub fn max_frame_len(&self) -> usize {
        self.mtu() + HEADER_LEN
    }

    /// The EtherType the link carries.
    pub fn ethertype(&self) -> u16 {
        self.filter().ethertype
    }

    /// The receive filter: our MAC, EtherType and whether multicast passes.
    pub fn filter(&self) -> RxFilter {
        match self {
            Link::Packet(l) => l.filter(),
            Link::UnixDgram(l) => l.filter(),
            Link::Memory(l) => l.filter(),
        }
    }

    /// Waits until at least one frame has arrived, then calls `f` with
    /// each frame available now (at most about [`RECV_BATCH`]), and returns
    /// how many. The slice is valid only during the call (it points into
    /// the receive ring or buffer): copy what you keep. `f` must not call
    /// `recv_batch` on the same link. Cancel-safe: a frame is handed to `f`
    /// exactly once, and a future dropped before completing has handed
    /// over none.
    pub async fn recv_batch<F: FnMut(&[u8])>(&self, f: F) -> Result<usize, LinkError> {
        match self {
            Link::Packet(l) => l.recv_batch(f).await,
            Link::UnixDgram(l) => l.recv_batch(f).await,
            Link::Memory(l) => l.recv_batch(f).await,
        }
    }

    /// Waits until a frame may have arrived, taking none: the frames are
    /// then handed over by [`try_recv_batch`](Self::try_recv_batch), which
    /// does not wait (so a caller can handle them outside the future it
    /// selects on). It may return when none is there after all; the next
    /// `try_recv_batch` then hands over nothing. Cancel-safe.
    pub async fn ready(&self) -> Result<(), LinkError> {
        match self {
            Link::Packet(l) => l.ready().await,
            Link::UnixDgram(l) => l.ready().await,
            Link::Memory(l) => l.ready().await,
        }
    }

    /// Calls `f` with each frame available now (at most about
    /// [`RECV_BATCH`]), without waiting, and returns how many. The frame
    /// is writable and valid only during the call: on AF_PACKET it is
    /// the receive ring's slot itself, so a receiver can open or decrypt
    /// it where the kernel wrote it. `f` must not receive on the same
    /// link.
    pub fn try_recv_batch<F: FnMut(&mut [u8])>(&self, f: F) -> Result<usize, LinkError> {
        match self {
            Link::Packet(l) => l.try_recv_batch(f),
            Link::UnixDgram(l) => l.try_recv_batch(f),
            Link::Memory(l) => Ok(l.try_recv_batch(f)),
        }
    }

    /// Sends one frame (header included; 14 to MTU + 14 bytes). Like
    /// Ethernet, delivery is not guaranteed: a frame the medium drops is
    /// not an error.
    pub async fn send(&self, frame: &[u8]) -> Result<(), LinkError> {
        self.send_batch(std::iter::once(frame)).await.map(|_| ())
    }

    /// Sends several frames with as few system calls as the medium allows
    /// (one kick of the AF_PACKET transmit ring per batch), and returns how
    /// many were handed to the medium. Every frame is checked against the
    /// MTU before any is sent.
    pub async fn send_batch<I, B>(&self, frames: I) -> Result<usize, LinkError>
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        match self {
            Link::Packet(l) => l.send_batch(frames).await,
            Link::UnixDgram(l) => l.send_batch(frames).await,
            Link::Memory(l) => l.send_batch(frames).await,
        }
    }

    /// Sends `n` frames built in place: `build(i, buf)` writes frame `i`
    /// (header included) at the start of `buf`, a buffer of
    /// [`max_frame_len`](Self::max_frame_len) bytes, and returns its
    /// length. On AF_PACKET `buf` is the transmit ring slot itself, so the
    /// frame is written once, where the kernel reads it, and the ring is
    /// kicked once per batch; on the other media it is a scratch buffer
    /// whose frames are sent like [`send_batch`](Self::send_batch). `buf` holds stale bytes
    /// (an earlier frame's): write every byte of the frame. A length below
    /// [`HEADER_LEN`] sends nothing for that `i` (a frame that turned out
    /// not to be needed). Frames go out in order of `i`; `build` is called
    /// once per `i`, in order, and must not send on the same link. Returns
    /// how many frames were handed to the medium.
    pub async fn send_with<F>(&self, n: usize, mut build: F) -> Result<usize, LinkError>
    where
        F: FnMut(usize, &mut [u8]) -> usize,
    {
        if let Link::Packet(l) = self {
            return l.send_with(n, build).await;
        }
        // One scratch buffer, each frame kept at its own length.
        let mut scratch = vec![0u8; self.max_frame_len()];
        let mut frames = Vec::with_capacity(n);
        for i in 0..n {
            let len = build(i, &mut scratch);
            if let Some(f) = scratch.get(..len).filter(|_| len >= HEADER_LEN) {
                frames.push(f.to_vec());
            }
        }
        self.send_batch(frames).await
    }
}

impl From<PacketLink> for Link {
    fn from(l: PacketLink) -> Self {
        Link::Packet(l)
    }
}

impl From<UnixDgramLink> for Link {
    fn from(l: UnixDgramLink) -> Self {
        Link::UnixDgram(l)
    }
}

impl From<MemoryPort> for Link {
    fn from(l: MemoryPort) -> Self {
        Link::Memory(l)
    }
}

/// Checks a frame's length against a link's largest frame.
pub(crate) fn check_frame_len(frame: &[u8], max: usize) -> Result<(), LinkError> {
    if frame.len() < HEADER_LEN || frame.len() > max {
        return Err(LinkError::FrameSize {
            len: frame.len(),
            max,
        });
    }
    Ok(())
}

/// Collects a batch of frames for a link of `mtu`, each checked by
/// [`check_frame_len`] before any is sent.
pub(crate) fn checked_batch<I, B>(frames: I, mtu: usize) -> Result<Vec<B>, LinkError>
where
    I: IntoIterator<Item = B>,
    B: AsRef<[u8]>,
{
    let frames: Vec<B> = frames.into_iter().collect();
    for f in &frames {
        check_frame_len(f.as_ref(), mtu + HEADER_LEN)?;
    }
    Ok(frames)
}

/// Checks an MTU asked for a link.
pub(crate) fn check_mtu(mtu: usize) -> Result<(), LinkError> {
    if !(68..=frame::MAX_MTU).contains(&mtu) {
        return Err(LinkError::BadMtu { mtu });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn link_is_send_and_sync() {
        assert_send_sync::<Link>();
        assert_send_sync::<std::sync::Arc<Link>>();
    }

    #[tokio::test]
    async fn frames_built_in_place_on_the_memory_hub() {
        let hub = memory::MemoryHub::new(7);
        let a = Link::from(
            hub.port(MacAddr([2, 0, 0, 0, 0, 1]), ETHERTYPE_AOE, 1500)
                .unwrap(),
        );
        let b = Link::from(
            hub.port(MacAddr([2, 0, 0, 0, 0, 2]), ETHERTYPE_AOE, 1500)
                .unwrap(),
        );
        let header = EthernetHeader {
            dst: b.mac(),
            src: a.mac(),
            ethertype: ETHERTYPE_AOE,
        }
        .to_bytes();
        let sent = a
            .send_with(4, |i, buf| {
                assert_eq!(buf.len(), 1514);
                buf[..HEADER_LEN].copy_from_slice(&header);
                buf[HEADER_LEN] = i as u8;
                // Frame 2 is declined.
                if i == 2 {
                    0
                } else {
                    HEADER_LEN + 1
                }
            })
            .await
            .unwrap();
        assert_eq!(sent, 3);
        let mut got = Vec::new();
        while got.len() < 3 {
            b.recv_batch(|f| got.push(f[HEADER_LEN..].to_vec()))
                .await
                .unwrap();
        }
        assert_eq!(got, [vec![0], vec![1], vec![3]]);
    }

    #[test]
    fn frame_len_checks() {
        assert!(check_frame_len(&[0; 14], 1514).is_ok());
        assert!(check_frame_len(&[0; 1514], 1514).is_ok());
        let e = check_frame_len(&[0; 1515], 1514).unwrap_err();
        assert!(e.to_string().contains("1515 bytes"), "{e}");
        assert!(check_frame_len(&[0; 13], 1514).is_err());
        assert!(check_mtu(9000).is_ok());
        assert!(check_mtu(67).is_err() && check_mtu(9217).is_err());
    }
}
