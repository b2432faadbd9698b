//! Opening a file or block device as a [`FileDevice`]: the checks that
//! change nothing (`serve --check`), creation (sparse or preallocated,
//! never truncating, undone when a later step fails), the store lock, the
//! descriptors and the engine.

use super::*;

/// Set up io_uring with `setup`; when the kernel refuses it (EPERM with
/// `kernel.io_uring_disabled`, ENOSYS without io_uring, ENOMEM under a
/// low memlock limit...) warn and go on with the sync engine (`None`).
pub(super) fn uring_or_fallback(
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

pub(super) fn block_device_size(file: &File) -> io::Result<u64> {
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
        // Read-ahead only where this process alone changes the store.
        // One per store, through its lock: a device replacing this one in
        // a reload shares it.
        let readahead = lock
            .as_ref()
            .filter(|l| {
                direct.is_some() && uring.is_some() && l.mode() == crate::lock::LockMode::Exclusive
            })
            .map(|l| l.readahead());
        Ok(FileDevice {
            file,
            direct,
            uring,
            readahead,
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
            bounced: Arc::new(AtomicU64::new(0)),
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
}
