//! The NVMe/TCP target front end: ethersan's targets as NVMe subsystems
//! over TCP (NVMe-oF 1.1, TP 8000), beside iSCSI.
//!
//! Each listening address accepts connections; one task per connection
//! owns its [`ethersan_nvme::Queue`] (the protocol core, no I/O) and
//! loops select → apply over socket reads, command completions arriving
//! over a channel and the Keep Alive deadline. An admin queue's Connect
//! makes a controller (CNTLID allocated here, dynamic), I/O queues join it
//! by CNTLID and host NQN. Each target is a subsystem
//! ([`ident::subsystem_nqn`]), LUN n its namespace n + 1; the well-known
//! discovery NQN reaches a discovery controller listing every subsystem
//! on every portal.
//!
//! I/O commands become SCSI commands ([`translate`]) run by the target
//! core's executor with the LUN's every rule (masking, read-only,
//! reservations, ALUA, counters), the host NQN standing for the
//! initiator name and an I_T nexus of its own per host NQN + host ID and
//! target, so a SCSI reservation holder fences NVMe writes.

mod admin;
mod conn;
mod fabrics;
pub mod ident;
mod io;
pub mod reservations;
pub mod translate;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use ethersan_core::counters::IoCounters;
use ethersan_core::executor::Executor;
use ethersan_nvme::properties::{Capabilities, Properties};
use ethersan_scsi::Nexus;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::Config;
use crate::registry::{Registry, TargetEntry};

/// Why the NVMe/TCP target could not start.
#[derive(Debug, thiserror::Error)]
pub enum NvmeError {
    /// A portal could not be bound.
    #[error("cannot listen for NVMe/TCP on {addr}: {cause}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        cause: std::io::Error,
    },
}

/// Entries per queue (CAP.MQES + 1).
pub(crate) const QUEUE_ENTRIES: u16 = 128;
/// Most write data a command capsule carries (IOCCSZ × 16 − 64): writes up
/// to 128 KiB go with their command, as iSCSI's immediate data and first
/// burst do, instead of waiting a round trip for an R2T. With 8 KiB (the
/// admin queue's size) 128 KiB writes at QD16 ran at 0.65× iSCSI's rate
/// (`bench/nvme`, docs/benchmark.md).
pub(crate) const IN_CAPSULE: u32 = 128 * 1024;
/// Bytes of answers a connection queues before it reads no further
/// commands until the host has taken them.
pub(crate) const TX_BACKLOG: usize = 4 << 20;
/// How long a connection may stay without a controller (its ICReq and an
/// accepted Connect) before it is closed: an idle socket holds a task.
pub(crate) const CONNECT_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);
/// I/O queues a controller offers (Number of Queues).
pub(crate) const IO_QUEUES: u16 = 64;
/// Async Event Requests held at most, less one (AERL).
pub(crate) const AERL: u8 = 3;

/// What a controller serves.
pub(crate) enum Role {
    /// An I/O controller of one target's subsystem.
    Io {
        /// The target.
        target: Arc<TargetEntry>,
        /// The host's I_T nexus for the target.
        nexus: Nexus,
        /// The host's counters.
        counters: Arc<IoCounters>,
    },
    /// The discovery controller.
    Discovery,
}

/// One controller: made by an admin queue's Connect, ended with it.
pub(crate) struct Controller {
    /// Its ID.
    pub(crate) cntlid: u16,
    /// What it serves.
    pub(crate) role: Role,
    /// The subsystem's NQN.
    pub(crate) subnqn: String,
    /// The host's NQN (the initiator name for access rules).
    pub(crate) hostnqn: Arc<str>,
    /// The host identifier from Connect.
    pub(crate) hostid: [u8; 16],
    /// CAP, VS, CC, CSTS.
    pub(crate) props: Mutex<Properties>,
    /// Keep Alive Timeout from Connect, ms (Get Features).
    pub(crate) kato: AtomicU32,
    /// Asynchronous Event Configuration (Set/Get Features).
    pub(crate) aec: AtomicU32,
    /// Set to true when the controller ends: its I/O queues close.
    pub(crate) ended: watch::Sender<bool>,
}

impl Controller {
    /// Whether CC.EN is set and CSTS.RDY follows.
    pub(crate) fn ready(&self) -> bool {
        self.props.lock().unwrap_or_else(|e| e.into_inner()).ready()
    }
}

/// What every connection of the NVMe/TCP target shares.
pub(crate) struct Shared {
    pub(crate) registry: Arc<Registry>,
    pub(crate) executor: Executor,
    /// The bound portal addresses (discovery log entries).
    pub(crate) portals: Vec<SocketAddr>,
    controllers: Mutex<HashMap<u16, Arc<Controller>>>,
    next_cntlid: Mutex<u16>,
}

impl Shared {
    /// Make a controller with a fresh CNTLID (1..=FFEFh); `None` when all
    /// are taken.
    pub(crate) fn new_controller(
        &self,
        role: Role,
        subnqn: String,
        hostnqn: Arc<str>,
        hostid: [u8; 16],
        kato: u32,
    ) -> Option<Arc<Controller>> {
        let mut map = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = self.next_cntlid.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..0xFFEF {
            let id = *next;
            *next = if id >= 0xFFEE { 1 } else { id + 1 };
            if map.contains_key(&id) {
                continue;
            }
            let c = Arc::new(Controller {
                cntlid: id,
                role,
                subnqn,
                hostnqn,
                hostid,
                props: Mutex::new(Properties::new(Capabilities {
                    mqes: QUEUE_ENTRIES - 1,
                    timeout: 30,
                    mpsmin: 0,
                })),
                kato: AtomicU32::new(kato),
                aec: AtomicU32::new(0),
                ended: watch::channel(false).0,
            });
            map.insert(id, c.clone());
            return Some(c);
        }
        None
    }

    /// The controller with this ID.
    pub(crate) fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.controllers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&cntlid)
            .cloned()
    }

    /// End controller `c`: forget it and close its I/O queues.
    pub(crate) fn end_controller(&self, c: &Controller) {
        self.controllers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&c.cntlid);
        // The host's nexus is not reported lost: NVMe has no RESERVE(6)
        // reservations to drop, and a unit attention would fail the first
        // command of its next connection.
        c.ended.send_replace(true);
    }

    /// The target whose subsystem NQN is `nqn`.
    pub(crate) fn target_by_nqn(&self, nqn: &str) -> Option<Arc<TargetEntry>> {
        self.registry
            .targets()
            .iter()
            .find(|t| ident::subsystem_nqn(&t.name) == nqn)
            .cloned()
    }

    /// How many controllers exist.
    pub(crate) fn controller_count(&self) -> usize {
        self.controllers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

/// The NVMe/TCP target of a running server (from [`start`]).
pub struct Nvme {
    shared: Option<Arc<Shared>>,
    accepting: Vec<tokio::task::JoinHandle<()>>,
    stop: watch::Sender<bool>,
}

impl std::fmt::Debug for Nvme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvme")
            .field("portals", &self.local_addrs())
            .finish_non_exhaustive()
    }
}

impl Default for Nvme {
    fn default() -> Self {
        Nvme {
            shared: None,
            accepting: Vec::new(),
            stop: watch::channel(false).0,
        }
    }
}

impl Nvme {
    /// The bound addresses (with the real port when 0 was asked for).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.shared
            .as_ref()
            .map(|s| s.portals.clone())
            .unwrap_or_default()
    }

    /// Controllers now connected.
    pub fn controllers(&self) -> usize {
        self.shared.as_ref().map_or(0, |s| s.controller_count())
    }

    /// Accept no more connections and end every connection (commands in
    /// flight finish on their own).
    pub async fn stop(&mut self) {
        for t in self.accepting.drain(..) {
            t.abort();
            let _ = t.await;
        }
        self.stop.send_replace(true);
    }
}

/// Bind every portal `cfg.nvme` lists and serve NVMe/TCP on them until
/// [`Nvme::stop`]. Needs a tokio runtime.
pub async fn start(cfg: &Config, registry: Arc<Registry>) -> Result<Nvme, NvmeError> {
    let mut nvme = Nvme::default();
    if !cfg.nvme.enabled() {
        return Ok(nvme);
    }
    let mut listeners = Vec::new();
    for &addr in &cfg.nvme.portals {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|cause| NvmeError::Bind { addr, cause })?;
        listeners.push(l);
    }
    let portals: Vec<SocketAddr> = listeners
        .iter()
        .zip(&cfg.nvme.portals)
        .map(|(l, a)| l.local_addr().unwrap_or(*a))
        .collect();
    let shared = Arc::new(Shared {
        registry,
        executor: Executor {
            inline_io: cfg.options.inline_io,
        },
        portals,
        controllers: Mutex::new(HashMap::new()),
        next_cntlid: Mutex::new(1),
    });
    for (l, addr) in listeners.into_iter().zip(shared.portals.clone()) {
        info!(%addr, "NVMe/TCP listening");
        let shared = shared.clone();
        let stop = nvme.stop.subscribe();
        nvme.accepting.push(tokio::spawn(async move {
            loop {
                match l.accept().await {
                    Ok((sock, peer)) => {
                        let _ = sock.set_nodelay(true);
                        let conn = conn::Conn::new(shared.clone(), &sock, peer);
                        tokio::spawn(conn.run(sock, stop.clone()));
                    }
                    Err(e) => {
                        warn!(%addr, "NVMe/TCP accept: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
        }));
    }
    nvme.shared = Some(shared);
    Ok(nvme)
}
