//! The client's reconnect window (`OpenOptions::reconnect`, what `attach
//! --block` gives `RetryingLun::within`) against a real `ethersan serve`
//! killed with SIGKILL and started again on the same port and data file:
//! commands in flight when the target dies finish once it is back within
//! the window (over iSCSI and over the native transport's udp://), and
//! their data is there; past the window commands fail, then fail fast
//! while the target stays down, and work again once it is back.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use ethersan_client::{BlockTarget, ConnectArgs, OpenOptions, Timeout};

const GROUP: &str = "lab";
const SECRET: &str = "correct horse battery staple";

/// Concurrent writers, each with its own region of `SLOTS` chunks.
const WRITERS: u64 = 8;
const SLOTS: u64 = 64;
const CHUNK: usize = 64 << 10;

/// A target on a fixed port and data file, started again at will.
struct Target {
    dir: tempfile::TempDir,
    img: PathBuf,
    port: u16,
    /// The native transport (udp://) instead of iSCSI over TCP.
    udp: bool,
}

impl Target {
    fn new(udp: bool) -> Target {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("lun.img");
        let port = if udp { free_udp_port() } else { free_port() };
        Target {
            dir,
            img,
            port,
            udp,
        }
    }

    /// `ethersan serve` on the port and file (blocks until it listens).
    fn start(&self) -> Server {
        let lun = format!("{}:64M", path_str(&self.img));
        if self.udp {
            return Server::start_udp(self.dir.path(), self.port, (GROUP, SECRET), &[lun], &[]);
        }
        let listen = format!("127.0.0.1:{}", self.port);
        let args = ["serve", "--target", IQN, "--listen", &listen, "--lun", &lun];
        Server::start_args(&args.map(String::from))
    }

    /// [`Target::start`] off the runtime's threads.
    async fn start_again(self: &Arc<Self>) -> Server {
        let t = self.clone();
        tokio::task::spawn_blocking(move || t.start())
            .await
            .unwrap()
    }

    fn url(&self) -> String {
        let scheme = if self.udp { "udp" } else { "iscsi" };
        format!("{scheme}://127.0.0.1:{}/{IQN}/0", self.port)
    }

    fn how(&self) -> ConnectArgs {
        let mut how = ConnectArgs {
            // Each command, connection and login: a lost UDP peer is
            // noticed by this timeout (TCP's by the connection's end).
            timeout: Timeout(Some(Duration::from_secs(3))),
            ..Default::default()
        };
        if self.udp {
            how.group = Some(GROUP.into());
            how.group_secret_file = Some(secret_file(self.dir.path(), SECRET));
        }
        how
    }

    /// Open the LUN with a reconnect window (`None`: no retries at all).
    async fn open(&self, window: Option<Duration>) -> Box<dyn BlockTarget> {
        let opts = OpenOptions {
            program: "reconnect-test",
            retry: window.is_some(),
            reconnect: window,
        };
        ethersan_client::open(&self.url(), &self.how(), &opts)
            .await
            .expect("open the LUN")
    }
}

/// SIGKILL and reap.
fn kill_9(server: &mut Server) {
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

/// What the target says, kept.
fn capture(t: &dyn BlockTarget) -> Arc<Mutex<Vec<String>>> {
    let said: Arc<Mutex<Vec<String>>> = Arc::default();
    let s = said.clone();
    t.set_say(Arc::new(move |line: &str| {
        println!("said: {line}");
        s.lock().unwrap().push(line.to_string());
    }));
    said
}

/// The bytes writer `w` writes in round `round`.
fn chunk(w: u64, round: u64) -> Vec<u8> {
    pattern(CHUNK, (w << 32) | round)
}

/// Wait (at most 30 s) until `acked` reaches `n`.
async fn acked_at_least(acked: &AtomicU64, n: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked.load(Ordering::Relaxed) < n {
        assert!(
            Instant::now() < deadline,
            "{what}: {} writes acknowledged, not {n}",
            acked.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Writers run without pause (so that commands are in flight when the
/// target is killed); the target is killed, started again `down` later on
/// the same port and file, and every write must succeed; a flush too.
/// Then each chunk's last acknowledged round must be on the LUN, read by
/// a fresh session, and in the file.
async fn writes_survive_a_restart(target: Target, down: Duration) {
    let target = Arc::new(target);
    let mut server = target.start();
    let t: Arc<dyn BlockTarget> = target.open(Some(Duration::from_secs(20))).await.into();
    let said = capture(&*t);
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (t, acked, stop) = (t.clone(), acked.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            // The last acknowledged round of each slot.
            let mut last = vec![None; SLOTS as usize];
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                let slot = round % SLOTS;
                let at = (w * SLOTS + slot) * CHUNK as u64;
                let started = Instant::now();
                t.write(at, Bytes::from(chunk(w, round)), round % 4 == 0)
                    .await
                    .map_err(|e| {
                        format!(
                            "writer {w} round {round} failed after {:?}: {e:#}",
                            started.elapsed()
                        )
                    })?;
                last[slot as usize] = Some(round);
                acked.fetch_add(1, Ordering::Relaxed);
                round += 1;
            }
            Ok::<_, String>(last)
        }));
    }
    acked_at_least(&acked, 100, "before the kill").await;
    kill_9(&mut server);
    let at_kill = acked.load(Ordering::Relaxed);
    tokio::time::sleep(down).await;
    // Nothing can be acknowledged while the target is down (a reply that
    // was on its way when it died at most, one per writer).
    let while_down = acked.load(Ordering::Relaxed) - at_kill;
    assert!(
        while_down <= WRITERS,
        "{while_down} writes acknowledged by a dead target"
    );
    assert!(
        writers.iter().all(|w| !w.is_finished()),
        "a writer ended while the target was down"
    );
    let restarted = Instant::now();
    let mut server = target.start_again().await;
    let again = acked.load(Ordering::Relaxed);
    acked_at_least(&acked, again + 100, "after the restart").await;
    println!(
        "{at_kill} writes before the kill, {} more after the restart (within {:?} of starting it)",
        acked.load(Ordering::Relaxed) - again,
        restarted.elapsed()
    );
    stop.store(true, Ordering::Relaxed);
    let mut expected = vec![0u8; (WRITERS * SLOTS) as usize * CHUNK];
    for (w, h) in writers.into_iter().enumerate() {
        let last = h.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
        for (slot, round) in last.iter().enumerate() {
            if let Some(r) = round {
                let at = (w * SLOTS as usize + slot) * CHUNK;
                expected[at..at + CHUNK].copy_from_slice(&chunk(w as u64, *r));
            }
        }
    }
    t.flush().await.expect("flush after the restart");
    let (retried, sessions) = t.retries();
    println!("{retried} commands retried on {sessions} new sessions");
    assert!(
        retried >= 1 && sessions >= 1,
        "no retry on a new session: ({retried}, {sessions})"
    );
    let said = said.lock().unwrap().join("\n");
    assert!(
        said.contains("logging in again (for up to") && said.contains("logged in again"),
        "the session's replacement was not said:\n{said}"
    );
    t.close().await;
    // A fresh session, no retries, reads it all back.
    let fresh = target.open(None).await;
    for (i, want) in expected.chunks(1 << 20).enumerate() {
        let got = fresh
            .read(i as u64 * (1 << 20), 1 << 20, Vec::new())
            .await
            .expect("read on a fresh session");
        assert!(got == want, "MiB {i} differs on a fresh session");
    }
    fresh.close().await;
    assert!(server.stop().is_some_and(|s| s.success()));
    let file = std::fs::read(&target.img).unwrap();
    assert!(file[..expected.len()] == expected[..], "the file differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_restarted_within_the_window_finishes_the_commands_in_flight() {
    tokio::time::timeout(
        Duration::from_secs(60),
        writes_survive_a_restart(Target::new(false), Duration::from_secs(2)),
    )
    .await
    .expect("within 60 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_udp_a_target_restarted_within_the_window_finishes_the_commands_in_flight() {
    tokio::time::timeout(
        Duration::from_secs(60),
        writes_survive_a_restart(Target::new(true), Duration::from_secs(5)),
    )
    .await
    .expect("within 60 s");
}

/// A read and how long it took.
async fn timed_read(t: &dyn BlockTarget) -> (anyhow::Result<Vec<u8>>, Duration) {
    let started = Instant::now();
    let r = t.read(0, 4096, Vec::new()).await;
    (r, started.elapsed())
}

/// A command that failed past the window names the lost session, the
/// failed login and why it failed: the target's address refused it.
fn says_why(e: &anyhow::Error) {
    let text = format!("{e:#}");
    assert!(
        text.contains("connection closed")
            && text.contains("logging in again failed")
            && text.contains("cannot reach 127.0.0.1:")
            && text.contains("Connection refused"),
        "{text}"
    );
}

/// Window 2 s, the target killed and not started again: a read fails
/// after the window (and says why); the next commands fail at once while
/// the target is down; once it is back (and a second has passed) a read
/// works; and the target killed again, the full window applies again.
async fn commands_past_the_window() {
    let window = Duration::from_secs(2);
    let target = Arc::new(Target::new(false));
    let mut server = target.start();
    let t = target.open(Some(window)).await;
    let said = capture(&*t);
    let data = pattern(4096, 7);
    t.write(0, Bytes::from(data.clone()), true).await.unwrap();
    kill_9(&mut server);

    let (r, took) = timed_read(&*t).await;
    let e = r.expect_err("a read from a dead target past the window");
    println!("past the window, after {took:?}: {e:#}");
    assert!(
        took >= window && took < Duration::from_secs(15),
        "failed after {took:?}"
    );
    says_why(&e);

    // Down: each command fails at once (a read, a write, a flush), with
    // at most one login each.
    for what in ["read", "write", "flush"] {
        let started = Instant::now();
        let r = match what {
            "read" => t.read(0, 4096, Vec::new()).await.map(drop),
            "write" => t.write(4096, Bytes::from(data.clone()), false).await,
            _ => t.flush().await,
        };
        let took = started.elapsed();
        let e = r.expect_err("a command while the target is down");
        println!("{what} while down, after {took:?}: {e:#}");
        assert!(
            took < Duration::from_millis(1500),
            "{what} took {took:?} while the target was down"
        );
    }
    // A second later (DOWN_RETRY), one login is tried, and fails too.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (r, took) = timed_read(&*t).await;
    let e = r.expect_err("a read while the target is down");
    println!("a second later, after {took:?}: {e:#}");
    assert!(took < Duration::from_millis(1500), "took {took:?}");

    let mut server = target.start_again().await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (r, took) = timed_read(&*t).await;
    let got = r.expect("a read once the target is back");
    println!("back, read in {took:?}");
    assert!(got == data, "the data written before the kill");
    let said = said.lock().unwrap().join("\n");
    assert!(said.contains("logged in again"), "{said}");

    // Up again: the down mark is gone, a new loss gets the whole window.
    kill_9(&mut server);
    let (r, took) = timed_read(&*t).await;
    let e = r.expect_err("a read from a dead target past the window");
    println!("killed again, after {took:?}: {e:#}");
    assert!(
        took >= window && took < Duration::from_secs(15),
        "failed after {took:?}: the window did not apply again"
    );
    says_why(&e);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_window_commands_fail_and_fail_fast_until_the_target_is_back() {
    tokio::time::timeout(Duration::from_secs(60), commands_past_the_window())
        .await
        .expect("within 60 s");
}
