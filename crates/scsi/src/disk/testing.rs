//! Fixtures for the unit tests: a [`ScsiTarget`] over a RAM device (at
//! 512- or 4096-byte blocks) that can record FUA and flushes, fail I/O, or
//! claim a larger capacity than it stores, and answer its engine
//! submissions done now, pending (completed from another thread) or as
//! blocking jobs.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ethersan_backend::ram::RamDevice;
use ethersan_backend::{
    BackendError, BlockDevice, BlockDeviceExt, IoCompletion, IoRequest, IoResult, Submission,
};

use crate::{LogicalUnit, LuConfig, Nexus, ScsiCommand, ScsiResponse, ScsiStatus, ScsiTarget};

/// How a [`TestDevice`] answers a submission.
pub(crate) const ANSWER_DONE: u8 = 0;
/// As a [`Submission::Blocking`] job.
pub(crate) const ANSWER_BLOCKING: u8 = 1;
/// [`Submission::Pending`], completed from another thread.
pub(crate) const ANSWER_PENDING: u8 = 2;

/// The block sizes every test runs at.
pub(crate) const BLOCK_SIZES: [u32; 2] = [512, 4096];
/// Bytes of RAM behind each test LU.
pub(crate) const DEV_BYTES: u64 = 4 << 20;
/// The nexus most tests send from.
pub(crate) const A: Nexus = Nexus(1);
/// A second logged-in nexus.
pub(crate) const B: Nexus = Nexus(2);

/// A RAM device with test hooks.
#[derive(Debug)]
pub(crate) struct TestDevice {
    ram: RamDevice,
    /// Capacity reported instead of the RAM size (reads past the RAM fail).
    pub(crate) claimed_blocks: Option<u64>,
    pub(crate) fail_reads: AtomicBool,
    pub(crate) fail_writes: AtomicBool,
    /// The FUA flag of every write, in order.
    pub(crate) fua: Mutex<Vec<bool>>,
    pub(crate) flushes: AtomicUsize,
    pub(crate) prefetches: AtomicUsize,
    /// [`ANSWER_DONE`], [`ANSWER_BLOCKING`] or [`ANSWER_PENDING`].
    pub(crate) answer: AtomicU8,
    /// What [`BlockDevice::splits_reads`] says.
    pub(crate) split: AtomicBool,
    /// A read that covers this byte fails.
    pub(crate) fail_read_at: Mutex<Option<u64>>,
    /// Every read, `(offset, len)`, in order of submission.
    pub(crate) reads: Mutex<Vec<(u64, usize)>>,
    /// What [`BlockDevice::splits_writes`] says.
    pub(crate) split_writes: AtomicBool,
    /// A write that covers this byte fails.
    pub(crate) fail_write_at: Mutex<Option<u64>>,
    /// Every write, `(offset, len, fua)`, in order of submission.
    pub(crate) writes: Mutex<Vec<(u64, usize, bool)>>,
    /// Writes submitted and not yet completed, and the most seen at once.
    pub(crate) writes_in_flight: Arc<AtomicUsize>,
    pub(crate) max_writes_in_flight: AtomicUsize,
}

impl TestDevice {
    pub(crate) fn new(bs: u32) -> Self {
        TestDevice {
            ram: RamDevice::new(DEV_BYTES, bs).expect("ram device"),
            claimed_blocks: None,
            fail_reads: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            fua: Mutex::new(Vec::new()),
            flushes: AtomicUsize::new(0),
            prefetches: AtomicUsize::new(0),
            answer: AtomicU8::new(ANSWER_DONE),
            split: AtomicBool::new(false),
            fail_read_at: Mutex::new(None),
            reads: Mutex::new(Vec::new()),
            split_writes: AtomicBool::new(false),
            fail_write_at: Mutex::new(None),
            writes: Mutex::new(Vec::new()),
            writes_in_flight: Arc::default(),
            max_writes_in_flight: AtomicUsize::new(0),
        }
    }
}

fn io_error() -> std::io::Error {
    std::io::Error::from_raw_os_error(5)
}

impl TestDevice {
    /// Do the I/O at once, with the failures asked for.
    fn run(&self, req: IoRequest) -> IoResult {
        match req {
            IoRequest::Read { offset, len, .. } => {
                self.reads.lock().unwrap().push((offset, len));
                let bad = *self.fail_read_at.lock().unwrap();
                let hits_bad = bad.is_some_and(|b| (offset..offset + len as u64).contains(&b));
                if self.fail_reads.load(Ordering::Relaxed)
                    || hits_bad
                    || offset + len as u64 > DEV_BYTES
                {
                    return Err(BackendError::Read {
                        offset,
                        cause: io_error(),
                    });
                }
                let mut buf = vec![0u8; len];
                self.ram.read_at(offset, &mut buf)?;
                Ok(buf.into())
            }
            IoRequest::Write {
                offset,
                data,
                len,
                fua,
            } => {
                self.writes.lock().unwrap().push((offset, len, fua));
                let bad = *self.fail_write_at.lock().unwrap();
                let hits_bad = bad.is_some_and(|b| (offset..offset + len as u64).contains(&b));
                if self.fail_writes.load(Ordering::Relaxed)
                    || hits_bad
                    || offset + len as u64 > DEV_BYTES
                {
                    return Err(BackendError::Write {
                        offset,
                        cause: io_error(),
                    });
                }
                self.fua.lock().unwrap().push(fua);
                self.ram.write_at(offset, &data[..len], fua)?;
                Ok(Default::default())
            }
            IoRequest::Flush => {
                if self.fail_writes.load(Ordering::Relaxed) {
                    return Err(BackendError::Flush(io_error()));
                }
                self.flushes.fetch_add(1, Ordering::Relaxed);
                Ok(Default::default())
            }
        }
    }
}

impl BlockDevice for TestDevice {
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.claimed_blocks.unwrap_or_else(|| self.ram.num_blocks())
    }
    fn submit(&self, req: IoRequest, done: IoCompletion) -> Submission {
        let write = matches!(req, IoRequest::Write { .. });
        let r = self.run(req);
        match self.answer.load(Ordering::Relaxed) {
            ANSWER_BLOCKING => Submission::Blocking(Box::new(move || r)),
            ANSWER_PENDING if write => {
                let now = self.writes_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                self.max_writes_in_flight.fetch_max(now, Ordering::SeqCst);
                let count = self.writes_in_flight.clone();
                std::thread::spawn(move || {
                    count.fetch_sub(1, Ordering::SeqCst);
                    done(r)
                });
                Submission::Pending
            }
            ANSWER_PENDING => {
                std::thread::spawn(move || done(r));
                Submission::Pending
            }
            _ => Submission::Done(r),
        }
    }
    fn splits_writes(&self) -> bool {
        self.split_writes.load(Ordering::Relaxed)
    }
    fn splits_reads(&self) -> bool {
        self.split.load(Ordering::Relaxed)
    }
    fn prefetch(&self, _offset: u64, _len: u64) -> Result<(), BackendError> {
        self.prefetches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn describe(&self) -> String {
        "test".into()
    }
}

/// The configuration tests use.
pub(crate) fn config(removable: bool, read_only: bool) -> LuConfig {
    LuConfig {
        read_only,
        removable,
        vendor: "ETHERSAN".into(),
        product: "unit test disk".into(),
        revision: "0001".into(),
        serial: "SN0001".into(),
        naa: [
            0x60, 0x01, 0x40, 0x5f, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
        ],
        target_name: "iqn.2026-11.org.ethersan:unit".into(),
        write_cache: true,
        pr_state_file: None,
        physical_block_size: 0,
        sanitize_rate: None,
        alua: Default::default(),
    }
}

/// A one-LUN target over `dev`, with nexuses A and B logged in and their
/// power-on unit attentions already consumed.
pub(crate) fn target_over(dev: Arc<TestDevice>, cfg: LuConfig) -> ScsiTarget {
    let t = ScsiTarget::new(vec![Arc::new(LogicalUnit::new(dev, cfg))]);
    for n in [A, B] {
        t.nexus_added(n);
        assert_eq!(
            sense(&exec(&t, n, &[0, 0, 0, 0, 0, 0], &[])),
            Some((6, 0x29, 0))
        );
    }
    t
}

/// A plain test target: RAM at `bs`, write cache on.
pub(crate) fn target(bs: u32) -> (ScsiTarget, Arc<TestDevice>) {
    let dev = Arc::new(TestDevice::new(bs));
    (target_over(dev.clone(), config(false, false)), dev)
}

/// Run `cdb` on LUN 0 from `nexus`.
pub(crate) fn exec(t: &ScsiTarget, nexus: Nexus, cdb: &[u8], data: &[u8]) -> ScsiResponse {
    exec_lun(t, nexus, 0, cdb, data)
}

/// Run `cdb` on `lun` from `nexus`.
pub(crate) fn exec_lun(
    t: &ScsiTarget,
    nexus: Nexus,
    lun: u64,
    cdb: &[u8],
    data: &[u8],
) -> ScsiResponse {
    let cmd = ScsiCommand {
        nexus,
        lun,
        cdb: cdb.to_vec(),
        data_out: data.to_vec().into(),
        expected_len: 1 << 24,
    };
    t.submit_and_wait(cmd, None)
}

/// (key, ASC, ASCQ) of the response's sense data, fixed or descriptor.
pub(crate) fn sense(r: &ScsiResponse) -> Option<(u8, u8, u8)> {
    sense_of(&r.sense)
}

/// (key, ASC, ASCQ) of raw sense bytes.
pub(crate) fn sense_of(s: &[u8]) -> Option<(u8, u8, u8)> {
    crate::sense::Sense::parse(s).map(|s| s.triple())
}

/// The fixed-format sense-key-specific bytes (SKSV, C/D, BPV, bit; field).
pub(crate) fn field_pointer(r: &ScsiResponse) -> [u8; 3] {
    [r.sense[15], r.sense[16], r.sense[17]]
}

/// Assert GOOD and return the Data-In.
#[track_caller]
pub(crate) fn good(r: ScsiResponse) -> Vec<u8> {
    assert_eq!(r.status, ScsiStatus::Good, "sense {:?}", sense(&r));
    r.data_in.into_vec()
}

/// Assert CHECK CONDITION with this sense.
#[track_caller]
pub(crate) fn check(r: &ScsiResponse, key: u8, asc: u8, ascq: u8) {
    assert_eq!(r.status, ScsiStatus::CheckCondition, "data {:?}", r.data_in);
    assert_eq!(sense(r), Some((key, asc, ascq)));
}

/// A 10-byte block CDB (READ(10), WRITE(10), VERIFY(10)...).
pub(crate) fn cdb10(op: u8, byte1: u8, lba: u32, n: u16) -> Vec<u8> {
    let mut c = vec![op, byte1, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&n.to_be_bytes());
    c
}

/// A 12-byte block CDB.
pub(crate) fn cdb12(op: u8, byte1: u8, lba: u32, n: u32) -> Vec<u8> {
    let mut c = vec![op, byte1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[6..10].copy_from_slice(&n.to_be_bytes());
    c
}

/// A 16-byte block CDB.
pub(crate) fn cdb16(op: u8, byte1: u8, lba: u64, n: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op;
    c[1] = byte1;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&n.to_be_bytes());
    c
}

/// A pattern of `n` bytes that differs per block.
pub(crate) fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}
