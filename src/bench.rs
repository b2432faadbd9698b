//! `ethersan bench TARGET`: a load generator for a LUN over iSCSI, an AoE
//! device or a local file or block device, with one engine so that network
//! and local figures compare directly.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use ethersan_backend::file::{FileDevice, FileOptions, IoEngine};
use ethersan_backend::{BlockDevice, IoRequest, IoResult, Submission};
use ethersan_initiator::IscsiUrl;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::aoe_client::AoeDevice;
use crate::blockio::{login, Lun};
use crate::cp::parse_bytes;

/// The access pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Pattern {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Uniformly random reads.
    Randread,
    /// Uniformly random writes.
    Randwrite,
    /// Random reads and writes, `--read-pct` percent reads.
    Mixed,
}

/// The I/O engine for a local target (`--engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum EngineArg {
    /// Blocking pread/pwrite on the blocking thread pool.
    Sync,
    /// io_uring: asynchronous submission from one ring thread.
    Uring,
}

/// Arguments of `ethersan bench`.
#[derive(Args, Debug, Clone)]
pub(crate) struct BenchArgs {
    /// iscsi://host[:port]/IQN/LUN, eth://IFACE/IQN/LUN, udp://HOST[:PORT]/IQN/LUN,
    /// aoe://IFACE/SHELF.SLOT,
    /// aoe+unix://SHELF.SLOT?local=PATH&peer=PATH, or a local file or block
    /// device (the same engine, in-process).
    target: String,
    /// Access pattern.
    #[arg(long, value_enum, default_value = "randread")]
    rw: Pattern,
    /// Percentage of reads for --rw mixed.
    #[arg(long, default_value_t = 70, value_parser = clap::value_parser!(u8).range(0..=100))]
    read_pct: u8,
    /// Size of each I/O (e.g. 4K, 128K), or a weighted mix of sizes, each
    /// I/O drawing its size from it: SIZE:WEIGHT,... (weights relative,
    /// whole numbers > 0), e.g. 512:10,4K:60,64K:30.
    #[arg(long, default_value = "4K", value_parser = parse_mix)]
    bs: SizeMix,
    /// Iometer's "% random": each I/O goes to a random offset with this
    /// probability, else right after the previous I/O (wrapping at the end
    /// of --size). Default: 100 for randread, randwrite and mixed; 0 for
    /// read and write.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
    random_pct: Option<u8>,
    /// Commands in flight per session (per worker group for a local target;
    /// for AoE, I/Os in flight, each split into frames the window sends).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=1024))]
    qd: u16,
    /// Sessions (separate logins) to spread the load over.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    sessions: u16,
    /// How long to run (e.g. 10s, 500ms, 2m); ignored with --ios.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    time: Duration,
    /// Stop after this many I/Os instead of after --time.
    #[arg(long)]
    ios: Option<u64>,
    /// Bytes of the device to use, from offset 0 (default: all of it).
    #[arg(long, value_parser = parse_bytes)]
    size: Option<u64>,
    /// Writes with FUA (forced unit access).
    #[arg(long)]
    fua: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// I/O engine for a local FILE, as a LUN's `engine` key (default: the
    /// server's default engine). For an iscsi:// target set it on the LUN.
    #[arg(long, value_enum)]
    engine: Option<EngineArg>,
    /// Open a local FILE with O_DIRECT (bypass the page cache), as a LUN's
    /// `direct = true`.
    #[arg(long)]
    direct: bool,
    #[command(flatten)]
    connect: crate::blockio::ConnectArgs,
}

/// A duration: a number with an optional ms, s or m suffix (seconds by default).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad duration {s:?} (e.g. 10s, 500ms, 2m)"))?;
    if !(v > 0.0 && v.is_finite()) {
        return Err(format!("bad duration {s:?}: must be positive"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// The size of each I/O: one size, or sizes with relative weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SizeMix {
    /// (bytes, weight), weights > 0, in the order given.
    items: Vec<(u64, u64)>,
    /// The sum of the weights.
    total: u64,
}

impl SizeMix {
    fn sizes(&self) -> impl Iterator<Item = u64> + '_ {
        self.items.iter().map(|&(s, _)| s)
    }

    fn max(&self) -> u64 {
        self.sizes().max().unwrap_or(0)
    }

    /// The one size when this is not a mix.
    fn single(&self) -> Option<u64> {
        match self.items.as_slice() {
            [(s, _)] => Some(*s),
            _ => None,
        }
    }

    /// A size drawn with the weights' probabilities.
    fn draw(&self, rng: &mut fastrand::Rng) -> u64 {
        if let Some(s) = self.single() {
            return s;
        }
        let mut x = rng.u64(0..self.total);
        for &(size, weight) in &self.items {
            if x < weight {
                return size;
            }
            x -= weight;
        }
        unreachable!("x < total")
    }

    /// As given on the command line, in the K/M form.
    fn text(&self) -> String {
        match self.single() {
            Some(s) => size_text(s),
            None => self
                .items
                .iter()
                .map(|&(s, w)| format!("{}:{w}", size_text(s)))
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

const MIX_FORM: &str =
    "expected SIZE or SIZE:WEIGHT,SIZE:WEIGHT,... (e.g. 4K or 512:10,4K:60,64K:30; weights are whole numbers > 0)";

/// `--bs`: one size (`4K`), or a comma list of SIZE:WEIGHT.
pub(crate) fn parse_mix(s: &str) -> Result<SizeMix, String> {
    let s = s.trim();
    if !s.contains([',', ':']) {
        let size = parse_bytes(s).map_err(|e| format!("{e}; {MIX_FORM}"))?;
        if size == 0 {
            return Err(format!("an I/O size must be more than 0; {MIX_FORM}"));
        }
        return Ok(SizeMix {
            items: vec![(size, 1)],
            total: 1,
        });
    }
    let mut items = Vec::new();
    for item in s.split(',') {
        let bad = |why: &str| format!("bad item {:?} in the mix ({why}): {MIX_FORM}", item.trim());
        let Some((size, weight)) = item.split_once(':') else {
            return Err(bad("no :WEIGHT"));
        };
        let size = parse_bytes(size.trim()).map_err(|e| bad(&e))?;
        if size == 0 {
            return Err(bad("a size of 0"));
        }
        let weight: u64 = weight
            .trim()
            .parse()
            .map_err(|_| bad("the weight is not a whole number"))?;
        if weight == 0 {
            return Err(bad("a weight of 0"));
        }
        if weight > u64::from(u32::MAX) {
            return Err(bad("the weight is too large"));
        }
        items.push((size, weight));
    }
    let total = items.iter().map(|&(_, w)| w).sum();
    Ok(SizeMix { items, total })
}

/// The alignment of an I/O's offset: its size, at most 4 KiB, and at least
/// the block size (so that O_DIRECT works for sizes of 4 KiB and more).
fn alignment(size: u64, block: u64) -> u64 {
    size.min(4096).max(block)
}

/// Where each I/O goes: at random with probability `random_pct`%, else
/// right after the previous I/O (of any worker: one stream, as Iometer's
/// worker with many I/Os outstanding), wrapping at `span`.
struct Offsets {
    span: u64,
    random_pct: u8,
    /// The end of the previous I/O.
    cursor: AtomicU64,
}

impl Offsets {
    fn new(span: u64, random_pct: u8) -> Offsets {
        Offsets {
            span,
            random_pct,
            cursor: AtomicU64::new(0),
        }
    }

    /// The offset of an I/O of `size` bytes (at most `span`), a multiple of
    /// `align`.
    fn next(&self, rng: &mut fastrand::Rng, size: u64, align: u64) -> u64 {
        let random = match self.random_pct {
            0 => false,
            100.. => true,
            p => rng.u8(0..100) < p,
        };
        if random {
            let off = rng.u64(0..=(self.span - size) / align) * align;
            self.cursor.store(off + size, Ordering::Relaxed);
            return off;
        }
        let mut off = 0;
        self.cursor
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |end| {
                off = end.next_multiple_of(align);
                if off + size > self.span {
                    off = 0;
                }
                Some(off + size)
            })
            .expect("the closure always updates");
        off
    }
}

/// The CPU time (user + system) this process has used so far.
fn process_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid `who` and a pointer to a live rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Latency figures in microseconds.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Latency {
    mean: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

/// One benchmark's result.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Report {
    target: String,
    engine: &'static str,
    rw: Pattern,
    read_pct: u8,
    /// The I/O size, or the largest size of a mix.
    bs: u64,
    /// The mix of sizes, SIZE:WEIGHT,... (absent for one size).
    #[serde(skip_serializing_if = "Option::is_none")]
    bs_mix: Option<String>,
    /// The percentage of I/Os at a random offset (the rest sequential).
    random_pct: u8,
    qd: u16,
    sessions: u16,
    seconds: f64,
    ios: u64,
    reads: u64,
    writes: u64,
    /// Bytes moved (the sum of the I/Os' sizes).
    bytes: u64,
    /// This process's user + system CPU time over the run (for a local
    /// target, the in-process engine's).
    client_cpu_s: f64,
    client_cpu_us_per_io: f64,
    /// For a local target: the I/O engine ("sync" or "uring") and whether
    /// O_DIRECT was used.
    #[serde(skip_serializing_if = "Option::is_none")]
    io_engine: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    direct: Option<bool>,
    iops: f64,
    mb_per_s: f64,
    latency_us: Latency,
}

/// Where the I/O goes.
#[derive(Clone)]
enum Engine {
    /// One LUN handle per session.
    Iscsi(Vec<Lun>),
    /// An AoE device.
    Aoe(Arc<AoeDevice>),
    /// The backend's file engine, in-process.
    Local(Arc<FileDevice>),
}

impl Engine {
    fn capacity(&self) -> u64 {
        match self {
            Engine::Iscsi(l) => l[0].capacity(),
            Engine::Aoe(d) => d.capacity(),
            Engine::Local(d) => d.num_blocks() * u64::from(d.block_size()),
        }
    }

    fn block_size(&self) -> u64 {
        match self {
            Engine::Iscsi(l) => u64::from(l[0].block_size),
            Engine::Aoe(_) => crate::aoe_client::SECTOR,
            Engine::Local(d) => u64::from(d.block_size()),
        }
    }
}

/// What one worker does per I/O.
struct Worker {
    engine: Engine,
    session: usize,
    buf: Vec<u8>,
    data: Bytes,
    fua: bool,
    /// Where this worker's pending local requests complete (one in flight
    /// at a time), made once so that a submission allocates no channel.
    done: Completions,
}

/// A worker's completion channel for a local engine.
struct Completions {
    tx: tokio::sync::mpsc::UnboundedSender<IoResult>,
    rx: tokio::sync::mpsc::UnboundedReceiver<IoResult>,
}

impl Completions {
    fn new() -> Completions {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        Completions { tx, rx }
    }
}

impl Worker {
    async fn read(&mut self, offset: u64, size: u64) -> anyhow::Result<()> {
        match &self.engine {
            // Through the LUN's one command path, which sends a command
            // answered with a unit attention (a live `ctl lun add` on the
            // target) again instead of stopping the run.
            Engine::Iscsi(luns) => {
                luns[self.session].read(offset, size as usize).await?;
                Ok(())
            }
            Engine::Aoe(d) => {
                d.read(offset, size as usize).await?;
                Ok(())
            }
            // As the server does: one submission, which finishes on this
            // thread when the data is at hand (page cache), goes to the
            // ring (io_uring) or comes back as a job for the blocking pool
            // (sync). The worker's buffer is reused, never zeroed.
            Engine::Local(dev) => {
                let len = size as usize;
                let buf = std::mem::take(&mut self.buf);
                let req = IoRequest::Read { offset, len, buf };
                self.buf = submit_local(dev, req, &mut self.done)
                    .await
                    .context("read")?;
                Ok(())
            }
        }
    }

    async fn write(&mut self, offset: u64, size: u64) -> anyhow::Result<()> {
        match &self.engine {
            Engine::Iscsi(luns) => {
                luns[self.session]
                    .write(offset, self.data.slice(..size as usize), self.fua)
                    .await
            }
            Engine::Aoe(d) => d.write(offset, &self.data[..size as usize]).await,
            Engine::Local(dev) => {
                let req = IoRequest::Write {
                    offset,
                    data: self.data[..size as usize].to_vec(),
                    len: size as usize,
                    fua: self.fua,
                };
                submit_local(dev, req, &mut self.done)
                    .await
                    .context("write")?;
                Ok(())
            }
        }
    }
}

/// One request through a local device's engine, as the server submits a
/// READ or WRITE: done now, pending on the ring, or a blocking job.
async fn submit_local(
    dev: &FileDevice,
    req: IoRequest,
    done: &mut Completions,
) -> anyhow::Result<Vec<u8>> {
    let tx = done.tx.clone();
    let r = match dev.submit(req, Box::new(move |r| drop(tx.send(r)))) {
        Submission::Done(r) => {
            // Done without an await: let the timer and other tasks run.
            tokio::task::yield_now().await;
            r
        }
        Submission::Pending => done
            .rx
            .recv()
            .await
            .context("the engine dropped a request")?,
        Submission::Blocking(job) => tokio::task::spawn_blocking(job).await?,
    };
    Ok(r?)
}

async fn open_engine(a: &BenchArgs) -> anyhow::Result<(Engine, &'static str)> {
    if crate::blockio::is_iscsi_url(&a.target) {
        if a.engine.is_some() || a.direct {
            bail!("--engine and --direct apply to a local FILE; for an iscsi://, eth:// or udp:// target set engine and direct on the server's LUN");
        }
        let url = IscsiUrl::parse(&a.target)?;
        let mut luns = Vec::with_capacity(usize::from(a.sessions));
        let known = Arc::default();
        for _ in 0..a.sessions {
            let session = login(&url, &a.connect).await?;
            luns.push(Lun::on_known(session, url.lun, Arc::clone(&known)).await?);
        }
        return Ok((Engine::Iscsi(luns), "iscsi"));
    }
    if crate::aoe_client::is_aoe_url(&a.target) {
        if a.engine.is_some() || a.direct {
            bail!("--engine and --direct apply to a local FILE, not to an AoE device");
        }
        if a.sessions != 1 {
            bail!("--sessions applies to iSCSI; an AoE device is driven by one initiator: raise --qd instead");
        }
        if a.fua {
            bail!("--fua: ATA writes over AoE have no FUA; leave it out for an AoE device");
        }
        let dev = crate::aoe_client::open(&a.target, &a.connect).await?;
        return Ok((Engine::Aoe(Arc::new(dev)), "aoe"));
    }
    let writes = !matches!(a.rw, Pattern::Read | Pattern::Randread);
    let path = Path::new(&a.target);
    if !path.exists() {
        bail!(
            "{}: no such file or block device (or give an iscsi:// URL)",
            path.display()
        );
    }
    let opts = FileOptions {
        size: None,
        block_size: 512,
        read_only: !writes,
        preallocate: false,
        direct: a.direct,
        engine: match a.engine {
            Some(EngineArg::Sync) => IoEngine::Sync,
            Some(EngineArg::Uring) => IoEngine::Uring,
            None => ethersan_server::config::DEFAULT_ENGINE,
        },
    };
    let dev = FileDevice::open(path, &opts).with_context(|| path.display().to_string())?;
    Ok((Engine::Local(Arc::new(dev)), "local"))
}

/// Run one benchmark and return its figures.
pub(crate) async fn run(a: &BenchArgs) -> anyhow::Result<Report> {
    let (engine, engine_name) = open_engine(a).await?;
    let block = engine.block_size();
    for size in a.bs.sizes() {
        if size < block {
            bail!(
                "--bs: an I/O of {} is smaller than the target's block size {block}: use sizes of {} or more",
                size_text(size),
                size_text(block)
            );
        }
        if !size.is_multiple_of(block) {
            bail!(
                "--bs: {} is not a multiple of the target's block size {block}",
                size_text(size)
            );
        }
    }
    let max_size = a.bs.max();
    if let Engine::Iscsi(luns) = &engine {
        let limit = luns[0].max_transfer;
        if max_size > limit {
            bail!(
                "--bs: an I/O of {} is more than the LUN takes in one command ({})",
                size_text(max_size),
                size_text(limit)
            );
        }
    }
    let span = match a.size {
        Some(n) if n > engine.capacity() => bail!(
            "--size {n} is more than the target holds ({} bytes): give --size {} or less",
            engine.capacity(),
            engine.capacity()
        ),
        Some(n) => n,
        None => engine.capacity(),
    };
    if span < max_size {
        bail!("the target ({span} bytes) is smaller than one {max_size}-byte I/O");
    }
    let random_pct = a.random_pct.unwrap_or(match a.rw {
        Pattern::Read | Pattern::Write => 0,
        Pattern::Randread | Pattern::Randwrite | Pattern::Mixed => 100,
    });
    let offsets = Arc::new(Offsets::new(span, random_pct));
    let workers = usize::from(a.sessions) * usize::from(a.qd);
    let stop = Arc::new(AtomicBool::new(false));
    let budget = a.ios.map(|n| Arc::new(AtomicU64::new(n)));
    let mut pattern = vec![0u8; max_size as usize];
    fastrand::Rng::with_seed(0x5eed).fill(&mut pattern);
    let data = Bytes::from(pattern);
    let cpu_before = process_cpu();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(workers);
    for i in 0..workers {
        let mut w = Worker {
            engine: engine.clone(),
            session: i % usize::from(a.sessions),
            buf: vec![0u8; max_size as usize],
            data: data.clone(),
            fua: a.fua,
            done: Completions::new(),
        };
        let (stop, budget, offsets) = (stop.clone(), budget.clone(), offsets.clone());
        let (rw, read_pct, mix) = (a.rw, a.read_pct, a.bs.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(0x1234_5678 ^ i as u64);
            let mut hist =
                Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3).expect("valid bounds");
            let (mut reads, mut writes, mut bytes) = (0u64, 0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                if let Some(b) = &budget {
                    if b.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1))
                        .is_err()
                    {
                        break;
                    }
                }
                let is_read = match rw {
                    Pattern::Read | Pattern::Randread => true,
                    Pattern::Write | Pattern::Randwrite => false,
                    Pattern::Mixed => rng.u8(0..100) < read_pct,
                };
                let size = mix.draw(&mut rng);
                let offset = offsets.next(&mut rng, size, alignment(size, block));
                let t = Instant::now();
                let r = if is_read {
                    w.read(offset, size).await
                } else {
                    w.write(offset, size).await
                };
                if let Err(e) = r {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                hist.saturating_record(t.elapsed().as_nanos() as u64);
                if is_read {
                    reads += 1;
                } else {
                    writes += 1;
                }
                bytes += size;
            }
            Ok::<_, anyhow::Error>((hist, reads, writes, bytes))
        }));
    }
    if a.ios.is_none() {
        let stop = stop.clone();
        let time = a.time;
        tokio::spawn(async move {
            tokio::time::sleep(time).await;
            stop.store(true, Ordering::Relaxed);
        });
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3).expect("valid bounds");
    let (mut reads, mut writes, mut bytes) = (0u64, 0u64, 0u64);
    let mut first_error = None;
    for t in tasks {
        match t.await? {
            Ok((h, r, w, b)) => {
                hist.add(&h).expect("same bounds");
                reads += r;
                writes += w;
                bytes += b;
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let client_cpu_s = (process_cpu().saturating_sub(cpu_before)).as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    if let Engine::Iscsi(luns) = &engine {
        for l in luns {
            let _ = l.session.logout().await;
        }
    }
    if let Some(e) = first_error {
        return Err(e.context("benchmark stopped"));
    }
    let ios = reads + writes;
    let us = |ns: u64| ns as f64 / 1000.0;
    Ok(Report {
        // A URL's CHAP secret is not printed.
        target: ethersan_initiator::url::redact(&a.target),
        engine: engine_name,
        rw: a.rw,
        read_pct: match a.rw {
            Pattern::Read | Pattern::Randread => 100,
            Pattern::Write | Pattern::Randwrite => 0,
            Pattern::Mixed => a.read_pct,
        },
        bs: max_size,
        bs_mix: a.bs.single().is_none().then(|| a.bs.text()),
        random_pct,
        qd: a.qd,
        sessions: a.sessions,
        seconds,
        ios,
        reads,
        writes,
        bytes,
        client_cpu_s,
        client_cpu_us_per_io: client_cpu_s * 1e6 / ios.max(1) as f64,
        io_engine: match &engine {
            Engine::Local(d) => Some(d.engine().to_string()),
            Engine::Iscsi(_) | Engine::Aoe(_) => None,
        },
        direct: match &engine {
            Engine::Local(d) => Some(d.is_direct()),
            Engine::Iscsi(_) | Engine::Aoe(_) => None,
        },
        iops: ios as f64 / seconds,
        mb_per_s: bytes as f64 / seconds / 1e6,
        latency_us: Latency {
            mean: hist.mean() / 1000.0,
            p50: us(hist.value_at_quantile(0.50)),
            p99: us(hist.value_at_quantile(0.99)),
            p999: us(hist.value_at_quantile(0.999)),
            max: us(hist.max()),
        },
    })
}

fn size_text(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}M", bytes >> 20)
    } else if bytes.is_multiple_of(1024) {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

/// `ethersan bench`.
pub(crate) async fn cmd_bench(a: BenchArgs) -> anyhow::Result<()> {
    let r = run(&a).await?;
    if a.json {
        out!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let mut workload = match r.rw {
        Pattern::Mixed => format!("mixed {}% read", r.read_pct),
        p => format!("{p:?}").to_lowercase(),
    };
    let default_random = if matches!(r.rw, Pattern::Read | Pattern::Write) {
        0
    } else {
        100
    };
    if r.random_pct != default_random {
        workload += &format!(" {}% rnd", r.random_pct);
    }
    out!(
        "{:<7} {:<22} {:>5} {:>4} {:>4} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "engine",
        "workload",
        "bs",
        "qd",
        "sess",
        "IOPS",
        "MB/s",
        "p50 us",
        "p99 us",
        "p99.9 us"
    );
    out!(
        "{:<7} {:<22} {:>5} {:>4} {:>4} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
        r.engine,
        workload,
        if r.bs_mix.is_some() {
            "mix".to_string()
        } else {
            size_text(r.bs)
        },
        r.qd,
        r.sessions,
        r.iops,
        r.mb_per_s,
        r.latency_us.p50,
        r.latency_us.p99,
        r.latency_us.p999
    );
    let local = match (&r.io_engine, r.direct) {
        (Some(e), Some(true)) => format!(" ({e} engine, O_DIRECT)"),
        (Some(e), _) => format!(" ({e} engine)"),
        _ => String::new(),
    };
    out!(
        "{} I/Os ({} reads, {} writes) in {:.2} s against {}{local}",
        r.ios,
        r.reads,
        r.writes,
        r.seconds,
        r.target
    );
    if let Some(mix) = &r.bs_mix {
        out!(
            "sizes (SIZE:WEIGHT): {mix}; {:.1} KiB per I/O on average",
            r.bytes as f64 / r.ios.max(1) as f64 / 1024.0
        );
    }
    out!(
        "client CPU: {:.2} s, {:.1} us per I/O",
        r.client_cpu_s,
        r.client_cpu_us_per_io
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_size_or_a_weighted_mix() {
        assert_eq!(parse_mix("4K").unwrap().single(), Some(4096));
        let m = parse_mix("512:10, 1K:5,64K:10").unwrap();
        assert_eq!(m.items, vec![(512, 10), (1024, 5), (65536, 10)]);
        assert_eq!(m.total, 25);
        assert_eq!(m.max(), 65536);
        assert_eq!(m.single(), None);
        assert_eq!(m.text(), "512:10,1K:5,64K:10");
        // A one-item mix is one size.
        assert_eq!(parse_mix("8K:3").unwrap().single(), Some(8192));
    }

    #[test]
    fn a_malformed_mix_names_the_bad_item_and_the_form() {
        for (bad, item) in [
            ("512:10,4K", "\"4K\""),
            ("512:10,4K:0", "\"4K:0\""),
            ("512:10,4K:x", "\"4K:x\""),
            ("512:10,zz:3", "\"zz:3\""),
            ("0:1,4K:1", "\"0:1\""),
            ("4K:-1", "\"4K:-1\""),
            ("4K:1,", "\"\""),
        ] {
            let e = parse_mix(bad).unwrap_err();
            assert!(e.contains(item), "{bad}: {e}");
            assert!(e.contains("SIZE:WEIGHT"), "{bad}: {e}");
        }
        assert!(parse_mix("0").unwrap_err().contains("SIZE:WEIGHT"));
    }

    #[test]
    fn sizes_are_drawn_with_the_weights() {
        let m = parse_mix("512:10,1K:5,2K:5,4K:60,8K:2,16K:4,32K:4,64K:10").unwrap();
        let mut rng = fastrand::Rng::with_seed(7);
        let n = 200_000;
        let mut counts = std::collections::HashMap::new();
        for _ in 0..n {
            *counts.entry(m.draw(&mut rng)).or_insert(0u64) += 1;
        }
        for &(size, weight) in &m.items {
            let got = counts[&size] as f64 / n as f64;
            let want = weight as f64 / m.total as f64;
            assert!((got - want).abs() < 0.005, "{size}: {got} vs {want}");
        }
        assert_eq!(counts.len(), m.items.len());
    }

    #[test]
    fn random_pct_0_is_strictly_sequential_with_aligned_wrapping() {
        let span = 1 << 20;
        let o = Offsets::new(span, 0);
        let m = parse_mix("512:1,4K:1,8K:1,64K:1").unwrap();
        let mut rng = fastrand::Rng::with_seed(1);
        let mut end = 0u64;
        let mut wrapped = 0;
        for _ in 0..10_000 {
            let size = m.draw(&mut rng);
            let align = alignment(size, 512);
            let off = o.next(&mut rng, size, align);
            assert_eq!(off % align, 0);
            assert!(off + size <= span);
            let want = end.next_multiple_of(align);
            if want + size > span {
                assert_eq!(off, 0);
                wrapped += 1;
            } else {
                assert_eq!(off, want);
            }
            end = off + size;
        }
        assert!(wrapped > 10);
        // One size from 0: exactly 0, bs, 2bs, ...
        let o = Offsets::new(span, 0);
        let offs: Vec<u64> = (0..4).map(|_| o.next(&mut rng, 4096, 4096)).collect();
        assert_eq!(offs, [0, 4096, 8192, 12288]);
    }

    #[test]
    fn random_pct_sets_the_share_of_jumps() {
        let span = 1 << 30;
        let mut rng = fastrand::Rng::with_seed(3);
        let share_sequential = |pct: u8, rng: &mut fastrand::Rng| {
            let o = Offsets::new(span, pct);
            let mut end = 0;
            let mut seq = 0;
            for _ in 0..20_000 {
                let off = o.next(rng, 8192, 4096);
                assert_eq!(off % 4096, 0);
                assert!(off + 8192 <= span);
                if off == end {
                    seq += 1;
                }
                end = off + 8192;
            }
            seq as f64 / 20_000.0
        };
        assert_eq!(share_sequential(0, &mut rng), 1.0);
        assert!(share_sequential(100, &mut rng) < 0.001);
        let s = share_sequential(75, &mut rng);
        assert!((s - 0.25).abs() < 0.02, "{s}");
    }

    #[test]
    fn offsets_align_to_the_size_up_to_4k_and_at_least_the_block() {
        assert_eq!(alignment(512, 512), 512);
        assert_eq!(alignment(2048, 512), 2048);
        assert_eq!(alignment(65536, 512), 4096);
        assert_eq!(alignment(512, 4096), 4096);
        assert_eq!(alignment(1 << 20, 4096), 4096);
    }
}
