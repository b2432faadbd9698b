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
    std::thread::sleep(Duration::from_millis(200));
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
