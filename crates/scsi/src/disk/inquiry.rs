//! SPC-4 §6.6 INQUIRY: standard data and the vital product data pages
//! 0x00 (supported pages), 0x80 (unit serial number), 0x83 (device
//! identification), 0x8F (third-party copy), 0xB0 (block limits), 0xB1
//! (block device characteristics) and 0xB2 (logical block provisioning).

use super::{
    CmdResult, LogicalUnit, Reply, MAX_ATOMIC_BYTES, MAX_COMPARE_AND_WRITE, MAX_TRANSFER_BYTES,
    MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS,
};
use crate::be::be16;
use crate::sense::Sense;

impl LogicalUnit {
    /// INQUIRY: standard data, or the VPD page EVPD asks for. A page code
    /// without EVPD, an unknown page, or CmdDt (refused earlier by the
    /// command table's usage mask) is INVALID FIELD IN CDB.
    pub(super) fn inquiry(&self, cdb: &[u8]) -> CmdResult {
        let alloc = usize::from(be16(&cdb[3..5]));
        let evpd = cdb[1] & 1 != 0;
        if !evpd {
            if cdb[2] != 0 {
                return Err(Sense::invalid_cdb_field(2, None));
            }
            return Reply::data(self.standard_inquiry(), alloc);
        }
        let page = match cdb[2] {
            0x00 => {
                let pages = [0x00, 0x80, 0x83, 0x8f, 0xb0, 0xb1, 0xb2];
                vpd(0x00, &pages)
            }
            0x80 => vpd(
                0x80,
                &pad(&self.cfg.serial, self.cfg.serial.len().clamp(1, 252)),
            ),
            0x83 => vpd(0x83, &self.device_identification()),
            0x8f => vpd(0x8f, &third_party_copy_page()),
            0xb0 => vpd(0xb0, &self.block_limits()),
            0xb1 => {
                let mut p = vec![0u8; 0x3c];
                p[1] = 1; // medium rotation rate: non-rotating medium
                          // WABEREQ = WACEREQ = 01b: reads after a block or crypto
                          // erase succeed (and return zeros).
                p[3] = 0x50;
                vpd(0xb1, &p)
            }
            0xb2 => {
                // LBPU, LBPWS, LBPWS10 and LBPRZ on thin LUNs; provisioning type 2 (thin).
                let thin = self.dev.thin_provisioned();
                vpd(
                    0xb2,
                    &[0, if thin { 0xe4 } else { 0 }, if thin { 2 } else { 0 }, 0],
                )
            }
            _ => return Err(Sense::invalid_cdb_field(2, None)),
        };
        Reply::data(page, alloc)
    }

    /// Standard INQUIRY data (SPC-4 §6.6.2), 96 bytes.
    fn standard_inquiry(&self) -> Vec<u8> {
        let mut d = vec![0u8; 96];
        d[0] = 0x00; // connected, direct-access block device
        d[1] = if self.cfg.removable { 0x80 } else { 0 };
        d[2] = 0x06; // SPC-4
        d[3] = 0x12; // HiSup, response data format 2
        d[4] = (d.len() - 5) as u8;
        // TPGS 11b: implicit and explicit ALUA (SPC-4 §5.16); 3PC:
        // third-party copy (EXTENDED COPY).
        d[5] = 0x30 | 0x08;
        d[7] = 0x02; // CmdQue
        d[8..16].copy_from_slice(&pad(&self.cfg.vendor, 8));
        d[16..32].copy_from_slice(&pad(&self.cfg.product, 16));
        d[32..36].copy_from_slice(&pad(&self.cfg.revision, 4));
        // Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
        for (i, v) in [0x00a0u16, 0x0960, 0x0460, 0x04c0].iter().enumerate() {
            d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
        }
        d
    }

    /// VPD 0x83 body: designators derived from configuration only, so they
    /// are stable across restarts.
    pub(super) fn device_identification(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut desig = |proto_codeset: u8, piv_assoc_type: u8, body: &[u8]| {
            out.extend_from_slice(&[proto_codeset, piv_assoc_type, 0, body.len() as u8]);
            out.extend_from_slice(body);
        };
        // NAA, logical unit: IEEE Registered (NAA 5, 8 bytes) or IEEE
        // Registered Extended (NAA 6, 16 bytes).
        let naa_len = if self.cfg.naa[0] >> 4 == 5 { 8 } else { 16 };
        desig(0x01, 0x03, &self.cfg.naa[..naa_len]);
        // T10 vendor ID: vendor + serial, logical unit.
        let mut t10 = pad(&self.cfg.vendor, 8);
        t10.extend(self.cfg.serial.bytes().take(64));
        desig(0x02, 0x01, &t10);
        // Relative target port (type 4) and target port group (type 5) of
        // this gateway: association target port, iSCSI, PIV.
        let [p0, p1] = self.cfg.alua.rel_port.to_be_bytes();
        desig(0x51, 0x94, &[0, 0, p0, p1]);
        let [g0, g1] = self.cfg.alua.group.to_be_bytes();
        desig(0x51, 0x95, &[0, 0, g0, g1]);
        // SCSI name string of the target device (UTF-8, NUL-padded to 4).
        let mut name = self.cfg.target_name.clone().into_bytes();
        name.truncate(251);
        name.push(0);
        while !name.len().is_multiple_of(4) {
            name.push(0);
        }
        desig(0x53, 0xa8, &name);
        out
    }

    /// VPD 0xB0 body (SBC-3 §6.6.4).
    fn block_limits(&self) -> Vec<u8> {
        let mut p = vec![0u8; 0x3c];
        let bs = self.bs();
        let max_blocks = (MAX_TRANSFER_BYTES / bs) as u32;
        p[1] = MAX_COMPARE_AND_WRITE as u8;
        if self.dev.thin_provisioned() {
            p[16..20].copy_from_slice(&(MAX_UNMAP_BLOCKS as u32).to_be_bytes());
            p[20..24].copy_from_slice(&(MAX_UNMAP_DESCRIPTORS as u32).to_be_bytes());
            p[24..28].copy_from_slice(&(((4096 / bs).max(1)) as u32).to_be_bytes());
            // optimal unmap granularity
        }
        p[32..40].copy_from_slice(&self.max_write_same_blocks().to_be_bytes());
        // WRITE ATOMIC: maximum atomic transfer length, alignment and
        // granularity (one 4 KiB page).
        let atomic_blocks = (MAX_ATOMIC_BYTES / bs).max(1) as u32;
        p[40..44].copy_from_slice(&atomic_blocks.to_be_bytes());
        p[44..48].copy_from_slice(&(self.atomic_unit_blocks() as u32).to_be_bytes());
        p[48..52].copy_from_slice(&(self.atomic_unit_blocks() as u32).to_be_bytes());
        let granularity: u16 = if bs >= 4096 { 1 } else { 8 };
        p[2..4].copy_from_slice(&granularity.to_be_bytes()); // optimal transfer length granularity
        p[4..8].copy_from_slice(&max_blocks.to_be_bytes()); // maximum transfer length
        p[8..12].copy_from_slice(&(((1u64 << 20) / bs) as u32).to_be_bytes()); // optimal transfer length
        p[12..16].copy_from_slice(&max_blocks.to_be_bytes()); // maximum prefetch length
        p
    }

    /// Whether VPD page 0x83 carries this logical-unit designator.
    pub(crate) fn has_designator(&self, code_set: u8, kind: u8, body: &[u8]) -> bool {
        let page = self.device_identification();
        let mut at = 0;
        while at + 4 <= page.len() {
            let len = usize::from(page[at + 3]);
            let assoc = (page[at + 1] >> 4) & 3;
            if assoc == 0
                && page[at] & 0x0f == code_set
                && page[at + 1] & 0x0f == kind
                && page.get(at + 4..at + 4 + len) == Some(body)
            {
                return true;
            }
            at += 4 + len;
        }
        false
    }
}
/// A VPD page: header (peripheral byte, page code, length) and body.
fn vpd(code: u8, body: &[u8]) -> Vec<u8> {
    let mut p = vec![0x00, code];
    p.extend_from_slice(&(body.len() as u16).to_be_bytes());
    p.extend_from_slice(body);
    p
}

/// VPD page 0x8F body: a Supported Commands descriptor listing the
/// third-party copy commands and their service actions.
fn third_party_copy_page() -> Vec<u8> {
    let list: &[u8] = &[0x83, 1, 0x00, 0x84, 2, 0x00, 0x03];
    let mut desc = vec![list.len() as u8];
    desc.extend_from_slice(list);
    while (desc.len() + 4) % 4 != 0 {
        desc.push(0);
    }
    let mut out = vec![0x00, 0x00];
    out.extend_from_slice(&(desc.len() as u16).to_be_bytes());
    out.extend(desc);
    out
}
/// `s` as printable ASCII, cut or space-padded to `n` bytes.
fn pad(s: &str, n: usize) -> Vec<u8> {
    let mut v: Vec<u8> = s
        .bytes()
        .filter(|b| (0x20..0x7f).contains(b))
        .take(n)
        .collect();
    v.resize(n, b' ');
    v
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::testing::*;
    use crate::sense::key;

    fn inquiry(evpd: bool, page: u8, alloc: u16) -> Vec<u8> {
        let a = alloc.to_be_bytes();
        vec![0x12, u8::from(evpd), page, a[0], a[1], 0]
    }

    /// The designators of a VPD 0x83 page: (code set, PIV/association/type, body).
    fn designators(page: &[u8]) -> Vec<(u8, u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = 4;
        while at + 4 <= page.len() {
            let len = usize::from(page[at + 3]);
            out.push((page[at], page[at + 1], page[at + 4..at + 4 + len].to_vec()));
            at += 4 + len;
        }
        assert_eq!(at, page.len());
        out
    }

    #[test]
    fn standard_data() {
        for removable in [false, true] {
            let t = target_over(Arc::new(TestDevice::new(512)), config(removable, false));
            let d = good(exec(&t, A, &inquiry(false, 0, 255), &[]));
            assert_eq!(d.len(), 96);
            assert_eq!(d[0], 0, "connected direct-access device");
            assert_eq!(d[1], if removable { 0x80 } else { 0 });
            assert_eq!(d[2], 0x06, "SPC-4");
            assert_eq!(d[3], 0x12, "HiSup, format 2, NormACA 0");
            assert_eq!(usize::from(d[4]), d.len() - 5);
            assert_eq!(d[7] & 0x02, 0x02, "CmdQue");
            assert_eq!(&d[8..16], b"ETHERSAN");
            assert_eq!(&d[16..32], b"unit test disk  ");
            assert_eq!(&d[32..36], b"0001");
            assert_eq!(&d[58..60], &[0x00, 0xa0], "SAM-5 version descriptor");
            // Allocation length truncates.
            assert_eq!(good(exec(&t, A, &inquiry(false, 0, 5), &[])), d[..5]);
            assert!(good(exec(&t, A, &inquiry(false, 0, 0), &[])).is_empty());
        }
    }

    #[test]
    fn bad_fields_are_invalid_field_in_cdb() {
        let (t, _) = target(512);
        // Page code without EVPD.
        let r = exec(&t, A, &inquiry(false, 0x80, 255), &[]);
        check(&r, key::ILLEGAL_REQUEST, 0x24, 0);
        assert_eq!(field_pointer(&r), [0xc0, 0, 2]);
        // Unknown page.
        for page in [0x01, 0x81, 0x86, 0xb3, 0xff] {
            check(
                &exec(&t, A, &inquiry(true, page, 255), &[]),
                key::ILLEGAL_REQUEST,
                0x24,
                0,
            );
        }
        // CmdDt.
        let r = exec(&t, A, &[0x12, 0x02, 0, 0, 255, 0], &[]);
        check(&r, key::ILLEGAL_REQUEST, 0x24, 0);
        assert_eq!(field_pointer(&r), [0xc9, 0, 1]);
    }

    #[test]
    fn supported_pages_are_all_served() {
        for bs in BLOCK_SIZES {
            let (t, _) = target(bs);
            let d = good(exec(&t, A, &inquiry(true, 0, 255), &[]));
            assert_eq!(&d[..2], &[0, 0]);
            let pages = &d[4..4 + usize::from(d[3])];
            for want in [0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2] {
                assert!(pages.contains(&want), "page {want:#x} listed");
            }
            assert!(pages.windows(2).all(|w| w[0] < w[1]), "ascending");
            for &p in pages {
                let d = good(exec(&t, A, &inquiry(true, p, 0xffff), &[]));
                assert_eq!(d[1], p);
                assert_eq!(usize::from(u16::from_be_bytes([d[2], d[3]])), d.len() - 4);
                // Truncation to the allocation length.
                assert_eq!(good(exec(&t, A, &inquiry(true, p, 3), &[])), d[..3]);
            }
        }
    }

    #[test]
    fn serial_number_and_identification() {
        let (t, _) = target(512);
        let d = good(exec(&t, A, &inquiry(true, 0x80, 255), &[]));
        assert_eq!(&d[4..], b"SN0001");
        let d = good(exec(&t, A, &inquiry(true, 0x83, 0xffff), &[]));
        let ds = designators(&d);
        let cfg = config(false, false);
        // NAA (type 3), binary, logical unit.
        assert!(ds.contains(&(0x01, 0x03, cfg.naa.to_vec())));
        // T10 vendor ID (type 1), ASCII: vendor then serial.
        assert!(ds.contains(&(0x02, 0x01, b"ETHERSANSN0001".to_vec())));
        // Relative target port (type 4) and target port group (type 5), target port association.
        assert!(ds.contains(&(0x51, 0x94, vec![0, 0, 0, 1])));
        assert!(ds.contains(&(0x51, 0x95, vec![0, 0, 0, 1])));
        // SCSI name string (type 8), UTF-8, target device, NUL-terminated, multiple of 4.
        let name = ds.iter().find(|d| d.1 == 0xa8).expect("SCSI name string");
        assert_eq!(name.0, 0x53);
        assert!(name.2.starts_with(cfg.target_name.as_bytes()));
        assert_eq!(name.2.len() % 4, 0);
        assert_eq!(name.2[cfg.target_name.len()], 0);
        // Same configuration, same page: stable across restarts.
        let (again, _) = target(512);
        assert_eq!(good(exec(&again, A, &inquiry(true, 0x83, 0xffff), &[])), d);
    }

    #[test]
    fn naa5_designator_is_eight_bytes() {
        let mut cfg = config(false, false);
        cfg.naa = [
            0x52, 0x01, 0x40, 0x5f, 1, 2, 3, 4, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee,
        ];
        let t = target_over(Arc::new(TestDevice::new(512)), cfg);
        let d = good(exec(&t, A, &inquiry(true, 0x83, 0xffff), &[]));
        let naa: Vec<_> = designators(&d)
            .into_iter()
            .filter(|d| d.1 == 0x03)
            .collect();
        assert_eq!(
            naa,
            vec![(0x01, 0x03, vec![0x52, 0x01, 0x40, 0x5f, 1, 2, 3, 4])],
            "NAA 5 is 8 bytes; the unused tail must not be sent"
        );
    }

    #[test]
    fn block_limits_characteristics_provisioning() {
        for bs in BLOCK_SIZES {
            let (t, _) = target(bs);
            let d = good(exec(&t, A, &inquiry(true, 0xb0, 0xffff), &[]));
            assert_eq!(d.len(), 64);
            let max = u32::from_be_bytes([d[8], d[9], d[10], d[11]]);
            assert_eq!(
                u64::from(max) * u64::from(bs),
                super::super::MAX_TRANSFER_BYTES
            );
            let granularity = u16::from_be_bytes([d[6], d[7]]);
            assert!(granularity >= 1);
            let optimal = u32::from_be_bytes([d[12], d[13], d[14], d[15]]);
            assert!(optimal <= max && optimal.is_multiple_of(u32::from(granularity)));
            let d = good(exec(&t, A, &inquiry(true, 0xb1, 0xffff), &[]));
            assert_eq!(&d[4..6], &[0, 1], "non-rotating medium");
            let d = good(exec(&t, A, &inquiry(true, 0xb2, 0xffff), &[]));
            assert_eq!(
                d[5] & 0xe0,
                0,
                "LBPU, LBPWS, LBPWS10 off on a fully provisioned unit"
            );
            assert_eq!(d[6] & 0x07, 0, "provisioning type: full");
        }
    }
}
