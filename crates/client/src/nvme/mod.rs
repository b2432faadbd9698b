//! The NVMe/TCP transport: a namespace of an NVMe-oF subsystem over TCP
//! (`nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN[/NSID][?hostnqn=NQN]`), driven
//! over `ethersan_nvme`'s sans-I/O host core.
//!
//! - [`url`]: the URL form.
//! - [`queue`]: one connection (queue pair) under tokio.
//! - [`controller`]: the admin queue (Connect, enable, Identify, Keep
//!   Alive), I/O queues, the Discovery log.
//! - [`NvmeTarget`]: a namespace as a [`BlockTarget`], over one or more
//!   I/O queues (commands spread round-robin).
//!
//! The host NQN is `?hostnqn=`, else `/etc/nvme/hostnqn`, else
//! `nqn.2014-08.org.nvmexpress:uuid:<UUID>` with the UUID taken from the
//! machine ID (`/etc/machine-id`), so that it stays the same across runs.

pub mod controller;
pub mod error;
pub mod queue;
pub mod url;

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use ethersan_nvme::host::commands;

pub use controller::{Controller, Identity, Namespace};
pub use error::NvmeError;
pub use ethersan_nvme::host::parse::{DiscoveryLog, DiscoveryRecord};
pub use ethersan_nvme::identify::{
    ControllerInfo, NamespaceId, NamespaceInfo, ONCS_DSM, ONCS_WRITE_ZEROES,
};
pub use queue::QueueConn;
pub use url::NvmeUrl;

use crate::options::ConnectArgs;
use crate::target::{BlockTarget, BoxFuture, Capabilities, OpenOptions};

/// The NVMe/TCP transport: `nvme+tcp://` URLs.
pub static TRANSPORT: crate::target::Transport = crate::target::Transport {
    name: "nvme",
    schemes: &[url::SCHEME],
    forms: "nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN[/NSID]",
    open: open_target,
};

/// Whether a command-line argument is an `nvme+tcp://` URL.
pub fn is_nvme_url(s: &str) -> bool {
    s.starts_with(url::SCHEME)
}

/// Largest transfer per command this client asks for.
const MAX_TRANSFER: u64 = 1 << 20;

/// A UUID as text, 8-4-4-4-12.
fn uuid_text(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// 16 bytes from 32 hex digits (dashes ignored).
fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|&c| c != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// The machine's stable UUID: from the machine ID (made a version 4
/// form), else from the host name.
fn machine_uuid() -> [u8; 16] {
    let id = ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .find_map(|p| uuid_bytes(std::fs::read_to_string(p).ok()?.trim()));
    let mut b = id.unwrap_or_else(|| {
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let mut b = [0u8; 16];
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (i, c) in name.trim().bytes().chain(*b"ethersan").enumerate() {
            h = (h ^ u64::from(c)).wrapping_mul(0x0100_0000_01b3);
            b[i % 16] ^= h as u8;
        }
        b
    });
    b[6] = b[6] & 0x0F | 0x40;
    b[8] = b[8] & 0x3F | 0x80;
    b
}

/// The host NQN and host ID to connect as: `hostnqn` if given, else
/// `/etc/nvme/hostnqn`, else one made from the machine's UUID; the host
/// ID from `/etc/nvme/hostid`, else that UUID.
pub fn host_identity(hostnqn: Option<&str>) -> (String, [u8; 16]) {
    let uuid = machine_uuid();
    let host_id = std::fs::read_to_string("/etc/nvme/hostid")
        .ok()
        .and_then(|s| uuid_bytes(s.trim()))
        .unwrap_or(uuid);
    let nqn = hostnqn.map(str::to_string).unwrap_or_else(|| {
        std::fs::read_to_string("/etc/nvme/hostnqn")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| s.starts_with("nqn.") && s.len() <= 223)
            .unwrap_or_else(|| format!("nqn.2014-08.org.nvmexpress:uuid:{}", uuid_text(&uuid)))
    });
    (nqn, host_id)
}

/// Who connects to what a URL names.
pub fn identity_of(u: &NvmeUrl) -> Identity {
    let (hostnqn, host_id) = host_identity(u.hostnqn.as_deref());
    Identity {
        header_digest: u.header_digest,
        data_digest: u.data_digest,
        kato_ms: controller::KATO_MS,
        addr: u.address(),
        subnqn: u.subnqn.clone(),
        hostnqn,
        host_id,
    }
}

/// Connects to the controller a URL names (admin queue, enabled,
/// identified).
pub async fn connect(url: &str, how: &ConnectArgs) -> anyhow::Result<Controller> {
    let u = NvmeUrl::parse(url)?;
    Ok(Controller::connect(identity_of(&u), how.timeout.0).await?)
}

/// The Discovery log of the discovery controller at `url`
/// (`nvme+tcp://HOST[:PORT]`).
pub async fn discover(url: &str, how: &ConnectArgs) -> anyhow::Result<DiscoveryLog> {
    let c = connect(url, how).await?;
    let log = c.discovery_log().await;
    c.shutdown().await;
    Ok(log?)
}

/// A namespace over one or more I/O queues.
#[derive(Debug)]
pub struct NvmeTarget {
    /// The controller.
    pub controller: Controller,
    /// The namespace.
    pub namespace: Namespace,
    io: Vec<QueueConn>,
    next: AtomicUsize,
    max_transfer: u64,
}

impl NvmeTarget {
    /// Identifies namespace `nsid` of `controller` and connects I/O
    /// queues 1 to `queues`.
    pub async fn open(
        controller: Controller,
        nsid: u32,
        queues: u16,
    ) -> Result<NvmeTarget, NvmeError> {
        let namespace = controller.namespace(nsid).await?;
        let mut io = Vec::new();
        for qid in 1..=queues.max(1) {
            io.push(controller.io_queue(qid).await?);
        }
        let bs = u64::from(namespace.block_size);
        let max_transfer = controller
            .max_data_transfer()
            .unwrap_or(MAX_TRANSFER)
            .min(MAX_TRANSFER)
            .min(bs * 65_536)
            .max(bs)
            / bs
            * bs;
        Ok(NvmeTarget {
            controller,
            namespace,
            io,
            next: AtomicUsize::new(0),
            max_transfer,
        })
    }

    /// The I/O queue for the next command (round-robin).
    fn queue(&self) -> &QueueConn {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        &self.io[i % self.io.len()]
    }

    /// I/O queues connected.
    pub fn queues(&self) -> usize {
        self.io.len()
    }

    fn check(&self, offset: u64, len: u64) -> anyhow::Result<()> {
        let bs = u64::from(self.namespace.block_size);
        anyhow::ensure!(
            offset.is_multiple_of(bs) && len.is_multiple_of(bs),
            "offset {offset} and length {len} must be multiples of the block size {bs}"
        );
        anyhow::ensure!(
            offset
                .checked_add(len)
                .is_some_and(|e| e <= self.capacity()),
            "{len} bytes at {offset} go past the end of {} ({} bytes)",
            self.name(),
            self.capacity()
        );
        Ok(())
    }

    fn nsid(&self) -> u32 {
        self.namespace.nsid
    }
}

fn open_target<'a>(
    url: &'a str,
    how: &'a ConnectArgs,
    _opts: &'a OpenOptions,
) -> BoxFuture<'a, anyhow::Result<Box<dyn BlockTarget>>> {
    Box::pin(async move {
        let u = NvmeUrl::parse_subsystem(url)?;
        let c = Controller::connect(identity_of(&u), how.timeout.0).await?;
        Ok(Box::new(NvmeTarget::open(c, u.nsid, u.queues).await?) as Box<dyn BlockTarget>)
    })
}

impl BlockTarget for NvmeTarget {
    fn name(&self) -> String {
        format!(
            "namespace {} of {} at {}",
            self.nsid(),
            self.controller.who.subnqn,
            self.controller.who.addr
        )
    }

    fn file_name(&self) -> String {
        format!("ns{}", self.nsid())
    }

    fn block_size(&self) -> u64 {
        u64::from(self.namespace.block_size)
    }

    fn capacity(&self) -> u64 {
        self.namespace.info.nsze * self.block_size()
    }

    fn max_transfer(&self) -> u64 {
        self.max_transfer
    }

    fn capabilities(&self) -> Capabilities {
        let oncs = self.controller.info.oncs;
        Capabilities {
            fua: true,
            write_zeroes: oncs & ONCS_WRITE_ZEROES != 0,
            // Write Zeroes with DEAC: zeroed and possibly deallocated.
            unmap: oncs & ONCS_WRITE_ZEROES != 0,
            splits: true,
            sessions: false,
            logout: true,
        }
    }

    fn read(
        &self,
        offset: u64,
        len: usize,
        spare: Vec<u8>,
    ) -> BoxFuture<'_, anyhow::Result<Vec<u8>>> {
        Box::pin(async move {
            self.check(offset, len as u64)?;
            let bs = self.block_size();
            let mut out = spare;
            out.clear();
            out.reserve(len);
            let mut done = 0u64;
            while done < len as u64 {
                let n = (len as u64 - done).min(self.max_transfer);
                let slba = (offset + done) / bs;
                let c = self
                    .queue()
                    .call_ok(
                        "Read",
                        commands::read(self.nsid(), slba, (n / bs) as u32, bs as u32),
                    )
                    .await?;
                out.extend_from_slice(&c.data);
                done += n;
            }
            Ok(out)
        })
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            self.check(offset, data.len() as u64)?;
            let bs = self.block_size();
            for (i, piece) in data.chunks(self.max_transfer as usize).enumerate() {
                let slba = (offset + i as u64 * self.max_transfer) / bs;
                let blocks = (piece.len() as u64 / bs) as u32;
                self.queue()
                    .call_ok(
                        "Write",
                        commands::write(self.nsid(), slba, blocks, piece.to_vec(), fua),
                    )
                    .await?;
            }
            Ok(())
        })
    }

    fn flush(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            self.queue()
                .call_ok("Flush", commands::flush(self.nsid()))
                .await?;
            Ok(())
        })
    }

    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        unmap: bool,
    ) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            if !self.capabilities().write_zeroes {
                return crate::target::write_zero_buffers(self, offset, len).await;
            }
            self.check(offset, len)?;
            let bs = self.block_size();
            let mut done = 0;
            while done < len {
                let blocks = ((len - done) / bs).min(65_536);
                let slba = (offset + done) / bs;
                self.queue()
                    .call_ok(
                        "Write Zeroes",
                        commands::write_zeroes(self.nsid(), slba, blocks as u32, unmap),
                    )
                    .await?;
                done += blocks * bs;
            }
            Ok(())
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move { self.controller.shutdown().await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids() {
        let b = uuid_bytes("0123456789abcdef0123456789ABCDEF").unwrap();
        assert_eq!(uuid_text(&b), "01234567-89ab-cdef-0123-456789abcdef");
        assert_eq!(uuid_bytes(&uuid_text(&b)), Some(b));
        assert_eq!(uuid_bytes("xyz"), None);
        assert_eq!(uuid_bytes("0123456789abcdef0123456789abcdeg"), None);
    }

    #[test]
    fn host_nqn_is_stable_and_overridable() {
        let (a, id_a) = host_identity(None);
        let (b, id_b) = host_identity(None);
        assert_eq!((a.as_str(), id_a), (b.as_str(), id_b));
        assert!(a.starts_with("nqn."), "{a}");
        let (c, _) = host_identity(Some("nqn.2014-08.org.example:me"));
        assert_eq!(c, "nqn.2014-08.org.example:me");
    }
}
