//! A session's memory budget seen from the wire: writes that send no data
//! get R2Ts only while their buffers fit, RSS stays bounded, other sessions
//! keep working, and freed buffers go to the next waiting commands.

mod raw;

use ethersan_proto::pdu::{self, Pdu};
use raw::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

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
    // commands are asked for theirs.
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
