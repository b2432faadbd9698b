//! Storage backends for ethersan logical units.
//!
//! The SCSI layer sees storage only through [`BlockDevice`]: a flat array of
//! bytes with a logical block size, read and written at byte offsets that are
//! always multiples of the block size. Implementations: regular files and
//! block devices ([`file::FileDevice`]) and memory ([`ram::RamDevice`]).
//!
//! Every engine has one data-path call, [`BlockDevice::submit`]: a READ,
//! WRITE or flush with owned buffers goes in, and the answer is one of
//! [`Submission::Done`] (finished without waiting: RAM always, a file when
//! the page cache could take it, tried inside the engine with
//! `RWF_NOWAIT`), [`Submission::Pending`] (the engine calls the completion
//! later, from the thread that runs its io_uring) or [`Submission::Blocking`] (the sync
//! engine: a job that does the blocking `pread`/`pwrite`, for the caller to
//! run where blocking is fine). The caller never tries several protocols in
//! turn, and a read buffer is allocated once and never zeroed: the kernel
//! fills its spare capacity.
//!
//! A file or block device uses one of two I/O engines ([`file::IoEngine`]):
//! blocking `pread`/`pwrite`, or io_uring ([`uring::UringEngine`]), which
//! completes requests without a thread per I/O: in the submitting thread's
//! own ring ([`uring::LocalRing`], a server worker's) or else on one ring
//! thread per device. Either can open the store with `O_DIRECT` ([`aligned`] provides the
//! aligned buffers that needs); a direct transfer never completes inline.
#![warn(missing_docs, unreachable_pub)]

use std::io;

pub mod aligned;
pub mod file;
mod fill;
pub mod lock;
pub mod ram;
mod readahead;
pub mod shared;
pub mod uring;

pub use aligned::IoBuf;
pub use shared::{MemoryShared, SharedState, Versioned};

/// One data-path request ([`BlockDevice::submit`]); buffers are owned, so
/// they stay alive until the kernel is done with them.
#[derive(Debug)]
pub enum IoRequest {
    /// Read `len` bytes at byte `offset`.
    Read {
        /// Byte offset.
        offset: u64,
        /// Bytes to read.
        len: usize,
        /// An allocation to reuse for the data: it is cleared (its old
        /// contents are never returned) and grown as needed; with
        /// `O_DIRECT` the data lands at an aligned spot of it and stays
        /// there. `IoBuf::new()` lets the engine allocate.
        buf: IoBuf,
    },
    /// Write `data[..len]` at byte `offset`; with `fua` the data is on
    /// stable storage when the request completes.
    Write {
        /// Byte offset.
        offset: u64,
        /// The data (may be longer than `len`); aligned memory
        /// ([`IoBuf::aligned`]) reaches an `O_DIRECT` descriptor without
        /// a bounce copy.
        data: IoBuf,
        /// Bytes of `data` to write.
        len: usize,
        /// Force Unit Access.
        fua: bool,
    },
    /// Make every completed write durable.
    Flush,
}

impl IoRequest {
    /// A read of `len` bytes at `offset` into a buffer the engine allocates.
    pub fn read(offset: u64, len: usize) -> IoRequest {
        IoRequest::Read {
            offset,
            len,
            buf: IoBuf::new(),
        }
    }

    /// The error for this request's failure with `source`.
    pub fn error(&self, source: io::Error) -> BackendError {
        match self {
            IoRequest::Read { offset, .. } => BackendError::Read {
                offset: *offset,
                cause: source,
            },
            IoRequest::Write { offset, .. } => BackendError::Write {
                offset: *offset,
                cause: source,
            },
            IoRequest::Flush => BackendError::Flush(source),
        }
    }
}

/// A request's outcome: the bytes read for a [`IoRequest::Read`] (exactly
/// the length asked for, where the engine put them), an empty buffer for
/// a write or flush.
pub type IoResult = Result<IoBuf, BackendError>;

/// Called exactly once with a request's outcome when, and only when,
/// [`BlockDevice::submit`] answered [`Submission::Pending`]. It runs on
/// the engine's thread, so it must be quick (build a response, send it on
/// a channel).
pub type IoCompletion = Box<dyn FnOnce(IoResult) + Send>;

/// The blocking part of a request: does the I/O and returns the outcome.
pub type BlockingIo = Box<dyn FnOnce() -> IoResult + Send>;

/// What [`BlockDevice::submit`] did with a request.
pub enum Submission {
    /// Finished without waiting; the completion was dropped uncalled.
    Done(IoResult),
    /// In flight; the completion is called once it finishes (maybe before
    /// `submit` returns, on another thread).
    Pending,
    /// The request must wait for the device and this engine has no thread
    /// of its own for that: run the job where blocking is fine (a blocking
    /// thread pool). The completion was dropped uncalled; the job returns
    /// the outcome.
    ///
    /// Why not a worker pool inside the sync engine: the server already
    /// has a blocking pool per worker (placed on its CPU, see the server's
    /// `placement`), sized for commands in flight, and the sync engine's
    /// whole point is one thread per waiting I/O; a second pool would
    /// duplicate it and hide its threads from that placement.
    Blocking(BlockingIo),
}

impl std::fmt::Debug for Submission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Submission::Done(r) => f.debug_tuple("Done").field(r).finish(),
            Submission::Pending => f.write_str("Pending"),
            Submission::Blocking(_) => f.write_str("Blocking(..)"),
        }
    }
}

/// Submit `req` to `dev` and wait for its outcome on this thread (running
/// a [`Submission::Blocking`] job here): for slow-path commands and tools
/// that may block.
pub fn submit_and_wait(dev: &(impl BlockDevice + ?Sized), req: IoRequest) -> IoResult {
    // The request must not go into this thread's own ring: only this
    // thread, about to wait, would run its completion.
    let _bypass = uring::BypassLocal::new();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    match dev.submit(
        req,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    ) {
        Submission::Done(r) => r,
        Submission::Blocking(job) => job(),
        Submission::Pending => rx.recv().unwrap_or_else(|_| {
            Err(BackendError::Flush(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the engine dropped a request",
            )))
        }),
    }
}

/// Blocking conveniences over [`BlockDevice::submit`] for slow-path
/// commands (VERIFY, COMPARE AND WRITE, ORWRITE, WRITE ATOMIC, WRITE SAME,
/// EXTENDED COPY, SANITIZE) that run where blocking is fine. They are not a
/// second protocol: each is one `submit` and a wait.
pub trait BlockDeviceExt: BlockDevice {
    /// Read `buf.len()` bytes at byte `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        let data = submit_and_wait(self, IoRequest::read(offset, buf.len()))?;
        buf.copy_from_slice(&data);
        Ok(())
    }
    /// Write `buf` at byte `offset` (durable on return with `fua`).
    fn write_at(&self, offset: u64, buf: &[u8], fua: bool) -> Result<(), BackendError> {
        let req = IoRequest::Write {
            offset,
            data: buf.to_vec().into(),
            len: buf.len(),
            fua,
        };
        submit_and_wait(self, req).map(drop)
    }
    /// Make every completed write durable (SYNCHRONIZE CACHE), waiting.
    fn flush(&self) -> Result<(), BackendError> {
        submit_and_wait(self, IoRequest::Flush).map(drop)
    }
}

impl<T: BlockDevice + ?Sized> BlockDeviceExt for T {}

/// Errors a backend reports; the SCSI layer maps each to sense data.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The underlying read failed (maps to MEDIUM ERROR / UNRECOVERED READ ERROR).
    #[error("read error at byte {offset}: {cause}")]
    Read {
        /// Byte offset of the failed access.
        offset: u64,
        /// The OS error.
        cause: io::Error,
    },
    /// The underlying write failed (maps to MEDIUM ERROR / WRITE ERROR, or
    /// SPACE ALLOCATION FAILED when the error is ENOSPC).
    #[error("write error at byte {offset}: {cause}")]
    Write {
        /// Byte offset of the failed access.
        offset: u64,
        /// The OS error.
        cause: io::Error,
    },
    /// Flushing to stable storage failed.
    #[error("flush failed: {0}")]
    Flush(io::Error),
    /// Opening or creating the backing store failed.
    #[error("cannot open {path}: {cause}{}", open_hint(.cause))]
    Open {
        /// The path given.
        path: String,
        /// The OS error.
        cause: io::Error,
    },
    /// Another server, or another LUN of this one, exports the store (its
    /// lock, see [`lock`], is held).
    #[error("{path} is in use by {holder}{}", in_use_hint(.holder, *.wanted))]
    InUse {
        /// The path given.
        path: String,
        /// Who holds the lock.
        holder: lock::Holder,
        /// The lock that was asked for.
        wanted: lock::LockMode,
    },
    /// The configuration of the backend is invalid (size, block size...).
    #[error("{0}")]
    Config(String),
    /// The operation is not supported by this backend.
    #[error("operation not supported by this backend")]
    Unsupported,
}

/// What to do about a backing store that cannot be opened, where there is
/// an obvious fix.
fn open_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => {
            "; to export it read-only, add ,ro to the --lun spec (read_only = true in a config file)"
        }
        Some(libc::EBUSY) => "; another program (a mount, another server) holds it open exclusively",
        _ => "",
    }
}

/// What to do about a store another exporter holds.
fn in_use_hint(holder: &lock::Holder, wanted: lock::LockMode) -> &'static str {
    use lock::{Holder, LockMode};
    match (holder, wanted) {
        (Holder::ThisProcess, _) => {
            "; a store backs one LUN: remove that LUN first or choose another file (shared = true on both LUNs lets them share it)"
        }
        (Holder::Process { mode: LockMode::Shared, .. }, LockMode::Exclusive) => {
            ", which exports it shared: set shared = true on this LUN too to share it (--lun PATH,shared), or stop that server first"
        }
        (_, LockMode::Shared) => {
            ", which exports it alone (without shared = true): stop it first, or set shared = true in every server that exports it"
        }
        (_, LockMode::Exclusive) => {
            ": two servers on one disk corrupt it, each with its own cache, reservations and identity; stop that server first or choose another file (if the disk is meant to be shared, as on a cluster file system whose users coordinate, set shared = true on the LUN in every server that exports it: --lun PATH,shared)"
        }
    }
}

/// A flat block store that a logical unit exports.
///
/// All offsets and lengths passed in are multiples of [`block_size`](Self::block_size)
/// and lie inside the device (the volume layer checks LBA ranges first).
/// The data path is [`submit`](Self::submit); the other methods (unmap,
/// provisioning status, prefetch, size) are blocking and called where
/// blocking is fine. Implementations must be safe to call from several
/// threads at once (positional I/O, no shared file cursor).
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// Logical block size in bytes (512 or 4096).
    fn block_size(&self) -> u32;
    /// Number of logical blocks.
    fn num_blocks(&self) -> u64;
    /// Start a READ, WRITE or flush (see [`Submission`]). `done` is
    /// called exactly once if and only if the answer is
    /// [`Submission::Pending`]. Never blocks on the I/O: an engine that
    /// would have to wait answers `Pending` or `Blocking`.
    fn submit(&self, req: IoRequest, done: IoCompletion) -> Submission;
    /// Whether a large read is better issued as several requests whose
    /// data can be sent as each completes (cut-through): true where every
    /// read waits for the device and completes asynchronously (io_uring
    /// on an `O_DIRECT` store), so the first part can be on the wire while
    /// the rest is still being read. Default: false (one request).
    fn splits_reads(&self) -> bool {
        false
    }
    /// Whether a large write is better issued as several requests, each
    /// started as soon as its part of the data has arrived (cut-through
    /// WRITE), instead of one request after the last byte: true where
    /// every write waits for the device and completes asynchronously
    /// (io_uring on an `O_DIRECT` store). Default: false (one request).
    fn splits_writes(&self) -> bool {
        false
    }
    /// Hint that a range will be read soon (PRE-FETCH). Default: nothing.
    fn prefetch(&self, _offset: u64, _len: u64) -> Result<(), BackendError> {
        Ok(())
    }
    /// Whether the store can deallocate blocks (thin provisioning): UNMAP and
    /// WRITE SAME with UNMAP call [`unmap`](Self::unmap), GET LBA STATUS
    /// calls [`lba_status`](Self::lba_status).
    fn thin_provisioned(&self) -> bool {
        false
    }
    /// Deallocate a range; afterwards it reads as zeros.
    fn unmap(&self, _offset: u64, _len: u64) -> Result<(), BackendError> {
        Err(BackendError::Unsupported)
    }
    /// Provisioning of the extent that starts at `offset`: whether it is
    /// mapped, and how many bytes (at most `max`) share that state.
    fn lba_status(&self, _offset: u64, max: u64) -> Result<(bool, u64), BackendError> {
        Ok((true, max))
    }
    /// Grow the store to `bytes` (a regular file is extended, sparse) and
    /// take the new size, as [`refresh_size`](Self::refresh_size) does.
    /// Shrinking is refused: the blocks beyond the new end would be lost.
    /// Default: not supported.
    fn resize(&self, _bytes: u64) -> Result<Option<u64>, BackendError> {
        Err(BackendError::Unsupported)
    }
    /// Look at the store's size again (after an administrator grew the file
    /// or block device). Returns the new number of blocks if it changed.
    /// Default: the size never changes.
    fn refresh_size(&self) -> Result<Option<u64>, BackendError> {
        Ok(None)
    }
    /// COMPARE AND WRITE done by the store itself, atomically for every
    /// server that shares it: if the `compare.len()` bytes at `offset`
    /// equal `compare`, write `write` (same length) there, durable with
    /// `fua`. `Ok(None)`: compared equal and written; `Ok(Some(i))`: byte
    /// `i` of the range differed and nothing was written. Blocking.
    /// Default: not supported, and the SCSI layer compares and writes under
    /// its own range lock (atomic within this process only).
    fn compare_and_write(
        &self,
        _offset: u64,
        _compare: &[u8],
        _write: &[u8],
        _fua: bool,
    ) -> Result<Option<u64>, BackendError> {
        Err(BackendError::Unsupported)
    }
    /// The largest COMPARE AND WRITE, in bytes, that
    /// [`compare_and_write`](Self::compare_and_write) does atomically in
    /// the store; `None`: no limit of the store's own. A larger one is
    /// answered `Unsupported` (and the SCSI layer does it itself, atomic
    /// within this process only), so the SCSI layer reports this limit in
    /// its Block Limits page when it is at least one block.
    fn max_compare_and_write_bytes(&self) -> Option<u64> {
        None
    }
    /// WRITE SAME done by the store: `block` (one logical block) repeated
    /// over `len` bytes at `offset`, durable with `fua`. Blocking.
    /// Default: not supported, and the SCSI layer writes the repeated
    /// blocks itself.
    fn write_same(
        &self,
        _offset: u64,
        _len: u64,
        _block: &[u8],
        _fua: bool,
    ) -> Result<(), BackendError> {
        Err(BackendError::Unsupported)
    }
    /// Ask to be told when the store's size may have changed outside this
    /// process (an image resized in its cluster): `changed` is then called
    /// from a thread of the engine, and the caller looks with
    /// [`refresh_size`](Self::refresh_size). Returns whether the engine
    /// can tell. Default: it cannot.
    fn watch_size(&self, _changed: std::sync::Arc<dyn Fn() + Send + Sync>) -> bool {
        false
    }
    /// The state this store shares with every other server exporting it
    /// (reservations, target port groups, identity); `None` for a store
    /// only this process exports.
    fn shared(&self) -> Option<std::sync::Arc<dyn SharedState>> {
        None
    }
    /// The lock this device holds on its store while it exports it (see
    /// [`lock`]); `None` for stores that are not locked (RAM, RBD, a file
    /// opened without one).
    fn store_lock(&self) -> Option<std::sync::Arc<lock::StoreLock>> {
        None
    }
    /// Whether writes to the store persist (false for RAM).
    fn is_persistent(&self) -> bool {
        true
    }
    /// A short human-readable description (path or "ram").
    fn describe(&self) -> String;
}
