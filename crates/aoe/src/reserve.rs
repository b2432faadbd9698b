//! AoE r11 §3.4 Reserve/Release: read, set or force-set the list of
//! initiator MACs a device is reserved to. The argument is RCmd, a MAC
//! count and that many 6-byte MACs. Setting an empty list releases the
//! device.

use crate::frame::{need, DecodeError, Mac};

/// Length of the fixed part of the reserve argument.
pub const RESERVE_ARG_LEN: usize = 2;

/// RCmd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ReserveCommand {
    /// Return the reserve list.
    Read = 0,
    /// Replace the list, if it is empty or the sender is on it.
    Set = 1,
    /// Replace the list unconditionally.
    ForceSet = 2,
}

impl ReserveCommand {
    /// The sub-command for an RCmd byte, if defined.
    pub fn from_u8(v: u8) -> Option<ReserveCommand> {
        Some(match v {
            0 => ReserveCommand::Read,
            1 => ReserveCommand::Set,
            2 => ReserveCommand::ForceSet,
            _ => return None,
        })
    }
}

/// The Reserve/Release argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReserveArg<'a> {
    /// RCmd.
    pub command: ReserveCommand,
    /// `n` raw 6-byte MACs (see [`ReserveArg::macs`]).
    pub raw: &'a [u8],
}

impl<'a> ReserveArg<'a> {
    /// Decode the argument (`arg` starts after the AoE header).
    pub fn decode(arg: &'a [u8]) -> Result<ReserveArg<'a>, DecodeError> {
        need(arg, RESERVE_ARG_LEN, "reserve argument")?;
        let command = ReserveCommand::from_u8(arg[0]).ok_or(DecodeError::UnknownSubcommand {
            field: "RCmd",
            value: arg[0],
        })?;
        let len = usize::from(arg[1]) * 6;
        let rest = &arg[RESERVE_ARG_LEN..];
        if rest.len() < len {
            return Err(DecodeError::ShortPayload {
                what: "reserve MACs",
                need: len,
                have: rest.len(),
            });
        }
        Ok(ReserveArg {
            command,
            raw: &rest[..len],
        })
    }

    /// The MACs, in order.
    pub fn macs(&self) -> impl Iterator<Item = Mac> + 'a {
        self.raw.chunks_exact(6).map(Mac::from_slice)
    }

    /// Append the argument with `macs` (at most 255 are written) to `out`.
    pub fn encode(command: ReserveCommand, macs: &[Mac], out: &mut Vec<u8>) {
        let n = macs.len().min(255);
        out.extend_from_slice(&[command as u8, n as u8]);
        for m in &macs[..n] {
            out.extend_from_slice(&m.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let macs = [Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2])];
        let mut out = Vec::new();
        ReserveArg::encode(ReserveCommand::Set, &macs, &mut out);
        assert_eq!(out.len(), 2 + 12);
        out.extend_from_slice(&[0; 30]);
        let a = ReserveArg::decode(&out).unwrap();
        assert_eq!(a.command, ReserveCommand::Set);
        assert_eq!(a.macs().collect::<Vec<_>>(), macs);
    }

    #[test]
    fn malformed() {
        assert!(matches!(
            ReserveArg::decode(&[0]),
            Err(DecodeError::Truncated { .. })
        ));
        assert_eq!(
            ReserveArg::decode(&[3, 0]),
            Err(DecodeError::UnknownSubcommand {
                field: "RCmd",
                value: 3
            })
        );
        assert!(matches!(
            ReserveArg::decode(&[1, 1, 2, 2, 2]),
            Err(DecodeError::ShortPayload { .. })
        ));
    }
}
