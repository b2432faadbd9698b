//! Unit tests of the AoE target: every command, every AoE error code and
//! every ATA path.

use super::*;
use crate::ata::parse_identify;
use crate::frame::MIN_FRAME_LEN;
use crate::issue::AtaFlags;
use crate::message::{decode, Frame, Message};

const TMAC: Mac = Mac([2, 0, 0, 0, 0, 0x10]);
const A: Mac = Mac([2, 0, 0, 0, 0, 0x0A]);
const B: Mac = Mac([2, 0, 0, 0, 0, 0x0B]);
const RW: DeviceAddr = DeviceAddr { shelf: 1, slot: 0 };
const RO: DeviceAddr = DeviceAddr { shelf: 1, slot: 1 };

fn target() -> AoeTarget {
    let mut t = AoeTarget::new(TargetConfig::new(TMAC, 1500));
    t.add_device(
        RW,
        DeviceConfig {
            serial: "rw".into(),
            ..DeviceConfig::new(1000)
        },
    )
    .unwrap();
    t.add_device(
        RO,
        DeviceConfig {
            read_only: true,
            ..DeviceConfig::new(100)
        },
    )
    .unwrap();
    t
}

fn req(src: Mac, shelf: u16, slot: u8, command: Command, arg: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    Header::request(TMAC, src, shelf, slot, command, 0x1234_5678).encode(&mut f);
    f.extend_from_slice(arg);
    pad(&mut f);
    f
}

fn ata_req(
    src: Mac,
    dev: DeviceAddr,
    flags: u8,
    cmd: u8,
    count: u8,
    lba: u64,
    data: &[u8],
) -> Vec<u8> {
    let mut arg = Vec::new();
    AtaArg {
        flags: AtaFlags(flags),
        err_feature: 0,
        sector_count: count,
        cmd_status: cmd,
        lba,
        data,
    }
    .encode(&mut arg);
    req(src, dev.shelf, dev.slot, Command::Ata, &arg)
}

fn config_req(src: Mac, shelf: u16, slot: u8, ccmd: ConfigCommand, s: &[u8]) -> Vec<u8> {
    let mut arg = Vec::new();
    ConfigArg::request(ccmd, s).encode(&mut arg);
    req(src, shelf, slot, Command::Config, &arg)
}

fn replies(a: Action) -> Vec<Vec<u8>> {
    match a {
        Action::Reply(r) => {
            for f in &r {
                assert!(f.len() >= MIN_FRAME_LEN, "reply not padded");
            }
            r
        }
        other => panic!("expected a reply, got {other:?}"),
    }
}

fn one(a: Action) -> Vec<u8> {
    let mut r = replies(a);
    assert_eq!(r.len(), 1);
    r.remove(0)
}

fn frame(f: &[u8]) -> Frame<'_> {
    let f = decode(f).unwrap();
    assert!(f.header.response);
    assert_eq!(f.header.src, TMAC);
    assert_eq!(f.header.tag, 0x1234_5678);
    f
}

fn aoe_error(f: &[u8]) -> Option<ErrorCode> {
    let h = Header::decode(f).unwrap();
    assert!(h.response);
    h.error_flag.then(|| ErrorCode::from_u8(h.error).unwrap())
}

/// (status, error, sector count, data) of an ATA reply.
fn ata_regs(f: &[u8]) -> (u8, u8, u8, Vec<u8>) {
    match frame(f).message {
        Message::Ata(a) => (a.cmd_status, a.err_feature, a.sector_count, a.data.to_vec()),
        m => panic!("not ATA: {m:?}"),
    }
}

/// (status, error) of an ATA reply.
fn st(f: &[u8]) -> (u8, u8) {
    let (s, e, _, _) = ata_regs(f);
    (s, e)
}

/// (status, error, sector count) of an ATA reply.
fn st3(f: &[u8]) -> (u8, u8, u8) {
    let (s, e, c, _) = ata_regs(f);
    (s, e, c)
}

fn config_of(f: &[u8]) -> (ConfigArg<'_>, Header) {
    let fr = frame(f);
    match fr.message {
        Message::Config(c) => (c, fr.header),
        m => panic!("not config: {m:?}"),
    }
}

const FAILED: u8 = ata::STATUS_DRDY | ata::STATUS_ERR;

#[test]
fn mtu_to_sectors() {
    assert_eq!(max_sectors_for_mtu(1500), 2);
    assert_eq!(max_sectors_for_mtu(9000), 17);
    assert_eq!(max_sectors_for_mtu(1046), 2);
    assert_eq!(max_sectors_for_mtu(1045), 1);
    assert_eq!(max_sectors_for_mtu(10), 0);
    assert_eq!(max_sectors_for_mtu(1 << 20), 255);
}

#[test]
fn add_device_validates() {
    let mut t = target();
    assert_eq!(
        t.add_device(RW, DeviceConfig::new(1)),
        Err(TargetError::Exists(RW))
    );
    let bc = DeviceAddr::new(0xFFFF, 0);
    assert_eq!(
        t.add_device(bc, DeviceConfig::new(1)),
        Err(TargetError::BroadcastAddress(bc))
    );
    let d = DeviceAddr::new(2, 0);
    let long = DeviceConfig {
        config_string: vec![0; 1025],
        ..DeviceConfig::new(1)
    };
    assert_eq!(t.add_device(d, long), Err(TargetError::ConfigTooLong(1025)));
    assert!(matches!(
        t.add_device(d, DeviceConfig::new(1 << 49)),
        Err(TargetError::TooLarge(_))
    ));
    let masks = DeviceConfig {
        mask: vec![A; 65],
        ..DeviceConfig::new(1)
    };
    assert!(matches!(
        t.add_device(d, masks),
        Err(TargetError::ListTooLong { .. })
    ));
    assert_eq!(t.set_available(d, false), Err(TargetError::NoDevice(d)));
    assert!(t.remove_device(RO).is_some());
    assert_eq!(t.devices().count(), 1);
}

#[test]
fn silent_drops() {
    let mut t = target();
    let good = config_req(A, 1, 0, ConfigCommand::Read, b"");
    assert!(matches!(
        t.handle(&good[..20]),
        Action::Drop(DropReason::Malformed(DecodeError::Truncated { .. }))
    ));
    let mut ip = good.clone();
    ip[12] = 0x08;
    ip[13] = 0x00;
    assert_eq!(
        t.handle(&ip),
        Action::Drop(DropReason::Malformed(DecodeError::NotAoe(0x0800)))
    );
    let mut other = good.clone();
    other[0..6].copy_from_slice(&B.0);
    assert_eq!(t.handle(&other), Action::Drop(DropReason::NotForUs));
    let mut resp = good.clone();
    resp[14] |= 0x08;
    assert_eq!(t.handle(&resp), Action::Drop(DropReason::Response));
    let mut mc = good.clone();
    mc[6] = 0x03;
    assert_eq!(t.handle(&mc), Action::Drop(DropReason::BadSource));
    assert_eq!(
        t.handle(&config_req(A, 9, 9, ConfigCommand::Read, b"")),
        Action::Drop(DropReason::NoDevice)
    );
    // Broadcast destination MAC is accepted.
    let mut bcast = good;
    bcast[0..6].copy_from_slice(&Mac::BROADCAST.0);
    assert_eq!(replies(t.handle(&bcast)).len(), 1);
}

#[test]
fn config_read_reports_target_parameters() {
    let mut t = target();
    let r = one(t.handle(&config_req(A, 1, 0, ConfigCommand::Read, b"")));
    let (c, h) = config_of(&r);
    assert_eq!((h.dst, h.shelf, h.slot), (A, 1, 0));
    assert_eq!(c.buffer_count, DEFAULT_BUFFER_COUNT);
    assert_eq!(c.firmware_version, FIRMWARE_VERSION);
    assert_eq!(c.sector_count, 2);
    assert_eq!(c.aoe_version, 1);
    assert_eq!(c.command, ConfigCommand::Read);
    assert!(c.config.is_empty());
}

#[test]
fn broadcast_query_answers_every_device_with_its_address() {
    let mut t = target();
    for (shelf, slot, n) in [
        (0xFFFF, 0xFF, 2),
        (1, 0xFF, 2),
        (0xFFFF, 1, 1),
        (2, 0xFF, 0),
    ] {
        let a = t.handle(&config_req(A, shelf, slot, ConfigCommand::Read, b""));
        if n == 0 {
            assert_eq!(a, Action::Drop(DropReason::NoDevice));
            continue;
        }
        let r = replies(a);
        assert_eq!(r.len(), n);
        for f in &r {
            let h = Header::decode(f).unwrap();
            assert!(!h.is_broadcast_address());
            assert!(DeviceAddr::new(h.shelf, h.slot).matches(shelf, slot));
        }
    }
}

#[test]
fn config_string_test_prefix_set_force_set() {
    let mut t = target();
    // Set on an empty string succeeds and is reported for persisting.
    let r = one(t.handle(&config_req(A, 1, 0, ConfigCommand::Set, b"host-a:vol1")));
    assert_eq!(aoe_error(&r), None);
    assert_eq!(config_of(&r).0.config, b"host-a:vol1");
    assert_eq!(
        t.poll_event(),
        Some(TargetEvent::ConfigChanged {
            device: RW,
            config: b"host-a:vol1".to_vec()
        })
    );
    assert_eq!(t.poll_event(), None);
    // Test: exact match only.
    assert_eq!(
        replies(t.handle(&config_req(A, 1, 0, ConfigCommand::Test, b"host-a:vol1"))).len(),
        1
    );
    assert_eq!(
        t.handle(&config_req(A, 1, 0, ConfigCommand::Test, b"host-a")),
        Action::Drop(DropReason::ConfigMismatch)
    );
    // Prefix test.
    assert_eq!(
        replies(t.handle(&config_req(A, 1, 0, ConfigCommand::TestPrefix, b"host-a"))).len(),
        1
    );
    assert_eq!(
        replies(t.handle(&config_req(A, 1, 0, ConfigCommand::TestPrefix, b""))).len(),
        1
    );
    let miss = config_req(A, 1, 0, ConfigCommand::TestPrefix, b"host-b");
    assert_eq!(t.handle(&miss), Action::Drop(DropReason::ConfigMismatch));
    // A broadcast prefix test answers only the matching device.
    let r = replies(t.handle(&config_req(
        A,
        0xFFFF,
        0xFF,
        ConfigCommand::TestPrefix,
        b"host-a",
    )));
    assert_eq!(r.len(), 1);
    assert_eq!(Header::decode(&r[0]).unwrap().slot, 0);
    // Set again, same string: a retransmission, fine, no event.
    let r = one(t.handle(&config_req(A, 1, 0, ConfigCommand::Set, b"host-a:vol1")));
    assert_eq!(aoe_error(&r), None);
    assert_eq!(t.poll_event(), None);
    // Set to another string: error 4, the current string in the reply.
    let r = one(t.handle(&config_req(B, 1, 0, ConfigCommand::Set, b"host-b")));
    assert_eq!(aoe_error(&r), Some(ErrorCode::ConfigStringPresent));
    assert_eq!(config_of(&r).0.config, b"host-a:vol1");
    assert_eq!(t.device(RW).unwrap().config_string, b"host-a:vol1");
    // Force set always.
    let r = one(t.handle(&config_req(B, 1, 0, ConfigCommand::ForceSet, b"host-b")));
    assert_eq!(aoe_error(&r), None);
    assert_eq!(config_of(&r).0.config, b"host-b");
    assert_eq!(
        t.poll_event(),
        Some(TargetEvent::ConfigChanged {
            device: RW,
            config: b"host-b".to_vec()
        })
    );
}

#[test]
fn config_bad_arguments() {
    let mut t = target();
    let mut f = config_req(A, 1, 0, ConfigCommand::Read, b"");
    f[HEADER_LEN + 5] = 0x1F; // CCmd 15
    assert_eq!(aoe_error(&one(t.handle(&f))), Some(ErrorCode::BadArgument));
    let mut f = config_req(A, 1, 0, ConfigCommand::Set, b"abc");
    f[HEADER_LEN + 6] = 0x10; // length 4099
    let r = one(t.handle(&f));
    assert_eq!(aoe_error(&r), Some(ErrorCode::BadArgument));
    // The fixed argument is echoed.
    assert_eq!(
        &r[HEADER_LEN..HEADER_LEN + 8],
        &f[HEADER_LEN..HEADER_LEN + 8]
    );
}

#[test]
fn unknown_command_and_version() {
    let mut t = target();
    let mut f = config_req(A, 1, 0, ConfigCommand::Read, b"");
    f[19] = 0xF3;
    let r = one(t.handle(&f));
    assert_eq!(aoe_error(&r), Some(ErrorCode::UnrecognizedCommand));
    assert_eq!(r[19], 0xF3, "command echoed");
    let mut f = config_req(A, 1, 0, ConfigCommand::Read, b"");
    f[14] = 0x20;
    let r = one(t.handle(&f));
    assert_eq!(aoe_error(&r), Some(ErrorCode::UnsupportedVersion));
    assert_eq!(r[14] >> 4, 1, "answered in version 1");
}

#[test]
fn identify_and_check_power_mode() {
    let mut t = target();
    let r = one(t.handle(&ata_req(
        A,
        RW,
        0,
        ata::CMD_IDENTIFY_DEVICE,
        1,
        0xA000_0000,
        &[],
    )));
    let (status, err, _, data) = ata_regs(&r);
    assert_eq!((status, err), (ata::STATUS_DRDY, 0));
    let info = parse_identify(&data).unwrap();
    assert_eq!(info.sectors, 1000);
    assert_eq!(info.serial, "rw");
    assert!(info.lba48);
    let r = one(t.handle(&ata_req(A, RW, 0, ata::CMD_CHECK_POWER_MODE, 0, 0, &[])));
    assert_eq!(ata_regs(&r).2, ata::POWER_ACTIVE_OR_IDLE);
}

#[test]
fn unknown_ata_command_aborts_in_ata_status() {
    let mut t = target();
    let r = one(t.handle(&ata_req(A, RW, 0, 0xEF, 0, 0, &[])));
    assert_eq!(aoe_error(&r), None);
    let (status, err, _, _) = ata_regs(&r);
    assert_eq!((status, err), (FAILED, ata::ERROR_ABRT));
}

fn io(a: Action) -> IoRequest {
    match a {
        Action::Io(r) => r,
        other => panic!("expected I/O, got {other:?}"),
    }
}

#[test]
fn read_goes_to_the_front_end_and_completes_in_place() {
    let mut t = target();
    let f = ata_req(
        A,
        RW,
        AtaFlags::EXTENDED,
        ata::CMD_READ_SECTORS_EXT,
        2,
        998,
        &[],
    );
    let r = io(t.handle(&f));
    assert_eq!(r.device, RW);
    assert_eq!(
        r.op,
        IoOp::Read {
            lba: 998,
            sectors: 2
        }
    );
    assert_eq!(r.pending.tag(), 0x1234_5678);
    let mut buf = vec![0xEE; 7]; // a reused buffer
    let data = r.pending.prepare_read(&mut buf);
    assert_eq!(data.len(), 1024);
    data.fill(0x5A);
    r.pending.complete(Ok(()), &mut buf);
    assert_eq!(buf.len(), ATA_HEADER_LEN + 1024);
    let (status, err, count, data) = ata_regs(&buf);
    assert_eq!((status, err, count), (ata::STATUS_DRDY, 0, 0));
    assert!(data.iter().all(|&b| b == 0x5A));
    let fr = frame(&buf);
    assert_eq!((fr.header.dst, fr.header.shelf, fr.header.slot), (A, 1, 0));
    // Failures: UNC for a medium error on read, IDNF, ABRT, error 3.
    for (fail, err) in [
        (IoFailure::Medium, ata::ERROR_UNC),
        (IoFailure::OutOfRange, ata::ERROR_IDNF),
        (IoFailure::Aborted, ata::ERROR_ABRT),
    ] {
        let mut buf = Vec::new();
        r.pending.prepare_read(&mut buf);
        r.pending.complete(Err(fail), &mut buf);
        assert_eq!(buf.len(), MIN_FRAME_LEN, "no data on failure");
        assert_eq!(st3(&buf), (FAILED, err, 2));
    }
    let mut buf = Vec::new();
    r.pending.complete(Err(IoFailure::Unavailable), &mut buf);
    assert_eq!(aoe_error(&buf), Some(ErrorCode::DeviceUnavailable));
    // Built in place (a transmit slot holding stale bytes): the same frame
    // as prepare_read + complete.
    let mut want = Vec::new();
    r.pending.prepare_read(&mut want).fill(0x5A);
    r.pending.complete(Ok(()), &mut want);
    let mut slot = vec![0xEE; 9014];
    let n = r
        .pending
        .write_read_response(&[0x5A; 1100], &mut slot)
        .unwrap();
    assert_eq!(&slot[..n], &want[..]);
    assert_eq!(
        r.pending.write_read_response(&[0x5A; 1023], &mut slot),
        None,
        "short data"
    );
    assert_eq!(
        r.pending
            .write_read_response(&[0x5A; 1024], &mut slot[..100]),
        None,
        "small slot"
    );
}

#[test]
fn read_checks_range_and_frame_size() {
    let mut t = target();
    // Past the end: IDNF.
    let r = one(t.handle(&ata_req(
        A,
        RW,
        0x40,
        ata::CMD_READ_SECTORS_EXT,
        2,
        999,
        &[],
    )));
    assert_eq!(st(&r), (FAILED, ata::ERROR_IDNF));
    // More sectors than a frame carries: ABRT.
    let r = one(t.handle(&ata_req(A, RW, 0x40, ata::CMD_READ_SECTORS_EXT, 3, 0, &[])));
    assert_eq!(st(&r), (FAILED, ata::ERROR_ABRT));
    // Zero sectors: nothing to do.
    let r = one(t.handle(&ata_req(A, RW, 0x40, ata::CMD_READ_SECTORS_EXT, 0, 5, &[])));
    assert_eq!(st(&r), (ata::STATUS_DRDY, 0));
    // LBA28: byte 3's device nibble is not address.
    let r = io(t.handle(&ata_req(
        A,
        RW,
        0,
        ata::CMD_READ_SECTORS,
        1,
        0xE000_0010,
        &[],
    )));
    assert_eq!(
        r.op,
        IoOp::Read {
            lba: 0x10,
            sectors: 1
        }
    );
    // The read request padded to 60 bytes carries no data: fine.
    let f = ata_req(A, RW, 0x40, ata::CMD_READ_SECTORS_EXT, 1, 0, &[]);
    assert_eq!(f.len(), MIN_FRAME_LEN);
}

#[test]
fn write_paths() {
    let mut t = target();
    let data: Vec<u8> = (0..1024).map(|i| i as u8).collect();
    let f = ata_req(
        A,
        RW,
        AtaFlags::EXTENDED | AtaFlags::WRITE,
        ata::CMD_WRITE_SECTORS_EXT,
        2,
        10,
        &data,
    );
    let r = io(t.handle(&f));
    let IoOp::Write {
        lba,
        sectors,
        data: range,
        asynchronous,
    } = r.op.clone()
    else {
        panic!("{:?}", r.op)
    };
    assert_eq!((lba, sectors, asynchronous), (10, 2, false));
    assert_eq!(&f[range], &data[..]);
    let mut buf = vec![1; 2000];
    r.pending.complete(Ok(()), &mut buf);
    assert_eq!(buf.len(), MIN_FRAME_LEN);
    assert_eq!(st3(&buf), (ata::STATUS_DRDY, 0, 0));
    r.pending.complete(Err(IoFailure::Medium), &mut buf);
    assert_eq!(st(&buf), (FAILED, ata::ERROR_ABRT));
    // Asynchronous flag passed on.
    let f = ata_req(A, RW, 0x43, ata::CMD_WRITE_SECTORS_EXT, 1, 0, &data[..512]);
    assert!(matches!(
        io(t.handle(&f)).op,
        IoOp::Write {
            asynchronous: true,
            ..
        }
    ));
    // Read-only device: ABRT.
    let f = ata_req(A, RO, 0x41, ata::CMD_WRITE_SECTORS_EXT, 1, 0, &data[..512]);
    assert_eq!(st(&one(t.handle(&f))), (FAILED, ata::ERROR_ABRT));
    // Past the end: IDNF; too many sectors: ABRT.
    let f = ata_req(A, RW, 0x41, ata::CMD_WRITE_SECTORS_EXT, 2, 999, &data);
    assert_eq!(st(&one(t.handle(&f))), (FAILED, ata::ERROR_IDNF));
    let big = vec![0; 1536];
    let f = ata_req(A, RW, 0x41, ata::CMD_WRITE_SECTORS_EXT, 3, 0, &big);
    assert_eq!(st(&one(t.handle(&f))), (FAILED, ata::ERROR_ABRT));
    // Sector count needs more data than the frame carries: error 2.
    let f = ata_req(A, RW, 0x41, ata::CMD_WRITE_SECTORS_EXT, 2, 0, &data[..600]);
    assert_eq!(aoe_error(&one(t.handle(&f))), Some(ErrorCode::BadArgument));
    // W flag disagreeing with the command: error 2.
    let f = ata_req(A, RW, 0x40, ata::CMD_WRITE_SECTORS_EXT, 1, 0, &[]);
    assert_eq!(aoe_error(&one(t.handle(&f))), Some(ErrorCode::BadArgument));
    let f = ata_req(A, RW, 0x41, ata::CMD_READ_SECTORS_EXT, 1, 0, &data[..512]);
    assert_eq!(aoe_error(&one(t.handle(&f))), Some(ErrorCode::BadArgument));
}

#[test]
fn flush() {
    let mut t = target();
    for op in [ata::CMD_FLUSH_CACHE, ata::CMD_FLUSH_CACHE_EXT] {
        let r = io(t.handle(&ata_req(A, RW, 0, op, 0, 0, &[])));
        assert_eq!(r.op, IoOp::Flush);
        assert!(r.pending.data_range().is_empty());
        let mut buf = Vec::new();
        r.pending.complete(Ok(()), &mut buf);
        assert_eq!(st(&buf), (ata::STATUS_DRDY, 0));
    }
    // Nothing to flush on a read-only device.
    let r = one(t.handle(&ata_req(A, RO, 0, ata::CMD_FLUSH_CACHE_EXT, 0, 0, &[])));
    assert_eq!(st(&r), (ata::STATUS_DRDY, 0));
}

#[test]
fn ata_to_broadcast_address_dropped() {
    let mut t = target();
    let f = ata_req(
        A,
        DeviceAddr::new(1, 0xFF),
        0,
        ata::CMD_IDENTIFY_DEVICE,
        1,
        0,
        &[],
    );
    assert_eq!(t.handle(&f), Action::Drop(DropReason::BroadcastAta));
}

#[test]
fn unavailable_device_answers_error_3() {
    let mut t = target();
    t.set_available(RW, false).unwrap();
    let r = one(t.handle(&ata_req(A, RW, 0x40, ata::CMD_READ_SECTORS_EXT, 1, 0, &[])));
    assert_eq!(aoe_error(&r), Some(ErrorCode::DeviceUnavailable));
    // Config queries still work.
    assert_eq!(
        aoe_error(&one(t.handle(&config_req(
            A,
            1,
            0,
            ConfigCommand::Read,
            b""
        )))),
        None
    );
    t.set_available(RW, true).unwrap();
    t.set_capacity(RW, 2000).unwrap();
    assert!(matches!(
        t.handle(&ata_req(A, RW, 0x40, 0x24, 1, 1500, &[])),
        Action::Io(_)
    ));
}

fn reserve_req(src: Mac, cmd: ReserveCommand, macs: &[Mac]) -> Vec<u8> {
    let mut arg = Vec::new();
    ReserveArg::encode(cmd, macs, &mut arg);
    req(src, RW.shelf, RW.slot, Command::Reserve, &arg)
}

fn reserve_list(f: &[u8]) -> Vec<Mac> {
    match frame(f).message {
        Message::Reserve(r) => r.macs().collect(),
        m => panic!("not reserve: {m:?}"),
    }
}

#[test]
fn reserve_release() {
    let mut t = target();
    let read = one(t.handle(&reserve_req(A, ReserveCommand::Read, &[])));
    assert!(reserve_list(&read).is_empty());
    // A reserves the device.
    let r = one(t.handle(&reserve_req(A, ReserveCommand::Set, &[A])));
    assert_eq!(aoe_error(&r), None);
    assert_eq!(reserve_list(&r), [A]);
    assert_eq!(
        t.poll_event(),
        Some(TargetEvent::ReservationChanged {
            device: RW,
            reservation: vec![A]
        })
    );
    // B's ATA commands get error 6, A's work.
    let id = |src| ata_req(src, RW, 0, ata::CMD_IDENTIFY_DEVICE, 1, 0, &[]);
    assert_eq!(
        aoe_error(&one(t.handle(&id(B)))),
        Some(ErrorCode::TargetReserved)
    );
    assert_eq!(aoe_error(&one(t.handle(&id(A)))), None);
    let w = ata_req(B, RW, 0x41, ata::CMD_WRITE_SECTORS_EXT, 1, 0, &[0; 512]);
    assert_eq!(
        aoe_error(&one(t.handle(&w))),
        Some(ErrorCode::TargetReserved)
    );
    // The other device is not reserved.
    let other = ata_req(B, RO, 0, ata::CMD_IDENTIFY_DEVICE, 1, 0, &[]);
    assert_eq!(aoe_error(&one(t.handle(&other))), None);
    // B may not Set, and gets the current list back.
    let r = one(t.handle(&reserve_req(B, ReserveCommand::Set, &[B])));
    assert_eq!(aoe_error(&r), Some(ErrorCode::TargetReserved));
    assert_eq!(reserve_list(&r), [A]);
    // B may read it.
    assert_eq!(
        reserve_list(&one(t.handle(&reserve_req(B, ReserveCommand::Read, &[])))),
        [A]
    );
    // A adds B.
    let r = one(t.handle(&reserve_req(A, ReserveCommand::Set, &[A, B])));
    assert_eq!(reserve_list(&r), [A, B]);
    assert_eq!(aoe_error(&one(t.handle(&id(B)))), None);
    // B force-sets to itself only; A is locked out.
    one(t.handle(&reserve_req(B, ReserveCommand::ForceSet, &[B])));
    assert_eq!(
        aoe_error(&one(t.handle(&id(A)))),
        Some(ErrorCode::TargetReserved)
    );
    // B releases.
    let r = one(t.handle(&reserve_req(B, ReserveCommand::Set, &[])));
    assert!(reserve_list(&r).is_empty());
    assert_eq!(aoe_error(&one(t.handle(&id(A)))), None);
    assert_eq!(t.device(RW).unwrap().reservation, []);
    // Too many MACs, unknown RCmd, count beyond the frame: error 2.
    let r = one(t.handle(&reserve_req(A, ReserveCommand::Set, &[A; 65])));
    assert_eq!(aoe_error(&r), Some(ErrorCode::BadArgument));
    let r = one(t.handle(&req(A, 1, 0, Command::Reserve, &[7, 0])));
    assert_eq!(aoe_error(&r), Some(ErrorCode::BadArgument));
    let r = one(t.handle(&req(A, 1, 0, Command::Reserve, &[1, 200, 1, 2, 3])));
    assert_eq!(aoe_error(&r), Some(ErrorCode::BadArgument));
}

fn mask_req(src: Mac, cmd: MaskCommand, dirs: &[Directive]) -> Vec<u8> {
    let mut arg = Vec::new();
    MaskArg::encode(cmd, 0, dirs, &mut arg);
    req(src, RW.shelf, RW.slot, Command::MacMask, &arg)
}

/// (MError, Dir Count, MACs) of a mask reply.
fn mask_of(f: &[u8]) -> (u8, u8, Vec<Mac>) {
    match frame(f).message {
        Message::MacMask(m) => (m.error, m.count, m.directives().map(|d| d.mac).collect()),
        m => panic!("not mask: {m:?}"),
    }
}

#[test]
fn mac_mask_list_edit_and_enforcement() {
    use DirectiveCommand::{Add, Delete};
    let mut t = target();
    let r = one(t.handle(&mask_req(A, MaskCommand::Read, &[])));
    assert_eq!(mask_of(&r), (0, 0, vec![]));
    // Add A (twice: idempotent) and a no-op directive.
    let dirs = [
        Directive::new(Add, A),
        Directive::new(DirectiveCommand::None, B),
        Directive::new(Add, A),
    ];
    let r = one(t.handle(&mask_req(A, MaskCommand::Edit, &dirs)));
    assert_eq!(mask_of(&r), (0, 1, vec![A]));
    assert_eq!(
        t.poll_event(),
        Some(TargetEvent::MaskChanged {
            device: RW,
            mask: vec![A]
        })
    );
    // B is now ignored on this device, whatever it sends.
    assert_eq!(
        t.handle(&config_req(B, 1, 0, ConfigCommand::Read, b"")),
        Action::Drop(DropReason::Masked)
    );
    let id = ata_req(B, RW, 0, ata::CMD_IDENTIFY_DEVICE, 1, 0, &[]);
    assert_eq!(t.handle(&id), Action::Drop(DropReason::Masked));
    assert_eq!(
        t.handle(&mask_req(B, MaskCommand::Read, &[])),
        Action::Drop(DropReason::Masked)
    );
    // ...but a broadcast query still reaches the unmasked device.
    assert_eq!(
        replies(t.handle(&config_req(B, 0xFFFF, 0xFF, ConfigCommand::Read, b""))).len(),
        1
    );
    // A bad DCmd stops the edit: the directives before it stay applied.
    let dirs = [
        Directive::new(Add, B),
        Directive { command: 9, mac: B },
        Directive::new(Delete, A),
    ];
    let r = one(t.handle(&mask_req(A, MaskCommand::Edit, &dirs)));
    assert_eq!(mask_of(&r), (MaskError::BadDirective as u8, 1, vec![B]));
    assert_eq!(t.device(RW).unwrap().mask, [A, B]);
    // Delete B.
    let r = one(t.handle(&mask_req(
        A,
        MaskCommand::Edit,
        &[Directive::new(Delete, B)],
    )));
    assert_eq!(mask_of(&r).2, [A]);
    // Fill the list: MError 3 at the directive that did not fit.
    let many: Vec<Directive> = (0..MAX_MASK_MACS as u8)
        .map(|i| Directive::new(Add, Mac([2, 0, 0, 0, 1, i])))
        .collect();
    let r = one(t.handle(&mask_req(A, MaskCommand::Edit, &many)));
    let (merror, count, _) = mask_of(&r);
    assert_eq!(
        (merror, count),
        (MaskError::ListFull as u8, (MAX_MASK_MACS - 1) as u8)
    );
    assert_eq!(t.device(RW).unwrap().mask.len(), MAX_MASK_MACS);
    // Unknown MCmd: error 2.
    let r = one(t.handle(&req(A, 1, 0, Command::MacMask, &[0, 5, 0, 0])));
    assert_eq!(aoe_error(&r), Some(ErrorCode::BadArgument));
    // Deleting every entry opens the device again.
    let all: Vec<Directive> = t
        .device(RW)
        .unwrap()
        .mask
        .iter()
        .map(|m| Directive::new(Delete, *m))
        .collect();
    one(t.handle(&mask_req(A, MaskCommand::Edit, &all)));
    assert_eq!(
        replies(t.handle(&config_req(B, 1, 0, ConfigCommand::Read, b""))).len(),
        1
    );
}

#[test]
fn announce_broadcasts_or_unicasts_to_the_mask() {
    let mut t = target();
    t.handle(&mask_req(
        A,
        MaskCommand::Edit,
        &[Directive::new(DirectiveCommand::Add, A)],
    ));
    let frames = t.announce();
    assert_eq!(frames.len(), 2);
    let dsts: Vec<Mac> = frames
        .iter()
        .map(|f| Header::decode(f).unwrap().dst)
        .collect();
    assert_eq!(dsts, [A, Mac::BROADCAST]);
    for f in &frames {
        let info = decode(f).unwrap();
        assert!(info.header.response);
        assert!(matches!(info.message, Message::Config(_)));
    }
}
