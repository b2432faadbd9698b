//! The io_uring engine through [`FileDevice`](crate::file::FileDevice):
//! both descriptors, FUA and flush, errors, many requests in flight, and a
//! thread with its own ring.

use std::sync::mpsc;

use crate::file::{FileDevice, FileOptions, IoEngine};
use crate::{BackendError, BlockDevice, BlockDeviceExt, IoRequest, Submission};

fn open(path: &std::path::Path, size: Option<u64>, ro: bool, direct: bool) -> FileDevice {
    FileDevice::open(
        path,
        &FileOptions {
            size,
            block_size: 512,
            read_only: ro,
            preallocate: false,
            direct,
            engine: IoEngine::Uring,
        },
    )
    .unwrap()
}

/// Submit and wait for the outcome.
fn run(d: &FileDevice, req: IoRequest) -> Result<crate::IoBuf, BackendError> {
    let (tx, rx) = mpsc::channel();
    d.uring()
        .expect("uring engine")
        .submit(req, Box::new(move |r| tx.send(r).unwrap()));
    rx.recv().unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

#[test]
fn round_trip_fua_flush_buffered_and_direct() {
    let dir = tempfile::tempdir().unwrap();
    for direct in [false, true] {
        let d = open(
            &dir.path().join(format!("r{direct}")),
            Some(4 << 20),
            false,
            direct,
        );
        assert_eq!(
            d.engine(),
            IoEngine::Uring,
            "io_uring refused on this kernel"
        );
        for (i, (off, len, fua)) in [
            (0u64, 4096usize, false),
            (8192, 131072, true),
            (1 << 20, 512 * 3, false),
        ]
        .into_iter()
        .enumerate()
        {
            let data = pattern(len, i as u8);
            let r = run(
                &d,
                IoRequest::Write {
                    offset: off,
                    data: data.clone().into(),
                    len,
                    fua,
                },
            );
            assert!(r.unwrap().is_empty());
            assert_eq!(run(&d, IoRequest::read(off, len)).unwrap(), data);
            // The blocking engine sees the same bytes.
            let mut back = vec![0u8; len];
            d.read_at(off, &mut back).unwrap();
            assert_eq!(back, data);
        }
        // Only `len` bytes of a longer buffer are written.
        let r = run(
            &d,
            IoRequest::Write {
                offset: 0,
                data: vec![7u8; 8192].into(),
                len: 512,
                fua: false,
            },
        );
        r.unwrap();
        let got = run(&d, IoRequest::read(0, 1024)).unwrap();
        assert!(got[..512].iter().all(|b| *b == 7));
        assert_eq!(got[512..], pattern(4096, 0)[512..1024]);
        run(&d, IoRequest::Flush).unwrap();
        assert!(run(&d, IoRequest::read(0, 0)).unwrap().is_empty());
    }
}

#[test]
fn reads_past_the_end_fail_as_read_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = open(&dir.path().join("short"), Some(8192), false, false);
    // Entirely past the end, and straddling it (a short read, then EOF).
    for (off, len) in [(8192u64, 512usize), (4096, 8192)] {
        match run(&d, IoRequest::read(off, len)) {
            Err(BackendError::Read { cause: source, .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof)
            }
            other => panic!("read at {off}: {other:?}"),
        }
    }
    assert_eq!(run(&d, IoRequest::read(4096, 4096)).unwrap().len(), 4096);
}

#[test]
fn writes_to_a_read_only_store_fail_as_write_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ro");
    drop(open(&p, Some(8192), false, false));
    let d = open(&p, None, true, false);
    match run(
        &d,
        IoRequest::Write {
            offset: 0,
            data: vec![1; 512].into(),
            len: 512,
            fua: true,
        },
    ) {
        Err(BackendError::Write {
            offset: 0,
            cause: source,
        }) => {
            assert_eq!(source.raw_os_error(), Some(libc::EBADF))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(run(&d, IoRequest::read(0, 512)).unwrap(), vec![0; 512]);
}

#[test]
fn many_in_flight_all_complete_also_when_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let d = open(&dir.path().join("many"), Some(16 << 20), false, true);
    let (tx, rx) = mpsc::channel();
    // More than the ring and the in-flight limit hold.
    let n = 2000usize;
    for i in 0..n {
        let tx = tx.clone();
        let off = (i as u64 % 4096) * 4096;
        let req = if i % 2 == 0 {
            IoRequest::Write {
                offset: off,
                data: vec![i as u8; 4096].into(),
                len: 4096,
                fua: false,
            }
        } else {
            IoRequest::read(off, 4096)
        };
        d.uring()
            .unwrap()
            .submit(req, Box::new(move |r| tx.send(r.is_ok()).unwrap()));
    }
    drop(tx);
    // Dropping the device waits for the ring thread to finish them.
    drop(d);
    let results: Vec<bool> = rx.iter().collect();
    assert_eq!(results.len(), n);
    assert!(results.iter().all(|ok| *ok));
}

#[test]
fn buffered_reads_from_the_page_cache_finish_inline_direct_ones_go_pending() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p");
    let d = open(&p, Some(1 << 20), false, false);
    let data = pattern(8192, 5);
    d.write_at(8192, &data, true).unwrap();
    // In the page cache: done inline (RWF_NOWAIT), no completion.
    match d.submit(
        IoRequest::Read {
            offset: 8192,
            len: 8192,
            buf: vec![0xee; 100].into(),
        },
        Box::new(|_| panic!("went pending")),
    ) {
        Submission::Done(r) => assert_eq!(r.unwrap(), data),
        other => panic!("{other:?}"),
    }
    // A FUA write and a flush go to the ring.
    let (tx, rx) = mpsc::channel();
    for req in [
        IoRequest::Write {
            offset: 0,
            data: data.clone().into(),
            len: 4096,
            fua: true,
        },
        IoRequest::Flush,
    ] {
        let tx = tx.clone();
        let s = d.submit(req, Box::new(move |r| tx.send(r).unwrap()));
        assert!(matches!(s, Submission::Pending), "{s:?}");
        rx.recv().unwrap().unwrap();
    }
    drop(d);
    // O_DIRECT: always pending, the same bytes, garbage never returned.
    let d = open(&p, None, false, true);
    for _ in 0..3 {
        let (tx, rx) = mpsc::channel();
        let req = IoRequest::Read {
            offset: 8192,
            len: 8192,
            buf: vec![0xee; 20000].into(),
        };
        let s = d.submit(req, Box::new(move |r| tx.send(r).unwrap()));
        assert!(matches!(s, Submission::Pending), "{s:?}");
        assert_eq!(rx.recv().unwrap().unwrap(), data);
    }
}
/// Turn `ring` until `n` completions ran (or fail after 10 s).
fn turn_until(ring: &super::LocalRing, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = 0;
    while seen < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{seen} of {n} completions"
        );
        seen += ring.turn();
        std::thread::yield_now();
    }
}

#[test]
fn a_thread_with_its_own_ring_submits_and_completes_on_itself() {
    let dir = tempfile::tempdir().unwrap();
    let d = open(&dir.path().join("local"), Some(16 << 20), false, true);
    let ring = super::LocalRing::install(8).unwrap();
    // A second ring on the same thread is refused.
    assert!(super::LocalRing::install(8).is_err());
    let me = std::thread::current().id();
    let (tx, rx) = mpsc::channel();
    // More than the ring's entries and its in-flight limit: the rest
    // wait in its queue and go in as earlier ones finish.
    let n = 1200usize;
    for i in 0..n {
        let tx = tx.clone();
        let off = (i as u64 % 4000) * 4096;
        let req = IoRequest::Write {
            offset: off,
            data: pattern(4096, i as u8).into(),
            len: 4096,
            fua: i % 100 == 0,
        };
        let s = d.submit(
            req,
            Box::new(move |r| {
                tx.send((std::thread::current().id(), r.is_ok())).unwrap();
            }),
        );
        assert!(matches!(s, Submission::Pending), "{s:?}");
    }
    // Nothing completes until this thread turns its ring.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(rx.try_recv().is_err(), "a completion ran on another thread");
    turn_until(&ring, n);
    for _ in 0..n {
        let (tid, ok) = rx.recv().unwrap();
        assert_eq!(tid, me);
        assert!(ok);
    }
    // Reads of the last writes, through the ring.
    for i in (n - 200)..n {
        let tx = tx.clone();
        let off = (i as u64 % 4000) * 4096;
        let s = d.submit(
            IoRequest::read(off, 4096),
            Box::new(move |r| {
                tx.send((
                    std::thread::current().id(),
                    r.unwrap() == pattern(4096, i as u8),
                ))
                .unwrap();
            }),
        );
        assert!(matches!(s, Submission::Pending));
        // Queue depth 1 goes into the kernel at once: it completes
        // without a turn entering it.
        if i == n - 200 {
            assert_eq!(ring.in_flight(), 1);
        }
    }
    turn_until(&ring, 200);
    for _ in 0..200 {
        let (tid, same) = rx.recv().unwrap();
        assert_eq!(tid, me);
        assert!(same, "read back other bytes");
    }
    // A blocking wait on this thread goes through the device's own
    // ring (only this thread could turn its ring): no deadlock.
    let mut back = vec![0u8; 4096];
    d.read_at(((n - 1) as u64 % 4000) * 4096, &mut back)
        .unwrap();
    assert_eq!(back, pattern(4096, (n - 1) as u8));
    drop(ring);
    drop(tx);
}

#[test]
fn dropping_a_local_ring_waits_for_its_io_and_runs_the_completions() {
    let dir = tempfile::tempdir().unwrap();
    let d = open(&dir.path().join("drop"), Some(16 << 20), false, true);
    let ring = super::LocalRing::install(64).unwrap();
    let (tx, rx) = mpsc::channel();
    for i in 0..300u64 {
        let tx = tx.clone();
        let req = if i % 2 == 0 {
            IoRequest::Write {
                offset: i * 4096,
                data: vec![i as u8; 4096].into(),
                len: 4096,
                fua: false,
            }
        } else {
            IoRequest::read(i * 4096, 4096)
        };
        d.submit(req, Box::new(move |r| tx.send(r.is_ok()).unwrap()));
    }
    ring.turn();
    drop(ring);
    drop(tx);
    let all: Vec<bool> = rx.iter().collect();
    assert_eq!(all.len(), 300);
    assert!(all.iter().all(|ok| *ok));
    // Without a ring, the thread's requests go to the device's ring.
    let (tx, rx) = mpsc::channel();
    d.submit(
        IoRequest::read(0, 4096),
        Box::new(move |r| tx.send(r.map(|v| v[0])).unwrap()),
    );
    assert_eq!(
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .unwrap()
            .unwrap(),
        0
    );
}

#[test]
fn adjacent_requests_of_one_turn_go_as_one_and_come_back_each_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    // Direct: buffered requests finish inline from the page cache.
    {
        let direct = true;
        let d = open(
            &dir.path().join(format!("m{direct}")),
            Some(16 << 20),
            false,
            direct,
        );
        let ring = super::LocalRing::install(64).unwrap();
        let (tx, rx) = mpsc::channel();
        // The first finds the ring idle and goes in at once; the others
        // wait for the turn and merge: 8 writes of 64K, then (elsewhere)
        // a FUA write that must not join them, then 4 writes of 256K
        // that are too large to join.
        let mut sizes = vec![(0u64, 4096usize, false)];
        sizes.extend((0..8).map(|i| (65536 + i * 65536, 65536, false)));
        sizes.push((65536 + 8 * 65536, 65536, true));
        sizes.extend((0..4).map(|i| ((4 << 20) + i * 262144, 262144, false)));
        for (i, &(off, len, fua)) in sizes.iter().enumerate() {
            let tx = tx.clone();
            let req = IoRequest::Write {
                offset: off,
                data: crate::IoBuf::aligned_copy_of(&pattern(len, i as u8)),
                len,
                fua,
            };
            d.submit(req, Box::new(move |r| tx.send(r.is_ok()).unwrap()));
        }
        turn_until(&ring, sizes.len());
        assert!((0..sizes.len()).all(|_| rx.recv().unwrap()));
        assert_eq!(
            ring.merged(),
            8,
            "direct {direct}: the 64K run, not the FUA one"
        );
        // Reads of the same ranges in one turn: the same run merges.
        let (tx, rx) = mpsc::channel();
        for (i, &(off, len, _)) in sizes.iter().enumerate() {
            let tx = tx.clone();
            d.submit(
                IoRequest::read(off, len),
                Box::new(move |r| tx.send((i, r.unwrap())).unwrap()),
            );
        }
        turn_until(&ring, sizes.len());
        for _ in 0..sizes.len() {
            let (i, got) = rx.recv().unwrap();
            assert!(
                got == pattern(sizes[i].1, i as u8),
                "direct {direct}: request {i}"
            );
        }
        // 8 64K reads and the FUA write's range (a read has no FUA).
        assert_eq!(ring.merged(), 8 + 9);
        drop(ring);
    }
}

#[test]
fn a_merged_read_that_falls_short_finishes_each_request_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let size = 1 << 20;
    let d = open(&dir.path().join("short"), Some(size), false, true);
    let data = pattern(65536, 3);
    d.write_at(size - 65536, &data, false).unwrap();
    let ring = super::LocalRing::install(64).unwrap();
    let (tx, rx) = mpsc::channel();
    // An idle-ring read first, then a run across the end of the file.
    let offs = [0, size - 131072, size - 65536, size, size + 65536];
    for (i, &off) in offs.iter().enumerate() {
        let tx = tx.clone();
        d.submit(
            IoRequest::read(off, 65536),
            Box::new(move |r| tx.send((i, r)).unwrap()),
        );
    }
    turn_until(&ring, offs.len());
    assert_eq!(ring.merged(), 4);
    let mut got: Vec<_> = (0..offs.len()).map(|_| rx.recv().unwrap()).collect();
    got.sort_by_key(|(i, _)| *i);
    assert!(got[2].1.as_ref().unwrap()[..] == data[..]);
    assert!(got[1].1.is_ok());
    for (i, r) in &got[3..] {
        match r {
            Err(BackendError::Read { offset, .. }) => assert_eq!(*offset, offs[*i]),
            other => panic!("read {i} past the end: {other:?}"),
        }
    }
}

/// Write `writes` (offset, data, FUA) through `d` in one turn of `ring`,
/// after a write elsewhere that finds the ring idle (it goes in alone, so
/// the others wait for the turn and merge); each must come back Ok.
fn write_in_one_turn(
    ring: &super::LocalRing,
    d: &FileDevice,
    writes: Vec<(u64, crate::IoBuf, usize, bool)>,
) {
    let (tx, rx) = mpsc::channel();
    let starter = (15u64 << 20, crate::IoBuf::aligned(4096), 4096, false);
    let n = writes.len() + 1;
    for (i, (offset, data, len, fua)) in std::iter::once(starter).chain(writes).enumerate() {
        let tx = tx.clone();
        let req = IoRequest::Write {
            offset,
            data,
            len,
            fua,
        };
        let s = d.submit(req, Box::new(move |r| tx.send((i, r)).unwrap()));
        assert!(matches!(s, Submission::Pending), "write {i}: {s:?}");
    }
    turn_until(ring, n);
    for _ in 0..n {
        let (i, r) = rx.recv().unwrap();
        assert!(r.unwrap().is_empty(), "write {i}");
    }
}

#[test]
fn fua_writes_merge_only_among_themselves_and_keep_their_fua() {
    let dir = tempfile::tempdir().unwrap();
    let d = open(&dir.path().join("fua"), Some(16 << 20), false, true);
    let ring = super::LocalRing::install(64).unwrap();
    const L: usize = 16384;
    // Three runs of adjacent 16K writes, apart from each other:
    // - six FUA writes: one merged FUA write;
    // - FUA and not in turn: no two neighbours agree, nothing merges;
    // - not, not, FUA, FUA, FUA, not, not, FUA: three merged writes (2,
    //   3 FUA, 2) and a lone FUA write (its neighbour is not FUA).
    let mut runs: Vec<(u64, bool)> = (0..6).map(|i| ((1 << 20) + i * L as u64, true)).collect();
    runs.extend((0..6).map(|i| ((2 << 20) + i * L as u64, i % 2 == 1)));
    let mixed = [false, false, true, true, true, false, false, true];
    runs.extend(
        mixed
            .iter()
            .enumerate()
            .map(|(i, &fua)| ((3 << 20) + (i * L) as u64, fua)),
    );
    let writes = runs
        .iter()
        .enumerate()
        .map(|(i, &(off, fua))| {
            let data = crate::IoBuf::aligned_copy_of(&pattern(L, 100 + i as u8));
            (off, data, L, fua)
        })
        .collect();
    write_in_one_turn(&ring, &d, writes);
    assert_eq!(
        ring.merged(),
        6 + 2 + 3 + 2,
        "the FUA run and the mixed run's groups"
    );
    assert_eq!(
        ring.merged_fua(),
        6 + 3,
        "every FUA write that went merged went in a RWF_DSYNC write, and no other"
    );
    // Every request's own bytes, through the ring (the reads of each run
    // merge: a read has no FUA) and through the blocking engine.
    let (tx, rx) = mpsc::channel();
    for (i, &(off, _)) in runs.iter().enumerate() {
        let tx = tx.clone();
        d.submit(
            IoRequest::read(off, L),
            Box::new(move |r| tx.send((i, r)).unwrap()),
        );
    }
    turn_until(&ring, runs.len());
    for _ in 0..runs.len() {
        let (i, r) = rx.recv().unwrap();
        assert!(r.unwrap() == pattern(L, 100 + i as u8), "request {i}");
    }
    // The first read went alone (idle ring), the rest as three runs.
    assert_eq!(ring.merged(), 13 + runs.len() as u64 - 1);
    assert_eq!(ring.merged_fua(), 9, "reads are never FUA");
    for (i, &(off, _)) in runs.iter().enumerate() {
        let mut back = vec![0u8; L];
        d.read_at(off, &mut back).unwrap();
        assert!(back == pattern(L, 100 + i as u8), "request {i}");
    }
    drop(ring);
}

/// `data` in a buffer whose data starts `skew` bytes past an aligned
/// address (unaligned for `O_DIRECT` unless `skew` is a multiple of 4096),
/// followed by `extra` bytes that are not part of the request.
fn skewed(data: &[u8], skew: usize, extra: usize) -> crate::IoBuf {
    let mut all = vec![0xa5u8; skew];
    all.extend_from_slice(data);
    all.resize(skew + data.len() + extra, 0x5a);
    let (raw, start) = crate::IoBuf::aligned_copy_of(&all).into_parts();
    let b = crate::IoBuf::from_parts(raw, start + skew);
    assert_eq!(b.is_aligned(), skew.is_multiple_of(4096));
    b
}

#[test]
fn unaligned_buffers_in_a_merged_run_are_bounced_and_keep_their_place() {
    let dir = tempfile::tempdir().unwrap();
    let d = open(&dir.path().join("skew"), Some(16 << 20), false, true);
    assert!(d.is_direct());
    let ring = super::LocalRing::install(64).unwrap();
    const L: usize = 16384;
    // A run of 16K writes, every other one from unaligned memory (one
    // with bytes beyond its length), then a run of 512-byte writes (whole
    // blocks at offsets that are not 4K-aligned) all from unaligned
    // memory.
    let mut writes = Vec::new();
    let mut expect = Vec::new();
    let mut unaligned = 0u64;
    for (i, (skew, extra)) in [(0, 0), (1, 0), (0, 0), (512, 3000), (0, 0), (7, 0)]
        .into_iter()
        .enumerate()
    {
        let off = (1 << 20) + (i * L) as u64;
        let data = pattern(L, 40 + i as u8);
        let buf = skewed(&data, skew, extra);
        if !buf.is_aligned() {
            unaligned += L as u64;
        }
        writes.push((off, buf, L, false));
        expect.push((off, data));
    }
    for i in 0..4 {
        let off = (2 << 20) + 512 + (i * 512) as u64;
        let data = pattern(512, 60 + i as u8);
        writes.push((off, skewed(&data, 1 + i, 0), 512, false));
        unaligned += 512;
        expect.push((off, data));
    }
    let bounced = d.bounced_bytes();
    write_in_one_turn(&ring, &d, writes);
    // The engine copies unaligned memory to aligned memory when the
    // request starts (only the request's bytes), so those writes still
    // join their runs: all of them went merged.
    assert_eq!(d.bounced_bytes() - bounced, unaligned);
    assert_eq!(ring.merged(), 6 + 4);
    // Reads of the same ranges in one turn, into unaligned buffers full of
    // other bytes: each comes back aligned (where O_DIRECT put it) with
    // its own data; nothing is bounced for a read.
    let (tx, rx) = mpsc::channel();
    for (i, (off, data)) in expect.iter().enumerate() {
        let tx = tx.clone();
        let req = IoRequest::Read {
            offset: *off,
            len: data.len(),
            buf: skewed(&vec![0xee; data.len()], 3 + i, 100),
        };
        d.submit(req, Box::new(move |r| tx.send((i, r)).unwrap()));
    }
    turn_until(&ring, expect.len());
    for _ in 0..expect.len() {
        let (i, r) = rx.recv().unwrap();
        let got = r.unwrap();
        assert!(got.is_aligned(), "read {i}");
        assert!(got == expect[i].1, "read {i}");
    }
    // The first read found the ring idle and went alone.
    assert_eq!(ring.merged(), 10 + 5 + 4);
    assert_eq!(d.bounced_bytes() - bounced, unaligned);
    for (i, (off, data)) in expect.iter().enumerate() {
        let mut back = vec![0u8; data.len()];
        d.read_at(*off, &mut back).unwrap();
        assert!(back == *data, "request {i}");
    }
    drop(ring);
}

/// A run that starts where a request in the kernel ends waits for it and
/// grows with what arrives meanwhile; then goes as one merged request.
/// Driven on a bare core, so "in the kernel" is certain: the first read's
/// SQE is built but the ring is not entered until the test says so.
#[test]
fn a_run_that_follows_a_request_in_the_kernel_waits_for_it_and_grows() {
    let dir = tempfile::tempdir().unwrap();
    let d = open(&dir.path().join("f"), Some(4 << 20), false, true);
    let data = pattern(1 << 20, 5);
    d.write_at(0, &data, false).unwrap();
    let files = d.uring().expect("uring").files.clone();
    let mut core = super::core::Core::new(64).unwrap();
    let (tx, rx) = mpsc::channel();
    let job = |off: u64, len: usize| super::Job {
        req: IoRequest::read(off, len),
        done: {
            let tx = tx.clone();
            Box::new(move |r| tx.send((off, r.unwrap())).unwrap())
        },
        files: files.clone(),
    };
    let k = 65536usize;
    core.start(job(0, k));
    core.flush_unsent();
    assert_eq!(core.ring.submission().len(), 1, "the first read alone");
    // Two turns of followers while the first is still unsubmitted to the
    // kernel (so certainly unfinished): they wait and grow.
    core.start(job(k as u64, k));
    core.start(job(2 * k as u64, k));
    core.flush_unsent();
    core.start(job(4 * k as u64, k));
    core.start(job(3 * k as u64, k));
    core.flush_unsent();
    assert_eq!(core.ring.submission().len(), 1, "the followers wait");
    assert_eq!(core.followed, 2);
    // A random read does not wait.
    core.start(job(3 << 20, 4096));
    core.flush_unsent();
    assert_eq!(core.ring.submission().len(), 2);
    // Let the first finish: the four followers go as one request.
    let mut got = Vec::new();
    while got.len() < 6 {
        core.enter();
        core.ring.submit_and_wait(1).unwrap();
        core.reap();
        super::core::run_ready(std::mem::take(&mut core.ready));
        while let Ok(r) = rx.try_recv() {
            got.push(r);
        }
    }
    assert_eq!(core.groups_built, 1);
    assert_eq!(core.merged, 4);
    for (off, buf) in got {
        let want = if off == 3 << 20 {
            vec![0u8; 4096]
        } else {
            data[off as usize..off as usize + k].to_vec()
        };
        assert!(buf[..] == want[..], "read at {off}");
    }
}

/// A device that reads ahead: only a store this process holds alone, the
/// reads of a sequential stream answered from predictions with the right
/// bytes, and a write inside the predicted window read back new.
#[test]
fn sequential_reads_are_read_ahead_and_a_write_drops_what_it_overlaps() {
    use crate::lock::{LockMode, Locking};
    let dir = tempfile::tempdir().unwrap();
    let o = FileOptions {
        size: Some(16 << 20),
        block_size: 512,
        read_only: false,
        preallocate: false,
        direct: true,
        engine: IoEngine::Uring,
    };
    let p = dir.path().join("ra");
    let plain = FileDevice::open(&p, &o).unwrap();
    assert_eq!(plain.readahead_stats(), None, "no lock: no read-ahead");
    drop(plain);
    let d = FileDevice::open_locked(&p, &o, Locking::Take(LockMode::Exclusive)).unwrap();
    let data = pattern(8 << 20, 9);
    d.write_at(0, &data, false).unwrap();
    let read =
        |off: u64, len: usize| crate::submit_and_wait(&d, IoRequest::read(off, len)).unwrap();
    let k = 128 * 1024;
    for i in 0..8u64 {
        let off = i * k as u64;
        assert!(
            read(off, k)[..] == data[off as usize..off as usize + k],
            "read {i}"
        );
    }
    let (hits, issued) = d.readahead_stats().unwrap();
    assert!(hits >= 5, "reads 2.. take predictions: {hits}");
    assert!(issued >= 4 << 20, "a window ahead: {issued}");
    // Let the window land, then overwrite a block inside it.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let new = pattern(k, 77);
    let at = 12 * k as u64;
    crate::submit_and_wait(
        &d,
        IoRequest::Write {
            offset: at + 512,
            data: crate::IoBuf::aligned_copy_of(&new[..4096]),
            len: 4096,
            fua: false,
        },
    )
    .unwrap();
    let mut want = data[at as usize..at as usize + k].to_vec();
    want[512..512 + 4096].copy_from_slice(&new[..4096]);
    for i in 8..16u64 {
        let off = i * k as u64;
        let got = read(off, k);
        if off == at {
            assert!(got[..] == want[..], "the overwritten read sees the write");
        } else {
            assert!(got[..] == data[off as usize..off as usize + k], "read {i}");
        }
    }
}
