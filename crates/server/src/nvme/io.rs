//! I/O commands of a controller: each becomes the SCSI command that does
//! it ([`super::translate`]), run by the target core's executor from the
//! host's own I_T nexus with its NQN as the initiator name.

use std::sync::Arc;
use std::time::Instant;

use ethersan_core::executor::{Command, Counting, Finished};
use ethersan_nvme::command::{parse_dsm_ranges, parse_reservation_keys, IoCommand, LbaRange};
use ethersan_nvme::queue::Completion;
use ethersan_nvme::{Sqe, Status};
use ethersan_scsi::{IoBuf, Nexus, ScsiCommand, ScsiResponse, ScsiStatus};

use super::conn::{Conn, InFlight, TokioBlocking};
use super::ident;
use super::reservations;
use super::translate::{self, nvme_status};
use super::{Controller, Role};

/// The I_T nexus of host `hostnqn` (host ID `hostid`) on target
/// `target`: FNV-1a over a prefix no iSCSI name has and the three, so a
/// host keeps its reservation registrations across reconnects and two
/// hosts never share one.
pub(super) fn nexus(hostnqn: &str, hostid: &[u8; 16], target: &str) -> Nexus {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let parts: [&[u8]; 4] = [b"nvme-host ", hostnqn.as_bytes(), hostid, target.as_bytes()];
    for p in parts {
        for b in p.iter().chain(std::iter::once(&0xffu8)) {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    Nexus(h)
}

/// A SCSI command to run for an NVMe one.
struct Plan {
    cdb: Vec<u8>,
    data: IoBuf,
    expected_len: u32,
    kind: InFlight,
}

impl Conn {
    /// An I/O command on one of controller `c`'s I/O queues.
    pub(super) fn io_command(
        &mut self,
        c: &Controller,
        sqe: Sqe,
        data: Option<IoBuf>,
        to_host: usize,
    ) {
        let cid = sqe.cid();
        let Role::Io {
            target,
            nexus,
            counters,
        } = &c.role
        else {
            return self.complete(Completion::new(cid, Status::INVALID_OPCODE));
        };
        let Some(lun) = ident::lun_of(sqe.nsid()) else {
            return self.complete(Completion::new(cid, Status::INVALID_NAMESPACE));
        };
        let Some(lu) = target.scsi.lun(lun) else {
            return self.complete(Completion::new(cid, Status::INVALID_NAMESPACE));
        };
        let bs = lu.volume().block_size() as usize;
        let cmd = match IoCommand::parse(&sqe) {
            Ok(IoCommand::ReservationReport { len, eds }) => {
                let len = (len as usize).min(to_host);
                self.in_flight.insert(cid, InFlight::Data(len));
                let (scsi, nexus, host) = (target.scsi.clone(), *nexus, c.hostnqn.clone());
                let done = self.done.clone();
                tokio::task::spawn_blocking(move || {
                    let f = reservation_report(&scsi, nexus, &host, lun, eds);
                    done(u32::from(cid), f)
                });
                return;
            }
            other => other,
        };
        let plan = cmd.and_then(|cmd| plan(cmd, bs, data, to_host));
        let plan = match plan {
            Ok(Some(p)) => p,
            Ok(None) => return self.complete(Completion::new(cid, Status::SUCCESS)),
            Err(s) => return self.complete(Completion::new(cid, s)),
        };
        let cmd = Command {
            nexus: *nexus,
            initiator: c.hostnqn.clone(),
            channel_level: None,
            lun,
            cdb: plan.cdb,
            data: plan.data,
            expected_len: plan.expected_len,
            tag: u32::from(cid),
            started: Instant::now(),
            early: None,
            stream: None,
        };
        let counting = Counting {
            lun: target.lun_counters(lun),
            initiator: Some(counters.clone()),
            session: None,
        };
        let scsi = Arc::clone(&target.scsi);
        let done = self.done.clone();
        match self
            .shared
            .executor
            .execute(&scsi, cmd, counting, &TokioBlocking, &done)
        {
            Some(f) => self.io_finished(cid, plan.kind, f),
            None => {
                self.in_flight.insert(cid, plan.kind);
            }
        }
    }

    /// Answer an I/O command the executor finished.
    pub(super) fn io_finished(&mut self, cid: u16, kind: InFlight, f: Finished) {
        let r = f.response;
        let status = nvme_status(r.status, &r.sense);
        match kind {
            InFlight::Read(len) if status.is_success() => {
                let data = r.data_in.into_bytes();
                if data.len() < len {
                    // GOOD with less data than asked: never leave part of
                    // the host's buffer as it was.
                    self.complete(Completion::new(cid, Status::INTERNAL_ERROR));
                } else {
                    self.send_data(Completion::new(cid, status), data, len)
                }
            }
            InFlight::Data(len) if status.is_success() => {
                self.send_data(Completion::new(cid, status), r.data_in.into_bytes(), len)
            }
            _ => self.complete(Completion::new(cid, status)),
        }
    }
}

/// A PERSISTENT RESERVE OUT with its parameter list.
fn pr_out((cdb, list): (Vec<u8>, Vec<u8>)) -> Plan {
    Plan {
        cdb,
        expected_len: list.len() as u32,
        data: IoBuf::from(list),
        kind: InFlight::Other,
    }
}

/// Reservation Report: READ KEYS and READ RESERVATION from the host's
/// nexus (on a thread where blocking is fine), as the NVMe structure.
fn reservation_report(
    scsi: &ethersan_scsi::ScsiTarget,
    nexus: Nexus,
    host: &str,
    lun: u64,
    eds: bool,
) -> Finished {
    let run = |action| {
        scsi.submit_and_wait(
            ScsiCommand {
                nexus,
                lun,
                cdb: reservations::pr_in(action),
                data_out: IoBuf::default(),
                expected_len: 8192,
            },
            Some(host),
        )
    };
    let keys = run(0);
    let response = if keys.status != ScsiStatus::Good {
        keys
    } else {
        let res = run(1);
        if res.status != ScsiStatus::Good {
            res
        } else {
            ScsiResponse {
                status: ScsiStatus::Good,
                sense: Vec::new(),
                data_in: IoBuf::from(reservations::report(&keys.data_in, &res.data_in, eds)),
                data_out_len: None,
            }
        }
    };
    Finished {
        response,
        preempted: Vec::new(),
    }
}

/// Bytes of `range` in blocks of `bs`.
fn bytes_of(range: LbaRange, bs: usize) -> usize {
    range.blocks as usize * bs
}

/// Data of at least `need` bytes, cut to that length.
fn data_of(data: Option<IoBuf>, need: usize) -> Result<IoBuf, Status> {
    let mut d = data.ok_or(Status::SGL_LENGTH_INVALID)?;
    if d.len() < need {
        return Err(Status::SGL_LENGTH_INVALID);
    }
    d.truncate(need);
    Ok(d)
}

/// The SCSI command for `cmd` on a namespace of `bs`-byte blocks;
/// `Ok(None)`: nothing to do, success.
fn plan(
    cmd: IoCommand,
    bs: usize,
    data: Option<IoBuf>,
    to_host: usize,
) -> Result<Option<Plan>, Status> {
    let p = match cmd {
        IoCommand::Read { range, fua } => {
            let n = bytes_of(range, bs);
            if to_host < n {
                return Err(Status::SGL_LENGTH_INVALID);
            }
            Plan {
                cdb: translate::read16(range.slba, range.blocks, fua),
                data: IoBuf::default(),
                expected_len: n as u32,
                kind: InFlight::Read(n),
            }
        }
        IoCommand::Write { range, fua } => {
            let n = bytes_of(range, bs);
            Plan {
                cdb: translate::write16(range.slba, range.blocks, fua),
                data: data_of(data, n)?,
                expected_len: n as u32,
                kind: InFlight::Other,
            }
        }
        IoCommand::Compare { range } => {
            let n = bytes_of(range, bs);
            Plan {
                cdb: translate::verify16(range.slba, range.blocks),
                data: data_of(data, n)?,
                expected_len: n as u32,
                kind: InFlight::Other,
            }
        }
        IoCommand::Flush => Plan {
            cdb: translate::sync_cache16(),
            data: IoBuf::default(),
            expected_len: 0,
            kind: InFlight::Other,
        },
        // WRITE SAME has no FUA bit: a Write Zeroes that asks for it is
        // refused rather than acknowledged before it is durable.
        IoCommand::WriteZeroes { fua: true, .. } => return Err(Status::INVALID_FIELD),
        IoCommand::WriteZeroes { range, deac, .. } => Plan {
            cdb: translate::write_same16(range.slba, range.blocks, deac),
            data: IoBuf::aligned(bs),
            expected_len: bs as u32,
            kind: InFlight::Other,
        },
        IoCommand::DatasetManagement { ranges, deallocate } => {
            if !deallocate {
                // Only hints: nothing to do.
                return Ok(None);
            }
            let ranges = parse_dsm_ranges(data.as_deref().unwrap_or(&[]), ranges)?;
            let (cdb, list) = translate::unmap(&ranges);
            if list.len() == 8 {
                return Ok(None);
            }
            // More descriptors than one UNMAP takes (MAXIMUM UNMAP BLOCK
            // DESCRIPTOR COUNT 256).
            if list.len() > 8 + 16 * 256 {
                return Err(Status::INVALID_FIELD);
            }
            Plan {
                cdb,
                expected_len: list.len() as u32,
                data: IoBuf::from(list),
                kind: InFlight::Other,
            }
        }
        IoCommand::ReservationRegister {
            action,
            iekey,
            cptpl,
        } => {
            let (crkey, nrkey) = parse_reservation_keys(data.as_deref().unwrap_or(&[]))?;
            pr_out(reservations::register(action, iekey, cptpl, crkey, nrkey))
        }
        IoCommand::ReservationAcquire { action, rtype, .. } => {
            let (crkey, prkey) = parse_reservation_keys(data.as_deref().unwrap_or(&[]))?;
            pr_out(reservations::acquire(action, rtype, crkey, prkey)?)
        }
        IoCommand::ReservationRelease { action, rtype, .. } => {
            let (crkey, _) = parse_reservation_keys(data.as_deref().unwrap_or(&[]))?;
            pr_out(reservations::release(action, rtype, crkey)?)
        }
        // Answered apart (two SCSI commands), never planned here.
        IoCommand::ReservationReport { .. } => return Err(Status::INTERNAL_ERROR),
    };
    Ok(Some(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(slba: u64, blocks: u32) -> LbaRange {
        LbaRange { slba, blocks }
    }

    #[test]
    fn reads_and_writes_become_16_byte_cdbs() {
        let p = plan(
            IoCommand::Read {
                range: range(8, 2),
                fua: false,
            },
            512,
            None,
            1024,
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.cdb, translate::read16(8, 2, false));
        assert_eq!(p.expected_len, 1024);
        assert!(matches!(p.kind, InFlight::Read(1024)));
        let short = plan(
            IoCommand::Read {
                range: range(8, 2),
                fua: false,
            },
            512,
            None,
            512,
        );
        assert_eq!(short.err(), Some(Status::SGL_LENGTH_INVALID));
        let w = plan(
            IoCommand::Write {
                range: range(1, 1),
                fua: true,
            },
            4096,
            Some(IoBuf::from(vec![7u8; 8192])),
            0,
        )
        .unwrap()
        .unwrap();
        assert_eq!(w.cdb, translate::write16(1, 1, true));
        assert_eq!(w.data.len(), 4096);
        let missing = plan(
            IoCommand::Write {
                range: range(1, 2),
                fua: false,
            },
            512,
            Some(IoBuf::from(vec![0u8; 512])),
            0,
        );
        assert_eq!(missing.err(), Some(Status::SGL_LENGTH_INVALID));
    }

    #[test]
    fn zeroes_flush_dsm_and_reservations() {
        let z = plan(
            IoCommand::WriteZeroes {
                range: range(4, 16),
                deac: true,
                fua: false,
            },
            512,
            None,
            0,
        )
        .unwrap()
        .unwrap();
        assert_eq!(z.cdb, translate::write_same16(4, 16, true));
        assert_eq!(&*z.data, &[0u8; 512][..]);
        let f = plan(IoCommand::Flush, 512, None, 0).unwrap().unwrap();
        assert_eq!(f.cdb[0], 0x91);
        let hint = plan(
            IoCommand::DatasetManagement {
                ranges: 1,
                deallocate: false,
            },
            512,
            None,
            0,
        );
        assert!(matches!(hint, Ok(None)));
        let mut d = vec![0u8; 16];
        d[4..8].copy_from_slice(&8u32.to_le_bytes());
        d[8..16].copy_from_slice(&100u64.to_le_bytes());
        let u = plan(
            IoCommand::DatasetManagement {
                ranges: 1,
                deallocate: true,
            },
            512,
            Some(IoBuf::from(d)),
            0,
        )
        .unwrap()
        .unwrap();
        assert_eq!(u.cdb[0], 0x42);
        assert_eq!(u.expected_len, 24);
        let mut keys = vec![0u8; 16];
        keys[8..16].copy_from_slice(&0x1234u64.to_le_bytes());
        let r = plan(
            IoCommand::ReservationRegister {
                action: 0,
                iekey: false,
                cptpl: 0,
            },
            512,
            Some(IoBuf::from(keys)),
            0,
        )
        .unwrap()
        .unwrap();
        assert_eq!((r.cdb[0], r.cdb[1], r.expected_len), (0x5F, 0, 24));
        assert_eq!(&r.data[8..16], &0x1234u64.to_be_bytes());
        let short = plan(
            IoCommand::ReservationRelease {
                action: 0,
                iekey: false,
                rtype: 1,
            },
            512,
            None,
            0,
        );
        assert_eq!(short.err(), Some(Status::DATA_TRANSFER_ERROR));
    }

    #[test]
    fn nexus_per_host_and_target() {
        let id = [1u8; 16];
        let a = nexus("nqn.h:1", &id, "t");
        assert_eq!(a, nexus("nqn.h:1", &id, "t"));
        assert_ne!(a, nexus("nqn.h:2", &id, "t"));
        assert_ne!(a, nexus("nqn.h:1", &[2u8; 16], "t"));
        assert_ne!(a, nexus("nqn.h:1", &id, "u"));
    }
}
