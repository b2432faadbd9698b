//! The AoE target front end: ethersan's LUNs as ATA over Ethernet devices
//! (AoE r11) on raw Ethernet links.
//!
//! One task per link owns that link's [`AoeTarget`] (the protocol core:
//! decoding, addressing, MAC masks, reservations, config strings) and
//! carries out the I/O it asks for against the LUN's own volume, the one
//! its iSCSI sessions use (shared range locks and write cache). Before
//! that, each run of I/O passes the LUN's own gates
//! ([`LogicalUnit::admit`]: ALUA state, SCSI reservations, SANITIZE, the
//! medium) as the SCSI command with the same rules would, from an I_T
//! nexus of its own per initiator MAC that holds no registration; a
//! refused one is answered with the ATA abort error. A read or write that
//! finishes at once (page cache, RAM) is answered in the same turn of the
//! loop; one that waits comes back through a channel. Each device's
//! config string is kept beside its backing store and read again at
//! start-up, as AoE initiators find their disks by it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ethersan_aoe::target::{TargetError, TargetEvent};
use ethersan_aoe::{
    Action, AoeTarget, DeviceAddr, DeviceConfig, IoFailure, IoOp, IoRequest, Mac, Pending,
    TargetConfig,
};
use ethersan_backend::{BackendError, IoBuf, Submission};
use ethersan_link::packet::{PacketConfig, PacketLink, RingVersion};
use ethersan_link::unix::{UnixDgramConfig, UnixDgramLink};
use ethersan_link::{Link, LinkError, ETHERTYPE_AOE};
use ethersan_scsi::{BlockCommand, LogicalUnit, Nexus};
use ethersan_volume::{Volume, VolumeError};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::config::{AoeAddress, AoeLink, Config};
use crate::registry::Registry;

mod pool;
mod state;
use pool::Pool;
use state::{load_config_string, save_config_string, state_file};

/// Why the AoE target could not start.
#[derive(Debug, thiserror::Error)]
pub enum AoeError {
    /// A link could not be opened (the link's message says what to do).
    #[error("AoE link {link}: {cause}")]
    Link {
        /// The link as configured.
        link: String,
        /// What went wrong.
        cause: LinkError,
    },
    /// A LUN whose blocks are not 512 bytes (AoE sectors are).
    #[error("AoE: LUN {lun} of {target} has {block_size}-byte blocks, and AoE sectors are 512 bytes: give the LUN bs=512, or aoe=off to leave it out of AoE")]
    BlockSize {
        /// The target.
        target: String,
        /// The LUN.
        lun: usize,
        /// Its block size.
        block_size: u32,
    },
    /// Two LUNs at one shelf.slot.
    #[error("AoE: LUN {lun} of {target} and {other} are both at {addr}: give one of them another aoe=SHELF.SLOT")]
    SameAddress {
        /// The target.
        target: String,
        /// The LUN.
        lun: usize,
        /// The LUN already there.
        other: String,
        /// The address.
        addr: DeviceAddr,
    },
    /// A target beyond the shelves a default address can name.
    #[error("AoE: target {target} is number {index} in the configuration, beyond the last shelf 65534: give its LUNs aoe=SHELF.SLOT")]
    NoShelf {
        /// The target.
        target: String,
        /// Its position.
        index: usize,
    },
    /// A LUN number beyond the slots a default address can name.
    #[error("AoE: LUN {lun} of {target} is beyond the last slot 254: give it aoe=SHELF.SLOT")]
    NoSlot {
        /// The target.
        target: String,
        /// The LUN.
        lun: usize,
    },
    /// More than one link: each would keep its own config strings, MAC
    /// mask lists and reservations for the same devices.
    #[error("AoE: {0} links given, and one is served for now (each link would keep its own config strings, MAC masks and reservations for the same disks): give one --aoe link")]
    OneLink(usize),
    /// The protocol core refused a device (too large, list too long).
    #[error("AoE: {addr}: {cause}")]
    Device {
        /// The address.
        addr: DeviceAddr,
        /// Why.
        cause: TargetError,
    },
}

/// What a link needs of one device: the logical unit whose gates its
/// I/O passes, the volume it goes to, where its config string is kept,
/// and whether IDENTIFY reported its write cache on.
struct Device {
    lu: Arc<LogicalUnit>,
    volume: Arc<Volume>,
    state_file: Option<PathBuf>,
    cached: bool,
}

/// Each device of a link by its address.
type Volumes = HashMap<DeviceAddr, Device>;

/// One LUN as an AoE device.
#[derive(Debug, Clone)]
pub struct Export {
    /// Its shelf.slot.
    pub addr: DeviceAddr,
    /// `LUN n of TARGET`, for people.
    pub name: String,
    /// The protocol core's view of it.
    pub device: DeviceConfig,
    /// The logical unit: its gates (ALUA, reservations, SANITIZE,
    /// medium) apply to AoE I/O too.
    pub lu: Arc<LogicalUnit>,
    /// The volume its commands go to (the unit's own).
    pub volume: Arc<Volume>,
    /// Where its config string is kept (`None`: a RAM LUN, not kept).
    pub state_file: Option<PathBuf>,
}

/// The address a LUN gets: its own, or shelf = the target's position and
/// slot = the LUN number; `None` when it is not exported.
pub fn address(
    target: &str,
    index: usize,
    lun: usize,
    aoe: AoeAddress,
) -> Result<Option<DeviceAddr>, AoeError> {
    match aoe {
        AoeAddress::Off => Ok(None),
        AoeAddress::At { shelf, slot } => Ok(Some(DeviceAddr::new(shelf, slot))),
        AoeAddress::Default => {
            let shelf = u16::try_from(index)
                .ok()
                .filter(|s| *s < u16::MAX)
                .ok_or_else(|| AoeError::NoShelf {
                    target: target.to_string(),
                    index,
                })?;
            let slot = u8::try_from(lun)
                .ok()
                .filter(|s| *s < u8::MAX)
                .ok_or_else(|| AoeError::NoSlot {
                    target: target.to_string(),
                    lun,
                })?;
            Ok(Some(DeviceAddr::new(shelf, slot)))
        }
    }
}

/// The AoE devices `cfg` exports, with their volumes from `registry`.
pub fn exports(cfg: &Config, registry: &Registry) -> Result<Vec<Export>, AoeError> {
    let mut out: Vec<Export> = Vec::new();
    let mask: Vec<Mac> = cfg.aoe.allowed_macs.iter().map(|m| Mac(m.0)).collect();
    for (ti, t) in cfg.targets.iter().enumerate() {
        let Some(entry) = registry.target(&t.name) else {
            continue;
        };
        for (n, idx) in t.numbered() {
            let l = &t.luns[idx];
            // The LUN number (an AoE slot is at most 254: larger numbers
            // are refused by `address`).
            let i = usize::try_from(n).unwrap_or(usize::MAX);
            // AoE has no authentication: a LUN that iSCSI guards (CHAP,
            // initiator or network lists, LUN masking, read-only for some)
            // is exported only when its address is given explicitly.
            let guarded = t.chap.effective(cfg.chap.as_ref()).is_some()
                || !t.access.is_open()
                || t.access.luns.get(idx).is_some_and(|v| !v.is_empty())
                || t.access.read_only.get(idx).is_some_and(|v| !v.is_empty());
            if guarded && l.aoe == AoeAddress::Default {
                warn!(target = %t.name, lun = i, "AoE: LUN {i} of {} is not exported over AoE: iSCSI guards it (CHAP or access lists) and AoE has no authentication; give it aoe=SHELF.SLOT (and [aoe] allowed_macs) to export it anyway", t.name);
                continue;
            }
            let Some(addr) = address(&t.name, ti, i, l.aoe)? else {
                continue;
            };
            let Some(lu) = entry.scsi.lun(i as u64) else {
                continue;
            };
            let name = format!("LUN {i} of {}", t.name);
            if let Some(other) = out.iter().find(|e| e.addr == addr) {
                return Err(AoeError::SameAddress {
                    target: t.name.clone(),
                    lun: i,
                    other: other.name.clone(),
                    addr,
                });
            }
            let volume = lu.volume().clone();
            if volume.block_size() != 512 {
                return Err(AoeError::BlockSize {
                    target: t.name.clone(),
                    lun: i,
                    block_size: volume.block_size(),
                });
            }
            let state_file = state_file(&l.backing, &cfg.options.data_dir);
            let mut device = DeviceConfig::new(volume.num_blocks());
            device.read_only = l.read_only;
            device.serial = lu.config().serial.chars().take(20).collect();
            device.write_cache = volume.write_cache();
            device.mask = mask.clone();
            if let Some(c) = state_file.as_deref().and_then(load_config_string) {
                device.config_string = c;
            }
            out.push(Export {
                addr,
                name,
                device,
                lu,
                volume,
                state_file,
            });
        }
    }
    Ok(out)
}

/// Open one configured link (AF_PACKET with per-frame hand-off, or a
/// unix datagram socket).
pub fn open_link(link: &AoeLink) -> Result<Link, AoeError> {
    open_link_for(link, ETHERTYPE_AOE)
}

/// [`open_link`] for frames of `ethertype` (the native transport's links
/// are opened the same way).
pub fn open_link_for(link: &AoeLink, ethertype: u16) -> Result<Link, AoeError> {
    open_link_in_group(link, ethertype, None)
}

/// [`open_link_for`], an interface's socket joining `fanout` (other
/// links ignore it).
pub fn open_link_in_group(
    link: &AoeLink,
    ethertype: u16,
    fanout: Option<ethersan_link::packet::Fanout>,
) -> Result<Link, AoeError> {
    let opened = match link {
        AoeLink::Interface(name) => PacketLink::open(PacketConfig {
            // Per-frame hand-off: a block-based V3 ring waits up to its
            // block timeout before a lone request is seen.
            ring: RingVersion::V2,
            fanout,
            ..PacketConfig::new(name.clone(), ethertype)
        })
        .map(Link::from),
        AoeLink::Unix {
            local,
            peer,
            mac,
            mtu,
        } => UnixDgramLink::open(UnixDgramConfig {
            // The same MAC at every start, so that an initiator's view of
            // the target survives a restart.
            mac: Some(mac.unwrap_or_else(|| mac_for(local))),
            mtu: *mtu,
            ethertype,
            ..UnixDgramConfig::new(local.clone(), peer.clone())
        })
        .map(Link::from),
    };
    opened.map_err(|cause| AoeError::Link {
        link: link.to_string(),
        cause,
    })
}

/// A locally administered unicast MAC derived from `path` (FNV-1a).
fn mac_for(path: &Path) -> ethersan_link::MacAddr {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    let b = h.to_be_bytes();
    ethersan_link::MacAddr([0x02, b[1], b[2], b[3], b[4], b[5]])
}

/// Open every configured link and start serving `exports` on each; the
/// tasks run until the runtime stops.
pub fn start(
    cfg: &Config,
    exports: &[Export],
) -> Result<Vec<tokio::task::JoinHandle<()>>, AoeError> {
    if cfg.aoe.links.len() > 1 {
        return Err(AoeError::OneLink(cfg.aoe.links.len()));
    }
    let mut links = Vec::new();
    for l in &cfg.aoe.links {
        links.push((l.to_string(), Arc::new(open_link(l)?)));
    }
    let mut tasks = Vec::new();
    for (name, link) in links {
        let mut target = AoeTarget::new(TargetConfig::new(Mac(link.mac().0), link.mtu()));
        let mut volumes = HashMap::new();
        for e in exports {
            target
                .add_device(e.addr, e.device.clone())
                .map_err(|cause| AoeError::Device {
                    addr: e.addr,
                    cause,
                })?;
            volumes.insert(
                e.addr,
                Device {
                    lu: e.lu.clone(),
                    volume: e.volume.clone(),
                    state_file: e.state_file.clone(),
                    cached: e.device.write_cache,
                },
            );
        }
        let list: Vec<String> = exports
            .iter()
            .map(|e| format!("{} ({})", e.addr, e.name))
            .collect();
        info!(
            link = %name,
            mac = %link.mac(),
            mtu = link.mtu(),
            sectors_per_frame = target.config().max_sectors,
            devices = %list.join(", "),
            "AoE target ready"
        );
        tasks.push(tokio::spawn(serve_link(name, link, target, volumes)));
    }
    Ok(tasks)
}

/// The outcome of a volume call, as the protocol core reports it.
fn failure(e: &BackendError) -> IoFailure {
    match e {
        BackendError::Read { .. } | BackendError::Write { .. } => IoFailure::Medium,
        _ => IoFailure::Aborted,
    }
}

/// A response waiting for the link, written into its transmit slot by
/// [`Reply::write`].
enum Reply {
    /// A whole frame: control replies, write and flush answers, failures.
    Frame(Vec<u8>),
    /// A successful read's answer: its header and its sectors, `data[at..]`
    /// (the run's buffer, shared by the run's answers), go straight into
    /// the slot, one copy of the data.
    Read {
        /// What the response needs.
        pending: Pending,
        /// The run's data.
        data: Arc<IoBuf>,
        /// Where this answer's sectors start in `data`.
        at: usize,
    },
    /// A buffer the volume is done with, back to the link's pool; not
    /// sent.
    Recycle(IoBuf),
}

impl Reply {
    /// Writes the frame at the start of `out` and returns its length (0:
    /// nothing to send).
    fn write(&self, out: &mut [u8]) -> usize {
        match self {
            Reply::Frame(f) => match out.get_mut(..f.len()) {
                Some(o) => {
                    o.copy_from_slice(f);
                    f.len()
                }
                None => 0,
            },
            Reply::Read { pending, data, at } => {
                let data = data.get(*at..).unwrap_or_default();
                pending.write_read_response(data, out).unwrap_or_else(|| {
                    // Too little data: the read failed after all.
                    let mut f = Vec::new();
                    pending.complete(Err(IoFailure::Medium), &mut f);
                    Reply::Frame(f).write(out)
                })
            }
            Reply::Recycle(_) => 0,
        }
    }

    /// Whether this answers a request (a frame to send), not a buffer.
    fn answers(&self) -> bool {
        !matches!(self, Reply::Recycle(_))
    }
}

/// An I/O finished: its response (`data`: a read's sectors, `at` where
/// this request's start).
fn respond(io: &IoRequest, result: Result<(&Arc<IoBuf>, usize), IoFailure>) -> Reply {
    let mut frame = Vec::new();
    match (&io.op, result) {
        (IoOp::Read { .. }, Ok((data, at))) => {
            if data.len() < at + io.pending.data_range().len() {
                io.pending.complete(Err(IoFailure::Medium), &mut frame);
                return Reply::Frame(frame);
            }
            return Reply::Read {
                pending: io.pending.clone(),
                data: data.clone(),
                at,
            };
        }
        (_, Ok(_)) => io.pending.complete(Ok(()), &mut frame),
        (_, Err(f)) => io.pending.complete(Err(f), &mut frame),
    }
    Reply::Frame(frame)
}

/// Most sectors one volume call carries for a run of commands (256 KiB).
const MAX_RUN_SECTORS: u64 = 512;

/// The sectors an I/O covers: (first, count); a flush covers none.
fn extent(op: &IoOp) -> (u64, u64) {
    match op {
        IoOp::Read { lba, sectors } | IoOp::Write { lba, sectors, .. } => {
            (*lba, u64::from(*sectors))
        }
        IoOp::Flush => (0, 0),
    }
}

/// 0 read, 1 write, 2 flush: the order a batch's runs are started in.
fn kind(op: &IoOp) -> u8 {
    match op {
        IoOp::Read { .. } => 0,
        IoOp::Write { .. } => 1,
        IoOp::Flush => 2,
    }
}

/// The SCSI command whose rules an AoE I/O follows.
fn block_command(op: &IoOp) -> BlockCommand {
    match op {
        IoOp::Read { .. } => BlockCommand::Read,
        IoOp::Write { .. } => BlockCommand::Write,
        IoOp::Flush => BlockCommand::Flush,
    }
}

/// The I_T nexus of an AoE initiator: one per MAC, never one a session
/// has (sessions' values hash initiator name, ISID and target; this
/// hashes a prefix no iSCSI name has and the MAC, FNV-1a), and never
/// registered: AoE has no PERSISTENT RESERVE OUT, so a SCSI reservation
/// fences every AoE initiator as one that holds no registration.
fn aoe_nexus(mac: Mac) -> Nexus {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in b"aoe-initiator ".iter().chain(mac.0.iter()) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    Nexus(h)
}

/// Requests of consecutive sectors of one device, one kind, from one
/// initiator: one volume call. A write's data is gathered in `data` as
/// its frame arrives (the one copy out of the receive ring).
struct Run {
    members: Vec<IoRequest>,
    /// Device, kind, initiator: what every member shares.
    key: (DeviceAddr, u8, Mac),
    /// First sector.
    first: u64,
    /// The sector after the last.
    next: u64,
    data: IoBuf,
}

impl Run {
    /// Whether `other` continues this run (and the two fit one call).
    fn continued_by(&self, key: (DeviceAddr, u8, Mac), first: u64, next: u64) -> bool {
        self.key == key && key.1 != 2 && self.next == first && next - self.first <= MAX_RUN_SECTORS
    }
}

/// The I/O of one received batch of frames. An initiator sends a large
/// request as one command per frame (1 KiB each at MTU 1500), and the
/// frames of one request arrive together: reads or writes of consecutive
/// sectors of one device go to the volume as one call, so a 4 KiB write
/// is one page-aligned write, not four partial ones, and a 128 KiB read
/// one `pread`. Runs are built as the frames arrive (in order, the
/// usual case, each write's data is copied once, into the run's buffer)
/// and joined again after sorting when frames came out of order.
#[derive(Default)]
struct IoBatch {
    runs: Vec<Run>,
}

impl IoBatch {
    fn push(&mut self, io: IoRequest, frame: &[u8], pool: &mut Pool) {
        let key = (io.device, kind(&io.op), io.pending.initiator());
        let (first, n) = extent(&io.op);
        let data = match &io.op {
            IoOp::Write { data, .. } => frame.get(data.clone()).unwrap_or_default(),
            _ => &[],
        };
        // The run this one continues is nearly always the latest of its
        // key: look from the end.
        if let Some(run) = self
            .runs
            .iter_mut()
            .rev()
            .find(|r| r.continued_by(key, first, first + n))
        {
            run.data.extend_from_slice(data);
            run.next = first + n;
            run.members.push(io);
            return;
        }
        let mut buf = if data.is_empty() {
            IoBuf::new()
        } else {
            pool.take()
        };
        buf.extend_from_slice(data);
        self.runs.push(Run {
            members: vec![io],
            key,
            first,
            next: first + n,
            data: buf,
        });
    }

    /// Start every run of the batch, reads, then writes, then flushes of
    /// each device: responses that are ready at once go to `now`, the
    /// others through `later`; returns how many will come through
    /// `later`. A run joins requests of one initiator only, so that one
    /// check of the unit's gates answers for all of them.
    fn start(
        &mut self,
        volumes: &Volumes,
        pool: &mut Pool,
        now: &mut Vec<Reply>,
        later: &mpsc::UnboundedSender<Reply>,
    ) -> usize {
        let mut deferred = 0;
        for run in self.take_runs(pool) {
            deferred += start_run(run, volumes, pool, now, later);
        }
        deferred
    }

    /// The batch's runs in the order they start, those that continue one
    /// another (frames that came out of order) joined: one call still.
    fn take_runs(&mut self, pool: &mut Pool) -> Vec<Run> {
        let mut runs = std::mem::take(&mut self.runs);
        runs.sort_by_key(|r| (r.key.0, r.key.1, r.key.2 .0, r.first));
        let mut joined: Vec<Run> = Vec::with_capacity(runs.len());
        for run in runs {
            if let Some(c) = joined.last_mut() {
                if c.continued_by(run.key, run.first, run.next) {
                    c.data.extend_from_slice(&run.data);
                    c.next = run.next;
                    c.members.extend(run.members);
                    pool.put(run.data);
                    continue;
                }
            }
            joined.push(run);
        }
        joined
    }
}

/// Start one run: reads or writes of consecutive sectors of one device, or
/// one flush, as one volume call; returns how many responses will come
/// through `later`.
fn start_run(
    run: Run,
    volumes: &Volumes,
    pool: &mut Pool,
    now: &mut Vec<Reply>,
    later: &mpsc::UnboundedSender<Reply>,
) -> usize {
    let Run {
        members,
        first,
        next,
        data,
        ..
    } = run;
    let Some(dev) = volumes.get(&members[0].device) else {
        now.extend(
            members
                .iter()
                .map(|io| respond(io, Err(IoFailure::Unavailable))),
        );
        pool.put(data);
        return 0;
    };
    // The unit's gates, once for the run (one device, one kind, one
    // initiator): a few atomic loads unless a reservation is held.
    let head = &members[0];
    let from = aoe_nexus(head.pending.initiator());
    if dev.lu.admit(block_command(&head.op), from).is_err() {
        now.extend(
            members
                .iter()
                .map(|io| respond(io, Err(IoFailure::Aborted))),
        );
        pool.put(data);
        return 0;
    }
    let (volume, cached) = (&dev.volume, dev.cached);
    let sectors = next - first;
    let read = matches!(members[0].op, IoOp::Read { .. });
    let members = Arc::new(members);
    // Each member's response from the run's outcome; the buffer goes back
    // to the pool with the last read answer sent, or at once after a
    // write.
    let answer = move |members: &[IoRequest], r: Result<IoBuf, IoFailure>| -> Vec<Reply> {
        let mut out = Vec::with_capacity(members.len() + 1);
        match r {
            Ok(d) if read => {
                let d = Arc::new(d);
                out.extend(members.iter().map(|io| {
                    let at = ((extent(&io.op).0 - first) * 512) as usize;
                    respond(io, Ok((&d, at)))
                }));
            }
            Ok(d) => {
                let none = Arc::new(IoBuf::new());
                out.extend(members.iter().map(|io| respond(io, Ok((&none, 0)))));
                out.push(Reply::Recycle(d));
            }
            Err(f) => out.extend(members.iter().map(|io| respond(io, Err(f)))),
        }
        out
    };
    let done = {
        let (members, later) = (members.clone(), later.clone());
        Box::new(move |r: ethersan_backend::IoResult| {
            for f in answer(&members, r.map_err(|e| failure(&e))) {
                let _ = later.send(f);
            }
        })
    };
    let submitted = match members[0].op {
        IoOp::Read { .. } => volume.read(first, sectors, pool.take(), done),
        // Durable at once when IDENTIFY said the write cache is off (even
        // if iSCSI turned it on since), or when the volume's cache is off;
        // otherwise at FLUSH CACHE, which the initiator sends when it
        // needs it.
        IoOp::Write { .. } => volume.write(first, sectors, data, !cached, done),
        IoOp::Flush => Ok(volume.flush(done)),
    };
    let deferred = members.len();
    match submitted {
        Ok(Submission::Done(r)) => {
            now.extend(answer(&members, r.map_err(|e| failure(&e))));
        }
        Ok(Submission::Pending) => return deferred,
        Ok(Submission::Blocking(job)) => {
            let later = later.clone();
            tokio::task::spawn_blocking(move || {
                for f in answer(&members, job().map_err(|e| failure(&e))) {
                    let _ = later.send(f);
                }
            });
            return deferred;
        }
        Err(VolumeError::OutOfRange { .. }) => {
            now.extend(answer(&members, Err(IoFailure::OutOfRange)))
        }
        Err(VolumeError::ShortData { .. }) => now.extend(answer(&members, Err(IoFailure::Aborted))),
    }
    0
}

/// Most responses a link waits for from the volume before it stops taking
/// frames: a peer sending faster than the store writes is held back by the
/// receive ring (frames dropped there are retransmitted by initiators),
/// not by memory.
const MAX_IN_FLIGHT: usize = 1024;

/// Sends `out` as one batch, each frame written into its transmit slot,
/// and gives the buffers back to `pool`.
async fn send_replies(name: &str, link: &Link, out: &mut Vec<Reply>, pool: &mut Pool) {
    let n = out.len();
    if out.iter().any(Reply::answers) {
        if let Err(e) = link.send_with(n, |i, slot| out[i].write(slot)).await {
            warn!(link = %name, "AoE: cannot send: {e}");
        }
    }
    for r in out.drain(..) {
        match r {
            Reply::Read { data, .. } => {
                // The run's last answer returns its buffer.
                if let Ok(buf) = Arc::try_unwrap(data) {
                    pool.put(buf);
                }
            }
            Reply::Recycle(buf) => pool.put(buf),
            Reply::Frame(_) => {}
        }
    }
}

/// One link's loop: frames in, protocol core, volume, frames out.
async fn serve_link(name: String, link: Arc<Link>, mut target: AoeTarget, volumes: Volumes) {
    let (later_tx, mut later) = mpsc::unbounded_channel::<Reply>();
    // Unsolicited config responses: initiators already listening find us.
    let mut out: Vec<Reply> = target.announce().into_iter().map(Reply::Frame).collect();
    let mut failures = 0u32;
    let mut batch = IoBatch::default();
    let mut pool = Pool::default();
    let mut in_flight = 0usize;
    loop {
        if !out.is_empty() {
            send_replies(&name, &link, &mut out, &mut pool).await;
        }
        tokio::select! {
            r = link.recv_batch(|frame| match target.handle(frame) {
                Action::Drop(_) => {}
                Action::Reply(frames) => out.extend(frames.into_iter().map(Reply::Frame)),
                Action::Io(io) => batch.push(io, frame, &mut pool),
            }), if in_flight < MAX_IN_FLIGHT => {
                in_flight += batch.start(&volumes, &mut pool, &mut out, &later_tx);
                if let Err(e) = r {
                    failures += 1;
                    warn!(link = %name, "AoE: cannot receive: {e}");
                    if failures > 100 {
                        warn!(link = %name, "AoE: giving up on this link");
                        return;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                } else {
                    failures = 0;
                }
            }
            Some(f) = later.recv() => {
                let mut answered = usize::from(f.answers());
                out.push(f);
                while let Ok(f) = later.try_recv() {
                    answered += usize::from(f.answers());
                    out.push(f);
                }
                in_flight = in_flight.saturating_sub(answered);
            }
        }
        while let Some(ev) = target.poll_event() {
            if let TargetEvent::ConfigChanged { device, config } = ev {
                info!(link = %name, device = %device, "AoE config string set ({} bytes)", config.len());
                if let Some(Device {
                    state_file: Some(file),
                    ..
                }) = volumes.get(&device)
                {
                    if let Err(e) = save_config_string(file, &config) {
                        warn!(device = %device, file = %file.display(), "AoE: cannot keep the config string: {e}");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The I/O requests and their frames of `reqs`, as a target at MTU
    /// 1500 sees them from one initiator.
    fn requests(reqs: Vec<ethersan_aoe::initiator::AtaRequest>) -> Vec<(IoRequest, Vec<u8>)> {
        use ethersan_aoe::initiator::{
            parse_config_response, query_config_frame, Initiator, InitiatorConfig,
        };
        let (me, them) = (Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]));
        let addr = DeviceAddr::new(1, 1);
        let mut target = AoeTarget::new(TargetConfig::new(me, 1500));
        target.add_device(addr, DeviceConfig::new(4096)).unwrap();
        let q = query_config_frame(
            them,
            me,
            1,
            1,
            ethersan_aoe::config::ConfigCommand::Read,
            b"",
            7,
        );
        let Action::Reply(answer) = target.handle(&q) else {
            panic!("no config answer")
        };
        let info = parse_config_response(&answer[0]).unwrap();
        let mut cfg = InitiatorConfig::new(them);
        (cfg.initial_window, cfg.max_window) = (64, 64);
        let mut init = Initiator::new(cfg, info);
        for r in reqs {
            init.submit(r).unwrap();
        }
        let now = std::time::Instant::now();
        std::iter::from_fn(|| init.poll_transmit(now))
            .map(|f| match target.handle(&f) {
                Action::Io(io) => (io, f.to_vec()),
                _ => panic!("not an I/O"),
            })
            .collect()
    }

    #[test]
    fn runs_gather_consecutive_frames_in_or_out_of_order() {
        use ethersan_aoe::initiator::AtaRequest;
        let data: Vec<u8> = (0..8 * 512).map(|i| (i * 7 % 251) as u8).collect();
        // Four 1 KiB writes of one 4 KiB block, then a read of 8 sectors
        // elsewhere, and a write that does not continue the first.
        let mut reqs: Vec<AtaRequest> = data
            .chunks(1024)
            .enumerate()
            .map(|(i, c)| AtaRequest::Write {
                lba: 64 + 2 * i as u64,
                data: c.to_vec(),
            })
            .collect();
        reqs.push(AtaRequest::Read { lba: 8, sectors: 2 });
        reqs.push(AtaRequest::Read {
            lba: 10,
            sectors: 2,
        });
        reqs.push(AtaRequest::Write {
            lba: 200,
            data: data[..1024].to_vec(),
        });
        let frames = requests(reqs);
        for order in [[0, 1, 2, 3, 4, 5, 6], [3, 1, 0, 6, 2, 5, 4]] {
            let (mut batch, mut pool) = (IoBatch::default(), Pool::default());
            for i in order {
                let (io, f) = frames[i].clone();
                batch.push(io, &f, &mut pool);
            }
            let runs = batch.take_runs(&mut pool);
            let got: Vec<(u64, u64, usize)> = runs
                .iter()
                .map(|r| (r.first, r.next, r.members.len()))
                .collect();
            // Reads first, then writes, each run one volume call.
            assert_eq!(got, [(8, 12, 2), (64, 72, 4), (200, 202, 1)], "{order:?}");
            assert!(runs[0].data.is_empty());
            assert_eq!(
                runs[1].data, data,
                "{order:?}: the block's data in LBA order"
            );
            assert_eq!(runs[2].data, data[..1024]);
        }
    }

    #[test]
    fn default_addresses_and_their_limits() {
        assert_eq!(
            address("t", 0, 3, AoeAddress::Default).unwrap(),
            Some(DeviceAddr::new(0, 3))
        );
        assert_eq!(
            address("t", 2, 0, AoeAddress::At { shelf: 9, slot: 1 }).unwrap(),
            Some(DeviceAddr::new(9, 1))
        );
        assert_eq!(address("t", 0, 0, AoeAddress::Off).unwrap(), None);
        assert!(matches!(
            address("t", 0, 255, AoeAddress::Default),
            Err(AoeError::NoSlot { .. })
        ));
    }

    #[test]
    fn a_unix_link_keeps_its_mac() {
        let a = mac_for(Path::new("/run/ethersan/aoe.sock"));
        assert_eq!(a, mac_for(Path::new("/run/ethersan/aoe.sock")));
        assert_ne!(a, mac_for(Path::new("/run/ethersan/aoe2.sock")));
        assert!(a.is_unicast() && a.is_locally_administered());
    }

    #[test]
    fn the_config_string_is_kept_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("d.img.aoe");
        assert_eq!(load_config_string(&f), None);
        save_config_string(&f, b"my disk \x00\xff").unwrap();
        assert_eq!(
            load_config_string(&f).as_deref(),
            Some(&b"my disk \x00\xff"[..])
        );
        std::fs::write(&f, "config_string_hex = \"zz\"\n").unwrap();
        assert_eq!(load_config_string(&f), None);
    }
}
