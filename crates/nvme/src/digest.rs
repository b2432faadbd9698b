//! NVMe/TCP Transport Specification (TP 8000) §7.4.3: header and data
//! digests are CRC32C (Castagnoli), sent little-endian. Computed with the
//! `crc-fast` crate, as the iSCSI core does.

/// CRC32C of `bytes`.
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test vectors from RFC 3720 Appendix B.4 (the same polynomial).
    #[test]
    fn known_vectors() {
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }
}
