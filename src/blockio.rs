//! What the client commands read and write: a LUN over iSCSI (through the
//! initiator library) or a local file or block device, addressed in bytes.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use bytes::Bytes;
use ethersan_initiator::{connect, CommandResult, IscsiUrl, LoginOptions, Session, UnitAttention};
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
    /// Largest transfer per command, in bytes.
    pub max_transfer: u64,
    /// Most bytes one WRITE SAME zeroes (MAXIMUM WRITE SAME LENGTH; the
    /// largest transfer when the target names none).
    pub max_write_same: u64,
    /// Unmapped blocks read back as zeros (LBPRZ): WRITE SAME may unmap.
    pub zeros_after_unmap: bool,
    /// What unit attentions keep up to date (the capacity, the target's
    /// LUN list), shared by every handle and every session of this LUN.
    known: Arc<Known>,
}

/// What the client knows of a LUN and its target that the target can
/// change while we are logged in, and says so with a unit attention.
#[derive(Debug, Default)]
pub(crate) struct Known {
    /// Number of logical blocks.
    blocks: std::sync::atomic::AtomicU64,
    /// The target's LUNs as last read after REPORTED LUNS DATA HAS CHANGED.
    luns: std::sync::Mutex<Option<Vec<u64>>>,
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
        Lun::on_known(session, lun, Arc::default()).await
    }

    /// [`Lun::on`], sharing what unit attentions teach with the other
    /// sessions of the same LUN (`known`), so that an event the target
    /// reports to each session is acted on and logged once.
    pub(crate) async fn on_known(
        session: Session,
        lun: u64,
        known: Arc<Known>,
    ) -> anyhow::Result<Lun> {
        let tur = session.clear_unit_attention(lun).await?;
        if tur.sense_key().is_some_and(|k| k.0 == 0x5 && k.1 == 0x25) {
            bail!(crate::client::no_such_lun(&session, lun).await);
        }
        if let Some(e) = crate::native_client::level_too_low(&session, lun, &tur) {
            return Err(e.into());
        }
        let mut l = Lun {
            session,
            lun,
            block_size: 0,
            max_transfer: DEFAULT_MAX_TRANSFER,
            max_write_same: 0,
            zeros_after_unmap: false,
            known,
        };
        let (blocks, block_size) = l
            .read_capacity()
            .await
            .with_context(|| format!("LUN {lun}"))?;
        if block_size == 0 || block_size > 1 << 20 {
            bail!("LUN {lun} reports an unusable block size {block_size}");
        }
        l.block_size = block_size;
        l.known
            .blocks
            .store(blocks, std::sync::atomic::Ordering::Relaxed);
        // Block Limits VPD (0xB0): MAXIMUM TRANSFER LENGTH in blocks, 0 = none.
        let mut max_transfer = DEFAULT_MAX_TRANSFER;
        let mut max_write_same = 0;
        let r = l
            .command(&[0x12, 1, 0xb0, 0, 64, 0], Bytes::new(), 64)
            .await?;
        if r.status == 0 && r.data.len() >= 12 {
            let max_blocks = u32::from_be_bytes(r.data[8..12].try_into().expect("4 bytes"));
            if max_blocks != 0 {
                max_transfer = max_transfer.min(u64::from(max_blocks) * u64::from(block_size));
            }
            // MAXIMUM WRITE SAME LENGTH, in blocks (0: none named).
            if let Some(b) = r.data.get(36..44) {
                let blocks = u64::from_be_bytes(b.try_into().expect("8 bytes"));
                max_write_same = blocks.saturating_mul(u64::from(block_size));
            }
        }
        let bs = u64::from(block_size);
        l.max_transfer = (max_transfer / bs).max(1) * bs;
        l.max_write_same = if max_write_same == 0 {
            l.max_transfer
        } else {
            (max_write_same.min(1 << 30) / bs).max(1) * bs
        };
        // Logical Block Provisioning VPD (0xB2): LBPRZ.
        let r = l
            .command(&[0x12, 1, 0xb2, 0, 64, 0], Bytes::new(), 64)
            .await?;
        l.zeros_after_unmap = r.status == 0 && r.data.get(5).is_some_and(|b| b & 0x04 != 0);
        Ok(l)
    }

    /// What this LUN's handles share (for [`Lun::on_known`]).
    pub(crate) fn known(&self) -> Arc<Known> {
        self.known.clone()
    }

    /// Number of logical blocks (as of the last CAPACITY DATA HAS CHANGED).
    pub(crate) fn blocks(&self) -> u64 {
        self.known.blocks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Capacity in bytes.
    pub(crate) fn capacity(&self) -> u64 {
        self.blocks() * u64::from(self.block_size)
    }

    /// Run one command on the LUN: the one command path of every client
    /// tool over iSCSI (and the native transport). A command answered with
    /// a unit attention was not executed and is sent again (bounded, see
    /// [`ethersan_initiator::attention`]); what the attention said is acted
    /// on first: the capacity is read again after CAPACITY DATA HAS
    /// CHANGED, the target's LUN list after REPORTED LUNS DATA HAS CHANGED,
    /// and each change is logged once.
    pub(crate) async fn command(
        &self,
        cdb: &[u8],
        data_out: Bytes,
        read_len: u32,
    ) -> anyhow::Result<CommandResult> {
        let a = self
            .session
            .command_attended(self.lun, cdb, data_out, read_len)
            .await?;
        for ua in a.attentions {
            self.attend(ua).await;
        }
        Ok(a.result)
    }

    /// Act on one unit attention: re-read what it says has changed.
    async fn attend(&self, ua: UnitAttention) {
        use std::sync::atomic::Ordering::Relaxed;
        match ua {
            UnitAttention::CapacityChanged => match self.read_capacity().await {
                Ok((blocks, _)) => {
                    let was = self.known.blocks.swap(blocks, Relaxed);
                    if was != blocks {
                        tracing::info!(
                            "LUN {}: the target says its capacity changed: {} → {} bytes ({ua})",
                            self.lun,
                            was * u64::from(self.block_size),
                            blocks * u64::from(self.block_size)
                        );
                    }
                }
                Err(e) => tracing::warn!(
                    "LUN {}: {ua}, and reading the new capacity failed: {e:#}",
                    self.lun
                ),
            },
            UnitAttention::LunsChanged => match self.report_luns().await {
                Ok(luns) => {
                    let mut known = self.known.luns.lock().expect("not poisoned");
                    if known.as_ref() != Some(&luns) {
                        let list = luns
                            .iter()
                            .map(u64::to_string)
                            .collect::<Vec<_>>()
                            .join(", ");
                        if luns.contains(&self.lun) {
                            tracing::info!("the target's LUNs changed ({ua}): now {list}");
                        } else {
                            tracing::warn!(
                                "the target's LUNs changed ({ua}): now {list}, without LUN {}",
                                self.lun
                            );
                        }
                        *known = Some(luns);
                    }
                }
                Err(e) => tracing::warn!(
                    "LUN {}: {ua}, and reading the LUN list failed: {e:#}",
                    self.lun
                ),
            },
            // Not acted on: logged, and the command was sent again.
            other => tracing::info!("LUN {}: {other}", self.lun),
        }
    }

    /// READ CAPACITY (16): (number of blocks, block size).
    async fn read_capacity(&self) -> anyhow::Result<(u64, u32)> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x9e;
        cdb[1] = 0x10;
        cdb[13] = 32;
        let r = self
            .session
            .command_attended(self.lun, &cdb, Bytes::new(), 32)
            .await?
            .result;
        check("READ CAPACITY(16)", &r)?;
        if r.data.len() < 12 {
            bail!(
                "READ CAPACITY(16): {} bytes of data, 12 expected",
                r.data.len()
            );
        }
        let last = u64::from_be_bytes(r.data[0..8].try_into().expect("8 bytes"));
        let bs = u32::from_be_bytes(r.data[8..12].try_into().expect("4 bytes"));
        Ok((last + 1, bs))
    }

    /// REPORT LUNS (to this LUN: any LUN of the target answers it).
    async fn report_luns(&self) -> anyhow::Result<Vec<u64>> {
        let mut cdb = [0u8; 12];
        cdb[0] = 0xa0;
        cdb[6..10].copy_from_slice(&4096u32.to_be_bytes());
        let r = self
            .session
            .command_attended(self.lun, &cdb, Bytes::new(), 4096)
            .await?
            .result;
        check("REPORT LUNS", &r)?;
        Ok(lun_list(&r.data))
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
        let mut cdb = [0u8; 16];
        cdb[0] = 0x88;
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&n.to_be_bytes());
        let r = self.command(&cdb, Bytes::new(), len as u32).await?;
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
        let (lba, n) = self.lba(offset, data.len())?;
        let mut cdb = [0u8; 16];
        cdb[0] = 0x8a;
        if fua {
            cdb[1] = 0x08;
        }
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&n.to_be_bytes());
        let r = self.command(&cdb, data, 0).await?;
        check(&format!("WRITE(16) at LBA {lba}"), &r)
    }

    /// SYNCHRONIZE CACHE (10) over the whole LUN.
    pub(crate) async fn flush(&self) -> anyhow::Result<()> {
        let r = self
            .command(&[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], Bytes::new(), 0)
            .await?;
        check("SYNCHRONIZE CACHE", &r)
    }

    /// WRITE SAME (16) of a zero block over `len` bytes at `offset` (both
    /// block-aligned, `len` at most [`Lun::max_write_same`]); `unmap`: the
    /// target may deallocate them instead, asked only when unmapped
    /// blocks read back as zeros. `Ok(false)`: the target has no WRITE
    /// SAME (16) (ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE).
    pub(crate) async fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        unmap: bool,
    ) -> anyhow::Result<bool> {
        let (lba, n) = self.lba(offset, len as usize)?;
        if n == 0 {
            return Ok(true);
        }
        let mut cdb = [0u8; 16];
        cdb[0] = 0x93;
        if unmap && self.zeros_after_unmap {
            cdb[1] = 0x08;
        }
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&n.to_be_bytes());
        let zero = Bytes::from(vec![0u8; self.block_size as usize]);
        let r = self.command(&cdb, zero, 0).await?;
        if r.sense_key() == Some((0x5, 0x20, 0x00)) {
            return Ok(false);
        }
        check(&format!("WRITE SAME(16) at LBA {lba}"), &r)?;
        Ok(true)
    }
}

/// LUN numbers from REPORT LUNS parameter data.
pub(crate) fn lun_list(data: &[u8]) -> Vec<u64> {
    let Some(len) = data.get(0..4) else {
        return Vec::new();
    };
    let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
    data.get(8..(8 + len).min(data.len()))
        .unwrap_or_default()
        .chunks_exact(8)
        .map(|e| {
            ethersan_proto::pdu::lun_from_wire(u64::from_be_bytes(e.try_into().expect("8 bytes")))
        })
        .collect()
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

    /// The LUN as of now (its block size does not change between sessions;
    /// its capacity follows CAPACITY DATA HAS CHANGED, shared by them all).
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
            let opened = match login(&self.url, &self.how).await {
                Ok(session) => Lun::on_known(session, self.url.lun, old.known()).await,
                Err(e) => Err(e),
            };
            match opened {
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

    /// Zero `len` bytes at `offset` (see [`Lun::write_zeroes`]); false
    /// when the target has no WRITE SAME (16). Repeatable like a write.
    pub(crate) async fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        unmap: bool,
    ) -> anyhow::Result<bool> {
        self.run("write same", |l| async move {
            l.write_zeroes(offset, len, unmap).await
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
