//! The NBD service against an in-memory target, with the tests playing
//! the kernel's driver over an in-memory pipe.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ethersan_nbd::{Reply, REPLY_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;
use crate::target::BoxFuture;

/// A RAM disk; a write at `fail_at` fails; a read waits longer the
/// nearer its offset is to 0.
#[derive(Debug, Default)]
struct Ram {
    data: Mutex<Vec<u8>>,
    flushes: AtomicUsize,
    fua_writes: AtomicUsize,
    fail_at: Option<u64>,
}

impl Ram {
    fn new(len: usize) -> Arc<Ram> {
        Arc::new(Ram {
            data: Mutex::new(vec![0xee; len]),
            ..Ram::default()
        })
    }
}

impl BlockTarget for Ram {
    fn name(&self) -> String {
        "ram".into()
    }
    fn file_name(&self) -> String {
        "ram".into()
    }
    fn block_size(&self) -> u64 {
        512
    }
    fn capacity(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }
    fn max_transfer(&self) -> u64 {
        1 << 20
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fua: true,
            unmap: true,
            ..Capabilities::default()
        }
    }
    fn read(&self, offset: u64, len: usize, _: Vec<u8>) -> BoxFuture<'_, anyhow::Result<Vec<u8>>> {
        Box::pin(async move {
            // Later offsets answer sooner: replies come out of order.
            let wait = 20u64.saturating_sub(offset / 4096);
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let d = self.data.lock().unwrap();
            Ok(d[offset as usize..offset as usize + len].to_vec())
        })
    }
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            if self.fail_at == Some(offset) {
                anyhow::bail!("medium error at {offset}");
            }
            if fua {
                self.fua_writes.fetch_add(1, Ordering::SeqCst);
            }
            let mut d = self.data.lock().unwrap();
            d[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
            Ok(())
        })
    }
    fn flush(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            self.flushes.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }
}

const DEV: Device = Device {
    size: 1 << 20,
    block_size: 512,
    read_only: false,
};

fn req(handle: u64, command: Command, offset: u64, len: u32) -> Request {
    Request {
        handle,
        command,
        offset,
        len,
        fua: false,
        no_hole: false,
    }
}

/// The kernel's end: send requests (with write data), read replies.
struct Kernel {
    pipe: DuplexStream,
}

impl Kernel {
    async fn send(&mut self, r: Request, data: &[u8]) {
        self.pipe.write_all(&r.encode()).await.unwrap();
        self.pipe.write_all(data).await.unwrap();
    }

    /// The next reply, and `data_len` bytes after it when it succeeded.
    async fn reply(&mut self, data_len: impl Fn(u64) -> usize) -> (Reply, Vec<u8>) {
        let mut raw = [0u8; REPLY_LEN];
        tokio::time::timeout(Duration::from_secs(5), self.pipe.read_exact(&mut raw))
            .await
            .expect("a reply")
            .unwrap();
        let r = Reply::parse(&raw).expect("reply magic");
        let mut d = vec![0; if r.error == 0 { data_len(r.handle) } else { 0 }];
        self.pipe.read_exact(&mut d).await.unwrap();
        (r, d)
    }
}

fn start(
    target: Arc<Ram>,
    dev: Device,
    depth: usize,
) -> (Kernel, tokio::task::JoinHandle<Result<Served, ServeError>>) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let t: Arc<dyn BlockTarget> = target;
    (Kernel { pipe: a }, tokio::spawn(serve(t, b, dev, depth)))
}

#[tokio::test]
async fn pipelined_requests_are_answered_by_handle_out_of_order() {
    let ram = Ram::new(1 << 20);
    let (mut k, server) = start(ram.clone(), DEV, 8);
    let w = Request {
        fua: true,
        ..req(1, Command::Write, 0, 8 * 4096)
    };
    let pattern: Vec<u8> = (0..8 * 4096).map(|i| (i % 251) as u8).collect();
    k.send(w, &pattern).await;
    assert_eq!(k.reply(|_| 0).await.0, Reply::ok(1));
    assert_eq!(ram.fua_writes.load(Ordering::SeqCst), 1);
    // Eight reads sent before any reply; the later ones finish first.
    for i in 0..8u64 {
        k.send(req(100 + i, Command::Read, i * 4096, 4096), &[])
            .await;
    }
    let mut order = Vec::new();
    for _ in 0..8 {
        let (r, d) = k.reply(|_| 4096).await;
        assert_eq!(r.error, 0);
        let i = (r.handle - 100) as usize;
        assert_eq!(d, pattern[i * 4096..(i + 1) * 4096], "handle {}", r.handle);
        order.push(i);
    }
    assert_ne!(
        order,
        (0..8).collect::<Vec<_>>(),
        "answered as they finished"
    );
    order.sort_unstable();
    assert_eq!(order, (0..8).collect::<Vec<_>>(), "each once");
    k.send(req(9, Command::Flush, 0, 0), &[]).await;
    assert_eq!(k.reply(|_| 0).await.0, Reply::ok(9));
    assert_eq!(ram.flushes.load(Ordering::SeqCst), 1);
    k.send(req(10, Command::Disconnect, 0, 0), &[]).await;
    assert_eq!(
        server.await.unwrap().unwrap(),
        Served {
            ended: Ended::Disconnected,
            requests: 10
        },
        "the write, eight reads and the flush answered; DISCONNECT not counted"
    );
}

#[tokio::test]
async fn trim_and_write_zeroes_read_back_as_zeros() {
    let ram = Ram::new(1 << 20);
    let (mut k, server) = start(ram.clone(), DEV, 4);
    k.send(req(1, Command::Trim, 4096, 8192), &[]).await;
    assert_eq!(k.reply(|_| 0).await.0, Reply::ok(1));
    let zeroes = Request {
        no_hole: true,
        ..req(2, Command::WriteZeroes, 65536, 512)
    };
    k.send(zeroes, &[]).await;
    assert_eq!(k.reply(|_| 0).await.0, Reply::ok(2));
    let d = ram.data.lock().unwrap().clone();
    assert!(d[4096..12288].iter().all(|b| *b == 0));
    assert!(d[65536..66048].iter().all(|b| *b == 0));
    assert!(d[..4096].iter().all(|b| *b == 0xee), "outside untouched");
    assert!(d[12288..65536].iter().all(|b| *b == 0xee));
    drop(k);
    assert_eq!(server.await.unwrap().unwrap().ended, Ended::Closed);
}

#[tokio::test]
async fn refused_and_failed_requests_get_an_error_and_the_service_goes_on() {
    let ram = Arc::new(Ram {
        data: Mutex::new(vec![0; 1 << 20]),
        fail_at: Some(8192),
        ..Ram::default()
    });
    let (mut k, server) = start(ram.clone(), DEV, 4);
    // Beyond the end: ENOSPC, the write's data still consumed.
    k.send(req(1, Command::Write, 1 << 20, 512), &[7; 512])
        .await;
    assert_eq!(k.reply(|_| 0).await.0, Reply::error(1, Errno::NoSpc));
    // Longer than any transfer: EOVERFLOW, its data read and dropped.
    let big = ethersan_nbd::MAX_TRANSFER + 512;
    k.send(req(7, Command::Write, 0, big), &vec![3; big as usize])
        .await;
    assert_eq!(k.reply(|_| 0).await.0, Reply::error(7, Errno::Overflow));
    // Misaligned: EINVAL.
    k.send(req(2, Command::Read, 100, 512), &[]).await;
    assert_eq!(k.reply(|_| 0).await.0, Reply::error(2, Errno::Inval));
    // The target's own failure: EIO.
    k.send(req(3, Command::Write, 8192, 512), &[1; 512]).await;
    assert_eq!(k.reply(|_| 0).await.0, Reply::error(3, Errno::Io));
    // And the stream is still in step.
    k.send(req(4, Command::Write, 0, 512), &[9; 512]).await;
    assert_eq!(k.reply(|_| 0).await.0, Reply::ok(4));
    assert!(ram.data.lock().unwrap()[..512].iter().all(|b| *b == 9));
    k.send(req(5, Command::Disconnect, 0, 0), &[]).await;
    assert_eq!(server.await.unwrap().unwrap().ended, Ended::Disconnected);

    // A read-only device refuses writes with EPERM.
    let ro = Device {
        read_only: true,
        ..DEV
    };
    let (mut k, server) = start(Ram::new(1 << 20), ro, 4);
    k.send(req(6, Command::Write, 0, 512), &[1; 512]).await;
    assert_eq!(k.reply(|_| 0).await.0, Reply::error(6, Errno::Perm));
    drop(k);
    assert_eq!(server.await.unwrap().unwrap().ended, Ended::Closed);
}

#[tokio::test]
async fn a_malformed_header_ends_the_service_after_what_was_in_flight() {
    let ram = Ram::new(1 << 20);
    let (mut k, server) = start(ram, DEV, 4);
    k.send(req(1, Command::Read, 0, 4096), &[]).await;
    let mut bad = req(2, Command::Read, 0, 4096).encode();
    bad[0] ^= 0xff;
    k.pipe.write_all(&bad).await.unwrap();
    // The read sent before it is still answered.
    let (r, d) = k.reply(|_| 4096).await;
    assert_eq!((r, d.len()), (Reply::ok(1), 4096));
    let err = server.await.unwrap().unwrap_err();
    assert!(
        matches!(err, ServeError::Malformed(DecodeError::BadMagic(_))),
        "{err}"
    );
}

#[tokio::test]
async fn disconnect_waits_for_writes_in_flight() {
    let ram = Ram::new(1 << 20);
    let (mut k, server) = start(ram.clone(), DEV, 16);
    for i in 0..16u64 {
        k.send(req(i, Command::Write, i * 4096, 4096), &[i as u8 + 1; 4096])
            .await;
    }
    k.send(req(99, Command::Disconnect, 0, 0), &[]).await;
    for _ in 0..16 {
        assert_eq!(k.reply(|_| 0).await.0.error, 0);
    }
    assert_eq!(server.await.unwrap().unwrap().ended, Ended::Disconnected);
    let d = ram.data.lock().unwrap();
    for i in 0..16usize {
        assert!(d[i * 4096..(i + 1) * 4096]
            .iter()
            .all(|b| *b == i as u8 + 1));
    }
}

#[test]
fn flags_follow_the_capabilities() {
    let none = transmission_flags(Capabilities::default(), false);
    assert_eq!(
        none,
        flags::HAS_FLAGS | flags::SEND_FLUSH | flags::SEND_WRITE_ZEROES
    );
    let all = Capabilities {
        fua: true,
        unmap: true,
        sessions: true,
        ..Capabilities::default()
    };
    let f = transmission_flags(all, true);
    for bit in [
        flags::READ_ONLY,
        flags::SEND_FUA,
        flags::SEND_TRIM,
        flags::CAN_MULTI_CONN,
    ] {
        assert_ne!(f & bit, 0, "{bit:#x}");
    }
}
