//! Reading and writing PDUs on a byte stream (RFC 7143 §11 framing).
//!
//! Thin async adapters over the sans-IO [`Framer`] of `ethersan_proto`,
//! which holds the wire format: [`PduReader`] reads one PDU at a time
//! (read-ahead buffer; large data segments read straight into their own
//! buffers), verifying digests and the negotiated data-segment limit;
//! [`spawn_writer`] runs the task that owns the write half and sends frames
//! in batches, one vectored write of uncopied data segments, computing
//! each digest once. A session's reader puts a write command's immediate
//! data into an aligned buffer with room for the whole transfer
//! ([`PduReader::read_aligning`]), so the write reaches an `O_DIRECT`
//! store without a bounce copy.

use bytes::{BufMut, Bytes};
use ethersan_backend::IoBuf;
use ethersan_endpoint::{MessageReceiver, MessageSender};
use ethersan_proto::pdu::{
    Bhs, FrameError, Framer, Header, MessageError, MessagePdu, PduError, RawPdu, BHS_LEN,
    MAX_DATA_SEGMENT,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Why reading a PDU failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    /// The peer closed the connection between PDUs.
    #[error("connection closed")]
    Closed,
    /// A socket error or a close in the middle of a PDU.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Header digest mismatch: the length fields cannot be trusted, so the
    /// connection must be dropped (§7.8).
    #[error("header digest error: {0}")]
    HeaderDigest(PduError),
    /// Data digest mismatch: the PDU was read whole and discarded; the
    /// caller answers with a Reject (§7.8).
    #[error("data digest error: {1}")]
    DataDigest(Bhs, PduError),
    /// The data segment exceeded MaxRecvDataSegmentLength; it was read and
    /// discarded; the caller answers with a Reject (protocol error).
    #[error("data segment of {len} bytes exceeds the limit {limit}")]
    TooLong {
        /// The header of the offending PDU.
        bhs: Bhs,
        /// Its DataSegmentLength.
        len: u32,
        /// The negotiated limit.
        limit: u32,
    },
}

/// Bytes of read buffer per connection.
const READ_BUFFER: usize = 32 * 1024;

/// Where PDUs come from.
#[derive(Debug)]
enum Source<R> {
    /// A byte stream (TCP): PDUs framed by their lengths.
    Stream(BufReader<R>),
    /// A native transport channel: one PDU per message (docs/native-transport.md).
    Messages(MessageReceiver),
}

/// Reads PDUs from the receive half of a connection.
#[derive(Debug)]
pub(crate) struct PduReader<R> {
    src: Source<R>,
    /// The framing rules in force: digests to verify, the largest data
    /// segment accepted (our MaxRecvDataSegmentLength).
    pub(crate) framer: Framer,
}

impl<R: AsyncRead + Unpin> PduReader<R> {
    pub(crate) fn new(r: R, max_data: u32) -> Self {
        PduReader {
            // Small: a connection that never logs in costs little memory;
            // data segments larger than this are read straight into their
            // own buffers, bypassing it.
            src: Source::Stream(BufReader::with_capacity(READ_BUFFER, r)),
            framer: Framer {
                header_digest: false,
                data_digest: false,
                max_recv_data_segment_length: max_data,
            },
        }
    }

    /// Read one whole PDU: the three decoding steps of [`Framer`], each part
    /// read straight into its own buffer.
    pub(crate) async fn read(&mut self) -> Result<RawPdu, ReadError> {
        self.read_inner(false).await.map(|(raw, _)| raw)
    }

    /// [`read`](Self::read), except that the immediate data of a SCSI
    /// write command read from a stream without data digests comes in an
    /// aligned buffer of its own, with room for the whole transfer (as
    /// [`write_capacity`] says), and the PDU's `data` is empty.
    pub(crate) async fn read_aligning(&mut self) -> Result<(RawPdu, Option<IoBuf>), ReadError> {
        self.read_inner(true).await
    }

    async fn read_inner(&mut self, align: bool) -> Result<(RawPdu, Option<IoBuf>), ReadError> {
        let f = self.framer;
        let r = match &mut self.src {
            Source::Stream(r) => r,
            Source::Messages(rx) => return read_message(rx, f, align).await,
        };
        let mut bhs = Bhs::default();
        // Distinguish a clean close between PDUs from a truncated one.
        let n = r.read(&mut bhs.0).await?;
        if n == 0 {
            return Err(ReadError::Closed);
        }
        if n < BHS_LEN {
            r.read_exact(&mut bhs.0[n..]).await?;
        }
        let mut rest = vec![0u8; f.header_rest_len(&bhs)];
        r.read_exact(&mut rest).await?;
        let head = match f.check_header(bhs, &rest) {
            Ok(head) => head,
            Err(e) => {
                if let FrameError::TooLong { skip, .. } = e {
                    // Read and drop the oversized segment so the stream
                    // stays framed.
                    let mut sink = tokio::io::sink();
                    let skip = skip as u64;
                    let copied = tokio::io::copy(&mut (&mut *r).take(skip), &mut sink).await?;
                    if copied < skip {
                        return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
                    }
                }
                return Err(e.into());
            }
        };
        let len = head.data_part_len();
        // A write's immediate data lands in a buffer with room for the rest,
        // when it is a good part of it (so PDUs read ahead of the session
        // hold at most four times their data).
        let room = write_capacity(&head.bhs);
        let capacity = if len > 0 && len.saturating_mul(4) >= room {
            room
        } else {
            0
        };
        if align && capacity > 0 && !f.data_digest {
            // Padding included (no digest to check), then cut off.
            let mut data = IoBuf::aligned_with_capacity(capacity.max(len));
            fill_part(r, &mut data, len).await?;
            data.truncate(head.layout.data_len);
            let raw = header_only(head);
            return Ok((raw, Some(data)));
        }
        let part = read_part(r, len, capacity).await?;
        Ok((f.finish(head, part)?, None))
    }
}

impl PduReader<tokio::io::Empty> {
    /// PDUs from a native transport channel's messages, one per message.
    pub(crate) fn messages(rx: MessageReceiver, max_data: u32) -> Self {
        PduReader {
            src: Source::Messages(rx),
            framer: Framer {
                header_digest: false,
                data_digest: false,
                max_recv_data_segment_length: max_data,
            },
        }
    }
}

/// One PDU from one message: the header parsed in place, the data part
/// copied once into a buffer of its own (with room for the rest of a
/// write's data, as from a stream; with `align`, that one aligned, as
/// [`PduReader::read_aligning`] says).
async fn read_message(
    rx: &mut MessageReceiver,
    f: Framer,
    align: bool,
) -> Result<(RawPdu, Option<IoBuf>), ReadError> {
    let msg = rx.recv().await?.ok_or(ReadError::Closed)?;
    let misframed =
        |e: String| ReadError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
    let (head, data) = match f.split_message(&msg) {
        Ok(MessagePdu::Whole(head, data)) => (head, data),
        // A Data-Out header alone: its data was placed into the write's
        // registered buffer (the session checks that it landed).
        Ok(MessagePdu::Placed(head)) if head.bhs.0[0] & 0x3f == 0x05 => {
            let raw = header_only(head);
            return Ok((raw, None));
        }
        // Data-In travels only to the initiator.
        Ok(MessagePdu::Placed(_)) => {
            return Err(misframed(
                MessageError::Misframed("ends after a Data-In header").to_string(),
            ))
        }
        Err(MessageError::Frame(e)) => return Err(e.into()),
        Err(e) => return Err(misframed(e.to_string())),
    };
    let len = data.len();
    let room = write_capacity(&head.bhs);
    let capacity = if len > 0 && len.saturating_mul(4) >= room {
        room
    } else {
        0
    };
    if align && capacity > 0 && !f.data_digest {
        let mut d = IoBuf::aligned_with_capacity(len.max(capacity));
        d.extend_from_slice(data);
        d.truncate(head.layout.data_len);
        let raw = header_only(head);
        return Ok((raw, Some(d)));
    }
    let mut part = Vec::with_capacity(len.max(capacity));
    part.extend_from_slice(data);
    Ok((f.finish(head, part)?, None))
}

/// A PDU whose data segment is elsewhere (placed, or in an aligned buffer
/// of its own): its header, no data.
fn header_only(head: Header) -> RawPdu {
    RawPdu {
        bhs: head.bhs,
        ahs: head.ahs,
        data: Vec::new(),
    }
}

/// Most bytes of a write's buffer allocated with its command PDU (larger
/// writes get theirs when the session reserves it, and copy only their
/// immediate data into it): bounds what PDUs read ahead of the session
/// can hold.
const WRITE_CAPACITY_MAX: usize = 256 * 1024;

/// For a SCSI Command PDU that writes: its expected data transfer length
/// (up to [`WRITE_CAPACITY_MAX`]), so that the buffer its immediate data
/// is read into can take the rest of the data too, and becomes the
/// command's buffer without a copy. 0 for any other PDU.
fn write_capacity(bhs: &Bhs) -> usize {
    let b = &bhs.0;
    let scsi_command = b[0] & 0x3f == 0x01;
    let write = b[1] & 0x20 != 0;
    if !(scsi_command && write) {
        return 0;
    }
    let edtl = u32::from_be_bytes([b[20], b[21], b[22], b[23]]) as usize;
    if edtl <= WRITE_CAPACITY_MAX {
        edtl
    } else {
        0
    }
}

/// Read exactly `len` bytes into a new buffer of `capacity` (at least
/// `len`), never zeroed first: the socket writes into its spare capacity
/// (a large data segment bypasses the read-ahead buffer).
async fn read_part<R: AsyncRead + Unpin>(
    r: &mut R,
    len: usize,
    capacity: usize,
) -> std::io::Result<Vec<u8>> {
    let mut part = Vec::with_capacity(capacity.max(len));
    fill_part(r, &mut part, len).await?;
    Ok(part)
}

/// Read into `part` until it holds `len` bytes, into its spare capacity
/// (never zeroed first).
async fn fill_part<R, B>(r: &mut R, part: &mut B, len: usize) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    B: BufMut + std::ops::Deref<Target = [u8]>,
{
    while part.len() < len {
        let want = (len - part.len()) as u64;
        if (&mut *r).take(want).read_buf(part).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

impl From<FrameError> for ReadError {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::HeaderDigest(e) => ReadError::HeaderDigest(e),
            FrameError::DataDigest { bhs, error } => ReadError::DataDigest(bhs, error),
            FrameError::TooLong {
                bhs, len, limit, ..
            } => ReadError::TooLong { bhs, len, limit },
        }
    }
}

/// One PDU to send: a header and its data segment.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) bhs: Bhs,
    pub(crate) data: Bytes,
}

/// Messages to the writer task.
#[derive(Debug)]
pub(crate) enum WriterMsg {
    /// Send this PDU.
    Frame(Frame),
    /// From now on use these digests.
    Digests { header: bool, data: bool },
    /// Flush, then shut down the write half (Logout, fatal errors).
    Close,
}

/// Largest batch of frames gathered into one vectored write.
const MAX_BATCH: usize = 64;

/// Start the task that owns the write half. It gathers every queued frame
/// (up to [`MAX_BATCH`]) into one vectored write: headers and digests are
/// small buffers, data segments are sent from where they are, uncopied.
/// Returns when the channel closes or on error.
pub(crate) fn spawn_writer<W>(
    w: W,
) -> (
    mpsc::UnboundedSender<WriterMsg>,
    tokio::task::JoinHandle<std::io::Result<()>>,
)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<WriterMsg>();
    let handle = tokio::spawn(async move {
        let mut w = w;
        let (mut hd, mut dd) = (false, false);
        let mut batch: Vec<Frame> = Vec::with_capacity(MAX_BATCH);
        while let Some(msg) = rx.recv().await {
            let mut next = Some(msg);
            let mut close = false;
            while let Some(msg) = next.take() {
                match msg {
                    WriterMsg::Frame(f) => batch.push(f),
                    WriterMsg::Digests { header, data } => {
                        // Frames queued before the change use the old digests.
                        write_batch(&mut w, &mut batch, hd, dd).await?;
                        hd = header;
                        dd = data;
                    }
                    WriterMsg::Close => {
                        close = true;
                        break;
                    }
                }
                if batch.len() < MAX_BATCH {
                    next = rx.try_recv().ok();
                }
            }
            write_batch(&mut w, &mut batch, hd, dd).await?;
            if close {
                w.flush().await?;
                w.shutdown().await?;
                return Ok(());
            }
        }
        w.flush().await
    });
    (tx, handle)
}

/// Start the task that owns a native transport channel's sending half: one
/// message per PDU; with data digests off, a Data-In's data is *placed*
/// (sent to land in the initiator's buffer registered under the task's
/// ITT, at the PDU's buffer offset) and the PDU follows as its header
/// alone (docs/native-transport.md, "iSCSI over the channel"). Returns
/// when the queue closes or on error.
pub(crate) fn spawn_message_writer(
    mut tx_half: MessageSender,
) -> (
    mpsc::UnboundedSender<WriterMsg>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<WriterMsg>();
    let handle = tokio::spawn(async move {
        let mut framer = Framer {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: MAX_DATA_SEGMENT,
        };
        while let Some(msg) = rx.recv().await {
            match msg {
                WriterMsg::Frame(f) => {
                    let e = framer.encode(&f.bhs, &[], &f.data);
                    let head = Bytes::from(e.head);
                    if let Some((itt, offset)) = placed_data_in(&f, framer.data_digest) {
                        tx_half.send_placed(itt, offset, f.data).await?;
                        tx_half.send(&[head]).await?;
                    } else if f.data.is_empty() && e.tail.is_empty() {
                        tx_half.send(&[head]).await?;
                    } else {
                        tx_half.send(&[head, f.data, Bytes::from(e.tail)]).await?;
                    }
                }
                WriterMsg::Digests { header, data } => {
                    framer.header_digest = header;
                    framer.data_digest = data;
                }
                WriterMsg::Close => {
                    return tx_half.close(false).await;
                }
            }
        }
        Ok(())
    });
    (tx, handle)
}

/// A read whose whole data is at most this long goes inline with its
/// Data-In (one message, usually one frame) rather than placed (a placed
/// frame and a header message): the same one copy on the initiator, half
/// the frames. The same bound as the initiator's unsolicited writes
/// (`ethersan_initiator::MESSAGES_FIRST_BURST`).
pub(crate) const INLINE_READ_MAX: usize = 8192;

/// For a Data-In PDU whose data travels placed (it has data, no data
/// digest covers it, and it is not a small read's whole data): its ITT
/// and buffer offset.
fn placed_data_in(f: &Frame, data_digest: bool) -> Option<(u32, u64)> {
    let b = &f.bhs.0;
    let data_in = b[0] & 0x3f == 0x25;
    if !data_in || f.data.is_empty() || data_digest {
        return None;
    }
    let itt = u32::from_be_bytes([b[16], b[17], b[18], b[19]]);
    let offset = u32::from_be_bytes([b[40], b[41], b[42], b[43]]);
    // Offset 0 and the final bit: this PDU is the task's whole data. (A
    // later PDU of a larger read stays placed even when short: the
    // initiator takes a Data-In with status and inline data as the whole
    // answer and drops the read's registration.)
    let whole = offset == 0 && b[1] & 0x80 != 0;
    if whole && f.data.len() <= INLINE_READ_MAX {
        return None;
    }
    Some((itt, u64::from(offset)))
}

/// Send the frames of a batch with vectored writes and empty the batch.
async fn write_batch<W: AsyncWrite + Unpin>(
    w: &mut W,
    batch: &mut Vec<Frame>,
    hd: bool,
    dd: bool,
) -> std::io::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    // Per frame: header (+ header digest), and after the data its padding
    // and data digest, each a small owned buffer from the framer.
    let framer = Framer {
        header_digest: hd,
        data_digest: dd,
        max_recv_data_segment_length: MAX_DATA_SEGMENT,
    };
    let mut heads: Vec<Vec<u8>> = Vec::with_capacity(batch.len());
    let mut tails: Vec<Vec<u8>> = Vec::with_capacity(batch.len());
    for f in batch.iter() {
        let e = framer.encode(&f.bhs, &[], &f.data);
        heads.push(e.head);
        tails.push(e.tail);
    }
    let mut slices: Vec<std::io::IoSlice<'_>> = Vec::with_capacity(batch.len() * 3);
    for ((f, h), t) in batch.iter().zip(&heads).zip(&tails) {
        slices.push(std::io::IoSlice::new(h));
        if !f.data.is_empty() {
            slices.push(std::io::IoSlice::new(&f.data));
        }
        if !t.is_empty() {
            slices.push(std::io::IoSlice::new(t));
        }
    }
    let mut rest: &mut [std::io::IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        let n = w.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut rest, n);
    }
    drop(slices);
    batch.clear();
    Ok(())
}

#[cfg(test)]
mod capacity_tests {
    use super::*;

    fn bhs(opcode: u8, flags: u8, edtl: u32) -> Bhs {
        let mut b = Bhs::default();
        b.0[0] = opcode;
        b.0[1] = flags;
        b.0[20..24].copy_from_slice(&edtl.to_be_bytes());
        b
    }

    #[tokio::test]
    async fn a_writes_immediate_data_gets_room_for_the_whole_transfer() {
        // SCSI Command, W bit: room for the expected length, within the cap.
        assert_eq!(write_capacity(&bhs(0x01, 0xa0, 131_072)), 131_072);
        assert_eq!(
            write_capacity(&bhs(0x41, 0xa0, 4096)),
            4096,
            "immediate bit"
        );
        assert_eq!(write_capacity(&bhs(0x01, 0xa0, 1 << 20)), 0, "over the cap");
        // Reads, Data-Out and other PDUs: none.
        assert_eq!(write_capacity(&bhs(0x01, 0xc0, 131_072)), 0);
        assert_eq!(write_capacity(&bhs(0x05, 0x80, 131_072)), 0);
        // The bytes read are exactly the segment's, in a buffer of that room.
        let data: Vec<u8> = (0..70_000u32).map(|i| i as u8).collect();
        let mut src = &data[..];
        let part = read_part(&mut src, 65_536, 131_072).await.unwrap();
        assert_eq!(part[..], data[..65_536]);
        assert!(part.capacity() >= 131_072);
        // A stream that ends early is an error, not a short buffer.
        let mut short = &data[..100];
        let e = read_part(&mut short, 200, 0).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn a_writes_immediate_data_lands_aligned_with_room_for_the_rest() {
        // A SCSI Command PDU (W bit, EDTL 128 KiB) carrying 40001 bytes of
        // immediate data (3 bytes of padding), then a NOP-Out.
        let mut b = bhs(0x01, 0xa0, 131_072);
        b.0[5..8].copy_from_slice(&40_001u32.to_be_bytes()[1..]);
        let imm: Vec<u8> = (0..40_001u32).map(|i| (i * 13) as u8).collect();
        let mut stream = b.0.to_vec();
        stream.extend_from_slice(&imm);
        stream.extend_from_slice(&[0; 3]);
        stream.extend_from_slice(&bhs(0x40, 0x80, 0).0);
        let mut reader = PduReader::new(&stream[..], 65_536);
        let (raw, data) = reader.read_aligning().await.unwrap();
        assert!(raw.data.is_empty());
        let data = data.expect("an aligned buffer of its own");
        assert!(data.is_aligned());
        assert_eq!(data, imm);
        assert!(data.capacity() >= 131_072);
        // Any other PDU comes as before.
        let (raw, data) = reader.read_aligning().await.unwrap();
        assert_eq!(raw.bhs.0[0], 0x40);
        assert!(data.is_none());
    }
}
