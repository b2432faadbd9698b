//! A session's memory budget for command data buffers.
//!
//! A front end reserves a command's buffer just before data is to arrive
//! (when it asks for a write's data, when a read is about to run) and gives
//! it back when the buffer is gone (the write executed, the read's data
//! sent). A command that does not fit waits; one command always fits when
//! nothing else is reserved, so a budget smaller than the largest command
//! slows a session down but never stalls it.

/// The default budget per session: two of the largest commands
/// (64 MiB each) in flight at once.
pub const DEFAULT_SESSION_BUDGET: usize = 128 << 20;

/// Bytes reserved against a limit.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    limit: usize,
    reserved: usize,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        MemoryBudget { limit, reserved: 0 }
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

    /// Reserve `n` bytes whether or not they fit: data the peer may send
    /// without being asked (bounded by the protocol, e.g. iSCSI's
    /// FirstBurstLength per command).
    pub fn force(&mut self, n: usize) {
        self.reserved = self.reserved.saturating_add(n);
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
        b.force(30);
        assert!(!b.try_reserve(80));
        assert!(b.try_reserve(70));
        assert_eq!((b.reserved(), b.limit()), (100, 100));
    }
}
