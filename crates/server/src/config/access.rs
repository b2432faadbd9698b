//! Who may use a target: initiator names, source networks, LUN masks.

/// lists allow everyone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// Initiator names allowed (exact match); empty: any.
    pub initiators: Vec<String>,
    /// Source networks allowed, as (address, prefix length); empty: any.
    pub networks: Vec<(std::net::IpAddr, u8)>,
    /// Per LUN (by number): the initiators that see it; empty or missing:
    /// every initiator allowed on the target (LUN masking).
    pub luns: Vec<Vec<String>>,
    /// Per LUN: initiators for which it is read-only.
    pub read_only: Vec<Vec<String>>,
}

impl Access {
    /// Whether `initiator` connecting from `ip` may use the target.
    pub fn allows(&self, initiator: &str, ip: Option<std::net::IpAddr>) -> bool {
        let name_ok = self.initiators.is_empty() || self.initiators.iter().any(|i| i == initiator);
        let net_ok = self.networks.is_empty()
            || ip.is_some_and(|ip| {
                self.networks
                    .iter()
                    .any(|(net, len)| in_network(ip, *net, *len))
            });
        name_ok && net_ok
    }
}

/// Parse `ADDR/LEN` (or a bare address: a single host).
pub fn parse_network(s: &str) -> Result<(std::net::IpAddr, u8), String> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip: std::net::IpAddr = addr
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not an address or ADDR/LEN network"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        Some(l) => l
            .trim()
            .parse::<u8>()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| format!("{s:?}: prefix length must be 0..={max}"))?,
        None => max,
    };
    Ok((ip, len))
}

fn in_network(ip: std::net::IpAddr, net: std::net::IpAddr, len: u8) -> bool {
    use std::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = if len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(len))
            };
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(len))
            };
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}
