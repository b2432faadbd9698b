//! The sync engine's blocking half: `pread`/`pwrite` (`pwritev2(RWF_DSYNC)`
//! for FUA, `fdatasync` for a flush), run by the caller of
//! [`BlockDevice::submit`](crate::BlockDevice::submit) as a
//! [`Submission::Blocking`](crate::Submission::Blocking) job.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::fill::read_fill;
use crate::{BackendError, IoBuf, IoResult};

use super::FileDevice;

/// The sync engine's blocking I/O (run by the caller of
/// [`BlockDevice::submit`] as a [`Submission::Blocking`] job).
#[derive(Debug, Clone)]
pub(super) struct SyncIo {
    pub(super) file: Arc<File>,
    pub(super) direct: Option<Arc<File>>,
    /// Bytes of unaligned writes copied to aligned memory for `direct`.
    pub(super) bounced: Arc<AtomicU64>,
}

impl SyncIo {
    /// Read `len` bytes at `offset` into `buf` (which may hold the first
    /// bytes already, from an inline attempt, when there is no direct
    /// descriptor).
    pub(super) fn read(&self, offset: u64, mut buf: IoBuf, len: usize) -> IoResult {
        let err = |source| BackendError::Read {
            offset,
            cause: source,
        };
        if let Some(d) = &self.direct {
            // Into an aligned spot of the same allocation, where the data
            // stays: no bounce, no move.
            let skip = buf.reserve_aligned(len);
            match read_fill(d, offset, buf.raw_mut(), skip, len, false) {
                Ok(_) => return Ok(buf),
                // The device refuses this alignment: use the page cache.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => buf.reserve_plain(len),
                Err(e) => return Err(err(e)),
            }
        }
        // A sparse region reads as zeros.
        let skip = buf.start();
        read_fill(&self.file, offset, buf.raw_mut(), skip, len, false).map_err(err)?;
        Ok(buf)
    }

    /// Write `buf` at `offset` (through the direct descriptor when there is
    /// one, bouncing unaligned memory).
    pub(super) fn write(&self, offset: u64, buf: &[u8], fua: bool) -> IoResult {
        let err = |source| BackendError::Write {
            offset,
            cause: source,
        };
        if let Some(d) = &self.direct {
            let bounce;
            let data = if buf.as_ptr().align_offset(crate::aligned::DIRECT_ALIGN) == 0 {
                buf
            } else {
                self.bounced.fetch_add(buf.len() as u64, Ordering::Relaxed);
                bounce = IoBuf::aligned_copy_of(buf);
                &bounce[..]
            };
            let r = if fua {
                FileDevice::write_dsync(d, offset, data)
            } else {
                d.write_all_at(data, offset)
            };
            match r {
                Ok(()) => return Ok(IoBuf::new()),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(err(e)),
            }
        }
        let r = if fua {
            FileDevice::write_dsync(&self.file, offset, buf)
        } else {
            self.file.write_all_at(buf, offset)
        };
        r.map(|()| IoBuf::new()).map_err(err)
    }

    pub(super) fn flush(&self) -> IoResult {
        self.file
            .sync_data()
            .map(|()| IoBuf::new())
            .map_err(BackendError::Flush)
    }
}

impl FileDevice {
    pub(super) fn write_dsync(file: &File, offset: u64, buf: &[u8]) -> io::Result<()> {
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
