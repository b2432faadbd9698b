//! The table of login and text keys and how each negotiates (RFC 7143
//! §6.2.1, §13), and the value parsers shared by both negotiators (§6.1).

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

pub(super) const fn k(
    name: &'static str,
    kind: KeyKind,
    range: (u32, u32),
    discovery: bool,
) -> KeyDef {
    KeyDef {
        name,
        kind,
        range,
        discovery,
        security_only: false,
        target_only: false,
    }
}

pub(super) const MAX24: u32 = (1 << 24) - 1;

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

pub(super) fn parse_num(v: &str) -> Option<u64> {
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

pub(super) fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

pub(super) fn yes_no(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_string()
}
