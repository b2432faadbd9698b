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

use crate::config::{Config, EthernetConfig};
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
/// per link and UDP portal, and the tasks accepting channels on them.
#[derive(Debug, Default)]
pub struct Native {
    /// One endpoint per link or UDP portal (the management plane reads
    /// their channels' counters).
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
pub async fn start(
    cfg: &Config,
    server: StreamServer,
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
    let mut media: Vec<(String, Medium)> = Vec::new();
    for l in &e.links {
        let link = crate::aoe::open_link_for(l, e.ethertype).map_err(|e| match e {
            crate::aoe::AoeError::Link { link, cause } => NativeError::Link { link, cause },
            other => NativeError::Aoe(other),
        })?;
        media.push((format!("ethernet {l}"), Medium::Ethernet(Arc::new(link))));
    }
    for u in &e.udp {
        let sock = tokio::net::UdpSocket::bind(u.addr)
            .await
            .map_err(|cause| NativeError::Udp {
                addr: u.addr,
                cause,
            })?;
        let bound = sock.local_addr().unwrap_or(u.addr);
        let medium = Medium::udp(sock, u.mtu).map_err(|cause| NativeError::Udp {
            addr: u.addr,
            cause,
        })?;
        media.push((format!("udp {bound}"), medium));
    }
    let mut native = Native::default();
    for (what, medium) in media {
        info!(medium = %what, group = %ecfg.group.group(), max_frame = medium.max_frame(), "native transport listening");
        let ep = Endpoint::target(medium, ecfg.clone());
        let accepting = ep.clone();
        let server = server.clone();
        native.accepting.push(tokio::spawn(async move {
            while let Some(a) = accepting.accept().await {
                let s = a.stream;
                let peer = s.info.peer.to_string();
                let level = s.info.level.to_u8();
                let server = server.clone();
                tokio::spawn(async move {
                    server.serve_messages(s.into_messages(), &peer, level).await;
                });
            }
            warn!(medium = %what, "native transport endpoint stopped");
        }));
        native.endpoints.push(ep);
    }
    Ok(native)
}
