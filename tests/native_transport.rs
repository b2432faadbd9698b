//! ethersan's native transport end to end: `ethersan serve --udp/--eth
//! --group` and the client's udp:// and eth:// URLs. Group discovery
//! (members only, nothing on the wire for others), every security level
//! and a LUN refusing a channel below its level, SCSI commands and task
//! management through the initiator library, a lossy relay, a target
//! killed mid-write, and raw Ethernet between two network namespaces at
//! MTU 1500 and 9000.

mod common;

use std::net::UdpSocket;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const GROUP: &str = "lab";
const SECRET: &str = "correct horse battery staple";

/// `ethersan serve` on loopback with the native transport on UDP `port`.
fn serve_udp(dir: &Path, port: u16, luns: &[String]) -> Server {
    serve_udp_with(dir, port, luns, &[])
}

/// [`serve_udp`] with more `serve` arguments.
fn serve_udp_with(dir: &Path, port: u16, luns: &[String], extra: &[&str]) -> Server {
    Server::start_udp(dir, port, (GROUP, SECRET), luns, extra)
}

/// The client with the group's options.
fn client(dir: &Path, secret: &str, args: &[&str]) -> std::process::Output {
    let f = secret_file(dir, secret);
    let mut all: Vec<&str> = args.to_vec();
    let f = path_str(&f);
    all.extend_from_slice(&["--group", GROUP, "--group-secret-file", &f]);
    run(
        env!("CARGO_BIN_EXE_ethersan"),
        &all,
        Duration::from_secs(120),
    )
}

/// Every level over UDP on loopback: cp --verify through a channel of each
/// level to the LUN that needs it; a channel above a LUN's level reaches
/// it; one below does not, and says so: `ls` lists the LUN with the level
/// it needs and fails naming both levels, a command to it fails the same
/// way (never "no LUN" or an empty list).
#[test]
fn every_security_level_and_a_lun_refusing_a_weaker_channel() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_udp_port();
    let luns: Vec<String> = ["none", "integrity", "encrypt"]
        .iter()
        .map(|l| format!("ram:8M,security={l}"))
        .collect();
    let server = serve_udp(dir.path(), port, &luns);
    let src = dir.path().join("src.img");
    std::fs::write(&src, pattern(3 << 20, 5)).unwrap();
    for (lun, level) in ["none", "integrity", "encrypt"].iter().enumerate() {
        let url = format!("udp://127.0.0.1:{port}/{IQN}/{lun}?security={level}");
        ok_out(
            &client(
                dir.path(),
                SECRET,
                &["cp", "--verify", &path_str(&src), &url],
            ),
            &format!("cp to LUN {lun} over a {level} channel"),
        );
        let back = dir.path().join(format!("back{lun}.img"));
        ok_out(
            &client(
                dir.path(),
                SECRET,
                &["cp", &url, &path_str(&back), "--length", "3M"],
            ),
            "cp back",
        );
        assert!(
            std::fs::read(&back).unwrap() == pattern(3 << 20, 5),
            "LUN {lun} read back differs"
        );
    }
    // No mtu= anywhere: both ends take loopback's MTU (65,535 less the IP
    // and UDP headers), as TCP would, not the 1500 of an Ethernet NIC.
    let frames: Vec<u64> = server
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("channel opened"))
        .filter_map(|l| field(l, "max_frame"))
        .collect();
    assert!(
        !frames.is_empty() && frames.iter().all(|f| *f == 65_535 - 28),
        "channels' largest frames on loopback: {frames:?}"
    );
    // An encrypted channel reaches the LUN that needs only integrity.
    let url = format!("udp://127.0.0.1:{port}/{IQN}/1");
    ok_out(&client(dir.path(), SECRET, &["inquiry", &url]), "inquiry");
    // A channel without protection lists every LUN: LUN 0 in full, LUNs 1
    // and 2 with the level they need; ls fails naming the levels.
    let weak = format!("udp://127.0.0.1:{port}/{IQN}?security=none");
    let o = client(dir.path(), SECRET, &["ls", "--json", &weak]);
    let l = error_line(&o, "ls over a channel below two LUNs' level");
    assert!(
        l.contains("LUN 1 security=integrity")
            && l.contains("LUN 2 security=encrypt")
            && l.contains("(none)")
            && l.contains("?security=encrypt"),
        "{l}"
    );
    let ls = String::from_utf8_lossy(&o.stdout);
    let v: serde_json::Value = serde_json::from_str(&ls).unwrap();
    let listed: Vec<(u64, Option<&str>)> = v
        .as_array()
        .expect("a list of LUNs")
        .iter()
        .map(|l| (l["lun"].as_u64().unwrap(), l["needs_security"].as_str()))
        .collect();
    assert_eq!(
        listed,
        vec![(0, None), (1, Some("integrity")), (2, Some("encrypt"))],
        "{ls}"
    );
    assert_eq!(v[0]["capacity_bytes"], 8 << 20, "{ls}");
    // The table says it too.
    let o = client(dir.path(), SECRET, &["ls", &weak]);
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("2     (needs a channel at security=encrypt)"),
        "{table}"
    );
    // One LUN above the channel's level: ls, inquiry and cp each fail
    // with both levels and what to do.
    let url = format!("udp://127.0.0.1:{port}/{IQN}/2?security=integrity");
    let want = "LUN 2 needs a channel at security=encrypt and this one is at security=integrity: connect with ?security=encrypt in the URL";
    for args in [
        vec!["cp", &url, "/dev/null", "--length", "4K"],
        vec!["ls", &url],
        vec!["inquiry", &url],
        vec!["bench", &url, "--time", "1s"],
    ] {
        let o = client(dir.path(), SECRET, &args);
        let l = error_line(
            &o,
            &format!("{} from a LUN above the channel's level", args[0]),
        );
        assert!(l.contains(want), "{}: {l}", args[0]);
    }
}

/// Discovery over UDP answers members only; others get nothing on the
/// wire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_discovery_answers_only_the_group() {
    use ethersan_channel::discovery::{open_reply, query};
    use ethersan_channel::group::GroupKeys;
    let dir = tempfile::tempdir().unwrap();
    let port = free_udp_port();
    let _server = serve_udp(dir.path(), port, &["ram:4M".to_string()]);
    let o = client(
        dir.path(),
        SECRET,
        &["discover", "--udp", &format!("127.0.0.1:{port}"), "--json"],
    );
    let out = ok_out(&o, "discover");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["targets"][0]["name"], IQN, "{out}");
    assert_eq!(
        v[0]["targets"][0]["luns"][0]["security"], "encrypt",
        "{out}"
    );
    assert_eq!(v[0]["targets"][0]["luns"][0]["bytes"], 4 << 20, "{out}");
    // A wrong secret finds nothing: an empty list and exit status 1.
    let o = client(
        dir.path(),
        "not the secret",
        &["discover", "--udp", &format!("127.0.0.1:{port}"), "--json"],
    );
    let l = error_line(&o, "discover with a wrong secret");
    assert!(l.contains("no member of group \"lab\" answered"), "{l}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");
    let o = client(
        dir.path(),
        "not the secret",
        &["discover", "--udp", &format!("127.0.0.1:{port}")],
    );
    let l = error_line(&o, "discover with a wrong secret, text");
    assert!(l.contains("check the group name and secret"), "{l}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "");
    // On the wire: a query of another group or secret gets no datagram
    // back; the member's query gets an answer only a member can open.
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let server = format!("127.0.0.1:{port}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut buf = vec![0u8; 65536];
    for (group, secret) in [("lab", "not the secret"), ("other", SECRET)] {
        let keys = GroupKeys::derive(group, secret.as_bytes()).unwrap();
        let q = query(&keys, now, [7; 16]);
        sock.send_to(&q, &server).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(1), sock.recv_from(&mut buf)).await;
        assert!(
            got.is_err(),
            "{group}/{secret}: the target answered a non-member"
        );
    }
    let member = GroupKeys::derive(GROUP, SECRET.as_bytes()).unwrap();
    let q = query(&member, now, [9; 16]);
    sock.send_to(&q, &server).await.unwrap();
    let (n, _) = tokio::time::timeout(Duration::from_secs(2), sock.recv_from(&mut buf))
        .await
        .expect("a member's query is answered")
        .unwrap();
    let part = open_reply(&member, &[9; 16], &buf[..n]).expect("the reply opens");
    assert_eq!(part.catalog.targets[0].name, IQN);
    let outsider = GroupKeys::derive(GROUP, b"not the secret").unwrap();
    assert!(open_reply(&outsider, &[9; 16], &buf[..n]).is_err());
    // The same query again (a replay) gets no answer.
    sock.send_to(&q, &server).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(1), sock.recv_from(&mut buf)).await;
    assert!(got.is_err(), "a replayed query was answered");
}

/// SCSI through the initiator library over the native transport: READ,
/// WRITE, COMPARE AND WRITE (match and miscompare), UNMAP, and task
/// management, on an encrypted channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scsi_commands_and_task_management_over_the_native_transport() {
    use bytes::Bytes;
    use ethersan_channel::group::GroupKeys;
    use ethersan_client::url::IscsiUrl;
    use ethersan_initiator::LoginOptions;
    use ethersan_proto::pdu::TmfFunction;
    let dir = tempfile::tempdir().unwrap();
    let port = free_udp_port();
    // A file LUN: thin, so UNMAP is supported.
    let img = dir.path().join("scsi.img");
    let _server = serve_udp(dir.path(), port, &[format!("{}:8M", path_str(&img))]);
    let url = IscsiUrl::parse(&format!("udp://127.0.0.1:{port}/{IQN}/0")).unwrap();
    let keys = GroupKeys::derive(GROUP, SECRET.as_bytes()).unwrap();
    let opts = LoginOptions {
        initiator_name: "iqn.2026-11.org.ethersan:native-test".into(),
        target_name: Some(IQN.into()),
        timeout: Some(Duration::from_secs(20)),
        ..Default::default()
    };
    let (s, _level) = ethersan_client::native::connect(&url, &keys, &opts)
        .await
        .expect("login over the native transport");
    let _ = s.clear_unit_attention(0).await;
    let (blocks, bs) = s.read_capacity(0).await.unwrap();
    assert_eq!((blocks, bs), (16384, 512));
    // WRITE then READ, 1 MiB (many frames per PDU).
    let data = pattern(1 << 20, 11);
    let r = s
        .write16(0, 100, Bytes::from(data.clone()), 512, false)
        .await
        .unwrap();
    assert_eq!(r.status, 0);
    // All but the unsolicited first burst went placed, into the buffer
    // the target registered before its R2Ts (the read below checks it
    // landed).
    let placed = s.placed_write_bytes();
    let unsolicited = (1u64 << 20) - placed;
    assert!(
        placed > 0 && unsolicited <= u64::from(s.params().first_burst_length),
        "{placed} bytes placed, first burst {}",
        s.params().first_burst_length
    );
    let placed_before = s.placed_bytes();
    let r = s.read16(0, 100, 2048, 512).await.unwrap();
    assert_eq!(r.status, 0);
    assert!(r.data == data, "read back differs");
    // The read's data came placed, straight into its buffer.
    assert_eq!(s.placed_bytes() - placed_before, 1 << 20, "Data-In placed");
    // A read of at most 8 KiB comes inline with its one Data-In; one of
    // 8 KiB + 512 is placed whole (its second Data-In too, however short).
    let r = s.read16(0, 100, 16, 512).await.unwrap();
    assert!(r.data == data[..8192], "8 KiB read back differs");
    assert_eq!(s.placed_bytes() - placed_before, 1 << 20, "8 KiB inline");
    let r = s.read16(0, 100, 17, 512).await.unwrap();
    assert!(r.data == data[..8704], "8.5 KiB read back differs");
    assert_eq!(
        s.placed_bytes() - placed_before,
        (1 << 20) + 8704,
        "8.5 KiB placed"
    );
    // COMPARE AND WRITE: block 100 holds data[..512].
    let mut caw = data[..512].to_vec();
    caw.extend_from_slice(&[0x5a; 512]);
    let cdb = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 100, 0, 0, 0, 1, 0, 0];
    let r = s.command(0, &cdb, Bytes::from(caw), 0).await.unwrap();
    assert_eq!(r.status, 0, "COMPARE AND WRITE that matches");
    let mut wrong = vec![0u8; 512];
    wrong.extend_from_slice(&[0x11; 512]);
    let r = s.command(0, &cdb, Bytes::from(wrong), 0).await.unwrap();
    assert_eq!(r.status, 2, "a miscompare is CHECK CONDITION");
    assert_eq!(r.sense_key().map(|k| k.0), Some(0xe), "MISCOMPARE");
    let r = s.read16(0, 100, 1, 512).await.unwrap();
    assert_eq!(r.data, vec![0x5a; 512]);
    // UNMAP blocks 100..108: they read back as zeros.
    let mut param = vec![0u8; 24];
    param[1] = 22;
    param[3] = 16;
    param[8..16].copy_from_slice(&100u64.to_be_bytes());
    param[16..20].copy_from_slice(&8u32.to_be_bytes());
    let cdb = [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    let r = s.command(0, &cdb, Bytes::from(param), 0).await.unwrap();
    assert_eq!(r.status, 0, "UNMAP: {:?}", r.sense_key());
    let r = s.read16(0, 100, 8, 512).await.unwrap();
    assert!(r.data.iter().all(|b| *b == 0), "unmapped blocks read zero");
    // Task management: ABORT TASK SET and LOGICAL UNIT RESET complete, a
    // reset raises a unit attention, commands go on.
    assert_eq!(
        s.task_management(TmfFunction::AbortTaskSet, 0)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        s.task_management(TmfFunction::LogicalUnitReset, 0)
            .await
            .unwrap(),
        0
    );
    let r = s.read16(0, 0, 1, 512).await.unwrap();
    assert_eq!(
        r.sense_key().map(|k| k.0),
        Some(0x6),
        "UNIT ATTENTION after reset"
    );
    let r = s.read16(0, 108, 8, 512).await.unwrap();
    assert_eq!(r.status, 0);
    assert!(r.data == data[8 * 512..16 * 512], "data after the reset");
    s.logout().await.unwrap();
}

/// A UDP relay between client and target that drops 1%, reorders 1%,
/// duplicates 0.1% and corrupts 0.1% of datagrams each way: cp --verify
/// still moves every byte, and the client's counters show retransmissions
/// and rejected (corrupt) frames.
#[test]
fn a_lossy_relay_loses_and_corrupts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_udp_port();
    let server = serve_udp(
        dir.path(),
        port,
        &["ram:32M,security=integrity".to_string()],
    );
    let relay = Relay::start(format!("127.0.0.1:{port}").parse().unwrap(), 1);
    let src = dir.path().join("src.img");
    std::fs::write(&src, pattern(12 << 20, 21)).unwrap();
    // Ethernet-sized frames (not loopback's 64 KiB): hundreds of
    // datagrams per MiB, so the relay's 0.1% corruption hits some.
    let url = format!(
        "udp://127.0.0.1:{}/{IQN}/0?security=integrity&mtu=1500",
        relay.port
    );
    let f = secret_file(dir.path(), SECRET);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(["cp", "--verify", &path_str(&src), &url])
        .args(["--group", GROUP, "--group-secret-file", &path_str(&f)])
        .env("ETHERSAN_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cp through the lossy relay: {stderr}");
    let (dropped, reordered, duplicated, corrupted) = relay.counts();
    assert!(
        dropped > 0 && reordered > 0 && corrupted > 0,
        "the relay did its work: {dropped} {reordered} {duplicated} {corrupted}"
    );
    // The target logs each channel's counters when it ends: at the
    // client's CLOSE, or, when the relay lost that frame, when dead-peer
    // detection (15 s without a frame) ends it; wait past that.
    let deadline = Instant::now() + Duration::from_secs(25);
    let (retransmits, rejected, opened, ended) = loop {
        let log = server.log.lock().unwrap().clone();
        // Every channel the copy opened (cp --verify may use more than
        // one session) must have ended before its counters are summed.
        let opened = log.iter().filter(|l| l.contains("channel opened")).count();
        let ended: Vec<&String> = log.iter().filter(|l| l.contains("channel ended")).collect();
        let sum = |k: &str| ended.iter().filter_map(|l| field(l, k)).sum::<u64>();
        if (opened > 0 && ended.len() >= opened) || Instant::now() > deadline {
            break (sum("retransmits"), sum("rejected"), opened, ended.len());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(opened, ended, "channels opened and ended by the copy");
    assert!(retransmits > 0, "the target counted no retransmission");
    assert!(rejected > 0, "the target rejected no corrupt frame");
}

/// `key=value` from a log line.
fn field(line: &str, key: &str) -> Option<u64> {
    let i = line.find(&format!("{key}="))?;
    line[i + key.len() + 1..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The target killed with SIGKILL in the middle of a copy and started
/// again: the client logs in again and finishes, and the file holds every
/// byte (cp --verify reads it all back).
#[test]
fn a_target_killed_mid_write_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_udp_port();
    let img = dir.path().join("disk.img");
    let luns = vec![format!("{}:128M", path_str(&img))];
    let sock = dir.path().join("api.sock");
    let server = serve_udp_with(dir.path(), port, &luns, &["--api-socket", &path_str(&sock)]);
    let src = dir.path().join("src.img");
    std::fs::write(&src, pattern(96 << 20, 31)).unwrap();
    let url = format!("udp://127.0.0.1:{port}/{IQN}/0");
    let f = secret_file(dir.path(), SECRET);
    let mut cp = std::process::Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(["cp", "--verify", "--timeout", "5s", &path_str(&src), &url])
        .args(["--group", GROUP, "--group-secret-file", &path_str(&f)])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Kill the target once the copy is under way: once the target has
    // acknowledged its first writes (the copy takes a second or more).
    wait_sessions(
        &sock,
        "the copy's first writes",
        Duration::from_secs(20),
        |s| counter(s, "writes") > 0,
    );
    let mut server = server;
    server.child.kill().unwrap();
    let _ = server.child.wait();
    std::thread::sleep(Duration::from_millis(500));
    let _again = serve_udp(dir.path(), port, &luns);
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(st) = cp.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "cp did not finish");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    use std::io::Read;
    cp.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "cp after a target kill: {err}");
    assert!(
        err.contains("logging in again"),
        "the copy never lost its session: {err}"
    );
    let disk = std::fs::read(&img).unwrap();
    assert!(
        disk[..96 << 20] == pattern(96 << 20, 31),
        "the disk differs"
    );
}

/// A UDP relay with seeded impairments, in a thread.
struct Relay {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    counts: std::sync::Arc<std::sync::Mutex<(u64, u64, u64, u64)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    fn start(target: std::net::SocketAddr, seed: u64) -> Relay {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(5)))
            .unwrap();
        let port = sock.local_addr().unwrap().port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let counts = std::sync::Arc::new(std::sync::Mutex::new((0, 0, 0, 0)));
        let (stop2, counts2) = (stop.clone(), counts.clone());
        let thread = std::thread::spawn(move || {
            let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % 10_000
            };
            let mut client: Option<std::net::SocketAddr> = None;
            let mut held: Option<(Vec<u8>, std::net::SocketAddr)> = None;
            let mut buf = vec![0u8; 65536];
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                let (n, from) = match sock.recv_from(&mut buf) {
                    Ok(x) => x,
                    Err(_) => {
                        // Idle: let a held datagram go.
                        if let Some((d, to)) = held.take() {
                            let _ = sock.send_to(&d, to);
                        }
                        continue;
                    }
                };
                let to = if from == target {
                    match client {
                        Some(c) => c,
                        None => continue,
                    }
                } else {
                    client = Some(from);
                    target
                };
                let mut d = buf[..n].to_vec();
                let mut c = counts2.lock().unwrap();
                let r = next();
                if r < 100 {
                    c.0 += 1;
                    continue;
                }
                if r < 110 && n > 20 {
                    c.3 += 1;
                    let i = 8 + (next() as usize % (n - 8));
                    d[i] ^= 0x40;
                }
                if (200..300).contains(&r) && held.is_none() {
                    c.1 += 1;
                    held = Some((d, to));
                    continue;
                }
                let _ = sock.send_to(&d, to);
                if (300..310).contains(&r) {
                    c.2 += 1;
                    let _ = sock.send_to(&d, to);
                }
                if let Some((h, hto)) = held.take() {
                    let _ = sock.send_to(&h, hto);
                }
            }
        });
        Relay {
            port,
            stop,
            counts,
            thread: Some(thread),
        }
    }

    fn counts(&self) -> (u64, u64, u64, u64) {
        *self.counts.lock().unwrap()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Mistakes in the native transport's configuration: one error line
/// each, saying what to do.
#[test]
fn native_transport_mistakes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = path_str(dir.path());
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--data-dir", &d];
        args.extend_from_slice(extra);
        run(
            env!("CARGO_BIN_EXE_ethersan"),
            &args,
            Duration::from_secs(30),
        )
    };
    let o = serve(&["--udp", "127.0.0.1:0"]);
    let l = error_line(&o, "--udp without --group");
    assert!(l.contains("need --group NAME"), "{l}");
    said_once(&l);
    let short = secret_file(dir.path(), "short");
    let o = serve(&[
        "--udp",
        "127.0.0.1:0",
        "--group",
        GROUP,
        "--group-secret-file",
        &path_str(&short),
    ]);
    let l = error_line(&o, "a short secret");
    assert!(l.contains("secret"), "{l}");
    said_once(&l);
    let good = secret_file(dir.path(), SECRET);
    let o = serve(&[
        "--eth",
        "nosuchif0",
        "--group",
        GROUP,
        "--group-secret-file",
        &path_str(&good),
    ]);
    let l = error_line(&o, "--eth on a missing interface");
    assert!(
        l.contains("native transport link nosuchif0") && l.contains("ip link"),
        "{l}"
    );
    said_once(&l);
    let o = serve(&["--udp", "nonsense", "--group", GROUP]);
    let l = error_line(&o, "a bad --udp");
    assert!(l.contains("ADDR:PORT"), "{l}");
    // A client URL without the group says how to give it.
    let o = run(
        env!("CARGO_BIN_EXE_ethersan"),
        &["ls", "udp://127.0.0.1:9/iqn.2026-11.org.ethersan:x"],
        Duration::from_secs(30),
    );
    let l = error_line(&o, "a udp:// URL without --group");
    assert!(l.contains("--group NAME"), "{l}");
    said_once(&l);
}

/// The sum of `ethersan_native_channels` over the levels, from the
/// server's /metrics at `addr`.
fn open_channels(addr: &str) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.lines()
        .filter(|l| l.starts_with("ethersan_native_channels{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// A client closes its channel when it is done: once `ls`, `inquiry`,
/// `cp` or `bench` over udp:// has exited, the target holds no channel
/// within a second (it held them for the 15 s channel timeout when the
/// process exited before its CLOSE went out).
#[test]
fn clients_close_their_channel_on_exit() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_udp_port();
    let metrics = format!("127.0.0.1:{}", free_port());
    let data_dir = path_str(dir.path());
    let _server = Server::start_udp(
        dir.path(),
        port,
        (GROUP, SECRET),
        &["ram:8M".to_string(), "ram:4M".to_string()],
        &["--metrics", &metrics, "--data-dir", &data_dir],
    );
    let url = format!("udp://127.0.0.1:{port}/{IQN}");
    let lun0 = format!("{url}/0");
    let missing = format!("{url}/7");
    let runs: Vec<Vec<&str>> = vec![
        vec!["ls", &url],
        vec!["ls", "--json", &lun0],
        vec!["inquiry", &lun0],
        vec!["cp", &lun0, "/dev/null", "--length", "1M"],
        vec!["bench", &lun0, "--time", "1s"],
        // An error after the login closes the channel too.
        vec!["ls", &missing],
    ];
    for round in 0..3 {
        for args in &runs {
            let o = client(dir.path(), SECRET, args);
            if args[1] != missing {
                ok_out(&o, args[0]);
            }
            let ended = Instant::now();
            let mut open = open_channels(&metrics);
            while open > 0 && ended.elapsed() < Duration::from_secs(1) {
                std::thread::sleep(Duration::from_millis(20));
                open = open_channels(&metrics);
            }
            assert_eq!(
                open, 0,
                "round {round}: {args:?} ended {:?} ago and the target still holds {open} channel(s)",
                ended.elapsed()
            );
        }
    }
}

/// A wrong group secret over udp:// fails as fast as over eth:// (no
/// answer to discovery within 1.5 s), not after the 30 s timeout, and
/// says what to check.
#[test]
fn a_wrong_group_secret_fails_fast_over_udp() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_udp_port();
    let _server = serve_udp(dir.path(), port, &["ram:4M".to_string()]);
    let url = format!("udp://127.0.0.1:{port}/{IQN}/0");
    for args in [
        vec!["ls", url.as_str()],
        vec!["cp", url.as_str(), "/dev/null", "--length", "4K"],
    ] {
        let mut all = args.clone();
        all.extend_from_slice(&["--timeout", "30s"]);
        let t = Instant::now();
        let o = client(dir.path(), "not the secret at all", &all);
        let took = t.elapsed();
        let l = error_line(&o, "a wrong secret");
        assert!(
            took < Duration::from_secs(5),
            "{}: failed after {took:?}: {l}",
            args[0]
        );
        assert!(
            l.contains("no member of group \"lab\" answered")
                && l.contains("check the group name and secret"),
            "{l}"
        );
    }
    // The right secret still connects.
    ok_out(&client(dir.path(), SECRET, &["ls", &url]), "ls");
}
