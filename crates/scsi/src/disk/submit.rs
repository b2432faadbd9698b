//! The one entry point of a logical unit: [`LogicalUnit::submit`] looks the
//! command up and runs the checks every command passes once, then
//! - READ, WRITE, WRITE AND VERIFY and SYNCHRONIZE CACHE go to the unit's
//!   volume as one engine submission: done now (RAM, the page cache),
//!   pending (io_uring; the response is built on the ring thread and handed
//!   to the completion) or a blocking job (the sync engine, or a WRITE whose
//!   range a COMPARE AND WRITE holds);
//! - commands that touch no medium and never wait (TEST UNIT READY,
//!   INQUIRY, READ CAPACITY, MODE SENSE, REPORT SUPPORTED OPERATION CODES)
//!   finish now;
//! - every other command becomes a blocking job that runs the emulation
//!   (no check is repeated there).

use std::sync::Arc;

use ethersan_backend::{IoBuf, IoCompletion, IoResult, Submission};

use super::{CmdResult, LogicalUnit, Reply};
use crate::cdb::BlockCdb;
use crate::commands::{CommandDef, Op};
use crate::sense::codes;
use crate::{DataInSink, ScsiCommand, ScsiCompletion, ScsiResponse, Submitted, WriteStream};

impl LogicalUnit {
    /// Run `cmd` (see the module documentation). `done` is called exactly
    /// once, with the response, if and only if the answer is
    /// [`Submitted::Pending`].
    /// `early` takes a large READ's data as it is read (cut-through, see
    /// [`DataInSink`]) where the engine gains from that; `stream` brings a
    /// large WRITE's data as it arrives (see [`WriteStream`]).
    pub(crate) fn submit(
        self: &Arc<Self>,
        cmd: ScsiCommand,
        early: Option<&DataInSink>,
        stream: Option<&WriteStream>,
        done: ScsiCompletion,
    ) -> Submitted {
        let req = cmd.request();
        let def = match self.precheck(&req) {
            Ok(d) => d,
            Err(resp) => return Submitted::Done(resp),
        };
        match def.op {
            Op::Read | Op::Write | Op::WriteVerify | Op::SyncCache => {
                self.submit_io(def, cmd, early, stream, done)
            }
            // A command handed a stream it cannot use: its data would be
            // lost.
            _ if stream.is_some() => {
                Submitted::Done(self.respond(Err(codes::INTERNAL_FAILURE), None))
            }
            Op::TestUnitReady
            | Op::Inquiry
            | Op::ReadCapacity10
            | Op::ReadCapacity16
            | Op::ModeSense6
            | Op::ModeSense10
            | Op::ReportOpcodes => Submitted::Done(self.dispatch(def, &req)),
            _ => {
                let lu = self.clone();
                Submitted::Blocking(Box::new(move || lu.dispatch(def, &cmd.request())))
            }
        }
    }

    /// The data path: checked here, moved by the volume.
    fn submit_io(
        self: &Arc<Self>,
        def: &'static CommandDef,
        cmd: ScsiCommand,
        early: Option<&DataInSink>,
        stream: Option<&WriteStream>,
        done: ScsiCompletion,
    ) -> Submitted {
        let data_out_len = self.reported_data_out_len(def, &cmd.cdb);
        let write = def.op != Op::Read;
        let now = |result: CmdResult| Submitted::Done(self.respond(result, data_out_len));
        let bs = self.bs();
        // What to do, checked before anything is submitted: the byte range
        // (for a failure's log line) and the request.
        enum Plan {
            Flush,
            Read(u64, usize),
            Write(u64, usize, bool),
        }
        let plan = match def.op {
            // Range-checked, then the whole device is flushed (the engine
            // has no ranged flush). IMMED is honoured by completing only
            // after the flush, which the standard allows.
            Op::SyncCache => match self.cache_range(&BlockCdb::parse(&cmd.cdb)) {
                Err(s) => return now(Err(s)),
                Ok(_) => Plan::Flush,
            },
            Op::Read => match self.read_plan(&cmd.cdb) {
                Err(s) => return now(Err(s)),
                Ok((_, 0)) => return now(Reply::none()),
                Ok((off, len)) => Plan::Read(off, len),
            },
            Op::Write if stream.is_some() => {
                let len = stream.map_or(0, WriteStream::len);
                match self.write_plan(&cmd.cdb, len, false) {
                    Err(s) => return now(Err(s)),
                    Ok((off, have, fua)) => {
                        let stream = stream.expect("matched");
                        let lu = self;
                        return lu.write_cut_through(stream, off, have, fua, data_out_len, done);
                    }
                }
            }
            // Only a plain WRITE streams (`streams_write`).
            _ if stream.is_some() => return now(Err(codes::INTERNAL_FAILURE)),
            _ => {
                let verify = def.op == Op::WriteVerify;
                match self.write_plan(&cmd.cdb, cmd.data_out.len(), verify) {
                    Err(s) => return now(Err(s)),
                    Ok((_, 0, _)) => return now(Reply::none()),
                    Ok((off, have, fua)) => Plan::Write(off, have, fua),
                }
            }
        };
        if let (Plan::Read(off, len), Some(sink)) = (&plan, early) {
            if *len >= 2 * super::cut_through::PIECE && self.vol.device().splits_reads() {
                return self.read_cut_through(*off, *len, sink.clone(), data_out_len, done);
            }
        }
        let range = match plan {
            Plan::Flush => None,
            Plan::Read(off, len) | Plan::Write(off, len, _) => Some((off, len as u64)),
        };
        let lu = self.clone();
        let completion: IoCompletion =
            Box::new(move |r| done(lu.io_response(r, write, data_out_len, range)));
        let submitted = match plan {
            Plan::Flush => Ok(self.vol.flush(completion)),
            Plan::Read(off, len) => {
                self.vol
                    .read(off / bs, len as u64 / bs, IoBuf::new(), completion)
            }
            Plan::Write(off, have, fua) => {
                self.vol
                    .write(off / bs, have as u64 / bs, cmd.data_out, fua, completion)
            }
        };
        match submitted {
            Ok(Submission::Done(r)) => {
                Submitted::Done(self.io_response(r, write, data_out_len, range))
            }
            Ok(Submission::Pending) => Submitted::Pending,
            Ok(Submission::Blocking(job)) => {
                let lu = self.clone();
                Submitted::Blocking(Box::new(move || {
                    lu.io_response(job(), write, data_out_len, range)
                }))
            }
            // The plans above checked what the volume checks.
            Err(_) => now(Err(codes::LBA_OUT_OF_RANGE)),
        }
    }

    /// The response for an engine outcome.
    pub(super) fn io_response(
        &self,
        r: IoResult,
        write: bool,
        data_out_len: Option<usize>,
        range: Option<(u64, u64)>,
    ) -> ScsiResponse {
        let result = match r {
            Ok(data) if !write => Ok(Reply { data }),
            Ok(_) => Reply::none(),
            Err(e) => Err(self.medium_error(&e, write, range)),
        };
        self.respond(result, data_out_len)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::{mpsc, Arc};

    use ethersan_backend::file::{FileDevice, FileOptions, IoEngine};

    use super::super::testing::*;
    use crate::sense::key;
    use crate::{LogicalUnit, ScsiCommand, ScsiResponse, ScsiTarget, Submitted};

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

    fn cmd(nexus: crate::Nexus, cdb: &[u8], data: &[u8]) -> ScsiCommand {
        ScsiCommand {
            nexus,
            lun: 0,
            cdb: cdb.to_vec(),
            data_out: data.to_vec().into(),
            expected_len: 1 << 24,
        }
    }

    /// Submit; the answer's kind and the response, waiting as it requires.
    fn run(t: &ScsiTarget, cdb: &[u8], data: &[u8]) -> (&'static str, ScsiResponse) {
        run_as(t, None, cdb, data)
    }

    fn run_as(
        t: &ScsiTarget,
        initiator: Option<&str>,
        cdb: &[u8],
        data: &[u8],
    ) -> (&'static str, ScsiResponse) {
        let (tx, rx) = mpsc::channel();
        let done = Box::new(move |r| tx.send(r).unwrap());
        match t.submit(cmd(A, cdb, data), initiator, done) {
            Submitted::Done(r) => ("done", r),
            Submitted::Blocking(job) => ("blocking", job()),
            Submitted::Pending => ("pending", rx.recv().unwrap()),
        }
    }

    #[test]
    fn each_engine_answer_gives_the_same_responses() {
        for answer in [ANSWER_DONE, ANSWER_BLOCKING, ANSWER_PENDING] {
            let (t, dev) = target(512);
            dev.answer.store(answer, Ordering::Relaxed);
            let kind = ["done", "blocking", "pending"][answer as usize];
            let data = pattern(2048, 3);
            // WRITE, WRITE FUA, WRITE AND VERIFY, READ, SYNCHRONIZE CACHE.
            for (c, d) in [
                (cdb10(0x2a, 0, 4, 4), &data[..]),
                (cdb10(0x2a, 0x08, 4, 4), &data[..]),
                (cdb10(0x2e, 0, 4, 4), &data[..]),
                (cdb10(0x35, 0, 0, 0), &[][..]),
            ] {
                let (k, r) = run(&t, &c, d);
                assert_eq!(k, kind);
                good(r);
            }
            let (k, r) = run(&t, &cdb10(0x28, 0, 4, 4), &[]);
            assert_eq!((k, good(r)), (kind, data.clone()));
            assert_eq!(*dev.fua.lock().unwrap(), [false, true, true]);
            assert_eq!(dev.flushes.load(Ordering::Relaxed), 1);
            // Residuals: the Data-Out length the CDB asked for.
            let (_, r) = run(&t, &cdb10(0x2a, 0, 0, 8), &data);
            assert_eq!(r.data_out_len, Some(4096));
            // Checks fail before any I/O: done now whatever the engine.
            let cap = (DEV_BYTES / 512) as u32;
            let (k, r) = run(&t, &cdb10(0x28, 0, cap, 1), &[]);
            assert_eq!(k, "done");
            check(&r, key::ILLEGAL_REQUEST, 0x21, 0);
            let (k, r) = run(&t, &cdb10(0x28, 0, 0, 0), &[]);
            assert_eq!((k, good(r).len()), ("done", 0));
            // EIO: MEDIUM ERROR, read and write flavours.
            dev.fail_reads.store(true, Ordering::Relaxed);
            let (k, r) = run(&t, &cdb10(0x28, 0, 4, 1), &[]);
            assert_eq!(k, kind);
            check(&r, key::MEDIUM_ERROR, 0x11, 0);
            dev.fail_writes.store(true, Ordering::Relaxed);
            let (_, r) = run(&t, &cdb10(0x2a, 0, 4, 1), &data[..512]);
            check(&r, key::MEDIUM_ERROR, 0x0c, 0);
            let (_, r) = run(&t, &cdb10(0x35, 0, 0, 0), &[]);
            check(&r, key::MEDIUM_ERROR, 0x0c, 0);
            // Metadata finishes now; slow-path commands are blocking jobs.
            assert_eq!(run(&t, &[0, 0, 0, 0, 0, 0], &[]).0, "done");
            assert_eq!(run(&t, &[0x12, 0, 0, 0, 36, 0], &[]).0, "done");
            assert_eq!(run(&t, &cdb10(0x2f, 0, 0, 1), &[]).0, "blocking");
        }
    }

    #[test]
    fn checks_run_once_per_command() {
        // A unit attention is reported by the first command and only once,
        // also when the command then goes to the engine.
        for answer in [ANSWER_DONE, ANSWER_BLOCKING, ANSWER_PENDING] {
            let (t, dev) = target(512);
            dev.answer.store(answer, Ordering::Relaxed);
            let n = crate::Nexus(9);
            t.nexus_added(n);
            let c = cmd(n, &cdb10(0x28, 0, 0, 1), &[]);
            match t.submit(c.clone(), None, Box::new(|_| {})) {
                Submitted::Done(r) => check(&r, key::UNIT_ATTENTION, 0x29, 0),
                other => panic!("{other:?}"),
            }
            good(t.submit_and_wait(c, None));
        }
    }

    #[test]
    fn engine_reads_and_writes_match_the_blocking_path() {
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
                    let (_, r) = run(&t, w, &data);
                    assert_eq!(r.data_out_len, Some(4 * b));
                    good(r);
                    let lba = [2u32, 20, 40][i];
                    let (kind, r) = run(&t, &cdb10(0x28, 0, lba, 4), &[]);
                    if direct {
                        assert_eq!(kind, "pending", "O_DIRECT never finishes inline");
                    }
                    assert_eq!(good(r), data, "direct {direct} bs {bs} case {i}");
                    assert_eq!(good(exec(&t, A, &cdb10(0x28, 0, lba, 4), &[])), data);
                }
                // FUA writes and flushes go to the ring.
                assert_eq!(run(&t, &cdb10(0x2a, 0x08, 2, 4), &data).0, "pending");
                // Past the end: LBA OUT OF RANGE, no I/O.
                let cap = (DEV_BYTES / u64::from(bs)) as u32;
                check(&run(&t, &cdb10(0x28, 0, cap, 1), &[]).1, 5, 0x21, 0);
                check(&run(&t, &cdb10(0x2a, 0, cap - 1, 2), &data).1, 5, 0x21, 0);
                // SYNCHRONIZE CACHE(10) flushes through the engine; its
                // range is checked first.
                let (kind, r) = run(&t, &cdb10(0x35, 0, 0, 0), &[]);
                assert_eq!(kind, "pending");
                good(r);
                check(&run(&t, &cdb10(0x35, 0, cap, 1), &[]).1, 5, 0x21, 0);
            }
        }
    }

    #[test]
    fn protection_masks_and_range_locks_on_the_engine_path() {
        let dir = tempfile::tempdir().unwrap();
        let t = uring_target(dir.path(), 512, true, false);
        check(&run(&t, &cdb10(0x2a, 0, 0, 1), &[0; 512]).1, 7, 0x27, 0);
        good(run(&t, &cdb10(0x28, 0, 0, 1), &[]).1);
        // Masked and per-initiator read-only LUNs.
        t.set_policy(
            0,
            crate::LunPolicy {
                visible_to: vec!["alice".into()],
                read_only_for: vec![],
                ..Default::default()
            },
        )
        .unwrap();
        check(
            &run_as(&t, Some("bob"), &cdb10(0x28, 0, 0, 1), &[]).1,
            5,
            0x25,
            0,
        );
        let t = uring_target(dir.path(), 4096, false, false);
        t.set_policy(
            0,
            crate::LunPolicy {
                visible_to: vec![],
                read_only_for: vec!["bob".into()],
                ..Default::default()
            },
        )
        .unwrap();
        check(
            &run_as(&t, Some("bob"), &cdb10(0x2a, 0, 0, 1), &[1; 4096]).1,
            7,
            0x27,
            0,
        );
        // The policy change is reported once.
        check(&run(&t, &[0; 6], &[]).1, 6, 0x3f, 0x0e);
        let lu = t.lun(0).unwrap();
        {
            // A COMPARE AND WRITE holding the range: the WRITE waits for it
            // in a blocking job.
            let _x = lu.vol.ranges().lock(0, 4096, true);
            let done = Box::new(|_| panic!("completed"));
            let s = t.submit(cmd(A, &cdb10(0x2a, 0, 0, 1), &[1; 4096]), None, done);
            assert!(matches!(s, Submitted::Blocking(_)), "{s:?}");
        }
    }
}
