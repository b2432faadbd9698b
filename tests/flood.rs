//! Three hundred idle half-open connections and a stream of garbage must
//! not stop a good client from logging in and doing I/O, and the server's
//! memory stays bounded.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Server, IQN};

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap()
}

#[test]
fn half_open_connections_and_garbage_do_not_lock_out_a_good_client() {
    let server = Server::start(&["ram:16M"]);
    let pid = server.child.id();
    let before = rss_kib(pid);
    // 300 connections that never log in.
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(&server.addr).unwrap())
        .collect();
    // 50 connections that send garbage: random bytes, a BHS claiming a
    // huge data segment, half a header.
    let mut junk = Vec::new();
    for i in 0..50u32 {
        let mut s = TcpStream::connect(&server.addr).unwrap();
        let mut bytes = vec![0u8; 48];
        bytes[0] = (i % 64) as u8;
        bytes[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
        let _ = s.write_all(&bytes[..(16 + i as usize % 33)]);
        let _ = s.write_all(&vec![0xa5; (i as usize * 997) % 20000]);
        junk.push(s);
    }
    // A good client still logs in and reads and writes, promptly.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let started = Instant::now();
    rt.block_on(async {
        let opts = ethersan_initiator::LoginOptions {
            target_name: Some(IQN.into()),
            ..Default::default()
        };
        let s = tokio::time::timeout(
            Duration::from_secs(10),
            ethersan_initiator::connect(&server.addr, &opts),
        )
        .await
        .expect("login took more than 10 s under the flood")
        .expect("login refused under the flood");
        s.clear_unit_attention(0).await.unwrap();
        let data = Bytes::from(vec![0x3cu8; 65536]);
        for i in 0..64 {
            assert_eq!(
                s.write16(0, i * 128, data.clone(), 512, false)
                    .await
                    .unwrap()
                    .status,
                0
            );
            let r = s.read16(0, i * 128, 128, 512).await.unwrap();
            assert!(r.status == 0 && r.data == data[..]);
        }
        let _ = s.logout().await;
    });
    println!(
        "good client done in {:?} beside 350 bad connections",
        started.elapsed()
    );
    let during = rss_kib(pid);
    println!("server RSS {before} KiB before, {during} KiB with 350 bad connections open");
    assert!(
        during < before + 64 * 1024,
        "RSS grew by {} KiB for 350 idle or junk connections",
        during - before
    );
    drop(idle);
    drop(junk);
}
