//! What a new user meets when something is wrong: every error of `serve`
//! names what is wrong and what to do, prints each cause once, and changes
//! nothing on disk; `serve --check` validates without serving; paths in a
//! config file are relative to the file; creating a backing file is logged.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// Run `ethersan serve ARGS` in `cwd`, expecting it to fail at once;
/// returns its error line (the last `ethersan: ` line of stderr).
fn serve_fails(args: &[&str], cwd: &Path) -> String {
    serve_fails_as(args, cwd, None)
}

fn serve_fails_as(args: &[&str], cwd: &Path, as_nobody: Option<()>) -> String {
    let bin = env!("CARGO_BIN_EXE_ethersan");
    let mut cmd = match as_nobody {
        Some(()) => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", bin]);
            c
        }
        None => Command::new(bin),
    };
    let out = cmd
        .arg("serve")
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("run ethersan serve");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "serve {args:?} did not fail:\n{err}"
    );
    let line = err
        .lines()
        .rev()
        .find(|l| l.starts_with("ethersan: "))
        .unwrap_or_else(|| panic!("serve {args:?}: no error line:\n{err}"))
        .to_string();
    said_once(&line);
    line
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn serve_errors_say_what_is_wrong_and_what_to_do_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // A file the server may not write: the fix is ",ro". Root may write
    // anything, so the server runs as nobody then.
    let ro = d.join("ro.img");
    std::fs::write(&ro, vec![0u8; 1 << 20]).unwrap();
    std::fs::set_permissions(&ro, std::os::unix::fs::PermissionsExt::from_mode(0o444)).unwrap();
    std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let args = ["--listen", "127.0.0.1:0", "--lun", "ro.img"];
    let e = if is_root() {
        serve_fails_as(&args, d, Some(()))
    } else {
        serve_fails(&args, d)
    };
    assert!(e.contains("cannot open ro.img: Permission denied"), "{e}");
    assert!(e.contains("add ,ro"), "{e}");

    // A port in use names the address.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let e = serve_fails(&["--listen", &addr, "--lun", "ram:1M"], d);
    assert!(
        e.contains(&format!("cannot listen on {addr}: Address already in use")),
        "{e}"
    );
    assert!(e.contains(&format!("listens on {addr}")), "{e}");
    drop(taken);

    // A bad size is a bad size, with the forms that are accepted.
    for (spec, why) in [
        ("x.img:10Q", "unknown unit 'Q'"),
        ("x.img:0", "a size must be more than zero"),
        ("x.img:-5M", "a size cannot be negative"),
        ("ram:1.5G", r#""1.5" is not a whole number"#),
    ] {
        let e = serve_fails(&["--listen", "127.0.0.1:0", "--lun", spec], d);
        let size = spec.split(':').nth(1).unwrap();
        assert!(e.contains(&format!("bad size {size:?}: {why}")), "{e}");
        assert!(e.contains("e.g. 512M or 10G"), "{e}");
        assert!(!d.join("x.img").exists(), "{spec} created a file");
    }

    // A missing directory is not made.
    let missing = d.join("no/such/dir/x.img");
    let spec = format!("{}:1M", missing.display());
    let e = serve_fails(&["--listen", "127.0.0.1:0", "--lun", &spec], d);
    assert!(
        e.contains(&format!(
            "the directory {} does not exist",
            d.join("no/such/dir").display()
        )),
        "{e}"
    );
    assert!(!d.join("no").exists(), "the directory tree was created");

    // A missing file without a size.
    let e = serve_fails(&["--listen", "127.0.0.1:0", "--lun", "new.img"], d);
    assert!(
        e.contains("new.img does not exist; give a size to create it"),
        "{e}"
    );

    // One writable file behind two LUNs, however it is written.
    let e = serve_fails(
        &[
            "--listen",
            "127.0.0.1:0",
            "--lun",
            "two.img:1M",
            "--lun",
            "./two.img",
        ],
        d,
    );
    assert!(
        e.contains("--lun ./two.img: ./two.img is already the backing file of"),
        "{e}"
    );
    assert!(!d.join("two.img").exists());

    // Block size, target name.
    let e = serve_fails(&["--listen", "127.0.0.1:0", "--lun", "ram:1M,bs=1000"], d);
    assert!(e.contains("bs=1000 (use 512 or 4096)"), "{e}");
    let e = serve_fails(
        &[
            "--listen",
            "127.0.0.1:0",
            "--target",
            "iqn.2026-13.org.x:t",
            "--lun",
            "ram:1M",
        ],
        d,
    );
    assert!(e.contains("month 13"), "{e}");

    // Config files: the key and its line.
    let conf = |name: &str, lun: &str| {
        let p = d.join(name);
        std::fs::write(
            &p,
            format!(
                "portals = [\"127.0.0.1:0\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\n{lun}"
            ),
        )
        .unwrap();
        p.display().to_string()
    };
    let p = conf("sise.toml", "[[target.lun]]\nram = \"64M\"\nsise = 3\n");
    let e = serve_fails(&["--config", &p], d);
    assert!(
        e.contains(&format!(
            "{p}:6:1: unknown field `sise`, expected one of `path`"
        )),
        "{e}"
    );
    let p = conf(
        "bs.toml",
        "[[target.lun]]\nram = \"64M\"\nblock_size = 1000\n",
    );
    let e = serve_fails(&["--config", &p], d);
    assert!(
        e.contains(&format!("{p}:6:1: block_size must be 512 or 4096")),
        "{e}"
    );
    let p = conf(
        "type.toml",
        "[[target.lun]]\nram = \"64M\"\nread_only = \"yes\"\n",
    );
    let e = serve_fails(&["--config", &p], d);
    assert!(
        e.contains(&format!(
            "{p}:6:13: read_only: invalid type: string \"yes\", expected a boolean"
        )),
        "{e}"
    );
    let p = conf(
        "twice.toml",
        "lun = [\"t.img:1M\"]\n[[target]]\nname = \"iqn.2026-11.org.x:u\"\nlun = [\"t.img\"]\n",
    );
    let e = serve_fails(&["--config", &p], d);
    assert!(
        e.contains(&format!("{p}:7:8: "))
            && e.contains("already the backing file of target iqn.2026-11.org.x:t LUN 0"),
        "{e}"
    );
    let e = serve_fails(&["--config", "absent.toml"], d);
    assert!(
        e.contains("absent.toml: No such file or directory (os error 2)"),
        "{e}"
    );
}

#[test]
fn serve_check_validates_without_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("old.img"), vec![0u8; 1 << 20]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args([
            "serve",
            "--check",
            "--listen",
            "127.0.0.1:9",
            "--lun",
            "old.img",
            "--lun",
            "new.img:1G",
            "--lun",
            "ram:1M",
        ])
        .current_dir(d)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("configuration is good"), "{err}");
    assert!(err.contains("LUN 0: old.img, 1 MiB, exists"), "{err}");
    assert!(
        err.contains("LUN 1: new.img, 1 GiB, will be created sparse"),
        "{err}"
    );
    assert!(err.contains("LUN 2: RAM, 1 MiB"), "{err}");
    assert!(
        !d.join("new.img").exists(),
        "--check created a backing file"
    );
    assert!(
        !d.join("old.img.id").exists(),
        "--check wrote an identity file"
    );
    // The embedded default: its data directory is not made either.
    let out = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(["serve", "--check"])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!d.join("ethersan-data").exists());
    // A bad configuration: status 1, the reason once.
    let e = serve_fails(&["--check", "--lun", "old.img:512K"], d);
    assert!(
        e.contains("larger than the size 524288 given; refusing to truncate it"),
        "{e}"
    );
    assert_eq!(std::fs::metadata(d.join("old.img")).unwrap().len(), 1 << 20);
}

/// Start a server in `cwd` with `args`, stop it, and return its log.
fn serve_log(args: &[String], cwd: &Path) -> Vec<String> {
    let mut all = vec!["serve".to_string()];
    all.extend_from_slice(args);
    let mut s = Server::start_args_in(&all, Some(cwd));
    // Returns once the log reader has read the server's stderr to its end.
    s.stop();
    let log = s.log.lock().unwrap().clone();
    log
}

#[test]
fn config_paths_are_relative_to_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let (conf_dir, elsewhere) = (dir.path().join("conf"), dir.path().join("elsewhere"));
    std::fs::create_dir(&conf_dir).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(conf_dir.join("secret"), "0123456789abcdef\n").unwrap();
    let conf = conf_dir.join("ethersan.toml");
    std::fs::write(
        &conf,
        "portals = [\"127.0.0.1:0\"]\n[options]\ndata_dir = \"state\"\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\nlun = [\"disk.img:1M\"]\n[target.chap]\nuser = \"u\"\nsecret_file = \"secret\"\n",
    )
    .unwrap();
    let args = vec!["--config".to_string(), conf.display().to_string()];
    let log = serve_log(&args, &elsewhere);
    assert!(conf_dir.join("disk.img").exists(), "{log:?}");
    assert!(!elsewhere.join("disk.img").exists());
    // The data directory, stated with its absolute path.
    let abs = std::fs::canonicalize(&conf_dir).unwrap().join("state");
    assert!(
        log.iter()
            .any(|l| l.ends_with(&format!("data directory {}", abs.display()))),
        "{log:?}"
    );
    // A second server from another directory gets the same disk.
    let log = serve_log(&args, dir.path());
    assert!(
        log.iter().any(|l| l.contains("identity=stored in")),
        "{log:?}"
    );
}

#[test]
fn a_created_backing_file_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--lun",
        "fresh.img:1M",
        "--lun",
        "big.img:3G,full",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let log = serve_log(&args, dir.path());
    // With the absolute path: a relative one depends on where it ran.
    let d = dir.path().display();
    assert!(
        log.iter()
            .any(|l| l.ends_with(&format!("created {d}/fresh.img, 1 MiB, sparse"))),
        "{log:?}"
    );
    assert!(
        log.iter()
            .any(|l| l.ends_with(&format!("created {d}/big.img, 3 GiB, allocated"))),
        "{log:?}"
    );
    // Opening it again creates nothing.
    let log = serve_log(&args, dir.path());
    assert!(
        !log.iter().any(|l| l.contains("created fresh.img")),
        "{log:?}"
    );
}

/// A 16 MiB tmpfs mounted for the test, unmounted when dropped.
struct SmallFs(tempfile::TempDir);

impl SmallFs {
    fn mount() -> SmallFs {
        assert!(is_root(), "this test mounts a small tmpfs and needs root");
        let dir = tempfile::tempdir().unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=16m", "ethersan-test"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs");
        SmallFs(dir)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn too_little_space_warns_when_thin_and_leaves_nothing_when_full() {
    let fs = SmallFs::mount();
    let d = fs.0.path();
    let e = serve_fails(
        &["--listen", "127.0.0.1:0", "--lun", "full.img:100M,full"],
        d,
    );
    assert!(
        e.contains("cannot open full.img: No space left on device"),
        "{e}"
    );
    assert!(
        !d.join("full.img").exists(),
        "a partial file was left behind"
    );

    let mut s = Server::start_args_in(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--target",
            IQN,
            "--lun",
            "thin.img:100M",
        ]
        .map(String::from),
        Some(d),
    );
    // Writing more than fits: the client fails, the server logs the
    // failures with the unit and the bytes, not each one.
    let big = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(big.path(), pattern(40 << 20, 3)).unwrap();
    let out = ethersan(&["cp", "-q", big.path().to_str().unwrap(), &s.url(0)]);
    s.stop();
    let log = s.log.lock().unwrap().clone();
    assert!(
        log.iter().any(
            |l| l.contains("thin.img is 100 MiB but its filesystem has only")
                && l.contains("SPACE ALLOCATION FAILED")
        ),
        "{log:?}"
    );
    assert!(!out.status.success(), "cp into a full store succeeded");
    let failures: Vec<_> = log
        .iter()
        .filter(|l| l.contains("out of space on bytes"))
        .collect();
    assert!(!failures.is_empty(), "no failure logged: {log:?}");
    assert!(
        failures[0].contains(&format!("target {IQN} LU "))
            && failures[0].contains("thin.img")
            && failures[0].contains("No space left on device"),
        "{failures:?}"
    );
    assert!(
        failures.len() <= 5,
        "failures not rate-limited: {failures:?}"
    );
}

#[test]
fn a_closed_stderr_does_not_stop_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(["serve", "--listen", "127.0.0.1:0", "--lun", "ram:1M"])
        .current_dir(dir.path())
        .env("ETHERSAN_LOG", "debug")
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Read up to the portal line, then close both pipes (as `| head -1`).
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let l = lines.next().expect("a portal line").unwrap();
        if let Some(a) = l.split("listening on ").nth(1) {
            break a.trim().to_string();
        }
    };
    drop(lines);
    drop(child.stdout.take());
    // Make it log: a connection and a discovery.
    let _ = ethersan(&["discover", &addr]);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the server ended when its stderr closed"
    );
    // SAFETY: kill with a valid pid and signal has no memory effects.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}
