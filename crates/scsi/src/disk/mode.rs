//! SPC-4 §7.5 mode parameters: the Caching (0x08), Control (0x0A) and
//! Informational Exceptions Control (0x1C) pages through MODE SENSE and
//! MODE SELECT (6/10). WCE, D_SENSE and SWP are changeable; the values the
//! I/O path needs are mirrored in atomics.

use ethersan_backend::BlockDeviceExt;

use super::{CmdResult, LogicalUnit, Reply};
use crate::be::be16;
use crate::sense::{codes, Sense};
use crate::Nexus;

/// Mode page state (SPC-4 §7.5, SBC-3 §6.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ModeState {
    /// Caching page: write cache enable.
    pub(super) wce: bool,
    /// Control page: descriptor-format sense.
    pub(super) d_sense: bool,
    /// Control page: software write protect.
    pub(super) swp: bool,
}

impl LogicalUnit {
    // ---- mode pages ----

    /// One mode page, current / changeable / default.
    fn mode_page(&self, code: u8, pc: u8, m: &ModeState) -> Option<Vec<u8>> {
        let changeable = pc == 1;
        match code {
            0x08 => {
                let mut p = vec![0u8; 20];
                p[0] = 0x08;
                p[1] = 0x12;
                if changeable || m.wce {
                    p[2] = 0x04; // WCE (changeable, or its current value)
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

    /// MODE SENSE (6/10): header, optional block descriptor (short, or
    /// long with LLBAA), then the page asked for or all of them (0x3F).
    pub(super) fn mode_sense(&self, cdb: &[u8]) -> CmdResult {
        let ten = cdb[0] == 0x5a;
        let dbd = cdb[1] & 0x08 != 0;
        let llbaa = ten && cdb[1] & 0x10 != 0;
        let pc = cdb[2] >> 6;
        let code = cdb[2] & 0x3f;
        let sub = cdb[3];
        let alloc = if ten {
            usize::from(be16(&cdb[7..9]))
        } else {
            usize::from(cdb[4])
        };
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
            pages = self
                .mode_page(code, pc, &m)
                .ok_or(Sense::invalid_cdb_field(2, Some(5)))?;
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

    /// MODE SELECT (6/10): PF must be set, SP cannot be; every page sent
    /// must match the current one except in changeable bits. A change
    /// raises MODE PARAMETERS CHANGED for the other nexuses.
    pub(super) fn mode_select(&self, cdb: &[u8], data: &[u8], nexus: Nexus) -> CmdResult {
        let ten = cdb[0] == 0x55;
        let len = if ten {
            usize::from(be16(&cdb[7..9]))
        } else {
            usize::from(cdb[4])
        };
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
        let bd_len = if ten {
            usize::from(be16(&data[6..8]))
        } else {
            usize::from(data[3])
        };
        let mut at = hdr + bd_len;
        if at > data.len() {
            return Err(codes::PARAM_LIST_LENGTH);
        }
        // Block descriptors may restate the block length but not change
        // it (short descriptor: bytes 5-7; long: bytes 12-15).
        let long = ten && data[4] & 0x01 != 0;
        let bd_size = if long { 16 } else { 8 };
        for (i, bd) in data[hdr..hdr + bd_len].chunks(bd_size).enumerate() {
            let field = if long { 12..16 } else { 5..8 };
            let Some(len) = bd.get(field.clone()) else {
                return Err(codes::PARAM_LIST_LENGTH);
            };
            let length = len.iter().fold(0u32, |acc, b| acc << 8 | u32::from(*b));
            if length != 0 && length != self.dev.block_size() {
                return Err(Sense::invalid_param_field(
                    (hdr + i * bd_size + field.start) as u16,
                ));
            }
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
            let current = self
                .mode_page(code, 0, &m)
                .ok_or(Sense::invalid_param_field(at as u16))?;
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
            drop(st);
            self.ua
                .raise_all(codes::MODE_PARAMETERS_CHANGED, Some(nexus));
            if was_wce && !m.wce {
                // Turning the cache off: what was cached must be durable now.
                self.dev
                    .flush()
                    .map_err(|e| self.medium_error(&e, true, None))?;
            }
        }
        Reply::none()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use crate::sense::key;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    fn sense6(dbd: bool, pc: u8, page: u8, alloc: u8) -> Vec<u8> {
        vec![
            0x1a,
            if dbd { 0x08 } else { 0 },
            pc << 6 | page,
            0,
            alloc,
            0,
        ]
    }

    fn sense10(llbaa: bool, dbd: bool, pc: u8, page: u8) -> Vec<u8> {
        vec![
            0x5a,
            u8::from(llbaa) << 4 | u8::from(dbd) << 3,
            pc << 6 | page,
            0,
            0,
            0,
            0,
            0xff,
            0xff,
            0,
        ]
    }

    /// Find `code` in the pages after the header and block descriptors.
    fn page(data: &[u8], ten: bool, code: u8) -> Option<Vec<u8>> {
        let (hdr, bd) = if ten {
            (8, usize::from(u16::from_be_bytes([data[6], data[7]])))
        } else {
            (4, usize::from(data[3]))
        };
        let mut at = hdr + bd;
        while at + 2 <= data.len() {
            let len = usize::from(data[at + 1]) + 2;
            if data[at] & 0x3f == code {
                return Some(data[at..at + len].to_vec());
            }
            at += len;
        }
        None
    }

    /// MODE SELECT(6) with PF and one page.
    fn select6(page: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let mut data = vec![0, 0, 0, 0];
        data.extend_from_slice(page);
        (vec![0x15, 0x10, 0, 0, data.len() as u8, 0], data)
    }

    #[test]
    fn mode_sense_pages_headers_and_descriptors() {
        for bs in BLOCK_SIZES {
            let (t, _) = target(bs);
            let blocks = DEV_BYTES / u64::from(bs);
            let d = good(exec(&t, A, &sense6(false, 0, 0x3f, 255), &[]));
            assert_eq!(usize::from(d[0]), d.len() - 1);
            assert_eq!(d[2] & 0x80, 0, "not write protected");
            assert_eq!(d[3], 8, "one short block descriptor");
            assert_eq!(d[4..8], (blocks as u32).to_be_bytes());
            assert_eq!(d[9..12], bs.to_be_bytes()[1..]);
            for code in [0x08, 0x0a, 0x1c] {
                assert!(page(&d, false, code).is_some(), "page {code:#x}");
            }
            let caching = page(&d, false, 0x08).unwrap();
            assert_eq!(caching[2] & 0x04, 0x04, "WCE on");
            // DBD drops the descriptor.
            let d = good(exec(&t, A, &sense6(true, 0, 0x08, 255), &[]));
            assert_eq!(d[3], 0);
            assert_eq!(d[4], 0x08);
            // MODE SENSE(10) with LLBAA: long descriptor.
            let d = good(exec(&t, A, &sense10(true, false, 0, 0x0a), &[]));
            assert_eq!(usize::from(u16::from_be_bytes([d[0], d[1]])), d.len() - 2);
            assert_eq!(d[4] & 1, 1, "LONGLBA");
            assert_eq!(u16::from_be_bytes([d[6], d[7]]), 16);
            assert_eq!(d[8..16], blocks.to_be_bytes());
            assert_eq!(d[20..24], bs.to_be_bytes());
            assert_eq!(d[24], 0x0a);
            // Allocation length truncates.
            assert_eq!(good(exec(&t, A, &sense6(false, 0, 0x3f, 4), &[])).len(), 4);
        }
    }

    #[test]
    fn page_controls() {
        let (t, _) = target(512);
        let changeable = good(exec(&t, A, &sense6(true, 1, 0x3f, 255), &[]));
        assert_eq!(
            page(&changeable, false, 0x08).unwrap()[2],
            0x04,
            "only WCE changeable in Caching"
        );
        let control = page(&changeable, false, 0x0a).unwrap();
        assert_eq!(control[2], 0x04, "D_SENSE changeable");
        assert_eq!(control[4], 0x08, "SWP changeable");
        assert!(page(&changeable, false, 0x1c).unwrap()[2..]
            .iter()
            .all(|b| *b == 0));
        good(exec(&t, A, &sense6(true, 2, 0x3f, 255), &[]));
        check(
            &exec(&t, A, &sense6(true, 3, 0x08, 255), &[]),
            key::ILLEGAL_REQUEST,
            0x39,
            0,
        );
        // Unknown page, bad subpage.
        check(
            &exec(&t, A, &sense6(true, 0, 0x19, 255), &[]),
            key::ILLEGAL_REQUEST,
            0x24,
            0,
        );
        check(
            &exec(&t, A, &[0x1a, 0, 0x08, 0x01, 255, 0], &[]),
            key::ILLEGAL_REQUEST,
            0x24,
            0,
        );
    }

    #[test]
    fn read_only_units_set_wp() {
        let t = target_over(Arc::new(TestDevice::new(4096)), config(false, true));
        let d = good(exec(&t, A, &sense6(false, 0, 0x3f, 255), &[]));
        assert_eq!(d[2] & 0x80, 0x80);
        let d = good(exec(&t, A, &sense10(false, true, 0, 0x08), &[]));
        assert_eq!(d[3] & 0x80, 0x80);
    }

    #[test]
    fn mode_select_wce_is_honoured_and_announced_to_others() {
        for bs in BLOCK_SIZES {
            let (t, dev) = target(bs);
            let current = good(exec(&t, A, &sense6(true, 0, 0x08, 255), &[]));
            let mut caching = page(&current, false, 0x08).unwrap();
            caching[0] &= 0x3f; // PS is reserved in MODE SELECT
            caching[2] &= !0x04;
            let (cdb, data) = select6(&caching);
            let r = exec(&t, A, &cdb, &data);
            assert_eq!(r.data_out_len, Some(data.len()));
            good(r);
            assert!(
                dev.flushes.load(Ordering::Relaxed) >= 1,
                "turning the cache off flushes"
            );
            // The other nexus hears of it once; the one that changed it does not.
            check(
                &exec(&t, B, &[0, 0, 0, 0, 0, 0], &[]),
                key::UNIT_ATTENTION,
                0x2a,
                0x01,
            );
            good(exec(&t, B, &[0, 0, 0, 0, 0, 0], &[]));
            good(exec(&t, A, &[0, 0, 0, 0, 0, 0], &[]));
            let d = good(exec(&t, A, &sense6(true, 0, 0x08, 255), &[]));
            assert_eq!(page(&d, false, 0x08).unwrap()[2] & 0x04, 0);
            // WCE = 0: every write is forced to stable storage.
            good(exec(&t, A, &cdb10(0x2a, 0, 0, 1), &vec![1u8; bs as usize]));
            assert_eq!(dev.fua.lock().unwrap().last(), Some(&true));
            // Same page again: no change, no unit attention.
            good(exec(&t, A, &cdb, &data));
            good(exec(&t, B, &[0, 0, 0, 0, 0, 0], &[]));
        }
    }

    #[test]
    fn mode_select_validation() {
        let (t, _) = target(512);
        let current = good(exec(&t, A, &sense6(true, 0, 0x0a, 255), &[]));
        let mut control = page(&current, false, 0x0a).unwrap();
        control[0] &= 0x3f;
        let (cdb, data) = select6(&control);
        // PF = 0 and SP = 1 are refused.
        let mut no_pf = cdb.clone();
        no_pf[1] = 0;
        check(&exec(&t, A, &no_pf, &data), key::ILLEGAL_REQUEST, 0x24, 0);
        let mut sp = cdb.clone();
        sp[1] = 0x11;
        check(&exec(&t, A, &sp, &data), key::ILLEGAL_REQUEST, 0x24, 0);
        // An unchangeable field (QErr) changed.
        let mut bad = control.clone();
        bad[3] ^= 0x02;
        let (c, d) = select6(&bad);
        let r = exec(&t, A, &c, &d);
        check(&r, key::ILLEGAL_REQUEST, 0x26, 0);
        assert_eq!(field_pointer(&r), [0x80, 0, 4 + 3]);
        // Wrong page length, unknown page.
        let mut short = control.clone();
        short[1] -= 2;
        short.truncate(short.len() - 2);
        let (c, d) = select6(&short);
        check(&exec(&t, A, &c, &d), key::ILLEGAL_REQUEST, 0x26, 0);
        let (c, d) = select6(&[0x19, 2, 0, 0]);
        check(&exec(&t, A, &c, &d), key::ILLEGAL_REQUEST, 0x26, 0);
        // Less Data-Out than the parameter list length.
        check(
            &exec(&t, A, &cdb, &data[..5]),
            key::ILLEGAL_REQUEST,
            0x1a,
            0,
        );
        // A block descriptor may restate the block length, not change it.
        let mut with_bd = vec![0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x02, 0x00];
        with_bd.extend_from_slice(&control);
        good(exec(
            &t,
            A,
            &[0x15, 0x10, 0, 0, with_bd.len() as u8, 0],
            &with_bd,
        ));
        with_bd[10] = 0x10;
        let r = exec(&t, A, &[0x15, 0x10, 0, 0, with_bd.len() as u8, 0], &with_bd);
        check(&r, key::ILLEGAL_REQUEST, 0x26, 0);
        assert_eq!(field_pointer(&r), [0x80, 0, 9]);
        // Length 0: nothing to do.
        good(exec(&t, A, &[0x15, 0x10, 0, 0, 0, 0], &[]));
        // MODE SELECT(10) carries the same page.
        let mut data10 = vec![0u8; 8];
        data10.extend_from_slice(&control);
        let n = (data10.len() as u16).to_be_bytes();
        good(exec(
            &t,
            A,
            &[0x55, 0x10, 0, 0, 0, 0, 0, n[0], n[1], 0],
            &data10,
        ));
    }

    #[test]
    fn d_sense_switches_to_descriptor_format() {
        let (t, _) = target(512);
        let current = good(exec(&t, A, &sense6(true, 0, 0x0a, 255), &[]));
        let mut control = page(&current, false, 0x0a).unwrap();
        control[0] &= 0x3f;
        control[2] |= 0x04;
        let (cdb, data) = select6(&control);
        good(exec(&t, A, &cdb, &data));
        let r = exec(&t, A, &[0xff, 0, 0, 0, 0, 0], &[]);
        assert_eq!(r.sense[0], 0x72);
        check(&r, key::ILLEGAL_REQUEST, 0x20, 0);
        // Miscompare INFORMATION moves to a descriptor.
        good(exec(&t, A, &cdb10(0x2a, 0, 0, 1), &[0u8; 512]));
        let mut other = vec![0u8; 512];
        other[3] = 1;
        let r = exec(&t, A, &cdb10(0x2f, 0x02, 0, 1), &other);
        check(&r, key::MISCOMPARE, 0x1d, 0);
        assert_eq!(&r.sense[8..12], &[0x00, 0x0a, 0x80, 0]);
        assert_eq!(&r.sense[12..20], &3u64.to_be_bytes());
        // A cold reset restores the default: fixed format again.
        t.reset(crate::ResetKind::TargetCold, None, A);
        let r = exec(&t, A, &[0, 0, 0, 0, 0, 0], &[]);
        assert_eq!(r.sense[0], 0x70);
    }
}
