//! The target port groups of a unit that several gateways export:
//! REPORT TARGET PORT GROUPS (SPC-4 §6.27), SET TARGET PORT GROUPS
//! (§6.37) and the management path's view and change of this gateway's
//! access state, kept in the shared blob `"alua"` when there is one.

use super::{corrupt, update, SharedStateError, ALUA_BLOB};
use crate::alua::{self, AluaState, TargetPortGroup};
use crate::be::be32;
use crate::disk::{CmdResult, LogicalUnit, Reply};
use crate::sense::{codes, Sense};
use crate::Nexus;

impl LogicalUnit {
    /// REPORT TARGET PORT GROUPS (SPC-4 §6.27).
    pub(in crate::disk) fn report_target_port_groups(&self, cdb: &[u8]) -> CmdResult {
        let extended = cdb[1] & 0xe0 == 0x20;
        let alloc = be32(&cdb[6..10]) as usize;
        if let Some(shared) = &self.shared {
            if let Err(e) = self.follower().reload_alua(&**shared) {
                tracing::warn!(%e, "REPORT TARGET PORT GROUPS answers from the cache");
            }
        }
        let data = alua::report(&self.alua.lock().0, extended);
        Reply::data(data, alloc)
    }

    /// SET TARGET PORT GROUPS (SPC-4 §6.37).
    pub(in crate::disk) fn set_target_port_groups(
        &self,
        cdb: &[u8],
        data_out: &[u8],
        nexus: Nexus,
    ) -> CmdResult {
        let len = be32(&cdb[6..10]) as usize;
        if data_out.len() < len {
            return Err(codes::PARAM_LIST_LENGTH);
        }
        let changes = alua::parse_set(&data_out[..len])?;
        if changes.is_empty() {
            return Reply::none();
        }
        self.change_groups(&changes, Some(nexus))?;
        Reply::none()
    }

    /// Apply `changes` to the groups (shared or local) and raise
    /// ASYMMETRIC ACCESS STATE CHANGED for every nexus but `except`.
    fn change_groups(
        &self,
        changes: &[(u16, AluaState)],
        except: Option<Nexus>,
    ) -> Result<(), Sense> {
        let f = self.follower();
        let Some(shared) = &self.shared else {
            let mut groups = self.alua.lock().0.clone();
            alua::apply_set(&mut groups, changes)?;
            f.absorb_groups(groups, 0, except);
            return Ok(());
        };
        let outcome = update(&**shared, ALUA_BLOB, |v| {
            let mut groups =
                alua::decode_groups(&v.data).map_err(|e| Err(corrupt(ALUA_BLOB, e)))?;
            match alua::apply_set(&mut groups, changes) {
                Ok(_) => Ok((alua::encode_groups(&groups), groups)),
                Err(s) => Err(Ok(s)),
            }
        });
        match outcome {
            Ok(Ok((version, groups))) => {
                f.absorb_groups(groups, version, except);
                if let Err(e) = shared.publish(ALUA_BLOB) {
                    tracing::error!(%e, "cannot announce a target port group change");
                }
                Ok(())
            }
            Ok(Err(s)) => Err(s),
            Err(e) => Err(e.sense()),
        }
    }

    /// The access state of this gateway's target port group.
    pub fn alua_state(&self) -> AluaState {
        self.alua.state()
    }

    /// Set the access state of this gateway's target port group, as SET
    /// TARGET PORT GROUPS would (active/optimized makes the other
    /// optimized groups active/non-optimized), but any state, unavailable
    /// included. With shared state this blocks (compare-and-swap, then
    /// the other gateways are told). Every nexus gets ASYMMETRIC ACCESS
    /// STATE CHANGED if a state changed.
    pub fn set_alua_state(&self, state: AluaState) -> Result<(), SharedStateError> {
        let group = self.cfg.alua.group;
        let f = self.follower();
        let Some(shared) = &self.shared else {
            let mut groups = self.alua.lock().0.clone();
            // The unit's own group is always in the list.
            let _ = alua::apply_set(&mut groups, &[(group, state)]);
            f.absorb_groups(groups, 0, None);
            return Ok(());
        };
        let own = self.cfg.alua;
        let outcome = update(&**shared, ALUA_BLOB, |v| {
            let mut groups =
                alua::decode_groups(&v.data).map_err(|e| Err(corrupt(ALUA_BLOB, e)))?;
            if !groups.iter().any(|g| g.id == group) {
                alua::upsert(&mut groups, &own);
            }
            let _ = alua::apply_set(&mut groups, &[(group, state)]);
            Ok::<_, Result<(), _>>((alua::encode_groups(&groups), groups))
        })?;
        if let Ok((version, groups)) = outcome {
            f.absorb_groups(groups, version, None);
            shared.publish(ALUA_BLOB)?;
        }
        Ok(())
    }

    /// Every target port group this gateway knows of (all gateways' with
    /// shared state, as of the last change notice).
    pub fn target_port_groups(&self) -> Vec<TargetPortGroup> {
        self.alua.lock().0.clone()
    }
}
