//! NVMe/TCP Transport Specification (TP 8000) §7.4.9 (R2T) and §7.4.8.1
//! (H2CData): the host-to-controller data of the writes in flight on one
//! queue, target side. R2Ts are planned in pieces of at most the
//! target's R2T length with at most MAXR2T+1 outstanding per command;
//! H2CData PDUs are checked against the R2T their TTAG names.

use std::collections::HashMap;

use crate::pdu::{H2cData, PduError, R2t};

/// The data of one write still to arrive.
#[derive(Debug, Clone)]
struct Write {
    len: u32,
    /// Offset up to which R2Ts were sent.
    requested: u32,
    /// Bytes received.
    received: u32,
    /// R2Ts sent and not yet fully answered.
    outstanding: u32,
    /// A data digest failed: keep reading the data, do not place it.
    failed: bool,
}

/// One R2T sent and not yet fully answered.
#[derive(Debug, Clone, Copy)]
struct ActiveR2t {
    cid: u16,
    end: u32,
    /// Offset the next H2CData must start at.
    next: u32,
    start: u32,
}

/// Where an accepted H2CData PDU leaves its command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Accepted {
    /// Place the data (false once a data digest failed for the command).
    pub(crate) place: bool,
    /// The command's data is all in: `Some(ok)`, `ok` false if a digest failed.
    pub(crate) done: Option<bool>,
}

/// Writes waiting for data and their outstanding R2Ts.
#[derive(Debug, Default)]
pub(crate) struct Transfers {
    writes: HashMap<u16, Write>,
    r2ts: HashMap<u16, ActiveR2t>,
    next_ttag: u16,
}

impl Transfers {
    /// Starts a write of `len` bytes for command `cid`; appends the R2Ts
    /// to send to `r2ts`.
    pub(crate) fn start(
        &mut self,
        cid: u16,
        len: u32,
        max_r2t: u32,
        r2t_len: u32,
        r2ts: &mut Vec<R2t>,
    ) {
        self.writes.insert(
            cid,
            Write {
                len,
                requested: 0,
                received: 0,
                outstanding: 0,
                failed: false,
            },
        );
        self.solicit(cid, max_r2t, r2t_len, r2ts);
    }

    /// Whether command `cid` has a write waiting for data.
    pub(crate) fn contains(&self, cid: u16) -> bool {
        self.writes.contains_key(&cid)
    }

    /// Forgets command `cid` and its R2Ts.
    pub(crate) fn remove(&mut self, cid: u16) {
        self.writes.remove(&cid);
        self.r2ts.retain(|_, r| r.cid != cid);
    }

    fn free_ttag(&mut self) -> u16 {
        // At most 65536 tags; a queue never has that many R2Ts out
        // (commands ≤ 65536, R2Ts per command bounded), but stay total.
        for _ in 0..=u16::MAX as u32 {
            let t = self.next_ttag;
            self.next_ttag = self.next_ttag.wrapping_add(1);
            if !self.r2ts.contains_key(&t) {
                return t;
            }
        }
        self.next_ttag
    }

    /// Sends as many R2Ts for `cid` as the limits allow.
    fn solicit(&mut self, cid: u16, max_r2t: u32, r2t_len: u32, out: &mut Vec<R2t>) {
        let r2t_len = r2t_len.max(1);
        loop {
            let Some(w) = self.writes.get(&cid) else {
                return;
            };
            if w.requested >= w.len || w.outstanding >= max_r2t {
                return;
            }
            let start = w.requested;
            let len = (w.len - start).min(r2t_len);
            let ttag = self.free_ttag();
            if let Some(w) = self.writes.get_mut(&cid) {
                w.requested += len;
                w.outstanding += 1;
            }
            self.r2ts.insert(
                ttag,
                ActiveR2t {
                    cid,
                    start,
                    end: start + len,
                    next: start,
                },
            );
            out.push(R2t {
                cccid: cid,
                ttag,
                r2to: start,
                r2tl: len,
            });
        }
    }

    /// Checks an H2CData PDU of `len` bytes (data digest `digest_ok`);
    /// appends the next R2Ts to `r2ts` when one completes.
    pub(crate) fn accept(
        &mut self,
        d: &H2cData,
        len: u32,
        digest_ok: bool,
        limits: (u32, u32),
        r2ts: &mut Vec<R2t>,
    ) -> Result<Accepted, PduError> {
        let r = *self.r2ts.get(&d.ttag).ok_or(PduError::InvalidHeaderField {
            offset: 10,
            what: "TTAG names no outstanding R2T",
        })?;
        if r.cid != d.cccid {
            return Err(PduError::InvalidHeaderField {
                offset: 8,
                what: "CCCID differs from the R2T's",
            });
        }
        let end = u64::from(d.datao) + u64::from(len);
        if d.datao < r.start || end > u64::from(r.end) {
            return Err(PduError::DataOutOfRange {
                offset: d.datao,
                len,
            });
        }
        if d.datao != r.next {
            return Err(PduError::Sequence("H2CData out of order or overlapping"));
        }
        let end = end as u32;
        if d.last != (end == r.end) {
            return Err(PduError::Sequence("LAST_PDU not on the R2T's last H2CData"));
        }
        let w = self
            .writes
            .get_mut(&r.cid)
            .ok_or(PduError::Sequence("H2CData for a finished command"))?;
        w.received += len;
        w.failed |= !digest_ok;
        let place = !w.failed;
        if end < r.end {
            if let Some(a) = self.r2ts.get_mut(&d.ttag) {
                a.next = end;
            }
            return Ok(Accepted { place, done: None });
        }
        self.r2ts.remove(&d.ttag);
        w.outstanding -= 1;
        if w.received >= w.len {
            let ok = !w.failed;
            self.writes.remove(&r.cid);
            return Ok(Accepted {
                place,
                done: Some(ok),
            });
        }
        self.solicit(r.cid, limits.0, limits.1, r2ts);
        Ok(Accepted { place, done: None })
    }
}
