//! The sections of the TOML form but `[[target]]` (see `target`):
//! `[options]`, `portals`, `[chap]`, `[discovery.chap]`, `[aoe]`,
//! `[ethernet]` and `[isns]`, each raw section to its part of the
//! configuration.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use toml::Spanned;

use super::super::{AoeConfig, ChapConfig, ConfigError, EthernetConfig, IsnsConfig, Options};
use super::raw::{
    socket_addr, RawAoe, RawChap, RawDiscovery, RawEthernet, RawIsns, RawNvme, RawPortal,
};
use super::source::Source;

/// `[options]`, checked, its `data_dir` relative to the file.
pub(super) fn options(src: &Source, raw: Option<Spanned<Options>>) -> Result<Options, ConfigError> {
    let options = match raw {
        Some(o) => {
            let span = o.span();
            let o = o.into_inner();
            o.validate().map_err(|m| src.at(Some(span), m))?;
            o
        }
        None => Options::default(),
    };
    Ok(Options {
        data_dir: src.base.join(&options.data_dir),
        ..options
    })
}

/// `portals = [...]`: the addresses to listen on (one at least, each
/// once) and those some are advertised as.
pub(super) fn portals(
    src: &Source,
    raw: Vec<Spanned<RawPortal>>,
) -> Result<(Vec<SocketAddr>, BTreeMap<SocketAddr, SocketAddr>), ConfigError> {
    let mut portals = Vec::new();
    let mut advertise = BTreeMap::new();
    for p in raw {
        let span = p.span();
        let (listen, adv) = match p.into_inner() {
            RawPortal::Addr(a) => (a, None),
            RawPortal::Table(t) => (t.listen, t.advertise),
        };
        let addr = socket_addr(&listen, "portal").map_err(|m| src.at(Some(span.clone()), m))?;
        if portals.contains(&addr) && addr.port() != 0 {
            return Err(src.at(
                Some(span),
                format!("portal {addr} is listed twice: list each address once"),
            ));
        }
        if let Some(a) = adv {
            let a = socket_addr(&a, "advertise")
                .map_err(|m| src.at(Some(span.clone()), format!("portal {addr}: {m}")))?;
            if a.ip().is_unspecified() || a.port() == 0 {
                return Err(src.at(
                    Some(span),
                    format!("portal {addr}: advertise {a} cannot be reached by initiators: give the address and port they connect to"),
                ));
            }
            advertise.insert(addr, a);
        }
        portals.push(addr);
    }
    if portals.is_empty() {
        return Err(src.at(
            None,
            "no portals: add e.g. portals = [\"127.0.0.1:3260\"]".into(),
        ));
    }
    Ok((portals, advertise))
}

/// `[chap]`: the CHAP every target needs unless it says otherwise.
pub(super) fn chap(
    src: &Source,
    raw: Option<Spanned<RawChap>>,
) -> Result<Option<ChapConfig>, ConfigError> {
    Ok(match raw {
        Some(c) => {
            let span = c.span();
            Some(
                c.into_inner()
                    .resolve(true, src.base)
                    .map_err(|m| src.at(Some(span), format!("[chap]: {m}")))?,
            )
        }
        None => None,
    })
}

/// `[discovery.chap]`: discovery sessions' own CHAP; `chap` is `[chap]`.
pub(super) fn discovery_chap(
    src: &Source,
    raw: Option<RawDiscovery>,
    chap: Option<&ChapConfig>,
) -> Result<Option<ChapConfig>, ConfigError> {
    Ok(match raw.and_then(|d| d.chap) {
        Some(c) => {
            let span = c.span();
            if chap.is_some_and(|c| !c.discovery) {
                return Err(src.at(
                    Some(span),
                    "[discovery.chap] contradicts discovery = false in [chap]; remove one".into(),
                ));
            }
            let mut d = c
                .into_inner()
                .resolve(false, src.base)
                .map_err(|m| src.at(Some(span), format!("[discovery.chap]: {m}")))?;
            d.discovery = true;
            Some(d)
        }
        None => None,
    })
}

/// `[aoe]`: the AoE links and the MACs allowed.
pub(super) fn aoe(src: &Source, raw: Option<Spanned<RawAoe>>) -> Result<AoeConfig, ConfigError> {
    Ok(match raw {
        None => AoeConfig::default(),
        Some(a) => {
            let span = a.span();
            let a = a.into_inner();
            let mut links: Vec<super::super::AoeLink> = a
                .interfaces
                .into_iter()
                .map(super::super::AoeLink::Interface)
                .collect();
            for u in &a.unix {
                let spec = if u.starts_with("unix:") {
                    u.clone()
                } else {
                    format!("unix:{u}")
                };
                let mut link = super::super::AoeLink::parse(&spec)
                    .map_err(|m| src.at(Some(span.clone()), format!("[aoe] unix: {m}")))?;
                if let super::super::AoeLink::Unix { local, peer, .. } = &mut link {
                    *local = src.base.join(&*local);
                    *peer = src.base.join(&*peer);
                }
                links.push(link);
            }
            let allowed_macs = super::super::parse_macs(&a.allowed_macs)
                .map_err(|m| src.at(Some(span.clone()), format!("[aoe] {m}")))?;
            AoeConfig {
                links,
                allowed_macs,
            }
        }
    })
}

/// `[ethernet]`: the native transport's links, UDP portals and group.
pub(super) fn ethernet(
    src: &Source,
    raw: Option<Spanned<RawEthernet>>,
) -> Result<EthernetConfig, ConfigError> {
    Ok(match raw {
        None => EthernetConfig::default(),
        Some(e) => {
            let span = e.span();
            let e = e.into_inner();
            let mut links: Vec<super::super::AoeLink> = e
                .interfaces
                .into_iter()
                .map(super::super::AoeLink::Interface)
                .collect();
            for u in &e.unix {
                let spec = if u.starts_with("unix:") {
                    u.clone()
                } else {
                    format!("unix:{u}")
                };
                let mut link = super::super::AoeLink::parse_option(&spec, "unix")
                    .map_err(|m| src.at(Some(span.clone()), format!("[ethernet] {m}")))?;
                if let super::super::AoeLink::Unix { local, peer, .. } = &mut link {
                    *local = src.base.join(&*local);
                    *peer = src.base.join(&*peer);
                }
                links.push(link);
            }
            let udp = e
                .udp
                .iter()
                .map(|u| super::super::UdpPortal::parse(u))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|m| src.at(Some(span.clone()), format!("[ethernet] udp: {m}")))?;
            let ethertype = match e.ethertype.as_deref() {
                None => ethersan_channel::ETHERTYPE_NATIVE,
                Some(t) => super::super::parse_ethertype(t)
                    .map_err(|m| src.at(Some(span.clone()), format!("[ethernet] {m}")))?,
            };
            EthernetConfig {
                links,
                udp,
                group: e.group,
                secret_file: e.secret_file.map(|f| src.base.join(f)),
                secret: e.secret,
                ethertype,
            }
        }
    })
}

/// `[nvme]`: the NVMe/TCP target's portals.
pub(super) fn nvme(
    src: &Source,
    raw: Option<Spanned<RawNvme>>,
) -> Result<super::super::NvmeConfig, ConfigError> {
    let Some(n) = raw else {
        return Ok(super::super::NvmeConfig::default());
    };
    let span = n.span();
    let portals = n
        .into_inner()
        .portals
        .iter()
        .map(|p| super::super::NvmeConfig::parse_portal(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|m| src.at(Some(span), format!("[nvme] portals: {m}")))?;
    Ok(super::super::NvmeConfig { portals })
}

/// `[isns]`: the iSNS server to register with.
pub(super) fn isns(
    src: &Source,
    raw: Option<Spanned<RawIsns>>,
) -> Result<Option<IsnsConfig>, ConfigError> {
    Ok(match raw {
        None => None,
        Some(i) => {
            let span = i.span();
            let i = i.into_inner();
            let mut c = IsnsConfig::parse_server(&i.server)
                .map_err(|m| src.at(Some(span.clone()), format!("[isns] server: {m}")))?;
            for p in &i.portals {
                c.portals.push(p.parse().map_err(|_| {
                    src.at(
                        Some(span.clone()),
                        format!("[isns] portals: {p:?} is not ADDR:PORT (IPv6 as [::1]:3260)"),
                    )
                })?);
            }
            if let Some(e) = &i.entity {
                if e.is_empty() || e.len() > 255 {
                    return Err(
                        src.at(Some(span), "[isns] entity: give 1 to 255 characters".into())
                    );
                }
            }
            c.entity = i.entity;
            Some(c)
        }
    })
}
