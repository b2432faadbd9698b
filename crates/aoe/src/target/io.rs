//! The I/O half of the AoE target: what [`AoeTarget::handle`] asks the
//! front end to read, write or flush, and how the answer becomes the
//! response frame (AoE r11 §3.1 Issue ATA Command responses).
//!
//! [`AoeTarget::handle`]: super::AoeTarget::handle

use std::ops::Range;

use super::DeviceAddr;
use crate::ata;
use crate::frame::{pad, ErrorCode, Header, Mac, HEADER_LEN, MIN_FRAME_LEN};
use crate::issue::{AtaArg, AtaFlags, ATA_ARG_LEN, ATA_HEADER_LEN, SECTOR_SIZE};

/// An I/O the front end carries out against a device's volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoRequest {
    /// The device.
    pub device: DeviceAddr,
    /// What to do.
    pub op: IoOp,
    /// What the response needs.
    pub pending: Pending,
}

/// The I/O operations (offsets in 512-byte sectors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoOp {
    /// Read `sectors` sectors at `lba` into the response (see
    /// [`Pending::prepare_read`]).
    Read {
        /// First sector.
        lba: u64,
        /// Sector count (1..=max sectors).
        sectors: u8,
    },
    /// Write `data` (a range of the request frame) at `lba`.
    Write {
        /// First sector.
        lba: u64,
        /// Sector count.
        sectors: u8,
        /// Where the data lies in the frame given to `handle`.
        data: Range<usize>,
        /// The initiator set the A flag: it allows the write to be
        /// acknowledged before it is stable.
        asynchronous: bool,
    },
    /// Make every completed write stable.
    Flush,
}

/// How an I/O failed, as the front end reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoFailure {
    /// The medium failed: reads answer UNC, writes and flushes ABRT.
    Medium,
    /// The range is outside the volume (it shrank): IDNF.
    OutOfRange,
    /// Refused for any other reason: ABRT.
    Aborted,
    /// The volume is gone: AoE error 3, device unavailable.
    Unavailable,
}

/// What an I/O's response needs: addresses, tag and the command's
/// registers. Plain data, so a completion needs no access to the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub(super) header: Header,
    pub(super) flags: AtaFlags,
    pub(super) lba: u64,
    pub(super) sectors: u8,
    pub(super) read: bool,
}

impl Pending {
    /// The request's tag.
    pub fn tag(&self) -> u32 {
        self.header.tag
    }

    /// The initiator that sent the request (where the response goes).
    pub fn initiator(&self) -> Mac {
        self.header.dst
    }

    /// Where a read's data lies in the response frame (empty otherwise).
    pub fn data_range(&self) -> Range<usize> {
        let len = if self.read {
            usize::from(self.sectors) * SECTOR_SIZE
        } else {
            0
        };
        ATA_HEADER_LEN..ATA_HEADER_LEN + len
    }

    /// Size `frame` as this read's response and return its data region for
    /// the volume to fill. `frame` may be a reused buffer.
    pub fn prepare_read<'b>(&self, frame: &'b mut Vec<u8>) -> &'b mut [u8] {
        let range = self.data_range();
        frame.clear();
        frame.resize(range.end.max(MIN_FRAME_LEN), 0);
        &mut frame[range]
    }

    /// Turn `frame` into the response for `result`. For a successful read
    /// `frame` is the buffer [`prepare_read`](Self::prepare_read) sized and
    /// the volume filled; otherwise any buffer (it is overwritten).
    pub fn complete(&self, result: Result<(), IoFailure>, frame: &mut Vec<u8>) {
        let (status, error) = match result {
            Ok(()) => (ata::STATUS_DRDY, 0),
            Err(IoFailure::Unavailable) => {
                frame.clear();
                self.header
                    .with_error(ErrorCode::DeviceUnavailable)
                    .encode(frame);
                frame.extend_from_slice(&self.registers(0, 0, self.sectors));
                pad(frame);
                return;
            }
            Err(IoFailure::Medium) if self.read => {
                (ata::STATUS_DRDY | ata::STATUS_ERR, ata::ERROR_UNC)
            }
            Err(IoFailure::OutOfRange) => (ata::STATUS_DRDY | ata::STATUS_ERR, ata::ERROR_IDNF),
            Err(IoFailure::Medium | IoFailure::Aborted) => {
                (ata::STATUS_DRDY | ata::STATUS_ERR, ata::ERROR_ABRT)
            }
        };
        let end = if result.is_ok() {
            self.data_range().end
        } else {
            ATA_HEADER_LEN
        };
        if result.is_err() || !self.read {
            frame.clear();
        }
        frame.resize(end, 0);
        frame[..HEADER_LEN].copy_from_slice(&self.header.to_bytes());
        // All sectors moved on success, none on failure.
        let remaining = if result.is_ok() { 0 } else { self.sectors };
        frame[HEADER_LEN..ATA_HEADER_LEN]
            .copy_from_slice(&self.registers(status, error, remaining));
        pad(frame);
    }

    /// Write a successful read's response straight into `out` (a transmit
    /// buffer, e.g. a ring slot): the same bytes as
    /// [`prepare_read`](Self::prepare_read), filling with the first
    /// sectors of `data`, and [`complete`](Self::complete) with `Ok`.
    /// Returns the frame's length, or `None` (nothing written) when this is
    /// not a read, `data` holds fewer bytes than the read asked for, or
    /// `out` cannot hold the frame; answer those with `complete`.
    pub fn write_read_response(&self, data: &[u8], out: &mut [u8]) -> Option<usize> {
        let range = self.data_range();
        let end = range.end.max(MIN_FRAME_LEN);
        if !self.read || data.len() < range.len() || out.len() < end {
            return None;
        }
        out[..HEADER_LEN].copy_from_slice(&self.header.to_bytes());
        out[HEADER_LEN..ATA_HEADER_LEN].copy_from_slice(&self.registers(ata::STATUS_DRDY, 0, 0));
        let n = range.len();
        out[range.clone()].copy_from_slice(&data[..n]);
        out[range.end..end].fill(0);
        Some(end)
    }

    fn registers(&self, status: u8, error: u8, count: u8) -> [u8; ATA_ARG_LEN] {
        AtaArg {
            flags: self.flags,
            err_feature: error,
            sector_count: count,
            cmd_status: status,
            lba: self.lba,
            data: &[],
        }
        .fixed_bytes()
    }
}
