//! The session state machine driven directly, in the manner of
//! quinn-proto's tests: PDUs built with the protocol core's encoders go in
//! with the time passed in, what the session asks for comes out, commands
//! run on the target core's executor inline, and their completions go back
//! in. No sockets, no tasks, no clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ethersan_core::executor::{Executor, Inline};
use ethersan_proto::negotiate::SessionParams;
use ethersan_proto::pdu::{
    self, lun_to_wire, DataOut, NopOut, Pdu, RawPdu, ScsiCommand, TaskAttr, TaskMgmtRequest,
    TmfFunction, RESERVED_TAG,
};
use ethersan_scsi::{LogicalUnit, LuConfig, LunMap, LunPolicy, LunSlot, Nexus};

use ethersan_endpoint::PlacedBuf;

use super::{Event, Session, SessionOptions, SessionSetup};
use crate::registry::{Registry, TargetEntry};
use crate::wire::WriterMsg;

const IQN: &str = "iqn.2026-11.org.ethersan:sm";

/// One session and what it sent.
struct Harness {
    s: Session,
    executor: Executor,
    now: Instant,
    /// PDUs the session sent, decoded, with their data.
    sent: Vec<(Pdu, Bytes)>,
    /// How often the session asked to be woken for freed budget.
    woken: Arc<AtomicUsize>,
    closed: bool,
    cmd_sn: u32,
    /// The channel's registrations, for a session that places writes.
    buffers: Option<Buffers>,
    /// Outcomes and early data of commands that did not finish at once,
    /// for a harness whose LUN answers later (`None`: RAM, at once).
    later: Option<Arc<std::sync::Mutex<Vec<Event>>>>,
}

/// Registrations kept as a channel's are (`Registrar`'s stand-in).
#[derive(Default)]
struct Buffers(std::sync::Mutex<std::collections::HashMap<u32, PlacedBuf>>);

impl super::driver::WriteBuffers for Buffers {
    fn expect(&self, itt: u32, prefix: ethersan_scsi::IoBuf, len: usize) {
        let (raw, start) = prefix.into_parts();
        let p = PlacedBuf::with_prefix_at(raw, start, len);
        self.0.lock().unwrap().insert(itt, p);
    }
    fn place(&self, itt: u32, offset: u64, data: &[u8]) -> bool {
        let mut m = self.0.lock().unwrap();
        m.get_mut(&itt).is_some_and(|p| p.place(offset, data))
    }
    fn release(&self, itt: u32) -> Option<PlacedBuf> {
        self.0.lock().unwrap().remove(&itt)
    }
}

/// A target with one 64 MiB RAM LUN.
pub(super) fn target() -> Arc<TargetEntry> {
    target_over(Arc::new(
        ethersan_backend::ram::RamDevice::new(64 << 20, 512).unwrap(),
    ))
}

/// A target with one LUN over `dev`.
fn target_over(dev: Arc<dyn ethersan_backend::BlockDevice>) -> Arc<TargetEntry> {
    let lu = LogicalUnit::new(
        dev,
        LuConfig {
            serial: "sm".into(),
            naa: [0x6a; 16],
            target_name: IQN.into(),
            ..LuConfig::default()
        },
    );
    let mut luns = LunMap::new();
    luns.insert(
        0,
        LunSlot {
            lu: Arc::new(lu),
            policy: LunPolicy::default(),
        },
    );
    Arc::new(TargetEntry::new(
        IQN.into(),
        None,
        luns,
        Arc::new(ethersan_core::directory::AllowAll),
    ))
}

impl Harness {
    fn new(memory_budget: usize) -> Harness {
        Harness::with(memory_budget, false)
    }

    /// A session over a native transport channel: writes' data placed.
    fn placing() -> Harness {
        Harness::with(128 << 20, true)
    }

    fn with(memory_budget: usize, placed_writes: bool) -> Harness {
        Harness::over(target(), memory_budget, placed_writes)
    }

    fn over(t: Arc<TargetEntry>, memory_budget: usize, placed_writes: bool) -> Harness {
        let registry = Arc::new(Registry::new(vec![t.clone()], vec![]));
        let params = SessionParams {
            initiator_name: "iqn.2026-11.org.ethersan:i".into(),
            target_name: Some(IQN.into()),
            ..SessionParams::default()
        };
        let setup = SessionSetup {
            counters: Arc::default(),
            channel_level: None,
            placed_writes,
            id: 1,
            target: Some(t),
            params,
            nexus: Nexus(7),
            exp_cmd_sn: 1,
            stat_sn: 100,
            options: SessionOptions {
                queue_depth: 16,
                nop_interval: Some(Duration::from_secs(30)),
                nop_timeout: Duration::from_secs(10),
                inline_io: true,
                max_key_text: 65536,
                memory_budget,
            },
            peer_ip: None,
            local_addr: None,
        };
        let woken = Arc::new(AtomicUsize::new(0));
        let w = woken.clone();
        let now = Instant::now();
        let releases = super::Releases::new(Box::new(move || {
            w.fetch_add(1, Ordering::SeqCst);
        }));
        let mut s = Session::new(setup, registry, releases, now);
        s.begin();
        let mut h = Harness {
            s,
            executor: Executor { inline_io: true },
            now,
            sent: Vec::new(),
            woken,
            closed: false,
            cmd_sn: 1,
            buffers: placed_writes.then(Buffers::default),
            later: None,
        };
        // The POWER ON unit attention.
        let itt = h.command(0x900, &[0; 6], &[], 0, false, TaskAttr::Simple);
        assert_eq!(h.response(itt).status, 2);
        h.sent.clear();
        h
    }

    /// Feed one event, then do what the session asks until it is quiet
    /// (the driver's own loop, with frames collected and the blocking
    /// pool inline: RAM completes at once).
    fn event(&mut self, ev: Event) -> bool {
        let go_on = self.s.handle(ev, self.now);
        let (sent, closed) = (&mut self.sent, &mut self.closed);
        let mut send = |msg| match msg {
            WriterMsg::Frame(f) => sent.push((Pdu::decode(&f.bhs).unwrap(), f.data)),
            WriterMsg::Close => *closed = true,
            WriterMsg::Digests { .. } => {}
        };
        let done: ethersan_core::executor::Done = match &self.later {
            Some(later) => {
                let later = later.clone();
                Arc::new(move |itt, f| later.lock().unwrap().push(Event::Done(itt, f)))
            }
            None => Arc::new(|_, _| panic!("a RAM command finishes at once")),
        };
        super::driver::settle(
            &mut self.s,
            &self.executor,
            &Inline,
            &mut send,
            &done,
            self.buffers
                .as_ref()
                .map(|b| b as &dyn super::driver::WriteBuffers),
            self.now,
        ) && go_on
    }

    fn pdu(&mut self, pdu: Pdu, data: &[u8]) -> bool {
        let raw = RawPdu {
            bhs: pdu.encode(data.len() as u32),
            ahs: Vec::new(),
            data: data.to_vec(),
        };
        self.event(Event::Pdu(Ok(raw)))
    }

    /// Send a SCSI command with the next CmdSN; returns its ITT.
    fn command(
        &mut self,
        itt: u32,
        cdb: &[u8],
        immediate: &[u8],
        expected_len: u32,
        write: bool,
        attr: TaskAttr,
    ) -> u32 {
        let mut cdb16 = [0u8; 16];
        cdb16[..cdb.len()].copy_from_slice(cdb);
        let cmd = ScsiCommand {
            immediate: false,
            final_bit: true,
            read: !write && expected_len > 0,
            write,
            attr,
            lun: lun_to_wire(0),
            itt,
            expected_len,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            cdb: cdb16,
        };
        self.cmd_sn += 1;
        self.pdu(Pdu::ScsiCommand(cmd), immediate);
        itt
    }

    /// The SCSI Response (or status-carrying Data-In) for `itt`, taken
    /// out of what was sent.
    fn response(&mut self, itt: u32) -> pdu::ScsiResponse {
        let i = self
            .sent
            .iter()
            .position(|(p, _)| matches!(p, Pdu::ScsiResponse(r) if r.itt == itt))
            .unwrap_or_else(|| panic!("no response for {itt}: {:?}", self.sent));
        match self.sent.remove(i).0 {
            Pdu::ScsiResponse(r) => r,
            _ => unreachable!(),
        }
    }

    fn r2ts(&mut self) -> Vec<pdu::R2t> {
        let (r2ts, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.sent)
            .into_iter()
            .partition(|(p, _)| matches!(p, Pdu::R2t(_)));
        self.sent = rest;
        r2ts.into_iter()
            .map(|(p, _)| match p {
                Pdu::R2t(r) => r,
                _ => unreachable!(),
            })
            .collect()
    }

    /// Answer an R2T with all it asks for, 8 KiB per Data-Out.
    fn answer(&mut self, r: &pdu::R2t, fill: u8) {
        for (d, len) in data_outs(r) {
            self.pdu(Pdu::DataOut(d), &vec![fill; len as usize]);
        }
    }

    fn tmf(&mut self, itt: u32, function: TmfFunction, referenced: u32) -> u8 {
        let t = TaskMgmtRequest {
            immediate: true,
            function,
            lun: lun_to_wire(0),
            itt,
            referenced_task_tag: referenced,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            ref_cmd_sn: 0,
            exp_data_sn: 0,
        };
        self.pdu(Pdu::TaskMgmtRequest(t), &[]);
        let i = self
            .sent
            .iter()
            .position(|(p, _)| matches!(p, Pdu::TaskMgmtResponse(r) if r.itt == itt))
            .expect("a TMF response");
        match self.sent.remove(i).0 {
            Pdu::TaskMgmtResponse(r) => r.response,
            _ => unreachable!(),
        }
    }
}

mod stream;
mod stream_write;

fn write10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = write10(lba, blocks);
    c[0] = 0x28;
    c
}

#[test]
fn a_write_with_immediate_data_and_r2ts_reads_back() {
    let mut h = Harness::new(128 << 20);
    // 256 KiB: 8 KiB immediate data, the rest solicited by one R2T
    // (MaxBurstLength 256 KiB, MaxOutstandingR2T 1).
    let len = 256 * 1024;
    let imm = vec![1u8; 8192];
    h.command(10, &write10(8, 512), &imm, len, true, TaskAttr::Simple);
    let r2ts = h.r2ts();
    assert_eq!(r2ts.len(), 1);
    assert_eq!(
        (r2ts[0].buffer_offset, r2ts[0].desired_len),
        (8192, len - 8192)
    );
    h.answer(&r2ts[0], 2);
    let r = h.response(10);
    assert_eq!(r.status, 0);
    // ExpCmdSN moved past both commands; the window is 16 wide.
    assert_eq!((r.exp_cmd_sn, r.max_cmd_sn), (3, 18));
    h.command(11, &read10(8, 512), &[], len, false, TaskAttr::Simple);
    let data: Vec<u8> = h
        .sent
        .iter()
        .filter_map(|(p, d)| matches!(p, Pdu::DataIn(x) if x.itt == 11).then_some(d))
        .flat_map(|d| d.iter().copied())
        .collect();
    assert_eq!(data.len(), len as usize);
    assert!(data[..8192].iter().all(|b| *b == 1) && data[8192..].iter().all(|b| *b == 2));
    // The read's buffer goes back to the budget when the Data-In is sent
    // (dropped here); nothing waits, so nobody is woken.
    assert_eq!(h.s.budget.reserved(), len as usize);
    h.sent.clear();
    h.event(Event::Tick);
    assert_eq!(h.s.budget.reserved(), 0);
    assert_eq!(h.woken.load(Ordering::SeqCst), 0);
}

#[test]
fn commands_wait_for_a_gap_in_cmd_sn_to_fill() {
    let mut h = Harness::new(128 << 20);
    let first = h.cmd_sn;
    h.cmd_sn += 1;
    h.command(21, &[0; 6], &[], 0, false, TaskAttr::Simple);
    assert!(h.sent.is_empty(), "ran ahead of an earlier CmdSN");
    h.cmd_sn = first;
    h.command(20, &[0; 6], &[], 0, false, TaskAttr::Simple);
    let order: Vec<u32> = h
        .sent
        .iter()
        .map(|(p, _)| match p {
            Pdu::ScsiResponse(r) => r.itt,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(order, vec![20, 21]);
}

#[test]
fn abort_task_drops_a_write_waiting_for_data_and_frees_its_window_place() {
    let mut h = Harness::new(128 << 20);
    h.command(30, &write10(0, 16), &[], 8192, true, TaskAttr::Simple);
    let r2t = h.r2ts().pop().expect("an R2T");
    assert_eq!(
        h.tmf(31, TmfFunction::AbortTask, 30),
        0,
        "FUNCTION COMPLETE"
    );
    // Data for the aborted task is ignored; no response ever comes for it.
    h.answer(&r2t, 9);
    assert!(
        !h.sent
            .iter()
            .any(|(p, _)| matches!(p, Pdu::ScsiResponse(r) if r.itt == 30)),
        "{:?}",
        h.sent
    );
    // Nothing landed, and the window moved on.
    h.command(32, &read10(0, 16), &[], 8192, false, TaskAttr::Simple);
    let (p, d) = h.sent.pop().unwrap();
    match p {
        Pdu::DataIn(x) => {
            assert_eq!((x.itt, x.status_present, x.status), (32, true, 0));
            // The immediate TMF took no CmdSN; the aborted write gave
            // its window place back (MaxCmdSN = ExpCmdSN + 15).
            assert_eq!((x.exp_cmd_sn, x.max_cmd_sn), (4, 19));
        }
        other => panic!("{other:?}"),
    }
    assert!(d.iter().all(|b| *b == 0));
    // ABORT TASK for a task that is not there.
    assert_eq!(
        h.tmf(33, TmfFunction::AbortTask, 30),
        1,
        "TASK DOES NOT EXIST"
    );
}

#[test]
fn writes_beyond_the_memory_budget_wait_for_their_r2ts() {
    // Budget 1 MiB: one 1 MiB write at a time.
    let mut h = Harness::new(1 << 20);
    let mib = 1 << 20;
    h.command(40, &write10(0, 2048), &[], mib, true, TaskAttr::Simple);
    h.command(41, &write10(2048, 2048), &[], mib, true, TaskAttr::Simple);
    let r2ts = h.r2ts();
    assert_eq!(r2ts.iter().map(|r| r.itt).collect::<Vec<_>>(), vec![40]);
    // Feed 40 to the end; 41 gets its R2T when 40's buffer is freed.
    let mut r = r2ts[0].clone();
    loop {
        h.answer(&r, 4);
        let mut next = h.r2ts();
        if let Some(i) = next.iter().position(|x| x.itt == 40) {
            r = next.remove(i);
            assert!(next.is_empty(), "41 solicited while 40 holds the budget");
            continue;
        }
        assert_eq!(h.response(40).status, 0);
        assert_eq!(next.iter().map(|r| r.itt).collect::<Vec<_>>(), vec![41]);
        break;
    }
}

#[test]
fn the_initiator_is_pinged_when_idle_and_dropped_when_silent() {
    let mut h = Harness::new(128 << 20);
    h.now += Duration::from_secs(29);
    assert!(h.event(Event::Tick));
    assert!(h.sent.is_empty(), "no ping before 30 s of silence");
    h.now += Duration::from_secs(2);
    assert!(h.event(Event::Tick));
    let ttt = match h.sent.pop() {
        Some((Pdu::NopIn(n), _)) => {
            assert_eq!(n.itt, RESERVED_TAG);
            n.ttt
        }
        other => panic!("expected a NOP-In, got {other:?}"),
    };
    // Answered: the session goes on.
    let nop = NopOut {
        immediate: true,
        lun: 0,
        itt: RESERVED_TAG,
        ttt,
        cmd_sn: h.cmd_sn,
        exp_stat_sn: 0,
    };
    assert!(h.pdu(Pdu::NopOut(nop), &[]));
    h.now += Duration::from_secs(31);
    assert!(h.event(Event::Tick));
    assert!(matches!(h.sent.pop(), Some((Pdu::NopIn(_), _))));
    // Not answered within the timeout: the session ends.
    h.now += Duration::from_secs(11);
    assert!(!h.event(Event::Tick));
    assert_eq!(h.s.finish(), 0);
    h.s.close();
    h.event(Event::Tick);
    assert!(h.closed);
}

#[test]
fn a_command_outside_the_window_gives_back_its_immediate_data() {
    let mut h = Harness::new(128 << 20);
    let sn = h.cmd_sn;
    h.cmd_sn += 1000;
    h.command(
        50,
        &write10(0, 16),
        &[3u8; 4096],
        8192,
        true,
        TaskAttr::Simple,
    );
    assert_eq!(
        h.s.budget.unsolicited(),
        0,
        "dropped command kept its bytes"
    );
    assert!(h.sent.is_empty());
    h.cmd_sn = sn;
    // Its ITT is free again.
    h.command(50, &[0; 6], &[], 0, false, TaskAttr::Simple);
    assert_eq!(h.response(50).status, 0);
}

#[test]
fn a_write_larger_than_the_budget_with_immediate_data_still_runs() {
    // 1 MiB budget, a 2 MiB write that carried 8 KiB of immediate data:
    // alone, it gets its buffer and its R2Ts.
    let mut h = Harness::new(1 << 20);
    h.command(
        60,
        &write10(0, 4096),
        &[5u8; 8192],
        2 << 20,
        true,
        TaskAttr::Simple,
    );
    let mut r2ts = h.r2ts();
    assert_eq!(r2ts.len(), 1, "the write waits for its own reservation");
    while let Some(r) = r2ts.pop() {
        h.answer(&r, 5);
        r2ts = h.r2ts();
    }
    assert_eq!(h.response(60).status, 0);
    assert_eq!((h.s.budget.reserved(), h.s.budget.unsolicited()), (0, 0));
}

#[test]
fn buffers_go_in_command_order_so_an_ordered_read_is_not_starved() {
    // Budget 1 MiB: A (write) holds it; X (ORDERED read) and W (write)
    // wait. When A is done, X gets the buffer before the newer W, runs,
    // and then W is asked for its data.
    let mib = 1 << 20;
    let mut h = Harness::new(mib as usize);
    h.command(70, &write10(0, 2048), &[], mib, true, TaskAttr::Simple);
    h.command(71, &read10(0, 2048), &[], mib, false, TaskAttr::Ordered);
    h.command(72, &write10(4096, 2048), &[], mib, true, TaskAttr::Simple);
    let mut r2ts = h.r2ts();
    assert_eq!(r2ts.iter().map(|r| r.itt).collect::<Vec<_>>(), vec![70]);
    loop {
        let r = r2ts.pop().unwrap();
        h.answer(&r, 6);
        r2ts = h.r2ts();
        if r2ts.iter().all(|r| r.itt != 70) {
            break;
        }
    }
    assert!(
        r2ts.is_empty(),
        "W solicited ahead of the older read: {r2ts:?}"
    );
    assert_eq!(h.response(70).status, 0);
    let read: Vec<u8> = h
        .sent
        .drain(..)
        .filter_map(|(p, d)| matches!(p, Pdu::DataIn(x) if x.itt == 71).then_some(d))
        .flat_map(|d| d.to_vec())
        .collect();
    assert_eq!(read.len(), mib as usize);
    assert!(read.iter().all(|b| *b == 6));
    // The read's buffer comes back when its Data-In is sent (dropped
    // above): W waits, so the session is woken, and W gets its R2T.
    assert_eq!(h.woken.load(Ordering::SeqCst), 1);
    h.event(Event::Released);
    assert_eq!(h.r2ts().iter().map(|r| r.itt).collect::<Vec<_>>(), vec![72]);
}

#[test]
fn the_itt_of_a_command_aborted_before_its_turn_stays_taken_until_then() {
    let mut h = Harness::new(128 << 20);
    let gap = h.cmd_sn;
    h.cmd_sn += 1;
    // Held: its CmdSN is one past the next expected.
    h.command(80, &[0; 6], &[], 0, false, TaskAttr::Simple);
    assert_eq!(h.tmf(81, TmfFunction::AbortTask, 80), 0);
    // A new command reusing ITT 80 is refused while the old CmdSN is held.
    h.command(80, &[0; 6], &[], 0, false, TaskAttr::Simple);
    match h.sent.pop() {
        Some((Pdu::Reject(r), _)) => assert_eq!(r.reason, pdu::reject_reason::TASK_IN_PROGRESS),
        other => panic!("expected a Reject, got {other:?}"),
    }
    // The gap fills: the old CmdSN comes up with no task; ITT 80 is free.
    // (The rejected command took no CmdSN: the initiator sends it again
    // with the same one.)
    let after = h.cmd_sn - 1;
    h.cmd_sn = gap;
    h.command(82, &[0; 6], &[], 0, false, TaskAttr::Simple);
    assert_eq!(h.response(82).status, 0);
    h.cmd_sn = after;
    h.command(80, &[0; 6], &[], 0, false, TaskAttr::Simple);
    assert_eq!(h.response(80).status, 0);
}

#[test]
fn write_buffers_fill_in_order_without_zeroing_and_gaps_read_as_zeros() {
    use ethersan_proto::transfer::fill_at;
    let mut buf = Vec::with_capacity(16);
    fill_at(&mut buf, 0, &[1, 2, 3, 4]);
    fill_at(&mut buf, 4, &[5, 6]);
    assert_eq!(buf, [1, 2, 3, 4, 5, 6]);
    // Data out of order: the gap reads as zeros until its data comes.
    fill_at(&mut buf, 10, &[9, 9]);
    assert_eq!(buf, [1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 9, 9]);
    fill_at(&mut buf, 6, &[7, 7, 7, 7]);
    assert_eq!(buf, [1, 2, 3, 4, 5, 6, 7, 7, 7, 7, 9, 9]);
    // Data sent again over bytes already there, and past the end.
    fill_at(&mut buf, 10, &[8, 8, 8, 8]);
    assert_eq!(buf, [1, 2, 3, 4, 5, 6, 7, 7, 7, 7, 8, 8, 8, 8]);
    assert_eq!(
        buf.capacity(),
        16,
        "appends stayed in the reserved capacity"
    );
}

/// Over a native transport channel: the write's buffer is registered
/// before its R2T, the solicited data lands in it (here: placed by hand,
/// as the endpoint would, out of order) while Data-Out headers come alone,
/// and the command runs on that buffer once taken back.
#[test]
fn placed_data_out_lands_in_the_registered_buffer_and_reads_back() {
    let mut h = Harness::placing();
    let len = 256 * 1024;
    h.command(
        40,
        &write10(8, 512),
        &[1u8; 8192],
        len,
        true,
        TaskAttr::Simple,
    );
    let r2t = h.r2ts().pop().expect("an R2T");
    let reg = h.buffers.as_ref().unwrap();
    {
        let m = reg.0.lock().unwrap();
        let p = m.get(&40).expect("registered before the R2T went out");
        assert_eq!(p.len(), len as usize);
        let buf = p.get(0, 8192).expect("initialised");
        assert!(buf.iter().all(|b| *b == 1), "immediate data kept");
    }
    // The data lands, last half first; then the headers, 8 KiB each.
    let half = (len - 8192) / 2;
    use super::driver::WriteBuffers;
    assert!(reg.place(40, u64::from(8192 + half), &vec![3u8; half as usize]));
    assert!(reg.place(40, 8192, &vec![2u8; half as usize]));
    placed_headers(&mut h, &r2t);
    assert_eq!(h.response(40).status, 0);
    assert!(
        h.buffers.as_ref().unwrap().0.lock().unwrap().is_empty(),
        "taken back"
    );
    h.command(41, &read10(8, 512), &[], len, false, TaskAttr::Simple);
    let data: Vec<u8> = h
        .sent
        .iter()
        .filter_map(|(p, d)| matches!(p, Pdu::DataIn(x) if x.itt == 41).then_some(d))
        .flat_map(|d| d.iter().copied())
        .collect();
    let h1 = 8192 + half as usize;
    assert!(data[..8192].iter().all(|b| *b == 1));
    assert!(data[8192..h1].iter().all(|b| *b == 2));
    assert!(data[h1..].iter().all(|b| *b == 3));
}

/// A Data-Out header announcing bytes that never landed fails the command
/// (DATA PHASE ERROR) instead of writing a hole; an aborted write's
/// registration is dropped.
#[test]
fn placed_data_out_that_never_landed_fails_and_an_abort_drops_the_buffer() {
    let mut h = Harness::placing();
    h.command(50, &write10(0, 64), &[], 32768, true, TaskAttr::Simple);
    let r2t = h.r2ts().pop().expect("an R2T");
    use super::driver::WriteBuffers;
    assert!(h.buffers.as_ref().unwrap().place(50, 0, &[7u8; 16384]));
    placed_headers(&mut h, &r2t);
    // The sense data follows its 2-byte length: key at 2, ASC at 12.
    let sense = h
        .sent
        .iter()
        .find_map(|(p, d)| matches!(p, Pdu::ScsiResponse(r) if r.itt == 50).then(|| d.clone()))
        .expect("a response");
    assert_eq!(h.response(50).status, 2);
    assert_eq!(
        (sense[4] & 0x0f, sense[14]),
        (0x0b, 0x4b),
        "DATA PHASE ERROR"
    );
    // Aborted while collecting: the registration goes.
    h.command(51, &write10(0, 16), &[], 8192, true, TaskAttr::Simple);
    assert_eq!(h.r2ts().len(), 1);
    assert!(h
        .buffers
        .as_ref()
        .unwrap()
        .0
        .lock()
        .unwrap()
        .contains_key(&51));
    assert_eq!(h.tmf(52, TmfFunction::AbortTask, 51), 0);
    assert!(h.buffers.as_ref().unwrap().0.lock().unwrap().is_empty());
}

/// The registered buffer is not zeroed: bytes that no Data-Out announced
/// and that never landed (here the first header sent twice in place of
/// the second) fail the command rather than write whatever the buffer
/// held.
#[test]
fn a_placed_write_with_bytes_nobody_sent_fails() {
    let mut h = Harness::placing();
    h.command(60, &write10(0, 48), &[], 24576, true, TaskAttr::Simple);
    let r2t = h.r2ts().pop().expect("an R2T");
    use super::driver::WriteBuffers;
    let reg = h.buffers.as_ref().unwrap();
    assert!(reg.place(60, 0, &[5u8; 8192]));
    assert!(reg.place(60, 16384, &[6u8; 8192]));
    let mut outs = data_outs(&r2t);
    assert_eq!(outs.len(), 3);
    outs[1].0.buffer_offset = outs[0].0.buffer_offset;
    for (d, len) in outs {
        let raw = RawPdu {
            bhs: Pdu::DataOut(d).encode(len),
            ahs: Vec::new(),
            data: Vec::new(),
        };
        h.event(Event::Pdu(Ok(raw)));
    }
    let sense = h
        .sent
        .iter()
        .find_map(|(p, d)| matches!(p, Pdu::ScsiResponse(r) if r.itt == 60).then(|| d.clone()))
        .expect("a response");
    assert_eq!(h.response(60).status, 2);
    assert_eq!(
        (sense[4] & 0x0f, sense[14]),
        (0x0b, 0x4b),
        "DATA PHASE ERROR"
    );
}

/// The Data-Out headers of a placed answer to `r`, 8 KiB each, each
/// without its data segment.
fn placed_headers(h: &mut Harness, r: &pdu::R2t) {
    for (d, len) in data_outs(r) {
        let raw = RawPdu {
            bhs: Pdu::DataOut(d).encode(len),
            ahs: Vec::new(),
            data: Vec::new(),
        };
        h.event(Event::Pdu(Ok(raw)));
    }
}

/// The Data-Out headers answering `r` with 8 KiB each, and their lengths.
fn data_outs(r: &pdu::R2t) -> Vec<(DataOut, u32)> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < r.desired_len {
        let len = (r.desired_len - off).min(8192);
        let d = DataOut {
            final_bit: off + len == r.desired_len,
            lun: lun_to_wire(0),
            itt: r.itt,
            ttt: r.ttt,
            exp_stat_sn: 0,
            data_sn: out.len() as u32,
            buffer_offset: r.buffer_offset + off,
        };
        out.push((d, len));
        off += len;
    }
    out
}
