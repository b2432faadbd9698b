//! SCSI command emulation (SAM-5, SPC-4, SBC-3) for ethersan logical units.
//!
//! - [`ScsiTarget`] routes commands by LUN, answers REPORT LUNS and commands
//!   for missing LUNs. Its one entry point, [`ScsiTarget::submit`], runs the
//!   lookup and the unit's checks once per command and answers
//!   [`Submitted::Done`], [`Submitted::Pending`] or [`Submitted::Blocking`].
//! - [`LogicalUnit`] emulates one direct-access block device over a
//!   [`ethersan_backend::BlockDevice`], moving data through an
//!   [`ethersan_volume::Volume`] (range locks, write-cache policy).
//! - [`commands`] is the one table of supported commands; [`sense`] builds
//!   sense data.
//! - Unit attentions are queued per nexus (`unit_attention`), block CDBs
//!   are parsed into one typed form (`cdb`).
//! - [`Nexus`] identifies an I_T nexus (one iSCSI session) for unit
//!   attentions and reservations.
#![warn(missing_docs, unreachable_pub)]

pub mod alua;
mod be;
mod cdb;
pub mod commands;
mod copy;
mod disk;
mod missing_lun;
mod report_luns;
mod reservations;
pub mod sense;
mod target;
mod unit_attention;

pub use ethersan_backend::{BlockDevice, IoBuf};

/// Identifies an I_T nexus: the server gives each session a unique value
/// derived from (initiator name, ISID, target, portal group tag), so a
/// reconnecting session with the same ISID maps to the same nexus.
///
/// When several gateways export one store, persistent reservations pair
/// it with the gateway's relative target port ([`alua::Alua::rel_port`]):
/// the same initiator port through two gateways is two I_T nexuses, and a
/// REGISTER with ALL_TG_PT covers every one of them. Gateways must
/// therefore give the same initiator port the same value (the server
/// hashes the initiator name, ISID and target name, not the portal).
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

/// One command as the transport delivers it, owning its CDB and Data-Out
/// (the data of a WRITE goes to the engine without a copy).
#[derive(Debug, Clone)]
pub struct ScsiCommand {
    /// Which I_T nexus sent it.
    pub nexus: Nexus,
    /// The 8-byte LUN field, already decoded to a flat LUN number.
    pub lun: u64,
    /// The CDB (6..16 bytes; longer with AHS).
    pub cdb: Vec<u8>,
    /// All Data-Out bytes the initiator sent (may be shorter or longer than
    /// the CDB asks for: the expected data transfer length governs). A
    /// transport that receives them into an aligned [`IoBuf`] lets a WRITE
    /// reach an `O_DIRECT` store without a copy.
    pub data_out: IoBuf,
    /// Expected Data Transfer Length from the transport, in bytes.
    pub expected_len: u32,
}

impl ScsiCommand {
    /// The command as a borrowed request.
    pub fn request(&self) -> ScsiRequest<'_> {
        ScsiRequest {
            nexus: self.nexus,
            lun: self.lun,
            cdb: &self.cdb,
            data_out: &self.data_out[..],
            expected_len: self.expected_len,
        }
    }
}

impl From<&ScsiRequest<'_>> for ScsiCommand {
    fn from(r: &ScsiRequest<'_>) -> ScsiCommand {
        ScsiCommand {
            nexus: r.nexus,
            lun: r.lun,
            cdb: r.cdb.to_vec(),
            data_out: r.data_out.into(),
            expected_len: r.expected_len,
        }
    }
}

/// What one initiator may do with one LUN (LUN masking and per-initiator
/// write protection), looked up per command by LUN number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LunAccess {
    /// The LUN exists for this initiator: REPORT LUNS lists it and
    /// commands reach it (else it answers as a LUN that does not exist).
    pub visible: bool,
    /// Write-protected for this initiator: commands that change the medium
    /// get DATA PROTECT / WRITE PROTECTED, EXTENDED COPY cannot use it.
    pub read_only: bool,
}

impl LunAccess {
    /// Visible and writable.
    pub const FULL: LunAccess = LunAccess {
        visible: true,
        read_only: false,
    };

    /// Every LUN visible and writable (no masking).
    pub fn all(_lun: u64) -> LunAccess {
        LunAccess::FULL
    }
}

/// Receives the response of a command that went [`Submitted::Pending`]
/// (called once, on the engine's completion thread: it must be quick).
pub type ScsiCompletion = Box<dyn FnOnce(ScsiResponse) + Send>;

/// Where a READ's data may go before its status (cut-through, see
/// [`Requester::early`]): called with each part of the data in order, and
/// with how many bytes the whole command produces, from the engine's
/// completion thread (it must be quick). The parts handed here are not in
/// the final response, which carries only the rest of the data (its
/// `data_in` is what is left after them) and the status.
#[derive(Clone)]
pub struct DataInSink(pub std::sync::Arc<dyn Fn(IoBuf, usize) + Send + Sync>);

/// The same sink (one allocation), not equal behaviour.
impl PartialEq for DataInSink {
    fn eq(&self, other: &DataInSink) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for DataInSink {}

impl std::fmt::Debug for DataInSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataInSink(..)")
    }
}

/// The blocking remainder of a command: runs it and returns its response.
pub type ScsiJob = Box<dyn FnOnce() -> ScsiResponse + Send>;

/// What [`ScsiTarget::submit`] did with a command.
pub enum Submitted {
    /// Finished: send this response (the completion was dropped uncalled).
    Done(ScsiResponse),
    /// In the engine: the completion gets the response.
    Pending,
    /// Must wait (the sync engine's I/O, or a slow-path command such as
    /// COMPARE AND WRITE, WRITE SAME, UNMAP, EXTENDED COPY, SANITIZE,
    /// PERSISTENT RESERVE, MODE SELECT): run the job where blocking is fine
    /// and send its response (the completion was dropped uncalled). The
    /// command's checks already ran.
    Blocking(ScsiJob),
}

impl std::fmt::Debug for Submitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Submitted::Done(r) => f.debug_tuple("Done").field(r).finish(),
            Submitted::Pending => f.write_str("Pending"),
            Submitted::Blocking(_) => f.write_str("Blocking(..)"),
        }
    }
}

/// One command borrowed: the form the emulation works on.
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
    /// transport truncates to the expected length and computes residuals);
    /// a READ's data where the engine put it ([`IoBuf::into_bytes`] sends
    /// it without a copy).
    pub data_in: IoBuf,
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

/// Configuration of one logical unit. [`LuConfig::default`] is a writable,
/// non-removable unit with write cache on and ethersan's INQUIRY strings,
/// serial "0" and an all-zero designator: set `serial`, `naa` and
/// `target_name` for a real one.
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
    /// NAA designator body (VPD 0x83), stable across restarts (the server
    /// keeps it with the LUN's backing store). First nibble 6: the 16-byte
    /// IEEE Registered Extended form, all 16 bytes. First nibble 5: the
    /// 8-byte IEEE Registered form in the first 8 bytes (the rest is
    /// ignored).
    pub naa: [u8; 16],
    /// Target name, for the SCSI name designator in VPD 0x83.
    pub target_name: String,
    /// Initial write cache state (WCE); MODE SELECT may change it.
    pub write_cache: bool,
    /// Where persistent reservations are kept when an initiator asks for
    /// APTPL (persist through power loss); `None`: they do not persist.
    /// Unused for a store with shared state ([`BlockDevice::shared`]):
    /// the reservations then live in the cluster and survive every
    /// gateway restarting, whatever APTPL says.
    pub pr_state_file: Option<std::path::PathBuf>,
    /// Physical block size reported in READ CAPACITY(16) (logical blocks
    /// per physical block); 0 or the logical size: one block per block.
    pub physical_block_size: u32,
    /// At most this many bytes per second written by SANITIZE (overwrite,
    /// or an erase that writes zeros), so that it leaves bandwidth to the
    /// units sharing the storage; `None`: as fast as the device goes.
    pub sanitize_rate: Option<u64>,
    /// This gateway's target port group, relative target port and initial
    /// ALUA access state (SPC-4 §5.16); see [`alua`].
    pub alua: alua::Alua,
}

impl Default for LuConfig {
    fn default() -> Self {
        LuConfig {
            read_only: false,
            removable: false,
            vendor: "ETHERSAN".into(),
            product: "ethersan disk".into(),
            revision: "0001".into(),
            serial: "0".into(),
            naa: [0; 16],
            target_name: String::new(),
            write_cache: true,
            pr_state_file: None,
            physical_block_size: 0,
            sanitize_rate: None,
            alua: alua::Alua::default(),
        }
    }
}

pub use alua::{Alua, AluaState, TargetPortGroup};
pub use disk::{
    BlockCommand, LogicalUnit, PreemptListener, Refusal, SharedStateError, WriteStream,
    WriteStreamError,
};
pub use target::{LunMap, LunMapError, LunPolicy, LunSlot, Requester, ScsiTarget, MAX_LUN};
