//! The TOML form of the configuration: the raw serde types (`raw`), read
//! section by section (`sections`, `target`) into a [`Config`], with
//! `FILE:LINE:COL` in every error (`source`).

use std::ops::Range;
use std::path::Path;

mod raw;
mod sections;
mod source;
mod target;

use super::{shared_backing_file, Config, ConfigError, TargetConfig};
use raw::RawConfig;
use source::Source;

impl Config {
    /// Read and check a TOML file.
    pub fn from_toml_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            cause: source,
        })?;
        // Relative paths in the file are relative to the file, not to
        // wherever the server happens to be started.
        let base = path.parent().unwrap_or(Path::new(""));
        let base = if base.as_os_str().is_empty() {
            Path::new(".")
        } else {
            base
        };
        Config::parse_toml(&text, &path.display().to_string(), base)
    }

    /// Parse and check TOML text; `origin` names it in errors.
    ///
    /// Relative paths stay as they are (relative to the working
    /// directory); [`Config::from_toml_file`] makes them relative to the
    /// file.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        Config::parse_toml(text, origin, Path::new(""))
    }

    /// Parse and check TOML text whose relative paths are relative to
    /// `base` (`""`: as they are): each section in turn, in the order of
    /// their checks.
    pub(super) fn parse_toml(text: &str, origin: &str, base: &Path) -> Result<Config, ConfigError> {
        let src = Source { text, origin, base };
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| src.at(e.span(), e.message().to_string()))?;
        let options = sections::options(&src, raw.options)?;
        let (portals, advertise) = sections::portals(&src, raw.portals)?;
        if raw.targets.is_empty() {
            return Err(src.at(None, "no targets: add a [[target]] table".into()));
        }
        let mut targets: Vec<TargetConfig> = Vec::new();
        let mut lun_spans: Vec<Vec<Range<usize>>> = Vec::new();
        for t in raw.targets {
            let (t, spans) = target::target(&src, t, &targets)?;
            targets.push(t);
            lun_spans.push(spans);
        }
        if let Some((t, l, msg)) = shared_backing_file(&targets) {
            return Err(src.at(Some(lun_spans[t][l].clone()), msg));
        }
        let chap = sections::chap(&src, raw.chap)?;
        let discovery_chap = sections::discovery_chap(&src, raw.discovery, chap.as_ref())?;
        let aoe = sections::aoe(&src, raw.aoe)?;
        let ethernet = sections::ethernet(&src, raw.ethernet)?;
        let nvme = sections::nvme(&src, raw.nvme)?;
        let isns = sections::isns(&src, raw.isns)?;
        Ok(Config {
            portals,
            advertise,
            targets,
            options,
            chap,
            discovery_chap,
            aoe,
            ethernet,
            nvme,
            isns,
        })
    }
}
