//! ethersan's client library: a block device across the network, whatever
//! carries it.
//!
//! # Shape
//!
//! - [`BlockTarget`]: the one trait every transport implements — geometry
//!   (capacity, block size, largest transfer), read, write (with FUA),
//!   flush, write-zeroes, close, and [`Capabilities`] saying what the
//!   transport can do. Object-safe: the tools hold a `Box<dyn
//!   BlockTarget>` and never ask which transport it is.
//! - One module per transport: [`iscsi`] (a LUN over an iSCSI session,
//!   its retrying login, the unit-attention handling of its one command
//!   path), [`native`] (the byte stream of `eth://` and `udp://` sessions:
//!   ethersan's own channel on raw Ethernet or UDP), [`aoe`] (the AoE
//!   initiator's driver task), [`local`] (a file or block device through
//!   the server's own I/O engine, for `bench`; and `cp`'s plain files).
//! - [`url`]: the iSCSI and native URL forms; [`open()`] (in `open.rs`)
//!   picks the transport from the URL's scheme through one table,
//!   [`TRANSPORTS`]. A new transport (NVMe/TCP next) is one new module
//!   and one line in that table.
//! - [`options`]: how to connect ([`ConnectArgs`], a `clap` argument
//!   group: CHAP, the native group, `--timeout`); [`scsi`]: a command's
//!   status and sense as an error message.
//!
//! The data path copies nothing the transport does not have to: a read
//! hands the transport a spare buffer to reuse (the local engine and AoE
//! read into it, never zeroing it; iSCSI returns the session's own
//! Data-In buffer), a write hands over [`Bytes`] (sent as they are over
//! iSCSI).
#![warn(missing_docs, unreachable_pub)]

pub mod aoe;
pub mod iscsi;
pub mod local;
pub mod native;
mod open;
pub mod options;
pub mod scsi;
pub mod url;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

pub use open::{is_url, open, transport_of, url_forms, OpenFn, OpenOptions, Transport, TRANSPORTS};
pub use options::{ConnectArgs, Timeout};

/// A boxed future, as [`BlockTarget`]'s methods return them (the trait is
/// used as a trait object).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a transport says what happened that is not an error (a session
/// replaced after a failure): a line of text, above a progress bar when
/// there is one. Standard error when none is set.
pub type Say = Arc<dyn Fn(&str) + Send + Sync>;

/// Write `msg` as one line on standard error, ignoring errors (it has
/// nowhere else to go).
pub(crate) fn say_on_stderr(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{msg}");
}

/// What a transport can do beyond read, write and flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Writes can be forced to stable storage (FUA); without it `fua` is
    /// ignored and only a flush makes writes durable.
    pub fua: bool,
    /// [`BlockTarget::write_zeroes`] asks the target to zero the range
    /// (WRITE SAME) instead of sending zeros.
    pub write_zeroes: bool,
    /// Zeroed ranges may be deallocated (the target reads unmapped blocks
    /// as zeros).
    pub unmap: bool,
    /// A transfer longer than [`BlockTarget::max_transfer`] is split by
    /// the transport itself: the largest transfer is only a good size per
    /// call, not a limit.
    pub splits: bool,
    /// More sessions to the same target can be opened
    /// ([`BlockTarget::another_session`]).
    pub sessions: bool,
    /// [`BlockTarget::close`] ends a session with the target (a logout).
    pub logout: bool,
}

/// A block device across the network (or a local one): what `cp`,
/// `bench` and `attach` read, write and flush through. Offsets and
/// lengths are in bytes, multiples of [`block_size`](Self::block_size).
pub trait BlockTarget: Send + Sync + std::fmt::Debug {
    /// How messages name it ("LUN 0", "AoE device e1.2 on eth0").
    fn name(&self) -> String;

    /// A file name for it: `lunN` for iSCSI LUN N, `eSHELF.SLOT` for an
    /// AoE device (as Linux's aoe driver names it under /dev/etherd).
    fn file_name(&self) -> String;

    /// Logical block size in bytes.
    fn block_size(&self) -> u64;

    /// Capacity in bytes (as of the last change the target reported).
    fn capacity(&self) -> u64;

    /// Largest transfer per call (see [`Capabilities::splits`]).
    fn max_transfer(&self) -> u64;

    /// What the transport can do.
    fn capabilities(&self) -> Capabilities;

    /// Read `len` bytes at `offset`. `spare` is a buffer the transport
    /// may read into (its allocation is reused, its contents are never
    /// returned; `Vec::new()` when there is none); the answer holds
    /// exactly `len` bytes.
    fn read(
        &self,
        offset: u64,
        len: usize,
        spare: Vec<u8>,
    ) -> BoxFuture<'_, anyhow::Result<Vec<u8>>>;

    /// Write `data` at `offset`; `fua`: durable when answered (where
    /// [`Capabilities::fua`]).
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<'_, anyhow::Result<()>>;

    /// Make every acknowledged write durable.
    fn flush(&self) -> BoxFuture<'_, anyhow::Result<()>>;

    /// Zero `len` bytes at `offset`; `unmap`: they may be deallocated
    /// (where [`Capabilities::unmap`]). Without
    /// [`Capabilities::write_zeroes`], zeros are written.
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        _unmap: bool,
    ) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(write_zero_buffers(self, offset, len))
    }

    /// Another session to the same target, for load spread over several
    /// (where [`Capabilities::sessions`]).
    fn another_session(&self) -> BoxFuture<'_, anyhow::Result<Box<dyn BlockTarget>>> {
        Box::pin(async move { anyhow::bail!("{} has one session only", self.name()) })
    }

    /// Say what happens from now on through `say` (e.g. above a progress
    /// bar).
    fn set_say(&self, _say: Say) {}

    /// (commands retried, new sessions opened) so far.
    fn retries(&self) -> (u64, u64) {
        (0, 0)
    }

    /// End the session, if there is one (see [`Capabilities::logout`]).
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Zero a range with ordinary writes of at most the largest transfer.
pub async fn write_zero_buffers<T: BlockTarget + ?Sized>(
    t: &T,
    offset: u64,
    len: u64,
) -> anyhow::Result<()> {
    let step = t.max_transfer();
    let mut done = 0;
    while done < len {
        let n = (len - done).min(step);
        t.write(offset + done, Bytes::from(vec![0u8; n as usize]), false)
            .await?;
        done += n;
    }
    Ok(())
}
