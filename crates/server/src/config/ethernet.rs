//! The native transport part of the configuration (`serve --eth`,
//! `--udp`, `--group`; `[ethernet]` in a config file): where the target
//! serves ethersan's own secure Ethernet transport, for which group, and
//! where the group's secret comes from. Each LUN's least channel security
//! is `security=` in its spec (see [`super::LunConfig::security`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use super::AoeLink;

/// The native transport is on when `links` or `udp` is not empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EthernetConfig {
    /// Raw Ethernet links (interfaces, or QEMU-style unix datagram links).
    pub links: Vec<AoeLink>,
    /// UDP portals.
    pub udp: Vec<UdpPortal>,
    /// The group name (required when the transport is on).
    pub group: Option<String>,
    /// A file holding the group secret.
    pub secret_file: Option<PathBuf>,
    /// The group secret itself (a config file may give it inline; a file
    /// or `$ETHERSAN_GROUP_SECRET` wins).
    pub secret: Option<String>,
    /// The EtherType on raw Ethernet (default 0x88B5).
    pub ethertype: u16,
}

impl Default for EthernetConfig {
    fn default() -> Self {
        EthernetConfig {
            links: Vec::new(),
            udp: Vec::new(),
            group: None,
            secret_file: None,
            secret: None,
            ethertype: ethersan_channel::ETHERTYPE_NATIVE,
        }
    }
}

impl EthernetConfig {
    /// Whether the native transport is configured at all.
    pub fn enabled(&self) -> bool {
        !self.links.is_empty() || !self.udp.is_empty()
    }
}

/// A UDP portal of the native transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpPortal {
    /// Address and port to bind.
    pub addr: SocketAddr,
    /// The path MTU (IP packet size; frames are this less the IP and UDP
    /// headers); `None` (not configured): the MTU of the interface holding
    /// the address ([`UdpPortal::path_mtu`]).
    pub mtu: Option<usize>,
}

impl UdpPortal {
    /// Parse `ADDR:PORT[,mtu=N]` (`[V6]:PORT` for IPv6; a bare address
    /// takes the default port 3262).
    pub fn parse(spec: &str) -> Result<UdpPortal, String> {
        let mut parts = spec.split(',');
        let a = parts.next().unwrap_or("").trim();
        let addr: SocketAddr = a
            .parse()
            .or_else(|_| {
                a.parse::<std::net::IpAddr>()
                    .map(|ip| SocketAddr::new(ip, ethersan_channel::DEFAULT_UDP_PORT))
            })
            .map_err(|_| {
                format!("--udp {spec:?}: give ADDR:PORT (e.g. 0.0.0.0:3262 or [::]:3262)")
            })?;
        let mut mtu = None;
        for p in parts {
            match p.split_once('=') {
                Some(("mtu", v)) => {
                    mtu = v
                        .parse::<usize>()
                        .ok()
                        .filter(|m| (1280..=65_535).contains(m))
                        .map(Some)
                        .ok_or_else(|| {
                            format!("--udp {spec:?}: mtu must be a number from 1280 to 65535")
                        })?
                }
                _ => {
                    return Err(format!(
                        "--udp {spec:?}: unknown option {p:?} (known: mtu=N)"
                    ))
                }
            }
        }
        Ok(UdpPortal { addr, mtu })
    }

    /// The path MTU the portal's socket uses: the configured one, else the
    /// MTU of the interface holding the address (loopback's 65,535 on
    /// 127.0.0.1; 1500 on a wildcard address, where a channel still takes
    /// the smaller of both ends' figures).
    pub fn path_mtu(&self) -> usize {
        self.mtu
            .unwrap_or_else(|| ethersan_endpoint::medium::mtu::bound_mtu(self.addr.ip()))
    }
}

impl std::fmt::Display for UdpPortal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "udp:{}", self.addr)
    }
}

/// Parse an EtherType: `0x88B5` or decimal; must be at least 0x0600 (below
/// that the field is a length).
pub fn parse_ethertype(s: &str) -> Result<u16, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u16::from_str_radix(h, 16).ok(),
        None => s.parse::<u16>().ok(),
    };
    v.filter(|v| *v >= 0x0600).ok_or_else(|| {
        format!("ethertype {s:?}: give a hex EtherType from 0x0600 to 0xFFFF, e.g. 0x88B5")
    })
}
