//! The client's AoE (ATA over Ethernet, AoE r11) side: where a device is
//! ([`AoeUrl`], [`LinkSpec`]), the device handle ([`AoeDevice`]) that
//! drives `ethersan_aoe`'s sans-I/O [`Initiator`](ethersan_aoe::Initiator)
//! over an `ethersan_link` [`Link`], discovery, and the `discover --aoe`,
//! `ls` and `inquiry` output for AoE devices.
//!
//! Accepted forms:
//! - `aoe://IFACE/SHELF.SLOT`: AF_PACKET on interface IFACE (needs
//!   CAP_NET_RAW);
//! - `aoe+unix://SHELF.SLOT?local=PATH&peer=PATH[&mtu=N][&mac=MAC]`: one
//!   unix datagram per frame (QEMU's `-netdev dgram` format), binding
//!   `local` and sending to `peer`; for tests and VMs, no root needed.
//!
//! `discover --aoe` takes the link alone: `IFACE`, or
//! `unix:LOCAL,peer=PEER[,mtu=N][,mac=MAC]` as `serve --aoe` does.

mod cli;
mod device;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use ethersan_link::packet::{PacketConfig, PacketLink, RingVersion};
use ethersan_link::unix::{UnixDgramConfig, UnixDgramLink};
use ethersan_link::{Link, MacAddr, DEFAULT_MTU, ETHERTYPE_AOE};

pub(crate) use cli::{cmd_discover, cmd_inquiry, cmd_ls};
pub(crate) use cli::open;
pub(crate) use device::{discover, AoeDevice, SECTOR};

/// The accepted forms, for error messages.
const URL_FORMS: &str = "aoe://IFACE/SHELF.SLOT (e.g. aoe://eth0/0.1) or \
     aoe+unix://SHELF.SLOT?local=PATH&peer=PATH[&mtu=N][&mac=MAC]";

/// The accepted forms of `discover --aoe`.
const LINK_FORMS: &str = "IFACE (e.g. eth0) or unix:LOCAL,peer=PEER[,mtu=N][,mac=MAC]";

/// Whether a command-line argument names an AoE device (and so is parsed
/// by [`AoeUrl::parse`], errors included).
pub(crate) fn is_aoe_url(s: &str) -> bool {
    s.starts_with("aoe://") || s.starts_with("aoe+unix:")
}

/// The medium a device is reached over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkSpec {
    /// AF_PACKET on a network interface.
    Packet {
        /// The interface.
        ifname: String,
    },
    /// A unix datagram socket pair.
    Unix {
        /// Our socket path (bound).
        local: PathBuf,
        /// The peer's socket path.
        peer: PathBuf,
        /// Payload bytes per frame.
        mtu: usize,
        /// Our MAC (random when `None`).
        mac: Option<MacAddr>,
    },
}

impl LinkSpec {
    /// Parse `discover --aoe`'s argument: `IFACE` or
    /// `unix:LOCAL,peer=PEER[,mtu=N][,mac=MAC]`.
    pub(crate) fn parse(s: &str) -> Result<LinkSpec, String> {
        let Some(rest) = s.strip_prefix("unix:") else {
            if s.is_empty() || s.contains(['/', ',', ' ']) {
                return Err(format!("{s:?} is not an interface name; give {LINK_FORMS}"));
            }
            return Ok(LinkSpec::Packet {
                ifname: s.to_string(),
            });
        };
        let mut parts = rest.split(',');
        let local = parts.next().unwrap_or_default();
        let mut kv = Vec::new();
        for p in parts {
            let Some((k, v)) = p.split_once('=') else {
                return Err(format!("{s:?}: {p:?} is not KEY=VALUE; give {LINK_FORMS}"));
            };
            kv.push((k, v));
        }
        Self::unix(s, local, &kv, LINK_FORMS)
    }

    /// A unix link from its local path and `peer`/`mtu`/`mac` settings.
    fn unix(whole: &str, local: &str, kv: &[(&str, &str)], forms: &str) -> Result<LinkSpec, String> {
        let (mut peer, mut mtu, mut mac) = (None, DEFAULT_MTU, None);
        let mut local = (!local.is_empty()).then(|| PathBuf::from(local));
        for (k, v) in kv {
            match *k {
                "local" => local = Some(PathBuf::from(v)),
                "peer" => peer = Some(PathBuf::from(v)),
                "mtu" => {
                    mtu = v
                        .parse()
                        .ok()
                        .filter(|m| (68..=ethersan_link::MAX_MTU).contains(m))
                        .ok_or_else(|| {
                            format!(
                                "{whole:?}: mtu={v} is not a number from 68 to {}",
                                ethersan_link::MAX_MTU
                            )
                        })?
                }
                "mac" => {
                    mac = Some(
                        v.parse::<MacAddr>()
                            .map_err(|e| format!("{whole:?}: mac={v}: {e}"))?,
                    )
                }
                other => {
                    return Err(format!(
                        "{whole:?}: unknown setting {other:?} (local, peer, mtu and mac are known); give {forms}"
                    ))
                }
            }
        }
        match (local, peer) {
            (Some(local), Some(peer)) => Ok(LinkSpec::Unix {
                local,
                peer,
                mtu,
                mac,
            }),
            _ => Err(format!(
                "{whole:?} needs both a local and a peer socket path; give {forms}"
            )),
        }
    }

    /// Open the link: AF_PACKET with a TPACKET_V2 ring (a frame is handed
    /// over as it arrives: request/response latency matters more here
    /// than wake-ups), or the unix socket.
    pub(crate) fn open(&self) -> anyhow::Result<Link> {
        Ok(match self {
            LinkSpec::Packet { ifname } => {
                let mut cfg = PacketConfig::new(ifname.clone(), ETHERTYPE_AOE);
                cfg.ring = RingVersion::V2;
                Link::from(PacketLink::open(cfg)?)
            }
            LinkSpec::Unix {
                local,
                peer,
                mtu,
                mac,
            } => {
                let mut cfg = UnixDgramConfig::new(local, peer);
                cfg.mtu = *mtu;
                cfg.mac = *mac;
                Link::from(UnixDgramLink::open(cfg)?)
            }
        })
    }
}

impl std::fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkSpec::Packet { ifname } => f.write_str(ifname),
            LinkSpec::Unix { local, peer, .. } => {
                write!(f, "unix:{},peer={}", local.display(), peer.display())
            }
        }
    }
}

/// An AoE device address and the link it is reached over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AoeUrl {
    /// The medium.
    pub link: LinkSpec,
    /// Shelf (major).
    pub shelf: u16,
    /// Slot (minor).
    pub slot: u8,
}

impl AoeUrl {
    /// Parse `aoe://IFACE/SHELF.SLOT` or
    /// `aoe+unix://SHELF.SLOT?local=PATH&peer=PATH[&mtu=N][&mac=MAC]`.
    pub(crate) fn parse(s: &str) -> Result<AoeUrl, String> {
        if let Some(rest) = s.strip_prefix("aoe://") {
            let Some((ifname, addr)) = rest.split_once('/') else {
                return Err(format!(
                    "{s:?} names no device: add /SHELF.SLOT; give {URL_FORMS}"
                ));
            };
            let link = LinkSpec::parse(ifname).map_err(|_| {
                format!("{s:?}: {ifname:?} is not an interface name; give {URL_FORMS}")
            })?;
            if matches!(link, LinkSpec::Unix { .. }) {
                return Err(format!(
                    "{s:?}: a unix socket link is written aoe+unix://SHELF.SLOT?local=PATH&peer=PATH"
                ));
            }
            let (shelf, slot) = shelf_slot(s, addr)?;
            return Ok(AoeUrl { link, shelf, slot });
        }
        if let Some(rest) = s.strip_prefix("aoe+unix://") {
            let (addr, query) = rest.split_once('?').unwrap_or((rest, ""));
            let (shelf, slot) = shelf_slot(s, addr)?;
            let mut kv = Vec::new();
            for p in query.split('&').filter(|p| !p.is_empty()) {
                let Some((k, v)) = p.split_once('=') else {
                    return Err(format!("{s:?}: {p:?} is not KEY=VALUE; give {URL_FORMS}"));
                };
                kv.push((k, v));
            }
            let link = LinkSpec::unix(s, "", &kv, URL_FORMS)?;
            return Ok(AoeUrl { link, shelf, slot });
        }
        Err(format!("{s:?} is not an AoE URL; give {URL_FORMS}"))
    }

    /// `e0.1 on eth0`: how messages name the device.
    pub(crate) fn describe(&self) -> String {
        format!("AoE device e{}.{} on {}", self.shelf, self.slot, self.link)
    }
}

/// `SHELF.SLOT`, each a decimal number, neither the broadcast address.
fn shelf_slot(whole: &str, addr: &str) -> Result<(u16, u8), String> {
    let bad = || {
        format!(
            "{whole:?}: {addr:?} is not SHELF.SLOT (shelf 0 to 65534, slot 0 to 254, e.g. 0.1); give {URL_FORMS}"
        )
    };
    let (shelf, slot) = addr.split_once('.').ok_or_else(bad)?;
    let shelf: u16 = shelf.parse().map_err(|_| bad())?;
    let slot: u8 = slot.parse().map_err(|_| bad())?;
    if shelf == ethersan_aoe::frame::BROADCAST_SHELF || slot == ethersan_aoe::frame::BROADCAST_SLOT
    {
        return Err(bad());
    }
    Ok((shelf, slot))
}
