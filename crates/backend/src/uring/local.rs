//! The calling thread's own ring ([`LocalRing`]) and the guard that makes
//! a thread bypass it ([`BypassLocal`]).

use super::*;

/// The calling thread's ring, when it installed one.
struct Local {
    core: Core,
    /// Work for the next [`LocalRing::turn`]: SQEs not yet entered, or
    /// completions not yet run.
    needs_turn: bool,
    /// The thread's driver, waiting for work.
    waker: Option<Waker>,
    /// The last turn left entries the kernel refused for now (EAGAIN,
    /// EBUSY): the driver turns again after a pause.
    retry: bool,
}

thread_local! {
    static LOCAL: RefCell<Option<Local>> = const { RefCell::new(None) };
    /// Set while this thread waits for a request it submits
    /// ([`crate::submit_and_wait`]): that request must not go into this
    /// thread's ring, whose completions only this (now waiting) thread runs.
    static BYPASS: Cell<bool> = const { Cell::new(false) };
}

/// Put `job` into the calling thread's ring; `Err(job)` when the thread has
/// none (or is inside a blocking wait, or its ring is busy running).
pub(super) fn submit_local(job: Job) -> Result<(), Job> {
    if BYPASS.try_with(Cell::get).unwrap_or(true) {
        return Err(job);
    }
    let mut job = Some(job);
    let _ = LOCAL.try_with(|cell| {
        let Ok(mut guard) = cell.try_borrow_mut() else {
            return;
        };
        let Some(local) = guard.as_mut() else {
            return;
        };
        let idle = local.core.in_flight == 0 && local.core.backlog.is_empty();
        local.core.backlog.push_back(job.take().expect("job"));
        local.core.start_backlog();
        if idle && !local.needs_turn && local.core.ready.is_empty() && local.core.enter() {
            // Queue depth 1: nothing to batch with; into the kernel now.
            return;
        }
        if !local.needs_turn {
            local.needs_turn = true;
            if let Some(w) = local.waker.take() {
                w.wake();
            }
        }
    });
    match job {
        None => Ok(()),
        Some(job) => Err(job),
    }
}

/// While this guard lives, requests submitted on this thread bypass its
/// ring: hold one around any submission the thread then blocks waiting for
/// (only this thread, blocked, would run its ring's completions).
#[derive(Debug)]
pub struct BypassLocal(bool);

impl BypassLocal {
    /// Start bypassing this thread's ring until the guard is dropped.
    pub fn new() -> BypassLocal {
        BypassLocal(BYPASS.try_with(|b| b.replace(true)).unwrap_or(true))
    }
}

impl Default for BypassLocal {
    fn default() -> Self {
        BypassLocal::new()
    }
}

impl Drop for BypassLocal {
    fn drop(&mut self) {
        let _ = BYPASS.try_with(|b| b.set(self.0));
    }
}

/// An io_uring that belongs to the calling thread: every file I/O
/// submitted on this thread, for any device, goes into it, and its
/// completions run on this thread in [`turn`](Self::turn). The thread's
/// driver (an event loop) calls `turn` when [`fd`](Self::fd) is readable
/// (completions arrived) or [`poll_work`](Self::poll_work) is ready
/// (requests were queued). Dropping it waits for the I/O still in flight
/// and runs the last completions; later requests on this thread go to
/// their device's own ring.
#[derive(Debug)]
pub struct LocalRing {
    fd: RawFd,
    /// The ring lives in this thread's storage: the handle stays here.
    _not_send: PhantomData<*const ()>,
}

impl LocalRing {
    /// Give the calling thread a ring of `entries` submission entries.
    /// Fails when the kernel refuses io_uring, or when the thread already
    /// has a ring.
    pub fn install(entries: u32) -> io::Result<LocalRing> {
        let core = Core::new(entries)?;
        let fd = core.ring.as_raw_fd();
        LOCAL.with(|cell| {
            let mut g = cell.borrow_mut();
            if g.is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "this thread already has an io_uring",
                ));
            }
            *g = Some(Local {
                core,
                needs_turn: false,
                waker: None,
                retry: false,
            });
            Ok(())
        })?;
        Ok(LocalRing {
            fd,
            _not_send: PhantomData,
        })
    }

    /// The ring's descriptor: readable when completions are waiting.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Enter the queued requests, take the completed ones and run their
    /// completions (on this thread, outside the ring: a completion may
    /// submit again). Returns how many completions ran.
    pub fn turn(&self) -> usize {
        let ready = LOCAL.with(|cell| {
            let mut g = cell.borrow_mut();
            let Some(local) = g.as_mut() else {
                return Vec::new();
            };
            local.needs_turn = false;
            local.core.reap();
            local.core.start_backlog();
            // Entries the kernel did not take yet: the next turn retries.
            local.retry = !local.core.enter();
            std::mem::take(&mut local.core.ready)
        });
        let n = ready.len();
        run_ready(ready);
        n
    }

    /// Ready when requests were queued or completions finished since the
    /// last [`turn`](Self::turn); otherwise the waker is kept and woken
    /// when that happens.
    pub fn poll_work(&self, cx: &mut Context<'_>) -> Poll<()> {
        LOCAL.with(|cell| {
            let mut g = cell.borrow_mut();
            match g.as_mut() {
                Some(local) if !local.needs_turn => {
                    local.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
                _ => Poll::Ready(()),
            }
        })
    }

    /// Whether the last [`turn`](Self::turn) left requests the kernel did
    /// not take yet (it asked to try again): turn again after a pause.
    pub fn must_retry(&self) -> bool {
        LOCAL.with(|cell| cell.borrow().as_ref().is_some_and(|l| l.retry))
    }

    /// Requests in the kernel now.
    pub fn in_flight(&self) -> usize {
        LOCAL.with(|cell| cell.borrow().as_ref().map_or(0, |l| l.core.in_flight))
    }

    /// Requests that went to the kernel as part of a merged request so far
    /// (see the engine's merging).
    pub fn merged(&self) -> u64 {
        LOCAL.with(|cell| cell.borrow().as_ref().map_or(0, |l| l.core.merged))
    }

    /// Of [`merged`](Self::merged), the FUA writes: those that went in a
    /// merged `WRITEV` carrying `RWF_DSYNC` (FUA writes merge only with
    /// FUA writes).
    pub fn merged_fua(&self) -> u64 {
        LOCAL.with(|cell| cell.borrow().as_ref().map_or(0, |l| l.core.merged_fua))
    }
}

impl Drop for LocalRing {
    fn drop(&mut self) {
        // Out of the thread's storage first, so that completions run while
        // it closes send their follow-ups to the devices' own rings.
        let local = LOCAL.with(|cell| cell.borrow_mut().take());
        drop(local);
    }
}
