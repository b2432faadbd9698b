//! Cut-through READ: a large read goes to the engine as pieces, and each
//! piece's data goes to the transport ([`DataInSink`]) as soon as it and
//! every piece before it have been read, while the rest is still on the
//! device. At one command in flight (a `dd` copy) the wire then carries the
//! first part of the data while the device reads the last, instead of the
//! two waiting for each other.
//!
//! - At most [`DEPTH`] pieces are on the device at once: two requests of
//!   [`PIECE`] bytes keep a virtual disk streaming (measured in
//!   docs/benchmark.md) and finish one after the other, where a whole
//!   1 MiB request, or all pieces at once, would finish together. Fewer
//!   than three requests entered together are also not merged back into
//!   one by the block layer's plugging.
//! - Pieces are handed over in order; the last piece is the data of the
//!   final response, which carries the status.
//! - A failure stops new pieces; the pieces before it still go out, the
//!   pieces in flight are waited for, and the command ends with the one
//!   CHECK CONDITION of the first failed piece (its byte range in the log
//!   line), as a whole read would. The initiator discards the data of a failed
//!   command.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ethersan_backend::{BackendError, IoBuf, IoResult, Submission};

use super::LogicalUnit;
use crate::{DataInSink, ScsiCompletion, Submitted};

/// Bytes of one piece of a cut-through read; reads shorter than two
/// pieces go whole.
pub(super) const PIECE: usize = 256 * 1024;

/// Pieces on the device at once.
pub(super) const DEPTH: usize = 3;

/// One cut-through read.
struct Stream {
    lu: Arc<LogicalUnit>,
    /// Byte offset and length of the whole read.
    off: u64,
    len: usize,
    pieces: usize,
    sink: DataInSink,
    data_out_len: Option<usize>,
    state: Mutex<State>,
}

struct State {
    /// The next piece to submit.
    next: usize,
    /// Pieces handed to the sink (always a prefix).
    delivered: usize,
    /// Pieces read, not yet handed over.
    landed: BTreeMap<usize, IoBuf>,
    /// The first piece that failed, and why.
    failed: Option<(usize, BackendError)>,
    in_flight: usize,
    /// A thread is submitting a piece (see [`Stream::pump`]).
    submitting: bool,
    /// The command's completion, taken when it ends.
    done: Option<ScsiCompletion>,
}

/// The next thing to do, outside the lock.
enum Then {
    Submit(usize),
    Finish(ScsiCompletion, IoResult, usize),
}

impl LogicalUnit {
    /// Read `len` bytes at byte `off` as pieces (see the module
    /// documentation); the command always answers through `done`.
    pub(super) fn read_cut_through(
        self: &Arc<Self>,
        off: u64,
        len: usize,
        sink: DataInSink,
        data_out_len: Option<usize>,
        done: ScsiCompletion,
    ) -> Submitted {
        let s = Arc::new(Stream {
            lu: self.clone(),
            off,
            len,
            pieces: len.div_ceil(PIECE),
            sink,
            data_out_len,
            state: Mutex::new(State {
                next: 0,
                delivered: 0,
                landed: BTreeMap::new(),
                failed: None,
                in_flight: 0,
                submitting: false,
                done: Some(done),
            }),
        });
        s.pump(false);
        Submitted::Pending
    }
}

impl Stream {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Byte offset and length of piece `i`.
    fn piece(&self, i: usize) -> (u64, usize) {
        let start = i * PIECE;
        (self.off + start as u64, PIECE.min(self.len - start))
    }

    /// Submit the pieces there is room for, in order, or end the command.
    /// One thread submits at a time (`submitting`): a piece that completes
    /// during its submission leaves the next step to that thread, so
    /// pieces reach the engine in order even when they complete at once.
    fn pump(self: &Arc<Self>, mut was_submitting: bool) {
        loop {
            let step = {
                let mut st = self.lock();
                if was_submitting {
                    st.submitting = false;
                } else if st.submitting {
                    return;
                }
                let step = self.next_step(&mut st);
                st.submitting = matches!(step, Some(Then::Submit(_)));
                step
            };
            match step {
                None => return,
                Some(Then::Submit(i)) => {
                    self.submit(i);
                    was_submitting = true;
                }
                Some(Then::Finish(done, r, i)) => {
                    let (off, len) = self.piece(i);
                    let range = Some((off, len as u64));
                    done(self.lu.io_response(r, false, self.data_out_len, range));
                    return;
                }
            }
        }
    }

    /// Send piece `i` to the engine (it is counted in flight already).
    fn submit(self: &Arc<Self>, i: usize) {
        let (off, len) = self.piece(i);
        let bs = self.lu.bs();
        let me = self.clone();
        let r = self.lu.vol.read(
            off / bs,
            len as u64 / bs,
            IoBuf::new(),
            Box::new(move |r| me.landed(i, r)),
        );
        let r = match r {
            Ok(Submission::Pending) => return,
            Ok(Submission::Done(r)) => r,
            // Not expected of an engine that splits reads (it always
            // waits for the device); correct, if slower, here.
            Ok(Submission::Blocking(job)) => job(),
            Err(e) => {
                let cause = std::io::Error::other(e.to_string());
                Err(BackendError::Read { offset: off, cause })
            }
        };
        // Finished at once: recorded here; the submitting loop goes on.
        self.record(i, r);
    }

    /// Piece `i` finished with `r` on the engine's thread.
    fn landed(self: &Arc<Self>, i: usize, r: IoResult) {
        self.record(i, r);
        self.pump(false);
    }

    /// Note piece `i`'s outcome and hand over what is ready, in order:
    /// never the last piece, nor anything from the first failure on.
    /// Under the lock, so the sink sees the pieces in order.
    fn record(&self, i: usize, r: IoResult) {
        let mut st = self.lock();
        st.in_flight -= 1;
        match r {
            Ok(buf) => {
                st.landed.insert(i, buf);
            }
            Err(e) => {
                if st.failed.as_ref().is_none_or(|(f, _)| i < *f) {
                    st.failed = Some((i, e));
                }
            }
        }
        let stop = st.failed.as_ref().map_or(self.pieces - 1, |(f, _)| *f);
        while st.delivered < stop {
            let at = st.delivered;
            let Some(buf) = st.landed.remove(&at) else {
                break;
            };
            st.delivered += 1;
            (self.sink.0)(buf, self.len);
        }
    }

    /// The next piece to submit, the end of the command, or nothing yet.
    fn next_step(&self, st: &mut State) -> Option<Then> {
        // Answered: nothing more is read for it.
        st.done.as_ref()?;
        if let Some((f, _)) = &st.failed {
            if st.in_flight > 0 {
                return None;
            }
            let f = *f;
            let (_, e) = st.failed.take().expect("failed");
            return st.done.take().map(|d| Then::Finish(d, Err(e), f));
        }
        let last = self.pieces - 1;
        if st.delivered == last && st.landed.contains_key(&last) {
            let data = st.landed.remove(&last).expect("landed");
            return st.done.take().map(|d| Then::Finish(d, Ok(data), last));
        }
        if st.next < self.pieces && st.in_flight < DEPTH {
            st.next += 1;
            st.in_flight += 1;
            return Some(Then::Submit(st.next - 1));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::{mpsc, Arc, Mutex};

    use super::super::testing::*;
    use super::PIECE;
    use crate::{DataInSink, IoBuf, Requester, ScsiCommand, ScsiResponse, Submitted};

    /// READ(16) of `blocks` at `lba` with a sink: the parts handed over,
    /// each with the total it announced, and the response.
    fn read_split(
        t: &crate::ScsiTarget,
        lba: u64,
        blocks: u32,
    ) -> (Vec<(Vec<u8>, usize)>, ScsiResponse) {
        let parts = Arc::new(Mutex::new(Vec::new()));
        let p = parts.clone();
        let sink = DataInSink(Arc::new(move |b: IoBuf, total| {
            p.lock().unwrap().push((b[..].to_vec(), total))
        }));
        let cmd = ScsiCommand {
            nexus: A,
            lun: 0,
            cdb: cdb16(0x88, 0, lba, blocks),
            data_out: Default::default(),
            expected_len: 1 << 24,
        };
        let who = Requester {
            early: Some(&sink),
            ..Requester::named(None)
        };
        let (tx, rx) = mpsc::channel();
        let r = match t.submit_from(cmd, who, Box::new(move |r| tx.send(r).unwrap())) {
            Submitted::Pending => rx.recv().unwrap(),
            other => panic!("a split read answers through its completion: {other:?}"),
        };
        let parts = std::mem::take(&mut *parts.lock().unwrap());
        (parts, r)
    }

    fn split_target(bs: u32, answer: u8) -> (crate::ScsiTarget, Arc<TestDevice>) {
        let (t, dev) = target(bs);
        dev.split.store(true, Ordering::Relaxed);
        dev.answer.store(answer, Ordering::Relaxed);
        (t, dev)
    }

    #[test]
    fn a_large_read_comes_in_order_in_pieces_for_every_engine_answer() {
        for answer in [ANSWER_DONE, ANSWER_PENDING, ANSWER_BLOCKING] {
            for bs in BLOCK_SIZES {
                let (t, dev) = split_target(bs, answer);
                // 1 MiB + one block at an odd block: five pieces, the last short.
                let len = (1 << 20) + bs as usize;
                let data = pattern(len, 7);
                good(exec(
                    &t,
                    A,
                    &cdb16(0x8a, 0, 3, (len / bs as usize) as u32),
                    &data,
                ));
                dev.reads.lock().unwrap().clear();
                let (parts, r) = read_split(&t, 3, (len / bs as usize) as u32);
                let last = good(r);
                assert_eq!(parts.len(), 4, "every piece but the last goes ahead");
                assert!(parts
                    .iter()
                    .all(|(p, total)| p.len() == PIECE && *total == len));
                let mut got: Vec<u8> = parts.into_iter().flat_map(|(p, _)| p).collect();
                got.extend_from_slice(&last);
                assert!(got == data, "answer {answer}, bs {bs}: the bytes in order");
                // Each piece read once (a piece answered at once starts
                // the next before the loop that started it goes on).
                let mut reads = dev.reads.lock().unwrap().clone();
                reads.sort_unstable();
                let off = 3 * u64::from(bs);
                let want: Vec<_> = (0..5)
                    .map(|i| (off + (i * PIECE) as u64, PIECE.min(len - i * PIECE)))
                    .collect();
                assert_eq!(reads, want, "answer {answer}, bs {bs}");
            }
        }
    }

    #[test]
    fn a_failed_second_piece_sends_the_first_then_one_check_condition() {
        for answer in [ANSWER_DONE, ANSWER_PENDING] {
            let (t, dev) = split_target(512, answer);
            let data = pattern(1 << 20, 9);
            good(exec(&t, A, &cdb16(0x8a, 0, 0, 2048), &data));
            // A byte in the second piece.
            *dev.fail_read_at.lock().unwrap() = Some(PIECE as u64 + 4096);
            let (parts, r) = read_split(&t, 0, 2048);
            check(&r, 3, 0x11, 0);
            assert!(r.data_in.is_empty(), "no data with the CHECK CONDITION");
            assert_eq!(parts.len(), 1, "only the piece before the failure");
            assert!(parts[0].0 == data[..PIECE]);
            // Answered at once, the failure is known before any later
            // piece would start: none is read. (Pending, a later piece
            // may have started before the failure came back.)
            let reads = dev.reads.lock().unwrap().clone();
            if answer == ANSWER_DONE {
                assert!(
                    reads.iter().all(|(o, _)| *o < 2 * PIECE as u64),
                    "{reads:?}"
                );
            }
        }
    }

    #[test]
    fn short_reads_and_engines_that_do_not_split_go_whole() {
        let (t, dev) = split_target(512, ANSWER_PENDING);
        // One block short of two pieces.
        let blocks = (2 * PIECE / 512 - 1) as u32;
        let (parts, r) = read_split(&t, 0, blocks);
        assert_eq!(good(r).len(), blocks as usize * 512);
        assert!(parts.is_empty());
        dev.split.store(false, Ordering::Relaxed);
        let (parts, r) = read_split(&t, 0, 4096);
        assert_eq!(good(r).len(), 4096 * 512);
        assert!(parts.is_empty());
        assert_eq!(dev.reads.lock().unwrap().len(), 2, "one request each");
    }
}
