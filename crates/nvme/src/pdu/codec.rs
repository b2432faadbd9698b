//! NVMe/TCP Transport Specification (TP 8000) §7.4.5–§7.4.9: PDU encoding
//! and incremental decoding, with digests (§7.4.3), PDO alignment (§7.4.4)
//! and the data length guard.

use std::ops::Range;

use super::*;
use crate::digest::crc32c;

/// A PDU whose header (and header digest) has arrived and checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The PDU.
    pub pdu: Pdu,
    /// Where its data lies, counted from the start of the PDU.
    pub data: Range<usize>,
    /// Where the data digest lies, if one is sent.
    pub data_digest: Option<usize>,
    /// PLEN: the whole PDU's length.
    pub len: usize,
}

/// A whole PDU decoded from the front of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The PDU.
    pub pdu: Pdu,
    /// Where its data lies in the buffer given to [`decode`].
    pub data: Range<usize>,
    /// Bytes the PDU took (PLEN).
    pub len: usize,
    /// False when a data digest was sent and does not match the data. Not a
    /// fatal error: the command ends with Transient Transport Error.
    pub data_digest_ok: bool,
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn invalid(offset: u32, what: &'static str) -> PduError {
    PduError::InvalidHeaderField { offset, what }
}

/// Decodes the header of the PDU at the front of `buf`: `Ok(None)` until
/// the header and its digest are all there. Checks every header field,
/// the header digest and the data length against `framing.max_data`, but
/// not the data digest.
pub fn decode_head(buf: &[u8], framing: &Framing) -> Result<Option<Head>, PduError> {
    let Some(ch) = buf.get(..COMMON_HEADER_LEN) else {
        return Ok(None);
    };
    let ty = PduType::from_u8(ch[0]).ok_or(invalid(0, "unknown PDU type"))?;
    let flags = ch[1];
    let hlen = ty.header_len();
    if usize::from(ch[2]) != hlen {
        return Err(invalid(2, "HLEN"));
    }
    let pdo = usize::from(ch[3]);
    let plen = u32_at(ch, 4) as usize;
    let digests = ty.digestible();
    let hd = flags & FLAG_HDGSTF != 0;
    if hd != (digests && framing.header_digest) {
        return Err(invalid(1, "HDGSTF"));
    }
    let ddf = flags & FLAG_DDGSTF != 0;
    if ddf && !(digests && framing.data_digest && ty.has_data()) {
        return Err(invalid(1, "DDGSTF"));
    }
    let head_end = hlen + if hd { DIGEST_LEN } else { 0 };
    if plen < head_end {
        return Err(invalid(4, "PLEN shorter than the header"));
    }
    let dd = if ddf { DIGEST_LEN } else { 0 };
    let data = match ty {
        PduType::IcReq | PduType::IcResp => {
            if plen != hlen {
                return Err(invalid(4, "PLEN of ICReq/ICResp"));
            }
            hlen..hlen
        }
        PduType::H2cTermReq | PduType::C2hTermReq => {
            if plen > hlen + MAX_TERM_DATA {
                return Err(invalid(4, "PLEN of a termination request"));
            }
            hlen..plen
        }
        PduType::CapsuleResp | PduType::R2t => {
            if pdo != 0 {
                return Err(invalid(3, "PDO of a PDU without data"));
            }
            if plen != head_end {
                return Err(invalid(4, "PLEN of a PDU without data"));
            }
            head_end..head_end
        }
        PduType::CapsuleCmd | PduType::H2cData | PduType::C2hData => {
            if pdo == 0 {
                if ty != PduType::CapsuleCmd {
                    return Err(invalid(3, "PDO of a data PDU"));
                }
                if plen != head_end || ddf {
                    return Err(invalid(4, "PLEN of a capsule without data"));
                }
                head_end..head_end
            } else {
                if pdo < head_end || !pdo.is_multiple_of(4) {
                    return Err(invalid(3, "PDO"));
                }
                if plen < pdo + dd {
                    return Err(invalid(4, "PLEN shorter than PDO"));
                }
                let len = plen - pdo - dd;
                if len > framing.max_data as usize {
                    return Err(PduError::DataLimitExceeded {
                        len: u32::try_from(len).unwrap_or(u32::MAX),
                        limit: framing.max_data,
                    });
                }
                if ddf != (framing.data_digest && len > 0) {
                    return Err(invalid(1, "DDGSTF"));
                }
                pdo..pdo + len
            }
        }
    };
    let Some(h) = buf.get(..head_end) else {
        return Ok(None);
    };
    if hd {
        let received = u32_at(h, hlen);
        let computed = crc32c(&h[..hlen]);
        if received != computed {
            return Err(PduError::HeaderDigest { received, computed });
        }
    }
    let pdu = parse_specific(ty, flags, h, data.len())?;
    Ok(Some(Head {
        pdu,
        data_digest: ddf.then_some(data.end),
        data,
        len: plen,
    }))
}

/// Decodes the PDU at the front of `buf`: `Ok(None)` until all of it has
/// arrived, then the PDU, where its data lies in `buf` and how many bytes
/// it took.
pub fn decode(buf: &[u8], framing: &Framing) -> Result<Option<Decoded>, PduError> {
    let Some(head) = decode_head(buf, framing)? else {
        return Ok(None);
    };
    let Some(whole) = buf.get(..head.len) else {
        return Ok(None);
    };
    let data_digest_ok = match head.data_digest {
        Some(at) => u32_at(whole, at) == crc32c(&whole[head.data.clone()]),
        None => true,
    };
    Ok(Some(Decoded {
        pdu: head.pdu,
        data: head.data,
        len: head.len,
        data_digest_ok,
    }))
}

/// The PDU-specific header fields; `h` holds at least HLEN bytes.
fn parse_specific(ty: PduType, flags: u8, h: &[u8], data_len: usize) -> Result<Pdu, PduError> {
    Ok(match ty {
        PduType::IcReq | PduType::IcResp => {
            let pfv = u16_at(h, 8);
            if pfv != 0 {
                return Err(PduError::UnsupportedParameter {
                    offset: 8,
                    what: "PFV",
                });
            }
            let pda = h[10];
            if pda > 31 {
                return Err(invalid(10, "PDA above 31"));
            }
            let header_digest = h[11] & DGST_HEADER != 0;
            let data_digest = h[11] & DGST_DATA != 0;
            let v = u32_at(h, 12);
            if ty == PduType::IcReq {
                Pdu::IcReq(IcReq {
                    pfv,
                    hpda: pda,
                    header_digest,
                    data_digest,
                    maxr2t: v,
                })
            } else {
                if v < 4096 || !v.is_multiple_of(4) {
                    return Err(invalid(12, "MAXH2CDATA"));
                }
                Pdu::IcResp(IcResp {
                    pfv,
                    cpda: pda,
                    header_digest,
                    data_digest,
                    maxh2cdata: v,
                })
            }
        }
        PduType::H2cTermReq | PduType::C2hTermReq => {
            let t = TermReq {
                fes: u16_at(h, 8),
                fei: u32_at(h, 10),
            };
            if ty == PduType::H2cTermReq {
                Pdu::H2cTermReq(t)
            } else {
                Pdu::C2hTermReq(t)
            }
        }
        PduType::CapsuleCmd => {
            let mut sqe = Sqe::default();
            sqe.0.copy_from_slice(&h[8..72]);
            Pdu::CapsuleCmd(sqe)
        }
        PduType::CapsuleResp => {
            let mut b = [0u8; 16];
            b.copy_from_slice(&h[8..24]);
            Pdu::CapsuleResp(Cqe::parse(&b).ok_or(invalid(22, "reserved status code type"))?)
        }
        PduType::H2cData | PduType::C2hData => {
            if data_len == 0 {
                return Err(invalid(16, "DATAL of zero"));
            }
            if u32_at(h, 16) as usize != data_len {
                return Err(invalid(16, "DATAL differs from the data length"));
            }
            let (cccid, datao, last) = (u16_at(h, 8), u32_at(h, 12), flags & FLAG_LAST_PDU != 0);
            if ty == PduType::H2cData {
                Pdu::H2cData(H2cData {
                    cccid,
                    ttag: u16_at(h, 10),
                    datao,
                    last,
                })
            } else {
                let success = flags & FLAG_SUCCESS != 0;
                if success && !last {
                    return Err(invalid(1, "SUCCESS without LAST_PDU"));
                }
                Pdu::C2hData(C2hData {
                    cccid,
                    datao,
                    last,
                    success,
                })
            }
        }
        PduType::R2t => Pdu::R2t(R2t {
            cccid: u16_at(h, 8),
            ttag: u16_at(h, 10),
            r2to: u32_at(h, 12),
            r2tl: u32_at(h, 16),
        }),
    })
}

impl Pdu {
    /// Appends to `out` everything of this PDU that comes before `data`
    /// (header, header digest, padding) and returns the data digest to
    /// send right after `data`, if data digests are on. `data` itself is
    /// not copied: the caller sends it between the two.
    pub fn encode_head(
        &self,
        data: &[u8],
        framing: &Framing,
        out: &mut Vec<u8>,
    ) -> Result<Option<[u8; 4]>, EncodeError> {
        let ty = self.pdu_type();
        let hlen = ty.header_len();
        let term = matches!(ty, PduType::H2cTermReq | PduType::C2hTermReq);
        if !data.is_empty() && !ty.has_data() && !term {
            return Err(EncodeError::NoDataAllowed(ty));
        }
        if data.is_empty() && matches!(ty, PduType::H2cData | PduType::C2hData) {
            return Err(EncodeError::DataRequired(ty));
        }
        if term && data.len() > MAX_TERM_DATA {
            return Err(EncodeError::TooLong {
                ty,
                len: data.len(),
            });
        }
        let hd = ty.digestible() && framing.header_digest;
        let dd = ty.has_data() && framing.data_digest && !data.is_empty();
        let head_end = hlen + if hd { DIGEST_LEN } else { 0 };
        let pdo = if data.is_empty() || term {
            0
        } else {
            let align = (usize::from(framing.pda.min(31)) + 1) * 4;
            head_end.div_ceil(align) * align
        };
        let data_at = if pdo == 0 { head_end } else { pdo };
        let plen = data_at + data.len() + if dd { DIGEST_LEN } else { 0 };
        let plen = u32::try_from(plen).map_err(|_| EncodeError::TooLong {
            ty,
            len: data.len(),
        })?;
        let mut flags = 0;
        if hd {
            flags |= FLAG_HDGSTF;
        }
        if dd {
            flags |= FLAG_DDGSTF;
        }
        match self {
            Pdu::H2cData(d) if d.last => flags |= FLAG_LAST_PDU,
            Pdu::C2hData(d) => {
                if d.last || d.success {
                    flags |= FLAG_LAST_PDU;
                }
                if d.success {
                    flags |= FLAG_SUCCESS;
                }
            }
            _ => {}
        }
        let start = out.len();
        out.extend_from_slice(&[ty as u8, flags, hlen as u8, pdo as u8]);
        out.extend_from_slice(&plen.to_le_bytes());
        self.write_specific(data.len() as u32, out);
        out.resize(start + hlen, 0);
        if hd {
            let digest = crc32c(&out[start..start + hlen]);
            out.extend_from_slice(&digest.to_le_bytes());
        }
        out.resize(start + data_at, 0);
        Ok(dd.then(|| crc32c(data).to_le_bytes()))
    }

    /// Appends the whole PDU, `data` included, to `out`.
    pub fn encode(
        &self,
        data: &[u8],
        framing: &Framing,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        let digest = self.encode_head(data, framing, out)?;
        out.extend_from_slice(data);
        if let Some(d) = digest {
            out.extend_from_slice(&d);
        }
        Ok(())
    }

    /// Writes the PDU-specific header bytes (after the common header).
    fn write_specific(&self, data_len: u32, out: &mut Vec<u8>) {
        let digest_bits =
            |h: bool, d: bool| (u8::from(h) * DGST_HEADER) | (u8::from(d) * DGST_DATA);
        match self {
            Pdu::IcReq(r) => {
                out.extend_from_slice(&r.pfv.to_le_bytes());
                out.push(r.hpda);
                out.push(digest_bits(r.header_digest, r.data_digest));
                out.extend_from_slice(&r.maxr2t.to_le_bytes());
            }
            Pdu::IcResp(r) => {
                out.extend_from_slice(&r.pfv.to_le_bytes());
                out.push(r.cpda);
                out.push(digest_bits(r.header_digest, r.data_digest));
                out.extend_from_slice(&r.maxh2cdata.to_le_bytes());
            }
            Pdu::H2cTermReq(t) | Pdu::C2hTermReq(t) => {
                out.extend_from_slice(&t.fes.to_le_bytes());
                out.extend_from_slice(&t.fei.to_le_bytes());
            }
            Pdu::CapsuleCmd(sqe) => out.extend_from_slice(&sqe.0),
            Pdu::CapsuleResp(cqe) => out.extend_from_slice(&cqe.encode()),
            Pdu::H2cData(d) => {
                out.extend_from_slice(&d.cccid.to_le_bytes());
                out.extend_from_slice(&d.ttag.to_le_bytes());
                out.extend_from_slice(&d.datao.to_le_bytes());
                out.extend_from_slice(&data_len.to_le_bytes());
            }
            Pdu::C2hData(d) => {
                out.extend_from_slice(&d.cccid.to_le_bytes());
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&d.datao.to_le_bytes());
                out.extend_from_slice(&data_len.to_le_bytes());
            }
            Pdu::R2t(r) => {
                out.extend_from_slice(&r.cccid.to_le_bytes());
                out.extend_from_slice(&r.ttag.to_le_bytes());
                out.extend_from_slice(&r.r2to.to_le_bytes());
                out.extend_from_slice(&r.r2tl.to_le_bytes());
            }
        }
    }
}
