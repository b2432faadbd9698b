//! Loss recovery that does not fight reordering (docs/native-transport.md
//! §Reliability): a RACK-style adaptive reordering window (RFC 8985
//! §6.2), and the undo of window reductions that prove spurious (a fast
//! retransmit of a frame that was only late; a retransmission timeout
//! caused by a delay spike, RFC 4015's response with F-RTO-like
//! detection, RFC 5682).
//!
//! Reordering. An original transmission (sent once) acknowledged after a
//! frame of a higher sequence number was acknowledged has been overtaken:
//! reordering is seen, and from then on the packet threshold no longer
//! declares frames lost; only the time threshold does, RACK's: a frame is
//! lost once it was sent longer ago than the RTT (the larger of the
//! smoothed RTT and the latest sample) plus the reordering window. The
//! window is 1/8 of that RTT (QUIC's 9/8) until reordering is seen, then
//! `min_rtt / 4 × mult`, at least 1/8 of the RTT and at most the smoothed
//! RTT. `mult` grows by one, at most once per round trip, each time a
//! frame declared lost proves to have been only late; it is back to 1
//! after 16 window reductions without such a finding. A frame spared only
//! by time arms the loss timer for the moment it would be lost, so a lost
//! frame at the tail of a burst is found without waiting for the RTO.
//!
//! Spurious losses. A frame declared lost by the thresholds was only late
//! when it is acknowledged before its retransmission went (an
//! acknowledgement after it is ambiguous: without timestamps or DSACK it
//! may answer either transmission; a timing guess against the smallest
//! RTT proved wrong in the simulator, where that RTT was measured behind
//! a queue). When every frame declared lost since a fast-retransmit
//! halving proves late, the halving is undone (`cwnd` and `ssthresh` back
//! to their values before it); one acknowledged after its retransmission,
//! or declared lost beyond the reach of the SACK bitmap (a guess), keeps
//! it.
//!
//! Spurious timeouts. A first timeout may be undone only when it did not
//! follow losses: nothing was declared lost, retransmitted or selectively
//! acknowledged (a hole) at the time. The timeout sends the oldest frame
//! `F` again; the first acknowledgement that makes progress decides. If
//! it does not cover `F` (it acknowledges frames after `F` selectively),
//! `F` was missing at the receiver: a real loss. If it covers `F` and
//! (then or in a later acknowledgement) cumulatively the next frame too,
//! sent once and before the timeout, the original transmissions arrived
//! (a lost `F`
//! would have held the cumulative acknowledgement at `F + 1` until the
//! retransmission filled it, with the frames after it acknowledged
//! selectively first): the timeout was spurious. Then `cwnd` goes back to
//! the smaller of its value before the timeout and the frames that were
//! in flight (delivered without loss) then, and `ssthresh` to at most that
//! (a timeout in slow start leaves it: the delay spike says the path is
//! full). A second timeout without progress is never undone.

use std::time::{Duration, Instant};

use super::*;

/// Largest multiplier of the reordering window.
const MAX_REO_MULT: u32 = 64;
/// Window reductions without a spurious loss that reset the multiplier.
const REO_DECAY_REDUCTIONS: u32 = 16;

/// How a frame was last declared lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LostBy {
    /// Never declared lost.
    Never,
    /// By the packet or time threshold, during the given fast-recovery
    /// episode (0: none whose reduction may still be undone).
    Threshold(u32),
    /// By the time threshold while beyond the reach of the SACK bitmap:
    /// a guess (frames held by the peer there look unacknowledged).
    Guess,
    /// By a retransmission timeout.
    Timeout,
}

/// A fast-retransmit halving that may prove spurious.
#[derive(Debug, Clone, Copy)]
struct FastUndo {
    episode: u32,
    cwnd: u32,
    ssthresh: u32,
    /// Frames declared lost since the halving, not yet found late.
    pending: u32,
}

/// A first retransmission timeout that may prove spurious.
#[derive(Debug, Clone, Copy)]
struct RtoUndo {
    cwnd: u32,
    ssthresh: u32,
    /// The frame the timeout sent again (`snd_una` then).
    seq: u32,
    /// Transmissions before this index were sent before the timeout.
    rto_tx: u64,
    /// Frames in flight when the timeout fired.
    flight: u32,
    /// The original transmissions proved to have arrived.
    proof: bool,
}

/// The state of the reordering window and of the undo.
#[derive(Debug)]
pub(super) struct Recovery {
    reordering_seen: bool,
    reo_mult: u32,
    /// The multiplier grows again once a transmission from this index on
    /// is acknowledged (once per round trip).
    reo_round_end: u64,
    reductions_since_step: u32,
    min_rtt: Option<Duration>,
    /// How late, beyond the RTT, the latest reordered frames came.
    reo_late: Duration,
    latest_rtt: Option<Duration>,
    /// One past the highest sequence number acknowledged.
    fack: u32,
    /// `fack` before the acknowledgement being processed.
    fack_before: u32,
    episode: u32,
    fast_undo: Option<FastUndo>,
    rto_undo: Option<RtoUndo>,
    /// When the oldest frame spared by the time threshold becomes lost.
    pub(super) loss_at: Option<Instant>,
}

impl Recovery {
    pub(super) fn new(seq: u32) -> Recovery {
        Recovery {
            reordering_seen: false,
            reo_mult: 1,
            reo_round_end: 0,
            reductions_since_step: 0,
            min_rtt: None,
            reo_late: Duration::ZERO,
            latest_rtt: None,
            fack: seq,
            fack_before: seq,
            episode: 0,
            fast_undo: None,
            rto_undo: None,
            loss_at: None,
        }
    }

    /// Whether [`PACKET_THRESHOLD`] declares frames lost (until reordering
    /// is seen).
    pub(super) fn packet_threshold_applies(&self) -> bool {
        !self.reordering_seen
    }

    /// The RTT the time threshold starts from: the larger of the smoothed
    /// RTT and the latest sample.
    fn base_rtt(&self, srtt: Duration) -> Duration {
        self.latest_rtt.map_or(srtt, |l| l.max(srtt))
    }

    /// How long after its transmission a frame older than the newest one
    /// acknowledged is declared lost.
    pub(super) fn time_threshold(&self, srtt: Duration) -> Duration {
        self.base_rtt(srtt) + self.window(srtt)
    }

    /// The reordering window (see the module documentation).
    pub(super) fn window(&self, srtt: Duration) -> Duration {
        let floor = self.base_rtt(srtt) / 8;
        if !self.reordering_seen {
            return floor;
        }
        let w = self
            .min_rtt
            .map_or(floor, |m| m / 4 * self.reo_mult.min(MAX_REO_MULT));
        w.max(self.reo_late).min(srtt).max(floor)
    }

    pub(super) fn on_rtt_sample(&mut self, rtt: Duration) {
        self.latest_rtt = Some(rtt);
        if self.min_rtt.is_none_or(|m| rtt < m) {
            self.min_rtt = Some(rtt);
        }
    }

    /// An acknowledgement starts being processed.
    pub(super) fn begin_ack(&mut self) {
        self.fack_before = self.fack;
    }

    /// A fast-retransmit halving from (`cwnd`, `ssthresh`).
    pub(super) fn on_reduction(&mut self, cwnd: u32, ssthresh: u32) {
        self.reductions_since_step += 1;
        if self.reductions_since_step >= REO_DECAY_REDUCTIONS {
            self.reo_mult = 1;
            self.reo_late /= 2;
            self.reductions_since_step = 0;
        }
        if self.fast_undo.is_none() {
            self.episode = self.episode.wrapping_add(1).max(1);
            self.fast_undo = Some(FastUndo {
                episode: self.episode,
                cwnd,
                ssthresh,
                pending: 0,
            });
        }
    }

    /// A frame is declared lost by a threshold (`guess`: beyond the
    /// SACK bitmap's reach): how to mark it. A guess is never proved
    /// spurious or real, so the halving it belongs to is not undone.
    pub(super) fn on_declared_lost(&mut self, guess: bool) -> LostBy {
        if guess {
            self.fast_undo = None;
            return LostBy::Guess;
        }
        match &mut self.fast_undo {
            Some(u) => {
                u.pending = u.pending.saturating_add(1);
                LostBy::Threshold(u.episode)
            }
            None => LostBy::Threshold(0),
        }
    }

    /// A frame declared lost was late: the reordering window widens (once
    /// per round trip).
    fn widen(&mut self, largest_acked_tx: Option<u64>, next_tx: u64) {
        self.reordering_seen = true;
        if largest_acked_tx.is_some_and(|l| l >= self.reo_round_end) {
            self.reo_mult = (self.reo_mult + 1).min(MAX_REO_MULT);
            self.reo_round_end = next_tx;
            self.reductions_since_step = 0;
        }
    }
}

/// What [`Channel::on_newly_acked`] needs of a frame.
#[derive(Debug, Clone, Copy)]
pub(super) struct AckedFrag {
    pub(super) seq: u32,
    pub(super) state: FragState,
    pub(super) tx: u64,
    pub(super) sends: u32,
    pub(super) sent_at: Instant,
    pub(super) lost_by: LostBy,
}

impl AckedFrag {
    pub(super) fn of(seq: u32, f: &SentFrag) -> AckedFrag {
        AckedFrag {
            seq,
            state: f.state,
            tx: f.tx,
            sends: f.sends,
            sent_at: f.sent_at,
            lost_by: f.lost_by,
        }
    }
}

impl Channel {
    /// A frame not acknowledged before was acknowledged, cumulatively or
    /// selectively, at `now` (`f`: as it stood before).
    pub(super) fn on_newly_acked(&mut self, now: Instant, f: AckedFrag) {
        let srtt = self.rtt.srtt();
        let r = &mut self.recovery;
        if f.sends == 1 && seq_lt(f.seq, r.fack_before) {
            // Overtaken by a frame sent after it (RACK's reordering): the
            // window must cover how late it came.
            r.reordering_seen = true;
            if let Some(srtt) = srtt {
                let late = now
                    .saturating_duration_since(f.sent_at)
                    .saturating_sub(r.base_rtt(srtt));
                r.reo_late = r.reo_late.max(late);
            }
        }
        if !seq_lt(f.seq, r.fack) {
            r.fack = f.seq.wrapping_add(1);
        }
        if let Some(u) = &mut r.rto_undo {
            if f.seq == u.seq.wrapping_add(1) && f.sends == 1 && f.tx < u.rto_tx {
                // The frame after the one the timeout sent again, sent
                // once before the timeout: if this acknowledgement covers
                // both cumulatively, the originals arrived.
                u.proof = true;
            }
        }
        // Declared lost and acknowledged before it went again: it was only
        // late. (A retransmission acknowledged proves nothing either way:
        // without timestamps or DSACK, its acknowledgement may answer the
        // original.)
        let spurious = f.state == FragState::Lost && f.sends <= 1;
        match f.lost_by {
            LostBy::Never | LostBy::Guess => {}
            LostBy::Timeout => {
                if spurious {
                    self.stats.spurious_losses += 1;
                    if let Some(u) = r.rto_undo.as_mut().filter(|u| u.seq == f.seq) {
                        u.proof = true;
                    }
                }
            }
            LostBy::Threshold(episode) => {
                let mine = r.fast_undo.filter(|u| u.episode == episode && episode != 0);
                if !spurious {
                    // Acknowledged after its retransmission went: perhaps
                    // needed, so the halving stands.
                    if mine.is_some() {
                        r.fast_undo = None;
                    }
                    return;
                }
                self.stats.spurious_losses += 1;
                r.widen(self.largest_acked_tx, self.next_tx);
                let Some(mut u) = mine else {
                    return;
                };
                u.pending = u.pending.saturating_sub(1);
                r.fast_undo = Some(u);
                if u.pending == 0 {
                    r.fast_undo = None;
                    self.cwnd = self.cwnd.max(u.cwnd).min(self.cfg.max_cwnd);
                    self.ssthresh = self.ssthresh.max(u.ssthresh);
                    self.ca_acked = 0;
                    self.stats.undos += 1;
                }
            }
        }
    }

    /// After an acknowledgement that made progress up to `ack`: settles
    /// a timeout that may be undone.
    pub(super) fn settle_rto_undo(&mut self, ack: u32) {
        let Some(u) = self.recovery.rto_undo else {
            return;
        };
        let next = u.seq.wrapping_add(1);
        let spurious = if !seq_lt(u.seq, ack) {
            // Frames after `F` acknowledged while `F` was missing at the
            // receiver: a real loss.
            false
        } else if u.proof {
            true
        } else if !seq_lt(next, ack)
            && self
                .sent
                .front()
                .is_some_and(|f| f.state == FragState::InFlight && f.sends == 1 && f.tx < u.rto_tx)
        {
            // `F` alone: the frame after it, sent before the timeout,
            // decides.
            return;
        } else {
            // No proof that the originals arrived: the timeout stands.
            false
        };
        self.recovery.rto_undo = None;
        if !spurious {
            return;
        }
        let cwnd = u.cwnd.min(u.flight).max(self.cwnd).min(self.cfg.max_cwnd);
        self.cwnd = cwnd;
        self.ssthresh = self.ssthresh.max(u.ssthresh.min(cwnd));
        self.ca_acked = 0;
        self.stats.undos += 1;
        self.stats.spurious_timeouts += 1;
    }

    /// A retransmission timeout is about to reduce the window (first
    /// timeout without progress: `first`): remembers what to restore if
    /// it proves spurious, when it did not follow losses.
    pub(super) fn on_timeout_undo(&mut self, first: bool) {
        let r = &mut self.recovery;
        r.fast_undo = None;
        r.rto_undo = None;
        if !first {
            return;
        }
        let clean = self
            .sent
            .iter()
            .all(|f| f.state == FragState::InFlight && f.sends == 1);
        if !clean || self.sent.is_empty() {
            return;
        }
        r.rto_undo = Some(RtoUndo {
            cwnd: self.cwnd,
            ssthresh: self.ssthresh,
            seq: self.snd_una,
            rto_tx: self.next_tx,
            flight: self.pipe,
            proof: false,
        });
    }
}
