//! The TOML form of the configuration: raw serde types and their
//! conversion, with `FILE:LINE:COL` in every error.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

mod sections;
mod target;

use super::{
    parse_size, shared_backing_file, ChapConfig, Config, ConfigError, Options, TargetConfig,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    portals: Vec<Spanned<RawPortal>>,
    #[serde(default, rename = "target")]
    targets: Vec<Spanned<RawTarget>>,
    #[serde(default)]
    options: Option<Spanned<Options>>,
    chap: Option<Spanned<RawChap>>,
    discovery: Option<RawDiscovery>,
    aoe: Option<Spanned<RawAoe>>,
    ethernet: Option<Spanned<RawEthernet>>,
    isns: Option<Spanned<RawIsns>>,
}

/// `[isns]`: registration with an iSNS server.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIsns {
    /// `HOST[:PORT]`.
    server: String,
    /// Portal addresses to register instead of the listening ones.
    #[serde(default)]
    portals: Vec<String>,
    /// The network entity's identifier.
    entity: Option<String>,
}

/// An element of `portals`: `"ADDR:PORT"`, or a table
/// `{ listen = "ADDR:PORT", advertise = "ADDR:PORT" }`. Deserialized by
/// hand so that a mistake in the table is reported with its key.
enum RawPortal {
    Addr(String),
    Table(RawPortalTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPortalTable {
    /// The address to listen on.
    listen: String,
    /// The address SendTargets announces instead.
    advertise: Option<String>,
}

impl<'de> Deserialize<'de> for RawPortal {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawPortal;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a portal: \"ADDR:PORT\" or { listen = \"ADDR:PORT\", advertise = \"ADDR:PORT\" }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawPortal, E> {
                Ok(RawPortal::Addr(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<RawPortal, A::Error> {
                RawPortalTable::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(RawPortal::Table)
            }
        }
        d.deserialize_any(V)
    }
}

/// `ADDR:PORT` of `what` (`portal`, `advertise`), or what is wrong with it.
fn socket_addr(text: &str, what: &str) -> Result<SocketAddr, String> {
    text.trim().parse().map_err(|_| {
        format!("{what} {text:?} is not ADDR:PORT (an IP address and a port, IPv6 as [::1]:3260)")
    })
}

/// `[ethernet]`: the native transport.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEthernet {
    /// Network interfaces (AF_PACKET).
    #[serde(default)]
    interfaces: Vec<String>,
    /// Unix datagram links, as `unix:LOCAL,peer=PEER[,mac=..][,mtu=..]`.
    #[serde(default)]
    unix: Vec<String>,
    /// UDP portals, as `ADDR:PORT[,mtu=N]`.
    #[serde(default)]
    udp: Vec<String>,
    /// The group name.
    group: Option<String>,
    /// A file holding the group secret.
    secret_file: Option<PathBuf>,
    /// The group secret inline.
    secret: Option<String>,
    /// The EtherType, e.g. "0x88B5".
    ethertype: Option<String>,
}

/// `[aoe]`: the AoE target.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAoe {
    /// Network interfaces (AF_PACKET).
    #[serde(default)]
    interfaces: Vec<String>,
    /// Unix datagram links, as `unix:LOCAL,peer=PEER[,mac=..][,mtu=..]`.
    #[serde(default)]
    unix: Vec<String>,
    /// Initiator MACs allowed to issue commands (empty: any).
    #[serde(default)]
    allowed_macs: Vec<String>,
}

/// `[discovery]`: settings for discovery sessions.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDiscovery {
    chap: Option<Spanned<RawChap>>,
}

/// `[chap]`: a secret inline, from a file, or from an environment variable.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChap {
    user: String,
    secret: Option<String>,
    secret_file: Option<PathBuf>,
    secret_env: Option<String>,
    mutual_user: Option<String>,
    mutual_secret: Option<String>,
    mutual_secret_file: Option<PathBuf>,
    mutual_secret_env: Option<String>,
    /// Only in the global `[chap]`: discovery sessions authenticate too.
    discovery: Option<bool>,
}

/// One secret from exactly one of: inline, file (trailing newline dropped),
/// environment variable.
fn read_secret(
    inline: Option<String>,
    file: Option<PathBuf>,
    env: Option<String>,
    what: &str,
    base: &Path,
) -> Result<Option<Vec<u8>>, String> {
    match (inline, file.map(|f| base.join(f)), env) {
        (None, None, None) => Ok(None),
        (Some(s), None, None) => Ok(Some(s.into_bytes())),
        (None, Some(f), None) => {
            let mut b =
                std::fs::read(&f).map_err(|e| format!("{what}_file {}: {e}", f.display()))?;
            while b.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
                b.pop();
            }
            Ok(Some(b))
        }
        (None, None, Some(v)) => std::env::var(&v)
            .map(|s| Some(s.into_bytes()))
            .map_err(|_| format!("{what}_env: environment variable {v} is not set")),
        _ => Err(format!("give one of {what}, {what}_file, {what}_env")),
    }
}

impl RawChap {
    /// `global`: the `[chap]` table, the only one with `discovery`.
    /// `base`: the directory relative secret files are in.
    fn resolve(self, global: bool, base: &Path) -> Result<ChapConfig, String> {
        use ethersan_proto::chap::Credentials;
        if !global && self.discovery.is_some() {
            return Err(
                "`discovery` belongs in the global [chap] (use [discovery.chap] for discovery credentials)"
                    .into(),
            );
        }
        let secret = read_secret(
            self.secret,
            self.secret_file,
            self.secret_env,
            "secret",
            base,
        )?
        .ok_or("needs secret, secret_file or secret_env")?;
        let initiator = Credentials::new(&self.user, &secret)?;
        let mutual = read_secret(
            self.mutual_secret,
            self.mutual_secret_file,
            self.mutual_secret_env,
            "mutual_secret",
            base,
        )?;
        let target = match (self.mutual_user, mutual) {
            (None, None) => None,
            (Some(u), Some(s)) => Some(Credentials::new(&u, &s)?),
            _ => return Err("mutual CHAP needs both mutual_user and a mutual secret".into()),
        };
        if target
            .as_ref()
            .is_some_and(|t| t.secret == initiator.secret)
        {
            return Err("the mutual secret must differ from the initiator's secret".into());
        }
        Ok(ChapConfig {
            initiator,
            target,
            discovery: self.discovery.unwrap_or(true),
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    name: Spanned<String>,
    alias: Option<String>,
    /// Absent is a mistake; an explicit `lun = []` is a target with no
    /// LUNs yet (as `ethersan ctl save` writes one).
    #[serde(rename = "lun")]
    luns: Option<Vec<Spanned<RawLun>>>,
    /// Access rules: a name, a network, or NAME@NETWORK; any admits.
    #[serde(default)]
    allow: Vec<Spanned<String>>,
    /// Before the rules: names, ANDed with `allow_networks`.
    #[serde(default)]
    allow_initiators: Vec<Spanned<String>>,
    #[serde(default)]
    allow_networks: Vec<Spanned<String>>,
    chap: Option<Spanned<RawTargetChap>>,
}

/// A target's `chap`: the word `"none"` (opt out of the global `[chap]`)
/// or a `[target.chap]` table. Deserialized by hand so that a mistake in
/// the table is reported with its key.
enum RawTargetChap {
    Word(String),
    Table(Box<RawChap>),
}

impl<'de> Deserialize<'de> for RawTargetChap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawTargetChap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("chap = \"none\" (no CHAP for this target) or a [target.chap] table (user = ..., secret = ...)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawTargetChap, E> {
                Ok(RawTargetChap::Word(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                m: A,
            ) -> Result<RawTargetChap, A::Error> {
                RawChap::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(|t| RawTargetChap::Table(Box::new(t)))
            }
        }
        d.deserialize_any(V)
    }
}

/// A size: a number of bytes or a string with a unit ("64M").
enum RawSize {
    Bytes(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for RawSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawSize;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a size: a number of bytes or a string such as \"64M\" or \"10G\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawSize, E> {
                Ok(RawSize::Bytes(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawSize, E> {
                u64::try_from(v)
                    .map(RawSize::Bytes)
                    .map_err(|_| E::custom(format!("a size cannot be negative ({v})")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawSize, E> {
                Ok(RawSize::Text(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A LUN: the command-line spec string, or a table. Deserialized by hand
/// (not `untagged`) so that a mistake inside the table is reported with
/// its key and line rather than as "did not match any variant".
enum RawLun {
    Spec(String),
    Table(Box<RawLunTable>),
}

impl<'de> Deserialize<'de> for RawLun {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawLun;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a LUN: a spec string (\"PATH:SIZE,ro\", \"ram:64M\") or a table (path = ..., size = ...)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawLun, E> {
                Ok(RawLun::Spec(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<RawLun, A::Error> {
                RawLunTable::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(|t| RawLun::Table(Box::new(t)))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLunTable {
    path: Option<PathBuf>,
    ram: Option<RawSize>,
    size: Option<RawSize>,
    #[serde(default)]
    read_only: bool,
    #[serde(default)]
    removable: bool,
    block_size: Option<u32>,
    serial: Option<String>,
    /// NAA designator, 32 hex digits (NAA-6) or 16 (NAA-5).
    naa: Option<String>,
    write_cache: Option<bool>,
    provisioning: Option<String>,
    physical_block_size: Option<u32>,
    /// O_DIRECT.
    #[serde(default)]
    direct: bool,
    /// Exported on purpose by other servers too: locked shared.
    #[serde(default)]
    shared: bool,
    /// "sync" or "uring".
    engine: Option<String>,
    /// Most bytes per second a SANITIZE writes.
    sanitize_rate: Option<RawSize>,
    /// LUN masking: the initiators that see this LUN.
    #[serde(default)]
    initiators: Vec<String>,
    /// Initiators for which this LUN is read-only.
    #[serde(default)]
    read_only_initiators: Vec<String>,
    /// AoE address: "SHELF.SLOT" or "off".
    aoe: Option<String>,
    /// Least native transport channel security: "none", "integrity",
    /// "encrypt".
    security: Option<String>,
    /// The LUN number (default: the previous LUN's plus one, from 0).
    number: Option<u64>,
    /// A Ceph RBD image, "POOL/IMAGE" (with `size`: created when missing).
    rbd: Option<String>,
    /// The Ceph configuration file for `rbd` (default: librados' own search).
    ceph_conf: Option<PathBuf>,
    /// The cephx user for `rbd`, without "client." (default: admin).
    ceph_id: Option<String>,
    /// The keyring for `rbd` (default: the configuration file's).
    ceph_keyring: Option<PathBuf>,
    /// Seconds a cluster may take to answer before a command fails.
    ceph_timeout: Option<u64>,
}

fn raw_size(s: &RawSize) -> Result<u64, ConfigError> {
    match s {
        RawSize::Bytes(b) => Ok(*b),
        RawSize::Text(t) => parse_size(t),
    }
}

/// Make an error about a table point at the key it names, and an error
/// about a value name its key.
///
/// A message about a section (`[options]`, a `[[target.lun]]`) that starts
/// with one of the section's keys (`queue_depth = 0 is outside ...`) is
/// moved to that key's line; a message at a value whose line is
/// `key = value` and that does not mention the key (toml's "invalid type:
/// string, expected a boolean") gets the key in front.
fn point_at_key(
    text: &str,
    span: Option<Range<usize>>,
    msg: String,
) -> (Option<Range<usize>>, String) {
    let Some(span) = span else {
        return (None, msg);
    };
    let first_word: String = msg
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let end = span.end.min(text.len());
    let start = span.start.min(end);
    if !first_word.is_empty() {
        let mut offset = start;
        for line in text[start..end].split_inclusive('\n') {
            let t = line.trim_start();
            if let Some(rest) = t.strip_prefix(first_word.as_str()) {
                if rest.trim_start().starts_with('=') {
                    let at = offset + (line.len() - t.len());
                    return (Some(at..at + first_word.len()), msg);
                }
            }
            offset += line.len();
        }
    }
    // The line the span starts on, if it is `key = value`.
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("");
    if let Some((key, _)) = line.split_once('=') {
        let key = key.trim();
        let is_key = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if is_key && start > line_start + key.len() && !msg.starts_with(key) {
            return (Some(span), format!("{key}: {msg}"));
        }
    }
    (Some(span), msg)
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count())
        .unwrap_or(0)
        + 1;
    (line, col)
}

/// The text being read, to point errors at `ORIGIN:LINE:COL`, and the
/// directory its relative paths are relative to.
struct Source<'a> {
    text: &'a str,
    origin: &'a str,
    base: &'a Path,
}

impl Source<'_> {
    /// The error `msg` at `span` (its key when it has one).
    fn at(&self, span: Option<Range<usize>>, msg: String) -> ConfigError {
        let (span, msg) = point_at_key(self.text, span, msg);
        let (line, col) = line_col(self.text, span.map(|s| s.start).unwrap_or(0));
        ConfigError::At {
            origin: self.origin.to_string(),
            line,
            col,
            msg,
        }
    }
}

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
            isns,
        })
    }
}
