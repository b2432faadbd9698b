//! Tests of cut-through WRITE (see `cut_through_write`): a WRITE handed a
//! [`WriteStream`] writes each piece once, at its offset, in the order
//! the pieces are handed over, and answers once, after the transfer ended.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::super::testing::*;
use super::{DEPTH, PIECE};
use crate::{IoBuf, Requester, ScsiCommand, ScsiResponse, Submitted, WriteStream};

/// Submit `cdb` on LUN 0 with `stream`; the receiver gets the response
/// (also when it was answered at once or as a blocking job, run on a
/// thread of its own as the executor's pool would).
fn submit(
    t: &crate::ScsiTarget,
    cdb: Vec<u8>,
    stream: &WriteStream,
) -> mpsc::Receiver<ScsiResponse> {
    let cmd = ScsiCommand {
        nexus: A,
        lun: 0,
        cdb,
        data_out: Default::default(),
        expected_len: stream.len() as u32,
    };
    let who = Requester {
        data_out: Some(stream),
        ..Requester::named(None)
    };
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    match t.submit_from(cmd, who, Box::new(move |r| tx.send(r).unwrap())) {
        Submitted::Pending => {}
        Submitted::Done(r) => tx2.send(r).unwrap(),
        Submitted::Blocking(job) => {
            std::thread::spawn(move || tx2.send(job()).unwrap());
        }
    }
    rx
}

fn piece_of(data: &[u8], s: &WriteStream, i: usize) -> IoBuf {
    let (start, len) = s.piece(i);
    IoBuf::aligned_copy_of(&data[start..start + len])
}

/// Wait (a little) until `f` holds.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < until, "never: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn split_target(bs: u32, answer: u8, write_cache: bool) -> (crate::ScsiTarget, Arc<TestDevice>) {
    let dev = Arc::new(TestDevice::new(bs));
    dev.split_writes.store(true, Ordering::Relaxed);
    dev.answer.store(answer, Ordering::Relaxed);
    let cfg = crate::LuConfig {
        write_cache,
        ..config(false, false)
    };
    (target_over(dev.clone(), cfg), dev)
}

#[test]
fn pieces_in_any_order_are_each_written_once_at_their_offset() {
    for answer in [ANSWER_DONE, ANSWER_PENDING, ANSWER_BLOCKING] {
        for bs in BLOCK_SIZES {
            // In order; backwards; the middle first.
            for order in [
                vec![0, 1, 2, 3, 4],
                vec![4, 3, 2, 1, 0],
                vec![2, 4, 0, 3, 1],
            ] {
                let (t, dev) = split_target(bs, answer, true);
                // 1 MiB + one block at block 3: five pieces, the last short.
                let len = (1 << 20) + bs as usize;
                let data = pattern(len, order[0] as u8);
                let s = WriteStream::new(len);
                assert_eq!(s.pieces(), 5);
                // Two pieces before the command reaches the unit, the rest
                // after: they wait in the stream until then.
                s.put(order[0], piece_of(&data, &s, order[0])).unwrap();
                s.put(order[1], piece_of(&data, &s, order[1])).unwrap();
                let rx = submit(&t, cdb16(0x8a, 0, 3, (len / bs as usize) as u32), &s);
                for &i in &order[2..] {
                    s.put(i, piece_of(&data, &s, i)).unwrap();
                }
                eventually("every piece written", || {
                    dev.writes.lock().unwrap().len() == 5
                        && dev.writes_in_flight.load(Ordering::SeqCst) == 0
                });
                std::thread::sleep(Duration::from_millis(10));
                assert!(
                    rx.try_recv().is_err(),
                    "no answer before the transfer ended"
                );
                s.end();
                good(rx.recv_timeout(Duration::from_secs(5)).expect("answered"));
                let mut writes: Vec<(u64, usize)> = dev
                    .writes
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|w| (w.0, w.1))
                    .collect();
                let handed: Vec<u64> = writes.iter().map(|w| w.0).collect();
                writes.sort_unstable();
                let off = 3 * u64::from(bs);
                let want: Vec<_> = (0..5)
                    .map(|i| (off + (i * PIECE) as u64, PIECE.min(len - i * PIECE)))
                    .collect();
                assert_eq!(writes, want, "answer {answer}, bs {bs}, order {order:?}");
                if answer == ANSWER_DONE {
                    // Written in the order handed over.
                    let order_off: Vec<u64> =
                        order.iter().map(|i| off + (i * PIECE) as u64).collect();
                    assert_eq!(handed, order_off);
                }
                assert!(
                    dev.max_writes_in_flight.load(Ordering::SeqCst) <= DEPTH,
                    "at most {DEPTH} pieces on the device"
                );
                let back = exec(&t, A, &cdb16(0x88, 0, 3, (len / bs as usize) as u32), &[]);
                assert!(
                    good(back) == data,
                    "answer {answer}, bs {bs}: the bytes read back"
                );
            }
        }
    }
}

#[test]
fn a_failed_second_piece_stops_the_rest_and_answers_once_after_the_data() {
    for answer in [ANSWER_DONE, ANSWER_PENDING] {
        let (t, dev) = split_target(512, answer, true);
        let len = 1 << 20;
        let data = pattern(len, 5);
        *dev.fail_write_at.lock().unwrap() = Some(PIECE as u64 + 4096);
        let s = WriteStream::new(len);
        let rx = submit(&t, cdb10(0x2a, 0, 0, 2048), &s);
        s.put(0, piece_of(&data, &s, 0)).unwrap();
        s.put(1, piece_of(&data, &s, 1)).unwrap();
        eventually("the failure is known", || s.is_closed());
        // The rest of the data still arrives: nothing more is written.
        s.put(2, piece_of(&data, &s, 2)).unwrap();
        s.put(3, piece_of(&data, &s, 3)).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        assert!(rx.try_recv().is_err(), "no answer before the data ended");
        s.end();
        let r = rx.recv_timeout(Duration::from_secs(5)).expect("answered");
        check(&r, 3, 0x0c, 0);
        assert!(
            rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "one answer"
        );
        let writes = dev.writes.lock().unwrap().clone();
        assert_eq!(writes.len(), 2, "{writes:?}");
        assert!(writes.iter().all(|w| w.0 < 2 * PIECE as u64), "{writes:?}");
    }
}

#[test]
fn every_piece_carries_the_commands_fua() {
    // (FUA bit, write cache on) -> FUA of every piece.
    for (fua, wce, want) in [
        (false, true, false),
        (true, true, true),
        (false, false, true),
    ] {
        let (t, dev) = split_target(512, ANSWER_PENDING, wce);
        let len = 1 << 20;
        let data = pattern(len, 1);
        let s = WriteStream::new(len);
        let flags = if fua { 0x08 } else { 0 };
        let rx = submit(&t, cdb10(0x2a, flags, 8, 2048), &s);
        for i in 0..s.pieces() {
            s.put(i, piece_of(&data, &s, i)).unwrap();
        }
        s.end();
        good(rx.recv_timeout(Duration::from_secs(5)).expect("answered"));
        let f: Vec<bool> = dev.writes.lock().unwrap().iter().map(|w| w.2).collect();
        assert_eq!(f, vec![want; 4], "fua {fua}, write cache {wce}");
    }
}

#[test]
fn an_abandoned_transfer_writes_nothing_more_and_answers_data_phase_error() {
    let (t, dev) = split_target(512, ANSWER_DONE, true);
    let len = 1 << 20;
    let data = pattern(len, 2);
    let s = WriteStream::new(len);
    let rx = submit(&t, cdb10(0x2a, 0, 0, 2048), &s);
    s.put(0, piece_of(&data, &s, 0)).unwrap();
    s.abandon();
    check(
        &rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        0x0b,
        0x4b,
        0,
    );
    assert!(s.put(1, piece_of(&data, &s, 1)).is_err(), "ended");
    assert_eq!(dev.writes.lock().unwrap().len(), 1);
    // A check that fails answers at once, without taking the stream.
    let s = WriteStream::new(len);
    let cap = (DEV_BYTES / 512) as u32;
    let rx = submit(&t, cdb10(0x2a, 0, cap - 1, 2048), &s);
    check(&rx.try_recv().expect("at once"), 5, 0x21, 0);
}

#[test]
fn only_plain_large_writes_on_splitting_engines_stream() {
    let (t, dev) = split_target(512, ANSWER_PENDING, true);
    let mib = 1 << 20;
    assert!(t.streams_write(0, &cdb10(0x2a, 0, 0, 2048), mib));
    assert!(
        t.streams_write(0, &cdb10(0x2a, 0x18, 0, 2048), mib),
        "DPO, FUA"
    );
    assert!(t.streams_write(0, &cdb16(0x8a, 0x08, 0, 2048), mib));
    assert!(
        !t.streams_write(0, &cdb10(0x2a, 0, 0, 1023), 1023 * 512),
        "short"
    );
    assert!(
        !t.streams_write(0, &cdb10(0x2a, 0, 0, 2048), mib / 2),
        "EDTL differs"
    );
    assert!(
        !t.streams_write(0, &cdb10(0x2e, 0, 0, 2048), mib),
        "WRITE AND VERIFY"
    );
    assert!(
        !t.streams_write(0, &cdb10(0x2a, 0x20, 0, 2048), mib),
        "WRPROTECT"
    );
    assert!(
        !t.streams_write(1, &cdb10(0x2a, 0, 0, 2048), mib),
        "no LUN 1"
    );
    dev.split_writes.store(false, Ordering::Relaxed);
    assert!(!t.streams_write(0, &cdb10(0x2a, 0, 0, 2048), mib));
}
