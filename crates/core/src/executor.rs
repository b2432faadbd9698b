//! The one place that runs a SCSI command, for every transport.
//!
//! A command first gets a no-wait attempt on the caller's thread (page
//! cache, RAM, metadata: no thread handoff); a READ or WRITE on a LUN with
//! an asynchronous engine (io_uring) is then submitted to it and completes
//! from the engine's thread; anything else runs on the blocking pool the
//! transport injects ([`BlockingPool`]). A panic in command emulation fails
//! the command with HARDWARE ERROR / INTERNAL TARGET FAILURE instead of
//! taking the session down. After a PERSISTENT RESERVE OUT the nexuses it
//! preempted are reported ([`Finished::preempted`]) so the transport can
//! abort their tasks (PREEMPT AND ABORT). Every command is counted on its
//! LUN's and its initiator's [`IoCounters`].

use std::sync::Arc;
use std::time::Instant;

use ethersan_scsi::commands::{lookup, Op};
use ethersan_scsi::{Nexus, Prepared, ScsiRequest, ScsiResponse, ScsiStatus, ScsiTarget};

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
    /// The LUN, decoded to a flat number.
    pub lun: u64,
    /// The CDB.
    pub cdb: Vec<u8>,
    /// Data-Out bytes (empty for a command without data).
    pub data: Vec<u8>,
    /// Expected data transfer length from the transport.
    pub expected_len: u32,
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
}

/// Runs commands against one target's logical units.
#[derive(Debug, Clone, Copy)]
pub struct Executor {
    /// Try each command without waiting on the caller's thread first.
    pub inline_io: bool,
}

type Done = Box<dyn FnOnce(Finished) + Send>;

impl Executor {
    /// Run `cmd` on `target`; `done` gets the outcome exactly once, on
    /// this thread (no-wait attempt succeeded, or a check failed), on the
    /// engine's completion thread, or on the blocking pool.
    pub fn execute(
        &self,
        target: &Arc<ScsiTarget>,
        cmd: Command,
        counting: Counting,
        pool: &dyn BlockingPool,
        done: Done,
    ) {
        let started = Instant::now();
        let kind = CommandKind::of(&cmd.cdb);
        let pr_out = lookup(&cmd.cdb).is_some_and(|d| d.op == Op::PrOut);
        let write_bytes = cmd.data.len() as u64;
        let lun = cmd.lun;
        let tgt = target.clone();
        // Count, look for preempted nexuses, hand over.
        let finish = move |response: ScsiResponse| {
            let bytes = match kind {
                CommandKind::Read => response.data_in.len() as u64,
                CommandKind::Write => write_bytes,
                CommandKind::Other => 0,
            };
            let latency = started.elapsed();
            for c in [&counting.lun, &counting.initiator].into_iter().flatten() {
                c.record(kind, bytes, &response, latency);
            }
            let preempted = if pr_out && response.status == ScsiStatus::Good {
                tgt.take_preempted(lun)
            } else {
                Vec::new()
            };
            done(Finished {
                response,
                preempted,
            })
        };
        let req = ScsiRequest {
            nexus: cmd.nexus,
            lun: cmd.lun,
            cdb: &cmd.cdb,
            data_out: &cmd.data,
            expected_len: cmd.expected_len,
        };
        let initiator = Some(&*cmd.initiator);
        // Fast path: a command that needs no waiting runs right here.
        if self.inline_io {
            let inline = guarded(|| target.try_execute_nowait_for(&req, initiator), Some);
            if let Some(resp) = inline {
                return finish(resp);
            }
        }
        // A READ or WRITE on a LUN with an asynchronous engine: checked
        // here, submitted to the engine, completed from its thread.
        match guarded(|| target.prepare_async_for(&req, initiator), Prepared::Done) {
            Prepared::Done(resp) => finish(resp),
            Prepared::Io(plan) => plan.submit(cmd.data, finish),
            Prepared::Blocking => {
                let target = target.clone();
                pool.spawn(Box::new(move || {
                    let req = ScsiRequest {
                        nexus: cmd.nexus,
                        lun: cmd.lun,
                        cdb: &cmd.cdb,
                        data_out: &cmd.data,
                        expected_len: cmd.expected_len,
                    };
                    let resp = guarded(|| target.execute_for(&req, Some(&*cmd.initiator)), |r| r);
                    finish(resp)
                }));
            }
        }
    }
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
        data_in: Vec::new(),
        data_out_len: None,
    }
}

#[cfg(test)]
mod tests;
