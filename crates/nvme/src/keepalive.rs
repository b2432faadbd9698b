//! NVMe Base Specification 1.4 §7.12 (Keep Alive) and NVMe-oF 1.1 §3.3
//! (KATO in Connect): the controller's Keep Alive timer, with time passed
//! in by the caller.

use std::time::{Duration, Instant};

/// The Keep Alive timer of one controller: armed with the Keep Alive
/// Timeout from Connect, restarted by Keep Alive commands (and, as this
/// target does, by any command), expired when the deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlive {
    timeout: Option<Duration>,
    deadline: Option<Instant>,
}

impl KeepAlive {
    /// A timer that never expires.
    pub const fn off() -> Self {
        KeepAlive {
            timeout: None,
            deadline: None,
        }
    }

    /// A timer of `kato_ms` milliseconds started at `now`; 0 turns it off.
    pub fn start(kato_ms: u32, now: Instant) -> Self {
        if kato_ms == 0 {
            return Self::off();
        }
        let timeout = Duration::from_millis(u64::from(kato_ms));
        KeepAlive {
            timeout: Some(timeout),
            deadline: now.checked_add(timeout),
        }
    }

    /// Restarts the timer: the host showed it is alive at `now`.
    pub fn restart(&mut self, now: Instant) {
        if let Some(t) = self.timeout {
            self.deadline = now.checked_add(t);
        }
    }

    /// When the timer expires, if it runs.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether the timer has expired at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_and_restart() {
        let t0 = Instant::now();
        let mut k = KeepAlive::start(1000, t0);
        assert_eq!(k.deadline(), Some(t0 + Duration::from_secs(1)));
        assert!(!k.expired(t0 + Duration::from_millis(999)));
        k.restart(t0 + Duration::from_millis(500));
        assert!(!k.expired(t0 + Duration::from_millis(1200)));
        assert!(k.expired(t0 + Duration::from_millis(1500)));
        let off = KeepAlive::start(0, t0);
        assert_eq!(off.deadline(), None);
        assert!(!off.expired(t0 + Duration::from_secs(100_000)));
    }
}
