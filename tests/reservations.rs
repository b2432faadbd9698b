//! Persistent reservations with APTPL survive a kill -9 of the server.

mod common;

use bytes::Bytes;
use common::{Server, IQN};
use ethersan_initiator::{connect, LoginOptions, Session};

const KEY: u64 = 0x00ab_cdef_1234_5678;

async fn session(addr: &str, initiator: &str, isid: [u8; 6]) -> Session {
    let opts = LoginOptions {
        initiator_name: initiator.to_string(),
        target_name: Some(IQN.to_string()),
        isid,
        ..LoginOptions::default()
    };
    let s = connect(addr, &opts).await.expect("login");
    s.clear_unit_attention(0).await.expect("TUR");
    s
}

fn pr_out(action: u8, scope_type: u8, key: u64, sakey: u64, aptpl: bool) -> (Vec<u8>, Bytes) {
    let mut cdb = vec![0x5f, action, scope_type, 0, 0, 0, 0, 0, 24, 0];
    cdb[1] = action;
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sakey.to_be_bytes());
    p[20] = u8::from(aptpl);
    (cdb, Bytes::from(p))
}

async fn pr_in(s: &Session, action: u8) -> Vec<u8> {
    let r = s
        .command(
            0,
            &[0x5e, action, 0, 0, 0, 0, 0, 0x10, 0, 0],
            Bytes::new(),
            4096,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 0, "PR IN failed: {:?}", r.sense_key());
    r.data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aptpl_reservation_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let lun = format!("{}:64M", dir.path().join("pr.img").display());
    let isid = [0x80, 1, 2, 3, 4, 5];
    let holder = "iqn.2026-11.org.ethersan:holder";
    let mut server = Server::start(&[&lun]);
    {
        let s = session(&server.addr, holder, isid).await;
        let (cdb, p) = pr_out(6, 0, 0, KEY, true);
        assert_eq!(
            s.command(0, &cdb, p, 0).await.unwrap().status,
            0,
            "REGISTER AND IGNORE"
        );
        let (cdb, p) = pr_out(1, 0x01, KEY, 0, true);
        assert_eq!(
            s.command(0, &cdb, p, 0).await.unwrap().status,
            0,
            "RESERVE (write exclusive)"
        );
    }
    // kill -9: no chance to flush or clean up.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    assert!(
        dir.path().join("pr.img.pr").is_file(),
        "APTPL state file missing"
    );

    let server = Server::start(&[&lun]);
    let other = session(
        &server.addr,
        "iqn.2026-11.org.ethersan:other",
        [0x80, 9, 9, 9, 9, 9],
    )
    .await;
    let keys = pr_in(&other, 0).await;
    assert_eq!(
        u32::from_be_bytes(keys[4..8].try_into().unwrap()),
        8,
        "one key registered"
    );
    assert_eq!(u64::from_be_bytes(keys[8..16].try_into().unwrap()), KEY);
    let res = pr_in(&other, 1).await;
    assert_eq!(
        u32::from_be_bytes(res[4..8].try_into().unwrap()),
        16,
        "a reservation is held"
    );
    assert_eq!(u64::from_be_bytes(res[8..16].try_into().unwrap()), KEY);
    assert_eq!(res[21] & 0x0f, 1, "write exclusive");
    // The reservation is enforced: others may read but not write.
    assert_eq!(other.read16(0, 0, 1, 512).await.unwrap().status, 0);
    assert_eq!(
        other
            .write16(0, 0, Bytes::from(vec![1u8; 512]), 512, false)
            .await
            .unwrap()
            .status,
        0x18
    );
    // The holder (same initiator and ISID) still holds it and may write.
    let s = session(&server.addr, holder, isid).await;
    assert_eq!(
        s.write16(0, 0, Bytes::from(vec![1u8; 512]), 512, false)
            .await
            .unwrap()
            .status,
        0
    );
    // Unregistering clears the saved state.
    let (cdb, p) = pr_out(0, 0, KEY, 0, true);
    assert_eq!(s.command(0, &cdb, p, 0).await.unwrap().status, 0);
    assert!(!dir.path().join("pr.img.pr").exists());
}

/// WRITE ATOMIC(16) obeys a persistent reservation like every other
/// write: from an initiator that holds no registration, under Write
/// Exclusive held by another, RESERVATION CONFLICT and nothing written;
/// the holder's goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_atomic_from_an_unregistered_initiator_is_a_reservation_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let lun = format!("{}:64M", dir.path().join("atomic.img").display());
    let server = Server::start(&[&lun]);
    let holder = session(
        &server.addr,
        "iqn.2026-11.org.ethersan:holder",
        [0x80, 1, 1, 1, 1, 1],
    )
    .await;
    let other = session(
        &server.addr,
        "iqn.2026-11.org.ethersan:other",
        [0x80, 2, 2, 2, 2, 2],
    )
    .await;
    let (cdb, p) = pr_out(6, 0, 0, KEY, false);
    assert_eq!(holder.command(0, &cdb, p, 0).await.unwrap().status, 0);
    let (cdb, p) = pr_out(1, 0x01, KEY, 0, false);
    assert_eq!(holder.command(0, &cdb, p, 0).await.unwrap().status, 0);
    // 8 blocks of 512 bytes at LBA 0: one whole 4 KiB atomic unit.
    let mut atomic = vec![0u8; 16];
    atomic[0] = 0x9c;
    atomic[13] = 8;
    let r = other
        .command(0, &atomic, Bytes::from(vec![0xbb; 4096]), 0)
        .await
        .unwrap();
    assert_eq!(r.status, 0x18, "RESERVATION CONFLICT: {:?}", r.sense_key());
    let back = other.read16(0, 0, 8, 512).await.unwrap();
    assert_eq!(back.status, 0);
    assert!(back.data.iter().all(|b| *b == 0), "nothing written");
    let r = holder
        .command(0, &atomic, Bytes::from(vec![0xaa; 4096]), 0)
        .await
        .unwrap();
    assert_eq!(
        r.status,
        0,
        "the holder's WRITE ATOMIC: {:?}",
        r.sense_key()
    );
    let back = other.read16(0, 0, 8, 512).await.unwrap();
    assert!(back.data.iter().all(|b| *b == 0xaa), "the holder's data");
}
