//! Page-aligned byte buffers for `O_DIRECT` I/O, in safe Rust.
//!
//! `O_DIRECT` needs the memory of every transfer aligned (to the device's
//! logical block size; [`DIRECT_ALIGN`] = 4096 is safe everywhere). A
//! [`AlignedBuf`] over-allocates a `Vec<u8>` by `DIRECT_ALIGN - 1` bytes and
//! uses the subslice that starts at the first aligned address
//! (`<*const u8>::align_offset`). The vector is never grown, so its heap
//! block never moves and the subslice stays aligned for the buffer's life.

/// Alignment of memory, offsets and lengths for direct I/O.
pub const DIRECT_ALIGN: usize = 4096;

/// A heap buffer of `len` bytes whose start is [`DIRECT_ALIGN`]-aligned.
#[derive(Debug)]
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// A zero-filled aligned buffer of `len` bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + DIRECT_ALIGN - 1];
        let start = raw.as_ptr().align_offset(DIRECT_ALIGN);
        // align_offset on a u8 pointer can always reach the alignment; the
        // slack covers it.
        assert!(start < DIRECT_ALIGN, "cannot align a byte pointer");
        AlignedBuf { raw, start, len }
    }

    /// An aligned copy of `data`.
    pub fn copy_of(data: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(data.len());
        b.as_mut_slice().copy_from_slice(data);
        b
    }

    /// The buffer's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    /// The buffer's bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes as a plain vector (moves them to the front; no new
    /// allocation).
    pub fn into_vec(mut self) -> Vec<u8> {
        self.raw.copy_within(self.start..self.start + self.len, 0);
        self.raw.truncate(self.len);
        self.raw
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
            let b = AlignedBuf::copy_of(&data);
            assert_eq!(b.as_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_slice(), &data[..]);
            assert_eq!(b.into_vec(), data);
        }
        let b = AlignedBuf::zeroed(8192);
        assert!(is_direct_aligned(4096, b.as_slice()));
        assert!(!is_direct_aligned(512, b.as_slice()));
        assert!(!is_direct_aligned(0, &b.as_slice()[1..4097]));
    }
}
