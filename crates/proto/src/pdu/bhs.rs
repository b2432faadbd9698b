//! The Basic Header Segment (RFC 7143 §11.2): its raw 48 bytes, common
//! fields, the layout of what follows it, opcodes and LUN encoding.

use crate::digest;

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;
/// The "reserved" tag value 0xffffffff (§11.2.1.7 and others).
pub const RESERVED_TAG: u32 = 0xffff_ffff;
/// Largest data segment the 24-bit DataSegmentLength can express.
pub const MAX_DATA_SEGMENT: u32 = (1 << 24) - 1;

/// Bytes of zero padding after a segment of `len` bytes (§11.1).
#[inline]
pub fn pad_len(len: usize) -> usize {
    (4 - (len % 4)) % 4
}

/// Errors decoding a PDU header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// The opcode is not one RFC 7143 defines for this direction.
    #[error("unknown or unexpected opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// A field holds a value the RFC does not allow.
    #[error("invalid field: {0}")]
    InvalidField(&'static str),
    /// The header digest did not match.
    #[error("header digest mismatch (expected {expected:#010x}, got {got:#010x})")]
    HeaderDigest {
        /// Digest computed over the received header.
        expected: u32,
        /// Digest received.
        got: u32,
    },
    /// The data digest did not match.
    #[error("data digest mismatch (expected {expected:#010x}, got {got:#010x})")]
    DataDigest {
        /// Digest computed over the received data.
        expected: u32,
        /// Digest received.
        got: u32,
    },
}

/// Initiator opcodes (§11.1.1).
pub mod opcode {
    /// NOP-Out
    pub const NOP_OUT: u8 = 0x00;
    /// SCSI Command
    pub const SCSI_COMMAND: u8 = 0x01;
    /// SCSI Task Management Function Request
    pub const TASK_MGMT_REQUEST: u8 = 0x02;
    /// Login Request
    pub const LOGIN_REQUEST: u8 = 0x03;
    /// Text Request
    pub const TEXT_REQUEST: u8 = 0x04;
    /// SCSI Data-Out
    pub const DATA_OUT: u8 = 0x05;
    /// Logout Request
    pub const LOGOUT_REQUEST: u8 = 0x06;
    /// SNACK Request
    pub const SNACK: u8 = 0x10;
    /// NOP-In
    pub const NOP_IN: u8 = 0x20;
    /// SCSI Response
    pub const SCSI_RESPONSE: u8 = 0x21;
    /// SCSI Task Management Function Response
    pub const TASK_MGMT_RESPONSE: u8 = 0x22;
    /// Login Response
    pub const LOGIN_RESPONSE: u8 = 0x23;
    /// Text Response
    pub const TEXT_RESPONSE: u8 = 0x24;
    /// SCSI Data-In
    pub const DATA_IN: u8 = 0x25;
    /// Logout Response
    pub const LOGOUT_RESPONSE: u8 = 0x26;
    /// Ready To Transfer
    pub const R2T: u8 = 0x31;
    /// Asynchronous Message
    pub const ASYNC_MESSAGE: u8 = 0x32;
    /// Reject
    pub const REJECT: u8 = 0x3f;
}

/// Reject reasons (§11.17.1).
pub mod reject_reason {
    /// Data (payload) digest error
    pub const DATA_DIGEST_ERROR: u8 = 0x02;
    /// SNACK Reject
    pub const SNACK_REJECT: u8 = 0x03;
    /// Protocol error (e.g. SNACK for a status already acknowledged)
    pub const PROTOCOL_ERROR: u8 = 0x04;
    /// Command not supported
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x05;
    /// Immediate command reject: too many immediate commands
    pub const IMMEDIATE_COMMAND_REJECT: u8 = 0x06;
    /// Task in progress
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    /// Invalid data ack
    pub const INVALID_DATA_ACK: u8 = 0x08;
    /// Invalid PDU field
    pub const INVALID_PDU_FIELD: u8 = 0x09;
    /// Long operation reject: out of resources
    pub const LONG_OPERATION_REJECT: u8 = 0x0a;
    /// Waiting for Logout
    pub const WAITING_FOR_LOGOUT: u8 = 0x0c;
}

/// The 48-byte Basic Header Segment, raw.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_LEN]);

impl Default for Bhs {
    fn default() -> Self {
        Bhs([0; BHS_LEN])
    }
}

impl std::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Bhs(op={:#04x}, itt={:#x}, dsl={})",
            self.opcode(),
            self.itt(),
            self.data_len()
        )
    }
}

/// What follows a BHS on the wire, computed from the header alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of Additional Header Segments.
    pub ahs_len: usize,
    /// Bytes of header digest (0 or 4).
    pub header_digest_len: usize,
    /// DataSegmentLength: bytes of data, without padding.
    pub data_len: usize,
    /// Bytes of padding after the data.
    pub pad_len: usize,
    /// Bytes of data digest (0 or 4; 0 when there is no data).
    pub data_digest_len: usize,
}

impl Layout {
    /// Bytes after the BHS up to and including the header digest.
    pub fn header_rest(&self) -> usize {
        self.ahs_len + self.header_digest_len
    }
    /// Bytes of the data part: data, padding and data digest.
    pub fn data_part(&self) -> usize {
        self.data_len + self.pad_len + self.data_digest_len
    }
}

pub(super) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl Bhs {
    /// Opcode (6 bits).
    pub fn opcode(&self) -> u8 {
        self.0[0] & 0x3f
    }
    /// Immediate delivery bit.
    pub fn immediate(&self) -> bool {
        self.0[0] & 0x40 != 0
    }
    /// Final bit (byte 1, bit 7).
    pub fn final_bit(&self) -> bool {
        self.0[1] & 0x80 != 0
    }
    /// TotalAHSLength in bytes.
    pub fn ahs_len(&self) -> usize {
        self.0[4] as usize * 4
    }
    /// DataSegmentLength.
    pub fn data_len(&self) -> u32 {
        u32::from_be_bytes([0, self.0[5], self.0[6], self.0[7]])
    }
    /// Set DataSegmentLength (must be below 2^24).
    pub fn set_data_len(&mut self, len: u32) {
        debug_assert!(len <= MAX_DATA_SEGMENT);
        let b = len.to_be_bytes();
        self.0[5..8].copy_from_slice(&b[1..4]);
    }
    /// Initiator Task Tag.
    pub fn itt(&self) -> u32 {
        be32(&self.0[16..20])
    }
    /// Big-endian u32 at byte `at`.
    pub fn u32_at(&self, at: usize) -> u32 {
        be32(&self.0[at..at + 4])
    }
    /// Store a big-endian u32 at byte `at`.
    pub fn put_u32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }
    pub(super) fn u16_at(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.0[at], self.0[at + 1]])
    }
    pub(super) fn put_u16(&mut self, at: usize, v: u16) {
        self.0[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    pub(super) fn u64_at(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[at..at + 8]);
        u64::from_be_bytes(b)
    }
    pub(super) fn put_u64(&mut self, at: usize, v: u64) {
        self.0[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }

    /// The sizes of what follows this header, given the negotiated digests.
    pub fn layout(&self, header_digest: bool, data_digest: bool) -> Layout {
        let data_len = self.data_len() as usize;
        Layout {
            ahs_len: self.ahs_len(),
            header_digest_len: if header_digest { 4 } else { 0 },
            data_len,
            pad_len: pad_len(data_len),
            data_digest_len: if data_digest && data_len > 0 { 4 } else { 0 },
        }
    }

    /// Header digest over this BHS and its AHS.
    pub fn digest(&self, ahs: &[u8]) -> u32 {
        digest::crc32c_parts(&[&self.0, ahs])
    }

    /// Check a received header digest (4 little-endian bytes after BHS+AHS).
    pub fn verify_digest(&self, ahs: &[u8], received: [u8; 4]) -> Result<(), PduError> {
        let expected = self.digest(ahs);
        let got = u32::from_le_bytes(received);
        if expected == got {
            Ok(())
        } else {
            Err(PduError::HeaderDigest { expected, got })
        }
    }
}

/// Check a received data digest over `data` (without padding).
pub fn verify_data_digest(data: &[u8], received: [u8; 4]) -> Result<(), PduError> {
    let expected = digest::data_digest(data);
    let got = u32::from_le_bytes(received);
    if expected == got {
        Ok(())
    } else {
        Err(PduError::DataDigest { expected, got })
    }
}

/// Decode the 8-byte LUN field (SAM-5 §4.7) to a flat LUN number for the
/// peripheral (00b) and flat (01b) addressing methods; other methods keep
/// the raw first two bytes with the method bits, which never matches a LUN.
pub fn lun_from_wire(raw: u64) -> u64 {
    let top = (raw >> 48) as u16;
    match top >> 14 {
        0b00 if top >> 8 == 0 => u64::from(top & 0x00ff),
        0b01 => u64::from(top & 0x3fff),
        _ => 0x1_0000 | u64::from(top),
    }
}

/// Encode a flat LUN number to the 8-byte LUN field: peripheral addressing
/// below 256, flat space addressing above (SAM-5 §4.7).
pub fn lun_to_wire(lun: u64) -> u64 {
    if lun < 256 {
        lun << 48
    } else {
        (0x4000 | (lun & 0x3fff)) << 48
    }
}
