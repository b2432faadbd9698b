//! Three hundred idle half-open connections and a stream of garbage must
//! not stop a good client from logging in and doing I/O, and the server's
//! memory stays bounded. One address opening more connections than
//! `max_connections_per_address` gets the excess closed at once, and a
//! client from another address is not affected.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Server, IQN};

/// A TCP connection to `to` from source address `from` (any loopback
/// address works on Linux: 127.0.0.0/8 is all local).
async fn connect_from_async(from: &str, to: &str) -> std::io::Result<tokio::net::TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.bind(SocketAddr::new(from.parse().unwrap(), 0))?;
    sock.connect(to.parse().unwrap()).await
}

fn connect_from(rt: &tokio::runtime::Runtime, from: &str, to: &str) -> TcpStream {
    let s = rt
        .block_on(connect_from_async(from, to))
        .unwrap_or_else(|e| panic!("connect from {from}: {e}"));
    let s = s.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

/// Log in from source address `from` with ethersan's initiator over a
/// bound socket, then write and read back `rounds` × 64 KiB.
async fn good_client_from(from: &str, addr: &str, rounds: u64) {
    let opts = ethersan_initiator::LoginOptions {
        target_name: Some(IQN.into()),
        ..Default::default()
    };
    let s = tokio::time::timeout(Duration::from_secs(10), async {
        let sock = connect_from_async(from, addr).await?;
        // Really from `from`: an unbound socket would come from 127.0.0.1
        // and be counted with the flood.
        assert_eq!(sock.local_addr()?.ip().to_string(), from);
        let _ = sock.set_nodelay(true);
        let (rd, wr) = sock.into_split();
        ethersan_initiator::login(rd, wr, &opts).await
    })
    .await
    .expect("login took more than 10 s under the flood")
    .unwrap_or_else(|e| panic!("login from {from} refused under the flood: {e}"));
    s.clear_unit_attention(0).await.unwrap();
    let data = Bytes::from(vec![0x3cu8; 65536]);
    for i in 0..rounds {
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
}

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
    let rt = tokio::runtime::Runtime::new().unwrap();
    // 300 connections that never log in, from 20 addresses (15 each, under
    // the default 128 per address, so all of them are held open).
    let idle: Vec<TcpStream> = (0..300)
        .map(|i| connect_from(&rt, &format!("127.0.1.{}", i % 20 + 1), &server.addr))
        .collect();
    // 50 connections that send garbage: random bytes, a BHS claiming a
    // huge data segment, half a header.
    let mut junk = Vec::new();
    for i in 0..50u32 {
        let mut s = connect_from(&rt, &format!("127.0.2.{}", i % 10 + 1), &server.addr);
        let mut bytes = [0u8; 48];
        bytes[0] = (i % 64) as u8;
        bytes[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
        let _ = s.write_all(&bytes[..(16 + i as usize % 33)]);
        let _ = s.write_all(&vec![0xa5; (i as usize * 997) % 20000]);
        junk.push(s);
    }
    // A good client still logs in and reads and writes, promptly.
    let started = Instant::now();
    rt.block_on(good_client_from("127.0.0.2", &server.addr, 64));
    // None of the flood was refused: it was within every limit.
    let log = server.log.lock().unwrap().join("\n");
    assert!(
        !log.contains("too many connections"),
        "connections under the limit were refused: {log}"
    );
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

#[test]
fn one_address_over_its_connection_limit_does_not_lock_out_another() {
    const LIMIT: usize = 8;
    let server = Server::start_with(
        "ram:16M",
        &["--max-connections-per-address", &LIMIT.to_string()],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    // 127.0.0.1 opens five times its limit and keeps them all open.
    let mut flood: Vec<TcpStream> = (0..5 * LIMIT)
        .map(|_| connect_from(&rt, "127.0.0.1", &server.addr))
        .collect();
    // Meanwhile 127.0.0.2 logs in and does I/O.
    rt.block_on(good_client_from("127.0.0.2", &server.addr, 16));
    // The excess was closed at once (no PDU was ever sent); the first
    // LIMIT stay open, waiting for a login.
    let closed = common::closed_by_server(&mut flood, Duration::from_secs(3), None);
    let n_closed = closed.iter().filter(|c| **c).count();
    assert_eq!(
        n_closed,
        4 * LIMIT,
        "expected the {} connections beyond the limit closed: {closed:?}",
        4 * LIMIT
    );
    assert!(
        closed[..LIMIT].iter().all(|c| !c),
        "the first connections were admitted: {closed:?}"
    );
    // 127.0.0.1 still cannot open another one while its LIMIT are open …
    let mut extra = vec![connect_from(&rt, "127.0.0.1", &server.addr)];
    assert_eq!(
        common::closed_by_server(&mut extra, Duration::from_secs(2), None),
        [true]
    );
    // … until they close: every place is given back.
    drop(flood);
    drop(extra);
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        rt.block_on(good_client_from("127.0.0.1", &server.addr, 1));
    }
    let held: Vec<TcpStream> = (0..LIMIT - 1)
        .map(|_| connect_from(&rt, "127.0.0.1", &server.addr))
        .collect();
    rt.block_on(good_client_from("127.0.0.1", &server.addr, 1));
    drop(held);
    // The refusals were logged with the address, but not once each.
    let log = server.log.lock().unwrap().clone();
    let warnings: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("too many connections"))
        .collect();
    assert!(
        !warnings.is_empty() && warnings.iter().all(|l| l.contains("127.0.0.1")),
        "{log:?}"
    );
    assert!(
        warnings.len() <= 3,
        "{} refusals logged {} times: not rate-limited",
        4 * LIMIT + 1,
        warnings.len()
    );
}
