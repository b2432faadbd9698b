//! The AoE client against vblade, Debian's reference AoE target: two
//! network namespaces joined by a veth pair that each test creates and
//! deletes itself (also on failure, by a guard's Drop), vblade in one,
//! `ethersan discover --aoe`, `ls`, `inquiry`, `cp` and `bench` in the
//! other. No frame is sent on any other interface. Needs root (for the
//! namespaces and AF_PACKET), iproute2's `ip` and vblade (scripts/test
//! installs them).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{pattern, require_tool, run, IQN};

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (apt-get install iproute2; scripts/test does)");
    assert!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Two namespaces joined by a veth pair, vblade serving a disk file on
/// side A as e0.1; vblade is stopped and both namespaces (with the veth
/// pair) deleted on drop.
struct VbladeLink {
    ns: [String; 2],
    ifname: [String; 2],
    vblade: Option<Child>,
    /// `ethersan serve` in the client's namespace, when started.
    server: Option<Child>,
    dir: tempfile::TempDir,
    disk: PathBuf,
}

impl VbladeLink {
    fn new(tag: &str, mtu: usize, disk_bytes: u64) -> VbladeLink {
        require_tool("ip");
        require_tool("vblade");
        let pid = std::process::id();
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk.img");
        std::fs::File::create(&disk)
            .unwrap()
            .set_len(disk_bytes)
            .unwrap();
        let mut l = VbladeLink {
            ns: [format!("esa-{pid}-{tag}-a"), format!("esa-{pid}-{tag}-b")],
            ifname: [
                format!("v{}{tag}a", pid % 100_000),
                format!("v{}{tag}b", pid % 100_000),
            ],
            vblade: None,
            server: None,
            dir,
            disk,
        };
        for ns in &l.ns {
            ip(&["netns", "add", ns]);
        }
        let mtu = mtu.to_string();
        #[rustfmt::skip]
        ip(&["link", "add", &l.ifname[0], "netns", &l.ns[0], "mtu", &mtu, "type", "veth",
             "peer", "name", &l.ifname[1], "netns", &l.ns[1], "mtu", &mtu]);
        for i in 0..2 {
            ip(&["-n", &l.ns[i], "link", "set", &l.ifname[i], "up"]);
        }
        l.vblade = Some(
            Command::new("ip")
                .args(["netns", "exec", &l.ns[0], "vblade", "0", "1", &l.ifname[0]])
                .arg(&l.disk)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start vblade"),
        );
        l
    }

    /// The client side's interface.
    fn iface(&self) -> &str {
        &self.ifname[1]
    }

    fn url(&self) -> String {
        format!("aoe://{}/0.1", self.iface())
    }

    /// Run `ethersan ARGS` in the client's namespace (60 s at most).
    fn ethersan(&self, args: &[&str]) -> Output {
        let bin = env!("CARGO_BIN_EXE_ethersan");
        let mut all = vec!["netns", "exec", &self.ns[1], bin];
        all.extend_from_slice(args);
        run("ip", &all, Duration::from_secs(60))
    }

    /// Like [`ethersan`](Self::ethersan), and it must succeed: its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.ethersan(args);
        assert!(
            out.status.success(),
            "ethersan {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Discover until vblade answers (it takes a moment to start).
    fn wait_for_vblade(&self) -> String {
        let started = Instant::now();
        loop {
            let out = self.ok(&["discover", "--aoe", self.iface()]);
            if out.contains("e0.1") {
                return out;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "vblade did not answer discovery within 10 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Start `ethersan serve` with a 16 MiB RAM LUN on 127.0.0.1:3260 in
    /// the client's namespace (its own loopback); the LUN's URL.
    fn serve_iscsi(&mut self) -> String {
        ip(&["-n", &self.ns[1], "link", "set", "lo", "up"]);
        let bin = env!("CARGO_BIN_EXE_ethersan");
        self.server = Some(
            Command::new("ip")
                .args(["netns", "exec", &self.ns[1], bin, "serve", "--target", IQN])
                .args(["--listen", "127.0.0.1:3260", "--lun", "ram:16M"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start ethersan serve"),
        );
        let url = format!("iscsi://127.0.0.1:3260/{IQN}/0");
        let started = Instant::now();
        while !self.ethersan(&["ls", &url]).status.success() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "ethersan serve did not come up within 10 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        url
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for VbladeLink {
    fn drop(&mut self) {
        for mut c in [self.vblade.take(), self.server.take()]
            .into_iter()
            .flatten()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn write(path: &Path, data: &[u8]) -> String {
    std::fs::write(path, data).unwrap();
    path.to_str().unwrap().to_string()
}

fn against_vblade(tag: &str, mtu: usize, sectors_per_frame: u8) {
    let started = Instant::now();
    let mut l = VbladeLink::new(tag, mtu, 16 << 20);
    let url = l.url();

    // discover: the device, its capacity and the target's parameters.
    let found = l.wait_for_vblade();
    assert!(found.contains("16.00 MiB (16777216 bytes)"), "{found}");
    assert!(
        found.contains(&format!("sectors/frame {sectors_per_frame}")),
        "{found}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&l.ok(&["discover", "--aoe", l.iface(), "--json"])).unwrap();
    assert_eq!(json[0]["shelf"], 0);
    assert_eq!(json[0]["slot"], 1);
    assert_eq!(json[0]["capacity_bytes"], 16 << 20);
    assert!(json[0]["buffer_count"].as_u64().unwrap() > 0);

    // ls and inquiry: IDENTIFY's identity.
    let ls = l.ok(&["ls", &url]);
    assert!(ls.contains("e0.1") && ls.contains("vblade"), "{ls}");
    let inq = l.ok(&["inquiry", &url]);
    assert!(inq.contains("capacity:          32768 sectors"), "{inq}");
    assert!(inq.contains("LBA48:             true"), "{inq}");
    let inq: serde_json::Value = serde_json::from_str(&l.ok(&["inquiry", &url, "--json"])).unwrap();
    assert_eq!(inq["identify_words"].as_array().unwrap().len(), 256);

    // cp a file of random data there and back, verified.
    let data = pattern(5 << 20, 0xA0E);
    let src = write(&l.path("src"), &data);
    let out = l.ethersan(&["cp", "--verify", &src, &url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("verified"));
    let back = l.path("back");
    l.ok(&["cp", "--length", "5M", &url, back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data, "copied back differs");
    // The disk file itself holds the data.
    assert!(std::fs::read(&l.disk).unwrap()[..data.len()] == data[..]);

    // --offset and --length, to stdout; a tail shorter than a sector.
    let part = l.ethersan(&["cp", "--offset", "1M", "--length", "1000", &url, "-"]);
    assert!(part.status.success());
    assert!(part.stdout == data[1 << 20..(1 << 20) + 1000]);
    let small = write(&l.path("small"), &[0x5A; 700]);
    l.ok(&["cp", "--offset", "6M", "--sync", &small, &url]);
    let disk = std::fs::read(&l.disk).unwrap();
    assert!(disk[6 << 20..(6 << 20) + 700].iter().all(|b| *b == 0x5A));
    assert!(disk[(6 << 20) + 700..(6 << 20) + 1024]
        .iter()
        .all(|b| *b == 0));

    // LUN to LUN: AoE to iSCSI and back, verified.
    let lun = l.serve_iscsi();
    l.ok(&["cp", "--verify", "--length", "5M", &url, &lun]);
    let via_iscsi = l.path("via-iscsi");
    l.ok(&["cp", "--length", "5M", &lun, via_iscsi.to_str().unwrap()]);
    assert!(
        std::fs::read(&via_iscsi).unwrap() == data,
        "AoE to iSCSI differs"
    );
    let other = pattern(1 << 20, 0xB0B);
    let other_src = write(&l.path("other"), &other);
    l.ok(&["cp", "--offset", "8M", &other_src, &lun]);
    l.ok(&[
        "cp", "--verify", "--offset", "8M", "--length", "1M", &lun, &url,
    ]);
    assert!(std::fs::read(&l.disk).unwrap()[8 << 20..9 << 20] == other[..]);

    // bench: writes then reads, a bounded number of I/Os.
    for rw in ["randwrite", "randread"] {
        let out = l.ok(&["bench", &url, "--rw", rw, "--ios", "2000", "--qd", "8"]);
        assert!(out.contains("2000 I/Os"), "{out}");
    }
    let out = l.ok(&[
        "bench", &url, "--rw", "read", "--bs", "64K", "--ios", "200", "--json",
    ]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["engine"], "aoe");
    assert_eq!(r["ios"], 200);

    // A device that is not there: a clear error, quickly.
    let out = l.ethersan(&["ls", &format!("aoe://{}/7.7", l.iface()), "--timeout", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("e7.7") && err.contains("no answer to Query Config"),
        "{err}"
    );
    eprintln!(
        "vblade at MTU {mtu}: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn against_vblade_mtu_1500() {
    against_vblade("n", 1500, 2);
}

#[test]
fn against_vblade_mtu_9000() {
    against_vblade("j", 9000, 17);
}
