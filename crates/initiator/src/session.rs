//! The full feature phase, initiator side, over tokio: many commands in
//! flight over one connection.
//!
//! The protocol is the sans-I/O [`Connection`]; this is its thin driver.
//! A reader task turns the byte stream into PDUs; the driver task loops
//! `select { PDU, request, timer } → connection.handle(event, now) →
//! write what poll_output gives`. Callers talk to it through a
//! [`Session`] handle, so any number of tasks can issue commands
//! concurrently.

mod check;
mod placed;
mod stream;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use stream::{Reg, StreamReader};

use bytes::Bytes;
use ethersan_endpoint::{MessageChannel, MessageReceiver, MessageSender, PlacedBuf};
use ethersan_proto::negotiate::SessionParams;
use ethersan_proto::pdu::{Bhs, MessagePdu, RawPdu, TmfFunction};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::conn::{self, Answer, Connection, Event, Output, Request, RequestId};
use crate::login::LoggedIn;
use crate::{CommandResult, Error};

/// A request and where its answer goes.
type Ask = (Request, oneshot::Sender<Result<Answer, Error>>);

/// A handle on a logged-in session. Cheap to clone; every clone can issue
/// commands concurrently.
#[derive(Clone)]
pub struct Session {
    tx: mpsc::UnboundedSender<Ask>,
    params: SessionParams,
    tsih: u16,
    /// How long each command, Text request and logout may wait.
    timeout: Option<Duration>,
    ended: Arc<Ended>,
    /// Bytes of data placed each way (native transport).
    placed: Arc<PlacedCounts>,
}

/// Why a session ended early, and how to stop its tasks.
struct Ended {
    /// The first timeout; later requests fail with it at once.
    why: OnceLock<Error>,
    driver: OnceLock<tokio::task::AbortHandle>,
    reader: tokio::task::AbortHandle,
}

impl Ended {
    /// Close the session for `err`: its tasks stop and the connection
    /// closes, so a late answer cannot be taken for a new command's.
    fn close(&self, err: Error) -> Error {
        let err = self.why.get_or_init(|| err).clone();
        if let Some(d) = self.driver.get() {
            d.abort();
        }
        self.reader.abort();
        err
    }

    /// The error for a request whose driver went away.
    fn gone(&self) -> Error {
        self.why.get().cloned().unwrap_or(Error::Closed)
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("params", &self.params)
            .finish()
    }
}

impl Session {
    /// Start the driver over a logged-in stream.
    pub(crate) fn start<R, W>(rd: R, wr: W, timeout: Option<Duration>, login: LoggedIn) -> Session
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        // The reader runs as its own task: a PDU read is never cancelled
        // half-way (which would lose bytes and the framing) when the driver
        // wakes up for a new request.
        let (pdu_tx, pdu_rx) = mpsc::channel(256);
        let (regs, reg_rx) = mpsc::unbounded_channel();
        let reader = StreamReader::new(rd, login.params.clone(), reg_rx);
        let reader = tokio::spawn(reader.run(pdu_tx));
        let out = Out::Stream {
            wr: BufWriter::with_capacity(256 * 1024, wr),
            regs,
            returned: HashMap::new(),
        };
        Self::run(out, pdu_rx, reader, timeout, login)
    }

    /// Start the driver over a logged-in native transport channel: one
    /// PDU per message, a read's Data-In placed into a buffer registered
    /// under the command's ITT (docs/native-transport.md, "iSCSI over the
    /// channel").
    pub(crate) fn start_messages(
        ch: MessageChannel,
        timeout: Option<Duration>,
        login: LoggedIn,
    ) -> Session {
        let (pdu_tx, pdu_rx) = mpsc::channel(256);
        let reader_params = login.params.clone();
        let mut rx = ch.receiver;
        let reader = tokio::spawn(async move {
            loop {
                let r = read_message(&mut rx, &reader_params).await;
                let failed = r.is_err();
                if pdu_tx.send(r).await.is_err() || failed {
                    break;
                }
            }
        });
        let out: Out<tokio::io::Sink> = Out::Messages {
            tx: Some(ch.sender),
        };
        Self::run(out, pdu_rx, reader, timeout, login)
    }

    fn run<W: AsyncWrite + Unpin + Send + 'static>(
        out: Out<W>,
        pdu_rx: mpsc::Receiver<Result<Incoming, Error>>,
        reader: tokio::task::JoinHandle<()>,
        timeout: Option<Duration>,
        login: LoggedIn,
    ) -> Session {
        let (tx, rx) = mpsc::unbounded_channel();
        let params = login.params.clone();
        let config = conn::Config {
            timeout,
            ..conn::Config::default()
        };
        let core = Connection::new(
            login.params,
            login.window,
            login.exp_stat_sn,
            config,
            Instant::now().into_std(),
        );
        let ended = Arc::new(Ended {
            why: OnceLock::new(),
            driver: OnceLock::new(),
            reader: reader.abort_handle(),
        });
        let placed = Arc::new(PlacedCounts::default());
        let driver = Driver {
            core,
            pdus: pdu_rx,
            out,
            placed: placed.clone(),
            reads: HashMap::new(),
            replies: HashMap::new(),
            next_id: 0,
            ended: ended.clone(),
        };
        let driver = tokio::spawn(driver.run(rx));
        let _ = ended.driver.set(driver.abort_handle());
        Session {
            tx,
            params,
            tsih: login.tsih,
            timeout,
            ended,
            placed,
        }
    }

    /// Bytes of read data that arrived placed: straight into the read's
    /// buffer (from the socket over TCP, from the frames over a native
    /// transport channel).
    pub fn placed_bytes(&self) -> u64 {
        self.placed.read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes of write data sent placed: solicited Data-Out straight from
    /// the caller's buffer into the target's, over a native transport
    /// channel (0 over TCP).
    pub fn placed_write_bytes(&self) -> u64 {
        self.placed
            .written
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Send `req` and wait for its answer; the connection times it out
    /// (the session's timeout), which closes the session.
    async fn ask(&self, req: Request) -> Result<Answer, Error> {
        if let Some(e) = self.ended.why.get() {
            return Err(e.clone());
        }
        let (reply, rx) = oneshot::channel();
        self.tx.send((req, reply)).map_err(|_| self.ended.gone())?;
        rx.await.map_err(|_| self.ended.gone())?
    }

    /// How long each command may wait for its answer (`None`: forever).
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Close the connection at once, without a logout; commands still
    /// waiting fail with [`Error::Closed`].
    pub fn abandon(&self) {
        self.ended.close(Error::Closed);
    }

    /// The negotiated parameters.
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// The TSIH the target assigned to the session.
    pub fn tsih(&self) -> u16 {
        self.tsih
    }

    /// Run one SCSI command. `data_out` is sent to the target (write);
    /// `read_len` is the Data-In the command expects.
    pub async fn command(
        &self,
        lun: u64,
        cdb: &[u8],
        data_out: Bytes,
        read_len: u32,
    ) -> Result<CommandResult, Error> {
        self.command_into(lun, cdb, data_out, read_len, Vec::new())
            .await
    }

    /// [`command`](Self::command) with the Data-In placed into `buffer`
    /// (its capacity reused, its contents dropped): the result's `data`
    /// is that buffer.
    pub async fn command_into(
        &self,
        lun: u64,
        cdb: &[u8],
        data_out: Bytes,
        read_len: u32,
        buffer: Vec<u8>,
    ) -> Result<CommandResult, Error> {
        let req = Request::Command {
            lun,
            cdb: cdb.to_vec(),
            data_out,
            read_len,
            buffer,
        };
        match self.ask(req).await? {
            Answer::Command(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// Send a Text request (e.g. `SendTargets=All`) and collect the answer.
    pub async fn text(&self, keys: Vec<(String, String)>) -> Result<Vec<(String, String)>, Error> {
        match self.ask(Request::Text(keys)).await? {
            Answer::Text(t) => Ok(t),
            other => Err(unexpected(other)),
        }
    }

    /// Send a task management function (not ABORT TASK, which needs a
    /// task tag this API does not hand out) for `lun` and return the
    /// target's response code (0: function complete; see
    /// `ethersan_proto::pdu::tmf_response`).
    pub async fn task_management(&self, function: TmfFunction, lun: u64) -> Result<u8, Error> {
        match self.ask(Request::TaskManagement { function, lun }).await? {
            Answer::TaskManagement(code) => Ok(code),
            other => Err(unexpected(other)),
        }
    }

    /// Log out (close the session) and wait for the target's answer.
    pub async fn logout(&self) -> Result<(), Error> {
        match self.ask(Request::Logout).await? {
            Answer::LoggedOut => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

/// An answer of the wrong kind (the connection never gives one).
fn unexpected(a: Answer) -> Error {
    Error::Protocol(format!("unexpected answer {a:?}"))
}

/// Longest wait, after a logout, for the connection to close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// A PDU from the reader task.
#[derive(Debug)]
enum Incoming {
    /// A whole PDU.
    Pdu(RawPdu),
    /// A Data-In header whose data was placed: the data is in the buffer
    /// registered under its ITT.
    Placed(RawPdu),
    /// The buffer registered for a read, handed back by a stream's reader
    /// before the PDU that ends the read.
    Returned(u32, PlacedBuf),
}

/// Where the driver's PDUs go.
enum Out<W> {
    /// A byte stream (TCP).
    Stream {
        wr: BufWriter<W>,
        /// Registrations, to the reader task.
        regs: mpsc::UnboundedSender<Reg>,
        /// Buffers the reader handed back, by ITT.
        returned: HashMap<u32, PlacedBuf>,
    },
    /// A native transport channel, one PDU per message.
    Messages {
        /// The sending half (taken at close).
        tx: Option<MessageSender>,
    },
}

/// The task that owns the connection.
struct Driver<W> {
    core: Connection,
    /// PDUs from the reader task, in arrival order.
    pdus: mpsc::Receiver<Result<Incoming, Error>>,
    out: Out<W>,
    /// Bytes of data placed each way.
    placed: Arc<PlacedCounts>,
    /// Reads whose Data-In is placed, by ITT: the ranges the Data-In
    /// headers announced so far.
    reads: HashMap<u32, Vec<(u32, u32)>>,
    /// Where each request's answer goes.
    replies: HashMap<RequestId, oneshot::Sender<Result<Answer, Error>>>,
    next_id: u64,
    ended: Arc<Ended>,
}

impl<W: AsyncWrite + Unpin + Send> Driver<W> {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Ask>) {
        let mut callers_gone = false;
        let sleep = tokio::time::sleep_until(Instant::now());
        tokio::pin!(sleep);
        let mut armed = None;
        loop {
            self.write_outputs().await;
            if self.core.is_closed() || (callers_gone && self.core.is_idle()) {
                break;
            }
            let wake = self.core.poll_timeout();
            if wake != armed {
                if let Some(at) = wake {
                    sleep.as_mut().reset(Instant::from_std(at));
                }
                armed = wake;
            }
            let ev = tokio::select! {
                ask = rx.recv(), if !callers_gone => match ask {
                    Some((req, reply)) => {
                        let id = RequestId(self.next_id);
                        self.next_id += 1;
                        self.replies.insert(id, reply);
                        Event::Submit(id, req)
                    }
                    None => {
                        callers_gone = true;
                        continue;
                    }
                },
                pdu = self.pdus.recv() => match pdu {
                    Some(Ok(Incoming::Pdu(raw))) => match self.placed_before(&raw) {
                        Ok(Some(data_in)) => {
                            // The placed data first, then the response.
                            self.core.handle(Event::Pdu(data_in), Instant::now().into_std());
                            Event::Pdu(raw)
                        }
                        Ok(None) => Event::Pdu(raw),
                        Err(e) => Event::Failed(e),
                    },
                    Some(Ok(Incoming::Returned(itt, buf))) => {
                        if let Out::Stream { returned, .. } = &mut self.out {
                            if self.reads.contains_key(&itt) {
                                returned.insert(itt, buf);
                            }
                        }
                        continue;
                    }
                    Some(Ok(Incoming::Placed(raw))) => match self.on_placed(raw) {
                        Ok(Some(pdu)) => Event::Pdu(pdu),
                        Ok(None) => continue,
                        Err(e) => Event::Failed(e),
                    },
                    Some(Err(e)) => Event::Failed(e),
                    None => Event::Failed(Error::Closed),
                },
                () = &mut sleep, if armed.is_some() => Event::Timer,
            };
            self.core.handle(ev, Instant::now().into_std());
        }
        for (_, reply) in self.replies.drain() {
            let _ = reply.send(Err(Error::Closed));
        }
    }

    /// Do what the connection asks: write its PDUs (then flush once),
    /// answer callers, close.
    async fn write_outputs(&mut self) {
        loop {
            let mut wrote = false;
            while let Some(o) = self.core.poll_output() {
                match o {
                    Output::Send(t) => {
                        let params = self.core.params().clone();
                        let b = &t.bhs.0;
                        let scsi_read = b[0] & 0x3f == 0x01 && b[1] & 0x40 != 0;
                        let edtl = u32::from_be_bytes([b[20], b[21], b[22], b[23]]);
                        if scsi_read && edtl > 0 && !params.data_digest {
                            // Registered before the command goes out, so
                            // before any of its Data-In can come back.
                            let itt = t.bhs.itt();
                            self.out.register(itt, edtl as usize);
                            self.reads.insert(itt, Vec::new());
                        }
                        let write = match &mut self.out {
                            Out::Stream { wr, .. } => {
                                futures_box(write_frame(wr, &t.bhs, &t.ahs, &t.data, &params))
                            }
                            Out::Messages { tx } => futures_box(send_message(
                                tx.as_mut(),
                                t,
                                &params,
                                &self.placed.written,
                            )),
                        };
                        if let Err(e) = timed(&mut self.core, write).await {
                            self.core
                                .handle(Event::Failed(e), Instant::now().into_std());
                        }
                        wrote = true;
                    }
                    Output::Complete(id, r) => {
                        if r.is_err() {
                            // A read that ended without its data (aborted,
                            // timed out) gives its buffer back now.
                            self.drop_finished_registrations();
                        }
                        if let Some(reply) = self.replies.remove(&id) {
                            let _ = reply.send(r);
                        }
                    }
                    Output::Close(None) => {
                        // Close the connection before the logout returns:
                        // a client exits right after it, and over the
                        // native transport the close is a message of this
                        // process (the target would otherwise hold the
                        // channel until its timeout).
                        match &mut self.out {
                            Out::Stream { wr, .. } => {
                                let _ = tokio::time::timeout(CLOSE_WAIT, wr.shutdown()).await;
                            }
                            Out::Messages { tx, .. } => {
                                if let Some(tx) = tx.take() {
                                    let _ = tokio::time::timeout(CLOSE_WAIT, tx.close(true)).await;
                                }
                            }
                        }
                        wrote = false;
                    }
                    Output::Close(Some(e)) => {
                        // A timeout is the session's end for every later
                        // request too.
                        if matches!(e, Error::Timeout { .. }) {
                            let _ = self.ended.why.set(e);
                        }
                        self.ended.reader.abort();
                        wrote = false;
                    }
                }
            }
            if !wrote || self.core.is_closed() {
                return;
            }
            let flush = async {
                match &mut self.out {
                    Out::Stream { wr, .. } => Ok(wr.flush().await?),
                    Out::Messages { .. } => Ok(()),
                }
            };
            match timed(&mut self.core, flush).await {
                Ok(()) => return,
                // Answer the callers the failure completed.
                Err(e) => self
                    .core
                    .handle(Event::Failed(e), Instant::now().into_std()),
            }
        }
    }
}

/// A future boxed, so both kinds of write have one type.
fn futures_box<'a, F>(
    f: F,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Error>> + Send + 'a>>
where
    F: std::future::Future<Output = Result<(), Error>> + Send + 'a,
{
    Box::pin(f)
}

/// Bytes of data placed each way.
#[derive(Debug, Default)]
struct PlacedCounts {
    /// Data-In that landed in reads' buffers.
    read: std::sync::atomic::AtomicU64,
    /// Solicited Data-Out sent placed.
    written: std::sync::atomic::AtomicU64,
}

/// Send one PDU as one message; a solicited Data-Out's data is placed
/// into the write's buffer, which the target registered under the ITT
/// before its R2T (its header follows alone).
async fn send_message(
    tx: Option<&mut MessageSender>,
    t: conn::Transmit,
    p: &SessionParams,
    written: &std::sync::atomic::AtomicU64,
) -> Result<(), Error> {
    let Some(tx) = tx else {
        return Err(Error::Closed);
    };
    let b = &t.bhs.0;
    let e = crate::framer(p).encode(&t.bhs, &t.ahs, &t.data);
    let solicited = b[0] & 0x3f == 0x05 && b[20..24] != [0xff; 4];
    if solicited && !t.data.is_empty() && !p.data_digest {
        let itt = u32::from_be_bytes([b[16], b[17], b[18], b[19]]);
        let offset = u32::from_be_bytes([b[40], b[41], b[42], b[43]]);
        let n = t.data.len() as u64;
        tx.send_placed(itt, u64::from(offset), t.data).await?;
        tx.send(&[Bytes::from(e.head)]).await?;
        written.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        return Ok(());
    }
    let mut parts = vec![Bytes::from(e.head)];
    if !t.data.is_empty() {
        parts.push(t.data);
    }
    if !e.tail.is_empty() {
        parts.push(Bytes::from(e.tail));
    }
    tx.send(&parts).await?;
    Ok(())
}

/// One PDU from one message of a native transport channel. A Data-In
/// header without its data segment announces placed data.
async fn read_message(rx: &mut MessageReceiver, p: &SessionParams) -> Result<Incoming, Error> {
    let msg = rx.recv().await?.ok_or(Error::Closed)?;
    parse(&msg, p)
}

/// A message holding one whole PDU, as a PDU (the login's).
pub(crate) fn parse_message(msg: &[u8], p: &SessionParams) -> Result<RawPdu, Error> {
    match parse(msg, p)? {
        Incoming::Pdu(raw) => Ok(raw),
        Incoming::Placed(_) | Incoming::Returned(..) => Err(Error::Protocol(
            "placed Data-In outside the full feature phase".into(),
        )),
    }
}

fn parse(msg: &[u8], p: &SessionParams) -> Result<Incoming, Error> {
    let f = crate::framer(p);
    match f.split_message(msg) {
        Ok(MessagePdu::Whole(head, data)) => f
            .finish(head, data.to_vec())
            .map(Incoming::Pdu)
            .map_err(|e| Error::Protocol(e.to_string())),
        Ok(MessagePdu::Placed(head)) => Ok(Incoming::Placed(RawPdu {
            bhs: head.bhs,
            ahs: head.ahs,
            data: Vec::new(),
        })),
        Err(e) => Err(Error::Protocol(e.to_string())),
    }
}

/// Run `write` to its end. A write still blocked (the target reads
/// nothing) when the connection's timer is due lets the connection handle
/// the timer meanwhile; if that closes it, the write is given up (the
/// connection is gone, so a half-written PDU does no harm).
async fn timed<F>(core: &mut Connection, write: F) -> Result<(), Error>
where
    F: std::future::Future<Output = Result<(), Error>>,
{
    tokio::pin!(write);
    loop {
        let Some(at) = core.poll_timeout() else {
            return write.await;
        };
        match tokio::time::timeout_at(Instant::from_std(at), &mut write).await {
            Ok(r) => return r,
            Err(_) => {
                core.handle(Event::Timer, Instant::now().into_std());
                if core.is_closed() {
                    return Ok(());
                }
            }
        }
    }
}

/// Write one PDU (header, AHS, digests, data and padding) as [`Framer`]
/// encodes it.
///
/// [`Framer`]: ethersan_proto::pdu::Framer
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    bhs: &Bhs,
    ahs: &[u8],
    data: &[u8],
    p: &SessionParams,
) -> Result<(), Error> {
    let e = crate::framer(p).encode(bhs, ahs, data);
    w.write_all(&e.head).await?;
    w.write_all(data).await?;
    w.write_all(&e.tail).await?;
    Ok(())
}

/// Read one PDU with the three decoding steps of [`Framer`], verifying
/// digests. The data segment is read into a buffer of its size that is
/// never zeroed first.
///
/// [`Framer`]: ethersan_proto::pdu::Framer
pub(crate) async fn read_pdu<R: AsyncRead + Unpin>(
    r: &mut R,
    p: &SessionParams,
) -> Result<RawPdu, Error> {
    let f = crate::framer(p);
    let mut bhs = Bhs::default();
    r.read_exact(&mut bhs.0).await?;
    let mut rest = vec![0u8; f.header_rest_len(&bhs)];
    r.read_exact(&mut rest).await?;
    let head = f
        .check_header(bhs, &rest)
        .map_err(|e| Error::Protocol(e.to_string()))?;
    let want = head.data_part_len();
    // read_to_end fills the spare capacity as it is (tokio passes it on
    // uninitialised), and probes for the end with a small read of its own
    // once the buffer is full, so the buffer is neither zeroed nor grown.
    let mut part = Vec::with_capacity(want);
    if want > 0 {
        (&mut *r).take(want as u64).read_to_end(&mut part).await?;
        if part.len() < want {
            return Err(Error::Closed);
        }
    }
    f.finish(head, part)
        .map_err(|e| Error::Protocol(e.to_string()))
}

#[cfg(test)]
mod placed_tests {
    use ethersan_endpoint::PlacedBuf;

    use super::check::check_placed;

    fn placed(ranges: &[(u64, u64)]) -> PlacedBuf {
        let mut p = PlacedBuf::new(4096);
        for &(s, e) in ranges {
            assert!(p.place(s, &vec![1; (e - s) as usize]));
        }
        p
    }

    #[test]
    fn announced_data_that_never_landed_fails_the_read() {
        let whole = placed(&[(0, 4096)]);
        assert_eq!(
            check_placed(7, &[(0, 2048), (2048, 2048)], &whole).unwrap(),
            4096
        );
        // A short read: only what was announced counts.
        assert_eq!(check_placed(7, &[(0, 1024)], &whole).unwrap(), 1024);
        let gap = placed(&[(0, 1024), (2048, 4096)]);
        let e = check_placed(7, &[(0, 2048), (2048, 2048)], &gap).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("0..2048") && msg.contains("never arrived") && msg.contains("0x7"),
            "{msg}"
        );
        let none = placed(&[]);
        assert!(check_placed(7, &[(0, 512)], &none).is_err());
    }
}
