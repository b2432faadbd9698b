//! The NVMe/TCP PDU decoder, the SQE and command parsers and the target
//! queue on arbitrary bytes: never a panic; whatever decodes encodes back
//! to bytes that decode to the same PDU and data; the queue, fed the input
//! after a valid ICReq, never consumes more than it was given.
#![no_main]

use std::time::Instant;

use ethersan_nvme::command::{AdminCommand, IoCommand};
use ethersan_nvme::fabrics::{ConnectData, FabricsCommand};
use ethersan_nvme::pdu::{decode, decode_head, Framing, IcReq, Pdu};
use ethersan_nvme::{Queue, QueueConfig, Sqe};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for (hd, dd) in [(false, false), (true, false), (true, true)] {
        let f = Framing {
            header_digest: hd,
            data_digest: dd,
            pda: 0,
            max_data: 1 << 16,
        };
        let _ = decode_head(data, &f);
        if let Ok(Some(d)) = decode(data, &f) {
            assert!(d.len <= data.len(), "decoder used more bytes than it had");
            let payload = &data[d.data.clone()];
            let mut again = Vec::new();
            d.pdu
                .encode(payload, &f, &mut again)
                .expect("a decoded PDU encodes");
            let d2 = decode(&again, &f).expect("re-encoded decodes").expect("whole");
            assert_eq!(d2.pdu, d.pdu);
            assert_eq!(&again[d2.data], payload);
        }
    }

    if let Ok(sqe) = Sqe::parse(data) {
        let _ = sqe.sgl();
        let _ = sqe.fuse();
        let _ = AdminCommand::parse(&sqe);
        let _ = IoCommand::parse(&sqe);
        let _ = FabricsCommand::parse(&sqe);
    }
    let _ = ConnectData::parse(data);

    let now = Instant::now();
    let mut q = Queue::new(QueueConfig::default());
    let mut icreq = Vec::new();
    let req = Pdu::IcReq(IcReq {
        pfv: 0,
        hpda: 0,
        header_digest: data.first().is_some_and(|b| b & 1 != 0),
        data_digest: false,
        maxr2t: 1,
    });
    req.encode(&[], &Framing::plain(0), &mut icreq)
        .expect("ICReq encodes");
    let _ = q.receive(&icreq, now);
    let mut rest = data;
    while let Some(r) = q.receive(rest, now) {
        assert!(r.consumed <= rest.len());
        if r.consumed == 0 {
            break;
        }
        rest = &rest[r.consumed..];
    }
    let mut out = Vec::new();
    q.poll_transmit(&mut out);
});
