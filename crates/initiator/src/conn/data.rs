//! The data of one command, initiator side (RFC 7143 §4.2.3–4.2.4,
//! §11.7–11.8): the Data-Out PDUs of one sequence (the unsolicited burst
//! or one R2T's), and Data-In placed into the caller's buffer.

use bytes::Bytes;
use ethersan_proto::pdu::{DataOut, Pdu};
use ethersan_proto::transfer::fill_at;

use super::Transmit;
use crate::Error;

/// One Data-Out sequence: the bytes `start..end` of `data` in PDUs of at
/// most `max_segment` bytes, DataSN from 0, F on the last. `ttt` is the
/// R2T's Target Transfer Tag, or `RESERVED_TAG` for unsolicited data.
/// The PDUs' data are slices of `data`: nothing is copied.
pub(super) struct DataOutSequence {
    data: Bytes,
    lun: u64,
    itt: u32,
    ttt: u32,
    exp_stat_sn: u32,
    next: usize,
    end: usize,
    max_segment: usize,
    data_sn: u32,
}

impl DataOutSequence {
    /// The sequence of `data[start..end]` (`end` clamped to the data).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        data: &Bytes,
        lun: u64,
        itt: u32,
        ttt: u32,
        exp_stat_sn: u32,
        start: usize,
        end: usize,
        max_segment: u32,
    ) -> Self {
        DataOutSequence {
            data: data.clone(),
            lun,
            itt,
            ttt,
            exp_stat_sn,
            next: start,
            end: end.min(data.len()),
            max_segment: (max_segment as usize).max(1),
            data_sn: 0,
        }
    }
}

impl Iterator for DataOutSequence {
    type Item = Transmit;

    fn next(&mut self) -> Option<Transmit> {
        if self.next >= self.end {
            return None;
        }
        let off = self.next;
        let n = (self.end - off).min(self.max_segment);
        let d = DataOut {
            final_bit: off + n == self.end,
            lun: self.lun,
            itt: self.itt,
            ttt: self.ttt,
            exp_stat_sn: self.exp_stat_sn,
            data_sn: self.data_sn,
            buffer_offset: off as u32,
        };
        self.data_sn += 1;
        self.next = off + n;
        Some(Transmit {
            bhs: Pdu::DataOut(d).encode(n as u32),
            ahs: Vec::new(),
            data: self.data.slice(off..off + n),
        })
    }
}

/// A read's Data-In, placed into the caller's buffer as it arrives.
///
/// The buffer is never zeroed: room for the expected length is reserved
/// (capacity, not length) on the first Data-In, and in-order data is
/// appended. Only a gap left by data arriving ahead of its turn is
/// zero-filled, and overwritten when its data comes.
#[derive(Debug)]
pub(super) struct ReadBuffer {
    buf: Vec<u8>,
    expected: usize,
}

impl ReadBuffer {
    /// A read of at most `expected` bytes into `buf` (its contents are
    /// dropped, its capacity kept).
    pub(super) fn new(mut buf: Vec<u8>, expected: u32) -> Self {
        buf.clear();
        ReadBuffer {
            buf,
            expected: expected as usize,
        }
    }

    /// Data-In at `offset`. Data that would end past the expected length
    /// is a protocol error. A PDU that carries the whole read into a
    /// buffer with no capacity of its own becomes the buffer (no copy).
    pub(super) fn place(&mut self, offset: u32, data: Vec<u8>) -> Result<(), Error> {
        let off = offset as usize;
        let end = off + data.len();
        if end > self.expected {
            return Err(Error::Protocol(format!(
                "Data-In beyond the buffer ({end} > {})",
                self.expected
            )));
        }
        if self.buf.capacity() < self.expected {
            if off == 0 && self.buf.is_empty() && data.len() == self.expected {
                self.buf = data;
                return Ok(());
            }
            self.buf.reserve_exact(self.expected - self.buf.len());
        }
        fill_at(&mut self.buf, off, &data);
        Ok(())
    }

    /// The data received, `residual` bytes short of the expected length
    /// when the target reported an underflow.
    pub(super) fn finish(mut self, underflow: bool, residual: u32) -> Vec<u8> {
        if underflow {
            let keep = self.expected.saturating_sub(residual as usize);
            self.buf.truncate(keep);
        }
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethersan_proto::pdu::RESERVED_TAG;

    #[test]
    fn a_sequence_is_cut_at_the_segment_limit_and_copies_nothing() {
        let data = Bytes::from(vec![7u8; 10_000]);
        let pdus: Vec<_> =
            DataOutSequence::new(&data, 0, 5, RESERVED_TAG, 9, 1000, 10_000, 4096).collect();
        let lens: Vec<_> = pdus.iter().map(|t| t.data.len()).collect();
        assert_eq!(lens, [4096, 4096, 808]);
        for (i, t) in pdus.iter().enumerate() {
            let Ok(Pdu::DataOut(d)) = Pdu::decode(&t.bhs) else {
                panic!("not a Data-Out")
            };
            assert_eq!(d.data_sn, i as u32);
            assert_eq!(d.buffer_offset, 1000 + 4096 * i as u32);
            assert_eq!(d.final_bit, i == 2);
            assert_eq!(d.exp_stat_sn, 9);
            // A slice of the caller's buffer.
            assert_eq!(t.data.as_ptr(), data[d.buffer_offset as usize..].as_ptr());
        }
    }

    #[test]
    fn data_in_fills_the_buffer_in_order_without_zeroing() {
        let caller = Vec::with_capacity(64);
        let ptr = caller.as_ptr();
        let mut r = ReadBuffer::new(caller, 12);
        r.place(0, vec![1, 2, 3, 4]).unwrap();
        r.place(4, vec![5, 6]).unwrap();
        // Ahead of its turn: the gap reads as zeros until its data comes.
        r.place(10, vec![9, 9]).unwrap();
        assert_eq!(r.buf, [1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 9, 9]);
        r.place(6, vec![7, 7, 7, 7]).unwrap();
        assert!(r.place(10, vec![1, 2, 3]).is_err(), "past the end");
        let out = r.finish(false, 0);
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 7, 7, 7, 9, 9]);
        assert_eq!(out.as_ptr(), ptr, "the caller's own buffer");
    }

    #[test]
    fn one_pdu_with_the_whole_read_becomes_the_buffer() {
        let data = vec![3u8; 512];
        let ptr = data.as_ptr();
        let mut r = ReadBuffer::new(Vec::new(), 512);
        r.place(0, data).unwrap();
        let out = r.finish(false, 0);
        assert_eq!(out.as_ptr(), ptr);
        // Underflow: the residual is cut off.
        let mut r = ReadBuffer::new(Vec::new(), 512);
        r.place(0, vec![1; 100]).unwrap();
        assert_eq!(r.buf.capacity(), 512, "reserved once");
        assert_eq!(r.finish(true, 412).len(), 100);
    }
}
