//! The FUSE file system of `attach`: a root directory holding one regular
//! file, the LUN ([`LunFile`]). The session's thread only reads requests
//! from /dev/fuse; each read, write and flush runs as a task on the tokio
//! runtime and answers from there (fuser's replies are `Send`), so the
//! many requests a loop device keeps in flight go to the LUN together.

use std::ffi::{OsStr, OsString};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, WriteFlags,
};

use super::file::{Blocks, FileError, LunFile};

/// The one file's inode (the root directory is 1).
const FILE: INodeNo = INodeNo(2);

/// How long the kernel may keep names and attributes: they never change.
const TTL: Duration = Duration::from_secs(60);

/// Largest write the kernel sends in one request.
const MAX_WRITE: u32 = 1 << 20;

/// Requests the kernel keeps in flight in the background (read-ahead,
/// asynchronous direct I/O: what a loop device sends); the kernel's
/// default is 12.
const MAX_BACKGROUND: u16 = 128;

/// Who the file is shown as belonging to, and how.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner {
    /// Permission bits of the file.
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

/// The file system: one directory, one file.
#[derive(Debug)]
pub(crate) struct LunFs<D> {
    file: Arc<LunFile<D>>,
    rt: tokio::runtime::Handle,
    name: OsString,
    /// How log lines name the LUN ("LUN 0").
    what: Arc<str>,
    owner: Owner,
    block_size: u32,
    since: SystemTime,
    /// Each open handle's sample of the file's write errors
    /// ([`super::file::WriteErrors`]), by handle number.
    handles: Arc<std::sync::Mutex<std::collections::HashMap<u64, u64>>>,
    next_handle: std::sync::atomic::AtomicU64,
}

impl<D: Blocks> LunFs<D> {
    /// The file system showing `file` as `name`, its requests run on `rt`.
    pub(crate) fn new(
        file: Arc<LunFile<D>>,
        rt: tokio::runtime::Handle,
        name: &str,
        what: &str,
        owner: Owner,
    ) -> LunFs<D> {
        let block_size = u32::try_from(file.dev().block_size()).unwrap_or(4096);
        LunFs {
            file,
            rt,
            name: name.into(),
            what: what.into(),
            owner,
            block_size,
            since: SystemTime::now(),
            handles: Arc::default(),
            next_handle: std::sync::atomic::AtomicU64::new(1),
        }
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            // Nothing can be made in it; the file's own mode guards it.
            INodeNo::ROOT => (FileType::Directory, 0o755, 0, 2),
            FILE => (FileType::RegularFile, self.owner.perm, self.file.size(), 1),
            _ => return None,
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.since,
            mtime: self.since,
            ctime: self.since,
            crtime: self.since,
            kind,
            perm,
            nlink,
            uid: self.owner.uid,
            gid: self.owner.gid,
            rdev: 0,
            blksize: self.block_size.max(512),
            flags: 0,
        })
    }
}

/// The errno a failed file operation answers with; a LUN failure is
/// logged once here (the caller only sees EIO).
fn errno(e: &FileError, what: &str, op: &str, at: u64, len: usize) -> Errno {
    match e {
        FileError::Beyond { .. } => Errno::ENOSPC,
        FileError::Lun(e) => {
            tracing::error!("{what}: {op} of {len} bytes at byte {at} failed, answered EIO: {e:#}");
            Errno::EIO
        }
    }
}

/// Whether a write failed since handle `fh` last heard (and now it has).
fn write_failed_since<D: Blocks>(
    file: &LunFile<D>,
    handles: &std::sync::Mutex<std::collections::HashMap<u64, u64>>,
    fh: FileHandle,
) -> bool {
    let mut h = handles.lock().expect("not poisoned");
    let seen = h.entry(fh.0).or_insert_with(|| file.errors().sample());
    file.errors().check_and_advance(seen)
}

impl<D: Blocks> Filesystem for LunFs<D> {
    // What could hide a write error, and why none of it is on:
    // - FUSE_WRITEBACK_CACHE is not asked for, so the kernel's page cache
    //   is write-through: each write(2) (and each write a loop device
    //   sends) is a FUSE WRITE that is answered only after the LUN has
    //   answered every command of it (`write` below replies from the task
    //   that awaited the LUN), and a LUN error is that write's EIO.
    // - FUSE_ASYNC_DIO only lets the kernel send several O_DIRECT requests
    //   at once; each is still answered after the LUN did.
    // - A write whose error its writer did not pass on (a loop device's
    //   write-back under a file system) is still reported: every handle's
    //   next fsync, flush (close) and release answers EIO for writes that
    //   failed since it last heard ([`super::file::WriteErrors`]), as the
    //   kernel's errseq does for a file's write-back errors.
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Each is a wish the kernel may not grant; less is still correct.
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND / 4 * 3);
        // O_DIRECT I/O (a loop device with --direct-io=on) in several
        // requests at once instead of one after another.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.attr(FILE) {
            Some(attr) if parent == INodeNo::ROOT && name == self.name => {
                reply.entry(&TTL, &attr, Generation(0))
            }
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(attr) = self.attr(ino) else {
            return reply.error(Errno::ENOENT);
        };
        // The file is as long as the LUN: truncating it to any other size
        // (`> FILE`, `truncate -s`) is refused.
        if size.is_some_and(|s| s != attr.size) {
            return reply.error(Errno::EINVAL);
        }
        // Its owner and mode are set by attach's options.
        if mode.is_some_and(|m| m & 0o7777 != u32::from(attr.perm))
            || uid.is_some_and(|u| u != attr.uid)
            || gid.is_some_and(|g| g != attr.gid)
        {
            return reply.error(Errno::EPERM);
        }
        // Times: accepted and forgotten (`touch` works).
        reply.attr(&TTL, &attr)
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        // O_DIRECT (a loop device with --direct-io=on, dd oflag=direct):
        // past the page cache straight to the LUN.
        let how = if flags.0 & libc::O_DIRECT != 0 {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        };
        let fh = self
            .next_handle
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.handles
            .lock()
            .expect("not poisoned")
            .insert(fh, self.file.errors().sample());
        reply.opened(FileHandle(fh), how)
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if ino != FILE {
            return reply.ok();
        }
        let failed = write_failed_since(&self.file, &self.handles, fh);
        self.handles.lock().expect("not poisoned").remove(&fh.0);
        if failed {
            reply.error(Errno::EIO)
        } else {
            reply.ok()
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        let (file, what) = (self.file.clone(), self.what.clone());
        self.rt.spawn(async move {
            match file.read_at(offset, size as usize).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(&e, &what, "read", offset, size as usize)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        let (file, what) = (self.file.clone(), self.what.clone());
        let data = data.to_vec();
        self.rt.spawn(async move {
            match file.write_at(offset, &data).await {
                // At most MAX_WRITE bytes come in one request.
                Ok(n) => reply.written(u32::try_from(n).unwrap_or(u32::MAX)),
                Err(e) => reply.error(errno(&e, &what, "write", offset, data.len())),
            }
        });
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(): what was written through this file becomes durable,
        // so that a write error shows as close()'s error.
        self.fsync(req, ino, fh, false, reply)
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if ino != FILE {
            return reply.ok();
        }
        let (file, what) = (self.file.clone(), self.what.clone());
        let handles = self.handles.clone();
        self.rt.spawn(async move {
            let flushed = file.flush().await;
            // After the flush: a write that failed while it ran is told too.
            let failed = write_failed_since(&file, &handles, fh);
            match flushed {
                Err(e) => {
                    tracing::error!("{what}: cache flush failed, answered EIO: {e}");
                    reply.error(Errno::EIO)
                }
                Ok(()) if failed => {
                    tracing::error!(
                        "{what}: a write through this file failed since it was last synced, answered EIO"
                    );
                    reply.error(Errno::EIO)
                }
                Ok(()) => reply.ok(),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, OsStr::new(".")),
            (INodeNo::ROOT, FileType::Directory, OsStr::new("..")),
            (FILE, FileType::RegularFile, self.name.as_os_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // Every byte of a LUN is there already: reserving space inside the
        // file is done. Zeroing a range (ZERO_RANGE: a loop device's WRITE
        // ZEROES with NOUNMAP) is WRITE SAME of zeros; punching a hole
        // (PUNCH_HOLE: its DISCARD and WRITE ZEROES) is the same with
        // UNMAP where the LUN reads unmapped blocks as zeros. The file
        // never grows.
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        let size = self.file.size();
        let inside = offset.checked_add(length).is_some_and(|end| end <= size);
        let zero = match (ino, mode) {
            (FILE, 0 | KEEP) if inside => return reply.ok(),
            (FILE, 0) => return reply.error(Errno::EFBIG),
            (FILE, m) if m == libc::FALLOC_FL_PUNCH_HOLE | KEEP => true,
            (FILE, m) if m == libc::FALLOC_FL_ZERO_RANGE | KEEP => false,
            (FILE, libc::FALLOC_FL_ZERO_RANGE) if inside => false,
            (FILE, libc::FALLOC_FL_ZERO_RANGE) => return reply.error(Errno::EFBIG),
            _ => return reply.error(Errno::from_i32(libc::EOPNOTSUPP)),
        };
        let (file, what) = (self.file.clone(), self.what.clone());
        self.rt.spawn(async move {
            match file.zero_range(offset, length, zero).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e, &what, "zeroing", offset, length as usize)),
            }
        });
    }

    // No extended attributes (ENOSYS: the kernel stops asking).
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS)
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::ENOSYS)
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS)
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bs = u64::from(self.block_size.max(512));
        reply.statfs(self.file.size() / bs, 0, 0, 1, 0, bs as u32, 255, bs as u32)
    }
}
