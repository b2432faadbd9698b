//! NVMe I/O commands as the SCSI commands that carry them out, and SCSI
//! outcomes as NVMe status: every NVMe read and write goes through the
//! same executor and rules (masking, read-only, reservations, ALUA,
//! counters) as an iSCSI one.

use ethersan_nvme::command::DsmRange;
use ethersan_nvme::status::StatusCodeType;
use ethersan_nvme::Status;
use ethersan_scsi::sense::{key, Sense};
use ethersan_scsi::ScsiStatus;

/// Namespace is Write Protected (NVMe 1.4 generic status 20h).
pub const NAMESPACE_WRITE_PROTECTED: Status =
    Status::new(StatusCodeType::Generic, 0x20).with_dnr(true);

fn rw16(op: u8, flags: u8, lba: u64, blocks: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// READ(16) of `blocks` at `lba` (FUA when asked).
pub fn read16(lba: u64, blocks: u32, fua: bool) -> Vec<u8> {
    rw16(0x88, if fua { 0x08 } else { 0 }, lba, blocks)
}

/// WRITE(16) of `blocks` at `lba` (FUA when asked).
pub fn write16(lba: u64, blocks: u32, fua: bool) -> Vec<u8> {
    rw16(0x8A, if fua { 0x08 } else { 0 }, lba, blocks)
}

/// SYNCHRONIZE CACHE(16) of the whole medium.
pub fn sync_cache16() -> Vec<u8> {
    rw16(0x91, 0, 0, 0)
}

/// WRITE SAME(16) of one zeroed block over `blocks` at `lba`; UNMAP set
/// when the host allows deallocating (Write Zeroes with DEAC).
pub fn write_same16(lba: u64, blocks: u32, unmap: bool) -> Vec<u8> {
    rw16(0x93, if unmap { 0x08 } else { 0 }, lba, blocks)
}

/// VERIFY(16) with BYTCHK 1: compare `blocks` at `lba` with the data.
pub fn verify16(lba: u64, blocks: u32) -> Vec<u8> {
    rw16(0x8F, 0x02, lba, blocks)
}

/// Most blocks one UNMAP descriptor may name (the MAXIMUM UNMAP LBA
/// COUNT ethersan's logical units report in VPD page B0h).
pub const UNMAP_DESCRIPTOR_BLOCKS: u32 = 1 << 20;

/// UNMAP with the deallocate ranges of a Dataset Management command:
/// the CDB and its parameter list. Ranges of no blocks are left out; a
/// range longer than [`UNMAP_DESCRIPTOR_BLOCKS`] becomes several
/// descriptors.
pub fn unmap(ranges: &[DsmRange]) -> (Vec<u8>, Vec<u8>) {
    let mut descs: Vec<DsmRange> = Vec::new();
    for r in ranges {
        let mut at = 0u32;
        while at < r.blocks {
            let n = (r.blocks - at).min(UNMAP_DESCRIPTOR_BLOCKS);
            descs.push(DsmRange {
                attributes: r.attributes,
                blocks: n,
                slba: r.slba.saturating_add(u64::from(at)),
            });
            at += n;
        }
    }
    let len = 8 + 16 * descs.len();
    let mut p = vec![0u8; len];
    p[0..2].copy_from_slice(&((len - 2) as u16).to_be_bytes());
    p[2..4].copy_from_slice(&((16 * descs.len()) as u16).to_be_bytes());
    for (i, r) in descs.iter().enumerate() {
        let d = &mut p[8 + 16 * i..][..16];
        d[0..8].copy_from_slice(&r.slba.to_be_bytes());
        d[8..12].copy_from_slice(&r.blocks.to_be_bytes());
    }
    let mut c = vec![0u8; 10];
    c[0] = 0x42;
    c[7..9].copy_from_slice(&(len as u16).to_be_bytes());
    (c, p)
}

/// The NVMe status of a SCSI outcome: its status byte and sense data.
pub fn nvme_status(status: ScsiStatus, sense: &[u8]) -> Status {
    match status {
        ScsiStatus::Good | ScsiStatus::ConditionMet => Status::SUCCESS,
        ScsiStatus::ReservationConflict => Status::RESERVATION_CONFLICT,
        // Try again later: not DNR.
        ScsiStatus::Busy | ScsiStatus::TaskSetFull | ScsiStatus::AcaActive => {
            Status::NAMESPACE_NOT_READY
        }
        ScsiStatus::TaskAborted => Status::ABORTED,
        ScsiStatus::CheckCondition => match Sense::parse(sense) {
            Some(s) => sense_status(&s),
            None => Status::INTERNAL_ERROR,
        },
    }
}

/// The NVMe status of a CHECK CONDITION's sense.
fn sense_status(s: &Sense) -> Status {
    match (s.key, s.asc, s.ascq) {
        (key::ILLEGAL_REQUEST, 0x21, _) => Status::LBA_OUT_OF_RANGE,
        (key::ILLEGAL_REQUEST, 0x25, _) => Status::INVALID_NAMESPACE,
        (key::ILLEGAL_REQUEST, 0x20, _) => Status::INVALID_OPCODE,
        (key::ILLEGAL_REQUEST, 0x24 | 0x26 | 0x1A, _) => Status::INVALID_FIELD,
        (key::DATA_PROTECT, 0x27, _) => NAMESPACE_WRITE_PROTECTED,
        (key::DATA_PROTECT, _, _) => Status::ACCESS_DENIED,
        (key::MEDIUM_ERROR, 0x0C, _) => Status::WRITE_FAULT,
        (key::MEDIUM_ERROR, _, _) => Status::UNRECOVERED_READ_ERROR,
        (key::MISCOMPARE, _, _) => Status::COMPARE_FAILURE,
        // ALUA: transitioning, standby, unavailable.
        (key::NOT_READY, 0x04, 0x0A) => Status::ANA_TRANSITION,
        (key::NOT_READY, 0x04, 0x0B | 0x0C) => Status::ANA_INACCESSIBLE,
        (key::NOT_READY, _, _) => Status::NAMESPACE_NOT_READY,
        // A unit attention (a reservation preempted, capacity changed):
        // the host retries (not DNR) and the next try goes through.
        (key::UNIT_ATTENTION, _, _) => Status::NAMESPACE_NOT_READY,
        (key::ABORTED_COMMAND, _, _) => Status::ABORTED,
        _ => Status::INTERNAL_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(k: u8, asc: u8, ascq: u8) -> Status {
        let sense = Sense::new(k, asc, ascq).to_bytes(false);
        nvme_status(ScsiStatus::CheckCondition, &sense)
    }

    #[test]
    fn status_byte_rows() {
        assert_eq!(nvme_status(ScsiStatus::Good, &[]), Status::SUCCESS);
        assert_eq!(
            nvme_status(ScsiStatus::ReservationConflict, &[]),
            Status::RESERVATION_CONFLICT
        );
        assert_eq!(
            nvme_status(ScsiStatus::Busy, &[]),
            Status::NAMESPACE_NOT_READY
        );
        assert_eq!(nvme_status(ScsiStatus::TaskAborted, &[]), Status::ABORTED);
        assert_eq!(
            nvme_status(ScsiStatus::CheckCondition, &[]),
            Status::INTERNAL_ERROR
        );
    }

    #[test]
    fn lba_out_of_range() {
        assert_eq!(cc(key::ILLEGAL_REQUEST, 0x21, 0), Status::LBA_OUT_OF_RANGE);
    }

    #[test]
    fn write_protected() {
        let s = cc(key::DATA_PROTECT, 0x27, 0);
        assert_eq!(s, NAMESPACE_WRITE_PROTECTED);
        assert_eq!((s.sc, s.dnr), (0x20, true));
        assert_eq!(cc(key::DATA_PROTECT, 0x74, 0x71), Status::ACCESS_DENIED);
    }

    #[test]
    fn medium_errors() {
        assert_eq!(
            cc(key::MEDIUM_ERROR, 0x11, 0),
            Status::UNRECOVERED_READ_ERROR
        );
        assert_eq!(cc(key::MEDIUM_ERROR, 0x0C, 0), Status::WRITE_FAULT);
    }

    #[test]
    fn miscompare() {
        assert_eq!(cc(key::MISCOMPARE, 0x1D, 0), Status::COMPARE_FAILURE);
    }

    #[test]
    fn alua_states() {
        assert_eq!(cc(key::NOT_READY, 0x04, 0x0B), Status::ANA_INACCESSIBLE);
        assert_eq!(cc(key::NOT_READY, 0x04, 0x0C), Status::ANA_INACCESSIBLE);
        assert_eq!(cc(key::NOT_READY, 0x04, 0x0A), Status::ANA_TRANSITION);
        assert_eq!(cc(key::NOT_READY, 0x3A, 0), Status::NAMESPACE_NOT_READY);
    }

    #[test]
    fn invalid_requests_and_others() {
        assert_eq!(cc(key::ILLEGAL_REQUEST, 0x25, 0), Status::INVALID_NAMESPACE);
        assert_eq!(cc(key::ILLEGAL_REQUEST, 0x20, 0), Status::INVALID_OPCODE);
        assert_eq!(cc(key::ILLEGAL_REQUEST, 0x24, 0), Status::INVALID_FIELD);
        let ua = cc(key::UNIT_ATTENTION, 0x29, 0);
        assert_eq!(ua, Status::NAMESPACE_NOT_READY);
        assert!(!ua.dnr);
        assert_eq!(cc(key::ABORTED_COMMAND, 0x47, 0), Status::ABORTED);
        assert_eq!(cc(key::HARDWARE_ERROR, 0x44, 0), Status::INTERNAL_ERROR);
    }

    #[test]
    fn cdbs() {
        let r = read16(0x0102_0304_0506_0708, 9, true);
        assert_eq!(
            r,
            [0x88, 0x08, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 9, 0, 0].to_vec()
        );
        assert_eq!(write16(1, 2, false)[..2], [0x8A, 0]);
        assert_eq!(write16(1, 2, true)[1], 0x08);
        assert_eq!(&write16(1, 2, false)[10..14], &[0, 0, 0, 2]);
        assert_eq!(
            sync_cache16(),
            [0x91].iter().chain(&[0; 15]).copied().collect::<Vec<_>>()
        );
        assert_eq!(write_same16(5, 8, true)[..2], [0x93, 0x08]);
        assert_eq!(write_same16(5, 8, false)[1], 0);
        assert_eq!(verify16(5, 8)[..2], [0x8F, 0x02]);
        let (c, p) = unmap(&[
            DsmRange {
                attributes: 0,
                blocks: 8,
                slba: 100,
            },
            DsmRange {
                attributes: 0,
                blocks: 0,
                slba: 7,
            },
        ]);
        assert_eq!((c[0], u16::from_be_bytes([c[7], c[8]])), (0x42, 24));
        assert_eq!(p.len(), 24);
        assert_eq!(&p[..4], &[0, 22, 0, 16]);
        assert_eq!(&p[8..16], &100u64.to_be_bytes());
        assert_eq!(&p[16..20], &8u32.to_be_bytes());
        // A long range: several descriptors.
        let (_, p) = unmap(&[DsmRange {
            attributes: 0,
            blocks: UNMAP_DESCRIPTOR_BLOCKS * 2 + 3,
            slba: 10,
        }]);
        assert_eq!(p.len(), 8 + 3 * 16);
        assert_eq!(
            &p[8 + 16..8 + 24],
            &(10 + u64::from(UNMAP_DESCRIPTOR_BLOCKS)).to_be_bytes()
        );
        assert_eq!(&p[8 + 32 + 8..8 + 32 + 12], &3u32.to_be_bytes());
    }
}
