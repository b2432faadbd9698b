//! Admin commands of a controller: Identify, Get Log Page, Set/Get
//! Features, Keep Alive, Asynchronous Event Request, Abort; the discovery
//! controller's Identify and discovery log page.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use ethersan_nvme::command::{feature, AdminCommand, Cns};
use ethersan_nvme::identify::{active_namespace_list, namespace_descriptors, IDENTIFY_LEN};
use ethersan_nvme::log::{self, lid, AddressFamily, DiscoveryEntry, Smart, SubsystemType};
use ethersan_nvme::queue::Completion;
use ethersan_nvme::{Sqe, Status};
use ethersan_scsi::Requester;

use super::conn::Conn;
use super::ident::{self, Limits};
use super::{Controller, Role, AERL, IO_QUEUES, QUEUE_ENTRIES};

/// Asynchronous Event Configuration: Namespace Attribute Notices.
const AEC_NS_ATTRIBUTE: u32 = 1 << 8;

/// What an admin command answers: data for the host, or a result dword.
enum Answer {
    Data(Vec<u8>),
    Dw0(u32),
    /// Held (an Asynchronous Event Request): no answer now.
    Held,
}

impl Conn {
    /// An admin command on controller `c`'s admin queue.
    pub(super) fn admin_command(&mut self, c: &Controller, sqe: Sqe, to_host: usize) {
        let cid = sqe.cid();
        let r = AdminCommand::parse(&sqe).and_then(|cmd| self.admin_answer(c, cid, cmd, to_host));
        match r {
            Ok(Answer::Data(d)) => self.send_data(
                Completion::new(cid, Status::SUCCESS),
                Bytes::from(d),
                to_host,
            ),
            Ok(Answer::Dw0(v)) => self.complete(Completion {
                dw0: v,
                ..Completion::new(cid, Status::SUCCESS)
            }),
            Ok(Answer::Held) => {}
            Err(s) => self.complete(Completion::new(cid, s)),
        }
    }

    fn admin_answer(
        &mut self,
        c: &Controller,
        cid: u16,
        cmd: AdminCommand,
        to_host: usize,
    ) -> Result<Answer, Status> {
        let discovery = matches!(c.role, Role::Discovery);
        match cmd {
            AdminCommand::Identify { cns, nsid, .. } => identify(c, cns, nsid).map(Answer::Data),
            AdminCommand::GetLogPage {
                lid,
                offset,
                len,
                rae,
                ..
            } => {
                let page = if discovery {
                    match lid {
                        lid::DISCOVERY => self.discovery_log(c),
                        _ => return Err(Status::INVALID_LOG_PAGE),
                    }
                } else if lid == lid::CHANGED_NAMESPACES {
                    let page = log::changed_namespace_list(&self.changed_ns);
                    if !rae {
                        // Read: the event is cleared, notices re-armed.
                        self.changed_ns.clear();
                        self.ns_notice_out = false;
                    }
                    page
                } else {
                    log_page(c, lid)?
                };
                // No more than the host's buffer takes (NUMD may ask for
                // up to 16 GiB).
                log::window(&page, offset, len.min(to_host as u64))
                    .map(Answer::Data)
                    .ok_or(Status::INVALID_FIELD)
            }
            AdminCommand::KeepAlive => Ok(Answer::Dw0(0)),
            AdminCommand::AsyncEventRequest => {
                if self.aers.len() > usize::from(AERL) {
                    return Err(Status::AER_LIMIT_EXCEEDED);
                }
                self.aers.push(cid);
                Ok(Answer::Held)
            }
            // Answered "not aborted" (allowed: NVMe 1.4 §5.1).
            AdminCommand::Abort { .. } => Ok(Answer::Dw0(1)),
            AdminCommand::GetFeatures { fid, .. } => get_feature(c, fid).map(Answer::Dw0),
            AdminCommand::SetFeatures { fid, save, value } => {
                if save {
                    return Err(Status::FEATURE_NOT_SAVEABLE);
                }
                set_feature(c, fid, value).map(Answer::Dw0)
            }
        }
    }

    /// Once a second on the admin queue of an I/O controller: when the
    /// host's active namespaces changed (a LUN added, removed or masked),
    /// note them for the Changed Namespace List and, if the host enabled
    /// namespace attribute notices, complete a held Asynchronous Event
    /// Request with one.
    pub(super) fn namespace_tick(&mut self) {
        let Some(c) = self.ctrl.clone() else { return };
        let Role::Io { target, .. } = &c.role else {
            return;
        };
        let who = Requester::named(Some(&c.hostnqn));
        let now: Vec<u32> = target
            .scsi
            .luns()
            .iter()
            .filter(|(_, s)| s.policy.access(who).visible)
            .filter_map(|(n, _)| ident::nsid_of(*n))
            .collect();
        if let Some(before) = self.known_ns.replace(now.clone()) {
            let changed = before
                .iter()
                .filter(|n| !now.contains(n))
                .chain(now.iter().filter(|n| !before.contains(n)));
            for n in changed {
                if !self.changed_ns.contains(n) {
                    self.changed_ns.push(*n);
                }
            }
        }
        if self.changed_ns.is_empty() {
            return;
        }
        let enabled = c.aec.load(Ordering::Relaxed) & AEC_NS_ATTRIBUTE != 0;
        if enabled && !self.ns_notice_out && !self.aers.is_empty() {
            let cid = self.aers.remove(0);
            self.ns_notice_out = true;
            // Type 2 (notice), information 0 (namespace attribute
            // changed), log page 04h.
            let dw0 = 2 | u32::from(lid::CHANGED_NAMESPACES) << 16;
            self.complete(Completion {
                dw0,
                ..Completion::new(cid, Status::SUCCESS)
            });
        }
    }

    /// The discovery log page: one entry per subsystem the host may use,
    /// per portal.
    fn discovery_log(&self, c: &Controller) -> Vec<u8> {
        let targets = self.shared.registry.targets();
        let mut entries = Vec::new();
        for t in targets.iter() {
            if !t.access.allows(&c.hostnqn, Some(self.peer.ip())) {
                continue;
            }
            for (i, p) in self.shared.portals.iter().enumerate() {
                let ip = if p.ip().is_unspecified() {
                    self.local.ip()
                } else {
                    p.ip()
                };
                entries.push(DiscoveryEntry {
                    adrfam: if ip.is_ipv4() {
                        AddressFamily::Ipv4
                    } else {
                        AddressFamily::Ipv6
                    },
                    subtype: SubsystemType::Nvme,
                    // Secure channel not required.
                    treq: 2,
                    portid: i as u16,
                    asqsz: QUEUE_ENTRIES,
                    trsvcid: p.port().to_string(),
                    subnqn: ident::subsystem_nqn(&t.name),
                    traddr: ip.to_string(),
                    sectype: 0,
                });
            }
        }
        // The generation changes with the set of subsystems.
        let genctr = entries.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, e| {
            e.subnqn
                .bytes()
                .fold(h, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
        });
        log::discovery_log(genctr, &entries)
    }
}

/// The Identify data of `cns` for controller `c`.
fn identify(c: &Controller, cns: Cns, nsid: u32) -> Result<Vec<u8>, Status> {
    let Role::Io { target, .. } = &c.role else {
        return match cns {
            Cns::Controller => Ok(ident::discovery_controller(c.cntlid).build()),
            _ => Err(Status::INVALID_FIELD),
        };
    };
    let who = Requester::named(Some(&c.hostnqn));
    let luns = target.scsi.luns();
    let visible: Vec<(u32, &ethersan_scsi::LunSlot)> = luns
        .iter()
        .filter(|(_, s)| s.policy.access(who).visible)
        .filter_map(|(n, s)| Some((ident::nsid_of(*n)?, s)))
        .collect();
    match cns {
        Cns::Controller => {
            let l = Limits {
                nn: visible.iter().map(|(n, _)| *n).max().unwrap_or(0),
                vwc: visible.iter().any(|(_, s)| s.lu.volume().write_cache()),
                mdts: 8,
                in_capsule: super::IN_CAPSULE,
                maxcmd: QUEUE_ENTRIES,
            };
            Ok(ident::io_controller(&c.subnqn, c.cntlid, l).build())
        }
        Cns::ActiveNamespaces => {
            let ids: Vec<u32> = visible.iter().map(|(n, _)| *n).collect();
            Ok(active_namespace_list(&ids, nsid))
        }
        Cns::Namespace => {
            if ident::lun_of(nsid).is_none() {
                return Err(Status::INVALID_NAMESPACE);
            }
            // An inactive namespace ID: zeroes.
            Ok(match visible.iter().find(|(n, _)| *n == nsid) {
                Some((_, s)) => {
                    let ro = s.policy.access(who).read_only;
                    ident::namespace(&s.lu, ro).build()
                }
                None => vec![0; IDENTIFY_LEN],
            })
        }
        Cns::NamespaceDescriptors => match visible.iter().find(|(n, _)| *n == nsid) {
            Some((_, s)) => Ok(namespace_descriptors(&ident::descriptors(
                &s.lu.config().naa,
            ))),
            None => Err(Status::INVALID_NAMESPACE),
        },
    }
}

/// A log page of an I/O controller.
fn log_page(c: &Controller, id: u8) -> Result<Vec<u8>, Status> {
    match id {
        // No errors kept: an empty log (64-byte entries of zero).
        lid::ERROR => Ok(vec![0; 64]),
        lid::SMART => {
            let mut s = Smart {
                temperature: 293,
                available_spare: 100,
                spare_threshold: 10,
                ..Smart::default()
            };
            if let Role::Io { target, .. } = &c.role {
                for n in target.scsi.luns().keys() {
                    if let Some(k) = target.lun_counters(*n) {
                        let k = k.snapshot();
                        // Data units: thousands of 512-byte units, rounded up.
                        s.data_units_read += u128::from(k.read_bytes.div_ceil(512_000));
                        s.data_units_written += u128::from(k.write_bytes.div_ceil(512_000));
                        s.host_reads += u128::from(k.reads);
                        s.host_writes += u128::from(k.writes);
                    }
                }
            }
            Ok(s.build())
        }
        lid::FIRMWARE_SLOT => Ok(log::firmware_slot_log(env!("CARGO_PKG_VERSION"))),
        _ => Err(Status::INVALID_LOG_PAGE),
    }
}

/// The current value of feature `fid`.
fn get_feature(c: &Controller, fid: u8) -> Result<u32, Status> {
    match fid {
        feature::NUMBER_OF_QUEUES => Ok(queues_dw0()),
        feature::KEEP_ALIVE_TIMER => Ok(c.kato.load(Ordering::Relaxed)),
        feature::ASYNC_EVENT_CONFIG => Ok(c.aec.load(Ordering::Relaxed)),
        feature::VOLATILE_WRITE_CACHE => match &c.role {
            Role::Io { target, .. } => Ok(u32::from(
                target
                    .scsi
                    .luns()
                    .values()
                    .any(|s| s.lu.volume().write_cache()),
            )),
            Role::Discovery => Err(Status::INVALID_FIELD),
        },
        _ => Err(Status::INVALID_FIELD),
    }
}

/// Set feature `fid` to `value`; the result dword.
fn set_feature(c: &Controller, fid: u8, value: u32) -> Result<u32, Status> {
    match fid {
        // The queues are what they are; the host learns how many.
        feature::NUMBER_OF_QUEUES => Ok(queues_dw0()),
        // Recorded for Get Features; the timer keeps the Connect's KATO.
        feature::KEEP_ALIVE_TIMER => {
            c.kato.store(value, Ordering::Relaxed);
            Ok(0)
        }
        feature::ASYNC_EVENT_CONFIG => {
            c.aec.store(value, Ordering::Relaxed);
            Ok(0)
        }
        // The write cache is the LUN's (MODE SELECT's WCE over SCSI, or
        // its configuration): not changed from here.
        feature::VOLATILE_WRITE_CACHE => Err(Status::FEATURE_NOT_CHANGEABLE),
        _ => Err(Status::INVALID_FIELD),
    }
}

/// Number of Queues' result: I/O submission and completion queues
/// allocated, 0's based.
fn queues_dw0() -> u32 {
    let n = u32::from(IO_QUEUES - 1);
    n | n << 16
}
