//! Advisory locks on backing stores: one store, one exporter.
//!
//! Two servers exporting one file (or two LUNs of one server) each keep
//! their own page of the truth: write cache state, reservations, unit
//! attentions, the identity they read at start. Initiators that reach the
//! same blocks through both see a disk that forgets reservations and
//! reorders writes: the classic way to corrupt a file system. So a file or
//! block device is locked while it is exported, and a second exporter is
//! refused with the process that holds it.
//!
//! The lock is a BSD `flock(2)` lock (std's [`File::try_lock`]) on the
//! store's open file description, chosen over the alternatives because:
//!
//! - it conflicts between two open file descriptions even in one process,
//!   so a second LUN of the same server on the same file is refused too
//!   (POSIX record locks belong to the process, never conflict within it,
//!   and are dropped when any descriptor of the file is closed);
//! - it is held by the descriptor, so a crashed server leaves no stale lock
//!   file to clean up by hand;
//! - the kernel lists it in `/proc/locks` with the pid of the process that
//!   took it, which names the holder in the refusal (open file description
//!   locks show pid -1 there and in `F_OFD_GETLK`).
//!
//! A store exported on purpose by several servers (a cluster file system
//! whose users coordinate among themselves) takes a shared lock instead:
//! shared exporters admit each other, and an exclusive one is refused while
//! any shared one holds it, and the other way round.
//!
//! The lock covers the store's side files too (its identity `<store>.id`,
//! its persistent reservations `<store>.pr`, a block device's identity file
//! under the data directory): they are named after the store and written
//! only by its exporter. They are replaced atomically (a new file renamed
//! over), so a lock on the side files themselves would not outlive their
//! first update.
//!
//! It is advisory: it keeps out other ethersan servers and programs that
//! take `flock` locks (on block devices, udev's probing, which waits until
//! the exporter closes the device), not a program that ignores it.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::BackendError;

/// How a store is locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockMode {
    /// This exporter alone (the default).
    #[default]
    Exclusive,
    /// Shared with other exporters that lock it shared (`shared = true`).
    Shared,
}

/// What to do about a store's lock when opening it.
#[derive(Debug, Clone, Default)]
pub enum Locking {
    /// Take no lock (tools and tests that open a store for a moment).
    #[default]
    None,
    /// Lock it in this mode, or refuse to open it.
    Take(LockMode),
    /// Keep this lock, taken by a device that is being replaced by the one
    /// opened now (a reload that changes a LUN's options): the store stays
    /// locked throughout. A lock on another file is not taken over; the
    /// store is then locked anew, in the same mode.
    Inherit(std::sync::Arc<StoreLock>),
}

/// A lock held on a store; released when dropped (with every device that
/// holds it).
#[derive(Debug)]
pub struct StoreLock {
    /// A descriptor sharing the store's open file description: the lock
    /// belongs to that description and lasts while either is open.
    _file: File,
    mode: LockMode,
    dev: u64,
    ino: u64,
    /// The store's read-ahead, shared by every device that holds this
    /// lock (a LUN and the one replacing it in a reload), so that a write
    /// through either drops the predictions of both.
    readahead: std::sync::OnceLock<std::sync::Arc<crate::readahead::ReadAhead>>,
}

impl StoreLock {
    /// Lock `file`, the store opened from `path`, in `mode`; refused with
    /// [`BackendError::InUse`], naming the holder, when another exporter
    /// holds it in a mode that conflicts.
    pub fn acquire(file: &File, path: &Path, mode: LockMode) -> Result<StoreLock, BackendError> {
        let open_err = |cause| BackendError::Open {
            path: path.display().to_string(),
            cause,
        };
        let meta = file.metadata().map_err(open_err)?;
        let dup = file.try_clone().map_err(open_err)?;
        let tried = match mode {
            LockMode::Exclusive => dup.try_lock(),
            LockMode::Shared => dup.try_lock_shared(),
        };
        match tried {
            Ok(()) => Ok(StoreLock {
                _file: dup,
                mode,
                dev: meta.dev(),
                ino: meta.ino(),
                readahead: Default::default(),
            }),
            Err(std::fs::TryLockError::WouldBlock) => {
                Err(in_use(path, meta.dev(), meta.ino(), mode))
            }
            Err(std::fs::TryLockError::Error(e)) => Err(open_err(e)),
        }
    }

    /// This lock in `mode` instead (a LUN replaced by one that is now
    /// read-only, or no longer): converted on the same open file
    /// description, so it is never free for another exporter in between
    /// when the conversion succeeds. When it fails (another exporter holds
    /// the store shared and this one wants it alone), Linux has dropped the
    /// old lock already; it is taken again in its old mode.
    pub fn convert(&self, path: &Path, mode: LockMode) -> Result<StoreLock, BackendError> {
        let dup = self._file.try_clone().map_err(|cause| BackendError::Open {
            path: path.display().to_string(),
            cause,
        })?;
        let take = |m: LockMode| match m {
            LockMode::Exclusive => dup.try_lock(),
            LockMode::Shared => dup.try_lock_shared(),
        };
        match take(mode) {
            Ok(()) => Ok(StoreLock {
                _file: dup,
                mode,
                dev: self.dev,
                ino: self.ino,
                readahead: Default::default(),
            }),
            Err(e) => {
                let _ = take(self.mode);
                Err(match e {
                    std::fs::TryLockError::WouldBlock => in_use(path, self.dev, self.ino, mode),
                    std::fs::TryLockError::Error(cause) => BackendError::Open {
                        path: path.display().to_string(),
                        cause,
                    },
                })
            }
        }
    }

    /// The store's read-ahead (made on first use).
    pub(crate) fn readahead(&self) -> std::sync::Arc<crate::readahead::ReadAhead> {
        self.readahead.get_or_init(Default::default).clone()
    }

    /// The mode it is held in.
    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// Whether it locks the file `meta` describes.
    pub fn locks(&self, meta: &std::fs::Metadata) -> bool {
        self.dev == meta.dev() && self.ino == meta.ino()
    }
}

/// The refusal of `mode` on the store at `path` (device `dev`, inode
/// `ino`), naming the holder from `/proc/locks`.
fn in_use(path: &Path, dev: u64, ino: u64, mode: LockMode) -> BackendError {
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    BackendError::InUse {
        path: path.display().to_string(),
        holder: holder_of(&locks, dev, ino, std::process::id()),
        wanted: mode,
    }
}

/// Who holds a store's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// This process: another LUN of this server.
    ThisProcess,
    /// Another process.
    Process {
        /// Its pid.
        pid: u32,
        /// Its command line, shortened (empty when it cannot be read).
        command: String,
        /// The mode it holds the lock in.
        mode: LockMode,
    },
    /// A process this one cannot see (another PID namespace), or none
    /// listed.
    Unknown,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::ThisProcess => f.write_str("another LUN of this server"),
            Holder::Process { pid, command, mode } => {
                write!(f, "process {pid}")?;
                if !command.is_empty() {
                    write!(f, " ({command})")?;
                }
                if *mode == LockMode::Shared {
                    f.write_str(", shared")?;
                }
                Ok(())
            }
            Holder::Unknown => f.write_str("another process (not visible from here)"),
        }
    }
}

/// The holder of the `flock` lock on device `dev`, inode `ino`, as the
/// text of `/proc/locks` lists it (lines such as
/// `1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF`); `me` is this
/// process's pid.
pub fn holder_of(proc_locks: &str, dev: u64, ino: u64, me: u32) -> Holder {
    let (major, minor) = (dev_major(dev), dev_minor(dev));
    for line in proc_locks.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Waiters are listed as "1: -> FLOCK ..."; only holders count.
        if f.len() < 6 || f[1] != "FLOCK" {
            continue;
        }
        let mut id = f[5].split(':');
        let (Some(ma), Some(mi), Some(i)) = (id.next(), id.next(), id.next()) else {
            continue;
        };
        let same = u64::from_str_radix(ma, 16).ok() == Some(major)
            && u64::from_str_radix(mi, 16).ok() == Some(minor)
            && i.parse::<u64>().ok() == Some(ino);
        if !same {
            continue;
        }
        let mode = if f[3] == "READ" {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        };
        return match f[4].parse::<u32>() {
            Ok(pid) if pid == me => Holder::ThisProcess,
            Ok(pid) if pid > 0 => Holder::Process {
                pid,
                command: command_of(pid),
                mode,
            },
            _ => Holder::Unknown,
        };
    }
    Holder::Unknown
}

/// The command line of process `pid`, its arguments joined by spaces and
/// cut at 120 characters.
fn command_of(pid: u32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut s = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ");
    if s.chars().count() > 120 {
        s = s.chars().take(117).collect::<String>() + "...";
    }
    s
}

/// glibc's `major()`: the device number's major part.
fn dev_major(dev: u64) -> u64 {
    ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff)
}

/// glibc's `minor()`: the device number's minor part.
fn dev_minor(dev: u64) -> u64 {
    (dev & 0xff) | ((dev >> 12) & !0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("ethersan-lock-{name}-{}", std::process::id()));
        std::fs::write(&p, [0u8; 4096]).unwrap();
        p
    }

    #[test]
    fn a_second_exclusive_lock_is_refused_naming_this_process() {
        let p = scratch("twice");
        let a = File::options().read(true).write(true).open(&p).unwrap();
        let b = File::options().read(true).write(true).open(&p).unwrap();
        let held = StoreLock::acquire(&a, &p, LockMode::Exclusive).unwrap();
        match StoreLock::acquire(&b, &p, LockMode::Exclusive) {
            Err(BackendError::InUse { holder, .. }) => assert_eq!(holder, Holder::ThisProcess),
            other => panic!("expected InUse, got {other:?}"),
        }
        // Shared is refused too while an exclusive lock is held.
        assert!(StoreLock::acquire(&b, &p, LockMode::Shared).is_err());
        // Released once the store's descriptor closes too (the lock belongs
        // to its open file description): the other descriptor gets it now.
        drop((held, a));
        StoreLock::acquire(&b, &p, LockMode::Exclusive).unwrap();
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn shared_locks_admit_each_other_but_not_an_exclusive_one() {
        let p = scratch("shared");
        let open = || File::open(&p).unwrap();
        let (a, b, c) = (open(), open(), open());
        let _x = StoreLock::acquire(&a, &p, LockMode::Shared).unwrap();
        let _y = StoreLock::acquire(&b, &p, LockMode::Shared).unwrap();
        assert!(matches!(
            StoreLock::acquire(&c, &p, LockMode::Exclusive),
            Err(BackendError::InUse { .. })
        ));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_lock_converts_in_place_and_keeps_its_mode_when_it_cannot() {
        let p = scratch("convert");
        let open = || File::open(&p).unwrap();
        let (a, b) = (open(), open());
        let shared = StoreLock::acquire(&a, &p, LockMode::Shared).unwrap();
        let alone = shared.convert(&p, LockMode::Exclusive).unwrap();
        assert_eq!(alone.mode(), LockMode::Exclusive);
        assert!(StoreLock::acquire(&b, &p, LockMode::Shared).is_err());
        let back = alone.convert(&p, LockMode::Shared).unwrap();
        assert_eq!(back.mode(), LockMode::Shared);
        drop((shared, alone));
        // Another shared holder: the conversion is refused, and the
        // shared lock is still held (an exclusive one is still refused).
        let other = StoreLock::acquire(&b, &p, LockMode::Shared).unwrap();
        assert!(back.convert(&p, LockMode::Exclusive).is_err());
        drop((other, b));
        let c = open();
        assert!(StoreLock::acquire(&c, &p, LockMode::Exclusive).is_err());
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn the_holder_is_read_from_proc_locks() {
        // 08:01 is device 8,1 (sda1); 0x10300 is 259,0 (nvme0n1).
        let dev = (8 << 8) | 1;
        let text = "1: POSIX  ADVISORY  WRITE 77 08:01:42 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 4242 08:01:43 0 EOF\n\
                    3: FLOCK  ADVISORY  READ 99 08:01:42 0 EOF\n\
                    3: -> FLOCK  ADVISORY  WRITE 100 08:01:42 0 EOF\n";
        match holder_of(text, dev, 42, 1) {
            Holder::Process { pid, mode, .. } => {
                assert_eq!((pid, mode), (99, LockMode::Shared))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(holder_of(text, dev, 42, 99), Holder::ThisProcess);
        assert_eq!(holder_of(text, dev, 44, 1), Holder::Unknown);
        // 259 fits in the low 12 bits of the major: no high part.
        let nvme = 259u64 << 8;
        let text = "5: FLOCK  ADVISORY  WRITE 0 103:00:7 0 EOF\n";
        assert_eq!(
            holder_of(text, nvme, 7, 1),
            Holder::Unknown,
            "pid 0: not visible"
        );
    }
}
