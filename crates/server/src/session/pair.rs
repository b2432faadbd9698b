//! The initiator's connection state machine (`ethersan_initiator::conn`)
//! coupled to this target session in memory, in the manner of
//! quinn-proto's `Pair`: what one side sends is handed to the other, time
//! is passed in, commands run on the target core's executor inline. No
//! sockets, no tasks, no clock: whole exchanges run deterministically.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ethersan_core::executor::{Executor, Inline};
use ethersan_initiator::conn::{self, Answer, Connection, Output, Request, RequestId};
use ethersan_initiator::{CommandResult, Error, Phase};
use ethersan_proto::negotiate::{SessionParams, SessionType};
use ethersan_proto::pdu::{reject_reason, Pdu, RawPdu, TmfFunction};
use ethersan_proto::seq::CmdSnWindow;
use ethersan_scsi::Nexus;

use super::{Event, Session, SessionOptions, SessionSetup};
use crate::registry::Registry;
use crate::wire::WriterMsg;

const IQN: &str = "iqn.2026-11.org.ethersan:sm";

/// An initiator connection and a target session, linked.
struct Pair {
    target: Session,
    executor: Executor,
    initiator: Connection,
    now: Instant,
    /// PDUs on their way to the target / to the initiator.
    to_target: VecDeque<RawPdu>,
    to_initiator: VecDeque<RawPdu>,
    /// Answers the initiator gave its callers.
    answers: Vec<(RequestId, Result<Answer, Error>)>,
    /// Every PDU the initiator sent, decoded (for the assertions).
    initiator_sent: Vec<Pdu>,
    /// Drop what the target sends (a dead target).
    target_silent: bool,
    initiator_closed: Option<Option<Error>>,
    next_id: u64,
}

impl Pair {
    /// A session negotiated as `params` with a CmdSN window `depth` wide;
    /// `discovery`: a discovery session (no target).
    fn new(params: SessionParams, depth: u32, discovery: bool, config: conn::Config) -> Pair {
        let t = super::tests::target();
        let registry = Arc::new(Registry::new(vec![t.clone()], vec![]));
        let setup = SessionSetup {
            counters: Arc::default(),
            channel_level: None,
            placed_writes: false,
            id: 1,
            target: (!discovery).then_some(t),
            params: SessionParams {
                session_type: if discovery {
                    SessionType::Discovery
                } else {
                    SessionType::Normal
                },
                ..params.clone()
            },
            nexus: Nexus(7),
            exp_cmd_sn: 1,
            stat_sn: 100,
            options: SessionOptions {
                queue_depth: depth,
                nop_interval: Some(Duration::from_secs(30)),
                nop_timeout: Duration::from_secs(10),
                inline_io: true,
                max_key_text: 65536,
                memory_budget: 128 << 20,
            },
            peer_ip: None,
            local_addr: None,
        };
        let now = Instant::now();
        let releases = super::Releases::new(Box::new(|| {}));
        let mut target = Session::new(setup, registry, releases, now);
        target.begin();
        // What the Login Response said: ExpCmdSN 1, MaxCmdSN 1 + depth - 1.
        let window = CmdSnWindow::new(1, depth);
        let initiator = Connection::new(params, window, 100, config, now);
        let mut p = Pair {
            target,
            executor: Executor { inline_io: true },
            initiator,
            now,
            to_target: VecDeque::new(),
            to_initiator: VecDeque::new(),
            answers: Vec::new(),
            initiator_sent: Vec::new(),
            target_silent: false,
            initiator_closed: None,
            next_id: 0,
        };
        if !discovery {
            // The POWER ON unit attention.
            let id = p.submit(test_unit_ready());
            assert_eq!(p.result(id).sense_key().map(|k| k.0), Some(6));
        }
        p
    }

    fn submit(&mut self, req: Request) -> RequestId {
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.initiator
            .handle(conn::Event::Submit(id, req), self.now);
        self.drive();
        id
    }

    /// Move PDUs both ways until neither side has anything to say.
    fn drive(&mut self) {
        loop {
            while let Some(o) = self.initiator.poll_output() {
                match o {
                    Output::Send(t) => {
                        self.initiator_sent.push(Pdu::decode(&t.bhs).unwrap());
                        self.to_target.push_back(RawPdu {
                            bhs: t.bhs,
                            ahs: t.ahs,
                            data: t.data.to_vec(),
                        });
                    }
                    Output::Complete(id, r) => self.answers.push((id, r)),
                    Output::Close(e) => self.initiator_closed = Some(e),
                }
            }
            if self.to_target.is_empty() && self.to_initiator.is_empty() {
                return;
            }
            while let Some(raw) = self.to_target.pop_front() {
                self.target_event(Event::Pdu(Ok(raw)));
            }
            while let Some(raw) = self.to_initiator.pop_front() {
                self.initiator.handle(conn::Event::Pdu(raw), self.now);
            }
        }
    }

    /// One event for the target, then what it asks done (its driver's
    /// loop, the blocking pool inline: RAM completes at once).
    fn target_event(&mut self, ev: Event) {
        self.target.handle(ev, self.now);
        let (queue, silent) = (&mut self.to_initiator, self.target_silent);
        let mut send = |msg| {
            if let WriterMsg::Frame(f) = msg {
                if !silent {
                    queue.push_back(RawPdu {
                        bhs: f.bhs,
                        ahs: Vec::new(),
                        data: f.data.to_vec(),
                    });
                }
            }
        };
        let done: ethersan_core::executor::Done =
            Arc::new(|_, _| panic!("a RAM command finishes at once"));
        super::driver::settle(
            &mut self.target,
            &self.executor,
            &Inline,
            &mut send,
            &done,
            None,
            self.now,
        );
    }

    /// Time passes by `d`: both sides' timers run.
    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.target_event(Event::Tick);
        self.initiator.handle(conn::Event::Timer, self.now);
        self.drive();
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

    /// How many PDUs of this kind the initiator sent, forgetting them.
    fn count_sent(&mut self, is: impl Fn(&Pdu) -> bool) -> usize {
        let n = self.initiator_sent.iter().filter(|p| is(p)).count();
        self.initiator_sent.clear();
        n
    }
}

fn test_unit_ready() -> Request {
    Request::Command {
        lun: 0,
        cdb: vec![0; 6],
        data_out: Bytes::new(),
        read_len: 0,
        buffer: Vec::new(),
    }
}

fn write10(lba: u32, data: Bytes) -> Request {
    let blocks = (data.len() / 512) as u16;
    let mut cdb = vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    Request::Command {
        lun: 0,
        cdb,
        data_out: data,
        read_len: 0,
        buffer: Vec::new(),
    }
}

fn read10(lba: u32, blocks: u16, buffer: Vec<u8>) -> Request {
    let mut cdb = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    Request::Command {
        lun: 0,
        cdb,
        data_out: Bytes::new(),
        read_len: u32::from(blocks) * 512,
        buffer,
    }
}

fn negotiated(immediate_data: bool, initial_r2t: bool) -> SessionParams {
    SessionParams {
        initiator_name: "iqn.2026-11.org.ethersan:i".into(),
        target_name: Some(IQN.into()),
        immediate_data,
        initial_r2t,
        max_recv_data_segment_length: 65536,
        max_send_data_segment_length: 32768,
        max_burst_length: 262_144,
        first_burst_length: 65536,
        max_outstanding_r2t: 1,
        ..SessionParams::default()
    }
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

/// Write `len` bytes at LBA 8, read them back into a buffer of the
/// caller's, compare.
fn round_trip(p: &mut Pair, len: usize, seed: u8) {
    let data = pattern(len, seed);
    let w = p.submit(write10(8, data.clone()));
    assert_eq!(p.result(w).status, 0);
    let buffer = Vec::with_capacity(len);
    let ptr = buffer.as_ptr();
    let r = p.submit(read10(8, (len / 512) as u16, buffer));
    let r = p.result(r);
    assert_eq!(r.status, 0);
    assert_eq!(r.data, data);
    assert_eq!(
        r.data.as_ptr(),
        ptr,
        "Data-In placed into the caller's buffer"
    );
}

#[test]
fn a_write_with_immediate_data_reads_back() {
    let mut p = Pair::new(negotiated(true, false), 16, false, conn::Config::default());
    round_trip(&mut p, 256 * 1024, 1);
    // Small enough for immediate data alone: no R2T, no Data-Out.
    round_trip(&mut p, 4096, 2);
}

#[test]
fn a_write_without_immediate_data_reads_back() {
    let mut p = Pair::new(negotiated(false, true), 16, false, conn::Config::default());
    p.initiator_sent.clear();
    let data = pattern(96 * 1024, 3);
    let w = p.submit(write10(0, data.clone()));
    assert_eq!(p.result(w).status, 0);
    // Every byte solicited: 96 KiB in Data-Outs of the target's 64 KiB limit.
    assert_eq!(p.count_sent(|x| matches!(x, Pdu::DataOut(_))), 2);
    round_trip(&mut p, 8192, 4);
}

#[test]
fn a_write_larger_than_max_burst_length_takes_several_r2ts() {
    let params = SessionParams {
        max_burst_length: 65536,
        first_burst_length: 16384,
        max_outstanding_r2t: 2,
        ..negotiated(true, false)
    };
    let mut p = Pair::new(params, 16, false, conn::Config::default());
    p.initiator_sent.clear();
    let len = 1 << 20;
    let data = pattern(len, 5);
    let w = p.submit(write10(16, data));
    assert_eq!(p.result(w).status, 0);
    // 16 KiB unsolicited (immediate), then 1 MiB - 16 KiB in 64 KiB
    // bursts: 16 R2Ts, each answered by one sequence of one 64 KiB PDU
    // (the last 48 KiB).
    let outs: Vec<u32> = p
        .initiator_sent
        .iter()
        .filter_map(|x| match x {
            Pdu::DataOut(d) => Some(d.ttt),
            _ => None,
        })
        .collect();
    let mut ttts = outs.clone();
    ttts.dedup();
    assert_eq!(ttts.len(), 16, "one sequence per R2T: {outs:?}");
    round_trip(&mut p, len, 6);
}

#[test]
fn commands_beyond_the_window_wait_for_max_cmd_sn() {
    // A window two commands wide: the initiator holds the rest until the
    // target's MaxCmdSN moves; the target never drops one.
    let mut p = Pair::new(negotiated(true, false), 2, false, conn::Config::default());
    let ids: Vec<RequestId> = (0..8)
        .map(|i| {
            let id = RequestId(1000 + i);
            let req = write10(i as u32 * 8, pattern(4096, i as u8));
            p.initiator.handle(conn::Event::Submit(id, req), p.now);
            id
        })
        .collect();
    // Only two went out before any answer.
    assert_eq!(
        p.initiator.window().cmd_sn(),
        p.initiator.window().max_cmd_sn() + 1
    );
    p.drive();
    for id in ids {
        assert_eq!(p.result(id).status, 0);
    }
    assert!(p.initiator.is_idle());
    let w = p.initiator.window();
    assert_eq!(
        w.max_cmd_sn().wrapping_sub(w.cmd_sn()),
        1,
        "two free places again"
    );
}

#[test]
fn abort_task_ends_a_write_waiting_for_its_data() {
    let mut p = Pair::new(negotiated(false, true), 16, false, conn::Config::default());
    // The command and the abort reach the target before anything comes
    // back: it aborts the write while its R2T is out.
    let write = RequestId(500);
    let abort = RequestId(501);
    p.initiator.handle(
        conn::Event::Submit(write, write10(0, pattern(8192, 9))),
        p.now,
    );
    p.initiator.handle(
        conn::Event::Submit(abort, Request::AbortTask { task: write }),
        p.now,
    );
    p.drive();
    assert!(matches!(p.answer(abort), Ok(Answer::TaskManagement(0))));
    assert!(matches!(p.answer(write), Err(Error::Aborted)));
    // Nothing landed; the session goes on.
    let r = p.submit(read10(0, 16, Vec::new()));
    let r = p.result(r);
    assert_eq!(r.status, 0);
    assert!(r.data.iter().all(|b| *b == 0));
    // A LUN RESET through the same path.
    let id = p.submit(Request::TaskManagement {
        function: TmfFunction::LogicalUnitReset,
        lun: 0,
    });
    assert!(matches!(p.answer(id), Ok(Answer::TaskManagement(0))));
}

#[test]
fn the_initiator_pings_and_a_dead_target_times_out() {
    let config = conn::Config {
        nop_interval: Some(Duration::from_secs(20)),
        nop_timeout: Duration::from_secs(5),
        ..conn::Config::default()
    };
    let mut p = Pair::new(negotiated(true, false), 16, false, config);
    p.initiator_sent.clear();
    // The initiator pings after 20 s of silence; the target answers.
    p.advance(Duration::from_secs(20));
    assert_eq!(p.count_sent(|x| matches!(x, Pdu::NopOut(_))), 1);
    assert!(p.initiator_closed.is_none());
    round_trip(&mut p, 4096, 7);
    // The target goes silent: the next ping is never answered.
    p.target_silent = true;
    p.advance(Duration::from_secs(20));
    p.advance(Duration::from_secs(5));
    match p.initiator_closed.clone() {
        Some(Some(Error::Timeout { phase, .. })) => assert_eq!(phase, Phase::Ping),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_discovery_session_rejects_scsi_commands() {
    let mut p = Pair::new(negotiated(true, false), 16, true, conn::Config::default());
    let id = p.submit(Request::Text(vec![("SendTargets".into(), "All".into())]));
    match p.answer(id) {
        Ok(Answer::Text(keys)) => assert!(keys.iter().any(|(k, v)| k == "TargetName" && v == IQN)),
        other => panic!("{other:?}"),
    }
    let id = p.submit(test_unit_ready());
    assert!(matches!(
        p.answer(id),
        Err(Error::Rejected(reject_reason::PROTOCOL_ERROR))
    ));
    // (The rejected command took no CmdSN at the target; the immediate
    // logout is not held behind it.)
    let id = p.submit(Request::Logout);
    assert!(matches!(p.answer(id), Ok(Answer::LoggedOut)));
    assert!(matches!(p.initiator_closed, Some(None)));
}
