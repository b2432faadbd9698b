//! ethersan's native transport, sans I/O.
//!
//! The iSCSI session layer carried over a reliable, ordered, authenticated
//! (by default encrypted) channel of datagrams: raw Ethernet frames or UDP.
//! This crate does no I/O: an endpoint (the `ethersan-endpoint` crate, or a
//! test) feeds it received frames and the time, and takes back frames to
//! send, messages received and the next timer deadline, in the manner of
//! `quinn-proto`. The wire format is specified in
//! `docs/native-transport.md`.
//!
//! - [`frame`]: the frame codec (common prefix, channel frame header).
//! - [`channel`]: one channel's state machine: messages fragmented into
//!   frames and reassembled, acknowledgements with a selective bitmap,
//!   receiver credits, a congestion window, RTO from measured RTT, fast
//!   retransmit.
//! - [`protect`]: what guards each frame: CRC32C, or ChaCha20-Poly1305
//!   (authenticate only, or encrypt) with a replay window and rekeying.
//! - [`aead`]: the per-direction traffic keys and their rekeying.
//! - [`group`]: keys derived from a group's name and secret.
//! - [`handshake`]: the Noise XXpsk0 handshake that opens a channel.
//! - [`discovery`]: group discovery queries and authenticated replies.
#![warn(missing_docs, unreachable_pub)]

pub mod aead;
pub mod channel;
pub mod discovery;
pub mod frame;
pub mod group;
pub mod handshake;
pub mod protect;
pub mod reset;

/// Default EtherType of the native transport on raw Ethernet (IEEE 802
/// local experimental EtherType 1).
pub const ETHERTYPE_NATIVE: u16 = 0x88B5;

/// Default UDP port of the native transport.
pub const DEFAULT_UDP_PORT: u16 = 3262;

/// How a channel guards its frames; a LUN requires a level and a channel
/// below it cannot address the LUN. Ordered: `None < Integrity < Encrypt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Level {
    /// CRC32C only: detects corruption, not forgery.
    None = 0,
    /// Authenticated (ChaCha20-Poly1305 tag), not encrypted.
    Integrity = 1,
    /// Authenticated and encrypted.
    #[default]
    Encrypt = 2,
}

impl Level {
    /// The level's wire value.
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// The level with this wire value.
    pub fn from_u8(v: u8) -> Option<Level> {
        match v {
            0 => Some(Level::None),
            1 => Some(Level::Integrity),
            2 => Some(Level::Encrypt),
            _ => None,
        }
    }

    /// Its name in configuration files and URLs.
    pub fn name(self) -> &'static str {
        match self {
            Level::None => "none",
            Level::Integrity => "integrity",
            Level::Encrypt => "encrypt",
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Level, String> {
        match s {
            "none" => Ok(Level::None),
            "integrity" => Ok(Level::Integrity),
            "encrypt" => Ok(Level::Encrypt),
            _ => Err(format!(
                "{s:?} is not a security level: use none, integrity or encrypt"
            )),
        }
    }
}
