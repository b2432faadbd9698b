//! The full feature phase of one session (RFC 7143 §4, §11).
//!
//! One task owns all of a session's state. It waits for the next event
//! (a PDU from the reader task, a finished command from the blocking pool,
//! a control message from another session, a timer) and applies it
//! synchronously: `loop { let ev = self.select().await; self.apply(ev) }`.
//! The only lock it touches is the registry's, and only on login,
//! logout and task-management resets.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ethersan_proto::pdu::{
    self, lun_from_wire, reject_reason, tmf_response, DataIn, DataOut, LogoutRequest,
    LogoutResponse, NopIn, NopOut, Pdu, RawPdu, Reject, ScsiCommand, TaskAttr, TaskMgmtRequest,
    TaskMgmtResponse, TextRequest, TextResponse, TmfFunction, RESERVED_TAG,
};
use ethersan_proto::seq::{Admission, CmdWindow};
use ethersan_proto::transfer::{data_in_segments, TransferLimits, WriteTransfer};
use ethersan_scsi::{
    LunAccess, Nexus, ResetKind, ScsiCommand as ScsiCmd, ScsiCompletion, ScsiResponse, ScsiStatus,
    Submitted,
};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::registry::{Registry, SessionControl, TargetEntry};
use crate::wire::{Frame, ReadError, WriterMsg};

/// SANITIZE operation code.
const SANITIZE: u8 = 0x48;

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
    /// The LUNs this initiator sees (`None`: all).
    pub(crate) lun_mask: Option<Arc<[bool]>>,
    /// The LUNs that are read-only for this initiator (`None`: none).
    pub(crate) read_only_mask: Option<Arc<[bool]>>,
}

/// Events the session loop reacts to.
#[derive(Debug)]
pub(crate) enum Event {
    /// A PDU arrived, or reading failed.
    Pdu(Result<RawPdu, ReadError>),
    /// A command finished executing.
    Done(u32, ScsiResponse),
    /// A message from the registry (another session's TMF, shutdown).
    Control(SessionControl),
    /// Periodic timer for NOP-In pings.
    Tick,
}

/// What a command waits for.
#[derive(Debug)]
enum TaskState {
    /// Collecting Data-Out.
    Collecting(WriteTransfer),
    /// All data here (or none needed); waiting for its turn.
    Ready,
    /// Executing in the blocking pool.
    Running,
}

#[derive(Debug)]
struct Task {
    cmd: ScsiCommand,
    cdb: Vec<u8>,
    data: Vec<u8>,
    state: TaskState,
    /// Admission sequence number once admitted in CmdSN order.
    seq: Option<u64>,
    /// The command must fail with this sense instead of running.
    fail: Option<ScsiResponse>,
    /// Aborted by task management: no response is sent.
    aborted: bool,
    /// R2Ts sent for this task (ExpDataSN of a write's response).
    r2t_count: u32,
}

/// A task management request waiting for aborted tasks to finish.
#[derive(Debug)]
struct PendingTmf {
    req: TaskMgmtRequest,
    waiting_for: Vec<u32>,
    response: u8,
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
    tasks: HashMap<u32, Task>,
    next_seq: u64,
    /// Admitted, unfinished tasks by admission sequence.
    outstanding: BTreeSet<u64>,
    /// Admitted, unfinished ORDERED tasks.
    ordered: BTreeSet<u64>,
    ready: VecDeque<u32>,
    running: usize,
    next_ttt: u32,
    pending_tmfs: Vec<PendingTmf>,
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
        Session {
            setup,
            registry,
            out,
            done_tx,
            window,
            stat_sn,
            tasks: HashMap::new(),
            next_seq: 0,
            outstanding: BTreeSet::new(),
            ordered: BTreeSet::new(),
            ready: VecDeque::new(),
            running: 0,
            next_ttt: 1,
            pending_tmfs: Vec::new(),
            pending_logout: None,
            last_rx: Instant::now(),
            ping: None,
            text_continuation: None,
            text_in: None,
            closing: false,
        }
    }

    /// Run until logout, connection loss or shutdown.
    pub(crate) async fn run(mut self, mut events: mpsc::UnboundedReceiver<Event>) {
        if let Some(t) = &self.setup.target {
            t.scsi.nexus_added(self.setup.nexus);
            t.scsi
                .set_initiator_name(self.setup.nexus, &self.setup.params.initiator_name);
        }
        while let Some(ev) = events.recv().await {
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
                self.abort_tasks(|t| lun.is_none_or(|l| lun_from_wire(t.cmd.lun) == l));
                true
            }
            Event::Control(SessionControl::Shutdown) => {
                info!(session = self.setup.id, "session shut down");
                self.abort_tasks(|_| true);
                false
            }
            Event::Tick => self.on_tick(),
        }
    }

    async fn teardown(&mut self, events: &mut mpsc::UnboundedReceiver<Event>) {
        // Let commands already in the blocking pool finish so no write is
        // left half-applied behind the initiator's back.
        self.abort_tasks(|_| true);
        while self.running > 0 {
            match events.recv().await {
                Some(Event::Done(itt, _)) => {
                    self.tasks.remove(&itt);
                    self.running -= 1;
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
        !self.closing || self.running > 0 || self.pending_logout.is_some()
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
                self.tasks.remove(&itt);
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
        if self.tasks.contains_key(&cmd.itt) {
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
        let state = if cmd.write && edtl > 0 {
            let imm = raw.data.len().min(edtl as usize);
            if !p.immediate_data && !raw.data.is_empty() {
                self.reject(&raw.bhs, reject_reason::PROTOCOL_ERROR);
                return;
            }
            if edtl > MAX_EDTL {
                fail = Some(check_condition(0x05, 0x24, 0x00));
            } else if imm == edtl as usize {
                // All the data came as immediate data: the PDU's buffer is
                // the command's buffer, no copy.
                data = std::mem::take(&mut raw.data);
                data.truncate(imm);
            } else {
                data = vec![0u8; edtl as usize];
                data[..imm].copy_from_slice(&raw.data[..imm]);
            }
            let limits = TransferLimits {
                initial_r2t: p.initial_r2t,
                first_burst_length: p.first_burst_length,
                max_burst_length: p.max_burst_length,
                max_outstanding_r2t: p.max_outstanding_r2t,
            };
            let t = WriteTransfer::new(edtl, imm as u32, cmd.final_bit, limits);
            if t.is_complete() {
                TaskState::Ready
            } else {
                TaskState::Collecting(t)
            }
        } else {
            if edtl > MAX_EDTL {
                fail = Some(check_condition(0x05, 0x24, 0x00));
            }
            TaskState::Ready
        };
        let itt = cmd.itt;
        let (cmd_sn, immediate) = (cmd.cmd_sn, cmd.immediate);
        self.tasks.insert(
            itt,
            Task {
                cmd,
                cdb,
                data,
                state,
                seq: None,
                fail,
                aborted: false,
                r2t_count: 0,
            },
        );
        self.admit(cmd_sn, immediate, Ordered::Scsi(itt));
    }

    /// A SCSI command reached its turn in CmdSN order.
    fn activate(&mut self, itt: u32) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let Some(task) = self.tasks.get_mut(&itt) else {
            self.window.complete();
            return;
        };
        task.seq = Some(seq);
        self.outstanding.insert(seq);
        let head_of_queue = task.cmd.attr == TaskAttr::HeadOfQueue;
        if task.cmd.attr == TaskAttr::Ordered {
            self.ordered.insert(seq);
        }
        let collecting = matches!(task.state, TaskState::Collecting(_));
        if collecting && task.fail.is_none() {
            self.solicit(itt);
        } else if head_of_queue {
            self.ready.push_front(itt);
        } else {
            self.ready.push_back(itt);
        }
        self.dispatch();
    }

    /// Send the R2Ts a collecting task may have outstanding.
    fn solicit(&mut self, itt: u32) {
        let mut ttts = Vec::new();
        let Some(task) = self.tasks.get_mut(&itt) else {
            return;
        };
        let TaskState::Collecting(t) = &mut task.state else {
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
        let Some(task) = self.tasks.get_mut(&d.itt) else {
            // Data for a task that was aborted or failed: discard.
            return;
        };
        let TaskState::Collecting(t) = &mut task.state else {
            return;
        };
        match t.on_data_out(
            d.ttt,
            d.data_sn,
            d.buffer_offset,
            data.len() as u32,
            d.final_bit,
        ) {
            Ok(()) => {
                if task.fail.is_none() {
                    let off = d.buffer_offset as usize;
                    task.data[off..off + data.len()].copy_from_slice(&data);
                }
                if t.is_complete() {
                    task.state = TaskState::Ready;
                    if task.seq.is_some() {
                        self.ready.push_back(d.itt);
                        self.dispatch();
                    }
                } else if task.seq.is_some() && task.fail.is_none() {
                    self.solicit(d.itt);
                }
            }
            Err(e) => {
                warn!(session = self.setup.id, itt = d.itt, %e, "bad Data-Out; failing the command");
                // ABORTED COMMAND / DATA PHASE ERROR ends the command at once.
                task.fail = Some(check_condition(0x0b, 0x4b, 0x00));
                task.state = TaskState::Ready;
                if task.seq.is_some() {
                    self.ready.push_back(d.itt);
                    self.dispatch();
                }
            }
        }
    }

    /// Start ready tasks the task attributes allow to run.
    fn dispatch(&mut self) {
        let mut i = 0;
        while i < self.ready.len() {
            let itt = self.ready[i];
            let Some(task) = self.tasks.get(&itt) else {
                self.ready.remove(i);
                continue;
            };
            let seq = task.seq.expect("ready tasks are admitted");
            let blocked_by_ordered = self.ordered.range(..seq).next().is_some();
            let ordered_waits = task.cmd.attr == TaskAttr::Ordered
                && self.outstanding.range(..seq).next().is_some();
            if blocked_by_ordered || ordered_waits {
                i += 1;
                continue;
            }
            self.ready.remove(i);
            self.start(itt);
        }
    }

    fn start(&mut self, itt: u32) {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return;
        };
        if let Some(resp) = task.fail.take() {
            let _ = self.done_tx.send(Event::Done(itt, resp));
            task.state = TaskState::Running;
            self.running += 1;
            return;
        }
        task.state = TaskState::Running;
        self.running += 1;
        let target = self
            .setup
            .target
            .clone()
            .expect("SCSI tasks only in normal sessions");
        let nexus = self.setup.nexus;
        let cdb = std::mem::take(&mut task.cdb);
        let data = std::mem::take(&mut task.data);
        let lun = lun_from_wire(task.cmd.lun);
        let expected_len = task.cmd.expected_len;
        let tx = self.done_tx.clone();
        let cmd = ScsiCmd {
            nexus,
            lun,
            cdb,
            data_out: data,
            expected_len,
        };
        let (mask, ro) = (
            self.setup.lun_mask.clone(),
            self.setup.read_only_mask.clone(),
        );
        let access = move |l| LunAccess::from_masks(mask.as_deref(), ro.as_deref(), l);
        let done_tx = tx.clone();
        let done: ScsiCompletion = Box::new(move |resp| {
            let _ = done_tx.send(Event::Done(itt, resp));
        });
        // One submission: looked up and checked once, then finished now
        // (page cache, RAM, metadata; no thread handoff), pending in the
        // LUN's io_uring (completed from the ring thread straight into this
        // session's event channel), or a job for the blocking pool (the sync
        // engine's I/O, slow-path commands).
        let submit = move || {
            guarded(
                itt,
                || target.scsi.submit(cmd, &access, done),
                Submitted::Done,
            )
        };
        let settle = move |submitted: Submitted| match submitted {
            Submitted::Done(resp) => {
                let _ = tx.send(Event::Done(itt, resp));
            }
            Submitted::Pending => {}
            Submitted::Blocking(job) => {
                let _ = tx.send(Event::Done(itt, guarded(itt, job, |r| r)));
            }
        };
        if !self.setup.options.inline_io {
            // Everything on the blocking pool.
            tokio::task::spawn_blocking(move || settle(submit()));
            return;
        }
        match submit() {
            Submitted::Blocking(job) => {
                tokio::task::spawn_blocking(move || settle(Submitted::Blocking(job)));
            }
            other => settle(other),
        }
    }

    fn on_done(&mut self, itt: u32, resp: ScsiResponse) {
        self.running = self.running.saturating_sub(1);
        let Some(task) = self.tasks.remove(&itt) else {
            return;
        };
        if let Some(seq) = task.seq {
            self.outstanding.remove(&seq);
            self.ordered.remove(&seq);
            self.window.complete();
        }
        if resp.status != ScsiStatus::Good {
            debug!(session = self.setup.id, itt, opcode = task.cmd.cdb[0], status = ?resp.status, sense = ?resp.sense.get(..14), "command failed");
        }
        if task.cmd.cdb[0] == 0x5f && resp.status == ScsiStatus::Good {
            self.abort_preempted(lun_from_wire(task.cmd.lun));
        }
        if !task.aborted {
            self.respond(&task, resp);
        }
        self.finish_tmfs(itt);
        self.try_finish_logout();
        self.dispatch();
    }

    /// After a PERSISTENT RESERVE OUT: abort the tasks of the nexuses a
    /// PREEMPT AND ABORT preempted, in their sessions; they also get COMMANDS
    /// CLEARED BY ANOTHER INITIATOR.
    fn abort_preempted(&mut self, lun: u64) {
        let Some(target) = self.setup.target.clone() else {
            return;
        };
        for victim in target.scsi.take_preempted(lun) {
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
        let data = Bytes::from(resp.data_in);
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

    /// Abort (silently) every task matching `pred`; returns their ITTs that
    /// are still running and must be waited for.
    fn abort_tasks(&mut self, pred: impl Fn(&Task) -> bool) -> Vec<u32> {
        let victims: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(_, t)| !t.aborted && pred(t))
            .map(|(i, _)| *i)
            .collect();
        let mut running = Vec::new();
        for itt in victims {
            let task = self.tasks.get_mut(&itt).expect("listed above");
            task.aborted = true;
            if matches!(task.state, TaskState::Running) {
                // Task management does not stop a SANITIZE (SBC-4 §4.11):
                // it goes on in the background, so nothing waits for it.
                if task.cmd.cdb[0] != SANITIZE {
                    running.push(itt);
                }
                continue;
            }
            let task = self.tasks.remove(&itt).expect("listed above");
            self.ready.retain(|i| *i != itt);
            if let Some(seq) = task.seq {
                self.outstanding.remove(&seq);
                self.ordered.remove(&seq);
                self.window.complete();
            }
        }
        running
    }

    fn on_tmf(&mut self, t: TaskMgmtRequest) {
        let lun = lun_from_wire(t.lun);
        let target = self.setup.target.clone();
        let lun_exists = target
            .as_ref()
            .is_some_and(|tg| (lun as usize) < tg.scsi.luns().len());
        let nexus = self.setup.nexus;
        let (response, waiting_for) = match t.function {
            TmfFunction::AbortTask => {
                let found = self
                    .tasks
                    .get(&t.referenced_task_tag)
                    .is_some_and(|task| lun_from_wire(task.cmd.lun) == lun);
                if found {
                    let itt = t.referenced_task_tag;
                    (
                        tmf_response::COMPLETE,
                        self.abort_tasks(|task| task.cmd.itt == itt),
                    )
                } else {
                    (tmf_response::NO_TASK, Vec::new())
                }
            }
            TmfFunction::AbortTaskSet | TmfFunction::ClearTaskSet if lun_exists => {
                let w = self.abort_tasks(|task| lun_from_wire(task.cmd.lun) == lun);
                if t.function == TmfFunction::ClearTaskSet {
                    self.registry.abort_lun_others(
                        self.setup.id,
                        target.as_ref().map(|t| t.name.as_str()),
                        Some(lun),
                    );
                }
                (tmf_response::COMPLETE, w)
            }
            TmfFunction::LogicalUnitReset if lun_exists => {
                let w = self.abort_tasks(|task| lun_from_wire(task.cmd.lun) == lun);
                self.registry.abort_lun_others(
                    self.setup.id,
                    target.as_ref().map(|t| t.name.as_str()),
                    Some(lun),
                );
                if let Some(tg) = &target {
                    tg.scsi.reset(ResetKind::LogicalUnit, Some(lun), nexus);
                }
                (tmf_response::COMPLETE, w)
            }
            TmfFunction::AbortTaskSet
            | TmfFunction::ClearTaskSet
            | TmfFunction::LogicalUnitReset => (tmf_response::NO_LUN, Vec::new()),
            TmfFunction::TargetWarmReset | TmfFunction::TargetColdReset => {
                let w = self.abort_tasks(|_| true);
                self.registry.abort_lun_others(
                    self.setup.id,
                    target.as_ref().map(|t| t.name.as_str()),
                    None,
                );
                let kind = if t.function == TmfFunction::TargetColdReset {
                    ResetKind::TargetCold
                } else {
                    ResetKind::TargetWarm
                };
                if let Some(tg) = &target {
                    tg.scsi.reset(kind, None, nexus);
                }
                if kind == ResetKind::TargetCold {
                    // A cold reset drops every connection to the target,
                    // this one too once the response has gone out.
                    self.registry.shutdown_target_others(
                        self.setup.id,
                        target.as_ref().map(|t| t.name.as_str()),
                    );
                    self.closing = true;
                }
                (tmf_response::COMPLETE, w)
            }
            TmfFunction::ClearAca => (tmf_response::NOT_SUPPORTED, Vec::new()),
            TmfFunction::TaskReassign => (tmf_response::REASSIGN_NOT_SUPPORTED, Vec::new()),
            TmfFunction::Other(_) => (tmf_response::REJECTED, Vec::new()),
        };
        self.pending_tmfs.push(PendingTmf {
            req: t,
            waiting_for,
            response,
        });
        self.finish_tmfs(RESERVED_TAG);
        self.dispatch();
    }

    /// Send TMF responses whose aborted tasks have all finished.
    fn finish_tmfs(&mut self, finished_itt: u32) {
        for p in &mut self.pending_tmfs {
            p.waiting_for.retain(|i| *i != finished_itt);
        }
        let ready: Vec<PendingTmf> = {
            let (done, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending_tmfs)
                .into_iter()
                .partition(|p| p.waiting_for.is_empty());
            self.pending_tmfs = wait;
            done
        };
        for p in ready {
            self.window.complete();
            let r = TaskMgmtResponse {
                response: p.response,
                itt: p.req.itt,
                stat_sn: self.next_stat_sn(),
                exp_cmd_sn: self.window.exp_cmd_sn(),
                max_cmd_sn: self.window.max_cmd_sn(),
            };
            self.send(Pdu::TaskMgmtResponse(r), Bytes::new());
            if self.closing {
                let _ = self.out.send(WriterMsg::Close);
            }
        }
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
        if self.running > 0 || self.pending_logout.is_none() {
            return;
        }
        let l = self.pending_logout.take().expect("checked");
        // Every other task of the session ends with the logout (§11.14).
        self.abort_tasks(|_| true);
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

/// Run command emulation for task `itt` so that a bug in it cannot take
/// the session down: a panic is logged and the command fails as HARDWARE
/// ERROR / INTERNAL TARGET FAILURE, handed to `failed` to fit `f`'s result.
fn guarded<T>(itt: u32, f: impl FnOnce() -> T, failed: impl FnOnce(ScsiResponse) -> T) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        tracing::error!(itt, "command emulation panicked");
        failed(check_condition(0x04, 0x44, 0x00))
    })
}

/// A CHECK CONDITION response for failures found by the transport, before
/// the command reaches its logical unit (fixed-format sense).
fn check_condition(key: u8, asc: u8, ascq: u8) -> ScsiResponse {
    let sense = ethersan_scsi::sense::Sense::new(key, asc, ascq).to_bytes(false);
    ScsiResponse {
        status: ScsiStatus::CheckCondition,
        sense,
        data_in: Vec::new(),
        data_out_len: None,
    }
}
