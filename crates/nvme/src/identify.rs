//! NVMe Base Specification 1.4 §5.15.2: the Identify data structures a
//! fabrics target returns — Identify Controller (Figure 247, with the
//! NVMe-oF fields at bytes 1792–2047), Identify Namespace (Figure 245),
//! the active namespace ID list (CNS 02h) and the Namespace
//! Identification Descriptor list (CNS 03h, Figure 249). Each is built
//! from a plain input struct into its 4096 bytes.

/// Size of every Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;

use crate::put::{put16, put32, put64, put_text};

/// Writes `s` into `b`, padded with spaces (ASCII fields: SN, MN, FR).
fn put_ascii(b: &mut [u8], s: &str) {
    put_text(b, s, b' ');
}

/// Writes `s` into `b`, padded with NULs, at most `b.len() - 1` bytes (NQNs).
fn put_nqn(b: &mut [u8], s: &str) {
    b.fill(0);
    let n = s.len().min(b.len().saturating_sub(1));
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Controller type (CNTRLTYPE, byte 111).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControllerType {
    /// I/O controller.
    Io = 1,
    /// Discovery controller.
    Discovery = 2,
}

/// What Identify Controller reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerInfo {
    /// PCI Vendor ID.
    pub vid: u16,
    /// PCI Subsystem Vendor ID.
    pub ssvid: u16,
    /// Serial Number (20 ASCII bytes).
    pub serial: String,
    /// Model Number (40 ASCII bytes).
    pub model: String,
    /// Firmware Revision (8 ASCII bytes).
    pub firmware: String,
    /// IEEE OUI (3 bytes, least significant first).
    pub ieee: [u8; 3],
    /// CMIC: multi-port/multi-controller subsystem and ANA reporting (bit 3).
    pub cmic: u8,
    /// MDTS: maximum data transfer, a power of two of the minimum page size (0 = none).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// VER (0x00010400 for 1.4).
    pub version: u32,
    /// OAES: optional asynchronous events supported.
    pub oaes: u32,
    /// CTRATT: controller attributes.
    pub ctratt: u32,
    /// Controller type.
    pub cntrltype: ControllerType,
    /// OACS: optional admin commands supported.
    pub oacs: u16,
    /// ACL: abort command limit, 0's based.
    pub acl: u8,
    /// AERL: asynchronous event request limit, 0's based.
    pub aerl: u8,
    /// FRMW: firmware updates.
    pub frmw: u8,
    /// LPA: log page attributes.
    pub lpa: u8,
    /// ELPE: error log page entries, 0's based.
    pub elpe: u8,
    /// NPSS: number of power states supported, 0's based.
    pub npss: u8,
    /// KAS: keep alive granularity in 100 ms units.
    pub kas: u16,
    /// ANATT: ANA transition time in seconds.
    pub anatt: u8,
    /// ANACAP: ANA states reported.
    pub anacap: u8,
    /// ANAGRPMAX.
    pub anagrpmax: u32,
    /// NANAGRPID.
    pub nanagrpid: u32,
    /// MAXCMD: most outstanding commands per queue.
    pub maxcmd: u16,
    /// NN: number of namespaces (highest valid NSID).
    pub nn: u32,
    /// ONCS: optional NVM commands supported.
    pub oncs: u16,
    /// FUSES: fused operations supported (bit 0: compare and write).
    pub fuses: u16,
    /// VWC: volatile write cache present (bit 0).
    pub vwc: u8,
    /// SGLS: SGL support.
    pub sgls: u32,
    /// MNAN: maximum number of allowed namespaces.
    pub mnan: u32,
    /// Subsystem NQN.
    pub subnqn: String,
    /// IOCCSZ: I/O queue command capsule size in 16-byte units.
    pub ioccsz: u32,
    /// IORCSZ: I/O queue response capsule size in 16-byte units.
    pub iorcsz: u32,
    /// ICDOFF: in-capsule data offset in 16-byte units.
    pub icdoff: u16,
    /// FCATT: fabrics controller attributes (bit 0: static model).
    pub fcatt: u8,
    /// MSDBD: maximum SGL data block descriptors.
    pub msdbd: u8,
}

/// ONCS bit: Compare.
pub const ONCS_COMPARE: u16 = 1 << 0;
/// ONCS bit: Dataset Management.
pub const ONCS_DSM: u16 = 1 << 2;
/// ONCS bit: Write Zeroes.
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
/// ONCS bit: reservations.
pub const ONCS_RESERVATIONS: u16 = 1 << 5;
/// CMIC bit: the controller reports ANA.
pub const CMIC_ANA: u8 = 1 << 3;
/// SGLS value of an NVMe/TCP controller: SGLs supported with no
/// alignment requirement (bits 1:0 = 01b) and Data Block descriptors with
/// an offset for in-capsule data (bit 20); no Keyed SGL (bit 2, RDMA's).
pub const SGLS_TCP: u32 = 1 | 1 << 20;

impl ControllerInfo {
    /// An I/O controller of NVMe 1.4 with TCP-appropriate defaults.
    pub fn new(serial: &str, model: &str, subnqn: &str, cntlid: u16) -> Self {
        ControllerInfo {
            vid: 0,
            ssvid: 0,
            serial: serial.into(),
            model: model.into(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            ieee: [0; 3],
            cmic: 0,
            mdts: 8,
            cntlid,
            version: 0x0001_0400,
            oaes: 1 << 8,
            ctratt: 0,
            cntrltype: ControllerType::Io,
            oacs: 0,
            acl: 3,
            aerl: 3,
            frmw: 1 << 1 | 1,
            lpa: 1 << 2,
            elpe: 0,
            npss: 0,
            kas: 10,
            anatt: 0,
            anacap: 0,
            anagrpmax: 0,
            nanagrpid: 0,
            maxcmd: 128,
            nn: 1,
            oncs: ONCS_DSM | ONCS_WRITE_ZEROES,
            fuses: 0,
            vwc: 0,
            sgls: SGLS_TCP,
            mnan: 0,
            subnqn: subnqn.into(),
            ioccsz: 4,
            iorcsz: 1,
            icdoff: 0,
            fcatt: 0,
            msdbd: 1,
        }
    }

    /// The 4096-byte Identify Controller data structure.
    pub fn build(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put16(&mut b, 0, self.vid);
        put16(&mut b, 2, self.ssvid);
        put_ascii(&mut b[4..24], &self.serial);
        put_ascii(&mut b[24..64], &self.model);
        put_ascii(&mut b[64..72], &self.firmware);
        b[72] = 0; // RAB
        b[73..76].copy_from_slice(&self.ieee);
        b[76] = self.cmic;
        b[77] = self.mdts;
        put16(&mut b, 78, self.cntlid);
        put32(&mut b, 80, self.version);
        put32(&mut b, 92, self.oaes);
        put32(&mut b, 96, self.ctratt);
        b[111] = self.cntrltype as u8;
        put16(&mut b, 256, self.oacs);
        b[258] = self.acl;
        b[259] = self.aerl;
        b[260] = self.frmw;
        b[261] = self.lpa;
        b[262] = self.elpe;
        b[263] = self.npss;
        put16(&mut b, 320, self.kas);
        b[342] = self.anatt;
        b[343] = self.anacap;
        put32(&mut b, 344, self.anagrpmax);
        put32(&mut b, 348, self.nanagrpid);
        b[512] = 6 << 4 | 6; // SQES: max and required 2^6
        b[513] = 4 << 4 | 4; // CQES: 2^4
        put16(&mut b, 514, self.maxcmd);
        put32(&mut b, 516, self.nn);
        put16(&mut b, 520, self.oncs);
        put16(&mut b, 522, self.fuses);
        b[525] = self.vwc;
        put32(&mut b, 536, self.sgls);
        put32(&mut b, 540, self.mnan);
        put_nqn(&mut b[768..1024], &self.subnqn);
        put32(&mut b, 1792, self.ioccsz);
        put32(&mut b, 1796, self.iorcsz);
        put16(&mut b, 1800, self.icdoff);
        b[1802] = self.fcatt;
        b[1803] = self.msdbd;
        b
    }
}

/// What Identify Namespace reports (one LBA format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Namespace size in logical blocks.
    pub nsze: u64,
    /// Namespace capacity in logical blocks.
    pub ncap: u64,
    /// Namespace utilization in logical blocks.
    pub nuse: u64,
    /// NSFEAT: namespace features (bit 0 thin provisioning).
    pub nsfeat: u8,
    /// log2 of the logical block size (LBAF0 LBADS; 9 for 512 bytes).
    pub lbads: u8,
    /// NMIC: bit 0, namespace may be attached to several controllers.
    pub nmic: u8,
    /// RESCAP: reservation capabilities.
    pub rescap: u8,
    /// DLFEAT: deallocated blocks read as zeroes (bits 2:0 = 001b).
    pub dlfeat: u8,
    /// NGUID.
    pub nguid: [u8; 16],
    /// EUI64.
    pub eui64: [u8; 8],
    /// ANA group of the namespace (0 without ANA).
    pub anagrpid: u32,
    /// NSATTR bit 0: write protected.
    pub read_only: bool,
    /// Preferred write granularity in blocks (NPWG, 0's based) and
    /// optimal I/O boundary (NOIOB); 0 if none.
    pub noiob: u16,
}

/// RESCAP with every reservation type and Ignore Existing Key.
pub const RESCAP_ALL: u8 = 0xFE;

impl NamespaceInfo {
    /// A namespace of `blocks` blocks of 2^`lbads` bytes.
    pub fn new(blocks: u64, lbads: u8) -> Self {
        NamespaceInfo {
            nsze: blocks,
            ncap: blocks,
            nuse: blocks,
            nsfeat: 0,
            lbads,
            nmic: 0,
            rescap: 0,
            dlfeat: 0,
            nguid: [0; 16],
            eui64: [0; 8],
            anagrpid: 0,
            read_only: false,
            noiob: 0,
        }
    }

    /// The 4096-byte Identify Namespace data structure.
    pub fn build(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put64(&mut b, 0, self.nsze);
        put64(&mut b, 8, self.ncap);
        put64(&mut b, 16, self.nuse);
        b[24] = self.nsfeat;
        b[25] = 0; // NLBAF: one format, 0's based
        b[26] = 0; // FLBAS: format 0, metadata not inline
        b[30] = self.nmic;
        b[31] = self.rescap;
        b[33] = self.dlfeat;
        put16(&mut b, 46, self.noiob);
        put32(&mut b, 92, self.anagrpid);
        b[99] = u8::from(self.read_only);
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        put32(&mut b, 128, u32::from(self.lbads) << 16); // LBAF0: MS 0, RP 0
        b
    }
}

/// Identify CNS 02h: up to 1024 active NSIDs above `after`, ascending.
pub fn active_namespace_list(nsids: &[u32], after: u32) -> Vec<u8> {
    let mut ids: Vec<u32> = nsids.iter().copied().filter(|&n| n > after).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut b = vec![0u8; IDENTIFY_LEN];
    for (i, id) in ids.iter().take(IDENTIFY_LEN / 4).enumerate() {
        put32(&mut b, i * 4, *id);
    }
    b
}

/// One Namespace Identification Descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NamespaceId {
    /// IEEE Extended Unique Identifier (NIDT 1).
    Eui64([u8; 8]),
    /// Namespace Globally Unique Identifier (NIDT 2).
    Nguid([u8; 16]),
    /// Namespace UUID (NIDT 3).
    Uuid([u8; 16]),
}

/// Identify CNS 03h: the descriptor list (type, length, two reserved
/// bytes, identifier), zero-terminated within 4096 bytes.
pub fn namespace_descriptors(ids: &[NamespaceId]) -> Vec<u8> {
    let mut b = Vec::with_capacity(IDENTIFY_LEN);
    for id in ids {
        let (nidt, v): (u8, &[u8]) = match id {
            NamespaceId::Eui64(v) => (1, v),
            NamespaceId::Nguid(v) => (2, v),
            NamespaceId::Uuid(v) => (3, v),
        };
        if b.len() + 4 + v.len() > IDENTIFY_LEN {
            break;
        }
        b.extend_from_slice(&[nidt, v.len() as u8, 0, 0]);
        b.extend_from_slice(v);
    }
    b.resize(IDENTIFY_LEN, 0);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_offsets() {
        let mut c = ControllerInfo::new("SN1", "ethersan", "nqn.2014-08.org.example:s1", 7);
        c.cmic = CMIC_ANA;
        c.anagrpmax = 2;
        c.nanagrpid = 2;
        c.kas = 10;
        c.nn = 5;
        c.ioccsz = 260;
        let b = c.build();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[4..8], b"SN1 ");
        assert_eq!(b[23], b' ');
        assert_eq!(&b[24..32], b"ethersan");
        assert_eq!(b[76], CMIC_ANA);
        assert_eq!(&b[78..80], &7u16.to_le_bytes());
        assert_eq!(&b[80..84], &0x0001_0400u32.to_le_bytes());
        assert_eq!(b[111], 1);
        assert_eq!(&b[320..322], &10u16.to_le_bytes());
        assert_eq!(&b[344..348], &2u32.to_le_bytes());
        assert_eq!(b[512], 0x66);
        assert_eq!(b[513], 0x44);
        assert_eq!(&b[516..520], &5u32.to_le_bytes());
        assert_eq!(&b[536..540], &SGLS_TCP.to_le_bytes());
        assert_eq!(&b[768..794], b"nqn.2014-08.org.example:s1");
        assert_eq!(b[794], 0);
        assert_eq!(&b[1792..1796], &260u32.to_le_bytes());
        assert_eq!(&b[1796..1800], &1u32.to_le_bytes());
        assert_eq!(b[1803], 1);
    }

    #[test]
    fn namespace_offsets() {
        let mut n = NamespaceInfo::new(1 << 20, 12);
        n.nmic = 1;
        n.rescap = RESCAP_ALL;
        n.anagrpid = 2;
        n.read_only = true;
        n.nguid = [0xA5; 16];
        n.eui64 = [0x5A; 8];
        let b = n.build();
        assert_eq!(&b[0..8], &(1u64 << 20).to_le_bytes());
        assert_eq!(&b[8..16], &(1u64 << 20).to_le_bytes());
        assert_eq!((b[25], b[26], b[30], b[31]), (0, 0, 1, 0xFE));
        assert_eq!(&b[92..96], &2u32.to_le_bytes());
        assert_eq!(b[99], 1);
        assert_eq!(&b[104..120], &[0xA5; 16]);
        assert_eq!(&b[120..128], &[0x5A; 8]);
        assert_eq!(b[130], 12, "LBAF0 LBADS");
    }

    #[test]
    fn lists() {
        let b = active_namespace_list(&[3, 1, 2, 2], 1);
        assert_eq!(&b[..12], &[2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        let many: Vec<u32> = (1..=2000).collect();
        let b = active_namespace_list(&many, 0);
        assert_eq!(&b[4092..], &1024u32.to_le_bytes());
        let d = namespace_descriptors(&[NamespaceId::Eui64([1; 8]), NamespaceId::Uuid([2; 16])]);
        assert_eq!(&d[..4], &[1, 8, 0, 0]);
        assert_eq!(&d[12..16], &[3, 16, 0, 0]);
        assert_eq!(d[16], 2);
        assert_eq!(d[32], 0, "terminated");
        assert_eq!(d.len(), 4096);
    }
}
