//! SBC-3 medium handling: START STOP UNIT, PREVENT ALLOW MEDIUM REMOVAL,
//! and REQUEST SENSE (which reports the medium state).

use std::sync::atomic::Ordering;

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
            codes::SANITIZE_IN_PROGRESS.with_progress(self.sanitize.progress.load(Ordering::Relaxed) as u16)
        } else {
            Sense::new(key::NO_SENSE, 0, 0)
        };
        let s = self.ua.take(req.nexus).unwrap_or(idle);
        let s = if self.ejected.load(Ordering::Relaxed) && s.key == key::NO_SENSE { codes::MEDIUM_NOT_PRESENT } else { s };
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
