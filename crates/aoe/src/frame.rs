//! AoE r11 §2: the Ethernet header, the AoE common header, MAC addresses,
//! error codes and the decode error every argument decoder shares (whole
//! frames are decoded into typed messages by [`crate::message`]).
//!
//! A frame on the wire is the 14-byte Ethernet header (destination MAC,
//! source MAC, ethertype 0x88A2), the 10-byte AoE header (version and
//! flags nibbles, error, major/shelf, minor/slot, command, tag) and the
//! command's argument. Everything is big-endian except the ATA LBA and the
//! IDENTIFY data, which follow ATA's little-endian conventions.
//!
//! Frames shorter than the 60-byte Ethernet minimum are padded with zeros on
//! encode ([`pad`]); decoders never trust the frame length to size a payload
//! and accept the padding.

use std::fmt;

/// The registered ethertype of AoE.
pub const ETHERTYPE_AOE: u16 = 0x88A2;
/// The only AoE protocol version there is.
pub const AOE_VERSION: u8 = 1;
/// Length of the Ethernet header (two MACs and the ethertype).
pub const ETH_HEADER_LEN: usize = 14;
/// Length of the Ethernet header plus the AoE common header.
pub const HEADER_LEN: usize = ETH_HEADER_LEN + 10;
/// Shortest Ethernet frame (without the FCS); shorter frames are padded.
pub const MIN_FRAME_LEN: usize = 60;
/// The shelf (major) address that matches every shelf.
pub const BROADCAST_SHELF: u16 = 0xFFFF;
/// The slot (minor) address that matches every slot.
pub const BROADCAST_SLOT: u8 = 0xFF;

/// Response flag in the flags nibble.
const FLAG_RESPONSE: u8 = 0x08;
/// Error flag in the flags nibble.
const FLAG_ERROR: u8 = 0x04;

/// An Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: Mac = Mac([0xFF; 6]);

    /// The group bit is set: broadcast or multicast, never a sender.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }

    /// Read a MAC from the first six bytes of `b` (which must hold six).
    pub(crate) fn from_slice(b: &[u8]) -> Mac {
        let mut m = [0; 6];
        m.copy_from_slice(&b[..6]);
        Mac(m)
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The AoE commands of §3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Command {
    /// §3.1 Issue ATA Command.
    Ata = 0,
    /// §3.2 Query Config Information.
    Config = 1,
    /// §3.3 MAC Mask List.
    MacMask = 2,
    /// §3.4 Reserve/Release.
    Reserve = 3,
}

impl Command {
    /// The command for a wire value, if it is one of the four.
    pub fn from_u8(v: u8) -> Option<Command> {
        Some(match v {
            0 => Command::Ata,
            1 => Command::Config,
            2 => Command::MacMask,
            3 => Command::Reserve,
            _ => return None,
        })
    }
}

/// The AoE error codes of §2.4, sent with the error flag set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[repr(u8)]
pub enum ErrorCode {
    /// The command code is not one the target knows.
    #[error("unrecognized command code")]
    UnrecognizedCommand = 1,
    /// A value in the argument is improper.
    #[error("bad argument parameter")]
    BadArgument = 2,
    /// The device no longer accepts ATA commands.
    #[error("device unavailable")]
    DeviceUnavailable = 3,
    /// A config string is already set (Query Config set).
    #[error("config string present")]
    ConfigStringPresent = 4,
    /// The AoE version is not supported.
    #[error("unsupported version")]
    UnsupportedVersion = 5,
    /// The device is reserved to other initiators.
    #[error("target is reserved")]
    TargetReserved = 6,
}

impl ErrorCode {
    /// The error for a wire value, if it is a defined one.
    pub fn from_u8(v: u8) -> Option<ErrorCode> {
        Some(match v {
            1 => ErrorCode::UnrecognizedCommand,
            2 => ErrorCode::BadArgument,
            3 => ErrorCode::DeviceUnavailable,
            4 => ErrorCode::ConfigStringPresent,
            5 => ErrorCode::UnsupportedVersion,
            6 => ErrorCode::TargetReserved,
            _ => return None,
        })
    }
}

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The frame ends before a fixed-size part does.
    #[error("{what} needs {need} bytes, the frame has {have}")]
    Truncated {
        /// The part being read.
        what: &'static str,
        /// Bytes the frame must have.
        need: usize,
        /// Bytes it has.
        have: usize,
    },
    /// The ethertype is not 0x88A2.
    #[error("ethertype {0:#06x} is not AoE")]
    NotAoe(u16),
    /// The version nibble is not 1.
    #[error("AoE version {0} is not supported")]
    UnsupportedVersion(u8),
    /// The command byte is none of the four commands.
    #[error("unknown AoE command {0}")]
    UnknownCommand(u8),
    /// A sub-command (CCmd, MCmd, RCmd) has an undefined value.
    #[error("unknown {field} {value}")]
    UnknownSubcommand {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u8,
    },
    /// A count in the argument needs more bytes than the frame carries
    /// (a write's sectors, a config string, directives, reserve MACs).
    #[error("{what} needs {need} bytes, the frame carries {have}")]
    ShortPayload {
        /// The counted part.
        what: &'static str,
        /// Bytes the count calls for.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A config string longer than the 1024 bytes §3.2 allows.
    #[error("config string length {0} exceeds 1024")]
    ConfigTooLong(usize),
}

impl DecodeError {
    /// The common header was fine and the fault lies in the argument: a
    /// target answers such a request with [`ErrorCode::BadArgument`].
    pub fn is_argument_error(&self) -> bool {
        match self {
            DecodeError::Truncated { what, .. } => {
                *what != ETH_HEADER_WHAT && *what != AOE_HEADER_WHAT
            }
            DecodeError::UnknownSubcommand { .. }
            | DecodeError::ShortPayload { .. }
            | DecodeError::ConfigTooLong(_) => true,
            DecodeError::NotAoe(_)
            | DecodeError::UnsupportedVersion(_)
            | DecodeError::UnknownCommand(_) => false,
        }
    }
}

/// [`DecodeError::Truncated`]'s name for the Ethernet header.
const ETH_HEADER_WHAT: &str = "Ethernet header";
/// [`DecodeError::Truncated`]'s name for the AoE header.
const AOE_HEADER_WHAT: &str = "AoE header";

/// Check that `b` has at least `need` bytes for `what`.
pub(crate) fn need(b: &[u8], need: usize, what: &'static str) -> Result<(), DecodeError> {
    if b.len() < need {
        return Err(DecodeError::Truncated {
            what,
            need,
            have: b.len(),
        });
    }
    Ok(())
}

/// The Ethernet header and the AoE common header (§2).
///
/// `command` and `error` stay raw bytes so that a target can answer a
/// command it does not know, echoing the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Ethernet destination.
    pub dst: Mac,
    /// Ethernet source.
    pub src: Mac,
    /// Version nibble (1).
    pub version: u8,
    /// R: this is a response.
    pub response: bool,
    /// E: the response carries an AoE error in `error`.
    pub error_flag: bool,
    /// The error code (meaningful when `error_flag` is set).
    pub error: u8,
    /// Major address: the shelf. 0xFFFF matches every shelf.
    pub shelf: u16,
    /// Minor address: the slot. 0xFF matches every slot.
    pub slot: u8,
    /// The command code (§3).
    pub command: u8,
    /// Opaque to the target; echoed in the response.
    pub tag: u32,
}

impl Header {
    /// A request header: version 1, no flags.
    pub fn request(dst: Mac, src: Mac, shelf: u16, slot: u8, command: Command, tag: u32) -> Header {
        Header {
            dst,
            src,
            version: AOE_VERSION,
            response: false,
            error_flag: false,
            error: 0,
            shelf,
            slot,
            command: command as u8,
            tag,
        }
    }

    /// Decode the first [`HEADER_LEN`] bytes. The version is not checked
    /// here (a target answers a foreign version with an error); [`decode`](crate::message::decode)
    /// checks it.
    pub fn decode(frame: &[u8]) -> Result<Header, DecodeError> {
        need(frame, ETH_HEADER_LEN, ETH_HEADER_WHAT)?;
        let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
        if ethertype != ETHERTYPE_AOE {
            return Err(DecodeError::NotAoe(ethertype));
        }
        need(frame, HEADER_LEN, AOE_HEADER_WHAT)?;
        let verfl = frame[14];
        Ok(Header {
            dst: Mac::from_slice(&frame[0..6]),
            src: Mac::from_slice(&frame[6..12]),
            version: verfl >> 4,
            response: verfl & FLAG_RESPONSE != 0,
            error_flag: verfl & FLAG_ERROR != 0,
            error: frame[15],
            shelf: u16::from_be_bytes([frame[16], frame[17]]),
            slot: frame[18],
            command: frame[19],
            tag: u32::from_be_bytes([frame[20], frame[21], frame[22], frame[23]]),
        })
    }

    /// The [`HEADER_LEN`] header bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..6].copy_from_slice(&self.dst.0);
        b[6..12].copy_from_slice(&self.src.0);
        b[12..14].copy_from_slice(&ETHERTYPE_AOE.to_be_bytes());
        let mut verfl = (self.version & 0x0F) << 4;
        if self.response {
            verfl |= FLAG_RESPONSE;
        }
        if self.error_flag {
            verfl |= FLAG_ERROR;
        }
        b[14] = verfl;
        b[15] = self.error;
        b[16..18].copy_from_slice(&self.shelf.to_be_bytes());
        b[18] = self.slot;
        b[19] = self.command;
        b[20..24].copy_from_slice(&self.tag.to_be_bytes());
        b
    }

    /// Append the [`HEADER_LEN`] header bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bytes());
    }

    /// The header of this request's response from `target_mac`: addresses
    /// swapped, the response flag set, the device's own shelf and slot
    /// (the request may have used the broadcast ones) and the tag echoed.
    pub fn response(&self, target_mac: Mac, shelf: u16, slot: u8) -> Header {
        Header {
            dst: self.src,
            src: target_mac,
            version: AOE_VERSION,
            response: true,
            error_flag: false,
            error: 0,
            shelf,
            slot,
            command: self.command,
            tag: self.tag,
        }
    }

    /// The same header, turned into an error response carrying `code`.
    pub fn with_error(mut self, code: ErrorCode) -> Header {
        self.error_flag = true;
        self.error = code as u8;
        self
    }

    /// The shelf or the slot is a wildcard.
    pub fn is_broadcast_address(&self) -> bool {
        self.shelf == BROADCAST_SHELF || self.slot == BROADCAST_SLOT
    }
}

/// Pad `frame` with zeros up to the 60-byte Ethernet minimum.
pub fn pad(frame: &mut Vec<u8>) {
    if frame.len() < MIN_FRAME_LEN {
        frame.resize(MIN_FRAME_LEN, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr() -> Header {
        Header::request(
            Mac([2, 0, 0, 0, 0, 1]),
            Mac([2, 0, 0, 0, 0, 2]),
            7,
            3,
            Command::Config,
            0xDEAD_BEEF,
        )
    }

    #[test]
    fn header_round_trip_and_layout() {
        let mut out = Vec::new();
        hdr().with_error(ErrorCode::TargetReserved).encode(&mut out);
        assert_eq!(out.len(), HEADER_LEN);
        assert_eq!(&out[12..14], &[0x88, 0xA2]);
        assert_eq!(out[14], 0x14, "version 1, error flag");
        assert_eq!(out[15], 6);
        assert_eq!(&out[16..18], &[0, 7]);
        assert_eq!(out[18], 3);
        assert_eq!(out[19], 1);
        assert_eq!(&out[20..24], &[0xDE, 0xAD, 0xBE, 0xEF]);
        let back = Header::decode(&out).unwrap();
        assert_eq!(back, hdr().with_error(ErrorCode::TargetReserved));
    }

    #[test]
    fn response_swaps_addresses_and_sets_flag() {
        let r = hdr().response(Mac([9; 6]), 7, 3);
        assert_eq!(r.dst, hdr().src);
        assert_eq!(r.src, Mac([9; 6]));
        assert!(r.response && !r.error_flag);
        let mut out = Vec::new();
        r.encode(&mut out);
        assert_eq!(out[14], 0x18);
    }

    #[test]
    fn short_and_foreign_frames() {
        assert!(matches!(
            Header::decode(&[0; 10]),
            Err(DecodeError::Truncated { .. })
        ));
        let mut f = Vec::new();
        hdr().encode(&mut f);
        f[12] = 0x08;
        f[13] = 0x00;
        assert_eq!(Header::decode(&f), Err(DecodeError::NotAoe(0x0800)));
        let mut f = Vec::new();
        hdr().encode(&mut f);
        assert!(matches!(
            Header::decode(&f[..20]),
            Err(DecodeError::Truncated {
                what: "AoE header",
                ..
            })
        ));
    }

    #[test]
    fn pad_to_minimum() {
        let mut f = vec![1; 30];
        pad(&mut f);
        assert_eq!(f.len(), MIN_FRAME_LEN);
        assert!(f[30..].iter().all(|&b| b == 0));
        let mut g = vec![1; 100];
        pad(&mut g);
        assert_eq!(g.len(), 100);
    }

    #[test]
    fn mac_display_and_multicast() {
        assert_eq!(
            Mac([0x02, 0xAB, 0, 1, 2, 0xFF]).to_string(),
            "02:ab:00:01:02:ff"
        );
        assert!(Mac::BROADCAST.is_multicast());
        assert!(!Mac([2, 0, 0, 0, 0, 1]).is_multicast());
    }

    #[test]
    fn codes_round_trip() {
        for v in 0..=255u8 {
            if let Some(c) = Command::from_u8(v) {
                assert_eq!(c as u8, v);
            }
            if let Some(e) = ErrorCode::from_u8(v) {
                assert_eq!(e as u8, v);
            }
        }
        assert_eq!(ErrorCode::from_u8(7), None);
    }
}
