//! The checks a command passes before it runs, whichever transport
//! brought it: the CDB against its row of [`COMMANDS`](crate::commands::COMMANDS)
//! (iSCSI and the native transport only: they carry CDBs), a pending unit
//! attention, then the unit's gates — the ALUA access state, reservations
//! (SPC-4 §5.9.1 table 46), SANITIZE in progress (SBC-4 §4.11) and the
//! medium. Every gate reads a column of the command's row ([`Rules`]).
//!
//! [`LogicalUnit::admit`] runs the gates alone for a transport without
//! CDBs or unit attentions (AoE's ATA READ, WRITE and FLUSH CACHE), under
//! the rules of the SCSI command that does the same; a READ/WRITE costs
//! a few atomic loads, and the reservations' lock only while a
//! reservation is held.

use std::sync::atomic::Ordering;

use super::{conflict, LogicalUnit};
use crate::commands::{self, CommandDef, Rules};
use crate::reservations::PrError;
use crate::sense::{codes, Sense};
use crate::{Nexus, ScsiRequest, ScsiResponse};

/// Why a logical unit refuses a command before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// RESERVATION CONFLICT: a reservation another I_T nexus holds
    /// excludes this command.
    #[error("reservation conflict")]
    Conflict,
    /// CHECK CONDITION with this sense: the ALUA state does not serve the
    /// command, a SANITIZE is in progress or failed, or there is no
    /// medium.
    #[error("refused: {0}")]
    Check(Sense),
}

/// A block command of a transport that has no CDBs, by the SCSI command
/// whose row of the command table it follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockCommand {
    /// Read sectors: the rules of READ(16).
    Read,
    /// Write sectors: the rules of WRITE(16).
    Write,
    /// Make written sectors durable: the rules of SYNCHRONIZE CACHE(16).
    Flush,
}

impl BlockCommand {
    /// The row whose rules it follows.
    pub fn row(self) -> &'static CommandDef {
        let opcode = match self {
            BlockCommand::Read => 0x88,
            BlockCommand::Write => 0x8a,
            BlockCommand::Flush => 0x91,
        };
        commands::lookup(&[opcode]).expect("READ(16), WRITE(16) and SYNCHRONIZE CACHE(16) are rows")
    }
}

impl LogicalUnit {
    /// The checks every command with a CDB passes before it runs: known
    /// opcode and service action, no reserved bits, no pending unit
    /// attention (unless its row is exempt), then the gates
    /// ([`admit`](Self::admit)).
    pub(crate) fn precheck(
        &self,
        req: &ScsiRequest<'_>,
    ) -> Result<&'static CommandDef, ScsiResponse> {
        let cdb = req.cdb;
        let Some(def) = commands::lookup(cdb) else {
            // A known opcode with an unknown service action is a bad field.
            if cdb
                .first()
                .is_some_and(|op| commands::has_service_actions(*op))
            {
                return Err(self.check(Sense::invalid_cdb_field(1, Some(4))));
            }
            return Err(self.check(codes::INVALID_OPCODE));
        };
        if cdb.len() < def.cdb_len {
            return Err(self.check(codes::INVALID_FIELD_IN_CDB));
        }
        if let Some((byte, bit)) = commands::reserved_bits(def, cdb) {
            return Err(self.check(Sense::invalid_cdb_field(byte, Some(bit))));
        }
        if !def.rules.ua_exempt {
            if let Some(ua) = self.ua.take(req.nexus) {
                return Err(self.check(ua));
            }
        }
        match self.gates(def, req.nexus) {
            Ok(()) => Ok(def),
            Err(Refusal::Conflict) => Err(conflict()),
            Err(Refusal::Check(s)) => Err(self.check(s)),
        }
    }

    /// Whether `cmd` from `nexus` may run now: the same gates, in the same
    /// order, as a SCSI command with the same rules passes (ALUA state,
    /// reservations, SANITIZE, medium), for transports without CDBs or
    /// unit attentions. A transport whose initiators cannot register (AoE)
    /// gives each of them a nexus no session uses, so a reservation
    /// fences it as it fences any initiator that holds no registration.
    pub fn admit(&self, cmd: BlockCommand, nexus: Nexus) -> Result<(), Refusal> {
        self.gates(cmd.row(), nexus)
    }

    /// The gates, each reading a column of the row.
    fn gates(&self, def: &CommandDef, nexus: Nexus) -> Result<(), Refusal> {
        let Rules {
            access,
            needs_medium,
            during_sanitize,
            ..
        } = def.rules;
        if let Some(s) = self.alua.state().refusal(def) {
            return Err(Refusal::Check(s));
        }
        if self.reserved.load(Ordering::Acquire) {
            if let Err(PrError::Conflict) = self.res().check(nexus, access) {
                return Err(Refusal::Conflict);
            }
        }
        if !during_sanitize && self.sanitize.running.load(Ordering::Acquire) {
            let p = self.sanitize.progress.load(Ordering::Relaxed) as u16;
            return Err(Refusal::Check(codes::SANITIZE_IN_PROGRESS.with_progress(p)));
        }
        if needs_medium && self.ejected.load(Ordering::Relaxed) {
            return Err(Refusal::Check(codes::MEDIUM_NOT_PRESENT));
        }
        if needs_medium && self.sanitize.failed.load(Ordering::Acquire) {
            return Err(Refusal::Check(codes::SANITIZE_FAILED));
        }
        Ok(())
    }
}
