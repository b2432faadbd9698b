//! The client in a new user's first hour: it never hangs (a timeout in
//! every phase, named in the message), `cp` rides out a frozen target by
//! retrying on a new session, every subcommand takes CHAP the same ways,
//! no secret is ever printed, and what is not there is an error.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_ethersan");

/// A client command with none of the client's environment variables set
/// but `env`.
fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("ETHERSAN_CHAP")
        .env_remove("ETHERSAN_MUTUAL_CHAP")
        .env_remove("ETHERSAN_TIMEOUT")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Wait for `child` at most `limit`; a client still running then hangs,
/// which is the failure these tests look for.
fn finish(child: std::process::Child, what: &str, limit: Duration) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait for ethersan"),
        Err(_) => {
            signal(pid, libc::SIGKILL);
            panic!("ethersan {what} still ran after {limit:?}: it hangs");
        }
    }
}

/// Run the client, bounded by `limit`.
fn client(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let child = command(args, env).spawn().expect("run ethersan");
    finish(child, &format!("{args:?}"), limit)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a process this test started; no memory involved.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// SIGSTOP a server; SIGCONT when dropped (also when the test fails).
struct Frozen(u32);

impl Frozen {
    fn new(server: &Server) -> Frozen {
        signal(server.child.id(), libc::SIGSTOP);
        Frozen(server.child.id())
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

/// A listener that accepts connections and never answers.
fn silent_peer() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            held.push(s);
        }
    });
    addr
}

#[test]
fn a_peer_that_never_answers_times_out_at_login_in_every_subcommand() {
    let addr = silent_peer();
    let url = format!("iscsi://{addr}/{IQN}/0");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.img");
    let out = out.to_str().unwrap();
    for args in [
        vec!["discover", &addr],
        vec!["ls", &url],
        vec!["inquiry", &url],
        vec!["cp", &url, out],
        vec!["bench", &url, "--time", "1s"],
    ] {
        let mut with = args.clone();
        with.extend(["--timeout", "1"]);
        let started = Instant::now();
        let o = client(&with, &[], Duration::from_secs(20));
        let line = error_line(&o, &format!("{with:?}"));
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{with:?} took {:?}",
            started.elapsed()
        );
        assert!(
            line.contains("login timed out: no answer from the target within 1 s")
                && line.contains("--timeout"),
            "{with:?}: {line}"
        );
    }
    // $ETHERSAN_TIMEOUT does the same as --timeout.
    let o = client(
        &["ls", &url],
        &[("ETHERSAN_TIMEOUT", "500ms")],
        Duration::from_secs(20),
    );
    let line = error_line(&o, "ls with ETHERSAN_TIMEOUT");
    assert!(line.contains("within 500 ms"), "{line}");
}

#[test]
fn a_frozen_target_times_out_at_login_and_mid_command() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let server = Server::start_with("ram:64M", &["--api-socket", sock.to_str().unwrap()]);
    let url = server.url(0);
    // A command in flight when the target stops.
    let bench = command(
        &[
            "bench",
            &url,
            "--rw",
            "randread",
            "--qd",
            "4",
            "--time",
            "30s",
            "--timeout",
            "1",
        ],
        &[],
    )
    .spawn()
    .unwrap();
    // Frozen once the target has answered the bench's first READs: its
    // next ones are in flight.
    wait_sessions(&sock, "the bench's reads", Duration::from_secs(20), |s| {
        counter(s, "reads") > 0
    });
    let frozen = Frozen::new(&server);
    let started = Instant::now();
    let o = finish(bench, "bench on a frozen target", Duration::from_secs(20));
    let line = error_line(&o, "bench on a frozen target");
    assert!(
        line.contains("SCSI command READ(16) timed out: no answer from the target within 1 s"),
        "{line}"
    );
    assert!(started.elapsed() < Duration::from_secs(8));
    // A login to a stopped target (the kernel still accepts the connection).
    let o = client(
        &["ls", &url, "--timeout", "1"],
        &[],
        Duration::from_secs(20),
    );
    let line = error_line(&o, "ls on a frozen target");
    assert!(line.contains("login timed out"), "{line}");
    drop(frozen);
    // Thawed, it serves again.
    let o = client(&["ls", &url], &[], Duration::from_secs(20));
    assert!(o.status.success(), "{}", text(&o));
}

/// A TCP relay to `to` that, once `cut` is set, silently drops whatever
/// either side sends while keeping both connections open: a link that
/// died without a reset (half-open).
fn relay(to: String, cut: Arc<AtomicBool>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for a in l.incoming().flatten() {
            let b = TcpStream::connect(&to).unwrap();
            for (mut from, mut into) in [(a.try_clone().unwrap(), b.try_clone().unwrap()), (b, a)] {
                let cut = cut.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        if !cut.load(Ordering::Relaxed) && into.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        }
    });
    addr
}

#[test]
fn a_half_open_connection_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let server = Server::start_with("ram:64M", &["--api-socket", sock.to_str().unwrap()]);
    let cut = Arc::new(AtomicBool::new(false));
    let via = relay(server.addr.clone(), cut.clone());
    let url = format!("iscsi://{via}/{IQN}/0");
    let bench = command(
        &[
            "bench",
            &url,
            "--rw",
            "randwrite",
            "--qd",
            "8",
            "--time",
            "30s",
            "--timeout",
            "2",
        ],
        &[],
    )
    .spawn()
    .unwrap();
    // Cut once the target has done the bench's first WRITEs through the
    // relay: its next ones are in flight.
    wait_sessions(&sock, "the bench's writes", Duration::from_secs(20), |s| {
        counter(s, "writes") > 0
    });
    cut.store(true, Ordering::Relaxed);
    let o = finish(bench, "bench over a dead link", Duration::from_secs(20));
    let line = error_line(&o, "bench over a dead link");
    assert!(
        line.contains("SCSI command WRITE(16) timed out: no answer from the target within 2 s"),
        "{line}"
    );
}

#[test]
fn cp_retries_on_a_new_session_when_the_target_freezes() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let server = Server::start_with("ram:16M", &["--api-socket", sock.to_str().unwrap()]);
    let url = server.url(0);
    let data = pattern(4 << 20, 0x5eed);
    let mut cp = command(
        &[
            "cp",
            "-",
            &url,
            "--timeout",
            "1",
            "--chunk",
            "64K",
            "--depth",
            "4",
        ],
        &[],
    )
    .stdin(Stdio::piped())
    .spawn()
    .unwrap();
    // stdin is fed from a thread: cp stops reading it while its writes
    // wait on the stopped target.
    let mut stdin = cp.stdin.take().unwrap();
    let (go, wait) = mpsc::channel::<()>();
    let feeder = {
        let data = data.clone();
        std::thread::spawn(move || -> std::io::Result<()> {
            stdin.write_all(&data[..1 << 20])?;
            let _ = wait.recv();
            stdin.write_all(&data[1 << 20..])
        })
    };
    // Frozen once the target has taken the first MiB (all cp has been
    // given so far).
    wait_sessions(&sock, "cp's first MiB", Duration::from_secs(20), |s| {
        counter(s, "write_bytes") >= 1 << 20
    });
    {
        let _frozen = Frozen::new(&server);
        // The next writes wait on a stopped target and time out after
        // 1 s; the new login waits for the target to come back.
        go.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(2500));
    }
    let o = finish(cp, "cp across a frozen target", Duration::from_secs(40));
    let fed = feeder.join().unwrap();
    assert!(
        fed.is_ok(),
        "cp stopped reading stdin: {fed:?}\n{}",
        text(&o)
    );
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "cp failed:\n{err}");
    assert!(
        err.contains("SCSI command WRITE(16) timed out")
            && err.contains("logging in again to retry"),
        "cp did not say what it did:\n{err}"
    );
    assert!(
        err.contains("retried on 1 new session"),
        "no retry count in the summary:\n{err}"
    );
    // Every byte arrived, once, in its place.
    let dir = tempfile::tempdir().unwrap();
    let back = dir.path().join("back.img");
    let o = client(
        &["cp", &url, back.to_str().unwrap(), "--length", "4M"],
        &[],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(std::fs::read(&back).unwrap() == data, "the LUN differs");
}

/// A command line and its environment.
type Args<'a> = Vec<&'a str>;
type Env<'a> = Vec<(&'a str, &'a str)>;

const USER: &str = "alice";
const SECRET: &str = "alice-secret-123";
const T_USER: &str = "tgt";
const T_SECRET: &str = "target-secret-456";

#[test]
fn every_subcommand_takes_chap_from_the_flag_the_environment_or_the_url() {
    let server = Server::start_with(
        "ram:16M",
        &[
            "--chap",
            &format!("{USER}:{SECRET}"),
            "--mutual-chap",
            &format!("{T_USER}:{T_SECRET}"),
        ],
    );
    // The startup hint (printed just after "listening on") says that CHAP
    // is needed, and never the secret.
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = server.log.lock().unwrap().join("\n");
        if log.contains("open-iscsi:") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        log.contains("CHAP required: user alice") && log.contains("--chap alice:SECRET"),
        "{log}"
    );
    assert!(!log.contains(SECRET) && !log.contains(T_SECRET), "{log}");

    let addr = server.addr.clone();
    let plain = server.url(0);
    let in_url = format!("iscsi://{USER}%{SECRET}@{addr}/{IQN}/0");
    let creds = format!("{USER}:{SECRET}");
    let mutual = format!("{T_USER}:{T_SECRET}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.img");
    let out = out.to_str().unwrap();
    let limit = Duration::from_secs(30);
    let creds_at = format!("{creds}@{addr}");
    // The URL's mutual pair, as libiscsi writes it.
    let in_url_mutual = format!("{in_url}?target_user={T_USER}&target_password={T_SECRET}");
    let runs: Vec<(Args, Env)> = vec![
        (vec!["discover", &addr, "--chap", &creds], vec![]),
        (vec!["discover", &addr], vec![("ETHERSAN_CHAP", &creds)]),
        (vec!["discover", &creds_at], vec![]),
        (vec!["ls", &plain, "--chap", &creds], vec![]),
        (vec!["ls", &plain], vec![("ETHERSAN_CHAP", &creds)]),
        (vec!["ls", &in_url], vec![]),
        (vec!["inquiry", &plain, "--chap", &creds], vec![]),
        (
            vec![
                "inquiry",
                &plain,
                "--chap",
                &creds,
                "--mutual-chap",
                &mutual,
            ],
            vec![],
        ),
        (
            vec!["inquiry", &plain],
            vec![("ETHERSAN_CHAP", &creds), ("ETHERSAN_MUTUAL_CHAP", &mutual)],
        ),
        (
            vec!["cp", &plain, out, "--length", "1M", "--chap", &creds],
            vec![],
        ),
        (
            vec!["cp", &in_url, out, "--length", "1M"],
            vec![("ETHERSAN_MUTUAL_CHAP", &mutual)],
        ),
        (
            vec!["bench", &plain, "--ios", "100", "--chap", &creds],
            vec![],
        ),
        (vec!["bench", &in_url, "--ios", "100"], vec![]),
        (vec!["inquiry", &in_url_mutual], vec![]),
    ];
    for (args, env) in &runs {
        let o = client(args, env, limit);
        assert!(o.status.success(), "{args:?} {env:?}:\n{}", text(&o));
        let t = text(&o);
        assert!(
            !t.contains(SECRET) && !t.contains(T_SECRET),
            "{args:?}: {t}"
        );
    }

    // Without credentials: refused, and told how to give them.
    let o = client(&["ls", &plain], &[], limit);
    let line = error_line(&o, "ls without CHAP");
    assert!(
        line.contains("authentication failure") && line.contains("--chap USER:SECRET"),
        "{line}"
    );
    // A target that does not know the mutual secret: it failed to prove
    // itself, and that is what the message says.
    let wrong_mutual = format!("{T_USER}:not-the-target-secret");
    let o = client(
        &[
            "inquiry",
            &plain,
            "--chap",
            &creds,
            "--mutual-chap",
            &wrong_mutual,
        ],
        &[],
        limit,
    );
    let line = error_line(&o, "inquiry with the wrong mutual secret");
    assert!(line.contains("the target failed to prove itself"), "{line}");
    assert!(!text(&o).contains("not-the-target-secret"), "{line}");
}

#[test]
fn secrets_never_appear_in_any_output() {
    let server = Server::start_with("ram:4M", &["--chap", &format!("{USER}:{SECRET}")]);
    let secret = "wrong-secret-XYZ123";
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let a = &server.addr;
    for args in [
        vec!["discover".to_string(), format!("{USER}:{secret}@{closed}")],
        vec!["discover".to_string(), format!("{USER}:{secret}@{a}")],
        vec![
            "discover".to_string(),
            format!("iscsi://{USER}%{secret}@{a}"),
        ],
        vec![
            "discover".to_string(),
            a.clone(),
            "--chap".into(),
            format!("{USER}:{secret}"),
        ],
        vec![
            "ls".to_string(),
            format!("iscsi://{USER}%{secret}@{a}/{IQN}/0"),
        ],
        vec![
            "ls".to_string(),
            format!("iscsi://{USER}%{secret}@{a}:99999/{IQN}/0"),
        ],
        vec![
            "inquiry".to_string(),
            format!("iscsi://{USER}%{secret}@{a}/{IQN}/x"),
        ],
        vec![
            "inquiry".to_string(),
            format!("iscsi://{USER}%{SECRET}@{a}/{IQN}/0?target_user=t&target_password={secret}"),
        ],
        vec![
            "cp".to_string(),
            format!("iscsi://{USER}%{secret}@{a}/{IQN}/0"),
            "-".into(),
        ],
        vec![
            "bench".to_string(),
            format!("iscsi://{USER}%{secret}@{closed}/{IQN}/0"),
        ],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = client(&args, &[], Duration::from_secs(30));
        let line = error_line(&o, &format!("{args:?}"));
        assert!(
            !text(&o).contains(secret),
            "{args:?} printed the secret: {line}"
        );
    }
}

#[test]
fn a_lun_that_is_not_there_is_an_error_and_bench_refuses_a_size_beyond_the_lun() {
    let server = Server::start(&["ram:8M", "ram:4M"]);
    let limit = Duration::from_secs(30);
    for cmd in ["inquiry", "ls"] {
        let o = client(&[cmd, &server.url(7)], &[], limit);
        let line = error_line(&o, &format!("{cmd} of LUN 7"));
        assert!(line.contains("no LUN 7"), "{line}");
    }
    // ls with a LUN lists that LUN alone; without one, every LUN.
    let o = client(&["ls", "--json", &server.url(1)], &[], limit);
    let one: serde_json::Value = serde_json::from_str(&ok(&o)).unwrap();
    assert_eq!(one.as_array().map(Vec::len), Some(1), "{one}");
    assert_eq!(one[0]["lun"], 1);
    assert_eq!(one[0]["capacity_bytes"], 4 << 20);
    let all_url = format!("iscsi://{}/{IQN}", server.addr);
    let o = client(&["ls", "--json", &all_url], &[], limit);
    let all: serde_json::Value = serde_json::from_str(&ok(&o)).unwrap();
    assert_eq!(all.as_array().map(Vec::len), Some(2), "{all}");
    // bench --size larger than the LUN is refused, not silently clamped.
    let o = client(
        &["bench", &server.url(1), "--size", "10G", "--ios", "10"],
        &[],
        limit,
    );
    let line = error_line(&o, "bench --size 10G on a 4 MiB LUN");
    assert!(
        line.contains("--size 10737418240 is more than the target holds (4194304 bytes)"),
        "{line}"
    );
}

#[test]
fn a_full_backing_store_is_reported_as_out_of_space() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=1M",
            "tmpfs",
            mnt.to_str().unwrap(),
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert!(mounted, "cannot mount a tmpfs (this test needs root)");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    let lun = format!("{}:16M", mnt.join("thin.img").display());
    let server = Server::start(&[&lun]);
    let src = dir.path().join("src.img");
    std::fs::write(&src, pattern(4 << 20, 9)).unwrap();
    let o = client(
        &["cp", src.to_str().unwrap(), &server.url(0)],
        &[],
        Duration::from_secs(60),
    );
    let line = error_line(&o, "cp onto a full filesystem");
    assert!(
        line.contains("the target's backing store is out of space") && !line.contains("read-only"),
        "{line}"
    );
}

#[test]
fn cp_progress_and_summary_use_one_unit_family_and_show_the_verify_pass() {
    let server = Server::start(&["ram:128M"]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    std::fs::write(&src, pattern(96 << 20, 3)).unwrap();
    // A terminal, as a person has: `script` runs cp on a pseudo-terminal.
    let cmd = format!(
        "{BIN} cp --verify --depth 1 --chunk 64K {} {}",
        src.display(),
        server.url(0)
    );
    let o = Command::new("timeout")
        .args(["60", "script", "-qec", &cmd, "/dev/null"])
        .env_remove("ETHERSAN_TIMEOUT")
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("copy   ") && t.contains("verify "),
        "no copy and verify bars:\n{t}"
    );
    assert!(
        t.contains("MiB/s") && !t.contains(" MB/s"),
        "units differ:\n{t}"
    );
    let summary = t
        .lines()
        .find(|l| l.contains("ethersan cp: "))
        .unwrap_or_else(|| panic!("no summary:\n{t}"));
    assert!(
        summary.contains("96.00 MiB (100663296 bytes) copied in")
            && summary.contains("verified in")
            && summary.contains("s in all"),
        "{summary}"
    );
}

#[test]
fn a_closed_stdout_or_stderr_never_panics_the_client() {
    let server = Server::start(&["ram:4M"]);
    let url = server.url(0);
    for (args, redirect) in [
        (format!("ls {url}"), ">&-"),
        (format!("ls --json {url}"), ">&-"),
        (format!("inquiry {url}"), ">&-"),
        (format!("discover {}", server.addr), ">&-"),
        (format!("bench {url} --ios 50"), ">&-"),
        // An error with nowhere to say it.
        (format!("inquiry {}", server.url(9)), "2>&-"),
    ] {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {BIN} {args} {redirect}"))
            .env_remove("ETHERSAN_TIMEOUT")
            .output()
            .unwrap();
        let t = text(&o);
        assert_ne!(
            o.status.code(),
            Some(101),
            "{args} {redirect} panicked: {t}"
        );
        assert!(!t.contains("panicked"), "{args} {redirect}: {t}");
    }
}
