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
//! The default, `placement = "shared"`, runs connections on tokio's
//! work-stealing multi-thread runtime.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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
    pub(crate) fn start(n: usize) -> std::io::Result<Placement> {
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
                    // Run this worker's connections until the placement is
                    // dropped (the sender then closes).
                    rt.block_on(async {
                        let _ = stop_rx.await;
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

    /// Connections on each worker, in worker order.
    #[cfg(test)]
    fn loads(&self) -> Vec<usize> {
        self.workers
            .iter()
            .map(|w| w.conns.load(Ordering::Relaxed))
            .collect()
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
        let p = Placement::start(2).unwrap();
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
