//! Levels `integrity` and `encrypt`: frame protection with traffic keys,
//! and whole channels over the lossy simulator with each level.
//!
//! These tests need `aead::TrafficKeys`; until it is implemented they panic
//! on its `todo!()`.

mod common;

use std::time::{Duration, Instant};

use common::{LinkConfig, Sim, Workload};
use ethersan_channel::aead::{TrafficKeys, REKEY_INTERVAL};
use ethersan_channel::channel::{Channel, ChannelConfig};
use ethersan_channel::frame::{FrameError, Header, Kind, FLAG_LAST, HEADER_LEN};
use ethersan_channel::protect::Protector;
use ethersan_channel::Level;

const K1: [u8; 32] = [0x11; 32];
const K2: [u8; 32] = [0x22; 32];

/// The two ends of a channel: a sends with K1, b with K2.
fn pair(level: Level) -> (Protector, Protector) {
    let a = Protector::new(level, Some(TrafficKeys::new(K1, K2))).expect("keys");
    let b = Protector::new(level, Some(TrafficKeys::new(K2, K1))).expect("keys");
    (a, b)
}

fn frame(pn: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    Header {
        kind: Kind::Data,
        flags: FLAG_LAST,
        dst: 2,
        pn,
        seq: pn as u32,
        frag: 0,
        len: payload.len() as u16,
        ack: 0,
        sack: 0,
        credit: 64,
    }
    .write(&mut f);
    f.extend_from_slice(payload);
    f
}

const SECRET: &[u8] = b"the payload nobody else may read";

#[test]
fn integrity_authenticates_and_leaves_the_payload_readable() {
    let (mut a, mut b) = pair(Level::Integrity);
    assert_eq!(a.trailer_len(), 16);
    let mut f = frame(0, SECRET);
    a.seal(&mut f);
    assert_eq!(f.len(), HEADER_LEN + SECRET.len() + 16);
    assert_eq!(&f[HEADER_LEN..HEADER_LEN + SECRET.len()], SECRET);
    let mut g = f.clone();
    let (h, payload) = b.open(&mut g).expect("opens");
    assert_eq!(h.pn, 0);
    assert_eq!(payload, SECRET);
    assert_eq!(
        b.open(&mut f.clone()).map(|_| ()),
        Err(FrameError::Replayed { pn: 0 })
    );
}

#[test]
fn encrypt_hides_the_payload() {
    let (mut a, mut b) = pair(Level::Encrypt);
    let mut f = frame(3, SECRET);
    a.seal(&mut f);
    assert_ne!(&f[HEADER_LEN..HEADER_LEN + SECRET.len()], SECRET);
    // Padding after the tag is ignored.
    f.resize(f.len() + 10, 0);
    let (h, payload) = b.open(&mut f).expect("opens");
    assert_eq!((h.pn, h.len as usize), (3, SECRET.len()));
    assert_eq!(payload, SECRET);
}

#[test]
fn every_flipped_bit_fails_authentication() {
    for level in [Level::Integrity, Level::Encrypt] {
        let (mut a, _) = pair(level);
        let mut f = frame(9, b"0123456789");
        a.seal(&mut f);
        for bit in 0..f.len() * 8 {
            let mut g = f.clone();
            g[bit / 8] ^= 1 << (bit % 8);
            let (_, mut b) = pair(level);
            assert!(b.open(&mut g).is_err(), "{level}: bit {bit} not caught");
        }
        // A flip in the tag or the body is an authentication failure, and
        // the window is not moved by it.
        let (_, mut b) = pair(level);
        let mut g = f.clone();
        let n = g.len();
        g[n - 1] ^= 0x80;
        assert_eq!(b.open(&mut g).map(|_| ()), Err(FrameError::Unauthenticated));
        assert!(b.open(&mut f.clone()).is_ok(), "{level}");
    }
}

#[test]
fn wrong_direction_or_level_fails() {
    let (mut a, _) = pair(Level::Encrypt);
    let mut f = frame(0, SECRET);
    a.seal(&mut f);
    // Its own receive key is not the sending key.
    let (mut a2, _) = pair(Level::Encrypt);
    assert_eq!(
        a2.open(&mut f.clone()).map(|_| ()),
        Err(FrameError::Unauthenticated)
    );
    // Sealed for encrypt, opened as integrity.
    let (_, mut bi) = pair(Level::Integrity);
    assert_eq!(
        bi.open(&mut f.clone()).map(|_| ()),
        Err(FrameError::Unauthenticated)
    );
}

#[test]
fn rekey_boundary_with_frames_of_both_epochs_in_flight() {
    for level in [Level::Integrity, Level::Encrypt] {
        let (mut a, mut b) = pair(level);
        let pns = [
            REKEY_INTERVAL - 3,
            REKEY_INTERVAL - 2,
            REKEY_INTERVAL - 1,
            REKEY_INTERVAL,
            REKEY_INTERVAL + 1,
        ];
        let sealed: Vec<Vec<u8>> = pns
            .iter()
            .map(|&pn| {
                let mut f = frame(pn, &pn.to_be_bytes());
                a.seal(&mut f);
                f
            })
            .collect();
        // New epoch first, then the stragglers of the old one.
        for i in [3, 0, 4, 2, 1] {
            let mut g = sealed[i].clone();
            let (h, payload) = b.open(&mut g).expect("opens");
            assert_eq!(h.pn, pns[i], "{level}");
            assert_eq!(payload, pns[i].to_be_bytes(), "{level}");
        }
    }
}

fn sim_with(level: Level, cfg: ChannelConfig, link: LinkConfig, w: Workload, seed: u64) -> Sim {
    let now = Instant::now();
    let pa = Protector::new(level, Some(TrafficKeys::new(K1, K2))).expect("keys");
    let pb = Protector::new(level, Some(TrafficKeys::new(K2, K1))).expect("keys");
    let a = Channel::new(cfg.clone(), 1, 2, pa, now);
    let b = Channel::new(cfg, 2, 1, pb, now);
    Sim::with_channels(seed, a, b, link, w, now)
}

#[test]
fn channels_over_a_lossy_link_at_each_level() {
    for level in [Level::Integrity, Level::Encrypt] {
        let w = Workload {
            bytes: [20 << 20, 20 << 20],
            min: 1,
            max: 1 << 20,
            buffer: 4 << 20,
        };
        let mut sim = sim_with(level, ChannelConfig::default(), LinkConfig::lossy(), w, 21);
        sim.run(Duration::from_secs(600));
        assert_eq!(sim.channel(0).level(), level);
        let corrupted: u64 = sim.link_stats.iter().map(|l| l.corrupted).sum();
        let rejected = sim.channel(0).stats().rejected + sim.channel(1).stats().rejected;
        assert!(rejected >= corrupted);
        assert!(sim.channel(0).stats().retransmits > 0);
    }
}

/// More than 2^20 frames in one direction: the key changes mid-transfer,
/// with frames of both epochs lost, reordered and retransmitted.
#[test]
fn a_transfer_across_the_rekey() {
    let cfg = ChannelConfig {
        max_frame: 120,
        ..ChannelConfig::default()
    };
    let w = Workload {
        bytes: [72 << 20, 0],
        min: 1000,
        max: 64 << 10,
        buffer: 4 << 20,
    };
    let link = LinkConfig {
        rate: None,
        ..LinkConfig::lossy()
    };
    let mut sim = sim_with(Level::Encrypt, cfg, link, w, 23);
    sim.run(Duration::from_secs(3600));
    assert!(sim.channel(0).stats().frames_sent > REKEY_INTERVAL + 1000);
}
