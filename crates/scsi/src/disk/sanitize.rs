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

/// Keeps a sanitize at or below its configured rate (no limit: no wait).
struct Pace {
    start: std::time::Instant,
    written: u64,
    rate: Option<u64>,
}

impl Pace {
    fn new(rate: Option<u64>) -> Pace {
        Pace {
            start: std::time::Instant::now(),
            written: 0,
            rate: rate.filter(|r| *r > 0),
        }
    }

    /// `n` more bytes written: how long to wait before the next write.
    fn wrote(&mut self, n: u64) -> Option<std::time::Duration> {
        self.written += n;
        let rate = self.rate?;
        let due = std::time::Duration::from_secs_f64(self.written as f64 / rate as f64);
        due.checked_sub(self.start.elapsed())
    }
}

/// Write `fill` (a chunk of the pattern) over the whole device, `passes`
/// times (every other pass inverted when `invert`), reporting progress.
fn overwrite(
    dev: &dyn BlockDevice,
    st: &SanitizeState,
    fill: &[u8],
    passes: u8,
    invert: bool,
    rate: Option<u64>,
) -> Result<(), BackendError> {
    let total = dev.num_blocks() * u64::from(dev.block_size());
    let chunk = fill.len() as u64;
    let work = total * u64::from(passes);
    let mut pace = Pace::new(rate);
    let inverted: Vec<u8> = if invert {
        fill.iter().map(|b| !b).collect()
    } else {
        Vec::new()
    };
    for pass in 0..passes {
        let buf = if invert && pass % 2 == 1 {
            &inverted[..]
        } else {
            fill
        };
        let mut off = 0;
        while off < total {
            let n = (total - off).min(chunk);
            dev.write_at(off, &buf[..n as usize], false)?;
            off += n;
            st.progress.store(
                ((u128::from(pace.written + n) * 65535) / u128::from(work)) as u32,
                Ordering::Relaxed,
            );
            if let Some(wait) = pace.wrote(n) {
                std::thread::sleep(wait);
            }
        }
    }
    Ok(())
}

/// Run a sanitize to completion (on its own thread when IMMED is set), at
/// most `rate` bytes per second when one is set.
fn run_sanitize(
    dev: Arc<dyn BlockDevice>,
    st: Arc<SanitizeState>,
    job: SanitizeJob,
    rate: Option<u64>,
) {
    let total = dev.num_blocks() * u64::from(dev.block_size());
    let chunk = 1usize << 20;
    let result = (|| -> Result<(), BackendError> {
        match job {
            SanitizeJob::Erase if dev.thin_provisioned() => dev.unmap(0, total)?,
            SanitizeJob::Erase => overwrite(&*dev, &st, &vec![0u8; chunk], 1, false, rate)?,
            SanitizeJob::Overwrite {
                pattern,
                passes,
                invert,
            } => {
                let fill: Vec<u8> = pattern.iter().copied().cycle().take(chunk).collect();
                overwrite(&*dev, &st, &fill, passes, invert, rate)?
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
        let rate = self.config().sanitize_rate;
        if immed {
            std::thread::spawn(move || run_sanitize(dev, st, job, rate));
            return Reply::none();
        }
        run_sanitize(dev, st, job, rate);
        if self.sanitize.failed.load(Ordering::Acquire) {
            return Err(codes::SANITIZE_FAILED);
        }
        Reply::none()
    }
}
