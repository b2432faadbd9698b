//! A channel on hostile input: arbitrary bytes, well-formed frames with
//! arbitrary fields (CRC valid), and a peer's frames in any order with
//! duplicates. Never a panic, memory bounded, messages intact.

use std::time::{Duration, Instant};

use ethersan_channel::channel::{Channel, ChannelConfig, ChannelState};
use ethersan_channel::frame::{FrameError, Header, Kind, FLAG_LAST, MAGIC, VERSION};
use ethersan_channel::protect::Protector;
use proptest::prelude::*;

fn cfg() -> ChannelConfig {
    ChannelConfig {
        max_frame: 200,
        recv_window: 32,
        max_message: 4096,
        ..ChannelConfig::default()
    }
}

/// A channel (id 1, peer 2) with some data of its own in flight.
fn busy_channel(now: Instant) -> Channel {
    let mut ch = Channel::new(cfg(), 1, 2, Protector::crc_only(), now);
    ch.send_message(&[7; 1000]).expect("send");
    let mut out = Vec::new();
    while ch.poll_transmit(now, &mut out) {}
    ch
}

/// The most a channel with [`cfg`] may hold for its application.
fn recv_bound(ch: &Channel) -> usize {
    32 * ch.max_payload() + 4096
}

fn arb_header() -> impl Strategy<Value = (Header, Vec<u8>)> {
    (
        prop_oneof![Just(Kind::Data), Just(Kind::Ack), Just(Kind::Close)],
        any::<u8>(),
        any::<u64>(),
        prop_oneof![0u32..40, any::<u32>()],
        prop_oneof![0u16..4, any::<u16>()],
        prop_oneof![0u32..8, any::<u32>()],
        any::<u64>(),
        prop_oneof![0u32..64, any::<u32>()],
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(kind, flags, pn, seq, frag, ack, sack, credit, payload)| {
            let h = Header {
                kind,
                flags,
                dst: 1,
                pn,
                seq,
                frag,
                len: payload.len() as u16,
                ack,
                sack,
                credit,
            };
            (h, payload)
        })
}

fn sealed(h: &Header, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    h.write(&mut f);
    f.extend_from_slice(payload);
    Protector::crc_only().seal(&mut f);
    f
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..1600)) {
        let now = Instant::now();
        let mut ch = busy_channel(now);
        let before = ch.stats();
        if ch.handle_frame(now, &mut bytes).is_err() {
            let after = ch.stats();
            prop_assert_eq!(after.rejected, before.rejected + 1);
            prop_assert_eq!(after.frames_received, before.frames_received);
            prop_assert_eq!(ch.send_buffered(), 1000);
        }
        let mut out = Vec::new();
        while ch.poll_transmit(now, &mut out) {}
        ch.handle_timeout(now + Duration::from_secs(1));
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_prefix_never_panic(
        kind in prop_oneof![Just(1u8), Just(2), Just(3)],
        mut rest in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let now = Instant::now();
        let mut ch = busy_channel(now);
        let mut f = vec![MAGIC, VERSION, kind, 0, 0, 0, 0, 1];
        f.append(&mut rest);
        let _ = ch.handle_frame(now, &mut f);
        // With a valid CRC.
        Protector::crc_only().seal(&mut f);
        let _ = ch.handle_frame(now, &mut f);
        let mut out = Vec::new();
        while ch.poll_transmit(now, &mut out) {}
    }

    #[test]
    fn hostile_frames_with_valid_crc(frames in proptest::collection::vec(arb_header(), 1..60)) {
        let mut now = Instant::now();
        let mut ch = busy_channel(now);
        let mut out = Vec::new();
        for (i, (h, payload)) in frames.iter().enumerate() {
            let mut f = sealed(h, payload);
            match ch.handle_frame(now, &mut f) {
                Err(FrameError::AckOutOfRange { .. }) => {}
                Err(FrameError::UnexpectedPayload(_)) => prop_assert!(h.kind != Kind::Data),
                Err(FrameError::Replayed { .. }) => {}
                Err(e) => prop_assert!(false, "unexpected rejection {e}"),
                Ok(()) => {}
            }
            prop_assert!(ch.recv_buffered() <= recv_bound(&ch));
            if i % 3 == 0 {
                while ch.recv_message().is_some() {}
            }
            while ch.poll_transmit(now, &mut out) {}
            now += Duration::from_millis(3);
            ch.handle_timeout(now);
        }
        while let Some(m) = ch.recv_message() {
            prop_assert!(m.len() <= 4096);
        }
    }

    /// The frames of a message stream delivered in any order, some twice,
    /// reassemble into the same messages.
    #[test]
    fn any_order_with_duplicates(
        sizes in proptest::collection::vec(0usize..1000, 1..20),
        order in proptest::collection::vec(any::<u32>(), 0..400),
        seq0 in prop_oneof![Just(0u32), Just(u32::MAX - 5), any::<u32>()],
    ) {
        let now = Instant::now();
        let cfg = ChannelConfig {
            max_frame: 200,
            initial_cwnd: 10_000,
            max_cwnd: 10_000,
            recv_window: 10_000,
            initial_seq: seq0,
            ..ChannelConfig::default()
        };
        let mut a = Channel::new(cfg.clone(), 1, 2, Protector::crc_only(), now);
        let mut b = Channel::new(cfg, 2, 1, Protector::crc_only(), now);
        let msgs: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
            .collect();
        for m in &msgs {
            a.send_message(m).expect("send");
        }
        let mut frames = Vec::new();
        let mut out = Vec::new();
        while a.poll_transmit(now, &mut out) {
            frames.push(out.clone());
        }
        // Shuffle (Fisher-Yates driven by `order`), then duplicate a few.
        let n = frames.len();
        for (i, r) in order.iter().enumerate().take(n) {
            let j = i + (*r as usize) % (n - i);
            frames.swap(i, j);
        }
        let dups: Vec<Vec<u8>> = order.iter().skip(n).map(|r| frames[*r as usize % n].clone()).collect();
        frames.extend(dups);
        for mut f in frames {
            let _ = b.handle_frame(now, &mut f);
        }
        let mut got = Vec::new();
        while let Some(m) = b.recv_message() {
            got.push(m);
        }
        prop_assert_eq!(got, msgs);
        prop_assert_eq!(b.state(), ChannelState::Open);
    }
}

#[test]
fn frames_for_another_channel_or_kind_are_rejected() {
    let now = Instant::now();
    let mut ch = busy_channel(now);
    let h = Header {
        kind: Kind::Ack,
        flags: 0,
        dst: 1,
        pn: 0,
        seq: 0,
        frag: 0,
        len: 0,
        ack: 0,
        sack: 0,
        credit: 10,
    };
    let mut f = sealed(&Header { dst: 5, ..h }, &[]);
    assert_eq!(
        ch.handle_frame(now, &mut f),
        Err(FrameError::WrongChannel { got: 5, local: 1 })
    );
    let mut f = sealed(&h, &[]);
    f[2] = 0x10;
    assert_eq!(
        ch.handle_frame(now, &mut f),
        Err(FrameError::NotChannelFrame(Kind::Hello))
    );
    let mut f = sealed(&Header { ack: 500, ..h }, &[]);
    assert!(matches!(
        ch.handle_frame(now, &mut f),
        Err(FrameError::AckOutOfRange { ack: 500, .. })
    ));
    let mut f = sealed(&Header { len: 1, ..h }, &[9]);
    assert_eq!(
        ch.handle_frame(now, &mut f),
        Err(FrameError::UnexpectedPayload(Kind::Ack))
    );
    let mut f = sealed(&h, &[]);
    let n = f.len();
    f[n - 1] ^= 1;
    assert_eq!(ch.handle_frame(now, &mut f), Err(FrameError::BadCrc));
    assert_eq!(ch.stats().rejected, 5);
    let mut f = sealed(&h, &[]);
    assert_eq!(ch.handle_frame(now, &mut f), Ok(()));
    let mut f = sealed(&h, &[]);
    assert_eq!(
        ch.handle_frame(now, &mut f),
        Err(FrameError::Replayed { pn: 0 })
    );
}

#[test]
fn fragment_out_of_place_fails_the_channel() {
    let now = Instant::now();
    let mut ch = Channel::new(cfg(), 1, 2, Protector::crc_only(), now);
    let h = Header {
        kind: Kind::Data,
        flags: 0,
        dst: 1,
        pn: 0,
        seq: 0,
        frag: 1,
        len: 3,
        ack: 0,
        sack: 0,
        credit: 10,
    };
    ch.handle_frame(now, &mut sealed(&h, b"abc"))
        .expect("valid frame");
    assert!(matches!(ch.state(), ChannelState::Failed(_)));
    assert!(ch.send_message(b"x").is_err());
    assert_eq!(ch.poll_timeout(), None);
    // A failed channel still checks what it is given, and takes nothing.
    let mut f = sealed(
        &Header {
            pn: 1,
            frag: 0,
            ..h
        },
        b"abc",
    );
    let n = f.len();
    f[n - 1] ^= 1;
    assert_eq!(ch.handle_frame(now, &mut f), Err(FrameError::BadCrc));
    let mut f = sealed(
        &Header {
            pn: 1,
            frag: 0,
            ..h
        },
        b"abc",
    );
    assert_eq!(ch.handle_frame(now, &mut f), Ok(()));
    assert_eq!(ch.recv_buffered(), 0);
    assert!(!ch.poll_transmit(now, &mut Vec::new()));
}

#[test]
fn a_channel_moves_between_threads() {
    fn send<T: Send>() {}
    send::<Channel>();
}

#[test]
fn oversized_message_fails_the_channel() {
    let now = Instant::now();
    let mut ch = Channel::new(cfg(), 1, 2, Protector::crc_only(), now);
    assert!(ch.send_message(&[0; 4097]).is_err());
    for i in 0..40u32 {
        let h = Header {
            kind: Kind::Data,
            flags: 0,
            dst: 1,
            pn: u64::from(i),
            seq: i,
            frag: i as u16,
            len: 150,
            ack: 0,
            sack: 0,
            credit: 10,
        };
        let _ = ch.handle_frame(now, &mut sealed(&h, &[1; 150]));
        while ch.recv_message().is_some() {}
    }
    assert_eq!(
        ch.state(),
        ChannelState::Failed(ethersan_channel::channel::FailReason::MessageTooLarge)
    );
    assert!(ch.recv_buffered() <= 4096);
}

#[test]
fn beyond_the_window_is_dropped_and_acknowledged_at_once() {
    let now = Instant::now();
    let mut ch = Channel::new(cfg(), 1, 2, Protector::crc_only(), now);
    let h = Header {
        kind: Kind::Data,
        flags: FLAG_LAST,
        dst: 1,
        pn: 0,
        seq: 32,
        frag: 0,
        len: 1,
        ack: 0,
        sack: 0,
        credit: 10,
    };
    ch.handle_frame(now, &mut sealed(&h, b"z")).expect("valid");
    assert_eq!(ch.stats().window_drops, 1);
    assert_eq!(ch.recv_buffered(), 0);
    let mut out = Vec::new();
    assert!(ch.poll_transmit(now, &mut out));
    let ack = Header::parse(&out).expect("ack");
    assert_eq!((ack.kind, ack.ack, ack.credit), (Kind::Ack, 0, 32));
    // Within the window but ahead of a gap: held, SACKed at once.
    let mut f = sealed(&Header { seq: 3, pn: 1, ..h }, b"q");
    ch.handle_frame(now, &mut f).expect("valid");
    assert!(ch.poll_transmit(now, &mut out));
    let ack = Header::parse(&out).expect("ack");
    assert_eq!((ack.ack, ack.sack), (0, 0b100));
}
