//! NVMe over Fabrics 1.1 §3.3 (Connect, with its data §3.3.1), §3.4
//! (Property Get) and §3.5 (Property Set): the fabrics commands, opcode
//! 7Fh, told apart by FCTYPE.

use crate::sqe::{Sqe, FABRICS_OPCODE};
use crate::status::Status;

/// FCTYPE of Property Set.
pub const FCTYPE_PROPERTY_SET: u8 = 0x00;
/// FCTYPE of Connect.
pub const FCTYPE_CONNECT: u8 = 0x01;
/// FCTYPE of Property Get.
pub const FCTYPE_PROPERTY_GET: u8 = 0x04;
/// FCTYPE of Disconnect (NVMe-oF 1.1).
pub const FCTYPE_DISCONNECT: u8 = 0x08;

/// Length of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;

/// CATTR bit: the host disables SQ flow control (SQHD reported as FFFFh).
pub const CATTR_DISABLE_SQ_FLOW_CONTROL: u8 = 1 << 2;

/// Size of a property access (ATTRIB bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PropertySize {
    /// 4 bytes.
    Four,
    /// 8 bytes.
    Eight,
}

/// The Connect command's fields (SQE dwords 10–12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Connect {
    /// Record format (0).
    pub recfmt: u16,
    /// Queue to create: 0 is the admin queue.
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    /// Connect attributes (priority, SQ flow control disable).
    pub cattr: u8,
    /// Keep Alive Timeout in milliseconds (admin queue only; 0 = off).
    pub kato: u32,
}

impl Connect {
    /// Whether the host disabled SQ flow control.
    pub fn sq_flow_control_disabled(&self) -> bool {
        self.cattr & CATTR_DISABLE_SQ_FLOW_CONTROL != 0
    }
}

/// The 1024-byte data of a Connect command.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConnectData {
    /// Host Identifier.
    pub host_id: [u8; 16],
    /// Controller ID asked for: FFFFh (dynamic model) or FFFEh for the
    /// admin queue, the admin queue's controller for an I/O queue.
    pub cntlid: u16,
    /// NQN of the subsystem (NUL bytes trimmed).
    pub subnqn: String,
    /// NQN of the host (NUL bytes trimmed).
    pub hostnqn: String,
}

/// NQN field bytes as text: up to the first NUL, UTF-8 required.
fn nqn(b: &[u8]) -> Option<String> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end]).ok().map(str::to_owned)
}

impl ConnectData {
    /// Decodes the Connect data; fewer than 1024 bytes or a non-UTF-8 NQN
    /// is Connect Invalid Parameters.
    pub fn parse(b: &[u8]) -> Result<Self, Status> {
        let b = b
            .get(..CONNECT_DATA_LEN)
            .ok_or(Status::CONNECT_INVALID_PARAMETERS)?;
        let mut host_id = [0u8; 16];
        host_id.copy_from_slice(&b[..16]);
        Ok(ConnectData {
            host_id,
            cntlid: u16::from_le_bytes([b[16], b[17]]),
            subnqn: nqn(&b[256..512]).ok_or(Status::CONNECT_INVALID_PARAMETERS)?,
            hostnqn: nqn(&b[512..768]).ok_or(Status::CONNECT_INVALID_PARAMETERS)?,
        })
    }

    /// Encodes the data (for tests and initiators); NQNs are cut at 255 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CONNECT_DATA_LEN];
        b[..16].copy_from_slice(&self.host_id);
        b[16..18].copy_from_slice(&self.cntlid.to_le_bytes());
        for (at, s) in [(256, &self.subnqn), (512, &self.hostnqn)] {
            let n = s.len().min(255);
            b[at..at + n].copy_from_slice(&s.as_bytes()[..n]);
        }
        b
    }
}

/// A fabrics command, typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FabricsCommand {
    /// Connect: create the admin queue (a controller) or an I/O queue.
    Connect(Connect),
    /// Property Get of `size` at `offset`.
    PropertyGet {
        /// Property size.
        size: PropertySize,
        /// Property offset.
        offset: u32,
    },
    /// Property Set of `value` (`size` bytes of it) at `offset`.
    PropertySet {
        /// Property size.
        size: PropertySize,
        /// Property offset.
        offset: u32,
        /// Value to write.
        value: u64,
    },
    /// Disconnect: delete this I/O queue.
    Disconnect,
}

impl FabricsCommand {
    /// Decodes a fabrics command: opcode 7Fh required, an unknown FCTYPE is
    /// Invalid Opcode (as targets commonly answer), a reserved property
    /// size Invalid Field.
    pub fn parse(sqe: &Sqe) -> Result<Self, Status> {
        if sqe.opcode() != FABRICS_OPCODE {
            return Err(Status::INVALID_OPCODE);
        }
        let size = || match sqe.0[40] & 7 {
            0 => Ok(PropertySize::Four),
            1 => Ok(PropertySize::Eight),
            _ => Err(Status::INVALID_FIELD),
        };
        Ok(match sqe.fctype() {
            FCTYPE_CONNECT => {
                let cdw10 = sqe.cdw(10);
                let cdw11 = sqe.cdw(11);
                FabricsCommand::Connect(Connect {
                    recfmt: cdw10 as u16,
                    qid: (cdw10 >> 16) as u16,
                    sqsize: cdw11 as u16,
                    cattr: (cdw11 >> 16) as u8,
                    kato: sqe.cdw(12),
                })
            }
            FCTYPE_PROPERTY_GET => FabricsCommand::PropertyGet {
                size: size()?,
                offset: sqe.cdw(11),
            },
            FCTYPE_PROPERTY_SET => FabricsCommand::PropertySet {
                size: size()?,
                offset: sqe.cdw(11),
                value: u64::from(sqe.cdw(12)) | u64::from(sqe.cdw(13)) << 32,
            },
            FCTYPE_DISCONNECT => FabricsCommand::Disconnect,
            _ => return Err(Status::INVALID_OPCODE),
        })
    }

    /// Encodes this command as an SQE with command identifier `cid`
    /// (for tests and initiators; the SGL is left for the caller).
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(FABRICS_OPCODE, cid);
        let size_bits = |size: &PropertySize| u32::from(*size == PropertySize::Eight);
        match self {
            FabricsCommand::Connect(c) => {
                s.0[4] = FCTYPE_CONNECT;
                s.set_cdw(10, u32::from(c.recfmt) | u32::from(c.qid) << 16);
                s.set_cdw(11, u32::from(c.sqsize) | u32::from(c.cattr) << 16);
                s.set_cdw(12, c.kato);
            }
            FabricsCommand::PropertyGet { size, offset } => {
                s.0[4] = FCTYPE_PROPERTY_GET;
                s.set_cdw(10, size_bits(size));
                s.set_cdw(11, *offset);
            }
            FabricsCommand::PropertySet {
                size,
                offset,
                value,
            } => {
                s.0[4] = FCTYPE_PROPERTY_SET;
                s.set_cdw(10, size_bits(size));
                s.set_cdw(11, *offset);
                s.set_cdw(12, *value as u32);
                s.set_cdw(13, (*value >> 32) as u32);
            }
            FabricsCommand::Disconnect => s.0[4] = FCTYPE_DISCONNECT,
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_fields_at_their_offsets() {
        let mut s = Sqe::new(FABRICS_OPCODE, 1);
        s.0[4] = FCTYPE_CONNECT;
        s.0[42..44].copy_from_slice(&3u16.to_le_bytes()); // QID
        s.0[44..46].copy_from_slice(&127u16.to_le_bytes()); // SQSIZE
        s.0[46] = CATTR_DISABLE_SQ_FLOW_CONTROL;
        s.0[48..52].copy_from_slice(&15000u32.to_le_bytes()); // KATO
        let FabricsCommand::Connect(c) = FabricsCommand::parse(&s).unwrap() else {
            panic!("not a connect");
        };
        assert_eq!((c.recfmt, c.qid, c.sqsize, c.kato), (0, 3, 127, 15000));
        assert!(c.sq_flow_control_disabled());
        assert_eq!(FabricsCommand::Connect(c).to_sqe(1), s);
    }

    #[test]
    fn connect_data_layout() {
        let mut b = vec![0u8; 1024];
        b[0] = 0xAA;
        b[16..18].copy_from_slice(&0xFFFFu16.to_le_bytes());
        b[256..256 + 9].copy_from_slice(b"nqn.sub:1");
        b[512..512 + 10].copy_from_slice(b"nqn.host:2");
        let d = ConnectData::parse(&b).unwrap();
        assert_eq!(d.host_id[0], 0xAA);
        assert_eq!(d.cntlid, 0xFFFF);
        assert_eq!(d.subnqn, "nqn.sub:1");
        assert_eq!(d.hostnqn, "nqn.host:2");
        assert_eq!(d.encode(), b);
        assert_eq!(
            ConnectData::parse(&b[..1000]),
            Err(Status::CONNECT_INVALID_PARAMETERS)
        );
        b[260] = 0xFF; // inside the subsystem NQN
        assert_eq!(
            ConnectData::parse(&b),
            Err(Status::CONNECT_INVALID_PARAMETERS)
        );
    }

    #[test]
    fn property_commands() {
        let set = FabricsCommand::PropertySet {
            size: PropertySize::Four,
            offset: 0x14,
            value: 0x0046_0001,
        };
        let s = set.to_sqe(7);
        assert_eq!(s.0[4], FCTYPE_PROPERTY_SET);
        assert_eq!(&s.0[44..48], &0x14u32.to_le_bytes());
        assert_eq!(FabricsCommand::parse(&s), Ok(set));
        let get = FabricsCommand::PropertyGet {
            size: PropertySize::Eight,
            offset: 0,
        };
        let mut s = get.to_sqe(8);
        assert_eq!(s.0[40], 1);
        assert_eq!(FabricsCommand::parse(&s), Ok(get));
        s.0[40] = 2;
        assert_eq!(FabricsCommand::parse(&s), Err(Status::INVALID_FIELD));
        s.0[4] = 0x7E;
        assert_eq!(FabricsCommand::parse(&s), Err(Status::INVALID_OPCODE));
    }
}
