//! The AoE codec, target and initiator on arbitrary frames: never a panic.
//! The whole input is one frame for the decoder, a fresh target and an
//! initiator waiting for an answer; then the input read as a sequence of
//! length-prefixed frames drives one target (so MAC mask, reserve and
//! config state carry over between frames). I/O requests are completed
//! with fake data, successes and failures alternating, and every reply
//! must be a padded response.
#![no_main]

use std::time::Instant;

use ethersan_aoe::initiator::{AtaRequest, TargetInfo};
use ethersan_aoe::{
    decode, Action, AoeTarget, DeviceAddr, DeviceConfig, Header, Initiator, InitiatorConfig,
    IoFailure, IoOp, Mac, TargetConfig,
};
use libfuzzer_sys::fuzz_target;

const TMAC: Mac = Mac([2, 0, 0, 0, 0, 0x10]);

fn target() -> AoeTarget {
    let mut t = AoeTarget::new(TargetConfig::new(TMAC, 9000));
    t.add_device(DeviceAddr::new(1, 0), DeviceConfig::new(64))
        .expect("device 1.0");
    let ro = DeviceConfig {
        read_only: true,
        config_string: b"fuzz".to_vec(),
        ..DeviceConfig::new(8)
    };
    t.add_device(DeviceAddr::new(1, 1), ro).expect("device 1.1");
    t
}

fn check_reply(f: &[u8]) {
    assert!(f.len() >= 60, "reply not padded: {} bytes", f.len());
    let h = Header::decode(f).expect("a reply has a header");
    assert!(h.response, "a reply is a response");
    assert_eq!(h.src, TMAC);
}

fn feed(t: &mut AoeTarget, frame: &[u8], n: usize) {
    match t.handle(frame) {
        Action::Drop(_) => {}
        Action::Reply(frames) => frames.iter().for_each(|f| check_reply(f)),
        Action::Io(io) => {
            let mut out = Vec::new();
            if let IoOp::Write { data, .. } = &io.op {
                assert!(data.end <= frame.len(), "write data outside the frame");
            }
            io.pending.prepare_read(&mut out).fill(0x5A);
            let result = match n % 4 {
                0 | 1 => Ok(()),
                2 => Err(IoFailure::Medium),
                _ => Err(IoFailure::Unavailable),
            };
            io.pending.complete(result, &mut out);
            check_reply(&out);
        }
    }
    while t.poll_event().is_some() {}
}

fuzz_target!(|data: &[u8]| {
    let _ = decode(data);
    feed(&mut target(), data, 0);

    let info = TargetInfo {
        mac: TMAC,
        shelf: 1,
        slot: 0,
        buffer_count: 8,
        max_sectors: 17,
        firmware_version: 1,
        aoe_version: 1,
        config: Vec::new(),
    };
    let mut init = Initiator::new(
        InitiatorConfig {
            mtu: 9000,
            ..InitiatorConfig::new(Mac([2, 0, 0, 0, 0, 1]))
        },
        info,
    );
    let now = Instant::now();
    init.submit(AtaRequest::Identify).expect("identify");
    init.submit(AtaRequest::Read { lba: 0, sectors: 2 })
        .expect("read");
    while init.poll_transmit(now).is_some() {}
    if let Some(c) = init.on_frame(data, now) {
        if let Ok(reply) = c.result {
            assert!(reply.data.end <= data.len(), "reply data outside the frame");
        }
    }

    let mut t = target();
    let mut rest = data;
    for n in 0..16 {
        let [hi, lo, tail @ ..] = rest else { break };
        let len = (usize::from(*hi) << 8 | usize::from(*lo)).min(tail.len());
        let (frame, tail) = tail.split_at(len);
        feed(&mut t, frame, n);
        rest = tail;
    }
});
