//! The CLI over NVMe/TCP: `cp --verify`, `inquiry`, `ls` and `discover`
//! with `nvme+tcp://` URLs, against the client crate's tiny RAM target
//! (crates/client/tests/nvme_target) on 127.0.0.1.

#[path = "../crates/client/tests/nvme_target/mod.rs"]
mod nvme_target;

use std::process::{Command, Output};

use nvme_target::{RamTarget, SUBNQN};

fn ethersan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(args)
        .env("ETHERSAN_TIMEOUT", "10s")
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn cp_inquiry_ls_discover_over_nvme_tcp() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t = rt.block_on(RamTarget::start(4096, 9)); // 2 MiB
    let url = t.url(1);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("src.img");
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&file, &data).unwrap();

    let out = ok(&ethersan(&["cp", "--verify", file.to_str().unwrap(), &url]));
    let _ = out;
    assert!(
        t.disk.lock().unwrap()[..data.len()] == data[..],
        "the namespace holds the file"
    );
    // And back to a file.
    let back = dir.path().join("back.img");
    ok(&ethersan(&["cp", &url, back.to_str().unwrap()]));
    let b = std::fs::read(&back).unwrap();
    assert_eq!(b.len(), 2 << 20);
    assert!(b[..data.len()] == data[..]);

    let inq = ok(&ethersan(&["inquiry", &url]));
    for want in [
        "SN-TEST-1",
        "ethersan test",
        SUBNQN,
        "4096 blocks of 512 bytes",
        "NGUID:",
    ] {
        assert!(inq.contains(want), "{want:?} missing in:\n{inq}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&ok(&ethersan(&["inquiry", "--json", &url]))).unwrap();
    assert_eq!(v["capacity_bytes"], 2 << 20);
    assert_eq!(v["nguid"], "5e".repeat(16));

    let ls = ok(&ethersan(&[
        "ls",
        &format!("nvme+tcp://{}/{SUBNQN}", t.addr),
    ]));
    assert!(ls.lines().any(|l| l.starts_with("1 ")), "{ls}");

    let disc = ok(&ethersan(&["discover", &format!("nvme+tcp://{}", t.addr)]));
    assert!(
        disc.contains(SUBNQN) && disc.contains(url.strip_suffix("/1").unwrap()),
        "{disc}"
    );

    let b: serde_json::Value = serde_json::from_str(&ok(&ethersan(&[
        "bench",
        &url,
        "--rw",
        "randwrite",
        "--bs",
        "4K",
        "--qd",
        "4",
        "--ios",
        "200",
        "--json",
    ])))
    .unwrap();
    assert!(b.to_string().contains("iops"), "{b}");

    let e = ethersan(&["inquiry", &t.url(3)]);
    assert!(!e.status.success());
    let err = String::from_utf8_lossy(&e.stderr);
    assert!(err.contains("namespace 3 not found"), "{err}");
}
