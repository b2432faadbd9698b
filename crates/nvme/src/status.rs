//! NVMe Base Specification 1.4 §4.6.1.2: the Status Field of a completion
//! queue entry (Status Code Type, Status Code, More, Do Not Retry) and the
//! status codes this target reports.

/// Status Code Type (SCT, bits 11:9 of the status field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum StatusCodeType {
    /// Generic Command Status (0h).
    Generic = 0,
    /// Command Specific Status (1h).
    CommandSpecific = 1,
    /// Media and Data Integrity Errors (2h).
    Media = 2,
    /// Path Related Status (3h).
    Path = 3,
    /// Vendor Specific (7h).
    Vendor = 7,
}

impl StatusCodeType {
    /// The type for a 3-bit SCT value; reserved values are `None`.
    pub fn from_bits(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Generic,
            1 => Self::CommandSpecific,
            2 => Self::Media,
            3 => Self::Path,
            7 => Self::Vendor,
            _ => return None,
        })
    }
}

/// The status of a completed command, without the phase tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    /// Status Code Type.
    pub sct: StatusCodeType,
    /// Status Code, read in the context of `sct`.
    pub sc: u8,
    /// More: extra information is in the Error Information log page.
    pub more: bool,
    /// Do Not Retry: the same command would fail again.
    pub dnr: bool,
}

macro_rules! status_consts {
    ($($(#[$doc:meta])* $name:ident = ($sct:ident, $sc:expr, $dnr:expr);)*) => {
        impl Status {
            $($(#[$doc])* pub const $name: Status = Status {
                sct: StatusCodeType::$sct,
                sc: $sc,
                more: false,
                dnr: $dnr,
            };)*
        }
    };
}

status_consts! {
    /// Successful Completion (generic 00h).
    SUCCESS = (Generic, 0x00, false);
    /// Invalid Command Opcode (generic 01h).
    INVALID_OPCODE = (Generic, 0x01, true);
    /// Invalid Field in Command (generic 02h).
    INVALID_FIELD = (Generic, 0x02, true);
    /// Command ID Conflict (generic 03h).
    COMMAND_ID_CONFLICT = (Generic, 0x03, true);
    /// Data Transfer Error (generic 04h).
    DATA_TRANSFER_ERROR = (Generic, 0x04, false);
    /// Internal Error (generic 06h).
    INTERNAL_ERROR = (Generic, 0x06, false);
    /// Command Abort Requested (generic 07h).
    ABORTED = (Generic, 0x07, false);
    /// Invalid Namespace or Format (generic 0Bh).
    INVALID_NAMESPACE = (Generic, 0x0B, true);
    /// Command Sequence Error (generic 0Ch).
    COMMAND_SEQUENCE_ERROR = (Generic, 0x0C, true);
    /// Data SGL Length Invalid (generic 0Fh).
    SGL_LENGTH_INVALID = (Generic, 0x0F, true);
    /// SGL Descriptor Type Invalid (generic 11h).
    SGL_TYPE_INVALID = (Generic, 0x11, true);
    /// Transient Transport Error (generic 22h): e.g. a data digest error.
    TRANSIENT_TRANSPORT_ERROR = (Generic, 0x22, false);
    /// LBA Out of Range (generic 80h).
    LBA_OUT_OF_RANGE = (Generic, 0x80, true);
    /// Capacity Exceeded (generic 81h).
    CAPACITY_EXCEEDED = (Generic, 0x81, true);
    /// Namespace Not Ready (generic 82h), retry may succeed.
    NAMESPACE_NOT_READY = (Generic, 0x82, false);
    /// Reservation Conflict (generic 83h).
    RESERVATION_CONFLICT = (Generic, 0x83, true);
    /// Invalid Queue Identifier (command specific 01h).
    INVALID_QUEUE_ID = (CommandSpecific, 0x01, true);
    /// Invalid Queue Size (command specific 02h).
    INVALID_QUEUE_SIZE = (CommandSpecific, 0x02, true);
    /// Abort Command Limit Exceeded (command specific 03h).
    ABORT_LIMIT_EXCEEDED = (CommandSpecific, 0x03, true);
    /// Asynchronous Event Request Limit Exceeded (command specific 05h).
    AER_LIMIT_EXCEEDED = (CommandSpecific, 0x05, true);
    /// Invalid Log Page (command specific 09h).
    INVALID_LOG_PAGE = (CommandSpecific, 0x09, true);
    /// Feature Identifier Not Saveable (command specific 0Dh).
    FEATURE_NOT_SAVEABLE = (CommandSpecific, 0x0D, true);
    /// Feature Not Changeable (command specific 0Eh).
    FEATURE_NOT_CHANGEABLE = (CommandSpecific, 0x0E, true);
    /// Connect Incompatible Format (fabrics command specific 80h).
    CONNECT_INCOMPATIBLE_FORMAT = (CommandSpecific, 0x80, true);
    /// Connect Controller Busy (fabrics command specific 81h).
    CONNECT_CONTROLLER_BUSY = (CommandSpecific, 0x81, false);
    /// Connect Invalid Parameters (fabrics command specific 82h).
    CONNECT_INVALID_PARAMETERS = (CommandSpecific, 0x82, true);
    /// Connect Invalid Host (fabrics command specific 84h).
    CONNECT_INVALID_HOST = (CommandSpecific, 0x84, true);
    /// Write Fault (media 80h).
    WRITE_FAULT = (Media, 0x80, false);
    /// Unrecovered Read Error (media 81h).
    UNRECOVERED_READ_ERROR = (Media, 0x81, false);
    /// Compare Failure (media 85h).
    COMPARE_FAILURE = (Media, 0x85, true);
    /// Access Denied (media 86h).
    ACCESS_DENIED = (Media, 0x86, true);
    /// Asymmetric Access Persistent Loss (path 01h).
    ANA_PERSISTENT_LOSS = (Path, 0x01, true);
    /// Asymmetric Access Inaccessible (path 02h).
    ANA_INACCESSIBLE = (Path, 0x02, false);
    /// Asymmetric Access Transition (path 03h).
    ANA_TRANSITION = (Path, 0x03, false);
}

impl Status {
    /// A status of type `sct` and code `sc`, More and DNR clear.
    pub const fn new(sct: StatusCodeType, sc: u8) -> Self {
        Status {
            sct,
            sc,
            more: false,
            dnr: false,
        }
    }

    /// The same status with Do Not Retry set to `dnr`.
    pub const fn with_dnr(self, dnr: bool) -> Self {
        Status { dnr, ..self }
    }

    /// Whether this is Successful Completion.
    pub fn is_success(&self) -> bool {
        self.sct == StatusCodeType::Generic && self.sc == 0
    }

    /// The 16-bit status field of a CQE (DW3 bits 31:16) with phase tag `phase`.
    pub fn to_field(&self, phase: bool) -> u16 {
        u16::from(phase)
            | u16::from(self.sc) << 1
            | (self.sct as u16 & 7) << 9
            | u16::from(self.more) << 14
            | u16::from(self.dnr) << 15
    }

    /// The status and phase tag in a 16-bit status field; a reserved SCT
    /// is `None`. The Command Retry Delay bits are ignored.
    pub fn from_field(field: u16) -> Option<(Self, bool)> {
        let sct = StatusCodeType::from_bits(((field >> 9) & 7) as u8)?;
        let status = Status {
            sct,
            sc: (field >> 1) as u8,
            more: field & 1 << 14 != 0,
            dnr: field & 1 << 15 != 0,
        };
        Some((status, field & 1 != 0))
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SCT {:#x} SC {:#04x}", self.sct as u8, self.sc)?;
        if self.dnr {
            f.write_str(" DNR")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_layout() {
        // SCT 2 (media), SC 0x85, DNR, phase 1.
        let f = Status::COMPARE_FAILURE.to_field(true);
        assert_eq!(f, 1 | 0x85 << 1 | 2 << 9 | 1 << 15);
        assert_eq!(Status::from_field(f), Some((Status::COMPARE_FAILURE, true)));
        assert_eq!(Status::SUCCESS.to_field(false), 0);
        assert!(Status::SUCCESS.is_success());
        assert!(!Status::LBA_OUT_OF_RANGE.is_success());
        // SCT 4 is reserved.
        assert_eq!(Status::from_field(4 << 9), None);
    }

    #[test]
    fn more_bit() {
        let s = Status {
            more: true,
            ..Status::INTERNAL_ERROR
        };
        assert_eq!(s.to_field(false) & 1 << 14, 1 << 14);
        assert_eq!(Status::from_field(s.to_field(false)).map(|x| x.0), Some(s));
    }
}
