//! The executor on in-memory logical units: the no-wait path, the
//! blocking pool, a panicking backend, and the counters.

use std::sync::{Arc, Mutex};

use ethersan_backend::{BlockDevice, IoCompletion, IoRequest, Submission};
use ethersan_scsi::{LogicalUnit, LuConfig, Nexus, ScsiStatus, ScsiTarget};

use super::*;

fn config() -> LuConfig {
    LuConfig {
        serial: "s".into(),
        naa: [0x60; 16],
        target_name: "iqn.2026-11.org.ethersan:t".into(),
        ..LuConfig::default()
    }
}

/// A device whose blocking reads panic (a bug in a backend).
#[derive(Debug)]
struct Panicking;

impl BlockDevice for Panicking {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        8
    }
    fn submit(&self, req: IoRequest, _: IoCompletion) -> Submission {
        match req {
            IoRequest::Read { .. } => panic!("backend bug"),
            _ => Submission::Done(Ok(Default::default())),
        }
    }
    fn describe(&self) -> String {
        "panicking".into()
    }
}

fn target(dev: Arc<dyn BlockDevice>) -> Arc<ScsiTarget> {
    let t = Arc::new(ScsiTarget::new(vec![Arc::new(LogicalUnit::new(
        dev,
        config(),
    ))]));
    t.nexus_added(Nexus(1));
    t
}

fn ram() -> Arc<dyn BlockDevice> {
    Arc::new(ethersan_backend::ram::RamDevice::new(1 << 20, 512).unwrap())
}

fn cmd(cdb: &[u8], data: Vec<u8>, expected_len: u32) -> Command {
    Command {
        nexus: Nexus(1),
        initiator: Arc::from("iqn.2026-11.org.ethersan:i"),
        channel_level: None,
        lun: 0,
        cdb: cdb.to_vec(),
        data: data.into(),
        expected_len,
        tag: 7,
        started: std::time::Instant::now(),
        early: None,
        stream: None,
    }
}

/// Jobs kept until the test runs them.
#[derive(Default)]
struct Held(Mutex<Vec<Box<dyn FnOnce() + Send>>>);

impl BlockingPool for Held {
    fn spawn(&self, job: Box<dyn FnOnce() + Send>) {
        self.0.lock().unwrap().push(job);
    }
}

impl Held {
    fn run_all(&self) -> usize {
        let jobs: Vec<_> = std::mem::take(&mut *self.0.lock().unwrap());
        let n = jobs.len();
        for j in jobs {
            j();
        }
        n
    }
}

fn run(
    exec: Executor,
    t: &Arc<ScsiTarget>,
    c: Command,
    counting: Counting,
    pool: &dyn BlockingPool,
) -> Arc<Mutex<Option<Finished>>> {
    let out = Arc::new(Mutex::new(None));
    let o = out.clone();
    if let Some(f) = exec.execute(
        t,
        c,
        counting,
        pool,
        &(Arc::new(move |tag: u32, f| {
            assert_eq!(tag, 7u32);
            *o.lock().unwrap() = Some(f)
        }) as Done),
    ) {
        *out.lock().unwrap() = Some(f);
    }
    out
}

const TUR: [u8; 6] = [0; 6];

fn write10(lba: u8, blocks: u8) -> [u8; 10] {
    [0x2a, 0, 0, 0, 0, lba, 0, 0, blocks, 0]
}

fn read10(lba: u8, blocks: u8) -> [u8; 10] {
    [0x28, 0, 0, 0, 0, lba, 0, 0, blocks, 0]
}

#[test]
fn a_ram_lun_completes_on_the_callers_thread_and_is_counted() {
    let t = target(ram());
    let exec = Executor { inline_io: true };
    let lun = Arc::new(IoCounters::default());
    let ini = Arc::new(IoCounters::default());
    let counting = Counting {
        lun: Some(lun.clone()),
        initiator: Some(ini.clone()),
        session: None,
    };
    let pool = Held::default();
    // The POWER ON unit attention first.
    let f = run(exec, &t, cmd(&TUR, vec![], 0), counting.clone(), &pool);
    let f = f.lock().unwrap().take().expect("done at once");
    assert_eq!(f.response.status, ScsiStatus::CheckCondition);
    let f = run(
        exec,
        &t,
        cmd(&write10(1, 2), vec![7; 1024], 1024),
        counting.clone(),
        &pool,
    );
    assert_eq!(
        f.lock().unwrap().take().unwrap().response.status,
        ScsiStatus::Good
    );
    let f = run(
        exec,
        &t,
        cmd(&read10(1, 2), vec![], 1024),
        counting.clone(),
        &pool,
    );
    let f = f.lock().unwrap().take().unwrap();
    assert_eq!(f.response.data_in, vec![7; 1024]);
    assert!(f.preempted.is_empty());
    assert_eq!(pool.run_all(), 0, "nothing went to the blocking pool");
    for c in [&lun, &ini] {
        let s = c.snapshot();
        assert_eq!((s.reads, s.writes, s.others), (1, 1, 1));
        assert_eq!((s.read_bytes, s.write_bytes), (1024, 1024));
        assert_eq!(s.errors[6], 1, "the unit attention");
    }
}

#[test]
fn a_command_finished_at_once_is_returned_and_done_is_not_called() {
    let t = target(ram());
    let exec = Executor { inline_io: true };
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = calls.clone();
    let done: Done = Arc::new(move |_, _| {
        c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let pool = Held::default();
    let first = exec.execute(&t, cmd(&TUR, vec![], 0), Counting::default(), &pool, &done);
    assert_eq!(
        first.expect("returned").response.status,
        ScsiStatus::CheckCondition
    );
    let second = exec.execute(&t, cmd(&TUR, vec![], 0), Counting::default(), &pool, &done);
    assert_eq!(second.expect("returned").response.status, ScsiStatus::Good);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(pool.run_all(), 0);
}

#[test]
fn without_the_inline_attempt_a_command_goes_to_the_pool() {
    let t = target(ram());
    let exec = Executor { inline_io: false };
    let pool = Held::default();
    let f = run(exec, &t, cmd(&TUR, vec![], 0), Counting::default(), &pool);
    assert!(
        f.lock().unwrap().is_none(),
        "not done before the pool runs it"
    );
    assert_eq!(pool.run_all(), 1);
    let f = f.lock().unwrap().take().unwrap();
    assert_eq!(f.response.status, ScsiStatus::CheckCondition);
}

#[test]
fn a_panic_in_emulation_becomes_internal_target_failure() {
    let t = target(Arc::new(Panicking));
    let exec = Executor { inline_io: true };
    let lun = Arc::new(IoCounters::default());
    let counting = Counting {
        lun: Some(lun.clone()),
        initiator: None,
        session: None,
    };
    run(exec, &t, cmd(&TUR, vec![], 0), counting.clone(), &Inline);
    let f = run(exec, &t, cmd(&read10(0, 1), vec![], 512), counting, &Inline);
    let f = f.lock().unwrap().take().expect("the pool ran it inline");
    assert_eq!(f.response.status, ScsiStatus::CheckCondition);
    assert_eq!(f.response.sense[2] & 0x0f, 0x04);
    assert_eq!((f.response.sense[12], f.response.sense[13]), (0x44, 0x00));
    assert_eq!(lun.snapshot().errors[4], 1);
    // The unit still answers.
    let f = run(exec, &t, cmd(&TUR, vec![], 0), Counting::default(), &Inline);
    assert_eq!(
        f.lock().unwrap().take().unwrap().response.status,
        ScsiStatus::Good
    );
}

#[test]
fn a_command_is_in_flight_until_it_finishes_or_is_dropped() {
    let t = target(ram());
    let exec = Executor { inline_io: false };
    let lun = Arc::new(IoCounters::default());
    let counting = Counting {
        lun: Some(lun.clone()),
        ..Counting::default()
    };
    let pool = Held::default();
    let f = run(exec, &t, cmd(&TUR, vec![], 0), counting.clone(), &pool);
    assert_eq!(lun.snapshot().in_flight, 1, "waiting in the pool");
    pool.run_all();
    assert!(f.lock().unwrap().is_some());
    assert_eq!(lun.snapshot().in_flight, 0, "finished");
    // A job that never runs (its session ended) stops counting when it
    // is dropped.
    let _f = run(exec, &t, cmd(&TUR, vec![], 0), counting, &pool);
    assert_eq!(lun.snapshot().in_flight, 1);
    drop(std::mem::take(&mut *pool.0.lock().unwrap()));
    assert_eq!(lun.snapshot().in_flight, 0, "abandoned");
}
