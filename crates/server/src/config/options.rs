//! `[options]`: protocol limits and runtime knobs.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Protocol limits and runtime knobs, with measured or RFC-safe defaults.
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    /// Most connections in the login phase at once, over every portal and
    /// the native transport together (0: no limit); more are closed
    /// before any PDU is read. A connection's place is given back as soon
    /// as its login ends (success, failure, timeout or disconnect).
    pub max_logins_in_progress: usize,
    /// Most bytes of key text a login (all its Continue PDUs together) or
    /// a text negotiation may send; at least 8192, the login phase's
    /// MaxRecvDataSegmentLength.
    pub max_key_text_bytes: usize,
    /// Most bytes of command data buffers one session holds at once
    /// (writes' buffers are reserved when their R2Ts go out, reads' until
    /// their Data-In is sent); commands beyond it wait. One command always
    /// runs, however large.
    pub session_memory_budget: usize,
    /// This gateway's ALUA target port group id, also its relative target
    /// port id and its portal group tag (1..=65535, default 1). Gateways
    /// that export one shared store (an RBD image) need different ones.
    pub target_port_group: u16,
    /// The ALUA access state this gateway's target port group starts in.
    pub alua_state: GatewayState,
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
    /// With `placement = "pinned"`: each worker thread has an io_uring of
    /// its own, so its sessions' file I/O is submitted and completed on
    /// that thread (false: through each LUN's ring thread).
    pub worker_rings: bool,
}

/// How connections are spread over worker threads (`placement` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// tokio's work-stealing runtime: connections' tasks move between
    /// workers as load changes; file I/O goes through each LUN's ring
    /// thread.
    Shared,
    /// One single-threaded runtime per worker, pinned to a CPU, each with
    /// its own io_uring (`worker_rings`); each new connection goes to the
    /// worker with the fewest connections and stays there. The default:
    /// measured faster and cheaper per I/O (docs/benchmark.md, issue 17).
    #[default]
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

/// Default `max_logins_in_progress`: far more than initiators logging in
/// at once need (a login takes milliseconds), so that hundreds of idle
/// half-open connections do not lock good initiators out, while bounding
/// what connections that never finish their login (a flood from many
/// addresses, each under `max_connections_per_address`) can hold until
/// `login_timeout_secs` ends them: at most a few tens of MiB of login
/// buffers.
pub const DEFAULT_MAX_LOGINS_IN_PROGRESS: usize = 512;

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
            max_logins_in_progress: DEFAULT_MAX_LOGINS_IN_PROGRESS,
            max_key_text_bytes: DEFAULT_MAX_KEY_TEXT_BYTES,
            session_memory_budget: ethersan_core::budget::DEFAULT_SESSION_BUDGET,
            target_port_group: 1,
            alua_state: GatewayState::ActiveOptimized,
            data_dir: PathBuf::from("./ethersan-data"),
            worker_threads: 0,
            inline_io: true,
            placement: Placement::Pinned,
            worker_rings: true,
        }
    }
}

impl Options {
    /// The operational keys the target declares and accepts, from the
    /// `[options]` that name them: the one place they are read for login.
    pub fn operational(&self) -> ethersan_proto::negotiate::OperationalParams {
        use ethersan_proto::negotiate::{Digest, OperationalParams};
        OperationalParams {
            max_recv_data_segment_length: self.max_recv_data_segment_length,
            max_burst_length: self.max_burst_length,
            first_burst_length: self.first_burst_length,
            initial_r2t: self.initial_r2t,
            immediate_data: self.immediate_data,
            max_outstanding_r2t: self.max_outstanding_r2t,
            header_digests: Digest::parse_list(&self.header_digest),
            data_digests: Digest::parse_list(&self.data_digest),
        }
    }

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
        if self.target_port_group == 0 {
            return Err("target_port_group must be 1..=65535 (0 is reserved)".into());
        }
        Ok(())
    }
}

/// The ALUA access state a gateway's target port group starts in
/// (`alua_state`, `serve --alua-state`); SET TARGET PORT GROUPS may change
/// it at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GatewayState {
    /// Active/optimized: the preferred path.
    ActiveOptimized,
    /// Active/non-optimized: serves everything, not preferred.
    ActiveNonOptimized,
    /// Standby: answers INQUIRY and the ALUA commands, refuses media access.
    Standby,
}

impl std::str::FromStr for GatewayState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "active-optimized" => Ok(GatewayState::ActiveOptimized),
            "active-non-optimized" => Ok(GatewayState::ActiveNonOptimized),
            "standby" => Ok(GatewayState::Standby),
            other => Err(format!(
                "unknown ALUA state {other:?} (use active-optimized, active-non-optimized or standby)"
            )),
        }
    }
}
