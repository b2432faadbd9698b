//! The tokio driver of a [`Session`]: it waits for the next event, lets
//! the session handle it, and carries out what the session asks for —
//! PDUs to the writer task, commands to the target core's executor.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ethersan_core::executor::{BlockingPool, Done, Early, Executor, Finished};
use ethersan_scsi::IoBuf;
use tokio::sync::{mpsc, Notify};

use super::{Event, Output, Session};
use crate::wire::WriterMsg;

/// Blocking commands run on tokio's blocking pool.
struct TokioBlocking;

impl BlockingPool for TokioBlocking {
    fn spawn(&self, job: Box<dyn FnOnce() + Send>) {
        tokio::task::spawn_blocking(job);
    }
}

/// The channels a session is driven through.
pub(crate) struct Channels {
    /// PDUs from the reader task, completions, control messages, timers,
    /// budget wake-ups: everything the session waits for, in one queue (a
    /// second queue would let the session's own completions wake it
    /// again through the other queue's stale waker).
    pub(crate) events: mpsc::UnboundedReceiver<Event>,
    /// The same queue's sending side, for command completions.
    pub(crate) events_tx: mpsc::UnboundedSender<Event>,
    /// Bounds the PDUs read ahead of the session.
    pub(crate) read_ahead: Arc<ReadAhead>,
    /// Frames to the writer task.
    pub(crate) out: mpsc::UnboundedSender<WriterMsg>,
    /// The channel's registrations, when writes' data comes placed (a
    /// native transport channel).
    pub(crate) buffers: Option<ethersan_endpoint::Registrar>,
}

/// Where a session's writes' buffers are registered for placed data (a
/// channel's [`Registrar`](ethersan_endpoint::Registrar); a map in tests).
pub(crate) trait WriteBuffers: Sync {
    /// Register a buffer of `len` bytes under `itt` that starts with
    /// `prefix` (counted as landed; the rest not initialised).
    fn expect(&self, itt: u32, prefix: IoBuf, len: usize);
    /// Copy `data` in at `offset`; false when there is no room for it.
    fn place(&self, itt: u32, offset: u64, data: &[u8]) -> bool;
    /// Take the registration back.
    fn release(&self, itt: u32) -> Option<ethersan_endpoint::PlacedBuf>;
}

impl WriteBuffers for ethersan_endpoint::Registrar {
    fn expect(&self, itt: u32, prefix: IoBuf, len: usize) {
        let (raw, start) = prefix.into_parts();
        self.expect_prefix_at(itt, raw, start, len)
    }
    fn place(&self, itt: u32, offset: u64, data: &[u8]) -> bool {
        ethersan_endpoint::Registrar::place(self, itt, offset, data)
    }
    fn release(&self, itt: u32) -> Option<ethersan_endpoint::PlacedBuf> {
        ethersan_endpoint::Registrar::release(self, itt)
    }
}

/// Bounds the PDUs the reader task reads ahead of the session (it stops
/// reading while the session is behind, and TCP pushes back on the
/// initiator): one atomic count per PDU on each side, and a wake-up only
/// when the reader waits for room.
pub(crate) struct ReadAhead {
    queued: AtomicUsize,
    limit: usize,
    room: Notify,
    closed: AtomicBool,
}

impl ReadAhead {
    /// At most `limit` PDUs queued ahead of the session.
    pub(crate) fn new(limit: usize) -> Arc<ReadAhead> {
        Arc::new(ReadAhead {
            queued: AtomicUsize::new(0),
            limit: limit.max(1),
            room: Notify::new(),
            closed: AtomicBool::new(false),
        })
    }

    /// The reader: wait until one more PDU may be queued; false once the
    /// session has ended.
    pub(crate) async fn reserve(&self) -> bool {
        loop {
            if self.closed.load(Ordering::Acquire) {
                return false;
            }
            // Only the reader adds, so room seen here stays room.
            if self.queued.load(Ordering::Acquire) < self.limit {
                self.queued.fetch_add(1, Ordering::AcqRel);
                return true;
            }
            // A `taken` between the check and here leaves a permit in
            // `room`: no wake-up is lost.
            self.room.notified().await;
        }
    }

    /// The session took one queued PDU.
    pub(crate) fn taken(&self) {
        let before = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if before == Ok(self.limit) {
            self.room.notify_one();
        }
    }

    /// The session has ended: the reader stops.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.room.notify_one();
    }
}

/// Run `session` until logout, connection loss or shutdown; returns why
/// it ended.
pub(crate) async fn run(
    mut session: Session,
    executor: Executor,
    mut ch: Channels,
) -> &'static str {
    session.begin();
    let mut send = |msg| {
        let _ = ch.out.send(msg);
    };
    let events_tx = ch.events_tx.clone();
    let done: Done = Arc::new(move |itt, f| {
        let _ = events_tx.send(Event::Done(itt, f));
    });
    let early_tx = ch.events_tx.clone();
    session.set_early(Early(Arc::new(move |itt, part, total| {
        let _ = early_tx.send(Event::Early(itt, part, total));
    })));
    let buffers = ch.buffers.take();
    let buffers = buffers.as_ref().map(|b| b as &dyn WriteBuffers);
    while let Some(ev) = ch.events.recv().await {
        if matches!(ev, Event::Pdu(_) | Event::WriteCommand(..)) {
            ch.read_ahead.taken();
        }
        let now = Instant::now();
        let go_on = session.handle(ev, now);
        let go_on = settle(
            &mut session,
            &executor,
            &TokioBlocking,
            &mut send,
            &done,
            buffers,
            now,
        ) && go_on;
        if !go_on {
            break;
        }
    }
    // The reader stops for good.
    ch.read_ahead.close();
    let mut running = session.finish();
    for (itt, _) in carry_out(
        &mut session,
        &executor,
        &TokioBlocking,
        &mut send,
        &done,
        buffers,
    ) {
        running = session.finished_running(itt);
    }
    while running > 0 {
        match ch.events.recv().await {
            Some(Event::Done(itt, _)) => running = session.finished_running(itt),
            Some(_) => {}
            None => break,
        }
    }
    session.close();
    carry_out(
        &mut session,
        &executor,
        &TokioBlocking,
        &mut send,
        &done,
        buffers,
    );
    session.end_reason()
}

/// Do what the session asked for until it asks for nothing more: frames
/// to `send`, commands to the executor, writes' buffers to `buffers`. A
/// command that finished at once
/// goes straight back to the session (no trip through the event queue,
/// no second wake-up). False when handling one ended the session.
pub(crate) fn settle(
    session: &mut Session,
    executor: &Executor,
    pool: &dyn BlockingPool,
    send: &mut dyn FnMut(WriterMsg),
    done: &Done,
    buffers: Option<&dyn WriteBuffers>,
    now: Instant,
) -> bool {
    let mut go_on = true;
    loop {
        let finished = carry_out(session, executor, pool, send, done, buffers);
        if finished.is_empty() {
            return go_on;
        }
        for (itt, f) in finished {
            go_on = session.handle(Event::Done(itt, f), now) && go_on;
        }
    }
}

/// Do what the session asked for; returns the commands that finished at
/// once (the others report through `done`).
fn carry_out(
    session: &mut Session,
    executor: &Executor,
    pool: &dyn BlockingPool,
    send: &mut dyn FnMut(WriterMsg),
    done: &Done,
    buffers: Option<&dyn WriteBuffers>,
) -> Vec<(u32, Finished)> {
    let mut finished = Vec::new();
    while let Some(o) = session.poll_output() {
        match o {
            Output::Send(msg) => send(msg),
            Output::Execute {
                itt,
                target,
                cmd,
                counting,
            } => {
                if let Some(f) = executor.execute(&target, cmd, counting, pool, done) {
                    finished.push((itt, f));
                }
            }
            Output::Expect { itt, prefix, len } => {
                if let Some(b) = buffers {
                    b.expect(itt, prefix, len);
                }
            }
            Output::Place { itt, offset, data } => {
                if let Some(b) = buffers {
                    b.place(itt, u64::from(offset), &data);
                }
            }
            Output::Forget(itt) => {
                if let Some(b) = buffers {
                    b.release(itt);
                }
            }
            Output::Reclaim(itt) => {
                let placed = buffers.and_then(|b| b.release(itt));
                session.reclaimed(itt, placed);
            }
        }
    }
    finished
}

/// A [`Session`]'s budget releases, waking it with [`Event::Released`]
/// when it waits for them.
pub(crate) fn releases_to(tx: mpsc::UnboundedSender<Event>) -> Arc<super::Releases> {
    super::Releases::new(Box::new(move || {
        let _ = tx.send(Event::Released);
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::ReadAhead;

    #[tokio::test]
    async fn the_reader_waits_for_room_and_stops_when_the_session_ends() {
        let ra = ReadAhead::new(2);
        assert!(ra.reserve().await);
        assert!(ra.reserve().await);
        // Full: the third waits until the session takes one.
        let third = tokio::spawn({
            let ra = ra.clone();
            async move { ra.reserve().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!third.is_finished(), "a third PDU was read ahead");
        ra.taken();
        assert!(tokio::time::timeout(Duration::from_secs(5), third)
            .await
            .expect("room after taken")
            .unwrap());
        // Full again; closing releases the waiting reader with false.
        let fourth = tokio::spawn({
            let ra = ra.clone();
            async move { ra.reserve().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        ra.close();
        assert!(!tokio::time::timeout(Duration::from_secs(5), fourth)
            .await
            .expect("closing wakes the reader")
            .unwrap());
        // More taken than reserved never wraps the count.
        for _ in 0..5 {
            ra.taken();
        }
        assert!(!ra.reserve().await, "closed");
    }
}
