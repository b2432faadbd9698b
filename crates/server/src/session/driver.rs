//! The tokio driver of a [`Session`]: it waits for the next event, lets
//! the session handle it, and carries out what the session asks for —
//! PDUs to the writer task, commands to the target core's executor.

use std::sync::Arc;
use std::time::Instant;

use ethersan_core::executor::{BlockingPool, Done, Executor, Finished};
use tokio::sync::{mpsc, Semaphore};

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
    /// Bounds the PDUs read ahead of the session: the reader takes a
    /// permit per PDU, the session gives it back as it takes the PDU.
    pub(crate) pdu_permits: Arc<Semaphore>,
    /// Frames to the writer task.
    pub(crate) out: mpsc::UnboundedSender<WriterMsg>,
}

/// Run `session` until logout, connection loss or shutdown.
pub(crate) async fn run(mut session: Session, executor: Executor, mut ch: Channels) {
    session.begin();
    let mut send = |msg| {
        let _ = ch.out.send(msg);
    };
    let events_tx = ch.events_tx.clone();
    let done: Done = Arc::new(move |itt, f| {
        let _ = events_tx.send(Event::Done(itt, f));
    });
    while let Some(ev) = ch.events.recv().await {
        if matches!(ev, Event::Pdu(_)) {
            ch.pdu_permits.add_permits(1);
        }
        let now = Instant::now();
        let go_on = session.handle(ev, now);
        let go_on = settle(
            &mut session,
            &executor,
            &TokioBlocking,
            &mut send,
            &done,
            now,
        ) && go_on;
        if !go_on {
            break;
        }
    }
    // The reader stops for good.
    ch.pdu_permits.close();
    let mut running = session.finish();
    for (itt, _) in carry_out(&mut session, &executor, &TokioBlocking, &mut send, &done) {
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
    carry_out(&mut session, &executor, &TokioBlocking, &mut send, &done);
}

/// Do what the session asked for until it asks for nothing more: frames
/// to `send`, commands to the executor. A command that finished at once
/// goes straight back to the session (no trip through the event queue,
/// no second wake-up). False when handling one ended the session.
pub(crate) fn settle(
    session: &mut Session,
    executor: &Executor,
    pool: &dyn BlockingPool,
    send: &mut dyn FnMut(WriterMsg),
    done: &Done,
    now: Instant,
) -> bool {
    let mut go_on = true;
    loop {
        let finished = carry_out(session, executor, pool, send, done);
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
