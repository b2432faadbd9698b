//! The native transport on the pinned workers: a UDP portal is one
//! `SO_REUSEPORT` socket (and endpoint) per worker, clients whose channels
//! hash to different sockets are served at once by different endpoints;
//! `placement = "shared"` keeps one endpoint on the shared runtime. A raw
//! Ethernet interface is one packet socket (and endpoint) per worker in a
//! `PACKET_FANOUT` group spread by source MAC: clients with different MACs
//! land on different endpoints.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use ethersan_channel::group::GroupKeys;
use ethersan_channel::Level;
use ethersan_endpoint::{Endpoint, EndpointConfig, Medium, PeerAddr};
use ethersan_initiator::{login_messages, LoginOptions, Session};
use ethersan_link::packet::{PacketConfig, PacketLink, RingVersion};
use ethersan_link::{Link, MacAddr};
use ethersan_server::config::{AoeLink, Config, UdpPortal};
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
    channels_on(&native.endpoints).await
}

/// Each client's channel sits on exactly one of the target's endpoints
/// (`per`: how many each holds) and every endpoint holds one; then every
/// session does I/O at once, whichever worker runs it, and logs out.
async fn spread_and_served(per: Vec<usize>, clients: Vec<(Endpoint, Session)>) {
    assert_eq!(per.iter().sum::<usize>(), clients.len(), "{per:?}");
    assert!(
        per.iter().all(|&n| n > 0),
        "every endpoint accepted a channel: {per:?} after {} clients",
        clients.len()
    );
    let (eps, sessions): (Vec<_>, Vec<_>) = clients.into_iter().unzip();
    io_on_all(&sessions).await;
    for s in &sessions {
        s.logout().await.unwrap();
    }
    drop(eps);
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
    spread_and_served(channels_per_endpoint(&native).await, clients).await;
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

/// `ip ARGS`, which must succeed.
fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("iproute2's ip (scripts/test installs it)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` on a new thread inside network namespace `ns` (threads it
/// starts, a tokio runtime's among them, stay there).
fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    use std::os::fd::AsRawFd;
    let path = format!("/run/netns/{ns}");
    std::thread::scope(|s| {
        s.spawn(move || {
            let file = std::fs::File::open(&path).unwrap();
            // SAFETY: setns on this thread only, with a namespace fd we
            // hold open.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}");
            f()
        })
        .join()
        .unwrap()
    })
}

/// A target namespace and a client namespace joined by a veth pair; the
/// client side carries `macvlan` interfaces, each a client with its own MAC.
struct Lan {
    ns: [String; 2],
    ifname: [String; 2],
}

impl Lan {
    fn new(tag: &str) -> Lan {
        let pid = std::process::id();
        let n = pid % 100_000;
        let lan = Lan {
            ns: [format!("fo-{pid}-{tag}-t"), format!("fo-{pid}-{tag}-c")],
            ifname: [format!("fo{n}{tag}t"), format!("fo{n}{tag}c")],
        };
        for ns in &lan.ns {
            ip(&["netns", "add", ns]);
        }
        #[rustfmt::skip]
        ip(&["link", "add", &lan.ifname[0], "netns", &lan.ns[0], "mtu", "9000", "type", "veth",
             "peer", "name", &lan.ifname[1], "netns", &lan.ns[1], "mtu", "9000"]);
        for i in 0..2 {
            ip(&["-n", &lan.ns[i], "link", "set", &lan.ifname[i], "up"]);
        }
        lan
    }

    /// A client interface on the client side with MAC `02:66:6f:00:00:k`.
    fn client_interface(&self, k: u8) -> String {
        let name = format!("{}m{k}", self.ifname[1]);
        let mac = format!("02:66:6f:00:00:{k:02x}");
        #[rustfmt::skip]
        ip(&["-n", &self.ns[1], "link", "add", &name, "link", &self.ifname[1], "address", &mac,
             "type", "macvlan", "mode", "bridge"]);
        ip(&["-n", &self.ns[1], "link", "set", &name, "up"]);
        name
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", ns])
                .status();
        }
    }
}

/// The server of [`serve`] with the native transport on the target's
/// veth end instead of UDP, run on a runtime inside the target's
/// namespace until `stop` is dropped; returns the native endpoints.
fn serve_ethernet(
    lan: &Lan,
    placement: &str,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> (Vec<Endpoint>, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (ns, ifname) = (lan.ns[0].clone(), lan.ifname[0].clone());
    let text = format!(
        "portals = [\"127.0.0.1:0\"]\n[options]\nplacement = \"{placement}\"\nworker_threads = 2\nnop_interval_secs = 0\n[[target]]\nname = \"{IQN}\"\nlun = [\"ram:4M,security=none\"]\n"
    );
    let thread = std::thread::spawn(move || {
        in_netns(&ns, move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut cfg = Config::from_toml_str(&text, "test").unwrap();
                cfg.ethernet.group = Some(GROUP.into());
                cfg.ethernet.secret = Some(SECRET.into());
                cfg.ethernet.links = vec![AoeLink::Interface(ifname)];
                let server = Server::bind(&cfg).await.unwrap();
                let native = native::start(&cfg, server.stream_server(), server.registry().clone())
                    .await
                    .unwrap();
                server.start();
                tx.send(native.endpoints.clone()).unwrap();
                let _ = stop.await;
                drop(native);
                drop(server);
            });
        })
    });
    let eps = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the server started");
    (eps, thread)
}

/// A client endpoint on `ifname` in the client's namespace, logged in to
/// the target at `target` over a channel without protection.
async fn ethernet_client(lan: &Lan, ifname: &str, target: MacAddr) -> (Endpoint, Session) {
    let handle = tokio::runtime::Handle::current();
    let cfg = PacketConfig {
        ring: RingVersion::V2,
        ..PacketConfig::new(ifname, ethersan_channel::ETHERTYPE_NATIVE)
    };
    let link = in_netns(&lan.ns[1], move || {
        let _rt = handle.enter();
        PacketLink::open(cfg).unwrap()
    });
    let ep = Endpoint::initiator(
        Medium::Ethernet(std::sync::Arc::new(Link::from(link))),
        EndpointConfig::new(keys()),
    );
    let stream = ep
        .connect(PeerAddr::Mac(target), Level::None, Duration::from_secs(10))
        .await
        .unwrap();
    let opts = LoginOptions {
        target_name: Some(IQN.into()),
        timeout: Some(Duration::from_secs(10)),
        ..LoginOptions::default()
    };
    let s = login_messages(stream.into_messages(), &opts).await.unwrap();
    (ep, s)
}

/// Channels open on each endpoint of `eps`.
async fn channels_on(eps: &[Endpoint]) -> Vec<usize> {
    let mut v = Vec::new();
    for e in eps {
        v.push(e.stats().await.unwrap().len());
    }
    v
}

async fn over_ethernet(placement: &str, endpoints: usize) {
    let lan = Lan::new(&placement[..1]);
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let (eps, thread) = serve_ethernet(&lan, placement, stopped);
    assert_eq!(eps.len(), endpoints, "endpoints with placement {placement}");
    let target = match eps[0].medium() {
        Medium::Ethernet(l) => l.mac(),
        other => panic!("not Ethernet: {other:?}"),
    };
    // Clients with successive MACs until channels sit on every endpoint
    // (the fanout's hash of the MAC decides; bounded).
    let mut clients = Vec::new();
    for k in 1..=8u8 {
        let ifname = lan.client_interface(k);
        clients.push(ethernet_client(&lan, &ifname, target).await);
        let per = channels_on(&eps).await;
        if clients.len() >= 2 && per.iter().all(|&n| n > 0) {
            break;
        }
    }
    // Each channel on exactly one endpoint: none seen twice.
    spread_and_served(channels_on(&eps).await, clients).await;
    drop(stop);
    thread.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ethernet_link_is_fanned_out_over_the_pinned_workers() {
    over_ethernet("pinned", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ethernet_link_with_shared_placement_is_one_endpoint() {
    over_ethernet("shared", 1).await;
}
