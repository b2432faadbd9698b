//! Typed headers of the PDUs a target sends (RFC 7143 §11.4, §11.6, §11.8,
//! §11.9, §11.11, §11.13, §11.15, §11.17, §11.19).

/// NOP-In (§11.19).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NopIn {
    /// LUN field (raw).
    pub lun: u64,
    /// ITT (echoed, or 0xffffffff for a target ping).
    pub itt: u32,
    /// TTT (0xffffffff unless the target wants an answer).
    pub ttt: u32,
    /// StatSN
    pub stat_sn: u32,
    /// ExpCmdSN
    pub exp_cmd_sn: u32,
    /// MaxCmdSN
    pub max_cmd_sn: u32,
}

/// SCSI Response (§11.4).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScsiResponse {
    /// Bidirectional read residual overflow (o).
    pub bidi_overflow: bool,
    /// Bidirectional read residual underflow (u).
    pub bidi_underflow: bool,
    /// Residual overflow (O).
    pub overflow: bool,
    /// Residual underflow (U).
    pub underflow: bool,
    /// iSCSI service response (0 = command completed at target).
    pub response: u8,
    /// SCSI status.
    pub status: u8,
    /// ITT
    pub itt: u32,
    /// SNACK Tag
    pub snack_tag: u32,
    /// StatSN
    pub stat_sn: u32,
    /// ExpCmdSN
    pub exp_cmd_sn: u32,
    /// MaxCmdSN
    pub max_cmd_sn: u32,
    /// ExpDataSN
    pub exp_data_sn: u32,
    /// Bidirectional read residual count.
    pub bidi_residual: u32,
    /// Residual count.
    pub residual: u32,
}

/// Task Management Function Response (§11.6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskMgmtResponse {
    /// Response code (see [`tmf_response`](super::tmf_response)).
    pub response: u8,
    /// ITT of the request.
    pub itt: u32,
    /// StatSN
    pub stat_sn: u32,
    /// ExpCmdSN
    pub exp_cmd_sn: u32,
    /// MaxCmdSN
    pub max_cmd_sn: u32,
}

/// SCSI Data-In (§11.8).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DataIn {
    /// F bit.
    pub final_bit: bool,
    /// A bit (acknowledge requested).
    pub ack: bool,
    /// O: residual overflow (only with S).
    pub overflow: bool,
    /// U: residual underflow (only with S).
    pub underflow: bool,
    /// S: status is in this PDU.
    pub status_present: bool,
    /// SCSI status (only with S).
    pub status: u8,
    /// LUN field (raw).
    pub lun: u64,
    /// ITT
    pub itt: u32,
    /// TTT
    pub ttt: u32,
    /// StatSN (only with S).
    pub stat_sn: u32,
    /// ExpCmdSN
    pub exp_cmd_sn: u32,
    /// MaxCmdSN
    pub max_cmd_sn: u32,
    /// DataSN
    pub data_sn: u32,
    /// Buffer Offset
    pub buffer_offset: u32,
    /// Residual count (only with S).
    pub residual: u32,
}

/// Logout Response (§11.15).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogoutResponse {
    /// Response (0 closed successfully, 1 CID not found, 2 recovery not supported, 3 cleanup failed).
    pub response: u8,
    /// ITT
    pub itt: u32,
    /// StatSN
    pub stat_sn: u32,
    /// ExpCmdSN
    pub exp_cmd_sn: u32,
    /// MaxCmdSN
    pub max_cmd_sn: u32,
    /// Time2Wait
    pub time2wait: u16,
    /// Time2Retain
    pub time2retain: u16,
}

/// Ready To Transfer (§11.9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct R2t {
    /// LUN field (raw).
    pub lun: u64,
    /// ITT
    pub itt: u32,
    /// Target Transfer Tag.
    pub ttt: u32,
    /// StatSN (next StatSN, not advanced)
    pub stat_sn: u32,
    /// ExpCmdSN
    pub exp_cmd_sn: u32,
    /// MaxCmdSN
    pub max_cmd_sn: u32,
    /// R2TSN
    pub r2t_sn: u32,
    /// Buffer Offset
    pub buffer_offset: u32,
    /// Desired Data Transfer Length
    pub desired_len: u32,
}

/// Asynchronous Message (§11.9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncMessage {
    /// LUN field (raw).
    pub lun: u64,
    /// StatSN
    pub stat_sn: u32,
    /// ExpCmdSN
    pub exp_cmd_sn: u32,
    /// MaxCmdSN
    pub max_cmd_sn: u32,
    /// AsyncEvent
    pub event: u8,
    /// AsyncVCode
    pub vcode: u8,
    /// Parameter1..3
    pub params: [u16; 3],
}

/// Reject (§11.17).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// Reason (see [`reject_reason`](super::reject_reason)).
    pub reason: u8,
    /// StatSN
    pub stat_sn: u32,
    /// ExpCmdSN
    pub exp_cmd_sn: u32,
    /// MaxCmdSN
    pub max_cmd_sn: u32,
    /// DataSN/R2TSN (when rejecting a data PDU)
    pub data_sn: u32,
}
