//! NVMe/TCP Transport Specification (TP 8000, NVMe-oF 1.1 §7.4): the PDUs
//! of the TCP transport binding and their codec.
//!
//! Every PDU starts with an 8-byte common header (§7.4.5: PDU-Type, FLAGS,
//! HLEN, PDO, PLEN), then its PDU-specific header, an optional header
//! digest (HDGST), padding up to PDO, the data, and an optional data digest
//! (DDGST). [`decode`] takes bytes as they arrive and answers `Ok(None)`
//! until a whole PDU is there; [`decode_head`] needs only the header, so a
//! receiver can place a data PDU's payload straight where it belongs.
//! [`Pdu::encode_head`] writes everything before the data and returns the
//! data digest to send after it, so data goes out without a copy.
//!
//! Errors are [`PduError`]s; [`PduError::fatal_status`] gives the Fatal
//! Error Status and Information of the H2CTermReq/C2HTermReq (§7.4.7) that
//! ends the connection.

mod codec;

pub use codec::{decode, decode_head, Decoded, Head};

use crate::cqe::Cqe;
use crate::sqe::Sqe;

/// Length of the common header.
pub const COMMON_HEADER_LEN: usize = 8;
/// Length of a header or data digest.
pub const DIGEST_LEN: usize = 4;
/// Most data bytes a termination request carries (the erroneous header;
/// PLEN at most 152).
pub const MAX_TERM_DATA: usize = 128;

/// FLAGS bit: a header digest follows the PDU header.
pub const FLAG_HDGSTF: u8 = 1 << 0;
/// FLAGS bit: a data digest follows the data.
pub const FLAG_DDGSTF: u8 = 1 << 1;
/// FLAGS bit of H2CData/C2HData: last data PDU of the transfer (or R2T).
pub const FLAG_LAST_PDU: u8 = 1 << 2;
/// FLAGS bit of C2HData: the command succeeded and no CapsuleResp follows.
pub const FLAG_SUCCESS: u8 = 1 << 3;

/// ICReq/ICResp digest bit: header digests enabled.
pub const DGST_HEADER: u8 = 1 << 0;
/// ICReq/ICResp digest bit: data digests enabled.
pub const DGST_DATA: u8 = 1 << 1;

/// PDU-Type values (§7.4.5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    /// Initialize Connection Request.
    IcReq = 0x00,
    /// Initialize Connection Response.
    IcResp = 0x01,
    /// Host to Controller Terminate Connection Request.
    H2cTermReq = 0x02,
    /// Controller to Host Terminate Connection Request.
    C2hTermReq = 0x03,
    /// Command Capsule.
    CapsuleCmd = 0x04,
    /// Response Capsule.
    CapsuleResp = 0x05,
    /// Host to Controller Data.
    H2cData = 0x06,
    /// Controller to Host Data.
    C2hData = 0x07,
    /// Ready to Transfer.
    R2t = 0x09,
}

impl PduType {
    /// The type for a PDU-Type byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => Self::IcReq,
            0x01 => Self::IcResp,
            0x02 => Self::H2cTermReq,
            0x03 => Self::C2hTermReq,
            0x04 => Self::CapsuleCmd,
            0x05 => Self::CapsuleResp,
            0x06 => Self::H2cData,
            0x07 => Self::C2hData,
            0x09 => Self::R2t,
            _ => return None,
        })
    }

    /// HLEN: the fixed header length of this type.
    pub fn header_len(self) -> usize {
        match self {
            Self::IcReq | Self::IcResp => 128,
            Self::CapsuleCmd => 72,
            _ => 24,
        }
    }

    /// Whether this type may carry a header digest (all but the
    /// connection set-up and termination PDUs).
    pub fn digestible(self) -> bool {
        !matches!(
            self,
            Self::IcReq | Self::IcResp | Self::H2cTermReq | Self::C2hTermReq
        )
    }

    /// Whether PDUs of this type carry data after PDO.
    pub fn has_data(self) -> bool {
        matches!(self, Self::CapsuleCmd | Self::H2cData | Self::C2hData)
    }
}

/// Fatal Error Status of a termination request (§7.4.7, Figure 25).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum FatalErrorStatus {
    /// Invalid PDU Header Field (FEI: byte offset of the field).
    InvalidHeaderField = 0x01,
    /// PDU Sequence Error.
    PduSequenceError = 0x02,
    /// Header Digest Error (FEI: the digest received).
    HeaderDigestError = 0x03,
    /// Data Transfer Out of Range.
    DataOutOfRange = 0x04,
    /// Data Transfer Limit Exceeded (R2T Limit Exceeded).
    DataLimitExceeded = 0x05,
    /// Unsupported parameter (FEI: byte offset of the parameter).
    UnsupportedParameter = 0x06,
}

/// Fatal Error Status and Fatal Error Information for a termination request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FatalStatus {
    /// FES.
    pub fes: FatalErrorStatus,
    /// FEI.
    pub fei: u32,
}

/// A received PDU that breaks the transport rules: each is fatal to the
/// connection and maps to one Fatal Error Status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// A header field holds a value not allowed here.
    #[error("invalid PDU header field at byte {offset}: {what}")]
    InvalidHeaderField {
        /// Byte offset of the field in the PDU.
        offset: u32,
        /// What is wrong.
        what: &'static str,
    },
    /// A PDU arrived that is not allowed at this point.
    #[error("PDU sequence error: {0}")]
    Sequence(&'static str),
    /// The header digest does not match the header.
    #[error("header digest {received:#010x}, computed {computed:#010x}")]
    HeaderDigest {
        /// Digest in the PDU.
        received: u32,
        /// Digest of the header bytes.
        computed: u32,
    },
    /// Data lies outside the range the command or R2T allows.
    #[error("data at offset {offset} length {len} out of range")]
    DataOutOfRange {
        /// Data offset of the PDU.
        offset: u32,
        /// Its data length.
        len: u32,
    },
    /// More data in one PDU than negotiated, or more R2Ts than allowed.
    #[error("data transfer limit exceeded: {len} bytes, limit {limit}")]
    DataLimitExceeded {
        /// Bytes (or R2Ts) seen.
        len: u32,
        /// The limit.
        limit: u32,
    },
    /// A parameter this end does not support (e.g. PFV, HPDA).
    #[error("unsupported parameter at byte {offset}: {what}")]
    UnsupportedParameter {
        /// Byte offset of the parameter.
        offset: u32,
        /// Which parameter.
        what: &'static str,
    },
}

impl PduError {
    /// The FES and FEI to put in the termination request.
    pub fn fatal_status(&self) -> FatalStatus {
        let (fes, fei) = match *self {
            Self::InvalidHeaderField { offset, .. } => {
                (FatalErrorStatus::InvalidHeaderField, offset)
            }
            Self::Sequence(_) => (FatalErrorStatus::PduSequenceError, 0),
            Self::HeaderDigest { received, .. } => (FatalErrorStatus::HeaderDigestError, received),
            Self::DataOutOfRange { .. } => (FatalErrorStatus::DataOutOfRange, 0),
            Self::DataLimitExceeded { .. } => (FatalErrorStatus::DataLimitExceeded, 0),
            Self::UnsupportedParameter { offset, .. } => {
                (FatalErrorStatus::UnsupportedParameter, offset)
            }
        };
        FatalStatus { fes, fei }
    }
}

/// A PDU that could not be encoded as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// Data given for a PDU type that carries none.
    #[error("{0:?} carries no data")]
    NoDataAllowed(PduType),
    /// A data PDU (H2CData, C2HData) without data.
    #[error("{0:?} needs data")]
    DataRequired(PduType),
    /// The data does not fit the PDU (PLEN is 32 bits; a termination
    /// request carries at most 128 bytes).
    #[error("{len} data bytes do not fit a {ty:?}")]
    TooLong {
        /// The PDU type.
        ty: PduType,
        /// Data length asked for.
        len: usize,
    },
}

/// Digests and data alignment agreed by ICReq/ICResp, plus the largest
/// data a received PDU may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Framing {
    /// Header digests on.
    pub header_digest: bool,
    /// Data digests on.
    pub data_digest: bool,
    /// Data alignment the receiver of sent PDUs asked for, 0's based in
    /// dwords (the host's HPDA for C2H PDUs, the controller's CPDA for H2C
    /// ones); ignored when decoding.
    pub pda: u8,
    /// Largest data segment accepted in a received PDU (MAXH2CDATA for
    /// H2CData, in-capsule data size for commands); ignored when encoding.
    pub max_data: u32,
}

impl Framing {
    /// No digests, no alignment, `max_data` bytes per PDU: the framing of
    /// ICReq, ICResp and termination requests.
    pub const fn plain(max_data: u32) -> Self {
        Framing {
            header_digest: false,
            data_digest: false,
            pda: 0,
            max_data,
        }
    }
}

/// Initialize Connection Request (§7.4.6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IcReq {
    /// PDU Format Version (0).
    pub pfv: u16,
    /// Host PDU Data Alignment, 0's based dwords (0..=31).
    pub hpda: u8,
    /// Header digest wanted.
    pub header_digest: bool,
    /// Data digest wanted.
    pub data_digest: bool,
    /// Most outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
}

/// Initialize Connection Response (§7.4.6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IcResp {
    /// PDU Format Version (0).
    pub pfv: u16,
    /// Controller PDU Data Alignment, 0's based dwords.
    pub cpda: u8,
    /// Header digest enabled.
    pub header_digest: bool,
    /// Data digest enabled.
    pub data_digest: bool,
    /// Most data bytes in one H2CData PDU (at least 4096, dword multiple).
    pub maxh2cdata: u32,
}

/// H2CTermReq or C2HTermReq (§7.4.7); the data is the erroneous header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermReq {
    /// Fatal Error Status, raw (a peer may send values we do not know).
    pub fes: u16,
    /// Fatal Error Information.
    pub fei: u32,
}

impl From<FatalStatus> for TermReq {
    fn from(s: FatalStatus) -> Self {
        TermReq {
            fes: s.fes as u16,
            fei: s.fei,
        }
    }
}

/// H2CData (§7.4.8.1): data the host sends for an R2T.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct H2cData {
    /// Command Capsule CID.
    pub cccid: u16,
    /// Transfer tag of the R2T this answers.
    pub ttag: u16,
    /// Data offset from the start of the command's data.
    pub datao: u32,
    /// LAST_PDU: last data PDU for this R2T.
    pub last: bool,
}

/// C2HData (§7.4.8.2): data the controller sends for a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct C2hData {
    /// Command Capsule CID.
    pub cccid: u16,
    /// Data offset from the start of the command's data.
    pub datao: u32,
    /// LAST_PDU: last data PDU of the command.
    pub last: bool,
    /// SUCCESS: the command succeeded and no CapsuleResp will follow.
    pub success: bool,
}

/// Ready to Transfer (§7.4.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct R2t {
    /// Command Capsule CID.
    pub cccid: u16,
    /// Transfer tag the host echoes in its H2CData.
    pub ttag: u16,
    /// Offset of the data asked for.
    pub r2to: u32,
    /// Length of the data asked for.
    pub r2tl: u32,
}

/// One NVMe/TCP PDU, without its data (data travels beside it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pdu {
    /// Initialize Connection Request.
    IcReq(IcReq),
    /// Initialize Connection Response.
    IcResp(IcResp),
    /// Host to Controller Terminate Connection Request.
    H2cTermReq(TermReq),
    /// Controller to Host Terminate Connection Request.
    C2hTermReq(TermReq),
    /// Command Capsule: the SQE; in-capsule data, if any, is the data.
    CapsuleCmd(Sqe),
    /// Response Capsule: the CQE.
    CapsuleResp(Cqe),
    /// Host to Controller Data.
    H2cData(H2cData),
    /// Controller to Host Data.
    C2hData(C2hData),
    /// Ready to Transfer.
    R2t(R2t),
}

impl Pdu {
    /// This PDU's type.
    pub fn pdu_type(&self) -> PduType {
        match self {
            Pdu::IcReq(_) => PduType::IcReq,
            Pdu::IcResp(_) => PduType::IcResp,
            Pdu::H2cTermReq(_) => PduType::H2cTermReq,
            Pdu::C2hTermReq(_) => PduType::C2hTermReq,
            Pdu::CapsuleCmd(_) => PduType::CapsuleCmd,
            Pdu::CapsuleResp(_) => PduType::CapsuleResp,
            Pdu::H2cData(_) => PduType::H2cData,
            Pdu::C2hData(_) => PduType::C2hData,
            Pdu::R2t(_) => PduType::R2t,
        }
    }
}

#[cfg(test)]
mod tests;

/// Moves the encoded PDUs in `queued` to the end of `out`, the one way both
/// sides' `poll_transmit` hand over what they have to send: without a copy
/// when `out` is empty (a write's or a read's data is in the bytes); false
/// if nothing was queued.
pub(crate) fn hand_over(queued: &mut Vec<u8>, out: &mut Vec<u8>) -> bool {
    if queued.is_empty() {
        return false;
    }
    if out.is_empty() {
        std::mem::swap(out, queued);
    } else {
        out.append(queued);
    }
    true
}
