//! A large READ whose data the target core hands over in pieces
//! (cut-through): the Data-In PDUs are those of the whole transfer, sent
//! as the pieces arrive, whatever order the engine finishes them in.

use std::sync::{Arc, Mutex};

use ethersan_backend::ram::RamDevice;
use ethersan_backend::{
    BackendError, BlockDevice, BlockDeviceExt, IoCompletion, IoRequest, Submission,
};
use ethersan_core::executor::Early;
use ethersan_proto::pdu::{self, DataIn, Pdu, TaskAttr};
use ethersan_proto::transfer::data_in_segments;

use super::{read10, target_over, Event, Harness};

/// RAM whose reads wait until the test completes them, and that asks for
/// split reads (as io_uring on an `O_DIRECT` store does).
struct Held {
    ram: RamDevice,
    pending: Mutex<Vec<(u64, usize, IoCompletion)>>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Held")
    }
}

impl BlockDevice for Held {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        self.ram.num_blocks()
    }
    fn submit(&self, req: IoRequest, done: IoCompletion) -> Submission {
        match req {
            IoRequest::Read { offset, len, .. } => {
                self.pending.lock().unwrap().push((offset, len, done));
                Submission::Pending
            }
            other => Submission::Done(ethersan_backend::submit_and_wait(&self.ram, other)),
        }
    }
    fn splits_reads(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        "held".into()
    }
}

impl Held {
    /// Complete the held read at `offset` (with an error when `fail`).
    fn complete(&self, offset: u64, fail: bool) {
        let (off, len, done) = {
            let mut p = self.pending.lock().unwrap();
            let i = p
                .iter()
                .position(|(o, ..)| *o == offset)
                .expect("held read");
            p.remove(i)
        };
        if fail {
            let cause = std::io::Error::from_raw_os_error(5);
            done(Err(BackendError::Read { offset: off, cause }));
        } else {
            let mut buf = vec![0; len];
            self.ram.read_at(off, &mut buf).unwrap();
            done(Ok(buf.into()));
        }
    }

    fn held(&self) -> Vec<u64> {
        self.pending
            .lock()
            .unwrap()
            .iter()
            .map(|(o, ..)| *o)
            .collect()
    }
}

fn harness(max_recv: u32) -> (Harness, Arc<Held>) {
    let held = Arc::new(Held {
        ram: RamDevice::new(8 << 20, 512).unwrap(),
        pending: Mutex::new(Vec::new()),
    });
    let data: Vec<u8> = (0..4 << 20)
        .map(|i: u32| (i / 512) as u8 ^ (i % 251) as u8)
        .collect();
    held.ram.write_at(0, &data, false).unwrap();
    let t = target_over(held.clone());
    let mut h = Harness::over(t, 128 << 20, false);
    let later = Arc::new(Mutex::new(Vec::new()));
    let l = later.clone();
    h.s.set_early(Early(Arc::new(move |itt, part, total| {
        l.lock().unwrap().push(Event::Early(itt, part, total))
    })));
    h.s.setup.params.max_send_data_segment_length = max_recv;
    h.later = Some(later);
    (h, held)
}

impl Harness {
    /// Feed the session what the engine's completions produced.
    fn run_later(&mut self) {
        let evs = std::mem::take(&mut *self.later.as_ref().unwrap().lock().unwrap());
        for ev in evs {
            self.event(ev);
        }
    }

    /// The Data-In PDUs sent so far for `itt`, taken out.
    fn data_ins(&mut self, itt: u32) -> Vec<(DataIn, bytes::Bytes)> {
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.sent)
            .into_iter()
            .partition(|(p, _)| matches!(p, Pdu::DataIn(d) if d.itt == itt));
        self.sent = rest;
        mine.into_iter()
            .map(|(p, b)| match p {
                Pdu::DataIn(d) => (d, b),
                _ => unreachable!(),
            })
            .collect()
    }
}

const PIECE: u64 = 256 << 10;

#[test]
fn data_in_goes_out_as_pieces_land_in_order_with_the_status_on_the_last() {
    // 96 KiB PDUs do not divide the pieces: some PDUs straddle two.
    for max_recv in [64 << 10, 96 << 10] {
        let (mut h, held) = harness(max_recv);
        let len = 1u32 << 20;
        h.command(5, &read10(0, 2048), &[], len, false, TaskAttr::Simple);
        assert_eq!(
            held.held(),
            vec![0, PIECE, 2 * PIECE],
            "three pieces at once"
        );
        // The second piece first: nothing can go out yet.
        held.complete(PIECE, false);
        h.run_later();
        assert!(h.data_ins(5).is_empty());
        held.complete(0, false);
        h.run_later();
        let first = h.data_ins(5);
        // Every whole PDU within the first two pieces, no status.
        let burst = h.s.setup.params.max_burst_length;
        let whole = data_in_segments(len, max_recv, burst)
            .filter(|s| s.offset + s.len <= 2 * PIECE as u32)
            .count();
        assert_eq!(first.len(), whole, "max_recv {max_recv}");
        assert!(first.iter().all(|(d, _)| !d.status_present));
        assert_eq!(held.held(), vec![2 * PIECE, 3 * PIECE]);
        held.complete(3 * PIECE, false);
        held.complete(2 * PIECE, false);
        h.run_later();
        let rest = h.data_ins(5);
        let all: Vec<_> = first.into_iter().chain(rest).collect();
        let mut data = Vec::new();
        for (i, (d, b)) in all.iter().enumerate() {
            assert_eq!(d.data_sn, i as u32);
            assert_eq!(d.buffer_offset as usize, data.len());
            assert_eq!(d.status_present, i == all.len() - 1);
            data.extend_from_slice(b);
        }
        let mut want = vec![0; len as usize];
        held.ram.read_at(0, &mut want).unwrap();
        assert!(data == want, "max_recv {max_recv}: the bytes in order");
        let (last, _) = all.last().unwrap();
        assert_eq!((last.status, last.residual, last.final_bit), (0, 0, true));
        assert!(h.sent.is_empty(), "no separate response: {:?}", h.sent);
        assert_eq!(h.s.budget.reserved(), len as usize, "held until sent");
        drop(all);
        h.event(Event::Released);
        assert_eq!(h.s.budget.reserved(), 0, "given back once all is sent");
    }
}

#[test]
fn a_read_failing_after_some_data_went_out_ends_with_one_check_condition() {
    let (mut h, held) = harness(64 << 10);
    h.command(6, &read10(0, 2048), &[], 1 << 20, false, TaskAttr::Simple);
    held.complete(0, false);
    h.run_later();
    let sent = h.data_ins(6);
    assert_eq!(sent.len(), 4, "the first piece went out");
    // Pieces 1, 2 and 3 are on the device; 1 fails.
    assert_eq!(held.held(), vec![PIECE, 2 * PIECE, 3 * PIECE]);
    held.complete(PIECE, true);
    held.complete(2 * PIECE, false);
    h.run_later();
    assert!(h.sent.is_empty(), "the piece still in flight is waited for");
    held.complete(3 * PIECE, false);
    h.run_later();
    assert!(h.data_ins(6).is_empty(), "no data after the failure");
    let r: pdu::ScsiResponse = h.response(6);
    assert_eq!(r.status, 2, "CHECK CONDITION");
    assert_eq!(r.exp_data_sn, 4, "ExpDataSN counts the Data-In sent");
    assert!(held.held().is_empty(), "no piece started after the failure");
    assert_eq!(r.residual, 0, "no residual for a failed read");
    // The read's budget comes back only when what was sent is gone.
    let reserved = h.s.budget.reserved();
    assert_eq!(reserved, 1 << 20, "held by the Data-In still queued");
    h.sent.clear();
    drop(sent);
    h.event(Event::Released);
    assert_eq!(h.s.budget.reserved(), 0);
}

#[test]
fn an_aborted_read_sends_nothing_more() {
    let (mut h, held) = harness(64 << 10);
    h.command(7, &read10(0, 2048), &[], 1 << 20, false, TaskAttr::Simple);
    held.complete(0, false);
    h.run_later();
    assert_eq!(h.data_ins(7).len(), 4);
    let t = pdu::TaskMgmtRequest {
        immediate: true,
        function: pdu::TmfFunction::AbortTask,
        lun: pdu::lun_to_wire(0),
        itt: 0x70,
        referenced_task_tag: 7,
        cmd_sn: h.cmd_sn,
        exp_stat_sn: 0,
        ref_cmd_sn: 0,
        exp_data_sn: 0,
    };
    h.pdu(Pdu::TaskMgmtRequest(t), &[]);
    // The abort completes when the task ends: its pieces still land.
    while !held.held().is_empty() {
        for o in held.held() {
            held.complete(o, false);
        }
        h.run_later();
    }
    assert!(h.data_ins(7).is_empty(), "nothing for an aborted task");
    assert!(h
        .sent
        .iter()
        .all(|(p, _)| !matches!(p, Pdu::ScsiResponse(r) if r.itt == 7)));
    let done = h
        .sent
        .iter()
        .any(|(p, _)| matches!(p, Pdu::TaskMgmtResponse(r) if r.itt == 0x70 && r.response == 0));
    assert!(done, "FUNCTION COMPLETE once the task ended: {:?}", h.sent);
}
