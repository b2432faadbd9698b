//! The handshake that opens a channel: `Noise_XXpsk0_25519_ChaChaPoly_BLAKE2s`
//! with prologue `ethersan/3` ‖ group name and the group's PSK
//! (`docs/native-transport.md`, "Handshake").
//!
//! With the PSK mixed in before the first message, message 1's payload is
//! encrypted under a key only members hold: a target learns at once whether
//! a `HELLO` comes from a member and never answers one that does not. The
//! static keys are fresh (the PSK, not the static key, is the credential).
//!
//! Frames (after the 8-byte common prefix):
//!
//! | frame | destination | body |
//! |---|---|---|
//! | `HELLO` (69 bytes) | 0 | Noise message 1 (32 + 13 + 16) |
//! | `HELLO_REPLY` (114 bytes) | initiator's id | Noise message 2 (32 + 48 + 10 + 16) |
//! | `HELLO_FINISH` (72 bytes) | target's id | Noise message 3 (48 + 0 + 16) |
//!
//! Flags are 0. The payloads of messages 1 and 2 start with 9 bytes: the
//! level (asked for, granted), the sender's largest frame and the sender's
//! channel id (big-endian `u32`s), so the ids are authenticated. Message 1
//! then offers the traffic keys' AEAD suites, [`MAX_OFFER`] bytes in the
//! initiator's order of preference (wire values of [`Suite`], zero-padded);
//! message 2 then names the suite the target picked: the first offered it
//! supports, or 0 when it supports none (the initiator then fails with
//! [`HandshakeError::NoCommonSuite`]). Both are inside the PSK-keyed Noise
//! payloads, so nobody outside the group can strip a suite from the offer.
//! Message 3's payload is empty. Channel id 0 is never a channel's.
//!
//! The initiator's side is [`InitiatorHandshake`]; the target's is one
//! [`Responder`] per endpoint, holding a bounded table of half-open
//! handshakes.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use snow::{Builder, HandshakeState};
use zeroize::Zeroizing;

use crate::aead::{Suite, TrafficKeys};
use crate::group::GroupKeys;
use crate::Level;

/// The Noise protocol name.
pub const NOISE_PARAMS: &str = "Noise_XXpsk0_25519_ChaChaPoly_BLAKE2s";

/// The start of the Noise prologue; the group name follows.
pub const PROLOGUE: &[u8] = b"ethersan/3";

/// How many suites a `HELLO` can offer (the length of its offer field).
pub const MAX_OFFER: usize = 4;

/// The smallest largest-frame a side may announce: below it a channel
/// frame (40-byte header, 16-byte tag) would carry too little.
pub const MIN_MAX_FRAME: u32 = 256;

use crate::frame::{Kind, MAGIC, PREFIX_LEN, VERSION};

const KIND_HELLO: u8 = Kind::Hello as u8;
const KIND_HELLO_REPLY: u8 = Kind::HelloReply as u8;
const KIND_HELLO_FINISH: u8 = Kind::HelloFinish as u8;

const DH_LEN: usize = 32;
const TAG: usize = 16;
/// Level, largest frame, channel id: the start of payloads 1 and 2.
const PAYLOAD_LEN: usize = 9;
/// Message 1's payload: the common part and the suites offered.
const PAYLOAD1_LEN: usize = PAYLOAD_LEN + MAX_OFFER;
/// Message 2's payload: the common part and the suite picked.
const PAYLOAD2_LEN: usize = PAYLOAD_LEN + 1;
/// Noise message 1: e, then the encrypted payload.
const MSG1_LEN: usize = DH_LEN + PAYLOAD1_LEN + TAG;
/// Noise message 2: e, encrypted s, encrypted payload.
const MSG2_LEN: usize = DH_LEN + DH_LEN + TAG + PAYLOAD2_LEN + TAG;
/// Noise message 3: encrypted s, encrypted empty payload.
const MSG3_LEN: usize = DH_LEN + TAG + TAG;

/// Length of a `HELLO` frame.
pub const HELLO_LEN: usize = PREFIX_LEN + MSG1_LEN;
/// Length of a `HELLO_REPLY` frame.
pub const HELLO_REPLY_LEN: usize = PREFIX_LEN + MSG2_LEN;
/// Length of a `HELLO_FINISH` frame.
pub const HELLO_FINISH_LEN: usize = PREFIX_LEN + MSG3_LEN;

/// Why a handshake message was refused. The target sends nothing back for
/// any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The frame is shorter or longer than its kind's fixed length.
    #[error("handshake frame is {len} bytes, expected {expected}")]
    Truncated {
        /// Its length.
        len: usize,
        /// The length of its kind.
        expected: usize,
    },
    /// Not a frame of the expected kind (wrong magic, version or kind,
    /// flags not 0, or a `HELLO` not addressed to 0).
    #[error("not a {expected} frame")]
    WrongKind {
        /// The kind expected.
        expected: &'static str,
    },
    /// The `HELLO` was not made with the group's PSK: its sender is not a
    /// member of the group (or of another group, or used another secret).
    #[error("HELLO from a non-member (wrong group or secret)")]
    NotMember,
    /// A reply or finish failed authentication.
    #[error("handshake message failed authentication")]
    Decrypt,
    /// A `HELLO_FINISH` (or a reply) for no handshake in progress.
    #[error("no handshake in progress for channel {id}")]
    UnknownHandshake {
        /// The destination channel id of the frame.
        id: u32,
    },
    /// The frame is of another native transport version.
    #[error("peer speaks native transport version {0}, this ethersan speaks {VERSION}: run the same ethersan version on both ends")]
    BadVersion(u8),
    /// The target granted less than the level asked for.
    #[error("the target refused security level {asked}: it granted only {granted}")]
    LevelRefused {
        /// Level asked for.
        asked: Level,
        /// Level granted.
        granted: Level,
    },
    /// The target supports none of the AEAD suites offered (the two ends
    /// were restricted to disjoint suites, e.g. by
    /// `ETHERSAN_NATIVE_SUITES`).
    #[error("no AEAD suite in common with the target: this side offered {offered} (ETHERSAN_NATIVE_SUITES restricts the suites on either end)")]
    NoCommonSuite {
        /// The suites offered, by name, comma-separated.
        offered: String,
    },
    /// An authenticated payload that makes no sense (unknown level, too
    /// small a frame size, channel id 0, no suite offered, a suite picked
    /// that was not offered).
    #[error("bad handshake payload: {0}")]
    BadPayload(&'static str),
    /// A channel id given to this side is 0 or already in a half-open
    /// handshake.
    #[error("channel id {0} cannot be used")]
    BadLocalId(u32),
    /// The handshake was already completed.
    #[error("the handshake is already complete")]
    Finished,
    /// The Noise library failed (key generation, parameters).
    #[error("noise: {0}")]
    Noise(String),
}

/// A completed handshake: everything a channel needs.
#[derive(Debug)]
pub struct Established {
    /// The level of the channel (granted by the target).
    pub level: Level,
    /// Our channel id (the destination of the peer's frames).
    pub local_id: u32,
    /// The peer's channel id (the destination of our frames).
    pub peer_id: u32,
    /// The traffic keys, epoch 0, of the suite negotiated
    /// ([`TrafficKeys::suite`]).
    pub keys: TrafficKeys,
    /// The largest frame the peer accepts.
    pub peer_max_frame: u32,
}

fn noise_err(e: snow::Error) -> HandshakeError {
    HandshakeError::Noise(e.to_string())
}

fn prefix(kind: u8, dst: u32) -> [u8; PREFIX_LEN] {
    let d = dst.to_be_bytes();
    [MAGIC, VERSION, kind, 0, d[0], d[1], d[2], d[3]]
}

/// Checks the prefix and length of a handshake frame; returns its
/// destination id.
fn check_frame(
    frame: &[u8],
    kind: u8,
    len: usize,
    name: &'static str,
) -> Result<u32, HandshakeError> {
    if frame.len() >= PREFIX_LEN && frame[0] == MAGIC && frame[1] != VERSION {
        return Err(HandshakeError::BadVersion(frame[1]));
    }
    if frame.len() < PREFIX_LEN
        || frame[0] != MAGIC
        || frame[1] != VERSION
        || frame[2] != kind
        || frame[3] != 0
    {
        return Err(HandshakeError::WrongKind { expected: name });
    }
    if frame.len() != len {
        return Err(HandshakeError::Truncated {
            len: frame.len(),
            expected: len,
        });
    }
    Ok(be32(&frame[4..8]))
}

fn be32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_be_bytes(a)
}

/// The payload of messages 1 and 2: level, largest frame, the sender's
/// channel id.
fn encode_payload(level: Level, max_frame: u32, id: u32) -> [u8; PAYLOAD_LEN] {
    let m = max_frame.to_be_bytes();
    let i = id.to_be_bytes();
    [
        level.to_u8(),
        m[0],
        m[1],
        m[2],
        m[3],
        i[0],
        i[1],
        i[2],
        i[3],
    ]
}

/// Message 1's payload: the common part, then the suites offered (at
/// most [`MAX_OFFER`], zero-padded).
fn encode_offer(level: Level, max_frame: u32, id: u32, suites: &[Suite]) -> [u8; PAYLOAD1_LEN] {
    let mut p = [0u8; PAYLOAD1_LEN];
    p[..PAYLOAD_LEN].copy_from_slice(&encode_payload(level, max_frame, id));
    for (b, s) in p[PAYLOAD_LEN..].iter_mut().zip(suites) {
        *b = s.to_u8();
    }
    p
}

/// The suites a message 1 offers, in order: up to the first 0; values
/// this side does not know (a newer peer's) are skipped.
fn decode_offer(p: &[u8]) -> Vec<Suite> {
    p.iter()
        .take_while(|&&b| b != 0)
        .filter_map(|&b| Suite::from_u8(b))
        .collect()
}

/// `suites` without repeats, at most [`MAX_OFFER`], in order.
fn offer_list(suites: &[Suite]) -> Vec<Suite> {
    let mut out: Vec<Suite> = Vec::new();
    for &s in suites {
        if !out.contains(&s) && out.len() < MAX_OFFER {
            out.push(s);
        }
    }
    out
}

/// Names of `suites`, comma-separated (as `ETHERSAN_NATIVE_SUITES` takes).
fn suite_names(suites: &[Suite]) -> String {
    suites
        .iter()
        .map(|s| s.name())
        .collect::<Vec<_>>()
        .join(",")
}

/// Decodes a payload's common part: (level, largest frame, sender's
/// channel id).
fn decode_payload(p: &[u8]) -> Result<(Level, u32, u32), HandshakeError> {
    if p.len() != PAYLOAD_LEN {
        return Err(HandshakeError::BadPayload("payload length"));
    }
    let level = Level::from_u8(p[0]).ok_or(HandshakeError::BadPayload("unknown level"))?;
    let max_frame = be32(&p[1..5]);
    if max_frame < MIN_MAX_FRAME {
        return Err(HandshakeError::BadPayload("largest frame too small"));
    }
    let id = be32(&p[5..9]);
    if id == 0 {
        return Err(HandshakeError::BadPayload("channel id 0"));
    }
    Ok((level, max_frame, id))
}

fn params() -> Result<snow::params::NoiseParams, HandshakeError> {
    NOISE_PARAMS.parse().map_err(noise_err)
}

/// A fresh static private key.
fn generate_static() -> Result<Zeroizing<Vec<u8>>, HandshakeError> {
    let kp = Builder::new(params()?)
        .generate_keypair()
        .map_err(noise_err)?;
    Ok(Zeroizing::new(kp.private))
}

fn new_state(
    keys: &GroupKeys,
    static_private: &[u8],
    initiator: bool,
) -> Result<HandshakeState, HandshakeError> {
    let mut prologue = PROLOGUE.to_vec();
    prologue.extend_from_slice(keys.group().as_bytes());
    let b = Builder::new(params()?)
        .local_private_key(static_private)
        .map_err(noise_err)?
        .prologue(&prologue)
        .map_err(noise_err)?
        .psk(0, keys.psk())
        .map_err(noise_err)?;
    if initiator {
        b.build_initiator()
    } else {
        b.build_responder()
    }
    .map_err(noise_err)
}

/// The initiator's side of one handshake.
pub struct InitiatorHandshake {
    state: Option<HandshakeState>,
    hello: Vec<u8>,
    local_id: u32,
    level: Level,
    /// The suites offered, in order.
    suites: Vec<Suite>,
}

impl std::fmt::Debug for InitiatorHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitiatorHandshake")
            .field("local_id", &self.local_id)
            .field("level", &self.level)
            .field("suites", &self.suites)
            .field("finished", &self.state.is_none())
            .finish_non_exhaustive()
    }
}

impl InitiatorHandshake {
    /// Starts a handshake with fresh static and ephemeral keys, asking for
    /// `level` and announcing `max_frame`; our channel will be `local_id`
    /// (not 0). It offers this machine's suites ([`Suite::preferred`]).
    pub fn new(
        keys: &GroupKeys,
        local_id: u32,
        level: Level,
        max_frame: u32,
    ) -> Result<InitiatorHandshake, HandshakeError> {
        Self::with_suites(keys, local_id, level, max_frame, &Suite::preferred())
    }

    /// [`InitiatorHandshake::new`] offering `suites`, in order of
    /// preference (repeats dropped, at most [`MAX_OFFER`]; none is
    /// [`HandshakeError::BadPayload`]).
    pub fn with_suites(
        keys: &GroupKeys,
        local_id: u32,
        level: Level,
        max_frame: u32,
        suites: &[Suite],
    ) -> Result<InitiatorHandshake, HandshakeError> {
        let suites = offer_list(suites);
        if suites.is_empty() {
            return Err(HandshakeError::BadPayload("no suite to offer"));
        }
        if local_id == 0 {
            return Err(HandshakeError::BadLocalId(0));
        }
        if max_frame < MIN_MAX_FRAME {
            return Err(HandshakeError::BadPayload("largest frame too small"));
        }
        let mut state = new_state(keys, &generate_static()?, true)?;
        let mut hello = Vec::with_capacity(HELLO_LEN);
        hello.extend_from_slice(&prefix(KIND_HELLO, 0));
        let mut msg = [0u8; MSG1_LEN];
        let n = state
            .write_message(&encode_offer(level, max_frame, local_id, &suites), &mut msg)
            .map_err(noise_err)?;
        hello.extend_from_slice(&msg[..n]);
        Ok(InitiatorHandshake {
            state: Some(state),
            hello,
            local_id,
            level,
            suites,
        })
    }

    /// The `HELLO` frame, to send (and resend on a timer until a reply
    /// comes).
    pub fn hello(&self) -> &[u8] {
        &self.hello
    }

    /// Our channel id.
    pub fn local_id(&self) -> u32 {
        self.local_id
    }

    /// The suites offered, in order of preference.
    pub fn suites(&self) -> &[Suite] {
        &self.suites
    }

    /// Takes the target's `HELLO_REPLY`: returns the `HELLO_FINISH` frame
    /// to send (and resend until the target's first channel frame comes)
    /// and the channel's parameters. A reply granting less than the level
    /// asked for is refused ([`HandshakeError::LevelRefused`]), one picking
    /// no suite too ([`HandshakeError::NoCommonSuite`]). A reply
    /// that fails authentication (or is not addressed to us) leaves the
    /// handshake as it was, ready for the real one; an authentic one that
    /// refuses or makes no sense ends it.
    pub fn handle_reply(&mut self, frame: &[u8]) -> Result<(Vec<u8>, Established), HandshakeError> {
        let dst = check_frame(frame, KIND_HELLO_REPLY, HELLO_REPLY_LEN, "HELLO_REPLY")?;
        if dst != self.local_id {
            return Err(HandshakeError::UnknownHandshake { id: dst });
        }
        let state = self.state.as_mut().ok_or(HandshakeError::Finished)?;
        let mut payload = [0u8; MSG2_LEN];
        let n = state
            .read_message(&frame[PREFIX_LEN..], &mut payload)
            .map_err(|_| HandshakeError::Decrypt)?;
        // The reply is the target's own: whatever it says ends the
        // handshake.
        let Some(mut state) = self.state.take() else {
            return Err(HandshakeError::Finished);
        };
        if n != PAYLOAD2_LEN {
            return Err(HandshakeError::BadPayload("payload length"));
        }
        let (granted, peer_max_frame, peer_id) = decode_payload(&payload[..PAYLOAD_LEN])?;
        if granted < self.level {
            return Err(HandshakeError::LevelRefused {
                asked: self.level,
                granted,
            });
        }
        let suite = match payload[PAYLOAD_LEN] {
            0 => {
                return Err(HandshakeError::NoCommonSuite {
                    offered: suite_names(&self.suites),
                })
            }
            v => Suite::from_u8(v)
                .filter(|s| self.suites.contains(s))
                .ok_or(HandshakeError::BadPayload("suite not offered"))?,
        };
        let mut finish = Vec::with_capacity(HELLO_FINISH_LEN);
        finish.extend_from_slice(&prefix(KIND_HELLO_FINISH, peer_id));
        let mut msg = [0u8; MSG3_LEN];
        let n = state.write_message(&[], &mut msg).map_err(noise_err)?;
        finish.extend_from_slice(&msg[..n]);
        let (to_target, to_initiator) = state.dangerously_get_raw_split();
        Ok((
            finish,
            Established {
                level: granted,
                local_id: self.local_id,
                peer_id,
                keys: TrafficKeys::with_suite(suite, to_target, to_initiator),
                peer_max_frame,
            },
        ))
    }
}

/// The result of a `HELLO`.
#[derive(Debug)]
pub struct HelloOutcome {
    /// The `HELLO_REPLY` frame to send back.
    pub reply: Vec<u8>,
    /// The `HELLO` repeated one already answered: `reply` is the same as
    /// then, and the `new_local_id` given was not used.
    pub repeated: bool,
}

/// A half-open handshake: the reply sent, the finish awaited.
struct HalfOpen {
    state: HandshakeState,
    seq: u64,
    created: Instant,
    peer_id: u32,
    ephemeral: [u8; DH_LEN],
    hello: Vec<u8>,
    reply: Vec<u8>,
    level: Level,
    peer_max_frame: u32,
    /// The suite picked; `None`: none of the offered is supported.
    suite: Option<Suite>,
}

/// The target's side: answers `HELLO`s of members and completes their
/// handshakes. One per endpoint.
pub struct Responder {
    keys: GroupKeys,
    /// The suites this side supports.
    suites: Vec<Suite>,
    /// Our static key, made at the first `HELLO` and kept.
    static_private: Option<Zeroizing<Vec<u8>>>,
    max_half_open: usize,
    half_open_timeout: Duration,
    /// Half-open handshakes by our (new) channel id.
    half_open: HashMap<u32, HalfOpen>,
    /// The same, by the initiator's ephemeral key (repeated `HELLO`s).
    by_ephemeral: HashMap<[u8; DH_LEN], u32>,
    /// Creation order: (our id, seq); entries no longer in `half_open`
    /// (or with another seq) are stale and skipped.
    order: VecDeque<(u32, u64)>,
    next_seq: u64,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("group", &self.keys.group())
            .field("suites", &self.suites)
            .field("half_open", &self.half_open.len())
            .field("max_half_open", &self.max_half_open)
            .finish_non_exhaustive()
    }
}

impl Responder {
    /// A responder for group `keys`, keeping at most `max_half_open`
    /// handshakes (at least 1) waiting for their `HELLO_FINISH`, each for at
    /// most `half_open_timeout`; when full, a new one evicts the oldest.
    /// It supports both suites; see [`Responder::with_suites`].
    pub fn new(keys: GroupKeys, max_half_open: usize, half_open_timeout: Duration) -> Responder {
        Responder {
            keys,
            suites: Suite::preferred(),
            static_private: None,
            max_half_open: max_half_open.max(1),
            half_open_timeout,
            half_open: HashMap::new(),
            by_ephemeral: HashMap::new(),
            order: VecDeque::new(),
            next_seq: 0,
        }
    }

    /// The responder supporting only `suites` (an empty list leaves it as
    /// it was). It picks the first suite of each `HELLO`'s offer that is
    /// in `suites`: the initiator's preference decides.
    pub fn with_suites(mut self, suites: &[Suite]) -> Responder {
        let suites = offer_list(suites);
        if !suites.is_empty() {
            self.suites = suites;
        }
        self
    }

    /// The suites this side supports.
    pub fn suites(&self) -> &[Suite] {
        &self.suites
    }

    /// How many handshakes are half-open.
    pub fn half_open(&self) -> usize {
        self.half_open.len()
    }

    /// Answers a `HELLO`. A member's gets a `HELLO_REPLY` granting the level
    /// asked for, with `new_local_id` (not 0) as our channel id and
    /// `max_frame` as our largest frame, and the first suite offered that we
    /// support (or 0 when there is none: the initiator learns why it
    /// fails, and the half-open handshake can never finish); the same
    /// `HELLO` again gets the same reply (`repeated`, `new_local_id`
    /// unused). Anything else is an error and must get no answer: a
    /// non-member learns nothing.
    pub fn handle_hello(
        &mut self,
        now: Instant,
        frame: &[u8],
        new_local_id: u32,
        max_frame: u32,
    ) -> Result<HelloOutcome, HandshakeError> {
        if check_frame(frame, KIND_HELLO, HELLO_LEN, "HELLO")? != 0 {
            return Err(HandshakeError::WrongKind { expected: "HELLO" });
        }
        self.expire(now);
        let msg = &frame[PREFIX_LEN..];
        let mut ephemeral = [0u8; DH_LEN];
        ephemeral.copy_from_slice(&msg[..DH_LEN]);
        if let Some(h) = self
            .by_ephemeral
            .get(&ephemeral)
            .and_then(|id| self.half_open.get(id))
        {
            if h.hello == frame {
                return Ok(HelloOutcome {
                    reply: h.reply.clone(),
                    repeated: true,
                });
            }
        }
        if new_local_id == 0 || self.half_open.contains_key(&new_local_id) {
            return Err(HandshakeError::BadLocalId(new_local_id));
        }
        if max_frame < MIN_MAX_FRAME {
            return Err(HandshakeError::BadPayload("largest frame too small"));
        }
        if self.static_private.is_none() {
            self.static_private = Some(generate_static()?);
        }
        let static_private = self.static_private.as_deref().map_or(&[][..], |k| &k[..]);
        let mut state = new_state(&self.keys, static_private, false)?;
        let mut payload = [0u8; MSG1_LEN];
        let n = state
            .read_message(msg, &mut payload)
            .map_err(|_| HandshakeError::NotMember)?;
        if n != PAYLOAD1_LEN {
            return Err(HandshakeError::BadPayload("payload length"));
        }
        let (level, peer_max_frame, peer_id) = decode_payload(&payload[..PAYLOAD_LEN])?;
        let offer = decode_offer(&payload[PAYLOAD_LEN..n]);
        if payload[PAYLOAD_LEN] == 0 {
            return Err(HandshakeError::BadPayload("no suite offered"));
        }
        let suite = offer.into_iter().find(|s| self.suites.contains(s));
        let mut reply = Vec::with_capacity(HELLO_REPLY_LEN);
        reply.extend_from_slice(&prefix(KIND_HELLO_REPLY, peer_id));
        let mut body = [0u8; PAYLOAD2_LEN];
        body[..PAYLOAD_LEN].copy_from_slice(&encode_payload(level, max_frame, new_local_id));
        body[PAYLOAD_LEN] = suite.map_or(0, Suite::to_u8);
        let mut out = [0u8; MSG2_LEN];
        let n = state.write_message(&body, &mut out).map_err(noise_err)?;
        reply.extend_from_slice(&out[..n]);

        while self.half_open.len() >= self.max_half_open {
            self.evict_oldest();
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(old) = self.by_ephemeral.insert(ephemeral, new_local_id) {
            // The same ephemeral in a different HELLO (its clear channel id
            // changed on the way): the newer one wins.
            self.remove(old);
        }
        self.half_open.insert(
            new_local_id,
            HalfOpen {
                state,
                seq,
                created: now,
                peer_id,
                ephemeral,
                hello: frame.to_vec(),
                reply: reply.clone(),
                level,
                peer_max_frame,
                suite,
            },
        );
        self.order.push_back((new_local_id, seq));
        if self.order.len() > 2 * self.max_half_open {
            let live = &self.half_open;
            self.order
                .retain(|(id, seq)| live.get(id).is_some_and(|h| h.seq == *seq));
        }
        Ok(HelloOutcome {
            reply,
            repeated: false,
        })
    }

    /// Completes a handshake with its `HELLO_FINISH` (found by its
    /// destination id, ours from the reply). A finish of the wrong length
    /// or for no handshake changes nothing; one that fails authentication
    /// ends its handshake (the initiator has to start again).
    pub fn handle_finish(
        &mut self,
        now: Instant,
        frame: &[u8],
    ) -> Result<Established, HandshakeError> {
        let id = check_frame(frame, KIND_HELLO_FINISH, HELLO_FINISH_LEN, "HELLO_FINISH")?;
        self.expire(now);
        let h = self
            .half_open
            .get_mut(&id)
            .ok_or(HandshakeError::UnknownHandshake { id })?;
        let mut payload = [0u8; MSG3_LEN];
        let Ok(n) = h.state.read_message(&frame[PREFIX_LEN..], &mut payload) else {
            // snow rolls back the handshake hash after a failed read but not
            // its cipher state, which message 3 uses before any new key: a
            // failed message 3 leaves a state that cannot read the real
            // one. Only an attacker who sees the reply (and could drop it)
            // gets here; the initiator connects again.
            self.remove(id);
            return Err(HandshakeError::Decrypt);
        };
        if n != 0 {
            // Authentic, so the initiator's own doing: the handshake ends.
            self.remove(id);
            return Err(HandshakeError::BadPayload("HELLO_FINISH payload"));
        }
        let Some(suite) = h.suite else {
            // The reply told the initiator there was no suite in common;
            // its finish cannot make one.
            self.remove(id);
            return Err(HandshakeError::BadPayload("no suite in common"));
        };
        let (to_target, to_initiator) = h.state.dangerously_get_raw_split();
        let est = Established {
            level: h.level,
            local_id: id,
            peer_id: h.peer_id,
            keys: TrafficKeys::with_suite(suite, to_initiator, to_target),
            peer_max_frame: h.peer_max_frame,
        };
        self.remove(id);
        Ok(est)
    }

    /// Drops the half-open handshakes older than the timeout.
    pub fn expire(&mut self, now: Instant) {
        while let Some(&(id, seq)) = self.order.front() {
            match self.half_open.get(&id) {
                Some(h) if h.seq == seq => {
                    if now.saturating_duration_since(h.created) < self.half_open_timeout {
                        break;
                    }
                    self.remove(id);
                }
                _ => {}
            }
            self.order.pop_front();
        }
    }

    fn evict_oldest(&mut self) {
        while let Some((id, seq)) = self.order.pop_front() {
            if self.half_open.get(&id).is_some_and(|h| h.seq == seq) {
                self.remove(id);
                return;
            }
        }
        // Unreachable while `order` lists every live entry; never loop.
        if let Some(&id) = self.half_open.keys().next() {
            self.remove(id);
        }
    }

    fn remove(&mut self, id: u32) {
        if let Some(h) = self.half_open.remove(&id) {
            if self.by_ephemeral.get(&h.ephemeral) == Some(&id) {
                self.by_ephemeral.remove(&h.ephemeral);
            }
        }
    }
}

#[cfg(test)]
mod tests;
