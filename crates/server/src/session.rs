//! The full feature phase of one session (RFC 7143 §4, §11).
//!
//! One task owns all of a session's state. It waits for the next event
//! (a PDU from the reader task, a finished command from the blocking pool,
//! a control message from another session, a timer) and applies it
//! synchronously: `loop { let ev = self.select().await; self.apply(ev) }`.
//! The only lock it touches is the registry's, and only on login,
//! logout and task-management resets.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ethersan_core::budget::MemoryBudget;
use ethersan_core::counters::IoCounters;
use ethersan_core::executor::{
    check_condition, BlockingPool, Command, Counting, Executor, Finished,
};
use ethersan_core::task_set::{
    AbortScope, Removed, TaskAttr as SamAttr, TaskSet, Tmf, TmfResponse,
};
use ethersan_proto::pdu::{
    self, lun_from_wire, reject_reason, tmf_response, DataIn, DataOut, LogoutRequest,
    LogoutResponse, NopIn, NopOut, Pdu, RawPdu, Reject, ScsiCommand, TaskAttr, TaskMgmtRequest,
    TaskMgmtResponse, TextRequest, TextResponse, TmfFunction, RESERVED_TAG,
};
use ethersan_proto::seq::{Admission, CmdWindow};
use ethersan_proto::transfer::{data_in_segments, TransferLimits, WriteTransfer};
use ethersan_scsi::commands::Op;
use ethersan_scsi::{Nexus, ScsiResponse, ScsiStatus};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::registry::{Registry, SessionControl, TargetEntry};
use crate::wire::{Frame, ReadError, WriterMsg};

/// Largest Expected Data Transfer Length accepted for one command; larger
/// commands are refused with CHECK CONDITION instead of buffering them.
pub(crate) const MAX_EDTL: u32 = 64 << 20;

/// The values negotiated at login that the full feature phase needs.
#[derive(Debug, Clone)]
pub(crate) struct Negotiated {
    /// What we may send per PDU (the initiator's declaration).
    pub(crate) max_send_dsl: u32,
    pub(crate) initial_r2t: bool,
    pub(crate) immediate_data: bool,
    pub(crate) first_burst_length: u32,
    pub(crate) max_burst_length: u32,
    pub(crate) max_outstanding_r2t: u32,
    pub(crate) discovery: bool,
    pub(crate) initiator_name: String,
}

/// Runtime knobs of a session.
#[derive(Debug, Clone)]
pub(crate) struct SessionOptions {
    pub(crate) queue_depth: u32,
    pub(crate) nop_interval: Option<Duration>,
    pub(crate) nop_timeout: Duration,
    /// Try commands on the session task before the blocking pool.
    pub(crate) inline_io: bool,
    /// Most bytes of key text one Text request may send, across its
    /// Continue PDUs.
    pub(crate) max_key_text: usize,
    /// Most bytes of command data buffers the session holds at once.
    pub(crate) memory_budget: usize,
}

/// Everything a session needs from its login.
#[derive(Debug)]
pub(crate) struct SessionSetup {
    pub(crate) id: u64,
    pub(crate) target: Option<Arc<TargetEntry>>,
    pub(crate) params: Negotiated,
    pub(crate) nexus: Nexus,
    pub(crate) exp_cmd_sn: u32,
    pub(crate) stat_sn: u32,
    pub(crate) options: SessionOptions,
    /// The initiator's address (for access lists).
    pub(crate) peer_ip: Option<std::net::IpAddr>,
}

/// Events the session loop reacts to.
#[derive(Debug)]
pub(crate) enum Event {
    /// A PDU arrived, or reading failed.
    Pdu(Result<RawPdu, ReadError>),
    /// A command finished executing.
    Done(u32, Finished),
    /// A message from the registry (another session's TMF, shutdown).
    Control(SessionControl),
    /// Periodic timer for NOP-In pings.
    Tick,
    /// A read's Data-In has been sent: its buffer's bytes are free.
    Released(usize),
}

/// The iSCSI side of one task; the task set ([`TaskSet`]) owns it and
/// decides when it runs.
#[derive(Debug)]
struct Task {
    cmd: ScsiCommand,
    cdb: Vec<u8>,
    data: Vec<u8>,
    /// A write still collecting Data-Out.
    transfer: Option<WriteTransfer>,
    /// The command must fail with this sense instead of running.
    fail: Option<ScsiResponse>,
    /// R2Ts sent for this task (ExpDataSN of a write's response).
    r2t_count: u32,
    /// Bytes of the session's memory budget this task's buffer holds.
    reserved: usize,
}

/// What a task waits for when its buffer does not fit the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// A write's buffer, before its R2Ts go out.
    Solicit,
    /// A read's buffer, before it runs.
    Start,
}

/// Items ordered by the CmdSN window.
#[derive(Debug)]
enum Ordered {
    Scsi(u32),
    Nop(NopOut, Vec<u8>),
    Tmf(TaskMgmtRequest),
    Text(TextRequest, Vec<u8>),
    Logout(LogoutRequest),
}

/// One session's state, owned by its task.
pub(crate) struct Session {
    setup: SessionSetup,
    registry: Arc<Registry>,
    out: mpsc::UnboundedSender<WriterMsg>,
    done_tx: mpsc::UnboundedSender<Event>,
    window: CmdWindow<Ordered>,
    stat_sn: u32,
    /// The SAM task set: every task of the session, in command order.
    tasks: TaskSet<Task, TaskMgmtRequest>,
    /// Runs the session's commands.
    executor: Executor,
    /// The initiator's name, shared with every command.
    initiator: Arc<str>,
    /// The initiator's counters.
    initiator_counters: Arc<IoCounters>,
    /// Data buffers held by this session's commands.
    budget: MemoryBudget,
    /// Tasks waiting for room in the budget, oldest first.
    awaiting: VecDeque<(u32, Need)>,
    next_ttt: u32,
    pending_logout: Option<LogoutRequest>,
    last_rx: Instant,
    ping: Option<(u32, Instant)>,
    text_continuation: Option<(u32, Vec<u8>)>,
    /// A Text request arriving in pieces (C bit): its ITT and the text so far.
    text_in: Option<(u32, u32, ethersan_proto::text::TextAssembler)>,
    closing: bool,
}

impl Session {
    pub(crate) fn new(
        setup: SessionSetup,
        registry: Arc<Registry>,
        out: mpsc::UnboundedSender<WriterMsg>,
        done_tx: mpsc::UnboundedSender<Event>,
    ) -> Self {
        let window = CmdWindow::new(setup.exp_cmd_sn, setup.options.queue_depth);
        let stat_sn = setup.stat_sn;
        let executor = Executor {
            inline_io: setup.options.inline_io,
        };
        let initiator: Arc<str> = Arc::from(setup.params.initiator_name.as_str());
        let initiator_counters = registry.directory().initiator_counters(&initiator);
        let budget = MemoryBudget::new(setup.options.memory_budget);
        Session {
            setup,
            registry,
            out,
            done_tx,
            window,
            stat_sn,
            tasks: TaskSet::new(),
            executor,
            initiator,
            initiator_counters,
            budget,
            awaiting: VecDeque::new(),
            next_ttt: 1,
            pending_logout: None,
            last_rx: Instant::now(),
            ping: None,
            text_continuation: None,
            text_in: None,
            closing: false,
        }
    }

    /// Run until logout, connection loss or shutdown.
    ///
    /// `pdus` is bounded: while the session is busy the reader stops
    /// reading and TCP's window pushes back on the initiator. `events`
    /// (completions, control messages, timers) comes first.
    pub(crate) async fn run(
        mut self,
        mut events: mpsc::UnboundedReceiver<Event>,
        mut pdus: mpsc::Receiver<Result<RawPdu, ReadError>>,
    ) {
        if let Some(t) = &self.setup.target {
            t.scsi.nexus_added(self.setup.nexus);
            t.scsi
                .set_initiator_name(self.setup.nexus, &self.setup.params.initiator_name);
        }
        let mut reading = true;
        loop {
            let ev = tokio::select! {
                biased;
                ev = events.recv() => match ev {
                    Some(ev) => ev,
                    None => break,
                },
                pdu = pdus.recv(), if reading => match pdu {
                    Some(pdu) => Event::Pdu(pdu),
                    None => {
                        reading = false;
                        continue;
                    }
                },
            };
            if !self.apply(ev) {
                break;
            }
        }
        self.teardown(&mut events).await;
    }

    /// Apply one event; false ends the session.
    fn apply(&mut self, ev: Event) -> bool {
        match ev {
            Event::Pdu(Ok(pdu)) => {
                self.last_rx = Instant::now();
                self.on_pdu(pdu)
            }
            Event::Pdu(Err(e)) => self.on_read_error(e),
            Event::Done(itt, resp) => {
                self.on_done(itt, resp);
                !self.closing
            }
            Event::Control(SessionControl::AbortLun(lun)) => {
                self.abort_tasks(lun.map_or(AbortScope::All, AbortScope::Lun));
                self.dispatch();
                true
            }
            Event::Control(SessionControl::Shutdown) => {
                info!(session = self.setup.id, "session shut down");
                self.abort_tasks(AbortScope::All);
                false
            }
            Event::Tick => self.on_tick(),
            Event::Released(n) => {
                self.budget.release(n);
                self.retry_awaiting();
                true
            }
        }
    }

    async fn teardown(&mut self, events: &mut mpsc::UnboundedReceiver<Event>) {
        // Let commands already in the blocking pool finish so no write is
        // left half-applied behind the initiator's back.
        self.abort_tasks(AbortScope::All);
        while self.tasks.running() > 0 {
            match events.recv().await {
                Some(Event::Done(itt, _)) => {
                    self.tasks.complete(itt);
                }
                Some(_) => {}
                None => break,
            }
        }
        if let Some(t) = &self.setup.target {
            t.scsi.nexus_lost(self.setup.nexus);
        }
        self.registry.remove_session(self.setup.id);
        let _ = self.out.send(WriterMsg::Close);
    }

    fn on_read_error(&mut self, e: ReadError) -> bool {
        match e {
            ReadError::Closed => {
                debug!(session = self.setup.id, "connection closed by initiator");
                false
            }
            ReadError::Io(err) => {
                debug!(session = self.setup.id, %err, "connection lost");
                false
            }
            ReadError::HeaderDigest(err) => {
                warn!(session = self.setup.id, %err, "header digest error; dropping connection");
                false
            }
            ReadError::DataDigest(bhs, err) => {
                warn!(session = self.setup.id, %err, "data digest error; PDU rejected");
                self.reject(&bhs, reject_reason::DATA_DIGEST_ERROR);
                true
            }
            ReadError::TooLong { bhs, len, limit } => {
                warn!(
                    session = self.setup.id,
                    len, limit, "data segment over MaxRecvDataSegmentLength"
                );
                self.reject(&bhs, reject_reason::PROTOCOL_ERROR);
                true
            }
        }
    }

    fn on_tick(&mut self) -> bool {
        let Some(interval) = self.setup.options.nop_interval else {
            return true;
        };
        if let Some((_, sent)) = self.ping {
            if sent.elapsed() > self.setup.options.nop_timeout {
                warn!(
                    session = self.setup.id,
                    "initiator did not answer NOP-In; dropping connection"
                );
                return false;
            }
            return true;
        }
        if self.last_rx.elapsed() >= interval {
            let ttt = self.alloc_ttt();
            self.ping = Some((ttt, Instant::now()));
            let nop = NopIn {
                lun: 0,
                itt: RESERVED_TAG,
                ttt,
                stat_sn: self.stat_sn,
                exp_cmd_sn: self.window.exp_cmd_sn(),
                max_cmd_sn: self.window.max_cmd_sn(),
            };
            self.send(Pdu::NopIn(nop), Bytes::new());
        }
        true
    }

    fn alloc_ttt(&mut self) -> u32 {
        let t = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        t
    }

    fn send(&self, pdu: Pdu, data: Bytes) {
        let bhs = pdu.encode(data.len() as u32);
        let _ = self.out.send(WriterMsg::Frame(Frame { bhs, data }));
    }

    /// Take the next StatSN for a response.
    fn next_stat_sn(&mut self) -> u32 {
        let s = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        s
    }

    fn reject(&mut self, bhs: &pdu::Bhs, reason: u8) {
        let rej = Reject {
            reason,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
            data_sn: 0,
        };
        self.send(Pdu::Reject(rej), Bytes::copy_from_slice(&bhs.0));
    }

    fn on_pdu(&mut self, raw: RawPdu) -> bool {
        let pdu = match Pdu::decode(&raw.bhs) {
            Ok(p) => p,
            Err(_) => {
                self.reject(&raw.bhs, reject_reason::COMMAND_NOT_SUPPORTED);
                return true;
            }
        };
        if self.setup.params.discovery
            && !matches!(
                pdu,
                Pdu::TextRequest(_) | Pdu::LogoutRequest(_) | Pdu::NopOut(_)
            )
        {
            self.reject(&raw.bhs, reject_reason::PROTOCOL_ERROR);
            return true;
        }
        match pdu {
            Pdu::ScsiCommand(cmd) => self.on_scsi_command(cmd, raw),
            Pdu::DataOut(d) => self.on_data_out(d, raw.data),
            Pdu::NopOut(n) => {
                if n.itt == RESERVED_TAG {
                    // Answer to our ping (never carries a CmdSN of its own).
                    if self.ping.map(|(t, _)| t) == Some(n.ttt) {
                        self.ping = None;
                    }
                } else {
                    self.admit(n.cmd_sn, n.immediate, Ordered::Nop(n.clone(), raw.data));
                }
            }
            Pdu::TaskMgmtRequest(t) => self.admit(t.cmd_sn, t.immediate, Ordered::Tmf(t.clone())),
            Pdu::TextRequest(t) => {
                self.admit(t.cmd_sn, t.immediate, Ordered::Text(t.clone(), raw.data))
            }
            Pdu::LogoutRequest(l) => self.admit(l.cmd_sn, l.immediate, Ordered::Logout(l.clone())),
            Pdu::Snack(_) => {
                // ErrorRecoveryLevel 0: no SNACK support (§11.16).
                self.reject(&raw.bhs, reject_reason::COMMAND_NOT_SUPPORTED)
            }
            Pdu::LoginRequest(_) => self.reject(&raw.bhs, reject_reason::PROTOCOL_ERROR),
            _ => self.reject(&raw.bhs, reject_reason::PROTOCOL_ERROR),
        }
        !self.closing || self.tasks.running() > 0 || self.pending_logout.is_some()
    }

    fn admit(&mut self, cmd_sn: u32, immediate: bool, item: Ordered) {
        match self.window.admit(cmd_sn, immediate, item) {
            Admission::Deliver(items) => {
                for it in items {
                    self.deliver(it);
                }
            }
            Admission::Held => {}
            Admission::Dropped(Ordered::Scsi(itt)) => {
                debug!(
                    session = self.setup.id,
                    cmd_sn, "command outside the CmdSN window ignored"
                );
                self.tasks.abort(AbortScope::Task(itt));
            }
            Admission::Dropped(_) => {
                debug!(
                    session = self.setup.id,
                    cmd_sn, "PDU outside the CmdSN window ignored"
                );
            }
        }
    }

    fn deliver(&mut self, item: Ordered) {
        match item {
            Ordered::Scsi(itt) => self.activate(itt),
            Ordered::Nop(n, data) => {
                self.window.complete();
                let nop = NopIn {
                    lun: n.lun,
                    itt: n.itt,
                    ttt: RESERVED_TAG,
                    stat_sn: self.next_stat_sn(),
                    exp_cmd_sn: self.window.exp_cmd_sn(),
                    max_cmd_sn: self.window.max_cmd_sn(),
                };
                let len = data.len().min(self.setup.params.max_send_dsl as usize);
                let mut data = data;
                data.truncate(len);
                self.send(Pdu::NopIn(nop), Bytes::from(data));
            }
            Ordered::Tmf(t) => self.on_tmf(t),
            Ordered::Text(t, data) => {
                self.window.complete();
                self.on_text(t, data);
            }
            Ordered::Logout(l) => {
                self.pending_logout = Some(l);
                self.try_finish_logout();
            }
        }
    }

    fn on_scsi_command(&mut self, cmd: ScsiCommand, mut raw: RawPdu) {
        if self.setup.target.is_none() {
            self.reject(&raw.bhs, reject_reason::PROTOCOL_ERROR);
            return;
        }
        if self.tasks.contains(cmd.itt) {
            // An ITT must be unique among the session's tasks (§11.3.4? ITT).
            self.reject(&raw.bhs, reject_reason::TASK_IN_PROGRESS);
            return;
        }
        let mut cdb = cmd.cdb.to_vec();
        // Extended CDB AHS (type 1): bytes beyond the first 16.
        let mut ahs = raw.ahs.as_slice();
        while ahs.len() >= 4 {
            let len = u16::from_be_bytes([ahs[0], ahs[1]]) as usize;
            let ty = ahs[2];
            let body_end = (3 + len).min(ahs.len());
            if ty == 1 && len > 1 {
                cdb.extend_from_slice(&ahs[4..body_end.max(4)]);
            }
            let total = (3 + len + 3) & !3;
            if total == 0 || total > ahs.len() {
                break;
            }
            ahs = &ahs[total..];
        }
        let p = &self.setup.params;
        let edtl = cmd.expected_len;
        let mut fail = None;
        let mut data = Vec::new();
        let mut reserved = 0;
        let transfer = if cmd.write && edtl > 0 {
            let imm = raw.data.len().min(edtl as usize);
            if !p.immediate_data && !raw.data.is_empty() {
                self.reject(&raw.bhs, reject_reason::PROTOCOL_ERROR);
                return;
            }
            if edtl > MAX_EDTL {
                fail = Some(check_condition(0x05, 0x24, 0x00));
            } else {
                // Only what may arrive unasked is buffered now: the
                // immediate data, and with InitialR2T=No the rest of the
                // first burst. The whole buffer is reserved when the
                // command's R2Ts are about to go out.
                let unsolicited = if p.initial_r2t {
                    imm
                } else {
                    imm.max(p.first_burst_length as usize).min(edtl as usize)
                };
                data = std::mem::take(&mut raw.data);
                data.truncate(imm);
                data.resize(unsolicited, 0);
                reserved = unsolicited;
                self.budget.force(reserved);
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
        let lun = lun_from_wire(cmd.lun);
        let task = Task {
            cmd,
            cdb,
            data,
            transfer,
            fail,
            r2t_count: 0,
            reserved,
        };
        if self
            .tasks
            .insert(itt, lun, attr, data_ready, exempt, task)
            .is_err()
        {
            unreachable!("checked above that the ITT is free");
        }
        self.admit(cmd_sn, immediate, Ordered::Scsi(itt));
    }

    /// A SCSI command reached its turn in CmdSN order.
    fn activate(&mut self, itt: u32) {
        if !self.tasks.admit(itt) {
            // Aborted before its turn: its place in the window is free.
            self.window.complete();
            return;
        }
        let solicit = self
            .tasks
            .get(itt)
            .is_some_and(|t| t.transfer.is_some() && t.fail.is_none());
        if solicit {
            if self.awaiting.is_empty() && self.reserve(itt) {
                self.solicit(itt);
            } else {
                self.awaiting.push_back((itt, Need::Solicit));
            }
        }
        self.dispatch();
    }

    /// Send the R2Ts a collecting task may have outstanding.
    fn solicit(&mut self, itt: u32) {
        let mut ttts = Vec::new();
        let Some(task) = self.tasks.get_mut(itt) else {
            return;
        };
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

    fn on_data_out(&mut self, d: DataOut, data: Vec<u8>) {
        let admitted = self.tasks.is_admitted(d.itt);
        let Some(task) = self.tasks.get_mut(d.itt) else {
            // Data for a task that was aborted or failed: discard.
            return;
        };
        let Some(t) = &mut task.transfer else {
            return;
        };
        match t.on_data_out(
            d.ttt,
            d.data_sn,
            d.buffer_offset,
            data.len() as u32,
            d.final_bit,
        ) {
            Ok(())
                if task.fail.is_none()
                    && d.buffer_offset as usize + data.len() > task.data.len() =>
            {
                // Data the target did not ask for and has no room for.
                warn!(
                    session = self.setup.id,
                    itt = d.itt,
                    "unsolicited Data-Out beyond the first burst; failing the command"
                );
                task.fail = Some(check_condition(0x0b, 0x4b, 0x00));
                task.transfer = None;
                self.tasks.set_data_ready(d.itt);
                self.dispatch();
            }
            Ok(()) => {
                if task.fail.is_none() {
                    let off = d.buffer_offset as usize;
                    task.data[off..off + data.len()].copy_from_slice(&data);
                }
                if t.is_complete() {
                    task.transfer = None;
                    self.tasks.set_data_ready(d.itt);
                    self.dispatch();
                } else if admitted && task.fail.is_none() {
                    self.solicit(d.itt);
                }
            }
            Err(e) => {
                warn!(session = self.setup.id, itt = d.itt, %e, "bad Data-Out; failing the command");
                // ABORTED COMMAND / DATA PHASE ERROR ends the command at once.
                task.fail = Some(check_condition(0x0b, 0x4b, 0x00));
                task.transfer = None;
                self.tasks.set_data_ready(d.itt);
                self.dispatch();
            }
        }
    }

    /// Start every task the task set allows to run now.
    fn dispatch(&mut self) {
        while let Some(itt) = self.tasks.next_startable() {
            self.start(itt);
        }
    }

    /// Hand a task whose turn has come to the target core's executor;
    /// its outcome comes back as [`Event::Done`].
    fn start(&mut self, itt: u32) {
        let Some(task) = self.tasks.get_mut(itt) else {
            return;
        };
        if let Some(response) = task.fail.take() {
            let _ = self.done_tx.send(Event::Done(
                itt,
                Finished {
                    response,
                    preempted: Vec::new(),
                },
            ));
            return;
        }
        if task.cmd.read && task.reserved == 0 && task.cmd.expected_len > 0 {
            // The read's buffer must fit the budget before it runs.
            if !self.awaiting.is_empty() || !self.reserve(itt) {
                self.awaiting.push_back((itt, Need::Start));
                return;
            }
        }
        let Some(task) = self.tasks.get_mut(itt) else {
            return;
        };
        let target = self
            .setup
            .target
            .clone()
            .expect("SCSI tasks only in normal sessions");
        let lun = lun_from_wire(task.cmd.lun);
        let cmd = Command {
            nexus: self.setup.nexus,
            initiator: self.initiator.clone(),
            lun,
            cdb: std::mem::take(&mut task.cdb),
            data: std::mem::take(&mut task.data),
            expected_len: task.cmd.expected_len,
        };
        let counting = Counting {
            lun: target.lun_counters(lun),
            initiator: Some(self.initiator_counters.clone()),
        };
        let tx = self.done_tx.clone();
        self.executor.execute(
            &target.scsi,
            cmd,
            counting,
            &TokioBlocking,
            Box::new(move |f| {
                let _ = tx.send(Event::Done(itt, f));
            }),
        );
    }

    fn on_done(&mut self, itt: u32, finished: Finished) {
        let Some(done) = self.tasks.complete(itt) else {
            return;
        };
        let mut task = done.payload;
        if done.admitted {
            self.window.complete();
        }
        // A write's buffer is gone with its execution; a read's goes with
        // its Data-In (released when sent).
        if !task.cmd.read || done.aborted || finished.response.data_in.is_empty() {
            self.budget.release(std::mem::take(&mut task.reserved));
            self.retry_awaiting();
        }
        let resp = finished.response;
        if resp.status != ScsiStatus::Good {
            debug!(session = self.setup.id, itt, opcode = task.cmd.cdb[0], status = ?resp.status, sense = ?resp.sense.get(..14), "command failed");
        }
        if !finished.preempted.is_empty() {
            self.abort_preempted(lun_from_wire(task.cmd.lun), finished.preempted);
        }
        if !done.aborted {
            self.respond(&task, resp);
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
    fn abort_preempted(&mut self, lun: u64, preempted: Vec<Nexus>) {
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

    /// Send Data-In and status for a finished command.
    fn respond(&mut self, task: &Task, resp: ScsiResponse) {
        let cmd = &task.cmd;
        let edtl = cmd.expected_len as usize;
        let produced = resp.data_in.len();
        let (send_len, overflow, underflow, residual) = if cmd.read || produced > 0 {
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
        let data = if task.reserved > 0 {
            // The budget gets the bytes back when the writer has sent them.
            Bytes::from_owner(HeldData {
                data: resp.data_in,
                release: Some((task.reserved, self.done_tx.clone())),
            })
        } else {
            Bytes::from(resp.data_in)
        };
        let collapse = resp.status == ScsiStatus::Good && resp.sense.is_empty() && send_len > 0;
        let p = &self.setup.params;
        let segs: Vec<_> =
            data_in_segments(send_len as u32, p.max_send_dsl, p.max_burst_length).collect();
        let nsegs = segs.len() as u32;
        for seg in segs {
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
            let chunk = data.slice(seg.offset as usize..(seg.offset + seg.len) as usize);
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

    /// Abort (silently) the tasks in `scope`; returns the ITTs of those
    /// still running, which must be waited for.
    fn abort_tasks(&mut self, scope: AbortScope) -> Vec<u32> {
        let (removed, running) = self.tasks.abort(scope);
        self.release(removed);
        self.drop_awaiting(&running);
        running
    }

    /// Tasks taken out before they ran give back their window places.
    fn release(&mut self, removed: Vec<Removed<Task>>) {
        let mut freed = false;
        for r in removed {
            if r.admitted {
                self.window.complete();
            }
            self.awaiting.retain(|(i, _)| *i != r.tag);
            if r.payload.reserved > 0 {
                self.budget.release(r.payload.reserved);
                freed = true;
            }
        }
        if freed {
            self.retry_awaiting();
        }
    }

    /// Reserve the whole buffer of task `itt` (a write's grows to its
    /// expected length); false when it does not fit yet.
    fn reserve(&mut self, itt: u32) -> bool {
        let Some(task) = self.tasks.get_mut(itt) else {
            return true;
        };
        let want = task.cmd.expected_len as usize;
        let more = want.saturating_sub(task.reserved);
        if !self.budget.try_reserve(more) {
            return false;
        }
        task.reserved += more;
        if task.cmd.write && task.data.len() < want {
            // A fresh zeroed allocation: pages are touched only as the
            // data arrives.
            let mut buf = vec![0u8; want];
            buf[..task.data.len()].copy_from_slice(&task.data);
            task.data = buf;
        }
        true
    }

    /// Give waiting tasks their buffers, oldest first, while they fit.
    fn retry_awaiting(&mut self) {
        while let Some(&(itt, need)) = self.awaiting.front() {
            if !self.tasks.contains(itt) {
                self.awaiting.pop_front();
                continue;
            }
            if !self.reserve(itt) {
                return;
            }
            self.awaiting.pop_front();
            match need {
                Need::Solicit => self.solicit(itt),
                Need::Start => self.start(itt),
            }
        }
    }

    /// Running tasks that never got their buffer finish at once (aborted:
    /// no response goes out for them).
    fn drop_awaiting(&mut self, running: &[u32]) {
        for itt in running {
            if let Some(pos) = self
                .awaiting
                .iter()
                .position(|(i, n)| i == itt && *n == Need::Start)
            {
                self.awaiting.remove(pos);
                let _ = self.done_tx.send(Event::Done(
                    *itt,
                    Finished {
                        response: check_condition(0x0b, 0x00, 0x00),
                        preempted: Vec::new(),
                    },
                ));
            }
        }
    }

    fn on_tmf(&mut self, t: TaskMgmtRequest) {
        let lun = lun_from_wire(t.lun);
        let target = self.setup.target.clone();
        let initiator = self.setup.params.initiator_name.as_str();
        let lun_exists = target
            .as_ref()
            .is_some_and(|tg| tg.scsi.visible(lun, Some(initiator)));
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
        let outcome = self.tasks.task_management(tmf, lun_exists, t);
        self.release(outcome.removed);
        let running: Vec<u32> = self
            .awaiting
            .iter()
            .filter(|(i, n)| *n == Need::Start && self.tasks.is_aborted(*i))
            .map(|(i, _)| *i)
            .collect();
        self.drop_awaiting(&running);
        let name = target.as_ref().map(|t| t.name.as_str());
        let fx = outcome.effects;
        if let Some(on) = fx.abort_others {
            self.registry.abort_lun_others(self.setup.id, name, on);
        }
        if let (Some((kind, on)), Some(tg)) = (fx.reset, &target) {
            tg.scsi.reset(kind, on, self.setup.nexus);
        }
        if fx.end_sessions {
            // A cold reset drops every connection to the target, this one
            // too once the response has gone out.
            self.registry.shutdown_target_others(self.setup.id, name);
            self.closing = true;
        }
        if let Some(req) = outcome.done {
            self.send_tmf_response(req, outcome.response);
        }
        self.dispatch();
    }

    /// Answer a task management request whose waits are over.
    fn send_tmf_response(&mut self, req: TaskMgmtRequest, response: TmfResponse) {
        self.window.complete();
        let code = match response {
            TmfResponse::Complete => tmf_response::COMPLETE,
            TmfResponse::NoTask => tmf_response::NO_TASK,
            TmfResponse::NoLun => tmf_response::NO_LUN,
            TmfResponse::NotSupported => tmf_response::NOT_SUPPORTED,
        };
        self.tmf_reply(&req, code);
        if self.closing {
            let _ = self.out.send(WriterMsg::Close);
        }
    }

    fn tmf_reply(&mut self, req: &TaskMgmtRequest, response: u8) {
        let r = TaskMgmtResponse {
            response,
            itt: req.itt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
        };
        self.send(Pdu::TaskMgmtResponse(r), Bytes::new());
    }

    fn on_text(&mut self, t: TextRequest, data: Vec<u8>) {
        let max = self.setup.params.max_send_dsl as usize;
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

    fn try_finish_logout(&mut self) {
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

/// Blocking commands run on tokio's blocking pool.
struct TokioBlocking;

impl BlockingPool for TokioBlocking {
    fn spawn(&self, job: Box<dyn FnOnce() + Send>) {
        tokio::task::spawn_blocking(job);
    }
}

/// A read's Data-In buffer; dropping it (the writer sent the last of it)
/// gives its bytes back to the session's budget.
struct HeldData {
    data: Vec<u8>,
    release: Option<(usize, mpsc::UnboundedSender<Event>)>,
}

impl AsRef<[u8]> for HeldData {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for HeldData {
    fn drop(&mut self) {
        if let Some((n, tx)) = self.release.take() {
            let _ = tx.send(Event::Released(n));
        }
    }
}
