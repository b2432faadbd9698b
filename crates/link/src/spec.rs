//! Naming a link: a network interface, or a unix datagram socket pair in
//! QEMU's `-netdev dgram` manner, parsed from the one text form the
//! server's options and the client's URLs share.

use std::path::PathBuf;

use crate::MacAddr;

/// One Ethernet link as a configuration or a URL names it: the AoE
/// target's and the native transport's links (`serve --aoe`, `--eth`,
/// `[aoe] links`) and the client's `aoe://` URLs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkSpec {
    /// A network interface, through an AF_PACKET socket (needs
    /// CAP_NET_RAW).
    Interface(String),
    /// A unix datagram socket pair, one datagram per Ethernet frame, as
    /// QEMU's `-netdev dgram` speaks it: ethersan binds `local` and sends
    /// to `peer`.
    Unix {
        /// The socket ethersan binds.
        local: PathBuf,
        /// The socket of the other end (QEMU's `local.path`).
        peer: PathBuf,
        /// Our MAC (random, locally administered, when not given).
        mac: Option<MacAddr>,
        /// Payload bytes per frame.
        mtu: usize,
    },
}

impl LinkSpec {
    /// Parse `IFACE` or `unix:LOCAL,peer=PEER[,mac=MAC][,mtu=N]`.
    pub fn parse(spec: &str) -> Result<LinkSpec, String> {
        Self::parse_option(spec, "--aoe")
    }

    /// [`parse`](Self::parse), naming `option` in error messages.
    pub fn parse_option(spec: &str, option: &str) -> Result<LinkSpec, String> {
        let Some(rest) = spec.strip_prefix("unix:") else {
            if spec.is_empty() || spec.contains(['/', ',', ' ']) || spec.len() > 15 {
                return Err(format!(
                    "{option} {spec:?}: give a network interface name (see `ip link`) or unix:LOCAL.sock,peer=PEER.sock"
                ));
            }
            return Ok(LinkSpec::Interface(spec.to_string()));
        };
        let mut parts = rest.split(',');
        let local = PathBuf::from(parts.next().unwrap_or(""));
        let (mut peer, mut mac, mut mtu) = (None, None, crate::DEFAULT_MTU);
        for p in parts {
            match p.split_once('=') {
                Some(("peer", v)) if !v.is_empty() => peer = Some(PathBuf::from(v)),
                Some(("mac", v)) => {
                    mac = Some(
                        v.parse::<MacAddr>()
                            .map_err(|e| format!("{option} {spec:?}: mac: {e}"))?,
                    )
                }
                Some(("mtu", v)) => {
                    mtu = v
                        .parse::<usize>()
                        .ok()
                        .filter(|m| (1024..=crate::MAX_MTU).contains(m))
                        .ok_or_else(|| {
                            format!(
                                "{option} {spec:?}: mtu must be a number from 1024 to {}",
                                crate::MAX_MTU
                            )
                        })?
                }
                _ => {
                    return Err(format!(
                        "{option} {spec:?}: unknown option {p:?} (known: peer=PATH, mac=MAC, mtu=N)"
                    ))
                }
            }
        }
        if local.as_os_str().is_empty() {
            return Err(format!(
                "{option} {spec:?}: unix: needs the socket path to bind, as unix:LOCAL.sock,peer=PEER.sock"
            ));
        }
        let peer = peer.ok_or_else(|| {
            format!(
                "{option} {spec:?}: needs peer=PATH, the other end's socket (QEMU's local.path)"
            )
        })?;
        Ok(LinkSpec::Unix {
            local,
            peer,
            mac,
            mtu,
        })
    }
}

impl std::fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkSpec::Interface(i) => f.write_str(i),
            LinkSpec::Unix { local, peer, .. } => {
                write!(f, "unix:{},peer={}", local.display(), peer.display())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_parse_or_say_what_is_wrong() {
        assert_eq!(
            LinkSpec::parse("eth0").unwrap(),
            LinkSpec::Interface("eth0".into())
        );
        let l = LinkSpec::parse("unix:/run/a.sock,peer=/run/b.sock,mtu=9000,mac=02:00:00:00:00:01")
            .unwrap();
        assert_eq!(
            l,
            LinkSpec::Unix {
                local: "/run/a.sock".into(),
                peer: "/run/b.sock".into(),
                mac: Some("02:00:00:00:00:01".parse().unwrap()),
                mtu: 9000
            }
        );
        assert!(LinkSpec::parse("unix:/a.sock")
            .unwrap_err()
            .contains("peer=PATH"));
        assert!(LinkSpec::parse("unix:/a,peer=/b,mtu=99")
            .unwrap_err()
            .contains("mtu must be"));
        assert!(LinkSpec::parse("unix:/a,peer=/b,speed=1")
            .unwrap_err()
            .contains("unknown option"));
        assert!(LinkSpec::parse("").unwrap_err().contains("ip link"));
    }
}
