//! The table of buffers registered for placed data (see [`crate::message`]):
//! shared by a channel's halves and the endpoint's task, which lands
//! placed frames in them through the channel's [`Placement`].

use rustc_hash::FxHashMap as HashMap;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use ethersan_channel::channel::{PlaceSlot, Placement};

/// A buffer registered for placed data, and what has landed in it.
///
/// A read buffer is registered without being initialised (no `memset` of
/// a buffer every byte of which the peer's frames overwrite): its bytes
/// are readable only where data has landed, which the range map records,
/// and the buffer becomes a `Vec<u8>` ([`PlacedBuf::into_data`]) only when
/// all of it has. A buffer registered already initialised
/// ([`PlacedBuf::from_vec`]) is readable whole. A buffer may start inside
/// its vector ([`PlacedBuf::with_prefix_at`]: the target's write buffer,
/// aligned for `O_DIRECT`, immediate data at its start) and is handed back
/// the same way ([`PlacedBuf::into_parts`]), so the data never moves.
pub struct PlacedBuf {
    /// The vector; the buffer is `buf[start..]`, and placed data beyond
    /// its end is dropped and counted. Invariant: `buf[..start]` is
    /// initialised, every byte of the buffer in `ranges` is initialised,
    /// and every byte when `initialised`.
    buf: Vec<MaybeUninit<u8>>,
    /// Where the buffer starts in `buf`.
    start: usize,
    /// Byte ranges `[start, end)` that have landed, sorted, merged.
    ranges: Vec<(u64, u64)>,
    /// Every byte of `buf` was initialised at registration.
    initialised: bool,
    /// Placed frames that did not fit in `buf` (a peer's error).
    overflow: u64,
}

impl std::fmt::Debug for PlacedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacedBuf")
            .field("len", &self.len())
            .field("ranges", &self.ranges)
            .field("initialised", &self.initialised)
            .field("overflow", &self.overflow)
            .finish()
    }
}

impl PlacedBuf {
    /// A buffer of `len` bytes, not initialised: nothing in it is readable
    /// until data lands.
    pub fn new(len: usize) -> PlacedBuf {
        PlacedBuf {
            buf: Box::<[u8]>::new_uninit_slice(len).into_vec(),
            start: 0,
            ranges: Vec::new(),
            initialised: false,
            overflow: 0,
        }
    }

    /// `buf` as a registration: readable whole (what it holds counts as
    /// data, though nothing has landed yet).
    pub fn from_vec(buf: Vec<u8>) -> PlacedBuf {
        let mut buf = std::mem::ManuallyDrop::new(buf);
        let (ptr, len, cap) = (buf.as_mut_ptr(), buf.len(), buf.capacity());
        // SAFETY: the allocation of a `Vec<u8>` (given up by the
        // `ManuallyDrop`) re-owned as a `Vec<MaybeUninit<u8>>`: same size
        // and alignment, the same length and capacity, and a `u8` is a
        // valid `MaybeUninit<u8>`.
        let buf = unsafe { Vec::from_raw_parts(ptr.cast::<MaybeUninit<u8>>(), len, cap) };
        PlacedBuf {
            buf,
            start: 0,
            ranges: Vec::new(),
            initialised: true,
            overflow: 0,
        }
    }

    /// A buffer of `len` bytes whose start is `prefix` (data that came
    /// before the registration, such as a write's immediate data: counted
    /// as landed) and whose rest is not initialised. A `prefix` longer
    /// than `len` is cut to it.
    pub fn with_prefix(prefix: Vec<u8>, len: usize) -> PlacedBuf {
        PlacedBuf::with_prefix_at(prefix, 0, len)
    }

    /// A buffer of `len` bytes that starts at `raw[start]` (the bytes
    /// before are kept as they are, e.g. a prefix that aligns the buffer)
    /// and whose start is `raw[start..]` (data that came before the
    /// registration: counted as landed); the rest is not initialised. With
    /// capacity for `start + len` bytes the allocation is kept, so the
    /// buffer stays where it is. A prefix longer than `len` is cut to it;
    /// panics when `start` lies beyond `raw`.
    pub fn with_prefix_at(mut raw: Vec<u8>, start: usize, len: usize) -> PlacedBuf {
        assert!(start <= raw.len(), "the buffer starts within its vector");
        raw.truncate(start + len);
        let landed = raw.len() - start;
        raw.reserve_exact(len - landed);
        let mut v = std::mem::ManuallyDrop::new(raw);
        let (ptr, cap) = (v.as_mut_ptr(), v.capacity());
        // SAFETY: the allocation of a `Vec<u8>` (given up by the
        // `ManuallyDrop`) re-owned as a `Vec<MaybeUninit<u8>>` of the same
        // capacity (same size and alignment), `start + landed` long; then
        // made `start + len <= capacity` long, which a `MaybeUninit`
        // allows without writing. The invariant holds: `[0, start)` is
        // initialised, and only `[0, landed)` of the buffer, initialised
        // bytes, goes in the range map.
        let buf = unsafe {
            let mut buf = Vec::from_raw_parts(ptr.cast::<MaybeUninit<u8>>(), start + landed, cap);
            buf.set_len(start + len);
            buf
        };
        let mut p = PlacedBuf {
            buf,
            start,
            ranges: Vec::new(),
            initialised: false,
            overflow: 0,
        };
        p.add(0, landed as u64);
        p
    }

    /// The buffer's length.
    pub fn len(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Whether the buffer has no room at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Byte ranges `[start, end)` that have landed, sorted, merged.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// Placed frames that did not fit in the buffer (a peer's error).
    pub fn overflow(&self) -> u64 {
        self.overflow
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

    /// Whether every byte of `[start, end)` may be read: it has landed (in
    /// one merged range), or the buffer was registered initialised.
    fn readable(&self, start: u64, end: u64) -> bool {
        end <= self.len() as u64
            && (start >= end
                || self.initialised
                || self.ranges.iter().any(|&(s, e)| s <= start && end <= e))
    }

    /// The bytes `[start, end)` when they may be read (see
    /// [`PlacedBuf::into_data`]); `None` while any of them has not landed.
    pub fn get(&self, start: usize, end: usize) -> Option<&[u8]> {
        if start > end || !self.readable(start as u64, end as u64) {
            return None;
        }
        let part = &self.buf[self.start + start..self.start + end];
        // SAFETY: `readable`: every byte of `[start, end)` has landed (the
        // range map holds only bytes written with landed data) or the
        // buffer was initialised whole at registration; `MaybeUninit<u8>`
        // and `u8` have the same layout.
        Some(unsafe { std::slice::from_raw_parts(part.as_ptr().cast::<u8>(), part.len()) })
    }

    /// The first `len` bytes as a `Vec<u8>` (the buffer itself, no copy)
    /// when every one of them may be read: `[0, len)` has landed
    /// ([`PlacedBuf::covers`]), or the buffer was registered initialised.
    /// `None` (the buffer is dropped) while any byte is missing or `len`
    /// is beyond the buffer: the caller has [`PlacedBuf::ranges`] to say
    /// what is missing before giving the buffer up.
    pub fn into_data(self, len: usize) -> Option<Vec<u8>> {
        let (mut v, start) = self.into_parts(len)?;
        v.drain(..start);
        Some(v)
    }

    /// [`PlacedBuf::into_data`] without moving the data: the vector and
    /// where the buffer's first `len` bytes start in it (`v[start..]`).
    pub fn into_parts(self, len: usize) -> Option<(Vec<u8>, usize)> {
        if !self.readable(0, len as u64) {
            return None;
        }
        let start = self.start;
        let mut buf = std::mem::ManuallyDrop::new(self.buf);
        let (ptr, cap) = (buf.as_mut_ptr(), buf.capacity());
        // SAFETY: the allocation of the `Vec<MaybeUninit<u8>>` (given up by
        // the `ManuallyDrop`) re-owned as a `Vec<u8>` of the same capacity:
        // same size and alignment; its first `start + len <= capacity`
        // bytes are initialised: `[0, start)` by the invariant, the rest
        // because `readable(0, len)` (all landed, or initialised at
        // registration).
        Some((
            unsafe { Vec::from_raw_parts(ptr.cast::<u8>(), start + len, cap) },
            start,
        ))
    }

    /// Whether any byte of `[start, end)` has landed.
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.ranges.iter().any(|&(s, e)| s < end && start < e)
    }

    /// Record `[start, end)` as landed. Every byte of it must have been
    /// written (the invariant that makes `get`/`into_data` sound).
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
        dst.write_copy_of_slice(data);
        // SAFETY: all `data.len()` bytes at `offset` were just written.
        unsafe { self.landed_at(offset, data.len()) };
        true
    }

    /// Read exactly `len` bytes from `r` into the buffer at `offset` (a
    /// byte stream's data segment landing where it belongs, no copy in
    /// between). `Ok(false)`, nothing read, when they do not fit; an error
    /// (a short stream is `UnexpectedEof`) leaves the range not landed.
    pub async fn read_at<R: tokio::io::AsyncRead + Unpin>(
        &mut self,
        offset: u64,
        len: usize,
        r: &mut R,
    ) -> std::io::Result<bool> {
        let Some(dst) = self.slot(offset, len) else {
            return Ok(false);
        };
        let mut rb = tokio::io::ReadBuf::uninit(dst);
        while rb.remaining() > 0 {
            let before = rb.filled().len();
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut *r).poll_read(cx, &mut rb)).await?;
            if rb.filled().len() == before {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        // SAFETY: `ReadBuf` counts as filled only bytes written through
        // it, and all `len` of them are filled.
        unsafe { self.landed_at(offset, len) };
        Ok(true)
    }

    /// The part of the buffer that `len` bytes at `offset` go to, to be
    /// filled by the caller (then [`PlacedBuf::landed_at`]); `None` (and
    /// counted) when it does not fit.
    pub(crate) fn slot(&mut self, offset: u64, len: usize) -> Option<&mut [MaybeUninit<u8>]> {
        let start = usize::try_from(offset).ok()?;
        match start.checked_add(len) {
            Some(end) if end <= self.len() => {
                Some(&mut self.buf[self.start + start..self.start + end])
            }
            _ => {
                self.overflow += 1;
                None
            }
        }
    }

    /// Record that `len` bytes at `offset` were written through
    /// [`PlacedBuf::slot`].
    ///
    /// # Safety
    ///
    /// Every one of those bytes has been written since (they are then
    /// read as initialised by [`PlacedBuf::get`] and
    /// [`PlacedBuf::into_data`]).
    pub(crate) unsafe fn landed_at(&mut self, offset: u64, len: usize) {
        self.add(offset, offset.saturating_add(len as u64));
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
    pub fn expect(&self, tag: u32, buf: PlacedBuf) {
        self.lock().insert(tag, buf);
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

    unsafe fn landed(&mut self, tag: u32, offset: u64, len: usize) {
        if let Some(p) = self.guard.as_mut().and_then(|m| m.get_mut(&tag)) {
            // SAFETY: the caller wrote every byte of the slot `slot`
            // handed out for `(tag, offset, len)` (the trait's contract);
            // the table stayed locked by `guard` since, so it is still
            // this registration's.
            unsafe { p.landed_at(offset, len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use ethersan_channel::aead::TrafficKeys;
    use ethersan_channel::channel::{Channel, ChannelConfig};
    use ethersan_channel::frame::{Header, HEADER_LEN};
    use ethersan_channel::protect::Protector;
    use ethersan_channel::Level;
    use std::time::Instant;

    fn pair(level: Level, now: Instant) -> (Channel, Channel) {
        let (a, b) = ([7u8; 32], [9u8; 32]);
        let (pa, pb) = match level {
            Level::None => (Protector::crc_only(), Protector::crc_only()),
            _ => (
                Protector::new(level, Some(TrafficKeys::new(a, b))).unwrap(),
                Protector::new(level, Some(TrafficKeys::new(b, a))).unwrap(),
            ),
        };
        let cfg = ChannelConfig {
            max_frame: 140,
            initial_cwnd: 64,
            ..ChannelConfig::default()
        };
        (
            Channel::new(cfg.clone(), 1, 2, pa, now),
            Channel::new(cfg, 2, 1, pb, now),
        )
    }

    fn pattern(len: usize) -> Bytes {
        (0..len).map(|i| (i * 13 + i / 7) as u8).collect()
    }

    /// Placed frames into an uninitialised registration through the
    /// channel: a forged frame over a fresh range lands nothing, frames
    /// out of order and duplicated land each byte once, and the buffer is
    /// data only once all of it has landed.
    #[test]
    fn uninitialised_registration_out_of_order_duplicated_and_forged() {
        for level in [Level::None, Level::Integrity, Level::Encrypt] {
            let now = Instant::now();
            let (mut a, mut b) = pair(level, now);
            let table = Placements::default();
            table.expect(7, PlacedBuf::new(600));
            let data = pattern(600);
            a.send_placed(7, 0, data.clone()).unwrap();
            let mut frames = Vec::new();
            let mut out = Vec::new();
            while a.poll_transmit(now, &mut out) {
                if Header::parse(&out).is_ok_and(|h| h.is_placed()) {
                    frames.push(out.clone());
                }
            }
            assert!(frames.len() >= 3, "{level:?}: several frames");
            let mut deliver = |f: &[u8]| {
                let mut f = f.to_vec();
                b.handle_frame_placing(now, &mut f, &mut table.placing())
            };
            // Forged (payload bit flipped, a fresh packet number) over a
            // range where nothing has landed: rejected, nothing landed.
            let mut forged = frames[0].clone();
            forged[HEADER_LEN + 3] ^= 1;
            forged[15] ^= 0x40;
            assert!(deliver(&forged).is_err(), "{level:?}");
            assert_eq!(table.with(7, |p| p.landed()), Some(0), "{level:?}");
            assert_eq!(table.with(7, |p| p.get(0, 1).is_none()), Some(true));
            // Out of order, each twice; the first frame last.
            for f in frames[1..].iter().rev() {
                deliver(f).expect("valid");
                let _ = deliver(f);
            }
            let (covers, readable, partial) = table
                .with(7, |p| {
                    let first = p.ranges()[0].0 as usize;
                    (
                        p.covers(600),
                        p.get(first, 600).map(<[u8]>::to_vec),
                        p.get(0, 600).is_none(),
                    )
                })
                .unwrap();
            assert!(!covers && partial, "{level:?}: frame 0 missing");
            let readable = readable.expect("the landed tail is readable");
            assert_eq!(readable[..], data[600 - readable.len()..]);
            deliver(&frames[0]).expect("valid");
            // A forged copy of a landed frame spoils nothing.
            assert!(deliver(&forged).is_err());
            let p = table.release(7).expect("registered");
            assert_eq!(p.landed(), 600, "{level:?}: each byte once");
            assert_eq!(p.into_data(600).as_deref(), Some(&data[..]), "{level:?}");
        }
    }
}
