//! A large WRITE its unit writes as the Data-Out arrives (cut-through):
//! each piece goes to the device when it is full, whatever order the
//! Data-Out of several R2Ts comes in; the SCSI Response follows the last
//! Data-Out, also when the command failed before it.

use std::sync::{Arc, Mutex};

use ethersan_backend::ram::RamDevice;
use ethersan_backend::{
    BackendError, BlockDevice, BlockDeviceExt, IoCompletion, IoRequest, Submission,
};
use ethersan_proto::pdu::{self, Pdu, TaskAttr, TmfFunction};

use super::{target_over, write10, Event, Harness};

const PIECE: u64 = 256 << 10;

/// A write on the device: offset, data, length, FUA, completion.
type HeldWrite = (u64, ethersan_scsi::IoBuf, usize, bool, IoCompletion);

/// RAM whose writes wait until the test completes them, on an engine that
/// splits writes (as io_uring on an `O_DIRECT` store does).
struct HeldWrites {
    ram: RamDevice,
    pending: Mutex<Vec<HeldWrite>>,
    /// Every write submitted: offset, length, FUA.
    submitted: Mutex<Vec<(u64, usize, bool)>>,
}

impl std::fmt::Debug for HeldWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeldWrites")
    }
}

impl BlockDevice for HeldWrites {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        self.ram.num_blocks()
    }
    fn submit(&self, req: IoRequest, done: IoCompletion) -> Submission {
        match req {
            IoRequest::Write {
                offset,
                data,
                len,
                fua,
            } => {
                self.submitted.lock().unwrap().push((offset, len, fua));
                self.pending
                    .lock()
                    .unwrap()
                    .push((offset, data, len, fua, done));
                Submission::Pending
            }
            other => Submission::Done(ethersan_backend::submit_and_wait(&self.ram, other)),
        }
    }
    fn splits_writes(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        "held writes".into()
    }
}

impl HeldWrites {
    /// Complete the held write at `offset` (with an error when `fail`).
    fn complete(&self, offset: u64, fail: bool) {
        let (off, data, len, fua, done) = {
            let mut p = self.pending.lock().unwrap();
            let i = p
                .iter()
                .position(|(o, ..)| *o == offset)
                .expect("held write");
            p.remove(i)
        };
        if fail {
            let cause = std::io::Error::from_raw_os_error(5);
            done(Err(BackendError::Write { offset: off, cause }));
        } else {
            self.ram.write_at(off, &data[..len], fua).unwrap();
            done(Ok(Default::default()));
        }
    }

    /// Offsets of the writes on the device, sorted.
    fn held(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.pending.lock().unwrap().iter().map(|w| w.0).collect();
        v.sort_unstable();
        v
    }
}

/// A session over [`HeldWrites`] that keeps up to four R2Ts outstanding.
fn harness() -> (Harness, Arc<HeldWrites>) {
    let dev = Arc::new(HeldWrites {
        ram: RamDevice::new(8 << 20, 512).unwrap(),
        pending: Mutex::new(Vec::new()),
        submitted: Mutex::new(Vec::new()),
    });
    let mut h = Harness::over(target_over(dev.clone()), 128 << 20, false);
    h.s.setup.params.max_outstanding_r2t = 4;
    h.later = Some(Arc::new(Mutex::new(Vec::new())));
    (h, dev)
}

impl Harness {
    /// Feed the session the outcomes the device's completions produced.
    fn run_completions(&mut self) {
        let evs = std::mem::take(&mut *self.later.as_ref().unwrap().lock().unwrap());
        for ev in evs {
            self.event(ev);
        }
    }

    fn responses(&self, itt: u32) -> usize {
        self.sent
            .iter()
            .filter(|(p, _)| matches!(p, Pdu::ScsiResponse(r) if r.itt == itt))
            .count()
    }

    /// Send an ABORT TASK for `referenced` (its response may wait).
    fn abort_task(&mut self, itt: u32, referenced: u32) {
        let t = pdu::TaskMgmtRequest {
            immediate: true,
            function: TmfFunction::AbortTask,
            lun: pdu::lun_to_wire(0),
            itt,
            referenced_task_tag: referenced,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            ref_cmd_sn: 0,
            exp_data_sn: 0,
        };
        self.pdu(Pdu::TaskMgmtRequest(t), &[]);
    }
}

/// 1 MiB at block 0 with 8 KiB of immediate data: four R2Ts at once, each
/// one's range straddling a piece boundary.
fn start_write(h: &mut Harness, itt: u32, lba: u32) -> Vec<pdu::R2t> {
    h.command(
        itt,
        &write10(lba, 2048),
        &[9; 8192],
        1 << 20,
        true,
        TaskAttr::Simple,
    );
    let r2ts = h.r2ts();
    assert_eq!(r2ts.len(), 4, "four R2Ts outstanding");
    r2ts
}

#[test]
fn data_out_of_later_r2ts_first_is_written_right_and_answered_once_at_the_end() {
    let (mut h, dev) = harness();
    let r2ts = start_write(&mut h, 5, 0);
    // The last R2T's data first: piece 3 lacks its first 8 KiB.
    h.answer(&r2ts[3], 4);
    assert!(dev.held().is_empty());
    // The second: pieces 1 and 2 lack their first 8 KiB.
    h.answer(&r2ts[1], 2);
    assert!(dev.held().is_empty());
    // The first completes pieces 0 and 1; the third pieces 2 and 3.
    h.answer(&r2ts[0], 1);
    assert_eq!(dev.held(), vec![0, PIECE]);
    dev.complete(PIECE, false);
    h.run_completions();
    h.answer(&r2ts[2], 3);
    assert_eq!(dev.held(), vec![0, 2 * PIECE, 3 * PIECE]);
    assert_eq!(h.responses(5), 0, "pieces still on the device");
    for o in [3 * PIECE, 0, 2 * PIECE] {
        dev.complete(o, false);
        h.run_completions();
    }
    assert_eq!(h.responses(5), 1);
    let r = h.response(5);
    assert_eq!((r.status, r.exp_data_sn, r.residual), (0, 4, 0));
    // Each piece written once, at its offset, not FUA.
    let mut w = dev.submitted.lock().unwrap().clone();
    w.sort_unstable();
    let want: Vec<_> = (0..4).map(|i| (i * PIECE, PIECE as usize, false)).collect();
    assert_eq!(w, want);
    let mut got = vec![0; 1 << 20];
    dev.ram.read_at(0, &mut got).unwrap();
    let mut expect = vec![9u8; 8192];
    for (i, r) in r2ts.iter().enumerate() {
        expect.resize(expect.len() + r.desired_len as usize, i as u8 + 1);
    }
    assert!(got == expect, "the bytes where they belong");
    assert_eq!(h.s.budget.reserved(), 0, "the buffer's budget is back");
}

#[test]
fn an_abort_mid_transfer_waits_for_the_piece_in_flight_and_writes_no_more() {
    let (mut h, dev) = harness();
    let r2ts = start_write(&mut h, 6, 0);
    h.answer(&r2ts[0], 1);
    assert_eq!(dev.held(), vec![0]);
    h.abort_task(0x60, 6);
    let tmf_done = |h: &Harness| {
        h.sent
            .iter()
            .any(|(p, _)| matches!(p, Pdu::TaskMgmtResponse(r) if r.itt == 0x60 && r.response == 0))
    };
    assert!(!tmf_done(&h), "the piece in flight is waited for");
    // The initiator's Data-Out still on the way: dropped.
    h.answer(&r2ts[1], 2);
    h.answer(&r2ts[2], 3);
    assert_eq!(dev.held(), vec![0], "no piece after the abort");
    dev.complete(0, false);
    h.run_completions();
    assert!(
        tmf_done(&h),
        "FUNCTION COMPLETE once the piece is done: {:?}",
        h.sent
    );
    assert_eq!(h.responses(6), 0, "no response for an aborted task");
    assert_eq!(dev.submitted.lock().unwrap().len(), 1);
    assert_eq!(h.s.budget.reserved(), 0, "the budget back, once");
    // The session goes on: the ITT is free, a new write runs.
    h.sent.clear();
    let r2ts = start_write(&mut h, 6, 4096);
    for r in &r2ts {
        h.answer(r, 7);
    }
    while !dev.held().is_empty() {
        for o in dev.held() {
            dev.complete(o, false);
        }
    }
    h.run_completions();
    assert_eq!(h.response(6).status, 0);
    assert_eq!(h.s.budget.reserved(), 0);
}

#[test]
fn the_response_waits_for_the_last_data_out_even_when_the_unit_failed_early() {
    // A check that fails at once (past the end of the 8 MiB LUN).
    let (mut h, dev) = harness();
    let r2ts = start_write(&mut h, 7, (8 << 20) / 512 - 1024);
    for r in &r2ts[..3] {
        h.answer(r, 1);
    }
    assert_eq!(h.responses(7), 0, "data still owed");
    h.answer(&r2ts[3], 1);
    let r = h.response(7);
    assert_eq!(r.status, 2);
    assert!(dev.submitted.lock().unwrap().is_empty(), "nothing written");
    assert_eq!(h.s.budget.reserved(), 0);

    // A piece that fails on the device: nothing more is written, and the
    // one CHECK CONDITION follows the last Data-Out.
    let (mut h, dev) = harness();
    let r2ts = start_write(&mut h, 8, 0);
    h.answer(&r2ts[0], 1);
    dev.complete(0, true);
    h.run_completions();
    h.answer(&r2ts[1], 1);
    h.answer(&r2ts[2], 1);
    assert!(dev.held().is_empty(), "no piece after the failure");
    h.run_completions();
    assert_eq!(h.responses(8), 0, "data still owed");
    h.answer(&r2ts[3], 1);
    // The unit answers as the transfer ends (here, on this thread).
    h.run_completions();
    let r = h.response(8);
    assert_eq!(r.status, 2);
    assert_eq!(h.responses(8), 0, "one response");
    assert_eq!(dev.submitted.lock().unwrap().len(), 1);
    assert_eq!(h.s.budget.reserved(), 0);
}

#[test]
fn a_short_or_non_streaming_write_is_collected_whole() {
    // 256 KiB: one buffer, written once after the last Data-Out.
    let (mut h, dev) = harness();
    h.command(9, &write10(0, 512), &[], 256 << 10, true, TaskAttr::Simple);
    let r2ts = h.r2ts();
    h.answer(&r2ts[0], 1);
    assert_eq!(dev.held(), vec![0]);
    assert_eq!(dev.submitted.lock().unwrap()[0].1, 256 << 10);
    dev.complete(0, false);
    h.run_completions();
    assert_eq!(h.response(9).status, 0);
    // Unused helper events must not disturb a finished session.
    assert!(h.event(Event::Tick));
}
