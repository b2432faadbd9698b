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
//! FUA, FSYNC with DATASYNC for a flush), continues short transfers, maps
//! errors to [`BackendError`] exactly as the blocking engine does (so
//! ENOSPC and EIO keep their sense codes), and calls each request's
//! completion. Every buffer (and the descriptors) stays in the ring's table
//! until its CQE has arrived; a ring is never torn down with I/O in flight.
//!
//! A read lands in the spare capacity of the request's own buffer (not
//! zeroed first); with a direct (`O_DIRECT`) descriptor at an aligned spot
//! of it, and a write from unaligned memory is bounced through an
//! [`AlignedBuf`]; a transfer the device refuses as misaligned (EINVAL)
//! is retried on the buffered descriptor.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use io_uring::{opcode, types, IoUring};

use crate::aligned::AlignedBuf;
use crate::fill::align_prefix;
use crate::{BackendError, IoCompletion, IoRequest, IoResult};

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
            files: Arc::new(Files { buffered, direct }),
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

/// A buffer the kernel may be using.
enum Buf {
    None,
    /// Data to write.
    Plain(Vec<u8>),
    /// A vector whose spare capacity a read fills after its first `skip`
    /// bytes (a prefix that aligns the data for `O_DIRECT`); not zeroed
    /// first: the kernel writes every byte before the vector's length
    /// covers it.
    Fill {
        v: Vec<u8>,
        skip: usize,
    },
    Aligned(AlignedBuf),
}

impl Buf {
    /// The request's buffer, ready for a `len`-byte read (aligned for
    /// `O_DIRECT`).
    fn for_read(mut v: Vec<u8>, len: usize, direct: bool) -> Buf {
        v.clear();
        let skip = if direct {
            align_prefix(&mut v, len, crate::aligned::DIRECT_ALIGN)
        } else {
            v.reserve(len);
            0
        };
        Buf::Fill { v, skip }
    }

    /// Where the transfer continues after `done` bytes.
    fn ptr_at(&mut self, done: usize) -> *mut u8 {
        match self {
            Buf::None => std::ptr::null_mut(),
            Buf::Plain(v) => v[done..].as_mut_ptr(),
            Buf::Fill { v, .. } => v.spare_capacity_mut()[done..].as_mut_ptr().cast(),
            Buf::Aligned(a) => a.as_mut_slice()[done..].as_mut_ptr(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Flush,
}

/// One request in the kernel.
struct Op {
    kind: Kind,
    offset: u64,
    len: usize,
    /// Bytes moved so far (short transfers are continued).
    done_bytes: usize,
    fua: bool,
    /// Transfers go to the `O_DIRECT` descriptor.
    direct: bool,
    buf: Buf,
    /// The store's descriptors, open until the op is done.
    files: Arc<Files>,
    completion: Option<IoCompletion>,
}

/// A ring and the requests in it: what both kinds of ring share. It
/// never calls a completion itself: finished requests collect in
/// `ready`, for the owner to run once it no longer holds the core (a
/// completion may submit again).
struct Core {
    ring: IoUring,
    /// Requests in flight, indexed by `user_data`; owns their buffers.
    ops: Vec<Option<Op>>,
    free: Vec<usize>,
    in_flight: usize,
    /// Most requests in the kernel at once: what the completion queue
    /// holds, so completions never overflow it (the rest wait in order).
    max_in_flight: usize,
    /// Requests received but not yet in the ring (in-flight limit).
    backlog: VecDeque<Job>,
    /// Finished requests whose completions have not run yet.
    ready: Vec<(IoCompletion, IoResult)>,
    /// The eventfd read (`WAKE_TOKEN`) completed since the owner looked.
    wake_seen: bool,
}

impl Core {
    fn new(entries: u32) -> io::Result<Core> {
        let ring = IoUring::new(entries)?;
        // The ring thread's eventfd read takes one completion slot.
        let max_in_flight = (ring.params().cq_entries() as usize)
            .saturating_sub(1)
            .max(1);
        Ok(Core {
            ring,
            ops: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            max_in_flight,
            backlog: VecDeque::new(),
            ready: Vec::new(),
            wake_seen: false,
        })
    }

    /// Move queued requests into the ring while the in-flight limit allows.
    fn start_backlog(&mut self) {
        while self.in_flight < self.max_in_flight {
            let Some(job) = self.backlog.pop_front() else {
                break;
            };
            self.start(job);
        }
    }

    /// Pass the queued SQEs to the kernel without waiting, when there are
    /// any (or when completions overflowed into the kernel's list: entering
    /// moves them to the queue). False when entries are still queued (the
    /// kernel said to try again): the owner must enter again later.
    fn enter(&mut self) -> bool {
        let sq = self.ring.submission();
        if sq.is_empty() && !sq.cq_overflow() {
            return true;
        }
        drop(sq);
        if let Err(e) = self.ring.submit() {
            if !retry_later(&e) {
                eprintln!("ethersan: io_uring submit failed: {e}");
            }
        }
        self.ring.submission().is_empty()
    }

    /// Push one SQE, submitting first if the submission queue is full.
    fn push(&mut self, entry: io_uring::squeue::Entry) {
        loop {
            // SAFETY: every buffer an entry points to is owned by `self.ops`
            // (or is the ring thread's boxed eventfd counter) and stays
            // there, unmoved, until the entry's CQE is reaped; the
            // descriptors are held by the op (`Op::files`) or by the ring
            // thread until then; and a core is never dropped with I/O in
            // flight (see `Drop for Core`).
            let pushed = unsafe { self.ring.submission().push(&entry) };
            if pushed.is_ok() {
                return;
            }
            if let Err(e) = self.ring.submit() {
                if !retry_later(&e) {
                    eprintln!("ethersan: io_uring submit failed: {e}");
                }
                // The CQ may be full: make room.
                self.reap();
            }
        }
    }

    fn start(&mut self, job: Job) {
        let direct = job.files.direct.is_some();
        let files = job.files;
        let op = match job.req {
            IoRequest::Read { offset, len, buf } => Op {
                kind: Kind::Read,
                offset,
                len,
                done_bytes: 0,
                fua: false,
                direct,
                buf: Buf::for_read(buf, len, direct),
                files,
                completion: Some(job.done),
            },
            IoRequest::Write {
                offset,
                data,
                len,
                fua,
            } => {
                let len = len.min(data.len());
                Op {
                    kind: Kind::Write,
                    offset,
                    len,
                    done_bytes: 0,
                    fua,
                    direct,
                    buf: if direct && data.as_ptr().align_offset(crate::aligned::DIRECT_ALIGN) != 0
                    {
                        Buf::Aligned(AlignedBuf::copy_of(&data[..len]))
                    } else {
                        Buf::Plain(data)
                    },
                    files,
                    completion: Some(job.done),
                }
            }
            IoRequest::Flush => Op {
                kind: Kind::Flush,
                offset: 0,
                len: 0,
                done_bytes: 0,
                fua: false,
                direct: false,
                buf: Buf::None,
                files,
                completion: Some(job.done),
            },
        };
        if op.kind != Kind::Flush && op.len == 0 {
            self.ready
                .push((op.completion.expect("new op"), Ok(Vec::new())));
            return;
        }
        let idx = match self.free.pop() {
            Some(i) => {
                self.ops[i] = Some(op);
                i
            }
            None => {
                self.ops.push(Some(op));
                self.ops.len() - 1
            }
        };
        self.in_flight += 1;
        self.submit_op(idx);
    }

    /// Push the SQE for the rest of op `idx`.
    fn submit_op(&mut self, idx: usize) {
        let op = self.ops[idx].as_mut().expect("op in flight");
        let fd = if op.direct {
            op.files
                .direct
                .as_ref()
                .unwrap_or(&op.files.buffered)
                .as_raw_fd()
        } else {
            op.files.buffered.as_raw_fd()
        };
        let fd = types::Fd(fd);
        let at = op.offset + op.done_bytes as u64;
        let rest = (op.len - op.done_bytes).min(u32::MAX as usize) as u32;
        let done = op.done_bytes;
        let entry = match op.kind {
            Kind::Read => {
                let p = op.buf.ptr_at(done);
                opcode::Read::new(fd, p, rest).offset(at).build()
            }
            Kind::Write => {
                let p = op.buf.ptr_at(done).cast_const();
                let flags = if op.fua { libc::RWF_DSYNC } else { 0 };
                opcode::Write::new(fd, p, rest)
                    .offset(at)
                    .rw_flags(flags)
                    .build()
            }
            Kind::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        };
        self.push(entry.user_data(idx as u64));
    }

    /// Take every CQE; finished requests go to `ready`.
    fn reap(&mut self) {
        loop {
            let Some(cqe) = self.ring.completion().next() else {
                return;
            };
            let token = cqe.user_data();
            if token == WAKE_TOKEN {
                self.wake_seen = true;
                continue;
            }
            self.on_cqe(token as usize, cqe.result());
        }
    }

    fn on_cqe(&mut self, idx: usize, res: i32) {
        let op = self.ops[idx].as_mut().expect("CQE for an op in flight");
        if res < 0 {
            let errno = -res;
            match errno {
                libc::EINTR | libc::EAGAIN => return self.submit_op(idx),
                // O_DIRECT refuses this alignment: use the page cache.
                libc::EINVAL if op.direct => {
                    op.direct = false;
                    return self.submit_op(idx);
                }
                _ => {
                    let source = io::Error::from_raw_os_error(errno);
                    return self.finish(idx, Err(source));
                }
            }
        }
        let n = res as usize;
        match op.kind {
            Kind::Flush => self.finish(idx, Ok(())),
            _ if n == 0 => {
                let e = if op.kind == Kind::Read {
                    io::Error::new(io::ErrorKind::UnexpectedEof, "failed to fill whole buffer")
                } else {
                    io::Error::from(io::ErrorKind::WriteZero)
                };
                self.finish(idx, Err(e))
            }
            _ => {
                op.done_bytes += n;
                if op.done_bytes < op.len {
                    self.submit_op(idx)
                } else {
                    self.finish(idx, Ok(()))
                }
            }
        }
    }

    fn finish(&mut self, idx: usize, r: io::Result<()>) {
        let op = self.ops[idx].take().expect("op in flight");
        self.free.push(idx);
        self.in_flight -= 1;
        let Op {
            kind,
            offset,
            done_bytes,
            buf,
            completion,
            ..
        } = op;
        let outcome = match r {
            Ok(()) => Ok(match (kind, buf) {
                (Kind::Read, Buf::Fill { mut v, skip }) => {
                    // SAFETY: the read completed in full: the kernel wrote
                    // all `done_bytes` (= the request's length; the
                    // capacity holds `skip` + that) bytes at the start of
                    // the vector's spare capacity, right after the `skip`
                    // initialized prefix bytes.
                    unsafe { v.set_len(skip + done_bytes) };
                    v.drain(..skip);
                    v
                }
                (Kind::Read, Buf::Aligned(a)) => a.into_vec(),
                _ => Vec::new(),
            }),
            Err(source) => Err(match kind {
                Kind::Read => BackendError::Read {
                    offset: offset + done_bytes as u64,
                    cause: source,
                },
                Kind::Write => BackendError::Write {
                    offset: offset + done_bytes as u64,
                    cause: source,
                },
                Kind::Flush => BackendError::Flush(source),
            }),
        };
        self.ready
            .push((completion.expect("completed once"), outcome));
    }
}

impl Drop for Core {
    /// Finish everything queued: the kernel writes into buffers the ops
    /// own, so nothing is freed while it may; the completions run here.
    fn drop(&mut self) {
        loop {
            self.start_backlog();
            run_ready(std::mem::take(&mut self.ready));
            if self.in_flight == 0 && self.backlog.is_empty() {
                return;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if retry_later(&e) => {}
                Err(e) => {
                    // Nothing can be done but wait; do not spin.
                    eprintln!("ethersan: io_uring_enter failed while closing: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            self.reap();
        }
    }
}

/// Errors of `io_uring_enter` that only mean "try again".
fn retry_later(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}

/// Run finished requests' completions.
fn run_ready(ready: Vec<(IoCompletion, IoResult)>) {
    for (done, r) in ready {
        complete(done, r);
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
fn submit_local(job: Job) -> Result<(), Job> {
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
}

impl Drop for LocalRing {
    fn drop(&mut self) {
        // Out of the thread's storage first, so that completions run while
        // it closes send their follow-ups to the devices' own rings.
        let local = LOCAL.with(|cell| cell.borrow_mut().take());
        drop(local);
    }
}

/// Run a completion; a panic in it must not take the ring (and the
/// buffers the kernel still uses) down.
fn complete(done: IoCompletion, r: IoResult) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(r))).is_err() {
        eprintln!("ethersan: an I/O completion panicked");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use crate::file::{FileDevice, FileOptions, IoEngine};
    use crate::{BackendError, BlockDevice, BlockDeviceExt, IoRequest, Submission};

    fn open(path: &std::path::Path, size: Option<u64>, ro: bool, direct: bool) -> FileDevice {
        FileDevice::open(
            path,
            &FileOptions {
                size,
                block_size: 512,
                read_only: ro,
                preallocate: false,
                direct,
                engine: IoEngine::Uring,
            },
        )
        .unwrap()
    }

    /// Submit and wait for the outcome.
    fn run(d: &FileDevice, req: IoRequest) -> Result<Vec<u8>, BackendError> {
        let (tx, rx) = mpsc::channel();
        d.uring()
            .expect("uring engine")
            .submit(req, Box::new(move |r| tx.send(r).unwrap()));
        rx.recv().unwrap()
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(13) ^ seed)
            .collect()
    }

    #[test]
    fn round_trip_fua_flush_buffered_and_direct() {
        let dir = tempfile::tempdir().unwrap();
        for direct in [false, true] {
            let d = open(
                &dir.path().join(format!("r{direct}")),
                Some(4 << 20),
                false,
                direct,
            );
            assert_eq!(
                d.engine(),
                IoEngine::Uring,
                "io_uring refused on this kernel"
            );
            for (i, (off, len, fua)) in [
                (0u64, 4096usize, false),
                (8192, 131072, true),
                (1 << 20, 512 * 3, false),
            ]
            .into_iter()
            .enumerate()
            {
                let data = pattern(len, i as u8);
                let r = run(
                    &d,
                    IoRequest::Write {
                        offset: off,
                        data: data.clone(),
                        len,
                        fua,
                    },
                );
                assert!(r.unwrap().is_empty());
                assert_eq!(run(&d, IoRequest::read(off, len)).unwrap(), data);
                // The blocking engine sees the same bytes.
                let mut back = vec![0u8; len];
                d.read_at(off, &mut back).unwrap();
                assert_eq!(back, data);
            }
            // Only `len` bytes of a longer buffer are written.
            let r = run(
                &d,
                IoRequest::Write {
                    offset: 0,
                    data: vec![7u8; 8192],
                    len: 512,
                    fua: false,
                },
            );
            r.unwrap();
            let got = run(&d, IoRequest::read(0, 1024)).unwrap();
            assert!(got[..512].iter().all(|b| *b == 7));
            assert_eq!(got[512..], pattern(4096, 0)[512..1024]);
            run(&d, IoRequest::Flush).unwrap();
            assert!(run(&d, IoRequest::read(0, 0)).unwrap().is_empty());
        }
    }

    #[test]
    fn reads_past_the_end_fail_as_read_errors() {
        let dir = tempfile::tempdir().unwrap();
        let d = open(&dir.path().join("short"), Some(8192), false, false);
        // Entirely past the end, and straddling it (a short read, then EOF).
        for (off, len) in [(8192u64, 512usize), (4096, 8192)] {
            match run(&d, IoRequest::read(off, len)) {
                Err(BackendError::Read { cause: source, .. }) => {
                    assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof)
                }
                other => panic!("read at {off}: {other:?}"),
            }
        }
        assert_eq!(run(&d, IoRequest::read(4096, 4096)).unwrap().len(), 4096);
    }

    #[test]
    fn writes_to_a_read_only_store_fail_as_write_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ro");
        drop(open(&p, Some(8192), false, false));
        let d = open(&p, None, true, false);
        match run(
            &d,
            IoRequest::Write {
                offset: 0,
                data: vec![1; 512],
                len: 512,
                fua: true,
            },
        ) {
            Err(BackendError::Write {
                offset: 0,
                cause: source,
            }) => {
                assert_eq!(source.raw_os_error(), Some(libc::EBADF))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(run(&d, IoRequest::read(0, 512)).unwrap(), vec![0; 512]);
    }

    #[test]
    fn many_in_flight_all_complete_also_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let d = open(&dir.path().join("many"), Some(16 << 20), false, true);
        let (tx, rx) = mpsc::channel();
        // More than the ring and the in-flight limit hold.
        let n = 2000usize;
        for i in 0..n {
            let tx = tx.clone();
            let off = (i as u64 % 4096) * 4096;
            let req = if i % 2 == 0 {
                IoRequest::Write {
                    offset: off,
                    data: vec![i as u8; 4096],
                    len: 4096,
                    fua: false,
                }
            } else {
                IoRequest::read(off, 4096)
            };
            d.uring()
                .unwrap()
                .submit(req, Box::new(move |r| tx.send(r.is_ok()).unwrap()));
        }
        drop(tx);
        // Dropping the device waits for the ring thread to finish them.
        drop(d);
        let results: Vec<bool> = rx.iter().collect();
        assert_eq!(results.len(), n);
        assert!(results.iter().all(|ok| *ok));
    }

    #[test]
    fn buffered_reads_from_the_page_cache_finish_inline_direct_ones_go_pending() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p");
        let d = open(&p, Some(1 << 20), false, false);
        let data = pattern(8192, 5);
        d.write_at(8192, &data, true).unwrap();
        // In the page cache: done inline (RWF_NOWAIT), no completion.
        match d.submit(
            IoRequest::Read {
                offset: 8192,
                len: 8192,
                buf: vec![0xee; 100],
            },
            Box::new(|_| panic!("went pending")),
        ) {
            Submission::Done(r) => assert_eq!(r.unwrap(), data),
            other => panic!("{other:?}"),
        }
        // A FUA write and a flush go to the ring.
        let (tx, rx) = mpsc::channel();
        for req in [
            IoRequest::Write {
                offset: 0,
                data: data.clone(),
                len: 4096,
                fua: true,
            },
            IoRequest::Flush,
        ] {
            let tx = tx.clone();
            let s = d.submit(req, Box::new(move |r| tx.send(r).unwrap()));
            assert!(matches!(s, Submission::Pending), "{s:?}");
            rx.recv().unwrap().unwrap();
        }
        drop(d);
        // O_DIRECT: always pending, the same bytes, garbage never returned.
        let d = open(&p, None, false, true);
        for _ in 0..3 {
            let (tx, rx) = mpsc::channel();
            let req = IoRequest::Read {
                offset: 8192,
                len: 8192,
                buf: vec![0xee; 20000],
            };
            let s = d.submit(req, Box::new(move |r| tx.send(r).unwrap()));
            assert!(matches!(s, Submission::Pending), "{s:?}");
            assert_eq!(rx.recv().unwrap().unwrap(), data);
        }
    }
    /// Turn `ring` until `n` completions ran (or fail after 10 s).
    fn turn_until(ring: &super::LocalRing, n: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut seen = 0;
        while seen < n {
            assert!(
                std::time::Instant::now() < deadline,
                "{seen} of {n} completions"
            );
            seen += ring.turn();
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_thread_with_its_own_ring_submits_and_completes_on_itself() {
        let dir = tempfile::tempdir().unwrap();
        let d = open(&dir.path().join("local"), Some(16 << 20), false, true);
        let ring = super::LocalRing::install(8).unwrap();
        // A second ring on the same thread is refused.
        assert!(super::LocalRing::install(8).is_err());
        let me = std::thread::current().id();
        let (tx, rx) = mpsc::channel();
        // More than the ring's entries and its in-flight limit: the rest
        // wait in its queue and go in as earlier ones finish.
        let n = 1200usize;
        for i in 0..n {
            let tx = tx.clone();
            let off = (i as u64 % 4000) * 4096;
            let req = IoRequest::Write {
                offset: off,
                data: pattern(4096, i as u8),
                len: 4096,
                fua: i % 100 == 0,
            };
            let s = d.submit(
                req,
                Box::new(move |r| {
                    tx.send((std::thread::current().id(), r.is_ok())).unwrap();
                }),
            );
            assert!(matches!(s, Submission::Pending), "{s:?}");
        }
        // Nothing completes until this thread turns its ring.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "a completion ran on another thread");
        turn_until(&ring, n);
        for _ in 0..n {
            let (tid, ok) = rx.recv().unwrap();
            assert_eq!(tid, me);
            assert!(ok);
        }
        // Reads of the last writes, through the ring.
        for i in (n - 200)..n {
            let tx = tx.clone();
            let off = (i as u64 % 4000) * 4096;
            let s = d.submit(
                IoRequest::read(off, 4096),
                Box::new(move |r| {
                    tx.send((
                        std::thread::current().id(),
                        r.unwrap() == pattern(4096, i as u8),
                    ))
                    .unwrap();
                }),
            );
            assert!(matches!(s, Submission::Pending));
            // Queue depth 1 goes into the kernel at once: it completes
            // without a turn entering it.
            if i == n - 200 {
                assert_eq!(ring.in_flight(), 1);
            }
        }
        turn_until(&ring, 200);
        for _ in 0..200 {
            let (tid, same) = rx.recv().unwrap();
            assert_eq!(tid, me);
            assert!(same, "read back other bytes");
        }
        // A blocking wait on this thread goes through the device's own
        // ring (only this thread could turn its ring): no deadlock.
        let mut back = vec![0u8; 4096];
        d.read_at(((n - 1) as u64 % 4000) * 4096, &mut back)
            .unwrap();
        assert_eq!(back, pattern(4096, (n - 1) as u8));
        drop(ring);
        drop(tx);
    }

    #[test]
    fn dropping_a_local_ring_waits_for_its_io_and_runs_the_completions() {
        let dir = tempfile::tempdir().unwrap();
        let d = open(&dir.path().join("drop"), Some(16 << 20), false, true);
        let ring = super::LocalRing::install(64).unwrap();
        let (tx, rx) = mpsc::channel();
        for i in 0..300u64 {
            let tx = tx.clone();
            let req = if i % 2 == 0 {
                IoRequest::Write {
                    offset: i * 4096,
                    data: vec![i as u8; 4096],
                    len: 4096,
                    fua: false,
                }
            } else {
                IoRequest::read(i * 4096, 4096)
            };
            d.submit(req, Box::new(move |r| tx.send(r.is_ok()).unwrap()));
        }
        ring.turn();
        drop(ring);
        drop(tx);
        let all: Vec<bool> = rx.iter().collect();
        assert_eq!(all.len(), 300);
        assert!(all.iter().all(|ok| *ok));
        // Without a ring, the thread's requests go to the device's ring.
        let (tx, rx) = mpsc::channel();
        d.submit(
            IoRequest::read(0, 4096),
            Box::new(move |r| tx.send(r.map(|v| v[0])).unwrap()),
        );
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10))
                .unwrap()
                .unwrap(),
            0
        );
    }
}
