//! SBC-3 §5: the data path — READ, WRITE, WRITE AND VERIFY, VERIFY,
//! COMPARE AND WRITE, ORWRITE, WRITE ATOMIC, PRE-FETCH, SYNCHRONIZE CACHE,
//! READ CAPACITY and READ DEFECT DATA.
//!
//! None of these take the unit's state mutex: write-cache state lives in
//! the unit's volume, and only writes that must be atomic against each
//! other hold range locks exclusive. READ, WRITE, WRITE AND VERIFY and
//! SYNCHRONIZE CACHE are checked here ([`LogicalUnit::read_plan`],
//! [`LogicalUnit::write_plan`], [`LogicalUnit::cache_range`]) and moved by
//! the volume (`submit`); the others here run as blocking jobs.

use ethersan_backend::{BackendError, BlockDeviceExt};

use super::{CmdResult, LogicalUnit, Reply, ATOMIC_UNIT_BYTES, MAX_ATOMIC_BYTES};
use crate::be::{be16, be32, be64};
use crate::cdb::BlockCdb;
use crate::sense::{codes, Sense};

impl LogicalUnit {
    /// The checked byte range of a READ.
    pub(super) fn read_plan(&self, cdb: &[u8]) -> Result<(u64, usize), Sense> {
        let c = BlockCdb::parse(cdb);
        Self::no_protection(&c)?;
        self.range(&c)
    }

    /// The checks of a WRITE (6/10/12/16) or WRITE AND VERIFY (10/12/16):
    /// (byte offset, bytes to write, FUA asked for). Only Data-Out that
    /// arrived is written, in whole blocks (when the initiator's expected
    /// length was short the transport reports the residual); WRITE AND
    /// VERIFY writes through (the medium then holds exactly the data, so
    /// the verification cannot miscompare). The volume adds FUA when the
    /// write cache is off.
    pub(super) fn write_plan(
        &self,
        cdb: &[u8],
        data_out_len: usize,
        verify: bool,
    ) -> Result<(u64, usize, bool), Sense> {
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
        // blocks up to the Data-Out the initiator sent. A partial block
        // cannot be written without inventing the rest of it, so then
        // nothing is written and the command fails the way FCP-4 allows
        // (INVALID FIELD IN COMMAND INFORMATION UNIT); libiscsi's residual
        // tests accept either outcome.
        let bs = self.bs() as usize;
        if data_out_len < len && !data_out_len.is_multiple_of(bs) {
            return Err(codes::INVALID_FIELD_IN_IU);
        }
        Ok((off, data_out_len.min(len), verify || c.fua()))
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
        if !c.lba.is_multiple_of(unit) {
            return Err(Sense::invalid_cdb_field(2, None));
        }
        if !u64::from(c.blocks).is_multiple_of(unit) || len as u64 > MAX_ATOMIC_BYTES {
            return Err(Sense::invalid_cdb_field(12, None));
        }
        if let Some(s) = self.write_protected() {
            return Err(s);
        }
        if data.len() < len {
            return Err(codes::INVALID_FIELD_IN_CDB);
        }
        let _held = self.vol.ranges().lock(off, len as u64, true);
        self.dev
            .write_at(off, &data[..len], self.fua(&c))
            .map_err(|e| self.medium_error(&e, true, Some((off, len as u64))))?;
        Reply::none()
    }

    /// A write on behalf of the copy manager, under the same rules as a
    /// WRITE from an initiator.
    pub(crate) fn copy_write(&self, off: u64, data: &[u8]) -> Result<(), Sense> {
        if let Some(s) = self.write_protected() {
            return Err(s);
        }
        let _held = self.vol.ranges().lock(off, data.len() as u64, false);
        self.dev
            .write_at(off, data, self.vol.effective_fua(false))
            .map_err(|e| self.medium_error(&e, true, Some((off, data.len() as u64))))
    }

    /// Whether a write must reach stable storage before it completes: FUA
    /// asked for it, or the write cache is off (Caching page WCE = 0).
    pub(super) fn fua(&self, c: &BlockCdb) -> bool {
        self.vol.effective_fua(c.fua())
    }

    /// COMPARE AND WRITE: compare the first half of the Data-Out with the
    /// medium and, only if equal, write the second half — atomically.
    pub(super) fn compare_and_write(&self, cdb: &[u8], data: &[u8]) -> CmdResult {
        let c = BlockCdb::parse(cdb);
        Self::no_protection(&c)?;
        if c.blocks > self.max_compare_and_write() {
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
        let _held = self.vol.ranges().lock(off, len as u64, true);
        // A store shared by several gateways compares and writes itself,
        // atomically for all of them; else it is done here, under the
        // range lock (atomic within this process).
        match self.dev.compare_and_write(off, verify, write, self.fua(&c)) {
            Ok(None) => return Reply::none(),
            Ok(Some(at)) => return Err(codes::MISCOMPARE_VERIFY.with_info(at)),
            Err(BackendError::Unsupported) => {}
            Err(e) => return Err(self.medium_error(&e, true, Some((off, len as u64)))),
        }
        let mut medium = vec![0u8; len];
        self.dev
            .read_at(off, &mut medium)
            .map_err(|e| self.medium_error(&e, false, Some((off, len as u64))))?;
        if let Some(at) = medium.iter().zip(verify).position(|(a, b)| a != b) {
            return Err(codes::MISCOMPARE_VERIFY.with_info(at as u64));
        }
        self.dev
            .write_at(off, write, self.fua(&c))
            .map_err(|e| self.medium_error(&e, true, Some((off, len as u64))))?;
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
        let _held = self.vol.ranges().lock(off, len as u64, true);
        let mut medium = vec![0u8; len];
        self.dev
            .read_at(off, &mut medium)
            .map_err(|e| self.medium_error(&e, false, Some((off, len as u64))))?;
        for (m, d) in medium.iter_mut().zip(data) {
            *m |= d;
        }
        self.dev
            .write_at(off, &medium, self.fua(&c))
            .map_err(|e| self.medium_error(&e, true, Some((off, len as u64))))?;
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
        self.dev
            .read_at(off, &mut medium)
            .map_err(|e| self.medium_error(&e, false, Some((off, len as u64))))?;
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
                    blk.iter()
                        .zip(&data_out[..bs])
                        .position(|(a, b)| a != b)
                        .map(|p| i * bs + p)
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
    pub(super) fn cache_range(&self, c: &BlockCdb) -> Result<(u64, u64), Sense> {
        let cap = self.dev.num_blocks();
        match c.lba.checked_add(u64::from(c.blocks)) {
            Some(end) if end <= cap && c.lba <= cap => {}
            _ => return Err(codes::LBA_OUT_OF_RANGE),
        }
        let blocks = if c.blocks == 0 {
            cap - c.lba
        } else {
            u64::from(c.blocks)
        };
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
        // Logical blocks per physical block, as configured (a file on a
        // 4 KiB-block filesystem writes whole 4 KiB pages best).
        let bs = self.dev.block_size();
        let pbs = self.cfg.physical_block_size;
        if pbs > bs && pbs.is_multiple_of(bs) && (pbs / bs).is_power_of_two() {
            d[13] = (pbs / bs).trailing_zeros() as u8;
        }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::super::testing::*;
    use crate::sense::key;

    #[test]
    fn read_write_every_size_round_trips() {
        for bs in BLOCK_SIZES {
            let (t, _) = target(bs);
            let b = bs as usize;
            let cases: [(Vec<u8>, Vec<u8>); 4] = [
                (vec![0x0a, 0, 0, 1, 2, 0], vec![0x08, 0, 0, 1, 2, 0]),
                (cdb10(0x2a, 0, 3, 2), cdb10(0x28, 0, 3, 2)),
                (cdb12(0xaa, 0, 5, 2), cdb12(0xa8, 0, 5, 2)),
                (cdb16(0x8a, 0, 7, 2), cdb16(0x88, 0, 7, 2)),
            ];
            for (i, (w, r)) in cases.iter().enumerate() {
                let data = pattern(2 * b, i as u8);
                let resp = exec(&t, A, w, &data);
                assert_eq!(resp.data_out_len, Some(2 * b));
                good(resp);
                assert_eq!(good(exec(&t, A, r, &[])), data, "bs {bs} case {i}");
            }
            // READ(6) at LBA 1 reads what WRITE(6) put there.
            let first = good(exec(&t, A, &cdb10(0x28, 0, 1, 1), &[]));
            assert_eq!(first, pattern(2 * b, 0)[..b]);
        }
    }

    #[test]
    fn six_byte_zero_length_means_256_blocks_others_mean_none() {
        for bs in BLOCK_SIZES {
            let (t, dev) = target(bs);
            assert_eq!(
                good(exec(&t, A, &[0x08, 0, 0, 0, 0, 0], &[])).len(),
                256 * bs as usize
            );
            let r = exec(&t, A, &[0x0a, 0, 0, 0, 0, 0], &vec![1u8; 256 * bs as usize]);
            assert_eq!(r.data_out_len, Some(256 * bs as usize));
            good(r);
            assert!(good(exec(&t, A, &cdb10(0x28, 0, 0, 0), &[])).is_empty());
            let writes = dev.fua.lock().unwrap().len();
            let r = exec(&t, A, &cdb16(0x8a, 0, 0, 0), &[]);
            assert_eq!(r.data_out_len, Some(0));
            good(r);
            assert_eq!(
                dev.fua.lock().unwrap().len(),
                writes,
                "no transfer, no write"
            );
        }
    }

    #[test]
    fn protection_fields_are_invalid() {
        let (t, _) = target(512);
        for c in [
            cdb10(0x28, 0x20, 0, 1),
            cdb12(0xaa, 0x40, 0, 1),
            cdb16(0x8f, 0x80, 0, 1),
            cdb10(0x2e, 0x20, 0, 1),
        ] {
            let r = exec(&t, A, &c, &[0u8; 512]);
            check(&r, key::ILLEGAL_REQUEST, 0x24, 0);
            // SKSV | C/D | BPV, bit 7 of byte 1.
            assert_eq!(field_pointer(&r), [0xcf, 0, 1]);
        }
    }

    #[test]
    fn ranges_past_the_end_are_out_of_range() {
        for bs in BLOCK_SIZES {
            let (t, _) = target(bs);
            let blocks = DEV_BYTES / u64::from(bs);
            let last = (blocks - 1) as u32;
            good(exec(&t, A, &cdb10(0x28, 0, last, 1), &[]));
            for c in [
                cdb10(0x28, 0, last, 2),
                cdb10(0x2a, 0, last + 1, 1),
                cdb12(0xa8, 0, 0, u32::MAX),
                cdb16(0x88, 0, u64::MAX, 2),
                cdb16(0x8a, 0, u64::MAX, 1),
                cdb10(0x2f, 0, last + 2, 0),
                vec![0x08, 0x1f, 0xff, 0xff, 1, 0],
            ] {
                check(&exec(&t, A, &c, &[]), key::ILLEGAL_REQUEST, 0x21, 0);
            }
        }
    }

    #[test]
    fn transfer_above_the_block_limits_maximum_is_invalid() {
        let mut dev = TestDevice::new(512);
        dev.claimed_blocks = Some(1 << 30);
        let t = target_over(Arc::new(dev), config(false, false));
        let max = (super::super::MAX_TRANSFER_BYTES / 512) as u32;
        let r = exec(&t, A, &cdb16(0x88, 0, 1 << 20, max + 1), &[]);
        check(&r, key::ILLEGAL_REQUEST, 0x24, 0);
        assert_eq!(field_pointer(&r), [0xc0, 0, 10]);
        let r = exec(&t, A, &cdb12(0xaa, 0, 0, max + 1), &[]);
        assert_eq!(field_pointer(&r), [0xc0, 0, 6]);
    }

    #[test]
    fn read_only_units_refuse_writes() {
        for bs in BLOCK_SIZES {
            let t = target_over(Arc::new(TestDevice::new(bs)), config(false, true));
            let data = vec![0u8; bs as usize];
            for c in [
                vec![0x0a, 0, 0, 0, 1, 0],
                cdb10(0x2a, 0, 0, 1),
                cdb12(0xaa, 0, 0, 1),
                cdb16(0x8a, 0, 0, 1),
                cdb10(0x2e, 0, 0, 1),
            ] {
                check(&exec(&t, A, &c, &data), key::DATA_PROTECT, 0x27, 0);
            }
            good(exec(&t, A, &cdb10(0x28, 0, 0, 1), &[]));
        }
    }

    #[test]
    fn backend_errors_are_medium_errors() {
        let (t, dev) = target(4096);
        dev.fail_reads.store(true, Ordering::Relaxed);
        check(
            &exec(&t, A, &cdb10(0x28, 0, 0, 1), &[]),
            key::MEDIUM_ERROR,
            0x11,
            0,
        );
        check(
            &exec(&t, A, &cdb10(0x2f, 0, 0, 1), &[]),
            key::MEDIUM_ERROR,
            0x11,
            0,
        );
        dev.fail_writes.store(true, Ordering::Relaxed);
        check(
            &exec(&t, A, &cdb10(0x2a, 0, 0, 1), &[0u8; 4096]),
            key::MEDIUM_ERROR,
            0x0c,
            0,
        );
        check(
            &exec(&t, A, &cdb10(0x35, 0, 0, 0), &[]),
            key::MEDIUM_ERROR,
            0x0c,
            0,
        );
    }

    #[test]
    fn a_partial_block_of_data_out_writes_nothing() {
        for bs in BLOCK_SIZES {
            let (t, _) = target(bs);
            let b = bs as usize;
            good(exec(&t, A, &cdb10(0x2a, 0, 0, 2), &vec![b'a'; 2 * b]));
            for sent in [200, b + 200] {
                let r = exec(&t, A, &cdb10(0x2a, 0, 0, 2), &vec![b'b'; sent]);
                check(&r, key::ILLEGAL_REQUEST, 0x0e, 0x03);
                assert_eq!(r.data_out_len, Some(2 * b));
                assert_eq!(
                    good(exec(&t, A, &cdb10(0x28, 0, 0, 2), &[])),
                    vec![b'a'; 2 * b]
                );
            }
            // More Data-Out than asked for: only the blocks asked for are written.
            good(exec(&t, A, &cdb10(0x2a, 0, 0, 1), &vec![b'c'; 10000]));
            let back = good(exec(&t, A, &cdb10(0x28, 0, 0, 2), &[]));
            assert_eq!(back, [vec![b'c'; b], vec![b'a'; b]].concat());
        }
    }

    #[test]
    fn short_data_out_writes_the_whole_blocks_that_arrived() {
        let (t, _) = target(512);
        good(exec(&t, A, &cdb10(0x2a, 0, 0, 4), &[0xaa; 2048]));
        // Four blocks asked for, one sent.
        let r = exec(&t, A, &cdb10(0x2a, 0, 0, 4), &[0x55; 512]);
        assert_eq!(r.data_out_len, Some(2048));
        good(r);
        let back = good(exec(&t, A, &cdb10(0x28, 0, 0, 4), &[]));
        assert!(back[..512].iter().all(|b| *b == 0x55));
        assert!(
            back[512..].iter().all(|b| *b == 0xaa),
            "the blocks not sent are untouched"
        );
    }

    #[test]
    fn fua_and_write_cache_decide_durability() {
        for bs in BLOCK_SIZES {
            let (t, dev) = target(bs);
            let d = vec![7u8; bs as usize];
            good(exec(&t, A, &cdb10(0x2a, 0, 0, 1), &d));
            good(exec(&t, A, &cdb10(0x2a, 0x08, 0, 1), &d)); // FUA
            good(exec(&t, A, &cdb10(0x2a, 0x10, 0, 1), &d)); // DPO only
            good(exec(&t, A, &cdb10(0x2e, 0, 0, 1), &d)); // WRITE AND VERIFY
            assert_eq!(*dev.fua.lock().unwrap(), [false, true, false, true]);
        }
    }

    #[test]
    fn verify_compares_with_bytchk() {
        for bs in BLOCK_SIZES {
            let (t, _) = target(bs);
            let b = bs as usize;
            let data = pattern(3 * b, 9);
            good(exec(&t, A, &cdb10(0x2a, 0, 10, 3), &data));
            // BYTCHK 0: medium only.
            good(exec(&t, A, &cdb10(0x2f, 0, 10, 3), &[]));
            // BYTCHK 1: whole range.
            for c in [
                cdb10(0x2f, 0x02, 10, 3),
                cdb12(0xaf, 0x02, 10, 3),
                cdb16(0x8f, 0x02, 10, 3),
            ] {
                let r = exec(&t, A, &c, &data);
                assert_eq!(r.data_out_len, Some(3 * b));
                good(r);
            }
            let mut bad = data.clone();
            bad[b + 17] ^= 0xff;
            let r = exec(&t, A, &cdb16(0x8f, 0x02, 10, 3), &bad);
            check(&r, key::MISCOMPARE, 0x1d, 0);
            assert_eq!(r.sense[0], 0xf0, "VALID: INFORMATION holds the offset");
            assert_eq!(&r.sense[3..7], &((b + 17) as u32).to_be_bytes());
            // BYTCHK 3: one block compared with every block of the range.
            let same = vec![0x5au8; b];
            good(exec(
                &t,
                A,
                &cdb10(0x2a, 0, 20, 2),
                &[same.clone(), same.clone()].concat(),
            ));
            let r = exec(&t, A, &cdb10(0x2f, 0x06, 20, 2), &same);
            assert_eq!(r.data_out_len, Some(b));
            good(r);
            let r = exec(&t, A, &cdb10(0x2f, 0x06, 19, 2), &same);
            check(&r, key::MISCOMPARE, 0x1d, 0);
            assert_eq!(&r.sense[3..7], &0u32.to_be_bytes());
            // BYTCHK 2 is reserved.
            let r = exec(&t, A, &cdb10(0x2f, 0x04, 20, 1), &same);
            check(&r, key::ILLEGAL_REQUEST, 0x24, 0);
            // Too little Data-Out to compare.
            check(
                &exec(&t, A, &cdb10(0x2f, 0x02, 10, 3), &data[..b]),
                key::ILLEGAL_REQUEST,
                0x24,
                0,
            );
            check(
                &exec(&t, A, &cdb10(0x2f, 0x06, 10, 3), &[]),
                key::ILLEGAL_REQUEST,
                0x24,
                0,
            );
        }
    }

    #[test]
    fn write_and_verify_all_sizes() {
        let (t, _) = target(512);
        let data = pattern(1024, 3);
        for c in [
            cdb10(0x2e, 0x02, 0, 2),
            cdb12(0xae, 0x02, 0, 2),
            cdb16(0x8e, 0x02, 0, 2),
            cdb16(0x8e, 0, 0, 2),
        ] {
            good(exec(&t, A, &c, &data));
            assert_eq!(good(exec(&t, A, &cdb10(0x28, 0, 0, 2), &[])), data);
        }
        check(
            &exec(&t, A, &cdb10(0x2e, 0x04, 0, 2), &data),
            key::ILLEGAL_REQUEST,
            0x24,
            0,
        );
    }

    #[test]
    fn prefetch_hints_and_checks_the_range() {
        for bs in BLOCK_SIZES {
            let (t, dev) = target(bs);
            let blocks = DEV_BYTES / u64::from(bs);
            for c in [
                cdb10(0x34, 0, 0, 1),
                cdb10(0x34, 0x02, 0, 1),
                cdb16(0x90, 0, blocks - 256, 256),
                cdb16(0x90, 0x02, 0, 0),
            ] {
                assert_eq!(exec(&t, A, &c, &[]).status, crate::ScsiStatus::Good);
            }
            assert_eq!(dev.prefetches.load(Ordering::Relaxed), 4);
            // 0 blocks at the very end: nothing to fetch, not an error.
            good(exec(&t, A, &cdb16(0x90, 0, blocks, 0), &[]));
            for c in [
                cdb10(0x34, 0, blocks as u32 + 1, 0),
                cdb10(0x34, 0, u32::MAX, 0),
                cdb16(0x90, 0, blocks - 1, 2),
            ] {
                check(&exec(&t, A, &c, &[]), key::ILLEGAL_REQUEST, 0x21, 0);
            }
        }
    }

    #[test]
    fn synchronize_cache_flushes_after_range_checks() {
        let (t, dev) = target(512);
        good(exec(&t, A, &cdb10(0x35, 0, 0, 0), &[]));
        good(exec(&t, A, &cdb16(0x91, 0x02, 8, 8), &[]));
        assert_eq!(dev.flushes.load(Ordering::Relaxed), 2);
        check(
            &exec(&t, A, &cdb16(0x91, 0, u64::MAX, 1), &[]),
            key::ILLEGAL_REQUEST,
            0x21,
            0,
        );
        assert_eq!(dev.flushes.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn read_capacity_10_and_16() {
        for bs in BLOCK_SIZES {
            let (t, _) = target(bs);
            let last = DEV_BYTES / u64::from(bs) - 1;
            let d = good(exec(&t, A, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
            assert_eq!(d[..4], (last as u32).to_be_bytes());
            assert_eq!(d[4..8], bs.to_be_bytes());
            let d = good(exec(&t, A, &cdb16(0x9e, 0x10, 0, 32), &[]));
            assert_eq!(d.len(), 32);
            assert_eq!(d[..8], last.to_be_bytes());
            assert_eq!(d[8..12], bs.to_be_bytes());
            assert_eq!(
                (d[12], d[13], d[14]),
                (0, 0, 0),
                "no protection, exponent 0, LBPME/LBPRZ 0"
            );
            assert_eq!(good(exec(&t, A, &cdb16(0x9e, 0x10, 0, 12), &[])).len(), 12);
            // PMI = 0 with a nonzero LBA.
            check(
                &exec(&t, A, &[0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0], &[]),
                key::ILLEGAL_REQUEST,
                0x24,
                0,
            );
            check(
                &exec(&t, A, &cdb16(0x9e, 0x10, 1, 32), &[]),
                key::ILLEGAL_REQUEST,
                0x24,
                0,
            );
        }
        // Too big for READ CAPACITY(10).
        let mut dev = TestDevice::new(512);
        dev.claimed_blocks = Some(1 << 33);
        let t = target_over(Arc::new(dev), config(false, false));
        let d = good(exec(&t, A, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
        assert_eq!(d[..4], [0xff; 4]);
        let d = good(exec(&t, A, &cdb16(0x9e, 0x10, 0, 32), &[]));
        assert_eq!(d[..8], ((1u64 << 33) - 1).to_be_bytes());
    }
}
