//! The target side of ethersan's native transport: an endpoint per
//! configured Ethernet link and UDP portal (see `ethersan-endpoint`),
//! answering group discovery with the target's catalog and serving every
//! accepted channel as an iSCSI connection, with the channel's security
//! level checked against each LUN it addresses.

use std::sync::Arc;

use ethersan_channel::discovery::{Catalog, CatalogLun, CatalogTarget};
use ethersan_channel::group::{load_secret, GroupKeys};
use ethersan_channel::Level;
use ethersan_endpoint::{Endpoint, EndpointConfig, Medium};
use tracing::{info, warn};

use ethersan_link::packet::{Fanout, FanoutMode};

use crate::config::{AoeLink, Config, EthernetConfig};
use crate::registry::Registry;
use crate::StreamServer;

/// Environment variable holding the group secret.
pub const SECRET_ENV: &str = "ETHERSAN_GROUP_SECRET";

/// Why the native transport could not start.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// No group name.
    #[error("the native transport (--eth, --udp, [ethernet]) needs a group name: give --group NAME or group in [ethernet]")]
    NoGroup,
    /// The group's secret or name is unusable.
    #[error("group {group:?}: {cause}")]
    Group {
        /// The group.
        group: String,
        /// What is wrong.
        cause: String,
    },
    /// A link did not open (the link's message says what to do).
    #[error("native transport link {link}: {cause}")]
    Link {
        /// The link as configured.
        link: String,
        /// What went wrong.
        cause: ethersan_link::LinkError,
    },
    /// A link did not open for another reason.
    #[error(transparent)]
    Aoe(crate::aoe::AoeError),
    /// A pinned worker ended while the native transport was starting.
    #[error("a pinned worker stopped while the native transport was starting")]
    WorkerGone,
    /// A UDP portal did not bind.
    #[error("cannot bind UDP portal {addr}: {cause}")]
    Udp {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        cause: std::io::Error,
    },
}

/// The group keys `cfg` names, the secret taken from its file, then
/// `$ETHERSAN_GROUP_SECRET`, then the configuration itself.
pub fn group_keys(cfg: &EthernetConfig) -> Result<GroupKeys, NativeError> {
    let group = cfg.group.as_deref().ok_or(NativeError::NoGroup)?;
    let env = std::env::var(SECRET_ENV).ok();
    let err = |cause: String| NativeError::Group {
        group: group.to_string(),
        cause,
    };
    // A file, then the environment, then the secret written inline in
    // the configuration.
    let secret = match (&cfg.secret_file, &env, &cfg.secret) {
        (None, None, Some(inline)) => inline.as_bytes().to_vec(),
        _ => load_secret(cfg.secret_file.as_deref(), env.as_deref(), None)
            .map_err(|e| err(e.to_string()))?,
    };
    GroupKeys::derive(group, &secret).map_err(|e| err(e.to_string()))
}

/// What discovery answers: every target and LUN, with the security each
/// LUN needs.
pub fn catalog(registry: &Registry, server: &str) -> Catalog {
    let targets = registry
        .targets()
        .iter()
        .map(|t| CatalogTarget {
            name: t.name.clone(),
            alias: t.alias.clone(),
            luns: t
                .scsi
                .luns()
                .iter()
                .map(|(n, slot)| {
                    let v = slot.lu.volume();
                    CatalogLun {
                        lun: *n,
                        blocks: v.num_blocks(),
                        block_size: v.block_size(),
                        level: Level::from_u8(slot.policy.min_channel_level)
                            .unwrap_or(Level::Encrypt),
                    }
                })
                .collect(),
        })
        .collect();
    Catalog {
        server: server.to_string(),
        targets,
    }
}

/// This host's name, for catalogs.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "ethersan".into())
}

/// The native transport of a running server (from [`start`]): an endpoint
/// per link, one per UDP portal and pinned worker, and the tasks accepting
/// channels on them.
#[derive(Debug, Default)]
pub struct Native {
    /// One endpoint per link, and per UDP portal and pinned worker (the
    /// management plane reads their channels' counters).
    pub endpoints: Vec<Endpoint>,
    /// One per endpoint: accepts channels and serves each as a connection.
    accepting: Vec<tokio::task::JoinHandle<()>>,
}

impl Native {
    /// Accept no more channels; returns once the accepting tasks have
    /// ended. Sessions already running go on until they end; the
    /// endpoints run until every handle and stream of theirs is gone.
    pub async fn stop_accepting(&mut self) {
        for t in self.accepting.drain(..) {
            t.abort();
            let _ = t.await;
        }
    }
}

/// Open every link and UDP portal `cfg` configures and serve channels on
/// them until [`Native::stop_accepting`], or the runtime stops. Needs a
/// tokio runtime.
///
/// With pinned workers (`placement = "pinned"`, the default) each UDP
/// portal is one socket per worker, all bound to the portal's address with
/// `SO_REUSEPORT` (the kernel hashes a peer's address and port to one of
/// them, so a channel stays on one socket): each socket's endpoint, and
/// every session it accepts, runs on its worker, whose io_uring serves the
/// sessions' file I/O. An Ethernet interface is likewise one packet socket
/// and endpoint per worker, joined in one `PACKET_FANOUT` group that
/// spreads frames by source MAC (a peer's channels stay on one socket; a
/// broadcast discovery frame reaches one socket, and every endpoint answers
/// with the same catalog); a unix datagram link is one endpoint on worker
/// `i` (link `i`, round robin). With `placement = "shared"` every endpoint
/// and session runs on the shared runtime.
pub async fn start(
    cfg: &Config,
    mut server: StreamServer,
    registry: Arc<Registry>,
) -> Result<Native, NativeError> {
    let e = &cfg.ethernet;
    if !e.enabled() {
        return Ok(Native::default());
    }
    let keys = group_keys(e)?;
    let name = host_name();
    let mut ecfg = EndpointConfig::new(keys);
    let reg = registry.clone();
    ecfg.catalog = Arc::new(move || catalog(&reg, &name));
    // The sessions' copies do not hold the workers (see StreamServer).
    let workers = server.workers.take().and_then(|w| w.get());
    let mut native = Native::default();
    for (i, l) in e.links.iter().enumerate() {
        let what = format!("ethernet {l}");
        let fanned =
            matches!(l, AoeLink::Interface(_)) && workers.as_ref().is_some_and(|p| p.len() > 1);
        let Some(p) = workers.as_ref().filter(|_| fanned) else {
            // One socket: on worker `i` when there are workers.
            let slot = workers.as_ref().map(|p| p.worker(i));
            native
                .serve_link(what, l, e.ethertype, slot, &ecfg, &server)
                .await?;
            continue;
        };
        // One socket per worker in a fanout group of its own (an id the
        // kernel picks for the first), frames spread by source MAC: a
        // peer's channels stay on one socket, so on one endpoint.
        let mut group = 0;
        for w in 0..p.len() {
            let slot = p.worker(w);
            let (spec, ethertype) = (l.clone(), e.ethertype);
            let fanout = Fanout {
                group,
                mode: FanoutMode::SourceMac,
            };
            let opened = on(Some(&slot), move || {
                crate::aoe::open_link_in_group(&spec, ethertype, Some(fanout))
            })
            .await?;
            let link = match opened {
                Err(crate::aoe::AoeError::Link {
                    cause: ethersan_link::LinkError::Packet { op, source, .. },
                    ..
                }) if w == 0 && op.contains("fanout") => {
                    // A kernel without PACKET_FANOUT_CBPF (before 4.2):
                    // one socket on the first worker serves.
                    warn!(link = %l, %op, error = %source, "no fanout by source MAC; the link stays on one worker");
                    native
                        .serve_link(what.clone(), l, e.ethertype, Some(slot), &ecfg, &server)
                        .await?;
                    break;
                }
                other => other.map_err(link_err)?,
            };
            if w == 0 {
                group = match &link {
                    ethersan_link::Link::Packet(pl) => pl
                        .fanout_group()
                        .map_err(|cause| NativeError::Link {
                            link: l.to_string(),
                            cause,
                        })?
                        .unwrap_or(0),
                    _ => 0,
                };
            }
            let medium = Medium::Ethernet(Arc::new(link));
            native
                .serve(
                    format!("{what} worker {w}"),
                    medium,
                    Some(slot),
                    &ecfg,
                    &server,
                )
                .await?;
            if group == 0 {
                // No id to join (never seen): this one socket serves.
                warn!(link = %l, "no fanout group id; the link stays on one worker");
                break;
            }
        }
    }
    for u in &e.udp {
        let udp_err = |cause| NativeError::Udp {
            addr: u.addr,
            cause,
        };
        let Some(p) = &workers else {
            let sock = tokio::net::UdpSocket::bind(u.addr).await.map_err(udp_err)?;
            let bound = sock.local_addr().unwrap_or(u.addr);
            let medium = Medium::udp(sock, u.path_mtu()).map_err(udp_err)?;
            native
                .serve(format!("udp {bound}"), medium, None, &ecfg, &server)
                .await?;
            continue;
        };
        // Port 0: the first socket's port for the others.
        let first = reuse_port_socket(u.addr).map_err(udp_err)?;
        let bound = first.local_addr().map_err(udp_err)?;
        let mut socks = vec![first];
        for _ in 1..p.len() {
            socks.push(reuse_port_socket(bound).map_err(udp_err)?);
        }
        for (i, sock) in socks.into_iter().enumerate() {
            let slot = p.worker(i);
            let mtu = u.path_mtu();
            // The socket registers with the reactor of its worker.
            let medium = on(Some(&slot), move || {
                Medium::udp(tokio::net::UdpSocket::from_std(sock)?, mtu)
            })
            .await?
            .map_err(udp_err)?;
            native
                .serve(
                    format!("udp {bound} worker {i}"),
                    medium,
                    Some(slot),
                    &ecfg,
                    &server,
                )
                .await?;
        }
    }
    Ok(native)
}

/// A link-opening error as the native transport's.
fn link_err(e: crate::aoe::AoeError) -> NativeError {
    match e {
        crate::aoe::AoeError::Link { link, cause } => NativeError::Link { link, cause },
        other => NativeError::Aoe(other),
    }
}

impl Native {
    /// Open link `spec` alone (one socket, no fanout) on `slot`'s worker
    /// (the link registers with the reactor of the runtime it opens on) and
    /// serve it there.
    async fn serve_link(
        &mut self,
        what: String,
        spec: &AoeLink,
        ethertype: u16,
        slot: Option<crate::placement::WorkerSlot>,
        ecfg: &EndpointConfig,
        server: &StreamServer,
    ) -> Result<(), NativeError> {
        let spec = spec.clone();
        let link = on(slot.as_ref(), move || {
            crate::aoe::open_link_for(&spec, ethertype)
        })
        .await?
        .map_err(link_err)?;
        let medium = Medium::Ethernet(Arc::new(link));
        self.serve(what, medium, slot, ecfg, server).await
    }

    /// Run a target endpoint on `medium` and accept its channels, on
    /// `slot`'s worker (its sessions too) or on the current runtime.
    async fn serve(
        &mut self,
        what: String,
        medium: Medium,
        slot: Option<crate::placement::WorkerSlot>,
        ecfg: &EndpointConfig,
        server: &StreamServer,
    ) -> Result<(), NativeError> {
        info!(medium = %what, group = %ecfg.group.group(), max_frame = medium.max_frame(), "native transport listening");
        let ecfg = ecfg.clone();
        let server = server.clone();
        let run_on = slot.clone();
        // The endpoint's task is spawned where it is made.
        let (ep, accepting) = on(run_on.as_ref(), move || {
            let ep = Endpoint::target(medium, ecfg);
            let accepting = ep.clone();
            let task = tokio::spawn(async move {
                while let Some(a) = accepting.accept().await {
                    let s = a.stream;
                    let peer = s.info.peer.to_string();
                    let level = s.info.level.to_u8();
                    let server = server.clone();
                    let session = async move {
                        server.serve_messages(s.into_messages(), &peer, level).await;
                    };
                    match &slot {
                        // The endpoint's worker: counted among its
                        // connections.
                        Some(w) => w.spawn(session),
                        None => {
                            tokio::spawn(session);
                        }
                    }
                }
                warn!(medium = %what, "native transport endpoint stopped");
            });
            (ep, task)
        })
        .await?;
        self.accepting.push(accepting);
        self.endpoints.push(ep);
        Ok(())
    }
}

/// Run `f` on `slot`'s worker (so that what it makes registers with that
/// worker's reactor and spawns its tasks there), or here.
async fn on<T: Send + 'static>(
    slot: Option<&crate::placement::WorkerSlot>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, NativeError> {
    match slot {
        Some(w) => w
            .handle()
            .spawn(async move { f() })
            .await
            .map_err(|_| NativeError::WorkerGone),
        None => Ok(f()),
    }
}

/// A non-blocking UDP socket bound to `addr` with `SO_REUSEPORT`, so that
/// one socket per worker shares the portal's address.
fn reuse_port_socket(addr: std::net::SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}
