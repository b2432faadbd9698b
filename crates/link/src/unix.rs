//! A link over a unix datagram socket: one datagram is one Ethernet frame
//! (header included, no FCS, no length prefix), the format of QEMU's
//! `-netdev dgram` with unix addresses. QEMU binds its `local.path` and
//! sends to its `remote.path`; ethersan does the same from the other side,
//! binding its own path and sending to the VM's:
//!
//! ```text
//! qemu-system-x86_64 … \
//!   -netdev dgram,id=n1,local.type=unix,local.path=/run/vm1.sock,remote.type=unix,remote.path=/run/ethersan-vm1.sock \
//!   -device virtio-net-pci,netdev=n1
//! ```
//!
//! pairs with `UnixDgramConfig::new("/run/ethersan-vm1.sock", "/run/vm1.sock")`.
//! No root and no tap device are involved. Two such links pointed at each
//! other make a point-to-point wire for tests.
//!
//! Frames are received on the bound socket, which stays unconnected so
//! that a restarted peer (a new socket at the same path) can send to it at
//! once. They are sent from a second, unbound socket connected to the
//! peer's path: only a connected sender is woken when a full peer queue
//! (the kernel's `net.unix.max_dgram_qlen`, 10 datagrams by default)
//! drains, so a burst waits for the peer instead of polling. QEMU reads
//! with `recv` and does not check the sender's address.
//!
//! Like a cable, the link drops a frame rather than fail when the peer is
//! not there (its path missing or nobody bound to it; the next frame tries
//! again, and a restarted peer is reconnected), or when its queue stays
//! full for [`FULL_PEER_PATIENCE`].

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::UnixDatagram;

use crate::frame::{RxFilter, DEFAULT_MTU, HEADER_LEN};
use crate::{check_mtu, checked_batch, LinkError, MacAddr, RECV_BATCH};

/// How long a send waits for a peer whose queue stays full before dropping
/// the frame.
pub const FULL_PEER_PATIENCE: Duration = Duration::from_millis(500);

/// Receive buffer: large enough for any datagram QEMU sends (it caps at
/// 69632 bytes), so an oversized one is seen whole and dropped.
const RECV_BUF: usize = 70 * 1024;

/// How to open a [`UnixDgramLink`].
#[derive(Debug, Clone)]
pub struct UnixDgramConfig {
    /// Our socket path, bound by the link (a stale socket there is
    /// replaced, as QEMU does; any other file is an error).
    pub local: PathBuf,
    /// The peer's socket path (QEMU's `local.path`).
    pub peer: PathBuf,
    /// Our MAC; `None` picks a random locally administered one.
    pub mac: Option<MacAddr>,
    /// Payload bytes per frame (default 1500; up to 9216).
    pub mtu: usize,
    /// The EtherType carried.
    pub ethertype: u16,
    /// Whether multicast destinations pass the receive filter.
    pub multicast: bool,
}

impl UnixDgramConfig {
    /// Binds `local`, sends to `peer`; AoE, MTU 1500, random MAC.
    pub fn new(local: impl Into<PathBuf>, peer: impl Into<PathBuf>) -> UnixDgramConfig {
        UnixDgramConfig {
            local: local.into(),
            peer: peer.into(),
            mac: None,
            mtu: DEFAULT_MTU,
            ethertype: crate::ETHERTYPE_AOE,
            multicast: false,
        }
    }
}

/// A link over a unix datagram socket; removes its socket file when dropped.
#[derive(Debug)]
pub struct UnixDgramLink {
    sock: UnixDatagram,
    local: PathBuf,
    peer: PathBuf,
    filter: RxFilter,
    mtu: usize,
    buf: Mutex<Vec<u8>>,
    /// The sending socket, connected to the peer once it is there.
    sender: tokio::sync::Mutex<Option<UnixDatagram>>,
    dropped_no_peer: AtomicU64,
    dropped_full: AtomicU64,
}

impl UnixDgramLink {
    /// Binds `config.local`. Must be called within a tokio runtime.
    pub fn open(config: UnixDgramConfig) -> Result<UnixDgramLink, LinkError> {
        check_mtu(config.mtu)?;
        match std::fs::symlink_metadata(&config.local) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(&config.local)
                .map_err(unix_err("removing the stale socket", &config.local))?,
            Ok(_) => {
                return Err(LinkError::Unix {
                    op: "binding",
                    path: config.local.clone(),
                    source: io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        "a file that is not a socket is in the way",
                    ),
                })
            }
            Err(_) => {}
        }
        let sock = UnixDatagram::bind(&config.local).map_err(unix_err("binding", &config.local))?;
        Ok(UnixDgramLink {
            sock,
            filter: RxFilter {
                mac: config.mac.unwrap_or_else(MacAddr::random_local),
                ethertype: config.ethertype,
                multicast: config.multicast,
            },
            mtu: config.mtu,
            local: config.local,
            peer: config.peer,
            buf: Mutex::new(vec![0; RECV_BUF]),
            sender: tokio::sync::Mutex::new(None),
            dropped_no_peer: AtomicU64::new(0),
            dropped_full: AtomicU64::new(0),
        })
    }

    /// The MTU.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The receive filter (our MAC and EtherType).
    pub fn filter(&self) -> RxFilter {
        self.filter
    }

    /// Our socket path.
    pub fn local_path(&self) -> &Path {
        &self.local
    }

    /// The peer's socket path.
    pub fn peer_path(&self) -> &Path {
        &self.peer
    }

    /// Frames dropped so far because the peer was absent, and because its
    /// queue stayed full.
    pub fn dropped(&self) -> (u64, u64) {
        (
            self.dropped_no_peer.load(Ordering::Relaxed),
            self.dropped_full.load(Ordering::Relaxed),
        )
    }

    /// See [`Link::recv_batch`](crate::Link::recv_batch).
    pub async fn recv_batch<F: FnMut(&[u8])>(&self, mut f: F) -> Result<usize, LinkError> {
        loop {
            self.ready().await?;
            let n = self.try_recv_batch(|frame| f(frame))?;
            if n > 0 {
                return Ok(n);
            }
        }
    }

    /// See [`Link::ready`](crate::Link::ready).
    pub async fn ready(&self) -> Result<(), LinkError> {
        self.sock
            .readable()
            .await
            .map_err(|e| self.err("waiting to receive on", e))
    }

    /// See [`Link::try_recv_batch`](crate::Link::try_recv_batch).
    pub fn try_recv_batch<F: FnMut(&mut [u8])>(&self, mut f: F) -> Result<usize, LinkError> {
        let max = self.mtu + HEADER_LEN;
        let mut delivered = 0;
        let mut buf = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..RECV_BATCH {
            match self.sock.try_recv(&mut buf) {
                Ok(n) => {
                    let frame = &mut buf[..n];
                    if n <= max && self.filter.accepts(frame) {
                        f(frame);
                        delivered += 1;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.err("receiving on", e)),
            }
        }
        Ok(delivered)
    }

    /// See [`Link::send_batch`](crate::Link::send_batch).
    pub async fn send_batch<I, B>(&self, frames: I) -> Result<usize, LinkError>
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        let frames = checked_batch(frames, self.mtu)?;
        // One holder at a time keeps each batch's frames in order.
        let mut sender = self.sender.lock().await;
        for f in &frames {
            self.send_one(&mut sender, f.as_ref()).await?;
        }
        Ok(frames.len())
    }

    async fn send_one(
        &self,
        sender: &mut Option<UnixDatagram>,
        frame: &[u8],
    ) -> Result<(), LinkError> {
        // A second attempt follows a reconnection to a restarted peer.
        for _ in 0..2 {
            let sock = match sender {
                Some(sock) => sock,
                None => match self.connect() {
                    Ok(sock) => sender.insert(sock),
                    Err(e) if is_peer_absent(&e) => break,
                    Err(e) => return Err(self.err("connecting to", e)),
                },
            };
            match tokio::time::timeout(FULL_PEER_PATIENCE, sock.send(frame)).await {
                Ok(Ok(_)) => return Ok(()),
                // The peer closed (it may be back at the same path).
                Ok(Err(e)) if is_peer_absent(&e) => *sender = None,
                Ok(Err(e)) => return Err(self.err("sending to", e)),
                Err(_) => {
                    self.dropped_full.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(peer = %self.peer.display(), "peer's queue stayed full: frame dropped");
                    return Ok(());
                }
            }
        }
        if self.dropped_no_peer.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::info!(peer = %self.peer.display(), "no peer socket: frames are dropped until one is bound there");
        }
        Ok(())
    }

    /// A new unbound socket connected to the peer's path.
    fn connect(&self) -> io::Result<UnixDatagram> {
        let sock = UnixDatagram::unbound()?;
        sock.connect(&self.peer)?;
        Ok(sock)
    }

    fn err(&self, op: &'static str, source: io::Error) -> LinkError {
        LinkError::Unix {
            op,
            path: self.peer.clone(),
            source,
        }
    }
}

/// Maps an OS error about `path` while doing `op`.
fn unix_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> LinkError + 'a {
    move |source| LinkError::Unix {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Whether a send failed because nobody is bound at the peer's path.
fn is_peer_absent(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ECONNREFUSED | libc::ENOTCONN | libc::ECONNRESET)
    )
}

impl Drop for UnixDgramLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.local);
    }
}

#[cfg(test)]
mod tests;
