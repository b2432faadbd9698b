//! `ethersan bench TARGET`: a load generator for a LUN over iSCSI, an AoE
//! device or a local file or block device, with one engine so that network
//! and local figures compare directly. Every target is an
//! [`ethersan_client::BlockTarget`]; [`mix`] says what size each I/O is
//! and where it goes.

mod mix;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use bytes::Bytes;
use clap::{Args, ValueEnum};
use ethersan_backend::file::{FileOptions, IoEngine};
use ethersan_client::local::LocalDevice;
use ethersan_client::options::parse_duration;
use ethersan_client::{BlockTarget, OpenOptions};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::cp::parse_bytes;
use mix::{alignment, parse_mix, size_text, Offsets, SizeMix};

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
    /// aoe+unix://SHELF.SLOT?local=PATH&peer=PATH,
    /// nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN[/NSID], or a local file or block
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
    connect: ethersan_client::ConnectArgs,
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

/// The targets the I/O goes to: one per session (the same target for
/// every worker when there is one session).
struct Opened {
    targets: Vec<Arc<dyn BlockTarget>>,
    /// The transport's name, or "local".
    engine: &'static str,
    /// For a local target: its I/O engine and whether O_DIRECT is used.
    local: Option<(String, bool)>,
}

/// What one worker does per I/O.
struct Worker {
    target: Arc<dyn BlockTarget>,
    /// Read into, reused: never zeroed.
    buf: Vec<u8>,
    data: Bytes,
    fua: bool,
}

impl Worker {
    /// A read through the target's one command path (over iSCSI, a
    /// command answered with a unit attention, e.g. after a live `ctl lun
    /// add` on the target, is sent again instead of stopping the run);
    /// the worker's buffer is handed over for the data and kept.
    async fn read(&mut self, offset: u64, size: u64) -> anyhow::Result<()> {
        let spare = std::mem::take(&mut self.buf);
        self.buf = self.target.read(offset, size as usize, spare).await?;
        Ok(())
    }

    async fn write(&mut self, offset: u64, size: u64) -> anyhow::Result<()> {
        let data = self.data.slice(..size as usize);
        self.target.write(offset, data, self.fua).await
    }
}

/// Why an option of `bench` does not fit a transport, checked before
/// anything is opened.
fn refuse(transport: &str, a: &BenchArgs) -> Option<&'static str> {
    if a.engine.is_some() || a.direct {
        return Some(match transport {
            "iscsi" => "--engine and --direct apply to a local FILE; for an iscsi://, eth:// or udp:// target set engine and direct on the server's LUN",
            "aoe" => "--engine and --direct apply to a local FILE, not to an AoE device",
            _ => "--engine and --direct apply to a local FILE",
        });
    }
    if transport == "aoe" && a.sessions != 1 {
        return Some("--sessions applies to iSCSI; an AoE device is driven by one initiator: raise --qd instead");
    }
    if transport == "aoe" && a.fua {
        return Some("--fua: ATA writes over AoE have no FUA; leave it out for an AoE device");
    }
    None
}

async fn open_targets(a: &BenchArgs) -> anyhow::Result<Opened> {
    if let Some(t) = ethersan_client::transport_of(&a.target) {
        if let Some(why) = refuse(t.name, a) {
            bail!("{why}");
        }
        // Measured as they are: a command that loses its session is not
        // sent again on a new one.
        let opts = OpenOptions {
            program: "ethersan bench",
            retry: false,
            reconnect: None,
        };
        let first: Arc<dyn BlockTarget> =
            Arc::from(ethersan_client::open(&a.target, &a.connect, &opts).await?);
        let mut targets = vec![first.clone()];
        for _ in 1..a.sessions {
            targets.push(Arc::from(first.another_session().await?));
        }
        return Ok(Opened {
            targets,
            engine: t.name,
            local: None,
        });
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
    let dev = LocalDevice::open(path, &opts)?;
    let local = Some((dev.engine(), dev.is_direct()));
    Ok(Opened {
        targets: vec![Arc::new(dev)],
        engine: "local",
        local,
    })
}

/// Run one benchmark and return its figures.
pub(crate) async fn run(a: &BenchArgs) -> anyhow::Result<Report> {
    let opened = open_targets(a).await?;
    let first = opened.targets[0].clone();
    let block = first.block_size();
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
    if !first.capabilities().splits {
        let limit = first.max_transfer();
        if max_size > limit {
            bail!(
                "--bs: an I/O of {} is more than the LUN takes in one command ({})",
                size_text(max_size),
                size_text(limit)
            );
        }
    }
    let span = match a.size {
        Some(n) if n > first.capacity() => bail!(
            "--size {n} is more than the target holds ({} bytes): give --size {} or less",
            first.capacity(),
            first.capacity()
        ),
        Some(n) => n,
        None => first.capacity(),
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
            target: opened.targets[i % opened.targets.len()].clone(),
            buf: vec![0u8; max_size as usize],
            data: data.clone(),
            fua: a.fua,
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
    for t in &opened.targets {
        t.close().await;
    }
    if let Some(e) = first_error {
        return Err(e.context("benchmark stopped"));
    }
    let ios = reads + writes;
    let us = |ns: u64| ns as f64 / 1000.0;
    Ok(Report {
        // A URL's CHAP secret is not printed.
        target: ethersan_client::url::redact(&a.target),
        engine: opened.engine,
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
        io_engine: opened.local.as_ref().map(|(e, _)| e.clone()),
        direct: opened.local.as_ref().map(|&(_, d)| d),
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
