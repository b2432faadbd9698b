//! Merged I/O of two sessions, one of which aborts a task: two raw
//! sessions on one pinned worker (so one io_uring, where the requests of
//! one turn merge) write to a direct file LUN on the io_uring engine.

mod raw;

use std::time::Duration;

use ethersan_proto::pdu::{self, Pdu};
use raw::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Bytes per write: 16 blocks, sent as immediate data (the target's
/// MaxRecvDataSegmentLength in these tests is 8192).
const L: usize = 8192;
/// Writes per session per round.
const N: usize = 8;
/// Bytes of the LUN each round writes: `2N` writes and an empty slot.
const STRIDE: usize = (2 * N + 1) * L;
/// Most rounds (each on a range of its own).
const MAX_ROUNDS: usize = 200;

/// `len` bytes of a sequence of its own for each `seed` (xorshift).
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed ^ 0x9e37_79b9;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// A SIMPLE WRITE(10) of `data` at byte `offset` with all its data
/// immediate, appended to `out`.
fn write_pdu(out: &mut Vec<u8>, itt: u32, cmd_sn: u32, offset: usize, data: &[u8]) {
    let lba = ((offset / 512) as u32).to_be_bytes();
    let blocks = ((data.len() / 512) as u16).to_be_bytes();
    let mut cdb = [0u8; 16];
    cdb[..10].copy_from_slice(&[
        0x2a, 0, lba[0], lba[1], lba[2], lba[3], 0, blocks[0], blocks[1], 0,
    ]);
    let cmd = pdu::ScsiCommand {
        immediate: false,
        final_bit: true,
        read: false,
        write: true,
        attr: pdu::TaskAttr::Simple,
        lun: pdu::lun_to_wire(0),
        itt,
        expected_len: data.len() as u32,
        cmd_sn,
        exp_stat_sn: 0,
        cdb,
    };
    let p = Pdu::ScsiCommand(cmd);
    pdu::write_pdu(out, &p.encode(data.len() as u32), data, false, false);
}

/// An ABORT TASK of task `task` (sent with CmdSN `ref_cmd_sn`), appended
/// to `out`.
fn abort_pdu(out: &mut Vec<u8>, itt: u32, cmd_sn: u32, task: u32, ref_cmd_sn: u32) {
    let t = pdu::TaskMgmtRequest {
        immediate: true,
        function: pdu::TmfFunction::AbortTask,
        lun: pdu::lun_to_wire(0),
        itt,
        referenced_task_tag: task,
        cmd_sn,
        exp_stat_sn: 0,
        ref_cmd_sn,
        exp_data_sn: 0,
    };
    let p = Pdu::TaskMgmtRequest(t);
    pdu::write_pdu(out, &p.encode(0), &[], false, false);
}

/// The SCSI responses (tag, status) and task management responses (tag,
/// response) read from `sock` until `done` says there is all it waits for.
async fn collect(
    sock: &mut TcpStream,
    mut done: impl FnMut(&[(u32, u8)], &[(u32, u8)]) -> bool,
) -> (Vec<(u32, u8)>, Vec<(u32, u8)>) {
    let (mut scsi, mut tmf) = (Vec::new(), Vec::new());
    while !done(&scsi, &tmf) {
        let (bhs, _) = read_pdu(sock).await.expect("connection closed");
        match Pdu::decode(&bhs) {
            Ok(Pdu::ScsiResponse(r)) => scsi.push((r.itt, r.status)),
            Ok(Pdu::TaskMgmtResponse(r)) => tmf.push((r.itt, r.response)),
            other => panic!("unexpected PDU {other:?}"),
        }
    }
    (scsi, tmf)
}

/// Two sessions write at once to one LUN, in ranges laid out so that the
/// engine can merge no two writes of one session (none adjoins the next
/// one its session sends) while session A's last write adjoins session
/// B's first: a merged request joins writes of both sessions (most likely
/// those two). Session A aborts that last write. B's writes all complete
/// GOOD with their data; A gets its answer to the abort (FUNCTION
/// COMPLETE, or TASK DOES NOT EXIST when the write had finished and been
/// answered first) and never a response for the aborted write after it;
/// the aborted write's range holds its data or what was there before,
/// nothing else; and the server goes on serving both sessions. Rounds go
/// on until some merged writes of both sessions (whether a round's do
/// depends on both batches reaching the worker in one turn).
#[tokio::test]
async fn merged_writes_of_two_sessions_survive_an_abort_in_one() {
    let dir = tempfile::tempdir().unwrap();
    let lun = format!(
        "{}:{}K,engine=uring,direct",
        dir.path().join("lun.img").display(),
        MAX_ROUNDS * STRIDE / 1024
    );
    // One worker: both connections on one thread and its io_uring.
    let (addr, server, stop) =
        start_with_lun("nop_interval_secs = 0\nworker_threads = 1", &lun).await;
    let mut a = raw_login_isid(&addr, 1).await;
    let mut b = raw_login_isid(&addr, 2).await;
    for s in [&mut a, &mut b] {
        // The first command gets the POWER ON unit attention.
        raw_command(s, 1, 1, &[0; 6], &[], 0, false).await;
        raw_response(s, 1, None).await;
    }
    let check = good_session(&addr).await;
    let (mut sn_a, mut sn_b) = (2u32, 2u32);
    let merged_before = ethersan_backend::uring::merged_requests();
    let (mut rounds, mut rounds_merged) = (0, 0);
    let (mut aborted, mut not_found) = (0, 0);
    while rounds_merged < 3 && rounds < MAX_ROUNDS {
        let round = rounds;
        rounds += 1;
        let base = round * STRIDE;
        // Slot 2k is A's write k, slot 2k + 1 B's write k, slot 2N stays
        // empty. A sends its writes N-1..=0 (descending: none adjoins the
        // next) and B its writes 0..N (ascending, every other slot).
        let itt = |session: u32, k: usize| (round as u32) << 16 | session << 8 | k as u32;
        let data_a = |k: usize| pattern(L, itt(0xa, k));
        let data_b = |k: usize| pattern(L, itt(0xb, k));
        let mut out_a = Vec::new();
        for k in (0..N).rev() {
            write_pdu(&mut out_a, itt(0xa, k), sn_a, base + 2 * k * L, &data_a(k));
            sn_a += 1;
        }
        // A aborts its write 0 (its last) at once; the TMF is immediate:
        // the CmdSN of A's next command.
        let tmf_itt = itt(0xa, 0xff);
        abort_pdu(&mut out_a, tmf_itt, sn_a, itt(0xa, 0), sn_a - 1);
        let mut out_b = Vec::new();
        for k in 0..N {
            write_pdu(
                &mut out_b,
                itt(0xb, k),
                sn_b,
                base + (2 * k + 1) * L,
                &data_b(k),
            );
            sn_b += 1;
        }
        let merged = ethersan_backend::uring::merged_requests();
        let (wa, wb) = tokio::join!(a.write_all(&out_a), b.write_all(&out_b));
        wa.unwrap();
        wb.unwrap();

        // A: the TMF response and every write but 0 answered (write 0 is
        // answered only if it finished before the abort found it).
        let (scsi_a, tmf_a) = collect(&mut a, |scsi, tmf| {
            tmf.len() == 1 && scsi.iter().filter(|(t, _)| *t != itt(0xa, 0)).count() == N - 1
        })
        .await;
        assert_eq!(tmf_a[0].0, tmf_itt);
        let answered_0 = scsi_a.iter().find(|(t, _)| *t == itt(0xa, 0)).copied();
        match tmf_a[0].1 {
            pdu::tmf_response::COMPLETE => {
                aborted += 1;
                assert_eq!(
                    answered_0, None,
                    "round {round}: an aborted task was answered"
                );
            }
            pdu::tmf_response::NO_TASK => {
                not_found += 1;
                assert_eq!(
                    answered_0.map(|(_, s)| s),
                    Some(0),
                    "round {round}: TASK DOES NOT EXIST for a task never answered GOOD"
                );
            }
            other => panic!("round {round}: ABORT TASK answered {other}"),
        }
        for (t, status) in &scsi_a {
            assert_eq!(*status, 0, "round {round}: A's task {t:#x}");
        }
        assert_eq!(scsi_a.len(), N - 1 + answered_0.is_some() as usize);
        // Nothing for the aborted write comes after the TMF response: A's
        // next command is answered and nothing else is.
        raw_command(&mut a, itt(0xa, 0xfe), sn_a, &[0; 6], &[], 0, false).await;
        sn_a += 1;
        let never = answered_0.is_none().then_some(itt(0xa, 0));
        assert_eq!(raw_response(&mut a, itt(0xa, 0xfe), never).await, 0);

        // B: every write GOOD.
        let (scsi_b, tmf_b) = collect(&mut b, |scsi, _| scsi.len() == N).await;
        assert!(tmf_b.is_empty());
        let mut tags: Vec<u32> = scsi_b
            .iter()
            .map(|&(t, status)| {
                assert_eq!(status, 0, "round {round}: B's task {t:#x}");
                t
            })
            .collect();
        tags.sort_unstable();
        assert_eq!(tags, (0..N).map(|k| itt(0xb, k)).collect::<Vec<_>>());
        // Only this test's LUN has an io_uring in this process.
        if ethersan_backend::uring::merged_requests() > merged {
            rounds_merged += 1;
        }

        // The medium: every write's own bytes where it went, the aborted
        // one's or the zeros that were there, and the empty slot still
        // empty.
        let r = check
            .read16(0, (base / 512) as u64, (STRIDE / 512) as u32, 512)
            .await
            .unwrap();
        assert_eq!(r.status, 0);
        for slot in 0..=2 * N {
            let got = &r.data[slot * L..(slot + 1) * L];
            let k = slot / 2;
            if slot == 2 * N {
                assert!(got.iter().all(|x| *x == 0), "round {round}: the empty slot");
            } else if slot % 2 == 1 {
                assert!(got == data_b(k), "round {round}: B's write {k}");
            } else if k > 0 || answered_0.is_some() {
                assert!(got == data_a(k), "round {round}: A's write {k}");
            } else {
                assert!(
                    got == data_a(0) || got.iter().all(|x| *x == 0),
                    "round {round}: the aborted write's range holds other bytes"
                );
            }
        }
    }
    let merged = ethersan_backend::uring::merged_requests() - merged_before;
    eprintln!(
        "{rounds} rounds: {aborted} aborted, {not_found} already done; \
         {rounds_merged} merged writes of both sessions ({merged} requests)"
    );
    assert!(
        rounds_merged > 0,
        "in {rounds} rounds the two sessions' writes never merged"
    );

    // The server goes on: new commands on both sessions and a new one.
    for (s, sn) in [(&mut a, sn_a), (&mut b, sn_b)] {
        raw_command(s, 0xffff_0001, sn, &[0; 6], &[], 0, false).await;
        assert_eq!(raw_response(s, 0xffff_0001, None).await, 0);
    }
    io_still_works(&check).await;
    io_still_works(&good_session(&addr).await).await;
    drop((a, b, check));
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}
