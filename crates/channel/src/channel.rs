//! One channel of the native transport (docs/native-transport.md §Frames,
//! §Reliability): an ordered, reliable stream of messages over datagrams
//! that may be lost, duplicated, reordered or corrupted. No I/O and no
//! clock: the endpoint feeds received frames ([`Channel::handle_frame`]) and
//! the time, and takes back frames to send ([`Channel::poll_transmit`]),
//! messages received ([`Channel::recv_message`]) and the next deadline
//! ([`Channel::poll_timeout`], then [`Channel::handle_timeout`]). After any
//! call, the endpoint drains `poll_transmit` and re-reads `poll_timeout`.
//!
//! # Sending
//!
//! A message is split into fragments of at most `max_frame` minus header
//! and trailer bytes, each taking the next 32-bit sequence number (compared
//! modulo 2^32, so the sequence wraps freely); fragments carry their index
//! in the message and the last one the `LAST` flag. An empty message is one
//! empty `LAST` fragment. Every frame sent, retransmissions included, gets
//! the next 64-bit packet number, never reused (it is the AEAD nonce).
//!
//! What may be sent is bounded twice. The congestion window `cwnd` (in
//! frames) bounds the frames in flight (sent, not acknowledged, not
//! selectively acknowledged, not declared lost: RFC 6675's "pipe"); the
//! peer's credit bounds the sequence numbers: new data only below the
//! peer's `ack + credit`. Retransmissions go first, then new data, then a
//! pending ACK or CLOSE.
//!
//! Congestion control is NewReno in frames: slow start (`cwnd` + 1 per
//! frame acknowledged) up to `ssthresh`, then additive increase (+ 1 per
//! window acknowledged); a loss found by fast retransmit halves `cwnd`
//! (once per window: losses among frames sent before the reduction do not
//! reduce it again, nor do their acknowledgements grow it); a
//! retransmission timeout sets `ssthresh` to half and `cwnd` to 2.
//!
//! # Loss detection
//!
//! Every transmission gets a local transmission index. A frame is declared
//! lost when a frame transmitted after it has been acknowledged
//! (cumulatively or selectively) and it was transmitted at least three
//! transmissions or 9/8 of the smoothed RTT before that one: QUIC's packet
//! and time thresholds, which treat a retransmission like any new frame,
//! so a lost retransmission is found the same way. An acknowledgement of a
//! frame sent twice is taken to answer the latest transmission (when it
//! answered the first, frames sent in between may be declared lost early
//! and sent twice; the other guess can stall a burst loss at one
//! retransmission per timeout).
//!
//! The retransmission timer runs while frames are in flight, restarted by
//! every acknowledgement that makes progress. It expires after the RTO of
//! an [`RttEstimator`] (Jacobson/Karels, RFC 6298) plus the peer's
//! acknowledgement delay, doubles the RTO until the next sample, and sends
//! the oldest frame in flight again, beyond the window if need be. The
//! other frames stay in flight: once the retransmission is acknowledged,
//! the thresholds above declare lost those still unacknowledged (QUIC's
//! probe timeout), so a spurious timeout costs one frame, not a window. A
//! second timeout without progress declares every frame in flight lost.
//! RTT samples come only from frames transmitted once (Karn), one per
//! acknowledging frame: the newest frame it acknowledges.

//! # Receiving
//!
//! In-order fragments are appended to the message being reassembled;
//! out-of-order ones wait in a ring indexed by sequence number from the
//! cumulative acknowledgement. The receiver accepts sequence numbers from
//! `ack` up to its right edge `ack + credit`; anything beyond is dropped and
//! counted, anything before is a duplicate. The right edge is
//! `ack + recv_window − (frames of whole messages not yet taken by
//! recv_message)` and never moves left, so the memory held is bounded by
//! `recv_window` frames plus one message being reassembled (at most
//! `max_message` bytes). A fragment out of place in its message (wrong
//! fragment index) or a message over `max_message` fails the channel.
//!
//! Acknowledgements: every frame carries the cumulative `ack`, a 64-bit
//! SACK bitmap of the frames held after it and the credit. An ACK frame is
//! sent when no frame is going the other way: at once for an out-of-order
//! or duplicate fragment, one beyond the window, or one that fills a gap;
//! otherwise after `ack_every` in-order fragments or `ack_delay`, whichever
//! first; and when the application frees at least a quarter of the window.
//!
//! A sender facing a window of zero with nothing in flight sends, after an
//! RTO, one fragment beyond the credit as a probe (TCP's persist timer):
//! the receiver drops it or takes it, and answers with its credit.
//!
//! # Ending
//!
//! [`Channel::close`] sends CLOSE once every queued fragment has been
//! acknowledged, and resends it on a backed-off timer until the peer
//! answers with CLOSE carrying [`FLAG_CLOSE_REPLY`]. A CLOSE from the peer
//! closes the channel at once (data still queued here is discarded) and is
//! answered. The channel fails ([`FailReason::Timeout`]) when data or a
//! CLOSE has been outstanding for `dead_after` without any acknowledgement
//! progress (frames from a peer whose window is zero count as progress);
//! a CLOSE that alone stays unanswered that long just closes.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ethersan_aoe::rtt::RttEstimator;

use crate::frame::{FrameError, Header, Kind, Prefix, FLAG_CLOSE_REPLY, FLAG_LAST, HEADER_LEN};
use crate::protect::Protector;
use crate::Level;

/// Transmissions after a frame that, once acknowledged, declare it lost.
const PACKET_THRESHOLD: u64 = 3;
/// The smallest congestion window, and the window after a timeout.
const MIN_CWND: u32 = 2;
/// Largest credit taken from a peer (keeps sequence comparisons sound).
const MAX_CREDIT: u32 = 1 << 30;
/// Frames covered by the SACK bitmap.
const SACK_BITS: usize = 64;

/// `a` before `b` in sequence space (modulo 2^32).
fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// The channel's parameters.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// Largest frame sent, header and trailer included: the link MTU on
    /// Ethernet (1500, 9000), the datagram payload on UDP.
    pub max_frame: usize,
    /// Congestion window to start with, in frames.
    pub initial_cwnd: u32,
    /// Largest congestion window, in frames.
    pub max_cwnd: u32,
    /// Credit advertised: frames accepted beyond the acknowledgement, and
    /// frames of whole messages held for the application.
    pub recv_window: u32,
    /// Retransmission timeout before the first RTT sample.
    pub initial_rto: Duration,
    /// Smallest retransmission timeout.
    pub min_rto: Duration,
    /// Largest retransmission timeout (also the cap of its backoff).
    pub max_rto: Duration,
    /// Longest an acknowledgement waits for a frame to ride on.
    pub ack_delay: Duration,
    /// In-order fragments received that trigger an acknowledgement.
    pub ack_every: u32,
    /// No acknowledgement progress for this long while data is outstanding
    /// fails the channel.
    pub dead_after: Duration,
    /// Largest message sent or accepted, in bytes.
    pub max_message: usize,
    /// First sequence number of both directions (0 on the wire; tests
    /// start near the wrap).
    #[doc(hidden)]
    pub initial_seq: u32,
}

impl Default for ChannelConfig {
    /// Values for a LAN: Ethernet MTU, a window of 1024 frames. The minimum
    /// RTO of 40 ms sits well above the delayed ACK (1 ms), the 1 ms
    /// granularity of tokio's timers and the scheduling stalls of a loaded
    /// 2-core host (5 ms gave spurious timeouts there, each collapsing the
    /// window); losses are mostly repaired earlier by fast retransmit. The
    /// estimator raises it on slower paths (emulated VMs).
    fn default() -> ChannelConfig {
        ChannelConfig {
            max_frame: 1500,
            initial_cwnd: 32,
            max_cwnd: 1024,
            recv_window: 1024,
            initial_rto: Duration::from_millis(200),
            min_rto: Duration::from_millis(40),
            max_rto: Duration::from_secs(2),
            ack_delay: Duration::from_millis(1),
            ack_every: 4,
            dead_after: Duration::from_secs(15),
            max_message: 16 << 20,
            initial_seq: 0,
        }
    }
}

/// Why a channel failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FailReason {
    /// Data stayed unacknowledged for `dead_after`.
    #[error("the peer stopped acknowledging")]
    Timeout,
    /// The peer sent a message larger than `max_message`.
    #[error("the peer sent a message over the size limit")]
    MessageTooLarge,
    /// A fragment's index does not follow the previous fragment's.
    #[error("the peer sent a fragment out of place in its message")]
    FragmentOutOfOrder,
}

/// Where a channel is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelState {
    /// Sending and receiving.
    Open,
    /// [`Channel::close`] was called: queued data goes out, then CLOSE.
    Closing,
    /// Ended by CLOSE, cleanly.
    Closed,
    /// Ended by an error.
    Failed(FailReason),
}

/// A message could not be queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// The channel is closing, closed or failed.
    #[error("the channel is {0:?}")]
    NotOpen(ChannelState),
    /// The message is larger than `max_message`.
    #[error("message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// Counters and the state of the control loops, for tests and monitoring.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Congestion window, in frames.
    pub cwnd: u32,
    /// Slow-start threshold, in frames (`u32::MAX` until the first loss).
    pub ssthresh: u32,
    /// Sequence numbers the peer still accepts beyond the ones sent.
    pub peer_credit: u32,
    /// Frames in flight (sent, not acknowledged, not declared lost).
    pub in_flight: u32,
    /// Smoothed RTT, once measured.
    pub srtt: Option<Duration>,
    /// RTT variation.
    pub rttvar: Duration,
    /// Current retransmission timeout.
    pub rto: Duration,
    /// Frames sent, of every kind.
    pub frames_sent: u64,
    /// Valid frames received, of every kind.
    pub frames_received: u64,
    /// Bytes of the frames sent (header, payload, trailer).
    pub bytes_sent: u64,
    /// Bytes of the valid frames received (header, payload, trailer).
    pub bytes_received: u64,
    /// DATA frames sent again.
    pub retransmits: u64,
    /// Frames declared lost by the packet threshold (fast retransmit).
    pub fast_retransmits: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// DATA frames received that were already held or delivered.
    pub duplicates: u64,
    /// DATA frames received ahead of a gap.
    pub out_of_order: u64,
    /// DATA frames dropped for lack of credit (beyond the right edge).
    pub window_drops: u64,
    /// Frames rejected: malformed, bad CRC, failed authentication,
    /// replayed, another channel's.
    pub rejected: u64,
    /// ACK frames sent.
    pub acks_sent: u64,
    /// Messages whose last fragment was sent.
    pub messages_sent: u64,
    /// Messages reassembled.
    pub messages_received: u64,
}

/// How a sent fragment stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FragState {
    /// Counted in the pipe.
    InFlight,
    /// Declared lost, waiting in the retransmission queue.
    Lost,
    /// Selectively acknowledged: held by the peer.
    Sacked,
}

/// A fragment sent and not yet cumulatively acknowledged.
#[derive(Debug)]
struct SentFrag {
    msg: Arc<Vec<u8>>,
    start: usize,
    len: u16,
    frag: u16,
    last: bool,
    state: FragState,
    /// Transmission index of its latest transmission.
    tx: u64,
    sent_at: Instant,
    sends: u32,
}

/// A message queued and not yet wholly fragmented.
#[derive(Debug)]
struct Outgoing {
    msg: Arc<Vec<u8>>,
    offset: usize,
    frag: u16,
}

/// A fragment received ahead of a gap.
#[derive(Debug)]
struct HeldFrag {
    frag: u16,
    last: bool,
    payload: Vec<u8>,
}

/// The newest frame an acknowledgement covers, for the RTT sample.
#[derive(Clone, Copy)]
struct Newest {
    tx: u64,
    sent_at: Instant,
    sends: u32,
}

/// One channel: the reliability state of both directions.
#[derive(Debug)]
pub struct Channel {
    cfg: ChannelConfig,
    local_id: u32,
    peer_id: u32,
    protector: Protector,
    payload_max: usize,
    state: ChannelState,
    stats: ChannelStats,

    // Sending.
    queue: VecDeque<Outgoing>,
    queued_bytes: usize,
    snd_una: u32,
    snd_nxt: u32,
    sent: VecDeque<SentFrag>,
    unacked_bytes: usize,
    /// Bytes left before the frame by the current `poll_transmit_after`.
    headroom: usize,
    rtx: VecDeque<u32>,
    /// (transmission index, sequence number) of transmissions in order.
    sent_log: VecDeque<(u64, u32)>,
    next_pn: u64,
    next_tx: u64,
    largest_acked_tx: Option<u64>,
    pipe: u32,
    cwnd: u32,
    ssthresh: u32,
    ca_acked: u32,
    /// Frames transmitted before this index do not change `cwnd`.
    recovery_tx: u64,
    /// Retransmissions allowed beyond `cwnd` (the first after a loss).
    rtx_budget: u32,
    peer_edge: u32,
    rtt: RttEstimator,
    rtos_without_progress: u32,
    rto_at: Option<Instant>,
    persist_at: Option<Instant>,
    probe: bool,
    last_progress: Instant,
    close_at: Option<Instant>,
    close_tries: u32,
    close_reply_pending: bool,

    // Receiving.
    rcv_next: u32,
    rcv_edge: u32,
    /// Slot i: sequence number `rcv_next + i` (slot 0 is always empty).
    held: VecDeque<Option<HeldFrag>>,
    partial: Vec<u8>,
    partial_frames: u32,
    next_frag: u16,
    ready: VecDeque<(Vec<u8>, u32)>,
    ready_frames: u32,
    ready_bytes: usize,
    held_bytes: usize,
    ack_now: bool,
    ack_at: Option<Instant>,
    unacked_in_order: u32,
    advertised_edge: u32,
}

impl Channel {
    /// A channel between `local_id` (the destination of frames to us) and
    /// `peer_id` (the destination of ours), its frames guarded by
    /// `protector`. Out-of-range configuration values are clamped.
    pub fn new(
        cfg: ChannelConfig,
        local_id: u32,
        peer_id: u32,
        protector: Protector,
        now: Instant,
    ) -> Channel {
        let mut cfg = cfg;
        cfg.max_cwnd = cfg.max_cwnd.max(MIN_CWND);
        cfg.initial_cwnd = cfg.initial_cwnd.clamp(MIN_CWND, cfg.max_cwnd);
        cfg.recv_window = cfg.recv_window.clamp(1, MAX_CREDIT);
        cfg.ack_every = cfg.ack_every.max(1);
        let payload_max = cfg
            .max_frame
            .saturating_sub(HEADER_LEN + protector.trailer_len())
            .clamp(1, usize::from(u16::MAX));
        let seq = cfg.initial_seq;
        let rtt = RttEstimator::new(cfg.initial_rto, cfg.min_rto, cfg.max_rto);
        Channel {
            local_id,
            peer_id,
            protector,
            payload_max,
            state: ChannelState::Open,
            stats: ChannelStats::default(),
            queue: VecDeque::new(),
            queued_bytes: 0,
            snd_una: seq,
            snd_nxt: seq,
            sent: VecDeque::new(),
            unacked_bytes: 0,
            headroom: 0,
            rtx: VecDeque::new(),
            sent_log: VecDeque::new(),
            next_pn: 0,
            next_tx: 0,
            largest_acked_tx: None,
            pipe: 0,
            cwnd: cfg.initial_cwnd,
            ssthresh: u32::MAX,
            ca_acked: 0,
            recovery_tx: 0,
            rtx_budget: 0,
            peer_edge: seq.wrapping_add(cfg.initial_cwnd),
            rtt,
            rtos_without_progress: 0,
            rto_at: None,
            persist_at: None,
            probe: false,
            last_progress: now,
            close_at: None,
            close_tries: 0,
            close_reply_pending: false,
            rcv_next: seq,
            rcv_edge: seq.wrapping_add(cfg.recv_window),
            held: VecDeque::new(),
            partial: Vec::new(),
            partial_frames: 0,
            next_frag: 0,
            ready: VecDeque::new(),
            ready_frames: 0,
            ready_bytes: 0,
            held_bytes: 0,
            ack_now: false,
            ack_at: None,
            unacked_in_order: 0,
            advertised_edge: seq.wrapping_add(cfg.recv_window),
            cfg,
        }
    }

    /// Our channel id: the destination of the peer's frames.
    pub fn local_id(&self) -> u32 {
        self.local_id
    }

    /// The peer's channel id: the destination of our frames.
    pub fn peer_id(&self) -> u32 {
        self.peer_id
    }

    /// The protection level.
    pub fn level(&self) -> Level {
        self.protector.level()
    }

    /// Where the channel is in its life.
    pub fn state(&self) -> ChannelState {
        self.state
    }

    /// Payload bytes carried by one full DATA frame.
    pub fn max_payload(&self) -> usize {
        self.payload_max
    }

    /// Counters and control-loop state.
    pub fn stats(&self) -> ChannelStats {
        let mut s = self.stats.clone();
        s.cwnd = self.cwnd;
        s.ssthresh = self.ssthresh;
        s.peer_credit = if seq_lt(self.snd_nxt, self.peer_edge) {
            self.peer_edge.wrapping_sub(self.snd_nxt)
        } else {
            0
        };
        s.in_flight = self.pipe;
        s.srtt = self.rtt.srtt();
        s.rttvar = self.rtt.rttvar();
        s.rto = self.rto();
        s
    }

    /// Queues a message; it is fragmented as frames go out.
    pub fn send_message(&mut self, msg: &[u8]) -> Result<(), ChannelError> {
        self.send_owned(msg.to_vec())
    }

    /// [`send_message`](Self::send_message) for a message the caller
    /// hands over (no copy).
    pub fn send_owned(&mut self, msg: Vec<u8>) -> Result<(), ChannelError> {
        if self.state != ChannelState::Open {
            return Err(ChannelError::NotOpen(self.state));
        }
        if msg.len() > self.cfg.max_message {
            return Err(ChannelError::TooLarge {
                len: msg.len(),
                max: self.cfg.max_message,
            });
        }
        self.queued_bytes += msg.len();
        self.queue.push_back(Outgoing {
            msg: Arc::new(msg),
            offset: 0,
            frag: 0,
        });
        Ok(())
    }

    /// Payload bytes queued or sent and not yet acknowledged.
    pub fn send_buffered(&self) -> usize {
        self.queued_bytes + self.unacked_bytes
    }

    /// Payload bytes received and not yet taken by
    /// [`Channel::recv_message`]: whole messages, the message being
    /// reassembled and fragments held ahead of a gap.
    pub fn recv_buffered(&self) -> usize {
        self.ready_bytes + self.partial.len() + self.held_bytes
    }

    /// The next whole message received, in order.
    pub fn recv_message(&mut self) -> Option<Vec<u8>> {
        let (msg, frames) = self.ready.pop_front()?;
        self.ready_frames = self.ready_frames.saturating_sub(frames);
        self.ready_bytes -= msg.len();
        self.update_edge();
        let opened = self.rcv_edge.wrapping_sub(self.advertised_edge);
        if opened >= (self.cfg.recv_window / 4).max(1) {
            self.ack_now = true;
        }
        Some(msg)
    }

    /// Ends the channel once the data queued has been delivered.
    pub fn close(&mut self) {
        if self.state == ChannelState::Open {
            self.state = ChannelState::Closing;
        }
    }

    /// The retransmission timeout: the estimator's, plus the time the
    /// peer may hold an acknowledgement back (our own `ack_delay`: both
    /// ends run the same configuration).
    fn rto(&self) -> Duration {
        self.rtt.rto() + self.cfg.ack_delay
    }

    fn fail(&mut self, reason: FailReason) {
        self.state = ChannelState::Failed(reason);
        self.drop_send_state();
    }

    /// The channel ended: what was queued or unacknowledged is dropped.
    fn drop_send_state(&mut self) {
        self.queue.clear();
        self.queued_bytes = 0;
        self.sent.clear();
        self.unacked_bytes = 0;
        self.rtx.clear();
        self.sent_log.clear();
        self.pipe = 0;
        self.rto_at = None;
        self.persist_at = None;
        self.close_at = None;
    }

    fn finish_closed(&mut self) {
        self.state = ChannelState::Closed;
        self.drop_send_state();
    }

    /// Whether data or a CLOSE waits for the peer.
    fn outstanding(&self) -> bool {
        !self.sent.is_empty() || self.close_at.is_some()
    }

    /// Takes a received channel frame (prefix onwards, padding allowed).
    /// A frame that is rejected changes nothing (but the `rejected`
    /// count).
    pub fn handle_frame(&mut self, now: Instant, frame: &mut [u8]) -> Result<(), FrameError> {
        let r = self.handle_frame_inner(now, frame);
        if r.is_err() {
            self.stats.rejected += 1;
        }
        r
    }

    fn handle_frame_inner(&mut self, now: Instant, frame: &mut [u8]) -> Result<(), FrameError> {
        let prefix = Prefix::parse(frame)?;
        if !prefix.kind.is_channel() {
            return Err(FrameError::NotChannelFrame(prefix.kind));
        }
        if prefix.dst != self.local_id {
            return Err(FrameError::WrongChannel {
                got: prefix.dst,
                local: self.local_id,
            });
        }
        let (h, payload) = self.protector.verify(frame)?;
        if matches!(self.state, ChannelState::Failed(_)) {
            return Ok(());
        }
        if h.kind != Kind::Data && h.len != 0 {
            return Err(FrameError::UnexpectedPayload(h.kind));
        }
        let outstanding = self.snd_nxt.wrapping_sub(self.snd_una);
        let ahead = h.ack.wrapping_sub(self.snd_una);
        if !seq_lt(h.ack, self.snd_una) && ahead > outstanding {
            return Err(FrameError::AckOutOfRange {
                ack: h.ack,
                next: self.snd_nxt,
            });
        }
        self.protector.record(h.pn);
        self.stats.frames_received += 1;
        self.stats.bytes_received +=
            (HEADER_LEN + payload.len() + self.protector.trailer_len()) as u64;
        if self.state == ChannelState::Closed {
            if h.kind == Kind::Close && h.flags & FLAG_CLOSE_REPLY == 0 {
                self.close_reply_pending = true;
            }
            return Ok(());
        }
        self.on_ack(now, &h);
        match h.kind {
            Kind::Data => self.on_data(now, &h, payload),
            Kind::Close => self.on_close(h.flags),
            _ => {}
        }
        Ok(())
    }

    /// The acknowledgement fields of any frame from the peer.
    fn on_ack(&mut self, now: Instant, h: &Header) {
        let edge = h.ack.wrapping_add(h.credit.min(MAX_CREDIT));
        if seq_lt(self.peer_edge, edge) {
            self.peer_edge = edge;
        }
        if seq_lt(h.ack, self.snd_una) {
            return;
        }
        let mut newest: Option<Newest> = None;
        let mut progress = false;
        let n = h.ack.wrapping_sub(self.snd_una);
        for _ in 0..n {
            let Some(f) = self.sent.pop_front() else {
                break;
            };
            self.snd_una = self.snd_una.wrapping_add(1);
            self.unacked_bytes -= usize::from(f.len);
            progress = true;
            match f.state {
                FragState::Sacked => {}
                FragState::InFlight | FragState::Lost => {
                    if f.state == FragState::InFlight {
                        self.pipe -= 1;
                    }
                    self.grow_cwnd(f.tx);
                    note_newest(&mut newest, f.tx, f.sent_at, f.sends);
                }
            }
        }
        if h.sack != 0 {
            for i in 0..SACK_BITS.min(self.sent.len().saturating_sub(1)) {
                if h.sack & (1 << i) == 0 {
                    continue;
                }
                let Some(f) = self.sent.get_mut(1 + i) else {
                    break;
                };
                if f.state == FragState::Sacked {
                    continue;
                }
                if f.state == FragState::InFlight {
                    self.pipe -= 1;
                }
                f.state = FragState::Sacked;
                let (tx, sent_at, sends) = (f.tx, f.sent_at, f.sends);
                progress = true;
                self.grow_cwnd(tx);
                note_newest(&mut newest, tx, sent_at, sends);
            }
        }
        if let Some(nw) = newest {
            if self.largest_acked_tx.is_none_or(|l| nw.tx > l) {
                self.largest_acked_tx = Some(nw.tx);
            }
            if nw.sends == 1 {
                self.rtt
                    .on_sample(now.saturating_duration_since(nw.sent_at));
            }
        }
        if progress {
            self.last_progress = now;
            self.rtos_without_progress = 0;
            self.rto_at = (self.pipe > 0).then(|| now + self.rto());
            self.detect_lost(now);
        } else if !seq_lt(self.snd_una, self.peer_edge) {
            // The peer is alive and has no room: not dead.
            self.last_progress = now;
        }
    }

    fn grow_cwnd(&mut self, tx: u64) {
        if tx < self.recovery_tx {
            return;
        }
        if self.cwnd < self.ssthresh {
            self.cwnd += 1;
        } else {
            self.ca_acked += 1;
            if self.ca_acked >= self.cwnd {
                self.ca_acked = 0;
                self.cwnd += 1;
            }
        }
        self.cwnd = self.cwnd.min(self.cfg.max_cwnd);
    }

    /// Declares lost the frames transmitted before the newest one
    /// acknowledged, by [`PACKET_THRESHOLD`] transmissions or more, or by
    /// more than 9/8 of the smoothed RTT (QUIC's time threshold).
    fn detect_lost(&mut self, now: Instant) {
        let Some(largest) = self.largest_acked_tx else {
            return;
        };
        let threshold = self.rtt.srtt().map(|s| s * 9 / 8);
        while let Some(&(tx, seq)) = self.sent_log.front() {
            if tx >= largest {
                break;
            }
            let i = seq.wrapping_sub(self.snd_una) as usize;
            let live = self.sent.get(i).filter(|f| {
                f.state == FragState::InFlight && f.tx == tx && !seq_lt(seq, self.snd_una)
            });
            let Some(f) = live else {
                self.sent_log.pop_front();
                continue;
            };
            let by_count = tx + PACKET_THRESHOLD <= largest;
            let by_time = threshold.is_some_and(|t| now.saturating_duration_since(f.sent_at) >= t);
            if !by_count && !by_time {
                break;
            }
            self.sent_log.pop_front();
            let Some(f) = self.sent.get_mut(i) else {
                continue;
            };
            f.state = FragState::Lost;
            self.pipe -= 1;
            self.push_lost(seq);
            self.stats.fast_retransmits += 1;
            if tx >= self.recovery_tx {
                self.ssthresh = (self.cwnd / 2).max(MIN_CWND);
                self.cwnd = self.ssthresh;
                self.ca_acked = 0;
                self.recovery_tx = self.next_tx;
                self.rtx_budget = 1;
            }
        }
    }

    fn on_data(&mut self, now: Instant, h: &Header, payload: &[u8]) {
        let off = h.seq.wrapping_sub(self.rcv_next);
        if seq_lt(h.seq, self.rcv_next) {
            self.stats.duplicates += 1;
            self.ack_now = true;
            return;
        }
        if off >= self.rcv_edge.wrapping_sub(self.rcv_next) {
            self.stats.window_drops += 1;
            self.ack_now = true;
            return;
        }
        let off = off as usize;
        if off > 0 {
            if self.held.len() <= off {
                self.held.resize_with(off + 1, || None);
            }
            if self.held[off].is_some() {
                self.stats.duplicates += 1;
            } else {
                self.held_bytes += payload.len();
                self.held[off] = Some(HeldFrag {
                    frag: h.frag,
                    last: h.is_last(),
                    payload: payload.to_vec(),
                });
                self.stats.out_of_order += 1;
            }
            self.ack_now = true;
            return;
        }
        if !self.deliver(h.frag, h.is_last(), payload) {
            return;
        }
        self.rcv_next = self.rcv_next.wrapping_add(1);
        self.held.pop_front();
        let mut filled = false;
        while let Some(Some(_)) = self.held.front() {
            let Some(Some(f)) = self.held.pop_front() else {
                break;
            };
            filled = true;
            self.held_bytes -= f.payload.len();
            if !self.deliver(f.frag, f.last, &f.payload) {
                return;
            }
            self.rcv_next = self.rcv_next.wrapping_add(1);
        }
        if filled || !self.held.is_empty() {
            self.ack_now = true;
        } else {
            self.unacked_in_order += 1;
            if self.unacked_in_order >= self.cfg.ack_every {
                self.ack_now = true;
            } else if self.ack_at.is_none() {
                self.ack_at = Some(now + self.cfg.ack_delay);
            }
        }
        self.update_edge();
    }

    /// Appends the in-order fragment to the message being reassembled;
    /// false when that failed the channel.
    fn deliver(&mut self, frag: u16, last: bool, payload: &[u8]) -> bool {
        if frag != self.next_frag {
            self.fail(FailReason::FragmentOutOfOrder);
            return false;
        }
        if self.partial.len() + payload.len() > self.cfg.max_message {
            self.fail(FailReason::MessageTooLarge);
            return false;
        }
        self.partial.extend_from_slice(payload);
        self.partial_frames = self.partial_frames.saturating_add(1);
        self.next_frag = self.next_frag.wrapping_add(1);
        if last {
            let msg = std::mem::take(&mut self.partial);
            self.ready_bytes += msg.len();
            self.ready.push_back((msg, self.partial_frames));
            self.ready_frames = self.ready_frames.saturating_add(self.partial_frames);
            self.partial_frames = 0;
            self.next_frag = 0;
            self.stats.messages_received += 1;
        }
        true
    }

    /// Moves the right edge to `rcv_next + recv_window − held messages`,
    /// never left.
    fn update_edge(&mut self) {
        let room = self.cfg.recv_window.saturating_sub(self.ready_frames);
        let edge = self.rcv_next.wrapping_add(room);
        if seq_lt(self.rcv_edge, edge) {
            self.rcv_edge = edge;
        }
    }

    fn on_close(&mut self, flags: u8) {
        if flags & FLAG_CLOSE_REPLY != 0 {
            if self.state == ChannelState::Closing && self.close_at.is_some() {
                self.finish_closed();
            }
            return;
        }
        self.finish_closed();
        self.close_reply_pending = true;
    }

    /// The earliest time [`Channel::handle_timeout`] has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !matches!(self.state, ChannelState::Open | ChannelState::Closing) {
            return None;
        }
        let dead = self
            .outstanding()
            .then(|| self.last_progress + self.cfg.dead_after);
        [
            self.rto_at,
            self.ack_at,
            self.persist_at,
            self.close_at,
            dead,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if !matches!(self.state, ChannelState::Open | ChannelState::Closing) {
            return;
        }
        if self.outstanding() && now >= self.last_progress + self.cfg.dead_after {
            if self.state == ChannelState::Closing && self.sent.is_empty() {
                self.finish_closed();
            } else {
                self.fail(FailReason::Timeout);
            }
            return;
        }
        if self.ack_at.is_some_and(|t| now >= t) {
            self.ack_at = None;
            self.ack_now = true;
        }
        if self.persist_at.is_some_and(|t| now >= t) {
            self.persist_at = None;
            self.probe = true;
        }
        if self.rto_at.is_some_and(|t| now >= t) {
            self.on_rto();
        }
    }

    /// The retransmission timer expired: the oldest frame in flight goes
    /// again (after a second timeout without progress, every frame).
    fn on_rto(&mut self) {
        self.rto_at = None;
        if self.pipe == 0 {
            return;
        }
        self.stats.timeouts += 1;
        self.rtt.on_timeout();
        // Frames beyond a closed window are probes, not a sign of
        // congestion.
        if seq_lt(self.snd_una, self.peer_edge) {
            self.ssthresh = (self.cwnd / 2).max(MIN_CWND);
            self.cwnd = MIN_CWND;
            self.ca_acked = 0;
        }
        self.recovery_tx = self.next_tx;
        // Once: only the oldest frame in flight is sent again; when its
        // retransmission is acknowledged, the loss thresholds declare lost
        // whatever older transmissions are still unacknowledged, and a
        // spurious timeout costs one frame instead of a window. A second
        // timeout without progress sends everything not acknowledged
        // again, lowest sequence number first: the receiver delivers
        // nothing until the first gap fills.
        self.rtos_without_progress = self.rtos_without_progress.saturating_add(1);
        if self.rtos_without_progress > 1 {
            self.rtx.clear();
            let mut seq = self.snd_una;
            for f in self.sent.iter_mut() {
                if matches!(f.state, FragState::InFlight | FragState::Lost) {
                    f.state = FragState::Lost;
                    self.rtx.push_back(seq);
                }
                seq = seq.wrapping_add(1);
            }
            self.pipe = 0;
            self.sent_log.clear();
        } else if let Some(i) = self
            .sent
            .iter()
            .position(|f| f.state == FragState::InFlight)
        {
            self.sent[i].state = FragState::Lost;
            self.pipe -= 1;
            self.push_lost(self.snd_una.wrapping_add(i as u32));
        }
        self.rtx_budget = 1;
    }

    /// Writes the next frame to send into `out` (cleared first); false when
    /// there is nothing to send.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        self.poll_transmit_after(now, out, 0)
    }

    /// [`poll_transmit`](Self::poll_transmit) leaving `headroom` bytes
    /// before the frame in `out` (room for a link header the caller fills
    /// in, so that the frame is not copied again to add it).
    pub fn poll_transmit_after(
        &mut self,
        now: Instant,
        out: &mut Vec<u8>,
        headroom: usize,
    ) -> bool {
        out.clear();
        out.resize(headroom, 0);
        self.headroom = headroom;
        match self.state {
            ChannelState::Failed(_) => return false,
            ChannelState::Closed => {
                if !self.close_reply_pending {
                    return false;
                }
                self.close_reply_pending = false;
                self.write_control(out, Kind::Close, FLAG_CLOSE_REPLY);
                return true;
            }
            ChannelState::Open | ChannelState::Closing => {}
        }
        if self.ack_at.is_some_and(|t| now >= t) {
            self.ack_now = true;
        }
        if self.retransmit(now, out) || self.send_new(now, out) {
            return true;
        }
        if self.state == ChannelState::Closing
            && self.queue.is_empty()
            && self.sent.is_empty()
            && self.close_at.is_none_or(|t| now >= t)
        {
            if self.close_at.is_none() {
                self.last_progress = now;
            }
            let backoff = 1u32 << self.close_tries.min(16);
            self.close_tries = self.close_tries.saturating_add(1);
            let wait = self
                .rtt
                .rto()
                .checked_mul(backoff)
                .unwrap_or(self.cfg.max_rto)
                .min(self.cfg.max_rto);
            self.close_at = Some(now + wait);
            self.write_control(out, Kind::Close, 0);
            return true;
        }
        if self.ack_now {
            self.write_control(out, Kind::Ack, 0);
            self.stats.acks_sent += 1;
            return true;
        }
        false
    }

    /// Queues `seq` for retransmission, keeping the queue in sequence
    /// order (lowest first: the receiver's first gap is what holds it up).
    fn push_lost(&mut self, seq: u32) {
        while self.rtx.front().is_some_and(|s| seq_lt(*s, self.snd_una)) {
            self.rtx.pop_front();
        }
        let una = self.snd_una;
        let off = seq.wrapping_sub(una);
        let at = self.rtx.partition_point(|s| s.wrapping_sub(una) < off);
        if self.rtx.get(at) != Some(&seq) {
            self.rtx.insert(at, seq);
        }
    }

    fn retransmit(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        while let Some(&seq) = self.rtx.front() {
            let i = seq.wrapping_sub(self.snd_una) as usize;
            if seq_lt(seq, self.snd_una)
                || self.sent.get(i).is_none_or(|f| f.state != FragState::Lost)
            {
                self.rtx.pop_front();
                continue;
            }
            if self.pipe >= self.cwnd {
                if self.rtx_budget == 0 {
                    return false;
                }
                self.rtx_budget -= 1;
            }
            self.rtx.pop_front();
            self.stats.retransmits += 1;
            self.transmit(now, i, out);
            return true;
        }
        false
    }

    fn send_new(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        let limit = self.cfg.max_cwnd as usize * 2 + SACK_BITS;
        if self.queue.is_empty() || self.pipe >= self.cwnd || self.sent.len() >= limit {
            return false;
        }
        if !seq_lt(self.snd_nxt, self.peer_edge) {
            if !self.probe {
                if self.sent.is_empty() && self.persist_at.is_none() {
                    self.persist_at = Some(now + self.rto());
                }
                return false;
            }
            self.probe = false;
        }
        self.persist_at = None;
        let Some(o) = self.queue.front_mut() else {
            return false;
        };
        let take = self.payload_max.min(o.msg.len() - o.offset);
        let last = o.offset + take == o.msg.len();
        let frag = SentFrag {
            msg: o.msg.clone(),
            start: o.offset,
            len: take as u16,
            frag: o.frag,
            last,
            state: FragState::Lost,
            tx: 0,
            sent_at: now,
            sends: 0,
        };
        o.offset += take;
        o.frag = o.frag.wrapping_add(1);
        if last {
            self.queue.pop_front();
            self.stats.messages_sent += 1;
        }
        self.queued_bytes -= take;
        self.unacked_bytes += take;
        if self.sent.is_empty() {
            self.last_progress = now;
        }
        self.sent.push_back(frag);
        self.snd_nxt = self.snd_nxt.wrapping_add(1);
        self.transmit(now, self.sent.len() - 1, out);
        true
    }

    /// Sends (again) the fragment at index `i` of `sent`.
    fn transmit(&mut self, now: Instant, i: usize, out: &mut Vec<u8>) {
        let seq = self.snd_una.wrapping_add(i as u32);
        let tx = self.next_tx;
        self.next_tx += 1;
        let Some(f) = self.sent.get_mut(i) else {
            return;
        };
        f.state = FragState::InFlight;
        f.tx = tx;
        f.sent_at = now;
        f.sends += 1;
        let (msg, start, len, frag, last) = (f.msg.clone(), f.start, f.len, f.frag, f.last);
        self.pipe += 1;
        self.sent_log.push_back((tx, seq));
        if self.rto_at.is_none() {
            self.rto_at = Some(now + self.rto());
        }
        let flags = if last { FLAG_LAST } else { 0 };
        self.write_header(out, Kind::Data, flags, seq, frag, len);
        out.extend_from_slice(&msg[start..start + usize::from(len)]);
        self.seal(out);
    }

    fn write_control(&mut self, out: &mut Vec<u8>, kind: Kind, flags: u8) {
        self.write_header(out, kind, flags, 0, 0, 0);
        self.seal(out);
    }

    fn seal(&mut self, out: &mut Vec<u8>) {
        self.protector.seal_from(out, self.headroom);
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += (out.len() - self.headroom.min(out.len())) as u64;
    }

    /// Writes a header carrying the current acknowledgement, and takes the
    /// next packet number.
    fn write_header(
        &mut self,
        out: &mut Vec<u8>,
        kind: Kind,
        flags: u8,
        seq: u32,
        frag: u16,
        len: u16,
    ) {
        let mut sack = 0u64;
        for (i, slot) in self.held.iter().skip(1).take(SACK_BITS).enumerate() {
            if slot.is_some() {
                sack |= 1 << i;
            }
        }
        let header = Header {
            kind,
            flags,
            dst: self.peer_id,
            pn: self.next_pn,
            seq,
            frag,
            len,
            ack: self.rcv_next,
            sack,
            credit: self.rcv_edge.wrapping_sub(self.rcv_next),
        };
        self.next_pn += 1;
        header.write(out);
        self.ack_now = false;
        self.ack_at = None;
        self.unacked_in_order = 0;
        self.advertised_edge = self.rcv_edge;
    }
}

fn note_newest(newest: &mut Option<Newest>, tx: u64, sent_at: Instant, sends: u32) {
    if newest.is_none_or(|n| tx > n.tx) {
        *newest = Some(Newest { tx, sent_at, sends });
    }
}

#[cfg(test)]
mod tests {
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
}
