//! Storage backends for ethersan logical units.
//!
//! The SCSI layer sees storage only through [`BlockDevice`]: a flat array of
//! bytes with a logical block size, read and written at byte offsets that are
//! always multiples of the block size. Implementations: regular files and
//! block devices ([`file::FileDevice`]) and memory ([`ram::RamDevice`]).
//!
//! A file or block device can use one of two I/O engines
//! ([`file::IoEngine`]): blocking `pread`/`pwrite` (the caller runs them on
//! threads), or io_uring ([`uring::UringEngine`]), which takes READ, WRITE
//! and flush requests with owned buffers through [`AsyncIo`] and completes
//! them from one ring thread per device, without a thread per I/O. Either
//! can open the store with `O_DIRECT` ([`aligned`] provides the aligned
//! buffers that needs).
#![warn(missing_docs, unreachable_pub)]

use std::io;

pub mod aligned;
pub mod file;
pub mod ram;
pub mod uring;

/// One request to an asynchronous engine ([`AsyncIo`]); buffers are owned,
/// so they stay alive until the kernel is done with them.
#[derive(Debug)]
pub enum IoRequest {
    /// Read `len` bytes at byte `offset`.
    Read {
        /// Byte offset.
        offset: u64,
        /// Bytes to read.
        len: usize,
    },
    /// Write `data[..len]` at byte `offset`; with `fua` the data is on
    /// stable storage when the request completes.
    Write {
        /// Byte offset.
        offset: u64,
        /// The data (may be longer than `len`).
        data: Vec<u8>,
        /// Bytes of `data` to write.
        len: usize,
        /// Force Unit Access.
        fua: bool,
    },
    /// Make every completed write durable.
    Flush,
}

/// Called exactly once with a request's outcome: the bytes read for a
/// [`IoRequest::Read`], an empty vector for a write or flush. It runs on
/// the engine's thread, so it must be quick (build a response, send it on
/// a channel).
pub type IoCompletion = Box<dyn FnOnce(Result<Vec<u8>, BackendError>) + Send>;

/// Asynchronous submission of I/O (the io_uring engine).
pub trait AsyncIo: Send + Sync {
    /// Queue `req`; `done` is called when it completes or fails. Never
    /// blocks on the I/O.
    fn submit(&self, req: IoRequest, done: IoCompletion);
}

/// Errors a backend reports; the SCSI layer maps each to sense data.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The underlying read failed (maps to MEDIUM ERROR / UNRECOVERED READ ERROR).
    #[error("read error at byte {offset}: {source}")]
    Read {
        /// Byte offset of the failed access.
        offset: u64,
        /// The OS error.
        source: io::Error,
    },
    /// The underlying write failed (maps to MEDIUM ERROR / WRITE ERROR, or
    /// SPACE ALLOCATION FAILED when the error is ENOSPC).
    #[error("write error at byte {offset}: {source}")]
    Write {
        /// Byte offset of the failed access.
        offset: u64,
        /// The OS error.
        source: io::Error,
    },
    /// Flushing to stable storage failed.
    #[error("flush failed: {0}")]
    Flush(io::Error),
    /// Opening or creating the backing store failed.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The path given.
        path: String,
        /// The OS error.
        source: io::Error,
    },
    /// The configuration of the backend is invalid (size, block size...).
    #[error("invalid backend configuration: {0}")]
    Config(String),
    /// The operation is not supported by this backend.
    #[error("operation not supported by this backend")]
    Unsupported,
}

/// A flat block store that a logical unit exports.
///
/// All offsets and lengths passed in are multiples of [`block_size`](Self::block_size)
/// and lie inside the device (the SCSI layer checks LBA ranges first).
/// Methods are blocking; the server calls them off its async workers, so
/// implementations must be safe to call from several threads at once
/// (positional I/O, no shared file cursor).
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// Logical block size in bytes (512 or 4096).
    fn block_size(&self) -> u32;
    /// Number of logical blocks.
    fn num_blocks(&self) -> u64;
    /// Read `buf.len()` bytes at byte `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError>;
    /// Write `buf` at byte `offset`. With `fua` the data is on stable storage
    /// when this returns (Force Unit Access).
    fn write_at(&self, offset: u64, buf: &[u8], fua: bool) -> Result<(), BackendError>;
    /// Read without blocking if the data is at hand (page cache, memory):
    /// `Ok(true)` when `buf` was filled, `Ok(false)` when the read would
    /// have to wait (the caller then uses [`read_at`](Self::read_at) off the
    /// async workers). Default: always `Ok(false)`.
    fn try_read_at(&self, _offset: u64, _buf: &mut [u8]) -> Result<bool, BackendError> {
        Ok(false)
    }
    /// Write (without FUA) if that needs no waiting; `Ok(false)` otherwise,
    /// in which case nothing or part of `buf` may have been written and the
    /// caller writes all of it with [`write_at`](Self::write_at).
    /// Default: always `Ok(false)`.
    fn try_write_at(&self, _offset: u64, _buf: &[u8]) -> Result<bool, BackendError> {
        Ok(false)
    }
    /// Make every completed write durable (SYNCHRONIZE CACHE).
    fn flush(&self) -> Result<(), BackendError>;
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
    /// Look at the store's size again (after an administrator grew the file
    /// or block device). Returns the new number of blocks if it changed.
    /// Default: the size never changes.
    fn refresh_size(&self) -> Result<Option<u64>, BackendError> {
        Ok(None)
    }
    /// The asynchronous engine, when the device has one: READ and WRITE
    /// can then be submitted without a thread per I/O. Default: none.
    fn async_io(&self) -> Option<&dyn AsyncIo> {
        None
    }
    /// Whether writes to the store persist (false for RAM).
    fn is_persistent(&self) -> bool {
        true
    }
    /// A short human-readable description (path or "ram").
    fn describe(&self) -> String;
}
