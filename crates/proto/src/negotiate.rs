//! RFC 7143 §6.2–6.6 and §13: login and text key negotiation.
//!
//! Every key lives in one table ([`KEYS`]) that says how it negotiates;
//! [`TargetNegotiator`] answers an initiator's keys stage by stage and
//! [`InitiatorNegotiator`] is its mirror for our initiator library. Both
//! end in the same [`SessionParams`].

use std::collections::HashSet;

/// How a key's value is settled (§6.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// The sender declares; no answer (except as noted per key).
    Declarative,
    /// Boolean, result is AND of both sides.
    BoolAnd,
    /// Boolean, result is OR of both sides.
    BoolOr,
    /// Number, result is the minimum.
    NumMin,
    /// Number, result is the maximum.
    NumMax,
    /// List of values, the responder picks the first it supports.
    List,
}

/// One key of §13.
#[derive(Debug, Clone, Copy)]
pub struct KeyDef {
    /// Key name.
    pub name: &'static str,
    /// How it negotiates.
    pub kind: KeyKind,
    /// Allowed range for numbers.
    pub range: (u32, u32),
    /// Meaningful in discovery sessions (others are answered Irrelevant).
    pub discovery: bool,
    /// Sent only in the security stage (AuthMethod).
    pub security_only: bool,
    /// Only the target may send it.
    pub target_only: bool,
}

const fn k(name: &'static str, kind: KeyKind, range: (u32, u32), discovery: bool) -> KeyDef {
    KeyDef {
        name,
        kind,
        range,
        discovery,
        security_only: false,
        target_only: false,
    }
}

const MAX24: u32 = (1 << 24) - 1;

/// The keys this implementation knows (§13, plus RFC 7144/5046 keys it
/// answers and the RFC 3720 marker keys older initiators still send).
pub const KEYS: &[KeyDef] = &[
    KeyDef {
        name: "AuthMethod",
        kind: KeyKind::List,
        range: (0, 0),
        discovery: true,
        security_only: true,
        target_only: false,
    },
    k("HeaderDigest", KeyKind::List, (0, 0), true),
    k("DataDigest", KeyKind::List, (0, 0), true),
    k("MaxConnections", KeyKind::NumMin, (1, 65535), false),
    k("InitiatorName", KeyKind::Declarative, (0, 0), true),
    k("InitiatorAlias", KeyKind::Declarative, (0, 0), true),
    k("TargetName", KeyKind::Declarative, (0, 0), true),
    k("SessionType", KeyKind::Declarative, (0, 0), true),
    KeyDef {
        name: "TargetAlias",
        kind: KeyKind::Declarative,
        range: (0, 0),
        discovery: true,
        security_only: false,
        target_only: true,
    },
    KeyDef {
        name: "TargetAddress",
        kind: KeyKind::Declarative,
        range: (0, 0),
        discovery: true,
        security_only: false,
        target_only: true,
    },
    KeyDef {
        name: "TargetPortalGroupTag",
        kind: KeyKind::Declarative,
        range: (0, 65535),
        discovery: true,
        security_only: false,
        target_only: true,
    },
    k("InitialR2T", KeyKind::BoolOr, (0, 0), false),
    k("ImmediateData", KeyKind::BoolAnd, (0, 0), false),
    k(
        "MaxRecvDataSegmentLength",
        KeyKind::Declarative,
        (512, MAX24),
        true,
    ),
    k("MaxBurstLength", KeyKind::NumMin, (512, MAX24), false),
    k("FirstBurstLength", KeyKind::NumMin, (512, MAX24), false),
    k("DefaultTime2Wait", KeyKind::NumMax, (0, 3600), true),
    k("DefaultTime2Retain", KeyKind::NumMin, (0, 3600), true),
    k("MaxOutstandingR2T", KeyKind::NumMin, (1, 65535), false),
    k("DataPDUInOrder", KeyKind::BoolOr, (0, 0), false),
    k("DataSequenceInOrder", KeyKind::BoolOr, (0, 0), false),
    k("ErrorRecoveryLevel", KeyKind::NumMin, (0, 2), true),
    k("IFMarker", KeyKind::BoolAnd, (0, 0), true),
    k("OFMarker", KeyKind::BoolAnd, (0, 0), true),
    k("RDMAExtensions", KeyKind::BoolAnd, (0, 0), true),
    k("iSCSIProtocolLevel", KeyKind::NumMin, (0, 31), true),
    k("X#NodeArchitecture", KeyKind::Declarative, (0, 0), true),
];

/// Look a key up in [`KEYS`].
pub fn key_def(name: &str) -> Option<&'static KeyDef> {
    KEYS.iter().find(|d| d.name == name)
}

/// Normal or discovery session (§13.21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionType {
    /// A session for SCSI commands to one target.
    #[default]
    Normal,
    /// A session for SendTargets only.
    Discovery,
}

/// Everything a login settles (RFC defaults until negotiated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    /// Normal or discovery.
    pub session_type: SessionType,
    /// InitiatorName
    pub initiator_name: String,
    /// InitiatorAlias
    pub initiator_alias: Option<String>,
    /// TargetName (normal sessions).
    pub target_name: Option<String>,
    /// CRC32C header digests.
    pub header_digest: bool,
    /// CRC32C data digests.
    pub data_digest: bool,
    /// MaxConnections
    pub max_connections: u32,
    /// InitialR2T
    pub initial_r2t: bool,
    /// ImmediateData
    pub immediate_data: bool,
    /// What the target may receive per PDU (the target's declaration).
    pub max_recv_data_segment_length: u32,
    /// What the initiator may receive per PDU (the initiator's declaration):
    /// the target sends at most this much.
    pub max_send_data_segment_length: u32,
    /// MaxBurstLength
    pub max_burst_length: u32,
    /// FirstBurstLength
    pub first_burst_length: u32,
    /// DefaultTime2Wait
    pub default_time2wait: u32,
    /// DefaultTime2Retain
    pub default_time2retain: u32,
    /// MaxOutstandingR2T
    pub max_outstanding_r2t: u32,
    /// DataPDUInOrder
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder
    pub data_sequence_in_order: bool,
    /// ErrorRecoveryLevel
    pub error_recovery_level: u32,
}

impl Default for SessionParams {
    fn default() -> Self {
        SessionParams {
            session_type: SessionType::Normal,
            initiator_name: String::new(),
            initiator_alias: None,
            target_name: None,
            header_digest: false,
            data_digest: false,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_recv_data_segment_length: 8192,
            max_send_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
        }
    }
}

impl SessionParams {
    /// Whether this is a discovery session.
    pub fn is_discovery(&self) -> bool {
        self.session_type == SessionType::Discovery
    }
}

/// Why negotiation failed; each maps to a Login reject status (§11.13.5).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NegotiationError {
    /// A required key is missing (InitiatorName, TargetName, ...).
    #[error("missing parameter {0}")]
    Missing(&'static str),
    /// A key was sent twice.
    #[error("key {0} sent more than once")]
    Duplicate(String),
    /// A key that has no place in this stage or direction.
    #[error("key {0} not allowed here")]
    NotAllowed(String),
    /// A value that breaks the rules beyond a simple Reject.
    #[error("invalid value for {0}")]
    Invalid(String),
    /// Authentication did not succeed.
    #[error("authentication failed")]
    AuthFailed,
    /// The CHAP exchange failed.
    #[error("CHAP: {0}")]
    Chap(crate::chap::ChapError),
    /// The target answered something we cannot accept (initiator side).
    #[error("target answered {key}={value}, which cannot be accepted")]
    BadAnswer {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
}

impl NegotiationError {
    /// The Login Response status class and detail for this error.
    pub fn login_status(&self) -> (u8, u8) {
        match self {
            NegotiationError::Missing(_) => (0x02, 0x07),
            NegotiationError::AuthFailed => (0x02, 0x01),
            // A wrong name or response, or a reflected challenge, is an
            // authentication failure; malformed CHAP keys an initiator error.
            NegotiationError::Chap(
                crate::chap::ChapError::Missing(_) | crate::chap::ChapError::Invalid(_),
            ) => (0x02, 0x00),
            NegotiationError::Chap(_) => (0x02, 0x01),
            _ => (0x02, 0x00),
        }
    }
}

/// How initiators must authenticate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AuthPolicy {
    /// No authentication (AuthMethod=None).
    #[default]
    None,
    /// CHAP (AuthMethod=CHAP): initiators must prove `initiator`; with
    /// `target`, the target proves itself to initiators that ask (mutual).
    Chap {
        /// The name and secret initiators log in with.
        initiator: crate::chap::Credentials,
        /// The target's own name and secret, for mutual CHAP.
        target: Option<crate::chap::Credentials>,
    },
}

/// Digest choices in preference order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Digest {
    /// No digest.
    None,
    /// CRC32C.
    Crc32c,
}

impl Digest {
    fn name(self) -> &'static str {
        match self {
            Digest::None => "None",
            Digest::Crc32c => "CRC32C",
        }
    }
    fn parse(s: &str) -> Option<Digest> {
        match s {
            "None" => Some(Digest::None),
            "CRC32C" => Some(Digest::Crc32c),
            _ => None,
        }
    }
}

/// What the target offers and accepts.
#[derive(Debug, Clone)]
pub struct TargetSettings {
    /// Our MaxRecvDataSegmentLength declaration.
    pub max_recv_data_segment_length: u32,
    /// Largest MaxBurstLength we accept.
    pub max_burst_length: u32,
    /// Largest FirstBurstLength we accept.
    pub first_burst_length: u32,
    /// Our InitialR2T preference (false: unsolicited data welcome).
    pub initial_r2t: bool,
    /// Our ImmediateData preference.
    pub immediate_data: bool,
    /// Largest MaxOutstandingR2T we accept.
    pub max_outstanding_r2t: u32,
    /// Acceptable header digests.
    pub header_digests: Vec<Digest>,
    /// Acceptable data digests.
    pub data_digests: Vec<Digest>,
    /// DefaultTime2Wait we offer.
    pub default_time2wait: u32,
    /// DefaultTime2Retain we offer.
    pub default_time2retain: u32,
    /// TargetAlias to declare.
    pub target_alias: Option<String>,
    /// TargetPortalGroupTag to declare.
    pub portal_group_tag: u16,
    /// Authentication policy.
    pub auth: AuthPolicy,
    /// Whether discovery sessions must authenticate too (with CHAP), when
    /// `discovery_auth` is not set.
    pub auth_discovery: bool,
    /// Discovery sessions' own policy (their own credentials); overrides
    /// `auth` and `auth_discovery` for discovery sessions.
    pub discovery_auth: Option<AuthPolicy>,
    /// Per-target policies: a normal session to a listed target uses its
    /// policy instead of `auth`.
    pub target_auth: Vec<(String, AuthPolicy)>,
}

impl TargetSettings {
    /// The policy a session must satisfy: a discovery session's, or the one
    /// of the target it names (`None`: not named yet, the global one).
    pub fn auth_for(&self, discovery: bool, target: Option<&str>) -> &AuthPolicy {
        if discovery {
            return match &self.discovery_auth {
                Some(p) => p,
                None if self.auth_discovery => &self.auth,
                None => &AuthPolicy::None,
            };
        }
        target
            .and_then(|t| self.target_auth.iter().find(|(n, _)| n == t))
            .map(|(_, p)| p)
            .unwrap_or(&self.auth)
    }
}

impl Default for TargetSettings {
    fn default() -> Self {
        TargetSettings {
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1 << 20,
            first_burst_length: 65_536,
            initial_r2t: false,
            immediate_data: true,
            max_outstanding_r2t: 4,
            header_digests: vec![Digest::None, Digest::Crc32c],
            data_digests: vec![Digest::None, Digest::Crc32c],
            default_time2wait: 2,
            default_time2retain: 0,
            target_alias: None,
            portal_group_tag: 1,
            auth: AuthPolicy::None,
            auth_discovery: true,
            discovery_auth: None,
            target_auth: Vec::new(),
        }
    }
}

fn parse_num(v: &str) -> Option<u64> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        if h.is_empty() || h.len() > 16 {
            return None;
        }
        u64::from_str_radix(h, 16).ok()
    } else if !v.is_empty() && v.len() <= 20 && v.bytes().all(|b| b.is_ascii_digit()) {
        v.parse().ok()
    } else {
        None
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn yes_no(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_string()
}

/// Target side of a login's negotiation.
#[derive(Debug, Clone)]
pub struct TargetNegotiator {
    settings: TargetSettings,
    params: SessionParams,
    seen: HashSet<String>,
    session_type_given: bool,
    auth_done: bool,
    declared_mrdsl: bool,
    declared_tpgt: bool,
    /// AuthMethod=CHAP was agreed.
    chap_agreed: bool,
    /// The CHAP exchange, once started.
    chap: Option<crate::chap::TargetChap>,
    /// The policy whose credentials the CHAP exchange checks.
    chap_policy: Option<AuthPolicy>,
    /// Random CHAP identifier and challenge (from the caller's CSPRNG).
    nonce: Option<(u8, [u8; crate::chap::CHALLENGE_LEN])>,
}

type Pairs = Vec<(String, String)>;

impl TargetNegotiator {
    /// Start negotiating with these settings.
    pub fn new(settings: TargetSettings) -> Self {
        let params = SessionParams {
            max_recv_data_segment_length: settings.max_recv_data_segment_length,
            default_time2retain: settings.default_time2retain,
            ..SessionParams::default()
        };
        TargetNegotiator {
            settings,
            params,
            seen: HashSet::new(),
            session_type_given: false,
            auth_done: false,
            declared_mrdsl: false,
            declared_tpgt: false,
            chap_agreed: false,
            chap: None,
            chap_policy: None,
            nonce: None,
        }
    }

    /// The random CHAP identifier and challenge to use (from a CSPRNG).
    /// Without them a CHAP login fails closed.
    pub fn with_nonce(mut self, id: u8, challenge: [u8; crate::chap::CHALLENGE_LEN]) -> Self {
        self.nonce = Some((id, challenge));
        self
    }

    /// Whether the initiator declared a discovery session.
    pub fn is_discovery(&self) -> bool {
        self.params.is_discovery()
    }

    /// The TargetName the initiator gave, if any.
    pub fn target_name(&self) -> Option<&str> {
        self.params.target_name.as_deref()
    }

    /// The InitiatorName given, if any.
    pub fn initiator_name(&self) -> Option<&str> {
        (!self.params.initiator_name.is_empty()).then_some(self.params.initiator_name.as_str())
    }

    /// The authentication policy that applies to this login as far as the
    /// initiator has declared itself (session type, target name).
    pub fn auth_policy(&self) -> &AuthPolicy {
        self.settings
            .auth_for(self.is_discovery(), self.params.target_name.as_deref())
    }

    /// Whether the policy that applies now is met: nothing to do, or a
    /// finished CHAP exchange that checked that policy's credentials (a
    /// TargetName given after the exchange cannot switch them).
    fn auth_satisfied(&self) -> bool {
        match self.auth_policy() {
            AuthPolicy::None => true,
            policy @ AuthPolicy::Chap { .. } => {
                self.chap_policy.as_ref() == Some(policy)
                    && self.chap.as_ref().is_some_and(|c| c.is_done())
            }
        }
    }

    /// Identity keys first: the policy for AuthMethod and the need for
    /// authentication depend on SessionType and TargetName.
    fn identity_first(keys: &[(String, String)]) -> impl Iterator<Item = &(String, String)> {
        const FIRST: [&str; 2] = ["SessionType", "TargetName"];
        FIRST
            .iter()
            .flat_map(move |f| keys.iter().filter(move |(k, _)| k == f))
            .chain(keys.iter().filter(|(k, _)| !FIRST.contains(&k.as_str())))
    }

    /// Whether a transit from stage `csg` to `nsg` may happen now.
    pub fn can_transit(&self, csg: u8, _nsg: u8) -> bool {
        match csg {
            0 => self.auth_done,
            _ => true,
        }
    }

    /// Answer the keys of a security-stage request.
    pub fn security_keys(&mut self, keys: &[(String, String)]) -> Result<Pairs, NegotiationError> {
        let mut out = Vec::new();
        let mut chap_keys = Vec::new();
        // SessionType and TargetName first: which credentials apply depends
        // on them.
        for (key, value) in Self::identity_first(keys) {
            if key.starts_with("CHAP_") {
                chap_keys.push((key.clone(), value.clone()));
                continue;
            }
            if let Some(a) = self.answer(key, value, true)? {
                out.push(a);
            }
        }
        if !chap_keys.is_empty() || (self.chap_agreed && self.chap.is_some()) {
            let policy = self.auth_policy().clone();
            let AuthPolicy::Chap { initiator, target } = &policy else {
                return Err(NegotiationError::Invalid("CHAP_A".into()));
            };
            if !self.chap_agreed {
                return Err(NegotiationError::AuthFailed);
            }
            let (id, challenge) = self.nonce.ok_or(NegotiationError::AuthFailed)?;
            if self.chap.is_none() {
                self.chap_policy = Some(policy.clone());
            }
            let chap = self.chap.get_or_insert_with(|| {
                crate::chap::TargetChap::new(initiator.clone(), target.clone(), id, challenge)
            });
            out.extend(chap.on_keys(&chap_keys).map_err(NegotiationError::Chap)?);
            if chap.is_done() {
                self.auth_done = true;
            }
        }
        self.declarations(&mut out, false);
        Ok(out)
    }

    /// Answer the keys of an operational-stage request.
    pub fn operational_keys(
        &mut self,
        keys: &[(String, String)],
    ) -> Result<Pairs, NegotiationError> {
        // Identity keys sent here (no security stage) decide the policy.
        let mut out = Vec::new();
        let mut rest = Vec::new();
        for kv in Self::identity_first(keys) {
            if kv.0 == "SessionType" || kv.0 == "TargetName" {
                if let Some(a) = self.answer(&kv.0, &kv.1, false)? {
                    out.push(a);
                }
            } else {
                rest.push(kv);
            }
        }
        if !self.auth_satisfied() {
            return Err(NegotiationError::AuthFailed);
        }
        // Without a security stage there is nothing to authenticate with.
        self.auth_done = true;
        for (key, value) in rest {
            if let Some(a) = self.answer(key, value, false)? {
                out.push(a);
            }
        }
        self.declarations(&mut out, true);
        Ok(out)
    }

    /// Keys the target declares without being asked: TargetPortalGroupTag in
    /// the first response of a normal session, MaxRecvDataSegmentLength in
    /// the operational stage.
    fn declarations(&mut self, out: &mut Pairs, operational: bool) {
        if !self.declared_tpgt && !self.is_discovery() && self.params.target_name.is_some() {
            self.declared_tpgt = true;
            out.push((
                "TargetPortalGroupTag".into(),
                self.settings.portal_group_tag.to_string(),
            ));
            if let Some(a) = &self.settings.target_alias {
                out.push(("TargetAlias".into(), a.clone()));
            }
        }
        if operational && !self.declared_mrdsl {
            self.declared_mrdsl = true;
            out.push((
                "MaxRecvDataSegmentLength".into(),
                self.settings.max_recv_data_segment_length.to_string(),
            ));
        }
    }

    fn answer(
        &mut self,
        key: &str,
        value: &str,
        security: bool,
    ) -> Result<Option<(String, String)>, NegotiationError> {
        if !self.seen.insert(key.to_string()) {
            return Err(NegotiationError::Duplicate(key.to_string()));
        }
        let Some(def) = key_def(key) else {
            return Ok(Some((key.to_string(), "NotUnderstood".into())));
        };
        if def.target_only {
            return Err(NegotiationError::NotAllowed(key.to_string()));
        }
        if def.security_only && !security {
            return Ok(Some((key.to_string(), "Irrelevant".into())));
        }
        let reject = || Ok(Some((key.to_string(), "Reject".to_string())));
        // Session-wide operational keys mean nothing in a discovery session.
        if self.is_discovery() && !def.discovery {
            return Ok(Some((key.to_string(), "Irrelevant".into())));
        }
        let p = &mut self.params;
        let s = &self.settings;
        let ans = |v: String| Ok(Some((key.to_string(), v)));
        match key {
            "InitiatorName" => {
                if value.is_empty() {
                    return Err(NegotiationError::Invalid(key.into()));
                }
                p.initiator_name = value.to_string();
                Ok(None)
            }
            "InitiatorAlias" => {
                p.initiator_alias = Some(value.to_string());
                Ok(None)
            }
            "TargetName" => {
                p.target_name = Some(value.to_string());
                Ok(None)
            }
            "SessionType" => {
                self.session_type_given = true;
                match value {
                    "Normal" => p.session_type = SessionType::Normal,
                    "Discovery" => p.session_type = SessionType::Discovery,
                    _ => return Err(NegotiationError::Invalid(key.into())),
                }
                Ok(None)
            }
            "X#NodeArchitecture" => Ok(None),
            "AuthMethod" => {
                let offered: Vec<&str> = value.split(',').collect();
                let policy = s.auth_for(p.is_discovery(), p.target_name.as_deref());
                match policy {
                    AuthPolicy::None if offered.contains(&"None") => {
                        self.auth_done = true;
                        ans("None".into())
                    }
                    AuthPolicy::None => reject(),
                    AuthPolicy::Chap { .. } if offered.contains(&"CHAP") => {
                        self.chap_agreed = true;
                        ans("CHAP".into())
                    }
                    // CHAP is required and the initiator cannot do it.
                    AuthPolicy::Chap { .. } => Err(NegotiationError::AuthFailed),
                }
            }
            "HeaderDigest" | "DataDigest" => {
                let acceptable = if key == "HeaderDigest" {
                    &s.header_digests
                } else {
                    &s.data_digests
                };
                let pick = value
                    .split(',')
                    .filter_map(Digest::parse)
                    .find(|d| acceptable.contains(d));
                match pick {
                    Some(d) => {
                        if key == "HeaderDigest" {
                            p.header_digest = d == Digest::Crc32c;
                        } else {
                            p.data_digest = d == Digest::Crc32c;
                        }
                        ans(d.name().into())
                    }
                    None => reject(),
                }
            }
            "MaxRecvDataSegmentLength" => match parse_num(value) {
                Some(n) if n >= u64::from(def.range.0) && n <= u64::from(def.range.1) => {
                    p.max_send_data_segment_length = n as u32;
                    // Our own declaration goes out with the operational answers.
                    Ok(None)
                }
                _ => reject(),
            },
            _ => match def.kind {
                KeyKind::BoolAnd | KeyKind::BoolOr => {
                    let Some(theirs) = parse_bool(value) else {
                        return reject();
                    };
                    let ours = match key {
                        "InitialR2T" => s.initial_r2t,
                        "ImmediateData" => s.immediate_data,
                        "DataPDUInOrder" | "DataSequenceInOrder" => true,
                        // Markers and iSER are not supported.
                        _ => false,
                    };
                    let result = if def.kind == KeyKind::BoolAnd {
                        theirs && ours
                    } else {
                        theirs || ours
                    };
                    match key {
                        "InitialR2T" => p.initial_r2t = result,
                        "ImmediateData" => p.immediate_data = result,
                        "DataPDUInOrder" => p.data_pdu_in_order = result,
                        "DataSequenceInOrder" => p.data_sequence_in_order = result,
                        _ => {}
                    }
                    ans(yes_no(result))
                }
                KeyKind::NumMin | KeyKind::NumMax => {
                    let Some(n) = parse_num(value) else {
                        return reject();
                    };
                    if n < u64::from(def.range.0) || n > u64::from(def.range.1) {
                        return reject();
                    }
                    let n = n as u32;
                    let ours = match key {
                        "MaxConnections" => 1,
                        "MaxBurstLength" => s.max_burst_length,
                        "FirstBurstLength" => s.first_burst_length,
                        "DefaultTime2Wait" => s.default_time2wait,
                        "DefaultTime2Retain" => s.default_time2retain,
                        "MaxOutstandingR2T" => s.max_outstanding_r2t,
                        "ErrorRecoveryLevel" => 0,
                        "iSCSIProtocolLevel" => 1,
                        _ => n,
                    };
                    let result = if def.kind == KeyKind::NumMin {
                        n.min(ours)
                    } else {
                        n.max(ours)
                    };
                    match key {
                        "MaxConnections" => p.max_connections = result,
                        "MaxBurstLength" => p.max_burst_length = result,
                        "FirstBurstLength" => p.first_burst_length = result,
                        "DefaultTime2Wait" => p.default_time2wait = result,
                        "DefaultTime2Retain" => p.default_time2retain = result,
                        "MaxOutstandingR2T" => p.max_outstanding_r2t = result,
                        "ErrorRecoveryLevel" => p.error_recovery_level = result,
                        _ => {}
                    }
                    ans(result.to_string())
                }
                KeyKind::List | KeyKind::Declarative => {
                    Ok(Some((key.to_string(), "NotUnderstood".into())))
                }
            },
        }
    }

    /// Check the outcome and return the session's parameters.
    pub fn finish(&self) -> Result<SessionParams, NegotiationError> {
        let mut p = self.params.clone();
        if p.initiator_name.is_empty() {
            return Err(NegotiationError::Missing("InitiatorName"));
        }
        if !p.is_discovery() && p.target_name.is_none() {
            return Err(NegotiationError::Missing("TargetName"));
        }
        if !self.auth_satisfied() {
            return Err(NegotiationError::AuthFailed);
        }
        // FirstBurstLength never exceeds MaxBurstLength (§13.14).
        p.first_burst_length = p.first_burst_length.min(p.max_burst_length);
        Ok(p)
    }
}

/// What the initiator asks for.
#[derive(Debug, Clone)]
pub struct InitiatorSettings {
    /// Our iSCSI name.
    pub initiator_name: String,
    /// Our alias.
    pub initiator_alias: Option<String>,
    /// The target (normal sessions).
    pub target_name: Option<String>,
    /// Normal or discovery.
    pub session_type: SessionType,
    /// Ask for CRC32C header digests.
    pub header_digest: bool,
    /// Ask for CRC32C data digests.
    pub data_digest: bool,
    /// Our MaxRecvDataSegmentLength.
    pub max_recv_data_segment_length: u32,
    /// MaxBurstLength to offer.
    pub max_burst_length: u32,
    /// FirstBurstLength to offer.
    pub first_burst_length: u32,
    /// InitialR2T to offer.
    pub initial_r2t: bool,
    /// ImmediateData to offer.
    pub immediate_data: bool,
    /// MaxOutstandingR2T to offer.
    pub max_outstanding_r2t: u32,
}

impl Default for InitiatorSettings {
    fn default() -> Self {
        InitiatorSettings {
            initiator_name: "iqn.2026-11.org.ethersan:client".into(),
            initiator_alias: None,
            target_name: None,
            session_type: SessionType::Normal,
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1 << 20,
            first_burst_length: 262_144,
            initial_r2t: false,
            immediate_data: true,
            max_outstanding_r2t: 4,
        }
    }
}

/// Initiator side of a login's negotiation.
#[derive(Debug, Clone)]
pub struct InitiatorNegotiator {
    settings: InitiatorSettings,
    params: SessionParams,
    pending: Pairs,
    /// TargetPortalGroupTag the target declared.
    pub portal_group_tag: Option<u16>,
    /// TargetAlias the target declared.
    pub target_alias: Option<String>,
    /// CHAP, when we have credentials.
    chap: Option<crate::chap::InitiatorChap>,
}

fn digest_offer(on: bool) -> String {
    if on { "CRC32C,None" } else { "None" }.to_string()
}

impl InitiatorNegotiator {
    /// Start with these settings.
    pub fn new(settings: InitiatorSettings) -> Self {
        let params = SessionParams {
            session_type: settings.session_type,
            initiator_name: settings.initiator_name.clone(),
            initiator_alias: settings.initiator_alias.clone(),
            target_name: settings.target_name.clone(),
            max_recv_data_segment_length: 8192,
            max_send_data_segment_length: settings.max_recv_data_segment_length,
            ..SessionParams::default()
        };
        InitiatorNegotiator {
            settings,
            params,
            pending: Vec::new(),
            portal_group_tag: None,
            target_alias: None,
            chap: None,
        }
    }

    /// Keys for the security stage.
    pub fn security_proposal(&self) -> Pairs {
        let s = &self.settings;
        let mut v = vec![("InitiatorName".to_string(), s.initiator_name.clone())];
        if let Some(a) = &s.initiator_alias {
            v.push(("InitiatorAlias".into(), a.clone()));
        }
        match s.session_type {
            SessionType::Discovery => v.push(("SessionType".into(), "Discovery".into())),
            SessionType::Normal => {
                v.push(("SessionType".into(), "Normal".into()));
                if let Some(t) = &s.target_name {
                    v.push(("TargetName".into(), t.clone()));
                }
            }
        }
        let methods = if self.chap.is_some() {
            "CHAP,None"
        } else {
            "None"
        };
        v.push(("AuthMethod".into(), methods.into()));
        v
    }

    /// Authenticate with CHAP (offered before None).
    pub fn with_chap(mut self, chap: crate::chap::InitiatorChap) -> Self {
        self.chap = Some(chap);
        self
    }

    /// Whether authentication is complete (true without CHAP).
    pub fn auth_complete(&self) -> bool {
        self.chap.as_ref().is_none_or(|c| c.is_done())
    }

    /// Keys for the operational stage.
    pub fn operational_proposal(&self) -> Pairs {
        let s = &self.settings;
        let mut v = vec![
            ("HeaderDigest".to_string(), digest_offer(s.header_digest)),
            ("DataDigest".to_string(), digest_offer(s.data_digest)),
            ("DefaultTime2Wait".to_string(), "0".to_string()),
            ("DefaultTime2Retain".to_string(), "0".to_string()),
            ("ErrorRecoveryLevel".to_string(), "0".to_string()),
            (
                "MaxRecvDataSegmentLength".to_string(),
                s.max_recv_data_segment_length.to_string(),
            ),
        ];
        if s.session_type == SessionType::Normal {
            v.extend([
                ("MaxConnections".to_string(), "1".to_string()),
                ("InitialR2T".to_string(), yes_no(s.initial_r2t)),
                ("ImmediateData".to_string(), yes_no(s.immediate_data)),
                ("MaxBurstLength".to_string(), s.max_burst_length.to_string()),
                (
                    "FirstBurstLength".to_string(),
                    s.first_burst_length.to_string(),
                ),
                (
                    "MaxOutstandingR2T".to_string(),
                    s.max_outstanding_r2t.to_string(),
                ),
                ("DataPDUInOrder".to_string(), "Yes".to_string()),
                ("DataSequenceInOrder".to_string(), "Yes".to_string()),
            ]);
        }
        v
    }

    /// Take in the target's answers and declarations.
    pub fn accept_response(&mut self, keys: &[(String, String)]) -> Result<(), NegotiationError> {
        let chap_keys: Pairs = keys
            .iter()
            .filter(|(k, _)| k.starts_with("CHAP_"))
            .cloned()
            .collect();
        if !chap_keys.is_empty() {
            let chap = self
                .chap
                .as_mut()
                .ok_or_else(|| NegotiationError::Invalid("CHAP_A".into()))?;
            let next = chap.on_keys(&chap_keys).map_err(NegotiationError::Chap)?;
            self.pending.extend(next);
        }
        let bad = |k: &str, v: &str| NegotiationError::BadAnswer {
            key: k.to_string(),
            value: v.to_string(),
        };
        for (key, value) in keys {
            let (key, value) = (key.as_str(), value.as_str());
            if matches!(value, "Reject" | "Irrelevant" | "NotUnderstood") {
                continue;
            }
            if key.starts_with("CHAP_") {
                continue;
            }
            let p = &mut self.params;
            match key {
                "AuthMethod" if value == "CHAP" && self.chap.is_some() => {
                    let chap = self.chap.as_mut().expect("checked");
                    self.pending.extend(chap.start());
                }
                "AuthMethod" if value != "None" => return Err(bad(key, value)),
                "HeaderDigest" => {
                    p.header_digest =
                        Digest::parse(value).ok_or_else(|| bad(key, value))? == Digest::Crc32c
                }
                "DataDigest" => {
                    p.data_digest =
                        Digest::parse(value).ok_or_else(|| bad(key, value))? == Digest::Crc32c
                }
                "MaxRecvDataSegmentLength" => {
                    let n = parse_num(value)
                        .filter(|n| (512..=u64::from(MAX24)).contains(n))
                        .ok_or_else(|| bad(key, value))?;
                    p.max_recv_data_segment_length = n as u32;
                }
                "TargetPortalGroupTag" => {
                    self.portal_group_tag = parse_num(value).map(|n| n as u16)
                }
                "TargetAlias" => self.target_alias = Some(value.to_string()),
                "InitialR2T" => p.initial_r2t = parse_bool(value).ok_or_else(|| bad(key, value))?,
                "ImmediateData" => {
                    p.immediate_data = parse_bool(value).ok_or_else(|| bad(key, value))?
                }
                "DataPDUInOrder" => {
                    p.data_pdu_in_order = parse_bool(value).ok_or_else(|| bad(key, value))?
                }
                "DataSequenceInOrder" => {
                    p.data_sequence_in_order = parse_bool(value).ok_or_else(|| bad(key, value))?
                }
                "MaxBurstLength" | "FirstBurstLength" | "MaxOutstandingR2T" | "MaxConnections"
                | "DefaultTime2Wait" | "DefaultTime2Retain" | "ErrorRecoveryLevel" => {
                    let n = parse_num(value).ok_or_else(|| bad(key, value))? as u32;
                    match key {
                        "MaxBurstLength" => p.max_burst_length = n,
                        "FirstBurstLength" => p.first_burst_length = n,
                        "MaxOutstandingR2T" => p.max_outstanding_r2t = n.max(1),
                        "MaxConnections" => p.max_connections = n,
                        "DefaultTime2Wait" => p.default_time2wait = n,
                        "DefaultTime2Retain" => p.default_time2retain = n,
                        _ => {
                            if n != 0 {
                                return Err(bad(key, value));
                            }
                        }
                    }
                }
                _ => {
                    // A key the target proposed that we did not: say so.
                    if key_def(key).is_none() {
                        self.pending.push((key.to_string(), "NotUnderstood".into()));
                    }
                }
            }
        }
        Ok(())
    }

    /// Answers owed to keys the target proposed (sent in the next request).
    pub fn pending_answers(&mut self) -> Pairs {
        std::mem::take(&mut self.pending)
    }

    /// The session's parameters as negotiated. In our naming the target's
    /// declaration is `max_recv_data_segment_length` (what the target
    /// receives) and ours is `max_send_data_segment_length`.
    pub fn finish(&self) -> SessionParams {
        let mut p = self.params.clone();
        p.first_burst_length = p.first_burst_length.min(p.max_burst_length);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pairs(v: &[(&str, &str)]) -> Pairs {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn get<'a>(p: &'a Pairs, k: &str) -> Option<&'a str> {
        p.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn target_answers_by_rule() {
        let mut n = TargetNegotiator::new(TargetSettings::default());
        let sec = n
            .security_keys(&pairs(&[
                ("InitiatorName", "iqn.1994-05.com.example:x"),
                ("SessionType", "Normal"),
                ("TargetName", "iqn.2026-11.org.ethersan:default"),
                ("AuthMethod", "CHAP,None"),
            ]))
            .unwrap();
        assert_eq!(get(&sec, "AuthMethod"), Some("None"));
        assert_eq!(get(&sec, "TargetPortalGroupTag"), Some("1"));
        assert!(n.can_transit(0, 1));
        let op = n
            .operational_keys(&pairs(&[
                ("HeaderDigest", "CRC32C,None"),
                ("DataDigest", "None"),
                ("MaxBurstLength", "0x800000"),
                ("FirstBurstLength", "131072"),
                ("InitialR2T", "Yes"),
                ("ImmediateData", "Yes"),
                ("MaxRecvDataSegmentLength", "65536"),
                ("MaxOutstandingR2T", "8"),
                ("ErrorRecoveryLevel", "2"),
                ("DefaultTime2Wait", "0"),
                ("X-com.example.Foo", "1"),
                ("Bogus", "1"),
                ("MaxConnections", "70000"),
                ("DataPDUInOrder", "Maybe"),
            ]))
            .unwrap();
        assert_eq!(get(&op, "HeaderDigest"), Some("CRC32C"));
        assert_eq!(get(&op, "DataDigest"), Some("None"));
        assert_eq!(get(&op, "MaxBurstLength"), Some("1048576"));
        assert_eq!(get(&op, "FirstBurstLength"), Some("65536"));
        assert_eq!(get(&op, "InitialR2T"), Some("Yes"));
        assert_eq!(get(&op, "ImmediateData"), Some("Yes"));
        assert_eq!(get(&op, "MaxOutstandingR2T"), Some("4"));
        assert_eq!(get(&op, "ErrorRecoveryLevel"), Some("0"));
        assert_eq!(get(&op, "DefaultTime2Wait"), Some("2"));
        assert_eq!(get(&op, "X-com.example.Foo"), Some("NotUnderstood"));
        assert_eq!(get(&op, "Bogus"), Some("NotUnderstood"));
        assert_eq!(get(&op, "MaxConnections"), Some("Reject"));
        assert_eq!(get(&op, "DataPDUInOrder"), Some("Reject"));
        assert_eq!(get(&op, "MaxRecvDataSegmentLength"), Some("262144"));
        let p = n.finish().unwrap();
        assert_eq!(p.max_send_data_segment_length, 65536);
        assert_eq!(p.max_recv_data_segment_length, 262144);
        assert!(p.initial_r2t);
        assert_eq!(p.first_burst_length, 65536);
    }

    #[test]
    fn header_digest_preference_follows_initiator_order() {
        let mut n = TargetNegotiator::new(TargetSettings::default());
        n.security_keys(&pairs(&[
            ("InitiatorName", "iqn.a:b"),
            ("SessionType", "Discovery"),
            ("AuthMethod", "None"),
        ]))
        .unwrap();
        let op = n
            .operational_keys(&pairs(&[
                ("HeaderDigest", "CRC32C,None"),
                ("MaxBurstLength", "4096"),
            ]))
            .unwrap();
        assert_eq!(get(&op, "HeaderDigest"), Some("CRC32C"));
        // Discovery sessions: session-wide data keys are irrelevant.
        assert_eq!(get(&op, "MaxBurstLength"), Some("Irrelevant"));
        assert!(n.finish().unwrap().is_discovery());
    }

    #[test]
    fn errors() {
        let mut n = TargetNegotiator::new(TargetSettings::default());
        assert_eq!(
            n.security_keys(&pairs(&[
                ("InitiatorName", "iqn.a:b"),
                ("InitiatorName", "iqn.a:c")
            ])),
            Err(NegotiationError::Duplicate("InitiatorName".into()))
        );
        let mut n = TargetNegotiator::new(TargetSettings::default());
        n.security_keys(&pairs(&[
            ("InitiatorName", "iqn.a:b"),
            ("AuthMethod", "None"),
        ]))
        .unwrap();
        assert_eq!(n.finish().unwrap_err().login_status(), (0x02, 0x07));
        let mut n = TargetNegotiator::new(TargetSettings::default());
        assert!(n
            .security_keys(&pairs(&[("TargetAddress", "1.2.3.4")]))
            .is_err());
        let mut n = TargetNegotiator::new(TargetSettings::default());
        let r = n.security_keys(&pairs(&[("AuthMethod", "CHAP")])).unwrap();
        assert_eq!(get(&r, "AuthMethod"), Some("Reject"));
        assert!(!n.can_transit(0, 1));
    }

    #[test]
    fn per_target_and_discovery_policies() {
        let chap = |u: &str, s: &str| AuthPolicy::Chap {
            initiator: crate::chap::Credentials::new(u, s.as_bytes()).unwrap(),
            target: None,
        };
        let settings = TargetSettings {
            auth: AuthPolicy::None,
            target_auth: vec![("iqn.2026-11.x:a".into(), chap("ua", "secret-of-a-123"))],
            discovery_auth: Some(chap("ud", "discovery-secret")),
            ..TargetSettings::default()
        };
        assert_eq!(
            settings.auth_for(false, Some("iqn.2026-11.x:a")),
            &chap("ua", "secret-of-a-123")
        );
        assert_eq!(
            settings.auth_for(false, Some("iqn.2026-11.x:b")),
            &AuthPolicy::None
        );
        assert_eq!(settings.auth_for(false, None), &AuthPolicy::None);
        assert_eq!(
            settings.auth_for(true, None),
            &chap("ud", "discovery-secret")
        );
        let old_style = TargetSettings {
            auth: chap("g", "global-secret-1"),
            auth_discovery: false,
            ..TargetSettings::default()
        };
        assert_eq!(old_style.auth_for(true, None), &AuthPolicy::None);
        assert_eq!(
            old_style.auth_for(false, Some("x")),
            &chap("g", "global-secret-1")
        );
        let nonce = (1, [7u8; crate::chap::CHALLENGE_LEN]);
        let new = || TargetNegotiator::new(settings.clone()).with_nonce(nonce.0, nonce.1);
        // TargetName after AuthMethod still decides the policy.
        let mut n = new();
        let a = n
            .security_keys(&pairs(&[
                ("InitiatorName", "iqn.x:i"),
                ("AuthMethod", "CHAP,None"),
                ("TargetName", "iqn.2026-11.x:a"),
            ]))
            .unwrap();
        assert_eq!(get(&a, "AuthMethod"), Some("CHAP"));
        let mut n = new();
        assert_eq!(
            n.security_keys(&pairs(&[
                ("AuthMethod", "None"),
                ("InitiatorName", "iqn.x:i"),
                ("TargetName", "iqn.2026-11.x:a"),
            ])),
            Err(NegotiationError::AuthFailed)
        );
        // Target b needs nothing.
        let mut n = new();
        let a = n
            .security_keys(&pairs(&[
                ("InitiatorName", "iqn.x:i"),
                ("AuthMethod", "CHAP,None"),
                ("TargetName", "iqn.2026-11.x:b"),
            ]))
            .unwrap();
        assert_eq!(get(&a, "AuthMethod"), Some("None"));
        n.operational_keys(&[]).unwrap();
        n.finish().unwrap();
        // Skipping the security stage does not skip a target's CHAP …
        let mut n = new();
        assert_eq!(
            n.operational_keys(&pairs(&[
                ("InitiatorName", "iqn.x:i"),
                ("MaxBurstLength", "65536"),
                ("TargetName", "iqn.2026-11.x:a"),
            ])),
            Err(NegotiationError::AuthFailed)
        );
        // … nor discovery's.
        let mut n = new();
        assert_eq!(
            n.operational_keys(&pairs(&[
                ("InitiatorName", "iqn.x:i"),
                ("SessionType", "Discovery"),
            ])),
            Err(NegotiationError::AuthFailed)
        );
        // Authenticated for nothing, then naming a CHAP target: refused.
        let mut n = new();
        let a = n
            .security_keys(&pairs(&[
                ("InitiatorName", "iqn.x:i"),
                ("AuthMethod", "None"),
            ]))
            .unwrap();
        assert_eq!(get(&a, "AuthMethod"), Some("None"));
        assert!(n
            .operational_keys(&pairs(&[("TargetName", "iqn.2026-11.x:a")]))
            .is_err());
        assert_eq!(n.finish(), Err(NegotiationError::AuthFailed));
    }

    #[test]
    fn initiator_and_target_agree() {
        let mut t = TargetNegotiator::new(TargetSettings::default());
        let mut i = InitiatorNegotiator::new(InitiatorSettings {
            target_name: Some("iqn.2026-11.org.ethersan:default".into()),
            header_digest: true,
            ..Default::default()
        });
        let a = t.security_keys(&i.security_proposal()).unwrap();
        i.accept_response(&a).unwrap();
        let b = t.operational_keys(&i.operational_proposal()).unwrap();
        i.accept_response(&b).unwrap();
        let tp = t.finish().unwrap();
        let ip = i.finish();
        assert!(tp.header_digest && ip.header_digest);
        assert_eq!(tp.max_burst_length, ip.max_burst_length);
        assert_eq!(tp.first_burst_length, ip.first_burst_length);
        assert_eq!(tp.immediate_data, ip.immediate_data);
        assert_eq!(tp.initial_r2t, ip.initial_r2t);
        assert_eq!(tp.max_outstanding_r2t, ip.max_outstanding_r2t);
        // Each side's receive limit is the other's send limit.
        assert_eq!(
            tp.max_recv_data_segment_length,
            ip.max_recv_data_segment_length
        );
        assert_eq!(
            tp.max_send_data_segment_length,
            ip.max_send_data_segment_length
        );
        assert_eq!(i.portal_group_tag, Some(1));
    }

    proptest! {
        #[test]
        fn negotiator_never_panics(keys in proptest::collection::vec(("[A-Za-z#.-]{1,20}", "[ -~]{0,20}"), 0..20)) {
            let mut n = TargetNegotiator::new(TargetSettings::default());
            let _ = n.security_keys(&keys);
            let _ = n.operational_keys(&keys);
            let _ = n.finish();
        }
    }
}
