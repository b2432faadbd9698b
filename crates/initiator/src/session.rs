//! The full feature phase, initiator side: many commands in flight over one
//! connection.
//!
//! A driver task owns the connection and all sequence state (CmdSN window,
//! ITTs, R2T answers); callers talk to it through a [`Session`] handle, so
//! any number of tasks can issue commands concurrently.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use ethersan_proto::pdu::{
    self, lun_to_wire, Bhs, DataOut, LogoutRequest, NopOut, Pdu, RawPdu, ScsiCommand, TaskAttr,
    TaskMgmtRequest, TextRequest, TmfFunction, BHS_LEN, RESERVED_TAG,
};
use ethersan_proto::seq::sn_le;
use ethersan_proto::text::{encode_text, parse_text};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, oneshot};

use crate::{Error, Phase};
use ethersan_proto::negotiate::SessionParams;
use ethersan_scsi::sense::Sense;

/// The outcome of one SCSI command.
#[derive(Debug, Clone, Default)]
pub struct CommandResult {
    /// SCSI status byte.
    pub status: u8,
    /// Sense data (without the 2-byte length), empty if none.
    pub sense: Vec<u8>,
    /// Data-In received.
    pub data: Vec<u8>,
    /// Residual count reported by the target.
    pub residual: u32,
    /// Residual overflow flag.
    pub overflow: bool,
    /// Residual underflow flag.
    pub underflow: bool,
}

impl CommandResult {
    /// Sense key, ASC and ASCQ from fixed or descriptor sense, if present.
    pub fn sense_key(&self) -> Option<(u8, u8, u8)> {
        Sense::parse(&self.sense).map(|s| s.triple())
    }

    /// The INFORMATION field of the sense data (fixed format with VALID
    /// set, or the descriptor format's information descriptor).
    pub fn sense_information(&self) -> Option<u64> {
        Sense::parse(&self.sense)?.info
    }

    /// When an ethersan target refused the command because the native
    /// transport channel is below the LUN's security level (DATA PROTECT,
    /// LOGICAL UNIT ACCESS NOT AUTHORIZED): the level the LUN needs, from
    /// the INFORMATION field (docs/native-transport.md).
    pub fn channel_level_needed(&self) -> Option<ethersan_channel::Level> {
        if self.status != 0x02 || self.sense_key() != Some((0x7, 0x74, 0x71)) {
            return None;
        }
        let level = u8::try_from(self.sense_information()?).ok()?;
        ethersan_channel::Level::from_u8(level)
    }
}

enum Request {
    Scsi {
        lun: u64,
        cdb: Vec<u8>,
        data_out: Bytes,
        read_len: u32,
        reply: oneshot::Sender<Result<CommandResult, Error>>,
    },
    Text {
        keys: Vec<(String, String)>,
        reply: oneshot::Sender<Result<Vec<(String, String)>, Error>>,
    },
    Logout {
        reply: oneshot::Sender<Result<(), Error>>,
    },
    Tmf {
        function: TmfFunction,
        lun: u64,
        reply: oneshot::Sender<Result<u8, Error>>,
    },
}

/// A request waiting for the target's answer.
enum Pending {
    Scsi {
        data_out: Bytes,
        result: CommandResult,
        reply: oneshot::Sender<Result<CommandResult, Error>>,
        lun: u64,
    },
    Text {
        collected: Vec<u8>,
        reply: oneshot::Sender<Result<Vec<(String, String)>, Error>>,
        lun: u64,
    },
    Logout {
        reply: oneshot::Sender<Result<(), Error>>,
    },
    Tmf {
        reply: oneshot::Sender<Result<u8, Error>>,
    },
}

/// A handle on a logged-in session. Cheap to clone; every clone can issue
/// commands concurrently.
#[derive(Clone)]
pub struct Session {
    tx: mpsc::UnboundedSender<Request>,
    params: SessionParams,
    tsih: u16,
    /// How long each command, Text request and logout may wait.
    timeout: Option<Duration>,
    ended: Arc<Ended>,
    /// The native transport channel's security level (`None`: TCP).
    channel_level: Option<ethersan_channel::Level>,
}

/// Why a session ended early, and how to stop its tasks.
struct Ended {
    /// The first timeout; later requests fail with it at once.
    why: OnceLock<Error>,
    driver: tokio::task::AbortHandle,
    reader: tokio::task::AbortHandle,
}

impl Ended {
    /// Close the session for `err`: its tasks stop and the connection
    /// closes, so a late answer cannot be taken for a new command's.
    fn close(&self, err: Error) -> Error {
        let err = self.why.get_or_init(|| err).clone();
        self.driver.abort();
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
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start<R, W>(
        rd: R,
        wr: W,
        timeout: Option<Duration>,
        params: SessionParams,
        tsih: u16,
        cmd_sn: u32,
        exp_stat_sn: u32,
        max_cmd_sn: u32,
    ) -> Session
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        // The reader runs as its own task: a PDU read is never cancelled
        // half-way (which would lose bytes and the framing) when the driver
        // wakes up for a new request.
        let (pdu_tx, pdu_rx) = mpsc::channel(256);
        let reader_params = params.clone();
        let reader = tokio::spawn(async move {
            let mut rd = BufReader::with_capacity(256 * 1024, rd);
            loop {
                let r = read_pdu(&mut rd, &reader_params).await;
                let failed = r.is_err();
                if pdu_tx.send(r).await.is_err() || failed {
                    break;
                }
            }
        });
        let driver = Driver {
            pdus: pdu_rx,
            wr: BufWriter::with_capacity(256 * 1024, wr),
            params: params.clone(),
            cmd_sn,
            exp_stat_sn,
            max_cmd_sn,
            next_itt: 1,
            pending: HashMap::new(),
            queued: VecDeque::new(),
            logged_out: None,
        };
        let driver = tokio::spawn(driver.run(rx));
        Session {
            tx,
            params,
            tsih,
            timeout,
            ended: Arc::new(Ended {
                why: OnceLock::new(),
                driver: driver.abort_handle(),
                reader: reader.abort_handle(),
            }),
            channel_level: None,
        }
    }

    /// The security level of the native transport channel under the
    /// session (`None`: iSCSI over TCP).
    pub fn channel_level(&self) -> Option<ethersan_channel::Level> {
        self.channel_level
    }

    pub(crate) fn set_channel_level(&mut self, level: ethersan_channel::Level) {
        self.channel_level = Some(level);
    }

    /// Send `req` and wait for its answer, at most the session's timeout;
    /// a timeout closes the session.
    async fn ask<T>(
        &self,
        phase: Phase,
        req: Request,
        rx: oneshot::Receiver<Result<T, Error>>,
    ) -> Result<T, Error> {
        if let Some(e) = self.ended.why.get() {
            return Err(e.clone());
        }
        self.tx.send(req).map_err(|_| self.ended.gone())?;
        match self.timeout {
            None => rx.await.map_err(|_| self.ended.gone())?,
            Some(after) => match tokio::time::timeout(after, rx).await {
                Ok(r) => r.map_err(|_| self.ended.gone())?,
                Err(_) => Err(self.ended.close(Error::Timeout { phase, after })),
            },
        }
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
        let (reply, rx) = oneshot::channel();
        let req = Request::Scsi {
            lun,
            cdb: cdb.to_vec(),
            data_out,
            read_len,
            reply,
        };
        let opcode = cdb.first().copied().unwrap_or(0);
        self.ask(Phase::Command { opcode }, req, rx).await
    }

    /// Send a Text request (e.g. `SendTargets=All`) and collect the answer.
    pub async fn text(&self, keys: Vec<(String, String)>) -> Result<Vec<(String, String)>, Error> {
        let (reply, rx) = oneshot::channel();
        self.ask(Phase::Text, Request::Text { keys, reply }, rx)
            .await
    }

    /// Send a task management function (not ABORT TASK, which needs a
    /// task tag this API does not hand out) for `lun` and return the
    /// target's response code (0: function complete; see
    /// `ethersan_proto::pdu::tmf_response`).
    pub async fn task_management(&self, function: TmfFunction, lun: u64) -> Result<u8, Error> {
        let (reply, rx) = oneshot::channel();
        self.ask(
            Phase::TaskManagement,
            Request::Tmf {
                function,
                lun,
                reply,
            },
            rx,
        )
        .await
    }

    /// Log out (close the session) and wait for the target's answer.
    pub async fn logout(&self) -> Result<(), Error> {
        let (reply, rx) = oneshot::channel();
        self.ask(Phase::Logout, Request::Logout { reply }, rx).await
    }
}

struct Driver<W> {
    /// PDUs from the reader task, in arrival order.
    pdus: mpsc::Receiver<Result<RawPdu, Error>>,
    wr: BufWriter<W>,
    params: SessionParams,
    cmd_sn: u32,
    exp_stat_sn: u32,
    max_cmd_sn: u32,
    next_itt: u32,
    pending: HashMap<u32, Pending>,
    /// Requests waiting for the CmdSN window to open.
    queued: VecDeque<Request>,
    /// The logout's answer, given once the connection is closed.
    logged_out: Option<LogoutReply>,
}

/// A logout's caller and its outcome.
type LogoutReply = (oneshot::Sender<Result<(), Error>>, Result<(), Error>);

/// Longest wait, after a logout, for the connection to close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

impl<W: AsyncWrite + Unpin> Driver<W> {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Request>) {
        let mut closed_by_user = false;
        let result: Result<(), Error> = async {
            loop {
                tokio::select! {
                    req = rx.recv(), if !closed_by_user => {
                        match req {
                            Some(r) => { self.queued.push_back(r); self.pump().await?; }
                            None => { closed_by_user = true; if self.pending.is_empty() { return Ok(()); } }
                        }
                    }
                    pdu = self.pdus.recv() => {
                        let pdu = pdu.unwrap_or(Err(Error::Closed))?;
                        if self.on_pdu(pdu).await? {
                            return Ok(());
                        }
                        self.pump().await?;
                        if closed_by_user && self.pending.is_empty() { return Ok(()); }
                    }
                }
            }
        }
        .await;
        if let Some((reply, r)) = self.logged_out.take() {
            // Close the connection before the logout returns: a client
            // exits right after it, and over the native transport the
            // close is a message of this process (the target would
            // otherwise hold the channel until its timeout).
            let _ = tokio::time::timeout(CLOSE_WAIT, self.wr.shutdown()).await;
            let _ = reply.send(r);
        }
        let err = result.err().unwrap_or(Error::Closed);
        for (_, p) in self.pending.drain() {
            fail(p, err.clone());
        }
        for r in self.queued.drain(..) {
            match r {
                Request::Scsi { reply, .. } => drop(reply.send(Err(err.clone()))),
                Request::Text { reply, .. } => drop(reply.send(Err(err.clone()))),
                Request::Logout { reply } => drop(reply.send(Err(err.clone()))),
                Request::Tmf { reply, .. } => drop(reply.send(Err(err.clone()))),
            }
        }
    }

    /// Send queued requests while the CmdSN window allows.
    async fn pump(&mut self) -> Result<(), Error> {
        while !self.queued.is_empty() && sn_le(self.cmd_sn, self.max_cmd_sn) {
            let req = self.queued.pop_front().expect("non-empty");
            self.send_request(req).await?;
        }
        self.wr.flush().await?;
        Ok(())
    }

    fn alloc_itt(&mut self) -> u32 {
        let i = self.next_itt;
        self.next_itt = self.next_itt.wrapping_add(1);
        if self.next_itt == RESERVED_TAG {
            self.next_itt = 1;
        }
        i
    }

    async fn send_request(&mut self, req: Request) -> Result<(), Error> {
        let itt = self.alloc_itt();
        let cmd_sn = self.cmd_sn;
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        match req {
            Request::Scsi {
                lun,
                cdb,
                data_out,
                read_len,
                reply,
            } => {
                let wire_lun = lun_to_wire(lun);
                let p = &self.params;
                let edtl = if data_out.is_empty() {
                    read_len
                } else {
                    data_out.len() as u32
                };
                let immediate = if p.immediate_data {
                    data_out
                        .len()
                        .min(p.first_burst_length as usize)
                        .min(p.max_data_out_segment() as usize)
                } else {
                    0
                };
                let unsolicited_end = if p.initial_r2t {
                    immediate
                } else {
                    data_out.len().min(p.first_burst_length as usize)
                };
                let mut cdb16 = [0u8; 16];
                let n = cdb.len().min(16);
                cdb16[..n].copy_from_slice(&cdb[..n]);
                let cmd = ScsiCommand {
                    immediate: false,
                    final_bit: unsolicited_end == immediate,
                    read: read_len > 0,
                    write: !data_out.is_empty(),
                    attr: TaskAttr::Simple,
                    lun: wire_lun,
                    itt,
                    expected_len: edtl,
                    cmd_sn,
                    exp_stat_sn: self.exp_stat_sn,
                    cdb: cdb16,
                };
                let ahs = pdu::extended_cdb_ahs(&cdb);
                // The framer sets TotalAHSLength from `ahs`.
                let bhs = Pdu::ScsiCommand(cmd).encode(immediate as u32);
                write_frame(
                    &mut self.wr,
                    &bhs,
                    &ahs,
                    &data_out[..immediate],
                    &self.params,
                )
                .await?;
                // Unsolicited Data-Out up to FirstBurstLength.
                let mut off = immediate;
                let mut data_sn = 0;
                while off < unsolicited_end {
                    let n =
                        (unsolicited_end - off).min(self.params.max_data_out_segment() as usize);
                    let d = DataOut {
                        final_bit: off + n == unsolicited_end,
                        lun: wire_lun,
                        itt,
                        ttt: RESERVED_TAG,
                        exp_stat_sn: self.exp_stat_sn,
                        data_sn,
                        buffer_offset: off as u32,
                    };
                    let bhs = Pdu::DataOut(d).encode(n as u32);
                    write_frame(
                        &mut self.wr,
                        &bhs,
                        &[],
                        &data_out[off..off + n],
                        &self.params,
                    )
                    .await?;
                    data_sn += 1;
                    off += n;
                }
                let result = CommandResult {
                    data: vec![0u8; read_len as usize],
                    ..Default::default()
                };
                self.pending.insert(
                    itt,
                    Pending::Scsi {
                        data_out,
                        result,
                        reply,
                        lun: wire_lun,
                    },
                );
            }
            Request::Text { keys, reply } => {
                let data = encode_text(&keys);
                let t = TextRequest {
                    immediate: false,
                    final_bit: true,
                    continue_bit: false,
                    lun: 0,
                    itt,
                    ttt: RESERVED_TAG,
                    cmd_sn,
                    exp_stat_sn: self.exp_stat_sn,
                };
                let bhs = Pdu::TextRequest(t).encode(data.len() as u32);
                write_frame(&mut self.wr, &bhs, &[], &data, &self.params).await?;
                self.pending.insert(
                    itt,
                    Pending::Text {
                        collected: Vec::new(),
                        reply,
                        lun: 0,
                    },
                );
            }
            Request::Tmf {
                function,
                lun,
                reply,
            } => {
                let t = TaskMgmtRequest {
                    immediate: true,
                    function,
                    lun: lun_to_wire(lun),
                    itt,
                    referenced_task_tag: RESERVED_TAG,
                    cmd_sn,
                    exp_stat_sn: self.exp_stat_sn,
                    ref_cmd_sn: cmd_sn,
                    exp_data_sn: 0,
                };
                // Immediate: does not consume a CmdSN.
                self.cmd_sn = cmd_sn;
                let bhs = Pdu::TaskMgmtRequest(t).encode(0);
                write_frame(&mut self.wr, &bhs, &[], &[], &self.params).await?;
                self.pending.insert(itt, Pending::Tmf { reply });
            }
            Request::Logout { reply } => {
                let l = LogoutRequest {
                    immediate: true,
                    reason: 0,
                    itt,
                    cid: 0,
                    cmd_sn,
                    exp_stat_sn: self.exp_stat_sn,
                };
                // Immediate: does not consume a CmdSN.
                self.cmd_sn = cmd_sn;
                let bhs = Pdu::LogoutRequest(l).encode(0);
                write_frame(&mut self.wr, &bhs, &[], &[], &self.params).await?;
                self.pending.insert(itt, Pending::Logout { reply });
            }
        }
        Ok(())
    }

    fn update_window(&mut self, exp_cmd_sn: u32, max_cmd_sn: u32) {
        // Ignore MaxCmdSN values that would shrink the window below ExpCmdSN - 1.
        if sn_le(exp_cmd_sn.wrapping_sub(1), max_cmd_sn)
            && ethersan_proto::seq::sn_lt(self.max_cmd_sn, max_cmd_sn)
        {
            self.max_cmd_sn = max_cmd_sn;
        }
    }

    fn status_seen(&mut self, stat_sn: u32) {
        if sn_le(self.exp_stat_sn, stat_sn) {
            self.exp_stat_sn = stat_sn.wrapping_add(1);
        }
    }

    /// Handle one PDU; true when the session is over (logout done).
    async fn on_pdu(&mut self, raw: RawPdu) -> Result<bool, Error> {
        let pdu = Pdu::decode(&raw.bhs).map_err(|e| Error::Protocol(e.to_string()))?;
        match pdu {
            Pdu::DataIn(d) => {
                self.update_window(d.exp_cmd_sn, d.max_cmd_sn);
                let Some(p) = self.pending.get_mut(&d.itt) else {
                    return Ok(false);
                };
                let Pending::Scsi { result, .. } = p else {
                    return Ok(false);
                };
                let off = d.buffer_offset as usize;
                let end = off + raw.data.len();
                if end > result.data.len() {
                    return Err(Error::Protocol(format!(
                        "Data-In beyond the buffer ({end} > {})",
                        result.data.len()
                    )));
                }
                result.data[off..end].copy_from_slice(&raw.data);
                if d.status_present {
                    self.status_seen(d.stat_sn);
                    let p = self.pending.remove(&d.itt).expect("present");
                    if let Pending::Scsi {
                        mut result, reply, ..
                    } = p
                    {
                        result.status = d.status;
                        result.residual = d.residual;
                        result.overflow = d.overflow;
                        result.underflow = d.underflow;
                        if d.underflow {
                            let keep = result.data.len().saturating_sub(d.residual as usize);
                            result.data.truncate(keep);
                        }
                        let _ = reply.send(Ok(result));
                    }
                }
            }
            Pdu::ScsiResponse(r) => {
                self.update_window(r.exp_cmd_sn, r.max_cmd_sn);
                self.status_seen(r.stat_sn);
                if let Some(Pending::Scsi {
                    mut result, reply, ..
                }) = self.pending.remove(&r.itt)
                {
                    result.status = r.status;
                    result.residual = r.residual;
                    result.overflow = r.overflow;
                    result.underflow = r.underflow;
                    if r.underflow {
                        let keep = result.data.len().saturating_sub(r.residual as usize);
                        result.data.truncate(keep);
                    }
                    if raw.data.len() >= 2 {
                        let n = u16::from_be_bytes([raw.data[0], raw.data[1]]) as usize;
                        result.sense = raw.data[2..(2 + n).min(raw.data.len())].to_vec();
                    }
                    if r.response != 0 {
                        let _ = reply.send(Err(Error::Protocol(format!(
                            "iSCSI response {:#x}",
                            r.response
                        ))));
                    } else {
                        let _ = reply.send(Ok(result));
                    }
                }
            }
            Pdu::R2t(r) => {
                self.update_window(r.exp_cmd_sn, r.max_cmd_sn);
                let Some(p) = self.pending.get(&r.itt) else {
                    return Ok(false);
                };
                let Pending::Scsi { data_out, lun, .. } = p else {
                    return Ok(false);
                };
                let data_out = data_out.clone();
                let lun = *lun;
                let start = r.buffer_offset as usize;
                let end = (start + r.desired_len as usize).min(data_out.len());
                let mut off = start;
                let mut data_sn = 0;
                while off < end {
                    let n = (end - off).min(self.params.max_data_out_segment() as usize);
                    let d = DataOut {
                        final_bit: off + n == end,
                        lun,
                        itt: r.itt,
                        ttt: r.ttt,
                        exp_stat_sn: self.exp_stat_sn,
                        data_sn,
                        buffer_offset: off as u32,
                    };
                    let bhs = Pdu::DataOut(d).encode(n as u32);
                    write_frame(
                        &mut self.wr,
                        &bhs,
                        &[],
                        &data_out[off..off + n],
                        &self.params,
                    )
                    .await?;
                    data_sn += 1;
                    off += n;
                }
                self.wr.flush().await?;
            }
            Pdu::NopIn(n) => {
                self.update_window(n.exp_cmd_sn, n.max_cmd_sn);
                if n.itt == RESERVED_TAG && n.ttt != RESERVED_TAG {
                    // Ping from the target: answer with the same TTT.
                    let nop = NopOut {
                        immediate: true,
                        lun: n.lun,
                        itt: RESERVED_TAG,
                        ttt: n.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                    };
                    let bhs = Pdu::NopOut(nop).encode(0);
                    write_frame(&mut self.wr, &bhs, &[], &[], &self.params).await?;
                    self.wr.flush().await?;
                } else if n.itt != RESERVED_TAG {
                    self.status_seen(n.stat_sn);
                }
            }
            Pdu::TextResponse(t) => {
                self.update_window(t.exp_cmd_sn, t.max_cmd_sn);
                self.status_seen(t.stat_sn);
                let Some(p) = self.pending.get_mut(&t.itt) else {
                    return Ok(false);
                };
                let Pending::Text { collected, lun, .. } = p else {
                    return Ok(false);
                };
                collected.extend_from_slice(&raw.data);
                if t.continue_bit || !t.final_bit {
                    // Ask for the rest with an empty request carrying the TTT.
                    let lun = *lun;
                    let req = TextRequest {
                        immediate: true,
                        final_bit: true,
                        continue_bit: false,
                        lun,
                        itt: t.itt,
                        ttt: t.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                    };
                    let bhs = Pdu::TextRequest(req).encode(0);
                    write_frame(&mut self.wr, &bhs, &[], &[], &self.params).await?;
                    self.wr.flush().await?;
                } else {
                    let p = self.pending.remove(&t.itt).expect("present");
                    if let Pending::Text {
                        collected, reply, ..
                    } = p
                    {
                        let r = parse_text(&collected, &Default::default())
                            .map_err(|e| Error::Protocol(e.to_string()));
                        let _ = reply.send(r);
                    }
                }
            }
            Pdu::LogoutResponse(l) => {
                self.status_seen(l.stat_sn);
                if let Some(Pending::Logout { reply }) = self.pending.remove(&l.itt) {
                    let r = if l.response == 0 {
                        Ok(())
                    } else {
                        Err(Error::Protocol(format!("logout response {}", l.response)))
                    };
                    // Answered once the connection is closed (see `run`).
                    self.logged_out = Some((reply, r));
                }
                return Ok(true);
            }
            Pdu::Reject(r) => {
                self.status_seen(r.stat_sn);
                if raw.data.len() >= BHS_LEN {
                    let mut b = Bhs::default();
                    b.0.copy_from_slice(&raw.data[..BHS_LEN]);
                    if let Some(p) = self.pending.remove(&b.itt()) {
                        fail(p, Error::Rejected(r.reason));
                    }
                }
            }
            Pdu::AsyncMessage(a) => {
                self.status_seen(a.stat_sn);
                if a.event == 1 || a.event == 2 || a.event == 3 {
                    return Err(Error::Protocol(format!(
                        "target asked to end the session (async event {})",
                        a.event
                    )));
                }
            }
            Pdu::TaskMgmtResponse(t) => {
                self.update_window(t.exp_cmd_sn, t.max_cmd_sn);
                self.status_seen(t.stat_sn);
                if let Some(Pending::Tmf { reply }) = self.pending.remove(&t.itt) {
                    let _ = reply.send(Ok(t.response));
                }
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected PDU from target: {other:?}"
                )))
            }
        }
        Ok(false)
    }
}

fn fail(p: Pending, err: Error) {
    match p {
        Pending::Scsi { reply, .. } => drop(reply.send(Err(err))),
        Pending::Text { reply, .. } => drop(reply.send(Err(err))),
        Pending::Logout { reply } => drop(reply.send(Err(err))),
        Pending::Tmf { reply } => drop(reply.send(Err(err))),
    }
}

/// Write one PDU (header, AHS, digests, data and padding) as [`Framer`]
/// encodes it.
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
/// digests.
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
    let mut part = vec![0u8; head.data_part_len()];
    r.read_exact(&mut part).await?;
    f.finish(head, part)
        .map_err(|e| Error::Protocol(e.to_string()))
}
