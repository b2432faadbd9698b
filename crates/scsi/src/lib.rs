//! SCSI command emulation (SAM-5, SPC-4, SBC-3) for ethersan logical units.
//!
//! INTERFACE CONTRACT (used by the server; keep these names and signatures):
//! - [`ScsiTarget`] routes commands by LUN, answers REPORT LUNS and commands
//!   for missing LUNs.
//! - [`LogicalUnit`] emulates one direct-access block device over a
//!   [`ethersan_backend::BlockDevice`].
//! - [`Nexus`] identifies an I_T nexus (one iSCSI session) for unit
//!   attentions and reservations.
#![warn(missing_docs, unreachable_pub)]

use std::sync::Arc;

pub use ethersan_backend::BlockDevice;

/// Identifies an I_T nexus: the server gives each session a unique value
/// derived from (initiator name, ISID, target, portal group tag), so a
/// reconnecting session with the same ISID maps to the same nexus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Nexus(pub u64);

/// SCSI status byte values (SAM-5 §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ScsiStatus {
    /// GOOD
    Good = 0x00,
    /// CHECK CONDITION (sense data attached)
    CheckCondition = 0x02,
    /// CONDITION MET
    ConditionMet = 0x04,
    /// BUSY
    Busy = 0x08,
    /// RESERVATION CONFLICT
    ReservationConflict = 0x18,
    /// TASK SET FULL
    TaskSetFull = 0x28,
    /// ACA ACTIVE
    AcaActive = 0x30,
    /// TASK ABORTED
    TaskAborted = 0x40,
}

/// One command as the transport delivers it.
#[derive(Debug)]
pub struct ScsiRequest<'a> {
    /// Which I_T nexus sent it.
    pub nexus: Nexus,
    /// The 8-byte LUN field, already decoded to a flat LUN number.
    pub lun: u64,
    /// The CDB (6..16 bytes; longer with AHS).
    pub cdb: &'a [u8],
    /// All Data-Out bytes the initiator sent (may be shorter or longer than
    /// the CDB asks for: the expected data transfer length governs).
    pub data_out: &'a [u8],
    /// Expected Data Transfer Length from the transport, in bytes.
    pub expected_len: u32,
}

/// The outcome of one command.
#[derive(Debug, Clone)]
pub struct ScsiResponse {
    /// Status byte.
    pub status: ScsiStatus,
    /// Sense data (fixed or descriptor format per D_SENSE), empty if none.
    pub sense: Vec<u8>,
    /// Data-In bytes, exactly as many as the command produces (the
    /// transport truncates to the expected length and computes residuals).
    pub data_in: Vec<u8>,
    /// For commands that take Data-Out: how many bytes the CDB asked for
    /// (SPDTL), so the transport can report residuals against the
    /// expected length. `None` when the command takes no data.
    pub data_out_len: Option<usize>,
}

/// Kinds of reset that task management requests (SAM-5 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetKind {
    /// LOGICAL UNIT RESET
    LogicalUnit,
    /// TARGET WARM RESET
    TargetWarm,
    /// TARGET COLD RESET
    TargetCold,
}

/// Configuration of one logical unit.
#[derive(Debug, Clone)]
pub struct LuConfig {
    /// Write protected (DATA PROTECT on writes, WP bit in mode data).
    pub read_only: bool,
    /// Removable medium (RMB bit, load/eject, PREVENT ALLOW MEDIUM REMOVAL).
    pub removable: bool,
    /// T10 vendor identification (8 chars, space padded).
    pub vendor: String,
    /// Product identification (16 chars).
    pub product: String,
    /// Product revision (4 chars).
    pub revision: String,
    /// Unit serial number (VPD 0x80); stable across restarts.
    pub serial: String,
    /// 16-byte NAA IEEE Registered Extended identifier body (VPD 0x83),
    /// stable across restarts (the server derives it from target name and LUN).
    pub naa: [u8; 16],
    /// Target name, for the SCSI name designator in VPD 0x83.
    pub target_name: String,
    /// Initial write cache state (WCE); MODE SELECT may change it.
    pub write_cache: bool,
}

/// A logical unit: SCSI emulation over a block device.
#[derive(Debug)]
pub struct LogicalUnit {
    _dev: Arc<dyn BlockDevice>,
    _cfg: LuConfig,
}

impl LogicalUnit {
    /// Create a logical unit over `dev`.
    pub fn new(dev: Arc<dyn BlockDevice>, cfg: LuConfig) -> Self {
        LogicalUnit { _dev: dev, _cfg: cfg }
    }
    /// Execute one command (blocking: may perform backend I/O).
    pub fn execute(&self, _req: &ScsiRequest<'_>) -> ScsiResponse {
        unimplemented!("SCSI layer under construction")
    }
}

/// A SCSI target device: routes commands to logical units by LUN.
#[derive(Debug, Default)]
pub struct ScsiTarget {
    luns: Vec<Arc<LogicalUnit>>,
}

impl ScsiTarget {
    /// Create a target whose LUN *i* is `luns[i]`.
    pub fn new(luns: Vec<Arc<LogicalUnit>>) -> Self {
        ScsiTarget { luns }
    }
    /// The logical units, by LUN number.
    pub fn luns(&self) -> &[Arc<LogicalUnit>] {
        &self.luns
    }
    /// Execute one command (blocking). Handles REPORT LUNS, unknown LUNs
    /// (INQUIRY peripheral qualifier 011b, other commands LOGICAL UNIT NOT
    /// SUPPORTED), and hands everything else to the logical unit.
    pub fn execute(&self, _req: &ScsiRequest<'_>) -> ScsiResponse {
        unimplemented!("SCSI layer under construction")
    }
    /// A new I_T nexus appeared (login): it gets a POWER ON OR RESET
    /// unit attention on every LU unless it is a reinstated nexus.
    pub fn nexus_added(&self, _nexus: Nexus) {}
    /// An I_T nexus ended (logout or connection loss): release what it held
    /// that SAM says is released on I_T nexus loss, and queue the UA for it.
    pub fn nexus_lost(&self, _nexus: Nexus) {}
    /// A reset from task management on one LU (`Some(lun)`) or the whole
    /// target (`None`), requested by `by`.
    pub fn reset(&self, _kind: ResetKind, _lun: Option<u64>, _by: Nexus) {}
    /// Tasks of `victim` on `lun` were aborted by another nexus `by`
    /// (ABORT TASK SET / CLEAR TASK SET): queue COMMANDS CLEARED BY ANOTHER
    /// INITIATOR where SAM requires.
    pub fn tasks_cleared(&self, _lun: u64, _victim: Nexus, _by: Nexus) {}
}
