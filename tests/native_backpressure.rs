//! Back-pressure on the native transport (issue 28): group members that
//! misbehave cannot make the target hold more than its budget, and do not
//! slow another session down.
//!
//! - A member that stops reading: it sends reads of 1 MiB each, a full
//!   command window of them, and never takes an answer.
//! - A member that floods unsolicited data: NOP-Out PDUs with 256 KiB of
//!   data each (the target reads and discards them: a ping nobody asked
//!   to be answered), sent as fast as the channel lets it, for seconds.
//!
//! Meanwhile a good client writes and reads back over its own channel,
//! and the target's resident memory is sampled: it must stay within
//! `RSS_BUDGET` of what it was before (the receive budget of each channel
//! plus the session budget the stopped reader's reads may hold, with room
//! for the allocator).

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use ethersan_channel::group::GroupKeys;
use ethersan_channel::Level;
use ethersan_endpoint::{Endpoint, EndpointConfig, Medium, MessageChannel, PeerAddr};
use ethersan_initiator::login::{LoggedIn, Login};
use ethersan_proto::negotiate::{InitiatorNegotiator, InitiatorSettings, SessionType};
use ethersan_proto::pdu::{
    Bhs, DataOut, Framer, MessagePdu, NopOut, Pdu, RawPdu, ScsiCommand, TaskAttr,
};

const GROUP: &str = "lab";
const SECRET: &str = "correct horse battery staple";
/// Most the target's resident memory may grow while the two misbehave.
const RSS_BUDGET_KIB: u64 = 160 * 1024;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn serve(dir: &Path, port: u16) -> Server {
    Server::start_udp(
        dir,
        port,
        (GROUP, SECRET),
        &["ram:96M,security=none".to_string()],
        &[],
    )
}

/// Digests off, the RFC's limits: the framing of every PDU here.
fn framer() -> Framer {
    Framer {
        header_digest: false,
        data_digest: false,
        max_recv_data_segment_length: 16 << 20,
    }
}

/// One PDU as one message.
fn encode(bhs: &Bhs, data: &[u8]) -> Bytes {
    let mut out = Vec::new();
    framer().encode_to(&mut out, bhs, &[], data);
    Bytes::from(out)
}

/// The PDU of a message (one per message); a Data-In whose data went
/// placed comes without it.
fn decode(msg: &[u8]) -> RawPdu {
    let f = framer();
    match f.split_message(msg).expect("one PDU per message") {
        MessagePdu::Whole(head, part) => f.finish(head, part.to_vec()).expect("pdu"),
        MessagePdu::Placed(head) => RawPdu {
            bhs: head.bhs,
            ahs: head.ahs,
            data: Vec::new(),
        },
    }
}

/// The next message on `rx`, within `limit` (`what` names the wait).
async fn next(rx: &mut ethersan_endpoint::MessageReceiver, limit: u64, what: &str) -> Bytes {
    tokio::time::timeout(Duration::from_secs(limit), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .expect("receive")
        .expect("channel open")
}

/// A channel to the target at level none, logged in to a normal session
/// with the login exchanged one PDU per message.
async fn logged_in(port: u16, name: &str) -> (Endpoint, MessageChannel, LoggedIn) {
    let keys = GroupKeys::derive(GROUP, SECRET.as_bytes()).unwrap();
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let ep = Endpoint::initiator(Medium::udp(sock, 9000).unwrap(), EndpointConfig::new(keys));
    let to = PeerAddr::Udp(format!("127.0.0.1:{port}").parse().unwrap());
    let stream = ep
        .connect(to, Level::None, Duration::from_secs(10))
        .await
        .expect("channel");
    let mut ch = stream.into_messages();
    let settings = InitiatorSettings {
        initiator_name: format!("iqn.2026-11.org.ethersan:{name}"),
        target_name: Some(IQN.into()),
        session_type: SessionType::Normal,
        ..InitiatorSettings::default()
    };
    let isid = [0x80, 0, 0, 0, 0, name.len() as u8];
    let mut login = Login::new(InitiatorNegotiator::new(settings), isid);
    loop {
        while let Some(t) = login.poll_transmit() {
            ch.sender
                .send(&[encode(&t.bhs, &t.data)])
                .await
                .expect("send login");
        }
        let msg = tokio::time::timeout(Duration::from_secs(10), ch.receiver.recv())
            .await
            .expect("a login response in time")
            .expect("receive")
            .expect("the target answers the login");
        if let Some(done) = login.handle(decode(&msg)).expect("login") {
            return (ep, ch, done);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_reader_and_an_unsolicited_flood_stay_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_udp_port();
    let server = serve(dir.path(), port);
    let pid = server.child.id();

    // The good client, once before the misbehaviour (warming the target).
    let url = ethersan_client::url::IscsiUrl::parse(&format!(
        "udp://127.0.0.1:{port}/{IQN}/0?security=none"
    ))
    .unwrap();
    let keys = GroupKeys::derive(GROUP, SECRET.as_bytes()).unwrap();
    let opts = ethersan_initiator::LoginOptions {
        initiator_name: "iqn.2026-11.org.ethersan:good".into(),
        target_name: Some(IQN.into()),
        timeout: Some(Duration::from_secs(20)),
        ..Default::default()
    };
    let (good, _) = ethersan_client::native::connect(&url, &keys, &opts)
        .await
        .expect("good client logs in");
    let _ = good.clear_unit_attention(0).await;
    let data = pattern(1 << 20, 5);
    for i in 0..8u64 {
        let r = good
            .write16(0, i * 2048, Bytes::from(data.clone()), 512, false)
            .await
            .unwrap();
        assert_eq!(r.status, 0, "{:?}", r.sense);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_kib(pid);

    // The stopped reader: a command window of 1 MiB reads, never read.
    let (_ep1, mut stopped, done) = logged_in(port, "stopped-reader").await;
    let mut cmd_sn = done.window.cmd_sn();
    let mut itt = 1u32;
    let read = |itt: u32, cmd_sn: u32| {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x88;
        cdb[2..10].copy_from_slice(&(u64::from(itt % 64) * 2048).to_be_bytes());
        cdb[10..14].copy_from_slice(&2048u32.to_be_bytes());
        let bhs = Pdu::ScsiCommand(ScsiCommand {
            immediate: false,
            final_bit: true,
            read: true,
            write: false,
            attr: TaskAttr::Simple,
            lun: 0,
            itt,
            expected_len: 1 << 20,
            cmd_sn,
            exp_stat_sn: done.exp_stat_sn,
            cdb,
        })
        .encode(0);
        encode(&bhs, &[])
    };
    // One read answered (the unit attention of a new nexus), to learn the
    // target's full command window.
    stopped
        .sender
        .send(&[read(itt, cmd_sn)])
        .await
        .expect("read sent");
    cmd_sn = cmd_sn.wrapping_add(1);
    itt += 1;
    let max = loop {
        let m = next(&mut stopped.receiver, 10, "the first read is answered").await;
        if let Ok(Pdu::ScsiResponse(r)) = Pdu::decode(&decode(&m).bhs) {
            break r.max_cmd_sn;
        }
    };
    // Then a window of 1 MiB reads (at most 64), and no more reading.
    let first_unanswered = itt;
    while cmd_sn != max.wrapping_add(1) && itt < first_unanswered + 64 {
        // Its data lands in a buffer registered for it (placed Data-In).
        stopped.sender.expect(itt, vec![0u8; 1 << 20]);
        stopped
            .sender
            .send(&[read(itt, cmd_sn)])
            .await
            .expect("read sent");
        cmd_sn = cmd_sn.wrapping_add(1);
        itt += 1;
    }
    let unanswered = itt - first_unanswered;
    assert!(unanswered >= 8, "a window of only {unanswered} reads");

    // The flood: 256 KiB NOP-Outs, immediate, answered by nobody.
    let (_ep2, mut flood, done2) = logged_in(port, "flood").await;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let flooding = {
        let (stop, sent) = (stop.clone(), sent.clone());
        let payload = Bytes::from(vec![0x5au8; 256 << 10]);
        tokio::spawn(async move {
            let cmd_sn = done2.window.cmd_sn();
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                n = n.wrapping_add(1);
                // Pings nobody answers, and data for transfers the target
                // never asked for (no such task, no R2T).
                let pdu = if n.is_multiple_of(2) {
                    Pdu::NopOut(NopOut {
                        immediate: true,
                        lun: 0,
                        itt: 0xffff_ffff,
                        ttt: 0xffff_ffff,
                        cmd_sn,
                        exp_stat_sn: done2.exp_stat_sn,
                    })
                } else {
                    Pdu::DataOut(DataOut {
                        final_bit: true,
                        lun: 0,
                        itt: 0x4000_0000 | n,
                        ttt: 0x1000 + n,
                        exp_stat_sn: done2.exp_stat_sn,
                        data_sn: 0,
                        buffer_offset: 0,
                    })
                };
                let bhs = pdu.encode(payload.len() as u32);
                let mut framed = Vec::with_capacity(48 + payload.len());
                framer().encode_to(&mut framed, &bhs, &[], &payload);
                match tokio::time::timeout(
                    Duration::from_millis(500),
                    flood.sender.send(&[Bytes::from(framed)]),
                )
                .await
                {
                    Ok(Ok(())) => {
                        sent.fetch_add(payload.len() as u64, Ordering::Relaxed);
                    }
                    // Held back by the target's window: try again.
                    Err(_) => {}
                    Ok(Err(_)) => break,
                }
            }
            flood
        })
    };

    // Meanwhile the good client works, and the target's memory is watched.
    let watching = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            peak
        })
    };
    let started = Instant::now();
    let mut rounds = 0u64;
    while started.elapsed() < Duration::from_secs(5) || rounds < 8 {
        let lba = (rounds % 32) * 2048 + 131072;
        let chunk = pattern(1 << 20, rounds);
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            good.write16(0, lba, Bytes::from(chunk.clone()), 512, false),
        )
        .await
        .expect("the good client's write is not held up")
        .unwrap();
        assert_eq!(r.status, 0);
        let r = tokio::time::timeout(Duration::from_secs(10), good.read16(0, lba, 2048, 512))
            .await
            .expect("the good client's read is not held up")
            .unwrap();
        assert!(
            r.status == 0 && r.data == chunk,
            "round {rounds}: data differs"
        );
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let peak = watching.await.unwrap();
    let flood = flooding.await.unwrap();
    let flooded = sent.load(Ordering::Relaxed);
    println!(
        "target RSS {before} KiB before, peak {peak} KiB; flood sent {} MiB; good client {rounds} rounds of 1 MiB in {:?}",
        flooded >> 20,
        started.elapsed()
    );
    assert!(
        flooded >= 64 << 20,
        "the flood sent only {flooded} bytes: it did not test anything"
    );
    assert!(
        peak <= before + RSS_BUDGET_KIB,
        "the target grew by {} KiB (budget {RSS_BUDGET_KIB} KiB) under a stopped reader and a flood",
        peak - before
    );
    // The stopped reader's own endpoint held no more than a channel's
    // receive budget (RECV_BUDGET + the window + a message or two) of the
    // 128 MiB the target had to send it: the rest waited at the target.
    let held: u64 = _ep1
        .stats()
        .await
        .expect("stats")
        .iter()
        .map(|(_, s)| s.recv_held)
        .sum();
    println!("the stopped reader's endpoint holds {held} bytes");
    assert!(
        held <= 16 << 20,
        "the stopped reader's endpoint holds {held} bytes, over its receive budget"
    );
    // The stopped reader's answers are all there once it reads again.
    let mut answered = 0;
    while answered < unanswered {
        let m = next(
            &mut stopped.receiver,
            20,
            "the stopped reader's answers arrive once it reads",
        )
        .await;
        match Pdu::decode(&decode(&m).bhs) {
            // GOOD, or the unit attention of a new nexus.
            Ok(Pdu::ScsiResponse(_)) => answered += 1,
            Ok(Pdu::DataIn(d)) if d.status_present => answered += 1,
            _ => {}
        }
    }
    println!("the stopped reader got its {answered} answers");
    let r = stopped
        .sender
        .release(first_unanswered)
        .expect("the buffer of the first unanswered read");
    assert!(r.covers(1 << 20), "its data landed whole: {:?}", r.ranges());
    drop(flood);
    let _ = good.logout().await;
}
