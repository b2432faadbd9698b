//! `max_logins_in_progress`: a flood of connections that never log in,
//! each from its own loopback address (so the per-address limit never
//! applies), holds at most the cap; the rest are closed at once; the
//! places come back when the flood closes or its logins time out, and a
//! normal login then succeeds. The native transport's streams count too.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ethersan_server::config::Config;

use common::IQN;
const CAP: usize = 16;
const FLOOD: usize = 200;
const LOGIN_TIMEOUT_SECS: u64 = 5;

/// A connection to `to` from loopback address 127.0.3.`n` (every
/// 127.0.0.0/8 address is local on Linux).
async fn connect_from(n: usize, to: SocketAddr) -> TcpStream {
    let from: std::net::IpAddr = format!("127.0.3.{}", n % 250 + 1).parse().unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::new(from, 0)).unwrap();
    let s = tokio::time::timeout(Duration::from_secs(5), sock.connect(to))
        .await
        .expect("connect took more than 5 s")
        .unwrap_or_else(|e| panic!("connect from {from}: {e}"));
    s.into_std().unwrap()
}

async fn login(addr: SocketAddr) -> Result<ethersan_initiator::Session, ethersan_initiator::Error> {
    let opts = ethersan_initiator::LoginOptions {
        target_name: Some(IQN.into()),
        timeout: Some(Duration::from_secs(5)),
        ..Default::default()
    };
    ethersan_initiator::connect(&addr.to_string(), &opts).await
}

/// Wait (bounded) until `f` holds.
async fn until(what: &str, limit: Duration, f: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_many_addresses_holds_at_most_the_login_cap() {
    let cfg = Config::from_toml_str(
        &format!(
            "portals = [\"127.0.0.1:0\"]\n\
             [options]\nmax_logins_in_progress = {CAP}\nlogin_timeout_secs = {LOGIN_TIMEOUT_SECS}\n\
             [[target]]\nname = \"{IQN}\"\nlun = [\"ram:4M\"]\n"
        ),
        "test",
    )
    .unwrap();
    let server = ethersan_server::Server::bind(&cfg).await.unwrap();
    let addr = server.local_addrs()[0];
    let registry = server.registry().clone();
    let streams = server.stream_server();
    let logins = registry.logins().clone();
    assert_eq!(logins.limit(), CAP);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(server.run(async {
        let _ = stop_rx.await;
    }));

    // 200 connections from 200 addresses (one each: the per-address limit
    // of 128 is never reached), none sending a byte.
    let started = Instant::now();
    let mut flood = Vec::new();
    for n in 0..FLOOD {
        flood.push(connect_from(n, addr).await);
        assert!(
            logins.in_progress() <= CAP,
            "{} in login",
            logins.in_progress()
        );
    }
    for s in &flood {
        s.set_nonblocking(true).unwrap();
    }
    // Every connection beyond the cap is closed promptly, well before the
    // login timeout; exactly CAP are held.
    let closed = common::closed_by_server(&mut flood, Duration::from_secs(2), Some(FLOOD - CAP));
    let n_closed = closed.iter().filter(|c| **c).count();
    assert!(
        started.elapsed() < Duration::from_secs(LOGIN_TIMEOUT_SECS),
        "the flood took too long to check: {:?}",
        started.elapsed()
    );
    assert_eq!(n_closed, FLOOD - CAP, "closed: {closed:?}");
    assert_eq!(logins.in_progress(), CAP);
    assert_eq!(logins.peak(), CAP, "the cap was exceeded");
    // The login cap refused them, not the per-address limit.
    assert_eq!(logins.refused(), (FLOOD - CAP) as u64);

    // A normal login is refused while the cap is full …
    assert!(login(addr).await.is_err(), "a login got past a full cap");
    // … and so is a native transport stream: closed before anything is read.
    let (client, server_side) = tokio::io::duplex(4096);
    let (rd, wr) = tokio::io::split(server_side);
    tokio::time::timeout(
        Duration::from_secs(2),
        streams.serve(rd, wr, "127.0.0.9:1", Some(0)),
    )
    .await
    .expect("a stream beyond the cap is refused at once");
    drop(client);
    assert_eq!(logins.refused(), (FLOOD - CAP + 2) as u64);

    // Closing the flood gives every place back.
    drop(flood);
    until("the places given back", Duration::from_secs(5), || {
        logins.in_progress() == 0
    })
    .await;
    let s = login(addr).await.expect("login after the flood");
    assert_eq!(
        logins.in_progress(),
        0,
        "a logged-in session holds no place"
    );
    let _ = s.logout().await;

    // A flood that stays open is ended by the login timeout.
    let mut held = Vec::new();
    for n in 0..CAP {
        held.push(connect_from(n, addr).await);
    }
    until("the cap full again", Duration::from_secs(5), || {
        logins.in_progress() == CAP
    })
    .await;
    assert!(login(addr).await.is_err(), "a login got past a full cap");
    until(
        "the login timeout to end the held connections",
        Duration::from_secs(LOGIN_TIMEOUT_SECS + 5),
        || logins.in_progress() == 0,
    )
    .await;
    let s = login(addr).await.expect("login after the login timeout");
    let _ = s.logout().await;
    assert_eq!(logins.peak(), CAP, "the cap was exceeded");
    drop(held);

    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the server stops")
        .unwrap();
}

/// `serve --max-logins-in-progress N`, and the refusals logged as
/// warnings at most once a second, naming the limit.
#[test]
fn serve_caps_logins_on_the_command_line_and_says_so_once_a_second() {
    let server = common::Server::start_with("ram:4M", &["--max-logins-in-progress", "2"]);
    let addr: SocketAddr = server.addr.parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut socks: Vec<TcpStream> = (0..40)
        .map(|n| rt.block_on(connect_from(n, addr)))
        .collect();
    for s in &socks {
        s.set_nonblocking(true).unwrap();
    }
    let closed = common::closed_by_server(&mut socks, Duration::from_secs(3), Some(38));
    assert_eq!(closed.iter().filter(|c| **c).count(), 38, "{closed:?}");
    let log = server.log.lock().unwrap().clone();
    let warnings: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("too many connections in login"))
        .collect();
    assert!(
        !warnings.is_empty()
            && warnings.len() <= 4
            && warnings
                .iter()
                .all(|l| l.contains("limit=2") && l.contains("WARN")),
        "{log:?}"
    );
    assert!(!log
        .iter()
        .any(|l| l.contains("too many connections from one address")));
}
