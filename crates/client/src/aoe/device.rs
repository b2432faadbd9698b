//! [`AoeDevice`]: an AoE target device as a byte-addressed block device.
//!
//! One tokio task (the driver) owns the [`Initiator`] state and receives on
//! the link; callers hand it batches of ATA commands over a channel and
//! wait for each command's answer. The driver's loop is Crucible's
//! select→apply: [`Driver::select`] waits for one [`Event`] (frames, new
//! requests, the retransmission timer) and [`Driver::apply`] acts on it
//! synchronously; then whatever the window lets out is sent. Requests
//! larger than one frame carries are split here, into as many commands as
//! needed, all queued at once: the initiator's window decides how many are
//! in flight.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use ethersan_aoe::ata::{parse_identify, IdentifyInfo};
use ethersan_aoe::config::ConfigCommand;
use ethersan_aoe::initiator::{
    discovery_frame, parse_config_response, query_config_frame, AtaRequest, CommandError, Handle,
    SubmitError, TargetInfo,
};
use ethersan_aoe::{Initiator, InitiatorConfig, Mac};
use ethersan_link::{Link, LinkError};
use tokio::sync::{mpsc, oneshot};

use crate::options::Timeout;

/// Sector size of every AoE device.
pub const SECTOR: u64 = 512;

/// Commands handed to the initiator at once beyond which the rest wait in
/// the driver's backlog (the initiator scans its commands on every timer
/// check; the window, at most 64, is far below this).
const FEED: usize = 256;

/// How long opening a device waits for its Query Config answer at most.
const QUERY_WAIT: Duration = Duration::from_secs(3);

/// How often the Query Config is repeated while waiting.
const QUERY_EVERY: Duration = Duration::from_millis(250);

/// Why one command failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Failure {
    /// The target answered with an error, or never answered.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// The initiator refused the command (a bug in the splitting here).
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// The link failed; the driver has stopped.
    #[error("the link failed: {0}")]
    Link(Arc<LinkError>),
    /// The driver is gone (after a link failure).
    #[error("the AoE driver task has stopped")]
    Stopped,
}

type Reply = oneshot::Sender<Result<Vec<u8>, Failure>>;

/// Commands for the driver, with where each answer goes.
type Batch = Vec<(AtaRequest, Reply)>;

/// What callers send the driver.
enum Control {
    /// Commands to send.
    Commands(Batch),
    /// Use LBA48 commands (the default) or LBA28 ones, as IDENTIFY says.
    Lba48(bool),
}

/// One thing that happened, as the driver's `select` saw it.
enum Event {
    /// Frames were received; these completions came of them.
    Received(Vec<(Handle, Result<Vec<u8>, CommandError>)>),
    /// The link failed.
    LinkFailed(LinkError),
    /// A caller sent something; `None`: every handle is gone.
    Requests(Option<Control>),
    /// The retransmission timer is due.
    Timer,
}

/// The driver's state: the initiator, and who waits for what.
struct Driver {
    link: Arc<Link>,
    init: Initiator,
    requests: mpsc::UnboundedReceiver<Control>,
    open: bool,
    backlog: VecDeque<(AtaRequest, Reply)>,
    waiting: HashMap<Handle, Reply>,
}

impl Driver {
    async fn run(mut self) {
        loop {
            self.forget_abandoned();
            self.feed();
            if let Err(e) = self.transmit().await {
                self.fail_all(e);
                return;
            }
            if !self.open && self.waiting.is_empty() && self.backlog.is_empty() {
                return;
            }
            let event = self.select().await;
            if let Event::LinkFailed(e) = event {
                self.fail_all(e);
                return;
            }
            self.apply(event, Instant::now());
        }
    }

    /// Forget the commands whose callers gave up (their `--timeout` ran
    /// out and they reported the failure): none of them may be sent, or
    /// sent again, later — a write reported failed must not land after
    /// newer data once the target answers again.
    fn forget_abandoned(&mut self) {
        self.backlog.retain(|(_, reply)| !reply.is_closed());
        let init = &mut self.init;
        self.waiting.retain(|h, reply| {
            if reply.is_closed() {
                init.cancel(*h);
                false
            } else {
                true
            }
        });
    }

    /// Move backlog into the initiator up to [`FEED`] outstanding.
    fn feed(&mut self) {
        while self.init.outstanding() < FEED {
            let Some((req, reply)) = self.backlog.pop_front() else {
                break;
            };
            match self.init.submit(req) {
                Ok(h) => {
                    self.waiting.insert(h, reply);
                }
                Err(e) => {
                    let _ = reply.send(Err(e.into()));
                }
            }
        }
    }

    /// Send every frame the window lets out, as one batch.
    async fn transmit(&mut self) -> Result<(), LinkError> {
        let now = Instant::now();
        let mut out = Vec::new();
        while let Some(f) = self.init.poll_transmit(now) {
            out.push(f);
        }
        if !out.is_empty() {
            self.link.send_batch(&out).await?;
        }
        Ok(())
    }

    async fn select(&mut self) -> Event {
        let deadline = self.init.poll_timeout();
        let sleep = tokio::time::sleep_until(
            deadline
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
                .into(),
        );
        let (link, init, requests) = (&self.link, &mut self.init, &mut self.requests);
        let mut done = Vec::new();
        // A response's data is copied out while the frame is borrowed from
        // the ring; nothing else of it is kept.
        let received = link.recv_batch(|f| {
            if let Some(c) = init.on_frame(f, Instant::now()) {
                done.push((c.handle, c.result.map(|r| f[r.data].to_vec())));
            }
        });
        tokio::select! {
            r = received => match r {
                Ok(_) => Event::Received(done),
                Err(e) => Event::LinkFailed(e),
            },
            b = requests.recv(), if self.open => Event::Requests(b),
            _ = sleep, if deadline.is_some() => Event::Timer,
        }
    }

    fn apply(&mut self, event: Event, now: Instant) {
        match event {
            Event::Received(done) => {
                for (h, r) in done {
                    if let Some(reply) = self.waiting.remove(&h) {
                        let _ = reply.send(r.map_err(Failure::from));
                    }
                }
            }
            Event::Requests(Some(first)) => {
                let mut next = Some(first);
                while let Some(c) = next {
                    match c {
                        Control::Commands(batch) => self.backlog.extend(batch),
                        Control::Lba48(on) => self.init.set_lba48(on),
                    }
                    next = self.requests.try_recv().ok();
                }
            }
            Event::Requests(None) => self.open = false,
            Event::Timer => {
                for c in self.init.on_timeout(now) {
                    if let Some(reply) = self.waiting.remove(&c.handle) {
                        let _ = reply.send(c.result.map(|_| Vec::new()).map_err(Failure::from));
                    }
                }
            }
            Event::LinkFailed(_) => unreachable!("handled by run"),
        }
    }

    fn fail_all(&mut self, e: LinkError) {
        let e = Arc::new(e);
        self.init.abort_all();
        let waiting = self.waiting.drain().map(|(_, r)| r);
        for reply in waiting.chain(self.backlog.drain(..).map(|(_, r)| r)) {
            let _ = reply.send(Err(Failure::Link(e.clone())));
        }
    }
}

/// An AoE target device, reached over a link.
#[derive(Debug)]
pub struct AoeDevice {
    /// How messages name it, e.g. `AoE device e0.1 on eth0`.
    name: String,
    requests: mpsc::UnboundedSender<Control>,
    driver: tokio::task::JoinHandle<()>,
    /// Its Query Config answer.
    pub target: TargetInfo,
    /// Its IDENTIFY DEVICE data, decoded.
    pub identify: IdentifyInfo,
    /// The 512 bytes of IDENTIFY DEVICE data.
    pub identify_data: Vec<u8>,
    /// Sectors per command (the target's limit and the link's MTU).
    pub max_sectors: u8,
    /// Our MTU.
    pub mtu: usize,
    /// The longest wait for one read, write or flush.
    timeout: Timeout,
}

/// The initiator's settings for a link: its MAC and MTU, a tag seeded at
/// random (so a late answer to a previous run's command is not taken for
/// a new one's).
pub fn initiator_config(link: &Link) -> InitiatorConfig {
    let mut cfg = InitiatorConfig::new(Mac(link.mac().0));
    cfg.mtu = link.mtu();
    cfg.initial_tag = fastrand::u32(..);
    cfg
}

/// Retransmissions for `timeout`: about as many as fit in it at the RTO
/// ceiling, so that a target restarting within a long timeout
/// (`attach --block`'s reconnect window) is waited for instead of given
/// up after `cfg`'s few (about 28 s at the defaults), and a command the
/// caller gave up on is not sent long after (a late write must not land
/// after its error was reported). Never fewer than `cfg`'s.
pub(crate) fn retries_for(cfg: &InitiatorConfig, timeout: Timeout) -> u32 {
    let Some(t) = timeout.0 else {
        return u32::MAX;
    };
    let per = cfg.max_rto.as_secs_f64().max(0.001);
    let fit = (t.as_secs_f64() / per).ceil().min(f64::from(u32::MAX)) as u32;
    fit.max(cfg.max_retries)
}

impl AoeDevice {
    /// Find the device `shelf.slot` on `link` (Query Config to broadcast)
    /// and attach to the first that answers.
    pub async fn open(
        link: Link,
        name: String,
        shelf: u16,
        slot: u8,
        timeout: Timeout,
    ) -> anyhow::Result<AoeDevice> {
        let link = Arc::new(link);
        let wait = timeout.0.map_or(QUERY_WAIT, |t| t.min(QUERY_WAIT));
        let local = Mac(link.mac().0);
        let give_up = Instant::now() + wait;
        let mut found = None;
        while found.is_none() && Instant::now() < give_up {
            let q = query_config_frame(
                local,
                Mac::BROADCAST,
                shelf,
                slot,
                ConfigCommand::Read,
                b"",
                fastrand::u32(..),
            );
            link.send(&q).await?;
            let round = (Instant::now() + QUERY_EVERY).min(give_up);
            while found.is_none() {
                let got = tokio::time::timeout_at(
                    round.into(),
                    link.recv_batch(|f| {
                        if let Ok(t) = parse_config_response(f) {
                            if (t.shelf, t.slot) == (shelf, slot) && found.is_none() {
                                found = Some(t);
                            }
                        }
                    }),
                )
                .await;
                match got {
                    Ok(r) => {
                        r?;
                    }
                    Err(_) => break,
                }
            }
        }
        let Some(target) = found else {
            bail!(
                "{name}: no answer to Query Config within {:.1} s (is the target running and exporting shelf {shelf} slot {slot}? `ethersan discover --aoe LINK` lists the devices that answer)",
                wait.as_secs_f64()
            );
        };
        let mut cfg = initiator_config(&link);
        cfg.max_retries = retries_for(&cfg, timeout);
        AoeDevice::attach(link, target, cfg, name, timeout).await
    }

    /// Start a driver for `target` on `link` and IDENTIFY it. Only one
    /// device may receive on a link at a time: [`close`](Self::close) one
    /// before attaching the next.
    pub async fn attach(
        link: Arc<Link>,
        target: TargetInfo,
        cfg: InitiatorConfig,
        name: String,
        timeout: Timeout,
    ) -> anyhow::Result<AoeDevice> {
        let mtu = cfg.mtu;
        let init = Initiator::new(cfg, target.clone());
        let max_sectors = init.max_sectors();
        let (tx, rx) = mpsc::unbounded_channel();
        let driver = tokio::spawn(
            Driver {
                link,
                init,
                requests: rx,
                open: true,
                backlog: VecDeque::new(),
                waiting: HashMap::new(),
            }
            .run(),
        );
        let mut dev = AoeDevice {
            name,
            requests: tx,
            driver,
            target,
            identify: parse_identify(&[0; 512]).expect("512 bytes parse"),
            identify_data: Vec::new(),
            max_sectors,
            mtu,
            timeout,
        };
        // A device that cannot be brought up stops its driver at once: it
        // must not go on taking frames off the shared link.
        let data = match dev.run("IDENTIFY DEVICE", vec![AtaRequest::Identify]).await {
            Ok(mut d) => d.remove(0),
            Err(e) => {
                dev.driver.abort();
                return Err(e);
            }
        };
        dev.identify = match parse_identify(&data) {
            Ok(i) => i,
            Err(e) => {
                dev.driver.abort();
                anyhow::bail!("{}: IDENTIFY DEVICE: {e}", dev.name);
            }
        };
        if !dev.identify.lba48 {
            // The initiator's commands are LBA48 until told otherwise.
            let _ = dev.requests.send(Control::Lba48(false));
        }
        dev.identify_data = data;
        Ok(dev)
    }

    /// How messages name the device.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.identify.sectors * SECTOR
    }

    /// Bytes one command carries.
    pub fn frame_bytes(&self) -> usize {
        usize::from(self.max_sectors) * SECTOR as usize
    }

    /// Send `reqs` together and wait for all their answers (in order),
    /// within the `--timeout`.
    async fn run(&self, what: &str, reqs: Vec<AtaRequest>) -> anyhow::Result<Vec<Vec<u8>>> {
        let mut batch = Vec::with_capacity(reqs.len());
        let mut answers = Vec::with_capacity(reqs.len());
        let mut firsts = Vec::with_capacity(reqs.len());
        for r in reqs {
            let (tx, rx) = oneshot::channel();
            firsts.push(match &r {
                AtaRequest::Read { lba, .. } | AtaRequest::Write { lba, .. } => Some(*lba),
                _ => None,
            });
            batch.push((r, tx));
            answers.push(rx);
        }
        self.requests
            .send(Control::Commands(batch))
            .map_err(|_| anyhow::anyhow!("{}: {what}: {}", self.name, Failure::Stopped))?;
        let all = async {
            let mut out = Vec::with_capacity(answers.len());
            for (rx, lba) in answers.into_iter().zip(firsts) {
                let r = rx.await.unwrap_or(Err(Failure::Stopped));
                out.push(r.map_err(|e| self.failure(what, lba, e))?);
            }
            Ok(out)
        };
        match self.timeout.0 {
            None => all.await,
            Some(t) => tokio::time::timeout(t, all).await.unwrap_or_else(|_| {
                bail!(
                    "{}: {what} got no answer within {:.1} s (--timeout; is the target still up and reachable?)",
                    self.name,
                    t.as_secs_f64()
                )
            }),
        }
    }

    fn failure(&self, what: &str, lba: Option<u64>, e: Failure) -> anyhow::Error {
        let at = lba.map(|l| format!(" at sector {l}")).unwrap_or_default();
        match e {
            Failure::Command(CommandError::TimedOut(n)) => anyhow::anyhow!(
                "{}: {what}{at}: no response after {n} retransmissions (is the target still up and reachable?)",
                self.name
            ),
            e => anyhow::anyhow!("{}: {what}{at}: {e}", self.name),
        }
    }

    fn check(&self, offset: u64, len: usize) -> anyhow::Result<()> {
        if !offset.is_multiple_of(SECTOR) || !(len as u64).is_multiple_of(SECTOR) {
            bail!(
                "{}: offset {offset} and length {len} must be multiples of the 512-byte sector",
                self.name
            );
        }
        if offset + len as u64 > self.capacity() {
            bail!(
                "{}: {len} bytes at byte {offset} go beyond the end of the device ({} bytes)",
                self.name,
                self.capacity()
            );
        }
        Ok(())
    }

    /// Read `len` bytes at `offset` (both multiples of 512), into `spare`
    /// (its allocation reused, its contents dropped).
    pub async fn read(&self, offset: u64, len: usize, spare: Vec<u8>) -> anyhow::Result<Vec<u8>> {
        self.check(offset, len)?;
        let per = u64::from(self.max_sectors);
        let (first, end) = (offset / SECTOR, (offset + len as u64) / SECTOR);
        let reqs = (first..end)
            .step_by(per as usize)
            .map(|lba| AtaRequest::Read {
                lba,
                sectors: (end - lba).min(per) as u8,
            })
            .collect();
        let parts = self.run("READ", reqs).await?;
        let mut out = spare;
        out.clear();
        out.reserve(len);
        for p in parts {
            out.extend_from_slice(&p);
        }
        Ok(out)
    }

    /// Write `data` at `offset` (both multiples of 512).
    pub async fn write(&self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        self.check(offset, data.len())?;
        let first = offset / SECTOR;
        let reqs = data
            .chunks(self.frame_bytes())
            .enumerate()
            .map(|(i, c)| AtaRequest::Write {
                lba: first + (i * usize::from(self.max_sectors)) as u64,
                data: c.to_vec(),
            })
            .collect();
        self.run("WRITE", reqs).await.map(|_| ())
    }

    /// FLUSH CACHE EXT, when the device says its write cache is on (with
    /// it off, every write is already durable when answered).
    pub async fn flush(&self) -> anyhow::Result<()> {
        if !self.identify.write_cache {
            return Ok(());
        }
        self.run("FLUSH CACHE", vec![AtaRequest::Flush])
            .await
            .map(|_| ())
    }

    /// Stop the driver once its commands are answered or given up, and
    /// wait for it (the link is then free for another device).
    pub async fn close(self) {
        drop(self.requests);
        let _ = self.driver.await;
    }
}

/// Broadcast a Query Config on `link` and collect the distinct devices
/// that answer within `wait`, sorted by shelf, slot and MAC.
pub async fn discover(link: &Link, wait: Duration) -> anyhow::Result<Vec<TargetInfo>> {
    let local = Mac(link.mac().0);
    let give_up = Instant::now() + wait;
    let mut found: Vec<TargetInfo> = Vec::new();
    link.send(&discovery_frame(local, fastrand::u32(..)))
        .await?;
    // Once more a little later: a lost query or answer costs nothing then.
    let mut again = Some(Instant::now() + wait / 3);
    loop {
        let until = again.map_or(give_up, |a| a.min(give_up));
        let got = tokio::time::timeout_at(
            until.into(),
            link.recv_batch(|f| {
                if let Ok(t) = parse_config_response(f) {
                    if !found
                        .iter()
                        .any(|o| (o.mac, o.shelf, o.slot) == (t.mac, t.shelf, t.slot))
                    {
                        found.push(t);
                    }
                }
            }),
        )
        .await;
        match got {
            Ok(r) => {
                r?;
            }
            Err(_) if again.is_some_and(|a| a < give_up) => {
                again = None;
                link.send(&discovery_frame(local, fastrand::u32(..)))
                    .await?;
            }
            Err(_) => break,
        }
    }
    found.sort_by_key(|t| (t.shelf, t.slot, t.mac.0));
    Ok(found)
}
