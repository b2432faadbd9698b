//! What a login settles: the negotiated session parameters (RFC 7143 §13)
//! and the errors that end a negotiation (§11.13.5).

use crate::pdu::Framer;

/// Normal or discovery session (§13.21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionType {
    /// A session for SCSI commands to one target.
    #[default]
    Normal,
    /// A session for SendTargets only.
    Discovery,
}

/// Everything a login settles (RFC defaults until negotiated): the one
/// struct for a session's negotiated parameters, produced by both
/// [`TargetNegotiator::finish`](super::TargetNegotiator::finish) and
/// [`InitiatorNegotiator::finish`](super::InitiatorNegotiator::finish) and used
/// by both sides as is.
///
/// The two MaxRecvDataSegmentLength declarations are named from the
/// target's side on both sides: `max_recv_data_segment_length` is what the
/// target declared (what it receives), `max_send_data_segment_length` what
/// the initiator declared. Prefer the direction-named accessors, which read
/// the same on either side: [`max_data_out_segment`](Self::max_data_out_segment)
/// for PDUs from initiator to target, [`max_data_in_segment`](Self::max_data_in_segment)
/// for PDUs from target to initiator, and the framers
/// [`target_framer`](Self::target_framer) / [`initiator_framer`](Self::initiator_framer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    /// Normal or discovery.
    pub session_type: SessionType,
    /// InitiatorName
    pub initiator_name: String,
    /// InitiatorAlias
    pub initiator_alias: Option<String>,
    /// TargetName (normal sessions).
    pub target_name: Option<String>,
    /// CRC32C header digests.
    pub header_digest: bool,
    /// CRC32C data digests.
    pub data_digest: bool,
    /// MaxConnections
    pub max_connections: u32,
    /// InitialR2T
    pub initial_r2t: bool,
    /// ImmediateData
    pub immediate_data: bool,
    /// What the target may receive per PDU (the target's declaration).
    pub max_recv_data_segment_length: u32,
    /// What the initiator may receive per PDU (the initiator's declaration):
    /// the target sends at most this much.
    pub max_send_data_segment_length: u32,
    /// MaxBurstLength
    pub max_burst_length: u32,
    /// FirstBurstLength
    pub first_burst_length: u32,
    /// DefaultTime2Wait
    pub default_time2wait: u32,
    /// DefaultTime2Retain
    pub default_time2retain: u32,
    /// MaxOutstandingR2T
    pub max_outstanding_r2t: u32,
    /// DataPDUInOrder
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder
    pub data_sequence_in_order: bool,
    /// ErrorRecoveryLevel
    pub error_recovery_level: u32,
}

impl Default for SessionParams {
    fn default() -> Self {
        SessionParams {
            session_type: SessionType::Normal,
            initiator_name: String::new(),
            initiator_alias: None,
            target_name: None,
            header_digest: false,
            data_digest: false,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_recv_data_segment_length: 8192,
            max_send_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
        }
    }
}

impl SessionParams {
    /// Whether this is a discovery session.
    pub fn is_discovery(&self) -> bool {
        self.session_type == SessionType::Discovery
    }

    /// Largest data segment of a PDU from initiator to target (SCSI
    /// Command immediate data, Data-Out, Text/Login requests): the
    /// target's MaxRecvDataSegmentLength.
    pub fn max_data_out_segment(&self) -> u32 {
        self.max_recv_data_segment_length
    }

    /// Largest data segment of a PDU from target to initiator (Data-In,
    /// SCSI Response sense, Text responses): the initiator's
    /// MaxRecvDataSegmentLength.
    pub fn max_data_in_segment(&self) -> u32 {
        self.max_send_data_segment_length
    }

    /// The framing rules of the target's receive side: the negotiated
    /// digests and the target's MaxRecvDataSegmentLength.
    pub fn target_framer(&self) -> Framer {
        Framer {
            header_digest: self.header_digest,
            data_digest: self.data_digest,
            max_recv_data_segment_length: self.max_data_out_segment(),
        }
    }

    /// The framing rules of the initiator's receive side: the negotiated
    /// digests and the initiator's MaxRecvDataSegmentLength.
    pub fn initiator_framer(&self) -> Framer {
        Framer {
            header_digest: self.header_digest,
            data_digest: self.data_digest,
            max_recv_data_segment_length: self.max_data_in_segment(),
        }
    }
}

/// Why negotiation failed; each maps to a Login reject status (§11.13.5).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NegotiationError {
    /// A required key is missing (InitiatorName, TargetName, ...).
    #[error("missing parameter {0}")]
    Missing(&'static str),
    /// A key was sent twice.
    #[error("key {0} sent more than once")]
    Duplicate(String),
    /// A key that has no place in this stage or direction.
    #[error("key {0} not allowed here")]
    NotAllowed(String),
    /// A value that breaks the rules beyond a simple Reject.
    #[error("invalid value for {0}")]
    Invalid(String),
    /// Authentication did not succeed.
    #[error("authentication failed")]
    AuthFailed,
    /// The CHAP exchange failed.
    #[error("CHAP: {0}")]
    Chap(crate::chap::ChapError),
    /// The target answered something we cannot accept (initiator side).
    #[error("target answered {key}={value}, which cannot be accepted")]
    BadAnswer {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
}

impl NegotiationError {
    /// The Login Response status class and detail for this error.
    pub fn login_status(&self) -> (u8, u8) {
        match self {
            NegotiationError::Missing(_) => (0x02, 0x07),
            NegotiationError::AuthFailed => (0x02, 0x01),
            // A wrong name or response, or a reflected challenge, is an
            // authentication failure; malformed CHAP keys an initiator error.
            NegotiationError::Chap(
                crate::chap::ChapError::Missing(_) | crate::chap::ChapError::Invalid(_),
            ) => (0x02, 0x00),
            NegotiationError::Chap(_) => (0x02, 0x01),
            _ => (0x02, 0x00),
        }
    }
}
