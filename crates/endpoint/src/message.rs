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

use std::io;

use bytes::Bytes;

pub use crate::placed::{PlacedBuf, Placements};
use crate::stream::{ChannelReader, ChannelWriter};
use crate::ChannelInfo;

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

    /// Register `buf` to receive the data the peer places under `tag`
    /// (readable whole: see [`PlacedBuf::from_vec`]).
    pub fn expect(&self, tag: u32, buf: Vec<u8>) {
        self.inner
            .placements()
            .expect(tag, PlacedBuf::from_vec(buf));
    }

    /// Register a buffer of `len` bytes, not initialised, to receive the
    /// data the peer places under `tag`: a read buffer is not zeroed; it
    /// becomes data ([`PlacedBuf::into_data`]) once all of it has landed.
    pub fn expect_len(&self, tag: u32, len: usize) {
        self.inner.placements().expect(tag, PlacedBuf::new(len));
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

    /// A handle on this channel's registrations for another task (the
    /// iSCSI target's session registers a write's buffer before it sends
    /// the R2T that asks for the data).
    pub fn registrar(&self) -> Registrar {
        Registrar {
            shared: self.inner.shared(),
        }
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

/// Registers and takes back a channel's buffers for placed data, from any
/// task ([`MessageSender::registrar`]); the same table as the sender's.
#[derive(Clone)]
pub struct Registrar {
    shared: std::sync::Arc<crate::stream::Shared>,
}

impl std::fmt::Debug for Registrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Registrar")
    }
}

impl Registrar {
    /// Register `buf` to receive the data the peer places under `tag`
    /// (readable whole: see [`PlacedBuf::from_vec`]).
    pub fn expect(&self, tag: u32, buf: Vec<u8>) {
        self.shared.placements.expect(tag, PlacedBuf::from_vec(buf));
    }

    /// Register a buffer of `len` bytes under `tag` that starts with
    /// `prefix`, data already received (see [`PlacedBuf::with_prefix`]);
    /// the rest is not initialised and readable only once data lands.
    pub fn expect_prefix(&self, tag: u32, prefix: Vec<u8>, len: usize) {
        self.expect_prefix_at(tag, prefix, 0, len);
    }

    /// Register a buffer of `len` bytes under `tag` that starts at
    /// `raw[start]` and whose start is `raw[start..]`, data already
    /// received (see [`PlacedBuf::with_prefix_at`]: an aligned buffer
    /// stays where it is).
    pub fn expect_prefix_at(&self, tag: u32, raw: Vec<u8>, start: usize, len: usize) {
        self.shared
            .placements
            .expect(tag, PlacedBuf::with_prefix_at(raw, start, len));
    }

    /// Register a buffer of `len` bytes, not initialised, under `tag` (see
    /// [`MessageSender::expect_len`]).
    pub fn expect_len(&self, tag: u32, len: usize) {
        self.shared.placements.expect(tag, PlacedBuf::new(len));
    }

    /// Take the buffer registered under `tag` back, with what landed in it.
    pub fn release(&self, tag: u32) -> Option<PlacedBuf> {
        self.shared.placements.release(tag)
    }

    /// Copy `data` into the buffer registered under `tag` at `offset` (data
    /// that came in a message rather than placed); false when there is no
    /// such registration or it does not fit.
    pub fn place(&self, tag: u32, offset: u64, data: &[u8]) -> bool {
        self.shared
            .placements
            .with(tag, |p| p.place(offset, data))
            .unwrap_or(false)
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
        let mut p = PlacedBuf::new(100);
        assert!(p.place(50, &[1; 25]));
        assert!(p.place(0, &[2; 25]));
        assert!(!p.covers(100));
        assert!(p.place(25, &[3; 25]));
        assert!(p.place(50, &[4; 25]));
        assert_eq!(p.ranges(), &[(0, 75)]);
        assert!(p.place(75, &[5; 25]));
        assert!(p.covers(100));
        assert_eq!(p.landed(), 100);
        assert!(!p.place(90, &[6; 20]));
        assert_eq!(p.overflow(), 1);
        assert_eq!(p.get(50, 75), Some(&[4; 25][..]));
        let data = p.into_data(100).expect("all landed");
        assert_eq!(&data[..25], &[2; 25]);
        assert_eq!(&data[50..75], &[4; 25]);
    }

    #[test]
    fn a_prefix_counts_as_landed_and_the_rest_must_land() {
        let mut p = PlacedBuf::with_prefix(vec![7; 16], 64);
        assert_eq!((p.len(), p.ranges()), (64, &[(0, 16)][..]));
        assert_eq!(p.get(0, 16), Some(&[7; 16][..]));
        assert_eq!(p.get(0, 17), None, "past the prefix nothing is readable");
        assert!(p.place(16, &[8; 32]));
        assert!(p.covers(48) && !p.covers(64));
        assert!(p.place(48, &[9; 16]));
        let d = p.into_data(64).expect("prefix and placed data fill it");
        assert_eq!(
            (&d[..16], &d[16..48], &d[48..]),
            (&[7; 16][..], &[8; 32][..], &[9; 16][..])
        );
        // A prefix longer than the buffer is cut; an empty one lands nothing.
        let long = PlacedBuf::with_prefix(vec![1; 40], 32);
        assert_eq!((long.len(), long.ranges()), (32, &[(0, 32)][..]));
        assert_eq!(long.into_data(32), Some(vec![1; 32]));
        let none = PlacedBuf::with_prefix(Vec::new(), 32);
        assert!(none.ranges().is_empty());
        assert!(none.into_data(1).is_none());
    }

    #[test]
    fn a_buffer_inside_its_vector_stays_where_it_is() {
        // Three bytes of prefix (say, aligning), 8 of data received, room
        // for the whole buffer: placed data lands after them, nothing moves.
        let mut raw = Vec::with_capacity(3 + 64);
        raw.extend_from_slice(&[0xaa; 3]);
        raw.extend_from_slice(&[7; 8]);
        let ptr = raw.as_ptr();
        let mut p = PlacedBuf::with_prefix_at(raw, 3, 64);
        assert_eq!((p.len(), p.ranges()), (64, &[(0, 8)][..]));
        assert_eq!(p.get(0, 8), Some(&[7; 8][..]));
        assert!(p.place(8, &[8; 56]));
        assert!(!p.place(60, &[9; 5]), "past the buffer's end");
        let (v, start) = p.into_parts(64).expect("all landed");
        assert_eq!((v.as_ptr(), start), (ptr, 3));
        assert_eq!((&v[3..11], &v[11..]), (&[7; 8][..], &[8; 56][..]));
        // into_data gives the same bytes at the vector's front.
        let p = PlacedBuf::with_prefix_at(vec![1, 2, 3, 4], 2, 2);
        assert_eq!(p.into_data(2), Some(vec![3, 4]));
    }

    #[test]
    fn a_partly_landed_buffer_is_never_data() {
        let mut p = PlacedBuf::new(64);
        assert!(p.place(16, &[1; 16]));
        assert!(p.place(48, &[2; 16]));
        // Landed ranges are readable, nothing across a gap.
        assert_eq!(p.get(16, 32), Some(&[1; 16][..]));
        assert_eq!(p.get(20, 24), Some(&[1; 4][..]));
        assert_eq!(p.get(0, 16), None);
        assert_eq!(p.get(16, 33), None);
        assert_eq!(p.get(16, 64), None);
        assert_eq!(p.get(48, 65), None, "beyond the buffer");
        assert_eq!(p.get(10, 10), Some(&[][..]));
        // Data only when all of [0, len) has landed.
        let mut q = PlacedBuf::new(64);
        assert!(q.place(0, &[3; 32]));
        assert!(q.covers(32) && !q.covers(33));
        assert!(PlacedBuf::new(64).into_data(1).is_none());
        assert_eq!(PlacedBuf::new(64).into_data(0), Some(Vec::new()));
        assert!(p.into_data(64).is_none(), "gaps at 0..16 and 32..48");
        let mut short = PlacedBuf::new(64);
        assert!(short.place(0, &[3; 32]));
        assert!(short.place(32, &[4; 8]));
        let d = short.into_data(40).expect("a short read: 0..40 landed");
        assert_eq!(d.len(), 40);
        assert_eq!(&d[32..], &[4; 8]);
        let mut beyond = PlacedBuf::new(8);
        assert!(beyond.place(0, &[5; 8]));
        assert!(beyond.into_data(9).is_none(), "beyond the buffer");
    }

    #[test]
    fn an_initialised_registration_is_readable_whole() {
        let mut p = PlacedBuf::from_vec(vec![9; 32]);
        assert_eq!(p.landed(), 0);
        assert!(p.place(8, &[1; 8]));
        assert_eq!(p.get(0, 32).map(|b| b[0]), Some(9));
        let d = p.into_data(32).expect("initialised");
        assert_eq!(&d[..8], &[9; 8]);
        assert_eq!(&d[8..16], &[1; 8]);
    }
}
