//! The client's AoE (ATA over Ethernet, AoE r11) side: where a device is
//! ([`AoeUrl`], [`AoeLink`]), the device handle ([`AoeDevice`]) that
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
//! `discover --aoe` takes the link alone, in `serve --aoe`'s form and
//! parsed by the same code ([`AoeLink::parse`]): `IFACE`, or
//! `unix:LOCAL,peer=PEER[,mac=MAC][,mtu=N]`.

mod cli;
mod device;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use ethersan_link::packet::{PacketConfig, PacketLink, RingVersion};
use ethersan_link::unix::{UnixDgramConfig, UnixDgramLink};
use ethersan_link::{Link, MacAddr, DEFAULT_MTU, ETHERTYPE_AOE, MAX_MTU};
use ethersan_server::config::AoeLink;

pub(crate) use cli::open;
pub(crate) use cli::{cmd_discover, cmd_inquiry, cmd_ls};
pub(crate) use device::{discover, AoeDevice, SECTOR};

/// The accepted forms, for error messages.
const URL_FORMS: &str = "aoe://IFACE/SHELF.SLOT (e.g. aoe://eth0/0.1) or \
     aoe+unix://SHELF.SLOT?local=PATH&peer=PATH[&mtu=N][&mac=MAC]";

/// Whether a command-line argument names an AoE device (and so is parsed
/// by [`AoeUrl::parse`], errors included).
pub(crate) fn is_aoe_url(s: &str) -> bool {
    s.starts_with("aoe://") || s.starts_with("aoe+unix:")
}

/// Open a link for the initiator: AF_PACKET with a TPACKET_V2 ring (a
/// frame is handed over as it arrives: request/response latency matters
/// more here than wake-ups; V3's block timeout would add about 1 ms per
/// round trip), or the unix datagram socket.
pub(crate) fn open_link(link: &AoeLink) -> anyhow::Result<Link> {
    Ok(match link {
        AoeLink::Interface(ifname) => {
            let mut cfg = PacketConfig::new(ifname.clone(), ETHERTYPE_AOE);
            cfg.ring = RingVersion::V2;
            Link::from(PacketLink::open(cfg)?)
        }
        AoeLink::Unix {
            local,
            peer,
            mac,
            mtu,
        } => {
            let mut cfg = UnixDgramConfig::new(local, peer);
            cfg.mtu = *mtu;
            cfg.mac = *mac;
            Link::from(UnixDgramLink::open(cfg)?)
        }
    })
}

/// An AoE device address and the link it is reached over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AoeUrl {
    /// The medium.
    pub link: AoeLink,
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
            let link = match AoeLink::parse(ifname) {
                Ok(l @ AoeLink::Interface(_)) => l,
                _ => {
                    return Err(format!(
                        "{s:?}: {ifname:?} is not a network interface name; give {URL_FORMS}"
                    ))
                }
            };
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
            let link = unix_link(s, &kv)?;
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

/// The unix link of an `aoe+unix://` URL's `local`, `peer`, `mtu` and
/// `mac` settings.
fn unix_link(whole: &str, kv: &[(&str, &str)]) -> Result<AoeLink, String> {
    let (mut local, mut peer, mut mtu, mut mac) = (None, None, DEFAULT_MTU, None);
    for (k, v) in kv {
        match *k {
            "local" if !v.is_empty() => local = Some(PathBuf::from(v)),
            "peer" if !v.is_empty() => peer = Some(PathBuf::from(v)),
            "mtu" => {
                mtu = v
                    .parse()
                    .ok()
                    .filter(|m| (1024..=MAX_MTU).contains(m))
                    .ok_or_else(|| {
                        format!("{whole:?}: mtu={v} is not a number from 1024 to {MAX_MTU}")
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
                    "{whole:?}: {other}={v} is not a setting (local, peer, mtu and mac are); give {URL_FORMS}"
                ))
            }
        }
    }
    match (local, peer) {
        (Some(local), Some(peer)) => Ok(AoeLink::Unix {
            local,
            peer,
            mac,
            mtu,
        }),
        _ => Err(format!(
            "{whole:?} needs both local=PATH (the socket to bind) and peer=PATH (the other end's); give {URL_FORMS}"
        )),
    }
}
