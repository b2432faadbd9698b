//! The native transport on a real (virtual) Ethernet link: two network
//! namespaces joined by a veth pair at MTU 1500 and 9000 (created and
//! removed by the test). Group discovery by broadcast (members only, no
//! answer on the wire for others), cp --verify over eth:// and udp://,
//! jumbo frames used, and an attacker injecting forged, replayed and
//! truncated frames while a copy runs.

mod common;

use std::path::Path;
use std::time::Duration;

use common::netns::Veth;
use common::*;
use ethersan_channel::discovery::{open_reply, query};
use ethersan_channel::group::GroupKeys;
use ethersan_link::{EthernetHeader, Link, MacAddr, HEADER_LEN};

const GROUP: &str = "lab";
const SECRET: &str = "correct horse battery staple";
const ETHERTYPE: u16 = 0x88B5;

/// `ethersan serve` in the target's namespace: a file LUN of `size` at
/// `img`, the native transport on its veth end for the group (its secret
/// written to `secret`), and `extra` arguments.
fn serve(veth: &Veth, img: &Path, size: &str, secret: &Path, extra: &[&str]) -> Server {
    std::fs::write(secret, SECRET).unwrap();
    let lun = format!("{}:{size}", path_str(img));
    let secret = path_str(secret);
    let mut args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--target",
        IQN,
        "--lun",
        &lun,
        "--eth",
        &veth.ifname[0],
        "--group",
        GROUP,
        "--group-secret-file",
        &secret,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    veth.serve(&args)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Broadcast a discovery query made with `keys` from the client's side
/// and return the answers that arrive within `wait`.
async fn ask(link: &Link, keys: &GroupKeys, nonce: [u8; 16], wait: Duration) -> Vec<Vec<u8>> {
    let mut f = EthernetHeader {
        dst: MacAddr::BROADCAST,
        src: link.mac(),
        ethertype: ETHERTYPE,
    }
    .to_bytes()
    .to_vec();
    f.extend_from_slice(&query(keys, now_ms(), nonce));
    link.send(&f).await.unwrap();
    let mut got = Vec::new();
    let until = tokio::time::Instant::now() + wait;
    while let Ok(r) = tokio::time::timeout_at(
        until,
        link.recv_batch(|fr| got.push(fr[HEADER_LEN..].to_vec())),
    )
    .await
    {
        r.unwrap();
    }
    got
}

async fn over_veth(tag: &str, mtu: usize) {
    let dir = tempfile::tempdir().unwrap();
    let veth = Veth::with_attacker(tag, mtu);
    let secret = dir.path().join("secret");
    let img = dir.path().join("disk.img");
    let udp = format!("{}:3262,mtu={mtu}", Veth::TARGET_IP);
    let server = serve(&veth, &img, "64M", &secret, &["--udp", &udp]);
    let secret_s = path_str(&secret);
    let client = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--group", GROUP, "--group-secret-file", &secret_s]);
        veth.in_client(&all, Duration::from_secs(120))
    };

    // Discovery by group, through the CLI.
    let out = ok_out(
        &client(&["discover", "--eth", &veth.ifname[1], "--json"]),
        "discover --eth",
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "{out}");
    assert_eq!(v[0]["targets"][0]["name"], IQN, "{out}");
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "another secret").unwrap();
    let o = veth.in_client(
        &[
            "discover",
            "--eth",
            &veth.ifname[1],
            "--json",
            "--group",
            GROUP,
            "--group-secret-file",
            &path_str(&wrong),
        ],
        Duration::from_secs(30),
    );
    // Nothing found: the empty list, and exit status 1.
    let l = error_line(&o, "discover, wrong secret");
    assert!(l.contains("no member of group"), "{l}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");

    // On the wire: non-members get no frame back, a member gets the
    // catalog only a member can open.
    let link = Link::from(veth.client_link(ETHERTYPE));
    for (g, s) in [(GROUP, "another secret"), ("other", SECRET)] {
        let keys = GroupKeys::derive(g, s.as_bytes()).unwrap();
        let got = ask(&link, &keys, [3; 16], Duration::from_millis(1000)).await;
        assert!(
            got.is_empty(),
            "{g}: {} frames answered a non-member",
            got.len()
        );
    }
    let member = GroupKeys::derive(GROUP, SECRET.as_bytes()).unwrap();
    let got = ask(&link, &member, [4; 16], Duration::from_millis(1500)).await;
    assert_eq!(got.len(), 1, "one answer to a member");
    let part = open_reply(&member, &[4; 16], &got[0]).expect("the member opens the reply");
    assert_eq!(part.catalog.targets[0].name, IQN);
    drop(link);

    // Copies over raw Ethernet (encrypted) and over UDP, jumbo frames used.
    let src = dir.path().join("src.img");
    std::fs::write(&src, pattern(8 << 20, 41)).unwrap();
    let eth = format!("eth://{}/{IQN}/0", veth.ifname[1]);
    ok_out(
        &client(&["cp", "--verify", &path_str(&src), &eth]),
        "cp over eth://",
    );
    let back = dir.path().join("back.img");
    ok_out(
        &client(&["cp", &eth, &path_str(&back), "--length", "8M"]),
        "cp back over eth://",
    );
    assert!(std::fs::read(&back).unwrap() == pattern(8 << 20, 41));
    let udp = format!("udp://{}/{IQN}/0?mtu={mtu}", Veth::TARGET_IP);
    ok_out(
        &client(&["cp", "--verify", &path_str(&src), &udp]),
        "cp over udp://",
    );
    let opened: Vec<String> = server
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("channel opened"))
        .cloned()
        .collect();
    assert!(
        opened
            .iter()
            .any(|l| l.contains(&format!("max_frame={mtu}"))),
        "no raw Ethernet channel used the {mtu}-byte MTU: {opened:?}"
    );

    // An attacker in the client's namespace replays, forges and truncates
    // the client's frames while a copy runs: the copy finishes, verified,
    // and the target counts the rejected frames.
    let big = dir.path().join("big.img");
    std::fs::write(&big, pattern(24 << 20, 43)).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools/attacker.py");
    let (ns_a, if_a) = veth.attacker.clone().expect("an attacker namespace");
    let attacker = std::process::Command::new("ip")
        .args(["netns", "exec", &ns_a, "python3", script])
        .args([&if_a, "8", "0x88B5"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    std::thread::sleep(Duration::from_millis(300));
    ok_out(
        &client(&["cp", "--verify", &path_str(&big), &eth]),
        "cp over eth:// under attack",
    );
    let sent = attacker.wait_with_output().unwrap();
    let sent: serde_json::Value =
        serde_json::from_slice(&sent.stdout).expect("the attacker's report");
    assert!(sent["forged"].as_u64().unwrap() > 0, "{sent}");
    // The server logs the channel's counters when it ends.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let rejected = loop {
        let r: u64 = server
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("channel ended") || l.contains("channel closing"))
            .filter_map(|l| {
                let i = l.find("rejected=")?;
                l[i + 9..]
                    .split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum();
        if r > 0 || std::time::Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        rejected > 0,
        "the target counted no rejected frame ({sent})"
    );
    let disk = std::fs::read(&img).unwrap();
    assert!(disk[..24 << 20] == pattern(24 << 20, 43));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_veth_pair_at_mtu_1500() {
    over_veth("n", 1500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_veth_pair_with_jumbo_frames() {
    over_veth("j", 9000).await;
}

/// `ethersan attach` over raw Ethernet with encryption (the default):
/// the LUN found by group discovery, attached as a file, a loop device on
/// it formatted ext4 and mounted, files written and checked, everything
/// detached, attached again, `e2fsck -fn` clean and the files intact. The
/// attach process joins the client's network namespace only (nsenter
/// --net), so its FUSE mount is visible here.
#[test]
fn attach_format_and_mount_over_raw_ethernet_with_encryption() {
    for tool in [
        "nsenter",
        "losetup",
        "mkfs.ext4",
        "e2fsck",
        "mount",
        "sha256sum",
    ] {
        require_tool(tool);
    }
    let dir = tempfile::tempdir().unwrap();
    let veth = Veth::new("f", 9000);
    let secret = dir.path().join("secret");
    let img = dir.path().join("disk.img");
    let server = serve(&veth, &img, "96M", &secret, &[]);
    let url = format!("eth://{}/{IQN}/0", veth.ifname[1]);
    let fuse_dir = dir.path().join("fuse");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&fuse_dir).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let netns = format!("--net=/run/netns/{}", veth.ns[1]);
    let attach = || {
        let mut child = std::process::Command::new("nsenter")
            .args([&netns, env!("CARGO_BIN_EXE_ethersan"), "attach", &url])
            .arg(&fuse_dir)
            .args(["--group", GROUP, "--group-secret-file", &path_str(&secret)])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("attach says where the file is");
        let file = line
            .split("losetup --find --show --direct-io=on ")
            .nth(1)
            .unwrap_or_else(|| panic!("no losetup command in {line:?}"))
            .trim()
            .to_string();
        Detach { child, file }
    };
    let must = |cmd: &str, args: &[&str]| must_run(cmd, args, Duration::from_secs(120));
    let mut a = attach();
    let dev = must("losetup", &["--find", "--show", "--direct-io=on", &a.file])
        .trim()
        .to_string();
    let guard = LoopGuard {
        dev: dev.clone(),
        mnt: mnt.clone(),
    };
    must("mkfs.ext4", &["-q", &dev]);
    must("mount", &[&dev, &path_str(&mnt)]);
    for i in 0..4 {
        std::fs::write(mnt.join(format!("f{i}")), pattern(3 << 20, 60 + i)).unwrap();
    }
    must("sync", &[]);
    let sums = must(
        "sh",
        &["-c", &format!("cd {} && sha256sum f*", path_str(&mnt))],
    );
    must("umount", &[&path_str(&mnt)]);
    must("losetup", &["-d", &dev]);
    drop(guard);
    a.stop();
    let mut a = attach();
    let dev = must("losetup", &["--find", "--show", "--direct-io=on", &a.file])
        .trim()
        .to_string();
    let _guard = LoopGuard {
        dev: dev.clone(),
        mnt: mnt.clone(),
    };
    must("e2fsck", &["-fn", &dev]);
    must("mount", &[&dev, &path_str(&mnt)]);
    let again = must(
        "sh",
        &["-c", &format!("cd {} && sha256sum f*", path_str(&mnt))],
    );
    assert_eq!(sums, again, "files changed across detach and attach");
    must("umount", &[&path_str(&mnt)]);
    must("losetup", &["-d", &dev]);
    a.stop();
    let opened = server
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("channel opened") && l.contains("level=encrypt"))
        .count();
    assert!(opened >= 2, "the attaches did not use encrypted channels");
}

/// A running `ethersan attach`, stopped with SIGTERM (it flushes and
/// unmounts) by [`Detach::stop`] or on drop.
struct Detach {
    child: std::process::Child,
    file: String,
}

impl Detach {
    fn stop(&mut self) {
        // SAFETY: kill(2) on a child we spawned and still own.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                assert!(st.success(), "attach exited with {st}");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("attach did not stop on SIGTERM");
    }
}

impl Drop for Detach {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Unmounts and detaches the loop device even when the test fails.
struct LoopGuard {
    dev: String,
    mnt: std::path::PathBuf,
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.mnt)
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.dev])
            .stderr(std::process::Stdio::null())
            .status();
    }
}
