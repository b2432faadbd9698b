use super::*;
use crate::sqe::Sgl;
use crate::status::Status;

const MAX: u32 = 1 << 20;

fn framings() -> Vec<Framing> {
    let mut v = Vec::new();
    for header_digest in [false, true] {
        for data_digest in [false, true] {
            for pda in [0, 3] {
                v.push(Framing {
                    header_digest,
                    data_digest,
                    pda,
                    max_data: MAX,
                });
            }
        }
    }
    v
}

fn samples() -> Vec<(Pdu, Vec<u8>)> {
    let mut sqe = crate::sqe::Sqe::new(0x01, 0x42);
    sqe.set_nsid(1);
    sqe.set_sgl(Sgl::InCapsule { offset: 0, len: 9 });
    let mut cqe = crate::cqe::Cqe::new(0x42, Status::INVALID_FIELD);
    cqe.sqhd = 5;
    vec![
        (
            Pdu::IcReq(IcReq {
                pfv: 0,
                hpda: 2,
                header_digest: true,
                data_digest: false,
                maxr2t: 3,
            }),
            vec![],
        ),
        (
            Pdu::IcResp(IcResp {
                pfv: 0,
                cpda: 0,
                header_digest: false,
                data_digest: true,
                maxh2cdata: 131072,
            }),
            vec![],
        ),
        (Pdu::H2cTermReq(TermReq { fes: 2, fei: 0 }), vec![7; 24]),
        (Pdu::C2hTermReq(TermReq { fes: 1, fei: 2 }), vec![]),
        (Pdu::CapsuleCmd(sqe), b"in-capsule".to_vec()),
        (Pdu::CapsuleCmd(crate::sqe::Sqe::new(0x18, 1)), vec![]),
        (Pdu::CapsuleResp(cqe), vec![]),
        (
            Pdu::H2cData(H2cData {
                cccid: 0x42,
                ttag: 7,
                datao: 4096,
                last: true,
            }),
            vec![0xAB; 1000],
        ),
        (
            Pdu::C2hData(C2hData {
                cccid: 0x42,
                datao: 0,
                last: true,
                success: true,
            }),
            vec![1, 2, 3],
        ),
        (
            Pdu::C2hData(C2hData {
                cccid: 0x43,
                datao: 512,
                last: false,
                success: false,
            }),
            vec![9; 512],
        ),
        (
            Pdu::R2t(R2t {
                cccid: 3,
                ttag: 4,
                r2to: 8192,
                r2tl: 65536,
            }),
            vec![],
        ),
    ]
}

#[test]
fn round_trip_every_type_every_framing() {
    for f in framings() {
        for (pdu, data) in samples() {
            let mut buf = vec![0xEE; 3]; // decoding starts after a prefix
            pdu.encode(&data, &f, &mut buf).unwrap();
            let d = decode(&buf[3..], &f).unwrap().expect("whole PDU");
            assert_eq!(d.pdu, pdu, "{f:?}");
            assert_eq!(d.len, buf.len() - 3);
            assert_eq!(&buf[3..][d.data.clone()], &data[..]);
            assert!(d.data_digest_ok);
            // Data at the negotiated alignment.
            if pdu.pdu_type().has_data() && !data.is_empty() {
                assert_eq!(d.data.start % ((usize::from(f.pda) + 1) * 4), 0);
            }
        }
    }
}

#[test]
fn known_bytes_of_an_r2t_and_icresp() {
    let mut b = Vec::new();
    let r2t = Pdu::R2t(R2t {
        cccid: 0x0102,
        ttag: 0x0304,
        r2to: 0x10,
        r2tl: 0x2000,
    });
    r2t.encode(&[], &Framing::plain(0), &mut b).unwrap();
    assert_eq!(
        b,
        [9, 0, 24, 0, 24, 0, 0, 0, 2, 1, 4, 3, 0x10, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0]
    );
    b.clear();
    let icresp = Pdu::IcResp(IcResp {
        pfv: 0,
        cpda: 0,
        header_digest: true,
        data_digest: true,
        maxh2cdata: 0x8000,
    });
    icresp.encode(&[], &Framing::plain(0), &mut b).unwrap();
    assert_eq!(b.len(), 128);
    assert_eq!(&b[..12], &[1, 0, 128, 0, 128, 0, 0, 0, 0, 0, 0, 3]);
    assert_eq!(&b[12..16], &0x8000u32.to_le_bytes());
}

#[test]
fn truncated_input_waits() {
    for f in framings() {
        for (pdu, data) in samples() {
            let mut buf = Vec::new();
            pdu.encode(&data, &f, &mut buf).unwrap();
            for cut in 0..buf.len() {
                assert_eq!(decode(&buf[..cut], &f), Ok(None), "{pdu:?} cut at {cut}");
            }
        }
    }
}

#[test]
fn header_digest_error() {
    let f = Framing {
        header_digest: true,
        ..Framing::plain(MAX)
    };
    let (pdu, data) = samples().swap_remove(4);
    let mut buf = Vec::new();
    pdu.encode(&data, &f, &mut buf).unwrap();
    buf[10] ^= 0x40; // inside the SQE
    let err = decode(&buf, &f).unwrap_err();
    assert!(matches!(err, PduError::HeaderDigest { .. }), "{err:?}");
    assert_eq!(err.fatal_status().fes, FatalErrorStatus::HeaderDigestError);
}

#[test]
fn data_digest_error_is_reported_not_fatal() {
    let f = Framing {
        data_digest: true,
        ..Framing::plain(MAX)
    };
    let (pdu, data) = samples().swap_remove(7);
    let mut buf = Vec::new();
    pdu.encode(&data, &f, &mut buf).unwrap();
    let at = buf.len() - 10;
    buf[at] ^= 1;
    let d = decode(&buf, &f).unwrap().unwrap();
    assert!(!d.data_digest_ok);
}

#[test]
fn digest_flags_must_match_negotiation() {
    let with = Framing {
        header_digest: true,
        ..Framing::plain(MAX)
    };
    let (pdu, data) = samples().swap_remove(6);
    let mut buf = Vec::new();
    pdu.encode(&data, &with, &mut buf).unwrap();
    let err = decode(&buf, &Framing::plain(MAX)).unwrap_err();
    assert_eq!(
        err.fatal_status(),
        FatalStatus {
            fes: FatalErrorStatus::InvalidHeaderField,
            fei: 1
        }
    );
    buf.clear();
    pdu.encode(&data, &Framing::plain(MAX), &mut buf).unwrap();
    assert!(decode(&buf, &with).is_err());
}

#[test]
fn bad_header_fields() {
    let f = Framing::plain(MAX);
    let (pdu, data) = samples().swap_remove(7);
    let mut good = Vec::new();
    pdu.encode(&data, &f, &mut good).unwrap();
    let fei = |b: &[u8]| decode(b, &f).unwrap_err().fatal_status();
    let mut b = good.clone();
    b[0] = 0x08;
    assert_eq!(fei(&b).fei, 0);
    let mut b = good.clone();
    b[2] = 72;
    assert_eq!(fei(&b).fei, 2);
    let mut b = good.clone();
    b[3] = 26; // not dword aligned
    assert_eq!(fei(&b).fei, 3);
    let mut b = good.clone();
    b[3] = 0;
    assert_eq!(fei(&b).fei, 3);
    let mut b = good.clone();
    b[4..8].copy_from_slice(&20u32.to_le_bytes());
    assert_eq!(fei(&b).fei, 4);
    let mut b = good.clone();
    b[16..20].copy_from_slice(&999u32.to_le_bytes());
    assert_eq!(fei(&b).fei, 16);
    assert_eq!(fei(&b).fes, FatalErrorStatus::InvalidHeaderField);
}

#[test]
fn data_limit_is_checked_before_the_data_arrives() {
    let f = Framing::plain(512);
    let (pdu, data) = samples().swap_remove(7); // 1000 bytes
    let mut buf = Vec::new();
    pdu.encode(&data, &f, &mut buf).unwrap();
    let err = decode(&buf[..24], &f).unwrap_err();
    assert_eq!(
        err,
        PduError::DataLimitExceeded {
            len: 1000,
            limit: 512
        }
    );
    assert_eq!(err.fatal_status().fes, FatalErrorStatus::DataLimitExceeded);
    // A huge PLEN is refused from the first 8 bytes.
    let mut huge = buf[..8].to_vec();
    huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        decode(&huge, &f),
        Err(PduError::DataLimitExceeded { .. })
    ));
}

#[test]
fn unsupported_version_and_bad_maxh2cdata() {
    let f = Framing::plain(0);
    let (pdu, _) = samples().swap_remove(0);
    let mut b = Vec::new();
    pdu.encode(&[], &f, &mut b).unwrap();
    b[8] = 1;
    let s = decode(&b, &f).unwrap_err().fatal_status();
    assert_eq!((s.fes, s.fei), (FatalErrorStatus::UnsupportedParameter, 8));
    let (pdu, _) = samples().swap_remove(1);
    let mut b = Vec::new();
    pdu.encode(&[], &f, &mut b).unwrap();
    b[12..16].copy_from_slice(&1024u32.to_le_bytes());
    assert_eq!(decode(&b, &f).unwrap_err().fatal_status().fei, 12);
}

#[test]
fn encode_refuses_impossible_pdus() {
    let f = Framing::plain(0);
    let (r2t, _) = samples().swap_remove(10);
    assert_eq!(
        r2t.encode(&[1], &f, &mut Vec::new()),
        Err(EncodeError::NoDataAllowed(PduType::R2t))
    );
    let data_pdu = Pdu::H2cData(H2cData {
        cccid: 1,
        ttag: 1,
        datao: 0,
        last: true,
    });
    assert_eq!(
        data_pdu.encode(&[], &f, &mut Vec::new()),
        Err(EncodeError::DataRequired(PduType::H2cData))
    );
    let term = Pdu::C2hTermReq(TermReq { fes: 1, fei: 0 });
    assert!(matches!(
        term.encode(&[0; 129], &f, &mut Vec::new()),
        Err(EncodeError::TooLong { .. })
    ));
}

#[test]
fn head_decodes_before_the_data() {
    let f = Framing {
        header_digest: true,
        data_digest: true,
        pda: 7,
        max_data: MAX,
    };
    let (pdu, data) = samples().swap_remove(7);
    let mut buf = Vec::new();
    let trailer = pdu.encode_head(&data, &f, &mut buf).unwrap();
    let head = decode_head(&buf, &f).unwrap().expect("head");
    assert_eq!(head.pdu, pdu);
    assert_eq!(head.data.start, buf.len());
    assert_eq!(head.data.len(), data.len());
    assert_eq!(head.data_digest, Some(head.data.end));
    assert_eq!(trailer, Some(crate::digest::crc32c(&data).to_le_bytes()));
    assert_eq!(head.data.start, 32); // 24 + 4 rounded to 32
}

/// The fuzz seeds (fuzz/seeds/nvme_pdu/) are PDUs this encoder writes;
/// this test keeps them so. `NVME_WRITE_SEEDS=1` writes them again.
#[test]
fn fuzz_seeds_are_current() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/nvme_pdu");
    let plain = Framing::plain(MAX);
    let digests = Framing {
        header_digest: true,
        data_digest: true,
        pda: 0,
        max_data: MAX,
    };
    let names = [
        "icreq",
        "icresp",
        "h2c_term",
        "c2h_term",
        "capsule_icd",
        "capsule",
        "resp",
        "h2c_data",
        "c2h_data_success",
        "c2h_data",
        "r2t",
    ];
    let write = std::env::var_os("NVME_WRITE_SEEDS").is_some();
    for ((pdu, data), name) in samples().into_iter().zip(names) {
        for (f, suffix) in [(plain, ""), (digests, "_digests")] {
            if !pdu.pdu_type().digestible() && !suffix.is_empty() {
                continue;
            }
            let mut b = Vec::new();
            pdu.encode(&data, &f, &mut b).unwrap();
            let path = dir.join(format!("{name}{suffix}"));
            if write {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &b).unwrap();
            }
            let seed = std::fs::read(&path).unwrap_or_default();
            assert_eq!(seed, b, "{} is stale", path.display());
        }
    }
}
