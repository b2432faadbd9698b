//! `ethersan attach --block URL`: a LUN as a kernel block device
//! (/dev/nbdN) through the kernel's NBD driver, configured over its
//! generic netlink interface. This process is the device's server: each
//! connection is one end of a socket pair whose other end the kernel
//! holds (one hardware queue each), served by
//! [`ethersan_client::nbd::serve`] against its own session to the LUN.
//!
//! A lost target is waited for inside this process: each transport
//! reconnects for up to `--reconnect-timeout` (a new login, a new native
//! channel; AoE retransmits) and the requests in flight go on on the new
//! session, so the kernel sees a slow request, not an error. The kernel's
//! own request timeout is longer than this process can take to answer
//! (it would tear down a live socket pair): what it does is requeue the
//! requests a killed attach left unanswered, for the attach that takes
//! the device over (`--index N` of a device whose server is gone: NBD's
//! RECONFIGURE with new sockets, within the dead-connection timeout).
//!
//! `ethersan detach /dev/nbdN`, SIGTERM and SIGINT end it the same way:
//! the device's page cache written back, the kernel told to disconnect
//! (it ends each connection with NBD_CMD_DISC once what it sent is
//! answered), the LUN's cache flushed, each session logged out.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;
use tokio::signal::unix::{signal, SignalKind};

use ethersan_client::nbd::netlink::{Connect, Nbd, CFLAG_DESTROY_ON_DISCONNECT};
use ethersan_client::nbd::{self, transmission_flags};
use ethersan_client::{BlockTarget, ConnectArgs, OpenOptions};
use ethersan_nbd::Device;

use super::served;

/// Requests each connection runs at once.
const DEPTH: usize = 64;

/// How long the end waits for the kernel to close the connections after
/// DISCONNECT before it stops serving them anyway.
const DISCONNECT_WAIT: Duration = Duration::from_secs(30);

/// What `attach --block` was asked for.
#[derive(Debug)]
pub(crate) struct BlockRequest<'a> {
    pub url: &'a str,
    pub connect: &'a ConnectArgs,
    pub connections: usize,
    pub reconnect: Duration,
    pub index: Option<u32>,
    pub read_only: bool,
    pub json: bool,
}

/// What `attach --block --json` prints once the device is there.
#[derive(Debug, Serialize)]
struct Attached {
    device: String,
    index: u32,
    lun: String,
    size: u64,
    block_size: u64,
    read_only: bool,
    connections: usize,
    reconnect_timeout_s: u64,
    flush: bool,
    fua: bool,
    trim: bool,
}

/// `ethersan attach --block`.
pub(crate) async fn cmd_attach_block(r: BlockRequest<'_>) -> anyhow::Result<()> {
    if r.connections == 0 || r.connections > 16 {
        bail!(
            "--connections {}: give 1 to 16 (one session and one kernel queue each)",
            r.connections
        );
    }
    if r.connect.timeout.0.is_none() && r.connections > 1 {
        bail!("--timeout 0 (wait forever) needs --connections 1: with several connections the kernel's block layer ends a connection whose request takes longer than 30 s");
    }
    // Before any login: no driver, no point.
    let nl = Nbd::open()?;
    // With --index: this process's lock on the device first (so no other
    // attach serves it), then a device another attach left behind (killed,
    // crashed) is taken over with as many connections as it had.
    let (mut lock, takeover) = match r.index {
        Some(i) => {
            let lock = served::lock(i)?;
            let left = served::left_behind(i);
            if left.is_some() && lock.is_none() {
                bail!("/dev/nbd{i} is connected and /run/ethersan cannot be written, so whether its server is alive cannot be told: detach it first (ethersan detach /dev/nbd{i})");
            }
            (lock, left)
        }
        None => (None, None),
    };
    let opts = OpenOptions {
        program: "ethersan attach",
        retry: true,
        reconnect: Some(r.reconnect),
    };
    let first: Arc<dyn BlockTarget> =
        Arc::from(ethersan_client::open(r.url, r.connect, &opts).await?);
    let caps = first.capabilities();
    let mut targets = vec![first.clone()];
    // The kernel makes one hardware queue per connection, at most one per
    // CPU, and sends each request on its queue's connection: sessions
    // beyond the CPUs would carry nothing.
    let cpus = possible_cpus();
    let n = if let Some(t) = &takeover {
        t.connections
    } else if caps.sessions {
        if r.connections > cpus {
            note!(
                "ethersan attach: {} CPU{}: using {cpus} connection{}, not {} (the kernel makes at most one queue per CPU)",
                cpus,
                if cpus == 1 { "" } else { "s" },
                if cpus == 1 { "" } else { "s" },
                r.connections
            );
        }
        r.connections.min(cpus)
    } else {
        if r.connections > 1 {
            note!(
                "ethersan attach: {} has one session only: using 1 connection, not {}",
                first.name(),
                r.connections
            );
        }
        1
    };
    for _ in 1..n {
        match first.another_session().await {
            Ok(t) => targets.push(Arc::from(t)),
            Err(e) => {
                close_all(&targets).await;
                return Err(e.context("opening another session for --connections"));
            }
        }
    }
    let result = attach(&r, &nl, &targets, takeover, &mut lock).await;
    close_all(&targets).await;
    // Let go only now: `detach` waits for the lock, and the sessions are
    // logged out.
    drop(lock);
    result
}

/// The CPUs the kernel counts for block queues (`nr_cpu_ids`: the
/// possible ones, /sys/devices/system/cpu/possible, e.g. "0-3").
fn possible_cpus() -> usize {
    let listed = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            let last = s.trim().rsplit([',', '-']).next()?.parse::<usize>().ok()?;
            Some(last + 1)
        });
    listed.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Every session ends (a logout where the transport has one).
async fn close_all(targets: &[Arc<dyn BlockTarget>]) {
    for t in targets {
        t.close().await;
    }
}

/// Connect the device, serve it until detached or signalled, flush.
async fn attach(
    r: &BlockRequest<'_>,
    nl: &Nbd,
    targets: &[Arc<dyn BlockTarget>],
    takeover: Option<served::LeftBehind>,
    lock: &mut Option<served::ServerLock>,
) -> anyhow::Result<()> {
    // Signals from before the device exists: none may end this process
    // with the device connected and nobody serving it.
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let lun = &targets[0];
    let backend = backend_name(r.url, &lun.name());
    if let Some(t) = &takeover {
        if t.backend.as_deref().is_some_and(|b| b != backend) {
            bail!(
                "/dev/nbd{} served {:?}, not {backend:?}: give the URL it was attached with (or detach it first: ethersan detach --force /dev/nbd{})",
                t.index,
                t.backend.as_deref().unwrap_or_default(),
                t.index
            );
        }
        if t.block_size != lun.block_size() || t.read_only != r.read_only {
            bail!(
                "/dev/nbd{} has {}-byte blocks{} and this attach would give {}-byte blocks{}: attach with the settings it had",
                t.index,
                t.block_size,
                if t.read_only { ", read-only," } else { "" },
                lun.block_size(),
                if r.read_only { ", read-only," } else { "" }
            );
        }
        if t.size != lun.capacity() {
            bail!(
                "/dev/nbd{} has {} bytes and {} has {}: not the LUN it served (detach it first: ethersan detach --force /dev/nbd{})",
                t.index,
                t.size,
                lun.name(),
                lun.capacity(),
                t.index
            );
        }
    }
    let block_size = lun.block_size();
    let dev = Device {
        size: lun.capacity(),
        block_size: u32::try_from(block_size).context("block size")?,
        read_only: r.read_only,
    };
    if !(512..=4096).contains(&block_size) || !block_size.is_power_of_two() {
        bail!(
            "{} has {block_size}-byte blocks; the kernel's NBD driver takes 512 to 4096",
            lun.name()
        );
    }
    let caps = lun.capabilities();
    let flags = transmission_flags(caps, r.read_only);
    // One socket pair per connection: the kernel gets one end (it takes
    // its own reference), this process serves the other.
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for _ in targets {
        let (a, b) = std::os::unix::net::UnixStream::pair().context("socketpair")?;
        a.set_nonblocking(true).context("socketpair")?;
        ours.push(a);
        theirs.push(b);
    }
    let connect = Connect {
        index: r.index,
        size: dev.size,
        block_size,
        server_flags: flags,
        client_flags: CFLAG_DESTROY_ON_DISCONNECT,
        timeout: kernel_timeout(r.reconnect, r.connect.timeout.0),
        dead_conn_timeout: r.reconnect,
        backend: Some(backend),
        sockets: theirs.iter().map(|s| s.as_raw_fd()).collect(),
    };
    // The kernel starts sending as soon as it is connected: serve first.
    let mut serving = tokio::task::JoinSet::new();
    for (t, s) in targets.iter().zip(ours) {
        let s = tokio::net::UnixStream::from_std(s).context("socketpair")?;
        serving.spawn(nbd::serve(t.clone(), s, dev, DEPTH));
    }
    let connected = match &takeover {
        Some(t) => nl.reconfigure(t.index, &connect).map(|()| t.index),
        None => nl.connect(&connect),
    };
    let index = match connected {
        Ok(i) => i,
        Err(e) => {
            serving.abort_all();
            return Err(e.into());
        }
    };
    drop(theirs);
    let device = format!("/dev/nbd{index}");
    // Who serves the device now (the kernel's pid attribute keeps naming
    // the process that connected it).
    if lock.is_none() {
        *lock = served::lock(index).unwrap_or(None);
        if lock.is_none() {
            say(&format!("ethersan attach: cannot lock /run/ethersan/nbd{index}.lock: `ethersan detach` will not wait for this process"));
        }
    }
    if takeover.is_some() {
        say(&format!("ethersan attach: took over {device} from the attach that left it: its requests go on on this one's connections"));
    }
    let shown = Attached {
        device: device.clone(),
        index,
        lun: lun.name(),
        size: dev.size,
        block_size,
        read_only: r.read_only,
        connections: targets.len(),
        reconnect_timeout_s: r.reconnect.as_secs(),
        flush: true,
        fua: flags & ethersan_nbd::flags::SEND_FUA != 0,
        trim: flags & ethersan_nbd::flags::SEND_TRIM != 0,
    };
    {
        // Standard output may be gone: the device is served anyway.
        use std::io::Write;
        let line = if r.json {
            serde_json::to_string(&shown)?
        } else {
            device.clone()
        };
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{line}").and_then(|()| o.flush());
    }
    if !r.json {
        say(&format!(
            "ethersan attach: {} ({} bytes, {block_size}-byte blocks{}) is {device}, {} connection{}; stop with ethersan detach {device} (or SIGTERM)",
            shown.lun,
            shown.size,
            if r.read_only { ", read-only" } else { "" },
            shown.connections,
            if shown.connections == 1 { "" } else { "s" }
        ));
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);

    let mut failures = Vec::new();
    // Requests each connection answered, in the order they ended.
    let mut answered = Vec::new();
    // A connection ends when the kernel disconnects: it shutting a socket
    // down under replies still being written is that end, not a failure.
    let mut record = |r: Option<Result<Result<nbd::Served, nbd::ServeError>, _>>| match r {
        Some(Ok(Ok(s))) => answered.push(s.requests),
        Some(Ok(Err(nbd::ServeError::Io(e))))
            if matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) => {}
        Some(Ok(Err(e))) => failures.push(e.to_string()),
        _ => {}
    };
    let mut warned = false;
    let signalled = loop {
        tokio::select! {
            // The kernel disconnected (ethersan detach, nbd-client -d) or a
            // connection failed.
            first = serving.join_next() => {
                record(first);
                break false;
            }
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = hup.recv() => {
                say("ethersan attach: SIGHUP ignored: this process serves the device until ethersan detach, SIGTERM or SIGINT");
                continue;
            }
        }
        // A stop signal: not under a mounted file system, unless repeated.
        if !warned {
            if let Some(why) = in_use(index) {
                say(&format!("ethersan attach: not stopping: {why} (a second signal stops anyway, and its users get I/O errors)"));
                warned = true;
                continue;
            }
        }
        break true;
    };
    if signalled {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
        say(&format!(
            "ethersan attach: stopping: writing back {device}'s cache and disconnecting"
        ));
        if let Err(e) = sync_device(&device).await {
            say(&format!("ethersan attach: {device}: {e:#}"));
        }
    }
    // Idempotent: the kernel may already have disconnected.
    let _ = nl.disconnect(index);
    let drained = tokio::time::timeout(DISCONNECT_WAIT, async {
        while let Some(r) = serving.join_next().await {
            record(Some(r));
        }
    })
    .await;
    if drained.is_err() {
        serving.abort_all();
        say(&format!(
            "ethersan attach: the kernel kept {device}'s connections open; stopped serving them"
        ));
    }
    // Every session at once: a lost target costs one reconnect window, not
    // one per connection.
    let flushes = futures::future::join_all(targets.iter().map(|t| t.flush())).await;
    if let Some(e) = flushes.into_iter().find_map(Result::err) {
        return Err(e.context(format!("{}: final cache flush", lun.name())));
    }
    if !failures.is_empty() && !signalled {
        bail!("{device} stopped: {}", failures.join("; "));
    }
    answered.sort_unstable();
    say(&format!(
        "ethersan attach: detached {device} ({} flushed{}; requests answered per connection: {})",
        lun.name(),
        if caps.logout { ", logging out" } else { "" },
        answered
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(())
}

/// The kernel's per-request timeout: longer than this process can take
/// to answer (a command's `timeout` and the reconnect window, twice: a
/// request may wait behind others through one loss and meet a second), so
/// that it never tears down a live connection; what it still does is
/// requeue, after that long, the requests a dead server (a killed attach)
/// left unanswered, for the attach that takes the device over. `None` (no
/// command timeout): zero, which with one connection means the kernel
/// never times out (with several, the block layer's 30 s still applies:
/// refused before this).
fn kernel_timeout(reconnect: Duration, command: Option<Duration>) -> Duration {
    match command {
        Some(c) => 2 * (reconnect + c) + Duration::from_secs(10),
        None => Duration::ZERO,
    }
}

/// A line on standard error, its failure ignored: once the device is
/// connected this process must go on serving it (and end it cleanly) even
/// when nobody reads its messages any more.
fn say(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{msg}");
}

/// What /sys/block/nbdN/backend says: the URL without credentials or
/// query, and the LUN.
fn backend_name(url: &str, lun: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let rest = rest.split('?').next().unwrap_or(rest);
    format!("ethersan {scheme}://{rest} ({lun})")
}

/// Write back the device's page cache and have the kernel send a FLUSH
/// (fsync of the block device), on a blocking thread: the requests it
/// makes are served by this process's runtime meanwhile.
async fn sync_device(device: &str) -> anyhow::Result<()> {
    let path = PathBuf::from(device);
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        f.sync_all()
            .with_context(|| format!("write back {}", path.display()))
    })
    .await?
}

/// The index N of `/dev/nbdN` (or `nbdN`, or a link to one).
fn nbd_index(device: &Path) -> anyhow::Result<u32> {
    let real = std::fs::canonicalize(device).unwrap_or_else(|_| device.to_path_buf());
    let name = real
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    name.strip_prefix("nbd")
        .and_then(|n| n.parse().ok())
        .with_context(|| {
            format!(
                "{} is not an NBD device: give /dev/nbdN as attach --block printed it",
                device.display()
            )
        })
}

/// Why `detach` will not disconnect a device: mounted, or held (by a
/// device-mapper map, a RAID, a swap).
fn in_use(index: u32) -> Option<String> {
    let dev = format!("/dev/nbd{index}");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if let Some(m) = mounts
        .lines()
        .find(|l| l.split(' ').next() == Some(dev.as_str()) || l.starts_with(&format!("{dev}p")))
    {
        let on = m.split(' ').nth(1).unwrap_or("?");
        return Some(format!("{dev} is mounted on {on}: unmount it first"));
    }
    let holders = format!("/sys/block/nbd{index}/holders");
    if let Ok(mut d) = std::fs::read_dir(&holders) {
        if let Some(Ok(h)) = d.next() {
            return Some(format!(
                "{dev} is held by {}: remove that first (dmsetup remove, mdadm --stop, swapoff)",
                h.file_name().to_string_lossy()
            ));
        }
    }
    None
}

/// `ethersan detach /dev/nbdN`: write the device's cache back, tell the
/// kernel to disconnect it, and wait (up to `wait`) for the `attach` that
/// serves it to flush the LUN, log out and exit.
pub(crate) async fn cmd_detach(device: &Path, force: bool, wait: Duration) -> anyhow::Result<()> {
    let index = nbd_index(device)?;
    let dev = format!("/dev/nbd{index}");
    if !served::connected(index) {
        bail!("{dev} is not connected (no server behind it): nothing to detach");
    }
    if !force {
        if let Some(why) = in_use(index) {
            bail!("{why} (or --force: its users get I/O errors)");
        }
    }
    let nl = Nbd::open()?;
    // Written back only while a server answers: a device whose attach
    // died would hold the write-back for the kernel's timeouts.
    if served::held(index) != Some(false) {
        if let Err(e) = sync_device(&dev).await {
            note!("ethersan detach: {e:#}; disconnecting anyway");
        }
    }
    nl.disconnect(index)?;
    if !served::wait_ended(index, wait).await {
        bail!(
            "{dev} is disconnected, but its attach is still running after {:.0} s",
            wait.as_secs_f64()
        );
    }
    note!("ethersan detach: {dev} detached");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_name_has_no_secret() {
        assert_eq!(
            backend_name("iscsi://u%s3cret@10.0.2.2:3260/iqn.x:y/0?x=1", "LUN 0"),
            "ethersan iscsi://10.0.2.2:3260/iqn.x:y/0 (LUN 0)"
        );
        assert_eq!(
            backend_name("aoe://eth1/0.1", "e0.1"),
            "ethersan aoe://eth1/0.1 (e0.1)"
        );
    }

    #[test]
    fn the_kernel_waits_longer_than_a_command_can_take() {
        let s = Duration::from_secs;
        assert_eq!(kernel_timeout(s(120), Some(s(30))), s(310));
        assert_eq!(kernel_timeout(s(5), Some(s(5))), s(30));
        assert_eq!(kernel_timeout(s(5), None), Duration::ZERO);
    }

    #[test]
    fn device_indexes() {
        assert_eq!(nbd_index(Path::new("/dev/nbd3")).unwrap(), 3);
        assert_eq!(nbd_index(Path::new("nbd12")).unwrap(), 12);
        let e = nbd_index(Path::new("/dev/sda")).unwrap_err().to_string();
        assert!(e.contains("not an NBD device"), "{e}");
    }
}
