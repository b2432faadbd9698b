//! What the client commands read and write: a LUN over iSCSI (through the
//! initiator library) or a local file or block device, addressed in bytes.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use bytes::Bytes;
use ethersan_initiator::{connect, CommandResult, IscsiUrl, LoginOptions, Session};
use ethersan_proto::chap::Credentials;

/// Initiator name the client logs in with.
pub(crate) const CLIENT_IQN: &str = "iqn.2026-11.org.ethersan:client";

/// Largest single command the client sends when the target sets no limit.
pub(crate) const DEFAULT_MAX_TRANSFER: u64 = 1 << 20;

/// Human text for a SCSI sense key.
fn sense_key_name(key: u8) -> &'static str {
    match key {
        0x1 => "RECOVERED ERROR",
        0x2 => "NOT READY",
        0x3 => "MEDIUM ERROR",
        0x4 => "HARDWARE ERROR",
        0x5 => "ILLEGAL REQUEST",
        0x6 => "UNIT ATTENTION",
        0x7 => "DATA PROTECT",
        0x8 => "BLANK CHECK",
        0xb => "ABORTED COMMAND",
        0xe => "MISCOMPARE",
        _ => "sense",
    }
}

/// Turn a non-GOOD command result into an error naming the status and sense.
pub(crate) fn check(what: &str, r: &CommandResult) -> anyhow::Result<()> {
    if r.status == 0 {
        return Ok(());
    }
    match (r.status, r.sense_key()) {
        (0x18, _) => {
            bail!("{what}: RESERVATION CONFLICT (another initiator holds a reservation on the LUN)")
        }
        (0x08, _) => bail!("{what}: target BUSY"),
        (0x28, _) => bail!("{what}: TASK SET FULL"),
        (_, Some((key, asc, ascq))) => {
            let hint = match (key, asc, ascq) {
                (0x7, 0x27, 0x07) => " — the target's backing store is out of space (free space on the server's filesystem)",
                (0x7, 0x27, _) => " — the LUN is read-only",
                (0x3, 0x11, _) => " — the target could not read its backing store (see the server's log)",
                (0x3, 0x0c, _) => " — the target could not write its backing store (see the server's log)",
                (0x2, 0x3a, _) => " — no medium (ejected)",
                (0x5, 0x21, _) => " — address beyond the end of the LUN",
                (0x5, 0x25, _) => " — no such LUN",
                (0x7, 0x74, 0x71) => " — the LUN needs a channel of a higher security level (?security= in the URL)",
                _ => "",
            };
            bail!(
                "{what}: CHECK CONDITION, {} (ASC {asc:#04x} ASCQ {ascq:#04x}){hint}",
                sense_key_name(key)
            )
        }
        (s, None) => bail!("{what}: SCSI status {s:#04x}"),
    }
}

/// How the client logs in: CHAP (in the URL or here), mutual CHAP, and
/// how long it waits. Every subcommand that talks to a target takes these.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct ConnectArgs {
    /// Log in with CHAP as USER:SECRET (also $ETHERSAN_CHAP); credentials
    /// in the URL (iscsi://USER%SECRET@host/...) win.
    #[arg(
        long,
        value_name = "USER:SECRET",
        env = "ETHERSAN_CHAP",
        hide_env_values = true
    )]
    pub chap: Option<String>,
    /// Mutual CHAP: the target must prove itself as USER:SECRET (also
    /// $ETHERSAN_MUTUAL_CHAP); ?target_user=U&target_password=P in the URL
    /// wins.
    #[arg(
        long,
        value_name = "USER:SECRET",
        env = "ETHERSAN_MUTUAL_CHAP",
        hide_env_values = true
    )]
    pub mutual_chap: Option<String>,
    /// Longest wait for the connection, the login, each command and the
    /// logout (e.g. 30s, 500ms, 2m; 0: forever). A command that times out
    /// closes its session. Also $ETHERSAN_TIMEOUT.
    #[arg(
        long,
        value_name = "DURATION",
        env = "ETHERSAN_TIMEOUT",
        default_value = "30s",
        value_parser = parse_timeout
    )]
    pub timeout: Timeout,
    /// The native transport's group (eth:// and udp:// URLs).
    #[arg(long, value_name = "NAME", env = "ETHERSAN_GROUP")]
    pub group: Option<String>,
    /// A file holding the group secret (else $ETHERSAN_GROUP_SECRET).
    #[arg(long, value_name = "FILE")]
    pub group_secret_file: Option<std::path::PathBuf>,
}

/// `--timeout`: `None` waits forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timeout(pub Option<std::time::Duration>);

impl Default for Timeout {
    fn default() -> Self {
        Timeout(Some(ethersan_initiator::DEFAULT_TIMEOUT))
    }
}

fn parse_timeout(s: &str) -> Result<Timeout, String> {
    let digits = s.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if digits.trim().parse::<f64>() == Ok(0.0) {
        return Ok(Timeout(None));
    }
    crate::bench::parse_duration(s).map(|d| Timeout(Some(d)))
}

impl ConnectArgs {
    /// The native transport group's keys, from --group and the secret
    /// (--group-secret-file, else $ETHERSAN_GROUP_SECRET).
    pub(crate) fn group_keys(&self) -> anyhow::Result<ethersan_channel::group::GroupKeys> {
        let Some(group) = &self.group else {
            bail!("eth:// and udp:// URLs need the group: give --group NAME (or set ETHERSAN_GROUP) and its secret (--group-secret-file FILE or ETHERSAN_GROUP_SECRET)");
        };
        let env = std::env::var("ETHERSAN_GROUP_SECRET").ok();
        let secret = ethersan_channel::group::load_secret(
            self.group_secret_file.as_deref(),
            env.as_deref(),
            None,
        )
        .map_err(|e| anyhow::anyhow!("group {group:?}: {e}"))?;
        ethersan_channel::group::GroupKeys::derive(group, &secret)
            .map_err(|e| anyhow::anyhow!("group {group:?}: {e}"))
    }

    /// Login options for `url` (`None`: a discovery session), with the
    /// URL's credentials before the flags'.
    pub(crate) fn options(&self, url: Option<&IscsiUrl>) -> anyhow::Result<LoginOptions> {
        let chap = match url.and_then(|u| u.user.as_ref().map(|user| (user, &u.secret))) {
            Some((user, Some(secret))) => Some(
                Credentials::new(user, secret.as_bytes())
                    .map_err(|e| anyhow::anyhow!("CHAP in the URL: {e}"))?,
            ),
            Some((_, None)) => {
                bail!("the URL names a CHAP user but no secret: write iscsi://USER%SECRET@host/... or give --chap USER:SECRET")
            }
            None => match &self.chap {
                Some(c) => Some(Credentials::parse(c).map_err(|e| anyhow::anyhow!("--chap: {e}"))?),
                None => None,
            },
        };
        let target_chap = match url.map(|u| (&u.target_user, &u.target_secret)) {
            Some((Some(user), Some(secret))) => Some(
                Credentials::new(user, secret.as_bytes())
                    .map_err(|e| anyhow::anyhow!("mutual CHAP in the URL: {e}"))?,
            ),
            Some((Some(_), None)) | Some((None, Some(_))) => {
                bail!("the URL's mutual CHAP needs both target_user and target_password")
            }
            _ => match &self.mutual_chap {
                Some(c) => {
                    Some(Credentials::parse(c).map_err(|e| anyhow::anyhow!("--mutual-chap: {e}"))?)
                }
                None => None,
            },
        };
        if target_chap.is_some() && chap.is_none() {
            bail!("mutual CHAP (--mutual-chap, $ETHERSAN_MUTUAL_CHAP or target_user in the URL) needs CHAP credentials of our own too: add --chap USER:SECRET");
        }
        Ok(LoginOptions {
            initiator_name: CLIENT_IQN.to_string(),
            target_name: url.map(|u| u.target.clone()),
            chap,
            target_chap,
            timeout: self.timeout.0,
            ..Default::default()
        })
    }
}

/// The error of a failed login to `target` at `portal`, with what to do.
pub(crate) fn login_error(e: ethersan_initiator::Error, what: &str, portal: &str) -> anyhow::Error {
    use ethersan_initiator::Error as E;
    match &e {
        E::Auth(_) => anyhow::anyhow!("{what} at {portal} failed: {e}"),
        E::LoginRefused {
            class: 2, detail: 1, ..
        } => anyhow::anyhow!(
            "{what} at {portal} refused: {e} (give CHAP credentials with --chap USER:SECRET, $ETHERSAN_CHAP or iscsi://USER%SECRET@host/..., and check them)"
        ),
        E::LoginRefused {
            class: 2, detail: 2, ..
        } => anyhow::anyhow!(
            "{what} at {portal} refused: {e} (the target's access rules do not admit initiator {CLIENT_IQN} from this host: on the server, ethersan ctl acl ls TARGET shows them and ethersan ctl acl add TARGET {CLIENT_IQN} admits this client, or add this host's network ADDR/LEN)"
        ),
        E::LoginRefused { .. } => anyhow::anyhow!("{what} at {portal} refused: {e}"),
        E::Timeout { .. } => anyhow::anyhow!(
            "{what} at {portal}: {e} (is the target running and not overloaded? --timeout waits longer)"
        ),
        _ => anyhow::anyhow!("cannot reach {portal} for {what}: {e}"),
    }
}

/// One LUN of a target, logged in.
#[derive(Clone, Debug)]
pub(crate) struct Lun {
    /// The session commands go through.
    pub session: Session,
    /// LUN number.
    pub lun: u64,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Number of logical blocks.
    pub blocks: u64,
    /// Largest transfer per command, in bytes.
    pub max_transfer: u64,
}

/// Whether `s` is a URL of an iSCSI session: over TCP (`iscsi://`) or
/// the native transport (`eth://`, `udp://`).
pub(crate) fn is_iscsi_url(s: &str) -> bool {
    ["iscsi://", "eth://", "udp://"]
        .iter()
        .any(|p| s.starts_with(p))
}

/// Log in to the target a URL names (a new session each call).
pub(crate) async fn login(url: &IscsiUrl, how: &ConnectArgs) -> anyhow::Result<Session> {
    if url.target.is_empty() {
        bail!("the URL names no target: iscsi://host[:port]/TARGET/LUN");
    }
    let opts = how.options(Some(url))?;
    if url.transport != ethersan_initiator::url::Transport::Tcp {
        let keys = how.group_keys()?;
        let place = match &url.transport {
            ethersan_initiator::url::Transport::Eth(_) => format!("eth://{}", url.host),
            _ => format!("udp://{}", url.portal()),
        };
        return ethersan_initiator::native::connect(url, &keys, &opts)
            .await
            .map_err(|e| login_error(e, &format!("login to {}", url.target), &place));
    }
    let portal = url.portal();
    connect(&portal, &opts)
        .await
        .map_err(|e| login_error(e, &format!("login to {}", url.target), &portal))
}

impl Lun {
    /// Log in and learn the LUN's geometry.
    pub(crate) async fn open(url: &IscsiUrl, how: &ConnectArgs) -> anyhow::Result<Lun> {
        let session = login(url, how).await?;
        Lun::on(session, url.lun).await
    }

    /// Learn the geometry of `lun` over an existing session.
    pub(crate) async fn on(session: Session, lun: u64) -> anyhow::Result<Lun> {
        let tur = session.clear_unit_attention(lun).await?;
        if tur.sense_key().is_some_and(|k| k.0 == 0x5 && k.1 == 0x25) {
            bail!(crate::client::no_such_lun(&session, lun).await);
        }
        if let Some(e) = crate::native_client::level_too_low(&session, lun, &tur) {
            return Err(e.into());
        }
        let (blocks, block_size) = session
            .read_capacity(lun)
            .await
            .with_context(|| format!("LUN {lun}"))?;
        if block_size == 0 || block_size > 1 << 20 {
            bail!("LUN {lun} reports an unusable block size {block_size}");
        }
        // Block Limits VPD (0xB0): MAXIMUM TRANSFER LENGTH in blocks, 0 = none.
        let mut max_transfer = DEFAULT_MAX_TRANSFER;
        let r = session
            .command(lun, &[0x12, 1, 0xb0, 0, 64, 0], Bytes::new(), 64)
            .await?;
        if r.status == 0 && r.data.len() >= 12 {
            let max_blocks = u32::from_be_bytes(r.data[8..12].try_into().expect("4 bytes"));
            if max_blocks != 0 {
                max_transfer = max_transfer.min(u64::from(max_blocks) * u64::from(block_size));
            }
        }
        max_transfer = (max_transfer / u64::from(block_size)).max(1) * u64::from(block_size);
        Ok(Lun {
            session,
            lun,
            block_size,
            blocks,
            max_transfer,
        })
    }

    /// Capacity in bytes.
    pub(crate) fn capacity(&self) -> u64 {
        self.blocks * u64::from(self.block_size)
    }

    fn lba(&self, offset: u64, len: usize) -> anyhow::Result<(u64, u32)> {
        let bs = u64::from(self.block_size);
        if !offset.is_multiple_of(bs) || !(len as u64).is_multiple_of(bs) {
            bail!("offset {offset} and length {len} must be multiples of the block size {bs}");
        }
        Ok((offset / bs, (len as u64 / bs) as u32))
    }

    /// Read `len` bytes at `offset` (both block-aligned).
    pub(crate) async fn read(&self, offset: u64, len: usize) -> anyhow::Result<Vec<u8>> {
        let (lba, n) = self.lba(offset, len)?;
        let r = self
            .session
            .read16(self.lun, lba, n, self.block_size)
            .await?;
        check(&format!("READ(16) at LBA {lba}"), &r)?;
        if r.data.len() != len {
            bail!(
                "READ(16) at LBA {lba}: {} bytes returned, {len} expected",
                r.data.len()
            );
        }
        Ok(r.data)
    }

    /// Write `data` at `offset` (both block-aligned).
    pub(crate) async fn write(&self, offset: u64, data: Bytes, fua: bool) -> anyhow::Result<()> {
        let (lba, _) = self.lba(offset, data.len())?;
        let r = self
            .session
            .write16(self.lun, lba, data, self.block_size, fua)
            .await?;
        check(&format!("WRITE(16) at LBA {lba}"), &r)
    }

    /// SYNCHRONIZE CACHE (10) over the whole LUN.
    pub(crate) async fn flush(&self) -> anyhow::Result<()> {
        let r = self
            .session
            .command(
                self.lun,
                &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                Bytes::new(),
                0,
            )
            .await?;
        check("SYNCHRONIZE CACHE", &r)
    }
}

/// A local file or block device.
#[derive(Clone, Debug)]
pub(crate) struct Local {
    /// The open file.
    pub file: Arc<File>,
    /// Its size in bytes (a block device's capacity).
    pub size: u64,
    /// A regular file (can hold holes), not a device.
    pub regular: bool,
}

impl Local {
    /// Open an existing file or block device for reading.
    pub(crate) fn open_read(path: &Path) -> anyhow::Result<Local> {
        let file = File::open(path).with_context(|| format!("open {}", path.display()))?;
        Local::from_file(file, path)
    }

    /// Open (creating or truncating a regular file) for writing.
    pub(crate) fn open_write(path: &Path, truncate: bool) -> anyhow::Result<Local> {
        let is_dev = std::fs::metadata(path)
            .map(|m| !m.is_file())
            .unwrap_or(false);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(!is_dev)
            .truncate(truncate && !is_dev)
            .open(path)
            .with_context(|| format!("open {} for writing", path.display()))?;
        Local::from_file(file, path)
    }

    fn from_file(file: File, path: &Path) -> anyhow::Result<Local> {
        let meta = file
            .metadata()
            .with_context(|| format!("stat {}", path.display()))?;
        let regular = meta.is_file();
        let size = if regular {
            meta.len()
        } else {
            use std::io::{Seek, SeekFrom};
            (&file)
                .seek(SeekFrom::End(0))
                .with_context(|| format!("size of {}", path.display()))?
        };
        Ok(Local {
            file: Arc::new(file),
            size,
            regular,
        })
    }

    /// Read up to `len` bytes at `offset` (short only at end of file).
    pub(crate) async fn read(&self, offset: u64, len: usize) -> anyhow::Result<Vec<u8>> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let mut buf = vec![0u8; len];
            let mut got = 0;
            while got < len {
                match file.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            buf.truncate(got);
            Ok(buf)
        })
        .await?
        .with_context(|| format!("read at byte {offset}"))
    }

    /// Write all of `data` at `offset`.
    pub(crate) async fn write(&self, offset: u64, data: Bytes) -> anyhow::Result<()> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || file.write_all_at(&data, offset))
            .await?
            .with_context(|| format!("write at byte {offset}"))
    }
}

/// How often a command that lost its session is tried again, each time on
/// a new session.
const RETRIES: u32 = 3;

/// A LUN whose reads and whole-block writes are retried on a new session
/// when a command times out or the connection is lost: each of them can be
/// repeated without changing the outcome (a write sends the same bytes to
/// the same blocks again). A cache flush is not (see
/// [`RetryingLun::flush`]). Used by `cp` and `attach`.
#[derive(Debug)]
pub(crate) struct RetryingLun {
    url: IscsiUrl,
    how: ConnectArgs,
    /// The current session's LUN and its generation (bumped per new session).
    current: std::sync::Mutex<(u64, Lun)>,
    /// One new login at a time.
    relogin: tokio::sync::Mutex<()>,
    /// Commands retried, and new sessions opened for them.
    retried: std::sync::atomic::AtomicU64,
    sessions: std::sync::atomic::AtomicU64,
    /// Where to say what happened (above a progress bar when there is one).
    pub(crate) bar: std::sync::Mutex<Option<indicatif::ProgressBar>>,
    /// What starts those lines ("ethersan cp").
    program: &'static str,
}

impl RetryingLun {
    /// Log in and learn the LUN's geometry.
    pub(crate) async fn open(url: &IscsiUrl, how: &ConnectArgs) -> anyhow::Result<RetryingLun> {
        let lun = Lun::open(url, how).await?;
        Ok(RetryingLun {
            url: url.clone(),
            how: how.clone(),
            current: std::sync::Mutex::new((0, lun)),
            relogin: tokio::sync::Mutex::new(()),
            retried: 0.into(),
            sessions: 0.into(),
            bar: std::sync::Mutex::new(None),
            program: "ethersan cp",
        })
    }

    /// Start the lines said when a session is replaced with `program`.
    pub(crate) fn said_by(mut self, program: &'static str) -> RetryingLun {
        self.program = program;
        self
    }

    /// The LUN as of now (its geometry does not change between sessions).
    pub(crate) fn lun(&self) -> Lun {
        self.current.lock().expect("not poisoned").1.clone()
    }

    /// (commands retried, new sessions opened) so far.
    pub(crate) fn retries(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.retried.load(Relaxed), self.sessions.load(Relaxed))
    }

    fn say(&self, msg: &str) {
        match &*self.bar.lock().expect("not poisoned") {
            Some(b) if !b.is_hidden() => b.println(msg),
            _ => note!("{msg}"),
        }
    }

    /// Run `op` on the current session; when the session fails (timeout,
    /// connection lost), log in again and run it again, up to [`RETRIES`]
    /// times.
    async fn run<T, F, Fut>(&self, what: &str, op: F) -> anyhow::Result<T>
    where
        F: Fn(Lun) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<T>>,
    {
        let mut tries = 0;
        loop {
            let (generation, lun) = self.current.lock().expect("not poisoned").clone();
            let err = match op(lun).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let failed = err
                .downcast_ref::<ethersan_initiator::Error>()
                .is_some_and(|e| e.is_session_failure());
            if !failed || tries == RETRIES {
                return Err(if tries > 0 {
                    err.context(format!(
                        "{what} failed after {tries} retries on new sessions"
                    ))
                } else {
                    err
                });
            }
            tries += 1;
            self.retried
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.renew(generation, &err).await?;
        }
    }

    /// A new session in place of generation `generation`, unless another
    /// command has already replaced it.
    async fn renew(&self, generation: u64, why: &anyhow::Error) -> anyhow::Result<()> {
        let _one = self.relogin.lock().await;
        let old = {
            let cur = self.current.lock().expect("not poisoned");
            if cur.0 != generation {
                return Ok(());
            }
            cur.1.clone()
        };
        old.session.abandon();
        self.say(&format!(
            "{}: {why:#}; logging in again to retry",
            self.program
        ));
        let mut last = None;
        for _ in 0..RETRIES {
            match Lun::open(&self.url, &self.how).await {
                Ok(lun) => {
                    self.sessions
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    *self.current.lock().expect("not poisoned") = (generation + 1, lun);
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .expect("tried at least once")
            .context(format!("{why:#}, and logging in again failed")))
    }

    /// Read `len` bytes at `offset` (both block-aligned).
    pub(crate) async fn read(&self, offset: u64, len: usize) -> anyhow::Result<Vec<u8>> {
        self.run("read", |l| async move { l.read(offset, len).await })
            .await
    }

    /// Write `data` at `offset` (both block-aligned).
    pub(crate) async fn write(&self, offset: u64, data: Bytes, fua: bool) -> anyhow::Result<()> {
        self.run("write", |l| {
            let data = data.clone();
            async move { l.write(offset, data, fua).await }
        })
        .await
    }

    /// SYNCHRONIZE CACHE over the whole LUN. Not repeated on a new
    /// session: writes the old session had acknowledged but the target had
    /// not yet made durable may be gone with it, and a flush on the new
    /// session would report them durable.
    pub(crate) async fn flush(&self) -> anyhow::Result<()> {
        let lun = self.lun();
        lun.flush().await.map_err(|e| {
            let lost = e
                .downcast_ref::<ethersan_initiator::Error>()
                .is_some_and(|e| e.is_session_failure());
            if lost {
                e.context("SYNCHRONIZE CACHE lost its session, so the copy's durability is unknown: run cp --sync again")
            } else {
                e
            }
        })
    }

    /// Log out of the current session.
    pub(crate) async fn logout(&self) {
        let _ = self.lun().session.logout().await;
    }
}
