//! Malformed input over real TCP connections: each gets the answer RFC 7143
//! gives (Login reject, Reject, or a closed connection), never a crash, and
//! a good session on the same server keeps working throughout.

mod raw;

use std::sync::Arc;
use std::time::Duration;

use ethersan_proto::pdu::{self, Bhs, LoginRequest, NopOut, Pdu, RESERVED_TAG};
use ethersan_proto::text::encode_text;
use raw::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[tokio::test]
async fn non_login_pdu_before_login_is_rejected() {
    let (addr, _h, _stop) = start().await;
    let good = good_session(&addr).await;
    let mut sock = TcpStream::connect(&addr).await.unwrap();
    let nop = NopOut {
        immediate: true,
        lun: 0,
        itt: 5,
        ttt: RESERVED_TAG,
        cmd_sn: 1,
        exp_stat_sn: 0,
    };
    sock.write_all(&Pdu::NopOut(nop).encode(0).0).await.unwrap();
    let (bhs, _) = read_pdu(&mut sock).await.expect("a login reject");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::LoginResponse(r) => assert_eq!((r.status_class, r.status_detail), (2, 0x0b)),
        other => panic!("expected a Login reject, got {other:?}"),
    }
    expect_closed(&mut sock).await;
    io_still_works(&good).await;
}

#[tokio::test]
async fn garbage_and_truncated_pdus_close_only_that_connection() {
    let (addr, _h, _stop) = start().await;
    let good = good_session(&addr).await;
    for junk in [
        vec![0xffu8; 4096],
        vec![0x03, 0x87, 0, 0],
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
    ] {
        let mut sock = TcpStream::connect(&addr).await.unwrap();
        sock.write_all(&junk).await.unwrap();
        sock.shutdown().await.unwrap();
        expect_closed(&mut sock).await;
    }
    // A login PDU claiming a 16 MiB data segment, then silence.
    let mut sock = TcpStream::connect(&addr).await.unwrap();
    let mut b = Bhs::default();
    b.0[0] = 0x43;
    b.set_data_len(pdu::MAX_DATA_SEGMENT);
    sock.write_all(&b.0).await.unwrap();
    sock.write_all(&[0u8; 1000]).await.unwrap();
    sock.shutdown().await.unwrap();
    expect_closed(&mut sock).await;
    io_still_works(&good).await;
}

#[tokio::test]
async fn unknown_opcode_and_oversized_segment_get_reject() {
    let (addr, _h, _stop) = start().await;
    let good = good_session(&addr).await;
    let mut sock = raw_login(&addr).await;
    // Unknown opcode 0x1c: Reject, reason "command not supported".
    let mut b = Bhs::default();
    b.0[0] = 0x1c;
    b.0[1] = 0x80;
    b.put_u32(16, 9);
    sock.write_all(&b.0).await.unwrap();
    let (bhs, data) = read_pdu(&mut sock).await.expect("a Reject");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::Reject(r) => assert_eq!(r.reason, pdu::reject_reason::COMMAND_NOT_SUPPORTED),
        other => panic!("expected Reject, got {other:?}"),
    }
    assert_eq!(&data[..48], &b.0[..], "Reject carries the offending header");
    // A NOP-Out whose data segment exceeds our MaxRecvDataSegmentLength (8192).
    let nop = NopOut {
        immediate: true,
        lun: 0,
        itt: 10,
        ttt: RESERVED_TAG,
        cmd_sn: 1,
        exp_stat_sn: 0,
    };
    let big = vec![7u8; 16384];
    send_pdu(&mut sock, &Pdu::NopOut(nop), &big).await;
    let (bhs, _) = read_pdu(&mut sock).await.expect("a Reject");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::Reject(r) => assert_eq!(r.reason, pdu::reject_reason::PROTOCOL_ERROR),
        other => panic!("expected Reject, got {other:?}"),
    }
    // The connection is still framed and alive: a normal ping is answered.
    let nop = NopOut {
        immediate: true,
        lun: 0,
        itt: 11,
        ttt: RESERVED_TAG,
        cmd_sn: 1,
        exp_stat_sn: 0,
    };
    send_pdu(&mut sock, &Pdu::NopOut(nop), b"ping").await;
    let (bhs, data) = read_pdu(&mut sock).await.expect("a NOP-In");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::NopIn(n) => assert_eq!(n.itt, 11),
        other => panic!("expected NOP-In, got {other:?}"),
    }
    assert_eq!(data, b"ping");
    io_still_works(&good).await;
}

#[tokio::test]
async fn invalid_login_keys_get_login_reject() {
    let (addr, _h, _stop) = start().await;
    // Missing InitiatorName on a normal session: 0x02/0x07 missing parameter.
    let mut sock = TcpStream::connect(&addr).await.unwrap();
    let keys = encode_text(&[("TargetName", IQN), ("SessionType", "Normal")]);
    let req = LoginRequest {
        transit: true,
        continue_bit: false,
        csg: 1,
        nsg: 3,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 8],
        tsih: 0,
        itt: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    };
    send_pdu(&mut sock, &Pdu::LoginRequest(req.clone()), &keys).await;
    let (bhs, _) = read_pdu(&mut sock).await.expect("login reject");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::LoginResponse(r) => assert_eq!((r.status_class, r.status_detail), (2, 7)),
        other => panic!("{other:?}"),
    }
    // Malformed key text (no '='): initiator error.
    let mut sock = TcpStream::connect(&addr).await.unwrap();
    let keys = b"InitiatorName\0".to_vec();
    send_pdu(&mut sock, &Pdu::LoginRequest(req.clone()), &keys).await;
    let (bhs, _) = read_pdu(&mut sock).await.expect("login reject");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::LoginResponse(r) => assert_eq!(r.status_class, 2),
        other => panic!("{other:?}"),
    }
    // An unsupported version range.
    let mut sock = TcpStream::connect(&addr).await.unwrap();
    let mut v = req.clone();
    v.version_min = 3;
    v.version_max = 3;
    sock.write_all(&Pdu::LoginRequest(v).encode(0).0)
        .await
        .unwrap();
    let (bhs, _) = read_pdu(&mut sock).await.expect("login reject");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::LoginResponse(r) => assert_eq!((r.status_class, r.status_detail), (2, 5)),
        other => panic!("{other:?}"),
    }
    // An empty Continue PDU: initiator error, not a crash.
    let mut sock = TcpStream::connect(&addr).await.unwrap();
    let mut c = req;
    c.continue_bit = true;
    c.transit = false;
    sock.write_all(&Pdu::LoginRequest(c).encode(0).0)
        .await
        .unwrap();
    let (bhs, _) = read_pdu(&mut sock).await.expect("login reject");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::LoginResponse(r) => assert_eq!(r.status_class, 2),
        other => panic!("{other:?}"),
    }
    let good = good_session(&addr).await;
    io_still_works(&good).await;
}

#[tokio::test]
async fn shutdown_ends_sessions_and_returns() {
    let (addr, h, stop) = start().await;
    let good = Arc::new(good_session(&addr).await);
    io_still_works(&good).await;
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), h)
        .await
        .expect("server did not stop")
        .unwrap();
    assert!(
        good.read16(0, 0, 1, 512).await.is_err(),
        "session survived shutdown"
    );
}

#[tokio::test]
async fn idle_connections_are_pinged_and_dead_ones_dropped() {
    let (addr, _h, _stop) = start_with("nop_interval_secs = 1\nnop_timeout_secs = 2").await;
    let good = good_session(&addr).await;
    let mut dead = raw_login(&addr).await;
    // The target pings the silent connection with a NOP-In that wants an answer...
    let (bhs, _) = read_pdu(&mut dead).await.expect("a NOP-In ping");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::NopIn(n) => {
            assert_eq!(n.itt, RESERVED_TAG);
            assert_ne!(n.ttt, RESERVED_TAG);
        }
        other => panic!("expected a NOP-In, got {other:?}"),
    }
    // ...and, unanswered, drops it.
    expect_closed(&mut dead).await;
    // The initiator library answers pings, so its idle session lives on.
    tokio::time::sleep(Duration::from_secs(4)).await;
    io_still_works(&good).await;
}

#[tokio::test]
async fn login_text_split_over_pdus_with_the_c_bit() {
    let (addr, _h, _stop) = start().await;
    let mut sock = TcpStream::connect(&addr).await.unwrap();
    let keys = encode_text(&[
        ("InitiatorName", "iqn.2026-11.org.ethersan:split"),
        ("TargetName", IQN),
        ("SessionType", "Normal"),
        ("ImmediateData", "Yes"),
    ]);
    let (a, b) = keys.split_at(20);
    let mut req = LoginRequest {
        transit: false,
        continue_bit: true,
        csg: 1,
        nsg: 0,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 9],
        tsih: 0,
        itt: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    };
    send_pdu(&mut sock, &Pdu::LoginRequest(req.clone()), a).await;
    // The target acknowledges the partial text with an empty response.
    let (bhs, data) = read_pdu(&mut sock).await.expect("empty login response");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::LoginResponse(r) => assert_eq!((r.status_class, r.transit), (0, false)),
        other => panic!("{other:?}"),
    }
    assert!(data.is_empty());
    req.continue_bit = false;
    req.transit = true;
    req.nsg = 3;
    send_pdu(&mut sock, &Pdu::LoginRequest(req), b).await;
    let (bhs, data) = read_pdu(&mut sock).await.expect("final login response");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::LoginResponse(r) => assert_eq!((r.status_class, r.transit, r.nsg), (0, true, 3)),
        other => panic!("{other:?}"),
    }
    let answers = ethersan_proto::text::parse_text(&data, &Default::default()).unwrap();
    assert!(
        answers
            .iter()
            .any(|(k, v)| k == "ImmediateData" && v == "Yes"),
        "{answers:?}"
    );
}

/// Send a Login Request with this text and C bit; return the answer.
async fn login_piece(
    sock: &mut TcpStream,
    text: &[u8],
    continue_bit: bool,
    transit: bool,
) -> Option<(pdu::LoginResponse, Vec<u8>)> {
    let req = LoginRequest {
        transit,
        continue_bit,
        csg: 1,
        nsg: if transit { 3 } else { 0 },
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 0x0b],
        tsih: 0,
        itt: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    };
    let mut out = Vec::new();
    pdu::write_pdu(
        &mut out,
        &Pdu::LoginRequest(req).encode(text.len() as u32),
        text,
        false,
        false,
    );
    sock.write_all(&out).await.ok()?;
    let (bhs, data) = read_pdu(sock).await?;
    match Pdu::decode(&bhs).unwrap() {
        Pdu::LoginResponse(r) => Some((r, data)),
        other => panic!("expected a login response, got {other:?}"),
    }
}

/// `n` bytes of valid key text: X- keys the target does not understand.
fn filler(n: usize, tag: char) -> Vec<u8> {
    let mut v = Vec::new();
    let mut i = 0;
    while v.len() + 300 < n {
        v.extend_from_slice(format!("X-ethersan-pad{tag}{i}={}\0", "p".repeat(250)).as_bytes());
        i += 1;
    }
    let key = format!("X-ethersan-pad{tag}{i}=");
    v.extend_from_slice(key.as_bytes());
    v.resize(n - 1, b'p');
    v.push(0);
    v
}

#[tokio::test]
async fn login_text_over_max_key_text_bytes_is_an_initiator_error() {
    let (addr, _h, _stop) = start_with("nop_interval_secs = 0\nmax_key_text_bytes = 16384").await;
    let good = good_session(&addr).await;
    let keys = encode_text(&[
        ("InitiatorName", "iqn.2026-11.org.ethersan:long"),
        ("TargetName", IQN),
        ("SessionType", "Normal"),
    ]);
    // Within the limit, over two PDUs: the login succeeds.
    let mut sock = TcpStream::connect(&addr).await.unwrap();
    let mut first = keys.clone();
    first.extend(filler(8000, 'a'));
    let (r, data) = login_piece(&mut sock, &first, true, false).await.unwrap();
    assert_eq!((r.status_class, r.transit), (0, false));
    assert!(data.is_empty());
    let (r, _) = login_piece(&mut sock, &filler(7000, 'b'), false, true)
        .await
        .unwrap();
    assert_eq!((r.status_class, r.transit, r.nsg), (0, true, 3), "{r:?}");
    drop(sock);
    // Three PDUs of 8000 bytes: 24000 > 16384, the third is refused with
    // "initiator error" (0x0200) and the connection closed.
    let mut sock = TcpStream::connect(&addr).await.unwrap();
    let (r, _) = login_piece(&mut sock, &first, true, false).await.unwrap();
    assert_eq!(r.status_class, 0);
    let (r, _) = login_piece(&mut sock, &filler(8000, 'c'), true, false)
        .await
        .unwrap();
    assert_eq!(r.status_class, 0, "16000 bytes are within the limit");
    let (r, _) = login_piece(&mut sock, &filler(8000, 'd'), true, false)
        .await
        .expect("a login reject");
    assert_eq!((r.status_class, r.status_detail), (0x02, 0x00), "{r:?}");
    expect_closed(&mut sock).await;
    io_still_works(&good).await;
}

#[tokio::test]
async fn text_request_over_max_key_text_bytes_gets_a_reject() {
    let (addr, _h, _stop) = start_with("nop_interval_secs = 0\nmax_key_text_bytes = 16384").await;
    let mut sock = raw_login(&addr).await;
    let text_pdu = |itt: u32, cmd_sn: u32, ttt: u32, c: bool, data: &[u8]| {
        let t = pdu::TextRequest {
            immediate: false,
            final_bit: !c,
            continue_bit: c,
            lun: 0,
            itt,
            ttt,
            cmd_sn,
            exp_stat_sn: 0,
        };
        let mut out = Vec::new();
        pdu::write_pdu(
            &mut out,
            &Pdu::TextRequest(t).encode(data.len() as u32),
            data,
            false,
            false,
        );
        out
    };
    // Pieces of 8000 bytes with the C bit: each within the limit is
    // acknowledged with an empty response carrying a TTT.
    let mut ttt = RESERVED_TAG;
    for (i, cmd_sn) in [1u32, 2].into_iter().enumerate() {
        sock.write_all(&text_pdu(20, cmd_sn, ttt, true, &filler(8000, 'e')))
            .await
            .unwrap();
        let (bhs, data) = read_pdu(&mut sock).await.expect("a text response");
        match Pdu::decode(&bhs).unwrap() {
            Pdu::TextResponse(r) => {
                assert!(
                    !r.final_bit && !r.continue_bit && data.is_empty(),
                    "{i}: {r:?}"
                );
                assert_ne!(r.ttt, RESERVED_TAG);
                ttt = r.ttt;
            }
            other => panic!("expected a Text Response, got {other:?}"),
        }
    }
    // The third would make 24000 bytes: Reject, "long operation reject".
    let piece = text_pdu(20, 3, ttt, true, &filler(8000, 'f'));
    sock.write_all(&piece).await.unwrap();
    let (bhs, data) = read_pdu(&mut sock).await.expect("a Reject");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::Reject(r) => assert_eq!(r.reason, pdu::reject_reason::LONG_OPERATION_REJECT),
        other => panic!("expected Reject, got {other:?}"),
    }
    assert_eq!(
        &data[..48],
        &piece[..48],
        "Reject carries the offending header"
    );
    // The session goes on: a new text request (split in two) is answered.
    let q = encode_text(&[("SendTargets", "All")]);
    sock.write_all(&text_pdu(21, 4, RESERVED_TAG, true, &q[..5]))
        .await
        .unwrap();
    let (bhs, _) = read_pdu(&mut sock).await.expect("a text response");
    let ttt = match Pdu::decode(&bhs).unwrap() {
        Pdu::TextResponse(r) => r.ttt,
        other => panic!("{other:?}"),
    };
    sock.write_all(&text_pdu(21, 5, ttt, false, &q[5..]))
        .await
        .unwrap();
    let (bhs, data) = read_pdu(&mut sock).await.expect("a text response");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::TextResponse(r) => assert!(r.final_bit),
        other => panic!("{other:?}"),
    }
    let answers = ethersan_proto::text::parse_text(&data, &Default::default()).unwrap();
    assert!(
        answers.iter().any(|(k, v)| k == "TargetName" && v == IQN),
        "{answers:?}"
    );
    // A piece that does not carry the TTT handed out for the request does
    // not continue it: it is a request of its own ("rgets=All" is no key).
    sock.write_all(&text_pdu(22, 6, RESERVED_TAG, true, &q[..5]))
        .await
        .unwrap();
    let (bhs, _) = read_pdu(&mut sock).await.expect("a text response");
    let ttt = match Pdu::decode(&bhs).unwrap() {
        Pdu::TextResponse(r) => r.ttt,
        other => panic!("{other:?}"),
    };
    sock.write_all(&text_pdu(22, 7, ttt.wrapping_add(1000), false, &q[5..]))
        .await
        .unwrap();
    let (bhs, data) = read_pdu(&mut sock).await.expect("a text response");
    assert!(matches!(Pdu::decode(&bhs).unwrap(), Pdu::TextResponse(_)));
    let answers = ethersan_proto::text::parse_text(&data, &Default::default()).unwrap();
    assert!(
        !answers.iter().any(|(k, _)| k == "TargetName")
            && answers.iter().any(|(_, v)| v == "NotUnderstood"),
        "a piece with a foreign TTT continued the request: {answers:?}"
    );
}
