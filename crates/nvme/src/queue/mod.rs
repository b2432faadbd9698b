//! NVMe/TCP Transport Specification (TP 8000) §7.3 (connection set-up with
//! ICReq/ICResp, capsule and data transfer, termination) and NVMe-oF 1.1
//! §2.4.1 (SQ flow control, SQHD): the target side of one NVMe/TCP
//! connection, which carries exactly one queue pair.
//!
//! [`Queue`] is a plain state machine. The front end feeds it received
//! bytes ([`Queue::receive`]) and acts on the [`Event`] that comes back;
//! it sends what [`Queue::poll_transmit`] appends (ICResp, R2Ts,
//! termination requests, answers the queue gives by itself), completes
//! commands with [`Queue::complete`] and sends read data with
//! [`Queue::c2h_data`] (planned, the data not copied) or
//! [`Queue::send_read`]. Time is passed in; [`Queue::on_tick`] reports an
//! expired Keep Alive timer.

mod transfer;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::time::Instant;

use crate::cqe::Cqe;
use crate::fabrics::{Connect, FabricsCommand};
use crate::keepalive::KeepAlive;
use crate::pdu::{self, C2hData, Framing, IcResp, Pdu, PduError, R2t, TermReq, MAX_TERM_DATA};
use crate::sqe::{DataDirection, Sgl, Sqe, FABRICS_OPCODE};
use crate::status::Status;
use transfer::Transfers;

/// What the target offers and allows on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// CPDA: data alignment the target asks of the host, 0's based dwords.
    pub cpda: u8,
    /// MAXH2CDATA: most data in one H2CData PDU (≥ 4096, dword multiple).
    pub max_h2c_data: u32,
    /// Most in-capsule data accepted in a command capsule (IOCCSZ × 16 −
    /// 64 for I/O queues; 8192 is usual for the admin queue).
    pub max_in_capsule: u32,
    /// Most data one R2T asks for.
    pub r2t_len: u32,
    /// Most data bytes in one C2HData PDU the target sends.
    pub c2h_data_len: u32,
    /// Largest data transfer of one command (MDTS in bytes).
    pub max_transfer: u32,
    /// Allow header digests if the host asks.
    pub header_digest: bool,
    /// Allow data digests if the host asks.
    pub data_digest: bool,
    /// Use C2HData SUCCESS (skip the response of a read that succeeded)
    /// when the host disabled SQ flow control.
    pub c2h_success: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            cpda: 0,
            max_h2c_data: 128 * 1024,
            max_in_capsule: 8192,
            r2t_len: 1 << 20,
            c2h_data_len: 128 * 1024,
            max_transfer: 1 << 20,
            header_digest: true,
            data_digest: true,
            c2h_success: true,
        }
    }
}

/// Where a command's data is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandData {
    /// No data.
    None,
    /// In-capsule data: this range of the buffer given to [`Queue::receive`].
    InCapsule(Range<usize>),
    /// Host-to-controller data of `len` bytes still to come: the queue sent
    /// R2Ts; [`Event::Data`] events bring the pieces, the last one with
    /// `complete` set. Execute the command then.
    Awaiting {
        /// Bytes expected.
        len: u32,
    },
    /// Controller-to-host data of at most `len` bytes, sent with
    /// [`Queue::c2h_data`] or [`Queue::send_read`].
    ToHost {
        /// Bytes the host's buffer holds.
        len: u32,
    },
}

/// What one received PDU means to the front end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// ICReq accepted; the ICResp is queued for sending.
    Connected {
        /// Digests and alignment of received PDUs.
        rx: Framing,
        /// Digests and alignment of sent PDUs.
        tx: Framing,
    },
    /// A command capsule: execute now unless data is [`CommandData::Awaiting`].
    Command {
        /// The SQE.
        sqe: Sqe,
        /// Its data.
        data: CommandData,
    },
    /// Write data to place: `buf[range]` goes at `offset` of command `cid`.
    Data {
        /// Command identifier.
        cid: u16,
        /// Offset into the command's data.
        offset: u32,
        /// Data in the buffer given to [`Queue::receive`].
        range: Range<usize>,
        /// All of the command's data has now arrived: execute it.
        complete: bool,
    },
    /// The command cannot run (its data failed the data digest): complete
    /// it with this status.
    Failed {
        /// Command identifier.
        cid: u16,
        /// Status to complete it with.
        status: Status,
    },
    /// The host terminated the connection (H2CTermReq): close it.
    HostTerminated(TermReq),
    /// A fatal transport error: the C2HTermReq is queued; send it, close.
    Fatal(PduError),
}

/// What [`Queue::receive`] did with the front of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Bytes of the buffer consumed (one PDU).
    pub consumed: usize,
    /// What to do, if anything (the queue answers some commands itself).
    pub event: Option<Event>,
}

/// A misuse of [`Queue`]'s completion calls by the front end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// No command with this identifier is in flight.
    #[error("no command {0:#x} in flight")]
    UnknownCommand(u16),
    /// The write's data has not all arrived.
    #[error("command {0:#x} still receiving data")]
    DataPending(u16),
    /// More read data than the host's buffer holds.
    #[error("read data of {len} bytes beyond the command's {max}")]
    TooMuchData {
        /// Bytes given.
        len: usize,
        /// Bytes the command allows.
        max: u32,
    },
    /// The connection is not set up or already terminated.
    #[error("connection not ready")]
    NotReady,
}

/// The completion of a command, as the front end reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// Command identifier.
    pub cid: u16,
    /// Status.
    pub status: Status,
    /// Command specific dword 0.
    pub dw0: u32,
    /// Command specific dword 1.
    pub dw1: u32,
}

impl Completion {
    /// A completion with `status` and zero result dwords.
    pub fn new(cid: u16, status: Status) -> Self {
        Completion {
            cid,
            status,
            dw0: 0,
            dw1: 0,
        }
    }
}

/// The C2HData PDUs of a read: encode each with [`Queue::tx_framing`] and
/// send `data[range]` after its head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct C2hPlan {
    /// PDUs with the data range each carries.
    pub pdus: Vec<(Pdu, Range<usize>)>,
    /// Whether a CapsuleResp must follow ([`Queue::complete`]); false when
    /// the last PDU carries SUCCESS and the command is already finished.
    pub response_needed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitIcReq,
    Ready,
    Closed,
}

/// The target side of one NVMe/TCP connection (one queue pair).
#[derive(Debug)]
pub struct Queue {
    config: QueueConfig,
    state: State,
    rx: Framing,
    tx: Framing,
    /// Outstanding R2Ts allowed per command (MAXR2T + 1).
    max_r2t: u32,
    connect: Option<Connect>,
    sqhd: u16,
    commands: HashMap<u16, u32>,
    transfers: Transfers,
    keep_alive: KeepAlive,
    out: Vec<u8>,
}

impl Queue {
    /// A connection waiting for the host's ICReq.
    pub fn new(config: QueueConfig) -> Self {
        Queue {
            config,
            state: State::AwaitIcReq,
            rx: Framing::plain(0),
            tx: Framing::plain(0),
            max_r2t: 1,
            connect: None,
            sqhd: 0,
            commands: HashMap::new(),
            transfers: Transfers::default(),
            keep_alive: KeepAlive::off(),
            out: Vec::new(),
        }
    }

    /// Framing of the PDUs this end sends (after ICResp).
    pub fn tx_framing(&self) -> Framing {
        self.tx
    }

    /// The Connect this queue received, once it has.
    pub fn connect(&self) -> Option<&Connect> {
        self.connect.as_ref()
    }

    /// Whether the connection has ended (fatal error or host termination).
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Commands in flight (received, not yet completed).
    pub fn in_flight(&self) -> usize {
        self.commands.len()
    }

    /// Appends the PDUs the queue has to send to `out`; false if none.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> bool {
        crate::pdu::hand_over(&mut self.out, out)
    }

    /// When [`Queue::on_tick`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.keep_alive.deadline()
    }

    /// Whether the Keep Alive timer expired at `now`: the front end then
    /// tears the controller down (NVMe 1.4 §7.12).
    pub fn on_tick(&mut self, now: Instant) -> bool {
        self.keep_alive.expired(now)
    }

    /// Decodes the PDU at the front of `buf`; `None` until it is whole (or
    /// once the connection is closed).
    pub fn receive(&mut self, buf: &[u8], now: Instant) -> Option<Received> {
        if self.state == State::Closed {
            return None;
        }
        match self.receive_inner(buf, now) {
            Ok(r) => r,
            Err(e) => Some(self.fatal(e, buf)),
        }
    }

    fn fatal(&mut self, e: PduError, buf: &[u8]) -> Received {
        let hlen = buf
            .first()
            .and_then(|&t| pdu::PduType::from_u8(t))
            .map_or(pdu::COMMON_HEADER_LEN, |t| t.header_len());
        let header = &buf[..buf.len().min(hlen).min(MAX_TERM_DATA)];
        let term = Pdu::C2hTermReq(TermReq::from(e.fatal_status()));
        // A termination request of at most 128 data bytes always encodes.
        let _ = term.encode(header, &Framing::plain(0), &mut self.out);
        self.state = State::Closed;
        Received {
            consumed: buf.len(),
            event: Some(Event::Fatal(e)),
        }
    }

    fn receive_inner(&mut self, buf: &[u8], now: Instant) -> Result<Option<Received>, PduError> {
        let Some(d) = pdu::decode(buf, &self.rx)? else {
            return Ok(None);
        };
        let event = match (self.state, d.pdu) {
            (State::AwaitIcReq, Pdu::IcReq(req)) => {
                let hd = req.header_digest && self.config.header_digest;
                let dd = req.data_digest && self.config.data_digest;
                let max_data = self.config.max_h2c_data.max(self.config.max_in_capsule);
                self.rx = Framing {
                    header_digest: hd,
                    data_digest: dd,
                    pda: 0,
                    max_data,
                };
                self.tx = Framing {
                    header_digest: hd,
                    data_digest: dd,
                    pda: req.hpda,
                    max_data: 0,
                };
                self.max_r2t = req.maxr2t.saturating_add(1);
                let resp = Pdu::IcResp(IcResp {
                    pfv: 0,
                    cpda: self.config.cpda,
                    header_digest: hd,
                    data_digest: dd,
                    maxh2cdata: self.config.max_h2c_data,
                });
                let _ = resp.encode(&[], &Framing::plain(0), &mut self.out);
                self.state = State::Ready;
                Some(Event::Connected {
                    rx: self.rx,
                    tx: self.tx,
                })
            }
            (_, Pdu::H2cTermReq(t)) => {
                self.state = State::Closed;
                Some(Event::HostTerminated(t))
            }
            (State::Ready, Pdu::CapsuleCmd(sqe)) => {
                self.command(sqe, d.data, d.data_digest_ok, now)?
            }
            (State::Ready, Pdu::H2cData(h)) => {
                let len = d.data.len() as u32;
                if len > self.config.max_h2c_data {
                    return Err(PduError::DataLimitExceeded {
                        len,
                        limit: self.config.max_h2c_data,
                    });
                }
                let mut r2ts = Vec::new();
                let limits = (self.max_r2t, self.config.r2t_len);
                let a = self
                    .transfers
                    .accept(&h, len, d.data_digest_ok, limits, &mut r2ts)?;
                self.send_r2ts(&r2ts);
                match a.done {
                    Some(false) => Some(Event::Failed {
                        cid: h.cccid,
                        status: Status::TRANSIENT_TRANSPORT_ERROR,
                    }),
                    done if a.place => Some(Event::Data {
                        cid: h.cccid,
                        offset: h.datao,
                        range: d.data.clone(),
                        complete: done.is_some(),
                    }),
                    _ => None,
                }
            }
            _ => return Err(PduError::Sequence("PDU not allowed here")),
        };
        Ok(Some(Received {
            consumed: d.len,
            event,
        }))
    }

    fn send_r2ts(&mut self, r2ts: &[R2t]) {
        for r in r2ts {
            let _ = Pdu::R2t(*r).encode(&[], &self.tx, &mut self.out);
        }
    }

    /// Answers a command the front end never sees.
    fn refuse(&mut self, cid: u16, status: Status) -> Option<Event> {
        let cqe = self.cqe(Completion::new(cid, status));
        let _ = Pdu::CapsuleResp(cqe).encode(&[], &self.tx, &mut self.out);
        None
    }

    fn command(
        &mut self,
        sqe: Sqe,
        data: Range<usize>,
        digest_ok: bool,
        now: Instant,
    ) -> Result<Option<Event>, PduError> {
        let icd = data.len() as u32;
        if icd > self.config.max_in_capsule {
            return Err(PduError::DataLimitExceeded {
                len: icd,
                limit: self.config.max_in_capsule,
            });
        }
        let size = self.connect.map_or(0x1_0000, |c| u32::from(c.sqsize) + 1);
        self.sqhd = ((u32::from(self.sqhd) + 1) % size) as u16;
        self.keep_alive.restart(now);
        let cid = sqe.cid();
        if self.commands.contains_key(&cid) {
            return Ok(self.refuse(cid, Status::COMMAND_ID_CONFLICT));
        }
        let is_connect =
            sqe.opcode() == FABRICS_OPCODE && sqe.fctype() == crate::fabrics::FCTYPE_CONNECT;
        match (&self.connect, is_connect) {
            (None, false) | (Some(_), true) => {
                return Ok(self.refuse(cid, Status::COMMAND_SEQUENCE_ERROR));
            }
            (None, true) => {
                if let Ok(FabricsCommand::Connect(c)) = FabricsCommand::parse(&sqe) {
                    self.connect = Some(c);
                    if c.qid == 0 {
                        self.keep_alive = KeepAlive::start(c.kato, now);
                    }
                }
            }
            (Some(_), false) => {}
        }
        let dir = sqe.direction();
        // A command without data may leave DPTR zeroed (or hold a null
        // Transport SGL): nothing to check.
        let sgl = match sqe.sgl() {
            _ if dir == DataDirection::None && icd == 0 => Sgl::Transport { len: 0 },
            Ok(s) => s,
            Err(_) => return Ok(self.refuse(cid, Status::SGL_TYPE_INVALID)),
        };
        let data = match sgl {
            Sgl::InCapsule { offset, len } => {
                if offset != 0 || len != icd {
                    return Ok(self.refuse(cid, Status::SGL_LENGTH_INVALID));
                }
                if dir != DataDirection::HostToController && len > 0 {
                    return Ok(self.refuse(cid, Status::INVALID_FIELD));
                }
                if len > 0 {
                    CommandData::InCapsule(data)
                } else {
                    CommandData::None
                }
            }
            Sgl::Transport { len } => {
                if icd != 0 {
                    return Ok(self.refuse(cid, Status::SGL_LENGTH_INVALID));
                }
                if len > self.config.max_transfer {
                    return Ok(self.refuse(cid, Status::INVALID_FIELD));
                }
                match dir {
                    _ if len == 0 => CommandData::None,
                    DataDirection::None => CommandData::None,
                    DataDirection::HostToController => CommandData::Awaiting { len },
                    DataDirection::ControllerToHost => CommandData::ToHost { len },
                    DataDirection::Bidirectional => {
                        return Ok(self.refuse(cid, Status::INVALID_FIELD));
                    }
                }
            }
        };
        let limit = match data {
            CommandData::ToHost { len } => len,
            _ => 0,
        };
        self.commands.insert(cid, limit);
        if !digest_ok {
            return Ok(Some(Event::Failed {
                cid,
                status: Status::TRANSIENT_TRANSPORT_ERROR,
            }));
        }
        if let CommandData::Awaiting { len } = data {
            let mut r2ts = Vec::new();
            self.transfers
                .start(cid, len, self.max_r2t, self.config.r2t_len, &mut r2ts);
            self.send_r2ts(&r2ts);
        }
        Ok(Some(Event::Command { sqe, data }))
    }

    /// SQHD to report: the queue's head, or FFFFh without SQ flow control.
    pub fn sqhd(&self) -> u16 {
        match self.connect {
            Some(c) if c.sq_flow_control_disabled() => 0xFFFF,
            _ => self.sqhd,
        }
    }

    fn cqe(&self, c: Completion) -> Cqe {
        Cqe {
            dw0: c.dw0,
            dw1: c.dw1,
            sqhd: self.sqhd(),
            sqid: self.connect.map_or(0, |c| c.qid),
            cid: c.cid,
            phase: false,
            status: c.status,
        }
    }

    /// Ends command `c.cid`: appends its CapsuleResp to `out`.
    pub fn complete(&mut self, c: Completion, out: &mut Vec<u8>) -> Result<(), QueueError> {
        if self.state != State::Ready {
            return Err(QueueError::NotReady);
        }
        if !self.commands.contains_key(&c.cid) {
            return Err(QueueError::UnknownCommand(c.cid));
        }
        self.commands.remove(&c.cid);
        self.transfers.remove(c.cid);
        let _ = Pdu::CapsuleResp(self.cqe(c)).encode(&[], &self.tx, out);
        Ok(())
    }

    /// Plans the C2HData PDUs carrying `len` bytes of read data for `cid`,
    /// which ended with `status`. With SQ flow control off, C2H SUCCESS
    /// allowed by the configuration and a successful status, the last PDU
    /// carries SUCCESS and the command is finished here.
    pub fn c2h_data(
        &mut self,
        cid: u16,
        len: usize,
        status: Status,
    ) -> Result<C2hPlan, QueueError> {
        if self.state != State::Ready {
            return Err(QueueError::NotReady);
        }
        let max = *self
            .commands
            .get(&cid)
            .ok_or(QueueError::UnknownCommand(cid))?;
        if self.transfers.contains(cid) {
            return Err(QueueError::DataPending(cid));
        }
        if len > max as usize {
            return Err(QueueError::TooMuchData { len, max });
        }
        let skip_response = status.is_success()
            && self.config.c2h_success
            && self.connect.is_some_and(|c| c.sq_flow_control_disabled());
        let step = self.config.c2h_data_len.max(1) as usize;
        let mut pdus = Vec::new();
        let mut at = 0;
        while at < len {
            let end = (at + step).min(len);
            let last = end == len;
            let p = Pdu::C2hData(C2hData {
                cccid: cid,
                datao: at as u32,
                last,
                success: last && skip_response,
            });
            pdus.push((p, at..end));
            at = end;
        }
        let response_needed = !(skip_response && len > 0);
        if !response_needed {
            self.commands.remove(&cid);
        }
        Ok(C2hPlan {
            pdus,
            response_needed,
        })
    }

    /// Appends a read's C2HData PDUs (data copied) and, unless SUCCESS made
    /// it unneeded, its CapsuleResp to `out`.
    pub fn send_read(
        &mut self,
        c: Completion,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), QueueError> {
        let plan = self.c2h_data(c.cid, data.len(), c.status)?;
        for (p, r) in &plan.pdus {
            let _ = p.encode(&data[r.clone()], &self.tx, out);
        }
        if plan.response_needed {
            self.complete(c, out)?;
        }
        Ok(())
    }

    /// Command identifiers in flight (for abort and teardown).
    pub fn in_flight_ids(&self) -> HashSet<u16> {
        self.commands.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests;
