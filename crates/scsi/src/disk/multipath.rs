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
//! Blocking calls to the shared state happen only here: in slow-path
//! commands (run as blocking jobs) and when the unit is created.
//! Without shared state the reservations and the one group live in
//! memory (and in `pr_state_file` for APTPL), as before.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use ethersan_backend::{BackendError, SharedState, Versioned};
use ethersan_volume::MediumError;

use super::{CmdResult, LogicalUnit, Reply};
use crate::alua::{self, Alua, AluaState, TargetPortGroup};
use crate::be::be32;
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
        let registered = update(&*shared, ALUA_BLOB, |v| {
            let mut groups =
                alua::decode_groups(&v.data).map_err(|e| Err(corrupt(ALUA_BLOB, e)))?;
            alua::upsert(&mut groups, &own);
            Ok::<_, Result<(), _>>((alua::encode_groups(&groups), groups))
        });
        match registered {
            Ok(Ok((version, groups))) => {
                f.absorb_groups(groups, version, None);
                if let Err(e) = shared.publish(ALUA_BLOB) {
                    tracing::error!(%e, shared = %where_, "cannot announce the target port group");
                }
            }
            Ok(Err(())) => {}
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

    /// REPORT TARGET PORT GROUPS (SPC-4 §6.27).
    pub(super) fn report_target_port_groups(&self, cdb: &[u8]) -> CmdResult {
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
    pub(super) fn set_target_port_groups(
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

    /// Who aborts the tasks of nexuses preempted by a PREEMPT AND ABORT
    /// through another gateway. Without a listener they wait in the list
    /// [`take_preempted`](Self::take_preempted) returns, which the
    /// transport reads after each PERSISTENT RESERVE OUT it runs here.
    pub fn set_preempt_listener(&self, listener: PreemptListener) {
        *self.follower.listener.lock() = Some(listener);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use ethersan_backend::ram::RamDevice;
    use ethersan_backend::{BlockDevice, IoCompletion, IoRequest, MemoryShared, Submission};

    use super::super::testing::*;
    use super::*;
    use crate::sense::key;
    use crate::{LuConfig, ScsiResponse, ScsiStatus, ScsiTarget};

    /// One store (RAM) as a cluster image: every gateway's device shares
    /// the blocks and hands out its own handle on one shared state.
    #[derive(Debug)]
    struct ClusterImage {
        ram: Arc<RamDevice>,
        shared: Arc<dyn SharedState>,
    }

    impl BlockDevice for ClusterImage {
        fn block_size(&self) -> u32 {
            self.ram.block_size()
        }
        fn num_blocks(&self) -> u64 {
            self.ram.num_blocks()
        }
        fn submit(&self, req: IoRequest, done: IoCompletion) -> Submission {
            self.ram.submit(req, done)
        }
        fn shared(&self) -> Option<Arc<dyn SharedState>> {
            Some(self.shared.clone())
        }
        fn describe(&self) -> String {
            "cluster image (ram)".into()
        }
    }

    /// A shared state whose first `fail` stores of `"pr"` lose their
    /// compare-and-swap to `meanwhile` (another gateway's change).
    struct Racy {
        inner: MemoryShared,
        fail: AtomicUsize,
        meanwhile: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    }

    impl std::fmt::Debug for Racy {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Racy")
        }
    }

    impl SharedState for Racy {
        fn load(&self, name: &str) -> Result<Versioned, BackendError> {
            self.inner.load(name)
        }
        fn store(
            &self,
            name: &str,
            data: &[u8],
            expected: u64,
        ) -> Result<Option<u64>, BackendError> {
            if name == PR_BLOB && self.fail.load(Ordering::SeqCst) > 0 {
                self.fail.fetch_sub(1, Ordering::SeqCst);
                if let Some(f) = self.meanwhile.lock().unwrap().take() {
                    f();
                }
                return Ok(None);
            }
            self.inner.store(name, data, expected)
        }
        fn subscribe(
            &self,
            name: &str,
            h: ethersan_backend::shared::ChangeHandler,
        ) -> Result<(), BackendError> {
            self.inner.subscribe(name, h)
        }
        fn publish(&self, name: &str) -> Result<(), BackendError> {
            self.inner.publish(name)
        }
        fn describe(&self) -> String {
            "racy".into()
        }
    }

    const C: Nexus = Nexus(3);

    struct Gateway {
        t: ScsiTarget,
        lu: Arc<LogicalUnit>,
    }

    /// Gateways 1 and 2, both active/optimized, over `ram` and `shared`.
    fn two_gateways(ram: &Arc<RamDevice>, shared: &MemoryShared) -> (Gateway, Gateway) {
        let g1 = gateway(
            ram,
            Arc::new(shared.handle()),
            1,
            AluaState::ActiveOptimized,
        );
        let g2 = gateway(
            ram,
            Arc::new(shared.handle()),
            2,
            AluaState::ActiveOptimized,
        );
        (g1, g2)
    }

    fn gateway(
        ram: &Arc<RamDevice>,
        shared: Arc<dyn SharedState>,
        group: u16,
        state: AluaState,
    ) -> Gateway {
        let dev = Arc::new(ClusterImage {
            ram: ram.clone(),
            shared,
        });
        let cfg = LuConfig {
            alua: Alua {
                group,
                rel_port: group,
                state,
                preferred: false,
            },
            ..config(false, false)
        };
        let lu = Arc::new(LogicalUnit::new(dev, cfg));
        let t = ScsiTarget::new(vec![lu.clone()]);
        for n in [A, B, C] {
            t.nexus_added(n);
            settle(&t, n);
        }
        Gateway { t, lu }
    }

    /// Consume the unit attentions queued for `n`.
    fn settle(t: &ScsiTarget, n: Nexus) {
        for _ in 0..8 {
            if exec(t, n, &rtpg(false, 1024), &[]).status == ScsiStatus::Good {
                return;
            }
        }
        panic!("unit attentions do not end");
    }

    fn ram() -> Arc<RamDevice> {
        Arc::new(RamDevice::new(DEV_BYTES, 512).unwrap())
    }

    fn pr_out(action: u8, kind: u8, rkey: u64, sakey: u64, flags: u8) -> (Vec<u8>, Vec<u8>) {
        let cdb = vec![0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0];
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&rkey.to_be_bytes());
        p[8..16].copy_from_slice(&sakey.to_be_bytes());
        p[20] = flags;
        (cdb, p)
    }

    fn pro(
        g: &Gateway,
        n: Nexus,
        action: u8,
        kind: u8,
        rkey: u64,
        sakey: u64,
        flags: u8,
    ) -> ScsiResponse {
        let (cdb, p) = pr_out(action, kind, rkey, sakey, flags);
        exec(&g.t, n, &cdb, &p)
    }

    fn pri(g: &Gateway, n: Nexus, action: u8) -> Vec<u8> {
        good(exec(
            &g.t,
            n,
            &[0x5e, action, 0, 0, 0, 0, 0, 0x10, 0, 0],
            &[],
        ))
    }

    fn rtpg(extended: bool, alloc: u32) -> Vec<u8> {
        let mut c = vec![
            0xa3,
            0x0a | if extended { 0x20 } else { 0 },
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ];
        c[6..10].copy_from_slice(&alloc.to_be_bytes());
        c
    }

    fn stpg(group: u16, state: u8) -> (Vec<u8>, Vec<u8>) {
        let cdb = vec![0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];
        let [g0, g1] = group.to_be_bytes();
        (cdb, vec![0, 0, 0, 0, state, 0, g0, g1])
    }

    /// (group, state) of each descriptor of RTPG length-only data.
    fn groups_of(d: &[u8]) -> Vec<(u16, u8)> {
        let mut out = Vec::new();
        let mut at = 4;
        while at + 8 <= d.len() {
            out.push((u16::from_be_bytes([d[at + 2], d[at + 3]]), d[at] & 0x0f));
            at += 8 + 4 * usize::from(d[at + 7]);
        }
        out
    }

    fn write(g: &Gateway, n: Nexus) -> ScsiResponse {
        exec(&g.t, n, &cdb10(0x2a, 0, 8, 1), &[7u8; 512])
    }

    const WE: u8 = 1;

    #[test]
    fn a_reservation_through_one_gateway_holds_at_the_other() {
        let shared = MemoryShared::new();
        let ram = ram();
        let (g1, g2) = two_gateways(&ram, &shared);
        good(pro(&g1, A, 0, 0, 0, 0xa, 0));
        good(pro(&g1, A, 1, WE, 0xa, 0, 0));
        assert_eq!(write(&g2, B).status, ScsiStatus::ReservationConflict);
        // The same initiator through the other gateway is another I_T
        // nexus: not registered there, not the holder.
        assert_eq!(write(&g2, A).status, ScsiStatus::ReservationConflict);
        assert_eq!(
            pro(&g2, A, 1, WE, 0xa, 0, 0).status,
            ScsiStatus::ReservationConflict
        );
        good(write(&g1, A));
        // PR IN through the other gateway sees the reservation.
        let r = pri(&g2, B, 1);
        assert_eq!(&r[8..16], &0xau64.to_be_bytes());
        assert_eq!(r[21] & 0x0f, WE);
        // ALL_TG_PT: C registered through gateway 1 is registered through 2.
        good(pro(&g1, C, 0, 0, 0, 0xc, 0x04));
        good(pro(&g2, C, 0, 0, 0xc, 0xcc, 0));
        let keys = pri(&g2, C, 0);
        assert_eq!(u32::from_be_bytes(keys[4..8].try_into().unwrap()), 16);
        assert_eq!(
            pro(&g2, A, 0, 0, 0xa, 0xaa, 0).status,
            ScsiStatus::ReservationConflict
        );
        good(pro(&g1, A, 2, WE, 0xa, 0, 0));
        good(write(&g2, B));
    }

    #[test]
    fn preempt_through_the_other_gateway_reaches_the_victim() {
        let shared = MemoryShared::new();
        let ram = ram();
        let (g1, g2) = two_gateways(&ram, &shared);
        good(pro(&g1, A, 0, 0, 0, 0xa, 0));
        good(pro(&g2, B, 0, 0, 0, 0xb, 0));
        good(pro(&g1, A, 1, WE, 0xa, 0, 0));
        // READ FULL STATUS shows each registration at its own port.
        let fs = pri(&g1, A, 3);
        let mut ports: Vec<(u64, u16, u8)> = Vec::new();
        let mut d = &fs[8..];
        while d.len() >= 24 {
            ports.push((
                u64::from_be_bytes(d[0..8].try_into().unwrap()),
                u16::from_be_bytes([d[18], d[19]]),
                d[12],
            ));
            let len = u32::from_be_bytes(d[20..24].try_into().unwrap()) as usize;
            d = &d[24 + len..];
        }
        assert!(ports.contains(&(0xa, 1, 1)), "{ports:x?}");
        assert!(ports.contains(&(0xb, 2, 0)), "{ports:x?}");
        // PREEMPT AND ABORT through gateway 2.
        let told = Arc::new(Mutex::new(Vec::new()));
        let t2 = told.clone();
        g1.lu
            .set_preempt_listener(Arc::new(move |v| t2.lock().unwrap().extend(v)));
        good(pro(&g2, B, 5, WE, 0xb, 0xa, 0));
        check(&write(&g1, A), key::UNIT_ATTENTION, 0x2a, 0x05);
        assert_eq!(*told.lock().unwrap(), vec![A]);
        assert_eq!(g1.lu.take_preempted(), vec![], "the listener had them");
        assert_eq!(g2.lu.take_preempted(), vec![], "no victim at gateway 2");
        assert_eq!(write(&g1, A).status, ScsiStatus::ReservationConflict);
        good(write(&g2, B));
        // Nobody on gateway 2 was told anything.
        good(write(&g2, B));
        let r = pri(&g1, C, 1);
        assert_eq!(&r[8..16], &0xbu64.to_be_bytes());
    }

    #[test]
    fn a_lost_compare_and_swap_reapplies_on_the_new_state() {
        let shared = MemoryShared::new();
        let ram = ram();
        let g2 = Arc::new(gateway(
            &ram,
            Arc::new(shared.handle()),
            2,
            AluaState::ActiveOptimized,
        ));
        let racy = Arc::new(Racy {
            inner: shared.handle(),
            fail: AtomicUsize::new(1),
            meanwhile: Mutex::new(None),
        });
        let g1 = gateway(&ram, racy.clone(), 1, AluaState::ActiveOptimized);
        let other = g2.clone();
        *racy.meanwhile.lock().unwrap() = Some(Box::new(move || {
            good(pro(&other, B, 0, 0, 0, 0xb, 0));
        }));
        good(pro(&g1, A, 0, 0, 0, 0xa, 0));
        assert_eq!(racy.fail.load(Ordering::SeqCst), 0);
        let keys = pri(&g1, A, 0);
        assert_eq!(
            &keys[8..],
            &[0, 0, 0, 0, 0, 0, 0, 0xa, 0, 0, 0, 0, 0, 0, 0, 0xb]
        );
        assert_eq!(pri(&g2, B, 0), keys);
    }

    #[test]
    fn a_restarted_gateway_finds_the_reservation() {
        let shared = MemoryShared::new();
        let ram = ram();
        let g1 = gateway(
            &ram,
            Arc::new(shared.handle()),
            1,
            AluaState::ActiveOptimized,
        );
        good(pro(&g1, A, 0, 0, 0, 0xa, 0));
        good(pro(&g1, A, 1, 3, 0xa, 0, 0)); // EXCLUSIVE ACCESS
        drop(g1);
        let g1 = gateway(
            &ram,
            Arc::new(shared.handle()),
            1,
            AluaState::ActiveOptimized,
        );
        assert!(g1.lu.reserved.load(Ordering::Acquire));
        assert_eq!(
            exec(&g1.t, B, &cdb10(0x28, 0, 0, 1), &[]).status,
            ScsiStatus::ReservationConflict
        );
        good(exec(&g1.t, A, &cdb10(0x28, 0, 0, 1), &[]));
    }

    #[test]
    fn target_port_groups_across_gateways() {
        let shared = MemoryShared::new();
        let ram = ram();
        let g1 = gateway(
            &ram,
            Arc::new(shared.handle()),
            1,
            AluaState::ActiveOptimized,
        );
        let g2 = gateway(&ram, Arc::new(shared.handle()), 2, AluaState::Standby);
        settle(&g1.t, A);
        let d = good(exec(&g1.t, A, &rtpg(false, 1024), &[]));
        assert_eq!(groups_of(&d), vec![(1, 0), (2, 2)]);
        // Extended header, and the allocation length.
        let x = good(exec(&g1.t, A, &rtpg(true, 1024), &[]));
        assert_eq!((x[4], x.len()), (0x10, d.len() + 4));
        assert_eq!(good(exec(&g1.t, A, &rtpg(true, 6), &[])), x[..6]);
        // Standby gateway: no media access, management commands served.
        check(&write(&g2, A), key::NOT_READY, 0x04, 0x0b);
        check(
            &exec(&g2.t, A, &cdb10(0x28, 0, 0, 1), &[]),
            key::NOT_READY,
            0x04,
            0x0b,
        );
        check(&exec(&g2.t, A, &[0; 6], &[]), key::NOT_READY, 0x04, 0x0b);
        good(exec(&g2.t, A, &[0x12, 0, 0, 0, 96, 0], &[]));
        good(exec(&g2.t, A, &rtpg(false, 1024), &[]));
        // STPG through gateway 2: group 2 optimized, group 1 demoted.
        let (cdb, p) = stpg(2, 0);
        good(exec(&g2.t, B, &cdb, &p));
        assert_eq!(g2.lu.alua_state(), AluaState::ActiveOptimized);
        assert_eq!(g1.lu.alua_state(), AluaState::ActiveNonOptimized);
        check(&write(&g1, A), key::UNIT_ATTENTION, 0x2a, 0x06);
        check(&write(&g2, A), key::UNIT_ATTENTION, 0x2a, 0x06);
        good(write(&g2, B)); // the nexus that asked is not told
        let d = good(exec(&g1.t, A, &rtpg(false, 1024), &[]));
        assert_eq!(groups_of(&d), vec![(1, 1), (2, 0)]);
        good(write(&g1, A));
        // Unknown group, unsupported state: nothing changes.
        for (cdb, p) in [stpg(9, 0), stpg(1, 3), stpg(1, 0x0f)] {
            check(&exec(&g1.t, A, &cdb, &p), key::ILLEGAL_REQUEST, 0x26, 0);
        }
        assert_eq!(g1.lu.alua_state(), AluaState::ActiveNonOptimized);
    }

    #[test]
    fn a_corrupt_blob_is_a_sense_not_a_panic() {
        let shared = MemoryShared::new();
        let ram = ram();
        let g1 = gateway(
            &ram,
            Arc::new(shared.handle()),
            1,
            AluaState::ActiveOptimized,
        );
        let raw = shared.handle();
        raw.store(PR_BLOB, b"ethersan-pr 1\nreg zz 1 0 a -\n", 0)
            .unwrap()
            .unwrap();
        raw.publish(PR_BLOB).unwrap();
        let r = exec(&g1.t, A, &[0x5e, 0, 0, 0, 0, 0, 0, 0x10, 0, 0], &[]);
        check(&r, key::HARDWARE_ERROR, 0x44, 0);
        check(&pro(&g1, A, 0, 0, 0, 0xa, 0), key::HARDWARE_ERROR, 0x44, 0);
        let v = raw.load(ALUA_BLOB).unwrap().version;
        raw.store(ALUA_BLOB, b"\xff\xfe", v).unwrap().unwrap();
        let (cdb, p) = stpg(1, 1);
        check(&exec(&g1.t, A, &cdb, &p), key::HARDWARE_ERROR, 0x44, 0);
        // RTPG answers from what the gateway last knew.
        good(exec(&g1.t, A, &rtpg(false, 1024), &[]));
        good(write(&g1, A));
    }

    #[test]
    fn a_local_store_has_one_group() {
        let (t, _) = target(512);
        let d = good(exec(&t, A, &rtpg(false, 1024), &[]));
        assert_eq!(d, vec![0, 0, 0, 12, 0, 0x0f, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]);
        let (cdb, p) = stpg(1, 2);
        good(exec(&t, A, &cdb, &p));
        check(&exec(&t, B, &[0; 6], &[]), key::UNIT_ATTENTION, 0x2a, 0x06);
        check(&exec(&t, B, &[0; 6], &[]), key::NOT_READY, 0x04, 0x0b);
        let (cdb, p) = stpg(1, 0);
        good(exec(&t, A, &cdb, &p));
        good(exec(&t, A, &[0; 6], &[]));
        // A short parameter list.
        check(&exec(&t, A, &cdb, &p[..4]), key::ILLEGAL_REQUEST, 0x1a, 0);
    }

    /// A store that compares-and-writes and writes-same itself, and can
    /// time out.
    #[derive(Debug)]
    struct Offloading {
        ram: RamDevice,
        calls: Mutex<Vec<&'static str>>,
        timing_out: std::sync::atomic::AtomicBool,
    }

    impl BlockDevice for Offloading {
        fn block_size(&self) -> u32 {
            self.ram.block_size()
        }
        fn num_blocks(&self) -> u64 {
            self.ram.num_blocks()
        }
        fn submit(&self, req: IoRequest, done: IoCompletion) -> Submission {
            if self.timing_out.load(Ordering::SeqCst) {
                let e = std::io::Error::from_raw_os_error(110);
                return Submission::Done(Err(req.error(e)));
            }
            self.ram.submit(req, done)
        }
        fn compare_and_write(
            &self,
            offset: u64,
            compare: &[u8],
            write: &[u8],
            fua: bool,
        ) -> Result<Option<u64>, BackendError> {
            use ethersan_backend::BlockDeviceExt;
            self.calls.lock().unwrap().push("caw");
            let mut now = vec![0u8; compare.len()];
            self.ram.read_at(offset, &mut now)?;
            if let Some(i) = now.iter().zip(compare).position(|(a, b)| a != b) {
                return Ok(Some(i as u64));
            }
            self.ram.write_at(offset, write, fua).map(|()| None)
        }
        fn write_same(
            &self,
            offset: u64,
            len: u64,
            block: &[u8],
            fua: bool,
        ) -> Result<(), BackendError> {
            use ethersan_backend::BlockDeviceExt;
            self.calls.lock().unwrap().push("ws");
            let data: Vec<u8> = block.iter().copied().cycle().take(len as usize).collect();
            self.ram.write_at(offset, &data, fua)
        }
        fn describe(&self) -> String {
            "offloading".into()
        }
    }

    #[test]
    fn the_store_compares_and_writes_and_timeouts_are_retryable() {
        let dev = Arc::new(Offloading {
            ram: RamDevice::new(DEV_BYTES, 512).unwrap(),
            calls: Mutex::new(Vec::new()),
            timing_out: std::sync::atomic::AtomicBool::new(false),
        });
        let t = target_over_dev(dev.clone());
        // WRITE SAME(10) of one block pattern over 4 blocks.
        let mut ws = cdb10(0x41, 0, 4, 4);
        ws[1] = 0;
        good(exec(&t, A, &ws, &[9u8; 512]));
        assert_eq!(
            good(exec(&t, A, &cdb10(0x28, 0, 4, 4), &[])),
            vec![9u8; 2048]
        );
        // COMPARE AND WRITE: equal, then a miscompare at byte 3.
        let mut caw = cdb16(0x89, 0, 4, 0);
        caw[13] = 1;
        let mut data = vec![9u8; 512];
        data.extend_from_slice(&[5u8; 512]);
        good(exec(&t, A, &caw, &data));
        let mut wrong = vec![5u8; 512];
        wrong[3] = 0;
        wrong.extend_from_slice(&[6u8; 512]);
        let r = exec(&t, A, &caw, &wrong);
        check(&r, key::MISCOMPARE, 0x1d, 0);
        assert_eq!(
            &r.sense[3..7],
            &[0, 0, 0, 3],
            "INFORMATION: the first differing byte"
        );
        assert_eq!(*dev.calls.lock().unwrap(), ["ws", "caw", "caw"]);
        // A store that does not answer: ABORTED COMMAND, retryable.
        dev.timing_out.store(true, Ordering::SeqCst);
        check(
            &exec(&t, A, &cdb10(0x28, 0, 0, 1), &[]),
            key::ABORTED_COMMAND,
            0x08,
            0x01,
        );
    }

    fn target_over_dev(dev: Arc<dyn BlockDevice>) -> ScsiTarget {
        let t = ScsiTarget::new(vec![Arc::new(LogicalUnit::new(dev, config(false, false)))]);
        t.nexus_added(A);
        settle(&t, A);
        t
    }

    #[test]
    fn a_logical_unit_reset_reaches_every_gateway() {
        let shared = MemoryShared::new();
        let ram = ram();
        let (g1, g2) = two_gateways(&ram, &shared);
        g1.t.reset(crate::ResetKind::LogicalUnit, Some(0), A);
        check(
            &exec(&g1.t, B, &[0; 6], &[]),
            key::UNIT_ATTENTION,
            0x29,
            0x03,
        );
        // Gateway 2 learns of it shortly after (the notice has a thread).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        for n in [A, B] {
            loop {
                let r = exec(&g2.t, n, &[0; 6], &[]);
                if r.status != ScsiStatus::Good {
                    check(&r, key::UNIT_ATTENTION, 0x29, 0x03);
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "no reset notice");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        // Only once, and not back at gateway 1.
        good(exec(&g2.t, A, &[0; 6], &[]));
        good(exec(&g1.t, B, &[0; 6], &[]));
    }

    #[test]
    fn vpd_0x83_names_this_gateways_port_and_group() {
        let shared = MemoryShared::new();
        let g = gateway(
            &ram(),
            Arc::new(shared.handle()),
            7,
            AluaState::ActiveOptimized,
        );
        let d = good(exec(&g.t, A, &[0x12, 1, 0x83, 1, 0, 0], &[]));
        let mut found = Vec::new();
        let mut at = 4;
        while at + 4 <= d.len() {
            let len = usize::from(d[at + 3]);
            found.push((d[at], d[at + 1], d[at + 4..at + 4 + len].to_vec()));
            at += 4 + len;
        }
        assert!(
            found.contains(&(0x51, 0x94, vec![0, 0, 0, 7])),
            "{found:x?}"
        );
        assert!(
            found.contains(&(0x51, 0x95, vec![0, 0, 0, 7])),
            "{found:x?}"
        );
        assert_eq!(found.len(), 5, "NAA, T10, port, group, SCSI name");
        // TPGS = 11b in the standard data.
        let std = good(exec(&g.t, A, &[0x12, 0, 0, 0, 96, 0], &[]));
        assert_eq!(std[5] & 0x30, 0x30);
    }
}
