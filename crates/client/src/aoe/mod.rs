//! The AoE (ATA over Ethernet, AoE r11) transport: where a device is
//! ([`AoeUrl`], [`AoeLink`]), the device handle ([`AoeDevice`], a
//! [`BlockTarget`]) that drives `ethersan_aoe`'s sans-I/O
//! [`Initiator`](ethersan_aoe::Initiator) over an `ethersan_link`
//! [`Link`], and discovery.
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

mod device;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use bytes::Bytes;
use ethersan_link::packet::{PacketConfig, PacketLink, RingVersion};
pub use ethersan_link::spec::LinkSpec as AoeLink;
use ethersan_link::unix::{UnixDgramConfig, UnixDgramLink};
use ethersan_link::{Link, MacAddr, DEFAULT_MTU, ETHERTYPE_AOE, MAX_MTU};

pub use device::{discover, initiator_config, AoeDevice, Failure, SECTOR};

use crate::options::ConnectArgs;
use crate::target::{BlockTarget, BoxFuture, Capabilities, OpenOptions};

/// The AoE transport: `aoe://` and `aoe+unix:` URLs.
pub static TRANSPORT: crate::target::Transport = crate::target::Transport {
    name: "aoe",
    schemes: &["aoe://", "aoe+unix:"],
    forms: "aoe://IFACE/SHELF.SLOT or aoe+unix://SHELF.SLOT?local=PATH&peer=PATH",
    open: open_target,
};

/// The accepted forms, for error messages.
pub const URL_FORMS: &str = "aoe://IFACE/SHELF.SLOT (e.g. aoe://eth0/0.1) or \
     aoe+unix://SHELF.SLOT?local=PATH&peer=PATH[&mtu=N][&mac=MAC]";

/// Whether a command-line argument names an AoE device (and so is parsed
/// by [`AoeUrl::parse`], errors included).
pub fn is_aoe_url(s: &str) -> bool {
    s.starts_with("aoe://") || s.starts_with("aoe+unix:")
}

/// Open a link for the initiator: AF_PACKET with a TPACKET_V2 ring (a
/// frame is handed over as it arrives: request/response latency matters
/// more here than wake-ups; V3's block timeout would add about 1 ms per
/// round trip), or the unix datagram socket.
pub fn open_link(link: &AoeLink) -> anyhow::Result<Link> {
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
pub struct AoeUrl {
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
    pub fn parse(s: &str) -> Result<AoeUrl, String> {
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
    pub fn describe(&self) -> String {
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

/// Open the device an AoE URL names.
pub async fn open(url: &str, how: &ConnectArgs) -> anyhow::Result<AoeDevice> {
    let u = AoeUrl::parse(url).map_err(anyhow::Error::msg)?;
    let link = open_link(&u.link)?;
    AoeDevice::open(link, u.describe(), u.shelf, u.slot, how.timeout).await
}

/// The dispatch's entry: [`open`] as a [`BlockTarget`].
pub(crate) fn open_target<'a>(
    url: &'a str,
    how: &'a ConnectArgs,
    opts: &'a OpenOptions,
) -> BoxFuture<'a, anyhow::Result<Box<dyn BlockTarget>>> {
    Box::pin(async move {
        // Connectionless: a lost target is waited for by retransmitting
        // each command for the whole reconnect window.
        let how = match (opts.retry, opts.reconnect, how.timeout.0) {
            (true, Some(w), Some(t)) if w > t => {
                let mut longer = how.clone();
                longer.timeout = crate::options::Timeout(Some(w));
                std::borrow::Cow::Owned(longer)
            }
            _ => std::borrow::Cow::Borrowed(how),
        };
        Ok(Box::new(open(url, &how).await?) as Box<dyn BlockTarget>)
    })
}

impl BlockTarget for AoeDevice {
    fn name(&self) -> String {
        AoeDevice::name(self).to_string()
    }

    /// `eSHELF.SLOT`, as Linux's aoe driver names it under /dev/etherd.
    fn file_name(&self) -> String {
        format!("e{}.{}", self.target.shelf, self.target.slot)
    }

    fn block_size(&self) -> u64 {
        SECTOR
    }

    fn capacity(&self) -> u64 {
        AoeDevice::capacity(self)
    }

    /// A good size per call: the device splits any transfer into frames.
    fn max_transfer(&self) -> u64 {
        crate::options::DEFAULT_MAX_TRANSFER
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            splits: true,
            ..Capabilities::default()
        }
    }

    fn read(
        &self,
        offset: u64,
        len: usize,
        spare: Vec<u8>,
    ) -> BoxFuture<'_, anyhow::Result<Vec<u8>>> {
        Box::pin(AoeDevice::read(self, offset, len, spare))
    }

    /// ATA writes over AoE have no FUA: `fua` is not asked of the target
    /// (flush makes the writes durable).
    fn write(&self, offset: u64, data: Bytes, _fua: bool) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move { AoeDevice::write(self, offset, &data).await })
    }

    fn flush(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(AoeDevice::flush(self))
    }
}
