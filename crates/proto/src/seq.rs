//! RFC 7143 §4.2.2 command numbering: serial-number arithmetic (RFC 1982)
//! and both ends of the CmdSN window.
//!
//! [`CmdSnWindow`] is the initiator's end: which CmdSN the next command
//! takes and whether MaxCmdSN lets it go out. [`CmdWindow`] admits commands in CmdSN order, holds early arrivals until
//! the gap before them fills, drops what lies outside the window, and sizes
//! MaxCmdSN so that no more than `depth` commands are ever outstanding.

use std::collections::BTreeMap;

/// `a < b` in 32-bit serial-number arithmetic.
#[inline]
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && (b.wrapping_sub(a) as i32) > 0
}

/// `a <= b` in 32-bit serial-number arithmetic.
#[inline]
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// The initiator's end of the command window (§4.2.2.1): the CmdSN the
/// next non-immediate command takes, and the MaxCmdSN the target last
/// allowed. A command may go out while CmdSN ≤ MaxCmdSN; ExpCmdSN and
/// MaxCmdSN from every response move the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmdSnWindow {
    cmd_sn: u32,
    max_cmd_sn: u32,
}

impl CmdSnWindow {
    /// A window whose next command takes `cmd_sn`, open up to `max_cmd_sn`
    /// (the Login Response's ExpCmdSN and MaxCmdSN).
    pub fn new(cmd_sn: u32, max_cmd_sn: u32) -> Self {
        CmdSnWindow { cmd_sn, max_cmd_sn }
    }

    /// The CmdSN the next command carries (immediate commands carry it
    /// without taking it).
    pub fn cmd_sn(&self) -> u32 {
        self.cmd_sn
    }

    /// The MaxCmdSN the target last allowed.
    pub fn max_cmd_sn(&self) -> u32 {
        self.max_cmd_sn
    }

    /// Whether a command may go out now (CmdSN ≤ MaxCmdSN).
    pub fn is_open(&self) -> bool {
        sn_le(self.cmd_sn, self.max_cmd_sn)
    }

    /// Take the next CmdSN for a non-immediate command, if the window is
    /// open.
    pub fn take(&mut self) -> Option<u32> {
        let sn = self.cmd_sn;
        self.is_open().then(|| {
            self.cmd_sn = sn.wrapping_add(1);
            sn
        })
    }

    /// ExpCmdSN and MaxCmdSN from a response. MaxCmdSN only grows, and a
    /// value below ExpCmdSN - 1 (which no target may send) is ignored.
    pub fn update(&mut self, exp_cmd_sn: u32, max_cmd_sn: u32) {
        if sn_le(exp_cmd_sn.wrapping_sub(1), max_cmd_sn) && sn_lt(self.max_cmd_sn, max_cmd_sn) {
            self.max_cmd_sn = max_cmd_sn;
        }
    }
}

/// What [`CmdWindow::admit`] did with a command.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<T> {
    /// These commands are now in order and may run (the admitted one and any
    /// held ones it released, in CmdSN order).
    Deliver(Vec<T>),
    /// Held until the commands before it arrive.
    Held,
    /// Outside [ExpCmdSN, MaxCmdSN], or a duplicate: silently ignored
    /// (§4.2.2.1); handed back to the caller.
    Dropped(T),
}

/// The target's view of one session's command sequence.
#[derive(Debug)]
pub struct CmdWindow<T> {
    exp_cmd_sn: u32,
    depth: u32,
    outstanding: u32,
    held: BTreeMap<u32, T>,
}

impl<T> CmdWindow<T> {
    /// A window expecting `first_cmd_sn` next and allowing `depth` commands
    /// in flight (at least 1).
    pub fn new(first_cmd_sn: u32, depth: u32) -> Self {
        CmdWindow {
            exp_cmd_sn: first_cmd_sn,
            depth: depth.max(1),
            outstanding: 0,
            held: BTreeMap::new(),
        }
    }

    /// ExpCmdSN to report.
    pub fn exp_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn
    }

    /// MaxCmdSN to report: ExpCmdSN plus the free slots, minus one. When
    /// every slot is taken this is ExpCmdSN - 1, a closed window.
    pub fn max_cmd_sn(&self) -> u32 {
        let used = self.outstanding + self.held.len() as u32;
        let free = self.depth.saturating_sub(used);
        self.exp_cmd_sn.wrapping_add(free).wrapping_sub(1)
    }

    /// Commands admitted and not yet completed.
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// Take in a command carrying `cmd_sn`.
    ///
    /// Immediate commands run at once and never advance ExpCmdSN; they
    /// still count as outstanding until [`complete`](Self::complete).
    pub fn admit(&mut self, cmd_sn: u32, immediate: bool, item: T) -> Admission<T> {
        if immediate {
            self.outstanding += 1;
            return Admission::Deliver(vec![item]);
        }
        let max = self.max_cmd_sn();
        let in_window = sn_le(self.exp_cmd_sn, cmd_sn) && sn_le(cmd_sn, max) && self.max_open();
        if !in_window || self.held.contains_key(&cmd_sn) {
            return Admission::Dropped(item);
        }
        if cmd_sn != self.exp_cmd_sn {
            self.held.insert(cmd_sn, item);
            return Admission::Held;
        }
        let mut out = vec![item];
        self.outstanding += 1;
        self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
        while let Some(next) = self.held.remove(&self.exp_cmd_sn) {
            out.push(next);
            self.outstanding += 1;
            self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
        }
        Admission::Deliver(out)
    }

    fn max_open(&self) -> bool {
        self.outstanding + (self.held.len() as u32) < self.depth
    }

    /// A delivered command finished (its response is going out).
    pub fn complete(&mut self) {
        self.outstanding = self.outstanding.saturating_sub(1);
    }

    /// Drop every held command (connection or session teardown).
    pub fn clear_held(&mut self) -> Vec<T> {
        std::mem::take(&mut self.held).into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_arithmetic_wraps() {
        assert!(sn_lt(1, 2));
        assert!(sn_lt(u32::MAX, 0));
        assert!(!sn_lt(0, u32::MAX));
        assert!(sn_le(5, 5));
    }

    #[test]
    fn in_order_delivery_and_window() {
        let mut w = CmdWindow::new(10, 4);
        assert_eq!(w.max_cmd_sn(), 13);
        assert_eq!(w.admit(10, false, 'a'), Admission::Deliver(vec!['a']));
        assert_eq!(w.exp_cmd_sn(), 11);
        assert_eq!(w.max_cmd_sn(), 13);
        // Early arrival is held until the gap fills.
        assert_eq!(w.admit(12, false, 'c'), Admission::Held);
        assert_eq!(w.admit(11, false, 'b'), Admission::Deliver(vec!['b', 'c']));
        assert_eq!(w.exp_cmd_sn(), 13);
        assert_eq!(w.outstanding(), 3);
        assert_eq!(w.max_cmd_sn(), 13);
        assert_eq!(w.admit(13, false, 'd'), Admission::Deliver(vec!['d']));
        // Window closed: MaxCmdSN = ExpCmdSN - 1.
        assert_eq!(w.max_cmd_sn(), 13);
        assert_eq!(w.admit(14, false, 'e'), Admission::Dropped('e'));
        w.complete();
        assert_eq!(w.max_cmd_sn(), 14);
        assert_eq!(w.admit(14, false, 'e'), Admission::Deliver(vec!['e']));
    }

    #[test]
    fn stale_and_far_commands_are_dropped() {
        let mut w = CmdWindow::new(100, 8);
        assert_eq!(w.admit(99, false, 1), Admission::Dropped(1));
        assert_eq!(w.admit(200, false, 2), Admission::Dropped(2));
        assert_eq!(w.admit(100, true, 3), Admission::Deliver(vec![3]));
        assert_eq!(w.exp_cmd_sn(), 100);
        assert_eq!(w.admit(101, false, 4), Admission::Held);
        assert_eq!(w.admit(101, false, 5), Admission::Dropped(5));
    }

    #[test]
    fn the_initiator_window_closes_at_max_cmd_sn_and_opens_with_it() {
        let mut w = CmdSnWindow::new(1, 2);
        assert_eq!(w.take(), Some(1));
        assert_eq!(w.take(), Some(2));
        assert!(!w.is_open());
        assert_eq!(w.take(), None);
        assert_eq!(w.cmd_sn(), 3);
        // A smaller MaxCmdSN, or one below ExpCmdSN - 1, changes nothing.
        w.update(3, 1);
        w.update(10, 5);
        assert!(!w.is_open());
        w.update(3, 3);
        assert_eq!(w.take(), Some(3));
        // Across the wrap.
        let mut w = CmdSnWindow::new(u32::MAX, u32::MAX);
        assert_eq!(w.take(), Some(u32::MAX));
        w.update(0, 0);
        assert_eq!(w.take(), Some(0));
    }

    #[test]
    fn wraps_around_zero() {
        let mut w = CmdWindow::new(u32::MAX, 4);
        assert_eq!(w.admit(u32::MAX, false, 0), Admission::Deliver(vec![0]));
        assert_eq!(w.admit(0, false, 1), Admission::Deliver(vec![1]));
        assert_eq!(w.exp_cmd_sn(), 1);
    }
}
