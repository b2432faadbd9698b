//! The byte-addressed file that `attach` shows for a LUN: reads and writes
//! at any offset and length become whole-block LUN commands. A write that
//! covers a block only in part reads that block, merges the new bytes in
//! and writes it back (read-modify-write); every write holds a lock on the
//! blocks it touches for as long as it runs, so two writes to different
//! bytes of one block never undo each other, while writes to other blocks
//! go on in parallel. No FUSE here: `fs.rs` drives this, and the unit tests
//! below drive it over an in-memory LUN.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use futures::future::try_join_all;
use tokio::sync::Notify;

use bytes::Bytes;
use ethersan_client::BlockTarget;

/// A block device addressed in bytes, every offset and length a multiple
/// of the block size: what a [`LunFile`] reads and writes through.
pub(crate) trait Blocks: Send + Sync + 'static {
    /// Logical block size in bytes.
    fn block_size(&self) -> u64;
    /// Capacity in bytes (a multiple of the block size).
    fn capacity(&self) -> u64;
    /// Most bytes per command.
    fn max_transfer(&self) -> u64;
    /// Read `len` bytes at `at`.
    fn read(&self, at: u64, len: usize) -> impl Future<Output = anyhow::Result<Vec<u8>>> + Send;
    /// Write `data` at `at`.
    fn write(&self, at: u64, data: Vec<u8>) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Make every acknowledged write durable.
    fn flush(&self) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Zero `len` bytes at `at`; `unmap`: they may be deallocated.
    fn write_zeroes(
        &self,
        at: u64,
        len: u64,
        unmap: bool,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

impl Blocks for Box<dyn BlockTarget> {
    fn block_size(&self) -> u64 {
        (**self).block_size()
    }
    fn capacity(&self) -> u64 {
        (**self).capacity()
    }
    fn max_transfer(&self) -> u64 {
        (**self).max_transfer()
    }
    fn read(&self, at: u64, len: usize) -> impl Future<Output = anyhow::Result<Vec<u8>>> + Send {
        (**self).read(at, len, Vec::new())
    }
    fn write(&self, at: u64, data: Vec<u8>) -> impl Future<Output = anyhow::Result<()>> + Send {
        (**self).write(at, Bytes::from(data), false)
    }
    fn flush(&self) -> impl Future<Output = anyhow::Result<()>> + Send {
        (**self).flush()
    }
    fn write_zeroes(
        &self,
        at: u64,
        len: u64,
        unmap: bool,
    ) -> impl Future<Output = anyhow::Result<()>> + Send {
        (**self).write_zeroes(at, len, unmap)
    }
}

/// Why a file operation failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FileError {
    /// A write that starts at or past the end of the LUN (ENOSPC: the file
    /// cannot grow).
    #[error("a write at byte {at} starts at or beyond the end of the LUN ({capacity} bytes)")]
    Beyond {
        /// Where the write starts.
        at: u64,
        /// The LUN's capacity.
        capacity: u64,
    },
    /// The LUN failed the command (EIO).
    #[error("{0:#}")]
    Lun(#[from] anyhow::Error),
}

/// The whole blocks a byte range touches: `[start, end)`, and whether the
/// first and the last of them are covered only in part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    /// First byte of the first block.
    pub start: u64,
    /// Byte after the last block.
    pub end: u64,
    /// The range starts inside the first block.
    pub head: bool,
    /// The range ends inside the last block.
    pub tail: bool,
}

impl Span {
    /// The blocks of size `bs` that `len > 0` bytes at `at` touch.
    pub(crate) fn of(at: u64, len: u64, bs: u64) -> Span {
        let start = at / bs * bs;
        let end = (at + len).div_ceil(bs) * bs;
        Span {
            start,
            end,
            head: at != start,
            tail: at + len != end,
        }
    }
}

/// Locks on block ranges: a holder excludes every other range that
/// overlaps its own until its guard is dropped.
#[derive(Debug, Default)]
struct RangeLocks {
    held: Mutex<Vec<(u64, u64)>>,
    released: Notify,
}

/// One held range; dropping it lets the writers that wait for it go on.
struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    range: (u64, u64),
}

impl RangeLocks {
    /// Wait until no held range overlaps `[start, end)`, then hold it.
    async fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        loop {
            // Registered before looking, so a release in between is not missed.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut held = self.held.lock().expect("not poisoned");
                if !held.iter().any(|&(s, e)| s < end && start < e) {
                    held.push((start, end));
                    return RangeGuard {
                        locks: self,
                        range: (start, end),
                    };
                }
            }
            released.await;
        }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock().expect("not poisoned");
        if let Some(i) = held.iter().position(|r| *r == self.range) {
            held.swap_remove(i);
        }
        drop(held);
        self.locks.released.notify_waiters();
    }
}

/// Write errors as the kernel's `errseq_t` keeps them for a file
/// (lib/errseq.c): a counter of failed writes, and whether anyone has been
/// told of the last one. Each open file handle samples it at open and is
/// told of every write that failed since, once, at its next fsync, flush
/// (close) or release, whatever handle the write came through: a write
/// error the writer never saw (a loop device's write-back, an `attach`
/// whose user only looks at fsync) cannot vanish.
#[derive(Debug, Default)]
pub(crate) struct WriteErrors {
    /// (writes failed so far, the last failure has been reported).
    state: Mutex<(u64, bool)>,
}

impl WriteErrors {
    /// Remember one failed write.
    pub(crate) fn record(&self) {
        let mut st = self.state.lock().expect("not poisoned");
        st.0 += 1;
        st.1 = false;
    }

    /// The sample a newly opened handle starts from: every failure so
    /// far when the last one has not been reported to anyone yet (as
    /// `errseq_sample` does), else none of them.
    pub(crate) fn sample(&self) -> u64 {
        let st = self.state.lock().expect("not poisoned");
        if st.1 {
            st.0
        } else {
            0
        }
    }

    /// Whether a write failed since `seen`; advances `seen` so that the
    /// same failures are reported to this handle once
    /// (`errseq_check_and_advance`).
    pub(crate) fn check_and_advance(&self, seen: &mut u64) -> bool {
        let mut st = self.state.lock().expect("not poisoned");
        if st.0 == *seen {
            return false;
        }
        *seen = st.0;
        st.1 = true;
        true
    }
}

/// A LUN as a file of fixed size: byte-granular reads and writes, and a
/// flush that reaches the LUN only when something was written since the
/// last one.
#[derive(Debug)]
pub(crate) struct LunFile<D> {
    dev: D,
    bs: u64,
    /// Bytes per command: a multiple of the block size.
    chunk: u64,
    locks: RangeLocks,
    /// A write was acknowledged since the last flush began.
    dirty: AtomicBool,
    /// Writes that failed, for the next fsync/flush of each handle.
    errors: WriteErrors,
}

impl<D: Blocks> LunFile<D> {
    /// The file over `dev`.
    pub(crate) fn new(dev: D) -> LunFile<D> {
        let bs = dev.block_size().max(1);
        let chunk = (dev.max_transfer() / bs).max(1) * bs;
        LunFile {
            bs,
            chunk,
            dev,
            locks: RangeLocks::default(),
            dirty: AtomicBool::new(false),
            errors: WriteErrors::default(),
        }
    }

    /// The device underneath.
    pub(crate) fn dev(&self) -> &D {
        &self.dev
    }

    /// The failed writes, for each handle's fsync/flush.
    pub(crate) fn errors(&self) -> &WriteErrors {
        &self.errors
    }

    /// The file's size: the LUN's capacity, as of now (it follows a
    /// target's CAPACITY DATA HAS CHANGED).
    pub(crate) fn size(&self) -> u64 {
        self.dev.capacity() / self.bs * self.bs
    }

    /// Read whole blocks `[start, end)`, a command per chunk, all at once.
    async fn read_blocks(&self, start: u64, end: u64) -> anyhow::Result<Vec<u8>> {
        if end - start <= self.chunk {
            return self.dev.read(start, (end - start) as usize).await;
        }
        let parts = try_join_all(
            (start..end)
                .step_by(self.chunk as usize)
                .map(|at| self.dev.read(at, (end - at).min(self.chunk) as usize)),
        )
        .await?;
        Ok(parts.concat())
    }

    /// Write whole blocks at `start`, a command per chunk, all at once.
    async fn write_blocks(&self, start: u64, data: Vec<u8>) -> anyhow::Result<()> {
        if data.len() as u64 <= self.chunk {
            return self.dev.write(start, data).await;
        }
        try_join_all(
            data.chunks(self.chunk as usize)
                .enumerate()
                .map(|(i, c)| self.dev.write(start + i as u64 * self.chunk, c.to_vec())),
        )
        .await?;
        Ok(())
    }

    /// Up to `len` bytes at `at`: fewer at the end of the file, none past it.
    pub(crate) async fn read_at(&self, at: u64, len: usize) -> Result<Vec<u8>, FileError> {
        let capacity = self.size();
        if at >= capacity || len == 0 {
            return Ok(Vec::new());
        }
        let len = (len as u64).min(capacity - at);
        let span = Span::of(at, len, self.bs);
        let mut data = self.read_blocks(span.start, span.end).await?;
        let from = (at - span.start) as usize;
        data.truncate(from + len as usize);
        data.drain(..from);
        Ok(data)
    }

    /// Write `data` at `at`; returns the bytes written, fewer than given
    /// when the write reaches past the end of the file (as on a block
    /// device); one that starts at or past the end fails.
    /// A write the LUN failed is remembered for every handle's next fsync
    /// ([`WriteErrors`]): part of it may have reached the LUN, so the
    /// file's bytes there are unknown.
    pub(crate) async fn write_at(&self, at: u64, data: &[u8]) -> Result<usize, FileError> {
        let r = self.write_unrecorded(at, data).await;
        if let Err(FileError::Lun(_)) = &r {
            self.errors.record();
        }
        r
    }

    async fn write_unrecorded(&self, at: u64, data: &[u8]) -> Result<usize, FileError> {
        if data.is_empty() {
            return Ok(0);
        }
        let capacity = self.size();
        if at >= capacity {
            return Err(FileError::Beyond { at, capacity });
        }
        let len = (data.len() as u64).min(capacity - at) as usize;
        let data = &data[..len];
        let span = Span::of(at, len as u64, self.bs);
        let _held = self.locks.lock(span.start, span.end).await;
        let bs = self.bs as usize;
        let last = span.end - self.bs;
        let buf = if !span.head && !span.tail {
            data.to_vec()
        } else {
            // The partly covered blocks at the edges, read under the lock.
            let mut buf = vec![0u8; (span.end - span.start) as usize];
            let (head, tail) = match (span.head, span.tail && (last != span.start || !span.head)) {
                (true, true) => {
                    let (h, t) =
                        tokio::try_join!(self.dev.read(span.start, bs), self.dev.read(last, bs))?;
                    (Some(h), Some(t))
                }
                (true, false) => (Some(self.dev.read(span.start, bs).await?), None),
                (false, true) => (None, Some(self.dev.read(last, bs).await?)),
                (false, false) => (None, None),
            };
            if let Some(h) = head {
                buf[..bs].copy_from_slice(&h);
            }
            if let Some(t) = tail {
                let n = buf.len();
                buf[n - bs..].copy_from_slice(&t);
            }
            let from = (at - span.start) as usize;
            buf[from..from + len].copy_from_slice(data);
            buf
        };
        self.write_blocks(span.start, buf).await?;
        self.dirty.store(true, Ordering::Release);
        Ok(len)
    }

    /// Zero `len` bytes at `at` (fallocate's ZERO_RANGE and PUNCH_HOLE,
    /// which a loop device sends for WRITE ZEROES and DISCARD): the whole
    /// blocks with the device's zeroing command (`unmap`: they may be
    /// deallocated), the partly covered blocks at the edges by a
    /// read-modify-write. Cut at the end of the file; a failure counts as
    /// a failed write ([`WriteErrors`]).
    pub(crate) async fn zero_range(&self, at: u64, len: u64, unmap: bool) -> Result<(), FileError> {
        let r = self.zero_unrecorded(at, len, unmap).await;
        if let Err(FileError::Lun(_)) = &r {
            self.errors.record();
        }
        r
    }

    async fn zero_unrecorded(&self, at: u64, len: u64, unmap: bool) -> Result<(), FileError> {
        let end = at.saturating_add(len).min(self.size());
        if at >= end {
            return Ok(());
        }
        // Whole blocks inside [at, end).
        let first = at.div_ceil(self.bs) * self.bs;
        let last = end / self.bs * self.bs;
        if first >= last {
            self.write_unrecorded(at, &vec![0u8; (end - at) as usize])
                .await?;
            return Ok(());
        }
        if at < first {
            self.write_unrecorded(at, &vec![0u8; (first - at) as usize])
                .await?;
        }
        if last < end {
            self.write_unrecorded(last, &vec![0u8; (end - last) as usize])
                .await?;
        }
        let _held = self.locks.lock(first, last).await;
        self.dev.write_zeroes(first, last - first, unmap).await?;
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// Make every write acknowledged so far durable on the LUN; nothing to
    /// do when nothing was written since the last flush began.
    pub(crate) async fn flush(&self) -> Result<(), FileError> {
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        self.dev.flush().await.map_err(|e| {
            // Still owed: the next flush tries again.
            self.dirty.store(true, Ordering::Release);
            FileError::Lun(e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    /// A LUN in memory that yields between the read and the write of a
    /// read-modify-write, so that unserialized writers would interleave,
    /// and that can be told to fail.
    #[derive(Debug)]
    struct MemLun {
        bs: u64,
        max: u64,
        data: Mutex<Vec<u8>>,
        commands: Mutex<Vec<(char, u64, usize)>>,
        flushes: AtomicU64,
        fail: AtomicBool,
    }

    impl MemLun {
        fn new(blocks: u64, bs: u64, max: u64) -> MemLun {
            MemLun {
                bs,
                max,
                data: Mutex::new(vec![0; (blocks * bs) as usize]),
                commands: Mutex::default(),
                flushes: AtomicU64::new(0),
                fail: AtomicBool::new(false),
            }
        }

        fn check(&self, at: u64, len: usize) -> anyhow::Result<()> {
            anyhow::ensure!(!self.fail.load(Ordering::Relaxed), "LUN unreachable");
            anyhow::ensure!(
                at.is_multiple_of(self.bs) && (len as u64).is_multiple_of(self.bs),
                "unaligned command {at}+{len}"
            );
            anyhow::ensure!(len as u64 <= self.max, "command of {len} bytes too long");
            anyhow::ensure!(
                at + len as u64 <= self.data.lock().unwrap().len() as u64,
                "beyond the end"
            );
            Ok(())
        }
    }

    impl Blocks for Arc<MemLun> {
        fn block_size(&self) -> u64 {
            self.bs
        }
        fn capacity(&self) -> u64 {
            self.data.lock().unwrap().len() as u64
        }
        fn max_transfer(&self) -> u64 {
            self.max
        }
        async fn read(&self, at: u64, len: usize) -> anyhow::Result<Vec<u8>> {
            self.check(at, len)?;
            self.commands.lock().unwrap().push(('r', at, len));
            let out = self.data.lock().unwrap()[at as usize..at as usize + len].to_vec();
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_micros(fastrand::u64(0..200))).await;
            Ok(out)
        }
        async fn write(&self, at: u64, data: Vec<u8>) -> anyhow::Result<()> {
            self.check(at, data.len())?;
            tokio::task::yield_now().await;
            self.commands.lock().unwrap().push(('w', at, data.len()));
            self.data.lock().unwrap()[at as usize..at as usize + data.len()].copy_from_slice(&data);
            Ok(())
        }
        async fn flush(&self) -> anyhow::Result<()> {
            anyhow::ensure!(!self.fail.load(Ordering::Relaxed), "LUN unreachable");
            self.flushes.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        async fn write_zeroes(&self, at: u64, len: u64, _unmap: bool) -> anyhow::Result<()> {
            anyhow::ensure!(!self.fail.load(Ordering::Relaxed), "LUN unreachable");
            anyhow::ensure!(
                at.is_multiple_of(self.bs) && len.is_multiple_of(self.bs),
                "unaligned zeroing {at}+{len}"
            );
            self.commands.lock().unwrap().push(('z', at, len as usize));
            self.data.lock().unwrap()[at as usize..(at + len) as usize].fill(0);
            Ok(())
        }
    }

    fn file(blocks: u64, bs: u64, max: u64) -> (Arc<MemLun>, LunFile<Arc<MemLun>>) {
        let lun = Arc::new(MemLun::new(blocks, bs, max));
        (lun.clone(), LunFile::new(lun))
    }

    #[test]
    fn spans_cover_the_touched_blocks_and_say_which_edges_are_partial() {
        assert_eq!(
            Span::of(0, 512, 512),
            Span {
                start: 0,
                end: 512,
                head: false,
                tail: false
            }
        );
        assert_eq!(
            Span::of(100, 10, 512),
            Span {
                start: 0,
                end: 512,
                head: true,
                tail: true
            }
        );
        assert_eq!(
            Span::of(511, 2, 512),
            Span {
                start: 0,
                end: 1024,
                head: true,
                tail: true
            }
        );
        assert_eq!(
            Span::of(4096, 5000, 4096),
            Span {
                start: 4096,
                end: 12288,
                head: false,
                tail: true
            }
        );
    }

    #[tokio::test]
    async fn random_reads_and_writes_match_a_plain_buffer() {
        for (bs, max) in [(512, 4096), (4096, 8192), (512, 512)] {
            let (lun, f) = file(64, bs, max);
            let size = 64 * bs as usize;
            let mut model = vec![0u8; size];
            fastrand::seed(bs ^ max);
            for i in 0..400u32 {
                let at = fastrand::usize(0..size);
                let len = fastrand::usize(1..=(3 * bs as usize + 7));
                if i % 3 == 0 {
                    let got = f.read_at(at as u64, len).await.unwrap();
                    let end = (at + len).min(size);
                    assert_eq!(got, model[at..end], "read {len} at {at} (bs {bs})");
                } else {
                    let data: Vec<u8> = (0..len).map(|_| fastrand::u8(..)).collect();
                    let n = f.write_at(at as u64, &data).await.unwrap();
                    assert_eq!(n, len.min(size - at));
                    model[at..at + n].copy_from_slice(&data[..n]);
                }
            }
            assert_eq!(*lun.data.lock().unwrap(), model);
            // Only whole blocks, never more than the transfer limit.
            for (_, at, len) in lun.commands.lock().unwrap().iter() {
                assert!(
                    at.is_multiple_of(bs) && (*len as u64).is_multiple_of(bs) && *len as u64 <= max
                );
            }
        }
    }

    #[tokio::test]
    async fn aligned_writes_need_no_read() {
        let (lun, f) = file(16, 512, 1 << 20);
        f.write_at(1024, &[7u8; 2048]).await.unwrap();
        assert_eq!(*lun.commands.lock().unwrap(), vec![('w', 1024, 2048)]);
        lun.commands.lock().unwrap().clear();
        // One byte: one block read, one block written.
        f.write_at(3000, &[1]).await.unwrap();
        assert_eq!(
            *lun.commands.lock().unwrap(),
            vec![('r', 2560, 512), ('w', 2560, 512)]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_partial_writes_to_one_block_all_land() {
        // 64 writers, each its own 8 bytes of the same two blocks: without
        // the range lock, one writer's read-modify-write puts back bytes
        // another has just changed.
        let (lun, f) = file(4, 512, 1 << 20);
        let f = Arc::new(f);
        let tasks: Vec<_> = (0..64u8)
            .map(|i| {
                let f = f.clone();
                tokio::spawn(async move {
                    let at = 300 + u64::from(i) * 8;
                    f.write_at(at, &[i + 1; 8]).await.unwrap();
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let data = lun.data.lock().unwrap();
        for i in 0..64u8 {
            let at = 300 + usize::from(i) * 8;
            assert_eq!(data[at..at + 8], [i + 1; 8], "writer {i}'s bytes were lost");
        }
    }

    #[tokio::test]
    async fn the_end_of_the_file_shortens_reads_and_writes_and_stops_them_past_it() {
        let (_, f) = file(2, 512, 1 << 20);
        assert_eq!(f.size(), 1024);
        assert_eq!(f.read_at(1000, 100).await.unwrap().len(), 24);
        assert!(f.read_at(1024, 100).await.unwrap().is_empty());
        assert!(f.read_at(5000, 1).await.unwrap().is_empty());
        assert_eq!(f.write_at(1000, &[1; 100]).await.unwrap(), 24);
        assert!(matches!(
            f.write_at(1024, &[1]).await,
            Err(FileError::Beyond {
                at: 1024,
                capacity: 1024
            })
        ));
        assert_eq!(f.write_at(1024, &[]).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn flush_reaches_the_lun_only_after_writes_and_again_after_a_failure() {
        let (lun, f) = file(2, 512, 1 << 20);
        f.flush().await.unwrap();
        assert_eq!(lun.flushes.load(Ordering::Relaxed), 0);
        f.write_at(0, &[1; 10]).await.unwrap();
        lun.fail.store(true, Ordering::Relaxed);
        assert!(matches!(f.flush().await, Err(FileError::Lun(_))));
        lun.fail.store(false, Ordering::Relaxed);
        f.flush().await.unwrap();
        f.flush().await.unwrap();
        assert_eq!(lun.flushes.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn zeroing_a_range_zeroes_whole_blocks_at_once_and_the_edges_by_hand() {
        let (lun, f) = file(16, 512, 1 << 20);
        f.write_at(0, &[0xaa; 8192]).await.unwrap();
        lun.commands.lock().unwrap().clear();
        f.zero_range(100, 3000, true).await.unwrap();
        let data = lun.data.lock().unwrap().clone();
        assert!(data[..100].iter().all(|&b| b == 0xaa));
        assert!(data[100..3100].iter().all(|&b| b == 0));
        assert!(data[3100..8192].iter().all(|&b| b == 0xaa));
        assert!(lun
            .commands
            .lock()
            .unwrap()
            .contains(&('z', 512, 3072 - 512)));
        // Inside one block; and past the end, cut there.
        f.zero_range(5000, 10, false).await.unwrap();
        assert!(lun.data.lock().unwrap()[5000..5010].iter().all(|&b| b == 0));
        f.zero_range(8000, 1 << 20, true).await.unwrap();
        assert!(lun.data.lock().unwrap()[8000..].iter().all(|&b| b == 0));
        // A failure is a write failure for the next fsync.
        let mut h = f.errors().sample();
        lun.fail.store(true, Ordering::Relaxed);
        assert!(f.zero_range(0, 4096, false).await.is_err());
        assert!(f.errors().check_and_advance(&mut h));
    }

    #[test]
    fn a_write_error_is_told_once_to_every_handle_open_when_it_happened() {
        let e = WriteErrors::default();
        let mut a = e.sample();
        assert!(!e.check_and_advance(&mut a));
        e.record();
        // Opened after the failure, before anyone was told: told too.
        let mut b = e.sample();
        assert!(e.check_and_advance(&mut a));
        assert!(!e.check_and_advance(&mut a), "told twice");
        assert!(e.check_and_advance(&mut b));
        // Opened after it was told: not told.
        let mut c = e.sample();
        assert!(!e.check_and_advance(&mut c));
        e.record();
        e.record();
        assert!(e.check_and_advance(&mut c));
        assert!(e.check_and_advance(&mut a));
        assert!(!e.check_and_advance(&mut a));
    }

    #[tokio::test]
    async fn a_failed_write_is_recorded_for_the_next_fsync() {
        let (lun, f) = file(4, 512, 1 << 20);
        let mut h = f.errors().sample();
        f.write_at(0, &[1; 512]).await.unwrap();
        assert!(!f.errors().check_and_advance(&mut h));
        lun.fail.store(true, Ordering::Relaxed);
        assert!(f.write_at(512, &[1; 512]).await.is_err());
        lun.fail.store(false, Ordering::Relaxed);
        // The flush itself works, the failed write is still reported.
        f.flush().await.unwrap();
        assert!(f.errors().check_and_advance(&mut h));
        // A read error is no write error.
        lun.fail.store(true, Ordering::Relaxed);
        assert!(f.read_at(0, 10).await.is_err());
        assert!(!f.errors().check_and_advance(&mut h));
    }

    #[tokio::test]
    async fn lun_errors_come_back_as_lun_errors() {
        let (lun, f) = file(2, 512, 1 << 20);
        lun.fail.store(true, Ordering::Relaxed);
        let e = f.read_at(0, 10).await.unwrap_err();
        assert!(matches!(e, FileError::Lun(_)) && e.to_string() == "LUN unreachable");
        assert!(matches!(f.write_at(10, &[1]).await, Err(FileError::Lun(_))));
        // A failed write released its lock: the next one goes through.
        lun.fail.store(false, Ordering::Relaxed);
        f.write_at(10, &[1]).await.unwrap();
    }
}
