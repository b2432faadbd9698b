//! A channel's receive side fed a peer's placed DATA frames and messages
//! in an order the input chooses, with duplicates, registrations aborted
//! and made again, and frames whose fields the input rewrites (CRC made
//! valid again: tag, offset, length, sequence number, flags). Never a
//! panic; placed data is never held by the channel (the memory it holds
//! stays within the window); bytes land only inside registered buffers;
//! and as long as no rewritten frame was accepted, what landed is the
//! data sent, and delivering the whole stream afterwards completes every
//! buffer that stayed registered and every message.
//!
//! Input: byte 0 picks the number of transfers, the next bytes their
//! sizes; the rest is a list of operations.
#![no_main]

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ethersan_channel::channel::{Channel, ChannelConfig, ChannelState, PlaceSlot, Placement};
use ethersan_channel::frame::{Header, HEADER_LEN};
use ethersan_channel::protect::Protector;
use libfuzzer_sys::fuzz_target;

const WINDOW: u32 = 64;
const MAX_MESSAGE: usize = 3000;

#[derive(Default)]
struct Table {
    bufs: HashMap<u32, (Vec<MaybeUninit<u8>>, Vec<bool>)>,
}

impl Placement for Table {
    fn slot(&mut self, tag: u32, offset: u64, len: usize) -> Option<PlaceSlot<'_>> {
        let (buf, landed) = self.bufs.get_mut(&tag)?;
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(len)?;
        if end > buf.len() {
            return None;
        }
        let fresh = !landed[start..end].iter().any(|l| *l);
        Some(PlaceSlot {
            dst: &mut buf[start..end],
            fresh,
        })
    }

    unsafe fn landed(&mut self, tag: u32, offset: u64, len: usize) {
        let (buf, landed) = self.bufs.get_mut(&tag).expect("landed in a registered buffer");
        let start = usize::try_from(offset).expect("offset");
        assert!(start + len <= buf.len(), "landed inside the buffer");
        landed[start..start + len].iter_mut().for_each(|l| *l = true);
    }
}

/// A buffer whose every byte has landed, as bytes (panics otherwise).
fn landed_bytes<'a>(buf: &'a [MaybeUninit<u8>], landed: &[bool]) -> &'a [u8] {
    assert!(landed.len() == buf.len() && landed.iter().all(|l| *l), "all landed");
    // SAFETY: every byte has landed: the channel wrote it (`landed`'s
    // contract) with a byte of a verified payload.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len()) }
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

fn data(tag: u32, len: usize) -> Bytes {
    (0..len).map(|j| (tag as usize * 31 + j * 7) as u8).collect()
}

fuzz_target!(|input: &[u8]| {
    let mut input = Input(input);
    let Some(n) = input.byte() else { return };
    let n = u32::from(n % 6) + 1;
    let mut transfers = Vec::new();
    for tag in 0..n {
        let len = usize::from(input.byte().unwrap_or(1)) * 13 + 1;
        transfers.push((tag, data(tag, len)));
    }
    let seq0 = if n % 2 == 0 { u32::MAX - 10 } else { 0 };
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
    let mut table = Table::default();
    for (tag, d) in &transfers {
        table.bufs.insert(
            *tag,
            (Box::<[u8]>::new_uninit_slice(d.len()).into_vec(), vec![false; d.len()]),
        );
        a.send_placed(*tag, 0, d.clone()).expect("placed");
        a.send_message(&tag.to_be_bytes()).expect("message");
    }
    let mut frames = Vec::new();
    let mut out = Vec::new();
    while a.poll_transmit(now, &mut out) {
        frames.push(out.clone());
    }
    assert!(!frames.is_empty());
    let bound = WINDOW as usize * b.max_payload() + MAX_MESSAGE;
    let mut aborted = vec![false; transfers.len()];
    let mut tainted = false;
    let mut delivered = 0u32;
    let mut pn = 1u64 << 40;
    for _ in 0..400 {
        let Some(op) = input.byte() else { break };
        let k = usize::from(input.byte().unwrap_or(0)) % frames.len();
        match op % 8 {
            0..=2 => {
                let _ = b.handle_frame_placing(now, &mut frames[k].clone(), &mut table);
            }
            3 => {
                let Ok(mut h) = Header::parse(&frames[k]) else {
                    continue;
                };
                let v = input.u32().unwrap_or(0);
                match input.byte().unwrap_or(0) % 6 {
                    0 => h.ack = v % (n + 2), // the tag
                    1 => h.sack = u64::from(v) % 4096, // the offset
                    2 => h.len = h.len.min(v as u16),
                    3 => h.seq = h.seq.wrapping_add(v % 8),
                    4 => h.flags = v as u8,
                    _ => h.sack = u64::MAX - u64::from(v % 64),
                }
                pn += 1;
                h.pn = pn;
                let mut f = Vec::new();
                h.write(&mut f);
                f.extend_from_slice(&frames[k][HEADER_LEN..HEADER_LEN + usize::from(h.len)]);
                Protector::crc_only().seal(&mut f);
                if b.handle_frame_placing(now, &mut f, &mut table).is_ok() {
                    tainted = true;
                }
            }
            4 => {
                // Abort a transfer (its buffer released).
                let t = k % transfers.len();
                table.bufs.remove(&(t as u32));
                aborted[t] = true;
            }
            5 => {
                while let Some(m) = b.recv_message() {
                    if !tainted {
                        assert_eq!(m, delivered.to_be_bytes(), "messages in order");
                        let t = delivered as usize;
                        // The ordering contract: the data sent before the
                        // message has landed.
                        if let Some((buf, landed)) = table.bufs.get(&delivered) {
                            if !aborted[t] {
                                assert!(landed.iter().all(|l| *l), "landed before message {t}");
                                assert_eq!(landed_bytes(buf, landed), &transfers[t].1[..]);
                            }
                        }
                    }
                    delivered += 1;
                }
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
                let mut f = frames[k].clone();
                let at = usize::from(input.byte().unwrap_or(0)) % f.len();
                f[at] ^= 1 << (input.byte().unwrap_or(0) % 8);
                assert!(b.handle_frame_placing(now, &mut f, &mut table).is_err());
            }
        }
        assert!(b.recv_buffered() <= bound, "{} > {bound}", b.recv_buffered());
    }
    if tainted || b.state() != ChannelState::Open {
        return;
    }
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
        b.handle_frame_placing(now, &mut g, &mut table)
            .expect("a retransmission");
    }
    while b.recv_message().is_some() {
        delivered += 1;
    }
    assert_eq!(delivered, n);
    for (t, (tag, d)) in transfers.iter().enumerate() {
        if aborted[t] {
            continue;
        }
        let (buf, landed) = &table.bufs[tag];
        assert!(landed.iter().all(|l| *l), "transfer {t} complete");
        assert_eq!(landed_bytes(buf, landed), &d[..], "transfer {t} intact");
    }
});
