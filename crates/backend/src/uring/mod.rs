//! The io_uring engine: a ring per worker thread, or one per device.
//!
//! Two kinds of ring carry the same requests, with the same code:
//!
//! - **A ring of the calling thread** ([`LocalRing`]). A thread that runs
//!   sessions (a pinned worker of the server) installs one; every request
//!   submitted on that thread goes straight into it — no channel, no
//!   eventfd, no other thread — and its completions run on the same thread
//!   when the thread's driver calls [`LocalRing::turn`] (the server's
//!   worker does that when the ring's descriptor is readable). Requests
//!   queued during one turn of the thread's work go to the kernel in one
//!   `io_uring_enter`; a request that finds the ring idle (queue depth 1)
//!   is entered at once. Any number of devices share the thread's ring, so
//!   one busy LUN uses every worker.
//! - **The device's own ring** ([`UringEngine`]'s thread), for requests
//!   from threads without a ring of their own (the blocking pool, tools,
//!   the shared runtime): [`UringEngine::submit`] (any thread, never
//!   blocks on I/O) sends the request over a channel and an eventfd wakes
//!   the ring thread. The thread keeps a READ of that eventfd outstanding
//!   in the ring, so it sleeps in one `io_uring_enter` until either an I/O
//!   or a new request completes — no polling, and no lost wakeups: a
//!   request queued after the thread drained the channel makes the
//!   eventfd readable, which completes the outstanding read.
//!
//! Either ring turns requests into SQEs (READ, WRITE with `RWF_DSYNC` for
//! FUA, FSYNC with DATASYNC for a flush) when it enters the kernel, so a
//! run of adjacent requests queued in one turn goes as one `READV` or
//! `WRITEV` and is split back on completion (see `core`'s merging),
//! continues short transfers, maps
//! errors to [`BackendError`] exactly as the blocking engine does (so
//! ENOSPC and EIO keep their sense codes), and calls each request's
//! completion. Every buffer (and the descriptors) stays in the ring's table
//! until its CQE has arrived; a ring is never torn down with I/O in flight.
//!
//! A read lands in the spare capacity of the request's own buffer (not
//! zeroed first); with a direct (`O_DIRECT`) descriptor at an aligned spot
//! of it, where it stays (the [`IoBuf`] starts there). A write from an
//! aligned [`IoBuf`] goes to the device as is; one from unaligned memory
//! is bounced through an aligned copy (counted,
//! [`UringEngine::bounced_bytes`]); a transfer the device refuses as
//! misaligned (EINVAL) is retried on the buffered descriptor.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use io_uring::{opcode, types, IoUring};

use crate::{BackendError, IoBuf, IoCompletion, IoRequest, IoResult};

mod core;
mod local;

use self::core::{complete, retry_later, run_ready, Core};
use self::local::submit_local;
pub use self::local::{BypassLocal, LocalRing};

/// Requests that went to the kernel inside a merged one so far, on every
/// ring of the process (the workers' [`LocalRing`]s and the devices' own):
/// a count for tests and diagnostics, where no ring is at hand (a
/// whole-server test).
pub fn merged_requests() -> u64 {
    self::core::MERGED_ALL.load(Ordering::Relaxed)
}

/// Submission queue entries per ring.
const RING_ENTRIES: u32 = 256;
/// `user_data` of the eventfd read.
const WAKE_TOKEN: u64 = u64::MAX;

/// The descriptors of one store; every request in flight holds them, so
/// they outlive its I/O even when the device is dropped first.
#[derive(Debug)]
struct Files {
    buffered: Arc<File>,
    /// The `O_DIRECT` descriptor, used for every transfer when present.
    direct: Option<Arc<File>>,
    /// Bytes of unaligned writes copied to aligned memory for `direct`.
    bounced: AtomicU64,
}

struct Job {
    req: IoRequest,
    done: IoCompletion,
    files: Arc<Files>,
}

/// An io_uring engine for one file or block device.
pub struct UringEngine {
    files: Arc<Files>,
    tx: Option<mpsc::Sender<Job>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What submitters and the ring thread share.
struct Shared {
    /// The wake-up eventfd.
    wake: OwnedFd,
    /// A wake-up is pending (the eventfd was written and the thread has
    /// not yet seen it): later submitters need not write it again.
    notified: AtomicBool,
    /// The engine is being dropped: finish what is queued and exit.
    shutdown: AtomicBool,
}

impl Shared {
    fn kick(&self) {
        let one: u64 = 1;
        loop {
            // SAFETY: writes 8 bytes from a live u64 to the eventfd owned by
            // `self.wake`, which is open for the life of `self`.
            let n = unsafe {
                libc::write(
                    self.wake.as_raw_fd(),
                    (&one as *const u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
            // EAGAIN cannot happen below the counter's 2^64-2 limit; EINTR
            // is retried.
            if n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return;
            }
        }
    }
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine").finish_non_exhaustive()
    }
}

impl UringEngine {
    /// Set up a ring for `buffered` (and `direct`, an `O_DIRECT` descriptor
    /// of the same store, used for every transfer when given) and start its
    /// thread. Fails when the kernel refuses io_uring (EPERM when disabled
    /// by `kernel.io_uring_disabled`, ENOSYS when absent): the caller then
    /// uses the blocking engine.
    pub fn new(buffered: Arc<File>, direct: Option<Arc<File>>) -> io::Result<UringEngine> {
        let core = Core::new(RING_ENTRIES)?;
        // SAFETY: eventfd only reads its integer arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let shared = Arc::new(Shared {
            wake,
            notified: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ethersan-uring".into())
            .spawn(move || {
                RingThread {
                    core,
                    rx,
                    shared: thread_shared,
                    wake_buf: Box::new(0),
                    wake_armed: false,
                }
                .run()
            })?;
        Ok(UringEngine {
            files: Arc::new(Files {
                buffered,
                direct,
                bounced: AtomicU64::new(0),
            }),
            tx: Some(tx),
            shared,
            thread: Some(thread),
        })
    }

    /// Queue `req`; `done` is called when it completes or fails: on this
    /// thread, from its [`LocalRing`], when it has one, else on the
    /// device's ring thread. Never blocks on the I/O.
    pub fn submit(&self, req: IoRequest, done: IoCompletion) {
        let job = Job {
            req,
            done,
            files: self.files.clone(),
        };
        let Err(job) = submit_local(job) else {
            return;
        };
        self.submit_to_thread(job);
    }

    /// Bytes of writes that reached the `O_DIRECT` descriptor from
    /// unaligned memory and were copied to aligned memory first (zero while
    /// every write comes in an aligned [`IoBuf`]).
    pub fn bounced_bytes(&self) -> u64 {
        self.files.bounced.load(Ordering::Relaxed)
    }

    /// Queue `job` for the device's own ring thread.
    fn submit_to_thread(&self, job: Job) {
        let sent = match &self.tx {
            Some(tx) => tx.send(job),
            None => Err(mpsc::SendError(job)),
        };
        if let Err(mpsc::SendError(job)) = sent {
            let err = io::Error::new(io::ErrorKind::BrokenPipe, "io_uring engine stopped");
            (job.done)(Err(job.req.error(err)));
            return;
        }
        // Order: the job is queued before the flag is read, and the thread
        // clears the flag before it drains the queue, so either this call
        // writes the eventfd or the thread's next drain sees the job.
        if !self.shared.notified.swap(true, Ordering::SeqCst) {
            self.shared.kick();
        }
    }
}

/// Dropping the engine waits for the I/O on the device's own ring thread.
/// Requests in a worker's [`LocalRing`] finish there, each holding the
/// store's descriptors open until it completes; their completions keep the
/// device's users (logical unit, volume) alive, so a device is dropped only
/// after its last I/O completed.
impl Drop for UringEngine {
    fn drop(&mut self) {
        self.tx = None;
        self.shared.shutdown.store(true, Ordering::SeqCst);
        // Completes the outstanding eventfd read, which the thread then does
        // not re-arm; it exits once every I/O in flight has completed.
        self.shared.kick();
        if let Some(t) = self.thread.take() {
            // The last reference can go away inside a completion, on the ring
            // thread itself: it then exits on its own.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// The thread of a device's own ring.
struct RingThread {
    core: Core,
    rx: mpsc::Receiver<Job>,
    shared: Arc<Shared>,
    /// Where the eventfd read lands; boxed so it never moves.
    wake_buf: Box<u64>,
    wake_armed: bool,
}

impl RingThread {
    fn run(mut self) {
        loop {
            let shutdown = self.shared.shutdown.load(Ordering::SeqCst);
            if !self.wake_armed && !shutdown {
                self.arm_wake();
            }
            while let Ok(job) = self.rx.try_recv() {
                self.core.backlog.push_back(job);
            }
            self.core.start_backlog();
            self.core.flush_unsent();
            run_ready(std::mem::take(&mut self.core.ready));
            if shutdown
                && self.core.in_flight == 0
                && !self.wake_armed
                && self.core.backlog.is_empty()
            {
                // Requests still in the channel (none can arrive after the
                // sender is gone) are failed, not leaked.
                while let Ok(job) = self.rx.try_recv() {
                    let err = io::Error::new(io::ErrorKind::BrokenPipe, "io_uring engine stopped");
                    let e = job.req.error(err);
                    complete(job.done, Err(e));
                }
                return;
            }
            match self.core.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if retry_later(&e) => {}
                Err(e) => {
                    // Nothing sensible to do but try again; do not spin.
                    eprintln!("ethersan: io_uring_enter failed: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            self.core.reap();
            if std::mem::take(&mut self.core.wake_seen) {
                self.wake_armed = false;
                // Cleared before the next drain of the channel (see submit).
                self.shared.notified.store(false, Ordering::SeqCst);
            }
            run_ready(std::mem::take(&mut self.core.ready));
        }
    }

    fn arm_wake(&mut self) {
        let entry = opcode::Read::new(
            types::Fd(self.shared.wake.as_raw_fd()),
            (&mut *self.wake_buf as *mut u64).cast(),
            8,
        )
        .build()
        .user_data(WAKE_TOKEN);
        self.core.push(entry);
        self.wake_armed = true;
    }
}

#[cfg(test)]
mod tests;
