//! RFC 7143 §4.2.3–4.2.4 and §11.7–11.9: data transfer bookkeeping for one
//! command, target side.
//!
//! [`WriteTransfer`] tracks the Data-Out of a write: immediate data,
//! unsolicited data up to FirstBurstLength, and solicited data in R2T
//! bursts of at most MaxBurstLength with at most MaxOutstandingR2T in
//! flight; it checks DataSN, offsets and Target Transfer Tags.
//! [`data_in_segments`] plans the Data-In PDUs of a read.

/// Negotiated values that govern a write's data transfer.
#[derive(Debug, Clone, Copy)]
pub struct TransferLimits {
    /// InitialR2T: when true, no unsolicited Data-Out PDUs are allowed.
    pub initial_r2t: bool,
    /// FirstBurstLength: bytes of unsolicited data (immediate included).
    pub first_burst_length: u32,
    /// MaxBurstLength: bytes per solicited sequence (one R2T).
    pub max_burst_length: u32,
    /// MaxOutstandingR2T per task.
    pub max_outstanding_r2t: u32,
}

/// A Data-Out PDU that breaks the rules (§4.2.3, §11.7).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataOutError {
    /// The Target Transfer Tag names no outstanding R2T of this task.
    #[error("Data-Out with unknown target transfer tag {0:#x}")]
    UnknownTtt(u32),
    /// DataSN out of sequence.
    #[error("Data-Out DataSN {got}, expected {expected}")]
    DataSn {
        /// The DataSN that should have come next.
        expected: u32,
        /// The DataSN received.
        got: u32,
    },
    /// The data lies outside the range the R2T (or the unsolicited burst) allows.
    #[error("Data-Out at offset {offset} length {len} outside the allowed range")]
    OutOfRange {
        /// Buffer Offset of the PDU.
        offset: u32,
        /// Its data length.
        len: u32,
    },
    /// Unsolicited data after the unsolicited burst ended or was not allowed.
    #[error("unsolicited Data-Out not allowed here")]
    Unsolicited,
}

/// One R2T the target should send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2tRequest {
    /// Target Transfer Tag chosen for it.
    pub ttt: u32,
    /// R2TSN
    pub r2t_sn: u32,
    /// Buffer Offset
    pub offset: u32,
    /// Desired Data Transfer Length
    pub len: u32,
}

#[derive(Debug, Clone)]
struct ActiveR2t {
    req: R2tRequest,
    received: u32,
    next_data_sn: u32,
}

/// The Data-Out state of one write command.
#[derive(Debug, Clone)]
pub struct WriteTransfer {
    edtl: u32,
    limits: TransferLimits,
    received: u64,
    /// End (exclusive) of the unsolicited region.
    unsol_end: u32,
    /// Unsolicited bytes seen so far (immediate included).
    unsol_received: u32,
    /// Whether more unsolicited Data-Out may still arrive.
    unsol_open: bool,
    unsol_next_data_sn: u32,
    next_solicit: u32,
    next_r2t_sn: u32,
    active: Vec<ActiveR2t>,
}

impl WriteTransfer {
    /// Start tracking a write of `edtl` bytes whose command PDU carried
    /// `immediate_len` bytes of immediate data and had the F bit `final_bit`
    /// (F = no unsolicited Data-Out follows).
    pub fn new(edtl: u32, immediate_len: u32, final_bit: bool, limits: TransferLimits) -> Self {
        let unsol_end = if limits.initial_r2t || final_bit {
            immediate_len.min(edtl)
        } else {
            limits
                .first_burst_length
                .min(edtl)
                .max(immediate_len.min(edtl))
        };
        WriteTransfer {
            edtl,
            limits,
            received: u64::from(immediate_len.min(edtl)),
            unsol_end,
            unsol_received: immediate_len.min(edtl),
            unsol_open: !final_bit && !limits.initial_r2t && immediate_len < unsol_end,
            unsol_next_data_sn: 0,
            next_solicit: unsol_end,
            next_r2t_sn: 0,
            active: Vec::new(),
        }
    }

    /// Expected Data Transfer Length.
    pub fn edtl(&self) -> u32 {
        self.edtl
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Every byte of the transfer has arrived.
    pub fn is_complete(&self) -> bool {
        self.received >= u64::from(self.edtl) && self.active.is_empty() && !self.unsol_open
    }

    /// Next R2TSN (what a SCSI Response's ExpDataSN reports for a write).
    pub fn r2t_count(&self) -> u32 {
        self.next_r2t_sn
    }

    /// Validate a Data-Out PDU. On `Ok` the caller copies the data to
    /// `offset` in its buffer.
    pub fn on_data_out(
        &mut self,
        ttt: u32,
        data_sn: u32,
        offset: u32,
        len: u32,
        final_bit: bool,
    ) -> Result<(), DataOutError> {
        let end = offset
            .checked_add(len)
            .ok_or(DataOutError::OutOfRange { offset, len })?;
        if ttt == crate::pdu::RESERVED_TAG {
            if !self.unsol_open {
                return Err(DataOutError::Unsolicited);
            }
            if data_sn != self.unsol_next_data_sn {
                return Err(DataOutError::DataSn {
                    expected: self.unsol_next_data_sn,
                    got: data_sn,
                });
            }
            if offset != self.unsol_received || end > self.unsol_end {
                return Err(DataOutError::OutOfRange { offset, len });
            }
            self.unsol_next_data_sn = self.unsol_next_data_sn.wrapping_add(1);
            self.unsol_received = end;
            self.received += u64::from(len);
            if final_bit || end == self.unsol_end {
                self.unsol_open = false;
            }
            return Ok(());
        }
        let idx = self
            .active
            .iter()
            .position(|a| a.req.ttt == ttt)
            .ok_or(DataOutError::UnknownTtt(ttt))?;
        let a = &mut self.active[idx];
        if data_sn != a.next_data_sn {
            return Err(DataOutError::DataSn {
                expected: a.next_data_sn,
                got: data_sn,
            });
        }
        if offset != a.req.offset + a.received || end > a.req.offset + a.req.len {
            return Err(DataOutError::OutOfRange { offset, len });
        }
        a.next_data_sn = a.next_data_sn.wrapping_add(1);
        a.received += len;
        self.received += u64::from(len);
        if a.received == a.req.len {
            self.active.swap_remove(idx);
        } else if final_bit {
            // The sequence ended short of what the R2T asked for.
            return Err(DataOutError::OutOfRange { offset, len });
        }
        Ok(())
    }

    /// R2Ts to send now, up to MaxOutstandingR2T in flight; `next_ttt`
    /// supplies a fresh Target Transfer Tag for each.
    pub fn next_r2ts(&mut self, mut next_ttt: impl FnMut() -> u32) -> Vec<R2tRequest> {
        let mut out = Vec::new();
        while self.next_solicit < self.edtl
            && (self.active.len() as u32) < self.limits.max_outstanding_r2t.max(1)
        {
            let len = (self.edtl - self.next_solicit).min(self.limits.max_burst_length.max(512));
            let req = R2tRequest {
                ttt: next_ttt(),
                r2t_sn: self.next_r2t_sn,
                offset: self.next_solicit,
                len,
            };
            self.next_r2t_sn = self.next_r2t_sn.wrapping_add(1);
            self.next_solicit += len;
            self.active.push(ActiveR2t {
                req,
                received: 0,
                next_data_sn: 0,
            });
            out.push(req);
        }
        out
    }
}

/// One Data-In PDU of a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataInSegment {
    /// Buffer Offset.
    pub offset: u32,
    /// Bytes in this PDU.
    pub len: u32,
    /// DataSN.
    pub data_sn: u32,
    /// F bit: last PDU of a sequence (MaxBurstLength) or of the command.
    pub final_bit: bool,
    /// Last PDU of the command (carries status when phase-collapsed).
    pub last: bool,
}

/// Plan the Data-In PDUs for `len` bytes: each at most `max_pdu` bytes (the
/// initiator's MaxRecvDataSegmentLength), sequences of at most `max_burst`.
pub fn data_in_segments(
    len: u32,
    max_pdu: u32,
    max_burst: u32,
) -> impl Iterator<Item = DataInSegment> {
    let max_pdu = max_pdu.max(512);
    let max_burst = max_burst.max(max_pdu);
    let mut offset = 0u32;
    let mut in_burst = 0u32;
    let mut data_sn = 0u32;
    std::iter::from_fn(move || {
        if offset >= len {
            return None;
        }
        let n = (len - offset).min(max_pdu).min(max_burst - in_burst);
        let seg_off = offset;
        offset += n;
        in_burst += n;
        let last = offset >= len;
        let final_bit = last || in_burst == max_burst;
        if final_bit {
            in_burst = 0;
        }
        let sn = data_sn;
        data_sn += 1;
        Some(DataInSegment {
            offset: seg_off,
            len: n,
            data_sn: sn,
            final_bit,
            last,
        })
    })
}

/// Put `data` at byte `off` of a data buffer whose length is the prefix
/// filled so far — a write's Data-Out on the target, a read's Data-In on
/// the initiator: data in order (what DataSequenceInOrder and
/// DataPDUInOrder promise) is appended into the reserved capacity, never
/// zeroed first; data before the end overwrites what is there; a gap left
/// by data out of order reads as zeros until its own data arrives.
pub fn fill_at(buf: &mut Vec<u8>, off: usize, data: &[u8]) {
    if off > buf.len() {
        buf.resize(off, 0);
    }
    let overlap = (buf.len() - off).min(data.len());
    buf[off..off + overlap].copy_from_slice(&data[..overlap]);
    buf.extend_from_slice(&data[overlap..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::RESERVED_TAG;

    fn limits(initial_r2t: bool) -> TransferLimits {
        TransferLimits {
            initial_r2t,
            first_burst_length: 8192,
            max_burst_length: 16384,
            max_outstanding_r2t: 2,
        }
    }

    #[test]
    fn immediate_only() {
        let t = WriteTransfer::new(4096, 4096, true, limits(false));
        assert!(t.is_complete());
    }

    #[test]
    fn unsolicited_then_solicited() {
        let mut t = WriteTransfer::new(65536, 4096, false, limits(false));
        let mut tag = 100;
        let r2ts = t.next_r2ts(|| {
            tag += 1;
            tag
        });
        // Unsolicited region is the first 8192 bytes; two R2Ts of 16 KiB after it.
        assert_eq!(r2ts.len(), 2);
        assert_eq!(
            r2ts[0],
            R2tRequest {
                ttt: 101,
                r2t_sn: 0,
                offset: 8192,
                len: 16384
            }
        );
        assert_eq!(r2ts[1].offset, 8192 + 16384);
        t.on_data_out(RESERVED_TAG, 0, 4096, 4096, true).unwrap();
        assert!(t.on_data_out(RESERVED_TAG, 1, 8192, 4096, true).is_err());
        for (i, off) in (8192..8192 + 16384).step_by(8192).enumerate() {
            t.on_data_out(101, i as u32, off, 8192, off + 8192 == 8192 + 16384)
                .unwrap();
        }
        let more = t.next_r2ts(|| 200);
        assert_eq!(more.len(), 1);
        assert_eq!(more[0].r2t_sn, 2);
        t.on_data_out(102, 0, 8192 + 16384, 16384, true).unwrap();
        assert!(!t.is_complete());
        let last = t.next_r2ts(|| 201);
        assert_eq!(
            last,
            vec![R2tRequest {
                ttt: 201,
                r2t_sn: 3,
                offset: 57344,
                len: 8192
            }]
        );
        assert_eq!(t.next_r2ts(|| 202), vec![]);
        t.on_data_out(200, 0, 8192 + 32768, 16384, true).unwrap();
        assert!(!t.is_complete());
        t.on_data_out(201, 0, 57344, 8192, true).unwrap();
        assert!(t.is_complete());
    }

    #[test]
    fn datasn_errors() {
        let mut t = WriteTransfer::new(8192, 0, true, limits(true));
        let r = t.next_r2ts(|| 7);
        assert_eq!(r.len(), 1);
        assert_eq!(
            t.on_data_out(7, 1, 0, 4096, false),
            Err(DataOutError::DataSn {
                expected: 0,
                got: 1
            })
        );
        t.on_data_out(7, 0, 0, 4096, false).unwrap();
        assert_eq!(
            t.on_data_out(7, 0, 4096, 4096, true),
            Err(DataOutError::DataSn {
                expected: 1,
                got: 0
            })
        );
        assert_eq!(
            t.on_data_out(9, 1, 4096, 4096, true),
            Err(DataOutError::UnknownTtt(9))
        );
        assert!(t.on_data_out(RESERVED_TAG, 0, 0, 512, true).is_err());
        t.on_data_out(7, 1, 4096, 4096, true).unwrap();
        assert!(t.is_complete());
    }

    #[test]
    fn data_in_plan() {
        let segs: Vec<_> = data_in_segments(20000, 8192, 16384).collect();
        assert_eq!(segs.len(), 3);
        assert_eq!(
            (segs[0].offset, segs[0].len, segs[0].final_bit),
            (0, 8192, false)
        );
        assert_eq!(
            (segs[1].offset, segs[1].len, segs[1].final_bit),
            (8192, 8192, true)
        );
        assert_eq!(
            (segs[2].offset, segs[2].len, segs[2].final_bit, segs[2].last),
            (16384, 3616, true, true)
        );
        assert_eq!(data_in_segments(0, 8192, 8192).count(), 0);
    }
}
