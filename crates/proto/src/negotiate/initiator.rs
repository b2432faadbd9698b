//! The initiator side of login negotiation (RFC 7143 §6.2–6.6, §13):
//! [`InitiatorSettings`] and [`InitiatorNegotiator`].

use super::*;

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
    /// The operational keys to offer (digests in preference order).
    pub operational: OperationalParams,
}

impl Default for InitiatorSettings {
    fn default() -> Self {
        InitiatorSettings {
            initiator_name: "iqn.2026-11.org.ethersan:client".into(),
            initiator_alias: None,
            target_name: None,
            session_type: SessionType::Normal,
            operational: OperationalParams::initiator_default(),
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

impl InitiatorNegotiator {
    /// Start with these settings.
    pub fn new(settings: InitiatorSettings) -> Self {
        let params = SessionParams {
            session_type: settings.session_type,
            initiator_name: settings.initiator_name.clone(),
            initiator_alias: settings.initiator_alias.clone(),
            target_name: settings.target_name.clone(),
            max_recv_data_segment_length: 8192,
            max_send_data_segment_length: settings.operational.max_recv_data_segment_length,
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
        let s = &self.settings.operational;
        let mut v = vec![
            (
                "HeaderDigest".to_string(),
                Digest::list_value(&s.header_digests),
            ),
            (
                "DataDigest".to_string(),
                Digest::list_value(&s.data_digests),
            ),
            ("DefaultTime2Wait".to_string(), "0".to_string()),
            ("DefaultTime2Retain".to_string(), "0".to_string()),
            ("ErrorRecoveryLevel".to_string(), "0".to_string()),
            (
                "MaxRecvDataSegmentLength".to_string(),
                s.max_recv_data_segment_length.to_string(),
            ),
        ];
        if self.settings.session_type == SessionType::Normal {
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
