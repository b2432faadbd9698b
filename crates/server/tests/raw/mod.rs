//! Shared helpers for the tests that talk to an in-process server over
//! TCP: start it, log in with the initiator library or with raw PDUs, send
//! raw commands and read raw answers.
#![allow(dead_code)]

use std::time::Duration;

use bytes::Bytes;
use ethersan_initiator::{connect, LoginOptions, Session};
use ethersan_proto::pdu::{self, Bhs, LoginRequest, Pdu};
use ethersan_proto::text::encode_text;
use ethersan_server::config::Config;
use ethersan_server::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const IQN: &str = "iqn.2026-11.org.ethersan:bad";

pub async fn start() -> (
    String,
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    start_with("nop_interval_secs = 0").await
}

pub async fn start_with(
    options: &str,
) -> (
    String,
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    start_with_lun(options, "ram:8M").await
}

pub async fn start_with_lun(
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

pub async fn good_session(addr: &str) -> Session {
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

pub async fn io_still_works(s: &Session) {
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

/// Write one PDU with `data` (no digests).
pub async fn send_pdu(sock: &mut TcpStream, pdu: &Pdu, data: &[u8]) {
    let mut out = Vec::new();
    pdu::write_pdu(&mut out, &pdu.encode(data.len() as u32), data, false, false);
    sock.write_all(&out).await.unwrap();
}

/// Read one PDU header (and skip its data) with a time limit; None on close.
pub async fn read_pdu(sock: &mut TcpStream) -> Option<(Bhs, Vec<u8>)> {
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

pub async fn expect_closed(sock: &mut TcpStream) {
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
pub async fn raw_login(addr: &str) -> TcpStream {
    raw_login_isid(addr, 7).await
}

/// [`raw_login`] with the ISID's last byte `isid`: a session of its own
/// (the same ISID reinstates the session that has it).
pub async fn raw_login_isid(addr: &str, isid: u8) -> TcpStream {
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
        isid: [0x80, 0, 0, 0, 0, isid],
        tsih: 0,
        itt: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    };
    send_pdu(&mut sock, &Pdu::LoginRequest(req), &keys).await;
    let (bhs, _) = read_pdu(&mut sock).await.expect("login response");
    match Pdu::decode(&bhs).unwrap() {
        Pdu::LoginResponse(r) => {
            assert_eq!((r.status_class, r.transit, r.nsg), (0, true, 3), "{r:?}");
        }
        other => panic!("expected a login response, got {other:?}"),
    }
    sock
}

/// Send one SIMPLE SCSI command over a raw session.
pub async fn raw_command(
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
pub async fn raw_command_attr(
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
    send_pdu(sock, &Pdu::ScsiCommand(cmd), data).await;
}

/// Read PDUs until the SCSI Response for `itt`; panics if one for
/// `never` arrives first. Returns its status.
pub async fn raw_response(sock: &mut TcpStream, itt: u32, never: Option<u32>) -> u8 {
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

/// The next PDU within `ms` milliseconds, if any.
pub async fn pdu_within(sock: &mut TcpStream, ms: u64) -> Option<Pdu> {
    let (bhs, _) = tokio::time::timeout(Duration::from_millis(ms), read_pdu(sock))
        .await
        .ok()??;
    Some(Pdu::decode(&bhs).unwrap())
}
