//! SBC-3 direct-access block device emulation: one logical unit over a
//! [`BlockDevice`].
//!
//! The READ/WRITE path takes no lock: it reads an atomic "a unit attention
//! is pending" flag and atomic mode bits, then submits the I/O to the
//! unit's [`Volume`] (range locks, write-cache policy, the engine). Mode
//! pages and medium state sit behind one mutex that only slow-path
//! commands touch.
//!
//! This module holds the unit's state and dispatch; [`gate`] the checks
//! every command passes (each a column of the command table, and the
//! same for a transport without CDBs: [`LogicalUnit::admit`]); [`submit`]
//! is the one entry point (checks once, then done now, pending on the
//! engine, or a blocking job); the command families live in submodules:
//! [`io`] (READ, WRITE, VERIFY, COMPARE AND WRITE, capacity, cache), [`provisioning`] (WRITE
//! SAME, UNMAP, GET LBA STATUS), [`inquiry`] (standard data and VPD pages),
//! [`mode`] (MODE SENSE/SELECT), [`medium`] (START STOP UNIT, PREVENT ALLOW
//! MEDIUM REMOVAL, REQUEST SENSE), [`sanitize`], and [`multipath`]
//! (reservations and target port groups shared with the other gateways
//! that export the same store; REPORT/SET TARGET PORT GROUPS).

mod cut_through;
mod cut_through_write;
mod gate;
mod inquiry;
mod io;
mod medium;
mod mode;
mod multipath;
mod provisioning;
mod sanitize;
mod submit;
#[cfg(test)]
pub(crate) mod testing;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ethersan_backend::{BackendError, BlockDevice, IoBuf, SharedState};
use ethersan_volume::{MediumError, Volume};

use crate::be::{be16, be32};
use crate::cdb::BlockCdb;
use crate::commands::{self, CommandDef, Op};
use crate::reservations::{PrError, Reservations};
use crate::sense::{codes, Sense};
use crate::unit_attention::UnitAttentions;
use crate::{LuConfig, Nexus, ResetKind, ScsiRequest, ScsiResponse, ScsiStatus};
pub use cut_through_write::{WriteStream, WriteStreamError};
pub use gate::{BlockCommand, Refusal};
use mode::ModeState;
use multipath::AluaView;
pub use multipath::{PreemptListener, SharedStateError};
use sanitize::SanitizeState;

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

type CmdResult = Result<Reply, Sense>;

/// What a successful command returns.
#[derive(Debug, Default)]
struct Reply {
    /// Data-In: a READ's data where the engine put it, or what the
    /// emulation built.
    data: IoBuf,
}

impl Reply {
    fn none() -> CmdResult {
        Ok(Reply::default())
    }
    fn data(mut data: Vec<u8>, alloc: usize) -> CmdResult {
        data.truncate(alloc);
        Ok(Reply::full(data))
    }
    fn full(data: Vec<u8>) -> Reply {
        Reply { data: data.into() }
    }
}

#[derive(Debug)]
struct LuState {
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
    ua: Arc<UnitAttentions>,
    /// The data path: range locks, write-cache (WCE) policy, the engine.
    vol: Arc<Volume>,
    d_sense: AtomicBool,
    swp: AtomicBool,
    ejected: AtomicBool,
    /// The reservations (with shared state: the cache of blob `"pr"`,
    /// refreshed by its change handler).
    reservations: Arc<Mutex<Reservations>>,
    /// Any reservation held: commands must be checked against it.
    reserved: Arc<AtomicBool>,
    sanitize: Arc<SanitizeState>,
    /// I_T nexuses whose tasks a PREEMPT AND ABORT asked to abort; the
    /// transport takes them with [`LogicalUnit::take_preempted`].
    preempted: Arc<Mutex<Vec<Nexus>>>,
    /// The state shared with the other gateways exporting the store.
    shared: Option<Arc<dyn SharedState>>,
    /// The target port groups and this gateway's access state.
    alua: Arc<AluaView>,
    /// The parts above that the shared state's change handlers update
    /// (they hold it weakly: a dropped unit stops following).
    follower: Arc<multipath::Follower>,
    failures: FailureLog,
}

fn backend_sense(e: &BackendError, write: bool) -> Sense {
    match MediumError::of(e, write) {
        MediumError::NoSpace => codes::SPACE_ALLOCATION_FAILED,
        MediumError::Write => codes::WRITE_ERROR,
        MediumError::Read => codes::READ_ERROR,
        MediumError::Unavailable => codes::LU_COMMUNICATION_TIMEOUT,
    }
}

/// Medium errors are logged at most once a second per logical unit; the
/// ones in between are counted and reported with the next.
#[derive(Debug)]
struct FailureLog {
    /// When the last one was logged, and how many were not since.
    last: Mutex<(Option<std::time::Instant>, u64)>,
}

impl FailureLog {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(1);

    /// Whether to log one now, and how many went unlogged before it.
    fn admit(&self) -> Option<u64> {
        let now = std::time::Instant::now();
        let mut g = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match g.0 {
            Some(t) if now.duration_since(t) < Self::EVERY => {
                g.1 += 1;
                None
            }
            _ => {
                let skipped = g.1;
                *g = (Some(now), 0);
                Some(skipped)
            }
        }
    }
}

impl LogicalUnit {
    /// The sense for a failed engine request on `range` (byte offset and
    /// length; `None`: the whole unit, as a flush). The failure is logged
    /// with the unit and the range, at most once a second: the initiator
    /// sees only a sense code, the administrator needs the cause.
    pub(crate) fn medium_error(
        &self,
        e: &BackendError,
        write: bool,
        range: Option<(u64, u64)>,
    ) -> Sense {
        let kind = MediumError::of(e, write);
        if let Some(skipped) = self.failures.admit() {
            let what = match kind {
                MediumError::NoSpace => "out of space",
                MediumError::Write => "write failed",
                MediumError::Read => "read failed",
                MediumError::Unavailable => "store not answering",
            };
            let bytes = range.map_or_else(
                || "the whole unit".to_string(),
                |(o, l)| format!("bytes {o}..{}", o.saturating_add(l)),
            );
            let unlogged = if skipped > 0 {
                format!(" ({skipped} more failures in the last second not logged)")
            } else {
                String::new()
            };
            tracing::error!(
                "target {} LU {} ({}): {what} on {bytes}: {e}{unlogged}",
                self.cfg.target_name,
                self.cfg.serial,
                self.dev.describe()
            );
        }
        backend_sense(e, write)
    }

    /// Create a logical unit over `dev`.
    pub fn new(dev: Arc<dyn BlockDevice>, cfg: LuConfig) -> Self {
        let vol = Arc::new(Volume::new(dev, cfg.write_cache));
        Self::with_volume(vol, cfg)
    }

    /// Create a logical unit over a volume that another protocol (AoE's
    /// ATA, NVMe) may share: the range locks and the write cache are then
    /// the same for both. The volume's write cache is set from `cfg`.
    pub fn with_volume(vol: Arc<Volume>, cfg: LuConfig) -> Self {
        let dev = vol.device().clone();
        vol.set_write_cache(cfg.write_cache);
        let mode = ModeState {
            wce: cfg.write_cache,
            d_sense: false,
            swp: false,
        };
        // Reservations saved with APTPL are in force from the start; with
        // shared state they live in the cluster instead of a file.
        let shared = dev.shared();
        let state_file = match shared {
            Some(_) => None,
            None => cfg.pr_state_file.clone(),
        };
        let reservations = Reservations::with_state_file(state_file, cfg.alua.rel_port);
        let follower = Arc::new(multipath::Follower {
            alua_cfg: cfg.alua,
            ua: Arc::new(UnitAttentions::default()),
            reserved: Arc::new(AtomicBool::new(reservations.active())),
            reservations: Arc::new(Mutex::new(reservations)),
            preempted: Arc::new(Mutex::new(Vec::new())),
            alua: Arc::new(AluaView::new(&cfg.alua)),
            listener: Default::default(),
        });
        let lu = LogicalUnit {
            state: Mutex::new(LuState {
                mode,
                default_mode: mode,
                medium_present: true,
                prevent: HashSet::new(),
            }),
            ua: follower.ua.clone(),
            vol,
            d_sense: AtomicBool::new(false),
            swp: AtomicBool::new(false),
            ejected: AtomicBool::new(false),
            reserved: follower.reserved.clone(),
            sanitize: Arc::new(SanitizeState::default()),
            preempted: follower.preempted.clone(),
            failures: FailureLog {
                last: Mutex::new((None, 0)),
            },
            reservations: follower.reservations.clone(),
            shared,
            alua: follower.alua.clone(),
            follower,
            dev,
            cfg,
        };
        lu.attach_shared();
        lu
    }

    /// The backing device.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// The volume the unit's data path goes through.
    pub fn volume(&self) -> &Arc<Volume> {
        &self.vol
    }

    /// The configuration.
    pub fn config(&self) -> &LuConfig {
        &self.cfg
    }

    /// The largest COMPARE AND WRITE in blocks: 255, or fewer when the
    /// store does it atomically for every gateway only up to a smaller
    /// size (librbd: one 512-byte sector), so that initiators send what
    /// stays atomic across gateways.
    pub(crate) fn max_compare_and_write(&self) -> u32 {
        let bs = u64::from(self.dev.block_size().max(1));
        match self.dev.max_compare_and_write_bytes() {
            Some(bytes) if bytes >= bs => {
                MAX_COMPARE_AND_WRITE.min(u32::try_from(bytes / bs).unwrap_or(u32::MAX))
            }
            _ => MAX_COMPARE_AND_WRITE,
        }
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
            data_in: IoBuf::new(),
            data_out_len: None,
        }
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

    /// A new I_T nexus: it starts with POWER ON, RESET, OR BUS DEVICE RESET
    /// OCCURRED (SAM-5 §5.14: the first command of a new nexus learns that
    /// the unit's state may have changed). A nexus seen before (same ISID
    /// reinstated) keeps what is queued for it instead.
    pub(crate) fn nexus_added(&self, nexus: Nexus) {
        if self.ua.register(nexus) {
            self.ua.raise(nexus, codes::POWER_ON_RESET);
        }
    }

    /// An I_T nexus ended: its PREVENT state goes (SBC-3 §5.13) and a later
    /// login of the same nexus learns of the loss.
    pub(crate) fn nexus_lost(&self, nexus: Nexus) {
        self.lock().prevent.remove(&nexus);
        self.ua.raise(nexus, codes::NEXUS_LOSS);
        let mut r = self.res();
        r.drop_legacy(Some(nexus));
        self.publish_reserved(&r);
    }

    /// A reset reached this unit (SAM-5 §6.3, §7.7, §7.11): RESERVE(6/10)
    /// reservations and PREVENT states are released, a cold reset also
    /// restores the default mode pages, and every nexus gets a unit
    /// attention: BUS DEVICE RESET FUNCTION OCCURRED for a logical unit or
    /// warm target reset, POWER ON, RESET, OR BUS DEVICE RESET OCCURRED for
    /// a cold (hard) reset.
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
        drop(st);
        let s = match kind {
            ResetKind::LogicalUnit | ResetKind::TargetWarm => codes::LUN_RESET,
            ResetKind::TargetCold => codes::POWER_ON_RESET,
        };
        self.ua.raise_all(s, None);
        // A logical unit reset is an event of the unit, which the other
        // gateways export too; a target reset is of this gateway's target.
        if kind == ResetKind::LogicalUnit {
            self.announce_reset(s);
        }
    }

    /// Re-read the backing store's size; if it changed, every I_T nexus
    /// gets CAPACITY DATA HAS CHANGED. Returns the new block count then.
    pub fn rescan_capacity(&self) -> Result<Option<u64>, ethersan_backend::BackendError> {
        let changed = self.dev.refresh_size()?;
        if changed.is_some() {
            self.ua.raise_all(codes::CAPACITY_DATA_CHANGED, None);
        }
        Ok(changed)
    }

    /// Grow the backing store to `bytes`; every nexus gets CAPACITY DATA
    /// HAS CHANGED. Returns the new number of blocks if it changed.
    pub fn resize(&self, bytes: u64) -> Result<Option<u64>, ethersan_backend::BackendError> {
        let changed = self.dev.resize(bytes)?;
        if changed.is_some() {
            self.ua.raise_all(codes::CAPACITY_DATA_CHANGED, None);
        }
        Ok(changed)
    }

    /// The target's LUN inventory changed: every nexus that knows this unit
    /// gets REPORTED LUNS DATA HAS CHANGED (SPC-4 §6.33).
    pub(crate) fn luns_changed(&self) {
        self.ua.raise_all(codes::REPORTED_LUNS_CHANGED, None);
    }

    /// The I_T nexuses a PREEMPT AND ABORT preempted since the last call:
    /// the transport aborts their tasks on this LU (SPC-4 §5.9.11.4).
    pub fn take_preempted(&self) -> Vec<Nexus> {
        std::mem::take(&mut *self.preempted.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Commands of `victim` were cleared by another initiator.
    pub(crate) fn tasks_cleared(&self, victim: Nexus) {
        self.ua.raise(victim, codes::COMMANDS_CLEARED);
    }

    fn publish_mode(&self, m: ModeState) {
        self.vol.set_write_cache(m.wce);
        self.d_sense.store(m.d_sense, Ordering::Relaxed);
        self.swp.store(m.swp, Ordering::Relaxed);
    }

    // ---- dispatch ----

    fn dispatch(&self, def: &'static CommandDef, req: &ScsiRequest<'_>) -> ScsiResponse {
        let cdb = req.cdb;
        let result = match def.op {
            Op::TestUnitReady => Reply::none(),
            Op::RequestSense => self.request_sense(req),
            // The data path: [`submit`] sends these to the volume and never
            // dispatches them here.
            Op::Read | Op::Write | Op::WriteVerify | Op::SyncCache => Err(codes::INVALID_OPCODE),
            Op::WriteAtomic => self.write_atomic(cdb, req.data_out),
            // The target's copy manager runs these (it sees every LUN).
            Op::ExtendedCopy | Op::ReceiveCopyResults => Err(codes::INVALID_OPCODE),
            Op::Sanitize => self.sanitize(cdb, req.data_out),
            Op::Verify => self.verify(cdb, req.data_out),
            Op::Inquiry => self.inquiry(cdb),
            Op::ModeSense6 | Op::ModeSense10 => self.mode_sense(cdb),
            Op::ModeSelect6 | Op::ModeSelect10 => self.mode_select(cdb, req.data_out, req.nexus),
            Op::StartStopUnit => self.start_stop(cdb, req.nexus),
            Op::PreventAllow => self.prevent_allow(cdb, req.nexus),
            Op::ReadCapacity10 => self.read_capacity10(cdb),
            Op::ReadCapacity16 => self.read_capacity16(cdb),
            Op::PreFetch => self.prefetch(cdb),
            Op::ReportOpcodes => commands::report::report_supported_opcodes(cdb).map(Reply::full),
            Op::ReportTmfs => commands::report::report_supported_tmfs(cdb).map(Reply::full),
            Op::WriteSame => self.write_same(cdb, req.data_out),
            Op::Unmap => self.unmap(cdb, req.data_out),
            Op::GetLbaStatus => self.get_lba_status(cdb),
            Op::CompareAndWrite => self.compare_and_write(cdb, req.data_out),
            Op::OrWrite => self.or_write(cdb, req.data_out),
            Op::ReadDefectData => io::read_defect_data(cdb),
            Op::Reserve | Op::Release | Op::PrOut => {
                // RESERVE(6)/RELEASE(6) CDBs are 6 bytes: only PERSISTENT
                // RESERVE OUT (10 bytes) has a parameter list length.
                let len = if def.op == Op::PrOut {
                    be32(&cdb[5..9]) as usize
                } else {
                    0
                };
                let (action, scope_type) = (cdb[1] & 0x1f, cdb[2]);
                let outcome = match def.op {
                    Op::PrOut if req.data_out.len() < len => {
                        Err(PrError::Sense(codes::PARAM_LIST_LENGTH))
                    }
                    Op::PrOut if self.shared.is_some() => {
                        let shared = self.shared.clone();
                        let shared = shared.as_deref().expect("checked above");
                        let param = &req.data_out[..len];
                        self.pr_out_shared(shared, req.nexus, action, scope_type, param)
                    }
                    _ => {
                        let mut r = self.res();
                        let outcome = match def.op {
                            Op::Reserve => r.reserve_legacy(req.nexus).map(|_| Vec::new()),
                            Op::Release => r.release_legacy(req.nexus).map(|_| Vec::new()),
                            _ => r.pr_out(req.nexus, action, scope_type, &req.data_out[..len]),
                        };
                        self.publish_reserved(&r);
                        outcome
                    }
                };
                match outcome {
                    Ok(notices) => {
                        self.follower().raise(&notices, false);
                        Reply::none()
                    }
                    Err(PrError::Conflict) => return conflict(),
                    Err(PrError::Sense(s)) => Err(s),
                }
            }
            Op::PrIn => {
                let alloc = usize::from(be16(&cdb[7..9]));
                self.refresh_pr()
                    .and_then(|()| self.res().pr_in(cdb[1] & 0x1f))
                    .and_then(|d| Reply::data(d, alloc))
            }
            Op::ReportTpg => self.report_target_port_groups(cdb),
            Op::SetTpg => self.set_target_port_groups(cdb, req.data_out, req.nexus),
            // Routed by the target; a unit asked directly lists only LUN 0.
            Op::ReportLuns => crate::report_luns::report_luns(cdb, &[0]).map(Reply::full),
        };
        self.finish(def, req, result)
    }

    /// The response for a command's result, with the Data-Out length the
    /// CDB asked for (for residuals).
    fn finish(
        &self,
        def: &'static CommandDef,
        req: &ScsiRequest<'_>,
        result: CmdResult,
    ) -> ScsiResponse {
        self.respond(result, self.reported_data_out_len(def, req.cdb))
    }

    /// The Data-Out length a command reports for residuals (`None` for
    /// commands that take no Data-Out).
    fn reported_data_out_len(&self, def: &'static CommandDef, cdb: &[u8]) -> Option<usize> {
        let writes = matches!(
            def.op,
            Op::Write | Op::WriteVerify | Op::CompareAndWrite | Op::OrWrite | Op::WriteAtomic
        ) || (def.op == Op::WriteSame && !(cdb[0] == 0x93 && cdb[1] & 0x01 != 0));
        if writes
            || (def.op == Op::Verify && cdb[1] & 0x06 != 0)
            || matches!(
                def.op,
                Op::ModeSelect6 | Op::ModeSelect10 | Op::Unmap | Op::PrOut | Op::SetTpg
            )
        {
            Some(self.data_out_len(def, cdb))
        } else {
            None
        }
    }

    /// The response for a result.
    fn respond(&self, result: CmdResult, data_out_len: Option<usize>) -> ScsiResponse {
        match result {
            Ok(r) => ScsiResponse {
                status: ScsiStatus::Good,
                sense: Vec::new(),
                data_in: r.data,
                data_out_len,
            },
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
            Op::SetTpg => be32(&cdb[6..10]) as usize,
            _ => (u64::from(BlockCdb::parse(cdb).blocks) * self.bs()) as usize,
        }
    }

    /// Check the LBA range of a block CDB: LOGICAL BLOCK ADDRESS OUT OF
    /// RANGE past the capacity, INVALID FIELD IN CDB (at the transfer
    /// length) above the Block Limits maximum. Returns the byte offset and
    /// length.
    fn range(&self, c: &BlockCdb) -> Result<(u64, usize), Sense> {
        let (off, bytes) = self
            .vol
            .check_range(c.lba, u64::from(c.blocks))
            .map_err(|_| codes::LBA_OUT_OF_RANGE)?;
        if bytes > MAX_TRANSFER_BYTES {
            return Err(Sense::invalid_cdb_field(c.length_byte, None));
        }
        Ok((off, bytes as usize))
    }

    /// RDPROTECT/WRPROTECT/VRPROTECT must be zero: the unit has no
    /// protection information (SBC-3 §4.22, PROTECT = 0 in INQUIRY).
    fn no_protection(c: &BlockCdb) -> Result<(), Sense> {
        if c.protect != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(7)));
        }
        Ok(())
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

    /// Queue a unit attention for every nexus except `except`.
    pub fn unit_attention_others(&self, s: Sense, except: Nexus) {
        self.ua.raise_all(s, Some(except));
    }
}

fn conflict() -> ScsiResponse {
    ScsiResponse {
        status: ScsiStatus::ReservationConflict,
        sense: Vec::new(),
        data_in: IoBuf::new(),
        data_out_len: None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::testing::*;
    use crate::commands::{self, COMMANDS};
    use crate::sense::key;

    /// RESERVE(6) and RELEASE(6) arrive as 6-byte CDBs (the fuzzer found
    /// that only PERSISTENT RESERVE OUT may be read for a parameter list
    /// length).
    #[test]
    fn six_byte_reserve_and_release() {
        let (t, _) = target(512);
        good(exec(&t, A, &[0x16, 0, 0, 0, 0, 0], &[]));
        let r = exec(&t, B, &[0x16, 0, 0, 0, 0, 0], &[]);
        assert_eq!(r.status, crate::ScsiStatus::ReservationConflict);
        good(exec(&t, A, &[0x17, 0, 0, 0, 0, 0], &[]));
        good(exec(&t, B, &[0x16, 0, 0, 0, 0, 0], &[]));
        good(exec(&t, B, &[0x17, 0, 0, 0, 0, 0], &[]));
    }

    #[test]
    fn every_opcode_outside_the_table_is_invalid_opcode() {
        let (t, _) = target(512);
        for op in 0..=255u8 {
            if COMMANDS.iter().any(|d| d.opcode == op) {
                continue;
            }
            let mut cdb = vec![0u8; 16];
            cdb[0] = op;
            let r = exec(&t, A, &cdb, &[]);
            check(&r, key::ILLEGAL_REQUEST, 0x20, 0);
        }
        // A known opcode with an unknown service action: INVALID FIELD IN CDB.
        let r = exec(&t, A, &cdb16(0x9e, 0x11, 0, 0), &[]);
        check(&r, key::ILLEGAL_REQUEST, 0x24, 0);
        check(&exec(&t, A, &[], &[]), key::ILLEGAL_REQUEST, 0x20, 0);
    }

    #[test]
    fn reserved_bits_and_short_cdbs_are_invalid_fields() {
        let (t, _) = target(512);
        for def in COMMANDS {
            // A CDB one byte short of its layout.
            let mut short = def.usage[..def.cdb_len - 1].to_vec();
            short[0] = def.opcode;
            check(&exec(&t, A, &short, &[]), key::ILLEGAL_REQUEST, 0x24, 0);
            // Each reserved bit, one at a time.
            for byte in 1..def.cdb_len - 1 {
                let reserved = !def.usage[byte];
                if reserved == 0 {
                    continue;
                }
                let bit = 7 - reserved.leading_zeros() as u8;
                let mut cdb = vec![0u8; def.cdb_len];
                cdb[0] = def.opcode;
                if let Some(sa) = def.service_action {
                    cdb[1] = sa;
                }
                cdb[byte] |= 1 << bit;
                if commands::lookup(&cdb).map(|d| d.opcode) != Some(def.opcode) {
                    continue; // the bit changed the service action
                }
                let r = exec(&t, A, &cdb, &[]);
                check(&r, key::ILLEGAL_REQUEST, 0x24, 0);
                assert_eq!(
                    field_pointer(&r),
                    [0xc8 | bit, 0, byte as u8],
                    "{} byte {byte}",
                    def.name
                );
            }
            // NACA and LINK in the control byte.
            let mut cdb = vec![0u8; def.cdb_len];
            cdb[0] = def.opcode;
            if let Some(sa) = def.service_action {
                cdb[1] = sa;
            }
            cdb[def.cdb_len - 1] = 0x04;
            check(&exec(&t, A, &cdb, &[]), key::ILLEGAL_REQUEST, 0x24, 0);
        }
    }

    #[test]
    fn concurrent_io_from_many_nexuses() {
        let (t, _) = target(4096);
        let t = std::sync::Arc::new(t);
        let threads: Vec<_> = (0..8u64)
            .map(|i| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let n = crate::Nexus(100 + i);
                    t.nexus_added(n);
                    exec(&t, n, &[0, 0, 0, 0, 0, 0], &[]);
                    let data = vec![i as u8; 4096 * 4];
                    for round in 0..50u32 {
                        let lba = (i as u32) * 64 + (round % 16) * 4;
                        good(exec(&t, n, &cdb10(0x2a, 0, lba, 4), &data));
                        assert_eq!(good(exec(&t, n, &cdb10(0x28, 0, lba, 4), &[])), data);
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
    }

    /// CDBs that start with an opcode of the table (so they get past the
    /// lookup) or any byte, followed by random bytes and random Data-Out.
    fn any_cdb() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, u64, bool)> {
        let opcode = prop_oneof![
            (0..COMMANDS.len()).prop_map(|i| COMMANDS[i].opcode),
            any::<u8>(),
        ];
        (
            opcode,
            prop::collection::vec(any::<u8>(), 0..20),
            prop::collection::vec(any::<u8>(), 0..9000),
            0u64..3,
            any::<bool>(),
        )
            .prop_map(|(op, mut rest, data, lun, big)| {
                rest.insert(0, op);
                (rest, data, lun, big)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
        #[test]
        fn random_cdbs_never_panic((cdb, data, lun, big) in any_cdb()) {
            let bs = if big { 4096 } else { 512 };
            let (t, _) = target(bs);
            let r = exec_lun(&t, A, lun, &cdb, &data);
            // Sense only with CHECK CONDITION; Data-In never beyond 16 MiB.
            prop_assert_eq!(r.sense.is_empty(), r.status != crate::ScsiStatus::CheckCondition);
            prop_assert!(r.data_in.len() <= 16 << 20);
            // The unit still works afterwards.
            let tur = exec(&t, A, &[0, 0, 0, 0, 0, 0], &[]);
            prop_assert!(tur.status == crate::ScsiStatus::Good || sense(&tur).is_some());
        }
    }
}
