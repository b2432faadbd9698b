//! What a [`Channel`] sends: retransmissions first, then new fragments
//! within the congestion window and the peer's credit, then a pending ACK
//! or CLOSE; each frame's header written and sealed by the protector.

use std::time::{Duration, Instant};

use super::*;

impl Channel {
    /// Writes the next frame to send into `out` (cleared first); false when
    /// there is nothing to send.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        self.poll_transmit_after(now, out, 0)
    }

    /// [`poll_transmit_after`](Self::poll_transmit_after) without copying
    /// a data frame's payload where the protection leaves it as it is
    /// (level `none` on a medium with its own checksum): `out` then holds
    /// the headroom and the header, and the payload is appended to
    /// `payload` as slices of the queued data, to be sent after `out` as
    /// one datagram (a gather list). Otherwise `payload` is left alone and
    /// `out` holds the whole frame.
    pub fn poll_transmit_gather(
        &mut self,
        now: Instant,
        out: &mut Vec<u8>,
        headroom: usize,
        payload: &mut Vec<Bytes>,
    ) -> bool {
        self.gather = self.protector.seals_nothing();
        let sent = self.poll_transmit_after(now, out, headroom);
        self.gather = false;
        payload.append(&mut self.tail);
        sent
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
        // Placed frames carry no acknowledgement: one that is due goes
        // first, on its own.
        if self.ack_now && self.next_is_placed() {
            self.write_control(out, Kind::Ack, 0);
            self.stats.acks_sent += 1;
            return true;
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
            self.close_at = Some(now + self.close_wait());
            self.close_tries = self.close_tries.saturating_add(1);
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

    /// How long after the CLOSE about to be sent the next one goes:
    /// the first [`CLOSE_BURST`] copies a fraction of a round trip apart
    /// (so that one lost CLOSE costs the peer a fraction of a round trip,
    /// not a timeout), then on the retransmission timer, backed off.
    fn close_wait(&self) -> Duration {
        if self.close_tries + 1 < CLOSE_BURST {
            return self
                .rtt
                .srtt()
                .map_or(CLOSE_SPACING_MAX, |s| s / 4)
                .clamp(CLOSE_SPACING_MIN, CLOSE_SPACING_MAX);
        }
        let backoff = 1u32 << (self.close_tries + 1 - CLOSE_BURST).min(16);
        self.rtt
            .rto()
            .checked_mul(backoff)
            .unwrap_or(self.cfg.max_rto)
            .min(self.cfg.max_rto)
    }

    /// Queues `seq` for retransmission, keeping the queue in sequence
    /// order (lowest first: the receiver's first gap is what holds it up).
    pub(super) fn push_lost(&mut self, seq: u32) {
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
        let (src, take, done) = match o {
            Outgoing::Message {
                parts,
                len,
                offset,
                frag,
            } => {
                let take = self.payload_max.min(*len - *offset);
                let last = *offset + take == *len;
                let src = Source::Fragment {
                    parts: parts.clone(),
                    start: *offset,
                    frag: *frag,
                    last,
                };
                *offset += take;
                *frag = frag.wrapping_add(1);
                if last {
                    self.stats.messages_sent += 1;
                }
                (src, take, last)
            }
            Outgoing::Placed {
                tag,
                offset,
                data,
                pos,
            } => {
                let take = self.payload_max.min(data.len() - *pos);
                let src = Source::Placed {
                    tag: *tag,
                    offset: offset.wrapping_add(*pos as u64),
                    data: data.slice(*pos..*pos + take),
                };
                *pos += take;
                self.stats.placed_sent += 1;
                (src, take, *pos == data.len())
            }
        };
        if done {
            self.queue.pop_front();
        }
        let frag = SentFrag {
            src,
            len: take as u16,
            state: FragState::Lost,
            tx: 0,
            sent_at: now,
            sends: 0,
            lost_by: recovery::LostBy::Never,
        };
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
        let len = f.len;
        self.pipe += 1;
        self.sent_log.push_back((tx, seq));
        if self.rto_at.is_none() {
            self.rto_at = Some(now + self.rto());
        }
        let Some(f) = self.sent.get(i) else {
            return;
        };
        let start = out.len();
        match &f.src {
            Source::Fragment {
                parts,
                start: at,
                frag,
                last,
            } => {
                let (parts, at, frag, last) = (parts.clone(), *at, *frag, *last);
                let flags = if last { FLAG_LAST } else { 0 };
                let header = self.header(Kind::Data, flags, seq, frag, len);
                header.write(out);
                self.sent_header();
                if self.gather {
                    let tail = &mut self.tail;
                    walk_parts(&parts, at, usize::from(len), |k, r| {
                        tail.push(parts[k].slice(r));
                    });
                    self.count_sent(out);
                    return;
                }
                let mut slices: [&[u8]; 8] = [&[]; 8];
                let n = gather(&parts, at, usize::from(len), &mut slices);
                if n <= slices.len() {
                    self.protector.seal_gather(out, start, &slices[..n]);
                } else {
                    // More parts than the fixed list: gathered one by one.
                    let mut v: Vec<&[u8]> = Vec::new();
                    gather_into(&parts, at, usize::from(len), &mut v);
                    self.protector.seal_gather(out, start, &v);
                }
            }
            Source::Placed { tag, offset, data } => {
                let header = Header::placed(self.peer_id, self.next_pn, seq, len, *tag, *offset);
                self.next_pn += 1;
                header.write(out);
                if self.gather {
                    self.tail.push(data.clone());
                    self.count_sent(out);
                    return;
                }
                self.protector.seal_gather(out, start, &[&data[..]]);
            }
        }
        self.count_sent(out);
    }

    fn write_control(&mut self, out: &mut Vec<u8>, kind: Kind, flags: u8) {
        let header = self.header(kind, flags, 0, 0, 0);
        header.write(out);
        self.sent_header();
        self.protector.seal_from(out, self.headroom);
        self.count_sent(out);
    }

    fn count_sent(&mut self, out: &[u8]) {
        let tail: usize = self.tail.iter().map(|b| b.len()).sum();
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += (out.len() - self.headroom.min(out.len()) + tail) as u64;
    }

    /// Whether the next frame to go is placed data (which carries no
    /// acknowledgement).
    fn next_is_placed(&self) -> bool {
        let una = self.snd_una;
        let rtx = self.rtx.iter().find_map(|&seq| {
            let f = self.sent.get(seq.wrapping_sub(una) as usize)?;
            (!seq_lt(seq, una) && f.state == FragState::Lost).then_some(f)
        });
        match rtx {
            Some(f) => matches!(f.src, Source::Placed { .. }),
            None => matches!(self.queue.front(), Some(Outgoing::Placed { .. })),
        }
    }

    /// A header carrying the current acknowledgement, with the next packet
    /// number (taken).
    fn header(&mut self, kind: Kind, flags: u8, seq: u32, frag: u16, len: u16) -> Header {
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
        header
    }

    /// A header with the acknowledgement went out.
    fn sent_header(&mut self) {
        self.ack_now = false;
        self.ack_at = None;
        self.unacked_in_order = 0;
        self.advertised_edge = self.rcv_edge;
    }
}

/// Fills `out` with the slices of `parts` covering `len` bytes from
/// `start`; returns how many there are (more than `out.len()`: not all
/// written).
fn gather<'a>(parts: &'a [Bytes], start: usize, len: usize, out: &mut [&'a [u8]]) -> usize {
    let mut n = 0;
    walk(parts, start, len, |s| {
        if let Some(slot) = out.get_mut(n) {
            *slot = s;
        }
        n += 1;
    });
    n
}

fn gather_into<'a>(parts: &'a [Bytes], start: usize, len: usize, out: &mut Vec<&'a [u8]>) {
    walk(parts, start, len, |s| out.push(s));
}

fn walk<'a>(parts: &'a [Bytes], start: usize, len: usize, mut f: impl FnMut(&'a [u8])) {
    walk_parts(parts, start, len, |k, r| f(&parts[k][r]));
}

/// Calls `f` with the index and range of each part's share of the `len`
/// bytes from `start` of `parts`, in order.
fn walk_parts(
    parts: &[Bytes],
    mut start: usize,
    mut len: usize,
    mut f: impl FnMut(usize, std::ops::Range<usize>),
) {
    for (k, p) in parts.iter().enumerate() {
        if len == 0 {
            break;
        }
        if start >= p.len() {
            start -= p.len();
            continue;
        }
        let take = (p.len() - start).min(len);
        f(k, start..start + take);
        start = 0;
        len -= take;
    }
}
