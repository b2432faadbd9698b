//! The server's log: for people by default (names and hex, not Rust debug
//! output), one JSON object per line with `--log-format json`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

#[test]
fn human_log_lines_show_names_and_hex() {
    let mut s = Server::start(&["ram:1M"]);
    ok(&ethersan(&["ls", &s.url(0)]));
    s.stop();
    let log = s.log.lock().unwrap().clone();
    let started = log
        .iter()
        .find(|l| l.contains("session started"))
        .unwrap_or_else(|| panic!("no session line: {log:?}"));
    assert!(started.contains(&format!("target={IQN}")), "{started}");
    assert!(started.contains("isid=0x"), "{started}");
    for l in &log {
        assert!(
            !l.contains("Some(") && !l.contains("[128,"),
            "Rust debug output in the log: {l}"
        );
    }
}

#[test]
fn json_logs_are_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args([
            "serve",
            "--log-format",
            "json",
            "--listen",
            "127.0.0.1:0",
            "--target",
            IQN,
            "--lun",
            "ram:1M",
        ])
        .current_dir(dir.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let portal = loop {
        let l = lines.next().expect("a listening event").unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        seen.push(l.clone());
        if v["message"] == "listening" {
            break v["portal"].as_str().expect("portal field").to_string();
        }
    };
    ok(&ethersan(&["ls", &format!("iscsi://{portal}/{IQN}/0")]));
    // SAFETY: kill with a pid we spawned; no memory involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    seen.extend(lines.map_while(Result::ok));
    assert!(child.wait().unwrap().success());
    for l in &seen {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(
            !l.contains("\"None\"") && !l.contains("Some("),
            "Rust debug output in the log: {l}"
        );
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{l}");
        assert!(l.matches("\"target\":").count() <= 1, "a key twice: {l}");
    }
    let started = seen
        .iter()
        .find(|l| l.contains("\"session started\""))
        .unwrap_or_else(|| panic!("no session event: {seen:?}"));
    let v: serde_json::Value = serde_json::from_str(started).unwrap();
    assert_eq!(v["target"], IQN, "{started}");
}

const CLIENT: &str = "iqn.2026-11.org.ethersan:client";
const CLOSED: &str = "iqn.2026-11.org.ethersan:closed";

/// `ethersan ARGS` without CHAP credentials from the environment.
fn client(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(args)
        .env_remove("ETHERSAN_CHAP")
        .output()
        .unwrap()
}

/// Every line the server logged: stopped, its log read to the end.
fn log_of(s: &mut Server) -> Vec<String> {
    s.stop().expect("the server stops on SIGTERM");
    s.log.lock().unwrap().clone()
}

/// Issue 26 item 8: every refused login is one line naming target,
/// initiator, peer and reason; a flood of one reason from one peer is
/// limited by count and says so, not silently.
#[test]
fn login_refusals_name_target_initiator_peer_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("refusals.toml");
    std::fs::write(
        &cfg,
        format!(
            "portals = [\"127.0.0.1:0\"]\n\
             [[target]]\nname = \"{IQN}\"\nlun = [\"ram:1M\"]\n\
             [target.chap]\nuser = \"alice\"\nsecret = \"alice-secret-12\"\n\
             [[target]]\nname = \"{CLOSED}\"\nlun = [\"ram:1M\"]\nallow = [\"10.0.0.0/8\"]\n"
        ),
    )
    .unwrap();
    let mut s = Server::start_args(&["serve".into(), "--config".into(), cfg.display().to_string()]);
    let url = |t: &str| format!("iscsi://{}/{t}/0", s.addr);
    for args in [
        vec!["inquiry".to_string(), url(IQN)],
        vec![
            "inquiry".into(),
            "--chap".into(),
            "mallory:alice-secret-12".into(),
            url(IQN),
        ],
        vec![
            "inquiry".into(),
            "--chap".into(),
            "alice:not-her-secret".into(),
            url(IQN),
        ],
        vec!["inquiry".into(), url(CLOSED)],
    ] {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        assert!(!client(&a).status.success(), "{a:?} logged in");
    }
    let unknown = "iqn.2026-11.org.ethersan:nothing";
    for _ in 0..8 {
        assert!(!client(&["inquiry", &url(unknown)]).status.success());
    }
    let log = log_of(&mut s);
    let refused: Vec<&String> = log.iter().filter(|l| l.contains("login refused")).collect();
    for (target, reason) in [
        (IQN, "CHAP required but not offered"),
        (IQN, "unknown CHAP user"),
        (IQN, "wrong CHAP response"),
        (CLOSED, "not allowed by the target's access rules"),
        (unknown, "unknown target"),
    ] {
        let line = refused
            .iter()
            .find(|l| l.contains(&format!("login refused: {reason}")))
            .unwrap_or_else(|| panic!("no line for {reason}: {log:#?}"));
        for want in [
            format!("target={target}"),
            format!("initiator={CLIENT}"),
            "peer=127.0.0.1".to_string(),
        ] {
            assert!(line.contains(&want), "{want} missing: {line}");
        }
        assert!(
            !line.contains("alice-secret") && !line.contains("not-her-secret"),
            "{line}"
        );
    }
    // Five lines for the eight refusals of one reason from one peer; the
    // last says that the next ones are counted.
    let unknown_lines: Vec<&&String> = refused
        .iter()
        .filter(|l| l.contains("login refused: unknown target"))
        .collect();
    assert_eq!(unknown_lines.len(), 5, "{unknown_lines:#?}");
    assert!(
        unknown_lines[4].contains("counted, not logged"),
        "{}",
        unknown_lines[4]
    );
    for l in &log {
        assert!(!l.contains("Some("), "Rust debug output in the log: {l}");
    }
}

/// Issue 26 item 8: administrative changes are logged with what changed
/// and through which interface (the API socket, SIGHUP); a session's end
/// names initiator, target, reason and duration.
#[test]
fn changes_are_logged_with_the_interface_and_sessions_end_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ethersan.toml");
    let sock = dir.path().join("api.sock");
    let disk = dir.path().join("disk.img");
    let base = format!(
        "portals = [\"127.0.0.1:0\"]\n[options]\ndata_dir = {:?}\n[[target]]\nname = \"{IQN}\"\nlun = [\"{}:4M\"]\n",
        dir.path().display().to_string(),
        disk.display()
    );
    std::fs::write(&cfg, &base).unwrap();
    let mut s = Server::start_args(&[
        "serve".into(),
        "--config".into(),
        cfg.display().to_string(),
        "--api-socket".into(),
        sock.display().to_string(),
    ]);
    ok(&client(&["inquiry", &s.url(0)]));
    let ctl = |args: &[&str]| {
        let mut all = vec!["ctl", "--socket", sock.to_str().unwrap()];
        all.extend_from_slice(args);
        ok(&client(&all));
    };
    ctl(&["lun", "add", IQN, "ram:1M"]);
    ctl(&["lun", "resize", IQN, "0", "8M"]);
    ctl(&["acl", "add", IQN, "10.0.0.0/8"]);
    std::fs::write(&cfg, format!("{base}allow = [\"{CLIENT}\"]\n")).unwrap();
    common::must_run(
        "kill",
        &["-HUP", &s.child.id().to_string()],
        Duration::from_secs(5),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !s.log.lock().unwrap().iter().any(|l| l.contains("SIGHUP")) {
        assert!(std::time::Instant::now() < deadline, "no reload line");
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = log_of(&mut s);
    let line = |what: &str| {
        log.iter()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no line with {what:?}: {log:#?}"))
    };
    let added = line(&format!("configuration changed: target {IQN}: added LUN 1"));
    assert!(added.contains("via=socket"), "{added}");
    let resized = line("LUN 0 resized to 8388608 bytes");
    assert!(resized.contains("via=socket"), "{resized}");
    let acl = line("access rules changed: added 10.0.0.0/8");
    assert!(
        acl.contains("via=socket") && acl.contains("now only any initiator from 10.0.0.0/8"),
        "{acl}"
    );
    let hup = line(&format!(
        "access rules changed: added {CLIENT}; removed 10.0.0.0/8"
    ));
    assert!(hup.contains("via=SIGHUP"), "{hup}");
    let ended = line("session ended");
    for want in [
        format!("initiator={CLIENT}"),
        format!("target={IQN}"),
        "reason=".into(),
        "duration=".into(),
    ] {
        assert!(ended.contains(&want), "{want} missing: {ended}");
    }
    for l in &log {
        assert!(
            !l.contains("Some(") && !l.contains("None"),
            "Rust debug output in the log: {l}"
        );
    }
}
