//! Placed data in the sans-I/O channel (docs/native-transport.md §Placed
//! data), on a virtual clock: frames delivered out of order, lost and
//! retransmitted into the same range, a transfer aborted mid-way, a frame
//! beyond its buffer; a message sent after placed data is delivered only
//! once that data has landed; and the encrypted level verifies straight
//! into the buffer while a forged frame cannot spoil landed bytes.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ethersan_channel::aead::TrafficKeys;
use ethersan_channel::channel::{Channel, ChannelConfig, ChannelState, PlaceSlot, Placement};
use ethersan_channel::frame::{Header, HEADER_LEN};
use ethersan_channel::protect::Protector;
use ethersan_channel::Level;

const MS: Duration = Duration::from_millis(1);

/// A test's registered buffers: data, and landed byte count per tag
/// (counting every landing, to see that each byte lands once).
#[derive(Default)]
struct Table {
    bufs: HashMap<u32, (Vec<MaybeUninit<u8>>, Vec<bool>)>,
    landings: u64,
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
        if let Some((_, landed)) = self.bufs.get_mut(&tag) {
            let start = offset as usize;
            landed[start..start + len]
                .iter_mut()
                .for_each(|l| *l = true);
            self.landings += 1;
        }
    }
}

impl Table {
    fn expect(&mut self, tag: u32, len: usize) {
        self.bufs
            .insert(tag, (vec![MaybeUninit::new(0); len], vec![false; len]));
    }
    /// The buffer of `tag` as bytes.
    fn data(&self, tag: u32) -> &[u8] {
        let buf = &self.bufs[&tag].0;
        // SAFETY: the buffer was made of initialised zeros and the channel
        // only ever writes bytes (frame payloads) into it.
        unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len()) }
    }
    fn complete(&self, tag: u32) -> bool {
        self.bufs
            .get(&tag)
            .is_some_and(|(_, l)| l.iter().all(|x| *x))
    }
}

fn cfg() -> ChannelConfig {
    ChannelConfig {
        max_frame: 140,
        initial_cwnd: 64,
        ..ChannelConfig::default()
    }
}

fn keys(initiator: bool) -> TrafficKeys {
    let (a, b) = ([7u8; 32], [9u8; 32]);
    if initiator {
        TrafficKeys::new(a, b)
    } else {
        TrafficKeys::new(b, a)
    }
}

fn pair(level: Level, now: Instant) -> (Channel, Channel) {
    let (pa, pb) = match level {
        Level::None => (Protector::crc_only(), Protector::crc_only()),
        _ => (
            Protector::new(level, Some(keys(true))).unwrap(),
            Protector::new(level, Some(keys(false))).unwrap(),
        ),
    };
    (
        Channel::new(cfg(), 1, 2, pa, now),
        Channel::new(cfg(), 2, 1, pb, now),
    )
}

fn flight(ch: &mut Channel, now: Instant) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let mut out = Vec::new();
    while ch.poll_transmit(now, &mut out) {
        frames.push(out.clone());
    }
    frames
}

fn pattern(len: usize) -> Bytes {
    (0..len).map(|i| (i * 13 + i / 7) as u8).collect()
}

fn acks_back(from: &mut Channel, to: &mut Channel, now: Instant) {
    let now = now + from_cfg_delay();
    to.handle_timeout(now);
    for mut f in flight(to, now) {
        let _ = from.handle_frame(now, &mut f);
    }
}

fn from_cfg_delay() -> Duration {
    ChannelConfig::default().ack_delay
}

#[test]
fn placed_frames_land_out_of_order_and_a_retransmission_overwrites_the_same_range() {
    for level in [Level::None, Level::Integrity, Level::Encrypt] {
        let t0 = Instant::now();
        let (mut a, mut b) = pair(level, t0);
        let data = pattern(2000);
        let mut table = Table::default();
        table.expect(77, 2000);
        a.send_placed(77, 0, data.clone()).unwrap();
        a.send_message(b"after").unwrap();
        let mut frames = flight(&mut a, t0);
        let payload = a.max_payload();
        assert_eq!(frames.len(), 2000_usize.div_ceil(payload) + 1, "{level}");
        let last_msg = frames.pop().unwrap();
        // Frame 1 is lost; the rest arrive backwards, then the message.
        let lost = frames.remove(1);
        let t1 = t0 + MS;
        for f in frames.iter().rev() {
            b.handle_frame_placing(t1, &mut f.clone(), &mut table)
                .expect("valid");
        }
        b.handle_frame_placing(t1, &mut last_msg.clone(), &mut table)
            .expect("valid");
        assert!(b.recv_message().is_none(), "the message waits for the gap");
        assert!(!table.complete(77));
        // The SACKs make the sender resend the lost frame: same sequence
        // number, new packet number, same range.
        acks_back(&mut a, &mut b, t1);
        let rtx = flight(&mut a, t1 + 2 * MS);
        assert!(!rtx.is_empty(), "{level}: a retransmission");
        let (h0, h1) = (
            Header::parse(&lost).unwrap(),
            Header::parse(&rtx[0]).unwrap(),
        );
        assert_eq!((h0.seq, h0.placement()), (h1.seq, h1.placement()));
        assert_ne!(h0.pn, h1.pn);
        let t2 = t1 + 3 * MS;
        for f in rtx {
            b.handle_frame_placing(t2, &mut f.clone(), &mut table)
                .expect("valid");
        }
        // The original arrives late: a duplicate, not landed again.
        b.handle_frame_placing(t2, &mut lost.clone(), &mut table)
            .expect("valid");
        assert!(table.complete(77), "{level}");
        assert_eq!(table.data(77), &data[..], "{level}: bytes intact");
        assert_eq!(b.recv_message().as_deref(), Some(&b"after"[..]));
        let s = b.stats();
        let frames_placed = 2000_usize.div_ceil(payload) as u64;
        assert_eq!(s.placed_received, frames_placed, "{level}: each once");
        assert_eq!(table.landings, frames_placed);
        assert_eq!(s.placed_dropped, 0);
        assert_eq!(s.recv_held, 0, "placed data is never held");
        assert_eq!(a.stats().placed_sent, frames_placed);
    }
}

#[test]
fn an_aborted_transfer_drops_late_frames_counts_them_and_the_channel_goes_on() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(Level::Encrypt, t0);
    let mut table = Table::default();
    table.expect(5, 3000);
    a.send_placed(5, 0, pattern(3000)).unwrap();
    let frames = flight(&mut a, t0);
    let half = frames.len() / 2;
    for f in &frames[..half] {
        b.handle_frame_placing(t0, &mut f.clone(), &mut table)
            .expect("valid");
    }
    // Aborted: the buffer is released; the rest arrives for nobody.
    let (buf, _) = table.bufs.remove(&5).expect("registered");
    assert_eq!(buf.len(), 3000);
    for f in &frames[half..] {
        b.handle_frame_placing(t0, &mut f.clone(), &mut table)
            .expect("a late frame is valid, dropped");
    }
    let s = b.stats();
    assert_eq!(s.placed_received, half as u64);
    assert_eq!(s.placed_dropped, (frames.len() - half) as u64);
    // Acknowledged all the same: nothing is sent again.
    acks_back(&mut a, &mut b, t0 + MS);
    assert_eq!(a.stats().in_flight, 0);
    assert_eq!(a.send_buffered(), 0);
    // The channel is healthy: a message goes through.
    a.send_message(b"next").unwrap();
    for mut f in flight(&mut a, t0 + 2 * MS) {
        b.handle_frame_placing(t0 + 2 * MS, &mut f, &mut table)
            .expect("valid");
    }
    assert_eq!(b.recv_message().as_deref(), Some(&b"next"[..]));
    assert_eq!(b.state(), ChannelState::Open);
}

#[test]
fn a_placed_frame_beyond_its_buffer_is_dropped_and_counted() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(Level::None, t0);
    let mut table = Table::default();
    table.expect(1, 100);
    // 80 bytes at offset 50 of a 100-byte buffer: one frame, too far.
    a.send_placed(1, 50, pattern(80)).unwrap();
    a.send_message(b"m").unwrap();
    for mut f in flight(&mut a, t0) {
        b.handle_frame_placing(t0, &mut f, &mut table)
            .expect("valid");
    }
    assert_eq!(b.stats().placed_dropped, 1);
    assert_eq!(table.landings, 0);
    assert!(table.data(1).iter().all(|x| *x == 0));
    assert_eq!(b.recv_message().as_deref(), Some(&b"m"[..]));
    // Without a table (plain handle_frame) every placed frame is dropped.
    a.send_placed(1, 0, pattern(10)).unwrap();
    for mut f in flight(&mut a, t0) {
        b.handle_frame(t0, &mut f).expect("valid");
    }
    assert_eq!(b.stats().placed_dropped, 2);
}

#[test]
fn a_forged_placed_frame_is_rejected_and_spoils_no_landed_byte() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(Level::Encrypt, t0);
    let mut table = Table::default();
    table.expect(3, 200);
    let data = pattern(200);
    a.send_placed(3, 0, data.clone()).unwrap();
    let frames = flight(&mut a, t0);
    for f in &frames {
        b.handle_frame_placing(t0, &mut f.clone(), &mut table)
            .expect("valid");
    }
    assert_eq!(table.data(3), &data[..]);
    // A copy of frame 0 with a flipped ciphertext bit and a fresh packet
    // number, as a retransmission would be: rejected, bytes untouched.
    let mut forged = frames[0].clone();
    forged[HEADER_LEN + 3] ^= 1;
    forged[15] ^= 0x40;
    assert!(b.handle_frame_placing(t0, &mut forged, &mut table).is_err());
    assert_eq!(table.data(3), &data[..], "landed bytes intact");
    assert_eq!(b.stats().rejected, 1);
}

#[test]
fn a_message_of_many_parts_arrives_whole() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(Level::Encrypt, t0);
    let parts: Vec<Bytes> = (0..20).map(|i| pattern(i * 17 + 1)).collect();
    let whole: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    a.send_parts(parts).unwrap();
    a.send_parts(Vec::new()).unwrap();
    for mut f in flight(&mut a, t0) {
        b.handle_frame(t0, &mut f).expect("valid");
    }
    assert_eq!(b.recv_message(), Some(whole));
    assert_eq!(b.recv_message(), Some(Vec::new()));
}
