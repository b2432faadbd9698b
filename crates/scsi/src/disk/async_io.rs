//! READ and WRITE split for asynchronous backends (the io_uring engine):
//! [`LogicalUnit::prepare_async`] runs every check and takes the range
//! lock (plan), the transport submits the backend I/O with
//! [`AsyncIoPlan::submit`], and the plan builds the response when the
//! backend completes (finish). No thread waits for the I/O.
//!
//! Only plain READ, WRITE, WRITE AND VERIFY and SYNCHRONIZE CACHE (a
//! flush) take this path; everything else (and a WRITE whose range a
//! COMPARE AND WRITE holds) runs the blocking [`LogicalUnit::execute`].

use std::sync::Arc;

use ethersan_backend::{BackendError, IoRequest};

use super::{backend_sense, LogicalUnit, Reply};
use crate::commands::{self, Op};
use crate::range_lock::OwnedRangeGuard;
use crate::{ScsiRequest, ScsiResponse};

/// What [`LogicalUnit::prepare_async`] decided.
#[derive(Debug)]
pub enum Prepared {
    /// The command is finished without I/O (a check failed, nothing to
    /// transfer): send this response.
    Done(ScsiResponse),
    /// Checked; submit the I/O with [`AsyncIoPlan::submit`].
    Io(AsyncIoPlan),
    /// Not for the asynchronous path: run the blocking `execute`.
    Blocking,
}

#[derive(Debug)]
enum Planned {
    Read {
        off: u64,
        len: usize,
    },
    Write {
        off: u64,
        len: usize,
        fua: bool,
        /// Held until the write completes, like the blocking path's lock.
        _held: OwnedRangeGuard,
    },
    Flush,
}

/// A READ or WRITE that passed its checks, with the byte range, FUA and
/// (for a write) the range lock it holds until the I/O completes.
#[derive(Debug)]
pub struct AsyncIoPlan {
    lu: Arc<LogicalUnit>,
    io: Planned,
    data_out_len: Option<usize>,
}

impl AsyncIoPlan {
    /// Submit the backend I/O; `done` gets the command's response when it
    /// completes (on the backend's completion thread). `data_out` is the
    /// command's Data-Out (ignored for a READ).
    pub fn submit(self, data_out: Vec<u8>, done: impl FnOnce(ScsiResponse) + Send + 'static) {
        let lu = self.lu.clone();
        let Some(engine) = lu.dev.async_io() else {
            // prepare_async checked this; a device cannot lose its engine.
            let e = BackendError::Unsupported;
            return done(self.finish(Err(e)));
        };
        let req = match &self.io {
            Planned::Read { off, len } => IoRequest::Read {
                offset: *off,
                len: *len,
            },
            Planned::Write { off, len, fua, .. } => IoRequest::Write {
                offset: *off,
                data: data_out,
                len: *len,
                fua: *fua,
            },
            Planned::Flush => IoRequest::Flush,
        };
        engine.submit(req, Box::new(move |r| done(self.finish(r))));
    }

    /// The response for the backend's outcome (releases the range lock).
    fn finish(self, r: Result<Vec<u8>, BackendError>) -> ScsiResponse {
        let write = !matches!(self.io, Planned::Read { .. });
        let result = match r {
            Ok(data) if !write => Ok(Reply { data }),
            Ok(_) => Reply::none(),
            Err(e) => Err(backend_sense(&e, write)),
        };
        self.lu.respond(result, self.data_out_len)
    }
}

impl LogicalUnit {
    /// Plan a READ, WRITE, WRITE AND VERIFY or SYNCHRONIZE CACHE for an
    /// asynchronous backend
    /// (see the module documentation).
    pub fn prepare_async(self: &Arc<Self>, req: &ScsiRequest<'_>) -> Prepared {
        let Some(def) = commands::lookup(req.cdb) else {
            return Prepared::Blocking;
        };
        if !matches!(
            def.op,
            Op::Read | Op::Write | Op::WriteVerify | Op::SyncCache
        ) || req.cdb.len() < def.cdb_len
            || self.dev.async_io().is_none()
        {
            return Prepared::Blocking;
        }
        let def = match self.precheck(req) {
            Ok(d) => d,
            Err(resp) => return Prepared::Done(resp),
        };
        let data_out_len = self.reported_data_out_len(def, req.cdb);
        let done = |result| Prepared::Done(self.respond(result, data_out_len));
        let io = if def.op == Op::SyncCache {
            // Range-checked, then the whole device is flushed (as the
            // blocking SYNCHRONIZE CACHE does).
            match self.cache_range(&crate::cdb::BlockCdb::parse(req.cdb)) {
                Err(s) => return done(Err(s)),
                Ok(_) => Planned::Flush,
            }
        } else if def.op == Op::Read {
            match self.read_plan(req.cdb) {
                Err(s) => return done(Err(s)),
                Ok((_, 0)) => return done(Reply::none()),
                Ok((off, len)) => Planned::Read { off, len },
            }
        } else {
            let verify = def.op == Op::WriteVerify;
            match self.write_plan(req.cdb, req.data_out, verify) {
                Err(s) => return done(Err(s)),
                Ok((_, 0, _)) => return done(Reply::none()),
                Ok((off, len, fua)) => {
                    let Some(held) = self.ranges.try_lock_shared_owned(off, len as u64) else {
                        // A COMPARE AND WRITE or ORWRITE holds the range:
                        // wait for it off the async workers.
                        return Prepared::Blocking;
                    };
                    Planned::Write {
                        off,
                        len,
                        fua,
                        _held: held,
                    }
                }
            }
        };
        Prepared::Io(AsyncIoPlan {
            lu: self.clone(),
            io,
            data_out_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{mpsc, Arc};

    use ethersan_backend::file::{FileDevice, FileOptions, IoEngine};

    use super::super::testing::*;
    use super::Prepared;
    use crate::{LogicalUnit, ScsiRequest, ScsiResponse, ScsiTarget};

    fn uring_target(dir: &std::path::Path, bs: u32, read_only: bool, direct: bool) -> ScsiTarget {
        let p = dir.join(format!("lun{bs}{direct}"));
        if read_only {
            drop(FileDevice::open(&p, &opts(bs, false, direct)).unwrap());
        }
        let dev = FileDevice::open(&p, &opts(bs, read_only, direct)).unwrap();
        assert_eq!(dev.engine(), IoEngine::Uring);
        let t = ScsiTarget::new(vec![Arc::new(LogicalUnit::new(
            Arc::new(dev),
            config(false, read_only),
        ))]);
        for n in [A, B] {
            t.nexus_added(n);
            exec(&t, n, &[0, 0, 0, 0, 0, 0], &[]);
        }
        t
    }

    fn opts(bs: u32, read_only: bool, direct: bool) -> FileOptions {
        FileOptions {
            size: Some(DEV_BYTES),
            block_size: bs,
            read_only,
            preallocate: false,
            direct,
            engine: IoEngine::Uring,
        }
    }

    /// Plan, submit, wait: `None` when the command is not for the async path.
    fn run_async(t: &ScsiTarget, cdb: &[u8], data: &[u8]) -> Option<ScsiResponse> {
        let req = ScsiRequest {
            nexus: A,
            lun: 0,
            cdb,
            data_out: data,
            expected_len: 1 << 24,
        };
        match t.prepare_async_for(&req, None) {
            Prepared::Done(r) => Some(r),
            Prepared::Blocking => None,
            Prepared::Io(plan) => {
                let (tx, rx) = mpsc::channel();
                plan.submit(data.to_vec(), move |r| tx.send(r).unwrap());
                Some(rx.recv().unwrap())
            }
        }
    }

    #[test]
    fn async_reads_and_writes_match_the_blocking_path() {
        let dir = tempfile::tempdir().unwrap();
        for direct in [false, true] {
            for bs in BLOCK_SIZES {
                let t = uring_target(dir.path(), bs, false, direct);
                let b = bs as usize;
                let data = pattern(4 * b, bs as u8);
                // WRITE(10) FUA, WRITE(16), WRITE AND VERIFY(10).
                for (i, w) in [
                    cdb10(0x2a, 0x08, 2, 4),
                    cdb16(0x8a, 0, 20, 4),
                    cdb10(0x2e, 0, 40, 4),
                ]
                .iter()
                .enumerate()
                {
                    let r = run_async(&t, w, &data).expect("async path");
                    assert_eq!(r.data_out_len, Some(4 * b));
                    good(r);
                    let lba = [2u32, 20, 40][i];
                    let back = good(run_async(&t, &cdb10(0x28, 0, lba, 4), &[]).unwrap());
                    assert_eq!(back, data, "direct {direct} bs {bs} case {i}");
                    assert_eq!(good(exec(&t, A, &cdb10(0x28, 0, lba, 4), &[])), data);
                }
                // Zero-length transfers finish without I/O.
                assert!(matches!(
                    t.prepare_async_for(
                        &ScsiRequest {
                            nexus: A,
                            lun: 0,
                            cdb: &cdb10(0x28, 0, 0, 0),
                            data_out: &[],
                            expected_len: 0
                        },
                        None
                    ),
                    Prepared::Done(_)
                ));
                // Past the end: LBA OUT OF RANGE, no I/O.
                let cap = (DEV_BYTES / u64::from(bs)) as u32;
                check(
                    &run_async(&t, &cdb10(0x28, 0, cap, 1), &[]).unwrap(),
                    5,
                    0x21,
                    0,
                );
                check(
                    &run_async(&t, &cdb10(0x2a, 0, cap - 1, 2), &data).unwrap(),
                    5,
                    0x21,
                    0,
                );
                // SYNCHRONIZE CACHE(10) flushes through the engine; its
                // range is checked first.
                good(run_async(&t, &cdb10(0x35, 0, 0, 0), &[]).expect("async flush"));
                check(
                    &run_async(&t, &cdb10(0x35, 0, cap, 1), &[]).unwrap(),
                    5,
                    0x21,
                    0,
                );
                // Other commands are not for this path.
                assert!(run_async(&t, &[0x34, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]).is_none());
            }
        }
    }

    #[test]
    fn async_path_checks_protection_masks_and_range_locks() {
        let dir = tempfile::tempdir().unwrap();
        let t = uring_target(dir.path(), 512, true, false);
        check(
            &run_async(&t, &cdb10(0x2a, 0, 0, 1), &[0; 512]).unwrap(),
            7,
            0x27,
            0,
        );
        good(run_async(&t, &cdb10(0x28, 0, 0, 1), &[]).unwrap());
        // A pending unit attention is reported first.
        t.nexus_added(crate::Nexus(9));
        let req = ScsiRequest {
            nexus: crate::Nexus(9),
            lun: 0,
            cdb: &cdb10(0x28, 0, 0, 1),
            data_out: &[],
            expected_len: 512,
        };
        match t.prepare_async_for(&req, None) {
            Prepared::Done(r) => check(&r, 6, 0x29, 0),
            other => panic!("{other:?}"),
        }
        // Masked and per-initiator read-only LUNs go to the blocking path.
        t.set_policy(
            0,
            crate::LunPolicy {
                visible_to: vec!["alice".into()],
                read_only_for: vec!["carol".into()],
            },
        )
        .unwrap();
        assert!(matches!(
            t.prepare_async_for(&req, Some("bob")),
            Prepared::Blocking
        ));
        assert!(matches!(
            t.prepare_async_for(&req, Some("carol")),
            Prepared::Blocking
        ));

        let t = uring_target(dir.path(), 4096, false, false);
        let lu = t.lun(0).unwrap();
        {
            // A COMPARE AND WRITE holding the range: the WRITE waits for it
            // on the blocking path.
            let _x = lu.ranges.lock(0, 4096, true);
            assert!(run_async(&t, &cdb10(0x2a, 0, 0, 1), &[1; 4096]).is_none());
        }
        // A write in flight holds its range shared until it completes.
        let req = ScsiRequest {
            nexus: A,
            lun: 0,
            cdb: &cdb10(0x2a, 0, 0, 1),
            data_out: &[2; 4096],
            expected_len: 4096,
        };
        let Prepared::Io(plan) = t.prepare_async_for(&req, None) else {
            panic!()
        };
        assert!(lu.ranges.try_lock_shared(0, 4096).is_some());
        let lu2 = lu.clone();
        let (tx, rx) = mpsc::channel();
        let excl = std::thread::spawn(move || {
            let _x = lu2.ranges.lock(0, 4096, true);
            tx.send(()).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(
            rx.try_recv().is_err(),
            "exclusive lock taken while a write holds the range"
        );
        let (dtx, drx) = mpsc::channel();
        plan.submit(vec![2; 4096], move |r| dtx.send(r).unwrap());
        good(drx.recv().unwrap());
        excl.join().unwrap();
        rx.recv().unwrap();
    }
}
