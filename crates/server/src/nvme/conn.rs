//! One NVMe/TCP connection: the task that owns its [`Queue`] and loops
//! select → apply over socket reads, command completions and the Keep
//! Alive deadline; what it sends goes out in vectored writes (a read's
//! data straight from the buffer the executor filled, not copied).

use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, Bytes};
use ethersan_core::executor::{BlockingPool, Done, Finished};
use ethersan_nvme::queue::{CommandData, Completion, Event, Queue, QueueConfig};
use ethersan_nvme::sqe::FABRICS_OPCODE;
use ethersan_nvme::{Sqe, Status};
use ethersan_scsi::IoBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::{Controller, Shared, QUEUE_ENTRIES, TX_BACKLOG};

/// Blocking commands run on tokio's blocking pool.
pub(super) struct TokioBlocking;

impl BlockingPool for TokioBlocking {
    fn spawn(&self, job: Box<dyn FnOnce() + Send>) {
        tokio::task::spawn_blocking(job);
    }
}

/// What a command in the executor's hands is waiting for.
#[derive(Debug, Clone, Copy)]
pub(super) enum InFlight {
    /// A read of the medium: its data is exactly this many bytes.
    Read(usize),
    /// A data structure (Reservation Report): send at most this many
    /// bytes of it.
    Data(usize),
    /// Anything else: a completion only.
    Other,
}

/// A write whose data is still arriving.
pub(super) struct Pending {
    pub(super) sqe: Sqe,
    pub(super) buf: IoBuf,
}

/// The state of one connection.
pub(super) struct Conn {
    pub(super) shared: Arc<Shared>,
    pub(super) queue: Queue,
    pub(super) ctrl: Option<Arc<Controller>>,
    /// This connection carries the controller's admin queue.
    pub(super) admin: bool,
    pub(super) peer: SocketAddr,
    pub(super) local: SocketAddr,
    pub(super) pending: HashMap<u16, Pending>,
    pub(super) in_flight: HashMap<u16, InFlight>,
    /// Asynchronous Event Requests held.
    pub(super) aers: Vec<u16>,
    /// Bytes to send, in order.
    pub(super) tx: VecDeque<Bytes>,
    pub(super) done: Done,
    done_rx: Option<mpsc::UnboundedReceiver<(u32, Finished)>>,
    /// End after sending what is queued (Disconnect).
    pub(super) closing: bool,
    /// [`Conn::receive`] stopped with whole PDUs left in its buffer,
    /// because too many answers waited to be sent.
    backlogged: bool,
    /// The active namespace IDs last seen (admin queue of an I/O
    /// controller), for namespace attribute notices.
    pub(super) known_ns: Option<Vec<u32>>,
    /// Namespaces changed since the host last read the Changed Namespace
    /// List.
    pub(super) changed_ns: Vec<u32>,
    /// A namespace notice was reported and the log page not yet read:
    /// no further notice until it is.
    pub(super) ns_notice_out: bool,
}

impl Conn {
    /// A connection from `peer` on `sock`, waiting for ICReq.
    pub(super) fn new(shared: Arc<Shared>, sock: &TcpStream, peer: SocketAddr) -> Conn {
        let local = sock.local_addr().unwrap_or(peer);
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let done: Done = Arc::new(move |tag, f| {
            let _ = done_tx.send((tag, f));
        });
        Conn {
            shared,
            queue: Queue::new(QueueConfig {
                max_in_capsule: super::IN_CAPSULE,
                ..QueueConfig::default()
            }),
            ctrl: None,
            admin: false,
            peer,
            local,
            pending: HashMap::new(),
            in_flight: HashMap::new(),
            aers: Vec::new(),
            tx: VecDeque::new(),
            done,
            done_rx: Some(done_rx),
            closing: false,
            backlogged: false,
            known_ns: None,
            changed_ns: Vec::new(),
            ns_notice_out: false,
        }
    }

    /// Serve the connection until it ends (the host closes it, a fatal
    /// error, Keep Alive expiry, its controller ends, or `stop`).
    pub(super) async fn run(mut self, sock: TcpStream, mut stop: watch::Receiver<bool>) {
        let (mut rd, mut wr) = sock.into_split();
        let mut done_rx = self.done_rx.take().expect("taken once");
        let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
        let mut ended: Option<watch::Receiver<bool>> = None;
        // A connection that has no controller this long after it opened
        // (no ICReq, or no accepted Connect) is closed.
        let connect_by = tokio::time::Instant::now() + super::CONNECT_WITHIN;
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let reason = loop {
            if let Err(e) = flush(&mut wr, &mut self.tx).await {
                break format!("write: {e}");
            }
            if self.queue.is_closed() || self.closing {
                break "closed".into();
            }
            if self.backlogged {
                // Commands left in `buf` while answers waited: on with them.
                self.receive(&mut buf);
                continue;
            }
            if ended.is_none() {
                ended = self.ctrl.as_ref().map(|c| c.ended.subscribe());
            }
            let deadline = self.queue.poll_timeout();
            let ctrl_ended = async {
                match ended.as_mut() {
                    Some(r) => {
                        if r.wait_for(|e| *e).await.is_err() {
                            std::future::pending::<()>().await
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = rd.read_buf(&mut buf) => match r {
                    Ok(0) => break "host closed the connection".into(),
                    Ok(_) => self.receive(&mut buf),
                    Err(e) => break format!("read: {e}"),
                },
                Some((tag, f)) = done_rx.recv() => self.finished(tag as u16, f),
                _ = sleep_until(deadline) => {
                    if self.queue.on_tick(Instant::now()) {
                        break "keep alive timeout".into();
                    }
                }
                _ = ctrl_ended, if !self.admin => break "its controller ended".into(),
                _ = tick.tick(), if self.admin => self.namespace_tick(),
                _ = stopping(&mut stop) => break "server stopping".into(),
                _ = tokio::time::sleep_until(connect_by), if self.ctrl.is_none() => {
                    break "no accepted Connect in time".into()
                }
            }
        };
        let _ = flush(&mut wr, &mut self.tx).await;
        let _ = wr.shutdown().await;
        if let (Some(c), true) = (&self.ctrl, self.admin) {
            self.shared.end_controller(c);
            info!(peer = %self.peer, cntlid = c.cntlid, host = %c.hostnqn, subsystem = %c.subnqn, %reason, "NVMe/TCP controller ended");
        } else {
            debug!(peer = %self.peer, %reason, "NVMe/TCP connection ended");
        }
    }

    /// Decode and act on every whole PDU in `buf`, then drop them.
    fn receive(&mut self, buf: &mut Vec<u8>) {
        let mut at = 0;
        let now = Instant::now();
        self.backlogged = false;
        loop {
            // Answers the host has not taken yet bound what is read next: a
            // host that sends commands and does not read would otherwise
            // have every read's data queued here.
            if self.tx.iter().map(Bytes::len).sum::<usize>() > TX_BACKLOG {
                self.backlogged = true;
                break;
            }
            let Some(r) = self.queue.receive(&buf[at..], now) else {
                break;
            };
            let base = at;
            at += r.consumed;
            match r.event {
                None | Some(Event::Connected { .. }) => {}
                Some(Event::Command { sqe, data }) => {
                    // Nothing but fabrics commands before a Connect was
                    // accepted (no buffer is made for them), and no more
                    // commands than the queue's entries: a host past either
                    // breaks the protocol, and each command may hold up to
                    // 1 MiB.
                    if sqe.opcode() != FABRICS_OPCODE && self.ctrl.is_none() {
                        warn!(peer = %self.peer, "NVMe/TCP command before an accepted Connect: closing the connection");
                        self.closing = true;
                        break;
                    }
                    if self.pending.len() + self.in_flight.len() >= usize::from(QUEUE_ENTRIES) {
                        warn!(peer = %self.peer, limit = QUEUE_ENTRIES, "NVMe/TCP host sent more commands than the queue has entries: closing the connection");
                        self.closing = true;
                        break;
                    }
                    let (data, to_host) = match data {
                        CommandData::InCapsule(range) => {
                            let r = base + range.start..base + range.end;
                            (Some(IoBuf::aligned_copy_of(&buf[r])), 0)
                        }
                        CommandData::Awaiting { len } => {
                            let cid = sqe.cid();
                            self.pending.insert(
                                cid,
                                Pending {
                                    sqe,
                                    buf: IoBuf::aligned(len as usize),
                                },
                            );
                            continue;
                        }
                        CommandData::None => (None, 0),
                        CommandData::ToHost { len } => (None, len as usize),
                    };
                    self.command(sqe, data, to_host);
                }
                Some(Event::Data {
                    cid,
                    offset,
                    range,
                    complete,
                }) => {
                    if let Some(p) = self.pending.get_mut(&cid) {
                        let r = base + range.start..base + range.end;
                        p.buf.fill_at(offset as usize, &buf[r]);
                    }
                    if complete {
                        if let Some(p) = self.pending.remove(&cid) {
                            self.command(p.sqe, Some(p.buf), 0);
                        }
                    }
                }
                Some(Event::Failed { cid, status }) => {
                    self.pending.remove(&cid);
                    self.complete(Completion::new(cid, status));
                }
                Some(Event::HostTerminated(_)) | Some(Event::Fatal(_)) => {
                    self.closing = true;
                }
            }
            let mut out = Vec::new();
            if self.queue.poll_transmit(&mut out) {
                self.tx.push_back(out.into());
            }
            if self.queue.is_closed() || self.closing {
                break;
            }
        }
        let mut out = Vec::new();
        if self.queue.poll_transmit(&mut out) {
            self.tx.push_back(out.into());
        }
        buf.drain(..at.min(buf.len()));
    }

    /// Run a command whose data (if any) is all here.
    fn command(&mut self, sqe: Sqe, data: Option<IoBuf>, to_host: usize) {
        // Fused operations are not supported (FUSES is 0): run as two
        // commands, a fused Compare and Write would write after a failed
        // compare.
        if !matches!(sqe.fuse(), Ok(ethersan_nvme::sqe::Fuse::Normal)) {
            self.complete(Completion::new(sqe.cid(), Status::INVALID_FIELD));
            return;
        }
        if sqe.opcode() == FABRICS_OPCODE {
            self.fabrics(sqe, data);
            return;
        }
        let cid = sqe.cid();
        let Some(c) = self.ctrl.clone() else {
            self.complete(Completion::new(cid, Status::COMMAND_SEQUENCE_ERROR));
            return;
        };
        if !c.ready() {
            self.complete(Completion::new(cid, Status::COMMAND_SEQUENCE_ERROR));
            return;
        }
        if self.admin {
            self.admin_command(&c, sqe, to_host);
        } else {
            self.io_command(&c, sqe, data, to_host);
        }
    }

    /// Send a command's CapsuleResp.
    pub(super) fn complete(&mut self, c: Completion) {
        let mut out = Vec::new();
        if self.queue.complete(c, &mut out).is_ok() {
            self.tx.push_back(out.into());
        }
    }

    /// Send `data` (at most `limit` bytes of it) to the host for command
    /// `c.cid` in C2HData PDUs, then its CapsuleResp unless C2H SUCCESS
    /// made it unneeded.
    pub(super) fn send_data(&mut self, c: Completion, data: Bytes, limit: usize) {
        let data = data.slice(..data.len().min(limit));
        if data.is_empty() {
            self.complete(c);
            return;
        }
        let Ok(plan) = self.queue.c2h_data(c.cid, data.len(), c.status) else {
            self.complete(Completion::new(c.cid, Status::INTERNAL_ERROR));
            return;
        };
        let framing = self.queue.tx_framing();
        for (pdu, range) in &plan.pdus {
            let part = data.slice(range.clone());
            let mut head = Vec::with_capacity(32);
            let Ok(digest) = pdu.encode_head(&part, &framing, &mut head) else {
                continue;
            };
            self.tx.push_back(head.into());
            self.tx.push_back(part);
            if let Some(d) = digest {
                self.tx.push_back(Bytes::copy_from_slice(&d));
            }
        }
        if plan.response_needed {
            self.complete(c);
        }
    }

    /// A command the executor finished later.
    fn finished(&mut self, cid: u16, f: Finished) {
        if let Some(kind) = self.in_flight.remove(&cid) {
            self.io_finished(cid, kind, f);
        }
    }
}

/// Until the server stops ([`super::Nvme::stop`]); for ever if its handle
/// was dropped without stopping.
async fn stopping(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await
    }
}

/// Sleep until `deadline`, or for ever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Write every queued chunk, vectored.
async fn flush(
    wr: &mut tokio::net::tcp::OwnedWriteHalf,
    tx: &mut VecDeque<Bytes>,
) -> std::io::Result<()> {
    while !tx.is_empty() {
        let slices: Vec<IoSlice<'_>> = tx.iter().take(64).map(|b| IoSlice::new(b)).collect();
        let mut n = wr.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let Some(front) = tx.front_mut() else { break };
            if front.len() <= n {
                n -= front.len();
                tx.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
    Ok(())
}
