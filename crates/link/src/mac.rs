//! Ethernet MAC addresses (IEEE 802): parsing, printing and the
//! broadcast, multicast (group) and locally administered bits.

use std::fmt;
use std::str::FromStr;

/// A 48-bit Ethernet MAC address, in transmission order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The broadcast address `ff:ff:ff:ff:ff:ff`.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// The all-zero address, never a valid station address.
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// The six octets.
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }

    /// Whether this is `ff:ff:ff:ff:ff:ff`.
    pub fn is_broadcast(self) -> bool {
        self == Self::BROADCAST
    }

    /// Whether the group (I/G) bit is set: multicast, broadcast included.
    pub const fn is_multicast(self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// Whether this is an individual (unicast) address.
    pub const fn is_unicast(self) -> bool {
        !self.is_multicast()
    }

    /// Whether the locally administered (U/L) bit is set.
    pub const fn is_locally_administered(self) -> bool {
        self.0[0] & 0x02 != 0
    }

    /// A random unicast, locally administered address (`x2:`, `x6:`,
    /// `xa:` or `xe:` first octet), as QEMU and the kernel's
    /// `eth_random_addr` make them.
    pub fn random_local() -> MacAddr {
        let mut seed = [0u8; 8];
        // getrandom(2) cannot fail for 8 bytes once the pool is ready; fall
        // back to the clock and the address of a stack slot if it does.
        // SAFETY: writes at most 8 bytes into `seed`, which is 8 bytes long.
        let n = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), seed.len(), 0) };
        let mut x = if n == 8 {
            u64::from_ne_bytes(seed)
        } else {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            t ^ (&seed as *const _ as u64).rotate_left(32) ^ u64::from(std::process::id())
        };
        let mut octets = [0u8; 6];
        for o in &mut octets {
            x = crate::memory::splitmix64(&mut x);
            *o = x as u8;
        }
        octets[0] = (octets[0] & 0xfc) | 0x02;
        MacAddr(octets)
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(octets: [u8; 6]) -> Self {
        MacAddr(octets)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            o[0], o[1], o[2], o[3], o[4], o[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A string that is not a MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a MAC address (six hex octets separated by ':' or '-', e.g. 02:00:00:00:00:01)")]
pub struct MacAddrParseError {
    input: String,
}

impl FromStr for MacAddr {
    type Err = MacAddrParseError;

    /// Parses `aa:bb:cc:dd:ee:ff` or `aa-bb-cc-dd-ee-ff` (either case; one
    /// or two hex digits per octet).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || MacAddrParseError {
            input: s.to_string(),
        };
        let sep = if s.contains('-') { '-' } else { ':' };
        let mut octets = [0u8; 6];
        let mut parts = s.split(sep);
        for o in &mut octets {
            let p = parts.next().ok_or_else(err)?;
            if p.is_empty() || p.len() > 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddr(octets))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip() {
        let m = MacAddr([0x02, 0xab, 0x00, 0x10, 0xff, 0x7]);
        assert_eq!(m.to_string(), "02:ab:00:10:ff:07");
        assert_eq!("02:ab:00:10:ff:07".parse::<MacAddr>().unwrap(), m);
        assert_eq!("02-AB-00-10-FF-07".parse::<MacAddr>().unwrap(), m);
        assert_eq!("2:ab:0:10:ff:7".parse::<MacAddr>().unwrap(), m);
        assert_eq!(format!("{m:?}"), "02:ab:00:10:ff:07");
    }

    #[test]
    fn parse_rejects_malformed() {
        for bad in [
            "",
            "02:ab:00:10:ff",
            "02:ab:00:10:ff:07:01",
            "02:ab:00:10:ff:g7",
            "02:ab:00:10:ff:007",
            "02:ab::10:ff:07",
            "02:ab-00:10:ff:07",
            "+2:ab:00:10:ff:07",
        ] {
            let e = bad.parse::<MacAddr>().unwrap_err();
            assert!(e.to_string().contains("is not a MAC address"), "{bad}: {e}");
        }
    }

    #[test]
    fn bits() {
        assert!(MacAddr::BROADCAST.is_broadcast());
        assert!(MacAddr::BROADCAST.is_multicast());
        let mcast: MacAddr = "01:00:5e:00:00:01".parse().unwrap();
        assert!(mcast.is_multicast() && !mcast.is_broadcast() && !mcast.is_unicast());
        let global: MacAddr = "00:1b:21:0a:0b:0c".parse().unwrap();
        assert!(global.is_unicast() && !global.is_locally_administered());
    }

    #[test]
    fn random_local_is_unicast_local_and_varies() {
        let a = MacAddr::random_local();
        let b = MacAddr::random_local();
        for m in [a, b] {
            assert!(m.is_unicast() && m.is_locally_administered(), "{m}");
        }
        assert_ne!(a, b);
    }
}
