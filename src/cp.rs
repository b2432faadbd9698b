//! `ethersan cp SRC DST`: copy between a LUN and a file, stdin/stdout, or
//! another LUN, with many commands in flight.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use futures::stream::{self, StreamExt, TryStreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use ethersan_client::local::LocalFile;
use ethersan_client::{BlockTarget, ConnectArgs, OpenOptions};

/// Arguments of `ethersan cp`.
#[derive(Args, Debug)]
pub(crate) struct CpArgs {
    /// Source: iscsi://[user[%secret]@]host[:port]/IQN/LUN, eth://IFACE/IQN/LUN,
    /// udp://HOST[:PORT]/IQN/LUN, aoe://IFACE/SHELF.SLOT,
    /// aoe+unix://SHELF.SLOT?local=PATH&peer=PATH,
    /// nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN[/NSID], a file or block device, or - for stdin.
    src: String,
    /// Destination: an iscsi://, eth://, udp://, aoe://, aoe+unix:// or nvme+tcp:// URL (as for
    /// the source), a file or block device, or - for stdout.
    dst: String,
    /// Byte offset on the LUN side (both sides when copying LUN to LUN); a multiple of the block size.
    #[arg(long, value_parser = parse_bytes, default_value = "0")]
    offset: u64,
    /// Bytes to copy (default: all of the source from the offset).
    #[arg(long, value_parser = parse_bytes)]
    length: Option<u64>,
    /// Read the destination back and compare it with what was sent.
    #[arg(long)]
    verify: bool,
    /// Commands in flight.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    depth: u16,
    /// Bytes per command (default: 1 MiB, or less if the target's limit is lower).
    #[arg(long, value_parser = parse_bytes)]
    chunk: Option<u64>,
    /// Write with FUA and end with SYNCHRONIZE CACHE on a LUN destination
    /// (FLUSH CACHE on an AoE device, whose writes have no FUA; fsync on a
    /// file): the data is durable when cp returns.
    #[arg(long)]
    sync: bool,
    /// No progress bar even on a terminal.
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// A size: a number of bytes with an optional K/M/G/T suffix (0 allowed).
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    // Zero is a fine offset in any unit ("0", "0M"); sizes elsewhere are not.
    let digits = s.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if digits.parse::<u64>() == Ok(0) {
        return Ok(0);
    }
    ethersan_server::config::parse_size(s).map_err(|e| e.to_string())
}

#[derive(Clone, Debug)]
enum End {
    Lun(Arc<dyn BlockTarget>),
    Local(LocalFile, PathBuf),
    Stdio,
}

impl End {
    fn name(&self) -> String {
        match self {
            End::Lun(l) => l.name(),
            End::Local(_, p) => p.display().to_string(),
            End::Stdio => "-".into(),
        }
    }
}

/// Read one chunk of a seekable source.
async fn read_chunk(src: &End, at: u64, len: usize) -> anyhow::Result<Vec<u8>> {
    match src {
        End::Lun(l) => {
            let bs = l.block_size() as usize;
            let padded = len.div_ceil(bs) * bs;
            let mut data = l.read(at, padded, Vec::new()).await?;
            data.truncate(len);
            Ok(data)
        }
        End::Local(f, p) => {
            let data = f
                .read(at, len)
                .await
                .with_context(|| p.display().to_string())?;
            if data.len() != len {
                bail!(
                    "{}: ended early at byte {}",
                    p.display(),
                    at + data.len() as u64
                );
            }
            Ok(data)
        }
        End::Stdio => unreachable!("stdin is read sequentially"),
    }
}

/// Write one chunk to a seekable destination. `sparse`: a regular file
/// destination that started empty, where all-zero chunks stay holes.
async fn write_chunk(
    dst: &End,
    at: u64,
    data: Vec<u8>,
    fua: bool,
    sparse: bool,
) -> anyhow::Result<()> {
    match dst {
        End::Lun(l) => {
            let bs = l.block_size() as usize;
            if data.len().is_multiple_of(bs) {
                return l.write(at, Bytes::from(data), fua).await;
            }
            // A tail shorter than a block: keep the rest of the last block.
            let whole = data.len() / bs * bs;
            let mut data = data;
            let tail_at = at + whole as u64;
            let mut block = l.read(tail_at, bs, Vec::new()).await?;
            block[..data.len() - whole].copy_from_slice(&data[whole..]);
            data.truncate(whole);
            data.extend_from_slice(&block);
            l.write(at, Bytes::from(data), fua).await
        }
        End::Local(f, p) => {
            if sparse && data.iter().all(|b| *b == 0) {
                return Ok(());
            }
            f.write(at, Bytes::from(data))
                .await
                .with_context(|| p.display().to_string())
        }
        End::Stdio => unreachable!("stdout is written sequentially"),
    }
}

/// A progress bar on stderr when it is a terminal: binary units (MiB and
/// MiB/s, as in the summary line) and an ETA from the average rate so far,
/// shown only once there is enough to go on.
fn progress(label: &'static str, total: Option<u64>, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    match total {
        Some(t) => ProgressBar::new(t).with_style(
            ProgressStyle::with_template(&format!(
                "{label} {{wide_bar}} {{binary_bytes}}/{{binary_total_bytes}} {{binary_bytes_per_sec}} {{calm_eta}}"
            ))
            .expect("valid template")
            .with_key(
                "calm_eta",
                |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = w.write_str(&eta_text(s.pos(), s.len().unwrap_or(0), s.elapsed()));
                },
            ),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template(&format!(
                "{label} {{spinner}} {{binary_bytes}} {{binary_bytes_per_sec}}"
            ))
            .expect("valid template"),
        ),
    }
}

/// Where a LUN says what happened (a session replaced): above the bar
/// while it is drawn, else on stderr.
fn say_above(bar: &ProgressBar) -> ethersan_client::Say {
    let bar = bar.clone();
    Arc::new(move |msg: &str| {
        if bar.is_hidden() {
            note!("{msg}");
        } else {
            bar.println(msg);
        }
    })
}

/// "ETA 1m05s" from the average rate since the start, or "ETA …" while
/// less than two seconds or one percent have passed (the first commands'
/// rate says little about the rest).
fn eta_text(pos: u64, len: u64, elapsed: std::time::Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if pos == 0 || secs < 2.0 || pos.saturating_mul(100) < len {
        return "ETA …".into();
    }
    let left = (len.saturating_sub(pos) as f64 / (pos as f64 / secs)).round() as u64;
    if left >= 3600 {
        format!("ETA {}h{:02}m", left / 3600, left % 3600 / 60)
    } else if left >= 60 {
        format!("ETA {}m{:02}s", left / 60, left % 60)
    } else {
        format!("ETA {left}s")
    }
}

/// Bytes in binary units, as the progress bar shows them.
fn mib(bytes: u64) -> String {
    indicatif::BinaryBytes(bytes).to_string()
}

/// "MiB/s" over `secs`.
fn rate(bytes: u64, secs: f64) -> String {
    format!("{}/s", mib((bytes as f64 / secs.max(1e-9)) as u64))
}

/// The closing line of `cp`.
fn summary(copied: u64, copy_secs: f64, verify_secs: Option<f64>, retries: (u64, u64)) -> String {
    let mut line = format!(
        "ethersan cp: {} ({copied} bytes) copied in {copy_secs:.2} s ({})",
        mib(copied),
        rate(copied, copy_secs)
    );
    if let Some(v) = verify_secs {
        line += &format!(
            ", verified in {v:.2} s ({}); {:.2} s in all",
            rate(copied, v),
            copy_secs + v
        );
    }
    if retries.0 > 0 {
        line += &format!(
            "; {} command{} retried on {} new session{}",
            retries.0,
            if retries.0 == 1 { "" } else { "s" },
            retries.1,
            if retries.1 == 1 { "" } else { "s" }
        );
    }
    line
}

async fn open_end(spec: &str, as_dst: bool, how: &ConnectArgs) -> anyhow::Result<End> {
    if ethersan_client::is_url(spec) {
        let opts = OpenOptions {
            program: "ethersan cp",
            retry: true,
            reconnect: None,
        };
        return Ok(End::Lun(Arc::from(
            ethersan_client::open(spec, how, &opts).await?,
        )));
    }
    if spec == "-" {
        return Ok(End::Stdio);
    }
    let path = PathBuf::from(spec);
    let local = if as_dst {
        LocalFile::open_write(&path, true)?
    } else {
        LocalFile::open_read(&path)?
    };
    Ok(End::Local(local, path))
}

/// `ethersan cp`.
pub(crate) async fn cmd_cp(a: CpArgs) -> anyhow::Result<()> {
    let src = open_end(&a.src, false, &a.connect).await?;
    if matches!(src, End::Local(..) | End::Stdio) && !ethersan_client::is_url(&a.dst) {
        bail!(
            "one side of cp must be a LUN's URL: {}",
            ethersan_client::url_forms()
        );
    }
    if a.verify && a.dst == "-" {
        bail!("--verify reads the destination back, which stdout cannot be");
    }
    let dst = open_end(&a.dst, true, &a.connect).await?;

    // The LUN side(s): offset checks.
    for end in [&src, &dst] {
        if let End::Lun(l) = end {
            if !a.offset.is_multiple_of(l.block_size()) {
                bail!(
                    "--offset {} is not a multiple of the block size {}",
                    a.offset,
                    l.block_size()
                );
            }
            if a.offset > l.capacity() {
                bail!(
                    "--offset {} is beyond the end of {} ({} bytes)",
                    a.offset,
                    end.name(),
                    l.capacity()
                );
            }
        }
    }
    let src_at = if matches!(src, End::Lun(_)) {
        a.offset
    } else {
        0
    };
    let dst_at = if matches!(dst, End::Lun(_)) {
        a.offset
    } else {
        0
    };
    let available = match &src {
        End::Lun(l) => Some(l.capacity() - a.offset),
        End::Local(f, _) => Some(f.size),
        End::Stdio => None,
    };
    let length = match (a.length, available) {
        (Some(n), Some(av)) if n > av => {
            bail!("--length {n} is more than the source holds ({av} bytes)")
        }
        (Some(n), _) => Some(n),
        (None, av) => av,
    };
    if let (End::Lun(l), Some(n)) = (&dst, length) {
        if dst_at + n > l.capacity() {
            bail!(
                "LUN too small: {} holds {} bytes, the copy needs {} at offset {dst_at}",
                dst.name(),
                l.capacity(),
                n
            );
        }
    }
    let mut chunk = a
        .chunk
        .unwrap_or(ethersan_client::options::DEFAULT_MAX_TRANSFER);
    for end in [&src, &dst] {
        if let End::Lun(l) = end {
            chunk = chunk.min(l.max_transfer());
            chunk = (chunk / l.block_size()).max(1) * l.block_size();
        }
    }
    let chunk = chunk.max(512) as usize;
    let sparse = matches!(&dst, End::Local(f, _) if f.regular);
    let fua = a.sync;
    let depth = usize::from(a.depth);
    let bar = progress("copy  ", length, a.quiet);
    for end in [&src, &dst] {
        if let End::Lun(l) = end {
            l.set_say(say_above(&bar));
        }
    }
    let started = Instant::now();

    // Every chunk's CRC32C, to compare with the destination afterwards.
    let sums: Arc<std::sync::Mutex<Vec<(u64, usize, u32)>>> = Arc::default();
    let record = |at: u64, data: &[u8]| {
        if a.verify {
            sums.lock()
                .expect("not poisoned")
                .push((at, data.len(), crc_fast::crc32_iscsi(data)));
        }
    };

    let copied: u64 = if let End::Stdio = src {
        // stdin: read in order, write with many commands in flight.
        let limit = length.unwrap_or(u64::MAX);
        let chunks = stream::try_unfold(
            (tokio::io::stdin(), 0u64),
            move |(mut stdin, done)| async move {
                let want = (limit - done).min(chunk as u64) as usize;
                if want == 0 {
                    return Ok(None);
                }
                let mut buf = vec![0u8; want];
                let mut got = 0;
                while got < want {
                    let n = stdin.read(&mut buf[got..]).await.context("read stdin")?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                if got == 0 {
                    return Ok::<_, anyhow::Error>(None);
                }
                buf.truncate(got);
                Ok(Some(((done, buf), (stdin, done + got as u64))))
            },
        );
        let dst_ref = &dst;
        let bar_ref = &bar;
        let total = std::sync::atomic::AtomicU64::new(0);
        let total_ref = &total;
        chunks
            .map_ok(|(at, data)| {
                record(at, &data);
                async move {
                    let n = data.len() as u64;
                    if let End::Lun(l) = dst_ref {
                        if dst_at + at + n > l.capacity() {
                            bail!(
                                "LUN too small: {} holds {} bytes, stdin had more",
                                dst_ref.name(),
                                l.capacity()
                            );
                        }
                    }
                    write_chunk(dst_ref, dst_at + at, data, fua, false).await?;
                    bar_ref.inc(n);
                    total_ref.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                    Ok(())
                }
            })
            .try_buffer_unordered(depth)
            .try_collect::<()>()
            .await?;
        total.into_inner()
    } else {
        let length = length.expect("seekable sources have a length");
        let positions = (0..length)
            .step_by(chunk)
            .map(move |off| (off, (length - off).min(chunk as u64) as usize));
        if let End::Stdio = dst {
            // stdout: read with many commands in flight, write in order.
            let src_ref = &src;
            let mut out = tokio::io::stdout();
            let mut reads = stream::iter(positions)
                .map(|(off, len)| async move { read_chunk(src_ref, src_at + off, len).await })
                .buffered(depth);
            while let Some(data) = reads.next().await {
                let data = data?;
                out.write_all(&data).await.map_err(crate::StdoutError)?;
                bar.inc(data.len() as u64);
            }
            out.flush().await.map_err(crate::StdoutError)?;
        } else {
            let (src_ref, dst_ref, bar_ref, record_ref) = (&src, &dst, &bar, &record);
            stream::iter(positions)
                .map(|(off, len)| async move {
                    let data = read_chunk(src_ref, src_at + off, len).await?;
                    record_ref(off, &data);
                    write_chunk(dst_ref, dst_at + off, data, fua, sparse).await?;
                    bar_ref.inc(len as u64);
                    Ok::<_, anyhow::Error>(())
                })
                .buffer_unordered(depth)
                .try_collect::<()>()
                .await?;
        }
        length
    };

    // Finish: the destination's size and durability.
    match &dst {
        End::Local(f, p) => {
            let f = f.clone();
            let regular = f.regular;
            let sync = a.sync;
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                if regular {
                    f.file.set_len(copied)?;
                }
                if sync {
                    f.file.sync_all()?;
                }
                Ok(())
            })
            .await?
            .with_context(|| format!("finish {}", p.display()))?;
        }
        End::Lun(l) if a.sync => l.flush().await?,
        _ => {}
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();

    let verify_secs = if a.verify {
        let started = Instant::now();
        let sums = std::mem::take(&mut *sums.lock().expect("not poisoned"));
        let check_bar = progress("verify", Some(copied), a.quiet);
        if let End::Lun(l) = &dst {
            l.set_say(say_above(&check_bar));
        }
        let (dst_ref, bar_ref) = (&dst, &check_bar);
        stream::iter(sums)
            .map(|(off, len, crc)| async move {
                let back = read_chunk(dst_ref, dst_at + off, len).await?;
                if crc_fast::crc32_iscsi(&back) != crc {
                    let at = dst_at + off;
                    bail!(
                        "verify failed: {} differs from the source in the {len} bytes at byte {at}",
                        dst_ref.name()
                    );
                }
                bar_ref.inc(len as u64);
                Ok(())
            })
            .buffer_unordered(depth)
            .try_collect::<()>()
            .await?;
        check_bar.finish_and_clear();
        Some(started.elapsed().as_secs_f64())
    } else {
        None
    };
    let mut retries = (0, 0);
    for end in [&src, &dst] {
        if let End::Lun(l) = end {
            let (r, s) = l.retries();
            retries = (retries.0 + r, retries.1 + s);
        }
    }
    if !a.quiet {
        note!("{}", summary(copied, secs, verify_secs, retries));
    }
    for end in [&src, &dst] {
        if let End::Lun(l) = end {
            l.close().await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn eta_waits_for_enough_to_go_on_then_uses_the_average_rate() {
        // The first half-second's burst (a tenth done) says nothing yet.
        assert_eq!(eta_text(100, 1000, Duration::from_millis(500)), "ETA …");
        // Under one percent after ten seconds: still nothing.
        assert_eq!(eta_text(5, 1000, Duration::from_secs(10)), "ETA …");
        // A quarter in four seconds: twelve more.
        assert_eq!(eta_text(250, 1000, Duration::from_secs(4)), "ETA 12s");
        assert_eq!(eta_text(10, 1000, Duration::from_secs(10)), "ETA 16m30s");
        assert_eq!(eta_text(1, 100, Duration::from_secs(100)), "ETA 2h45m");
    }

    #[test]
    fn the_summary_uses_the_bars_units_and_counts_the_verify_pass() {
        let s = summary(64 << 20, 2.0, Some(0.5), (0, 0));
        assert_eq!(
            s,
            "ethersan cp: 64.00 MiB (67108864 bytes) copied in 2.00 s (32.00 MiB/s), verified in 0.50 s (128.00 MiB/s); 2.50 s in all"
        );
        assert!(!s.contains("MB/s"));
        let s = summary(4096, 1.0, None, (17, 1));
        assert!(s.ends_with("; 17 commands retried on 1 new session"), "{s}");
    }
}
