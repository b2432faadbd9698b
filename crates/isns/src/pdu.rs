//! The iSNSP PDU (RFC 4171 §5.1): a 12-byte header and a payload of
//! attributes; a message is one or more PDUs with one transaction ID.

use crate::IsnsError;

/// The iSNSP version (§5.1.1).
pub const VERSION: u16 = 1;
/// Bytes in a PDU header.
pub const HEADER_LEN: usize = 12;
/// The largest PDU payload this crate sends (a multiple of 4 that fits
/// the 16-bit PDU length).
pub const MAX_PDU_PAYLOAD: usize = 65532;
/// The largest message [`Assembler`] reassembles.
pub const MAX_MESSAGE: usize = 4 << 20;

/// Header flags (§5.1.4).
pub mod flags {
    /// Sender is the iSNS client.
    pub const CLIENT: u16 = 0x8000;
    /// Sender is the iSNS server.
    pub const SERVER: u16 = 0x4000;
    /// An authentication block is present.
    pub const AUTH: u16 = 0x2000;
    /// Replace the registration (DevAttrReg).
    pub const REPLACE: u16 = 0x1000;
    /// Last PDU of the message.
    pub const LAST_PDU: u16 = 0x0800;
    /// First PDU of the message.
    pub const FIRST_PDU: u16 = 0x0400;
}

/// The response bit of a function ID: a response's function ID is its
/// request's with this bit set.
pub const RESPONSE: u16 = 0x8000;

/// Function IDs (§5.1.3) of requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum FunctionId {
    /// Device Attribute Registration Request.
    DevAttrReg = 0x0001,
    /// Device Attribute Query Request.
    DevAttrQry = 0x0002,
    /// Device Get Next Request.
    DevGetNext = 0x0003,
    /// Deregister Device Request.
    DevDereg = 0x0004,
    /// SCN Register Request.
    ScnReg = 0x0005,
    /// SCN Deregister Request.
    ScnDereg = 0x0006,
    /// SCN Event.
    ScnEvent = 0x0007,
    /// State Change Notification (server to client).
    Scn = 0x0008,
    /// DD Register.
    DdReg = 0x0009,
    /// DD Deregister.
    DdDereg = 0x000A,
    /// DD Set Register.
    DdsReg = 0x000B,
    /// DD Set Deregister.
    DdsDereg = 0x000C,
    /// Entity Status Inquiry (server to client).
    Esi = 0x000D,
    /// Name Service Heartbeat.
    Heartbeat = 0x000E,
}

impl FunctionId {
    /// The request with this function ID, if known.
    pub fn from_u16(v: u16) -> Option<FunctionId> {
        use FunctionId::*;
        Some(match v {
            0x0001 => DevAttrReg,
            0x0002 => DevAttrQry,
            0x0003 => DevGetNext,
            0x0004 => DevDereg,
            0x0005 => ScnReg,
            0x0006 => ScnDereg,
            0x0007 => ScnEvent,
            0x0008 => Scn,
            0x0009 => DdReg,
            0x000A => DdDereg,
            0x000B => DdsReg,
            0x000C => DdsDereg,
            0x000D => Esi,
            0x000E => Heartbeat,
            _ => return None,
        })
    }

    /// Its name in RFC 4171.
    pub fn name(self) -> &'static str {
        use FunctionId::*;
        match self {
            DevAttrReg => "DevAttrReg",
            DevAttrQry => "DevAttrQry",
            DevGetNext => "DevGetNext",
            DevDereg => "DevDereg",
            ScnReg => "SCNReg",
            ScnDereg => "SCNDereg",
            ScnEvent => "SCNEvent",
            Scn => "SCN",
            DdReg => "DDReg",
            DdDereg => "DDDereg",
            DdsReg => "DDSReg",
            DdsDereg => "DDSDereg",
            Esi => "ESI",
            Heartbeat => "Heartbeat",
        }
    }

    /// The function ID of its response.
    pub fn response(self) -> u16 {
        self as u16 | RESPONSE
    }
}

/// A PDU header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Function ID (a request's, or with [`RESPONSE`] a response's).
    pub function: u16,
    /// Payload length in bytes.
    pub length: u16,
    /// [`flags`].
    pub flags: u16,
    /// Transaction ID: the same in a request and its response.
    pub transaction_id: u16,
    /// Sequence ID: the PDU's number within its message, from 0.
    pub sequence_id: u16,
}

impl Header {
    /// Decode a header from the start of `bytes`; returns it and the
    /// payload length to read next. The version must be 1 and the length
    /// a multiple of 4.
    pub fn decode(bytes: &[u8]) -> Result<(Header, usize), IsnsError> {
        let b = bytes
            .get(..HEADER_LEN)
            .ok_or(IsnsError::TruncatedHeader { got: bytes.len() })?;
        let word = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        if word(0) != VERSION {
            return Err(IsnsError::Version(word(0)));
        }
        let h = Header {
            function: word(2),
            length: word(4),
            flags: word(6),
            transaction_id: word(8),
            sequence_id: word(10),
        };
        let len = usize::from(h.length);
        if !len.is_multiple_of(4) {
            return Err(IsnsError::UnalignedPdu(len));
        }
        Ok((h, len))
    }

    /// The 12 header bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&VERSION.to_be_bytes());
        b[2..4].copy_from_slice(&self.function.to_be_bytes());
        b[4..6].copy_from_slice(&self.length.to_be_bytes());
        b[6..8].copy_from_slice(&self.flags.to_be_bytes());
        b[8..10].copy_from_slice(&self.transaction_id.to_be_bytes());
        b[10..12].copy_from_slice(&self.sequence_id.to_be_bytes());
        b
    }
}

/// One received PDU: header and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pdu {
    /// The header.
    pub header: Header,
    /// The payload (`header.length` bytes).
    pub payload: Vec<u8>,
}

impl Pdu {
    /// Decode one whole PDU from the start of `bytes`; returns it and the
    /// bytes it took.
    pub fn decode(bytes: &[u8]) -> Result<(Pdu, usize), IsnsError> {
        let (header, len) = Header::decode(bytes)?;
        let payload =
            bytes
                .get(HEADER_LEN..HEADER_LEN + len)
                .ok_or(IsnsError::TruncatedPayload {
                    declared: len,
                    got: bytes.len().saturating_sub(HEADER_LEN),
                })?;
        Ok((
            Pdu {
                header,
                payload: payload.to_vec(),
            },
            HEADER_LEN + len,
        ))
    }
}

/// Encode a message payload as PDUs of at most [`MAX_PDU_PAYLOAD`] bytes,
/// with the first/last flags and sequence IDs set; `flags` adds e.g.
/// [`flags::CLIENT`] and [`flags::REPLACE`]. `payload` must be a multiple
/// of 4 bytes long (attributes always are).
pub fn encode_message(
    function: u16,
    msg_flags: u16,
    transaction_id: u16,
    payload: &[u8],
) -> Result<Vec<u8>, IsnsError> {
    let mut chunks: Vec<&[u8]> = payload.chunks(MAX_PDU_PAYLOAD).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    if chunks.len() > usize::from(u16::MAX) {
        return Err(IsnsError::TooLargeToEncode);
    }
    let n = chunks.len();
    let mut out = Vec::with_capacity(payload.len() + n * HEADER_LEN);
    for (i, c) in chunks.into_iter().enumerate() {
        let mut f = msg_flags & !(flags::FIRST_PDU | flags::LAST_PDU);
        if i == 0 {
            f |= flags::FIRST_PDU;
        }
        if i + 1 == n {
            f |= flags::LAST_PDU;
        }
        let h = Header {
            function,
            length: c.len() as u16,
            flags: f,
            transaction_id,
            sequence_id: i as u16,
        };
        out.extend_from_slice(&h.encode());
        out.extend_from_slice(c);
    }
    Ok(out)
}

/// A whole message: the first PDU's header (function, flags, transaction)
/// and every PDU's payload joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Function ID.
    pub function: u16,
    /// The first PDU's flags.
    pub flags: u16,
    /// Transaction ID.
    pub transaction_id: u16,
    /// The payload.
    pub payload: Vec<u8>,
}

/// Reassembles PDUs into messages (one message at a time, as a client
/// receives them over TCP).
#[derive(Debug, Default)]
pub struct Assembler {
    partial: Option<(Message, u16)>,
}

impl Assembler {
    /// A new assembler.
    pub fn new() -> Assembler {
        Assembler::default()
    }

    /// Add a PDU; returns the message once its last PDU is in.
    pub fn push(&mut self, pdu: Pdu) -> Result<Option<Message>, IsnsError> {
        let h = pdu.header;
        let (mut msg, next) = match self.partial.take() {
            None => {
                if h.sequence_id != 0 {
                    return Err(IsnsError::Sequence {
                        transaction_id: h.transaction_id,
                        got: h.sequence_id,
                        expected: 0,
                    });
                }
                (
                    Message {
                        function: h.function,
                        flags: h.flags,
                        transaction_id: h.transaction_id,
                        payload: Vec::new(),
                    },
                    0,
                )
            }
            Some((msg, next)) => {
                if h.transaction_id != msg.transaction_id
                    || h.function != msg.function
                    || h.sequence_id != next
                {
                    return Err(IsnsError::Sequence {
                        transaction_id: h.transaction_id,
                        got: h.sequence_id,
                        expected: next,
                    });
                }
                (msg, next)
            }
        };
        if msg.payload.len() + pdu.payload.len() > MAX_MESSAGE {
            return Err(IsnsError::TooLarge(MAX_MESSAGE));
        }
        msg.payload.extend_from_slice(&pdu.payload);
        if h.flags & flags::LAST_PDU != 0 {
            return Ok(Some(msg));
        }
        let Some(next) = next.checked_add(1) else {
            return Err(IsnsError::TooLarge(MAX_MESSAGE));
        };
        self.partial = Some((msg, next));
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = Header {
            function: 0x8001,
            length: 8,
            flags: flags::SERVER | flags::FIRST_PDU | flags::LAST_PDU,
            transaction_id: 0x1234,
            sequence_id: 0,
        };
        let b = h.encode();
        assert_eq!(&b[..2], &[0, 1]);
        assert_eq!(Header::decode(&b).unwrap(), (h, 8));
    }

    #[test]
    fn malformed_headers_are_errors() {
        assert_eq!(
            Header::decode(&[0, 1, 0]),
            Err(IsnsError::TruncatedHeader { got: 3 })
        );
        let mut b = Header {
            function: 1,
            length: 6,
            flags: 0,
            transaction_id: 1,
            sequence_id: 0,
        }
        .encode();
        assert_eq!(Header::decode(&b), Err(IsnsError::UnalignedPdu(6)));
        b[1] = 2;
        assert_eq!(Header::decode(&b), Err(IsnsError::Version(2)));
        let mut b = Header {
            function: 1,
            length: 8,
            flags: 0,
            transaction_id: 1,
            sequence_id: 0,
        }
        .encode()
        .to_vec();
        b.extend_from_slice(&[0; 4]);
        assert_eq!(
            Pdu::decode(&b),
            Err(IsnsError::TruncatedPayload {
                declared: 8,
                got: 4
            })
        );
    }

    #[test]
    fn long_messages_split_and_reassemble() {
        let payload: Vec<u8> = (0..(MAX_PDU_PAYLOAD * 2 + 8))
            .map(|i| (i % 251) as u8)
            .collect();
        let bytes = encode_message(1, flags::CLIENT, 9, &payload).unwrap();
        let mut a = Assembler::new();
        let mut off = 0;
        let mut got = None;
        let mut pdus = 0;
        while off < bytes.len() {
            let (pdu, used) = Pdu::decode(&bytes[off..]).unwrap();
            assert_eq!(pdu.header.sequence_id, pdus);
            assert_eq!(pdu.header.flags & flags::CLIENT, flags::CLIENT);
            pdus += 1;
            off += used;
            if let Some(m) = a.push(pdu).unwrap() {
                got = Some(m);
            }
        }
        assert_eq!(pdus, 3);
        let m = got.unwrap();
        assert_eq!(m.payload, payload);
        assert_eq!(m.transaction_id, 9);
        // An empty message is one PDU.
        let b = encode_message(0x000E, 0, 1, &[]).unwrap();
        assert_eq!(b.len(), HEADER_LEN);
    }

    #[test]
    fn out_of_order_pdus_are_errors() {
        let h = Header {
            function: 0x8001,
            length: 0,
            flags: 0,
            transaction_id: 3,
            sequence_id: 1,
        };
        let mut a = Assembler::new();
        assert!(matches!(
            a.push(Pdu {
                header: h,
                payload: vec![]
            }),
            Err(IsnsError::Sequence { .. })
        ));
        let first = Header {
            sequence_id: 0,
            ..h
        };
        assert_eq!(
            a.push(Pdu {
                header: first,
                payload: vec![]
            }),
            Ok(None)
        );
        let other = Header {
            transaction_id: 4,
            ..h
        };
        assert!(matches!(
            a.push(Pdu {
                header: other,
                payload: vec![]
            }),
            Err(IsnsError::Sequence { .. })
        ));
    }
}
