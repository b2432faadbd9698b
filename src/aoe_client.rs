//! `ethersan discover --aoe LINK`, and `ls`/`inquiry` of an AoE URL.

use std::sync::Arc;
use std::time::Duration;

use ethersan_aoe::initiator::TargetInfo;
use serde::Serialize;

use ethersan_client::aoe::{initiator_config, open, open_link, AoeDevice, AoeLink};
use ethersan_client::{ConnectArgs, Timeout};

/// How long `discover --aoe` listens for answers unless `--timeout` is
/// given.
pub(crate) const DISCOVER_WAIT: Duration = Duration::from_secs(1);

/// One device as `discover --aoe` and `ls` print it.
#[derive(Serialize, Debug)]
struct DeviceInfo {
    shelf: u16,
    slot: u8,
    mac: String,
    capacity_bytes: Option<u64>,
    sectors: Option<u64>,
    model: Option<String>,
    serial: Option<String>,
    firmware: Option<String>,
    buffer_count: u16,
    sectors_per_frame: u8,
    firmware_version: u16,
    aoe_version: u8,
    config: String,
    /// Why IDENTIFY failed, when it did (discover lists the device anyway).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl DeviceInfo {
    fn new(t: &TargetInfo, dev: Result<&AoeDevice, String>) -> DeviceInfo {
        let ok = dev.as_ref().ok();
        DeviceInfo {
            shelf: t.shelf,
            slot: t.slot,
            mac: t.mac.to_string(),
            capacity_bytes: ok.map(|d| d.capacity()),
            sectors: ok.map(|d| d.identify.sectors),
            model: ok.map(|d| d.identify.model.clone()),
            serial: ok.map(|d| d.identify.serial.clone()),
            firmware: ok.map(|d| d.identify.firmware.clone()),
            buffer_count: t.buffer_count,
            sectors_per_frame: ok.map_or(t.max_sectors, |d| d.max_sectors),
            firmware_version: t.firmware_version,
            aoe_version: t.aoe_version,
            config: String::from_utf8_lossy(&t.config).into_owned(),
            error: dev.err(),
        }
    }

    fn line(&self) -> String {
        let size = match self.capacity_bytes {
            Some(c) => format!("{} ({c} bytes)", indicatif::BinaryBytes(c)),
            None => format!("IDENTIFY failed: {}", self.error.as_deref().unwrap_or("?")),
        };
        format!(
            "e{}.{}  {size}  mac {}  buffers {}  sectors/frame {}  firmware {:#06x}  config {:?}",
            self.shelf,
            self.slot,
            self.mac,
            self.buffer_count,
            self.sectors_per_frame,
            self.firmware_version,
            self.config
        )
    }
}

/// `ethersan discover --aoe LINK`: every device that answers a broadcast
/// Query Config, with its IDENTIFY capacity.
/// `timeout_given`: `--timeout` (or `$ETHERSAN_TIMEOUT`) was set, and is
/// how long to listen (`0`, forever, means the default).
pub(crate) async fn cmd_discover(
    spec: &str,
    how: &ConnectArgs,
    timeout_given: bool,
    json: bool,
) -> anyhow::Result<()> {
    let spec = AoeLink::parse(spec).map_err(anyhow::Error::msg)?;
    let link = Arc::new(open_link(&spec)?);
    let wait = match how.timeout.0 {
        Some(t) if timeout_given => t,
        _ => DISCOVER_WAIT,
    };
    let found = ethersan_client::aoe::discover(&link, wait).await?;
    let mut list = Vec::with_capacity(found.len());
    for t in &found {
        let name = format!("AoE device e{}.{} on {spec}", t.shelf, t.slot);
        // One device at a time receives on the link.
        let timeout = Timeout(Some(how.timeout.0.unwrap_or(Duration::from_secs(5))));
        match AoeDevice::attach(
            link.clone(),
            t.clone(),
            initiator_config(&link),
            name,
            timeout,
        )
        .await
        {
            Ok(dev) => {
                list.push(DeviceInfo::new(t, Ok(&dev)));
                dev.close().await;
            }
            Err(e) => list.push(DeviceInfo::new(t, Err(format!("{e:#}")))),
        }
    }
    if json {
        out!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for d in &list {
            out!("{}", d.line());
        }
    }
    if list.is_empty() {
        // Nothing found is a failure (exit status 1), as for every form
        // of discover.
        anyhow::bail!(
            "no AoE device answered on {spec} within {:.1} s",
            wait.as_secs_f64()
        );
    }
    Ok(())
}

/// `ethersan ls aoe://…`: the one device.
pub(crate) async fn cmd_ls(url: &str, how: &ConnectArgs, json: bool) -> anyhow::Result<()> {
    let dev = open(url, how).await?;
    let info = DeviceInfo::new(&dev.target, Ok(&dev));
    if json {
        out!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        out!("{}", info.line());
        out!(
            "    model {:?}  serial {:?}  firmware {:?}",
            dev.identify.model,
            dev.identify.serial,
            dev.identify.firmware
        );
    }
    dev.close().await;
    Ok(())
}

/// `inquiry`'s JSON: the decoded IDENTIFY data and the config answer.
#[derive(Serialize)]
struct Inquiry {
    shelf: u16,
    slot: u8,
    mac: String,
    sectors: u64,
    capacity_bytes: u64,
    lba48: bool,
    write_cache: bool,
    model: String,
    serial: String,
    firmware: String,
    buffer_count: u16,
    sectors_per_frame: u8,
    firmware_version: u16,
    aoe_version: u8,
    config: String,
    /// The 256 IDENTIFY words, little-endian as on the wire.
    identify_words: Vec<u16>,
}

/// `ethersan inquiry aoe://…`: IDENTIFY DEVICE decoded, and the config
/// string.
pub(crate) async fn cmd_inquiry(url: &str, how: &ConnectArgs, json: bool) -> anyhow::Result<()> {
    let dev = open(url, how).await?;
    let (t, id) = (&dev.target, &dev.identify);
    let q = Inquiry {
        shelf: t.shelf,
        slot: t.slot,
        mac: t.mac.to_string(),
        sectors: id.sectors,
        capacity_bytes: dev.capacity(),
        lba48: id.lba48,
        write_cache: id.write_cache,
        model: id.model.clone(),
        serial: id.serial.clone(),
        firmware: id.firmware.clone(),
        buffer_count: t.buffer_count,
        sectors_per_frame: dev.max_sectors,
        firmware_version: t.firmware_version,
        aoe_version: t.aoe_version,
        config: String::from_utf8_lossy(&t.config).into_owned(),
        identify_words: dev
            .identify_data
            .chunks(2)
            .map(|w| u16::from_le_bytes([w[0], w[1]]))
            .collect(),
    };
    if json {
        out!("{}", serde_json::to_string_pretty(&q)?);
    } else {
        out!("device:            e{}.{} at {}", q.shelf, q.slot, q.mac);
        out!("model:             {}", q.model);
        out!("serial:            {}", q.serial);
        out!("firmware:          {}", q.firmware);
        out!(
            "capacity:          {} sectors, {} ({} bytes)",
            q.sectors,
            indicatif::BinaryBytes(q.capacity_bytes),
            q.capacity_bytes
        );
        out!("LBA48:             {}", q.lba48);
        out!("write cache:       {}", q.write_cache);
        out!("AoE version:       {}", q.aoe_version);
        out!("firmware version:  {:#06x}", q.firmware_version);
        out!("buffer count:      {}", q.buffer_count);
        out!(
            "sectors per frame: {} (MTU {})",
            q.sectors_per_frame,
            dev.mtu
        );
        out!("config string:     {:?}", q.config);
    }
    dev.close().await;
    Ok(())
}
