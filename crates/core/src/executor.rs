//! The one place that runs a SCSI command, for every transport.
//!
//! A command is submitted once to its target ([`ScsiTarget::submit`]: the
//! lookup, the LUN policy and the unit's checks run once) on the caller's
//! thread. It is then finished (page cache, RAM, metadata: no thread
//! handoff), pending in the LUN's engine (io_uring: completed from the
//! engine's thread), or a job for the blocking pool the transport injects
//! ([`BlockingPool`]: the sync engine's I/O, slow-path commands). With
//! `inline_io` off, the submission itself runs on the pool. A panic in
//! command emulation fails the command with HARDWARE ERROR / INTERNAL
//! TARGET FAILURE instead of taking the session down. After a PERSISTENT
//! RESERVE OUT the nexuses it preempted are reported
//! ([`Finished::preempted`]) so the transport can abort their tasks
//! (PREEMPT AND ABORT). Every command is counted on its LUN's and its
//! initiator's [`IoCounters`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ethersan_scsi::commands::{lookup, Op};
use ethersan_scsi::{
    DataInSink, Nexus, ScsiCommand, ScsiResponse, ScsiStatus, ScsiTarget, Submitted, WriteStream,
};

use crate::counters::{CommandKind, IoCounters};

/// Runs blocking jobs off the transport's event loop (tokio's
/// `spawn_blocking`, a thread pool, or inline in tests).
pub trait BlockingPool: Send + Sync {
    /// Run `job` where it may block.
    fn spawn(&self, job: Box<dyn FnOnce() + Send>);
}

/// A pool that runs the job at once on the caller's thread (tests, tools).
#[derive(Debug, Default, Clone, Copy)]
pub struct Inline;

impl BlockingPool for Inline {
    fn spawn(&self, job: Box<dyn FnOnce() + Send>) {
        job()
    }
}

/// One command, as the transport hands it over.
#[derive(Debug)]
pub struct Command {
    /// The I_T nexus that sent it.
    pub nexus: Nexus,
    /// The initiator's name (LUN masking, read-only LUNs).
    pub initiator: Arc<str>,
    /// The security level of the native transport channel it came over
    /// (`None`: another transport); see [`ethersan_scsi::Requester`].
    pub channel_level: Option<u8>,
    /// The LUN, decoded to a flat number.
    pub lun: u64,
    /// The CDB.
    pub cdb: Vec<u8>,
    /// Data-Out bytes (empty for a command without data); received into
    /// an aligned [`IoBuf`](ethersan_scsi::IoBuf), a WRITE reaches an
    /// `O_DIRECT` store without a copy.
    pub data: ethersan_scsi::IoBuf,
    /// Expected data transfer length from the transport.
    pub expected_len: u32,
    /// The transport's name for the task (iSCSI: its ITT), handed back to
    /// [`Done`] with the outcome.
    pub tag: u32,
    /// When the transport started it (the latency counters measure from
    /// here; the transport has the time at hand already).
    pub started: Instant,
    /// Where a large READ may send its data as it is read, before its
    /// outcome (cut-through): called with the tag, each part in order and
    /// the bytes the whole command produces. The outcome's `data_in` is
    /// then only what is left after the parts. `None`: all of it comes
    /// with the outcome.
    pub early: Option<Early>,
    /// A large WRITE's data, handed to the unit as it arrives, after the
    /// command (cut-through; only for a command that
    /// [`ScsiTarget::streams_write`] accepted): `data` is then empty and
    /// the command answers after the transport ended the stream.
    pub stream: Option<WriteStream>,
}

/// Takes a READ's data ahead of its outcome ([`Command::early`]): the
/// command's tag, one part of the data, the bytes the command produces.
/// One per transport session, like [`Done`].
#[derive(Clone)]
pub struct Early(pub Arc<dyn Fn(u32, ethersan_scsi::IoBuf, usize) + Send + Sync>);

impl std::fmt::Debug for Early {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Early(..)")
    }
}

/// A finished command.
#[derive(Debug)]
pub struct Finished {
    /// The response to send.
    pub response: ScsiResponse,
    /// I_T nexuses whose tasks on this LUN a PREEMPT AND ABORT preempted:
    /// the transport aborts their tasks (in their own sessions).
    pub preempted: Vec<Nexus>,
}

/// Where a command's counts go.
#[derive(Debug, Clone, Default)]
pub struct Counting {
    /// The LUN's counters.
    pub lun: Option<Arc<IoCounters>>,
    /// The initiator's counters.
    pub initiator: Option<Arc<IoCounters>>,
    /// The session's own counters (what `ethersan ctl session ls` shows).
    pub session: Option<Arc<IoCounters>>,
}

/// Runs commands against one target's logical units.
#[derive(Debug, Clone, Copy)]
pub struct Executor {
    /// Try each command without waiting on the caller's thread first.
    pub inline_io: bool,
}

/// Called once with a command's tag ([`Command::tag`]) and outcome, on the
/// engine's completion thread or the blocking pool. One per transport
/// session, shared by its commands (no allocation per command).
pub type Done = Arc<dyn Fn(u32, Finished) + Send + Sync>;

/// What happens when a command's response is ready: count it, look for
/// preempted nexuses, hand it over. Shared in an `Arc` (one allocation per
/// command) by the engine's completion and the submitting thread; the
/// first to finish wins.
struct FinisherState {
    started: Instant,
    kind: CommandKind,
    write_bytes: u64,
    lun: u64,
    /// The target, for a PERSISTENT RESERVE OUT's preempted nexuses (no
    /// reference count taken for any other command).
    pr_target: Option<Arc<ScsiTarget>>,
    counting: Counting,
    tag: u32,
    done: Done,
    /// Bytes of data handed over early ([`Command::early`]).
    early_bytes: AtomicU64,
    /// Set by the first `finish`: if emulation panicked after handing the
    /// engine its completion, the engine's late call is ignored.
    fired: AtomicBool,
}

impl Drop for FinisherState {
    fn drop(&mut self) {
        // Finished, or abandoned with its session: no longer in flight.
        if let Some(c) = &self.counting.lun {
            c.end();
        }
    }
}

impl FinisherState {
    /// Hand the outcome to `done` (the first call only).
    fn finish(&self, response: ScsiResponse) {
        if let Some(f) = self.outcome(response) {
            (self.done)(self.tag, f)
        }
    }

    /// Count the command and build its outcome; `None` when it was
    /// already finished.
    fn outcome(&self, response: ScsiResponse) -> Option<Finished> {
        if self.fired.swap(true, Ordering::AcqRel) {
            return None;
        }
        let bytes = match self.kind {
            CommandKind::Read => {
                response.data_in.len() as u64 + self.early_bytes.load(Ordering::Relaxed)
            }
            CommandKind::Write => self.write_bytes,
            CommandKind::Other => 0,
        };
        let latency = self.started.elapsed();
        for c in [
            &self.counting.lun,
            &self.counting.initiator,
            &self.counting.session,
        ]
        .into_iter()
        .flatten()
        {
            c.record(self.kind, bytes, &response, latency);
        }
        let preempted = match &self.pr_target {
            Some(t) if response.status == ScsiStatus::Good => t.take_preempted(self.lun),
            _ => Vec::new(),
        };
        Some(Finished {
            response,
            preempted,
        })
    }

    /// Carry a submission on: finished now, pending (the engine calls back),
    /// or a job to run here (on a thread where blocking is fine).
    fn settle_here(&self, s: Submitted) {
        match s {
            Submitted::Done(r) => self.finish(r),
            Submitted::Pending => {}
            Submitted::Blocking(job) => self.finish(guarded(job, |r| r)),
        }
    }
}

impl Executor {
    /// Run `cmd` on `target`. A command that finishes during this call
    /// (page cache, RAM, metadata, a failed check) is returned and `done`
    /// is not called: the transport handles it at once, without a trip
    /// through its event queue. Otherwise `None`, and `done` gets the
    /// outcome exactly once, on the engine's completion thread or on the
    /// blocking pool (or on this thread, if the engine completes before
    /// it returns).
    #[must_use = "a command that finished at once is returned, not passed to `done`"]
    pub fn execute(
        &self,
        target: &Arc<ScsiTarget>,
        cmd: Command,
        counting: Counting,
        pool: &dyn BlockingPool,
        done: &Done,
    ) -> Option<Finished> {
        let op = lookup(&cmd.cdb).map(|d| d.op);
        if let Some(c) = &counting.lun {
            c.begin();
        }
        let fin = Arc::new(FinisherState {
            started: cmd.started,
            kind: CommandKind::of_op(op),
            write_bytes: cmd.stream.as_ref().map_or(cmd.data.len(), WriteStream::len) as u64,
            lun: cmd.lun,
            pr_target: (op == Some(Op::PrOut)).then(|| target.clone()),
            counting,
            tag: cmd.tag,
            done: done.clone(),
            early_bytes: AtomicU64::new(0),
            fired: AtomicBool::new(false),
        });
        let early = cmd.early.map(|e| {
            let (fin, tag) = (fin.clone(), cmd.tag);
            DataInSink(Arc::new(move |part: ethersan_scsi::IoBuf, total| {
                if fin.fired.load(Ordering::Acquire) {
                    // Answered already (a panic failed it): its tag may
                    // name another command by now.
                    return;
                }
                fin.early_bytes
                    .fetch_add(part.len() as u64, Ordering::Relaxed);
                (e.0)(tag, part, total)
            }))
        });
        let initiator = cmd.initiator;
        let channel_level = cmd.channel_level;
        let stream = cmd.stream;
        let scsi = ScsiCommand {
            nexus: cmd.nexus,
            lun: cmd.lun,
            cdb: cmd.cdb,
            data_out: cmd.data,
            expected_len: cmd.expected_len,
        };
        if !self.inline_io {
            // Everything, the submission too, on the blocking pool.
            let target = target.clone();
            pool.spawn(Box::new(move || {
                let s = submit(
                    &target,
                    scsi,
                    &initiator,
                    channel_level,
                    early,
                    stream,
                    &fin,
                );
                fin.settle_here(s)
            }));
            return None;
        }
        match submit(target, scsi, &initiator, channel_level, early, stream, &fin) {
            Submitted::Done(r) => fin.outcome(r),
            Submitted::Pending => None,
            Submitted::Blocking(job) => {
                pool.spawn(Box::new(move || fin.settle_here(Submitted::Blocking(job))));
                None
            }
        }
    }
}

/// Submit `scsi` to `target` once, guarded; the engine's completion (if it
/// takes one) finishes through `fin`.
fn submit(
    target: &ScsiTarget,
    scsi: ScsiCommand,
    initiator: &str,
    channel_level: Option<u8>,
    early: Option<DataInSink>,
    stream: Option<WriteStream>,
    fin: &Arc<FinisherState>,
) -> Submitted {
    let completion = fin.clone();
    guarded(
        || {
            target.submit_from(
                scsi,
                ethersan_scsi::Requester {
                    initiator: Some(initiator),
                    channel_level,
                    early: early.as_ref(),
                    data_out: stream.as_ref(),
                },
                Box::new(move |r| completion.finish(r)),
            )
        },
        Submitted::Done,
    )
}

/// Run command emulation so that a bug in it cannot take the session
/// down: a panic is logged and the command fails as HARDWARE ERROR /
/// INTERNAL TARGET FAILURE, handed to `failed` to fit `f`'s result.
fn guarded<T>(f: impl FnOnce() -> T, failed: impl FnOnce(ScsiResponse) -> T) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        tracing::error!("command emulation panicked");
        failed(check_condition(0x04, 0x44, 0x00))
    })
}

/// A CHECK CONDITION response for failures found before the command
/// reaches its logical unit (fixed-format sense).
pub fn check_condition(key: u8, asc: u8, ascq: u8) -> ScsiResponse {
    let sense = ethersan_scsi::sense::Sense::new(key, asc, ascq).to_bytes(false);
    ScsiResponse {
        status: ScsiStatus::CheckCondition,
        sense,
        data_in: Default::default(),
        data_out_len: None,
    }
}

#[cfg(test)]
mod tests;
