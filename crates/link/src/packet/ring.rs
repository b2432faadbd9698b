//! The memory-mapped TPACKET_V3 (or V2) rings of an AF_PACKET socket
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
//! - **Receive, TPACKET_V2** (the low-latency choice) is a ring of
//!   fixed-size frame slots with the same protocol per slot instead of per
//!   block: a slot is ours while its `tp_status` has `TP_STATUS_USER`
//!   (read with `Acquire`), its frame is at `tp_mac`, and we hand it back
//!   with `TP_STATUS_KERNEL` (`Release`) after the callback. The kernel
//!   wakes the reader for every frame, so nothing waits for a timer.
//! - **Transmit** is a ring of fixed-size frame slots (TPACKET_V3 transmit
//!   is frame based: `tp_next_offset` must be 0). A slot is ours while its
//!   `tp_status` is `TP_STATUS_AVAILABLE` (or `TP_STATUS_WRONG_FORMAT`,
//!   which the kernel leaves on a frame it discarded because `PACKET_LOSS`
//!   is set). The frame is written at the slot's data offset (copied there,
//!   or built there in place by the caller), we set `tp_len`,
//!   then store `TP_STATUS_SEND_REQUEST` with `Release`; from then on the
//!   slot is the kernel's until it stores `TP_STATUS_AVAILABLE` again
//!   (when the skb is freed). The slot header is the socket's version
//!   (`tpacket3_hdr` or `tpacket2_hdr`). We fill slots strictly in ring
//!   order, as the kernel sends them, and a `sendto(fd, NULL, 0,
//!   MSG_DONTWAIT)` ("kick") makes the kernel send every requested slot
//!   from its head onwards.
//! - The mapping outlives the ring views: [`Mapping`] is unmapped when the
//!   [`PacketLink`](super::PacketLink) drops, after the rings, and the
//!   views hold raw pointers only into it, behind the link's mutexes.

use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use libc::{tpacket2_hdr, tpacket3_hdr, tpacket_block_desc, tpacket_hdr_v1};

/// Offset of `block_status` in a block descriptor.
const BLOCK_STATUS: usize = std::mem::offset_of!(tpacket_block_desc, hdr)
    + std::mem::offset_of!(tpacket_hdr_v1, block_status);

/// `TPACKET_ALIGN`.
const fn align(x: usize) -> usize {
    (x + libc::TPACKET_ALIGNMENT - 1) & !(libc::TPACKET_ALIGNMENT - 1)
}

/// Where `sockaddr_ll` follows a `tpacket3_hdr`.
const SLL_OFFSET_V3: usize = align(std::mem::size_of::<tpacket3_hdr>());
/// Where `sockaddr_ll` follows a `tpacket2_hdr`.
const SLL_OFFSET_V2: usize = align(std::mem::size_of::<tpacket2_hdr>());

/// The TPACKET version of a socket's rings (one per socket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    V2,
    V3,
}

impl Version {
    /// Offset of `tp_status` in this version's frame header.
    const fn status_offset(self) -> usize {
        match self {
            Version::V2 => std::mem::offset_of!(tpacket2_hdr, tp_status),
            Version::V3 => std::mem::offset_of!(tpacket3_hdr, tp_status),
        }
    }

    /// Where a transmitted frame's data starts in its slot:
    /// `tp_hdrlen - sizeof(sockaddr_ll)`.
    pub(super) const fn tx_data_offset(self) -> usize {
        match self {
            Version::V2 => SLL_OFFSET_V2,
            Version::V3 => SLL_OFFSET_V3,
        }
    }

    /// Bytes a TPACKET_V2 receive slot needs for frames up to `max_frame`
    /// bytes: the kernel puts the network header at
    /// `TPACKET_ALIGN(tp_hdrlen + 16)`, the 14-byte MAC header before it.
    pub(super) const fn rx_v2_frame_size(max_frame: usize) -> usize {
        align(align(libc::TPACKET2_HDRLEN + 16) + max_frame)
    }
}

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

/// Fixed-size slots laid out in blocks (slots never cross a block).
#[derive(Debug, Clone, Copy)]
pub(super) struct Slots {
    base: *mut u8,
    block_size: usize,
    frame_size: usize,
    per_block: usize,
    count: usize,
}

impl Slots {
    fn new(base: *mut u8, block_size: usize, frame_size: usize, blocks: usize) -> Slots {
        let per_block = block_size / frame_size;
        Slots {
            base,
            block_size,
            frame_size,
            per_block,
            count: per_block * blocks,
        }
    }

    /// The start of slot `i` (`i < count`).
    fn at(&self, i: usize) -> *mut u8 {
        let (block, within) = (i / self.per_block, i % self.per_block);
        // SAFETY: `i < count`, so the slot lies inside the ring, which the
        // constructor's caller vouched for.
        unsafe {
            self.base
                .add(block * self.block_size + within * self.frame_size)
        }
    }
}

/// The user's view of the receive ring.
#[derive(Debug)]
pub(super) enum RxRing {
    /// TPACKET_V3: variable-length frames packed in blocks.
    Blocks {
        base: *mut u8,
        block_size: usize,
        blocks: usize,
        next: usize,
    },
    /// TPACKET_V2: one frame per fixed-size slot.
    Frames { slots: Slots, next: usize },
}

// SAFETY: the pointers are into the mapping the link owns; the view is used
// under the link's receive mutex only.
unsafe impl Send for RxRing {}

impl RxRing {
    /// # Safety
    /// `base` must point to `blocks * block_size` bytes of a TPACKET_V3
    /// receive ring mapping that outlives the view.
    pub(super) unsafe fn blocks(base: *mut u8, block_size: usize, blocks: usize) -> RxRing {
        RxRing::Blocks {
            base,
            block_size,
            blocks,
            next: 0,
        }
    }

    /// # Safety
    /// `base` must point to a TPACKET_V2 receive ring of `blocks` blocks of
    /// `block_size` bytes with `frame_size`-byte slots, in a mapping that
    /// outlives the view.
    pub(super) unsafe fn frames(
        base: *mut u8,
        block_size: usize,
        frame_size: usize,
        blocks: usize,
    ) -> RxRing {
        RxRing::Frames {
            slots: Slots::new(base, block_size, frame_size, blocks),
            next: 0,
        }
    }

    /// Walks what the kernel has handed over, in ring order, calling `f`
    /// with each frame and its `sll_pkttype`, and hands each block (V3) or
    /// slot (V2) back after its last frame. Stops once `max` frames are
    /// reached (V3: at the end of that block) and returns false, or at the
    /// first block or slot still the kernel's and returns true (empty).
    /// Whether the kernel has handed over a block (V3) or slot (V2) that
    /// [`drain`](Self::drain) would walk now.
    pub(super) fn has_frames(&self) -> bool {
        let at = match self {
            RxRing::Blocks {
                base,
                block_size,
                next,
                ..
            } => {
                // SAFETY: `next < blocks`, so the block lies in the ring;
                // block starts are page aligned.
                unsafe { base.add(*next * *block_size).add(BLOCK_STATUS) }
            }
            RxRing::Frames { slots, next } => {
                // SAFETY: slots are 16-byte aligned and inside the mapping.
                unsafe { slots.at(*next).add(Version::V2.status_offset()) }
            }
        };
        // SAFETY: `at` is the aligned status word of a block or slot in
        // the mapping.
        let st = unsafe { status(at) };
        st.load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }

    pub(super) fn drain(&mut self, max: usize, f: impl FnMut(&mut [u8], u8)) -> bool {
        match self {
            RxRing::Blocks {
                base,
                block_size,
                blocks,
                next,
            } => drain_blocks(*base, *block_size, *blocks, next, max, f),
            RxRing::Frames { slots, next } => drain_frames(slots, next, max, f),
        }
    }
}

fn drain_blocks(
    base: *mut u8,
    block_size: usize,
    blocks: usize,
    next: &mut usize,
    max: usize,
    mut f: impl FnMut(&mut [u8], u8),
) -> bool {
    let mut frames = 0;
    loop {
        // SAFETY: `next < blocks`, so the block lies in the ring.
        let block = unsafe { base.add(*next * block_size) };
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
            if off + SLL_OFFSET_V3 + std::mem::size_of::<libc::sockaddr_ll>() > block_size {
                break; // Not a layout the kernel writes; skip the rest.
            }
            // SAFETY: `off` plus the headers is inside this block (checked
            // above), the block is ours, and the kernel aligns headers.
            let h = unsafe { block.add(off).cast::<tpacket3_hdr>().read() };
            // SAFETY: as above; the sockaddr_ll follows the header.
            let sll = unsafe {
                block
                    .add(off + SLL_OFFSET_V3)
                    .cast::<libc::sockaddr_ll>()
                    .read()
            };
            let (start, len) = (off + usize::from(h.tp_mac), h.tp_snaplen as usize);
            if start + len <= block_size && h.tp_snaplen == h.tp_len {
                // SAFETY: the frame lies inside the block (checked), the
                // block stays ours until after `f` returns (the kernel does
                // not touch it while TP_STATUS_USER is set), the mapping is
                // read-write, frames of a block do not overlap, and the
                // slice does not outlive the call.
                let frame = unsafe { std::slice::from_raw_parts_mut(block.add(start), len) };
                f(frame, sll.sll_pkttype);
            }
            frames += 1;
            if h.tp_next_offset == 0 {
                break;
            }
            off += h.tp_next_offset as usize;
        }
        st.store(libc::TP_STATUS_KERNEL, Ordering::Release);
        *next = (*next + 1) % blocks;
        if frames >= max {
            return false;
        }
    }
}

fn drain_frames(
    slots: &Slots,
    next: &mut usize,
    max: usize,
    mut f: impl FnMut(&mut [u8], u8),
) -> bool {
    for _ in 0..max {
        let slot = slots.at(*next);
        // SAFETY: slots are 16-byte aligned and inside the mapping.
        let st = unsafe { status(slot.add(Version::V2.status_offset())) };
        if st.load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
            return true;
        }
        // SAFETY: the slot is ours (TP_STATUS_USER, read with Acquire); the
        // header is at its start.
        let h = unsafe { slot.cast::<tpacket2_hdr>().read() };
        // SAFETY: the sockaddr_ll follows the header inside the slot.
        let sll = unsafe { slot.add(SLL_OFFSET_V2).cast::<libc::sockaddr_ll>().read() };
        let (start, len) = (usize::from(h.tp_mac), h.tp_snaplen as usize);
        if start + len <= slots.frame_size && h.tp_snaplen == h.tp_len {
            // SAFETY: the frame lies inside the slot (checked), which stays
            // ours until after `f` returns (the kernel does not touch it
            // while TP_STATUS_USER is set); the mapping is read-write and no
            // other view of the slot exists; the slice does not outlive it.
            let frame = unsafe { std::slice::from_raw_parts_mut(slot.add(start), len) };
            f(frame, sll.sll_pkttype);
        }
        st.store(libc::TP_STATUS_KERNEL, Ordering::Release);
        *next = (*next + 1) % slots.count;
    }
    false
}

/// The user's view of the transmit ring.
#[derive(Debug)]
pub(super) struct TxRing {
    version: Version,
    slots: Slots,
    next: usize,
}

// SAFETY: the pointer is into the mapping the link owns; the view is used
// under the link's transmit mutex only.
unsafe impl Send for TxRing {}

impl TxRing {
    /// # Safety
    /// `base` must point to the transmit ring of the mapping (`blocks`
    /// blocks of `block_size` bytes, `frame_size`-byte slots that do not
    /// cross blocks, headers of `version`), which must outlive the view.
    pub(super) unsafe fn new(
        version: Version,
        base: *mut u8,
        block_size: usize,
        frame_size: usize,
        blocks: usize,
    ) -> TxRing {
        TxRing {
            version,
            slots: Slots::new(base, block_size, frame_size, blocks),
            next: 0,
        }
    }

    /// Largest frame a slot holds.
    pub(super) fn max_frame(&self) -> usize {
        self.slots.frame_size - self.version.tx_data_offset()
    }

    /// Whether the next slot is ours to fill.
    pub(super) fn next_is_free(&self) -> bool {
        let slot = self.slots.at(self.next);
        // SAFETY: slot starts are 16-byte aligned and inside the ring.
        let st = unsafe { status(slot.add(self.version.status_offset())) };
        matches!(
            st.load(Ordering::Acquire),
            libc::TP_STATUS_AVAILABLE | libc::TP_STATUS_WRONG_FORMAT
        )
    }

    /// Copies `frame` into the next slot and requests its sending, or
    /// returns false if that slot is still the kernel's.
    pub(super) fn push(&mut self, frame: &[u8]) -> bool {
        assert!(frame.len() <= self.max_frame());
        self.push_with(|slot| {
            slot[..frame.len()].copy_from_slice(frame);
            frame.len()
        })
        .is_some()
    }

    /// Lets `build` write a frame straight into the next slot (a slice of
    /// [`max_frame`](Self::max_frame) bytes holding whatever the slot held
    /// before) and requests its sending with the length `build` returns:
    /// `Some(len)`. A length of 0 (or more than the slot) sends nothing and
    /// leaves the slot free for the next frame. `None`, without calling
    /// `build`, if the slot is still the kernel's.
    pub(super) fn push_with(&mut self, build: impl FnOnce(&mut [u8]) -> usize) -> Option<usize> {
        if !self.next_is_free() {
            return None;
        }
        let slot = self.slots.at(self.next);
        let max = self.max_frame();
        // SAFETY: the slot is ours (status AVAILABLE, read with Acquire): the
        // kernel does not touch it until we set SEND_REQUEST, and the data
        // region (`max` bytes after the data offset) lies inside the slot.
        // The slice lives only for the call of `build`.
        let data =
            unsafe { std::slice::from_raw_parts_mut(slot.add(self.version.tx_data_offset()), max) };
        let len = build(data);
        if len == 0 || len > max {
            return Some(0);
        }
        self.request(slot, len as u32);
        Some(len)
    }

    /// Sets the slot's header for a `len`-byte frame, hands the slot to
    /// the kernel and moves on.
    fn request(&mut self, slot: *mut u8, len: u32) {
        // SAFETY: the slot is ours (checked free by the caller): the kernel
        // does not touch it until we set SEND_REQUEST. The header is the
        // socket's version; the frame was written within the slot.
        unsafe {
            match self.version {
                Version::V3 => {
                    let h = slot.cast::<tpacket3_hdr>();
                    (*h).tp_next_offset = 0;
                    (*h).tp_len = len;
                    (*h).tp_snaplen = len;
                }
                Version::V2 => {
                    let h = slot.cast::<tpacket2_hdr>();
                    (*h).tp_len = len;
                    (*h).tp_snaplen = len;
                }
            }
        }
        // SAFETY: as in `next_is_free`.
        let st = unsafe { status(slot.add(self.version.status_offset())) };
        st.store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
        self.next = (self.next + 1) % self.slots.count;
    }
}
