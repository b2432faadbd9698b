//! The AoE initiator's end of an Ethernet segment, for the tests of the
//! AoE target: ethersan's AoE protocol core driven over a unix datagram
//! segment (QEMU's `-netdev dgram`) or a packet link, discovery, config
//! queries and many commands in flight.

use std::path::Path;
use std::time::{Duration, Instant};

use ethersan_aoe::initiator::{
    discovery_frame, parse_config_response, query_config_frame, AtaRequest, CommandError,
    TargetInfo,
};
use ethersan_aoe::{Initiator, InitiatorConfig, Mac};
use ethersan_link::unix::{UnixDgramConfig, UnixDgramLink};
use ethersan_link::{Link, MacAddr};

/// The AoE initiator's end of the segment.
pub struct Wire {
    /// The link frames go over.
    pub link: Link,
    /// The initiator's MAC.
    pub mac: Mac,
}

impl Wire {
    /// Over a packet link (a veth end in a namespace).
    pub fn packet(link: ethersan_link::packet::PacketLink) -> Wire {
        let link: Link = link.into();
        let mac = Mac(link.mac().0);
        Wire { link, mac }
    }

    /// Over a unix datagram segment in `dir` (`client.sock` ↔
    /// `target.sock`), with this MAC.
    pub fn open(dir: &Path, mac: MacAddr) -> Wire {
        let link = UnixDgramLink::open(UnixDgramConfig {
            mac: Some(mac),
            ..UnixDgramConfig::new(dir.join("client.sock"), dir.join("target.sock"))
        })
        .unwrap();
        Wire {
            link: link.into(),
            mac: Mac(mac.0),
        }
    }

    /// Frames received within `wait`.
    pub async fn collect(&self, wait: Duration) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + wait;
        while let Ok(r) =
            tokio::time::timeout_at(deadline, self.link.recv_batch(|f| got.push(f.to_vec()))).await
        {
            r.unwrap();
        }
        got
    }

    /// Every device that answers a broadcast Query Config.
    pub async fn discover(&self) -> Vec<TargetInfo> {
        self.link
            .send(&discovery_frame(self.mac, 0x7000_0001))
            .await
            .unwrap();
        let mut found: Vec<TargetInfo> = self
            .collect(Duration::from_millis(700))
            .await
            .iter()
            .filter_map(|f| parse_config_response(f).ok())
            .collect();
        found.sort_by_key(|t| (t.shelf, t.slot));
        // The target's start-up announcement may come as well.
        found.dedup_by_key(|t| (t.shelf, t.slot));
        found
    }

    /// A config query to one device; its answer, if any.
    pub async fn config(
        &self,
        dev: &TargetInfo,
        cmd: ethersan_aoe::config::ConfigCommand,
        s: &[u8],
    ) -> Option<Result<TargetInfo, ethersan_aoe::initiator::ResponseError>> {
        let q = query_config_frame(self.mac, dev.mac, dev.shelf, dev.slot, cmd, s, 0x7100_0000);
        self.link.send(&q).await.unwrap();
        self.collect(Duration::from_millis(500))
            .await
            .iter()
            .map(|f| parse_config_response(f))
            .next()
    }

    /// Run `reqs` against `dev` with many in flight; each one's data or
    /// error.
    pub async fn run(
        &self,
        dev: &TargetInfo,
        reqs: Vec<AtaRequest>,
    ) -> Vec<Result<Vec<u8>, CommandError>> {
        let mut cfg = InitiatorConfig::new(self.mac);
        cfg.mtu = self.link.mtu();
        cfg.max_retries = 3;
        cfg.initial_tag = 0x100;
        let mut init = Initiator::new(cfg, dev.clone());
        let mut index = std::collections::HashMap::new();
        for (i, r) in reqs.into_iter().enumerate() {
            index.insert(init.submit(r).unwrap(), i);
        }
        let mut out: Vec<Option<Result<Vec<u8>, CommandError>>> = vec![None; index.len()];
        let deadline = Instant::now() + Duration::from_secs(60);
        while out.iter().any(Option::is_none) {
            assert!(Instant::now() < deadline, "AoE commands did not finish");
            while let Some(f) = init.poll_transmit(Instant::now()) {
                self.link.send(&f).await.unwrap();
            }
            let wake = init
                .poll_timeout()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
            let mut done = Vec::new();
            let got = tokio::time::timeout_at(
                tokio::time::Instant::from_std(wake),
                self.link.recv_batch(|f| {
                    if let Some(c) = init.on_frame(f, Instant::now()) {
                        done.push((c.handle, c.result.map(|r| f[r.data].to_vec())));
                    }
                }),
            )
            .await;
            if got.is_err() {
                for c in init.on_timeout(Instant::now()) {
                    done.push((c.handle, c.result.map(|_| Vec::new())));
                }
            }
            for (h, r) in done {
                out[index[&h]] = Some(r);
            }
        }
        out.into_iter().map(Option::unwrap).collect()
    }
}

/// Every command's data, in order; panics naming the first that failed.
pub fn ok_all(rs: Vec<Result<Vec<u8>, CommandError>>) -> Vec<u8> {
    rs.into_iter()
        .enumerate()
        .flat_map(|(i, r)| r.unwrap_or_else(|e| panic!("command {i}: {e}")))
        .collect()
}
