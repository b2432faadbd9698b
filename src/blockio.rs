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
                (0x7, 0x27, _) => " — the LUN is read-only",
                (0x2, 0x3a, _) => " — no medium (ejected)",
                (0x5, 0x21, _) => " — address beyond the end of the LUN",
                (0x5, 0x25, _) => " — no such LUN",
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

/// CHAP credentials from `iscsi://user%secret@...`.
pub(crate) fn chap_from_url(url: &IscsiUrl) -> anyhow::Result<Option<Credentials>> {
    match (&url.user, &url.secret) {
        (None, _) => Ok(None),
        (Some(u), Some(s)) => Credentials::new(u, s.as_bytes())
            .map(Some)
            .map_err(|e| anyhow::anyhow!("CHAP in the URL: {e}")),
        (Some(_), None) => {
            bail!("the URL names a CHAP user but no secret: iscsi://user%secret@host/...")
        }
    }
}

/// Mutual CHAP: the target's USER:SECRET from `$ETHERSAN_MUTUAL_CHAP`.
pub(crate) fn mutual_chap_from_env() -> anyhow::Result<Option<Credentials>> {
    match std::env::var("ETHERSAN_MUTUAL_CHAP") {
        Ok(v) => Credentials::parse(&v)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("ETHERSAN_MUTUAL_CHAP: {e}")),
        Err(_) => Ok(None),
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

/// Log in to the target a URL names (a new session each call).
pub(crate) async fn login(url: &IscsiUrl) -> anyhow::Result<Session> {
    if url.target.is_empty() {
        bail!("the URL names no target: iscsi://host[:port]/TARGET/LUN");
    }
    let opts = LoginOptions {
        initiator_name: CLIENT_IQN.to_string(),
        target_name: Some(url.target.clone()),
        chap: chap_from_url(url)?,
        target_chap: mutual_chap_from_env()?,
        ..Default::default()
    };
    let portal = url.portal();
    match connect(&portal, &opts).await {
        Ok(s) => Ok(s),
        Err(e @ ethersan_initiator::Error::Auth(_)) => Err(anyhow::anyhow!(
            "login to {} at {portal} failed: {e}",
            url.target
        )),
        Err(e @ ethersan_initiator::Error::LoginRefused { .. }) => Err(anyhow::anyhow!(
            "login to {} at {portal} refused: {e}",
            url.target
        )),
        Err(e) => Err(anyhow::anyhow!(
            "cannot reach target {} at {portal}: {e}",
            url.target
        )),
    }
}

impl Lun {
    /// Log in and learn the LUN's geometry.
    pub(crate) async fn open(url: &IscsiUrl) -> anyhow::Result<Lun> {
        let session = login(url).await?;
        Lun::on(session, url.lun).await
    }

    /// Learn the geometry of `lun` over an existing session.
    pub(crate) async fn on(session: Session, lun: u64) -> anyhow::Result<Lun> {
        let tur = session.clear_unit_attention(lun).await?;
        if tur.sense_key().is_some_and(|k| k.0 == 0x5 && k.1 == 0x25) {
            bail!("the target has no LUN {lun}");
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
