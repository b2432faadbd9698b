//! Errors: malformed input and the server's status codes.

/// An iSNS response status code (RFC 4171 §5.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub u32);

impl Status {
    /// 0: the request succeeded.
    pub const SUCCESSFUL: Status = Status(0);
    /// 2: the server could not parse the message.
    pub const MESSAGE_FORMAT_ERROR: Status = Status(2);
    /// 3: the registration was refused.
    pub const INVALID_REGISTRATION: Status = Status(3);
    /// 6: the source attribute names nothing registered.
    pub const SOURCE_UNKNOWN: Status = Status(6);
    /// 8: the source may not do this.
    pub const SOURCE_UNAUTHORIZED: Status = Status(8);
    /// 9: no such object.
    pub const NO_SUCH_ENTRY: Status = Status(9);
    /// 12: the server is busy; try again later.
    pub const BUSY: Status = Status(12);

    /// Whether this is success.
    pub fn is_success(self) -> bool {
        self.0 == 0
    }

    /// What the code means and, where it helps, what to do about it.
    pub fn describe(self) -> &'static str {
        match self.0 {
            0 => "successful",
            1 => "unknown error (look at the iSNS server's log)",
            2 => "message format error (the server could not parse the request; a protocol mismatch, please report it)",
            3 => "invalid registration (the server refused the objects; look at the iSNS server's log, e.g. for an entity or name registered by another client)",
            5 => "invalid query",
            6 => "source unknown (the requesting node is not registered; it is registered again on the next attempt)",
            7 => "source absent",
            8 => "source unauthorized (the iSNS server's policy does not allow this client; with open-isns, disable Security or enroll the client with isnsadm --enroll)",
            9 => "no such entry (the object is not registered, e.g. already removed or expired)",
            10 => "version not supported",
            11 => "internal error of the iSNS server (look at its log)",
            12 => "busy (the server asks to retry later)",
            13 => "option not understood",
            14 => "invalid update",
            15 => "message not supported by the server",
            16 => "SCN event rejected",
            17 => "SCN registration rejected",
            18 => "attribute not implemented by the server",
            19 => "FC domain ID not available",
            20 => "FC domain ID not allocated",
            21 => "ESI not available",
            22 => "invalid deregistration",
            23 => "registration feature not supported",
            _ => "unknown status code",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "status {} ({})", self.0, self.describe())
    }
}

/// What is wrong with iSNS bytes received, or with a response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsnsError {
    /// Fewer bytes than a PDU header.
    #[error("iSNS PDU truncated: {got} bytes, a header needs 12 (the peer is not an iSNS server, or closed the connection mid-PDU)")]
    TruncatedHeader {
        /// Bytes available.
        got: usize,
    },
    /// The header's version is not 1.
    #[error("iSNS version {0:#06x} not supported (only 0x0001): is the peer an iSNS server (port 3205)?")]
    Version(u16),
    /// The payload is shorter than the header's PDU length.
    #[error("iSNS PDU payload truncated: header says {declared} bytes, {got} present")]
    TruncatedPayload {
        /// The header's PDU length.
        declared: usize,
        /// Bytes present.
        got: usize,
    },
    /// The PDU length is not a multiple of 4.
    #[error("iSNS PDU length {0} is not a multiple of 4 (RFC 4171 §5.1.2)")]
    UnalignedPdu(usize),
    /// An attribute's header or value runs past the payload.
    #[error("iSNS attribute {tag} at offset {offset} runs past the end of the message")]
    AttributeOverrun {
        /// The tag (0 when even the header is cut).
        tag: u32,
        /// Offset of the attribute in the payload.
        offset: usize,
    },
    /// An attribute's length is not a multiple of 4.
    #[error("iSNS attribute {tag} has length {len}, not a multiple of 4 (RFC 4171 §5.5)")]
    UnalignedAttribute {
        /// The tag.
        tag: u32,
        /// Its length.
        len: usize,
    },
    /// A response payload without the 4-byte status code.
    #[error("iSNS response without a status code (payload of {0} bytes)")]
    NoStatus(usize),
    /// A message that is not the response expected.
    #[error("unexpected iSNS message: function {got:#06x}, expected {expected:#06x}")]
    UnexpectedFunction {
        /// Its function ID.
        got: u16,
        /// The response function ID awaited.
        expected: u16,
    },
    /// A response to another transaction.
    #[error("iSNS response to transaction {got}, expected {expected}")]
    TransactionMismatch {
        /// Its transaction ID.
        got: u16,
        /// The one awaited.
        expected: u16,
    },
    /// PDUs of one message out of order (sequence IDs), or a message's
    /// PDUs interleaved with another's.
    #[error(
        "iSNS PDU sequence broken: transaction {transaction_id} PDU {got}, expected {expected}"
    )]
    Sequence {
        /// The transaction.
        transaction_id: u16,
        /// Sequence ID received.
        got: u16,
        /// Sequence ID expected.
        expected: u16,
    },
    /// A message too large to reassemble.
    #[error("iSNS message larger than {0} bytes: refused")]
    TooLarge(usize),
    /// A message too large to send in PDUs (more than 65535 PDUs).
    #[error("iSNS message too large to encode")]
    TooLargeToEncode,
    /// The server answered with an error status.
    #[error("the iSNS server answered {function} with {status}")]
    Rejected {
        /// The request's name.
        function: &'static str,
        /// The status.
        status: Status,
    },
    /// An attribute the response must carry is absent or malformed.
    #[error("iSNS {function} response lacks a valid {what}")]
    MissingAttribute {
        /// The response's name.
        function: &'static str,
        /// What was looked for.
        what: &'static str,
    },
}
