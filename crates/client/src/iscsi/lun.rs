//! One LUN of a target over an iSCSI session: its geometry (READ
//! CAPACITY, the Block Limits and Logical Block Provisioning VPD pages),
//! the one command path that acts on unit attentions, and reads, writes,
//! flushes and WRITE SAME addressed in bytes.

use std::sync::Arc;

use anyhow::{bail, Context};
use bytes::Bytes;
use ethersan_channel::Level;
use ethersan_initiator::{CommandResult, Session, UnitAttention};

use super::login::{login, LoggedIn};
use super::luns::{lun_list, no_such_lun};
use crate::native::level_too_low;
use crate::options::{ConnectArgs, DEFAULT_MAX_TRANSFER};
use crate::scsi::check;
use crate::url::IscsiUrl;

/// One LUN of a target, logged in.
#[derive(Clone, Debug)]
pub struct Lun {
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
    /// The native channel's security level (`None`: TCP).
    pub channel: Option<Level>,
    /// What unit attentions keep up to date (the capacity, the target's
    /// LUN list), shared by every handle and every session of this LUN.
    known: Arc<Known>,
}

/// What the client knows of a LUN and its target that the target can
/// change while we are logged in, and says so with a unit attention.
#[derive(Debug, Default)]
pub struct Known {
    /// Number of logical blocks.
    blocks: std::sync::atomic::AtomicU64,
    /// The target's LUNs as last read after REPORTED LUNS DATA HAS CHANGED.
    luns: std::sync::Mutex<Option<Vec<u64>>>,
}

impl Lun {
    /// Log in and learn the LUN's geometry.
    pub async fn open(url: &IscsiUrl, how: &ConnectArgs) -> anyhow::Result<Lun> {
        let logged = login(url, how).await?;
        Lun::on_known(logged, url.lun, Arc::default()).await
    }

    /// Learn the geometry of `lun` over a session logged in, sharing what unit attentions teach with the other
    /// sessions of the same LUN (`known`), so that an event the target
    /// reports to each session is acted on and logged once.
    pub async fn on_known(logged: LoggedIn, lun: u64, known: Arc<Known>) -> anyhow::Result<Lun> {
        let LoggedIn { session, channel } = logged;
        let tur = session.clear_unit_attention(lun).await?;
        if tur.sense_key().is_some_and(|k| k.0 == 0x5 && k.1 == 0x25) {
            bail!(no_such_lun(&session, lun).await);
        }
        if let Some(e) = level_too_low(channel, lun, &tur) {
            return Err(e.into());
        }
        let mut l = Lun {
            session,
            lun,
            block_size: 0,
            max_transfer: DEFAULT_MAX_TRANSFER,
            max_write_same: 0,
            zeros_after_unmap: false,
            channel,
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
    pub fn known(&self) -> Arc<Known> {
        self.known.clone()
    }

    /// Number of logical blocks (as of the last CAPACITY DATA HAS CHANGED).
    pub fn blocks(&self) -> u64 {
        self.known.blocks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.blocks() * u64::from(self.block_size)
    }

    /// Run one command on the LUN: the one command path of every client
    /// tool over iSCSI (and the native transport). A command answered with
    /// a unit attention was not executed and is sent again (bounded, see
    /// [`ethersan_initiator::attention`]); what the attention said is acted
    /// on first: the capacity is read again after CAPACITY DATA HAS
    /// CHANGED, the target's LUN list after REPORTED LUNS DATA HAS CHANGED,
    /// and each change is logged once.
    pub async fn command(
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
    pub async fn read(&self, offset: u64, len: usize) -> anyhow::Result<Vec<u8>> {
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
    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> anyhow::Result<()> {
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
    pub async fn flush(&self) -> anyhow::Result<()> {
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
    pub async fn write_zeroes(&self, offset: u64, len: u64, unmap: bool) -> anyhow::Result<bool> {
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
