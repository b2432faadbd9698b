//! The frame codec of docs/native-transport.md §Frames: the 8-byte common
//! prefix every frame starts with, and the 40-byte header of the channel
//! frames (DATA, ACK, CLOSE). Integers are big-endian.
//!
//! Decoders never trust a length field to size anything: [`Prefix::parse`]
//! and [`Header::parse`] read fixed offsets after checking the frame holds
//! them, and the payload length is checked against the frame by
//! [`crate::protect::Protector::open`], which also accepts trailing padding
//! (Ethernet pads short frames to 60 bytes).

/// First byte of every frame.
pub const MAGIC: u8 = 0xE5;
/// The protocol version this crate speaks.
/// Version 2: AES-256-GCM beside ChaCha20-Poly1305 (`ring`), placed data
/// frames; version 1 peers are refused ([`FrameError::BadVersion`]).
pub const VERSION: u8 = 3;
/// Length of the common prefix (magic, version, kind, flags, destination).
pub const PREFIX_LEN: usize = 8;
/// Length of a channel frame's header, prefix included.
pub const HEADER_LEN: usize = 40;

/// DATA flag: the last fragment of a message.
pub const FLAG_LAST: u8 = 1;
/// CLOSE flag: this CLOSE answers the peer's CLOSE (and is never answered).
pub const FLAG_CLOSE_REPLY: u8 = 1;
/// DATA flag: a placed frame (docs/native-transport.md §Placed data). Its
/// payload lands in the receiver's buffer registered under a tag, at a
/// byte offset, instead of being a fragment of a message. Bytes 24..28 of
/// the header hold the tag and 28..36 the offset (where other frames carry
/// `ack` and `sack`); bytes 20..22 and 36..40 are zero. A placed frame
/// acknowledges nothing.
pub const FLAG_PLACED: u8 = 2;

/// What a frame is (byte 2 of the prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A fragment of a message.
    Data = 0x01,
    /// Acknowledgement only, no payload.
    Ack = 0x02,
    /// The end of a channel.
    Close = 0x03,
    /// A target's answer to a channel frame for a channel it does not know
    /// (see [`crate::reset`]).
    Reset = 0x04,
    /// Handshake message 1 (initiator to target).
    Hello = 0x10,
    /// Handshake message 2 (target to initiator).
    HelloReply = 0x11,
    /// Handshake message 3 (initiator to target).
    HelloFinish = 0x12,
    /// A group discovery query.
    Discover = 0x20,
    /// A group discovery answer.
    DiscoverReply = 0x21,
}

impl Kind {
    /// The kind with this wire value.
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            0x01 => Kind::Data,
            0x02 => Kind::Ack,
            0x03 => Kind::Close,
            0x04 => Kind::Reset,
            0x10 => Kind::Hello,
            0x11 => Kind::HelloReply,
            0x12 => Kind::HelloFinish,
            0x20 => Kind::Discover,
            0x21 => Kind::DiscoverReply,
            _ => return None,
        })
    }

    /// Its wire value.
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// DATA, ACK and CLOSE: frames of an open channel, with the 40-byte
    /// header and a trailer.
    pub fn is_channel(self) -> bool {
        matches!(self, Kind::Data | Kind::Ack | Kind::Close)
    }
}

/// Why a frame was rejected. Every variant is a reason to drop the frame and
/// count it; none changes a channel's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The frame is shorter than the part being read.
    #[error("frame truncated: needs {need} bytes, has {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// The first byte is not [`MAGIC`].
    #[error("bad magic {0:#04x}")]
    BadMagic(u8),
    /// A protocol version this crate does not speak.
    #[error("peer speaks native transport version {0}, this ethersan speaks {VERSION}: run the same ethersan version on both ends")]
    BadVersion(u8),
    /// A kind byte that names no frame kind.
    #[error("unknown frame kind {0:#04x}")]
    UnknownKind(u8),
    /// A handshake or discovery frame where a channel frame was expected.
    #[error("{0:?} is not a channel frame")]
    NotChannelFrame(Kind),
    /// The payload length field points past the end of the frame.
    #[error("payload length {len} with a {trailer}-byte trailer needs {need} bytes, the frame has {have}")]
    LengthMismatch {
        /// The header's payload length.
        len: u16,
        /// Trailer length at the channel's level.
        trailer: usize,
        /// Bytes the header and the length field ask for.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// An ACK or CLOSE with a payload.
    #[error("{0:?} frame with a payload")]
    UnexpectedPayload(Kind),
    /// The CRC32C trailer does not match (level `none`).
    #[error("CRC32C mismatch")]
    BadCrc,
    /// The Poly1305 tag does not verify (levels `integrity`, `encrypt`).
    #[error("frame failed authentication")]
    Unauthenticated,
    /// The packet number was seen before or is older than the replay window.
    #[error("packet number {pn} replayed or too old")]
    Replayed {
        /// The frame's packet number.
        pn: u64,
    },
    /// The frame is addressed to another channel.
    #[error("frame for channel {got:#010x}, this is {local:#010x}")]
    WrongChannel {
        /// The destination in the frame.
        got: u32,
        /// This channel's id.
        local: u32,
    },
    /// The frame acknowledges data that was never sent.
    #[error("acknowledgement {ack} beyond the next sequence number {next}")]
    AckOutOfRange {
        /// The frame's acknowledgement.
        ack: u32,
        /// Our next unsent sequence number.
        next: u32,
    },
}

/// The common prefix of every frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    /// What the frame is.
    pub kind: Kind,
    /// Kind-specific flags.
    pub flags: u8,
    /// The receiver's channel id (0 for HELLO and DISCOVER).
    pub dst: u32,
}

fn need(buf: &[u8], n: usize) -> Result<(), FrameError> {
    if buf.len() < n {
        return Err(FrameError::Truncated {
            need: n,
            have: buf.len(),
        });
    }
    Ok(())
}

fn be_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut v = [0; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

impl Prefix {
    /// Reads the prefix at the start of `buf` (which may be longer).
    pub fn parse(buf: &[u8]) -> Result<Prefix, FrameError> {
        need(buf, PREFIX_LEN)?;
        if buf[0] != MAGIC {
            return Err(FrameError::BadMagic(buf[0]));
        }
        if buf[1] != VERSION {
            return Err(FrameError::BadVersion(buf[1]));
        }
        let kind = Kind::from_u8(buf[2]).ok_or(FrameError::UnknownKind(buf[2]))?;
        Ok(Prefix {
            kind,
            flags: buf[3],
            dst: be_u32(buf, 4),
        })
    }

    /// Appends the prefix's 8 bytes to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[MAGIC, VERSION, self.kind.to_u8(), self.flags]);
        out.extend_from_slice(&self.dst.to_be_bytes());
    }
}

/// The header of a channel frame (DATA, ACK, CLOSE), prefix included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// DATA, ACK or CLOSE.
    pub kind: Kind,
    /// Kind-specific flags ([`FLAG_LAST`], [`FLAG_CLOSE_REPLY`]).
    pub flags: u8,
    /// The receiver's channel id.
    pub dst: u32,
    /// Packet number: per direction, +1 for every frame, never reused.
    pub pn: u64,
    /// DATA: this fragment's sequence number; others 0.
    pub seq: u32,
    /// DATA: fragment index within the message (modulo 2^16).
    pub frag: u16,
    /// Payload length.
    pub len: u16,
    /// The next sequence number the sender of the frame expects.
    pub ack: u32,
    /// Bit *i* set: sequence number `ack + 1 + i` is held.
    pub sack: u64,
    /// How many sequence numbers from `ack` on the sender of the frame
    /// accepts.
    pub credit: u32,
}

impl Header {
    /// Reads a channel header from the start of `buf` (which may be
    /// longer); rejects handshake and discovery frames.
    pub fn parse(buf: &[u8]) -> Result<Header, FrameError> {
        let prefix = Prefix::parse(buf)?;
        if !prefix.kind.is_channel() {
            return Err(FrameError::NotChannelFrame(prefix.kind));
        }
        need(buf, HEADER_LEN)?;
        Ok(Header {
            kind: prefix.kind,
            flags: prefix.flags,
            dst: prefix.dst,
            pn: be_u64(buf, 8),
            seq: be_u32(buf, 16),
            frag: be_u16(buf, 20),
            len: be_u16(buf, 22),
            ack: be_u32(buf, 24),
            sack: be_u64(buf, 28),
            credit: be_u32(buf, 36),
        })
    }

    /// Appends the header's 40 bytes to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        Prefix {
            kind: self.kind,
            flags: self.flags,
            dst: self.dst,
        }
        .write(out);
        out.extend_from_slice(&self.pn.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.frag.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
        out.extend_from_slice(&self.ack.to_be_bytes());
        out.extend_from_slice(&self.sack.to_be_bytes());
        out.extend_from_slice(&self.credit.to_be_bytes());
    }

    /// Whether a DATA frame carries [`FLAG_LAST`].
    pub fn is_last(&self) -> bool {
        self.flags & FLAG_LAST != 0
    }

    /// Whether this is a placed DATA frame ([`FLAG_PLACED`]).
    pub fn is_placed(&self) -> bool {
        self.kind == Kind::Data && self.flags & FLAG_PLACED != 0
    }

    /// A placed frame's (tag, byte offset): the fields where other frames
    /// carry `ack` and `sack`.
    pub fn placement(&self) -> Option<(u32, u64)> {
        self.is_placed().then_some((self.ack, self.sack))
    }

    /// The header of a placed DATA frame: `tag` and `offset` in the
    /// acknowledgement fields, the rest zero.
    pub fn placed(dst: u32, pn: u64, seq: u32, len: u16, tag: u32, offset: u64) -> Header {
        Header {
            kind: Kind::Data,
            flags: FLAG_PLACED,
            dst,
            pn,
            seq,
            frag: 0,
            len,
            ack: tag,
            sack: offset,
            credit: 0,
        }
    }
}

/// Reads the packet number of a channel frame without checking anything
/// else (`None` when the frame is too short to hold it).
pub(crate) fn peek_pn(buf: &[u8]) -> Option<u64> {
    (buf.len() >= 16).then(|| be_u64(buf, 8))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            kind: Kind::Data,
            flags: FLAG_LAST,
            dst: 0xDEAD_BEEF,
            pn: 0x0102_0304_0506_0708,
            seq: 0xFFFF_FFFE,
            frag: 7,
            len: 1234,
            ack: 42,
            sack: 0x8000_0000_0000_0001,
            credit: 1024,
        }
    }

    #[test]
    fn header_round_trip_and_layout() {
        let h = header();
        let mut out = Vec::new();
        h.write(&mut out);
        assert_eq!(out.len(), HEADER_LEN);
        assert_eq!(&out[..8], &[0xE5, 3, 1, 1, 0xDE, 0xAD, 0xBE, 0xEF]);
        assert_eq!(&out[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&out[16..20], &[0xFF, 0xFF, 0xFF, 0xFE]);
        assert_eq!(&out[20..22], &[0, 7]);
        assert_eq!(&out[22..24], &1234u16.to_be_bytes());
        assert_eq!(&out[24..28], &[0, 0, 0, 42]);
        assert_eq!(&out[28..36], &[0x80, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(&out[36..40], &[0, 0, 4, 0]);
        assert_eq!(Header::parse(&out), Ok(h));
        // Trailing bytes are ignored by the header parser.
        out.extend_from_slice(&[9; 30]);
        assert_eq!(Header::parse(&out), Ok(h));
    }

    #[test]
    fn prefix_round_trip_for_every_kind() {
        for kind in [
            Kind::Data,
            Kind::Ack,
            Kind::Close,
            Kind::Hello,
            Kind::HelloReply,
            Kind::HelloFinish,
            Kind::Discover,
            Kind::DiscoverReply,
        ] {
            let p = Prefix {
                kind,
                flags: 0x5A,
                dst: 77,
            };
            let mut out = Vec::new();
            p.write(&mut out);
            assert_eq!(out.len(), PREFIX_LEN);
            assert_eq!(Prefix::parse(&out), Ok(p));
            assert_eq!(Kind::from_u8(kind.to_u8()), Some(kind));
        }
    }

    #[test]
    fn rejections() {
        let mut out = Vec::new();
        header().write(&mut out);
        for n in 0..PREFIX_LEN {
            assert_eq!(
                Prefix::parse(&out[..n]),
                Err(FrameError::Truncated { need: 8, have: n })
            );
        }
        for n in PREFIX_LEN..HEADER_LEN {
            assert_eq!(
                Header::parse(&out[..n]),
                Err(FrameError::Truncated { need: 40, have: n })
            );
        }
        let mut bad = out.clone();
        bad[0] = 0xE4;
        assert_eq!(Header::parse(&bad), Err(FrameError::BadMagic(0xE4)));
        let mut bad = out.clone();
        bad[1] = 1;
        assert_eq!(Header::parse(&bad), Err(FrameError::BadVersion(1)));
        assert_eq!(
            FrameError::BadVersion(1).to_string(),
            "peer speaks native transport version 1, this ethersan speaks 3: \
             run the same ethersan version on both ends"
        );
        for k in [0u8, 5, 0x0F, 0x13, 0x22, 0xFF] {
            let mut bad = out.clone();
            bad[2] = k;
            assert_eq!(Header::parse(&bad), Err(FrameError::UnknownKind(k)));
        }
        let mut hello = out.clone();
        hello[2] = 0x10;
        assert_eq!(
            Header::parse(&hello),
            Err(FrameError::NotChannelFrame(Kind::Hello))
        );
        assert_eq!(Prefix::parse(&hello).map(|p| p.kind), Ok(Kind::Hello));
    }
}
