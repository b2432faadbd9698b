//! AoE r11 §3.2 Query Config Information: buffer count, firmware version,
//! the largest sector count one ATA frame may carry, the AoE version and
//! CCmd nibbles, and the device's config string (at most 1024 bytes).
//!
//! Initiators broadcast a read query to discover targets; the config string
//! is a small piece of out-of-band data that initiators may test, set or
//! force-set (the target's handling lives in `target.rs`).

use crate::frame::{need, DecodeError};

/// Length of the fixed part of the config argument.
pub const CONFIG_ARG_LEN: usize = 8;
/// Longest config string §3.2 allows.
pub const MAX_CONFIG_LEN: usize = 1024;

/// CCmd: what a Query Config request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ConfigCommand {
    /// Read the config string; always answered.
    Read = 0,
    /// Answer only if the argument equals the config string exactly.
    Test = 1,
    /// Answer only if the argument is a prefix of the config string.
    TestPrefix = 2,
    /// Set the config string if none is set (error 4 otherwise).
    Set = 3,
    /// Set the config string unconditionally.
    ForceSet = 4,
}

impl ConfigCommand {
    /// The sub-command for a CCmd nibble, if defined.
    pub fn from_u8(v: u8) -> Option<ConfigCommand> {
        Some(match v {
            0 => ConfigCommand::Read,
            1 => ConfigCommand::Test,
            2 => ConfigCommand::TestPrefix,
            3 => ConfigCommand::Set,
            4 => ConfigCommand::ForceSet,
            _ => return None,
        })
    }
}

/// The Query Config Information argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigArg<'a> {
    /// Frames the target can queue; initiators keep at most this many
    /// outstanding. Zero in requests.
    pub buffer_count: u16,
    /// The target's firmware version. Zero in requests.
    pub firmware_version: u16,
    /// Most sectors one ATA command may carry (0 means 2, for old
    /// targets). Zero in requests.
    pub sector_count: u8,
    /// The AoE version the target speaks (high nibble). Zero in requests.
    pub aoe_version: u8,
    /// CCmd (low nibble).
    pub command: ConfigCommand,
    /// The config string (exactly its length field's bytes).
    pub config: &'a [u8],
}

impl<'a> ConfigArg<'a> {
    /// A request with sub-command `command` and string `config`.
    pub fn request(command: ConfigCommand, config: &'a [u8]) -> ConfigArg<'a> {
        ConfigArg {
            buffer_count: 0,
            firmware_version: 0,
            sector_count: 0,
            aoe_version: 0,
            command,
            config,
        }
    }

    /// Decode the argument (`arg` starts after the AoE header).
    pub fn decode(arg: &'a [u8]) -> Result<ConfigArg<'a>, DecodeError> {
        need(arg, CONFIG_ARG_LEN, "config argument")?;
        let command =
            ConfigCommand::from_u8(arg[5] & 0x0F).ok_or(DecodeError::UnknownSubcommand {
                field: "CCmd",
                value: arg[5] & 0x0F,
            })?;
        let len = usize::from(u16::from_be_bytes([arg[6], arg[7]]));
        if len > MAX_CONFIG_LEN {
            return Err(DecodeError::ConfigTooLong(len));
        }
        let rest = &arg[CONFIG_ARG_LEN..];
        if rest.len() < len {
            return Err(DecodeError::ShortPayload {
                what: "config string",
                need: len,
                have: rest.len(),
            });
        }
        Ok(ConfigArg {
            buffer_count: u16::from_be_bytes([arg[0], arg[1]]),
            firmware_version: u16::from_be_bytes([arg[2], arg[3]]),
            sector_count: arg[4],
            aoe_version: arg[5] >> 4,
            command,
            config: &rest[..len],
        })
    }

    /// Append the argument and the string to `out`. A string longer than
    /// 1024 bytes is cut to 1024 so the frame stays well formed.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let s = &self.config[..self.config.len().min(MAX_CONFIG_LEN)];
        out.extend_from_slice(&self.buffer_count.to_be_bytes());
        out.extend_from_slice(&self.firmware_version.to_be_bytes());
        out.push(self.sector_count);
        out.push((self.aoe_version & 0x0F) << 4 | self.command as u8);
        // The cut above keeps the length within u16.
        out.extend_from_slice(&(s.len() as u16).to_be_bytes());
        out.extend_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_padding() {
        let a = ConfigArg {
            buffer_count: 16,
            firmware_version: 0x4019,
            sector_count: 2,
            aoe_version: 1,
            command: ConfigCommand::TestPrefix,
            config: b"host-a",
        };
        let mut out = Vec::new();
        a.encode(&mut out);
        assert_eq!(&out[..8], &[0, 16, 0x40, 0x19, 2, 0x12, 0, 6]);
        out.extend_from_slice(&[0; 20]);
        assert_eq!(ConfigArg::decode(&out).unwrap(), a);
    }

    #[test]
    fn malformed() {
        let mut out = Vec::new();
        ConfigArg::request(ConfigCommand::Read, b"").encode(&mut out);
        out[5] = 0x07;
        assert_eq!(
            ConfigArg::decode(&out),
            Err(DecodeError::UnknownSubcommand {
                field: "CCmd",
                value: 7
            })
        );
        let mut out = Vec::new();
        ConfigArg::request(ConfigCommand::Set, b"abc").encode(&mut out);
        assert!(matches!(
            ConfigArg::decode(&out[..10]),
            Err(DecodeError::ShortPayload {
                need: 3,
                have: 2,
                ..
            })
        ));
        out[6] = 0x04;
        out[7] = 0x01;
        assert_eq!(
            ConfigArg::decode(&out),
            Err(DecodeError::ConfigTooLong(1025))
        );
        assert!(matches!(
            ConfigArg::decode(&[0; 7]),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn overlong_string_cut_on_encode() {
        let long = vec![b'x'; 2000];
        let mut out = Vec::new();
        ConfigArg::request(ConfigCommand::ForceSet, &long).encode(&mut out);
        assert_eq!(
            ConfigArg::decode(&out).unwrap().config.len(),
            MAX_CONFIG_LEN
        );
    }
}
