//! The web dashboard: a static page (`GET /`, `GET /assets/{file}`,
//! embedded in the binary, public: they hold no data) and the live
//! statistics it charts (`GET /api/v1/stats/stream`, Server-Sent Events,
//! behind the token like the rest of the API).
//!
//! Each second the stream sends one `stats` event: per LUN, the read and
//! write IOPS and MB/s and the median and 99th percentile latency over
//! that second (from the difference of two snapshots of the LUN's
//! counters and their latency histogram), and the number of sessions.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use ethersan_core::counters::{Snapshot, LATENCY_BUCKETS};
use ethersan_server::registry::Registry;
use futures_util::stream::Stream;
use serde::{Deserialize, Serialize};

use crate::api::Failure;
use crate::AdminState;

/// How often the stream sends an event.
pub const STATS_INTERVAL: Duration = Duration::from_secs(1);

/// The page's files: name, content type, content.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../assets/style.css"),
    ),
];

/// The page itself.
const INDEX: &str = include_str!("../assets/index.html");

/// The page's security headers: nothing but its own files, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

fn page(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: the dashboard's page.
pub async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX)
}

/// `GET /assets/{file}`: the page's script and style sheet.
pub async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, ty, body)) => page(ty, body),
        None => Failure(StatusCode::NOT_FOUND, format!("no asset {file:?}")).into_response(),
    }
}

/// One LUN's activity over the last interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LunStats {
    /// The target's name.
    pub target: String,
    /// The LUN number.
    pub lun: u64,
    /// Read commands per second.
    pub read_iops: f64,
    /// Write commands per second.
    pub write_iops: f64,
    /// Megabytes (10^6 bytes) read per second.
    pub read_mbps: f64,
    /// Megabytes written per second.
    pub write_mbps: f64,
    /// Median latency of the commands that finished, µs (the upper bound
    /// of its power-of-two bucket); `null` when none did.
    pub p50_us: Option<u64>,
    /// 99th percentile latency, µs, likewise.
    pub p99_us: Option<u64>,
}

/// One event of the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// When, in milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// Live sessions (discovery ones included).
    pub sessions: usize,
    /// Every LUN of every target.
    pub luns: Vec<LunStats>,
}

/// The latency under which a fraction `q` of the commands counted in
/// `hist` finished: the upper bound, in µs, of the bucket holding that
/// rank (the last bucket, unbounded, reports its lower bound).
pub fn percentile(hist: &[u64; LATENCY_BUCKETS], q: f64) -> Option<u64> {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            let shift = if i + 1 < LATENCY_BUCKETS { i + 1 } else { i };
            return Some(1u64 << shift);
        }
    }
    Some(1u64 << (LATENCY_BUCKETS - 1))
}

/// One LUN's statistics from its counters at two moments `secs` apart.
pub fn lun_stats(target: &str, lun: u64, before: &Snapshot, now: &Snapshot, secs: f64) -> LunStats {
    let secs = secs.max(1e-3);
    let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
    let mut hist = [0u64; LATENCY_BUCKETS];
    for (i, h) in hist.iter_mut().enumerate() {
        *h = now.latency[i].saturating_sub(before.latency[i]);
    }
    LunStats {
        target: target.to_string(),
        lun,
        read_iops: rate(before.reads, now.reads),
        write_iops: rate(before.writes, now.writes),
        read_mbps: rate(before.read_bytes, now.read_bytes) / 1e6,
        write_mbps: rate(before.write_bytes, now.write_bytes) / 1e6,
        p50_us: percentile(&hist, 0.50),
        p99_us: percentile(&hist, 0.99),
    }
}

/// The previous snapshots, to take differences from.
#[derive(Default)]
struct Sampler {
    last: HashMap<(String, u64), Snapshot>,
    at: Option<Instant>,
}

impl Sampler {
    /// Statistics since the previous call (zero on the first: there is
    /// nothing to compare with yet). LUNs that appeared since count from
    /// their first snapshot; LUNs that went are forgotten.
    fn sample(&mut self, registry: &Registry) -> Stats {
        let now = Instant::now();
        let secs = self
            .at
            .map(|t| now.duration_since(t).as_secs_f64())
            .unwrap_or(1.0);
        let mut next = HashMap::new();
        let mut luns = Vec::new();
        for t in registry.targets().iter() {
            for (lun, _) in t.scsi.luns().iter() {
                let snap = t
                    .lun_counters(*lun)
                    .map(|c| c.snapshot())
                    .unwrap_or_default();
                let key = (t.name.clone(), *lun);
                let before = self.last.get(&key).unwrap_or(&snap);
                luns.push(lun_stats(&t.name, *lun, before, &snap, secs));
                next.insert(key, snap);
            }
        }
        self.last = next;
        self.at = Some(now);
        Stats {
            time_ms: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            sessions: registry.sessions().len(),
            luns,
        }
    }
}

/// `GET /api/v1/stats/stream`: a `stats` event (a [`Stats`] as JSON)
/// every second until the client goes.
pub async fn stream(
    State(s): State<AdminState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let registry = s.control.registry().clone();
    let mut tick = tokio::time::interval(STATS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let events = futures_util::stream::unfold(
        (Sampler::default(), tick, registry),
        |(mut sampler, mut tick, registry)| async move {
            tick.tick().await;
            let stats = sampler.sample(&registry);
            let event = Event::default()
                .event("stats")
                .json_data(&stats)
                .unwrap_or_else(|e| Event::default().event("error").data(e.to_string()));
            Some((Ok(event), (sampler, tick, registry)))
        },
    );
    Sse::new(events).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_histogram() {
        let mut h = [0u64; LATENCY_BUCKETS];
        assert_eq!(percentile(&h, 0.5), None);
        // 90 commands under 64 µs (bucket 5), 10 under 1024 µs (bucket 9).
        h[5] = 90;
        h[9] = 10;
        assert_eq!(percentile(&h, 0.5), Some(64));
        assert_eq!(percentile(&h, 0.9), Some(64));
        assert_eq!(percentile(&h, 0.99), Some(1024));
        h[LATENCY_BUCKETS - 1] = 1000;
        assert_eq!(percentile(&h, 0.99), Some(1 << (LATENCY_BUCKETS - 1)));
    }

    #[test]
    fn rates_from_two_snapshots() {
        let before = Snapshot {
            reads: 100,
            read_bytes: 100 * 4096,
            ..Snapshot::default()
        };
        let mut now = before.clone();
        now.reads += 2000;
        now.read_bytes += 2000 * 4096;
        now.writes += 500;
        now.write_bytes += 500 * 1_000_000;
        now.latency[3] += 2500;
        let s = lun_stats("t", 0, &before, &now, 2.0);
        assert_eq!(s.read_iops, 1000.0);
        assert_eq!(s.write_iops, 250.0);
        assert!((s.read_mbps - 4.096).abs() < 1e-9);
        assert_eq!(s.write_mbps, 250.0);
        assert_eq!(s.p50_us, Some(16));
        assert_eq!(s.p99_us, Some(16));
    }
}
