//! Client subcommands: discover, ls, inquiry — built on the initiator library.

use anyhow::bail;
use std::sync::atomic::{AtomicBool, Ordering};

use ethersan_channel::Level;
use ethersan_client::iscsi::luns::{command, it_has, no_such_lun, report_luns};
use ethersan_client::iscsi::{login, login_error, LoggedIn};
use ethersan_client::native::{level_too_low, LevelTooLow};
use ethersan_client::options::CLIENT_IQN;
use ethersan_client::url::IscsiUrl;
use ethersan_client::ConnectArgs;
use ethersan_initiator::{discover_with, LoginOptions, Session};
use serde::Serialize;

/// The portal and the credentials a `discover` argument names:
/// `HOST[:PORT]`, `USER:SECRET@HOST[:PORT]` or an iscsi:// URL. The
/// credentials never appear in an error.
fn portal_of(spec: &str) -> anyhow::Result<(String, Option<IscsiUrl>)> {
    if spec.contains("://") {
        let u = IscsiUrl::parse(spec)?;
        return Ok((u.portal(), Some(u)));
    }
    let (creds, hostport) = match spec.rsplit_once('@') {
        Some((c, h)) => (Some(c), h),
        None => (None, spec),
    };
    let portal = if hostport.starts_with('[') {
        if hostport.contains("]:") {
            hostport.to_string()
        } else {
            format!("{hostport}:3260")
        }
    } else if hostport.matches(':').count() == 1 {
        hostport.to_string()
    } else if hostport.contains(':') {
        format!("[{hostport}]:3260")
    } else {
        format!("{hostport}:3260")
    };
    let url = match creds {
        None => None,
        Some(c) => {
            let Some((user, secret)) = c.split_once(':').or_else(|| c.split_once('%')) else {
                bail!("discover USER:SECRET@HOST: the part before '@' must be USER:SECRET");
            };
            let mut u = IscsiUrl::parse(&format!("iscsi://{portal}")).map_err(|_| {
                anyhow::anyhow!("discover: bad portal {portal:?}: give HOST[:PORT]")
            })?;
            u.user = Some(user.to_string());
            u.secret = Some(secret.to_string());
            Some(u)
        }
    };
    Ok((portal, url))
}

#[derive(Serialize)]
struct DiscoveredTarget {
    name: String,
    portals: Vec<String>,
}

/// `ethersan discover HOST[:PORT]`
pub(crate) async fn cmd_discover(
    portal: &str,
    how: &ConnectArgs,
    json: bool,
) -> anyhow::Result<()> {
    let (addr, url) = portal_of(portal)?;
    let opts = how.options(None)?;
    // Credentials in the argument win over --chap, as in a URL.
    let opts = match &url {
        Some(u) => LoginOptions {
            chap: how.options(Some(u))?.chap,
            ..opts
        },
        None => opts,
    };
    let found = discover_with(&addr, &opts)
        .await
        .map_err(|e| login_error(e, "discovery", &addr))?;
    let list: Vec<DiscoveredTarget> = found
        .into_iter()
        .map(|(name, portals)| DiscoveredTarget { name, portals })
        .collect();
    if json {
        out!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for t in &list {
            out!("{}", t.name);
            for p in &t.portals {
                out!("    {p}");
            }
        }
    }
    if list.is_empty() {
        // Nothing found is a failure (exit status 1), as for every form
        // of discover.
        bail!("the portal at {addr} offers no targets (SendTargets listed none): the server serves none, or none to this initiator ({})", CLIENT_IQN);
    }
    Ok(())
}

fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches([' ', '\0'])
        .to_string()
}

#[derive(Serialize, Default)]
struct LunInfo {
    lun: u64,
    peripheral_type: u8,
    vendor: String,
    product: String,
    revision: String,
    serial: Option<String>,
    blocks: Option<u64>,
    block_size: Option<u32>,
    capacity_bytes: Option<u64>,
    designators: Vec<String>,
    vpd_pages: Vec<u8>,
    /// Block Limits (VPD 0xB0), decoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    block_limits: Option<BlockLimits>,
    /// Block Device Characteristics (VPD 0xB1): medium rotation rate
    /// (1 = non-rotating).
    #[serde(skip_serializing_if = "Option::is_none")]
    rotation_rate: Option<u16>,
    /// Logical Block Provisioning (VPD 0xB2), decoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    provisioning: Option<Provisioning>,
}

/// One row of `ls`: a LUN, or a LUN the native transport channel's
/// security level is too low for (only its number and the level it needs
/// are known).
#[derive(Serialize)]
#[serde(untagged)]
enum Listed {
    Lun(Box<LunInfo>),
    NeedsSecurity { lun: u64, needs_security: String },
}

/// VPD 0xB0 fields (in logical blocks; 0 = no limit reported).
#[derive(Serialize, Default, Debug)]
struct BlockLimits {
    max_transfer_blocks: u32,
    optimal_transfer_blocks: u32,
    max_compare_and_write_blocks: u8,
    max_unmap_blocks: u32,
    unmap_granularity_blocks: u32,
    max_write_same_blocks: u64,
}

/// VPD 0xB2 flags.
#[derive(Serialize, Default, Debug)]
struct Provisioning {
    unmap: bool,
    write_same_16_unmap: bool,
    write_same_10_unmap: bool,
    reads_zero_after_unmap: bool,
    thin: bool,
}

fn be32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |x| u32::from_be_bytes(x.try_into().expect("4 bytes")))
}

async fn inquiry_data(
    s: &Session,
    lun: u64,
    evpd: bool,
    page: u8,
    changed: &AtomicBool,
) -> anyhow::Result<Vec<u8>> {
    let cdb = [0x12, evpd as u8, page, 0x10, 0x00, 0];
    let r = command(s, lun, &cdb, 4096, changed).await?;
    if r.status != 0 {
        bail!(
            "INQUIRY page {page:#x} on LUN {lun}: status {:#x} sense {:?}",
            r.status,
            r.sense_key()
        );
    }
    Ok(r.data)
}

async fn lun_info(
    s: &Session,
    channel: Option<Level>,
    lun: u64,
    changed: &AtomicBool,
) -> anyhow::Result<LunInfo> {
    let tur = s.clear_unit_attention(lun).await?;
    if let Some(e) = level_too_low(channel, lun, &tur) {
        return Err(e.into());
    }
    let std = inquiry_data(s, lun, false, 0, changed).await?;
    // SPC-4 §6.6.2: a LUN that is not there answers INQUIRY with the
    // peripheral qualifier 011b (no device can be attached here).
    if std.first().is_some_and(|b| b >> 5 == 0b011) {
        bail!(no_such_lun(s, lun).await);
    }
    if std.len() < 36 {
        bail!("short INQUIRY data ({} bytes)", std.len());
    }
    let mut info = LunInfo {
        lun,
        peripheral_type: std[0] & 0x1f,
        vendor: ascii(&std[8..16]),
        product: ascii(&std[16..32]),
        revision: ascii(&std[32..36]),
        ..Default::default()
    };
    if let Ok(p0) = inquiry_data(s, lun, true, 0x00, changed).await {
        let n = p0.get(3).copied().unwrap_or(0) as usize;
        info.vpd_pages = p0.iter().skip(4).take(n).copied().collect();
    }
    if let Ok(p80) = inquiry_data(s, lun, true, 0x80, changed).await {
        let n = p80.get(3).copied().unwrap_or(0) as usize;
        info.serial = Some(ascii(&p80[4..(4 + n).min(p80.len())]));
    }
    if let Ok(p83) = inquiry_data(s, lun, true, 0x83, changed).await {
        let end = (4 + u16::from_be_bytes([p83[2], p83[3]]) as usize).min(p83.len());
        let mut at = 4;
        while at + 4 <= end {
            let code_set = p83[at] & 0x0f;
            let kind = p83[at + 1] & 0x0f;
            let len = p83[at + 3] as usize;
            let body = &p83[at + 4..(at + 4 + len).min(end)];
            let kind_name = match kind {
                1 => "t10",
                2 => "eui64",
                3 => "naa",
                4 => "relative-port",
                5 => "port-group",
                8 => "scsi-name",
                _ => "other",
            };
            let text = if code_set == 2 || code_set == 3 {
                ascii(body)
            } else {
                body.iter().map(|b| format!("{b:02x}")).collect()
            };
            info.designators.push(format!("{kind_name}: {text}"));
            at += 4 + len;
        }
    }
    if info.vpd_pages.contains(&0xb0) {
        if let Ok(p) = inquiry_data(s, lun, true, 0xb0, changed).await {
            info.block_limits = Some(BlockLimits {
                max_compare_and_write_blocks: p.get(5).copied().unwrap_or(0),
                max_transfer_blocks: be32(&p, 8),
                optimal_transfer_blocks: be32(&p, 12),
                max_unmap_blocks: be32(&p, 20),
                unmap_granularity_blocks: be32(&p, 28),
                max_write_same_blocks: p
                    .get(36..44)
                    .map_or(0, |x| u64::from_be_bytes(x.try_into().expect("8 bytes"))),
            });
        }
    }
    if info.vpd_pages.contains(&0xb1) {
        if let Ok(p) = inquiry_data(s, lun, true, 0xb1, changed).await {
            info.rotation_rate = p.get(4..6).map(|x| u16::from_be_bytes([x[0], x[1]]));
        }
    }
    if info.vpd_pages.contains(&0xb2) {
        if let Ok(p) = inquiry_data(s, lun, true, 0xb2, changed).await {
            let f = p.get(5).copied().unwrap_or(0);
            info.provisioning = Some(Provisioning {
                unmap: f & 0x80 != 0,
                write_same_16_unmap: f & 0x40 != 0,
                write_same_10_unmap: f & 0x20 != 0,
                reads_zero_after_unmap: f & 0x04 != 0,
                thin: p.get(6).is_some_and(|t| t & 0x07 == 2),
            });
        }
    }
    if info.peripheral_type == 0 {
        if let Ok((blocks, bs)) = read_capacity(s, lun, changed).await {
            info.blocks = Some(blocks);
            info.block_size = Some(bs);
            info.capacity_bytes = Some(blocks * u64::from(bs));
        }
    }
    Ok(info)
}

/// READ CAPACITY (16): (number of blocks, block size).
async fn read_capacity(s: &Session, lun: u64, changed: &AtomicBool) -> anyhow::Result<(u64, u32)> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x9e;
    cdb[1] = 0x10;
    cdb[13] = 32;
    let r = command(s, lun, &cdb, 32, changed).await?;
    ethersan_client::scsi::check("READ CAPACITY(16)", &r)?;
    anyhow::ensure!(r.data.len() >= 12, "READ CAPACITY(16): short data");
    let last = u64::from_be_bytes(r.data[0..8].try_into()?);
    let bs = u32::from_be_bytes(r.data[8..12].try_into()?);
    Ok((last + 1, bs))
}

fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", units[i])
}

/// `ethersan ls URL`: the target's LUNs with capacity and identity.
pub(crate) async fn cmd_ls(url: &str, how: &ConnectArgs, json: bool) -> anyhow::Result<()> {
    let u = IscsiUrl::parse(url)?;
    // A URL that ends in a LUN number lists that LUN alone.
    let one = u.has_lun;
    let LoggedIn {
        session: s,
        channel,
    } = login(&u, how).await?;
    let listed = async {
        // The target's LUNs changing while they are listed (REPORTED LUNS
        // DATA HAS CHANGED on the way): list them again, a few times.
        for _ in 0..3 {
            let changed = AtomicBool::new(false);
            let mut luns = report_luns(&s, &changed).await?;
            if one {
                if !luns.contains(&u.lun) {
                    bail!("the target has no LUN {} ({})", u.lun, it_has(&luns));
                }
                luns = vec![u.lun];
            }
            let mut infos = Vec::new();
            // LUNs the channel's security level is too low for: listed with
            // the level they need, and the command fails after the list.
            let mut refused = Vec::new();
            let mut again = false;
            for lun in luns {
                match lun_info(&s, channel, lun, &changed).await {
                    Ok(i) => infos.push(Listed::Lun(Box::new(i))),
                    Err(e) => match e.downcast::<LevelTooLow>() {
                        Ok(r) => {
                            infos.push(Listed::NeedsSecurity {
                                lun,
                                needs_security: r.needed.to_string(),
                            });
                            refused.push(r);
                        }
                        // Removed since the list was read: read it again.
                        Err(_) if changed.load(Ordering::Relaxed) => {
                            again = true;
                            break;
                        }
                        Err(e) => return Err(e),
                    },
                }
            }
            if !again && !changed.load(Ordering::Relaxed) {
                return Ok((infos, refused));
            }
        }
        bail!("the target's LUNs kept changing while they were listed: run ethersan ls again")
    }
    .await;
    let _ = s.logout().await;
    let (infos, refused) = listed?;
    if json {
        out!("{}", serde_json::to_string_pretty(&infos)?);
    } else {
        out!(
            "{:<5} {:<10} {:<10} {:<17} {:>10} {:>6}  serial",
            "LUN",
            "type",
            "vendor",
            "product",
            "size",
            "bs"
        );
        for i in &infos {
            let i = match i {
                Listed::Lun(i) => i,
                Listed::NeedsSecurity {
                    lun,
                    needs_security,
                } => {
                    out!("{lun:<5} (needs a channel at security={needs_security})");
                    continue;
                }
            };
            out!(
                "{:<5} {:<10} {:<10} {:<17} {:>10} {:>6}  {}",
                i.lun,
                if i.peripheral_type == 0 {
                    "disk".to_string()
                } else {
                    format!("{:#x}", i.peripheral_type)
                },
                i.vendor,
                i.product,
                i.capacity_bytes.map(human).unwrap_or_default(),
                i.block_size.map(|b| b.to_string()).unwrap_or_default(),
                i.serial.clone().unwrap_or_default()
            );
        }
    }
    match refused.as_slice() {
        [] => Ok(()),
        [one] => Err(anyhow::anyhow!("{one}")),
        [first, ..] => {
            let needed = refused
                .iter()
                .map(|r| r.needed)
                .max()
                .unwrap_or(first.needed);
            let each: Vec<String> = refused
                .iter()
                .map(|r| format!("LUN {} security={}", r.lun, r.needed))
                .collect();
            bail!(
                "{} LUNs need a channel of a higher security level than this one's ({}): {}; connect with ?security={needed} in the URL",
                refused.len(),
                first.channel,
                each.join(", ")
            )
        }
    }
}

/// `ethersan inquiry URL`: one LUN's INQUIRY data and VPD pages.
pub(crate) async fn cmd_inquiry(url: &str, how: &ConnectArgs, json: bool) -> anyhow::Result<()> {
    let u = IscsiUrl::parse(url)?;
    let LoggedIn {
        session: s,
        channel,
    } = login(&u, how).await?;
    let info = lun_info(&s, channel, u.lun, &AtomicBool::new(false)).await;
    let _ = s.logout().await;
    let info = info?;
    if json {
        out!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        out!("LUN:          {}", info.lun);
        out!(
            "Type:         {}",
            if info.peripheral_type == 0 {
                "direct-access block device"
            } else {
                "other"
            }
        );
        out!("Vendor:       {}", info.vendor);
        out!("Product:      {}", info.product);
        out!("Revision:     {}", info.revision);
        if let Some(s) = &info.serial {
            out!("Serial:       {s}");
        }
        if let (Some(b), Some(bs)) = (info.blocks, info.block_size) {
            out!(
                "Capacity:     {} ({} blocks of {} bytes)",
                human(b * u64::from(bs)),
                b,
                bs
            );
        }
        let pages: Vec<String> = info.vpd_pages.iter().map(|p| format!("{p:#04x}")).collect();
        out!("VPD pages:    {}", pages.join(" "));
        if let Some(b) = &info.block_limits {
            out!(
                "Block limits: max transfer {} blocks, optimal {}, COMPARE AND WRITE {}, UNMAP {} (granularity {}), WRITE SAME {}",
                b.max_transfer_blocks,
                b.optimal_transfer_blocks,
                b.max_compare_and_write_blocks,
                b.max_unmap_blocks,
                b.unmap_granularity_blocks,
                b.max_write_same_blocks
            );
        }
        if let Some(r) = info.rotation_rate {
            out!(
                "Medium:       {}",
                match r {
                    1 => "non-rotating (solid state or memory)".to_string(),
                    0 => "rotation rate not reported".to_string(),
                    n => format!("{n} rpm"),
                }
            );
        }
        if let Some(p) = &info.provisioning {
            out!(
                "Provisioning: {}{}{}{}",
                if p.thin { "thin" } else { "full" },
                if p.unmap { ", UNMAP" } else { "" },
                if p.write_same_16_unmap || p.write_same_10_unmap {
                    ", WRITE SAME with UNMAP"
                } else {
                    ""
                },
                if p.reads_zero_after_unmap {
                    ", unmapped blocks read as zeros"
                } else {
                    ""
                }
            );
        }
        for d in &info.designators {
            out!("Designator:   {d}");
        }
    }
    Ok(())
}
