//! Defences against a hostile or broken peer on the network: connections per
//! source address, rate-limited warnings, and the back-off after failed
//! CHAP authentications.
//!
//! Everything here is bounded in memory whatever the peer does.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The address a connection is counted under: IPv4-mapped IPv6 addresses
/// (from a dual-stack listener) count as the IPv4 address they carry.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts open connections per source address and refuses those beyond a
/// limit.
#[derive(Debug)]
pub struct ConnectionLimiter {
    limit: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One admitted connection; dropping it (however the connection ends)
/// gives its place back.
#[derive(Debug)]
pub struct ConnectionGuard {
    limiter: Arc<ConnectionLimiter>,
    ip: IpAddr,
}

impl ConnectionLimiter {
    /// A limiter allowing `limit` connections per address (0: unlimited).
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(ConnectionLimiter {
            limit,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// Admit a connection from `ip`, or `None` when that address already
    /// has `limit` connections open.
    pub fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Option<ConnectionGuard> {
        let ip = canonical_ip(ip);
        let mut m = lock(&self.open);
        let n = m.entry(ip).or_insert(0);
        if self.limit != 0 && *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(ConnectionGuard {
            limiter: self.clone(),
            ip,
        })
    }

    /// Connections open from `ip`.
    pub fn open_from(&self, ip: IpAddr) -> usize {
        lock(&self.open)
            .get(&canonical_ip(ip))
            .copied()
            .unwrap_or(0)
    }

    /// Addresses with at least one connection open.
    pub fn addresses(&self) -> usize {
        lock(&self.open).len()
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let mut m = lock(&self.limiter.open);
        if let Some(n) = m.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// Counts connections in the login phase (over every portal and the
/// native transport) and refuses those beyond a limit.
#[derive(Debug)]
pub struct LoginLimiter {
    limit: usize,
    in_login: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
    refused: AtomicU64,
    /// Refusal warnings, at most once a second.
    log: LogThrottle,
}

/// One connection's place in the login phase; dropping it (when the login
/// ends, however) gives the place back.
#[derive(Debug)]
pub struct LoginSlot {
    limiter: Arc<LoginLimiter>,
}

impl LoginLimiter {
    /// A limiter allowing `limit` connections in login at once (0: unlimited).
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(LoginLimiter {
            limit,
            in_login: std::sync::atomic::AtomicUsize::new(0),
            peak: std::sync::atomic::AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            log: LogThrottle::new(Duration::from_secs(1)),
        })
    }

    /// A place for one more connection in login, or `None` (counted as a
    /// refusal) when `limit` are already logging in.
    pub fn try_acquire(self: &Arc<Self>) -> Option<LoginSlot> {
        let admitted = self
            .in_login
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (self.limit == 0 || n < self.limit).then_some(n + 1)
            });
        match admitted {
            Ok(before) => {
                self.peak.fetch_max(before + 1, Ordering::AcqRel);
            }
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
        Some(LoginSlot {
            limiter: self.clone(),
        })
    }

    /// Connections in the login phase now.
    pub fn in_progress(&self) -> usize {
        self.in_login.load(Ordering::Acquire)
    }

    /// The most connections that were in the login phase at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Acquire)
    }

    /// Whether a refusal may be logged now: `Some(n)` with the number of
    /// refusals not logged since the last warning.
    pub fn warning_allowed(&self) -> Option<u64> {
        self.log.allow()
    }

    /// Connections refused so far because the limit was reached.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The limit (0: none).
    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl Drop for LoginSlot {
    fn drop(&mut self) {
        self.limiter.in_login.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Lets a warning through at most once per interval and counts the ones
/// it held back, so a flood cannot flood the log.
#[derive(Debug)]
pub struct LogThrottle {
    interval_ms: u64,
    start: Instant,
    /// Milliseconds after `start` of the last warning let through, plus one
    /// (0: never).
    last: AtomicU64,
    suppressed: AtomicU64,
}

impl LogThrottle {
    /// At most one warning per `interval`.
    pub fn new(interval: Duration) -> Self {
        LogThrottle {
            interval_ms: interval.as_millis().max(1) as u64,
            start: Instant::now(),
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when a warning may be logged now, `n` being how many were
    /// held back since the last one; `None` to stay quiet.
    pub fn allow(&self) -> Option<u64> {
        let now = self.start.elapsed().as_millis() as u64 + 1;
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < self.interval_ms {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self
            .last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

/// Login refusals logged per (peer address, reason) in one window.
pub const REFUSALS_LOGGED_PER_WINDOW: u32 = 5;
/// The window of [`REFUSALS_LOGGED_PER_WINDOW`].
pub const REFUSAL_LOG_WINDOW: Duration = Duration::from_secs(60);
/// Most refusal lines a second over every peer together (a flood from many
/// addresses); the rest are counted for their (peer, reason).
pub const REFUSAL_LINES_PER_SECOND: u32 = 20;
/// Most (peer, reason) pairs the refusal log remembers.
pub const REFUSAL_TABLE_CAPACITY: usize = 4096;

/// What to do with one login refusal's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalLine {
    /// Log it. `suppressed`: refusals of this (peer, reason) counted and
    /// not logged before it (say how many); `last`: the last line of this
    /// window (say that the next ones are counted until it ends).
    Log {
        /// Refusals of this pair not logged since its last line.
        suppressed: u64,
        /// Whether this is the last line before the pair goes quiet.
        last: bool,
    },
    /// Count it, do not log it.
    Count,
}

/// A (peer, reason) pair that went quiet and whose count was not reported
/// yet: say so once its window is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusalSummary {
    /// The peer.
    pub peer: IpAddr,
    /// The reason.
    pub reason: &'static str,
    /// Refusals counted and not logged.
    pub suppressed: u64,
}

#[derive(Debug, Clone, Copy)]
struct RefusalWindow {
    start: Instant,
    logged: u32,
    suppressed: u64,
}

#[derive(Debug)]
struct RefusalTable {
    pairs: HashMap<(IpAddr, &'static str), RefusalWindow>,
    second: Instant,
    lines_this_second: u32,
}

/// Rate limit for login refusal lines: by count per (peer address,
/// reason), so one peer's flood neither floods the log nor hides another
/// peer's failures, and never silently: the line before a pair goes quiet
/// says so, and the count of what was held back comes out with the pair's
/// next line or, once its window is over, as a summary.
///
/// Time is passed in (the `_at` calls), so it is tested without clocks.
#[derive(Debug)]
pub struct RefusalLog {
    table: Mutex<RefusalTable>,
}

impl Default for RefusalLog {
    fn default() -> Self {
        RefusalLog::new(Instant::now())
    }
}

impl RefusalLog {
    /// An empty log limiter, its first second starting at `now`.
    pub fn new(now: Instant) -> Self {
        RefusalLog {
            table: Mutex::new(RefusalTable {
                pairs: HashMap::new(),
                second: now,
                lines_this_second: 0,
            }),
        }
    }

    /// Decide about a refusal of `reason` from `peer` at `now`.
    pub fn refused_at(&self, peer: IpAddr, reason: &'static str, now: Instant) -> RefusalLine {
        let peer = canonical_ip(peer);
        let mut t = lock(&self.table);
        if now.saturating_duration_since(t.second) >= Duration::from_secs(1) {
            t.second = now;
            t.lines_this_second = 0;
        }
        if !t.pairs.contains_key(&(peer, reason)) && t.pairs.len() >= REFUSAL_TABLE_CAPACITY {
            // Forget the pairs with nothing to report; then the oldest.
            t.pairs.retain(|_, w| w.suppressed > 0);
            if t.pairs.len() >= REFUSAL_TABLE_CAPACITY {
                if let Some(k) = t.pairs.iter().min_by_key(|(_, w)| w.start).map(|(k, _)| *k) {
                    t.pairs.remove(&k);
                }
            }
        }
        let over_budget = t.lines_this_second >= REFUSAL_LINES_PER_SECOND;
        let w = t.pairs.entry((peer, reason)).or_insert(RefusalWindow {
            start: now,
            logged: 0,
            suppressed: 0,
        });
        if now.saturating_duration_since(w.start) >= REFUSAL_LOG_WINDOW {
            w.start = now;
            w.logged = 0;
        }
        if over_budget || w.logged >= REFUSALS_LOGGED_PER_WINDOW {
            w.suppressed += 1;
            return RefusalLine::Count;
        }
        w.logged += 1;
        let line = RefusalLine::Log {
            suppressed: std::mem::take(&mut w.suppressed),
            last: w.logged == REFUSALS_LOGGED_PER_WINDOW,
        };
        t.lines_this_second += 1;
        line
    }

    /// The refusal of now ([`refused_at`](Self::refused_at)).
    pub fn refused(&self, peer: IpAddr, reason: &'static str) -> RefusalLine {
        self.refused_at(peer, reason, Instant::now())
    }

    /// The pairs whose window ended at `now` with refusals held back:
    /// their counts, reported once (then forgotten).
    pub fn summaries_at(&self, now: Instant) -> Vec<RefusalSummary> {
        let mut t = lock(&self.table);
        let mut out = Vec::new();
        t.pairs.retain(|(peer, reason), w| {
            if now.saturating_duration_since(w.start) < REFUSAL_LOG_WINDOW {
                return true;
            }
            if w.suppressed > 0 {
                out.push(RefusalSummary {
                    peer: *peer,
                    reason,
                    suppressed: w.suppressed,
                });
            }
            false
        });
        out.sort_by_key(|s| (s.peer, s.reason));
        out
    }

    /// [`summaries_at`](Self::summaries_at) now.
    pub fn summaries(&self) -> Vec<RefusalSummary> {
        self.summaries_at(Instant::now())
    }
}

/// How long failed authentications count.
pub const AUTH_FAILURE_MEMORY: Duration = Duration::from_secs(60);
/// Failures of one (initiator name, address) pair before logins slow down.
pub const FREE_FAILURES_PER_NAME: u32 = 3;
/// Distinct initiator names failing from one address before every login
/// from that address slows down (name rotation).
pub const FREE_NAMES_PER_ADDRESS: usize = 8;
/// The longest back-off.
pub const MAX_AUTH_DELAY: Duration = Duration::from_secs(30);
/// Most (name, address) pairs remembered; the oldest go first.
pub const AUTH_TABLE_CAPACITY: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

#[derive(Debug)]
struct AuthTable {
    /// Keyed by (address, keyed hash of the initiator name): bounded size
    /// whatever the names' length.
    pairs: HashMap<(IpAddr, u64), Failures>,
    /// Per address: how many entries of `pairs` it has.
    names_per_ip: HashMap<IpAddr, usize>,
}

/// Back-off after failed CHAP logins, keyed by (initiator name, source
/// address), with a cap per address.
///
/// Hammering one name from an address slows only that name from that
/// address, so other initiators behind the same NAT still log in at once;
/// failing with many different names from one address slows every login
/// from it. Nothing secret is stored: only a keyed hash of the name.
#[derive(Debug)]
pub struct AuthThrottle {
    hasher: RandomState,
    capacity: usize,
    table: Mutex<AuthTable>,
}

impl Default for AuthThrottle {
    fn default() -> Self {
        AuthThrottle::with_capacity(AUTH_TABLE_CAPACITY)
    }
}

fn backoff(excess: u32) -> Duration {
    Duration::from_secs(1u64 << excess.min(5)).min(MAX_AUTH_DELAY)
}

impl AuthThrottle {
    /// A table remembering at most `capacity` (name, address) pairs.
    pub fn with_capacity(capacity: usize) -> Self {
        AuthThrottle {
            hasher: RandomState::new(),
            capacity: capacity.max(1),
            table: Mutex::new(AuthTable {
                pairs: HashMap::new(),
                names_per_ip: HashMap::new(),
            }),
        }
    }

    fn key(&self, name: &str, ip: IpAddr) -> (IpAddr, u64) {
        (canonical_ip(ip), self.hasher.hash_one(name))
    }

    /// Record a failed authentication of `name` from `ip`.
    pub fn failed(&self, name: &str, ip: IpAddr) {
        self.failed_at(name, ip, Instant::now());
    }

    /// [`failed`](Self::failed) at a given time (for tests).
    pub fn failed_at(&self, name: &str, ip: IpAddr, now: Instant) {
        let key = self.key(name, ip);
        let mut t = lock(&self.table);
        if let Some(f) = t.pairs.get_mut(&key) {
            if now.saturating_duration_since(f.last) > AUTH_FAILURE_MEMORY {
                f.count = 0;
            }
            f.count = f.count.saturating_add(1);
            f.last = now;
            return;
        }
        if t.pairs.len() >= self.capacity {
            // Forget what has expired; if that is not enough, the oldest.
            let expired: Vec<_> = t
                .pairs
                .iter()
                .filter(|(_, f)| now.saturating_duration_since(f.last) > AUTH_FAILURE_MEMORY)
                .map(|(k, _)| *k)
                .collect();
            for k in expired {
                Self::remove(&mut t, &k);
            }
            while t.pairs.len() >= self.capacity {
                let Some(oldest) = t.pairs.iter().min_by_key(|(_, f)| f.last).map(|(k, _)| *k)
                else {
                    break;
                };
                Self::remove(&mut t, &oldest);
            }
        }
        t.pairs.insert(
            key,
            Failures {
                count: 1,
                last: now,
            },
        );
        *t.names_per_ip.entry(key.0).or_insert(0) += 1;
    }

    fn remove(t: &mut AuthTable, key: &(IpAddr, u64)) {
        if t.pairs.remove(key).is_some() {
            if let Some(n) = t.names_per_ip.get_mut(&key.0) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    t.names_per_ip.remove(&key.0);
                }
            }
        }
    }

    /// `name` authenticated from `ip`: forget its failures there.
    pub fn succeeded(&self, name: &str, ip: IpAddr) {
        let key = self.key(name, ip);
        Self::remove(&mut lock(&self.table), &key);
    }

    /// How long a login of `name` from `ip` waits before it is answered.
    pub fn delay(&self, name: &str, ip: IpAddr) -> Duration {
        self.delay_at(name, ip, Instant::now())
    }

    /// [`delay`](Self::delay) at a given time (for tests).
    pub fn delay_at(&self, name: &str, ip: IpAddr, now: Instant) -> Duration {
        let key = self.key(name, ip);
        let t = lock(&self.table);
        let fresh = |f: &Failures| now.saturating_duration_since(f.last) <= AUTH_FAILURE_MEMORY;
        let per_name = match t.pairs.get(&key) {
            Some(f) if fresh(f) && f.count >= FREE_FAILURES_PER_NAME => {
                backoff(f.count - FREE_FAILURES_PER_NAME)
            }
            _ => Duration::ZERO,
        };
        let names = t.names_per_ip.get(&key.0).copied().unwrap_or(0);
        let per_address = if names >= FREE_NAMES_PER_ADDRESS {
            // Count only the names still remembered as failing recently.
            let recent = t
                .pairs
                .iter()
                .filter(|(k, f)| k.0 == key.0 && fresh(f))
                .count();
            if recent >= FREE_NAMES_PER_ADDRESS {
                backoff((recent - FREE_NAMES_PER_ADDRESS) as u32)
            } else {
                Duration::ZERO
            }
        } else {
            Duration::ZERO
        };
        per_name.max(per_address)
    }

    /// (name, address) pairs remembered.
    pub fn len(&self) -> usize {
        lock(&self.table).pairs.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn logins_in_progress_are_capped_and_released() {
        let l = LoginLimiter::new(2);
        let a = l.try_acquire().unwrap();
        let b = l.try_acquire().unwrap();
        assert!(l.try_acquire().is_none());
        assert_eq!((l.in_progress(), l.refused(), l.peak()), (2, 1, 2));
        drop(a);
        let c = l.try_acquire().expect("a place was given back");
        drop((b, c));
        assert_eq!(l.in_progress(), 0);
        let unlimited = LoginLimiter::new(0);
        let all: Vec<_> = (0..1000)
            .map(|_| unlimited.try_acquire().unwrap())
            .collect();
        assert_eq!(unlimited.in_progress(), 1000);
        drop(all);
        assert_eq!(unlimited.in_progress(), 0);
    }

    #[test]
    fn connections_per_address_are_counted_and_released() {
        let l = ConnectionLimiter::new(2);
        let a = l.try_acquire(ip("10.0.0.1")).unwrap();
        let b = l.try_acquire(ip("::ffff:10.0.0.1")).unwrap();
        assert!(
            l.try_acquire(ip("10.0.0.1")).is_none(),
            "a mapped address counts as its IPv4 address"
        );
        let other = l.try_acquire(ip("10.0.0.2")).expect("another address");
        assert_eq!(l.open_from(ip("10.0.0.1")), 2);
        drop(a);
        let c = l
            .try_acquire(ip("10.0.0.1"))
            .expect("a place was given back");
        drop((b, c, other));
        assert_eq!(l.addresses(), 0, "no entries left behind");
        let unlimited = ConnectionLimiter::new(0);
        let many: Vec<_> = (0..1000)
            .map(|_| unlimited.try_acquire(ip("10.0.0.1")).unwrap())
            .collect();
        assert_eq!(unlimited.open_from(ip("10.0.0.1")), 1000);
        drop(many);
        assert_eq!(unlimited.addresses(), 0);
    }

    #[test]
    fn log_throttle_lets_one_through_per_interval() {
        let t = LogThrottle::new(Duration::from_secs(3600));
        assert_eq!(t.allow(), Some(0));
        for _ in 0..100 {
            assert_eq!(t.allow(), None);
        }
        let t = LogThrottle::new(Duration::from_millis(20));
        assert_eq!(t.allow(), Some(0));
        assert_eq!(t.allow(), None);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(t.allow(), Some(1), "reports what it held back");
    }

    #[test]
    fn refusals_are_limited_per_peer_and_reason_and_counted() {
        let start = Instant::now();
        let log = RefusalLog::new(start);
        let (a, b) = (ip("192.0.2.1"), ip("192.0.2.2"));
        let n = REFUSALS_LOGGED_PER_WINDOW;
        for i in 1..=n {
            assert_eq!(
                log.refused_at(a, "wrong CHAP response", start),
                RefusalLine::Log {
                    suppressed: 0,
                    last: i == n
                },
                "{i}"
            );
        }
        for _ in 0..7 {
            assert_eq!(
                log.refused_at(a, "wrong CHAP response", start),
                RefusalLine::Count
            );
        }
        // Another reason from the same peer, and another peer, still log.
        assert!(matches!(
            log.refused_at(a, "not allowed by the access rules", start),
            RefusalLine::Log { .. }
        ));
        assert!(matches!(
            log.refused_at(b, "wrong CHAP response", start),
            RefusalLine::Log { .. }
        ));
        // Nothing to report while the window lasts; after it, the count.
        assert!(log.summaries_at(start + Duration::from_secs(1)).is_empty());
        let later = start + REFUSAL_LOG_WINDOW;
        assert_eq!(
            log.summaries_at(later),
            vec![RefusalSummary {
                peer: a,
                reason: "wrong CHAP response",
                suppressed: 7
            }]
        );
        assert!(log.summaries_at(later).is_empty(), "reported once");
        // A new window logs again.
        assert_eq!(
            log.refused_at(a, "wrong CHAP response", later),
            RefusalLine::Log {
                suppressed: 0,
                last: false
            }
        );
    }

    #[test]
    fn held_back_refusals_come_out_with_the_next_line() {
        let start = Instant::now();
        let log = RefusalLog::new(start);
        let a = ip("198.51.100.9");
        for _ in 0..REFUSALS_LOGGED_PER_WINDOW + 3 {
            log.refused_at(a, "unknown target", start);
        }
        let later = start + REFUSAL_LOG_WINDOW + Duration::from_secs(1);
        assert_eq!(
            log.refused_at(a, "unknown target", later),
            RefusalLine::Log {
                suppressed: 3,
                last: false
            }
        );
    }

    #[test]
    fn a_flood_from_many_peers_is_capped_per_second() {
        let start = Instant::now();
        let log = RefusalLog::new(start);
        let mut logged = 0;
        for i in 0..1000u32 {
            let peer = ip(&format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255));
            if matches!(
                log.refused_at(peer, "wrong CHAP response", start),
                RefusalLine::Log { .. }
            ) {
                logged += 1;
            }
        }
        assert_eq!(logged, REFUSAL_LINES_PER_SECOND);
        let next = start + Duration::from_secs(1);
        assert!(matches!(
            log.refused_at(ip("10.9.9.9"), "wrong CHAP response", next),
            RefusalLine::Log { .. }
        ));
        let total: u64 = log
            .summaries_at(start + REFUSAL_LOG_WINDOW)
            .iter()
            .map(|s| s.suppressed)
            .sum();
        assert_eq!(
            total,
            1000 - u64::from(REFUSAL_LINES_PER_SECOND),
            "every one counted"
        );
    }

    #[test]
    fn back_off_is_per_name_and_address() {
        let t = AuthThrottle::default();
        let now = Instant::now();
        let nat = ip("192.0.2.7");
        for i in 0..3 {
            assert_eq!(
                t.delay_at("iqn.x:attacker", nat, now),
                Duration::ZERO,
                "{i}"
            );
            t.failed_at("iqn.x:attacker", nat, now);
        }
        assert_eq!(
            t.delay_at("iqn.x:attacker", nat, now),
            Duration::from_secs(1)
        );
        for _ in 0..20 {
            t.failed_at("iqn.x:attacker", nat, now);
        }
        assert_eq!(t.delay_at("iqn.x:attacker", nat, now), MAX_AUTH_DELAY);
        // Another initiator behind the same NAT, and the same name from
        // elsewhere, are not slowed.
        assert_eq!(t.delay_at("iqn.x:victim", nat, now), Duration::ZERO);
        assert_eq!(
            t.delay_at("iqn.x:attacker", ip("192.0.2.8"), now),
            Duration::ZERO
        );
        // Failures expire.
        let later = now + AUTH_FAILURE_MEMORY + Duration::from_secs(1);
        assert_eq!(t.delay_at("iqn.x:attacker", nat, later), Duration::ZERO);
        t.failed_at("iqn.x:attacker", nat, later);
        assert_eq!(t.delay_at("iqn.x:attacker", nat, later), Duration::ZERO);
        // Success forgets the pair.
        t.succeeded("iqn.x:attacker", nat);
        assert!(t.is_empty());
    }

    #[test]
    fn rotating_names_from_one_address_is_slowed() {
        let t = AuthThrottle::default();
        let now = Instant::now();
        let a = ip("198.51.100.1");
        for i in 0..FREE_NAMES_PER_ADDRESS {
            assert_eq!(t.delay_at(&format!("iqn.x:n{i}"), a, now), Duration::ZERO);
            t.failed_at(&format!("iqn.x:n{i}"), a, now);
        }
        // Every name from that address now waits, a fresh one included.
        assert_eq!(t.delay_at("iqn.x:fresh", a, now), Duration::from_secs(1));
        for i in 0..10 {
            t.failed_at(&format!("iqn.x:m{i}"), a, now);
        }
        assert_eq!(t.delay_at("iqn.x:fresh", a, now), MAX_AUTH_DELAY);
        // Other addresses are unaffected.
        assert_eq!(
            t.delay_at("iqn.x:fresh", ip("198.51.100.2"), now),
            Duration::ZERO
        );
    }

    #[test]
    fn table_is_bounded_and_evicts_the_oldest() {
        let t = AuthThrottle::with_capacity(16);
        let start = Instant::now();
        for i in 0..1000u32 {
            let now = start + Duration::from_millis(u64::from(i));
            t.failed_at(
                &format!("iqn.x:{i}"),
                ip(&format!("10.0.{}.{}", i / 256, i % 256)),
                now,
            );
            assert!(t.len() <= 16);
        }
        let now = start + Duration::from_millis(1000);
        // The newest are remembered, the oldest are gone.
        for _ in 0..2 {
            t.failed_at("iqn.x:999", ip("10.0.3.231"), now);
        }
        assert_eq!(
            t.delay_at("iqn.x:999", ip("10.0.3.231"), now),
            Duration::from_secs(1)
        );
        let inner = lock(&t.table);
        assert_eq!(inner.pairs.len(), 16);
        assert_eq!(
            inner.names_per_ip.values().sum::<usize>(),
            16,
            "per-address counts follow evictions"
        );
        assert!(!inner.names_per_ip.contains_key(&ip("10.0.0.0")));
    }
}
