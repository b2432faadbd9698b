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
//! retransmission timeout sets `ssthresh` to half and `cwnd` to 2. Either
//! reduction is undone when it proves spurious (`recovery.rs`).
//!
//! # Placed data
//!
//! [`Channel::send_placed`] queues bytes to land in the peer's buffer
//! registered under a tag, at a byte offset. Each frame of it is a DATA
//! frame with [`FLAG_PLACED`](crate::frame::FLAG_PLACED) carrying (tag,
//! offset of its first byte, length); it takes a sequence number like a
//! fragment, so acknowledgements, credit, congestion control and
//! retransmission treat it alike, and it shares the order of messages: a
//! message sent after placed data is delivered only once every sequence
//! number before it has been received, that is once the data has landed.
//! The receiver ([`Channel::handle_frame_placing`]) asks its
//! [`Placement`] for the destination and verifies (decrypts) the frame
//! straight into it; a frame nobody registered, or beyond the buffer, is
//! dropped but counted as received (acknowledged: it is not sent again).
//! Placed frames never enter the reassembly ring. A placed frame's header
//! holds the tag and offset where others hold `ack` and `sack`, so it
//! acknowledges nothing.
//!
//! # Loss detection
//!
//! Every transmission gets a local transmission index. A frame is declared
//! lost when a frame transmitted after it has been acknowledged
//! (cumulatively or selectively) and it was transmitted at least three
//! transmissions before that one (until reordering is seen), or longer
//! ago than the RTT plus the reordering window (9/8 of the RTT until
//! reordering is seen, then adapted: RACK, see `recovery.rs`); the oldest
//! frame spared only by time arms the loss timer. Both thresholds treat a
//! retransmission like any new frame, so a lost retransmission is found
//! the same way. An acknowledgement of a
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
//! acknowledged — three copies a quarter of a round trip apart (so that
//! one lost CLOSE does not leave the peer holding the channel for a
//! timeout) — and resends it on a backed-off timer until the peer
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

use bytes::Bytes;

use crate::frame::{FrameError, Header, Kind, Prefix, FLAG_CLOSE_REPLY, FLAG_LAST, HEADER_LEN};
use crate::protect::Protector;
use crate::Level;

mod placement;
mod receive;
mod recovery;
mod stats;
mod transmit;

pub use placement::{NoPlacement, PlaceSlot, Placement};
pub use stats::ChannelStats;

/// CLOSE frames sent close together (a fraction of a round trip apart)
/// before the retransmission timer takes over: one lost CLOSE does not
/// keep the peer's channel open for a timeout.
const CLOSE_BURST: u32 = 3;
/// The shortest spacing of the CLOSE burst.
const CLOSE_SPACING_MIN: Duration = Duration::from_micros(100);
/// The longest spacing of the CLOSE burst (also the spacing before any
/// RTT was measured).
const CLOSE_SPACING_MAX: Duration = Duration::from_millis(5);

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
    /// The peer answered with an authentic stateless reset.
    #[error("the target no longer knows this channel (it restarted?): reconnect")]
    Reset,
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

/// What a sent frame carries.
#[derive(Debug)]
enum Source {
    /// A fragment: `len` bytes from `start` of the message made of
    /// `parts`.
    Fragment {
        parts: Arc<[Bytes]>,
        start: usize,
        frag: u16,
        last: bool,
    },
    /// Placed data: these bytes, at `offset` of the peer's buffer `tag`.
    Placed { tag: u32, offset: u64, data: Bytes },
}

/// A fragment sent and not yet cumulatively acknowledged.
#[derive(Debug)]
struct SentFrag {
    src: Source,
    len: u16,
    state: FragState,
    /// Transmission index of its latest transmission.
    tx: u64,
    sent_at: Instant,
    sends: u32,
    /// How it was last declared lost (for the undo of spurious losses).
    lost_by: recovery::LostBy,
}

/// What is queued and not yet wholly sent.
#[derive(Debug)]
enum Outgoing {
    /// A message made of `parts` (`len` bytes), sent up to `offset`.
    Message {
        parts: Arc<[Bytes]>,
        len: usize,
        offset: usize,
        frag: u16,
    },
    /// Placed data, sent up to `pos`.
    Placed {
        tag: u32,
        offset: u64,
        data: Bytes,
        pos: usize,
    },
}

/// A frame received ahead of a gap: a fragment (its payload kept) or a
/// placed frame (already landed or dropped: nothing kept).
#[derive(Debug)]
struct HeldFrag {
    frag: u16,
    last: bool,
    placed: bool,
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
    /// Set by [`Channel::poll_transmit_gather`]: a data frame's payload
    /// goes to `tail` instead of being copied after its header.
    gather: bool,
    /// The payload of the frame just written, when `gather` applies.
    tail: Vec<Bytes>,
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
    /// Reordering window and undo of spurious reductions.
    recovery: recovery::Recovery,
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
    /// Length of the last message reassembled (capacity hint).
    last_message_len: usize,
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
            gather: false,
            tail: Vec::new(),
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
            recovery: recovery::Recovery::new(seq),
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
            last_message_len: 0,
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
        s.recv_held = self.recv_buffered() as u64;
        s.reorder_window = self
            .rtt
            .srtt()
            .map_or(Duration::ZERO, |t| self.recovery.window(t));
        s
    }

    /// Queues a message; it is fragmented as frames go out.
    pub fn send_message(&mut self, msg: &[u8]) -> Result<(), ChannelError> {
        self.send_owned(msg.to_vec())
    }

    /// [`send_message`](Self::send_message) for a message the caller
    /// hands over (no copy).
    pub fn send_owned(&mut self, msg: Vec<u8>) -> Result<(), ChannelError> {
        let len = msg.len();
        self.queue_message(Arc::new([Bytes::from(msg)]), len)
    }

    /// Queues one message made of `parts` in order, without gathering
    /// them: each frame is sealed from the parts it covers.
    pub fn send_parts(&mut self, parts: Vec<Bytes>) -> Result<(), ChannelError> {
        let len: usize = parts.iter().map(Bytes::len).sum();
        self.queue_message(parts.into(), len)
    }

    fn queue_message(&mut self, parts: Arc<[Bytes]>, len: usize) -> Result<(), ChannelError> {
        if self.state != ChannelState::Open {
            return Err(ChannelError::NotOpen(self.state));
        }
        if len > self.cfg.max_message {
            return Err(ChannelError::TooLarge {
                len,
                max: self.cfg.max_message,
            });
        }
        self.queued_bytes += len;
        self.queue.push_back(Outgoing::Message {
            parts,
            len,
            offset: 0,
            frag: 0,
        });
        Ok(())
    }

    /// Queues `data` to land in the peer's buffer registered under `tag`,
    /// from byte `offset` on (see the module's §Placed data). Empty data
    /// sends nothing.
    pub fn send_placed(&mut self, tag: u32, offset: u64, data: Bytes) -> Result<(), ChannelError> {
        if self.state != ChannelState::Open {
            return Err(ChannelError::NotOpen(self.state));
        }
        if data.is_empty() {
            return Ok(());
        }
        self.queued_bytes += data.len();
        self.queue.push_back(Outgoing::Placed {
            tag,
            offset,
            data,
            pos: 0,
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

    /// The peer no longer knows this channel (an authentic stateless
    /// reset, checked by the caller): a channel that was closing is
    /// closed, any other fails with [`FailReason::Reset`].
    pub fn reset(&mut self) {
        match self.state {
            ChannelState::Closing if self.queue.is_empty() && self.sent.is_empty() => {
                self.finish_closed()
            }
            ChannelState::Open | ChannelState::Closing => self.fail(FailReason::Reset),
            ChannelState::Closed | ChannelState::Failed(_) => {}
        }
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
        self.recovery.loss_at = None;
    }

    fn finish_closed(&mut self) {
        self.state = ChannelState::Closed;
        self.drop_send_state();
    }

    /// Whether data or a CLOSE waits for the peer.
    fn outstanding(&self) -> bool {
        !self.sent.is_empty() || self.close_at.is_some()
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
            self.recovery.loss_at,
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
        if self.recovery.loss_at.is_some_and(|t| now >= t) {
            self.recovery.loss_at = None;
            self.detect_lost(now);
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
            self.on_timeout_undo(self.rtos_without_progress == 0);
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
                    f.lost_by = recovery::LostBy::Timeout;
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
            self.sent[i].lost_by = recovery::LostBy::Timeout;
            self.pipe -= 1;
            self.push_lost(self.snd_una.wrapping_add(i as u32));
        }
        self.rtx_budget = 1;
    }
}

#[cfg(test)]
mod tests;
