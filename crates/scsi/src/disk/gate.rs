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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::{BlockCommand, Refusal};
    use crate::commands::{Access, CommandDef, ServedIn, COMMANDS};
    use crate::disk::testing::*;
    use crate::sense::codes;
    use crate::{AluaState, LogicalUnit, Nexus, ScsiRequest, ScsiStatus, ScsiTarget};

    const KEY: u64 = 0x0a0b_0c0d;
    /// A nexus that never registered (as an AoE initiator is).
    const STRANGER: Nexus = Nexus(0xae);

    fn pr_out(action: u8, kind: u8, key: u64, sakey: u64) -> (Vec<u8>, Vec<u8>) {
        let cdb = vec![0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0];
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sakey.to_be_bytes());
        (cdb, p)
    }

    /// A registers and takes a persistent reservation of `kind`.
    fn reserve(t: &ScsiTarget, kind: u8) {
        let (cdb, p) = pr_out(6, 0, 0, KEY);
        good(exec(t, A, &cdb, &p));
        let (cdb, p) = pr_out(1, kind, KEY, 0);
        good(exec(t, A, &cdb, &p));
    }

    fn unit(t: &ScsiTarget) -> Arc<LogicalUnit> {
        t.lun(0).expect("LUN 0")
    }

    /// A CDB of the row: its opcode and service action, every other
    /// byte zero.
    fn row_cdb(def: &CommandDef) -> Vec<u8> {
        let mut cdb = vec![0u8; def.cdb_len];
        cdb[0] = def.opcode;
        if let Some(sa) = def.service_action {
            cdb[1] = sa;
        }
        cdb
    }

    /// What the checks say before the command would run: `None` it runs,
    /// `Some(None)` RESERVATION CONFLICT, `Some(Some(sense))` CHECK
    /// CONDITION.
    fn verdict(lu: &LogicalUnit, nexus: Nexus, cdb: &[u8]) -> Option<Option<(u8, u8, u8)>> {
        let req = ScsiRequest {
            nexus,
            lun: 0,
            cdb,
            data_out: &[],
            expected_len: 0,
        };
        match lu.precheck(&req) {
            Ok(_) => None,
            Err(r) if r.status == ScsiStatus::ReservationConflict => Some(None),
            Err(r) => Some(sense(&r)),
        }
    }

    /// Every row of the table through every rule: each condition alone,
    /// a CDB of every row from a nexus that holds no registration, and
    /// the command is refused exactly when the row's column says so, with
    /// that column's answer.
    #[test]
    fn every_row_meets_every_rule() {
        // Reservations of every type held by A (SPC-4 table 46).
        for kind in [1u8, 3, 5, 6, 7, 8] {
            let (t, _) = target(512);
            reserve(&t, kind);
            let lu = unit(&t);
            let exclusive_access = matches!(kind, 3 | 6 | 8);
            for def in COMMANDS {
                let conflicts = match def.rules.access {
                    Access::Free => false,
                    Access::Read => exclusive_access,
                    Access::Write => true,
                };
                let got = verdict(&lu, B, &row_cdb(def));
                assert_eq!(
                    got,
                    conflicts.then_some(None),
                    "{} under type {kind}",
                    def.name
                );
                // The holder is never fenced by its own reservation.
                assert_eq!(verdict(&lu, A, &row_cdb(def)), None, "{}", def.name);
            }
        }
        // ALUA states.
        for (state, sense) in [
            (AluaState::Standby, codes::ALUA_STANDBY),
            (AluaState::Unavailable, codes::ALUA_UNAVAILABLE),
        ] {
            let (t, _) = target(512);
            let lu = unit(&t);
            lu.set_alua_state(state).unwrap();
            for def in COMMANDS {
                let served = match def.rules.alua {
                    ServedIn::EveryState => true,
                    ServedIn::Standby => state == AluaState::Standby,
                    ServedIn::ActiveOnly => false,
                };
                while lu.ua.take(B).is_some() {}
                let got = verdict(&lu, B, &row_cdb(def));
                let want = (!served).then_some(Some(sense.triple()));
                assert_eq!(got, want, "{} in {state}", def.name);
            }
        }
        // SANITIZE in progress, SANITIZE failed, no medium.
        let (t, _) = target(512);
        let lu = unit(&t);
        lu.sanitize.running.store(true, Ordering::Release);
        for def in COMMANDS {
            let want =
                (!def.rules.during_sanitize).then_some(Some(codes::SANITIZE_IN_PROGRESS.triple()));
            assert_eq!(verdict(&lu, B, &row_cdb(def)), want, "{}", def.name);
        }
        lu.sanitize.running.store(false, Ordering::Release);
        lu.sanitize.failed.store(true, Ordering::Release);
        for def in COMMANDS {
            let want = def
                .rules
                .needs_medium
                .then_some(Some(codes::SANITIZE_FAILED.triple()));
            assert_eq!(verdict(&lu, B, &row_cdb(def)), want, "{}", def.name);
        }
        lu.sanitize.failed.store(false, Ordering::Release);
        lu.ejected.store(true, Ordering::Relaxed);
        for def in COMMANDS {
            let want = def
                .rules
                .needs_medium
                .then_some(Some(codes::MEDIUM_NOT_PRESENT.triple()));
            assert_eq!(verdict(&lu, B, &row_cdb(def)), want, "{}", def.name);
        }
        lu.ejected.store(false, Ordering::Relaxed);
        // A unit attention pending: reported unless the row is exempt, and
        // then still queued.
        for def in COMMANDS {
            lu.ua.raise(B, codes::COMMANDS_CLEARED);
            let got = verdict(&lu, B, &row_cdb(def));
            if def.rules.ua_exempt {
                assert_eq!(got, None, "{}", def.name);
                assert_eq!(lu.ua.take(B), Some(codes::COMMANDS_CLEARED));
            } else {
                assert_eq!(
                    got,
                    Some(Some(codes::COMMANDS_CLEARED.triple())),
                    "{}",
                    def.name
                );
            }
            assert_eq!(lu.ua.take(B), None);
        }
        // Read-only for the initiator: the target refuses exactly the rows
        // that change the medium, before the unit sees them.
        for def in COMMANDS {
            let (t, _) = target(512);
            t.set_policy(
                0,
                crate::LunPolicy {
                    read_only_for: vec!["ro".into()],
                    ..Default::default()
                },
            )
            .unwrap();
            while unit(&t).ua.take(B).is_some() {}
            let r = t.submit_and_wait(
                crate::ScsiCommand {
                    nexus: B,
                    lun: 0,
                    cdb: row_cdb(def),
                    data_out: Default::default(),
                    expected_len: 0,
                },
                Some("ro"),
            );
            let protected = r.status == ScsiStatus::CheckCondition
                && sense(&r) == Some(codes::WRITE_PROTECTED.triple());
            assert_eq!(protected, def.rules.changes_medium, "{}", def.name);
        }
    }

    /// The bug: WRITE ATOMIC(16) ignored reservations. From a
    /// nexus that holds no registration, under Write Exclusive held by
    /// another, it ends with RESERVATION CONFLICT and writes nothing; the
    /// holder's goes through.
    #[test]
    fn write_atomic_from_an_unregistered_initiator_is_a_reservation_conflict() {
        let (t, _) = target(512);
        reserve(&t, 1);
        // 8 blocks of 512 bytes: one whole 4 KiB atomic unit.
        let cdb = cdb16(0x9c, 0, 0, 8);
        let r = exec(&t, B, &cdb, &[0xbb; 4096]);
        assert_eq!(r.status, ScsiStatus::ReservationConflict);
        assert_eq!(good(exec(&t, B, &cdb10(0x28, 0, 0, 8), &[])), vec![0; 4096]);
        good(exec(&t, A, &cdb, &[0xaa; 4096]));
        assert_eq!(
            good(exec(&t, B, &cdb10(0x28, 0, 0, 8), &[])),
            vec![0xaa; 4096]
        );
    }

    /// A transport without CDBs passes the same gates under the rules of
    /// READ(16), WRITE(16) and SYNCHRONIZE CACHE(16).
    #[test]
    fn admit_applies_the_rows_it_names() {
        use BlockCommand::{Flush, Read, Write};
        let (t, _) = target(512);
        let lu = unit(&t);
        for c in [Read, Write, Flush] {
            assert_eq!(lu.admit(c, STRANGER), Ok(()));
        }
        reserve(&t, 1);
        assert_eq!(lu.admit(Read, STRANGER), Ok(()));
        assert_eq!(lu.admit(Write, STRANGER), Err(Refusal::Conflict));
        assert_eq!(lu.admit(Flush, STRANGER), Err(Refusal::Conflict));
        assert_eq!(lu.admit(Write, A), Ok(()), "the holder");
        // Exclusive Access: reads are fenced too.
        let (cdb, p) = pr_out(2, 1, KEY, 0);
        good(exec(&t, A, &cdb, &p));
        let (cdb, p) = pr_out(1, 3, KEY, 0);
        good(exec(&t, A, &cdb, &p));
        assert_eq!(lu.admit(Read, STRANGER), Err(Refusal::Conflict));
        let (cdb, p) = pr_out(2, 3, KEY, 0);
        good(exec(&t, A, &cdb, &p));
        assert_eq!(lu.admit(Write, STRANGER), Ok(()), "released");
        lu.set_alua_state(AluaState::Standby).unwrap();
        assert_eq!(
            lu.admit(Read, STRANGER),
            Err(Refusal::Check(codes::ALUA_STANDBY))
        );
        lu.set_alua_state(AluaState::Unavailable).unwrap();
        assert_eq!(
            lu.admit(Write, STRANGER),
            Err(Refusal::Check(codes::ALUA_UNAVAILABLE))
        );
        lu.set_alua_state(AluaState::ActiveOptimized).unwrap();
        lu.sanitize.running.store(true, Ordering::Release);
        assert!(matches!(
            lu.admit(Read, STRANGER),
            Err(Refusal::Check(s)) if s.triple() == codes::SANITIZE_IN_PROGRESS.triple()
        ));
        lu.sanitize.running.store(false, Ordering::Release);
        lu.ejected.store(true, Ordering::Relaxed);
        assert_eq!(
            lu.admit(Flush, STRANGER),
            Err(Refusal::Check(codes::MEDIUM_NOT_PRESENT))
        );
        lu.ejected.store(false, Ordering::Relaxed);
        for c in [Read, Write, Flush] {
            assert_eq!(lu.admit(c, STRANGER), Ok(()));
        }
        let names = [Read, Write, Flush].map(|c| c.row().name);
        assert_eq!(names, ["READ(16)", "WRITE(16)", "SYNCHRONIZE CACHE(16)"]);
    }
}
