//! Applying a changed configuration to a running server (SIGHUP with
//! `serve --config FILE`).
//!
//! Everything that can change without a restart does, and nothing else
//! is touched: targets come and go (a removed target's sessions end),
//! LUNs are added, removed or replaced live (initiators see REPORTED LUNS
//! DATA HAS CHANGED), a target's initiator and network lists change live
//! (sessions the new rules no longer admit end), a target whose alias
//! changes is rebuilt (its sessions end and log in again), and
//! CHAP and login negotiation settings apply to the logins after the
//! reload. Portals (and their advertised addresses) change live: new
//! ones listen, removed ones stop accepting (their sessions go on). Worker
//! threads and the other `[options]` need a restart; a reload that
//! changes them says so and leaves them.
//!
//! A reload is all or nothing: every backing store it needs is opened
//! before anything changes, so a bad file or a missing disk leaves the
//! server as it was.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use ethersan_proto::negotiate::TargetSettings;
use ethersan_scsi::LunSlot;
use tracing::warn;

use crate::config::{Config, TargetConfig};
use crate::portals::Portals;
use crate::registry::{Registry, TargetEntry};
use crate::{build_target, open_lun, target_settings, ServerError};

/// Applies configurations to one running server.
pub struct Reloader {
    registry: Arc<Registry>,
    settings: Arc<ArcSwap<TargetSettings>>,
    portals: Portals,
    /// The configuration being served.
    current: Mutex<Config>,
}

/// What a reload did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// The changes made, one line each (`added target …`, `LUN 2 of … replaced`).
    pub changed: Vec<String>,
    /// Changes in the file that need a restart and were not made.
    pub needs_restart: Vec<String>,
}

/// One change to a target's LUNs, prepared (stores open) before any is made.
enum LunChange {
    Add(u64, LunSlot),
    Remove(u64),
    Replace(u64, LunSlot),
    /// Grow (or shrink) the store to this many bytes, live.
    Resize(u64, u64),
}

/// One change to the targets, prepared.
enum TargetChange {
    Add(TargetEntry),
    Remove(String),
    Rebuild(TargetEntry),
    /// New initiator or network lists, applied live.
    Access(String, crate::config::Access),
    Luns(String, Vec<LunChange>),
}

impl Reloader {
    pub(crate) fn new(
        registry: Arc<Registry>,
        settings: Arc<ArcSwap<TargetSettings>>,
        portals: Portals,
        current: Config,
    ) -> Reloader {
        Reloader {
            registry,
            settings,
            portals,
            current: Mutex::new(current),
        }
    }

    /// Make the running server serve `new`. On an error nothing changed.
    pub fn apply(&self, new: Config) -> Result<ReloadReport, ServerError> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        self.apply_to(&mut current, new)
    }

    /// The server's live portals.
    pub fn portals(&self) -> &Portals {
        &self.portals
    }

    /// The configuration being served (as the last change left it).
    pub fn current(&self) -> Config {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Change the configuration being served with `edit` and apply the
    /// result, as one step (no other change comes between): the
    /// management API's way in. `edit` refusing leaves everything as it was.
    pub fn update<E>(
        &self,
        edit: impl FnOnce(&mut Config) -> Result<(), E>,
    ) -> Result<ReloadReport, E>
    where
        E: From<ServerError>,
    {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let mut new = current.clone();
        edit(&mut new)?;
        Ok(self.apply_to(&mut current, new)?)
    }

    fn apply_to(&self, current: &mut Config, new: Config) -> Result<ReloadReport, ServerError> {
        let mut report = ReloadReport::default();
        // The iSNS task starts with the server; it follows the targets
        // and ACLs live, not its own settings. (A file without [isns] is
        // not a change: `serve --isns` may have given it.)
        if new.isns.is_some() && new.isns != current.isns {
            report.needs_restart.push("[isns]".into());
        }
        // The NVMe/TCP portals are bound at start (its subsystems and
        // namespaces follow the targets and LUNs live).
        if new.nvme != current.nvme {
            report.needs_restart.push("[nvme]".into());
        }
        // Options other than the login settings are read when the server
        // starts (threads, limits, timeouts, the data directory).
        if format!("{:?}", new.options) != format!("{:?}", current.options) {
            report.needs_restart.push("[options]".into());
        }
        // The AoE link task holds each exported LUN's volume, size and
        // read-only flag as they were at start: any change to the targets
        // (or to [aoe]) reaches AoE only with a restart.
        if (!current.aoe.links.is_empty() || !new.aoe.links.is_empty())
            && (new.aoe != current.aoe
                || format!("{:?}", new.targets) != format!("{:?}", current.targets))
        {
            report
                .needs_restart
                .push("the AoE exports ([aoe], and targets and LUNs as AoE sees them)".into());
        }
        let options = current.options.clone();
        // The locks of the LUNs this reload takes away or replaces: a store
        // the new configuration opens again (a LUN whose options change, a
        // target rebuilt) keeps its lock instead of finding it held by the
        // LUN it replaces.
        let released = &mut self.released_locks(current, &new);
        // Prepare: open every store the new configuration adds or changes.
        let old: BTreeMap<&str, &TargetConfig> = current
            .targets
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        let mut changes = Vec::new();
        for t in &new.targets {
            match old.get(t.name.as_str()) {
                None => changes.push(TargetChange::Add(build_target(t, &options, released)?)),
                Some(o) if o.alias != t.alias => {
                    changes.push(TargetChange::Rebuild(build_target(t, &options, released)?))
                }
                Some(o) => {
                    if o.access.rules != t.access.rules {
                        changes.push(TargetChange::Access(t.name.clone(), t.access.clone()));
                    }
                    let mut luns = Vec::new();
                    let before: BTreeMap<u64, usize> = o.numbered().into_iter().collect();
                    let after: BTreeMap<u64, usize> = t.numbered().into_iter().collect();
                    let numbers: std::collections::BTreeSet<u64> =
                        before.keys().chain(after.keys()).copied().collect();
                    for n in numbers {
                        match (before.get(&n), after.get(&n)) {
                            (Some(_), None) => luns.push(LunChange::Remove(n)),
                            (None, Some(&i)) => {
                                luns.push(LunChange::Add(n, open_lun(t, i, &options, released)?))
                            }
                            (Some(&a), Some(&b))
                                if !same_store(&o.luns[a], &t.luns[b])
                                    || lun_policy(o, a) != lun_policy(t, b) =>
                            {
                                luns.push(LunChange::Replace(
                                    n,
                                    open_lun(t, b, &options, released)?,
                                ))
                            }
                            (Some(&a), Some(&b)) => {
                                if let Some(bytes) = resized(&o.luns[a], &t.luns[b]) {
                                    luns.push(LunChange::Resize(n, bytes));
                                }
                            }
                            _ => {}
                        }
                    }
                    if !luns.is_empty() {
                        changes.push(TargetChange::Luns(t.name.clone(), luns));
                    }
                }
            }
        }
        for o in &current.targets {
            if !new.targets.iter().any(|t| t.name == o.name) {
                changes.push(TargetChange::Remove(o.name.clone()));
            }
        }
        // The new portals listen before anything else changes (one that
        // cannot leaves the server as it was); the old ones close after.
        let removed_portals = self.add_portals(current, &new, &mut report)?;
        // Commit.
        for c in changes {
            match c {
                TargetChange::Add(t) => {
                    report.changed.push(format!("added target {}", t.name));
                    self.add_target(t);
                }
                TargetChange::Remove(name) => {
                    report.changed.push(format!("removed target {name}"));
                    self.remove_target(&name);
                }
                TargetChange::Access(name, access) => {
                    let Some(t) = self.registry.target(&name) else {
                        continue;
                    };
                    let Some(live) = crate::registry::LiveAccess::of(&t) else {
                        continue;
                    };
                    let before = live.get();
                    live.set(access.clone());
                    let ended = self
                        .registry
                        .end_sessions_not_allowed(&name, &|i, ip| access.allows(i, ip));
                    report
                        .changed
                        .push(access_change(&name, &before, &access, &ended));
                }
                TargetChange::Rebuild(t) => {
                    report.changed.push(format!(
                        "target {}: alias changed; its sessions were ended to apply it",
                        t.name
                    ));
                    self.remove_target(&t.name);
                    self.add_target(t);
                }
                TargetChange::Luns(name, luns) => {
                    let Some(t) = self.registry.target(&name) else {
                        continue;
                    };
                    for l in luns {
                        match l {
                            LunChange::Add(n, slot) => {
                                report.changed.push(format!("target {name}: added LUN {n}"));
                                if let Err(e) = t.add_lun(n, slot) {
                                    warn!("target {name}: cannot add LUN {n}: {e}");
                                }
                            }
                            LunChange::Remove(n) => {
                                report
                                    .changed
                                    .push(format!("target {name}: removed LUN {n}"));
                                remove_lun(&t, n);
                            }
                            LunChange::Resize(n, bytes) => match t.resize_lun(n, bytes) {
                                Ok(Some(blocks)) => report.changed.push(format!(
                                    "target {name}: LUN {n} resized to {bytes} bytes ({blocks} blocks)"
                                )),
                                Ok(None) => {}
                                Err(e) => warn!("target {name}: cannot resize LUN {n}: {e}"),
                            },
                            LunChange::Replace(n, slot) => {
                                report
                                    .changed
                                    .push(format!("target {name}: replaced LUN {n}"));
                                remove_lun(&t, n);
                                if let Err(e) = t.add_lun(n, slot) {
                                    warn!("target {name}: cannot add LUN {n}: {e}");
                                }
                            }
                        }
                    }
                    self.registry.follow_preempts(&name);
                }
            }
        }
        // Which CHAP settings changed (never the secrets): for the logins
        // from now on.
        let mut chap = Vec::new();
        if new.chap != current.chap {
            chap.push(match &new.chap {
                Some(c) => format!("global CHAP user {}", c.initiator.user),
                None => "global CHAP removed".to_string(),
            });
        }
        if new.discovery_chap != current.discovery_chap {
            chap.push("discovery CHAP".to_string());
        }
        for t in &new.targets {
            if old.get(t.name.as_str()).is_some_and(|o| o.chap != t.chap) {
                chap.push(match &t.chap {
                    crate::config::TargetChap::Chap(c) => {
                        format!("target {}: CHAP user {}", t.name, c.initiator.user)
                    }
                    crate::config::TargetChap::None => format!("target {}: no CHAP", t.name),
                    crate::config::TargetChap::Inherit => {
                        format!("target {}: the global CHAP setting", t.name)
                    }
                });
            }
        }
        if !chap.is_empty() {
            report.changed.push(format!(
                "CHAP settings (for logins from now on): {}",
                chap.join("; ")
            ));
        }
        self.finish_portals(&new, removed_portals, &mut report);
        // Login settings for the next connections: built from the new
        // file, with the options the server started with.
        let effective = Config {
            options: current.options.clone(),
            isns: current.isns.clone(),
            ..new
        };
        self.settings.store(Arc::new(target_settings(&effective)));
        *current = effective;
        Ok(report)
    }

    /// Listen on the portals `new` adds; returns those it removes. On an
    /// error the portals are as they were.
    fn add_portals(
        &self,
        current: &Config,
        new: &Config,
        report: &mut ReloadReport,
    ) -> Result<Vec<std::net::SocketAddr>, ServerError> {
        let mut added = Vec::new();
        for p in new.portals.iter().filter(|p| !current.portals.contains(p)) {
            match self.portals.add_now(*p, new.advertise.get(p).copied()) {
                Ok(bound) => added.push((*p, bound)),
                Err(e) => {
                    for (_, bound) in added {
                        let _ = self.portals.remove(bound);
                    }
                    return Err(match e {
                        crate::portals::PortalError::Bind { address, cause } => ServerError::Bind {
                            addr: address,
                            cause,
                        },
                        other => ServerError::Portal(other),
                    });
                }
            }
        }
        for (p, bound) in added {
            report.changed.push(match new.advertise.get(&p) {
                Some(a) => format!("added portal {bound} (advertised as {a})"),
                None => format!("added portal {bound}"),
            });
        }
        Ok(current
            .portals
            .iter()
            .filter(|p| !new.portals.contains(p))
            .copied()
            .collect())
    }

    /// Close the portals `new` removed and apply its advertised addresses
    /// to those it keeps.
    fn finish_portals(
        &self,
        new: &Config,
        removed: Vec<std::net::SocketAddr>,
        report: &mut ReloadReport,
    ) {
        for p in removed {
            match self.portals.remove(p) {
                Ok(()) => report.changed.push(format!(
                    "removed portal {p} (sessions connected through it go on)"
                )),
                Err(e) => warn!("cannot remove portal {p}: {e}"),
            }
        }
        let listed = self.portals.list();
        for p in &new.portals {
            let want = new.advertise.get(p).copied();
            let Some(now) = listed.iter().find(|i| i.address == *p) else {
                continue;
            };
            if now.advertise != want {
                match self.portals.set_advertise(*p, want) {
                    Ok(()) => report.changed.push(match want {
                        Some(a) => format!("portal {p} is advertised as {a}"),
                        None => format!("portal {p} is advertised as itself"),
                    }),
                    Err(e) => warn!("cannot change portal {p}: {e}"),
                }
            }
        }
    }

    /// The store locks of the live LUNs that `new` removes or replaces
    /// (see [`ethersan_backend::lock`]).
    fn released_locks(
        &self,
        current: &Config,
        new: &Config,
    ) -> Vec<Arc<ethersan_backend::lock::StoreLock>> {
        let mut out = Vec::new();
        for o in &current.targets {
            let Some(live) = self.registry.target(&o.name) else {
                continue;
            };
            let live = live.scsi.luns();
            let t = new
                .targets
                .iter()
                .find(|t| t.name == o.name && t.alias == o.alias);
            let after: BTreeMap<u64, usize> = t
                .map(|t| t.numbered().into_iter().collect())
                .unwrap_or_default();
            for (n, a) in o.numbered() {
                let kept = t.zip(after.get(&n)).is_some_and(|(t, &b)| {
                    same_store(&o.luns[a], &t.luns[b]) && lun_policy(o, a) == lun_policy(t, b)
                });
                if kept {
                    continue;
                }
                if let Some(l) = live.get(&n).and_then(|s| s.lu.device().store_lock()) {
                    out.push(l);
                }
            }
        }
        out
    }

    fn add_target(&self, t: TargetEntry) {
        let name = t.name.clone();
        if let Err(e) = self.registry.directory().add_target(t) {
            warn!("cannot add target {name}: {e}");
        }
        self.registry.follow_preempts(&name);
    }

    fn remove_target(&self, name: &str) {
        match self.registry.remove_target(name) {
            Ok(t) => {
                for slot in t.scsi.luns().values() {
                    flush(&slot.lu);
                }
            }
            Err(e) => warn!("cannot remove target {name}: {e}"),
        }
    }
}

/// One line saying how a target's access rules changed: the rules added
/// and removed, what the list means now, and the sessions it ended.
pub(crate) fn access_change(
    target: &str,
    before: &crate::config::Access,
    after: &crate::config::Access,
    ended: &[String],
) -> String {
    let list = |rules: Vec<&crate::config::AclRule>| {
        rules
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let added = list(
        after
            .rules
            .iter()
            .filter(|r| !before.rules.contains(r))
            .collect(),
    );
    let removed = list(
        before
            .rules
            .iter()
            .filter(|r| !after.rules.contains(r))
            .collect(),
    );
    let mut line = format!("target {target}: access rules changed:");
    if !added.is_empty() {
        line.push_str(&format!(" added {added};"));
    }
    if !removed.is_empty() {
        line.push_str(&format!(" removed {removed};"));
    }
    line.push_str(&format!(" now {}", after.meaning()));
    if !ended.is_empty() {
        line.push_str(&format!(
            "; ended {} session(s) no longer allowed: {}",
            ended.len(),
            ended.join(", ")
        ));
    }
    line
}

/// Whether two LUN configurations describe the same LUN (their number,
/// given or implied, is compared by the caller) and a store resized live
/// is not a different one.
fn same_store(a: &crate::config::LunConfig, b: &crate::config::LunConfig) -> bool {
    let strip = |l: &crate::config::LunConfig| {
        let mut l = l.clone();
        l.number = None;
        if let crate::config::Backing::File { size, .. } = &mut l.backing {
            *size = None;
        }
        l
    };
    strip(a) == strip(b)
}

/// The new size of a file LUN whose configured size changed.
fn resized(a: &crate::config::LunConfig, b: &crate::config::LunConfig) -> Option<u64> {
    use crate::config::Backing;
    match (&a.backing, &b.backing) {
        (Backing::File { size: x, .. }, Backing::File { size: Some(y), .. }) if *x != Some(*y) => {
            Some(*y)
        }
        _ => None,
    }
}

/// LUN `i`'s masks in `t`: who sees it, for whom it is read-only.
fn lun_policy(t: &TargetConfig, i: usize) -> (&[String], &[String]) {
    fn list(v: &[Vec<String>], i: usize) -> &[String] {
        v.get(i).map_or(&[], |l| l.as_slice())
    }
    (list(&t.access.luns, i), list(&t.access.read_only, i))
}

/// Take LUN `n` out of `t`, writing back what it cached.
fn remove_lun(t: &TargetEntry, n: u64) {
    match t.remove_lun(n) {
        Ok(lu) => flush(&lu),
        Err(e) => warn!("target {}: cannot remove LUN {n}: {e}", t.name),
    }
}

fn flush(lu: &ethersan_scsi::LogicalUnit) {
    use ethersan_backend::BlockDeviceExt;
    let d = lu.device();
    if let Err(e) = d.flush() {
        warn!(%e, backend = %d.describe(), "flush of a removed LUN failed");
    }
}
