//! The host core linked with the crate's target [`Queue`] in memory: the
//! host's bytes go to `Queue::receive`, the target's back to
//! `Host::receive`, with a RAM namespace behind the target.

use std::collections::HashMap;
use std::time::Instant;

use super::commands::{self, CNTLID_DYNAMIC};
use super::parse::parse_active_namespaces;
use super::*;
use crate::command::{AdminCommand, Cns, IoCommand};
use crate::fabrics::{ConnectData, FabricsCommand, PropertySize};
use crate::identify::{active_namespace_list, ControllerInfo, NamespaceInfo};
use crate::pdu::PduType;
use crate::properties::{Capabilities, Properties, CC, CSTS, CSTS_RDY};
use crate::queue::{CommandData, Completion, Event, Queue, QueueConfig};
use crate::sqe::{Sqe, FABRICS_OPCODE};

const BS: usize = 512;

struct Target {
    q: Queue,
    props: Properties,
    disk: Vec<u8>,
    /// Writes (and Connects) waiting for their data.
    pending: HashMap<u16, (Sqe, Vec<u8>)>,
    inbox: Vec<u8>,
    out: Vec<u8>,
}

impl Target {
    fn new(config: QueueConfig) -> Self {
        Target {
            q: Queue::new(config),
            props: Properties::new(Capabilities {
                mqes: 127,
                timeout: 1,
                mpsmin: 0,
            }),
            disk: vec![0; 1 << 20],
            pending: HashMap::new(),
            inbox: Vec::new(),
            out: Vec::new(),
        }
    }

    fn run(&mut self) {
        while let Some(r) = self.q.receive(&self.inbox, Instant::now()) {
            let buf = self.inbox.clone();
            match r.event {
                Some(Event::Command { sqe, data }) => match data {
                    CommandData::Awaiting { len } => {
                        self.pending.insert(sqe.cid(), (sqe, vec![0; len as usize]));
                    }
                    CommandData::InCapsule(range) => self.execute(sqe, &buf[range]),
                    _ => self.execute(sqe, &[]),
                },
                Some(Event::Data {
                    cid,
                    offset,
                    range,
                    complete,
                }) => {
                    let (_, b) = self.pending.get_mut(&cid).expect("pending write");
                    b[offset as usize..][..range.len()].copy_from_slice(&buf[range]);
                    if complete {
                        let (sqe, b) = self.pending.remove(&cid).expect("pending");
                        self.execute(sqe, &b);
                    }
                }
                Some(Event::Failed { cid, status }) => {
                    self.q
                        .complete(Completion::new(cid, status), &mut self.out)
                        .unwrap();
                }
                Some(e) if !matches!(e, Event::Connected { .. }) => panic!("target: {e:?}"),
                _ => {}
            }
            self.inbox.drain(..r.consumed);
        }
        self.q.poll_transmit(&mut self.out);
    }

    fn done(&mut self, cid: u16, status: Status, dw0: u32) {
        let c = Completion {
            cid,
            status,
            dw0,
            dw1: 0,
        };
        self.q.complete(c, &mut self.out).unwrap();
    }

    fn read_back(&mut self, cid: u16, data: &[u8]) {
        self.q
            .send_read(Completion::new(cid, Status::SUCCESS), data, &mut self.out)
            .unwrap();
    }

    fn execute(&mut self, sqe: Sqe, data: &[u8]) {
        let cid = sqe.cid();
        if sqe.opcode() == FABRICS_OPCODE {
            match FabricsCommand::parse(&sqe).unwrap() {
                FabricsCommand::Connect(_) => {
                    let d = ConnectData::parse(data).unwrap();
                    assert_eq!(d.subnqn, "nqn.2026-11.org.ethersan:test");
                    self.done(cid, Status::SUCCESS, 1);
                }
                FabricsCommand::PropertyGet { size, offset } => {
                    let v = self.props.get(offset, size).unwrap();
                    self.done(cid, Status::SUCCESS, v as u32);
                }
                FabricsCommand::PropertySet {
                    size,
                    offset,
                    value,
                } => {
                    self.props.set(offset, size, value).unwrap();
                    self.done(cid, Status::SUCCESS, 0);
                }
                FabricsCommand::Disconnect => self.done(cid, Status::SUCCESS, 0),
            }
            return;
        }
        let admin = self.q.connect().is_some_and(|c| c.qid == 0);
        if admin {
            let page = match AdminCommand::parse(&sqe).unwrap() {
                AdminCommand::Identify { cns, .. } => match cns {
                    Cns::Controller => {
                        ControllerInfo::new("SN1", "pair", "nqn.2026-11.org.ethersan:test", 1)
                            .build()
                    }
                    Cns::Namespace => NamespaceInfo::new((self.disk.len() / BS) as u64, 9).build(),
                    Cns::ActiveNamespaces => active_namespace_list(&[1], 0),
                    Cns::NamespaceDescriptors => vec![0; 4096],
                },
                AdminCommand::KeepAlive => return self.done(cid, Status::SUCCESS, 0),
                c => panic!("unexpected {c:?}"),
            };
            return self.read_back(cid, &page);
        }
        match IoCommand::parse(&sqe).unwrap() {
            IoCommand::Read { range, .. } => {
                let at = range.slba as usize * BS;
                let data = self.disk[at..at + range.blocks as usize * BS].to_vec();
                self.read_back(cid, &data);
            }
            IoCommand::Write { range, .. } => {
                let at = range.slba as usize * BS;
                assert_eq!(data.len(), range.blocks as usize * BS);
                self.disk[at..at + data.len()].copy_from_slice(data);
                self.done(cid, Status::SUCCESS, 0);
            }
            IoCommand::Flush => self.done(cid, Status::SUCCESS, 0),
            c => panic!("unexpected {c:?}"),
        }
    }
}

/// PDU types in `bytes`, decoded with `framing` (digests as negotiated).
fn types(bytes: &[u8], framing: Framing) -> Vec<PduType> {
    let framing = Framing {
        max_data: u32::MAX,
        ..framing
    };
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let ty = PduType::from_u8(bytes[at]).expect("type");
        let f = if ty.digestible() {
            framing
        } else {
            Framing::plain(u32::MAX)
        };
        let d = crate::pdu::decode(&bytes[at..], &f)
            .unwrap()
            .expect("whole");
        out.push(ty);
        at += d.len;
    }
    out
}

struct Pair {
    host: Host,
    target: Target,
    inbox: Vec<u8>,
    /// PDU types the target sent, in order.
    sent_by_target: Vec<PduType>,
    /// PDU types the host sent, in order.
    sent_by_host: Vec<PduType>,
    /// Connect with SQ flow control disabled.
    no_sq_flow: bool,
}

impl Pair {
    fn new(hc: HostConfig, tc: QueueConfig) -> Self {
        let mut p = Pair {
            host: Host::new(hc),
            target: Target::new(tc),
            inbox: Vec::new(),
            sent_by_target: Vec::new(),
            sent_by_host: Vec::new(),
            no_sq_flow: true,
        };
        let ev = p.pump();
        assert!(matches!(ev.as_slice(), [HostEvent::Connected(_)]), "{ev:?}");
        assert!(p.host.is_ready());
        p
    }

    /// Moves bytes both ways until neither side has any to send; answers
    /// the host's events.
    fn pump(&mut self) -> Vec<HostEvent> {
        let mut events = Vec::new();
        loop {
            let mut moved = false;
            let mut b = Vec::new();
            if self.host.poll_transmit(&mut b) {
                self.sent_by_host.extend(types(&b, self.host.tx_framing()));
                self.target.inbox.extend_from_slice(&b);
                moved = true;
            }
            self.target.run();
            if !self.target.out.is_empty() {
                let out = std::mem::take(&mut self.target.out);
                self.sent_by_target
                    .extend(types(&out, self.target.q.tx_framing()));
                self.inbox.extend_from_slice(&out);
                moved = true;
            }
            while let Some(r) = self.host.receive(&self.inbox).unwrap() {
                events.extend(r.event);
                self.inbox.drain(..r.consumed);
            }
            if !moved {
                return events;
            }
        }
    }

    /// Submits `req`, runs the pair, answers its completion.
    fn call(&mut self, req: Request) -> Completed {
        let cid = self.host.submit(req).unwrap();
        let ev = self.pump();
        match ev.as_slice() {
            [HostEvent::Completed(c)] => {
                assert_eq!(c.cqe.cid, cid);
                c.clone()
            }
            other => panic!("expected one completion, got {other:?}"),
        }
    }

    fn connect(&mut self, qid: u16, cntlid: u16) -> u16 {
        let data = ConnectData {
            host_id: [1; 16],
            cntlid,
            subnqn: "nqn.2026-11.org.ethersan:test".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:test".into(),
        };
        let c = self.call(commands::connect(qid, 32, 10_000, self.no_sq_flow, &data));
        assert!(c.cqe.status.is_success(), "{:?}", c.cqe.status);
        c.cqe.dw0 as u16
    }
}

fn host_config(digests: bool) -> HostConfig {
    HostConfig {
        header_digest: digests,
        data_digest: digests,
        ..HostConfig::default()
    }
}

fn admin_session(digests: bool) {
    let mut p = Pair::new(host_config(digests), QueueConfig::default());
    assert_eq!(p.host.tx_framing().header_digest, digests);
    assert_eq!(p.target.q.tx_framing().data_digest, digests);
    assert_eq!(p.connect(0, CNTLID_DYNAMIC), 1);
    let cc = 1 | 6 << 16 | 4 << 20;
    let set = p.call(commands::property_set(CC, PropertySize::Four, cc));
    assert!(set.cqe.status.is_success());
    let csts = p.call(commands::property_get(CSTS, PropertySize::Four));
    assert_eq!(csts.cqe.dw0 & CSTS_RDY, CSTS_RDY);
    let id = p.call(commands::identify(1, 0));
    let c = ControllerInfo::parse(&id.data).unwrap();
    assert_eq!((c.serial.as_str(), c.model.as_str()), ("SN1", "pair"));
    assert_eq!(c.subnqn, "nqn.2026-11.org.ethersan:test");
    let ns = NamespaceInfo::parse(&p.call(commands::identify(0, 1)).data).unwrap();
    assert_eq!((ns.nsze, ns.block_size()), (2048, Some(512)));
    let list = p.call(commands::identify(2, 0));
    assert_eq!(parse_active_namespaces(&list.data), vec![1]);
    assert!(p.call(commands::keep_alive()).cqe.status.is_success());
    assert_eq!(p.host.in_flight(), 0);
}

#[test]
fn connect_properties_identify_without_digests() {
    admin_session(false);
}

#[test]
fn connect_properties_identify_with_digests() {
    admin_session(true);
}

fn io_session(digests: bool, c2h_success: bool, no_sq_flow: bool) {
    let tc = QueueConfig {
        max_in_capsule: 0,
        max_h2c_data: 4096,
        r2t_len: 16384,
        c2h_data_len: 8192,
        c2h_success,
        ..QueueConfig::default()
    };
    let hc = HostConfig {
        max_in_capsule: 0,
        ..host_config(digests)
    };
    let mut p = Pair::new(hc, tc);
    p.no_sq_flow = no_sq_flow;
    assert_eq!(p.host.max_h2c_data(), 4096);
    // The Connect data itself goes by R2T here (no in-capsule data).
    assert_eq!(p.connect(1, 1), 1);
    assert!(p.sent_by_target.contains(&PduType::R2t));
    p.sent_by_host.clear();
    p.sent_by_target.clear();
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 7 + i / 513) as u8).collect();
    let w = p.call(commands::write(1, 8, 128, pattern.clone(), false));
    assert!(w.cqe.status.is_success());
    let count = |v: &[PduType], t: PduType| v.iter().filter(|&&x| x == t).count();
    // 64 KiB in R2Ts of 16 KiB, each answered by 4 H2CData of 4 KiB.
    assert_eq!(count(&p.sent_by_target, PduType::R2t), 4);
    assert_eq!(count(&p.sent_by_host, PduType::H2cData), 16);
    assert_eq!(&p.target.disk[8 * BS..8 * BS + 65536], &pattern[..]);
    p.sent_by_target.clear();
    let r = p.call(commands::read(1, 8, 128, BS as u32));
    assert!(r.cqe.status.is_success());
    assert_eq!(r.data, pattern);
    assert_eq!(count(&p.sent_by_target, PduType::C2hData), 8);
    assert_eq!(
        count(&p.sent_by_target, PduType::CapsuleResp),
        usize::from(!(c2h_success && no_sq_flow))
    );
    assert!(p.call(commands::flush(1)).cqe.status.is_success());
}

#[test]
fn write_by_r2t_and_read_in_pieces_without_digests() {
    io_session(false, true, true);
}

#[test]
fn read_with_sq_flow_control_ends_with_a_response() {
    io_session(false, true, false);
}

#[test]
fn write_by_r2t_and_read_in_pieces_with_digests() {
    io_session(true, false, true);
}

#[test]
fn in_capsule_write() {
    let mut p = Pair::new(host_config(false), QueueConfig::default());
    p.connect(1, 1);
    p.sent_by_target.clear();
    let w = p.call(commands::write(1, 0, 2, vec![0xAB; 1024], false));
    assert!(w.cqe.status.is_success());
    assert!(!p.sent_by_target.contains(&PduType::R2t));
    assert_eq!(&p.target.disk[..1024], &[0xAB; 1024][..]);
}

#[test]
fn data_digest_error_fails_the_command() {
    let mut p = Pair::new(host_config(true), QueueConfig::default());
    p.connect(1, 1);
    p.host.submit(commands::read(1, 0, 1, BS as u32)).unwrap();
    let mut b = Vec::new();
    p.host.poll_transmit(&mut b);
    p.target.inbox.extend_from_slice(&b);
    p.target.run();
    let mut out = std::mem::take(&mut p.target.out);
    // Flip a data byte of the C2HData (header 24 + digest 4 = data at 28).
    out[28] ^= 1;
    let mut events = Vec::new();
    let mut at = 0;
    while let Some(r) = p.host.receive(&out[at..]).unwrap() {
        events.extend(r.event);
        at += r.consumed;
    }
    let [HostEvent::Completed(c)] = events.as_slice() else {
        panic!("{events:?}")
    };
    assert_eq!(c.cqe.status, Status::TRANSIENT_TRANSPORT_ERROR);
}

#[test]
fn protocol_errors_end_the_connection() {
    let mut p = Pair::new(host_config(false), QueueConfig::default());
    // A response for a command never sent.
    let mut b = Vec::new();
    Pdu::CapsuleResp(Cqe::new(77, Status::SUCCESS))
        .encode(&[], &Framing::plain(0), &mut b)
        .unwrap();
    assert!(matches!(p.host.receive(&b), Err(HostError::Pdu(_))));
    let mut out = Vec::new();
    assert!(p.host.poll_transmit(&mut out));
    assert_eq!(out[0], PduType::H2cTermReq as u8);
    assert_eq!(
        p.host.submit(commands::keep_alive()),
        Err(HostError::NotReady)
    );
    // A C2HTermReq is reported as such.
    let mut h = Host::new(host_config(false));
    let mut b = Vec::new();
    Pdu::C2hTermReq(TermReq { fes: 2, fei: 0 })
        .encode(&[], &Framing::plain(0), &mut b)
        .unwrap();
    assert_eq!(h.receive(&b), Err(HostError::Terminated { fes: 2, fei: 0 }));
    // An ICResp that turns on digests not asked for.
    let mut h = Host::new(host_config(false));
    let mut b = Vec::new();
    Pdu::IcResp(IcResp {
        pfv: 0,
        cpda: 0,
        header_digest: true,
        data_digest: false,
        maxh2cdata: 8192,
    })
    .encode(&[], &Framing::plain(0), &mut b)
    .unwrap();
    assert!(matches!(h.receive(&b), Err(HostError::IcResp(_))));
    // Garbage never panics.
    let mut h = Host::new(host_config(false));
    assert!(h.receive(&[0xEE; 200]).is_err());
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// A host past its ICResp, with a read, a write by R2T and a flush in
    /// flight.
    fn busy_host(digests: bool) -> Host {
        let mut p = Pair::new(
            HostConfig {
                max_in_capsule: 0,
                ..host_config(digests)
            },
            QueueConfig::default(),
        );
        p.connect(1, 1);
        let mut h = p.host;
        h.submit(commands::read(1, 0, 8, 512)).unwrap();
        h.submit(commands::write(1, 0, 8, vec![1; 4096], false))
            .unwrap();
        h.submit(commands::flush(1)).unwrap();
        h.poll_transmit(&mut Vec::new());
        h
    }

    /// PDUs a controller could send, valid or not, for the CIDs in flight.
    fn pdu() -> impl Strategy<Value = (Pdu, Vec<u8>)> {
        let cid = 0u16..5;
        prop_oneof![
            (cid.clone(), any::<bool>()).prop_map(|(cid, ok)| (
                Pdu::CapsuleResp(Cqe::new(
                    cid,
                    if ok {
                        Status::SUCCESS
                    } else {
                        Status::INTERNAL_ERROR
                    }
                )),
                vec![]
            )),
            (
                cid.clone(),
                0u32..5000,
                1usize..600,
                any::<bool>(),
                any::<bool>()
            )
                .prop_map(|(cid, datao, len, last, success)| (
                    Pdu::C2hData(C2hData {
                        cccid: cid,
                        datao,
                        last: last || success,
                        success,
                    }),
                    vec![7; len]
                )),
            (cid, any::<u16>(), 0u32..5000, 0u32..5000).prop_map(|(cid, ttag, r2to, r2tl)| (
                Pdu::R2t(R2t {
                    cccid: cid,
                    ttag,
                    r2to,
                    r2tl
                }),
                vec![]
            )),
        ]
    }

    proptest! {
        /// Random bytes never panic the host, and an error ends it.
        #[test]
        fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400), digests in any::<bool>()) {
            let mut h = busy_host(digests);
            let mut at = 0;
            loop {
                match h.receive(&bytes[at..]) {
                    Ok(Some(r)) => {
                        prop_assert!(r.consumed > 0);
                        at += r.consumed;
                    }
                    Ok(None) => break,
                    Err(_) => {
                        prop_assert!(!h.is_ready());
                        break;
                    }
                }
            }
        }

        /// Sequences of well-formed PDUs, right or wrong for the commands
        /// in flight, never panic the host; every completion names a
        /// command that was in flight, and a read's data is its length.
        #[test]
        fn pdu_sequences(pdus in proptest::collection::vec(pdu(), 1..12), digests in any::<bool>()) {
            let mut h = busy_host(digests);
            let framing = h.tx_framing();
            let mut in_flight: std::collections::HashSet<u16> = [1, 2, 3].into();
            for (p, data) in pdus {
                let mut b = Vec::new();
                p.encode(&data, &framing, &mut b).unwrap();
                match h.receive(&b) {
                    Ok(Some(r)) => {
                        prop_assert_eq!(r.consumed, b.len());
                        if let Some(HostEvent::Completed(c)) = r.event {
                            prop_assert!(in_flight.remove(&c.cqe.cid));
                            if c.cqe.cid == 1 {
                                prop_assert_eq!(c.data.len(), 4096);
                            }
                        }
                    }
                    Ok(None) => prop_assert!(false, "a whole PDU was not taken"),
                    Err(_) => {
                        prop_assert!(!h.is_ready());
                        break;
                    }
                }
            }
        }
    }
}
