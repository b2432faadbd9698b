//! A channel's counters.

use std::time::Duration;

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
    /// Frames declared lost that proved only late: acknowledged before
    /// their retransmission went, or sooner after it than a round trip.
    pub spurious_losses: u64,
    /// Retransmission timeouts found spurious (the original transmissions
    /// arrived) and undone.
    pub spurious_timeouts: u64,
    /// Window reductions undone (spurious fast retransmits and timeouts).
    pub undos: u64,
    /// The reordering window: what the time threshold of loss detection
    /// adds to the RTT.
    pub reorder_window: Duration,
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
    /// Placed frames sent (first transmissions).
    pub placed_sent: u64,
    /// Placed frames received that landed in a registered buffer.
    pub placed_received: u64,
    /// Placed frames received and dropped: no registration for their tag
    /// (aborted, released, never registered) or beyond its buffer.
    pub placed_dropped: u64,
    /// Payload bytes held for the application: whole messages not yet
    /// taken, the message being reassembled, fragments ahead of a gap
    /// (the endpoint adds the messages queued for its reader).
    pub recv_held: u64,
}
