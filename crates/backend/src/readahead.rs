//! Read-ahead for sequential streams on an `O_DIRECT` store (io_uring).
//!
//! A target sees a sequential reader's commands one window at a time: the
//! initiator sends the next read only when an earlier one has been
//! answered, so while data is on the wire the disk has nothing to do. On
//! this machine's virtual disk a request takes about as long for 128 KiB
//! as for 1 MiB, and the disk sat idle for 1.2–1.7 ms between rounds of a
//! 128 KiB QD16 stream (docs/benchmark.md, "Read-ahead and following"). A local program
//! does not have that gap; a storage array closes it by reading ahead.
//!
//! - A read of [`MIN_READ`] to [`MAX_READ`] bytes that starts where an
//!   earlier one ended makes a stream (up to [`STREAMS`] at once). Each
//!   further read of a stream predicts the reads after it, of the same
//!   size, up to [`WINDOW`] bytes and [`AHEAD`] reads ahead, and
//!   issues them at once (the ring merges adjacent ones into large device
//!   requests).
//! - A read that exactly matches a prediction takes its buffer (no copy):
//!   at once when it has landed, else when it lands.
//! - Writes and anything else that changes the store drop the predictions
//!   they overlap, both when they start and when they finish (a prediction
//!   issued while a write was on the device may hold the old data). A read
//!   that took a prediction before a write started may get the data from
//!   before that write, as it may from the disk for commands in flight
//!   together.
//! - Only for a store this process holds exclusively: another exporter's
//!   writes could not drop the predictions.
//! - At most [`LIMIT`] bytes of predictions per store; a stream that is
//!   replaced gives its predictions up.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::{IoCompletion, IoResult, Submission};

/// Streams followed at once per store.
pub(crate) const STREAMS: usize = 4;
/// How far ahead of a stream's last read its predictions reach.
pub(crate) const WINDOW: u64 = 4 << 20;
/// Predicted bytes held per store, landed or on the device.
pub(crate) const LIMIT: usize = 16 << 20;
/// Reads larger than this are not predicted.
pub(crate) const MAX_READ: usize = 1 << 20;
/// Nor reads smaller than this: a stream of small reads would need many
/// predictions for little data (a device request each, before merging).
pub(crate) const MIN_READ: usize = 32 * 1024;
/// Most predictions ahead of one stream.
pub(crate) const AHEAD: u64 = 32;
/// Reads of one size, each where the one before ended, before a stream
/// is predicted: a mix that is mostly random (Iometer's 75%) follows a
/// read now and then, rarely twice with the same size.
pub(crate) const CONFIRM: u32 = 3;

/// One predicted read.
struct Slot(Mutex<SlotState>);

enum SlotState {
    /// On the device; the read that took it waits here.
    Reading(Option<IoCompletion>),
    /// Landed, not taken yet.
    Landed(IoResult),
    /// Handed to its read.
    Taken,
}

struct Pred {
    len: usize,
    stream: u64,
    slot: Arc<Slot>,
}

struct Stream {
    id: u64,
    /// Where the stream's next read starts.
    next: u64,
    /// Where its predictions end.
    ahead: u64,
    /// The tick of its last read (the least recent is replaced).
    used: u64,
    /// Its reads' size, and how many in a row had it.
    len: usize,
    run: u32,
}

#[derive(Default)]
struct State {
    streams: Vec<Stream>,
    preds: BTreeMap<u64, Pred>,
    bytes: usize,
    tick: u64,
    next_id: u64,
}

impl State {
    fn remove(&mut self, off: u64) -> Option<Pred> {
        let p = self.preds.remove(&off)?;
        self.bytes -= p.len;
        Some(p)
    }

    /// Drop the predictions of stream `id` that start in `[from, to)`.
    fn drop_stream(&mut self, id: u64, from: u64, to: u64) {
        let gone: Vec<u64> = self
            .preds
            .range(from..to)
            .filter(|(_, p)| p.stream == id)
            .map(|(&k, _)| k)
            .collect();
        for k in gone {
            self.remove(k);
        }
    }
}

/// A store's read-ahead (see the module documentation).
#[derive(Default)]
pub(crate) struct ReadAhead {
    state: Mutex<State>,
    /// Reads answered from a prediction.
    hits: AtomicU64,
    /// Bytes read ahead.
    issued: AtomicU64,
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAhead")
            .field("hits", &self.hits)
            .field("issued", &self.issued)
            .finish()
    }
}

impl ReadAhead {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads answered from a prediction so far.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Bytes read ahead so far.
    pub(crate) fn issued(&self) -> u64 {
        self.issued.load(Ordering::Relaxed)
    }

    /// A read of `len` bytes at `off` on a store of `size` bytes: answered
    /// from a prediction (`Ok`), or `Err(done)` for the caller to read
    /// from the device. Either way the stream it continues is predicted
    /// further through `issue(offset, len, completion)`.
    pub(crate) fn read(
        &self,
        off: u64,
        len: usize,
        size: u64,
        done: IoCompletion,
        issue: impl Fn(u64, usize, IoCompletion),
    ) -> Result<Submission, IoCompletion> {
        let mut issues = Vec::new();
        let taken = {
            let mut st = self.lock();
            st.tick += 1;
            let tick = st.tick;
            let taken = match st.preds.get(&off) {
                Some(p) if p.len == len => st.remove(off).map(|p| p.slot),
                _ => None,
            };
            let end = off + len as u64;
            if let Some(i) = st.streams.iter().position(|s| s.next == off) {
                let (id, from, run) = {
                    let s = &mut st.streams[i];
                    s.next = end;
                    s.used = tick;
                    if s.len == len {
                        s.run += 1;
                    } else {
                        (s.len, s.run) = (len, 1);
                    }
                    (s.id, s.ahead.max(end), s.run)
                };
                // Predictions the stream went past unused.
                st.drop_stream(id, 0, off);
                let mut at = from;
                if run >= CONFIRM && (MIN_READ..=MAX_READ).contains(&len) {
                    let reach = end + WINDOW.min(AHEAD * len as u64);
                    while at < reach && at + len as u64 <= size {
                        if st.preds.contains_key(&at) {
                            // Predicted already (by a stream it met).
                            at += len as u64;
                            continue;
                        }
                        if st.bytes + len > LIMIT {
                            break;
                        }
                        let slot = Arc::new(Slot(Mutex::new(SlotState::Reading(None))));
                        st.preds.insert(
                            at,
                            Pred {
                                len,
                                stream: id,
                                slot: slot.clone(),
                            },
                        );
                        st.bytes += len;
                        issues.push((at, slot));
                        at += len as u64;
                    }
                }
                st.streams[i].ahead = at;
            } else if (MIN_READ..=MAX_READ).contains(&len) {
                if st.streams.len() == STREAMS {
                    let (i, _) = st
                        .streams
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, s)| s.used)
                        .expect("streams are full");
                    let old = st.streams.swap_remove(i);
                    st.drop_stream(old.id, 0, u64::MAX);
                }
                let id = st.next_id;
                st.next_id += 1;
                st.streams.push(Stream {
                    id,
                    next: end,
                    ahead: end,
                    used: tick,
                    len,
                    run: 1,
                });
            }
            taken
        };
        for (at, slot) in issues {
            self.issued.fetch_add(len as u64, Ordering::Relaxed);
            issue(at, len, Box::new(move |r| land(&slot, r)));
        }
        let Some(slot) = taken else {
            return Err(done);
        };
        let mut s = slot.0.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *s, SlotState::Taken) {
            SlotState::Landed(Ok(buf)) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Ok(Submission::Done(Ok(buf)))
            }
            // A failed prediction: the read goes to the device itself.
            SlotState::Landed(Err(_)) | SlotState::Taken => Err(done),
            SlotState::Reading(_) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                *s = SlotState::Reading(Some(done));
                Ok(Submission::Pending)
            }
        }
    }

    /// Forget the predictions that overlap `[off, off + len)`: the store
    /// changes there.
    pub(crate) fn invalidate(&self, off: u64, len: u64) {
        let mut st = self.lock();
        if st.preds.is_empty() {
            return;
        }
        let end = off.saturating_add(len);
        let gone: Vec<u64> = st
            .preds
            .range(off.saturating_sub(MAX_READ as u64)..end)
            .filter(|(&k, p)| k + p.len as u64 > off)
            .map(|(&k, _)| k)
            .collect();
        for k in gone {
            st.remove(k);
        }
    }
}

/// A prediction's read finished: to the read waiting for it, or kept.
fn land(slot: &Slot, r: IoResult) {
    let waiter = {
        let mut s = slot.0.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *s, SlotState::Taken) {
            SlotState::Reading(Some(done)) => Some(done),
            SlotState::Reading(None) => {
                *s = SlotState::Landed(r);
                return;
            }
            other => {
                *s = other;
                return;
            }
        }
    };
    if let Some(done) = waiter {
        done(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoBuf;
    use std::sync::mpsc;

    type Issued = Arc<Mutex<Vec<(u64, usize, IoCompletion)>>>;

    fn issuer(log: &Issued) -> impl Fn(u64, usize, IoCompletion) + '_ {
        move |o, l, c| log.lock().unwrap().push((o, l, c))
    }

    fn data(off: u64, len: usize) -> IoBuf {
        IoBuf::from(
            (0..len)
                .map(|i| (off as usize + i) as u8)
                .collect::<Vec<u8>>(),
        )
    }

    /// Complete every issued prediction with its bytes.
    fn land_all(log: &Issued) {
        for (o, l, c) in log.lock().unwrap().drain(..) {
            c(Ok(data(o, l)));
        }
    }

    fn read(
        ra: &ReadAhead,
        log: &Issued,
        off: u64,
        len: usize,
    ) -> (Result<Submission, ()>, mpsc::Receiver<IoResult>) {
        let (tx, rx) = mpsc::channel();
        let r = ra.read(
            off,
            len,
            1 << 30,
            Box::new(move |r| tx.send(r).unwrap()),
            issuer(log),
        );
        (r.map_err(|_| ()), rx)
    }

    #[test]
    fn a_stream_is_predicted_and_its_reads_take_the_predictions() {
        let ra = ReadAhead::default();
        let log: Issued = Arc::default();
        let len = 128 * 1024;
        // The first read starts a stream, the next continue it; the
        // CONFIRM-th predicts a window ahead.
        for i in 0..CONFIRM as u64 - 1 {
            assert!(read(&ra, &log, i * len as u64, len).0.is_err());
            assert!(log.lock().unwrap().is_empty());
        }
        assert!(read(&ra, &log, (CONFIRM as u64 - 1) * len as u64, len)
            .0
            .is_err());
        let offs: Vec<u64> = log.lock().unwrap().iter().map(|(o, _, _)| *o).collect();
        assert_eq!(offs.len() as u64, WINDOW / len as u64);
        assert_eq!(offs[0], CONFIRM as u64 * len as u64);
        assert!(offs.windows(2).all(|w| w[1] == w[0] + len as u64));
        // A read that waits for its prediction, then one that finds it landed.
        let c = u64::from(CONFIRM);
        let (r, rx) = read(&ra, &log, c * len as u64, len);
        assert!(matches!(r, Ok(Submission::Pending)));
        land_all(&log);
        let got = rx.recv().unwrap().unwrap();
        assert!(got[..] == data(c * len as u64, len)[..]);
        let (r, _) = read(&ra, &log, (c + 1) * len as u64, len);
        let Ok(Submission::Done(Ok(buf))) = r else {
            panic!("a landed prediction answers at once");
        };
        assert!(buf[..] == data((c + 1) * len as u64, len)[..]);
        assert_eq!(ra.hits(), 2);
        // A read of another size at a predicted offset goes to the device.
        assert!(read(&ra, &log, (c + 2) * len as u64, 4096).0.is_err());
    }

    #[test]
    fn writes_drop_the_predictions_they_overlap_and_random_reads_predict_nothing() {
        let ra = ReadAhead::default();
        let log: Issued = Arc::default();
        let len = 65536;
        for i in 0..3 {
            assert!(read(&ra, &log, i * len as u64, len).0.is_err());
        }
        assert_eq!(
            log.lock().unwrap().len() as u64,
            AHEAD,
            "at most AHEAD ahead"
        );
        land_all(&log);
        ra.invalidate(4 * len as u64 + 100, 1);
        assert!(read(&ra, &log, 3 * len as u64, len).0.is_ok());
        assert!(
            read(&ra, &log, 4 * len as u64, len).0.is_err(),
            "overwritten"
        );
        assert!(read(&ra, &log, 5 * len as u64, len).0.is_ok());
        // Random reads: no stream, nothing issued.
        log.lock().unwrap().clear();
        for off in [90u64, 7, 55, 21, 70] {
            let _ = read(&ra, &log, off << 20, 4096);
        }
        assert!(log.lock().unwrap().is_empty());
        // Small sequential reads (the Iometer mixes' 512 B to 16 KiB that
        // follow each other): no predictions either.
        for len in [512usize, 4096, 16384] {
            for i in 0..4u64 {
                let _ = read(&ra, &log, (200 << 20) + i * len as u64, len);
            }
        }
        assert!(log.lock().unwrap().is_empty());
    }

    #[test]
    fn predictions_stay_under_the_limit_and_a_replaced_stream_gives_them_up() {
        let ra = ReadAhead::default();
        let log: Issued = Arc::default();
        let len = MAX_READ;
        for s in 0..STREAMS as u64 + 2 {
            let base = s << 30 >> 4;
            for i in 0..u64::from(CONFIRM) {
                let _ = read(&ra, &log, base + i * len as u64, len);
            }
            assert!(ra.lock().bytes <= LIMIT);
        }
        let st = ra.lock();
        assert_eq!(st.streams.len(), STREAMS);
        let ids: Vec<u64> = st.streams.iter().map(|s| s.id).collect();
        assert!(st.preds.values().all(|p| ids.contains(&p.stream)));
        assert_eq!(st.bytes, st.preds.values().map(|p| p.len).sum::<usize>());
    }
}
