//! The login phase, initiator side (RFC 7143 §6, §11.12–11.13), as a
//! state machine that does no I/O: the security stage (with CHAP when
//! the negotiator has credentials), then the operational stage, each in
//! as many rounds as the target takes, the key text negotiated by proto's
//! [`InitiatorNegotiator`].
//!
//! [`Login::new`] queues the first Login Request; feed each Login
//! Response to [`Login::handle`] and send what [`Login::poll_transmit`]
//! gives, until `handle` returns the [`LoggedIn`] outcome.

use std::collections::VecDeque;

use bytes::Bytes;
use ethersan_proto::negotiate::{InitiatorNegotiator, NegotiationError, SessionParams};
use ethersan_proto::pdu::{LoginRequest, Pdu, RawPdu};
use ethersan_proto::seq::CmdSnWindow;
use ethersan_proto::text::{encode_text, parse_text, TextAssembler};

use crate::conn::Transmit;
use crate::Error;

/// The ITT of every Login Request.
const LOGIN_ITT: u32 = 0x1000;

/// What a successful login settled.
#[derive(Debug, Clone)]
pub struct LoggedIn {
    /// The negotiated parameters.
    pub params: SessionParams,
    /// The TSIH the target assigned.
    pub tsih: u16,
    /// The CmdSN window the last Login Response opened.
    pub window: CmdSnWindow,
    /// The ExpStatSN for the first command.
    pub exp_stat_sn: u32,
}

/// One login exchange.
#[derive(Debug)]
pub struct Login {
    neg: InitiatorNegotiator,
    isid: [u8; 6],
    /// ExpStatSN: one past the last Login Response's StatSN.
    stat_sn: u32,
    /// The current stage (0 security, 1 operational).
    csg: u8,
    /// The response being collected (C bit).
    text: TextAssembler,
    out: VecDeque<Transmit>,
}

impl Login {
    /// Start a login with this negotiator (its CHAP credentials set, if
    /// any) and ISID; the first Login Request is queued.
    pub fn new(neg: InitiatorNegotiator, isid: [u8; 6]) -> Login {
        let keys = neg.security_proposal();
        let mut l = Login {
            neg,
            isid,
            stat_sn: 0,
            csg: 0,
            text: TextAssembler::default(),
            out: VecDeque::new(),
        };
        l.request(true, &keys);
        l
    }

    /// The next Login Request to send. Login PDUs carry no digests
    /// (§13.1) and the RFC default limits.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }

    fn request(&mut self, transit: bool, keys: &[(String, String)]) {
        let data = encode_text(keys);
        let nsg = match (transit, self.csg) {
            (false, _) => 0,
            (true, 0) => 1,
            (true, _) => 3,
        };
        let req = LoginRequest {
            transit,
            continue_bit: false,
            csg: self.csg,
            nsg,
            version_max: 0,
            version_min: 0,
            isid: self.isid,
            tsih: 0,
            itt: LOGIN_ITT,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: self.stat_sn,
        };
        self.out.push_back(Transmit {
            bhs: Pdu::LoginRequest(req).encode(data.len() as u32),
            ahs: Vec::new(),
            data: Bytes::from(data),
        });
    }

    /// Take in one Login Response: `Ok(Some(_))` when the login is
    /// complete, `Ok(None)` when it goes on (send what
    /// [`poll_transmit`](Self::poll_transmit) gives), an error when it
    /// failed.
    pub fn handle(&mut self, raw: RawPdu) -> Result<Option<LoggedIn>, Error> {
        let Ok(Pdu::LoginResponse(resp)) = Pdu::decode(&raw.bhs) else {
            return Err(Error::Protocol("expected a Login Response".into()));
        };
        if resp.status_class != 0 {
            return Err(Error::LoginRefused {
                class: resp.status_class,
                detail: resp.status_detail,
            });
        }
        self.stat_sn = resp.stat_sn.wrapping_add(1);
        let text = self
            .text
            .push(&raw.data, resp.continue_bit)
            .map_err(|e| Error::Protocol(e.to_string()))?;
        let Some(text) = text else {
            // More of the response to come: ask for it.
            self.request(false, &[]);
            return Ok(None);
        };
        let answer =
            parse_text(&text, &Default::default()).map_err(|e| Error::Protocol(e.to_string()))?;
        self.neg.accept_response(&answer).map_err(|e| match e {
            NegotiationError::Chap(c) => Error::Auth(c.to_string()),
            e => Error::Protocol(e.to_string()),
        })?;
        if resp.transit && self.csg == 0 && !self.neg.auth_complete() {
            return Err(Error::Auth(
                "the target left the security stage before CHAP completed".into(),
            ));
        }
        if resp.transit && resp.nsg == 3 {
            return Ok(Some(LoggedIn {
                params: self.neg.finish(),
                tsih: resp.tsih,
                window: CmdSnWindow::new(resp.exp_cmd_sn, resp.max_cmd_sn),
                exp_stat_sn: self.stat_sn,
            }));
        }
        let keys = if resp.transit {
            self.csg = resp.nsg;
            self.neg.operational_proposal()
        } else {
            self.neg.pending_answers()
        };
        self.request(true, &keys);
        Ok(None)
    }
}
