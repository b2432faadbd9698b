//! An in-memory Ethernet hub for tests: any number of [`MemoryPort`]s,
//! each with a MAC address, joined by a [`MemoryHub`] that forwards a
//! unicast frame to the port owning its destination (flooding unknown
//! destinations, as a switch does) and a broadcast or multicast frame to
//! every other port. Each port applies its [`RxFilter`] before queueing, as
//! the kernel does for a real link.
//!
//! Since the test kernel has no netem, the hub impairs deliveries itself:
//! each delivery to a port is lost, duplicated, held back behind the next
//! frame to that port (reordered) or has one payload bit flipped
//! (corrupted), with the probabilities of [`Impairments`], drawn from a
//! seeded generator: the same seed and the same sequence of sends give the
//! same deliveries.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::frame::{EthernetHeader, RxFilter, HEADER_LEN};
use crate::{check_mtu, checked_batch, LinkError, MacAddr, RECV_BATCH};

/// Frames a port queues before dropping (a full receive ring).
const PORT_QUEUE: usize = 8192;

/// One step of splitmix64: a small, good generator for seeds and tests.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A deterministic xorshift64* generator.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut s = seed;
        Rng(splitmix64(&mut s) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Probabilities (0.0 to 1.0) of impairing one delivery to one port.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Impairments {
    /// The frame is not delivered.
    pub loss: f64,
    /// The frame is delivered twice.
    pub duplicate: f64,
    /// The frame is held back and delivered after the next frame to the
    /// same port (or when the port finds its queue empty).
    pub reorder: f64,
    /// One bit of the payload (after the header) is flipped.
    pub corrupt: f64,
}

/// What the hub has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HubStats {
    /// Frames sent into the hub.
    pub sent: u64,
    /// Frames queued at a port (duplicates included).
    pub delivered: u64,
    /// Deliveries dropped by the loss rate.
    pub lost: u64,
    /// Extra copies delivered by the duplication rate.
    pub duplicated: u64,
    /// Deliveries held back behind a later frame.
    pub reordered: u64,
    /// Deliveries with a flipped bit.
    pub corrupted: u64,
    /// Deliveries a port's filter refused (EtherType or destination).
    pub filtered: u64,
    /// Deliveries dropped because a port's queue was full.
    pub overflowed: u64,
}

/// An in-memory Ethernet hub; clone it to share.
#[derive(Debug, Clone)]
pub struct MemoryHub {
    shared: Arc<HubShared>,
}

#[derive(Debug)]
struct HubShared {
    state: Mutex<HubState>,
}

#[derive(Debug)]
struct HubState {
    rng: Rng,
    impairments: Impairments,
    next_id: u64,
    ports: HashMap<u64, Arc<PortQueue>>,
    by_mac: HashMap<MacAddr, u64>,
    stats: HubStats,
}

#[derive(Debug)]
struct PortQueue {
    filter: RxFilter,
    frames: Mutex<PortFrames>,
    ready: Notify,
}

#[derive(Debug, Default)]
struct PortFrames {
    queue: VecDeque<Vec<u8>>,
    held: Option<Vec<u8>>,
}

impl MemoryHub {
    /// A hub that delivers every frame intact; `seed` still fixes the
    /// generator in case impairments are set later.
    pub fn new(seed: u64) -> MemoryHub {
        MemoryHub::with_impairments(seed, Impairments::default())
    }

    /// A hub impairing deliveries as given, deterministic for `seed`.
    pub fn with_impairments(seed: u64, impairments: Impairments) -> MemoryHub {
        MemoryHub {
            shared: Arc::new(HubShared {
                state: Mutex::new(HubState {
                    rng: Rng::new(seed),
                    impairments,
                    next_id: 0,
                    ports: HashMap::new(),
                    by_mac: HashMap::new(),
                    stats: HubStats::default(),
                }),
            }),
        }
    }

    /// Changes the impairment rates from now on.
    pub fn set_impairments(&self, impairments: Impairments) {
        self.lock().impairments = impairments;
    }

    /// The counters so far.
    pub fn stats(&self) -> HubStats {
        self.lock().stats
    }

    /// Plugs in a port with address `mac` carrying `ethertype`, with an MTU
    /// of `mtu` payload bytes. A second port with the same MAC takes over
    /// unicast delivery to it.
    pub fn port(&self, mac: MacAddr, ethertype: u16, mtu: usize) -> Result<MemoryPort, LinkError> {
        self.port_with_filter(
            RxFilter {
                mac,
                ethertype,
                multicast: false,
            },
            mtu,
        )
    }

    /// Plugs in a port with an explicit filter (to accept multicast).
    pub fn port_with_filter(&self, filter: RxFilter, mtu: usize) -> Result<MemoryPort, LinkError> {
        check_mtu(mtu)?;
        let queue = Arc::new(PortQueue {
            filter,
            frames: Mutex::new(PortFrames::default()),
            ready: Notify::new(),
        });
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.ports.insert(id, queue.clone());
        st.by_mac.insert(filter.mac, id);
        Ok(MemoryPort {
            hub: self.clone(),
            id,
            mtu,
            queue,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn forward(&self, from: u64, frame: &[u8]) {
        let Some(h) = EthernetHeader::parse(frame) else {
            return;
        };
        let mut st = self.lock();
        st.stats.sent += 1;
        let targets: Vec<Arc<PortQueue>> = match st.by_mac.get(&h.dst) {
            Some(id) if h.dst.is_unicast() => st.ports.get(id).cloned().into_iter().collect(),
            _ => {
                let mut ids: Vec<u64> = st.ports.keys().copied().filter(|&id| id != from).collect();
                // HashMap order is random: sort so a seed replays exactly.
                ids.sort_unstable();
                ids.iter().map(|id| st.ports[id].clone()).collect()
            }
        };
        for port in targets {
            st.deliver(&port, frame);
        }
    }
}

impl HubState {
    fn deliver(&mut self, port: &PortQueue, frame: &[u8]) {
        if !port.filter.accepts(frame) {
            self.stats.filtered += 1;
            return;
        }
        let imp = self.impairments;
        if self.rng.chance(imp.loss) {
            self.stats.lost += 1;
            return;
        }
        let mut copy = frame.to_vec();
        if copy.len() > HEADER_LEN && self.rng.chance(imp.corrupt) {
            let at = HEADER_LEN + self.rng.below(copy.len() - HEADER_LEN);
            copy[at] ^= 1 << self.rng.below(8);
            self.stats.corrupted += 1;
        }
        let copies = if self.rng.chance(imp.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        let reorder = self.rng.chance(imp.reorder);
        let mut q = port.frames.lock().unwrap_or_else(|e| e.into_inner());
        let held = q.held.take();
        let push = |q: &mut PortFrames, f: Vec<u8>, stats: &mut HubStats| {
            if q.queue.len() >= PORT_QUEUE {
                stats.overflowed += 1;
            } else {
                q.queue.push_back(f);
                stats.delivered += 1;
            }
        };
        for i in 0..copies {
            let f = if i + 1 == copies {
                std::mem::take(&mut copy)
            } else {
                copy.clone()
            };
            if reorder && i == 0 && held.is_none() {
                // Counted as delivered now: it reaches the queue later, here
                // or when the port finds its queue empty.
                self.stats.reordered += 1;
                self.stats.delivered += 1;
                q.held = Some(f);
            } else {
                push(&mut q, f, &mut self.stats);
            }
        }
        if let Some(h) = held {
            if q.queue.len() >= PORT_QUEUE {
                self.stats.delivered -= 1;
                self.stats.overflowed += 1;
            } else {
                q.queue.push_back(h);
            }
        }
        drop(q);
        port.ready.notify_one();
    }
}

/// One port of a [`MemoryHub`]; unplugged when dropped.
#[derive(Debug)]
pub struct MemoryPort {
    hub: MemoryHub,
    id: u64,
    mtu: usize,
    queue: Arc<PortQueue>,
}

impl MemoryPort {
    /// The port's MTU.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The port's receive filter (its MAC and EtherType).
    pub fn filter(&self) -> RxFilter {
        self.queue.filter
    }

    /// The hub this port is plugged into.
    pub fn hub(&self) -> &MemoryHub {
        &self.hub
    }

    /// See [`Link::recv_batch`](crate::Link::recv_batch).
    pub async fn recv_batch<F: FnMut(&[u8])>(&self, mut f: F) -> Result<usize, LinkError> {
        loop {
            let n = self.try_recv_batch(|frame| f(frame));
            if n > 0 {
                return Ok(n);
            }
            self.queue.ready.notified().await;
        }
    }

    /// See [`Link::ready`](crate::Link::ready).
    pub async fn ready(&self) -> Result<(), LinkError> {
        loop {
            {
                let q = self.queue.frames.lock().unwrap_or_else(|e| e.into_inner());
                if !q.queue.is_empty() || q.held.is_some() {
                    return Ok(());
                }
            }
            self.queue.ready.notified().await;
        }
    }

    /// See [`Link::try_recv_batch`](crate::Link::try_recv_batch).
    pub fn try_recv_batch<F: FnMut(&mut [u8])>(&self, mut f: F) -> usize {
        let mut batch: Vec<Vec<u8>> = {
            let mut q = self.queue.frames.lock().unwrap_or_else(|e| e.into_inner());
            if q.queue.is_empty() {
                // Idle: a frame held back for reordering goes now.
                if let Some(h) = q.held.take() {
                    q.queue.push_back(h);
                }
            }
            let n = q.queue.len().min(RECV_BATCH);
            q.queue.drain(..n).collect()
        };
        for frame in &mut batch {
            f(frame);
        }
        batch.len()
    }

    /// See [`Link::send_batch`](crate::Link::send_batch).
    pub async fn send_batch<I, B>(&self, frames: I) -> Result<usize, LinkError>
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        let frames = checked_batch(frames, self.mtu)?;
        for f in &frames {
            self.hub.forward(self.id, f.as_ref());
        }
        Ok(frames.len())
    }
}

impl Drop for MemoryPort {
    fn drop(&mut self) {
        let mut st = self.hub.lock();
        st.ports.remove(&self.id);
        if st.by_mac.get(&self.queue.filter.mac) == Some(&self.id) {
            st.by_mac.remove(&self.queue.filter.mac);
        }
    }
}

#[cfg(test)]
mod tests;
