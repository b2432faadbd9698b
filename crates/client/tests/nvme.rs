//! The NVMe/TCP transport end to end over real TCP on 127.0.0.1, against
//! a tiny target made of `ethersan_nvme`'s target `Queue` (tests/nvme_target).

mod nvme_target;

use bytes::Bytes;
use ethersan_client::{nvme, open, BlockTarget, ConnectArgs, OpenOptions};
use nvme_target::{RamTarget, DISCOVERY, NGUID, SUBNQN};

const MIB: usize = 1 << 20;

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_target_writes_and_reads_back_a_mebibyte() {
    let t = RamTarget::start(8192, 9).await; // 4 MiB of 512-byte blocks
    let dev = open(&t.url(1), &ConnectArgs::default(), &OpenOptions::default())
        .await
        .unwrap();
    assert_eq!(dev.block_size(), 512);
    assert_eq!(dev.capacity(), 4 * MIB as u64);
    assert!(dev.max_transfer() >= 4096 && dev.max_transfer() <= MIB as u64);
    assert!(dev.capabilities().write_zeroes);
    let data = pattern(MIB, 7);
    let base = 512 * 1024u64;
    // Written in pieces of several sizes (in-capsule impossible: IOCCSZ 4,
    // so every piece goes by R2T/H2CData).
    let mut at = 0;
    for (i, piece) in [4096usize, 65_536, 512, 131_072, 300 * 512]
        .iter()
        .cycle()
        .enumerate()
    {
        if at >= MIB {
            break;
        }
        let n = (*piece).min(MIB - at);
        dev.write(
            base + at as u64,
            Bytes::copy_from_slice(&data[at..at + n]),
            i % 2 == 0,
        )
        .await
        .unwrap();
        at += n;
    }
    dev.flush().await.unwrap();
    assert!(
        t.disk.lock().unwrap()[base as usize..base as usize + MIB] == data[..],
        "the target holds what was written"
    );
    // Read back whole (split in several C2HData PDUs), and in pieces.
    let back = dev.read(base, MIB, Vec::new()).await.unwrap();
    assert!(back == data, "read back differs");
    let piece = dev.read(base + 4096, 8192, vec![1; 3]).await.unwrap();
    assert_eq!(piece, data[4096..4096 + 8192]);
    // The last block, and past the end.
    dev.read(4 * MIB as u64 - 512, 512, Vec::new())
        .await
        .unwrap();
    assert!(dev.read(4 * MIB as u64, 512, Vec::new()).await.is_err());
    // Write Zeroes.
    dev.write_zeroes(base, 65_536, false).await.unwrap();
    let z = dev.read(base, 65_536 + 512, Vec::new()).await.unwrap();
    assert!(z[..65_536].iter().all(|&b| b == 0));
    assert_eq!(z[65_536..], data[65_536..65_536 + 512]);
    dev.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identify_and_discovery() {
    let t = RamTarget::start(2048, 12).await;
    let c = nvme::connect(&t.url(1), &ConnectArgs::default())
        .await
        .unwrap();
    assert_eq!(c.cntlid, 1);
    assert_eq!(c.info.serial, "SN-TEST-1");
    assert_eq!(c.info.subnqn, SUBNQN);
    assert_eq!(c.active_namespaces().await.unwrap(), vec![1]);
    let ns = c.namespace(1).await.unwrap();
    assert_eq!((ns.block_size, ns.info.nsze), (4096, 2048));
    assert_eq!(ns.info.nguid, NGUID);
    assert_eq!(ns.ids, vec![nvme::NamespaceId::Nguid(NGUID)]);
    let log = nvme::discover(&format!("nvme+tcp://{}", t.addr), &ConnectArgs::default())
        .await
        .unwrap();
    assert_eq!(log.entries.len(), 1);
    assert_eq!(log.entries[0].subnqn, SUBNQN);
    assert_eq!(log.entries[0].trsvcid, t.addr.port().to_string());
    assert_ne!(SUBNQN, DISCOVERY);
}

async fn open_err(url: &str) -> String {
    match open(url, &ConnectArgs::default(), &OpenOptions::default()).await {
        Ok(_) => panic!("{url} opened"),
        Err(e) => format!("{e:#}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_have_clear_messages() {
    let t = RamTarget::start(2048, 9).await;
    // Connection refused: a port nobody listens on any more.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let e = open_err(&format!("nvme+tcp://{closed}/{SUBNQN}/1")).await;
    assert!(e.contains("cannot connect") && e.contains("refused"), "{e}");
    // A listener that closes instead of answering ICReq.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mute = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            drop(s);
        }
    });
    let e = open_err(&format!("nvme+tcp://{mute}/{SUBNQN}/1")).await;
    assert!(e.contains("ICReq"), "{e}");
    // Connect refused: no such subsystem, and a host not allowed.
    let e = open_err(&format!("nvme+tcp://{}/nqn.2026-11.org.nobody:x/1", t.addr)).await;
    assert!(
        e.contains("refused Connect") && e.contains("invalid parameters"),
        "{e}"
    );
    let e = open_err(&format!(
        "nvme+tcp://{}/{SUBNQN}/1?hostnqn=nqn.2014-08.org.example:denied",
        t.addr
    ))
    .await;
    assert!(e.contains("invalid host"), "{e}");
    // No namespace 7.
    let e = open_err(&t.url(7)).await;
    assert!(
        e.contains("namespace 7 not found") && e.contains("1"),
        "{e}"
    );
    // The discovery controller has no namespaces.
    let e = open_err(&format!("nvme+tcp://{}", t.addr)).await;
    assert!(e.contains("ethersan discover"), "{e}");
    // A bad URL.
    let e = open_err("nvme+tcp://127.0.0.1:0/x/1").await;
    assert!(e.contains("bad port"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digests_and_several_queues() {
    let t = RamTarget::start(4096, 9).await;
    let url = format!("{}?digest=both&queues=3", t.url(1));
    let c = nvme::connect(&url, &ConnectArgs::default()).await.unwrap();
    let ic = c.ic_resp();
    assert!(ic.header_digest && ic.data_digest, "{ic:?}");
    let dev = nvme::NvmeTarget::open(c, 1, 3).await.unwrap();
    assert_eq!(dev.queues(), 3);
    let data = pattern(512 * 1024, 3);
    // 8 writes of 64 KiB at once, spread over the queues.
    let writes = data
        .chunks(65_536)
        .enumerate()
        .map(|(i, c)| dev.write(i as u64 * 65_536, Bytes::copy_from_slice(c), false));
    for r in futures::future::join_all(writes).await {
        r.unwrap();
    }
    let reads = (0..8u64).map(|i| dev.read(i * 65_536, 65_536, Vec::new()));
    let back: Vec<u8> = futures::future::join_all(reads)
        .await
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect();
    assert!(back == data, "read back differs");
    assert!(t.disk.lock().unwrap()[..data.len()] == data[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_every_half_kato() {
    let t = RamTarget::start(2048, 9).await;
    let mut who = nvme::identity_of(&nvme::NvmeUrl::parse(&t.url(1)).unwrap());
    who.kato_ms = 200;
    let c = nvme::Controller::connect(who, Some(std::time::Duration::from_secs(5)))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(750)).await;
    let n = t.keep_alives.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        (3..=12).contains(&n),
        "{n} Keep Alives in 750 ms at KATO 200 ms"
    );
    drop(c);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let after = t.keep_alives.load(std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        t.keep_alives.load(std::sync::atomic::Ordering::Relaxed),
        after,
        "no Keep Alive once the controller is dropped"
    );
}
