//! Unit tests of the channel: sequence comparison, loss recovery,
//! timeouts and delayed acknowledgements.

use super::*;

const MS: Duration = Duration::from_millis(1);

#[test]
fn sequence_comparison_wraps() {
    assert!(seq_lt(1, 2));
    assert!(!seq_lt(2, 1));
    assert!(!seq_lt(5, 5));
    assert!(seq_lt(u32::MAX, 0));
    assert!(seq_lt(u32::MAX - 10, 5));
    assert!(!seq_lt(5, u32::MAX - 10));
}

fn pair(now: Instant) -> (Channel, Channel) {
    let cfg = ChannelConfig {
        max_frame: 100,
        initial_cwnd: 16,
        ..ChannelConfig::default()
    };
    let a = Channel::new(cfg.clone(), 1, 2, Protector::crc_only(), now);
    let b = Channel::new(cfg, 2, 1, Protector::crc_only(), now);
    (a, b)
}

fn flight(ch: &mut Channel, now: Instant) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let mut out = Vec::new();
    while ch.poll_transmit(now, &mut out) {
        frames.push(out.clone());
    }
    frames
}

/// Delivers `frames` to `to`, and everything `to` answers back to
/// `from`.
fn exchange(from: &mut Channel, to: &mut Channel, frames: Vec<Vec<u8>>, now: Instant) {
    for mut f in frames {
        to.handle_frame(now, &mut f).expect("valid frame");
    }
    let mut answers = flight(to, now);
    let mut now = now;
    if answers.is_empty() {
        now += to.cfg.ack_delay;
        to.handle_timeout(now);
        answers = flight(to, now);
    }
    for mut f in answers {
        from.handle_frame(now, &mut f).expect("valid answer");
    }
}

#[test]
fn a_lost_frame_is_retransmitted_after_three_later_ones_and_halves_cwnd() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(t0);
    a.send_message(&[1; 600]).expect("send"); // 11 frames of 56 bytes
    let mut frames = flight(&mut a, t0);
    assert_eq!(frames.len(), 11);
    assert_eq!(a.stats().in_flight, 11);
    let lost = frames.remove(2);
    let t1 = t0 + MS;
    exchange(&mut a, &mut b, frames, t1);
    let s = a.stats();
    assert_eq!(s.fast_retransmits, 1);
    // The acknowledgement grew the window from 16 to 26 (slow start,
    // 10 frames) before its SACK showed the loss: halved to 13.
    assert_eq!(s.cwnd, 13);
    assert_eq!(s.ssthresh, 13);
    assert_eq!(s.in_flight, 0);
    assert!(s.srtt.is_some());
    // The retransmission: same sequence number, new packet number.
    let rtx = flight(&mut a, t1);
    assert_eq!(rtx.len(), 1);
    let (h0, h1) = (
        Header::parse(&lost).expect("header"),
        Header::parse(&rtx[0]).expect("header"),
    );
    assert_eq!((h1.seq, h1.frag), (h0.seq, h0.frag));
    assert_eq!(h1.pn, 11);
    assert_eq!(a.stats().retransmits, 1);
    exchange(&mut a, &mut b, rtx, t1 + MS);
    assert_eq!(b.recv_message().map(|m| m.len()), Some(600));
    assert_eq!(a.send_buffered(), 0);
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn timeout_collapses_the_window_and_backs_off() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(t0);
    a.send_message(&[1; 300]).expect("send");
    let frames = flight(&mut a, t0);
    exchange(&mut a, &mut b, frames, t0 + MS);
    let srtt = a.stats().srtt.expect("sample");
    assert_eq!(srtt, MS);
    a.send_message(&[2; 300]).expect("send");
    let _lost = flight(&mut a, t0 + 2 * MS);
    let rto = a.stats().rto;
    let deadline = a.poll_timeout().expect("rto armed");
    assert_eq!(deadline, t0 + 2 * MS + rto);
    a.handle_timeout(deadline);
    let s = a.stats();
    assert_eq!((s.timeouts, s.cwnd), (1, MIN_CWND));
    assert_eq!(s.rto, (rto - a.cfg.ack_delay) * 2 + a.cfg.ack_delay);
    // The oldest frame goes again; when it is acknowledged, the others
    // are lost by the time threshold and follow. None is an RTT sample
    // (Karn).
    let rtx = flight(&mut a, deadline);
    assert_eq!(rtx.len(), 1);
    let mut t = deadline;
    let mut rtx = rtx;
    while a.send_buffered() > 0 {
        t += 50 * MS;
        exchange(&mut a, &mut b, rtx, t);
        rtx = flight(&mut a, t);
        assert!(!rtx.is_empty() || a.send_buffered() == 0);
    }
    assert_eq!(a.stats().srtt, Some(srtt));
    assert_eq!(a.stats().retransmits, 6);
    assert_eq!(a.stats().timeouts, 1);
    assert!(a.stats().cwnd > MIN_CWND);
}

#[test]
fn acknowledgements_are_delayed_then_sent() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(t0);
    a.send_message(&[1; 10]).expect("send");
    let frames = flight(&mut a, t0);
    for mut f in frames {
        b.handle_frame(t0, &mut f).expect("valid");
    }
    // One in-order frame: the ACK waits for ack_delay.
    assert!(flight(&mut b, t0).is_empty());
    let t = b.poll_timeout().expect("delayed ack");
    assert_eq!(t, t0 + b.cfg.ack_delay);
    b.handle_timeout(t);
    let acks = flight(&mut b, t);
    assert_eq!(acks.len(), 1);
    assert_eq!(b.stats().acks_sent, 1);
    // A reply piggybacks the acknowledgement instead.
    a.send_message(&[2; 200]).expect("send"); // 4 frames: ack_every
    let frames = flight(&mut a, t);
    for mut f in frames {
        b.handle_frame(t, &mut f).expect("valid");
    }
    b.send_message(b"reply").expect("send");
    let out = flight(&mut b, t);
    assert_eq!(out.len(), 1);
    let h = Header::parse(&out[0]).expect("header");
    assert_eq!((h.kind, h.ack), (Kind::Data, 5));
    assert_eq!(b.stats().acks_sent, 1);
}

/// Sends a first message for an RTT sample, then a second one whose
/// frames are held back: the timeout fires and sends the oldest again.
/// Returns the held frames, the retransmission, when it went and the
/// stats before the timeout.
fn time_out_a_flight(
    a: &mut Channel,
    b: &mut Channel,
    t0: Instant,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, Instant, ChannelStats) {
    a.send_message(&[1; 300]).expect("send");
    let frames = flight(a, t0);
    exchange(a, b, frames, t0 + MS);
    a.send_message(&[2; 300]).expect("send"); // 6 frames
    let held = flight(a, t0 + 2 * MS);
    let before = a.stats();
    let deadline = a.poll_timeout().expect("rto armed");
    a.handle_timeout(deadline);
    assert_eq!((a.stats().timeouts, a.stats().cwnd), (1, MIN_CWND));
    let rtx = flight(a, deadline);
    assert_eq!(rtx.len(), 1);
    (held, rtx, deadline, before)
}

#[test]
fn a_spurious_timeout_is_undone() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(t0);
    let (held, rtx, deadline, before) = time_out_a_flight(&mut a, &mut b, t0);
    // The originals were only late: their acknowledgement covers the
    // frame after the one sent again, cumulatively.
    let t = deadline + 10 * MS;
    exchange(&mut a, &mut b, held, t);
    let s = a.stats();
    assert_eq!((s.spurious_timeouts, s.undos), (1, 1));
    // Back to what was in flight (6 frames), not above.
    assert_eq!(before.in_flight, 6);
    assert_eq!(s.cwnd, 6);
    // The timeout's ssthresh (half the window) stays: slow start to it.
    assert_eq!(s.ssthresh, before.cwnd / 2);
    assert_eq!(a.send_buffered(), 0);
    // The retransmission arriving as a duplicate changes nothing.
    exchange(&mut a, &mut b, rtx, t + MS);
    assert_eq!(a.stats().cwnd, s.cwnd);
    assert_eq!(a.stats().retransmits, 1);
    assert_eq!(b.recv_message().map(|m| m.len()), Some(300));
    assert_eq!(b.recv_message().map(|m| m.len()), Some(300));
}

#[test]
fn a_real_loss_after_a_timeout_is_not_undone() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(t0);
    let (_lost, rtx, deadline, before) = time_out_a_flight(&mut a, &mut b, t0);
    // Only the retransmissions arrive.
    let mut t = deadline;
    let mut rtx = rtx;
    while a.send_buffered() > 0 {
        t += MS;
        exchange(&mut a, &mut b, rtx, t);
        rtx = flight(&mut a, t);
        assert!(!rtx.is_empty() || a.send_buffered() == 0);
    }
    let s = a.stats();
    assert_eq!((s.spurious_timeouts, s.spurious_losses, s.undos), (0, 0, 0));
    assert_eq!(s.retransmits, 6);
    // Slow start from the timeout's window, by one per retransmission.
    assert_eq!((s.cwnd, s.ssthresh), (MIN_CWND + 6, before.cwnd / 2));
    assert_eq!(b.recv_message().map(|m| m.len()), Some(300));
    assert_eq!(b.recv_message().map(|m| m.len()), Some(300));
}

#[test]
fn a_timeout_after_losses_is_not_undone() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(t0);
    a.send_message(&[1; 600]).expect("send"); // 11 frames
    let mut frames = flight(&mut a, t0);
    frames.remove(2);
    let t1 = t0 + MS;
    exchange(&mut a, &mut b, frames, t1);
    assert_eq!(a.stats().fast_retransmits, 1);
    // The retransmission is lost too: the timeout follows a real loss.
    let _lost = flight(&mut a, t1);
    let deadline = a.poll_timeout().expect("rto armed");
    a.handle_timeout(deadline);
    let rtx = flight(&mut a, deadline);
    assert_eq!(rtx.len(), 1);
    exchange(&mut a, &mut b, rtx, deadline + MS);
    let s = a.stats();
    assert_eq!((s.timeouts, s.undos), (1, 0));
    assert_eq!(a.send_buffered(), 0);
}

#[test]
fn a_frame_overtaken_is_reordering_and_the_packet_threshold_stops() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(t0);
    a.send_message(&[0; 50]).expect("send");
    let frames = flight(&mut a, t0);
    let mut t = t0 + MS;
    exchange(&mut a, &mut b, frames, t);
    // Frame 2 overtaken by frame 3 only: no loss declared, but seen.
    a.send_message(&[1; 200]).expect("send"); // 4 frames
    let mut frames = flight(&mut a, t);
    frames.swap(1, 2);
    t += MS;
    for f in frames {
        exchange(&mut a, &mut b, vec![f], t);
    }
    assert_eq!(a.stats().fast_retransmits, 0);
    // Now a frame overtaken by eight later ones (more than the packet
    // threshold, less than the time threshold) is not declared lost.
    a.send_message(&[2; 600]).expect("send"); // 11 frames
    let mut frames = flight(&mut a, t);
    let late = frames.remove(2);
    t += MS;
    exchange(&mut a, &mut b, frames, t);
    assert_eq!(a.stats().fast_retransmits, 0);
    assert!(flight(&mut a, t).is_empty());
    // The loss timer is armed for it.
    assert!(a.poll_timeout().is_some_and(|d| d < t + a.stats().rto));
    exchange(&mut a, &mut b, vec![late], t + MS / 10);
    let s = a.stats();
    assert_eq!((s.retransmits, s.fast_retransmits), (0, 0));
    assert_eq!(a.send_buffered(), 0);
    assert!(s.reorder_window >= s.srtt.expect("srtt") / 8);
}

#[test]
fn a_spurious_fast_retransmit_is_undone() {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(t0);
    a.send_message(&[1; 600]).expect("send"); // 11 frames
    let mut frames = flight(&mut a, t0);
    let late = frames.remove(2);
    let t1 = t0 + MS;
    exchange(&mut a, &mut b, frames, t1);
    let s = a.stats();
    assert_eq!((s.fast_retransmits, s.cwnd, s.ssthresh), (1, 13, 13));
    // The frame declared lost arrives before its retransmission went.
    exchange(&mut a, &mut b, vec![late], t1 + MS / 10);
    let s = a.stats();
    assert_eq!((s.spurious_losses, s.undos), (1, 1));
    assert_eq!((s.cwnd, s.ssthresh), (26, u32::MAX));
    assert!(flight(&mut a, t1 + MS).is_empty());
    assert_eq!(a.stats().retransmits, 0);
    assert_eq!(b.recv_message().map(|m| m.len()), Some(600));
}

/// A gathered frame (header in `out`, payload as slices) is byte for byte
/// the frame copied whole, for messages spanning parts and placed data,
/// where the protection leaves payloads as they are; where it does not
/// (a CRC trailer), nothing is gathered.
#[test]
fn gathered_frames_equal_copied_frames() {
    let t0 = Instant::now();
    let cfg = ChannelConfig {
        max_frame: 100,
        initial_cwnd: 64,
        ..ChannelConfig::default()
    };
    for plain in [true, false] {
        let protector = || {
            if plain {
                Protector::crc_only().medium_checksum()
            } else {
                Protector::crc_only()
            }
        };
        let mut copied = Channel::new(cfg.clone(), 1, 2, protector(), t0);
        let mut gathered = Channel::new(cfg.clone(), 1, 2, protector(), t0);
        for ch in [&mut copied, &mut gathered] {
            let parts = [
                Bytes::from(vec![7u8; 30]),
                Bytes::from((0..=255u8).collect::<Vec<u8>>()),
                Bytes::from(vec![9u8; 5]),
            ];
            ch.send_parts(parts.to_vec()).expect("send");
            ch.send_placed(5, 1000, Bytes::from((0..150u8).collect::<Vec<u8>>()))
                .expect("send placed");
        }
        let mut a = Vec::new();
        let mut b = Vec::new();
        let mut payload = Vec::new();
        let mut frames = 0;
        let mut gathered_any = false;
        while copied.poll_transmit_after(t0, &mut a, 14) {
            assert!(gathered.poll_transmit_gather(t0, &mut b, 14, &mut payload));
            gathered_any |= !payload.is_empty();
            for p in payload.drain(..) {
                b.extend_from_slice(&p);
            }
            assert_eq!(a, b, "frame {frames}");
            frames += 1;
        }
        assert!(!gathered.poll_transmit_gather(t0, &mut b, 14, &mut payload));
        assert!(frames > 5, "{frames} frames");
        assert_eq!(gathered_any, plain);
        assert_eq!(copied.stats().bytes_sent, gathered.stats().bytes_sent);
    }
}
