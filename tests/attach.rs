//! `ethersan attach URL DIR`: the LUN as a file in a FUSE mount, used the
//! way people use it — a loop device on it (buffered and with direct I/O),
//! ext4 made and mounted on that, files written, everything taken down,
//! attached again and the files checked — over iSCSI and over AoE; the
//! file's own rules (size, mode, offsets, the end); detaching by umount,
//! fusermount3 -u and SIGTERM/SIGINT; mistakes as one error line.
//!
//! Needs root, /dev/fuse, losetup, mkfs.ext4, e2fsck and fusermount3
//! (./scripts/test installs what is missing); a missing one fails the test
//! by name. Every loop device, mount and process is taken down by a drop
//! guard, also when a test fails.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_ethersan");

/// Longest any one outside tool may take.
const TOOL: Duration = Duration::from_secs(120);

fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: load the fuse module (modprobe fuse) to run the attach tests"
    );
    for tool in [
        "losetup",
        "mkfs.ext4",
        "e2fsck",
        "mount",
        "umount",
        "sha256sum",
    ] {
        require_tool(tool);
    }
}

/// Whether something is mounted on `dir` (as /proc/self/mountinfo says).
fn is_mounted(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let dir = dir.to_str().unwrap();
    info.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|m| m == dir))
}

/// Run a tool (bounded) and insist that it succeeded; its stdout.
fn must(cmd: &str, args: &[&str]) -> String {
    must_run(cmd, args, TOOL)
}

/// Run a tool in a drop guard: bounded, never panics.
fn quietly(cmd: &str, args: &[&str]) -> bool {
    Command::new("timeout")
        .arg("--kill-after=5")
        .arg("60")
        .arg(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn send(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a child we spawned and have not reaped; no memory involved.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// A running `ethersan attach`: stopped, and its mount taken down, when
/// dropped.
struct Attached {
    child: Child,
    dir: PathBuf,
    /// The LUN's file, as the attached line names it.
    file: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
}

impl Attached {
    /// Start `ethersan attach URL DIR EXTRA…` and wait for its attached line.
    fn start(url: &str, dir: &Path, extra: &[&str]) -> Attached {
        let mut child = Command::new(BIN)
            .arg("attach")
            .arg(url)
            .arg(dir)
            .args(extra)
            .env("ETHERSAN_LOG", "info")
            .env_remove("ETHERSAN_CHAP")
            .env_remove("ETHERSAN_TIMEOUT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ethersan attach");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                l.lock().unwrap().push(line);
            }
        });
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                l.lock().unwrap().push(line);
            }
        });
        let mut a = Attached {
            child,
            dir: dir.to_path_buf(),
            file: PathBuf::new(),
            log,
        };
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("attach did not say it attached:\n{}", a.text()));
        // The hint is the README's: direct I/O, past a second page cache.
        let path = line
            .split("losetup --find --show --direct-io=on ")
            .nth(1)
            .unwrap_or_else(|| panic!("no losetup --direct-io=on command in {line:?}"));
        a.file = PathBuf::from(path.trim());
        assert!(
            is_mounted(dir),
            "{} is not mounted:\n{}",
            dir.display(),
            a.text()
        );
        a
    }

    fn text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Wait (bounded) for the command to end.
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if let Some(st) = self.child.try_wait().unwrap() {
                // Let the reader threads take the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return st;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("attach still runs after {limit:?}:\n{}", self.text());
    }

    /// The command ends with status 0, says it detached, and leaves
    /// nothing mounted.
    fn detached_cleanly(&mut self) {
        let st = self.wait(Duration::from_secs(30));
        assert!(st.success(), "attach exited with {st}:\n{}", self.text());
        assert!(
            self.text().contains("ethersan attach: detached"),
            "no detached line:\n{}",
            self.text()
        );
        assert!(
            !is_mounted(&self.dir),
            "{} is still mounted",
            self.dir.display()
        );
        // A normal detach warns of nothing (fuser's second unmount after
        // `umount DIR` said "Failed to umount filesystem").
        let text = self.text();
        assert!(
            !text.contains(" WARN ") && !text.contains("Failed to umount"),
            "a warning on a normal detach:\n{text}"
        );
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            send(self.child.id(), libc::SIGTERM);
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if is_mounted(&self.dir) {
            quietly("umount", &["-l", self.dir.to_str().unwrap()]);
        }
    }
}

/// A loop device on a file, detached when dropped.
struct Loop {
    dev: String,
}

impl Loop {
    fn on(file: &Path, direct: bool) -> Loop {
        let mut args = vec!["--find", "--show"];
        if direct {
            args.push("--direct-io=on");
        }
        args.push(file.to_str().unwrap());
        let dev = must("losetup", &args).trim().to_string();
        assert!(dev.starts_with("/dev/loop"), "losetup said {dev:?}");
        let l = Loop { dev };
        let dio = must("losetup", &["--list", "--noheadings", "-O", "DIO", &l.dev]);
        assert_eq!(
            dio.trim(),
            if direct { "1" } else { "0" },
            "{}: direct I/O is not as asked",
            l.dev
        );
        l
    }

    /// Detach and wait until the device lets go of the file.
    fn detach(self) {
        drop(self)
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        quietly("losetup", &["-d", &self.dev]);
        let name = self.dev.trim_start_matches("/dev/");
        let backing = format!("/sys/block/{name}/loop/backing_file");
        let until = Instant::now() + Duration::from_secs(10);
        while Path::new(&backing).exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A file system mounted on a directory, unmounted when dropped.
struct Mounted {
    dir: PathBuf,
}

impl Mounted {
    fn new(dev: &str, dir: &Path) -> Mounted {
        std::fs::create_dir_all(dir).unwrap();
        must("mount", &[dev, dir.to_str().unwrap()]);
        Mounted {
            dir: dir.to_path_buf(),
        }
    }

    fn unmount(self) {
        must("umount", &[self.dir.to_str().unwrap()]);
        std::mem::forget(self);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let d = self.dir.to_str().unwrap();
        if !quietly("umount", &[d]) {
            quietly("umount", &["-l", d]);
        }
    }
}

fn sha256(path: &Path) -> String {
    must("sha256sum", &[path.to_str().unwrap()])
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Write files of odd sizes and random bytes into `dir`; their names and
/// SHA-256 sums.
fn write_files(dir: &Path, seed: u64) -> Vec<(PathBuf, String)> {
    [1usize, 4096, 100_003, 1 << 20, 3 << 20]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let p = dir.join(format!("f{i}"));
            std::fs::write(&p, pattern(len, seed + i as u64)).unwrap();
            let sum = sha256(&p);
            (p, sum)
        })
        .collect()
}

fn e2fsck_clean(dev: &str) {
    let o = run("e2fsck", &["-fn", dev], TOOL);
    assert_eq!(
        o.status.code(),
        Some(0),
        "e2fsck -fn {dev} found problems:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Attach, loop, mkfs.ext4, mount, write files; take it all down (the
/// FUSE mount by `detach`); attach again, check the file system and the
/// files.
fn ext4_round_trip(url: &str, direct: bool, detach: impl Fn(&mut Attached, Loop)) {
    require_fuse();
    let tmp = tempfile::tempdir().unwrap();
    let (dir, mnt) = (tmp.path().join("lun"), tmp.path().join("mnt"));
    std::fs::create_dir(&dir).unwrap();

    let mut att = Attached::start(url, &dir, &[]);
    let lp = Loop::on(&att.file, direct);
    must("mkfs.ext4", &["-q", &lp.dev]);
    let m = Mounted::new(&lp.dev, &mnt);
    let files = write_files(&mnt, if direct { 7 } else { 3 });
    m.unmount();
    e2fsck_clean(&lp.dev);
    detach(&mut att, lp);
    att.detached_cleanly();
    drop(att);

    let att = Attached::start(url, &dir, &[]);
    let lp = Loop::on(&att.file, direct);
    e2fsck_clean(&lp.dev);
    let m = Mounted::new(&lp.dev, &mnt);
    for (p, sum) in &files {
        assert_eq!(&sha256(p), sum, "{} changed across detach", p.display());
    }
    m.unmount();
    drop(lp);
    drop(att);
}

#[test]
fn ext4_on_a_buffered_loop_device_survives_detach_by_umount() {
    let server = Server::start(&["ram:96M"]);
    ext4_round_trip(&server.url(0), false, |att, lp| {
        lp.detach();
        must("umount", &[att.dir.to_str().unwrap()]);
    });
}

#[test]
fn ext4_on_a_direct_io_loop_device_survives_sigterm_while_the_loop_holds_the_file() {
    let server = Server::start(&["ram:96M"]);
    ext4_round_trip(&server.url(0), true, |att, lp| {
        // SIGTERM while the loop device still has the file open: attach
        // unmounts lazily and serves until the device lets go.
        send(att.child.id(), libc::SIGTERM);
        let until = Instant::now() + Duration::from_secs(20);
        while !att.text().contains("still open") && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(att.text().contains("still open"), "{}", att.text());
        assert!(
            matches!(att.child.try_wait(), Ok(None)),
            "attach quit while the loop device used it"
        );
        // The device still works.
        e2fsck_clean(&lp.dev);
        lp.detach();
    });
}

#[test]
fn ext4_over_aoe_through_the_attached_file() {
    require_fuse();
    require_tool("fusermount3");
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let args: Vec<String> = [
        "serve",
        "--target",
        IQN,
        "--listen",
        "127.0.0.1:0",
        "--lun",
        "ram:64M",
        "--aoe",
        &format!(
            "unix:{},peer={}",
            d.join("target.sock").display(),
            d.join("client.sock").display()
        ),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _server = Server::start_args(&args);
    let url = format!(
        "aoe+unix://0.0?local={}&peer={}",
        d.join("client.sock").display(),
        d.join("target.sock").display()
    );
    let (dir, mnt) = (d.join("lun"), d.join("mnt"));
    std::fs::create_dir(&dir).unwrap();

    let mut att = Attached::start(&url, &dir, &["--timeout", "20s"]);
    assert_eq!(
        att.file,
        dir.join("e0.0"),
        "AoE devices are named eSHELF.SLOT"
    );
    // Bytes at odd places, straight through the file.
    let data = pattern(300_001, 11);
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&att.file)
            .unwrap();
        f.write_all_at(&data, 40 << 20 | 77).unwrap();
        f.sync_all().unwrap();
        let mut back = vec![0; data.len()];
        f.read_exact_at(&mut back, 40 << 20 | 77).unwrap();
        assert!(back == data, "the bytes read back differ");
    }
    let lp = Loop::on(&att.file, false);
    must("mkfs.ext4", &["-q", &lp.dev]);
    let m = Mounted::new(&lp.dev, &mnt);
    let files = write_files(&mnt, 21);
    m.unmount();
    e2fsck_clean(&lp.dev);
    lp.detach();
    must("fusermount3", &["-u", dir.to_str().unwrap()]);
    att.detached_cleanly();
    drop(att);

    let att = Attached::start(&url, &dir, &["--timeout", "20s"]);
    let lp = Loop::on(&att.file, false);
    e2fsck_clean(&lp.dev);
    let m = Mounted::new(&lp.dev, &mnt);
    for (p, sum) in &files {
        assert_eq!(&sha256(p), sum, "{} changed across detach", p.display());
    }
    m.unmount();
    drop(lp);
    drop(att);
}

#[test]
fn the_file_is_the_luns_size_and_mode_takes_any_offset_and_refuses_to_grow() {
    require_fuse();
    let server = Server::start(&["ram:8M"]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lun");
    std::fs::create_dir(&dir).unwrap();
    let mut att = Attached::start(&server.url(0), &dir, &[]);
    assert_eq!(att.file, dir.join("lun0"));
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["lun0"]);
    let meta = std::fs::metadata(&att.file).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.len(), 8 << 20);
    assert_eq!(meta.mode() & 0o7777, 0o600);
    // SAFETY: getuid(2) cannot fail and touches no memory.
    assert_eq!(meta.uid(), unsafe { libc::getuid() });

    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&att.file)
        .unwrap();
    // Overlapping odd writes, then one read across them all.
    let mut model = vec![0u8; 64 << 10];
    for (i, (at, len)) in [
        (1, 1000),
        (513, 7),
        (4000, 20_000),
        (511, 2),
        (60_000, 5536),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(len, i as u64 + 100);
        f.write_all_at(&data, at as u64).unwrap();
        model[at..at + len].copy_from_slice(&data);
    }
    let mut back = vec![0; model.len()];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == model, "odd-offset writes did not read back");
    f.sync_all().unwrap();

    // The end: a read stops there, a write across it is cut short, one
    // past it fails, and the size never changes.
    let end = 8u64 << 20;
    let mut tail = vec![0; 100];
    assert_eq!(f.read_at(&mut tail, end - 10).unwrap(), 10);
    assert_eq!(f.read_at(&mut tail, end).unwrap(), 0);
    assert_eq!(f.write_at(&[9; 100], end - 30).unwrap(), 30);
    let e = f.write_at(&[9; 10], end).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    let e = f.set_len(0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    f.set_len(end).unwrap();
    assert_eq!(std::fs::metadata(&att.file).unwrap().len(), end);
    drop(f);

    // SIGINT with nothing open: flushed, unmounted, status 0.
    send(att.child.id(), libc::SIGINT);
    att.detached_cleanly();
    drop(att);

    // Read-only: mode 0400, no writes, the data still there.
    let att = Attached::start(&server.url(0), &dir, &["--read-only"]);
    let meta = std::fs::metadata(&att.file).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o400);
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(&att.file)
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let f = std::fs::File::open(&att.file).unwrap();
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == model, "the data changed across a detach");
    drop(f);
    drop(att);

    // --name and --mode.
    let att = Attached::start(
        &server.url(0),
        &dir,
        &["--name", "disk.img", "--mode", "0640"],
    );
    assert_eq!(att.file, dir.join("disk.img"));
    let meta = std::fs::metadata(&att.file).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o640);
}

/// `attach ARGS` that must fail at once: its one error line.
fn refused(args: &[&str]) -> String {
    let o = run(BIN, &[&["attach"], args].concat(), Duration::from_secs(60));
    error_line(&o, &format!("attach {args:?}"))
}

#[test]
fn mistakes_are_one_error_line_and_leave_nothing_mounted() {
    let server = Server::start(&["ram:1M"]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lun");
    std::fs::create_dir(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let url = server.url(0);

    let missing = tmp.path().join("nope");
    let l = refused(&[&url, missing.to_str().unwrap()]);
    assert!(l.contains("does not exist") && l.contains("mkdir"), "{l}");

    let file = tmp.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let l = refused(&[&url, file.to_str().unwrap()]);
    assert!(l.contains("is not a directory"), "{l}");

    let l = refused(&["http://user:hunter2secret@example/x", d]);
    assert!(
        l.contains("is not a LUN URL") && l.contains("iscsi://"),
        "{l}"
    );
    assert!(!l.contains("hunter2secret"), "a secret was echoed: {l}");

    let l = refused(&["iscsi://127.0.0.1", d]);
    assert!(l.contains("iscsi://"), "{l}");

    let wrong = format!("iscsi://{}/iqn.2026-11.org.ethersan:nosuch/0", server.addr);
    let l = refused(&[&wrong, d]);
    assert!(l.contains("login"), "{l}");

    let no_lun = format!("iscsi://{}/{IQN}/7", server.addr);
    let l = refused(&[&no_lun, d]);
    assert!(l.contains("no LUN 7"), "{l}");

    let l = refused(&[&url, d, "--name", "a/b"]);
    assert!(l.contains("--name"), "{l}");

    assert!(!is_mounted(&dir), "a failed attach left {d} mounted");

    // Its manual page comes from the same definitions.
    let man = ok(&ethersan(&["man", "attach"]));
    assert!(
        man.contains(".TH ethersan-attach 1") && man.contains("read\\-only"),
        "{man}"
    );
}

/// `attach --block` and `detach` mistakes: one error line each, before
/// any login. (The block device itself is tested in the kernel VM: this
/// host's kernel has no NBD driver.)
#[test]
fn block_device_mistakes_are_one_error_line() {
    let server = Server::start(&["ram:1M"]);
    let url = server.url(0);
    if !Path::new("/sys/module/nbd").exists() {
        let l = refused(&["--block", &url]);
        assert!(
            l.contains("no NBD driver")
                && l.contains("modprobe nbd")
                && l.contains("ethersan attach"),
            "{l}"
        );
    }
    let l = refused(&["--block", &url, "--connections", "0"]);
    assert!(
        l.contains("--connections 0") && l.contains("1 to 16"),
        "{l}"
    );
    // FUSE-only options and a directory do not go with --block.
    let o = run(
        BIN,
        &["attach", "--block", &url, "/mnt"],
        Duration::from_secs(60),
    );
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--block"),
        "{o:?}"
    );

    let detach = |args: &[&str]| {
        let o = run(BIN, &[&["detach"], args].concat(), Duration::from_secs(60));
        error_line(&o, &format!("detach {args:?}"))
    };
    let l = detach(&["/dev/null"]);
    assert!(l.contains("is not an NBD device"), "{l}");
    let l = detach(&["/dev/nbd4095"]);
    assert!(l.contains("/dev/nbd4095 is not connected"), "{l}");
}

#[test]
fn a_lun_that_goes_away_is_eio_with_a_log_line_naming_it() {
    require_fuse();
    let mut server = Server::start(&["ram:4M"]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lun");
    std::fs::create_dir(&dir).unwrap();
    let mut att = Attached::start(&server.url(0), &dir, &["--timeout", "5s"]);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&att.file)
        .unwrap();
    server.stop();
    // Past the page cache, so the read reaches the gone LUN.
    let mut buf = vec![0u8; 4096];
    let e = f.read_at(&mut buf, 8192).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    drop(f);
    // The line is written as the read fails; the reader thread takes it
    // soon after.
    let until = Instant::now() + Duration::from_secs(10);
    while !att.text().contains("answered EIO") && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = att.text();
    let lines: Vec<_> = log.lines().filter(|l| l.contains("answered EIO")).collect();
    assert!(!lines.is_empty(), "no log line for the failed read:\n{log}");
    for l in &lines {
        assert!(
            l.contains("LUN 0") && l.contains("read of 4096 bytes at byte 8192"),
            "{l}"
        );
        said_once(l);
    }
    // It still detaches: nothing was written, so nothing to flush.
    send(att.child.id(), libc::SIGTERM);
    att.detached_cleanly();
}

/// `fallocate ARGS FILE` must succeed.
fn fallocate(args: &[&str], file: &Path) {
    let mut a = args.to_vec();
    a.push(file.to_str().unwrap());
    must("fallocate", &a);
}

/// Bytes `[at, at + len)` of the LUN, read past the page cache.
fn read_direct(file: &Path, at: u64, len: usize) -> Vec<u8> {
    let o = run(
        "dd",
        &[
            &format!("if={}", file.display()),
            "bs=4096",
            &format!("skip={}", at / 4096),
            &format!("count={}", len / 4096),
            "iflag=direct",
            "status=none",
        ],
        TOOL,
    );
    assert!(
        o.status.success(),
        "dd: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

#[test]
fn zero_range_punch_hole_and_a_loop_devices_write_zeroes_and_discard_reach_the_lun() {
    require_fuse();
    require_tool("fallocate");
    require_tool("blkdiscard");
    require_tool("dd");
    let server = Server::start(&["ram:16M"]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lun");
    std::fs::create_dir(&dir).unwrap();
    let att = Attached::start(&server.url(0), &dir, &[]);
    let data = pattern(8 << 20, 77);
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&att.file)
            .unwrap();
        f.write_all_at(&data, 0).unwrap();
        f.sync_all().unwrap();
    }
    let mut model = data.clone();
    // On the file: fallocate's ZERO_RANGE and PUNCH_HOLE (odd edges too).
    fallocate(
        &["--zero-range", "--offset", "4096", "--length", "1M"],
        &att.file,
    );
    model[4096..4096 + (1 << 20)].fill(0);
    fallocate(
        &["--punch-hole", "--offset", "2M", "--length", "512K"],
        &att.file,
    );
    model[2 << 20..(2 << 20) + (512 << 10)].fill(0);
    fallocate(
        &["--zero-range", "--offset", "3000", "--length", "100"],
        &att.file,
    );
    model[3000..3100].fill(0);
    // Through a loop device: the kernel's WRITE ZEROES (blkdiscard -z)
    // and DISCARD arrive as fallocate on the file.
    let lp = Loop::on(&att.file, true);
    must("blkdiscard", &["-f", "-z", "-o", "4M", "-l", "1M", &lp.dev]);
    model[4 << 20..5 << 20].fill(0);
    must("blkdiscard", &["-f", "-o", "6M", "-l", "1M", &lp.dev]);
    model[6 << 20..7 << 20].fill(0);
    drop(lp);
    let back = read_direct(&att.file, 0, 8 << 20);
    assert_eq!(back.len(), model.len());
    if let Some(i) = (0..model.len()).find(|&i| back[i] != model[i]) {
        panic!("byte {i} of the LUN is {:#x}, not {:#x}", back[i], model[i]);
    }
    let text = att.text();
    assert!(!text.contains("answered EIO"), "{text}");
}
