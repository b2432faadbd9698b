//! Whole PDUs on a byte stream (RFC 7143 §11.1): serializing one with its
//! digests and padding, and splitting one off the front of a buffer.

use super::*;
use crate::digest;

/// Serialize a whole PDU (header, optional header digest, data, padding,
/// optional data digest) into `out`. Convenient for control PDUs and tests;
/// the data path may write header and data separately instead.
pub fn write_pdu(
    out: &mut Vec<u8>,
    bhs: &Bhs,
    data: &[u8],
    header_digest: bool,
    data_digest: bool,
) {
    out.extend_from_slice(&bhs.0);
    if header_digest {
        out.extend_from_slice(&bhs.digest(&[]).to_le_bytes());
    }
    if !data.is_empty() {
        out.extend_from_slice(data);
        out.extend_from_slice(&[0u8; 3][..pad_len(data.len())]);
        if data_digest {
            out.extend_from_slice(&digest::data_digest(data).to_le_bytes());
        }
    }
}

/// A complete received PDU: header, AHS and data (padding and digests
/// stripped and verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPdu {
    /// The header.
    pub bhs: Bhs,
    /// Additional header segments.
    pub ahs: Vec<u8>,
    /// The data segment without padding.
    pub data: Vec<u8>,
}

/// Outcome of trying to split one PDU off the front of a byte buffer.
#[derive(Debug)]
pub enum Framed {
    /// More bytes are needed (at least this many in total).
    NeedMore(usize),
    /// A PDU and the number of bytes it used.
    Pdu(RawPdu, usize),
}

/// Split one PDU off the front of `buf` (for in-memory drivers and tests).
/// A data segment above `max_data` is an error reported by the caller's
/// policy, so it is returned as [`PduError::InvalidField`].
pub fn frame(
    buf: &[u8],
    header_digest: bool,
    data_digest: bool,
    max_data: u32,
) -> Result<Framed, PduError> {
    if buf.len() < BHS_LEN {
        return Ok(Framed::NeedMore(BHS_LEN));
    }
    let mut bhs = Bhs::default();
    bhs.0.copy_from_slice(&buf[..BHS_LEN]);
    let l = bhs.layout(header_digest, data_digest);
    if l.data_len > max_data as usize {
        return Err(PduError::InvalidField(
            "data segment longer than MaxRecvDataSegmentLength",
        ));
    }
    let total = BHS_LEN + l.header_rest() + l.data_part();
    if buf.len() < total {
        return Ok(Framed::NeedMore(total));
    }
    let ahs = buf[BHS_LEN..BHS_LEN + l.ahs_len].to_vec();
    let mut at = BHS_LEN + l.ahs_len;
    if header_digest {
        let d = [buf[at], buf[at + 1], buf[at + 2], buf[at + 3]];
        bhs.verify_digest(&ahs, d)?;
        at += 4;
    }
    let data = buf[at..at + l.data_len].to_vec();
    at += l.data_len + l.pad_len;
    if l.data_digest_len > 0 {
        let d = [buf[at], buf[at + 1], buf[at + 2], buf[at + 3]];
        verify_data_digest(&data, d)?;
    }
    Ok(Framed::Pdu(RawPdu { bhs, ahs, data }, total))
}
