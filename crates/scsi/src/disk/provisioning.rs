//! SBC-3 §4.7 logical block provisioning: WRITE SAME (10/16), UNMAP and
//! GET LBA STATUS. UNMAP is offered only when the backend can deallocate.

use super::{
    CmdResult, LogicalUnit, Reply, MAX_TRANSFER_BYTES, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS,
};
use ethersan_backend::{BackendError, BlockDeviceExt};

use crate::be::{be16, be32, be64};
use crate::cdb::BlockCdb;
use crate::sense::{codes, Sense};

impl LogicalUnit {
    /// Largest WRITE SAME, in blocks (VPD 0xB0): one maximum transfer.
    pub(super) fn max_write_same_blocks(&self) -> u64 {
        MAX_TRANSFER_BYTES / self.bs()
    }

    /// WRITE SAME (10/16): one block (or zeros with NDOB) over a range; with
    /// UNMAP on a thin LUN, zero blocks are deallocated instead.
    pub(super) fn write_same(&self, cdb: &[u8], data_out: &[u8]) -> CmdResult {
        let c = BlockCdb::parse(cdb);
        Self::no_protection(&c)?;
        let (lba, n, flags) = (c.lba, c.blocks, c.flags);
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
            return Err(Sense::invalid_cdb_field(
                if cdb[0] == 0x41 { 7 } else { 10 },
                None,
            ));
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
                return Err(Sense::invalid_cdb_field(
                    if cdb[0] == 0x41 { 7 } else { 10 },
                    None,
                ));
            }
            data_out.to_vec()
        };
        let off = lba * bs as u64;
        let len = n * bs as u64;
        let _held = self.vol.ranges().lock(off, len, false);
        // With UNMAP on a thin LUN the range is deallocated and reads back
        // as zeros (LBPRZ), whatever the data block held.
        if unmap && self.dev.thin_provisioned() {
            self.dev
                .unmap(off, len)
                .map_err(|e| self.medium_error(&e, true, Some((off, len))))?;
            if self.fua(&c) {
                self.dev
                    .flush()
                    .map_err(|e| self.medium_error(&e, true, None))?;
            }
            return Reply::none();
        }
        // The store may repeat the block itself (one request to a cluster
        // instead of a megabyte at a time).
        match self.dev.write_same(off, len, &block, self.fua(&c)) {
            Ok(()) => return Reply::none(),
            Err(BackendError::Unsupported) => {}
            Err(e) => return Err(self.medium_error(&e, true, Some((off, len)))),
        }
        // Write in chunks of up to 1 MiB of repeated blocks.
        let per_chunk = ((1usize << 20) / bs).max(1);
        let chunk: Vec<u8> = block.iter().copied().cycle().take(per_chunk * bs).collect();
        let mut done = 0u64;
        let fua = self.fua(&c);
        while done < n {
            let k = (n - done).min(per_chunk as u64) as usize;
            self.dev
                .write_at(off + done * bs as u64, &chunk[..k * bs], fua)
                .map_err(|e| {
                    let at = off + done * bs as u64;
                    self.medium_error(&e, true, Some((at, (k * bs) as u64)))
                })?;
            done += k as u64;
        }
        Reply::none()
    }

    /// UNMAP: deallocate each block descriptor's range.
    pub(super) fn unmap(&self, cdb: &[u8], data: &[u8]) -> CmdResult {
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
            let _held = self.vol.ranges().lock(off, len, false);
            self.dev
                .unmap(off, len)
                .map_err(|e| self.medium_error(&e, true, Some((off, len))))?;
        }
        Reply::none()
    }

    /// GET LBA STATUS: mapped / deallocated extents from the backend.
    pub(super) fn get_lba_status(&self, cdb: &[u8]) -> CmdResult {
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
            let (mapped, bytes) = self
                .dev
                .lba_status(at * bs, left)
                .map_err(|e| self.medium_error(&e, false, Some((at * bs, left))))?;
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
}
