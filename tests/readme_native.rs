//! The README's native transport example ("Storage over raw Ethernet: the
//! native transport"), run as written: its lines are read from README.md
//! and only the host's names are replaced (the interface, the target's
//! address, /etc/ethersan, /mnt/lun; the iSCSI portal on a free port so
//! that tests running at once do not collide). Over UDP on loopback
//! always; over a veth pair between two network namespaces (eth:// and
//! udp:// as written), which needs root and iproute2 as
//! tests/native_ethernet.rs does.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use common::netns::Veth;
use common::*;

/// The README's example block of the native transport section: its
/// command lines, continuation lines joined, comments left out.
fn readme_lines() -> Vec<String> {
    let readme = include_str!("../README.md");
    let section = readme
        .split("## Storage over raw Ethernet: the native transport")
        .nth(1)
        .expect("the README has the native transport section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the section has a sh example");
    let mut lines = Vec::new();
    let mut cur = String::new();
    for l in block.lines() {
        let l = l.trim();
        if l.starts_with('#') || l.is_empty() {
            continue;
        }
        match l.strip_suffix('\\') {
            Some(part) => {
                cur.push_str(part);
                cur.push(' ');
            }
            None => {
                cur.push_str(l);
                let line = match cur.split_once(" #") {
                    Some((cmd, _comment)) => cmd.trim().to_string(),
                    None => cur.trim().to_string(),
                };
                lines.push(line);
                cur.clear();
            }
        }
    }
    lines
}

/// The lines sorted by what they are.
struct Example {
    /// Makes the secret file.
    secret: String,
    serve: String,
    /// `export ETHERSAN_GROUP=… ETHERSAN_GROUP_SECRET=…`
    export: String,
    discover: String,
    cp: String,
    bench: String,
    attach: String,
}

fn example() -> Example {
    let lines = readme_lines();
    let find = |start: &str| -> String {
        lines
            .iter()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line starting {start:?} in {lines:#?}"))
            .clone()
    };
    let e = Example {
        secret: lines
            .iter()
            .find(|l| l.contains("> /etc/ethersan/lab.secret"))
            .expect("a line that makes the secret")
            .clone(),
        serve: find("ethersan serve "),
        export: find("export "),
        discover: find("ethersan discover "),
        cp: find("ethersan cp "),
        bench: find("ethersan bench "),
        attach: find("ethersan attach "),
    };
    assert_eq!(
        lines.len(),
        7,
        "a README line this test does not run: {lines:#?}"
    );
    e
}

/// `sh -c SCRIPT` in `dir` (through `ip netns exec NS` when given),
/// bounded in time.
fn sh(ns: Option<&str>, dir: &Path, script: &str, limit: Duration) -> Output {
    let script = format!("cd {} && {script}", path_str(dir));
    match ns {
        Some(ns) => run("ip", &["netns", "exec", ns, "sh", "-c", &script], limit),
        None => run("sh", &["-c", &script], limit),
    }
}

/// The program name in a README line is the binary under test.
fn binary(line: &str) -> String {
    line.replacen(
        "ethersan ",
        &format!("{} ", env!("CARGO_BIN_EXE_ethersan")),
        1,
    )
}

/// Where the example runs: names of this host for the README's.
struct Host<'a> {
    /// Namespaces [target, client] on a veth pair, or loopback.
    veth: Option<&'a Veth>,
    /// The target's UDP port (3262 on the veth pair, as written).
    port: u16,
}

impl Host<'_> {
    /// A client line of the README for this host.
    fn client_line(&self, line: &str) -> String {
        let line = binary(line);
        match self.veth {
            Some(v) => line
                .replace("eth://eth0/", &format!("eth://{}/", v.ifname[1]))
                .replace("--eth eth0", &format!("--eth {}", v.ifname[1]))
                .replace("udp://10.0.0.5/", &format!("udp://{}/", Veth::TARGET_IP)),
            None => {
                let at = format!("udp://127.0.0.1:{}/", self.port);
                line.replace("eth://eth0/", &at)
                    .replace("--eth eth0", &format!("--udp 127.0.0.1:{}", self.port))
                    .replace("udp://10.0.0.5/", &at)
            }
        }
    }

    fn ns(&self, side: usize) -> Option<&str> {
        self.veth.map(|v| v.ns[side].as_str())
    }
}

fn run_example(host: Host<'_>) {
    let e = example();
    let dir = tempfile::tempdir().unwrap();
    let (srv, cli) = (dir.path().join("server"), dir.path().join("client"));
    std::fs::create_dir_all(&srv).unwrap();
    std::fs::create_dir_all(cli.join("mnt/lun")).unwrap();
    let etc = path_str(&srv.join("etc"));

    // The secret, as the README makes it.
    let o = sh(
        None,
        &srv,
        &e.secret.replace("/etc/ethersan", &etc),
        Duration::from_secs(10),
    );
    ok_out(&o, "the README's secret line");

    // The server, as written but for the interface, the UDP address on
    // loopback and the iSCSI portal (a free port).
    let mut serve = binary(&e.serve).replace("/etc/ethersan", &etc);
    serve = match host.veth {
        Some(v) => serve.replace("--eth eth0", &format!("--eth {}", v.ifname[0])),
        None => serve
            .replace("--eth eth0 ", "")
            .replace("0.0.0.0:3262", &format!("127.0.0.1:{}", host.port)),
    };
    serve.push_str(" --listen 127.0.0.1:0");
    let script = format!("cd {} && exec {serve}", path_str(&srv));
    let _server = match host.veth {
        Some(v) => Server::start_program(
            "ip",
            &["netns", "exec", &v.ns[0], "sh", "-c", &script].map(String::from),
        ),
        None => Server::start_program("sh", &["-c".to_string(), script]),
    };

    // The client: another host, with a copy of the secret.
    std::fs::copy(srv.join("etc/lab.secret"), cli.join("lab.secret")).unwrap();
    let disk = pattern(8 << 20, 26);
    std::fs::write(cli.join("disk.img"), &disk).unwrap();
    let client = |line: &str, limit: Duration| -> String {
        let script = format!("{}; {}", e.export, host.client_line(line));
        let o = sh(host.ns(1), &cli, &script, limit);
        ok_out(&o, line)
    };

    let iqn = "iqn.2026-11.org.ethersan:default";
    let found = client(&e.discover, Duration::from_secs(30));
    assert!(
        found.contains(iqn)
            && found.contains("LUN 0: 10737418240 bytes, 512-byte blocks, security encrypt")
            && found.contains("LUN 1: 1073741824 bytes, 512-byte blocks, security integrity"),
        "{found}"
    );
    client(&e.cp, Duration::from_secs(120));
    let bench = client(&e.bench, Duration::from_secs(60));
    assert!(bench.contains("IOPS"), "{bench}");

    // attach: one file in the FUSE mount, holding what cp wrote; then
    // unmounted, and attach exits 0. One script, so that the mount is in
    // the mount namespace of the checks (ip netns exec makes its own).
    let attach = host.client_line(&e.attach).replace("/mnt/lun", "mnt/lun");
    let script = format!(
        "{export}; {attach} & pid=$!; \
         for i in $(seq 100); do [ -f mnt/lun/lun0 ] && break; sleep 0.1; done; \
         stat -c %s mnt/lun/lun0 && cmp -n {len} disk.img mnt/lun/lun0 && echo same; \
         umount mnt/lun; wait $pid; echo attach exited $?",
        export = e.export,
        len = disk.len()
    );
    let o = sh(host.ns(1), &cli, &script, Duration::from_secs(60));
    let out = ok_out(&o, "attach");
    let said = |what: &str| out.lines().any(|l| l == what);
    assert!(
        said("10737418240") && said("same") && said("attach exited 0"),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The README's example over UDP on loopback (eth:// lines as udp://).
#[test]
fn readme_native_example_over_udp() {
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    run_example(Host { veth: None, port });
}

/// The README's example as written (eth://, udp:// on port 3262) between
/// two network namespaces joined by a veth pair (root and iproute2, as
/// tests/native_ethernet.rs).
#[test]
fn readme_native_example_over_ethernet() {
    let t = Instant::now();
    let veth = Veth::new("native", 1500);
    run_example(Host {
        veth: Some(&veth),
        port: 3262,
    });
    eprintln!("over a veth pair in {:?}", t.elapsed());
}
