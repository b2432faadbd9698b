//! SBC-3 §5: the data path — READ, WRITE, WRITE AND VERIFY, VERIFY,
//! COMPARE AND WRITE, ORWRITE, WRITE ATOMIC, PRE-FETCH, SYNCHRONIZE CACHE,
//! READ CAPACITY and READ DEFECT DATA.
//!
//! None of these take the unit's state mutex: write-cache state is an
//! atomic, and only writes that must be atomic against each other hold
//! range locks.

use std::sync::atomic::Ordering;

use super::{backend_sense, CmdResult, LogicalUnit, Reply, ATOMIC_UNIT_BYTES, MAX_ATOMIC_BYTES, MAX_COMPARE_AND_WRITE};
use crate::be::{be16, be32, be64};
use crate::cdb::BlockCdb;
use crate::sense::{codes, Sense};

impl LogicalUnit {
    /// READ (6/10/12/16).
    pub(super) fn read(&self, cdb: &[u8]) -> CmdResult {
        let c = BlockCdb::parse(cdb);
        Self::no_protection(&c)?;
        let (off, len) = self.range(&c)?;
        let mut data = vec![0u8; len];
        if len > 0 {
            self.dev.read_at(off, &mut data).map_err(|e| backend_sense(&e, false))?;
        }
        Ok(Reply { data })
    }

    /// WRITE (6/10/12/16) and WRITE AND VERIFY (10/12/16). Only Data-Out
    /// that arrived is written, in whole blocks (when the initiator's
    /// expected length was short the transport reports the residual); WRITE
    /// AND VERIFY writes through (the medium then holds exactly the data,
    /// so the verification cannot miscompare).
    pub(super) fn write(&self, cdb: &[u8], data_out: &[u8], verify: bool) -> CmdResult {
        let c = BlockCdb::parse(cdb);
        Self::no_protection(&c)?;
        if verify && c.bytchk() == 2 {
            return Err(Sense::invalid_cdb_field(1, Some(2)));
        }
        let (off, len) = self.range(&c)?;
        if let Some(s) = self.write_protected() {
            return Err(s);
        }
        // Only what arrived is written (FCP-4 / iSCSI residual rules): whole
        // blocks up to the Data-Out the initiator sent.
        let bs = self.bs() as usize;
        let have = data_out.len().min(len) / bs * bs;
        if have > 0 {
            let fua = verify || self.fua(&c);
            let _held = self.ranges.lock(off, have as u64, false);
            self.dev.write_at(off, &data_out[..have], fua).map_err(|e| backend_sense(&e, true))?;
        }
        Reply::none()
    }

    /// Blocks per WRITE ATOMIC alignment/granularity unit.
    pub(super) fn atomic_unit_blocks(&self) -> u64 {
        (ATOMIC_UNIT_BYTES / self.bs()).max(1)
    }

    /// WRITE ATOMIC(16): all or nothing with respect to every other
    /// command: the range is held exclusively while it is written, in whole
    /// page-aligned 4 KiB units.
    pub(super) fn write_atomic(&self, cdb: &[u8], data: &[u8]) -> CmdResult {
        let c = BlockCdb::parse(cdb);
        Self::no_protection(&c)?;
        let (off, len) = self.range(&c)?;
        if len == 0 {
            return Reply::none();
        }
        let unit = self.atomic_unit_blocks();
        if c.lba % unit != 0 {
            return Err(Sense::invalid_cdb_field(2, None));
        }
        if u64::from(c.blocks) % unit != 0 || len as u64 > MAX_ATOMIC_BYTES {
            return Err(Sense::invalid_cdb_field(12, None));
        }
        if let Some(s) = self.write_protected() {
            return Err(s);
        }
        if data.len() < len {
            return Err(codes::INVALID_FIELD_IN_CDB);
        }
        let _held = self.ranges.lock(off, len as u64, true);
        self.dev.write_at(off, &data[..len], self.fua(&c)).map_err(|e| backend_sense(&e, true))?;
        Reply::none()
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

    /// Whether a write must reach stable storage before it completes: FUA
    /// asked for it, or the write cache is off (Caching page WCE = 0).
    pub(super) fn fua(&self, c: &BlockCdb) -> bool {
        c.fua() || !self.wce.load(Ordering::Relaxed)
    }

    /// COMPARE AND WRITE: compare the first half of the Data-Out with the
    /// medium and, only if equal, write the second half — atomically.
    pub(super) fn compare_and_write(&self, cdb: &[u8], data: &[u8]) -> CmdResult {
        let c = BlockCdb::parse(cdb);
        Self::no_protection(&c)?;
        if c.blocks > MAX_COMPARE_AND_WRITE {
            return Err(Sense::invalid_cdb_field(13, None));
        }
        let (off, len) = self.range(&c)?;
        if c.blocks == 0 && data.is_empty() {
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
            return Err(codes::MISCOMPARE_VERIFY.with_info(at as u64));
        }
        self.dev.write_at(off, write, self.fua(&c)).map_err(|e| backend_sense(&e, true))?;
        Reply::none()
    }

    /// ORWRITE(16): OR the Data-Out into the medium, atomically.
    pub(super) fn or_write(&self, cdb: &[u8], data: &[u8]) -> CmdResult {
        let c = BlockCdb::parse(cdb);
        Self::no_protection(&c)?;
        let (off, len) = self.range(&c)?;
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
        self.dev.write_at(off, &medium, self.fua(&c)).map_err(|e| backend_sense(&e, true))?;
        Reply::none()
    }

    /// VERIFY (10/12/16): BYTCHK 0 checks the medium can be read, 1
    /// compares the Data-Out with it, 3 compares every block with the one
    /// block sent; a difference is MISCOMPARE with the offset of the first
    /// differing byte in INFORMATION.
    pub(super) fn verify(&self, cdb: &[u8], data_out: &[u8]) -> CmdResult {
        let c = BlockCdb::parse(cdb);
        Self::no_protection(&c)?;
        let bytchk = c.bytchk();
        if bytchk == 2 {
            return Err(Sense::invalid_cdb_field(1, Some(2)));
        }
        let (off, len) = self.range(&c)?;
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
                    // Less Data-Out than the blocks to compare: nothing
                    // sensible to compare the rest with.
                    return Err(Sense::invalid_cdb_field(c.length_byte, None));
                }
                medium.iter().zip(data_out).position(|(a, b)| a != b)
            }
            _ => {
                if data_out.len() < bs {
                    return Err(Sense::invalid_cdb_field(c.length_byte, None));
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

    /// Check that `c`'s range lies on the medium; a zero length means "to
    /// the end of the medium" (PRE-FETCH, SYNCHRONIZE CACHE). Returns the
    /// byte offset and length. No transfer limit applies: nothing moves.
    fn cache_range(&self, c: &BlockCdb) -> Result<(u64, u64), Sense> {
        let cap = self.dev.num_blocks();
        match c.lba.checked_add(u64::from(c.blocks)) {
            Some(end) if end <= cap && c.lba <= cap => {}
            _ => return Err(codes::LBA_OUT_OF_RANGE),
        }
        let blocks = if c.blocks == 0 { cap - c.lba } else { u64::from(c.blocks) };
        Ok((c.lba * self.bs(), blocks * self.bs()))
    }

    /// PRE-FETCH (10/16): a hint to the backend. SBC-3 lets the unit answer
    /// CONDITION MET when the range will fit in its cache; libiscsi's
    /// Prefetch tests expect GOOD (its result check treats any other status
    /// as a failure), and GOOD is always allowed, so GOOD it is. IMMED
    /// changes nothing: the hint does not wait for the data.
    pub(super) fn prefetch(&self, cdb: &[u8]) -> CmdResult {
        let c = BlockCdb::parse(cdb);
        let (off, len) = self.cache_range(&c)?;
        if len > 0 {
            // Only a hint: a backend that cannot prefetch is not an error.
            let _ = self.dev.prefetch(off, len);
        }
        Reply::none()
    }

    /// SYNCHRONIZE CACHE (10/16): range-checked, then the whole device is
    /// flushed (the backend has no ranged flush). IMMED is honoured by
    /// completing only after the flush, which the standard allows.
    pub(super) fn sync_cache(&self, cdb: &[u8]) -> CmdResult {
        let c = BlockCdb::parse(cdb);
        self.cache_range(&c)?;
        self.dev.flush().map_err(|e| backend_sense(&e, true))?;
        Reply::none()
    }

    /// READ CAPACITY(10): last LBA (0xFFFFFFFF when it does not fit) and
    /// block length. PMI = 0 needs LBA = 0.
    pub(super) fn read_capacity10(&self, cdb: &[u8]) -> CmdResult {
        if cdb[8] & 1 == 0 && be32(&cdb[2..6]) != 0 {
            return Err(Sense::invalid_cdb_field(2, None));
        }
        let last = self.dev.num_blocks().saturating_sub(1);
        let mut d = Vec::with_capacity(8);
        d.extend_from_slice(&(last.min(0xffff_ffff) as u32).to_be_bytes());
        d.extend_from_slice(&self.dev.block_size().to_be_bytes());
        Reply::data(d, 8)
    }

    /// READ CAPACITY(16) (SERVICE ACTION IN(16) / 10h).
    pub(super) fn read_capacity16(&self, cdb: &[u8]) -> CmdResult {
        if cdb[14] & 1 == 0 && be64(&cdb[2..10]) != 0 {
            return Err(Sense::invalid_cdb_field(2, None));
        }
        let alloc = be32(&cdb[10..14]) as usize;
        let mut d = vec![0u8; 32];
        d[0..8].copy_from_slice(&self.dev.num_blocks().saturating_sub(1).to_be_bytes());
        d[8..12].copy_from_slice(&self.dev.block_size().to_be_bytes());
        // One logical block per physical block (exponent 0): every block
        // size we export is written whole, without read-modify-write.
        if self.dev.thin_provisioned() {
            d[14] = 0xc0; // LBPME, LBPRZ
        }
        Reply::data(d, alloc)
    }
}

/// READ DEFECT DATA (10/12): an empty defect list in the format asked for.
pub(super) fn read_defect_data(cdb: &[u8]) -> CmdResult {
    if cdb[0] == 0x37 {
        let alloc = usize::from(be16(&cdb[7..9]));
        Reply::data(vec![0, cdb[2] & 0x1f, 0, 0], alloc)
    } else {
        let alloc = be32(&cdb[6..10]) as usize;
        Reply::data(vec![0, cdb[1] & 0x1f, 0, 0, 0, 0, 0, 0], alloc)
    }
}
