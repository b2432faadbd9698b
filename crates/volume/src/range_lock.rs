//! Byte-range locks over the medium, striped so that unrelated I/O rarely
//! contends: the one mechanism that makes COMPARE AND WRITE, ORWRITE and
//! WRITE ATOMIC atomic against other writes.

use std::sync::Arc;

use parking_lot::RwLock;

/// Bytes of medium each range lock covers.
const STRIPE_BYTES: u64 = 1 << 20;
const STRIPES: usize = 64;

/// Range locks: every write holds the stripes it covers shared; COMPARE
/// AND WRITE and ORWRITE hold them exclusive, so their read-modify-write is
/// atomic against any other write to the range. Distinct ranges rarely
/// share a stripe, so ordinary I/O does not contend.
#[derive(Debug)]
pub struct RangeLocks {
    stripes: Vec<Arc<RwLock<()>>>,
}

/// One stripe held by [`RangeLocks::lock`] or
/// [`RangeLocks::try_lock_shared`]; released when dropped.
pub enum StripeGuard<'a> {
    /// Held shared.
    Shared(#[allow(dead_code)] parking_lot::RwLockReadGuard<'a, ()>),
    /// Held exclusive.
    Exclusive(#[allow(dead_code)] parking_lot::RwLockWriteGuard<'a, ()>),
}

/// Shared locks on a range that do not borrow the unit: a WRITE holds them
/// while its asynchronous I/O is in flight (they may be released on
/// another thread).
pub struct OwnedRangeGuard {
    _stripes: Vec<parking_lot::ArcRwLockReadGuard<parking_lot::RawRwLock, ()>>,
}

impl std::fmt::Debug for OwnedRangeGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedRangeGuard")
            .field("stripes", &self._stripes.len())
            .finish()
    }
}

impl Default for RangeLocks {
    fn default() -> Self {
        Self::new()
    }
}

impl RangeLocks {
    /// Locks over a whole volume, none held.
    pub fn new() -> Self {
        RangeLocks {
            stripes: (0..STRIPES).map(|_| Arc::new(RwLock::new(()))).collect(),
        }
    }

    /// The stripes a byte range touches, in lock order (ascending, unique).
    fn stripes_of(off: u64, len: u64) -> Vec<usize> {
        let first = off / STRIPE_BYTES;
        let last = (off + len.max(1) - 1) / STRIPE_BYTES;
        let mut v: Vec<usize> = (first..=last.min(first + STRIPES as u64))
            .map(|s| (s % STRIPES as u64) as usize)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Shared locks on the range if none of its stripes is held exclusive;
    /// `None` instead of waiting.
    pub fn try_lock_shared(&self, off: u64, len: u64) -> Option<Vec<StripeGuard<'_>>> {
        Self::stripes_of(off, len)
            .into_iter()
            .map(|i| self.stripes[i].try_read().map(StripeGuard::Shared))
            .collect()
    }

    /// [`try_lock_shared`](Self::try_lock_shared) with guards that own their
    /// locks.
    pub fn try_lock_shared_owned(&self, off: u64, len: u64) -> Option<OwnedRangeGuard> {
        Self::stripes_of(off, len)
            .into_iter()
            .map(|i| self.stripes[i].try_read_arc())
            .collect::<Option<Vec<_>>>()
            .map(|g| OwnedRangeGuard { _stripes: g })
    }

    /// Shared locks on the range that own their locks, waiting for an
    /// exclusive holder first.
    pub fn lock_shared_owned(&self, off: u64, len: u64) -> OwnedRangeGuard {
        let stripes = Self::stripes_of(off, len)
            .into_iter()
            .map(|i| self.stripes[i].read_arc())
            .collect();
        OwnedRangeGuard { _stripes: stripes }
    }

    /// Lock the byte range, shared or exclusive, waiting for conflicting
    /// holders.
    pub fn lock(&self, off: u64, len: u64, exclusive: bool) -> Vec<StripeGuard<'_>> {
        Self::stripes_of(off, len)
            .into_iter()
            .map(|i| {
                let l = &self.stripes[i];
                if exclusive {
                    StripeGuard::Exclusive(l.write())
                } else {
                    StripeGuard::Shared(l.read())
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_shared_guards_exclude_exclusive_and_move_threads() {
        let r = Arc::new(RangeLocks::new());
        let g = r.try_lock_shared_owned(0, 4096).unwrap();
        // Shared with shared, not with exclusive.
        assert!(r.try_lock_shared(0, 4096).is_some());
        let r2 = r.clone();
        let waiter = std::thread::spawn(move || {
            let _x = r2.lock(0, 4096, true);
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!waiter.is_finished());
        // Released on another thread.
        std::thread::spawn(move || drop(g)).join().unwrap();
        waiter.join().unwrap();
        let _x = r.lock(0, 4096, true);
        assert!(r.try_lock_shared_owned(0, 4096).is_none());
        assert!(r.try_lock_shared_owned(STRIPE_BYTES, 4096).is_some());
    }
}
