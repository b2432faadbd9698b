//! SAM-5 §4.6: the target device routes commands to logical units by LUN,
//! answers REPORT LUNS itself and speaks for LUNs that do not exist.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::commands::Op;
use crate::copy::CopyManager;
use crate::disk::LogicalUnit;
use crate::missing_lun::plain_check;
use crate::report_luns::report_luns;
use crate::sense::Sense;
use crate::{
    DataInSink, LunAccess, Nexus, ResetKind, ScsiCommand, ScsiCompletion, ScsiResponse, ScsiStatus,
    Submitted, WriteStream,
};

/// Who may use one LUN (LUN masking and per-initiator write protection),
/// checked per command by the LUN's number, so a LUN added later is seen
/// without a new login.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LunPolicy {
    /// Initiator names that see the LUN; empty: every initiator.
    pub visible_to: Vec<String>,
    /// Initiator names for which the LUN is read-only.
    pub read_only_for: Vec<String>,
    /// The least security a channel of ethersan's native transport must
    /// have to address the LUN (0 none, 1 integrity, 2 encrypt; see
    /// [`Requester::channel_level`]). Other transports are not affected.
    pub min_channel_level: u8,
}

/// Who sends a command: the initiator's name and, when the command came
/// over a channel of ethersan's native transport, that channel's security
/// level (0 none, 1 integrity, 2 encrypt).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requester<'a> {
    /// The initiator's name (`None`: in-process use, every LUN visible and
    /// writable).
    pub initiator: Option<&'a str>,
    /// The native transport channel's security level; `None` for other
    /// transports.
    pub channel_level: Option<u8>,
    /// Where a large READ may send its data as it is read, before the
    /// status (cut-through; see [`DataInSink`]). `None`: the whole data
    /// comes in the response.
    pub early: Option<&'a DataInSink>,
    /// A large WRITE's data, arriving after the command is handed over
    /// (cut-through WRITE; see [`WriteStream`]): given only for a command
    /// [`ScsiTarget::streams_write`] accepted. `None`: the data is in the
    /// command.
    pub data_out: Option<&'a WriteStream>,
}

impl<'a> Requester<'a> {
    /// A requester known by name only (iSCSI over TCP, AoE, tools).
    pub fn named(initiator: Option<&'a str>) -> Requester<'a> {
        Requester {
            initiator,
            channel_level: None,
            early: None,
            data_out: None,
        }
    }
}

impl LunPolicy {
    /// What `initiator` may do (`None`: no initiator name known; every
    /// LUN visible and writable, for in-process use).
    pub fn access(&self, who: Requester<'_>) -> LunAccess {
        if self.channel_below(who) {
            return LunAccess {
                visible: false,
                read_only: false,
            };
        }
        let Some(name) = who.initiator else {
            return LunAccess {
                visible: true,
                read_only: false,
            };
        };
        LunAccess {
            visible: self.masked_for(name),
            read_only: self.read_only_for.iter().any(|n| n == name),
        }
    }

    /// The level `who`'s channel lacks for this LUN: `Some(least level)`
    /// when `who` came over a native transport channel below the LUN's
    /// [`min_channel_level`](Self::min_channel_level) and LUN masking
    /// would let it see the LUN. REPORT LUNS lists such a LUN and its
    /// commands end with DATA PROTECT, LOGICAL UNIT ACCESS NOT AUTHORIZED
    /// and this level in the INFORMATION field, so the initiator can say
    /// which level to ask for.
    pub fn level_needed(&self, who: Requester<'_>) -> Option<u8> {
        let masked_in = who.initiator.is_none_or(|name| self.masked_for(name));
        (self.channel_below(who) && masked_in).then_some(self.min_channel_level)
    }

    fn channel_below(&self, who: Requester<'_>) -> bool {
        who.channel_level
            .is_some_and(|level| level < self.min_channel_level)
    }

    /// LUN masking alone lets `name` see the LUN.
    fn masked_for(&self, name: &str) -> bool {
        self.visible_to.is_empty() || self.visible_to.iter().any(|n| n == name)
    }
}

/// One entry of a target's LUN map.
#[derive(Debug, Clone)]
pub struct LunSlot {
    /// The logical unit.
    pub lu: Arc<LogicalUnit>,
    /// Who may use it.
    pub policy: LunPolicy,
}

/// A target's LUNs by number.
pub type LunMap = BTreeMap<u64, LunSlot>;

/// Errors changing a target's LUNs.
#[derive(Debug, thiserror::Error)]
pub enum LunMapError {
    /// The LUN number is taken.
    #[error("LUN {0} already exists; remove it first or choose another number")]
    Exists(u64),
    /// No such LUN.
    #[error("LUN {0} does not exist")]
    Missing(u64),
    /// LUN numbers go up to 16383 (flat space addressing).
    #[error("LUN {0} is out of range: use 0 to 16383")]
    OutOfRange(u64),
}

/// Highest LUN number (SAM-5 flat space addressing).
pub const MAX_LUN: u64 = 0x3fff;

/// A SCSI target device: routes commands to logical units by LUN.
///
/// The LUN map is read on every command without a lock (an `Arc` swapped
/// when a LUN is added or removed); only the management path changes it.
#[derive(Debug, Default)]
pub struct ScsiTarget {
    luns: ArcSwap<LunMap>,
    /// I_T nexuses logged in, with their initiator port names, so a LUN
    /// added later learns of them. Held while the map changes and while a
    /// nexus comes or goes, so neither misses the other.
    nexuses: Mutex<HashMap<Nexus, Option<String>>>,
    /// Serialises LUN map changes (readers never take it).
    changing: Mutex<()>,
    copies: Arc<CopyManager>,
}

impl ScsiTarget {
    /// Create a target whose LUN *i* is `luns[i]`, visible to everyone.
    pub fn new(luns: Vec<Arc<LogicalUnit>>) -> Self {
        Self::with_luns(
            luns.into_iter()
                .enumerate()
                .map(|(i, lu)| {
                    (
                        i as u64,
                        LunSlot {
                            lu,
                            policy: LunPolicy::default(),
                        },
                    )
                })
                .collect(),
        )
    }

    /// Create a target with this LUN map.
    pub fn with_luns(luns: LunMap) -> Self {
        ScsiTarget {
            luns: ArcSwap::from_pointee(luns),
            ..Default::default()
        }
    }

    /// A snapshot of the LUN map.
    pub fn luns(&self) -> Arc<LunMap> {
        self.luns.load_full()
    }

    /// The logical unit with this number.
    pub fn lun(&self, lun: u64) -> Option<Arc<LogicalUnit>> {
        self.luns.load().get(&lun).map(|s| s.lu.clone())
    }

    /// Whether a command for LUN `lun` with this CDB and expected length
    /// is written as its data arrives: the transport then collects the
    /// data into a [`WriteStream`] handed over with the command
    /// ([`Requester::data_out`]) instead of one buffer (see
    /// [`LogicalUnit::streams_write`]).
    pub fn streams_write(&self, lun: u64, cdb: &[u8], expected_len: u32) -> bool {
        self.luns
            .load()
            .get(&lun)
            .is_some_and(|s| s.lu.streams_write(cdb, expected_len))
    }

    /// Whether LUN `lun` exists.
    pub fn has_lun(&self, lun: u64) -> bool {
        self.luns.load().contains_key(&lun)
    }

    /// Whether `initiator` may address LUN `lun` (it exists and is visible
    /// to it).
    pub fn visible(&self, lun: u64, initiator: Option<&str>) -> bool {
        self.visible_to(lun, Requester::named(initiator))
    }

    /// Whether `who` may address LUN `lun` (it exists, is visible to its
    /// initiator and its channel is secure enough).
    pub fn visible_to(&self, lun: u64, who: Requester<'_>) -> bool {
        self.luns
            .load()
            .get(&lun)
            .is_some_and(|s| s.policy.access(who).visible)
    }

    fn lock_nexuses(&self) -> std::sync::MutexGuard<'_, HashMap<Nexus, Option<String>>> {
        self.nexuses.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add a LUN while sessions run: nexuses logged in get POWER ON on it
    /// and REPORTED LUNS DATA HAS CHANGED on every other LUN.
    pub fn add_lun(&self, lun: u64, slot: LunSlot) -> Result<(), LunMapError> {
        if lun > MAX_LUN {
            return Err(LunMapError::OutOfRange(lun));
        }
        let _g = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let cur = self.luns.load_full();
        if cur.contains_key(&lun) {
            return Err(LunMapError::Exists(lun));
        }
        let nexuses = self.lock_nexuses();
        for (n, name) in nexuses.iter() {
            slot.lu.nexus_added(*n);
            if let Some(name) = name {
                slot.lu.set_initiator_name(*n, name);
            }
        }
        let mut next = (*cur).clone();
        next.insert(lun, slot);
        self.luns.store(Arc::new(next));
        drop(nexuses);
        for (l, s) in cur.iter() {
            if *l != lun {
                s.lu.luns_changed();
            }
        }
        Ok(())
    }

    /// Remove a LUN while sessions run: the others report REPORTED LUNS
    /// DATA HAS CHANGED. Commands already running on it finish.
    pub fn remove_lun(&self, lun: u64) -> Result<Arc<LogicalUnit>, LunMapError> {
        let _g = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = (*self.luns.load_full()).clone();
        let slot = next.remove(&lun).ok_or(LunMapError::Missing(lun))?;
        self.luns.store(Arc::new(next.clone()));
        for s in next.values() {
            s.lu.luns_changed();
        }
        Ok(slot.lu)
    }

    /// Change who may use a LUN. Initiators that gain or lose it see
    /// REPORTED LUNS DATA HAS CHANGED.
    pub fn set_policy(&self, lun: u64, policy: LunPolicy) -> Result<(), LunMapError> {
        let _g = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = (*self.luns.load_full()).clone();
        let slot = next.get_mut(&lun).ok_or(LunMapError::Missing(lun))?;
        slot.policy = policy;
        self.luns.store(Arc::new(next.clone()));
        for s in next.values() {
            s.lu.luns_changed();
        }
        Ok(())
    }

    /// What `initiator` may do with each LUN (for the whole command).
    fn access_of<'a>(map: &'a LunMap, who: Requester<'a>) -> impl Fn(u64) -> LunAccess + 'a {
        move |l| {
            map.get(&l)
                .map(|s| s.policy.access(who))
                .unwrap_or(LunAccess {
                    visible: false,
                    read_only: false,
                })
        }
    }

    /// The one entry point: run `cmd` from `initiator` (`None`: no name,
    /// every LUN visible and writable), under each LUN's [`LunPolicy`]. The lookup and the unit's checks (CDB,
    /// unit attentions, reservations, medium, write protection) run once,
    /// here; then the command is finished ([`Submitted::Done`]), in the
    /// engine ([`Submitted::Pending`]: `done` gets the response), or left
    /// as a job for a thread where blocking is fine
    /// ([`Submitted::Blocking`]). `done` is called if and only if the
    /// answer is `Pending`.
    ///
    /// REPORT LUNS lists only the visible LUNs; a LUN that is not visible
    /// answers as one that does not exist (INQUIRY peripheral qualifier
    /// 011b, other commands LOGICAL UNIT NOT SUPPORTED); on a read-only
    /// LUN commands that change the medium get DATA PROTECT / WRITE
    /// PROTECTED; EXTENDED COPY can name only visible, writable LUNs.
    pub fn submit(
        &self,
        cmd: ScsiCommand,
        initiator: Option<&str>,
        done: ScsiCompletion,
    ) -> Submitted {
        self.submit_from(cmd, Requester::named(initiator), done)
    }

    /// [`submit`](Self::submit) for a [`Requester`] that may carry a
    /// native transport channel's security level: a LUN that needs more
    /// is listed by REPORT LUNS, and its commands end with DATA PROTECT,
    /// LOGICAL UNIT ACCESS NOT AUTHORIZED and the level it needs in the
    /// INFORMATION field (see [`LunPolicy::level_needed`]).
    pub fn submit_from(
        &self,
        cmd: ScsiCommand,
        who: Requester<'_>,
        done: ScsiCompletion,
    ) -> Submitted {
        // A guard, not a clone: no shared reference count is touched.
        let map = self.luns.load();
        let access = &Self::access_of(&map, who);
        let opcode = cmd.cdb.first().copied().unwrap_or(0xff);
        if opcode == 0xa0 {
            // Listed: the LUNs it may use, and those its channel is too
            // weak for (their commands say which level they need).
            let listed = |l: u64| {
                access(l).visible
                    || map
                        .get(&l)
                        .is_some_and(|s| s.policy.level_needed(who).is_some())
            };
            return Submitted::Done(self.report_luns(&cmd, &map, access, &listed));
        }
        if let Some(level) = map.get(&cmd.lun).and_then(|s| s.policy.level_needed(who)) {
            // The LUN exists for this initiator but its channel is too weak:
            // say so, with the level it needs (docs/native-transport.md).
            let s = crate::sense::codes::LUN_ACCESS_NOT_AUTHORIZED.with_info(u64::from(level));
            return Submitted::Done(plain_check(s, None));
        }
        let Some(lu) = map
            .get(&cmd.lun)
            .filter(|_| access(cmd.lun).visible)
            .map(|s| s.lu.clone())
        else {
            return Submitted::Done(crate::missing_lun::execute(&cmd.request()));
        };
        if access(cmd.lun).read_only {
            let changes_medium =
                crate::commands::lookup(&cmd.cdb).is_some_and(|d| d.rules.changes_medium);
            if changes_medium {
                return Submitted::Done(lu.check(crate::sense::codes::WRITE_PROTECTED));
            }
        }
        if opcode != 0x83 && opcode != 0x84 {
            return lu.submit(cmd, who.early, who.data_out, done);
        }
        let def = match lu.precheck(&cmd.request()) {
            Ok(d) => d,
            Err(resp) => return Submitted::Done(resp),
        };
        if !matches!(def.op, Op::ExtendedCopy | Op::ReceiveCopyResults) {
            return lu.submit(cmd, who.early, who.data_out, done);
        }
        // Only the LUNs this initiator may see and write (the LIO
        // CVE-2020-28374 lesson: a copy must not reach any other).
        let reachable: Vec<Arc<LogicalUnit>> = map
            .iter()
            .filter(|(l, _)| {
                let a = access(**l);
                a.visible && !a.read_only
            })
            .map(|(_, s)| s.lu.clone())
            .collect();
        let copies = self.copies.clone();
        let lu = lu.clone();
        Submitted::Blocking(Box::new(move || {
            copy_command(&copies, &lu, def.op, &cmd, &reachable)
        }))
    }

    /// [`submit`](Self::submit) and wait for the response on this thread
    /// (running a blocking job here): for tools, tests and fuzzing.
    pub fn submit_and_wait(&self, cmd: ScsiCommand, initiator: Option<&str>) -> ScsiResponse {
        // Not into this thread's own ring: only this thread, about to
        // wait, would run its completion.
        let _bypass = ethersan_backend::uring::BypassLocal::new();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let done: ScsiCompletion = Box::new(move |r| {
            let _ = tx.send(r);
        });
        match self.submit(cmd, initiator, done) {
            Submitted::Done(r) => r,
            Submitted::Blocking(job) => job(),
            Submitted::Pending => rx
                .recv()
                .expect("the engine completes every pending command"),
        }
    }

    /// REPORT LUNS: the target answers it, listing the LUNs `listed` names.
    fn report_luns(
        &self,
        cmd: &ScsiCommand,
        map: &LunMap,
        access: &dyn Fn(u64) -> LunAccess,
        listed: &dyn Fn(u64) -> bool,
    ) -> ScsiResponse {
        let lu = map
            .get(&cmd.lun)
            .filter(|_| access(cmd.lun).visible)
            .map(|s| s.lu.clone());
        if let Some((byte, bit)) = crate::commands::lookup(&cmd.cdb)
            .and_then(|d| crate::commands::reserved_bits(d, &cmd.cdb))
        {
            return plain_check(Sense::invalid_cdb_field(byte, Some(bit)), lu.as_ref());
        }
        let all: Vec<u64> = map.keys().copied().filter(|l| listed(*l)).collect();
        match report_luns(&cmd.cdb, &all) {
            Ok(data) => ScsiResponse {
                status: ScsiStatus::Good,
                sense: Vec::new(),
                data_in: data.into(),
                data_out_len: None,
            },
            Err(s) => plain_check(s, lu.as_ref()),
        }
    }

    /// A new I_T nexus appeared (login): it gets a POWER ON OR RESET unit
    /// attention on every LU unless it is a reinstated nexus.
    pub fn nexus_added(&self, nexus: Nexus) {
        let mut nexuses = self.lock_nexuses();
        nexuses.entry(nexus).or_insert(None);
        for s in self.luns.load().values() {
            s.lu.nexus_added(nexus);
        }
    }

    /// Record the initiator port name of a nexus (for READ FULL STATUS).
    pub fn set_initiator_name(&self, nexus: Nexus, name: &str) {
        let mut nexuses = self.lock_nexuses();
        nexuses.insert(nexus, Some(name.to_string()));
        for s in self.luns.load().values() {
            s.lu.set_initiator_name(nexus, name);
        }
    }

    /// An I_T nexus ended (logout or connection loss).
    pub fn nexus_lost(&self, nexus: Nexus) {
        let mut nexuses = self.lock_nexuses();
        nexuses.remove(&nexus);
        for s in self.luns.load().values() {
            s.lu.nexus_lost(nexus);
        }
    }

    /// A reset from task management on one LU (`Some(lun)`) or the whole
    /// target (`None`), requested by `by`.
    pub fn reset(&self, kind: ResetKind, lun: Option<u64>, _by: Nexus) {
        match lun {
            Some(l) => {
                if let Some(lu) = self.lun(l) {
                    lu.reset(kind);
                }
            }
            None => {
                for s in self.luns.load().values() {
                    s.lu.reset(kind);
                }
            }
        }
    }

    /// The I_T nexuses whose tasks on `lun` a PREEMPT AND ABORT asked to
    /// abort (taken once).
    pub fn take_preempted(&self, lun: u64) -> Vec<Nexus> {
        self.lun(lun)
            .map(|lu| lu.take_preempted())
            .unwrap_or_default()
    }

    /// Tasks of `victim` on `lun` were cleared by another nexus `by`.
    pub fn tasks_cleared(&self, lun: u64, victim: Nexus, by: Nexus) {
        if victim != by {
            if let Some(lu) = self.lun(lun) {
                lu.tasks_cleared(victim);
            }
        }
    }
}

/// EXTENDED COPY or RECEIVE COPY RESULTS, checked already, run by the
/// copy manager over the LUNs the initiator may reach.
fn copy_command(
    copies: &CopyManager,
    lu: &LogicalUnit,
    op: Op,
    cmd: &ScsiCommand,
    reachable: &[Arc<LogicalUnit>],
) -> ScsiResponse {
    let ok = |data_in: Vec<u8>| ScsiResponse {
        status: ScsiStatus::Good,
        sense: Vec::new(),
        data_in: data_in.into(),
        data_out_len: None,
    };
    let result = if op == Op::ExtendedCopy {
        copies
            .extended_copy(cmd.nexus, &cmd.cdb, &cmd.data_out, reachable)
            .map(|_| ok(Vec::new()))
    } else {
        copies.receive_copy_results(cmd.nexus, &cmd.cdb).map(ok)
    };
    let mut resp = result.unwrap_or_else(|s| lu.check(s));
    if op == Op::ExtendedCopy {
        let c = &cmd.cdb;
        resp.data_out_len = Some(u32::from_be_bytes([c[10], c[11], c[12], c[13]]) as usize);
    }
    resp
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::disk::testing::*;
    use crate::sense::key;
    use crate::{LogicalUnit, ScsiTarget};

    fn report_luns(select: u8, alloc: u32) -> Vec<u8> {
        let a = alloc.to_be_bytes();
        vec![0xa0, 0, select, 0, 0, 0, a[0], a[1], a[2], a[3], 0, 0]
    }

    fn two_luns() -> ScsiTarget {
        let lu = |bs| {
            Arc::new(LogicalUnit::new(
                Arc::new(TestDevice::new(bs)),
                config(false, false),
            ))
        };
        ScsiTarget::new(vec![lu(512), lu(4096)])
    }

    #[test]
    fn report_luns_lists_every_lun() {
        let t = two_luns();
        for select in [0, 2] {
            let d = good(exec(&t, A, &report_luns(select, 1024), &[]));
            assert_eq!(d.len(), 24);
            assert_eq!(&d[..4], &16u32.to_be_bytes());
            assert_eq!(&d[8..16], &[0; 8]);
            assert_eq!(&d[16..24], &[0, 1, 0, 0, 0, 0, 0, 0]);
        }
        // Well-known LUNs only: none.
        assert_eq!(good(exec(&t, A, &report_luns(1, 1024), &[])), [0u8; 8]);
        // Truncated to the allocation length, but the length field is whole.
        assert_eq!(
            good(exec(&t, A, &report_luns(0, 16), &[]))[..4],
            16u32.to_be_bytes()
        );
        // From a LUN that does not exist, too, and without a unit attention.
        t.nexus_added(B);
        assert_eq!(
            good(exec_lun(&t, B, 9, &report_luns(0, 1024), &[])).len(),
            24
        );
        check(
            &exec(&t, B, &[0, 0, 0, 0, 0, 0], &[]),
            key::UNIT_ATTENTION,
            0x29,
            0,
        );
    }

    #[test]
    fn report_luns_bad_fields() {
        let t = two_luns();
        for alloc in [0, 15] {
            let r = exec(&t, A, &report_luns(0, alloc), &[]);
            check(&r, key::ILLEGAL_REQUEST, 0x24, 0);
            assert_eq!(field_pointer(&r), [0xc0, 0, 6]);
        }
        let r = exec(&t, A, &report_luns(3, 1024), &[]);
        check(&r, key::ILLEGAL_REQUEST, 0x24, 0);
        assert_eq!(field_pointer(&r), [0xc0, 0, 2]);
        check(
            &exec_lun(&t, A, 7, &report_luns(0xff, 1024), &[]),
            key::ILLEGAL_REQUEST,
            0x24,
            0,
        );
    }

    #[test]
    fn luns_are_independent() {
        let t = two_luns();
        for n in [A, B] {
            t.nexus_added(n);
            for lun in [0, 1] {
                exec_lun(&t, n, lun, &[0, 0, 0, 0, 0, 0], &[]);
            }
        }
        let d = good(exec_lun(&t, A, 1, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
        assert_eq!(d[4..8], 4096u32.to_be_bytes());
        good(exec_lun(&t, A, 1, &cdb10(0x2a, 0, 0, 1), &[9u8; 4096]));
        assert_eq!(
            good(exec_lun(&t, A, 0, &cdb10(0x28, 0, 0, 1), &[])),
            vec![0u8; 512]
        );
    }

    #[test]
    fn a_lun_added_live_is_reported_with_a_unit_attention() {
        let t = two_luns();
        t.nexus_added(A);
        // A's first command takes its POWER ON unit attention.
        check(
            &exec(&t, A, &[0, 0, 0, 0, 0, 0], &[]),
            key::UNIT_ATTENTION,
            0x29,
            0,
        );
        let lu = Arc::new(LogicalUnit::new(
            Arc::new(TestDevice::new(512)),
            config(false, false),
        ));
        t.add_lun(
            7,
            super::LunSlot {
                lu,
                policy: super::LunPolicy::default(),
            },
        )
        .unwrap();
        assert!(matches!(
            t.add_lun(
                7,
                super::LunSlot {
                    lu: t.lun(0).unwrap(),
                    policy: Default::default()
                }
            ),
            Err(super::LunMapError::Exists(7))
        ));
        // LUN 0 reports the change once; REPORT LUNS lists LUN 7.
        check(
            &exec(&t, A, &[0, 0, 0, 0, 0, 0], &[]),
            key::UNIT_ATTENTION,
            0x3f,
            0x0e,
        );
        good(exec(&t, A, &[0, 0, 0, 0, 0, 0], &[]));
        let d = good(exec(&t, A, &report_luns(0, 1024), &[]));
        assert_eq!(&d[..4], &24u32.to_be_bytes());
        assert_eq!(&d[24..32], &[0, 7, 0, 0, 0, 0, 0, 0]);
        // The new LUN starts with POWER ON for the logged-in nexus.
        check(
            &exec_lun(&t, A, 7, &[0, 0, 0, 0, 0, 0], &[]),
            key::UNIT_ATTENTION,
            0x29,
            0,
        );
        good(exec_lun(&t, A, 7, &[0, 0, 0, 0, 0, 0], &[]));
        // Removed: gone from REPORT LUNS, commands get LOGICAL UNIT NOT SUPPORTED.
        t.remove_lun(7).unwrap();
        assert!(matches!(
            t.remove_lun(7),
            Err(super::LunMapError::Missing(7))
        ));
        check(
            &exec(&t, A, &[0, 0, 0, 0, 0, 0], &[]),
            key::UNIT_ATTENTION,
            0x3f,
            0x0e,
        );
        check(
            &exec_lun(&t, A, 7, &[0, 0, 0, 0, 0, 0], &[]),
            key::ILLEGAL_REQUEST,
            0x25,
            0,
        );
        assert_eq!(good(exec(&t, A, &report_luns(0, 1024), &[])).len(), 24);
        assert!(matches!(
            t.add_lun(
                super::MAX_LUN + 1,
                super::LunSlot {
                    lu: t.lun(0).unwrap(),
                    policy: Default::default()
                }
            ),
            Err(super::LunMapError::OutOfRange(_))
        ));
    }

    #[test]
    fn lun_policy_is_looked_up_per_command() {
        use crate::ScsiCommand;
        let t = two_luns();
        let run = |who: &str, lun: u64, cdb: &[u8], data: &[u8]| {
            t.submit_and_wait(
                ScsiCommand {
                    nexus: A,
                    lun,
                    cdb: cdb.to_vec(),
                    data_out: data.to_vec().into(),
                    expected_len: data.len() as u32,
                },
                Some(who),
            )
        };
        t.nexus_added(A);
        run("alice", 0, &[0, 0, 0, 0, 0, 0], &[]);
        t.set_policy(
            1,
            super::LunPolicy {
                visible_to: vec!["alice".into()],
                read_only_for: vec!["alice".into()],
                ..Default::default()
            },
        )
        .unwrap();
        run("alice", 0, &[0, 0, 0, 0, 0, 0], &[]);
        let d = good(run("bob", 0, &report_luns(0, 1024), &[]));
        assert_eq!(&d[..4], &8u32.to_be_bytes(), "bob sees LUN 0 only");
        check(
            &run("bob", 1, &[0, 0, 0, 0, 0, 0], &[]),
            key::ILLEGAL_REQUEST,
            0x25,
            0,
        );
        let r = run("alice", 1, &cdb10(0x2a, 0, 0, 1), &[1u8; 4096]);
        check(&r, key::DATA_PROTECT, 0x27, 0);
    }

    /// A LUN above a native channel's level is listed, and its commands
    /// say which level it needs (DATA PROTECT, LOGICAL UNIT ACCESS NOT
    /// AUTHORIZED, the level in INFORMATION); LUN masking still hides.
    #[test]
    fn a_lun_above_the_channel_level_is_listed_and_says_what_it_needs() {
        use crate::{ScsiCommand, Submitted};
        let t = two_luns();
        t.nexus_added(A);
        t.set_policy(
            1,
            super::LunPolicy {
                min_channel_level: 2,
                ..Default::default()
            },
        )
        .unwrap();
        let run = |name: &str, level: Option<u8>, lun: u64, cdb: &[u8]| {
            let who = super::Requester {
                initiator: Some(name),
                channel_level: level,
                early: None,
                data_out: None,
            };
            let cmd = ScsiCommand {
                nexus: A,
                lun,
                cdb: cdb.to_vec(),
                data_out: Default::default(),
                expected_len: 0,
            };
            match t.submit_from(cmd, who, Box::new(|_| {})) {
                Submitted::Done(r) => r,
                _ => panic!("answered at once"),
            }
        };
        // Take the unit attentions of the set_policy.
        for lun in [0, 1] {
            run("alice", Some(2), lun, &[0, 0, 0, 0, 0, 0]);
            run("alice", Some(2), lun, &[0, 0, 0, 0, 0, 0]);
        }
        for level in [0, 1] {
            let d = good(run("alice", Some(level), 0, &report_luns(0, 1024)));
            assert_eq!(&d[..4], &16u32.to_be_bytes(), "level {level}: both listed");
            for cdb in [&[0u8, 0, 0, 0, 0, 0][..], &[0x12, 0, 0, 0, 36, 0]] {
                let r = run("alice", Some(level), 1, cdb);
                check(&r, key::DATA_PROTECT, 0x74, 0x71);
                assert_eq!(r.sense[0], 0xf0, "fixed format, INFORMATION valid");
                assert_eq!(&r.sense[3..7], &2u32.to_be_bytes(), "needs encrypt");
            }
        }
        good(run("alice", Some(2), 1, &[0, 0, 0, 0, 0, 0]));
        good(run("alice", None, 1, &[0, 0, 0, 0, 0, 0]));
        // Masked from bob: hidden whatever the channel.
        t.set_policy(
            1,
            super::LunPolicy {
                min_channel_level: 2,
                visible_to: vec!["alice".into()],
                ..Default::default()
            },
        )
        .unwrap();
        run("bob", Some(0), 0, &[0, 0, 0, 0, 0, 0]);
        let d = good(run("bob", Some(0), 0, &report_luns(0, 1024)));
        assert_eq!(&d[..4], &8u32.to_be_bytes(), "bob sees LUN 0 only");
        check(
            &run("bob", Some(0), 1, &[0, 0, 0, 0, 0, 0]),
            key::ILLEGAL_REQUEST,
            0x25,
            0,
        );
    }
}
