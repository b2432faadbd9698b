//! Header and data digests (CRC32C) checked on the wire: a proxy between
//! the initiator and the target flips a bit in transit. A damaged data
//! segment is rejected and never reaches the medium; a damaged header drops
//! the connection (RFC 7143 §7.8); the server keeps serving.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Server, IQN};
use ethersan_initiator::{connect, LoginOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Where the proxy flips a bit: in the first SCSI Command PDU that carries
/// data, either its data segment or its header.
#[derive(Clone, Copy)]
enum Flip {
    Data,
    Header,
}

/// Forward one connection to `server`, parsing initiator-to-target PDUs
/// (digests on after login) and damaging one as `flip` says.
async fn proxy(listener: TcpListener, server: String, flip: Flip) {
    let (client, _) = listener.accept().await.unwrap();
    let upstream = TcpStream::connect(&server).await.unwrap();
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut ur, &mut cw).await;
    });
    let mut flipped = false;
    loop {
        let mut bhs = [0u8; 48];
        if cr.read_exact(&mut bhs).await.is_err() {
            return;
        }
        let opcode = bhs[0] & 0x3f;
        let digests = opcode != 0x03; // login PDUs carry none
        let ahs = usize::from(bhs[4]) * 4;
        let dlen = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
        let rest = ahs
            + if digests { 4 } else { 0 }
            + dlen.next_multiple_of(4)
            + if digests && dlen > 0 { 4 } else { 0 };
        let mut body = vec![0u8; rest];
        if cr.read_exact(&mut body).await.is_err() {
            return;
        }
        if !flipped && opcode == 0x01 && dlen > 0 {
            flipped = true;
            match flip {
                Flip::Data => body[ahs + 4 + 100] ^= 0x01,
                Flip::Header => bhs[20] ^= 0x80, // inside the expected length
            }
        }
        if uw.write_all(&bhs).await.is_err() || uw.write_all(&body).await.is_err() {
            return;
        }
    }
}

async fn through_proxy(
    server: &Server,
    flip: Flip,
) -> Result<ethersan_initiator::CommandResult, String> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(proxy(listener, server.addr.clone(), flip));
    let opts = LoginOptions {
        target_name: Some(IQN.into()),
        header_digest: true,
        data_digest: true,
        ..Default::default()
    };
    let s = connect(&addr, &opts).await.map_err(|e| e.to_string())?;
    assert!(
        s.params().header_digest && s.params().data_digest,
        "digests were not negotiated"
    );
    s.clear_unit_attention(0).await.map_err(|e| e.to_string())?;
    let w = tokio::time::timeout(
        Duration::from_secs(5),
        s.write16(0, 0, Bytes::from(vec![0xd1u8; 4096]), 512, true),
    )
    .await;
    match w {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_pdus_are_caught_by_the_digests() {
    let server = Server::start(&["ram:8M"]);
    let direct = connect(
        &server.addr,
        &LoginOptions {
            target_name: Some(IQN.into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    direct.clear_unit_attention(0).await.unwrap();
    for flip in [Flip::Data, Flip::Header] {
        let r = through_proxy(&server, flip).await;
        match (flip, &r) {
            (Flip::Data, Err(e)) => assert!(e.contains("rejected"), "data digest error: {e}"),
            (Flip::Header, Err(e)) => assert!(
                e.contains("closed") || e.contains("i/o"),
                "header digest error: {e}"
            ),
            (_, Ok(resp)) => panic!("a damaged write completed with status {:#x}", resp.status),
        }
        // The damaged write never reached the medium; the server serves on.
        let back = direct.read16(0, 0, 8, 512).await.unwrap();
        assert!(
            back.status == 0 && back.data.iter().all(|b| *b == 0),
            "damaged data reached the medium"
        );
    }
    let data = Bytes::from(vec![0x42u8; 4096]);
    assert_eq!(
        direct
            .write16(0, 8, data.clone(), 512, false)
            .await
            .unwrap()
            .status,
        0
    );
    assert!(direct.read16(0, 8, 8, 512).await.unwrap().data == data[..]);
    let log = server.log.lock().unwrap().join("\n");
    assert!(
        log.contains("data digest error") && log.contains("header digest error"),
        "{log}"
    );
}
