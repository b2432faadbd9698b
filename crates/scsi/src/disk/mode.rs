//! SPC-4 §7.5 mode parameters: the Caching (0x08), Control (0x0A) and
//! Informational Exceptions Control (0x1C) pages through MODE SENSE and
//! MODE SELECT (6/10). WCE, D_SENSE and SWP are changeable; the values the
//! I/O path needs are mirrored in atomics.

use super::{backend_sense, CmdResult, LogicalUnit, Reply};
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
                if changeable {
                    p[2] = 0x04;
                } else if m.wce {
                    p[2] = 0x04;
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
        let alloc = if ten { usize::from(be16(&cdb[7..9])) } else { usize::from(cdb[4]) };
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
            pages = self.mode_page(code, pc, &m).ok_or(Sense::invalid_cdb_field(2, Some(5)))?;
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
        let len = if ten { usize::from(be16(&cdb[7..9])) } else { usize::from(cdb[4]) };
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
        let bd_len = if ten { usize::from(be16(&data[6..8])) } else { usize::from(data[3]) };
        let mut at = hdr + bd_len;
        if at > data.len() {
            return Err(codes::PARAM_LIST_LENGTH);
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
            let current = self.mode_page(code, 0, &m).ok_or(Sense::invalid_param_field(at as u16))?;
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
            self.ua.raise_all(codes::MODE_PARAMETERS_CHANGED, Some(nexus));
            if was_wce && !m.wce {
                // Turning the cache off: what was cached must be durable now.
                self.dev.flush().map_err(|e| backend_sense(&e, true))?;
            }
        }
        Reply::none()
    }

}
