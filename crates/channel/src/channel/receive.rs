//! What a received frame does to a [`Channel`]: acknowledgements (RTT
//! samples, congestion window growth, loss detection), data (reassembly
//! of fragments into messages, the receive window) and CLOSE.

use std::time::Instant;

use super::*;

impl Channel {
    /// Takes a received channel frame (prefix onwards, padding allowed).
    /// A frame that is rejected changes nothing (but the `rejected`
    /// count).
    /// Placed frames are dropped (and counted): see
    /// [`Channel::handle_frame_placing`].
    pub fn handle_frame(&mut self, now: Instant, frame: &mut [u8]) -> Result<(), FrameError> {
        self.handle_frame_placing(now, frame, &mut NoPlacement)
    }

    /// [`Channel::handle_frame`] with the buffers placed frames land in:
    /// a new placed frame is verified (decrypted) from `frame` straight
    /// into the slot `placement` gives for it.
    pub fn handle_frame_placing(
        &mut self,
        now: Instant,
        frame: &mut [u8],
        placement: &mut dyn Placement,
    ) -> Result<(), FrameError> {
        let r = self.handle_frame_inner(now, frame, placement);
        if r.is_err() {
            self.stats.rejected += 1;
        }
        r
    }

    /// Whether a DATA frame with sequence number `seq` would be taken as
    /// new: within the window and not yet received.
    fn is_new(&self, seq: u32) -> bool {
        if seq_lt(seq, self.rcv_next) {
            return false;
        }
        let off = seq.wrapping_sub(self.rcv_next);
        if off >= self.rcv_edge.wrapping_sub(self.rcv_next) {
            return false;
        }
        self.held
            .get(off as usize)
            .is_none_or(|slot| slot.is_none())
    }

    /// Verifies a placed frame, landing its payload when it is new and has
    /// a destination. Returns its header, the payload (left in the frame
    /// when it did not land) and whether it landed.
    fn verify_placed<'a>(
        &mut self,
        frame: &'a mut [u8],
        h: Header,
        placement: &mut dyn Placement,
    ) -> Result<(Header, &'a [u8], bool), FrameError> {
        let (tag, offset) = h.placement().unwrap_or_default();
        let len = usize::from(h.len);
        let live = matches!(self.state, ChannelState::Open | ChannelState::Closing);
        if live && self.is_new(h.seq) {
            if let Some(slot) = placement.slot(tag, offset, len) {
                if slot.fresh && slot.dst.len() == len {
                    // Nothing in the slot has landed: verify (decrypt)
                    // straight into it. A forged frame leaves its bytes
                    // there but fails here, before `landed`.
                    let h = self.protector.verify_into_uninit(frame, slot.dst)?;
                    // SAFETY: `verify_into_uninit` succeeded, so it wrote
                    // all `len` bytes of the slot with the verified payload.
                    unsafe { placement.landed(tag, offset, len) };
                    return Ok((h, &[], true));
                }
                // Some of the slot has landed: verify in the frame first, so
                // that a forged frame cannot touch landed bytes.
                let (h, payload) = self.protector.verify(frame)?;
                if slot.dst.len() == payload.len() {
                    slot.dst.write_copy_of_slice(payload);
                    // SAFETY: the verified payload was just copied over the
                    // whole slot (`payload.len() == len`).
                    unsafe { placement.landed(tag, offset, len) };
                    return Ok((h, &[], true));
                }
                return Ok((h, payload, false));
            }
        }
        let (h, payload) = self.protector.verify(frame)?;
        Ok((h, payload, false))
    }

    fn handle_frame_inner(
        &mut self,
        now: Instant,
        frame: &mut [u8],
        placement: &mut dyn Placement,
    ) -> Result<(), FrameError> {
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
        let unverified = Header::parse(frame)?;
        let (h, payload, landed) = if unverified.is_placed() {
            self.verify_placed(frame, unverified, placement)?
        } else {
            let (h, payload) = self.protector.verify(frame)?;
            (h, payload, false)
        };
        let frame_len = HEADER_LEN + usize::from(h.len) + self.protector.trailer_len();
        if matches!(self.state, ChannelState::Failed(_)) {
            return Ok(());
        }
        if h.kind != Kind::Data && h.len != 0 {
            return Err(FrameError::UnexpectedPayload(h.kind));
        }
        if h.is_placed() {
            // No acknowledgement fields to check or take.
            self.protector.record(h.pn);
            self.stats.frames_received += 1;
            self.stats.bytes_received += frame_len as u64;
            if self.state == ChannelState::Closed {
                return Ok(());
            }
            self.on_placed(now, &h, landed);
            return Ok(());
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
        self.stats.bytes_received += frame_len as u64;
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
        self.recovery.begin_ack();
        let n = h.ack.wrapping_sub(self.snd_una);
        for _ in 0..n {
            let Some(f) = self.sent.pop_front() else {
                break;
            };
            self.on_newly_acked(now, recovery::AckedFrag::of(self.snd_una, &f));
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
                let acked = recovery::AckedFrag::of(self.snd_una.wrapping_add(1 + i as u32), f);
                if f.state == FragState::InFlight {
                    self.pipe -= 1;
                }
                f.state = FragState::Sacked;
                let (tx, sent_at, sends) = (f.tx, f.sent_at, f.sends);
                progress = true;
                self.on_newly_acked(now, acked);
                self.grow_cwnd(tx);
                note_newest(&mut newest, tx, sent_at, sends);
            }
        }
        if let Some(nw) = newest {
            if self.largest_acked_tx.is_none_or(|l| nw.tx > l) {
                self.largest_acked_tx = Some(nw.tx);
            }
            if nw.sends == 1 {
                let sample = now.saturating_duration_since(nw.sent_at);
                self.rtt.on_sample(sample);
                self.recovery.on_rtt_sample(sample);
            }
        }
        if progress {
            self.settle_rto_undo(h.ack);
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
    /// acknowledged, by [`PACKET_THRESHOLD`] transmissions or more (until
    /// reordering is seen), or when sent longer ago than the time
    /// threshold (the RTT plus the reordering window: `recovery.rs`). The
    /// oldest frame spared only by time arms the loss timer.
    pub(super) fn detect_lost(&mut self, now: Instant) {
        self.recovery.loss_at = None;
        let Some(largest) = self.largest_acked_tx else {
            return;
        };
        let threshold = self.rtt.srtt().map(|s| self.recovery.time_threshold(s));
        let by_count_applies = self.recovery.packet_threshold_applies();
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
            let by_count = by_count_applies && tx + PACKET_THRESHOLD <= largest;
            let by_time = threshold.is_some_and(|t| now.saturating_duration_since(f.sent_at) >= t);
            if !by_count && !by_time {
                self.recovery.loss_at = threshold.map(|t| f.sent_at + t);
                break;
            }
            self.sent_log.pop_front();
            if tx >= self.recovery_tx {
                self.recovery.on_reduction(self.cwnd, self.ssthresh);
            }
            let lost_by = self.recovery.on_declared_lost(i > SACK_BITS);
            let Some(f) = self.sent.get_mut(i) else {
                continue;
            };
            f.state = FragState::Lost;
            f.lost_by = lost_by;
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

    /// A placed frame, verified: it landed (`landed`) or was dropped; its
    /// sequence number counts as received either way.
    fn on_placed(&mut self, now: Instant, h: &Header, landed: bool) {
        let new = self.is_new(h.seq);
        if new {
            if landed {
                self.stats.placed_received += 1;
            } else {
                self.stats.placed_dropped += 1;
            }
        }
        self.on_data(now, h, &[]);
    }

    fn on_data(&mut self, now: Instant, h: &Header, payload: &[u8]) {
        let placed = h.is_placed();
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
                    placed,
                    payload: payload.to_vec(),
                });
                self.stats.out_of_order += 1;
            }
            self.ack_now = true;
            return;
        }
        if !placed && !self.deliver(h.frag, h.is_last(), payload) {
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
            if !f.placed && !self.deliver(f.frag, f.last, &f.payload) {
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
        if self.partial.capacity() == 0 && !last {
            // A message of several fragments: room for one as large as the
            // last one, so that it does not grow (and move) fragment by
            // fragment.
            let hint = self.last_message_len.min(self.cfg.max_message);
            self.partial.reserve(hint.max(payload.len()));
        }
        self.partial.extend_from_slice(payload);
        self.partial_frames = self.partial_frames.saturating_add(1);
        self.next_frag = self.next_frag.wrapping_add(1);
        if last {
            let msg = std::mem::take(&mut self.partial);
            self.last_message_len = msg.len();
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
    pub(super) fn update_edge(&mut self) {
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
}

fn note_newest(newest: &mut Option<Newest>, tx: u64, sent_at: Instant, sends: u32) {
    if newest.is_none_or(|n| tx > n.tx) {
        *newest = Some(Newest { tx, sent_at, sends });
    }
}
