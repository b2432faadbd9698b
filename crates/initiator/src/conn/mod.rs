//! The full feature phase of one connection, initiator side (RFC 7143
//! §4, §11), as a state machine that does no I/O, in the manner of
//! quinn-proto and of the target's own session (`ethersan-server`'s
//! `session` module).
//!
//! [`Connection::handle`] applies one [`Event`] — a request from a
//! caller, a PDU from the target, a broken connection, a timer — with the
//! time passed in; [`Connection::poll_output`] then hands out what to do
//! ([`Output`]): PDUs to send, answers for callers, the connection to
//! close. [`Connection::poll_timeout`] says when it next wants to be woken
//! (a request's deadline, a NOP-Out ping). The tokio driver (`session`)
//! pumps it; unit tests drive it with made-up PDUs (`tests`) and against
//! the target's session in memory (`ethersan-server`'s `session::pair`).
//!
//! What it keeps: the CmdSN window ([`CmdSnWindow`], §4.2.2.1), ExpStatSN,
//! the ITTs of the tasks in flight, each write's Data-Out (the unsolicited
//! burst and each R2T's sequence, one implementation in `data`), each
//! read's Data-In placed into the caller's buffer, Text continuation,
//! task management and NOP-Out/NOP-In.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ethersan_proto::negotiate::SessionParams;
use ethersan_proto::pdu::{
    self, lun_to_wire, Bhs, LogoutRequest, NopOut, Pdu, RawPdu, ScsiCommand, TaskAttr,
    TaskMgmtRequest, TextRequest, TmfFunction, RESERVED_TAG,
};
use ethersan_proto::seq::CmdSnWindow;
use ethersan_proto::text::encode_text;

use crate::{CommandResult, Error, Phase};
use data::{DataOutSequence, ReadBuffer};

mod data;
mod receive;
#[cfg(test)]
mod tests;

/// The caller's name for one request; its [`Output::Complete`] carries
/// it. The driver chooses them (each once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestId(pub u64);

/// What a caller asks of the target.
#[derive(Debug)]
pub enum Request {
    /// A SCSI command.
    Command {
        /// The LUN (as a number; encoded here).
        lun: u64,
        /// The CDB (longer than 16 bytes: an extended CDB AHS).
        cdb: Vec<u8>,
        /// Data for the target (a write); sent as immediate data, as
        /// unsolicited Data-Out and in answer to R2Ts, without a copy.
        data_out: Bytes,
        /// Data-In expected (a read).
        read_len: u32,
        /// Where the Data-In goes: its capacity is reused, its contents
        /// dropped. Room for `read_len` is reserved, never zeroed.
        buffer: Vec<u8>,
    },
    /// A Text request (e.g. `SendTargets=All`).
    Text(Vec<(String, String)>),
    /// A task management function for a LUN (not ABORT TASK).
    TaskManagement {
        /// The function.
        function: TmfFunction,
        /// The LUN.
        lun: u64,
    },
    /// ABORT TASK for an earlier command of this connection. When the
    /// target answers, that command completes with [`Error::Aborted`].
    AbortTask {
        /// The command to abort.
        task: RequestId,
    },
    /// Logout (close the session).
    Logout,
}

impl Request {
    /// What a timeout of this request says was waiting.
    fn phase(&self) -> Phase {
        match self {
            Request::Command { cdb, .. } => Phase::Command {
                opcode: cdb.first().copied().unwrap_or(0),
            },
            Request::Text(_) => Phase::Text,
            Request::TaskManagement { .. } | Request::AbortTask { .. } => Phase::TaskManagement,
            Request::Logout => Phase::Logout,
        }
    }
}

/// The answer to a [`Request`].
#[derive(Debug)]
pub enum Answer {
    /// A SCSI command's outcome.
    Command(CommandResult),
    /// A Text request's answer.
    Text(Vec<(String, String)>),
    /// A task management function's response code
    /// (`ethersan_proto::pdu::tmf_response`).
    TaskManagement(u8),
    /// The logout was accepted; the connection is to close.
    LoggedOut,
}

/// What the connection reacts to.
#[derive(Debug)]
pub enum Event {
    /// A caller's request.
    Submit(RequestId, Request),
    /// A PDU from the target.
    Pdu(RawPdu),
    /// Reading or writing failed: the connection is gone.
    Failed(Error),
    /// The time [`Connection::poll_timeout`] asked for has come.
    Timer,
}

/// One PDU to send: the framer adds digests and padding.
#[derive(Debug, Clone)]
pub struct Transmit {
    /// The header.
    pub bhs: Bhs,
    /// Additional header segments (an extended CDB).
    pub ahs: Vec<u8>,
    /// The data segment (a slice of a caller's buffer for Data-Out).
    pub data: Bytes,
}

/// What the connection asks its driver to do, in order.
#[derive(Debug)]
pub enum Output {
    /// Send this PDU.
    Send(Transmit),
    /// Hand this answer to the request's caller.
    Complete(RequestId, Result<Answer, Error>),
    /// Close the connection: after a logout (`None`; outputs before this
    /// are to be sent first) or because of this error.
    Close(Option<Error>),
}

/// The connection's timers.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long each request may wait for its answer (`None`: forever);
    /// when one times out the connection closes and every request fails
    /// with [`Error::Timeout`].
    pub timeout: Option<Duration>,
    /// After this long without a PDU from the target, ping it with a
    /// NOP-Out (`None`: never).
    pub nop_interval: Option<Duration>,
    /// How long a ping may wait for its NOP-In before the connection
    /// closes ([`Phase::Ping`]).
    pub nop_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Some(crate::DEFAULT_TIMEOUT),
            nop_interval: None,
            nop_timeout: Duration::from_secs(10),
        }
    }
}

/// A request sent and waiting for the target.
#[derive(Debug)]
enum Task {
    Command {
        id: RequestId,
        /// The LUN in its wire form.
        lun: u64,
        cmd_sn: u32,
        data_out: Bytes,
        read: ReadBuffer,
    },
    Text {
        id: RequestId,
        collected: Vec<u8>,
    },
    Tmf {
        id: RequestId,
        /// ABORT TASK: the ITT of the task it aborts.
        aborts: Option<u32>,
    },
    Logout {
        id: RequestId,
    },
    /// Our NOP-Out ping.
    Ping,
}

impl Task {
    fn id(&self) -> Option<RequestId> {
        match self {
            Task::Command { id, .. }
            | Task::Text { id, .. }
            | Task::Tmf { id, .. }
            | Task::Logout { id } => Some(*id),
            Task::Ping => None,
        }
    }
}

/// A request not yet answered: what a timeout of it says, and its ITT
/// once sent.
#[derive(Debug)]
struct Live {
    phase: Phase,
    itt: Option<u32>,
}

/// One connection's state in its full feature phase.
#[derive(Debug)]
pub struct Connection {
    params: SessionParams,
    config: Config,
    window: CmdSnWindow,
    exp_stat_sn: u32,
    next_itt: u32,
    /// Requests waiting for the CmdSN window to open, in arrival order.
    queued: VecDeque<(RequestId, Request)>,
    /// Requests sent, by ITT.
    tasks: HashMap<u32, Task>,
    /// Every request not yet answered.
    live: HashMap<RequestId, Live>,
    /// Requests' deadlines in arrival order (the timeout is the same for
    /// all, so the oldest live one is the earliest).
    deadlines: VecDeque<(Instant, RequestId)>,
    outputs: VecDeque<Output>,
    /// When the last PDU came from the target.
    last_rx: Instant,
    /// Our ping in flight: its ITT and deadline.
    ping: Option<(u32, Instant)>,
    /// Why the connection closed, once it has.
    closed: Option<Error>,
}

impl Connection {
    /// A connection in its full feature phase, as login left it: the
    /// negotiated `params`, the CmdSN `window` and the ExpStatSN the
    /// Login Response gave.
    pub fn new(
        params: SessionParams,
        window: CmdSnWindow,
        exp_stat_sn: u32,
        config: Config,
        now: Instant,
    ) -> Connection {
        Connection {
            params,
            config,
            window,
            exp_stat_sn,
            next_itt: 1,
            queued: VecDeque::new(),
            tasks: HashMap::new(),
            live: HashMap::new(),
            deadlines: VecDeque::new(),
            outputs: VecDeque::new(),
            last_rx: now,
            ping: None,
            closed: None,
        }
    }

    /// The negotiated parameters.
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// The CmdSN window as it stands.
    pub fn window(&self) -> CmdSnWindow {
        self.window
    }

    /// The ExpStatSN the next PDU carries.
    pub fn exp_stat_sn(&self) -> u32 {
        self.exp_stat_sn
    }

    /// Whether the connection closed (logout done, or failed).
    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// Whether the task with this ITT was sent and is not over (answered,
    /// aborted or timed out).
    pub fn has_task(&self, itt: u32) -> bool {
        self.tasks.contains_key(&itt)
    }

    /// Whether no request waits for an answer (queued or sent).
    pub fn is_idle(&self) -> bool {
        self.live.is_empty()
    }

    /// Apply one event at time `now`.
    pub fn handle(&mut self, ev: Event, now: Instant) {
        if let Some(why) = &self.closed {
            if let Event::Submit(id, _) = ev {
                let why = why.clone();
                self.outputs.push_back(Output::Complete(id, Err(why)));
            }
            return;
        }
        match ev {
            Event::Submit(id, req) => {
                if let Some(after) = self.config.timeout {
                    self.deadlines.push_back((now + after, id));
                }
                let phase = req.phase();
                self.live.insert(id, Live { phase, itt: None });
                self.queued.push_back((id, req));
            }
            Event::Pdu(raw) => {
                self.last_rx = now;
                if let Err(e) = self.on_pdu(raw) {
                    self.fail(e);
                }
            }
            Event::Failed(e) => self.fail(e),
            Event::Timer => {}
        }
        if self.closed.is_none() {
            self.pump();
            self.check_timers(now);
        }
    }

    /// The next thing to do, in order.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// When the connection next wants [`Event::Timer`] (`None`: not until
    /// something else happens).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed.is_some() {
            return None;
        }
        let request = self.deadlines.front().map(|(d, _)| *d);
        let ping = match (self.ping, self.config.nop_interval) {
            (Some((_, d)), _) => Some(d),
            (None, Some(every)) => Some(self.last_rx + every),
            (None, None) => None,
        };
        match (request, ping) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn alloc_itt(&mut self) -> u32 {
        let i = self.next_itt;
        self.next_itt = self.next_itt.wrapping_add(1);
        if self.next_itt == RESERVED_TAG {
            self.next_itt = 1;
        }
        i
    }

    fn send(&mut self, bhs: Bhs, ahs: Vec<u8>, data: Bytes) {
        self.outputs
            .push_back(Output::Send(Transmit { bhs, ahs, data }));
    }

    fn complete(&mut self, id: RequestId, r: Result<Answer, Error>) {
        self.live.remove(&id);
        self.outputs.push_back(Output::Complete(id, r));
    }

    /// Close for `err`: every request still waiting fails with it.
    fn fail(&mut self, err: Error) {
        if self.closed.is_some() {
            return;
        }
        self.outputs.push_back(Output::Close(Some(err.clone())));
        self.end(err);
    }

    /// The connection is over: requests still waiting fail with `err`.
    fn end(&mut self, err: Error) {
        self.closed = Some(err.clone());
        let mut ids: Vec<RequestId> = self.tasks.drain().filter_map(|(_, t)| t.id()).collect();
        ids.extend(self.queued.drain(..).map(|(id, _)| id));
        for id in ids {
            self.complete(id, Err(err.clone()));
        }
        self.live.clear();
        self.deadlines.clear();
        self.ping = None;
    }

    /// Send queued requests while the CmdSN window allows (immediate
    /// ones too wait their turn, as they always have here).
    fn pump(&mut self) {
        while self.window.is_open() {
            let Some((id, req)) = self.queued.pop_front() else {
                break;
            };
            self.send_request(id, req);
        }
    }

    fn send_request(&mut self, id: RequestId, req: Request) {
        let itt = self.alloc_itt();
        let task = match req {
            Request::Command {
                lun,
                cdb,
                data_out,
                read_len,
                buffer,
            } => self.send_command(itt, id, lun, &cdb, data_out, read_len, buffer),
            Request::Text(keys) => {
                let data = encode_text(&keys);
                let t = TextRequest {
                    immediate: false,
                    final_bit: true,
                    continue_bit: false,
                    lun: 0,
                    itt,
                    ttt: RESERVED_TAG,
                    cmd_sn: self.take_cmd_sn(),
                    exp_stat_sn: self.exp_stat_sn,
                };
                let bhs = Pdu::TextRequest(t).encode(data.len() as u32);
                self.send(bhs, Vec::new(), Bytes::from(data));
                Task::Text {
                    id,
                    collected: Vec::new(),
                }
            }
            Request::TaskManagement { function, lun } => {
                let cmd_sn = self.window.cmd_sn();
                self.send_tmf(function, lun_to_wire(lun), itt, RESERVED_TAG, cmd_sn);
                Task::Tmf { id, aborts: None }
            }
            Request::AbortTask { task } => {
                let target = self.live.get(&task).and_then(|l| l.itt);
                match target.and_then(|t| self.tasks.get(&t).map(|x| (t, x))) {
                    Some((t, Task::Command { lun, cmd_sn, .. })) => {
                        let (lun, cmd_sn) = (*lun, *cmd_sn);
                        self.send_tmf(TmfFunction::AbortTask, lun, itt, t, cmd_sn);
                        Task::Tmf {
                            id,
                            aborts: Some(t),
                        }
                    }
                    _ => {
                        // Not sent yet: it never will be. Gone already
                        // (answered): there is nothing to abort.
                        let queued = self.queued.iter().position(|(q, _)| *q == task);
                        let code = match queued {
                            Some(i) => {
                                self.queued.remove(i);
                                self.complete(task, Err(Error::Aborted));
                                pdu::tmf_response::COMPLETE
                            }
                            None => pdu::tmf_response::NO_TASK,
                        };
                        self.complete(id, Ok(Answer::TaskManagement(code)));
                        return;
                    }
                }
            }
            Request::Logout => {
                let l = LogoutRequest {
                    immediate: true,
                    reason: 0,
                    itt,
                    cid: 0,
                    cmd_sn: self.window.cmd_sn(),
                    exp_stat_sn: self.exp_stat_sn,
                };
                self.send(Pdu::LogoutRequest(l).encode(0), Vec::new(), Bytes::new());
                Task::Logout { id }
            }
        };
        if let Some(l) = self.live.get_mut(&id) {
            l.itt = Some(itt);
        }
        self.tasks.insert(itt, task);
    }

    fn take_cmd_sn(&mut self) -> u32 {
        self.window
            .take()
            .expect("sent only while the window is open")
    }

    fn send_tmf(&mut self, function: TmfFunction, lun: u64, itt: u32, referenced: u32, sn: u32) {
        let t = TaskMgmtRequest {
            immediate: true,
            function,
            lun,
            itt,
            referenced_task_tag: referenced,
            cmd_sn: self.window.cmd_sn(),
            exp_stat_sn: self.exp_stat_sn,
            ref_cmd_sn: sn,
            exp_data_sn: 0,
        };
        self.send(Pdu::TaskMgmtRequest(t).encode(0), Vec::new(), Bytes::new());
    }

    /// The SCSI Command PDU with its immediate data, then the unsolicited
    /// Data-Out up to FirstBurstLength (§4.2.5.2).
    #[allow(clippy::too_many_arguments)]
    fn send_command(
        &mut self,
        itt: u32,
        id: RequestId,
        lun: u64,
        cdb: &[u8],
        data_out: Bytes,
        read_len: u32,
        buffer: Vec<u8>,
    ) -> Task {
        let cmd_sn = self.take_cmd_sn();
        let wire_lun = lun_to_wire(lun);
        let p = &self.params;
        let edtl = if data_out.is_empty() {
            read_len
        } else {
            data_out.len() as u32
        };
        let immediate = if p.immediate_data {
            data_out
                .len()
                .min(p.first_burst_length as usize)
                .min(p.max_data_out_segment() as usize)
        } else {
            0
        };
        let unsolicited_end = if p.initial_r2t {
            immediate
        } else {
            data_out.len().min(p.first_burst_length as usize)
        };
        let mut cdb16 = [0u8; 16];
        let n = cdb.len().min(16);
        cdb16[..n].copy_from_slice(&cdb[..n]);
        let cmd = ScsiCommand {
            immediate: false,
            final_bit: unsolicited_end == immediate,
            read: read_len > 0,
            write: !data_out.is_empty(),
            attr: TaskAttr::Simple,
            lun: wire_lun,
            itt,
            expected_len: edtl,
            cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: cdb16,
        };
        // The framer sets TotalAHSLength from the AHS.
        let ahs = pdu::extended_cdb_ahs(cdb);
        let bhs = Pdu::ScsiCommand(cmd).encode(immediate as u32);
        self.send(bhs, ahs, data_out.slice(..immediate));
        let max_segment = self.params.max_data_out_segment();
        let unsolicited = DataOutSequence::new(
            &data_out,
            wire_lun,
            itt,
            RESERVED_TAG,
            self.exp_stat_sn,
            immediate,
            unsolicited_end,
            max_segment,
        );
        self.outputs.extend(unsolicited.map(Output::Send));
        Task::Command {
            id,
            lun: wire_lun,
            cmd_sn,
            data_out,
            read: ReadBuffer::new(buffer, read_len),
        }
    }

    /// Time out requests and pings; ping an idle target.
    fn check_timers(&mut self, now: Instant) {
        while let Some((_, id)) = self.deadlines.front() {
            if self.live.contains_key(id) {
                break;
            }
            self.deadlines.pop_front();
        }
        if let (Some((d, id)), Some(after)) = (self.deadlines.front(), self.config.timeout) {
            if *d <= now {
                let phase = self.live[id].phase.clone();
                self.fail(Error::Timeout { phase, after });
                return;
            }
        }
        match (self.ping, self.config.nop_interval) {
            (Some((_, d)), _) if d <= now => {
                let after = self.config.nop_timeout;
                self.fail(Error::Timeout {
                    phase: Phase::Ping,
                    after,
                });
            }
            (None, Some(every)) if self.last_rx + every <= now => {
                let itt = self.alloc_itt();
                let nop = NopOut {
                    immediate: true,
                    lun: 0,
                    itt,
                    ttt: RESERVED_TAG,
                    cmd_sn: self.window.cmd_sn(),
                    exp_stat_sn: self.exp_stat_sn,
                };
                self.send(Pdu::NopOut(nop).encode(0), Vec::new(), Bytes::new());
                self.tasks.insert(itt, Task::Ping);
                self.ping = Some((itt, now + self.config.nop_timeout));
            }
            _ => {}
        }
    }
}
