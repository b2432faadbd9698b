//! `serve --metrics` scraped by a real Prometheus (Debian's `prometheus`)
//! every second while `ethersan bench` loads a RAM LUN: Prometheus'
//! `rate(ethersan_lun_reads_total[8s])` over the bench's 8 s must be
//! the bench's IOPS within 20%. Loopback only; bounded to about 30 s.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{free_port, require_tool, run, Server, IQN};

/// A Prometheus killed (and reaped) when dropped, whatever the test did.
struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET path` over HTTP/1.0: the status code and the body.
fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_string();
    Some((code, body))
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Query Prometheus for one instant value at `time`.
fn query(prom: &str, expr: &str, time: f64) -> Option<f64> {
    let enc: String = expr
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (code, body) = http_get(prom, &format!("/api/v1/query?query={enc}&time={time:.3}"))?;
    // 503 while Prometheus starts (its storage is opening): not yet.
    if code == 503 {
        return None;
    }
    assert_eq!(code, 200, "query {expr}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

#[test]
fn prometheus_rate_matches_bench_iops() {
    require_tool("prometheus");
    let started = Instant::now();
    let server = Server::start_with("ram:64M", &["--metrics", "127.0.0.1:0"]);
    let metrics = server
        .log
        .lock()
        .unwrap()
        .iter()
        .find_map(|l| l.split("metrics on http://").nth(1).map(|r| r.to_string()))
        .expect("serve printed its metrics address");
    let metrics_addr = metrics.trim_end_matches("/metrics").to_string();
    // The endpoint itself answers before Prometheus is involved.
    let (code, body) = http_get(&metrics_addr, "/metrics").expect("GET /metrics");
    assert_eq!(code, 200);
    assert!(body.contains("ethersan_lun_reads_total{"), "{body}");

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: ethersan\n    scrape_interval: 1s\n    scrape_timeout: 900ms\n    static_configs:\n      - targets: ['{metrics_addr}']\n"
        ),
    )
    .unwrap();
    let prom = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let _prometheus = Prometheus(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    // Ready, and scraping ethersan (the target is up).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let up = query(&prom, "up{job=\"ethersan\"}", unix_now());
        if up == Some(1.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus did not scrape ethersan: {:?}",
            std::fs::read_to_string(dir.path().join("prometheus.log"))
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    let bin = env!("CARGO_BIN_EXE_ethersan");
    let out = run(
        bin,
        &[
            "bench",
            &server.url(0),
            "--rw",
            "randread",
            "--bs",
            "4k",
            "--qd",
            "8",
            "--time",
            "8s",
            "--json",
        ],
        Duration::from_secs(30),
    );
    let ended = unix_now();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench --json");
    let iops = report["iops"].as_f64().expect("iops");
    let seconds = report["seconds"].as_f64().expect("seconds");
    assert!(iops > 0.0 && seconds > 6.0, "{report}");
    // Two more scrapes, then the rate over the bench's own 8 s (the
    // machine's speed varies within a run: a shorter window would compare
    // a part of the run with the whole).
    std::thread::sleep(Duration::from_millis(2500));
    let at = ended;
    let expr = format!("rate(ethersan_lun_reads_total{{target=\"{IQN}\",lun=\"0\"}}[8s])");
    let rate = query(&prom, &expr, at).expect("a rate from Prometheus");
    let ratio = rate / iops;
    eprintln!(
        "bench: {iops:.0} IOPS over {seconds:.2} s; Prometheus {expr} at its end: {rate:.0}/s (ratio {ratio:.3})"
    );
    assert!(
        (0.8..=1.2).contains(&ratio),
        "Prometheus rate {rate:.0}/s vs bench {iops:.0} IOPS"
    );
    // And the bytes agree with the reads: 4 KiB each.
    let bytes = query(
        &prom,
        &format!("rate(ethersan_lun_read_bytes_total{{target=\"{IQN}\",lun=\"0\"}}[8s])"),
        at,
    )
    .expect("a byte rate");
    assert!(
        (bytes / rate - 4096.0).abs() < 1.0,
        "{bytes} B/s for {rate} reads/s"
    );
    // A login to a target that does not exist is counted by reason.
    let wrong = server
        .url(0)
        .replace(IQN, "iqn.2026-11.org.ethersan:nothing-here");
    let out = run(
        bin,
        &["bench", &wrong, "--time", "1s"],
        Duration::from_secs(20),
    );
    assert!(!out.status.success());
    let (_, body) = http_get(&metrics_addr, "/metrics").expect("GET /metrics");
    let sample = |series: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{body}"))
    };
    assert!(sample("ethersan_login_failures_total{reason=\"not_found\"}") >= 1.0);
    assert!(sample("ethersan_logins_total") >= 1.0);
    assert_eq!(
        sample("ethersan_login_failures_total{reason=\"authentication\"}"),
        0.0
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// The native transport's channels are metrics while they are open: how
/// many by security level, and each one's frames and window.
#[test]
fn native_transport_channels_are_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "correct horse battery staple\n").unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--target",
        IQN,
        "--lun",
        "ram:32M",
        "--udp",
        &format!("127.0.0.1:{udp}"),
        "--group",
        "lab",
        "--group-secret-file",
        &secret.display().to_string(),
        "--metrics",
        "127.0.0.1:0",
        "--data-dir",
        &dir.path().display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let server = Server::start_args(&args);
    let metrics_addr = server
        .log
        .lock()
        .unwrap()
        .iter()
        .find_map(|l| l.split("metrics on http://").nth(1).map(|r| r.to_string()))
        .expect("serve printed its metrics address")
        .trim_end_matches("/metrics")
        .to_string();
    let sample = |body: &str, prefix: &str| -> Vec<f64> {
        body.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect()
    };
    let (_, idle) = http_get(&metrics_addr, "/metrics").expect("GET /metrics");
    assert_eq!(
        sample(&idle, "ethersan_native_channels{level=\"encrypt\"}"),
        vec![0.0],
        "{idle}"
    );
    let bench = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args([
            "bench",
            &format!("udp://127.0.0.1:{udp}/{IQN}/0"),
            "--group",
            "lab",
            "--group-secret-file",
        ])
        .arg(&secret)
        .args(["--time", "4s", "--rw", "randread", "--bs", "4k"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ethersan bench");
    // While the bench runs, its channel is listed with its counters.
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        std::thread::sleep(Duration::from_millis(500));
        let (_, body) = http_get(&metrics_addr, "/metrics").expect("GET /metrics");
        if sample(&body, "ethersan_native_channels{level=\"encrypt\"}") == vec![1.0]
            && sample(&body, "ethersan_connections{transport=\"native\"}") == vec![1.0]
            && sample(&body, "ethersan_native_frames_sent_total{")
                .first()
                .is_some_and(|v| *v > 100.0)
        {
            break body;
        }
        assert!(Instant::now() < deadline, "no native channel in\n{body}");
    };
    for family in [
        "ethersan_native_frames_received_total{",
        "ethersan_native_retransmits_total{",
        "ethersan_native_window_frames{",
        "ethersan_native_rto_seconds{",
    ] {
        assert_eq!(sample(&body, family).len(), 1, "{family} in\n{body}");
    }
    let out = bench.wait_with_output().expect("bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
