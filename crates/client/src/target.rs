//! The interface every transport implements: [`BlockTarget`], what it
//! can do ([`Capabilities`]), and how a transport presents itself to the
//! dispatch ([`Transport`], [`OpenOptions`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

use crate::options::ConnectArgs;

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

/// How the caller wants a target opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// What starts the lines said when a session is replaced ("ethersan
    /// cp").
    pub program: &'static str,
    /// Send a command that lost its session again on a new one (where the
    /// transport has sessions); `bench` measures without.
    pub retry: bool,
    /// With `retry`: how long a lost target is waited for before commands
    /// fail, new sessions tried all the while (the block device's
    /// replacement timeout; AoE commands retransmit this long). `None`: a
    /// few immediate tries, as `cp` does.
    pub reconnect: Option<std::time::Duration>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            program: "ethersan",
            retry: true,
            reconnect: None,
        }
    }
}

/// Opens a target from a URL of its schemes.
pub type OpenFn = for<'a> fn(
    &'a str,
    &'a ConnectArgs,
    &'a OpenOptions,
) -> BoxFuture<'a, anyhow::Result<Box<dyn BlockTarget>>>;

/// One transport: its URL schemes and how to open a target from one.
pub struct Transport {
    /// Its name in reports (`bench`'s engine column): "iscsi", "aoe".
    pub name: &'static str,
    /// The URL prefixes it takes ("iscsi://", "aoe+unix:").
    pub schemes: &'static [&'static str],
    /// Its URL forms, for help texts and error messages.
    pub forms: &'static str,
    /// Open a target from a URL of its schemes.
    pub open: OpenFn,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .finish()
    }
}
