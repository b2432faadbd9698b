//! The memory-mapped TPACKET_V3 rings of an AF_PACKET socket
//! (Documentation/networking/packet_mmap.rst).
//!
//! One `mmap` of the socket covers the receive ring, then the transmit
//! ring. Ownership of ring memory passes between kernel and user through
//! status words, and these are the invariants the code keeps:
//!
//! - **Receive** is a ring of `blocks` blocks of `block_size` bytes. A
//!   block belongs to the kernel while its `block_status` lacks
//!   `TP_STATUS_USER`: we never read its frames then. The kernel fills a
//!   block, then sets `TP_STATUS_USER` (after a write barrier); we read
//!   the status with `Acquire`, walk its `num_pkts` frames (each a
//!   `tpacket3_hdr`, then `sockaddr_ll`, the frame at `tp_mac`, the next
//!   header at `tp_next_offset`), and hand it back by storing
//!   `TP_STATUS_KERNEL` with `Release` once no slice into it is alive (the
//!   callback got each frame as a `&[u8]` borrowed only for its call). The
//!   kernel hands blocks over strictly in ring order, so we keep one index,
//!   `next`, and stop at the first block still the kernel's. A block is
//!   retired to us when full or after the retire timeout (`tp_retire_blk_tov`),
//!   so under light load a frame waits up to that timeout.
//! - **Transmit** is a ring of fixed-size frame slots (TPACKET_V3 transmit
//!   is frame based: `tp_next_offset` must be 0). A slot is ours while its
//!   `tp_status` is `TP_STATUS_AVAILABLE` (or `TP_STATUS_WRONG_FORMAT`,
//!   which the kernel leaves on a frame it discarded because `PACKET_LOSS`
//!   is set). We copy the frame to the slot's data offset, set `tp_len`,
//!   then store `TP_STATUS_SEND_REQUEST` with `Release`; from then on the
//!   slot is the kernel's until it stores `TP_STATUS_AVAILABLE` again
//!   (when the skb is freed). We fill slots strictly in ring order, as the
//!   kernel sends them, and a `sendto(fd, NULL, 0, MSG_DONTWAIT)` ("kick")
//!   makes the kernel send every requested slot from its head onwards.
//! - The mapping outlives both ring views: [`Mapping`] is unmapped when the
//!   [`PacketLink`](super::PacketLink) drops, after the rings, and the
//!   views hold raw pointers only into it, behind the link's mutexes.

use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use libc::{tpacket3_hdr, tpacket_block_desc, tpacket_hdr_v1};

/// Offset of `block_status` in a block descriptor.
const BLOCK_STATUS: usize = std::mem::offset_of!(tpacket_block_desc, hdr)
    + std::mem::offset_of!(tpacket_hdr_v1, block_status);
/// Offset of `tp_status` in a frame header.
const FRAME_STATUS: usize = std::mem::offset_of!(tpacket3_hdr, tp_status);
/// Where `sockaddr_ll` follows a `tpacket3_hdr` (`TPACKET_ALIGN`ed).
const SLL_OFFSET: usize = (std::mem::size_of::<tpacket3_hdr>() + libc::TPACKET_ALIGNMENT - 1)
    & !(libc::TPACKET_ALIGNMENT - 1);
/// Where a transmitted frame's data starts in its slot:
/// `tp_hdrlen - sizeof(sockaddr_ll)` for TPACKET_V3.
pub(super) const TX_DATA_OFFSET: usize = SLL_OFFSET;

/// A shared mapping of a packet socket's rings; unmapped on drop.
#[derive(Debug)]
pub(super) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all access to it goes through
// the ring views, which the link keeps behind mutexes.
unsafe impl Send for Mapping {}
// SAFETY: as for Send; `Mapping` itself only offers its base pointer.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd`'s rings (receive ring first).
    pub(super) fn new(fd: RawFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping chosen by the kernel: no existing
        // memory is affected, and the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Mapping { ptr, len })
    }

    pub(super) fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the region mapped in `new`; no ring view
        // is used after the link (which owns this mapping) is dropped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The status word at `p`, shared with the kernel.
///
/// # Safety
/// `p` must be 4-byte aligned and inside the live ring mapping.
unsafe fn status<'a>(p: *mut u8) -> &'a AtomicU32 {
    // SAFETY: per the contract; AtomicU32 has the layout of u32.
    unsafe { &*p.cast::<AtomicU32>() }
}

/// The user's view of the receive ring.
#[derive(Debug)]
pub(super) struct RxRing {
    base: *mut u8,
    block_size: usize,
    blocks: usize,
    next: usize,
}

// SAFETY: the pointer is into the mapping the link owns; the view is used
// under the link's receive mutex only.
unsafe impl Send for RxRing {}

impl RxRing {
    /// # Safety
    /// `base` must point to `blocks * block_size` bytes of a TPACKET_V3
    /// receive ring mapping that outlives the view.
    pub(super) unsafe fn new(base: *mut u8, block_size: usize, blocks: usize) -> RxRing {
        RxRing {
            base,
            block_size,
            blocks,
            next: 0,
        }
    }

    /// Walks the blocks the kernel has handed over, in order, calling `f`
    /// with each frame and its `sll_pkttype`, and returns each block to the
    /// kernel after its last frame. Stops after the block in which `max`
    /// frames were reached, or at the first block still the kernel's; in
    /// that case, and only then, returns true (the ring is empty).
    pub(super) fn drain(&mut self, max: usize, mut f: impl FnMut(&[u8], u8)) -> bool {
        let mut frames = 0;
        loop {
            // SAFETY: `next < blocks`, so the block lies in the ring.
            let block = unsafe { self.base.add(self.next * self.block_size) };
            // SAFETY: block starts are page aligned and in the mapping.
            let st = unsafe { status(block.add(BLOCK_STATUS)) };
            if st.load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                return true;
            }
            // SAFETY: the block is ours (TP_STATUS_USER, read with Acquire),
            // so the kernel does not write it; the descriptor is at its start.
            let desc = unsafe { block.cast::<tpacket_block_desc>().read() };
            // SAFETY: version 3 rings use the `bh1` member of the union.
            let bh = unsafe { desc.hdr.bh1 };
            let mut off = bh.offset_to_first_pkt as usize;
            for _ in 0..bh.num_pkts {
                if off + SLL_OFFSET + std::mem::size_of::<libc::sockaddr_ll>() > self.block_size {
                    break; // Not a layout the kernel writes; skip the rest.
                }
                // SAFETY: `off` plus the headers is inside this block (checked
                // above), the block is ours, and the kernel aligns headers.
                let h = unsafe { block.add(off).cast::<tpacket3_hdr>().read() };
                // SAFETY: as above; `sll_pkttype` is one byte of the
                // sockaddr_ll after the header.
                let pkttype = unsafe {
                    block
                        .add(off + SLL_OFFSET)
                        .cast::<libc::sockaddr_ll>()
                        .read()
                        .sll_pkttype
                };
                let start = off + usize::from(h.tp_mac);
                let len = h.tp_snaplen as usize;
                if start + len <= self.block_size && h.tp_snaplen == h.tp_len {
                    // SAFETY: the frame lies inside the block (checked), the
                    // block stays ours until after `f` returns, and the
                    // slice does not outlive the call.
                    let frame = unsafe { std::slice::from_raw_parts(block.add(start), len) };
                    f(frame, pkttype);
                }
                frames += 1;
                if h.tp_next_offset == 0 {
                    break;
                }
                off += h.tp_next_offset as usize;
            }
            st.store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.next = (self.next + 1) % self.blocks;
            if frames >= max {
                return false;
            }
        }
    }
}

/// The user's view of the transmit ring.
#[derive(Debug)]
pub(super) struct TxRing {
    base: *mut u8,
    block_size: usize,
    frame_size: usize,
    frames_per_block: usize,
    frames: usize,
    next: usize,
}

// SAFETY: the pointer is into the mapping the link owns; the view is used
// under the link's transmit mutex only.
unsafe impl Send for TxRing {}

impl TxRing {
    /// # Safety
    /// `base` must point to the transmit ring of the mapping (`blocks`
    /// blocks of `block_size` bytes, `frame_size`-byte slots that do not
    /// cross blocks), which must outlive the view.
    pub(super) unsafe fn new(
        base: *mut u8,
        block_size: usize,
        frame_size: usize,
        blocks: usize,
    ) -> TxRing {
        let frames_per_block = block_size / frame_size;
        TxRing {
            base,
            block_size,
            frame_size,
            frames_per_block,
            frames: frames_per_block * blocks,
            next: 0,
        }
    }

    /// Largest frame a slot holds.
    pub(super) fn max_frame(&self) -> usize {
        self.frame_size - TX_DATA_OFFSET
    }

    fn slot(&self, i: usize) -> *mut u8 {
        let (block, within) = (i / self.frames_per_block, i % self.frames_per_block);
        // SAFETY: `i < frames`, so the slot lies inside the transmit ring.
        unsafe {
            self.base
                .add(block * self.block_size + within * self.frame_size)
        }
    }

    /// Whether the next slot is ours to fill.
    pub(super) fn next_is_free(&self) -> bool {
        // SAFETY: slot starts are 16-byte aligned and inside the ring.
        let st = unsafe { status(self.slot(self.next).add(FRAME_STATUS)) };
        matches!(
            st.load(Ordering::Acquire),
            libc::TP_STATUS_AVAILABLE | libc::TP_STATUS_WRONG_FORMAT
        )
    }

    /// Copies `frame` into the next slot and requests its sending, or
    /// returns false if that slot is still the kernel's.
    pub(super) fn push(&mut self, frame: &[u8]) -> bool {
        debug_assert!(frame.len() <= self.max_frame());
        if !self.next_is_free() {
            return false;
        }
        let slot = self.slot(self.next);
        // SAFETY: the slot is ours (status AVAILABLE, read with Acquire):
        // the kernel does not touch it until we set SEND_REQUEST. The data
        // fits: frame.len() <= frame_size - TX_DATA_OFFSET.
        unsafe {
            let h = slot.cast::<tpacket3_hdr>();
            (*h).tp_next_offset = 0;
            (*h).tp_len = frame.len() as u32;
            (*h).tp_snaplen = frame.len() as u32;
            std::ptr::copy_nonoverlapping(frame.as_ptr(), slot.add(TX_DATA_OFFSET), frame.len());
        }
        // SAFETY: as in `next_is_free`.
        let st = unsafe { status(slot.add(FRAME_STATUS)) };
        st.store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
        self.next = (self.next + 1) % self.frames;
        true
    }
}
