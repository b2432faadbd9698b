//! Applying a changed configuration to a running server (SIGHUP with
//! `serve --config FILE`).
//!
//! Everything that can change without a restart does, and nothing else
//! is touched: targets come and go (a removed target's sessions end),
//! LUNs are added, removed or replaced live (initiators see REPORTED LUNS
//! DATA HAS CHANGED), a target whose access rules or alias change is
//! rebuilt (its sessions end and log in again under the new rules), and
//! CHAP and login negotiation settings apply to the logins after the
//! reload. Portals, worker threads and the other `[options]` need a
//! restart; a reload that changes them says so and leaves them.
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
use crate::registry::{Registry, TargetEntry};
use crate::{build_target, open_lun, target_settings, ServerError};

/// Applies configurations to one running server.
pub struct Reloader {
    registry: Arc<Registry>,
    settings: Arc<ArcSwap<TargetSettings>>,
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
}

/// One change to the targets, prepared.
enum TargetChange {
    Add(TargetEntry),
    Remove(String),
    Rebuild(TargetEntry),
    Luns(String, Vec<LunChange>),
}

impl Reloader {
    pub(crate) fn new(
        registry: Arc<Registry>,
        settings: Arc<ArcSwap<TargetSettings>>,
        current: Config,
    ) -> Reloader {
        Reloader {
            registry,
            settings,
            current: Mutex::new(current),
        }
    }

    /// Make the running server serve `new`. On an error nothing changed.
    pub fn apply(&self, new: Config) -> Result<ReloadReport, ServerError> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let mut report = ReloadReport::default();
        if new.portals != current.portals {
            report.needs_restart.push("portals".into());
        }
        // The iSNS task starts with the server; it follows the targets
        // and ACLs live, not its own settings. (A file without [isns] is
        // not a change: `serve --isns` may have given it.)
        if new.isns.is_some() && new.isns != current.isns {
            report.needs_restart.push("[isns]".into());
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
        let data_dir = current.options.data_dir.clone();
        // Prepare: open every store the new configuration adds or changes.
        let old: BTreeMap<&str, &TargetConfig> = current
            .targets
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        let mut changes = Vec::new();
        for t in &new.targets {
            match old.get(t.name.as_str()) {
                None => changes.push(TargetChange::Add(build_target(t, &data_dir)?)),
                Some(o)
                    if o.access.initiators != t.access.initiators
                        || o.access.networks != t.access.networks
                        || o.alias != t.alias =>
                {
                    changes.push(TargetChange::Rebuild(build_target(t, &data_dir)?))
                }
                Some(o) => {
                    let mut luns = Vec::new();
                    for i in 0..o.luns.len().max(t.luns.len()) {
                        let n = i as u64;
                        match (o.luns.get(i), t.luns.get(i)) {
                            (Some(_), None) => luns.push(LunChange::Remove(n)),
                            (None, Some(l)) => {
                                luns.push(LunChange::Add(n, open_lun(t, i, l, &data_dir)?))
                            }
                            (Some(a), Some(b))
                                if a != b || lun_policy(o, i) != lun_policy(t, i) =>
                            {
                                luns.push(LunChange::Replace(n, open_lun(t, i, b, &data_dir)?))
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
                TargetChange::Rebuild(t) => {
                    report.changed.push(format!(
                        "target {}: access or alias changed; its sessions were ended to apply it",
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
                }
            }
        }
        if new.chap != current.chap
            || new.discovery_chap != current.discovery_chap
            || new
                .targets
                .iter()
                .any(|t| old.get(t.name.as_str()).is_some_and(|o| o.chap != t.chap))
        {
            report
                .changed
                .push("CHAP settings (for logins from now on)".into());
        }
        // Login settings for the next connections: built from the new
        // file, with the options the server started with.
        let effective = Config {
            portals: current.portals.clone(),
            options: current.options.clone(),
            isns: current.isns.clone(),
            ..new
        };
        self.settings.store(Arc::new(target_settings(&effective)));
        *current = effective;
        Ok(report)
    }

    fn add_target(&self, t: TargetEntry) {
        let name = t.name.clone();
        if let Err(e) = self.registry.directory().add_target(t) {
            warn!("cannot add target {name}: {e}");
        }
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
