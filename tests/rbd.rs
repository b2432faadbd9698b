//! One gateway over a Ceph RBD image, against a real single-node cluster
//! that each test starts (tests/common/ceph.rs): libiscsi's conformance
//! suites, QEMU's iSCSI driver, `ethersan cp --verify`, COMPARE AND WRITE,
//! UNMAP and GET LBA STATUS checked against the cluster's own view (`rbd
//! export`, `rbd diff`), an OSD killed mid-write, the cluster stopped, and
//! an image resized in the cluster.
//!
//! The tests take one lock: each runs its own cluster, and two at once on
//! two cores would only make every bound harder to keep.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::ceph::Ceph;
use common::{pattern, require_tool, run, Server, IQN};
use ethersan_initiator::{connect, LoginOptions, Session};

/// Held by each test for its whole run (a tokio mutex: the async tests
/// hold it across their awaits, each on its own runtime).
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The `--lun` spec of image `rbd/NAME` on `ceph`, created with `size`.
fn spec(ceph: &Ceph, name: &str, size: &str, extra: &str) -> String {
    format!("rbd:rbd/{name}:{size},conf={}{extra}", ceph.conf_str())
}

/// The image's contents as the cluster has them.
fn export(ceph: &Ceph, name: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("export.img");
    ceph.rbd_ok(&["export", &format!("rbd/{name}"), out.to_str().unwrap()]);
    std::fs::read(out).unwrap()
}

async fn session(addr: &str) -> Session {
    let opts = LoginOptions {
        initiator_name: "iqn.2026-11.org.ethersan:rbd-test".into(),
        target_name: Some(IQN.to_string()),
        ..LoginOptions::default()
    };
    let s = connect(addr, &opts).await.expect("login");
    s.clear_unit_attention(0).await.expect("TUR");
    s
}

fn write16(lba: u64, blocks: u32) -> Vec<u8> {
    let mut cdb = vec![0x8a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

fn read16(lba: u64, blocks: u32) -> Vec<u8> {
    let mut cdb = write16(lba, blocks);
    cdb[0] = 0x88;
    cdb
}

/// The suites that apply to an RBD LUN (those of tests/libiscsi.rs but
/// the ones about removable media, read-only LUNs, SANITIZE, WRITE ATOMIC
/// and EXTENDED COPY, which test the SCSI layer the same way whatever the
/// store; CompareAndWrite, WriteSame, Unmap and GetLBAStatus use the
/// cluster's own operations here).
///
/// MultipathIO runs first: its COMPARE AND WRITE test expects the block
/// after the 256 it fills to read zeros, as on a fresh image (each suite in
/// tests/libiscsi.rs gets a fresh LUN; here one image serves them all).
const SUITES: &[&str] = &[
    "MultipathIO",
    "TestUnitReady",
    "Inquiry",
    "Mandatory",
    "ReadCapacity16",
    "Read10",
    "Read16",
    "Write10",
    "Write16",
    "WriteVerify16",
    "Verify16",
    "WriteSame10",
    "WriteSame16",
    "Unmap",
    "CompareAndWrite",
    "OrWrite",
    "GetLBAStatus",
    "PrinReadKeys",
    "PrinReportCapabilities",
    "ProutRegister",
    "ProutReserve",
    "ProutClear",
    "ProutPreempt",
];

#[test]
fn libiscsi_qemu_and_cp_on_an_rbd_lun() {
    let _one = ONE_CLUSTER_AT_A_TIME.blocking_lock();
    require_tool("iscsi-test-cu");
    require_tool("qemu-img");
    let ceph = Ceph::start();
    {
        // pbs=512: libiscsi's GetLBAStatus.UnmapSingle expects one logical
        // block per physical block (see tests/libiscsi.rs).
        let server = Server::start_portals(2, &[&spec(&ceph, "suites", "128M", ",pbs=512")]);
        let mut problems = Vec::new();
        for suite in SUITES {
            let (url0, url1) = (server.url_via(0, 0), server.url_via(1, 0));
            let (r, text) = common::run_suite(suite, &[&url0, &url1]);
            println!(
                "{suite:<24} passed {:>3} failed {:>3} skipped {:>3}",
                r.passed, r.failed, r.skipped
            );
            if !r.completed || r.passed + r.failed + r.skipped == 0 || r.failed > 0 {
                problems.push(format!("{suite}: {r:?}\n{text}"));
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    }
    {
        // QEMU's iSCSI driver: a 16 MiB image in, read back out.
        let server = Server::start(&[&spec(&ceph, "qemu", "32M", "")]);
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.raw");
        let back = dir.path().join("back.raw");
        let data = pattern(16 << 20, 7);
        std::fs::write(&src, &data).unwrap();
        let url = server.url(0);
        let out = run(
            "qemu-img",
            &[
                "convert",
                "-n",
                "-f",
                "raw",
                "-O",
                "raw",
                src.to_str().unwrap(),
                &url,
            ],
            Duration::from_secs(120),
        );
        assert!(
            out.status.success(),
            "qemu-img convert: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = run(
            "qemu-img",
            &[
                "dd",
                "-f",
                "raw",
                "-O",
                "raw",
                "bs=1M",
                "count=16",
                &format!("if={url}"),
                &format!("of={}", back.display()),
            ],
            Duration::from_secs(120),
        );
        assert!(
            out.status.success(),
            "qemu-img dd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            std::fs::read(&back).unwrap() == data,
            "QEMU read back other data"
        );
        drop(server);
        assert!(
            export(&ceph, "qemu")[..16 << 20] == data[..],
            "the cluster holds other data than QEMU wrote"
        );
    }
    {
        // ethersan cp --verify, then the cluster's copy compared.
        let server = Server::start(&[&spec(&ceph, "cp", "24M", "")]);
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.raw");
        let data = pattern(24 << 20, 11);
        std::fs::write(&src, &data).unwrap();
        let out = common::ethersan(&["cp", "--verify", src.to_str().unwrap(), &server.url(0)]);
        common::ok_out(&out, "ethersan cp --verify");
        drop(server);
        assert!(
            export(&ceph, "cp") == data,
            "rbd export differs from what cp wrote"
        );
    }
}

/// The allocated extents `rbd diff` reports, as (offset, length).
fn rbd_diff(ceph: &Ceph, name: &str) -> Vec<(u64, u64)> {
    let text = ceph.rbd_ok(&["diff", "--format", "json", &format!("rbd/{name}")]);
    let v: serde_json::Value = serde_json::from_str(&text).expect("rbd diff JSON");
    v.as_array()
        .expect("a list")
        .iter()
        .filter(|e| e["exists"].as_str() == Some("true") || e["exists"] == true)
        .map(|e| (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_write_unmap_and_lba_status_match_the_cluster() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
    let ceph = Ceph::start();
    const MIB: u64 = 1 << 20;
    // 16 MiB: four 4 MiB objects.
    let server = Server::start(&[&spec(&ceph, "caw", "16M", "")]);
    let s = session(&server.addr).await;
    let data = pattern(16 << 20, 3);
    for chunk in 0..16u64 {
        let at = (chunk * MIB) as usize;
        let r = s
            .command(
                0,
                &write16(chunk * 2048, 2048),
                Bytes::copy_from_slice(&data[at..at + MIB as usize]),
                0,
            )
            .await
            .unwrap();
        assert_eq!(r.status, 0, "WRITE(16) at MiB {chunk}: {:?}", r.sense_key());
    }
    // COMPARE AND WRITE, matching: the new block lands.
    let mut expected = data.clone();
    let old = &data[512 * 100..512 * 101];
    let new = vec![0x5au8; 512];
    let mut both = old.to_vec();
    both.extend_from_slice(&new);
    let caw = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 100, 0, 0, 0, 1, 0, 0];
    let r = s.command(0, &caw, Bytes::from(both), 0).await.unwrap();
    assert_eq!(
        r.status,
        0,
        "COMPARE AND WRITE (equal): {:?}",
        r.sense_key()
    );
    expected[512 * 100..512 * 101].copy_from_slice(&new);
    // Not matching at byte 77: MISCOMPARE, INFORMATION 77, nothing written.
    let mut wrong = new.clone();
    wrong[77] ^= 0xff;
    wrong.extend_from_slice(&[0xa5u8; 512]);
    let r = s.command(0, &caw, Bytes::from(wrong), 0).await.unwrap();
    assert_eq!(r.status, 2, "COMPARE AND WRITE (different) must fail");
    assert_eq!(
        r.sense_key(),
        Some((0x0e, 0x1d, 0x00)),
        "MISCOMPARE DURING VERIFY OPERATION"
    );
    let sense = &r.sense;
    let info = if sense.first().map(|b| b & 0x7f) == Some(0x70) {
        u64::from(u32::from_be_bytes([sense[3], sense[4], sense[5], sense[6]]))
    } else {
        // Descriptor format: the information descriptor (type 0).
        let d = &sense[8..];
        assert_eq!(d[0], 0, "information descriptor first: {sense:?}");
        u64::from_be_bytes(d[4..12].try_into().unwrap())
    };
    assert_eq!(info, 77, "the miscompare's offset");
    // UNMAP MiB 4..12 (objects 1 and 2).
    let mut param = vec![0u8; 24];
    param[0..2].copy_from_slice(&22u16.to_be_bytes());
    param[2..4].copy_from_slice(&16u16.to_be_bytes());
    param[8..16].copy_from_slice(&(4 * 2048u64).to_be_bytes());
    param[16..20].copy_from_slice(&(8 * 2048u32).to_be_bytes());
    let r = s
        .command(
            0,
            &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
            Bytes::from(param),
            0,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 0, "UNMAP: {:?}", r.sense_key());
    expected[(4 * MIB) as usize..(12 * MIB) as usize].fill(0);
    // What the initiator reads, what the cluster holds: the same.
    let mut read = Vec::new();
    for chunk in 0..16u64 {
        let r = s
            .command(0, &read16(chunk * 2048, 2048), Bytes::new(), MIB as u32)
            .await
            .unwrap();
        assert_eq!(r.status, 0);
        read.extend_from_slice(&r.data);
    }
    assert!(read == expected, "the LUN reads other data than written");
    // GET LBA STATUS from LBA 0: mapped 0..4 MiB, deallocated 4..12 MiB,
    // mapped 12..16 MiB, as `rbd diff` says.
    let r = s
        .command(
            0,
            &[0x9e, 0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0],
            Bytes::new(),
            4096,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 0, "GET LBA STATUS: {:?}", r.sense_key());
    let mut extents = Vec::new();
    for d in r.data[8..].chunks_exact(16) {
        let lba = u64::from_be_bytes(d[0..8].try_into().unwrap());
        let blocks = u64::from(u32::from_be_bytes(d[8..12].try_into().unwrap()));
        extents.push((lba * 512, blocks * 512, d[12] & 0x0f == 0));
    }
    let mapped: Vec<(u64, u64)> = extents.iter().filter(|e| e.2).map(|e| (e.0, e.1)).collect();
    let mut diff = rbd_diff(&ceph, "caw");
    diff.sort();
    // rbd diff lists extents per object; merge neighbours.
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (o, l) in diff {
        match merged.last_mut() {
            Some(last) if last.0 + last.1 == o => last.1 += l,
            _ => merged.push((o, l)),
        }
    }
    assert_eq!(mapped, merged, "GET LBA STATUS {extents:?} vs rbd diff");
    assert_eq!(merged, vec![(0, 4 * MIB), (12 * MIB, 4 * MIB)]);
    s.logout().await.ok();
    drop(server);
    assert!(export(&ceph, "caw") == expected, "rbd export differs");
}

#[test]
fn an_osd_killed_mid_write_loses_nothing_acknowledged() {
    let _one = ONE_CLUSTER_AT_A_TIME.blocking_lock();
    let ceph = Ceph::start();
    let server = Server::start(&[&spec(&ceph, "crash", "64M", ",timeout=30")]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.raw");
    let data = pattern(64 << 20, 5);
    std::fs::write(&src, &data).unwrap();
    let mut cp = std::process::Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(["cp", "--verify", src.to_str().unwrap(), &server.url(0)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    ceph.kill_osd();
    std::thread::sleep(Duration::from_secs(3));
    ceph.start_osd();
    let deadline = Instant::now() + Duration::from_secs(120);
    while cp.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "cp did not finish within 120 s of the OSD's restart"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = cp.wait_with_output().unwrap();
    // The copy rides through (librbd resends to the restarted OSD within
    // the LUN's timeout) and its verify pass read everything back.
    common::ok_out(&out, "ethersan cp --verify across an OSD kill -9");
    drop(server);
    assert!(
        export(&ceph, "crash") == data,
        "the cluster lost acknowledged writes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_cluster_fails_commands_within_the_bound() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
    let ceph = Ceph::start();
    // timeout=4: the cluster has 4 s to answer each operation.
    let mut server = Server::start(&[&spec(&ceph, "stopped", "16M", ",timeout=4")]);
    let s = session(&server.addr).await;
    let r = s
        .command(0, &write16(0, 8), Bytes::from(vec![1u8; 4096]), 0)
        .await
        .unwrap();
    assert_eq!(r.status, 0);
    ceph.stop_osd();
    // Reads and writes the OSD no longer answers fail with a sense within
    // the bound, and the session stays usable.
    for (what, cdb, data, len) in [
        ("READ", read16(2048, 8), Bytes::new(), 4096u32),
        ("WRITE", write16(4096, 8), Bytes::from(vec![2u8; 4096]), 0),
    ] {
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(25), s.command(0, &cdb, data, len))
            .await
            .unwrap_or_else(|_| panic!("{what} hung with the OSD stopped"))
            .unwrap();
        let took = t.elapsed();
        assert_eq!(r.status, 2, "{what} with the OSD stopped must fail");
        let (key, asc, ascq) = r.sense_key().expect("sense data");
        println!("{what}: sense {key:#x}/{asc:#x}/{ascq:#x} after {took:?}");
        assert_eq!(
            (key, asc, ascq),
            (0x0b, 0x08, 0x01),
            "ABORTED COMMAND / LOGICAL UNIT COMMUNICATION TIME-OUT"
        );
        assert!(
            took < Duration::from_secs(15),
            "{what} took {took:?}, beyond the 4 s bound plus margin"
        );
    }
    // Shutdown with the cluster unreachable completes.
    let t = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the server did not stop within 30 s with the cluster unreachable"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("shutdown with the OSD stopped took {:?}", t.elapsed());
    drop(s);
    ceph.start_osd();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_resized_in_the_cluster_is_seen_by_the_initiator() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
    let ceph = Ceph::start();
    let server = Server::start(&[&spec(&ceph, "grow", "32M", "")]);
    let s = session(&server.addr).await;
    ceph.rbd_ok(&["resize", "--size", "96M", "rbd/grow"]);
    // CAPACITY DATA HAS CHANGED arrives, then READ CAPACITY(16) says 96 MiB.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = s.command(0, &[0; 6], Bytes::new(), 0).await.unwrap();
        if r.status == 2 {
            assert_eq!(
                r.sense_key(),
                Some((0x06, 0x2a, 0x09)),
                "CAPACITY DATA HAS CHANGED"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no unit attention within 15 s of rbd resize"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = s
        .command(
            0,
            &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
            Bytes::new(),
            32,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 0);
    let last = u64::from_be_bytes(r.data[0..8].try_into().unwrap());
    assert_eq!(
        (last + 1) * 512,
        96 << 20,
        "READ CAPACITY(16) after the resize"
    );
    s.logout().await.ok();
    drop(server);
}
