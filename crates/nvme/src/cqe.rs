//! NVMe Base Specification 1.4 §4.6 (Completion Queue Entry): the 16-byte
//! CQE a CapsuleResp PDU carries (NVMe-oF 1.1 §2.3.2).

use crate::status::Status;

/// Size of a completion queue entry.
pub const CQE_LEN: usize = 16;

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cqe {
    /// Dword 0, command specific.
    pub dw0: u32,
    /// Dword 1, command specific.
    pub dw1: u32,
    /// SQ Head Pointer (0xFFFF when SQ flow control is disabled).
    pub sqhd: u16,
    /// SQ Identifier.
    pub sqid: u16,
    /// Command Identifier of the completed command.
    pub cid: u16,
    /// Phase Tag (meaningless on fabrics, kept for round trips).
    pub phase: bool,
    /// Status of the command.
    pub status: Status,
}

impl Cqe {
    /// A completion of `cid` with `status`, other fields zero.
    pub fn new(cid: u16, status: Status) -> Self {
        Cqe {
            dw0: 0,
            dw1: 0,
            sqhd: 0,
            sqid: 0,
            cid,
            phase: false,
            status,
        }
    }

    /// The 16 bytes of this entry.
    pub fn encode(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        b[0..4].copy_from_slice(&self.dw0.to_le_bytes());
        b[4..8].copy_from_slice(&self.dw1.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&self.sqid.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&self.status.to_field(self.phase).to_le_bytes());
        b
    }

    /// Decodes 16 bytes; `None` when the status names a reserved code type.
    pub fn parse(b: &[u8; CQE_LEN]) -> Option<Self> {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (status, phase) = Status::from_field(u16_at(14))?;
        Some(Cqe {
            dw0: u32_at(0),
            dw1: u32_at(4),
            sqhd: u16_at(8),
            sqid: u16_at(10),
            cid: u16_at(12),
            phase,
            status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trip() {
        let c = Cqe {
            dw0: 0x0102_0304,
            dw1: 0x0506_0708,
            sqhd: 0x1122,
            sqid: 3,
            cid: 0xBEEF,
            phase: true,
            status: Status::LBA_OUT_OF_RANGE,
        };
        let b = c.encode();
        assert_eq!(&b[0..4], &[4, 3, 2, 1]);
        assert_eq!(&b[8..10], &[0x22, 0x11]);
        assert_eq!(&b[12..14], &[0xEF, 0xBE]);
        // SC 80h, DNR, phase: 0x8000 | 0x80 << 1 | 1
        assert_eq!(u16::from_le_bytes([b[14], b[15]]), 0x8101);
        assert_eq!(Cqe::parse(&b), Some(c));
    }
}
