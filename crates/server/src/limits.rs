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
