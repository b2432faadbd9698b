//! The key=value text parser and the Continue-bit assembler on arbitrary
//! bytes: never a panic, limits always hold.
#![no_main]

use ethersan_proto::text::{encode_text, parse_text, TextAssembler, TextLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = TextLimits::default();
    if let Ok(pairs) = parse_text(data, &limits) {
        assert!(pairs.len() <= limits.max_pairs);
        for (k, v) in &pairs {
            assert!(k.len() <= limits.max_key_len && v.len() <= limits.max_value_len);
        }
        // What parsed re-encodes to text that parses to the same pairs.
        let text = encode_text(&pairs);
        assert_eq!(parse_text(&text, &limits).expect("re-encoded text parses"), pairs);
    }
    // The same bytes split into Continue-bit pieces at the positions the
    // first byte chooses.
    let step = usize::from(data.first().copied().unwrap_or(1)).max(1);
    let mut asm = TextAssembler::new(8192);
    let chunks: Vec<&[u8]> = data.chunks(step).collect();
    for (i, c) in chunks.iter().enumerate() {
        match asm.push(c, i + 1 < chunks.len()) {
            Ok(Some(whole)) => assert!(whole.len() <= 8192),
            Ok(None) => {}
            Err(_) => break,
        }
    }
});
