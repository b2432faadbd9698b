//! The seed corpus of the `aoe_frame` fuzz target (fuzz/seeds/aoe_frame/):
//! valid frames for each command, and one length-prefixed sequence. The
//! test checks the committed files match what the codec builds today;
//! `AOE_WRITE_SEEDS=1 cargo test -p ethersan-aoe --test fuzz_seeds`
//! rewrites them.

use std::path::PathBuf;

use ethersan_aoe::config::{ConfigArg, ConfigCommand};
use ethersan_aoe::frame::{pad, Command};
use ethersan_aoe::initiator::discovery_frame;
use ethersan_aoe::issue::{AtaArg, AtaFlags};
use ethersan_aoe::mask::{Directive, DirectiveCommand, MaskArg, MaskCommand};
use ethersan_aoe::reserve::{ReserveArg, ReserveCommand};
use ethersan_aoe::{ata, Header, Mac};

const TMAC: Mac = Mac([2, 0, 0, 0, 0, 0x10]);
const HOST: Mac = Mac([2, 0, 0, 0, 0, 0x0A]);

fn frame(command: Command, slot: u8, arg: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut f = Vec::new();
    Header::request(TMAC, HOST, 1, slot, command, 0x0102_0304).encode(&mut f);
    arg(&mut f);
    pad(&mut f);
    f
}

fn ata_frame(flags: u8, cmd: u8, count: u8, lba: u64, data: &[u8]) -> Vec<u8> {
    frame(Command::Ata, 0, |f| {
        AtaArg {
            flags: AtaFlags(flags),
            err_feature: 0,
            sector_count: count,
            cmd_status: cmd,
            lba,
            data,
        }
        .encode(f)
    })
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mask_add = frame(Command::MacMask, 0, |f| {
        MaskArg::encode(
            MaskCommand::Edit,
            0,
            &[Directive::new(DirectiveCommand::Add, HOST)],
            f,
        )
    });
    let reserve = frame(Command::Reserve, 0, |f| {
        ReserveArg::encode(ReserveCommand::Set, &[HOST], f)
    });
    let write = ata_frame(0x41, ata::CMD_WRITE_SECTORS_EXT, 2, 8, &[0xC3; 1024]);
    let mut sequence = Vec::new();
    for f in [&mask_add, &reserve, &write] {
        sequence.extend_from_slice(&(f.len() as u16).to_be_bytes());
        sequence.extend_from_slice(f);
    }
    vec![
        ("discovery", discovery_frame(HOST, 1)),
        (
            "config_set",
            frame(Command::Config, 0, |f| {
                ConfigArg::request(ConfigCommand::Set, b"host-a").encode(f)
            }),
        ),
        (
            "config_prefix",
            frame(Command::Config, 1, |f| {
                ConfigArg::request(ConfigCommand::TestPrefix, b"fu").encode(f)
            }),
        ),
        ("mask_add", mask_add),
        ("reserve_set", reserve),
        (
            "identify",
            ata_frame(0, ata::CMD_IDENTIFY_DEVICE, 1, 0xA000_0000, &[]),
        ),
        (
            "read_ext",
            ata_frame(0x40, ata::CMD_READ_SECTORS_EXT, 2, 62, &[]),
        ),
        (
            "read28",
            ata_frame(0, ata::CMD_READ_SECTORS, 1, 0xE000_0003, &[]),
        ),
        ("write_ext", write),
        (
            "flush_ext",
            ata_frame(0x40, ata::CMD_FLUSH_CACHE_EXT, 0, 0, &[]),
        ),
        ("sequence", sequence),
    ]
}

#[test]
fn fuzz_seeds_are_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/aoe_frame");
    let write = std::env::var_os("AOE_WRITE_SEEDS").is_some();
    if write {
        std::fs::create_dir_all(&dir).unwrap();
    }
    for (name, bytes) in seeds() {
        let path = dir.join(name);
        if write {
            std::fs::write(&path, &bytes).unwrap();
        }
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            on_disk,
            bytes,
            "{} is stale; rerun with AOE_WRITE_SEEDS=1",
            path.display()
        );
    }
}
