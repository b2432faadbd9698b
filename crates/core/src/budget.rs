//! A session's memory budget for command data buffers.
//!
//! A front end reserves a command's buffer when the command takes its
//! place in command order (before it asks for a write's data, before a
//! read runs) and gives it back when the buffer is gone (the write
//! executed, the read's data sent). A command that does not fit waits;
//! reservations are granted oldest first, and one command always fits when
//! nothing else is reserved, so a budget smaller than the largest command
//! slows a session down but never stalls it.
//!
//! Data the peer may send without being asked (iSCSI immediate data and
//! the unsolicited first burst) is tracked apart ([`MemoryBudget::force`]):
//! the protocol bounds it (FirstBurstLength per command, times the command
//! window), and counting it against the limit could let commands that wait
//! for room hold the room they wait for.

/// The default budget per session: two of the largest commands
/// (64 MiB each) in flight at once.
pub const DEFAULT_SESSION_BUDGET: usize = 128 << 20;

/// Bytes reserved against a limit.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    limit: usize,
    reserved: usize,
    unsolicited: usize,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        MemoryBudget {
            limit,
            reserved: 0,
            unsolicited: 0,
        }
    }

    /// Reserve `n` bytes if they fit (or if nothing is reserved).
    pub fn try_reserve(&mut self, n: usize) -> bool {
        if self.reserved == 0 || self.reserved.saturating_add(n) <= self.limit {
            self.reserved += n;
            true
        } else {
            false
        }
    }

    /// Hold `n` bytes of data the peer may send without being asked
    /// (bounded by the protocol, e.g. iSCSI's FirstBurstLength per
    /// command); not counted against the limit.
    pub fn force(&mut self, n: usize) {
        self.unsolicited = self.unsolicited.saturating_add(n);
    }

    /// Give back `n` bytes held with [`force`](Self::force).
    pub fn release_forced(&mut self, n: usize) {
        debug_assert!(n <= self.unsolicited, "released more than forced");
        self.unsolicited = self.unsolicited.saturating_sub(n);
    }

    /// Bytes held with [`force`](Self::force) now.
    pub fn unsolicited(&self) -> usize {
        self.unsolicited
    }

    /// Give `n` bytes back.
    pub fn release(&mut self, n: usize) {
        debug_assert!(n <= self.reserved, "released more than reserved");
        self.reserved = self.reserved.saturating_sub(n);
    }

    /// Bytes reserved now.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_wait_for_room_but_one_always_fits() {
        let mut b = MemoryBudget::new(100);
        assert!(b.try_reserve(60));
        assert!(!b.try_reserve(60));
        assert!(b.try_reserve(40));
        assert!(!b.try_reserve(1));
        b.release(60);
        assert!(b.try_reserve(60));
        b.release(100);
        assert_eq!(b.reserved(), 0);
        // Larger than the whole budget: fits alone.
        assert!(b.try_reserve(500));
        assert!(!b.try_reserve(1));
        b.release(500);
        // Unsolicited data does not count against the limit.
        b.force(30);
        assert!(b.try_reserve(100));
        assert_eq!((b.reserved(), b.unsolicited(), b.limit()), (100, 30, 100));
        b.release_forced(30);
        assert_eq!(b.unsolicited(), 0);
    }
}
