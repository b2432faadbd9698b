//! The target's login negotiator fed arbitrary key texts for the security
//! and operational stages: never a panic; a finished negotiation has
//! values inside RFC 7143's ranges.
#![no_main]

use ethersan_proto::negotiate::{TargetNegotiator, TargetSettings};
use ethersan_proto::text::{parse_text, TextLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut neg = TargetNegotiator::new(TargetSettings::default());
    // Rounds separated by 0xff bytes; the first round is the security stage.
    for (i, round) in data.split(|b| *b == 0xff).take(8).enumerate() {
        let Ok(keys) = parse_text(round, &TextLimits::default()) else {
            return;
        };
        let r = if i == 0 { neg.security_keys(&keys).map(|_| ()) } else { neg.operational_keys(&keys).map(|_| ()) };
        if r.is_err() {
            return;
        }
    }
    if let Ok(p) = neg.finish() {
        assert!(p.max_burst_length >= 512 && p.max_burst_length < 1 << 24);
        assert!(p.first_burst_length <= p.max_burst_length);
        assert!(p.max_recv_data_segment_length >= 512);
    }
});
