//! The initiator's send window (AoE r11 §3.2 Buffer Count bounds it): how
//! many ATA commands may be outstanding towards one target.
//!
//! AIMD as in TCP congestion avoidance: the window starts small, grows by
//! one command per window's worth of completions (1/cwnd per completion),
//! halves on a loss and stays within [1, the target's buffer count]. Losses
//! of commands sent before the last reduction do not halve it again, so a
//! burst of losses from one window counts once.

use std::time::Instant;

/// AIMD window over outstanding commands.
#[derive(Debug, Clone)]
pub struct SendWindow {
    cwnd: u32,
    max: u32,
    acked: u32,
    last_decrease: Option<Instant>,
}

impl SendWindow {
    /// A window of `initial` commands, never more than `max` (both at
    /// least 1).
    pub fn new(initial: u32, max: u32) -> SendWindow {
        let max = max.max(1);
        SendWindow {
            cwnd: initial.clamp(1, max),
            max,
            acked: 0,
            last_decrease: None,
        }
    }

    /// Commands that may be outstanding now.
    pub fn cwnd(&self) -> u32 {
        self.cwnd
    }

    /// The upper bound.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// Change the upper bound (the target's buffer count changed); the
    /// window shrinks to it if need be.
    pub fn set_max(&mut self, max: u32) {
        self.max = max.max(1);
        self.cwnd = self.cwnd.min(self.max);
    }

    /// A command completed: additive increase.
    pub fn on_ack(&mut self) {
        self.acked += 1;
        if self.acked >= self.cwnd {
            self.acked = 0;
            self.cwnd = (self.cwnd + 1).min(self.max);
        }
    }

    /// A command sent at `sent_at` was lost (timed out) at `now`: halve,
    /// unless the reduction for its window was already made. Returns
    /// whether the window shrank.
    pub fn on_loss(&mut self, sent_at: Instant, now: Instant) -> bool {
        if self.last_decrease.is_some_and(|t| sent_at < t) {
            return false;
        }
        self.cwnd = (self.cwnd / 2).max(1);
        self.acked = 0;
        self.last_decrease = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn additive_increase_to_the_cap() {
        let mut w = SendWindow::new(1, 4);
        let mut seen = vec![w.cwnd()];
        for _ in 0..20 {
            w.on_ack();
            seen.push(w.cwnd());
        }
        // +1 after 1 ack at cwnd 1, after 2 at cwnd 2, after 3 at cwnd 3.
        assert_eq!(&seen[..7], &[1, 2, 2, 3, 3, 3, 4]);
        assert_eq!(w.cwnd(), 4);
    }

    #[test]
    fn halves_once_per_window_never_below_one() {
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        let mut w = SendWindow::new(16, 16);
        assert!(w.on_loss(t0, t0 + 10 * ms));
        assert_eq!(w.cwnd(), 8);
        // Sent before the reduction: same loss episode.
        assert!(!w.on_loss(t0 + ms, t0 + 11 * ms));
        assert_eq!(w.cwnd(), 8);
        // Sent after it: a new loss.
        assert!(w.on_loss(t0 + 12 * ms, t0 + 20 * ms));
        assert_eq!(w.cwnd(), 4);
        for i in 0..10 {
            w.on_loss(t0 + (30 + i) * ms, t0 + (30 + i) * ms);
        }
        assert_eq!(w.cwnd(), 1);
    }

    #[test]
    fn lowering_the_cap_shrinks_the_window() {
        let mut w = SendWindow::new(8, 16);
        w.set_max(4);
        assert_eq!((w.cwnd(), w.max()), (4, 4));
        w.set_max(0);
        assert_eq!(w.cwnd(), 1);
    }

    #[test]
    fn initial_clamped() {
        assert_eq!(SendWindow::new(0, 8).cwnd(), 1);
        assert_eq!(SendWindow::new(100, 8).cwnd(), 8);
        assert_eq!(SendWindow::new(4, 0).cwnd(), 1);
    }
}
