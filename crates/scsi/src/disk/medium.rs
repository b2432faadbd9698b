//! SBC-3 medium handling: START STOP UNIT, PREVENT ALLOW MEDIUM REMOVAL,
//! and REQUEST SENSE (which reports the medium state).

use std::sync::atomic::Ordering;

use ethersan_backend::BlockDeviceExt;

use super::{CmdResult, LogicalUnit, Reply};
use crate::sense::{codes, key, Sense};
use crate::{Nexus, ScsiRequest};

impl LogicalUnit {
    /// REQUEST SENSE: reports and clears the oldest unit attention of the
    /// nexus, else the unit's current state (medium absent, sanitize in
    /// progress) or NO SENSE, in the format DESC asks for.
    pub(super) fn request_sense(&self, req: &ScsiRequest<'_>) -> CmdResult {
        let desc = req.cdb[1] & 1 != 0;
        let alloc = usize::from(req.cdb[4]);
        let idle = if self.sanitize.running.load(Ordering::Acquire) {
            codes::SANITIZE_IN_PROGRESS
                .with_progress(self.sanitize.progress.load(Ordering::Relaxed) as u16)
        } else {
            Sense::new(key::NO_SENSE, 0, 0)
        };
        let s = self.ua.take(req.nexus).unwrap_or(idle);
        let s = if self.ejected.load(Ordering::Relaxed) && s.key == key::NO_SENSE {
            codes::MEDIUM_NOT_PRESENT
        } else {
            s
        };
        Reply::data(s.to_bytes(desc), alloc)
    }

    /// START STOP UNIT (SBC-3 §5.20): power conditions and START without
    /// LOEJ change nothing here; LOEJ loads (START=1) or ejects (START=0)
    /// a removable medium unless some nexus prevents removal. A
    /// non-removable unit has nothing to load or eject: INVALID FIELD IN CDB.
    pub(super) fn start_stop(&self, cdb: &[u8], _nexus: Nexus) -> CmdResult {
        let power_condition = cdb[4] >> 4;
        let loej = cdb[4] & 0x02 != 0;
        let start = cdb[4] & 0x01 != 0;
        if power_condition != 0 || !loej {
            // Power conditions and plain start/stop do not move the medium.
            return Reply::none();
        }
        if !self.cfg.removable {
            return Err(Sense::invalid_cdb_field(4, Some(1)));
        }
        let st = self.lock();
        // While any nexus prevents removal the medium neither leaves nor
        // (re)loads.
        if !st.prevent.is_empty() {
            return Err(codes::REMOVAL_PREVENTED);
        }
        drop(st);
        if !start {
            let _ = self.dev.flush();
        }
        self.ejected.store(!start, Ordering::Relaxed);
        self.lock().medium_present = start;
        Reply::none()
    }

    /// PREVENT ALLOW MEDIUM REMOVAL (SBC-3 §5.13): per nexus; removal is
    /// prevented while any nexus prevents it.
    pub(super) fn prevent_allow(&self, cdb: &[u8], nexus: Nexus) -> CmdResult {
        let prevent = cdb[4] & 0x03;
        if prevent > 1 {
            return Err(Sense::invalid_cdb_field(4, Some(1)));
        }
        let mut st = self.lock();
        if prevent == 1 {
            st.prevent.insert(nexus);
        } else {
            st.prevent.remove(&nexus);
        }
        Reply::none()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::testing::*;
    use crate::sense::key;
    use crate::{ResetKind, ScsiTarget};

    const TUR: [u8; 6] = [0, 0, 0, 0, 0, 0];

    fn ssu(immed: bool, pc: u8, loej: bool, start: bool) -> Vec<u8> {
        vec![
            0x1b,
            u8::from(immed),
            0,
            0,
            pc << 4 | u8::from(loej) << 1 | u8::from(start),
            0,
        ]
    }

    fn prevent(on: bool) -> Vec<u8> {
        vec![0x1e, 0, 0, 0, u8::from(on), 0]
    }

    fn removable(bs: u32) -> ScsiTarget {
        target_over(Arc::new(TestDevice::new(bs)), config(true, false))
    }

    #[test]
    fn eject_and_load_a_removable_medium() {
        for bs in BLOCK_SIZES {
            let t = removable(bs);
            for immed in [true, false] {
                good(exec(&t, A, &ssu(immed, 0, true, false), &[]));
                check(&exec(&t, A, &TUR, &[]), key::NOT_READY, 0x3a, 0);
                check(
                    &exec(&t, B, &cdb10(0x28, 0, 0, 1), &[]),
                    key::NOT_READY,
                    0x3a,
                    0,
                );
                check(
                    &exec(&t, A, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]),
                    key::NOT_READY,
                    0x3a,
                    0,
                );
                // INQUIRY still answers; REQUEST SENSE reports the state.
                good(exec(&t, A, &[0x12, 0, 0, 0, 36, 0], &[]));
                let s = good(exec(&t, A, &[0x03, 0, 0, 0, 252, 0], &[]));
                assert_eq!(sense_of(&s), Some((key::NOT_READY, 0x3a, 0)));
                good(exec(&t, A, &ssu(immed, 0, true, true), &[]));
                good(exec(&t, A, &TUR, &[]));
            }
        }
    }

    #[test]
    fn without_loej_or_with_a_power_condition_nothing_moves() {
        let t = removable(512);
        for start in [false, true] {
            good(exec(&t, A, &ssu(false, 0, false, start), &[]));
            good(exec(&t, A, &TUR, &[]));
        }
        for pc in 1..16 {
            good(exec(&t, A, &ssu(true, pc, true, false), &[]));
            good(exec(&t, A, &TUR, &[]));
        }
    }

    #[test]
    fn non_removable_units_cannot_load_or_eject() {
        let (t, _) = target(512);
        let r = exec(&t, A, &ssu(false, 0, true, false), &[]);
        check(&r, key::ILLEGAL_REQUEST, 0x24, 0);
        assert_eq!(field_pointer(&r), [0xc9, 0, 4]);
        good(exec(&t, A, &TUR, &[]));
        good(exec(&t, A, &ssu(false, 0, false, true), &[]));
    }

    #[test]
    fn prevent_blocks_removal_until_allowed_lost_or_reset() {
        let t = removable(4096);
        good(exec(&t, A, &prevent(true), &[]));
        check(
            &exec(&t, A, &ssu(false, 0, true, false), &[]),
            key::ILLEGAL_REQUEST,
            0x53,
            0x02,
        );
        check(
            &exec(&t, B, &ssu(false, 0, true, false), &[]),
            key::ILLEGAL_REQUEST,
            0x53,
            0x02,
        );
        good(exec(&t, A, &TUR, &[]));
        // Allow from another nexus does not lift A's prevent.
        good(exec(&t, B, &prevent(false), &[]));
        check(
            &exec(&t, B, &ssu(false, 0, true, false), &[]),
            key::ILLEGAL_REQUEST,
            0x53,
            0x02,
        );
        good(exec(&t, A, &prevent(false), &[]));
        good(exec(&t, A, &ssu(false, 0, true, false), &[]));
        good(exec(&t, A, &ssu(false, 0, true, true), &[]));
        // Losing the nexus releases its prevent.
        good(exec(&t, A, &prevent(true), &[]));
        t.nexus_lost(A);
        good(exec(&t, B, &ssu(false, 0, true, false), &[]));
        good(exec(&t, B, &ssu(false, 0, true, true), &[]));
        // Every reset releases it.
        for kind in [
            ResetKind::LogicalUnit,
            ResetKind::TargetWarm,
            ResetKind::TargetCold,
        ] {
            good(exec(&t, B, &prevent(true), &[]));
            t.reset(kind, Some(0), A);
            while exec(&t, B, &TUR, &[]).status != crate::ScsiStatus::Good {}
            good(exec(&t, B, &ssu(false, 0, true, false), &[]));
            good(exec(&t, B, &ssu(false, 0, true, true), &[]));
        }
        // PREVENT field values 2 and 3 are not for disks.
        check(
            &exec(&t, B, &[0x1e, 0, 0, 0, 2, 0], &[]),
            key::ILLEGAL_REQUEST,
            0x24,
            0,
        );
    }

    #[test]
    fn request_sense_returns_and_clears_unit_attentions() {
        let (t, _) = target(512);
        // Nothing pending: NO SENSE, fixed or descriptor as DESC asks.
        let s = good(exec(&t, A, &[0x03, 0, 0, 0, 252, 0], &[]));
        assert_eq!((s[0], sense_of(&s)), (0x70, Some((0, 0, 0))));
        let s = good(exec(&t, A, &[0x03, 1, 0, 0, 252, 0], &[]));
        assert_eq!((s[0], sense_of(&s)), (0x72, Some((0, 0, 0))));
        t.reset(ResetKind::LogicalUnit, Some(0), A);
        let s = good(exec(&t, A, &[0x03, 0, 0, 0, 252, 0], &[]));
        assert_eq!(sense_of(&s), Some((key::UNIT_ATTENTION, 0x29, 0x03)));
        good(exec(&t, A, &TUR, &[]));
        // Allocation length truncates.
        assert_eq!(good(exec(&t, B, &[0x03, 0, 0, 0, 8, 0], &[])).len(), 8);
        good(exec(&t, B, &TUR, &[]));
    }
}
