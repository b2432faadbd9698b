//! Endpoints over the in-memory Ethernet hub: group discovery, channels
//! at every level carrying messages both ways through 1% loss, 1%
//! reordering, 0.1% duplication and 0.1% corruption, non-members left
//! unanswered, and the counters showing the work.

use std::sync::Arc;
use std::time::Duration;

use ethersan_channel::discovery::{Catalog, CatalogLun, CatalogTarget};
use ethersan_channel::group::GroupKeys;
use ethersan_channel::Level;
use ethersan_endpoint::{Endpoint, EndpointConfig, Medium, PeerAddr};
use ethersan_link::memory::{Impairments, MemoryHub};
use ethersan_link::{Link, MacAddr};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ETHERTYPE: u16 = 0x88B5;
const TARGET_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);

fn keys(secret: &str) -> GroupKeys {
    GroupKeys::derive("lab", secret.as_bytes()).unwrap()
}

fn medium(hub: &MemoryHub, last: u8) -> Medium {
    let port = hub
        .port(MacAddr([2, 0, 0, 0, 0, last]), ETHERTYPE, 1500)
        .unwrap();
    Medium::Ethernet(Arc::new(Link::from(port)))
}

/// A target endpoint whose channels echo every byte back.
fn echo_target(hub: &MemoryHub) -> Endpoint {
    let mut cfg = EndpointConfig::new(keys("a long enough secret"));
    cfg.catalog = Arc::new(|| Catalog {
        server: "memory".into(),
        targets: vec![CatalogTarget {
            name: "iqn.2026-11.org.ethersan:echo".into(),
            alias: None,
            luns: vec![CatalogLun {
                lun: 0,
                blocks: 2048,
                block_size: 512,
                level: Level::Integrity,
            }],
        }],
    });
    let ep = Endpoint::target(medium(hub, 1), cfg);
    let accepting = ep.clone();
    tokio::spawn(async move {
        while let Some(a) = accepting.accept().await {
            tokio::spawn(async move {
                let mut s = a.stream;
                let mut buf = vec![0u8; 65536];
                loop {
                    match s.reader.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if s.writer.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
    ep
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_level_through_a_lossy_hub() {
    let hub = MemoryHub::with_impairments(
        7,
        Impairments {
            loss: 0.01,
            reorder: 0.01,
            duplicate: 0.001,
            corrupt: 0.001,
        },
    );
    let target = echo_target(&hub);
    let client = Endpoint::initiator(
        medium(&hub, 2),
        EndpointConfig::new(keys("a long enough secret")),
    );
    // Discovery through the lossy hub (retried: a query may be lost).
    let mut found = Vec::new();
    for _ in 0..5 {
        found = client
            .discover(
                PeerAddr::Mac(MacAddr::BROADCAST),
                Duration::from_millis(300),
            )
            .await
            .unwrap();
        if !found.is_empty() {
            break;
        }
    }
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, PeerAddr::Mac(TARGET_MAC));
    assert_eq!(found[0].1.targets[0].luns[0].level, Level::Integrity);
    for (i, level) in [Level::None, Level::Integrity, Level::Encrypt]
        .into_iter()
        .enumerate()
    {
        let s = client
            .connect(found[0].0, level, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{level}: {e}"));
        assert_eq!(s.info.level, level);
        let (mut rd, mut wr) = (s.reader, s.writer);
        let data = pattern(3 << 20, i as u64);
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            for chunk in sent.chunks(40_000) {
                wr.write_all(chunk).await.unwrap();
            }
            wr
        });
        let mut back = vec![0u8; data.len()];
        tokio::time::timeout(Duration::from_secs(60), rd.read_exact(&mut back))
            .await
            .expect("the echo came back in time")
            .unwrap();
        assert!(back == data, "{level}: the echo differs");
        let wr = writer.await.unwrap();
        let stats = client.stats().await.unwrap();
        let (_, st) = stats
            .iter()
            .find(|(info, _)| info.level == level)
            .expect("the channel's counters");
        assert!(
            st.retransmits > 0,
            "{level}: no retransmission through 1% loss"
        );
        drop(wr);
        drop(rd);
    }
    let h = hub.stats();
    assert!(h.lost > 0 && h.reordered > 0 && h.corrupted > 0, "{h:?}");
    drop(target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_members_get_nothing() {
    let hub = MemoryHub::new(3);
    let _target = echo_target(&hub);
    for secret in ["another secret!", "a long enough secret"] {
        let group = if secret.starts_with("another") {
            "lab"
        } else {
            "other"
        };
        let k = GroupKeys::derive(group, secret.as_bytes()).unwrap();
        let outsider = Endpoint::initiator(medium(&hub, 3), EndpointConfig::new(k));
        let found = outsider
            .discover(
                PeerAddr::Mac(MacAddr::BROADCAST),
                Duration::from_millis(300),
            )
            .await
            .unwrap();
        assert!(found.is_empty(), "{group}: {found:?}");
        let e = outsider
            .connect(
                PeerAddr::Mac(TARGET_MAC),
                Level::Encrypt,
                Duration::from_millis(800),
            )
            .await
            .expect_err("a non-member's channel");
        assert!(e.to_string().contains("no answer"), "{e}");
    }
}
