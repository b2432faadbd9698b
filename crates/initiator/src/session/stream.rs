//! The reader of a byte stream (TCP): PDUs off the stream, and a read's
//! Data-In straight into the buffer the driver registered for it.
//!
//! The driver registers a buffer under a read's ITT before it sends the
//! command ([`Reg::Expect`]); the registration reaches this task through a
//! channel, ahead of any Data-In the command can cause. A Data-In for a
//! registered ITT is read from the socket into its place in that buffer:
//! the data is copied once, by the kernel, where a PDU of its own would
//! be copied again into the caller's buffer. Only its header goes on
//! ([`Incoming::Placed`]); the buffer is handed back
//! ([`Incoming::Returned`]) just before the PDU that ends the read (a
//! Data-In with status, or the SCSI Response), and the driver gives the
//! connection one Data-In holding it all, as over the native transport.
//!
//! A large data segment is read from the socket itself, not through the
//! read buffer (which would copy it once more); the header after a large
//! segment too, so that the buffer does not fill with the next segment.

use std::collections::HashMap;

use ethersan_endpoint::PlacedBuf;
use ethersan_proto::negotiate::SessionParams;
use ethersan_proto::pdu::{Bhs, Framer, Header, RawPdu};
use tokio::io::{AsyncBufRead, AsyncRead, AsyncReadExt, BufReader};
use tokio::sync::mpsc;

use super::Incoming;
use crate::Error;

/// A data segment at least this long is read past the read buffer.
const LARGE: usize = 32 * 1024;

/// What the driver tells the reader about read buffers.
#[derive(Debug)]
pub(super) enum Reg {
    /// Place the Data-In of task `itt` into this buffer.
    Expect(u32, PlacedBuf),
    /// Task `itt` ended without its data: drop its buffer.
    Forget(u32),
}

/// The reader task's state.
pub(super) struct StreamReader<R> {
    rd: BufReader<R>,
    params: SessionParams,
    regs: mpsc::UnboundedReceiver<Reg>,
    bufs: HashMap<u32, PlacedBuf>,
    /// The last data segment was large: read the next header unbuffered.
    large: bool,
}

impl<R: AsyncRead + Unpin> StreamReader<R> {
    pub(super) fn new(
        rd: R,
        params: SessionParams,
        regs: mpsc::UnboundedReceiver<Reg>,
    ) -> StreamReader<R> {
        StreamReader {
            rd: BufReader::with_capacity(256 * 1024, rd),
            params,
            regs,
            bufs: HashMap::new(),
            large: false,
        }
    }

    /// Read PDUs and send them to the driver until the stream or the
    /// driver ends.
    pub(super) async fn run(mut self, tx: mpsc::Sender<Result<Incoming, Error>>) {
        let mut out = Vec::with_capacity(2);
        loop {
            let r = self.next(&mut out).await;
            let failed = r.is_err();
            if let Err(e) = r {
                out.push(Err(e));
            }
            for m in out.drain(..) {
                if tx.send(m).await.is_err() {
                    return;
                }
            }
            if failed {
                return;
            }
        }
    }

    /// Take in the driver's registrations.
    fn take_registrations(&mut self) {
        while let Ok(r) = self.regs.try_recv() {
            match r {
                Reg::Expect(itt, buf) => {
                    self.bufs.insert(itt, buf);
                }
                Reg::Forget(itt) => {
                    self.bufs.remove(&itt);
                }
            }
        }
    }

    /// Read `buf.len()` bytes: past the read buffer when it is empty and
    /// the last segment was large.
    async fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), Error> {
        if self.large && self.rd.buffer().is_empty() {
            self.rd.get_mut().read_exact(buf).await?;
        } else {
            self.rd.read_exact(buf).await?;
        }
        Ok(())
    }

    /// One PDU, into `out` (with the buffer it ends, if any).
    async fn next(&mut self, out: &mut Vec<Result<Incoming, Error>>) -> Result<(), Error> {
        let f = crate::framer(&self.params);
        let mut bhs = Bhs::default();
        self.read_exact(&mut bhs.0).await?;
        let mut rest = vec![0u8; f.header_rest_len(&bhs)];
        self.read_exact(&mut rest).await?;
        let head = f
            .check_header(bhs, &rest)
            .map_err(|e| Error::Protocol(e.to_string()))?;
        let b = &head.bhs.0;
        let opcode = b[0] & 0x3f;
        let itt = u32::from_be_bytes([b[16], b[17], b[18], b[19]]);
        let data_len = head.layout.data_len;
        self.large = data_len >= LARGE;
        if opcode == 0x25 && data_len > 0 && head.layout.data_digest_len == 0 {
            self.take_registrations();
            let offset = u32::from_be_bytes([b[40], b[41], b[42], b[43]]);
            let status = b[1] & 0x01 != 0;
            if let Some(mut buf) = self.bufs.remove(&itt) {
                if self.place(&mut buf, u64::from(offset), &head).await? {
                    if status {
                        out.push(Ok(Incoming::Returned(itt, buf)));
                    } else {
                        self.bufs.insert(itt, buf);
                    }
                    out.push(Ok(Incoming::Placed(RawPdu {
                        bhs: head.bhs,
                        ahs: head.ahs,
                        data: Vec::new(),
                    })));
                    return Ok(());
                }
                // Beyond the buffer: whole, for the connection to refuse.
                self.bufs.insert(itt, buf);
            }
        }
        if opcode == 0x21 || (opcode == 0x25 && b[1] & 0x01 != 0) {
            // It ends a read (a SCSI Response, or a Data-In with status
            // not placed, e.g. one without data): the data placed before
            // it goes first.
            self.take_registrations();
            if let Some(buf) = self.bufs.remove(&itt) {
                out.push(Ok(Incoming::Returned(itt, buf)));
            }
        }
        let raw = self.read_part(&f, head).await?;
        out.push(Ok(Incoming::Pdu(raw)));
        Ok(())
    }

    /// Read a Data-In's data into `buf` at `offset`, and its padding;
    /// `false` (nothing read) when it does not fit.
    async fn place(
        &mut self,
        buf: &mut PlacedBuf,
        offset: u64,
        head: &Header,
    ) -> Result<bool, Error> {
        let len = head.layout.data_len;
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > buf.len() as u64) {
            return Ok(false);
        }
        // What the read buffer already holds, then the rest from the
        // socket itself.
        let held = self.rd.buffer().len().min(len);
        let mut head_part = &self.rd.buffer()[..held];
        if !buf.read_at(offset, held, &mut head_part).await? {
            return Ok(false);
        }
        std::pin::Pin::new(&mut self.rd).consume(held);
        let rest = len - held;
        if rest > 0
            && !buf
                .read_at(offset + held as u64, rest, self.rd.get_mut())
                .await?
        {
            return Ok(false);
        }
        let mut pad = [0u8; 4];
        self.read_exact(&mut pad[..head.layout.pad_len]).await?;
        Ok(true)
    }

    /// The rest of a PDU that is not placed: its data part, checked.
    async fn read_part(&mut self, f: &Framer, head: Header) -> Result<RawPdu, Error> {
        let want = head.data_part_len();
        // read_to_end fills the spare capacity as it is (tokio passes it
        // on uninitialised) and the buffer is neither zeroed nor grown.
        let mut part = Vec::with_capacity(want);
        if want > 0 {
            (&mut self.rd)
                .take(want as u64)
                .read_to_end(&mut part)
                .await?;
            if part.len() < want {
                return Err(Error::Closed);
            }
        }
        f.finish(head, part)
            .map_err(|e| Error::Protocol(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethersan_proto::pdu::{DataIn, Pdu, RESERVED_TAG};

    fn data_in(itt: u32, offset: u32, data: &[u8], status: bool) -> Vec<u8> {
        let d = DataIn {
            final_bit: status,
            ack: false,
            overflow: false,
            underflow: false,
            status_present: status,
            status: 0,
            lun: 0,
            itt,
            ttt: RESERVED_TAG,
            stat_sn: 1,
            exp_cmd_sn: 1,
            max_cmd_sn: 9,
            data_sn: offset / 4096,
            buffer_offset: offset,
            residual: 0,
        };
        let bhs = Pdu::DataIn(d).encode(data.len() as u32);
        let e = crate::framer(&SessionParams::default()).encode(&bhs, &[], data);
        [e.head, data.to_vec(), e.tail].concat()
    }

    /// Data-In for a registered read lands in its buffer; the buffer comes
    /// back before a Data-In with status that carries no data (the read's
    /// end), and a read never registered comes whole.
    #[tokio::test]
    async fn placed_data_in_and_an_empty_final_data_in() {
        let block: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let mut wire = data_in(7, 0, &block, false);
        wire.extend(data_in(7, 4096, &block[..1000], false));
        wire.extend(data_in(7, 0, &[], true));
        wire.extend(data_in(9, 0, &block[..100], true));
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(Reg::Expect(7, PlacedBuf::new(8192))).unwrap();
        let mut r = StreamReader::new(&wire[..], SessionParams::default(), rx);
        let mut out = Vec::new();
        while r.next(&mut out).await.is_ok() {}
        let kinds: Vec<&str> = out
            .iter()
            .map(|m| match m {
                Ok(Incoming::Placed(_)) => "placed",
                Ok(Incoming::Returned(..)) => "returned",
                Ok(Incoming::Pdu(_)) => "pdu",
                Err(_) => "error",
            })
            .collect();
        assert_eq!(kinds, ["placed", "placed", "returned", "pdu", "pdu"]);
        let Ok(Incoming::Returned(7, buf)) = &out[2] else {
            panic!("the buffer of task 7");
        };
        assert_eq!(buf.ranges(), &[(0, 5096)]);
        assert!(buf.get(0, 4096).unwrap() == &block[..]);
        assert!(buf.get(4096, 5096).unwrap() == &block[..1000]);
        let Ok(Incoming::Pdu(p)) = &out[4] else {
            panic!("task 9's Data-In whole");
        };
        assert_eq!(p.data, &block[..100]);
    }
}
