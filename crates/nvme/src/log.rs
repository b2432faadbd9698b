//! NVMe Base Specification 1.4 §5.14.1 (log pages: Error Information
//! 01h, SMART / Health 02h, Firmware Slot 03h, Changed Namespace List
//! 04h, ANA 0Ch, Reservation Notification 80h) and NVMe-oF 1.1 §5.3 with
//! the TCP transport's TSAS (the Discovery log page, 70h): builders from
//! plain structs, and [`window`] for a Get Log Page's offset and length.

use crate::put::{put16, put32, put64, put_text};

/// Log page identifiers.
pub mod lid {
    /// Error Information.
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: u8 = 0x03;
    /// Changed Namespace List.
    pub const CHANGED_NAMESPACES: u8 = 0x04;
    /// Asymmetric Namespace Access.
    pub const ANA: u8 = 0x0C;
    /// Discovery (discovery controllers only).
    pub const DISCOVERY: u8 = 0x70;
    /// Reservation Notification.
    pub const RESERVATION_NOTIFICATION: u8 = 0x80;
}

/// The part of `page` a Get Log Page of `len` bytes at `offset` returns,
/// zero-filled past the page's end; `None` if `offset` lies beyond it
/// (Invalid Field).
pub fn window(page: &[u8], offset: u64, len: u64) -> Option<Vec<u8>> {
    let start = usize::try_from(offset).ok().filter(|&o| o <= page.len())?;
    // A Get Log Page moves at most the controller's MDTS (1 MiB here).
    let len = usize::try_from(len).ok()?.min(1 << 20);
    let mut out = page[start..].to_vec();
    out.resize(len, 0);
    Some(out)
}

/// Address family of a discovery entry (ADRFAM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressFamily {
    /// IPv4.
    Ipv4 = 1,
    /// IPv6.
    Ipv6 = 2,
}

/// Subsystem type of a discovery entry (SUBTYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubsystemType {
    /// A referral to another discovery service.
    Referral = 1,
    /// An NVM subsystem.
    Nvme = 2,
    /// The discovery subsystem answering (current discovery subsystem).
    CurrentDiscovery = 3,
}

/// TRTYPE of TCP.
pub const TRTYPE_TCP: u8 = 3;
/// Size of the discovery log header and of each entry.
pub const DISCOVERY_RECORD_LEN: usize = 1024;

/// One Discovery Log Page entry for a TCP port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Address family.
    pub adrfam: AddressFamily,
    /// Subsystem type.
    pub subtype: SubsystemType,
    /// TREQ: transport requirements (bits 1:0 secure channel; bit 2 SQ
    /// flow control disable supported).
    pub treq: u8,
    /// Port ID.
    pub portid: u16,
    /// Admin max SQ size.
    pub asqsz: u16,
    /// Transport service identifier: the TCP port, as text.
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Transport address: the IP address, as text.
    pub traddr: String,
    /// TCP TSAS SECTYPE: 0 none, 1 TLS 1.2, 2 TLS 1.3.
    pub sectype: u8,
}

/// The Discovery log page: 1024-byte header (GENCTR, NUMREC, RECFMT 0)
/// and one 1024-byte record per entry, CNTLID FFFFh (dynamic).
pub fn discovery_log(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0u8; DISCOVERY_RECORD_LEN * (1 + entries.len())];
    put64(&mut b, 0, genctr);
    put64(&mut b, 8, entries.len() as u64);
    for (i, e) in entries.iter().enumerate() {
        let r = &mut b[DISCOVERY_RECORD_LEN * (i + 1)..][..DISCOVERY_RECORD_LEN];
        r[0] = TRTYPE_TCP;
        r[1] = e.adrfam as u8;
        r[2] = e.subtype as u8;
        r[3] = e.treq;
        put16(r, 4, e.portid);
        put16(r, 6, 0xFFFF);
        put16(r, 8, e.asqsz);
        put_text(&mut r[32..64], &e.trsvcid, b' ');
        put_text(&mut r[256..511], &e.subnqn, 0);
        put_text(&mut r[512..768], &e.traddr, b' ');
        r[768] = e.sectype;
    }
    b
}

/// SMART / Health Information values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Smart {
    /// Critical warning bits.
    pub critical_warning: u8,
    /// Composite temperature in kelvins.
    pub temperature: u16,
    /// Available spare, percent.
    pub available_spare: u8,
    /// Available spare threshold, percent.
    pub spare_threshold: u8,
    /// Percentage used.
    pub percent_used: u8,
    /// Data units (1000 × 512 bytes) read.
    pub data_units_read: u128,
    /// Data units written.
    pub data_units_written: u128,
    /// Host read commands.
    pub host_reads: u128,
    /// Host write commands.
    pub host_writes: u128,
    /// Power cycles.
    pub power_cycles: u128,
    /// Power-on hours.
    pub power_on_hours: u128,
    /// Unsafe shutdowns.
    pub unsafe_shutdowns: u128,
    /// Media and data integrity errors.
    pub media_errors: u128,
    /// Error information log entries over the controller's life.
    pub error_entries: u128,
}

impl Smart {
    /// The 512-byte log page.
    pub fn build(&self) -> Vec<u8> {
        let mut b = vec![0u8; 512];
        b[0] = self.critical_warning;
        put16(&mut b, 1, self.temperature);
        b[3] = self.available_spare;
        b[4] = self.spare_threshold;
        b[5] = self.percent_used;
        let counters = [
            self.data_units_read,
            self.data_units_written,
            self.host_reads,
            self.host_writes,
            0, // controller busy time
            self.power_cycles,
            self.power_on_hours,
            self.unsafe_shutdowns,
            self.media_errors,
            self.error_entries,
        ];
        for (i, c) in counters.iter().enumerate() {
            b[32 + 16 * i..48 + 16 * i].copy_from_slice(&c.to_le_bytes());
        }
        b
    }
}

/// One Error Information log entry (64 bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ErrorEntry {
    /// Error count (unique, increasing; 0 = empty entry).
    pub error_count: u64,
    /// Submission queue of the command.
    pub sqid: u16,
    /// Its command identifier.
    pub cid: u16,
    /// Status field (bits 15:1, as in a CQE, phase bit 0).
    pub status: u16,
    /// Parameter error location (byte and bit in the command).
    pub parameter_location: u16,
    /// LBA of the error.
    pub lba: u64,
    /// Namespace.
    pub nsid: u32,
}

impl ErrorEntry {
    /// The 64 bytes of this entry; TRTYPE is TCP.
    pub fn build(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        put64(&mut b, 0, self.error_count);
        put16(&mut b, 8, self.sqid);
        put16(&mut b, 10, self.cid);
        put16(&mut b, 12, self.status);
        put16(&mut b, 14, self.parameter_location);
        put64(&mut b, 16, self.lba);
        put32(&mut b, 24, self.nsid);
        b[29] = TRTYPE_TCP;
        b
    }
}

/// The Firmware Slot log page (512 bytes): slot 1 active, holding `revision`.
pub fn firmware_slot_log(revision: &str) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[0] = 1; // AFI: slot 1 active
    put_text(&mut b[8..16], revision, b' ');
    b
}

/// The Changed Namespace List (4096 bytes): up to 1024 NSIDs; more than
/// that is reported as FFFFFFFFh in the first entry.
pub fn changed_namespace_list(nsids: &[u32]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    if nsids.len() > 1024 {
        put32(&mut b, 0, 0xFFFF_FFFF);
    } else {
        for (i, n) in nsids.iter().enumerate() {
            put32(&mut b, i * 4, *n);
        }
    }
    b
}

/// An ANA state (§8.20.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnaState {
    /// Optimized.
    Optimized = 1,
    /// Non-optimized.
    NonOptimized = 2,
    /// Inaccessible.
    Inaccessible = 3,
    /// Persistent loss.
    PersistentLoss = 4,
    /// Change in progress.
    Change = 0xF,
}

/// One ANA group as the ANA log page reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AnaGroup {
    /// ANA group ID.
    pub id: u32,
    /// Change count of the group.
    pub chgcnt: u64,
    /// State through this controller.
    pub state: AnaState,
    /// Namespaces in the group (left out when only groups are asked for).
    pub nsids: Vec<u32>,
}

/// The ANA log page: header (CHGCNT, NGRPS) and one descriptor per group
/// (ANAGRPID, NNSID, CHGCNT, state, NSIDs). With `groups_only` (LSP RGO)
/// the NSID lists are left out.
pub fn ana_log(chgcnt: u64, groups: &[AnaGroup], groups_only: bool) -> Vec<u8> {
    let mut b = vec![0u8; 16];
    put64(&mut b, 0, chgcnt);
    put16(&mut b, 8, groups.len().min(usize::from(u16::MAX)) as u16);
    for g in groups.iter().take(usize::from(u16::MAX)) {
        let nsids: &[u32] = if groups_only { &[] } else { &g.nsids };
        let mut d = [0u8; 32];
        put32(&mut d, 0, g.id);
        put32(&mut d, 4, nsids.len() as u32);
        put64(&mut d, 8, g.chgcnt);
        d[16] = g.state as u8;
        b.extend_from_slice(&d);
        for n in nsids {
            b.extend_from_slice(&n.to_le_bytes());
        }
    }
    b
}

/// Reservation Notification log page types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReservationNotice {
    /// Empty log page.
    Empty = 0,
    /// Registration preempted.
    RegistrationPreempted = 1,
    /// Reservation released.
    Released = 2,
    /// Reservation preempted.
    Preempted = 3,
}

/// The Reservation Notification log page (64 bytes).
pub fn reservation_notification(
    count: u64,
    notice: ReservationNotice,
    available: u8,
    nsid: u32,
) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    put64(&mut b, 0, count);
    b[8] = notice as u8;
    b[9] = available;
    put32(&mut b, 12, nsid);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_offsets() {
        let e = DiscoveryEntry {
            adrfam: AddressFamily::Ipv4,
            subtype: SubsystemType::Nvme,
            treq: 2,
            portid: 1,
            asqsz: 32,
            trsvcid: "4420".into(),
            subnqn: "nqn.x:a".into(),
            traddr: "192.0.2.1".into(),
            sectype: 0,
        };
        let b = discovery_log(9, &[e.clone(), e]);
        assert_eq!(b.len(), 3 * 1024);
        assert_eq!(&b[0..8], &9u64.to_le_bytes());
        assert_eq!(&b[8..16], &2u64.to_le_bytes());
        let r = &b[1024..2048];
        assert_eq!(&r[..4], &[3, 1, 2, 2]);
        assert_eq!(&r[6..8], &[0xFF, 0xFF]);
        assert_eq!(&r[8..10], &32u16.to_le_bytes());
        assert_eq!(&r[32..37], b"4420 ");
        assert_eq!(&r[256..264], b"nqn.x:a\0");
        assert_eq!(&r[512..522], b"192.0.2.1 ");
    }

    #[test]
    fn smart_error_firmware_changed() {
        let s = Smart {
            temperature: 300,
            host_reads: 5,
            media_errors: 2,
            ..Smart::default()
        };
        let b = s.build();
        assert_eq!(b.len(), 512);
        assert_eq!(&b[1..3], &300u16.to_le_bytes());
        assert_eq!(b[64], 5);
        assert_eq!(b[160], 2);
        let e = ErrorEntry {
            error_count: 1,
            cid: 0x42,
            nsid: 3,
            ..ErrorEntry::default()
        }
        .build();
        assert_eq!((e[0], e[10], e[24], e[29]), (1, 0x42, 3, 3));
        let f = firmware_slot_log("1.0");
        assert_eq!((f.len(), f[0]), (512, 1));
        assert_eq!(&f[8..16], b"1.0     ");
        let c = changed_namespace_list(&[4, 9]);
        assert_eq!(&c[..8], &[4, 0, 0, 0, 9, 0, 0, 0]);
        let many = changed_namespace_list(&vec![1; 1025]);
        assert_eq!(&many[..8], &[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]);
    }

    #[test]
    fn ana_and_reservation_notification() {
        let g = AnaGroup {
            id: 1,
            chgcnt: 4,
            state: AnaState::Inaccessible,
            nsids: vec![1, 2],
        };
        let b = ana_log(7, std::slice::from_ref(&g), false);
        assert_eq!(b.len(), 16 + 32 + 8);
        assert_eq!(&b[8..10], &1u16.to_le_bytes());
        assert_eq!(&b[20..24], &2u32.to_le_bytes());
        assert_eq!(b[32], 3);
        assert_eq!(&b[48..52], &1u32.to_le_bytes());
        assert_eq!(ana_log(7, &[g], true).len(), 48);
        let r = reservation_notification(5, ReservationNotice::Preempted, 0, 1);
        assert_eq!((r[0], r[8], r[12]), (5, 3, 1));
    }

    #[test]
    fn windows() {
        let page: Vec<u8> = (0..16).collect();
        assert_eq!(window(&page, 12, 8), Some(vec![12, 13, 14, 15, 0, 0, 0, 0]));
        assert_eq!(window(&page, 16, 4), Some(vec![0; 4]));
        assert_eq!(window(&page, 20, 4), None);
        assert_eq!(window(&page, u64::MAX, 4), None);
    }
}
