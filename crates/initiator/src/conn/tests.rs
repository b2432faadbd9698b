//! The connection state machine driven directly, in quinn-proto's
//! manner: requests and made-up target PDUs (proto's encoders) go in with
//! the time passed in; PDUs, answers and closes come out. No sockets, no
//! tasks, no clock. The login state machine is driven against proto's
//! target negotiator the same way.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ethersan_proto::negotiate::{
    AuthPolicy, InitiatorNegotiator, InitiatorSettings, SessionParams, TargetNegotiator,
    TargetSettings,
};
use ethersan_proto::pdu::{
    reject_reason, DataIn, DataOut, LoginResponse, LogoutResponse, NopIn, Pdu, R2t, RawPdu, Reject,
    ScsiCommand, ScsiResponse, TaskMgmtRequest, TaskMgmtResponse, TmfFunction, RESERVED_TAG,
};
use ethersan_proto::seq::CmdSnWindow;
use ethersan_proto::text::{encode_text, parse_text};

use super::*;

/// One connection and what it did.
struct Harness {
    c: Connection,
    now: Instant,
    /// PDUs sent, decoded, with their data.
    sent: Vec<(Pdu, Bytes)>,
    answers: Vec<(RequestId, Result<Answer, Error>)>,
    closed: Option<Option<Error>>,
    next_id: u64,
    stat_sn: u32,
}

fn params() -> SessionParams {
    SessionParams {
        initiator_name: "iqn.2026-11.org.ethersan:t".into(),
        target_name: Some("iqn.2026-11.org.ethersan:sm".into()),
        initial_r2t: false,
        immediate_data: true,
        max_recv_data_segment_length: 8192,
        max_burst_length: 16384,
        first_burst_length: 16384,
        ..SessionParams::default()
    }
}

impl Harness {
    fn new(p: SessionParams, max_cmd_sn: u32, config: Config) -> Harness {
        let now = Instant::now();
        Harness {
            c: Connection::new(p, CmdSnWindow::new(1, max_cmd_sn), 100, config, now),
            now,
            sent: Vec::new(),
            answers: Vec::new(),
            closed: None,
            next_id: 0,
            stat_sn: 100,
        }
    }

    fn drain(&mut self) {
        while let Some(o) = self.c.poll_output() {
            match o {
                Output::Send(t) => self.sent.push((Pdu::decode(&t.bhs).unwrap(), t.data)),
                Output::Complete(id, r) => self.answers.push((id, r)),
                Output::Close(e) => self.closed = Some(e),
            }
        }
    }

    fn event(&mut self, ev: Event) {
        self.c.handle(ev, self.now);
        self.drain();
    }

    fn submit(&mut self, req: Request) -> RequestId {
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.event(Event::Submit(id, req));
        id
    }

    fn read(&mut self, len: u32, buffer: Vec<u8>) -> RequestId {
        self.submit(Request::Command {
            lun: 0,
            cdb: vec![0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            data_out: Bytes::new(),
            read_len: len,
            buffer,
        })
    }

    fn write(&mut self, data: Bytes) -> RequestId {
        self.submit(Request::Command {
            lun: 0,
            cdb: vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            data_out: data,
            read_len: 0,
            buffer: Vec::new(),
        })
    }

    /// A PDU from the target.
    fn target(&mut self, pdu: Pdu, data: &[u8]) {
        let raw = RawPdu {
            bhs: pdu.encode(data.len() as u32),
            ahs: Vec::new(),
            data: data.to_vec(),
        };
        self.event(Event::Pdu(raw));
    }

    fn stat_sn(&mut self) -> u32 {
        self.stat_sn += 1;
        self.stat_sn - 1
    }

    fn respond(&mut self, itt: u32, status: u8, max_cmd_sn: u32) {
        let r = ScsiResponse {
            status,
            itt,
            stat_sn: self.stat_sn(),
            exp_cmd_sn: 1,
            max_cmd_sn,
            ..ScsiResponse::default()
        };
        self.target(Pdu::ScsiResponse(r), &[]);
    }

    /// The SCSI Command PDUs sent so far, taken out.
    fn commands(&mut self) -> Vec<(ScsiCommand, Bytes)> {
        let mut out = Vec::new();
        self.sent.retain(|(p, d)| match p {
            Pdu::ScsiCommand(c) => {
                out.push((c.clone(), d.clone()));
                false
            }
            _ => true,
        });
        out
    }

    /// The Data-Out PDUs sent so far, taken out.
    fn data_outs(&mut self) -> Vec<(DataOut, Bytes)> {
        let mut out = Vec::new();
        self.sent.retain(|(p, d)| match p {
            Pdu::DataOut(x) => {
                out.push((x.clone(), d.clone()));
                false
            }
            _ => true,
        });
        out
    }

    fn answer(&mut self, id: RequestId) -> Result<Answer, Error> {
        let i = self
            .answers
            .iter()
            .position(|(a, _)| *a == id)
            .unwrap_or_else(|| panic!("no answer for {id:?}: {:?}", self.answers));
        self.answers.remove(i).1
    }

    fn result(&mut self, id: RequestId) -> CommandResult {
        match self.answer(id) {
            Ok(Answer::Command(r)) => r,
            other => panic!("{other:?}"),
        }
    }
}

fn data_in(itt: u32, offset: u32, status: Option<u8>) -> DataIn {
    DataIn {
        final_bit: status.is_some(),
        status_present: status.is_some(),
        status: status.unwrap_or(0),
        itt,
        ttt: RESERVED_TAG,
        stat_sn: 100,
        exp_cmd_sn: 2,
        max_cmd_sn: 17,
        buffer_offset: offset,
        ..DataIn::default()
    }
}

#[test]
fn a_data_in_sequence_lands_in_the_callers_buffer() {
    let mut h = Harness::new(params(), 16, Config::default());
    let buf = Vec::with_capacity(12 * 1024);
    let ptr = buf.as_ptr();
    let id = h.read(12 * 1024, buf);
    let (cmd, _) = h.commands().pop().expect("the command");
    assert!(cmd.read && cmd.final_bit && !cmd.write);
    assert_eq!(
        (cmd.cmd_sn, cmd.exp_stat_sn, cmd.expected_len),
        (1, 100, 12288)
    );
    h.target(Pdu::DataIn(data_in(cmd.itt, 0, None)), &[1; 4096]);
    h.target(Pdu::DataIn(data_in(cmd.itt, 4096, None)), &[2; 4096]);
    assert!(h.answers.is_empty());
    h.target(Pdu::DataIn(data_in(cmd.itt, 8192, Some(0))), &[3; 4096]);
    let r = h.result(id);
    assert_eq!(r.status, 0);
    assert_eq!(r.data.len(), 12288);
    assert!(r.data[..4096].iter().all(|b| *b == 1));
    assert!(r.data[8192..].iter().all(|b| *b == 3));
    assert_eq!(r.data.as_ptr(), ptr, "placed into the caller's buffer");
    // The status in the Data-In moved ExpStatSN.
    assert_eq!(h.c.exp_stat_sn(), 101);
}

#[test]
fn a_short_read_is_cut_to_what_came_and_its_sense_is_kept() {
    let mut h = Harness::new(params(), 16, Config::default());
    let id = h.read(4096, Vec::new());
    let (cmd, _) = h.commands().pop().unwrap();
    let mut d = data_in(cmd.itt, 0, Some(0));
    d.underflow = true;
    d.residual = 3584;
    h.target(Pdu::DataIn(d), &[9; 512]);
    let r = h.result(id);
    assert_eq!((r.data.len(), r.residual, r.underflow), (512, 3584, true));
    // CHECK CONDITION with sense in the response's data segment.
    let id = h.read(512, Vec::new());
    let (cmd, _) = h.commands().pop().unwrap();
    let sense = [
        0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0,
    ];
    let mut seg = vec![0, sense.len() as u8];
    seg.extend_from_slice(&sense);
    let r = ScsiResponse {
        status: 2,
        itt: cmd.itt,
        stat_sn: 101,
        exp_cmd_sn: 3,
        max_cmd_sn: 18,
        ..ScsiResponse::default()
    };
    h.target(Pdu::ScsiResponse(r), &seg);
    let r = h.result(id);
    assert_eq!(r.sense_key(), Some((5, 0x24, 0)));
    assert!(r.data.is_empty());
}

#[test]
fn a_write_sends_immediate_and_unsolicited_data_then_answers_each_r2t() {
    // 48 KiB: 8 KiB immediate (MaxRecvDataSegmentLength), 8 KiB more
    // unsolicited (FirstBurstLength 16 KiB), then two R2T bursts of 16 KiB.
    let mut h = Harness::new(params(), 16, Config::default());
    let data: Vec<u8> = (0..48 * 1024).map(|i| (i / 1024) as u8).collect();
    let data = Bytes::from(data);
    let id = h.write(data.clone());
    let (cmd, imm) = h.commands().pop().unwrap();
    assert!(cmd.write && !cmd.final_bit, "unsolicited Data-Out follows");
    assert_eq!((cmd.expected_len, imm.len()), (49152, 8192));
    let unsol = h.data_outs();
    assert_eq!(unsol.len(), 1);
    assert_eq!(
        (
            unsol[0].0.ttt,
            unsol[0].0.buffer_offset,
            unsol[0].0.final_bit
        ),
        (RESERVED_TAG, 8192, true)
    );
    for (i, offset) in [16384u32, 32768].into_iter().enumerate() {
        let r = R2t {
            lun: 0,
            itt: cmd.itt,
            ttt: 0x77 + i as u32,
            stat_sn: 100,
            exp_cmd_sn: 2,
            max_cmd_sn: 17,
            r2t_sn: i as u32,
            buffer_offset: offset,
            desired_len: 16384,
        };
        h.target(Pdu::R2t(r), &[]);
        let outs = h.data_outs();
        assert_eq!(outs.len(), 2, "16 KiB in 8 KiB PDUs");
        for (n, (d, bytes)) in outs.iter().enumerate() {
            assert_eq!(d.ttt, 0x77 + i as u32);
            assert_eq!(d.data_sn, n as u32, "DataSN from 0 in each sequence");
            assert_eq!(d.final_bit, n == 1);
            let off = d.buffer_offset as usize;
            assert_eq!(off, offset as usize + n * 8192);
            assert_eq!(&bytes[..], &data[off..off + 8192]);
            // Without a copy: a slice of the caller's data.
            assert_eq!(bytes.as_ptr(), data[off..].as_ptr());
        }
    }
    h.respond(cmd.itt, 0, 17);
    assert_eq!(h.result(id).status, 0);
}

#[test]
fn a_write_without_immediate_data_waits_for_its_r2ts() {
    let p = SessionParams {
        initial_r2t: true,
        immediate_data: false,
        ..params()
    };
    let mut h = Harness::new(p, 16, Config::default());
    let id = h.write(Bytes::from(vec![5u8; 20000]));
    let (cmd, imm) = h.commands().pop().unwrap();
    assert!(imm.is_empty() && cmd.final_bit);
    assert!(h.data_outs().is_empty(), "no unsolicited data");
    let r = R2t {
        lun: 0,
        itt: cmd.itt,
        ttt: 9,
        stat_sn: 100,
        exp_cmd_sn: 2,
        max_cmd_sn: 17,
        r2t_sn: 0,
        buffer_offset: 0,
        desired_len: 20000,
    };
    h.target(Pdu::R2t(r), &[]);
    let lens: Vec<usize> = h.data_outs().iter().map(|(_, b)| b.len()).collect();
    assert_eq!(lens, [8192, 8192, 3616]);
    h.respond(cmd.itt, 0, 17);
    assert_eq!(h.result(id).status, 0);
}

#[test]
fn commands_wait_while_the_window_is_full_and_go_when_max_cmd_sn_opens_it() {
    // MaxCmdSN 2: two commands may go.
    let mut h = Harness::new(params(), 2, Config::default());
    let ids: Vec<RequestId> = (0..4).map(|_| h.read(512, Vec::new())).collect();
    let sent = h.commands();
    assert_eq!(
        sent.iter().map(|(c, _)| c.cmd_sn).collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(!h.c.window().is_open());
    // A response that keeps MaxCmdSN where it is opens nothing.
    h.respond(sent[0].0.itt, 0, 2);
    assert!(h.commands().is_empty());
    // MaxCmdSN 3: one more.
    h.respond(sent[1].0.itt, 0, 3);
    let more = h.commands();
    assert_eq!(more.iter().map(|(c, _)| c.cmd_sn).collect::<Vec<_>>(), [3]);
    // A NOP-In can open it too.
    let nop = NopIn {
        lun: 0,
        itt: RESERVED_TAG,
        ttt: RESERVED_TAG,
        stat_sn: h.stat_sn,
        exp_cmd_sn: 3,
        max_cmd_sn: 10,
    };
    h.target(Pdu::NopIn(nop), &[]);
    assert_eq!(h.commands()[0].0.cmd_sn, 4);
    assert_eq!(h.result(ids[0]).status, 0);
    assert_eq!(h.result(ids[1]).status, 0);
}

#[test]
fn abort_task_ends_the_command_it_names() {
    let mut h = Harness::new(params(), 16, Config::default());
    let read = h.read(4096, Vec::new());
    let (cmd, _) = h.commands().pop().unwrap();
    let abort = h.submit(Request::AbortTask { task: read });
    let tmf: TaskMgmtRequest = match h.sent.pop() {
        Some((Pdu::TaskMgmtRequest(t), _)) => t,
        other => panic!("{other:?}"),
    };
    assert_eq!(tmf.function, TmfFunction::AbortTask);
    assert!(tmf.immediate);
    assert_eq!(
        (tmf.referenced_task_tag, tmf.ref_cmd_sn),
        (cmd.itt, cmd.cmd_sn)
    );
    assert_eq!(tmf.cmd_sn, 2, "immediate: takes no CmdSN");
    let resp = TaskMgmtResponse {
        response: 0,
        itt: tmf.itt,
        stat_sn: 100,
        exp_cmd_sn: 2,
        max_cmd_sn: 17,
    };
    h.target(Pdu::TaskMgmtResponse(resp), &[]);
    assert!(matches!(h.answer(read), Err(Error::Aborted)));
    assert!(matches!(h.answer(abort), Ok(Answer::TaskManagement(0))));
    // A task already answered: nothing to abort.
    let abort = h.submit(Request::AbortTask { task: read });
    assert!(matches!(h.answer(abort), Ok(Answer::TaskManagement(1))));
    assert!(h.sent.is_empty());
}

#[test]
fn the_target_is_pinged_when_silent_and_the_connection_closes_without_an_answer() {
    let config = Config {
        nop_interval: Some(Duration::from_secs(5)),
        nop_timeout: Duration::from_secs(2),
        ..Config::default()
    };
    let mut h = Harness::new(params(), 16, config);
    assert_eq!(h.c.poll_timeout(), Some(h.now + Duration::from_secs(5)));
    h.now += Duration::from_secs(5);
    h.event(Event::Timer);
    let ping = match h.sent.pop() {
        Some((Pdu::NopOut(n), _)) => n,
        other => panic!("expected a NOP-Out, got {other:?}"),
    };
    assert!(ping.itt != RESERVED_TAG && ping.ttt == RESERVED_TAG);
    // Answered: quiet again until the next interval.
    let pong = NopIn {
        lun: 0,
        itt: ping.itt,
        ttt: RESERVED_TAG,
        stat_sn: 100,
        exp_cmd_sn: 1,
        max_cmd_sn: 16,
    };
    h.target(Pdu::NopIn(pong), &[]);
    assert_eq!(h.c.poll_timeout(), Some(h.now + Duration::from_secs(5)));
    // The target's own ping is answered with its TTT.
    let theirs = NopIn {
        lun: 0,
        itt: RESERVED_TAG,
        ttt: 0x55,
        stat_sn: 101,
        exp_cmd_sn: 1,
        max_cmd_sn: 16,
    };
    h.target(Pdu::NopIn(theirs), &[]);
    match h.sent.pop() {
        Some((Pdu::NopOut(n), _)) => assert_eq!((n.itt, n.ttt), (RESERVED_TAG, 0x55)),
        other => panic!("{other:?}"),
    }
    // Silent again: pinged, and no answer within the timeout closes it.
    let id = h.read(512, Vec::new());
    h.now += Duration::from_secs(5);
    h.event(Event::Timer);
    assert!(matches!(h.sent.pop(), Some((Pdu::NopOut(_), _))));
    h.now += Duration::from_secs(2);
    h.event(Event::Timer);
    let closed = h.closed.clone().expect("closed");
    assert!(matches!(
        closed,
        Some(Error::Timeout {
            phase: Phase::Ping,
            ..
        })
    ));
    assert!(matches!(h.answer(id), Err(Error::Timeout { .. })));
    assert!(h.c.is_closed());
}

#[test]
fn a_request_that_times_out_closes_the_connection_for_all() {
    let config = Config {
        timeout: Some(Duration::from_secs(3)),
        ..Config::default()
    };
    let mut h = Harness::new(params(), 16, config);
    let first = h.read(512, Vec::new());
    h.now += Duration::from_secs(1);
    let second = h.submit(Request::Text(vec![("SendTargets".into(), "All".into())]));
    // The first one's deadline is the next wake-up.
    assert_eq!(h.c.poll_timeout(), Some(h.now + Duration::from_secs(2)));
    h.now += Duration::from_secs(2);
    h.event(Event::Timer);
    for id in [first, second] {
        match h.answer(id) {
            Err(Error::Timeout { phase, after }) => {
                assert_eq!(phase, Phase::Command { opcode: 0x28 });
                assert_eq!(after, Duration::from_secs(3));
            }
            other => panic!("{other:?}"),
        }
    }
    // Later requests fail at once.
    let late = h.read(512, Vec::new());
    assert!(matches!(h.answer(late), Err(Error::Timeout { .. })));
}

#[test]
fn a_target_reject_fails_the_rejected_command_only() {
    let mut h = Harness::new(params(), 16, Config::default());
    let bad = h.read(512, Vec::new());
    let good = h.read(512, Vec::new());
    let sent = h.commands();
    let rejected = Pdu::ScsiCommand(sent[0].0.clone()).encode(0);
    let r = Reject {
        reason: reject_reason::PROTOCOL_ERROR,
        stat_sn: 100,
        exp_cmd_sn: 2,
        max_cmd_sn: 17,
        data_sn: 0,
    };
    h.target(Pdu::Reject(r), &rejected.0);
    assert!(matches!(
        h.answer(bad),
        Err(Error::Rejected(reject_reason::PROTOCOL_ERROR))
    ));
    assert!(h.closed.is_none());
    h.respond(sent[1].0.itt, 0, 17);
    assert_eq!(h.result(good).status, 0);
}

#[test]
fn text_answers_in_pieces_are_asked_for_and_joined() {
    let mut h = Harness::new(params(), 16, Config::default());
    let id = h.submit(Request::Text(vec![("SendTargets".into(), "All".into())]));
    let req = match h.sent.pop() {
        Some((Pdu::TextRequest(t), d)) => {
            assert_eq!(&d[..], b"SendTargets=All\0");
            t
        }
        other => panic!("{other:?}"),
    };
    let piece = |continue_bit, final_bit| {
        Pdu::TextResponse(ethersan_proto::pdu::TextResponse {
            final_bit,
            continue_bit,
            lun: 0,
            itt: req.itt,
            ttt: 0x31,
            stat_sn: 100,
            exp_cmd_sn: 2,
            max_cmd_sn: 17,
        })
    };
    h.target(piece(true, false), b"TargetName=iqn.x:a\0TargetAdd");
    match h.sent.pop() {
        Some((Pdu::TextRequest(t), d)) => assert!(d.is_empty() && t.ttt == 0x31),
        other => panic!("{other:?}"),
    }
    h.target(piece(false, true), b"ress=10.0.0.1:3260,1\0");
    match h.answer(id) {
        Ok(Answer::Text(keys)) => assert_eq!(keys.len(), 2),
        other => panic!("{other:?}"),
    }
}

#[test]
fn logout_closes_the_connection_then_answers() {
    let mut h = Harness::new(params(), 16, Config::default());
    let id = h.submit(Request::Logout);
    let req = match h.sent.pop() {
        Some((Pdu::LogoutRequest(l), _)) => l,
        other => panic!("{other:?}"),
    };
    let resp = LogoutResponse {
        response: 0,
        itt: req.itt,
        stat_sn: 100,
        exp_cmd_sn: 1,
        max_cmd_sn: 16,
        time2wait: 0,
        time2retain: 0,
    };
    h.c.handle(
        Event::Pdu(RawPdu {
            bhs: Pdu::LogoutResponse(resp).encode(0),
            ahs: Vec::new(),
            data: Vec::new(),
        }),
        h.now,
    );
    assert!(matches!(h.c.poll_output(), Some(Output::Close(None))));
    assert!(matches!(
        h.c.poll_output(),
        Some(Output::Complete(i, Ok(Answer::LoggedOut))) if i == id
    ));
    assert!(h.c.is_closed() && h.c.poll_timeout().is_none());
}

/// The login state machine against proto's target negotiator, with
/// mutual CHAP: every Login Request the initiator sends is answered as
/// the target's login code does.
#[test]
fn login_with_mutual_chap_against_the_target_negotiator() {
    use ethersan_proto::chap::{Credentials, InitiatorChap};
    let ini = Credentials::new("ini", b"initiator-secret-1").unwrap();
    let tgt = Credentials::new("tgt", b"target-secret-123").unwrap();
    let mut target = TargetNegotiator::new(TargetSettings {
        auth: AuthPolicy::Chap {
            initiator: ini.clone(),
            target: Some(tgt.clone()),
        },
        ..TargetSettings::default()
    })
    .with_nonce(7, [3; ethersan_proto::chap::CHALLENGE_LEN]);
    let neg = InitiatorNegotiator::new(InitiatorSettings {
        target_name: Some("iqn.2026-11.org.ethersan:sm".into()),
        ..InitiatorSettings::default()
    })
    .with_chap(InitiatorChap::new(
        ini,
        Some(tgt),
        9,
        [4; ethersan_proto::chap::CHALLENGE_LEN],
    ));
    let mut login = crate::login::Login::new(neg, [0x80, 0, 0, 0, 1, 2]);
    let mut stat_sn = 50;
    let mut rounds = 0;
    let done = loop {
        rounds += 1;
        assert!(rounds < 10, "the login does not end");
        let t = login.poll_transmit().expect("a Login Request");
        let Ok(Pdu::LoginRequest(req)) = Pdu::decode(&t.bhs) else {
            panic!("not a Login Request")
        };
        let keys = parse_text(&t.data, &Default::default()).unwrap();
        let answer = if req.csg == 0 {
            target.security_keys(&keys)
        } else {
            target.operational_keys(&keys)
        }
        .unwrap();
        let transit = req.transit && target.can_transit(req.csg, req.nsg);
        let resp = LoginResponse {
            transit,
            csg: req.csg,
            nsg: if transit { req.nsg } else { 0 },
            isid: req.isid,
            tsih: 0x42,
            itt: req.itt,
            stat_sn,
            exp_cmd_sn: 1,
            max_cmd_sn: 32,
            ..LoginResponse::default()
        };
        stat_sn += 1;
        let data = encode_text(&answer);
        let raw = RawPdu {
            bhs: Pdu::LoginResponse(resp).encode(data.len() as u32),
            ahs: Vec::new(),
            data,
        };
        if let Some(done) = login.handle(raw).unwrap() {
            break done;
        }
    };
    assert_eq!(done.tsih, 0x42);
    assert_eq!(done.window, CmdSnWindow::new(1, 32));
    assert_eq!(done.exp_stat_sn, stat_sn);
    let tp = target.finish().unwrap();
    let ip = &done.params;
    assert_eq!(
        (
            ip.max_burst_length,
            ip.first_burst_length,
            ip.immediate_data,
            ip.initial_r2t
        ),
        (
            tp.max_burst_length,
            tp.first_burst_length,
            tp.immediate_data,
            tp.initial_r2t
        )
    );
    assert_eq!(ip.max_data_out_segment(), tp.max_data_out_segment());
    assert_eq!(ip.max_data_in_segment(), tp.max_data_in_segment());
}

#[test]
fn a_refused_login_says_why() {
    let neg = InitiatorNegotiator::new(InitiatorSettings::default());
    let mut login = crate::login::Login::new(neg, [0x80, 0, 0, 0, 1, 2]);
    let t = login.poll_transmit().unwrap();
    let Ok(Pdu::LoginRequest(req)) = Pdu::decode(&t.bhs) else {
        panic!()
    };
    let resp = LoginResponse {
        itt: req.itt,
        status_class: 2,
        status_detail: 1,
        ..LoginResponse::default()
    };
    let raw = RawPdu {
        bhs: Pdu::LoginResponse(resp).encode(0),
        ahs: Vec::new(),
        data: Vec::new(),
    };
    assert!(matches!(
        login.handle(raw),
        Err(Error::LoginRefused {
            class: 2,
            detail: 1
        })
    ));
}
