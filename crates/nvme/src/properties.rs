//! NVMe Base Specification 1.4 §3.1 (controller registers CAP, VS, CC,
//! CSTS) as NVMe-oF 1.1 §3.4–§3.5 exposes them through Property Get and
//! Property Set, and §7.6 (controller initialization and shutdown): a
//! small state machine where CC.EN sets CSTS.RDY and CC.SHN completes a
//! shutdown at once.

use crate::fabrics::PropertySize;
use crate::status::Status;

/// Offset of CAP (8 bytes).
pub const CAP: u32 = 0x00;
/// Offset of VS (4 bytes).
pub const VS: u32 = 0x08;
/// Offset of CC (4 bytes).
pub const CC: u32 = 0x14;
/// Offset of CSTS (4 bytes).
pub const CSTS: u32 = 0x1C;

/// VS value of NVMe 1.4.
pub const VERSION_1_4: u32 = 0x0001_0400;

/// CC.EN.
pub const CC_EN: u32 = 1 << 0;
/// CC.SHN mask (bits 15:14).
pub const CC_SHN_MASK: u32 = 3 << 14;
/// CSTS.RDY.
pub const CSTS_RDY: u32 = 1 << 0;
/// CSTS.CFS (controller fatal status).
pub const CSTS_CFS: u32 = 1 << 1;
/// CSTS.SHST value "shutdown processing complete" (bits 3:2 = 10b).
pub const CSTS_SHST_COMPLETE: u32 = 2 << 2;

/// Values the controller reports in CAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// Maximum Queue Entries Supported, 0's based.
    pub mqes: u16,
    /// Timeout for CSTS.RDY changes, in 500 ms units.
    pub timeout: u8,
    /// Memory Page Size Minimum (2^(12 + MPSMIN)).
    pub mpsmin: u8,
}

impl Capabilities {
    /// The 64-bit CAP register: MQES, CQR (contiguous queues required, as
    /// fabrics controllers report), TO, CSS with the NVM command set bit,
    /// MPSMIN = MPSMAX.
    pub fn register(&self) -> u64 {
        u64::from(self.mqes)
            | 1 << 16
            | u64::from(self.timeout) << 24
            | 1 << 37
            | u64::from(self.mpsmin & 0xF) << 48
            | u64::from(self.mpsmin & 0xF) << 52
    }
}

/// The property registers of one controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Properties {
    cap: Capabilities,
    cc: u32,
    csts: u32,
}

impl Properties {
    /// Registers of a disabled controller with these capabilities.
    pub fn new(cap: Capabilities) -> Self {
        Properties {
            cap,
            cc: 0,
            csts: 0,
        }
    }

    /// Whether the controller is enabled and ready (CSTS.RDY).
    pub fn ready(&self) -> bool {
        self.csts & CSTS_RDY != 0
    }

    /// The CC register.
    pub fn cc(&self) -> u32 {
        self.cc
    }

    /// I/O submission queue entry size the host set (CC.IOSQES, log2).
    pub fn iosqes(&self) -> u8 {
        ((self.cc >> 16) & 0xF) as u8
    }

    /// I/O completion queue entry size the host set (CC.IOCQES, log2).
    pub fn iocqes(&self) -> u8 {
        ((self.cc >> 20) & 0xF) as u8
    }

    /// Property Get: the register at `offset` of `size`; an offset that
    /// names no register of that size is Invalid Field.
    pub fn get(&self, offset: u32, size: PropertySize) -> Result<u64, Status> {
        match (offset, size) {
            (CAP, PropertySize::Eight) => Ok(self.cap.register()),
            (VS, PropertySize::Four) => Ok(u64::from(VERSION_1_4)),
            (CC, PropertySize::Four) => Ok(u64::from(self.cc)),
            (CSTS, PropertySize::Four) => Ok(u64::from(self.csts)),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// Property Set: only CC is writable. Setting EN makes the controller
    /// ready (the entry sizes must be those of NVMe: 2^6 and 2^4, else
    /// CSTS.CFS is set as a controller would); clearing EN resets it;
    /// a shutdown notification completes the shutdown at once.
    pub fn set(&mut self, offset: u32, size: PropertySize, value: u64) -> Result<(), Status> {
        if (offset, size) != (CC, PropertySize::Four) {
            return Err(Status::INVALID_FIELD);
        }
        let value = u32::try_from(value).map_err(|_| Status::INVALID_FIELD)?;
        let was_enabled = self.cc & CC_EN != 0;
        self.cc = value;
        if value & CC_SHN_MASK != 0 {
            self.csts = self.csts & !(3 << 2) | CSTS_SHST_COMPLETE;
        } else {
            self.csts &= !(3 << 2);
        }
        match (was_enabled, value & CC_EN != 0) {
            (false, true) => {
                if self.iosqes() == 6 && self.iocqes() == 4 {
                    self.csts |= CSTS_RDY;
                } else {
                    self.csts |= CSTS_CFS;
                }
            }
            (true, false) => self.csts &= !(CSTS_RDY | CSTS_CFS),
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props() -> Properties {
        Properties::new(Capabilities {
            mqes: 127,
            timeout: 30,
            mpsmin: 0,
        })
    }

    #[test]
    fn cap_and_vs() {
        let p = props();
        let cap = p.get(CAP, PropertySize::Eight).unwrap();
        assert_eq!(cap & 0xFFFF, 127);
        assert_eq!(cap >> 16 & 1, 1, "CQR");
        assert_eq!(cap >> 24 & 0xFF, 30, "TO");
        assert_eq!(cap >> 37 & 0xFF, 1, "CSS: NVM command set");
        assert_eq!(p.get(VS, PropertySize::Four), Ok(0x0001_0400));
        assert_eq!(p.get(CAP, PropertySize::Four), Err(Status::INVALID_FIELD));
        assert_eq!(p.get(0x0C, PropertySize::Four), Err(Status::INVALID_FIELD));
    }

    #[test]
    fn enable_then_shutdown_then_disable() {
        let mut p = props();
        assert!(!p.ready());
        let cc = CC_EN | 6 << 16 | 4 << 20;
        p.set(CC, PropertySize::Four, u64::from(cc)).unwrap();
        assert!(p.ready());
        assert_eq!(p.get(CSTS, PropertySize::Four), Ok(1));
        assert_eq!((p.iosqes(), p.iocqes()), (6, 4));
        p.set(CC, PropertySize::Four, u64::from(cc | 1 << 14))
            .unwrap();
        assert_eq!(
            p.get(CSTS, PropertySize::Four).unwrap() >> 2 & 3,
            2,
            "SHST complete"
        );
        p.set(CC, PropertySize::Four, 0).unwrap();
        assert_eq!(p.get(CSTS, PropertySize::Four), Ok(0));
    }

    #[test]
    fn bad_entry_sizes_and_read_only_registers() {
        let mut p = props();
        p.set(CC, PropertySize::Four, u64::from(CC_EN)).unwrap();
        assert!(!p.ready());
        assert_eq!(p.get(CSTS, PropertySize::Four), Ok(u64::from(CSTS_CFS)));
        assert_eq!(
            p.set(CSTS, PropertySize::Four, 1),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            p.set(CAP, PropertySize::Eight, 1),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            p.set(CC, PropertySize::Eight, 1),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            p.set(CC, PropertySize::Four, 1 << 32),
            Err(Status::INVALID_FIELD)
        );
    }
}
