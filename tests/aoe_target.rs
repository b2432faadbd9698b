//! `ethersan serve --aoe`: the AoE target as an initiator on the same
//! Ethernet segment sees it. The segment is a pair of unix datagram
//! sockets (one Ethernet frame per datagram, as QEMU's `-netdev dgram`),
//! the initiator ethersan's AoE protocol core: discovery, IDENTIFY, data
//! through AoE read back through iSCSI (one volume under both), the ATA
//! and AoE errors, a config string kept across a restart, the MAC access
//! list, and garbage that harms nothing.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::aoe::{ok_all, Wire};
use common::*;
use ethersan_aoe::ata;
use ethersan_aoe::initiator::{discovery_frame, AtaRequest, CommandError};

fn serve_args(dir: &Path, luns: &[String], extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["serve", "--target", IQN, "--listen", "127.0.0.1:0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for l in luns {
        a.push("--lun".into());
        a.push(l.clone());
    }
    a.push("--aoe".into());
    a.push(format!(
        "unix:{},peer={}",
        dir.join("target.sock").display(),
        dir.join("client.sock").display()
    ));
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Writes of `data` at `lba`, one frame's worth each.
fn writes(lba: u64, data: &[u8], per: usize) -> Vec<AtaRequest> {
    data.chunks(per * 512)
        .enumerate()
        .map(|(i, c)| AtaRequest::Write {
            lba: lba + (i * per) as u64,
            data: c.to_vec(),
        })
        .collect()
}

fn reads(lba: u64, sectors: u64, per: u8) -> Vec<AtaRequest> {
    (0..sectors)
        .step_by(usize::from(per))
        .map(|s| AtaRequest::Read {
            lba: lba + s,
            sectors: (sectors - s).min(u64::from(per)) as u8,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aoe_devices_answer_share_their_volume_with_iscsi_and_keep_their_config() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let disk: PathBuf = d.join("disk.img");
    let ro: PathBuf = d.join("ro.img");
    std::fs::write(&ro, pattern(4 << 20, 7)).unwrap();
    let luns = vec![
        format!("{}:8M", path_str(&disk)),
        format!("{},ro", path_str(&ro)),
        "ram:2M,aoe=5.9".to_string(),
        "ram:1M,aoe=off".to_string(),
    ];
    let server = Server::start_args(&serve_args(d, &luns, &[]));
    let wire = Wire::open(d, "02:00:00:00:aa:01".parse().unwrap());

    // Discovery: three devices (LUN 3 is not exported), 2 sectors a frame
    // at MTU 1500.
    let found = wire.discover().await;
    let addrs: Vec<(u16, u8)> = found.iter().map(|t| (t.shelf, t.slot)).collect();
    assert_eq!(addrs, vec![(0, 0), (0, 1), (5, 9)], "{found:?}");
    assert!(found
        .iter()
        .all(|t| t.max_sectors == 2 && t.buffer_count > 1));
    let (d0, d1, d2) = (&found[0], &found[1], &found[2]);

    // IDENTIFY: LBA48 capacity, the LUN's serial (the one iSCSI reports).
    let id = ok_all(wire.run(d0, vec![AtaRequest::Identify]).await);
    let info = ata::parse_identify(&id).unwrap();
    assert_eq!(info.sectors, (8 << 20) / 512);
    let inq = ok(&ethersan(&["inquiry", "--json", &server.url(0)]));
    let inq: serde_json::Value = serde_json::from_str(&inq).unwrap();
    let serial = inq["serial"].as_str().unwrap();
    assert_eq!(info.serial.trim(), &serial[..serial.len().min(20)]);

    // 1 MiB through AoE, read back through AoE and through iSCSI.
    let data = pattern(1 << 20, 42);
    ok_all(wire.run(d0, writes(100, &data, 2)).await);
    ok_all(wire.run(d0, vec![AtaRequest::Flush]).await);
    let back = ok_all(wire.run(d0, reads(100, 2048, 2)).await);
    assert!(back == data, "AoE read-back differs");
    let via_iscsi = d.join("via-iscsi.img");
    ok(&ethersan(&[
        "cp",
        &server.url(0),
        &path_str(&via_iscsi),
        "--offset",
        &(100 * 512).to_string(),
        "--length",
        "1M",
    ]));
    assert!(
        std::fs::read(&via_iscsi).unwrap() == data,
        "iSCSI sees other data"
    );
    // And the other way: iSCSI writes, AoE reads.
    let src = d.join("src.img");
    let more = pattern(64 << 10, 9);
    std::fs::write(&src, &more).unwrap();
    ok(&ethersan(&["cp", &path_str(&src), &server.url(2)]));
    assert!(ok_all(wire.run(d2, reads(0, 128, 2)).await) == more);

    // Errors: a write to the read-only LUN is aborted and changes nothing;
    // a read past the end is IDNF.
    let r = wire
        .run(
            d1,
            vec![AtaRequest::Write {
                lba: 0,
                data: vec![0xee; 512],
            }],
        )
        .await;
    assert!(
        matches!(r[0], Err(CommandError::Ata { error, .. }) if error & ata::ERROR_ABRT != 0),
        "{r:?}"
    );
    assert!(
        std::fs::read(&ro).unwrap() == pattern(4 << 20, 7),
        "read-only LUN written"
    );
    let r = wire
        .run(
            d0,
            vec![AtaRequest::Read {
                lba: (8 << 20) / 512 - 1,
                sectors: 2,
            }],
        )
        .await;
    assert!(
        matches!(r[0], Err(CommandError::Ata { error, .. }) if error & ata::ERROR_IDNF != 0),
        "{r:?}"
    );

    // Garbage on the wire harms nothing: short frames, another version,
    // unknown commands, a write whose sector count needs more data than
    // the frame holds.
    let mut bad: Vec<Vec<u8>> = vec![vec![0u8; 3], vec![0xffu8; 14]];
    let mut f = discovery_frame(wire.mac, 9);
    f[14] = 0x20; // version 2
    bad.push(f.clone());
    f[14] = 0x10;
    f[22] = 0x77; // unknown command
    bad.push(f);
    // WRITE SECTORS EXT of 2 sectors to e0.0 with no data in the frame.
    let mut short_write = Vec::new();
    short_write.extend_from_slice(&d0.mac.0);
    short_write.extend_from_slice(&wire.mac.0);
    short_write.extend_from_slice(&[0x88, 0xa2, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0x42]);
    short_write.extend_from_slice(&[0x41, 0, 2, 0x34, 0, 0, 0, 0, 0, 0, 0, 0]);
    short_write.resize(60, 0);
    bad.push(short_write);
    // Straight onto the socket: the link itself refuses runt frames.
    let raw = std::os::unix::net::UnixDatagram::unbound().unwrap();
    for g in &bad {
        raw.send_to(g, d.join("target.sock")).unwrap();
    }
    let _ = wire.collect(Duration::from_millis(300)).await;
    let still = ok_all(wire.run(d0, reads(100, 2, 2)).await);
    assert_eq!(still, data[..1024]);

    // A config string set over AoE survives a restart (kept beside the
    // backing file); RAM LUNs keep none.
    use ethersan_aoe::config::ConfigCommand;
    let set = wire
        .config(d0, ConfigCommand::Set, b"ethersan test disk")
        .await;
    assert!(
        matches!(&set, Some(Ok(t)) if t.config == b"ethersan test disk"),
        "{set:?}"
    );
    // Set again with another string: error 4, config string present.
    let again = wire.config(d0, ConfigCommand::Set, b"another").await;
    assert!(
        matches!(
            again,
            Some(Err(ethersan_aoe::initiator::ResponseError::Aoe(4)))
        ),
        "{again:?}"
    );
    drop(server);
    drop(wire);
    let _server = Server::start_args(&serve_args(d, &luns, &[]));
    let wire = Wire::open(d, "02:00:00:00:aa:01".parse().unwrap());
    let found = wire.discover().await;
    assert_eq!(found[0].config, b"ethersan test disk", "{found:?}");
    assert!(found[2].config.is_empty());
    // The data is still there.
    assert!(ok_all(wire.run(&found[0], reads(100, 2048, 2)).await) == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_macs_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = d.join("ethersan.toml");
    std::fs::write(
        &cfg,
        format!(
            "portals = [\"127.0.0.1:0\"]\n\
             [[target]]\nname = \"{IQN}\"\n\
             [[target.lun]]\nram = \"1M\"\n\
             [aoe]\nunix = [\"unix:target.sock,peer=client.sock\"]\n\
             allowed_macs = [\"02:00:00:00:bb:02\"]\n"
        ),
    )
    .unwrap();
    let _server = Server::start_args(&["serve".into(), "--config".into(), path_str(&cfg)]);
    // A stranger gets no answer at all.
    let stranger = Wire::open(d, "02:00:00:00:bb:01".parse().unwrap());
    assert!(stranger.discover().await.is_empty());
    drop(stranger);
    // The allowed MAC finds the device and uses it.
    let allowed = Wire::open(d, "02:00:00:00:bb:02".parse().unwrap());
    let found = allowed.discover().await;
    assert_eq!(found.len(), 1, "{found:?}");
    let data = pattern(4096, 3);
    ok_all(allowed.run(&found[0], writes(8, &data, 2)).await);
    assert!(ok_all(allowed.run(&found[0], reads(8, 8, 2)).await) == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn luns_that_iscsi_guards_go_over_aoe_only_when_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let luns = vec!["ram:1M".to_string(), "ram:1M,aoe=0.7".to_string()];
    let server = Server::start_args(&serve_args(d, &luns, &["--chap", "alice:alice-secret-123"]));
    let wire = Wire::open(d, "02:00:00:00:cc:01".parse().unwrap());
    let found = wire.discover().await;
    let addrs: Vec<(u16, u8)> = found.iter().map(|t| (t.shelf, t.slot)).collect();
    assert_eq!(addrs, vec![(0, 7)], "{found:?}");
    let log = server.log.lock().unwrap().join("\n");
    assert!(
        log.contains("LUN 0 of") && log.contains("not exported over AoE"),
        "{log}"
    );
}

#[test]
fn aoe_configuration_mistakes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fails = |args: &[&str]| error_line(&ethersan(args), &format!("{args:?}"));
    let link = format!("unix:{}/t.sock,peer={}/c.sock", d.display(), d.display());
    let l = fails(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--lun",
        "ram:1M,bs=4096",
        "--aoe",
        &link,
    ]);
    assert!(
        l.contains("AoE sectors are 512 bytes") && l.contains("aoe=off"),
        "{l}"
    );
    let l = fails(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--lun",
        "ram:1M,aoe=1.1",
        "--lun",
        "ram:1M,aoe=1.1",
        "--aoe",
        &link,
    ]);
    assert!(l.contains("both at e1.1"), "{l}");
    let l = fails(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--lun",
        "ram:1M",
        "--aoe",
        "unix:/x.sock",
    ]);
    assert!(l.contains("peer=PATH"), "{l}");
    let l = fails(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--lun",
        "ram:1M,aoe=1.255",
    ]);
    assert!(l.contains("SHELF.SLOT"), "{l}");
    let l = fails(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--lun",
        "ram:1M",
        "--aoe",
        "nosuchif0",
    ]);
    assert!(l.contains("nosuchif0") && l.contains("ip link"), "{l}");
    let l = fails(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--lun",
        "ram:1M",
        "--aoe",
        &link,
        "--aoe",
        &format!("unix:{}/t2.sock,peer={}/c2.sock", d.display(), d.display()),
    ]);
    assert!(l.contains("give one --aoe link"), "{l}");
    // Without CAP_NET_RAW: one line naming the capability and how to
    // grant it.
    let o = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-net_raw",
            env!("CARGO_BIN_EXE_ethersan"),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--lun",
            "ram:1M",
            "--aoe",
            "lo",
        ])
        .output()
        .expect("setpriv (util-linux)");
    let l = error_line(&o, "serve --aoe lo as nobody");
    assert!(
        l.contains("needs CAP_NET_RAW") && l.contains("AmbientCapabilities=CAP_NET_RAW"),
        "{l}"
    );
}

/// The AF_PACKET path, on a real (virtual) Ethernet link between two
/// namespaces: discovery, sectors per frame from the MTU (2 at 1500, 17 at
/// 9000, jumbo frames), 1 MiB written and read back.
async fn over_veth(tag: &str, mtu: usize, per_frame: u8) {
    let dir = tempfile::tempdir().unwrap();
    let veth = netns::Veth::new(tag, mtu);
    let img = dir.path().join("disk.img");
    let args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--target",
        IQN,
        "--lun",
        &format!("{}:16M", path_str(&img)),
        "--aoe",
        &veth.ifname[0],
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _server = veth.serve(&args);
    let wire = Wire::packet(veth.client_link(ethersan_link::ETHERTYPE_AOE));
    let found = wire.discover().await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].max_sectors, per_frame, "{found:?}");
    let data = pattern(1 << 20, 77);
    ok_all(
        wire.run(&found[0], writes(64, &data, usize::from(per_frame)))
            .await,
    );
    let back = ok_all(wire.run(&found[0], reads(64, 2048, per_frame)).await);
    assert!(back == data, "read-back over veth differs");
    drop(wire);
    // ethersan's own AoE client against ethersan's AoE target: a file
    // there and back with --verify, from the client's namespace.
    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    std::fs::write(&src, pattern(3 << 20, 78)).unwrap();
    let url = format!("aoe://{}/0.0", veth.ifname[1]);
    let in_client = |args: &[&str]| veth.in_client(args, Duration::from_secs(60));
    let o = in_client(&["cp", "--verify", &path_str(&src), &url]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = in_client(&["cp", &url, &path_str(&back), "--length", "3M"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        std::fs::read(&back).unwrap() == pattern(3 << 20, 78),
        "cp over AoE differs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_veth_pair_at_mtu_1500() {
    over_veth("a", 1500, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_veth_pair_with_jumbo_frames() {
    over_veth("b", 9000, 17).await;
}
