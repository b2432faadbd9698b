//! Property tests across the NVMe/TCP codec (TP 8000 §7.4) and the queue
//! state machine: any encoded PDU decodes back to itself under any
//! framing, and no byte input makes the decoder, the SQE and command
//! parsers or the queue panic.

use std::time::Instant;

use proptest::prelude::*;

use crate::command::{AdminCommand, IoCommand};
use crate::cqe::Cqe;
use crate::fabrics::{ConnectData, FabricsCommand};
use crate::pdu::*;
use crate::queue::{Queue, QueueConfig};
use crate::sqe::Sqe;
use crate::status::{Status, StatusCodeType};

fn framing() -> impl Strategy<Value = Framing> {
    (any::<bool>(), any::<bool>(), 0u8..32).prop_map(|(header_digest, data_digest, pda)| Framing {
        header_digest,
        data_digest,
        pda,
        max_data: u32::MAX,
    })
}

fn cqe() -> impl Strategy<Value = Cqe> {
    (
        any::<[u32; 2]>(),
        any::<[u16; 3]>(),
        any::<bool>(),
        0u8..4,
        any::<u8>(),
        any::<[bool; 2]>(),
    )
        .prop_map(|(dw, [sqhd, sqid, cid], phase, sct, sc, [more, dnr])| Cqe {
            dw0: dw[0],
            dw1: dw[1],
            sqhd,
            sqid,
            cid,
            phase,
            status: Status {
                sct: StatusCodeType::from_bits(sct).unwrap_or(StatusCodeType::Generic),
                sc,
                more,
                dnr,
            },
        })
}

/// A PDU and data it can carry.
fn pdu() -> impl Strategy<Value = (Pdu, Vec<u8>)> {
    let data = || proptest::collection::vec(any::<u8>(), 0..300);
    let some_data = || proptest::collection::vec(any::<u8>(), 1..300);
    prop_oneof![
        (0u8..32, any::<[bool; 2]>(), any::<u32>()).prop_map(|(hpda, d, maxr2t)| (
            Pdu::IcReq(IcReq {
                pfv: 0,
                hpda,
                header_digest: d[0],
                data_digest: d[1],
                maxr2t
            }),
            vec![]
        )),
        (0u8..32, any::<[bool; 2]>(), 1024u32..1 << 24).prop_map(|(cpda, d, m)| (
            Pdu::IcResp(IcResp {
                pfv: 0,
                cpda,
                header_digest: d[0],
                data_digest: d[1],
                maxh2cdata: m * 4
            }),
            vec![]
        )),
        (
            any::<u16>(),
            any::<u32>(),
            any::<bool>(),
            proptest::collection::vec(any::<u8>(), 0..=128)
        )
            .prop_map(|(fes, fei, h2c, data)| {
                let t = TermReq { fes, fei };
                (
                    if h2c {
                        Pdu::H2cTermReq(t)
                    } else {
                        Pdu::C2hTermReq(t)
                    },
                    data,
                )
            }),
        (any::<[u8; 32]>(), any::<[u8; 32]>(), data()).prop_map(|(a, b, d)| {
            let mut s = Sqe::default();
            s.0[..32].copy_from_slice(&a);
            s.0[32..].copy_from_slice(&b);
            (Pdu::CapsuleCmd(s), d)
        }),
        cqe().prop_map(|c| (Pdu::CapsuleResp(c), vec![])),
        (any::<[u16; 2]>(), any::<u32>(), any::<bool>(), some_data()).prop_map(
            |(t, datao, last, d)| (
                Pdu::H2cData(H2cData {
                    cccid: t[0],
                    ttag: t[1],
                    datao,
                    last
                }),
                d
            )
        ),
        (any::<u16>(), any::<u32>(), any::<[bool; 2]>(), some_data()).prop_map(
            |(cccid, datao, f, d)| (
                Pdu::C2hData(C2hData {
                    cccid,
                    datao,
                    last: f[0] || f[1],
                    success: f[1]
                }),
                d
            )
        ),
        (any::<[u16; 2]>(), any::<[u32; 2]>()).prop_map(|(t, r)| (
            Pdu::R2t(R2t {
                cccid: t[0],
                ttag: t[1],
                r2to: r[0],
                r2tl: r[1]
            }),
            vec![]
        )),
    ]
}

proptest! {
    #[test]
    fn encoded_pdus_decode_to_themselves((pdu, data) in pdu(), f in framing()) {
        let mut buf = Vec::new();
        pdu.encode(&data, &f, &mut buf).unwrap();
        let d = decode(&buf, &f).unwrap().unwrap();
        prop_assert_eq!(d.pdu, pdu);
        prop_assert_eq!(&buf[d.data.clone()], &data[..]);
        prop_assert_eq!(d.len, buf.len());
        prop_assert!(d.data_digest_ok);
        // Every strict prefix waits for more.
        let cut = buf.len() / 2;
        prop_assert_eq!(decode(&buf[..cut], &f), Ok(None));
    }

    #[test]
    fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), f in framing(), max in 0u32..1000) {
        let f = Framing { max_data: max, ..f };
        if let Ok(Some(d)) = decode(&bytes, &f) {
            prop_assert!(d.len <= bytes.len());
            prop_assert!(d.data.end <= d.len);
        }
        let _ = decode_head(&bytes, &f);
    }

    #[test]
    fn parsers_never_panic(raw in any::<[u8; 64]>(), data in proptest::collection::vec(any::<u8>(), 0..1100)) {
        let sqe = Sqe::parse(&raw).unwrap();
        let _ = sqe.sgl();
        let _ = sqe.fuse();
        let _ = AdminCommand::parse(&sqe);
        let _ = IoCommand::parse(&sqe);
        let _ = FabricsCommand::parse(&sqe);
        let _ = ConnectData::parse(&data);
        let _ = crate::command::parse_dsm_ranges(&data, usize::from(raw[0]) + 1);
    }

    #[test]
    fn queue_never_panics(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..8)) {
        let mut q = Queue::new(QueueConfig::default());
        let now = Instant::now();
        // A valid ICReq first, so later chunks reach the connected state.
        let mut icreq = Vec::new();
        Pdu::IcReq(IcReq { pfv: 0, hpda: 0, header_digest: false, data_digest: false, maxr2t: 0 })
            .encode(&[], &Framing::plain(0), &mut icreq)
            .unwrap();
        let _ = q.receive(&icreq, now);
        for c in &chunks {
            if let Some(r) = q.receive(c, now) {
                prop_assert!(r.consumed <= c.len());
            }
            let mut out = Vec::new();
            q.poll_transmit(&mut out);
        }
    }
}

/// A host-side PDU for the queue: commands with in-capsule or transport
/// data and H2CData that may or may not match an R2T.
fn host_pdu() -> impl Strategy<Value = (Pdu, Vec<u8>)> {
    prop_oneof![
        (
            0u16..4,
            prop_oneof![Just(0x00u8), Just(0x01), Just(0x02), Just(0x18)],
            0u32..9000,
            any::<bool>()
        )
            .prop_map(|(cid, opcode, len, in_capsule)| {
                let mut s = Sqe::new(opcode, cid);
                let data = if in_capsule && len > 0 && len < 4096 {
                    s.set_sgl(crate::sqe::Sgl::InCapsule { offset: 0, len });
                    vec![0u8; len as usize]
                } else {
                    s.set_sgl(crate::sqe::Sgl::Transport { len });
                    vec![]
                };
                (Pdu::CapsuleCmd(s), data)
            }),
        (0u16..4, 0u16..8, 0u32..3, 1usize..5000, any::<bool>()).prop_map(
            |(cccid, ttag, block, len, last)| (
                Pdu::H2cData(H2cData {
                    cccid,
                    ttag,
                    datao: block * 4096,
                    last
                }),
                vec![0u8; len]
            )
        ),
    ]
}

proptest! {
    #[test]
    fn queue_survives_any_pdu_sequence(pdus in proptest::collection::vec(host_pdu(), 0..24)) {
        let mut q = Queue::new(QueueConfig { r2t_len: 4096, max_h2c_data: 4096, ..QueueConfig::default() });
        let now = Instant::now();
        let mut b = Vec::new();
        Pdu::IcReq(IcReq { pfv: 0, hpda: 0, header_digest: false, data_digest: false, maxr2t: 1 })
            .encode(&[], &Framing::plain(0), &mut b)
            .unwrap();
        let connect = crate::fabrics::FabricsCommand::Connect(crate::fabrics::Connect {
            recfmt: 0,
            qid: 1,
            sqsize: 15,
            cattr: 0,
            kato: 0,
        });
        Pdu::CapsuleCmd(connect.to_sqe(9)).encode(&[], &Framing::plain(0), &mut b).unwrap();
        for (p, d) in &pdus {
            p.encode(d, &Framing::plain(0), &mut b).unwrap();
        }
        let mut at = 0;
        let mut out = Vec::new();
        while let Some(r) = q.receive(&b[at..], now) {
            prop_assert!(r.consumed > 0 && r.consumed <= b.len() - at);
            at += r.consumed;
            if let Some(crate::queue::Event::Command { sqe, data }) = &r.event {
                // Complete reads at once; writes wait for their data.
                match data {
                    crate::queue::CommandData::ToHost { len } => {
                        let data = vec![0u8; (*len).min(10_000) as usize];
                        q.send_read(crate::queue::Completion::new(sqe.cid(), Status::SUCCESS), &data, &mut out).unwrap();
                    }
                    crate::queue::CommandData::Awaiting { .. } => {}
                    _ => q.complete(crate::queue::Completion::new(sqe.cid(), Status::SUCCESS), &mut out).unwrap(),
                }
            }
            q.poll_transmit(&mut out);
            prop_assert!(q.in_flight() <= 5);
        }
        prop_assert!(at == b.len() || q.is_closed());
    }
}
