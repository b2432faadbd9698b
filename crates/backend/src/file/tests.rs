//! Tests of the file engines (sync and io_uring, buffered and `O_DIRECT`).

use super::*;
use crate::BlockDeviceExt;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// A completion for requests that must not go pending.
pub(crate) fn never() -> IoCompletion {
    Box::new(|_| panic!("completion called for a request that did not go pending"))
}

pub(crate) fn write(offset: u64, data: &[u8], fua: bool) -> IoRequest {
    IoRequest::Write {
        offset,
        data: data.to_vec().into(),
        len: data.len(),
        fua,
    }
}

fn opts(size: Option<u64>, bs: u32) -> FileOptions {
    FileOptions {
        size,
        block_size: bs,
        read_only: false,
        preallocate: false,
        direct: false,
        engine: IoEngine::Sync,
    }
}

#[test]
fn creates_sparse_and_keeps_size() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sub/lun.img");
    // A missing directory is an error, not made.
    let e = FileDevice::open(&p, &opts(Some(64 << 20), 512)).unwrap_err();
    assert!(
        e.to_string()
            .contains("sub does not exist; create it first"),
        "{e}"
    );
    assert!(!dir.path().join("sub").exists());
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let d = FileDevice::open(&p, &opts(Some(64 << 20), 512)).unwrap();
    assert_eq!(d.num_blocks(), (64 << 20) / 512);
    let meta = std::fs::metadata(&p).unwrap();
    assert!(meta.blocks() * 512 < 1 << 20, "file is not sparse");
    drop(d);
    let d = FileDevice::open(&p, &opts(None, 4096)).unwrap();
    assert_eq!(d.num_blocks(), (64 << 20) / 4096);
    // Grow sparsely, never shrink.
    let d = FileDevice::open(&p, &opts(Some(128 << 20), 512)).unwrap();
    assert_eq!(d.num_blocks(), (128 << 20) / 512);
    assert!(FileDevice::open(&p, &opts(Some(1 << 20), 512)).is_err());
    assert!(FileDevice::open(&dir.path().join("missing"), &opts(None, 512)).is_err());
    assert!(FileDevice::open(&dir.path().join("odd"), &opts(Some(1000), 512)).is_err());
}

#[test]
fn nonblocking_reads_and_writes_move_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let d = FileDevice::open(&dir.path().join("nb.img"), &opts(Some(1 << 20), 512)).unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    // A page-aligned write is taken without waiting (RWF_NOWAIT or the
    // inline path); so is one that covers part of a page already in the
    // page cache; one into a page that is not is left to the blocking
    // path (a hole reads without I/O on tmpfs, so there it counts as
    // cached).
    assert!(matches!(
        d.submit(write(4096, &data, false), never()),
        Submission::Done(Ok(_))
    ));
    assert!(matches!(
        d.submit(write(4096 + 512, &data[512..1024], false), never()),
        Submission::Done(Ok(_))
    ));
    let cached = d.page_cached(0);
    assert!(
        !matches!(
            d.submit(write(512, &data[..512], false), never()),
            Submission::Done(_)
        ) || cached
            || d.nowait_writes.load(Ordering::Relaxed)
    );
    // A FUA write and a flush always wait.
    assert!(matches!(
        d.submit(write(4096, &data, true), never()),
        Submission::Blocking(_)
    ));
    assert!(matches!(
        d.submit(IoRequest::Flush, never()),
        Submission::Blocking(_)
    ));
    // Just written: in the page cache, so readable without waiting,
    // into a reused buffer that held garbage, none of which comes back.
    let garbage = vec![0xee; 16384];
    let ptr = garbage.as_ptr();
    let req = IoRequest::Read {
        offset: 4096,
        len: 8192,
        buf: garbage.into(),
    };
    let Submission::Done(Ok(back)) = d.submit(req, never()) else {
        panic!("page-cache read did not complete inline")
    };
    assert_eq!(back, data);
    assert_eq!(back.as_ptr(), ptr, "the read reused the buffer given");
    let mut again = vec![0u8; 8192];
    d.read_at(4096, &mut again).unwrap();
    assert_eq!(again, data);
}

#[test]
fn roundtrip_fua_and_threads() {
    let dir = tempfile::tempdir().unwrap();
    for bs in [512u32, 4096] {
        let d = Arc::new(
            FileDevice::open(&dir.path().join(format!("l{bs}")), &opts(Some(8 << 20), bs)).unwrap(),
        );
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    let buf = vec![t + 1; bs as usize * 8];
                    d.write_at(u64::from(t) * (1 << 20), &buf, t % 2 == 0)
                        .unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        d.flush().unwrap();
        for t in 0..4u8 {
            let mut back = vec![0u8; bs as usize * 8];
            d.read_at(u64::from(t) * (1 << 20), &mut back).unwrap();
            assert!(back.iter().all(|b| *b == t + 1));
        }
        d.prefetch(0, 4096).unwrap();
    }
}

#[test]
fn unmap_punches_holes_and_lba_status_sees_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = FileDevice::open(&dir.path().join("thin.img"), &opts(Some(16 << 20), 4096)).unwrap();
    assert!(d.thin_provisioned());
    assert_eq!(d.lba_status(0, 1 << 20).unwrap(), (false, 1 << 20));
    d.write_at(4 << 20, &vec![1u8; 1 << 20], false).unwrap();
    let (mapped, len) = d.lba_status(4 << 20, 8 << 20).unwrap();
    assert!(mapped);
    assert!((1 << 20..8 << 20).contains(&len), "{len}");
    assert_eq!(d.lba_status(0, 8 << 20).unwrap(), (false, 4 << 20));
    d.unmap(4 << 20, 1 << 20).unwrap();
    assert_eq!(d.lba_status(4 << 20, 1 << 20).unwrap(), (false, 1 << 20));
    let mut back = vec![9u8; 4096];
    d.read_at(4 << 20, &mut back).unwrap();
    assert!(back.iter().all(|b| *b == 0));
    let full = FileDevice::open(
        &dir.path().join("full.img"),
        &FileOptions {
            size: Some(4 << 20),
            block_size: 512,
            read_only: false,
            preallocate: true,
            direct: false,
            engine: IoEngine::Sync,
        },
    )
    .unwrap();
    assert!(!full.thin_provisioned());
    assert!(full.unmap(0, 4096).is_err());
}

#[test]
fn read_only_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ro.img");
    FileDevice::open(&p, &opts(Some(1 << 20), 512)).unwrap();
    let d = FileDevice::open(
        &p,
        &FileOptions {
            size: None,
            block_size: 512,
            read_only: true,
            preallocate: false,
            direct: false,
            engine: IoEngine::Sync,
        },
    )
    .unwrap();
    assert!(d.write_at(0, &[0u8; 512], false).is_err());
    let mut b = [1u8; 512];
    d.read_at(0, &mut b).unwrap();
    assert_eq!(b, [0u8; 512]);
}

mod direct_tests {
    use super::super::open::uring_or_fallback;
    use super::super::*;
    use crate::aligned::DIRECT_ALIGN;
    use crate::BlockDeviceExt;

    #[test]
    fn direct_mode_round_trips_unaligned_buffers_and_never_runs_inline() {
        let dir = tempfile::tempdir().unwrap();
        for bs in [512u32, 4096] {
            let d = FileDevice::open(
                &dir.path().join(format!("d{bs}")),
                &FileOptions {
                    size: Some(1 << 20),
                    block_size: bs,
                    read_only: false,
                    preallocate: false,
                    direct: true,
                    engine: IoEngine::Sync,
                },
            )
            .unwrap();
            assert!(d.is_direct());
            let len = 3 * bs as usize;
            // A buffer one byte into an allocation is never page-aligned.
            let mut backing = vec![0u8; len + 1];
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            backing[1..].copy_from_slice(&data);
            let unaligned = &backing[1..];
            assert_ne!(unaligned.as_ptr().align_offset(DIRECT_ALIGN), 0);
            for (off, fua) in [(u64::from(bs), false), (8 * u64::from(bs), true)] {
                d.write_at(off, unaligned, fua).unwrap();
                let mut back = vec![0u8; len + 1];
                d.read_at(off, &mut back[1..]).unwrap();
                assert_eq!(&back[1..], &data[..]);
                // Aligned buffers go straight through.
                let mut a = IoBuf::aligned(len);
                d.read_at(off, &mut a).unwrap();
                assert_eq!(a, data);
            }
            // Direct I/O always waits for the device: never inline, also
            // for data the page cache would have.
            let b = vec![0u8; 4096];
            for _ in 0..2 {
                assert!(matches!(
                    d.submit(IoRequest::read(0, 4096), super::never()),
                    Submission::Blocking(_)
                ));
                assert!(matches!(
                    d.submit(super::write(0, &b, false), super::never()),
                    Submission::Blocking(_)
                ));
            }
            // The blocking job reads into the buffer given (garbage) and
            // returns the medium's bytes only.
            let req = IoRequest::Read {
                offset: u64::from(bs),
                len,
                buf: vec![0xee; 3 * len].into(),
            };
            let Submission::Blocking(job) = d.submit(req, super::never()) else {
                panic!()
            };
            assert_eq!(job().unwrap(), data);
            d.flush().unwrap();
            assert!(d.describe().contains("O_DIRECT"));
        }
    }

    /// Both engines with `O_DIRECT`: an aligned write reaches the device
    /// as is (no bounce counted), an unaligned one is bounced (counted) and
    /// still lands; a read lands aligned in the allocation given, exactly
    /// the bytes asked for, and stays there (no move, no new allocation).
    #[test]
    fn aligned_buffers_reach_the_device_without_a_bounce() {
        let dir = tempfile::tempdir().unwrap();
        for engine in [IoEngine::Sync, IoEngine::Uring] {
            let d = FileDevice::open(
                &dir.path().join(format!("{engine:?}")),
                &FileOptions {
                    size: Some(1 << 20),
                    block_size: 512,
                    read_only: false,
                    preallocate: false,
                    direct: true,
                    engine,
                },
            )
            .unwrap();
            let len = 64 * 1024;
            let data: Vec<u8> = (0..len).map(|i| (i * 11 + 5) as u8).collect();
            let wr = |data: IoBuf, fua| IoRequest::Write {
                offset: 8192,
                len: data.len(),
                data,
                fua,
            };
            // Aligned: no copy, with and without FUA.
            for fua in [false, true] {
                crate::submit_and_wait(&d, wr(IoBuf::aligned_copy_of(&data), fua)).unwrap();
                assert_eq!(d.bounced_bytes(), 0, "{engine:?}");
            }
            // Unaligned (one byte into its vector): bounced, and correct.
            let mut v = vec![0u8; len + 1];
            v[1..].copy_from_slice(&data);
            let unaligned = IoBuf::from_parts(v, 1);
            assert!(!unaligned.is_aligned());
            crate::submit_and_wait(&d, wr(unaligned, false)).unwrap();
            assert_eq!(d.bounced_bytes(), len as u64, "{engine:?}");
            // A read into a reused allocation full of garbage.
            let mut garbage = vec![0xee; 3];
            garbage.reserve(len + 8192);
            let (base, cap) = (garbage.as_ptr() as usize, garbage.capacity());
            let req = IoRequest::Read {
                offset: 8192,
                len,
                buf: garbage.into(),
            };
            let back = crate::submit_and_wait(&d, req).unwrap();
            assert!(back.is_aligned(), "{engine:?}");
            assert_eq!(back.len(), len);
            assert_eq!(back, data);
            let at = back.as_ptr() as usize;
            assert!(
                at >= base && at + len <= base + cap,
                "{engine:?}: the data stays in the allocation given"
            );
            // Sent on, it is the same memory.
            assert_eq!(back.into_bytes().as_ptr() as usize, at);
            // Another offset and length: still exactly what was asked.
            let back = crate::submit_and_wait(&d, IoRequest::read(8192 + 512, 1024)).unwrap();
            assert_eq!(back, data[512..1536]);
            assert_eq!(d.bounced_bytes(), len as u64, "reads never bounce");
        }
    }

    #[test]
    fn a_refused_ring_falls_back_to_sync() {
        let p = Path::new("/x");
        for errno in [libc::EPERM, libc::ENOSYS] {
            assert!(uring_or_fallback(p, || Err(io::Error::from_raw_os_error(errno))).is_none());
        }
        // A device whose ring was refused still serves I/O, blocking.
        let dir = tempfile::tempdir().unwrap();
        let mut d = FileDevice::open(
            &dir.path().join("f"),
            &FileOptions {
                size: Some(1 << 20),
                block_size: 512,
                read_only: false,
                preallocate: false,
                direct: false,
                engine: IoEngine::Uring,
            },
        )
        .unwrap();
        d.uring = uring_or_fallback(p, || Err(io::Error::from_raw_os_error(libc::EPERM)));
        assert_eq!(d.engine(), IoEngine::Sync);
        assert!(matches!(
            d.submit(IoRequest::Flush, super::never()),
            Submission::Blocking(_)
        ));
        d.write_at(0, &[5u8; 512], true).unwrap();
        let mut b = [0u8; 512];
        d.read_at(0, &mut b).unwrap();
        assert_eq!(b, [5u8; 512]);
    }

    #[test]
    fn engine_names_parse() {
        assert_eq!("sync".parse::<IoEngine>(), Ok(IoEngine::Sync));
        assert_eq!("uring".parse::<IoEngine>(), Ok(IoEngine::Uring));
        let e = "aio".parse::<IoEngine>().unwrap_err();
        assert!(e.to_string().contains("\"sync\" or \"uring\""), "{e}");
    }
}

#[test]
fn a_partial_write_in_the_last_page_of_an_odd_sized_file_succeeds() {
    // 4096·k + 512 bytes: the last page runs past the end of the file, so
    // the look at the page cache comes back short; the write must not
    // fail for that.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("odd.img");
    std::fs::write(&p, vec![7u8; 3 * 4096 + 512]).unwrap();
    let d = FileDevice::open(&p, &opts(None, 512)).unwrap();
    let last = 3 * 4096;
    // Read it first, so that the page is cached.
    let r = d.submit(
        IoRequest::Read {
            offset: last,
            len: 512,
            buf: IoBuf::new(),
        },
        never(),
    );
    assert!(!matches!(r, Submission::Done(Err(_))));
    let data = vec![0x5a; 512];
    match d.submit(write(last, &data, false), never()) {
        Submission::Done(r) => assert!(r.is_ok(), "{r:?}"),
        Submission::Blocking(job) => assert!(job().is_ok()),
        Submission::Pending => {}
    }
    assert_eq!(&std::fs::read(&p).unwrap()[last as usize..], &data[..]);
}
