//! Who serves /dev/nbdN: each `attach --block` holds an exclusive `flock`
//! on /run/ethersan/nbdN.lock for as long as it serves the device (the
//! kernel releases it when the process ends, however it ends), and writes
//! its pid next to it for messages. A connected device whose lock nobody
//! holds was left behind by an attach that died, and may be taken over;
//! `detach` waits for the lock to be let go.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use anyhow::bail;

/// Where the lock and pid files live.
const RUN_DIR: &str = "/run/ethersan";

/// The lock an attach holds on the device it serves (released when
/// dropped or when the process ends).
#[derive(Debug)]
pub(crate) struct ServerLock {
    _file: File,
    pid_file: String,
}

impl Drop for ServerLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

fn lock_path(index: u32) -> String {
    format!("{RUN_DIR}/nbd{index}.lock")
}

fn pid_path(index: u32) -> String {
    format!("{RUN_DIR}/nbd{index}.pid")
}

/// `flock(LOCK_EX | LOCK_NB)`: true when taken.
fn try_lock(f: &File) -> bool {
    // SAFETY: flock(2) on a descriptor `f` owns and keeps open for the
    // call; it touches no memory.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Take the lock of /dev/nbd`index` for this process: `Ok(None)` when the
/// run directory cannot be written (no lock: `detach` then cannot wait
/// for this process, and a takeover cannot tell it is alive), an error
/// when another process holds it.
pub(crate) fn lock(index: u32) -> anyhow::Result<Option<ServerLock>> {
    let opened = std::fs::create_dir_all(RUN_DIR).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_path(index))
    });
    let Ok(file) = opened else {
        return Ok(None);
    };
    if !try_lock(&file) {
        bail!(
            "/dev/nbd{index} is served by {}: detach it first (ethersan detach /dev/nbd{index}) or leave out --index",
            holder(index)
        );
    }
    let pid_file = pid_path(index);
    let _ = std::fs::write(&pid_file, std::process::id().to_string());
    Ok(Some(ServerLock {
        _file: file,
        pid_file,
    }))
}

/// "process N" from the pid file, or "another attach".
fn holder(index: u32) -> String {
    std::fs::read_to_string(pid_path(index))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        .map_or_else(|| "another attach".to_string(), |p| format!("process {p}"))
}

/// Whether an attach holds /dev/nbd`index`'s lock now (`None`: there is
/// no lock file to tell).
pub(crate) fn held(index: u32) -> Option<bool> {
    let file = File::open(lock_path(index)).ok()?;
    Some(!try_lock(&file))
}

/// Whether the kernel has /dev/nbd`index` connected.
pub(crate) fn connected(index: u32) -> bool {
    Path::new(&format!("/sys/block/nbd{index}/pid")).exists()
}

/// Wait up to `wait` for the attach serving /dev/nbd`index` to end
/// (its lock let go; without a lock file, the process the kernel names
/// gone): false if it is still there.
pub(crate) async fn wait_ended(index: u32, wait: Duration) -> bool {
    let kernel_pid: Option<u32> = std::fs::read_to_string(format!("/sys/block/nbd{index}/pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok());
    let ended = || match held(index) {
        Some(h) => !h,
        None => kernel_pid.is_none_or(|p| !Path::new(&format!("/proc/{p}")).exists()),
    };
    tokio::time::timeout(wait, async {
        while !ended() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .is_ok()
}

/// A connected device whose server is gone.
#[derive(Debug)]
pub(crate) struct LeftBehind {
    pub index: u32,
    /// Its connections (one kernel queue each).
    pub connections: usize,
    pub size: u64,
    pub block_size: u64,
    pub read_only: bool,
    /// What it was connected with (/sys/block/nbdN/backend), where the
    /// kernel keeps it.
    pub backend: Option<String>,
}

/// /dev/nbd`index` as the kernel has it, if it is connected: to be taken
/// over once this process holds its lock (so nobody else serves it).
pub(crate) fn left_behind(index: u32) -> Option<LeftBehind> {
    if !connected(index) {
        return None;
    }
    let sys = format!("/sys/block/nbd{index}");
    let number = |f: &str| -> u64 {
        std::fs::read_to_string(format!("{sys}/{f}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let connections = std::fs::read_dir(format!("{sys}/mq"))
        .map(|d| d.count())
        .unwrap_or(1)
        .max(1);
    let backend = std::fs::read_to_string(format!("{sys}/backend"))
        .ok()
        .map(|b| b.trim_end_matches('\n').to_string())
        .filter(|b| !b.is_empty());
    Some(LeftBehind {
        index,
        connections,
        size: number("size") * 512,
        block_size: number("queue/logical_block_size"),
        read_only: number("ro") == 1,
        backend,
    })
}
