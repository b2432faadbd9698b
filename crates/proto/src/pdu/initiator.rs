//! Typed headers of the PDUs an initiator sends (RFC 7143 §11.3, §11.5,
//! §11.7, §11.10, §11.12, §11.14, §11.16, §11.18).

/// Task attributes of a SCSI command (§11.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskAttr {
    /// Untagged (treated as SIMPLE)
    Untagged,
    /// SIMPLE
    Simple,
    /// ORDERED
    Ordered,
    /// HEAD OF QUEUE
    HeadOfQueue,
    /// ACA
    Aca,
    /// A reserved value
    Reserved(u8),
}

impl TaskAttr {
    pub(super) fn from_bits(b: u8) -> Self {
        match b & 7 {
            0 => TaskAttr::Untagged,
            1 => TaskAttr::Simple,
            2 => TaskAttr::Ordered,
            3 => TaskAttr::HeadOfQueue,
            4 => TaskAttr::Aca,
            x => TaskAttr::Reserved(x),
        }
    }
    pub(super) fn bits(self) -> u8 {
        match self {
            TaskAttr::Untagged => 0,
            TaskAttr::Simple => 1,
            TaskAttr::Ordered => 2,
            TaskAttr::HeadOfQueue => 3,
            TaskAttr::Aca => 4,
            TaskAttr::Reserved(x) => x & 7,
        }
    }
}

/// NOP-Out (§11.18).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NopOut {
    /// Immediate bit.
    pub immediate: bool,
    /// LUN field (raw).
    pub lun: u64,
    /// Initiator Task Tag (0xffffffff for a reply to a NOP-In ping).
    pub itt: u32,
    /// Target Transfer Tag (echoes a NOP-In's, else 0xffffffff).
    pub ttt: u32,
    /// CmdSN
    pub cmd_sn: u32,
    /// ExpStatSN
    pub exp_stat_sn: u32,
}

/// SCSI Command (§11.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiCommand {
    /// Immediate bit.
    pub immediate: bool,
    /// F: no unsolicited Data-Out PDUs follow.
    pub final_bit: bool,
    /// R: data flows to the initiator.
    pub read: bool,
    /// W: data flows to the target.
    pub write: bool,
    /// Task attribute.
    pub attr: TaskAttr,
    /// LUN field (raw).
    pub lun: u64,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Expected Data Transfer Length.
    pub expected_len: u32,
    /// CmdSN
    pub cmd_sn: u32,
    /// ExpStatSN
    pub exp_stat_sn: u32,
    /// The 16-byte CDB field (longer CDBs continue in an AHS).
    pub cdb: [u8; 16],
}

/// Task management functions (§11.5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmfFunction {
    /// ABORT TASK
    AbortTask,
    /// ABORT TASK SET
    AbortTaskSet,
    /// CLEAR ACA
    ClearAca,
    /// CLEAR TASK SET
    ClearTaskSet,
    /// LOGICAL UNIT RESET
    LogicalUnitReset,
    /// TARGET WARM RESET
    TargetWarmReset,
    /// TARGET COLD RESET
    TargetColdReset,
    /// TASK REASSIGN
    TaskReassign,
    /// Any other value.
    Other(u8),
}

impl TmfFunction {
    /// From the 7-bit function code.
    pub fn from_code(c: u8) -> Self {
        match c {
            1 => TmfFunction::AbortTask,
            2 => TmfFunction::AbortTaskSet,
            3 => TmfFunction::ClearAca,
            4 => TmfFunction::ClearTaskSet,
            5 => TmfFunction::LogicalUnitReset,
            6 => TmfFunction::TargetWarmReset,
            7 => TmfFunction::TargetColdReset,
            8 => TmfFunction::TaskReassign,
            x => TmfFunction::Other(x),
        }
    }
    /// The 7-bit function code.
    pub fn code(self) -> u8 {
        match self {
            TmfFunction::AbortTask => 1,
            TmfFunction::AbortTaskSet => 2,
            TmfFunction::ClearAca => 3,
            TmfFunction::ClearTaskSet => 4,
            TmfFunction::LogicalUnitReset => 5,
            TmfFunction::TargetWarmReset => 6,
            TmfFunction::TargetColdReset => 7,
            TmfFunction::TaskReassign => 8,
            TmfFunction::Other(x) => x & 0x7f,
        }
    }
}

/// Task Management Function Request (§11.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    /// Immediate bit.
    pub immediate: bool,
    /// The function.
    pub function: TmfFunction,
    /// LUN field (raw).
    pub lun: u64,
    /// Initiator Task Tag of this request.
    pub itt: u32,
    /// Referenced Task Tag (ABORT TASK).
    pub referenced_task_tag: u32,
    /// CmdSN
    pub cmd_sn: u32,
    /// ExpStatSN
    pub exp_stat_sn: u32,
    /// RefCmdSN
    pub ref_cmd_sn: u32,
    /// ExpDataSN
    pub exp_data_sn: u32,
}

/// TMF response codes (§11.6.1).
pub mod tmf_response {
    /// Function complete.
    pub const COMPLETE: u8 = 0;
    /// Task does not exist.
    pub const NO_TASK: u8 = 1;
    /// LUN does not exist.
    pub const NO_LUN: u8 = 2;
    /// Task still allegiant.
    pub const STILL_ALLEGIANT: u8 = 3;
    /// Task allegiance reassignment not supported.
    pub const REASSIGN_NOT_SUPPORTED: u8 = 4;
    /// Task management function not supported.
    pub const NOT_SUPPORTED: u8 = 5;
    /// Function authorization failed.
    pub const AUTH_FAILED: u8 = 6;
    /// Function rejected.
    pub const REJECTED: u8 = 255;
}

/// Login Request (§11.12).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginRequest {
    /// T: transit to the next stage.
    pub transit: bool,
    /// C: the text continues in the next PDU.
    pub continue_bit: bool,
    /// Current stage (0 security, 1 operational).
    pub csg: u8,
    /// Next stage (1 operational, 3 full feature).
    pub nsg: u8,
    /// Version-max
    pub version_max: u8,
    /// Version-min
    pub version_min: u8,
    /// ISID (6 bytes).
    pub isid: [u8; 6],
    /// TSIH (0 for a new session).
    pub tsih: u16,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Connection ID.
    pub cid: u16,
    /// CmdSN
    pub cmd_sn: u32,
    /// ExpStatSN
    pub exp_stat_sn: u32,
}

/// Login Response (§11.13).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoginResponse {
    /// T bit.
    pub transit: bool,
    /// C bit.
    pub continue_bit: bool,
    /// Current stage.
    pub csg: u8,
    /// Next stage.
    pub nsg: u8,
    /// Version-max
    pub version_max: u8,
    /// Version-active
    pub version_active: u8,
    /// ISID echoed.
    pub isid: [u8; 6],
    /// TSIH assigned by the target.
    pub tsih: u16,
    /// ITT echoed.
    pub itt: u32,
    /// StatSN
    pub stat_sn: u32,
    /// ExpCmdSN
    pub exp_cmd_sn: u32,
    /// MaxCmdSN
    pub max_cmd_sn: u32,
    /// Status-Class (§11.13.5).
    pub status_class: u8,
    /// Status-Detail.
    pub status_detail: u8,
}

/// Text Request (§11.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextRequest {
    /// Immediate bit.
    pub immediate: bool,
    /// F bit.
    pub final_bit: bool,
    /// C bit.
    pub continue_bit: bool,
    /// LUN field (raw).
    pub lun: u64,
    /// ITT
    pub itt: u32,
    /// Target Transfer Tag (0xffffffff for a new request).
    pub ttt: u32,
    /// CmdSN
    pub cmd_sn: u32,
    /// ExpStatSN
    pub exp_stat_sn: u32,
}

/// Text Response (§11.11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextResponse {
    /// F bit.
    pub final_bit: bool,
    /// C bit.
    pub continue_bit: bool,
    /// LUN field (raw).
    pub lun: u64,
    /// ITT
    pub itt: u32,
    /// Target Transfer Tag.
    pub ttt: u32,
    /// StatSN
    pub stat_sn: u32,
    /// ExpCmdSN
    pub exp_cmd_sn: u32,
    /// MaxCmdSN
    pub max_cmd_sn: u32,
}

/// SCSI Data-Out (§11.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataOut {
    /// F bit: last PDU of the sequence.
    pub final_bit: bool,
    /// LUN field (raw).
    pub lun: u64,
    /// ITT
    pub itt: u32,
    /// Target Transfer Tag (from the R2T, 0xffffffff for unsolicited data).
    pub ttt: u32,
    /// ExpStatSN
    pub exp_stat_sn: u32,
    /// DataSN
    pub data_sn: u32,
    /// Buffer Offset
    pub buffer_offset: u32,
}

/// Logout Request (§11.14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogoutRequest {
    /// Immediate bit.
    pub immediate: bool,
    /// Reason code (0 close session, 1 close connection, 2 remove for recovery).
    pub reason: u8,
    /// ITT
    pub itt: u32,
    /// CID to close.
    pub cid: u16,
    /// CmdSN
    pub cmd_sn: u32,
    /// ExpStatSN
    pub exp_stat_sn: u32,
}

/// SNACK Request (§11.16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snack {
    /// SNACK type.
    pub snack_type: u8,
    /// LUN field (raw).
    pub lun: u64,
    /// ITT
    pub itt: u32,
    /// TTT
    pub ttt: u32,
    /// ExpStatSN
    pub exp_stat_sn: u32,
    /// BegRun
    pub beg_run: u32,
    /// RunLength
    pub run_length: u32,
}
