//! NVMe reservations (NVMe 1.4 §8.8; Reservation Register, Acquire,
//! Release, Report) as SCSI persistent reservations (SPC-4 §5.9):
//! PERSISTENT RESERVE OUT for the first three, PERSISTENT RESERVE IN
//! (READ KEYS, READ RESERVATION) for the report. One set of registrations
//! and one reservation per LUN, whichever protocol made them.

use ethersan_nvme::Status;

/// PERSISTENT RESERVE OUT service actions.
mod sa {
    pub(super) const REGISTER: u8 = 0x00;
    pub(super) const RESERVE: u8 = 0x01;
    pub(super) const RELEASE: u8 = 0x02;
    pub(super) const CLEAR: u8 = 0x03;
    pub(super) const PREEMPT: u8 = 0x04;
    pub(super) const PREEMPT_AND_ABORT: u8 = 0x05;
    pub(super) const REGISTER_AND_IGNORE: u8 = 0x06;
}

/// The SCSI persistent reservation type of NVMe reservation type `t`
/// (1..=6), or `None`.
pub fn scsi_type(t: u8) -> Option<u8> {
    Some(match t {
        1 => 1, // Write Exclusive
        2 => 3, // Exclusive Access
        3 => 5, // Write Exclusive, Registrants Only
        4 => 6, // Exclusive Access, Registrants Only
        5 => 7, // Write Exclusive, All Registrants
        6 => 8, // Exclusive Access, All Registrants
        _ => return None,
    })
}

/// The NVMe reservation type of SCSI type `t` (0: none).
pub fn nvme_type(t: u8) -> u8 {
    match t {
        1 => 1,
        3 => 2,
        5 => 3,
        6 => 4,
        7 => 5,
        8 => 6,
        _ => 0,
    }
}

/// A PERSISTENT RESERVE OUT: its CDB and 24-byte parameter list.
fn pr_out(action: u8, rtype: u8, key: u64, sa_key: u64, aptpl: bool) -> (Vec<u8>, Vec<u8>) {
    let mut c = vec![0u8; 10];
    c[0] = 0x5F;
    c[1] = action;
    c[2] = rtype & 0x0F;
    c[5..9].copy_from_slice(&24u32.to_be_bytes());
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p[20] = u8::from(aptpl);
    (c, p)
}

/// Reservation Register: `action` 0 register, 1 unregister, 2 replace;
/// `cptpl` 3 persists through power loss.
pub fn register(action: u8, iekey: bool, cptpl: u8, crkey: u64, nrkey: u64) -> (Vec<u8>, Vec<u8>) {
    let aptpl = cptpl == 3;
    let (key, sa_key) = match action {
        0 => (0, nrkey),
        1 => (crkey, 0),
        _ => (crkey, nrkey),
    };
    if iekey {
        pr_out(sa::REGISTER_AND_IGNORE, 0, 0, sa_key, aptpl)
    } else {
        pr_out(sa::REGISTER, 0, key, sa_key, aptpl)
    }
}

/// Reservation Acquire: `action` 0 acquire, 1 preempt, 2 preempt and
/// abort, of NVMe type `rtype`.
pub fn acquire(
    action: u8,
    rtype: u8,
    crkey: u64,
    prkey: u64,
) -> Result<(Vec<u8>, Vec<u8>), Status> {
    let t = scsi_type(rtype).ok_or(Status::INVALID_FIELD)?;
    Ok(match action {
        0 => pr_out(sa::RESERVE, t, crkey, 0, false),
        1 => pr_out(sa::PREEMPT, t, crkey, prkey, false),
        _ => pr_out(sa::PREEMPT_AND_ABORT, t, crkey, prkey, false),
    })
}

/// Reservation Release: `action` 0 release (of NVMe type `rtype`), 1
/// clear.
pub fn release(action: u8, rtype: u8, crkey: u64) -> Result<(Vec<u8>, Vec<u8>), Status> {
    Ok(match action {
        0 => pr_out(
            sa::RELEASE,
            scsi_type(rtype).ok_or(Status::INVALID_FIELD)?,
            crkey,
            0,
            false,
        ),
        _ => pr_out(sa::CLEAR, 0, crkey, 0, false),
    })
}

/// PERSISTENT RESERVE IN of service action `action` (0 READ KEYS, 1 READ
/// RESERVATION), allocation length 8 KiB.
pub fn pr_in(action: u8) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = 0x5E;
    c[1] = action;
    c[7..9].copy_from_slice(&8192u16.to_be_bytes());
    c
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The Reservation Status data structure (NVMe 1.4 Figure 397/398, the
/// extended form with `eds`) from the READ KEYS and READ RESERVATION
/// data. A registrant is known by its key only: CNTLID FFFFh, host ID 0;
/// it holds the reservation when its key is the holder's (every
/// registrant, for the all-registrants types).
pub fn report(keys: &[u8], reservation: &[u8], eds: bool) -> Vec<u8> {
    let gen = be32(keys, 0).unwrap_or(0);
    let n = be32(keys, 4).unwrap_or(0) as usize / 8;
    let list: Vec<u64> = (0..n).filter_map(|i| be64(keys, 8 + 8 * i)).collect();
    let held = be32(reservation, 4).unwrap_or(0) >= 16;
    let holder = if held { be64(reservation, 8) } else { None };
    let stype = if held {
        reservation.get(21).map_or(0, |b| b & 0x0F)
    } else {
        0
    };
    let all = matches!(stype, 7 | 8);
    let (head, entry) = if eds { (64, 64) } else { (24, 24) };
    let mut b = vec![0u8; head + entry * list.len()];
    b[0..4].copy_from_slice(&gen.to_le_bytes());
    b[4] = nvme_type(stype);
    b[5..7].copy_from_slice(&(list.len().min(0xFFFF) as u16).to_le_bytes());
    for (i, k) in list.iter().enumerate() {
        let e = &mut b[head + entry * i..][..entry];
        e[0..2].copy_from_slice(&0xFFFFu16.to_le_bytes());
        e[2] = u8::from(held && (all || holder == Some(*k)));
        let at = if eds { 8 } else { 16 };
        e[at..at + 8].copy_from_slice(&k.to_le_bytes());
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_both_ways() {
        for t in 1..=6 {
            assert_eq!(nvme_type(scsi_type(t).unwrap()), t);
        }
        assert_eq!(scsi_type(0), None);
        assert_eq!(scsi_type(7), None);
        assert_eq!(nvme_type(0), 0);
    }

    #[test]
    fn register_acquire_release() {
        let (c, p) = register(0, false, 0, 9, 0xAB);
        assert_eq!((c[0], c[1]), (0x5F, 0x00));
        assert_eq!(u32::from_be_bytes([c[5], c[6], c[7], c[8]]), 24);
        assert_eq!(&p[0..8], &0u64.to_be_bytes());
        assert_eq!(&p[8..16], &0xABu64.to_be_bytes());
        let (c, p) = register(1, false, 3, 9, 0);
        assert_eq!(&p[0..8], &9u64.to_be_bytes());
        assert_eq!(&p[8..16], &0u64.to_be_bytes());
        assert_eq!((c[1], p[20]), (0, 1));
        let (c, p) = register(2, true, 0, 9, 10);
        assert_eq!(c[1], 0x06);
        assert_eq!(&p[8..16], &10u64.to_be_bytes());
        let (c, p) = acquire(0, 2, 9, 0).unwrap();
        assert_eq!((c[1], c[2]), (0x01, 3));
        assert_eq!(&p[0..8], &9u64.to_be_bytes());
        let (c, p) = acquire(2, 1, 9, 5).unwrap();
        assert_eq!((c[1], c[2]), (0x05, 1));
        assert_eq!(&p[8..16], &5u64.to_be_bytes());
        assert_eq!(acquire(0, 9, 1, 0).err(), Some(Status::INVALID_FIELD));
        assert_eq!(release(0, 1, 9).unwrap().0[1..3], [0x02, 1]);
        assert_eq!(release(1, 0, 9).unwrap().0[1], 0x03);
    }

    #[test]
    fn report_from_keys_and_reservation() {
        let mut keys = vec![0u8; 24];
        keys[0..4].copy_from_slice(&7u32.to_be_bytes());
        keys[4..8].copy_from_slice(&16u32.to_be_bytes());
        keys[8..16].copy_from_slice(&0xAAu64.to_be_bytes());
        keys[16..24].copy_from_slice(&0xBBu64.to_be_bytes());
        let mut res = vec![0u8; 24];
        res[4..8].copy_from_slice(&16u32.to_be_bytes());
        res[8..16].copy_from_slice(&0xBBu64.to_be_bytes());
        res[21] = 1;
        let r = report(&keys, &res, false);
        assert_eq!(r.len(), 24 + 48);
        assert_eq!((r[0], r[4], r[5]), (7, 1, 2));
        assert_eq!(r[24 + 2], 0, "0xAA does not hold it");
        assert_eq!(r[48 + 2], 1, "0xBB holds it");
        assert_eq!(&r[48 + 16..48 + 24], &0xBBu64.to_le_bytes());
        let e = report(&keys, &res, true);
        assert_eq!(e.len(), 64 + 128);
        assert_eq!(&e[64 + 8..64 + 16], &0xAAu64.to_le_bytes());
        let none = report(&keys[..8], &[0u8; 8], false);
        assert_eq!((none.len(), none[4]), (24, 0));
    }
}
