//! SBC-3 §5: typed view of the block-addressed CDBs (READ, WRITE, WRITE AND
//! VERIFY, VERIFY, PRE-FETCH, SYNCHRONIZE CACHE, WRITE SAME, COMPARE AND
//! WRITE, ORWRITE, WRITE ATOMIC in their 6/10/12/16-byte forms).
//!
//! Parsing never fails and never panics: a CDB shorter than its layout
//! reads as zeros past its end (dispatch has already rejected short CDBs
//! with INVALID FIELD IN CDB, so this only matters for fuzzed input).

/// The fields of a block-addressed CDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockCdb {
    /// Operation code.
    pub(crate) opcode: u8,
    /// First logical block.
    pub(crate) lba: u64,
    /// Number of logical blocks (READ(6)/WRITE(6): 0 means 256).
    pub(crate) blocks: u32,
    /// RDPROTECT / WRPROTECT / VRPROTECT (byte 1 bits 7-5); 0 for 6-byte CDBs.
    pub(crate) protect: u8,
    /// Byte 1 bits 4-0 (DPO, FUA, BYTCHK, IMMED, UNMAP... per command).
    pub(crate) flags: u8,
    /// CDB byte that holds the transfer length, for sense field pointers.
    pub(crate) length_byte: u16,
}

impl BlockCdb {
    /// Parse the block-addressed fields of `cdb` by its operation code.
    pub(crate) fn parse(cdb: &[u8]) -> BlockCdb {
        let mut b = [0u8; 16];
        let n = cdb.len().min(16);
        b[..n].copy_from_slice(&cdb[..n]);
        let be32 = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let be16 = |at: usize| u32::from(u16::from_be_bytes([b[at], b[at + 1]]));
        let be64 = |at: usize| u64::from(be32(at)) << 32 | u64::from(be32(at + 4));
        let opcode = b[0];
        let (lba, blocks, length_byte) = match opcode {
            // READ(6) / WRITE(6): 21-bit LBA, 0 blocks means 256.
            0x08 | 0x0a => {
                let lba = u64::from(b[1] & 0x1f) << 16 | u64::from(b[2]) << 8 | u64::from(b[3]);
                (lba, if b[4] == 0 { 256 } else { u32::from(b[4]) }, 4)
            }
            0x28 | 0x2a | 0x2e | 0x2f | 0x34 | 0x35 | 0x41 => (u64::from(be32(2)), be16(7), 7),
            0xa8 | 0xaa | 0xae | 0xaf => (u64::from(be32(2)), be32(6), 6),
            // COMPARE AND WRITE: one-byte NUMBER OF LOGICAL BLOCKS.
            0x89 => (be64(2), u32::from(b[13]), 13),
            0x9c => (be64(2), be16(12), 12),
            _ => (be64(2), be32(10), 10),
        };
        let six = matches!(opcode, 0x08 | 0x0a);
        BlockCdb {
            opcode,
            lba,
            blocks,
            protect: if six { 0 } else { b[1] >> 5 },
            flags: if six { 0 } else { b[1] & 0x1f },
            length_byte,
        }
    }

    /// FUA: force unit access.
    pub(crate) fn fua(&self) -> bool {
        self.flags & 0x08 != 0
    }

    /// BYTCHK (VERIFY, WRITE AND VERIFY): how Data-Out is compared.
    pub(crate) fn bytchk(&self) -> u8 {
        (self.flags >> 1) & 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn six_byte_forms() {
        let c = BlockCdb::parse(&[0x08, 0x1f, 0xff, 0xfe, 0, 0]);
        assert_eq!(
            (c.lba, c.blocks, c.protect, c.flags),
            (0x1f_fffe, 256, 0, 0)
        );
        let c = BlockCdb::parse(&[0x0a, 0, 0, 7, 3, 0]);
        assert_eq!((c.lba, c.blocks, c.length_byte), (7, 3, 4));
    }

    #[test]
    fn ten_twelve_sixteen() {
        let c = BlockCdb::parse(&[0x28, 0x18, 0, 0, 1, 0, 0, 0, 8, 0]);
        assert_eq!((c.lba, c.blocks, c.fua(), c.protect), (256, 8, true, 0));
        let c = BlockCdb::parse(&[0xa8, 0x20, 0, 0, 0, 2, 0, 1, 0, 0, 0, 0]);
        assert_eq!(
            (c.lba, c.blocks, c.protect, c.length_byte),
            (2, 65536, 1, 6)
        );
        let c = BlockCdb::parse(&[0x8f, 0x06, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0]);
        assert_eq!((c.lba, c.blocks, c.bytchk()), (1 << 56, 9, 3));
        let c = BlockCdb::parse(&[0x34, 0x02, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(c.flags, 0x02);
        let c = BlockCdb::parse(&[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0]);
        assert_eq!((c.lba, c.blocks, c.length_byte), (5, 2, 13));
    }

    #[test]
    fn short_input_reads_as_zeros() {
        assert_eq!(BlockCdb::parse(&[0x88]).blocks, 0);
        assert_eq!(BlockCdb::parse(&[]).lba, 0);
    }
}
