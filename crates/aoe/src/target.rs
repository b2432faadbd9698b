//! The AoE target (AoE r11 §2–§3 from the server's side): a synchronous
//! state machine holding the exported devices, fed one received frame at a
//! time by [`AoeTarget::handle`], answering with an [`Action`]: drop it,
//! send reply frames, or carry out an I/O request and later turn its
//! [`Pending`] into the response.
//!
//! No I/O and no clock: the front end owns the link and the volumes. A
//! read's response frame is allocated by [`Pending::prepare_read`] so the
//! volume can read straight into it; a write's data is a range of the
//! request frame the front end already holds.
//!
//! Decisions where AoE r11 leaves room, and why:
//! - Frames from MACs not on a non-empty MAC mask list are dropped without
//!   a reply, whatever the command (§3.3; as vblade does).
//! - ATA commands need a unique address: one sent to a broadcast shelf or
//!   slot is dropped (its reply could not say which device answered, and
//!   an I/O would hit every disk). Query Config, MAC mask and
//!   reserve/release commands apply to every matching device, one reply
//!   each.
//! - A reserved device answers every ATA command from an unlisted MAC with
//!   error 6 (vblade exempts IDENTIFY; we do not, so an unlisted host never
//!   brings up a disk it cannot use). Config queries stay open to all.
//! - Query Config Set to the string already present succeeds: a retransmit
//!   of a Set whose reply was lost must not fail with error 4.
//! - The ATA W flag must agree with the command's direction, else error 2.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use crate::ata::{self, AtaCommand, IdentifyParams};
use crate::config::{ConfigArg, ConfigCommand, MAX_CONFIG_LEN};
use crate::frame::{
    self, pad, Command, DecodeError, ErrorCode, Header, Mac, AOE_VERSION, HEADER_LEN,
};
use crate::issue::{AtaArg, ATA_ARG_LEN, ATA_HEADER_LEN, SECTOR_SIZE};
use crate::mask::{Directive, DirectiveCommand, MaskArg, MaskCommand, MaskError, MASK_ARG_LEN};
use crate::message;
use crate::reserve::{ReserveArg, ReserveCommand, RESERVE_ARG_LEN};

mod io;
#[cfg(test)]
mod tests;

pub use io::{IoFailure, IoOp, IoRequest, Pending};

/// Most MACs a device's MAC mask list holds (an edit beyond gets MError 3).
pub const MAX_MASK_MACS: usize = 64;
/// Most MACs a reserve list holds (a longer Set gets error 2).
pub const MAX_RESERVE_MACS: usize = 64;
/// Default buffer count: frames the target can have queued.
pub const DEFAULT_BUFFER_COUNT: u16 = 16;
/// Firmware version reported in config responses.
pub const FIRMWARE_VERSION: u16 = 0x0001;

/// The largest sector count one ATA frame can carry on a link with this
/// MTU: the Ethernet payload minus the AoE (10) and ATA (12) headers, in
/// whole 512-byte sectors (2 at MTU 1500, 17 at 9000), at most 255.
/// (vblade and the Linux driver also subtract the 14-byte Ethernet header,
/// which the MTU does not include; the results differ only for MTUs just
/// above a sector boundary, and the Linux driver uses the smaller of its
/// own figure and ours.)
pub fn max_sectors_for_mtu(mtu: usize) -> u8 {
    (mtu.saturating_sub(HEADER_LEN - frame::ETH_HEADER_LEN + ATA_ARG_LEN) / SECTOR_SIZE).min(255)
        as u8
}

/// A device's AoE address: shelf (major) and slot (minor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceAddr {
    /// Shelf, 0..=0xFFFE.
    pub shelf: u16,
    /// Slot, 0..=0xFE.
    pub slot: u8,
}

impl DeviceAddr {
    /// Shelf `shelf`, slot `slot`.
    pub fn new(shelf: u16, slot: u8) -> DeviceAddr {
        DeviceAddr { shelf, slot }
    }

    /// Whether a request addressed to `shelf`/`slot` (wildcards allowed)
    /// is for this device.
    pub fn matches(&self, shelf: u16, slot: u8) -> bool {
        (shelf == frame::BROADCAST_SHELF || shelf == self.shelf)
            && (slot == frame::BROADCAST_SLOT || slot == self.slot)
    }
}

impl fmt::Display for DeviceAddr {
    /// The Linux driver's name for it: `e<shelf>.<slot>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}.{}", self.shelf, self.slot)
    }
}

/// One exported device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Capacity in 512-byte sectors.
    pub sectors: u64,
    /// Writes are refused (ATA ABRT).
    pub read_only: bool,
    /// IDENTIFY model string (40 characters at most).
    pub model: String,
    /// IDENTIFY serial string (20 characters at most).
    pub serial: String,
    /// IDENTIFY firmware string (8 characters at most).
    pub firmware: String,
    /// The volatile write cache is on (reported in IDENTIFY word 85).
    pub write_cache: bool,
    /// The config string (§3.2), at most 1024 bytes.
    pub config_string: Vec<u8>,
    /// The MAC mask list (§3.3); empty admits everyone.
    pub mask: Vec<Mac>,
    /// The reserve list (§3.4); empty means not reserved.
    pub reservation: Vec<Mac>,
}

impl DeviceConfig {
    /// A writable device of `sectors` sectors, write cache on, generic
    /// identity strings and empty lists. Front ends should set a serial
    /// unique to the device (vblade uses `shelf.slot:hostname`): hosts
    /// tell multipath copies of a disk apart by it.
    pub fn new(sectors: u64) -> DeviceConfig {
        DeviceConfig {
            sectors,
            read_only: false,
            model: "ethersan AoE".into(),
            serial: String::new(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            write_cache: true,
            config_string: Vec::new(),
            mask: Vec::new(),
            reservation: Vec::new(),
        }
    }
}

/// The target's own parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetConfig {
    /// The MAC replies come from (and unicast requests go to).
    pub mac: Mac,
    /// Buffer count advertised in config responses.
    pub buffer_count: u16,
    /// Most sectors per ATA command (see [`max_sectors_for_mtu`]).
    pub max_sectors: u8,
    /// Firmware version advertised in config responses.
    pub firmware_version: u16,
}

impl TargetConfig {
    /// Defaults for a link with MAC `mac` and MTU `mtu`.
    pub fn new(mac: Mac, mtu: usize) -> TargetConfig {
        TargetConfig {
            mac,
            buffer_count: DEFAULT_BUFFER_COUNT,
            max_sectors: max_sectors_for_mtu(mtu),
            firmware_version: FIRMWARE_VERSION,
        }
    }
}

/// Why a device could not be added or changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// Shelf 0xFFFF and slot 0xFF are the broadcast addresses.
    #[error("{0} uses a broadcast shelf or slot")]
    BroadcastAddress(DeviceAddr),
    /// Two devices at one address.
    #[error("{0} is already exported")]
    Exists(DeviceAddr),
    /// No device at that address.
    #[error("no device {0}")]
    NoDevice(DeviceAddr),
    /// Config string over 1024 bytes.
    #[error("config string of {0} bytes exceeds 1024")]
    ConfigTooLong(usize),
    /// A MAC list longer than its limit.
    #[error("{what} of {len} MACs exceeds {max}")]
    ListTooLong {
        /// Which list.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More sectors than LBA48 addresses.
    #[error("{0} sectors exceed what LBA48 addresses")]
    TooLarge(u64),
}

/// Why [`AoeTarget::handle`] sent nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropReason {
    /// Not a decodable AoE frame (or an argument too broken to answer).
    Malformed(DecodeError),
    /// Addressed to another MAC.
    NotForUs,
    /// A response (targets only take requests).
    Response,
    /// The source is a group address; there is no one to answer.
    BadSource,
    /// No exported device at that shelf/slot.
    NoDevice,
    /// Every matching device's MAC mask list excludes the sender.
    Masked,
    /// A config test or prefix test that did not match.
    ConfigMismatch,
    /// An ATA command sent to a broadcast shelf or slot.
    BroadcastAta,
}

/// What to do with a received frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send nothing.
    Drop(DropReason),
    /// Send these frames (padded, ready for the wire; one per answering
    /// device).
    Reply(Vec<Vec<u8>>),
    /// Carry out this I/O, then build the response with
    /// [`Pending::complete`].
    Io(IoRequest),
}

/// Something the front end should know about: state that must survive a
/// restart changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetEvent {
    /// An initiator set a device's config string.
    ConfigChanged {
        /// The device.
        device: DeviceAddr,
        /// The new string.
        config: Vec<u8>,
    },
    /// An initiator edited a device's MAC mask list.
    MaskChanged {
        /// The device.
        device: DeviceAddr,
        /// The new list.
        mask: Vec<Mac>,
    },
    /// An initiator reserved or released a device.
    ReservationChanged {
        /// The device.
        device: DeviceAddr,
        /// The new reserve list (empty: released).
        reservation: Vec<Mac>,
    },
}

#[derive(Debug)]
struct Device {
    config: DeviceConfig,
    available: bool,
}

impl Device {
    fn admits(&self, mac: Mac) -> bool {
        self.config.mask.is_empty() || self.config.mask.contains(&mac)
    }

    fn reserved_against(&self, mac: Mac) -> bool {
        !self.config.reservation.is_empty() && !self.config.reservation.contains(&mac)
    }
}

/// The AoE target: every device exported on one link.
#[derive(Debug)]
pub struct AoeTarget {
    cfg: TargetConfig,
    devices: BTreeMap<DeviceAddr, Device>,
    events: VecDeque<TargetEvent>,
}

impl AoeTarget {
    /// A target with no devices.
    pub fn new(cfg: TargetConfig) -> AoeTarget {
        AoeTarget {
            cfg,
            devices: BTreeMap::new(),
            events: VecDeque::new(),
        }
    }

    /// The target's parameters.
    pub fn config(&self) -> &TargetConfig {
        &self.cfg
    }

    /// Export a device at `addr`.
    pub fn add_device(
        &mut self,
        addr: DeviceAddr,
        config: DeviceConfig,
    ) -> Result<(), TargetError> {
        if addr.shelf == frame::BROADCAST_SHELF || addr.slot == frame::BROADCAST_SLOT {
            return Err(TargetError::BroadcastAddress(addr));
        }
        if self.devices.contains_key(&addr) {
            return Err(TargetError::Exists(addr));
        }
        if config.sectors > ata::LBA48_LIMIT {
            return Err(TargetError::TooLarge(config.sectors));
        }
        if config.config_string.len() > MAX_CONFIG_LEN {
            return Err(TargetError::ConfigTooLong(config.config_string.len()));
        }
        for (what, len, max) in [
            ("MAC mask list", config.mask.len(), MAX_MASK_MACS),
            ("reserve list", config.reservation.len(), MAX_RESERVE_MACS),
        ] {
            if len > max {
                return Err(TargetError::ListTooLong { what, len, max });
            }
        }
        self.devices.insert(
            addr,
            Device {
                config,
                available: true,
            },
        );
        Ok(())
    }

    /// Stop exporting `addr`, returning its state.
    pub fn remove_device(&mut self, addr: DeviceAddr) -> Option<DeviceConfig> {
        self.devices.remove(&addr).map(|d| d.config)
    }

    /// A device's current state (config string, lists and all).
    pub fn device(&self, addr: DeviceAddr) -> Option<&DeviceConfig> {
        self.devices.get(&addr).map(|d| &d.config)
    }

    /// Every device, in address order.
    pub fn devices(&self) -> impl Iterator<Item = (DeviceAddr, &DeviceConfig)> {
        self.devices.iter().map(|(a, d)| (*a, &d.config))
    }

    /// Mark a device (un)available: while unavailable it answers ATA
    /// commands with error 3.
    pub fn set_available(&mut self, addr: DeviceAddr, available: bool) -> Result<(), TargetError> {
        self.devices
            .get_mut(&addr)
            .ok_or(TargetError::NoDevice(addr))?
            .available = available;
        Ok(())
    }

    /// Change a device's capacity (the volume was resized).
    pub fn set_capacity(&mut self, addr: DeviceAddr, sectors: u64) -> Result<(), TargetError> {
        if sectors > ata::LBA48_LIMIT {
            return Err(TargetError::TooLarge(sectors));
        }
        self.devices
            .get_mut(&addr)
            .ok_or(TargetError::NoDevice(addr))?
            .config
            .sectors = sectors;
        Ok(())
    }

    /// The next state change to persist, if any.
    pub fn poll_event(&mut self) -> Option<TargetEvent> {
        self.events.pop_front()
    }

    /// Unsolicited config responses announcing every device (send them at
    /// start-up so initiators find the devices without polling): broadcast,
    /// or one per listed MAC for a device with a MAC mask list.
    pub fn announce(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for (addr, dev) in &self.devices {
            let dsts = if dev.config.mask.is_empty() {
                vec![Mac::BROADCAST]
            } else {
                dev.config.mask.clone()
            };
            for dst in dsts {
                let mut h =
                    Header::request(dst, self.cfg.mac, addr.shelf, addr.slot, Command::Config, 0);
                h.response = true;
                out.push(self.config_frame(h, ConfigCommand::Read, &dev.config.config_string));
            }
        }
        out
    }

    /// Take one received frame and say what to do.
    pub fn handle(&mut self, frame: &[u8]) -> Action {
        let h = match Header::decode(frame) {
            Ok(h) => h,
            Err(e) => return Action::Drop(DropReason::Malformed(e)),
        };
        if h.dst != self.cfg.mac && h.dst != Mac::BROADCAST {
            return Action::Drop(DropReason::NotForUs);
        }
        if h.response {
            return Action::Drop(DropReason::Response);
        }
        if h.src.is_multicast() {
            return Action::Drop(DropReason::BadSource);
        }
        // A unicast address is one map lookup; only wildcards scan.
        let matching: Vec<DeviceAddr> = if h.is_broadcast_address() {
            self.devices
                .keys()
                .copied()
                .filter(|a| a.matches(h.shelf, h.slot))
                .collect()
        } else {
            let a = DeviceAddr::new(h.shelf, h.slot);
            if self.devices.contains_key(&a) {
                vec![a]
            } else {
                Vec::new()
            }
        };
        if matching.is_empty() {
            return Action::Drop(DropReason::NoDevice);
        }
        let admitted: Vec<DeviceAddr> = matching
            .into_iter()
            .filter(|a| self.devices[a].admits(h.src))
            .collect();
        if admitted.is_empty() {
            return Action::Drop(DropReason::Masked);
        }
        if h.version != AOE_VERSION {
            return self.error_replies(&h, &admitted, ErrorCode::UnsupportedVersion, &[]);
        }
        let Some(command) = Command::from_u8(h.command) else {
            return self.error_replies(&h, &admitted, ErrorCode::UnrecognizedCommand, &[]);
        };
        if command == Command::Ata && h.is_broadcast_address() {
            return Action::Drop(DropReason::BroadcastAta);
        }
        let arg = &frame[HEADER_LEN..];
        let fixed_len = match command {
            Command::Ata => ATA_ARG_LEN,
            Command::Config => crate::config::CONFIG_ARG_LEN,
            Command::MacMask => MASK_ARG_LEN,
            Command::Reserve => RESERVE_ARG_LEN,
        };
        let echo = &arg[..arg.len().min(fixed_len)];
        let decoded = message::decode(frame);
        let message = match decoded {
            Ok(f) => f.message,
            Err(e) if e.is_argument_error() => {
                return self.error_replies(&h, &admitted, ErrorCode::BadArgument, echo)
            }
            Err(e) => return Action::Drop(DropReason::Malformed(e)),
        };
        match message {
            message::Message::Ata(a) => self.ata(&h, admitted[0], &a),
            message::Message::Config(c) => {
                let replies: Vec<Vec<u8>> = admitted
                    .iter()
                    .filter_map(|a| self.query_config(&h, *a, &c))
                    .collect();
                if replies.is_empty() {
                    Action::Drop(DropReason::ConfigMismatch)
                } else {
                    Action::Reply(replies)
                }
            }
            message::Message::MacMask(m) => {
                Action::Reply(admitted.iter().map(|a| self.mac_mask(&h, *a, &m)).collect())
            }
            message::Message::Reserve(r) => {
                Action::Reply(admitted.iter().map(|a| self.reserve(&h, *a, &r)).collect())
            }
        }
    }

    fn error_replies(
        &self,
        h: &Header,
        devices: &[DeviceAddr],
        code: ErrorCode,
        echo: &[u8],
    ) -> Action {
        Action::Reply(
            devices
                .iter()
                .map(|a| self.error_frame(h, *a, code, echo))
                .collect(),
        )
    }

    fn error_frame(&self, h: &Header, a: DeviceAddr, code: ErrorCode, echo: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(frame::MIN_FRAME_LEN);
        h.response(self.cfg.mac, a.shelf, a.slot)
            .with_error(code)
            .encode(&mut out);
        out.extend_from_slice(echo);
        pad(&mut out);
        out
    }

    /// §3.1 Issue ATA Command, for one device.
    fn ata(&self, h: &Header, addr: DeviceAddr, a: &AtaArg<'_>) -> Action {
        let max_sectors = self.cfg.max_sectors;
        let dev = &self.devices[&addr];
        let fixed = a.fixed_bytes();
        if !dev.available {
            return Action::Reply(vec![self.error_frame(
                h,
                addr,
                ErrorCode::DeviceUnavailable,
                &fixed,
            )]);
        }
        if dev.reserved_against(h.src) {
            return Action::Reply(vec![self.error_frame(
                h,
                addr,
                ErrorCode::TargetReserved,
                &fixed,
            )]);
        }
        let rh = h.response(self.cfg.mac, addr.shelf, addr.slot);
        let reply = |status: u8, error: u8, count: u8, data: &[u8]| {
            let mut out = Vec::with_capacity(ATA_HEADER_LEN + data.len());
            rh.encode(&mut out);
            AtaArg {
                err_feature: error,
                sector_count: count,
                cmd_status: status,
                data,
                ..*a
            }
            .encode(&mut out);
            pad(&mut out);
            Action::Reply(vec![out])
        };
        let ok = ata::STATUS_DRDY;
        let failed = ata::STATUS_DRDY | ata::STATUS_ERR;
        let Some(cmd) = AtaCommand::from_opcode(a.cmd_status) else {
            return reply(failed, ata::ERROR_ABRT, a.sector_count, &[]);
        };
        let pending = |read: bool| Pending {
            header: rh,
            flags: a.flags,
            lba: a.lba,
            sectors: a.sector_count,
            read,
        };
        let (lba, write) = match cmd {
            AtaCommand::Identify => {
                let id = ata::identify_data(&IdentifyParams {
                    sectors: dev.config.sectors,
                    model: &dev.config.model,
                    serial: &dev.config.serial,
                    firmware: &dev.config.firmware,
                    write_cache: dev.config.write_cache,
                });
                return reply(ok, 0, 0, &id);
            }
            AtaCommand::CheckPowerMode => return reply(ok, 0, ata::POWER_ACTIVE_OR_IDLE, &[]),
            AtaCommand::Flush if dev.config.read_only => return reply(ok, 0, 0, &[]),
            AtaCommand::Flush => {
                return Action::Io(IoRequest {
                    device: addr,
                    op: IoOp::Flush,
                    pending: pending(false),
                });
            }
            AtaCommand::Read { .. } => (cmd.effective_lba(a.lba), false),
            AtaCommand::Write { .. } => (cmd.effective_lba(a.lba), true),
        };
        if a.flags.write() != write {
            return Action::Reply(vec![self.error_frame(
                h,
                addr,
                ErrorCode::BadArgument,
                &fixed,
            )]);
        }
        if write && dev.config.read_only {
            return reply(failed, ata::ERROR_ABRT, a.sector_count, &[]);
        }
        // More sectors than one frame may carry (we advertised max_sectors):
        // the command is invalid as a whole, so ABRT. IDNF would claim an
        // address problem, and the address may well be fine.
        if a.sector_count > max_sectors {
            return reply(failed, ata::ERROR_ABRT, a.sector_count, &[]);
        }
        // Past the end: IDNF, the ATA error for an address the device does
        // not have (what disks and vblade answer).
        if lba + u64::from(a.sector_count) > dev.config.sectors {
            return reply(failed, ata::ERROR_IDNF, a.sector_count, &[]);
        }
        if a.sector_count == 0 {
            return reply(ok, 0, 0, &[]);
        }
        let sectors = a.sector_count;
        let op = if write {
            let start = ATA_HEADER_LEN;
            IoOp::Write {
                lba,
                sectors,
                data: start..start + a.data.len(),
                asynchronous: a.flags.asynchronous(),
            }
        } else {
            IoOp::Read { lba, sectors }
        };
        Action::Io(IoRequest {
            device: addr,
            op,
            pending: pending(!write),
        })
    }

    fn config_frame(&self, rh: Header, command: ConfigCommand, config: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + 8 + config.len());
        rh.encode(&mut out);
        ConfigArg {
            buffer_count: self.cfg.buffer_count,
            firmware_version: self.cfg.firmware_version,
            sector_count: self.cfg.max_sectors,
            aoe_version: AOE_VERSION,
            command,
            config,
        }
        .encode(&mut out);
        pad(&mut out);
        out
    }

    /// §3.2 Query Config Information, for one device. `None`: a test that
    /// did not match (no reply).
    fn query_config(&mut self, h: &Header, addr: DeviceAddr, c: &ConfigArg<'_>) -> Option<Vec<u8>> {
        let rh = h.response(self.cfg.mac, addr.shelf, addr.slot);
        let dev = self.devices.get_mut(&addr)?;
        let current = &mut dev.config.config_string;
        let mut changed = false;
        match c.command {
            ConfigCommand::Read => {}
            ConfigCommand::Test if current.as_slice() != c.config => return None,
            ConfigCommand::TestPrefix if !current.starts_with(c.config) => return None,
            ConfigCommand::Test | ConfigCommand::TestPrefix => {}
            ConfigCommand::Set if !current.is_empty() && current.as_slice() != c.config => {
                let current = current.clone();
                return Some(self.config_frame(
                    rh.with_error(ErrorCode::ConfigStringPresent),
                    c.command,
                    &current,
                ));
            }
            ConfigCommand::Set | ConfigCommand::ForceSet => {
                changed = current.as_slice() != c.config;
                *current = c.config.to_vec();
            }
        }
        let current = dev.config.config_string.clone();
        if changed {
            self.events.push_back(TargetEvent::ConfigChanged {
                device: addr,
                config: current.clone(),
            });
        }
        Some(self.config_frame(rh, c.command, &current))
    }

    /// §3.3 MAC Mask List, for one device. Directives apply in order; the
    /// first bad one stops the edit (those before it stay applied) and the
    /// reply carries MError, the applied directives and, as their count,
    /// the failing directive's index.
    fn mac_mask(&mut self, h: &Header, addr: DeviceAddr, m: &MaskArg<'_>) -> Vec<u8> {
        let rh = h.response(self.cfg.mac, addr.shelf, addr.slot);
        let Some(dev) = self.devices.get_mut(&addr) else {
            return Vec::new();
        };
        let before = dev.config.mask.clone();
        let mut failure = None;
        if m.command == MaskCommand::Edit {
            for (i, d) in m.directives().enumerate() {
                let list = &mut dev.config.mask;
                match DirectiveCommand::from_u8(d.command) {
                    Some(DirectiveCommand::None) => {}
                    Some(DirectiveCommand::Add) if list.contains(&d.mac) => {}
                    Some(DirectiveCommand::Add) if list.len() >= MAX_MASK_MACS => {
                        failure = Some((MaskError::ListFull, i))
                    }
                    Some(DirectiveCommand::Add) => list.push(d.mac),
                    Some(DirectiveCommand::Delete) => list.retain(|x| *x != d.mac),
                    None => failure = Some((MaskError::BadDirective, i)),
                }
                if failure.is_some() {
                    break;
                }
            }
        }
        let mask = dev.config.mask.clone();
        if mask != before {
            self.events.push_back(TargetEvent::MaskChanged {
                device: addr,
                mask: mask.clone(),
            });
        }
        let mut out = Vec::with_capacity(HEADER_LEN + 4 + 8 * mask.len());
        rh.encode(&mut out);
        match failure {
            // The applied directives are echoed, so Dir Count is both their
            // number and the index of the one that failed.
            Some((err, i)) => {
                let applied: Vec<Directive> = m.directives().take(i).collect();
                MaskArg::encode(m.command, err as u8, &applied, &mut out);
            }
            None => {
                let dirs: Vec<Directive> = mask
                    .iter()
                    .map(|&mac| Directive::new(DirectiveCommand::None, mac))
                    .collect();
                MaskArg::encode(m.command, 0, &dirs, &mut out);
            }
        }
        pad(&mut out);
        out
    }

    /// §3.4 Reserve/Release, for one device.
    fn reserve(&mut self, h: &Header, addr: DeviceAddr, r: &ReserveArg<'_>) -> Vec<u8> {
        let mut rh = h.response(self.cfg.mac, addr.shelf, addr.slot);
        let Some(dev) = self.devices.get_mut(&addr) else {
            return Vec::new();
        };
        let new: Vec<Mac> = r.macs().collect();
        let allowed = match r.command {
            ReserveCommand::Read => false,
            ReserveCommand::Set if dev.reserved_against(h.src) => {
                rh = rh.with_error(ErrorCode::TargetReserved);
                false
            }
            ReserveCommand::Set | ReserveCommand::ForceSet if new.len() > MAX_RESERVE_MACS => {
                rh = rh.with_error(ErrorCode::BadArgument);
                false
            }
            ReserveCommand::Set | ReserveCommand::ForceSet => true,
        };
        if allowed && dev.config.reservation != new {
            dev.config.reservation = new;
            self.events.push_back(TargetEvent::ReservationChanged {
                device: addr,
                reservation: dev.config.reservation.clone(),
            });
        }
        let mut out = Vec::with_capacity(HEADER_LEN + 2 + 6 * dev.config.reservation.len());
        rh.encode(&mut out);
        ReserveArg::encode(r.command, &dev.config.reservation, &mut out);
        pad(&mut out);
        out
    }
}
