//! The initiator state and the target state linked in memory through a
//! lossy Ethernet: frames are dropped, duplicated and reordered by a seeded
//! PRNG, time is simulated, and a `Vec<u8>` stands in for the volume.
//! Discovery, IDENTIFY, writing the whole disk, FLUSH and reading it back
//! must give the written bytes exactly.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use ethersan_aoe::ata;
use ethersan_aoe::initiator::{discovery_frame, parse_config_response, AtaRequest, Handle};
use ethersan_aoe::issue::SECTOR_SIZE;
use ethersan_aoe::{
    Action, AoeTarget, DeviceAddr, DeviceConfig, Initiator, InitiatorConfig, IoOp, Mac,
    TargetConfig,
};

const HOST: Mac = Mac([2, 0, 0, 0, 0, 0x0A]);
const SERVER: Mac = Mac([2, 0, 0, 0, 0, 0x10]);
const DEV: DeviceAddr = DeviceAddr { shelf: 5, slot: 2 };

/// xorshift64*: small, seeded, good enough to pick fates for frames.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// True with probability `percent`/100.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Which end a frame is travelling to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Target,
    Initiator,
}

/// Frames in flight, keyed by delivery time (and a sequence number to keep
/// the map's keys unique).
struct Wire {
    rng: Rng,
    loss: u64,
    dup: u64,
    in_flight: BTreeMap<(Instant, u64), (End, Vec<u8>)>,
    seq: u64,
    sent: usize,
    dropped: usize,
    duplicated: usize,
}

impl Wire {
    fn send(&mut self, now: Instant, to: End, frame: &[u8]) {
        self.sent += 1;
        if self.rng.chance(self.loss) {
            self.dropped += 1;
            return;
        }
        let copies = if self.rng.chance(self.dup) { 2 } else { 1 };
        self.duplicated += copies - 1;
        for _ in 0..copies {
            // 50..3000 µs of jitter reorders frames sent close together.
            let delay = Duration::from_micros(50 + self.rng.next() % 2950);
            self.seq += 1;
            self.in_flight
                .insert((now + delay, self.seq), (to, frame.to_vec()));
        }
    }

    fn next_delivery(&self) -> Option<Instant> {
        self.in_flight.keys().next().map(|k| k.0)
    }

    fn pop_due(&mut self, now: Instant) -> Option<(End, Vec<u8>)> {
        let key = *self.in_flight.keys().next()?;
        if key.0 > now {
            return None;
        }
        self.in_flight.remove(&key)
    }
}

/// The target's front end: the state machine and a RAM disk.
struct Server {
    target: AoeTarget,
    disk: Vec<u8>,
    writes: usize,
}

impl Server {
    fn receive(&mut self, frame: &[u8]) -> Vec<Vec<u8>> {
        match self.target.handle(frame) {
            Action::Drop(_) => Vec::new(),
            Action::Reply(frames) => frames,
            Action::Io(io) => {
                let mut out = Vec::new();
                match io.op {
                    IoOp::Read { lba, sectors } => {
                        let at = lba as usize * SECTOR_SIZE;
                        let buf = io.pending.prepare_read(&mut out);
                        buf.copy_from_slice(
                            &self.disk[at..at + usize::from(sectors) * SECTOR_SIZE],
                        );
                    }
                    IoOp::Write { lba, data, .. } => {
                        let at = lba as usize * SECTOR_SIZE;
                        self.disk[at..at + data.len()].copy_from_slice(&frame[data]);
                        self.writes += 1;
                    }
                    IoOp::Flush => {}
                }
                io.pending.complete(Ok(()), &mut out);
                vec![out]
            }
        }
    }
}

/// Run until `pending` is empty, feeding completions to `done`. Returns the
/// simulated time.
fn drive(
    init: &mut Initiator,
    server: &mut Server,
    wire: &mut Wire,
    mut now: Instant,
    pending: &mut HashMap<Handle, AtaRequest>,
    mut done: impl FnMut(AtaRequest, &[u8], std::ops::Range<usize>),
) -> Instant {
    for _ in 0..1_000_000 {
        if pending.is_empty() {
            return now;
        }
        while let Some(f) = init.poll_transmit(now) {
            wire.send(now, End::Target, &f);
        }
        let next = [wire.next_delivery(), init.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        now = next
            .expect("nothing in flight and nothing due, yet commands pending")
            .max(now);
        while let Some((to, frame)) = wire.pop_due(now) {
            match to {
                End::Target => {
                    for reply in server.receive(&frame) {
                        wire.send(now, End::Initiator, &reply);
                    }
                }
                End::Initiator => {
                    if let Some(c) = init.on_frame(&frame, now) {
                        let req = pending
                            .remove(&c.handle)
                            .expect("completion for a pending command");
                        let reply = c.result.unwrap_or_else(|e| panic!("{req:?} failed: {e}"));
                        done(req, &frame, reply.data);
                    }
                }
            }
        }
        if init.poll_timeout().is_some_and(|t| t <= now) {
            let failed = init.on_timeout(now);
            assert!(failed.is_empty(), "commands gave up: {failed:?}");
        }
    }
    panic!("simulation did not finish");
}

fn run(seed: u64, mtu: usize, loss: u64, dup: u64, sectors: u64) {
    let mut target = AoeTarget::new(TargetConfig::new(SERVER, mtu));
    target.add_device(DEV, DeviceConfig::new(sectors)).unwrap();
    let mut server = Server {
        target,
        disk: vec![0; sectors as usize * SECTOR_SIZE],
        writes: 0,
    };
    let mut wire = Wire {
        rng: Rng(seed),
        loss,
        dup,
        in_flight: BTreeMap::new(),
        seq: 0,
        sent: 0,
        dropped: 0,
        duplicated: 0,
    };
    let mut now = Instant::now();

    // Discovery: broadcast until a config response gets through.
    let info = 'found: loop {
        wire.send(now, End::Target, &discovery_frame(HOST, 1));
        let until = now + Duration::from_millis(100);
        while let Some(t) = wire.next_delivery().filter(|t| *t <= until) {
            now = t;
            while let Some((to, frame)) = wire.pop_due(now) {
                match to {
                    End::Target => {
                        for r in server.receive(&frame) {
                            wire.send(now, End::Initiator, &r);
                        }
                    }
                    End::Initiator => {
                        if let Ok(info) = parse_config_response(&frame) {
                            break 'found info;
                        }
                    }
                }
            }
        }
        now = until;
    };
    assert_eq!(
        (info.mac, info.shelf, info.slot),
        (SERVER, DEV.shelf, DEV.slot)
    );
    let cfg = InitiatorConfig {
        mtu,
        ..InitiatorConfig::new(HOST)
    };
    let mut init = Initiator::new(cfg, info);
    let per_frame = u64::from(init.max_sectors());

    // IDENTIFY.
    let mut pending = HashMap::new();
    pending.insert(
        init.submit(AtaRequest::Identify).unwrap(),
        AtaRequest::Identify,
    );
    let mut capacity = 0;
    now = drive(
        &mut init,
        &mut server,
        &mut wire,
        now,
        &mut pending,
        |_, frame, data| {
            let id = ata::parse_identify(&frame[data]).unwrap();
            assert!(id.lba48);
            capacity = id.sectors;
        },
    );
    assert_eq!(capacity, sectors);

    // Write the whole disk with a seeded pattern, then flush.
    let mut pattern = vec![0u8; sectors as usize * SECTOR_SIZE];
    let mut prng = Rng(seed ^ 0x5EED);
    pattern.iter_mut().for_each(|b| *b = prng.next() as u8);
    let mut lba = 0;
    while lba < sectors {
        let n = per_frame.min(sectors - lba);
        let at = lba as usize * SECTOR_SIZE;
        let data = pattern[at..at + n as usize * SECTOR_SIZE].to_vec();
        let req = AtaRequest::Write { lba, data };
        pending.insert(init.submit(req.clone()).unwrap(), req);
        lba += n;
    }
    now = drive(
        &mut init,
        &mut server,
        &mut wire,
        now,
        &mut pending,
        |_, _, _| {},
    );
    pending.insert(init.submit(AtaRequest::Flush).unwrap(), AtaRequest::Flush);
    now = drive(
        &mut init,
        &mut server,
        &mut wire,
        now,
        &mut pending,
        |_, _, _| {},
    );
    assert_eq!(server.disk, pattern, "the RAM disk holds what was written");

    // Read it all back.
    let mut back = vec![0u8; pattern.len()];
    let mut lba = 0;
    while lba < sectors {
        let n = per_frame.min(sectors - lba) as u8;
        let req = AtaRequest::Read { lba, sectors: n };
        pending.insert(init.submit(req.clone()).unwrap(), req);
        lba += u64::from(n);
    }
    drive(
        &mut init,
        &mut server,
        &mut wire,
        now,
        &mut pending,
        |req, frame, data| {
            let AtaRequest::Read { lba, sectors } = req else {
                panic!("{req:?}")
            };
            let at = lba as usize * SECTOR_SIZE;
            assert_eq!(data.len(), usize::from(sectors) * SECTOR_SIZE);
            back[at..at + data.len()].copy_from_slice(&frame[data]);
        },
    );
    assert!(back == pattern, "read back differs from what was written");
    eprintln!(
        "seed {seed:#x}: {} frames sent, {} dropped, {} duplicated, {} disk writes, window {}, srtt {:?}",
        wire.sent,
        wire.dropped,
        wire.duplicated,
        server.writes,
        init.window(),
        init.srtt()
    );
    assert_eq!(init.outstanding(), 0);
    if loss > 0 {
        assert!(
            wire.dropped > 0 && wire.duplicated > 0,
            "the link was not lossy: {} sent",
            wire.sent
        );
        assert!(
            server.writes > (sectors / per_frame) as usize,
            "duplicates and retransmissions reach the disk"
        );
    }
}

#[test]
fn clean_link_standard_frames() {
    run(1, 1500, 0, 0, 256);
}

#[test]
fn lossy_link_standard_frames() {
    for seed in [0x9E37_79B9_7F4A_7C15, 42, 7777] {
        run(seed, 1500, 10, 5, 300);
    }
}

#[test]
fn lossy_link_jumbo_frames() {
    run(0xDEAD_BEEF, 9000, 15, 10, 1000);
}
