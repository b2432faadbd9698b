//! One TCP portal as the server lists and announces it: where it
//! listens, what it is advertised as, and for a portal on every address
//! of the host (`0.0.0.0`, `[::]`), the host's addresses it is reached at.
//! The live set of portals is the `portals` module; the registry keeps
//! the list it announces in SendTargets (RFC 7143 §12.8 `TargetAddress`).

use std::net::SocketAddr;

/// One portal as the live set of portals lists it (`Portals::list`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PortalInfo {
    /// The address the portal listens on (with the real port when 0 was
    /// asked for).
    pub address: SocketAddr,
    /// The address SendTargets announces for it instead, if any.
    pub advertise: Option<SocketAddr>,
}

impl PortalInfo {
    /// Whether the portal listens on every address of the host
    /// (`0.0.0.0` or `[::]`).
    pub fn is_wildcard(&self) -> bool {
        self.address.ip().is_unspecified()
    }

    /// The addresses SendTargets announces for this portal to an initiator
    /// whose connection came in on `local` (the target's side of it, as
    /// `getsockname` gives it; `None` when the connection is no TCP
    /// connection): its advertised address when it has one; else the
    /// address it listens on; for a wildcard portal, `local`'s address with
    /// the portal's port (an IPv6 connection to a `0.0.0.0` portal, which
    /// cannot reach it, and a connection with no `local` get the host's
    /// addresses instead, see [`host_addresses`]).
    pub fn announced(&self, local: Option<SocketAddr>) -> Vec<SocketAddr> {
        if let Some(a) = self.advertise {
            return vec![a];
        }
        if !self.is_wildcard() {
            return vec![self.address];
        }
        // An IPv4 initiator on a dual-stack `[::]` socket shows as
        // ::ffff:a.b.c.d; it connected to a.b.c.d.
        match local.map(|l| l.ip().to_canonical()) {
            Some(ip) if self.address.is_ipv6() || ip.is_ipv4() => {
                vec![SocketAddr::new(ip, self.address.port())]
            }
            _ => host_addresses(self.address),
        }
    }
}

/// The addresses of this host that a wildcard portal (`0.0.0.0:PORT`, or
/// `[::]:PORT`, which takes IPv4 too) can be reached at, with its port:
/// every address of every interface that is up, IPv4 first, without
/// loopback and IPv6 link-local addresses (which need an interface to be
/// named) unless the host has no other. Empty when the interfaces cannot
/// be read. A portal with a specific address gives just that address.
pub fn host_addresses(portal: SocketAddr) -> Vec<SocketAddr> {
    use nix::net::if_::InterfaceFlags;
    if !portal.ip().is_unspecified() {
        return vec![portal];
    }
    let ifaddrs = match nix::ifaddrs::getifaddrs() {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!("cannot list this host's addresses (getifaddrs): {e}");
            return Vec::new();
        }
    };
    let mut all: Vec<std::net::IpAddr> = Vec::new();
    for a in ifaddrs.filter(|a| a.flags.contains(InterfaceFlags::IFF_UP)) {
        let Some(sa) = a.address else { continue };
        let ip = if let Some(v4) = sa.as_sockaddr_in() {
            std::net::IpAddr::V4(v4.ip())
        } else if let Some(v6) = sa.as_sockaddr_in6() {
            if portal.is_ipv4() {
                continue;
            }
            std::net::IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        if !all.contains(&ip) {
            all.push(ip);
        }
    }
    let routable = |ip: &std::net::IpAddr| match ip {
        std::net::IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_unspecified(),
        std::net::IpAddr::V6(v6) => {
            !v6.is_loopback() && !v6.is_unspecified() && !v6.is_unicast_link_local()
        }
    };
    let mut chosen: Vec<std::net::IpAddr> = all.iter().copied().filter(routable).collect();
    if chosen.is_empty() {
        chosen = all.into_iter().filter(|ip| ip.is_loopback()).collect();
    }
    chosen.sort_by_key(|ip| ip.is_ipv6());
    chosen
        .into_iter()
        .map(|ip| SocketAddr::new(ip, portal.port()))
        .collect()
}
