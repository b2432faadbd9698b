//! SAM task attributes and cross-session task management over raw
//! sessions: ORDERED and HEAD OF QUEUE order, PREEMPT AND ABORT.

mod raw;

use std::time::Duration;

use bytes::Bytes;
use ethersan_proto::pdu::{self, Pdu};
use raw::*;

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
    send_pdu(&mut b, &Pdu::DataOut(d), &[0xee; 4096]).await;
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
    send_pdu(&mut sock, &Pdu::DataOut(d), &[7u8; 512]).await;
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
