//! AoE r11 §3.3 MAC Mask List: read or edit the list of initiator MACs a
//! device answers. The argument is MCmd, MError, a directive count and
//! that many 8-byte directives (reserved byte, DCmd, MAC).
//!
//! An empty list admits everyone; a non-empty one admits only its members
//! (the target drops everything else silently, see `target.rs`).

use crate::frame::{need, DecodeError, Mac};

/// Length of the fixed part of the mask argument.
pub const MASK_ARG_LEN: usize = 4;
/// Length of one directive.
pub const DIRECTIVE_LEN: usize = 8;

/// MCmd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MaskCommand {
    /// Return the list.
    Read = 0,
    /// Apply the directives in order, then return the list.
    Edit = 1,
}

impl MaskCommand {
    /// The sub-command for an MCmd byte, if defined.
    pub fn from_u8(v: u8) -> Option<MaskCommand> {
        match v {
            0 => Some(MaskCommand::Read),
            1 => Some(MaskCommand::Edit),
            _ => None,
        }
    }
}

/// DCmd: what a directive does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DirectiveCommand {
    /// Nothing.
    None = 0,
    /// Add the MAC to the list.
    Add = 1,
    /// Delete the MAC from the list.
    Delete = 2,
}

impl DirectiveCommand {
    /// The directive for a DCmd byte, if defined.
    pub fn from_u8(v: u8) -> Option<DirectiveCommand> {
        Some(match v {
            0 => DirectiveCommand::None,
            1 => DirectiveCommand::Add,
            2 => DirectiveCommand::Delete,
            _ => return None,
        })
    }
}

/// MError: why an edit stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MaskError {
    /// Unspecified error.
    Unspecified = 1,
    /// A directive had an unknown DCmd.
    BadDirective = 2,
    /// The list is full.
    ListFull = 3,
}

/// One directive. `command` stays raw: an unknown DCmd is not a malformed
/// frame but an edit error the target reports in MError.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Directive {
    /// DCmd (see [`DirectiveCommand`]).
    pub command: u8,
    /// The MAC it applies to.
    pub mac: Mac,
}

impl Directive {
    /// A directive with a known DCmd.
    pub fn new(command: DirectiveCommand, mac: Mac) -> Directive {
        Directive {
            command: command as u8,
            mac,
        }
    }
}

/// The MAC Mask List argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskArg<'a> {
    /// MCmd.
    pub command: MaskCommand,
    /// MError (0 for none).
    pub error: u8,
    /// Directive count.
    pub count: u8,
    /// `count` raw 8-byte directives (see [`MaskArg::directives`]).
    pub raw: &'a [u8],
}

impl<'a> MaskArg<'a> {
    /// Decode the argument (`arg` starts after the AoE header).
    pub fn decode(arg: &'a [u8]) -> Result<MaskArg<'a>, DecodeError> {
        need(arg, MASK_ARG_LEN, "MAC mask argument")?;
        let command = MaskCommand::from_u8(arg[1]).ok_or(DecodeError::UnknownSubcommand {
            field: "MCmd",
            value: arg[1],
        })?;
        let count = arg[3];
        let len = usize::from(count) * DIRECTIVE_LEN;
        let rest = &arg[MASK_ARG_LEN..];
        if rest.len() < len {
            return Err(DecodeError::ShortPayload {
                what: "mask directives",
                need: len,
                have: rest.len(),
            });
        }
        Ok(MaskArg {
            command,
            error: arg[2],
            count,
            raw: &rest[..len],
        })
    }

    /// The directives, in order.
    pub fn directives(&self) -> impl Iterator<Item = Directive> + 'a {
        self.raw.chunks_exact(DIRECTIVE_LEN).map(|d| Directive {
            command: d[1],
            mac: Mac::from_slice(&d[2..8]),
        })
    }

    /// Append the fixed part and `directives` (at most 255 are written) to
    /// `out`.
    pub fn encode(command: MaskCommand, error: u8, directives: &[Directive], out: &mut Vec<u8>) {
        let n = directives.len().min(255);
        out.extend_from_slice(&[0, command as u8, error, n as u8]);
        for d in &directives[..n] {
            out.extend_from_slice(&[0, d.command]);
            out.extend_from_slice(&d.mac.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let dirs = [
            Directive::new(DirectiveCommand::Add, Mac([2, 0, 0, 0, 0, 1])),
            Directive {
                command: 9,
                mac: Mac([2; 6]),
            },
        ];
        let mut out = Vec::new();
        MaskArg::encode(MaskCommand::Edit, 0, &dirs, &mut out);
        assert_eq!(out.len(), 4 + 16);
        out.extend_from_slice(&[0; 10]);
        let a = MaskArg::decode(&out).unwrap();
        assert_eq!(a.command, MaskCommand::Edit);
        assert_eq!(a.count, 2);
        assert_eq!(a.directives().collect::<Vec<_>>(), dirs);
    }

    #[test]
    fn malformed() {
        assert!(matches!(
            MaskArg::decode(&[0, 0, 0]),
            Err(DecodeError::Truncated { .. })
        ));
        assert_eq!(
            MaskArg::decode(&[0, 2, 0, 0]),
            Err(DecodeError::UnknownSubcommand {
                field: "MCmd",
                value: 2
            })
        );
        assert!(matches!(
            MaskArg::decode(&[0, 1, 0, 2, 0, 1, 1, 1, 1, 1, 1, 1]),
            Err(DecodeError::ShortPayload { .. })
        ));
    }
}
