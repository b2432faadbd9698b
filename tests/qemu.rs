//! Interop with QEMU's iSCSI block driver (qemu-block-extra): data written
//! with `qemu-img convert` reads back byte-identical with `qemu-img dd`.

mod common;

use std::time::Duration;

use common::{require_tool, run, Server};

/// 32 MiB from a seeded xorshift generator (reproducible, incompressible).
fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    out
}

#[test]
fn qemu_img_convert_and_dd_roundtrip() {
    require_tool("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let lun = format!("{}:64M", dir.path().join("lun0.img").display());
    let server = Server::start(&[&lun]);
    let url = server.url(0);
    let data = random_bytes(32 << 20, 0x5eed_e7e5);
    let src = dir.path().join("src.raw");
    std::fs::write(&src, &data).unwrap();

    let out = run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            src.to_str().unwrap(),
            &url,
        ],
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "qemu-img convert: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let back = dir.path().join("back.raw");
    let of = format!("of={}", back.display());
    let iff = format!("if={url}");
    let out = run(
        "qemu-img",
        &[
            "dd", "-f", "raw", "-O", "raw", "bs=1M", "count=32", &iff, &of,
        ],
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "qemu-img dd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = std::fs::read(&back).unwrap();
    assert_eq!(got.len(), data.len());
    assert!(
        got == data,
        "data read back through QEMU differs from what was written"
    );

    // The backing file holds the same bytes once the server has flushed.
    let mut server = server;
    assert!(
        server.stop().is_some_and(|s| s.success()),
        "server did not exit cleanly on SIGTERM"
    );
    let on_disk = std::fs::read(dir.path().join("lun0.img")).unwrap();
    assert!(on_disk[..data.len()] == data[..], "backing file differs");
}

#[test]
fn qemu_img_reports_lun_size() {
    require_tool("qemu-img");
    let server = Server::start(&["ram:48M"]);
    let out = run(
        "qemu-img",
        &["info", "-f", "raw", &server.url(0)],
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "qemu-img info: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("48 MiB") || text.contains("50331648"),
        "{text}"
    );
}

#[test]
fn qemu_img_compare_and_bench() {
    require_tool("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let lun = format!("{}:16M", dir.path().join("lun0.img").display());
    let server = Server::start(&[&lun]);
    let url = server.url(0);
    let data = random_bytes(16 << 20, 0xc0ffee);
    let src = dir.path().join("src.raw");
    std::fs::write(&src, &data).unwrap();
    let ok = |args: &[&str]| {
        let out = run("qemu-img", args, Duration::from_secs(120));
        assert!(
            out.status.success(),
            "qemu-img {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let s = src.to_str().unwrap();
    ok(&["convert", "-n", "-f", "raw", "-O", "raw", s, &url]);
    let same = ok(&["compare", "-f", "raw", "-F", "raw", s, &url]);
    assert!(same.contains("identical"), "{same}");

    // One byte changed on the LUN: compare must see it, at its offset.
    let mut block = data[5 << 20..(5 << 20) + 512].to_vec();
    block[100] ^= 0xff;
    let one = dir.path().join("one.raw");
    std::fs::write(&one, &block).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(["cp", "-q", one.to_str().unwrap(), &url, "--offset", "5M"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", s, &url],
        Duration::from_secs(120),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "compare of differing images: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&((5 << 20) + 100).to_string()) || text.contains("5242880"),
        "{text}"
    );

    // qemu-img bench: reads and writes through QEMU's iSCSI driver.
    let reads = ok(&[
        "bench", "-f", "raw", "-c", "4000", "-d", "16", "-s", "4096", &url,
    ]);
    assert!(reads.contains("Run completed"), "{reads}");
    let writes = ok(&[
        "bench", "-f", "raw", "-w", "-c", "2000", "-d", "8", "-s", "65536", &url,
    ]);
    assert!(writes.contains("Run completed"), "{writes}");
}
