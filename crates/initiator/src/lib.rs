//! An iSCSI initiator library over the ethersan protocol core.
//!
//! [`login()`] runs the login phase over any byte stream and returns a
//! [`Session`] handle whose driver task keeps many commands in flight;
//! [`connect`] does the same over TCP to a `host:port`. iSCSI alone: URLs,
//! the native transport's streams and the other transports belong to the
//! `ethersan-client` crate, which is built on this one, as are the
//! in-memory tests.
//!
//! The protocol itself does no I/O: [`login::Login`] is the login phase
//! and [`conn::Connection`] the full feature phase, state machines fed
//! PDUs, requests and the time (quinn-proto's manner); the tokio code
//! (`login` here, `session`) only moves bytes and wakes them.
#![warn(missing_docs, unreachable_pub)]

pub mod attention;
pub mod conn;
pub mod login;
mod result;
mod session;

use bytes::Bytes;
use ethersan_proto::negotiate::{
    InitiatorNegotiator, InitiatorSettings, OperationalParams, SessionParams, SessionType,
};
use ethersan_proto::pdu::Framer;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

pub use attention::{Attended, UnitAttention};
pub use result::CommandResult;
pub use session::Session;

/// Errors of the initiator.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Socket error.
    #[error("i/o error: {0}")]
    Io(String),
    /// The connection closed.
    #[error("connection closed")]
    Closed,
    /// CHAP failed on our side (e.g. the target did not prove itself).
    #[error("authentication: {0}")]
    Auth(String),
    /// The target refused the login.
    #[error("login refused by target: status class {class:#04x} detail {detail:#04x} ({})", login_status_text(*.class, *.detail))]
    LoginRefused {
        /// Status-Class.
        class: u8,
        /// Status-Detail.
        detail: u8,
    },
    /// Something in the exchange broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The target rejected a PDU.
    #[error("PDU rejected by target (reason {0:#04x})")]
    Rejected(u8),
    /// The command was aborted by task management (ABORT TASK).
    #[error("the command was aborted by task management")]
    Aborted,
    /// The target did not answer in time. The session it happened on is
    /// closed: every other command on it fails with the same error.
    #[error("{phase} timed out: no answer from the target within {}", secs(*.after))]
    Timeout {
        /// What was waiting.
        phase: Phase,
        /// How long it waited.
        after: std::time::Duration,
    },
}

/// What an [`Error::Timeout`] was waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// The TCP connection.
    Connect,
    /// The login exchange (the connection was accepted).
    Login,
    /// A SCSI command, by its operation code.
    Command {
        /// The CDB's first byte.
        opcode: u8,
    },
    /// A Text request (SendTargets discovery).
    Text,
    /// The logout exchange.
    Logout,
    /// A task management function.
    TaskManagement,
    /// A NOP-Out ping to the target.
    Ping,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Phase::Connect => f.write_str("connect"),
            Phase::Login => f.write_str("login"),
            Phase::Command { opcode } => match opcode_name(*opcode) {
                Some(n) => write!(f, "SCSI command {n}"),
                None => write!(f, "SCSI command with operation code {opcode:#04x}"),
            },
            Phase::Text => f.write_str("SendTargets/Text request"),
            Phase::Logout => f.write_str("logout"),
            Phase::TaskManagement => f.write_str("task management request"),
            Phase::Ping => f.write_str("NOP-Out ping"),
        }
    }
}

/// The name of the commands the client sends.
fn opcode_name(op: u8) -> Option<&'static str> {
    Some(match op {
        0x00 => "TEST UNIT READY",
        0x12 => "INQUIRY",
        0x25 => "READ CAPACITY(10)",
        0x28 => "READ(10)",
        0x2a => "WRITE(10)",
        0x35 => "SYNCHRONIZE CACHE(10)",
        0x88 => "READ(16)",
        0x8a => "WRITE(16)",
        0x91 => "SYNCHRONIZE CACHE(16)",
        0x9e => "READ CAPACITY(16)",
        0xa0 => "REPORT LUNS",
        _ => return None,
    })
}

/// `d` for people: "2 s", "1.5 s", "250 ms".
fn secs(d: std::time::Duration) -> String {
    if d.as_millis() < 1000 {
        format!("{} ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

impl Error {
    /// True when the session this error came from can no longer be used
    /// (it timed out or the connection is gone): a command that is safe to
    /// repeat can be retried on a new session.
    pub fn is_session_failure(&self) -> bool {
        matches!(self, Error::Timeout { .. } | Error::Closed | Error::Io(_))
    }
}

/// How long the initiator waits for each exchange when the caller does
/// not say: connect, login, each command, discovery and logout.
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Closed
        } else {
            Error::Io(e.to_string())
        }
    }
}

fn login_status_text(class: u8, detail: u8) -> &'static str {
    match (class, detail) {
        (1, _) => "redirection",
        (2, 0) => "initiator error",
        (2, 1) => "authentication failure",
        (2, 2) => "authorization failure",
        (2, 3) => "target not found",
        (2, 4) => "target removed",
        (2, 5) => "unsupported version",
        (2, 6) => "too many connections",
        (2, 7) => "missing parameter",
        (2, 8) => "cannot include in session",
        (2, 9) => "session type not supported",
        (2, 10) => "session does not exist",
        (2, 11) => "invalid request during login",
        (3, _) => "target error",
        _ => "unknown",
    }
}

/// The framing rules of our receive side for `p`. Data segments from the
/// target are accepted up to the 24-bit maximum, not only up to our
/// MaxRecvDataSegmentLength, as this initiator always has been lenient
/// there.
pub(crate) fn framer(p: &SessionParams) -> Framer {
    Framer {
        max_recv_data_segment_length: ethersan_proto::pdu::MAX_DATA_SEGMENT,
        ..p.initiator_framer()
    }
}

/// What to log in to.
#[derive(Debug, Clone)]
pub struct LoginOptions {
    /// Our iSCSI name.
    pub initiator_name: String,
    /// Target name; `None` for a discovery session.
    pub target_name: Option<String>,
    /// Ask for CRC32C header digests.
    pub header_digest: bool,
    /// Ask for CRC32C data digests.
    pub data_digest: bool,
    /// ISID to use (distinguishes sessions of the same initiator).
    pub isid: [u8; 6],
    /// CHAP name and secret to log in with (offered before AuthMethod=None).
    pub chap: Option<ethersan_proto::chap::Credentials>,
    /// With `chap`: the target must prove these (mutual CHAP).
    pub target_chap: Option<ethersan_proto::chap::Credentials>,
    /// How long to wait for the connection, the login, each command, a
    /// Text request and the logout ([`DEFAULT_TIMEOUT`]); `None` waits
    /// forever. After a command times out its session is closed.
    pub timeout: Option<std::time::Duration>,
}

impl Default for LoginOptions {
    fn default() -> Self {
        LoginOptions {
            initiator_name: "iqn.2026-11.org.ethersan:client".to_string(),
            target_name: None,
            header_digest: false,
            data_digest: false,
            isid: random_isid(),
            chap: None,
            target_chap: None,
            timeout: Some(DEFAULT_TIMEOUT),
        }
    }
}

/// An ISID of the "random" type (T=11b) from the process id and clock.
pub fn random_isid() -> [u8; 6] {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let c = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let v = nanos ^ std::process::id().rotate_left(16) ^ c.wrapping_mul(0x9e37_79b9);
    let b = v.to_be_bytes();
    [0xc0, b[0], b[1], b[2], b[3], (c & 0xff) as u8]
}

/// Log in over a byte stream; on success the returned session owns it.
/// The whole exchange is bounded by `opts.timeout`.
pub async fn login<R, W>(rd: R, wr: W, opts: &LoginOptions) -> Result<Session, Error>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    match opts.timeout {
        None => login_exchange(rd, wr, opts).await,
        Some(after) => tokio::time::timeout(after, login_exchange(rd, wr, opts))
            .await
            .unwrap_or(Err(Error::Timeout {
                phase: Phase::Login,
                after,
            })),
    }
}

async fn login_exchange<R, W>(mut rd: R, mut wr: W, opts: &LoginOptions) -> Result<Session, Error>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let neg = negotiator(
        opts,
        OperationalParams::initiator_default().first_burst_length,
    )?;
    // Login PDUs carry no digests (§13.1) and the RFC default limits.
    let plain = SessionParams::default();
    let mut login = login::Login::new(neg, opts.isid);
    loop {
        while let Some(t) = login.poll_transmit() {
            session::write_frame(&mut wr, &t.bhs, &t.ahs, &t.data, &plain).await?;
        }
        wr.flush().await?;
        let raw = session::read_pdu(&mut rd, &plain).await?;
        if let Some(done) = login.handle(raw)? {
            return Ok(Session::start(rd, wr, opts.timeout, done));
        }
    }
}

/// Log in over a native transport channel, one PDU per message, and run
/// the session over it with Data-In placed (docs/native-transport.md,
/// "iSCSI over the channel"). The whole exchange is bounded by
/// `opts.timeout`.
pub async fn login_messages(
    ch: ethersan_endpoint::MessageChannel,
    opts: &LoginOptions,
) -> Result<Session, Error> {
    let exchange = login_messages_exchange(ch, opts);
    match opts.timeout {
        None => exchange.await,
        Some(after) => tokio::time::timeout(after, exchange)
            .await
            .unwrap_or(Err(Error::Timeout {
                phase: Phase::Login,
                after,
            })),
    }
}

async fn login_messages_exchange(
    mut ch: ethersan_endpoint::MessageChannel,
    opts: &LoginOptions,
) -> Result<Session, Error> {
    let mut login = login::Login::new(negotiator(opts, MESSAGES_FIRST_BURST)?, opts.isid);
    let plain = SessionParams::default();
    let f = framer(&plain);
    loop {
        while let Some(t) = login.poll_transmit() {
            let e = f.encode(&t.bhs, &t.ahs, &t.data);
            let mut parts = vec![Bytes::from(e.head)];
            if !t.data.is_empty() {
                parts.push(t.data);
            }
            if !e.tail.is_empty() {
                parts.push(Bytes::from(e.tail));
            }
            ch.sender.send(&parts).await?;
        }
        let msg = ch.receiver.recv().await?.ok_or(Error::Closed)?;
        let raw = session::parse_message(&msg, &plain)?;
        if let Some(done) = login.handle(raw)? {
            return Ok(Session::start_messages(ch, opts.timeout, done));
        }
    }
}

/// FirstBurstLength offered over the native transport: a write of up to
/// 8 KiB goes whole as immediate data (no round trip for an R2T); a larger
/// one sends its first 8 KiB with the command and the rest as solicited
/// Data-Out, which is placed straight into the target's buffer. Unsolicited
/// data travels in messages, reassembled and copied on the target: with
/// the iSCSI default (64 KiB) half of a 128 KiB write took that path.
pub const MESSAGES_FIRST_BURST: u32 = 8192;

/// The login's negotiator for `opts` (with CHAP when it has credentials),
/// offering `first_burst` as FirstBurstLength.
fn negotiator(opts: &LoginOptions, first_burst: u32) -> Result<InitiatorNegotiator, Error> {
    let settings = InitiatorSettings {
        initiator_name: opts.initiator_name.clone(),
        target_name: opts.target_name.clone(),
        session_type: if opts.target_name.is_some() {
            SessionType::Normal
        } else {
            SessionType::Discovery
        },
        operational: OperationalParams {
            header_digests: OperationalParams::digest_offer(opts.header_digest),
            data_digests: OperationalParams::digest_offer(opts.data_digest),
            first_burst_length: first_burst,
            ..OperationalParams::initiator_default()
        },
        ..InitiatorSettings::default()
    };
    let mut neg = InitiatorNegotiator::new(settings);
    if let Some(creds) = &opts.chap {
        let mut nonce = [0u8; 1 + ethersan_proto::chap::CHALLENGE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| Error::Io(e.to_string()))?;
        let mut challenge = [0u8; ethersan_proto::chap::CHALLENGE_LEN];
        challenge.copy_from_slice(&nonce[1..]);
        neg = neg.with_chap(ethersan_proto::chap::InitiatorChap::new(
            creds.clone(),
            opts.target_chap.clone(),
            nonce[0],
            challenge,
        ));
    }
    Ok(neg)
}

/// Connect over TCP and log in, each step bounded by `opts.timeout`.
pub async fn connect(addr: &str, opts: &LoginOptions) -> Result<Session, Error> {
    let sock = match opts.timeout {
        None => TcpStream::connect(addr).await?,
        Some(after) => tokio::time::timeout(after, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::Timeout {
                phase: Phase::Connect,
                after,
            })??,
    };
    let _ = sock.set_nodelay(true);
    let (rd, wr) = sock.into_split();
    login(rd, wr, opts).await
}

/// Discover targets at a portal: `(target name, [addresses])`.
pub async fn discover(
    addr: &str,
    initiator_name: &str,
) -> Result<Vec<(String, Vec<String>)>, Error> {
    let opts = LoginOptions {
        initiator_name: initiator_name.to_string(),
        ..Default::default()
    };
    discover_with(addr, &opts).await
}

/// Discover targets with these login options (e.g. CHAP credentials); the
/// target name in `opts` is ignored: this is a discovery session.
pub async fn discover_with(
    addr: &str,
    opts: &LoginOptions,
) -> Result<Vec<(String, Vec<String>)>, Error> {
    let opts = LoginOptions {
        target_name: None,
        ..opts.clone()
    };
    let s = connect(addr, &opts).await?;
    let keys = s
        .text(vec![("SendTargets".to_string(), "All".to_string())])
        .await?;
    let _ = s.logout().await;
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for (k, v) in keys {
        match k.as_str() {
            "TargetName" => out.push((v, Vec::new())),
            "TargetAddress" => {
                if let Some(last) = out.last_mut() {
                    last.1.push(v);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

impl Session {
    /// Send TEST UNIT READY until no unit attention is reported (a new
    /// nexus starts with one, as SAM-5 requires), as libiscsi does after
    /// login. Returns the final status and sense key.
    pub async fn clear_unit_attention(&self, lun: u64) -> Result<CommandResult, Error> {
        let mut last = CommandResult::default();
        for _ in 0..8 {
            last = self
                .command(lun, &[0, 0, 0, 0, 0, 0], Bytes::new(), 0)
                .await?;
            if last.sense_key().map(|k| k.0) != Some(6) {
                break;
            }
        }
        Ok(last)
    }

    /// READ CAPACITY (16): (number of blocks, block size).
    pub async fn read_capacity(&self, lun: u64) -> Result<(u64, u32), Error> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x9e;
        cdb[1] = 0x10;
        cdb[13] = 32;
        let r = self.command(lun, &cdb, Bytes::new(), 32).await?;
        if r.status != 0 || r.data.len() < 12 {
            return Err(Error::Protocol(format!(
                "READ CAPACITY(16) failed: status {:#x} sense {:?}",
                r.status,
                r.sense_key()
            )));
        }
        let last = u64::from_be_bytes(r.data[0..8].try_into().expect("8 bytes"));
        let bs = u32::from_be_bytes(r.data[8..12].try_into().expect("4 bytes"));
        Ok((last + 1, bs))
    }

    /// READ (16) of `blocks` blocks at `lba`.
    pub async fn read16(
        &self,
        lun: u64,
        lba: u64,
        blocks: u32,
        block_size: u32,
    ) -> Result<CommandResult, Error> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x88;
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
        self.command(lun, &cdb, Bytes::new(), blocks * block_size)
            .await
    }

    /// WRITE (16) of `data` at `lba`, with FUA if asked.
    pub async fn write16(
        &self,
        lun: u64,
        lba: u64,
        data: Bytes,
        block_size: u32,
        fua: bool,
    ) -> Result<CommandResult, Error> {
        let blocks = (data.len() / block_size as usize) as u32;
        let mut cdb = [0u8; 16];
        cdb[0] = 0x8a;
        if fua {
            cdb[1] = 0x08;
        }
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
        self.command(lun, &cdb, data, 0).await
    }
}
