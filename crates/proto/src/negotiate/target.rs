//! The target side of login and text negotiation (RFC 7143 §6.2–6.6,
//! §13): what the target offers and [`TargetNegotiator`].

use std::collections::HashSet;

use super::*;
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

/// What the target offers and accepts.
#[derive(Debug, Clone)]
pub struct TargetSettings {
    /// The operational keys we declare and the largest values we accept.
    pub operational: OperationalParams,
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
            operational: OperationalParams::target_default(),
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

pub(super) type Pairs = Vec<(String, String)>;

impl TargetNegotiator {
    /// Start negotiating with these settings.
    pub fn new(settings: TargetSettings) -> Self {
        let params = SessionParams {
            max_recv_data_segment_length: settings.operational.max_recv_data_segment_length,
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
                self.settings
                    .operational
                    .max_recv_data_segment_length
                    .to_string(),
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
                    &s.operational.header_digests
                } else {
                    &s.operational.data_digests
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
                        "InitialR2T" => s.operational.initial_r2t,
                        "ImmediateData" => s.operational.immediate_data,
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
                        "MaxBurstLength" => s.operational.max_burst_length,
                        "FirstBurstLength" => s.operational.first_burst_length,
                        "DefaultTime2Wait" => s.default_time2wait,
                        "DefaultTime2Retain" => s.default_time2retain,
                        "MaxOutstandingR2T" => s.operational.max_outstanding_r2t,
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
