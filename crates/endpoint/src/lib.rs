//! ethersan's native transport on real links: an [`Endpoint`] owns one
//! medium (raw Ethernet through `ethersan-link`, or UDP) and one task that
//! drives every channel on it with the sans-I/O core of
//! `ethersan-channel`. Each open channel is handed out as a
//! [`ChannelStream`], an `AsyncRead`/`AsyncWrite` pair that the iSCSI
//! target and initiator use exactly as they use a TCP connection.
//!
//! A target endpoint ([`Endpoint::target`]) answers group discovery with
//! its catalog and accepts channels ([`Endpoint::accept`]); an initiator
//! endpoint ([`Endpoint::initiator`]) discovers ([`Endpoint::discover`])
//! and opens channels ([`Endpoint::connect`]). Both need the group's keys.
//! See docs/native-transport.md.
#![warn(missing_docs, unreachable_pub)]

mod driver;
pub mod medium;
pub mod message;
mod placed;
pub mod stream;

use std::sync::Arc;
use std::time::Duration;

use ethersan_channel::aead::Suite;
use ethersan_channel::channel::{ChannelConfig, ChannelStats};
use ethersan_channel::discovery::{Catalog, ReplyPart};
use ethersan_channel::group::GroupKeys;
use ethersan_channel::Level;
use tokio::sync::{mpsc, oneshot, watch, Mutex};

pub use medium::{Medium, PeerAddr};
pub use message::{MessageChannel, MessageReceiver, MessageSender, PlacedBuf, Registrar};
pub use stream::{ChannelReader, ChannelStream, ChannelWriter};

use driver::Driver;

/// What the API and the stream halves ask of the endpoint's task (defined
/// here, beside the API, so that the driver and the stream halves both use
/// it and neither imports the other for it).
#[derive(Debug)]
pub(crate) enum Command {
    /// A stream half wrote a message (the concatenation of `parts`).
    Write { id: u32, parts: Vec<bytes::Bytes> },
    /// A message sender placed data in the peer's buffer `tag`.
    Placed {
        id: u32,
        tag: u32,
        offset: u64,
        data: bytes::Bytes,
    },
    /// A writer was shut down or dropped.
    Close { id: u32 },
    /// Open a channel to `peer`.
    Connect {
        peer: PeerAddr,
        level: Level,
        timeout: Duration,
        reply: oneshot::Sender<Result<ChannelStream, EndpointError>>,
    },
    /// Send a discovery query to `dst`; answers go to `parts`.
    Discover {
        dst: PeerAddr,
        parts: mpsc::UnboundedSender<(PeerAddr, ReplyPart)>,
        nonce: [u8; 16],
    },
    /// Stop routing answers to the query with this nonce.
    DiscoverDone { nonce: [u8; 16] },
    /// The state of every channel.
    Stats {
        reply: oneshot::Sender<Vec<(ChannelInfo, ChannelStats)>>,
    },
}

/// Errors of an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Nobody answered the handshake in time.
    #[error("no answer from {peer} to a channel request of group {group:?}: check that a target of that group serves there, that the group secret matches and that it runs the same ethersan version (a wrong group or secret, or a target of native transport version 1, gets no answer)")]
    NoAnswer {
        /// Whom we asked.
        peer: PeerAddr,
        /// Our group.
        group: String,
    },
    /// The handshake failed.
    #[error("channel handshake with {peer} failed: {cause}")]
    Handshake {
        /// The peer.
        peer: PeerAddr,
        /// What went wrong.
        cause: String,
    },
    /// The endpoint's task has stopped.
    #[error("the endpoint has stopped")]
    Stopped,
}

/// What an endpoint is for.
#[derive(Debug, Clone)]
pub(crate) enum Role {
    /// Answers discovery and handshakes; accepted channels go here.
    Target { accept: mpsc::Sender<Accepted> },
    /// Discovers and connects.
    Initiator,
}

/// A channel a target endpoint accepted.
#[derive(Debug)]
pub struct Accepted {
    /// The channel.
    pub stream: ChannelStream,
}

/// What describes one open channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelInfo {
    /// The peer's address.
    pub peer: PeerAddr,
    /// Our channel id.
    pub local_id: u32,
    /// The peer's channel id.
    pub peer_id: u32,
    /// The channel's security level.
    pub level: Level,
    /// The largest frame either side sends on it.
    pub max_frame: usize,
}

/// How an endpoint runs.
#[derive(Clone)]
pub struct EndpointConfig {
    /// The group's keys (discovery and the handshake's pre-shared key).
    pub group: GroupKeys,
    /// Settings of every channel (its largest frame is set per channel
    /// from the medium and the peer).
    pub channel: ChannelConfig,
    /// Most handshakes a target keeps half-open.
    pub max_half_open: usize,
    /// How long a target keeps a half-open handshake.
    pub handshake_timeout: Duration,
    /// What a target answers discovery with (called per query).
    pub catalog: Arc<dyn Fn() -> Catalog + Send + Sync>,
    /// The traffic keys' AEAD suites this endpoint supports, in order of
    /// preference: an initiator offers them in this order, a target picks
    /// the first of an offer that is in the list. [`EndpointConfig::new`]
    /// takes them from [`SUITES_ENV`], else [`Suite::preferred`].
    pub suites: Vec<Suite>,
}

/// The environment variable that restricts an endpoint's suites:
/// comma-separated names, `aes256gcm` and `chacha20` (e.g. `chacha20` plays
/// a machine without AES instructions).
pub const SUITES_ENV: &str = "ETHERSAN_NATIVE_SUITES";

/// The suites of [`SUITES_ENV`] when it is set and valid; otherwise (with
/// a warning for an invalid value) [`Suite::preferred`].
pub fn suites_from_env() -> Vec<Suite> {
    match std::env::var(SUITES_ENV) {
        Ok(v) => Suite::parse_list(&v).unwrap_or_else(|| {
            tracing::warn!(
                value = %v,
                "{SUITES_ENV}: not a list of aes256gcm, chacha20; using both"
            );
            Suite::preferred()
        }),
        Err(_) => Suite::preferred(),
    }
}

impl std::fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("group", &self.group.group())
            .field("channel", &self.channel)
            .field("suites", &self.suites)
            .finish_non_exhaustive()
    }
}

impl EndpointConfig {
    /// Defaults for `group`, with an empty catalog; the suites from
    /// [`SUITES_ENV`] ([`suites_from_env`]).
    pub fn new(group: GroupKeys) -> EndpointConfig {
        EndpointConfig {
            group,
            channel: ChannelConfig::default(),
            max_half_open: 256,
            handshake_timeout: Duration::from_secs(10),
            catalog: Arc::new(Catalog::default),
            suites: suites_from_env(),
        }
    }
}

/// One medium's endpoint: a handle to its task. Clones share the task; it
/// ends when every handle and every channel stream is gone.
#[derive(Debug, Clone)]
pub struct Endpoint {
    tx: mpsc::UnboundedSender<Command>,
    accept: Option<Arc<Mutex<mpsc::Receiver<Accepted>>>>,
    medium: Medium,
    stopped: watch::Receiver<()>,
}

/// Resolves when an endpoint's task has ended (every handle and stream
/// gone, every channel closed or failed) without keeping it alive; see
/// [`Endpoint::stopped`].
#[derive(Debug, Clone)]
pub struct Stopped(watch::Receiver<()>);

impl Stopped {
    /// Wait until the endpoint's task has ended.
    pub async fn wait(mut self) {
        // The task holds the sender: an error means it has ended.
        while self.0.changed().await.is_ok() {}
    }
}

impl Endpoint {
    /// A target endpoint on `medium` (spawned on the current runtime).
    pub fn target(medium: Medium, cfg: EndpointConfig) -> Endpoint {
        let (atx, arx) = mpsc::channel(64);
        Self::spawn(medium, cfg, Role::Target { accept: atx }, Some(arx))
    }

    /// An initiator endpoint on `medium` (spawned on the current runtime).
    pub fn initiator(medium: Medium, cfg: EndpointConfig) -> Endpoint {
        Self::spawn(medium, cfg, Role::Initiator, None)
    }

    fn spawn(
        medium: Medium,
        cfg: EndpointConfig,
        role: Role,
        accept: Option<mpsc::Receiver<Accepted>>,
    ) -> Endpoint {
        let (tx, rx) = mpsc::unbounded_channel();
        let driver = Driver::new(medium.clone(), cfg, role, tx.downgrade(), rx);
        let (running, stopped) = watch::channel(());
        tokio::spawn(async move {
            driver.run().await;
            drop(running);
        });
        Endpoint {
            tx,
            accept: accept.map(|a| Arc::new(Mutex::new(a))),
            medium,
            stopped,
        }
    }

    /// What resolves once this endpoint's task has ended: after the last
    /// handle and stream are dropped, when its channels have closed (their
    /// CLOSE answered) or failed. A client waits on it before exiting, so
    /// that its channels' CLOSE frames go out.
    pub fn stopped(&self) -> Stopped {
        Stopped(self.stopped.clone())
    }

    /// The medium.
    pub fn medium(&self) -> &Medium {
        &self.medium
    }

    /// The next channel a group member opened to this target endpoint
    /// (`None` when the endpoint stopped or is an initiator).
    pub async fn accept(&self) -> Option<Accepted> {
        self.accept.as_ref()?.lock().await.recv().await
    }

    /// Open a channel to `peer` at security `level`, waiting at most
    /// `timeout` for the handshake.
    pub async fn connect(
        &self,
        peer: PeerAddr,
        level: Level,
        timeout: Duration,
    ) -> Result<ChannelStream, EndpointError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Connect {
                peer,
                level,
                timeout,
                reply,
            })
            .map_err(|_| EndpointError::Stopped)?;
        rx.await.map_err(|_| EndpointError::Stopped)?
    }

    /// Ask `dst` (a broadcast MAC, or a UDP unicast, broadcast or multicast
    /// address) who serves the group, and gather answers for `wait`: each
    /// responding target's address and its catalog (parts merged).
    pub async fn discover(
        &self,
        dst: PeerAddr,
        wait: Duration,
    ) -> Result<Vec<(PeerAddr, Catalog)>, EndpointError> {
        self.discover_until(dst, wait, |_| false).await
    }

    /// [`discover`](Self::discover) that stops early, as soon as an
    /// answering server's catalog satisfies `enough`.
    pub async fn discover_until(
        &self,
        dst: PeerAddr,
        wait: Duration,
        enough: impl Fn(&Catalog) -> bool,
    ) -> Result<Vec<(PeerAddr, Catalog)>, EndpointError> {
        let nonce: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        let (parts, mut rx) = mpsc::unbounded_channel();
        self.tx
            .send(Command::Discover { dst, parts, nonce })
            .map_err(|_| EndpointError::Stopped)?;
        let mut found: Vec<(PeerAddr, Catalog, Vec<u8>)> = Vec::new();
        let until = tokio::time::Instant::now() + wait;
        while let Ok(Some((peer, part))) = tokio::time::timeout_at(until, rx.recv()).await {
            match found
                .iter_mut()
                .find(|(p, c, _)| *p == peer && c.server == part.catalog.server)
            {
                Some((_, c, seen)) => {
                    if !seen.contains(&part.index) {
                        seen.push(part.index);
                        c.merge(part.catalog);
                    }
                }
                None => found.push((peer, part.catalog, vec![part.index])),
            }
            if found.iter().any(|(_, c, _)| enough(c)) {
                break;
            }
        }
        let _ = self.tx.send(Command::DiscoverDone { nonce });
        Ok(found.into_iter().map(|(p, c, _)| (p, c)).collect())
    }

    /// Every open channel with its counters (window, RTT, retransmissions).
    pub async fn stats(&self) -> Result<Vec<(ChannelInfo, ChannelStats)>, EndpointError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Stats { reply })
            .map_err(|_| EndpointError::Stopped)?;
        rx.await.map_err(|_| EndpointError::Stopped)
    }
}
