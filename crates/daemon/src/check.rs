//! `serve --check`: what a configuration would serve, or the first thing
//! wrong with it, creating and serving nothing; and the data directory a
//! configuration's default LUN files go into.

use std::fmt::Write as _;

use ethersan_server::config::{Backing, Config, LunConfig};

use crate::DaemonError;

/// What `serve --check` finds wrong.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A LUN's backing store cannot be served.
    #[error("target {target} LUN {lun}")]
    Backing {
        /// The target's name.
        target: String,
        /// The LUN number.
        lun: u64,
        /// What is wrong with the store.
        #[source]
        cause: ethersan_backend::BackendError,
    },
    /// A LUN cannot be exported over AoE (its address, its block size).
    #[error(transparent)]
    Aoe(#[from] ethersan_server::aoe::AoeError),
    /// The native transport's group cannot be set up.
    #[error(transparent)]
    Native(#[from] ethersan_server::native::NativeError),
}

/// `serve --check`: the lines saying what `cfg` would serve (portals,
/// targets and their LUNs, AoE devices, native transport, iSNS, and
/// warnings about targets open to anyone), or the first thing wrong.
/// Every backing store is looked at; nothing is created.
pub fn check(cfg: &Config) -> Result<String, CheckError> {
    let mut out = String::new();
    for p in &cfg.portals {
        match cfg.advertise.get(p) {
            Some(a) => _ = writeln!(out, "  portal {p} (advertised as {a})"),
            None => _ = writeln!(out, "  portal {p}"),
        }
    }
    let dir = &cfg.options.data_dir;
    for t in &cfg.targets {
        _ = writeln!(out, "  target {}", t.name);
        _ = writeln!(out, "    access: {}", t.access.meaning());
        for (i, idx) in t.numbered() {
            let l = &t.luns[idx];
            let what = match &l.backing {
                // Its directory is made when serving.
                Backing::File {
                    path,
                    size: Some(size),
                } if in_data_dir(cfg, l) && !dir.is_dir() => format!(
                    "{}, {}, will be created in a new data directory",
                    path.display(),
                    ethersan_backend::file::human_bytes(*size)
                ),
                _ => l.check_backing().map_err(|cause| CheckError::Backing {
                    target: t.name.clone(),
                    lun: i,
                    cause,
                })?,
            };
            _ = writeln!(out, "    LUN {i}: {what}");
        }
    }
    for l in &cfg.aoe.links {
        _ = writeln!(out, "  AoE link {l}");
    }
    if !cfg.aoe.links.is_empty() {
        for (ti, t) in cfg.targets.iter().enumerate() {
            for (n, idx) in t.numbered() {
                let (i, l) = (usize::try_from(n).unwrap_or(usize::MAX), &t.luns[idx]);
                if let Some(addr) = ethersan_server::aoe::address(&t.name, ti, i, l.aoe)? {
                    if l.block_size != 512 {
                        return Err(ethersan_server::aoe::AoeError::BlockSize {
                            target: t.name.clone(),
                            lun: i,
                            block_size: l.block_size,
                        }
                        .into());
                    }
                    _ = writeln!(out, "    AoE {addr}: LUN {i} of {}", t.name);
                }
            }
        }
    }
    if cfg.ethernet.enabled() {
        let keys = ethersan_server::native::group_keys(&cfg.ethernet)?;
        for l in &cfg.ethernet.links {
            _ = writeln!(out, "  native transport on {l} (group {})", keys.group());
        }
        for u in &cfg.ethernet.udp {
            _ = writeln!(out, "  native transport on {u} (group {})", keys.group());
        }
    }
    if let Some(i) = &cfg.isns {
        let what = if i.portals.is_empty() {
            "the portals above".to_string()
        } else {
            i.portals
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        _ = writeln!(
            out,
            "  iSNS server {} (registers the targets and {what})",
            i.server()
        );
    }
    for w in ethersan_server::exposure::open_to_anyone(cfg) {
        _ = writeln!(out, "  warning: {w}");
    }
    Ok(out)
}

/// Whether a LUN keeps its file in the data directory (the embedded
/// default does), which the server then makes if it is missing.
fn in_data_dir(cfg: &Config, l: &LunConfig) -> bool {
    matches!(&l.backing, Backing::File { path, .. } if path.parent() == Some(cfg.options.data_dir.as_path()))
}

/// Make the data directory if a LUN's file is to be created in it (and
/// only then: a LUN path's own directory must exist).
pub(crate) fn make_data_dir(cfg: &Config) -> Result<(), DaemonError> {
    let dir = &cfg.options.data_dir;
    let needed = cfg
        .targets
        .iter()
        .flat_map(|t| &t.luns)
        .any(|l| in_data_dir(cfg, l));
    if needed && !dir.is_dir() {
        std::fs::create_dir_all(dir).map_err(|cause| DaemonError::DataDir {
            dir: dir.clone(),
            cause,
        })?;
        tracing::info!("created the data directory {}", dir.display());
    }
    Ok(())
}
