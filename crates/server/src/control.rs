//! Changing a running server: what the management API (`ethersan ctl`)
//! does, as operations on the configuration being served.
//!
//! Every change edits a copy of the running [`Config`] and applies it
//! through the [`Reloader`], the path SIGHUP takes: stores are opened
//! before anything changes, so a change that fails leaves the server as it
//! was, and the running configuration is always one that `serve --config`
//! reproduces ([`Control::save`] writes it).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{AclRule, ChapConfig, Config, LunConfig, TargetChap, TargetConfig};
use crate::registry::{Registry, SessionView};
use crate::reload::{ReloadReport, Reloader};
use crate::ServerError;

/// Why a change was refused. The message says what is wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The target, LUN, session, initiator or portal named does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The change conflicts with what is there (exists already, in use).
    #[error("{0}")]
    Conflict(String),
    /// The request itself is wrong (a bad name, spec or size).
    #[error("{0}")]
    Invalid(String),
    /// Opening a store or applying the change failed; nothing changed.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// Writing the configuration file failed.
    #[error("cannot write {path}: {cause}")]
    Save {
        /// The file.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
}

/// What [`Control::save`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveReport {
    /// The file written (or found to hold the running configuration).
    pub path: PathBuf,
    /// Where the file's previous version was kept (`FILE.bak`), if the
    /// file existed and changed.
    pub backup: Option<PathBuf>,
    /// Whether the file was written (false: it said this already).
    pub written: bool,
    /// The existing file was edited where it differs, comments and layout
    /// kept (false: written whole).
    pub edited: bool,
    /// What changed in the file, one line each.
    pub changes: Vec<String>,
    /// Why an existing file was written whole instead of edited.
    pub note: Option<String>,
}

/// The operations of the management plane on one running server.
pub struct Control {
    reloader: Reloader,
    registry: Arc<Registry>,
    /// The file `serve --config` read (where `save` writes by default).
    config_file: Option<PathBuf>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("config_file", &self.config_file)
            .finish_non_exhaustive()
    }
}

/// A LUN as the running configuration and the live directory describe it.
#[derive(Debug, Clone)]
pub struct LunView {
    /// Its number.
    pub lun: u64,
    /// Its configuration.
    pub config: LunConfig,
    /// The live logical unit's capacity in bytes (`None`: not live).
    pub size_bytes: Option<u64>,
    /// Its logical block size.
    pub block_size: u32,
    /// What backs it (`file /path`, `ram`, …).
    pub backend: String,
    /// Its WWN (NAA designator), as hex.
    pub naa: Option<String>,
    /// Its serial number.
    pub serial: Option<String>,
}

/// A target as the running configuration and the live directory describe it.
#[derive(Debug, Clone)]
pub struct TargetView {
    /// Its configuration.
    pub config: TargetConfig,
    /// Its LUNs.
    pub luns: Vec<LunView>,
    /// Sessions logged in to it.
    pub sessions: usize,
}

impl Control {
    /// Operations on the server `reloader` applies changes to.
    pub fn new(reloader: Reloader, registry: Arc<Registry>, config_file: Option<PathBuf>) -> Self {
        Control {
            reloader,
            registry,
            config_file,
        }
    }

    /// The registry of targets and sessions.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The configuration being served.
    pub fn config(&self) -> Config {
        self.reloader.current()
    }

    /// Apply a changed configuration file (SIGHUP).
    pub fn reload(&self, new: Config) -> Result<ReloadReport, ServerError> {
        self.reloader.apply(new)
    }

    /// Every target with its LUNs.
    pub fn targets(&self) -> Vec<TargetView> {
        let cfg = self.config();
        cfg.targets.iter().map(|t| self.view(t)).collect()
    }

    /// One target.
    pub fn target(&self, name: &str) -> Result<TargetView, ControlError> {
        let cfg = self.config();
        let t = find(&cfg, name)?;
        Ok(self.view(t))
    }

    fn view(&self, t: &TargetConfig) -> TargetView {
        let live = self.registry.target(&t.name);
        let luns = t
            .numbered()
            .into_iter()
            .map(|(n, i)| {
                let lu = live.as_ref().and_then(|e| e.scsi.lun(n));
                LunView {
                    lun: n,
                    config: t.luns[i].clone(),
                    size_bytes: lu.as_ref().map(|lu| {
                        let v = lu.volume();
                        v.num_blocks() * u64::from(v.block_size())
                    }),
                    block_size: lu
                        .as_ref()
                        .map_or(t.luns[i].block_size, |lu| lu.volume().block_size()),
                    backend: lu
                        .as_ref()
                        .map(|lu| lu.device().describe())
                        .unwrap_or_default(),
                    naa: lu
                        .as_ref()
                        .map(|lu| crate::config::format_naa(&lu.config().naa)),
                    serial: lu.as_ref().map(|lu| lu.config().serial.clone()),
                }
            })
            .collect();
        TargetView {
            config: t.clone(),
            luns,
            sessions: self.registry.sessions_of(&t.name),
        }
    }

    /// Export a new target with no LUNs yet.
    pub fn add_target(&self, name: &str, alias: Option<String>) -> Result<(), ControlError> {
        crate::config::validate_name(name).map_err(|e| ControlError::Invalid(e.to_string()))?;
        self.edit(|cfg| {
            if cfg.targets.iter().any(|t| t.name == name) {
                return Err(ControlError::Conflict(format!(
                    "target {name} exists already (ethersan ctl target ls lists the targets)"
                )));
            }
            cfg.targets.push(TargetConfig {
                name: name.to_string(),
                alias,
                luns: Vec::new(),
                access: Default::default(),
                chap: TargetChap::Inherit,
            });
            Ok(())
        })
    }

    /// Stop exporting a target. With sessions logged in, only with `force`
    /// (they end).
    pub fn remove_target(&self, name: &str, force: bool) -> Result<(), ControlError> {
        let in_use = self.registry.sessions_of(name);
        self.edit(|cfg| {
            find(cfg, name)?;
            if in_use > 0 && !force {
                return Err(ControlError::Conflict(format!(
                    "target {name} has {in_use} session(s) logged in; log them out first or add --force to end them"
                )));
            }
            cfg.targets.retain(|t| t.name != name);
            Ok(())
        })
    }

    /// Add a LUN from a spec (`PATH[:SIZE][,opts]` or `ram:SIZE`, as
    /// `--lun`), numbered `lun` or the lowest free number. Returns its
    /// number. Logged-in initiators get REPORTED LUNS DATA HAS CHANGED.
    pub fn add_lun(&self, target: &str, spec: &str, lun: Option<u64>) -> Result<u64, ControlError> {
        let mut l = LunConfig::from_spec(spec).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let mut chosen = 0;
        self.edit(|cfg| {
            let t = find_mut(cfg, target)?;
            pin_numbers(t);
            let used: Vec<u64> = t.numbered().into_iter().map(|(n, _)| n).collect();
            let n = match lun {
                Some(n) if used.contains(&n) => {
                    return Err(ControlError::Conflict(format!(
                        "target {target} has a LUN {n} already; choose another number or remove it first"
                    )))
                }
                Some(n) if n > 16383 => {
                    return Err(ControlError::Invalid(format!(
                        "LUN {n} is out of range: use 0 to 16383"
                    )))
                }
                Some(n) => n,
                None => (0..).find(|n| !used.contains(n)).unwrap_or(0),
            };
            l.number = Some(n);
            t.luns.push(l);
            chosen = n;
            Ok(())
        })?;
        Ok(chosen)
    }

    /// Remove LUN `lun`. While sessions are logged in to the target, only
    /// with `force`.
    pub fn remove_lun(&self, target: &str, lun: u64, force: bool) -> Result<(), ControlError> {
        let in_use = self.registry.sessions_of(target);
        self.edit(|cfg| {
            let t = find_mut(cfg, target)?;
            let i = t.lun_index(lun).ok_or_else(|| no_lun(target, lun))?;
            if in_use > 0 && !force {
                return Err(ControlError::Conflict(format!(
                    "LUN {lun} of {target} is in use: {in_use} session(s) are logged in to the target; add --force to remove it anyway (they get REPORTED LUNS DATA HAS CHANGED)"
                )));
            }
            pin_numbers(t);
            t.luns.remove(i);
            for masks in [&mut t.access.luns, &mut t.access.read_only] {
                if i < masks.len() {
                    masks.remove(i);
                }
            }
            Ok(())
        })
    }

    /// Grow or shrink a file LUN's store to `bytes` while it serves:
    /// initiators get CAPACITY DATA HAS CHANGED. Returns the new number of
    /// blocks.
    pub fn resize_lun(&self, target: &str, lun: u64, bytes: u64) -> Result<u64, ControlError> {
        let cfg = self.config();
        let t = find(&cfg, target)?;
        let i = t.lun_index(lun).ok_or_else(|| no_lun(target, lun))?;
        let bs = u64::from(t.luns[i].block_size.max(1));
        if bytes == 0 || !bytes.is_multiple_of(bs) {
            return Err(ControlError::Invalid(format!(
                "size {bytes} is not a positive multiple of the LUN's {bs}-byte blocks"
            )));
        }
        if matches!(t.luns[i].backing, crate::config::Backing::Ram { .. }) {
            return Err(ControlError::Invalid(format!(
                "LUN {lun} of {target} is a RAM LUN; only files, block devices and RBD images can be resized"
            )));
        }
        let live = self
            .registry
            .target(target)
            .ok_or_else(|| ControlError::NotFound(format!("target {target} is not live")))?;
        live.resize_lun(lun, bytes).map_err(|e| {
            ControlError::Invalid(format!("cannot resize LUN {lun} of {target}: {e}"))
        })?;
        tracing::info!(
            "configuration changed: target {target}: LUN {lun} resized to {bytes} bytes ({} blocks)",
            bytes / bs
        );
        self.edit(|cfg| {
            let t = find_mut(cfg, target)?;
            pin_numbers(t);
            if let Some(i) = t.lun_index(lun) {
                if let crate::config::Backing::File { size, .. } = &mut t.luns[i].backing {
                    *size = Some(bytes);
                }
            }
            Ok(())
        })?;
        Ok(bytes / bs)
    }

    /// Add an access rule to `target`: an initiator name, a network
    /// (`ADDR/LEN`) or a name from a network (`NAME@ADDR/LEN`). Any rule
    /// admits on its own, so a grant widens access, except the first on
    /// a target with none (which admitted everyone): that one narrows it,
    /// and the answer's warning says so and names the sessions it ended.
    pub fn grant(&self, target: &str, entry: &str) -> Result<AclChange, ControlError> {
        let rule = parse_rule(entry)?;
        let mut change = None;
        self.edit(|cfg| {
            let t = find_mut(cfg, target)?;
            if t.access.rules.contains(&rule) {
                return Err(ControlError::Conflict(format!(
                    "{rule} is granted on {target} already (ethersan ctl acl ls {target} lists the rules)"
                )));
            }
            let before = t.access.clone();
            t.access.rules.push(rule.clone());
            let warning = before.is_open().then(|| {
                let lose = self.losing_access(target, &t.access);
                format!(
                    "target {target} admitted every initiator; now {}{}",
                    t.access.meaning(),
                    ending(&lose)
                )
            });
            change = Some(AclChange::new(&rule, &t.access, warning));
            Ok(())
        })?;
        Ok(change.expect("set by the edit").logged())
    }

    /// Remove an access rule from `target`: the sessions only it admitted
    /// end, and the answer's warning names them. Removing the last rule
    /// opens the target to every initiator, which the warning says.
    pub fn revoke(&self, target: &str, entry: &str) -> Result<AclChange, ControlError> {
        let rule = parse_rule(entry)?;
        let mut change = None;
        self.edit(|cfg| {
            let t = find_mut(cfg, target)?;
            if !t.access.rules.contains(&rule) {
                return Err(ControlError::NotFound(format!(
                    "{rule} is not granted on {target} (ethersan ctl acl ls {target} lists the rules)"
                )));
            }
            t.access.rules.retain(|r| *r != rule);
            let warning = if t.access.is_open() {
                format!(
                    "target {target} has no access rules left: it is open, any initiator from any address may log in"
                )
            } else {
                let lose = self.losing_access(target, &t.access);
                format!(
                    "{rule} no longer admits {}; target {target} now admits {}{}",
                    rule.meaning(),
                    t.access.meaning(),
                    ending(&lose)
                )
            };
            change = Some(AclChange::new(&rule, &t.access, Some(warning)));
            Ok(())
        })?;
        Ok(change.expect("set by the edit").logged())
    }

    /// The sessions of `target` logged in now that `new` does not admit,
    /// as `INITIATOR from ADDRESS`.
    fn losing_access(&self, target: &str, new: &crate::config::Access) -> Vec<String> {
        self.registry
            .sessions()
            .into_iter()
            .filter(|s| s.target.as_deref() == Some(target))
            .filter_map(|s| {
                let addr = s.details.as_ref().map(|d| d.address.clone());
                let ip = addr
                    .as_deref()
                    .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
                    .map(|a| a.ip());
                (!new.allows(&s.initiator, ip)).then(|| match addr {
                    Some(a) => format!("{} from {a}", s.initiator),
                    None => s.initiator.clone(),
                })
            })
            .collect()
    }

    /// Require CHAP with these credentials: of every target that has none
    /// of its own (`target` = `None`) or of one target. Applies to logins
    /// from now on.
    pub fn set_chap(
        &self,
        target: Option<&str>,
        user: &str,
        secret: &[u8],
    ) -> Result<(), ControlError> {
        let cred =
            ethersan_proto::chap::Credentials::new(user, secret).map_err(ControlError::Invalid)?;
        self.edit(|cfg| {
            let old = match target {
                None => cfg.chap.take(),
                Some(name) => match std::mem::take(&mut find_mut(cfg, name)?.chap) {
                    TargetChap::Chap(c) => Some(c),
                    TargetChap::Inherit | TargetChap::None => None,
                },
            };
            let new = match old {
                Some(old) => ChapConfig {
                    initiator: cred,
                    ..old
                },
                None => ChapConfig {
                    initiator: cred,
                    target: None,
                    discovery: target.is_none(),
                },
            };
            match target {
                None => cfg.chap = Some(new),
                Some(name) => find_mut(cfg, name)?.chap = TargetChap::Chap(new),
            }
            Ok(())
        })
    }

    /// Stop requiring CHAP globally, or make a target follow the global
    /// setting again (dropping its own credentials or its opt-out).
    pub fn clear_chap(&self, target: Option<&str>) -> Result<(), ControlError> {
        self.edit(|cfg| {
            let had = match target {
                None => cfg.chap.take().is_some(),
                Some(name) => !matches!(
                    std::mem::take(&mut find_mut(cfg, name)?.chap),
                    TargetChap::Inherit
                ),
            };
            if !had {
                return Err(ControlError::NotFound(match target {
                    None => "no global CHAP credentials are set".to_string(),
                    Some(t) => format!("target {t} has no CHAP setting of its own"),
                }));
            }
            Ok(())
        })
    }

    /// The portals listening now.
    pub fn portals(&self) -> Vec<crate::portals::PortalInfo> {
        self.reloader.portals().list()
    }

    /// Listen on a new portal now (`advertise`: the address SendTargets
    /// announces for it). Returns the bound address.
    pub fn add_portal(
        &self,
        address: std::net::SocketAddr,
        advertise: Option<std::net::SocketAddr>,
    ) -> Result<std::net::SocketAddr, ControlError> {
        if address.port() == 0 {
            return Err(ControlError::Invalid(format!(
                "{address}: give the port to listen on (port 0 would pick a different one at every start)"
            )));
        }
        if let Some(a) = advertise {
            if a.ip().is_unspecified() || a.port() == 0 {
                return Err(ControlError::Invalid(format!(
                    "advertise {a} cannot be reached by initiators: give the address and port they connect to"
                )));
            }
        }
        self.edit(|cfg| {
            if cfg.portals.contains(&address) {
                return Err(ControlError::Conflict(format!(
                    "already listening on {address} (ethersan ctl portal ls lists the portals)"
                )));
            }
            cfg.portals.push(address);
            match advertise {
                Some(a) => cfg.advertise.insert(address, a),
                None => cfg.advertise.remove(&address),
            };
            Ok(())
        })?;
        Ok(address)
    }

    /// Stop listening on a portal (sessions through it go on).
    pub fn remove_portal(&self, address: std::net::SocketAddr) -> Result<(), ControlError> {
        let live = self.portals();
        self.edit(|cfg| {
            // The configured address, or the one a port-0 portal got.
            let configured = if cfg.portals.contains(&address) {
                address
            } else {
                let pos = live.iter().position(|p| p.address == address);
                match pos.and_then(|i| cfg.portals.get(i)).copied() {
                    Some(c) if c.ip() == address.ip() && c.port() == 0 => c,
                    _ => {
                        return Err(ControlError::NotFound(format!(
                            "no portal {address} (ethersan ctl portal ls lists the portals)"
                        )))
                    }
                }
            };
            if cfg.portals.len() == 1 {
                return Err(ControlError::Conflict(format!(
                    "{address} is the last portal; add another first (ethersan ctl portal add ADDR:PORT)"
                )));
            }
            cfg.portals.retain(|p| *p != configured);
            cfg.advertise.remove(&configured);
            Ok(())
        })
    }

    /// Every live session.
    pub fn sessions(&self) -> Vec<SessionView> {
        self.registry.sessions()
    }

    /// End session `id`.
    pub fn logout(&self, id: u64) -> Result<(), ControlError> {
        let who = self.registry.sessions().into_iter().find(|s| s.id == id);
        if self.registry.end_session(id) {
            if let Some(s) = who {
                tracing::info!(
                    "session {id} ended: initiator {} on {}",
                    s.initiator,
                    s.target.as_deref().unwrap_or("(discovery)")
                );
            }
            Ok(())
        } else {
            Err(ControlError::NotFound(format!(
                "no session {id} (ethersan ctl session ls lists them)"
            )))
        }
    }

    /// Look at every LUN's backing store size again; a file LUN whose
    /// configured size no longer matches its store takes the store's (so
    /// that a saved configuration does not refuse the grown file).
    pub fn rescan(&self) {
        self.registry.rescan_capacity();
        let live: Vec<(String, u64, u64)> = self
            .targets()
            .iter()
            .flat_map(|t| {
                t.luns
                    .iter()
                    .filter_map(|l| match (&l.config.backing, l.size_bytes) {
                        (crate::config::Backing::File { size: Some(s), .. }, Some(b))
                            if *s != b =>
                        {
                            Some((t.config.name.clone(), l.lun, b))
                        }
                        _ => None,
                    })
            })
            .collect();
        if live.is_empty() {
            return;
        }
        let r = self.edit(|cfg| {
            for (target, lun, bytes) in &live {
                let t = find_mut(cfg, target)?;
                if let Some(i) = t.lun_index(*lun) {
                    if let crate::config::Backing::File { size, .. } = &mut t.luns[i].backing {
                        *size = Some(*bytes);
                    }
                }
            }
            Ok(())
        });
        if let Err(e) = r {
            tracing::warn!("rescan: cannot record the new sizes: {e}");
        }
    }

    /// Where [`Control::save`] writes without a path: the file the server
    /// was started with, else `ethersan.toml` in the data directory.
    pub fn default_save_path(&self) -> PathBuf {
        match &self.config_file {
            Some(p) => p.clone(),
            None => self.config().options.data_dir.join("ethersan.toml"),
        }
    }

    /// Write the running configuration to `path` (default
    /// [`Control::default_save_path`]), mode 0600 (it may hold CHAP
    /// secrets). A file there that holds a configuration is edited where
    /// it differs, comments and layout kept ([`Config::edit_toml`]), and
    /// its previous version is kept as `FILE.bak`; each file is written
    /// atomically (a synced temporary file renamed over it). A file that
    /// already says what runs is left alone.
    pub fn save(&self, path: Option<&Path>) -> Result<SaveReport, ControlError> {
        let path = path.map_or_else(|| self.default_save_path(), Path::to_path_buf);
        let path = std::path::absolute(&path).unwrap_or(path);
        let failed = |path: &Path| {
            let path = path.to_path_buf();
            move |cause| ControlError::Save { path, cause }
        };
        let existing = match std::fs::read(&path) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(failed(&path)(e)),
        };
        let text = existing.as_deref().map(String::from_utf8_lossy);
        let base = path.parent().unwrap_or(Path::new("/"));
        let made = self
            .config()
            .edit_toml(text.as_deref(), &path.display().to_string(), base);
        let mut report = SaveReport {
            path: path.clone(),
            backup: None,
            written: false,
            edited: made.edited,
            changes: made.changes,
            note: made.note,
        };
        if existing.as_deref() == Some(made.text.as_bytes()) {
            report.changes.clear();
            tracing::info!(
                "save: {} holds the running configuration already; nothing written",
                path.display()
            );
            return Ok(report);
        }
        if let Some(old) = &existing {
            let mut name = path.file_name().unwrap_or_default().to_os_string();
            name.push(".bak");
            let backup = path.with_file_name(name);
            write_atomically(&backup, old).map_err(failed(&backup))?;
            report.backup = Some(backup);
        }
        write_atomically(&path, made.text.as_bytes()).map_err(failed(&path))?;
        report.written = true;
        tracing::info!(
            file = %path.display(),
            backup = report.backup.as_ref().map(|b| b.display().to_string()),
            "save: wrote the running configuration ({}): {}",
            if report.edited { "edited in place" } else { "written whole" },
            report.changes.join("; ")
        );
        Ok(report)
    }

    fn edit(
        &self,
        f: impl FnOnce(&mut Config) -> Result<(), ControlError>,
    ) -> Result<(), ControlError> {
        let report = self.reloader.update(f)?;
        // In the span of the request: which interface made the change.
        for c in &report.changed {
            tracing::info!("configuration changed: {c}");
        }
        Ok(())
    }
}

/// What a grant or a revoke did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclChange {
    /// The rule, as `acl ls` shows it.
    pub rule: String,
    /// What the target's rules mean now.
    pub meaning: String,
    /// Set when the change narrowed access (or opened the target): what
    /// it did and which sessions it ended.
    pub warning: Option<String>,
}

impl AclChange {
    fn new(rule: &AclRule, now: &crate::config::Access, warning: Option<String>) -> Self {
        AclChange {
            rule: rule.to_string(),
            meaning: now.meaning(),
            warning,
        }
    }
}

impl AclChange {
    /// The change, its warning logged (once it was made).
    fn logged(self) -> Self {
        if let Some(w) = &self.warning {
            tracing::warn!("{w}");
        }
        self
    }
}

fn parse_rule(s: &str) -> Result<AclRule, ControlError> {
    AclRule::parse(s).map_err(ControlError::Invalid)
}

/// `; the sessions of … were ended` for a warning, or nothing.
fn ending(lose: &[String]) -> String {
    if lose.is_empty() {
        "; no session logged in now loses access".into()
    } else {
        format!(
            "; {} session(s) logged in now lose access and end: {}",
            lose.len(),
            lose.join(", ")
        )
    }
}

fn find<'a>(cfg: &'a Config, name: &str) -> Result<&'a TargetConfig, ControlError> {
    cfg.targets
        .iter()
        .find(|t| t.name == name)
        .ok_or_else(|| no_target(name))
}

fn find_mut<'a>(cfg: &'a mut Config, name: &str) -> Result<&'a mut TargetConfig, ControlError> {
    cfg.targets
        .iter_mut()
        .find(|t| t.name == name)
        .ok_or_else(|| no_target(name))
}

fn no_target(name: &str) -> ControlError {
    ControlError::NotFound(format!(
        "no target {name} (ethersan ctl target ls lists the targets)"
    ))
}

fn no_lun(target: &str, lun: u64) -> ControlError {
    ControlError::NotFound(format!(
        "target {target} has no LUN {lun} (ethersan ctl lun ls {target} lists them)"
    ))
}

/// Give every LUN its number explicitly, so removing or adding one does
/// not renumber the LUNs after it.
fn pin_numbers(t: &mut TargetConfig) {
    for (n, i) in t.numbered() {
        t.luns[i].number = Some(n);
    }
}

/// Write `data` to `path` through a temporary file in the same directory,
/// synced and renamed over it.
fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the path names no file"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
