//! SPC-4 §5.16 asymmetric logical unit access (ALUA): the target port
//! groups of a logical unit, their access states, REPORT TARGET PORT
//! GROUPS (§6.27) and SET TARGET PORT GROUPS (§6.37) data, and which
//! commands each state serves.
//!
//! Every gateway that exports a unit is one target port group with one
//! relative target port (its [`Alua`] configuration). With a shared store
//! the groups of every gateway live in the shared blob `"alua"`
//! (a small line-based text format, see `encode_groups`); a local store
//! has only its own.
//!
//! Policy of SET TARGET PORT GROUPS (explicit ALUA): a group may be set to
//! active/optimized, active/non-optimized or standby. Setting a group to
//! active/optimized makes every other active/optimized group
//! active/non-optimized, so that at most one group is optimized (standby
//! groups stay standby: an administrator put them there).

use std::fmt;
use std::str::FromStr;

use crate::commands::{CommandDef, ServedIn};
use crate::sense::{codes, Sense};

/// An asymmetric access state (SPC-4 §5.16.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum AluaState {
    /// Active/optimized: every command, best performance.
    #[default]
    ActiveOptimized,
    /// Active/non-optimized: every command, possibly slower.
    ActiveNonOptimized,
    /// Standby: only the management commands (NOT READY 04h/0Bh else).
    Standby,
    /// Unavailable: only INQUIRY and the like (NOT READY 04h/0Ch else).
    Unavailable,
}

/// The text is not one of the four access state names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown ALUA state {0:?}: expected active-optimized, active-non-optimized, standby or unavailable"
)]
pub struct ParseAluaStateError(pub String);

impl AluaState {
    /// The ASYMMETRIC ACCESS STATE code (SPC-4 Table 166).
    pub fn code(self) -> u8 {
        match self {
            AluaState::ActiveOptimized => 0x0,
            AluaState::ActiveNonOptimized => 0x1,
            AluaState::Standby => 0x2,
            AluaState::Unavailable => 0x3,
        }
    }

    /// The state with this code; `None` for the codes this unit has no
    /// such state for (offline, logical block dependent, transitioning).
    pub fn from_code(code: u8) -> Option<AluaState> {
        match code {
            0x0 => Some(AluaState::ActiveOptimized),
            0x1 => Some(AluaState::ActiveNonOptimized),
            0x2 => Some(AluaState::Standby),
            0x3 => Some(AluaState::Unavailable),
            _ => None,
        }
    }

    /// The sense a command gets in this state, `None` if it may run
    /// (SPC-4 §5.16.2.4.4 and §5.16.2.4.5): its row's
    /// [`Rules::alua`](crate::commands::Rules::alua) says which states
    /// serve it.
    pub(crate) fn refusal(self, def: &CommandDef) -> Option<Sense> {
        match (self, def.rules.alua) {
            (AluaState::ActiveOptimized | AluaState::ActiveNonOptimized, _) => None,
            (AluaState::Standby, ServedIn::ActiveOnly) => Some(codes::ALUA_STANDBY),
            (AluaState::Standby, _) => None,
            (AluaState::Unavailable, ServedIn::EveryState) => None,
            (AluaState::Unavailable, _) => Some(codes::ALUA_UNAVAILABLE),
        }
    }
}

impl fmt::Display for AluaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AluaState::ActiveOptimized => "active-optimized",
            AluaState::ActiveNonOptimized => "active-non-optimized",
            AluaState::Standby => "standby",
            AluaState::Unavailable => "unavailable",
        })
    }
}

impl FromStr for AluaState {
    type Err = ParseAluaStateError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "active-optimized" => Ok(AluaState::ActiveOptimized),
            "active-non-optimized" => Ok(AluaState::ActiveNonOptimized),
            "standby" => Ok(AluaState::Standby),
            "unavailable" => Ok(AluaState::Unavailable),
            _ => Err(ParseAluaStateError(s.to_string())),
        }
    }
}

/// This gateway's place in ALUA: its target port group, its relative
/// target port, and the access state it starts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alua {
    /// Target port group identifier (VPD 0x83 type 5); default 1.
    pub group: u16,
    /// Relative target port identifier (VPD 0x83 type 4); default 1.
    /// Gateways that share a store need distinct ones: with the initiator
    /// port they make the I_T nexus of persistent reservations.
    pub rel_port: u16,
    /// Initial access state of the group; default active/optimized.
    pub state: AluaState,
    /// The PREF bit of the group in REPORT TARGET PORT GROUPS.
    pub preferred: bool,
}

impl Default for Alua {
    fn default() -> Self {
        Alua {
            group: 1,
            rel_port: 1,
            state: AluaState::ActiveOptimized,
            preferred: false,
        }
    }
}

/// STATUS CODE of a target port group descriptor: no status.
const STATUS_NONE: u8 = 0;
/// STATUS CODE: altered by SET TARGET PORT GROUPS.
const STATUS_BY_STPG: u8 = 1;

/// One target port group as REPORT TARGET PORT GROUPS lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPortGroup {
    /// Target port group identifier.
    pub id: u16,
    /// Its asymmetric access state.
    pub state: AluaState,
    /// PREF: the preferred group.
    pub preferred: bool,
    /// STATUS CODE (0: none, 1: altered by SET TARGET PORT GROUPS).
    pub status: u8,
    /// Relative target port identifiers in the group, ascending.
    pub ports: Vec<u16>,
}

/// Add or update this gateway's group and port in `groups` (the state
/// and PREF bit come from `alua`). Returns whether anything changed.
pub(crate) fn upsert(groups: &mut Vec<TargetPortGroup>, alua: &Alua) -> bool {
    let before = groups.clone();
    // The port belongs to one group only.
    for g in groups.iter_mut().filter(|g| g.id != alua.group) {
        g.ports.retain(|p| *p != alua.rel_port);
    }
    groups.retain(|g| !g.ports.is_empty() || g.id == alua.group);
    match groups.iter_mut().find(|g| g.id == alua.group) {
        Some(g) => {
            g.state = alua.state;
            g.preferred = alua.preferred;
            if !g.ports.contains(&alua.rel_port) {
                g.ports.push(alua.rel_port);
                g.ports.sort_unstable();
            }
        }
        None => groups.push(TargetPortGroup {
            id: alua.group,
            state: alua.state,
            preferred: alua.preferred,
            status: STATUS_NONE,
            ports: vec![alua.rel_port],
        }),
    }
    groups.sort_by_key(|g| g.id);
    *groups != before
}

/// REPORT TARGET PORT GROUPS parameter data (SPC-4 §6.27.2) for
/// PARAMETER DATA FORMAT 000b (length only) or 001b (`extended`: with
/// the format type and implicit transition time), before the allocation
/// length is applied.
pub(crate) fn report(groups: &[TargetPortGroup], extended: bool) -> Vec<u8> {
    let mut out = vec![0u8; if extended { 8 } else { 4 }];
    if extended {
        out[4] = 0x10; // FORMAT TYPE 001b
        out[5] = 0; // IMPLICIT TRANSITION TIME: none needed
    }
    for g in groups {
        out.push(u8::from(g.preferred) << 7 | g.state.code());
        // T_SUP 0, O_SUP 0, LBD_SUP 0, U_SUP, S_SUP, AN_SUP, AO_SUP.
        out.push(0x0f);
        out.extend_from_slice(&g.id.to_be_bytes());
        out.push(0);
        out.push(g.status);
        out.push(0);
        let ports = &g.ports[..g.ports.len().min(255)];
        out.push(ports.len() as u8);
        for p in ports {
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(&p.to_be_bytes());
        }
    }
    let len = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&len.to_be_bytes());
    out
}

/// The descriptors of a SET TARGET PORT GROUPS parameter list (SPC-4
/// §6.37): (group, state) in order. A list that is not a 4-byte header
/// and whole 4-byte descriptors is PARAMETER LIST LENGTH ERROR; a state
/// other than active/optimized, active/non-optimized or standby is
/// INVALID FIELD IN PARAMETER LIST at its byte.
pub(crate) fn parse_set(param: &[u8]) -> Result<Vec<(u16, AluaState)>, Sense> {
    if param.is_empty() {
        return Ok(Vec::new());
    }
    if param.len() < 4 || !param.len().is_multiple_of(4) {
        return Err(codes::PARAM_LIST_LENGTH);
    }
    let mut out = Vec::new();
    for (i, d) in param[4..].chunks_exact(4).enumerate() {
        let at = 4 + 4 * i;
        let state = match AluaState::from_code(d[0] & 0x0f) {
            Some(
                s @ (AluaState::ActiveOptimized
                | AluaState::ActiveNonOptimized
                | AluaState::Standby),
            ) => s,
            _ => return Err(Sense::invalid_param_field(at as u16)),
        };
        out.push((u16::from_be_bytes([d[2], d[3]]), state));
    }
    Ok(out)
}

/// Apply SET TARGET PORT GROUPS `changes` to `groups` with the policy of
/// the module documentation. An unknown group is INVALID FIELD IN
/// PARAMETER LIST (at its descriptor) and changes nothing. Returns
/// whether any state changed.
pub(crate) fn apply_set(
    groups: &mut [TargetPortGroup],
    changes: &[(u16, AluaState)],
) -> Result<bool, Sense> {
    for (i, (id, _)) in changes.iter().enumerate() {
        if !groups.iter().any(|g| g.id == *id) {
            return Err(Sense::invalid_param_field((4 + 4 * i + 2) as u16));
        }
    }
    let mut changed = false;
    for (id, state) in changes {
        for g in groups.iter_mut() {
            let new = if g.id == *id {
                *state
            } else if *state == AluaState::ActiveOptimized && g.state == AluaState::ActiveOptimized
            {
                AluaState::ActiveNonOptimized
            } else {
                continue;
            };
            if g.state != new {
                g.state = new;
                changed = true;
            }
            g.status = STATUS_BY_STPG;
        }
    }
    Ok(changed)
}

/// A shared blob that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BlobError {
    /// The first line is not the expected header.
    #[error("not an {0} blob (bad header)")]
    Header(&'static str),
    /// A line of a known kind has fields that do not parse.
    #[error("line {0}: unreadable {1:?}")]
    Line(usize, String),
}

/// The `"alua"` blob: a header line `ethersan-alua 1`, then one line per
/// group, `group <id> <state> <pref 0|1> <status> <port>,<port>...`.
/// Readers skip lines of kinds they do not know, so later versions can
/// add them.
pub(crate) fn encode_groups(groups: &[TargetPortGroup]) -> Vec<u8> {
    let mut s = String::from("ethersan-alua 1\n");
    for g in groups {
        let ports: Vec<String> = g.ports.iter().map(u16::to_string).collect();
        s.push_str(&format!(
            "group {} {} {} {} {}\n",
            g.id,
            g.state,
            u8::from(g.preferred),
            g.status,
            ports.join(",")
        ));
    }
    s.into_bytes()
}

/// Read an `"alua"` blob ([`encode_groups`]); empty: no groups yet.
pub(crate) fn decode_groups(data: &[u8]) -> Result<Vec<TargetPortGroup>, BlobError> {
    if data.is_empty() {
        return Ok(Vec::new());
    }
    let text = std::str::from_utf8(data).map_err(|_| BlobError::Header("alua"))?;
    let mut lines = text.lines();
    match lines
        .next()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
    {
        Some(h) if h.len() == 2 && h[0] == "ethersan-alua" && h[1].parse::<u32>().is_ok() => {}
        _ => return Err(BlobError::Header("alua")),
    }
    let mut groups = Vec::new();
    for (i, line) in lines.enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first() != Some(&"group") {
            continue;
        }
        let bad = || BlobError::Line(i + 2, line.to_string());
        let [_, id, state, pref, status, ports] = f.as_slice() else {
            return Err(bad());
        };
        let ports: Result<Vec<u16>, _> = ports.split(',').map(str::parse).collect();
        groups.push(TargetPortGroup {
            id: id.parse().map_err(|_| bad())?,
            state: state.parse().map_err(|_| bad())?,
            preferred: *pref == "1",
            status: status.parse().map_err(|_| bad())?,
            ports: ports.map_err(|_| bad())?,
        });
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::key;

    fn two() -> Vec<TargetPortGroup> {
        let mut g = Vec::new();
        upsert(&mut g, &Alua::default());
        upsert(
            &mut g,
            &Alua {
                group: 2,
                rel_port: 2,
                state: AluaState::Standby,
                preferred: true,
            },
        );
        g
    }

    #[test]
    fn state_names_round_trip_and_others_are_refused() {
        for s in [
            AluaState::ActiveOptimized,
            AluaState::ActiveNonOptimized,
            AluaState::Standby,
            AluaState::Unavailable,
        ] {
            assert_eq!(s.to_string().parse::<AluaState>(), Ok(s));
            assert_eq!(AluaState::from_code(s.code()), Some(s));
        }
        let e = "optimized".parse::<AluaState>().unwrap_err();
        assert!(e.to_string().contains("active-non-optimized"), "{e}");
        assert_eq!(AluaState::from_code(0xf), None);
    }

    #[test]
    fn report_formats() {
        let g = two();
        let short = report(&g, false);
        assert_eq!(short.len(), 4 + 2 * 12);
        assert_eq!(u32::from_be_bytes(short[..4].try_into().unwrap()), 24);
        assert_eq!(&short[4..16], &[0x00, 0x0f, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]);
        assert_eq!(&short[16..28], &[0x82, 0x0f, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2]);
        let long = report(&g, true);
        assert_eq!(long.len(), 8 + 24);
        assert_eq!(u32::from_be_bytes(long[..4].try_into().unwrap()), 28);
        assert_eq!(long[4], 0x10);
        assert_eq!(&long[8..], &short[4..]);
    }

    #[test]
    fn set_parses_and_applies_one_optimized_group() {
        let mut g = two();
        let list = [0, 0, 0, 0, 0x00, 0, 0, 2];
        let changes = parse_set(&list).unwrap();
        assert_eq!(changes, vec![(2, AluaState::ActiveOptimized)]);
        assert!(apply_set(&mut g, &changes).unwrap());
        assert_eq!(g[0].state, AluaState::ActiveNonOptimized);
        assert_eq!(g[1].state, AluaState::ActiveOptimized);
        assert_eq!((g[0].status, g[1].status), (1, 1));
        // Unknown group, bad states, ragged lists.
        let e = apply_set(&mut g, &[(9, AluaState::Standby)]).unwrap_err();
        assert_eq!((e.key, e.asc, e.ascq), (key::ILLEGAL_REQUEST, 0x26, 0));
        for bad in [3u8, 0x0e, 0x0f, 0x04] {
            let e = parse_set(&[0, 0, 0, 0, bad, 0, 0, 1]).unwrap_err();
            assert_eq!((e.key, e.asc), (key::ILLEGAL_REQUEST, 0x26));
        }
        assert_eq!(
            parse_set(&[0, 0, 0, 0, 0, 0]),
            Err(codes::PARAM_LIST_LENGTH)
        );
        assert_eq!(parse_set(&[]), Ok(Vec::new()));
    }

    #[test]
    fn blob_round_trip_and_corruption() {
        let g = two();
        assert_eq!(decode_groups(&encode_groups(&g)).unwrap(), g);
        let mut future = encode_groups(&g);
        future.extend_from_slice(b"weight 1 7\n");
        assert_eq!(decode_groups(&future).unwrap(), g, "unknown lines skipped");
        assert!(decode_groups(b"garbage").is_err());
        assert!(decode_groups(b"ethersan-alua 1\ngroup x standby 0 0 1\n").is_err());
        assert!(decode_groups(b"ethersan-alua 1\ngroup 1 sleepy 0 0 1\n").is_err());
        assert!(decode_groups(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn states_serve_what_spc4_lists() {
        let row = |cdb: &[u8]| crate::commands::lookup(cdb).expect("a row of the table");
        assert_eq!(
            AluaState::Standby.refusal(row(&[0x28])),
            Some(codes::ALUA_STANDBY)
        );
        assert_eq!(
            AluaState::Standby.refusal(row(&[0x00])),
            Some(codes::ALUA_STANDBY)
        );
        assert_eq!(AluaState::Standby.refusal(row(&[0x5e, 0x00])), None);
        assert_eq!(AluaState::Standby.refusal(row(&[0xa3, 0x0a])), None);
        assert_eq!(
            AluaState::Unavailable.refusal(row(&[0x5e, 0x00])),
            Some(codes::ALUA_UNAVAILABLE)
        );
        assert_eq!(AluaState::Unavailable.refusal(row(&[0x12])), None);
        assert_eq!(AluaState::ActiveNonOptimized.refusal(row(&[0x2a])), None);
    }
}
