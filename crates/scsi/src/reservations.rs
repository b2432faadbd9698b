//! SPC-4 §5.9 reservations: RESERVE/RELEASE (6/10) and persistent
//! reservations (PERSISTENT RESERVE IN/OUT), with APTPL state saved
//! atomically (write, fsync, rename) and restored at start.
//!
//! A registration belongs to an I_T nexus ([`ItNexus`]): the initiator
//! port (the transport's [`Nexus`]) and the relative target port (the
//! gateway). REGISTER with ALL_TG_PT registers the initiator port through
//! every target port. With a store shared by several gateways the
//! persistent part of the state (registrations, the reservation, APTPL,
//! the generation and a bounded log of the unit attentions owed to
//! I_T nexuses, [`Notice`]) travels as the shared blob `"pr"`
//! ([`Reservations::encode`], [`Reservations::decode_shared`]); RESERVE(6/10)
//! reservations and initiator names stay with each gateway.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::alua::BlobError;
use crate::be::be64;
use crate::commands::Access;
use crate::sense::{codes, key, Sense};
use crate::Nexus;

/// An I_T nexus: an initiator port through one relative target port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ItNexus {
    /// The initiator port (as the transport identifies it).
    pub(crate) nexus: Nexus,
    /// Relative target port identifier.
    pub(crate) port: u16,
}

/// One registration.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Registration {
    key: u64,
    /// Registered through every target port (ALL_TG_PT).
    all_ports: bool,
    /// Initiator port name, for READ FULL STATUS.
    name: String,
}

/// A unit attention a reservation change owes an I_T nexus, kept in the
/// shared blob's log until every gateway had the chance to raise it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Notice {
    /// Position in the log (0 until logged).
    pub(crate) seq: u64,
    /// Whom it is for.
    pub(crate) it: ItNexus,
    /// For the initiator port through every target port (an ALL_TG_PT
    /// registration).
    pub(crate) all_ports: bool,
    /// The unit attention.
    pub(crate) sense: Sense,
    /// A PREEMPT AND ABORT victim: its tasks are aborted too.
    pub(crate) abort: bool,
    /// An event of the whole unit (a LOGICAL UNIT RESET through the
    /// gateway at `it.port`): for every I_T nexus of every other gateway.
    pub(crate) to_all: bool,
}

impl Notice {
    /// Whether the notice is for an I_T nexus through target port `port`.
    pub(crate) fn for_port(&self, port: u16) -> bool {
        if self.to_all {
            return self.it.port != port;
        }
        self.all_ports || self.it.port == port
    }

    /// A unit attention for every I_T nexus of the gateways other than
    /// the one at `origin`.
    pub(crate) fn to_all(origin: u16, sense: Sense) -> Notice {
        Notice {
            seq: 0,
            it: ItNexus {
                nexus: Nexus(0),
                port: origin,
            },
            all_ports: false,
            sense,
            abort: false,
            to_all: true,
        }
    }
}

/// Most notices the shared log keeps (the oldest go first).
const NOTICE_LOG: usize = 256;

/// Persistent reservation types (SPC-4 Table 190).
pub(crate) mod pr_type {
    pub(crate) const WRITE_EXCLUSIVE: u8 = 1;
    pub(crate) const EXCLUSIVE_ACCESS: u8 = 3;
    pub(crate) const WE_REGISTRANTS_ONLY: u8 = 5;
    pub(crate) const EA_REGISTRANTS_ONLY: u8 = 6;
    pub(crate) const WE_ALL_REGISTRANTS: u8 = 7;
    pub(crate) const EA_ALL_REGISTRANTS: u8 = 8;
}

/// Outcome of a reservation command or check.
pub(crate) enum PrError {
    /// RESERVATION CONFLICT status.
    Conflict,
    /// CHECK CONDITION with this sense.
    Sense(Sense),
}

impl From<Sense> for PrError {
    fn from(s: Sense) -> Self {
        PrError::Sense(s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holder {
    /// The registration that holds it.
    it: ItNexus,
    kind: u8,
}

/// The reservation state of one logical unit, as one gateway sees it.
#[derive(Debug, Default, Clone)]
pub(crate) struct Reservations {
    /// Version of the shared blob this state came from (0: none).
    pub(crate) version: u64,
    /// Last notice of the shared log this gateway has raised.
    pub(crate) seen: u64,
    /// This gateway's relative target port.
    port: u16,
    /// RESERVE(6/10) holder (local to the gateway).
    legacy: Option<Nexus>,
    generation: u32,
    /// Registrations by I_T nexus (the one that registered).
    keys: BTreeMap<ItNexus, Registration>,
    /// Initiator port names by nexus (local), copied into registrations.
    names: HashMap<Nexus, String>,
    holder: Option<Holder>,
    aptpl: bool,
    state_file: Option<PathBuf>,
    /// Shared log of notices, and the next sequence number.
    log: VecDeque<Notice>,
    next_seq: u64,
}

fn all_registrants(kind: u8) -> bool {
    kind == pr_type::WE_ALL_REGISTRANTS || kind == pr_type::EA_ALL_REGISTRANTS
}

fn registrants_only(kind: u8) -> bool {
    kind == pr_type::WE_REGISTRANTS_ONLY || kind == pr_type::EA_REGISTRANTS_ONLY
}

fn exclusive_access(kind: u8) -> bool {
    matches!(
        kind,
        pr_type::EXCLUSIVE_ACCESS | pr_type::EA_REGISTRANTS_ONLY | pr_type::EA_ALL_REGISTRANTS
    )
}

fn valid_type(kind: u8) -> bool {
    use pr_type::*;
    matches!(
        kind,
        WRITE_EXCLUSIVE
            | EXCLUSIVE_ACCESS
            | WE_REGISTRANTS_ONLY
            | EA_REGISTRANTS_ONLY
            | WE_ALL_REGISTRANTS
            | EA_ALL_REGISTRANTS
    )
}

/// Unit attentions a reservation change owes I_T nexuses.
pub(crate) type Notices = Vec<Notice>;

impl Reservations {
    /// State kept in `state_file` (APTPL), loaded if present, for the
    /// gateway at relative target port `port`.
    pub(crate) fn with_state_file(path: Option<PathBuf>, port: u16) -> Self {
        let mut r = Reservations {
            state_file: path,
            port,
            ..Default::default()
        };
        if let Some(p) = r.state_file.clone() {
            r.load(&p);
        }
        r
    }

    /// The registration that covers I_T nexus (`n`, this gateway's port):
    /// its own, or an ALL_TG_PT one of the same initiator port.
    fn covering(&self, n: Nexus) -> Option<ItNexus> {
        let own = ItNexus {
            nexus: n,
            port: self.port,
        };
        if self.keys.contains_key(&own) {
            return Some(own);
        }
        self.keys
            .iter()
            .find(|(it, r)| it.nexus == n && r.all_ports)
            .map(|(it, _)| *it)
    }

    fn key_of(&self, n: Nexus) -> Option<u64> {
        self.covering(n).map(|it| self.keys[&it].key)
    }

    fn notice(&self, it: ItNexus, sense: Sense) -> Notice {
        Notice {
            seq: 0,
            it,
            all_ports: self.keys.get(&it).is_some_and(|r| r.all_ports),
            sense,
            abort: false,
            to_all: false,
        }
    }

    /// Append `notices` to the shared log, numbering them.
    pub(crate) fn log_notices(&mut self, notices: &mut [Notice]) {
        for n in notices.iter_mut() {
            self.next_seq += 1;
            n.seq = self.next_seq;
            self.log.push_back(*n);
        }
        // Never trim this change's own notices (a CLEAR or PREEMPT of more
        // than NOTICE_LOG registrants): the other gateways must see them.
        let keep = NOTICE_LOG.max(notices.len());
        while self.log.len() > keep {
            self.log.pop_front();
        }
    }

    /// The logged notices after sequence `seen`.
    pub(crate) fn notices_after(&self, seen: u64) -> impl Iterator<Item = &Notice> {
        self.log.iter().filter(move |n| n.seq > seen)
    }

    /// The last sequence number given to a notice.
    pub(crate) fn last_seq(&self) -> u64 {
        self.next_seq
    }

    /// The shared blob `"pr"`: a header line `ethersan-pr 1`, then lines
    /// `generation <n>`, `aptpl <0|1>`, `seq <last notice>`,
    /// `reg <nexus hex> <port> <all_tg_pt 0|1> <key hex> <name|->`,
    /// `holder <nexus hex> <port> <type>`,
    /// `notice <seq> <nexus hex> <port> <all 0|1> <key> <asc> <ascq> <abort 0|1>`
    /// and `event <seq> <origin port> <key> <asc> <ascq>` (a unit
    /// attention for every nexus of the other gateways).
    /// Readers skip line kinds they do not know (forward compatible).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut t = format!(
            "ethersan-pr 1\ngeneration {}\naptpl {}\nseq {}\n",
            self.generation,
            u8::from(self.aptpl),
            self.next_seq
        );
        for (it, r) in &self.keys {
            let name = if r.name.is_empty() || r.name.contains(char::is_whitespace) {
                "-"
            } else {
                &r.name
            };
            t.push_str(&format!(
                "reg {:x} {} {} {:x} {}\n",
                it.nexus.0,
                it.port,
                u8::from(r.all_ports),
                r.key,
                name
            ));
        }
        if let Some(h) = self.holder {
            t.push_str(&format!(
                "holder {:x} {} {}\n",
                h.it.nexus.0, h.it.port, h.kind
            ));
        }
        for n in &self.log {
            if n.to_all {
                t.push_str(&format!(
                    "event {} {} {} {} {}\n",
                    n.seq, n.it.port, n.sense.key, n.sense.asc, n.sense.ascq
                ));
                continue;
            }
            t.push_str(&format!(
                "notice {} {:x} {} {} {} {} {} {}\n",
                n.seq,
                n.it.nexus.0,
                n.it.port,
                u8::from(n.all_ports),
                n.sense.key,
                n.sense.asc,
                n.sense.ascq,
                u8::from(n.abort)
            ));
        }
        t.into_bytes()
    }

    /// Replace the shared part of the state with the blob `data`
    /// ([`encode`](Self::encode); empty: nothing registered). On error
    /// nothing changes.
    pub(crate) fn decode_shared(&mut self, data: &[u8]) -> Result<(), BlobError> {
        let mut fresh = Reservations::default();
        if !data.is_empty() {
            let text = std::str::from_utf8(data).map_err(|_| BlobError::Header("pr"))?;
            let mut lines = text.lines();
            match lines
                .next()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
            {
                Some(h) if h.len() == 2 && h[0] == "ethersan-pr" && h[1].parse::<u32>().is_ok() => {
                }
                _ => return Err(BlobError::Header("pr")),
            }
            for (i, line) in lines.enumerate() {
                parse_line(&mut fresh, line).ok_or_else(|| BlobError::Line(i + 2, line.into()))?;
            }
        }
        self.generation = fresh.generation;
        self.aptpl = fresh.aptpl;
        self.next_seq = fresh.next_seq;
        self.keys = fresh.keys;
        self.holder = fresh.holder;
        self.log = fresh.log;
        Ok(())
    }

    /// Whether any reservation exists (the fast path skips checks when not).
    pub(crate) fn active(&self) -> bool {
        self.legacy.is_some() || self.holder.is_some()
    }

    /// Remember the initiator port name of a nexus.
    pub(crate) fn set_name(&mut self, nexus: Nexus, name: &str) {
        self.names.insert(nexus, name.to_string());
    }

    fn is_holder(&self, n: Nexus) -> bool {
        match self.holder {
            Some(h) if all_registrants(h.kind) => self.covering(n).is_some(),
            Some(h) => self.covering(n) == Some(h.it),
            None => false,
        }
    }

    /// May `n` run a command with this access?
    pub(crate) fn check(&self, n: Nexus, access: Access) -> Result<(), PrError> {
        if access == Access::Free {
            return Ok(());
        }
        if let Some(h) = self.legacy {
            if h != n {
                return Err(PrError::Conflict);
            }
        }
        let Some(h) = self.holder else { return Ok(()) };
        if self.is_holder(n) {
            return Ok(());
        }
        let registered = self.covering(n).is_some();
        if (registrants_only(h.kind) || all_registrants(h.kind)) && registered {
            return Ok(());
        }
        if access == Access::Read && !exclusive_access(h.kind) {
            return Ok(());
        }
        Err(PrError::Conflict)
    }

    /// RESERVE (6/10).
    pub(crate) fn reserve_legacy(&mut self, n: Nexus) -> Result<(), PrError> {
        if self.holder.is_some() || !self.keys.is_empty() && self.covering(n).is_none() {
            return Err(PrError::Conflict);
        }
        match self.legacy {
            Some(h) if h != n => Err(PrError::Conflict),
            _ => {
                self.legacy = Some(n);
                Ok(())
            }
        }
    }

    /// RELEASE (6/10): a no-op for anyone but the holder.
    pub(crate) fn release_legacy(&mut self, n: Nexus) -> Result<(), PrError> {
        if let Some(h) = self.holder {
            if !self.is_holder(n) && h.kind != 0 {
                return Err(PrError::Conflict);
            }
        }
        if self.legacy == Some(n) {
            self.legacy = None;
        }
        Ok(())
    }

    /// The nexus went away, or a reset happened: a RESERVE(6/10)
    /// reservation does not survive either (SPC-2 §5.5.1).
    pub(crate) fn drop_legacy(&mut self, n: Option<Nexus>) {
        if n.is_none() || self.legacy == n {
            self.legacy = None;
        }
    }

    /// PERSISTENT RESERVE IN.
    pub(crate) fn pr_in(&self, action: u8) -> Result<Vec<u8>, Sense> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.generation.to_be_bytes());
        match action {
            0 => {
                let mut keys: Vec<u64> = self.keys.values().map(|r| r.key).collect();
                keys.sort_unstable();
                out.extend_from_slice(&((keys.len() * 8) as u32).to_be_bytes());
                for k in keys {
                    out.extend_from_slice(&k.to_be_bytes());
                }
            }
            1 => match self.holder {
                Some(h) => {
                    out.extend_from_slice(&16u32.to_be_bytes());
                    let key = if all_registrants(h.kind) {
                        0
                    } else {
                        self.keys.get(&h.it).map_or(0, |r| r.key)
                    };
                    out.extend_from_slice(&key.to_be_bytes());
                    out.extend_from_slice(&[0, 0, 0, 0, 0, h.kind & 0x0f, 0, 0]);
                }
                None => out.extend_from_slice(&0u32.to_be_bytes()),
            },
            2 => {
                // REPORT CAPABILITIES: CRH, ATP_C, PTPL_C; TMV with every
                // type; PTPL_A as set.
                out.clear();
                out.extend_from_slice(&8u16.to_be_bytes());
                out.push(0x10 | 0x04 | 0x01);
                out.push(0x80 | u8::from(self.aptpl));
                out.push(0x80 | 0x40 | 0x20 | 0x08 | 0x02);
                out.push(0x01);
                out.extend_from_slice(&[0, 0]);
            }
            3 => {
                let mut descs = Vec::new();
                for (it, r) in &self.keys {
                    let holder = match self.holder {
                        Some(h) => all_registrants(h.kind) || h.it == *it,
                        None => false,
                    };
                    let kind = if holder {
                        self.holder.map(|h| h.kind).unwrap_or(0)
                    } else {
                        0
                    };
                    descs.extend_from_slice(&r.key.to_be_bytes());
                    descs.extend_from_slice(&[0; 4]);
                    // ALL_TG_PT, R_HOLDER.
                    descs.push(u8::from(r.all_ports) << 1 | u8::from(holder));
                    descs.push(kind & 0x0f);
                    descs.extend_from_slice(&[0; 4]);
                    // The relative target port of the I_T nexus (with
                    // ALL_TG_PT: the one it registered through).
                    descs.extend_from_slice(&it.port.to_be_bytes());
                    // iSCSI TransportID (format 00b): the initiator name.
                    let mut name = r.name.clone().into_bytes();
                    name.push(0);
                    while name.len() % 4 != 0 {
                        name.push(0);
                    }
                    let mut tid = vec![0x05, 0];
                    tid.extend_from_slice(&(name.len() as u16).to_be_bytes());
                    tid.extend(name);
                    descs.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                    descs.extend(tid);
                }
                out.extend_from_slice(&(descs.len() as u32).to_be_bytes());
                out.extend(descs);
            }
            _ => return Err(Sense::invalid_cdb_field(1, Some(4))),
        }
        Ok(out)
    }

    /// PERSISTENT RESERVE OUT. Returns the unit attentions to queue.
    pub(crate) fn pr_out(
        &mut self,
        n: Nexus,
        action: u8,
        scope_type: u8,
        param: &[u8],
    ) -> Result<Notices, PrError> {
        if param.len() < 24 {
            return Err(codes::PARAM_LIST_LENGTH.into());
        }
        let rkey = be64(&param[0..8]);
        let sakey = be64(&param[8..16]);
        let flags = param[20];
        let aptpl = flags & 0x01 != 0;
        if flags & 0x08 != 0 {
            // SPEC_I_PT: registering other initiators is not supported.
            return Err(Sense::invalid_param_field(20).into());
        }
        let kind = scope_type & 0x0f;
        if scope_type >> 4 != 0 && matches!(action, 1 | 2 | 4 | 5) {
            return Err(Sense::invalid_cdb_field(2, Some(4)).into());
        }
        let mine = self.key_of(n);
        let own = self.covering(n);
        let mut notices = Vec::new();
        match action {
            // REGISTER / REGISTER AND IGNORE EXISTING KEY
            0 | 6 => {
                if action == 0 && mine.unwrap_or(0) != rkey {
                    return Err(PrError::Conflict);
                }
                let all_ports = flags & 0x04 != 0;
                match own {
                    Some(it) if sakey == 0 => self.unregister(it, &mut notices),
                    Some(it) => {
                        if let Some(r) = self.keys.get_mut(&it) {
                            r.key = sakey;
                        }
                    }
                    None if sakey == 0 => {}
                    None => {
                        if all_ports && self.keys.keys().any(|it| it.nexus == n) {
                            // The initiator port is registered through
                            // another target port already: one of the
                            // I_T nexuses ALL_TG_PT names is registered.
                            return Err(PrError::Conflict);
                        }
                        let name = self.names.get(&n).cloned().unwrap_or_default();
                        let it = ItNexus {
                            nexus: n,
                            port: self.port,
                        };
                        self.keys.insert(
                            it,
                            Registration {
                                key: sakey,
                                all_ports,
                                name,
                            },
                        );
                    }
                }
                self.aptpl = aptpl;
                self.generation = self.generation.wrapping_add(1);
            }
            // RESERVE
            1 => {
                if mine != Some(rkey) {
                    return Err(PrError::Conflict);
                }
                if !valid_type(kind) {
                    return Err(Sense::invalid_cdb_field(2, Some(0)).into());
                }
                match self.holder {
                    Some(h) if self.is_holder(n) && h.kind == kind => {}
                    Some(_) => return Err(PrError::Conflict),
                    None => {
                        if self.legacy.is_some_and(|l| l != n) {
                            return Err(PrError::Conflict);
                        }
                        let Some(it) = own else {
                            return Err(PrError::Conflict);
                        };
                        self.holder = Some(Holder { it, kind });
                    }
                }
            }
            // RELEASE
            2 => {
                if mine != Some(rkey) {
                    return Err(PrError::Conflict);
                }
                if let Some(h) = self.holder {
                    if self.is_holder(n) {
                        if h.kind != kind {
                            return Err(Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x04).into());
                        }
                        self.holder = None;
                        if registrants_only(h.kind) || all_registrants(h.kind) {
                            for other in self.keys.keys().filter(|o| Some(**o) != own) {
                                notices.push(self.notice(*other, codes::RESERVATIONS_RELEASED));
                            }
                        }
                    }
                }
            }
            // CLEAR
            3 => {
                if mine != Some(rkey) {
                    return Err(PrError::Conflict);
                }
                for other in self.keys.keys().filter(|o| Some(**o) != own) {
                    notices.push(self.notice(*other, codes::RESERVATIONS_PREEMPTED));
                }
                self.keys.clear();
                self.holder = None;
                self.generation = self.generation.wrapping_add(1);
            }
            // PREEMPT / PREEMPT AND ABORT
            4 | 5 => {
                if mine != Some(rkey) {
                    return Err(PrError::Conflict);
                }
                if !valid_type(kind) {
                    return Err(Sense::invalid_cdb_field(2, Some(0)).into());
                }
                let holder = self.holder;
                let holder_key = holder
                    .filter(|h| !all_registrants(h.kind))
                    .and_then(|h| self.keys.get(&h.it).map(|r| r.key));
                let victims: Vec<ItNexus> = if sakey == 0 {
                    match holder {
                        Some(h) if all_registrants(h.kind) => self
                            .keys
                            .keys()
                            .copied()
                            .filter(|o| Some(*o) != own)
                            .collect(),
                        _ => return Err(Sense::invalid_param_field(8).into()),
                    }
                } else {
                    let v: Vec<ItNexus> = self
                        .keys
                        .iter()
                        .filter(|(_, r)| r.key == sakey)
                        .map(|(o, _)| *o)
                        .collect();
                    if v.is_empty() {
                        return Err(PrError::Conflict);
                    }
                    v
                };
                let preempts_holder = match holder {
                    Some(h) if all_registrants(h.kind) => true,
                    Some(_) => holder_key == Some(sakey),
                    None => false,
                };
                for v in &victims {
                    if Some(*v) != own {
                        let mut notice = self.notice(*v, codes::REGISTRATIONS_PREEMPTED);
                        notice.abort = action == 5;
                        notices.push(notice);
                        self.keys.remove(v);
                    }
                }
                if preempts_holder {
                    if let Some(it) = own {
                        self.holder = Some(Holder { it, kind });
                    }
                }
                self.generation = self.generation.wrapping_add(1);
            }
            _ => return Err(Sense::invalid_cdb_field(1, Some(4)).into()),
        }
        self.save();
        Ok(notices)
    }

    fn unregister(&mut self, it: ItNexus, notices: &mut Notices) {
        self.keys.remove(&it);
        if let Some(h) = self.holder {
            if all_registrants(h.kind) {
                if self.keys.is_empty() {
                    self.holder = None;
                }
            } else if h.it == it {
                self.holder = None;
                if registrants_only(h.kind) {
                    for other in self.keys.keys() {
                        notices.push(self.notice(*other, codes::RESERVATIONS_RELEASED));
                    }
                }
            }
        }
    }

    /// Save the state when APTPL asks for it (or remove a stale file).
    fn save(&self) {
        let Some(path) = &self.state_file else { return };
        if !self.aptpl || self.keys.is_empty() {
            let _ = std::fs::remove_file(path);
            return;
        }
        let mut text = format!("generation {}\n", self.generation);
        for (it, r) in &self.keys {
            text.push_str(&format!(
                "key {:016x} {:016x} {}\n",
                it.nexus.0, r.key, r.name
            ));
        }
        if let Some(h) = self.holder {
            text.push_str(&format!("holder {:016x} {}\n", h.it.nexus.0, h.kind));
        }
        if let Err(e) = write_atomically(path, text.as_bytes()) {
            tracing::error!(path = %path.display(), %e, "cannot save persistent reservations");
        }
    }

    fn load(&mut self, path: &Path) {
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["generation", g] => self.generation = g.parse().unwrap_or(0),
                ["key", n, k, rest @ ..] => {
                    if let (Ok(n), Ok(k)) = (u64::from_str_radix(n, 16), u64::from_str_radix(k, 16))
                    {
                        let name = rest.first().map(|s| (*s).to_string()).unwrap_or_default();
                        if !name.is_empty() {
                            self.names.insert(Nexus(n), name.clone());
                        }
                        let it = ItNexus {
                            nexus: Nexus(n),
                            port: self.port,
                        };
                        self.keys.insert(
                            it,
                            Registration {
                                key: k,
                                all_ports: false,
                                name,
                            },
                        );
                    }
                }
                ["holder", n, t] => {
                    if let (Ok(n), Ok(t)) = (u64::from_str_radix(n, 16), t.parse()) {
                        self.holder = Some(Holder {
                            it: ItNexus {
                                nexus: Nexus(n),
                                port: self.port,
                            },
                            kind: t,
                        });
                    }
                }
                _ => {
                    tracing::warn!(path = %path.display(), line, "ignoring unreadable reservation line")
                }
            }
        }
        self.aptpl = !self.keys.is_empty();
    }
}

/// One line of a `"pr"` blob into `r`; `None` if a known kind of line
/// does not parse (unknown kinds are skipped).
fn parse_line(r: &mut Reservations, line: &str) -> Option<()> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    match f.as_slice() {
        ["generation", g] => r.generation = g.parse().ok()?,
        ["aptpl", a] => r.aptpl = *a == "1",
        ["seq", s] => r.next_seq = s.parse().ok()?,
        ["reg", n, port, all, k, name] => {
            let it = ItNexus {
                nexus: Nexus(hex(n)?),
                port: port.parse().ok()?,
            };
            let name = if *name == "-" { "" } else { name };
            let reg = Registration {
                key: hex(k)?,
                all_ports: *all == "1",
                name: name.to_string(),
            };
            r.keys.insert(it, reg);
        }
        ["holder", n, port, kind] => {
            let it = ItNexus {
                nexus: Nexus(hex(n)?),
                port: port.parse().ok()?,
            };
            let kind: u8 = kind.parse().ok()?;
            if !valid_type(kind) {
                return None;
            }
            r.holder = Some(Holder { it, kind });
        }
        ["notice", seq, n, port, all, k, asc, ascq, abort] => {
            r.log.push_back(Notice {
                seq: seq.parse().ok()?,
                it: ItNexus {
                    nexus: Nexus(hex(n)?),
                    port: port.parse().ok()?,
                },
                all_ports: *all == "1",
                sense: Sense::new(k.parse().ok()?, asc.parse().ok()?, ascq.parse().ok()?),
                abort: *abort == "1",
                to_all: false,
            });
        }
        ["event", seq, port, k, asc, ascq] => {
            let sense = Sense::new(k.parse().ok()?, asc.parse().ok()?, ascq.parse().ok()?);
            let mut n = Notice::to_all(port.parse().ok()?, sense);
            n.seq = seq.parse().ok()?;
            r.log.push_back(n);
        }
        [kind, ..]
            if matches!(
                *kind,
                "generation" | "aptpl" | "seq" | "reg" | "holder" | "notice" | "event"
            ) =>
        {
            return None
        }
        _ => {}
    }
    Some(())
}

/// Write a file so that a crash leaves either the old or the new content:
/// write a temporary file, fsync it, rename it over, fsync the directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(rkey: u64, sakey: u64, flags: u8) -> Vec<u8> {
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&rkey.to_be_bytes());
        p[8..16].copy_from_slice(&sakey.to_be_bytes());
        p[20] = flags;
        p
    }

    #[test]
    fn the_shared_blob_round_trips_and_rejects_corruption() {
        let mut a = Reservations::with_state_file(None, 1);
        a.set_name(Nexus(7), "iqn.2026-11.org.example:a");
        a.pr_out(Nexus(7), 0, 0, &param(0, 0xa, 0x04)).ok().unwrap();
        a.pr_out(Nexus(7), 1, pr_type::WE_REGISTRANTS_ONLY, &param(0xa, 0, 0))
            .ok()
            .unwrap();
        let mut b = Reservations::with_state_file(None, 2);
        b.decode_shared(&a.encode()).unwrap();
        b.pr_out(Nexus(8), 0, 0, &param(0, 0xb, 0)).ok().unwrap();
        let mut notices = b
            .pr_out(Nexus(8), 4, pr_type::WRITE_EXCLUSIVE, &param(0xb, 0xa, 0))
            .ok()
            .unwrap();
        assert_eq!(notices.len(), 1);
        assert!(notices[0].all_ports, "the victim registered with ALL_TG_PT");
        b.log_notices(&mut notices);
        b.log_notices(&mut [Notice::to_all(2, codes::LUN_RESET)]);
        let blob = b.encode();
        let mut c = Reservations::with_state_file(None, 1);
        c.decode_shared(&blob).unwrap();
        assert_eq!(c.encode(), blob);
        assert_eq!(c.last_seq(), 2);
        let seen: Vec<_> = c.notices_after(0).filter(|n| n.for_port(1)).collect();
        assert_eq!(seen.len(), 2, "the preempted registrant and the reset");
        assert_eq!(c.notices_after(1).count(), 1);
        // Gateway 1's nexus 8 is not gateway 2's.
        assert!(c.check(Nexus(8), Access::Write).is_err());
        // Unknown kinds of line are skipped; broken known ones are errors.
        let mut future = blob.clone();
        future.extend_from_slice(b"lease 5 2026\n");
        c.decode_shared(&future).unwrap();
        for bad in [
            &b"ethersan-pr\n"[..],
            b"ethersan-pr 1\nreg 1 2 0 zz -\n",
            b"ethersan-pr 1\nholder 1 1 9\n",
            b"ethersan-pr 1\nnotice 1 2\n",
            b"\xff",
        ] {
            assert!(c.decode_shared(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            c.encode(),
            future[..blob.len()],
            "unchanged by a failed decode"
        );
    }

    #[test]
    fn all_tg_pt_over_a_registration_through_another_port_conflicts() {
        let mut p1 = Reservations::with_state_file(None, 1);
        p1.pr_out(Nexus(7), 0, 0, &param(0, 0xa, 0)).ok().unwrap();
        p1.pr_out(Nexus(7), 1, pr_type::WRITE_EXCLUSIVE, &param(0xa, 0, 0))
            .ok()
            .unwrap();
        let mut p2 = Reservations::with_state_file(None, 2);
        p2.decode_shared(&p1.encode()).unwrap();
        assert!(matches!(
            p2.pr_out(Nexus(7), 0, 0, &param(0, 0xb, 0x04)),
            Err(PrError::Conflict)
        ));
        // Without ALL_TG_PT it is a second I_T nexus, registered apart.
        p2.pr_out(Nexus(7), 0, 0, &param(0, 0xb, 0)).ok().unwrap();
        assert!(
            p2.check(Nexus(7), Access::Write).is_err(),
            "not the holder here"
        );
        assert!(p1.check(Nexus(7), Access::Write).is_ok());
    }
}
