//! The data path's byte buffer, [`IoBuf`], and the alignment `O_DIRECT`
//! needs, in safe Rust.
//!
//! `O_DIRECT` needs the memory of every transfer aligned (to the device's
//! logical block size; [`DIRECT_ALIGN`] = 4096 is safe everywhere). An
//! [`IoBuf`] is a `Vec<u8>` and the index where its data starts: an aligned
//! buffer over-allocates the vector by up to `DIRECT_ALIGN - 1` bytes and
//! starts at the first aligned address (`<*const u8>::align_offset`). The
//! vector is never grown once the data is in it, so its heap block never
//! moves and the data stays aligned for the buffer's life. A plain
//! `Vec<u8>` is an [`IoBuf`] that starts at 0, so either kind goes to an
//! engine, and either becomes [`Bytes`] without a copy
//! ([`IoBuf::into_bytes`]): the transports send a read's data from where
//! the device put it, and receive a write's data where the device takes it.

use std::ops::{Deref, DerefMut};

use bytes::Bytes;

/// Alignment of memory, offsets and lengths for direct I/O.
pub const DIRECT_ALIGN: usize = 4096;

/// An owned byte buffer for engine I/O: the bytes `raw[start..]` of a
/// vector. Dereferences to those bytes.
///
/// Built aligned ([`IoBuf::aligned`], [`IoBuf::aligned_copy_of`], and by the
/// engines for a direct read) it reaches an `O_DIRECT` descriptor as is;
/// built from any `Vec<u8>` (`From`) it is taken as it comes, and an
/// engine that needs alignment copies it once (a bounce).
#[derive(Clone, Default)]
pub struct IoBuf {
    raw: Vec<u8>,
    /// Where the data starts in `raw` (a prefix that aligns it).
    start: usize,
}

impl IoBuf {
    /// An empty buffer (no allocation).
    pub const fn new() -> IoBuf {
        IoBuf {
            raw: Vec::new(),
            start: 0,
        }
    }

    /// A zero-filled buffer of `len` bytes whose start is
    /// [`DIRECT_ALIGN`]-aligned.
    pub fn aligned(len: usize) -> IoBuf {
        let mut b = IoBuf::new();
        let start = b.reserve_aligned(len);
        b.raw.resize(start + len, 0);
        b
    }

    /// An aligned copy of `data`.
    pub fn aligned_copy_of(data: &[u8]) -> IoBuf {
        let mut b = IoBuf::new();
        let start = b.reserve_aligned(data.len());
        b.raw.extend_from_slice(data);
        debug_assert_eq!(b.start, start);
        b
    }

    /// The data `raw[start..]` of `raw`, without a copy (`start` is where
    /// a prefix, such as an aligning one, ends). Panics when `start` lies
    /// beyond `raw`.
    pub fn from_parts(raw: Vec<u8>, start: usize) -> IoBuf {
        assert!(start <= raw.len(), "an IoBuf starts within its vector");
        IoBuf { raw, start }
    }

    /// Empty the buffer and reserve room for `len` bytes of data at an
    /// aligned address, keeping the allocation when it is big enough; the
    /// data then goes into the vector's spare capacity (see
    /// [`IoBuf::raw_mut`]). Returns the data's start: the vector holds
    /// that many zeros before it.
    pub(crate) fn reserve_aligned(&mut self, len: usize) -> usize {
        self.raw.clear();
        self.raw.reserve(len + DIRECT_ALIGN - 1);
        let start = self
            .raw
            .spare_capacity_mut()
            .as_ptr()
            .align_offset(DIRECT_ALIGN);
        // align_offset on a byte pointer can always reach the alignment;
        // the slack covers it.
        assert!(start < DIRECT_ALIGN, "cannot align a byte pointer");
        self.raw.resize(start, 0);
        self.start = start;
        start
    }

    /// Empty the buffer and reserve room for `len` bytes at its start (no
    /// alignment), keeping the allocation.
    pub(crate) fn reserve_plain(&mut self, len: usize) {
        self.raw.clear();
        self.start = 0;
        self.raw.reserve(len);
    }

    /// The vector itself, for an engine that reads into its spare
    /// capacity: the data is `raw[start..]` (see [`IoBuf::start`]).
    pub(crate) fn raw_mut(&mut self) -> &mut Vec<u8> {
        &mut self.raw
    }

    /// Where the data starts in the vector.
    pub(crate) fn start(&self) -> usize {
        self.start
    }

    /// An aligned, empty buffer with room for `len` bytes of data: filled
    /// in order ([`IoBuf::extend_from_slice`], [`IoBuf::fill_at`]) it
    /// stays aligned and is never zeroed first.
    pub fn aligned_with_capacity(len: usize) -> IoBuf {
        let mut b = IoBuf::new();
        b.reserve_aligned(len);
        b
    }

    /// Make room for `len` bytes of data in all without moving it again:
    /// when the allocation cannot hold them, the data moves (one copy of
    /// what is there so far) to a new allocation where it starts aligned.
    pub fn reserve_total(&mut self, len: usize) {
        if self.raw.capacity() >= self.start + len {
            return;
        }
        let mut b = IoBuf::aligned_with_capacity(len.max(self.len()));
        b.raw.extend_from_slice(&self.raw[self.start..]);
        *self = b;
    }

    /// Append `data` (within the reserved room the data stays where it is).
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        self.raw.extend_from_slice(data);
    }

    /// Make the data `len` bytes long, new bytes zero.
    pub fn resize(&mut self, len: usize) {
        self.raw.resize(self.start + len, 0);
    }

    /// Put `data` at byte `off` of data whose length is the prefix filled
    /// so far, as `ethersan_proto::transfer::fill_at` does for a vector:
    /// data in order is appended into the reserved room, never zeroed
    /// first; data before the end overwrites what is there; a gap left by
    /// data out of order reads as zeros until its own data arrives.
    pub fn fill_at(&mut self, off: usize, data: &[u8]) {
        if off > self.len() {
            self.resize(off);
        }
        let overlap = (self.len() - off).min(data.len());
        self[off..off + overlap].copy_from_slice(&data[..overlap]);
        self.raw.extend_from_slice(&data[overlap..]);
    }

    /// Empty the data, keeping the allocation and where the data starts
    /// (so an aligned buffer stays aligned for its next use).
    pub fn clear(&mut self) {
        self.raw.truncate(self.start);
    }

    /// Room for data without reallocating.
    pub fn capacity(&self) -> usize {
        self.raw.capacity() - self.start
    }

    /// Whether the data's memory is [`DIRECT_ALIGN`]-aligned (true for an
    /// empty buffer's data only when it is aligned too).
    pub fn is_aligned(&self) -> bool {
        self.as_ptr().align_offset(DIRECT_ALIGN) == 0
    }

    /// Keep the first `len` bytes (no effect when there are fewer).
    pub fn truncate(&mut self, len: usize) {
        self.raw.truncate(self.start + len);
    }

    /// The data as [`Bytes`], without a copy (the vector becomes the
    /// `Bytes`' storage and the prefix is sliced off).
    pub fn into_bytes(self) -> Bytes {
        let start = self.start;
        let b = Bytes::from(self.raw);
        if start == 0 {
            b
        } else {
            b.slice(start..)
        }
    }

    /// The vector and where the data starts in it (`raw[start..]`), the
    /// inverse of [`IoBuf::from_parts`].
    pub fn into_parts(self) -> (Vec<u8>, usize) {
        (self.raw, self.start)
    }

    /// The data as a plain vector: free when the data starts the vector,
    /// else the data is moved to its front (no new allocation).
    pub fn into_vec(mut self) -> Vec<u8> {
        if self.start > 0 {
            self.raw.drain(..self.start);
        }
        self.raw
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.start..]
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..]
    }
}

// SAFETY: every method is the vector's own `BufMut` method, which keeps
// the trait's contract for the vector; the data (`raw[start..]`) only
// grows at the vector's end, so the contract holds for the data too.
unsafe impl bytes::BufMut for IoBuf {
    fn remaining_mut(&self) -> usize {
        self.raw.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller guarantees that the next `cnt` bytes of the
        // chunk handed out (the vector's spare capacity) were initialised,
        // which is what the vector's `advance_mut` requires.
        unsafe { self.raw.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut bytes::buf::UninitSlice {
        self.raw.chunk_mut()
    }
}

impl AsRef<[u8]> for IoBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for IoBuf {
    fn from(raw: Vec<u8>) -> IoBuf {
        IoBuf { raw, start: 0 }
    }
}

impl From<&[u8]> for IoBuf {
    fn from(data: &[u8]) -> IoBuf {
        IoBuf::from(data.to_vec())
    }
}

impl From<IoBuf> for Bytes {
    fn from(b: IoBuf) -> Bytes {
        b.into_bytes()
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The bytes as a slice would, with the alignment when it matters.
        if self.start > 0 {
            write!(f, "aligned ")?;
        }
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl PartialEq for IoBuf {
    fn eq(&self, other: &IoBuf) -> bool {
        **self == **other
    }
}

impl Eq for IoBuf {}

impl PartialEq<[u8]> for IoBuf {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<&[u8]> for IoBuf {
    fn eq(&self, other: &&[u8]) -> bool {
        **self == **other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for IoBuf {
    fn eq(&self, other: &[u8; N]) -> bool {
        **self == other[..]
    }
}

impl PartialEq<Vec<u8>> for IoBuf {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

impl PartialEq<IoBuf> for Vec<u8> {
    fn eq(&self, other: &IoBuf) -> bool {
        self[..] == **other
    }
}

impl PartialEq<IoBuf> for [u8] {
    fn eq(&self, other: &IoBuf) -> bool {
        *self == **other
    }
}

/// Whether `buf` at `offset` can go to an `O_DIRECT` descriptor as is:
/// memory, offset and length all [`DIRECT_ALIGN`]-aligned.
pub fn is_direct_aligned(offset: u64, buf: &[u8]) -> bool {
    buf.as_ptr().align_offset(DIRECT_ALIGN) == 0
        && offset.is_multiple_of(DIRECT_ALIGN as u64)
        && buf.len().is_multiple_of(DIRECT_ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_for_every_size_and_round_trips() {
        for len in [0usize, 1, 511, 4096, 4097, 131072] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
            let b = IoBuf::aligned_copy_of(&data);
            assert!(b.is_aligned());
            assert_eq!(b.len(), len);
            assert_eq!(b, data);
            assert_eq!(b.clone().into_vec(), data);
            // To Bytes without a copy: the same memory.
            let ptr = b.as_ptr();
            let bytes = b.into_bytes();
            assert_eq!(bytes, data);
            if len > 0 {
                assert_eq!(bytes.as_ptr(), ptr);
            }
        }
        let b = IoBuf::aligned(8192);
        assert!(b.iter().all(|&x| x == 0));
        assert!(is_direct_aligned(4096, &b));
        assert!(!is_direct_aligned(512, &b));
        assert!(!is_direct_aligned(0, &b[1..4097]));
    }

    #[test]
    fn a_vector_is_a_buffer_that_starts_at_zero() {
        let v = vec![1u8, 2, 3, 4];
        let ptr = v.as_ptr();
        let mut b = IoBuf::from(v);
        b.truncate(3);
        assert_eq!(b, [1u8, 2, 3]);
        let v = b.into_vec();
        assert_eq!(v.as_ptr(), ptr, "no copy");
        assert_eq!(v, [1, 2, 3]);
        let p = IoBuf::from_parts(vec![0, 0, 7, 8], 2);
        assert_eq!(p, [7u8, 8]);
        assert_eq!(p.into_bytes(), &[7u8, 8][..]);
        assert_eq!(IoBuf::new().into_bytes(), Bytes::new());
    }

    #[test]
    fn filled_in_order_it_stays_aligned_and_is_never_moved() {
        let mut b = IoBuf::aligned_with_capacity(10000);
        let ptr = b.as_ptr();
        b.extend_from_slice(&[1; 100]);
        b.fill_at(100, &[2; 4000]);
        b.fill_at(6000, &[4; 4000]); // out of order: a gap of zeros
        b.fill_at(4100, &[3; 1900]);
        b.fill_at(50, &[5; 100]); // a resend overwrites
        assert_eq!(b.len(), 10000);
        assert_eq!(b.as_ptr(), ptr);
        assert!(b.is_aligned());
        assert_eq!(&b[..50], &[1; 50][..]);
        assert_eq!(&b[50..150], &[5; 100][..]);
        assert_eq!(&b[150..4100], &[2; 3950][..]);
        assert_eq!(&b[4100..6000], &[3; 1900][..]);
        assert_eq!(&b[6000..], &[4; 4000][..]);
        // Unsolicited data in a plain vector, then room for the whole
        // write: moved once, to aligned memory.
        let mut w = IoBuf::from(vec![7u8; 300]);
        w.reserve_total(8192);
        assert!(w.is_aligned());
        assert!(w.capacity() >= 8192);
        assert_eq!(w, vec![7u8; 300]);
        let ptr = w.as_ptr();
        w.reserve_total(8000);
        assert_eq!(w.as_ptr(), ptr, "room enough: nothing moves");
    }
}
