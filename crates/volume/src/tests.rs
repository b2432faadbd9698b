//! Unit tests of the volume layer over a scripted engine.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ethersan_backend::ram::RamDevice;

use super::*;
use ethersan_backend::IoBuf;

/// How the scripted engine answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Done,
    Pending,
    Blocking,
}

/// A RAM engine that records each write's FUA flag and answers in the
/// mode asked for; pending requests wait in `held` until `release`.
struct Scripted {
    ram: RamDevice,
    mode: Mutex<Mode>,
    fua: Mutex<Vec<bool>>,
    flushes: Mutex<usize>,
    held: Mutex<Vec<(IoResult, IoCompletion)>>,
}

impl std::fmt::Debug for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scripted")
    }
}

impl Scripted {
    fn new(mode: Mode) -> Arc<Scripted> {
        Arc::new(Scripted {
            ram: RamDevice::new(4 << 20, 512).unwrap(),
            mode: Mutex::new(mode),
            fua: Mutex::new(Vec::new()),
            flushes: Mutex::new(0),
            held: Mutex::new(Vec::new()),
        })
    }

    /// Complete every pending request.
    fn release(&self) {
        for (r, done) in std::mem::take(&mut *self.held.lock().unwrap()) {
            done(r);
        }
    }
}

impl BlockDevice for Scripted {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        self.ram.num_blocks()
    }
    fn submit(&self, req: IoRequest, done: IoCompletion) -> Submission {
        match &req {
            IoRequest::Write { fua, .. } => self.fua.lock().unwrap().push(*fua),
            IoRequest::Flush => *self.flushes.lock().unwrap() += 1,
            IoRequest::Read { .. } => {}
        }
        let r = match self.ram.submit(req, Box::new(|_| {})) {
            Submission::Done(r) => r,
            _ => unreachable!("RAM completes inline"),
        };
        match *self.mode.lock().unwrap() {
            Mode::Done => Submission::Done(r),
            Mode::Blocking => Submission::Blocking(Box::new(move || r)),
            Mode::Pending => {
                self.held.lock().unwrap().push((r, done));
                Submission::Pending
            }
        }
    }
    fn describe(&self) -> String {
        "scripted".into()
    }
}

fn channel() -> (IoCompletion, mpsc::Receiver<IoResult>) {
    let (tx, rx) = mpsc::channel();
    (
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
        rx,
    )
}

/// The outcome of a submission, waiting as each answer requires.
fn outcome(s: Submission, rx: &mpsc::Receiver<IoResult>, dev: &Scripted) -> IoResult {
    match s {
        Submission::Done(r) => r,
        Submission::Blocking(job) => job(),
        Submission::Pending => {
            dev.release();
            rx.recv().unwrap()
        }
    }
}

#[test]
fn ranges_are_checked_in_blocks() {
    let v = Volume::new(Scripted::new(Mode::Done), true);
    let cap = v.num_blocks();
    assert_eq!(v.check_range(2, 3).unwrap(), (1024, 1536));
    assert_eq!(v.check_range(cap, 0).unwrap(), (cap * 512, 0));
    for (lba, n) in [(cap, 1), (cap - 1, 2), (u64::MAX, 2)] {
        assert_eq!(
            v.check_range(lba, n),
            Err(VolumeError::OutOfRange {
                lba,
                blocks: n,
                capacity: cap
            })
        );
        let (done, _rx) = channel();
        assert!(v.read(lba, n, IoBuf::new(), done).is_err());
        let (done, _rx) = channel();
        assert!(v.write(lba, n, vec![0; 1024].into(), false, done).is_err());
    }
    let (done, _rx) = channel();
    assert!(matches!(
        v.write(0, 2, vec![0; 1000].into(), false, done),
        Err(VolumeError::ShortData {
            have: 1000,
            need: 1024
        })
    ));
}

#[test]
fn write_cache_off_makes_every_write_fua_and_flush_reaches_the_engine() {
    for mode in [Mode::Done, Mode::Pending, Mode::Blocking] {
        let dev = Scripted::new(mode);
        let v = Volume::new(dev.clone(), true);
        for (wce, fua) in [(true, false), (true, true), (false, false), (false, true)] {
            v.set_write_cache(wce);
            assert_eq!(v.write_cache(), wce);
            let (done, rx) = channel();
            let s = v.write(1, 1, vec![7; 512].into(), fua, done).unwrap();
            outcome(s, &rx, &dev).unwrap();
        }
        assert_eq!(*dev.fua.lock().unwrap(), [false, true, true, true]);
        let (done, rx) = channel();
        outcome(v.flush(done), &rx, &dev).unwrap();
        assert_eq!(*dev.flushes.lock().unwrap(), 1);
        // Only the blocks asked for are written; the read returns them.
        let (done, rx) = channel();
        let s = v.write(2, 1, vec![9; 4096].into(), false, done).unwrap();
        outcome(s, &rx, &dev).unwrap();
        let (done, rx) = channel();
        let s = v.read(1, 3, vec![0xee; 10].into(), done).unwrap();
        let back = outcome(s, &rx, &dev).unwrap();
        assert_eq!(
            back,
            [vec![7; 512], vec![9; 512], vec![0; 512]].concat(),
            "{mode:?}"
        );
    }
}

#[test]
fn a_write_waits_for_an_exclusive_holder_and_holds_its_range_until_done() {
    // An exclusive holder (COMPARE AND WRITE): the write becomes a job that
    // waits for it.
    let dev = Scripted::new(Mode::Done);
    let v = Arc::new(Volume::new(dev.clone(), true));
    let excl = v.ranges().lock(0, 512, true);
    let (done, _rx) = channel();
    let Submission::Blocking(job) = v.write(0, 1, vec![1; 512].into(), false, done).unwrap() else {
        panic!("a write went ahead of an exclusive holder")
    };
    let t = std::thread::spawn(job);
    std::thread::sleep(Duration::from_millis(30));
    assert!(!t.is_finished(), "the write did not wait");
    assert!(
        dev.fua.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
    drop(excl);
    t.join().unwrap().unwrap();
    assert_eq!(dev.fua.lock().unwrap().len(), 1);

    // A pending write holds its range shared until it completes.
    let dev = Scripted::new(Mode::Pending);
    let v = Arc::new(Volume::new(dev.clone(), true));
    let (done, rx) = channel();
    assert!(matches!(
        v.write(0, 1, vec![2; 512].into(), false, done).unwrap(),
        Submission::Pending
    ));
    assert!(
        v.ranges().try_lock_shared(0, 512).is_some(),
        "shared with reads"
    );
    let v2 = v.clone();
    let t = std::thread::spawn(move || drop(v2.ranges().lock(0, 512, true)));
    std::thread::sleep(Duration::from_millis(30));
    assert!(
        !t.is_finished(),
        "exclusive lock taken while a write is in flight"
    );
    dev.release();
    rx.recv().unwrap().unwrap();
    t.join().unwrap();

    // A blocking write holds it until its job has run.
    let dev = Scripted::new(Mode::Blocking);
    let v = Volume::new(dev.clone(), true);
    let (done, _rx) = channel();
    let Submission::Blocking(job) = v.write(0, 1, vec![3; 512].into(), false, done).unwrap() else {
        panic!()
    };
    let v = Arc::new(v);
    let v2 = v.clone();
    let t = std::thread::spawn(move || drop(v2.ranges().lock(0, 512, true)));
    std::thread::sleep(Duration::from_millis(30));
    assert!(!t.is_finished(), "exclusive lock taken before the job ran");
    job().unwrap();
    t.join().unwrap();
}

#[test]
fn engine_errors_classify_as_read_write_or_no_space() {
    let eio = || std::io::Error::from_raw_os_error(5);
    let enospc = || std::io::Error::from_raw_os_error(28);
    let r = BackendError::Read {
        offset: 0,
        cause: eio(),
    };
    assert_eq!(MediumError::of(&r, false), MediumError::Read);
    let w = BackendError::Write {
        offset: 0,
        cause: eio(),
    };
    assert_eq!(MediumError::of(&w, true), MediumError::Write);
    let full = BackendError::Write {
        offset: 0,
        cause: enospc(),
    };
    assert_eq!(MediumError::of(&full, true), MediumError::NoSpace);
    assert_eq!(
        MediumError::of(&BackendError::Flush(eio()), true),
        MediumError::Write
    );
    // A cluster that does not answer: neither a read nor a write error.
    for errno in [110, 108, 107, 111, 113] {
        let e = std::io::Error::from_raw_os_error(errno);
        let r = BackendError::Read {
            offset: 0,
            cause: e,
        };
        assert_eq!(MediumError::of(&r, false), MediumError::Unavailable);
        let f = BackendError::Flush(std::io::Error::from_raw_os_error(errno));
        assert_eq!(MediumError::of(&f, true), MediumError::Unavailable);
    }
}

#[test]
fn a_real_file_engine_through_the_volume() {
    use ethersan_backend::file::{FileDevice, FileOptions, IoEngine};
    let dir = tempfile::tempdir().unwrap();
    for (engine, direct) in [
        (IoEngine::Sync, false),
        (IoEngine::Sync, true),
        (IoEngine::Uring, false),
        (IoEngine::Uring, true),
    ] {
        let dev = FileDevice::open(
            &dir.path().join(format!("{engine}{direct}")),
            &FileOptions {
                size: Some(1 << 20),
                block_size: 512,
                read_only: false,
                preallocate: false,
                direct,
                engine,
            },
        )
        .unwrap();
        let v = Volume::new(Arc::new(dev), false);
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
        let wait = |s: Submission, rx: mpsc::Receiver<IoResult>| match s {
            Submission::Done(r) => r,
            Submission::Blocking(job) => job(),
            Submission::Pending => rx.recv().unwrap(),
        };
        let (done, rx) = channel();
        let s = v.write(8, 8, data.clone().into(), false, done).unwrap();
        // The write cache is off: FUA, which never finishes inline.
        assert!(
            !matches!(s, Submission::Done(_)),
            "{engine} {direct}: {s:?}"
        );
        wait(s, rx).unwrap();
        let (done, rx) = channel();
        let s = v.read(8, 8, IoBuf::new(), done).unwrap();
        if direct {
            assert!(!matches!(s, Submission::Done(_)), "O_DIRECT read inline");
        }
        assert_eq!(wait(s, rx).unwrap(), data);
    }
}
