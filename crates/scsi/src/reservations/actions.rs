//! SPC-4 §6.15 PERSISTENT RESERVE IN and §6.16 PERSISTENT RESERVE OUT:
//! the service actions over [`Reservations`].

use super::{
    all_registrants, registrants_only, valid_type, Holder, ItNexus, Notices, PrError, Registration,
    Reservations,
};
use crate::be::be64;
use crate::sense::{codes, key, Sense};
use crate::Nexus;

impl Reservations {
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
}
