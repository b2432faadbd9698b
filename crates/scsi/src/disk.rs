//! SBC-3 direct-access block device emulation: one logical unit over a
//! [`BlockDevice`].
//!
//! The READ/WRITE path takes no lock: it reads an atomic "a unit attention
//! is pending" flag and atomic mode bits, then does positional I/O on the
//! backend. Mode pages, unit attentions and medium state sit behind one
//! mutex that only slow-path commands touch.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ethersan_backend::{BackendError, BlockDevice};

use crate::be::{be16, be32, be64};
use crate::commands::{self, CommandDef, Op, COMMANDS};
use crate::reservations::{Access, PrError, Reservations};
use crate::sense::{codes, key, Sense};
use crate::{LuConfig, Nexus, ResetKind, ScsiRequest, ScsiResponse, ScsiStatus};

/// Largest transfer one command may ask for, in bytes (VPD 0xB0).
pub(crate) const MAX_TRANSFER_BYTES: u64 = 16 << 20;
/// Largest WRITE ATOMIC, in bytes (VPD 0xB0).
const MAX_ATOMIC_BYTES: u64 = 1 << 20;
/// WRITE ATOMIC alignment and granularity, in bytes: whole 4 KiB pages.
const ATOMIC_UNIT_BYTES: u64 = 4096;
/// Largest COMPARE AND WRITE, in blocks (VPD 0xB0 byte 5).
const MAX_COMPARE_AND_WRITE: u32 = 255;
/// Largest UNMAP range per descriptor and descriptors per command (VPD 0xB0).
const MAX_UNMAP_BLOCKS: u64 = 1 << 20;
const MAX_UNMAP_DESCRIPTORS: usize = 256;
/// SANITIZE OVERWRITE runs at most this fast, so that it never starves
/// the other logical units sharing the storage.
const SANITIZE_OVERWRITE_BYTES_PER_SEC: u64 = 16 << 20;

/// A SANITIZE operation in progress (SBC-4 §4.11).
#[derive(Debug, Default)]
struct SanitizeState {
    running: AtomicBool,
    /// The last sanitize failed: medium access fails until EXIT FAILURE MODE.
    failed: AtomicBool,
    /// Fraction done, out of 65536.
    progress: std::sync::atomic::AtomicU32,
}

enum SanitizeJob {
    Overwrite { pattern: Vec<u8>, passes: u8, invert: bool },
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
                    st.progress.store(((off as u128 * 65535) / u128::from(total)) as u32, Ordering::Relaxed);
                }
            }
            SanitizeJob::Overwrite { pattern, passes, invert } => {
                let start = std::time::Instant::now();
                let mut written = 0u64;
                let work = total * u64::from(passes);
                for pass in 0..passes {
                    let flip = invert && pass % 2 == 1;
                    let buf: Vec<u8> = pattern.iter().map(|b| if flip { !b } else { *b }).cycle().take(chunk as usize).collect();
                    let mut off = 0;
                    while off < total {
                        let n = (total - off).min(chunk);
                        dev.write_at(off, &buf[..n as usize], false)?;
                        off += n;
                        written += n;
                        st.progress.store(((written as u128 * 65535) / u128::from(work)) as u32, Ordering::Relaxed);
                        let due = std::time::Duration::from_secs_f64(written as f64 / SANITIZE_OVERWRITE_BYTES_PER_SEC as f64);
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

/// Bytes of medium each range lock covers.
const STRIPE_BYTES: u64 = 1 << 20;
const STRIPES: usize = 64;

/// Range locks: every write holds the stripes it covers shared; COMPARE
/// AND WRITE and ORWRITE hold them exclusive, so their read-modify-write is
/// atomic against any other write to the range. Distinct ranges rarely
/// share a stripe, so ordinary I/O does not contend.
#[derive(Debug)]
struct RangeLocks {
    stripes: Vec<std::sync::RwLock<()>>,
}

enum StripeGuard<'a> {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] std::sync::RwLockWriteGuard<'a, ()>),
}

impl RangeLocks {
    fn new() -> Self {
        RangeLocks { stripes: (0..STRIPES).map(|_| std::sync::RwLock::new(())).collect() }
    }

    /// The stripes a byte range touches, in lock order (ascending, unique).
    fn stripes_of(off: u64, len: u64) -> Vec<usize> {
        let first = off / STRIPE_BYTES;
        let last = (off + len.max(1) - 1) / STRIPE_BYTES;
        let mut v: Vec<usize> = (first..=last.min(first + STRIPES as u64)).map(|s| (s % STRIPES as u64) as usize).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn lock(&self, off: u64, len: u64, exclusive: bool) -> Vec<StripeGuard<'_>> {
        Self::stripes_of(off, len)
            .into_iter()
            .map(|i| {
                let l = &self.stripes[i];
                if exclusive {
                    StripeGuard::Exclusive(l.write().unwrap_or_else(|e| e.into_inner()))
                } else {
                    StripeGuard::Shared(l.read().unwrap_or_else(|e| e.into_inner()))
                }
            })
            .collect()
    }
}

type CmdResult = Result<Reply, Sense>;

/// Data-In bytes of a command.
pub(crate) type ReplyData = Vec<u8>;

/// What a successful command returns.
#[derive(Debug, Default)]
struct Reply {
    data: Vec<u8>,
}

impl Reply {
    fn none() -> CmdResult {
        Ok(Reply::default())
    }
    fn data(mut data: Vec<u8>, alloc: usize) -> CmdResult {
        data.truncate(alloc);
        Ok(Reply { data })
    }
}

/// Mode page state (SPC-4 §7.5, SBC-3 §6.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ModeState {
    /// Caching page: write cache enable.
    wce: bool,
    /// Control page: descriptor-format sense.
    d_sense: bool,
    /// Control page: software write protect.
    swp: bool,
}

#[derive(Debug)]
struct LuState {
    ua: HashMap<Nexus, VecDeque<Sense>>,
    known: HashSet<Nexus>,
    mode: ModeState,
    default_mode: ModeState,
    medium_present: bool,
    prevent: HashSet<Nexus>,
}

/// A logical unit: SCSI emulation over a block device.
#[derive(Debug)]
pub struct LogicalUnit {
    dev: Arc<dyn BlockDevice>,
    cfg: LuConfig,
    state: Mutex<LuState>,
    ua_pending: AtomicBool,
    wce: AtomicBool,
    d_sense: AtomicBool,
    swp: AtomicBool,
    ejected: AtomicBool,
    ranges: RangeLocks,
    reservations: Mutex<Reservations>,
    /// Any reservation held: commands must be checked against it.
    reserved: AtomicBool,
    sanitize: Arc<SanitizeState>,
}


fn pad(s: &str, n: usize) -> Vec<u8> {
    let mut v: Vec<u8> = s.bytes().filter(|b| (0x20..0x7f).contains(b)).take(n).collect();
    v.resize(n, b' ');
    v
}

/// LBA, block count and flags byte of a READ/WRITE/VERIFY-family CDB.
fn rw_fields(cdb: &[u8]) -> (u64, u32, u8) {
    match cdb[0] {
        0x08 | 0x0a => {
            let lba = u64::from(cdb[1] & 0x1f) << 16 | u64::from(cdb[2]) << 8 | u64::from(cdb[3]);
            let n = if cdb[4] == 0 { 256 } else { u32::from(cdb[4]) };
            (lba, n, 0)
        }
        0x28 | 0x2a | 0x2e | 0x2f | 0x34 | 0x35 | 0x41 => (u64::from(be32(&cdb[2..6])), u32::from(be16(&cdb[7..9])), cdb[1]),
        0x89 => (be64(&cdb[2..10]), u32::from(cdb[13]), cdb[1]),
        0x9c => (be64(&cdb[2..10]), u32::from(be16(&cdb[12..14])), cdb[1]),
        0xa8 | 0xaa | 0xae | 0xaf => (u64::from(be32(&cdb[2..6])), be32(&cdb[6..10]), cdb[1]),
        _ => (be64(&cdb[2..10]), be32(&cdb[10..14]), cdb[1]),
    }
}

fn backend_sense(e: &BackendError, write: bool) -> Sense {
    match e {
        BackendError::Write { source, .. } if source.raw_os_error() == Some(28) => codes::SPACE_ALLOCATION_FAILED,
        _ if write => codes::WRITE_ERROR,
        _ => codes::READ_ERROR,
    }
}

impl LogicalUnit {
    /// Create a logical unit over `dev`.
    pub fn new(dev: Arc<dyn BlockDevice>, cfg: LuConfig) -> Self {
        let mode = ModeState { wce: cfg.write_cache, d_sense: false, swp: false };
        // Reservations saved with APTPL are in force from the start.
        let reservations = Reservations::with_state_file(cfg.pr_state_file.clone());
        LogicalUnit {
            state: Mutex::new(LuState {
                ua: HashMap::new(),
                known: HashSet::new(),
                mode,
                default_mode: mode,
                medium_present: true,
                prevent: HashSet::new(),
            }),
            ua_pending: AtomicBool::new(false),
            wce: AtomicBool::new(mode.wce),
            d_sense: AtomicBool::new(false),
            swp: AtomicBool::new(false),
            ejected: AtomicBool::new(false),
            ranges: RangeLocks::new(),
            reserved: AtomicBool::new(reservations.active()),
            sanitize: Arc::new(SanitizeState::default()),
            reservations: Mutex::new(reservations),
            dev,
            cfg,
        }
    }

    /// The backing device.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// The configuration.
    pub fn config(&self) -> &LuConfig {
        &self.cfg
    }

    fn lock(&self) -> MutexGuard<'_, LuState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bs(&self) -> u64 {
        u64::from(self.dev.block_size())
    }

    /// Render sense in the format D_SENSE selects.
    pub(crate) fn check(&self, s: Sense) -> ScsiResponse {
        ScsiResponse {
            status: ScsiStatus::CheckCondition,
            sense: s.to_bytes(self.d_sense.load(Ordering::Relaxed)),
            data_in: Vec::new(),
            data_out_len: None,
        }
    }

    // ---- unit attentions ----

    fn queue_ua(st: &mut LuState, flag: &AtomicBool, nexus: Nexus, s: Sense) {
        let q = st.ua.entry(nexus).or_default();
        if !q.contains(&s) && q.len() < 16 {
            q.push_back(s);
        }
        flag.store(true, Ordering::Release);
    }

    /// Queue a unit attention for every known nexus (optionally except one).
    fn ua_all(&self, s: Sense, except: Option<Nexus>) {
        let mut st = self.lock();
        let nexuses: Vec<Nexus> = st.known.iter().copied().filter(|n| Some(*n) != except).collect();
        for n in nexuses {
            Self::queue_ua(&mut st, &self.ua_pending, n, s);
        }
    }

    fn take_ua(&self, nexus: Nexus) -> Option<Sense> {
        if !self.ua_pending.load(Ordering::Acquire) {
            return None;
        }
        let mut st = self.lock();
        let s = st.ua.get_mut(&nexus).and_then(|q| q.pop_front());
        if st.ua.values().all(|q| q.is_empty()) {
            st.ua.retain(|_, q| !q.is_empty());
            self.ua_pending.store(false, Ordering::Release);
        }
        s
    }

    fn res(&self) -> MutexGuard<'_, Reservations> {
        self.reservations.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish_reserved(&self, r: &Reservations) {
        self.reserved.store(r.active(), Ordering::Release);
    }

    pub(crate) fn set_initiator_name(&self, nexus: Nexus, name: &str) {
        self.res().set_name(nexus, name);
    }

    /// A new I_T nexus: it starts with POWER ON, RESET, OR BUS DEVICE RESET OCCURRED.
    pub(crate) fn nexus_added(&self, nexus: Nexus) {
        let mut st = self.lock();
        if st.known.insert(nexus) {
            Self::queue_ua(&mut st, &self.ua_pending, nexus, codes::POWER_ON_RESET);
        }
    }

    /// An I_T nexus ended: its PREVENT state goes (SBC-3 §5.13) and a later
    /// login of the same nexus learns of the loss.
    pub(crate) fn nexus_lost(&self, nexus: Nexus) {
        let mut st = self.lock();
        st.prevent.remove(&nexus);
        Self::queue_ua(&mut st, &self.ua_pending, nexus, codes::NEXUS_LOSS);
        drop(st);
        let mut r = self.res();
        r.drop_legacy(Some(nexus));
        self.publish_reserved(&r);
    }

    /// A reset reached this unit.
    pub(crate) fn reset(&self, kind: ResetKind) {
        {
            let mut r = self.res();
            r.drop_legacy(None);
            self.publish_reserved(&r);
        }
        let mut st = self.lock();
        st.prevent.clear();
        if kind == ResetKind::TargetCold {
            st.mode = st.default_mode;
            self.publish_mode(st.mode);
        }
        let s = match kind {
            ResetKind::LogicalUnit => codes::LUN_RESET,
            ResetKind::TargetWarm => Sense::new(key::UNIT_ATTENTION, 0x29, 0x02),
            ResetKind::TargetCold => codes::POWER_ON_RESET,
        };
        let nexuses: Vec<Nexus> = st.known.iter().copied().collect();
        for n in nexuses {
            Self::queue_ua(&mut st, &self.ua_pending, n, s);
        }
    }

    /// Commands of `victim` were cleared by another initiator.
    pub(crate) fn tasks_cleared(&self, victim: Nexus) {
        let mut st = self.lock();
        Self::queue_ua(&mut st, &self.ua_pending, victim, codes::COMMANDS_CLEARED);
    }

    fn publish_mode(&self, m: ModeState) {
        self.wce.store(m.wce, Ordering::Relaxed);
        self.d_sense.store(m.d_sense, Ordering::Relaxed);
        self.swp.store(m.swp, Ordering::Relaxed);
    }

    // ---- dispatch ----

    /// Execute one command (blocking: may perform backend I/O).
    pub fn execute(&self, req: &ScsiRequest<'_>) -> ScsiResponse {
        let def = match self.precheck(req) {
            Ok(d) => d,
            Err(resp) => return resp,
        };
        self.dispatch(def, req)
    }

    /// The checks every command passes before it runs: known opcode and
    /// service action, no reserved bits, no pending unit attention, no
    /// reservation conflict, medium present.
    pub(crate) fn precheck(&self, req: &ScsiRequest<'_>) -> Result<&'static CommandDef, ScsiResponse> {
        let cdb = req.cdb;
        let Some(def) = commands::lookup(cdb) else {
            // A known opcode with an unknown service action is a bad field.
            if cdb.first().is_some_and(|op| commands::has_service_actions(*op)) {
                return Err(self.check(Sense::invalid_cdb_field(1, Some(4))));
            }
            return Err(self.check(codes::INVALID_OPCODE));
        };
        if cdb.len() < def.cdb_len {
            return Err(self.check(codes::INVALID_FIELD_IN_CDB));
        }
        if let Some((byte, bit)) = commands::reserved_bits(def, cdb) {
            return Err(self.check(Sense::invalid_cdb_field(byte, Some(bit))));
        }
        // SAM-5 §5.14: these report no unit attention.
        let ua_exempt = matches!(def.op, Op::Inquiry | Op::ReportLuns | Op::RequestSense);
        if !ua_exempt {
            if let Some(ua) = self.take_ua(req.nexus) {
                return Err(self.check(ua));
            }
        }
        if self.reserved.load(Ordering::Acquire) {
            if let Err(PrError::Conflict) = self.res().check(req.nexus, access(def.op)) {
                return Err(conflict());
            }
        }
        if self.sanitize.running.load(Ordering::Acquire)
            && !matches!(def.op, Op::Inquiry | Op::ReportLuns | Op::RequestSense | Op::ReportOpcodes | Op::ReportTmfs)
        {
            let p = self.sanitize.progress.load(Ordering::Relaxed) as u16;
            return Err(self.check(codes::SANITIZE_IN_PROGRESS.with_progress(p)));
        }
        let needs_medium = matches!(
            def.op,
            Op::TestUnitReady
                | Op::Read
                | Op::Write
                | Op::WriteVerify
                | Op::Verify
                | Op::ReadCapacity10
                | Op::ReadCapacity16
                | Op::PreFetch
                | Op::SyncCache
                | Op::WriteSame
                | Op::Unmap
                | Op::GetLbaStatus
                | Op::CompareAndWrite
                | Op::OrWrite
                | Op::WriteAtomic
        );
        if needs_medium && self.ejected.load(Ordering::Relaxed) {
            return Err(self.check(codes::MEDIUM_NOT_PRESENT));
        }
        if needs_medium && self.sanitize.failed.load(Ordering::Acquire) {
            return Err(self.check(codes::SANITIZE_FAILED));
        }
        Ok(def)
    }

    fn dispatch(&self, def: &'static CommandDef, req: &ScsiRequest<'_>) -> ScsiResponse {
        let cdb = req.cdb;
        let writes = matches!(def.op, Op::Write | Op::WriteVerify | Op::CompareAndWrite | Op::OrWrite | Op::WriteAtomic)
            || (def.op == Op::WriteSame && !(cdb[0] == 0x93 && cdb[1] & 0x01 != 0));
        let result = match def.op {
            Op::TestUnitReady => Reply::none(),
            Op::RequestSense => self.request_sense(req),
            Op::Read => self.read(cdb),
            Op::Write => self.write(cdb, req.data_out, false),
            Op::WriteAtomic => self.write_atomic(cdb, req.data_out),
            // The target's copy manager runs these (it sees every LUN).
            Op::ExtendedCopy | Op::ReceiveCopyResults => Err(codes::INVALID_OPCODE),
            Op::Sanitize => self.sanitize(cdb, req.data_out),
            Op::WriteVerify => self.write(cdb, req.data_out, true),
            Op::Verify => self.verify(cdb, req.data_out),
            Op::Inquiry => self.inquiry(cdb),
            Op::ModeSense6 | Op::ModeSense10 => self.mode_sense(cdb),
            Op::ModeSelect6 | Op::ModeSelect10 => self.mode_select(cdb, req.data_out, req.nexus),
            Op::StartStopUnit => self.start_stop(cdb, req.nexus),
            Op::PreventAllow => self.prevent_allow(cdb, req.nexus),
            Op::ReadCapacity10 => self.read_capacity10(cdb),
            Op::ReadCapacity16 => self.read_capacity16(cdb),
            Op::PreFetch => self.prefetch(cdb),
            Op::SyncCache => self.sync_cache(cdb),
            Op::ReportOpcodes => report_opcodes(cdb),
            Op::ReportTmfs => report_tmfs(cdb),
            Op::WriteSame => self.write_same(cdb, req.data_out),
            Op::Unmap => self.unmap(cdb, req.data_out),
            Op::GetLbaStatus => self.get_lba_status(cdb),
            Op::CompareAndWrite => self.compare_and_write(cdb, req.data_out),
            Op::OrWrite => self.or_write(cdb, req.data_out),
            Op::ReadDefectData => read_defect_data(cdb),
            Op::Reserve | Op::Release | Op::PrOut => {
                let mut r = self.res();
                let outcome = match def.op {
                    Op::Reserve => r.reserve_legacy(req.nexus).map(|_| Vec::new()),
                    Op::Release => r.release_legacy(req.nexus).map(|_| Vec::new()),
                    _ => {
                        let len = be32(&cdb[5..9]) as usize;
                        if req.data_out.len() < len {
                            Err(PrError::Sense(codes::PARAM_LIST_LENGTH))
                        } else {
                            r.pr_out(req.nexus, cdb[1] & 0x1f, cdb[2], &req.data_out[..len])
                        }
                    }
                };
                self.publish_reserved(&r);
                drop(r);
                match outcome {
                    Ok(notices) => {
                        let mut st = self.lock();
                        for (n, s) in notices {
                            Self::queue_ua(&mut st, &self.ua_pending, n, s);
                        }
                        Reply::none()
                    }
                    Err(PrError::Conflict) => return conflict(),
                    Err(PrError::Sense(s)) => Err(s),
                }
            }
            Op::PrIn => {
                let alloc = usize::from(be16(&cdb[7..9]));
                self.res().pr_in(cdb[1] & 0x1f).map(|d| Reply { data: d }).and_then(|r| Reply::data(r.data, alloc))
            }
            // Routed by the target; a unit asked directly lists only LUN 0.
            Op::ReportLuns => crate::target::report_luns(cdb, &[0]).map(|data| Reply { data }),
        };
        let data_out_len = if writes
            || (def.op == Op::Verify && cdb[1] & 0x06 != 0)
            || matches!(def.op, Op::ModeSelect6 | Op::ModeSelect10 | Op::Unmap | Op::PrOut)
        {
            Some(self.data_out_len(def, cdb))
        } else {
            None
        };
        match result {
            Ok(r) => ScsiResponse { status: ScsiStatus::Good, sense: Vec::new(), data_in: r.data, data_out_len },
            Err(s) => {
                let mut resp = self.check(s);
                resp.data_out_len = data_out_len;
                resp
            }
        }
    }

    /// Bytes of Data-Out the CDB asks for (SPDTL).
    fn data_out_len(&self, def: &CommandDef, cdb: &[u8]) -> usize {
        match def.op {
            Op::ModeSelect6 => usize::from(cdb[4]),
            Op::ModeSelect10 => usize::from(be16(&cdb[7..9])),
            Op::Verify if (cdb[1] >> 1) & 3 == 3 => self.bs() as usize,
            Op::WriteSame => self.bs() as usize,
            Op::CompareAndWrite => 2 * usize::from(cdb[13]) * self.bs() as usize,
            Op::Unmap => usize::from(be16(&cdb[7..9])),
            Op::PrOut => be32(&cdb[5..9]) as usize,
            _ => {
                let (_, n, _) = rw_fields(cdb);
                (u64::from(n) * self.bs()) as usize
            }
        }
    }

    /// Check an LBA range; returns the byte offset and length.
    fn range(&self, lba: u64, blocks: u32) -> Result<(u64, usize), Sense> {
        let cap = self.dev.num_blocks();
        match lba.checked_add(u64::from(blocks)) {
            Some(end) if end <= cap => {}
            _ => return Err(codes::LBA_OUT_OF_RANGE),
        }
        let bytes = u64::from(blocks) * self.bs();
        if bytes > MAX_TRANSFER_BYTES {
            return Err(codes::INVALID_FIELD_IN_CDB);
        }
        Ok((lba * self.bs(), bytes as usize))
    }

    fn write_protected(&self) -> Option<Sense> {
        if self.cfg.read_only {
            Some(codes::WRITE_PROTECTED)
        } else if self.swp.load(Ordering::Relaxed) {
            Some(codes::SOFTWARE_WRITE_PROTECTED)
        } else {
            None
        }
    }

    fn read(&self, cdb: &[u8]) -> CmdResult {
        let (lba, n, flags) = rw_fields(cdb);
        if flags & 0xe0 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(7)));
        }
        let (off, len) = self.range(lba, n)?;
        let mut data = vec![0u8; len];
        if len > 0 {
            self.dev.read_at(off, &mut data).map_err(|e| backend_sense(&e, false))?;
        }
        Ok(Reply { data })
    }

    fn write(&self, cdb: &[u8], data_out: &[u8], verify: bool) -> CmdResult {
        let (lba, n, flags) = rw_fields(cdb);
        if flags & 0xe0 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(7)));
        }
        if verify && (flags >> 1) & 3 == 2 {
            return Err(Sense::invalid_cdb_field(1, Some(2)));
        }
        let (off, len) = self.range(lba, n)?;
        if let Some(s) = self.write_protected() {
            return Err(s);
        }
        // Only what arrived is written (FCP-4 / iSCSI residual rules): whole
        // blocks up to the Data-Out the initiator sent.
        let bs = self.bs() as usize;
        let have = data_out.len().min(len) / bs * bs;
        if have > 0 {
            let fua = verify || flags & 0x08 != 0 || !self.wce.load(Ordering::Relaxed);
            let _held = self.ranges.lock(off, have as u64, false);
            self.dev.write_at(off, &data_out[..have], fua).map_err(|e| backend_sense(&e, true))?;
        }
        Reply::none()
    }

    /// SANITIZE: overwrite, block erase or cryptographic erase of the whole
    /// medium (erases deallocate on thin units, else write zeros), or exit
    /// failure mode. IMMED returns at once; the unit is NOT READY / SANITIZE
    /// IN PROGRESS until it finishes.
    fn sanitize(&self, cdb: &[u8], data: &[u8]) -> CmdResult {
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
                if passes == 0 || pattern_len == 0 || pattern_len > self.bs() as usize || len != pattern_len + 4 {
                    return Err(Sense::invalid_cdb_field(7, None));
                }
                SanitizeJob::Overwrite { pattern: data[4..4 + pattern_len].to_vec(), passes, invert: data[0] & 0x80 != 0 }
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

    /// Blocks per WRITE ATOMIC alignment/granularity unit.
    fn atomic_unit_blocks(&self) -> u64 {
        (ATOMIC_UNIT_BYTES / self.bs()).max(1)
    }

    /// WRITE ATOMIC(16): all or nothing with respect to every other
    /// command: the range is held exclusively while it is written, in whole
    /// page-aligned 4 KiB units.
    fn write_atomic(&self, cdb: &[u8], data: &[u8]) -> CmdResult {
        let (lba, n, flags) = rw_fields(cdb);
        if flags & 0xe0 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(7)));
        }
        let (off, len) = self.range(lba, n)?;
        if len == 0 {
            return Reply::none();
        }
        let unit = self.atomic_unit_blocks();
        if lba % unit != 0 {
            return Err(Sense::invalid_cdb_field(2, None));
        }
        if u64::from(n) % unit != 0 || len as u64 > MAX_ATOMIC_BYTES {
            return Err(Sense::invalid_cdb_field(12, None));
        }
        if let Some(s) = self.write_protected() {
            return Err(s);
        }
        if data.len() < len {
            return Err(codes::INVALID_FIELD_IN_CDB);
        }
        let _held = self.ranges.lock(off, len as u64, true);
        self.dev.write_at(off, &data[..len], self.fua(flags)).map_err(|e| backend_sense(&e, true))?;
        Reply::none()
    }

    /// Whether VPD page 0x83 carries this logical-unit designator.
    pub(crate) fn has_designator(&self, code_set: u8, kind: u8, body: &[u8]) -> bool {
        let page = self.device_identification();
        let mut at = 0;
        while at + 4 <= page.len() {
            let len = usize::from(page[at + 3]);
            let assoc = (page[at + 1] >> 4) & 3;
            if assoc == 0 && page[at] & 0x0f == code_set && page[at + 1] & 0x0f == kind && page.get(at + 4..at + 4 + len) == Some(body) {
                return true;
            }
            at += 4 + len;
        }
        false
    }

    /// A write on behalf of the copy manager, under the same rules as a
    /// WRITE from an initiator.
    pub(crate) fn copy_write(&self, off: u64, data: &[u8]) -> Result<(), Sense> {
        if let Some(s) = self.write_protected() {
            return Err(s);
        }
        let _held = self.ranges.lock(off, data.len() as u64, false);
        self.dev.write_at(off, data, !self.wce.load(Ordering::Relaxed)).map_err(|e| backend_sense(&e, true))
    }

    /// Largest WRITE SAME, in blocks (VPD 0xB0): one maximum transfer.
    fn max_write_same_blocks(&self) -> u64 {
        MAX_TRANSFER_BYTES / self.bs()
    }

    fn fua(&self, flags: u8) -> bool {
        flags & 0x08 != 0 || !self.wce.load(Ordering::Relaxed)
    }

    /// WRITE SAME (10/16): one block (or zeros with NDOB) over a range; with
    /// UNMAP on a thin LUN, zero blocks are deallocated instead.
    fn write_same(&self, cdb: &[u8], data_out: &[u8]) -> CmdResult {
        let (lba, n, flags) = rw_fields(cdb);
        if flags & 0xe0 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(7)));
        }
        if flags & 0x10 != 0 {
            // ANCHOR: anchored blocks are not supported (ANC_SUP = 0).
            return Err(Sense::invalid_cdb_field(1, Some(4)));
        }
        let ndob = cdb[0] == 0x93 && flags & 0x01 != 0;
        let unmap = flags & 0x08 != 0;
        let cap = self.dev.num_blocks();
        if lba > cap {
            return Err(codes::LBA_OUT_OF_RANGE);
        }
        // WSNZ = 0: a zero count means "to the end of the medium".
        let n = if n == 0 { cap - lba } else { u64::from(n) };
        match lba.checked_add(n) {
            Some(end) if end <= cap => {}
            _ => return Err(codes::LBA_OUT_OF_RANGE),
        }
        if n > self.max_write_same_blocks() {
            return Err(Sense::invalid_cdb_field(if cdb[0] == 0x41 { 7 } else { 10 }, None));
        }
        if n == 0 {
            return Reply::none();
        }
        if let Some(s) = self.write_protected() {
            return Err(s);
        }
        let bs = self.bs() as usize;
        let block: Vec<u8> = if ndob {
            vec![0u8; bs]
        } else {
            // Exactly one logical block of Data-Out.
            if data_out.len() < bs {
                return Err(codes::PARAM_LIST_LENGTH);
            }
            if data_out.len() > bs {
                return Err(Sense::invalid_cdb_field(if cdb[0] == 0x41 { 7 } else { 10 }, None));
            }
            data_out.to_vec()
        };
        let off = lba * bs as u64;
        let len = n * bs as u64;
        let _held = self.ranges.lock(off, len, false);
        // With UNMAP on a thin LUN the range is deallocated and reads back
        // as zeros (LBPRZ), whatever the data block held.
        if unmap && self.dev.thin_provisioned() {
            self.dev.unmap(off, len).map_err(|e| backend_sense(&e, true))?;
            if self.fua(flags) {
                self.dev.flush().map_err(|e| backend_sense(&e, true))?;
            }
            return Reply::none();
        }
        // Write in chunks of up to 1 MiB of repeated blocks.
        let per_chunk = ((1usize << 20) / bs).max(1);
        let chunk: Vec<u8> = block.iter().copied().cycle().take(per_chunk * bs).collect();
        let mut done = 0u64;
        let fua = self.fua(flags);
        while done < n {
            let k = (n - done).min(per_chunk as u64) as usize;
            self.dev.write_at(off + done * bs as u64, &chunk[..k * bs], fua).map_err(|e| backend_sense(&e, true))?;
            done += k as u64;
        }
        Reply::none()
    }

    /// UNMAP: deallocate each block descriptor's range.
    fn unmap(&self, cdb: &[u8], data: &[u8]) -> CmdResult {
        if !self.dev.thin_provisioned() {
            return Err(codes::INVALID_OPCODE);
        }
        if cdb[1] & 0x01 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(0)));
        }
        let len = usize::from(be16(&cdb[7..9]));
        if len == 0 {
            return Reply::none();
        }
        if len < 8 || data.len() < len {
            return Err(codes::PARAM_LIST_LENGTH);
        }
        if let Some(s) = self.write_protected() {
            return Err(s);
        }
        let data = &data[..len];
        let desc_len = usize::from(be16(&data[2..4])).min(len - 8);
        let descs = &data[8..8 + desc_len / 16 * 16];
        if descs.len() / 16 > MAX_UNMAP_DESCRIPTORS {
            return Err(Sense::invalid_param_field(2));
        }
        let cap = self.dev.num_blocks();
        let mut ranges = Vec::new();
        for (i, d) in descs.chunks_exact(16).enumerate() {
            let lba = be64(&d[0..8]);
            let n = u64::from(be32(&d[8..12]));
            match lba.checked_add(n) {
                Some(end) if end <= cap => {}
                _ => return Err(codes::LBA_OUT_OF_RANGE),
            }
            if n > MAX_UNMAP_BLOCKS {
                return Err(Sense::invalid_param_field((8 + i * 16 + 8) as u16));
            }
            if n > 0 {
                ranges.push((lba * self.bs(), n * self.bs()));
            }
        }
        for (off, len) in ranges {
            let _held = self.ranges.lock(off, len, false);
            self.dev.unmap(off, len).map_err(|e| backend_sense(&e, true))?;
        }
        Reply::none()
    }

    /// GET LBA STATUS: mapped / deallocated extents from the backend.
    fn get_lba_status(&self, cdb: &[u8]) -> CmdResult {
        let lba = be64(&cdb[2..10]);
        let alloc = be32(&cdb[10..14]) as usize;
        let cap = self.dev.num_blocks();
        if lba >= cap {
            return Err(codes::LBA_OUT_OF_RANGE);
        }
        let bs = self.bs();
        let mut descs = Vec::new();
        let mut at = lba;
        let max_descs = alloc.saturating_sub(8) / 16;
        while at < cap && descs.len() / 16 < max_descs.max(1) {
            let left = (cap - at).min(u64::from(u32::MAX)) * bs;
            let (mapped, bytes) = self.dev.lba_status(at * bs, left).map_err(|e| backend_sense(&e, false))?;
            let blocks = (bytes / bs).max(1).min(cap - at);
            descs.extend_from_slice(&at.to_be_bytes());
            descs.extend_from_slice(&(blocks as u32).to_be_bytes());
            descs.push(if mapped { 0 } else { 1 });
            descs.extend_from_slice(&[0, 0, 0]);
            at += blocks;
        }
        let mut out = Vec::with_capacity(8 + descs.len());
        out.extend_from_slice(&((descs.len() + 4) as u32).to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend(descs);
        Reply::data(out, alloc)
    }

    /// COMPARE AND WRITE: compare the first half of the Data-Out with the
    /// medium and, only if equal, write the second half — atomically.
    fn compare_and_write(&self, cdb: &[u8], data: &[u8]) -> CmdResult {
        let (lba, n, flags) = rw_fields(cdb);
        if flags & 0xe0 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(7)));
        }
        if n > MAX_COMPARE_AND_WRITE {
            return Err(Sense::invalid_cdb_field(13, None));
        }
        let (off, len) = self.range(lba, n)?;
        if n == 0 && data.is_empty() {
            return Reply::none();
        }
        if let Some(s) = self.write_protected() {
            return Err(s);
        }
        // The Data-Out must be exactly the verify and write data (SBC-4 §5.3).
        if data.len() != 2 * len {
            return Err(Sense::invalid_cdb_field(13, None));
        }
        let (verify, write) = (&data[..len], &data[len..2 * len]);
        let _held = self.ranges.lock(off, len as u64, true);
        let mut medium = vec![0u8; len];
        self.dev.read_at(off, &mut medium).map_err(|e| backend_sense(&e, false))?;
        if let Some(at) = medium.iter().zip(verify).position(|(a, b)| a != b) {
            return Err(Sense::new(key::MISCOMPARE, 0x1d, 0x00).with_info(at as u64));
        }
        self.dev.write_at(off, write, self.fua(flags)).map_err(|e| backend_sense(&e, true))?;
        Reply::none()
    }

    /// ORWRITE(16): OR the Data-Out into the medium, atomically.
    fn or_write(&self, cdb: &[u8], data: &[u8]) -> CmdResult {
        let (lba, n, flags) = rw_fields(cdb);
        if flags & 0xe0 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(7)));
        }
        let (off, len) = self.range(lba, n)?;
        if len == 0 {
            return Reply::none();
        }
        if let Some(s) = self.write_protected() {
            return Err(s);
        }
        if data.len() < len {
            return Err(codes::INVALID_FIELD_IN_CDB);
        }
        let _held = self.ranges.lock(off, len as u64, true);
        let mut medium = vec![0u8; len];
        self.dev.read_at(off, &mut medium).map_err(|e| backend_sense(&e, false))?;
        for (m, d) in medium.iter_mut().zip(data) {
            *m |= d;
        }
        self.dev.write_at(off, &medium, self.fua(flags)).map_err(|e| backend_sense(&e, true))?;
        Reply::none()
    }

    fn verify(&self, cdb: &[u8], data_out: &[u8]) -> CmdResult {
        let (lba, n, flags) = rw_fields(cdb);
        if flags & 0xe0 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(7)));
        }
        let bytchk = (flags >> 1) & 3;
        if bytchk == 2 {
            return Err(Sense::invalid_cdb_field(1, Some(2)));
        }
        let (off, len) = self.range(lba, n)?;
        if len == 0 {
            return Reply::none();
        }
        let mut medium = vec![0u8; len];
        self.dev.read_at(off, &mut medium).map_err(|e| backend_sense(&e, false))?;
        let bs = self.bs() as usize;
        let first_diff = match bytchk {
            0 => None,
            1 => {
                if data_out.len() < len {
                    return Err(codes::INVALID_FIELD_IN_CDB);
                }
                medium.iter().zip(data_out).position(|(a, b)| a != b)
            }
            _ => {
                if data_out.len() < bs {
                    return Err(codes::INVALID_FIELD_IN_CDB);
                }
                medium.chunks(bs).enumerate().find_map(|(i, blk)| {
                    blk.iter().zip(&data_out[..bs]).position(|(a, b)| a != b).map(|p| i * bs + p)
                })
            }
        };
        match first_diff {
            Some(at) => Err(codes::MISCOMPARE_VERIFY.with_info(at as u64)),
            None => Reply::none(),
        }
    }

    fn prefetch(&self, cdb: &[u8]) -> CmdResult {
        let (lba, n, _) = rw_fields(cdb);
        let cap = self.dev.num_blocks();
        match lba.checked_add(u64::from(n)) {
            Some(end) if end <= cap => {}
            _ => return Err(codes::LBA_OUT_OF_RANGE),
        }
        let bs = self.bs();
        let len = if n == 0 { (cap - lba) * bs } else { u64::from(n) * bs };
        let _ = self.dev.prefetch(lba * bs, len);
        Reply::none()
    }

    fn sync_cache(&self, cdb: &[u8]) -> CmdResult {
        let (lba, n, _) = rw_fields(cdb);
        match lba.checked_add(u64::from(n)) {
            Some(end) if end <= self.dev.num_blocks() => {}
            _ => return Err(codes::LBA_OUT_OF_RANGE),
        }
        self.dev.flush().map_err(|e| backend_sense(&e, true))?;
        Reply::none()
    }

    fn read_capacity10(&self, cdb: &[u8]) -> CmdResult {
        if cdb[8] & 1 == 0 && be32(&cdb[2..6]) != 0 {
            return Err(Sense::invalid_cdb_field(2, None));
        }
        let last = self.dev.num_blocks() - 1;
        let mut d = Vec::with_capacity(8);
        d.extend_from_slice(&(last.min(0xffff_ffff) as u32).to_be_bytes());
        d.extend_from_slice(&self.dev.block_size().to_be_bytes());
        Reply::data(d, 8)
    }

    fn read_capacity16(&self, cdb: &[u8]) -> CmdResult {
        if cdb[14] & 1 == 0 && be64(&cdb[2..10]) != 0 {
            return Err(Sense::invalid_cdb_field(2, None));
        }
        let alloc = be32(&cdb[10..14]) as usize;
        let mut d = vec![0u8; 32];
        d[0..8].copy_from_slice(&(self.dev.num_blocks() - 1).to_be_bytes());
        d[8..12].copy_from_slice(&self.dev.block_size().to_be_bytes());
        // One logical block per physical block (exponent 0): every block
        // size we export is written whole, without read-modify-write.
        if self.dev.thin_provisioned() {
            d[14] = 0xc0; // LBPME, LBPRZ
        }
        Reply::data(d, alloc)
    }

    fn request_sense(&self, req: &ScsiRequest<'_>) -> CmdResult {
        let desc = req.cdb[1] & 1 != 0;
        let alloc = usize::from(req.cdb[4]);
        let idle = if self.sanitize.running.load(Ordering::Acquire) {
            codes::SANITIZE_IN_PROGRESS.with_progress(self.sanitize.progress.load(Ordering::Relaxed) as u16)
        } else {
            Sense::new(key::NO_SENSE, 0, 0)
        };
        let s = self.take_ua(req.nexus).unwrap_or(idle);
        let s = if self.ejected.load(Ordering::Relaxed) && s.key == key::NO_SENSE { codes::MEDIUM_NOT_PRESENT } else { s };
        Reply::data(s.to_bytes(desc), alloc)
    }

    // ---- INQUIRY ----

    fn inquiry(&self, cdb: &[u8]) -> CmdResult {
        let alloc = usize::from(be16(&cdb[3..5]));
        let evpd = cdb[1] & 1 != 0;
        if !evpd {
            if cdb[2] != 0 {
                return Err(Sense::invalid_cdb_field(2, None));
            }
            return Reply::data(self.standard_inquiry(), alloc);
        }
        let page = match cdb[2] {
            0x00 => {
                let pages = [0x00, 0x80, 0x83, 0x8f, 0xb0, 0xb1, 0xb2];
                vpd(0x00, &pages)
            }
            0x80 => vpd(0x80, &pad(&self.cfg.serial, self.cfg.serial.len().clamp(1, 252))),
            0x83 => vpd(0x83, &self.device_identification()),
            0x8f => vpd(0x8f, &third_party_copy_page()),
            0xb0 => vpd(0xb0, &self.block_limits()),
            0xb1 => {
                let mut p = vec![0u8; 0x3c];
                p[1] = 1; // medium rotation rate: non-rotating medium
                // WABEREQ = WACEREQ = 01b: reads after a block or crypto
                // erase succeed (and return zeros).
                p[3] = 0x50;
                vpd(0xb1, &p)
            }
            0xb2 => {
                // LBPU, LBPWS, LBPWS10 and LBPRZ on thin LUNs; provisioning type 2 (thin).
                let thin = self.dev.thin_provisioned();
                vpd(0xb2, &[0, if thin { 0xe4 } else { 0 }, if thin { 2 } else { 0 }, 0])
            }
            _ => return Err(Sense::invalid_cdb_field(2, None)),
        };
        Reply::data(page, alloc)
    }

    fn standard_inquiry(&self) -> Vec<u8> {
        let mut d = vec![0u8; 96];
        d[0] = 0x00; // connected, direct-access block device
        d[1] = if self.cfg.removable { 0x80 } else { 0 };
        d[2] = 0x06; // SPC-4
        d[3] = 0x12; // HiSup, response data format 2
        d[4] = (d.len() - 5) as u8;
        d[5] = 0x08; // 3PC: third-party copy (EXTENDED COPY)
        d[7] = 0x02; // CmdQue
        d[8..16].copy_from_slice(&pad(&self.cfg.vendor, 8));
        d[16..32].copy_from_slice(&pad(&self.cfg.product, 16));
        d[32..36].copy_from_slice(&pad(&self.cfg.revision, 4));
        // Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
        for (i, v) in [0x00a0u16, 0x0960, 0x0460, 0x04c0].iter().enumerate() {
            d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
        }
        d
    }

    fn device_identification(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut desig = |proto_codeset: u8, piv_assoc_type: u8, body: &[u8]| {
            out.extend_from_slice(&[proto_codeset, piv_assoc_type, 0, body.len() as u8]);
            out.extend_from_slice(body);
        };
        // NAA IEEE Registered Extended, logical unit.
        desig(0x01, 0x03, &self.cfg.naa);
        // T10 vendor ID: vendor + serial, logical unit.
        let mut t10 = pad(&self.cfg.vendor, 8);
        t10.extend(self.cfg.serial.bytes().take(64));
        desig(0x02, 0x01, &t10);
        // Relative target port 1 and target port group 1 (iSCSI, PIV).
        desig(0x51, 0x94, &[0, 0, 0, 1]);
        desig(0x51, 0x95, &[0, 0, 0, 1]);
        // SCSI name string of the target device (UTF-8, NUL-padded to 4).
        let mut name = self.cfg.target_name.clone().into_bytes();
        name.truncate(251);
        name.push(0);
        while name.len() % 4 != 0 {
            name.push(0);
        }
        desig(0x53, 0xa8, &name);
        out
    }

    fn block_limits(&self) -> Vec<u8> {
        let mut p = vec![0u8; 0x3c];
        let bs = self.bs();
        let max_blocks = (MAX_TRANSFER_BYTES / bs) as u32;
        p[1] = MAX_COMPARE_AND_WRITE as u8;
        if self.dev.thin_provisioned() {
            p[16..20].copy_from_slice(&(MAX_UNMAP_BLOCKS as u32).to_be_bytes());
            p[20..24].copy_from_slice(&(MAX_UNMAP_DESCRIPTORS as u32).to_be_bytes());
            p[24..28].copy_from_slice(&(((4096 / bs).max(1)) as u32).to_be_bytes()); // optimal unmap granularity
        }
        p[32..40].copy_from_slice(&self.max_write_same_blocks().to_be_bytes());
        // WRITE ATOMIC: maximum atomic transfer length, alignment and
        // granularity (one 4 KiB page).
        let atomic_blocks = (MAX_ATOMIC_BYTES / bs).max(1) as u32;
        p[40..44].copy_from_slice(&atomic_blocks.to_be_bytes());
        p[44..48].copy_from_slice(&(self.atomic_unit_blocks() as u32).to_be_bytes());
        p[48..52].copy_from_slice(&(self.atomic_unit_blocks() as u32).to_be_bytes());
        let granularity: u16 = if bs >= 4096 { 1 } else { 8 };
        p[2..4].copy_from_slice(&granularity.to_be_bytes()); // optimal transfer length granularity
        p[4..8].copy_from_slice(&max_blocks.to_be_bytes()); // maximum transfer length
        p[8..12].copy_from_slice(&(((1u64 << 20) / bs) as u32).to_be_bytes()); // optimal transfer length
        p[12..16].copy_from_slice(&max_blocks.to_be_bytes()); // maximum prefetch length
        p
    }

    // ---- mode pages ----

    /// One mode page, current / changeable / default.
    fn mode_page(&self, code: u8, pc: u8, m: &ModeState) -> Option<Vec<u8>> {
        let changeable = pc == 1;
        match code {
            0x08 => {
                let mut p = vec![0u8; 20];
                p[0] = 0x08;
                p[1] = 0x12;
                if changeable {
                    p[2] = 0x04;
                } else if m.wce {
                    p[2] = 0x04;
                }
                Some(p)
            }
            0x0a => {
                let mut p = vec![0u8; 12];
                p[0] = 0x0a;
                p[1] = 0x0a;
                if changeable {
                    p[2] = 0x04; // D_SENSE
                    p[4] = 0x08; // SWP
                } else {
                    p[2] = if m.d_sense { 0x04 } else { 0 };
                    p[3] = 0x10; // QAM 1: unrestricted reordering allowed, QERR 0
                    p[4] = if m.swp { 0x08 } else { 0 };
                    p[8] = 0xff; // busy timeout: unlimited
                    p[9] = 0xff;
                }
                Some(p)
            }
            0x1c => {
                let mut p = vec![0u8; 12];
                p[0] = 0x1c;
                p[1] = 0x0a;
                Some(p)
            }
            _ => None,
        }
    }

    fn mode_sense(&self, cdb: &[u8]) -> CmdResult {
        let ten = cdb[0] == 0x5a;
        let dbd = cdb[1] & 0x08 != 0;
        let llbaa = ten && cdb[1] & 0x10 != 0;
        let pc = cdb[2] >> 6;
        let code = cdb[2] & 0x3f;
        let sub = cdb[3];
        let alloc = if ten { usize::from(be16(&cdb[7..9])) } else { usize::from(cdb[4]) };
        if pc == 3 {
            return Err(codes::SAVING_NOT_SUPPORTED);
        }
        let m = {
            let st = self.lock();
            if pc == 2 {
                st.default_mode
            } else {
                st.mode
            }
        };
        let mut pages = Vec::new();
        if code == 0x3f {
            if sub != 0 && sub != 0xff {
                return Err(Sense::invalid_cdb_field(3, None));
            }
            for c in [0x08, 0x0a, 0x1c] {
                pages.extend(self.mode_page(c, pc, &m).unwrap_or_default());
            }
        } else {
            if sub != 0 {
                return Err(Sense::invalid_cdb_field(3, None));
            }
            pages = self.mode_page(code, pc, &m).ok_or(Sense::invalid_cdb_field(2, Some(5)))?;
        }
        let wp = self.cfg.read_only || m.swp;
        let dev_specific = (if wp { 0x80 } else { 0 }) | 0x10; // WP, DPOFUA
        let blocks = self.dev.num_blocks();
        let bd: Vec<u8> = if dbd {
            Vec::new()
        } else if llbaa {
            let mut b = vec![0u8; 16];
            b[0..8].copy_from_slice(&blocks.to_be_bytes());
            b[12..16].copy_from_slice(&self.dev.block_size().to_be_bytes());
            b
        } else {
            let mut b = vec![0u8; 8];
            b[0..4].copy_from_slice(&(blocks.min(0xffff_ffff) as u32).to_be_bytes());
            b[5..8].copy_from_slice(&self.dev.block_size().to_be_bytes()[1..4]);
            b
        };
        let mut out = Vec::new();
        if ten {
            let len = (6 + bd.len() + pages.len()) as u16;
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&[0, dev_specific, if llbaa && !dbd { 1 } else { 0 }, 0]);
            out.extend_from_slice(&(bd.len() as u16).to_be_bytes());
        } else {
            let len = (3 + bd.len() + pages.len()).min(255) as u8;
            out.extend_from_slice(&[len, 0, dev_specific, bd.len() as u8]);
        }
        out.extend(bd);
        out.extend(pages);
        Reply::data(out, alloc)
    }

    fn mode_select(&self, cdb: &[u8], data: &[u8], nexus: Nexus) -> CmdResult {
        let ten = cdb[0] == 0x55;
        let len = if ten { usize::from(be16(&cdb[7..9])) } else { usize::from(cdb[4]) };
        if cdb[1] & 0x01 != 0 {
            // SP: we cannot save parameters.
            return Err(Sense::invalid_cdb_field(1, Some(0)));
        }
        if len == 0 {
            return Reply::none();
        }
        if cdb[1] & 0x10 == 0 {
            return Err(Sense::invalid_cdb_field(1, Some(4)));
        }
        if data.len() < len {
            return Err(codes::PARAM_LIST_LENGTH);
        }
        let data = &data[..len];
        let hdr = if ten { 8 } else { 4 };
        if data.len() < hdr {
            return Err(codes::PARAM_LIST_LENGTH);
        }
        let bd_len = if ten { usize::from(be16(&data[6..8])) } else { usize::from(data[3]) };
        let mut at = hdr + bd_len;
        if at > data.len() {
            return Err(codes::PARAM_LIST_LENGTH);
        }
        let mut st = self.lock();
        let mut m = st.mode;
        while at < data.len() {
            if at + 2 > data.len() {
                return Err(codes::PARAM_LIST_LENGTH);
            }
            let code = data[at] & 0x3f;
            if data[at] & 0x40 != 0 {
                return Err(Sense::invalid_param_field(at as u16)); // subpages: none changeable
            }
            let plen = usize::from(data[at + 1]) + 2;
            if at + plen > data.len() {
                return Err(codes::PARAM_LIST_LENGTH);
            }
            let given = &data[at..at + plen];
            let current = self.mode_page(code, 0, &m).ok_or(Sense::invalid_param_field(at as u16))?;
            let mask = self.mode_page(code, 1, &m).expect("page exists");
            if given.len() != current.len() {
                return Err(Sense::invalid_param_field((at + 1) as u16));
            }
            for i in 2..given.len() {
                if (given[i] ^ current[i]) & !mask[i] != 0 {
                    return Err(Sense::invalid_param_field((at + i) as u16));
                }
            }
            match code {
                0x08 => m.wce = given[2] & 0x04 != 0,
                0x0a => {
                    m.d_sense = given[2] & 0x04 != 0;
                    m.swp = given[4] & 0x08 != 0;
                }
                _ => {}
            }
            at += plen;
        }
        if m != st.mode {
            let was_wce = st.mode.wce;
            st.mode = m;
            self.publish_mode(m);
            let others: Vec<Nexus> = st.known.iter().copied().filter(|n| *n != nexus).collect();
            for n in others {
                Self::queue_ua(&mut st, &self.ua_pending, n, codes::MODE_PARAMETERS_CHANGED);
            }
            drop(st);
            if was_wce && !m.wce {
                // Turning the cache off: what was cached must be durable now.
                self.dev.flush().map_err(|e| backend_sense(&e, true))?;
            }
        }
        Reply::none()
    }

    // ---- medium ----

    fn start_stop(&self, cdb: &[u8], _nexus: Nexus) -> CmdResult {
        let power_condition = cdb[4] >> 4;
        let loej = cdb[4] & 0x02 != 0;
        let start = cdb[4] & 0x01 != 0;
        if power_condition != 0 || !loej {
            // Power conditions and plain start/stop do not move the medium.
            return Reply::none();
        }
        if !self.cfg.removable {
            return Err(Sense::invalid_cdb_field(4, Some(1)));
        }
        let st = self.lock();
        // While any nexus prevents removal the medium neither leaves nor
        // (re)loads.
        if !st.prevent.is_empty() {
            return Err(codes::REMOVAL_PREVENTED);
        }
        drop(st);
        if !start {
            let _ = self.dev.flush();
        }
        self.ejected.store(!start, Ordering::Relaxed);
        self.lock().medium_present = start;
        Reply::none()
    }

    fn prevent_allow(&self, cdb: &[u8], nexus: Nexus) -> CmdResult {
        let prevent = cdb[4] & 0x03;
        if prevent > 1 {
            return Err(Sense::invalid_cdb_field(4, Some(1)));
        }
        let mut st = self.lock();
        if prevent == 1 {
            st.prevent.insert(nexus);
        } else {
            st.prevent.remove(&nexus);
        }
        Reply::none()
    }

    /// Queue a unit attention for all other nexuses.
    pub fn unit_attention_others(&self, s: Sense, except: Nexus) {
        self.ua_all(s, Some(except));
    }
}

/// How a command touches the medium, for reservation checks.
fn access(op: Op) -> Access {
    match op {
        Op::Read | Op::Verify | Op::PreFetch | Op::GetLbaStatus | Op::ModeSense6 | Op::ModeSense10 | Op::ReadDefectData => {
            Access::Read
        }
        Op::Write
        | Op::WriteVerify
        | Op::WriteSame
        | Op::Unmap
        | Op::CompareAndWrite
        | Op::OrWrite
        | Op::SyncCache
        | Op::ModeSelect6
        | Op::ModeSelect10
        | Op::StartStopUnit
        | Op::ExtendedCopy
        | Op::Sanitize => Access::Write,
        _ => Access::Free,
    }
}

fn conflict() -> ScsiResponse {
    ScsiResponse { status: ScsiStatus::ReservationConflict, sense: Vec::new(), data_in: Vec::new(), data_out_len: None }
}

fn vpd(code: u8, body: &[u8]) -> Vec<u8> {
    let mut p = vec![0x00, code];
    p.extend_from_slice(&(body.len() as u16).to_be_bytes());
    p.extend_from_slice(body);
    p
}

/// VPD page 0x8F body: a Supported Commands descriptor listing the
/// third-party copy commands and their service actions.
fn third_party_copy_page() -> Vec<u8> {
    let list: &[u8] = &[0x83, 1, 0x00, 0x84, 2, 0x00, 0x03];
    let mut desc = vec![list.len() as u8];
    desc.extend_from_slice(list);
    while (desc.len() + 4) % 4 != 0 {
        desc.push(0);
    }
    let mut out = vec![0x00, 0x00];
    out.extend_from_slice(&(desc.len() as u16).to_be_bytes());
    out.extend(desc);
    out
}

/// Nominal and recommended command timeouts (seconds) for RCTD.
const TIMEOUTS: [u8; 12] = [0x00, 0x0a, 0, 0, 0, 0, 0, 30, 0, 0, 0, 60];

fn report_opcodes(cdb: &[u8]) -> CmdResult {
    let rctd = cdb[2] & 0x80 != 0;
    let options = cdb[2] & 0x07;
    let req_op = cdb[3];
    let req_sa = be16(&cdb[4..6]);
    let alloc = be32(&cdb[6..10]) as usize;
    let mut out = Vec::new();
    match options {
        0 => {
            let mut descs = Vec::new();
            for d in COMMANDS {
                descs.push(d.opcode);
                descs.push(0);
                descs.extend_from_slice(&u16::from(d.service_action.unwrap_or(0)).to_be_bytes());
                descs.push(0);
                descs.push((if rctd { 0x02 } else { 0 }) | u8::from(d.service_action.is_some()));
                descs.extend_from_slice(&(d.cdb_len as u16).to_be_bytes());
                if rctd {
                    descs.extend_from_slice(&TIMEOUTS);
                }
            }
            out.extend_from_slice(&(descs.len() as u32).to_be_bytes());
            out.extend(descs);
        }
        1 | 2 => {
            let has_sa = commands::has_service_actions(req_op);
            if options == 1 && has_sa {
                return Err(Sense::invalid_cdb_field(2, Some(2)));
            }
            if options == 2 && !has_sa && commands::find(req_op, None).is_some() {
                return Err(Sense::invalid_cdb_field(2, Some(2)));
            }
            let action = if options == 2 { Some(req_sa as u8).filter(|_| req_sa < 0x20) } else { None };
            let found = if options == 2 && req_sa >= 0x20 { None } else { commands::find(req_op, action) };
            match found {
                Some(d) => {
                    out.push(0);
                    out.push((if rctd { 0x80 } else { 0 }) | 0x03);
                    out.extend_from_slice(&(d.cdb_len as u16).to_be_bytes());
                    out.extend_from_slice(d.usage);
                    if rctd {
                        out.extend_from_slice(&TIMEOUTS);
                    }
                }
                None => out.extend_from_slice(&[0, 0x01, 0, 0]),
            }
        }
        _ => return Err(Sense::invalid_cdb_field(2, Some(2))),
    }
    Reply::data(out, alloc)
}

/// READ DEFECT DATA (10/12): an empty defect list in the format asked for.
fn read_defect_data(cdb: &[u8]) -> CmdResult {
    if cdb[0] == 0x37 {
        let alloc = usize::from(be16(&cdb[7..9]));
        Reply::data(vec![0, cdb[2] & 0x1f, 0, 0], alloc)
    } else {
        let alloc = be32(&cdb[6..10]) as usize;
        Reply::data(vec![0, cdb[1] & 0x1f, 0, 0, 0, 0, 0, 0], alloc)
    }
}

fn report_tmfs(cdb: &[u8]) -> CmdResult {
    let alloc = be32(&cdb[6..10]) as usize;
    let repd = cdb[2] & 0x80 != 0;
    // ATS, ATSS, CTSS, LURS and TRS; no CLEAR ACA, QUERY TASK or wakeup.
    let mut d = vec![0xda, 0, 0, 0];
    if repd {
        d.resize(16, 0);
        d[3] = 0x0c;
    }
    Reply::data(d, alloc)
}
