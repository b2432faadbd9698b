//! Whole PDUs on a byte stream (RFC 7143 §11.1, §11.2): the one framer both
//! the target and the initiator use.
//!
//! A PDU on the wire is the 48-byte BHS, its AHS (TotalAHSLength × 4
//! bytes), an optional CRC32C header digest, then the data segment, zero
//! padding to a multiple of 4 and an optional CRC32C data digest (the
//! padding counts towards the digest, §11.1).
//!
//! [`Framer`] holds what decides that layout beyond the header itself (the
//! negotiated digests and our MaxRecvDataSegmentLength) and does no I/O:
//!
//! - decoding runs in three steps so an async driver can read each part
//!   straight into its own buffer: [`Framer::header_rest_len`] (how many
//!   bytes follow the BHS up to the header digest), [`Framer::check_header`]
//!   (header digest and length limit, giving a [`Header`] that says how long
//!   the data part is) and [`Framer::finish`] (data digest, padding
//!   stripped). [`Framer::decode`] runs the three over one buffer.
//! - encoding gives the bytes before and after a data segment
//!   ([`Framer::encode`]), so a writer can send the data from where it is,
//!   uncopied, with the data digest computed once.

use super::*;
use crate::digest;

/// What one native transport message holds ([`Framer::split_message`]).
#[derive(Debug)]
pub enum MessagePdu<'a> {
    /// A whole PDU: its header and its data part (data, padding, digest),
    /// for [`Framer::finish`].
    Whole(Header, &'a [u8]),
    /// A Data-In or Data-Out header whose data segment travelled placed.
    Placed(Header),
}

/// Why a native transport message is not one PDU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// The header is refused (digest, data segment too long).
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The message does not hold exactly one PDU.
    #[error("a native transport message {0}: the peer must send one whole PDU per message")]
    Misframed(&'static str),
}

/// Why a received PDU was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Header digest mismatch: the length fields cannot be trusted, so the
    /// connection must be dropped (§7.8).
    #[error("header digest error: {0}")]
    HeaderDigest(PduError),
    /// Data digest mismatch: the PDU was framed whole and is discarded;
    /// a target answers with a Reject (§7.8).
    #[error("data digest error: {error}")]
    DataDigest {
        /// The header of the PDU.
        bhs: Bhs,
        /// The mismatch.
        error: PduError,
    },
    /// The data segment is longer than our MaxRecvDataSegmentLength. The
    /// stream stays framed if the caller discards the next `skip` bytes
    /// (the PDU's data part).
    #[error("data segment of {len} bytes exceeds the limit {limit}")]
    TooLong {
        /// The header of the offending PDU.
        bhs: Bhs,
        /// Its DataSegmentLength.
        len: u32,
        /// The limit.
        limit: u32,
        /// Bytes of data, padding and data digest after the header part.
        skip: usize,
    },
}

/// The framing rules of one connection: digests and the data-segment limit
/// negotiated at login (RFC defaults until then: no digests, 8192 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framer {
    /// CRC32C header digests (HeaderDigest=CRC32C).
    pub header_digest: bool,
    /// CRC32C data digests (DataDigest=CRC32C).
    pub data_digest: bool,
    /// Largest data segment accepted: our declared
    /// MaxRecvDataSegmentLength (§13.12).
    pub max_recv_data_segment_length: u32,
}

impl Default for Framer {
    fn default() -> Self {
        Framer {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: 8192,
        }
    }
}

/// A received header part whose digest and length were checked; the data
/// part ([`Header::data_part_len`] bytes) follows it on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The BHS.
    pub bhs: Bhs,
    /// The additional header segments (padding included).
    pub ahs: Vec<u8>,
    /// Sizes of the parts, from the BHS and the digests in use.
    pub layout: Layout,
}

impl Header {
    /// Bytes of the data part: data, padding and data digest.
    pub fn data_part_len(&self) -> usize {
        self.layout.data_part()
    }
}

/// A complete received PDU: header, AHS and data (padding and digests
/// stripped and verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPdu {
    /// The header.
    pub bhs: Bhs,
    /// Additional header segments (see [`cdb_from_ahs`]).
    pub ahs: Vec<u8>,
    /// The data segment without padding.
    pub data: Vec<u8>,
}

/// The bytes around one outgoing data segment: send `head`, the data, then
/// `tail`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded {
    /// BHS (with TotalAHSLength and DataSegmentLength set), AHS and header
    /// digest.
    pub head: Vec<u8>,
    /// Padding and data digest (empty when there is no data).
    pub tail: Vec<u8>,
}

impl Framer {
    /// A framer with no digests and the given data-segment limit.
    pub fn new(max_recv_data_segment_length: u32) -> Self {
        Framer {
            max_recv_data_segment_length,
            ..Framer::default()
        }
    }

    /// Decoding, step 1: the bytes after `bhs` up to and including the
    /// header digest (AHS and digest).
    pub fn header_rest_len(&self, bhs: &Bhs) -> usize {
        bhs.layout(self.header_digest, self.data_digest)
            .header_rest()
    }

    /// Decoding, step 2: check the header digest over BHS and AHS, then the
    /// data-segment length. `rest` is exactly the
    /// [`header_rest_len`](Self::header_rest_len) bytes after the BHS.
    pub fn check_header(&self, bhs: Bhs, rest: &[u8]) -> Result<Header, FrameError> {
        let layout = bhs.layout(self.header_digest, self.data_digest);
        assert_eq!(rest.len(), layout.header_rest(), "header part length");
        let ahs = &rest[..layout.ahs_len];
        if self.header_digest {
            let d = &rest[layout.ahs_len..];
            bhs.verify_digest(ahs, [d[0], d[1], d[2], d[3]])
                .map_err(FrameError::HeaderDigest)?;
        }
        let len = bhs.data_len();
        if len > self.max_recv_data_segment_length {
            return Err(FrameError::TooLong {
                bhs,
                len,
                limit: self.max_recv_data_segment_length,
                skip: layout.data_part(),
            });
        }
        Ok(Header {
            bhs,
            ahs: ahs.to_vec(),
            layout,
        })
    }

    /// Decoding, step 3: `part` is the whole data part
    /// ([`Header::data_part_len`] bytes: data, padding, digest); check the
    /// data digest and keep the data alone.
    pub fn finish(&self, head: Header, mut part: Vec<u8>) -> Result<RawPdu, FrameError> {
        let l = head.layout;
        assert_eq!(part.len(), l.data_part(), "data part length");
        if l.data_digest_len > 0 {
            let at = l.data_len + l.pad_len;
            let d = [part[at], part[at + 1], part[at + 2], part[at + 3]];
            if let Err(error) = verify_data_digest(&part[..l.data_len], d) {
                return Err(FrameError::DataDigest {
                    bhs: head.bhs,
                    error,
                });
            }
        }
        part.truncate(l.data_len);
        Ok(RawPdu {
            bhs: head.bhs,
            ahs: head.ahs,
            data: part,
        })
    }

    /// Split one PDU off the front of `buf`: `Ok(None)` when `buf` holds
    /// less than a whole PDU, else the PDU and the bytes it used. A
    /// [`FrameError::TooLong`] is reported as soon as the header part is
    /// complete.
    pub fn decode(&self, buf: &[u8]) -> Result<Option<(RawPdu, usize)>, FrameError> {
        let Some(b) = buf.get(..BHS_LEN) else {
            return Ok(None);
        };
        let mut bhs = Bhs::default();
        bhs.0.copy_from_slice(b);
        let head_end = BHS_LEN + self.header_rest_len(&bhs);
        let Some(rest) = buf.get(BHS_LEN..head_end) else {
            return Ok(None);
        };
        let head = self.check_header(bhs, rest)?;
        let end = head_end + head.data_part_len();
        let Some(part) = buf.get(head_end..end) else {
            return Ok(None);
        };
        let pdu = self.finish(head, part.to_vec())?;
        Ok(Some((pdu, end)))
    }

    /// One PDU from one message of ethersan's native transport, which
    /// carries exactly one PDU per message (docs/native-transport.md, "iSCSI
    /// over the channel"): its header and its data part (for
    /// [`finish`](Self::finish)), or, for a Data-In or Data-Out whose
    /// message ends after its header, the header alone: its data was sent
    /// placed.
    pub fn split_message<'a>(&self, msg: &'a [u8]) -> Result<MessagePdu<'a>, MessageError> {
        let Some(b) = msg.get(..BHS_LEN) else {
            return Err(MessageError::Misframed("is shorter than a PDU header"));
        };
        let mut bhs = Bhs::default();
        bhs.0.copy_from_slice(b);
        let head_end = BHS_LEN + self.header_rest_len(&bhs);
        let Some(rest) = msg.get(BHS_LEN..head_end) else {
            return Err(MessageError::Misframed("ends inside a PDU header"));
        };
        let head = self.check_header(bhs, rest)?;
        let end = head_end + head.data_part_len();
        // Data-In (0x25) and Data-Out (0x05) may travel placed.
        let data_pdu = matches!(head.bhs.0[0] & 0x3f, 0x25 | 0x05);
        if msg.len() == head_end && end > head_end && data_pdu {
            return Ok(MessagePdu::Placed(head));
        }
        let Some(part) = msg.get(head_end..end) else {
            return Err(MessageError::Misframed(
                "ends inside its PDU's data segment",
            ));
        };
        if msg.len() != end {
            return Err(MessageError::Misframed("holds more than one PDU"));
        }
        Ok(MessagePdu::Whole(head, part))
    }

    /// Encode the bytes around one PDU's data segment of `data_len` bytes
    /// whose data digest (if data digests are on) is `data_crc`. Prefer
    /// [`encode`](Self::encode); this form lets a caller that already has
    /// the digest avoid computing it twice.
    ///
    /// # Panics
    /// If `ahs` is not padded to a multiple of 4 bytes or is longer than
    /// TotalAHSLength can express (1,020 bytes), or `data_len` is above
    /// [`MAX_DATA_SEGMENT`].
    pub fn encode_with_crc(
        &self,
        bhs: &Bhs,
        ahs: &[u8],
        data_len: usize,
        data_crc: impl FnOnce() -> u32,
    ) -> Encoded {
        assert!(
            ahs.len().is_multiple_of(4) && ahs.len() <= 255 * 4,
            "AHS length"
        );
        let data_len32 = u32::try_from(data_len).expect("data segment length");
        let mut bhs = *bhs;
        bhs.0[4] = (ahs.len() / 4) as u8;
        bhs.set_data_len(data_len32);
        let mut head = Vec::with_capacity(BHS_LEN + ahs.len() + 4);
        head.extend_from_slice(&bhs.0);
        head.extend_from_slice(ahs);
        if self.header_digest {
            head.extend_from_slice(&bhs.digest(ahs).to_le_bytes());
        }
        let mut tail = Vec::new();
        if data_len > 0 {
            tail.extend_from_slice(&[0u8; 3][..pad_len(data_len)]);
            if self.data_digest {
                tail.extend_from_slice(&data_crc().to_le_bytes());
            }
        }
        Encoded { head, tail }
    }

    /// Encode one PDU around `data`: the header part (BHS with
    /// TotalAHSLength and DataSegmentLength set from `ahs` and `data`, the
    /// AHS, the header digest) and the tail (padding, data digest). The
    /// data itself is not copied.
    ///
    /// # Panics
    /// As [`encode_with_crc`](Self::encode_with_crc).
    pub fn encode(&self, bhs: &Bhs, ahs: &[u8], data: &[u8]) -> Encoded {
        self.encode_with_crc(bhs, ahs, data.len(), || digest::data_digest(data))
    }

    /// Append one whole PDU (head, data, tail) to `out`.
    pub fn encode_to(&self, out: &mut Vec<u8>, bhs: &Bhs, ahs: &[u8], data: &[u8]) {
        let e = self.encode(bhs, ahs, data);
        out.extend_from_slice(&e.head);
        out.extend_from_slice(data);
        out.extend_from_slice(&e.tail);
    }
}

/// Serialize a whole PDU (header, optional header digest, data, padding,
/// optional data digest) into `out`: [`Framer::encode_to`] with no AHS.
/// DataSegmentLength is set from `data`.
pub fn write_pdu(
    out: &mut Vec<u8>,
    bhs: &Bhs,
    data: &[u8],
    header_digest: bool,
    data_digest: bool,
) {
    let f = Framer {
        header_digest,
        data_digest,
        max_recv_data_segment_length: MAX_DATA_SEGMENT,
    };
    f.encode_to(out, bhs, &[], data);
}

/// Outcome of trying to split one PDU off the front of a byte buffer.
#[derive(Debug)]
pub enum Framed {
    /// More bytes are needed (at least this many in total).
    NeedMore(usize),
    /// A PDU and the number of bytes it used.
    Pdu(RawPdu, usize),
}

/// Split one PDU off the front of `buf` with [`Framer::decode`], saying how
/// many bytes are needed when it is incomplete. A data segment above
/// `max_data` is returned as [`PduError::InvalidField`], digest errors as
/// the [`PduError`] itself.
pub fn frame(
    buf: &[u8],
    header_digest: bool,
    data_digest: bool,
    max_data: u32,
) -> Result<Framed, PduError> {
    let f = Framer {
        header_digest,
        data_digest,
        max_recv_data_segment_length: max_data,
    };
    match f.decode(buf) {
        Ok(Some((pdu, used))) => Ok(Framed::Pdu(pdu, used)),
        Ok(None) if buf.len() < BHS_LEN => Ok(Framed::NeedMore(BHS_LEN)),
        Ok(None) => {
            let mut bhs = Bhs::default();
            bhs.0.copy_from_slice(&buf[..BHS_LEN]);
            let l = bhs.layout(header_digest, data_digest);
            Ok(Framed::NeedMore(BHS_LEN + l.header_rest() + l.data_part()))
        }
        Err(FrameError::TooLong { .. }) => Err(PduError::InvalidField(
            "data segment longer than MaxRecvDataSegmentLength",
        )),
        Err(FrameError::HeaderDigest(e)) | Err(FrameError::DataDigest { error: e, .. }) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nop(data_len: u32) -> Bhs {
        Pdu::NopOut(NopOut {
            immediate: true,
            lun: 0,
            itt: 7,
            ttt: RESERVED_TAG,
            cmd_sn: 1,
            exp_stat_sn: 2,
        })
        .encode(data_len)
    }

    fn framer(hd: bool, dd: bool) -> Framer {
        Framer {
            header_digest: hd,
            data_digest: dd,
            max_recv_data_segment_length: 8192,
        }
    }

    #[test]
    fn roundtrip_with_ahs_digests_and_padding() {
        for (hd, dd) in [(false, false), (true, false), (false, true), (true, true)] {
            let f = framer(hd, dd);
            for len in [0usize, 1, 3, 4, 5, 100, 8192] {
                let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let ahs = extended_cdb_ahs(&[0xa5; 32]);
                let mut wire = Vec::new();
                f.encode_to(&mut wire, &nop(0), &ahs, &data);
                let expect = BHS_LEN
                    + ahs.len()
                    + if hd { 4 } else { 0 }
                    + len
                    + pad_len(len)
                    + if dd && len > 0 { 4 } else { 0 };
                assert_eq!(wire.len(), expect, "hd {hd} dd {dd} len {len}");
                // A second PDU behind the first is left alone.
                wire.extend_from_slice(&[0xff; 10]);
                let (pdu, used) = f.decode(&wire).unwrap().expect("a whole PDU");
                assert_eq!(used, expect);
                assert_eq!(pdu.data, data);
                assert_eq!(pdu.ahs, ahs);
                assert_eq!(pdu.bhs.data_len() as usize, len);
                assert_eq!(pdu.bhs.ahs_len(), ahs.len());
                assert_eq!(cdb_from_ahs(&[0xa5; 16], &pdu.ahs).unwrap(), vec![0xa5; 32]);
            }
        }
    }

    #[test]
    fn a_message_holds_one_pdu_or_a_placed_data_in_header() {
        let f = framer(false, false);
        let mut one = Vec::new();
        f.encode_to(&mut one, &nop(0), &[], b"hello");
        match f.split_message(&one).unwrap() {
            MessagePdu::Whole(head, part) => {
                assert_eq!(f.finish(head, part.to_vec()).unwrap().data, b"hello")
            }
            MessagePdu::Placed(_) => panic!("a NOP-Out with its data is whole"),
        }
        // Cut anywhere, or followed by more: refused, saying why.
        for (msg, why) in [
            (&one[..20], "is shorter than a PDU header"),
            (&one[..BHS_LEN + 2], "ends inside its PDU's data segment"),
        ] {
            assert_eq!(
                f.split_message(msg).unwrap_err(),
                MessageError::Misframed(why)
            );
        }
        let mut two = one.clone();
        two.extend_from_slice(&one);
        assert_eq!(
            f.split_message(&two).unwrap_err(),
            MessageError::Misframed("holds more than one PDU")
        );
        // A NOP-Out header alone is cut short; a Data-In or Data-Out
        // header alone says its data travelled placed.
        assert!(f.split_message(&one[..BHS_LEN]).is_err());
        for opcode in [0x25, 0x05] {
            let mut data_pdu = nop(4096);
            data_pdu.0[0] = opcode;
            match f.split_message(&data_pdu.0).unwrap() {
                MessagePdu::Placed(head) => assert_eq!(head.bhs.data_len(), 4096),
                MessagePdu::Whole(..) => panic!("a data PDU's header alone is placed"),
            }
        }
        // Too long a segment is the frame error, as from a stream.
        let big = nop(9000);
        assert!(matches!(
            f.split_message(&big.0),
            Err(MessageError::Frame(FrameError::TooLong { .. }))
        ));
    }

    #[test]
    fn every_truncation_needs_more() {
        let f = framer(true, true);
        let mut wire = Vec::new();
        f.encode_to(&mut wire, &nop(0), &extended_cdb_ahs(&[1; 20]), b"hello");
        for cut in 0..wire.len() {
            assert_eq!(f.decode(&wire[..cut]), Ok(None), "cut at {cut}");
        }
        assert!(f.decode(&wire).unwrap().is_some());
        match frame(&wire[..50], true, true, 8192).unwrap() {
            Framed::NeedMore(n) => assert_eq!(n, wire.len()),
            Framed::Pdu(..) => panic!("a truncated PDU framed"),
        }
    }

    #[test]
    fn digest_errors() {
        let f = framer(true, true);
        let mut wire = Vec::new();
        f.encode_to(&mut wire, &nop(0), &[], b"data");
        let mut bad = wire.clone();
        bad[20] ^= 1;
        assert!(matches!(f.decode(&bad), Err(FrameError::HeaderDigest(_))));
        let mut bad = wire.clone();
        bad[BHS_LEN + 4] ^= 1;
        match f.decode(&bad) {
            Err(FrameError::DataDigest { bhs, .. }) => assert_eq!(bhs.itt(), 7),
            other => panic!("expected a data digest error, got {other:?}"),
        }
        // Without digests, the same corruption goes unnoticed.
        let plain = framer(false, false);
        let mut wire = Vec::new();
        plain.encode_to(&mut wire, &nop(0), &[], b"data");
        wire[BHS_LEN] ^= 1;
        assert_eq!(plain.decode(&wire).unwrap().unwrap().0.data, b"eata");
    }

    #[test]
    fn too_long_says_what_to_skip() {
        let f = Framer::new(4);
        let mut wire = Vec::new();
        f.encode_to(&mut wire, &nop(0), &[], b"hello");
        // Reported from the header alone, before the data arrives.
        match f.decode(&wire[..BHS_LEN]) {
            Err(FrameError::TooLong {
                len, limit, skip, ..
            }) => {
                assert_eq!((len, limit, skip), (5, 4, 8));
                assert_eq!(BHS_LEN + skip, wire.len());
            }
            other => panic!("expected TooLong, got {other:?}"),
        }
        assert!(Framer::new(5).decode(&wire).unwrap().is_some());
    }

    #[test]
    fn steps_match_decode() {
        let f = framer(true, true);
        let mut wire = Vec::new();
        f.encode_to(&mut wire, &nop(0), &extended_cdb_ahs(&[3; 24]), b"abcdefg");
        let mut bhs = Bhs::default();
        bhs.0.copy_from_slice(&wire[..BHS_LEN]);
        let rest = f.header_rest_len(&bhs);
        let head = f.check_header(bhs, &wire[BHS_LEN..BHS_LEN + rest]).unwrap();
        let at = BHS_LEN + rest;
        let part = wire[at..at + head.data_part_len()].to_vec();
        assert_eq!(at + part.len(), wire.len());
        let pdu = f.finish(head, part).unwrap();
        assert_eq!(Some((pdu, wire.len())), f.decode(&wire).unwrap());
    }

    #[test]
    fn encode_sets_lengths_and_crc_once() {
        let f = framer(true, true);
        let mut calls = 0;
        let e = f.encode_with_crc(&nop(0), &[0; 8], 5, || {
            calls += 1;
            0x1234_5678
        });
        assert_eq!(calls, 1);
        assert_eq!(e.head.len(), BHS_LEN + 8 + 4);
        assert_eq!(e.head[4], 2, "TotalAHSLength in words");
        assert_eq!(&e.head[5..8], &[0, 0, 5], "DataSegmentLength");
        assert_eq!(e.tail, [0, 0, 0, 0x78, 0x56, 0x34, 0x12]);
        // No data: no padding, no data digest.
        assert!(f.encode(&nop(0), &[], &[]).tail.is_empty());
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400),
                                    hd in any::<bool>(), dd in any::<bool>(), max in 0u32..1024) {
            let f = Framer { header_digest: hd, data_digest: dd, max_recv_data_segment_length: max };
            if let Ok(Some((_, used))) = f.decode(&bytes) {
                prop_assert!(used <= bytes.len());
            }
            if bytes.len() >= BHS_LEN {
                let mut bhs = Bhs::default();
                bhs.0.copy_from_slice(&bytes[..BHS_LEN]);
                let n = f.header_rest_len(&bhs);
                if let Some(rest) = bytes.get(BHS_LEN..BHS_LEN + n) {
                    if let Ok(head) = f.check_header(bhs, rest) {
                        let at = BHS_LEN + n;
                        if let Some(part) = bytes.get(at..at + head.data_part_len()) {
                            let _ = f.finish(head, part.to_vec());
                        }
                    }
                }
            }
        }

        #[test]
        fn encode_decode_roundtrip(data in proptest::collection::vec(any::<u8>(), 0..600),
                                   cdb in proptest::collection::vec(any::<u8>(), 16..80),
                                   hd in any::<bool>(), dd in any::<bool>()) {
            let f = Framer { header_digest: hd, data_digest: dd, max_recv_data_segment_length: 600 };
            let ahs = extended_cdb_ahs(&cdb);
            let mut wire = Vec::new();
            f.encode_to(&mut wire, &nop(0), &ahs, &data);
            let (pdu, used) = f.decode(&wire).unwrap().unwrap();
            prop_assert_eq!(used, wire.len());
            prop_assert_eq!(&pdu.data, &data);
            let mut first = [0u8; 16];
            first.copy_from_slice(&cdb[..16]);
            prop_assert_eq!(cdb_from_ahs(&first, &pdu.ahs).unwrap(), cdb);
        }
    }
}
