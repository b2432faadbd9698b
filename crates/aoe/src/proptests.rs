//! Property tests across the codec (AoE r11 §2–§3): encode→decode round
//! trips for every message, and no panic on arbitrary bytes in the decoder,
//! the target or the initiator.

use std::time::Instant;

use proptest::prelude::*;

use crate::ata::{self, IdentifyParams};
use crate::config::{ConfigArg, ConfigCommand};
use crate::frame::{pad, Command, Header, Mac, HEADER_LEN, MIN_FRAME_LEN};
use crate::initiator::{AtaRequest, Initiator, InitiatorConfig, TargetInfo};
use crate::issue::{AtaArg, AtaFlags, SECTOR_SIZE};
use crate::mask::{Directive, MaskArg, MaskCommand};
use crate::message::{decode, Message};
use crate::reserve::{ReserveArg, ReserveCommand};
use crate::target::{Action, AoeTarget, DeviceAddr, DeviceConfig, IoFailure, TargetConfig};

const TMAC: Mac = Mac([2, 0, 0, 0, 0, 0x10]);

fn mac() -> impl Strategy<Value = Mac> {
    any::<[u8; 6]>().prop_map(Mac)
}

fn header() -> impl Strategy<Value = Header> {
    (
        mac(),
        mac(),
        0u8..16,
        any::<bool>(),
        any::<bool>(),
        any::<u8>(),
        any::<u16>(),
        any::<u8>(),
        any::<u8>(),
        any::<u32>(),
    )
        .prop_map(
            |(dst, src, version, response, error_flag, error, shelf, slot, command, tag)| Header {
                dst,
                src,
                version,
                response,
                error_flag,
                error,
                shelf,
                slot,
                command,
                tag,
            },
        )
}

fn with_header(command: Command, response: bool, arg: &[u8]) -> Vec<u8> {
    let mut h = Header::request(TMAC, Mac([2, 0, 0, 0, 0, 1]), 1, 0, command, 9);
    h.response = response;
    let mut f = Vec::new();
    h.encode(&mut f);
    f.extend_from_slice(arg);
    pad(&mut f);
    f
}

fn target() -> AoeTarget {
    let mut t = AoeTarget::new(TargetConfig::new(TMAC, 9000));
    t.add_device(DeviceAddr::new(1, 0), DeviceConfig::new(64))
        .unwrap();
    t.add_device(
        DeviceAddr::new(1, 1),
        DeviceConfig {
            read_only: true,
            ..DeviceConfig::new(8)
        },
    )
    .unwrap();
    t
}

/// Everything the target sends is padded and is a response; all but error
/// responses (which echo the faulty argument) decode as a whole.
fn check_action(a: Action, frame: &[u8]) {
    let check = |f: &[u8]| {
        assert!(f.len() >= MIN_FRAME_LEN);
        let h = Header::decode(f).expect("target replies have a header");
        assert!(h.response);
        if !h.error_flag {
            decode(f).expect("target replies decode");
        }
    };
    match a {
        Action::Drop(_) => {}
        Action::Reply(frames) => frames.iter().for_each(|f| check(f)),
        Action::Io(io) => {
            if let crate::target::IoOp::Write { data, .. } = &io.op {
                assert!(data.end <= frame.len());
            }
            let mut out = Vec::new();
            io.pending.prepare_read(&mut out).fill(0xA5);
            io.pending.complete(Ok(()), &mut out);
            check(&out);
            io.pending.complete(Err(IoFailure::Medium), &mut out);
            check(&out);
        }
    }
}

proptest! {
    #[test]
    fn header_round_trip(h in header()) {
        let mut f = Vec::new();
        h.encode(&mut f);
        prop_assert_eq!(Header::decode(&f).unwrap(), h);
    }

    #[test]
    fn ata_round_trip(flags in any::<u8>(), feat in any::<u8>(), count in 0u8..8, cmd in any::<u8>(), lba in 0u64..(1 << 48), fill in any::<u8>(), extra in 0usize..64) {
        let len = if flags & AtaFlags::WRITE != 0 { usize::from(count) * SECTOR_SIZE } else { 0 };
        let data = vec![fill; len];
        let a = AtaArg { flags: AtaFlags(flags), err_feature: feat, sector_count: count, cmd_status: cmd, lba, data: &data };
        let mut arg = Vec::new();
        a.encode(&mut arg);
        arg.extend(std::iter::repeat_n(0, extra));
        let f = with_header(Command::Ata, false, &arg);
        let d = decode(&f).unwrap();
        prop_assert_eq!(d.message, Message::Ata(a));
    }

    #[test]
    fn config_round_trip(bc in any::<u16>(), fw in any::<u16>(), sc in any::<u8>(), ver in 0u8..16, cmd in 0u8..5, s in proptest::collection::vec(any::<u8>(), 0..1025)) {
        let c = ConfigArg { buffer_count: bc, firmware_version: fw, sector_count: sc, aoe_version: ver, command: ConfigCommand::from_u8(cmd).unwrap(), config: &s };
        let mut arg = Vec::new();
        c.encode(&mut arg);
        let f = with_header(Command::Config, true, &arg);
        prop_assert_eq!(decode(&f).unwrap().message, Message::Config(c));
    }

    #[test]
    fn mask_round_trip(edit in any::<bool>(), err in any::<u8>(), dirs in proptest::collection::vec((any::<u8>(), mac()), 0..40)) {
        let dirs: Vec<Directive> = dirs.into_iter().map(|(command, mac)| Directive { command, mac }).collect();
        let cmd = if edit { MaskCommand::Edit } else { MaskCommand::Read };
        let mut arg = Vec::new();
        MaskArg::encode(cmd, err, &dirs, &mut arg);
        let f = with_header(Command::MacMask, false, &arg);
        let Message::MacMask(m) = decode(&f).unwrap().message else { panic!() };
        prop_assert_eq!((m.command, m.error, usize::from(m.count)), (cmd, err, dirs.len()));
        prop_assert_eq!(m.directives().collect::<Vec<_>>(), dirs);
    }

    #[test]
    fn reserve_round_trip(cmd in 0u8..3, macs in proptest::collection::vec(mac(), 0..60)) {
        let cmd = ReserveCommand::from_u8(cmd).unwrap();
        let mut arg = Vec::new();
        ReserveArg::encode(cmd, &macs, &mut arg);
        let f = with_header(Command::Reserve, false, &arg);
        let Message::Reserve(r) = decode(&f).unwrap().message else { panic!() };
        prop_assert_eq!(r.command, cmd);
        prop_assert_eq!(r.macs().collect::<Vec<_>>(), macs);
    }

    #[test]
    fn identify_round_trip(sectors in 0u64..(1 << 48), model in "[ -~]{0,40}", serial in "[ -~]{0,20}", fw in "[ -~]{0,8}", wc in any::<bool>()) {
        let id = ata::identify_data(&IdentifyParams { sectors, model: &model, serial: &serial, firmware: &fw, write_cache: wc });
        let info = ata::parse_identify(&id).unwrap();
        prop_assert_eq!(info.sectors, sectors);
        prop_assert_eq!(info.model, model.trim());
        prop_assert_eq!(info.serial, serial.trim());
        prop_assert_eq!(info.firmware, fw.trim());
        prop_assert_eq!(info.write_cache, wc);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1200)) {
        let _ = decode(&bytes);
        let _ = ata::parse_identify(&bytes);
        check_action(target().handle(&bytes), &bytes);
        let info = TargetInfo { mac: TMAC, shelf: 1, slot: 0, buffer_count: 4, max_sectors: 2, firmware_version: 0, aoe_version: 1, config: vec![] };
        let mut i = Initiator::new(InitiatorConfig::new(Mac([2, 0, 0, 0, 0, 1])), info);
        i.submit(AtaRequest::Read { lba: 0, sectors: 1 }).unwrap();
        let now = Instant::now();
        i.poll_transmit(now);
        let _ = i.on_frame(&bytes, now);
    }

    /// Valid headers with arbitrary arguments reach deep into the target.
    #[test]
    fn target_survives_arbitrary_arguments(command in 0u8..5, slot in prop_oneof![Just(0u8), Just(1), Just(0xFF)], arg in proptest::collection::vec(any::<u8>(), 0..1100)) {
        let mut t = target();
        let mut f = Vec::new();
        let mut h = Header::request(TMAC, Mac([2, 0, 0, 0, 0, 1]), 1, slot, Command::Ata, 7);
        h.command = command;
        h.encode(&mut f);
        f.extend_from_slice(&arg);
        check_action(t.handle(&f), &f);
        // And with a frame cut anywhere.
        let cut = arg.len() / 2 + HEADER_LEN;
        check_action(t.handle(&f[..cut.min(f.len())]), &f);
    }
}
