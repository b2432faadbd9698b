//! Live changes on the target while ethersan's own client uses it: `ctl
//! lun add`, `ctl lun rm --force` of another LUN and `ctl lun resize` of
//! the LUN in use queue unit attentions (REPORTED LUNS DATA HAS CHANGED,
//! CAPACITY DATA HAS CHANGED) for every session; `cp --verify`, `bench`
//! and `attach` (ext4 on a loop device with direct I/O, files written
//! with `dd conv=fsync`) go on through them and lose nothing. And a write
//! the target really fails under `attach` is an fsync error, also on a
//! handle that did not make the write (the kernel's errseq rule).
//!
//! Needs root, /dev/fuse, losetup, mkfs.ext4, dd and sha256sum. Every
//! process, loop device and mount is taken down by a drop guard.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::{must_run, pattern, require_tool, run, IQN};

const BIN: &str = env!("CARGO_BIN_EXE_ethersan");
const TOOL: Duration = Duration::from_secs(120);

/// A server with LUN 0 (a 64 MiB file, resizable) and LUN 1 (RAM), and
/// its management socket.
struct Target {
    server: common::Server,
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Target {
    fn start() -> Target {
        let dir = tempfile::tempdir().unwrap();
        Target::start_in(dir, "64M")
    }

    /// LUN 0's file in `dir` (which may be a small tmpfs).
    fn start_in(dir: tempfile::TempDir, size: &str) -> Target {
        let sock = dir.path().join("api.sock");
        let lun0 = format!("{}:{size}", dir.path().join("lun0.img").display());
        let args: Vec<String> = [
            "serve",
            "--target",
            IQN,
            "--listen",
            "127.0.0.1:0",
            "--lun",
            &lun0,
            "--lun",
            "ram:8M",
            "--api-socket",
            sock.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let server = common::Server::start_args(&args);
        Target {
            server,
            sock,
            _dir: dir,
        }
    }

    fn change_everything(&self, pause: Duration) {
        change_everything(&self.sock, pause)
    }
}

fn ctl(sock: &Path, args: &[&str]) -> String {
    let o = Command::new(BIN)
        .arg("ctl")
        .arg("--socket")
        .arg(sock)
        .args(args)
        .output()
        .expect("run ethersan ctl");
    common::ok_out(&o, &format!("ethersan ctl {}", args.join(" ")))
}

/// The three live changes, `pause` apart: a LUN added (2), LUN 1 removed
/// with --force, LUN 0 grown to 96 MiB.
fn change_everything(sock: &Path, pause: Duration) {
    std::thread::sleep(pause);
    ctl(sock, &["lun", "add", IQN, "ram:4M", "--lun", "2"]);
    std::thread::sleep(pause);
    ctl(sock, &["lun", "rm", "--force", IQN, "1"]);
    std::thread::sleep(pause);
    ctl(sock, &["lun", "resize", IQN, "0", "96M"]);
    std::thread::sleep(pause);
}

/// `ethersan ARGS` running in the background, its output kept.
fn spawn(args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .env("ETHERSAN_LOG", "info")
        .env_remove("ETHERSAN_TIMEOUT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ethersan")
}

/// Wait for `child` at most `limit`.
fn finish(mut child: Child, limit: Duration) -> Output {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let o = child.wait_with_output().unwrap();
    panic!(
        "still running after {limit:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The client met the changes (so the test did test something) and said
/// so once per change, not once per command or per session.
fn told_once(log: &str) {
    let luns = log.matches("the target's LUNs changed").count();
    assert!(
        (1..=2).contains(&luns),
        "the LUN list change is logged {luns} times (once per change: LUN 2 added, LUN 1 removed):\n{log}"
    );
}

#[test]
fn cp_verify_goes_on_through_lun_add_rm_and_resize() {
    let t = Target::start();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src.img");
    std::fs::write(&src, pattern(32 << 20, 5)).unwrap();
    // Small commands one at a time: the copy takes long enough for all
    // three changes to land in the middle of it.
    let mut cp = spawn(&[
        "cp",
        "--verify",
        "--quiet",
        "--chunk",
        "4K",
        "--depth",
        "1",
        src.to_str().unwrap(),
        &t.server.url(0),
    ]);
    t.change_everything(Duration::from_millis(150));
    let ran_through = cp.try_wait().unwrap().is_none();
    let o = finish(cp, Duration::from_secs(120));
    let log = text(&o);
    assert!(o.status.success(), "cp failed:\n{log}");
    assert!(
        ran_through,
        "cp ended before the changes were all made: the test proves nothing"
    );
    told_once(&log);
    assert!(
        log.contains("capacity changed") && log.contains("100663296 bytes"),
        "no capacity change logged:\n{log}"
    );
    // What cp verified is on the LUN: read back by another cp.
    let back = tmp.path().join("back.img");
    let o = run(
        BIN,
        &[
            "cp",
            "--quiet",
            "--length",
            "32M",
            &t.server.url(0),
            back.to_str().unwrap(),
        ],
        TOOL,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        std::fs::read(&back).unwrap() == std::fs::read(&src).unwrap(),
        "the LUN does not hold what cp wrote"
    );
}

#[test]
fn bench_goes_on_through_lun_add_rm_and_resize() {
    let t = Target::start();
    let mut bench = spawn(&[
        "bench",
        &t.server.url(0),
        "--rw",
        "mixed",
        "--bs",
        "4K",
        "--qd",
        "4",
        "--sessions",
        "2",
        "--time",
        "3s",
    ]);
    t.change_everything(Duration::from_millis(300));
    let ran_through = bench.try_wait().unwrap().is_none();
    let o = finish(bench, Duration::from_secs(60));
    let log = text(&o);
    assert!(o.status.success(), "bench failed:\n{log}");
    assert!(ran_through, "bench ended before the changes were all made");
    // Two sessions, each told of each change: logged once all the same.
    told_once(&log);
}

/// Whether something is mounted on `dir`.
fn is_mounted(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let dir = dir.to_str().unwrap();
    info.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|m| m == dir))
}

fn quietly(cmd: &str, args: &[&str]) {
    let _ = Command::new("timeout")
        .args(["--kill-after=5", "60", cmd])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// `ethersan attach` running: stopped, and everything over it taken
/// down, when dropped (loop device and file system first).
struct Attached {
    child: Child,
    dir: PathBuf,
    file: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    /// Mounted on a loop device on the file: (mount point, device).
    over: Vec<(PathBuf, String)>,
}

impl Attached {
    fn start(url: &str, dir: &Path) -> Attached {
        require_tool("losetup");
        require_tool("mkfs.ext4");
        require_tool("dd");
        require_tool("sha256sum");
        assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing");
        let mut child = spawn(&["attach", url, dir.to_str().unwrap(), "--timeout", "20s"]);
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
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("attach did not attach: {:?}", log.lock().unwrap()));
        let path = line
            .rsplit(' ')
            .next()
            .unwrap_or_else(|| panic!("no file in {line:?}"));
        Attached {
            child,
            dir: dir.to_path_buf(),
            file: PathBuf::from(path.trim()),
            log,
            over: Vec::new(),
        }
    }

    fn text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// A loop device with direct I/O on the file, ext4 on it, mounted.
    fn ext4(&mut self, mnt: &Path) {
        let dev = must_run(
            "losetup",
            &[
                "--find",
                "--show",
                "--direct-io=on",
                self.file.to_str().unwrap(),
            ],
            TOOL,
        )
        .trim()
        .to_string();
        self.over.push((mnt.to_path_buf(), dev.clone()));
        must_run("mkfs.ext4", &["-q", "-E", "nodiscard", &dev], TOOL);
        std::fs::create_dir_all(mnt).unwrap();
        must_run("mount", &[&dev, mnt.to_str().unwrap()], TOOL);
    }

    /// Unmount the file system and detach the loop device.
    fn take_down(&mut self) {
        for (mnt, dev) in self.over.drain(..) {
            if is_mounted(&mnt) {
                quietly("umount", &[mnt.to_str().unwrap()]);
            }
            quietly("losetup", &["-d", &dev]);
            let name = dev.trim_start_matches("/dev/");
            let backing = format!("/sys/block/{name}/loop/backing_file");
            let until = Instant::now() + Duration::from_secs(10);
            while Path::new(&backing).exists() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.take_down();
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
            }
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

/// `dd if=SRC of=DST bs=1M conv=fsync`: its output, status included.
fn dd(src: &Path, dst: &Path) -> Output {
    run(
        "dd",
        &[
            &format!("if={}", src.display()),
            &format!("of={}", dst.display()),
            "bs=1M",
            "conv=fsync",
        ],
        TOOL,
    )
}

fn sha256(path: &Path) -> String {
    must_run("sha256sum", &[path.to_str().unwrap()], TOOL)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn ext4_on_attach_writes_every_file_through_lun_add_rm_and_resize() {
    let t = Target::start();
    let tmp = tempfile::tempdir().unwrap();
    let (dir, mnt) = (tmp.path().join("lun"), tmp.path().join("mnt"));
    std::fs::create_dir(&dir).unwrap();
    let mut att = Attached::start(&t.server.url(0), &dir);
    att.ext4(&mnt);

    // Files written with dd conv=fsync while the changes land.
    let sources: Vec<PathBuf> = (0..8u64)
        .map(|i| {
            let p = tmp.path().join(format!("src{i}"));
            std::fs::write(&p, pattern((3 << 20) + 4096 * i as usize + 17, 40 + i)).unwrap();
            p
        })
        .collect();
    let changes = {
        let sock = t.sock.clone();
        std::thread::spawn(move || change_everything(&sock, Duration::from_millis(200)))
    };
    let mut sums = Vec::new();
    for (i, src) in sources.iter().enumerate() {
        let dst = mnt.join(format!("f{i}"));
        let o = dd(src, &dst);
        assert!(
            o.status.success(),
            "dd conv=fsync of {} failed: {}\nattach said:\n{}",
            dst.display(),
            text(&o),
            att.text()
        );
        sums.push((dst, sha256(src)));
        std::thread::sleep(Duration::from_millis(100));
    }
    changes.join().unwrap();
    let log = att.text();
    assert!(!log.contains("answered EIO"), "attach failed I/O:\n{log}");
    told_once(&log);

    // Read back from the LUN, not from the page cache: the file system
    // unmounted and mounted again (its pages are gone), every sum equal.
    let dev = att.over[0].1.clone();
    must_run("umount", &[mnt.to_str().unwrap()], TOOL);
    let fsck = run("e2fsck", &["-fn", &dev], TOOL);
    assert_eq!(fsck.status.code(), Some(0), "e2fsck: {}", text(&fsck));
    must_run("mount", &[&dev, mnt.to_str().unwrap()], TOOL);
    for (dst, sum) in &sums {
        assert_eq!(
            &sha256(dst),
            sum,
            "{} does not hold what dd wrote",
            dst.display()
        );
    }
}

/// A tmpfs of `size` on `dir` for the guard's life.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        must_run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                dir.to_str().unwrap(),
            ],
            TOOL,
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        quietly("umount", &["-l", self.0.to_str().unwrap()]);
    }
}

#[test]
fn a_write_the_target_fails_under_attach_is_an_fsync_error_on_every_handle() {
    // LUN 0 is a 64 MiB sparse file on a 16 MiB tmpfs: writes past what
    // fits fail at the target (SPACE ALLOCATION FAILED).
    let tmp = tempfile::tempdir().unwrap();
    let fs_dir = tempfile::tempdir().unwrap();
    let _fs = Tmpfs::mount(fs_dir.path(), "16M");
    let target_dir = tempfile::tempdir_in(fs_dir.path()).unwrap();
    let t = Target::start_in(target_dir, "64M");
    let dir = tmp.path().join("lun");
    std::fs::create_dir(&dir).unwrap();
    let att = Attached::start(&t.server.url(0), &dir);

    // A handle that only watches, and one that writes with O_DIRECT (past
    // the page cache, so each write is a FUSE write that reaches the LUN).
    let watcher = std::fs::File::open(&att.file).unwrap();
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&att.file)
        .unwrap();
    let chunk = AlignedBuf::new(1 << 20, 7);
    let mut failed = None;
    for i in 0..64u64 {
        if let Err(e) = writer.write_at(chunk.bytes(), i << 20) {
            failed = Some((i, e));
            break;
        }
    }
    let (at, e) = failed.expect("64 MiB fitted on a 16 MiB tmpfs: no write failed");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "write at {at} MiB: {e}");
    // The watcher did not make the write, and is told at its fsync; then
    // once only. The writer is told at its own.
    let e = watcher
        .sync_all()
        .expect_err("fsync on another handle returned success after a failed write");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    watcher
        .sync_all()
        .expect("the same failure is told once per handle");
    let e = writer
        .sync_all()
        .expect_err("fsync on the writing handle returned success after a failed write");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // A handle opened now was not open at the failure: nothing to tell.
    let later = std::fs::File::open(&att.file).unwrap();
    later.sync_all().unwrap();
}

#[test]
fn dd_conv_fsync_on_ext4_over_attach_fails_when_the_target_fails_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let fs_dir = tempfile::tempdir().unwrap();
    let _fs = Tmpfs::mount(fs_dir.path(), "24M");
    let target_dir = tempfile::tempdir_in(fs_dir.path()).unwrap();
    let t = Target::start_in(target_dir, "64M");
    let (dir, mnt) = (tmp.path().join("lun"), tmp.path().join("mnt"));
    std::fs::create_dir(&dir).unwrap();
    let mut att = Attached::start(&t.server.url(0), &dir);
    att.ext4(&mnt);
    let src = tmp.path().join("big");
    std::fs::write(&src, pattern(40 << 20, 3)).unwrap();
    let o = dd(&src, &mnt.join("big"));
    assert!(
        !o.status.success(),
        "dd conv=fsync of 40 MiB exited 0 while the target had room for about 24 MiB:\n{}\nattach said:\n{}",
        text(&o),
        att.text()
    );
}

/// A buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize, seed: u64) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null());
        let data = pattern(len, seed);
        // SAFETY: `ptr` points to `len` writable bytes just allocated,
        // which `data` does not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, len) };
        AlignedBuf { ptr, len }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised bytes for as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).unwrap();
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}
