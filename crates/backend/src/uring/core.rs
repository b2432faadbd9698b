//! The ring both kinds share ([`Core`]): requests turned into SQEs, short
//! transfers continued, completions reaped into `ready` for the owner to
//! run. The lifetime invariants are those of the parent module: every
//! buffer and descriptor stays in `ops` until its CQE has arrived.
//!
//! **Merging.** A request's SQE is built when the ring is entered, not
//! when it arrives, so the requests of one turn of the owner's work (the
//! commands of several sessions that became ready together) are seen
//! together: a run of reads, or of writes with the same FUA, to the same
//! store, each starting where the one before ends, goes to the kernel as
//! one vectored request (`READV`/`WRITEV` over the requests' own buffers,
//! no copy) — what the block layer's plugging does for a local batch, done
//! here for commands that arrive one by one. The outcome is split back: a
//! full transfer finishes every request; anything else (a short transfer,
//! an error) gives each request the bytes that reached it, and the rest of
//! each goes on alone, so errors and their offsets are each request's
//! own. Only requests up to [`MERGE_OP`] join (larger ones are already the
//! size the device takes best, and a cut-through read's pieces must finish
//! one after another), up to [`MERGE_BYTES`] and [`MERGE_OPS`] per run.
//! The started requests are taken in offset order per store, so the
//! commands of several streams that arrive interleaved still meet.
//!
//! **Following.** A run that starts where a request already in the kernel
//! ends (a sequential stream whose previous request is still on the
//! device) waits for that request to finish, and grows meanwhile with what
//! arrives after it, up to [`MERGE_BYTES`]. Commands reach a target one by
//! one, a few microseconds apart, where a local program submits its whole
//! batch at once: without waiting, a stream at queue depth 16 reaches the
//! device as many small requests, and a virtual disk takes about as long
//! for 128 KiB as for 1 MiB (docs/benchmark.md, "Read-ahead and following"). Waiting
//! costs nothing at queue depth 1 (nothing is in the kernel) and never
//! applies to random requests or to requests larger than [`MERGE_OP`].

use super::*;

/// Requests larger than this go alone.
pub(super) const MERGE_OP: usize = 128 * 1024;
/// Most bytes in one merged request.
pub(super) const MERGE_BYTES: usize = 1024 * 1024;
/// Most requests in one merged request.
pub(super) const MERGE_OPS: usize = 64;
/// `user_data` bit of a merged request (its index in `groups` below it).
const GROUP_TOKEN: u64 = 1 << 62;

/// Requests that went to the kernel inside a merged one, on every ring of
/// the process (see [`merged_requests`](super::merged_requests)).
pub(super) static MERGED_ALL: AtomicU64 = AtomicU64::new(0);

/// Requests in the kernel as one vectored request.
struct Group {
    /// Indices into `ops`, in offset order.
    members: Vec<usize>,
    /// The iovecs the SQE points to (into the members' buffers); their
    /// heap array stays unmoved until the group's CQE.
    iov: IoVecs,
    total: usize,
}

/// A merged request's iovecs.
struct IoVecs(Vec<libc::iovec>);

// SAFETY: the pointers point into the buffers of ops owned by the same
// `Core` (never shared), so they go to another thread only together with
// what they point to; nothing reads through them but the kernel.
unsafe impl Send for IoVecs {}

/// A buffer the kernel may be using.
enum Buf {
    None,
    /// Data to write, aligned when it goes to a direct descriptor (an
    /// unaligned write was copied into an aligned buffer first).
    Plain(IoBuf),
    /// A buffer whose vector's spare capacity a read fills after the
    /// buffer's start (an aligning prefix for `O_DIRECT`, where the data
    /// stays); not zeroed first: the kernel writes every byte before the
    /// vector's length covers it.
    Fill(IoBuf),
}

impl Buf {
    /// The request's buffer, ready for a `len`-byte read (aligned for
    /// `O_DIRECT`).
    fn for_read(mut b: IoBuf, len: usize, direct: bool) -> Buf {
        if direct {
            b.reserve_aligned(len);
        } else {
            b.reserve_plain(len);
        }
        Buf::Fill(b)
    }

    /// Where the transfer continues after `done` bytes.
    fn ptr_at(&mut self, done: usize) -> *mut u8 {
        match self {
            Buf::None => std::ptr::null_mut(),
            Buf::Plain(b) => b[done..].as_mut_ptr(),
            Buf::Fill(b) => b.raw_mut().spare_capacity_mut()[done..].as_mut_ptr().cast(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Flush,
}

impl Op {
    /// The descriptor its transfers use.
    fn fd(&self) -> RawFd {
        match (&self.files.direct, self.direct) {
            (Some(d), true) => d.as_raw_fd(),
            _ => self.files.buffered.as_raw_fd(),
        }
    }
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
    /// Its SQE (or its merged request's) has been built: it is in the
    /// kernel, or about to be.
    sent: bool,
    buf: Buf,
    /// The store's descriptors, open until the op is done.
    files: Arc<Files>,
    completion: Option<IoCompletion>,
}

/// A ring and the requests in it: what both kinds of ring share. It
/// never calls a completion itself: finished requests collect in
/// `ready`, for the owner to run once it no longer holds the core (a
/// completion may submit again).
pub(super) struct Core {
    pub(super) ring: IoUring,
    /// Requests in flight, indexed by `user_data`; owns their buffers.
    ops: Vec<Option<Op>>,
    free: Vec<usize>,
    pub(super) in_flight: usize,
    /// Most requests in the kernel at once: what the completion queue
    /// holds, so completions never overflow it (the rest wait in order).
    max_in_flight: usize,
    /// Requests received but not yet in the ring (in-flight limit).
    pub(super) backlog: VecDeque<Job>,
    /// Requests started whose SQEs are built at the next `enter` (where
    /// adjacent ones merge).
    unsent: Vec<usize>,
    /// Merged requests in the kernel, by index.
    groups: Vec<Option<Group>>,
    free_groups: Vec<usize>,
    /// Requests that went to the kernel inside a merged one (a count for
    /// tests and diagnostics).
    pub(super) merged: u64,
    /// Merged requests built (a count for tests and diagnostics).
    pub(super) groups_built: u64,
    /// Times a run waited for the request it follows (see the module
    /// documentation; a count for tests and diagnostics).
    pub(super) followed: u64,
    /// Of those, the writes that went inside a merged `WRITEV` carrying
    /// `RWF_DSYNC` (FUA): a count for tests and diagnostics, which shows
    /// that FUA writes merge only among themselves and keep their FUA.
    pub(super) merged_fua: u64,
    /// Finished requests whose completions have not run yet.
    pub(super) ready: Vec<(IoCompletion, IoResult)>,
    /// The eventfd read (`WAKE_TOKEN`) completed since the owner looked.
    pub(super) wake_seen: bool,
}

impl Core {
    pub(super) fn new(entries: u32) -> io::Result<Core> {
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
            unsent: Vec::new(),
            groups: Vec::new(),
            free_groups: Vec::new(),
            merged: 0,
            groups_built: 0,
            followed: 0,
            merged_fua: 0,
            ready: Vec::new(),
            wake_seen: false,
        })
    }

    /// Move queued requests into the ring while the in-flight limit allows.
    pub(super) fn start_backlog(&mut self) {
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
    pub(super) fn enter(&mut self) -> bool {
        self.flush_unsent();
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
    pub(super) fn push(&mut self, entry: io_uring::squeue::Entry) {
        loop {
            // SAFETY: every buffer an entry points to is owned by `self.ops`
            // (a merged request's iovec array by `self.groups`, its
            // iovecs pointing into ops' buffers; or it is the ring
            // thread's boxed eventfd counter) and stays
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

    pub(super) fn start(&mut self, job: Job) {
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
                sent: false,
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
                    sent: false,
                    buf: if direct && !data.is_aligned() {
                        files.bounced.fetch_add(len as u64, Ordering::Relaxed);
                        Buf::Plain(IoBuf::aligned_copy_of(&data[..len]))
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
                sent: false,
                buf: Buf::None,
                files,
                completion: Some(job.done),
            },
        };
        if op.kind != Kind::Flush && op.len == 0 {
            self.ready
                .push((op.completion.expect("new op"), Ok(IoBuf::new())));
            return;
        }
        let idx = store(&mut self.ops, &mut self.free, op);
        self.in_flight += 1;
        self.unsent.push(idx);
    }

    /// Build the SQEs of the started requests, merging runs of adjacent
    /// ones; a run that follows a request in the kernel waits for it (see
    /// the module documentation). With `all`, nothing waits.
    pub(super) fn flush_unsent(&mut self) {
        self.flush(false);
    }

    fn flush(&mut self, all: bool) {
        // Pushing may reap (a full queue), and so finish the request a run
        // waits for after it was held: nothing would wake the owner for
        // it, so the held runs are looked at again until none is free.
        while self.flush_once(all) {}
    }

    /// One pass of [`Core::flush`]: whether a run was held whose request
    /// to follow has finished meanwhile.
    fn flush_once(&mut self, all: bool) -> bool {
        let mut held = Vec::new();
        let mut unsent = std::mem::take(&mut self.unsent);
        unsent.sort_by_key(|&i| {
            let o = self.op(i);
            (
                Arc::as_ptr(&o.files) as usize,
                o.kind as u8,
                o.fua,
                o.offset,
            )
        });
        let mut i = 0;
        while i < unsent.len() {
            let mut j = i + 1;
            let mut total = self.op(unsent[i]).len;
            while j < unsent.len() && j - i < MERGE_OPS {
                let next = self.op(unsent[j]).len;
                if total + next > MERGE_BYTES || !self.joins(unsent[j - 1], unsent[j]) {
                    break;
                }
                total += next;
                j += 1;
            }
            if !all && total < MERGE_BYTES && j - i < MERGE_OPS && self.follows(unsent[i]) {
                self.followed += 1;
                held.push(unsent[i]);
                self.unsent.extend_from_slice(&unsent[i..j]);
                i = j;
                continue;
            }
            if j - i == 1 {
                self.submit_op(unsent[i]);
            } else {
                self.submit_group(unsent[i..j].to_vec(), total);
            }
            i = j;
        }
        held.into_iter().any(|h| !self.follows(h))
    }

    /// Whether op `idx` (not sent) could join a request in the kernel that
    /// ends where it starts.
    fn follows(&self, idx: usize) -> bool {
        let b = self.op(idx);
        if b.kind == Kind::Flush || b.len > MERGE_OP || b.done_bytes != 0 {
            return false;
        }
        self.ops.iter().flatten().any(|a| {
            a.sent
                && a.kind == b.kind
                && a.fua == b.fua
                && a.direct == b.direct
                && a.len <= MERGE_OP
                && Arc::ptr_eq(&a.files, &b.files)
                && a.offset + a.len as u64 == b.offset
        })
    }

    fn op(&self, idx: usize) -> &Op {
        self.ops[idx].as_ref().expect("op in flight")
    }

    /// Whether op `b` can follow op `a` in one vectored request.
    fn joins(&self, a: usize, b: usize) -> bool {
        let (a, b) = (self.op(a), self.op(b));
        a.kind == b.kind
            && a.kind != Kind::Flush
            && a.fua == b.fua
            && a.direct == b.direct
            && Arc::ptr_eq(&a.files, &b.files)
            && a.done_bytes == 0
            && b.done_bytes == 0
            && a.len <= MERGE_OP
            && b.len <= MERGE_OP
            && a.offset + a.len as u64 == b.offset
    }

    /// Push one vectored SQE for `members` (adjacent, in order).
    fn submit_group(&mut self, members: Vec<usize>, total: usize) {
        let mut iov = Vec::with_capacity(members.len());
        for &m in &members {
            let op = self.ops[m].as_mut().expect("op in flight");
            op.sent = true;
            iov.push(libc::iovec {
                iov_base: op.buf.ptr_at(0).cast(),
                iov_len: op.len,
            });
        }
        let first = self.op(members[0]);
        let fd = types::Fd(first.fd());
        let (offset, kind, fua) = (first.offset, first.kind, first.fua);
        let group = Group {
            members,
            iov: IoVecs(iov),
            total,
        };
        let gidx = store(&mut self.groups, &mut self.free_groups, group);
        let g = self.groups[gidx].as_ref().expect("just stored");
        let members = g.members.len() as u64;
        self.groups_built += 1;
        self.merged += members;
        MERGED_ALL.fetch_add(members, Ordering::Relaxed);
        let (ptr, n) = (g.iov.0.as_ptr(), g.iov.0.len() as u32);
        let entry = if kind == Kind::Read {
            opcode::Readv::new(fd, ptr, n).offset(offset).build()
        } else {
            let flags = if fua { libc::RWF_DSYNC } else { 0 };
            if flags & libc::RWF_DSYNC != 0 {
                self.merged_fua += members;
            }
            opcode::Writev::new(fd, ptr, n)
                .offset(offset)
                .rw_flags(flags)
                .build()
        };
        self.push(entry.user_data(GROUP_TOKEN | gidx as u64));
    }

    /// A merged request's CQE: every member done, or each takes the bytes
    /// that reached it and goes on alone.
    fn on_group_cqe(&mut self, gidx: usize, res: i32) {
        let g = self.groups[gidx].take().expect("CQE for a group in flight");
        self.free_groups.push(gidx);
        let mut moved = usize::try_from(res).unwrap_or(0);
        let full = moved == g.total;
        for m in g.members {
            let op = self.ops[m].as_mut().expect("op in flight");
            let k = moved.min(op.len);
            moved -= k;
            op.done_bytes = k;
            if full || k == op.len {
                self.finish(m, Ok(()));
            } else {
                self.submit_op(m);
            }
        }
    }

    /// Push the SQE for the rest of op `idx`.
    fn submit_op(&mut self, idx: usize) {
        let op = self.ops[idx].as_mut().expect("op in flight");
        op.sent = true;
        let fd = types::Fd(op.fd());
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
    pub(super) fn reap(&mut self) {
        loop {
            let Some(cqe) = self.ring.completion().next() else {
                return;
            };
            let token = cqe.user_data();
            if token == WAKE_TOKEN {
                self.wake_seen = true;
                continue;
            }
            if token & GROUP_TOKEN != 0 {
                self.on_group_cqe((token & !GROUP_TOKEN) as usize, cqe.result());
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
                (Kind::Read, Buf::Fill(mut b)) => {
                    let skip = b.start();
                    // SAFETY: the read completed in full: the kernel wrote
                    // all `done_bytes` (= the request's length; the
                    // capacity holds `skip` + that) bytes at the start of
                    // the vector's spare capacity, right after the `skip`
                    // initialized prefix bytes. The data stays where it
                    // landed: the buffer starts at `skip`.
                    unsafe { b.raw_mut().set_len(skip + done_bytes) };
                    b
                }
                _ => IoBuf::new(),
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
            self.flush(true);
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

/// Put `v` in a free slot of `slots` (listed in `free`) or a new one; its
/// index.
fn store<T>(slots: &mut Vec<Option<T>>, free: &mut Vec<usize>, v: T) -> usize {
    match free.pop() {
        Some(i) => {
            slots[i] = Some(v);
            i
        }
        None => {
            slots.push(Some(v));
            slots.len() - 1
        }
    }
}

/// Errors of `io_uring_enter` that only mean "try again".
pub(super) fn retry_later(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}

/// Run finished requests' completions.
pub(super) fn run_ready(ready: Vec<(IoCompletion, IoResult)>) {
    for (done, r) in ready {
        complete(done, r);
    }
}

/// Run a completion; a panic in it must not take the ring (and the
/// buffers the kernel still uses) down.
pub(super) fn complete(done: IoCompletion, r: IoResult) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(r))).is_err() {
        eprintln!("ethersan: an I/O completion panicked");
    }
}
