//! iSNS registration against Debian's open-isns server (`isnsd`), queried
//! with `isnsadm`: targets, portals and discovery domains appear, follow a
//! live reconfiguration (SIGHUP), and disappear at shutdown; an
//! unreachable or silent iSNS server neither stops serving nor hangs
//! shutdown. Everything on 127.0.0.1.

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, must_run, require_tool, Server};

const OPEN: &str = "iqn.2026-11.org.ethersan.test:open";
const ACL: &str = "iqn.2026-11.org.ethersan.test:acl";
const INIT1: &str = "iqn.2026-11.org.example:init1";
const OTHER: &str = "iqn.2026-11.org.example:other";

/// `isnsd -f` on 127.0.0.1, in-memory database, no security, a default
/// discovery domain; killed when dropped.
struct Isnsd {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Isnsd {
    fn start(dir: &Path) -> Isnsd {
        require_tool("isnsd");
        require_tool("isnsadm");
        let port = free_port();
        let conf = dir.join("isnsd.conf");
        std::fs::write(
            &conf,
            format!(
                "SourceName = iqn.2026-11.org.ethersan.test:isnsd\n\
                 BindAddress = 127.0.0.1:{port}\n\
                 PIDFile = {d}/isnsd.pid\n\
                 ControlSocket = {d}/isnsctl\n\
                 Security = 0\n\
                 DefaultDiscoveryDomain = 1\n\
                 SLPRegister = 0\n\
                 ESIRetries = 0\n\
                 RegistrationPeriod = 10m\n",
                d = dir.display()
            ),
        )
        .unwrap();
        let child = Command::new("isnsd")
            .args(["-f", "-c"])
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start isnsd");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "isnsd did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Isnsd {
            child,
            port,
            dir: dir.to_path_buf(),
        }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// An isnsadm client configuration with this source name, registered
    /// as an initiator (iSNS answers queries from registered nodes only).
    fn client(&self, name: &str) -> String {
        let conf = self.dir.join(format!("{}.conf", name.replace(':', "_")));
        std::fs::write(
            &conf,
            format!(
                "SourceName = {name}\nServerAddress = {}\nSecurity = 0\n",
                self.addr()
            ),
        )
        .unwrap();
        let conf = conf.to_str().unwrap().to_string();
        must_run(
            "isnsadm",
            &[
                "-c",
                &conf,
                "--register",
                &format!("entity={name}.host"),
                &format!("initiator={name}"),
            ],
            Duration::from_secs(10),
        );
        conf
    }

    /// The portals through which `target` is visible to the client
    /// `conf` (empty: not registered, or not in a shared discovery domain).
    fn portals_seen(conf: &str, target: &str) -> String {
        must_run(
            "isnsadm",
            &[
                "-c",
                conf,
                "--query",
                &format!("iscsi-name={target}"),
                "?portal-addr",
                "?portal-port",
            ],
            Duration::from_secs(10),
        )
    }
}

impl Drop for Isnsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Poll `f` every 200 ms until it holds, for at most `limit`.
fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> (bool, String)) {
    let deadline = Instant::now() + limit;
    loop {
        let (ok, seen) = f();
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not so after {limit:?}; last seen:\n{seen}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn config(dir: &Path, with_acl: bool) -> String {
    let mut s = format!(
        "portals = [\"127.0.0.1:0\"]\n\
         [options]\ndata_dir = \"{}\"\n\
         [[target]]\nname = \"{OPEN}\"\nalias = \"open disk\"\nlun = [\"ram:8M\"]\n",
        dir.join("data").display()
    );
    if with_acl {
        s.push_str(&format!(
            "[[target]]\nname = \"{ACL}\"\nallow_initiators = [\"{INIT1}\"]\nlun = [\"ram:8M\"]\n"
        ));
    }
    s
}

fn write_config(path: &Path, text: &str) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn signal(server: &Server, sig: libc::c_int) {
    // SAFETY: kill(2) on the child we spawned; no memory involved.
    let r = unsafe { libc::kill(server.child.id() as libc::pid_t, sig) };
    assert_eq!(r, 0, "kill failed");
}

#[test]
fn registers_follows_and_deregisters() {
    let dir = tempfile::tempdir().unwrap();
    let isnsd = Isnsd::start(dir.path());
    let init1 = isnsd.client(INIT1);
    let other = isnsd.client(OTHER);
    let cfg = dir.path().join("ethersan.toml");
    write_config(&cfg, &config(dir.path(), true));
    let mut server = Server::start_args(&[
        "serve".into(),
        "--config".into(),
        cfg.to_str().unwrap().into(),
        "--isns".into(),
        isnsd.addr(),
    ]);
    let port = server.addr.rsplit(':').next().unwrap().to_string();
    let portal_line = format!("Portal TCP/UDP port = {port}/tcp");
    // The open target is in no discovery domain: the default domain
    // shows it, with the server's portal, to an initiator in no domain.
    eventually(
        Duration::from_secs(10),
        "the open target is registered",
        || {
            let seen = Isnsd::portals_seen(&other, OPEN);
            (
                seen.contains("Portal IP address = 127.0.0.1") && seen.contains(&portal_line),
                seen,
            )
        },
    );
    // The ACL target shares a discovery domain with its initiator only.
    eventually(Duration::from_secs(10), "init1 sees the ACL target", || {
        let seen = Isnsd::portals_seen(&init1, ACL);
        (seen.contains(&portal_line), seen)
    });
    let seen = Isnsd::portals_seen(&other, ACL);
    assert!(
        !seen.contains("Portal"),
        "an initiator outside the ACL's discovery domain sees the target:\n{seen}"
    );
    let nodes = must_run(
        "isnsadm",
        &["-c", &other, "--list", "nodes"],
        Duration::from_secs(10),
    );
    assert!(
        nodes.contains(OPEN) && nodes.contains("open disk") && !nodes.contains(ACL),
        "{nodes}"
    );

    // Remove the ACL target live.
    write_config(&cfg, &config(dir.path(), false));
    signal(&server, libc::SIGHUP);
    eventually(
        Duration::from_secs(10),
        "the removed target is gone",
        || {
            let seen = Isnsd::portals_seen(&init1, ACL);
            (!seen.contains("Portal"), seen)
        },
    );
    assert!(Isnsd::portals_seen(&other, OPEN).contains(&portal_line));

    // Shutdown deregisters everything.
    let t = Instant::now();
    let status = server.stop().expect("ethersan serve did not stop");
    assert!(status.success(), "serve exited with {status}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        t.elapsed()
    );
    let seen = Isnsd::portals_seen(&other, OPEN);
    assert!(
        !seen.contains("Portal"),
        "still registered after shutdown:\n{seen}"
    );
    let nodes = must_run(
        "isnsadm",
        &["-c", &other, "--list", "nodes"],
        Duration::from_secs(10),
    );
    assert!(!nodes.contains(OPEN), "{nodes}");
    let entities = must_run(
        "isnsadm",
        &["-c", &other, "--list", "entities"],
        Duration::from_secs(10),
    );
    assert!(!entities.contains(".ethersan"), "{entities}");
}

/// Nothing listens on the iSNS port: the target serves, warns once, and
/// stops promptly.
#[test]
fn unreachable_isns_server_neither_stops_serving_nor_hangs_shutdown() {
    let port = free_port();
    let mut server = Server::start_with("ram:8M", &["--isns", &format!("127.0.0.1:{port}")]);
    let out = common::ethersan(&["ls", &server.url(0)]);
    common::ok(&out);
    // Attempts at 0, 1 and 3 s fail; one warning.
    std::thread::sleep(Duration::from_secs(4));
    let t = Instant::now();
    let status = server.stop().expect("ethersan serve did not stop");
    assert!(status.success(), "serve exited with {status}");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "shutdown took {:?}",
        t.elapsed()
    );
    let log = server.log.lock().unwrap().clone();
    let warnings: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("iSNS registration failed"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log:#?}");
    assert!(
        warnings[0].contains("cannot connect to the iSNS server")
            && warnings[0].contains(&format!("127.0.0.1:{port}")),
        "{}",
        warnings[0]
    );
}

/// An iSNS server that accepts and never answers: shutdown still takes
/// at most about two seconds.
#[test]
fn silent_isns_server_does_not_hang_shutdown() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done2 = done.clone();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        silent.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline && !done2.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((c, _)) = silent.accept() {
                conns.push(c);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        conns.len()
    });
    let mut server = Server::start_with("ram:8M", &["--isns", &addr.to_string()]);
    common::ok(&common::ethersan(&["ls", &server.url(0)]));
    std::thread::sleep(Duration::from_secs(1));
    let t = Instant::now();
    let status = server.stop().expect("ethersan serve did not stop");
    assert!(status.success(), "serve exited with {status}");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "shutdown with a silent iSNS server took {:?}",
        t.elapsed()
    );
    drop(server);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(held.join().unwrap() >= 1, "ethersan never connected");
}
