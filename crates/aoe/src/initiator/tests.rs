//! Unit tests of the initiator state: discovery, command frames, the window,
//! RTO and retransmission, response matching. Time is made up.

use super::*;

use crate::target::{AoeTarget, DeviceAddr, DeviceConfig, TargetConfig};

const LOCAL: Mac = Mac([2, 0, 0, 0, 0, 0x0A]);
const TMAC: Mac = Mac([2, 0, 0, 0, 0, 0x10]);
const MS: Duration = Duration::from_millis(1);

fn info(buffer_count: u16) -> TargetInfo {
    TargetInfo {
        mac: TMAC,
        shelf: 3,
        slot: 4,
        buffer_count,
        max_sectors: 2,
        firmware_version: 1,
        aoe_version: 1,
        config: Vec::new(),
    }
}

fn init(buffer_count: u16) -> Initiator {
    Initiator::new(InitiatorConfig::new(LOCAL), info(buffer_count))
}

/// The target's answer to `req`: ATA registers and data.
fn respond(req: &[u8], status: u8, error: u8, data: &[u8]) -> Vec<u8> {
    let h = Header::decode(req).unwrap();
    let mut out = Vec::new();
    h.response(TMAC, h.shelf, h.slot).encode(&mut out);
    let a = AtaArg::decode(&req[HEADER_LEN..], false).unwrap();
    AtaArg {
        err_feature: error,
        sector_count: 0,
        cmd_status: status,
        data,
        ..a
    }
    .encode(&mut out);
    pad(&mut out);
    out
}

fn ok(req: &[u8]) -> Vec<u8> {
    respond(req, ata::STATUS_DRDY, 0, &[])
}

fn tag(frame: &[u8]) -> u32 {
    Header::decode(frame).unwrap().tag
}

fn read(lba: u64) -> AtaRequest {
    AtaRequest::Read { lba, sectors: 1 }
}

#[test]
fn discovery_and_config_parsing() {
    let f = discovery_frame(LOCAL, 77);
    let d = message::decode(&f).unwrap();
    assert_eq!(d.header.dst, Mac::BROADCAST);
    assert_eq!(
        (d.header.shelf, d.header.slot, d.header.tag),
        (0xFFFF, 0xFF, 77)
    );
    assert!(matches!(
        d.message,
        Message::Config(ConfigArg {
            command: ConfigCommand::Read,
            ..
        })
    ));
    // A real target's answer.
    let mut t = AoeTarget::new(TargetConfig::new(TMAC, 9000));
    let dc = DeviceConfig {
        config_string: b"cfg".to_vec(),
        ..DeviceConfig::new(10)
    };
    t.add_device(DeviceAddr::new(3, 4), dc).unwrap();
    let crate::target::Action::Reply(r) = t.handle(&f) else {
        panic!()
    };
    let ti = parse_config_response(&r[0]).unwrap();
    assert_eq!(
        (ti.mac, ti.shelf, ti.slot, ti.max_sectors, ti.buffer_count),
        (TMAC, 3, 4, 17, 16)
    );
    assert_eq!(ti.config, b"cfg");
    // Sector count 0 means 2.
    let mut zero = r[0].clone();
    zero[HEADER_LEN + 4] = 0;
    assert_eq!(parse_config_response(&zero).unwrap().max_sectors, 2);
    // Not responses, errors, broadcast sources.
    assert_eq!(
        parse_config_response(&f),
        Err(ResponseError::NotConfigResponse)
    );
    let mut err = r[0].clone();
    err[14] |= 0x04;
    err[15] = 4;
    assert_eq!(parse_config_response(&err), Err(ResponseError::Aoe(4)));
    let mut bc = r[0].clone();
    bc[18] = 0xFF;
    assert_eq!(
        parse_config_response(&bc),
        Err(ResponseError::BroadcastAddress(3, 0xFF))
    );
    assert!(matches!(
        parse_config_response(&[0; 10]),
        Err(ResponseError::Decode(_))
    ));
}

#[test]
fn submit_validates() {
    let mut i = init(16);
    assert_eq!(
        i.submit(AtaRequest::Read { lba: 0, sectors: 0 }),
        Err(SubmitError::BadLength(0))
    );
    assert_eq!(
        i.submit(AtaRequest::Read { lba: 0, sectors: 3 }),
        Err(SubmitError::TooManySectors { sectors: 3, max: 2 })
    );
    assert_eq!(
        i.submit(AtaRequest::Write {
            lba: 0,
            data: vec![0; 100]
        }),
        Err(SubmitError::BadLength(100))
    );
    let e = i.submit(AtaRequest::Read {
        lba: (1 << 48) - 1,
        sectors: 2,
    });
    assert!(matches!(e, Err(SubmitError::OutOfRange { bits: 48, .. })));
    i.set_lba48(false);
    let e = i.submit(AtaRequest::Read {
        lba: 1 << 28,
        sectors: 1,
    });
    assert!(matches!(e, Err(SubmitError::OutOfRange { bits: 28, .. })));
    assert_eq!(i.outstanding(), 0);
    // MTU 1500 locally caps a jumbo target.
    let mut ti = info(16);
    ti.max_sectors = 17;
    assert_eq!(
        Initiator::new(InitiatorConfig::new(LOCAL), ti).max_sectors(),
        2
    );
}

fn ata_of(f: &[u8]) -> AtaArg<'_> {
    AtaArg::decode(&f[HEADER_LEN..], false).unwrap()
}

#[test]
fn command_frames() {
    let now = Instant::now();
    let mut i = Initiator::new(
        InitiatorConfig {
            initial_window: 64,
            ..InitiatorConfig::new(LOCAL)
        },
        info(64),
    );
    i.submit(AtaRequest::Read {
        lba: 0x0012_3456_789A,
        sectors: 2,
    })
    .unwrap();
    i.submit(AtaRequest::Write {
        lba: 5,
        data: vec![0xAB; 512],
    })
    .unwrap();
    i.submit(AtaRequest::Identify).unwrap();
    i.submit(AtaRequest::Flush).unwrap();
    i.set_lba48(false);
    i.submit(AtaRequest::Read {
        lba: 0x0123_4567,
        sectors: 1,
    })
    .unwrap();
    i.submit(AtaRequest::Flush).unwrap();
    i.submit(AtaRequest::CheckPowerMode).unwrap();
    let frames: Vec<Arc<[u8]>> = std::iter::from_fn(|| i.poll_transmit(now)).collect();
    assert_eq!(frames.len(), 7);
    let h = Header::decode(&frames[0]).unwrap();
    assert_eq!(
        (h.dst, h.src, h.shelf, h.slot, h.command),
        (TMAC, LOCAL, 3, 4, 0)
    );
    assert!(frames.iter().all(|f| f.len() >= frame::MIN_FRAME_LEN));
    let r = ata_of(&frames[0]);
    assert_eq!(
        (r.flags.0, r.cmd_status, r.sector_count, r.lba),
        (0x40, 0x24, 2, 0x0012_3456_789A)
    );
    let w = ata_of(&frames[1]);
    assert_eq!(
        (w.flags.0, w.cmd_status, w.sector_count, w.lba),
        (0x41, 0x34, 1, 5)
    );
    assert_eq!(w.data, &[0xAB; 512][..]);
    let id = ata_of(&frames[2]);
    assert_eq!(
        (id.flags.0, id.cmd_status, id.sector_count, id.lba),
        (0, 0xEC, 1, 0xA000_0000)
    );
    assert_eq!(ata_of(&frames[3]).cmd_status, 0xEA);
    let r28 = ata_of(&frames[4]);
    assert_eq!(
        (r28.flags.0, r28.cmd_status, r28.lba),
        (0, 0x20, 0xE123_4567)
    );
    assert_eq!(ata_of(&frames[5]).cmd_status, 0xE7);
    assert_eq!(ata_of(&frames[6]).cmd_status, 0xE5);
    // Tags are distinct.
    let mut tags: Vec<u32> = frames.iter().map(|f| tag(f)).collect();
    tags.dedup();
    assert_eq!(tags.len(), 7);
}

#[test]
fn window_limits_and_grows_to_buffer_count() {
    let now = Instant::now();
    let mut i = init(4);
    for n in 0..20 {
        i.submit(read(n)).unwrap();
    }
    assert_eq!(i.window(), 2);
    let a = i.poll_transmit(now).unwrap();
    let b = i.poll_transmit(now).unwrap();
    assert!(i.poll_transmit(now).is_none(), "window of 2 is full");
    assert_eq!(i.in_flight(), 2);
    let c = i
        .on_frame(&respond(&a, ata::STATUS_DRDY, 0, &[7; 512]), now + MS)
        .unwrap();
    let reply = c.result.unwrap();
    assert_eq!(reply.data, ATA_HEADER_LEN..ATA_HEADER_LEN + 512);
    i.on_frame(&ok(&b), now + MS);
    assert_eq!(i.window(), 3);
    let mut sent = 0;
    for step in 0..30u32 {
        let t = now + MS * (step + 2);
        let mut batch = Vec::new();
        while let Some(f) = i.poll_transmit(t) {
            batch.push(f);
        }
        assert!(batch.len() as u32 <= i.window());
        sent += batch.len();
        for f in batch {
            i.on_frame(&respond(&f, ata::STATUS_DRDY, 0, &[0; 512]), t);
        }
    }
    assert_eq!(sent, 18);
    assert_eq!(i.window(), 4, "never above the buffer count");
    assert_eq!(i.outstanding(), 0);
}

#[test]
fn responses_matched_by_tag_and_source_only() {
    let now = Instant::now();
    let mut i = init(16);
    let h = i.submit(read(1)).unwrap();
    let f = i.poll_transmit(now).unwrap();
    let good = respond(&f, ata::STATUS_DRDY, 0, &[1; 512]);
    let mut wrong_src = good.clone();
    wrong_src[11] = 0x99;
    let mut wrong_slot = good.clone();
    wrong_slot[18] = 9;
    let mut wrong_dst = good.clone();
    wrong_dst[5] = 0x77;
    let mut wrong_tag = good.clone();
    wrong_tag[23] ^= 0xFF;
    let mut request = good.clone();
    request[14] &= !0x08;
    for bad in [
        &wrong_src,
        &wrong_slot,
        &wrong_dst,
        &wrong_tag,
        &request,
        &f.to_vec(),
        &vec![0u8; 5],
    ] {
        assert_eq!(i.on_frame(bad, now), None);
    }
    let c = i.on_frame(&good, now + MS).unwrap();
    assert_eq!(c.handle, h);
    assert!(c.result.is_ok());
    assert_eq!(i.on_frame(&good, now + MS), None, "duplicate ignored");
    assert_eq!(i.srtt(), Some(MS));
}

#[test]
fn errors_reported() {
    let now = Instant::now();
    let mut i = Initiator::new(
        InitiatorConfig {
            initial_window: 8,
            ..InitiatorConfig::new(LOCAL)
        },
        info(16),
    );
    for n in 0..3 {
        i.submit(read(n)).unwrap();
    }
    let f: Vec<_> = std::iter::from_fn(|| i.poll_transmit(now)).collect();
    let mut aoe = ok(&f[0]);
    aoe[14] |= 0x04;
    aoe[15] = 6;
    let e = i.on_frame(&aoe, now).unwrap().result.unwrap_err();
    assert_eq!(e, CommandError::Aoe { code: 6 });
    assert_eq!(e.to_string(), "AoE error 6: target is reserved");
    let e = i
        .on_frame(&respond(&f[1], 0x41, 0x10, &[]), now)
        .unwrap()
        .result
        .unwrap_err();
    assert_eq!(
        e,
        CommandError::Ata {
            status: 0x41,
            error: 0x10
        }
    );
    let e = i.on_frame(&ok(&f[2]), now).unwrap().result.unwrap_err();
    assert!(matches!(e, CommandError::ShortResponse { need: 512, .. }));
}

#[test]
fn timeout_retransmits_same_tag_with_doubled_rto_and_karn() {
    let t0 = Instant::now();
    let mut i = init(16);
    i.submit(read(1)).unwrap();
    i.submit(read(2)).unwrap();
    let a = i.poll_transmit(t0).unwrap();
    let b = i.poll_transmit(t0).unwrap();
    assert_eq!(i.poll_timeout(), Some(t0 + 250 * MS));
    assert!(i.on_timeout(t0 + 249 * MS).is_empty());
    assert_eq!(i.in_flight(), 2);
    // Both time out: retransmitted, window halved once (same window).
    assert!(i.on_timeout(t0 + 250 * MS).is_empty());
    assert_eq!(i.window(), 1);
    assert_eq!(i.in_flight(), 0);
    assert_eq!(i.rto(), 500 * MS, "backed off until a sample");
    let t1 = t0 + 300 * MS;
    let a2 = i.poll_transmit(t1).unwrap();
    assert_eq!(&a2[..], &a[..], "same frame, same tag");
    assert!(i.poll_transmit(t1).is_none(), "window of 1");
    assert_eq!(i.poll_timeout(), Some(t1 + 500 * MS));
    // The answer to a retransmitted command yields no RTT sample.
    i.on_frame(&respond(&a2, ata::STATUS_DRDY, 0, &[0; 512]), t1 + 5 * MS)
        .unwrap();
    assert_eq!(i.srtt(), None);
    let b2 = i.poll_transmit(t1 + 5 * MS).unwrap();
    assert_eq!(tag(&b2), tag(&b));
    // A fresh command does.
    i.on_frame(&respond(&b2, ata::STATUS_DRDY, 0, &[0; 512]), t1 + 6 * MS)
        .unwrap();
    i.submit(read(3)).unwrap();
    let c = i.poll_transmit(t1 + 10 * MS).unwrap();
    i.on_frame(&respond(&c, ata::STATUS_DRDY, 0, &[0; 512]), t1 + 14 * MS)
        .unwrap();
    assert_eq!(i.srtt(), Some(4 * MS));
    assert_eq!(i.rto(), 12 * MS);
}

#[test]
fn gives_up_after_max_retries() {
    let t0 = Instant::now();
    let cfg = InitiatorConfig {
        max_retries: 2,
        ..InitiatorConfig::new(LOCAL)
    };
    let mut i = Initiator::new(cfg, info(16));
    let h = i.submit(AtaRequest::Flush).unwrap();
    let mut now = t0;
    let mut sends = 0;
    loop {
        if i.poll_transmit(now).is_some() {
            sends += 1;
        }
        let Some(deadline) = i.poll_timeout() else {
            break;
        };
        now = deadline;
        let failed = i.on_timeout(now);
        if let Some(c) = failed.first() {
            assert_eq!(c.handle, h);
            assert_eq!(c.result, Err(CommandError::TimedOut(2)));
            break;
        }
    }
    assert_eq!(sends, 3);
    // 250 + 500 + 1000 ms.
    assert_eq!(now - t0, 1750 * MS);
    assert_eq!(i.outstanding(), 0);
    assert_eq!(i.poll_timeout(), None);
}

#[test]
fn late_answer_to_a_lost_command_completes_it() {
    let t0 = Instant::now();
    let mut i = init(16);
    i.submit(read(9)).unwrap();
    let a = i.poll_transmit(t0).unwrap();
    i.on_timeout(t0 + 250 * MS);
    // Not yet retransmitted when the first answer shows up late.
    assert!(i
        .on_frame(&respond(&a, ata::STATUS_DRDY, 0, &[0; 512]), t0 + 260 * MS)
        .unwrap()
        .result
        .is_ok());
    assert!(
        i.poll_transmit(t0 + 261 * MS).is_none(),
        "nothing left to retransmit"
    );
    assert_eq!(i.outstanding(), 0);
}

#[test]
fn reordered_answers_and_abort() {
    let t0 = Instant::now();
    let mut i = Initiator::new(
        InitiatorConfig {
            initial_window: 3,
            ..InitiatorConfig::new(LOCAL)
        },
        info(16),
    );
    let hs: Vec<Handle> = (0..4).map(|n| i.submit(read(n)).unwrap()).collect();
    let f: Vec<_> = std::iter::from_fn(|| i.poll_transmit(t0)).collect();
    assert_eq!(f.len(), 3);
    let c2 = i
        .on_frame(&respond(&f[2], ata::STATUS_DRDY, 0, &[0; 512]), t0)
        .unwrap();
    let c0 = i
        .on_frame(&respond(&f[0], ata::STATUS_DRDY, 0, &[0; 512]), t0)
        .unwrap();
    assert_eq!((c2.handle, c0.handle), (hs[2], hs[0]));
    let mut aborted: Vec<Handle> = i.abort_all().into_iter().map(|c| c.handle).collect();
    aborted.sort();
    assert_eq!(aborted, [hs[1], hs[3]]);
    assert!(i.poll_transmit(t0).is_none());
    assert_eq!(i.in_flight(), 0);
    assert_eq!(
        i.on_frame(&respond(&f[1], ata::STATUS_DRDY, 0, &[0; 512]), t0),
        None
    );
}

#[test]
fn identify_round_trip_through_a_target() {
    let t0 = Instant::now();
    let mut t = AoeTarget::new(TargetConfig::new(TMAC, 1500));
    t.add_device(DeviceAddr::new(3, 4), DeviceConfig::new(123_456_789_012))
        .unwrap();
    let mut i = init(16);
    i.submit(AtaRequest::Identify).unwrap();
    let f = i.poll_transmit(t0).unwrap();
    let crate::target::Action::Reply(r) = t.handle(&f) else {
        panic!()
    };
    let c = i.on_frame(&r[0], t0).unwrap();
    let data = c.result.unwrap().data;
    let id = ata::parse_identify(&r[0][data]).unwrap();
    assert_eq!(id.sectors, 123_456_789_012);
    assert!(id.lba48);
}

#[test]
fn initial_tag_and_target_updates() {
    let now = Instant::now();
    let cfg = InitiatorConfig {
        initial_tag: 0xFFFF_FFFF,
        initial_window: 16,
        ..InitiatorConfig::new(LOCAL)
    };
    let mut i = Initiator::new(cfg, info(16));
    i.submit(read(0)).unwrap();
    i.submit(read(1)).unwrap();
    let a = i.poll_transmit(now).unwrap();
    let b = i.poll_transmit(now).unwrap();
    assert_eq!((tag(&a), tag(&b)), (0xFFFF_FFFF, 0), "tags wrap");
    // A fresh config response lowers the buffer count and sector limit.
    let mut newer = info(4);
    newer.max_sectors = 1;
    assert!(i.update_target(newer.clone()));
    assert_eq!((i.window(), i.max_sectors()), (4, 1));
    newer.slot = 9;
    assert!(!i.update_target(newer));
    assert_eq!(i.target().slot, 4);
}

/// A command its caller gave up on is never sent again: queued, it is
/// not sent at all; in flight, it is not retransmitted, its window slot
/// is freed, and a late answer completes nothing.
#[test]
fn a_cancelled_command_is_never_sent_again() {
    let mut i = init(1);
    let t0 = Instant::now();
    let a = i.submit(read(0)).unwrap();
    let b = i.submit(read(8)).unwrap();
    let c = i.submit(read(16)).unwrap();
    // Window of 1: `a` goes out, `b` and `c` wait.
    let fa = i.poll_transmit(t0).expect("a is sent");
    assert!(i.poll_transmit(t0).is_none());
    assert!(i.cancel(b), "b was queued");
    assert!(i.cancel(a), "a was in flight");
    assert_eq!(i.in_flight(), 0);
    assert!(!i.cancel(a), "already forgotten");
    // The late answer to `a` completes nothing.
    assert!(i.on_frame(&ok(&fa), t0 + MS).is_none());
    // Only `c` is ever sent, and only `c` is retransmitted.
    let fc = i.poll_transmit(t0 + MS).expect("c is sent");
    assert_ne!(tag(&fc), tag(&fa));
    assert!(i.poll_transmit(t0 + MS).is_none());
    let later = t0 + Duration::from_secs(10);
    assert!(i.on_timeout(later).is_empty());
    let again = i.poll_transmit(later).expect("c is retransmitted");
    assert_eq!(tag(&again), tag(&fc));
    assert!(i.poll_transmit(later).is_none(), "nothing of a or b");
    let done = i.on_frame(&ok(&again), later + MS).expect("c completes");
    assert_eq!(done.handle, c);
    assert_eq!(i.outstanding(), 0);
}
