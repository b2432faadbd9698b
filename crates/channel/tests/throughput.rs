//! How fast the channel itself is: two channels joined back to back (every
//! frame handed over at once, no loss), one core, level `none`. Ignored by
//! default; run with
//! `cargo test -p ethersan-channel --release --test throughput -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use ethersan_channel::channel::{Channel, ChannelConfig};
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
