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
use crate::blockio::{check, login, Lun};
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
    /// iscsi://host[:port]/IQN/LUN, aoe://IFACE/SHELF.SLOT,
    /// aoe+unix://SHELF.SLOT?local=PATH&peer=PATH, or a local file or block
    /// device (the same engine, in-process).
    target: String,
    /// Access pattern.
    #[arg(long, value_enum, default_value = "randread")]
    rw: Pattern,
    /// Percentage of reads for --rw mixed.
    #[arg(long, default_value_t = 70, value_parser = clap::value_parser!(u8).range(0..=100))]
    read_pct: u8,
    /// Block size of each I/O (e.g. 4K, 128K).
    #[arg(long, default_value = "4K", value_parser = parse_bytes)]
    bs: u64,
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
    bs: u64,
    qd: u16,
    sessions: u16,
    seconds: f64,
    ios: u64,
    reads: u64,
    writes: u64,
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
    async fn read(&mut self, offset: u64) -> anyhow::Result<()> {
        match &self.engine {
            Engine::Iscsi(luns) => {
                let l = &luns[self.session];
                let bs = u64::from(l.block_size);
                let r = l
                    .session
                    .read16(
                        l.lun,
                        offset / bs,
                        (self.buf.len() as u64 / bs) as u32,
                        l.block_size,
                    )
                    .await?;
                check("READ(16)", &r)?;
                Ok(())
            }
            Engine::Aoe(d) => {
                d.read(offset, self.buf.len()).await?;
                Ok(())
            }
            // As the server does: one submission, which finishes on this
            // thread when the data is at hand (page cache), goes to the
            // ring (io_uring) or comes back as a job for the blocking pool
            // (sync). The worker's buffer is reused, never zeroed.
            Engine::Local(dev) => {
                let len = self.data.len();
                let buf = std::mem::take(&mut self.buf);
                let req = IoRequest::Read { offset, len, buf };
                self.buf = submit_local(dev, req, &mut self.done)
                    .await
                    .context("read")?;
                Ok(())
            }
        }
    }

    async fn write(&mut self, offset: u64) -> anyhow::Result<()> {
        match &self.engine {
            Engine::Iscsi(luns) => {
                let l = &luns[self.session];
                let r = l
                    .session
                    .write16(
                        l.lun,
                        offset / u64::from(l.block_size),
                        self.data.clone(),
                        l.block_size,
                        self.fua,
                    )
                    .await?;
                check("WRITE(16)", &r)
            }
            Engine::Aoe(d) => d.write(offset, &self.data).await,
            Engine::Local(dev) => {
                let req = IoRequest::Write {
                    offset,
                    data: self.data.to_vec(),
                    len: self.data.len(),
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
        for _ in 0..a.sessions {
            let session = login(&url, &a.connect).await?;
            luns.push(Lun::on(session, url.lun).await?);
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
    if a.bs == 0 || !a.bs.is_multiple_of(block) {
        bail!("--bs {} is not a multiple of the block size {block}", a.bs);
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
    let slots = span / a.bs;
    if slots == 0 {
        bail!(
            "the target ({span} bytes) is smaller than one {}-byte I/O",
            a.bs
        );
    }
    let workers = usize::from(a.sessions) * usize::from(a.qd);
    let stop = Arc::new(AtomicBool::new(false));
    let budget = a.ios.map(|n| Arc::new(AtomicU64::new(n)));
    let cursor = Arc::new(AtomicU64::new(0));
    let mut pattern = vec![0u8; a.bs as usize];
    fastrand::Rng::with_seed(0x5eed).fill(&mut pattern);
    let data = Bytes::from(pattern);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(workers);
    for i in 0..workers {
        let mut w = Worker {
            engine: engine.clone(),
            session: i % usize::from(a.sessions),
            buf: vec![0u8; a.bs as usize],
            data: data.clone(),
            fua: a.fua,
            done: Completions::new(),
        };
        let (stop, budget, cursor) = (stop.clone(), budget.clone(), cursor.clone());
        let (rw, read_pct, bs) = (a.rw, a.read_pct, a.bs);
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(0x1234_5678 ^ i as u64);
            let mut hist =
                Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3).expect("valid bounds");
            let (mut reads, mut writes) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                if let Some(b) = &budget {
                    if b.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1))
                        .is_err()
                    {
                        break;
                    }
                }
                let (is_read, slot) = match rw {
                    Pattern::Read => (true, cursor.fetch_add(1, Ordering::Relaxed) % slots),
                    Pattern::Write => (false, cursor.fetch_add(1, Ordering::Relaxed) % slots),
                    Pattern::Randread => (true, rng.u64(0..slots)),
                    Pattern::Randwrite => (false, rng.u64(0..slots)),
                    Pattern::Mixed => (rng.u8(0..100) < read_pct, rng.u64(0..slots)),
                };
                let t = Instant::now();
                let r = if is_read {
                    w.read(slot * bs).await
                } else {
                    w.write(slot * bs).await
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
            }
            Ok::<_, anyhow::Error>((hist, reads, writes))
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
    let (mut reads, mut writes) = (0u64, 0u64);
    let mut first_error = None;
    for t in tasks {
        match t.await? {
            Ok((h, r, w)) => {
                hist.add(&h).expect("same bounds");
                reads += r;
                writes += w;
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
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
        bs: a.bs,
        qd: a.qd,
        sessions: a.sessions,
        seconds,
        ios,
        reads,
        writes,
        io_engine: match &engine {
            Engine::Local(d) => Some(d.engine().to_string()),
            Engine::Iscsi(_) | Engine::Aoe(_) => None,
        },
        direct: match &engine {
            Engine::Local(d) => Some(d.is_direct()),
            Engine::Iscsi(_) | Engine::Aoe(_) => None,
        },
        iops: ios as f64 / seconds,
        mb_per_s: (ios * a.bs) as f64 / seconds / 1e6,
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
    let workload = match r.rw {
        Pattern::Mixed => format!("mixed {}% read", r.read_pct),
        p => format!("{p:?}").to_lowercase(),
    };
    out!(
        "{:<7} {:<16} {:>5} {:>4} {:>4} {:>10} {:>9} {:>9} {:>9} {:>9}",
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
        "{:<7} {:<16} {:>5} {:>4} {:>4} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
        r.engine,
        workload,
        size_text(r.bs),
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
    Ok(())
}
