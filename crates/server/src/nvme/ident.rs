//! How ethersan's targets and LUNs look as NVMe subsystems and
//! namespaces: the subsystem NQN of a target, the namespace ID of a LUN,
//! the namespace identifiers (NGUID, EUI-64, UUID) derived from the LUN's
//! persistent NAA identifier (the one iSCSI reports in VPD page 0x83, so
//! one disk is recognisable over both), and the Identify data built from
//! a logical unit.

use ethersan_nvme::identify::{
    ControllerInfo, ControllerType, NamespaceId, NamespaceInfo, ONCS_COMPARE, ONCS_DSM,
    ONCS_RESERVATIONS, ONCS_WRITE_ZEROES, RESCAP_ALL,
};
use ethersan_scsi::LogicalUnit;

/// The well-known NQN of the discovery controller.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// What a target name that is not already an NQN gets in front of it.
pub const NQN_PREFIX: &str = "nqn.2014-08.org.ethersan:";

/// The model number every controller reports.
pub const MODEL: &str = "ethersan";

/// The subsystem NQN of target `name`: the name itself when it is an NQN
/// (starts with `nqn.`), else [`NQN_PREFIX`] followed by the name.
pub fn subsystem_nqn(name: &str) -> String {
    if name.starts_with("nqn.") {
        name.to_string()
    } else {
        format!("{NQN_PREFIX}{name}")
    }
}

/// The namespace ID of LUN `lun`: the LUN number plus one.
pub fn nsid_of(lun: u64) -> Option<u32> {
    u32::try_from(lun.checked_add(1)?)
        .ok()
        .filter(|n| *n != u32::MAX)
}

/// The LUN of namespace `nsid` (`None` for 0 and FFFFFFFFh, which name no
/// single namespace).
pub fn lun_of(nsid: u32) -> Option<u64> {
    (nsid != 0 && nsid != u32::MAX).then(|| u64::from(nsid) - 1)
}

/// FNV-1a of `parts` with a label: the derivations below are stable.
fn fnv(label: u8, data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in std::iter::once(&label).chain(data) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The NGUID of a LUN: its 16-byte NAA identifier as it is.
pub fn nguid(naa: &[u8; 16]) -> [u8; 16] {
    *naa
}

/// The EUI-64 of a LUN: the IEEE OUI of its NAA 6 identifier, then five
/// bytes of a hash of the whole identifier.
pub fn eui64(naa: &[u8; 16]) -> [u8; 8] {
    let oui = [
        naa[0] << 4 | naa[1] >> 4,
        naa[1] << 4 | naa[2] >> 4,
        naa[2] << 4 | naa[3] >> 4,
    ];
    let h = fnv(1, naa).to_be_bytes();
    let mut e = [0u8; 8];
    e[..3].copy_from_slice(&oui);
    e[3..].copy_from_slice(&h[..5]);
    e
}

/// The UUID of a LUN: a name-based (version 8, RFC 9562) UUID from its
/// NAA identifier.
pub fn uuid(naa: &[u8; 16]) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&fnv(2, naa).to_be_bytes());
    u[8..].copy_from_slice(&fnv(3, naa).to_be_bytes());
    u[6] = 0x80 | (u[6] & 0x0F);
    u[8] = 0x80 | (u[8] & 0x3F);
    u
}

/// The serial number of a subsystem: 20 hex digits of a hash of its NQN.
pub fn serial(subnqn: &str) -> String {
    let h = fnv(4, subnqn.as_bytes());
    format!("{:016x}{:04x}", h, (h >> 48) as u16 ^ (h as u16))
}

/// The namespace identification descriptors of a LUN.
pub fn descriptors(naa: &[u8; 16]) -> Vec<NamespaceId> {
    vec![
        NamespaceId::Nguid(nguid(naa)),
        NamespaceId::Eui64(eui64(naa)),
        NamespaceId::Uuid(uuid(naa)),
    ]
}

/// Identify Namespace of `lu`; `read_only`: for this host (the LUN's own
/// setting or the target's read-only list).
pub fn namespace(lu: &LogicalUnit, read_only: bool) -> NamespaceInfo {
    let v = lu.volume();
    let lbads = v.block_size().max(1).trailing_zeros() as u8;
    let mut ns = NamespaceInfo::new(v.num_blocks(), lbads);
    let naa = lu.config().naa;
    ns.nguid = nguid(&naa);
    ns.eui64 = eui64(&naa);
    // May be attached to more than one controller.
    ns.nmic = 1;
    // Every reservation type, Ignore Existing Key.
    ns.rescap = RESCAP_ALL;
    ns.read_only = read_only || lu.config().read_only;
    ns
}

/// What a controller reports about the I/O it can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest namespace ID (NN).
    pub nn: u32,
    /// A volatile write cache is present (any LUN has one on).
    pub vwc: bool,
    /// MDTS, in units of the minimum page size (4 KiB), as a power of two.
    pub mdts: u8,
    /// In-capsule data accepted on I/O queues, bytes.
    pub in_capsule: u32,
    /// Most commands outstanding on a queue.
    pub maxcmd: u16,
}

/// Identify Controller of an I/O controller of subsystem `subnqn`.
pub fn io_controller(subnqn: &str, cntlid: u16, l: Limits) -> ControllerInfo {
    let mut c = ControllerInfo::new(&serial(subnqn), MODEL, subnqn, cntlid);
    // Two or more controllers may be in the subsystem.
    c.cmic = 1 << 1;
    c.mdts = l.mdts;
    c.nn = l.nn;
    c.oncs = ONCS_WRITE_ZEROES | ONCS_DSM | ONCS_COMPARE | ONCS_RESERVATIONS;
    c.vwc = u8::from(l.vwc);
    // Namespace attribute notices.
    c.oaes = 1 << 8;
    c.ioccsz = (l.in_capsule + 64) / 16;
    c.iorcsz = 1;
    c.maxcmd = l.maxcmd;
    c
}

/// Identify Controller of a discovery controller.
pub fn discovery_controller(cntlid: u16) -> ControllerInfo {
    let mut c = ControllerInfo::new(&serial(DISCOVERY_NQN), MODEL, DISCOVERY_NQN, cntlid);
    c.cntrltype = ControllerType::Discovery;
    c.nn = 0;
    c.oncs = 0;
    c.oaes = 0;
    c.mdts = 0;
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nqn_mapping() {
        assert_eq!(
            subsystem_nqn("iqn.2026-11.org.ethersan:disk"),
            "nqn.2014-08.org.ethersan:iqn.2026-11.org.ethersan:disk"
        );
        assert_eq!(
            subsystem_nqn("nqn.2020-01.com.example:a"),
            "nqn.2020-01.com.example:a"
        );
        assert_eq!(subsystem_nqn("x"), "nqn.2014-08.org.ethersan:x");
    }

    #[test]
    fn nsid_mapping() {
        assert_eq!(nsid_of(0), Some(1));
        assert_eq!(nsid_of(16383), Some(16384));
        assert_eq!(nsid_of(u64::from(u32::MAX) - 1), None);
        assert_eq!(lun_of(1), Some(0));
        assert_eq!(lun_of(0), None);
        assert_eq!(lun_of(u32::MAX), None);
        for l in [0u64, 5, 16383] {
            assert_eq!(lun_of(nsid_of(l).unwrap()), Some(l));
        }
    }

    #[test]
    fn identifiers_from_the_naa() {
        let naa = [
            0x60, 0x01, 0x40, 0x5a, 0xbc, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
        ];
        assert_eq!(nguid(&naa), naa);
        let e = eui64(&naa);
        // OUI 0x001405 from the NAA's bits 4..28.
        assert_eq!(&e[..3], &[0x00, 0x14, 0x05]);
        assert_eq!(e, eui64(&naa));
        let mut other = naa;
        other[15] ^= 1;
        assert_ne!(eui64(&other), e);
        let u = uuid(&naa);
        assert_eq!(u[6] >> 4, 8);
        assert_eq!(u[8] >> 6, 2);
        assert_ne!(uuid(&other), u);
        let s = serial("nqn.x:y");
        assert_eq!(s.len(), 20);
        assert_ne!(serial("nqn.x:z"), s);
        assert_eq!(descriptors(&naa).len(), 3);
    }

    #[test]
    fn namespace_identify_from_a_logical_unit() {
        use std::sync::Arc;
        let dev = Arc::new(ethersan_backend::ram::RamDevice::new(8 << 20, 4096).unwrap());
        let naa = [
            0x60, 0x01, 0x40, 0x5a, 0xbc, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
        ];
        let lu = LogicalUnit::new(
            dev,
            ethersan_scsi::LuConfig {
                naa,
                ..ethersan_scsi::LuConfig::default()
            },
        );
        let b = namespace(&lu, false).build();
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 2048);
        assert_eq!(b[128 + 2], 12, "LBADS of 4096-byte blocks");
        assert_eq!(&b[104..120], &naa);
        assert_eq!(&b[120..128], &eui64(&naa));
        assert_eq!((b[30], b[31], b[99]), (1, RESCAP_ALL, 0));
        assert_eq!(
            namespace(&lu, true).build()[99],
            1,
            "read-only for the host"
        );
    }

    #[test]
    fn controller_identify_contents() {
        let l = Limits {
            nn: 3,
            vwc: true,
            mdts: 8,
            in_capsule: 8192,
            maxcmd: 128,
        };
        let b = io_controller("nqn.x:y", 7, l).build();
        assert_eq!(u16::from_le_bytes([b[78], b[79]]), 7);
        assert_eq!(
            u32::from_le_bytes([b[80], b[81], b[82], b[83]]),
            0x0001_0400
        );
        assert_eq!(b[77], 8);
        assert_eq!(u32::from_le_bytes([b[516], b[517], b[518], b[519]]), 3);
        let oncs = u16::from_le_bytes([b[520], b[521]]);
        assert_eq!(
            oncs,
            ONCS_WRITE_ZEROES | ONCS_DSM | ONCS_COMPARE | ONCS_RESERVATIONS
        );
        assert_eq!(b[525], 1);
        assert_eq!(&b[768..775], b"nqn.x:y");
        assert_eq!(
            u32::from_le_bytes([b[1792], b[1793], b[1794], b[1795]]),
            516
        );
        let d = discovery_controller(1).build();
        assert_eq!(d[111], 2);
        assert_eq!(&d[768..768 + DISCOVERY_NQN.len()], DISCOVERY_NQN.as_bytes());
    }
}
