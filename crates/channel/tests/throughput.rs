//! How fast the channel itself is: two channels joined back to back (every
//! frame handed over at once, no loss), one core, level `none`. Ignored by
//! default; run with
//! `cargo test -p ethersan-channel --release --test throughput -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ethersan_channel::channel::{Channel, ChannelConfig, PlaceSlot, Placement};
use ethersan_channel::protect::Protector;

fn transfer(total: usize, msg_len: usize, max_frame: usize) {
    let start = Instant::now();
    let mut now = start;
    let cfg = ChannelConfig {
        max_frame,
        ..ChannelConfig::default()
    };
    let mut a = Channel::new(cfg.clone(), 1, 2, Protector::crc_only(), now);
    let mut b = Channel::new(cfg, 2, 1, Protector::crc_only(), now);
    let msg = vec![0x5A; msg_len];
    let (mut sent, mut received) = (0usize, 0usize);
    let mut out = Vec::new();
    let mut frames = 0u64;
    while received < total {
        while sent < total && a.send_buffered() < 4 << 20 {
            a.send_message(&msg).expect("send");
            sent += msg_len;
        }
        while a.poll_transmit(now, &mut out) {
            frames += 1;
            b.handle_frame(now, &mut out).expect("frame a->b");
        }
        while let Some(m) = b.recv_message() {
            received += m.len();
        }
        while b.poll_transmit(now, &mut out) {
            a.handle_frame(now, &mut out).expect("frame b->a");
        }
        now += Duration::from_micros(10);
        a.handle_timeout(now);
        b.handle_timeout(now);
    }
    let secs = start.elapsed().as_secs_f64();
    let s = a.stats();
    eprintln!(
        "{} MiB in messages of {msg_len} B, max_frame {max_frame}: {:.0} MB/s, {:.0} frames/s, \
         {:.1} frames per message, {} acks, {} retransmits",
        total >> 20,
        total as f64 / secs / 1e6,
        frames as f64 / secs,
        frames as f64 / (total / msg_len) as f64,
        b.stats().acks_sent,
        s.retransmits
    );
    assert_eq!(s.retransmits, 0);
}

#[test]
#[ignore]
fn jumbo_only() {
    transfer(1 << 30, 256 << 10, 9000);
}

#[test]
#[ignore]
fn one_gib_back_to_back() {
    transfer(1 << 30, 256 << 10, 1500);
    transfer(1 << 30, 256 << 10, 9000);
    transfer(256 << 20, 8 << 10, 1500);
    transfer(64 << 20, 100, 1500);
}

/// One registered buffer that every placed frame lands in.
struct OneBuffer(Vec<std::mem::MaybeUninit<u8>>, u64);

impl Placement for OneBuffer {
    fn slot(&mut self, _tag: u32, offset: u64, len: usize) -> Option<PlaceSlot<'_>> {
        let start = offset as usize;
        let dst = self.0.get_mut(start..start + len)?;
        Some(PlaceSlot { dst, fresh: true })
    }
    unsafe fn landed(&mut self, _tag: u32, _offset: u64, len: usize) {
        self.1 += len as u64;
    }
}

/// [`transfer`] with placed data: `chunk`-byte transfers placed into one
/// registered buffer, each followed by a 48-byte message (a response).
fn placed(total: usize, chunk: usize, max_frame: usize) {
    let start = Instant::now();
    let mut now = start;
    let cfg = ChannelConfig {
        max_frame,
        ..ChannelConfig::default()
    };
    let mut a = Channel::new(cfg.clone(), 1, 2, Protector::crc_only(), now);
    let mut b = Channel::new(cfg, 2, 1, Protector::crc_only(), now);
    let data = Bytes::from(vec![0x5A; chunk]);
    let mut table = OneBuffer(Box::<[u8]>::new_uninit_slice(chunk).into_vec(), 0);
    let (mut sent, mut responses) = (0usize, 0usize);
    let mut out = Vec::new();
    let mut frames = 0u64;
    while responses < total / chunk {
        while sent < total && a.send_buffered() < 4 << 20 {
            a.send_placed(7, 0, data.clone()).expect("placed");
            a.send_message(&[0; 48]).expect("send");
            sent += chunk;
        }
        while a.poll_transmit(now, &mut out) {
            frames += 1;
            b.handle_frame_placing(now, &mut out, &mut table)
                .expect("frame a->b");
        }
        while b.recv_message().is_some() {
            responses += 1;
        }
        while b.poll_transmit(now, &mut out) {
            a.handle_frame(now, &mut out).expect("frame b->a");
        }
        now += Duration::from_micros(10);
        a.handle_timeout(now);
        b.handle_timeout(now);
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "{} MiB placed in {chunk} B transfers, max_frame {max_frame}: {:.0} MB/s, {:.0} frames/s",
        total >> 20,
        total as f64 / secs / 1e6,
        frames as f64 / secs,
    );
    assert_eq!(table.1, total as u64);
    assert_eq!(a.stats().retransmits, 0);
}

#[test]
#[ignore]
fn placed_back_to_back() {
    placed(1 << 30, 256 << 10, 1500);
    placed(1 << 30, 256 << 10, 9000);
}
