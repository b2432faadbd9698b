//! The target side of the full feature phase of one session (RFC 7143 §4,
//! §11), as a state machine that does no I/O.
//!
//! [`Session::handle`] applies one [`Event`] (a PDU, a finished command, a
//! control message from another session, a timer tick) with the time
//! passed in; [`Session::poll_output`] then hands out what to do: PDUs for
//! the writer and commands for the target core's executor ([`Output`]).
//! The tokio driver ([`driver`]) pumps it: `loop { let ev = select().await;
//! session.handle(ev, now); while let Some(o) = session.poll_output() {…} }`.
//! Unit tests drive it directly with made-up PDUs (`tests`). The only lock
//! it touches is the registry's, and only on login, logout and task
//! management that reaches other sessions.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ethersan_core::budget::MemoryBudget;
use ethersan_core::counters::IoCounters;
use ethersan_core::executor::{Early, Finished};
use ethersan_core::task_set::{AbortScope, TaskSet, TmfResponse};
use ethersan_proto::negotiate::SessionParams;
use ethersan_proto::pdu::{
    self, reject_reason, LogoutRequest, NopIn, NopOut, Pdu, RawPdu, Reject, ScsiCommand,
    TaskMgmtRequest, TextRequest, RESERVED_TAG,
};
use ethersan_proto::seq::{Admission, CmdWindow};
use ethersan_proto::transfer::WriteTransfer;
use ethersan_scsi::{IoBuf, Nexus, ScsiResponse};
use tracing::{debug, warn};

use crate::registry::{AbortWaiter, Registry, SessionControl, TargetEntry};
use crate::wire::{Frame, ReadError, WriterMsg};

/// A hash map keyed by small initiator-chosen integers (ITTs).
type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<rustc_hash::FxHasher>>;

mod command;
mod datain;
mod dataout;
pub(crate) mod driver;
mod management;
#[cfg(test)]
mod pair;
mod placed;
mod tasks;
#[cfg(test)]
mod tests;

/// Largest Expected Data Transfer Length accepted for one command; larger
/// commands are refused with CHECK CONDITION instead of buffering them.
pub(crate) const MAX_EDTL: u32 = 64 << 20;

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
    /// What login negotiated (the one struct both negotiators produce).
    pub(crate) params: SessionParams,
    pub(crate) nexus: Nexus,
    pub(crate) exp_cmd_sn: u32,
    pub(crate) stat_sn: u32,
    pub(crate) options: SessionOptions,
    /// The initiator's address (for access lists).
    pub(crate) peer_ip: Option<std::net::IpAddr>,
    /// The target's end of the TCP connection (`None`: another stream),
    /// announced for wildcard portals in SendTargets answers.
    pub(crate) local_addr: Option<std::net::SocketAddr>,
    /// The native transport channel's security level (`None`: TCP).
    pub(crate) channel_level: Option<u8>,
    /// Writes' solicited data comes placed (a native transport channel:
    /// [`Output::Expect`] before the first R2T).
    pub(crate) placed_writes: bool,
    /// This session's counters (shared with the registry's listing).
    pub(crate) counters: Arc<IoCounters>,
}

/// Events the session loop reacts to.
#[derive(Debug)]
pub(crate) enum Event {
    /// A PDU arrived, or reading failed.
    Pdu(Result<RawPdu, ReadError>),
    /// A SCSI write command arrived, its immediate data in an aligned
    /// buffer of its own with room for the whole transfer (the PDU's
    /// `data` is empty): see `PduReader::read_aligning`.
    WriteCommand(RawPdu, IoBuf),
    /// A command finished executing.
    Done(u32, Finished),
    /// Part of a READ's data, ahead of its outcome (cut-through): the
    /// ITT, the data, and the bytes the whole command produces.
    Early(u32, IoBuf, usize),
    /// A message from the registry (another session's TMF, shutdown).
    Control(SessionControl),
    /// Periodic timer for NOP-In pings.
    Tick,
    /// Budget was freed while commands wait for it (see [`Releases`]).
    Released,
    /// A write's placed buffer, taken back from the channel
    /// ([`Output::Reclaim`]); `None` when it was gone.
    Reclaimed(u32, Option<ethersan_endpoint::PlacedBuf>),
}

/// What the session asks its driver to do.
pub(crate) enum Output {
    /// Hand this to the writer task.
    Send(WriterMsg),
    /// Run this command on the target core's executor; its outcome comes
    /// back as [`Event::Done`] with this ITT.
    Execute {
        /// The task's ITT.
        itt: u32,
        /// The SCSI target device it goes to.
        target: Arc<ethersan_scsi::ScsiTarget>,
        /// The command.
        cmd: ethersan_core::executor::Command,
        /// Where it is counted.
        counting: ethersan_core::executor::Counting,
    },
    /// Register this write's buffer with the channel for placed Data-Out
    /// under its ITT (before the R2T that follows is sent).
    Expect {
        /// The task's ITT.
        itt: u32,
        /// The data so far (immediate data), the buffer's start; aligned,
        /// with room for the whole write.
        prefix: IoBuf,
        /// The buffer's length: the command's expected length.
        len: usize,
    },
    /// Copy data that came in a message into the registered buffer.
    Place {
        /// The task's ITT.
        itt: u32,
        /// The data's buffer offset.
        offset: u32,
        /// The data.
        data: Vec<u8>,
    },
    /// Take the registered buffer back and hand it to
    /// [`Session::reclaimed`].
    Reclaim(u32),
    /// Drop the registration (the task failed or was aborted).
    Forget(u32),
}

/// Budget bytes freed outside the session — a read's Data-In buffer,
/// dropped by the writer once sent — collected with an atomic add; the
/// session is woken ([`Event::Released`]) only when it has commands
/// waiting for room.
pub(crate) struct Releases {
    freed: AtomicUsize,
    waiting: AtomicBool,
    wake: Box<dyn Fn() + Send + Sync>,
}

impl Releases {
    /// Releases that wake the session with `wake`.
    pub(crate) fn new(wake: Box<dyn Fn() + Send + Sync>) -> Arc<Releases> {
        Arc::new(Releases {
            freed: AtomicUsize::new(0),
            waiting: AtomicBool::new(false),
            wake,
        })
    }

    /// `n` bytes are free (any thread).
    fn release(&self, n: usize) {
        self.freed.fetch_add(n, Ordering::AcqRel);
        if self.waiting.swap(false, Ordering::AcqRel) {
            (self.wake)();
        }
    }

    /// The bytes freed since the last call.
    fn take(&self) -> usize {
        // A plain load first: the usual answer is 0, and a swap would
        // write the cache line the writer's thread also writes.
        if self.freed.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.freed.swap(0, Ordering::AcqRel)
    }
}

/// The iSCSI side of one task; the task set ([`TaskSet`]) owns it and
/// decides when it runs.
#[derive(Debug)]
struct Task {
    cmd: ScsiCommand,
    cdb: Vec<u8>,
    /// A write's data so far (aligned once its whole buffer is reserved).
    data: IoBuf,
    /// A write still collecting Data-Out.
    transfer: Option<WriteTransfer>,
    /// The command must fail with this sense instead of running.
    fail: Option<ScsiResponse>,
    /// R2Ts sent for this task (ExpDataSN of a write's response).
    r2t_count: u32,
    /// Bytes of the session's memory budget this task's buffer holds.
    reserved: usize,
    /// Bytes of unsolicited data (immediate data, first burst) it holds.
    forced: usize,
    /// Bytes a write's buffer may hold: its expected length once reserved,
    /// else the unsolicited data it may receive (`data` holds the bytes
    /// filled so far, within this capacity).
    room: usize,
    /// The task set started it, but it waits for its buffer.
    start_waiting: bool,
    /// Its buffer is registered for placed Data-Out: the ranges
    /// `(offset, len)` the placed Data-Out headers announced so far.
    placed: Option<Vec<(u32, u32)>>,
    /// A READ's data handed over ahead of its outcome, not all sent yet.
    streamed: Option<datain::Streamed>,
    /// A WRITE its unit writes as the data arrives (cut-through): decided
    /// on arrival.
    streams: bool,
    /// Its Data-Out, collected into pieces once its buffer is reserved.
    collecting: Option<dataout::Collecting>,
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
    /// What the driver is to do next.
    outputs: VecDeque<Output>,
    /// Events the session sends itself (a command failed before running).
    internal: VecDeque<Event>,
    /// Budget given back when a read's buffer is gone.
    releases: Arc<Releases>,
    /// The time of the event being handled.
    now: Instant,
    window: CmdWindow<Ordered>,
    stat_sn: u32,
    /// The SAM task set: every task of the session, in command order.
    tasks: TaskSet<Task, TaskMgmtRequest>,
    /// The initiator's name, shared with every command.
    initiator: Arc<str>,
    /// The initiator's counters.
    initiator_counters: Arc<IoCounters>,
    /// Data buffers held by this session's commands.
    budget: MemoryBudget,
    /// Tasks waiting for room in the budget, oldest first.
    awaiting: VecDeque<u32>,
    /// ITTs of commands aborted before their CmdSN came up: refused for
    /// new commands until that CmdSN is delivered.
    retired: HashSet<u32, BuildHasherDefault<rustc_hash::FxHasher>>,
    next_ttt: u32,
    pending_logout: Option<LogoutRequest>,
    last_rx: Instant,
    ping: Option<(u32, Instant)>,
    text_continuation: Option<(u32, Vec<u8>)>,
    /// A Text request arriving in pieces (C bit): its ITT and the text so far.
    text_in: Option<(u32, u32, ethersan_proto::text::TextAssembler)>,
    /// Task management requests (by ITT) that aborted tasks in other
    /// sessions: how many of those have still to finish them, and the
    /// response once this session's own waits are over.
    others_aborting: FxHashMap<u32, (usize, Option<(TaskMgmtRequest, TmfResponse)>)>,
    /// Tasks this session aborted for another session's task management
    /// request, still running, and the waiter to drop when they end.
    abort_waiters: Vec<(Vec<u32>, AbortWaiter)>,
    closing: bool,
    /// Takes READ data ahead of the outcome (cut-through); set by the
    /// driver, `None` in tests that run the session by hand.
    early: Option<Early>,
    /// Why the session ended, once it has (its end line says it).
    end_reason: Option<&'static str>,
    /// Tasks collecting the Data-Out of a cut-through WRITE (some may be
    /// gone: pruned as they are looked at).
    streaming: Vec<u32>,
}

impl Session {
    /// A session in its full feature phase, as login left it.
    pub(crate) fn new(
        setup: SessionSetup,
        registry: Arc<Registry>,
        releases: Arc<Releases>,
        now: Instant,
    ) -> Self {
        let window = CmdWindow::new(setup.exp_cmd_sn, setup.options.queue_depth);
        let stat_sn = setup.stat_sn;
        let initiator: Arc<str> = Arc::from(setup.params.initiator_name.as_str());
        let initiator_counters = registry.directory().initiator_counters(&initiator);
        let budget = MemoryBudget::new(setup.options.memory_budget);
        Session {
            setup,
            registry,
            outputs: VecDeque::new(),
            internal: VecDeque::new(),
            releases,
            now,
            window,
            stat_sn,
            tasks: TaskSet::new(),
            initiator,
            initiator_counters,
            budget,
            awaiting: VecDeque::new(),
            retired: HashSet::default(),
            next_ttt: 1,
            pending_logout: None,
            last_rx: now,
            ping: None,
            text_continuation: None,
            text_in: None,
            others_aborting: FxHashMap::default(),
            abort_waiters: Vec::new(),
            closing: false,
            early: None,
            end_reason: None,
            streaming: Vec::new(),
        }
    }

    /// Send large READs' data as it is read, through `early` (it turns
    /// each part into an [`Event::Early`]).
    pub(crate) fn set_early(&mut self, early: Early) {
        self.early = Some(early);
    }

    /// The nexus starts: every LU learns of it (POWER ON unit attention).
    pub(crate) fn begin(&mut self) {
        if let Some(t) = &self.setup.target {
            t.scsi.nexus_added(self.setup.nexus);
            t.scsi
                .set_initiator_name(self.setup.nexus, &self.setup.params.initiator_name);
        }
    }

    /// Handle one event that happened at `now`; false ends the session
    /// (then call [`finish`](Self::finish)).
    pub(crate) fn handle(&mut self, ev: Event, now: Instant) -> bool {
        self.now = now;
        self.collect_releases();
        let mut go_on = self.apply(ev);
        while let Some(ev) = self.internal.pop_front() {
            go_on = self.apply(ev) && go_on;
        }
        if !self.awaiting.is_empty() {
            // Ask to be woken by the next release, then look once more so
            // one that came just before is not missed.
            self.releases.waiting.store(true, Ordering::Release);
            self.collect_releases();
        }
        go_on
    }

    /// Take back the budget freed by sent Data-In, and hand it on.
    fn collect_releases(&mut self) {
        let n = self.releases.take();
        if n > 0 {
            self.budget.release(n);
            self.retry_awaiting();
        }
    }

    /// The buffer [`Output::Reclaim`] asked for, taken back from the
    /// channel (`None`: it was gone).
    pub(crate) fn reclaimed(&mut self, itt: u32, placed: Option<ethersan_endpoint::PlacedBuf>) {
        let now = self.now;
        self.handle(Event::Reclaimed(itt, placed), now);
    }

    /// The next thing to do, if any.
    pub(crate) fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The session is over: abort what is left. Returns how many commands
    /// are still executing; their [`Event::Done`] go to
    /// [`finished_running`](Self::finished_running), then call
    /// [`close`](Self::close).
    pub(crate) fn finish(&mut self) -> usize {
        // Commands already executing finish, so no write is left
        // half-applied behind the initiator's back.
        self.abort_tasks(AbortScope::All);
        while let Some(ev) = self.internal.pop_front() {
            if let Event::Done(itt, _) = ev {
                self.tasks.complete(itt);
            }
        }
        self.tasks.running()
    }

    /// A command that was executing when the session ended has finished;
    /// returns how many are still executing.
    pub(crate) fn finished_running(&mut self, itt: u32) -> usize {
        self.tasks.complete(itt);
        self.tasks.running()
    }

    /// Forget the nexus and the session; the writer is told to close.
    /// Why the session ended: what ended it first.
    pub(crate) fn end_reason(&self) -> &'static str {
        self.end_reason
            .unwrap_or(if self.closing { "logged out" } else { "ended" })
    }

    pub(crate) fn close(&mut self) {
        if let Some(t) = &self.setup.target {
            t.scsi.nexus_lost(self.setup.nexus);
        }
        self.registry.remove_session(self.setup.id);
        self.outputs.push_back(Output::Send(WriterMsg::Close));
    }

    /// Apply one event; false ends the session.
    fn apply(&mut self, ev: Event) -> bool {
        match ev {
            Event::Pdu(Ok(pdu)) => {
                self.last_rx = self.now;
                self.on_pdu(pdu, None)
            }
            Event::WriteCommand(pdu, data) => {
                self.last_rx = self.now;
                self.on_pdu(pdu, Some(data))
            }
            Event::Pdu(Err(e)) => self.on_read_error(e),
            Event::Done(itt, resp) => {
                self.on_done(itt, resp);
                self.goes_on()
            }
            Event::Early(itt, part, total) => {
                self.on_early(itt, part, total);
                true
            }
            Event::Control(SessionControl::AbortLun(lun, waiter)) => {
                let running = self.abort_tasks(lun.map_or(AbortScope::All, AbortScope::Lun));
                // With nothing running the waiter is dropped here, which
                // reports at once.
                if let Some(w) = waiter.filter(|_| !running.is_empty()) {
                    self.abort_waiters.push((running, w));
                }
                self.dispatch();
                true
            }
            Event::Control(SessionControl::OthersAborted(itt)) => {
                self.other_session_aborted(itt);
                self.goes_on()
            }
            Event::Control(SessionControl::Shutdown(why)) => {
                debug!(session = self.setup.id, "session shut down: {why}");
                self.end_reason.get_or_insert(why);
                self.abort_tasks(AbortScope::All);
                false
            }
            Event::Tick => self.on_tick(),
            // The bytes themselves are collected by `handle`.
            Event::Released => true,
            Event::Reclaimed(itt, placed) => {
                self.on_reclaimed(itt, placed);
                true
            }
        }
    }

    fn on_read_error(&mut self, e: ReadError) -> bool {
        match e {
            ReadError::Closed => {
                debug!(session = self.setup.id, "connection closed by initiator");
                self.end_reason.get_or_insert(if self.closing {
                    "logged out"
                } else {
                    "connection closed by the initiator"
                });
                false
            }
            ReadError::Io(err) => {
                debug!(session = self.setup.id, %err, "connection lost");
                self.end_reason.get_or_insert("connection lost");
                false
            }
            ReadError::HeaderDigest(err) => {
                warn!(session = self.setup.id, %err, "header digest error; dropping connection");
                self.end_reason.get_or_insert("header digest error");
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
            if self.now.saturating_duration_since(sent) > self.setup.options.nop_timeout {
                warn!(
                    session = self.setup.id,
                    "initiator did not answer NOP-In; dropping connection"
                );
                self.end_reason
                    .get_or_insert("the initiator did not answer NOP-In");
                return false;
            }
            return true;
        }
        if self.now.saturating_duration_since(self.last_rx) >= interval {
            let ttt = self.alloc_ttt();
            self.ping = Some((ttt, self.now));
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

    fn send(&mut self, pdu: Pdu, data: Bytes) {
        let bhs = pdu.encode(data.len() as u32);
        self.outputs
            .push_back(Output::Send(WriterMsg::Frame(Frame { bhs, data })));
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

    /// One PDU; `aligned`: a write command's immediate data, read into
    /// an aligned buffer of its own (the PDU's `data` is then empty).
    fn on_pdu(&mut self, raw: RawPdu, aligned: Option<IoBuf>) -> bool {
        let pdu = match Pdu::decode(&raw.bhs) {
            Ok(p) => p,
            Err(_) => {
                self.reject(&raw.bhs, reject_reason::COMMAND_NOT_SUPPORTED);
                return true;
            }
        };
        if self.setup.params.is_discovery()
            && !matches!(
                pdu,
                Pdu::TextRequest(_) | Pdu::LogoutRequest(_) | Pdu::NopOut(_)
            )
        {
            self.reject(&raw.bhs, reject_reason::PROTOCOL_ERROR);
            return true;
        }
        match pdu {
            Pdu::ScsiCommand(cmd) => self.on_scsi_command(cmd, raw, aligned),
            Pdu::DataOut(d) => {
                // A Data-Out header without its data segment: the data was
                // placed (a byte stream always gives the segment).
                let placed =
                    (raw.data.is_empty() && raw.bhs.data_len() > 0).then(|| raw.bhs.data_len());
                self.on_data_out(d, raw.data, placed)
            }
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
        self.goes_on()
    }

    /// Whether the session has more to do: it is not closing, or it still
    /// owes an answer (running tasks, a logout, or a task management
    /// response waiting for other sessions' aborted tasks, which a cold
    /// reset sends before it closes).
    fn goes_on(&self) -> bool {
        !self.closing
            || self.tasks.running() > 0
            || self.pending_logout.is_some()
            || !self.others_aborting.is_empty()
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
                // Never held in the window: its ITT is free again.
                let (removed, _) = self.tasks.abort(AbortScope::Task(itt));
                for r in removed {
                    self.budget.release_forced(r.payload.forced);
                }
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
                let len = data
                    .len()
                    .min(self.setup.params.max_data_in_segment() as usize);
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
}
