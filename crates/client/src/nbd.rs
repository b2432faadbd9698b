//! A [`BlockTarget`] served to the kernel's NBD driver on one of the
//! sockets the driver was given: requests read as they come (several in
//! flight, up to a queue depth), each run against the target, replies
//! written as they finish, in any order (the handle says which). What
//! `ethersan attach --block` runs per connection.
//!
//! The protocol's framing and checks are `ethersan_nbd`'s; this is the
//! I/O around them, over any byte stream (the kernel's socket, or an
//! in-memory pipe in the tests).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use ethersan_nbd::{
    flags, Command, DecodeError, Device, Errno, Reply, Request, MAX_TRANSFER, REQUEST_LEN,
};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::target::{BlockTarget, Capabilities};

/// How a connection's service ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The kernel sent DISCONNECT: everything before it was answered.
    Disconnected,
    /// The stream closed between two requests.
    Closed,
}

/// What a connection's service did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// How it ended.
    pub ended: Ended,
    /// Requests answered (DISCONNECT not counted).
    pub requests: u64,
}

/// Why a connection's service stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A request header that is not NBD: the stream cannot go on.
    #[error("the NBD peer sent a malformed request: {0}")]
    Malformed(#[from] DecodeError),
    /// Reading or writing the stream failed.
    #[error("the NBD connection failed: {0}")]
    Io(#[from] std::io::Error),
}

/// The transmission flags to give the kernel for `target`
/// (`NBD_ATTR_SERVER_FLAGS`): flush always; FUA, trim and several
/// connections where the transport can; write-zeroes always (written as
/// zeros where the target cannot zero a range itself).
pub fn transmission_flags(caps: Capabilities, read_only: bool) -> u64 {
    let mut f = flags::HAS_FLAGS | flags::SEND_FLUSH | flags::SEND_WRITE_ZEROES;
    if read_only {
        f |= flags::READ_ONLY;
    }
    if caps.fua {
        f |= flags::SEND_FUA;
    }
    if caps.unmap {
        f |= flags::SEND_TRIM;
    }
    if caps.sessions {
        f |= flags::CAN_MULTI_CONN;
    }
    f
}

/// One request read from the stream, its write data with it.
struct Incoming {
    req: Request,
    data: Vec<u8>,
}

type Running<'a> = Pin<Box<dyn Future<Output = (Reply, Vec<u8>)> + Send + 'a>>;

/// Serve `target`, shaped as `dev`, on `stream` until the kernel
/// disconnects or closes it, with at most `depth` requests running at
/// once. A request the device refuses (out of range, misaligned, a write
/// to a read-only device) and one whose I/O fails are answered with an
/// error number and the service goes on; a malformed header ends it.
pub async fn serve<S>(
    target: Arc<dyn BlockTarget>,
    stream: S,
    dev: Device,
    depth: usize,
) -> Result<Served, ServeError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let depth = depth.max(1);
    // The reader runs apart: reading a header is not cancel-safe, and
    // requests keep arriving while replies are written.
    let (tx, mut rx) = mpsc::channel::<Incoming>(depth);
    let reader = tokio::spawn(async move { read_requests(&mut rd, tx).await });
    let mut set: FuturesUnordered<Running<'_>> = FuturesUnordered::new();
    let mut disconnect = false;
    let mut open = true;
    let mut requests = 0u64;
    loop {
        tokio::select! {
            biased;
            Some((reply, data)) = set.next(), if !set.is_empty() => {
                requests += 1;
                wr.write_all(&reply.encode()).await?;
                if reply.error == 0 && !data.is_empty() {
                    wr.write_all(&data).await?;
                }
            }
            inc = rx.recv(), if open && set.len() < depth => {
                match inc {
                    Some(Incoming { req, .. }) if req.command == Command::Disconnect => {
                        disconnect = true;
                        open = false;
                    }
                    Some(inc) => set.push(run(&*target, &dev, inc)),
                    None => open = false,
                }
            }
            else => break,
        }
    }
    wr.flush().await?;
    match reader.await {
        Ok(Ok(())) | Err(_) => {}
        Ok(Err(e)) if !disconnect => return Err(e),
        Ok(Err(_)) => {}
    }
    let ended = if disconnect {
        Ended::Disconnected
    } else {
        Ended::Closed
    };
    Ok(Served { ended, requests })
}

/// Read requests (and their write data) into `tx` until DISCONNECT, the
/// end of the stream, or a malformed header.
async fn read_requests<R: AsyncRead + Unpin>(
    rd: &mut R,
    tx: mpsc::Sender<Incoming>,
) -> Result<(), ServeError> {
    loop {
        let mut raw = [0u8; REQUEST_LEN];
        match rd.read_exact(&mut raw).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let req = Request::parse(&raw)?;
        let mut data = Vec::new();
        let len = req.payload_len();
        if len > MAX_TRANSFER as usize {
            // Refused by `Device::check` (EOVERFLOW): its data is read
            // and dropped, never held, and the stream stays in step.
            let skipped =
                tokio::io::copy(&mut (&mut *rd).take(len as u64), &mut tokio::io::sink()).await?;
            if skipped < len as u64 {
                return Ok(());
            }
        } else if len > 0 {
            // A write's data is read even when the request will be
            // refused: the stream stays in step.
            data.resize(len, 0);
            rd.read_exact(&mut data).await?;
        }
        let last = req.command == Command::Disconnect;
        if tx.send(Incoming { req, data }).await.is_err() || last {
            return Ok(());
        }
    }
}

/// Run one request: its reply and, for a read, the data.
fn run<'a>(target: &'a dyn BlockTarget, dev: &Device, inc: Incoming) -> Running<'a> {
    let req = inc.req;
    let checked = dev.check(&req);
    Box::pin(async move {
        if let Err(e) = checked {
            return (Reply::error(req.handle, e), Vec::new());
        }
        let (off, len) = (req.offset, req.len);
        let result = match req.command {
            Command::Read => match target.read(off, len as usize, Vec::new()).await {
                Ok(d) => return (Reply::ok(req.handle), d),
                Err(e) => Err(e),
            },
            Command::Write => target.write(off, Bytes::from(inc.data), req.fua).await,
            Command::Flush => target.flush().await,
            Command::Trim => target.write_zeroes(off, u64::from(len), true).await,
            Command::WriteZeroes => target.write_zeroes(off, u64::from(len), !req.no_hole).await,
            Command::Disconnect => Ok(()),
        };
        match result {
            Ok(()) => (Reply::ok(req.handle), Vec::new()),
            Err(e) => {
                tracing::warn!(
                    handle = req.handle,
                    offset = off,
                    len,
                    "NBD {:?} failed: {e:#}",
                    req.command
                );
                (Reply::error(req.handle, Errno::Io), Vec::new())
            }
        }
    })
}

pub mod netlink;

#[cfg(test)]
mod tests;
