//! What `ethersan serve` says once it listens: each portal and where it
//! is reached, and how to connect to the first target (or, for log
//! collectors, the portals as log events); the warning about targets
//! anyone on the network can write, in both cases.

use ethersan_server::config::{ChapConfig, Config, TargetConfig};
use ethersan_server::Server;

/// Say where `server` listens and how to connect (nothing but log events
/// with `json_logs`).
pub(crate) fn announce(server: &Server, cfg: &Config, json_logs: bool, say: &crate::Say) {
    let portals = server.portals().list();
    if json_logs {
        // Log collectors get events, not a banner.
        for p in &portals {
            let reachable: Vec<String> = p.announced(None).iter().map(|a| a.to_string()).collect();
            tracing::info!(portal = %p.address, advertise = p.advertise.map(tracing::field::display), reachable = %reachable.join(", "), "listening");
        }
    }
    for w in ethersan_server::exposure::open_to_anyone(cfg) {
        tracing::warn!("{w}");
    }
    if json_logs {
        return;
    }
    for p in &portals {
        crate::line(say, format_args!("ethersan: listening on {}", p.address));
        if let Some(a) = p.advertise {
            crate::line(
                say,
                format_args!("ethersan: portal {} is advertised as {a}", p.address),
            );
        } else if p.is_wildcard() {
            // 0.0.0.0 is no address to connect to: name the real ones.
            let reachable = p.announced(None);
            crate::line(
                say,
                format_args!(
                    "ethersan: portal {} answers on this host's addresses: {}",
                    p.address,
                    if reachable.is_empty() {
                        "(none found)".to_string()
                    } else {
                        reachable
                            .iter()
                            .map(|a| a.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
            );
        }
    }
    if let (Some(p), Some(t)) = (portals.first(), cfg.targets.first()) {
        // Initiators reach it at the address it is advertised as (a
        // wildcard portal: at the host's first address).
        let addr = p.announced(None).first().copied().unwrap_or(p.address);
        crate::line(
            say,
            format_args!("{}", connect_hint(&addr.to_string(), t, cfg.chap.as_ref())),
        );
    }
}

/// How to reach target `t` at `addr`, with the CHAP user when logins need
/// CHAP (the secret is never printed: `SECRET` stands for it).
fn connect_hint(addr: &str, t: &TargetConfig, global_chap: Option<&ChapConfig>) -> String {
    let name = &t.name;
    match t.chap.effective(global_chap) {
        None => format!(
            "ethersan: connect with\n  libiscsi/QEMU: iscsi://{addr}/{name}/0\n  ethersan:      ethersan ls iscsi://{addr}/{name}\n  open-iscsi:    iscsiadm -m discovery -t sendtargets -p {addr}\n                 iscsiadm -m node -T {name} -p {addr} --login"
        ),
        Some(c) => {
            let user = &c.initiator.user;
            format!(
                "ethersan: connect with (CHAP required: user {user}; SECRET is the secret given to the server)\n  libiscsi/QEMU: iscsi://{user}%SECRET@{addr}/{name}/0\n  ethersan:      ethersan ls --chap {user}:SECRET iscsi://{addr}/{name}   (or $ETHERSAN_CHAP)\n  open-iscsi:    iscsiadm -m discovery -t sendtargets -p {addr}{disc}\n                 iscsiadm -m node -T {name} -p {addr} -o update -n node.session.auth.authmethod -v CHAP\n                 iscsiadm -m node -T {name} -p {addr} -o update -n node.session.auth.username -v {user}\n                 iscsiadm -m node -T {name} -p {addr} -o update -n node.session.auth.password -v SECRET\n                 iscsiadm -m node -T {name} -p {addr} --login",
                disc = if c.discovery {
                    "   (discovery needs CHAP too: set discovery.sendtargets.auth.* in /etc/iscsi/iscsid.conf)"
                } else {
                    ""
                }
            )
        }
    }
}
