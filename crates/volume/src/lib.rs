//! A block volume: what every block protocol (SCSI for iSCSI, ATA for AoE,
//! later NVMe) needs of a store, without any protocol in it.
//!
//! A [`Volume`] sits over one I/O engine ([`BlockDevice`]) and adds:
//! - LBA-range checking in blocks ([`Volume::check_range`]);
//! - the write-cache policy: with the write cache off every write is FUA
//!   ([`Volume::set_write_cache`], [`Volume::effective_fua`]); a cache
//!   flush (SYNCHRONIZE CACHE, ATA FLUSH CACHE) is [`Volume::flush`];
//! - byte-range locks ([`RangeLocks`]): every write holds its range shared
//!   until it completes, read-modify-write commands (COMPARE AND WRITE,
//!   ORWRITE, WRITE ATOMIC) hold it exclusive;
//! - the data path: [`Volume::read`], [`Volume::write`], [`Volume::flush`],
//!   each one engine submission answered "done now" or "pending" (or
//!   "blocking job", see [`Submission`]) with owned buffers;
//! - the classification of engine errors ([`MediumError`]) that each
//!   protocol turns into its own status (SCSI sense, ATA error bits).
#![warn(missing_docs, unreachable_pub)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use ethersan_backend::{
    submit_and_wait, BackendError, BlockDevice, BlockingIo, IoBuf, IoCompletion, IoRequest,
    IoResult, Submission,
};

mod range_lock;
pub use range_lock::{OwnedRangeGuard, RangeLocks, StripeGuard};

/// Requests a volume refuses before any I/O.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    /// The blocks lie (partly) beyond the end of the volume.
    #[error("blocks {lba}+{blocks} lie beyond the end of the volume ({capacity} blocks)")]
    OutOfRange {
        /// First block asked for.
        lba: u64,
        /// Blocks asked for.
        blocks: u64,
        /// The volume's size in blocks.
        capacity: u64,
    },
    /// Fewer bytes of data than the blocks to write.
    #[error("{have} bytes of data for a write of {need} bytes")]
    ShortData {
        /// Bytes given.
        have: usize,
        /// Bytes the blocks need.
        need: u64,
    },
}

/// What a failed engine request means to an initiator, whatever the
/// protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediumError {
    /// Unrecovered read error (EIO and the like on a read).
    Read,
    /// Write error (EIO and the like on a write or flush).
    Write,
    /// The store ran out of space (ENOSPC on a thin volume).
    NoSpace,
    /// The store did not answer within its bound or cannot be reached
    /// (ETIMEDOUT, ESHUTDOWN, ENOTCONN, ECONNREFUSED, EHOSTUNREACH: a
    /// cluster that is not answering). Nothing is known about the medium:
    /// the command may succeed if retried, possibly on another path.
    Unavailable,
}

impl MediumError {
    /// Classify an engine error of a read (`write` false) or of a write or
    /// flush (`write` true).
    pub fn of(e: &BackendError, write: bool) -> MediumError {
        let errno = match e {
            BackendError::Read { cause, .. }
            | BackendError::Write { cause, .. }
            | BackendError::Flush(cause) => cause.raw_os_error(),
            _ => None,
        };
        if errno.is_some_and(|n| UNAVAILABLE_ERRNOS.contains(&n)) {
            return MediumError::Unavailable;
        }
        match e {
            BackendError::Write { cause: source, .. }
                if source.raw_os_error() == Some(libc_enospc()) =>
            {
                MediumError::NoSpace
            }
            _ if write => MediumError::Write,
            _ => MediumError::Read,
        }
    }
}

/// ETIMEDOUT, ESHUTDOWN, ENOTCONN, ECONNREFUSED, EHOSTUNREACH on Linux
/// (x86, ARM and most others share these generic values).
const UNAVAILABLE_ERRNOS: [i32; 5] = [110, 108, 107, 111, 113];

/// ENOSPC (the same on every Linux architecture).
const fn libc_enospc() -> i32 {
    28
}

/// A block volume over one engine (see the crate documentation).
#[derive(Debug)]
pub struct Volume {
    dev: Arc<dyn BlockDevice>,
    ranges: Arc<RangeLocks>,
    wce: AtomicBool,
}

impl Volume {
    /// A volume over `dev` with the write cache on or off.
    pub fn new(dev: Arc<dyn BlockDevice>, write_cache: bool) -> Volume {
        Volume {
            dev,
            ranges: Arc::new(RangeLocks::new()),
            wce: AtomicBool::new(write_cache),
        }
    }

    /// The engine.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.dev.block_size()
    }

    /// Size in blocks.
    pub fn num_blocks(&self) -> u64 {
        self.dev.num_blocks()
    }

    /// The range locks, for commands that read, modify and write.
    pub fn ranges(&self) -> &RangeLocks {
        &self.ranges
    }

    /// Whether the write cache is on (SCSI Caching page WCE).
    pub fn write_cache(&self) -> bool {
        self.wce.load(Ordering::Relaxed)
    }

    /// Turn the write cache on or off.
    pub fn set_write_cache(&self, on: bool) {
        self.wce.store(on, Ordering::Relaxed);
    }

    /// Whether a write must be durable when it completes: FUA asked for
    /// it, or the write cache is off.
    pub fn effective_fua(&self, fua: bool) -> bool {
        fua || !self.write_cache()
    }

    /// Check that `blocks` blocks from `lba` lie on the volume; returns
    /// their byte offset and length.
    pub fn check_range(&self, lba: u64, blocks: u64) -> Result<(u64, u64), VolumeError> {
        let capacity = self.num_blocks();
        let bs = u64::from(self.block_size());
        match lba.checked_add(blocks) {
            Some(end) if end <= capacity => Ok((lba * bs, blocks * bs)),
            _ => Err(VolumeError::OutOfRange {
                lba,
                blocks,
                capacity,
            }),
        }
    }

    /// Read `blocks` blocks from `lba` into `buf` (an allocation to reuse;
    /// its contents are never returned; `IoBuf::new()` lets the engine
    /// allocate, aligned where the engine needs it). The data comes back
    /// where the engine put it, exactly the blocks asked for. `done` is
    /// called iff the answer is [`Submission::Pending`].
    pub fn read(
        &self,
        lba: u64,
        blocks: u64,
        buf: IoBuf,
        done: IoCompletion,
    ) -> Result<Submission, VolumeError> {
        let (offset, len) = self.check_range(lba, blocks)?;
        Ok(self.dev.submit(
            IoRequest::Read {
                offset,
                len: len as usize,
                buf,
            },
            done,
        ))
    }

    /// Write the first `blocks` blocks of `data` at `lba`, durable on
    /// completion with `fua` or with the write cache off (data in an
    /// aligned [`IoBuf`] reaches an `O_DIRECT` store without a copy). The
    /// range is held
    /// shared until the write completes; when a read-modify-write command
    /// holds it exclusive the answer is a [`Submission::Blocking`] job that
    /// waits for it. `done` is called iff the answer is
    /// [`Submission::Pending`].
    pub fn write(
        &self,
        lba: u64,
        blocks: u64,
        data: IoBuf,
        fua: bool,
        done: IoCompletion,
    ) -> Result<Submission, VolumeError> {
        let Some((offset, len, req)) = self.write_request(lba, blocks, data, fua)? else {
            return Ok(Submission::Done(Ok(IoBuf::new())));
        };
        let Some(guard) = self.ranges.try_lock_shared_owned(offset, len) else {
            let dev = self.dev.clone();
            let ranges = self.ranges.clone();
            return Ok(Submission::Blocking(Box::new(move || {
                let _held = ranges.lock(offset, len, false);
                submit_and_wait(&*dev, req)
            })));
        };
        // Held by whichever of the completion (pending) and the job
        // (blocking) runs the I/O; released here when it finished inline.
        let guard = Arc::new(guard);
        let in_completion = guard.clone();
        let sub = self.dev.submit(
            req,
            Box::new(move |r| {
                drop(in_completion);
                done(r)
            }),
        );
        Ok(match sub {
            Submission::Blocking(job) => Submission::Blocking(Box::new(move || {
                let _held = guard;
                job()
            })),
            other => other,
        })
    }

    /// Write the first `blocks` blocks of `data` at `lba` as [`write`]
    /// does (FUA or the write cache off: durable on completion), within a
    /// range the caller already holds shared for a larger command (from
    /// [`RangeLocks::try_lock_shared_owned`] on [`ranges`], kept until
    /// this write completes): no lock is taken here, so a read-modify-write command waiting for the range
    /// cannot stall the rest of a command that holds it. `done` is called
    /// iff the answer is [`Submission::Pending`].
    ///
    /// [`write`]: Self::write
    /// [`ranges`]: Self::ranges
    pub fn write_held(
        &self,
        lba: u64,
        blocks: u64,
        data: IoBuf,
        fua: bool,
        done: IoCompletion,
    ) -> Result<Submission, VolumeError> {
        match self.write_request(lba, blocks, data, fua)? {
            Some((_, _, req)) => Ok(self.dev.submit(req, done)),
            None => Ok(Submission::Done(Ok(IoBuf::new()))),
        }
    }

    /// The engine request of a write (range and data checked, FUA as the
    /// write cache says) with its byte offset and length; `None` for no
    /// blocks.
    fn write_request(
        &self,
        lba: u64,
        blocks: u64,
        data: IoBuf,
        fua: bool,
    ) -> Result<Option<(u64, u64, IoRequest)>, VolumeError> {
        let (offset, len) = self.check_range(lba, blocks)?;
        if (data.len() as u64) < len {
            return Err(VolumeError::ShortData {
                have: data.len(),
                need: len,
            });
        }
        if len == 0 {
            return Ok(None);
        }
        let req = IoRequest::Write {
            offset,
            data,
            len: len as usize,
            fua: self.effective_fua(fua),
        };
        Ok(Some((offset, len, req)))
    }

    /// Make every completed write durable. `done` is called iff the answer
    /// is [`Submission::Pending`].
    pub fn flush(&self, done: IoCompletion) -> Submission {
        self.dev.submit(IoRequest::Flush, done)
    }
}

#[cfg(test)]
mod tests;
