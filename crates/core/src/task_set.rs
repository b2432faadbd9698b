//! The task set of one I_T nexus (SAM-5 §8: task attributes and the order
//! in which tasks may run; §7: task management functions and their waits).
//!
//! A synchronous state machine with no channel, clock or spawn inside: the
//! transport feeds it events — a task arrived ([`TaskSet::insert`]), it
//! reached its turn in command order ([`TaskSet::admit`]), its data is all
//! here ([`TaskSet::set_data_ready`]), it finished ([`TaskSet::complete`]),
//! a task management request ([`TaskSet::task_management`]) — and asks it
//! which tasks may start now ([`TaskSet::next_startable`]). Each task
//! carries a payload of the transport's own (the iSCSI session keeps the
//! command PDU, its data buffer and its R2T state there), so the task set
//! is the one owner of a session's tasks.
//!
//! Ordering rules (SAM-5 §8.6): a HEAD OF QUEUE task is enabled at once
//! (newest first); a SIMPLE task waits for every older ORDERED and HEAD OF
//! QUEUE task; an ORDERED task waits for every older task. "Older" is the
//! order of admission (CmdSN order in iSCSI).

use std::collections::{BTreeSet, VecDeque};

// Tags are small integers the initiator picks, at most a command window
// of them: a fast non-cryptographic hash (no DoS surface at that size).
use rustc_hash::FxHashMap;

/// A task's tag (the iSCSI Initiator Task Tag, the AoE tag).
pub type Tag = u32;

/// SAM-5 task attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskAttr {
    /// SIMPLE (also untagged and unknown attributes).
    Simple,
    /// ORDERED: runs after every older task, and every newer SIMPLE task
    /// waits for it.
    Ordered,
    /// HEAD OF QUEUE: runs at once, and every newer SIMPLE task waits for it.
    HeadOfQueue,
}

/// Task management functions (SAM-5 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tmf {
    /// ABORT TASK: the task with this tag on this LUN.
    AbortTask {
        /// LUN the task was sent to.
        lun: u64,
        /// The referenced task's tag.
        tag: Tag,
    },
    /// ABORT TASK SET: this nexus's tasks on the LUN.
    AbortTaskSet {
        /// The LUN.
        lun: u64,
    },
    /// CLEAR TASK SET: every nexus's tasks on the LUN.
    ClearTaskSet {
        /// The LUN.
        lun: u64,
    },
    /// CLEAR ACA (not supported: NormACA is 0).
    ClearAca {
        /// The LUN.
        lun: u64,
    },
    /// LOGICAL UNIT RESET: every nexus's tasks on the LUN, and the LU's
    /// state (reservations held by RESERVE, mode pages, unit attentions).
    LogicalUnitReset {
        /// The LUN.
        lun: u64,
    },
    /// I_T NEXUS RESET: every task of this nexus.
    ItNexusReset,
    /// TARGET WARM RESET (iSCSI's; SAM's TARGET RESET).
    TargetWarmReset,
    /// TARGET COLD RESET: a warm reset that also ends every connection.
    TargetColdReset,
}

/// The answer to a task management request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmfResponse {
    /// FUNCTION COMPLETE.
    Complete,
    /// The referenced task does not exist.
    NoTask,
    /// The LUN does not exist.
    NoLun,
    /// FUNCTION NOT SUPPORTED.
    NotSupported,
}

/// What a task management function does beyond this nexus's task set; the
/// transport carries it out (other sessions, the logical unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TmfEffects {
    /// Abort the tasks of every other nexus of the target: `Some(Some(lun))`
    /// on one LUN, `Some(None)` on every LUN.
    pub abort_others: Option<Option<u64>>,
    /// Reset logical unit state: `Some((kind, Some(lun)))` one LU,
    /// `Some((kind, None))` every LU of the target.
    pub reset: Option<(ethersan_scsi::ResetKind, Option<u64>)>,
    /// End every session of the target, this one too once the response
    /// has gone out (TARGET COLD RESET).
    pub end_sessions: bool,
}

/// Which tasks an abort applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortScope {
    /// One task.
    Task(Tag),
    /// Every task on one LUN.
    Lun(u64),
    /// Every task.
    All,
}

/// A task taken out of the task set before it ran.
#[derive(Debug)]
pub struct Removed<T> {
    /// Its tag.
    pub tag: Tag,
    /// The transport's payload.
    pub payload: T,
    /// Whether it had been admitted (took a place in the command window).
    pub admitted: bool,
}

/// A finished task, and the task management requests it was the last
/// wait of.
#[derive(Debug)]
pub struct Completed<T, M> {
    /// The transport's payload.
    pub payload: T,
    /// Aborted while it ran: no response is sent for it.
    pub aborted: bool,
    /// Whether it had been admitted.
    pub admitted: bool,
    /// Task management requests whose waits are over: answer them now.
    pub tmfs_done: Vec<(M, TmfResponse)>,
}

/// What [`TaskSet::task_management`] decided.
#[derive(Debug)]
pub struct TmfOutcome<T, M> {
    /// The response (sent when the waits are over).
    pub response: TmfResponse,
    /// Effects beyond this nexus, for the transport to carry out now.
    pub effects: TmfEffects,
    /// Tasks aborted before they ran (their payloads, to drop).
    pub removed: Vec<Removed<T>>,
    /// `Some(token)` when nothing had to be waited for: answer now.
    /// `None`: the token comes back from [`TaskSet::complete`] when the
    /// last aborted running task finishes.
    pub done: Option<M>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for its data.
    Collecting,
    /// Waiting for its turn (or for admission).
    Ready,
    /// Started.
    Running,
}

#[derive(Debug)]
struct Entry<T> {
    payload: T,
    lun: u64,
    attr: TaskAttr,
    seq: Option<u64>,
    state: State,
    aborted: bool,
    /// Task management does not wait for it (SANITIZE goes on in the
    /// background, SBC-4 §4.11).
    exempt: bool,
}

#[derive(Debug)]
struct PendingTmf<M> {
    token: M,
    response: TmfResponse,
    waiting_for: Vec<Tag>,
}

/// The tasks of one I_T nexus. `T` is the transport's per-task payload,
/// `M` its token for a task management request waiting for tasks to end.
#[derive(Debug)]
pub struct TaskSet<T, M> {
    tasks: FxHashMap<Tag, Entry<T>>,
    next_seq: u64,
    /// Admitted, unfinished tasks, by admission order.
    outstanding: BTreeSet<u64>,
    /// Admitted, unfinished ORDERED and HEAD OF QUEUE tasks.
    barriers: BTreeSet<u64>,
    /// Admitted ORDERED tasks (subset of `barriers`).
    ordered: BTreeSet<u64>,
    /// Admitted tasks with their data, not started, in start order.
    ready: VecDeque<Tag>,
    running: usize,
    tmfs: Vec<PendingTmf<M>>,
}

impl<T, M> Default for TaskSet<T, M> {
    fn default() -> Self {
        TaskSet {
            tasks: FxHashMap::default(),
            next_seq: 0,
            outstanding: BTreeSet::new(),
            barriers: BTreeSet::new(),
            ordered: BTreeSet::new(),
            ready: VecDeque::new(),
            running: 0,
            tmfs: Vec::new(),
        }
    }
}

impl<T, M> TaskSet<T, M> {
    /// An empty task set.
    pub fn new() -> Self {
        Self::default()
    }

    /// A task arrived (not yet admitted: the transport may hold it until
    /// its turn in command order). `data_ready`: it needs no more data.
    /// `exempt`: task management does not wait for it (SANITIZE). A tag
    /// already in use is refused and the payload handed back.
    pub fn insert(
        &mut self,
        tag: Tag,
        lun: u64,
        attr: TaskAttr,
        data_ready: bool,
        exempt: bool,
        payload: T,
    ) -> Result<(), T> {
        if self.tasks.contains_key(&tag) {
            return Err(payload);
        }
        let state = if data_ready {
            State::Ready
        } else {
            State::Collecting
        };
        self.tasks.insert(
            tag,
            Entry {
                payload,
                lun,
                attr,
                seq: None,
                state,
                aborted: false,
                exempt,
            },
        );
        Ok(())
    }

    /// The task reached its turn in command order and enters the task set.
    /// False when there is no such task (it was aborted before its turn).
    pub fn admit(&mut self, tag: Tag) -> bool {
        let Some(e) = self.tasks.get_mut(&tag) else {
            return false;
        };
        if e.seq.is_some() {
            return true;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        e.seq = Some(seq);
        self.outstanding.insert(seq);
        match e.attr {
            TaskAttr::Ordered => {
                self.barriers.insert(seq);
                self.ordered.insert(seq);
            }
            TaskAttr::HeadOfQueue => {
                self.barriers.insert(seq);
            }
            TaskAttr::Simple => {}
        }
        if e.state == State::Ready {
            Self::enqueue(&mut self.ready, tag, e.attr);
        }
        true
    }

    fn enqueue(ready: &mut VecDeque<Tag>, tag: Tag, attr: TaskAttr) {
        if attr == TaskAttr::HeadOfQueue {
            ready.push_front(tag);
        } else {
            ready.push_back(tag);
        }
    }

    /// All of the task's data is here.
    pub fn set_data_ready(&mut self, tag: Tag) {
        let Some(e) = self.tasks.get_mut(&tag) else {
            return;
        };
        if e.state != State::Collecting {
            return;
        }
        e.state = State::Ready;
        if e.seq.is_some() {
            Self::enqueue(&mut self.ready, tag, e.attr);
        }
    }

    /// Whether a task with this tag is in the set (in any state).
    pub fn contains(&self, tag: Tag) -> bool {
        self.tasks.contains_key(&tag)
    }

    /// The task's payload.
    pub fn get(&self, tag: Tag) -> Option<&T> {
        self.tasks.get(&tag).map(|e| &e.payload)
    }

    /// The task's payload, to change.
    pub fn get_mut(&mut self, tag: Tag) -> Option<&mut T> {
        self.tasks.get_mut(&tag).map(|e| &mut e.payload)
    }

    /// Whether the task was aborted (it is still running and must finish).
    pub fn is_aborted(&self, tag: Tag) -> bool {
        self.tasks.get(&tag).is_some_and(|e| e.aborted)
    }

    /// Whether the task has been admitted.
    pub fn is_admitted(&self, tag: Tag) -> bool {
        self.tasks.get(&tag).is_some_and(|e| e.seq.is_some())
    }

    /// Tasks started and not yet completed.
    pub fn running(&self) -> usize {
        self.running
    }

    /// Tasks in the set, in any state.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    fn enabled(&self, e: &Entry<T>) -> bool {
        let Some(seq) = e.seq else {
            return false;
        };
        match e.attr {
            TaskAttr::HeadOfQueue => true,
            TaskAttr::Simple => self.barriers.range(..seq).next().is_none(),
            TaskAttr::Ordered => self.outstanding.range(..seq).next().is_none(),
        }
    }

    /// The next task that may start now, marked running; call until
    /// `None` after every event.
    pub fn next_startable(&mut self) -> Option<Tag> {
        let mut i = 0;
        while i < self.ready.len() {
            let tag = self.ready[i];
            let Some(e) = self.tasks.get(&tag) else {
                self.ready.remove(i);
                continue;
            };
            if !self.enabled(e) {
                i += 1;
                continue;
            }
            self.ready.remove(i);
            let e = self.tasks.get_mut(&tag).expect("looked up above");
            e.state = State::Running;
            self.running += 1;
            return Some(tag);
        }
        None
    }

    fn forget(&mut self, seq: Option<u64>) {
        if let Some(seq) = seq {
            self.outstanding.remove(&seq);
            self.barriers.remove(&seq);
            self.ordered.remove(&seq);
        }
    }

    /// A started task finished. `None` if the tag is not a running task.
    pub fn complete(&mut self, tag: Tag) -> Option<Completed<T, M>> {
        if self.tasks.get(&tag)?.state != State::Running {
            return None;
        }
        let e = self.tasks.remove(&tag).expect("looked up above");
        self.running -= 1;
        self.forget(e.seq);
        Some(Completed {
            payload: e.payload,
            aborted: e.aborted,
            admitted: e.seq.is_some(),
            tmfs_done: self.waits_over(tag),
        })
    }

    fn waits_over(&mut self, finished: Tag) -> Vec<(M, TmfResponse)> {
        for p in &mut self.tmfs {
            p.waiting_for.retain(|t| *t != finished);
        }
        let (done, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut self.tmfs)
            .into_iter()
            .partition(|p| p.waiting_for.is_empty());
        self.tmfs = wait;
        done.into_iter().map(|p| (p.token, p.response)).collect()
    }

    /// Abort the tasks in `scope` silently (no response is sent for them):
    /// those not started are removed and returned; running ones finish but
    /// are marked aborted, and their tags (except exempt ones) are returned
    /// as the ones to wait for — also those an earlier abort already
    /// marked, so a second request waits for them too (SAM-5 §7).
    pub fn abort(&mut self, scope: AbortScope) -> (Vec<Removed<T>>, Vec<Tag>) {
        let victims: Vec<Tag> = self
            .tasks
            .iter()
            .filter(|(tag, e)| match scope {
                AbortScope::Task(t) => **tag == t,
                AbortScope::Lun(l) => e.lun == l,
                AbortScope::All => true,
            })
            .map(|(t, _)| *t)
            .collect();
        let mut removed = Vec::new();
        let mut wait = Vec::new();
        for tag in victims {
            let e = self.tasks.get_mut(&tag).expect("listed above");
            e.aborted = true;
            if e.state == State::Running {
                if !e.exempt {
                    wait.push(tag);
                }
                continue;
            }
            let e = self.tasks.remove(&tag).expect("listed above");
            self.ready.retain(|t| *t != tag);
            self.forget(e.seq);
            removed.push(Removed {
                tag,
                admitted: e.seq.is_some(),
                payload: e.payload,
            });
        }
        removed.sort_by_key(|r| r.tag);
        (removed, wait)
    }

    /// A task management request (SAM-5 §7). `lun_exists` says whether
    /// the request's LUN is one the nexus may address. The response is
    /// due at once (`done` is `Some(token)`) or when the aborted running
    /// tasks finish (the token comes back from [`complete`](Self::complete)).
    pub fn task_management(&mut self, tmf: Tmf, lun_exists: bool, token: M) -> TmfOutcome<T, M> {
        use ethersan_scsi::ResetKind;
        let mut effects = TmfEffects::default();
        let (response, scope) = match tmf {
            Tmf::AbortTask { lun, tag } => {
                if self.tasks.get(&tag).is_some_and(|e| e.lun == lun) {
                    (TmfResponse::Complete, Some(AbortScope::Task(tag)))
                } else {
                    (TmfResponse::NoTask, None)
                }
            }
            Tmf::AbortTaskSet { .. }
            | Tmf::ClearTaskSet { .. }
            | Tmf::LogicalUnitReset { .. }
            | Tmf::ClearAca { .. }
                if !lun_exists =>
            {
                (TmfResponse::NoLun, None)
            }
            Tmf::AbortTaskSet { lun } => (TmfResponse::Complete, Some(AbortScope::Lun(lun))),
            Tmf::ClearTaskSet { lun } => {
                effects.abort_others = Some(Some(lun));
                (TmfResponse::Complete, Some(AbortScope::Lun(lun)))
            }
            Tmf::LogicalUnitReset { lun } => {
                effects.abort_others = Some(Some(lun));
                effects.reset = Some((ResetKind::LogicalUnit, Some(lun)));
                (TmfResponse::Complete, Some(AbortScope::Lun(lun)))
            }
            Tmf::ClearAca { .. } => (TmfResponse::NotSupported, None),
            Tmf::ItNexusReset => (TmfResponse::Complete, Some(AbortScope::All)),
            Tmf::TargetWarmReset | Tmf::TargetColdReset => {
                let cold = tmf == Tmf::TargetColdReset;
                effects.abort_others = Some(None);
                effects.reset = Some((
                    if cold {
                        ResetKind::TargetCold
                    } else {
                        ResetKind::TargetWarm
                    },
                    None,
                ));
                effects.end_sessions = cold;
                (TmfResponse::Complete, Some(AbortScope::All))
            }
        };
        let (removed, wait) = match scope {
            Some(s) => self.abort(s),
            None => (Vec::new(), Vec::new()),
        };
        let done = if wait.is_empty() {
            Some(token)
        } else {
            self.tmfs.push(PendingTmf {
                token,
                response,
                waiting_for: wait,
            });
            None
        };
        TmfOutcome {
            response,
            effects,
            removed,
            done,
        }
    }
}

#[cfg(test)]
mod tests;
