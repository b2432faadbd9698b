//! SPC-4 §6.4 EXTENDED COPY (LID1) and §6.18 RECEIVE COPY RESULTS: the copy
//! manager copies blocks between logical units of one target, without the
//! data crossing the network.
//!
//! A target descriptor names a logical unit by a designator from its VPD
//! page 0x83; only units the caller lists as visible to the initiator can be
//! named (the lesson of CVE-2020-28374, where a copy could reach any LUN).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ethersan_backend::BlockDeviceExt;

use crate::disk::{BlockCommand, LogicalUnit};
use crate::sense::{key, Sense};
use crate::Nexus;

/// Most target descriptors in one command.
pub(crate) const MAX_TARGET_DESCRIPTORS: usize = 2;
/// Most segment descriptors in one command.
pub(crate) const MAX_SEGMENT_DESCRIPTORS: usize = 64;
/// Most bytes of descriptors (targets at 32 bytes, segments at 28).
pub(crate) const MAX_DESCRIPTOR_LIST: usize =
    32 * MAX_TARGET_DESCRIPTORS + 28 * MAX_SEGMENT_DESCRIPTORS;
/// Largest segment, in bytes.
const MAX_SEGMENT_BYTES: u64 = 16 << 20;

const PARAM_LIST_LENGTH: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x1a, 0x00);
const TOO_MANY_TARGETS: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x06);
const UNSUPPORTED_TARGET_TYPE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x07);
const TOO_MANY_SEGMENTS: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x08);
const UNSUPPORTED_SEGMENT_TYPE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x09);
/// COPY ABORTED / COPY TARGET DEVICE NOT REACHABLE.
const NOT_REACHABLE: Sense = Sense::new(0x0a, 0x0d, 0x02);
/// COPY ABORTED with no further detail: a segment fell outside a unit, or
/// a read or write failed.
const COPY_FAILED: Sense = Sense::new(0x0a, 0x00, 0x00);

/// Identification descriptor target descriptor (0xE4) and block-to-block
/// segment descriptor (0x02): the descriptor types implemented.
const IDENT_TARGET: u8 = 0xe4;
const BLOCK_TO_BLOCK: u8 = 0x02;

/// Outcome of one EXTENDED COPY, for RECEIVE COPY RESULTS.
#[derive(Debug, Clone, Copy)]
struct CopyStatus {
    failed: bool,
    segments: u16,
    bytes: u64,
}

/// The target's copy manager.
#[derive(Debug, Default)]
pub(crate) struct CopyManager {
    results: Mutex<HashMap<(Nexus, u8), CopyStatus>>,
}

fn be16(b: &[u8]) -> usize {
    usize::from(crate::be::be16(b))
}
fn be32(b: &[u8]) -> usize {
    crate::be::be32(b) as usize
}
use crate::be::be64;

impl CopyManager {
    /// EXTENDED COPY (LID1). `visible` are the units the initiator may use.
    pub(crate) fn extended_copy(
        &self,
        nexus: Nexus,
        cdb: &[u8],
        data: &[u8],
        visible: &[Arc<LogicalUnit>],
    ) -> Result<(), Sense> {
        let len = be32(&cdb[10..14]);
        if len == 0 {
            return Ok(());
        }
        if len < 16 || data.len() < len {
            return Err(PARAM_LIST_LENGTH);
        }
        let p = &data[..len];
        let list_id = p[0];
        let tdl = be16(&p[2..4]);
        let sdl = be32(&p[8..12]);
        let inline = be32(&p[12..16]);
        if 16 + tdl + sdl + inline > len {
            return Err(PARAM_LIST_LENGTH);
        }
        if tdl + sdl > MAX_DESCRIPTOR_LIST {
            return Err(PARAM_LIST_LENGTH);
        }
        if inline != 0 {
            return Err(Sense::invalid_param_field(12));
        }
        // Target descriptors: 32 bytes each.
        if !tdl.is_multiple_of(32) {
            return Err(PARAM_LIST_LENGTH);
        }
        if tdl / 32 > MAX_TARGET_DESCRIPTORS {
            return Err(TOO_MANY_TARGETS);
        }
        let mut targets: Vec<Option<Arc<LogicalUnit>>> = Vec::new();
        for (i, d) in p[16..16 + tdl].chunks_exact(32).enumerate() {
            if d[0] != IDENT_TARGET {
                return Err(UNSUPPORTED_TARGET_TYPE);
            }
            if d[1] & 0x1f != 0 {
                // Only block devices (peripheral type 0).
                return Err(Sense::invalid_param_field((16 + i * 32 + 1) as u16));
            }
            // Designator: code set, association/type, length, body.
            let (code_set, dtype, dlen) = (d[4] & 0x0f, d[5] & 0x0f, usize::from(d[7]));
            let body = &d[8..(8 + dlen).min(28)];
            let found = visible
                .iter()
                .find(|lu| lu.has_designator(code_set, dtype, body))
                .cloned();
            // The descriptor's block size must match the unit's.
            let bs = u32::from_be_bytes([0, d[29], d[30], d[31]]);
            targets.push(found.filter(|lu| bs == 0 || lu.device().block_size() == bs));
        }
        // Segment descriptors.
        let mut at = 16 + tdl;
        let end = at + sdl;
        let mut segments = Vec::new();
        while at < end {
            if at + 4 > end {
                return Err(PARAM_LIST_LENGTH);
            }
            let kind = p[at];
            let dlen = be16(&p[at + 2..at + 4]) + 4;
            if kind != BLOCK_TO_BLOCK {
                return Err(UNSUPPORTED_SEGMENT_TYPE);
            }
            if at + dlen > end || dlen < 28 {
                return Err(PARAM_LIST_LENGTH);
            }
            segments.push(&p[at..at + dlen]);
            at += dlen;
        }
        if segments.len() > MAX_SEGMENT_DESCRIPTORS {
            return Err(TOO_MANY_SEGMENTS);
        }
        let mut status = CopyStatus {
            failed: false,
            segments: 0,
            bytes: 0,
        };
        let result = (|| {
            for s in &segments {
                let dc = s[1] & 0x02 != 0;
                let (src_i, dst_i) = (be16(&s[4..6]), be16(&s[6..8]));
                let blocks = be16(&s[10..12]) as u64;
                let (src_lba, dst_lba) = (be64(&s[12..20]), be64(&s[20..28]));
                let src = targets.get(src_i).cloned().flatten().ok_or(NOT_REACHABLE)?;
                let dst = targets.get(dst_i).cloned().flatten().ok_or(NOT_REACHABLE)?;
                let (sbs, dbs) = (
                    u64::from(src.device().block_size()),
                    u64::from(dst.device().block_size()),
                );
                // DC: the block count is in destination blocks.
                let bytes = blocks * if dc { dbs } else { sbs };
                if !bytes.is_multiple_of(sbs)
                    || !bytes.is_multiple_of(dbs)
                    || bytes > MAX_SEGMENT_BYTES
                {
                    return Err(Sense::invalid_param_field(10));
                }
                let in_range = |lba: u64, bs: u64, lu: &LogicalUnit| {
                    lba.checked_add(bytes / bs)
                        .is_some_and(|e| e <= lu.device().num_blocks())
                };
                if !in_range(src_lba, sbs, &src) || !in_range(dst_lba, dbs, &dst) {
                    return Err(COPY_FAILED);
                }
                // The copy runs for the initiator that asked for it: each
                // unit's gates (reservations, ALUA, SANITIZE, medium) apply
                // as to its own READ and WRITE.
                src.admit(BlockCommand::Read, nexus)
                    .map_err(|_| COPY_FAILED)?;
                dst.admit(BlockCommand::Write, nexus)
                    .map_err(|_| COPY_FAILED)?;
                if bytes > 0 {
                    let mut buf = vec![0u8; bytes as usize];
                    src.device()
                        .read_at(src_lba * sbs, &mut buf)
                        .map_err(|_| COPY_FAILED)?;
                    dst.copy_write(dst_lba * dbs, &buf)
                        .map_err(|_| COPY_FAILED)?;
                }
                status.segments += 1;
                status.bytes += bytes;
            }
            Ok(())
        })();
        status.failed = result.is_err();
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((nexus, list_id), status);
        result
    }

    /// RECEIVE COPY RESULTS: COPY STATUS (0) or OPERATING PARAMETERS (3).
    pub(crate) fn receive_copy_results(&self, nexus: Nexus, cdb: &[u8]) -> Result<Vec<u8>, Sense> {
        let action = cdb[1] & 0x1f;
        let list_id = cdb[2];
        let alloc = be32(&cdb[10..14]);
        let mut d = match action {
            0x00 => {
                let results = self.results.lock().unwrap_or_else(|e| e.into_inner());
                let s = results
                    .get(&(nexus, list_id))
                    .ok_or(Sense::invalid_cdb_field(2, None))?;
                let mut d = vec![0u8; 12];
                d[0..4].copy_from_slice(&8u32.to_be_bytes());
                d[4] = u8::from(s.failed); // 0: completed without errors
                d[5..7].copy_from_slice(&s.segments.to_be_bytes());
                d[7] = 0xf1; // transfer count in KiB
                d[8..12].copy_from_slice(&((s.bytes / 1024) as u32).to_be_bytes());
                d
            }
            0x03 => {
                let mut d = vec![0u8; 46];
                d[0..4].copy_from_slice(&42u32.to_be_bytes());
                d[8..10].copy_from_slice(&(MAX_TARGET_DESCRIPTORS as u16).to_be_bytes());
                d[10..12].copy_from_slice(&(MAX_SEGMENT_DESCRIPTORS as u16).to_be_bytes());
                d[12..16].copy_from_slice(&(MAX_DESCRIPTOR_LIST as u32).to_be_bytes());
                d[16..20].copy_from_slice(&(MAX_SEGMENT_BYTES as u32).to_be_bytes());
                d[34..36].copy_from_slice(&1u16.to_be_bytes()); // total concurrent copies
                d[36] = 1; // maximum concurrent copies
                d[37] = 9; // data segment granularity: 512 bytes (2^9)
                d[43] = 2;
                d[44] = BLOCK_TO_BLOCK;
                d[45] = IDENT_TARGET;
                d
            }
            _ => return Err(Sense::invalid_cdb_field(1, Some(4))),
        };
        d.truncate(alloc);
        Ok(d)
    }
}
