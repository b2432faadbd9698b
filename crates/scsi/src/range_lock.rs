//! Byte-range locks over the medium, striped so that unrelated I/O rarely
//! contends: the one mechanism that makes COMPARE AND WRITE, ORWRITE and
//! WRITE ATOMIC atomic against other writes.

/// Bytes of medium each range lock covers.
const STRIPE_BYTES: u64 = 1 << 20;
const STRIPES: usize = 64;

/// Range locks: every write holds the stripes it covers shared; COMPARE
/// AND WRITE and ORWRITE hold them exclusive, so their read-modify-write is
/// atomic against any other write to the range. Distinct ranges rarely
/// share a stripe, so ordinary I/O does not contend.
#[derive(Debug)]
pub(crate) struct RangeLocks {
    stripes: Vec<std::sync::RwLock<()>>,
}

pub(crate) enum StripeGuard<'a> {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] std::sync::RwLockWriteGuard<'a, ()>),
}

impl RangeLocks {
    pub(crate) fn new() -> Self {
        RangeLocks {
            stripes: (0..STRIPES).map(|_| std::sync::RwLock::new(())).collect(),
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
    pub(crate) fn try_lock_shared(&self, off: u64, len: u64) -> Option<Vec<StripeGuard<'_>>> {
        Self::stripes_of(off, len)
            .into_iter()
            .map(|i| match self.stripes[i].try_read() {
                Ok(g) => Some(StripeGuard::Shared(g)),
                Err(std::sync::TryLockError::Poisoned(e)) => {
                    Some(StripeGuard::Shared(e.into_inner()))
                }
                Err(std::sync::TryLockError::WouldBlock) => None,
            })
            .collect()
    }

    pub(crate) fn lock(&self, off: u64, len: u64, exclusive: bool) -> Vec<StripeGuard<'_>> {
        Self::stripes_of(off, len)
            .into_iter()
            .map(|i| {
                let l = &self.stripes[i];
                if exclusive {
                    StripeGuard::Exclusive(l.write().unwrap_or_else(|e| e.into_inner()))
                } else {
                    StripeGuard::Shared(l.read().unwrap_or_else(|e| e.into_inner()))
                }
            })
            .collect()
    }
}
