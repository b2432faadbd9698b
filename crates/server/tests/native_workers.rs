//! The native transport on the pinned workers: a UDP portal is one
//! `SO_REUSEPORT` socket (and endpoint) per worker, clients whose channels
//! hash to different sockets are served at once by different endpoints;
//! `placement = "shared"` keeps one endpoint on the shared runtime.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use ethersan_channel::group::GroupKeys;
use ethersan_channel::Level;
use ethersan_endpoint::{Endpoint, EndpointConfig, Medium, PeerAddr};
use ethersan_initiator::{login_messages, LoginOptions, Session};
use ethersan_server::config::{Config, UdpPortal};
use ethersan_server::native::{self, Native};
use ethersan_server::Server;

const IQN: &str = "iqn.2026-11.org.ethersan:workers";
const GROUP: &str = "wk";
const SECRET: &str = "worker test secret 123";

/// A server with `placement` and two workers, one native UDP portal on
/// loopback port 0, its native transport started.
async fn serve(placement: &str) -> (Server, Native, SocketAddr) {
    let text = format!(
        "portals = [\"127.0.0.1:0\"]\n[options]\nplacement = \"{placement}\"\nworker_threads = 2\nnop_interval_secs = 0\n[[target]]\nname = \"{IQN}\"\nlun = [\"ram:4M,security=none\"]\n"
    );
    let mut cfg = Config::from_toml_str(&text, "test").unwrap();
    cfg.ethernet.group = Some(GROUP.into());
    cfg.ethernet.secret = Some(SECRET.into());
    cfg.ethernet.udp = vec![UdpPortal::parse("127.0.0.1:0").unwrap()];
    let server = Server::bind(&cfg).await.unwrap();
    let native = native::start(&cfg, server.stream_server(), server.registry().clone())
        .await
        .unwrap();
    server.start();
    let addr = match native.endpoints[0].medium() {
        Medium::Udp { socket, .. } => socket.local_addr().unwrap(),
        other => panic!("not UDP: {other:?}"),
    };
    for e in &native.endpoints {
        match e.medium() {
            Medium::Udp { socket, .. } => assert_eq!(socket.local_addr().unwrap(), addr),
            other => panic!("not UDP: {other:?}"),
        }
    }
    (server, native, addr)
}

fn keys() -> GroupKeys {
    GroupKeys::derive(GROUP, SECRET.as_bytes()).unwrap()
}

/// A client endpoint on a UDP socket bound to 127.0.0.1:`port` (0: any),
/// logged in to the target over a channel without protection.
async fn client(target: SocketAddr, port: u16) -> Option<(Endpoint, Session)> {
    let sock = tokio::net::UdpSocket::bind(("127.0.0.1", port))
        .await
        .ok()?;
    let ep = Endpoint::initiator(
        Medium::udp(sock, 9000).unwrap(),
        EndpointConfig::new(keys()),
    );
    let stream = ep
        .connect(PeerAddr::Udp(target), Level::None, Duration::from_secs(10))
        .await
        .unwrap();
    let opts = LoginOptions {
        target_name: Some(IQN.into()),
        timeout: Some(Duration::from_secs(10)),
        ..LoginOptions::default()
    };
    let s = login_messages(stream.into_messages(), &opts).await.unwrap();
    Some((ep, s))
}

/// Open channels on each of the target's endpoints.
async fn channels_per_endpoint(native: &Native) -> Vec<usize> {
    let mut v = Vec::new();
    for e in &native.endpoints {
        v.push(e.stats().await.unwrap().len());
    }
    v
}

/// Write a block and read it back on every session, all at once.
async fn io_on_all(sessions: &[Session]) {
    let mut all = tokio::task::JoinSet::new();
    for (i, s) in sessions.iter().enumerate() {
        let s = s.clone();
        all.spawn(async move {
            let data = Bytes::from(vec![i as u8 + 1; 512]);
            let lba = i as u64;
            s.clear_unit_attention(0).await.unwrap();
            let w = s.write16(0, lba, data.clone(), 512, false).await.unwrap();
            assert_eq!(w.status, 0, "write on session {i}");
            let r = s.read16(0, lba, 1, 512).await.unwrap();
            assert_eq!(r.status, 0, "read on session {i}");
            assert_eq!(r.data, data, "read back on session {i}");
        });
    }
    while let Some(r) = all.join_next().await {
        r.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_udp_portal_is_served_by_every_pinned_worker() {
    let (_server, native, addr) = serve("pinned").await;
    assert_eq!(native.endpoints.len(), 2, "one endpoint per worker");
    // Clients from successive source ports until channels sit on both
    // sockets (the kernel's hash of the 4-tuple decides; bounded).
    let mut clients = Vec::new();
    let base = 20000 + (std::process::id() % 20000) as u16;
    for k in 0..64u16 {
        let Some(c) = client(addr, base + k * 7).await else {
            continue;
        };
        clients.push(c);
        let per = channels_per_endpoint(&native).await;
        if clients.len() >= 3 && per.iter().all(|&n| n > 0) {
            break;
        }
    }
    let per = channels_per_endpoint(&native).await;
    assert_eq!(per.iter().sum::<usize>(), clients.len(), "{per:?}");
    assert!(
        per.iter().all(|&n| n > 0),
        "every worker's endpoint accepted a channel: {per:?} after {} clients",
        clients.len()
    );
    // Every session is served at once, whichever worker runs it.
    let (eps, sessions): (Vec<_>, Vec<_>) = clients.into_iter().unzip();
    io_on_all(&sessions).await;
    for s in &sessions {
        s.logout().await.unwrap();
    }
    drop(eps);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_placement_keeps_one_endpoint_and_serves() {
    let (_server, native, addr) = serve("shared").await;
    assert_eq!(native.endpoints.len(), 1);
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(addr, 0).await.expect("a client"));
    }
    assert_eq!(channels_per_endpoint(&native).await, vec![3]);
    let (_eps, sessions): (Vec<_>, Vec<_>) = clients.into_iter().unzip();
    io_on_all(&sessions).await;
    for s in &sessions {
        s.logout().await.unwrap();
    }
}
