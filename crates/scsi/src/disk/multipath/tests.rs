//! Two gateways over one store in memory: reservations and target
//! port groups seen from both.

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
    fn store(&self, name: &str, data: &[u8], expected: u64) -> Result<Option<u64>, BackendError> {
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

/// A gateway that comes back with the group it had stores nothing and
/// tells nobody (a notice would wait for its previous run's watch), yet
/// knows every group; one that comes back in another state stores it.
#[test]
fn a_restarted_gateway_with_its_group_unchanged_stores_nothing() {
    let shared = MemoryShared::new();
    let ram = ram();
    let (g1, g2) = two_gateways(&ram, &shared);
    let before = shared.load(ALUA_BLOB).unwrap().version;
    drop(g1);
    let g1 = gateway(
        &ram,
        Arc::new(shared.handle()),
        1,
        AluaState::ActiveOptimized,
    );
    assert_eq!(shared.load(ALUA_BLOB).unwrap().version, before);
    let d = good(exec(&g1.t, A, &rtpg(false, 1024), &[]));
    assert_eq!(groups_of(&d), vec![(1, 0), (2, 0)]);
    drop(g1);
    let g1 = gateway(&ram, Arc::new(shared.handle()), 1, AluaState::Standby);
    assert!(shared.load(ALUA_BLOB).unwrap().version > before);
    assert_eq!(g1.lu.target_port_groups().len(), 2);
    settle(&g2.t, A);
    let d = good(exec(&g2.t, A, &rtpg(false, 1024), &[]));
    assert_eq!(groups_of(&d), vec![(1, 2), (2, 0)]);
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
