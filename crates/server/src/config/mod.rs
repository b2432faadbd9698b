//! The server's configuration model: portals, targets, LUNs and options,
//! from a TOML file or from the command line's `--lun` specs.
//!
//! Every error names where it comes from: `FILE:LINE:COL: what is wrong`
//! for files, the spec itself for the command line. The schema is
//! documented in `docs/config.md`; `examples/ethersan.toml` shows every key.

mod access;
mod aoe;
mod ethernet;
mod lun;
mod nvme;
mod options;
mod save;
mod toml_form;
mod values;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use access::{parse_network, Access, AclRule};
pub use aoe::{parse_macs, AoeAddress, AoeConfig, AoeLink};
pub use ethernet::{parse_ethertype, EthernetConfig, UdpPortal};
pub use lun::{Backing, LunConfig, DEFAULT_ENGINE};
pub use nvme::{NvmeConfig, NVME_TCP_PORT};
pub use options::{
    GatewayState, Options, Placement, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    DEFAULT_MAX_KEY_TEXT_BYTES, DEFAULT_MAX_LOGINS_IN_PROGRESS, MIN_KEY_TEXT_BYTES,
};
pub use save::EditedToml;
pub use values::{format_naa, parse_naa, parse_size, validate_initiator_name, validate_name};

/// A configuration error, with its origin.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {cause}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        cause: std::io::Error,
    },
    /// A problem at a known place in a file.
    #[error("{origin}:{line}:{col}: {msg}")]
    At {
        /// File name.
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What is wrong.
        msg: String,
    },
    /// A problem in a value given on the command line (or with no place).
    #[error("{0}")]
    Invalid(String),
}

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Portals (one portal group, tag 1); every target is reachable on each.
    pub portals: Vec<SocketAddr>,
    /// The address SendTargets announces for a portal instead of the one
    /// it listens on (NAT, containers): listen address → announced
    /// address. Portals not in the map announce their own address.
    pub advertise: std::collections::BTreeMap<SocketAddr, SocketAddr>,
    /// Exported targets.
    pub targets: Vec<TargetConfig>,
    /// Protocol and runtime options.
    pub options: Options,
    /// CHAP: when set, every login (normal, and discovery unless
    /// `chap_discovery` is off) must authenticate.
    pub chap: Option<ChapConfig>,
    /// `[discovery.chap]`: discovery sessions' own credentials, overriding
    /// `chap` (and its `discovery` switch) for them.
    pub discovery_chap: Option<ChapConfig>,
    /// `[aoe]`: the AoE target's links and access list.
    pub aoe: AoeConfig,
    /// `[ethernet]`: the native transport's links, UDP portals and group.
    pub ethernet: EthernetConfig,
    /// `[nvme]` (or `serve --nvme`): the NVMe/TCP target's portals.
    pub nvme: NvmeConfig,
    /// `[isns]` (or `serve --isns`): register with an iSNS server.
    pub isns: Option<IsnsConfig>,
}

/// `[isns]`: where to register the targets, portals and discovery domains
/// (RFC 4171); see `docs/isns.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsnsConfig {
    /// The iSNS server's host name or address.
    pub host: String,
    /// Its TCP port (3205 by default).
    pub port: u16,
    /// Portal addresses to register instead of the listening ones (for
    /// initiators behind NAT, e.g. QEMU's user networking); empty: the
    /// portals, an unspecified address (`0.0.0.0`, `[::]`) replaced by
    /// the local address of the connection to the iSNS server.
    pub portals: Vec<SocketAddr>,
    /// The network entity's identifier (default: `HOSTNAME.ethersan`).
    pub entity: Option<String>,
}

impl IsnsConfig {
    /// Parse `HOST[:PORT]` (IPv6 addresses in brackets: `[::1]:3205`).
    pub fn parse_server(s: &str) -> Result<IsnsConfig, String> {
        let bad = || format!("iSNS server {s:?} is not HOST[:PORT] (IPv6 as [::1]:3205)");
        let s = s.trim();
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (h, after) = rest.split_once(']').ok_or_else(bad)?;
            match after {
                "" => (h, None),
                p => (h, Some(p.strip_prefix(':').ok_or_else(bad)?)),
            }
        } else {
            match s.split_once(':') {
                Some((h, p)) if !p.contains(':') => (h, Some(p)),
                Some(_) => return Err(bad()),
                None => (s, None),
            }
        };
        if host.is_empty() || host.contains(char::is_whitespace) {
            return Err(bad());
        }
        let port = match port {
            None => ethersan_isns::DEFAULT_PORT,
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(bad)?,
        };
        Ok(IsnsConfig {
            host: host.to_string(),
            port,
            portals: Vec::new(),
            entity: None,
        })
    }

    /// `HOST:PORT` to connect to (IPv6 in brackets).
    pub fn server(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// CHAP settings (`[chap]`, or `serve --chap` / `--mutual-chap`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapConfig {
    /// Name and secret initiators must prove.
    pub initiator: ethersan_proto::chap::Credentials,
    /// The target's own, for mutual CHAP.
    pub target: Option<ethersan_proto::chap::Credentials>,
    /// Discovery sessions authenticate too (meaningful in the global
    /// `[chap]` only; `[discovery.chap]` and `[target.chap]` set it true).
    pub discovery: bool,
}

/// One target.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// iSCSI name (iqn., eui. or naa.).
    pub name: String,
    /// TargetAlias.
    pub alias: Option<String>,
    /// LUNs, in order; see [`TargetConfig::numbered`] for their numbers.
    pub luns: Vec<LunConfig>,
    /// Who may log in to the target (and see it in SendTargets).
    pub access: Access,
    /// CHAP for logins to this target: the global `[chap]` (inherit),
    /// none at all (`chap = "none"`), or its own `[target.chap]`.
    pub chap: TargetChap,
}

/// How logins to one target authenticate (`chap` of a `[[target]]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TargetChap {
    /// As the global `[chap]` says (no `chap` key in the target's table).
    #[default]
    Inherit,
    /// No CHAP for this target even when a global `[chap]` is set
    /// (`chap = "none"`): anyone its access lists admit logs in.
    None,
    /// This target's own credentials (`[target.chap]`), overriding the
    /// global `[chap]` for logins to it.
    Chap(ChapConfig),
}

impl TargetChap {
    /// The CHAP settings logins to this target must satisfy, given the
    /// global `[chap]`; `None` when they need no CHAP.
    pub fn effective<'a>(&'a self, global: Option<&'a ChapConfig>) -> Option<&'a ChapConfig> {
        match self {
            TargetChap::Inherit => global,
            TargetChap::None => None,
            TargetChap::Chap(c) => Some(c),
        }
    }
}

impl TargetConfig {
    /// Each LUN's number and its place in [`TargetConfig::luns`] (which
    /// indexes the per-LUN lists of [`Access`]): its `number` when given,
    /// else the one after the previous LUN's (the first: 0).
    pub fn numbered(&self) -> Vec<(u64, usize)> {
        let mut next = 0u64;
        self.luns
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let n = l.number.unwrap_or(next);
                next = n.saturating_add(1);
                (n, i)
            })
            .collect()
    }

    /// The LUN numbered `n`: its place in [`TargetConfig::luns`].
    pub fn lun_index(&self, n: u64) -> Option<usize> {
        self.numbered()
            .into_iter()
            .find(|(m, _)| *m == n)
            .map(|(_, i)| i)
    }
}

impl Config {
    /// The embedded default: 127.0.0.1:3260, target
    /// `iqn.2026-11.org.ethersan:default`, LUN 0 a 1 GiB sparse file in `data_dir`.
    pub fn embedded_default(data_dir: &Path) -> Config {
        let options = Options {
            data_dir: data_dir.to_path_buf(),
            ..Options::default()
        };
        Config {
            portals: vec![SocketAddr::from(([127, 0, 0, 1], 3260))],
            advertise: Default::default(),
            targets: vec![TargetConfig {
                name: "iqn.2026-11.org.ethersan:default".into(),
                alias: Some("ethersan default".into()),
                access: Access::default(),
                chap: TargetChap::Inherit,
                luns: vec![LunConfig {
                    backing: Backing::File {
                        path: data_dir.join("default-lun0.img"),
                        size: Some(1 << 30),
                    },
                    read_only: false,
                    removable: false,
                    block_size: 512,
                    serial: None,
                    naa: None,
                    write_cache: true,
                    preallocate: false,
                    physical_block_size: 4096,
                    direct: false,
                    engine: DEFAULT_ENGINE,
                    sanitize_rate: None,
                    aoe: AoeAddress::Default,
                    security: ethersan_channel::Level::default(),
                    number: None,
                    shared: false,
                }],
            }],
            options,
            chap: None,
            discovery_chap: None,
            aoe: AoeConfig::default(),
            ethernet: EthernetConfig::default(),
            nvme: NvmeConfig::default(),
            isns: None,
        }
    }
}

/// The first LUN whose backing file an earlier LUN also uses with one of
/// them writable (and not both `shared`), as (target index, LUN index,
/// message). Two LUNs writing one file each keep their own cache,
/// reservations and identity: they corrupt each other's data.
pub fn shared_backing_file(targets: &[TargetConfig]) -> Option<(usize, usize, String)> {
    // (file, where, read-only or shared: locked shared)
    let mut seen: Vec<(PathBuf, String, bool)> = Vec::new();
    for (ti, t) in targets.iter().enumerate() {
        for (li, l) in t.luns.iter().enumerate() {
            let Backing::File { path, .. } = &l.backing else {
                continue;
            };
            let key = same_file_key(path);
            let here = format!("target {} LUN {li}", t.name);
            if let Some((_, there, ro)) = seen.iter().find(|(k, _, _)| *k == key) {
                if !(*ro && (l.read_only || l.shared)) {
                    return Some((
                        ti,
                        li,
                        format!(
                            "{} is already the backing file of {there}: two LUNs writing one file corrupt each other's data; export it once (every portal reaches it) or make both LUNs read-only (or shared = true on both, if something else keeps them coherent)",
                            path.display()
                        ),
                    ));
                }
            }
            seen.push((key, here, l.read_only || l.shared));
        }
    }
    None
}

/// One name for each file however it is written (`a.img`, `./a.img`, a
/// symbolic link), whether or not it exists yet.
fn same_file_key(path: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match (std::fs::canonicalize(parent), path.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}
