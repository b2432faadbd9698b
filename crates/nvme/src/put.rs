//! Little-endian fields and padded text in the data structures the
//! controller returns (Identify data, log pages): the NVMe specifications
//! store every multi-byte field little-endian.

/// Writes `v` at `b[at..at + 2]`.
pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

/// Writes `v` at `b[at..at + 4]`.
pub(crate) fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Writes `v` at `b[at..at + 8]`.
pub(crate) fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Writes `s` into `b`, cut to its length and padded with `pad` (spaces
/// for ASCII fields such as SN, MN, FR; NULs elsewhere).
pub(crate) fn put_text(b: &mut [u8], s: &str, pad: u8) {
    b.fill(pad);
    let n = s.len().min(b.len());
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
}
