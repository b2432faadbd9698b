//! SCSI commands in a session (RFC 7143 §11.3–§11.8): a command's arrival
//! and its immediate data, its turn in CmdSN order, R2Ts and Data-Out,
//! handing it to the target core's executor, and Data-In and status.

use bytes::Bytes;
use ethersan_core::executor::{check_condition, Command, Counting, Finished};
use ethersan_core::task_set::TaskAttr as SamAttr;
use ethersan_proto::pdu::{
    self, lun_from_wire, reject_reason, DataOut, Pdu, RawPdu, ScsiCommand, TaskAttr, RESERVED_TAG,
};
use ethersan_proto::transfer::{TransferLimits, WriteTransfer};
use ethersan_scsi::commands::Op;
use ethersan_scsi::{IoBuf, Nexus, ScsiStatus};
use tracing::{debug, warn};

use super::{Event, Ordered, Output, Session, Task, MAX_EDTL};

/// Reads at least this long may send their data as it is read (the
/// target core splits reads of two pieces or more, 512 KiB).
const EARLY_MIN: u32 = 512 * 1024;

impl Session {
    /// A SCSI Command PDU; its immediate data is in `raw.data`, or in
    /// `aligned` when the reader put it in an aligned buffer of its own.
    pub(super) fn on_scsi_command(
        &mut self,
        cmd: ScsiCommand,
        mut raw: RawPdu,
        aligned: Option<IoBuf>,
    ) {
        if self.setup.target.is_none() {
            self.reject(&raw.bhs, reject_reason::PROTOCOL_ERROR);
            return;
        }
        if self.tasks.contains(cmd.itt) || self.retired.contains(&cmd.itt) {
            // An ITT must be unique among the session's tasks (§11.3.4? ITT).
            self.reject(&raw.bhs, reject_reason::TASK_IN_PROGRESS);
            return;
        }
        // Extended CDB AHS (type 1): bytes beyond the first 16 (§11.2.2.3).
        let Ok(cdb) = pdu::cdb_from_ahs(&cmd.cdb, &raw.ahs) else {
            self.reject(&raw.bhs, reject_reason::PROTOCOL_ERROR);
            return;
        };
        let lun = lun_from_wire(cmd.lun);
        let edtl = cmd.expected_len;
        let p = &self.setup.params;
        let mut fail = None;
        let mut data = IoBuf::new();
        let mut forced = 0;
        let mut reserved = 0;
        let mut room = 0;
        let mut collect_now = false;
        // The immediate data, wherever the reader put it.
        let mut imm_data = aligned.unwrap_or_else(|| IoBuf::from(std::mem::take(&mut raw.data)));
        // A large WRITE the unit writes as its data arrives (cut-through,
        // `dataout`): its data goes into pieces, not one buffer. Not over
        // a native transport channel, whose Data-Out is placed in one
        // registered buffer.
        let streams = cmd.write
            && edtl <= MAX_EDTL
            && (imm_data.len() as u64) < u64::from(edtl)
            && !self.setup.placed_writes
            && self
                .setup
                .target
                .as_ref()
                .is_some_and(|t| t.scsi.streams_write(lun, &cdb, edtl));
        let transfer = if cmd.write && edtl > 0 {
            let imm = imm_data.len().min(edtl as usize);
            if !p.immediate_data && !imm_data.is_empty() {
                self.reject(&raw.bhs, reject_reason::PROTOCOL_ERROR);
                return;
            }
            // A command that takes its place in command order at once
            // (the usual case) gets its whole buffer now if it fits and
            // nothing waits: one allocation, the immediate data copied
            // once (or the PDU's buffer itself when it carried it all).
            let in_order = cmd.immediate || cmd.cmd_sn == self.window.exp_cmd_sn();
            if edtl > MAX_EDTL {
                fail = Some(check_condition(0x05, 0x24, 0x00));
            } else if in_order && self.awaiting.is_empty() && self.budget.try_reserve(edtl as usize)
            {
                reserved = edtl as usize;
                room = edtl as usize;
                if streams {
                    // Collected into pieces from the start (`dataout`).
                    data = std::mem::take(&mut imm_data);
                    data.truncate(imm);
                    collect_now = true;
                } else if imm == edtl as usize || imm_data.capacity() >= edtl as usize {
                    // The PDU's own buffer (the reader gave it room for
                    // the whole transfer, aligned): Data-Out fills the rest
                    // in order (`IoBuf::fill_at`), never zeroed.
                    data = std::mem::take(&mut imm_data);
                    data.truncate(imm);
                } else {
                    // Aligned, so that the write reaches an O_DIRECT
                    // store without a bounce copy.
                    data = IoBuf::aligned_with_capacity(edtl as usize);
                    data.extend_from_slice(&imm_data[..imm]);
                }
            } else {
                // Otherwise only what may arrive unasked is buffered now:
                // the immediate data, and with InitialR2T=No the rest of
                // the first burst. The whole buffer is reserved when the
                // command's turn comes and it fits.
                let unsolicited = if p.initial_r2t {
                    imm
                } else {
                    imm.max(p.first_burst_length as usize).min(edtl as usize)
                };
                let mut v = std::mem::take(&mut imm_data).into_vec();
                v.truncate(imm);
                // No more than the unsolicited data is held (and counted)
                // until the budget gives the whole buffer.
                v.shrink_to(unsolicited);
                v.reserve_exact(unsolicited - imm);
                data = v.into();
                room = unsolicited;
                forced = unsolicited;
                self.budget.force(forced);
            }
            let limits = TransferLimits {
                initial_r2t: p.initial_r2t,
                first_burst_length: p.first_burst_length,
                max_burst_length: p.max_burst_length,
                max_outstanding_r2t: p.max_outstanding_r2t,
            };
            let t = WriteTransfer::new(edtl, imm as u32, cmd.final_bit, limits);
            (!t.is_complete()).then_some(t)
        } else {
            if edtl > MAX_EDTL {
                fail = Some(check_condition(0x05, 0x24, 0x00));
            }
            None
        };
        let itt = cmd.itt;
        let (cmd_sn, immediate) = (cmd.cmd_sn, cmd.immediate);
        let attr = match cmd.attr {
            TaskAttr::Ordered => SamAttr::Ordered,
            TaskAttr::HeadOfQueue => SamAttr::HeadOfQueue,
            // Untagged, ACA (NormACA is 0) and reserved values: SIMPLE.
            _ => SamAttr::Simple,
        };
        // Task management does not stop a SANITIZE (SBC-4 §4.11): it goes
        // on in the background, so nothing waits for it.
        let exempt = ethersan_scsi::commands::lookup(&cdb).is_some_and(|d| d.op == Op::Sanitize);
        // A command that fails anyway runs at its turn, without its data.
        let data_ready = transfer.is_none() || fail.is_some();
        let transfer_needed = transfer.is_some() && fail.is_none();
        let task = Task {
            cmd,
            cdb,
            data,
            transfer,
            fail,
            r2t_count: 0,
            reserved,
            forced,
            room,
            start_waiting: false,
            placed: None,
            streamed: None,
            streams: streams && transfer_needed,
            collecting: None,
        };
        if self
            .tasks
            .insert(itt, lun, attr, data_ready, exempt, task)
            .is_err()
        {
            unreachable!("checked above that the ITT is free");
        }
        if collect_now {
            self.begin_collecting(itt);
        }
        self.admit(cmd_sn, immediate, Ordered::Scsi(itt));
    }

    /// A SCSI command reached its turn in CmdSN order.
    pub(super) fn activate(&mut self, itt: u32) {
        if !self.tasks.admit(itt) {
            // Aborted before its turn: its place in the window is free, and
            // so is its ITT.
            self.window.complete();
            self.retired.remove(&itt);
            return;
        }
        // Buffers are granted in command order: a write's before its R2Ts,
        // a read's before it runs.
        let needs_buffer = self.tasks.get(itt).is_some_and(|t| {
            t.fail.is_none() && (t.transfer.is_some() || (t.cmd.read && t.cmd.expected_len > 0))
        });
        if needs_buffer {
            if self.awaiting.is_empty() && self.reserve(itt) {
                self.solicit(itt);
            } else {
                self.awaiting.push_back(itt);
            }
        }
        self.dispatch();
    }

    /// Send the R2Ts a collecting task may have outstanding.
    pub(super) fn solicit(&mut self, itt: u32) {
        let mut ttts = Vec::new();
        let Some(task) = self.tasks.get_mut(itt) else {
            return;
        };
        if task.room < task.cmd.expected_len as usize {
            // Its buffer is not reserved yet (it waits for the budget).
            return;
        }
        let Some(t) = &mut task.transfer else {
            return;
        };
        let mut next = self.next_ttt;
        let reqs = t.next_r2ts(|| {
            let v = next;
            next = next.wrapping_add(1);
            if next == RESERVED_TAG {
                next = 1;
            }
            ttts.push(v);
            v
        });
        self.next_ttt = next;
        task.r2t_count = t.r2t_count();
        let lun = task.cmd.lun;
        if !reqs.is_empty() {
            // The buffer is with the channel before any R2T goes out.
            self.register_write(itt);
        }
        for r in reqs {
            let r2t = pdu::R2t {
                lun,
                itt,
                ttt: r.ttt,
                stat_sn: self.stat_sn,
                exp_cmd_sn: self.window.exp_cmd_sn(),
                max_cmd_sn: self.window.max_cmd_sn(),
                r2t_sn: r.r2t_sn,
                buffer_offset: r.offset,
                desired_len: r.len,
            };
            self.send(Pdu::R2t(r2t), Bytes::new());
        }
    }

    /// One Data-Out; `placed_len` for a header whose data was placed into
    /// the task's registered buffer (its data segment's length).
    pub(super) fn on_data_out(&mut self, d: DataOut, data: Vec<u8>, placed_len: Option<u32>) {
        if self.tasks.is_aborted(d.itt) {
            // Its data is no longer wanted (it may still be running).
            return;
        }
        let admitted = self.tasks.is_admitted(d.itt);
        let Some(task) = self.tasks.get_mut(d.itt) else {
            // Data for a task that was aborted or failed: discard.
            return;
        };
        let Some(t) = &mut task.transfer else {
            return;
        };
        let len = placed_len.unwrap_or(data.len() as u32);
        let fail = match t.on_data_out(d.ttt, d.data_sn, d.buffer_offset, len, d.final_bit) {
            Ok(())
                if task.fail.is_none() && d.buffer_offset as usize + len as usize > task.room =>
            {
                // Data the target did not ask for and has no room for.
                Some("unsolicited Data-Out beyond the first burst".to_string())
            }
            Ok(()) if placed_len.is_some() && task.placed.is_none() => {
                Some("placed Data-Out for a write whose buffer is not registered".to_string())
            }
            Ok(()) => {
                let complete = t.is_complete();
                let placed = task.fail.is_none() && task.placed.is_some();
                let mut piece_error = None;
                if let Some(c) = &mut task.collecting {
                    piece_error = c.fill(d.buffer_offset as usize, &data).err();
                } else if task.fail.is_none() && !placed {
                    task.data.fill_at(d.buffer_offset as usize, &data);
                }
                if placed {
                    self.placed_data_out(d.itt, d.buffer_offset, data, placed_len);
                }
                let Some(task) = self.tasks.get_mut(d.itt) else {
                    return;
                };
                if let Some(e) = piece_error {
                    Some(format!("cut-through write: {e}"))
                } else if complete {
                    task.transfer = None;
                    if task.collecting.is_some() {
                        // Written as it came; the unit answers when the
                        // last pieces are.
                        self.end_collecting(d.itt, true);
                    } else if task.placed.is_some() {
                        // Ready once its buffer is back (`on_reclaimed`).
                        self.outputs.push_back(Output::Reclaim(d.itt));
                    } else {
                        self.tasks.set_data_ready(d.itt);
                        self.dispatch();
                    }
                    None
                } else {
                    if admitted && task.fail.is_none() {
                        self.solicit(d.itt);
                    }
                    None
                }
            }
            Err(e) => Some(format!("bad Data-Out: {e}")),
        };
        if let Some(why) = fail {
            warn!(
                session = self.setup.id,
                itt = d.itt,
                "{why}; failing the command"
            );
            self.forget_write(d.itt);
            if let Some(task) = self.tasks.get_mut(d.itt) {
                // ABORTED COMMAND / DATA PHASE ERROR ends the command at
                // once (a cut-through WRITE already running answers so
                // once its pieces in flight are done).
                task.fail = Some(check_condition(0x0b, 0x4b, 0x00));
                task.transfer = None;
            }
            self.end_collecting(d.itt, false);
            self.tasks.set_data_ready(d.itt);
            self.dispatch();
        }
    }

    /// Start every task the task set allows to run now.
    pub(super) fn dispatch(&mut self) {
        while let Some(itt) = self.tasks.next_startable() {
            self.start(itt);
        }
    }

    /// Hand a task whose turn has come to the target core's executor;
    /// its outcome comes back as [`Event::Done`].
    pub(super) fn start(&mut self, itt: u32) {
        let Some(task) = self.tasks.get_mut(itt) else {
            return;
        };
        if let Some(response) = task.fail.take() {
            self.internal.push_back(Event::Done(
                itt,
                Finished {
                    response,
                    preempted: Vec::new(),
                },
            ));
            return;
        }
        if task.cmd.read && task.reserved < task.cmd.expected_len as usize {
            // Its buffer waits for the budget; it runs when granted.
            task.start_waiting = true;
            return;
        }
        let target = self
            .setup
            .target
            .as_ref()
            .expect("SCSI tasks only in normal sessions");
        let lun = lun_from_wire(task.cmd.lun);
        let cmd = Command {
            nexus: self.setup.nexus,
            initiator: self.initiator.clone(),
            channel_level: self.setup.channel_level,
            lun,
            cdb: std::mem::take(&mut task.cdb),
            data: {
                let mut data = std::mem::take(&mut task.data);
                // A complete transfer filled every byte (WriteTransfer
                // accepts each offset once, in order); the buffer has its
                // full length whatever happened.
                if task.cmd.write && data.len() < task.room && task.collecting.is_none() {
                    data.resize(task.room);
                }
                data
            },
            expected_len: task.cmd.expected_len,
            tag: itt,
            started: self.now,
            // Large reads only: the target core splits nothing shorter.
            early: self
                .early
                .clone()
                .filter(|_| task.cmd.read && task.cmd.expected_len >= EARLY_MIN),
            // A cut-through WRITE: its data follows (`dataout`).
            stream: task.collecting.as_ref().map(|c| c.stream()),
        };
        let counting = Counting {
            lun: target.lun_counters(lun),
            initiator: Some(self.initiator_counters.clone()),
            session: Some(self.setup.counters.clone()),
        };
        self.outputs.push_back(Output::Execute {
            itt,
            target: target.scsi.clone(),
            cmd,
            counting,
        });
    }

    pub(super) fn on_done(&mut self, itt: u32, finished: Finished) {
        // Never before the last Data-Out of a write (RFC 7143 §11.7.1).
        let Some(finished) = self.defer_done(itt, finished) else {
            return;
        };
        if !self.abort_waiters.is_empty() {
            // Dropping a waiter whose tasks have all ended reports to the
            // session that asked for the abort.
            for (tags, _) in &mut self.abort_waiters {
                tags.retain(|t| *t != itt);
            }
            self.abort_waiters.retain(|(tags, _)| !tags.is_empty());
        }
        let Some(done) = self.tasks.complete(itt) else {
            return;
        };
        let mut task = done.payload;
        if done.admitted {
            self.window.complete();
        }
        // A write's buffer is gone with its execution; a read's goes with
        // its Data-In (released when sent).
        self.budget.release_forced(std::mem::take(&mut task.forced));
        if !task.cmd.read || done.aborted || finished.response.data_in.is_empty() {
            self.budget.release(std::mem::take(&mut task.reserved));
            self.retry_awaiting();
        }
        let resp = finished.response;
        if resp.status != ScsiStatus::Good {
            debug!(session = self.setup.id, itt = format_args!("{itt:#x}"), opcode = format_args!("{:#04x}", task.cmd.cdb[0]), status = ?resp.status, sense = %SenseSummary(&resp.sense), "command failed");
        }
        if !finished.preempted.is_empty() {
            self.abort_preempted(lun_from_wire(task.cmd.lun), finished.preempted);
        }
        if !done.aborted {
            self.respond(&mut task, resp);
        }
        for (req, response) in done.tmfs_done {
            self.send_tmf_response(req, response);
        }
        self.try_finish_logout();
        self.dispatch();
    }

    /// After a PERSISTENT RESERVE OUT: abort the tasks of the nexuses a
    /// PREEMPT AND ABORT preempted, in their sessions; they also get COMMANDS
    /// CLEARED BY ANOTHER INITIATOR.
    pub(super) fn abort_preempted(&mut self, lun: u64, preempted: Vec<Nexus>) {
        let Some(target) = self.setup.target.clone() else {
            return;
        };
        for victim in preempted {
            if victim == self.setup.nexus {
                continue;
            }
            let asked =
                self.registry
                    .abort_nexus_lun(self.setup.id, Some(&target.name), victim.0, lun);
            target.scsi.tasks_cleared(lun, victim, self.setup.nexus);
            debug!(
                session = self.setup.id,
                lun,
                sessions = asked,
                "PREEMPT AND ABORT: tasks aborted"
            );
        }
    }
}

/// Sense data for a log line: `KEY/ASCh/ASCQh` (`6/29h/00h`), from fixed
/// or descriptor format; `none` without sense data.
pub(super) struct SenseSummary<'a>(pub(super) &'a [u8]);

impl std::fmt::Display for SenseSummary<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.0;
        match ethersan_scsi::sense::Sense::parse(b).map(|s| s.triple()) {
            Some((key, asc, ascq)) => write!(f, "{key:x}/{asc:02x}h/{ascq:02x}h"),
            None if b.is_empty() => f.write_str("none"),
            None => write!(f, "{} bytes, unknown format", b.len()),
        }
    }
}

#[cfg(test)]
mod sense_summary_tests {
    use super::SenseSummary;

    #[test]
    fn sense_is_logged_as_key_asc_ascq() {
        let mut fixed = vec![0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x06;
        fixed[12] = 0x29;
        assert_eq!(SenseSummary(&fixed).to_string(), "6/29h/00h");
        assert_eq!(
            SenseSummary(&[0x72, 0x05, 0x24, 0x01]).to_string(),
            "5/24h/01h"
        );
        assert_eq!(SenseSummary(&[]).to_string(), "none");
    }
}
