//! Two channels over the simulated network of `common`: lossless and lossy
//! transfers in both directions, a dead peer, flow control, sequence
//! wraparound and the closing exchange.

mod common;

use std::time::{Duration, Instant};

use common::{LinkConfig, Sim, Workload};
use ethersan_channel::channel::{Channel, ChannelConfig, ChannelState, FailReason};
use ethersan_channel::protect::Protector;

const MIB: usize = 1 << 20;

/// `bytes` each way, in messages of 1 byte to 1 MiB.
fn mixed(bytes: u64) -> Workload {
    both_ways([bytes, bytes])
}

/// `bytes[i]` from side `i`, in messages of 1 byte to 1 MiB.
fn both_ways(bytes: [u64; 2]) -> Workload {
    Workload {
        bytes,
        min: 1,
        max: MIB,
        buffer: 4 * MIB,
    }
}

#[test]
fn lossless_both_directions() {
    let cfg = ChannelConfig::default();
    let initial = cfg.initial_cwnd;
    let link = LinkConfig {
        rate: None,
        ..LinkConfig::lan()
    };
    let mut sim = Sim::new(1, cfg, link, mixed(20 << 20));
    sim.run(Duration::from_secs(60));
    // Let the last acknowledgements arrive.
    sim.run_until(Duration::from_millis(50), |_| false);
    for i in 0..2 {
        let s = sim.channel(i).stats();
        assert_eq!(s.retransmits, 0, "side {i}: {s:#?}");
        assert_eq!(s.timeouts, 0, "side {i}: {s:#?}");
        assert_eq!(s.rejected, 0, "side {i}: {s:#?}");
        assert!(s.cwnd > initial, "side {i}: cwnd did not grow: {s:#?}");
        assert!(s.srtt.is_some());
        assert_eq!(s.in_flight, 0);
        assert_eq!(sim.channel(i).send_buffered(), 0);
    }
    eprintln!(
        "lossless 2x20 MiB in {:?} virtual: {:#?}",
        sim.elapsed(),
        sim.channel(0).stats()
    );
}

/// A 1 Gbit/s link with a 1 ms drop-tail queue and no other fault: the
/// congestion window finds the rate, losing few frames to the queue.
#[test]
fn congestion_control_fills_a_shallow_queue() {
    let link = LinkConfig {
        queue: Duration::from_millis(1),
        ..LinkConfig::lan()
    };
    let mut sim = Sim::new(2, ChannelConfig::default(), link, mixed(50_000_000));
    sim.run(Duration::from_secs(60));
    let secs = sim.elapsed().as_secs_f64();
    let rate = sim.received_bytes(1) as f64 / secs;
    for i in 0..2 {
        let s = sim.channel(i).stats();
        eprintln!("side {i}: {s:#?}");
        assert!(
            (s.retransmits as f64) < 0.02 * s.frames_sent as f64,
            "side {i}: {s:#?}"
        );
    }
    eprintln!(
        "shallow queue: {:.1} MB/s each way over a 125 MB/s link, {:#?}",
        rate / 1e6,
        sim.link_stats
    );
    assert!(rate > 0.7 * 125e6, "goodput {rate} B/s");
}

/// Drop-tail queues from shallow to deep, both directions busy (the
/// acknowledgements wait behind data): slow start overshoots, a deep
/// queue delays acknowledgements past the RTO; every transfer completes
/// with few frames sent twice. (A 4 ms queue once stalled recovery at one
/// frame per timeout.)
#[test]
fn shallow_and_deep_queues() {
    for ms in [1, 4, 20, 1000] {
        let link = LinkConfig {
            queue: Duration::from_millis(ms),
            ..LinkConfig::lan()
        };
        let mut sim = Sim::new(1, ChannelConfig::default(), link, mixed(20 << 20));
        sim.run(Duration::from_secs(60));
        assert!(
            sim.elapsed() < Duration::from_secs(1),
            "{ms} ms: {:?}",
            sim.elapsed()
        );
        for i in 0..2 {
            let s = sim.channel(i).stats();
            assert!(
                (s.retransmits as f64) < 0.06 * s.frames_sent as f64,
                "{ms} ms, side {i}: {s:#?}"
            );
        }
    }
}

#[test]
fn lossy_both_directions() {
    let mut sim = Sim::new(
        7,
        ChannelConfig::default(),
        LinkConfig::lossy(),
        mixed(50_000_000),
    );
    sim.run(Duration::from_secs(600));
    let mut rejected = 0;
    for i in 0..2 {
        let s = sim.channel(i).stats();
        assert!(s.retransmits > 0, "side {i}: {s:#?}");
        assert!(s.fast_retransmits > 0, "side {i}: {s:#?}");
        assert!(s.messages_received > 100);
        rejected += s.rejected;
        eprintln!("side {i}: {s:#?}");
    }
    let corrupted: u64 = sim.link_stats.iter().map(|l| l.corrupted).sum();
    assert!(corrupted > 0);
    assert!(
        rejected >= corrupted,
        "{rejected} rejected, {corrupted} corrupted"
    );
    eprintln!(
        "lossy 2x50 MB in {:?} virtual: {:#?}",
        sim.elapsed(),
        sim.link_stats
    );
}

#[test]
fn lossy_small_messages_and_empty_ones() {
    let w = Workload {
        bytes: [3_000_000, 3_000_000],
        min: 0,
        max: 4000,
        buffer: 256 << 10,
    };
    let mut sim = Sim::new(11, ChannelConfig::default(), LinkConfig::lossy(), w);
    sim.run(Duration::from_secs(600));
}

#[test]
fn heavy_loss_and_jumbo_frames() {
    let cfg = ChannelConfig {
        max_frame: 9000,
        ..ChannelConfig::default()
    };
    let link = LinkConfig {
        loss: 0.05,
        reorder: 0.05,
        duplicate: 0.01,
        corrupt: 0.01,
        ..LinkConfig::lan()
    };
    let mut sim = Sim::new(3, cfg, link, mixed(20 << 20));
    sim.run(Duration::from_secs(600));
    for i in 0..2 {
        eprintln!(
            "side {i} after {:?}: {:#?}",
            sim.elapsed(),
            sim.channel(i).stats()
        );
    }
    // Losses at the tail of a burst used to wait for the retransmission
    // timeout (1 and 3 of them here); the loss timer of the reordering
    // window now finds them (no timeout, 263 ms instead of 464 ms).
    assert!(sim.channel(0).stats().retransmits > 0);
}

#[test]
fn sequence_numbers_wrap() {
    let cfg = ChannelConfig {
        initial_seq: u32::MAX - 500,
        ..ChannelConfig::default()
    };
    let mut sim = Sim::new(5, cfg, LinkConfig::lossy(), mixed(8 << 20));
    sim.run(Duration::from_secs(600));
    // 8 MiB is well over 501 frames each way: both sequences wrapped.
    for i in 0..2 {
        assert!(sim.channel(i).stats().frames_sent > 6000);
    }
}

#[test]
fn dead_peer_fails_the_channel() {
    let cfg = ChannelConfig::default();
    let dead_after = cfg.dead_after;
    let mut sim = Sim::new(9, cfg.clone(), LinkConfig::lan(), mixed(1 << 20));
    // Let the transfer start, then side 1 goes silent.
    sim.run_until(Duration::from_secs(1), |s| s.received_bytes(1) > 100_000);
    sim.blackhole[1] = true;
    let silent_from = sim.now;
    let failed = sim.run_until(Duration::from_secs(60), |s| {
        s.channel(0).state() == ChannelState::Failed(FailReason::Timeout)
    });
    assert!(failed, "{:?}", sim.channel(0).state());
    let took = sim.now - silent_from;
    assert!(took >= dead_after - cfg.max_rto, "failed after {took:?}");
    assert!(took <= dead_after + cfg.max_rto, "failed after {took:?}");
    let s = sim.channel(0).stats();
    assert!(s.timeouts >= 3, "{s:#?}");
    assert_eq!(sim.channel(0).poll_timeout(), None);
    assert!(sim.channel_mut(0).send_message(b"x").is_err());
}

#[test]
fn a_receiver_that_does_not_drain_bounds_the_sender() {
    let cfg = ChannelConfig {
        recv_window: 64,
        ..ChannelConfig::default()
    };
    let w = Workload {
        bytes: [40 << 20, 0],
        min: 1000,
        max: 64 << 10,
        buffer: 8 * MIB,
    };
    let mut sim = Sim::new(13, cfg.clone(), LinkConfig::lan(), w);
    sim.set_drain(1, false);
    // Stall for longer than dead_after: the peer keeps answering with a
    // zero window, so the sender waits instead of failing.
    let stall = cfg.dead_after * 2;
    sim.run_until(stall, |_| false);
    let payload = sim.channel(0).max_payload();
    let held = sim.channel(1).recv_buffered();
    // At most the window plus the one message being reassembled.
    assert!(
        held <= 64 * payload + (64 << 10),
        "receiver holds {held} bytes"
    );
    assert!(held >= 32 * payload, "receiver holds only {held} bytes");
    assert_eq!(sim.channel(0).state(), ChannelState::Open);
    let s = sim.channel(0).stats();
    assert_eq!(s.peer_credit, 0, "{s:#?}");
    assert!(sim.channel(0).send_buffered() > MIB);
    // A bounded number of probes while stalled.
    assert!(s.frames_sent < 2000, "{s:#?}");
    // Drain: everything arrives.
    sim.set_drain(1, true);
    sim.run(Duration::from_secs(600));
    eprintln!("{:#?}", sim.channel(0).stats());
}

#[test]
fn close_after_the_data() {
    let w = Workload {
        bytes: [2 << 20, 1 << 20],
        min: 1,
        max: 256 << 10,
        buffer: 4 * MIB,
    };
    let mut sim = Sim::new(17, ChannelConfig::default(), LinkConfig::lossy(), w);
    // Queue everything, then close side 0 at once: its data still goes.
    sim.run_until(Duration::from_secs(1), |s| {
        s.channel(0).send_buffered() >= 2 << 20 || s.done()
    });
    sim.channel_mut(0).close();
    assert_eq!(sim.channel(0).state(), ChannelState::Closing);
    assert!(sim.channel_mut(0).send_message(b"late").is_err());
    let closed = sim.run_until(Duration::from_secs(60), |s| {
        s.channel(0).state() == ChannelState::Closed && s.channel(1).state() == ChannelState::Closed
    });
    assert!(
        closed,
        "{:?} {:?}",
        sim.channel(0).state(),
        sim.channel(1).state()
    );
    assert!(sim.sent_bytes(0) >= 2 << 20);
    assert_eq!(sim.received_bytes(1), sim.sent_bytes(0));
    assert_eq!(sim.channel(0).poll_timeout(), None);
}

#[test]
fn close_survives_a_lost_reply() {
    let now = Instant::now();
    let cfg = ChannelConfig::default();
    let mut a = Channel::new(cfg.clone(), 1, 2, Protector::crc_only(), now);
    let mut b = Channel::new(cfg.clone(), 2, 1, Protector::crc_only(), now);
    let mut out = Vec::new();
    a.close();
    assert!(a.poll_transmit(now, &mut out));
    b.handle_frame(now, &mut out.clone()).expect("CLOSE");
    assert_eq!(b.state(), ChannelState::Closed);
    assert!(b.poll_transmit(now, &mut out));
    // The reply is lost; a resends CLOSE when its timer runs out.
    assert!(!b.poll_transmit(now, &mut out));
    let t = a.poll_timeout().expect("close timer");
    a.handle_timeout(t);
    assert!(a.poll_transmit(t, &mut out));
    b.handle_frame(t, &mut out.clone()).expect("CLOSE again");
    assert!(b.poll_transmit(t, &mut out));
    a.handle_frame(t, &mut out.clone()).expect("reply");
    assert_eq!(a.state(), ChannelState::Closed);
    assert!(!a.poll_transmit(t, &mut out));
}

#[test]
fn unanswered_close_ends_closed() {
    let now = Instant::now();
    let cfg = ChannelConfig::default();
    let mut a = Channel::new(cfg.clone(), 1, 2, Protector::crc_only(), now);
    let mut out = Vec::new();
    a.close();
    let mut t = now;
    let mut sent = 0;
    while a.state() == ChannelState::Closing {
        while a.poll_transmit(t, &mut out) {
            sent += 1;
        }
        t = a.poll_timeout().expect("timer");
        a.handle_timeout(t);
    }
    assert_eq!(a.state(), ChannelState::Closed);
    assert!(t - now >= cfg.dead_after);
    assert!(sent < 40, "{sent} CLOSE frames");
}

/// Closing over a link that loses a fifth of the frames: the peer's
/// channel ends within a round trip or two of the close in nearly every
/// run, without waiting for a retransmission timeout, and always far
/// below `dead_after` (CLOSE goes out as a burst, then on the RTO timer).
#[test]
fn a_close_reaches_the_peer_soon_through_loss() {
    let cfg = ChannelConfig::default();
    let link = LinkConfig {
        loss: 0.2,
        ..LinkConfig::lan()
    };
    let mut before_rto = 0;
    let mut slowest = Duration::ZERO;
    let runs = 40;
    for seed in 0..runs {
        let mut sim = Sim::new(100 + seed, cfg.clone(), link.clone(), mixed(64 << 10));
        let quiet = sim.run_until(Duration::from_secs(60), |s| {
            s.done() && s.channel(0).send_buffered() == 0
        });
        assert!(quiet, "seed {seed}");
        let rto = sim.channel(0).stats().rto;
        sim.channel_mut(0).close();
        let from = sim.elapsed();
        let closed = sim.run_until(Duration::from_secs(60), |s| {
            s.channel(1).state() == ChannelState::Closed
        });
        assert!(closed, "seed {seed}: {:?}", sim.channel(1).state());
        let took = sim.elapsed() - from;
        slowest = slowest.max(took);
        if took < rto {
            before_rto += 1;
        }
    }
    eprintln!("{before_rto}/{runs} closed before an RTO; slowest {slowest:?}");
    // Every copy of the burst is lost in 0.2³ of the runs (one CLOSE at
    // a time: 0.2 of them, 37 of these 40).
    assert!(before_rto >= runs - 1, "{before_rto}/{runs}");
    assert!(slowest < cfg.dead_after / 10, "slowest {slowest:?}");
}

/// A link that delays 3% of the frames by 20–320 µs, less than one round
/// trip (400 µs of propagation alone), and loses none (a queue too deep to
/// overflow): every retransmission is spurious. Once the reordering window
/// has adapted (the first half of the transfer), there are none.
#[test]
fn reordering_within_a_round_trip_causes_no_retransmission() {
    let link = LinkConfig {
        latency: Duration::from_micros(200),
        queue: Duration::from_secs(1),
        reorder: 0.03,
        ..LinkConfig::lan()
    };
    let w = both_ways([40 << 20, 0]);
    let mut sim = Sim::new(21, ChannelConfig::default(), link, w);
    sim.run_until(Duration::from_secs(60), |s| s.received_bytes(1) >= 20 << 20);
    let half = sim.channel(0).stats();
    sim.run(Duration::from_secs(60));
    let s = sim.channel(0).stats();
    let l = &sim.link_stats;
    eprintln!("first half: {half:#?}\nend: {s:#?}\nlinks: {l:#?}");
    assert_eq!(
        l[0].lost + l[0].queue_drops + l[1].lost + l[1].queue_drops,
        0
    );
    assert!(l[0].reordered > 500, "{l:#?}");
    assert_eq!(s.retransmits, half.retransmits, "second half: {s:#?}");
    assert!(s.reorder_window > Duration::ZERO);
}

/// Acknowledgements held back for 1.5 RTO (a delay spike, nothing lost):
/// the timeout fires, sends the oldest frame again and collapses the
/// window; the acknowledgements that then arrive cover the originals, so
/// the timeout is found spurious and undone: the window goes back to what
/// was in flight.
#[test]
fn a_delay_spike_longer_than_the_rto_is_undone() {
    let link = LinkConfig {
        queue: Duration::from_secs(1),
        ..LinkConfig::lan()
    };
    let w = both_ways([40 << 20, 0]);
    let mut sim = Sim::new(23, ChannelConfig::default(), link, w);
    sim.run_until(Duration::from_secs(60), |s| s.received_bytes(1) >= 10 << 20);
    let before = sim.channel(0).stats();
    let end = sim.now + before.rto * 3 / 2;
    sim.hold_until[1] = Some(end);
    let timed_out = sim.run_until(Duration::from_secs(10), |s| {
        s.channel(0).stats().timeouts > 0
    });
    assert!(timed_out);
    let at_timeout = sim.channel(0).stats();
    assert!(at_timeout.cwnd <= 2, "{at_timeout:#?}");
    sim.run_until(Duration::from_secs(10), |s| {
        s.now >= end + Duration::from_millis(1)
    });
    let s = sim.channel(0).stats();
    eprintln!("before: {before:#?}\nafter: {s:#?}");
    assert_eq!((s.timeouts, s.spurious_timeouts, s.undos), (1, 1, 1));
    assert!(
        s.cwnd >= before.in_flight.min(before.cwnd) * 3 / 4,
        "{s:#?}"
    );
    assert_eq!(s.retransmits, 1);
    sim.run(Duration::from_secs(60));
}
