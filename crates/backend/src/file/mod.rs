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
//!   page-aligned are bounced through an [`AlignedBuf`](crate::aligned::AlignedBuf); a transfer the
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
use crate::uring::UringEngine;
use crate::{BackendError, BlockDevice, IoCompletion, IoRequest, Submission};

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
    /// The lock on the store while this device exports it (see
    /// [`crate::lock`]); `None` when opened without one.
    lock: Option<Arc<StoreLock>>,
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

/// Undo what opening did to a file when it fails afterwards: remove a file
/// it created, or give an existing one back its length.
fn undo_create(path: &Path, file: &File, existed: bool, old_len: u64) {
    let undone = if existed {
        file.set_len(old_len)
    } else {
        std::fs::remove_file(path)
    };
    if let Err(e) = undone {
        tracing::warn!(
            "could not undo the partial creation of {}: {e}",
            path.display()
        );
    }
}

/// Warn when a thin file provisions more than its filesystem can still
/// hold: writes to blocks past the free space will fail.
fn warn_if_overcommitted(path: &Path, file: &File, size: u64) {
    let allocated = file
        .metadata()
        .map_or(0, |m| std::os::unix::fs::MetadataExt::blocks(&m) * 512);
    let Some(free) = free_bytes(file) else {
        return;
    };
    let needed = size.saturating_sub(allocated);
    if needed > free {
        tracing::warn!(
            "{} is {} but its filesystem has only {} free: writes beyond that will fail (the initiator sees SPACE ALLOCATION FAILED); free space or give a smaller size",
            path.display(),
            human_bytes(size),
            human_bytes(free)
        );
    }
}

/// Bytes an unprivileged writer may still allocate on `file`'s filesystem.
fn free_bytes(file: &File) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: the fd is open and `st` is a valid place for one statvfs;
    // it is read only when the call succeeds, which fills it in.
    let rc = unsafe { libc::fstatvfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: fstatvfs returned 0, so it initialised `st`.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// A byte count for people: `1 GiB`, `16 MiB`, `1.5 GiB`, `512 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The checks that need no change to the filesystem: the options, and
/// for a file that does not exist, whether it may and can be created.
/// Returns whether it exists.
fn preflight(path: &Path, opts: &FileOptions) -> Result<bool, BackendError> {
    let open_err = |source| BackendError::Open {
        path: path.display().to_string(),
        cause: source,
    };
    let bs = opts.block_size;
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
                "it does not exist, and a read-only LUN's file is not created",
            )));
        }
        if opts.size.is_none() {
            return Err(BackendError::Config(format!(
                "{p} does not exist; give a size to create it ({p}:1G on the command line, size = \"1G\" in a config file)",
                p = path.display()
            )));
        }
        // A typing mistake in a directory name must not quietly make a
        // tree of directories and a blank disk.
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            if !parent.is_dir() {
                return Err(open_err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "the directory {} does not exist; create it first or choose another path",
                        parent.display()
                    ),
                )));
            }
        }
    }
    Ok(exists)
}

/// The error for a size that would cut an existing file short.
fn would_truncate(path: &Path, current: u64, size: u64) -> BackendError {
    BackendError::Config(format!(
        "{} is {current} bytes, larger than the size {size} given; refusing to truncate it",
        path.display()
    ))
}

impl FileDevice {
    /// Open (or create) the backing store at `path`, taking no lock on it.
    pub fn open(path: &Path, opts: &FileOptions) -> Result<FileDevice, BackendError> {
        FileDevice::open_locked(path, opts, Locking::None)
    }

    /// Open (or create) the backing store at `path` and lock it as
    /// `locking` says (see [`crate::lock`]) before anything about it is
    /// changed (its size): a store another exporter holds is refused with
    /// [`BackendError::InUse`]. The lock lasts as long as the device.
    pub fn open_locked(
        path: &Path,
        opts: &FileOptions,
        locking: Locking,
    ) -> Result<FileDevice, BackendError> {
        let bs = opts.block_size;
        let open_err = |source| BackendError::Open {
            path: path.display().to_string(),
            cause: source,
        };
        let exists = preflight(path, opts)?;
        let file = OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .create(!opts.read_only && !exists)
            .open(path)
            .map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        let lock = match locking {
            Locking::None => None,
            Locking::Inherit(l) if l.locks(&meta) => Some(l),
            Locking::Take(mode) => Some(Self::lock(path, &file, mode)?),
            Locking::Inherit(l) => Some(Self::lock(path, &file, l.mode())?),
        };
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
                Some(s) if s < current && exists => return Err(would_truncate(path, current, s)),
                Some(s) if s > current => {
                    if opts.read_only {
                        return Err(BackendError::Config(format!(
                            "cannot grow read-only {}",
                            path.display()
                        )));
                    }
                    // Extending with set_len leaves a hole: the file stays sparse.
                    if let Err(e) = file.set_len(s) {
                        undo_create(path, &file, exists, current);
                        return Err(open_err(e));
                    }
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
                let e = io::Error::last_os_error();
                // A file too large for its filesystem is not left behind
                // half-allocated (nor an existing one grown).
                undo_create(path, &file, exists, meta.len());
                return Err(open_err(e));
            }
        }
        let thin = !is_block_device && !opts.preallocate;
        if !exists {
            tracing::info!(
                "created {}, {}, {}",
                std::path::absolute(path)
                    .unwrap_or_else(|_| path.to_path_buf())
                    .display(),
                human_bytes(size),
                if thin { "sparse" } else { "allocated" }
            );
        }
        if thin && !opts.read_only {
            warn_if_overcommitted(path, &file, size);
        }
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
            lock,
        })
    }

    /// Lock the store just opened. A file this open seemed to create and
    /// that is locked already was created by the holder in the meantime:
    /// it is left alone.
    fn lock(
        path: &Path,
        file: &File,
        mode: crate::lock::LockMode,
    ) -> Result<Arc<StoreLock>, BackendError> {
        StoreLock::acquire(file, path, mode).map(Arc::new)
    }

    /// Check that [`FileDevice::open`] would succeed, changing nothing:
    /// a missing file is not created, an existing one is opened (for
    /// writing too unless read-only) and its size compared. Returns a
    /// description for people (`disk.img, 1 GiB, exists`).
    pub fn check(path: &Path, opts: &FileOptions) -> Result<String, BackendError> {
        let exists = preflight(path, opts)?;
        let kind = if opts.preallocate {
            "allocated"
        } else {
            "sparse"
        };
        if !exists {
            let size = opts.size.unwrap_or(0);
            return Ok(format!(
                "{}, {}, will be created {kind}",
                path.display(),
                human_bytes(size)
            ));
        }
        let open_err = |source| BackendError::Open {
            path: path.display().to_string(),
            cause: source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .open(path)
            .map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        let current = if meta.file_type().is_block_device() {
            let dev = block_device_size(&file).map_err(open_err)?;
            if let Some(s) = opts.size.filter(|s| *s > dev) {
                return Err(BackendError::Config(format!(
                    "size {s} exceeds the block device's {dev} bytes"
                )));
            }
            dev
        } else {
            meta.len()
        };
        let size = match opts.size {
            Some(s) if s < current && !meta.file_type().is_block_device() => {
                return Err(would_truncate(path, current, s))
            }
            Some(s) if s > current && opts.read_only => {
                return Err(BackendError::Config(format!(
                    "cannot grow read-only {}",
                    path.display()
                )))
            }
            Some(s) => s,
            None => current,
        };
        if size < u64::from(opts.block_size) {
            return Err(BackendError::Config(format!(
                "{} is smaller than one block",
                path.display()
            )));
        }
        Ok(format!(
            "{}, {}, exists{}",
            path.display(),
            human_bytes(size),
            if opts.read_only { ", read-only" } else { "" }
        ))
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
                cause: io::Error::from_raw_os_error(rc),
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

mod sync;
#[cfg(test)]
mod tests;

use sync::SyncIo;
