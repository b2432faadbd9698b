//! What a server leaves behind: a clean stop removes the control socket
//! and warns of nothing, and under systemd (stderr connected to the
//! journal, `JOURNAL_STREAM`) the log carries no timestamp of its own,
//! since the journal stamps every line.

mod common;

use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// `ethersan serve` with its data directory `dir` and stderr into the
/// file `log`, `env` set; returns once it listens (bounded).
fn serve_logging_to(dir: &std::path::Path, log: &std::path::Path, env: &[(&str, String)]) -> Child {
    let file = std::fs::File::create(log).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ethersan"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--target", IQN])
        .args(["--lun", "ram:1M", "--data-dir"])
        .arg(dir)
        .env("ETHERSAN_LOG", "info")
        .env_remove("JOURNAL_STREAM")
        .stdout(Stdio::null())
        .stderr(file);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start ethersan serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains("listening on")
    {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "ethersan serve did not start: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// SIGTERM, and wait for the exit (bounded).
fn stop(child: &mut Child) -> std::process::ExitStatus {
    // SAFETY: kill(2) with a pid we spawned and still own; no memory involved.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ethersan serve did not stop within 20 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_clean_stop_removes_the_control_socket_and_warns_of_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let sock = dir.path().join("ethersan.sock");
    // Several times: the warning at shutdown came from a race.
    for round in 0..3 {
        let mut child = serve_logging_to(dir.path(), &log, &[]);
        assert!(sock.exists(), "no control socket while serving");
        let st = stop(&mut child);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(st.success(), "exit {st:?}: {text}");
        assert!(
            !sock.exists(),
            "round {round}: {} is left after a clean stop",
            sock.display()
        );
        for l in text.lines() {
            assert!(
                !l.contains("WARN") && !l.contains("accept failed"),
                "round {round}: a clean stop warns: {l}\n{text}"
            );
        }
    }
}

/// Whether a log line starts with a timestamp (`2026-11-27T22:16:58…`).
fn stamped(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 11 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[10] == b'T'
}

#[test]
fn under_journald_the_log_has_no_timestamps_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    // JOURNAL_STREAM names stderr (its device and inode): journald.
    std::fs::File::create(&log).unwrap();
    let m = std::fs::metadata(&log).unwrap();
    let journal = format!("{}:{}", m.dev(), m.ino());
    let mut child = serve_logging_to(dir.path(), &log, &[("JOURNAL_STREAM", journal)]);
    stop(&mut child);
    let text = std::fs::read_to_string(&log).unwrap();
    let events: Vec<&str> = text.lines().filter(|l| l.contains("INFO")).collect();
    assert!(!events.is_empty(), "no log events: {text}");
    for l in &events {
        assert!(!stamped(l), "a timestamp under journald: {l}");
        assert!(l.trim_start().starts_with("INFO"), "{l}");
    }

    // Not the journal (another file's identity, or none): timestamps.
    for other in [Some("1:2".to_string()), None] {
        let env: Vec<(&str, String)> = other.map(|o| ("JOURNAL_STREAM", o)).into_iter().collect();
        let mut child = serve_logging_to(dir.path(), &log, &env);
        stop(&mut child);
        let text = std::fs::read_to_string(&log).unwrap();
        let events: Vec<&str> = text.lines().filter(|l| l.contains("INFO")).collect();
        assert!(
            !events.is_empty() && events.iter().all(|l| stamped(l)),
            "without journald every event has its timestamp: {text}"
        );
    }
}
