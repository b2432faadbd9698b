//! `ethersan discover nvme+tcp://HOST[:PORT]`, and `ls`/`inquiry` of an
//! `nvme+tcp://` URL: the Discovery log, the namespaces and the decoded
//! Identify data.

use serde::Serialize;

use ethersan_client::nvme::{
    self, Controller, ControllerInfo, DiscoveryRecord, Namespace, NamespaceId, NvmeUrl,
};
use ethersan_client::ConnectArgs;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One Discovery log entry as printed.
#[derive(Serialize)]
struct Entry {
    subnqn: String,
    traddr: String,
    trsvcid: String,
    transport: String,
    subtype: String,
    portid: u16,
    url: String,
}

impl Entry {
    fn new(r: &DiscoveryRecord) -> Entry {
        let host = if r.adrfam == 2 {
            format!("[{}]", r.traddr)
        } else {
            r.traddr.clone()
        };
        Entry {
            subnqn: r.subnqn.clone(),
            traddr: r.traddr.clone(),
            trsvcid: r.trsvcid.clone(),
            transport: match r.trtype {
                1 => "rdma".into(),
                2 => "fc".into(),
                3 => "tcp".into(),
                t => format!("{t}"),
            },
            subtype: match r.subtype {
                1 => "referral".into(),
                2 => "nvm".into(),
                3 => "discovery".into(),
                t => format!("{t}"),
            },
            portid: r.portid,
            url: format!("nvme+tcp://{host}:{}/{}", r.trsvcid, r.subnqn),
        }
    }
}

/// `ethersan discover nvme+tcp://HOST[:PORT]`: the Discovery log entries.
pub(crate) async fn cmd_discover(url: &str, how: &ConnectArgs, json: bool) -> anyhow::Result<()> {
    let u = NvmeUrl::parse(url)?;
    let log = nvme::discover(url, how).await?;
    let list: Vec<Entry> = log.entries.iter().map(Entry::new).collect();
    if json {
        out!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for e in &list {
            out!("{}", e.subnqn);
            out!(
                "    {} {}:{} ({}, port ID {})  {}",
                e.transport,
                e.traddr,
                e.trsvcid,
                e.subtype,
                e.portid,
                e.url
            );
        }
    }
    if list.is_empty() {
        anyhow::bail!(
            "the discovery controller at {} lists no subsystems (for host {})",
            u.address(),
            nvme::host_identity(u.hostnqn.as_deref()).0
        );
    }
    Ok(())
}

/// Identify data as `inquiry` and `ls` show it.
#[derive(Serialize)]
struct Identity {
    subnqn: String,
    hostnqn: String,
    cntlid: u16,
    model: String,
    serial: String,
    firmware: String,
    version: String,
    namespaces: u32,
    mdts_bytes: Option<u64>,
    volatile_write_cache: bool,
    write_zeroes: bool,
    dataset_management: bool,
    nsid: u32,
    blocks: u64,
    block_size: u32,
    capacity_bytes: u64,
    nguid: Option<String>,
    eui64: Option<String>,
    uuid: Option<String>,
}

fn identity(c: &Controller, ns: &Namespace) -> Identity {
    let i: &ControllerInfo = &c.info;
    let nz = |b: &[u8]| b.iter().any(|&x| x != 0).then(|| hex(b));
    let mut nguid = nz(&ns.info.nguid);
    let mut eui64 = nz(&ns.info.eui64);
    let mut uuid = None;
    for id in &ns.ids {
        match id {
            NamespaceId::Nguid(b) => nguid = nguid.or_else(|| nz(b)),
            NamespaceId::Eui64(b) => eui64 = eui64.or_else(|| nz(b)),
            NamespaceId::Uuid(b) => uuid = nz(b),
        }
    }
    Identity {
        subnqn: i.subnqn.clone(),
        hostnqn: c.who.hostnqn.clone(),
        cntlid: c.cntlid,
        model: i.model.clone(),
        serial: i.serial.clone(),
        firmware: i.firmware.clone(),
        version: format!(
            "{}.{}.{}",
            i.version >> 16,
            (i.version >> 8) & 0xFF,
            i.version & 0xFF
        ),
        namespaces: i.nn,
        mdts_bytes: c.max_data_transfer(),
        volatile_write_cache: i.vwc & 1 != 0,
        write_zeroes: i.oncs & nvme::ONCS_WRITE_ZEROES != 0,
        dataset_management: i.oncs & nvme::ONCS_DSM != 0,
        nsid: ns.nsid,
        blocks: ns.info.nsze,
        block_size: ns.block_size,
        capacity_bytes: ns.info.nsze * u64::from(ns.block_size),
        nguid,
        eui64,
        uuid,
    }
}

/// `ethersan ls nvme+tcp://…`: the subsystem's active namespaces (or the
/// one the URL names) with size, block size and identifiers.
pub(crate) async fn cmd_ls(url: &str, how: &ConnectArgs, json: bool) -> anyhow::Result<()> {
    let u = NvmeUrl::parse_subsystem(url)?;
    let c = nvme::connect(url, how).await?;
    let listed = async {
        let nsids = if u.has_nsid {
            vec![u.nsid]
        } else {
            c.active_namespaces().await?
        };
        let mut rows = Vec::new();
        for nsid in nsids {
            rows.push(identity(&c, &c.namespace(nsid).await?));
        }
        anyhow::Ok(rows)
    }
    .await;
    c.shutdown().await;
    let rows = listed?;
    if json {
        out!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    out!(
        "{:<6} {:<24} {:>10} {:>6}  {:<20} nguid/eui64",
        "NSID",
        "model",
        "size",
        "bs",
        "serial"
    );
    for r in &rows {
        out!(
            "{:<6} {:<24} {:>10} {:>6}  {:<20} {}",
            r.nsid,
            r.model,
            indicatif::BinaryBytes(r.capacity_bytes).to_string(),
            r.block_size,
            r.serial,
            r.nguid
                .clone()
                .or_else(|| r.eui64.clone())
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// `ethersan inquiry nvme+tcp://…`: Identify Controller and Namespace,
/// decoded.
pub(crate) async fn cmd_inquiry(url: &str, how: &ConnectArgs, json: bool) -> anyhow::Result<()> {
    let u = NvmeUrl::parse_subsystem(url)?;
    let c = nvme::connect(url, how).await?;
    let ns = c.namespace(u.nsid).await;
    c.shutdown().await;
    let q = identity(&c, &ns?);
    if json {
        out!("{}", serde_json::to_string_pretty(&q)?);
        return Ok(());
    }
    out!("Subsystem NQN: {}", q.subnqn);
    out!("Host NQN:      {}", q.hostnqn);
    out!("Controller ID: {}", q.cntlid);
    out!("Model:         {}", q.model);
    out!("Serial:        {}", q.serial);
    out!("Firmware:      {}", q.firmware);
    out!("NVMe version:  {}", q.version);
    out!("Namespaces:    {}", q.namespaces);
    out!(
        "MDTS:          {}",
        q.mdts_bytes
            .map_or("no limit".to_string(), |b| format!("{b} bytes"))
    );
    out!(
        "Write cache:   {}",
        if q.volatile_write_cache {
            "volatile"
        } else {
            "none"
        }
    );
    out!(
        "Commands:      {}{}",
        if q.write_zeroes { "Write Zeroes " } else { "" },
        if q.dataset_management {
            "Dataset Management"
        } else {
            ""
        }
    );
    out!("Namespace:     {}", q.nsid);
    out!(
        "Size:          {} ({} blocks of {} bytes)",
        indicatif::BinaryBytes(q.capacity_bytes),
        q.blocks,
        q.block_size
    );
    if let Some(g) = &q.nguid {
        out!("NGUID:         {g}");
    }
    if let Some(e) = &q.eui64 {
        out!("EUI-64:        {e}");
    }
    if let Some(id) = &q.uuid {
        out!("UUID:          {id}");
    }
    Ok(())
}
