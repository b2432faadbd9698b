//! Reads whose Data-In is placed: where each transport registers a read's
//! buffer and gets it back ([`Out`]), and how the driver checks the
//! placed data and hands it to the connection as one Data-In.

use ethersan_endpoint::PlacedBuf;
use ethersan_proto::pdu::{Pdu, RawPdu};

use super::check::check_placed;
use super::stream::Reg;
use super::{Driver, Out};
use crate::Error;

impl<W> Out<W> {
    /// Have the Data-In of read `itt` placed into a buffer of `len`
    /// bytes.
    pub(super) fn register(&mut self, itt: u32, len: usize) {
        match self {
            // Not zeroed: every byte the read returns is one that landed.
            Out::Stream { regs, .. } => {
                let _ = regs.send(Reg::Expect(itt, PlacedBuf::new(len)));
            }
            Out::Messages { tx: Some(tx) } => tx.expect_len(itt, len),
            Out::Messages { tx: None } => {}
        }
    }

    /// The buffer of read `itt`, all its data landed.
    pub(super) fn release(&mut self, itt: u32) -> Option<PlacedBuf> {
        match self {
            Out::Stream { returned, .. } => returned.remove(&itt),
            Out::Messages { tx } => tx.as_ref()?.release(itt),
        }
    }

    /// Drop the buffer of read `itt`: data arriving for it later is
    /// dropped.
    pub(super) fn forget(&mut self, itt: u32) {
        match self {
            Out::Stream { regs, returned, .. } => {
                returned.remove(&itt);
                let _ = regs.send(Reg::Forget(itt));
            }
            Out::Messages { tx: Some(tx) } => tx.abort(itt),
            Out::Messages { tx: None } => {}
        }
    }
}

impl<W> Driver<W> {
    /// A placed Data-In header: note the range it announces; with status,
    /// the read's data is complete — take the buffer back and hand the
    /// connection one Data-In with all of it (and the status).
    pub(super) fn on_placed(&mut self, raw: RawPdu) -> Result<Option<RawPdu>, Error> {
        let Ok(Pdu::DataIn(d)) = Pdu::decode(&raw.bhs) else {
            return Err(Error::Protocol("a placed PDU that is not a Data-In".into()));
        };
        let len = raw.bhs.data_len();
        let Some(announced) = self.reads.get_mut(&d.itt) else {
            // A task this side no longer waits for (aborted): dropped.
            return Ok(None);
        };
        announced.push((d.buffer_offset, len));
        if !d.status_present {
            return Ok(None);
        }
        self.take_placed(d).map(Some)
    }

    /// Before a SCSI Response for a read whose data was placed: the
    /// Data-In (without status) that hands the connection that data.
    pub(super) fn placed_before(&mut self, raw: &RawPdu) -> Result<Option<RawPdu>, Error> {
        let b = &raw.bhs.0;
        let itt = u32::from_be_bytes([b[16], b[17], b[18], b[19]]);
        let opcode = b[0] & 0x3f;
        // A SCSI Response, or a Data-In with status whose data (if any)
        // came inline: the read ends with it. Data placed before it goes
        // first; with none, the registered buffer is not needed.
        let ends = opcode == 0x21 || (opcode == 0x25 && b[1] & 0x01 != 0);
        if !ends {
            return Ok(None);
        }
        if self.reads.get(&itt).is_none_or(|a| a.is_empty()) {
            // Answered without placed data.
            self.drop_registration(itt);
            return Ok(None);
        }
        let d = ethersan_proto::pdu::DataIn {
            final_bit: true,
            ack: false,
            overflow: false,
            underflow: false,
            status_present: false,
            status: 0,
            lun: 0,
            itt,
            ttt: ethersan_proto::pdu::RESERVED_TAG,
            stat_sn: 0,
            exp_cmd_sn: u32::from_be_bytes([b[28], b[29], b[30], b[31]]),
            max_cmd_sn: u32::from_be_bytes([b[32], b[33], b[34], b[35]]),
            data_sn: 0,
            buffer_offset: 0,
            residual: 0,
        };
        self.take_placed(d).map(Some)
    }

    /// Forget the buffers registered for reads the connection no longer
    /// has (they ended without their data): data arriving for them later
    /// is dropped.
    pub(super) fn drop_finished_registrations(&mut self) {
        let gone: Vec<u32> = self
            .reads
            .keys()
            .copied()
            .filter(|itt| !self.core.has_task(*itt))
            .collect();
        for itt in gone {
            self.drop_registration(itt);
        }
    }

    /// Forget the buffer registered for task `itt`, if any: data arriving
    /// for it later is dropped.
    pub(super) fn drop_registration(&mut self, itt: u32) {
        if self.reads.remove(&itt).is_some() {
            self.out.forget(itt);
        }
    }

    /// Take the read's buffer back, check that every byte the Data-In
    /// headers announced has landed, and make it one Data-In at offset 0
    /// (`d` gives the rest of its header).
    pub(super) fn take_placed(
        &mut self,
        mut d: ethersan_proto::pdu::DataIn,
    ) -> Result<RawPdu, Error> {
        let announced = self.reads.remove(&d.itt).unwrap_or_default();
        let placed = self.out.release(d.itt).ok_or_else(|| {
            Error::Protocol(format!("task {:#x}: no buffer for its placed data", d.itt))
        })?;
        let end = check_placed(d.itt, &announced, &placed)?;
        // The buffer was never zeroed: it is data only if all of it up to
        // the end of the data has landed (the announced ranges leave no
        // gap).
        if !placed.covers(end) {
            return Err(Error::Protocol(format!(
                "task {:#x}: the Data-In the target announced leaves a gap in 0..{end} (landed: {:?})",
                d.itt,
                placed.ranges()
            )));
        }
        let buf = placed.into_data(end as usize).ok_or_else(|| {
            Error::Protocol(format!(
                "task {:#x}: Data-In beyond the read's buffer",
                d.itt
            ))
        })?;
        self.placed
            .read
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        d.buffer_offset = 0;
        let bhs = Pdu::DataIn(d).encode(buf.len() as u32);
        Ok(RawPdu {
            bhs,
            ahs: Vec::new(),
            data: buf,
        })
    }
}
