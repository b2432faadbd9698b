//! A LUN across the network, whatever the transport: the one type the
//! client commands that move data (`cp`, `attach`) read, write and flush
//! through. A new URL scheme is added here — [`is_remote_url`],
//! [`Remote::open`] and one variant per call — and every such command
//! takes it.

use bytes::Bytes;
use ethersan_initiator::IscsiUrl;
use indicatif::ProgressBar;

use crate::aoe_client::{self, AoeDevice};
use crate::blockio::{ConnectArgs, RetryingLun};

/// The URL forms a [`Remote`] opens, for help texts and error messages.
pub(crate) const URL_FORMS: &str = "iscsi://[USER%SECRET@]HOST[:PORT]/IQN/LUN, \
     eth://IFACE/IQN/LUN, udp://HOST[:PORT]/IQN/LUN, \
     aoe://IFACE/SHELF.SLOT or aoe+unix://SHELF.SLOT?local=PATH&peer=PATH";

/// Whether a command-line argument names a remote LUN (and so is parsed
/// by [`Remote::open`], errors included) rather than a local path.
pub(crate) fn is_remote_url(spec: &str) -> bool {
    crate::blockio::is_iscsi_url(spec) || aoe_client::is_aoe_url(spec)
}

/// A block device across the network.
#[derive(Debug)]
pub(crate) enum Remote {
    /// An iSCSI LUN whose commands are retried on a new session when one
    /// fails.
    Iscsi(Box<RetryingLun>),
    /// An AoE device (its initiator retransmits lost commands itself).
    Aoe(Box<AoeDevice>),
}

impl Remote {
    /// Log in to (iSCSI) or find (AoE) the LUN `spec` names and learn its
    /// geometry. `program` starts the lines said when a session is
    /// replaced ("ethersan cp").
    pub(crate) async fn open(
        spec: &str,
        how: &ConnectArgs,
        program: &'static str,
    ) -> anyhow::Result<Remote> {
        if aoe_client::is_aoe_url(spec) {
            return Ok(Remote::Aoe(Box::new(aoe_client::open(spec, how).await?)));
        }
        let url = IscsiUrl::parse(spec)?;
        Ok(Remote::Iscsi(Box::new(
            RetryingLun::open(&url, how).await?.said_by(program),
        )))
    }

    /// How messages name the LUN ("LUN 0", "aoe+unix 1.2").
    pub(crate) fn name(&self) -> String {
        match self {
            Remote::Iscsi(l) => format!("LUN {}", l.lun().lun),
            Remote::Aoe(d) => d.name().to_string(),
        }
    }

    /// A file name for the LUN: `lunN` for iSCSI LUN N, `eSHELF.SLOT` for
    /// an AoE device (as Linux's aoe driver names it under /dev/etherd).
    pub(crate) fn file_name(&self) -> String {
        match self {
            Remote::Iscsi(l) => format!("lun{}", l.lun().lun),
            Remote::Aoe(d) => format!("e{}.{}", d.target.shelf, d.target.slot),
        }
    }

    /// Logical block size in bytes.
    pub(crate) fn block_size(&self) -> u64 {
        match self {
            Remote::Iscsi(l) => u64::from(l.lun().block_size),
            Remote::Aoe(_) => aoe_client::SECTOR,
        }
    }

    /// Capacity in bytes.
    pub(crate) fn capacity(&self) -> u64 {
        match self {
            Remote::Iscsi(l) => l.lun().capacity(),
            Remote::Aoe(d) => d.capacity(),
        }
    }

    /// Largest transfer per call (an AoE device splits one into frames).
    pub(crate) fn max_transfer(&self) -> u64 {
        match self {
            Remote::Iscsi(l) => l.lun().max_transfer,
            Remote::Aoe(_) => crate::blockio::DEFAULT_MAX_TRANSFER,
        }
    }

    /// Read `len` bytes at `at` (both block-aligned).
    pub(crate) async fn read(&self, at: u64, len: usize) -> anyhow::Result<Vec<u8>> {
        match self {
            Remote::Iscsi(l) => l.read(at, len).await,
            Remote::Aoe(d) => d.read(at, len).await,
        }
    }

    /// Write `data` at `at` (both block-aligned); `fua`: durable when
    /// answered (iSCSI only; AoE writes have no FUA).
    pub(crate) async fn write(&self, at: u64, data: Vec<u8>, fua: bool) -> anyhow::Result<()> {
        match self {
            Remote::Iscsi(l) => l.write(at, Bytes::from(data), fua).await,
            Remote::Aoe(d) => d.write(at, &data).await,
        }
    }

    /// Zero `len` bytes at `at` (both block-aligned): WRITE SAME (16) over
    /// iSCSI, with UNMAP when `unmap` and the LUN reads unmapped blocks as
    /// zeros; written zeros where the target has no WRITE SAME and over
    /// AoE.
    pub(crate) async fn write_zeroes(&self, at: u64, len: u64, unmap: bool) -> anyhow::Result<()> {
        if let Remote::Iscsi(l) = self {
            let step = l.lun().max_write_same;
            let mut done = 0;
            while done < len {
                let n = (len - done).min(step);
                if !l.write_zeroes(at + done, n, unmap).await? {
                    break;
                }
                done += n;
            }
            if done == len {
                return Ok(());
            }
            return self.write_zero_buffers(at + done, len - done).await;
        }
        self.write_zero_buffers(at, len).await
    }

    /// Zero a range with ordinary writes.
    async fn write_zero_buffers(&self, at: u64, len: u64) -> anyhow::Result<()> {
        let step = self.max_transfer();
        let mut done = 0;
        while done < len {
            let n = (len - done).min(step);
            self.write(at + done, vec![0u8; n as usize], false).await?;
            done += n;
        }
        Ok(())
    }

    /// Make every acknowledged write durable (SYNCHRONIZE CACHE, FLUSH
    /// CACHE EXT).
    pub(crate) async fn flush(&self) -> anyhow::Result<()> {
        match self {
            Remote::Iscsi(l) => l.flush().await,
            Remote::Aoe(d) => d.flush().await,
        }
    }

    /// Where to say what happened while a progress bar is drawn.
    pub(crate) fn set_bar(&self, bar: &ProgressBar) {
        if let Remote::Iscsi(l) = self {
            *l.bar.lock().expect("not poisoned") = Some(bar.clone());
        }
    }

    /// (commands retried, new sessions opened) so far.
    pub(crate) fn retries(&self) -> (u64, u64) {
        match self {
            Remote::Iscsi(l) => l.retries(),
            Remote::Aoe(_) => (0, 0),
        }
    }

    /// Log out (iSCSI); an AoE device has no session to end.
    pub(crate) async fn close(&self) {
        if let Remote::Iscsi(l) = self {
            l.logout().await;
        }
    }
}
