//! One LUN: its backing store and options, the command-line spec form,
//! consistency checks, and opening the backing store.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ethersan_backend::file::{FileDevice, FileOptions, IoEngine};
use ethersan_backend::lock::{LockMode, Locking, StoreLock};
use ethersan_backend::ram::RamDevice;
use ethersan_backend::{BackendError, BlockDevice};

use super::{parse_naa, parse_size, ConfigError};

/// Where a LUN's blocks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// A regular file (created sparse if missing) or a block device.
    File {
        /// Path.
        path: PathBuf,
        /// Size; required when the file does not exist.
        size: Option<u64>,
    },
    /// Memory.
    Ram {
        /// Size in bytes.
        size: u64,
    },
    /// A Ceph RBD image (librbd, loaded at run time); several servers may
    /// export the same image (see docs/rbd.md).
    Rbd {
        /// Pool, image, cluster connection and the size to create it with.
        spec: ethersan_rbd::RbdSpec,
    },
}

/// The `--lun` spec options that belong to an RBD image's connection
/// (`conf=`, `id=`, `keyring=`, `timeout=`), not to the LUN.
const RBD_OPTIONS: [&str; 4] = ["conf=", "id=", "keyring=", "timeout="];

/// One LUN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LunConfig {
    /// The backing store.
    pub backing: Backing,
    /// Write protected.
    pub read_only: bool,
    /// Removable medium.
    pub removable: bool,
    /// Logical block size: 512 or 4096.
    pub block_size: u32,
    /// Unit serial number (VPD 0x80); when absent, the LUN's stored or
    /// generated identity gives it (see `docs/config.md`, "Disk identity").
    pub serial: Option<String>,
    /// NAA designator (VPD 0x83) as parsed by [`super::parse_naa`]; when
    /// absent, the LUN's stored or generated identity gives it.
    pub naa: Option<[u8; 16]>,
    /// Initial write cache state (WCE).
    pub write_cache: bool,
    /// Fully provisioned (preallocated) instead of thin.
    pub preallocate: bool,
    /// Physical block size to report: 512 or 4096 (default 4096, the page
    /// size the backends write best), never below the logical block size.
    pub physical_block_size: u32,
    /// Open the file or block device with `O_DIRECT` (bypass the page
    /// cache). Not for RAM LUNs.
    pub direct: bool,
    /// The I/O engine for a file or block device (default
    /// [`DEFAULT_ENGINE`]); ignored for RAM LUNs.
    pub engine: IoEngine,
    /// Most bytes per second a SANITIZE writes (`None`: device speed).
    pub sanitize_rate: Option<u64>,
    /// Its AoE shelf.slot when the AoE target is on.
    pub aoe: super::AoeAddress,
    /// The least security a channel of the native transport (`--eth`,
    /// `--udp`) needs to address it (default: encrypt). iSCSI over TCP and
    /// AoE are not affected.
    pub security: ethersan_channel::Level,
    /// Its LUN number when given (`number` in a `[[target.lun]]` table);
    /// otherwise the one after the previous LUN's (the first: 0).
    pub number: Option<u64>,
    /// Exported on purpose by other servers (or other LUNs) too: its file
    /// or block device is locked shared instead of for this LUN alone (see
    /// `ethersan_backend::lock`). A read-only LUN is locked shared anyway;
    /// an RBD image is always shared.
    pub shared: bool,
}

/// The I/O engine of a file LUN that names none: the faster one in the
/// measurements in docs/benchmark.md ("I/O engines").
pub const DEFAULT_ENGINE: IoEngine = IoEngine::Uring;

impl LunConfig {
    /// Parse the command-line form `PATH[:SIZE][,ro][,removable][,shared][,bs=4096][,serial=S][,naa=HEX]`
    /// or `ram:SIZE[,...]` or `rbd:POOL/IMAGE[:SIZE][,conf=PATH][,id=USER][,keyring=PATH][,timeout=SECS][,...]`.
    pub fn from_spec(spec: &str) -> Result<LunConfig, ConfigError> {
        let mut parts = spec.split(',');
        let head = parts.next().unwrap_or("");
        if head.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "LUN spec {spec:?} names no backing store"
            )));
        }
        let mut lun_opts: Vec<&str> = Vec::new();
        let backing = if let Some(image) = head.strip_prefix("rbd:") {
            // The connection's options go to the image's spec, the rest to
            // the LUN.
            let mut text = image.to_string();
            for opt in parts.by_ref() {
                if RBD_OPTIONS.iter().any(|k| opt.starts_with(k)) {
                    text.push(',');
                    text.push_str(opt);
                } else {
                    lun_opts.push(opt);
                }
            }
            Backing::Rbd {
                spec: ethersan_rbd::RbdSpec::parse(&text)
                    .map_err(|e| ConfigError::Invalid(format!("LUN spec {spec:?}: {e}")))?,
            }
        } else if let Some(size) = head.strip_prefix("ram:") {
            Backing::Ram {
                size: parse_size(size)?,
            }
        } else {
            match head.rsplit_once(':') {
                // PATH:SIZE, unless the whole of it names an existing file
                // (device paths such as /dev/disk/by-path/… hold colons).
                Some((path, size))
                    if !path.is_empty()
                        && size
                            .starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+')
                        && !Path::new(head).exists() =>
                {
                    Backing::File {
                        path: PathBuf::from(path),
                        size: Some(parse_size(size)?),
                    }
                }
                _ => Backing::File {
                    path: PathBuf::from(head),
                    size: None,
                },
            }
        };
        let mut lun = LunConfig {
            backing,
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
            aoe: super::AoeAddress::Default,
            security: ethersan_channel::Level::default(),
            number: None,
            shared: false,
        };
        lun_opts.extend(parts);
        for opt in lun_opts {
            match opt {
                "ro" => lun.read_only = true,
                "removable" => lun.removable = true,
                "wce=0" | "nowce" => lun.write_cache = false,
                "full" | "prealloc" => lun.preallocate = true,
                "direct" => lun.direct = true,
                "shared" => lun.shared = true,
                o if o.starts_with("engine=") => {
                    lun.engine = o[7..].parse().map_err(|e| {
                        ConfigError::Invalid(format!("LUN spec {spec:?}: engine: {e}"))
                    })?
                }
                o if o.starts_with("pbs=") => {
                    lun.physical_block_size = match &o[4..] {
                        "512" => 512,
                        "4096" | "4K" | "4k" => 4096,
                        v => return Err(ConfigError::Invalid(format!("LUN spec {spec:?}: pbs={v} (use 512 or 4096)"))),
                    }
                }
                o if o.starts_with("bs=") => {
                    lun.block_size = match &o[3..] {
                        "512" => 512,
                        "4096" | "4K" | "4k" => 4096,
                        v => return Err(ConfigError::Invalid(format!("LUN spec {spec:?}: bs={v} (use 512 or 4096)"))),
                    }
                }
                o if o.starts_with("serial=") => lun.serial = Some(o[7..].to_string()),
                o if o.starts_with("sanitize_rate=") => {
                    let v = o["sanitize_rate=".len()..].trim_end_matches("/s");
                    lun.sanitize_rate = Some(parse_size(v).map_err(|e| {
                        ConfigError::Invalid(format!("LUN spec {spec:?}: sanitize_rate: {e}"))
                    })?)
                }
                o if o.starts_with("aoe=") => {
                    lun.aoe = o[4..]
                        .parse()
                        .map_err(|e| ConfigError::Invalid(format!("LUN spec {spec:?}: {e}")))?
                }
                o if o.starts_with("security=") => {
                    lun.security = o["security=".len()..]
                        .parse()
                        .map_err(|e| ConfigError::Invalid(format!("LUN spec {spec:?}: {e}")))?
                }
                o if o.starts_with("naa=") => {
                    lun.naa = Some(parse_naa(&o[4..]).map_err(|e| {
                        ConfigError::Invalid(format!("LUN spec {spec:?}: {e}"))
                    })?)
                }
                o => {
                    return Err(ConfigError::Invalid(format!(
                        "LUN spec {spec:?}: unknown option {o:?} (known: ro, removable, bs=512|4096, pbs=512|4096, serial=S, naa=HEX, wce=0, full, direct, shared, engine=sync|uring, sanitize_rate=SIZE, aoe=SHELF.SLOT|off, security=none|integrity|encrypt)"
                    )))
                }
            }
        }
        lun.check().map_err(ConfigError::Invalid)?;
        Ok(lun)
    }

    pub(super) fn check(&self) -> Result<(), String> {
        let size = match &self.backing {
            Backing::Ram { size } => Some(*size),
            Backing::File { size, .. } => *size,
            Backing::Rbd { spec } => spec.create_size,
        };
        // Each message starts with the TOML key it is about, so that a
        // config file error can point at that key's line.
        if self.block_size != 512 && self.block_size != 4096 {
            return Err(format!(
                "block_size must be 512 or 4096 (bs= in a --lun spec), not {}",
                self.block_size
            ));
        }
        if !matches!(self.physical_block_size, 512 | 4096)
            || self.physical_block_size < self.block_size
        {
            return Err(format!(
                "physical_block_size must be 512 or 4096 and not below the block size {} (pbs= in a --lun spec), not {}",
                self.block_size, self.physical_block_size
            ));
        }
        if let Some(s) = size {
            if s % u64::from(self.block_size) != 0 {
                return Err(format!(
                    "size {s} is not a multiple of the block size {}",
                    self.block_size
                ));
            }
        }
        if matches!(self.backing, Backing::Ram { .. }) && self.read_only {
            return Err("a RAM LUN cannot be read-only (it would hold only zeros)".into());
        }
        if matches!(self.backing, Backing::Ram { .. }) && self.shared {
            return Err("shared is for files and block devices, not RAM LUNs (no other server can see this server's memory)".into());
        }
        if matches!(self.backing, Backing::Ram { .. }) && self.direct {
            return Err("direct (O_DIRECT) is for files and block devices, not RAM LUNs".into());
        }
        if matches!(self.backing, Backing::Rbd { .. }) && (self.direct || self.preallocate) {
            return Err(
                "direct and full provisioning are for files and block devices, not RBD images"
                    .into(),
            );
        }
        Ok(())
    }

    /// Open the backing store, locked (a file or block device; see
    /// `ethersan_backend::lock`): refused while another server, or another
    /// LUN of this one, exports it, unless both are shared.
    pub fn open(&self) -> Result<Arc<dyn BlockDevice>, BackendError> {
        self.open_taking_over(&mut Vec::new())
    }

    /// How this LUN's file or block device is locked: shared when the LUN
    /// says so or is read-only, else for this LUN alone.
    pub fn lock_mode(&self) -> LockMode {
        if self.shared || self.read_only {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        }
    }

    /// [`open`](Self::open), keeping a lock of `released` instead when one
    /// holds this store (it is taken out of the list, and converted to
    /// this LUN's mode):
    /// the locks of LUNs that a reload replaces, so that reopening their
    /// store does not find it in use by themselves.
    pub fn open_taking_over(
        &self,
        released: &mut Vec<Arc<StoreLock>>,
    ) -> Result<Arc<dyn BlockDevice>, BackendError> {
        Ok(match &self.backing {
            Backing::Ram { size } => Arc::new(RamDevice::new(*size, self.block_size)?),
            Backing::File { path, size } => {
                let mode = self.lock_mode();
                let kept = std::fs::metadata(path).ok().and_then(|meta| {
                    let i = released.iter().position(|l| l.locks(&meta))?;
                    Some(released.remove(i))
                });
                let locking = match kept {
                    Some(l) if l.mode() == mode => Locking::Inherit(l),
                    // Read-only now, or no longer: the same lock, converted.
                    Some(l) => Locking::Inherit(Arc::new(l.convert(path, mode)?)),
                    None => Locking::Take(mode),
                };
                Arc::new(FileDevice::open_locked(
                    path,
                    &self.file_options(*size),
                    locking,
                )?)
            }
            Backing::Rbd { spec } => Arc::new(
                ethersan_rbd::RbdDevice::open(spec, self.block_size)
                    .map_err(|e| BackendError::Config(e.to_string()))?,
            ),
        })
    }

    /// Check that [`LunConfig::open`] would succeed without changing
    /// anything (`serve --check`); a description of the store for people.
    pub fn check_backing(&self) -> Result<String, BackendError> {
        match &self.backing {
            Backing::Ram { size } => Ok(format!(
                "RAM, {}",
                ethersan_backend::file::human_bytes(*size)
            )),
            Backing::File { path, size } => FileDevice::check(path, &self.file_options(*size)),
            // Connecting is the only real check: open the image and close
            // it again (an image missing with a size given is created, as
            // serving it would).
            Backing::Rbd { spec } => {
                let dev = ethersan_rbd::RbdDevice::open(spec, self.block_size)
                    .map_err(|e| BackendError::Config(e.to_string()))?;
                Ok(format!(
                    "Ceph RBD image {}, {}",
                    dev.describe(),
                    ethersan_backend::file::human_bytes(
                        dev.num_blocks() * u64::from(dev.block_size())
                    )
                ))
            }
        }
    }

    fn file_options(&self, size: Option<u64>) -> FileOptions {
        FileOptions {
            size,
            block_size: self.block_size,
            read_only: self.read_only,
            preallocate: self.preallocate,
            direct: self.direct,
            engine: self.engine,
        }
    }
}
