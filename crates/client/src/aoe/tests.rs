//! The AoE device handle against `ethersan_aoe`'s target logic, driven by
//! a small responder over an in-memory hub that loses, reorders and
//! duplicates frames; and the URL forms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ethersan_aoe::initiator::TargetInfo;
use ethersan_aoe::{Action, AoeTarget, DeviceAddr, DeviceConfig, IoOp, Mac, TargetConfig};
use ethersan_link::memory::{Impairments, MemoryHub};
use ethersan_link::{Link, MacAddr, ETHERTYPE_AOE};

use super::device::initiator_config;
use super::*;
use crate::options::Timeout;
use ethersan_link::spec::LinkSpec as AoeLink;

const TARGET_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0xa0, 1]);
const CLIENT_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0xc0, 1]);

/// A target exporting e1.2 (`sectors` sectors, in memory) on the hub,
/// answering until aborted.
fn spawn_target(hub: &MemoryHub, sectors: u64, mtu: usize) -> tokio::task::JoinHandle<()> {
    let link = Link::from(hub.port(TARGET_MAC, ETHERTYPE_AOE, mtu).unwrap());
    serve_on(link, sectors, mtu)
}

/// The responder of [`spawn_target`] on any link.
fn serve_on(link: Link, sectors: u64, mtu: usize) -> tokio::task::JoinHandle<()> {
    let mut target = AoeTarget::new(TargetConfig::new(Mac(TARGET_MAC.0), mtu));
    let mut dev = DeviceConfig::new(sectors);
    dev.config_string = b"in-memory".to_vec();
    target.add_device(DeviceAddr::new(1, 2), dev).unwrap();
    let mut disk = vec![0u8; sectors as usize * 512];
    tokio::spawn(async move {
        loop {
            let mut frames = Vec::new();
            link.recv_batch(|f| frames.push(f.to_vec())).await.unwrap();
            let mut replies = Vec::new();
            for frame in &frames {
                match target.handle(frame) {
                    Action::Drop(_) => {}
                    Action::Reply(r) => replies.extend(r),
                    Action::Io(io) => {
                        let mut out = Vec::new();
                        match io.op {
                            IoOp::Read { lba, .. } => {
                                let buf = io.pending.prepare_read(&mut out);
                                let at = lba as usize * 512;
                                buf.copy_from_slice(&disk[at..at + buf.len()]);
                            }
                            IoOp::Write { lba, data, .. } => {
                                let at = lba as usize * 512;
                                disk[at..at + data.len()].copy_from_slice(&frame[data]);
                            }
                            IoOp::Flush => {}
                        }
                        io.pending.complete(Ok(()), &mut out);
                        replies.push(out);
                    }
                }
            }
            link.send_batch(&replies).await.unwrap();
        }
    })
}

fn impaired_hub(seed: u64) -> MemoryHub {
    MemoryHub::with_impairments(
        seed,
        Impairments {
            loss: 0.01,
            reorder: 0.01,
            duplicate: 0.001,
            corrupt: 0.0,
        },
    )
}

async fn round_trip(mtu: usize, seed: u64) {
    let hub = impaired_hub(seed);
    let target = spawn_target(&hub, 4096, mtu);
    let link = Link::from(hub.port(CLIENT_MAC, ETHERTYPE_AOE, mtu).unwrap());
    let dev = AoeDevice::open(
        link,
        "test device".into(),
        1,
        2,
        Timeout(Some(Duration::from_secs(20))),
    )
    .await
    .unwrap();
    assert_eq!(dev.capacity(), 4096 * 512);
    assert_eq!(dev.target.config, b"in-memory");
    let mut data = vec![0u8; 1 << 20];
    fastrand::Rng::with_seed(seed).fill(&mut data);
    // Eight writes at once, each split into many frames.
    let writes = data
        .chunks(128 << 10)
        .enumerate()
        .map(|(i, c)| dev.write(i as u64 * (128 << 10), c));
    for r in futures::future::join_all(writes).await {
        r.unwrap();
    }
    dev.flush().await.unwrap();
    // Read back in odd-sized pieces (a whole number of sectors each).
    let mut back = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let n = (37 * 512).min(data.len() - at);
        back.extend(dev.read(at as u64, n, Vec::new()).await.unwrap());
        at += n;
    }
    assert!(back == data, "read back differs from what was written");
    let s = hub.stats();
    assert!(s.lost > 0, "the hub lost nothing: {s:?}");
    dev.close().await;
    target.abort();
}

#[tokio::test]
async fn writes_read_back_exactly_over_a_lossy_reordering_link_mtu_1500() {
    tokio::time::timeout(Duration::from_secs(60), round_trip(1500, 7))
        .await
        .expect("bounded");
}

#[tokio::test]
async fn writes_read_back_exactly_over_a_lossy_reordering_link_mtu_9000() {
    tokio::time::timeout(Duration::from_secs(60), round_trip(9000, 11))
        .await
        .expect("bounded");
}

#[tokio::test]
async fn an_aoe_unix_url_reaches_a_target_on_a_unix_datagram_link() {
    use ethersan_link::unix::{UnixDgramConfig, UnixDgramLink};
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (
        dir.path().join("client.sock"),
        dir.path().join("target.sock"),
    );
    let mut cfg = UnixDgramConfig::new(&theirs, &ours);
    cfg.mac = Some(TARGET_MAC);
    let target = serve_on(Link::from(UnixDgramLink::open(cfg).unwrap()), 256, 1500);
    let url = format!(
        "aoe+unix://1.2?local={}&peer={}",
        ours.display(),
        theirs.display()
    );
    let how = crate::options::ConnectArgs {
        timeout: Timeout(Some(Duration::from_secs(10))),
        ..Default::default()
    };
    let dev = tokio::time::timeout(Duration::from_secs(30), open(&url, &how))
        .await
        .expect("bounded")
        .unwrap();
    assert_eq!(
        dev.name(),
        format!(
            "AoE device e1.2 on unix:{},peer={}",
            ours.display(),
            theirs.display()
        )
    );
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    dev.write(4096, &data).await.unwrap();
    assert!(dev.read(4096, data.len(), Vec::new()).await.unwrap() == data);
    let err = dev
        .read(255 * 512, 1024, Vec::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("beyond the end of the device"), "{err}");
    dev.close().await;
    target.abort();
}

fn nobody() -> TargetInfo {
    TargetInfo {
        mac: Mac(TARGET_MAC.0),
        shelf: 1,
        slot: 2,
        buffer_count: 16,
        max_sectors: 2,
        firmware_version: 1,
        aoe_version: 1,
        config: Vec::new(),
    }
}

#[tokio::test]
async fn a_dead_target_fails_after_its_retransmissions_naming_the_device() {
    let hub = MemoryHub::new(1);
    let link = Arc::new(Link::from(
        hub.port(CLIENT_MAC, ETHERTYPE_AOE, 1500).unwrap(),
    ));
    let mut cfg = initiator_config(&link);
    cfg.initial_rto = Duration::from_millis(20);
    cfg.max_rto = Duration::from_millis(50);
    cfg.max_retries = 3;
    let started = Instant::now();
    let err = AoeDevice::attach(
        link,
        nobody(),
        cfg,
        "AoE device e1.2 on test".into(),
        Timeout(None),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        err.contains(
            "AoE device e1.2 on test: IDENTIFY DEVICE: no response after 3 retransmissions"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_dead_target_fails_at_the_timeout() {
    let hub = MemoryHub::new(1);
    let link = Arc::new(Link::from(
        hub.port(CLIENT_MAC, ETHERTYPE_AOE, 1500).unwrap(),
    ));
    let cfg = initiator_config(&link);
    let started = Instant::now();
    let t = Timeout(Some(Duration::from_millis(300)));
    let err = AoeDevice::attach(link, nobody(), cfg, "AoE device e1.2 on test".into(), t)
        .await
        .unwrap_err()
        .to_string();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(err.contains("no answer within 0.3 s (--timeout"), "{err}");
}

/// A command given up at the `--timeout` is never sent again: a write
/// reported failed must not land later, over newer data, once the target
/// answers. (Before, its retransmissions went on in the background.)
#[tokio::test]
async fn a_write_given_up_at_the_timeout_is_not_sent_again() {
    let hub = MemoryHub::new(1);
    let target = spawn_target(&hub, 64, 1500);
    let link = Link::from(hub.port(CLIENT_MAC, ETHERTYPE_AOE, 1500).unwrap());
    let t = Timeout(Some(Duration::from_millis(300)));
    let dev = AoeDevice::open(link, "AoE device e1.2 on test".into(), 1, 2, t)
        .await
        .unwrap();
    // The target goes away; a write times out.
    target.abort();
    let _ = target.await;
    let err = BlockTarget::write(&dev, 0, Bytes::from(vec![7u8; 512]), false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no answer within 0.3 s"), "{err}");
    // The target is back: nothing of the failed write reaches it (its
    // retransmissions, 250 ms and more apart, would within 1.5 s).
    let back = Link::from(hub.port(TARGET_MAC, ETHERTYPE_AOE, 1500).unwrap());
    let mut frames = 0;
    let got = tokio::time::timeout(
        Duration::from_millis(1500),
        back.recv_batch(|_| frames += 1),
    )
    .await;
    assert!(
        got.is_err(),
        "{frames} frame(s) of a write reported failed were sent after its timeout"
    );
    drop(dev);
}

#[tokio::test]
async fn a_missing_device_is_reported_when_opening() {
    let hub = MemoryHub::new(1);
    let target = spawn_target(&hub, 64, 1500);
    let link = Link::from(hub.port(CLIENT_MAC, ETHERTYPE_AOE, 1500).unwrap());
    let t = Timeout(Some(Duration::from_millis(400)));
    let err = AoeDevice::open(link, "AoE device e1.3 on test".into(), 1, 3, t)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no answer to Query Config within 0.4 s"),
        "{err}"
    );
    assert!(err.contains("discover --aoe"), "{err}");
    // And discovery finds the device that is there.
    let link = Link::from(hub.port(CLIENT_MAC, ETHERTYPE_AOE, 1500).unwrap());
    let found = discover(&link, Duration::from_millis(200)).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].shelf, found[0].slot), (1, 2));
    target.abort();
}

#[test]
fn urls_parse_and_bad_ones_show_the_forms() {
    let u = AoeUrl::parse("aoe://eth0/0.1").unwrap();
    assert_eq!(
        u,
        AoeUrl {
            link: AoeLink::Interface("eth0".into()),
            shelf: 0,
            slot: 1
        }
    );
    let u = AoeUrl::parse("aoe+unix://3.4?local=/tmp/a.sock&peer=/tmp/b.sock&mtu=9000").unwrap();
    assert_eq!((u.shelf, u.slot), (3, 4));
    assert_eq!(
        u.link,
        AoeLink::Unix {
            local: "/tmp/a.sock".into(),
            peer: "/tmp/b.sock".into(),
            mtu: 9000,
            mac: None
        }
    );
    for bad in [
        "aoe://eth0",
        "aoe://eth0/1",
        "aoe://eth0/65535.1",
        "aoe://eth0/1.255",
        "aoe://eth0/x.y",
        "aoe+unix://0.1?local=/a",
        "aoe+unix://0.1?local=/a&peer=/b&colour=red",
    ] {
        let e = AoeUrl::parse(bad).unwrap_err();
        assert!(e.contains("aoe://IFACE/SHELF.SLOT"), "{bad}: {e}");
    }
    let e = AoeUrl::parse("aoe+unix://0.1?local=/a&peer=/b&mtu=20").unwrap_err();
    assert!(
        e.contains("mtu=20 is not a number from 1024 to 9216"),
        "{e}"
    );
    assert!(is_aoe_url("aoe+unix://0.1?local=/a&peer=/b"));
    assert!(!is_aoe_url("iscsi://h/t/0"));
}

#[test]
fn retransmissions_cover_the_timeout() {
    use super::device::retries_for;
    let cfg = ethersan_aoe::InitiatorConfig::new(ethersan_aoe::Mac([2, 0, 0, 0, 0, 1]));
    // The default limit stays for short timeouts…
    assert_eq!(
        retries_for(&cfg, Timeout(Some(Duration::from_secs(5)))),
        cfg.max_retries
    );
    // …a long one gets enough retransmissions at the RTO ceiling (5 s)…
    let r = retries_for(&cfg, Timeout(Some(Duration::from_secs(120))));
    assert!(u64::from(r) * cfg.max_rto.as_secs() >= 120, "{r}");
    // …and no timeout, no limit.
    assert_eq!(retries_for(&cfg, Timeout(None)), u32::MAX);
}
