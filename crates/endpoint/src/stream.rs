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

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use crate::driver::Command;
use crate::ChannelInfo;

/// Most bytes a writer may have queued or unacknowledged on a channel.
pub const WRITE_LIMIT: usize = 8 << 20;

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
}

impl Shared {
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
}

impl ChannelWriter {
    pub(crate) fn new(id: u32, tx: mpsc::UnboundedSender<Command>, shared: Arc<Shared>) -> Self {
        ChannelWriter {
            id,
            tx,
            shared,
            closed: false,
        }
    }

    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            let _ = self.tx.send(Command::Close { id: self.id });
        }
    }
}

impl AsyncWrite for ChannelWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.closed || this.shared.ended.load(Ordering::Acquire) {
            return Poll::Ready(Err(this.shared.error()));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if this.shared.unacked.load(Ordering::Acquire) >= WRITE_LIMIT {
            this.shared.writer.register(cx.waker());
            // Check again: the task may have released bytes in between.
            if this.shared.unacked.load(Ordering::Acquire) >= WRITE_LIMIT
                && !this.shared.ended.load(Ordering::Acquire)
            {
                return Poll::Pending;
            }
        }
        this.shared.unacked.fetch_add(buf.len(), Ordering::AcqRel);
        if this
            .tx
            .send(Command::Write {
                id: this.id,
                data: buf.to_vec(),
            })
            .is_err()
        {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the endpoint has stopped",
            )));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.close();
        Poll::Ready(Ok(()))
    }
}

impl Drop for ChannelWriter {
    fn drop(&mut self) {
        self.close();
    }
}
