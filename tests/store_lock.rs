//! One backing store, one exporter: a second server, a second LUN of the
//! same server, or a live `ctl lun add` on a file in use is refused with a
//! message naming the file and the process that holds it, unless every
//! exporter says `shared`; removing a LUN or stopping a server releases
//! the file (see `ethersan_backend::lock`).

mod common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::{path_str, Server};

const IQN: &str = "iqn.2026-11.org.ethersan:lock";

/// `ethersan serve` on a free loopback port with these LUN specs and its
/// own API socket in `dir` (named `sock`).
fn serve(dir: &Path, sock: &str, luns: &[String]) -> Server {
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--target".into(),
        IQN.into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--api-socket".into(),
        path_str(&dir.join(sock)),
    ];
    for l in luns {
        args.push("--lun".into());
        args.push(l.clone());
    }
    Server::start_args_in(&args, Some(dir))
}

/// `ethersan serve ARGS`, run in `dir`, that must fail to start: its
/// output.
fn refused(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("timeout")
        .args([
            "--kill-after=5",
            "30",
            env!("CARGO_BIN_EXE_ethersan"),
            "serve",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run ethersan serve");
    let text = text(&out);
    assert!(
        !out.status.success() && out.status.code() != Some(124),
        "serve {args:?} did not fail at once: {text}"
    );
    text
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ctl(dir: &Path, sock: &str, args: &[&str]) -> Output {
    let sock = path_str(&dir.join(sock));
    common::run(
        env!("CARGO_BIN_EXE_ethersan"),
        &[&["ctl", "--socket", &sock], args].concat(),
        Duration::from_secs(30),
    )
}

#[test]
fn a_second_server_on_one_file_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let spec = format!("{}:4M", img.display());
    let mut first = serve(dir.path(), "a.sock", std::slice::from_ref(&spec));
    let pid = first.child.id();
    let listen = ["--listen", "127.0.0.1:0"];
    let msg = refused(dir.path(), &[&listen[..], &["--lun", &spec]].concat());
    assert!(
        msg.contains(&format!("{} is in use by process {pid} (", img.display()))
            && msg.contains("ethersan serve")
            && msg.contains("shared = true"),
        "the refusal names the file, the holder and what to do: {msg}"
    );
    common::said_once(msg.lines().rfind(|l| l.contains("in use")).unwrap());
    // Shared by one and not the other: refused too, either way round.
    let shared = format!("{spec},shared");
    let msg = refused(dir.path(), &[&listen[..], &["--lun", &shared]].concat());
    assert!(msg.contains("exports it alone"), "{msg}");
    // Stopped, the first server releases it.
    assert!(first.stop().is_some_and(|s| s.success()));
    let again = serve(dir.path(), "a.sock", std::slice::from_ref(&spec));
    drop(again);
    // Shared on purpose by both: both serve it, and an exclusive one is
    // refused while they do.
    let one = serve(dir.path(), "a.sock", std::slice::from_ref(&shared));
    let two = serve(dir.path(), "c.sock", std::slice::from_ref(&shared));
    let msg = refused(dir.path(), &[&listen[..], &["--lun", &spec]].concat());
    let (p1, p2) = (one.child.id(), two.child.id());
    assert!(
        msg.contains("which exports it shared")
            && (msg.contains(&format!("process {p1} ("))
                || msg.contains(&format!("process {p2} ("))),
        "{msg}"
    );
}

#[test]
fn two_luns_of_one_server_on_one_file_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    // A hard link: another name, the same file (the configuration's own
    // check compares names).
    let link = dir.path().join("same.img");
    std::fs::hard_link(&img, &link).unwrap();
    let config = dir.path().join("ethersan.toml");
    std::fs::write(
        &config,
        format!(
            "portals = [\"127.0.0.1:0\"]\n[options]\ndata_dir = \"{d}\"\n[[target]]\nname = \"{IQN}\"\nlun = [\"{a}\", \"{b}\"]\n",
            d = dir.path().display(),
            a = img.display(),
            b = link.display()
        ),
    )
    .unwrap();
    let msg = refused(dir.path(), &["--config", &path_str(&config)]);
    assert!(
        msg.contains(&format!(
            "LUN 1: {} is in use by another LUN of this server",
            link.display()
        )),
        "{msg}"
    );
    // Both shared on purpose: served.
    std::fs::write(
        &config,
        format!(
            "portals = [\"127.0.0.1:0\"]\n[options]\ndata_dir = \"{d}\"\n[[target]]\nname = \"{IQN}\"\n[[target.lun]]\npath = \"{a}\"\nshared = true\n[[target.lun]]\npath = \"{b}\"\nshared = true\n",
            d = dir.path().display(),
            a = img.display(),
            b = link.display()
        ),
    )
    .unwrap();
    let server = Server::start_args(&["serve".into(), "--config".into(), path_str(&config)]);
    drop(server);
}

#[test]
fn a_live_lun_add_of_a_file_in_use_is_refused_and_lun_rm_releases_it() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let spec = format!("{}:4M", img.display());
    let a = serve(dir.path(), "a.sock", std::slice::from_ref(&spec));
    let _b = serve(dir.path(), "b.sock", &["ram:4M".into()]);
    let path = path_str(&img);
    // Another server: refused, naming the one that holds it.
    let out = ctl(dir.path(), "b.sock", &["lun", "add", IQN, &path]);
    let msg = text(&out);
    assert!(
        !out.status.success()
            && msg.contains(&format!("{path} is in use by process {}", a.child.id())),
        "{msg}"
    );
    // The same server, a second LUN: refused.
    let out = ctl(dir.path(), "a.sock", &["lun", "add", IQN, &path]);
    let msg = text(&out);
    assert!(
        !out.status.success() && msg.contains("in use by another LUN of this server"),
        "{msg}"
    );
    // Removed from the first server, it is free for the second.
    let out = ctl(dir.path(), "a.sock", &["lun", "rm", IQN, "0"]);
    assert!(out.status.success(), "lun rm: {}", text(&out));
    let out = ctl(dir.path(), "b.sock", &["lun", "add", IQN, &path]);
    assert!(out.status.success(), "lun add after rm: {}", text(&out));
}

#[test]
fn a_reload_that_replaces_a_lun_keeps_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let config = dir.path().join("ethersan.toml");
    let write = |alias: &str, wce: bool, ro: bool| {
        std::fs::write(
            &config,
            format!(
                "portals = [\"127.0.0.1:0\"]\n[options]\ndata_dir = \"{d}\"\n[[target]]\nname = \"{IQN}\"\nalias = \"{alias}\"\n[[target.lun]]\npath = \"{img}\"\nsize = \"4M\"\nwrite_cache = {wce}\nread_only = {ro}\n",
                d = dir.path().display(),
                img = img.display()
            ),
        )
        .unwrap()
    };
    write("one", true, false);
    let server = Server::start_args(&[
        "serve".into(),
        "--config".into(),
        path_str(&config),
        "--api-socket".into(),
        path_str(&dir.path().join("a.sock")),
    ]);
    let hup = |want: &str| {
        let seen = |log: &str| log.matches(want).count();
        let before = seen(&server.log.lock().unwrap().join("\n"));
        // SAFETY: kill(2) on the server process this test started.
        unsafe { libc::kill(server.child.id() as libc::pid_t, libc::SIGHUP) };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let log = server.log.lock().unwrap().join("\n");
            assert!(!log.contains("reload of"), "the reload failed: {log}");
            if seen(&log) > before {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no {want:?}: {log}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // An option of the LUN changes: it is opened again, its lock kept.
    write("one", false, false);
    hup("replaced LUN 0");
    // The alias changes: the target is rebuilt around the same file.
    write("two", false, false);
    hup("alias changed");
    // Read-only and back: the lock is converted, shared and exclusive.
    write("two", false, true);
    hup("replaced LUN 0");
    write("two", false, false);
    hup("replaced LUN 0");
    // Still locked: another server is refused.
    let listen = ["--listen", "127.0.0.1:0"];
    let spec = path_str(&img);
    let msg = refused(dir.path(), &[&listen[..], &["--lun", &spec]].concat());
    assert!(
        msg.contains(&format!("in use by process {}", server.child.id())),
        "{msg}"
    );
}
