//! The native transport's frame decoder on arbitrary bytes: never a panic.
//! The input is parsed as a prefix and a channel header, opened by a
//! CRC32C protector (as is, and again after its CRC is made valid, so the
//! length checks and the replay window are reached), and handed to a
//! channel with data of its own in flight. The same bytes are checked as
//! a stateless RESET: accepted only when they are exactly what the group's
//! key writes for the id they name, and a RESET built for that id from
//! the input's length is never longer than the input.
#![no_main]

use std::sync::OnceLock;
use std::time::Instant;

use ethersan_channel::channel::{Channel, ChannelConfig};
use ethersan_channel::frame::{Header, Prefix, HEADER_LEN};
use ethersan_channel::group::GroupKeys;
use ethersan_channel::protect::Protector;
use ethersan_channel::reset;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let prefix = Prefix::parse(data);
    let header = Header::parse(data);
    if let Ok(h) = header {
        assert!(prefix.is_ok());
        assert!(h.kind.is_channel());
        let mut again = Vec::new();
        h.write(&mut again);
        assert_eq!(&again[..], &data[..HEADER_LEN]);
    }

    let mut p = Protector::crc_only();
    let mut frame = data.to_vec();
    if let Ok((h, payload)) = p.open(&mut frame) {
        assert_eq!(payload.len(), usize::from(h.len));
    }
    // The same bytes with a valid CRC where the header says it goes.
    let mut frame = data.to_vec();
    if let Ok(h) = header {
        let end = HEADER_LEN + usize::from(h.len);
        if end <= frame.len() {
            frame.truncate(end);
            let mut p = Protector::crc_only();
            p.seal(&mut frame);
            let mut second = frame.clone();
            match p.open(&mut frame) {
                Ok((h2, payload)) => {
                    assert_eq!(h2, h);
                    assert_eq!(payload.len(), usize::from(h.len));
                    assert!(p.open(&mut second).is_err(), "replay accepted");
                }
                Err(e) => panic!("a frame sealed for this protector failed: {e}"),
            }
        }
    }

    static KEYS: OnceLock<GroupKeys> = OnceLock::new();
    let keys = KEYS.get_or_init(|| GroupKeys::derive("fuzz", b"a fuzzing secret").expect("keys"));
    if let Some(id) = reset::check(keys, data) {
        let mut again = Vec::new();
        assert!(reset::write(keys, id, data.len(), &mut again));
        assert_eq!(&again[..], &data[..reset::RESET_LEN]);
    }
    if let Ok(p) = prefix {
        let mut r = Vec::new();
        if reset::write(keys, p.dst, data.len(), &mut r) {
            assert!(r.len() <= data.len());
            assert_eq!(reset::check(keys, &r), Some(p.dst));
        } else {
            assert!(r.is_empty());
        }
    }

    let now = Instant::now();
    let mut ch = Channel::new(ChannelConfig::default(), 1, 2, Protector::crc_only(), now);
    ch.send_message(&[1; 5000]).expect("send");
    let mut out = Vec::new();
    while ch.poll_transmit(now, &mut out) {}
    let _ = ch.handle_frame(now, &mut data.to_vec());
    let _ = ch.handle_frame(now, &mut frame);
    while ch.poll_transmit(now, &mut out) {}
    while ch.recv_message().is_some() {}
});
