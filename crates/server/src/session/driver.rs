//! The tokio driver of a [`Session`]: it waits for the next event, lets
//! the session handle it, and carries out what the session asks for —
//! PDUs to the writer task, commands to the target core's executor.

use std::sync::Arc;
use std::time::Instant;

use ethersan_core::executor::{BlockingPool, Executor};
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
    while let Some(ev) = ch.events.recv().await {
        if matches!(ev, Event::Pdu(_)) {
            ch.pdu_permits.add_permits(1);
        }
        let go_on = session.handle(ev, Instant::now());
        carry_out(&mut session, &executor, &ch);
        if !go_on {
            break;
        }
    }
    // The reader stops for good.
    ch.pdu_permits.close();
    let mut running = session.finish();
    carry_out(&mut session, &executor, &ch);
    while running > 0 {
        match ch.events.recv().await {
            Some(Event::Done(itt, _)) => running = session.finished_running(itt),
            Some(_) => {}
            None => break,
        }
    }
    session.close();
    carry_out(&mut session, &executor, &ch);
}

/// Do what the session asked for.
fn carry_out(session: &mut Session, executor: &Executor, ch: &Channels) {
    while let Some(o) = session.poll_output() {
        match o {
            Output::Send(msg) => {
                let _ = ch.out.send(msg);
            }
            Output::Execute {
                itt,
                target,
                cmd,
                counting,
            } => {
                let tx = ch.events_tx.clone();
                executor.execute(
                    &target,
                    cmd,
                    counting,
                    &TokioBlocking,
                    Arc::new(move |f| {
                        let _ = tx.send(Event::Done(itt, f));
                    }),
                );
            }
        }
    }
}

/// A [`Session`]'s budget releases, waking it with [`Event::Released`]
/// when it waits for them.
pub(crate) fn releases_to(tx: mpsc::UnboundedSender<Event>) -> Arc<super::Releases> {
    super::Releases::new(Box::new(move || {
        let _ = tx.send(Event::Released);
    }))
}
