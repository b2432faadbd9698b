//! The daemon as `ethersan serve` runs it, in-process: it starts the
//! embedded default with every listener on port 0, stops in the order of
//! [`Stage`] leaving no task, listener or socket behind, and a SIGHUP
//! applies its configuration file again.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ethersan_daemon::{Daemon, DaemonOptions, Stage};
use ethersan_server::config::Config;

/// Options whose banner lines are kept in `lines`.
fn options(lines: &Arc<Mutex<Vec<String>>>) -> DaemonOptions {
    let kept = lines.clone();
    DaemonOptions {
        say: Arc::new(move |l| kept.lock().unwrap().push(l.to_string())),
        ..DaemonOptions::default()
    }
}

fn loopback_any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Whether something accepts TCP connections at `addr`.
async fn accepts(addr: SocketAddr) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_ok()
}

/// Tasks alive on this runtime, once the count has come down to `want`
/// (aborted tasks end at their next poll), or after 5 s, what is left.
async fn alive_tasks_settle_to(want: usize) -> usize {
    let rt = tokio::runtime::Handle::current();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let n = rt.metrics().num_alive_tasks();
        if n <= want || tokio::time::Instant::now() > deadline {
            return n;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_default_starts_and_stops_in_order_leaving_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut cfg = Config::embedded_default(&data);
    cfg.portals = vec![loopback_any_port()];
    let token = dir.path().join("token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let opts = DaemonOptions {
        api_tcp: Some(loopback_any_port()),
        api_token_file: Some(token),
        metrics: Some(loopback_any_port()),
        ..options(&lines)
    };
    let before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();

    let daemon = Daemon::start(cfg, opts).await.expect("the daemon starts");
    let running = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    // The portal's accept loop, the API's three listeners, SIGHUP.
    assert!(
        running >= before + 5,
        "{running} tasks running, {before} before"
    );
    // The data directory was made for the default LUN's file.
    assert!(data.join("default-lun0.img").is_file());
    let portal = daemon.server().local_addrs()[0];
    assert_ne!(portal.port(), 0, "the real port is known");
    let socket = daemon.api_socket().expect("an API socket").to_path_buf();
    assert_eq!(socket, data.join("ethersan.sock"));
    assert!(socket.exists(), "the API socket is made");
    let (api, metrics) = (daemon.api_addr().unwrap(), daemon.metrics_addr().unwrap());
    assert!(accepts(api).await && accepts(metrics).await);
    let said = lines.lock().unwrap().join("\n");
    for want in [
        format!("ethersan: listening on {portal}"),
        format!("ethersan: management API and dashboard on http://{api}/"),
        format!("ethersan: metrics on http://{metrics}/metrics"),
        "ethersan: management API on ".to_string(),
        format!("ethersan: connect with\n  libiscsi/QEMU: iscsi://{portal}/iqn.2026-11.org.ethersan:default/0"),
    ] {
        assert!(said.contains(&want), "no {want:?} in:\n{said}");
    }
    assert!(accepts(portal).await, "the portal accepts");
    // The connection just made is refused at the login's first read;
    // let its task end before counting.
    tokio::time::sleep(Duration::from_millis(50)).await;

    let stages = daemon.shutdown().await;
    assert_eq!(
        stages,
        [
            Stage::StopAccepting,
            Stage::EndSessions,
            Stage::Flush,
            Stage::Deregister,
            Stage::CloseManagement,
        ]
    );
    assert!(!socket.exists(), "the API socket is removed");
    assert!(!accepts(portal).await, "the portal still accepts");
    assert!(!accepts(api).await, "the TCP API still accepts");
    assert!(!accepts(metrics).await, "/metrics still accepts");
    let left = alive_tasks_settle_to(before).await;
    assert_eq!(left, before, "tasks left running after the shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_applies_the_configuration_file_again() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ethersan.toml");
    let one = "portals = [\"127.0.0.1:0\"]\n[options]\nplacement = \"shared\"\n[[target]]\nname = \"iqn.2026-11.org.x:one\"\nlun = [\"ram:1M\"]\n";
    std::fs::write(&file, one).unwrap();
    let mut cfg = Config::from_toml_file(&file).unwrap();
    cfg.options.data_dir = dir.path().to_path_buf();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let opts = DaemonOptions {
        config_file: Some(file.clone()),
        api_socket: Some(dir.path().join("api.sock")),
        ..options(&lines)
    };
    let daemon = Daemon::start(cfg, opts).await.expect("the daemon starts");
    let names = |d: &Daemon| -> Vec<String> {
        d.server()
            .registry()
            .targets()
            .iter()
            .map(|t| t.name.clone())
            .collect()
    };
    assert_eq!(names(&daemon), ["iqn.2026-11.org.x:one"]);

    let two = format!("{one}[[target]]\nname = \"iqn.2026-11.org.x:two\"\nlun = [\"ram:1M\"]\n");
    std::fs::write(&file, two).unwrap();
    let mut reloads = daemon.reloads();
    // SAFETY: raise(3) with a constant signal; the daemon installed its
    // SIGHUP handler at start, so the process is not ended by it.
    unsafe {
        libc::raise(libc::SIGHUP);
    }
    tokio::time::timeout(Duration::from_secs(10), reloads.changed())
        .await
        .expect("the SIGHUP is handled within 10 s")
        .unwrap();
    assert_eq!(
        names(&daemon),
        ["iqn.2026-11.org.x:one", "iqn.2026-11.org.x:two"]
    );
    daemon.shutdown().await;
}

#[test]
fn check_says_what_would_be_served_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = Config::embedded_default(&data);
    let out = ethersan_daemon::check(&cfg).unwrap();
    assert!(
        out.starts_with("  portal 127.0.0.1:3260\n  target iqn.2026-11.org.ethersan:default\n"),
        "{out}"
    );
    assert!(
        out.contains("    LUN 0: ") && out.contains("will be created in a new data directory"),
        "{out}"
    );
    assert!(!data.exists(), "--check made the data directory");
}
