//! A channel as a byte stream: [`ChannelReader`] (`AsyncRead`) and
//! [`ChannelWriter`] (`AsyncWrite`), what the iSCSI code reads PDUs from
//! and writes them to.
//!
//! Each `write` becomes one channel message (the iSCSI writers hand over
//! whole PDUs or batches of them); received messages are read back as a
//! byte stream. Writes are bounded: when more than [`WRITE_LIMIT`] bytes
//! are queued or unacknowledged, `poll_write` waits until the peer
//! acknowledges some.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, Notify};

use crate::{ChannelInfo, Command};

/// Most bytes a writer may have queued or unacknowledged on a channel.
pub const WRITE_LIMIT: usize = 8 << 20;

/// Most bytes of received messages the endpoint queues for a channel's
/// reader (one message may pass it). Beyond it the endpoint leaves whole
/// messages in the channel, whose receive window shrinks by their frames:
/// a reader that stops makes the peer stop. See docs/native-transport.md
/// §Receive budget.
pub const RECV_BUDGET: usize = 1 << 20;

/// State a channel's stream halves share with the endpoint's task.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Bytes written and not yet acknowledged by the peer.
    pub(crate) unacked: AtomicUsize,
    /// Woken when `unacked` falls or the channel ends.
    pub(crate) writer: AtomicWaker,
    /// The channel has ended (closed or failed): writes fail.
    pub(crate) ended: AtomicBool,
    /// Why it failed, when it did.
    pub(crate) failure: Mutex<Option<String>>,
    /// Buffers registered for placed data (the message API's).
    pub(crate) placements: crate::placed::Placements,
    /// Bytes of messages queued for the reader and not yet taken.
    pub(crate) app_bytes: AtomicUsize,
    /// Wakes the endpoint's task (the reader took messages: there is room
    /// to queue more).
    pub(crate) wake: Arc<Notify>,
}

impl Shared {
    pub(crate) fn new(wake: Arc<Notify>) -> Shared {
        Shared {
            wake,
            ..Shared::default()
        }
    }

    /// The reader took a message of `n` bytes from its queue.
    pub(crate) fn taken(&self, n: usize) {
        let before = self.app_bytes.fetch_sub(n, Ordering::AcqRel);
        // The task stops queueing at the budget; wake it once the reader
        // has drained half of it.
        if before >= RECV_BUDGET / 2 && before - n < RECV_BUDGET / 2 {
            self.wake.notify_one();
        }
    }

    pub(crate) fn end(&self, failure: Option<String>) {
        if let Some(f) = failure {
            *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
        }
        self.ended.store(true, Ordering::Release);
        self.writer.wake();
    }

    fn error(&self) -> io::Error {
        match &*self.failure.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(f) => io::Error::new(io::ErrorKind::ConnectionReset, f.clone()),
            None => io::Error::new(io::ErrorKind::BrokenPipe, "the channel is closed"),
        }
    }
}

/// An open channel: both halves and what it is.
#[derive(Debug)]
pub struct ChannelStream {
    /// The receiving half.
    pub reader: ChannelReader,
    /// The sending half.
    pub writer: ChannelWriter,
    /// The channel's peer, level and ids.
    pub info: ChannelInfo,
}

/// The receiving half of a channel.
#[derive(Debug)]
pub struct ChannelReader {
    rx: mpsc::UnboundedReceiver<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
    shared: Arc<Shared>,
}

impl ChannelReader {
    pub(crate) fn new(rx: mpsc::UnboundedReceiver<Vec<u8>>, shared: Arc<Shared>) -> Self {
        ChannelReader {
            rx,
            cur: Vec::new(),
            pos: 0,
            shared,
        }
    }
}

impl ChannelReader {
    /// The next whole message; `Ok(None)` once the channel closed, an
    /// error when it failed. Bytes of a message partly read through
    /// `AsyncRead` come first.
    pub(crate) async fn recv_message(&mut self) -> io::Result<Option<Vec<u8>>> {
        if self.pos < self.cur.len() {
            let rest = self.cur.split_off(self.pos);
            self.cur = Vec::new();
            self.pos = 0;
            return Ok(Some(rest));
        }
        match self.rx.recv().await {
            Some(m) => {
                self.shared.taken(m.len());
                Ok(Some(m))
            }
            None => {
                let failed = self
                    .shared
                    .failure
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_some();
                if failed {
                    Err(self.shared.error())
                } else {
                    Ok(None)
                }
            }
        }
    }
}

impl AsyncRead for ChannelReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        while this.pos == this.cur.len() {
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(m)) => {
                    this.shared.taken(m.len());
                    this.cur = m;
                    this.pos = 0;
                }
                Poll::Ready(None) => {
                    // Ended: a failure is an error, a close the end of file.
                    let failed = this
                        .shared
                        .failure
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .is_some();
                    return if failed {
                        Poll::Ready(Err(this.shared.error()))
                    } else {
                        Poll::Ready(Ok(()))
                    };
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = buf.remaining().min(this.cur.len() - this.pos);
        buf.put_slice(&this.cur[this.pos..this.pos + n]);
        this.pos += n;
        if this.pos == this.cur.len() {
            this.cur = Vec::new();
            this.pos = 0;
        }
        Poll::Ready(Ok(()))
    }
}

/// The sending half of a channel. Dropping it (or shutting it down)
/// closes the channel once everything written has been delivered.
#[derive(Debug)]
pub struct ChannelWriter {
    id: u32,
    tx: mpsc::UnboundedSender<Command>,
    shared: Arc<Shared>,
    closed: bool,
    linger: bool,
}

impl ChannelWriter {
    pub(crate) fn new(id: u32, tx: mpsc::UnboundedSender<Command>, shared: Arc<Shared>) -> Self {
        ChannelWriter {
            id,
            tx,
            shared,
            closed: false,
            linger: false,
        }
    }

    /// Make `shutdown` wait until the channel has ended (the peer answered
    /// the CLOSE, sent its own, or the channel failed) instead of only
    /// asking for the close. A client that exits right after its session
    /// uses it: the endpoint's task dies with the process, and a CLOSE
    /// never sent leaves the target holding the channel until its timeout.
    pub fn linger(mut self) -> Self {
        self.linger = true;
        self
    }

    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            let _ = self.tx.send(Command::Close { id: self.id });
        }
    }
}

impl ChannelWriter {
    /// Ready when the channel is open and has room (fewer than
    /// [`WRITE_LIMIT`] bytes unacknowledged).
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.closed || self.shared.ended.load(Ordering::Acquire) {
            return Poll::Ready(Err(self.shared.error()));
        }
        if self.shared.unacked.load(Ordering::Acquire) >= WRITE_LIMIT {
            self.shared.writer.register(cx.waker());
            // Check again: the task may have released bytes in between.
            if self.shared.unacked.load(Ordering::Acquire) >= WRITE_LIMIT
                && !self.shared.ended.load(Ordering::Acquire)
            {
                return Poll::Pending;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Hands `msg` to the endpoint as one message.
    fn send(&mut self, msg: Vec<u8>) -> io::Result<usize> {
        self.send_parts(vec![Bytes::from(msg)])
    }

    /// Hands the concatenation of `parts` to the endpoint as one message
    /// (not gathered: each frame is sealed from the parts it covers).
    fn send_parts(&mut self, parts: Vec<Bytes>) -> io::Result<usize> {
        let n = parts.iter().map(Bytes::len).sum();
        self.shared.unacked.fetch_add(n, Ordering::AcqRel);
        self.tx
            .send(Command::Write { id: self.id, parts })
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the endpoint has stopped"))?;
        Ok(n)
    }
}

impl ChannelWriter {
    /// Send the concatenation of `parts` as one message once there is
    /// room.
    pub(crate) async fn send_message_parts(&mut self, parts: Vec<Bytes>) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_room(cx)).await?;
        self.send_parts(parts).map(|_| ())
    }

    /// Send `data` to land in the peer's buffer `tag` at `offset`, once
    /// there is room.
    pub(crate) async fn send_placed(
        &mut self,
        tag: u32,
        offset: u64,
        data: Bytes,
    ) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_room(cx)).await?;
        self.shared.unacked.fetch_add(data.len(), Ordering::AcqRel);
        self.tx
            .send(Command::Placed {
                id: self.id,
                tag,
                offset,
                data,
            })
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the endpoint has stopped"))
    }

    /// The state shared with the channel's other half and the endpoint.
    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// The channel's table of buffers for placed data.
    pub(crate) fn placements(&self) -> &crate::placed::Placements {
        &self.shared.placements
    }
}

/// Most bytes one vectored write gathers into a message.
const MAX_VECTORED: usize = 4 << 20;

impl AsyncWrite for ChannelWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if let Err(e) = std::task::ready!(this.poll_room(cx)) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(this.send(buf.to_vec()))
    }

    /// The slices become one message (the iSCSI target hands over a batch
    /// of PDUs as header, data and digest slices): one message per batch,
    /// not one per slice.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let mut total = 0usize;
        let mut take = 0;
        for b in bufs {
            if total > 0 && total + b.len() > MAX_VECTORED {
                break;
            }
            total += b.len();
            take += 1;
        }
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        if let Err(e) = std::task::ready!(this.poll_room(cx)) {
            return Poll::Ready(Err(e));
        }
        let mut msg = Vec::with_capacity(total);
        for b in &bufs[..take] {
            msg.extend_from_slice(b);
        }
        Poll::Ready(this.send(msg))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.close();
        if !self.linger || self.shared.ended.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        self.shared.writer.register(cx.waker());
        // Check again: the channel may have ended in between.
        if self.shared.ended.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }
}

impl Drop for ChannelWriter {
    fn drop(&mut self) {
        self.close();
    }
}
