//! The traffic keys' AEAD suites end to end: a real handshake negotiates
//! the suite, then sealed frames go both ways through [`Protector`]s (in
//! place and out of place), tampering is caught under each suite, key
//! epochs are crossed under AES-256-GCM, and a frame of another version is
//! refused with a message naming both versions.

use std::time::{Duration, Instant};

use ethersan_channel::aead::{Suite, REKEY_INTERVAL};
use ethersan_channel::frame::{FrameError, Header, Kind, FLAG_LAST, HEADER_LEN, VERSION};
use ethersan_channel::group::GroupKeys;
use ethersan_channel::handshake::{Established, InitiatorHandshake, Responder};
use ethersan_channel::protect::Protector;
use ethersan_channel::Level;

const AES: Suite = Suite::Aes256Gcm;
const CHACHA: Suite = Suite::ChaCha20Poly1305;

fn lab() -> GroupKeys {
    GroupKeys::derive("lab", b"correct horse battery").expect("group keys")
}

/// A real handshake, the initiator offering `offer`, the target
/// supporting `supported`: (initiator's, target's) results.
fn negotiate(offer: &[Suite], supported: &[Suite], level: Level) -> (Established, Established) {
    let now = Instant::now();
    let mut init = InitiatorHandshake::with_suites(&lab(), 7, level, 9000, offer).expect("init");
    let mut resp = Responder::new(lab(), 16, Duration::from_secs(5)).with_suites(supported);
    let reply = resp
        .handle_hello(now, init.hello(), 99, 9000)
        .expect("HELLO answered")
        .reply;
    let (finish, i) = init.handle_reply(&reply).expect("reply taken");
    let t = resp.handle_finish(now, &finish).expect("finish taken");
    (i, t)
}

/// The two ends' protectors: (initiator's, target's).
fn protectors(offer: &[Suite], supported: &[Suite], level: Level) -> (Protector, Protector) {
    let (i, t) = negotiate(offer, supported, level);
    assert_eq!(i.keys.suite(), t.keys.suite());
    (
        Protector::new(level, Some(i.keys)).expect("initiator protector"),
        Protector::new(level, Some(t.keys)).expect("target protector"),
    )
}

fn header(pn: u64, len: usize) -> Header {
    Header {
        kind: Kind::Data,
        flags: FLAG_LAST,
        dst: 99,
        pn,
        seq: pn as u32,
        frag: 0,
        len: len as u16,
        ack: 0,
        sack: 0,
        credit: 64,
    }
}

/// A sealed frame of `payload` under packet number `pn`.
fn sealed(p: &mut Protector, pn: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    header(pn, payload.len()).write(&mut f);
    f.extend_from_slice(payload);
    p.seal(&mut f);
    f
}

fn payload(pn: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64 ^ pn) as u8).collect()
}

/// One frame from `tx` to `rx`, opened out of place and in place.
fn one_way(tx: &mut Protector, rx: &mut Protector, pn: u64) {
    let data = payload(pn, 1000 + (pn % 7000) as usize);
    let f = sealed(tx, pn, &data);
    assert_ne!(
        &f[HEADER_LEN..HEADER_LEN + data.len()],
        &data[..],
        "encrypted"
    );
    let mut dst = vec![0u8; data.len()];
    let h = rx.verify_into(&f, &mut dst).expect("opens out of place");
    assert_eq!(h.pn, pn);
    assert_eq!(dst, data);
    let mut g = f.clone();
    let (h, p) = rx.open(&mut g).expect("opens in place");
    assert_eq!(h.pn, pn);
    assert_eq!(p, &data[..]);
    // Recorded now: the same frame again is a replay.
    let mut again = f.clone();
    assert_eq!(
        rx.open(&mut again).map(|_| ()),
        Err(FrameError::Replayed { pn })
    );
}

/// Frames of several sizes both ways.
fn exchange(a: &mut Protector, b: &mut Protector, pns: &[u64]) {
    for &pn in pns {
        one_way(a, b, pn);
        one_way(b, a, pn);
    }
}

#[test]
fn both_suites_end_to_end() {
    for suite in [AES, CHACHA] {
        let (mut a, mut b) = protectors(&[suite], &[AES, CHACHA], Level::Encrypt);
        exchange(&mut a, &mut b, &[0, 1, 2, 500]);
        // Gathered sealing gives the same frame as sealing in one piece.
        let data = payload(501, 3000);
        let mut buf = Vec::new();
        header(501, data.len()).write(&mut buf);
        a.seal_gather(&mut buf, 0, &[&data[..10], &data[10..]]);
        let (_, p) = b.open(&mut buf).expect("gathered frame opens");
        assert_eq!(p, &data[..]);
    }
}

#[test]
fn a_peer_without_aes_and_one_preferring_it_agree_on_chacha20() {
    for (offer, supported) in [
        (&[CHACHA][..], &[AES, CHACHA][..]),
        (&[AES, CHACHA][..], &[CHACHA][..]),
    ] {
        let (i, t) = negotiate(offer, supported, Level::Encrypt);
        assert_eq!((i.keys.suite(), t.keys.suite()), (CHACHA, CHACHA));
        let (mut a, mut b) = protectors(offer, supported, Level::Encrypt);
        exchange(&mut a, &mut b, &[0, 9]);
    }
    // Each side preferring AES-256-GCM agrees on it.
    let (i, _) = negotiate(&[AES, CHACHA], &[AES, CHACHA], Level::Encrypt);
    assert_eq!(i.keys.suite(), AES);
}

/// A flipped bit in the header, the payload or the tag is rejected under
/// both suites, at levels `integrity` and `encrypt`, in place and out of
/// place; the real frame still opens afterwards.
#[test]
fn tampering_is_rejected_under_both_suites() {
    for suite in [AES, CHACHA] {
        for level in [Level::Integrity, Level::Encrypt] {
            let (mut a, mut b) = protectors(&[suite], &[suite], level);
            let data = payload(3, 200);
            let f = sealed(&mut a, 3, &data);
            let tag_at = f.len() - 16;
            // Header bits past the prefix (a changed prefix is another
            // frame kind or destination), payload bits, tag bits.
            for bit in [8 * 8, 12 * 8 + 3, 20 * 8 + 7, (HEADER_LEN - 1) * 8]
                .into_iter()
                .chain([HEADER_LEN * 8, (HEADER_LEN + 100) * 8 + 5])
                .chain([tag_at * 8, (f.len() - 1) * 8 + 7])
            {
                let mut g = f.clone();
                g[bit / 8] ^= 1 << (bit % 8);
                let mut dst = vec![0u8; data.len()];
                assert!(
                    b.verify_into(&g, &mut dst).is_err(),
                    "{suite} {level:?} bit {bit} out of place"
                );
                assert!(
                    b.open(&mut g).is_err(),
                    "{suite} {level:?} bit {bit} in place"
                );
            }
            let mut g = f.clone();
            let (_, p) = b.open(&mut g).expect("the real frame opens");
            assert_eq!(p, &data[..]);
        }
    }
}

/// Under AES-256-GCM the keys step through epochs (2^20 packets each,
/// [`Suite::rekey_interval`]) on both sides and in both directions.
#[test]
fn key_epochs_crossed_under_aes_gcm() {
    assert_eq!(AES.rekey_interval(), REKEY_INTERVAL);
    assert!(AES.rekey_interval() <= 1 << 23 >> 3, "1/8 of 2^23");
    let (mut a, mut b) = protectors(&[AES], &[AES], Level::Encrypt);
    let i = AES.rekey_interval();
    exchange(
        &mut a,
        &mut b,
        &[0, i - 2, i - 1, i, i + 1, 2 * i - 1, 2 * i, 4 * i + 3],
    );
    // A late frame of the previous epoch still opens; one two epochs
    // back does not.
    let old = sealed(&mut a, 5 * i - 1, b"old");
    let late = sealed(&mut a, 6 * i - 1, b"late");
    exchange(&mut a, &mut b, &[6 * i + 1]);
    let mut late = late;
    let (_, p) = b.open(&mut late).expect("previous epoch opens");
    assert_eq!(p, b"late");
    // (Far below the replay window too: refused before its key is
    // looked for; the aead module's tests cover the key itself.)
    assert!(b.open(&mut old.clone()).is_err());
}

/// A channel frame of version 1 is refused, with a message naming both
/// versions and what to do.
#[test]
fn a_version_1_frame_is_refused_with_the_message() {
    assert_eq!(VERSION, 3);
    for suite in [AES, CHACHA] {
        let (mut a, mut b) = protectors(&[suite], &[suite], Level::Encrypt);
        let mut f = sealed(&mut a, 1, b"from an older ethersan");
        f[1] = 1;
        let err = b.open(&mut f.clone()).map(|_| ()).unwrap_err();
        assert_eq!(err, FrameError::BadVersion(1));
        assert_eq!(
            err.to_string(),
            "peer speaks native transport version 1, this ethersan speaks 3: \
             run the same ethersan version on both ends"
        );
        let mut dst = [0u8; 64];
        assert_eq!(b.verify_into(&f, &mut dst), Err(FrameError::BadVersion(1)));
    }
}
