//! Explicit placement of connections on worker threads.
//!
//! With `placement = "pinned"` the server runs one single-threaded tokio
//! runtime per worker, each on its own OS thread pinned to one CPU, and the
//! accept loop hands every new connection to the worker with the fewest
//! connections. A connection's tasks (reader, session loop, writer) then all
//! live on one core: no work stealing moves them, and no core is left idle
//! while another carries every connection (SPDK's reported problem). Each
//! worker has its own blocking pool for commands that must wait.
//!
//! Each worker also has an io_uring of its own (`worker_rings`, on by
//! default): its sessions' file I/O is submitted and completed on the
//! worker's thread, with no hand-off to a LUN's ring thread. Pinned is the
//! default placement: on 2 vCPUs it halved the server CPU per 4K direct
//! read at queue depth 1 and cut context switches per I/O from 6.5 to 2
//! (docs/benchmark.md).
//!
//! `placement = "shared"` runs connections on tokio's work-stealing
//! multi-thread runtime instead.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::os::fd::{AsRawFd, RawFd};
use std::task::Poll;

use ethersan_backend::uring::LocalRing;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tracing::{info, warn};

/// One pinned worker: its runtime handle and its connection count.
struct Worker {
    handle: Handle,
    conns: Arc<AtomicUsize>,
    /// Dropping this ends the worker's runtime thread.
    _stop: oneshot::Sender<()>,
}

/// A set of pinned single-threaded runtimes that connections are placed on.
pub(crate) struct Placement {
    workers: Vec<Worker>,
}

/// Decrements a worker's connection count when the connection ends, however
/// it ends.
struct ConnGuard(Arc<AtomicUsize>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Placement {
    /// Start `n` workers (0: one per CPU the process may use), each pinned
    /// to a CPU in turn when the OS allows it.
    ///
    /// With `rings`, each worker has an io_uring of its own
    /// ([`LocalRing`]): file I/O of its sessions is submitted and completed
    /// on the worker's thread, with no hand-off to a ring thread.
    pub(crate) fn start(n: usize, rings: bool) -> std::io::Result<Placement> {
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        let n = if n == 0 { cores.len().max(1) } else { n };
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
            let (handle_tx, handle_rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("ethersan-w{i}"))
                .spawn(move || {
                    if let Some(core) = core {
                        if !core_affinity::set_for_current(core) {
                            warn!(worker = i, core = core.id, "cannot pin worker thread");
                        }
                    }
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .thread_name(format!("ethersan-w{i}-io"))
                        // Threads of the blocking pool would inherit the
                        // worker's pin; commands that wait may run anywhere.
                        .on_thread_start(unpin_current_thread)
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = handle_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = handle_tx.send(Ok(rt.handle().clone()));
                    // Run this worker's connections, and its ring, until
                    // the placement is dropped (the sender then closes).
                    rt.block_on(async {
                        let ring = if rings { start_ring(i) } else { None };
                        match &ring {
                            Some(ring) => {
                                tokio::select! {
                                    _ = stop_rx => {}
                                    _ = drive_ring(ring) => {}
                                }
                            }
                            None => {
                                let _ = stop_rx.await;
                            }
                        }
                        // Dropping the ring (here, inside the runtime)
                        // waits for its I/O in flight.
                        drop(ring);
                    });
                })?;
            let handle = handle_rx
                .recv()
                .map_err(|_| std::io::Error::other("worker thread died while starting"))??;
            workers.push(Worker {
                handle,
                conns: Arc::new(AtomicUsize::new(0)),
                _stop: stop_tx,
            });
        }
        info!(
            workers = n,
            pinned = !cores.is_empty(),
            "connections placed on pinned workers"
        );
        Ok(Placement { workers })
    }

    /// Run a connection's future on the worker with the fewest connections.
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let w = self
            .workers
            .iter()
            .min_by_key(|w| w.conns.load(Ordering::Relaxed))
            .expect("at least one worker");
        w.conns.fetch_add(1, Ordering::Relaxed);
        let guard = ConnGuard(w.conns.clone());
        w.handle.spawn(async move {
            let _guard = guard;
            fut.await;
        });
    }

    /// How many workers there are.
    pub(crate) fn len(&self) -> usize {
        self.workers.len()
    }

    /// Worker `i` (modulo their number) on its own: its runtime and its
    /// connection count, without keeping the workers running.
    pub(crate) fn worker(&self, i: usize) -> WorkerSlot {
        let w = &self.workers[i % self.workers.len()];
        WorkerSlot {
            handle: w.handle.clone(),
            conns: w.conns.clone(),
        }
    }

    /// Connections on each worker, in worker order.
    #[cfg(test)]
    fn loads(&self) -> Vec<usize> {
        self.workers
            .iter()
            .map(|w| w.conns.load(Ordering::Relaxed))
            .collect()
    }
}

/// One worker's runtime and connection count (from
/// [`Placement::worker`]): what runs there (a native transport endpoint
/// and its sessions) places its connections on that worker, counted as
/// the accept loops' are. Holding it does not keep the worker running.
#[derive(Clone)]
pub(crate) struct WorkerSlot {
    handle: Handle,
    conns: Arc<AtomicUsize>,
}

impl WorkerSlot {
    /// The worker's runtime.
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Run a connection's future on this worker, counted among its
    /// connections until it ends.
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.conns.fetch_add(1, Ordering::Relaxed);
        let guard = ConnGuard(self.conns.clone());
        self.handle.spawn(async move {
            let _guard = guard;
            fut.await;
        });
    }
}

/// The pinned workers of a server, started on first use (by the TCP
/// accept loops or the native transport) and shared by both; `None`
/// inside with `placement = "shared"` or when they cannot start.
#[derive(Clone)]
pub(crate) struct Workers {
    cell: Arc<std::sync::OnceLock<Option<Arc<Placement>>>>,
    options: crate::config::Options,
}

impl Workers {
    /// The workers `options` ask for, not started yet.
    pub(crate) fn new(options: &crate::config::Options) -> Workers {
        Workers {
            cell: Arc::default(),
            options: options.clone(),
        }
    }

    /// The pinned workers, started on the first call; `None` with
    /// `placement = "shared"`, or when they cannot start (logged: the
    /// shared runtime then runs everything).
    pub(crate) fn get(&self) -> Option<Arc<Placement>> {
        self.cell
            .get_or_init(|| match self.options.placement {
                crate::config::Placement::Shared => None,
                crate::config::Placement::Pinned => {
                    match Placement::start(self.options.worker_threads, self.options.worker_rings) {
                        Ok(p) => Some(Arc::new(p)),
                        Err(e) => {
                            warn!(%e, "cannot start pinned workers; using the shared runtime");
                            None
                        }
                    }
                }
            })
            .clone()
    }
}

/// Give worker `i`'s thread an io_uring of its own; `None` (logged) when
/// the kernel refuses it, and its sessions use each device's ring thread.
fn start_ring(i: usize) -> Option<LocalRing> {
    match LocalRing::install(WORKER_RING_ENTRIES) {
        Ok(r) => Some(r),
        Err(e) => {
            warn!(worker = i, %e, "no io_uring for this worker; file I/O goes through each LUN's ring thread");
            None
        }
    }
}

/// Submission entries of a worker's ring (requests beyond them wait in
/// the ring's queue).
const WORKER_RING_ENTRIES: u32 = 256;

/// The `RawFd` of a worker's ring, for tokio's reactor (the ring owns
/// the descriptor).
struct RingFd(RawFd);

impl AsRawFd for RingFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Run `ring` on this worker: a turn (enter queued requests, run
/// completions) whenever completions arrived (its descriptor is readable)
/// or sessions queued requests. Returns only if the reactor refuses the
/// descriptor (logged; the ring then turns once a millisecond).
async fn drive_ring(ring: &LocalRing) {
    // SAFETY: the descriptor is the ring's, which stays open in this
    // thread's storage until `ring` is dropped; `ring` is borrowed for the
    // whole of this function, so the registration (dropped when it
    // returns) never outlives it, and `RingFd` always returns that fd.
    let afd =
        match unsafe { AsyncFd::register_with_interest(RingFd(ring.fd()), Interest::READABLE) } {
            Ok(a) => Some(a),
            Err(e) => {
                warn!(%e, "cannot watch the worker's io_uring; polling it");
                None
            }
        };
    loop {
        // Yields to the worker's sessions once the task's budget is spent,
        // also when every turn finds more work at once.
        tokio::task::consume_budget().await;
        ring.turn();
        if ring.must_retry() {
            // The kernel asked to try again (EAGAIN, EBUSY): pause, then
            // turn again; completions that arrive meanwhile wait for it.
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            continue;
        }
        match &afd {
            Some(afd) => {
                std::future::poll_fn(|cx| {
                    // Readiness is cleared before the next turn reaps, so a
                    // completion that arrives after the reap wakes us again.
                    if let Poll::Ready(Ok(mut g)) = afd.poll_read_ready(cx) {
                        g.clear_ready();
                        return Poll::Ready(());
                    }
                    ring.poll_work(cx)
                })
                .await
            }
            None => {
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_millis(1)) => {}
                    _ = std::future::poll_fn(|cx| ring.poll_work(cx)) => {}
                }
            }
        }
    }
}

/// Let the calling thread run on every CPU again.
fn unpin_current_thread() {
    // SAFETY: `set` is a plain bit set owned by this frame; CPU_ZERO and
    // CPU_SET only write inside it (CPU_SET ignores CPUs beyond its size),
    // and sched_setaffinity reads exactly `size_of::<cpu_set_t>()` bytes of
    // it for the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        for cpu in 0..libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn connections_go_to_the_least_loaded_worker_and_are_released() {
        let p = Placement::start(2, true).unwrap();
        let (release_tx, _) = tokio::sync::broadcast::channel::<()>(1);
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        for _ in 0..4 {
            let mut release = release_tx.subscribe();
            let seen = seen_tx.clone();
            p.spawn(async move {
                let _ = seen.send(std::thread::current().name().map(str::to_owned));
                let _ = release.recv().await;
            });
        }
        let names: Vec<_> = (0..4)
            .map(|_| seen_rx.recv_timeout(Duration::from_secs(5)).unwrap())
            .collect();
        assert_eq!(p.loads(), vec![2, 2]);
        let on_w0 = names
            .iter()
            .filter(|n| n.as_deref() == Some("ethersan-w0"))
            .count();
        assert_eq!(on_w0, 2, "threads seen: {names:?}");
        release_tx.send(()).unwrap();
        for _ in 0..100 {
            if p.loads() == vec![0, 0] {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("connection counts not released: {:?}", p.loads());
    }
}
