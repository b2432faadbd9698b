//! Every transport obeys the LUN's rules: AoE I/O to a LUN that is also
//! exported over iSCSI passes the same gates as an iSCSI command. An
//! iSCSI initiator (ethersan's initiator library) holds a persistent
//! reservation, moves the ALUA state, ejects a removable medium and starts
//! a SANITIZE; an AoE initiator (ethersan's AoE protocol core, over a unix
//! datagram segment as QEMU's `-netdev dgram` speaks it) is refused with
//! the ATA abort error and the data stays as it was.

mod common;

use std::path::Path;

use bytes::Bytes;
use common::aoe::{ok_all, Wire};
use common::*;
use ethersan_aoe::ata;
use ethersan_aoe::initiator::{AtaRequest, CommandError, TargetInfo};
use ethersan_initiator::{connect, LoginOptions, Session};

const KEY: u64 = 0x0000_7e57_0000_0001;

/// The AoE initiator's end of the segment, with this test's MAC.
fn wire(dir: &Path) -> Wire {
    Wire::open(dir, "02:00:00:00:7e:01".parse().unwrap())
}

/// What this test sends over AoE.
trait Io {
    async fn write(&self, dev: &TargetInfo, data: &[u8]) -> Vec<Result<Vec<u8>, CommandError>>;
    async fn read(&self, dev: &TargetInfo) -> Vec<Result<Vec<u8>, CommandError>>;
}

impl Io for Wire {
    /// 4 KiB written at sector 0, one frame (2 sectors) a command.
    async fn write(&self, dev: &TargetInfo, data: &[u8]) -> Vec<Result<Vec<u8>, CommandError>> {
        let reqs = data
            .chunks(1024)
            .enumerate()
            .map(|(i, c)| AtaRequest::Write {
                lba: 2 * i as u64,
                data: c.to_vec(),
            })
            .collect();
        self.run(dev, reqs).await
    }

    /// The first 4 KiB, one frame a command.
    async fn read(&self, dev: &TargetInfo) -> Vec<Result<Vec<u8>, CommandError>> {
        let reqs = (0..4)
            .map(|i| AtaRequest::Read {
                lba: 2 * i,
                sectors: 2,
            })
            .collect();
        self.run(dev, reqs).await
    }
}

/// Every command ended with the ATA abort error.
#[track_caller]
fn all_aborted(rs: &[Result<Vec<u8>, CommandError>], what: &str) {
    assert!(!rs.is_empty());
    for r in rs {
        assert!(
            matches!(r, Err(CommandError::Ata { error, .. }) if error & ata::ERROR_ABRT != 0),
            "{what}: {rs:?}"
        );
    }
}

async fn session(addr: &str) -> Session {
    let opts = LoginOptions {
        initiator_name: "iqn.2026-11.org.ethersan:holder".to_string(),
        target_name: Some(IQN.to_string()),
        isid: [0x80, 7, 7, 7, 7, 7],
        ..LoginOptions::default()
    };
    let s = connect(addr, &opts).await.expect("login");
    for lun in 0..3 {
        s.clear_unit_attention(lun).await.expect("TUR");
    }
    s
}

/// PERSISTENT RESERVE OUT on LUN 0; its status.
async fn pr_out(s: &Session, action: u8, kind: u8, key: u64, sakey: u64) -> u8 {
    let cdb = [0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sakey.to_be_bytes());
    s.command(0, &cdb, Bytes::from(p), 0).await.unwrap().status
}

/// iSCSI's view of LUN `lun`'s first 4 KiB.
async fn iscsi_read(s: &Session, lun: u64) -> Vec<u8> {
    let r = s.read16(lun, 0, 8, 512).await.unwrap();
    assert_eq!(r.status, 0, "READ(16): {:?}", r.sense_key());
    r.data.to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aoe_obeys_reservations_alua_medium_and_sanitize_held_over_iscsi() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // LUN 0 plain, LUN 1 removable, LUN 2 sanitized slowly (1 MiB/s).
    let mut args: Vec<String> = ["serve", "--target", IQN, "--listen", "127.0.0.1:0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for l in ["ram:8M", "ram:8M,removable", "ram:16M,sanitize_rate=1M"] {
        args.push("--lun".into());
        args.push(l.into());
    }
    args.push("--aoe".into());
    args.push(format!(
        "unix:{},peer={}",
        d.join("target.sock").display(),
        d.join("client.sock").display()
    ));
    let server = Server::start_args(&args);
    let wire = wire(d);
    let found = wire.discover().await;
    let addrs: Vec<(u16, u8)> = found.iter().map(|t| (t.shelf, t.slot)).collect();
    assert_eq!(addrs, vec![(0, 0), (0, 1), (0, 2)], "{found:?}");
    let (e0, e1, e2) = (&found[0], &found[1], &found[2]);
    let holder = session(&server.addr).await;

    // Before any reservation AoE writes.
    let first = pattern(4096, 1);
    ok_all(wire.write(e0, &first).await);

    // Write Exclusive held over iSCSI: AoE writes and flushes are aborted,
    // reads go on, and the data is what it was, through both.
    assert_eq!(pr_out(&holder, 6, 0, 0, KEY).await, 0, "REGISTER");
    assert_eq!(pr_out(&holder, 1, 1, KEY, 0).await, 0, "RESERVE WE");
    let second = pattern(4096, 2);
    all_aborted(&wire.write(e0, &second).await, "write under WE");
    all_aborted(
        &wire.run(e0, vec![AtaRequest::Flush]).await,
        "flush under WE",
    );
    assert!(ok_all(wire.read(e0).await) == first, "AoE read under WE");
    assert!(
        iscsi_read(&holder, 0).await == first,
        "data changed under WE"
    );
    // The holder itself writes.
    let r = holder
        .write16(0, 0, Bytes::from(second.clone()), 512, false)
        .await
        .unwrap();
    assert_eq!(r.status, 0, "the holder's write");
    assert!(
        ok_all(wire.read(e0).await) == second,
        "AoE sees the holder's write"
    );

    // Exclusive Access: reads are aborted too.
    assert_eq!(pr_out(&holder, 2, 1, KEY, 0).await, 0, "RELEASE");
    assert_eq!(pr_out(&holder, 1, 3, KEY, 0).await, 0, "RESERVE EA");
    all_aborted(&wire.read(e0).await, "read under EA");
    all_aborted(&wire.write(e0, &first).await, "write under EA");
    assert!(
        iscsi_read(&holder, 0).await == second,
        "data changed under EA"
    );

    // Released: AoE writes again.
    assert_eq!(pr_out(&holder, 2, 3, KEY, 0).await, 0, "RELEASE");
    ok_all(wire.write(e0, &first).await);
    assert!(iscsi_read(&holder, 0).await == first);

    // ALUA standby (SET TARGET PORT GROUPS over iSCSI): AoE is refused,
    // and served again once active.
    let h = &holder;
    let set_tpg = move |state: u8| async move {
        let cdb = [0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];
        let p = Bytes::from(vec![0, 0, 0, 0, state, 0, 0, 1]);
        h.command(0, &cdb, p, 0).await.unwrap().status
    };
    assert_eq!(set_tpg(0x02).await, 0, "SET TARGET PORT GROUPS standby");
    all_aborted(&wire.read(e0).await, "read in standby");
    all_aborted(&wire.write(e0, &second).await, "write in standby");
    assert_eq!(set_tpg(0x00).await, 0, "SET TARGET PORT GROUPS active");
    assert!(
        ok_all(wire.read(e0).await) == first,
        "data changed in standby"
    );

    // No medium: LUN 1 ejected over iSCSI (START STOP UNIT, LOEJ).
    let lun1 = pattern(4096, 3);
    ok_all(wire.write(e1, &lun1).await);
    let eject = holder
        .command(1, &[0x1b, 0, 0, 0, 0x02, 0], Bytes::new(), 0)
        .await
        .unwrap();
    assert_eq!(eject.status, 0, "eject: {:?}", eject.sense_key());
    all_aborted(&wire.read(e1).await, "read without a medium");
    all_aborted(&wire.write(e1, &second).await, "write without a medium");
    let load = holder
        .command(1, &[0x1b, 0, 0, 0, 0x03, 0], Bytes::new(), 0)
        .await
        .unwrap();
    assert_eq!(load.status, 0, "load: {:?}", load.sense_key());
    assert!(
        ok_all(wire.read(e1).await) == lun1,
        "data changed while ejected"
    );

    // SANITIZE in progress on LUN 2 (OVERWRITE, IMMED, 16 s at 1 MiB/s).
    ok_all(wire.write(e2, &lun1).await);
    let mut param = vec![1, 0, 0x02, 0x00];
    param.extend_from_slice(&[0x5a; 512]);
    let sanitize = holder
        .command(
            2,
            &[0x48, 0x81, 0, 0, 0, 0, 0, 0x02, 0x04, 0],
            Bytes::from(param),
            0,
        )
        .await
        .unwrap();
    assert_eq!(sanitize.status, 0, "SANITIZE: {:?}", sanitize.sense_key());
    all_aborted(&wire.write(e2, &second).await, "write during SANITIZE");
    all_aborted(&wire.read(e2).await, "read during SANITIZE");
    // LUN 0 is not affected.
    ok_all(wire.write(e0, &second).await);
}
