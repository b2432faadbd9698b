//! The live directory of targets and their LUNs.
//!
//! Read on every login and, through each target's [`ScsiTarget`], on every
//! command, without a lock: each list is an `Arc` swapped when the
//! management path changes it (add or remove a target, add or remove a
//! LUN), so sessions see a change at their next command. Logged-in
//! initiators learn of LUN changes through unit attentions (REPORTED LUNS
//! DATA HAS CHANGED), and of a target's removal by losing their sessions
//! (the transport ends them).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use ethersan_scsi::{LogicalUnit, LunMap, LunMapError, LunSlot, ScsiTarget};

use crate::counters::IoCounters;

/// Who may log in to a target and see it in discovery. The front end
/// supplies it: an iSCSI portal checks initiator names and source
/// networks, an Ethernet transport MAC addresses.
pub trait TargetAccess: std::fmt::Debug + Send + Sync {
    /// Whether `initiator`, connecting from `addr` (when the transport
    /// has IP addresses), may use the target.
    fn allows(&self, initiator: &str, addr: Option<IpAddr>) -> bool;
    /// The rules as `Any`, so the front end that made them can reach its
    /// own type (to change them while the target serves).
    fn as_any(&self) -> &dyn std::any::Any;

    /// The initiator names the access list allows by name; empty: any
    /// name (the list, if any, restricts by address only). Discovery
    /// services (iSNS discovery domains) publish these.
    fn initiator_names(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Everyone may use the target.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl TargetAccess for AllowAll {
    fn allows(&self, _: &str, _: Option<IpAddr>) -> bool {
        true
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Errors changing the directory.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// A target with that name exists.
    #[error("target {0} already exists")]
    TargetExists(String),
    /// No target with that name.
    #[error("no target named {0}")]
    NoTarget(String),
    /// A LUN change was refused.
    #[error(transparent)]
    Lun(#[from] LunMapError),
    /// The backing store refused the change (e.g. a resize).
    #[error("LUN {lun}: {cause}")]
    Store {
        /// The LUN.
        lun: u64,
        /// The store's error.
        cause: ethersan_backend::BackendError,
    },
}

/// One exported target.
#[derive(Debug)]
pub struct Target {
    /// Its name (an iSCSI IQN, EUI or NAA name).
    pub name: String,
    /// Its alias, if any.
    pub alias: Option<String>,
    /// The SCSI target device with its live LUN map.
    pub scsi: Arc<ScsiTarget>,
    /// Who may use it.
    pub access: Arc<dyn TargetAccess>,
    /// Counters per LUN.
    lun_counters: ArcSwap<BTreeMap<u64, Arc<IoCounters>>>,
}

impl Target {
    /// A target over this LUN map.
    pub fn new(
        name: String,
        alias: Option<String>,
        luns: LunMap,
        access: Arc<dyn TargetAccess>,
    ) -> Self {
        let counters = luns
            .keys()
            .map(|l| (*l, Arc::new(IoCounters::default())))
            .collect();
        Target {
            name,
            alias,
            scsi: Arc::new(ScsiTarget::with_luns(luns)),
            access,
            lun_counters: ArcSwap::from_pointee(counters),
        }
    }

    /// The counters of LUN `lun`.
    pub fn lun_counters(&self, lun: u64) -> Option<Arc<IoCounters>> {
        self.lun_counters.load().get(&lun).cloned()
    }

    /// Add a LUN while sessions run (see [`ScsiTarget::add_lun`]).
    pub fn add_lun(&self, lun: u64, slot: LunSlot) -> Result<(), DirectoryError> {
        self.scsi.add_lun(lun, slot)?;
        let mut c = (*self.lun_counters.load_full()).clone();
        c.insert(lun, Arc::new(IoCounters::default()));
        self.lun_counters.store(Arc::new(c));
        Ok(())
    }

    /// Grow a LUN's backing store to `bytes` while sessions run: they get
    /// CAPACITY DATA HAS CHANGED. Returns the new number of blocks if it
    /// changed.
    pub fn resize_lun(&self, lun: u64, bytes: u64) -> Result<Option<u64>, DirectoryError> {
        let lu = self.scsi.lun(lun).ok_or(LunMapError::Missing(lun))?;
        lu.resize(bytes)
            .map_err(|source| DirectoryError::Store { lun, cause: source })
    }

    /// Remove a LUN while sessions run (see [`ScsiTarget::remove_lun`]);
    /// returns its logical unit so the caller can flush and close it.
    pub fn remove_lun(&self, lun: u64) -> Result<Arc<LogicalUnit>, DirectoryError> {
        let lu = self.scsi.remove_lun(lun)?;
        let mut c = (*self.lun_counters.load_full()).clone();
        c.remove(&lun);
        self.lun_counters.store(Arc::new(c));
        Ok(lu)
    }
}

/// Every exported target, and counters per initiator.
#[derive(Debug, Default)]
pub struct Directory {
    targets: ArcSwap<Vec<Arc<Target>>>,
    /// Serialises changes (readers never take it).
    changing: Mutex<()>,
    initiators: Mutex<HashMap<String, Arc<IoCounters>>>,
}

impl Directory {
    /// A directory of these targets.
    pub fn new(targets: Vec<Arc<Target>>) -> Self {
        Directory {
            targets: ArcSwap::from_pointee(targets),
            ..Default::default()
        }
    }

    /// A snapshot of the targets.
    pub fn targets(&self) -> Arc<Vec<Arc<Target>>> {
        self.targets.load_full()
    }

    /// The target with this name.
    pub fn target(&self, name: &str) -> Option<Arc<Target>> {
        self.targets.load().iter().find(|t| t.name == name).cloned()
    }

    /// Add a target while the server runs.
    pub fn add_target(&self, target: Target) -> Result<Arc<Target>, DirectoryError> {
        let _g = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let cur = self.targets.load_full();
        if cur.iter().any(|t| t.name == target.name) {
            return Err(DirectoryError::TargetExists(target.name));
        }
        let t = Arc::new(target);
        let mut next = (*cur).clone();
        next.push(t.clone());
        self.targets.store(Arc::new(next));
        Ok(t)
    }

    /// Remove a target: new logins no longer find it; the caller ends
    /// the sessions logged in to it.
    pub fn remove_target(&self, name: &str) -> Result<Arc<Target>, DirectoryError> {
        let _g = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = (*self.targets.load_full()).clone();
        let i = next
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| DirectoryError::NoTarget(name.to_string()))?;
        let t = next.remove(i);
        self.targets.store(Arc::new(next));
        Ok(t)
    }

    /// The counters of an initiator (by name), created on first use
    /// (at login: never on the data path).
    pub fn initiator_counters(&self, name: &str) -> Arc<IoCounters> {
        let mut m = self.initiators.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(name.to_string()).or_default().clone()
    }

    /// Every initiator seen, with its counters.
    pub fn initiators(&self) -> Vec<(String, Arc<IoCounters>)> {
        let m = self.initiators.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = m.iter().map(|(k, c)| (k.clone(), c.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethersan_scsi::{LuConfig, LunPolicy};

    fn lu() -> Arc<LogicalUnit> {
        let dev = Arc::new(ethersan_backend::ram::RamDevice::new(1 << 20, 512).unwrap());
        Arc::new(LogicalUnit::new(
            dev,
            LuConfig {
                serial: "s".into(),
                naa: [0x60; 16],
                target_name: "t".into(),
                ..LuConfig::default()
            },
        ))
    }

    fn target(name: &str) -> Target {
        let mut luns = LunMap::new();
        luns.insert(
            0,
            LunSlot {
                lu: lu(),
                policy: LunPolicy::default(),
            },
        );
        Target::new(name.into(), None, luns, Arc::new(AllowAll))
    }

    #[test]
    fn targets_come_and_go_while_snapshots_stay_valid() {
        let d = Directory::new(vec![Arc::new(target("a"))]);
        let before = d.targets();
        d.add_target(target("b")).unwrap();
        assert!(matches!(
            d.add_target(target("b")),
            Err(DirectoryError::TargetExists(_))
        ));
        assert_eq!(before.len(), 1, "an old snapshot is unchanged");
        assert_eq!(d.targets().len(), 2);
        assert!(d.target("b").is_some());
        d.remove_target("a").unwrap();
        assert!(matches!(
            d.remove_target("a"),
            Err(DirectoryError::NoTarget(_))
        ));
        assert!(d.target("a").is_none());
        assert_eq!(before[0].name, "a");
    }

    #[test]
    fn luns_carry_their_counters() {
        let t = target("a");
        assert!(t.lun_counters(0).is_some());
        assert!(t.lun_counters(3).is_none());
        t.add_lun(
            3,
            LunSlot {
                lu: lu(),
                policy: LunPolicy::default(),
            },
        )
        .unwrap();
        assert!(t.lun_counters(3).is_some() && t.scsi.has_lun(3));
        assert!(matches!(
            t.add_lun(
                3,
                LunSlot {
                    lu: lu(),
                    policy: LunPolicy::default()
                }
            ),
            Err(DirectoryError::Lun(LunMapError::Exists(3)))
        ));
        t.remove_lun(3).unwrap();
        assert!(t.lun_counters(3).is_none() && !t.scsi.has_lun(3));
    }

    #[test]
    fn a_file_lun_grows_live_and_sessions_are_told() {
        use ethersan_backend::file::{FileDevice, FileOptions};
        use ethersan_scsi::{Nexus, ScsiCommand};
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::open(
            &dir.path().join("lun.img"),
            &FileOptions {
                size: Some(1 << 20),
                block_size: 512,
                read_only: false,
                preallocate: false,
                direct: false,
                engine: Default::default(),
            },
        )
        .unwrap();
        let mut luns = LunMap::new();
        luns.insert(
            0,
            LunSlot {
                lu: Arc::new(LogicalUnit::new(Arc::new(dev), LuConfig::default())),
                policy: LunPolicy::default(),
            },
        );
        let t = Target::new("t".into(), None, luns, Arc::new(AllowAll));
        let n = Nexus(1);
        t.scsi.nexus_added(n);
        let run = |cdb: &[u8]| {
            t.scsi.submit_and_wait(
                ScsiCommand {
                    nexus: n,
                    lun: 0,
                    cdb: cdb.to_vec(),
                    data_out: Default::default(),
                    expected_len: 32,
                },
                None,
            )
        };
        run(&[0; 6]);
        let capacity = |r: ethersan_scsi::ScsiResponse| {
            u32::from_be_bytes([r.data_in[0], r.data_in[1], r.data_in[2], r.data_in[3]])
        };
        let rc10 = [0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(capacity(run(&rc10)), 2047);
        assert_eq!(t.resize_lun(0, 4 << 20).unwrap(), Some(8192));
        let ua = run(&[0; 6]);
        assert_eq!(
            (ua.sense[2] & 0x0f, ua.sense[12], ua.sense[13]),
            (6, 0x2a, 0x09)
        );
        assert_eq!(capacity(run(&rc10)), 8191);
        // Shrinking and odd sizes are refused; the LUN keeps its size.
        assert!(matches!(
            t.resize_lun(0, 1 << 20),
            Err(DirectoryError::Store { .. })
        ));
        assert!(matches!(
            t.resize_lun(0, (8 << 20) + 1),
            Err(DirectoryError::Store { .. })
        ));
        assert!(matches!(
            t.resize_lun(5, 8 << 20),
            Err(DirectoryError::Lun(LunMapError::Missing(5)))
        ));
        assert_eq!(capacity(run(&rc10)), 8191);
        // RAM does not resize.
        let ram = target("r");
        assert!(matches!(
            ram.resize_lun(0, 8 << 20),
            Err(DirectoryError::Store { .. })
        ));
    }

    #[test]
    fn initiator_counters_are_shared_by_name() {
        let d = Directory::default();
        let a = d.initiator_counters("iqn.x:a");
        assert!(Arc::ptr_eq(&a, &d.initiator_counters("iqn.x:a")));
        d.initiator_counters("iqn.x:b");
        let names: Vec<_> = d.initiators().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["iqn.x:a", "iqn.x:b"]);
    }
}
