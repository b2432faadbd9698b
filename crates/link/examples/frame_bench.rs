//! The raw-frame ceiling of a link: how many full-size frames one sender
//! moves to one receiver over an AF_PACKET link (TPACKET rings) with both
//! ends doing nothing else. bench/ethernet runs it on its veth pair, one end
//! in each network namespace, and reports it beside the storage targets.
//!
//! ```text
//! frame_bench recv IFACE SECONDS          # prints one JSON line at the end
//! frame_bench send IFACE DST_MAC SECONDS  # prints one JSON line at the end
//! ```
//!
//! The sender builds each frame in its transmit slot ([`Link::send_with`]:
//! the header and a sequence number; the rest of the slot is sent as it
//! is), 64 frames per kick, frames of MTU + 14 bytes. The receiver counts
//! frames and bytes from its first frame until SECONDS have passed or no
//! frame came for half a second. Each side reports its own CPU time
//! (getrusage of the process: one thread) over that span, as CPU seconds
//! per GB moved. EtherType 0x88B6 (IEEE local experimental 2): start the
//! receiver first, on a link nothing else uses.

use std::time::{Duration, Instant};

use ethersan_link::packet::{PacketConfig, PacketLink};
use ethersan_link::{EthernetHeader, Link, MacAddr, HEADER_LEN};

/// The EtherType of the benchmark's frames.
const ETHERTYPE: u16 = 0x88b6;
/// Frames per kick of the transmit ring.
const BATCH: usize = 64;

fn usage() -> ! {
    eprintln!("usage: frame_bench recv IFACE SECONDS | frame_bench send IFACE DST_MAC SECONDS");
    std::process::exit(2)
}

/// This process's user + system CPU seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes only the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn report(side: &str, frames: u64, bytes: u64, secs: f64, cpu: f64, extra: &str) {
    let gb = bytes as f64 / 1e9;
    println!(
        "{{\"side\":\"{side}\",\"frames\":{frames},\"bytes\":{bytes},\"seconds\":{secs:.3},\
         \"frames_per_s\":{:.0},\"mb_per_s\":{:.1},\"cpu_s\":{cpu:.3},\"cpu_s_per_gb\":{:.3}{extra}}}",
        frames as f64 / secs.max(1e-9),
        bytes as f64 / 1e6 / secs.max(1e-9),
        if gb > 0.0 { cpu / gb } else { 0.0 },
    );
}

fn open(ifname: &str) -> Link {
    let mut cfg = PacketConfig::new(ifname, ETHERTYPE);
    cfg.rx_blocks = 64;
    cfg.tx_frames = 512;
    match PacketLink::open(cfg) {
        Ok(l) => Link::from(l),
        Err(e) => {
            eprintln!("frame_bench: {e}");
            std::process::exit(1)
        }
    }
}

async fn recv(ifname: &str, seconds: f64) {
    let link = open(ifname);
    let (mut frames, mut bytes) = (0u64, 0u64);
    // Wait (up to 30 s) for the first frame; the clock starts there.
    let first = tokio::time::timeout(
        Duration::from_secs(30),
        link.recv_batch(|f| {
            frames += 1;
            bytes += f.len() as u64;
        }),
    )
    .await;
    if !matches!(first, Ok(Ok(_))) {
        eprintln!("frame_bench: no frame within 30 s");
        std::process::exit(1);
    }
    let (start, cpu0) = (Instant::now(), cpu_seconds());
    let mut last = start;
    let span = Duration::from_secs_f64(seconds);
    while start.elapsed() < span {
        let got = tokio::time::timeout(
            Duration::from_millis(500),
            link.recv_batch(|f| {
                frames += 1;
                bytes += f.len() as u64;
            }),
        )
        .await;
        match got {
            Ok(Ok(_)) => last = Instant::now(),
            Ok(Err(e)) => {
                eprintln!("frame_bench: {e}");
                std::process::exit(1)
            }
            Err(_) => break,
        }
    }
    let cpu = cpu_seconds() - cpu0;
    let drops = match &link {
        Link::Packet(p) => p.take_stats().map(|s| s.drops).unwrap_or(0),
        _ => 0,
    };
    let secs = last.duration_since(start).as_secs_f64();
    report(
        "recv",
        frames,
        bytes,
        secs,
        cpu,
        &format!(",\"ring_drops\":{drops}"),
    );
}

async fn send(ifname: &str, dst: MacAddr, seconds: f64) {
    let link = open(ifname);
    let header = EthernetHeader {
        dst,
        src: link.mac(),
        ethertype: ETHERTYPE,
    }
    .to_bytes();
    let len = link.max_frame_len();
    let (mut frames, mut seq) = (0u64, 0u64);
    let (start, cpu0) = (Instant::now(), cpu_seconds());
    let span = Duration::from_secs_f64(seconds);
    while start.elapsed() < span {
        let sent = link
            .send_with(BATCH, |_, slot| {
                slot[..HEADER_LEN].copy_from_slice(&header);
                slot[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&seq.to_be_bytes());
                seq += 1;
                len
            })
            .await;
        match sent {
            Ok(n) => frames += n as u64,
            Err(e) => {
                eprintln!("frame_bench: {e}");
                std::process::exit(1)
            }
        }
    }
    let (secs, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    report("send", frames, frames * len as u64, secs, cpu, "");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs = |s: &str| {
        s.parse::<f64>()
            .ok()
            .filter(|x| *x > 0.0)
            .unwrap_or_else(|| usage())
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| {
            eprintln!("frame_bench: {e}");
            std::process::exit(1)
        });
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["recv", ifname, s] => rt.block_on(recv(ifname, secs(s))),
        ["send", ifname, mac, s] => {
            let dst = mac.parse::<MacAddr>().unwrap_or_else(|_| usage());
            rt.block_on(send(ifname, dst, secs(s)))
        }
        _ => usage(),
    }
}
