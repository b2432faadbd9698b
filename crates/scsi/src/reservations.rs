//! SPC-4 §5.9 reservations: RESERVE/RELEASE (6/10) and persistent
//! reservations (PERSISTENT RESERVE IN/OUT), with APTPL state saved
//! atomically (write, fsync, rename) and restored at start.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::be::be64;
use crate::sense::{codes, key, Sense};
use crate::Nexus;

/// Persistent reservation types (SPC-4 Table 190).
pub(crate) mod pr_type {
    pub(crate) const WRITE_EXCLUSIVE: u8 = 1;
    pub(crate) const EXCLUSIVE_ACCESS: u8 = 3;
    pub(crate) const WE_REGISTRANTS_ONLY: u8 = 5;
    pub(crate) const EA_REGISTRANTS_ONLY: u8 = 6;
    pub(crate) const WE_ALL_REGISTRANTS: u8 = 7;
    pub(crate) const EA_ALL_REGISTRANTS: u8 = 8;
}

/// What a command does to the medium, for conflict checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Never conflicts (INQUIRY, REPORT LUNS, REQUEST SENSE, TEST UNIT
    /// READY, READ CAPACITY, PERSISTENT RESERVE IN/OUT, ...).
    Free,
    /// Reads the medium or its parameters.
    Read,
    /// Changes the medium or its parameters.
    Write,
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
    nexus: Nexus,
    kind: u8,
}

/// The reservation state of one logical unit.
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    /// RESERVE(6/10) holder.
    legacy: Option<Nexus>,
    generation: u32,
    /// Registered keys by I_T nexus.
    keys: HashMap<Nexus, u64>,
    /// Initiator port names by nexus, for READ FULL STATUS.
    names: HashMap<Nexus, String>,
    holder: Option<Holder>,
    aptpl: bool,
    state_file: Option<PathBuf>,
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

/// Unit attentions a reservation change owes other nexuses.
pub(crate) type Notices = Vec<(Nexus, Sense)>;

impl Reservations {
    /// State kept in `state_file` (APTPL), loaded if present.
    pub(crate) fn with_state_file(path: Option<PathBuf>) -> Self {
        let mut r = Reservations {
            state_file: path,
            ..Default::default()
        };
        if let Some(p) = r.state_file.clone() {
            r.load(&p);
        }
        r
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
            Some(h) if all_registrants(h.kind) => self.keys.contains_key(&n),
            Some(h) => h.nexus == n,
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
        let registered = self.keys.contains_key(&n);
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
        if self.holder.is_some() || !self.keys.is_empty() && !self.keys.contains_key(&n) {
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
                let mut keys: Vec<u64> = self.keys.values().copied().collect();
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
                        self.keys.get(&h.nexus).copied().unwrap_or(0)
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
                let mut regs: Vec<(&Nexus, &u64)> = self.keys.iter().collect();
                regs.sort();
                for (n, k) in regs {
                    let holder = self.is_holder(*n);
                    let kind = if holder {
                        self.holder.map(|h| h.kind).unwrap_or(0)
                    } else {
                        0
                    };
                    descs.extend_from_slice(&k.to_be_bytes());
                    descs.extend_from_slice(&[0; 4]);
                    descs.push(u8::from(holder));
                    descs.push(kind & 0x0f);
                    descs.extend_from_slice(&[0; 4]);
                    descs.extend_from_slice(&1u16.to_be_bytes()); // relative target port 1
                                                                  // iSCSI TransportID (format 00b): the initiator name.
                    let mut name = self.names.get(n).cloned().unwrap_or_default().into_bytes();
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
        let mine = self.keys.get(&n).copied();
        let mut notices = Vec::new();
        match action {
            // REGISTER / REGISTER AND IGNORE EXISTING KEY
            0 | 6 => {
                if action == 0 && mine.unwrap_or(0) != rkey {
                    return Err(PrError::Conflict);
                }
                if sakey == 0 {
                    if mine.is_some() {
                        self.unregister(n, &mut notices);
                    }
                } else {
                    self.keys.insert(n, sakey);
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
                        self.holder = Some(Holder { nexus: n, kind });
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
                            for other in self.keys.keys().filter(|o| **o != n) {
                                notices.push((*other, Sense::new(key::UNIT_ATTENTION, 0x2a, 0x04)));
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
                for other in self.keys.keys().filter(|o| **o != n) {
                    notices.push((*other, Sense::new(key::UNIT_ATTENTION, 0x2a, 0x03)));
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
                    .and_then(|h| self.keys.get(&h.nexus).copied());
                let victims: Vec<Nexus> = if sakey == 0 {
                    match holder {
                        Some(h) if all_registrants(h.kind) => {
                            self.keys.keys().copied().filter(|o| *o != n).collect()
                        }
                        _ => return Err(Sense::invalid_param_field(8).into()),
                    }
                } else {
                    let v: Vec<Nexus> = self
                        .keys
                        .iter()
                        .filter(|(_, k)| **k == sakey)
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
                    if *v != n {
                        self.keys.remove(v);
                        notices.push((*v, Sense::new(key::UNIT_ATTENTION, 0x2a, 0x05)));
                    }
                }
                if preempts_holder {
                    self.holder = Some(Holder { nexus: n, kind });
                }
                self.generation = self.generation.wrapping_add(1);
            }
            _ => return Err(Sense::invalid_cdb_field(1, Some(4)).into()),
        }
        self.save();
        Ok(notices)
    }

    fn unregister(&mut self, n: Nexus, notices: &mut Notices) {
        self.keys.remove(&n);
        if let Some(h) = self.holder {
            if all_registrants(h.kind) {
                if self.keys.is_empty() {
                    self.holder = None;
                }
            } else if h.nexus == n {
                self.holder = None;
                if registrants_only(h.kind) {
                    for other in self.keys.keys() {
                        notices.push((*other, Sense::new(key::UNIT_ATTENTION, 0x2a, 0x04)));
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
        let mut regs: Vec<(&Nexus, &u64)> = self.keys.iter().collect();
        regs.sort();
        for (n, k) in regs {
            text.push_str(&format!(
                "key {:016x} {:016x} {}\n",
                n.0,
                k,
                self.names.get(n).map(String::as_str).unwrap_or("")
            ));
        }
        if let Some(h) = self.holder {
            text.push_str(&format!("holder {:016x} {}\n", h.nexus.0, h.kind));
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
                        self.keys.insert(Nexus(n), k);
                        if let Some(name) = rest.first() {
                            self.names.insert(Nexus(n), (*name).to_string());
                        }
                    }
                }
                ["holder", n, t] => {
                    if let (Ok(n), Ok(t)) = (u64::from_str_radix(n, 16), t.parse()) {
                        self.holder = Some(Holder {
                            nexus: Nexus(n),
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
