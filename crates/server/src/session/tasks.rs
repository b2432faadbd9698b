//! Aborting a session's tasks and holding its data buffers to the
//! session's memory budget.

use ethersan_core::executor::{check_condition, Finished};
use ethersan_core::task_set::{AbortScope, Removed};

use super::{Event, Session, Task};

impl Session {
    /// Abort (silently) the tasks in `scope`; returns the ITTs of those
    /// still running, which must be waited for.
    pub(super) fn abort_tasks(&mut self, scope: AbortScope) -> Vec<u32> {
        let (removed, running) = self.tasks.abort(scope);
        self.drop_awaiting();
        self.release(removed);
        self.abandon_aborted_streams();
        running
    }

    /// Tasks taken out before they ran give back their window places and
    /// their buffers; the ITT of one whose CmdSN is still held in the
    /// window stays taken until that CmdSN comes up.
    pub(super) fn release(&mut self, removed: Vec<Removed<Task>>) {
        let mut freed = false;
        for r in removed {
            if r.admitted {
                self.window.complete();
            } else {
                self.retired.insert(r.tag);
            }
            self.awaiting.retain(|i| *i != r.tag);
            if r.payload.placed.is_some() {
                // Late placed frames for it are dropped.
                self.outputs.push_back(super::Output::Forget(r.tag));
            }
            self.budget.release_forced(r.payload.forced);
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
    /// expected length, and what it held as unsolicited data becomes part
    /// of it); false when it does not fit yet.
    pub(super) fn reserve(&mut self, itt: u32) -> bool {
        let Some(task) = self.tasks.get_mut(itt) else {
            return true;
        };
        let want = task.cmd.expected_len as usize;
        let more = want.saturating_sub(task.reserved);
        if more > 0 && !self.budget.try_reserve(more) {
            return false;
        }
        task.reserved += more;
        self.budget.release_forced(std::mem::take(&mut task.forced));
        if task.streams {
            // Pieces instead of one buffer (`dataout`).
            task.room = want;
            self.begin_collecting(itt);
            return true;
        }
        if task.cmd.write && task.room < want {
            // Capacity for all of it, aligned, not zeroed: Data-Out fills
            // it in order.
            task.data.reserve_total(want);
            task.room = want;
        }
        true
    }

    /// Give waiting tasks their buffers, oldest first, while they fit; a
    /// write then asks for its data, a read the task set started runs.
    pub(super) fn retry_awaiting(&mut self) {
        let mut collecting = false;
        while let Some(&itt) = self.awaiting.front() {
            if !self.tasks.contains(itt) || self.tasks.is_aborted(itt) {
                self.awaiting.pop_front();
                continue;
            }
            if !self.reserve(itt) {
                break;
            }
            collecting |= self.tasks.get(itt).is_some_and(|t| t.collecting.is_some());
            self.awaiting.pop_front();
            self.solicit(itt);
            let start = self
                .tasks
                .get_mut(itt)
                .is_some_and(|t| std::mem::take(&mut t.start_waiting));
            if start {
                self.start(itt);
            }
        }
        if collecting {
            // A cut-through WRITE runs before its data: it may start now.
            self.dispatch();
        }
    }

    /// Aborted tasks the task set started but that never got their buffer
    /// finish at once (no response goes out for them).
    pub(super) fn drop_awaiting(&mut self) {
        let stuck: Vec<u32> = self
            .awaiting
            .iter()
            .copied()
            .filter(|i| {
                self.tasks.is_aborted(*i) && self.tasks.get(*i).is_some_and(|t| t.start_waiting)
            })
            .collect();
        for itt in stuck {
            self.awaiting.retain(|i| *i != itt);
            if let Some(t) = self.tasks.get_mut(itt) {
                t.start_waiting = false;
            }
            self.internal.push_back(Event::Done(
                itt,
                Finished {
                    response: check_condition(0x0b, 0x00, 0x00),
                    preempted: Vec::new(),
                },
            ));
        }
    }
}
