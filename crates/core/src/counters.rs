//! Counters per LUN and per initiator: commands and bytes read and
//! written, failures by sense key, and a latency histogram. Each is a
//! relaxed atomic add on the data path, in a shard of its own thread (many
//! sessions on several worker threads count on one LUN without moving one
//! cache line between cores); readers sum the shards into a [`Snapshot`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Latency histogram buckets: bucket *i* counts commands that took less
/// than 2^(i+1) µs (the first: under 2 µs); the last holds the rest.
pub const LATENCY_BUCKETS: usize = 24;

/// What kind of command a count is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandKind {
    /// Moves data from the medium to the initiator.
    Read,
    /// Moves data from the initiator to the medium.
    Write,
    /// Anything else (INQUIRY, SYNCHRONIZE CACHE, UNMAP, ...).
    Other,
}

impl CommandKind {
    /// The kind of the command with this CDB.
    pub fn of(cdb: &[u8]) -> CommandKind {
        Self::of_op(ethersan_scsi::commands::lookup(cdb).map(|d| d.op))
    }

    /// The kind of a command from its row in the command table.
    pub fn of_op(op: Option<ethersan_scsi::commands::Op>) -> CommandKind {
        use ethersan_scsi::commands::Op;
        match op {
            Some(Op::Read) => CommandKind::Read,
            Some(Op::Write | Op::WriteVerify | Op::WriteAtomic | Op::OrWrite) => CommandKind::Write,
            _ => CommandKind::Other,
        }
    }
}

/// One set of counters, sharded by thread.
#[derive(Debug)]
pub struct IoCounters {
    shards: Box<[Shard]>,
}

/// How many shards a set of counters has: threads beyond this share.
const SHARDS: usize = 16;

/// One thread's share of a set of counters, on cache lines of its own.
#[derive(Debug)]
#[repr(align(128))]
struct Shard {
    reads: AtomicU64,
    writes: AtomicU64,
    others: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    /// Commands that ended with CHECK CONDITION, by sense key.
    errors: [AtomicU64; 16],
    /// Commands that ended with another non-GOOD status (RESERVATION
    /// CONFLICT, BUSY, TASK SET FULL...).
    other_failures: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS],
    latency_sum_us: AtomicU64,
    /// Commands handed to the executor, and those whose execution state
    /// is gone (finished, or abandoned by an ended session): the
    /// difference is the commands in flight.
    begun: AtomicU64,
    ended: AtomicU64,
}

impl Default for Shard {
    fn default() -> Self {
        Shard {
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            others: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            errors: std::array::from_fn(|_| AtomicU64::new(0)),
            other_failures: AtomicU64::new(0),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
            latency_sum_us: AtomicU64::new(0),
            begun: AtomicU64::new(0),
            ended: AtomicU64::new(0),
        }
    }
}

impl Default for IoCounters {
    fn default() -> Self {
        IoCounters {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

/// This thread's shard index: threads take the next one as they first count.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    INDEX.with(|i| *i)
}

/// The bucket for a latency.
fn bucket(latency: Duration) -> usize {
    let us = latency.as_micros().min(u128::from(u64::MAX)) as u64;
    // < 2 µs → 0, < 4 µs → 1, ...
    let b = (64 - (us | 1).leading_zeros()) as usize - 1;
    b.min(LATENCY_BUCKETS - 1)
}

/// A copy of a set of counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// Read commands.
    pub reads: u64,
    /// Write commands.
    pub writes: u64,
    /// Other commands.
    pub others: u64,
    /// Bytes read by GOOD read commands.
    pub read_bytes: u64,
    /// Bytes written by GOOD write commands.
    pub write_bytes: u64,
    /// CHECK CONDITION by sense key (index = key).
    pub errors: [u64; 16],
    /// Other non-GOOD statuses.
    pub other_failures: u64,
    /// Latency histogram (see [`LATENCY_BUCKETS`]).
    pub latency: [u64; LATENCY_BUCKETS],
    /// Sum of latencies, µs.
    pub latency_sum_us: u64,
    /// Commands being executed now.
    pub in_flight: u64,
}

impl IoCounters {
    /// Count one finished command: its kind, the bytes it moved (counted
    /// only when it succeeded), its status and sense, and how long it took.
    pub fn record(
        &self,
        kind: CommandKind,
        bytes: u64,
        response: &ethersan_scsi::ScsiResponse,
        latency: Duration,
    ) {
        use ethersan_scsi::ScsiStatus;
        let shard = &self.shards[shard_index()];
        let good = response.status == ScsiStatus::Good;
        match kind {
            CommandKind::Read => {
                shard.reads.fetch_add(1, Ordering::Relaxed);
                if good {
                    shard.read_bytes.fetch_add(bytes, Ordering::Relaxed);
                }
            }
            CommandKind::Write => {
                shard.writes.fetch_add(1, Ordering::Relaxed);
                if good {
                    shard.write_bytes.fetch_add(bytes, Ordering::Relaxed);
                }
            }
            CommandKind::Other => {
                shard.others.fetch_add(1, Ordering::Relaxed);
            }
        }
        match response.status {
            ScsiStatus::Good | ScsiStatus::ConditionMet => {}
            ScsiStatus::CheckCondition => {
                if let Some(key) = sense_key(&response.sense) {
                    shard.errors[usize::from(key)].fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {
                shard.other_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        shard.latency[bucket(latency)].fetch_add(1, Ordering::Relaxed);
        shard.latency_sum_us.fetch_add(
            latency.as_micros().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }

    /// A command starts executing (see [`IoCounters::end`]).
    pub fn begin(&self) {
        self.shards[shard_index()]
            .begun
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A command begun has finished or been abandoned.
    pub fn end(&self) {
        self.shards[shard_index()]
            .ended
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now (the sum of every thread's shard).
    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::default();
        let (mut begun, mut ended) = (0u64, 0u64);
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for sh in self.shards.iter() {
            s.reads += l(&sh.reads);
            s.writes += l(&sh.writes);
            s.others += l(&sh.others);
            s.read_bytes += l(&sh.read_bytes);
            s.write_bytes += l(&sh.write_bytes);
            for (t, a) in s.errors.iter_mut().zip(&sh.errors) {
                *t += l(a);
            }
            s.other_failures += l(&sh.other_failures);
            for (t, a) in s.latency.iter_mut().zip(&sh.latency) {
                *t += l(a);
            }
            s.latency_sum_us += l(&sh.latency_sum_us);
            begun += l(&sh.begun);
            ended += l(&sh.ended);
        }
        // Shards are read one by one: an end may be seen without its
        // begin for a moment.
        s.in_flight = begun.saturating_sub(ended);
        s
    }
}

/// The sense key of fixed (0x70/0x71) or descriptor (0x72/0x73) sense data.
fn sense_key(sense: &[u8]) -> Option<u8> {
    ethersan_scsi::sense::Sense::parse(sense).map(|s| s.key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethersan_scsi::{ScsiResponse, ScsiStatus};

    #[test]
    fn commands_in_flight_are_begun_less_ended_over_threads() {
        let c = std::sync::Arc::new(IoCounters::default());
        c.begin();
        c.begin();
        let other = c.clone();
        std::thread::spawn(move || other.end()).join().unwrap();
        assert_eq!(c.snapshot().in_flight, 1);
        c.end();
        assert_eq!(c.snapshot().in_flight, 0);
    }

    fn resp(status: ScsiStatus, sense: Vec<u8>) -> ScsiResponse {
        ScsiResponse {
            status,
            sense,
            data_in: Default::default(),
            data_out_len: None,
        }
    }

    #[test]
    fn buckets_are_powers_of_two_of_microseconds() {
        assert_eq!(bucket(Duration::from_nanos(500)), 0);
        assert_eq!(bucket(Duration::from_micros(1)), 0);
        assert_eq!(bucket(Duration::from_micros(2)), 1);
        assert_eq!(bucket(Duration::from_micros(3)), 1);
        assert_eq!(bucket(Duration::from_micros(4)), 2);
        assert_eq!(bucket(Duration::from_micros(1000)), 9);
        assert_eq!(bucket(Duration::from_secs(3600)), LATENCY_BUCKETS - 1);
    }

    #[test]
    fn counts_commands_bytes_errors_and_latency() {
        let c = IoCounters::default();
        let good = resp(ScsiStatus::Good, vec![]);
        c.record(CommandKind::Read, 4096, &good, Duration::from_micros(10));
        c.record(CommandKind::Write, 512, &good, Duration::from_micros(100));
        // A failed write moves no bytes; its sense key is counted.
        let mut fixed = vec![0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x03;
        let medium_error = resp(ScsiStatus::CheckCondition, fixed);
        c.record(
            CommandKind::Write,
            512,
            &medium_error,
            Duration::from_micros(5),
        );
        let desc = resp(
            ScsiStatus::CheckCondition,
            vec![0x72, 0x05, 0x24, 0, 0, 0, 0, 0],
        );
        c.record(CommandKind::Other, 0, &desc, Duration::from_micros(1));
        c.record(
            CommandKind::Other,
            0,
            &resp(ScsiStatus::ReservationConflict, vec![]),
            Duration::from_micros(1),
        );
        let s = c.snapshot();
        assert_eq!((s.reads, s.writes, s.others), (1, 2, 2));
        assert_eq!((s.read_bytes, s.write_bytes), (4096, 512));
        assert_eq!(s.errors[3], 1);
        assert_eq!(s.errors[5], 1);
        assert_eq!(s.other_failures, 1);
        assert_eq!(s.latency.iter().sum::<u64>(), 5);
        assert_eq!(s.latency_sum_us, 117);
    }

    #[test]
    fn counts_from_many_threads_add_up() {
        let c = std::sync::Arc::new(IoCounters::default());
        let good = resp(ScsiStatus::Good, vec![]);
        std::thread::scope(|scope| {
            for _ in 0..(SHARDS + 3) {
                let (c, good) = (c.clone(), good.clone());
                scope.spawn(move || {
                    for _ in 0..1000 {
                        c.record(CommandKind::Read, 512, &good, Duration::from_micros(3));
                    }
                });
            }
        });
        let s = c.snapshot();
        let n = (SHARDS as u64 + 3) * 1000;
        assert_eq!((s.reads, s.read_bytes), (n, n * 512));
        assert_eq!(s.latency[1], n);
        assert_eq!(s.latency_sum_us, n * 3);
    }

    #[test]
    fn kinds_from_the_command_table() {
        assert_eq!(
            CommandKind::of(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]),
            CommandKind::Read
        );
        assert_eq!(CommandKind::of(&[0x8a; 16]), CommandKind::Write);
        assert_eq!(CommandKind::of(&[0x12, 0, 0, 0, 36, 0]), CommandKind::Other);
        assert_eq!(CommandKind::of(&[]), CommandKind::Other);
    }
}
