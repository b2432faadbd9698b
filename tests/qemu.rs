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
