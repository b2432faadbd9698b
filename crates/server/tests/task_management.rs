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

/// A RAM device whose reads wait (on the blocking pool) until the gate
/// opens, each saying on `reached` that it has come to the gate.
#[derive(Debug)]
struct Gated {
    ram: std::sync::Arc<ethersan_backend::ram::RamDevice>,
    gate: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    reached: tokio::sync::mpsc::UnboundedSender<()>,
}

impl ethersan_backend::BlockDevice for Gated {
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.ram.num_blocks()
    }
    fn submit(
        &self,
        req: ethersan_backend::IoRequest,
        done: ethersan_backend::IoCompletion,
    ) -> ethersan_backend::Submission {
        if !matches!(req, ethersan_backend::IoRequest::Read { .. }) {
            return self.ram.submit(req, done);
        }
        let gate = self.gate.clone();
        let ram = self.ram.clone();
        let reached = self.reached.clone();
        ethersan_backend::Submission::Blocking(Box::new(move || {
            let _ = reached.send(());
            let (open, cv) = &*gate;
            let mut o = open.lock().unwrap();
            while !*o {
                o = cv.wait(o).unwrap();
            }
            drop(o);
            let (tx, rx) = std::sync::mpsc::channel();
            match ram.submit(req, Box::new(move |r| tx.send(r).unwrap())) {
                ethersan_backend::Submission::Done(r) => r,
                ethersan_backend::Submission::Pending => rx.recv().unwrap(),
                ethersan_backend::Submission::Blocking(job) => job(),
            }
        }))
    }
    fn describe(&self) -> String {
        "gated".into()
    }
}

type Gate = std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>;

fn open(gate: &Gate) {
    let (open, cv) = &**gate;
    *open.lock().unwrap_or_else(|e| e.into_inner()) = true;
    cv.notify_all();
}

struct OpenOnDrop(Gate);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        open(&self.0);
    }
}

/// Send a task management request over a raw session.
async fn raw_tmf(
    sock: &mut tokio::net::TcpStream,
    function: pdu::TmfFunction,
    lun: u64,
    itt: u32,
    cmd_sn: u32,
) {
    let t = pdu::TaskMgmtRequest {
        immediate: true,
        function,
        lun: pdu::lun_to_wire(lun),
        itt,
        referenced_task_tag: pdu::RESERVED_TAG,
        cmd_sn,
        exp_stat_sn: 0,
        ref_cmd_sn: 0,
        exp_data_sn: 0,
    };
    send_pdu(sock, &Pdu::TaskMgmtRequest(t), &[]).await;
}

#[tokio::test]
async fn a_lun_reset_waits_for_the_tasks_it_aborts_in_other_sessions() {
    use ethersan_scsi::{LogicalUnit, LuConfig, LunPolicy, LunSlot};
    let cfg = ethersan_server::config::Config::from_toml_str(
        &format!(
            "portals = [\"127.0.0.1:0\"]\n[options]\nnop_interval_secs = 0\n[[target]]\nname = \"{IQN}\"\nlun = [\"ram:1M\"]\n"
        ),
        "test",
    )
    .unwrap();
    let srv = ethersan_server::Server::bind(&cfg).await.unwrap();
    let addr = srv.local_addrs()[0].to_string();
    let gate = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    // Whatever happens, the gate opens when the test ends (a read held at
    // it would keep the runtime from shutting down).
    let _open_at_end = OpenOnDrop(gate.clone());
    let (reached, mut at_gate) = tokio::sync::mpsc::unbounded_channel();
    let dev = Gated {
        ram: std::sync::Arc::new(ethersan_backend::ram::RamDevice::new(1 << 20, 512).unwrap()),
        gate: gate.clone(),
        reached,
    };
    let lu = LogicalUnit::new(
        std::sync::Arc::new(dev),
        LuConfig {
            serial: "gated".into(),
            naa: [0x60, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9],
            target_name: IQN.into(),
            ..LuConfig::default()
        },
    );
    srv.registry()
        .target(IQN)
        .unwrap()
        .add_lun(
            1,
            LunSlot {
                lu: std::sync::Arc::new(lu),
                policy: LunPolicy::default(),
            },
        )
        .unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        srv.run(async {
            let _ = rx.await;
        })
        .await
    });

    // B: a READ on LUN 1 that is running (held at the gate).
    let b = good_session(&addr).await;
    for _ in 0..3 {
        let r = b.command(1, &[0; 6], Bytes::new(), 0).await.unwrap();
        if r.status == 0 {
            break;
        }
    }
    let read10 = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let b_read = tokio::spawn(async move {
        let r = tokio::time::timeout(
            Duration::from_millis(1500),
            b.command(1, &read10, Bytes::new(), 512),
        )
        .await;
        (b, r.is_err())
    });
    // B's READ is running: it has reached the gate.
    tokio::time::timeout(Duration::from_secs(5), at_gate.recv())
        .await
        .expect("B's READ reached the gate within 5 s")
        .expect("the device is alive");

    // A: LOGICAL UNIT RESET on LUN 1. It aborts B's READ, which is still
    // running: no response until it has ended.
    let mut a = raw_login(&addr).await;
    raw_tmf(&mut a, pdu::TmfFunction::LogicalUnitReset, 1, 0x77, 1).await;
    assert!(
        pdu_within(&mut a, 500).await.is_none(),
        "the LU RESET was answered while a task it aborted in another session still ran"
    );
    // Open the gate: B's READ ends (aborted: no response to B), then A's
    // response comes.
    open(&gate);
    match pdu_within(&mut a, 5000).await {
        Some(Pdu::TaskMgmtResponse(r)) => {
            assert_eq!((r.itt, r.response), (0x77, pdu::tmf_response::COMPLETE))
        }
        other => panic!("expected the LU RESET's response, got {other:?}"),
    }
    let (b, timed_out) = b_read.await.unwrap();
    assert!(timed_out, "B's aborted READ got a response");
    drop(b);
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}

#[tokio::test]
async fn a_cold_reset_is_answered_before_every_connection_to_the_target_closes() {
    let (addr, server, stop) = start().await;
    // B: another session logged in to the same target, idle once its
    // first command has been answered.
    let mut b = raw_login(&addr).await;
    raw_command(&mut b, 2, 1, &[0; 6], &[], 0, false).await;
    raw_response(&mut b, 2, None).await;
    let mut a = raw_login_isid(&addr, 8).await;
    raw_tmf(&mut a, pdu::TmfFunction::TargetColdReset, 0, 0x31, 1).await;
    match pdu_within(&mut a, 5000).await {
        Some(Pdu::TaskMgmtResponse(r)) => {
            assert_eq!((r.itt, r.response), (0x31, pdu::tmf_response::COMPLETE))
        }
        other => panic!("expected the cold reset's response, got {other:?}"),
    }
    expect_closed(&mut a).await;
    expect_closed(&mut b).await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}
