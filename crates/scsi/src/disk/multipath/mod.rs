//! A logical unit exported by several gateways at once (SPC-4 §5.9
//! persistent reservations and §5.16 ALUA across target ports).
//!
//! When the store has shared state ([`BlockDevice::shared`]), the unit
//! keeps two blobs there:
//! - `"pr"`: the persistent reservations ([`Reservations::encode`]). A
//!   PERSISTENT RESERVE OUT loads it, applies the change to a copy,
//!   stores it with compare-and-swap (on conflict: load, reapply, at most
//!   [`CAS_RETRIES`] times), updates the local cache and publishes;
//!   it returns only after the other gateways' handlers ran. Unit
//!   attentions owed to I_T nexuses travel in the blob's notice log; each
//!   gateway raises those for its own target port that it has not seen.
//!   PERSISTENT RESERVE IN reloads first (cheap, and exact even if a
//!   notice was lost); the conflict check of every other command reads
//!   the cache that the change handler refreshes.
//! - `"alua"`: every gateway's target port group ([`alua::encode_groups`]);
//!   each gateway adds or updates its own when the unit is created. SET
//!   TARGET PORT GROUPS changes it the same way; REPORT TARGET PORT
//!   GROUPS reloads it (falling back to the cache, logged, if the cluster
//!   cannot be read: a path checker should see the last known states).
//!
//! REPORT/SET TARGET PORT GROUPS and the management path's access state
//! are in [`groups`].
//!
//! Blocking calls to the shared state happen only here: in slow-path
//! commands (run as blocking jobs) and when the unit is created.
//! Without shared state the reservations and the one group live in
//! memory (and in `pr_state_file` for APTPL), as before.

mod groups;

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use ethersan_backend::{BackendError, SharedState, Versioned};
use ethersan_volume::MediumError;

use super::LogicalUnit;
use crate::alua::{self, Alua, AluaState, TargetPortGroup};
use crate::reservations::{Notice, Notices, PrError, Reservations};
use crate::sense::{codes, Sense};
use crate::unit_attention::UnitAttentions;
use crate::Nexus;

/// How long a LOGICAL UNIT RESET waits for the other gateways to be told.
const RESET_NOTICE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Compare-and-swap attempts before a change gives up (ABORTED COMMAND,
/// which initiators retry).
pub(crate) const CAS_RETRIES: usize = 16;

/// The blob of persistent reservations.
const PR_BLOB: &str = "pr";
/// The blob of target port groups.
const ALUA_BLOB: &str = "alua";

/// Why a change of the shared state failed.
#[derive(Debug, thiserror::Error)]
pub enum SharedStateError {
    /// The shared state could not be read or written.
    #[error("shared state: {0}")]
    Backend(#[from] BackendError),
    /// A blob there cannot be decoded.
    #[error("shared blob {blob:?} is corrupt: {detail}")]
    Corrupt {
        /// Which blob.
        blob: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// Other gateways kept changing the blob: every compare-and-swap lost.
    #[error("shared blob {0:?}: gave up after {CAS_RETRIES} conflicting updates")]
    Contention(&'static str),
}

impl SharedStateError {
    /// The sense an initiator gets for it (logged here, once).
    pub(crate) fn sense(&self) -> Sense {
        tracing::error!(error = %self, "shared logical unit state");
        match self {
            SharedStateError::Backend(e)
                if MediumError::of(e, false) == MediumError::Unavailable =>
            {
                codes::LU_COMMUNICATION_TIMEOUT
            }
            SharedStateError::Contention(_) => codes::LU_COMMUNICATION_TIMEOUT,
            _ => codes::INTERNAL_FAILURE,
        }
    }
}

/// The target port groups as this gateway knows them.
#[derive(Debug)]
pub(crate) struct AluaView {
    /// This gateway's group state ([`AluaState::code`]), read per command.
    pub(crate) state: AtomicU8,
    /// Every group, and the version of the blob they came from.
    pub(crate) groups: Mutex<(Vec<TargetPortGroup>, u64)>,
}

impl AluaView {
    pub(crate) fn new(cfg: &Alua) -> AluaView {
        let mut groups = Vec::new();
        alua::upsert(&mut groups, cfg);
        AluaView {
            state: AtomicU8::new(cfg.state.code()),
            groups: Mutex::new((groups, 0)),
        }
    }

    pub(crate) fn state(&self) -> AluaState {
        AluaState::from_code(self.state.load(Ordering::Acquire)).unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<TargetPortGroup>, u64)> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the change handlers of the shared blobs update: the parts of a
/// [`LogicalUnit`] that other gateways' changes reach.
#[derive(Debug)]
pub(crate) struct Follower {
    pub(crate) alua_cfg: Alua,
    pub(crate) ua: Arc<UnitAttentions>,
    pub(crate) reservations: Arc<Mutex<Reservations>>,
    pub(crate) reserved: Arc<AtomicBool>,
    pub(crate) preempted: Arc<Mutex<Vec<Nexus>>>,
    pub(crate) alua: Arc<AluaView>,
    /// Told of PREEMPT AND ABORT victims that a change through another
    /// gateway preempted ([`LogicalUnit::set_preempt_listener`]).
    pub(crate) listener: ListenerSlot,
}

/// Where the preempt listener is kept.
#[derive(Default)]
pub(crate) struct ListenerSlot(Mutex<Option<PreemptListener>>);

impl ListenerSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<PreemptListener>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for ListenerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.lock().is_some() {
            "Some(..)"
        } else {
            "None"
        })
    }
}

/// Called with the I_T nexuses of this gateway whose tasks a PREEMPT AND
/// ABORT through another gateway asked to abort (from the shared state's
/// notice thread: it should hand the work off quickly).
pub type PreemptListener = Arc<dyn Fn(Vec<Nexus>) + Send + Sync>;

fn corrupt(blob: &'static str, e: alua::BlobError) -> SharedStateError {
    SharedStateError::Corrupt {
        blob,
        detail: e.to_string(),
    }
}

impl Follower {
    fn res(&self) -> std::sync::MutexGuard<'_, Reservations> {
        self.reservations.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take blob `"pr"` at `v` into the cache (unless the cache is newer)
    /// and raise the notices for this gateway's I_T nexuses not seen yet
    /// (`replay` false: only remember where the log is).
    /// `remote`: not within a PERSISTENT RESERVE OUT of this gateway, whose
    /// transport takes the PREEMPT AND ABORT victims itself.
    fn absorb_pr(&self, v: &Versioned, replay: bool, remote: bool) -> Result<(), SharedStateError> {
        let mut r = self.res();
        if v.version != 0 && v.version <= r.version {
            return Ok(());
        }
        r.decode_shared(&v.data).map_err(|e| corrupt(PR_BLOB, e))?;
        r.version = v.version;
        let notices: Vec<Notice> = if replay {
            r.notices_after(r.seen).copied().collect()
        } else {
            Vec::new()
        };
        r.seen = r.last_seq();
        self.reserved.store(r.active(), Ordering::Release);
        drop(r);
        self.raise(&notices, remote);
        Ok(())
    }

    /// Raise the unit attentions of `notices` that are for this gateway's
    /// target port, and remember PREEMPT AND ABORT victims (for
    /// [`LogicalUnit::take_preempted`]; `remote` ones go to the preempt
    /// listener instead, if one is set).
    pub(crate) fn raise(&self, notices: &[Notice], remote: bool) {
        let mut victims = Vec::new();
        for n in notices
            .iter()
            .filter(|n| n.for_port(self.alua_cfg.rel_port))
        {
            if n.to_all {
                self.ua.raise_all(n.sense, None);
                continue;
            }
            if n.abort {
                victims.push(n.it.nexus);
            }
            self.ua.raise(n.it.nexus, n.sense);
        }
        if victims.is_empty() {
            return;
        }
        let listener = self.listener.lock().clone();
        match listener {
            Some(l) if remote => l(victims),
            _ => self
                .preempted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(victims),
        }
    }

    /// Load blob `"pr"` and take it in.
    fn reload_pr(&self, shared: &dyn SharedState) -> Result<(), SharedStateError> {
        let v = shared.load(PR_BLOB)?;
        self.absorb_pr(&v, true, true)
    }

    /// Take the groups of blob `"alua"` at `version` in (unless the cache
    /// is newer). If the state of a known group changed, every nexus but
    /// `except` gets ASYMMETRIC ACCESS STATE CHANGED.
    fn absorb_groups(&self, groups: Vec<TargetPortGroup>, version: u64, except: Option<Nexus>) {
        let mut g = self.alua.lock();
        if version != 0 && version <= g.1 {
            return;
        }
        // A group that appears (a gateway joining) changes no one's state.
        let changed = g.0.iter().any(|old| {
            groups
                .iter()
                .any(|new| new.id == old.id && new.state != old.state)
        });
        if let Some(own) = groups.iter().find(|x| x.id == self.alua_cfg.group) {
            self.alua.state.store(own.state.code(), Ordering::Release);
        }
        *g = (groups, version);
        drop(g);
        if changed {
            self.ua.raise_all(codes::ALUA_STATE_CHANGED, except);
        }
    }

    fn reload_alua(&self, shared: &dyn SharedState) -> Result<(), SharedStateError> {
        let v = shared.load(ALUA_BLOB)?;
        let groups = alua::decode_groups(&v.data).map_err(|e| corrupt(ALUA_BLOB, e))?;
        self.absorb_groups(groups, v.version, None);
        Ok(())
    }
}

/// Change blob `name` with `change` (applied to its current version,
/// it returns the new bytes and a result, or an answer `A` that ends the
/// attempt without a change), with compare-and-swap and bounded retries.
/// Returns the new version and the result, or the answer.
fn update<T, A>(
    shared: &dyn SharedState,
    name: &'static str,
    mut change: impl FnMut(&Versioned) -> Result<(Vec<u8>, T), Result<A, SharedStateError>>,
) -> Result<Result<(u64, T), A>, SharedStateError> {
    for _ in 0..CAS_RETRIES {
        let current = shared.load(name)?;
        let (data, out) = match change(&current) {
            Ok(x) => x,
            Err(Ok(done)) => return Ok(Err(done)),
            Err(Err(e)) => return Err(e),
        };
        if let Some(version) = shared.store(name, &data, current.version)? {
            return Ok(Ok((version, out)));
        }
    }
    Err(SharedStateError::Contention(name))
}

impl LogicalUnit {
    /// The parts of the unit the change handlers update.
    pub(crate) fn follower(&self) -> &Follower {
        &self.follower
    }

    /// With shared state: load the reservations, add or update this
    /// gateway's target port group, and subscribe to both blobs (called
    /// once, when the unit is created; blocking). Failures are logged:
    /// the unit starts with what it has, and the next PERSISTENT
    /// RESERVE or target port group command tries again.
    pub(super) fn attach_shared(&self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let f = self.follower();
        let where_ = shared.describe();
        // The handlers hold the unit's state weakly: once the unit is
        // dropped (a LUN removed, a restart in tests) they do nothing.
        let weak = Arc::downgrade(&self.follower);
        match shared.load(PR_BLOB) {
            Ok(v) => {
                if let Err(e) = f.absorb_pr(&v, false, true) {
                    tracing::error!(%e, shared = %where_, "cannot load persistent reservations");
                }
            }
            Err(e) => {
                tracing::error!(%e, shared = %where_, "cannot load persistent reservations")
            }
        }
        let (h, s) = (weak.clone(), Arc::downgrade(&shared));
        let on_pr = Arc::new(move || {
            let (Some(h), Some(s)) = (h.upgrade(), s.upgrade()) else {
                return;
            };
            if let Err(e) = h.reload_pr(&*s) {
                tracing::error!(%e, "cannot reload persistent reservations");
            }
        });
        if let Err(e) = shared.subscribe(PR_BLOB, on_pr) {
            tracing::error!(%e, shared = %where_, "cannot follow persistent reservation changes");
        }
        let (h, s) = (weak, Arc::downgrade(&shared));
        let on_alua = Arc::new(move || {
            let (Some(h), Some(s)) = (h.upgrade(), s.upgrade()) else {
                return;
            };
            if let Err(e) = h.reload_alua(&*s) {
                tracing::error!(%e, "cannot reload target port groups");
            }
        });
        if let Err(e) = shared.subscribe(ALUA_BLOB, on_alua) {
            tracing::error!(%e, shared = %where_, "cannot follow target port group changes");
        }
        let own = self.cfg.alua;
        // A gateway that comes back with the group it had finds itself
        // already registered: nothing is stored and nobody is told (a
        // notice would wait for the watch its previous run left behind).
        let registered = update(&*shared, ALUA_BLOB, |v| {
            let mut groups =
                alua::decode_groups(&v.data).map_err(|e| Err(corrupt(ALUA_BLOB, e)))?;
            if !alua::upsert(&mut groups, &own) {
                return Err(Ok((v.version, groups)));
            }
            Ok((alua::encode_groups(&groups), groups))
        });
        match registered {
            Ok(Ok((version, groups))) => {
                f.absorb_groups(groups, version, None);
                if let Err(e) = shared.publish(ALUA_BLOB) {
                    tracing::error!(%e, shared = %where_, "cannot announce the target port group");
                }
            }
            Ok(Err((version, groups))) => f.absorb_groups(groups, version, None),
            Err(e) => {
                tracing::error!(%e, shared = %where_, "cannot register the target port group")
            }
        }
    }

    /// PERSISTENT RESERVE OUT through the shared blob (see the module
    /// documentation). The notices are raised here; none are returned.
    pub(super) fn pr_out_shared(
        &self,
        shared: &dyn SharedState,
        nexus: Nexus,
        action: u8,
        scope_type: u8,
        param: &[u8],
    ) -> Result<Notices, PrError> {
        let f = self.follower();
        let outcome = update(shared, PR_BLOB, |current| {
            f.absorb_pr(current, true, false).map_err(Err)?;
            let mut next = self.res().clone();
            match next.pr_out(nexus, action, scope_type, param) {
                Ok(mut notices) => {
                    next.log_notices(&mut notices);
                    let data = next.encode();
                    Ok((data.clone(), data))
                }
                Err(e) => Err(Ok(e)),
            }
        });
        let (version, data) = match outcome {
            Ok(Ok(stored)) => stored,
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(PrError::Sense(e.sense())),
        };
        // Our own change: take it in as a handler would (raising the
        // notices for this gateway's nexuses), then tell the others.
        if let Err(e) = f.absorb_pr(&Versioned { data, version }, true, false) {
            return Err(PrError::Sense(e.sense()));
        }
        if let Err(e) = shared.publish(PR_BLOB) {
            tracing::error!(%e, "cannot announce a persistent reservation change");
        }
        Ok(Vec::new())
    }

    /// Tell the other gateways that a LOGICAL UNIT RESET reached the unit
    /// here: their nexuses get `sense` too (SAM-5 §6.3: a logical unit
    /// reset is an event of the unit, seen by every I_T nexus). It goes
    /// through the notice log of blob `"pr"`, from a thread of its own
    /// that the task management path waits for at most
    /// [`RESET_NOTICE_WAIT`]: normally the other gateways have raised their
    /// unit attentions before the TMF response goes out (libiscsi's
    /// MultipathIO.Reset looks at once), and a cluster that does not answer
    /// delays the response by that bound, never more.
    pub(super) fn announce_reset(&self, sense: Sense) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let follower = Arc::downgrade(&self.follower);
        let origin = self.cfg.alua.rel_port;
        let (told, announced) = std::sync::mpsc::sync_channel::<()>(1);
        let spawned = std::thread::Builder::new()
            .name("lu-reset-notice".into())
            .spawn(move || {
                let _told = told;
                let Some(f) = follower.upgrade() else { return };
                let outcome = update(&*shared, PR_BLOB, |current| {
                    f.absorb_pr(current, true, true).map_err(Err)?;
                    let mut next = f.res().clone();
                    next.log_notices(&mut [Notice::to_all(origin, sense)]);
                    let data = next.encode();
                    Ok::<_, Result<(), _>>((data.clone(), data))
                });
                match outcome {
                    Ok(Ok((version, data))) => {
                        if let Err(e) = f.absorb_pr(&Versioned { data, version }, true, true) {
                            tracing::error!(%e, "logical unit reset notice");
                        }
                        if let Err(e) = shared.publish(PR_BLOB) {
                            tracing::error!(%e, "cannot announce a logical unit reset");
                        }
                    }
                    Ok(Err(())) => {}
                    Err(e) => tracing::error!(%e, "cannot announce a logical unit reset"),
                }
            });
        match spawned {
            // The sender drops when the thread is done.
            Ok(_) => {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    announced.recv_timeout(RESET_NOTICE_WAIT)
                {
                    tracing::warn!(
                        "the other gateways were not told of a logical unit reset within {:?}; they will be when the cluster answers",
                        RESET_NOTICE_WAIT
                    );
                }
            }
            Err(e) => tracing::error!(%e, "cannot start the logical unit reset notice"),
        }
    }

    /// Reload the shared reservations before PERSISTENT RESERVE IN.
    pub(super) fn refresh_pr(&self) -> Result<(), Sense> {
        match &self.shared {
            Some(shared) => self.follower().reload_pr(&**shared).map_err(|e| e.sense()),
            None => Ok(()),
        }
    }

    /// Who aborts the tasks of nexuses preempted by a PREEMPT AND ABORT
    /// through another gateway. Without a listener they wait in the list
    /// [`take_preempted`](Self::take_preempted) returns, which the
    /// transport reads after each PERSISTENT RESERVE OUT it runs here.
    pub fn set_preempt_listener(&self, listener: PreemptListener) {
        *self.follower.listener.lock() = Some(listener);
    }
}

#[cfg(test)]
mod tests;
