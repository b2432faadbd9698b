//! The ethersan iSCSI target server.
//!
//! [`Server::bind`] turns a [`config::Config`] into open backends, SCSI
//! targets and listening portals; [`Server::run`] accepts connections until
//! its shutdown future resolves. Each connection runs the login phase
//! (`login`) and then a session task (`session`) that owns all of that
//! session's state and drives the target core (`ethersan_core`): its task
//! set, its executor (no-wait attempt, io_uring, blocking pool), the live
//! directory of targets and LUNs.
#![warn(missing_docs, unreachable_pub)]

mod accept;
pub mod aoe;
pub mod config;
pub mod control;
pub mod exposure;
pub mod identity;
pub mod isns;
pub mod limits;
mod login;
pub mod native;
pub mod nvme;
mod placement;
pub mod portal;
pub mod portals;
pub mod registry;
pub mod reload;
mod session;
pub mod stats;
mod wire;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use ethersan_backend::{BlockDevice, BlockDeviceExt};
use ethersan_proto::negotiate::TargetSettings;
use ethersan_scsi::{LogicalUnit, LuConfig, LunMap, LunPolicy, LunSlot, Nexus};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::config::{Config, Options};
use crate::registry::{Registry, TargetEntry};
use crate::session::{Event, Session, SessionOptions, SessionSetup};
use crate::wire::{spawn_writer, PduReader};

/// Errors starting or running the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A LUN's backing store could not be opened.
    #[error("target {target} LUN {lun}: {cause}")]
    Backend {
        /// Target name.
        target: String,
        /// LUN number.
        lun: usize,
        /// The backend's error.
        cause: ethersan_backend::BackendError,
    },
    /// A LUN's identity (WWN and serial) could not be read or made.
    #[error("target {target} LUN {lun}: {cause}")]
    Identity {
        /// Target name.
        target: String,
        /// LUN number.
        lun: usize,
        /// What went wrong.
        cause: identity::IdentityError,
    },
    /// A portal could not be added (the same address twice).
    #[error(transparent)]
    Portal(portals::PortalError),
    /// A portal could not be bound.
    #[error("cannot listen on {addr}: {cause}{}", bind_hint(.cause, addr))]
    Bind {
        /// The portal address.
        addr: SocketAddr,
        /// The OS error.
        cause: std::io::Error,
    },
}

/// A configured, bound target server.
pub struct Server {
    registry: Arc<Registry>,
    portals: portals::Portals,
    options: Options,
    /// Login settings (CHAP, digests, limits): swapped by a reload, read
    /// once per connection.
    settings: Arc<ArcSwap<TargetSettings>>,
    config: Config,
    /// The pinned workers, shared by the TCP portals and the native
    /// transport (started on first use).
    workers: placement::Workers,
}

impl Server {
    /// Open every backend, build the targets and bind every portal.
    pub async fn bind(config: &Config) -> Result<Server, ServerError> {
        let mut targets = Vec::new();
        for t in &config.targets {
            targets.push(Arc::new(build_target(t, &config.options, &mut Vec::new())?));
        }
        let registry = Arc::new(
            Registry::with_login_limit(targets, Vec::new(), config.options.max_logins_in_progress)
                .with_portal_group_tag(config.options.target_port_group),
        );
        for t in &config.targets {
            registry.follow_preempts(&t.name);
        }
        let portals = portals::Portals::new(registry.clone(), tokio::runtime::Handle::current());
        for p in &config.portals {
            portals
                .add(*p, config.advertise.get(p).copied())
                .await
                .map_err(|e| match e {
                    portals::PortalError::Bind { address, cause } => ServerError::Bind {
                        addr: address,
                        cause,
                    },
                    other => ServerError::Portal(other),
                })?;
        }
        log_open_targets(config);
        let settings = Arc::new(ArcSwap::from_pointee(target_settings(config)));
        Ok(Server {
            registry,
            portals,
            options: config.options.clone(),
            settings,
            config: config.clone(),
            workers: placement::Workers::new(&config.options),
        })
    }

    /// What applies a changed configuration to this server while it runs
    /// (SIGHUP); see [`reload`].
    pub fn reloader(&self) -> reload::Reloader {
        reload::Reloader::new(
            self.registry.clone(),
            self.settings.clone(),
            self.portals.clone(),
            self.config.clone(),
        )
    }

    /// The bound portal addresses (with the real port when 0 was asked for).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.portals.list().into_iter().map(|p| p.address).collect()
    }

    /// A live handle on the TCP portals: list, add and remove them, before
    /// and while the server runs (see [`portals`]).
    pub fn portals(&self) -> portals::Portals {
        self.portals.clone()
    }

    /// The registry of targets and sessions.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Serve one connection over any byte stream (an in-memory pipe in
    /// tests, or a socket accepted elsewhere) until its session ends.
    pub async fn serve_stream<R, W>(&self, rd: R, wr: W, peer: &str)
    where
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
        W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        self.stream_server().serve(rd, wr, peer, None).await
    }

    /// A handle that serves byte streams as iSCSI connections while the
    /// server runs (the native transport's channels).
    pub fn stream_server(&self) -> StreamServer {
        StreamServer {
            registry: self.registry.clone(),
            options: self.options.clone(),
            settings: self.settings.clone(),
            workers: Some(self.workers.clone()),
        }
    }

    /// Serve until `shutdown` resolves, then stop accepting, end every
    /// session (commands in flight finish), flush every LUN and return:
    /// [`Server::start`], then the steps of a stop in their order.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        self.start();
        shutdown.await;
        info!("shutting down: no new connections; ending sessions");
        self.stop_accepting();
        self.end_sessions().await;
        self.flush();
        info!("stopped");
    }

    /// Start accepting connections on every portal (and on those added
    /// later), on the pinned workers when the placement says so.
    pub fn start(&self) {
        let ctx = accept::AcceptContext::new(
            self.registry.clone(),
            self.options.clone(),
            self.settings.clone(),
            &self.workers,
        );
        self.portals.start(Arc::new(ctx));
    }

    /// The first step of a stop: every portal's listening socket is shut,
    /// no new connection is accepted and no portal can be added.
    pub fn stop_accepting(&self) {
        self.portals.stop();
    }

    /// The second step of a stop: end every session (commands in flight
    /// finish) and wait until they have ended, at most 10 s.
    pub async fn end_sessions(&self) {
        self.registry.shutdown_all();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.registry.session_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The third step of a stop: flush every LUN's store (a failure is
    /// logged, the others are flushed still).
    pub fn flush(&self) {
        for t in self.registry.targets().iter() {
            for slot in t.scsi.luns().values() {
                let d = slot.lu.device();
                if let Err(e) = d.flush() {
                    warn!(%e, backend = %d.describe(), "flush at shutdown failed");
                }
            }
        }
    }
}

/// A place among the connections in login for one from `peer`, or `None`
/// (with a warning at most once a second) when `max_logins_in_progress`
/// are logging in already.
fn login_slot(registry: &Registry, peer: &str) -> Option<limits::LoginSlot> {
    let logins = registry.logins();
    let slot = logins.try_acquire();
    if slot.is_none() {
        registry
            .login_stats()
            .failed(stats::LoginFailure::RefusedLimit);
        if let Some(more) = logins.warning_allowed() {
            warn!(
                %peer,
                limit = logins.limit(),
                refused_since_last_warning = more,
                "too many connections in login (max_logins_in_progress); refusing connection"
            );
        }
    }
    slot
}

/// A target with its LUNs opened, as `t` configures it; `released`: the
/// store locks of LUNs it replaces (see [`open_lun`]).
fn build_target(
    t: &config::TargetConfig,
    options: &Options,
    released: &mut Vec<Arc<ethersan_backend::lock::StoreLock>>,
) -> Result<TargetEntry, ServerError> {
    let mut luns = LunMap::new();
    for (n, i) in t.numbered() {
        luns.insert(n, open_lun(t, i, options, released)?);
    }
    Ok(TargetEntry::new(
        t.name.clone(),
        t.alias.clone(),
        luns,
        Arc::new(registry::LiveAccess::new(t.access.clone())),
    ))
}

/// The LUN at place `i` of target `t`: its store opened and locked (a
/// lock of `released`, the LUNs a reload replaces, is kept when it is this
/// store's), its identity resolved.
fn open_lun(
    t: &config::TargetConfig,
    i: usize,
    options: &Options,
    released: &mut Vec<Arc<ethersan_backend::lock::StoreLock>>,
) -> Result<LunSlot, ServerError> {
    let data_dir = options.data_dir.as_path();
    let l = &t.luns[i];
    let number = t
        .numbered()
        .get(i)
        .map_or(i, |(n, _)| usize::try_from(*n).unwrap_or(usize::MAX));
    let dev = l
        .open_taking_over(released)
        .map_err(|source| ServerError::Backend {
            target: t.name.clone(),
            lun: number,
            cause: source,
        })?;
    let (id, origin) =
        identity::resolve(l, data_dir, &*dev).map_err(|source| ServerError::Identity {
            target: t.name.clone(),
            lun: number,
            cause: source,
        })?;
    let (naa, serial) = (id.naa, id.serial);
    let cfg = LuConfig {
        read_only: l.read_only,
        removable: l.removable,
        vendor: "ETHERSAN".to_string(),
        product: "ethersan disk".to_string(),
        revision: "0001".to_string(),
        serial,
        naa,
        target_name: t.name.clone(),
        write_cache: l.write_cache,
        physical_block_size: l.physical_block_size,
        sanitize_rate: l.sanitize_rate,
        // One target port per gateway: its group and relative port are the
        // gateway's --tpg.
        alua: ethersan_scsi::Alua {
            group: options.target_port_group,
            rel_port: options.target_port_group,
            state: match options.alua_state {
                config::GatewayState::ActiveOptimized => ethersan_scsi::AluaState::ActiveOptimized,
                config::GatewayState::ActiveNonOptimized => {
                    ethersan_scsi::AluaState::ActiveNonOptimized
                }
                config::GatewayState::Standby => ethersan_scsi::AluaState::Standby,
            },
            preferred: false,
        },
        // APTPL state lives beside a regular file LUN's backing file.
        pr_state_file: match &l.backing {
            config::Backing::File { path, .. } if path.is_file() => {
                let mut p = path.clone().into_os_string();
                p.push(".pr");
                Some(p.into())
            }
            _ => None,
        },
    };
    info!(target = %t.name, lun = number, backend = %dev.describe(), naa = %config::format_naa(&naa), serial = %cfg.serial, identity = %origin, "logical unit ready");
    let policy = LunPolicy {
        visible_to: t.access.luns.get(i).cloned().unwrap_or_default(),
        read_only_for: t.access.read_only.get(i).cloned().unwrap_or_default(),
        min_channel_level: l.security.to_u8(),
    };
    let lu = Arc::new(LogicalUnit::new(dev.clone(), cfg));
    watch_size(&dev, &lu, &t.name, number);
    Ok(LunSlot { lu, policy })
}

/// A store whose size can change outside this process (an RBD image
/// resized in its cluster) tells the unit, which then raises CAPACITY DATA
/// HAS CHANGED for every nexus.
fn watch_size(dev: &Arc<dyn BlockDevice>, lu: &Arc<LogicalUnit>, target: &str, lun: usize) {
    let unit = Arc::downgrade(lu);
    let target = target.to_string();
    dev.watch_size(Arc::new(move || {
        let unit = unit.clone();
        let target = target.clone();
        // The engine calls from its own thread, which looking at the size
        // may need: look from another one.
        std::thread::spawn(move || {
            let Some(lu) = unit.upgrade() else { return };
            match lu.rescan_capacity() {
                Ok(Some(blocks)) => {
                    info!(target = %target, lun, blocks, "the store was resized outside ethersan; initiators are told (CAPACITY DATA HAS CHANGED)")
                }
                Ok(None) => {}
                Err(e) => warn!(target = %target, lun, "cannot read the store's new size: {e}"),
            }
        });
    }));
}

/// PDUs read ahead of the session at most: enough to keep a session
/// busy (a full CmdSN window arrives in batches), few enough that a slow
/// session pushes back on its initiator instead of queueing without end.
const PDU_QUEUE: usize = 64;

fn chap_policy(c: &config::ChapConfig) -> ethersan_proto::negotiate::AuthPolicy {
    ethersan_proto::negotiate::AuthPolicy::Chap {
        initiator: c.initiator.clone(),
        target: c.target.clone(),
    }
}

/// Say (info) which targets need no CHAP although a global `[chap]` is
/// set: those that opted out with `chap = "none"`.
fn log_open_targets(config: &Config) {
    if config.chap.is_none() {
        return;
    }
    let open: Vec<&str> = config
        .targets
        .iter()
        .filter(|t| t.chap == config::TargetChap::None)
        .map(|t| t.name.as_str())
        .collect();
    if !open.is_empty() {
        info!(
            targets = %open.join(", "),
            "CHAP opt-out: these targets accept logins without CHAP (chap = \"none\"); the others need CHAP"
        );
    }
}

fn target_settings(config: &Config) -> TargetSettings {
    let o = &config.options;
    let (auth, auth_discovery) = match &config.chap {
        Some(c) => (chap_policy(c), c.discovery),
        None => (ethersan_proto::negotiate::AuthPolicy::None, true),
    };
    TargetSettings {
        auth,
        auth_discovery,
        discovery_auth: config.discovery_chap.as_ref().map(chap_policy),
        target_auth: config
            .targets
            .iter()
            .filter_map(|t| match &t.chap {
                config::TargetChap::Inherit => None,
                // Opted out: no CHAP for this target whatever `auth` says.
                config::TargetChap::None => {
                    Some((t.name.clone(), ethersan_proto::negotiate::AuthPolicy::None))
                }
                config::TargetChap::Chap(c) => Some((t.name.clone(), chap_policy(c))),
            })
            .collect(),
        operational: o.operational(),
        portal_group_tag: o.target_port_group,
        ..TargetSettings::default()
    }
}

/// Where a connection comes from, and its place among those in login.
struct Connection {
    peer: String,
    /// This end of a TCP connection (what wildcard portals are announced
    /// as); `None` for other streams.
    local: Option<SocketAddr>,
    /// The security level of the native transport channel under the
    /// stream (`None`: TCP or a test pipe).
    channel_level: Option<u8>,
    /// Given back as soon as the login ends.
    login_slot: Option<limits::LoginSlot>,
}

/// Serves byte streams as iSCSI connections of a running [`Server`]
/// (from [`Server::stream_server`]).
#[derive(Clone)]
pub struct StreamServer {
    registry: Arc<Registry>,
    options: Options,
    settings: Arc<ArcSwap<TargetSettings>>,
    /// The server's pinned workers (the native transport runs there);
    /// `None` in the copies its sessions hold, so that no task on a worker
    /// keeps the workers running.
    workers: Option<placement::Workers>,
}

impl std::fmt::Debug for StreamServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamServer")
    }
}

impl StreamServer {
    /// Serve one connection until its session ends; `channel_level` is
    /// the security level of the native transport channel it came over.
    ///
    /// The stream counts among the connections in login
    /// (`max_logins_in_progress`) until its login ends; beyond the cap it
    /// is closed before anything is read.
    pub async fn serve<R, W>(&self, rd: R, wr: W, peer: &str, channel_level: Option<u8>)
    where
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
        W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Some(conn) = self.connection(peer, channel_level) else {
            return;
        };
        serve_stream(
            rd,
            wr,
            conn,
            self.registry.clone(),
            self.options.clone(),
            self.settings.load_full(),
        )
        .await
    }

    /// A connection from `peer` counted among those in login, or `None`
    /// (and it is closed before anything is read) beyond the cap.
    fn connection(&self, peer: &str, channel_level: Option<u8>) -> Option<Connection> {
        let slot = login_slot(&self.registry, peer)?;
        Some(Connection {
            peer: peer.to_string(),
            local: None,
            channel_level,
            login_slot: Some(slot),
        })
    }

    /// Serve one native transport channel as an iSCSI connection until its
    /// session ends: one PDU per message, Data-In placed into the
    /// initiator's buffer (docs/native-transport.md, "iSCSI over the
    /// channel"); `channel_level` is the channel's security level.
    pub async fn serve_messages(
        &self,
        ch: ethersan_endpoint::MessageChannel,
        peer: &str,
        channel_level: u8,
    ) {
        let Some(conn) = self.connection(peer, Some(channel_level)) else {
            return;
        };
        let reader = PduReader::messages(ch.receiver, 8192);
        let buffers = ch.sender.registrar();
        let (out, writer) = wire::spawn_message_writer(ch.sender);
        serve_pdus(
            reader,
            out,
            writer,
            Some(buffers),
            conn,
            self.registry.clone(),
            self.options.clone(),
            self.settings.load_full(),
        )
        .await
    }
}

/// Serve one connection over any byte stream: login, then the session
/// until it ends.
async fn serve_stream<R, W>(
    rd: R,
    wr: W,
    conn: Connection,
    registry: Arc<Registry>,
    options: Options,
    settings: Arc<TargetSettings>,
) where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let reader = PduReader::new(rd, 8192);
    let (out, writer) = spawn_writer(wr);
    serve_pdus(reader, out, writer, None, conn, registry, options, settings).await
}

/// Serve one connection whose PDUs come and go through `reader` and the
/// writer task (`out`, `writer`): login, then the session until it ends.
/// With `buffers` (a native transport channel's), writes' solicited data
/// comes placed.
#[allow(clippy::too_many_arguments)]
async fn serve_pdus<R>(
    mut reader: PduReader<R>,
    out: mpsc::UnboundedSender<wire::WriterMsg>,
    writer: tokio::task::JoinHandle<std::io::Result<()>>,
    buffers: Option<ethersan_endpoint::Registrar>,
    conn: Connection,
    registry: Arc<Registry>,
    options: Options,
    settings: Arc<TargetSettings>,
) where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let Connection {
        peer,
        local,
        channel_level,
        login_slot,
    } = conn;
    let peer_ip = peer.parse::<std::net::SocketAddr>().ok().map(|a| a.ip());
    // Counted open until this function returns (the session's end).
    let _open = registry.login_stats().connection(channel_level.is_some());
    let (ev_tx, ev_rx) = mpsc::unbounded_channel::<Event>();
    // The login enforces login_timeout_secs itself (back-off waits
    // excluded); this outer bound only guards against a bug there.
    let login = tokio::time::timeout(
        Duration::from_secs(options.login_timeout_secs) + limits::MAX_AUTH_DELAY * 2,
        login::login(
            &mut reader,
            &out,
            &registry,
            &settings,
            ev_tx.clone(),
            peer_ip,
            login::LoginLimits {
                max_text: options.max_key_text_bytes,
                timeout: Duration::from_secs(options.login_timeout_secs),
            },
        ),
    )
    .await;
    // The login phase is over, however it ended.
    drop(login_slot);
    let outcome = match login {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => {
            debug!(%peer, %e, "login failed");
            drop(out);
            let _ = writer.await;
            return;
        }
        Err(_) => {
            registry.login_stats().failed(stats::LoginFailure::Timeout);
            debug!(%peer, "login timed out");
            return;
        }
    };
    let p = &outcome.params;
    let target = outcome
        .target
        .as_ref()
        .map_or("(discovery)", |t| t.name.as_str());
    let isid = outcome.isid.iter().fold(String::from("0x"), |mut s, b| {
        s.push_str(&format!("{b:02x}"));
        s
    });
    info!(%peer, initiator = %p.initiator_name, target = %target, isid = %isid, "session started");
    let started = std::time::Instant::now();
    let (initiator, target) = (p.initiator_name.clone(), target.to_string());
    reader.framer = p.target_framer();
    let _ = out.send(wire::WriterMsg::Digests {
        header: p.header_digest,
        data: p.data_digest,
    });
    let nexus_key = registry::nexus_key(
        &p.initiator_name,
        &outcome.isid,
        outcome.target.as_ref().map(|t| t.name.as_str()),
    );
    let counters = Arc::new(ethersan_core::counters::IoCounters::default());
    registry.describe_session(
        outcome.session_id,
        registry::SessionDetails {
            address: peer.clone(),
            transport: if channel_level.is_some() {
                "native"
            } else {
                "iscsi"
            },
            channel_level,
            params: p.clone(),
            counters: counters.clone(),
            started: std::time::SystemTime::now(),
        },
    );
    let setup = SessionSetup {
        counters,
        id: outcome.session_id,
        target: outcome.target.clone(),
        params: p.clone(),
        nexus: Nexus(nexus_key),
        exp_cmd_sn: outcome.exp_cmd_sn,
        stat_sn: outcome.stat_sn,
        peer_ip,
        local_addr: local,
        channel_level,
        placed_writes: buffers.is_some(),
        options: SessionOptions {
            queue_depth: options.queue_depth,
            inline_io: options.inline_io,
            max_key_text: options.max_key_text_bytes,
            memory_budget: options.session_memory_budget,
            nop_interval: (options.nop_interval_secs > 0)
                .then(|| Duration::from_secs(options.nop_interval_secs)),
            nop_timeout: Duration::from_secs(options.nop_timeout_secs.max(1)),
        },
    };
    // Reader task: PDUs into the session's event queue, at most
    // PDU_QUEUE ahead of the session (it stops reading while the session
    // is behind, and TCP pushes back on the initiator). One queue for
    // everything the session waits for, so it never wakes itself.
    let read_ahead = session::driver::ReadAhead::new(PDU_QUEUE);
    let rd_tx = ev_tx.clone();
    let room = read_ahead.clone();
    let reader_task = tokio::spawn(async move {
        loop {
            let r = reader.read_aligning().await;
            let stop = r.is_err()
                && !matches!(
                    r,
                    Err(wire::ReadError::DataDigest(..)) | Err(wire::ReadError::TooLong { .. })
                );
            if !room.reserve().await {
                break;
            }
            let ev = match r {
                Ok((raw, Some(data))) => Event::WriteCommand(raw, data),
                Ok((raw, None)) => Event::Pdu(Ok(raw)),
                Err(e) => Event::Pdu(Err(e)),
            };
            if rd_tx.send(ev).is_err() || stop {
                break;
            }
        }
    });
    // Timer for NOP-In pings.
    let tick_tx = ev_tx.clone();
    let ticker = tokio::spawn(async move {
        let mut iv = tokio::time::interval(Duration::from_secs(1));
        loop {
            iv.tick().await;
            if tick_tx.send(Event::Tick).is_err() {
                break;
            }
        }
    });
    let executor = ethersan_core::executor::Executor {
        inline_io: setup.options.inline_io,
    };
    let releases = session::driver::releases_to(ev_tx.clone());
    let session = Session::new(setup, registry, releases, std::time::Instant::now());
    let channels = session::driver::Channels {
        events: ev_rx,
        events_tx: ev_tx,
        read_ahead,
        out,
        buffers,
    };
    let reason = session::driver::run(session, executor, channels).await;
    reader_task.abort();
    ticker.abort();
    let _ = writer.await;
    info!(
        %peer,
        %initiator,
        %target,
        reason,
        duration = %format_args!("{:.3}s", started.elapsed().as_secs_f64()),
        "session ended: {reason}"
    );
}

/// What to do about a portal that cannot be bound.
fn bind_hint(e: &std::io::Error, addr: &SocketAddr) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "; another program (perhaps another ethersan) listens on {addr}: stop it, or choose another portal (--listen ADDR:PORT, portals = [...] in a config file)"
        ),
        std::io::ErrorKind::AddrNotAvailable => format!(
            "; no network interface of this machine has the address {}",
            addr.ip()
        ),
        std::io::ErrorKind::PermissionDenied if addr.port() < 1024 => format!(
            "; port {} is below 1024: run as root, give the binary CAP_NET_BIND_SERVICE, or use a port from 1024 up",
            addr.port()
        ),
        _ => String::new(),
    }
}
