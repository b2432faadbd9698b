//! AoE r11 §3.1 Issue ATA Command: the argument that carries ATA task-file
//! registers (AFlags, Err/Feature, Sector Count, Cmd/Status, a 48-bit LBA)
//! and, for writes and read responses, whole 512-byte sectors of data.

use crate::frame::{DecodeError, HEADER_LEN};

/// Length of the fixed part of the ATA argument.
pub const ATA_ARG_LEN: usize = 12;
/// Ethernet + AoE + ATA argument headers: where data starts in a frame.
pub const ATA_HEADER_LEN: usize = HEADER_LEN + ATA_ARG_LEN;
/// AoE sectors are always 512 bytes.
pub const SECTOR_SIZE: usize = 512;

/// The AFlags byte of §3.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtaFlags(pub u8);

impl AtaFlags {
    /// E: an LBA48 (extended) command.
    pub const EXTENDED: u8 = 0x40;
    /// D: the device/head register's DEV bit.
    pub const DEVICE: u8 = 0x10;
    /// A: an asynchronous write (may be acknowledged before it is stable).
    pub const ASYNC: u8 = 0x02;
    /// W: the frame carries data to write.
    pub const WRITE: u8 = 0x01;

    /// E is set.
    pub fn extended(self) -> bool {
        self.0 & Self::EXTENDED != 0
    }

    /// A is set.
    pub fn asynchronous(self) -> bool {
        self.0 & Self::ASYNC != 0
    }

    /// W is set.
    pub fn write(self) -> bool {
        self.0 & Self::WRITE != 0
    }
}

/// The Issue ATA Command argument, its data borrowed from the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtaArg<'a> {
    /// AFlags.
    pub flags: AtaFlags,
    /// The feature register in a request, the error register in a response.
    pub err_feature: u8,
    /// Sector count register.
    pub sector_count: u8,
    /// The command register in a request, the status register in a response.
    pub cmd_status: u8,
    /// LBA bytes 0..5, little-endian as ATA numbers them (48 bits). For
    /// LBA28 commands byte 3's high nibble holds the device/head bits.
    pub lba: u64,
    /// Request: the data of a write (W set), exactly `sector_count` × 512
    /// bytes, otherwise empty. Response: every byte after the argument,
    /// padding included; the initiator knows how much it asked for.
    pub data: &'a [u8],
}

impl<'a> AtaArg<'a> {
    /// Decode the argument (`arg` starts after the AoE header).
    ///
    /// A request's write data is sized by the sector count, never by the
    /// frame length (the frame may be padded); a request whose sector count
    /// needs more data than the frame carries is rejected.
    pub fn decode(arg: &'a [u8], response: bool) -> Result<AtaArg<'a>, DecodeError> {
        crate::frame::need(arg, ATA_ARG_LEN, "ATA argument")?;
        let flags = AtaFlags(arg[0]);
        let sector_count = arg[2];
        let mut lba = [0u8; 8];
        lba[..6].copy_from_slice(&arg[4..10]);
        let rest = &arg[ATA_ARG_LEN..];
        let data = if response {
            rest
        } else if flags.write() {
            let len = usize::from(sector_count) * SECTOR_SIZE;
            if rest.len() < len {
                return Err(DecodeError::ShortPayload {
                    what: "write data",
                    need: len,
                    have: rest.len(),
                });
            }
            &rest[..len]
        } else {
            &[]
        };
        Ok(AtaArg {
            flags,
            err_feature: arg[1],
            sector_count,
            cmd_status: arg[3],
            lba: u64::from_le_bytes(lba),
            data,
        })
    }

    /// Append the 12-byte fixed part (not the data) to `out`. The reserved
    /// bytes are zero; LBA bits above 48 are dropped.
    pub fn encode_fixed(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.fixed_bytes());
    }

    /// The 12-byte fixed part (see [`encode_fixed`](Self::encode_fixed)).
    pub fn fixed_bytes(&self) -> [u8; ATA_ARG_LEN] {
        let mut b = [0u8; ATA_ARG_LEN];
        b[0] = self.flags.0;
        b[1] = self.err_feature;
        b[2] = self.sector_count;
        b[3] = self.cmd_status;
        b[4..10].copy_from_slice(&self.lba.to_le_bytes()[..6]);
        b
    }

    /// Append the fixed part and the data to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_fixed(out);
        out.extend_from_slice(self.data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(flags: u8, count: u8, data: &[u8]) -> AtaArg<'_> {
        AtaArg {
            flags: AtaFlags(flags),
            err_feature: 0,
            sector_count: count,
            cmd_status: 0x34,
            lba: 0x0000_1234_5678_9ABC,
            data,
        }
    }

    #[test]
    fn layout_is_little_endian_lba() {
        let mut out = Vec::new();
        arg(0x41, 1, &[]).encode_fixed(&mut out);
        assert_eq!(
            out,
            [0x41, 0, 1, 0x34, 0xBC, 0x9A, 0x78, 0x56, 0x34, 0x12, 0, 0]
        );
    }

    #[test]
    fn write_data_sized_by_sector_count_not_frame() {
        let data = vec![7u8; 512];
        let mut out = Vec::new();
        arg(AtaFlags::WRITE | AtaFlags::EXTENDED, 1, &data).encode(&mut out);
        out.extend_from_slice(&[0; 40]); // trailing padding
        let a = AtaArg::decode(&out, false).unwrap();
        assert_eq!(a.data.len(), 512);
        assert!(a.flags.write() && a.flags.extended() && !a.flags.asynchronous());
        assert_eq!(a.lba, 0x1234_5678_9ABC);
    }

    #[test]
    fn short_write_rejected() {
        let data = vec![7u8; 600];
        let mut out = Vec::new();
        arg(AtaFlags::WRITE, 2, &data).encode(&mut out);
        let e = AtaArg::decode(&out, false).unwrap_err();
        assert_eq!(
            e,
            DecodeError::ShortPayload {
                what: "write data",
                need: 1024,
                have: 600
            }
        );
        assert!(e.is_argument_error());
    }

    #[test]
    fn read_request_ignores_padding_response_keeps_all() {
        let mut out = Vec::new();
        arg(0, 2, &[]).encode(&mut out);
        out.extend_from_slice(&[0; 24]);
        assert!(AtaArg::decode(&out, false).unwrap().data.is_empty());
        assert_eq!(AtaArg::decode(&out, true).unwrap().data.len(), 24);
    }

    #[test]
    fn truncated_argument() {
        assert!(matches!(
            AtaArg::decode(&[0; 11], false),
            Err(DecodeError::Truncated { .. })
        ));
    }
}
