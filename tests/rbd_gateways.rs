//! Two gateways (`ethersan serve --tpg 1` and `--tpg 2`) export one Ceph
//! RBD image as one LUN, against a real single-node cluster each test
//! starts: libiscsi's multipath and persistent-reservation suites with one
//! URL per gateway, ALUA (REPORT / SET TARGET PORT GROUPS), reservations
//! taken through one gateway and checked through the other (and after both
//! restart), COMPARE AND WRITE atomic across gateways, writes from both
//! interleaving correctly (the image's exclusive lock moves between them),
//! and a gateway killed while the other keeps serving.

mod common;

use bytes::Bytes;
use common::ceph::Ceph;
use common::{pattern, require_tool, Server, IQN};
use ethersan_initiator::{connect, LoginOptions, Session};

/// Held by each test for its whole run (a tokio mutex: the async tests
/// hold it across their awaits, each on its own runtime).
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Gateway `tpg` (1 or 2) over image `rbd/NAME`.
fn gateway(ceph: &Ceph, name: &str, tpg: u16) -> Server {
    let lun = format!("rbd:rbd/{name}:64M,conf={}", ceph.conf_str());
    Server::start_with(&lun, &["--tpg", &tpg.to_string()])
}

async fn session(addr: &str, initiator: &str) -> Session {
    let opts = LoginOptions {
        initiator_name: initiator.to_string(),
        target_name: Some(IQN.to_string()),
        ..LoginOptions::default()
    };
    let s = connect(addr, &opts).await.expect("login");
    s.clear_unit_attention(0).await.expect("TUR");
    s
}

fn rw16(op: u8, lba: u64, blocks: u32) -> Vec<u8> {
    let mut cdb = vec![op, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

fn pr_out(action: u8, kind: u8, key: u64, sakey: u64, aptpl: bool) -> (Vec<u8>, Bytes) {
    let cdb = vec![0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sakey.to_be_bytes());
    p[20] = u8::from(aptpl);
    (cdb, Bytes::from(p))
}

async fn status(
    s: &Session,
    cdb: &[u8],
    data: Bytes,
    len: u32,
) -> (u8, Option<(u8, u8, u8)>, Vec<u8>) {
    let r = s.command(0, cdb, data, len).await.expect("command");
    (r.status, r.sense_key(), r.data)
}

/// REPORT TARGET PORT GROUPS: (group id, asymmetric access state, relative
/// target port ids) per group.
async fn rtpg(s: &Session) -> Vec<(u16, u8, Vec<u16>)> {
    let (st, sense, data) = status(
        s,
        &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0],
        Bytes::new(),
        4096,
    )
    .await;
    assert_eq!(st, 0, "REPORT TARGET PORT GROUPS: {sense:?}");
    let len = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
    let mut at = 4;
    let mut groups = Vec::new();
    while at + 8 <= (4 + len).min(data.len()) {
        let d = &data[at..];
        let count = d[7] as usize;
        let ports = (0..count)
            .map(|i| u16::from_be_bytes([d[8 + 4 * i + 2], d[8 + 4 * i + 3]]))
            .collect();
        groups.push((u16::from_be_bytes([d[2], d[3]]), d[0] & 0x0f, ports));
        at += 8 + 4 * count;
    }
    groups.sort();
    groups
}

#[test]
fn libiscsi_multipath_and_reservation_suites_across_two_gateways() {
    let _one = ONE_CLUSTER_AT_A_TIME.blocking_lock();
    require_tool("iscsi-test-cu");
    let ceph = Ceph::start();
    let a = gateway(&ceph, "suites", 1);
    let b = gateway(&ceph, "suites", 2);
    let mut problems = Vec::new();
    for suite in [
        "MultipathIO",
        "PrinReadKeys",
        "PrinServiceactionRange",
        "PrinReportCapabilities",
        "ProutRegister",
        "ProutReserve",
        "ProutClear",
        "ProutPreempt",
    ] {
        let (r, text) = common::run_suite(suite, &[&a.url(0), &b.url(0)]);
        println!(
            "{suite:<24} passed {:>3} failed {:>3} skipped {:>3}",
            r.passed, r.failed, r.skipped
        );
        if !r.completed || r.passed == 0 || r.failed > 0 {
            problems.push(format!("{suite}: {r:?}\n{text}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_and_port_groups_are_shared_between_gateways() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
    let ceph = Ceph::start();
    let mut ga = gateway(&ceph, "pr", 1);
    let mut gb = gateway(&ceph, "pr", 2);
    let x = session(&ga.addr, "iqn.2026-11.org.ethersan:x").await;
    let y = session(&gb.addr, "iqn.2026-11.org.ethersan:y").await;
    const KX: u64 = 0x1111;
    const KY: u64 = 0x2222;

    // ALUA: both gateways report both groups, each active/optimized.
    let groups = rtpg(&x).await;
    assert_eq!(groups, vec![(1, 0, vec![1]), (2, 0, vec![2])], "RTPG via A");
    assert_eq!(rtpg(&y).await, groups, "RTPG via B");
    // INQUIRY: TPGS = 11b (implicit and explicit).
    let (st, _, inq) = status(&x, &[0x12, 0, 0, 0, 96, 0], Bytes::new(), 96).await;
    assert_eq!(st, 0);
    assert_eq!((inq[5] >> 4) & 3, 3, "INQUIRY TPGS");
    // SET TARGET PORT GROUPS via B: group 2 active/non-optimized; A sees it.
    let mut p = vec![0u8; 8];
    p[4] = 0x01; // active/non-optimized
    p[6..8].copy_from_slice(&2u16.to_be_bytes());
    let (st, sense, _) = status(
        &y,
        &[0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0],
        Bytes::from(p),
        0,
    )
    .await;
    assert_eq!(st, 0, "SET TARGET PORT GROUPS: {sense:?}");
    // X is told the states changed (ASYMMETRIC ACCESS STATE CHANGED).
    let (st, sense, _) = status(&x, &[0; 6], Bytes::new(), 0).await;
    assert_eq!(
        (st, sense),
        (2, Some((0x06, 0x2a, 0x06))),
        "the state change's unit attention via A"
    );
    assert_eq!(
        rtpg(&x).await,
        vec![(1, 0, vec![1]), (2, 1, vec![2])],
        "A sees B's new state"
    );

    // COMPARE AND WRITE through both gateways at once on one block: one
    // wins each round, the other miscompares.
    let mut current = vec![0u8; 512];
    for round in 0..10u8 {
        let caw = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0];
        let mut pa = current.clone();
        pa.extend_from_slice(&[round.wrapping_mul(2).wrapping_add(100); 512]);
        let mut pb = current.clone();
        pb.extend_from_slice(&[round.wrapping_mul(2).wrapping_add(101); 512]);
        let (ra, rb) = tokio::join!(
            status(&x, &caw, Bytes::from(pa.clone()), 0),
            status(&y, &caw, Bytes::from(pb.clone()), 0)
        );
        let wins = [&ra, &rb].iter().filter(|r| r.0 == 0).count();
        assert_eq!(
            wins,
            1,
            "round {round}: exactly one COMPARE AND WRITE wins: {:?} {:?}",
            (ra.0, ra.1),
            (rb.0, rb.1)
        );
        for r in [&ra, &rb] {
            if r.0 != 0 {
                assert_eq!(r.1, Some((0x0e, 0x1d, 0)), "the loser miscompares");
            }
        }
        current = if ra.0 == 0 {
            pa[512..].to_vec()
        } else {
            pb[512..].to_vec()
        };
        let (_, _, data) = status(&x, &rw16(0x88, 0, 1), Bytes::new(), 512).await;
        assert!(
            data == current,
            "round {round}: the block holds the winner's data"
        );
    }

    // X registers and reserves (write exclusive) through A.
    let (cdb, p) = pr_out(0, 0, 0, KX, false);
    assert_eq!(status(&x, &cdb, p, 0).await.0, 0, "REGISTER via A");
    let (cdb, p) = pr_out(1, 1, KX, 0, false);
    assert_eq!(status(&x, &cdb, p, 0).await.0, 0, "RESERVE via A");
    // Y, through B, may read but not write.
    let (st, _, _) = status(&y, &rw16(0x8a, 0, 1), Bytes::from(vec![9u8; 512]), 0).await;
    assert_eq!(
        st, 0x18,
        "a write through B must conflict with A's reservation"
    );
    let (st, _, _) = status(&y, &rw16(0x88, 0, 1), Bytes::new(), 512).await;
    assert_eq!(st, 0, "a read through B is allowed under write exclusive");
    // B reports A's registration and reservation.
    let (st, _, keys) = status(
        &y,
        &[0x5e, 0, 0, 0, 0, 0, 0, 0x10, 0, 0],
        Bytes::new(),
        4096,
    )
    .await;
    assert_eq!(st, 0);
    assert_eq!(
        u32::from_be_bytes(keys[4..8].try_into().unwrap()),
        8,
        "one key"
    );
    assert_eq!(u64::from_be_bytes(keys[8..16].try_into().unwrap()), KX);
    // Y registers through B (APTPL) and preempts X.
    let (cdb, p) = pr_out(0, 0, 0, KY, true);
    assert_eq!(status(&y, &cdb, p, 0).await.0, 0, "REGISTER via B");
    let (cdb, p) = pr_out(4, 1, KY, KX, true);
    let (st, sense, _) = status(&y, &cdb, p, 0).await;
    assert_eq!(st, 0, "PREEMPT via B: {sense:?}");
    // X, through A, is told its registration was preempted, and conflicts.
    let (st, sense, _) = status(&x, &[0; 6], Bytes::new(), 0).await;
    assert_eq!(
        (st, sense),
        (2, Some((0x06, 0x2a, 0x05))),
        "REGISTRATIONS PREEMPTED via A"
    );
    let (st, _, _) = status(&x, &rw16(0x8a, 0, 1), Bytes::from(vec![9u8; 512]), 0).await;
    assert_eq!(
        st, 0x18,
        "X's write through A conflicts with Y's reservation"
    );
    let (st, _, _) = status(&y, &rw16(0x8a, 0, 1), Bytes::from(vec![7u8; 512]), 0).await;
    assert_eq!(st, 0, "the holder writes through B");

    drop((x, y));

    // Both gateways restart (kill -9): Y's APTPL reservation is still there.
    ga.child.kill().unwrap();
    gb.child.kill().unwrap();
    let _ = (ga.child.wait(), gb.child.wait());
    let ga = gateway(&ceph, "pr", 1);
    let w = session(&ga.addr, "iqn.2026-11.org.ethersan:w").await;
    let (st, _, res) = status(
        &w,
        &[0x5e, 1, 0, 0, 0, 0, 0, 0x10, 0, 0],
        Bytes::new(),
        4096,
    )
    .await;
    assert_eq!(st, 0);
    assert_eq!(
        u32::from_be_bytes(res[4..8].try_into().unwrap()),
        16,
        "a reservation is held"
    );
    assert_eq!(
        u64::from_be_bytes(res[8..16].try_into().unwrap()),
        KY,
        "by Y"
    );
    assert_eq!(res[21] & 0x0f, 1, "write exclusive");
    drop(w);
    drop(ga);
}

/// 64 KiB chunks of `data`: the even ones (`parity` 0) or the odd ones.
const CHUNK: usize = 64 << 10;

async fn write_chunks(s: &Session, data: &[u8], parity: usize) {
    for i in (parity..data.len() / CHUNK).step_by(2) {
        let at = i * CHUNK;
        let cdb = rw16(0x8a, (at / 512) as u64, (CHUNK / 512) as u32);
        let (st, sense, _) =
            status(s, &cdb, Bytes::copy_from_slice(&data[at..at + CHUNK]), 0).await;
        assert_eq!(st, 0, "write of chunk {i}: {sense:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_both_interleave_and_one_gateway_survives_the_other() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
    let ceph = Ceph::start();
    let mut ga = gateway(&ceph, "mp", 1);
    let gb = gateway(&ceph, "mp", 2);
    let a = session(&ga.addr, "iqn.2026-11.org.ethersan:a").await;
    let b = session(&gb.addr, "iqn.2026-11.org.ethersan:b").await;
    // 64 KiB chunks over 16 MiB: even ones through A, odd ones through B,
    // at the same time (the image's exclusive lock moves back and forth).
    let data = pattern(16 << 20, 21);
    let t = std::time::Instant::now();
    tokio::join!(write_chunks(&a, &data, 0), write_chunks(&b, &data, 1));
    println!(
        "16 MiB written through two gateways at once in {:?}",
        t.elapsed()
    );
    // Gateway A dies; B reads everything back, and goes on writing.
    ga.child.kill().unwrap();
    let _ = ga.child.wait();
    let mut read = Vec::new();
    for i in 0..16u64 {
        let (st, _, d) = status(&b, &rw16(0x88, i * 2048, 2048), Bytes::new(), 1 << 20).await;
        assert_eq!(st, 0);
        read.extend_from_slice(&d);
    }
    assert!(read == data, "B reads other data than both wrote");
    let (st, sense, _) = status(&b, &rw16(0x8a, 0, 8), Bytes::from(vec![3u8; 4096]), 0).await;
    assert_eq!(st, 0, "B writes after A died: {sense:?}");
    drop((a, b));
    drop(gb);
    let mut expected = data;
    expected[..4096].fill(3);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mp.img");
    ceph.rbd_ok(&["export", "rbd/mp", out.to_str().unwrap()]);
    assert!(
        std::fs::read(out).unwrap()[..16 << 20] == expected[..],
        "the cluster holds other data"
    );
}
