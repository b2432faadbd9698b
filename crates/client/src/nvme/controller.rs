//! An NVMe-oF controller reached over NVMe/TCP: its admin queue (Connect,
//! CC.EN = 1 and CSTS.RDY, Identify, Keep Alive every half KATO), its I/O
//! queues, and the Discovery log of a discovery controller.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ethersan_nvme::fabrics::{ConnectData, PropertySize};
use ethersan_nvme::host::commands::{self, CNTLID_DYNAMIC};
use ethersan_nvme::host::parse::{
    parse_active_namespaces, parse_discovery_log, parse_namespace_descriptors, DiscoveryLog,
};
use ethersan_nvme::host::HostConfig;
use ethersan_nvme::identify::{ControllerInfo, NamespaceId, NamespaceInfo};
use ethersan_nvme::log::{lid, DISCOVERY_RECORD_LEN};
use ethersan_nvme::properties::{CAP, CC, CC_EN, CSTS, CSTS_CFS, CSTS_RDY};
use tokio::task::JoinHandle;

use super::error::NvmeError;
use super::queue::QueueConn;

/// Keep Alive Timeout asked for by default, in milliseconds.
pub const KATO_MS: u32 = 30_000;
/// Admin queue entries.
const ADMIN_DEPTH: u16 = 32;
/// Most I/O queue entries asked for.
const IO_DEPTH: u16 = 128;

/// Who connects to what, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Ask for header digests.
    pub header_digest: bool,
    /// Ask for data digests.
    pub data_digest: bool,
    /// Keep Alive Timeout to ask for, in milliseconds (a Keep Alive goes
    /// every half of it).
    pub kato_ms: u32,
    /// `host:port` of the controller.
    pub addr: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
    /// Host identifier.
    pub host_id: [u8; 16],
}

/// One controller: its admin queue, kept alive.
#[derive(Debug)]
pub struct Controller {
    /// Who is connected to what.
    pub who: Identity,
    admin: Arc<QueueConn>,
    /// Controller ID from the Connect.
    pub cntlid: u16,
    /// The CAP property.
    pub cap: u64,
    /// Identify Controller.
    pub info: ControllerInfo,
    timeout: Option<Duration>,
    keep_alive: JoinHandle<()>,
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.keep_alive.abort();
    }
}

/// The namespace a target uses, identified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// NSID.
    pub nsid: u32,
    /// Identify Namespace.
    pub info: NamespaceInfo,
    /// Identification descriptors (NGUID, EUI-64, UUID), where given.
    pub ids: Vec<NamespaceId>,
    /// Logical block size.
    pub block_size: u32,
}

async fn connect_queue(
    conn: &QueueConn,
    who: &Identity,
    qid: u16,
    depth: u16,
    cntlid: u16,
) -> Result<u16, NvmeError> {
    let data = ConnectData {
        host_id: who.host_id,
        cntlid,
        subnqn: who.subnqn.clone(),
        hostnqn: who.hostnqn.clone(),
    };
    let c = conn
        .call(commands::connect(qid, depth, who.kato_ms, false, &data))
        .await?;
    if !c.cqe.status.is_success() {
        return Err(NvmeError::ConnectRefused {
            subnqn: who.subnqn.clone(),
            hostnqn: who.hostnqn.clone(),
            status: c.cqe.status,
        });
    }
    Ok(c.cqe.dw0 as u16)
}

impl Controller {
    /// Connects the admin queue, enables the controller and identifies it.
    pub async fn connect(who: Identity, timeout: Option<Duration>) -> Result<Self, NvmeError> {
        let admin = QueueConn::connect(
            &who.addr,
            HostConfig {
                header_digest: who.header_digest,
                data_digest: who.data_digest,
                ..HostConfig::default()
            },
            usize::from(ADMIN_DEPTH - 1),
            timeout,
        )
        .await?;
        let cntlid = connect_queue(&admin, &who, 0, ADMIN_DEPTH, CNTLID_DYNAMIC).await?;
        let cap = admin
            .call_ok(
                "Property Get CAP",
                commands::property_get(CAP, PropertySize::Eight),
            )
            .await?
            .cqe;
        let cap = u64::from(cap.dw0) | u64::from(cap.dw1) << 32;
        // CC: EN, I/O SQ entries 2^6, CQ entries 2^4, NVM command set, 4 KiB pages.
        let cc = CC_EN | 6 << 16 | 4 << 20;
        admin
            .call_ok(
                "Property Set CC.EN",
                commands::property_set(CC, PropertySize::Four, u64::from(cc)),
            )
            .await?;
        let wait = Duration::from_millis(500 * (((cap >> 24) & 0xFF) + 1));
        let start = Instant::now();
        loop {
            let csts = admin
                .call_ok(
                    "Property Get CSTS",
                    commands::property_get(CSTS, PropertySize::Four),
                )
                .await?
                .cqe
                .dw0;
            if csts & CSTS_CFS != 0 {
                return Err(NvmeError::NotReady(
                    "CSTS.CFS: controller fatal status".into(),
                ));
            }
            if csts & CSTS_RDY != 0 {
                break;
            }
            if start.elapsed() > wait {
                return Err(NvmeError::NotReady(format!(
                    "CSTS.RDY still 0 after {wait:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let id = admin
            .call_ok("Identify Controller", commands::identify(1, 0))
            .await?;
        let info = ControllerInfo::parse(&id.data)
            .ok_or_else(|| NvmeError::Closed("short Identify Controller data".into()))?;
        let admin = Arc::new(admin);
        let ka = admin.clone();
        let period = Duration::from_millis(u64::from(who.kato_ms / 2).max(10));
        let keep_alive = tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                if ka.call(commands::keep_alive()).await.is_err() {
                    return;
                }
            }
        });
        Ok(Controller {
            who,
            admin,
            cntlid,
            cap,
            info,
            timeout,
            keep_alive,
        })
    }

    /// The admin queue's ICResp (digests, CPDA, MAXH2CDATA agreed).
    pub fn ic_resp(&self) -> ethersan_nvme::pdu::IcResp {
        self.admin.ic_resp()
    }

    /// The active namespace IDs.
    pub async fn active_namespaces(&self) -> Result<Vec<u32>, NvmeError> {
        let c = self
            .admin
            .call_ok("Identify active namespace list", commands::identify(2, 0))
            .await?;
        Ok(parse_active_namespaces(&c.data))
    }

    /// Identifies namespace `nsid`; an inactive one is
    /// [`NvmeError::NamespaceNotFound`].
    pub async fn namespace(&self, nsid: u32) -> Result<Namespace, NvmeError> {
        let not_found = |active: Vec<u32>| {
            let active = if active.is_empty() {
                "none".to_string()
            } else {
                active
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            NvmeError::NamespaceNotFound {
                nsid,
                subnqn: self.who.subnqn.clone(),
                active,
            }
        };
        let c = self.admin.call(commands::identify(0, nsid)).await?;
        let info = if c.cqe.status.is_success() {
            NamespaceInfo::parse(&c.data)
        } else {
            None
        };
        let (info, block_size) = match info.and_then(|i| Some((i.block_size()?, i))) {
            Some((bs, i)) if i.nsze > 0 => (i, bs),
            _ => {
                return Err(not_found(
                    self.active_namespaces().await.unwrap_or_default(),
                ))
            }
        };
        let ids = match self.admin.call(commands::identify(3, nsid)).await {
            Ok(c) if c.cqe.status.is_success() => parse_namespace_descriptors(&c.data),
            _ => Vec::new(),
        };
        Ok(Namespace {
            nsid,
            info,
            ids,
            block_size,
        })
    }

    /// Largest in-capsule write on an I/O queue (IOCCSZ × 16 − 64).
    pub fn io_in_capsule(&self) -> u32 {
        self.info.ioccsz.saturating_mul(16).saturating_sub(64)
    }

    /// MDTS in bytes (`None`: no limit).
    pub fn max_data_transfer(&self) -> Option<u64> {
        let page = 1u64 << (12 + ((self.cap >> 48) & 0xF));
        (self.info.mdts != 0).then(|| page << self.info.mdts.min(20))
    }

    /// Connects I/O queue `qid` on its own TCP connection.
    pub async fn io_queue(&self, qid: u16) -> Result<QueueConn, NvmeError> {
        let mqes = (self.cap & 0xFFFF) as u16;
        let depth = IO_DEPTH.min(mqes.saturating_add(1)).max(2);
        let config = HostConfig {
            max_in_capsule: self.io_in_capsule(),
            header_digest: self.who.header_digest,
            data_digest: self.who.data_digest,
            ..HostConfig::default()
        };
        let q = QueueConn::connect(&self.who.addr, config, usize::from(depth - 1), self.timeout)
            .await?;
        connect_queue(&q, &self.who, qid, depth, self.cntlid).await?;
        Ok(q)
    }

    /// The Discovery log page (of a discovery controller).
    pub async fn discovery_log(&self) -> Result<DiscoveryLog, NvmeError> {
        let what = "Get Log Page (Discovery)";
        let head = self
            .admin
            .call_ok(
                what,
                commands::get_log_page(lid::DISCOVERY, 0, 0, DISCOVERY_RECORD_LEN as u32),
            )
            .await?;
        let numrec = parse_discovery_log(&head.data)
            .map_or(0, |l| l.numrec)
            .min(1024);
        let len = DISCOVERY_RECORD_LEN as u32 * (1 + numrec as u32);
        let all = self
            .admin
            .call_ok(what, commands::get_log_page(lid::DISCOVERY, 0, 0, len))
            .await?;
        parse_discovery_log(&all.data)
            .ok_or_else(|| NvmeError::Closed("short Discovery log page".into()))
    }

    /// Shuts the controller down (CC.SHN normal), best effort.
    pub async fn shutdown(&self) {
        let cc = CC_EN | 6 << 16 | 4 << 20 | 1 << 14;
        let _ = self
            .admin
            .call(commands::property_set(
                CC,
                PropertySize::Four,
                u64::from(cc),
            ))
            .await;
    }
}
