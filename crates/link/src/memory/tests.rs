//! Tests of the in-memory hub: delivery, broadcast, filtering, impairment
//! rates and determinism.

use super::*;
use crate::{Link, ETHERTYPE_AOE};

const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);
const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xb]);
const C: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xc]);

fn frame(dst: MacAddr, src: MacAddr, ethertype: u16, seq: u32, len: usize) -> Vec<u8> {
    let mut f = EthernetHeader {
        dst,
        src,
        ethertype,
    }
    .to_bytes()
    .to_vec();
    f.extend_from_slice(&seq.to_be_bytes());
    f.resize(len.max(HEADER_LEN + 4), 0x5a);
    f
}

fn seq(f: &[u8]) -> u32 {
    u32::from_be_bytes(f[HEADER_LEN..HEADER_LEN + 4].try_into().unwrap())
}

/// Everything queued at `link` now (recv_batch never waits here, since
/// sends complete synchronously).
async fn drain(link: &Link) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while tokio::time::timeout(
        std::time::Duration::ZERO,
        link.recv_batch(|f| out.push(f.to_vec())),
    )
    .await
    .is_ok()
    {}
    out
}

fn three(hub: &MemoryHub) -> (Link, Link, Link) {
    let p = |m| Link::from(hub.port(m, ETHERTYPE_AOE, 1500).unwrap());
    (p(A), p(B), p(C))
}

#[tokio::test]
async fn unicast_goes_to_the_owner_only() {
    let hub = MemoryHub::new(1);
    let (a, b, c) = three(&hub);
    assert_eq!(a.mac(), A);
    assert_eq!(a.max_frame_len(), 1514);
    let frames: Vec<Vec<u8>> = (0..100)
        .map(|i| frame(B, A, ETHERTYPE_AOE, i, 60))
        .collect();
    assert_eq!(a.send_batch(&frames).await.unwrap(), 100);
    let got = drain(&b).await;
    assert_eq!(got, frames);
    assert!(drain(&c).await.is_empty());
    assert!(drain(&a).await.is_empty());
    assert_eq!(hub.stats().delivered, 100);
}

#[tokio::test]
async fn broadcast_reaches_every_other_port() {
    let hub = MemoryHub::new(1);
    let (a, b, c) = three(&hub);
    let f = frame(MacAddr::BROADCAST, A, ETHERTYPE_AOE, 7, 64);
    a.send(&f).await.unwrap();
    assert_eq!(drain(&b).await, vec![f.clone()]);
    assert_eq!(drain(&c).await, vec![f]);
    assert!(drain(&a).await.is_empty());
}

#[tokio::test]
async fn filters_by_mac_and_ethertype() {
    let hub = MemoryHub::new(1);
    let (a, b, c) = three(&hub);
    let group = MacAddr([1, 0, 0x5e, 0, 0, 1]);
    let stranger = MacAddr([2, 9, 9, 9, 9, 9]);
    // Unknown unicast is flooded, and every port's filter drops it; so is
    // another EtherType, and multicast on ports that did not ask for it.
    a.send(&frame(stranger, A, ETHERTYPE_AOE, 1, 60))
        .await
        .unwrap();
    a.send(&frame(B, A, 0x0800, 2, 60)).await.unwrap();
    a.send(&frame(group, A, ETHERTYPE_AOE, 3, 60))
        .await
        .unwrap();
    assert!(drain(&b).await.is_empty());
    assert!(drain(&c).await.is_empty());
    assert_eq!(hub.stats().filtered, 2 + 1 + 2);
    // A port that accepts multicast gets the group frame.
    let m = Link::from(
        hub.port_with_filter(
            RxFilter {
                mac: MacAddr([2, 0, 0, 0, 0, 0xd]),
                ethertype: ETHERTYPE_AOE,
                multicast: true,
            },
            1500,
        )
        .unwrap(),
    );
    a.send(&frame(group, A, ETHERTYPE_AOE, 4, 60))
        .await
        .unwrap();
    assert_eq!(drain(&m).await.len(), 1);
    // Oversized and runt frames are refused before anything is sent.
    let big = frame(B, A, ETHERTYPE_AOE, 5, 1515);
    let err = a
        .send_batch([frame(B, A, ETHERTYPE_AOE, 6, 60), big])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LinkError::FrameSize {
                len: 1515,
                max: 1514
            }
        ),
        "{err}"
    );
    assert!(drain(&b).await.is_empty());
    assert!(a.send(&[0u8; 13]).await.is_err());
}

#[tokio::test]
async fn recv_waits_for_a_frame() {
    let hub = MemoryHub::new(1);
    let a = std::sync::Arc::new(Link::from(hub.port(A, ETHERTYPE_AOE, 9000).unwrap()));
    let b = Link::from(hub.port(B, ETHERTYPE_AOE, 9000).unwrap());
    let rx = tokio::spawn({
        let a = a.clone();
        async move {
            let mut got = Vec::new();
            a.recv_batch(|f| got.push(f.to_vec())).await.unwrap();
            got
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let jumbo = frame(A, B, ETHERTYPE_AOE, 1, 9014);
    b.send(&jumbo).await.unwrap();
    let got = tokio::time::timeout(std::time::Duration::from_secs(5), rx)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, vec![jumbo]);
}

/// Sends `n` numbered frames A→B through a hub with `imp` and returns the
/// sequence numbers B received, in order, and the hub's counters.
async fn run(seed: u64, imp: Impairments, n: u32) -> (Vec<u32>, Vec<Vec<u8>>, HubStats) {
    let hub = MemoryHub::with_impairments(seed, imp);
    let a = Link::from(hub.port(A, ETHERTYPE_AOE, 1500).unwrap());
    let b = Link::from(hub.port(B, ETHERTYPE_AOE, 1500).unwrap());
    let mut frames = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        let batch: Vec<Vec<u8>> = chunk
            .iter()
            .map(|&i| frame(B, A, ETHERTYPE_AOE, i, 200))
            .collect();
        a.send_batch(&batch).await.unwrap();
        frames.extend(drain(&b).await);
    }
    let seqs = frames.iter().map(|f| seq(f)).collect();
    (seqs, frames, hub.stats())
}

fn near(count: u64, n: u32, p: f64) -> bool {
    let expect = p * f64::from(n);
    let sd = (expect * (1.0 - p)).sqrt();
    (count as f64 - expect).abs() <= 5.0 * sd + 1.0
}

#[tokio::test]
async fn impairment_rates_are_roughly_as_configured() {
    let n = 20_000;
    let intact = frame(B, A, ETHERTYPE_AOE, 0, 200);
    let imp = Impairments {
        loss: 0.05,
        duplicate: 0.03,
        reorder: 0.04,
        corrupt: 0.02,
    };
    let (seqs, frames, st) = run(42, imp, n).await;
    assert_eq!(st.sent, u64::from(n));
    assert!(near(st.lost, n, 0.05), "{st:?}");
    let kept = u64::from(n) - st.lost;
    assert!(near(st.duplicated, kept as u32, 0.03), "{st:?}");
    assert!(near(st.reordered, kept as u32, 0.04), "{st:?}");
    assert!(near(st.corrupted, kept as u32, 0.02), "{st:?}");
    assert_eq!(frames.len() as u64, st.delivered);
    assert_eq!(st.delivered, kept + st.duplicated);
    // Out-of-order arrivals, duplicates and corrupt payloads are visible to
    // the receiver.
    let late = seqs.windows(2).filter(|w| w[1] < w[0]).count() as u64;
    assert!(late > 0 && late <= st.reordered, "{late} vs {st:?}");
    let dups = seqs.windows(2).filter(|w| w[1] == w[0]).count() as u64;
    assert!(dups > 0 && dups <= st.duplicated);
    let corrupt = frames
        .iter()
        .filter(|f| {
            f[HEADER_LEN + 4..] != intact[HEADER_LEN + 4..]
                || f[..HEADER_LEN] != intact[..HEADER_LEN]
        })
        .count() as u64;
    // A flip in the sequence number goes unseen here; most land in the fill.
    assert!(
        corrupt > st.corrupted / 2 && corrupt <= st.corrupted * 2,
        "{corrupt} vs {st:?}"
    );
}

#[tokio::test]
async fn a_seed_replays_exactly() {
    let imp = Impairments {
        loss: 0.1,
        duplicate: 0.1,
        reorder: 0.1,
        corrupt: 0.1,
    };
    let (s1, f1, st1) = run(7, imp, 3000).await;
    let (s2, f2, st2) = run(7, imp, 3000).await;
    assert_eq!((s1.clone(), f1, st1), (s2, f2, st2));
    let (s3, _, _) = run(8, imp, 3000).await;
    assert_ne!(s1, s3);
}
