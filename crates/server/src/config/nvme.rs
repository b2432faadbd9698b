//! The NVMe/TCP part of the configuration (`serve --nvme`; `[nvme]` in a
//! config file): the addresses the NVMe/TCP target front end listens on.

use std::net::{IpAddr, SocketAddr};

/// The NVMe/TCP port IANA assigned (TP 8000).
pub const NVME_TCP_PORT: u16 = 4420;

/// `[nvme]`: the NVMe/TCP target is on when `portals` is not empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmeConfig {
    /// Addresses to listen on (each serves every subsystem and the
    /// discovery controller).
    pub portals: Vec<SocketAddr>,
}

impl NvmeConfig {
    /// Whether the NVMe/TCP target is configured at all.
    pub fn enabled(&self) -> bool {
        !self.portals.is_empty()
    }

    /// Parse `ADDR:PORT`, or `ADDR` alone for port 4420 (IPv6 in brackets
    /// with a port: `[::1]:4420`; bare `::1` is an address).
    pub fn parse_portal(s: &str) -> Result<SocketAddr, String> {
        let t = s.trim();
        if let Ok(a) = t.parse::<SocketAddr>() {
            return Ok(a);
        }
        let bare = t
            .strip_prefix('[')
            .and_then(|x| x.strip_suffix(']'))
            .unwrap_or(t);
        bare.parse::<IpAddr>()
            .map(|ip| SocketAddr::new(ip, NVME_TCP_PORT))
            .map_err(|_| {
                format!("NVMe/TCP portal {s:?} is not ADDR[:PORT] (e.g. 0.0.0.0:4420, 127.0.0.1 or [::1]:4420)")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portal_forms() {
        let p = |s| NvmeConfig::parse_portal(s);
        assert_eq!(p("127.0.0.1:4421").unwrap().to_string(), "127.0.0.1:4421");
        assert_eq!(p("127.0.0.1").unwrap().to_string(), "127.0.0.1:4420");
        assert_eq!(p("::1").unwrap().to_string(), "[::1]:4420");
        assert_eq!(p("[::1]").unwrap().to_string(), "[::1]:4420");
        assert_eq!(p("[::1]:9").unwrap().to_string(), "[::1]:9");
        assert!(p("host:4420").is_err());
        assert!(p("").is_err());
    }
}
