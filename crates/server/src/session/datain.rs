//! Data-In and status for a finished command (RFC 7143 §11.7), and a
//! large READ's Data-In sent while the rest of it is still being read
//! (cut-through: the target core hands the data over in parts, see
//! `Command::early`).
//!
//! Either way the Data-In PDUs are the ones planned for the whole transfer
//! ([`data_in_segments`]): the same offsets, DataSNs and F bits, sent in
//! order. Parts are sent up to the last whole PDU they cover; a PDU that
//! straddles two parts is copied together from them (only when the
//! initiator's MaxRecvDataSegmentLength does not divide the part size);
//! the last PDU waits for the outcome, so it can carry the status. A
//! command that fails after some of its data went out ends with a SCSI
//! Response carrying its CHECK CONDITION (no residual, as for a read that
//! failed whole), and ExpDataSN counts the Data-In sent. The read's share
//! of the session's memory budget moves to the streamed data on its first
//! part and comes back when the last PDU holding any of it is sent, also
//! when the command fails or is aborted.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use ethersan_proto::pdu::{self, DataIn, Pdu, RESERVED_TAG};
use ethersan_proto::transfer::{data_in_segments, DataInSegment};
use ethersan_scsi::{IoBuf, ScsiResponse, ScsiStatus};

use super::{Releases, Session, Task};

/// A READ's data handed over ahead of its outcome, not yet all sent.
#[derive(Debug, Default)]
pub(super) struct Streamed {
    /// Bytes the command produces (as the target core said).
    total: usize,
    /// Data not sent yet, in order, starting at byte `sent`.
    parts: Parts,
    /// Data-In PDUs sent.
    segs_sent: u32,
    /// Bytes handed over so far.
    received: usize,
}

/// A read's reserved budget, given back when the last holder goes.
struct Hold {
    bytes: usize,
    releases: Arc<Releases>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hold({} bytes)", self.bytes)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.releases.release(self.bytes);
    }
}

/// Data that keeps its read's budget until it is sent.
struct Held {
    data: Bytes,
    _hold: Arc<Hold>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// Byte-ordered data in pieces, taken from the front; every piece, and
/// every slice or copy taken from them, holds the read's budget (`hold`)
/// until dropped (the writer sent it).
#[derive(Debug, Default)]
struct Parts {
    bufs: VecDeque<Bytes>,
    /// Bytes in `bufs`.
    len: usize,
    /// The budget the read reserved, if any.
    hold: Option<Arc<Hold>>,
}

impl Parts {
    /// `b`, holding the budget (when there is one) until it is dropped.
    fn held(&self, b: Bytes) -> Bytes {
        match &self.hold {
            Some(h) => Bytes::from_owner(Held {
                data: b,
                _hold: h.clone(),
            }),
            None => b,
        }
    }

    /// Hold the `bytes` of budget the read reserved from now on.
    fn hold(&mut self, bytes: usize, releases: &Arc<Releases>) {
        if bytes > 0 {
            let releases = releases.clone();
            self.hold = Some(Arc::new(Hold { bytes, releases }));
        }
    }

    fn push(&mut self, b: Bytes) {
        self.len += b.len();
        if !b.is_empty() {
            let b = self.held(b);
            self.bufs.push_back(b);
        }
    }

    /// The next `n` bytes: a slice of one piece when they lie in it, else
    /// a copy of them; `None` when fewer than `n` are here.
    fn take(&mut self, n: usize) -> Option<Bytes> {
        if n > self.len {
            return None;
        }
        self.len -= n;
        let front = self.bufs.front_mut()?;
        if front.len() >= n {
            let b = front.split_to(n);
            if front.is_empty() {
                self.bufs.pop_front();
            }
            return Some(b);
        }
        let mut out = BytesMut::with_capacity(n);
        while out.len() < n {
            let front = self.bufs.front_mut()?;
            let k = (n - out.len()).min(front.len());
            out.extend_from_slice(&front.split_to(k));
            if front.is_empty() {
                self.bufs.pop_front();
            }
        }
        Some(self.held(out.freeze()))
    }
}

impl Session {
    /// Part of a READ's data, ahead of its outcome: send the Data-In PDUs
    /// it completes (never the last one). `total` is the bytes the command
    /// produces.
    pub(super) fn on_early(&mut self, itt: u32, part: IoBuf, total: usize) {
        if self.tasks.is_aborted(itt) {
            return;
        }
        let p = &self.setup.params;
        let (max_seg, max_burst) = (p.max_data_in_segment(), p.max_burst_length);
        let Some(task) = self.tasks.get_mut(itt) else {
            return;
        };
        let edtl = task.cmd.expected_len as usize;
        let (lun, itt) = (task.cmd.lun, task.cmd.itt);
        let reserved = std::mem::take(&mut task.reserved);
        let st = task.streamed.get_or_insert_with(Streamed::default);
        st.parts.hold(reserved, &self.releases);
        st.total = total;
        let send_len = total.min(edtl) as u32;
        // Bytes past what may be sent are not kept.
        let room = (send_len as usize).saturating_sub(st.received);
        let mut part = part.into_bytes();
        part.truncate(room);
        st.received += part.len();
        st.parts.push(part);
        let upto = st.received.min(send_len as usize) as u32;
        let ready: Vec<(DataInSegment, Bytes)> = data_in_segments(send_len, max_seg, max_burst)
            .skip(st.segs_sent as usize)
            .take_while(|seg| !seg.last && seg.offset + seg.len <= upto)
            .map_while(|seg| st.parts.take(seg.len as usize).map(|b| (seg, b)))
            .collect();
        st.segs_sent += ready.len() as u32;
        for (seg, chunk) in ready {
            let din = DataIn {
                final_bit: seg.final_bit,
                lun,
                itt,
                ttt: RESERVED_TAG,
                exp_cmd_sn: self.window.exp_cmd_sn(),
                max_cmd_sn: self.window.max_cmd_sn(),
                data_sn: seg.data_sn,
                buffer_offset: seg.offset,
                ..Default::default()
            };
            self.send(Pdu::DataIn(din), chunk);
        }
    }

    /// Send Data-In and status for a finished command (after the Data-In
    /// already sent for it, see [`Session::on_early`]).
    pub(super) fn respond(&mut self, task: &mut Task, resp: ScsiResponse) {
        let cmd = &task.cmd;
        let edtl = cmd.expected_len as usize;
        let streamed = task.streamed.take();
        let early = streamed.as_ref().map_or(0, |s| s.received);
        let produced = match &streamed {
            Some(s) if resp.status == ScsiStatus::Good => s.total,
            _ => early + resp.data_in.len(),
        };
        let (send_len, overflow, underflow, residual) =
            if early > 0 && resp.status != ScsiStatus::Good {
                // Failed after some data went out: no residual, as a read
                // that failed whole reports none.
                (early, false, false, 0)
            } else if cmd.read || produced > 0 {
                if produced > edtl {
                    (edtl, true, false, (produced - edtl) as u32)
                } else if produced < edtl && resp.status == ScsiStatus::Good {
                    (produced, false, true, (edtl - produced) as u32)
                } else {
                    (produced, false, false, 0)
                }
            } else if cmd.write {
                // Writes: residuals compare the CDB's transfer length (SPDTL,
                // reported by the SCSI layer) with the expected length.
                match resp.data_out_len {
                    Some(w) if w > edtl => (0, true, false, (w - edtl) as u32),
                    Some(w) if w < edtl => (0, false, true, (edtl - w) as u32),
                    _ => (0, false, false, 0),
                }
            } else {
                (0, false, edtl > 0, edtl as u32)
            };
        let (mut parts, segs_sent) = match streamed {
            Some(s) => (s.parts, s.segs_sent),
            None => (Parts::default(), 0),
        };
        // The budget gets the bytes back when the writer has sent them (a
        // streamed read's went to its parts on the first one).
        parts.hold(task.reserved, &self.releases);
        // The engine's buffer itself: no copy.
        parts.push(resp.data_in.into_bytes());
        let collapse = resp.status == ScsiStatus::Good && resp.sense.is_empty() && send_len > 0;
        let p = &self.setup.params;
        let (max_seg, max_burst) = (p.max_data_in_segment(), p.max_burst_length);
        // A failed command sends no more data than went out already.
        let rest: Vec<DataInSegment> = if early > 0 && resp.status != ScsiStatus::Good {
            Vec::new()
        } else {
            data_in_segments(send_len as u32, max_seg, max_burst)
                .skip(segs_sent as usize)
                .collect()
        };
        let nsegs = segs_sent + rest.len() as u32;
        for seg in rest {
            let status_here = collapse && seg.last;
            let din = DataIn {
                final_bit: seg.final_bit,
                ack: false,
                overflow: status_here && overflow,
                underflow: status_here && underflow,
                status_present: status_here,
                status: resp.status as u8,
                lun: if status_here { 0 } else { cmd.lun },
                itt: cmd.itt,
                ttt: RESERVED_TAG,
                stat_sn: if status_here { self.next_stat_sn() } else { 0 },
                exp_cmd_sn: self.window.exp_cmd_sn(),
                max_cmd_sn: self.window.max_cmd_sn(),
                data_sn: seg.data_sn,
                buffer_offset: seg.offset,
                residual: if status_here { residual } else { 0 },
            };
            // Every byte up to `send_len` was produced and is here.
            let chunk = parts.take(seg.len as usize).unwrap_or_default();
            self.send(Pdu::DataIn(din), chunk);
        }
        if collapse {
            return;
        }
        let sense = if resp.sense.is_empty() {
            Bytes::new()
        } else {
            let mut s = Vec::with_capacity(resp.sense.len() + 2);
            s.extend_from_slice(&(resp.sense.len() as u16).to_be_bytes());
            s.extend_from_slice(&resp.sense);
            Bytes::from(s)
        };
        // ExpDataSN: Data-In PDUs sent for a read, R2Ts for a write (§11.4.8).
        let exp_data_sn = if cmd.read { nsegs } else { task.r2t_count };
        let r = pdu::ScsiResponse {
            overflow,
            underflow,
            response: 0,
            status: resp.status as u8,
            itt: cmd.itt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
            exp_data_sn,
            residual,
            ..Default::default()
        };
        self.send(Pdu::ScsiResponse(r), sense);
    }
}
