//! `/metrics`: the server's counters in the OpenMetrics text format
//! (which Prometheus scrapes), collected on each scrape from the counters
//! the data path already keeps — nothing here is counted twice.
//!
//! Encoded with `prometheus-client`'s text encoder through its
//! [`Collector`] trait; docs/metrics.md lists every metric.

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use ethersan_channel::channel::ChannelStats;
use ethersan_core::counters::{Snapshot, LATENCY_BUCKETS};
use ethersan_server::control::Control;
use ethersan_server::stats::LoginFailure;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::AdminState;

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of one sample.
type Labels = Vec<(&'static str, Cow<'static, str>)>;

/// The SPC name of a sense key (a label value).
pub fn sense_key_name(key: usize) -> &'static str {
    match key {
        0x0 => "no_sense",
        0x1 => "recovered_error",
        0x2 => "not_ready",
        0x3 => "medium_error",
        0x4 => "hardware_error",
        0x5 => "illegal_request",
        0x6 => "unit_attention",
        0x7 => "data_protect",
        0x8 => "blank_check",
        0x9 => "vendor_specific",
        0xa => "copy_aborted",
        0xb => "aborted_command",
        0xc => "obsolete_0c",
        0xd => "volume_overflow",
        0xe => "miscompare",
        _ => "reserved_0f",
    }
}

/// Sense keys always reported (zero or not), so that `rate()` has a
/// series from the start; the others only once they have occurred.
fn always_reported(key: usize) -> bool {
    matches!(key, 0x1..=0x7 | 0xb | 0xd | 0xe)
}

/// The collector the scrape encodes: reads the registry when asked.
#[derive(Debug)]
struct ServerCollector {
    control: Arc<Control>,
    /// The native transport's open channels and their counters, read
    /// before the scrape encodes.
    channels: Vec<(ethersan_endpoint::ChannelInfo, ChannelStats)>,
}

/// Encode one family of samples of one type.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, M)],
) -> Result<(), std::fmt::Error> {
    if samples.is_empty() {
        return Ok(());
    }
    let metric_type = samples[0].1.metric_type();
    let mut m = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (labels, metric) in samples {
        metric.encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// A counter of non-negative integers.
fn counter(v: u64) -> ConstCounter<u64> {
    ConstCounter::new(v)
}

/// A gauge from a count.
fn gauge(v: u64) -> ConstGauge<i64> {
    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
}

/// Reads one counter of a snapshot.
type Field = fn(&Snapshot) -> u64;

/// The command counters of many label sets (LUNs or initiators), as the
/// families `ethersan_{what}_…`.
fn io_families(
    encoder: &mut DescriptorEncoder,
    what: &str,
    of: &str,
    rows: &[(Labels, Snapshot)],
) -> Result<(), std::fmt::Error> {
    let simple: [(&str, &str, Field); 6] = [
        ("reads", "Read commands", |s| s.reads),
        ("writes", "Write commands", |s| s.writes),
        (
            "other_commands",
            "Other commands (INQUIRY, SYNCHRONIZE CACHE, UNMAP, ...)",
            |s| s.others,
        ),
        ("read_bytes", "Bytes read by successful read commands", |s| {
            s.read_bytes
        }),
        (
            "written_bytes",
            "Bytes written by successful write commands",
            |s| s.write_bytes,
        ),
        (
            "other_failures",
            "Commands that ended with a non-GOOD status other than CHECK CONDITION (RESERVATION CONFLICT, BUSY, TASK SET FULL, ...)",
            |s| s.other_failures,
        ),
    ];
    for (name, help, get) in simple {
        let samples: Vec<(Labels, ConstCounter<u64>)> = rows
            .iter()
            .map(|(l, s)| (l.clone(), counter(get(s))))
            .collect();
        family(
            encoder,
            &format!("{what}_{name}"),
            &format!("{help}, per {of}"),
            &samples,
        )?;
    }
    let mut errors: Vec<(Labels, ConstCounter<u64>)> = Vec::new();
    for (l, s) in rows {
        for (key, n) in s.errors.iter().enumerate() {
            if *n > 0 || always_reported(key) {
                let mut l = l.clone();
                l.push(("sense_key", Cow::Borrowed(sense_key_name(key))));
                errors.push((l, counter(*n)));
            }
        }
    }
    family(
        encoder,
        &format!("{what}_errors"),
        &format!("Commands that ended with CHECK CONDITION, by sense key, per {of}"),
        &errors,
    )?;
    if rows.is_empty() {
        return Ok(());
    }
    let name = format!("{what}_latency_seconds");
    let mut m = encoder.encode_descriptor(
        &name,
        &format!("Command latency, per {of} (bucket bounds are powers of two of microseconds)"),
        None,
        MetricType::Histogram,
    )?;
    for (l, s) in rows {
        let (buckets, count) = latency_buckets(&s.latency);
        let sum = s.latency_sum_us as f64 / 1e6;
        m.encode_family(l)?
            .encode_histogram::<Labels>(sum, count, &buckets, None)?;
    }
    Ok(())
}

/// The histogram's buckets as (upper bound in seconds, count in that
/// bucket alone) — the encoder makes them cumulative — and the total.
/// Bucket *i* counts commands under 2^(i+1) µs; the last one, the rest.
fn latency_buckets(latency: &[u64; LATENCY_BUCKETS]) -> (Vec<(f64, u64)>, u64) {
    let mut out = Vec::with_capacity(LATENCY_BUCKETS);
    let mut total = 0u64;
    for (i, n) in latency.iter().enumerate() {
        total = total.saturating_add(*n);
        let le = if i + 1 == LATENCY_BUCKETS {
            f64::INFINITY
        } else {
            (1u64 << (i + 1)) as f64 / 1e6
        };
        out.push((le, *n));
    }
    (out, total)
}

impl ServerCollector {
    /// The native transport's open channels: how many by security level,
    /// and each channel's window, round trip and loss counters (labels
    /// peer and channel, the target's channel id).
    fn encode_native(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut by_level: std::collections::BTreeMap<String, u64> =
            ["none", "integrity", "encrypt"]
                .iter()
                .map(|l| (l.to_string(), 0))
                .collect();
        for (info, _) in &self.channels {
            *by_level.entry(info.level.to_string()).or_default() += 1;
        }
        let open: Vec<(Labels, ConstGauge<i64>)> = by_level
            .into_iter()
            .map(|(l, n)| (vec![("level", Cow::Owned(l))], gauge(n)))
            .collect();
        family(
            encoder,
            "native_channels",
            "Open channels of the native transport, by security level",
            &open,
        )?;
        let labels = |info: &ethersan_endpoint::ChannelInfo| -> Labels {
            vec![
                ("peer", Cow::Owned(info.peer.to_string())),
                ("channel", Cow::Owned(info.local_id.to_string())),
            ]
        };
        type Pick = fn(&ChannelStats) -> u64;
        let counters: [(&str, &str, Pick); 9] = [
            ("native_frames_sent", "Frames sent on the channel", |s| {
                s.frames_sent
            }),
            (
                "native_frames_received",
                "Frames received on the channel",
                |s| s.frames_received,
            ),
            (
                "native_bytes_sent",
                "Payload bytes sent on the channel",
                |s| s.bytes_sent,
            ),
            (
                "native_bytes_received",
                "Payload bytes received on the channel",
                |s| s.bytes_received,
            ),
            (
                "native_retransmits",
                "Frames sent again (timeouts and fast retransmits)",
                |s| s.retransmits,
            ),
            (
                "native_fast_retransmits",
                "Frames sent again before their timeout (selective acknowledgements)",
                |s| s.fast_retransmits,
            ),
            ("native_timeouts", "Retransmission timeouts", |s| s.timeouts),
            ("native_duplicates", "Duplicate frames received", |s| {
                s.duplicates
            }),
            (
                "native_rejected",
                "Frames rejected (bad check value or tag, replays)",
                |s| s.rejected,
            ),
        ];
        for (name, help, pick) in counters {
            let v: Vec<(Labels, ConstCounter<u64>)> = self
                .channels
                .iter()
                .map(|(i, s)| (labels(i), counter(pick(s))))
                .collect();
            family(encoder, name, help, &v)?;
        }
        let gauges: [(&str, &str, Pick); 3] = [
            ("native_window_frames", "Congestion window, frames", |s| {
                u64::from(s.cwnd)
            }),
            (
                "native_in_flight_frames",
                "Frames sent and not yet acknowledged",
                |s| u64::from(s.in_flight),
            ),
            (
                "native_peer_credit_frames",
                "Frames the peer's receive window allows",
                |s| u64::from(s.peer_credit),
            ),
        ];
        for (name, help, pick) in gauges {
            let v: Vec<(Labels, ConstGauge<i64>)> = self
                .channels
                .iter()
                .map(|(i, s)| (labels(i), gauge(pick(s))))
                .collect();
            family(encoder, name, help, &v)?;
        }
        let rtt: Vec<(Labels, ConstGauge<f64>)> = self
            .channels
            .iter()
            .filter_map(|(i, s)| Some((labels(i), ConstGauge::new(s.srtt?.as_secs_f64()))))
            .collect();
        family(
            encoder,
            "native_srtt_seconds",
            "Smoothed round-trip time of the channel",
            &rtt,
        )?;
        let rto: Vec<(Labels, ConstGauge<f64>)> = self
            .channels
            .iter()
            .map(|(i, s)| (labels(i), ConstGauge::new(s.rto.as_secs_f64())))
            .collect();
        family(
            encoder,
            "native_rto_seconds",
            "Retransmission timeout of the channel",
            &rto,
        )
    }
}

impl Collector for ServerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.encode_native(&mut encoder)?;
        let registry = self.control.registry();
        // Per LUN.
        let targets = registry.targets();
        let mut luns: Vec<(Labels, Snapshot)> = Vec::new();
        for t in targets.iter() {
            for (lun, _) in t.scsi.luns().iter() {
                if let Some(c) = t.lun_counters(*lun) {
                    let labels: Labels = vec![
                        ("target", Cow::Owned(t.name.clone())),
                        ("lun", Cow::Owned(lun.to_string())),
                    ];
                    luns.push((labels, c.snapshot()));
                }
            }
        }
        family(
            &mut encoder,
            "targets",
            "Targets exported",
            &[(Labels::new(), gauge(targets.len() as u64))],
        )?;
        family(
            &mut encoder,
            "luns",
            "LUNs exported",
            &[(Labels::new(), gauge(luns.len() as u64))],
        )?;
        io_families(&mut encoder, "lun", "LUN", &luns)?;
        let in_flight: Vec<(Labels, ConstGauge<i64>)> = luns
            .iter()
            .map(|(l, s)| (l.clone(), gauge(s.in_flight)))
            .collect();
        family(
            &mut encoder,
            "lun_commands_in_flight",
            "Commands of the LUN being executed now",
            &in_flight,
        )?;
        // Per initiator.
        let initiators: Vec<(Labels, Snapshot)> = registry
            .directory()
            .initiators()
            .into_iter()
            .map(|(name, c)| {
                let labels: Labels = vec![("initiator", Cow::Owned(name))];
                (labels, c.snapshot())
            })
            .collect();
        io_families(&mut encoder, "initiator", "initiator", &initiators)?;
        // Sessions by transport.
        let (mut iscsi, mut native, mut starting) = (0u64, 0u64, 0u64);
        for s in registry.sessions() {
            match s.details.as_ref().map(|d| d.transport) {
                Some("native") => native += 1,
                Some(_) => iscsi += 1,
                None => starting += 1,
            }
        }
        let by_transport = |t: &'static str, n: u64| -> (Labels, ConstGauge<i64>) {
            (vec![("transport", Cow::Borrowed(t))], gauge(n))
        };
        family(
            &mut encoder,
            "sessions",
            "Live sessions by transport (starting: logged in, not yet running)",
            &[
                by_transport("iscsi", iscsi),
                by_transport("native", native),
                by_transport("starting", starting),
            ],
        )?;
        // Logins and connections.
        let stats = registry.login_stats().snapshot();
        family(
            &mut encoder,
            "connections",
            "Open connections (logged in or not) by transport",
            &[
                (
                    vec![("transport", Cow::Borrowed("iscsi"))],
                    gauge(stats.connections.saturating_sub(stats.native_connections)),
                ),
                (
                    vec![("transport", Cow::Borrowed("native"))],
                    gauge(stats.native_connections),
                ),
            ],
        )?;
        family(
            &mut encoder,
            "logins",
            "Logins that made a session (discovery sessions included)",
            &[(Labels::new(), counter(stats.logins))],
        )?;
        let failures: Vec<(Labels, ConstCounter<u64>)> = LoginFailure::ALL
            .iter()
            .zip(stats.failures)
            .map(|(r, n)| (vec![("reason", Cow::Borrowed(r.name()))], counter(n)))
            .collect();
        family(
            &mut encoder,
            "login_failures",
            "Logins that made no session (or connections refused before their login), by reason",
            &failures,
        )?;
        family(
            &mut encoder,
            "auth_throttled",
            "(Initiator name, address) pairs the CHAP back-off remembers failures of",
            &[(Labels::new(), gauge(registry.auth_throttled() as u64))],
        )?;
        family(
            &mut encoder,
            "auth_delays",
            "Logins delayed by the back-off after failed authentications",
            &[(Labels::new(), counter(stats.auth_delays))],
        )?;
        family(
            &mut encoder,
            "auth_delay_seconds",
            "Time logins were delayed by the authentication back-off",
            &[(
                Labels::new(),
                ConstCounter::new(stats.auth_delay_us as f64 / 1e6),
            )],
        )?;
        // The process.
        if let Some(p) = crate::procfs::read() {
            family(
                &mut encoder,
                "process_cpu_seconds",
                "User and system CPU time of the server process",
                &[(Labels::new(), ConstCounter::new(p.cpu_seconds))],
            )?;
            let gauges: [(&str, &str, f64); 4] = [
                (
                    "process_resident_memory_bytes",
                    "Resident memory of the server process",
                    p.resident_bytes as f64,
                ),
                (
                    "process_open_fds",
                    "Open file descriptors of the server process",
                    p.open_fds as f64,
                ),
                (
                    "process_threads",
                    "Threads of the server process",
                    p.threads as f64,
                ),
                (
                    "process_start_time_seconds",
                    "When the server process started, seconds since the Unix epoch",
                    p.start_time_seconds,
                ),
            ];
            for (name, help, v) in gauges {
                family(
                    &mut encoder,
                    name,
                    help,
                    &[(Labels::new(), ConstGauge::new(v))],
                )?;
            }
        }
        Ok(())
    }
}

/// The metrics of the server behind `state`, in the OpenMetrics text
/// format ([`CONTENT_TYPE`]), ending with `# EOF`.
pub fn render(state: &AdminState) -> String {
    render_with(state, Vec::new())
}

/// [`render`] with the native transport's channels' counters.
fn render_with(
    state: &AdminState,
    channels: Vec<(ethersan_endpoint::ChannelInfo, ChannelStats)>,
) -> String {
    let mut registry = prometheus_client::registry::Registry::with_prefix("ethersan");
    registry.register_collector(Box::new(ServerCollector {
        control: state.control.clone(),
        channels,
    }));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        // Writing to a String fails only if an encoder refuses a value;
        // the scrape then gets what was encoded and the log says why.
        tracing::warn!(%e, "cannot encode the metrics");
    }
    out
}

/// `GET /metrics`.
pub(crate) async fn handler(State(state): State<AdminState>) -> impl IntoResponse {
    // The native endpoints' tasks report their channels (bounded: a busy
    // endpoint does not hold up the scrape).
    let mut channels = Vec::new();
    for e in state.native.iter() {
        if let Ok(Ok(v)) =
            tokio::time::timeout(std::time::Duration::from_millis(500), e.stats()).await
        {
            channels.extend(v);
        }
    }
    // Reading /proc and locking the registry's maps: off the reactor.
    let body = tokio::task::spawn_blocking(move || render_with(&state, channels))
        .await
        .unwrap_or_default();
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], body)
}

/// Serve only `GET /metrics`, without authentication (`serve --metrics
/// ADDR:PORT`: for a Prometheus on a trusted network). Runs until the task
/// is aborted.
pub fn serve_metrics(
    listener: tokio::net::TcpListener,
    state: AdminState,
) -> tokio::task::JoinHandle<()> {
    let app = Router::new()
        .route("/metrics", get(handler))
        .with_state(state);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(%e, "the metrics listener stopped");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethersan_core::counters::CommandKind;
    use ethersan_scsi::{ScsiResponse, ScsiStatus};
    use std::collections::HashMap;
    use std::time::Duration;

    const IQN: &str = "iqn.2026-11.org.ethersan:metrics";

    /// One sample line: `name{labels} value`, labels sorted as written.
    fn parse(text: &str) -> HashMap<String, f64> {
        let mut out = HashMap::new();
        for line in text.lines() {
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            let v: f64 = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().expect("a number"),
            };
            assert!(
                out.insert(series.to_string(), v).is_none(),
                "twice: {series}"
            );
        }
        out
    }

    async fn state() -> (AdminState, ethersan_server::Server) {
        let cfg = ethersan_server::config::Config::from_toml_str(
            &format!(
                "portals = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\nlun = [\"ram:1M\", \"ram:1M\"]\n"
            ),
            "t",
        )
        .expect("config");
        let server = ethersan_server::Server::bind(&cfg).await.expect("bind");
        let control = Control::new(server.reloader(), server.registry().clone(), None);
        (AdminState::new(Arc::new(control)), server)
    }

    fn resp(status: ScsiStatus, key: u8) -> ScsiResponse {
        let mut sense = Vec::new();
        if status == ScsiStatus::CheckCondition {
            sense = vec![0u8; 18];
            sense[0] = 0x70;
            sense[2] = key;
        }
        ScsiResponse {
            status,
            sense,
            data_in: Default::default(),
            data_out_len: None,
        }
    }

    #[tokio::test]
    async fn renders_lun_initiator_login_and_process_metrics() {
        let (state, _server) = state().await;
        let registry = state.control.registry().clone();
        let t = registry.target(IQN).expect("target");
        let lun1 = t.lun_counters(1).expect("LUN 1");
        let good = resp(ScsiStatus::Good, 0);
        for _ in 0..5 {
            lun1.record(CommandKind::Read, 4096, &good, Duration::from_micros(3));
        }
        lun1.record(CommandKind::Write, 512, &good, Duration::from_millis(3));
        lun1.record(
            CommandKind::Write,
            512,
            &resp(ScsiStatus::CheckCondition, 0x3),
            Duration::from_micros(1),
        );
        lun1.record(
            CommandKind::Other,
            0,
            &resp(ScsiStatus::CheckCondition, 0xf),
            Duration::from_secs(100),
        );
        lun1.record(
            CommandKind::Other,
            0,
            &resp(ScsiStatus::ReservationConflict, 0),
            Duration::from_micros(1),
        );
        let ini = registry
            .directory()
            .initiator_counters("iqn.x:\"quoted\"\\name\n");
        ini.record(CommandKind::Read, 512, &good, Duration::from_micros(1));
        registry.login_stats().login();
        registry
            .login_stats()
            .failed(ethersan_server::stats::LoginFailure::NotFound);

        let text = render(&state);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("# TYPE ethersan_lun_latency_seconds histogram"));
        let m = parse(&text);
        let lun = |name: &str, lun: u32| {
            let key = format!("{name}{{target=\"{IQN}\",lun=\"{lun}\"}}");
            *m.get(&key).unwrap_or_else(|| panic!("no {key} in\n{text}"))
        };
        assert_eq!(lun("ethersan_lun_reads_total", 1), 5.0);
        assert_eq!(lun("ethersan_lun_reads_total", 0), 0.0);
        assert_eq!(lun("ethersan_lun_writes_total", 1), 2.0);
        assert_eq!(lun("ethersan_lun_other_commands_total", 1), 2.0);
        assert_eq!(lun("ethersan_lun_read_bytes_total", 1), 5.0 * 4096.0);
        assert_eq!(lun("ethersan_lun_written_bytes_total", 1), 512.0);
        assert_eq!(lun("ethersan_lun_other_failures_total", 1), 1.0);
        assert_eq!(lun("ethersan_lun_latency_seconds_count", 1), 9.0);
        let sum = lun("ethersan_lun_latency_seconds_sum", 1);
        assert!((sum - (100.0 + 0.003 + 0.000_017)).abs() < 1e-9, "{sum}");
        let bucket = |le: &str| {
            let key = format!(
                "ethersan_lun_latency_seconds_bucket{{le=\"{le}\",target=\"{IQN}\",lun=\"1\"}}"
            );
            *m.get(&key).unwrap_or_else(|| panic!("no {key} in\n{text}"))
        };
        // Cumulative: 2 under 2 µs, 7 under 4 µs, 8 under 4.096 ms, all 9.
        assert_eq!(bucket("0.000002"), 2.0);
        assert_eq!(bucket("0.000004"), 7.0);
        assert_eq!(bucket("0.002048"), 7.0);
        assert_eq!(bucket("0.004096"), 8.0);
        assert_eq!(bucket("+Inf"), 9.0);
        let err = |key: &str| {
            let k = format!(
                "ethersan_lun_errors_total{{target=\"{IQN}\",lun=\"1\",sense_key=\"{key}\"}}"
            );
            *m.get(&k).unwrap_or_else(|| panic!("no {k} in\n{text}"))
        };
        assert_eq!(err("medium_error"), 1.0);
        assert_eq!(err("reserved_0f"), 1.0);
        assert_eq!(err("unit_attention"), 0.0);
        assert_eq!(err("illegal_request"), 0.0);
        // Peer-chosen names are escaped, not breaking the format.
        assert_eq!(
            m["ethersan_initiator_reads_total{initiator=\"iqn.x:\\\"quoted\\\"\\\\name\\n\"}"],
            1.0
        );
        assert_eq!(m["ethersan_logins_total"], 1.0);
        assert_eq!(
            m["ethersan_login_failures_total{reason=\"not_found\"}"],
            1.0
        );
        assert_eq!(
            m["ethersan_login_failures_total{reason=\"authentication\"}"],
            0.0
        );
        assert_eq!(m["ethersan_sessions{transport=\"iscsi\"}"], 0.0);
        assert_eq!(m["ethersan_connections{transport=\"iscsi\"}"], 0.0);
        assert_eq!(m["ethersan_connections{transport=\"native\"}"], 0.0);
        assert_eq!(m["ethersan_targets"], 1.0);
        assert_eq!(m["ethersan_luns"], 2.0);
        assert_eq!(m["ethersan_auth_throttled"], 0.0);
        assert!(m["ethersan_process_resident_memory_bytes"] > 1e6);
        assert!(m["ethersan_process_threads"] >= 1.0);
        assert!(m["ethersan_process_open_fds"] >= 3.0);
        assert!(m["ethersan_process_start_time_seconds"] > 1.7e9);
        assert!(m.contains_key("ethersan_process_cpu_seconds_total"));
    }

    #[tokio::test]
    async fn metrics_route_answers_with_openmetrics() {
        let (state, _server) = state().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = serve_metrics(listener, state);
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(out.contains(CONTENT_TYPE), "{out}");
        assert!(out.contains("ethersan_lun_reads_total{"), "{out}");
        task.abort();
    }

    async fn get(addr: std::net::SocketAddr, auth: Option<&str>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let auth = auth
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        s.write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn metrics_on_the_api_listener_need_the_token() {
        let (state, _server) = state().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let token = "metrics-token-0123456789abcdef";
        let task = crate::serve_tcp(
            listener,
            state,
            crate::Token::new(token.as_bytes().to_vec()).unwrap(),
        );
        let denied = get(addr, None).await;
        assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");
        assert!(!denied.contains("ethersan_lun_reads_total"));
        let wrong = get(addr, Some("metrics-token-0123456789abcdeX")).await;
        assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
        let ok = get(addr, Some(token)).await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("ethersan_lun_reads_total{"), "{ok}");
        task.abort();
    }

    #[test]
    fn sense_key_names_are_distinct() {
        let names: std::collections::HashSet<_> = (0..16).map(sense_key_name).collect();
        assert_eq!(names.len(), 16);
        assert_eq!(sense_key_name(99), "reserved_0f");
    }
}
