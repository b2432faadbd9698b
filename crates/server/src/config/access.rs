//! Who may use a target: access rules (initiator names, source networks,
//! or a name from a network), LUN masks.
//!
//! A target's access list is a list of rules, and an initiator may log in
//! when ANY rule admits it: each grant widens access, as LIO's and tgt's
//! users expect. An empty list admits everyone.

use std::net::IpAddr;

/// One rule of a target's access list: an initiator name, a source
/// network, or a name from a network (written `NAME@ADDR/LEN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclRule {
    /// The initiator name it admits (exact match); `None`: any name.
    pub initiator: Option<String>,
    /// The network it admits connections from, as (address, prefix
    /// length); `None`: any address.
    pub network: Option<(IpAddr, u8)>,
}

impl AclRule {
    /// A rule admitting one initiator name from anywhere.
    pub fn initiator(name: impl Into<String>) -> Self {
        AclRule {
            initiator: Some(name.into()),
            network: None,
        }
    }

    /// A rule admitting any initiator from a network.
    pub fn network(net: (IpAddr, u8)) -> Self {
        AclRule {
            initiator: None,
            network: Some(net),
        }
    }

    /// Parse a rule as written in `allow = [...]` and `ethersan ctl acl`:
    /// an initiator name (`iqn.…`, `eui.…`, `naa.…`, an NVMe host's
    /// `nqn.…`), a network
    /// (`ADDR/LEN`, or a bare address: one host), or `NAME@ADDR/LEN` (that
    /// name from that network; iSCSI names cannot hold `@`).
    pub fn parse(s: &str) -> Result<AclRule, String> {
        let s = s.trim();
        let is_name = |n: &str| {
            ["iqn.", "eui.", "naa.", "nqn."]
                .iter()
                .any(|p| n.starts_with(p))
        };
        let name = |n: &str| {
            super::validate_initiator_name(n)
                .map(|()| n.to_string())
                .map_err(|e| e.to_string())
        };
        if let Some((n, net)) = s.split_once('@') {
            return Ok(AclRule {
                initiator: Some(name(n.trim())?),
                network: Some(parse_network(net)?),
            });
        }
        if is_name(s) {
            return Ok(AclRule::initiator(name(s)?));
        }
        parse_network(s).map(AclRule::network).map_err(|e| {
            format!("{e}; a rule is an initiator name (iqn.…, eui.…, naa.…, or an NVMe host's nqn.…), a network ADDR/LEN, or NAME@ADDR/LEN")
        })
    }

    /// Whether the rule admits `initiator` connecting from `ip`.
    pub fn admits(&self, initiator: &str, ip: Option<IpAddr>) -> bool {
        self.initiator.as_deref().is_none_or(|n| n == initiator)
            && self
                .network
                .is_none_or(|(net, len)| ip.is_some_and(|ip| in_network(ip, net, len)))
    }

    /// What the rule admits, in words (`initiator iqn.… from 10.0.0.0/8`).
    pub fn meaning(&self) -> String {
        match (&self.initiator, &self.network) {
            (Some(n), Some((a, l))) => format!("initiator {n} from {a}/{l}"),
            (Some(n), None) => format!("initiator {n} from any address"),
            (None, Some((a, l))) => format!("any initiator from {a}/{l}"),
            (None, None) => "any initiator from any address".into(),
        }
    }
}

impl std::fmt::Display for AclRule {
    /// The rule as `parse` reads it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.initiator, &self.network) {
            (Some(n), Some((a, l))) => write!(f, "{n}@{a}/{l}"),
            (Some(n), None) => f.write_str(n),
            (None, Some((a, l))) => write!(f, "{a}/{l}"),
            (None, None) => f.write_str("*"),
        }
    }
}

/// Who may use a target and see its LUNs. Empty rules allow everyone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// The rules; an initiator is allowed when any admits it. Empty: any.
    pub rules: Vec<AclRule>,
    /// Per LUN (by number): the initiators that see it; empty or missing:
    /// every initiator allowed on the target (LUN masking).
    pub luns: Vec<Vec<String>>,
    /// Per LUN: initiators for which it is read-only.
    pub read_only: Vec<Vec<String>>,
}

impl Access {
    /// Whether `initiator` connecting from `ip` may use the target.
    pub fn allows(&self, initiator: &str, ip: Option<IpAddr>) -> bool {
        self.rules.is_empty() || self.rules.iter().any(|r| r.admits(initiator, ip))
    }

    /// Whether every initiator from anywhere may log in (no rules).
    pub fn is_open(&self) -> bool {
        self.rules.is_empty()
    }

    /// The initiator names allowed when every rule names one; empty when
    /// some rule admits any name (from its network) or there are none.
    pub fn initiator_names(&self) -> Vec<String> {
        if self.rules.iter().any(|r| r.initiator.is_none()) {
            return Vec::new();
        }
        let mut names: Vec<String> = self
            .rules
            .iter()
            .filter_map(|r| r.initiator.clone())
            .collect();
        names.dedup();
        names
    }

    /// What the list means, in one line.
    pub fn meaning(&self) -> String {
        if self.rules.is_empty() {
            return "open: any initiator from any address may log in".into();
        }
        let each: Vec<String> = self.rules.iter().map(AclRule::meaning).collect();
        format!("only {}", each.join("; or "))
    }

    /// The rules that mean what the old `allow_initiators` and
    /// `allow_networks` lists meant: a name on the first list AND an
    /// address on the second. One list alone is one rule per entry; both
    /// are one `NAME@NETWORK` rule per pair.
    pub fn rules_from_lists(initiators: &[String], networks: &[(IpAddr, u8)]) -> Vec<AclRule> {
        match (initiators.is_empty(), networks.is_empty()) {
            (_, true) => initiators.iter().cloned().map(AclRule::initiator).collect(),
            (true, false) => networks.iter().copied().map(AclRule::network).collect(),
            (false, false) => initiators
                .iter()
                .flat_map(|n| {
                    networks.iter().map(move |net| AclRule {
                        initiator: Some(n.clone()),
                        network: Some(*net),
                    })
                })
                .collect(),
        }
    }
}

/// Parse `ADDR/LEN` (or a bare address: a single host).
pub fn parse_network(s: &str) -> Result<(IpAddr, u8), String> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip: IpAddr = addr
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

fn in_network(ip: IpAddr, net: IpAddr, len: u8) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    fn access(rules: &[&str]) -> Access {
        Access {
            rules: rules.iter().map(|r| AclRule::parse(r).unwrap()).collect(),
            ..Access::default()
        }
    }

    #[test]
    fn any_rule_admits_a_grant_widens() {
        let a = access(&["iqn.2026-11.x:a"]);
        assert!(a.allows("iqn.2026-11.x:a", ip("192.0.2.1")));
        assert!(!a.allows("iqn.2026-11.x:b", ip("10.0.0.1")));
        // Granting a network keeps the name that was allowed (issue 26:
        // the lists used to be ANDed and this locked it out).
        let b = access(&["iqn.2026-11.x:a", "10.0.0.0/8"]);
        assert!(b.allows("iqn.2026-11.x:a", ip("192.0.2.1")));
        assert!(b.allows("iqn.2026-11.x:b", ip("10.0.0.1")));
        assert!(!b.allows("iqn.2026-11.x:b", ip("192.0.2.1")));
        assert!(Access::default().allows("anyone", None));
    }

    #[test]
    fn a_name_from_a_network_is_one_rule() {
        let a = access(&["iqn.2026-11.x:a@10.1.0.0/16"]);
        assert!(a.allows("iqn.2026-11.x:a", ip("10.1.2.3")));
        assert!(!a.allows("iqn.2026-11.x:a", ip("10.2.0.1")));
        assert!(!a.allows("iqn.2026-11.x:b", ip("10.1.2.3")));
        assert!(!a.allows("iqn.2026-11.x:a", None), "no address, no match");
        assert_eq!(a.rules[0].to_string(), "iqn.2026-11.x:a@10.1.0.0/16");
        assert_eq!(
            a.meaning(),
            "only initiator iqn.2026-11.x:a from 10.1.0.0/16"
        );
    }

    #[test]
    fn rules_parse_and_print_back() {
        for r in [
            "iqn.2026-11.x:a",
            "10.0.0.0/8",
            "::1/128",
            "eui.0123456789abcdef@fd00::/64",
        ] {
            assert_eq!(AclRule::parse(r).unwrap().to_string(), r);
        }
        assert_eq!(
            AclRule::parse("192.0.2.7").unwrap().to_string(),
            "192.0.2.7/32"
        );
        for bad in [
            "10.0.0.0/33",
            "nope",
            "iqn.x y",
            "iqn.2026-11.x:a@",
            "@10.0.0.0/8",
            "::/129",
        ] {
            assert!(AclRule::parse(bad).is_err(), "{bad}");
        }
        let e = AclRule::parse("nope").unwrap_err();
        assert!(e.contains("NAME@ADDR/LEN"), "{e}");
    }

    #[test]
    fn networks_match_by_prefix_and_mapped_addresses() {
        let a = access(&["10.0.0.0/8", "::1"]);
        assert!(a.allows("any", ip("10.1.2.3")) && !a.allows("any", ip("11.0.0.1")));
        assert!(
            a.allows("any", ip("::1")) && !a.allows("any", ip("::2")) && !a.allows("any", None)
        );
        assert!(a.allows("any", ip("::ffff:10.9.9.9")), "IPv4-mapped IPv6");
        assert!(access(&["0.0.0.0/0"]).allows("x", ip("8.8.8.8")));
    }

    #[test]
    fn old_lists_keep_their_meaning_as_rules() {
        let names = vec!["iqn.2026-11.x:a".to_string(), "iqn.2026-11.x:b".to_string()];
        let nets = vec![parse_network("10.0.0.0/8").unwrap()];
        let both = Access {
            rules: Access::rules_from_lists(&names, &nets),
            ..Access::default()
        };
        assert_eq!(both.rules.len(), 2);
        assert!(both.allows("iqn.2026-11.x:b", ip("10.0.0.9")));
        assert!(
            !both.allows("iqn.2026-11.x:b", ip("192.0.2.1")),
            "still ANDed"
        );
        assert!(!both.allows("iqn.2026-11.x:c", ip("10.0.0.9")));
        assert_eq!(Access::rules_from_lists(&names, &[]).len(), 2);
        assert_eq!(Access::rules_from_lists(&[], &nets).len(), 1);
    }

    #[test]
    fn initiator_names_only_when_every_rule_names_one() {
        assert_eq!(
            access(&["iqn.2026-11.x:a", "iqn.2026-11.x:b@10.0.0.0/8"]).initiator_names(),
            ["iqn.2026-11.x:a", "iqn.2026-11.x:b"]
        );
        assert!(access(&["iqn.2026-11.x:a", "10.0.0.0/8"])
            .initiator_names()
            .is_empty());
    }
}
