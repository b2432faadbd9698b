//! A channel as messages with placed data (issue 28): what the iSCSI
//! target and initiator use instead of the byte stream once logged in.
//!
//! - Control PDUs go one per message ([`MessageSender::send`], gathered
//!   from the caller's buffers; [`MessageReceiver::recv`] gives each
//!   message whole, as [`Bytes`]), in order.
//! - Bulk data is *placed*: the receiver registers a buffer under a tag it
//!   chose ([`MessageSender::expect`]: the initiator's read buffer under
//!   the task's ITT, the target's write buffer under the R2T's TTT); the
//!   sender sends the data with the peer's tag and the byte offset
//!   ([`MessageSender::send_placed`]); each frame lands in the registered
//!   buffer at its offset, out of order and retransmitted frames included,
//!   without going through a reassembled message.
//! - Order between the two: placed data and messages share the channel's
//!   sequence space, so once a message sent after some placed data has been
//!   received, that data has landed. The receiver of a control message that
//!   ends a transfer (a SCSI Response, a final Data-In/Data-Out header)
//!   takes the buffer back with [`MessageSender::release`].
//! - [`MessageSender::abort`] drops a registration: frames arriving for it
//!   later are dropped (and acknowledged: the sender does not resend them).
//!
//! Placed data travels in placed DATA frames of the channel
//! (docs/native-transport.md §Placed data): the endpoint's task verifies
//! (decrypts) each one from the received frame straight into the
//! registered buffer, the one copy; the sender's bytes are sealed straight
//! from the caller's `Bytes` into the frame.
//!
//! The registration table is shared by the channel's halves and the
//! endpoint's task ([`Placements`]).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use bytes::Bytes;
use ethersan_channel::channel::{PlaceSlot, Placement};

use crate::stream::{ChannelReader, ChannelWriter};
use crate::ChannelInfo;

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
    fn new(buf: Vec<u8>) -> PlacedBuf {
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

/// An open channel as messages: both halves and what it is.
#[derive(Debug)]
pub struct MessageChannel {
    /// The receiving half.
    pub receiver: MessageReceiver,
    /// The sending half (also registers buffers for placed data).
    pub sender: MessageSender,
    /// The channel's peer, level and ids.
    pub info: ChannelInfo,
}

/// The receiving half: messages in order.
#[derive(Debug)]
pub struct MessageReceiver {
    inner: ChannelReader,
}

/// The sending half: messages, placed data, registrations.
#[derive(Debug)]
pub struct MessageSender {
    inner: ChannelWriter,
}

impl MessageReceiver {
    pub(crate) fn new(inner: ChannelReader) -> MessageReceiver {
        MessageReceiver { inner }
    }

    /// The next message; `Ok(None)` once the peer closed the channel, an
    /// error when it failed.
    pub async fn recv(&mut self) -> io::Result<Option<Bytes>> {
        Ok(self.inner.recv_message().await?.map(Bytes::from))
    }
}

impl MessageSender {
    pub(crate) fn new(inner: ChannelWriter) -> MessageSender {
        MessageSender { inner }
    }

    /// Send one message: the concatenation of `parts`. Waits while the
    /// peer has not acknowledged enough of what was sent before.
    pub async fn send(&mut self, parts: &[Bytes]) -> io::Result<()> {
        self.inner.send_message_parts(parts.to_vec()).await
    }

    /// Send `data` to land in the peer's buffer registered under `tag`
    /// (the peer's tag), at byte `offset`. The bytes are not copied: each
    /// frame is sealed from them as it goes out (and again if resent).
    pub async fn send_placed(&mut self, tag: u32, offset: u64, data: Bytes) -> io::Result<()> {
        self.inner.send_placed(tag, offset, data).await
    }

    /// Register `buf` to receive the data the peer places under `tag`.
    pub fn expect(&self, tag: u32, buf: Vec<u8>) {
        self.inner.placements().expect(tag, buf);
    }

    /// Take the buffer registered under `tag` back, with what landed in it.
    /// Everything the peer placed before the last message received has
    /// landed.
    pub fn release(&self, tag: u32) -> Option<PlacedBuf> {
        self.inner.placements().release(tag)
    }

    /// Drop the registration of `tag`: data arriving for it later is
    /// dropped.
    pub fn abort(&self, tag: u32) {
        self.inner.placements().release(tag);
    }

    /// Close the channel once everything sent has been delivered; with
    /// `linger`, wait until it has ended.
    pub async fn close(self, linger: bool) -> io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let mut w = if linger {
            self.inner.linger()
        } else {
            self.inner
        };
        w.shutdown().await
    }
}

impl crate::stream::ChannelStream {
    /// This channel as messages (issue 28's data path). Bytes the byte
    /// stream's reader had buffered and not read are lost: switch between
    /// PDUs (after the login's last response).
    pub fn into_messages(self) -> MessageChannel {
        MessageChannel {
            receiver: MessageReceiver::new(self.reader),
            sender: MessageSender::new(self.writer),
            info: self.info,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_out_of_order_and_repeated() {
        let mut p = PlacedBuf::new(vec![0; 100]);
        assert!(p.place(50, &[1; 25]));
        assert!(p.place(0, &[2; 25]));
        assert!(!p.covers(100));
        assert!(p.place(25, &[3; 25]));
        assert!(p.place(50, &[4; 25]));
        assert_eq!(p.ranges, vec![(0, 75)]);
        assert!(p.place(75, &[5; 25]));
        assert!(p.covers(100));
        assert_eq!(p.landed(), 100);
        assert!(!p.place(90, &[6; 20]));
        assert_eq!(p.overflow, 1);
        assert_eq!(&p.buf[50..75], &[4; 25]);
    }
}
