//! Regular files and block devices as logical units (positional I/O).
//!
//! A missing file is created sparse at the size asked for; an existing file
//! keeps its size unless a larger one is asked for (it is never truncated).
//! Writes with FUA use `pwritev2(RWF_DSYNC)`; SYNCHRONIZE CACHE is
//! `fdatasync`.
//!
//! Two options change how the data moves ([`FileOptions`]):
//! - `direct`: a second descriptor opened with `O_DIRECT` carries every
//!   READ and WRITE, bypassing the page cache. A read lands at an aligned
//!   spot of its own [`IoBuf`] and stays there; a write from an aligned
//!   [`IoBuf`] goes to the device as is, one from unaligned memory is
//!   bounced through an aligned copy (counted:
//!   [`FileDevice::bounced_bytes`]); a transfer the
//!   device refuses as misaligned (EINVAL, e.g. 512-byte blocks on a 4Kn
//!   disk) goes through the buffered descriptor instead. A direct transfer
//!   never completes inline (it always waits for the device).
//! - `engine`: [`IoEngine::Sync`] (blocking `pread`/`pwrite`, handed back
//!   to the caller as a [`Submission::Blocking`] job) or [`IoEngine::Uring`]
//!   (an io_uring [`UringEngine`]: [`Submission::Pending`], completed from
//!   the ring thread). When the kernel refuses io_uring the device falls
//!   back to the sync engine with a warning.
//!
//! Both first try to finish inside [`BlockDevice::submit`] without waiting
//! (buffered only): a READ with `preadv2(RWF_NOWAIT)` into the request's
//! buffer (kept, never reallocated, when the attempt falls short), a
//! WRITE without FUA with `pwritev2(RWF_NOWAIT)` or, where the filesystem
//! has no such thing, a write while those stay fast whose partly covered
//! pages are in the page cache (probed with a `RWF_NOWAIT` read, so that
//! no read of the rest of a page can make it wait).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::fill::read_fill;
use crate::lock::{Locking, StoreLock};
use crate::readahead::ReadAhead;
use crate::uring::UringEngine;
use crate::{BackendError, BlockDevice, IoBuf, IoCompletion, IoRequest, Submission};

/// How a file or block device moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoEngine {
    /// Blocking `preadv2`/`pwritev2`, run by the caller (the server: on its
    /// blocking thread pool).
    #[default]
    Sync,
    /// io_uring: one ring and one thread per device; READ/WRITE are
    /// submitted asynchronously with owned buffers.
    Uring,
}

/// An engine name that is neither `sync` nor `uring`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown I/O engine {0:?} (use \"sync\" or \"uring\")")]
pub struct UnknownEngine(pub String);

impl std::str::FromStr for IoEngine {
    type Err = UnknownEngine;
    fn from_str(s: &str) -> Result<IoEngine, UnknownEngine> {
        match s {
            "sync" => Ok(IoEngine::Sync),
            "uring" | "io_uring" => Ok(IoEngine::Uring),
            other => Err(UnknownEngine(other.to_string())),
        }
    }
}

impl std::fmt::Display for IoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoEngine::Sync => "sync",
            IoEngine::Uring => "uring",
        })
    }
}

/// How to open a file or block device.
#[derive(Debug, Clone)]
pub struct FileOptions {
    /// Size in bytes; required to create a missing file.
    pub size: Option<u64>,
    /// Logical block size (512 or 4096).
    pub block_size: u32,
    /// Open read-only.
    pub read_only: bool,
    /// Fully provision (preallocate) a regular file instead of keeping it
    /// sparse; a fully provisioned LUN does not deallocate on UNMAP.
    pub preallocate: bool,
    /// Open with `O_DIRECT` (bypass the page cache).
    pub direct: bool,
    /// The I/O engine.
    pub engine: IoEngine,
}

/// A file or block device exported as a LUN.
#[derive(Debug)]
pub struct FileDevice {
    file: Arc<File>,
    /// The `O_DIRECT` descriptor of the same store, with `direct`.
    direct: Option<Arc<File>>,
    /// The io_uring engine, with `engine = uring` (when the kernel allows).
    uring: Option<UringEngine>,
    /// Read-ahead for sequential streams: direct, io_uring, and the store
    /// locked by this process alone (see [`readahead`]).
    readahead: Option<Arc<ReadAhead>>,
    path: PathBuf,
    block_size: u32,
    /// Whether `pwritev2(RWF_NOWAIT)` works here (cleared on EOPNOTSUPP).
    nowait_writes: AtomicBool,
    /// Whether `preadv2(RWF_NOWAIT)` works here (cleared on EOPNOTSUPP).
    nowait_reads: AtomicBool,
    /// Without RWF_NOWAIT: no inline writes until this instant (nanoseconds
    /// since `opened`), set after an inline write that was slow.
    inline_backoff_until: AtomicU64,
    /// When the device was opened (the base of `inline_backoff_until`).
    opened: std::time::Instant,
    /// Current size in blocks; changes only through `refresh_size`.
    num_blocks: AtomicU64,
    is_block_device: bool,
    thin: bool,
    /// The lock on the store while this device exports it (see
    /// [`crate::lock`]); `None` when opened without one.
    lock: Option<Arc<StoreLock>>,
    /// Bytes the sync engine copied to aligned memory for `O_DIRECT`.
    bounced: Arc<AtomicU64>,
}

impl FileDevice {
    /// Whether the store is a block device.
    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }

    /// The engine in use (sync when io_uring was asked for but refused).
    pub fn engine(&self) -> IoEngine {
        if self.uring.is_some() {
            IoEngine::Uring
        } else {
            IoEngine::Sync
        }
    }

    /// The io_uring engine, when the device uses one.
    #[cfg(test)]
    pub(crate) fn uring(&self) -> Option<&UringEngine> {
        self.uring.as_ref()
    }

    /// Bytes of writes that reached the `O_DIRECT` descriptor from
    /// unaligned memory and were copied to aligned memory first (a
    /// bounce), by either engine since the device was opened. Zero while
    /// every write comes in an aligned [`IoBuf`] (reads never
    /// bounce: they land in aligned memory of their own buffer).
    pub fn bounced_bytes(&self) -> u64 {
        self.bounced.load(Ordering::Relaxed)
            + self.uring.as_ref().map_or(0, UringEngine::bounced_bytes)
    }

    /// Read-ahead so far, when this device reads ahead: reads answered
    /// from a prediction, and bytes read ahead.
    pub fn readahead_stats(&self) -> Option<(u64, u64)> {
        self.readahead.as_ref().map(|r| (r.hits(), r.issued()))
    }

    /// Whether transfers bypass the page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The blocking half of the sync engine, owning what it needs so that
    /// it can run on another thread.
    fn sync_io(&self) -> SyncIo {
        SyncIo {
            file: self.file.clone(),
            direct: self.direct.clone(),
            bounced: self.bounced.clone(),
        }
    }

    /// Try to finish a READ without waiting (never with `O_DIRECT`): whether
    /// `buf` now holds all `len` bytes. Bytes read before the data ran out
    /// stay in `buf`.
    fn read_inline(&self, offset: u64, buf: &mut IoBuf, len: usize) -> Result<bool, BackendError> {
        if self.direct.is_some() || !self.nowait_reads.load(Ordering::Relaxed) {
            return Ok(false);
        }
        buf.reserve_plain(len);
        match read_fill(&self.file, offset, buf.raw_mut(), 0, len, true) {
            Ok(done) => Ok(done),
            Err(e) if nowait_unsupported(&e) => {
                self.nowait_reads.store(false, Ordering::Relaxed);
                Ok(false)
            }
            Err(source) => Err(BackendError::Read {
                offset,
                cause: source,
            }),
        }
    }

    /// Try to finish a WRITE without FUA without waiting: whether all of
    /// `buf` was written (else nothing or part of it was, and the caller
    /// writes all of it the waiting way).
    fn write_inline(&self, offset: u64, buf: &[u8]) -> Result<bool, BackendError> {
        if self.direct.is_some() {
            return Ok(false);
        }
        if self.nowait_writes.load(Ordering::Relaxed) {
            let done = self
                .nowait_write(offset, buf)
                .map_err(|source| BackendError::Write {
                    offset,
                    cause: source,
                })?;
            if done || self.nowait_writes.load(Ordering::Relaxed) {
                return Ok(done);
            }
        }
        // The filesystem cannot say whether a buffered write would wait
        // (ext4 has no RWF_NOWAIT for them). A page-aligned write into the
        // page cache needs no read and normally takes microseconds: do it
        // here while that holds; after one that took long (dirty-page
        // throttling, a full journal), send writes the waiting way for a
        // second.
        const PAGE: u64 = 4096;
        const SLOW: std::time::Duration = std::time::Duration::from_micros(500);
        if buf.len() > 256 * 1024 {
            return Ok(false);
        }
        // A write that covers part of a page reads the rest of it first,
        // unless the page is in the page cache: look, without waiting, at
        // the pages it covers only in part (a 512-byte iSCSI write, a 1 KiB
        // AoE frame into a file being rewritten).
        let end = offset + buf.len() as u64;
        let partial = [
            (!offset.is_multiple_of(PAGE)).then(|| offset / PAGE * PAGE),
            (!end.is_multiple_of(PAGE)).then(|| end / PAGE * PAGE),
        ];
        for page in partial.into_iter().flatten() {
            if !self.page_cached(page) {
                return Ok(false);
            }
        }
        let now = self.opened.elapsed().as_nanos() as u64;
        if now < self.inline_backoff_until.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let started = std::time::Instant::now();
        self.file
            .write_all_at(buf, offset)
            .map_err(|source| BackendError::Write {
                offset,
                cause: source,
            })?;
        if started.elapsed() > SLOW {
            self.inline_backoff_until
                .store(now + 1_000_000_000, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// Whether the page at `page` is in the page cache (a `RWF_NOWAIT`
    /// read of it comes back whole). Anything else — such reads not
    /// supported, a page that runs past the end of the file, any error —
    /// is "not known to be cached": the write then takes the waiting way,
    /// and a failed look never becomes the write's error.
    fn page_cached(&self, page: u64) -> bool {
        if !self.nowait_reads.load(Ordering::Relaxed) {
            return false;
        }
        let mut probe = Vec::with_capacity(4096);
        match read_fill(&self.file, page, &mut probe, 0, 4096, true) {
            Ok(done) => done,
            Err(e) => {
                if nowait_unsupported(&e) {
                    self.nowait_reads.store(false, Ordering::Relaxed);
                }
                false
            }
        }
    }

    /// One `pwritev2` with `RWF_NOWAIT`: whether it wrote all of `buf`
    /// without waiting.
    fn nowait_write(&self, offset: u64, buf: &[u8]) -> io::Result<bool> {
        let iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let fd = self.file.as_raw_fd();
        loop {
            // SAFETY: the iovec describes `buf`, alive and only read by the
            // kernel for the duration of the call; the fd is open for the
            // life of `self`.
            let n = unsafe { libc::pwritev2(fd, &iov, 1, offset as libc::off_t, libc::RWF_NOWAIT) };
            if n >= 0 {
                return Ok(n as usize == buf.len());
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(false),
                _ if nowait_unsupported(&e) => {
                    self.nowait_writes.store(false, Ordering::Relaxed);
                    return Ok(false);
                }
                _ => return Err(e),
            }
        }
    }
}

/// Drops the read-ahead predictions of a range when it goes (after a
/// change to the store there, however it ended).
struct InvalidateOnDrop<'a>(&'a ReadAhead, u64, u64);

impl Drop for InvalidateOnDrop<'_> {
    fn drop(&mut self) {
        self.0.invalidate(self.1, self.2);
    }
}

/// Whether an error of a `RWF_NOWAIT` call means "not supported here".
fn nowait_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL)
    )
}

impl BlockDevice for FileDevice {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.num_blocks.load(Ordering::Relaxed)
    }
    fn resize(&self, bytes: u64) -> Result<Option<u64>, BackendError> {
        let path = self.path.display();
        if self.is_block_device {
            return Err(BackendError::Config(format!(
                "{path} is a block device: grow the device itself, then rescan (SIGHUP)"
            )));
        }
        let bs = u64::from(self.block_size);
        let now = self.num_blocks() * bs;
        if !bytes.is_multiple_of(bs) {
            return Err(BackendError::Config(format!(
                "new size {bytes} of {path} is not a multiple of the block size {bs}"
            )));
        }
        if bytes < now {
            return Err(BackendError::Config(format!(
                "{path} would shrink from {now} to {bytes} bytes and lose the blocks beyond; only growing is supported"
            )));
        }
        self.file
            .set_len(bytes)
            .map_err(|source| BackendError::Write {
                offset: bytes,
                cause: source,
            })?;
        self.refresh_size()
    }
    fn refresh_size(&self) -> Result<Option<u64>, BackendError> {
        let err = |source| BackendError::Open {
            path: self.path.display().to_string(),
            cause: source,
        };
        let size = if self.is_block_device {
            block_device_size(&self.file).map_err(err)?
        } else {
            self.file.metadata().map_err(err)?.len()
        };
        let blocks = size / u64::from(self.block_size);
        if blocks == 0 {
            return Err(BackendError::Config(format!(
                "{} shrank below one block",
                self.path.display()
            )));
        }
        let old = self.num_blocks.swap(blocks, Ordering::Relaxed);
        if old != blocks {
            // What was read ahead beyond a shrunk end must not come back.
            if let Some(ra) = &self.readahead {
                ra.invalidate(0, u64::MAX);
            }
        }
        Ok((old != blocks).then_some(blocks))
    }
    /// Inline when the page cache allows (never with `O_DIRECT`, never a
    /// FUA write or a flush), else `Pending` on io_uring or `Blocking`
    /// with the sync engine.
    fn submit(&self, req: IoRequest, done: IoCompletion) -> Submission {
        match req {
            IoRequest::Read {
                offset,
                len,
                mut buf,
            } => {
                if len == 0 {
                    buf.reserve_plain(0);
                    return Submission::Done(Ok(buf));
                }
                match self.read_inline(offset, &mut buf, len) {
                    Ok(true) => return Submission::Done(Ok(buf)),
                    Ok(false) => {}
                    Err(e) => return Submission::Done(Err(e)),
                }
                if let Some(u) = &self.uring {
                    let done = match &self.readahead {
                        Some(ra) => {
                            let size = self.num_blocks() * u64::from(self.block_size);
                            let issue = |o, l, c| u.submit(IoRequest::read(o, l), c);
                            match ra.read(offset, len, size, done, issue) {
                                Ok(answered) => return answered,
                                Err(done) => done,
                            }
                        }
                        None => done,
                    };
                    u.submit(IoRequest::Read { offset, len, buf }, done);
                    return Submission::Pending;
                }
                let io = self.sync_io();
                Submission::Blocking(Box::new(move || io.read(offset, buf, len)))
            }
            IoRequest::Write {
                offset,
                data,
                len,
                fua,
            } => {
                let len = len.min(data.len());
                if len == 0 {
                    return Submission::Done(Ok(IoBuf::new()));
                }
                if !fua {
                    match self.write_inline(offset, &data[..len]) {
                        Ok(true) => return Submission::Done(Ok(IoBuf::new())),
                        Ok(false) => {}
                        Err(e) => return Submission::Done(Err(e)),
                    }
                }
                if let Some(u) = &self.uring {
                    let req = IoRequest::Write {
                        offset,
                        data,
                        len,
                        fua,
                    };
                    let done = match &self.readahead {
                        // Before and after: a prediction read while the
                        // write was on the device may hold the old data.
                        Some(ra) => {
                            ra.invalidate(offset, len as u64);
                            let ra = ra.clone();
                            Box::new(move |r| {
                                ra.invalidate(offset, len as u64);
                                done(r)
                            })
                        }
                        None => done,
                    };
                    u.submit(req, done);
                    return Submission::Pending;
                }
                let io = self.sync_io();
                Submission::Blocking(Box::new(move || io.write(offset, &data[..len], fua)))
            }
            IoRequest::Flush => {
                if let Some(u) = &self.uring {
                    u.submit(IoRequest::Flush, done);
                    return Submission::Pending;
                }
                let io = self.sync_io();
                Submission::Blocking(Box::new(move || io.flush()))
            }
        }
    }
    fn prefetch(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        // SAFETY: posix_fadvise only reads its integer arguments; the fd is open.
        let rc = unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            )
        };
        if rc != 0 {
            return Err(BackendError::Read {
                offset,
                cause: io::Error::from_raw_os_error(rc),
            });
        }
        Ok(())
    }
    fn thin_provisioned(&self) -> bool {
        self.thin
    }
    fn splits_reads(&self) -> bool {
        self.direct.is_some() && self.uring.is_some()
    }
    fn splits_writes(&self) -> bool {
        self.direct.is_some() && self.uring.is_some()
    }
    fn unmap(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        if !self.thin {
            return Err(BackendError::Unsupported);
        }
        // Before and after, as for a write.
        let _after = self.readahead.as_ref().map(|ra| {
            ra.invalidate(offset, len);
            InvalidateOnDrop(ra, offset, len)
        });
        // SAFETY: fallocate only reads its integer arguments; the fd is open.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc != 0 {
            return Err(BackendError::Write {
                offset,
                cause: io::Error::last_os_error(),
            });
        }
        Ok(())
    }
    fn lba_status(&self, offset: u64, max: u64) -> Result<(bool, u64), BackendError> {
        if !self.thin {
            return Ok((true, max));
        }
        let end = offset
            .saturating_add(max)
            .min(self.num_blocks() * u64::from(self.block_size));
        let seek = |whence| {
            // SAFETY: lseek only reads its integer arguments; the fd is open.
            // SEEK_DATA/SEEK_HOLE do not move anything another thread relies
            // on: all I/O here is positional.
            let r = unsafe { libc::lseek(self.file.as_raw_fd(), offset as libc::off_t, whence) };
            if r < 0 {
                let e = io::Error::last_os_error();
                // ENXIO: no data at or after offset (a hole to the end).
                if e.raw_os_error() == Some(libc::ENXIO) {
                    return Ok(end);
                }
                return Err(BackendError::Read { offset, cause: e });
            }
            Ok(r as u64)
        };
        let data = seek(libc::SEEK_DATA)?;
        if data > offset {
            // A hole up to the next data.
            return Ok((false, data.min(end) - offset));
        }
        let hole = seek(libc::SEEK_HOLE)?;
        Ok((true, hole.min(end).saturating_sub(offset).max(1)))
    }
    fn store_lock(&self) -> Option<Arc<StoreLock>> {
        self.lock.clone()
    }
    fn describe(&self) -> String {
        format!(
            "{} ({} blocks of {}, {} engine{})",
            self.path.display(),
            self.num_blocks(),
            self.block_size,
            self.engine(),
            if self.is_direct() { ", O_DIRECT" } else { "" }
        )
    }
}

mod open;
mod sync;
#[cfg(test)]
mod tests;

use open::block_device_size;
pub use open::human_bytes;
use sync::SyncIo;
