//! The AoE part of the configuration: which Ethernet links the AoE target
//! serves, each LUN's shelf.slot address, and the MAC addresses allowed to
//! use the devices (`serve --aoe`, `aoe=` in a `--lun` spec, `[aoe]` in a
//! config file).

use std::path::PathBuf;

use ethersan_link::MacAddr;

/// `[aoe]`, or `serve --aoe`: the AoE target is on when `links` is not
/// empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AoeConfig {
    /// The links to serve on.
    pub links: Vec<AoeLink>,
    /// Initiator MACs allowed to issue commands (the devices' initial MAC
    /// mask list); empty: any.
    pub allowed_macs: Vec<MacAddr>,
}

/// One Ethernet link of the AoE target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AoeLink {
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

impl AoeLink {
    /// Parse `IFACE` or `unix:LOCAL,peer=PEER[,mac=MAC][,mtu=N]`.
    pub fn parse(spec: &str) -> Result<AoeLink, String> {
        Self::parse_option(spec, "--aoe")
    }

    /// [`parse`](Self::parse), naming `option` in error messages.
    pub fn parse_option(spec: &str, option: &str) -> Result<AoeLink, String> {
        let Some(rest) = spec.strip_prefix("unix:") else {
            if spec.is_empty() || spec.contains(['/', ',', ' ']) || spec.len() > 15 {
                return Err(format!(
                    "{option} {spec:?}: give a network interface name (see `ip link`) or unix:LOCAL.sock,peer=PEER.sock"
                ));
            }
            return Ok(AoeLink::Interface(spec.to_string()));
        };
        let mut parts = rest.split(',');
        let local = PathBuf::from(parts.next().unwrap_or(""));
        let (mut peer, mut mac, mut mtu) = (None, None, ethersan_link::DEFAULT_MTU);
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
                        .filter(|m| (1024..=ethersan_link::MAX_MTU).contains(m))
                        .ok_or_else(|| {
                            format!(
                                "{option} {spec:?}: mtu must be a number from 1024 to {}",
                                ethersan_link::MAX_MTU
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
        Ok(AoeLink::Unix {
            local,
            peer,
            mac,
            mtu,
        })
    }
}

impl std::fmt::Display for AoeLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AoeLink::Interface(i) => f.write_str(i),
            AoeLink::Unix { local, peer, .. } => {
                write!(f, "unix:{},peer={}", local.display(), peer.display())
            }
        }
    }
}

/// Where a LUN appears over AoE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AoeAddress {
    /// Shelf = the target's position in the configuration (from 0), slot =
    /// the LUN number.
    #[default]
    Default,
    /// This shelf and slot.
    At {
        /// Shelf (major), 0 to 65534.
        shelf: u16,
        /// Slot (minor), 0 to 254.
        slot: u8,
    },
    /// Not exported over AoE.
    Off,
}

impl std::str::FromStr for AoeAddress {
    type Err = String;

    /// `SHELF.SLOT` or `off`.
    fn from_str(s: &str) -> Result<AoeAddress, String> {
        if s == "off" {
            return Ok(AoeAddress::Off);
        }
        let bad =
            || format!("aoe = {s:?}: give SHELF.SLOT (shelf 0-65534, slot 0-254; e.g. 0.1) or off");
        let (shelf, slot) = s.split_once('.').ok_or_else(bad)?;
        let shelf: u16 = shelf.parse().map_err(|_| bad())?;
        let slot: u8 = slot.parse().map_err(|_| bad())?;
        // 0xffff and 0xff are the protocol's broadcast addresses.
        if shelf == u16::MAX || slot == u8::MAX {
            return Err(bad());
        }
        Ok(AoeAddress::At { shelf, slot })
    }
}

/// Parse a list of MAC addresses (`allowed_macs`).
pub fn parse_macs(list: &[String]) -> Result<Vec<MacAddr>, String> {
    list.iter()
        .map(|m| {
            m.parse::<MacAddr>()
                .map_err(|e| format!("allowed_macs: {m:?}: {e}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_addresses_parse_or_say_what_is_wrong() {
        assert_eq!(
            AoeLink::parse("eth0").unwrap(),
            AoeLink::Interface("eth0".into())
        );
        let l = AoeLink::parse("unix:/run/a.sock,peer=/run/b.sock,mtu=9000,mac=02:00:00:00:00:01")
            .unwrap();
        assert_eq!(
            l,
            AoeLink::Unix {
                local: "/run/a.sock".into(),
                peer: "/run/b.sock".into(),
                mac: Some("02:00:00:00:00:01".parse().unwrap()),
                mtu: 9000
            }
        );
        assert!(AoeLink::parse("unix:/a.sock")
            .unwrap_err()
            .contains("peer=PATH"));
        assert!(AoeLink::parse("unix:/a,peer=/b,mtu=99")
            .unwrap_err()
            .contains("mtu must be"));
        assert!(AoeLink::parse("unix:/a,peer=/b,speed=1")
            .unwrap_err()
            .contains("unknown option"));
        assert!(AoeLink::parse("").unwrap_err().contains("ip link"));
        assert_eq!(
            "3.7".parse::<AoeAddress>(),
            Ok(AoeAddress::At { shelf: 3, slot: 7 })
        );
        assert_eq!("off".parse::<AoeAddress>(), Ok(AoeAddress::Off));
        for bad in ["3", "x.1", "1.255", "65535.0", "1.256", "-1.0"] {
            assert!(bad.parse::<AoeAddress>().is_err(), "{bad}");
        }
        assert!(parse_macs(&["zz".into()])
            .unwrap_err()
            .contains("allowed_macs"));
    }
}
