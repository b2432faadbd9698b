//! The host side of one NVMe/TCP connection (TP 8000 §7.3: ICReq/ICResp,
//! command capsules, R2T and H2CData, C2HData, termination), free of I/O:
//! the mirror of [`crate::queue::Queue`].
//!
//! [`Host::new`] queues the ICReq; the driver sends what
//! [`Host::poll_transmit`] appends, feeds received bytes to
//! [`Host::receive`] and acts on the [`HostEvent`]s: the ICResp
//! ([`HostEvent::Connected`]), then each command's completion
//! ([`HostEvent::Completed`], with the data a read brought). Commands are
//! built by [`commands`] and given to [`Host::submit`], which picks a CID,
//! puts write data in the capsule when it fits the controller's in-capsule
//! size and otherwise keeps it for the controller's R2Ts (answered with
//! H2CData PDUs of at most MAXH2CDATA bytes). C2HData with SUCCESS ends a
//! command without a response capsule. [`parse`] decodes Identify data and
//! the Discovery log.

pub mod commands;
pub mod parse;

#[cfg(test)]
mod tests;

use std::collections::HashMap;

use crate::cqe::Cqe;
use crate::pdu::{
    self, C2hData, Framing, H2cData, IcReq, IcResp, Pdu, PduError, R2t, TermReq, MAX_TERM_DATA,
};
use crate::sqe::Sgl;
use crate::status::Status;
pub use commands::{Payload, Request};

/// What the host asks for in its ICReq and accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostConfig {
    /// Ask for header digests.
    pub header_digest: bool,
    /// Ask for data digests.
    pub data_digest: bool,
    /// HPDA: alignment of C2H data the host asks for, 0's based dwords.
    pub hpda: u8,
    /// MAXR2T: outstanding R2Ts per command the host accepts, 0's based.
    pub maxr2t: u32,
    /// Most write data sent in a command capsule (the admin queue's 8192
    /// bytes; IOCCSZ × 16 − 64 on an I/O queue).
    pub max_in_capsule: u32,
    /// Most data accepted in one C2HData PDU.
    pub max_c2h_data: u32,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            header_digest: false,
            data_digest: false,
            hpda: 0,
            maxr2t: 0,
            max_in_capsule: 8192,
            max_c2h_data: 16 << 20,
        }
    }
}

/// A failure of the connection: every one ends it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The ICResp does not fit what was asked.
    #[error("the controller's ICResp is unacceptable: {0}")]
    IcResp(&'static str),
    /// A received PDU broke the transport's rules (an H2CTermReq is queued).
    #[error("bad PDU from the controller: {0}")]
    Pdu(#[from] PduError),
    /// The controller ended the connection with a C2HTermReq.
    #[error("the controller terminated the connection (C2HTermReq FES {fes:#x}, FEI {fei:#x})")]
    Terminated {
        /// Fatal Error Status.
        fes: u16,
        /// Fatal Error Information.
        fei: u32,
    },
    /// Every command identifier is in use.
    #[error("no free command identifier")]
    NoCid,
    /// The connection is not set up yet, or has ended.
    #[error("the connection is not ready")]
    NotReady,
    /// A command's data longer than a PDU or SGL can describe.
    #[error("command data of {0} bytes is too long")]
    TooLong(usize),
}

/// What a received PDU meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEvent {
    /// The ICResp arrived and fits: commands may be submitted.
    Connected(IcResp),
    /// A command ended.
    Completed(Completed),
}

/// A command's end: its completion entry and, for a read, its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The CQE (made up for a C2HData SUCCESS: status success, no dwords).
    /// Its status is Transient Transport Error when a data digest failed.
    pub cqe: Cqe,
    /// The data read (as many bytes as the command asked for), empty for
    /// other commands.
    pub data: Vec<u8>,
}

/// What [`Host::receive`] did with the front of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Bytes consumed (one PDU).
    pub consumed: usize,
    /// What it meant, if anything the caller must see.
    pub event: Option<HostEvent>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitIcResp,
    Ready,
    Closed,
}

#[derive(Debug)]
struct Command {
    /// Write data kept for R2Ts.
    write: Vec<u8>,
    /// Read buffer.
    read: Vec<u8>,
    digest_failed: bool,
}

/// The host side of one NVMe/TCP connection (one queue pair).
#[derive(Debug)]
pub struct Host {
    config: HostConfig,
    state: State,
    rx: Framing,
    tx: Framing,
    maxh2cdata: u32,
    next_cid: u16,
    commands: HashMap<u16, Command>,
    out: Vec<u8>,
}

impl Host {
    /// A connection that has its ICReq queued for sending.
    pub fn new(config: HostConfig) -> Self {
        let mut out = Vec::new();
        let req = Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: config.hpda.min(31),
            header_digest: config.header_digest,
            data_digest: config.data_digest,
            maxr2t: config.maxr2t,
        });
        // An ICReq carries no data: it always encodes.
        let _ = req.encode(&[], &Framing::plain(0), &mut out);
        Host {
            config,
            state: State::AwaitIcResp,
            rx: Framing::plain(0),
            tx: Framing::plain(0),
            maxh2cdata: 0,
            next_cid: 0,
            commands: HashMap::new(),
            out,
        }
    }

    /// Whether the ICResp has been accepted and the connection not ended.
    pub fn is_ready(&self) -> bool {
        self.state == State::Ready
    }

    /// Framing of the PDUs this end sends (digests, the controller's CPDA).
    pub fn tx_framing(&self) -> Framing {
        self.tx
    }

    /// MAXH2CDATA the controller gave (0 before the ICResp).
    pub fn max_h2c_data(&self) -> u32 {
        self.maxh2cdata
    }

    /// Changes the largest in-capsule write (once IOCCSZ is known).
    pub fn set_max_in_capsule(&mut self, bytes: u32) {
        self.config.max_in_capsule = bytes;
    }

    /// Commands submitted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.commands.len()
    }

    /// Appends the bytes to send to `out`; false if there are none.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> bool {
        crate::pdu::hand_over(&mut self.out, out)
    }

    fn free_cid(&mut self) -> Option<u16> {
        for _ in 0..=u16::MAX as u32 {
            let c = self.next_cid;
            self.next_cid = self.next_cid.wrapping_add(1);
            if !self.commands.contains_key(&c) {
                return Some(c);
            }
        }
        None
    }

    /// Queues a command capsule for `req`; answers its CID.
    pub fn submit(&mut self, req: Request) -> Result<u16, HostError> {
        if self.state != State::Ready {
            return Err(HostError::NotReady);
        }
        let len = match &req.data {
            Payload::ToController(d) => d.len(),
            _ => req.data.len() as usize,
        };
        let len32 = u32::try_from(len).map_err(|_| HostError::TooLong(len))?;
        let cid = self.free_cid().ok_or(HostError::NoCid)?;
        let mut sqe = req.sqe;
        sqe.0[2..4].copy_from_slice(&cid.to_le_bytes());
        let mut cmd = Command {
            write: Vec::new(),
            read: Vec::new(),
            digest_failed: false,
        };
        let mut capsule: &[u8] = &[];
        match &req.data {
            Payload::ToController(d) if len32 <= self.config.max_in_capsule && !d.is_empty() => {
                sqe.set_sgl(Sgl::InCapsule {
                    offset: 0,
                    len: len32,
                });
                capsule = d;
            }
            Payload::ToController(d) => {
                sqe.set_sgl(Sgl::Transport { len: len32 });
                cmd.write = d.clone();
            }
            Payload::FromController(n) => {
                sqe.set_sgl(Sgl::Transport { len: *n });
                cmd.read = vec![0; *n as usize];
            }
            Payload::None => sqe.set_sgl(Sgl::Transport { len: 0 }),
        }
        Pdu::CapsuleCmd(sqe)
            .encode(capsule, &self.tx, &mut self.out)
            .map_err(|_| HostError::TooLong(len))?;
        self.commands.insert(cid, cmd);
        Ok(cid)
    }

    /// Decodes the PDU at the front of `buf`: `Ok(None)` until it is whole.
    /// An error ends the connection (an H2CTermReq is queued when the
    /// controller broke the rules).
    pub fn receive(&mut self, buf: &[u8]) -> Result<Option<Received>, HostError> {
        if self.state == State::Closed {
            return Err(HostError::NotReady);
        }
        match self.receive_inner(buf) {
            Ok(r) => Ok(r),
            Err(e) => {
                if let HostError::Pdu(p) = &e {
                    let hlen = buf
                        .first()
                        .and_then(|&t| pdu::PduType::from_u8(t))
                        .map_or(pdu::COMMON_HEADER_LEN, |t| t.header_len());
                    let header = &buf[..buf.len().min(hlen).min(MAX_TERM_DATA)];
                    let term = Pdu::H2cTermReq(TermReq::from(p.fatal_status()));
                    let _ = term.encode(header, &Framing::plain(0), &mut self.out);
                }
                self.state = State::Closed;
                Err(e)
            }
        }
    }

    fn receive_inner(&mut self, buf: &[u8]) -> Result<Option<Received>, HostError> {
        // The PDUs that set up and end a connection never carry digests.
        let framing = match buf.first().and_then(|&t| pdu::PduType::from_u8(t)) {
            Some(t) if !t.digestible() => Framing::plain(0),
            _ => self.rx,
        };
        let Some(d) = pdu::decode(buf, &framing)? else {
            return Ok(None);
        };
        let data = &buf[d.data.clone()];
        let event = match (self.state, d.pdu) {
            (_, Pdu::C2hTermReq(t)) => {
                return Err(HostError::Terminated {
                    fes: t.fes,
                    fei: t.fei,
                })
            }
            (State::AwaitIcResp, Pdu::IcResp(r)) => Some(self.ic_resp(r)?),
            (State::Ready, Pdu::CapsuleResp(cqe)) => {
                let cmd = self
                    .commands
                    .remove(&cqe.cid)
                    .ok_or(PduError::InvalidHeaderField {
                        offset: 20,
                        what: "CapsuleResp for no command in flight",
                    })?;
                Some(Self::completed(cqe, cmd))
            }
            (State::Ready, Pdu::C2hData(c)) => self.c2h_data(c, data, d.data_digest_ok)?,
            (State::Ready, Pdu::R2t(r)) => {
                self.r2t(r)?;
                None
            }
            _ => return Err(PduError::Sequence("PDU not allowed here").into()),
        };
        Ok(Some(Received {
            consumed: d.len,
            event,
        }))
    }

    fn ic_resp(&mut self, r: IcResp) -> Result<HostEvent, HostError> {
        if r.header_digest && !self.config.header_digest
            || r.data_digest && !self.config.data_digest
        {
            return Err(HostError::IcResp("digests enabled that were not asked for"));
        }
        self.rx = Framing {
            header_digest: r.header_digest,
            data_digest: r.data_digest,
            pda: 0,
            max_data: self.config.max_c2h_data,
        };
        self.tx = Framing {
            header_digest: r.header_digest,
            data_digest: r.data_digest,
            pda: r.cpda,
            max_data: 0,
        };
        self.maxh2cdata = r.maxh2cdata;
        self.state = State::Ready;
        Ok(HostEvent::Connected(r))
    }

    fn completed(mut cqe: Cqe, cmd: Command) -> HostEvent {
        if cmd.digest_failed && cqe.status.is_success() {
            cqe.status = Status::TRANSIENT_TRANSPORT_ERROR;
        }
        HostEvent::Completed(Completed {
            cqe,
            data: cmd.read,
        })
    }

    fn c2h_data(
        &mut self,
        c: C2hData,
        data: &[u8],
        digest_ok: bool,
    ) -> Result<Option<HostEvent>, HostError> {
        let cmd = self
            .commands
            .get_mut(&c.cccid)
            .ok_or(PduError::InvalidHeaderField {
                offset: 8,
                what: "C2HData for no command in flight",
            })?;
        let at = c.datao as usize;
        let Some(dst) = cmd.read.get_mut(at..at + data.len()) else {
            return Err(PduError::DataOutOfRange {
                offset: c.datao,
                len: data.len() as u32,
            }
            .into());
        };
        dst.copy_from_slice(data);
        cmd.digest_failed |= !digest_ok;
        if !c.success {
            return Ok(None);
        }
        let cmd = self.commands.remove(&c.cccid).ok_or(HostError::NotReady)?;
        Ok(Some(Self::completed(
            Cqe::new(c.cccid, Status::SUCCESS),
            cmd,
        )))
    }

    fn r2t(&mut self, r: R2t) -> Result<(), HostError> {
        let cmd = self
            .commands
            .get(&r.cccid)
            .ok_or(PduError::InvalidHeaderField {
                offset: 8,
                what: "R2T for no command in flight",
            })?;
        let start = r.r2to as usize;
        let end = start.saturating_add(r.r2tl as usize);
        if r.r2tl == 0 || end > cmd.write.len() {
            return Err(PduError::DataOutOfRange {
                offset: r.r2to,
                len: r.r2tl,
            }
            .into());
        }
        let step = self.maxh2cdata.max(4096) as usize;
        let mut at = start;
        while at < end {
            let next = (at + step).min(end);
            let h = Pdu::H2cData(H2cData {
                cccid: r.cccid,
                ttag: r.ttag,
                datao: at as u32,
                last: next == end,
            });
            h.encode(&cmd.write[at..next], &self.tx, &mut self.out)
                .map_err(|_| HostError::TooLong(next - at))?;
            at = next;
        }
        Ok(())
    }
}
