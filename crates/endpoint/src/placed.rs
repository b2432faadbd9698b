//! The table of buffers registered for placed data (see [`crate::message`]):
//! shared by a channel's halves and the endpoint's task, which lands
//! placed frames in them through the channel's [`Placement`].

use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use ethersan_channel::channel::{PlaceSlot, Placement};

/// A buffer registered for placed data, and what has landed in it.
#[derive(Debug)]
pub struct PlacedBuf {
    /// The buffer; placed data beyond its length is dropped and counted.
    pub buf: Vec<u8>,
    /// Byte ranges `[start, end)` that have landed, sorted, merged.
    pub ranges: Vec<(u64, u64)>,
    /// Placed frames that did not fit in `buf` (a peer's error).
    pub overflow: u64,
}

impl PlacedBuf {
    pub(crate) fn new(buf: Vec<u8>) -> PlacedBuf {
        PlacedBuf {
            buf,
            ranges: Vec::new(),
            overflow: 0,
        }
    }

    /// Bytes that have landed (each byte once, however often it was sent).
    pub fn landed(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    /// Whether `[0, len)` has landed entirely.
    pub fn covers(&self, len: u64) -> bool {
        len == 0
            || self
                .ranges
                .first()
                .is_some_and(|&(s, e)| s == 0 && e >= len)
    }

    /// Whether any byte of `[start, end)` has landed.
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.ranges.iter().any(|&(s, e)| s < end && start < e)
    }

    /// Record `[start, end)` as landed.
    fn add(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut r = (start, end);
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        let mut placed = false;
        for &(s, e) in &self.ranges {
            if e < r.0 {
                out.push((s, e));
            } else if r.1 < s {
                if !placed {
                    out.push(r);
                    placed = true;
                }
                out.push((s, e));
            } else {
                r = (r.0.min(s), r.1.max(e));
            }
        }
        if !placed {
            out.push(r);
        }
        self.ranges = out;
    }

    /// Copy `data` in at `offset`: `false` (nothing copied) when it does
    /// not fit.
    pub fn place(&mut self, offset: u64, data: &[u8]) -> bool {
        let Some(dst) = self.slot(offset, data.len()) else {
            return false;
        };
        dst.copy_from_slice(data);
        self.add(offset, offset + data.len() as u64);
        true
    }

    /// The part of the buffer that `len` bytes at `offset` go to, to be
    /// filled by the caller (then [`PlacedBuf::landed_at`]); `None` (and
    /// counted) when it does not fit.
    pub fn slot(&mut self, offset: u64, len: usize) -> Option<&mut [u8]> {
        let start = usize::try_from(offset).ok()?;
        match start.checked_add(len) {
            Some(end) if end <= self.buf.len() => Some(&mut self.buf[start..end]),
            _ => {
                self.overflow += 1;
                None
            }
        }
    }

    /// Record that `len` bytes at `offset` were written through
    /// [`PlacedBuf::slot`].
    pub fn landed_at(&mut self, offset: u64, len: usize) {
        self.add(offset, offset + len as u64);
    }
}

/// The table of a channel's registered buffers, by tag.
#[derive(Debug, Default)]
pub struct Placements {
    map: Mutex<HashMap<u32, PlacedBuf>>,
    /// Placed frames for a tag with no registration (aborted, or never
    /// registered), dropped.
    pub(crate) unknown: std::sync::atomic::AtomicU64,
}

impl Placements {
    /// Register `buf` under `tag` (replacing an earlier registration).
    pub fn expect(&self, tag: u32, buf: Vec<u8>) {
        self.lock().insert(tag, PlacedBuf::new(buf));
    }

    /// Take the registration of `tag` back.
    pub fn release(&self, tag: u32) -> Option<PlacedBuf> {
        self.lock().remove(&tag)
    }

    /// Run `f` on the registration of `tag`; `None` (counted) when there
    /// is none.
    pub fn with<R>(&self, tag: u32, f: impl FnOnce(&mut PlacedBuf) -> R) -> Option<R> {
        let mut m = self.lock();
        match m.get_mut(&tag) {
            Some(p) => Some(f(p)),
            None => {
                self.unknown.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Placed frames dropped for want of a registration.
    pub fn unknown(&self) -> u64 {
        self.unknown.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, PlacedBuf>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The table as the channel's [`Placement`], locked on its first
    /// placed frame and until dropped.
    pub(crate) fn placing(&self) -> Placing<'_> {
        Placing {
            table: self,
            guard: None,
        }
    }
}

/// [`Placements`] as a [`Placement`] for one received frame or batch.
pub(crate) struct Placing<'a> {
    table: &'a Placements,
    guard: Option<std::sync::MutexGuard<'a, HashMap<u32, PlacedBuf>>>,
}

impl Placement for Placing<'_> {
    fn slot(&mut self, tag: u32, offset: u64, len: usize) -> Option<PlaceSlot<'_>> {
        let table = self.table;
        let map = self.guard.get_or_insert_with(|| table.lock());
        let Some(p) = map.get_mut(&tag) else {
            table.unknown.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let end = offset.saturating_add(len as u64);
        let fresh = !p.overlaps(offset, end);
        let dst = p.slot(offset, len)?;
        Some(PlaceSlot { dst, fresh })
    }

    fn landed(&mut self, tag: u32, offset: u64, len: usize) {
        if let Some(p) = self.guard.as_mut().and_then(|m| m.get_mut(&tag)) {
            p.landed_at(offset, len);
        }
    }
}
