//! The raw serde form of the configuration file: one type per table,
//! deserialized with the spans errors point at, and the few parsers of
//! their values (addresses, secrets, sizes).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::super::{parse_size, ChapConfig, ConfigError, Options};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) portals: Vec<Spanned<RawPortal>>,
    #[serde(default, rename = "target")]
    pub(super) targets: Vec<Spanned<RawTarget>>,
    #[serde(default)]
    pub(super) options: Option<Spanned<Options>>,
    pub(super) chap: Option<Spanned<RawChap>>,
    pub(super) discovery: Option<RawDiscovery>,
    pub(super) aoe: Option<Spanned<RawAoe>>,
    pub(super) ethernet: Option<Spanned<RawEthernet>>,
    pub(super) nvme: Option<Spanned<RawNvme>>,
    pub(super) isns: Option<Spanned<RawIsns>>,
}

/// `[isns]`: registration with an iSNS server.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIsns {
    /// `HOST[:PORT]`.
    pub(super) server: String,
    /// Portal addresses to register instead of the listening ones.
    #[serde(default)]
    pub(super) portals: Vec<String>,
    /// The network entity's identifier.
    pub(super) entity: Option<String>,
}

/// An element of `portals`: `"ADDR:PORT"`, or a table
/// `{ listen = "ADDR:PORT", advertise = "ADDR:PORT" }`. Deserialized by
/// hand so that a mistake in the table is reported with its key.
pub(super) enum RawPortal {
    Addr(String),
    Table(RawPortalTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPortalTable {
    /// The address to listen on.
    pub(super) listen: String,
    /// The address SendTargets announces instead.
    pub(super) advertise: Option<String>,
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
pub(super) fn socket_addr(text: &str, what: &str) -> Result<SocketAddr, String> {
    text.trim().parse().map_err(|_| {
        format!("{what} {text:?} is not ADDR:PORT (an IP address and a port, IPv6 as [::1]:3260)")
    })
}

/// `[ethernet]`: the native transport.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEthernet {
    /// Network interfaces (AF_PACKET).
    #[serde(default)]
    pub(super) interfaces: Vec<String>,
    /// Unix datagram links, as `unix:LOCAL,peer=PEER[,mac=..][,mtu=..]`.
    #[serde(default)]
    pub(super) unix: Vec<String>,
    /// UDP portals, as `ADDR:PORT[,mtu=N]`.
    #[serde(default)]
    pub(super) udp: Vec<String>,
    /// The group name.
    pub(super) group: Option<String>,
    /// A file holding the group secret.
    pub(super) secret_file: Option<PathBuf>,
    /// The group secret inline.
    pub(super) secret: Option<String>,
    /// The EtherType, e.g. "0x88B5".
    pub(super) ethertype: Option<String>,
}

/// `[nvme]`: the NVMe/TCP target.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNvme {
    /// Listening addresses, as `ADDR[:PORT]`.
    #[serde(default)]
    pub(super) portals: Vec<String>,
}

/// `[aoe]`: the AoE target.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAoe {
    /// Network interfaces (AF_PACKET).
    #[serde(default)]
    pub(super) interfaces: Vec<String>,
    /// Unix datagram links, as `unix:LOCAL,peer=PEER[,mac=..][,mtu=..]`.
    #[serde(default)]
    pub(super) unix: Vec<String>,
    /// Initiator MACs allowed to issue commands (empty: any).
    #[serde(default)]
    pub(super) allowed_macs: Vec<String>,
}

/// `[discovery]`: settings for discovery sessions.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDiscovery {
    pub(super) chap: Option<Spanned<RawChap>>,
}

/// `[chap]`: a secret inline, from a file, or from an environment variable.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawChap {
    pub(super) user: String,
    pub(super) secret: Option<String>,
    pub(super) secret_file: Option<PathBuf>,
    pub(super) secret_env: Option<String>,
    pub(super) mutual_user: Option<String>,
    pub(super) mutual_secret: Option<String>,
    pub(super) mutual_secret_file: Option<PathBuf>,
    pub(super) mutual_secret_env: Option<String>,
    /// Only in the global `[chap]`: discovery sessions authenticate too.
    pub(super) discovery: Option<bool>,
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
    pub(super) fn resolve(self, global: bool, base: &Path) -> Result<ChapConfig, String> {
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
pub(super) struct RawTarget {
    pub(super) name: Spanned<String>,
    pub(super) alias: Option<String>,
    /// Absent is a mistake; an explicit `lun = []` is a target with no
    /// LUNs yet (as `ethersan ctl save` writes one).
    #[serde(rename = "lun")]
    pub(super) luns: Option<Vec<Spanned<RawLun>>>,
    /// Access rules: a name, a network, or NAME@NETWORK; any admits.
    #[serde(default)]
    pub(super) allow: Vec<Spanned<String>>,
    /// Before the rules: names, ANDed with `allow_networks`.
    #[serde(default)]
    pub(super) allow_initiators: Vec<Spanned<String>>,
    #[serde(default)]
    pub(super) allow_networks: Vec<Spanned<String>>,
    pub(super) chap: Option<Spanned<RawTargetChap>>,
}

/// A target's `chap`: the word `"none"` (opt out of the global `[chap]`)
/// or a `[target.chap]` table. Deserialized by hand so that a mistake in
/// the table is reported with its key.
pub(super) enum RawTargetChap {
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
pub(super) enum RawSize {
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
pub(super) enum RawLun {
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
pub(super) struct RawLunTable {
    pub(super) path: Option<PathBuf>,
    pub(super) ram: Option<RawSize>,
    pub(super) size: Option<RawSize>,
    #[serde(default)]
    pub(super) read_only: bool,
    #[serde(default)]
    pub(super) removable: bool,
    pub(super) block_size: Option<u32>,
    pub(super) serial: Option<String>,
    /// NAA designator, 32 hex digits (NAA-6) or 16 (NAA-5).
    pub(super) naa: Option<String>,
    pub(super) write_cache: Option<bool>,
    pub(super) provisioning: Option<String>,
    pub(super) physical_block_size: Option<u32>,
    /// O_DIRECT.
    #[serde(default)]
    pub(super) direct: bool,
    /// Exported on purpose by other servers too: locked shared.
    #[serde(default)]
    pub(super) shared: bool,
    /// "sync" or "uring".
    pub(super) engine: Option<String>,
    /// Most bytes per second a SANITIZE writes.
    pub(super) sanitize_rate: Option<RawSize>,
    /// LUN masking: the initiators that see this LUN.
    #[serde(default)]
    pub(super) initiators: Vec<String>,
    /// Initiators for which this LUN is read-only.
    #[serde(default)]
    pub(super) read_only_initiators: Vec<String>,
    /// AoE address: "SHELF.SLOT" or "off".
    pub(super) aoe: Option<String>,
    /// Least native transport channel security: "none", "integrity",
    /// "encrypt".
    pub(super) security: Option<String>,
    /// The LUN number (default: the previous LUN's plus one, from 0).
    pub(super) number: Option<u64>,
    /// A Ceph RBD image, "POOL/IMAGE" (with `size`: created when missing).
    pub(super) rbd: Option<String>,
    /// The Ceph configuration file for `rbd` (default: librados' own search).
    pub(super) ceph_conf: Option<PathBuf>,
    /// The cephx user for `rbd`, without "client." (default: admin).
    pub(super) ceph_id: Option<String>,
    /// The keyring for `rbd` (default: the configuration file's).
    pub(super) ceph_keyring: Option<PathBuf>,
    /// Seconds a cluster may take to answer before a command fails.
    pub(super) ceph_timeout: Option<u64>,
}

pub(super) fn raw_size(s: &RawSize) -> Result<u64, ConfigError> {
    match s {
        RawSize::Bytes(b) => Ok(*b),
        RawSize::Text(t) => parse_size(t),
    }
}
