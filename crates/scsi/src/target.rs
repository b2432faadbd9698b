//! SAM-5 §4.6: the target device routes commands to logical units by LUN,
//! answers REPORT LUNS itself and speaks for LUNs that do not exist.

use std::sync::Arc;

use crate::commands::Op;
use crate::copy::CopyManager;
use crate::disk::LogicalUnit;
use crate::sense::Sense;
use crate::{
    LunAccess, Nexus, ResetKind, ScsiCommand, ScsiCompletion, ScsiResponse, ScsiStatus, Submitted,
};

/// REPORT LUNS parameter data for `luns` (peripheral addressing below 256,
/// flat space above).
pub(crate) fn report_luns(cdb: &[u8], luns: &[u64]) -> Result<super::disk::ReplyData, Sense> {
    if cdb.len() < 12 {
        return Err(crate::sense::codes::INVALID_FIELD_IN_CDB);
    }
    let select = cdb[2];
    if select > 2 {
        return Err(Sense::invalid_cdb_field(2, None));
    }
    let alloc = u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]) as usize;
    if alloc < 16 {
        return Err(Sense::invalid_cdb_field(6, None));
    }
    // Select 1 (well-known LUNs only): we have none.
    let listed: Vec<u64> = if select == 1 {
        Vec::new()
    } else {
        luns.to_vec()
    };
    let mut d = Vec::with_capacity(8 + 8 * listed.len());
    d.extend_from_slice(&((listed.len() * 8) as u32).to_be_bytes());
    d.extend_from_slice(&[0; 4]);
    for l in listed {
        let wire: u64 = if l < 256 {
            l << 48
        } else {
            (0x4000 | (l & 0x3fff)) << 48
        };
        d.extend_from_slice(&wire.to_be_bytes());
    }
    d.truncate(alloc);
    Ok(d)
}

/// A SCSI target device: routes commands to logical units by LUN.
#[derive(Debug, Default)]
pub struct ScsiTarget {
    luns: Vec<Arc<LogicalUnit>>,
    copies: Arc<CopyManager>,
}

impl ScsiTarget {
    /// Create a target whose LUN *i* is `luns[i]`.
    pub fn new(luns: Vec<Arc<LogicalUnit>>) -> Self {
        ScsiTarget {
            luns,
            copies: Arc::default(),
        }
    }

    /// The logical units, by LUN number.
    pub fn luns(&self) -> &[Arc<LogicalUnit>] {
        &self.luns
    }

    fn lun(&self, lun: u64) -> Option<&Arc<LogicalUnit>> {
        usize::try_from(lun).ok().and_then(|i| self.luns.get(i))
    }

    /// The one entry point: run `cmd` for an initiator whose access to
    /// each LUN `access` tells. The lookup and the unit's checks (CDB,
    /// unit attentions, reservations, medium, write protection) run once,
    /// here; then the command is finished ([`Submitted::Done`]), in the
    /// engine ([`Submitted::Pending`]: `done` gets the response), or left
    /// as a job for a thread where blocking is fine
    /// ([`Submitted::Blocking`]). `done` is called if and only if the
    /// answer is `Pending`.
    ///
    /// REPORT LUNS lists only the visible LUNs; a LUN that is not visible
    /// answers as one that does not exist (INQUIRY peripheral qualifier
    /// 011b, other commands LOGICAL UNIT NOT SUPPORTED); on a read-only
    /// LUN commands that change the medium get DATA PROTECT / WRITE
    /// PROTECTED; EXTENDED COPY can name only visible, writable LUNs.
    pub fn submit(
        &self,
        cmd: ScsiCommand,
        access: &dyn Fn(u64) -> LunAccess,
        done: ScsiCompletion,
    ) -> Submitted {
        let opcode = cmd.cdb.first().copied().unwrap_or(0xff);
        if opcode == 0xa0 {
            return Submitted::Done(self.report_luns(&cmd, access));
        }
        let Some(lu) = self.lun(cmd.lun).filter(|_| access(cmd.lun).visible) else {
            return Submitted::Done(crate::missing_lun::execute(&cmd.request()));
        };
        if access(cmd.lun).read_only {
            let changes_medium = crate::commands::lookup(&cmd.cdb).is_some_and(|d| {
                matches!(
                    d.op,
                    Op::Write
                        | Op::WriteVerify
                        | Op::WriteSame
                        | Op::Unmap
                        | Op::CompareAndWrite
                        | Op::OrWrite
                        | Op::WriteAtomic
                        | Op::Sanitize
                        | Op::ExtendedCopy
                )
            });
            if changes_medium {
                return Submitted::Done(lu.check(crate::sense::codes::WRITE_PROTECTED));
            }
        }
        if opcode != 0x83 && opcode != 0x84 {
            return lu.submit(cmd, done);
        }
        let def = match lu.precheck(&cmd.request()) {
            Ok(d) => d,
            Err(resp) => return Submitted::Done(resp),
        };
        if !matches!(def.op, Op::ExtendedCopy | Op::ReceiveCopyResults) {
            return lu.submit(cmd, done);
        }
        // Only the LUNs this initiator may see and write (the LIO
        // CVE-2020-28374 lesson: a copy must not reach any other).
        let reachable: Vec<Arc<LogicalUnit>> = self
            .luns
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                let a = access(*i as u64);
                a.visible && !a.read_only
            })
            .map(|(_, lu)| lu.clone())
            .collect();
        let copies = self.copies.clone();
        let lu = lu.clone();
        Submitted::Blocking(Box::new(move || {
            copy_command(&copies, &lu, def.op, &cmd, &reachable)
        }))
    }

    /// [`submit`](Self::submit) and wait for the response on this thread
    /// (running a blocking job here): for tools, tests and fuzzing.
    pub fn submit_and_wait(
        &self,
        cmd: ScsiCommand,
        access: &dyn Fn(u64) -> LunAccess,
    ) -> ScsiResponse {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let done: ScsiCompletion = Box::new(move |r| {
            let _ = tx.send(r);
        });
        match self.submit(cmd, access, done) {
            Submitted::Done(r) => r,
            Submitted::Blocking(job) => job(),
            Submitted::Pending => rx
                .recv()
                .expect("the engine completes every pending command"),
        }
    }

    /// REPORT LUNS: the target answers it, listing the visible LUNs.
    fn report_luns(&self, cmd: &ScsiCommand, access: &dyn Fn(u64) -> LunAccess) -> ScsiResponse {
        if let Some((byte, bit)) = crate::commands::lookup(&cmd.cdb)
            .and_then(|d| crate::commands::reserved_bits(d, &cmd.cdb))
        {
            return plain_check(Sense::invalid_cdb_field(byte, Some(bit)), self.lun(cmd.lun));
        }
        let all: Vec<u64> = (0..self.luns.len() as u64)
            .filter(|l| access(*l).visible)
            .collect();
        match report_luns(&cmd.cdb, &all) {
            Ok(data) => ScsiResponse {
                status: ScsiStatus::Good,
                sense: Vec::new(),
                data_in: data,
                data_out_len: None,
            },
            Err(s) => plain_check(s, self.lun(cmd.lun)),
        }
    }

    /// A new I_T nexus appeared (login): it gets a POWER ON OR RESET unit
    /// attention on every LU unless it is a reinstated nexus.
    pub fn nexus_added(&self, nexus: Nexus) {
        for lu in &self.luns {
            lu.nexus_added(nexus);
        }
    }

    /// Record the initiator port name of a nexus (for READ FULL STATUS).
    pub fn set_initiator_name(&self, nexus: Nexus, name: &str) {
        for lu in &self.luns {
            lu.set_initiator_name(nexus, name);
        }
    }

    /// An I_T nexus ended (logout or connection loss).
    pub fn nexus_lost(&self, nexus: Nexus) {
        for lu in &self.luns {
            lu.nexus_lost(nexus);
        }
    }

    /// A reset from task management on one LU (`Some(lun)`) or the whole
    /// target (`None`), requested by `by`.
    pub fn reset(&self, kind: ResetKind, lun: Option<u64>, _by: Nexus) {
        match lun {
            Some(l) => {
                if let Some(lu) = self.lun(l) {
                    lu.reset(kind);
                }
            }
            None => {
                for lu in &self.luns {
                    lu.reset(kind);
                }
            }
        }
    }

    /// The I_T nexuses whose tasks on `lun` a PREEMPT AND ABORT asked to
    /// abort (taken once).
    pub fn take_preempted(&self, lun: u64) -> Vec<Nexus> {
        self.lun(lun)
            .map(|lu| lu.take_preempted())
            .unwrap_or_default()
    }

    /// Tasks of `victim` on `lun` were cleared by another nexus `by`.
    pub fn tasks_cleared(&self, lun: u64, victim: Nexus, by: Nexus) {
        if victim != by {
            if let Some(lu) = self.lun(lun) {
                lu.tasks_cleared(victim);
            }
        }
    }
}

/// EXTENDED COPY or RECEIVE COPY RESULTS, checked already, run by the
/// copy manager over the LUNs the initiator may reach.
fn copy_command(
    copies: &CopyManager,
    lu: &LogicalUnit,
    op: Op,
    cmd: &ScsiCommand,
    reachable: &[Arc<LogicalUnit>],
) -> ScsiResponse {
    let ok = |data_in: Vec<u8>| ScsiResponse {
        status: ScsiStatus::Good,
        sense: Vec::new(),
        data_in,
        data_out_len: None,
    };
    let result = if op == Op::ExtendedCopy {
        copies
            .extended_copy(cmd.nexus, &cmd.cdb, &cmd.data_out, reachable)
            .map(|_| ok(Vec::new()))
    } else {
        copies.receive_copy_results(cmd.nexus, &cmd.cdb).map(ok)
    };
    let mut resp = result.unwrap_or_else(|s| lu.check(s));
    if op == Op::ExtendedCopy {
        let c = &cmd.cdb;
        resp.data_out_len = Some(u32::from_be_bytes([c[10], c[11], c[12], c[13]]) as usize);
    }
    resp
}

pub(crate) fn plain_check(s: Sense, lu: Option<&Arc<LogicalUnit>>) -> ScsiResponse {
    match lu {
        Some(lu) => lu.check(s),
        None => ScsiResponse {
            status: ScsiStatus::CheckCondition,
            sense: s.to_bytes(false),
            data_in: Vec::new(),
            data_out_len: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::disk::testing::*;
    use crate::sense::key;
    use crate::{LogicalUnit, ScsiTarget};

    fn report_luns(select: u8, alloc: u32) -> Vec<u8> {
        let a = alloc.to_be_bytes();
        vec![0xa0, 0, select, 0, 0, 0, a[0], a[1], a[2], a[3], 0, 0]
    }

    fn two_luns() -> ScsiTarget {
        let lu = |bs| {
            Arc::new(LogicalUnit::new(
                Arc::new(TestDevice::new(bs)),
                config(false, false),
            ))
        };
        ScsiTarget::new(vec![lu(512), lu(4096)])
    }

    #[test]
    fn report_luns_lists_every_lun() {
        let t = two_luns();
        for select in [0, 2] {
            let d = good(exec(&t, A, &report_luns(select, 1024), &[]));
            assert_eq!(d.len(), 24);
            assert_eq!(&d[..4], &16u32.to_be_bytes());
            assert_eq!(&d[8..16], &[0; 8]);
            assert_eq!(&d[16..24], &[0, 1, 0, 0, 0, 0, 0, 0]);
        }
        // Well-known LUNs only: none.
        assert_eq!(good(exec(&t, A, &report_luns(1, 1024), &[])), [0u8; 8]);
        // Truncated to the allocation length, but the length field is whole.
        assert_eq!(
            good(exec(&t, A, &report_luns(0, 16), &[]))[..4],
            16u32.to_be_bytes()
        );
        // From a LUN that does not exist, too, and without a unit attention.
        t.nexus_added(B);
        assert_eq!(
            good(exec_lun(&t, B, 9, &report_luns(0, 1024), &[])).len(),
            24
        );
        check(
            &exec(&t, B, &[0, 0, 0, 0, 0, 0], &[]),
            key::UNIT_ATTENTION,
            0x29,
            0,
        );
    }

    #[test]
    fn report_luns_bad_fields() {
        let t = two_luns();
        for alloc in [0, 15] {
            let r = exec(&t, A, &report_luns(0, alloc), &[]);
            check(&r, key::ILLEGAL_REQUEST, 0x24, 0);
            assert_eq!(field_pointer(&r), [0xc0, 0, 6]);
        }
        let r = exec(&t, A, &report_luns(3, 1024), &[]);
        check(&r, key::ILLEGAL_REQUEST, 0x24, 0);
        assert_eq!(field_pointer(&r), [0xc0, 0, 2]);
        check(
            &exec_lun(&t, A, 7, &report_luns(0xff, 1024), &[]),
            key::ILLEGAL_REQUEST,
            0x24,
            0,
        );
    }

    #[test]
    fn luns_are_independent() {
        let t = two_luns();
        for n in [A, B] {
            t.nexus_added(n);
            for lun in [0, 1] {
                exec_lun(&t, n, lun, &[0, 0, 0, 0, 0, 0], &[]);
            }
        }
        let d = good(exec_lun(&t, A, 1, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
        assert_eq!(d[4..8], 4096u32.to_be_bytes());
        good(exec_lun(&t, A, 1, &cdb10(0x2a, 0, 0, 1), &[9u8; 4096]));
        assert_eq!(
            good(exec_lun(&t, A, 0, &cdb10(0x28, 0, 0, 1), &[])),
            vec![0u8; 512]
        );
    }
}
