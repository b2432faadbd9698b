//! AoE r11 §2–§3: a whole frame decoded into its header and a typed view of
//! its command's argument.
//!
//! The header and the shared codec pieces are in [`crate::frame`]; each
//! command's argument has its own module ([`crate::issue`],
//! [`crate::config`], [`crate::mask`], [`crate::reserve`]). This module sits
//! above all of them, so none of them imports it back.

use crate::config::ConfigArg;
use crate::frame::{Command, DecodeError, Header, AOE_VERSION, HEADER_LEN};
use crate::issue::AtaArg;
use crate::mask::MaskArg;
use crate::reserve::ReserveArg;

/// A command's argument, borrowed from the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// §3.1 Issue ATA Command.
    Ata(AtaArg<'a>),
    /// §3.2 Query Config Information.
    Config(ConfigArg<'a>),
    /// §3.3 MAC Mask List.
    MacMask(MaskArg<'a>),
    /// §3.4 Reserve/Release.
    Reserve(ReserveArg<'a>),
}

/// A decoded frame: the header and a typed view of its argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Ethernet and AoE headers.
    pub header: Header,
    /// The argument.
    pub message: Message<'a>,
}

/// Decode a whole frame (Ethernet header first). Rejects other ethertypes,
/// versions other than 1 and unknown commands; the argument is decoded as a
/// request or a response according to the response flag (see
/// [`AtaArg::decode`] for how ATA data is sized).
pub fn decode(frame: &[u8]) -> Result<Frame<'_>, DecodeError> {
    let header = Header::decode(frame)?;
    if header.version != AOE_VERSION {
        return Err(DecodeError::UnsupportedVersion(header.version));
    }
    let command =
        Command::from_u8(header.command).ok_or(DecodeError::UnknownCommand(header.command))?;
    let arg = &frame[HEADER_LEN..];
    let message = match command {
        Command::Ata => Message::Ata(AtaArg::decode(arg, header.response)?),
        Command::Config => Message::Config(ConfigArg::decode(arg)?),
        Command::MacMask => Message::MacMask(MaskArg::decode(arg)?),
        Command::Reserve => Message::Reserve(ReserveArg::decode(arg)?),
    };
    Ok(Frame { header, message })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{pad, Mac};

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
    fn version_and_command_checked_by_decode() {
        let mut f = Vec::new();
        let mut h = hdr();
        h.version = 2;
        h.encode(&mut f);
        pad(&mut f);
        assert_eq!(decode(&f), Err(DecodeError::UnsupportedVersion(2)));
        let mut f = Vec::new();
        let mut h = hdr();
        h.command = 0xF0;
        h.encode(&mut f);
        pad(&mut f);
        assert_eq!(decode(&f), Err(DecodeError::UnknownCommand(0xF0)));
    }
}
