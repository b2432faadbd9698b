//! The server's configuration model: portals, targets, LUNs and options,
//! from a TOML file or from the command line's `--lun` specs.
//!
//! Every error names where it comes from: `FILE:LINE:COL: what is wrong`
//! for files, the spec itself for the command line. The schema is
//! documented in `docs/config.md`; `examples/ethersan.toml` shows every key.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ethersan_backend::file::{FileDevice, FileOptions, IoEngine};
use ethersan_backend::ram::RamDevice;
use ethersan_backend::{BackendError, BlockDevice};
use serde::Deserialize;
use toml::Spanned;

/// A configuration error, with its origin.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A problem at a known place in a file.
    #[error("{origin}:{line}:{col}: {msg}")]
    At {
        /// File name.
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What is wrong.
        msg: String,
    },
    /// A problem in a value given on the command line (or with no place).
    #[error("{0}")]
    Invalid(String),
}

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Portals (one portal group, tag 1); every target is reachable on each.
    pub portals: Vec<SocketAddr>,
    /// Exported targets.
    pub targets: Vec<TargetConfig>,
    /// Protocol and runtime options.
    pub options: Options,
    /// CHAP: when set, every login (normal, and discovery unless
    /// `chap_discovery` is off) must authenticate.
    pub chap: Option<ChapConfig>,
    /// `[discovery.chap]`: discovery sessions' own credentials, overriding
    /// `chap` (and its `discovery` switch) for them.
    pub discovery_chap: Option<ChapConfig>,
}

/// CHAP settings (`[chap]`, or `serve --chap` / `--mutual-chap`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapConfig {
    /// Name and secret initiators must prove.
    pub initiator: ethersan_proto::chap::Credentials,
    /// The target's own, for mutual CHAP.
    pub target: Option<ethersan_proto::chap::Credentials>,
    /// Discovery sessions authenticate too (meaningful in the global
    /// `[chap]` only; `[discovery.chap]` and `[target.chap]` set it true).
    pub discovery: bool,
}

/// One target.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// iSCSI name (iqn., eui. or naa.).
    pub name: String,
    /// TargetAlias.
    pub alias: Option<String>,
    /// LUNs, numbered from 0 in order.
    pub luns: Vec<LunConfig>,
    /// Who may log in to the target (and see it in SendTargets).
    pub access: Access,
    /// `[target.chap]`: this target's own CHAP credentials, overriding the
    /// global `[chap]` for logins to it.
    pub chap: Option<ChapConfig>,
}

/// A target's access list: initiator names and source networks. Empty
/// lists allow everyone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// Initiator names allowed (exact match); empty: any.
    pub initiators: Vec<String>,
    /// Source networks allowed, as (address, prefix length); empty: any.
    pub networks: Vec<(std::net::IpAddr, u8)>,
    /// Per LUN (by number): the initiators that see it; empty or missing:
    /// every initiator allowed on the target (LUN masking).
    pub luns: Vec<Vec<String>>,
    /// Per LUN: initiators for which it is read-only.
    pub read_only: Vec<Vec<String>>,
}

impl Access {
    /// Whether `initiator` connecting from `ip` may use the target.
    pub fn allows(&self, initiator: &str, ip: Option<std::net::IpAddr>) -> bool {
        let name_ok = self.initiators.is_empty() || self.initiators.iter().any(|i| i == initiator);
        let net_ok = self.networks.is_empty()
            || ip.is_some_and(|ip| {
                self.networks
                    .iter()
                    .any(|(net, len)| in_network(ip, *net, *len))
            });
        name_ok && net_ok
    }

    /// Which LUNs are read-only for `initiator` (`None`: none).
    pub fn read_only_mask(&self, initiator: &str, lun_count: usize) -> Option<Vec<bool>> {
        let mask: Vec<bool> = (0..lun_count)
            .map(|i| {
                self.read_only
                    .get(i)
                    .is_some_and(|l| l.iter().any(|n| n == initiator))
            })
            .collect();
        mask.iter().any(|b| *b).then_some(mask)
    }

    /// Which LUNs `initiator` sees (`None`: all of them).
    pub fn lun_mask(&self, initiator: &str, lun_count: usize) -> Option<Vec<bool>> {
        if self.luns.iter().all(|l| l.is_empty()) {
            return None;
        }
        Some(
            (0..lun_count)
                .map(|i| {
                    self.luns
                        .get(i)
                        .is_none_or(|l| l.is_empty() || l.iter().any(|n| n == initiator))
                })
                .collect(),
        )
    }
}

/// Parse `ADDR/LEN` (or a bare address: a single host).
pub fn parse_network(s: &str) -> Result<(std::net::IpAddr, u8), String> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip: std::net::IpAddr = addr
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not an address or ADDR/LEN network"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        Some(l) => l
            .trim()
            .parse::<u8>()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| format!("{s:?}: prefix length must be 0..={max}"))?,
        None => max,
    };
    Ok((ip, len))
}

fn in_network(ip: std::net::IpAddr, net: std::net::IpAddr, len: u8) -> bool {
    use std::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = if len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(len))
            };
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(len))
            };
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

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
}

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
    /// Unit serial number; derived from target and LUN when absent.
    pub serial: Option<String>,
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
}

/// The I/O engine of a file LUN that names none: the faster one in the
/// measurements in docs/benchmark.md ("I/O engines").
pub const DEFAULT_ENGINE: IoEngine = IoEngine::Uring;

/// Protocol limits and runtime knobs, with measured or RFC-safe defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Options {
    /// MaxRecvDataSegmentLength the target declares.
    pub max_recv_data_segment_length: u32,
    /// Largest MaxBurstLength accepted.
    pub max_burst_length: u32,
    /// Largest FirstBurstLength accepted.
    pub first_burst_length: u32,
    /// InitialR2T preference.
    pub initial_r2t: bool,
    /// ImmediateData preference.
    pub immediate_data: bool,
    /// Largest MaxOutstandingR2T accepted.
    pub max_outstanding_r2t: u32,
    /// Header digests accepted, in preference order ("None", "CRC32C").
    pub header_digest: String,
    /// Data digests accepted, in preference order.
    pub data_digest: String,
    /// Commands in flight per session (the CmdSN window).
    pub queue_depth: u32,
    /// Seconds of silence before the target pings (0: never).
    pub nop_interval_secs: u64,
    /// Seconds to wait for a ping's answer before dropping the connection.
    pub nop_timeout_secs: u64,
    /// Seconds a login may take.
    pub login_timeout_secs: u64,
    /// Most sessions at once.
    pub max_sessions: usize,
    /// Most connections open at once from one source address (0: no
    /// limit); more are closed before any PDU is read.
    pub max_connections_per_address: usize,
    /// Most bytes of key text a login (all its Continue PDUs together) or
    /// a text negotiation may send; at least 8192, the login phase's
    /// MaxRecvDataSegmentLength.
    pub max_key_text_bytes: usize,
    /// Most bytes of command data buffers one session holds at once
    /// (writes' buffers are reserved when their R2Ts go out, reads' until
    /// their Data-In is sent); commands beyond it wait. One command always
    /// runs, however large.
    pub session_memory_budget: usize,
    /// Directory for default backing files.
    pub data_dir: PathBuf,
    /// Threads that run sessions (tokio workers); 0: one per CPU.
    pub worker_threads: usize,
    /// Run commands that need no waiting (page-cache reads and writes,
    /// RAM, metadata) on the session's own thread; false sends every command
    /// to the blocking pool.
    pub inline_io: bool,
    /// How connections are spread over worker threads.
    pub placement: Placement,
}

/// How connections are spread over worker threads (`placement` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// tokio's work-stealing runtime: connections' tasks move between
    /// workers as load changes.
    #[default]
    Shared,
    /// One single-threaded runtime per worker, pinned to a CPU; each new
    /// connection goes to the worker with the fewest connections and stays
    /// there.
    Pinned,
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "shared" => Ok(Placement::Shared),
            "pinned" => Ok(Placement::Pinned),
            other => Err(format!("placement {other:?}: use shared or pinned")),
        }
    }
}

/// Default `max_connections_per_address`: room for many sessions and
/// multipath from one host, far below what a single host can open to
/// exhaust the server.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 128;

/// Default `max_key_text_bytes` (64 KiB): eight full login PDUs at the
/// login phase's 8192-byte MaxRecvDataSegmentLength, far more than any
/// standard negotiation needs (key names are at most 63 bytes, values at
/// most 255 or, for a few keys, 8192), while bounding what one connection
/// can make the target buffer.
pub const DEFAULT_MAX_KEY_TEXT_BYTES: usize = 64 * 1024;

/// Smallest `max_key_text_bytes`: one full login PDU at the login phase's
/// MaxRecvDataSegmentLength, which RFC 7143 requires a target to accept.
pub const MIN_KEY_TEXT_BYTES: usize = 8192;

impl Default for Options {
    fn default() -> Self {
        Options {
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1 << 20,
            first_burst_length: 65_536,
            initial_r2t: false,
            immediate_data: true,
            max_outstanding_r2t: 4,
            header_digest: "None,CRC32C".into(),
            data_digest: "None,CRC32C".into(),
            queue_depth: 128,
            nop_interval_secs: 30,
            nop_timeout_secs: 60,
            login_timeout_secs: 15,
            max_sessions: 1024,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            max_key_text_bytes: DEFAULT_MAX_KEY_TEXT_BYTES,
            session_memory_budget: ethersan_core::budget::DEFAULT_SESSION_BUDGET,
            data_dir: PathBuf::from("./ethersan-data"),
            worker_threads: 0,
            inline_io: true,
            placement: Placement::Shared,
        }
    }
}

impl Options {
    /// Check ranges (RFC 7143 §13) and consistency; a message per problem.
    pub fn validate(&self) -> Result<(), String> {
        const MAX24: u32 = (1 << 24) - 1;
        let in_range = |name: &str, v: u32, lo: u32, hi: u32| {
            if v < lo || v > hi {
                Err(format!("{name} = {v} is outside {lo}..={hi}"))
            } else {
                Ok(())
            }
        };
        in_range(
            "max_recv_data_segment_length",
            self.max_recv_data_segment_length,
            512,
            MAX24,
        )?;
        in_range("max_burst_length", self.max_burst_length, 512, MAX24)?;
        in_range("first_burst_length", self.first_burst_length, 512, MAX24)?;
        in_range("max_outstanding_r2t", self.max_outstanding_r2t, 1, 65535)?;
        in_range("queue_depth", self.queue_depth, 1, 65535)?;
        if self.worker_threads > 1024 {
            return Err(format!(
                "worker_threads = {} is outside 0..=1024",
                self.worker_threads
            ));
        }
        if self.first_burst_length > self.max_burst_length {
            return Err("first_burst_length must not exceed max_burst_length".into());
        }
        for (name, v) in [
            ("header_digest", &self.header_digest),
            ("data_digest", &self.data_digest),
        ] {
            if v.split(',').any(|d| d != "None" && d != "CRC32C") || v.is_empty() {
                return Err(format!("{name} = {v:?}: use a list of None and CRC32C"));
            }
        }
        if self.max_sessions == 0 {
            return Err("max_sessions must be at least 1".into());
        }
        if self.session_memory_budget < 1 << 20 {
            return Err(format!(
                "session_memory_budget = {} is below 1 MiB (1048576); the default is {}",
                self.session_memory_budget,
                ethersan_core::budget::DEFAULT_SESSION_BUDGET
            ));
        }
        if !(MIN_KEY_TEXT_BYTES..=16 << 20).contains(&self.max_key_text_bytes) {
            return Err(format!(
                "max_key_text_bytes = {} is outside {MIN_KEY_TEXT_BYTES}..={}",
                self.max_key_text_bytes,
                16 << 20
            ));
        }
        Ok(())
    }
}

/// Parse a size: bytes, or a number with K, M, G, T (powers of 1024; an
/// optional trailing "iB" or "B" is accepted).
pub fn parse_size(s: &str) -> Result<u64, ConfigError> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "bad size {s:?}: unknown unit '{c}' (use K, M, G, T)"
                    )))
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| ConfigError::Invalid(format!("bad size {s:?}")))?;
    n.checked_mul(mult)
        .filter(|v| *v > 0)
        .ok_or_else(|| ConfigError::Invalid(format!("bad size {s:?}")))
}

/// Check an iSCSI name (RFC 7143 §4.2.7): `iqn.YYYY-MM.reverse.domain[:x]`,
/// `eui.` + 16 hex digits, or `naa.` + 16 or 32 hex digits; at most 223 bytes.
pub fn validate_name(name: &str) -> Result<(), ConfigError> {
    let bad = |why: &str| {
        Err(ConfigError::Invalid(format!(
            "invalid iSCSI name {name:?}: {why}"
        )))
    };
    if name.len() > 223 {
        return bad("longer than 223 bytes");
    }
    if let Some(rest) = name.strip_prefix("iqn.") {
        let b = rest.as_bytes();
        let date_ok = b.len() > 8
            && b[..4].iter().all(u8::is_ascii_digit)
            && b[4] == b'-'
            && b[5..7].iter().all(u8::is_ascii_digit)
            && b[7] == b'.';
        if !date_ok {
            return bad("expected iqn.YYYY-MM.reverse.domain");
        }
        if !name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b".-:".contains(&c))
        {
            return bad("only lower-case letters, digits, '.', '-' and ':' are allowed");
        }
        Ok(())
    } else if let Some(hex) = name.strip_prefix("eui.") {
        if hex.len() == 16 && hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            Ok(())
        } else {
            bad("eui. needs 16 hex digits")
        }
    } else if let Some(hex) = name.strip_prefix("naa.") {
        if (hex.len() == 16 || hex.len() == 32) && hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            Ok(())
        } else {
            bad("naa. needs 16 or 32 hex digits")
        }
    } else {
        bad("must start with iqn., eui. or naa.")
    }
}

impl LunConfig {
    /// Parse the command-line form `PATH[:SIZE][,ro][,removable][,bs=4096]`
    /// or `ram:SIZE[,...]`.
    pub fn from_spec(spec: &str) -> Result<LunConfig, ConfigError> {
        let mut parts = spec.split(',');
        let head = parts.next().unwrap_or("");
        if head.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "LUN spec {spec:?} names no backing store"
            )));
        }
        let backing = if let Some(size) = head.strip_prefix("ram:") {
            Backing::Ram {
                size: parse_size(size)?,
            }
        } else {
            match head.rsplit_once(':') {
                Some((path, size)) if !path.is_empty() && parse_size(size).is_ok() => {
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
            write_cache: true,
            preallocate: false,
            physical_block_size: 4096,
            direct: false,
            engine: DEFAULT_ENGINE,
        };
        for opt in parts {
            match opt {
                "ro" => lun.read_only = true,
                "removable" => lun.removable = true,
                "wce=0" | "nowce" => lun.write_cache = false,
                "full" | "prealloc" => lun.preallocate = true,
                "direct" => lun.direct = true,
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
                o => {
                    return Err(ConfigError::Invalid(format!(
                        "LUN spec {spec:?}: unknown option {o:?} (known: ro, removable, bs=512|4096, pbs=512|4096, serial=S, wce=0, full, direct, engine=sync|uring)"
                    )))
                }
            }
        }
        lun.check().map_err(ConfigError::Invalid)?;
        Ok(lun)
    }

    fn check(&self) -> Result<(), String> {
        let size = match &self.backing {
            Backing::Ram { size } => Some(*size),
            Backing::File { size, .. } => *size,
        };
        if let Some(s) = size {
            if s % u64::from(self.block_size) != 0 {
                return Err(format!(
                    "size {s} is not a multiple of the block size {}",
                    self.block_size
                ));
            }
        }
        if self.block_size != 512 && self.block_size != 4096 {
            return Err(format!("block size {} (use 512 or 4096)", self.block_size));
        }
        if !matches!(self.physical_block_size, 512 | 4096)
            || self.physical_block_size < self.block_size
        {
            return Err(format!(
                "physical block size {} (use 512 or 4096, not below the block size {})",
                self.physical_block_size, self.block_size
            ));
        }
        if matches!(self.backing, Backing::Ram { .. }) && self.read_only {
            return Err("a RAM LUN cannot be read-only (it would hold only zeros)".into());
        }
        if matches!(self.backing, Backing::Ram { .. }) && self.direct {
            return Err("direct (O_DIRECT) is for files and block devices, not RAM LUNs".into());
        }
        Ok(())
    }

    /// Open the backing store.
    pub fn open(&self) -> Result<Arc<dyn BlockDevice>, BackendError> {
        Ok(match &self.backing {
            Backing::Ram { size } => Arc::new(RamDevice::new(*size, self.block_size)?),
            Backing::File { path, size } => Arc::new(FileDevice::open(
                path,
                &FileOptions {
                    size: *size,
                    block_size: self.block_size,
                    read_only: self.read_only,
                    preallocate: self.preallocate,
                    direct: self.direct,
                    engine: self.engine,
                },
            )?),
        })
    }
}

// ---- TOML form ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    portals: Vec<Spanned<String>>,
    #[serde(default, rename = "target")]
    targets: Vec<Spanned<RawTarget>>,
    #[serde(default)]
    options: Option<Spanned<Options>>,
    chap: Option<Spanned<RawChap>>,
    discovery: Option<RawDiscovery>,
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
) -> Result<Option<Vec<u8>>, String> {
    match (inline, file, env) {
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
    fn resolve(self, global: bool) -> Result<ChapConfig, String> {
        use ethersan_proto::chap::Credentials;
        if !global && self.discovery.is_some() {
            return Err(
                "`discovery` belongs in the global [chap] (use [discovery.chap] for discovery credentials)"
                    .into(),
            );
        }
        let secret = read_secret(self.secret, self.secret_file, self.secret_env, "secret")?
            .ok_or("needs secret, secret_file or secret_env")?;
        let initiator = Credentials::new(&self.user, &secret)?;
        let mutual = read_secret(
            self.mutual_secret,
            self.mutual_secret_file,
            self.mutual_secret_env,
            "mutual_secret",
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
    #[serde(default, rename = "lun")]
    luns: Vec<Spanned<RawLun>>,
    #[serde(default)]
    allow_initiators: Vec<Spanned<String>>,
    #[serde(default)]
    allow_networks: Vec<Spanned<String>>,
    chap: Option<Spanned<RawChap>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawSize {
    Bytes(u64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawLun {
    Spec(String),
    Table(RawLunTable),
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
    write_cache: Option<bool>,
    provisioning: Option<String>,
    physical_block_size: Option<u32>,
    /// O_DIRECT.
    #[serde(default)]
    direct: bool,
    /// "sync" or "uring".
    engine: Option<String>,
    /// LUN masking: the initiators that see this LUN.
    #[serde(default)]
    initiators: Vec<String>,
    /// Initiators for which this LUN is read-only.
    #[serde(default)]
    read_only_initiators: Vec<String>,
}

fn raw_size(s: &RawSize) -> Result<u64, ConfigError> {
    match s {
        RawSize::Bytes(b) => Ok(*b),
        RawSize::Text(t) => parse_size(t),
    }
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
            source,
        })?;
        Config::from_toml_str(&text, &path.display().to_string())
    }

    /// Parse and check TOML text; `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let at = |span: Option<Range<usize>>, msg: String| {
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
        let mut portals = Vec::new();
        for p in &raw.portals {
            let addr: SocketAddr = p.get_ref().parse().map_err(|_| {
                at(
                    Some(p.span()),
                    format!(
                        "portal {:?} is not ADDR:PORT (IPv6 as [::1]:3260)",
                        p.get_ref()
                    ),
                )
            })?;
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
            if t.luns.is_empty() {
                return Err(at(
                    Some(tspan),
                    format!("target {:?} has no [[target.lun]]", t.name.get_ref()),
                ));
            }
            let mut luns = Vec::new();
            let mut lun_initiators: Vec<Vec<String>> = Vec::new();
            let mut lun_read_only: Vec<Vec<String>> = Vec::new();
            for l in t.luns {
                let span = l.span();
                let mut seen_by = Vec::new();
                let mut read_only_for = Vec::new();
                let lun = match l.into_inner() {
                    RawLun::Spec(s) => LunConfig::from_spec(&s)
                        .map_err(|e| at(Some(span.clone()), e.to_string()))?,
                    RawLun::Table(tb) => {
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
                        let backing = match (&tb.path, &tb.ram) {
                            (Some(p), None) => Backing::File {
                                path: p.clone(),
                                size: tb.size.as_ref().map(raw_size).transpose().map_err(|e| at(Some(span.clone()), e.to_string()))?,
                            },
                            (None, Some(r)) if tb.size.is_none() => {
                                Backing::Ram { size: raw_size(r).map_err(|e| at(Some(span.clone()), e.to_string()))? }
                            }
                            _ => {
                                return Err(at(
                                    Some(span),
                                    "a LUN needs exactly one of path = \"...\" (with optional size) or ram = \"SIZE\"".into(),
                                ))
                            }
                        };
                        let lun = LunConfig {
                            backing,
                            read_only: tb.read_only,
                            removable: tb.removable,
                            block_size: tb.block_size.unwrap_or(512),
                            serial: tb.serial,
                            write_cache: tb.write_cache.unwrap_or(true),
                            physical_block_size: tb.physical_block_size.unwrap_or(4096),
                            direct: tb.direct,
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
            let mut access = Access {
                luns: lun_initiators,
                read_only: lun_read_only,
                ..Access::default()
            };
            for i in &t.allow_initiators {
                validate_name(i.get_ref())
                    .map_err(|e| at(Some(i.span()), format!("allow_initiators: {e}")))?;
                access.initiators.push(i.get_ref().clone());
            }
            for n in &t.allow_networks {
                access.networks.push(
                    parse_network(n.get_ref())
                        .map_err(|e| at(Some(n.span()), format!("allow_networks: {e}")))?,
                );
            }
            let chap = match t.chap {
                Some(c) => {
                    let span = c.span();
                    Some(c.into_inner().resolve(false).map_err(|m| {
                        at(
                            Some(span),
                            format!("[target.chap] of {:?}: {m}", t.name.get_ref()),
                        )
                    })?)
                }
                None => None,
            };
            targets.push(TargetConfig {
                name: t.name.into_inner(),
                alias: t.alias,
                luns,
                access,
                chap,
            });
        }
        let chap = match raw.chap {
            Some(c) => {
                let span = c.span();
                Some(
                    c.into_inner()
                        .resolve(true)
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
                    .resolve(false)
                    .map_err(|m| at(Some(span), format!("[discovery.chap]: {m}")))?;
                d.discovery = true;
                Some(d)
            }
            None => None,
        };
        Ok(Config {
            portals,
            targets,
            options,
            chap,
            discovery_chap,
        })
    }

    /// The embedded default: 127.0.0.1:3260, target
    /// `iqn.2026-11.org.ethersan:default`, LUN 0 a 1 GiB sparse file in `data_dir`.
    pub fn embedded_default(data_dir: &Path) -> Config {
        let options = Options {
            data_dir: data_dir.to_path_buf(),
            ..Options::default()
        };
        Config {
            portals: vec![SocketAddr::from(([127, 0, 0, 1], 3260))],
            targets: vec![TargetConfig {
                name: "iqn.2026-11.org.ethersan:default".into(),
                alias: Some("ethersan default".into()),
                access: Access::default(),
                chap: None,
                luns: vec![LunConfig {
                    backing: Backing::File {
                        path: data_dir.join("default-lun0.img"),
                        size: Some(1 << 30),
                    },
                    read_only: false,
                    removable: false,
                    block_size: 512,
                    serial: None,
                    write_cache: true,
                    preallocate: false,
                    physical_block_size: 4096,
                    direct: false,
                    engine: DEFAULT_ENGINE,
                }],
            }],
            options,
            chap: None,
            discovery_chap: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_and_access_lists() {
        let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
        let a = Access {
            initiators: vec![],
            networks: vec![
                parse_network("10.0.0.0/8").unwrap(),
                parse_network("::1").unwrap(),
            ],
            luns: vec![],
            read_only: vec![],
        };
        assert!(a.allows("any", ip("10.1.2.3")) && !a.allows("any", ip("11.0.0.1")));
        assert!(
            a.allows("any", ip("::1")) && !a.allows("any", ip("::2")) && !a.allows("any", None)
        );
        assert!(
            a.allows("any", ip("::ffff:10.9.9.9")),
            "IPv4-mapped IPv6 matches the IPv4 network"
        );
        let b = Access {
            initiators: vec!["iqn.2026-11.x:a".into()],
            networks: vec![],
            luns: vec![],
            read_only: vec![],
        };
        assert!(b.allows("iqn.2026-11.x:a", None) && !b.allows("iqn.2026-11.x:b", ip("10.0.0.1")));
        assert!(Access::default().allows("anyone", None));
        for bad in ["10.0.0.0/33", "nope", "::/129", "1.2.3.4/x"] {
            assert!(parse_network(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_network("0.0.0.0/0").unwrap().1, 0);
        assert!(Access {
            initiators: vec![],
            networks: vec![parse_network("0.0.0.0/0").unwrap()],
            luns: vec![],
            read_only: vec![]
        }
        .allows("x", ip("8.8.8.8")));
    }

    #[test]
    fn chap_section_secrets_from_inline_file_or_env() {
        let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\nlun = [\"ram:1M\"]\n";
        let c = Config::from_toml_str(
            &format!("{base}[chap]\nuser = \"alice\"\nsecret = \"alice-secret-123\"\n"),
            "t",
        )
        .unwrap();
        let chap = c.chap.unwrap();
        assert_eq!(chap.initiator.user, "alice");
        assert!(chap.discovery && chap.target.is_none());
        std::env::set_var("ETHERSAN_TEST_CHAP_SECRET", "from-the-environment");
        let dir = std::env::temp_dir().join(format!("ethersan-chap-{}", std::process::id()));
        std::fs::write(&dir, "from-a-file-secret\n").unwrap();
        let text = format!(
            "{base}[chap]\nuser = \"alice\"\nsecret_env = \"ETHERSAN_TEST_CHAP_SECRET\"\nmutual_user = \"tgt\"\nmutual_secret_file = {:?}\ndiscovery = false\n",
            dir.display().to_string()
        );
        let chap = Config::from_toml_str(&text, "t").unwrap().chap.unwrap();
        assert_eq!(chap.initiator.secret, b"from-the-environment");
        assert_eq!(chap.target.unwrap().secret, b"from-a-file-secret");
        assert!(!chap.discovery);
        let _ = std::fs::remove_file(&dir);
        for bad in [
            "[chap]\nuser = \"alice\"\nsecret = \"short\"\n",
            "[chap]\nuser = \"alice\"\n",
            "[chap]\nuser = \"alice\"\nsecret = \"alice-secret-123\"\nsecret_env = \"X\"\n",
            "[chap]\nuser = \"alice\"\nsecret_env = \"ETHERSAN_TEST_UNSET_VARIABLE\"\n",
            "[chap]\nuser = \"alice\"\nsecret = \"alice-secret-123\"\nmutual_user = \"t\"\n",
        ] {
            let e = Config::from_toml_str(&format!("{base}{bad}"), "t")
                .unwrap_err()
                .to_string();
            assert!(e.contains("t:5:") && e.contains("[chap]"), "{bad}: {e}");
            assert!(!e.contains("alice-secret-123"), "a secret in an error: {e}");
        }
    }

    #[test]
    fn placement_option() {
        let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\nlun = [\"ram:1M\"]\n";
        let c = Config::from_toml_str(base, "t").unwrap();
        assert_eq!(c.options.placement, Placement::Shared);
        let c = Config::from_toml_str(&format!("{base}[options]\nplacement = \"pinned\"\n"), "t")
            .unwrap();
        assert_eq!(c.options.placement, Placement::Pinned);
        let e = Config::from_toml_str(
            &format!("{base}[options]\nplacement = \"everywhere\"\n"),
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("everywhere") && e.contains("pinned"), "{e}");
        assert_eq!("pinned".parse::<Placement>(), Ok(Placement::Pinned));
        assert!("x".parse::<Placement>().is_err());
    }

    #[test]
    fn per_target_and_discovery_chap() {
        let targets = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:a\"\nlun = [\"ram:1M\"]\n[target.chap]\nuser = \"ua\"\nsecret = \"secret-of-a-123\"\nmutual_user = \"ta\"\nmutual_secret = \"target-a-secret\"\n[[target]]\nname = \"iqn.2026-11.org.x:b\"\nlun = [\"ram:1M\"]\n[[target]]\nname = \"iqn.2026-11.org.x:c\"\nlun = [\"ram:1M\"]\n[target.chap]\nuser = \"uc\"\nsecret = \"secret-of-c-123\"\n";
        let c = Config::from_toml_str(
            &format!("{targets}[chap]\nuser = \"g\"\nsecret = \"global-secret-1\"\n[discovery.chap]\nuser = \"d\"\nsecret = \"discovery-secret\"\n"),
            "t",
        )
        .unwrap();
        let a = c.targets[0].chap.as_ref().unwrap();
        assert_eq!(a.initiator.user, "ua");
        assert_eq!(a.target.as_ref().unwrap().user, "ta");
        assert!(c.targets[1].chap.is_none(), "b uses the global [chap]");
        assert_eq!(c.targets[2].chap.as_ref().unwrap().initiator.user, "uc");
        assert_eq!(c.chap.as_ref().unwrap().initiator.user, "g");
        assert_eq!(
            c.discovery_chap.as_ref().unwrap().initiator.secret,
            b"discovery-secret"
        );
        // Neither global nor discovery CHAP: only the targets that ask.
        let c = Config::from_toml_str(targets, "t").unwrap();
        assert!(c.chap.is_none() && c.discovery_chap.is_none());
        // Mistakes name the table and the line, never the secret.
        for (bad, line, what) in [
            ("[discovery.chap]\nuser = \"d\"\n", 19, "[discovery.chap]"),
            ("[discovery.chap]\nuser = \"d\"\nsecret = \"discovery-secret\"\ndiscovery = true\n", 19, "[discovery.chap]"),
            ("[chap]\nuser = \"g\"\nsecret = \"global-secret-1\"\ndiscovery = false\n[discovery.chap]\nuser = \"d\"\nsecret = \"discovery-secret\"\n", 23, "contradicts"),
            ("[discovery]\nchap_user = \"x\"\n", 20, "unknown field"),
        ] {
            let e = Config::from_toml_str(&format!("{targets}{bad}"), "t")
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("t:{line}:")) && e.contains(what), "{bad}: {e}");
            assert!(!e.contains("discovery-secret") && !e.contains("global-secret-1"), "{e}");
        }
        for (bad, what) in [
            ("user = \"x\"\nsecret = \"short\"\n", "at least 12"),
            ("user = \"x\"\n", "needs secret"),
            ("user = \"x\"\nsecret = \"secret-of-x-123\"\ndiscovery = false\n", "belongs in the global"),
            ("user = \"x\"\nsecret = \"secret-of-x-123\"\nmutual_user = \"t\"\nmutual_secret = \"secret-of-x-123\"\n", "must differ"),
        ] {
            let text = format!("portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:a\"\nlun = [\"ram:1M\"]\n[target.chap]\n{bad}");
            let e = Config::from_toml_str(&text, "t").unwrap_err().to_string();
            assert!(
                e.starts_with("t:5:") && e.contains("[target.chap] of \"iqn.2026-11.org.x:a\"") && e.contains(what),
                "{bad}: {e}"
            );
            assert!(!e.contains("secret-of-x-123"), "{e}");
        }
    }

    #[test]
    fn connection_and_key_text_limits() {
        let o = Options::default();
        assert_eq!(o.max_connections_per_address, 128);
        assert_eq!(o.max_key_text_bytes, 65536);
        let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\nlun = [\"ram:1M\"]\n";
        let c = Config::from_toml_str(
            &format!(
                "{base}[options]\nmax_connections_per_address = 0\nmax_key_text_bytes = 8192\n"
            ),
            "t",
        )
        .unwrap();
        assert_eq!(c.options.max_connections_per_address, 0);
        assert_eq!(c.options.max_key_text_bytes, 8192);
        for bad in [
            "max_key_text_bytes = 8191",
            "max_key_text_bytes = 16777217",
            "max_connections_per_address = -1",
        ] {
            let e = Config::from_toml_str(&format!("{base}[options]\n{bad}\n"), "t")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("t:"), "{bad}: {e}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("512K").unwrap(), 512 << 10);
        assert_eq!(parse_size("2TiB").unwrap(), 2 << 40);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn names() {
        assert!(validate_name("iqn.2026-11.org.ethersan:default").is_ok());
        assert!(validate_name("eui.0123456789abcdef").is_ok());
        assert!(validate_name("naa.0123456789abcdef").is_ok());
        assert!(validate_name("iqn.2026-11.Org.x").is_err());
        assert!(validate_name("iqn.26-11.org.x").is_err());
        assert!(validate_name("target0").is_err());
    }

    #[test]
    fn lun_specs() {
        let l = LunConfig::from_spec("ram:64M").unwrap();
        assert_eq!(l.backing, Backing::Ram { size: 64 << 20 });
        let l = LunConfig::from_spec("/tmp/a:b/disk.img:1G,ro,removable,bs=4096").unwrap();
        assert_eq!(
            l.backing,
            Backing::File {
                path: "/tmp/a:b/disk.img".into(),
                size: Some(1 << 30)
            }
        );
        assert!(l.read_only && l.removable && l.block_size == 4096);
        let l = LunConfig::from_spec("/dev/sdb").unwrap();
        assert_eq!(
            l.backing,
            Backing::File {
                path: "/dev/sdb".into(),
                size: None
            }
        );
        assert!(LunConfig::from_spec("ram:64M,fast")
            .unwrap_err()
            .to_string()
            .contains("unknown option"));
        assert!(LunConfig::from_spec("ram:1000,bs=4096").is_err());
        assert!(LunConfig::from_spec("x:1G,bs=1024").is_err());
        assert!(LunConfig::from_spec("").is_err());
    }

    #[test]
    fn engine_and_direct_keys() {
        let l = LunConfig::from_spec("/tmp/x.img:1G").unwrap();
        assert_eq!((l.engine, l.direct), (DEFAULT_ENGINE, false));
        let l = LunConfig::from_spec("/tmp/x.img:1G,engine=uring,direct").unwrap();
        assert_eq!((l.engine, l.direct), (IoEngine::Uring, true));
        let l = LunConfig::from_spec("/dev/sdb,engine=sync").unwrap();
        assert_eq!(l.engine, IoEngine::Sync);
        let e = LunConfig::from_spec("/tmp/x.img:1G,engine=aio")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("engine") && e.contains("\"aio\"") && e.contains("\"uring\""),
            "{e}"
        );
        let e = LunConfig::from_spec("ram:64M,direct")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not RAM"), "{e}");

        let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\n[[target.lun]]\n";
        let c = Config::from_toml_str(
            &format!("{base}path = \"/tmp/x.img\"\nengine = \"uring\"\ndirect = true\n"),
            "t",
        )
        .unwrap();
        let l = &c.targets[0].luns[0];
        assert_eq!((l.engine, l.direct), (IoEngine::Uring, true));
        let c = Config::from_toml_str(&format!("{base}path = \"/tmp/x.img\"\n"), "t").unwrap();
        let l = &c.targets[0].luns[0];
        assert_eq!((l.engine, l.direct), (DEFAULT_ENGINE, false));
        for (bad, says) in [
            (
                "path = \"/x\"\nengine = \"fast\"\n",
                "engine = unknown I/O engine \"fast\"",
            ),
            ("path = \"/x\"\ndirect = \"yes\"\n", ""),
            ("ram = \"1M\"\ndirect = true\n", "not RAM"),
        ] {
            let e = Config::from_toml_str(&format!("{base}{bad}"), "t")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("t:"), "{bad}: {e}");
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn toml_errors_name_the_line() {
        let text = "portals = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\n[[target.lun]]\nram = \"64M\"\nsise = 3\n";
        let e = Config::from_toml_str(text, "bad.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("bad.toml:5:") || e.starts_with("bad.toml:7:"),
            "{e}"
        );
        assert!(e.contains("sise") || e.contains("did not match"), "{e}");
        let text = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"Target\"\nluns = []\n";
        let e = Config::from_toml_str(text, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.toml:"), "{e}");
        let text = "portals = [\"127.0.0.1\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\n[[target.lun]]\nram = \"64M\"\n";
        let e = Config::from_toml_str(text, "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.toml:1:"), "{e}");
        let text = "portals = [\"127.0.0.1:3260\"]\n[options]\nqueue_depth = 0\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\nlun = [\"ram:1M\"]\n";
        let e = Config::from_toml_str(text, "o.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("queue_depth"), "{e}");
    }

    #[test]
    fn good_toml() {
        let text = r#"
portals = ["127.0.0.1:3260", "[::1]:3260"]
[options]
queue_depth = 64
[[target]]
name = "iqn.2026-11.org.ethersan:a"
alias = "first"
lun = ["ram:64M", "/tmp/x.img:1G,ro"]
[[target]]
name = "iqn.2026-11.org.ethersan:b"
[[target.lun]]
path = "/tmp/y.img"
size = "256M"
block_size = 4096
removable = true
[[target.lun]]
ram = 1048576
"#;
        let c = Config::from_toml_str(text, "x.toml").unwrap();
        assert_eq!(c.portals.len(), 2);
        assert_eq!(c.options.queue_depth, 64);
        assert_eq!(c.targets[0].luns.len(), 2);
        assert!(c.targets[0].luns[1].read_only);
        assert_eq!(c.targets[1].luns[0].block_size, 4096);
        assert_eq!(c.targets[1].luns[1].backing, Backing::Ram { size: 1 << 20 });
    }

    #[test]
    fn example_config_parses() {
        let text = include_str!("../../../examples/ethersan.toml");
        Config::from_toml_str(text, "examples/ethersan.toml").unwrap();
    }
}
