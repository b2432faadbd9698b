use super::*;
use proptest::prelude::*;

const TIMEOUT: Duration = Duration::from_secs(5);

fn group(name: &str, secret: &[u8]) -> GroupKeys {
    GroupKeys::derive(name, secret).unwrap()
}

fn lab() -> GroupKeys {
    group("lab", b"correct horse battery")
}

/// A whole handshake: (initiator's, target's) results.
fn handshake(level: Level) -> (Established, Established) {
    let now = Instant::now();
    let mut init = InitiatorHandshake::new(&lab(), 7, level, 9000).unwrap();
    let mut resp = Responder::new(lab(), 16, TIMEOUT);
    let out = resp.handle_hello(now, init.hello(), 99, 1500).unwrap();
    assert!(!out.repeated);
    assert_eq!(out.reply.len(), HELLO_REPLY_LEN);
    let (finish, i) = init.handle_reply(&out.reply).unwrap();
    assert_eq!(finish.len(), HELLO_FINISH_LEN);
    let t = resp.handle_finish(now, &finish).unwrap();
    assert_eq!(resp.half_open(), 0);
    (i, t)
}

/// Message 2's payload, hand-made: level, largest frame, id, suite byte.
fn reply_body(level: Level, max_frame: u32, id: u32, suite: u8) -> [u8; PAYLOAD2_LEN] {
    let mut b = [0u8; PAYLOAD2_LEN];
    b[..PAYLOAD_LEN].copy_from_slice(&encode_payload(level, max_frame, id));
    b[PAYLOAD_LEN] = suite;
    b
}

/// A handshake of an initiator offering `offer` with a target supporting
/// `supported`: (initiator's, target's) results.
fn negotiate(offer: &[Suite], supported: &[Suite]) -> (Established, Established) {
    let now = Instant::now();
    let mut init = InitiatorHandshake::with_suites(&lab(), 7, Level::Encrypt, 9000, offer).unwrap();
    let mut resp = Responder::new(lab(), 16, TIMEOUT).with_suites(supported);
    let reply = resp
        .handle_hello(now, init.hello(), 99, 1500)
        .unwrap()
        .reply;
    let (finish, i) = init.handle_reply(&reply).unwrap();
    let t = resp.handle_finish(now, &finish).unwrap();
    (i, t)
}

fn check_keys(a: &mut TrafficKeys, b: &mut TrafficKeys) {
    for pn in [0u64, 1, 1000] {
        let mut buf = b"a frame's payload".to_vec();
        let tag = a.seal(pn, b"header", &mut buf);
        b.open(pn, b"header", &mut buf, &tag).unwrap();
        assert_eq!(buf, b"a frame's payload");
    }
}

#[test]
fn round_trip_each_level() {
    for level in [Level::None, Level::Integrity, Level::Encrypt] {
        let (mut i, mut t) = handshake(level);
        assert_eq!((i.level, t.level), (level, level));
        assert_eq!((i.local_id, i.peer_id), (7, 99));
        assert_eq!((t.local_id, t.peer_id), (99, 7));
        assert_eq!((i.peer_max_frame, t.peer_max_frame), (1500, 9000));
        check_keys(&mut i.keys, &mut t.keys);
        check_keys(&mut t.keys, &mut i.keys);
    }
}

#[test]
fn frame_lengths() {
    let init = InitiatorHandshake::new(&lab(), 7, Level::Encrypt, 1500).unwrap();
    assert_eq!(init.hello().len(), HELLO_LEN);
    assert_eq!(
        (HELLO_LEN, HELLO_REPLY_LEN, HELLO_FINISH_LEN),
        (69, 114, 72)
    );
    assert_eq!(&init.hello()[..8], &[0xE5, 3, 0x10, 0, 0, 0, 0, 0]);
}

#[test]
fn non_members_get_nothing() {
    let now = Instant::now();
    for other in [
        group("lab", b"another secret"),
        group("lab2", b"correct horse battery"),
    ] {
        let init = InitiatorHandshake::new(&other, 7, Level::Encrypt, 1500).unwrap();
        let mut resp = Responder::new(lab(), 16, TIMEOUT);
        assert_eq!(
            resp.handle_hello(now, init.hello(), 99, 1500).unwrap_err(),
            HandshakeError::NotMember
        );
        assert_eq!(resp.half_open(), 0);
    }
}

#[test]
fn repeated_hello_gets_the_same_reply() {
    let now = Instant::now();
    let mut init = InitiatorHandshake::new(&lab(), 7, Level::Integrity, 1500).unwrap();
    let mut resp = Responder::new(lab(), 16, TIMEOUT);
    let first = resp.handle_hello(now, init.hello(), 99, 1500).unwrap();
    let again = resp.handle_hello(now, init.hello(), 100, 1500).unwrap();
    assert!(again.repeated);
    assert_eq!(first.reply, again.reply);
    assert_eq!(resp.half_open(), 1);
    let (finish, _) = init.handle_reply(&again.reply).unwrap();
    let t = resp.handle_finish(now, &finish).unwrap();
    assert_eq!(t.local_id, 99);
    // The same finish again: the handshake is gone.
    assert_eq!(
        resp.handle_finish(now, &finish).unwrap_err(),
        HandshakeError::UnknownHandshake { id: 99 }
    );
    // And a second reply to the initiator.
    assert_eq!(
        init.handle_reply(&first.reply).unwrap_err(),
        HandshakeError::Finished
    );
}

#[test]
fn refused_level_is_an_error() {
    // A target that grants less than asked (ours never does: hand-made).
    let keys = lab();
    let mut init = InitiatorHandshake::new(&keys, 7, Level::Encrypt, 1500).unwrap();
    let mut state = new_state(&keys, &generate_static().unwrap(), false).unwrap();
    let mut p = [0u8; MSG1_LEN];
    state.read_message(&init.hello()[8..], &mut p).unwrap();
    let mut reply = prefix(KIND_HELLO_REPLY, 7).to_vec();
    let mut out = [0u8; MSG2_LEN];
    let n = state
        .write_message(
            &reply_body(Level::Integrity, 1500, 5, Suite::ChaCha20Poly1305.to_u8()),
            &mut out,
        )
        .unwrap();
    reply.extend_from_slice(&out[..n]);
    assert_eq!(
        init.handle_reply(&reply).unwrap_err(),
        HandshakeError::LevelRefused {
            asked: Level::Encrypt,
            granted: Level::Integrity
        }
    );
}

#[test]
fn granted_level_is_echoed() {
    let (i, t) = handshake(Level::None);
    assert_eq!(i.level, Level::None);
    assert_eq!(t.level, Level::None);
}

#[test]
fn half_open_table_is_bounded_and_expires() {
    let now = Instant::now();
    let mut resp = Responder::new(lab(), 4, TIMEOUT);
    let inits: Vec<_> = (1..=10)
        .map(|id| InitiatorHandshake::new(&lab(), id, Level::Encrypt, 1500).unwrap())
        .collect();
    let mut replies = Vec::new();
    for (n, i) in inits.iter().enumerate() {
        let t = now + Duration::from_millis(n as u64);
        replies.push(
            resp.handle_hello(t, i.hello(), 100 + n as u32, 1500)
                .unwrap(),
        );
        assert!(resp.half_open() <= 4);
    }
    assert_eq!(resp.half_open(), 4);
    assert!(resp.order.len() <= 8);
    // The oldest were evicted: their finish finds nothing.
    let mut inits = inits;
    let (finish, _) = inits[0].handle_reply(&replies[0].reply).unwrap();
    assert_eq!(
        resp.handle_finish(now, &finish).unwrap_err(),
        HandshakeError::UnknownHandshake { id: 100 }
    );
    // The newest completes.
    let (finish, _) = inits[9].handle_reply(&replies[9].reply).unwrap();
    assert!(resp.handle_finish(now, &finish).is_ok());
    // The rest time out.
    let (finish, _) = inits[8].handle_reply(&replies[8].reply).unwrap();
    resp.expire(now + TIMEOUT + Duration::from_secs(1));
    assert_eq!(resp.half_open(), 0);
    assert!(resp.handle_finish(now, &finish).is_err());
}

#[test]
fn bad_ids_are_refused() {
    assert_eq!(
        InitiatorHandshake::new(&lab(), 0, Level::Encrypt, 1500).unwrap_err(),
        HandshakeError::BadLocalId(0)
    );
    let init = InitiatorHandshake::new(&lab(), 7, Level::Encrypt, 1500).unwrap();
    let mut resp = Responder::new(lab(), 4, TIMEOUT);
    let now = Instant::now();
    assert_eq!(
        resp.handle_hello(now, init.hello(), 0, 1500).unwrap_err(),
        HandshakeError::BadLocalId(0)
    );
    resp.handle_hello(now, init.hello(), 5, 1500).unwrap();
    let other = InitiatorHandshake::new(&lab(), 8, Level::Encrypt, 1500).unwrap();
    assert_eq!(
        resp.handle_hello(now, other.hello(), 5, 1500).unwrap_err(),
        HandshakeError::BadLocalId(5)
    );
}

/// Every single-byte change and every truncation of each message fails,
/// and the real message still works afterwards.
#[test]
fn every_byte_matters() {
    let now = Instant::now();
    let mut init = InitiatorHandshake::new(&lab(), 7, Level::Encrypt, 1500).unwrap();
    let hello = init.hello().to_vec();
    for i in 0..hello.len() {
        let mut resp = Responder::new(lab(), 4, TIMEOUT);
        let mut m = hello.clone();
        m[i] ^= 0x01;
        assert!(
            resp.handle_hello(now, &m, 9, 1500).is_err(),
            "HELLO byte {i}"
        );
        assert!(resp.handle_hello(now, &hello[..i], 9, 1500).is_err());
        assert_eq!(resp.half_open(), 0);
    }
    let mut resp = Responder::new(lab(), 4, TIMEOUT);
    let reply = resp.handle_hello(now, &hello, 9, 1500).unwrap().reply;
    for i in 0..reply.len() {
        let mut m = reply.clone();
        m[i] ^= 0x80;
        assert!(init.handle_reply(&m).is_err(), "HELLO_REPLY byte {i}");
        assert!(init.handle_reply(&reply[..i]).is_err());
    }
    let (finish, mut i_est) = init.handle_reply(&reply).unwrap();
    for i in 0..finish.len() {
        // A fresh target each time: a finish that fails authentication ends
        // its handshake (see `handle_finish`).
        let mut resp = Responder::new(lab(), 4, TIMEOUT);
        let mut init = InitiatorHandshake::new(&lab(), 7, Level::Encrypt, 1500).unwrap();
        let reply = resp.handle_hello(now, init.hello(), 9, 1500).unwrap().reply;
        let finish = init.handle_reply(&reply).unwrap().0;
        let mut m = finish.clone();
        m[i] ^= 0x01;
        assert!(
            resp.handle_finish(now, &m).is_err(),
            "HELLO_FINISH byte {i}"
        );
        assert!(resp.handle_finish(now, &finish[..i]).is_err());
    }
    // Truncated or misaddressed finishes leave the handshake waiting.
    for i in 0..finish.len() {
        assert!(resp.handle_finish(now, &finish[..i]).is_err());
    }
    let mut m = finish.clone();
    m[7] ^= 1;
    assert_eq!(
        resp.handle_finish(now, &m).unwrap_err(),
        HandshakeError::UnknownHandshake { id: 8 }
    );
    let mut t_est = resp.handle_finish(now, &finish).unwrap();
    check_keys(&mut i_est.keys, &mut t_est.keys);
    check_keys(&mut t_est.keys, &mut i_est.keys);
}

/// The keys are those Noise itself would use: a snow transport built from
/// the same handshake opens our frames (nonce = packet number).
#[test]
fn keys_are_noise_split() {
    let keys = lab();
    let chacha = [Suite::ChaCha20Poly1305];
    let mut init =
        InitiatorHandshake::with_suites(&keys, 7, Level::Encrypt, 1500, &chacha).unwrap();
    let mut state = new_state(&keys, &generate_static().unwrap(), false).unwrap();
    let mut p = [0u8; MSG1_LEN];
    state.read_message(&init.hello()[8..], &mut p).unwrap();
    let mut reply = prefix(KIND_HELLO_REPLY, 7).to_vec();
    let mut out = [0u8; MSG2_LEN];
    let n = state
        .write_message(
            &reply_body(Level::Encrypt, 1500, 5, Suite::ChaCha20Poly1305.to_u8()),
            &mut out,
        )
        .unwrap();
    reply.extend_from_slice(&out[..n]);
    let (finish, mut est) = init.handle_reply(&reply).unwrap();
    state.read_message(&finish[8..], &mut p).unwrap();
    let snow = state.into_stateless_transport_mode().unwrap();
    let mut buf = b"hello noise".to_vec();
    let tag = est.keys.seal(3, &[], &mut buf);
    buf.extend_from_slice(&tag);
    let mut plain = [0u8; 64];
    let n = snow.read_message(3, &buf, &mut plain).unwrap();
    assert_eq!(&plain[..n], b"hello noise");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary frames (and real ones with arbitrary changes) never panic
    /// and never open a channel.
    #[test]
    fn arbitrary_input_never_panics(
        junk in proptest::collection::vec(any::<u8>(), 0..200),
        flips in proptest::collection::vec((0usize..117, any::<u8>()), 1..6),
        kind in 0u8..3,
    ) {
        let now = Instant::now();
        let mut init = InitiatorHandshake::new(&lab(), 7, Level::Encrypt, 1500).unwrap();
        let mut resp = Responder::new(lab(), 4, TIMEOUT);
        let _ = resp.handle_hello(now, &junk, 9, 1500);
        let _ = resp.handle_finish(now, &junk);
        let _ = init.handle_reply(&junk);
        let reply = resp.handle_hello(now, init.hello(), 10, 1500).unwrap().reply;
        let mut m = match kind {
            0 => init.hello().to_vec(),
            1 => reply.clone(),
            _ => {
                let mut i2 = InitiatorHandshake::new(&lab(), 7, Level::Encrypt, 1500).unwrap();
                let r2 = resp.handle_hello(now, i2.hello(), 11, 1500).unwrap().reply;
                i2.handle_reply(&r2).unwrap().0
            }
        };
        let len = m.len();
        let mut changed = false;
        for (at, x) in flips {
            if x != 0 {
                m[at % len] ^= x;
                changed = true;
            }
        }
        prop_assume!(changed);
        match kind {
            0 => prop_assert!(resp.handle_hello(now, &m, 12, 1500).is_err()),
            1 => prop_assert!(init.handle_reply(&m).is_err()),
            _ => prop_assert!(resp.handle_finish(now, &m).is_err()),
        }
    }
}

const AES: Suite = Suite::Aes256Gcm;
const CHACHA: Suite = Suite::ChaCha20Poly1305;

#[test]
fn the_initiators_first_supported_suite_is_picked() {
    for (offer, supported, want) in [
        (&[AES, CHACHA][..], &[AES, CHACHA][..], AES),
        (&[CHACHA, AES][..], &[AES, CHACHA][..], CHACHA),
        (&[AES][..], &[CHACHA, AES][..], AES),
        // A peer without AES (forced to ChaCha20) and one preferring AES
        // agree on ChaCha20, whichever side lacks it.
        (&[CHACHA][..], &[AES, CHACHA][..], CHACHA),
        (&[AES, CHACHA][..], &[CHACHA][..], CHACHA),
    ] {
        let (mut i, mut t) = negotiate(offer, supported);
        assert_eq!(i.keys.suite(), want, "{offer:?} to {supported:?}");
        assert_eq!(t.keys.suite(), want, "{offer:?} to {supported:?}");
        check_keys(&mut i.keys, &mut t.keys);
        check_keys(&mut t.keys, &mut i.keys);
    }
}

#[test]
fn the_default_offer_is_this_machines_preference() {
    let init = InitiatorHandshake::new(&lab(), 7, Level::Encrypt, 1500).unwrap();
    assert_eq!(init.suites(), &Suite::preferred()[..]);
    let first = if crate::aead::aes_hardware() {
        AES
    } else {
        CHACHA
    };
    assert_eq!(init.suites()[0], first);
    let (i, t) = handshake(Level::Encrypt);
    assert_eq!((i.keys.suite(), t.keys.suite()), (first, first));
}

#[test]
fn no_suite_in_common_fails_with_the_reason() {
    let now = Instant::now();
    let mut init =
        InitiatorHandshake::with_suites(&lab(), 7, Level::Encrypt, 1500, &[AES]).unwrap();
    let mut resp = Responder::new(lab(), 16, TIMEOUT).with_suites(&[CHACHA]);
    let reply = resp
        .handle_hello(now, init.hello(), 99, 1500)
        .unwrap()
        .reply;
    let err = init.handle_reply(&reply).unwrap_err();
    assert_eq!(
        err,
        HandshakeError::NoCommonSuite {
            offered: "aes256gcm".into()
        }
    );
    assert!(err.to_string().contains("ETHERSAN_NATIVE_SUITES"), "{err}");
    // A finish made anyway (by a hand-made initiator) opens nothing.
    let mut state = new_state(&lab(), &generate_static().unwrap(), true).unwrap();
    let mut resp = Responder::new(lab(), 16, TIMEOUT).with_suites(&[CHACHA]);
    let mut msg = [0u8; MSG1_LEN];
    let n = state
        .write_message(&encode_offer(Level::Encrypt, 1500, 7, &[AES]), &mut msg)
        .unwrap();
    let mut hello = prefix(KIND_HELLO, 0).to_vec();
    hello.extend_from_slice(&msg[..n]);
    let reply = resp.handle_hello(now, &hello, 99, 1500).unwrap().reply;
    let mut p = [0u8; MSG2_LEN];
    let n = state.read_message(&reply[PREFIX_LEN..], &mut p).unwrap();
    assert_eq!(p[n - 1], 0, "the reply picks no suite");
    let mut finish = prefix(KIND_HELLO_FINISH, 99).to_vec();
    let mut msg3 = [0u8; MSG3_LEN];
    let n = state.write_message(&[], &mut msg3).unwrap();
    finish.extend_from_slice(&msg3[..n]);
    assert_eq!(
        resp.handle_finish(now, &finish).unwrap_err(),
        HandshakeError::BadPayload("no suite in common")
    );
    assert_eq!(resp.half_open(), 0);
}

#[test]
fn offers_are_checked() {
    assert_eq!(
        InitiatorHandshake::with_suites(&lab(), 7, Level::Encrypt, 1500, &[]).unwrap_err(),
        HandshakeError::BadPayload("no suite to offer")
    );
    // Repeats dropped, order kept.
    let init =
        InitiatorHandshake::with_suites(&lab(), 7, Level::Encrypt, 1500, &[CHACHA, CHACHA, AES])
            .unwrap();
    assert_eq!(init.suites(), &[CHACHA, AES]);
    // Unknown values (a newer peer's) are skipped; a 0 ends the list.
    assert_eq!(decode_offer(&[9, 2, 0, 1]), vec![AES]);
    assert_eq!(decode_offer(&[1, 2, 0, 0]), vec![CHACHA, AES]);
    assert_eq!(decode_offer(&[0, 1, 2, 0]), Vec::<Suite>::new());
    // A HELLO offering nothing this target knows gets a reply with no
    // suite; one offering nothing at all gets no reply.
    let now = Instant::now();
    for (offer, ok) in [([7u8, 0, 0, 0], true), ([0u8, 2, 1, 0], false)] {
        let mut state = new_state(&lab(), &generate_static().unwrap(), true).unwrap();
        let mut body = encode_offer(Level::Encrypt, 1500, 7, &[]);
        body[PAYLOAD_LEN..].copy_from_slice(&offer);
        let mut msg = [0u8; MSG1_LEN];
        let n = state.write_message(&body, &mut msg).unwrap();
        let mut hello = prefix(KIND_HELLO, 0).to_vec();
        hello.extend_from_slice(&msg[..n]);
        let mut resp = Responder::new(lab(), 16, TIMEOUT);
        let r = resp.handle_hello(now, &hello, 99, 1500);
        if ok {
            let reply = r.unwrap().reply;
            let mut p = [0u8; MSG2_LEN];
            let n = state.read_message(&reply[PREFIX_LEN..], &mut p).unwrap();
            assert_eq!(p[n - 1], 0);
        } else {
            assert_eq!(
                r.unwrap_err(),
                HandshakeError::BadPayload("no suite offered")
            );
        }
    }
}

#[test]
fn a_reply_picking_a_suite_not_offered_is_refused() {
    let keys = lab();
    for picked in [AES.to_u8(), 9] {
        let mut init =
            InitiatorHandshake::with_suites(&keys, 7, Level::Encrypt, 1500, &[CHACHA]).unwrap();
        let mut state = new_state(&keys, &generate_static().unwrap(), false).unwrap();
        let mut p = [0u8; MSG1_LEN];
        state.read_message(&init.hello()[8..], &mut p).unwrap();
        let mut reply = prefix(KIND_HELLO_REPLY, 7).to_vec();
        let mut out = [0u8; MSG2_LEN];
        let n = state
            .write_message(&reply_body(Level::Encrypt, 1500, 5, picked), &mut out)
            .unwrap();
        reply.extend_from_slice(&out[..n]);
        assert_eq!(
            init.handle_reply(&reply).unwrap_err(),
            HandshakeError::BadPayload("suite not offered")
        );
    }
}

#[test]
fn another_version_is_refused_with_the_reason() {
    let now = Instant::now();
    let mut init = InitiatorHandshake::new(&lab(), 7, Level::Encrypt, 1500).unwrap();
    let mut resp = Responder::new(lab(), 16, TIMEOUT);
    let reply = resp
        .handle_hello(now, init.hello(), 99, 1500)
        .unwrap()
        .reply;
    let mut old_hello = init.hello().to_vec();
    old_hello[1] = 1;
    let err = Responder::new(lab(), 16, TIMEOUT)
        .handle_hello(now, &old_hello, 98, 1500)
        .unwrap_err();
    assert_eq!(err, HandshakeError::BadVersion(1));
    assert_eq!(
        err.to_string(),
        "peer speaks native transport version 1, this ethersan speaks 3: \
         run the same ethersan version on both ends"
    );
    let mut old_reply = reply.clone();
    old_reply[1] = 1;
    assert_eq!(
        init.handle_reply(&old_reply).unwrap_err(),
        HandshakeError::BadVersion(1)
    );
    let (finish, _) = init.handle_reply(&reply).unwrap();
    let mut old_finish = finish.clone();
    old_finish[1] = 1;
    assert_eq!(
        resp.handle_finish(now, &old_finish).unwrap_err(),
        HandshakeError::BadVersion(1)
    );
    resp.handle_finish(now, &finish).unwrap();
}
