//! Parsers of the data structures a host reads back (NVMe 1.4 §5.15.2:
//! Identify Controller, Identify Namespace, the active namespace list and
//! the Namespace Identification Descriptors; NVMe-oF 1.1 §5.3: the
//! Discovery log page). Short or odd input gives `None` or fewer
//! entries, never a panic.

use crate::identify::{ControllerInfo, ControllerType, NamespaceId, NamespaceInfo, IDENTIFY_LEN};
use crate::log::DISCOVERY_RECORD_LEN;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | u64::from(u32_at(b, at + 4)) << 32
}

/// Text of a space- or NUL-padded field.
fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end])
        .trim_end_matches(' ')
        .to_string()
}

impl ControllerInfo {
    /// Decodes an Identify Controller data structure (4096 bytes).
    pub fn parse(b: &[u8]) -> Option<Self> {
        let b = b.get(..IDENTIFY_LEN)?;
        let mut ieee = [0u8; 3];
        ieee.copy_from_slice(&b[73..76]);
        Some(ControllerInfo {
            vid: u16_at(b, 0),
            ssvid: u16_at(b, 2),
            serial: text(&b[4..24]),
            model: text(&b[24..64]),
            firmware: text(&b[64..72]),
            ieee,
            cmic: b[76],
            mdts: b[77],
            cntlid: u16_at(b, 78),
            version: u32_at(b, 80),
            oaes: u32_at(b, 92),
            ctratt: u32_at(b, 96),
            cntrltype: match b[111] {
                2 => ControllerType::Discovery,
                _ => ControllerType::Io,
            },
            oacs: u16_at(b, 256),
            acl: b[258],
            aerl: b[259],
            frmw: b[260],
            lpa: b[261],
            elpe: b[262],
            npss: b[263],
            kas: u16_at(b, 320),
            anatt: b[342],
            anacap: b[343],
            anagrpmax: u32_at(b, 344),
            nanagrpid: u32_at(b, 348),
            maxcmd: u16_at(b, 514),
            nn: u32_at(b, 516),
            oncs: u16_at(b, 520),
            fuses: u16_at(b, 522),
            vwc: b[525],
            sgls: u32_at(b, 536),
            mnan: u32_at(b, 540),
            subnqn: text(&b[768..1024]),
            ioccsz: u32_at(b, 1792),
            iorcsz: u32_at(b, 1796),
            icdoff: u16_at(b, 1800),
            fcatt: b[1802],
            msdbd: b[1803],
        })
    }
}

impl NamespaceInfo {
    /// Decodes an Identify Namespace data structure; `lbads` is that of
    /// the LBA format FLBAS selects. An inactive namespace reads as all
    /// zeros (NSZE 0).
    pub fn parse(b: &[u8]) -> Option<Self> {
        let b = b.get(..IDENTIFY_LEN)?;
        let format = usize::from(b[26] & 0x0F);
        let lbads = b[128 + 4 * format + 2];
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[104..120]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&b[120..128]);
        Some(NamespaceInfo {
            nsze: u64_at(b, 0),
            ncap: u64_at(b, 8),
            nuse: u64_at(b, 16),
            nsfeat: b[24],
            lbads,
            nmic: b[30],
            rescap: b[31],
            dlfeat: b[33],
            nguid,
            eui64,
            anagrpid: u32_at(b, 92),
            read_only: b[99] & 1 != 0,
            noiob: u16_at(b, 46),
        })
    }

    /// Logical block size in bytes (`None` when LBADS is out of range, as
    /// for an inactive namespace).
    pub fn block_size(&self) -> Option<u32> {
        (9..=31).contains(&self.lbads).then(|| 1u32 << self.lbads)
    }
}

/// Decodes an active namespace ID list (Identify CNS 02h).
pub fn parse_active_namespaces(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&n| n != 0)
        .collect()
}

/// Decodes a Namespace Identification Descriptor list (Identify CNS 03h);
/// unknown types are skipped.
pub fn parse_namespace_descriptors(b: &[u8]) -> Vec<NamespaceId> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= b.len() {
        let (nidt, nidl) = (b[at], usize::from(b[at + 1]));
        if nidt == 0 || nidl == 0 {
            break;
        }
        let Some(v) = b.get(at + 4..at + 4 + nidl) else {
            break;
        };
        match (nidt, nidl) {
            (1, 8) => out.push(NamespaceId::Eui64(v.try_into().unwrap_or_default())),
            (2, 16) => out.push(NamespaceId::Nguid(v.try_into().unwrap_or_default())),
            (3, 16) => out.push(NamespaceId::Uuid(v.try_into().unwrap_or_default())),
            _ => {}
        }
        at += 4 + nidl;
    }
    out
}

/// One Discovery log page entry as read (raw codes, so that any
/// transport's entry decodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryRecord {
    /// Transport type (3: TCP).
    pub trtype: u8,
    /// Address family (1: IPv4, 2: IPv6).
    pub adrfam: u8,
    /// Subsystem type (1 referral, 2 NVM, 3 current discovery).
    pub subtype: u8,
    /// Transport requirements.
    pub treq: u8,
    /// Port ID.
    pub portid: u16,
    /// Controller ID (FFFFh: dynamic).
    pub cntlid: u16,
    /// Admin max SQ size.
    pub asqsz: u16,
    /// Transport service identifier (the TCP port).
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Transport address.
    pub traddr: String,
    /// TCP security type.
    pub sectype: u8,
}

/// A Discovery log page as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryLog {
    /// Generation counter.
    pub genctr: u64,
    /// Number of records the page says it holds.
    pub numrec: u64,
    /// The records present in the bytes given.
    pub entries: Vec<DiscoveryRecord>,
}

/// Decodes a Discovery log page (its 1024-byte header and as many whole
/// records as `b` holds, at most NUMREC); `None` if the header is short.
pub fn parse_discovery_log(b: &[u8]) -> Option<DiscoveryLog> {
    let h = b.get(..DISCOVERY_RECORD_LEN)?;
    let (genctr, numrec) = (u64_at(h, 0), u64_at(h, 8));
    let entries = b[DISCOVERY_RECORD_LEN..]
        .chunks_exact(DISCOVERY_RECORD_LEN)
        .take(usize::try_from(numrec).unwrap_or(usize::MAX))
        .map(|r| DiscoveryRecord {
            trtype: r[0],
            adrfam: r[1],
            subtype: r[2],
            treq: r[3],
            portid: u16_at(r, 4),
            cntlid: u16_at(r, 6),
            asqsz: u16_at(r, 8),
            trsvcid: text(&r[32..64]),
            subnqn: text(&r[256..512]),
            traddr: text(&r[512..768]),
            sectype: r[768],
        })
        .collect();
    Some(DiscoveryLog {
        genctr,
        numrec,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identify::{active_namespace_list, namespace_descriptors};
    use crate::log::{discovery_log, AddressFamily, DiscoveryEntry, SubsystemType};

    #[test]
    fn controller_round_trip() {
        let mut c = ControllerInfo::new("SN-42", "ethersan model", "nqn.2014-08.org.ex:s", 3);
        c.mdts = 5;
        c.vwc = 1;
        c.nn = 4;
        c.ioccsz = 260;
        let p = ControllerInfo::parse(&c.build()).unwrap();
        assert_eq!(p, c);
        assert_eq!(ControllerInfo::parse(&[0; 100]), None);
    }

    #[test]
    fn namespace_round_trip_and_format() {
        let mut n = NamespaceInfo::new(1 << 21, 12);
        n.nguid = [0xA5; 16];
        n.eui64 = [0x5A; 8];
        let p = NamespaceInfo::parse(&n.build()).unwrap();
        assert_eq!(p, n);
        assert_eq!(p.block_size(), Some(4096));
        let mut b = n.build();
        b[26] = 1; // FLBAS: format 1
        b[132 + 2] = 9;
        assert_eq!(NamespaceInfo::parse(&b).unwrap().lbads, 9);
        let inactive = NamespaceInfo::parse(&[0; 4096]).unwrap();
        assert_eq!((inactive.nsze, inactive.block_size()), (0, None));
    }

    #[test]
    fn lists() {
        assert_eq!(
            parse_active_namespaces(&active_namespace_list(&[4, 1, 9], 0)),
            vec![1, 4, 9]
        );
        let ids = [NamespaceId::Nguid([1; 16]), NamespaceId::Eui64([2; 8])];
        assert_eq!(
            parse_namespace_descriptors(&namespace_descriptors(&ids)),
            ids
        );
        assert!(parse_namespace_descriptors(&[2, 16, 0, 0, 1]).is_empty());
    }

    #[test]
    fn discovery_round_trip() {
        let e = DiscoveryEntry {
            adrfam: AddressFamily::Ipv4,
            subtype: SubsystemType::Nvme,
            treq: 0,
            portid: 1,
            asqsz: 32,
            trsvcid: "4420".into(),
            subnqn: "nqn.2026-11.org.ethersan:disk".into(),
            traddr: "10.0.0.5".into(),
            sectype: 0,
        };
        let page = discovery_log(7, &[e.clone(), e]);
        let log = parse_discovery_log(&page).unwrap();
        assert_eq!((log.genctr, log.numrec, log.entries.len()), (7, 2, 2));
        let r = &log.entries[1];
        assert_eq!((r.trtype, r.adrfam, r.subtype, r.cntlid), (3, 1, 2, 0xFFFF));
        assert_eq!(r.trsvcid, "4420");
        assert_eq!(r.traddr, "10.0.0.5");
        assert_eq!(r.subnqn, "nqn.2026-11.org.ethersan:disk");
        // Truncated: only whole records.
        assert_eq!(parse_discovery_log(&page[..2000]).unwrap().entries.len(), 0);
        assert_eq!(parse_discovery_log(&page[..10]), None);
    }
}
