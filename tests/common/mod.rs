//! Shared helpers for the interop tests: start `ethersan serve` on a free
//! loopback port, run external tools with time limits, parse libiscsi's
//! CUnit output.
#![allow(dead_code)]

pub mod aoe;
pub mod ceph;
pub mod netns;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A group secret file under `dir` holding `secret` (one per length, so
/// that a test can write a right and a wrong one side by side).
pub fn secret_file(dir: &Path, secret: &str) -> std::path::PathBuf {
    let p = dir.join(format!("secret-{}", secret.len()));
    std::fs::write(&p, format!("{secret}\n")).unwrap();
    p
}

/// The target name the tests export.
pub const IQN: &str = "iqn.2026-11.org.ethersan:test";

/// Run the `ethersan` binary with these arguments.
pub fn ethersan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(args)
        .output()
        .expect("run ethersan")
}

/// Its standard output, after asserting that it succeeded.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "ethersan failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// [`ok`] naming what failed.
pub fn ok_out(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run a tool within `limit` and insist that it succeeded; its stdout.
pub fn must_run(cmd: &str, args: &[&str], limit: Duration) -> String {
    let o = run(cmd, args, limit);
    assert!(
        o.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A path as a `&str` argument.
/// A free TCP port on 127.0.0.1 (bound, then released for a server).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A free UDP port on 127.0.0.1 (bound, then released for a server).
pub fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("a free UDP port")
}

/// Which of `socks` the server closed (EOF or reset) within `wait`; with
/// `enough`, stop 200 ms after that many are closed. The sockets are made
/// non-blocking.
pub fn closed_by_server(
    socks: &mut [std::net::TcpStream],
    wait: Duration,
    enough: Option<usize>,
) -> Vec<bool> {
    use std::io::Read;
    for s in socks.iter() {
        s.set_nonblocking(true).unwrap();
    }
    let mut closed = vec![false; socks.len()];
    let mut deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        for (i, s) in socks.iter_mut().enumerate() {
            if closed[i] {
                continue;
            }
            let mut b = [0u8; 64];
            match s.read(&mut b) {
                Ok(0) => closed[i] = true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => closed[i] = true,
            }
        }
        if enough.is_some_and(|n| closed.iter().filter(|c| **c).count() >= n) {
            deadline = deadline.min(Instant::now() + Duration::from_millis(200));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    closed
}

pub fn path_str(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

/// Bytes that are not all alike, so a misplaced chunk shows.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A running target — `ethersan serve`, or tgt's tgtd as a peer for
/// comparison — stopped (SIGTERM) when dropped.
pub struct Server {
    pub child: Child,
    /// LUN number of the first data LUN (tgt puts its controller at 0).
    pub lun_base: u32,
    /// The first portal.
    pub addr: String,
    /// Every portal, in `--listen` order.
    pub addrs: Vec<String>,
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Notified (with `log` held) for every line the log reader adds and
    /// when it reaches the end of the server's stderr.
    log_changed: std::sync::Arc<std::sync::Condvar>,
    /// Set (with `log` held) once the log reader has read the server's
    /// stderr to its end: every line the server wrote is in `log`.
    log_ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Server {
    /// Start with these `--lun` specs on a free port of 127.0.0.1.
    pub fn start(luns: &[&str]) -> Server {
        Server::start_portals(1, luns)
    }

    /// Start with one LUN on one loopback portal, plus more `serve`
    /// arguments (`["--chap", "u:s"]`, ...).
    pub fn start_with(lun: &str, extra: &[&str]) -> Server {
        let mut args: Vec<String> = [
            "serve",
            "--target",
            IQN,
            "--listen",
            "127.0.0.1:0",
            "--lun",
            lun,
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.extend(extra.iter().map(|a| a.to_string()));
        Server::start_args(&args)
    }

    /// Start with `portals` loopback portals (free ports) and these LUNs.
    pub fn start_portals(portals: usize, luns: &[&str]) -> Server {
        let mut args: Vec<String> = vec!["serve".into(), "--target".into(), IQN.into()];
        for _ in 0..portals {
            args.push("--listen".into());
            args.push("127.0.0.1:0".into());
        }
        for l in luns {
            args.push("--lun".into());
            args.push((*l).into());
        }
        Server::start_args(&args)
    }

    /// `ethersan serve` on loopback with the native transport on UDP
    /// `port` for `group` (its secret written under `dir`), these LUNs and
    /// more `serve` arguments.
    pub fn start_udp(
        dir: &Path,
        port: u16,
        (group, secret): (&str, &str),
        luns: &[String],
        extra: &[&str],
    ) -> Server {
        let mut args: Vec<String> = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--target",
            IQN,
            "--udp",
            &format!("127.0.0.1:{port}"),
            "--group",
            group,
            "--group-secret-file",
            &path_str(&secret_file(dir, secret)),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for l in luns {
            args.push("--lun".into());
            args.push(l.clone());
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        Server::start_args(&args)
    }

    /// Start with arbitrary `ethersan` arguments; waits for "listening on".
    pub fn start_args(args: &[String]) -> Server {
        Server::start_args_in(args, None)
    }

    /// [`start_args`](Self::start_args) in working directory `cwd`.
    pub fn start_args_in(args: &[String], cwd: Option<&Path>) -> Server {
        Server::start_args_env(args, cwd, &[])
    }

    /// [`start_args_in`](Self::start_args_in) with more environment variables.
    pub fn start_args_env(args: &[String], cwd: Option<&Path>, env: &[(&str, &str)]) -> Server {
        Server::start_command(env!("CARGO_BIN_EXE_ethersan"), args, cwd, env)
    }

    /// `program ARGS` that runs `ethersan serve` (e.g. `ip netns exec NS
    /// ethersan serve …`), once it listens.
    pub fn start_program(program: &str, args: &[String]) -> Server {
        Server::start_command(program, args, None, &[])
    }

    fn start_command(
        program: &str,
        args: &[String],
        cwd: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Server {
        let mut cmd = Command::new(program);
        cmd.envs(env.iter().copied());
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        }
        let mut child = cmd
            .args(args)
            .env("ETHERSAN_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ethersan serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log_changed = std::sync::Arc::new(std::sync::Condvar::new());
        let log_ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (log2, changed2, ended2) = (log.clone(), log_changed.clone(), log_ended.clone());
        std::thread::spawn(move || {
            let mut addrs = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    addrs.push(rest.trim().to_string());
                }
                // The connect hints follow the last portal line.
                if line.contains("connect with") {
                    let _ = tx.send(std::mem::take(&mut addrs));
                }
                log2.lock().unwrap().push(line);
                changed2.notify_all();
            }
            let _held = log2.lock().unwrap();
            ended2.store(true, std::sync::atomic::Ordering::SeqCst);
            changed2.notify_all();
        });
        let addrs: Vec<String> = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| {
                let _ = child.kill();
                panic!("ethersan serve did not start: {:?}", log.lock().unwrap());
            });
        Server {
            child,
            lun_base: 0,
            addr: addrs[0].clone(),
            addrs,
            log,
            log_changed,
            log_ended,
        }
    }

    /// iSCSI URL of a LUN.
    pub fn url(&self, lun: u32) -> String {
        self.url_via(0, lun)
    }

    /// iSCSI URL of a LUN through portal `portal`.
    pub fn url_via(&self, portal: usize, lun: u32) -> String {
        format!(
            "iscsi://{}/{}/{}",
            self.addrs[portal],
            IQN,
            lun + self.lun_base
        )
    }

    /// Start tgt (Debian's `tgtd`) on a free loopback port with one LUN
    /// backed by `file`, `ro` and `removable` as asked. Its one portal
    /// serves as both "paths".
    pub fn start_tgt(file: &Path, read_only: bool, removable: bool) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let control = (port % 10000 + 20000).to_string();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new("tgtd")
            .args(["-f", "-C", &control, "--iscsi", &format!("portal={addr}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tgtd (apt-get install tgt)");
        let adm = |args: &[&str]| {
            for _ in 0..50 {
                let ok = Command::new("tgtadm")
                    .args(["-C", &control, "--lld", "iscsi"])
                    .args(args)
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            panic!("tgtadm {args:?} failed");
        };
        adm(&["--op", "new", "--mode", "target", "--tid", "1", "-T", IQN]);
        adm(&[
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "-b",
            file.to_str().unwrap(),
        ]);
        let params = format!(
            "readonly={},removable={}",
            u8::from(read_only),
            u8::from(removable)
        );
        adm(&[
            "--op",
            "update",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "--params",
            &params,
        ]);
        adm(&[
            "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
        ]);
        Server {
            child,
            lun_base: 1,
            addr: addr.clone(),
            addrs: vec![addr.clone(), addr],
            log: Default::default(),
            log_changed: Default::default(),
            // tgtd's output is not collected: there is nothing to wait for.
            log_ended: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
        }
    }

    /// Send SIGTERM and wait (bounded) for the exit and then for the log
    /// reader to reach the end of the server's stderr, so that `log` holds
    /// every line the server wrote when this returns; the exit status.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        // SAFETY: kill(2) with a pid we spawned and still own; no memory involved.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.wait_log_end(deadline.saturating_duration_since(Instant::now()));
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        None
    }

    /// Wait (at most `limit`) until the log reader has read the server's
    /// stderr to its end; whether it has.
    pub fn wait_log_end(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut log = self.log.lock().unwrap();
        while !self.log_ended.load(std::sync::atomic::Ordering::SeqCst) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            log = self.log_changed.wait_timeout(log, left).unwrap().0;
        }
        true
    }

    /// The first log line containing `needle`, waiting (at most `limit`)
    /// for the server to write it; panics with the log when it does not.
    pub fn wait_log(&self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        let mut log = self.log.lock().unwrap();
        loop {
            if let Some(l) = log.iter().find(|l| l.contains(needle)) {
                return l.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.log_ended.load(std::sync::atomic::Ordering::SeqCst) {
                panic!("no log line with {needle:?} within {limit:?}: {:#?}", *log);
            }
            log = self.log_changed.wait_timeout(log, left).unwrap().0;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.stop();
        }
    }
}

/// The live sessions of the server whose API socket is `sock`
/// (`ethersan ctl --socket SOCK --json session ls`).
pub fn sessions(sock: &Path) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .arg("ctl")
        .arg("--socket")
        .arg(sock)
        .args(["--json", "session", "ls"])
        .output()
        .expect("run ethersan ctl session ls");
    let text = ok_out(&out, "ethersan ctl session ls");
    match serde_json::from_str(text.trim()) {
        Ok(serde_json::Value::Array(v)) => v,
        other => panic!("session ls is not a JSON list ({other:?}): {text}"),
    }
}

/// Wait (at most `limit`) until the sessions the server lists satisfy
/// `until` — a login, commands counted — asking its API socket `sock`;
/// panics naming `what` with the last list when they do not.
pub fn wait_sessions(
    sock: &Path,
    what: &str,
    limit: Duration,
    until: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + limit;
    loop {
        let s = sessions(sock);
        if until(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?}: {s:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The sum of one counter (`reads`, `writes`, `write_bytes`, ...) over
/// `sessions`.
pub fn counter(sessions: &[serde_json::Value], name: &str) -> u64 {
    sessions
        .iter()
        .map(|s| s["counters"][name].as_u64().unwrap_or(0))
        .sum()
}

/// No cause is printed twice: no part of the message between `: ` or `; `
/// separators (of a dozen characters or more) occurs in it twice, and
/// there is at most one OS error.
pub fn said_once(line: &str) {
    assert!(
        line.matches("(os error").count() <= 1,
        "an OS error is printed twice: {line}"
    );
    for part in line.split(": ").flat_map(|p| p.split("; ")) {
        let part = part.trim();
        if part.len() >= 12 {
            assert_eq!(
                line.matches(part).count(),
                1,
                "{part:?} is printed more than once: {line}"
            );
        }
    }
}

/// The error line (the last `ethersan: ` line of stdout and stderr) of a
/// run that must have failed with exit status 1, checked to say each cause
/// once.
pub fn error_line(o: &Output, what: &str) -> String {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(1), "{what} did not fail:\n{all}");
    let line = all
        .lines()
        .rev()
        .find(|l| l.starts_with("ethersan: "))
        .unwrap_or_else(|| panic!("{what}: no error line:\n{all}"))
        .to_string();
    said_once(&line);
    line
}

/// Fail with a clear message when a tool is missing: the test command
/// (`./scripts/test`) installs them; a test must not pass by skipping.
pub fn require_tool(name: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{name} is not installed: run ./scripts/test, which installs it"
    );
}

/// Run a command with a time limit; panics on timeout.
pub fn run(cmd: &str, args: &[&str], limit: Duration) -> Output {
    let out = Command::new("timeout")
        .arg("--kill-after=5")
        .arg(limit.as_secs().to_string())
        .arg(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert_ne!(
        out.status.code(),
        Some(124),
        "{cmd} {args:?} timed out after {limit:?}"
    );
    out
}

/// One libiscsi suite's outcome.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SuiteResult {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    pub failed_tests: Vec<String>,
    pub skipped_tests: Vec<String>,
    /// CUnit printed its run summary (the run did not crash).
    pub completed: bool,
}

/// Run libiscsi's `iscsi-test-cu --test ALL.SUITE` (with `-d -S -V`)
/// against `urls` within 240 s; its parsed result and its whole output.
pub fn run_suite(suite: &str, urls: &[&str]) -> (SuiteResult, String) {
    let test = format!("ALL.{suite}");
    let mut args = vec!["-d", "-S", "-V", "--test", &test];
    args.extend_from_slice(urls);
    let out = run("iscsi-test-cu", &args, Duration::from_secs(240));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (parse_cunit(&text), text)
}

/// Parse iscsi-test-cu's CUnit "basic" output. A test that printed
/// `[SKIPPED]` between its "Test: NAME ..." line and its verdict counts as
/// skipped even though CUnit calls it passed.
pub fn parse_cunit(text: &str) -> SuiteResult {
    let mut r = SuiteResult {
        completed: text.contains("Run Summary:"),
        ..Default::default()
    };
    let mut rest = text;
    while let Some(i) = rest.find("Test: ") {
        rest = &rest[i + 6..];
        let name_end = rest.find(" ...").unwrap_or(rest.len());
        let name = rest[..name_end].to_string();
        let body = &rest[name_end..];
        // CUnit's verdict follows the "..." directly or starts a line; a
        // log line such as "[FAILED] WRITE10 ..." is not a verdict.
        let verdict = |word: &str| {
            let mut from = 0;
            while let Some(i) = body[from..].find(word) {
                let at = from + i;
                let before = &body[..at];
                if before.ends_with(" ...") || before.ends_with('\n') {
                    return Some(at);
                }
                from = at + word.len();
            }
            None
        };
        let (p, f) = (verdict("passed"), verdict("FAILED"));
        let (end, passed) = match (p, f) {
            (Some(p), Some(f)) => (p.min(f), p < f),
            (Some(p), None) => (p, true),
            (None, Some(f)) => (f, false),
            (None, None) => break,
        };
        // Only what lies before the next test counts toward this one.
        let next = body.find("Test: ").unwrap_or(body.len());
        if end > next {
            rest = &body[next..];
            continue;
        }
        let inside = &body[..end];
        if !passed {
            r.failed += 1;
            r.failed_tests.push(name);
        } else if inside.contains("[SKIPPED]") {
            r.skipped += 1;
            r.skipped_tests.push(name);
        } else {
            r.passed += 1;
        }
        rest = &body[end..];
    }
    r
}

/// Whether a file exists and is non-empty.
pub fn nonempty(p: &Path) -> bool {
    std::fs::metadata(p).map(|m| m.len() > 0).unwrap_or(false)
}
