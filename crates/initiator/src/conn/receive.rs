//! What the target sends, taken in (RFC 7143 §11.4–11.19, target to
//! initiator): the answers that complete requests, R2Ts that start a
//! Data-Out sequence, NOP-In, Reject and Async Message.

use bytes::Bytes;
use ethersan_proto::pdu::{Bhs, NopOut, Pdu, RawPdu, TextRequest, BHS_LEN, RESERVED_TAG};
use ethersan_proto::seq::sn_le;
use ethersan_proto::text::parse_text;

use super::data::DataOutSequence;
use super::{Answer, Connection, Output, Task};
use crate::{CommandResult, Error};

impl Connection {
    fn status_seen(&mut self, stat_sn: u32) {
        if sn_le(self.exp_stat_sn, stat_sn) {
            self.exp_stat_sn = stat_sn.wrapping_add(1);
        }
    }

    /// Take in one PDU; an error closes the connection.
    pub(super) fn on_pdu(&mut self, raw: RawPdu) -> Result<(), Error> {
        let pdu = Pdu::decode(&raw.bhs).map_err(|e| Error::Protocol(e.to_string()))?;
        match pdu {
            Pdu::DataIn(d) => {
                self.window.update(d.exp_cmd_sn, d.max_cmd_sn);
                let Some(Task::Command { read, .. }) = self.tasks.get_mut(&d.itt) else {
                    return Ok(());
                };
                read.place(d.buffer_offset, raw.data)?;
                if d.status_present {
                    self.status_seen(d.stat_sn);
                    let status = Status {
                        status: d.status,
                        residual: d.residual,
                        overflow: d.overflow,
                        underflow: d.underflow,
                    };
                    self.finish_command(d.itt, status, Vec::new(), 0);
                }
            }
            Pdu::ScsiResponse(r) => {
                self.window.update(r.exp_cmd_sn, r.max_cmd_sn);
                self.status_seen(r.stat_sn);
                let status = Status {
                    status: r.status,
                    residual: r.residual,
                    overflow: r.overflow,
                    underflow: r.underflow,
                };
                self.finish_command(r.itt, status, sense_of(raw.data), r.response);
            }
            Pdu::R2t(r) => {
                self.window.update(r.exp_cmd_sn, r.max_cmd_sn);
                let Some(Task::Command { data_out, lun, .. }) = self.tasks.get(&r.itt) else {
                    return Ok(());
                };
                let start = r.buffer_offset as usize;
                let seq = DataOutSequence::new(
                    data_out,
                    *lun,
                    r.itt,
                    r.ttt,
                    self.exp_stat_sn,
                    start,
                    start + r.desired_len as usize,
                    self.params.max_data_out_segment(),
                );
                self.outputs.extend(seq.map(Output::Send));
            }
            Pdu::NopIn(n) => {
                self.window.update(n.exp_cmd_sn, n.max_cmd_sn);
                if n.itt == RESERVED_TAG && n.ttt != RESERVED_TAG {
                    // Ping from the target: answer with the same TTT.
                    let nop = NopOut {
                        immediate: true,
                        lun: n.lun,
                        itt: RESERVED_TAG,
                        ttt: n.ttt,
                        cmd_sn: self.window.cmd_sn(),
                        exp_stat_sn: self.exp_stat_sn,
                    };
                    self.send(Pdu::NopOut(nop).encode(0), Vec::new(), Bytes::new());
                } else if n.itt != RESERVED_TAG {
                    self.status_seen(n.stat_sn);
                    if self.ping.is_some_and(|(itt, _)| itt == n.itt) {
                        self.ping = None;
                        self.tasks.remove(&n.itt);
                    }
                }
            }
            Pdu::TextResponse(t) => {
                self.window.update(t.exp_cmd_sn, t.max_cmd_sn);
                self.status_seen(t.stat_sn);
                let Some(Task::Text { collected, id }) = self.tasks.get_mut(&t.itt) else {
                    return Ok(());
                };
                if collected.is_empty() {
                    *collected = raw.data;
                } else {
                    collected.extend_from_slice(&raw.data);
                }
                if t.continue_bit || !t.final_bit {
                    // Ask for the rest with an empty request carrying the TTT.
                    let req = TextRequest {
                        immediate: true,
                        final_bit: true,
                        continue_bit: false,
                        lun: 0,
                        itt: t.itt,
                        ttt: t.ttt,
                        cmd_sn: self.window.cmd_sn(),
                        exp_stat_sn: self.exp_stat_sn,
                    };
                    self.send(Pdu::TextRequest(req).encode(0), Vec::new(), Bytes::new());
                } else {
                    let r = parse_text(collected, &Default::default())
                        .map(Answer::Text)
                        .map_err(|e| Error::Protocol(e.to_string()));
                    let id = *id;
                    self.tasks.remove(&t.itt);
                    self.complete(id, r);
                }
            }
            Pdu::LogoutResponse(l) => {
                self.status_seen(l.stat_sn);
                // Whatever it answers, the connection is over: closed
                // first, then the logout answered, then the rest fail.
                self.outputs.push_back(Output::Close(None));
                if let Some(Task::Logout { id }) = self.tasks.get(&l.itt) {
                    let id = *id;
                    self.tasks.remove(&l.itt);
                    let r = if l.response == 0 {
                        Ok(Answer::LoggedOut)
                    } else {
                        Err(Error::Protocol(format!("logout response {}", l.response)))
                    };
                    self.complete(id, r);
                }
                self.end(Error::Closed);
            }
            Pdu::Reject(r) => {
                self.status_seen(r.stat_sn);
                if raw.data.len() >= BHS_LEN {
                    let mut b = Bhs::default();
                    b.0.copy_from_slice(&raw.data[..BHS_LEN]);
                    if let Some(task) = self.tasks.remove(&b.itt()) {
                        match task.id() {
                            Some(id) => self.complete(id, Err(Error::Rejected(r.reason))),
                            None => self.ping = None,
                        }
                    }
                }
            }
            Pdu::AsyncMessage(a) => {
                self.status_seen(a.stat_sn);
                if (1..=3).contains(&a.event) {
                    return Err(Error::Protocol(format!(
                        "target asked to end the session (async event {})",
                        a.event
                    )));
                }
            }
            Pdu::TaskMgmtResponse(t) => {
                self.window.update(t.exp_cmd_sn, t.max_cmd_sn);
                self.status_seen(t.stat_sn);
                if let Some(Task::Tmf { id, aborts }) = self.tasks.get(&t.itt) {
                    let (id, aborts) = (*id, *aborts);
                    self.tasks.remove(&t.itt);
                    // The aborted task gets no answer of its own (§11.6.1):
                    // it ends here, whether the target aborted it or had
                    // already answered it.
                    if let Some(Task::Command { id: task, .. }) =
                        aborts.and_then(|a| self.tasks.remove(&a))
                    {
                        self.complete(task, Err(Error::Aborted));
                    }
                    self.complete(id, Ok(Answer::TaskManagement(t.response)));
                }
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected PDU from target: {other:?}"
                )))
            }
        }
        Ok(())
    }

    /// A command's status arrived (SCSI Response, or Data-In with S).
    fn finish_command(&mut self, itt: u32, s: Status, sense: Vec<u8>, response: u8) {
        if !matches!(self.tasks.get(&itt), Some(Task::Command { .. })) {
            return;
        }
        let Some(Task::Command { id, read, .. }) = self.tasks.remove(&itt) else {
            unreachable!("checked above");
        };
        if response != 0 {
            let e = Error::Protocol(format!("iSCSI response {response:#x}"));
            self.complete(id, Err(e));
            return;
        }
        let result = CommandResult {
            status: s.status,
            sense,
            data: read.finish(s.underflow, s.residual),
            residual: s.residual,
            overflow: s.overflow,
            underflow: s.underflow,
        };
        self.complete(id, Ok(Answer::Command(result)));
    }
}

/// The status fields of a SCSI Response or a Data-In with S.
struct Status {
    status: u8,
    residual: u32,
    overflow: bool,
    underflow: bool,
}

/// The sense data of a SCSI Response's data segment (§11.4.7.2: a 2-byte
/// length, then the sense), in the segment's own buffer.
fn sense_of(mut data: Vec<u8>) -> Vec<u8> {
    if data.len() < 2 {
        return Vec::new();
    }
    let n = u16::from_be_bytes([data[0], data[1]]) as usize;
    data.truncate((2 + n).min(data.len()));
    data.drain(..2);
    data
}
