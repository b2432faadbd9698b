//! The native transport's handshake and discovery on arbitrary bytes:
//! never a panic, nothing answered that should not be. The whole input is
//! one frame for a target's `HELLO` and `HELLO_FINISH`, an initiator's
//! `HELLO_REPLY`, a discovery query (at the time the seed query was made,
//! so a valid one gets through to the catalog encoder) and reply, and the
//! catalog decoder; then the input read as a sequence of frames (selector,
//! 2-byte length, frame) drives one target and one initiator mid-way
//! through a real handshake, which must still complete and interoperate
//! (the target supporting both AEAD suites, or only one, picked by the
//! input's first byte: the two ends always agree on the suite).
#![no_main]

use std::time::{Duration, Instant};

use ethersan_channel::aead::Suite;
use ethersan_channel::discovery::{self, Catalog, CatalogLun, CatalogTarget, DiscoveryResponder};
use ethersan_channel::group::GroupKeys;
use ethersan_channel::handshake::{InitiatorHandshake, Responder, HELLO_REPLY_LEN};
use ethersan_channel::Level;
use libfuzzer_sys::fuzz_target;

// The same values as in crates/channel/tests/fuzz_seeds.rs.
const GROUP: &str = "fuzz";
const SECRET: &[u8] = b"fuzz group secret";
const SEED_TIME: u64 = 1_800_000_000_000;
const SEED_NONCE: [u8; 16] = *b"fuzz-query-nonce";
const TIMEOUT: Duration = Duration::from_secs(5);

fn catalog() -> Catalog {
    Catalog {
        server: "fuzz-server".into(),
        targets: (0..40)
            .map(|t| CatalogTarget {
                name: format!("iqn.2026-01.org.ethersan:t{t}"),
                alias: (t % 3 == 0).then(|| "alias".to_string()),
                luns: (0..t)
                    .map(|lun| CatalogLun {
                        lun,
                        blocks: 1 << 20,
                        block_size: 512,
                        level: Level::Encrypt,
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn check_keys(
    a: &mut ethersan_channel::aead::TrafficKeys,
    b: &mut ethersan_channel::aead::TrafficKeys,
) {
    let mut buf = *b"payload";
    let tag = a.seal(0, b"hdr", &mut buf);
    b.open(0, b"hdr", &mut buf, &tag)
        .expect("the two sides' keys agree");
    assert_eq!(&buf, b"payload");
}

fuzz_target!(|data: &[u8]| {
    let keys = GroupKeys::derive(GROUP, SECRET).expect("fuzz group");
    let now = Instant::now();

    let mut resp = Responder::new(keys.clone(), 4, TIMEOUT);
    if let Ok(out) = resp.handle_hello(now, data, 1, 1500) {
        assert_eq!(out.reply.len(), HELLO_REPLY_LEN);
        assert_eq!(resp.half_open(), 1);
    }
    let _ = resp.handle_finish(now, data);
    let mut init = InitiatorHandshake::new(&keys, 7, Level::Integrity, 1500).expect("initiator");
    assert!(
        init.handle_reply(data).is_err(),
        "a reply to a HELLO never sent"
    );

    let mut disc = DiscoveryResponder::new(keys.clone());
    if let Ok(frames) = disc.handle_query(data, SEED_TIME, &catalog(), 1500) {
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&data[8..24]);
        let mut parts = Vec::new();
        for f in &frames {
            assert!(f.len() <= 1500);
            parts.push(discovery::open_reply(&keys, &nonce, f).expect("our own reply opens"));
        }
        assert_eq!(discovery::assemble(parts).expect("parts join"), catalog());
        assert!(
            disc.handle_query(data, SEED_TIME, &catalog(), 1500)
                .is_err(),
            "replay"
        );
    }
    if let Ok(part) = discovery::open_reply(&keys, &SEED_NONCE, data) {
        assert!(part.index < part.count);
    }
    if let Ok(c) = Catalog::decode(data) {
        // One encoding per catalog.
        assert_eq!(c.encode().expect("decoded catalog encodes"), data);
    }

    // A real handshake with arbitrary frames in between.
    let supported: &[Suite] = match data.first().map(|b| b % 3) {
        Some(1) => &[Suite::ChaCha20Poly1305],
        Some(2) => &[Suite::Aes256Gcm],
        _ => &[Suite::Aes256Gcm, Suite::ChaCha20Poly1305],
    };
    let mut resp = Responder::new(keys.clone(), 2, TIMEOUT).with_suites(supported);
    let mut init = InitiatorHandshake::new(&keys, 7, Level::Encrypt, 1500).expect("initiator");
    let reply = resp
        .handle_hello(now, init.hello(), 9, 1500)
        .expect("real HELLO")
        .reply;
    let mut rest = data;
    let mut ids = 100;
    let mut reply_ok = true;
    for _ in 0..16 {
        let [sel, hi, lo, tail @ ..] = rest else {
            break;
        };
        let len = (usize::from(*hi) << 8 | usize::from(*lo)).min(tail.len());
        let (frame, tail) = tail.split_at(len);
        rest = tail;
        match sel % 4 {
            0 => {
                ids += 1;
                let _ = resp.handle_hello(now, frame, ids, 1500);
            }
            1 => {
                let _ = resp.handle_finish(now, frame);
            }
            2 => {
                if frame != reply.as_slice() && init.handle_reply(frame).is_ok() {
                    reply_ok = false;
                }
            }
            _ => {
                let _ = disc.handle_query(frame, SEED_TIME, &catalog(), 1500);
            }
        }
        assert!(resp.half_open() <= 2);
    }
    assert!(reply_ok, "a forged reply was accepted");
    // The real reply still completes the initiator; the target completes
    // unless an arbitrary frame evicted or ended its half-open handshake.
    let (finish, mut i) = init.handle_reply(&reply).expect("the real reply");
    assert!(supported.contains(&i.keys.suite()));
    if let Ok(mut t) = resp.handle_finish(now, &finish) {
        assert_eq!(i.keys.suite(), t.keys.suite());
        check_keys(&mut i.keys, &mut t.keys);
        check_keys(&mut t.keys, &mut i.keys);
    }
});
