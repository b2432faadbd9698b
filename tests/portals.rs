//! Live portals: added and removed while sessions run (the `Portals`
//! handle the management API uses, and a SIGHUP reload of `portals`), with
//! SendTargets following the live list and announcing advertised
//! addresses. Loopback only: an advertised address may appear in a
//! SendTargets answer, but nothing connects to it.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{free_port, Server, IQN};
use ethersan_server::config::Config;
use ethersan_server::portals::{PortalError, PortalInfo};

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn opts() -> ethersan_initiator::LoginOptions {
    ethersan_initiator::LoginOptions {
        target_name: Some(IQN.into()),
        timeout: Some(Duration::from_secs(10)),
        ..Default::default()
    }
}

/// A session through `portal`, its unit attention cleared.
async fn session(portal: SocketAddr) -> ethersan_initiator::Session {
    let s = ethersan_initiator::connect(&portal.to_string(), &opts())
        .await
        .unwrap_or_else(|e| panic!("login through {portal}: {e}"));
    s.clear_unit_attention(0).await.unwrap();
    s
}

/// Write and read back one 64 KiB block at `block`: the session works.
async fn io(s: &ethersan_initiator::Session, block: u64, fill: u8) {
    let data = Bytes::from(vec![fill; 65536]);
    let w = s.write16(0, block, data.clone(), 512, false).await.unwrap();
    assert_eq!(w.status, 0, "write");
    let r = s.read16(0, block, 128, 512).await.unwrap();
    assert!(r.status == 0 && r.data == data[..], "read back");
}

/// The TargetAddress values SendTargets gives for the target, asked
/// through `portal`.
async fn target_addresses(portal: SocketAddr) -> Vec<String> {
    let found = tokio::time::timeout(
        Duration::from_secs(10),
        ethersan_initiator::discover(&portal.to_string(), "iqn.2026-11.org.test:disc"),
    )
    .await
    .expect("discovery took more than 10 s")
    .unwrap_or_else(|e| panic!("discovery through {portal}: {e}"));
    found
        .into_iter()
        .find(|(name, _)| name == IQN)
        .unwrap_or_else(|| panic!("{IQN} not listed"))
        .1
}

/// Whether a TCP connection to `portal` is refused (within 2 s).
async fn refused(portal: SocketAddr) -> bool {
    match tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(portal),
    )
    .await
    {
        Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        Ok(Ok(_)) | Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_added_and_removed_while_sessions_run() {
    let cfg = Config::from_toml_str(
        &format!(
            "portals = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\nlun = [\"ram:16M\"]\n"
        ),
        "test",
    )
    .unwrap();
    let server = ethersan_server::Server::bind(&cfg).await.unwrap();
    let portals = server.portals();
    let registry = server.registry().clone();
    let first = portals.list()[0].address;
    assert_ne!(first.port(), 0, "the real port is listed");
    // A portal added before the server runs accepts once it runs.
    let early = portals.add(addr("127.0.0.1:0"), None).await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(server.run(async {
        let _ = stop_rx.await;
    }));
    let s_first = session(first).await;
    io(&s_first, 0, 0x11).await;
    let s_early = session(early).await;
    io(&s_early, 128, 0x12).await;
    portals.remove(early).unwrap();

    // Added while running, announced as another address.
    let advertised = addr("10.0.0.5:3260");
    let second = portals
        .add(addr("127.0.0.1:0"), Some(advertised))
        .await
        .unwrap();
    assert_eq!(
        portals.list(),
        [
            PortalInfo {
                address: first,
                advertise: None
            },
            PortalInfo {
                address: second,
                advertise: Some(advertised)
            }
        ]
    );
    assert_eq!(registry.portal_addrs(), [first, second]);
    // SendTargets through either portal lists both, the new one as its
    // advertised address.
    for through in [first, second] {
        assert_eq!(
            target_addresses(through).await,
            [format!("{first},1"), "10.0.0.5:3260,1".to_string()],
            "through {through}"
        );
    }
    // A session through the new portal.
    let s_second = session(second).await;
    io(&s_second, 256, 0x22).await;
    // The same address twice is refused, saying what to do.
    let e = portals.add(second, None).await.unwrap_err();
    assert!(
        matches!(e, PortalError::AlreadyListening { .. }) && e.to_string().contains("remove"),
        "{e}"
    );

    // Removed: new connections are refused at once, the sessions on both
    // portals go on, SendTargets no longer lists it.
    portals.remove(second).unwrap();
    assert!(refused(second).await, "{second} still accepts");
    assert!(refused(early).await, "{early} still accepts");
    io(&s_second, 384, 0x23).await;
    io(&s_first, 512, 0x13).await;
    io(&s_early, 640, 0x14).await;
    assert_eq!(target_addresses(first).await, [format!("{first},1")]);
    assert_eq!(registry.portal_addrs(), [first]);

    // The last portal stays; an unknown one is an error naming the portals.
    let e = portals.remove(first).unwrap_err();
    assert!(
        matches!(e, PortalError::LastPortal { .. }) && e.to_string().contains("add another"),
        "{e}"
    );
    let e = portals.remove(second).unwrap_err();
    assert!(
        matches!(e, PortalError::NotFound { .. }) && e.to_string().contains(&first.to_string()),
        "{e}"
    );
    // A port in use elsewhere: the bind error says what to do.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let e = portals
        .add(busy.local_addr().unwrap(), None)
        .await
        .unwrap_err();
    assert!(
        matches!(e, PortalError::Bind { .. }) && e.to_string().contains("choose another portal"),
        "{e}"
    );
    // The portal that stays serves new sessions.
    let s_again = session(first).await;
    io(&s_again, 768, 0x15).await;
    for s in [s_first, s_early, s_second, s_again] {
        let _ = s.logout().await;
    }
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the server stops")
        .unwrap();
    let e = portals.add(addr("127.0.0.1:0"), None).await.unwrap_err();
    assert!(matches!(e, PortalError::Stopped), "{e}");
}

fn config_text(portals: &str) -> String {
    format!("portals = [{portals}]\n[[target]]\nname = \"{IQN}\"\nlun = [\"ram:16M\"]\n")
}

#[test]
fn sighup_applies_a_change_of_portals_live() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("portals.toml");
    let (p1, p2) = (free_port(), free_port());
    let a1 = addr(&format!("127.0.0.1:{p1}"));
    let a2 = addr(&format!("127.0.0.1:{p2}"));
    std::fs::write(&file, config_text(&format!("\"{a1}\""))).unwrap();
    let server = Server::start_args(&[
        "serve".into(),
        "--config".into(),
        file.display().to_string(),
    ]);
    assert_eq!(server.addrs, [a1.to_string()]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let s1 = rt.block_on(session(a1));
    rt.block_on(io(&s1, 0, 0x31));
    assert_eq!(rt.block_on(target_addresses(a1)), [format!("{a1},1")]);
    // The file now listens on another port only, advertised as another
    // loopback address (which nothing connects to).
    let advertised = format!("127.0.0.2:{p2}");
    std::fs::write(
        &file,
        config_text(&format!(
            "{{ listen = \"{a2}\", advertise = \"{advertised}\" }}"
        )),
    )
    .unwrap();
    // SAFETY: kill(2) with the pid of the child we spawned; no memory involved.
    unsafe {
        libc::kill(server.child.id() as libc::pid_t, libc::SIGHUP);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.block_on(refused(a2)) || !rt.block_on(refused(a1)) {
        assert!(
            Instant::now() < deadline,
            "the reload did not move the portal: {:?}",
            server.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // SendTargets through the new portal announces the advertised address.
    assert_eq!(
        rt.block_on(target_addresses(a2)),
        [format!("{advertised},1")]
    );
    // A session through the new portal; the one through the removed
    // portal goes on.
    let s2 = rt.block_on(session(a2));
    rt.block_on(io(&s2, 128, 0x32));
    rt.block_on(io(&s1, 256, 0x33));
    let log = server.log.lock().unwrap().join("\n");
    assert!(
        log.contains(&format!("added portal {a2} (advertised as {advertised})"))
            && log.contains(&format!("removed portal {a1}")),
        "{log}"
    );
    assert!(!log.contains("next restart"), "{log}");
    // A portal that cannot be bound fails the whole reload: nothing changes.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std::fs::write(
        &file,
        config_text(&format!("\"{a2}\", \"{}\"", busy.local_addr().unwrap())),
    )
    .unwrap();
    // SAFETY: as above.
    unsafe {
        libc::kill(server.child.id() as libc::pid_t, libc::SIGHUP);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("failed, nothing changed"))
    {
        assert!(
            Instant::now() < deadline,
            "no failed reload: {:?}",
            server.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        rt.block_on(target_addresses(a2)),
        [format!("{advertised},1")]
    );
    for s in [s1, s2] {
        let _ = rt.block_on(s.logout());
    }
}

#[test]
fn serve_advertise_on_the_command_line() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let advertised = format!("127.0.0.2:{port}");
    let server = Server::start_args(&[
        "serve".into(),
        "--target".into(),
        IQN.into(),
        "--lun".into(),
        "ram:4M".into(),
        "--listen".into(),
        listen.clone(),
        "--advertise".into(),
        format!("{listen}={advertised}"),
    ]);
    // libiscsi's iscsi-ls sees the advertised address.
    common::require_tool("iscsi-ls");
    let out = common::must_run(
        "iscsi-ls",
        &[
            "-i",
            "iqn.2026-11.org.test:ls",
            &format!("iscsi://{listen}"),
        ],
        Duration::from_secs(30),
    );
    assert!(
        out.contains(IQN) && out.contains(&advertised) && !out.contains(&listen),
        "{out}"
    );
    drop(server);
    // Mistakes are named.
    for (arg, what) in [
        (listen.clone(), "LISTEN=ADVERTISED"),
        (format!("{listen}=nowhere"), "ADVERTISED \"nowhere\""),
        (format!("{listen}=0.0.0.0:3260"), "cannot be reached"),
        (
            format!("127.0.0.9:1={advertised}"),
            "is not a portal; give it with --listen",
        ),
    ] {
        let o = common::ethersan(&[
            "serve",
            "--listen",
            &listen,
            "--lun",
            "ram:1M",
            "--advertise",
            &arg,
        ]);
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!o.status.success() && all.contains(what), "{arg}: {all}");
    }
}

/// A portal on every address (`--listen 0.0.0.0:3260`, as the packaged
/// configuration has it) seen from another host: SendTargets names the
/// address the initiator reached, never 0.0.0.0, and libiscsi logs in
/// there; the start-up hints name the host's real address. Two network
/// namespaces joined by a veth pair stand for the two hosts.
#[test]
fn a_wildcard_portal_is_announced_as_the_address_the_initiator_reached() {
    common::require_tool("iscsi-ls");
    let veth = common::netns::Veth::new("portal", 1500);
    let target_ip = common::netns::Veth::TARGET_IP;
    let api_dir = tempfile::tempdir().unwrap();
    let api = api_dir.path().join("api.sock");
    let server = veth.serve(&[
        "serve".into(),
        "--target".into(),
        IQN.into(),
        "--listen".into(),
        "0.0.0.0:3260".into(),
        "--lun".into(),
        "ram:4M".into(),
        "--api-socket".into(),
        api.display().to_string(),
    ]);
    let reached = format!("{target_ip}:3260");
    // The hint lines follow "connect with", which the start waits for.
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = server.log.lock().unwrap().join("\n");
        if log.contains("--login") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        log.contains(&format!("answers on this host's addresses: {reached}"))
            && log.contains(&format!("-p {reached} --login"))
            && !log.contains("-p 0.0.0.0"),
        "the hints name the host's address: {log}"
    );
    // `ctl portal ls` says where the wildcard portal is reached.
    let ls = common::ok(&common::ethersan(&[
        "ctl",
        "--socket",
        &api.display().to_string(),
        "portal",
        "ls",
    ]));
    assert!(
        ls.contains(&format!("0.0.0.0:3260 (reached at {reached}")),
        "ctl portal ls: {ls}"
    );
    let in_ns = |ns: &str, args: &[&str]| {
        let mut all = vec!["netns", "exec", ns];
        all.extend_from_slice(args);
        common::run("ip", &all, Duration::from_secs(30))
    };
    // From the other host: discovery, then a login to each address it
    // names (-s lists the LUNs).
    let url = format!("iscsi://{reached}");
    let out = in_ns(
        &veth.ns[1],
        &["iscsi-ls", "-s", "-i", "iqn.2026-11.org.test:ls", &url],
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success()
            && text.contains(&format!("Portal:{reached},1"))
            && text.contains("Lun:0")
            && !text.contains("0.0.0.0"),
        "iscsi-ls -s from the other host: {text}"
    );
    let out = veth.in_client(&["discover", &reached], Duration::from_secs(30));
    let text = common::ok(&out);
    assert!(
        text.contains(&reached) && !text.contains("0.0.0.0"),
        "ethersan discover: {text}"
    );
    // On the target host itself, over loopback: announced as 127.0.0.1.
    let out = in_ns(
        &veth.ns[0],
        &[
            "iscsi-ls",
            "-i",
            "iqn.2026-11.org.test:ls",
            "iscsi://127.0.0.1:3260",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Portal:127.0.0.1:3260,1") && !text.contains(&reached),
        "iscsi-ls over loopback: {text}"
    );
}
