//! Cut-through WRITE: a large WRITE runs before its data is all here. The
//! transport hands the command over with a [`WriteStream`] as soon as the
//! command's turn has come and its buffer is reserved; the unit runs its
//! checks, takes the range lock for the whole command and then writes each
//! [`PIECE`] the transport completes ([`WriteStream::put`]), in the order
//! they complete, while the rest of the data is still on the wire.
//!
//! - At most [`DEPTH`] pieces are on the device at once; the others wait
//!   in the stream.
//! - Every piece is written with the command's FUA (the volume adds FUA
//!   with the write cache off), exactly as the whole write would be.
//! - The command answers once, after the transport said the transfer ended
//!   ([`WriteStream::end`], or [`WriteStream::abandon`] when it will not
//!   complete) and no piece is in flight: GOOD when every piece was
//!   written; the CHECK CONDITION of the first failed piece (as the whole
//!   write gives: MEDIUM ERROR / WRITE ERROR, the piece's range in the log
//!   line), after which no piece is submitted; ABORTED COMMAND / DATA
//!   PHASE ERROR for a transfer abandoned or short.
//! - The range stays locked (shared, see `ethersan_volume::RangeLocks`)
//!   from the checks until the answer, across all pieces, as one WRITE's.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

use ethersan_backend::{BackendError, IoBuf, IoResult, Submission};
use ethersan_volume::OwnedRangeGuard;

use super::cut_through::{DEPTH, PIECE};
use super::LogicalUnit;
use crate::cdb::BlockCdb;
use crate::sense::codes;
use crate::{ScsiCompletion, ScsiResponse, Submitted};

/// Why [`WriteStream::put`] refused a piece.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteStreamError {
    /// The piece lies past the end of the write.
    #[error("piece {0} is past the end of the write")]
    NoSuchPiece(usize),
    /// The piece does not hold exactly its bytes.
    #[error("piece {piece} holds {len} bytes, not {want}")]
    WrongLength {
        /// The piece.
        piece: usize,
        /// Bytes handed over.
        len: usize,
        /// Bytes the piece has.
        want: usize,
    },
    /// The piece was handed over before.
    #[error("piece {0} was handed over twice")]
    Twice(usize),
    /// The transfer was declared ended.
    #[error("the transfer has ended")]
    Ended,
}

/// A large WRITE's data, handed to the logical unit piece by piece as it
/// arrives (cut-through WRITE, see [`Requester::data_out`]). The transport
/// creates it for a command that [`ScsiTarget::streams_write`] accepted,
/// passes a clone with the command, fills [`PIECE_BYTES`]-byte pieces (the
/// last one shorter) in aligned buffers and hands each over complete, in
/// any order, then ends the transfer. Clones share one stream.
///
/// [`Requester::data_out`]: crate::Requester::data_out
/// [`ScsiTarget::streams_write`]: crate::ScsiTarget::streams_write
/// [`PIECE_BYTES`]: WriteStream::PIECE_BYTES
#[derive(Clone)]
pub struct WriteStream(Arc<Shared>);

impl std::fmt::Debug for WriteStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WriteStream({} bytes)", self.0.len)
    }
}

/// The same stream, not equal contents.
impl PartialEq for WriteStream {
    fn eq(&self, other: &WriteStream) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for WriteStream {}

struct Shared {
    len: usize,
    pieces: usize,
    /// Set once the unit has checked the command and holds its range.
    unit: OnceLock<Unit>,
    state: Mutex<State>,
}

/// What the unit needs to write the pieces.
struct Unit {
    lu: Arc<LogicalUnit>,
    /// Byte offset of the write.
    off: u64,
    fua: bool,
    data_out_len: Option<usize>,
}

/// How the data transfer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Complete,
    Abandoned,
}

struct State {
    /// Pieces handed over, not yet submitted.
    queued: VecDeque<(usize, IoBuf)>,
    /// Which pieces were handed over.
    given: Vec<bool>,
    written: usize,
    in_flight: usize,
    /// The first piece that failed, and why.
    failed: Option<(usize, BackendError)>,
    ended: Option<End>,
    /// The range, held until the answer.
    guard: Option<OwnedRangeGuard>,
    /// The command's completion, taken when it answers.
    done: Option<ScsiCompletion>,
}

/// The next thing to do, outside the lock.
enum Step {
    Write(usize, IoBuf),
    Finish(ScsiCompletion, ScsiResponse, Option<OwnedRangeGuard>),
}

impl WriteStream {
    /// Bytes of every piece but the last.
    pub const PIECE_BYTES: usize = PIECE;

    /// Writes shorter than this go whole.
    pub const MIN_BYTES: usize = 2 * PIECE;

    /// A stream for a write of `len` bytes.
    pub fn new(len: usize) -> WriteStream {
        let pieces = len.div_ceil(PIECE);
        WriteStream(Arc::new(Shared {
            len,
            pieces,
            unit: OnceLock::new(),
            state: Mutex::new(State {
                queued: VecDeque::new(),
                given: vec![false; pieces],
                written: 0,
                in_flight: 0,
                failed: None,
                ended: None,
                guard: None,
                done: None,
            }),
        }))
    }

    /// Bytes of the whole write.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Whether the write is empty.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// Number of pieces.
    pub fn pieces(&self) -> usize {
        self.0.pieces
    }

    /// Byte offset (in the write) and length of piece `i`.
    pub fn piece(&self, i: usize) -> (usize, usize) {
        let start = i * PIECE;
        (start, PIECE.min(self.0.len.saturating_sub(start)))
    }

    /// Whether the data is no longer wanted: a piece failed, or the
    /// transfer was abandoned. Later pieces may be dropped unfilled.
    pub fn is_closed(&self) -> bool {
        let st = self.lock();
        st.failed.is_some() || st.ended == Some(End::Abandoned)
    }

    /// Piece `i`, complete: written when there is room on the device
    /// (dropped when the data is no longer wanted, see
    /// [`is_closed`](Self::is_closed)).
    pub fn put(&self, i: usize, data: IoBuf) -> Result<(), WriteStreamError> {
        if i >= self.0.pieces {
            return Err(WriteStreamError::NoSuchPiece(i));
        }
        let want = self.piece(i).1;
        if data.len() != want {
            return Err(WriteStreamError::WrongLength {
                piece: i,
                len: data.len(),
                want,
            });
        }
        {
            let mut st = self.lock();
            if st.given[i] {
                return Err(WriteStreamError::Twice(i));
            }
            if st.ended.is_some() {
                return Err(WriteStreamError::Ended);
            }
            st.given[i] = true;
            if st.failed.is_some() {
                return Ok(());
            }
            st.queued.push_back((i, data));
        }
        self.pump();
        Ok(())
    }

    /// Every piece has been handed over: the command answers once they
    /// are written.
    pub fn end(&self) {
        self.lock().ended.get_or_insert(End::Complete);
        self.pump();
    }

    /// The transfer will not complete (task aborted, connection lost, bad
    /// Data-Out): no more pieces are submitted, the command answers once
    /// those in flight are done.
    pub fn abandon(&self) {
        {
            let mut st = self.lock();
            st.ended = Some(End::Abandoned);
            st.queued.clear();
        }
        self.pump();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The unit checked the command: write the pieces from now on and
    /// answer through `done`.
    fn attach(&self, unit: Unit, guard: OwnedRangeGuard, done: ScsiCompletion) {
        let lu = unit.lu.clone();
        if self.0.unit.set(unit).is_err() {
            // A stream serves one command.
            done(lu.respond(Err(codes::INTERNAL_FAILURE), None));
            return;
        }
        {
            let mut st = self.lock();
            st.guard = Some(guard);
            st.done = Some(done);
        }
        self.pump();
    }

    /// Submit what there is room for, or answer, until there is nothing
    /// to do now. Any thread; pieces finished at once are recorded here.
    fn pump(&self) {
        loop {
            let step = {
                let mut st = self.lock();
                self.next_step(&mut st)
            };
            match step {
                None => return,
                Some(Step::Write(i, data)) => {
                    if let Some(r) = self.submit(i, data) {
                        self.record(i, r);
                    }
                }
                Some(Step::Finish(done, resp, guard)) => {
                    // The range is free before the initiator hears of it.
                    drop(guard);
                    done(resp);
                    return;
                }
            }
        }
    }

    fn next_step(&self, st: &mut State) -> Option<Step> {
        let unit = self.0.unit.get()?;
        st.done.as_ref()?;
        let stopped = st.failed.is_some() || st.ended == Some(End::Abandoned);
        if stopped {
            st.queued.clear();
        } else if st.in_flight < DEPTH {
            if let Some((i, data)) = st.queued.pop_front() {
                st.in_flight += 1;
                return Some(Step::Write(i, data));
            }
        }
        if st.in_flight > 0 || st.ended.is_none() || !st.queued.is_empty() {
            return None;
        }
        let resp = match st.failed.take() {
            Some((i, e)) => {
                let (start, len) = self.piece(i);
                let range = Some((unit.off + start as u64, len as u64));
                unit.lu.io_response(Err(e), true, unit.data_out_len, range)
            }
            None if st.ended == Some(End::Complete) && st.written == self.0.pieces => unit
                .lu
                .io_response(Ok(IoBuf::new()), true, unit.data_out_len, None),
            // Abandoned, or ended with pieces never handed over.
            None => unit
                .lu
                .respond(Err(codes::DATA_PHASE_ERROR), unit.data_out_len),
        };
        let done = st.done.take()?;
        Some(Step::Finish(done, resp, st.guard.take()))
    }

    /// Send piece `i` to the engine (counted in flight already); its
    /// result when it finished at once.
    fn submit(&self, i: usize, data: IoBuf) -> Option<IoResult> {
        let unit = self.0.unit.get().expect("attached before any write");
        let (start, len) = self.piece(i);
        let off = unit.off + start as u64;
        let bs = unit.lu.bs();
        let me = self.clone();
        let r = unit.lu.vol.write_held(
            off / bs,
            len as u64 / bs,
            data,
            unit.fua,
            Box::new(move |r| {
                me.record(i, r);
                me.pump();
            }),
        );
        match r {
            Ok(Submission::Pending) => None,
            Ok(Submission::Done(r)) => Some(r),
            // Not expected of an engine that splits writes; correct, if
            // slower, here.
            Ok(Submission::Blocking(job)) => Some(job()),
            Err(e) => {
                let cause = std::io::Error::other(e.to_string());
                Some(Err(BackendError::Write { offset: off, cause }))
            }
        }
    }

    /// Note piece `i`'s outcome.
    fn record(&self, i: usize, r: IoResult) {
        let mut st = self.lock();
        st.in_flight -= 1;
        match r {
            Ok(_) => st.written += 1,
            Err(e) => {
                if st.failed.is_none() {
                    st.failed = Some((i, e));
                }
            }
        }
    }
}

impl LogicalUnit {
    /// Whether a command with this CDB and expected length would be
    /// written as it arrives ([`WriteStream`]): a WRITE(10) or WRITE(16)
    /// with no flag but DPO and FUA, of at least
    /// [`WriteStream::MIN_BYTES`], whose length is the expected length,
    /// on an engine that splits writes.
    pub fn streams_write(&self, cdb: &[u8], expected_len: u32) -> bool {
        let plain = matches!(cdb.first(), Some(0x2a | 0x8a))
            && cdb.get(1).is_some_and(|f| f & !0x18 == 0)
            && cdb.len() >= if cdb[0] == 0x2a { 10 } else { 16 };
        if !plain {
            return false;
        }
        let bytes = u64::from(BlockCdb::parse(cdb).blocks) * self.bs();
        bytes == u64::from(expected_len)
            && bytes >= WriteStream::MIN_BYTES as u64
            && self.vol.device().splits_writes()
    }

    /// Write `len` bytes at byte `off` from `stream` as they arrive (see
    /// the module documentation); the checks have passed. The command
    /// always answers through `done`, or through the blocking job that
    /// waits for a range a read-modify-write command holds.
    pub(super) fn write_cut_through(
        self: &Arc<Self>,
        stream: &WriteStream,
        off: u64,
        len: usize,
        fua: bool,
        data_out_len: Option<usize>,
        done: ScsiCompletion,
    ) -> Submitted {
        if stream.len() != len {
            return Submitted::Done(self.respond(Err(codes::INVALID_FIELD_IN_IU), data_out_len));
        }
        let unit = Unit {
            lu: self.clone(),
            off,
            fua,
            data_out_len,
        };
        if let Some(guard) = self.vol.ranges().try_lock_shared_owned(off, len as u64) {
            stream.attach(unit, guard, done);
            return Submitted::Pending;
        }
        // A COMPARE AND WRITE (or the like) holds part of the range: wait
        // for it where blocking is fine, then write as usual.
        let stream = stream.clone();
        Submitted::Blocking(Box::new(move || {
            let guard = unit.lu.vol.ranges().lock_shared_owned(off, len as u64);
            let lu = unit.lu.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            stream.attach(
                unit,
                guard,
                Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            );
            rx.recv()
                .unwrap_or_else(|_| lu.respond(Err(codes::INTERNAL_FAILURE), data_out_len))
        }))
    }
}

#[cfg(test)]
#[path = "cut_through_write_tests.rs"]
mod tests;
