//! `rbd:` store specs: `POOL/IMAGE[:SIZE][,conf=PATH][,id=USER][,keyring=PATH][,timeout=SECS]`.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// The timeout for cluster operations when a spec gives none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);

/// Which RBD image to open and how to reach its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    /// The RADOS pool holding the image.
    pub pool: String,
    /// The image name.
    pub image: String,
    /// The Ceph configuration file; `None`: librados' default search
    /// (`$CEPH_CONF`, `/etc/ceph/ceph.conf`, `~/.ceph/config`, `./ceph.conf`).
    pub conf: Option<PathBuf>,
    /// The cephx user without `client.` (`None`: `admin`).
    pub id: Option<String>,
    /// The keyring file (`None`: as the configuration says).
    pub keyring: Option<PathBuf>,
    /// Create the image with this many bytes when it does not exist; an
    /// existing image is never resized.
    pub create_size: Option<u64>,
    /// Bound on connecting and on every cluster operation (OSD and monitor
    /// operations fail with ETIMEDOUT after it).
    pub timeout: Duration,
}

/// What is wrong with an `rbd:` spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// No `/` between pool and image.
    #[error("rbd spec {0:?} has no pool: write it as POOL/IMAGE (for example rbd/disk1)")]
    NoPool(String),
    /// An empty pool or image name.
    #[error("rbd spec {0:?} has an empty pool or image name: write it as POOL/IMAGE")]
    EmptyName(String),
    /// A name with characters Ceph or the spec syntax cannot take.
    #[error("rbd {what} name {name:?} contains {bad:?}; pool and image names may not contain '/', ':', ',', '@', '=' or whitespace")]
    BadName {
        /// "pool" or "image".
        what: &'static str,
        /// The name given.
        name: String,
        /// The offending character.
        bad: char,
    },
    /// A size that does not parse.
    #[error("rbd image size {0:?} is not a size: give bytes or a number with K, M, G or T (for example 10G)")]
    BadSize(String),
    /// A size of zero.
    #[error("rbd image size must be more than 0 bytes")]
    ZeroSize,
    /// An option without `=`.
    #[error(
        "rbd option {0:?} has no value: write it as NAME=VALUE (conf=, id=, keyring=, timeout=)"
    )]
    NoValue(String),
    /// An option with an empty value.
    #[error("rbd option {0}= has an empty value")]
    EmptyValue(String),
    /// An option this spec does not know.
    #[error(
        "unknown rbd option {0:?}: the options are conf=PATH, id=USER, keyring=PATH, timeout=SECS"
    )]
    UnknownOption(String),
    /// An option given twice.
    #[error("rbd option {0}= is given twice")]
    Duplicate(String),
    /// A timeout that is not a positive number of seconds.
    #[error("rbd timeout {0:?} is not a whole number of seconds between 1 and 3600")]
    BadTimeout(String),
    /// A user name with the `client.` prefix or other bad characters.
    #[error("rbd id {0:?} is not a cephx user name: give it without \"client.\" (id=admin), without ',' ':' or whitespace")]
    BadId(String),
}

impl RbdSpec {
    /// A spec for `pool/image` with every option at its default.
    pub fn new(pool: &str, image: &str) -> RbdSpec {
        RbdSpec {
            pool: pool.to_string(),
            image: image.to_string(),
            conf: None,
            id: None,
            keyring: None,
            create_size: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Parse the text after `rbd:` (see the module documentation).
    pub fn parse(s: &str) -> Result<RbdSpec, SpecError> {
        let mut parts = s.split(',');
        let head = parts.next().unwrap_or_default();
        let (name, size) = match head.split_once(':') {
            Some((n, sz)) => (n, Some(sz)),
            None => (head, None),
        };
        let (pool, image) = name
            .split_once('/')
            .ok_or_else(|| SpecError::NoPool(s.to_string()))?;
        if pool.is_empty() || image.is_empty() {
            return Err(SpecError::EmptyName(s.to_string()));
        }
        check_name("pool", pool)?;
        check_name("image", image)?;
        let mut spec = RbdSpec::new(pool, image);
        if let Some(sz) = size {
            let bytes = parse_size(sz)?;
            if bytes == 0 {
                return Err(SpecError::ZeroSize);
            }
            spec.create_size = Some(bytes);
        }
        let mut seen: Vec<&str> = Vec::new();
        for opt in parts {
            let (key, value) = opt
                .split_once('=')
                .ok_or_else(|| SpecError::NoValue(opt.to_string()))?;
            if !["conf", "id", "keyring", "timeout"].contains(&key) {
                return Err(SpecError::UnknownOption(key.to_string()));
            }
            if seen.contains(&key) {
                return Err(SpecError::Duplicate(key.to_string()));
            }
            seen.push(key);
            if value.is_empty() {
                return Err(SpecError::EmptyValue(key.to_string()));
            }
            match key {
                "conf" => spec.conf = Some(PathBuf::from(value)),
                "keyring" => spec.keyring = Some(PathBuf::from(value)),
                "id" => {
                    if value.starts_with("client.")
                        || value.chars().any(|c| c.is_whitespace() || c == ':')
                    {
                        return Err(SpecError::BadId(value.to_string()));
                    }
                    spec.id = Some(value.to_string());
                }
                _ => {
                    let secs: u64 = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=3600).contains(n))
                        .ok_or_else(|| SpecError::BadTimeout(value.to_string()))?;
                    spec.timeout = Duration::from_secs(secs);
                }
            }
        }
        Ok(spec)
    }
}

fn check_name(what: &'static str, name: &str) -> Result<(), SpecError> {
    match name
        .chars()
        .find(|&c| matches!(c, '/' | ':' | ',' | '@' | '=') || c.is_whitespace())
    {
        Some(bad) => Err(SpecError::BadName {
            what,
            name: name.to_string(),
            bad,
        }),
        None => Ok(()),
    }
}

/// Bytes in `s`: a number with an optional K, M, G or T suffix (binary
/// multiples; `B`, `iB` and lower case accepted).
fn parse_size(s: &str) -> Result<u64, SpecError> {
    let bad = || SpecError::BadSize(s.to_string());
    let t = s.trim_end_matches(['b', 'B']);
    let t = t.strip_suffix('i').unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

/// The shortest text for `bytes` that [`parse_size`] reads back.
fn format_size(bytes: u64) -> String {
    for (shift, suffix) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

impl fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.pool, self.image)?;
        if let Some(size) = self.create_size {
            write!(f, ":{}", format_size(size))?;
        }
        if let Some(conf) = &self.conf {
            write!(f, ",conf={}", conf.display())?;
        }
        if let Some(id) = &self.id {
            write!(f, ",id={id}")?;
        }
        if let Some(keyring) = &self.keyring {
            write!(f, ",keyring={}", keyring.display())?;
        }
        if self.timeout != DEFAULT_TIMEOUT {
            write!(f, ",timeout={}", self.timeout.as_secs())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_and_full_specs() {
        assert_eq!(
            RbdSpec::parse("rbd/disk1").unwrap(),
            RbdSpec::new("rbd", "disk1")
        );
        let s = RbdSpec::parse(
            "pool1/img:10G,conf=/etc/ceph/x.conf,id=gw,keyring=/etc/ceph/k,timeout=5",
        )
        .unwrap();
        assert_eq!(s.pool, "pool1");
        assert_eq!(s.image, "img");
        assert_eq!(s.create_size, Some(10 << 30));
        assert_eq!(s.conf, Some(PathBuf::from("/etc/ceph/x.conf")));
        assert_eq!(s.id.as_deref(), Some("gw"));
        assert_eq!(s.keyring, Some(PathBuf::from("/etc/ceph/k")));
        assert_eq!(s.timeout, Duration::from_secs(5));
        // Options in any order, no size.
        let s = RbdSpec::parse("p/i,timeout=7,id=x").unwrap();
        assert_eq!((s.create_size, s.timeout), (None, Duration::from_secs(7)));
    }

    #[test]
    fn sizes() {
        for (text, bytes) in [
            ("4096", 4096),
            ("512M", 512 << 20),
            ("1T", 1 << 40),
            ("3k", 3 << 10),
            ("2GiB", 2 << 30),
            ("8MB", 8 << 20),
        ] {
            let s = RbdSpec::parse(&format!("p/i:{text}")).unwrap();
            assert_eq!(s.create_size, Some(bytes), "{text}");
        }
    }

    #[test]
    fn every_kind_of_mistake() {
        let cases: &[(&str, SpecError)] = &[
            ("disk1", SpecError::NoPool("disk1".into())),
            ("/disk1", SpecError::EmptyName("/disk1".into())),
            ("rbd/", SpecError::EmptyName("rbd/".into())),
            ("", SpecError::NoPool(String::new())),
            (
                "rbd/a/b",
                SpecError::BadName {
                    what: "image",
                    name: "a/b".into(),
                    bad: '/',
                },
            ),
            (
                "r b/x",
                SpecError::BadName {
                    what: "pool",
                    name: "r b".into(),
                    bad: ' ',
                },
            ),
            (
                "rbd/x@snap",
                SpecError::BadName {
                    what: "image",
                    name: "x@snap".into(),
                    bad: '@',
                },
            ),
            ("rbd/x:", SpecError::BadSize(String::new())),
            ("rbd/x:10X", SpecError::BadSize("10X".into())),
            ("rbd/x:G", SpecError::BadSize("G".into())),
            ("rbd/x:-1G", SpecError::BadSize("-1G".into())),
            ("rbd/x:1.5G", SpecError::BadSize("1.5G".into())),
            (
                "rbd/x:99999999999T",
                SpecError::BadSize("99999999999T".into()),
            ),
            ("rbd/x:0", SpecError::ZeroSize),
            ("rbd/x:1G:2G", SpecError::BadSize("1G:2G".into())),
            ("rbd/x,conf", SpecError::NoValue("conf".into())),
            ("rbd/x,", SpecError::NoValue(String::new())),
            ("rbd/x,conf=", SpecError::EmptyValue("conf".into())),
            ("rbd/x,pool=a", SpecError::UnknownOption("pool".into())),
            ("rbd/x,id=a,id=b", SpecError::Duplicate("id".into())),
            ("rbd/x,timeout=0", SpecError::BadTimeout("0".into())),
            ("rbd/x,timeout=abc", SpecError::BadTimeout("abc".into())),
            ("rbd/x,timeout=3601", SpecError::BadTimeout("3601".into())),
            (
                "rbd/x,id=client.admin",
                SpecError::BadId("client.admin".into()),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(RbdSpec::parse(text).as_ref(), Err(want), "{text:?}");
            // Every message says what to do or what is allowed.
            assert!(!want.to_string().is_empty());
        }
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "rbd/disk1",
            "rbd/disk1:10G",
            "rbd/disk1:4097",
            "rbd/disk1:1536M",
            "p/i:1T,conf=/etc/ceph/c.conf,id=gw,keyring=/k,timeout=3",
            "p/i,timeout=20",
        ] {
            let spec = RbdSpec::parse(text).unwrap();
            let shown = spec.to_string();
            assert_eq!(RbdSpec::parse(&shown).unwrap(), spec, "{text} -> {shown}");
        }
        assert_eq!(
            RbdSpec::parse("rbd/d:1024M").unwrap().to_string(),
            "rbd/d:1G"
        );
        assert_eq!(
            RbdSpec::parse("rbd/d,timeout=20").unwrap().to_string(),
            "rbd/d"
        );
    }
}
