//! Builders of the commands a host sends (NVMe 1.4 §5, §6; NVMe-oF 1.1
//! §3): each gives the SQE (CID left for [`super::Host::submit`]) and the
//! [`Payload`] it moves.

use crate::command::{admin_opcode, io_opcode};
use crate::fabrics::{
    Connect, ConnectData, FabricsCommand, PropertySize, CATTR_DISABLE_SQ_FLOW_CONTROL,
};
use crate::identify::IDENTIFY_LEN;
use crate::sqe::Sqe;

/// The data a command moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// No data.
    None,
    /// Host to controller: these bytes (in-capsule when they fit, else
    /// sent for the controller's R2Ts).
    ToController(Vec<u8>),
    /// Controller to host: at most this many bytes.
    FromController(u32),
}

impl Payload {
    /// Bytes the command's data pointer describes.
    pub fn len(&self) -> u32 {
        match self {
            Payload::None => 0,
            Payload::ToController(d) => d.len() as u32,
            Payload::FromController(n) => *n,
        }
    }

    /// Whether no data moves.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A command ready to submit: its SQE and its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The SQE; its CID and SGL are set on submission.
    pub sqe: Sqe,
    /// Its data.
    pub data: Payload,
}

/// CNTLID of a Connect for a new admin queue (dynamic controller model).
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;

/// Connect (NVMe-oF 1.1 §3.3) of queue `qid` with `sqsize` entries (1's
/// based here), Keep Alive Timeout `kato_ms` (admin queue), SQ flow
/// control disabled if `no_sq_flow` (the controller may then end reads
/// with C2HData SUCCESS); `data` names the host, the subsystem and the
/// controller (FFFFh for an admin queue, the admin queue's for an I/O one).
pub fn connect(
    qid: u16,
    sqsize: u16,
    kato_ms: u32,
    no_sq_flow: bool,
    data: &ConnectData,
) -> Request {
    let c = Connect {
        recfmt: 0,
        qid,
        sqsize: sqsize.saturating_sub(1),
        cattr: if no_sq_flow {
            CATTR_DISABLE_SQ_FLOW_CONTROL
        } else {
            0
        },
        kato: if qid == 0 { kato_ms } else { 0 },
    };
    Request {
        sqe: FabricsCommand::Connect(c).to_sqe(0),
        data: Payload::ToController(data.encode()),
    }
}

/// Property Get of a 4- or 8-byte property at `offset`.
pub fn property_get(offset: u32, size: PropertySize) -> Request {
    Request {
        sqe: FabricsCommand::PropertyGet { size, offset }.to_sqe(0),
        data: Payload::None,
    }
}

/// Property Set of `value` at `offset`.
pub fn property_set(offset: u32, size: PropertySize, value: u64) -> Request {
    Request {
        sqe: FabricsCommand::PropertySet {
            size,
            offset,
            value,
        }
        .to_sqe(0),
        data: Payload::None,
    }
}

/// Identify with CNS `cns` (00h namespace, 01h controller, 02h active
/// namespace list, 03h descriptors) for `nsid`: 4096 bytes back.
pub fn identify(cns: u8, nsid: u32) -> Request {
    let mut sqe = Sqe::new(admin_opcode::IDENTIFY, 0);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, u32::from(cns));
    Request {
        sqe,
        data: Payload::FromController(IDENTIFY_LEN as u32),
    }
}

/// Get Log Page `lid` for `nsid`: `len` bytes (a multiple of 4, at least
/// 4) from byte `offset`.
pub fn get_log_page(lid: u8, nsid: u32, offset: u64, len: u32) -> Request {
    let numd = (len.max(4) / 4 - 1) as u64;
    let mut sqe = Sqe::new(admin_opcode::GET_LOG_PAGE, 0);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, u32::from(lid) | ((numd as u32 & 0xFFFF) << 16));
    sqe.set_cdw(11, (numd >> 16) as u32 & 0xFFFF);
    sqe.set_cdw(12, offset as u32);
    sqe.set_cdw(13, (offset >> 32) as u32);
    Request {
        sqe,
        data: Payload::FromController(len.max(4) / 4 * 4),
    }
}

/// Keep Alive.
pub fn keep_alive() -> Request {
    Request {
        sqe: Sqe::new(admin_opcode::KEEP_ALIVE, 0),
        data: Payload::None,
    }
}

fn lba_sqe(opcode: u8, nsid: u32, slba: u64, blocks: u32) -> Sqe {
    let mut sqe = Sqe::new(opcode, 0);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, slba as u32);
    sqe.set_cdw(11, (slba >> 32) as u32);
    sqe.set_cdw(12, blocks.saturating_sub(1) & 0xFFFF);
    sqe
}

/// FUA bit of CDW12.
const CDW12_FUA: u32 = 1 << 30;
/// DEAC bit of Write Zeroes' CDW12.
const CDW12_DEAC: u32 = 1 << 25;

/// Read of `blocks` (1..=65536) blocks of `block_size` bytes at `slba`.
pub fn read(nsid: u32, slba: u64, blocks: u32, block_size: u32) -> Request {
    Request {
        sqe: lba_sqe(io_opcode::READ, nsid, slba, blocks),
        data: Payload::FromController(blocks.saturating_mul(block_size)),
    }
}

/// Write of `data` (whole blocks, `blocks` of them) at `slba`; `fua`:
/// durable when completed.
pub fn write(nsid: u32, slba: u64, blocks: u32, data: Vec<u8>, fua: bool) -> Request {
    let mut sqe = lba_sqe(io_opcode::WRITE, nsid, slba, blocks);
    if fua {
        sqe.set_cdw(12, sqe.cdw(12) | CDW12_FUA);
    }
    Request {
        sqe,
        data: Payload::ToController(data),
    }
}

/// Flush.
pub fn flush(nsid: u32) -> Request {
    let mut sqe = Sqe::new(io_opcode::FLUSH, 0);
    sqe.set_nsid(nsid);
    Request {
        sqe,
        data: Payload::None,
    }
}

/// Write Zeroes of `blocks` blocks at `slba`; `deallocate`: they may be
/// deallocated.
pub fn write_zeroes(nsid: u32, slba: u64, blocks: u32, deallocate: bool) -> Request {
    let mut sqe = lba_sqe(io_opcode::WRITE_ZEROES, nsid, slba, blocks);
    if deallocate {
        sqe.set_cdw(12, sqe.cdw(12) | CDW12_DEAC);
    }
    Request {
        sqe,
        data: Payload::None,
    }
}

/// Dataset Management with Deallocate of up to 256 `(slba, blocks)` ranges.
pub fn deallocate(nsid: u32, ranges: &[(u64, u32)]) -> Request {
    let ranges = &ranges[..ranges.len().clamp(1, 256)];
    let mut data = Vec::with_capacity(16 * ranges.len());
    for &(slba, blocks) in ranges {
        data.extend_from_slice(&0u32.to_le_bytes());
        data.extend_from_slice(&blocks.to_le_bytes());
        data.extend_from_slice(&slba.to_le_bytes());
    }
    let mut sqe = Sqe::new(io_opcode::DATASET_MANAGEMENT, 0);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, (ranges.len() as u32).saturating_sub(1));
    sqe.set_cdw(11, 1 << 2);
    Request {
        sqe,
        data: Payload::ToController(data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{AdminCommand, Cns, IoCommand, LbaRange};

    #[test]
    fn builders_parse_back() {
        let r = read(1, 0x1_0000_0002, 8, 512);
        assert_eq!(r.data, Payload::FromController(4096));
        assert_eq!(
            IoCommand::parse(&r.sqe),
            Ok(IoCommand::Read {
                range: LbaRange {
                    slba: 0x1_0000_0002,
                    blocks: 8
                },
                fua: false
            })
        );
        let w = write(1, 5, 1, vec![0; 512], true);
        assert!(matches!(
            IoCommand::parse(&w.sqe),
            Ok(IoCommand::Write { fua: true, .. })
        ));
        let z = write_zeroes(1, 9, 3, true);
        assert!(matches!(
            IoCommand::parse(&z.sqe),
            Ok(IoCommand::WriteZeroes {
                deac: true,
                range: LbaRange { slba: 9, blocks: 3 },
                ..
            })
        ));
        let d = deallocate(1, &[(1, 2), (10, 20)]);
        assert_eq!(
            IoCommand::parse(&d.sqe),
            Ok(IoCommand::DatasetManagement {
                ranges: 2,
                deallocate: true
            })
        );
        let Payload::ToController(bytes) = &d.data else {
            panic!("no data")
        };
        let parsed = crate::command::parse_dsm_ranges(bytes, 2).unwrap();
        assert_eq!((parsed[1].slba, parsed[1].blocks), (10, 20));
        assert_eq!(
            AdminCommand::parse(&identify(1, 0).sqe),
            Ok(AdminCommand::Identify {
                cns: Cns::Controller,
                nsid: 0,
                cntid: 0
            })
        );
        let AdminCommand::GetLogPage {
            lid, len, offset, ..
        } = AdminCommand::parse(&get_log_page(0x70, 0, 1024, 3072).sqe).unwrap()
        else {
            panic!("not a log page")
        };
        assert_eq!((lid, len, offset), (0x70, 3072, 1024));
        assert_eq!(
            AdminCommand::parse(&keep_alive().sqe),
            Ok(AdminCommand::KeepAlive)
        );
    }

    #[test]
    fn connect_and_properties() {
        let data = ConnectData {
            host_id: [7; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: "nqn.s".into(),
            hostnqn: "nqn.h".into(),
        };
        let r = connect(0, 32, 15_000, true, &data);
        let Ok(FabricsCommand::Connect(c)) = FabricsCommand::parse(&r.sqe) else {
            panic!("not a connect")
        };
        assert_eq!((c.qid, c.sqsize, c.kato), (0, 31, 15_000));
        assert!(c.sq_flow_control_disabled());
        let Ok(FabricsCommand::Connect(c)) =
            FabricsCommand::parse(&connect(1, 8, 15_000, false, &data).sqe)
        else {
            panic!("not a connect")
        };
        assert!(!c.sq_flow_control_disabled());
        assert_eq!(c.kato, 0, "KATO only on the admin queue");
        let Payload::ToController(bytes) = &r.data else {
            panic!("no data")
        };
        assert_eq!(ConnectData::parse(bytes), Ok(data));
        assert_eq!(
            FabricsCommand::parse(&property_set(0x14, PropertySize::Four, 1).sqe),
            Ok(FabricsCommand::PropertySet {
                size: PropertySize::Four,
                offset: 0x14,
                value: 1
            })
        );
        assert_eq!(
            FabricsCommand::parse(&property_get(0, PropertySize::Eight).sqe),
            Ok(FabricsCommand::PropertyGet {
                size: PropertySize::Eight,
                offset: 0
            })
        );
    }
}
