//! LUNs added to and removed from a running server through the target
//! core's directory: a session logged in all along learns of the change
//! (REPORTED LUNS DATA HAS CHANGED, then REPORT LUNS), and libiscsi's
//! `iscsi-ls` sees the new LUN without a restart.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ethersan_initiator::{connect, LoginOptions, Session};
use ethersan_scsi::{LogicalUnit, LuConfig, LunPolicy, LunSlot};
use ethersan_server::config::Config;
use ethersan_server::Server;

const IQN: &str = "iqn.2026-11.org.ethersan:live";

fn ram_lun(serial: &str) -> LunSlot {
    let dev = Arc::new(ethersan_backend::ram::RamDevice::new(8 << 20, 512).unwrap());
    let cfg = LuConfig {
        serial: serial.into(),
        naa: [0x6e; 16],
        target_name: IQN.into(),
        ..LuConfig::default()
    };
    LunSlot {
        lu: Arc::new(LogicalUnit::new(dev, cfg)),
        policy: LunPolicy::default(),
    }
}

const TUR: [u8; 6] = [0; 6];
const REPORT_LUNS: [u8; 12] = [0xa0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];

/// LUN numbers from REPORT LUNS parameter data (peripheral addressing).
fn listed(data: &[u8]) -> Vec<u64> {
    let n = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize / 8;
    (0..n)
        .map(|i| u64::from(u16::from_be_bytes([data[8 + 8 * i], data[9 + 8 * i]]) & 0x3fff))
        .collect()
}

async fn sense(s: &Session, lun: u64) -> Option<(u8, u8, u8)> {
    let r = s.command(lun, &TUR, Bytes::new(), 0).await.unwrap();
    r.sense_key()
}

async fn report_luns(s: &Session) -> Vec<u64> {
    let r = s
        .command(0, &REPORT_LUNS, Bytes::new(), 1024)
        .await
        .unwrap();
    assert_eq!(r.status, 0, "REPORT LUNS failed: {:?}", r.sense_key());
    listed(&r.data)
}

fn iscsi_ls(addr: &str) -> String {
    common::require_tool("iscsi-ls");
    let out = std::process::Command::new("iscsi-ls")
        .args(["-s", &format!("iscsi://{addr}")])
        .output()
        .expect("run iscsi-ls");
    assert!(out.status.success(), "iscsi-ls failed: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_added_while_a_session_is_logged_in_is_seen_after_report_luns() {
    let text = format!(
        "portals = [\"127.0.0.1:0\"]\n[options]\nnop_interval_secs = 0\n[[target]]\nname = \"{IQN}\"\nlun = [\"ram:16M\"]\n"
    );
    let cfg = Config::from_toml_str(&text, "test").unwrap();
    let srv = Server::bind(&cfg).await.unwrap();
    let addr = srv.local_addrs()[0].to_string();
    let registry = srv.registry().clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(srv.run(async {
        let _ = stop_rx.await;
    }));

    let opts = LoginOptions {
        target_name: Some(IQN.to_string()),
        ..LoginOptions::default()
    };
    let s = connect(&addr, &opts).await.unwrap();
    assert_eq!(sense(&s, 0).await.map(|k| k.0), Some(6), "POWER ON first");
    assert_eq!(sense(&s, 0).await, None);
    assert_eq!(report_luns(&s).await, vec![0]);

    let target = registry.directory().target(IQN).unwrap();
    target.add_lun(1, ram_lun("live-1")).unwrap();

    // The logged-in session learns of it, then REPORT LUNS lists it and
    // the new LUN answers (after its own POWER ON).
    assert_eq!(sense(&s, 0).await, Some((6, 0x3f, 0x0e)));
    assert_eq!(report_luns(&s).await, vec![0, 1]);
    assert_eq!(sense(&s, 1).await.map(|k| k.0), Some(6));
    let (blocks, bs) = s.read_capacity(1).await.unwrap();
    assert_eq!((blocks, bs), (8 << 20 >> 9, 512));
    // A fresh libiscsi login sees it too.
    let ls = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || iscsi_ls(&addr)
    })
    .await
    .unwrap();
    assert!(ls.contains("Lun:1"), "iscsi-ls does not list LUN 1:\n{ls}");

    // Removed: the session is told, REPORT LUNS drops it, and commands to
    // it get LOGICAL UNIT NOT SUPPORTED.
    target.remove_lun(1).unwrap();
    assert_eq!(sense(&s, 0).await, Some((6, 0x3f, 0x0e)));
    assert_eq!(report_luns(&s).await, vec![0]);
    assert_eq!(sense(&s, 1).await, Some((5, 0x25, 0)));
    let ls = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || iscsi_ls(&addr)
    })
    .await
    .unwrap();
    assert!(!ls.contains("Lun:1"), "iscsi-ls still lists LUN 1:\n{ls}");

    s.logout().await.unwrap();

    // A target added live is found by discovery and logins; removed, it
    // ends its sessions and is gone from discovery.
    let other = "iqn.2026-11.org.ethersan:live2";
    let mut luns = ethersan_scsi::LunMap::new();
    luns.insert(0, ram_lun("live-2"));
    registry
        .directory()
        .add_target(ethersan_server::registry::TargetEntry::new(
            other.into(),
            None,
            luns,
            Arc::new(ethersan_core::directory::AllowAll),
        ))
        .unwrap();
    let found = ethersan_initiator::discover_with(&addr, &LoginOptions::default())
        .await
        .unwrap();
    assert!(found.iter().any(|(n, _)| n == other), "{found:?}");
    let s2 = connect(
        &addr,
        &LoginOptions {
            target_name: Some(other.to_string()),
            ..LoginOptions::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(sense(&s2, 0).await.map(|k| k.0), Some(6));
    registry.remove_target(other).unwrap();
    let gone = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if s2.command(0, &TUR, Bytes::new(), 0).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "the removed target's session still answers");
    let found = ethersan_initiator::discover_with(&addr, &LoginOptions::default())
        .await
        .unwrap();
    assert!(!found.iter().any(|(n, _)| n == other), "{found:?}");
    assert!(connect(
        &addr,
        &LoginOptions {
            target_name: Some(other.to_string()),
            ..LoginOptions::default()
        },
    )
    .await
    .is_err());

    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(15), running)
        .await
        .expect("server stops")
        .unwrap();
}
