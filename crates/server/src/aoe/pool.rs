//! A link's spare I/O buffers (see [`Pool`]).

use ethersan_backend::IoBuf;

use super::MAX_RUN_SECTORS;

/// Buffers a link keeps for reuse (each up to a run's 256 KiB).
const POOL_BUFFERS: usize = 64;

/// A link's spare I/O buffers: a run's read or write data goes in one
/// taken from here, and comes back when its answers are sent, so the data
/// path allocates nothing per frame or per run once warm. They are
/// aligned, so a run reaches an `O_DIRECT` store without a bounce copy.
#[derive(Default)]
pub(super) struct Pool(Vec<IoBuf>);

impl Pool {
    pub(super) fn take(&mut self) -> IoBuf {
        self.0
            .pop()
            .unwrap_or_else(|| IoBuf::aligned_with_capacity(MAX_RUN_SECTORS as usize * 512))
    }

    pub(super) fn put(&mut self, mut buf: IoBuf) {
        if self.0.len() < POOL_BUFFERS
            && buf.capacity() > 0
            && buf.capacity() <= 2 * (MAX_RUN_SECTORS as usize) * 512 + 4096
        {
            buf.clear();
            self.0.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_stay_so_when_reused() {
        let mut pool = Pool::default();
        let mut b = pool.take();
        assert!(b.is_aligned());
        b.extend_from_slice(&[7; 4096]);
        let ptr = b.as_ptr();
        pool.put(b);
        let b = pool.take();
        assert!(b.is_empty() && b.is_aligned());
        assert_eq!(b.as_ptr(), ptr, "the same allocation, still aligned");
    }
}
