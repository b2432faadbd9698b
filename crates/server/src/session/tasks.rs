//! Aborting a session's tasks and holding its data buffers to the
//! session's memory budget.

use ethersan_core::executor::{check_condition, Finished};
use ethersan_core::task_set::{AbortScope, Removed};

use super::{Event, Need, Session, Task};

impl Session {
    /// Abort (silently) the tasks in `scope`; returns the ITTs of those
    /// still running, which must be waited for.
    pub(super) fn abort_tasks(&mut self, scope: AbortScope) -> Vec<u32> {
        let (removed, running) = self.tasks.abort(scope);
        self.release(removed);
        self.drop_awaiting(&running);
        running
    }

    /// Tasks taken out before they ran give back their window places.
    pub(super) fn release(&mut self, removed: Vec<Removed<Task>>) {
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
    pub(super) fn reserve(&mut self, itt: u32) -> bool {
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
    pub(super) fn retry_awaiting(&mut self) {
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
    pub(super) fn drop_awaiting(&mut self, running: &[u32]) {
        for itt in running {
            if let Some(pos) = self
                .awaiting
                .iter()
                .position(|(i, n)| i == itt && *n == Need::Start)
            {
                self.awaiting.remove(pos);
                self.internal.push_back(Event::Done(
                    *itt,
                    Finished {
                        response: check_condition(0x0b, 0x00, 0x00),
                        preempted: Vec::new(),
                    },
                ));
            }
        }
    }
}
