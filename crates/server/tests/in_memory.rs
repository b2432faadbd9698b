//! The server's connection handling driven by the initiator library over an
//! in-memory pipe: no sockets, whole sessions end to end.

use std::sync::Arc;

use bytes::Bytes;
use ethersan_initiator::{login, LoginOptions, Session};
use ethersan_server::config::Config;
use ethersan_server::Server;

const IQN: &str = "iqn.2026-11.org.ethersan:mem";

async fn server(extra_options: &str) -> Arc<Server> {
    let text = format!(
        "portals = [\"127.0.0.1:0\"]\n[options]\nnop_interval_secs = 0\n{extra_options}\n[[target]]\nname = \"{IQN}\"\nlun = [\"ram:16M\", \"ram:4M,bs=4096\"]\n"
    );
    let cfg = Config::from_toml_str(&text, "test").unwrap();
    Arc::new(Server::bind(&cfg).await.unwrap())
}

/// Connect a fresh initiator to `srv` through an in-memory pipe.
async fn connect(
    srv: &Arc<Server>,
    opts: LoginOptions,
) -> Result<Session, ethersan_initiator::Error> {
    let (client, target) = tokio::io::duplex(1 << 20);
    let (trd, twr) = tokio::io::split(target);
    let srv = srv.clone();
    tokio::spawn(async move { srv.serve_stream(trd, twr, "memory").await });
    let (crd, cwr) = tokio::io::split(client);
    login(crd, cwr, &opts).await
}

fn normal(digests: bool) -> LoginOptions {
    LoginOptions {
        target_name: Some(IQN.to_string()),
        header_digest: digests,
        data_digest: digests,
        ..LoginOptions::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// Clear the POWER ON unit attention a new nexus starts with.
async fn clear_ua(s: &Session, lun: u64) {
    for _ in 0..4 {
        let r = s
            .command(lun, &[0, 0, 0, 0, 0, 0], Bytes::new(), 0)
            .await
            .unwrap();
        if r.status == 0 {
            return;
        }
        assert_eq!(
            r.sense_key().map(|k| k.0),
            Some(6),
            "expected a unit attention, got {:?}",
            r.sense_key()
        );
    }
    panic!("unit attention never cleared");
}

#[tokio::test]
async fn write_read_roundtrip_with_and_without_digests() {
    let srv = server("").await;
    for digests in [false, true] {
        let s = connect(&srv, normal(digests)).await.unwrap();
        assert_eq!(s.params().header_digest, digests);
        clear_ua(&s, 0).await;
        let (blocks, bs) = s.read_capacity(0).await.unwrap();
        assert_eq!((blocks, bs), (16 << 20 >> 9, 512));
        // 2 MiB: immediate data, unsolicited Data-Out, then R2T bursts.
        let data = pattern(2 << 20, digests as u8);
        let w = s
            .write16(0, 100, Bytes::from(data.clone()), bs, true)
            .await
            .unwrap();
        assert_eq!(w.status, 0, "write failed: {:?}", w.sense_key());
        let placed = s.placed_bytes();
        let r = s
            .read16(0, 100, (data.len() / 512) as u32, bs)
            .await
            .unwrap();
        assert_eq!(r.status, 0);
        assert!(r.data == data, "read back differs");
        // Without a data digest the Data-In lands in the read's buffer
        // from the stream; with one, each PDU is read whole and checked.
        let want = if digests { 0 } else { data.len() as u64 };
        assert_eq!(s.placed_bytes() - placed, want, "digests {digests}");
        s.logout().await.unwrap();
    }
}

/// Reads whose Data-In is placed from the stream: a read shorter than its
/// buffer (underflow), a read that fails with no data (its registration
/// dropped), reads of many sizes in flight at once, and the session goes
/// on reading right after each.
#[tokio::test]
async fn placed_reads_end_short_fail_and_run_concurrently() {
    let srv = server("").await;
    let s = connect(&srv, normal(false)).await.unwrap();
    clear_ua(&s, 0).await;
    let data = pattern(1 << 20, 9);
    let w = s
        .write16(0, 0, Bytes::from(data.clone()), 512, false)
        .await
        .unwrap();
    assert_eq!(w.status, 0);
    // INQUIRY with room for 255 bytes: fewer come, the rest is residual.
    let before = s.placed_bytes();
    let r = s
        .command(0, &[0x12, 0, 0, 0, 255, 0], Bytes::new(), 255)
        .await
        .unwrap();
    assert_eq!(r.status, 0);
    assert!(r.underflow && r.residual > 0, "{r:?}");
    assert_eq!(r.data.len(), 255 - r.residual as usize);
    assert_eq!(r.data[0] & 0x1f, 0, "a disk");
    assert_eq!(s.placed_bytes() - before, r.data.len() as u64);
    // Past the end: CHECK CONDITION without data; then a good read.
    let r = s.read16(0, 16 << 20 >> 9, 8, 512).await.unwrap();
    assert_eq!(r.status, 2);
    assert!(r.data.is_empty());
    let r = s.read16(0, 8, 8, 512).await.unwrap();
    assert!(r.status == 0 && r.data[..] == data[4096..8192]);
    // Many reads of different sizes at once, each with its own bytes.
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let (s, data) = (s.clone(), data.clone());
        tasks.push(tokio::spawn(async move {
            let blocks = 1 + (i * 37 % 256) as u32;
            let lba = i * 61 % 1024;
            let r = s.read16(0, lba, blocks, 512).await.unwrap();
            assert_eq!(r.status, 0);
            let at = lba as usize * 512;
            assert!(
                r.data[..] == data[at..at + blocks as usize * 512],
                "read {i}"
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.logout().await.unwrap();
}

/// The initiator cuts immediate data and Data-Out to the target's
/// MaxRecvDataSegmentLength (not its own, larger, declaration).
#[tokio::test]
async fn data_out_respects_the_targets_segment_limit() {
    let srv = server("max_recv_data_segment_length = 8192").await;
    let s = connect(&srv, normal(false)).await.unwrap();
    assert_eq!(s.params().max_data_out_segment(), 8192);
    assert_eq!(s.params().max_data_in_segment(), 262_144);
    clear_ua(&s, 0).await;
    let data = pattern(256 << 10, 7);
    let w = s
        .write16(0, 8, Bytes::from(data.clone()), 512, false)
        .await
        .unwrap();
    assert_eq!(w.status, 0, "write failed: {:?}", w.sense_key());
    let r = s
        .read16(0, 8, (data.len() / 512) as u32, 512)
        .await
        .unwrap();
    assert_eq!(r.status, 0);
    assert!(r.data == data, "read back differs");
    s.logout().await.unwrap();
}

/// A CDB longer than 16 bytes travels in an Extended CDB AHS, built by the
/// initiator and read by the target through the one framer: the command is
/// answered (not rejected as a malformed PDU) and the session goes on.
#[tokio::test]
async fn extended_cdb_crosses_the_wire() {
    let srv = server("").await;
    for digests in [false, true] {
        let s = connect(&srv, normal(digests)).await.unwrap();
        clear_ua(&s, 0).await;
        // TEST UNIT READY padded to 32 bytes.
        let r = s.command(0, &[0u8; 32], Bytes::new(), 0).await.unwrap();
        assert_eq!(r.status, 0, "sense {:?}", r.sense_key());
        let (blocks, _) = s.read_capacity(0).await.unwrap();
        assert_eq!(blocks, 16 << 20 >> 9);
        s.logout().await.unwrap();
    }
}

#[tokio::test]
async fn many_commands_in_flight() {
    let srv = server("").await;
    let s = connect(&srv, normal(false)).await.unwrap();
    clear_ua(&s, 1).await;
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(8192, i as u8);
            let w = s
                .write16(1, i * 2, Bytes::from(data.clone()), 4096, false)
                .await
                .unwrap();
            assert_eq!(w.status, 0);
            let r = s.read16(1, i * 2, 2, 4096).await.unwrap();
            assert_eq!(r.status, 0);
            assert!(r.data == data);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.logout().await.unwrap();
}

#[tokio::test]
async fn discovery_lists_targets_and_portals() {
    let srv = server("").await;
    let s = connect(&srv, LoginOptions::default()).await.unwrap();
    let keys = s
        .text(vec![("SendTargets".into(), "All".into())])
        .await
        .unwrap();
    assert_eq!(keys[0], ("TargetName".to_string(), IQN.to_string()));
    assert!(
        keys.iter()
            .any(|(k, v)| k == "TargetAddress" && v.starts_with("127.0.0.1:") && v.ends_with(",1")),
        "{keys:?}"
    );
    // SCSI commands have no place in a discovery session.
    assert!(s
        .command(0, &[0, 0, 0, 0, 0, 0], Bytes::new(), 0)
        .await
        .is_err());
}

#[tokio::test]
async fn unknown_target_is_refused_with_not_found() {
    let srv = server("").await;
    let opts = LoginOptions {
        target_name: Some("iqn.2026-11.org.ethersan:nope".into()),
        ..LoginOptions::default()
    };
    match connect(&srv, opts).await {
        Err(ethersan_initiator::Error::LoginRefused { class, detail }) => {
            assert_eq!((class, detail), (2, 3))
        }
        other => panic!("expected a login reject, got {other:?}"),
    }
}

#[tokio::test]
async fn scsi_errors_carry_the_right_sense() {
    let srv = server("").await;
    let s = connect(&srv, normal(false)).await.unwrap();
    clear_ua(&s, 0).await;
    // READ(10) past the end: LOGICAL BLOCK ADDRESS OUT OF RANGE.
    let r = s
        .command(0, &[0x28, 0, 0, 0, 0x80, 0, 0, 0, 1, 0], Bytes::new(), 512)
        .await
        .unwrap();
    assert_eq!(r.status, 2);
    assert_eq!(r.sense_key(), Some((5, 0x21, 0)));
    // Unknown opcode.
    let r = s
        .command(0, &[0xc7, 0, 0, 0, 0, 0], Bytes::new(), 0)
        .await
        .unwrap();
    assert_eq!(r.sense_key(), Some((5, 0x20, 0)));
    // A LUN that does not exist.
    let r = s
        .command(9, &[0, 0, 0, 0, 0, 0], Bytes::new(), 0)
        .await
        .unwrap();
    assert_eq!(r.sense_key(), Some((5, 0x25, 0)));
    // The session is still good.
    let r = s.read16(0, 0, 1, 512).await.unwrap();
    assert_eq!(r.status, 0);
}
