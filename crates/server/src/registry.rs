//! What the server exports and who is logged in: targets, portals and
//! live sessions. Sessions consult it at login, logout and on resets that
//! reach beyond one session; never on the data path.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use ethersan_core::directory::Directory;

use crate::portal::PortalInfo;

/// The I_T nexus identifier of a session: a stable hash of (initiator
/// name, ISID, target), so a reinstated session maps to the same nexus.
pub(crate) fn nexus_key(initiator: &str, isid: &[u8; 6], target: Option<&str>) -> u64 {
    stable_hash(&[initiator.as_bytes(), isid, target.unwrap_or("").as_bytes()])
}

/// FNV-1a over the parts, each followed by a 0xff separator: stable across
/// runs and versions (identifiers derived from it are persistent).
pub(crate) fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.iter().chain(std::iter::once(&0xffu8)) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// One exported target: the target core's live entry.
pub use ethersan_core::directory::Target as TargetEntry;

impl ethersan_core::directory::TargetAccess for crate::config::Access {
    fn allows(&self, initiator: &str, addr: Option<std::net::IpAddr>) -> bool {
        crate::config::Access::allows(self, initiator, addr)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A target's access rules, replaced while it serves (a grant or a
/// revoke through the management API or a reload): logins read the rules
/// of the moment.
#[derive(Debug)]
pub struct LiveAccess(arc_swap::ArcSwap<crate::config::Access>);

impl LiveAccess {
    /// Rules starting as `access`.
    pub fn new(access: crate::config::Access) -> Self {
        LiveAccess(arc_swap::ArcSwap::from_pointee(access))
    }

    /// The rules now.
    pub fn get(&self) -> Arc<crate::config::Access> {
        self.0.load_full()
    }

    /// Replace the rules.
    pub fn set(&self, access: crate::config::Access) {
        self.0.store(Arc::new(access));
    }

    /// The live rules of a target built by this server, if they are.
    pub fn of(target: &TargetEntry) -> Option<&LiveAccess> {
        target.access.as_any().downcast_ref::<LiveAccess>()
    }
}

impl ethersan_core::directory::TargetAccess for LiveAccess {
    fn allows(&self, initiator: &str, addr: Option<std::net::IpAddr>) -> bool {
        self.0.load().allows(initiator, addr)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn initiator_names(&self) -> Vec<String> {
        self.0.load().initiator_names()
    }
}

/// How the registry reaches a session: delivers a control message to it
/// (a message to a session that has ended is dropped).
pub(crate) type Mailbox = Arc<dyn Fn(SessionControl) + Send + Sync>;

/// Messages one session sends another through the registry.
#[derive(Debug)]
pub enum SessionControl {
    /// Abort (silently) the tasks on this LUN, or on every LUN. The
    /// waiter, when there is one, is dropped once the aborted tasks that
    /// were running have finished (or the session has ended), which tells
    /// the session whose task management request asked for the abort.
    AbortLun(Option<u64>, Option<AbortWaiter>),
    /// One of the sessions asked to abort tasks for this session's task
    /// management request (its ITT) has finished them.
    OthersAborted(u32),
    /// End the session (reinstatement, cold reset, server shutdown),
    /// for the reason given (the session's end line says it).
    Shutdown(&'static str),
}

/// Held by a session that aborted tasks for another session's task
/// management request until those tasks have finished; dropping it
/// reports to the requester (SAM-5 §7: the function is complete only when
/// every task it aborted has ended, in every I_T nexus).
pub struct AbortWaiter {
    requester: Mailbox,
    itt: u32,
}

impl std::fmt::Debug for AbortWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortWaiter")
            .field("itt", &self.itt)
            .finish()
    }
}

impl Drop for AbortWaiter {
    fn drop(&mut self) {
        (self.requester)(SessionControl::OthersAborted(self.itt));
    }
}

struct SessionHandle {
    target: Option<String>,
    initiator: String,
    isid: [u8; 6],
    tsih: u16,
    tx: Mailbox,
    /// Filled in once the session has started (after its login).
    details: Option<SessionDetails>,
}

/// What a running session shows the management plane.
#[derive(Debug, Clone)]
pub struct SessionDetails {
    /// Where the initiator connected from (`IP:PORT`, a MAC address, …).
    pub address: String,
    /// The transport: `iscsi` (TCP) or `native` (ethersan's channels).
    pub transport: &'static str,
    /// The native channel's security level, when the transport is native.
    pub channel_level: Option<u8>,
    /// What login negotiated.
    pub params: ethersan_proto::negotiate::SessionParams,
    /// The session's own command counters.
    pub counters: Arc<ethersan_core::counters::IoCounters>,
    /// When the session started.
    pub started: std::time::SystemTime,
}

/// One live session as [`Registry::sessions`] lists it.
#[derive(Debug, Clone)]
pub struct SessionView {
    /// The registry's session id (what `ctl session logout ID` takes).
    pub id: u64,
    /// The target, or `None` for a discovery session.
    pub target: Option<String>,
    /// The initiator's name.
    pub initiator: String,
    /// The initiator's session id.
    pub isid: [u8; 6],
    /// The target's session handle.
    pub tsih: u16,
    /// The rest, once the session has started.
    pub details: Option<SessionDetails>,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle")
            .field("target", &self.target)
            .field("initiator", &self.initiator)
            .field("isid", &self.isid)
            .field("tsih", &self.tsih)
            .finish_non_exhaustive()
    }
}

/// The server's shared directory of targets and sessions.
#[derive(Debug)]
pub struct Registry {
    directory: Arc<Directory>,
    /// The live portals (the `portals` module keeps this list).
    portals: RwLock<Vec<PortalInfo>>,
    /// Connections in the login phase, over every portal and the native
    /// transport.
    logins: Arc<crate::limits::LoginLimiter>,
    portal_group_tag: u16,
    sessions: Mutex<HashMap<u64, SessionHandle>>,
    next_id: AtomicU64,
    /// Failed authentications per (initiator name, source address).
    auth: crate::limits::AuthThrottle,
    /// Login refusal lines, limited per (peer, reason), so a
    /// password-guessing flood cannot flood the log.
    refusal_log: crate::limits::RefusalLog,
    /// Logins, their failures by reason, open connections.
    login_stats: Arc<crate::stats::LoginStats>,
}

impl Registry {
    /// A registry for these targets, reachable through these portals
    /// (none advertising another address), with no cap on connections in
    /// login.
    pub fn new(targets: Vec<Arc<TargetEntry>>, portals: Vec<SocketAddr>) -> Self {
        Registry::with_login_limit(targets, portals, 0)
    }

    /// PREEMPT AND ABORT through another gateway (a store several gateways
    /// export): the preempted nexuses' tasks on `target`'s LUNs are
    /// aborted here at once, in their sessions, which also get COMMANDS
    /// CLEARED BY ANOTHER INITIATOR (a preemption through this gateway
    /// does the same from the session that ran it). Call again after LUNs
    /// are added.
    pub fn follow_preempts(self: &Arc<Self>, target_name: &str) {
        let Some(target) = self.target(target_name) else {
            return;
        };
        for (lun, slot) in target.scsi.luns().iter() {
            let registry = Arc::downgrade(self);
            let scsi = Arc::downgrade(&target.scsi);
            let (name, lun) = (target.name.clone(), *lun);
            slot.lu.set_preempt_listener(Arc::new(move |victims: Vec<ethersan_scsi::Nexus>| {
                let (Some(registry), Some(scsi)) = (registry.upgrade(), scsi.upgrade()) else {
                    return;
                };
                for victim in victims {
                    // No session of this gateway asked (0 is no session id).
                    let asked = registry.abort_nexus_lun(0, Some(&name), victim.0, lun);
                    // The preempting nexus is on another gateway: none here.
                    scsi.tasks_cleared(lun, victim, ethersan_scsi::Nexus(u64::MAX));
                    tracing::debug!(target = %name, lun, sessions = asked, "PREEMPT AND ABORT through another gateway: tasks aborted");
                }
            }));
        }
    }

    /// The portal group tag every portal announces (the gateway's ALUA
    /// target port group id; default 1).
    pub fn with_portal_group_tag(mut self, tag: u16) -> Self {
        self.portal_group_tag = tag;
        self
    }

    /// [`Registry::new`] with at most `max_logins` connections in the
    /// login phase at once (0: no limit).
    pub fn with_login_limit(
        targets: Vec<Arc<TargetEntry>>,
        portals: Vec<SocketAddr>,
        max_logins: usize,
    ) -> Self {
        let portals = portals
            .into_iter()
            .map(|address| PortalInfo {
                address,
                advertise: None,
            })
            .collect();
        Registry {
            directory: Arc::new(Directory::new(targets)),
            portals: RwLock::new(portals),
            logins: crate::limits::LoginLimiter::new(max_logins),
            portal_group_tag: 1,
            sessions: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            auth: crate::limits::AuthThrottle::default(),
            refusal_log: crate::limits::RefusalLog::default(),
            login_stats: Arc::default(),
        }
    }

    /// The live directory of targets and LUNs.
    pub fn directory(&self) -> &Arc<Directory> {
        &self.directory
    }

    /// A snapshot of the exported targets.
    pub fn targets(&self) -> Arc<Vec<Arc<TargetEntry>>> {
        self.directory.targets()
    }

    /// The portal group tag of every portal.
    pub fn portal_group_tag(&self) -> u16 {
        self.portal_group_tag
    }

    /// Look at every LUN's backing store size again (SIGHUP): a LUN whose
    /// file or device grew (or shrank) reports the new capacity, and every
    /// session gets CAPACITY DATA HAS CHANGED on it.
    pub fn rescan_capacity(&self) {
        for t in self.directory.targets().iter() {
            for (i, slot) in t.scsi.luns().iter() {
                match slot.lu.rescan_capacity() {
                    Ok(Some(blocks)) => {
                        tracing::info!(target = %t.name, lun = i, blocks, "capacity changed")
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(target = %t.name, lun = i, error = %e, "cannot read the backing store's size")
                    }
                }
            }
        }
    }

    /// Find a target by name.
    pub fn target(&self, name: &str) -> Option<Arc<TargetEntry>> {
        self.directory.target(name)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, SessionHandle>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The back-off after failed authentications.
    pub(crate) fn auth_throttle(&self) -> &crate::limits::AuthThrottle {
        &self.auth
    }

    /// Logins, login failures by reason and open connections since the
    /// server started.
    pub fn login_stats(&self) -> &Arc<crate::stats::LoginStats> {
        &self.login_stats
    }

    /// How many (initiator name, address) pairs the authentication
    /// back-off remembers failures of now.
    pub fn auth_throttled(&self) -> usize {
        self.auth.len()
    }

    /// The rate limit of login refusal lines.
    pub(crate) fn refusal_log(&self) -> &crate::limits::RefusalLog {
        &self.refusal_log
    }

    /// Number of live sessions.
    pub fn session_count(&self) -> usize {
        self.lock().len()
    }

    /// Register a new session; a live session with the same initiator,
    /// ISID and target is shut down first (session reinstatement, §6.3.5).
    /// Returns the session id and its TSIH.
    pub(crate) fn add_session(
        &self,
        target: Option<&str>,
        initiator: &str,
        isid: [u8; 6],
        tx: Mailbox,
    ) -> (u64, u16) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let tsih = ((id % 0xfffe) + 1) as u16;
        let mut s = self.lock();
        let old: Vec<u64> = s
            .iter()
            .filter(|(_, h)| {
                h.initiator == initiator && h.isid == isid && h.target.as_deref() == target
            })
            .map(|(k, _)| *k)
            .collect();
        for k in old {
            if let Some(h) = s.remove(&k) {
                (h.tx)(SessionControl::Shutdown(
                    "reinstated: the initiator logged in again with the same ISID",
                ));
            }
        }
        s.insert(
            id,
            SessionHandle {
                target: target.map(str::to_string),
                initiator: initiator.to_string(),
                isid,
                tsih,
                tx,
                details: None,
            },
        );
        (id, tsih)
    }

    /// Record what a session that has just started looks like.
    pub(crate) fn describe_session(&self, id: u64, details: SessionDetails) {
        if let Some(h) = self.lock().get_mut(&id) {
            h.details = Some(details);
        }
    }

    /// Every live session, ordered by id.
    pub fn sessions(&self) -> Vec<SessionView> {
        let mut v: Vec<SessionView> = self
            .lock()
            .iter()
            .map(|(id, h)| SessionView {
                id: *id,
                target: h.target.clone(),
                initiator: h.initiator.clone(),
                isid: h.isid,
                tsih: h.tsih,
                details: h.details.clone(),
            })
            .collect();
        v.sort_by_key(|s| s.id);
        v
    }

    /// End session `id` (its connection is closed; commands in flight
    /// finish first). An initiator that recovers sessions logs in again.
    /// Returns whether there was such a session.
    pub fn end_session(&self, id: u64) -> bool {
        match self.lock().get(&id) {
            Some(h) => {
                (h.tx)(SessionControl::Shutdown(
                    "ended by the administrator (session logout)",
                ));
                true
            }
            None => false,
        }
    }

    /// End the sessions of `target` that `allowed` no longer admits
    /// (after its access list changed); returns them, as `INITIATOR from
    /// ADDRESS`.
    pub fn end_sessions_not_allowed(
        &self,
        target: &str,
        allowed: &dyn Fn(&str, Option<std::net::IpAddr>) -> bool,
    ) -> Vec<String> {
        let mut ended = Vec::new();
        for h in self.lock().values() {
            if h.target.as_deref() != Some(target) {
                continue;
            }
            let addr = h.details.as_ref().map(|d| d.address.as_str());
            let ip = addr
                .and_then(|a| a.parse::<SocketAddr>().ok())
                .map(|a| a.ip());
            if !allowed(&h.initiator, ip) {
                (h.tx)(SessionControl::Shutdown(
                    "no longer allowed by the target's access rules",
                ));
                ended.push(match addr {
                    Some(a) => format!("{} from {a}", h.initiator),
                    None => h.initiator.clone(),
                });
            }
        }
        ended
    }

    /// How many sessions are logged in to `target`.
    pub fn sessions_of(&self, target: &str) -> usize {
        self.lock()
            .values()
            .filter(|h| h.target.as_deref() == Some(target))
            .count()
    }

    /// Whether a session with this TSIH exists (for logins adding a connection).
    pub(crate) fn has_tsih(&self, tsih: u16) -> bool {
        self.lock().values().any(|h| h.tsih == tsih)
    }

    /// Forget a session.
    pub(crate) fn remove_session(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Ask every other session of `target` to abort its tasks on `lun`
    /// (`None`: all LUNs) for task management request `itt` of session
    /// `me`; each reports back with [`SessionControl::OthersAborted`] once
    /// its aborted tasks have finished. Returns how many were asked.
    pub(crate) fn abort_lun_others(
        &self,
        me: u64,
        target: Option<&str>,
        lun: Option<u64>,
        itt: u32,
    ) -> usize {
        let sessions = self.lock();
        let Some(requester) = sessions.get(&me).map(|h| h.tx.clone()) else {
            return 0;
        };
        let mut asked = 0;
        for (id, h) in sessions.iter() {
            if *id != me && h.target.as_deref() == target && target.is_some() {
                let waiter = AbortWaiter {
                    requester: requester.clone(),
                    itt,
                };
                (h.tx)(SessionControl::AbortLun(lun, Some(waiter)));
                asked += 1;
            }
        }
        asked
    }

    /// Ask the sessions of I_T nexus `nexus` on `target` to abort their
    /// tasks on `lun` (PREEMPT AND ABORT). Returns how many were asked.
    pub(crate) fn abort_nexus_lun(
        &self,
        me: u64,
        target: Option<&str>,
        nexus: u64,
        lun: u64,
    ) -> usize {
        let mut asked = 0;
        for (id, h) in self.lock().iter() {
            if *id != me
                && target.is_some()
                && h.target.as_deref() == target
                && nexus_key(&h.initiator, &h.isid, h.target.as_deref()) == nexus
            {
                (h.tx)(SessionControl::AbortLun(Some(lun), None));
                asked += 1;
            }
        }
        asked
    }

    /// End every other session of `target` (TARGET COLD RESET).
    pub(crate) fn shutdown_target_others(&self, me: u64, target: Option<&str>) {
        for (id, h) in self.lock().iter() {
            if *id != me && h.target.as_deref() == target && target.is_some() {
                (h.tx)(SessionControl::Shutdown(
                    "another session reset the target (TARGET COLD RESET)",
                ));
            }
        }
    }

    /// Stop exporting a target: new logins and discovery no longer find
    /// it, and every session logged in to it ends.
    pub fn remove_target(
        &self,
        name: &str,
    ) -> Result<Arc<TargetEntry>, ethersan_core::directory::DirectoryError> {
        let t = self.directory.remove_target(name)?;
        for h in self.lock().values() {
            if h.target.as_deref() == Some(name) {
                (h.tx)(SessionControl::Shutdown("target removed"));
            }
        }
        Ok(t)
    }

    /// End every session (server shutdown).
    pub fn shutdown_all(&self) {
        for h in self.lock().values() {
            (h.tx)(SessionControl::Shutdown("server shutting down"));
        }
    }

    /// `TargetAddress` values for every live portal, `addr:port,tpgt` with
    /// IPv6 addresses in brackets (§13.8), for an initiator whose
    /// connection came in on `local` (see [`PortalInfo::announced`]): a
    /// portal's advertised address when it has one, else the address it
    /// listens on, and for a wildcard portal (`0.0.0.0`, `[::]`) `local`'s
    /// address or, without `local`, the host's addresses.
    pub fn target_addresses(&self, local: Option<SocketAddr>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for p in self
            .portals
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            for a in p.announced(local) {
                let value = format!("{a},{}", self.portal_group_tag);
                if !out.contains(&value) {
                    out.push(value);
                }
            }
        }
        out
    }

    /// The live portals: where each listens and what it is advertised as.
    pub fn portals(&self) -> Vec<PortalInfo> {
        self.portals
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The addresses the live portals listen on (bound, with their real
    /// ports), in the order they were added.
    pub fn portal_addrs(&self) -> Vec<SocketAddr> {
        self.portals
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|p| p.address)
            .collect()
    }

    /// The live portals as the live set (`Portals`) last set them.
    pub(crate) fn set_portals(&self, portals: Vec<PortalInfo>) {
        *self.portals.write().unwrap_or_else(|e| e.into_inner()) = portals;
    }

    /// The cap on connections in the login phase, and their count.
    pub fn logins(&self) -> &Arc<crate::limits::LoginLimiter> {
        &self.logins
    }

    /// Answer a SendTargets text request (RFC 7143 Appendix C): `All` lists
    /// every target, a name lists that target, an empty value lists the
    /// session's own target. `local` is the target's end of the asking
    /// connection (it names wildcard portals; see
    /// [`Registry::target_addresses`]).
    pub(crate) fn send_targets(
        &self,
        query: &str,
        own: Option<&TargetEntry>,
        initiator: &str,
        peer_ip: Option<std::net::IpAddr>,
        local: Option<SocketAddr>,
    ) -> Vec<(String, String)> {
        let targets = self.directory.targets();
        let chosen: Vec<&TargetEntry> = match query {
            "All" => targets.iter().map(|t| t.as_ref()).collect(),
            "" => own.into_iter().collect(),
            name => targets
                .iter()
                .filter(|t| t.name == name)
                .map(|t| t.as_ref())
                .collect(),
        };
        let addrs = self.target_addresses(local);
        let mut out = Vec::new();
        // Only targets this initiator may log in to.
        for t in chosen
            .into_iter()
            .filter(|t| t.access.allows(initiator, peer_ip))
        {
            out.push(("TargetName".to_string(), t.name.clone()));
            for a in &addrs {
                out.push(("TargetAddress".to_string(), a.clone()));
            }
        }
        out
    }
}
