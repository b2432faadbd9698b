//! Round-trip time estimation for AoE retransmission (AoE has no transport
//! layer, so the initiator times its own commands): Jacobson/Karels
//! smoothing as RFC 6298 §2 writes it, with Karn's rule and exponential
//! backoff.
//!
//! SRTT and RTTVAR start from the first sample (SRTT = R, RTTVAR = R/2),
//! then RTTVAR ← ¾·RTTVAR + ¼·|SRTT − R| and SRTT ← ⅞·SRTT + ⅛·R. The RTO is
//! SRTT + 4·RTTVAR, clamped to [min, max]. Callers feed samples only from
//! commands sent once (Karn: the response to a retransmitted command could
//! answer either transmission). After a timeout the RTO doubles until the
//! next valid sample, so a path that became slow is not hammered with
//! retransmissions that never yield a sample.

use std::time::Duration;

/// Most doublings applied to the RTO after consecutive timeouts.
const MAX_BACKOFF: u32 = 16;

/// Jacobson/Karels RTT estimator.
#[derive(Debug, Clone)]
pub struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    initial: Duration,
    min: Duration,
    max: Duration,
    backoff: u32,
}

impl RttEstimator {
    /// An estimator answering `initial` until the first sample, its RTO
    /// always within `[min, max]`.
    pub fn new(initial: Duration, min: Duration, max: Duration) -> RttEstimator {
        let max = max.max(min);
        RttEstimator {
            srtt: None,
            rttvar: Duration::ZERO,
            initial,
            min,
            max,
            backoff: 0,
        }
    }

    /// Take a round-trip sample (from a command sent exactly once).
    pub fn on_sample(&mut self, rtt: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                self.rttvar = self.rttvar * 3 / 4 + srtt.abs_diff(rtt) / 4;
                self.srtt = Some(srtt * 7 / 8 + rtt / 8);
            }
        }
        self.backoff = 0;
    }

    /// A command timed out: double the RTO until the next sample.
    pub fn on_timeout(&mut self) {
        self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
    }

    /// The retransmission timeout for a command sent now.
    pub fn rto(&self) -> Duration {
        let base = match self.srtt {
            None => self.initial,
            Some(srtt) => srtt + self.rttvar * 4,
        };
        let base = base.clamp(self.min, self.max);
        base.checked_mul(1 << self.backoff)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// The smoothed RTT, once there is a sample.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// The RTT variation.
    pub fn rttvar(&self) -> Duration {
        self.rttvar
    }

    /// The upper bound of the RTO.
    pub fn max_rto(&self) -> Duration {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn est() -> RttEstimator {
        RttEstimator::new(250 * MS, 10 * MS, 5000 * MS)
    }

    #[test]
    fn initial_then_first_sample() {
        let mut e = est();
        assert_eq!(e.rto(), 250 * MS);
        e.on_sample(20 * MS);
        assert_eq!(e.srtt(), Some(20 * MS));
        assert_eq!(e.rttvar(), 10 * MS);
        assert_eq!(e.rto(), 60 * MS);
    }

    #[test]
    fn smoothing_follows_rfc6298() {
        let mut e = est();
        e.on_sample(20 * MS);
        e.on_sample(36 * MS);
        // RTTVAR = 3/4·10 + 1/4·16 = 11.5; SRTT = 7/8·20 + 1/8·36 = 22.
        assert_eq!(e.rttvar(), Duration::from_micros(11_500));
        assert_eq!(e.srtt(), Some(22 * MS));
        assert_eq!(e.rto(), 68 * MS);
    }

    #[test]
    fn clamped_to_min_and_max() {
        let mut e = est();
        e.on_sample(Duration::from_micros(100));
        assert_eq!(e.rto(), 10 * MS);
        let mut e = est();
        e.on_sample(10_000 * MS);
        assert_eq!(e.rto(), 5000 * MS);
    }

    #[test]
    fn backoff_doubles_until_a_sample() {
        let mut e = est();
        e.on_sample(20 * MS);
        e.on_timeout();
        assert_eq!(e.rto(), 120 * MS);
        e.on_timeout();
        assert_eq!(e.rto(), 240 * MS);
        for _ in 0..40 {
            e.on_timeout();
        }
        assert_eq!(e.rto(), 5000 * MS);
        e.on_sample(20 * MS);
        assert!(e.rto() < 120 * MS);
    }
}
