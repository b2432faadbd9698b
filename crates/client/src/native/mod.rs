//! Log in over ethersan's native transport: `eth://IFACE/TARGET/LUN` (raw
//! Ethernet; the target is found by group discovery unless the URL gives
//! `mac=`) and `udp://HOST[:PORT]/TARGET/LUN`. The iSCSI session on top is
//! the same as over TCP: this module opens the channel and logs in on its
//! stream; the [`iscsi`](crate::iscsi) module comes here for these URLs.

use std::sync::Arc;
use std::time::Duration;

use ethersan_channel::discovery::Catalog;
use ethersan_channel::group::GroupKeys;
use ethersan_channel::{Level, ETHERTYPE_NATIVE};
use ethersan_endpoint::{Endpoint, EndpointConfig, Medium, PeerAddr};
use ethersan_link::packet::{PacketConfig, PacketLink, RingVersion};
use ethersan_link::{Link, MacAddr};

use ethersan_initiator::{LoginOptions, Session};

use crate::url::{IscsiUrl, NativeParams, Transport, UrlError};

mod level;

pub use level::{level_needed, level_too_low, LevelTooLow};

/// Why the native transport could not give a session.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL's native settings are wrong (`security=`, `mac=`), or it
    /// is not a native transport URL.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The target could not be reached: no member of the group answered,
    /// the handshake failed, the link did not open.
    #[error("{0}")]
    Unreachable(String),
    /// The channel is up and the iSCSI login on it failed.
    #[error(transparent)]
    Login(#[from] ethersan_initiator::Error),
}

/// How long discovery waits for answers when nothing else is said.
pub const DISCOVER_WAIT: Duration = Duration::from_millis(1500);

/// The endpoints this process opened channels on, until they stop (see
/// [`wait_closed`]).
static OPENED: std::sync::Mutex<Vec<ethersan_endpoint::Stopped>> =
    std::sync::Mutex::new(Vec::new());

/// Wait, at most `limit`, until every channel this process opened with
/// [`connect`] has closed: a session that ended without a logout (an
/// error, a dropped handle) asked for its channel's close, and the CLOSE
/// goes out only while the process runs. A client calls it before it
/// exits, so the target ends the session at once instead of after its
/// channel timeout.
pub async fn wait_closed(limit: Duration) {
    let all: Vec<_> = std::mem::take(&mut *OPENED.lock().unwrap_or_else(|e| e.into_inner()));
    let every = async {
        for s in all {
            s.wait().await;
        }
    };
    let _ = tokio::time::timeout(limit, every).await;
}

/// The level a URL asks for (`security=`; default encrypt).
pub fn level_of(p: &NativeParams) -> Result<Level, UrlError> {
    match &p.security {
        None => Ok(Level::Encrypt),
        Some(s) => s.parse().map_err(UrlError),
    }
}

/// Open the medium a native URL names: an AF_PACKET link on the
/// interface (needs CAP_NET_RAW) or a UDP socket.
pub async fn open_medium(url: &IscsiUrl) -> Result<(Medium, Option<PeerAddr>), Error> {
    match &url.transport {
        Transport::Eth(p) => {
            let ethertype = p.ethertype.unwrap_or(ETHERTYPE_NATIVE);
            let link = PacketLink::open(PacketConfig {
                ring: RingVersion::V2,
                ..PacketConfig::new(url.host.clone(), ethertype)
            })
            .map_err(|e| {
                Error::Unreachable(format!("cannot open Ethernet link {}: {e}", url.host))
            })?;
            let peer = match &p.mac {
                Some(m) => Some(PeerAddr::Mac(
                    m.parse::<MacAddr>()
                        .map_err(|e| UrlError(format!("mac={m:?}: {e}")))?,
                )),
                None => None,
            };
            Ok((Medium::Ethernet(Arc::new(Link::from(link))), peer))
        }
        Transport::Udp(p) => {
            let addr = tokio::net::lookup_host(url.portal())
                .await
                .map_err(|e| Error::Unreachable(format!("cannot resolve {}: {e}", url.portal())))?
                .next()
                .ok_or_else(|| Error::Unreachable(format!("{} has no address", url.portal())))?;
            let bind = if addr.is_ipv6() {
                "[::]:0"
            } else {
                "0.0.0.0:0"
            };
            let sock = tokio::net::UdpSocket::bind(bind)
                .await
                .map_err(|e| Error::Unreachable(format!("cannot bind a UDP socket: {e}")))?;
            // No mtu= in the URL: the route's, as TCP would use.
            let mtu = p.mtu.unwrap_or_else(|| {
                ethersan_endpoint::medium::mtu::route_mtu(addr)
                    .unwrap_or(ethersan_link::DEFAULT_MTU)
            });
            let medium = Medium::udp(sock, mtu)
                .map_err(|e| Error::Unreachable(format!("UDP socket: {e}")))?;
            Ok((medium, Some(PeerAddr::Udp(addr))))
        }
        Transport::Tcp => Err(UrlError("not a native transport URL".into()).into()),
    }
}

/// Ask the group who serves, on the medium of `url` (broadcast on
/// Ethernet, the URL's address on UDP).
pub async fn discover(
    url: &IscsiUrl,
    group: &GroupKeys,
    wait: Duration,
) -> Result<Vec<(PeerAddr, Catalog)>, Error> {
    let (medium, peer) = open_medium(url).await?;
    let dst = peer.unwrap_or(PeerAddr::Mac(MacAddr::BROADCAST));
    let ep = Endpoint::initiator(medium, EndpointConfig::new(group.clone()));
    ep.discover(dst, wait)
        .await
        .map_err(|e| Error::Unreachable(e.to_string()))
}

/// Connect over the native transport the URL names and log in with
/// `opts`, each step bounded by `opts.timeout`: the session, and the
/// security level of the channel under it.
pub async fn connect(
    url: &IscsiUrl,
    group: &GroupKeys,
    opts: &LoginOptions,
) -> Result<(Session, Level), Error> {
    let params = match &url.transport {
        Transport::Eth(p) | Transport::Udp(p) => p,
        Transport::Tcp => return Err(UrlError("not a native transport URL".into()).into()),
    };
    let level = level_of(params)?;
    let (medium, peer) = open_medium(url).await?;
    let where_ = medium.local();
    let ep = Endpoint::initiator(medium, EndpointConfig::new(group.clone()));
    OPENED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(ep.stopped());
    let timeout = opts.timeout.unwrap_or(Duration::from_secs(30));
    let discovered = peer.is_none();
    let peer = match peer {
        Some(p) => p,
        None => {
            let found = ep
                .discover_until(
                    PeerAddr::Mac(MacAddr::BROADCAST),
                    DISCOVER_WAIT.min(timeout),
                    |c| c.targets.iter().any(|t| t.name == url.target),
                )
                .await
                .map_err(|e| Error::Unreachable(e.to_string()))?;
            let serving = found
                .iter()
                .find(|(_, c)| c.targets.iter().any(|t| t.name == url.target));
            match serving {
                Some((p, _)) => *p,
                None if found.is_empty() => {
                    return Err(Error::Unreachable(format!(
                        "no target of group {:?} answered discovery on {} ({where_}): check the group name and secret, and that the target serves --eth on this link",
                        group.group(),
                        url.host
                    )))
                }
                None => {
                    return Err(Error::Unreachable(format!(
                        "no member of group {:?} on {} serves {}; they serve: {}",
                        group.group(),
                        url.host,
                        url.target,
                        found
                            .iter()
                            .flat_map(|(_, c)| c.targets.iter().map(|t| t.name.clone()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )))
                }
            }
        }
    };
    let connecting = ep.connect(peer, level, timeout);
    let stream = if discovered {
        connecting.await
    } else {
        // The address was given: ask it who serves at the same time, so
        // that a wrong group name or secret (no answer to either) fails
        // as fast as discovery on Ethernet does, not after the timeout.
        tokio::pin!(connecting);
        let wait = DISCOVER_WAIT.min(timeout);
        tokio::select! {
            r = &mut connecting => r,
            found = ep.discover_until(peer, wait, |_| true) => match found {
                Ok(found) if found.is_empty() => {
                    return Err(Error::Unreachable(format!(
                        "no member of group {:?} answered at {peer} within {:.1} s (neither discovery nor the channel handshake): check the group name and secret (a wrong one gets no answer) and that the target serves the native transport there",
                        group.group(),
                        wait.as_secs_f64()
                    )));
                }
                _ => connecting.await,
            },
        }
    }
    .map_err(|e| Error::Unreachable(e.to_string()))?;
    // One PDU per message, Data-In placed; its logout waits for the
    // channel's close.
    let session = ethersan_initiator::login_messages(stream.into_messages(), opts).await?;
    Ok((session, level))
}
