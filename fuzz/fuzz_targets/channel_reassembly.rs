//! A channel's receive side fed a peer's DATA frames in an order the input
//! chooses, with duplicates, and with frames whose fields the input
//! rewrites (CRC made valid again). Never a panic; the memory held stays
//! within the window; and as long as no rewritten frame was accepted, the
//! messages delivered are exactly the ones sent, in order, and delivering
//! the whole stream afterwards completes it.
//!
//! Input: byte 0 picks the number of messages, the next bytes their sizes;
//! the rest is a list of operations (deliver frame k, deliver a rewritten
//! frame k, drain messages, send acknowledgements back, advance time).
#![no_main]

use std::time::{Duration, Instant};

use ethersan_channel::channel::{Channel, ChannelConfig, ChannelState};
use ethersan_channel::frame::{Header, HEADER_LEN};
use ethersan_channel::protect::Protector;
use libfuzzer_sys::fuzz_target;

const MAX_MESSAGE: usize = 3000;
const WINDOW: u32 = 64;

fn message(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 131 + j * 7) as u8).collect()
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes([
            self.byte()?,
            self.byte()?,
            self.byte()?,
            self.byte()?,
        ]))
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let Some(n) = input.byte() else { return };
    let n = usize::from(n % 12) + 1;
    let mut msgs = Vec::new();
    for i in 0..n {
        let len = usize::from(input.byte().unwrap_or(1)) * 11;
        msgs.push(message(i, len.min(MAX_MESSAGE)));
    }
    let seq0 = if n % 3 == 0 { u32::MAX - 20 } else { 0 };
    let cfg = ChannelConfig {
        max_frame: 100,
        initial_cwnd: 4096,
        max_cwnd: 4096,
        recv_window: WINDOW,
        max_message: MAX_MESSAGE,
        initial_seq: seq0,
        ..ChannelConfig::default()
    };
    let mut now = Instant::now();
    let mut a = Channel::new(
        ChannelConfig {
            recv_window: 4096,
            ..cfg.clone()
        },
        1,
        2,
        Protector::crc_only(),
        now,
    );
    let mut b = Channel::new(cfg, 2, 1, Protector::crc_only(), now);
    for m in &msgs {
        a.send_message(m).expect("send");
    }
    let mut frames = Vec::new();
    let mut out = Vec::new();
    while a.poll_transmit(now, &mut out) {
        frames.push(out.clone());
    }
    assert!(!frames.is_empty());
    let bound = WINDOW as usize * b.max_payload() + MAX_MESSAGE;

    let mut delivered = 0usize;
    let mut tainted = false;
    let check = |b: &mut Channel, tainted: bool, delivered: &mut usize| {
        while let Some(m) = b.recv_message() {
            assert!(m.len() <= MAX_MESSAGE);
            if !tainted {
                assert_eq!(Some(&m), msgs.get(*delivered), "message {delivered}");
            }
            *delivered += 1;
        }
    };
    let mut pn = 1u64 << 40;
    for _ in 0..400 {
        let Some(op) = input.byte() else { break };
        let k = usize::from(input.byte().unwrap_or(0)) % frames.len();
        match op % 8 {
            0..=2 => {
                let _ = b.handle_frame(now, &mut frames[k].clone());
            }
            3 => {
                // Rewrite a field, keep the CRC valid.
                let Ok(mut h) = Header::parse(&frames[k]) else {
                    continue;
                };
                let v = input.u32().unwrap_or(0);
                match input.byte().unwrap_or(0) % 7 {
                    0 => h.seq = h.seq.wrapping_add(v % 8),
                    1 => h.frag = v as u16,
                    2 => h.flags = v as u8,
                    3 => h.seq = v,
                    4 => h.len = h.len.min(v as u16),
                    5 => h.credit = v,
                    _ => h.sack = u64::from(v) << 32 | u64::from(v),
                }
                pn += 1;
                h.pn = pn;
                let mut f = Vec::new();
                h.write(&mut f);
                f.extend_from_slice(&frames[k][HEADER_LEN..HEADER_LEN + usize::from(h.len)]);
                Protector::crc_only().seal(&mut f);
                if b.handle_frame(now, &mut f).is_ok() {
                    tainted = true;
                }
            }
            4 => check(&mut b, tainted, &mut delivered),
            5 => {
                while b.poll_transmit(now, &mut out) {
                    let _ = a.handle_frame(now, &mut out);
                }
            }
            6 => {
                now += Duration::from_millis(u64::from(input.byte().unwrap_or(0)));
                b.handle_timeout(now);
                a.handle_timeout(now);
            }
            _ => {
                // A corrupted copy: always rejected.
                let mut f = frames[k].clone();
                let at = usize::from(input.byte().unwrap_or(0)) % f.len();
                f[at] ^= 1 << (input.byte().unwrap_or(0) % 8);
                assert!(b.handle_frame(now, &mut f).is_err());
            }
        }
        assert!(
            b.recv_buffered() <= bound,
            "{} > {bound}",
            b.recv_buffered()
        );
    }
    check(&mut b, tainted, &mut delivered);
    if tainted || b.state() != ChannelState::Open {
        return;
    }
    // The whole stream in order, as retransmissions (new packet numbers: a
    // frame dropped beyond the window was still recorded as seen), and
    // everything has arrived.
    for f in &frames {
        let Ok(mut h) = Header::parse(f) else {
            continue;
        };
        pn += 1;
        h.pn = pn;
        let mut g = Vec::new();
        h.write(&mut g);
        g.extend_from_slice(&f[HEADER_LEN..HEADER_LEN + usize::from(h.len)]);
        Protector::crc_only().seal(&mut g);
        b.handle_frame(now, &mut g).expect("a retransmission");
        check(&mut b, false, &mut delivered);
    }
    assert_eq!(delivered, msgs.len());
});
