//! Malformed input over real TCP connections: each gets the answer RFC 7143
//! gives (Login reject, Reject, or a closed connection), never a crash, and
//! a good session on the same server keeps working throughout.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ethersan_initiator::{connect, LoginOptions, Session};
use ethersan_proto::pdu::{self, Bhs, LoginRequest, NopOut, Pdu, RESERVED_TAG};
use ethersan_proto::text::encode_text;
use ethersan_server::config::Config;
use ethersan_server::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IQN: &str = "iqn.2026-11.org.ethersan:bad";

async fn start() -> (
    String,
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    start_with("nop_interval_secs = 0").await
}

async fn start_with(
    options: &str,
) -> (
    String,
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    start_with_lun(options, "ram:8M").await
}

async fn start_with_lun(
    options: &str,
    lun: &str,
) -> (
    String,
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let text = format!(
        "portals = [\"127.0.0.1:0\"]\n[options]\n{options}\nmax_recv_data_segment_length = 8192\n[[target]]\nname = \"{IQN}\"\nlun = [\"{lun}\"]\n"
    );
    let srv = Server::bind(&Config::from_toml_str(&text, "test").unwrap())
        .await
        .unwrap();
    let addr = srv.local_addrs()[0].to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(async move {
        srv.run(async {
            let _ = rx.await;
        })
        .await
    });
    (addr, h, tx)
}

async fn good_session(addr: &str) -> Session {
    let s = connect(
        addr,
        &LoginOptions {
            target_name: Some(IQN.into()),
            ..LoginOptions::default()
        },
    )
    .await
    .unwrap();
    for _ in 0..3 {
        let r = s
            .command(0, &[0, 0, 0, 0, 0, 0], Bytes::new(), 0)
            .await
            .unwrap();
        if r.status == 0 {
            break;
        }
    }
    s
}

async fn io_still_works(s: &Session) {
    let data = Bytes::from(vec![0x5a; 4096]);
    assert_eq!(
        s.write16(0, 8, data.clone(), 512, false)
            .await
            .unwrap()
            .status,
        0
    );
    let r = s.read16(0, 8, 8, 512).await.unwrap();
    assert_eq!(r.status, 0);
    assert!(r.data == data[..]);
}

/// Read one PDU header (and skip its data) with a time limit; None on close.
async fn read_pdu(sock: &mut TcpStream) -> Option<(Bhs, Vec<u8>)> {
    let mut bhs = Bhs::default();
    let r = tokio::time::timeout(Duration::from_secs(5), sock.read_exact(&mut bhs.0))
        .await
        .expect("no answer within 5 s");
    r.ok()?;
    let l = bhs.layout(false, false);
    let mut rest = vec![0u8; l.ahs_len + l.data_len + l.pad_len];
    sock.read_exact(&mut rest).await.ok()?;
    Some((bhs, rest[l.ahs_len..l.ahs_len + l.data_len].to_vec()))
}

async fn expect_closed(sock: &mut TcpStream) {
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf))
            .await
            .expect("connection not closed")
        {
            Ok(0) | Err(_) => return,
            Ok(_) => continue,
        }
    }
}

/// Log in with one raw PDU (operational stage straight to full feature).
async fn raw_login(addr: &str) -> TcpStream {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let keys = encode_text(&[
        ("InitiatorName", "iqn.2026-11.org.ethersan:raw"),
        ("TargetName", IQN),
        ("SessionType", "Normal"),
        ("MaxRecvDataSegmentLength", "8192"),
    ]);
    let req = LoginRequest {
        transit: true,
        continue_bit: false,
        csg: 1,
        nsg: 3,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 7],
        tsih: 0,
        itt: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    };
    let mut out = Vec::new();
    pdu::write_pdu(
        &mut out,
        &Pdu::LoginRequest(req).encode(keys.len() as u32),
        &keys,
        false,
        false,
    );
    sock.write_all(&out).await.unwrap();
    let (bhs, _) = read_pdu(&mut sock).await.expect("login response");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::LoginResponse(r) => {
            assert_eq!((r.status_class, r.transit, r.nsg), (0, true, 3), "{r:?}");
        }
        other => panic!("expected a login response, got {other:?}"),
    }
    sock
}

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
    let mut out = Vec::new();
    pdu::write_pdu(
        &mut out,
        &Pdu::NopOut(nop).encode(big.len() as u32),
        &big,
        false,
        false,
    );
    sock.write_all(&out).await.unwrap();
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
    let mut out = Vec::new();
    pdu::write_pdu(&mut out, &Pdu::NopOut(nop).encode(4), b"ping", false, false);
    sock.write_all(&out).await.unwrap();
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
    let mut out = Vec::new();
    pdu::write_pdu(
        &mut out,
        &Pdu::LoginRequest(req.clone()).encode(keys.len() as u32),
        &keys,
        false,
        false,
    );
    sock.write_all(&out).await.unwrap();
    let (bhs, _) = read_pdu(&mut sock).await.expect("login reject");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::LoginResponse(r) => assert_eq!((r.status_class, r.status_detail), (2, 7)),
        other => panic!("{other:?}"),
    }
    // Malformed key text (no '='): initiator error.
    let mut sock = TcpStream::connect(&addr).await.unwrap();
    let keys = b"InitiatorName\0".to_vec();
    let mut out = Vec::new();
    pdu::write_pdu(
        &mut out,
        &Pdu::LoginRequest(req.clone()).encode(keys.len() as u32),
        &keys,
        false,
        false,
    );
    sock.write_all(&out).await.unwrap();
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
    let mut out = Vec::new();
    pdu::write_pdu(
        &mut out,
        &Pdu::LoginRequest(req.clone()).encode(a.len() as u32),
        a,
        false,
        false,
    );
    sock.write_all(&out).await.unwrap();
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
    let mut out = Vec::new();
    pdu::write_pdu(
        &mut out,
        &Pdu::LoginRequest(req).encode(b.len() as u32),
        b,
        false,
        false,
    );
    sock.write_all(&out).await.unwrap();
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

/// Send one SIMPLE SCSI command over a raw session.
async fn raw_command(
    sock: &mut TcpStream,
    itt: u32,
    cmd_sn: u32,
    cdb: &[u8],
    data: &[u8],
    expected_len: u32,
    write: bool,
) {
    raw_command_attr(
        sock,
        itt,
        cmd_sn,
        cdb,
        data,
        expected_len,
        write,
        pdu::TaskAttr::Simple,
    )
    .await
}

/// Send one SCSI command with a task attribute over a raw session.
#[allow(clippy::too_many_arguments)]
async fn raw_command_attr(
    sock: &mut TcpStream,
    itt: u32,
    cmd_sn: u32,
    cdb: &[u8],
    data: &[u8],
    expected_len: u32,
    write: bool,
    attr: pdu::TaskAttr,
) {
    let mut cdb16 = [0u8; 16];
    cdb16[..cdb.len()].copy_from_slice(cdb);
    let cmd = pdu::ScsiCommand {
        immediate: false,
        final_bit: true,
        read: !write && expected_len > 0,
        write,
        attr,
        lun: pdu::lun_to_wire(0),
        itt,
        expected_len,
        cmd_sn,
        exp_stat_sn: 0,
        cdb: cdb16,
    };
    let mut out = Vec::new();
    pdu::write_pdu(
        &mut out,
        &Pdu::ScsiCommand(cmd).encode(data.len() as u32),
        data,
        false,
        false,
    );
    sock.write_all(&out).await.unwrap();
}

/// Read PDUs until the SCSI Response for `itt`; panics if one for
/// `never` arrives first. Returns its status.
async fn raw_response(sock: &mut TcpStream, itt: u32, never: Option<u32>) -> u8 {
    loop {
        let (bhs, _) = read_pdu(sock).await.expect("connection closed");
        if let Ok(Pdu::ScsiResponse(r)) = Pdu::decode(&bhs) {
            assert_ne!(Some(r.itt), never, "a response came for the aborted task");
            if r.itt == itt {
                return r.status;
            }
        }
    }
}

/// PERSISTENT RESERVE OUT with a 24-byte parameter list.
fn prout(sa: u8, kind: u8, key: u64, sa_key: u64) -> ([u8; 10], Vec<u8>) {
    let cdb = [0x5f, sa, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    (cdb, p)
}

#[tokio::test]
async fn preempt_and_abort_aborts_the_preempted_nexus_tasks() {
    let (addr, server, stop) = start().await;
    // B: a raw session that registers and leaves a WRITE waiting for its data.
    let mut b = raw_login(&addr).await;
    for (itt, sn) in [(2, 1), (3, 2)] {
        raw_command(&mut b, itt, sn, &[0; 6], &[], 0, false).await;
        raw_response(&mut b, itt, None).await;
    }
    let (cdb, p) = prout(0, 0, 0, 0xb);
    raw_command(&mut b, 4, 3, &cdb, &p, 24, true).await;
    assert_eq!(raw_response(&mut b, 4, None).await, 0, "B's REGISTER");
    let write10 = [0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0];
    raw_command(&mut b, 5, 4, &write10, &[], 4096, true).await;
    let ttt = loop {
        let (bhs, _) = read_pdu(&mut b).await.expect("R2T");
        if let Ok(Pdu::R2t(r)) = Pdu::decode(&bhs) {
            assert_eq!(r.itt, 5);
            break r.ttt;
        }
    };

    // A registers and preempts B's key with PREEMPT AND ABORT.
    let a = good_session(&addr).await;
    let (cdb, p) = prout(0, 0, 0, 0xa);
    assert_eq!(
        a.command(0, &cdb, Bytes::from(p), 0).await.unwrap().status,
        0
    );
    let (cdb, p) = prout(5, 1, 0xa, 0xb);
    assert_eq!(
        a.command(0, &cdb, Bytes::from(p), 0).await.unwrap().status,
        0,
        "PREEMPT AND ABORT"
    );

    // B's WRITE is gone: its data is not written and it never completes;
    // B's next command reports the preemption.
    let d = pdu::DataOut {
        final_bit: true,
        lun: pdu::lun_to_wire(0),
        itt: 5,
        ttt,
        exp_stat_sn: 0,
        data_sn: 0,
        buffer_offset: 0,
    };
    let mut out = Vec::new();
    pdu::write_pdu(
        &mut out,
        &Pdu::DataOut(d).encode(4096),
        &[0xee; 4096],
        false,
        false,
    );
    b.write_all(&out).await.unwrap();
    raw_command(&mut b, 6, 5, &[0; 6], &[], 0, false).await;
    assert_eq!(
        raw_response(&mut b, 6, Some(5)).await,
        2,
        "B's next command gets a unit attention"
    );
    let r = a.read16(0, 0, 8, 512).await.unwrap();
    assert!(
        r.status == 0 && r.data.iter().all(|x| *x == 0),
        "the aborted WRITE reached the medium"
    );
    // B's session still works.
    raw_command(&mut b, 7, 6, &[0; 6], &[], 0, false).await;
    raw_response(&mut b, 7, Some(5)).await;
    io_still_works(&a).await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
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

/// This process's resident set size, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_send_no_data_hold_no_memory_beyond_the_session_budget() {
    const BIG: u32 = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    let lun = format!("{}:128M", dir.path().join("lun.img").display());
    let (addr, h, stop) = start_with_lun("nop_interval_secs = 0", &lun).await;
    let before = rss();
    let mut sock = raw_login(&addr).await;
    // 128 WRITE(16)s of 64 MiB each (the whole CmdSN window), no data.
    let mut cdb = [0u8; 16];
    cdb[0] = 0x8a;
    cdb[10..14].copy_from_slice(&(BIG / 512).to_be_bytes());
    // The POWER ON unit attention goes to a TEST UNIT READY first.
    raw_command(&mut sock, 99, 1, &[0; 6], &[], 0, false).await;
    assert_eq!(raw_response(&mut sock, 99, None).await, 2);
    for i in 0..128u32 {
        raw_command(&mut sock, 100 + i, 2 + i, &cdb, &[], BIG, true).await;
    }
    // R2Ts go out only for the commands whose buffers fit the default
    // budget (128 MiB: two of them).
    let mut solicited = std::collections::BTreeMap::new();
    while let Some(pdu) = pdu_within(&mut sock, 1500).await {
        collect_r2t(pdu, &mut solicited);
    }
    assert_eq!(
        solicited.keys().copied().collect::<Vec<_>>(),
        vec![100, 101],
        "R2Ts beyond the memory budget"
    );
    let grown = rss().saturating_sub(before);
    // Stated bound: half the budget (buffers are reserved, not touched,
    // until their data arrives).
    assert!(grown < 64 << 20, "RSS grew by {} MiB", grown >> 20);
    // Other sessions keep working.
    let good = good_session(&addr).await;
    io_still_works(&good).await;
    // Feeding the two their data frees their buffers: the next waiting
    // commands are asked for theirs (each also holds its first burst).
    for itt in [100, 101] {
        let r2t = solicited.remove(&itt).unwrap();
        feed(&mut sock, r2t, &mut solicited).await;
    }
    while !solicited.contains_key(&103) {
        let pdu = pdu_within(&mut sock, 5000)
            .await
            .expect("R2Ts for the next commands");
        collect_r2t(pdu, &mut solicited);
    }
    assert_eq!(
        solicited.keys().copied().collect::<Vec<_>>(),
        vec![102, 103]
    );
    drop(sock);
    good.logout().await.unwrap();
    let _ = stop.send(());
    h.await.unwrap();
}

/// Keep the first R2T of each command; anything else is unexpected.
fn collect_r2t(pdu: Pdu, r2ts: &mut std::collections::BTreeMap<u32, pdu::R2t>) {
    match pdu {
        Pdu::R2t(r) => {
            r2ts.entry(r.itt).or_insert(r);
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// Send a write all the data its R2Ts ask for, until its response (which
/// must be ILLEGAL REQUEST: 64 MiB is over the unit's 16 MiB transfer
/// limit); R2Ts for other commands go into `others`.
async fn feed(
    sock: &mut TcpStream,
    mut r2t: pdu::R2t,
    others: &mut std::collections::BTreeMap<u32, pdu::R2t>,
) {
    let itt = r2t.itt;
    let chunk = vec![0xa5u8; 8192];
    loop {
        let mut off = 0;
        let mut data_sn = 0;
        let mut out = Vec::new();
        while off < r2t.desired_len {
            let len = (r2t.desired_len - off).min(8192);
            let d = pdu::DataOut {
                final_bit: off + len == r2t.desired_len,
                lun: pdu::lun_to_wire(0),
                itt,
                ttt: r2t.ttt,
                exp_stat_sn: 0,
                data_sn,
                buffer_offset: r2t.buffer_offset + off,
            };
            data_sn += 1;
            pdu::write_pdu(
                &mut out,
                &Pdu::DataOut(d).encode(len),
                &chunk[..len as usize],
                false,
                false,
            );
            off += len;
        }
        sock.write_all(&out).await.unwrap();
        // The next R2T for this command, or its response.
        loop {
            let (bhs, sense) = read_pdu(sock).await.expect("connection closed");
            match Pdu::decode(&bhs).unwrap() {
                Pdu::R2t(r) if r.itt == itt => {
                    r2t = r;
                    break;
                }
                Pdu::R2t(r) => {
                    others.entry(r.itt).or_insert(r);
                }
                Pdu::ScsiResponse(r) if r.itt == itt => {
                    // All 64 MiB taken, then refused by the unit: its
                    // largest transfer (VPD B0h) is 16 MiB.
                    assert_eq!(r.status, 2);
                    assert_eq!(
                        (sense[4] & 0x0f, sense[14], sense[15]),
                        (5, 0x24, 0),
                        "{sense:02x?}"
                    );
                    return;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

/// The next PDU within `ms` milliseconds, if any.
async fn pdu_within(sock: &mut TcpStream, ms: u64) -> Option<Pdu> {
    let (bhs, _) = tokio::time::timeout(Duration::from_millis(ms), read_pdu(sock))
        .await
        .ok()??;
    Some(Pdu::decode(&bhs).unwrap())
}

#[tokio::test]
async fn ordered_and_head_of_queue_tasks_keep_sam_order() {
    use pdu::TaskAttr::{HeadOfQueue, Ordered, Simple};
    let (addr, h, stop) = start().await;
    let mut sock = raw_login(&addr).await;
    raw_command(&mut sock, 1, 1, &[0; 6], &[], 0, false).await;
    assert_eq!(raw_response(&mut sock, 1, None).await, 2, "POWER ON first");
    // A: a SIMPLE write waiting for its data.
    let write10 = [0x2a, 0, 0, 0, 0, 9, 0, 0, 1, 0];
    raw_command(&mut sock, 10, 2, &write10, &[], 512, true).await;
    let r2t = match pdu_within(&mut sock, 5000).await {
        Some(Pdu::R2t(r)) if r.itt == 10 => r,
        other => panic!("expected an R2T for the write, got {other:?}"),
    };
    // B: ORDERED waits for A.
    raw_command_attr(&mut sock, 11, 3, &[0; 6], &[], 0, false, Ordered).await;
    // C: HEAD OF QUEUE runs at once, ahead of the ORDERED task.
    raw_command_attr(&mut sock, 12, 4, &[0; 6], &[], 0, false, HeadOfQueue).await;
    match pdu_within(&mut sock, 5000).await {
        Some(Pdu::ScsiResponse(r)) => assert_eq!((r.itt, r.status), (12, 0)),
        other => panic!("expected the HEAD OF QUEUE task's response, got {other:?}"),
    }
    // D: SIMPLE waits for the older ORDERED task.
    raw_command_attr(&mut sock, 13, 5, &[0; 6], &[], 0, false, Simple).await;
    assert!(
        pdu_within(&mut sock, 300).await.is_none(),
        "a task ran ahead of an older ORDERED task"
    );
    // A's data: A, then B, then D complete, in that order.
    let d = pdu::DataOut {
        final_bit: true,
        lun: pdu::lun_to_wire(0),
        itt: 10,
        ttt: r2t.ttt,
        exp_stat_sn: 0,
        data_sn: 0,
        buffer_offset: 0,
    };
    let mut out = Vec::new();
    pdu::write_pdu(
        &mut out,
        &Pdu::DataOut(d).encode(512),
        &[7u8; 512],
        false,
        false,
    );
    sock.write_all(&out).await.unwrap();
    let mut order = Vec::new();
    while order.len() < 3 {
        match pdu_within(&mut sock, 5000).await {
            Some(Pdu::ScsiResponse(r)) => {
                assert_eq!(r.status, 0, "task {}", r.itt);
                order.push(r.itt);
            }
            other => panic!("expected responses, got {other:?}"),
        }
    }
    assert_eq!(order, vec![10, 11, 13]);
    drop(sock);
    let _ = stop.send(());
    h.await.unwrap();
}
