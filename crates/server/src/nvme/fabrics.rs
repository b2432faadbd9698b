//! Fabrics commands on a connection: Connect (an admin queue makes a
//! controller, an I/O queue joins one), Property Get/Set on the
//! controller's registers, Disconnect.

use std::sync::Arc;

use ethersan_nvme::fabrics::{ConnectData, FabricsCommand};
use ethersan_nvme::queue::Completion;
use ethersan_nvme::{Sqe, Status};
use ethersan_scsi::IoBuf;
use tracing::{info, warn};

use super::conn::Conn;
use super::ident::DISCOVERY_NQN;
use super::{Role, IO_QUEUES, QUEUE_ENTRIES};

/// Connect Invalid Parameters' result: IATTR 1 (in the Connect data) and
/// the offset of the field at fault.
fn bad_data_field(offset: u32) -> u32 {
    1 << 16 | offset
}

/// Offsets in the Connect data.
const CNTLID_AT: u32 = 16;
const SUBNQN_AT: u32 = 256;
const HOSTNQN_AT: u32 = 512;

impl Conn {
    /// A fabrics command (opcode 7Fh).
    pub(super) fn fabrics(&mut self, sqe: Sqe, data: Option<IoBuf>) {
        let cid = sqe.cid();
        let cmd = match FabricsCommand::parse(&sqe) {
            Ok(c) => c,
            Err(s) => return self.complete(Completion::new(cid, s)),
        };
        match cmd {
            FabricsCommand::Connect(c) => {
                let r = match data.as_deref().map(ConnectData::parse) {
                    Some(Ok(d)) => self.connect(c.qid, c.sqsize, c.kato, d),
                    Some(Err(s)) => Err((s, 0)),
                    None => Err((Status::CONNECT_INVALID_PARAMETERS, 0)),
                };
                let c = match r {
                    Ok(cntlid) => Completion {
                        dw0: u32::from(cntlid),
                        ..Completion::new(cid, Status::SUCCESS)
                    },
                    Err((status, dw0)) => Completion {
                        dw0,
                        ..Completion::new(cid, status)
                    },
                };
                let failed = !c.status.is_success();
                self.complete(c);
                if failed {
                    self.closing = true;
                }
            }
            FabricsCommand::PropertyGet { size, offset } => {
                let r = match (&self.ctrl, self.admin) {
                    (Some(c), true) => c
                        .props
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(offset, size),
                    _ => Err(Status::COMMAND_SEQUENCE_ERROR),
                };
                let c = match r {
                    Ok(v) => Completion {
                        dw0: v as u32,
                        dw1: (v >> 32) as u32,
                        ..Completion::new(cid, Status::SUCCESS)
                    },
                    Err(s) => Completion::new(cid, s),
                };
                self.complete(c);
            }
            FabricsCommand::PropertySet {
                size,
                offset,
                value,
            } => {
                let r = match (&self.ctrl, self.admin) {
                    (Some(c), true) => c
                        .props
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .set(offset, size, value),
                    _ => Err(Status::COMMAND_SEQUENCE_ERROR),
                };
                let s = r.err().unwrap_or(Status::SUCCESS);
                self.complete(Completion::new(cid, s));
            }
            FabricsCommand::Disconnect => {
                self.complete(Completion::new(cid, Status::SUCCESS));
                self.closing = true;
            }
        }
    }

    /// Connect queue `qid`: the admin queue (0) makes a controller, an
    /// I/O queue joins the one the data names. `Ok(CNTLID)`, or the
    /// status and result dword 0 to fail with.
    fn connect(
        &mut self,
        qid: u16,
        sqsize: u16,
        kato: u32,
        d: ConnectData,
    ) -> Result<u16, (Status, u32)> {
        if sqsize == 0 || sqsize >= QUEUE_ENTRIES {
            // SQSIZE is at byte 44 of the SQE (IATTR 0).
            return Err((Status::CONNECT_INVALID_PARAMETERS, 44));
        }
        let hostnqn: Arc<str> = d.hostnqn.as_str().into();
        if qid == 0 {
            let role = if d.subnqn == DISCOVERY_NQN {
                Role::Discovery
            } else {
                let Some(target) = self.shared.target_by_nqn(&d.subnqn) else {
                    warn!(peer = %self.peer, subsystem = %d.subnqn, "NVMe/TCP Connect to an unknown subsystem");
                    return Err((
                        Status::CONNECT_INVALID_PARAMETERS,
                        bad_data_field(SUBNQN_AT),
                    ));
                };
                // As an iSCSI login: a target whose access list leaves the
                // host out refuses it.
                if !target.access.allows(&d.hostnqn, Some(self.peer.ip())) {
                    warn!(peer = %self.peer, host = %d.hostnqn, subsystem = %d.subnqn, "NVMe/TCP Connect refused: the target's access list does not allow this host");
                    return Err((Status::CONNECT_INVALID_HOST, 0));
                }
                let nexus = super::io::nexus(&d.hostnqn, &d.host_id, &target.name);
                target.scsi.set_initiator_name(nexus, &d.hostnqn);
                let counters = self
                    .shared
                    .registry
                    .directory()
                    .initiator_counters(&d.hostnqn);
                Role::Io {
                    target,
                    nexus,
                    counters,
                }
            };
            let Some(c) =
                self.shared
                    .new_controller(role, d.subnqn.clone(), hostnqn, d.host_id, kato)
            else {
                return Err((Status::CONNECT_CONTROLLER_BUSY, 0));
            };
            info!(peer = %self.peer, cntlid = c.cntlid, host = %c.hostnqn, subsystem = %c.subnqn, "NVMe/TCP controller connected");
            let id = c.cntlid;
            self.ctrl = Some(c);
            self.admin = true;
            return Ok(id);
        }
        let Some(c) = self.shared.controller(d.cntlid) else {
            return Err((
                Status::CONNECT_INVALID_PARAMETERS,
                bad_data_field(CNTLID_AT),
            ));
        };
        if c.subnqn != d.subnqn || matches!(c.role, Role::Discovery) {
            return Err((
                Status::CONNECT_INVALID_PARAMETERS,
                bad_data_field(SUBNQN_AT),
            ));
        }
        if *c.hostnqn != *d.hostnqn || c.hostid != d.host_id {
            return Err((
                Status::CONNECT_INVALID_PARAMETERS,
                bad_data_field(HOSTNQN_AT),
            ));
        }
        if qid > IO_QUEUES {
            // QID is at byte 42 of the SQE (IATTR 0).
            return Err((Status::CONNECT_INVALID_PARAMETERS, 42));
        }
        // The access rules again, from this connection's address: knowing
        // a host's NQN, host ID and controller ID must not let another
        // address join its controller.
        if let Role::Io { target, .. } = &c.role {
            if !target.access.allows(&d.hostnqn, Some(self.peer.ip())) {
                warn!(peer = %self.peer, host = %d.hostnqn, subsystem = %d.subnqn, "NVMe/TCP I/O queue Connect refused: the target's access list does not allow this host from this address");
                return Err((Status::CONNECT_INVALID_HOST, 0));
            }
        }
        if !c.ready() {
            return Err((Status::COMMAND_SEQUENCE_ERROR, 0));
        }
        let id = c.cntlid;
        self.ctrl = Some(c);
        self.admin = false;
        Ok(id)
    }
}
