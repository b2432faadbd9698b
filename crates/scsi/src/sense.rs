//! SPC-4 §4.5: sense data, fixed (0x70) and descriptor (0x72) formats.
//!
//! Every error a command can end with is a [`Sense`] value; the logical
//! unit renders it in the format its Control mode page (D_SENSE) selects.

/// Sense keys (SPC-4 Table 50).
pub mod key {
    /// NO SENSE
    pub const NO_SENSE: u8 = 0x0;
    /// NOT READY
    pub const NOT_READY: u8 = 0x2;
    /// MEDIUM ERROR
    pub const MEDIUM_ERROR: u8 = 0x3;
    /// HARDWARE ERROR
    pub const HARDWARE_ERROR: u8 = 0x4;
    /// ILLEGAL REQUEST
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    /// UNIT ATTENTION
    pub const UNIT_ATTENTION: u8 = 0x6;
    /// DATA PROTECT
    pub const DATA_PROTECT: u8 = 0x7;
    /// ABORTED COMMAND
    pub const ABORTED_COMMAND: u8 = 0xb;
    /// MISCOMPARE
    pub const MISCOMPARE: u8 = 0xe;
}

/// One sense condition: key, additional sense code and qualifier, plus the
/// optional INFORMATION field and sense-key-specific field pointer.
///
/// It is the error type of every command: a command that fails returns the
/// `Sense` it ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("sense key {key:#x}, ASC/ASCQ {asc:#04x}/{ascq:#04x}")]
pub struct Sense {
    /// Sense key.
    pub key: u8,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// INFORMATION field (e.g. miscompare offset).
    pub info: Option<u64>,
    /// Field pointer: (in CDB rather than parameter list, byte, bit).
    pub field: Option<(bool, u16, Option<u8>)>,
    /// Progress indication (0..=65535) for NOT READY conditions.
    pub progress: Option<u16>,
}

impl Sense {
    /// A sense with no extra fields.
    pub const fn new(key: u8, asc: u8, ascq: u8) -> Sense {
        Sense {
            key,
            asc,
            ascq,
            info: None,
            field: None,
            progress: None,
        }
    }

    /// INVALID FIELD IN CDB pointing at `byte` (and `bit`).
    pub const fn invalid_cdb_field(byte: u16, bit: Option<u8>) -> Sense {
        Sense {
            key: key::ILLEGAL_REQUEST,
            asc: 0x24,
            ascq: 0,
            info: None,
            field: Some((true, byte, bit)),
            progress: None,
        }
    }

    /// INVALID FIELD IN PARAMETER LIST pointing at `byte`.
    pub const fn invalid_param_field(byte: u16) -> Sense {
        Sense {
            key: key::ILLEGAL_REQUEST,
            asc: 0x26,
            ascq: 0,
            info: None,
            field: Some((false, byte, None)),
            progress: None,
        }
    }

    /// With an INFORMATION value.
    pub const fn with_info(mut self, info: u64) -> Sense {
        self.info = Some(info);
        self
    }

    /// With a progress indication (fraction done, out of 65536).
    pub const fn with_progress(mut self, progress: u16) -> Sense {
        self.progress = Some(progress);
        self
    }

    /// Read sense data in fixed (0x70/0x71) or descriptor (0x72/0x73)
    /// format, as a target sends it: key, ASC/ASCQ, the INFORMATION field
    /// (fixed format only with VALID set) and the sense-key-specific
    /// bytes (a field pointer under ILLEGAL REQUEST, a progress indication
    /// under NOT READY or NO SENSE). `None` for an empty, truncated or
    /// unknown format. The one parser of sense data in ethersan: the
    /// server's logs, the counters, the initiator and the tests use it.
    pub fn parse(b: &[u8]) -> Option<Sense> {
        let (key, asc, ascq, info, sks) = match b.first()? & 0x7f {
            0x70 | 0x71 if b.len() >= 14 => {
                let info = (b[0] & 0x80 != 0)
                    .then(|| u64::from(u32::from_be_bytes([b[3], b[4], b[5], b[6]])));
                let sks = b.get(15..18).filter(|s| s[0] & 0x80 != 0);
                (
                    b[2] & 0x0f,
                    b[12],
                    b[13],
                    info,
                    sks.map(|s| [s[0], s[1], s[2]]),
                )
            }
            0x72 | 0x73 if b.len() >= 4 => {
                let (mut info, mut sks) = (None, None);
                let end = b.len().min(8 + usize::from(*b.get(7).unwrap_or(&0)));
                let mut at = 8;
                while at + 2 <= end {
                    let len = usize::from(b[at + 1]);
                    let body = b.get(at + 2..(at + 2 + len).min(end)).unwrap_or_default();
                    match b[at] {
                        0x00 if body.len() >= 10 => {
                            info = Some(u64::from_be_bytes(body[2..10].try_into().ok()?));
                        }
                        0x02 if body.len() >= 5 && body[2] & 0x80 != 0 => {
                            sks = Some([body[2], body[3], body[4]]);
                        }
                        _ => {}
                    }
                    at += 2 + len;
                }
                (b[1] & 0x0f, b[2], b[3], info, sks)
            }
            _ => return None,
        };
        let mut sense = Sense::new(key, asc, ascq);
        sense.info = info;
        if let Some([b0, hi, lo]) = sks {
            let value = u16::from_be_bytes([hi, lo]);
            match key {
                key::ILLEGAL_REQUEST => {
                    let bit = (b0 & 0x08 != 0).then_some(b0 & 7);
                    sense.field = Some((b0 & 0x40 != 0, value, bit));
                }
                key::NOT_READY | key::NO_SENSE => sense.progress = Some(value),
                _ => {}
            }
        }
        Some(sense)
    }

    /// (key, ASC, ASCQ), the triple most callers compare against.
    pub const fn triple(&self) -> (u8, u8, u8) {
        (self.key, self.asc, self.ascq)
    }

    /// Render as fixed (0x70) or descriptor (0x72) sense data.
    pub fn to_bytes(&self, descriptor: bool) -> Vec<u8> {
        let progress = self.progress.map(|p| [0x80, (p >> 8) as u8, p as u8]);
        let sks = progress.or(self.field.map(|(cdb, byte, bit)| {
            let mut b0 = 0x80u8; // SKSV
            if cdb {
                b0 |= 0x40; // C/D
            }
            if let Some(bit) = bit {
                b0 |= 0x08 | (bit & 7); // BPV + bit pointer
            }
            let f = byte.to_be_bytes();
            [b0, f[0], f[1]]
        }));
        if descriptor {
            let mut out = vec![0x72, self.key & 0x0f, self.asc, self.ascq, 0, 0, 0, 0];
            if let Some(info) = self.info {
                out.extend_from_slice(&[0x00, 0x0a, 0x80, 0x00]);
                out.extend_from_slice(&info.to_be_bytes());
            }
            if let Some(s) = sks {
                out.extend_from_slice(&[0x02, 0x06, 0x00, 0x00, s[0], s[1], s[2], 0x00]);
            }
            out[7] = (out.len() - 8) as u8;
            out
        } else {
            let mut out = vec![0u8; 18];
            out[0] = 0x70;
            out[2] = self.key & 0x0f;
            if let Some(info) = self.info {
                out[0] |= 0x80; // VALID
                out[3..7].copy_from_slice(&(info as u32).to_be_bytes());
            }
            out[7] = 10;
            out[12] = self.asc;
            out[13] = self.ascq;
            if let Some(s) = sks {
                out[15..18].copy_from_slice(&s);
            }
            out
        }
    }
}

/// Common conditions by name.
pub mod codes {
    use super::{key, Sense};
    /// INVALID COMMAND OPERATION CODE
    pub const INVALID_OPCODE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x20, 0x00);
    /// LOGICAL BLOCK ADDRESS OUT OF RANGE
    pub const LBA_OUT_OF_RANGE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x21, 0x00);
    /// INVALID FIELD IN CDB (no pointer)
    pub const INVALID_FIELD_IN_CDB: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x24, 0x00);
    /// INVALID FIELD IN COMMAND INFORMATION UNIT (the transport's expected
    /// length does not fit the command)
    pub const INVALID_FIELD_IN_IU: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x0e, 0x03);
    /// LOGICAL UNIT NOT SUPPORTED
    pub const LUN_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x25, 0x00);
    /// PARAMETER LIST LENGTH ERROR
    pub const PARAM_LIST_LENGTH: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x1a, 0x00);
    /// SAVING PARAMETERS NOT SUPPORTED
    pub const SAVING_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x39, 0x00);
    /// MEDIUM REMOVAL PREVENTED
    pub const REMOVAL_PREVENTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x53, 0x02);
    /// SANITIZE IN PROGRESS
    pub const SANITIZE_IN_PROGRESS: Sense = Sense::new(key::NOT_READY, 0x04, 0x1b);
    /// SANITIZE COMMAND FAILED
    pub const SANITIZE_FAILED: Sense = Sense::new(key::MEDIUM_ERROR, 0x31, 0x03);
    /// MEDIUM NOT PRESENT
    pub const MEDIUM_NOT_PRESENT: Sense = Sense::new(key::NOT_READY, 0x3a, 0x00);
    /// LOGICAL UNIT ACCESS NOT AUTHORIZED: the LUN needs a more secure
    /// native transport channel (the INFORMATION field holds the level).
    pub const LUN_ACCESS_NOT_AUTHORIZED: Sense = Sense::new(key::DATA_PROTECT, 0x74, 0x71);
    /// WRITE PROTECTED
    pub const WRITE_PROTECTED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x00);
    /// LOGICAL UNIT SOFTWARE WRITE PROTECTED
    pub const SOFTWARE_WRITE_PROTECTED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x02);
    /// UNRECOVERED READ ERROR
    pub const READ_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x11, 0x00);
    /// WRITE ERROR
    pub const WRITE_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x0c, 0x00);
    /// ABORTED COMMAND / DATA PHASE ERROR: the Data-Out of a command
    /// never arrived whole.
    pub const DATA_PHASE_ERROR: Sense = Sense::new(key::ABORTED_COMMAND, 0x4b, 0x00);
    /// SPACE ALLOCATION FAILED WRITE PROTECT
    pub const SPACE_ALLOCATION_FAILED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x07);
    /// MISCOMPARE DURING VERIFY OPERATION
    pub const MISCOMPARE_VERIFY: Sense = Sense::new(key::MISCOMPARE, 0x1d, 0x00);
    /// POWER ON, RESET, OR BUS DEVICE RESET OCCURRED
    pub const POWER_ON_RESET: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x00);
    /// BUS DEVICE RESET FUNCTION OCCURRED (logical unit reset)
    pub const LUN_RESET: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x03);
    /// I_T NEXUS LOSS OCCURRED
    pub const NEXUS_LOSS: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x07);
    /// MODE PARAMETERS CHANGED
    pub const MODE_PARAMETERS_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x01);
    /// CAPACITY DATA HAS CHANGED
    pub const CAPACITY_DATA_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x09);
    /// REPORTED LUNS DATA HAS CHANGED
    pub const REPORTED_LUNS_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x3f, 0x0e);
    /// COMMANDS CLEARED BY ANOTHER INITIATOR
    pub const COMMANDS_CLEARED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2f, 0x00);
    /// INTERNAL TARGET FAILURE
    pub const INTERNAL_FAILURE: Sense = Sense::new(key::HARDWARE_ERROR, 0x44, 0x00);
    /// LOGICAL UNIT COMMUNICATION TIME-OUT, as ABORTED COMMAND: the store
    /// (a cluster) did not answer in time. SPC-4 §4.5.6 lists ABORTED
    /// COMMAND as "the application client may be able to recover by trying
    /// the command again"; Linux's SCSI midlayer retries it, and
    /// dm-multipath (`scsi_dh`/`blk_path_error`) treats it as a path
    /// error, so the command goes again, possibly through another gateway.
    /// MEDIUM ERROR would be final, NOT READY would make Linux wait for the
    /// unit to "become ready" on this path only.
    pub const LU_COMMUNICATION_TIMEOUT: Sense = Sense::new(key::ABORTED_COMMAND, 0x08, 0x01);
    /// LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE
    pub const ALUA_STANDBY: Sense = Sense::new(key::NOT_READY, 0x04, 0x0b);
    /// LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE
    pub const ALUA_UNAVAILABLE: Sense = Sense::new(key::NOT_READY, 0x04, 0x0c);
    /// ASYMMETRIC ACCESS STATE CHANGED
    pub const ALUA_STATE_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x06);
    /// RESERVATIONS PREEMPTED
    pub const RESERVATIONS_PREEMPTED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x03);
    /// RESERVATIONS RELEASED
    pub const RESERVATIONS_RELEASED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x04);
    /// REGISTRATIONS PREEMPTED
    pub const REGISTRATIONS_PREEMPTED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x05);
}

#[cfg(test)]
mod tests {

    #[test]
    fn parse_reads_back_what_to_bytes_writes_in_both_formats() {
        let cases = [
            Sense::new(key::UNIT_ATTENTION, 0x29, 0x00),
            Sense::invalid_cdb_field(2, Some(5)),
            Sense::invalid_cdb_field(1, None),
            Sense::invalid_param_field(7),
            Sense::new(key::MISCOMPARE, 0x1d, 0).with_info(0x1234_5678),
            Sense::new(key::NOT_READY, 0x04, 0x1b).with_progress(0x8000),
            Sense::new(key::DATA_PROTECT, 0x74, 0x71).with_info(2),
        ];
        for s in cases {
            assert_eq!(Sense::parse(&s.to_bytes(false)), Some(s), "fixed {s:?}");
            assert_eq!(Sense::parse(&s.to_bytes(true)), Some(s), "descriptor {s:?}");
        }
    }

    #[test]
    fn parse_refuses_empty_truncated_and_unknown_sense() {
        assert_eq!(Sense::parse(&[]), None);
        assert_eq!(Sense::parse(&[0x70, 0, 6]), None);
        assert_eq!(Sense::parse(&[0x72, 6]), None);
        assert_eq!(Sense::parse(&[0x7f; 18]), None);
        // A descriptor whose length runs past the data is ignored, not read.
        let s = Sense::parse(&[0x72, 6, 0x29, 0, 0, 0, 0, 12, 0x00, 0x0a, 0x80]).unwrap();
        assert_eq!((s.triple(), s.info), ((6, 0x29, 0), None));
    }
    use super::*;

    #[test]
    fn fixed_and_descriptor() {
        let s = Sense::invalid_cdb_field(2, Some(5));
        let f = s.to_bytes(false);
        assert_eq!(f.len(), 18);
        assert_eq!((f[0], f[2], f[12], f[13]), (0x70, 5, 0x24, 0));
        assert_eq!(&f[15..18], &[0xcd, 0, 2]);
        let d = s.to_bytes(true);
        assert_eq!((d[0], d[1], d[2], d[3]), (0x72, 5, 0x24, 0));
        assert_eq!(d[7] as usize, d.len() - 8);
        let m = codes::MISCOMPARE_VERIFY.with_info(513).to_bytes(false);
        assert_eq!(m[0], 0xf0);
        assert_eq!(&m[3..7], &513u32.to_be_bytes());
        let md = codes::MISCOMPARE_VERIFY.with_info(513).to_bytes(true);
        assert_eq!(&md[8..12], &[0, 0x0a, 0x80, 0]);
        assert_eq!(&md[12..20], &513u64.to_be_bytes());
    }
}
