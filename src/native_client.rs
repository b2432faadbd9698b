//! `ethersan discover --eth IFACE` / `--udp HOST[:PORT]`: ask the native
//! transport's group who serves, and list each answering server's targets
//! and LUNs (capacity, block size, the security each LUN needs). Other
//! commands take eth:// and udp:// URLs through the iSCSI code paths.

use std::time::Duration;

use ethersan_client::native;
use ethersan_client::url::{IscsiUrl, Transport};
use ethersan_client::ConnectArgs;
use serde::Serialize;

#[derive(Serialize)]
struct Server {
    server: String,
    address: String,
    targets: Vec<Target>,
}

#[derive(Serialize)]
struct Target {
    name: String,
    alias: Option<String>,
    luns: Vec<Lun>,
}

#[derive(Serialize)]
struct Lun {
    lun: u64,
    bytes: u64,
    block_size: u32,
    security: String,
    url: String,
}

pub(crate) async fn cmd_discover(
    spec: &str,
    how: &ConnectArgs,
    timeout_given: bool,
    json: bool,
) -> anyhow::Result<()> {
    let url = IscsiUrl::parse(spec)?;
    let keys = how.group_keys()?;
    let wait = match how.timeout.0 {
        Some(t) if timeout_given => t,
        _ => native::DISCOVER_WAIT,
    };
    let found = native::discover(&url, &keys, wait).await?;
    let scheme_host = match &url.transport {
        Transport::Eth(_) => format!("eth://{}", url.host),
        _ => format!("udp://{}", url.portal()),
    };
    let list: Vec<Server> = found
        .into_iter()
        .map(|(peer, c)| Server {
            server: c.server,
            address: peer.to_string(),
            targets: c
                .targets
                .into_iter()
                .map(|t| Target {
                    luns: t
                        .luns
                        .iter()
                        .map(|l| Lun {
                            lun: l.lun,
                            bytes: l.blocks.saturating_mul(u64::from(l.block_size)),
                            block_size: l.block_size,
                            security: l.level.to_string(),
                            url: format!("{scheme_host}/{}/{}", t.name, l.lun),
                        })
                        .collect(),
                    name: t.name,
                    alias: t.alias,
                })
                .collect(),
        })
        .collect();
    if json {
        out!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for s in &list {
            out!("{} ({})", s.server, s.address);
            for t in &s.targets {
                out!("  {}", t.name);
                for l in &t.luns {
                    out!(
                        "    LUN {}: {} bytes, {}-byte blocks, security {}: {}",
                        l.lun,
                        l.bytes,
                        l.block_size,
                        l.security,
                        l.url
                    );
                }
            }
        }
    }
    if list.is_empty() {
        // Nothing found is a failure (exit status 1), as for every form
        // of discover.
        anyhow::bail!(
            "no member of group {:?} answered within {} ({scheme_host}): check the group name and secret (a wrong one gets no answer) and that a target serves the native transport there",
            keys.group(),
            secs(wait)
        );
    }
    Ok(())
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
