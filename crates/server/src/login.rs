//! RFC 7143 §6.3 and §11.12–11.13: the login phase of one connection,
//! target side.
//!
//! The driver reads Login Requests, reassembles multi-PDU key text (C bit),
//! lets the protocol core's [`TargetNegotiator`] answer the keys, enforces
//! the stage transitions and ends either in the full feature phase with a
//! [`LoginOutcome`] or with a Login reject status.

use std::sync::Arc;

use bytes::Bytes;
use ethersan_proto::negotiate::{
    NegotiationError, SessionParams, TargetNegotiator, TargetSettings,
};
use ethersan_proto::pdu::{LoginRequest, LoginResponse, Pdu, RawPdu};
use ethersan_proto::text::{encode_text, parse_text, TextAssembler};
use tokio::io::AsyncRead;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::registry::{Registry, TargetEntry};
use crate::wire::{Frame, PduReader, ReadError, WriterMsg};

/// Login status classes and details (§11.13.5).
pub(crate) mod status {
    /// Initiator error (class 2): miscellaneous.
    pub(crate) const INITIATOR_ERROR: (u8, u8) = (0x02, 0x00);
    /// Authorization failure: the initiator may not use the target.
    pub(crate) const NOT_AUTHORIZED: (u8, u8) = (0x02, 0x02);
    /// Target not found.
    pub(crate) const NOT_FOUND: (u8, u8) = (0x02, 0x03);
    /// Unsupported version.
    pub(crate) const UNSUPPORTED_VERSION: (u8, u8) = (0x02, 0x05);
    /// Session does not exist.
    pub(crate) const NO_SESSION: (u8, u8) = (0x02, 0x0a);
    /// Invalid request during login.
    pub(crate) const INVALID_DURING_LOGIN: (u8, u8) = (0x02, 0x0b);
}

/// A finished login.
#[derive(Debug)]
pub(crate) struct LoginOutcome {
    pub(crate) params: SessionParams,
    pub(crate) target: Option<Arc<TargetEntry>>,
    pub(crate) isid: [u8; 6],
    pub(crate) exp_cmd_sn: u32,
    pub(crate) stat_sn: u32,
    pub(crate) session_id: u64,
}

/// Why a login ended without a session.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoginError {
    /// The connection failed or closed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// We rejected the login with this status (already sent).
    #[error("login rejected with status {0:#04x}/{1:#04x}")]
    Rejected(u8, u8),
    /// The login did not finish within the login timeout.
    #[error("login timed out")]
    TimedOut,
}

/// Why a login was refused, as the target's log says it (the initiator
/// is told only the status class and detail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// CHAP is required and the initiator did not offer it (or skipped
    /// the security stage).
    NoChapOffered,
    /// CHAP_N names no user the target knows.
    UnknownUser,
    /// The CHAP response does not match the secret.
    WrongResponse,
    /// The CHAP exchange itself was wrong (malformed keys, a reflected
    /// challenge, no common algorithm, mutual CHAP not possible).
    BadChap,
    /// The target's access rules do not admit the initiator.
    NotAllowed,
    /// No target by the name asked for.
    UnknownTarget,
    /// The keys could not be agreed on.
    Negotiation,
    /// The login broke the protocol (wrong stage, version, session).
    Protocol,
}

impl Refusal {
    /// The reason in the log.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refusal::NoChapOffered => "CHAP required but not offered",
            Refusal::UnknownUser => "unknown CHAP user",
            Refusal::WrongResponse => "wrong CHAP response",
            Refusal::BadChap => "bad CHAP exchange",
            Refusal::NotAllowed => "not allowed by the target's access rules",
            Refusal::UnknownTarget => "unknown target",
            Refusal::Negotiation => "negotiation failed",
            Refusal::Protocol => "login protocol error",
        }
    }

    fn of(e: &NegotiationError) -> Refusal {
        use ethersan_proto::chap::ChapError as C;
        match e {
            NegotiationError::AuthFailed => Refusal::NoChapOffered,
            NegotiationError::Chap(C::UnknownUser) => Refusal::UnknownUser,
            NegotiationError::Chap(C::Failed) => Refusal::WrongResponse,
            NegotiationError::Chap(_) => Refusal::BadChap,
            _ => Refusal::Negotiation,
        }
    }
}

/// What a login attempt said about itself, for the log line of a refusal.
#[derive(Debug, Default)]
struct Attempt {
    /// InitiatorName, once sent.
    initiator: Option<String>,
    /// TargetName, or `(discovery)`.
    target: Option<String>,
    /// Why it was refused.
    refusal: Option<Refusal>,
    /// More about it (a negotiation error).
    detail: Option<String>,
}

impl Attempt {
    /// Refused for a negotiation error.
    fn refused(&mut self, e: &NegotiationError) {
        let r = Refusal::of(e);
        self.refusal = Some(r);
        self.detail = matches!(r, Refusal::BadChap | Refusal::Negotiation).then(|| e.to_string());
    }
}

struct Stage {
    first: Option<LoginRequest>,
    stat_sn: u32,
    exp_cmd_sn: u32,
    csg: u8,
}

/// Bounds on one login.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoginLimits {
    /// Most bytes of key text in one request, its Continue PDUs together.
    pub(crate) max_text: usize,
    /// Time the login may take (back-off waits excluded).
    pub(crate) timeout: std::time::Duration,
}

/// Drive the login phase on a connection. `events` is the channel the
/// session will receive its events on; it is registered with the registry
/// when the session comes into being. `limits.max_text` bounds the key
/// text of one request (all its Continue PDUs together); the login must
/// finish within `limits.timeout`.
///
/// Failed authentications count against (initiator name, `peer_ip`): once
/// there have been several, the first answer to that pair waits (see
/// [`crate::limits::AuthThrottle`]). That wait does not count against
/// the timeout, so a slowed initiator with the right secret still logs in.
pub(crate) async fn login<R: AsyncRead + Unpin>(
    reader: &mut PduReader<R>,
    out: &mpsc::UnboundedSender<WriterMsg>,
    registry: &Arc<Registry>,
    settings: &TargetSettings,
    events: mpsc::UnboundedSender<crate::session::Event>,
    peer_ip: Option<std::net::IpAddr>,
    limits: LoginLimits,
) -> Result<LoginOutcome, LoginError> {
    let mut attempt = Attempt::default();
    let mut deadline = tokio::time::Instant::now() + limits.timeout;
    let r = login_inner(
        reader,
        out,
        registry,
        settings,
        events,
        peer_ip,
        limits.max_text,
        &mut attempt,
        &mut deadline,
    )
    .await;
    {
        use crate::stats::LoginFailure as F;
        let stats = registry.login_stats();
        match &r {
            Ok(_) => stats.login(),
            Err(LoginError::Rejected(2, 1)) => stats.failed(F::Authentication),
            Err(LoginError::Rejected(2, 2)) => stats.failed(F::NotAuthorized),
            Err(LoginError::Rejected(2, 3)) => stats.failed(F::NotFound),
            Err(LoginError::Rejected(..)) => stats.failed(F::Negotiation),
            Err(LoginError::TimedOut) => stats.failed(F::Timeout),
            Err(LoginError::Read(_)) => stats.failed(F::Connection),
        }
    }
    if let Err(LoginError::Rejected(class, detail)) = &r {
        log_refusal(registry, peer_ip, &attempt, (*class, *detail));
    }
    match (&r, peer_ip) {
        (Err(LoginError::Rejected(2, 1)), Some(ip)) => {
            let name = attempt.initiator.as_deref().unwrap_or("");
            registry.auth_throttle().failed(name, ip);
        }
        (Ok(o), Some(ip)) => registry
            .auth_throttle()
            .succeeded(&o.params.initiator_name, ip),
        _ => {}
    }
    r
}

/// One line per refused login, naming target, initiator, peer and reason
/// (never the secret or the response), limited per (peer, reason) by
/// [`crate::limits::RefusalLog`]: what it holds back is counted and said.
fn log_refusal(
    registry: &Registry,
    peer_ip: Option<std::net::IpAddr>,
    attempt: &Attempt,
    status: (u8, u8),
) {
    let reason = attempt.refusal.unwrap_or(Refusal::Protocol).as_str();
    let ip = peer_ip.unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let peer = peer_ip.map_or_else(|| "-".to_string(), |i| i.to_string());
    let limiter = registry.refusal_log();
    for s in limiter.summaries() {
        warn!(
            peer = %s.peer,
            reason = %s.reason,
            not_logged = s.suppressed,
            "login refused {} more times from {} ({}) in the last {} s; those were counted, not logged",
            s.suppressed,
            s.peer,
            s.reason,
            crate::limits::REFUSAL_LOG_WINDOW.as_secs()
        );
    }
    let crate::limits::RefusalLine::Log { suppressed, last } = limiter.refused(ip, reason) else {
        return;
    };
    let mut note = String::new();
    if let Some(d) = &attempt.detail {
        note.push_str(&format!(" ({d})"));
    }
    if suppressed > 0 {
        note.push_str(&format!(
            "; {suppressed} more like it from {peer} were counted, not logged"
        ));
    }
    if last {
        note.push_str(&format!(
            "; more like it from {peer} are counted, not logged, for {} s",
            crate::limits::REFUSAL_LOG_WINDOW.as_secs()
        ));
    }
    warn!(
        target = %printable(attempt.target.as_deref().unwrap_or("-")),
        initiator = %printable(attempt.initiator.as_deref().unwrap_or("-")),
        peer = %peer,
        reason = %reason,
        status = %format_args!("{:02x}{:02x}", status.0, status.1),
        "login refused: {reason}{note}"
    );
}

/// An initiator-supplied name, shortened for the log (the name itself is
/// not secret; its length is the peer's choice).
fn printable(name: &str) -> &str {
    const MAX: usize = 223;
    if name.len() <= MAX {
        return name;
    }
    let mut end = MAX;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[allow(clippy::too_many_arguments)]
async fn login_inner<R: AsyncRead + Unpin>(
    reader: &mut PduReader<R>,
    out: &mpsc::UnboundedSender<WriterMsg>,
    registry: &Arc<Registry>,
    settings: &TargetSettings,
    events: mpsc::UnboundedSender<crate::session::Event>,
    peer_ip: Option<std::net::IpAddr>,
    max_text: usize,
    attempt: &mut Attempt,
    deadline: &mut tokio::time::Instant,
) -> Result<LoginOutcome, LoginError> {
    // CHAP's identifier and challenge come from the OS's CSPRNG.
    let mut nonce = [0u8; 1 + ethersan_proto::chap::CHALLENGE_LEN];
    getrandom::fill(&mut nonce)
        .map_err(|e| LoginError::Read(ReadError::Io(std::io::Error::other(e.to_string()))))?;
    let mut challenge = [0u8; ethersan_proto::chap::CHALLENGE_LEN];
    challenge.copy_from_slice(&nonce[1..]);
    let mut neg = TargetNegotiator::new(settings.clone()).with_nonce(nonce[0], challenge);
    let mut asm = TextAssembler::new(max_text);
    let mut st = Stage {
        first: None,
        stat_sn: 0,
        exp_cmd_sn: 0,
        csg: 0,
    };
    let mut target: Option<Arc<TargetEntry>> = None;
    // Response text waiting to be sent in pieces (C bit).
    let mut pending_out: Option<(Vec<u8>, LoginResponse)> = None;
    loop {
        let raw: RawPdu = tokio::time::timeout_at(*deadline, reader.read())
            .await
            .map_err(|_| LoginError::TimedOut)??;
        let req = match Pdu::decode(&raw.bhs) {
            Ok(Pdu::LoginRequest(r)) => r,
            _ => {
                // Anything but a Login Request before the full feature phase.
                return Err(reject(out, &st, None, status::INVALID_DURING_LOGIN));
            }
        };
        if st.first.is_none() {
            st.stat_sn = req.exp_stat_sn;
            st.exp_cmd_sn = req.cmd_sn;
            st.csg = req.csg;
            if req.version_min > 0 {
                return Err(reject(out, &st, Some(&req), status::UNSUPPORTED_VERSION));
            }
            if req.tsih != 0 && !registry.has_tsih(req.tsih) {
                return Err(reject(out, &st, Some(&req), status::NO_SESSION));
            }
            if req.tsih != 0 {
                // MaxConnections is 1: no connection may join a session.
                return Err(reject(out, &st, Some(&req), status::INITIATOR_ERROR));
            }
            st.first = Some(req.clone());
        }
        let first = st.first.clone().expect("set above");
        if req.isid != first.isid {
            return Err(reject(out, &st, Some(&req), status::INITIATOR_ERROR));
        }
        if req.csg != st.csg
            || req.csg == 2
            || (req.transit && (req.nsg <= req.csg || req.nsg == 2))
        {
            return Err(reject(out, &st, Some(&req), status::INITIATOR_ERROR));
        }
        // The initiator asks for the rest of a long response.
        if let Some((rest, tmpl)) = pending_out.take() {
            send_piece(out, &mut st, &req, rest, tmpl, &mut pending_out);
            continue;
        }
        let text = match asm.push(&raw.data, req.continue_bit) {
            Ok(Some(t)) => t,
            Ok(None) => {
                // Acknowledge a partial text with an empty response (§6.3).
                let resp = base_response(&st, &req, false, req.csg, req.csg);
                send(out, &mut st, resp, Vec::new());
                continue;
            }
            Err(e) => {
                // Text over max_key_text_bytes too: an initiator error
                // (0x0200), not "out of resources" (0x0302), which would
                // invite the initiator to retry the same login (§11.13.5).
                debug!(%e, "bad login text");
                return Err(reject(out, &st, Some(&req), status::INITIATOR_ERROR));
            }
        };
        let keys = match parse_text(&text, &Default::default()) {
            Ok(k) => k,
            Err(e) => {
                debug!(%e, "unparsable login text");
                return Err(reject(out, &st, Some(&req), status::INITIATOR_ERROR));
            }
        };
        // Back-off after failed authentications of this name from this
        // address: before the first answer that could lead to a challenge.
        if attempt.initiator.is_none() {
            if let Some((_, name)) = keys.iter().find(|(k, _)| k == "InitiatorName") {
                attempt.initiator = Some(name.clone());
                if let Some(ip) = peer_ip {
                    let wait = registry.auth_throttle().delay(name, ip);
                    if !wait.is_zero() {
                        registry.login_stats().delayed(wait);
                        debug!(peer = %ip, ?wait, "delaying a login after repeated authentication failures");
                        tokio::time::sleep(wait).await;
                        *deadline += wait;
                    }
                }
            }
        }
        let answer = if req.csg == 0 {
            neg.security_keys(&keys)
        } else {
            neg.operational_keys(&keys)
        };
        if attempt.target.is_none() {
            attempt.target = if neg.is_discovery() {
                Some("(discovery)".into())
            } else {
                neg.target_name().map(str::to_string)
            };
        }
        let mut answer = match answer {
            Ok(a) => a,
            Err(e) => {
                attempt.refused(&e);
                return Err(reject(out, &st, Some(&req), negotiation_status(&e)));
            }
        };
        // Resolve the target once the initiator has named it.
        if target.is_none() && !neg.is_discovery() {
            if let Some(name) = neg.target_name() {
                match registry.target(name) {
                    Some(t) if !t.access.allows(neg.initiator_name().unwrap_or(""), peer_ip) => {
                        attempt.refusal = Some(Refusal::NotAllowed);
                        return Err(reject(out, &st, Some(&req), status::NOT_AUTHORIZED));
                    }
                    Some(t) => target = Some(t),
                    None => {
                        attempt.refusal = Some(Refusal::UnknownTarget);
                        return Err(reject(out, &st, Some(&req), status::NOT_FOUND));
                    }
                }
            }
        }
        let mut transit = req.transit;
        let mut nsg = req.nsg;
        if transit && !neg.can_transit(req.csg, req.nsg) {
            transit = false;
            nsg = req.csg;
        }
        if transit && nsg == 3 {
            let params = match neg.finish() {
                Ok(p) => p,
                Err(e) => {
                    attempt.refused(&e);
                    return Err(reject(out, &st, Some(&req), negotiation_status(&e)));
                }
            };
            if !params.is_discovery() && target.is_none() {
                return Err(reject(out, &st, Some(&req), (0x02, 0x07)));
            }
            let (session_id, tsih) = registry.add_session(
                target.as_ref().map(|t| t.name.as_str()),
                &params.initiator_name,
                first.isid,
                std::sync::Arc::new(move |c| {
                    let _ = events.send(crate::session::Event::Control(c));
                }),
            );
            let mut resp = base_response(&st, &req, true, req.csg, 3);
            resp.tsih = tsih;
            let data = encode_text(&answer);
            answer.clear();
            send(out, &mut st, resp, data);
            return Ok(LoginOutcome {
                params,
                target,
                isid: first.isid,
                exp_cmd_sn: st.exp_cmd_sn,
                stat_sn: st.stat_sn,
                session_id,
            });
        }
        let resp = base_response(&st, &req, transit, req.csg, nsg);
        if transit {
            st.csg = nsg;
        }
        let data = encode_text(&answer);
        send_piece(out, &mut st, &req, data, resp, &mut pending_out);
    }
}

fn negotiation_status(e: &NegotiationError) -> (u8, u8) {
    e.login_status()
}

fn base_response(st: &Stage, req: &LoginRequest, transit: bool, csg: u8, nsg: u8) -> LoginResponse {
    LoginResponse {
        transit,
        continue_bit: false,
        csg,
        nsg: if transit { nsg } else { 0 },
        version_max: 0,
        version_active: 0,
        isid: req.isid,
        tsih: 0,
        itt: req.itt,
        stat_sn: st.stat_sn,
        exp_cmd_sn: st.exp_cmd_sn,
        max_cmd_sn: st.exp_cmd_sn,
        status_class: 0,
        status_detail: 0,
    }
}

/// Largest login data segment we send: the default MaxRecvDataSegmentLength
/// (8192) that binds during login.
const LOGIN_SEGMENT: usize = 8192;

fn send_piece(
    out: &mpsc::UnboundedSender<WriterMsg>,
    st: &mut Stage,
    req: &LoginRequest,
    data: Vec<u8>,
    mut tmpl: LoginResponse,
    pending: &mut Option<(Vec<u8>, LoginResponse)>,
) {
    tmpl.itt = req.itt;
    if data.len() > LOGIN_SEGMENT {
        let rest = data[LOGIN_SEGMENT..].to_vec();
        let mut piece = tmpl.clone();
        piece.continue_bit = true;
        piece.transit = false;
        piece.nsg = 0;
        send(out, st, piece, data[..LOGIN_SEGMENT].to_vec());
        *pending = Some((rest, tmpl));
    } else {
        send(out, st, tmpl, data);
    }
}

fn send(
    out: &mpsc::UnboundedSender<WriterMsg>,
    st: &mut Stage,
    mut resp: LoginResponse,
    data: Vec<u8>,
) {
    resp.stat_sn = st.stat_sn;
    resp.exp_cmd_sn = st.exp_cmd_sn;
    resp.max_cmd_sn = st.exp_cmd_sn;
    st.stat_sn = st.stat_sn.wrapping_add(1);
    let bhs = Pdu::LoginResponse(resp).encode(data.len() as u32);
    let _ = out.send(WriterMsg::Frame(Frame {
        bhs,
        data: Bytes::from(data),
    }));
}

/// Send a Login reject and return the matching error.
fn reject(
    out: &mpsc::UnboundedSender<WriterMsg>,
    st: &Stage,
    req: Option<&LoginRequest>,
    status: (u8, u8),
) -> LoginError {
    let resp = LoginResponse {
        isid: req.map(|r| r.isid).unwrap_or_default(),
        itt: req.map(|r| r.itt).unwrap_or(0),
        csg: req.map(|r| r.csg).unwrap_or(0),
        stat_sn: st.stat_sn,
        exp_cmd_sn: st.exp_cmd_sn,
        max_cmd_sn: st.exp_cmd_sn,
        status_class: status.0,
        status_detail: status.1,
        ..Default::default()
    };
    let bhs = Pdu::LoginResponse(resp).encode(0);
    let _ = out.send(WriterMsg::Frame(Frame {
        bhs,
        data: Bytes::new(),
    }));
    let _ = out.send(WriterMsg::Close);
    LoginError::Rejected(status.0, status.1)
}
