//! Two unix datagram links pointed at each other.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::{EthernetHeader, Link, ETHERTYPE_AOE};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("ethersan-link-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pair(dir: &Path, mtu: usize) -> (Arc<Link>, Arc<Link>) {
    let a = dir.join("a.sock");
    let b = dir.join("b.sock");
    let cfg = |local: &Path, peer: &Path, mac: u8| UnixDgramConfig {
        mac: Some(MacAddr([2, 0, 0, 0, 0, mac])),
        mtu,
        ..UnixDgramConfig::new(local, peer)
    };
    (
        Arc::new(UnixDgramLink::open(cfg(&a, &b, 0xa)).unwrap().into()),
        Arc::new(UnixDgramLink::open(cfg(&b, &a, 0xb)).unwrap().into()),
    )
}

fn frame(dst: MacAddr, src: MacAddr, ethertype: u16, seq: u32, len: usize) -> Vec<u8> {
    let mut f = EthernetHeader {
        dst,
        src,
        ethertype,
    }
    .to_bytes()
    .to_vec();
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend((f.len()..len).map(|i| (i as u32 ^ seq) as u8));
    f
}

/// Sends `n` frames from `from` to `to` in batches while `to` receives, and
/// returns what arrived.
async fn exchange(from: Arc<Link>, to: Arc<Link>, n: u32, len: usize) -> Vec<Vec<u8>> {
    let rx = tokio::spawn(async move {
        let mut got = Vec::new();
        while got.len() < n as usize {
            to.recv_batch(|f| got.push(f.to_vec())).await.unwrap();
        }
        got
    });
    let dst = rx_mac(&from);
    let src = from.mac();
    for chunk in (0..n).collect::<Vec<_>>().chunks(32) {
        let batch: Vec<Vec<u8>> = chunk
            .iter()
            .map(|&i| frame(dst, src, ETHERTYPE_AOE, i, len))
            .collect();
        from.send_batch(&batch).await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(20), rx)
        .await
        .expect("frames did not arrive")
        .unwrap()
}

fn rx_mac(from: &Link) -> MacAddr {
    // The peer's MAC in these tests: 0xa <-> 0xb.
    let mut m = from.mac();
    m.0[5] = if m.0[5] == 0xa { 0xb } else { 0xa };
    m
}

#[tokio::test]
async fn frames_flow_both_ways() {
    let dir = TempDir::new("both");
    let (a, b) = pair(&dir.0, 1500);
    let (ab, ba) = tokio::join!(
        exchange(a.clone(), b.clone(), 2000, 1514),
        exchange(b.clone(), a.clone(), 2000, 60)
    );
    for (got, from, to, len) in [(ab, &a, &b, 1514), (ba, &b, &a, 60)] {
        assert_eq!(got.len(), 2000);
        for (i, f) in got.iter().enumerate() {
            assert_eq!(
                f,
                &frame(to.mac(), from.mac(), ETHERTYPE_AOE, i as u32, len)
            );
        }
    }
    let Link::UnixDgram(l) = &*a else {
        unreachable!()
    };
    assert_eq!(l.dropped(), (0, 0));
}

#[tokio::test]
async fn jumbo_frames_with_mtu_9000() {
    let dir = TempDir::new("jumbo");
    let (a, b) = pair(&dir.0, 9000);
    assert_eq!(a.max_frame_len(), 9014);
    let (ab, ba) = tokio::join!(
        exchange(a.clone(), b.clone(), 300, 9014),
        exchange(b.clone(), a.clone(), 300, 9014)
    );
    assert_eq!(ab.len() + ba.len(), 600);
    assert!(ab.iter().chain(&ba).all(|f| f.len() == 9014));
    assert_eq!(ab[299], frame(b.mac(), a.mac(), ETHERTYPE_AOE, 299, 9014));
    let err = a.send(&vec![0; 9015]).await.unwrap_err();
    assert!(
        matches!(
            err,
            LinkError::FrameSize {
                len: 9015,
                max: 9014
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn filters_and_absent_peer() {
    let dir = TempDir::new("filter");
    let (a, b) = pair(&dir.0, 1500);
    let stranger = MacAddr([2, 9, 9, 9, 9, 9]);
    let wrong = [
        frame(stranger, a.mac(), ETHERTYPE_AOE, 1, 60),
        frame(b.mac(), a.mac(), 0x0800, 2, 60),
        frame(
            MacAddr([1, 0, 0x5e, 0, 0, 1]),
            a.mac(),
            ETHERTYPE_AOE,
            3,
            60,
        ),
    ];
    let right = [
        frame(b.mac(), a.mac(), ETHERTYPE_AOE, 4, 60),
        frame(MacAddr::BROADCAST, a.mac(), ETHERTYPE_AOE, 5, 60),
    ];
    a.send_batch(wrong.iter().chain(&right)).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        tokio::time::timeout(
            Duration::from_secs(5),
            b.recv_batch(|f| got.push(f.to_vec())),
        )
        .await
        .unwrap()
        .unwrap();
    }
    assert_eq!(got, right);
    // With the peer gone the frame is dropped, like on an unplugged cable.
    drop(b);
    a.send(&right[0]).await.unwrap();
    let Link::UnixDgram(l) = &*a else {
        unreachable!()
    };
    assert_eq!(l.dropped(), (1, 0));
    // A peer bound at the path again (a restarted VM) gets frames at once.
    let b2 = Link::from(
        UnixDgramLink::open(UnixDgramConfig {
            mac: Some(MacAddr([2, 0, 0, 0, 0, 0xb])),
            ..UnixDgramConfig::new(dir.0.join("b.sock"), dir.0.join("a.sock"))
        })
        .unwrap(),
    );
    a.send(&right[0]).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        b2.recv_batch(|f| got.push(f.to_vec())),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(got, [right[0].clone()]);
    // And it can answer straight away: our receiving socket is unconnected.
    b2.send(&frame(a.mac(), b2.mac(), ETHERTYPE_AOE, 6, 60))
        .await
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        a.recv_batch(|f| got.push(f.to_vec())),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(l.dropped(), (1, 0));
    // A stale socket file at our path is replaced; another file is refused.
    let stale = dir.0.join("stale.sock");
    drop(std::os::unix::net::UnixDatagram::bind(&stale).unwrap());
    UnixDgramLink::open(UnixDgramConfig::new(&stale, dir.0.join("x"))).unwrap();
    let file = dir.0.join("file");
    std::fs::write(&file, b"").unwrap();
    let err = UnixDgramLink::open(UnixDgramConfig::new(&file, dir.0.join("x"))).unwrap_err();
    assert!(err.to_string().starts_with("binding "), "{err}");
}

/// Frames per second one way over a unix datagram pair.
/// `cargo test -p ethersan-link --release --lib -- --ignored unix_bench --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run explicitly"]
async fn unix_bench() {
    for mtu in [1500, 9000] {
        let dir = TempDir::new(&format!("bench{mtu}"));
        let (a, b) = pair(&dir.0, mtu);
        let n = 200_000u32;
        let start = std::time::Instant::now();
        let got = exchange(a.clone(), b.clone(), n, mtu + HEADER_LEN).await;
        let dt = start.elapsed();
        println!(
            "unix dgram MTU {mtu}: {} frames in {dt:.2?}: {:.0} frames/s",
            got.len(),
            got.len() as f64 / dt.as_secs_f64()
        );
    }
}
