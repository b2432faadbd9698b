//! The AoE part of the configuration: which Ethernet links the AoE target
//! serves, each LUN's shelf.slot address, and the MAC addresses allowed to
//! use the devices (`serve --aoe`, `aoe=` in a `--lun` spec, `[aoe]` in a
//! config file).

use ethersan_link::MacAddr;

pub use ethersan_link::spec::LinkSpec as AoeLink;

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
    fn addresses_and_macs_parse_or_say_what_is_wrong() {
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
