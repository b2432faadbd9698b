//! SAM-5 §4.6: the target device routes commands to logical units by LUN,
//! answers REPORT LUNS itself and speaks for LUNs that do not exist.

use std::sync::Arc;

use crate::commands::Op;
use crate::copy::CopyManager;
use crate::disk::LogicalUnit;
use crate::sense::Sense;
use crate::{Nexus, Prepared, ResetKind, ScsiRequest, ScsiResponse, ScsiStatus};

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
    copies: CopyManager,
}

impl ScsiTarget {
    /// Create a target whose LUN *i* is `luns[i]`.
    pub fn new(luns: Vec<Arc<LogicalUnit>>) -> Self {
        ScsiTarget {
            luns,
            copies: CopyManager::default(),
        }
    }

    /// The logical units, by LUN number.
    pub fn luns(&self) -> &[Arc<LogicalUnit>] {
        &self.luns
    }

    fn lun(&self, lun: u64) -> Option<&Arc<LogicalUnit>> {
        usize::try_from(lun).ok().and_then(|i| self.luns.get(i))
    }

    /// Execute a command only if that needs no waiting (see
    /// [`LogicalUnit::try_execute_nowait`]); `None`: use
    /// [`execute`](Self::execute) off the async workers.
    pub fn try_execute_nowait(&self, req: &ScsiRequest<'_>) -> Option<ScsiResponse> {
        self.try_execute_nowait_masked(req, None, None)
    }

    /// [`try_execute_nowait`](Self::try_execute_nowait) under a LUN mask (see
    /// [`execute_masked`](Self::execute_masked)); a masked LUN is left to it.
    pub fn try_execute_nowait_masked(
        &self,
        req: &ScsiRequest<'_>,
        mask: Option<&[bool]>,
        read_only: Option<&[bool]>,
    ) -> Option<ScsiResponse> {
        let i = usize::try_from(req.lun).ok()?;
        let hidden = mask.is_some_and(|m| !m.get(i).copied().unwrap_or(false));
        let ro = read_only.is_some_and(|m| m.get(i).copied().unwrap_or(false));
        if hidden || ro {
            return None;
        }
        self.lun(req.lun)?.try_execute_nowait(req)
    }

    /// Plan a READ or WRITE for a LUN with an asynchronous backend (see
    /// [`LogicalUnit::prepare_async`]) under a LUN mask; a masked or
    /// read-only LUN, and any other command, is left to
    /// [`execute_masked`](Self::execute_masked) ([`Prepared::Blocking`]).
    pub fn prepare_async_masked(
        &self,
        req: &ScsiRequest<'_>,
        mask: Option<&[bool]>,
        read_only: Option<&[bool]>,
    ) -> Prepared {
        let Some(i) = usize::try_from(req.lun).ok() else {
            return Prepared::Blocking;
        };
        let hidden = mask.is_some_and(|m| !m.get(i).copied().unwrap_or(false));
        let ro = read_only.is_some_and(|m| m.get(i).copied().unwrap_or(false));
        match self.lun(req.lun) {
            Some(lu) if !hidden && !ro => lu.prepare_async(req),
            _ => Prepared::Blocking,
        }
    }

    /// Execute one command (blocking). Handles REPORT LUNS, unknown LUNs
    /// (INQUIRY peripheral qualifier 011b, other commands LOGICAL UNIT NOT
    /// SUPPORTED), and hands everything else to the logical unit.
    pub fn execute(&self, req: &ScsiRequest<'_>) -> ScsiResponse {
        self.execute_masked(req, None, None)
    }

    /// [`execute`](Self::execute) for an initiator that sees only the LUNs
    /// whose entry in `mask` is true (LUN masking): REPORT LUNS lists only
    /// those, the others answer as if they did not exist, and EXTENDED COPY
    /// can name no other.
    /// LUNs whose entry in `read_only` is true are write-protected for this
    /// initiator: commands that change the medium get DATA PROTECT / WRITE
    /// PROTECTED, and EXTENDED COPY cannot use them.
    pub fn execute_masked(
        &self,
        req: &ScsiRequest<'_>,
        mask: Option<&[bool]>,
        read_only: Option<&[bool]>,
    ) -> ScsiResponse {
        let flag = |m: &[bool], l: u64| {
            usize::try_from(l)
                .ok()
                .and_then(|i| m.get(i))
                .copied()
                .unwrap_or(false)
        };
        let visible = |l: u64| mask.is_none_or(|m| flag(m, l));
        let writable = |l: u64| !read_only.is_some_and(|m| flag(m, l));
        let opcode = req.cdb.first().copied().unwrap_or(0xff);
        if opcode == 0xa0 {
            if let Some((byte, bit)) = crate::commands::lookup(req.cdb)
                .and_then(|d| crate::commands::reserved_bits(d, req.cdb))
            {
                return plain_check(Sense::invalid_cdb_field(byte, Some(bit)), self.lun(req.lun));
            }
            let all: Vec<u64> = (0..self.luns.len() as u64)
                .filter(|l| visible(*l))
                .collect();
            return match report_luns(req.cdb, &all) {
                Ok(data) => ScsiResponse {
                    status: ScsiStatus::Good,
                    sense: Vec::new(),
                    data_in: data,
                    data_out_len: None,
                },
                Err(s) => plain_check(s, self.lun(req.lun)),
            };
        }
        let Some(lu) = self.lun(req.lun).filter(|_| visible(req.lun)) else {
            return crate::missing_lun::execute(req);
        };
        if !writable(req.lun) {
            let changes_medium = crate::commands::lookup(req.cdb).is_some_and(|d| {
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
                return lu.check(crate::sense::codes::WRITE_PROTECTED);
            }
        }
        if opcode != 0x83 && opcode != 0x84 {
            return lu.execute(req);
        }
        let def = match lu.precheck(req) {
            Ok(d) => d,
            Err(resp) => return resp,
        };
        let ok = |data_in: Vec<u8>| ScsiResponse {
            status: ScsiStatus::Good,
            sense: Vec::new(),
            data_in,
            data_out_len: None,
        };
        let result = match def.op {
            // Only the LUNs this initiator may see (the LIO CVE-2020-28374
            // lesson: a copy must not reach any other).
            Op::ExtendedCopy => self
                .copies
                .extended_copy(
                    req.nexus,
                    req.cdb,
                    req.data_out,
                    &self
                        .luns
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| visible(*i as u64) && writable(*i as u64))
                        .map(|(_, lu)| lu.clone())
                        .collect::<Vec<_>>(),
                )
                .map(|_| ok(Vec::new())),
            Op::ReceiveCopyResults => self.copies.receive_copy_results(req.nexus, req.cdb).map(ok),
            _ => return lu.execute(req),
        };
        let mut resp = result.unwrap_or_else(|s| lu.check(s));
        if def.op == Op::ExtendedCopy {
            resp.data_out_len =
                Some(
                    u32::from_be_bytes([req.cdb[10], req.cdb[11], req.cdb[12], req.cdb[13]])
                        as usize,
                );
        }
        resp
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
