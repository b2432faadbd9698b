use std::time::{Duration, Instant};

use super::*;
use crate::fabrics::{ConnectData, CATTR_DISABLE_SQ_FLOW_CONTROL};
use crate::pdu::{decode, FatalErrorStatus, H2cData, IcReq, PduType};

struct Host {
    q: Queue,
    framing: Framing,
    now: Instant,
}

fn decode_all(bytes: &[u8], f: &Framing) -> Vec<(Pdu, Vec<u8>)> {
    let f = Framing {
        max_data: u32::MAX,
        ..*f
    };
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let ty = PduType::from_u8(bytes[at]).expect("known type");
        let fr = if ty.digestible() {
            f
        } else {
            Framing::plain(u32::MAX)
        };
        let d = decode(&bytes[at..], &fr).unwrap().expect("whole PDU");
        out.push((d.pdu, bytes[at..][d.data].to_vec()));
        at += d.len;
    }
    out
}

impl Host {
    fn new(config: QueueConfig, maxr2t: u32, digests: bool) -> Self {
        let mut h = Host {
            q: Queue::new(config),
            framing: Framing::plain(0),
            now: Instant::now(),
        };
        let req = Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            header_digest: digests,
            data_digest: digests,
            maxr2t,
        });
        let ev = h.send(req, &[]).event;
        let Some(Event::Connected { rx, .. }) = ev else {
            panic!("not connected: {ev:?}")
        };
        assert_eq!(rx.header_digest, digests);
        let sent = h.take();
        let Pdu::IcResp(resp) = sent[0].0 else {
            panic!("no ICResp")
        };
        assert_eq!(resp.maxh2cdata, config.max_h2c_data);
        h.framing = Framing {
            header_digest: resp.header_digest,
            data_digest: resp.data_digest,
            pda: resp.cpda,
            max_data: 0,
        };
        h
    }

    fn send(&mut self, pdu: Pdu, data: &[u8]) -> Received {
        let mut b = Vec::new();
        pdu.encode(data, &self.framing, &mut b).unwrap();
        let r = self.q.receive(&b, self.now).expect("whole PDU");
        assert_eq!(r.consumed, b.len());
        r
    }

    fn take(&mut self) -> Vec<(Pdu, Vec<u8>)> {
        let mut out = Vec::new();
        self.q.poll_transmit(&mut out);
        decode_all(&out, &self.framing)
    }

    fn connect(&mut self, qid: u16, cattr: u8, kato: u32) {
        let c = FabricsCommand::Connect(Connect {
            recfmt: 0,
            qid,
            sqsize: 31,
            cattr,
            kato,
        });
        let mut sqe = c.to_sqe(0);
        sqe.set_sgl(Sgl::InCapsule {
            offset: 0,
            len: 1024,
        });
        let data = ConnectData {
            host_id: [1; 16],
            cntlid: 0xFFFF,
            subnqn: "nqn.test:sub".into(),
            hostnqn: "nqn.test:host".into(),
        }
        .encode();
        let mut b = Vec::new();
        Pdu::CapsuleCmd(sqe)
            .encode(&data, &self.framing, &mut b)
            .unwrap();
        let r = self.q.receive(&b, self.now).unwrap();
        let Some(Event::Command {
            data: CommandData::InCapsule(range),
            ..
        }) = r.event
        else {
            panic!("{r:?}")
        };
        assert_eq!(
            ConnectData::parse(&b[range]).unwrap().hostnqn,
            "nqn.test:host"
        );
        let mut out = Vec::new();
        self.q
            .complete(Completion::new(0, Status::SUCCESS), &mut out)
            .unwrap();
    }

    fn write_cmd(&mut self, cid: u16, len: u32) -> Received {
        let mut sqe = Sqe::new(0x01, cid);
        sqe.set_nsid(1);
        sqe.set_sgl(Sgl::Transport { len });
        self.send(Pdu::CapsuleCmd(sqe), &[])
    }

    fn r2ts(&mut self) -> Vec<R2t> {
        self.take()
            .into_iter()
            .map(|(p, _)| match p {
                Pdu::R2t(r) => r,
                other => panic!("expected R2T, got {other:?}"),
            })
            .collect()
    }

    fn fatal_status(&mut self, r: Received) -> (FatalErrorStatus, u32) {
        let Some(Event::Fatal(e)) = r.event else {
            panic!("not fatal: {r:?}")
        };
        assert!(self.q.is_closed());
        let sent = self.take();
        let Pdu::C2hTermReq(t) = sent[0].0 else {
            panic!("no C2HTermReq")
        };
        let s = e.fatal_status();
        assert_eq!((t.fes, t.fei), (s.fes as u16, s.fei));
        (s.fes, s.fei)
    }
}

fn small_r2t() -> QueueConfig {
    QueueConfig {
        r2t_len: 4096,
        max_h2c_data: 4096,
        ..QueueConfig::default()
    }
}

#[test]
fn write_with_several_r2ts_outstanding() {
    for digests in [false, true] {
        // MAXR2T 1 (0's based): two R2Ts per command at a time.
        let mut h = Host::new(small_r2t(), 1, digests);
        h.connect(1, 0, 0);
        let r = h.write_cmd(5, 16384);
        assert!(matches!(
            r.event,
            Some(Event::Command {
                data: CommandData::Awaiting { len: 16384 },
                ..
            })
        ));
        let first = h.r2ts();
        assert_eq!(first.len(), 2);
        assert_eq!((first[0].r2to, first[0].r2tl), (0, 4096));
        assert_eq!((first[1].r2to, first[1].r2tl), (4096, 4096));
        assert_ne!(first[0].ttag, first[1].ttag);
        let mut placed = Vec::new();
        let mut pending = first;
        while let Some(r) = pending.first().copied() {
            pending.remove(0);
            let data = vec![r.r2to as u8; r.r2tl as usize];
            let d = H2cData {
                cccid: 5,
                ttag: r.ttag,
                datao: r.r2to,
                last: true,
            };
            let got = h.send(Pdu::H2cData(d), &data);
            let Some(Event::Data {
                cid,
                offset,
                complete,
                ..
            }) = got.event
            else {
                panic!("{got:?}")
            };
            assert_eq!((cid, offset), (5, r.r2to));
            placed.push((offset, complete));
            pending.extend(h.r2ts());
        }
        assert_eq!(
            placed,
            [(0, false), (4096, false), (8192, false), (12288, true)],
            "digests {digests}"
        );
        let mut out = Vec::new();
        h.q.complete(Completion::new(5, Status::SUCCESS), &mut out)
            .unwrap();
        let resp = decode_all(&out, &h.framing);
        let Pdu::CapsuleResp(cqe) = resp[0].0 else {
            panic!()
        };
        assert_eq!((cqe.cid, cqe.sqid, cqe.sqhd), (5, 1, 2));
        assert_eq!(h.q.in_flight(), 0);
    }
}

#[test]
fn h2c_data_split_within_one_r2t() {
    let cfg = QueueConfig {
        r2t_len: 8192,
        max_h2c_data: 4096,
        ..QueueConfig::default()
    };
    let mut h = Host::new(cfg, 0, false);
    h.connect(1, 0, 0);
    h.write_cmd(1, 8192);
    let r = h.r2ts()[0];
    assert_eq!(r.r2tl, 8192);
    let mk = |datao, last| {
        Pdu::H2cData(H2cData {
            cccid: 1,
            ttag: r.ttag,
            datao,
            last,
        })
    };
    let a = h.send(mk(0, false), &[0; 4096]);
    assert!(matches!(
        a.event,
        Some(Event::Data {
            complete: false,
            ..
        })
    ));
    let b = h.send(mk(4096, true), &[0; 4096]);
    assert!(matches!(
        b.event,
        Some(Event::Data {
            offset: 4096,
            complete: true,
            ..
        })
    ));
}

#[test]
fn wrong_ttag_is_fatal() {
    let mut h = Host::new(small_r2t(), 0, false);
    h.connect(1, 0, 0);
    h.write_cmd(1, 4096);
    let r = h.r2ts()[0];
    let d = H2cData {
        cccid: 1,
        ttag: r.ttag.wrapping_add(1),
        datao: 0,
        last: true,
    };
    let got = h.send(Pdu::H2cData(d), &[0; 4096]);
    assert_eq!(
        h.fatal_status(got),
        (FatalErrorStatus::InvalidHeaderField, 10)
    );
    assert!(h.q.receive(&[0; 8], h.now).is_none(), "closed");
}

#[test]
fn data_past_the_r2t_is_out_of_range() {
    let mut h = Host::new(small_r2t(), 0, false);
    h.connect(1, 0, 0);
    h.write_cmd(1, 2048);
    let r = h.r2ts()[0];
    let d = H2cData {
        cccid: 1,
        ttag: r.ttag,
        datao: 1024,
        last: true,
    };
    let got = h.send(Pdu::H2cData(d), &[0; 2048]);
    assert_eq!(h.fatal_status(got).0, FatalErrorStatus::DataOutOfRange);
}

#[test]
fn out_of_order_and_early_last_are_sequence_errors() {
    let cfg = QueueConfig {
        r2t_len: 8192,
        ..small_r2t()
    };
    for (datao, last) in [(4096, false), (0, true)] {
        let mut h = Host::new(cfg, 0, false);
        h.connect(1, 0, 0);
        h.write_cmd(1, 8192);
        let r = h.r2ts()[0];
        let d = H2cData {
            cccid: 1,
            ttag: r.ttag,
            datao,
            last,
        };
        let got = h.send(Pdu::H2cData(d), &[0; 4096]);
        assert_eq!(h.fatal_status(got).0, FatalErrorStatus::PduSequenceError);
    }
}

#[test]
fn h2c_data_above_maxh2cdata_exceeds_the_limit() {
    let cfg = QueueConfig {
        r2t_len: 16384,
        ..small_r2t()
    };
    let mut h = Host::new(cfg, 0, false);
    h.connect(1, 0, 0);
    h.write_cmd(1, 8192);
    let r = h.r2ts()[0];
    let d = H2cData {
        cccid: 1,
        ttag: r.ttag,
        datao: 0,
        last: true,
    };
    let got = h.send(Pdu::H2cData(d), &[0; 8192]);
    assert_eq!(h.fatal_status(got).0, FatalErrorStatus::DataLimitExceeded);
}

#[test]
fn data_digest_failure_fails_the_command_after_its_data() {
    let mut h = Host::new(small_r2t(), 0, true);
    h.connect(1, 0, 0);
    h.write_cmd(1, 4096);
    let r = h.r2ts()[0];
    let d = Pdu::H2cData(H2cData {
        cccid: 1,
        ttag: r.ttag,
        datao: 0,
        last: true,
    });
    let mut b = Vec::new();
    d.encode(&[3; 4096], &h.framing, &mut b).unwrap();
    let n = b.len();
    b[n - 1] ^= 0xFF; // the data digest
    let got = h.q.receive(&b, h.now).unwrap();
    assert_eq!(
        got.event,
        Some(Event::Failed {
            cid: 1,
            status: Status::TRANSIENT_TRANSPORT_ERROR
        })
    );
    assert!(!h.q.is_closed());
}

#[test]
fn read_split_into_c2h_data() {
    let cfg = QueueConfig {
        c2h_data_len: 1000,
        ..QueueConfig::default()
    };
    let mut h = Host::new(cfg, 0, true);
    h.connect(1, 0, 0);
    let mut sqe = Sqe::new(0x02, 9);
    sqe.set_sgl(Sgl::Transport { len: 4096 });
    let got = h.send(Pdu::CapsuleCmd(sqe), &[]);
    assert!(matches!(
        got.event,
        Some(Event::Command {
            data: CommandData::ToHost { len: 4096 },
            ..
        })
    ));
    let data: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
    let mut out = Vec::new();
    h.q.send_read(Completion::new(9, Status::SUCCESS), &data, &mut out)
        .unwrap();
    let pdus = decode_all(&out, &h.framing);
    assert_eq!(pdus.len(), 4, "three data PDUs and the response");
    let mut joined = Vec::new();
    for (i, (p, d)) in pdus[..3].iter().enumerate() {
        let Pdu::C2hData(c) = p else { panic!("{p:?}") };
        assert_eq!(c.datao as usize, i * 1000);
        assert_eq!(c.last, i == 2);
        assert!(!c.success, "SQ flow control is on");
        joined.extend_from_slice(d);
    }
    assert_eq!(joined, data);
    assert!(matches!(pdus[3].0, Pdu::CapsuleResp(c) if c.cid == 9 && c.sqhd == 2));
    assert_eq!(
        h.q.c2h_data(9, 1, Status::SUCCESS),
        Err(QueueError::UnknownCommand(9))
    );
}

#[test]
fn success_flag_without_sq_flow_control() {
    let mut h = Host::new(QueueConfig::default(), 0, false);
    h.connect(1, CATTR_DISABLE_SQ_FLOW_CONTROL, 0);
    assert_eq!(h.q.sqhd(), 0xFFFF);
    let mut sqe = Sqe::new(0x02, 4);
    sqe.set_sgl(Sgl::Transport { len: 512 });
    h.send(Pdu::CapsuleCmd(sqe), &[]);
    let plan = h.q.c2h_data(4, 512, Status::SUCCESS).unwrap();
    assert!(!plan.response_needed);
    assert!(matches!(plan.pdus[0].0, Pdu::C2hData(c) if c.success && c.last));
    assert_eq!(h.q.in_flight(), 0);
    // A failed read still gets its response.
    let mut sqe = Sqe::new(0x02, 5);
    sqe.set_sgl(Sgl::Transport { len: 512 });
    h.send(Pdu::CapsuleCmd(sqe), &[]);
    let plan =
        h.q.c2h_data(5, 512, Status::UNRECOVERED_READ_ERROR)
            .unwrap();
    assert!(plan.response_needed);
    assert!(matches!(plan.pdus[0].0, Pdu::C2hData(c) if !c.success && c.last));
    assert_eq!(
        h.q.c2h_data(5, 513, Status::SUCCESS),
        Err(QueueError::TooMuchData { len: 513, max: 512 })
    );
}

#[test]
fn sqhd_wraps_at_the_queue_size() {
    let mut h = Host::new(QueueConfig::default(), 0, false);
    h.connect(1, 0, 0); // SQSIZE 31: 32 entries
    let mut last = 0;
    for cid in 1..40u16 {
        h.send(Pdu::CapsuleCmd(Sqe::new(0x00, cid)), &[]);
        last = h.q.sqhd();
        let mut out = Vec::new();
        h.q.complete(Completion::new(cid, Status::SUCCESS), &mut out)
            .unwrap();
    }
    assert_eq!(last, 40 % 32);
}

#[test]
fn queue_answers_conflicts_and_commands_before_connect() {
    let mut h = Host::new(QueueConfig::default(), 0, false);
    let got = h.send(Pdu::CapsuleCmd(Sqe::new(0x02, 3)), &[]);
    assert_eq!(got.event, None);
    let sent = h.take();
    assert!(matches!(sent[0].0, Pdu::CapsuleResp(c) if c.status == Status::COMMAND_SEQUENCE_ERROR));
    h.connect(1, 0, 0);
    assert!(h
        .send(Pdu::CapsuleCmd(Sqe::new(0x00, 7)), &[])
        .event
        .is_some());
    assert_eq!(h.send(Pdu::CapsuleCmd(Sqe::new(0x00, 7)), &[]).event, None);
    let sent = h.take();
    assert!(matches!(sent[0].0, Pdu::CapsuleResp(c) if c.status == Status::COMMAND_ID_CONFLICT));
    let mut bad = Sqe::new(0x01, 8);
    bad.0[39] = 0x40; // keyed SGL
    assert_eq!(h.send(Pdu::CapsuleCmd(bad), &[]).event, None);
    assert!(matches!(h.take()[0].0, Pdu::CapsuleResp(c) if c.status == Status::SGL_TYPE_INVALID));
}

#[test]
fn sequence_errors_and_host_termination() {
    let mut q = Queue::new(QueueConfig::default());
    let mut b = Vec::new();
    Pdu::CapsuleCmd(Sqe::new(0, 1))
        .encode(&[], &Framing::plain(0), &mut b)
        .unwrap();
    let r = q.receive(&b, Instant::now()).unwrap();
    assert!(matches!(r.event, Some(Event::Fatal(PduError::Sequence(_)))));
    let mut h = Host::new(QueueConfig::default(), 0, false);
    let got = h.send(Pdu::H2cTermReq(TermReq { fes: 1, fei: 0 }), &[]);
    assert!(matches!(got.event, Some(Event::HostTerminated(_))));
    assert!(h.q.is_closed());
}

#[test]
fn keep_alive_from_admin_connect() {
    let mut h = Host::new(QueueConfig::default(), 0, false);
    h.connect(0, 0, 2000);
    let t0 = h.now;
    assert_eq!(h.q.poll_timeout(), Some(t0 + Duration::from_secs(2)));
    assert!(!h.q.on_tick(t0 + Duration::from_millis(1500)));
    h.now = t0 + Duration::from_millis(1500);
    h.send(Pdu::CapsuleCmd(Sqe::new(0x18, 2)), &[]); // Keep Alive
    assert!(!h.q.on_tick(t0 + Duration::from_millis(3000)));
    assert!(h.q.on_tick(t0 + Duration::from_millis(3500)));
}
