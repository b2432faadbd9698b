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
//!
//! This module holds the state and the conflict check every command
//! passes; [`actions`] the PERSISTENT RESERVE IN/OUT service actions,
//! [`persist`] the APTPL state file and the shared blob's text form.

mod actions;
mod persist;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;

use crate::commands::Access;
use crate::sense::{codes, Sense};
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
}

#[cfg(test)]
mod tests;
