//! Regular files and block devices as logical units (positional I/O).
//!
//! A missing file is created sparse at the size asked for; an existing file
//! keeps its size unless a larger one is asked for (it is never truncated).
//! Writes with FUA use `pwritev2(RWF_DSYNC)`; SYNCHRONIZE CACHE is
//! `fdatasync`.
//!
//! Two options change how the data moves ([`FileOptions`]):
//! - `direct`: a second descriptor opened with `O_DIRECT` carries every
//!   READ and WRITE, bypassing the page cache. Caller buffers that are not
//!   page-aligned are bounced through an [`AlignedBuf`]; a transfer the
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
//! has no such thing, a page-aligned write while those stay fast.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::aligned::{AlignedBuf, DIRECT_ALIGN};
use crate::fill::{align_prefix, read_fill};
use crate::uring::UringEngine;
use crate::{BackendError, BlockDevice, IoCompletion, IoRequest, IoResult, Submission};

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
}

/// Set up io_uring with `setup`; when the kernel refuses it (EPERM with
/// `kernel.io_uring_disabled`, ENOSYS without io_uring, ENOMEM under a
/// low memlock limit...) warn and go on with the sync engine (`None`).
fn uring_or_fallback(
    path: &Path,
    setup: impl FnOnce() -> io::Result<UringEngine>,
) -> Option<UringEngine> {
    match setup() {
        Ok(u) => Some(u),
        Err(e) => {
            tracing::warn!(
                path = %path.display(),
                error = %e,
                "io_uring is not available; this LUN uses the sync engine"
            );
            None
        }
    }
}

/// `BLKGETSIZE64` from `<linux/fs.h>`: `_IOR(0x12, 114, size_t)`.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

fn block_device_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points
    // to a live, properly aligned u64 for the duration of the call; the fd
    // is owned by `file` and open.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

impl FileDevice {
    /// Open (or create) the backing store at `path`.
    pub fn open(path: &Path, opts: &FileOptions) -> Result<FileDevice, BackendError> {
        let bs = opts.block_size;
        let open_err = |source| BackendError::Open {
            path: path.display().to_string(),
            source,
        };
        if bs != 512 && bs != 4096 {
            return Err(BackendError::Config(format!(
                "block size {bs} is not 512 or 4096"
            )));
        }
        if let Some(size) = opts.size {
            if size == 0 || size % u64::from(bs) != 0 {
                return Err(BackendError::Config(format!(
                    "size {size} is not a positive multiple of the block size {bs}"
                )));
            }
        }
        let exists = path.exists();
        if !exists {
            if opts.read_only {
                return Err(open_err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "read-only LUN backing file does not exist",
                )));
            }
            if opts.size.is_none() {
                return Err(BackendError::Config(format!(
                    "{} does not exist and no size was given to create it",
                    path.display()
                )));
            }
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(open_err)?;
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .create(!opts.read_only && !exists)
            .open(path)
            .map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        let is_block_device = meta.file_type().is_block_device();
        let size = if is_block_device {
            let dev_size = block_device_size(&file).map_err(open_err)?;
            match opts.size {
                Some(s) if s > dev_size => {
                    return Err(BackendError::Config(format!(
                        "size {s} exceeds the block device's {dev_size} bytes"
                    )))
                }
                Some(s) => s,
                None => dev_size,
            }
        } else {
            let current = meta.len();
            match opts.size {
                Some(s) if s < current && exists => {
                    return Err(BackendError::Config(format!(
                        "{} is {current} bytes, larger than the size {s} given; refusing to truncate it",
                        path.display()
                    )))
                }
                Some(s) if s > current => {
                    if opts.read_only {
                        return Err(BackendError::Config(format!("cannot grow read-only {}", path.display())));
                    }
                    // Extending with set_len leaves a hole: the file stays sparse.
                    file.set_len(s).map_err(open_err)?;
                    s
                }
                _ => current,
            }
        };
        let num_blocks = size / u64::from(bs);
        if num_blocks == 0 {
            return Err(BackendError::Config(format!(
                "{} is smaller than one block",
                path.display()
            )));
        }
        if opts.preallocate && !is_block_device && !opts.read_only {
            // SAFETY: fallocate only reads its integer arguments; the fd is open.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
            if rc != 0 {
                return Err(open_err(io::Error::last_os_error()));
            }
        }
        let thin = !is_block_device && !opts.preallocate;
        let file = Arc::new(file);
        let direct = if opts.direct {
            let d = OpenOptions::new()
                .read(true)
                .write(!opts.read_only)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .map_err(|e| {
                    open_err(io::Error::new(
                        e.kind(),
                        format!("O_DIRECT (direct = true) refused: {e}"),
                    ))
                })?;
            Some(Arc::new(d))
        } else {
            None
        };
        let uring = match opts.engine {
            IoEngine::Sync => None,
            IoEngine::Uring => {
                uring_or_fallback(path, || UringEngine::new(file.clone(), direct.clone()))
            }
        };
        Ok(FileDevice {
            file,
            direct,
            uring,
            path: path.to_path_buf(),
            block_size: bs,
            num_blocks: AtomicU64::new(num_blocks),
            nowait_writes: AtomicBool::new(true),
            nowait_reads: AtomicBool::new(true),
            inline_backoff_until: AtomicU64::new(0),
            opened: std::time::Instant::now(),
            is_block_device,
            thin,
        })
    }

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
        }
    }

    /// Try to finish a READ without waiting (never with `O_DIRECT`): whether
    /// `buf` now holds all `len` bytes. Bytes read before the data ran out
    /// stay in `buf`.
    fn read_inline(
        &self,
        offset: u64,
        buf: &mut Vec<u8>,
        len: usize,
    ) -> Result<bool, BackendError> {
        if self.direct.is_some() || !self.nowait_reads.load(Ordering::Relaxed) {
            return Ok(false);
        }
        match read_fill(&self.file, offset, buf, 0, len, true) {
            Ok(done) => Ok(done),
            Err(e) if nowait_unsupported(&e) => {
                self.nowait_reads.store(false, Ordering::Relaxed);
                Ok(false)
            }
            Err(source) => Err(BackendError::Read { offset, source }),
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
                .map_err(|source| BackendError::Write { offset, source })?;
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
        if offset % PAGE != 0 || buf.len() as u64 % PAGE != 0 || buf.len() > 256 * 1024 {
            return Ok(false);
        }
        let now = self.opened.elapsed().as_nanos() as u64;
        if now < self.inline_backoff_until.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let started = std::time::Instant::now();
        self.file
            .write_all_at(buf, offset)
            .map_err(|source| BackendError::Write { offset, source })?;
        if started.elapsed() > SLOW {
            self.inline_backoff_until
                .store(now + 1_000_000_000, Ordering::Relaxed);
        }
        Ok(true)
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

/// Whether an error of a `RWF_NOWAIT` call means "not supported here".
fn nowait_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL)
    )
}

/// The sync engine's blocking I/O (run by the caller of
/// [`BlockDevice::submit`] as a [`Submission::Blocking`] job).
#[derive(Debug, Clone)]
struct SyncIo {
    file: Arc<File>,
    direct: Option<Arc<File>>,
}

impl SyncIo {
    /// Read `len` bytes at `offset` into `buf` (which may hold the first
    /// bytes already, from an inline attempt).
    fn read(&self, offset: u64, mut buf: Vec<u8>, len: usize) -> IoResult {
        let err = |source| BackendError::Read { offset, source };
        if let Some(d) = &self.direct {
            // Into an aligned spot of the same allocation; no bounce copy.
            let skip = align_prefix(&mut buf, len, DIRECT_ALIGN);
            match read_fill(d, offset, &mut buf, skip, len, false) {
                Ok(_) => {
                    buf.drain(..skip);
                    return Ok(buf);
                }
                // The device refuses this alignment: use the page cache.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => buf.clear(),
                Err(e) => return Err(err(e)),
            }
        }
        // A sparse region reads as zeros.
        read_fill(&self.file, offset, &mut buf, 0, len, false).map_err(err)?;
        Ok(buf)
    }

    /// Write `buf` at `offset` (through the direct descriptor when there is
    /// one, bouncing unaligned memory).
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> IoResult {
        let err = |source| BackendError::Write { offset, source };
        if let Some(d) = &self.direct {
            let bounce;
            let data = if buf.as_ptr().align_offset(DIRECT_ALIGN) == 0 {
                buf
            } else {
                bounce = AlignedBuf::copy_of(buf);
                bounce.as_slice()
            };
            let r = if fua {
                FileDevice::write_dsync(d, offset, data)
            } else {
                d.write_all_at(data, offset)
            };
            match r {
                Ok(()) => return Ok(Vec::new()),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(err(e)),
            }
        }
        let r = if fua {
            FileDevice::write_dsync(&self.file, offset, buf)
        } else {
            self.file.write_all_at(buf, offset)
        };
        r.map(|()| Vec::new()).map_err(err)
    }

    fn flush(&self) -> IoResult {
        self.file
            .sync_data()
            .map(|()| Vec::new())
            .map_err(BackendError::Flush)
    }
}

impl FileDevice {
    fn write_dsync(file: &File, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let iov = libc::iovec {
                iov_base: buf[done..].as_ptr() as *mut libc::c_void,
                iov_len: buf.len() - done,
            };
            // SAFETY: the iovec points into `buf`, which outlives the call and
            // is only read by the kernel; the fd is open for the life of `file`.
            let n = unsafe {
                libc::pwritev2(
                    file.as_raw_fd(),
                    &iov,
                    1,
                    (offset + done as u64) as libc::off_t,
                    libc::RWF_DSYNC,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if e.raw_os_error() == Some(libc::EOPNOTSUPP)
                    || e.raw_os_error() == Some(libc::ENOSYS)
                {
                    // Old kernel or filesystem: write, then fdatasync.
                    file.write_all_at(&buf[done..], offset + done as u64)?;
                    return file.sync_data();
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            done += n as usize;
        }
        Ok(())
    }
}

impl BlockDevice for FileDevice {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.num_blocks.load(Ordering::Relaxed)
    }
    fn refresh_size(&self) -> Result<Option<u64>, BackendError> {
        let err = |source| BackendError::Open {
            path: self.path.display().to_string(),
            source,
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
                buf.clear();
                if len == 0 {
                    return Submission::Done(Ok(buf));
                }
                match self.read_inline(offset, &mut buf, len) {
                    Ok(true) => return Submission::Done(Ok(buf)),
                    Ok(false) => {}
                    Err(e) => return Submission::Done(Err(e)),
                }
                if let Some(u) = &self.uring {
                    buf.clear();
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
                    return Submission::Done(Ok(Vec::new()));
                }
                if !fua {
                    match self.write_inline(offset, &data[..len]) {
                        Ok(true) => return Submission::Done(Ok(Vec::new())),
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
                source: io::Error::from_raw_os_error(rc),
            });
        }
        Ok(())
    }
    fn thin_provisioned(&self) -> bool {
        self.thin
    }
    fn unmap(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        if !self.thin {
            return Err(BackendError::Unsupported);
        }
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
                source: io::Error::last_os_error(),
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
                return Err(BackendError::Read { offset, source: e });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockDeviceExt;
    use std::os::unix::fs::MetadataExt;
    use std::sync::Arc;

    /// A completion for requests that must not go pending.
    pub(super) fn never() -> IoCompletion {
        Box::new(|_| panic!("completion called for a request that did not go pending"))
    }

    pub(super) fn write(offset: u64, data: &[u8], fua: bool) -> IoRequest {
        IoRequest::Write {
            offset,
            data: data.to_vec(),
            len: data.len(),
            fua,
        }
    }

    fn opts(size: Option<u64>, bs: u32) -> FileOptions {
        FileOptions {
            size,
            block_size: bs,
            read_only: false,
            preallocate: false,
            direct: false,
            engine: IoEngine::Sync,
        }
    }

    #[test]
    fn creates_sparse_and_keeps_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/lun.img");
        let d = FileDevice::open(&p, &opts(Some(64 << 20), 512)).unwrap();
        assert_eq!(d.num_blocks(), (64 << 20) / 512);
        let meta = std::fs::metadata(&p).unwrap();
        assert!(meta.blocks() * 512 < 1 << 20, "file is not sparse");
        drop(d);
        let d = FileDevice::open(&p, &opts(None, 4096)).unwrap();
        assert_eq!(d.num_blocks(), (64 << 20) / 4096);
        // Grow sparsely, never shrink.
        let d = FileDevice::open(&p, &opts(Some(128 << 20), 512)).unwrap();
        assert_eq!(d.num_blocks(), (128 << 20) / 512);
        assert!(FileDevice::open(&p, &opts(Some(1 << 20), 512)).is_err());
        assert!(FileDevice::open(&dir.path().join("missing"), &opts(None, 512)).is_err());
        assert!(FileDevice::open(&dir.path().join("odd"), &opts(Some(1000), 512)).is_err());
    }

    #[test]
    fn nonblocking_reads_and_writes_move_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let d = FileDevice::open(&dir.path().join("nb.img"), &opts(Some(1 << 20), 512)).unwrap();
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        // A page-aligned write is taken without waiting (RWF_NOWAIT or the
        // inline path); a misaligned one is left to the blocking path.
        assert!(matches!(
            d.submit(write(4096, &data, false), never()),
            Submission::Done(Ok(_))
        ));
        assert!(
            !matches!(
                d.submit(write(512, &data[..512], false), never()),
                Submission::Done(_)
            ) || d.nowait_writes.load(Ordering::Relaxed)
        );
        // A FUA write and a flush always wait.
        assert!(matches!(
            d.submit(write(4096, &data, true), never()),
            Submission::Blocking(_)
        ));
        assert!(matches!(
            d.submit(IoRequest::Flush, never()),
            Submission::Blocking(_)
        ));
        // Just written: in the page cache, so readable without waiting,
        // into a reused buffer that held garbage, none of which comes back.
        let garbage = vec![0xee; 16384];
        let ptr = garbage.as_ptr();
        let req = IoRequest::Read {
            offset: 4096,
            len: 8192,
            buf: garbage,
        };
        let Submission::Done(Ok(back)) = d.submit(req, never()) else {
            panic!("page-cache read did not complete inline")
        };
        assert_eq!(back, data);
        assert_eq!(back.as_ptr(), ptr, "the read reused the buffer given");
        let mut again = vec![0u8; 8192];
        d.read_at(4096, &mut again).unwrap();
        assert_eq!(again, data);
    }

    #[test]
    fn roundtrip_fua_and_threads() {
        let dir = tempfile::tempdir().unwrap();
        for bs in [512u32, 4096] {
            let d = Arc::new(
                FileDevice::open(&dir.path().join(format!("l{bs}")), &opts(Some(8 << 20), bs))
                    .unwrap(),
            );
            let threads: Vec<_> = (0..4u8)
                .map(|t| {
                    let d = d.clone();
                    std::thread::spawn(move || {
                        let buf = vec![t + 1; bs as usize * 8];
                        d.write_at(u64::from(t) * (1 << 20), &buf, t % 2 == 0)
                            .unwrap();
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            d.flush().unwrap();
            for t in 0..4u8 {
                let mut back = vec![0u8; bs as usize * 8];
                d.read_at(u64::from(t) * (1 << 20), &mut back).unwrap();
                assert!(back.iter().all(|b| *b == t + 1));
            }
            d.prefetch(0, 4096).unwrap();
        }
    }

    #[test]
    fn unmap_punches_holes_and_lba_status_sees_them() {
        let dir = tempfile::tempdir().unwrap();
        let d =
            FileDevice::open(&dir.path().join("thin.img"), &opts(Some(16 << 20), 4096)).unwrap();
        assert!(d.thin_provisioned());
        assert_eq!(d.lba_status(0, 1 << 20).unwrap(), (false, 1 << 20));
        d.write_at(4 << 20, &vec![1u8; 1 << 20], false).unwrap();
        let (mapped, len) = d.lba_status(4 << 20, 8 << 20).unwrap();
        assert!(mapped);
        assert!(len >= 1 << 20 && len < 8 << 20, "{len}");
        assert_eq!(d.lba_status(0, 8 << 20).unwrap(), (false, 4 << 20));
        d.unmap(4 << 20, 1 << 20).unwrap();
        assert_eq!(d.lba_status(4 << 20, 1 << 20).unwrap(), (false, 1 << 20));
        let mut back = vec![9u8; 4096];
        d.read_at(4 << 20, &mut back).unwrap();
        assert!(back.iter().all(|b| *b == 0));
        let full = FileDevice::open(
            &dir.path().join("full.img"),
            &FileOptions {
                size: Some(4 << 20),
                block_size: 512,
                read_only: false,
                preallocate: true,
                direct: false,
                engine: IoEngine::Sync,
            },
        )
        .unwrap();
        assert!(!full.thin_provisioned());
        assert!(full.unmap(0, 4096).is_err());
    }

    #[test]
    fn read_only_refuses_writes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ro.img");
        FileDevice::open(&p, &opts(Some(1 << 20), 512)).unwrap();
        let d = FileDevice::open(
            &p,
            &FileOptions {
                size: None,
                block_size: 512,
                read_only: true,
                preallocate: false,
                direct: false,
                engine: IoEngine::Sync,
            },
        )
        .unwrap();
        assert!(d.write_at(0, &[0u8; 512], false).is_err());
        let mut b = [1u8; 512];
        d.read_at(0, &mut b).unwrap();
        assert_eq!(b, [0u8; 512]);
    }
}

#[cfg(test)]
mod direct_tests {
    use super::*;
    use crate::BlockDeviceExt;

    #[test]
    fn direct_mode_round_trips_unaligned_buffers_and_never_runs_inline() {
        let dir = tempfile::tempdir().unwrap();
        for bs in [512u32, 4096] {
            let d = FileDevice::open(
                &dir.path().join(format!("d{bs}")),
                &FileOptions {
                    size: Some(1 << 20),
                    block_size: bs,
                    read_only: false,
                    preallocate: false,
                    direct: true,
                    engine: IoEngine::Sync,
                },
            )
            .unwrap();
            assert!(d.is_direct());
            let len = 3 * bs as usize;
            // A buffer one byte into an allocation is never page-aligned.
            let mut backing = vec![0u8; len + 1];
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            backing[1..].copy_from_slice(&data);
            let unaligned = &backing[1..];
            assert_ne!(unaligned.as_ptr().align_offset(DIRECT_ALIGN), 0);
            for (off, fua) in [(u64::from(bs), false), (8 * u64::from(bs), true)] {
                d.write_at(off, unaligned, fua).unwrap();
                let mut back = vec![0u8; len + 1];
                d.read_at(off, &mut back[1..]).unwrap();
                assert_eq!(&back[1..], &data[..]);
                // Aligned buffers go straight through.
                let mut a = AlignedBuf::zeroed(len);
                d.read_at(off, a.as_mut_slice()).unwrap();
                assert_eq!(a.as_slice(), &data[..]);
            }
            // Direct I/O always waits for the device: never inline, also
            // for data the page cache would have.
            let b = vec![0u8; 4096];
            for _ in 0..2 {
                assert!(matches!(
                    d.submit(IoRequest::read(0, 4096), tests::never()),
                    Submission::Blocking(_)
                ));
                assert!(matches!(
                    d.submit(tests::write(0, &b, false), tests::never()),
                    Submission::Blocking(_)
                ));
            }
            // The blocking job reads into the buffer given (garbage) and
            // returns the medium's bytes only.
            let req = IoRequest::Read {
                offset: u64::from(bs),
                len,
                buf: vec![0xee; 3 * len],
            };
            let Submission::Blocking(job) = d.submit(req, tests::never()) else {
                panic!()
            };
            assert_eq!(job().unwrap(), data);
            d.flush().unwrap();
            assert!(d.describe().contains("O_DIRECT"));
        }
    }

    #[test]
    fn a_refused_ring_falls_back_to_sync() {
        let p = Path::new("/x");
        for errno in [libc::EPERM, libc::ENOSYS] {
            assert!(uring_or_fallback(p, || Err(io::Error::from_raw_os_error(errno))).is_none());
        }
        // A device whose ring was refused still serves I/O, blocking.
        let dir = tempfile::tempdir().unwrap();
        let mut d = FileDevice::open(
            &dir.path().join("f"),
            &FileOptions {
                size: Some(1 << 20),
                block_size: 512,
                read_only: false,
                preallocate: false,
                direct: false,
                engine: IoEngine::Uring,
            },
        )
        .unwrap();
        d.uring = uring_or_fallback(p, || Err(io::Error::from_raw_os_error(libc::EPERM)));
        assert_eq!(d.engine(), IoEngine::Sync);
        assert!(matches!(
            d.submit(IoRequest::Flush, tests::never()),
            Submission::Blocking(_)
        ));
        d.write_at(0, &[5u8; 512], true).unwrap();
        let mut b = [0u8; 512];
        d.read_at(0, &mut b).unwrap();
        assert_eq!(b, [5u8; 512]);
    }

    #[test]
    fn engine_names_parse() {
        assert_eq!("sync".parse::<IoEngine>(), Ok(IoEngine::Sync));
        assert_eq!("uring".parse::<IoEngine>(), Ok(IoEngine::Uring));
        let e = "aio".parse::<IoEngine>().unwrap_err();
        assert!(e.to_string().contains("\"sync\" or \"uring\""), "{e}");
    }
}
