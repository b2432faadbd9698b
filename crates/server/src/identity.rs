//! Disk identity: each LUN's NAA designator (VPD page 0x83) and unit serial
//! number (VPD page 0x80), unique and stable.
//!
//! A LUN's identity is generated randomly (from the OS's CSPRNG) the first
//! time the LUN is served and kept with it, so it survives restarts and a
//! reordering of the configuration, moves with the backing file, and
//! differs between any two LUNs ever created:
//!
//! - a regular backing file keeps it in a sidecar beside it,
//!   `<backing>.id` (like the persistent-reservation state `<backing>.pr`);
//! - a block device keeps it under the server's data directory,
//!   `<data_dir>/identities/<device path, '/' as '%2F'>.id`, keyed by the
//!   device path as configured (name devices by a stable path such as
//!   `/dev/disk/by-id/...`, not `/dev/sdb`);
//! - a RAM LUN gets a new random identity at every start (its contents do
//!   not survive a restart either).
//!
//! A configured `serial` or `naa` wins over the stored one. When the file
//! cannot be written (a read-only directory or file system), the LUN is
//! served with an identity derived from stable facts of the backing store
//! (machine id, path, device and inode numbers) and a warning says so. A
//! file that exists but cannot be read or parsed is an error, never
//! silently replaced: a new identity would make initiators see another disk.
//!
//! The sidecar is TOML:
//!
//! ```toml
//! naa = "6..."        # 32 hex digits (NAA-6) or 16 (NAA-5)
//! serial = "..."      # 1 to 64 printable ASCII characters
//! ```

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::{format_naa, parse_naa, Backing, LunConfig};

/// A LUN's identity as initiators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// NAA designator body: NAA-6 (16 bytes), or NAA-5 in the first 8
    /// bytes with the rest zero (see `ethersan_scsi::LuConfig::naa`).
    pub naa: [u8; 16],
    /// Unit serial number (also in the T10 vendor ID designator).
    pub serial: String,
}

/// Where a LUN's identity came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Both `naa` and `serial` were configured; nothing is stored.
    Configured,
    /// Read from this identity file.
    Stored(PathBuf),
    /// Generated now and written to this identity file.
    Created(PathBuf),
    /// Derived from stable facts of the backing store because this identity
    /// file could not be written.
    Derived(PathBuf),
    /// Random for this run (a RAM LUN).
    Random,
    /// Kept in the store's shared state (an RBD image's RADOS object and
    /// image metadata), so every gateway exporting it reports the same.
    Shared {
        /// Where (`rbd:pool/image`).
        store: String,
        /// Whether this server made it now.
        created: bool,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Configured => f.write_str("configured"),
            Origin::Stored(p) => write!(f, "stored in {}", p.display()),
            Origin::Created(p) => write!(f, "new, stored in {}", p.display()),
            Origin::Derived(p) => write!(
                f,
                "derived from the backing store ({} not writable)",
                p.display()
            ),
            Origin::Random => f.write_str("random for this run (RAM LUN)"),
            Origin::Shared { store, created } => write!(
                f,
                "{} in the shared state of {store}",
                if *created { "new, stored" } else { "stored" }
            ),
        }
    }
}

/// Why a LUN's identity could not be found or made.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The identity file exists but does not hold a valid identity.
    #[error(
        "{path}: not a valid LUN identity ({reason}); repair it (naa = \"<32 hex digits starting with 6>\", serial = \"<text>\"), or pin the LUN's identity with naa/serial in its configuration; deleting the file gives the disk a new WWN, so initiators would see a different disk"
    )]
    Corrupt {
        /// The identity file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A shared store's identity could not be read or stored.
    #[error("cannot read or store the LUN identity in the shared state of {store}: {reason}; check that the cluster is reachable and that the user may write to the image's pool")]
    Shared {
        /// The store (`rbd:pool/image`).
        store: String,
        /// What failed.
        reason: String,
    },
    /// The identity file exists but cannot be read.
    #[error("cannot read the LUN identity file {path}: {cause}; make it readable by the server")]
    Read {
        /// The identity file.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// A new identity file could not be written (the server then falls
    /// back to a derived identity; see [`resolve`]).
    #[error("cannot write the LUN identity file {path}: {cause}")]
    Write {
        /// The identity file.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// The backing store's metadata could not be read.
    #[error("cannot inspect the backing store {path}: {cause}")]
    Backing {
        /// The backing file or device.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// The OS gave no random numbers.
    #[error("no random numbers for a new LUN identity: {0}")]
    Random(String),
}

/// The identity file beside a regular backing file: `<backing>.id`.
pub fn sidecar_path(backing: &Path) -> PathBuf {
    let mut p = backing.as_os_str().to_owned();
    p.push(".id");
    PathBuf::from(p)
}

/// The identity file of a block device (or any backing store that is not a
/// regular file): `<data_dir>/identities/<path>.id`, the device path as
/// configured, made absolute, with `%` and `/` escaped as `%25` and `%2F`.
pub fn device_store_path(data_dir: &Path, device: &Path) -> PathBuf {
    let abs = std::path::absolute(device).unwrap_or_else(|_| device.to_path_buf());
    let key = abs
        .to_string_lossy()
        .replace('%', "%25")
        .replace('/', "%2F");
    data_dir.join("identities").join(format!("{key}.id"))
}

/// Check a unit serial number read from an identity file: 1 to 64
/// printable ASCII characters (VPD page 0x80 is ASCII; the T10 vendor ID
/// designator carries at most 64 bytes of it).
pub fn validate_serial(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 64 || !s.bytes().all(|c| c.is_ascii_graphic() || c == b' ') {
        return Err(format!(
            "serial {s:?}: use 1 to 64 printable ASCII characters"
        ));
    }
    Ok(())
}

/// Make an NAA-6 body a locally administered IEEE Registered Extended
/// designator: NAA nibble 6, and in the company id the U/L bit set and the
/// I/G bit clear.
fn locally_administered(mut naa: [u8; 16]) -> [u8; 16] {
    naa[0] = 0x60 | (naa[0] & 0x0f);
    naa[1] = (naa[1] & !0x30) | 0x20;
    naa
}

/// A new random identity: NAA-6 (locally administered company id, 100
/// random bits) and a 16-hex-digit serial (64 random bits).
pub fn generate() -> Result<Identity, IdentityError> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| IdentityError::Random(e.to_string()))?;
    let mut naa = [0u8; 16];
    naa.copy_from_slice(&bytes[..16]);
    let mut serial = [0u8; 8];
    serial.copy_from_slice(&bytes[16..]);
    Ok(Identity {
        naa: locally_administered(naa),
        serial: format!("{:016x}", u64::from_be_bytes(serial)),
    })
}

/// 64-bit FNV-1a over `seed` and `parts` (each length-prefixed).
fn fnv(seed: u8, parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    eat(seed);
    for p in parts {
        for b in (p.len() as u64).to_be_bytes() {
            eat(b);
        }
        for b in *p {
            eat(*b);
        }
    }
    h
}

/// An identity derived from `facts` alone: the same facts, the same
/// identity. For backing stores whose identity file cannot be written.
pub fn derive(facts: &[&[u8]]) -> Identity {
    let mut naa = [0u8; 16];
    naa[..8].copy_from_slice(&fnv(1, facts).to_be_bytes());
    naa[8..].copy_from_slice(&fnv(2, facts).to_be_bytes());
    Identity {
        naa: locally_administered(naa),
        serial: format!("{:016x}", fnv(3, facts)),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredIdentity {
    naa: String,
    serial: String,
}

/// Parse the text of an identity file.
fn parse(text: &str) -> Result<Identity, String> {
    let s: StoredIdentity = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let naa = parse_naa(&s.naa)?;
    validate_serial(&s.serial)?;
    Ok(Identity {
        naa,
        serial: s.serial,
    })
}

/// The text written to a new identity file.
fn render(id: &Identity, of: &Path) -> String {
    format!(
        "# ethersan LUN identity of {}: its WWN (VPD 0x83 NAA designator) and serial\n\
         # (VPD 0x80). Keep it with the backing store; a copy of both is the same disk\n\
         # to initiators (delete this file from a copy to give the copy a new identity).\n\
         naa = \"{}\"\nserial = \"{}\"\n",
        of.display(),
        format_naa(&id.naa),
        id.serial
    )
}

/// The identity kept in a shared store's state (blob `identity`, the
/// identity file's text): read it, or create it if no gateway has yet —
/// with compare-and-swap, so two gateways starting at once agree on the
/// one that was stored first.
fn shared_identity(
    dev: &dyn ethersan_backend::BlockDevice,
) -> Result<(Identity, Origin), IdentityError> {
    let store = dev.describe();
    let shared_err = |reason: String| IdentityError::Shared {
        store: store.clone(),
        reason,
    };
    let Some(shared) = dev.shared() else {
        return Err(shared_err("the store keeps no shared state".into()));
    };
    for _ in 0..8 {
        let current = shared
            .load(IDENTITY_BLOB)
            .map_err(|e| shared_err(e.to_string()))?;
        if current.version != 0 {
            let text = String::from_utf8_lossy(&current.data);
            let id = parse(&text).map_err(|reason| IdentityError::Corrupt {
                path: PathBuf::from(format!("{store} (shared object {IDENTITY_BLOB})")),
                reason,
            })?;
            let origin = Origin::Shared {
                store,
                created: false,
            };
            return Ok((id, origin));
        }
        let id = generate()?;
        let text = render(&id, Path::new(&store));
        match shared.store(IDENTITY_BLOB, text.as_bytes(), 0) {
            Ok(Some(_)) => {
                let origin = Origin::Shared {
                    store,
                    created: true,
                };
                return Ok((id, origin));
            }
            // Another gateway stored one first: use that.
            Ok(None) => continue,
            Err(e) => return Err(shared_err(e.to_string())),
        }
    }
    Err(shared_err(
        "the identity kept changing while it was read".into(),
    ))
}

/// The shared-state blob that holds a shared store's identity.
const IDENTITY_BLOB: &str = "identity";

/// Read the identity file at `path`: `Ok(None)` if there is none.
pub fn load(path: &Path) -> Result<Option<Identity>, IdentityError> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        // No such file (or a path that cannot hold one).
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(None)
        }
        Err(source) => {
            return Err(IdentityError::Read {
                path: path.to_path_buf(),
                cause: source,
            })
        }
    };
    let text = String::from_utf8(text).map_err(|_| IdentityError::Corrupt {
        path: path.to_path_buf(),
        reason: "not UTF-8 text".into(),
    })?;
    parse(&text)
        .map(Some)
        .map_err(|reason| IdentityError::Corrupt {
            path: path.to_path_buf(),
            reason,
        })
}

/// Write `text` to `path` atomically and only if `path` does not exist:
/// a temporary file in the same directory, fsync, then a hard link to the
/// final name (which fails if another process created it first; rename
/// where the file system has no hard links), then fsync of the directory.
/// `Ok(false)`: the file already existed and was left alone.
fn write_new(path: &Path, text: &str) -> std::io::Result<bool> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut salt = [0u8; 8];
    getrandom::fill(&mut salt).map_err(|e| std::io::Error::other(e.to_string()))?;
    let tmp = dir.join(format!(
        ".{name}.{}.{:016x}.tmp",
        std::process::id(),
        u64::from_ne_bytes(salt)
    ));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        drop(f);
        let created = match std::fs::hard_link(&tmp, path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(_) if !path.exists() => {
                std::fs::rename(&tmp, path)?;
                true
            }
            Err(e) => return Err(e),
        };
        if let Ok(d) = std::fs::File::open(&dir) {
            // Best effort: some file systems cannot sync a directory.
            let _ = d.sync_all();
        }
        Ok(created)
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

/// The identity kept in `store`, created there if missing. `facts` derive
/// the fallback identity used when `store` cannot be written.
pub fn load_or_create(
    store: &Path,
    of: &Path,
    facts: &[&[u8]],
) -> Result<(Identity, Origin), IdentityError> {
    if let Some(id) = load(store)? {
        return Ok((id, Origin::Stored(store.to_path_buf())));
    }
    let id = generate()?;
    let written = store
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && !d.exists())
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| write_new(store, &render(&id, of)));
    match written {
        Ok(true) => Ok((id, Origin::Created(store.to_path_buf()))),
        // Another server created it meanwhile: use theirs.
        Ok(false) => match load(store)? {
            Some(id) => Ok((id, Origin::Stored(store.to_path_buf()))),
            None => Err(IdentityError::Read {
                path: store.to_path_buf(),
                cause: std::io::ErrorKind::NotFound.into(),
            }),
        },
        Err(source) => {
            let e = IdentityError::Write {
                path: store.to_path_buf(),
                cause: source,
            };
            tracing::warn!(
                backing = %of.display(),
                "{e}; serving with an identity derived from the backing store's path and inode instead: stable while the file stays in place on this machine, but it changes if the file is moved or copied, and it will be replaced by a new random identity once the identity file can be written; pin naa and serial in the LUN's configuration to avoid both"
            );
            Ok((derive(facts), Origin::Derived(store.to_path_buf())))
        }
    }
}

/// This machine's id (`/etc/machine-id`), or nothing.
fn machine_id() -> Vec<u8> {
    std::fs::read("/etc/machine-id")
        .or_else(|_| std::fs::read("/var/lib/dbus/machine-id"))
        .unwrap_or_default()
}

/// The identity of `lun`, whose backing store is open (so a file exists):
/// the configured `naa`/`serial` over the stored one (see the module
/// documentation for where that is kept); `data_dir` holds block devices'
/// identity files.
pub fn resolve(
    lun: &LunConfig,
    data_dir: &Path,
    dev: &dyn ethersan_backend::BlockDevice,
) -> Result<(Identity, Origin), IdentityError> {
    let configured = |mut id: Identity| {
        if let Some(n) = lun.naa {
            id.naa = n;
        }
        if let Some(s) = &lun.serial {
            id.serial = s.clone();
        }
        id
    };
    if let (Some(naa), Some(serial)) = (lun.naa, &lun.serial) {
        let id = Identity {
            naa,
            serial: serial.clone(),
        };
        return Ok((id, Origin::Configured));
    }
    let (id, origin) = match &lun.backing {
        Backing::Ram { .. } => (generate()?, Origin::Random),
        Backing::Rbd { .. } => shared_identity(dev)?,
        Backing::File { path, .. } => {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(path).map_err(|source| IdentityError::Backing {
                path: path.clone(),
                cause: source,
            })?;
            let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            let machine = machine_id();
            let canonical = canonical.to_string_lossy();
            if meta.is_file() {
                let facts: [&[u8]; 4] = [
                    &machine,
                    canonical.as_bytes(),
                    &meta.dev().to_be_bytes(),
                    &meta.ino().to_be_bytes(),
                ];
                load_or_create(&sidecar_path(path), path, &facts)?
            } else {
                let configured_path = path.to_string_lossy();
                let facts: [&[u8]; 3] = [
                    &machine,
                    configured_path.as_bytes(),
                    &meta.rdev().to_be_bytes(),
                ];
                load_or_create(&device_store_path(data_dir, path), path, &facts)?
            }
        }
    };
    Ok((configured(id), origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store for `resolve` where the identity does not come from it.
    fn any_dev() -> ethersan_backend::ram::RamDevice {
        ethersan_backend::ram::RamDevice::new(4096, 512).expect("RAM device")
    }

    /// A fresh directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("ethersan-identity-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn file_lun(path: &Path) -> LunConfig {
        let mut l = LunConfig::from_spec(&format!("{}:1M", path.display())).unwrap();
        l.engine = ethersan_backend::file::IoEngine::Sync;
        l
    }

    fn naa6(id: &Identity) -> bool {
        id.naa[0] >> 4 == 6 && id.naa[1] & 0x30 == 0x20
    }

    #[test]
    fn created_once_then_reloaded() {
        let d = scratch("reload");
        let disk = d.join("disk.img");
        std::fs::write(&disk, vec![0u8; 4096]).unwrap();
        let lun = file_lun(&disk);
        let (first, origin) = resolve(&lun, &d, &any_dev()).unwrap();
        assert_eq!(origin, Origin::Created(d.join("disk.img.id")));
        assert!(naa6(&first), "{first:?}");
        assert_eq!(first.serial.len(), 16);
        let text = std::fs::read_to_string(d.join("disk.img.id")).unwrap();
        assert!(
            text.contains(&format!("naa = \"{}\"", format_naa(&first.naa))),
            "{text}"
        );
        let (again, origin) = resolve(&lun, &d, &any_dev()).unwrap();
        assert_eq!(again, first, "a restart keeps the identity");
        assert_eq!(origin, Origin::Stored(d.join("disk.img.id")));
        // Moved with its sidecar: same identity.
        std::fs::create_dir(d.join("moved")).unwrap();
        std::fs::rename(&disk, d.join("moved/disk.img")).unwrap();
        std::fs::rename(d.join("disk.img.id"), d.join("moved/disk.img.id")).unwrap();
        let (moved, _) = resolve(&file_lun(&d.join("moved/disk.img")), &d, &any_dev()).unwrap();
        assert_eq!(moved, first);
        // No stray temporary files.
        let names: Vec<_> = std::fs::read_dir(d.join("moved"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn two_luns_differ() {
        let d = scratch("differ");
        let mut seen = Vec::new();
        for i in 0..8 {
            let disk = d.join(format!("d{i}.img"));
            std::fs::write(&disk, vec![0u8; 4096]).unwrap();
            let (id, _) = resolve(&file_lun(&disk), &d, &any_dev()).unwrap();
            assert!(naa6(&id));
            assert!(
                !seen
                    .iter()
                    .any(|s: &Identity| s.naa == id.naa || s.serial == id.serial),
                "{id:?} repeats one of {seen:?}"
            );
            seen.push(id);
        }
        let ram = LunConfig::from_spec("ram:1M").unwrap();
        let (a, oa) = resolve(&ram, &d, &any_dev()).unwrap();
        let (b, _) = resolve(&ram, &d, &any_dev()).unwrap();
        assert_eq!(oa, Origin::Random);
        assert!(a.naa != b.naa && a.serial != b.serial && naa6(&a));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn configured_values_win() {
        let d = scratch("configured");
        let disk = d.join("disk.img");
        std::fs::write(&disk, vec![0u8; 4096]).unwrap();
        let (stored, _) = resolve(&file_lun(&disk), &d, &any_dev()).unwrap();
        let mut lun = file_lun(&disk);
        lun.serial = Some("PINNED-SERIAL".into());
        let (id, _) = resolve(&lun, &d, &any_dev()).unwrap();
        assert_eq!(id.serial, "PINNED-SERIAL");
        assert_eq!(id.naa, stored.naa, "the stored NAA still applies");
        let naa = parse_naa("5001405f01020304").unwrap();
        lun.naa = Some(naa);
        let (id, origin) = resolve(&lun, &d, &any_dev()).unwrap();
        assert_eq!((id.naa, origin), (naa, Origin::Configured));
        // Fully configured: no file is needed (nor written).
        let other = d.join("other.img");
        std::fs::write(&other, vec![0u8; 4096]).unwrap();
        let mut lun = file_lun(&other);
        lun.serial = Some("S".into());
        lun.naa = Some(naa);
        resolve(&lun, &d, &any_dev()).unwrap();
        assert!(!sidecar_path(&other).exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn corrupt_file_is_an_error_naming_it() {
        let d = scratch("corrupt");
        let disk = d.join("disk.img");
        std::fs::write(&disk, vec![0u8; 4096]).unwrap();
        let side = sidecar_path(&disk);
        for bad in [
            "naa = \"7123\"\nserial = \"x\"\n",
            "naa = \"60000000000000000000000000000000\"\n",
            "naa = \"6000000000000000000000000000000g\"\nserial = \"x\"\n",
            "naa = \"60000000000000000000000000000000\"\nserial = \"\"\n",
            "garbage",
            "",
        ] {
            std::fs::write(&side, bad).unwrap();
            let e = resolve(&file_lun(&disk), &d, &any_dev()).unwrap_err();
            assert!(matches!(e, IdentityError::Corrupt { .. }), "{bad}: {e:?}");
            let msg = e.to_string();
            assert!(msg.contains(&side.display().to_string()), "{msg}");
            assert_eq!(
                std::fs::read_to_string(&side).unwrap(),
                bad,
                "a corrupt identity file is left alone"
            );
        }
        std::fs::write(&side, [0xff, 0xfe]).unwrap();
        assert!(matches!(
            resolve(&file_lun(&disk), &d, &any_dev()),
            Err(IdentityError::Corrupt { .. })
        ));
        // A hand-written NAA-5 identity is accepted.
        std::fs::write(
            &side,
            "naa = \"5001405f01020304\"\nserial = \"old serial\"\n",
        )
        .unwrap();
        let (id, _) = resolve(&file_lun(&disk), &d, &any_dev()).unwrap();
        assert_eq!(id.naa, parse_naa("5001405f01020304").unwrap());
        assert_eq!(id.serial, "old serial");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn unwritable_store_falls_back_to_a_derived_identity() {
        let d = scratch("readonly");
        let disk = d.join("disk.img");
        std::fs::write(&disk, vec![0u8; 4096]).unwrap();
        // A store whose directory cannot exist (a file is in the way):
        // unwritable even for root.
        let store = disk.join("sub").join("disk.img.id");
        let (a, origin) = load_or_create(&store, &disk, &[b"one", b"fact"]).unwrap();
        assert_eq!(origin, Origin::Derived(store.clone()));
        let (b, _) = load_or_create(&store, &disk, &[b"one", b"fact"]).unwrap();
        assert_eq!(a, b, "derived identities are stable");
        assert!(naa6(&a));
        let (c, _) = load_or_create(&store, &disk, &[b"other", b"fact"]).unwrap();
        assert!(c.naa != a.naa && c.serial != a.serial);
        // A non-root user also meets a read-only directory.
        if is_root() {
            let _ = std::fs::remove_dir_all(&d);
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let ro = d.join("ro");
        std::fs::create_dir(&ro).unwrap();
        std::fs::write(ro.join("disk.img"), vec![0u8; 4096]).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        let (_, origin) = resolve(&file_lun(&ro.join("disk.img")), &d).unwrap();
        assert!(matches!(origin, Origin::Derived(_)), "{origin:?}");
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Whether this process runs as root (who may write anywhere).
    fn is_root() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .map(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .is_some_and(|l| l.split_whitespace().nth(2) == Some("0"))
            })
            .unwrap_or(false)
    }

    #[test]
    fn block_devices_keep_theirs_in_the_data_dir() {
        let d = scratch("device");
        let p = device_store_path(&d, Path::new("/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"));
        assert_eq!(
            p,
            d.join("identities/%2Fdev%2Fdisk%2Fby-id%2Fwwn-0x5000c500a1b2c3d4.id")
        );
        assert_ne!(
            device_store_path(&d, Path::new("/dev/a%2Fb")),
            device_store_path(&d, Path::new("/dev/a/b"))
        );
        // /dev/null stands in for a device: not a regular file.
        let mut lun = file_lun(Path::new("/dev/null"));
        lun.backing = Backing::File {
            path: "/dev/null".into(),
            size: None,
        };
        let (first, origin) = resolve(&lun, &d, &any_dev()).unwrap();
        let store = device_store_path(&d, Path::new("/dev/null"));
        assert_eq!(origin, Origin::Created(store.clone()));
        assert_eq!(
            resolve(&lun, &d, &any_dev()).unwrap(),
            (first, Origin::Stored(store))
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn naa_text_round_trips() {
        let id = generate().unwrap();
        assert_eq!(parse_naa(&format_naa(&id.naa)).unwrap(), id.naa);
        let five = parse_naa("5001405F01020304").unwrap();
        assert_eq!(format_naa(&five), "5001405f01020304");
        assert_eq!(&five[8..], &[0; 8]);
        for bad in [
            "",
            "6",
            "5001405f0102030",
            "5001405f010203040",
            "6001405f01020304",
            "7001405f01020304",
            "6001405f0102030405060708090a0b0c0d",
            "6001405f0102030405060708090a0b0z",
        ] {
            assert!(parse_naa(bad).is_err(), "{bad}");
        }
        assert!(validate_serial("x").is_ok());
        assert!(validate_serial("").is_err() && validate_serial("tab\there").is_err());
        assert!(validate_serial(&"s".repeat(65)).is_err());
    }
}
