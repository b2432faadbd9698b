//! A LUN's AoE state kept beside its store: the config string, one hex
//! line, written whole and renamed into place.

use std::path::{Path, PathBuf};

use tracing::warn;

use crate::config::Backing;

/// Where a LUN's AoE state (the config string) is kept.
pub(super) fn state_file(backing: &Backing, data_dir: &Path) -> Option<PathBuf> {
    match backing {
        // An RBD image has no file beside it: its AoE configuration string
        // lasts as long as the process.
        Backing::Ram { .. } | Backing::Rbd { .. } => None,
        Backing::File { path, .. } if path.is_file() => {
            let mut p = path.clone().into_os_string();
            p.push(".aoe");
            Some(p.into())
        }
        Backing::File { path, .. } => {
            let mut p = crate::identity::device_store_path(data_dir, path).into_os_string();
            p.push(".aoe");
            Some(p.into())
        }
    }
}

/// The config string kept in `path` (hex, one line), if any.
pub(super) fn load_config_string(path: &Path) -> Option<Vec<u8>> {
    let text = std::fs::read_to_string(path).ok()?;
    let Some(hex) = text.trim().strip_prefix("config_string_hex = ") else {
        warn!(file = %path.display(), "AoE state file unreadable, config string starts empty");
        return None;
    };
    let hex = hex.trim_matches('"');
    let bytes: Option<Vec<u8>> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok())
        .collect();
    match bytes {
        Some(b) if hex.len() % 2 == 0 && b.len() <= 1024 => Some(b),
        _ => {
            warn!(file = %path.display(), "AoE state file unreadable, config string starts empty");
            None
        }
    }
}

/// Keep `config` in `path` (written whole, then renamed into place).
pub(super) fn save_config_string(path: &Path, config: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let hex: String = config.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = path.with_extension("aoe.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(format!("config_string_hex = \"{hex}\"\n").as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    // The rename itself survives a power cut once the directory is synced.
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
