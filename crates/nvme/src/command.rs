//! NVMe Base Specification 1.4 §5 (Admin Command Set: Identify §5.15,
//! Get Log Page §5.14, Set/Get Features §5.21/§5.9, Keep Alive §5.16,
//! Asynchronous Event Request §5.2, Abort §5.1) and the NVM Command Set
//! (§6: Read, Write, Flush, Write Zeroes, Dataset Management, Compare,
//! Reservation Register/Acquire/Release/Report): commands decoded from an
//! SQE in one step, opcode to a typed command. Fabrics commands are in
//! [`crate::fabrics`].

use crate::sqe::Sqe;
use crate::status::Status;

/// Admin opcodes.
pub mod admin_opcode {
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0A;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0C;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// NVM command set (I/O) opcodes.
pub mod io_opcode {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Compare.
    pub const COMPARE: u8 = 0x05;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    /// Reservation Register.
    pub const RESERVATION_REGISTER: u8 = 0x0D;
    /// Reservation Report.
    pub const RESERVATION_REPORT: u8 = 0x0E;
    /// Reservation Acquire.
    pub const RESERVATION_ACQUIRE: u8 = 0x11;
    /// Reservation Release.
    pub const RESERVATION_RELEASE: u8 = 0x15;
}

/// Identify CNS values this target answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cns {
    /// 00h: Identify Namespace for NSID.
    Namespace,
    /// 01h: Identify Controller.
    Controller,
    /// 02h: active namespace IDs above NSID.
    ActiveNamespaces,
    /// 03h: Namespace Identification Descriptor list for NSID.
    NamespaceDescriptors,
}

/// A typed admin command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdminCommand {
    /// Identify.
    Identify {
        /// What to return.
        cns: Cns,
        /// Namespace the CNS refers to.
        nsid: u32,
        /// Controller identifier (CDW10 bits 31:16).
        cntid: u16,
    },
    /// Get Log Page.
    GetLogPage {
        /// Log page identifier.
        lid: u8,
        /// Log specific field (e.g. ANA RGO).
        lsp: u8,
        /// Retain Asynchronous Event.
        rae: bool,
        /// Bytes to return (NUMD + 1 dwords).
        len: u64,
        /// Byte offset into the log (LPOL/LPOU).
        offset: u64,
        /// Namespace.
        nsid: u32,
    },
    /// Set Features.
    SetFeatures {
        /// Feature identifier.
        fid: u8,
        /// Save.
        save: bool,
        /// CDW11, the feature's value.
        value: u32,
    },
    /// Get Features.
    GetFeatures {
        /// Feature identifier.
        fid: u8,
        /// Select: 0 current, 1 default, 2 saved, 3 supported capabilities.
        sel: u8,
        /// CDW11.
        cdw11: u32,
    },
    /// Keep Alive.
    KeepAlive,
    /// Asynchronous Event Request.
    AsyncEventRequest,
    /// Abort of command `cid` on submission queue `sqid`.
    Abort {
        /// Submission queue of the command.
        sqid: u16,
        /// Its command identifier.
        cid: u16,
    },
}

/// Feature identifiers.
pub mod feature {
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE_TIMER: u8 = 0x0F;
    /// Host Identifier.
    pub const HOST_IDENTIFIER: u8 = 0x81;
    /// Reservation Notification Mask.
    pub const RESERVATION_NOTIFICATION_MASK: u8 = 0x82;
    /// Reservation Persistence.
    pub const RESERVATION_PERSISTENCE: u8 = 0x83;
}

impl AdminCommand {
    /// Decodes an admin command: an unknown opcode is Invalid Opcode, an
    /// unknown CNS Invalid Field.
    pub fn parse(sqe: &Sqe) -> Result<Self, Status> {
        use admin_opcode::*;
        let (c10, c11) = (sqe.cdw(10), sqe.cdw(11));
        Ok(match sqe.opcode() {
            IDENTIFY => AdminCommand::Identify {
                cns: match c10 as u8 {
                    0x00 => Cns::Namespace,
                    0x01 => Cns::Controller,
                    0x02 => Cns::ActiveNamespaces,
                    0x03 => Cns::NamespaceDescriptors,
                    _ => return Err(Status::INVALID_FIELD),
                },
                nsid: sqe.nsid(),
                cntid: (c10 >> 16) as u16,
            },
            GET_LOG_PAGE => {
                let numd = u64::from(c10 >> 16) | u64::from(c11 & 0xFFFF) << 16;
                let offset = u64::from(sqe.cdw(12)) | u64::from(sqe.cdw(13)) << 32;
                if !offset.is_multiple_of(4) {
                    return Err(Status::INVALID_FIELD);
                }
                AdminCommand::GetLogPage {
                    lid: c10 as u8,
                    lsp: ((c10 >> 8) & 0x7F) as u8,
                    rae: c10 & 1 << 15 != 0,
                    len: (numd + 1) * 4,
                    offset,
                    nsid: sqe.nsid(),
                }
            }
            SET_FEATURES => AdminCommand::SetFeatures {
                fid: c10 as u8,
                save: c10 & 1 << 31 != 0,
                value: c11,
            },
            GET_FEATURES => AdminCommand::GetFeatures {
                fid: c10 as u8,
                sel: ((c10 >> 8) & 7) as u8,
                cdw11: c11,
            },
            KEEP_ALIVE => AdminCommand::KeepAlive,
            ASYNC_EVENT_REQUEST => AdminCommand::AsyncEventRequest,
            ABORT => AdminCommand::Abort {
                sqid: c10 as u16,
                cid: (c10 >> 16) as u16,
            },
            _ => return Err(Status::INVALID_OPCODE),
        })
    }
}

/// A range of LBAs in a read, write, compare or write zeroes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LbaRange {
    /// Starting LBA.
    pub slba: u64,
    /// Number of logical blocks (NLB + 1).
    pub blocks: u32,
}

/// One range of a Dataset Management command (16 bytes on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DsmRange {
    /// Context attributes.
    pub attributes: u32,
    /// Length in logical blocks.
    pub blocks: u32,
    /// Starting LBA.
    pub slba: u64,
}

/// Decodes the range list of a Dataset Management command (`count` ranges).
pub fn parse_dsm_ranges(data: &[u8], count: usize) -> Result<Vec<DsmRange>, Status> {
    let bytes = count
        .checked_mul(16)
        .and_then(|n| data.get(..n))
        .ok_or(Status::DATA_TRANSFER_ERROR)?;
    Ok(bytes
        .chunks_exact(16)
        .map(|r| DsmRange {
            attributes: u32::from_le_bytes([r[0], r[1], r[2], r[3]]),
            blocks: u32::from_le_bytes([r[4], r[5], r[6], r[7]]),
            slba: u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]),
        })
        .collect())
}

/// Reservation keys of a Register/Acquire/Release command's data: the
/// current key and the new or preempt key (zero for Release).
pub fn parse_reservation_keys(data: &[u8]) -> Result<(u64, u64), Status> {
    let key = |at: usize| {
        data.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let crkey = key(0).ok_or(Status::DATA_TRANSFER_ERROR)?;
    Ok((crkey, key(8).unwrap_or(0)))
}

/// A typed NVM command set command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoCommand {
    /// Read.
    Read {
        /// Blocks to read.
        range: LbaRange,
        /// Force Unit Access.
        fua: bool,
    },
    /// Write.
    Write {
        /// Blocks to write.
        range: LbaRange,
        /// Force Unit Access.
        fua: bool,
    },
    /// Compare.
    Compare {
        /// Blocks to compare.
        range: LbaRange,
    },
    /// Flush.
    Flush,
    /// Write Zeroes.
    WriteZeroes {
        /// Blocks to zero.
        range: LbaRange,
        /// Deallocate: the blocks may be unmapped.
        deac: bool,
        /// Force Unit Access.
        fua: bool,
    },
    /// Dataset Management; the ranges are in the data.
    DatasetManagement {
        /// Number of ranges (NR + 1).
        ranges: usize,
        /// Attribute – Deallocate.
        deallocate: bool,
    },
    /// Reservation Register; keys in the data.
    ReservationRegister {
        /// Action: 0 register, 1 unregister, 2 replace.
        action: u8,
        /// Ignore Existing Key.
        iekey: bool,
        /// Change Persist Through Power Loss state.
        cptpl: u8,
    },
    /// Reservation Acquire; keys in the data.
    ReservationAcquire {
        /// Action: 0 acquire, 1 preempt, 2 preempt and abort.
        action: u8,
        /// Ignore Existing Key.
        iekey: bool,
        /// Reservation type.
        rtype: u8,
    },
    /// Reservation Release; key in the data.
    ReservationRelease {
        /// Action: 0 release, 1 clear.
        action: u8,
        /// Ignore Existing Key.
        iekey: bool,
        /// Reservation type.
        rtype: u8,
    },
    /// Reservation Report.
    ReservationReport {
        /// Bytes the host's buffer holds.
        len: u64,
        /// Extended data structure (128-bit host IDs).
        eds: bool,
    },
}

impl IoCommand {
    /// Decodes an NVM command set command; unknown opcode is Invalid
    /// Opcode, reserved action values Invalid Field.
    pub fn parse(sqe: &Sqe) -> Result<Self, Status> {
        use io_opcode::*;
        let (c10, c11, c12) = (sqe.cdw(10), sqe.cdw(11), sqe.cdw(12));
        let range = LbaRange {
            slba: u64::from(c10) | u64::from(c11) << 32,
            blocks: (c12 & 0xFFFF) + 1,
        };
        let fua = c12 & 1 << 30 != 0;
        let action = (c10 & 7) as u8;
        let iekey = c10 & 1 << 3 != 0;
        let rtype = (c10 >> 8) as u8;
        let check = |ok: bool, cmd: IoCommand| {
            if ok {
                Ok(cmd)
            } else {
                Err(Status::INVALID_FIELD)
            }
        };
        match sqe.opcode() {
            READ => Ok(IoCommand::Read { range, fua }),
            WRITE => Ok(IoCommand::Write { range, fua }),
            COMPARE => Ok(IoCommand::Compare { range }),
            FLUSH => Ok(IoCommand::Flush),
            WRITE_ZEROES => Ok(IoCommand::WriteZeroes {
                range,
                deac: c12 & 1 << 25 != 0,
                fua,
            }),
            DATASET_MANAGEMENT => Ok(IoCommand::DatasetManagement {
                ranges: (c10 & 0xFF) as usize + 1,
                deallocate: c11 & 1 << 2 != 0,
            }),
            RESERVATION_REGISTER => check(
                action <= 2,
                IoCommand::ReservationRegister {
                    action,
                    iekey,
                    cptpl: (c10 >> 30) as u8,
                },
            ),
            RESERVATION_ACQUIRE => check(
                action <= 2 && rtype <= 6,
                IoCommand::ReservationAcquire {
                    action,
                    iekey,
                    rtype,
                },
            ),
            RESERVATION_RELEASE => check(
                action <= 1 && rtype <= 6,
                IoCommand::ReservationRelease {
                    action,
                    iekey,
                    rtype,
                },
            ),
            RESERVATION_REPORT => Ok(IoCommand::ReservationReport {
                len: (u64::from(c10) + 1) * 4,
                eds: c11 & 1 != 0,
            }),
            _ => Err(Status::INVALID_OPCODE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqe(opcode: u8, dws: &[(usize, u32)]) -> Sqe {
        let mut s = Sqe::new(opcode, 1);
        for &(n, v) in dws {
            s.set_cdw(n, v);
        }
        s
    }

    #[test]
    fn identify_and_log_page_fields() {
        let s = sqe(0x06, &[(10, 0x0005_0001)]);
        assert_eq!(
            AdminCommand::parse(&s),
            Ok(AdminCommand::Identify {
                cns: Cns::Controller,
                nsid: 0,
                cntid: 5
            })
        );
        assert_eq!(
            AdminCommand::parse(&sqe(0x06, &[(10, 0x10)])),
            Err(Status::INVALID_FIELD)
        );
        // LID 0Ch, LSP 1 (RGO), RAE, NUMDL 0x3FF, NUMDU 1, offset 4096.
        let s = sqe(0x02, &[(10, 0x03FF_810C), (11, 1), (12, 4096)]);
        let AdminCommand::GetLogPage {
            lid,
            lsp,
            rae,
            len,
            offset,
            ..
        } = AdminCommand::parse(&s).unwrap()
        else {
            panic!()
        };
        assert_eq!((lid, lsp, rae, offset), (0x0C, 1, true, 4096));
        assert_eq!(len, ((1u64 << 16 | 0x3FF) + 1) * 4);
        assert_eq!(
            AdminCommand::parse(&sqe(0x02, &[(12, 2)])),
            Err(Status::INVALID_FIELD)
        );
    }

    #[test]
    fn features_abort_and_unknown() {
        assert_eq!(
            AdminCommand::parse(&sqe(0x09, &[(10, 0x8000_0006), (11, 1)])),
            Ok(AdminCommand::SetFeatures {
                fid: 6,
                save: true,
                value: 1
            })
        );
        assert_eq!(
            AdminCommand::parse(&sqe(0x0A, &[(10, 0x0000_0307)])),
            Ok(AdminCommand::GetFeatures {
                fid: 7,
                sel: 3,
                cdw11: 0
            })
        );
        assert_eq!(
            AdminCommand::parse(&sqe(0x08, &[(10, 0x0042_0001)])),
            Ok(AdminCommand::Abort { sqid: 1, cid: 0x42 })
        );
        assert_eq!(
            AdminCommand::parse(&sqe(0x18, &[])),
            Ok(AdminCommand::KeepAlive)
        );
        assert_eq!(
            AdminCommand::parse(&sqe(0x0C, &[])),
            Ok(AdminCommand::AsyncEventRequest)
        );
        assert_eq!(
            AdminCommand::parse(&sqe(0xC1, &[])),
            Err(Status::INVALID_OPCODE)
        );
    }

    #[test]
    fn io_fields() {
        let s = sqe(0x01, &[(10, 0x89AB_CDEF), (11, 0x1), (12, 1 << 30 | 7)]);
        assert_eq!(
            IoCommand::parse(&s),
            Ok(IoCommand::Write {
                range: LbaRange {
                    slba: 0x1_89AB_CDEF,
                    blocks: 8
                },
                fua: true
            })
        );
        let s = sqe(0x08, &[(12, 1 << 25)]);
        assert!(matches!(
            IoCommand::parse(&s),
            Ok(IoCommand::WriteZeroes {
                deac: true,
                fua: false,
                ..
            })
        ));
        let s = sqe(0x09, &[(10, 2), (11, 4)]);
        assert_eq!(
            IoCommand::parse(&s),
            Ok(IoCommand::DatasetManagement {
                ranges: 3,
                deallocate: true
            })
        );
        let s = sqe(0x11, &[(10, 0x0000_0301 | 1 << 3)]);
        assert_eq!(
            IoCommand::parse(&s),
            Ok(IoCommand::ReservationAcquire {
                action: 1,
                iekey: true,
                rtype: 3
            })
        );
        assert_eq!(
            IoCommand::parse(&sqe(0x15, &[(10, 2)])),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            IoCommand::parse(&sqe(0x0D, &[(10, 3)])),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            IoCommand::parse(&sqe(0x0E, &[(10, 15), (11, 1)])),
            Ok(IoCommand::ReservationReport { len: 64, eds: true })
        );
        assert_eq!(
            IoCommand::parse(&sqe(0x7C, &[])),
            Err(Status::INVALID_OPCODE)
        );
    }

    #[test]
    fn dsm_ranges_and_keys() {
        let mut d = vec![0u8; 32];
        d[4..8].copy_from_slice(&8u32.to_le_bytes());
        d[8..16].copy_from_slice(&100u64.to_le_bytes());
        d[20..24].copy_from_slice(&1u32.to_le_bytes());
        d[24..32].copy_from_slice(&7u64.to_le_bytes());
        let r = parse_dsm_ranges(&d, 2).unwrap();
        assert_eq!(
            r[0],
            DsmRange {
                attributes: 0,
                blocks: 8,
                slba: 100
            }
        );
        assert_eq!(r[1].slba, 7);
        assert_eq!(parse_dsm_ranges(&d, 3), Err(Status::DATA_TRANSFER_ERROR));
        let mut k = [0u8; 16];
        k[0] = 1;
        k[8] = 2;
        assert_eq!(parse_reservation_keys(&k), Ok((1, 2)));
        assert_eq!(parse_reservation_keys(&k[..8]), Ok((1, 0)));
        assert_eq!(
            parse_reservation_keys(&k[..7]),
            Err(Status::DATA_TRANSFER_ERROR)
        );
    }
}
