//! SBC-4 §4.11 SANITIZE: overwrite, block erase, cryptographic erase and
//! EXIT FAILURE MODE. The work runs on its own thread when IMMED is set;
//! meanwhile the unit answers NOT READY / SANITIZE IN PROGRESS with a
//! progress indication.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use ethersan_backend::{BackendError, BlockDevice, BlockDeviceExt};

use super::{CmdResult, LogicalUnit, Reply};
use crate::be::be16;
use crate::sense::{codes, Sense};

/// SANITIZE OVERWRITE runs at most this fast, so that it never starves
/// the other logical units sharing the storage.
const SANITIZE_OVERWRITE_BYTES_PER_SEC: u64 = 16 << 20;

/// A SANITIZE operation in progress (SBC-4 §4.11).
#[derive(Debug, Default)]
pub(super) struct SanitizeState {
    pub(super) running: AtomicBool,
    /// The last sanitize failed: medium access fails until EXIT FAILURE MODE.
    pub(super) failed: AtomicBool,
    /// Fraction done, out of 65536.
    pub(super) progress: AtomicU32,
}

enum SanitizeJob {
    Overwrite {
        pattern: Vec<u8>,
        passes: u8,
        invert: bool,
    },
    Erase,
}

/// Run a sanitize to completion (on its own thread when IMMED is set).
fn run_sanitize(dev: Arc<dyn BlockDevice>, st: Arc<SanitizeState>, job: SanitizeJob) {
    let total = dev.num_blocks() * u64::from(dev.block_size());
    let chunk = 1u64 << 20;
    let result = (|| -> Result<(), BackendError> {
        match job {
            SanitizeJob::Erase if dev.thin_provisioned() => dev.unmap(0, total)?,
            SanitizeJob::Erase => {
                let zeros = vec![0u8; chunk as usize];
                let mut off = 0;
                while off < total {
                    let n = (total - off).min(chunk);
                    dev.write_at(off, &zeros[..n as usize], false)?;
                    off += n;
                    st.progress.store(
                        ((off as u128 * 65535) / u128::from(total)) as u32,
                        Ordering::Relaxed,
                    );
                }
            }
            SanitizeJob::Overwrite {
                pattern,
                passes,
                invert,
            } => {
                let start = std::time::Instant::now();
                let mut written = 0u64;
                let work = total * u64::from(passes);
                for pass in 0..passes {
                    let flip = invert && pass % 2 == 1;
                    let buf: Vec<u8> = pattern
                        .iter()
                        .map(|b| if flip { !b } else { *b })
                        .cycle()
                        .take(chunk as usize)
                        .collect();
                    let mut off = 0;
                    while off < total {
                        let n = (total - off).min(chunk);
                        dev.write_at(off, &buf[..n as usize], false)?;
                        off += n;
                        written += n;
                        st.progress.store(
                            ((written as u128 * 65535) / u128::from(work)) as u32,
                            Ordering::Relaxed,
                        );
                        let due = std::time::Duration::from_secs_f64(
                            written as f64 / SANITIZE_OVERWRITE_BYTES_PER_SEC as f64,
                        );
                        if let Some(wait) = due.checked_sub(start.elapsed()) {
                            std::thread::sleep(wait);
                        }
                    }
                }
            }
        }
        dev.flush()
    })();
    if let Err(e) = result {
        tracing::error!(%e, "sanitize failed");
        st.failed.store(true, Ordering::Release);
    }
    st.running.store(false, Ordering::Release);
}

impl LogicalUnit {
    /// SANITIZE: overwrite, block erase or cryptographic erase of the whole
    /// medium (erases deallocate on thin units, else write zeros), or exit
    /// failure mode. IMMED returns at once; the unit is NOT READY / SANITIZE
    /// IN PROGRESS until it finishes.
    pub(super) fn sanitize(&self, cdb: &[u8], data: &[u8]) -> CmdResult {
        let immed = cdb[1] & 0x80 != 0;
        let action = cdb[1] & 0x1f;
        let len = usize::from(be16(&cdb[7..9]));
        let job = match action {
            0x1f => {
                if len != 0 {
                    return Err(Sense::invalid_cdb_field(7, None));
                }
                self.sanitize.failed.store(false, Ordering::Release);
                return Reply::none();
            }
            0x01 => {
                if len < 4 || data.len() < len {
                    return Err(Sense::invalid_cdb_field(7, None));
                }
                let passes = data[0] & 0x1f;
                let pattern_len = usize::from(be16(&data[2..4]));
                if data[0] & 0x60 != 0 || data[1] != 0 {
                    return Err(Sense::invalid_param_field(0));
                }
                if passes == 0
                    || pattern_len == 0
                    || pattern_len > self.bs() as usize
                    || len != pattern_len + 4
                {
                    return Err(Sense::invalid_cdb_field(7, None));
                }
                SanitizeJob::Overwrite {
                    pattern: data[4..4 + pattern_len].to_vec(),
                    passes,
                    invert: data[0] & 0x80 != 0,
                }
            }
            _ => {
                if len != 0 {
                    return Err(Sense::invalid_cdb_field(7, None));
                }
                SanitizeJob::Erase
            }
        };
        if let Some(s) = self.write_protected() {
            return Err(s);
        }
        self.sanitize.progress.store(0, Ordering::Relaxed);
        self.sanitize.running.store(true, Ordering::Release);
        self.sanitize.failed.store(false, Ordering::Release);
        let (dev, st) = (self.dev.clone(), self.sanitize.clone());
        if immed {
            std::thread::spawn(move || run_sanitize(dev, st, job));
            return Reply::none();
        }
        run_sanitize(dev, st, job);
        if self.sanitize.failed.load(Ordering::Acquire) {
            return Err(codes::SANITIZE_FAILED);
        }
        Reply::none()
    }
}
