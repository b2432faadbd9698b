//! Cut-through WRITE in the session: a large WRITE that its unit writes
//! as the data arrives (`ScsiTarget::streams_write`, decided when the
//! command arrives, before any buffer is allocated) collects its Data-Out
//! into piece buffers of [`WriteStream::PIECE_BYTES`] (aligned, filled
//! where the data lands, a Data-Out straddling two pieces fills both) and
//! hands each piece to the unit as soon as it is full, whatever order the
//! pieces fill in. The command goes to the executor when its turn comes
//! and its buffer is reserved, before its data; the task set sees it as
//! ready from then on.
//!
//! The SCSI Response still follows the last Data-Out (RFC 7143 §11.7.1):
//! an outcome that comes back while data is still owed — a check failed
//! before the unit took the stream — is kept ([`Collecting::deferred`])
//! until the transfer is complete, and the data that still arrives is
//! discarded. Aborting the task, a bad Data-Out or the end of the session
//! abandon the stream: no piece is written after that, and the unit
//! answers once the pieces in flight are done.

use ethersan_core::executor::Finished;
use ethersan_scsi::{IoBuf, WriteStream, WriteStreamError};

use super::{Event, Session};

/// The Data-Out of one cut-through WRITE, being collected.
#[derive(Debug)]
pub(super) struct Collecting {
    stream: WriteStream,
    /// Pieces being filled: index, buffer, bytes received.
    filling: Vec<(usize, IoBuf, usize)>,
    /// The transfer was ended or abandoned.
    ended: bool,
    /// The command's outcome, when it came before the last Data-Out.
    pub(super) deferred: Option<Finished>,
}

impl Collecting {
    /// Collect a write of `len` bytes.
    pub(super) fn new(len: usize) -> Collecting {
        Collecting {
            stream: WriteStream::new(len),
            filling: Vec::new(),
            ended: false,
            deferred: None,
        }
    }

    /// The stream the unit writes from.
    pub(super) fn stream(&self) -> WriteStream {
        self.stream.clone()
    }

    /// Data at byte `off` of the write (the transfer accepted it: every
    /// byte arrives once). Full pieces go to the unit; nothing is kept once
    /// the unit no longer wants the data.
    pub(super) fn fill(&mut self, off: usize, data: &[u8]) -> Result<(), WriteStreamError> {
        if self.ended || self.stream.is_closed() {
            self.filling.clear();
            return Ok(());
        }
        let mut at = off;
        let mut rest = data;
        while !rest.is_empty() {
            let i = at / WriteStream::PIECE_BYTES;
            let (start, len) = self.stream.piece(i);
            if len == 0 {
                return Err(WriteStreamError::NoSuchPiece(i));
            }
            let n = rest.len().min(start + len - at);
            let k = match self.filling.iter().position(|(p, ..)| *p == i) {
                Some(k) => k,
                None => {
                    let buf = IoBuf::aligned_with_capacity(len);
                    self.filling.push((i, buf, 0));
                    self.filling.len() - 1
                }
            };
            let (_, buf, got) = &mut self.filling[k];
            buf.fill_at(at - start, &rest[..n]);
            *got += n;
            if *got >= len {
                let (_, buf, _) = self.filling.swap_remove(k);
                self.stream.put(i, buf)?;
            }
            at += n;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// The last Data-Out is in: the unit answers once every piece is
    /// written.
    pub(super) fn end(&mut self) {
        self.ended = true;
        self.stream.end();
    }

    /// The transfer will not complete, or its data is no longer wanted.
    pub(super) fn abandon(&mut self) {
        self.ended = true;
        self.filling.clear();
        self.stream.abandon();
    }
}

impl Drop for Collecting {
    fn drop(&mut self) {
        if !self.ended {
            self.stream.abandon();
        }
    }
}

impl Session {
    /// Task `itt`'s whole buffer was just reserved: a cut-through WRITE
    /// starts collecting into pieces (its unsolicited data so far is the
    /// first of them) and is ready to run from now on. True when it was
    /// one.
    pub(super) fn begin_collecting(&mut self, itt: u32) -> bool {
        let Some(task) = self.tasks.get_mut(itt) else {
            return false;
        };
        if !task.streams || task.collecting.is_some() || task.fail.is_some() {
            return false;
        }
        if task.transfer.is_none() {
            // All its data came unasked before its buffer was granted:
            // nothing more will arrive to end a stream, so it is written
            // whole, as any write.
            task.streams = false;
            return false;
        }
        let mut c = Collecting::new(task.cmd.expected_len as usize);
        let early = std::mem::take(&mut task.data);
        if let Err(e) = c.fill(0, &early) {
            // Not expected: the first data is at most the write's length.
            tracing::warn!(session = self.setup.id, itt, "{e}; failing the command");
            task.fail = Some(ethersan_core::executor::check_condition(0x0b, 0x4b, 0x00));
            return false;
        }
        task.collecting = Some(c);
        self.streaming.push(itt);
        self.tasks.set_data_ready(itt);
        true
    }

    /// An outcome for a task still collecting Data-Out: kept until the
    /// last Data-Out (the data that still comes is discarded); `None` when
    /// it was kept.
    pub(super) fn defer_done(&mut self, itt: u32, finished: Finished) -> Option<Finished> {
        if self.tasks.is_aborted(itt) {
            return Some(finished);
        }
        let Some(task) = self.tasks.get_mut(itt) else {
            return Some(finished);
        };
        match &mut task.collecting {
            Some(c) if task.transfer.is_some() => {
                c.abandon();
                c.deferred = Some(finished);
                None
            }
            _ => Some(finished),
        }
    }

    /// The transfer of a collecting task is over (`complete`: every byte
    /// arrived; else it is abandoned): the unit answers when its pieces
    /// are written, or the outcome kept for it is handled now.
    pub(super) fn end_collecting(&mut self, itt: u32, complete: bool) {
        let Some(c) = self.tasks.get_mut(itt).and_then(|t| t.collecting.as_mut()) else {
            return;
        };
        if complete {
            c.end();
        } else {
            c.abandon();
        }
        if let Some(f) = c.deferred.take() {
            self.internal.push_back(Event::Done(itt, f));
        }
    }

    /// After task management or the end of the session: the collecting
    /// tasks that were aborted stop writing (those still running answer
    /// once their pieces in flight are done, which completes the abort).
    pub(super) fn abandon_aborted_streams(&mut self) {
        let mut i = 0;
        while i < self.streaming.len() {
            let itt = self.streaming[i];
            if !self.tasks.contains(itt) {
                self.streaming.swap_remove(i);
                continue;
            }
            if self.tasks.is_aborted(itt) {
                self.streaming.swap_remove(i);
                if let Some(t) = self.tasks.get_mut(itt) {
                    t.transfer = None;
                }
                self.end_collecting(itt, false);
                continue;
            }
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Collecting;
    use ethersan_scsi::WriteStream;

    #[test]
    fn data_straddling_pieces_fills_both_in_any_order() {
        let p = WriteStream::PIECE_BYTES;
        let len = 2 * p + 4096;
        let mut c = Collecting::new(len);
        // The end first, then a Data-Out across the first boundary, then
        // the rest: every piece completes once.
        c.fill(2 * p, &vec![3; 4096]).unwrap();
        c.fill(p - 100, &[2; 200]).unwrap();
        c.fill(p + 100, &vec![2; p - 100]).unwrap();
        assert_eq!(c.filling.len(), 1, "only the first piece still open");
        c.fill(0, &vec![1; p - 100]).unwrap();
        assert!(c.filling.is_empty());
        // Every piece went to the stream (a second one is refused).
        let s = c.stream();
        for i in 0..3 {
            let (_, l) = s.piece(i);
            assert!(matches!(
                s.put(i, ethersan_scsi::IoBuf::from(vec![0; l])),
                Err(ethersan_scsi::WriteStreamError::Twice(_))
            ));
        }
        c.end();
    }
}
