//! Which targets anyone on the network may use: a portal on a
//! non-loopback address serving a target with no CHAP and no access
//! rules, or AoE (which has no authentication) on a link with no
//! `allowed_macs`. The server warns about them at start and
//! `serve --check` prints the same lines.
//!
//! The native transport is not listed: every frame on it is
//! authenticated with the group secret.

use crate::config::{AoeAddress, Config};

/// The warnings for `cfg`, one line each; empty when nothing is open to
/// the network.
pub fn open_to_anyone(cfg: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let remote: Vec<String> = cfg
        .portals
        .iter()
        .filter(|p| !p.ip().is_loopback())
        .map(|p| p.to_string())
        .collect();
    let open: Vec<&str> = cfg
        .targets
        .iter()
        .filter(|t| t.access.is_open() && t.chap.effective(cfg.chap.as_ref()).is_none())
        .map(|t| t.name.as_str())
        .collect();
    if !remote.is_empty() && !open.is_empty() {
        out.push(format!(
            "portal {} is reachable from the network and target(s) {} have no CHAP and no access rules: anyone who can reach the portal can read and write them; restrict them (ethersan ctl acl add TARGET iqn.…|ADDR/LEN, allow = [...] in the configuration) or require CHAP ([chap] with secret_file), or listen on 127.0.0.1 only",
            remote.join(", "),
            open.join(", ")
        ));
    }
    if !cfg.aoe.links.is_empty() && cfg.aoe.allowed_macs.is_empty() {
        let guarded = |t: &crate::config::TargetConfig| {
            t.chap.effective(cfg.chap.as_ref()).is_some() || !t.access.is_open()
        };
        let exported: Vec<&str> = cfg
            .targets
            .iter()
            .filter(|t| {
                t.luns.iter().any(|l| match l.aoe {
                    AoeAddress::Default => !guarded(t),
                    AoeAddress::At { .. } => true,
                    _ => false,
                })
            })
            .map(|t| t.name.as_str())
            .collect();
        if !exported.is_empty() {
            let links: Vec<String> = cfg.aoe.links.iter().map(|l| l.to_string()).collect();
            out.push(format!(
                "AoE on {} exports LUNs of {} to any host on the link: AoE has no authentication; list the initiators' MAC addresses in [aoe] allowed_macs",
                links.join(", "),
                exported.join(", ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::from_toml_str(text, "t").unwrap()
    }

    const TARGET: &str = "[[target]]\nname = \"iqn.2026-11.org.x:t\"\nlun = [\"ram:1M\"]\n";

    #[test]
    fn an_open_target_on_a_remote_portal_is_named() {
        let w = open_to_anyone(&config(&format!("portals = [\"0.0.0.0:3260\"]\n{TARGET}")));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("0.0.0.0:3260") && w[0].contains("iqn.2026-11.org.x:t"),
            "{w:?}"
        );
        // Loopback only, a rule, or CHAP: nothing to say.
        assert!(open_to_anyone(&config(&format!(
            "portals = [\"127.0.0.1:3260\", \"[::1]:3260\"]\n{TARGET}"
        )))
        .is_empty());
        assert!(open_to_anyone(&config(&format!(
            "portals = [\"0.0.0.0:3260\"]\n{TARGET}allow = [\"10.0.0.0/8\"]\n"
        )))
        .is_empty());
        assert!(open_to_anyone(&config(&format!(
            "portals = [\"0.0.0.0:3260\"]\n[chap]\nuser = \"u\"\nsecret = \"a-secret-of-12+\"\n{TARGET}"
        )))
        .is_empty());
        // A target opting out of the global CHAP is open again.
        let w = open_to_anyone(&config(&format!(
            "portals = [\"0.0.0.0:3260\"]\n[chap]\nuser = \"u\"\nsecret = \"a-secret-of-12+\"\n{TARGET}chap = \"none\"\n"
        )));
        assert_eq!(w.len(), 1, "{w:?}");
    }

    #[test]
    fn aoe_without_allowed_macs_is_named() {
        let w = open_to_anyone(&config(&format!(
            "portals = [\"127.0.0.1:3260\"]\n[aoe]\ninterfaces = [\"eth9\"]\n{TARGET}"
        )));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("AoE on eth9") && w[0].contains("allowed_macs"),
            "{w:?}"
        );
        assert!(open_to_anyone(&config(&format!(
            "portals = [\"127.0.0.1:3260\"]\n[aoe]\ninterfaces = [\"eth9\"]\nallowed_macs = [\"02:00:00:00:00:01\"]\n{TARGET}"
        )))
        .is_empty());
    }
}
