//! The AoE initiator's state towards one target device (AoE r11 §1.1:
//! messages are unreliable, so the client numbers, times and retransmits
//! its own commands), plus discovery (§3.2) and IDENTIFY helpers.
//!
//! Sans I/O: [`Initiator::submit`] queues a command, [`poll_transmit`]
//! hands out frames as the window allows, [`on_frame`] matches responses by
//! tag and source, [`poll_timeout`]/[`on_timeout`] drive retransmission.
//! Time is always an argument.
//!
//! A retransmission reuses the command's tag (the Linux driver issues a new
//! one; reusing it lets a late answer to the first transmission complete
//! the command). Karn's rule follows: only commands sent once yield RTT
//! samples. Each retransmission doubles that command's timeout; after
//! `max_retries` it fails.
//!
//! [`poll_transmit`]: Initiator::poll_transmit
//! [`on_frame`]: Initiator::on_frame
//! [`poll_timeout`]: Initiator::poll_timeout
//! [`on_timeout`]: Initiator::on_timeout

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ata;
use crate::config::{ConfigArg, ConfigCommand};
use crate::frame::{self, pad, Command, DecodeError, ErrorCode, Header, Mac, HEADER_LEN};
use crate::issue::{AtaArg, AtaFlags, ATA_HEADER_LEN, SECTOR_SIZE};
use crate::message::{self, Message};
use crate::rtt::RttEstimator;
use crate::target::max_sectors_for_mtu;
use crate::window::SendWindow;

#[cfg(test)]
mod tests;

/// A read query for every device on the segment: broadcast MAC, shelf
/// 0xFFFF, slot 0xFF. Each device answers with its config (see
/// [`parse_config_response`]).
pub fn discovery_frame(local_mac: Mac, tag: u32) -> Vec<u8> {
    query_config_frame(
        local_mac,
        Mac::BROADCAST,
        frame::BROADCAST_SHELF,
        frame::BROADCAST_SLOT,
        ConfigCommand::Read,
        b"",
        tag,
    )
}

/// A Query Config Information request.
pub fn query_config_frame(
    local_mac: Mac,
    dst: Mac,
    shelf: u16,
    slot: u8,
    command: ConfigCommand,
    config: &[u8],
    tag: u32,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(frame::MIN_FRAME_LEN + config.len());
    Header::request(dst, local_mac, shelf, slot, Command::Config, tag).encode(&mut out);
    ConfigArg::request(command, config).encode(&mut out);
    pad(&mut out);
    out
}

/// A target device as its config response describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetInfo {
    /// Where to send its commands.
    pub mac: Mac,
    /// Its shelf.
    pub shelf: u16,
    /// Its slot.
    pub slot: u8,
    /// Commands it can queue: the initiator's window never exceeds it.
    pub buffer_count: u16,
    /// Most sectors per ATA command (0 on the wire already mapped to 2).
    pub max_sectors: u8,
    /// Its firmware version.
    pub firmware_version: u16,
    /// The AoE version it speaks.
    pub aoe_version: u8,
    /// Its config string.
    pub config: Vec<u8>,
}

/// Why a frame is not a usable response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// Not a well-formed AoE frame.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A request, or a response to another command.
    #[error("not a Query Config response")]
    NotConfigResponse,
    /// The target answered with an AoE error.
    #[error("target answered AoE error {0}")]
    Aoe(u8),
    /// A response may not come from a broadcast shelf or slot.
    #[error("response from broadcast address e{0}.{1}")]
    BroadcastAddress(u16, u8),
}

/// Parse a Query Config response (to discovery or any query).
pub fn parse_config_response(frame: &[u8]) -> Result<TargetInfo, ResponseError> {
    let f = message::decode(frame)?;
    let Message::Config(c) = f.message else {
        return Err(ResponseError::NotConfigResponse);
    };
    let h = f.header;
    if !h.response {
        return Err(ResponseError::NotConfigResponse);
    }
    if h.error_flag {
        return Err(ResponseError::Aoe(h.error));
    }
    if h.is_broadcast_address() {
        return Err(ResponseError::BroadcastAddress(h.shelf, h.slot));
    }
    Ok(TargetInfo {
        mac: h.src,
        shelf: h.shelf,
        slot: h.slot,
        buffer_count: c.buffer_count,
        // §3.2: a sector count of 0 means 2, for old targets.
        max_sectors: if c.sector_count == 0 {
            2
        } else {
            c.sector_count
        },
        firmware_version: c.firmware_version,
        aoe_version: c.aoe_version,
        config: c.config.to_vec(),
    })
}

/// Tunables of an [`Initiator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitiatorConfig {
    /// This host's MAC on the link.
    pub local_mac: Mac,
    /// The link's MTU (bounds sectors per frame together with the target).
    pub mtu: usize,
    /// Window at start.
    pub initial_window: u32,
    /// Window ceiling besides the target's buffer count.
    pub max_window: u32,
    /// RTO before the first sample.
    pub initial_rto: Duration,
    /// RTO floor.
    pub min_rto: Duration,
    /// RTO ceiling (also for backed-off retransmissions).
    pub max_rto: Duration,
    /// Retransmissions of one command before it fails.
    pub max_retries: u32,
    /// The first tag. Seed it from a clock or a random source, so that a
    /// restarted client does not take a late answer meant for its previous
    /// run as the answer to a new command.
    pub initial_tag: u32,
}

impl InitiatorConfig {
    /// Defaults: MTU 1500, window 2 up to 64, RTO 250 ms at first, within
    /// 10 ms..5 s, 8 retransmissions.
    pub fn new(local_mac: Mac) -> InitiatorConfig {
        InitiatorConfig {
            local_mac,
            mtu: 1500,
            initial_window: 2,
            max_window: 64,
            initial_rto: Duration::from_millis(250),
            min_rto: Duration::from_millis(10),
            max_rto: Duration::from_secs(5),
            max_retries: 8,
            initial_tag: 1,
        }
    }
}

/// An ATA command to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtaRequest {
    /// IDENTIFY DEVICE: 512 bytes back (see [`ata::parse_identify`]).
    Identify,
    /// CHECK POWER MODE: the mode comes back in the sector count.
    CheckPowerMode,
    /// FLUSH CACHE (EXT when LBA48).
    Flush,
    /// READ SECTORS (EXT when LBA48).
    Read {
        /// First sector.
        lba: u64,
        /// Sectors (1..=[`Initiator::max_sectors`]).
        sectors: u8,
    },
    /// WRITE SECTORS (EXT when LBA48).
    Write {
        /// First sector.
        lba: u64,
        /// Whole sectors, at most [`Initiator::max_sectors`].
        data: Vec<u8>,
    },
}

/// Why a command was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Zero sectors, or write data not a whole number of sectors.
    #[error("{0} bytes is not a positive whole number of 512-byte sectors")]
    BadLength(usize),
    /// More sectors than one frame carries.
    #[error("{sectors} sectors exceed the {max} one frame carries")]
    TooManySectors {
        /// Asked for.
        sectors: usize,
        /// Allowed.
        max: u8,
    },
    /// The range is beyond what the addressing mode reaches.
    #[error("sectors {lba}+{sectors} are beyond LBA{bits}")]
    OutOfRange {
        /// First sector.
        lba: u64,
        /// Count.
        sectors: u8,
        /// 28 or 48.
        bits: u8,
    },
}

/// Identifies a submitted command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Handle(pub u64);

/// A successful command's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtaReply {
    /// Where the data (a read's sectors, IDENTIFY's 512 bytes) lies in the
    /// frame given to [`Initiator::on_frame`]; empty for other commands.
    pub data: Range<usize>,
    /// ATA status register.
    pub status: u8,
    /// Sector count register (CHECK POWER MODE's answer).
    pub sector_count: u8,
}

/// Why a command failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The target answered with an AoE error (§2.4).
    #[error("AoE error {code}: {}", ErrorCode::from_u8(*code).map_or_else(|| "unknown".to_string(), |e| e.to_string()))]
    Aoe {
        /// The error code.
        code: u8,
    },
    /// The ATA command failed.
    #[error("ATA status {status:#04x}, error {error:#04x}")]
    Ata {
        /// Status register.
        status: u8,
        /// Error register.
        error: u8,
    },
    /// The response carries less data than the command asked for.
    #[error("response carries {have} data bytes, {need} expected")]
    ShortResponse {
        /// Bytes expected.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// No answer after every retransmission.
    #[error("no response after {0} retransmissions")]
    TimedOut(u32),
    /// Given up by [`Initiator::abort_all`].
    #[error("aborted")]
    Aborted,
}

/// A finished command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// Which command.
    pub handle: Handle,
    /// Its outcome.
    pub result: Result<AtaReply, CommandError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Queued,
    InFlight,
    Lost,
}

#[derive(Debug)]
struct Outstanding {
    handle: Handle,
    frame: Arc<[u8]>,
    /// Data bytes the response must carry.
    expect: usize,
    state: State,
    last_sent: Option<Instant>,
    deadline: Option<Instant>,
    rto: Duration,
    retries: u32,
}

/// One initiator's state towards one target device.
///
/// The driving loop: after [`submit`](Self::submit),
/// [`on_frame`](Self::on_frame) and [`on_timeout`](Self::on_timeout), send
/// what [`poll_transmit`](Self::poll_transmit) yields until it yields
/// nothing; then wait for a received frame or for
/// [`poll_timeout`](Self::poll_timeout), whichever comes first.
#[derive(Debug)]
pub struct Initiator {
    cfg: InitiatorConfig,
    target: TargetInfo,
    max_sectors: u8,
    lba48: bool,
    next_tag: u32,
    next_handle: u64,
    commands: BTreeMap<u32, Outstanding>,
    queued: VecDeque<u32>,
    lost: VecDeque<u32>,
    in_flight: usize,
    window: SendWindow,
    rtt: RttEstimator,
}

impl Initiator {
    /// State for talking to `target` (from [`parse_config_response`]).
    /// Commands are LBA48 until [`set_lba48`](Self::set_lba48) says not.
    pub fn new(cfg: InitiatorConfig, target: TargetInfo) -> Initiator {
        let max_window = cfg.max_window.min(u32::from(target.buffer_count)).max(1);
        let max_sectors = target.max_sectors.min(max_sectors_for_mtu(cfg.mtu)).max(1);
        Initiator {
            window: SendWindow::new(cfg.initial_window, max_window),
            rtt: RttEstimator::new(cfg.initial_rto, cfg.min_rto, cfg.max_rto),
            cfg,
            target,
            max_sectors,
            lba48: true,
            next_tag: cfg.initial_tag,
            next_handle: 0,
            commands: BTreeMap::new(),
            queued: VecDeque::new(),
            lost: VecDeque::new(),
            in_flight: 0,
        }
    }

    /// The device this talks to.
    pub fn target(&self) -> &TargetInfo {
        &self.target
    }

    /// Take a newer config response (the front end rediscovers now and
    /// then): the buffer count and sector limit may have changed. Commands
    /// already queued keep their size. Returns `false`, changing nothing,
    /// for a response from another device or MAC.
    pub fn update_target(&mut self, info: TargetInfo) -> bool {
        let t = &self.target;
        if (info.mac, info.shelf, info.slot) != (t.mac, t.shelf, t.slot) {
            return false;
        }
        self.window
            .set_max(self.cfg.max_window.min(u32::from(info.buffer_count)));
        self.max_sectors = info
            .max_sectors
            .min(max_sectors_for_mtu(self.cfg.mtu))
            .max(1);
        self.target = info;
        true
    }

    /// Most sectors per read or write.
    pub fn max_sectors(&self) -> u8 {
        self.max_sectors
    }

    /// Use LBA48 (EXT) commands or LBA28 ones (from IDENTIFY's answer).
    pub fn set_lba48(&mut self, lba48: bool) {
        self.lba48 = lba48;
    }

    /// The current send window.
    pub fn window(&self) -> u32 {
        self.window.cwnd()
    }

    /// The RTO a command sent now would get.
    pub fn rto(&self) -> Duration {
        self.rtt.rto()
    }

    /// The smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }

    /// Commands sent and not yet answered or timed out.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Commands not yet completed (queued, in flight or awaiting
    /// retransmission).
    pub fn outstanding(&self) -> usize {
        self.commands.len()
    }

    /// Queue a command; its frame goes out from
    /// [`poll_transmit`](Self::poll_transmit).
    pub fn submit(&mut self, req: AtaRequest) -> Result<Handle, SubmitError> {
        let (op, lba, sectors, data, expect) = match &req {
            AtaRequest::Identify => (ata::CMD_IDENTIFY_DEVICE, 0, 1, &[][..], ata::IDENTIFY_LEN),
            AtaRequest::CheckPowerMode => (ata::CMD_CHECK_POWER_MODE, 0, 0, &[][..], 0),
            AtaRequest::Flush if self.lba48 => (ata::CMD_FLUSH_CACHE_EXT, 0, 0, &[][..], 0),
            AtaRequest::Flush => (ata::CMD_FLUSH_CACHE, 0, 0, &[][..], 0),
            AtaRequest::Read { lba, sectors } => {
                let n = self.check_io(*lba, usize::from(*sectors) * SECTOR_SIZE)?;
                let op = if self.lba48 {
                    ata::CMD_READ_SECTORS_EXT
                } else {
                    ata::CMD_READ_SECTORS
                };
                (op, *lba, n, &[][..], usize::from(n) * SECTOR_SIZE)
            }
            AtaRequest::Write { lba, data } => {
                let n = self.check_io(*lba, data.len())?;
                let op = if self.lba48 {
                    ata::CMD_WRITE_SECTORS_EXT
                } else {
                    ata::CMD_WRITE_SECTORS
                };
                (op, *lba, n, &data[..], 0)
            }
        };
        let mut flags = 0;
        if matches!(
            req,
            AtaRequest::Read { .. } | AtaRequest::Write { .. } | AtaRequest::Flush
        ) && self.lba48
        {
            flags |= AtaFlags::EXTENDED;
        }
        if !data.is_empty() {
            flags |= AtaFlags::WRITE;
        }
        // LBA28 and non-data commands carry the device register in LBA byte
        // 3: 0xE0 (LBA mode) for reads and writes, 0xA0 otherwise, as the
        // Linux driver sends them.
        let lba = match req {
            AtaRequest::Read { .. } | AtaRequest::Write { .. } if self.lba48 => lba,
            AtaRequest::Read { .. } | AtaRequest::Write { .. } => {
                lba & ata::LBA28_MAX_SECTORS | 0xE000_0000
            }
            _ => 0xA000_0000,
        };
        let tag = self.alloc_tag();
        let mut out = Vec::with_capacity((ATA_HEADER_LEN + data.len()).max(frame::MIN_FRAME_LEN));
        Header::request(
            self.target.mac,
            self.cfg.local_mac,
            self.target.shelf,
            self.target.slot,
            Command::Ata,
            tag,
        )
        .encode(&mut out);
        AtaArg {
            flags: AtaFlags(flags),
            err_feature: 0,
            sector_count: sectors,
            cmd_status: op,
            lba,
            data,
        }
        .encode(&mut out);
        pad(&mut out);
        let handle = Handle(self.next_handle);
        self.next_handle += 1;
        self.commands.insert(
            tag,
            Outstanding {
                handle,
                frame: out.into(),
                expect,
                state: State::Queued,
                last_sent: None,
                deadline: None,
                rto: Duration::ZERO,
                retries: 0,
            },
        );
        self.queued.push_back(tag);
        Ok(handle)
    }

    /// Validate a read or write of `bytes` at `lba`; the sector count.
    fn check_io(&self, lba: u64, bytes: usize) -> Result<u8, SubmitError> {
        if bytes == 0 || !bytes.is_multiple_of(SECTOR_SIZE) {
            return Err(SubmitError::BadLength(bytes));
        }
        let sectors = bytes / SECTOR_SIZE;
        if sectors > usize::from(self.max_sectors) {
            return Err(SubmitError::TooManySectors {
                sectors,
                max: self.max_sectors,
            });
        }
        let n = sectors as u8;
        let (limit, bits) = if self.lba48 {
            (ata::LBA48_LIMIT, 48)
        } else {
            (ata::LBA28_MAX_SECTORS + 1, 28)
        };
        if lba.checked_add(u64::from(n)).is_none_or(|end| end > limit) {
            return Err(SubmitError::OutOfRange {
                lba,
                sectors: n,
                bits,
            });
        }
        Ok(n)
    }

    fn alloc_tag(&mut self) -> u32 {
        loop {
            let t = self.next_tag;
            self.next_tag = self.next_tag.wrapping_add(1);
            if !self.commands.contains_key(&t) {
                return t;
            }
        }
    }

    /// The next frame to send, if the window has room: retransmissions
    /// first, then new commands in submission order.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Arc<[u8]>> {
        while self.in_flight < self.window.cwnd() as usize {
            let tag = self.lost.pop_front().or_else(|| self.queued.pop_front())?;
            let Some(c) = self.commands.get_mut(&tag) else {
                continue;
            };
            c.rto = if c.last_sent.is_none() {
                self.rtt.rto()
            } else {
                (c.rto * 2).min(self.rtt.max_rto())
            };
            c.state = State::InFlight;
            c.last_sent = Some(now);
            c.deadline = Some(now + c.rto);
            self.in_flight += 1;
            return Some(c.frame.clone());
        }
        None
    }

    /// When [`on_timeout`](Self::on_timeout) is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.commands
            .values()
            .filter(|c| c.state == State::InFlight)
            .filter_map(|c| c.deadline)
            .min()
    }

    /// Time passed: commands past their deadline are queued for
    /// retransmission, or fail once out of retries (returned).
    pub fn on_timeout(&mut self, now: Instant) -> Vec<Completion> {
        let expired: Vec<u32> = self
            .commands
            .iter()
            .filter(|(_, c)| c.state == State::InFlight && c.deadline.is_some_and(|d| d <= now))
            .map(|(t, _)| *t)
            .collect();
        let mut failed = Vec::new();
        for tag in &expired {
            self.in_flight -= 1;
            let Some(c) = self.commands.get_mut(tag) else {
                continue;
            };
            if let Some(sent) = c.last_sent {
                self.window.on_loss(sent, now);
            }
            if c.retries >= self.cfg.max_retries {
                let retries = c.retries;
                let handle = c.handle;
                self.commands.remove(tag);
                failed.push(Completion {
                    handle,
                    result: Err(CommandError::TimedOut(retries)),
                });
            } else {
                c.retries += 1;
                c.state = State::Lost;
                c.deadline = None;
                self.lost.push_back(*tag);
            }
        }
        if !expired.is_empty() {
            self.rtt.on_timeout();
        }
        failed
    }

    /// A frame arrived. Returns the completion it brings, or `None` for
    /// anything else (not AoE, not from this device, not a response, an
    /// unknown or already answered tag, a malformed response).
    pub fn on_frame(&mut self, frame: &[u8], now: Instant) -> Option<Completion> {
        let h = Header::decode(frame).ok()?;
        let t = &self.target;
        if !h.response
            || h.dst != self.cfg.local_mac
            || h.src != t.mac
            || h.shelf != t.shelf
            || h.slot != t.slot
            || h.command != Command::Ata as u8
        {
            return None;
        }
        let c = self.commands.get(&h.tag)?;
        if c.state == State::Queued {
            return None;
        }
        let result = if h.error_flag {
            Err(CommandError::Aoe { code: h.error })
        } else {
            let a = AtaArg::decode(&frame[HEADER_LEN..], true).ok()?;
            if a.cmd_status & ata::STATUS_FAILURE_MASK != 0 {
                Err(CommandError::Ata {
                    status: a.cmd_status,
                    error: a.err_feature,
                })
            } else if a.data.len() < c.expect {
                Err(CommandError::ShortResponse {
                    need: c.expect,
                    have: a.data.len(),
                })
            } else {
                Ok(AtaReply {
                    data: ATA_HEADER_LEN..ATA_HEADER_LEN + c.expect,
                    status: a.cmd_status,
                    sector_count: a.sector_count,
                })
            }
        };
        let c = self.commands.remove(&h.tag)?;
        match c.state {
            State::InFlight => {
                self.in_flight -= 1;
                if c.retries == 0 {
                    if let Some(sent) = c.last_sent {
                        self.rtt.on_sample(now.saturating_duration_since(sent));
                    }
                }
            }
            // A late answer to a transmission already given up on.
            State::Lost => self.lost.retain(|t| *t != h.tag),
            State::Queued => {}
        }
        self.window.on_ack();
        Some(Completion {
            handle: c.handle,
            result,
        })
    }

    /// Forget the command `handle` because its caller gave up on it (a
    /// timeout): it is never sent again, and a late answer to it is
    /// ignored. A frame already on the wire may still reach the target;
    /// nothing of it goes out after this. False when the command is not
    /// outstanding (already completed).
    pub fn cancel(&mut self, handle: Handle) -> bool {
        let Some(tag) = self
            .commands
            .iter()
            .find(|(_, c)| c.handle == handle)
            .map(|(t, _)| *t)
        else {
            return false;
        };
        let Some(c) = self.commands.remove(&tag) else {
            return false;
        };
        match c.state {
            State::InFlight => self.in_flight -= 1,
            State::Lost => self.lost.retain(|t| *t != tag),
            State::Queued => self.queued.retain(|t| *t != tag),
        }
        true
    }

    /// Give up every command (shutdown, target gone).
    pub fn abort_all(&mut self) -> Vec<Completion> {
        self.queued.clear();
        self.lost.clear();
        self.in_flight = 0;
        std::mem::take(&mut self.commands)
            .into_values()
            .map(|c| Completion {
                handle: c.handle,
                result: Err(CommandError::Aborted),
            })
            .collect()
    }
}
