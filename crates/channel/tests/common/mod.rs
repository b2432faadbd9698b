//! A deterministic network simulator for channel tests: two channels joined
//! by a full-duplex link with a rate, a latency, a drop-tail queue and
//! seeded faults (loss, reordering, duplication, corruption), driven by a
//! virtual clock. Each side's application sends a seeded stream of
//! messages and checks that the other side's arrive exactly once, in
//! order, byte-identical.
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use ethersan_channel::channel::{Channel, ChannelConfig, ChannelState};
use ethersan_channel::protect::Protector;

/// splitmix64: small, seeded, good enough for fault injection.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Fills `buf` with the content of message `index` of stream `stream`.
pub fn fill_message(stream: u64, index: u64, buf: &mut [u8]) {
    let mut r = Rng::new(stream.wrapping_mul(0x1_0000_0001) ^ index.wrapping_mul(0x9E37));
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&r.next_u64().to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let last = r.next_u64().to_le_bytes();
    let n = rest.len();
    rest.copy_from_slice(&last[..n]);
}

/// The link between the two channels, one of these per direction.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// Bytes per second; `None` for an infinitely fast link.
    pub rate: Option<u64>,
    /// Propagation delay.
    pub latency: Duration,
    /// Longest queueing delay before drop-tail.
    pub queue: Duration,
    pub loss: f64,
    pub reorder: f64,
    pub duplicate: f64,
    pub corrupt: f64,
}

impl LinkConfig {
    /// 1 Gbit/s, 50 µs, a 4 ms queue, no faults.
    pub fn lan() -> LinkConfig {
        LinkConfig {
            rate: Some(125_000_000),
            latency: Duration::from_micros(50),
            queue: Duration::from_millis(4),
            loss: 0.0,
            reorder: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
        }
    }

    /// The brief's faulty LAN: 1% loss, 1% reordering, 0.1% duplication,
    /// 0.1% corruption.
    pub fn lossy() -> LinkConfig {
        LinkConfig {
            loss: 0.01,
            reorder: 0.01,
            duplicate: 0.001,
            corrupt: 0.001,
            ..LinkConfig::lan()
        }
    }
}

/// What each application sends.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Total bytes each side sends (0: nothing).
    pub bytes: [u64; 2],
    /// Message sizes: log-uniform in `min..=max`.
    pub min: usize,
    pub max: usize,
    /// Keep at most this many bytes in the channel's send buffer.
    pub buffer: usize,
}

#[derive(Debug, Default, Clone)]
pub struct LinkStats {
    pub sent: u64,
    pub lost: u64,
    pub queue_drops: u64,
    pub reordered: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub rejected: u64,
}

struct Side {
    ch: Channel,
    /// Sending application.
    next_msg: u64,
    sent_bytes: u64,
    /// Receiving application (checks the other side's stream).
    recv_msg: u64,
    recv_bytes: u64,
    rng: Rng,
    drain: bool,
}

/// A frame on the wire: arrival time, tie-break, destination side, bytes.
type Wire = (Instant, u64, usize, Vec<u8>);

pub struct Sim {
    pub start: Instant,
    pub now: Instant,
    rng: Rng,
    sides: [Side; 2],
    link: [LinkConfig; 2],
    busy_until: [Instant; 2],
    wire: BinaryHeap<Reverse<Wire>>,
    order: u64,
    pub link_stats: [LinkStats; 2],
    pub workload: Workload,
    /// Side i's frames are not delivered (a dead peer).
    pub blackhole: [bool; 2],
    /// Side i's frames arrive no earlier than this plus the latency, in
    /// the order sent (a delay spike: nothing lost, nothing reordered).
    pub hold_until: [Option<Instant>; 2],
    scratch: Vec<u8>,
    check: Vec<u8>,
}

impl Sim {
    pub fn new(seed: u64, cfg: ChannelConfig, link: LinkConfig, workload: Workload) -> Sim {
        let start = Instant::now();
        let a = Channel::new(cfg.clone(), 1, 2, Protector::crc_only(), start);
        let b = Channel::new(cfg, 2, 1, Protector::crc_only(), start);
        Sim::with_channels(seed, a, b, link, workload, start)
    }

    pub fn with_channels(
        seed: u64,
        a: Channel,
        b: Channel,
        link: LinkConfig,
        workload: Workload,
        start: Instant,
    ) -> Sim {
        let side = |ch, s: u64| Side {
            ch,
            next_msg: 0,
            sent_bytes: 0,
            recv_msg: 0,
            recv_bytes: 0,
            rng: Rng::new(seed ^ ((s + 1) * 0x5151)),
            drain: true,
        };
        Sim {
            start,
            now: start,
            rng: Rng::new(seed),
            sides: [side(a, 0), side(b, 1)],
            link: [link.clone(), link],
            busy_until: [start; 2],
            wire: BinaryHeap::new(),
            order: 0,
            link_stats: Default::default(),
            workload,
            blackhole: [false; 2],
            hold_until: [None; 2],
            scratch: Vec::new(),
            check: Vec::new(),
        }
    }

    pub fn channel(&self, i: usize) -> &Channel {
        &self.sides[i].ch
    }

    pub fn channel_mut(&mut self, i: usize) -> &mut Channel {
        &mut self.sides[i].ch
    }

    /// Whether side `i`'s application takes the messages it receives.
    pub fn set_drain(&mut self, i: usize, drain: bool) {
        self.sides[i].drain = drain;
    }

    pub fn received_bytes(&self, i: usize) -> u64 {
        self.sides[i].recv_bytes
    }

    pub fn sent_bytes(&self, i: usize) -> u64 {
        self.sides[i].sent_bytes
    }

    pub fn received_messages(&self, i: usize) -> u64 {
        self.sides[i].recv_msg
    }

    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Everything sent by both sides has been received.
    pub fn done(&self) -> bool {
        (0..2).all(|i| {
            self.sides[i].sent_bytes >= self.workload.bytes[i]
                && self.sides[1 - i].recv_bytes == self.sides[i].sent_bytes
                && self.sides[1 - i].recv_msg == self.sides[i].next_msg
        })
    }

    fn message_len(&mut self, i: usize) -> usize {
        let w = &self.workload;
        let (min, max) = (w.min.max(1) as f64, w.max.max(1) as f64);
        let u = (self.sides[i].rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let len = (min.ln() + u * (max.ln() - min.ln())).exp().round() as usize;
        if self.workload.min == 0 && self.sides[i].rng.chance(0.01) {
            return 0;
        }
        len.clamp(self.workload.min, self.workload.max)
    }

    fn applications(&mut self) {
        for i in 0..2 {
            // Receive and check the peer's stream.
            if self.sides[i].drain {
                while let Some(m) = self.sides[i].ch.recv_message() {
                    let index = self.sides[i].recv_msg;
                    self.check.resize(m.len(), 0);
                    fill_message(1 - i as u64, index, &mut self.check);
                    assert!(
                        m == self.check,
                        "side {i}: message {index} ({} bytes) differs",
                        m.len()
                    );
                    self.sides[i].recv_msg += 1;
                    self.sides[i].recv_bytes += m.len() as u64;
                }
            }
            // Send.
            while self.sides[i].sent_bytes < self.workload.bytes[i]
                && self.sides[i].ch.send_buffered() < self.workload.buffer
                && self.sides[i].ch.state() == ChannelState::Open
            {
                let len = self.message_len(i);
                let index = self.sides[i].next_msg;
                let mut msg = std::mem::take(&mut self.scratch);
                msg.resize(len, 0);
                fill_message(i as u64, index, &mut msg);
                self.sides[i].ch.send_message(&msg).expect("send_message");
                self.scratch = msg;
                self.sides[i].next_msg += 1;
                self.sides[i].sent_bytes += len as u64;
            }
        }
    }

    fn transmit(&mut self) {
        let mut out = Vec::new();
        for i in 0..2 {
            while self.sides[i].ch.poll_transmit(self.now, &mut out) {
                self.put_on_wire(i, out.clone());
            }
        }
    }

    fn put_on_wire(&mut self, from: usize, mut frame: Vec<u8>) {
        let link = &self.link[from];
        let st = &mut self.link_stats[from];
        st.sent += 1;
        if self.blackhole[from] {
            st.lost += 1;
            return;
        }
        let depart = match link.rate {
            Some(rate) => {
                let start = self.busy_until[from].max(self.now);
                if start - self.now > link.queue {
                    st.queue_drops += 1;
                    return;
                }
                let ser = Duration::from_nanos(frame.len() as u64 * 1_000_000_000 / rate);
                self.busy_until[from] = start + ser;
                start + ser
            }
            None => self.now,
        };
        if self.rng.chance(link.loss) {
            st.lost += 1;
            return;
        }
        let mut arrive = depart.max(self.hold_until[from].unwrap_or(depart)) + link.latency;
        if self.rng.chance(link.reorder) {
            st.reordered += 1;
            arrive += Duration::from_micros(20 + self.rng.below(300));
        }
        if self.rng.chance(link.corrupt) {
            st.corrupted += 1;
            let bit = self.rng.below(frame.len() as u64 * 8) as usize;
            frame[bit / 8] ^= 1 << (bit % 8);
        }
        if self.rng.chance(link.duplicate) {
            st.duplicated += 1;
            let later = arrive + Duration::from_micros(self.rng.below(100));
            self.order += 1;
            self.wire
                .push(Reverse((later, self.order, 1 - from, frame.clone())));
        }
        self.order += 1;
        self.wire
            .push(Reverse((arrive, self.order, 1 - from, frame)));
    }

    /// Runs until `until` says stop or `limit` of virtual time passes;
    /// returns whether `until` stopped it.
    pub fn run_until(&mut self, limit: Duration, mut until: impl FnMut(&Sim) -> bool) -> bool {
        let deadline = self.now + limit;
        loop {
            self.applications();
            self.transmit();
            if until(self) {
                return true;
            }
            let next = [
                self.wire.peek().map(|Reverse((t, ..))| *t),
                self.sides[0].ch.poll_timeout(),
                self.sides[1].ch.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(next) = next else {
                return false;
            };
            if next > deadline {
                self.now = deadline;
                return false;
            }
            self.now = self.now.max(next);
            while self
                .wire
                .peek()
                .is_some_and(|Reverse((t, ..))| *t <= self.now)
            {
                let Some(Reverse((_, _, to, mut frame))) = self.wire.pop() else {
                    break;
                };
                if self.sides[to]
                    .ch
                    .handle_frame(self.now, &mut frame)
                    .is_err()
                {
                    self.link_stats[1 - to].rejected += 1;
                }
            }
            for s in &mut self.sides {
                s.ch.handle_timeout(self.now);
            }
        }
    }

    /// Runs the workload to completion (panics after `limit`).
    pub fn run(&mut self, limit: Duration) {
        let ok = self.run_until(limit, Sim::done);
        assert!(
            ok,
            "not done after {:?}: sent {:?}/{:?}, received {}/{} {}/{}; states {:?} {:?}\n{:#?}\n{:#?}\n{:#?}",
            self.elapsed(),
            self.sides[0].sent_bytes,
            self.sides[1].sent_bytes,
            self.sides[1].recv_bytes,
            self.sides[0].recv_bytes,
            self.sides[1].recv_msg,
            self.sides[0].recv_msg,
            self.sides[0].ch.state(),
            self.sides[1].ch.state(),
            self.sides[0].ch.stats(),
            self.sides[1].ch.stats(),
            self.link_stats,
        );
    }
}
