//! CHAP (RFC 7143 §12.1.3, RFC 1994) through the target's
//! `TargetChap::on_keys`, one-way and mutual, against an honest
//! `InitiatorChap` whose messages the input may replace or amend: never a
//! panic; the target never accepts a name or response other than the right
//! ones; its mutual answer is the right response to the initiator's
//! challenge; and an exchange nobody tampered with succeeds on both sides.
//!
//! Input: one mode byte (bit 0: the initiator asks for mutual CHAP; bit 1:
//! the target has mutual credentials), then rounds separated by 0xff bytes.
//! An empty round sends the honest initiator's keys; a round starting with
//! 0xfe sends the honest keys with the round's key text (NUL-separated
//! `key=value`) overriding or adding keys; any other round is sent as key
//! text instead of the honest keys.
#![no_main]

use ethersan_proto::chap::{
    decode_binary, Algorithm, Credentials, InitiatorChap, TargetChap, CHALLENGE_LEN,
};
use ethersan_proto::text::{parse_text, TextLimits};
use libfuzzer_sys::fuzz_target;

/// The identifier and challenge the target sends.
const TARGET_ID: u8 = 0x5a;
const TARGET_CHALLENGE: [u8; CHALLENGE_LEN] = [0x11; CHALLENGE_LEN];
/// The identifier and challenge the initiator sends (mutual CHAP).
const INITIATOR_ID: u8 = 0xa5;
const INITIATOR_CHALLENGE: [u8; CHALLENGE_LEN] = [0x22; CHALLENGE_LEN];

fn get<'a>(keys: &'a [(String, String)], k: &str) -> Option<&'a str> {
    keys.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let asks_mutual = mode & 1 != 0;
    let target_has_mutual = mode & 2 != 0;
    let user = Credentials::new("iqn.2026-11.org.ethersan:fuzz", b"initiator-secret-1").unwrap();
    let target_creds =
        Credentials::new("iqn.2026-11.org.ethersan:target", b"target-secret-12").unwrap();
    let mut target = TargetChap::new(
        user.clone(),
        target_has_mutual.then(|| target_creds.clone()),
        TARGET_ID,
        TARGET_CHALLENGE,
    );
    let mut initiator = InitiatorChap::new(
        user.clone(),
        asks_mutual.then(|| target_creds.clone()),
        INITIATOR_ID,
        INITIATOR_CHALLENGE,
    );

    let limits = TextLimits::default();
    // What the honest initiator sends next, and whether anyone tampered.
    let mut honest = initiator.start();
    let mut tampered = false;
    let mut algorithm: Option<Algorithm> = None;
    let mut failed = false;
    for round in rest.split(|b| *b == 0xff).take(6) {
        let keys = if round.is_empty() {
            honest.clone()
        } else if let Some(extra) = round.strip_prefix(&[0xfe]) {
            let Ok(extra) = parse_text(extra, &limits) else {
                return;
            };
            tampered = true;
            let mut keys = honest.clone();
            for (k, v) in extra {
                match keys.iter_mut().find(|(n, _)| *n == k) {
                    Some(slot) => slot.1 = v,
                    None => keys.push((k, v)),
                }
            }
            keys
        } else {
            let Ok(keys) = parse_text(round, &limits) else {
                return;
            };
            tampered = true;
            keys
        };
        let was_done = target.is_done();
        let answer = match target.on_keys(&keys) {
            Ok(a) => a,
            Err(_) => {
                failed = true;
                break;
            }
        };
        if was_done {
            assert!(answer.is_empty(), "a finished exchange answered {answer:?}");
            continue;
        }
        if algorithm.is_none() {
            // The first answer: the algorithm, identifier and challenge.
            let a = get(&answer, "CHAP_A").expect("the target names its algorithm");
            let alg = Algorithm::from_number(a).expect("an algorithm the target knows");
            assert_eq!(get(&answer, "CHAP_I"), Some(TARGET_ID.to_string().as_str()));
            assert!(!target.is_done());
            algorithm = Some(alg);
        } else if target.is_done() {
            // Accepted: the name and response must be the right ones.
            let alg = algorithm.expect("chosen");
            assert_eq!(get(&keys, "CHAP_N"), Some(user.user.as_str()));
            let r = decode_binary(get(&keys, "CHAP_R").expect("CHAP_R"), alg.len(), "CHAP_R")
                .expect("an accepted response decodes");
            assert_eq!(
                r,
                alg.response(TARGET_ID, &user.secret, &TARGET_CHALLENGE),
                "the target accepted a wrong response"
            );
            // Mutual: the target answers the initiator's challenge, right.
            match (get(&keys, "CHAP_I"), get(&keys, "CHAP_C")) {
                (Some(i), Some(c)) => {
                    assert!(target_has_mutual, "mutual answered without credentials");
                    let id: u8 = i.trim().parse().expect("an accepted CHAP_I");
                    let c = decode_binary(c, 1024, "CHAP_C").expect("an accepted CHAP_C");
                    assert_ne!(c, TARGET_CHALLENGE, "a reflected challenge was answered");
                    assert_eq!(get(&answer, "CHAP_N"), Some(target_creds.user.as_str()));
                    let tr = decode_binary(
                        get(&answer, "CHAP_R").expect("the target's CHAP_R"),
                        alg.len(),
                        "CHAP_R",
                    )
                    .expect("the target's response decodes");
                    assert_eq!(tr, alg.response(id, &target_creds.secret, &c));
                }
                _ => assert!(answer.is_empty(), "one-way CHAP answered {answer:?}"),
            }
        } else {
            panic!("the target answered {answer:?} without finishing");
        }
        // The honest initiator's next keys, from the target's answer.
        match initiator.on_keys(&answer) {
            Ok(next) => honest = next,
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    // Nobody tampered and enough rounds were run: both sides are done,
    // unless mutual CHAP was asked of a target without credentials.
    let rounds = rest.split(|b| *b == 0xff).take(6).count();
    if !tampered && rounds >= 2 {
        if asks_mutual && !target_has_mutual {
            assert!(failed && !target.is_done(), "mutual CHAP without credentials");
        } else {
            assert!(!failed && target.is_done() && initiator.is_done());
        }
    }
});
