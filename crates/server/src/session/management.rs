//! Task management, text requests and logout in the full feature phase
//! (RFC 7143 §11.5, §11.10, §11.14).

use bytes::Bytes;
use ethersan_core::task_set::AbortScope;
use ethersan_core::task_set::{Tmf, TmfResponse};
use ethersan_proto::pdu::{
    lun_from_wire, reject_reason, tmf_response, LogoutResponse, Pdu, TaskMgmtRequest,
    TaskMgmtResponse, TextRequest, TextResponse, TmfFunction, RESERVED_TAG,
};
use tracing::debug;

use super::Session;
use crate::wire::WriterMsg;

impl Session {
    pub(super) fn on_tmf(&mut self, t: TaskMgmtRequest) {
        let lun = lun_from_wire(t.lun);
        let target = self.setup.target.clone();
        let initiator = self.setup.params.initiator_name.as_str();
        let lun_exists = target.as_ref().is_some_and(|tg| {
            tg.scsi.visible_to(
                lun,
                ethersan_scsi::Requester {
                    initiator: Some(initiator),
                    channel_level: self.setup.channel_level,
                    early: None,
                    data_out: None,
                },
            )
        });
        let tmf = match t.function {
            TmfFunction::AbortTask => Tmf::AbortTask {
                lun,
                tag: t.referenced_task_tag,
            },
            TmfFunction::AbortTaskSet => Tmf::AbortTaskSet { lun },
            TmfFunction::ClearTaskSet => Tmf::ClearTaskSet { lun },
            TmfFunction::ClearAca => Tmf::ClearAca { lun },
            TmfFunction::LogicalUnitReset => Tmf::LogicalUnitReset { lun },
            TmfFunction::TargetWarmReset => Tmf::TargetWarmReset,
            TmfFunction::TargetColdReset => Tmf::TargetColdReset,
            TmfFunction::TaskReassign => {
                self.window.complete();
                return self.tmf_reply(&t, tmf_response::REASSIGN_NOT_SUPPORTED);
            }
            TmfFunction::Other(_) => {
                self.window.complete();
                return self.tmf_reply(&t, tmf_response::REJECTED);
            }
        };
        let itt = t.itt;
        let outcome = self.tasks.task_management(tmf, lun_exists, t);
        self.drop_awaiting();
        self.release(outcome.removed);
        self.abandon_aborted_streams();
        let name = target.as_ref().map(|t| t.name.as_str());
        let fx = outcome.effects;
        if let Some(on) = fx.abort_others {
            // The response also waits for the tasks this aborts in other
            // sessions (SAM-5 §7.6, §7.11).
            let asked = self.registry.abort_lun_others(self.setup.id, name, on, itt);
            if asked > 0 {
                self.others_aborting.insert(itt, (asked, None));
            }
        }
        if let (Some((kind, on)), Some(tg)) = (fx.reset, &target) {
            tg.scsi.reset(kind, on, self.setup.nexus);
        }
        if fx.end_sessions {
            // A cold reset drops every connection to the target, this one
            // too once the response has gone out.
            self.registry.shutdown_target_others(self.setup.id, name);
            self.closing = true;
            self.end_reason
                .get_or_insert("TARGET COLD RESET by this session");
        }
        if let Some(req) = outcome.done {
            self.send_tmf_response(req, outcome.response);
        }
        self.dispatch();
    }

    /// Answer a task management request whose own waits are over, once
    /// the other sessions it aborted tasks in have finished them too.
    pub(super) fn send_tmf_response(&mut self, req: TaskMgmtRequest, response: TmfResponse) {
        if let Some((_, ready)) = self.others_aborting.get_mut(&req.itt) {
            *ready = Some((req, response));
            return;
        }
        self.window.complete();
        let code = match response {
            TmfResponse::Complete => tmf_response::COMPLETE,
            TmfResponse::NoTask => tmf_response::NO_TASK,
            TmfResponse::NoLun => tmf_response::NO_LUN,
            TmfResponse::NotSupported => tmf_response::NOT_SUPPORTED,
        };
        self.tmf_reply(&req, code);
        if self.closing {
            self.outputs
                .push_back(super::Output::Send(WriterMsg::Close));
        }
    }

    /// Another session has finished the tasks it aborted for task
    /// management request `itt`.
    pub(super) fn other_session_aborted(&mut self, itt: u32) {
        let Some((left, _)) = self.others_aborting.get_mut(&itt) else {
            return;
        };
        *left = left.saturating_sub(1);
        if *left > 0 {
            return;
        }
        if let Some((_, Some((req, response)))) = self.others_aborting.remove(&itt) {
            self.send_tmf_response(req, response);
        }
    }

    pub(super) fn tmf_reply(&mut self, req: &TaskMgmtRequest, response: u8) {
        let r = TaskMgmtResponse {
            response,
            itt: req.itt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
        };
        self.send(Pdu::TaskMgmtResponse(r), Bytes::new());
    }

    pub(super) fn on_text(&mut self, t: TextRequest, data: Vec<u8>) {
        let max = self.setup.params.max_data_in_segment() as usize;
        // Continuation of a long response: an empty request with our TTT.
        let body = match self.text_continuation.take() {
            Some((ttt, rest)) if t.ttt == ttt && !t.continue_bit => rest,
            _ => {
                // The request's own text, possibly in pieces (C bit), at
                // most max_key_text_bytes in all.
                // A piece continues the request only if it carries the ITT
                // and the TTT we handed out for it (§11.10.4); anything
                // else (0xffffffff included) starts a new request.
                let mut asm = match self.text_in.take() {
                    Some((itt, ttt, asm)) if itt == t.itt && ttt == t.ttt => asm,
                    _ => ethersan_proto::text::TextAssembler::new(self.setup.options.max_key_text),
                };
                let data = match asm.push(&data, t.continue_bit) {
                    Ok(Some(all)) => all,
                    Ok(None) => {
                        // More to come: an empty answer with a TTT the
                        // initiator's next piece carries (§11.10.4).
                        let ttt = self.alloc_ttt();
                        self.text_in = Some((t.itt, ttt, asm));
                        let resp = TextResponse {
                            final_bit: false,
                            continue_bit: false,
                            lun: t.lun,
                            itt: t.itt,
                            ttt,
                            stat_sn: self.next_stat_sn(),
                            exp_cmd_sn: self.window.exp_cmd_sn(),
                            max_cmd_sn: self.window.max_cmd_sn(),
                        };
                        self.send(Pdu::TextResponse(resp), Bytes::new());
                        return;
                    }
                    Err(e) => {
                        // Too long (or an empty continued piece): Reject,
                        // "long operation reject — out of resources"
                        // (§11.17.1); the text is dropped.
                        debug!(%e, itt = t.itt, "text request refused");
                        let bhs = Pdu::TextRequest(t.clone()).encode(data.len() as u32);
                        let reason = match e {
                            ethersan_proto::text::TextError::TextTooLong(_) => {
                                reject_reason::LONG_OPERATION_REJECT
                            }
                            _ => reject_reason::PROTOCOL_ERROR,
                        };
                        self.reject(&bhs, reason);
                        return;
                    }
                };
                let pairs = ethersan_proto::text::parse_text(&data, &Default::default())
                    .unwrap_or_default();
                let mut out: Vec<(String, String)> = Vec::new();
                for (k, v) in pairs {
                    if k == "SendTargets" {
                        out.extend(self.registry.send_targets(
                            &v,
                            self.setup.target.as_deref(),
                            &self.setup.params.initiator_name,
                            self.setup.peer_ip,
                            self.setup.local_addr,
                        ));
                    } else {
                        out.push((k, "NotUnderstood".to_string()));
                    }
                }
                ethersan_proto::text::encode_text(&out)
            }
        };
        let (chunk, rest) = if body.len() > max {
            (body[..max].to_vec(), Some(body[max..].to_vec()))
        } else {
            (body, None)
        };
        let more = rest.is_some();
        let ttt = if more { self.alloc_ttt() } else { RESERVED_TAG };
        if let Some(rest) = rest {
            self.text_continuation = Some((ttt, rest));
        }
        let resp = TextResponse {
            final_bit: !more,
            continue_bit: more,
            lun: t.lun,
            itt: t.itt,
            ttt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
        };
        self.send(Pdu::TextResponse(resp), Bytes::from(chunk));
    }

    pub(super) fn try_finish_logout(&mut self) {
        if self.tasks.running() > 0 || self.pending_logout.is_none() {
            return;
        }
        let l = self.pending_logout.take().expect("checked");
        // Every other task of the session ends with the logout (§11.14).
        self.abort_tasks(AbortScope::All);
        self.window.complete();
        let resp = LogoutResponse {
            response: 0,
            itt: l.itt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
            time2wait: 0,
            time2retain: 0,
        };
        self.send(Pdu::LogoutResponse(resp), Bytes::new());
        self.closing = true;
    }
}
