//! The TOML form of the configuration: raw serde types and their
//! conversion, with `FILE:LINE:COL` in every error.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::{
    parse_naa, parse_network, parse_size, shared_backing_file, validate_name, Access, AclRule,
    Backing, ChapConfig, Config, ConfigError, LunConfig, Options, TargetChap, TargetConfig,
    DEFAULT_ENGINE,
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
    /// `base` (`""`: as they are).
    pub(super) fn parse_toml(text: &str, origin: &str, base: &Path) -> Result<Config, ConfigError> {
        let at = |span: Option<Range<usize>>, msg: String| {
            let (span, msg) = point_at_key(text, span, msg);
            let (line, col) = line_col(text, span.map(|s| s.start).unwrap_or(0));
            ConfigError::At {
                origin: origin.to_string(),
                line,
                col,
                msg,
            }
        };
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| at(e.span(), e.message().to_string()))?;
        let options = match raw.options {
            Some(o) => {
                let span = o.span();
                let o = o.into_inner();
                o.validate().map_err(|m| at(Some(span), m))?;
                o
            }
            None => Options::default(),
        };
        let options = Options {
            data_dir: base.join(&options.data_dir),
            ..options
        };
        let mut portals = Vec::new();
        let mut advertise = std::collections::BTreeMap::new();
        for p in raw.portals {
            let span = p.span();
            let (listen, adv) = match p.into_inner() {
                RawPortal::Addr(a) => (a, None),
                RawPortal::Table(t) => (t.listen, t.advertise),
            };
            let addr = socket_addr(&listen, "portal").map_err(|m| at(Some(span.clone()), m))?;
            if portals.contains(&addr) && addr.port() != 0 {
                return Err(at(
                    Some(span),
                    format!("portal {addr} is listed twice: list each address once"),
                ));
            }
            if let Some(a) = adv {
                let a = socket_addr(&a, "advertise")
                    .map_err(|m| at(Some(span.clone()), format!("portal {addr}: {m}")))?;
                if a.ip().is_unspecified() || a.port() == 0 {
                    return Err(at(
                        Some(span),
                        format!("portal {addr}: advertise {a} cannot be reached by initiators: give the address and port they connect to"),
                    ));
                }
                advertise.insert(addr, a);
            }
            portals.push(addr);
        }
        if portals.is_empty() {
            return Err(at(
                None,
                "no portals: add e.g. portals = [\"127.0.0.1:3260\"]".into(),
            ));
        }
        if raw.targets.is_empty() {
            return Err(at(None, "no targets: add a [[target]] table".into()));
        }
        let mut targets: Vec<TargetConfig> = Vec::new();
        let mut lun_spans: Vec<Vec<Range<usize>>> = Vec::new();
        for t in raw.targets {
            let tspan = t.span();
            let t = t.into_inner();
            validate_name(t.name.get_ref()).map_err(|e| at(Some(t.name.span()), e.to_string()))?;
            if targets.iter().any(|o| &o.name == t.name.get_ref()) {
                return Err(at(
                    Some(t.name.span()),
                    format!("duplicate target name {:?}", t.name.get_ref()),
                ));
            }
            let Some(raw_luns) = t.luns else {
                return Err(at(
                    Some(tspan),
                    format!(
                        "target {:?} has no [[target.lun]] (write lun = [] for a target with no LUNs yet)",
                        t.name.get_ref()
                    ),
                ));
            };
            let mut luns = Vec::new();
            let mut lun_initiators: Vec<Vec<String>> = Vec::new();
            let mut lun_read_only: Vec<Vec<String>> = Vec::new();
            lun_spans.push(raw_luns.iter().map(|l| l.span()).collect());
            let spans: Vec<Range<usize>> = raw_luns.iter().map(|l| l.span()).collect();
            for l in raw_luns {
                let span = l.span();
                let mut seen_by = Vec::new();
                let mut read_only_for = Vec::new();
                let lun = match l.into_inner() {
                    RawLun::Spec(s) => {
                        let mut lun = LunConfig::from_spec(&s)
                            .map_err(|e| at(Some(span.clone()), e.to_string()))?;
                        if let Backing::File { path, .. } = &mut lun.backing {
                            *path = base.join(&*path);
                        }
                        lun
                    }
                    RawLun::Table(tb) => {
                        let tb = *tb;
                        for i in &tb.initiators {
                            validate_name(i)
                                .map_err(|e| at(Some(span.clone()), format!("initiators: {e}")))?;
                        }
                        seen_by = tb.initiators.clone();
                        for i in &tb.read_only_initiators {
                            validate_name(i).map_err(|e| {
                                at(Some(span.clone()), format!("read_only_initiators: {e}"))
                            })?;
                        }
                        read_only_for = tb.read_only_initiators.clone();
                        if tb.rbd.is_none()
                            && (tb.ceph_conf.is_some()
                                || tb.ceph_id.is_some()
                                || tb.ceph_keyring.is_some()
                                || tb.ceph_timeout.is_some())
                        {
                            return Err(at(
                                Some(span),
                                "ceph_conf, ceph_id, ceph_keyring and ceph_timeout go with rbd = \"POOL/IMAGE\"".into(),
                            ));
                        }
                        let backing = match (&tb.path, &tb.ram) {
                            (None, None) if tb.rbd.is_some() => {
                                let mut text = tb.rbd.clone().unwrap_or_default();
                                if let Some(s) = &tb.size {
                                    let bytes = raw_size(s).map_err(|e| at(Some(span.clone()), e.to_string()))?;
                                    text.push_str(&format!(":{bytes}"));
                                }
                                if let Some(c) = &tb.ceph_conf {
                                    text.push_str(&format!(",conf={}", base.join(c).display()));
                                }
                                if let Some(i) = &tb.ceph_id {
                                    text.push_str(&format!(",id={i}"));
                                }
                                if let Some(k) = &tb.ceph_keyring {
                                    text.push_str(&format!(",keyring={}", base.join(k).display()));
                                }
                                if let Some(t) = tb.ceph_timeout {
                                    text.push_str(&format!(",timeout={t}"));
                                }
                                Backing::Rbd {
                                    spec: ethersan_rbd::RbdSpec::parse(&text)
                                        .map_err(|e| at(Some(span.clone()), format!("rbd: {e}")))?,
                                }
                            }
                            (Some(p), None) if tb.rbd.is_none() => Backing::File {
                                path: base.join(p),
                                size: tb.size.as_ref().map(raw_size).transpose().map_err(|e| at(Some(span.clone()), e.to_string()))?,
                            },
                            (None, Some(r)) if tb.size.is_none() && tb.rbd.is_none() => {
                                Backing::Ram { size: raw_size(r).map_err(|e| at(Some(span.clone()), e.to_string()))? }
                            }
                            _ => {
                                return Err(at(
                                    Some(span),
                                    "a LUN needs exactly one of path = \"...\" (with optional size), ram = \"SIZE\" or rbd = \"POOL/IMAGE\" (with optional size)".into(),
                                ))
                            }
                        };
                        let lun = LunConfig {
                            number: tb.number,
                            backing,
                            read_only: tb.read_only,
                            removable: tb.removable,
                            block_size: tb.block_size.unwrap_or(512),
                            serial: tb.serial,
                            naa: tb
                                .naa
                                .as_deref()
                                .map(parse_naa)
                                .transpose()
                                .map_err(|m| at(Some(span.clone()), m))?,
                            write_cache: tb.write_cache.unwrap_or(true),
                            aoe: match tb.aoe.as_deref() {
                                None => super::AoeAddress::Default,
                                Some(a) => a.parse().map_err(|m| at(Some(span.clone()), m))?,
                            },
                            security: match tb.security.as_deref() {
                                None => ethersan_channel::Level::default(),
                                Some(l) => l.parse().map_err(|m| {
                                    at(Some(span.clone()), format!("security = {m}"))
                                })?,
                            },
                            physical_block_size: tb.physical_block_size.unwrap_or(4096),
                            direct: tb.direct,
                            shared: tb.shared,
                            sanitize_rate: tb
                                .sanitize_rate
                                .as_ref()
                                .map(raw_size)
                                .transpose()
                                .map_err(|e| {
                                    at(Some(span.clone()), format!("sanitize_rate: {e}"))
                                })?,
                            engine: match tb.engine.as_deref() {
                                None => DEFAULT_ENGINE,
                                Some(e) => e
                                    .parse()
                                    .map_err(|e| at(Some(span.clone()), format!("engine = {e}")))?,
                            },
                            preallocate: match tb.provisioning.as_deref() {
                                None | Some("thin") => false,
                                Some("full") => true,
                                Some(other) => {
                                    return Err(at(
                                        Some(span),
                                        format!(
                                            "provisioning = {other:?}: use \"thin\" or \"full\""
                                        ),
                                    ))
                                }
                            },
                        };
                        lun.check().map_err(|m| at(Some(span.clone()), m))?;
                        lun
                    }
                };
                luns.push(lun);
                lun_initiators.push(seen_by);
                lun_read_only.push(read_only_for);
            }
            {
                let probe = TargetConfig {
                    name: String::new(),
                    alias: None,
                    luns: luns.clone(),
                    access: Access::default(),
                    chap: TargetChap::Inherit,
                };
                let numbered = probe.numbered();
                for (k, (n, i)) in numbered.iter().enumerate() {
                    if numbered[..k].iter().any(|(m, _)| m == n) {
                        return Err(at(
                            spans.get(*i).cloned(),
                            format!(
                                "target {:?}: two LUNs are numbered {n}; give each its own number",
                                t.name.get_ref()
                            ),
                        ));
                    }
                }
            }
            let mut access = Access {
                luns: lun_initiators,
                read_only: lun_read_only,
                ..Access::default()
            };
            for r in &t.allow {
                access.rules.push(
                    AclRule::parse(r.get_ref())
                        .map_err(|e| at(Some(r.span()), format!("allow: {e}")))?,
                );
            }
            // The lists of before the rules keep their meaning: a name on
            // the first AND an address on the second.
            let mut names = Vec::new();
            for i in &t.allow_initiators {
                validate_name(i.get_ref())
                    .map_err(|e| at(Some(i.span()), format!("allow_initiators: {e}")))?;
                names.push(i.get_ref().clone());
            }
            let mut networks = Vec::new();
            for n in &t.allow_networks {
                networks.push(
                    parse_network(n.get_ref())
                        .map_err(|e| at(Some(n.span()), format!("allow_networks: {e}")))?,
                );
            }
            let old = Access::rules_from_lists(&names, &networks);
            if !names.is_empty() && !networks.is_empty() {
                let (line, _) = line_col(text, t.allow_networks[0].span().start);
                let written: Vec<String> =
                    old.iter().map(|r| format!("{:?}", r.to_string())).collect();
                tracing::warn!(
                    "{origin}:{line}: target {}: allow_initiators and allow_networks together admit a listed name only from a listed network; read as allow = [{}]. Write that instead: in allow = [...] each rule admits on its own, so a grant (ethersan ctl acl add) widens access (docs/config.md, access rules)",
                    t.name.get_ref(),
                    written.join(", ")
                );
            }
            access.rules.extend(old);
            let chap = match t.chap {
                None => TargetChap::Inherit,
                Some(c) => {
                    let span = c.span();
                    match c.into_inner() {
                        RawTargetChap::Word(w) if w == "none" => TargetChap::None,
                        RawTargetChap::Word(w) => {
                            return Err(at(
                                Some(span),
                                format!(
                                    "chap = {w:?} in target {:?}: use chap = \"none\" (no CHAP for this target) or a [target.chap] table with user and secret",
                                    t.name.get_ref()
                                ),
                            ))
                        }
                        RawTargetChap::Table(c) => {
                            TargetChap::Chap(c.resolve(false, base).map_err(|m| {
                                at(
                                    Some(span),
                                    format!("[target.chap] of {:?}: {m}", t.name.get_ref()),
                                )
                            })?)
                        }
                    }
                }
            };
            targets.push(TargetConfig {
                name: t.name.into_inner(),
                alias: t.alias,
                luns,
                access,
                chap,
            });
        }
        if let Some((t, l, msg)) = shared_backing_file(&targets) {
            return Err(at(Some(lun_spans[t][l].clone()), msg));
        }
        let chap = match raw.chap {
            Some(c) => {
                let span = c.span();
                Some(
                    c.into_inner()
                        .resolve(true, base)
                        .map_err(|m| at(Some(span), format!("[chap]: {m}")))?,
                )
            }
            None => None,
        };
        let discovery_chap = match raw.discovery.and_then(|d| d.chap) {
            Some(c) => {
                let span = c.span();
                if chap.as_ref().is_some_and(|c| !c.discovery) {
                    return Err(at(
                        Some(span),
                        "[discovery.chap] contradicts discovery = false in [chap]; remove one"
                            .into(),
                    ));
                }
                let mut d = c
                    .into_inner()
                    .resolve(false, base)
                    .map_err(|m| at(Some(span), format!("[discovery.chap]: {m}")))?;
                d.discovery = true;
                Some(d)
            }
            None => None,
        };
        let aoe = match raw.aoe {
            None => super::AoeConfig::default(),
            Some(a) => {
                let span = a.span();
                let a = a.into_inner();
                let mut links: Vec<super::AoeLink> = a
                    .interfaces
                    .into_iter()
                    .map(super::AoeLink::Interface)
                    .collect();
                for u in &a.unix {
                    let spec = if u.starts_with("unix:") {
                        u.clone()
                    } else {
                        format!("unix:{u}")
                    };
                    let mut link = super::AoeLink::parse(&spec)
                        .map_err(|m| at(Some(span.clone()), format!("[aoe] unix: {m}")))?;
                    if let super::AoeLink::Unix { local, peer, .. } = &mut link {
                        *local = base.join(&*local);
                        *peer = base.join(&*peer);
                    }
                    links.push(link);
                }
                let allowed_macs = super::parse_macs(&a.allowed_macs)
                    .map_err(|m| at(Some(span.clone()), format!("[aoe] {m}")))?;
                super::AoeConfig {
                    links,
                    allowed_macs,
                }
            }
        };
        let ethernet = match raw.ethernet {
            None => super::EthernetConfig::default(),
            Some(e) => {
                let span = e.span();
                let e = e.into_inner();
                let mut links: Vec<super::AoeLink> = e
                    .interfaces
                    .into_iter()
                    .map(super::AoeLink::Interface)
                    .collect();
                for u in &e.unix {
                    let spec = if u.starts_with("unix:") {
                        u.clone()
                    } else {
                        format!("unix:{u}")
                    };
                    let mut link = super::AoeLink::parse_option(&spec, "unix")
                        .map_err(|m| at(Some(span.clone()), format!("[ethernet] {m}")))?;
                    if let super::AoeLink::Unix { local, peer, .. } = &mut link {
                        *local = base.join(&*local);
                        *peer = base.join(&*peer);
                    }
                    links.push(link);
                }
                let udp = e
                    .udp
                    .iter()
                    .map(|u| super::UdpPortal::parse(u))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|m| at(Some(span.clone()), format!("[ethernet] udp: {m}")))?;
                let ethertype = match e.ethertype.as_deref() {
                    None => ethersan_channel::ETHERTYPE_NATIVE,
                    Some(t) => super::parse_ethertype(t)
                        .map_err(|m| at(Some(span.clone()), format!("[ethernet] {m}")))?,
                };
                super::EthernetConfig {
                    links,
                    udp,
                    group: e.group,
                    secret_file: e.secret_file.map(|f| base.join(f)),
                    secret: e.secret,
                    ethertype,
                }
            }
        };
        let isns = match raw.isns {
            None => None,
            Some(i) => {
                let span = i.span();
                let i = i.into_inner();
                let mut c = super::IsnsConfig::parse_server(&i.server)
                    .map_err(|m| at(Some(span.clone()), format!("[isns] server: {m}")))?;
                for p in &i.portals {
                    c.portals.push(p.parse().map_err(|_| {
                        at(
                            Some(span.clone()),
                            format!("[isns] portals: {p:?} is not ADDR:PORT (IPv6 as [::1]:3260)"),
                        )
                    })?);
                }
                if let Some(e) = &i.entity {
                    if e.is_empty() || e.len() > 255 {
                        return Err(at(
                            Some(span),
                            "[isns] entity: give 1 to 255 characters".into(),
                        ));
                    }
                }
                c.entity = i.entity;
                Some(c)
            }
        };
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
