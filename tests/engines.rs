//! The I/O engines and O_DIRECT end to end: `ethersan serve` with LUNs on
//! `engine = "uring"`, `engine = "sync"` and `direct = true`, driven by
//! ethersan's client (cp, bench) and by libiscsi's READ/WRITE suites.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{ethersan, ok, parse_cunit, pattern, require_tool, run, Server};

/// The per-LUN options under test (spec form, as `serve --lun`).
const VARIANTS: [&str; 4] = [
    "engine=uring",
    "engine=uring,direct",
    "engine=sync,direct",
    "engine=sync",
];

fn start(dir: &Path, i: usize, opts: &str, bs: u32) -> Server {
    let path = dir.join(format!("lun-{i}.img"));
    let server = Server::start(&[&format!("{}:64M,bs={bs},{opts}", path.display())]);
    // The log says which engine the LUN got (io_uring is enabled here:
    // kernel.io_uring_disabled = 0).
    let log = server.log.lock().unwrap().join("\n");
    let engine = if opts.contains("uring") {
        "uring engine"
    } else {
        "sync engine"
    };
    assert!(log.contains(engine), "{opts}: {log}");
    assert_eq!(
        log.contains("O_DIRECT"),
        opts.contains("direct"),
        "{opts}: {log}"
    );
    server
}

#[test]
fn client_round_trips_on_every_engine() {
    let dir = tempfile::tempdir().unwrap();
    for (i, opts) in VARIANTS.iter().enumerate() {
        for bs in [512u32, 4096] {
            let server = start(dir.path(), i * 2 + (bs as usize / 4096), opts, bs);
            let url = server.url(0);
            // Not a whole number of blocks, at an offset: partial blocks are
            // read, merged and written back; --sync ends with SYNCHRONIZE
            // CACHE (a flush through the engine).
            let data = pattern((5 << 20) + 123, i as u64 + 7);
            let src = dir.path().join("src.bin");
            std::fs::write(&src, &data).unwrap();
            ok(&ethersan(&[
                "cp",
                "-q",
                src.to_str().unwrap(),
                &url,
                "--offset",
                "1M",
                "--verify",
                "--sync",
            ]));
            let back = dir.path().join("back.bin");
            ok(&ethersan(&[
                "cp",
                "-q",
                &url,
                back.to_str().unwrap(),
                "--offset",
                "1M",
                "--length",
                &data.len().to_string(),
            ]));
            assert!(
                std::fs::read(&back).unwrap() == data,
                "{opts} bs {bs}: data differs"
            );
            // Many commands in flight, FUA writes, several sessions.
            for args in [
                &["--rw", "randwrite", "--fua", "--qd", "16"][..],
                &[
                    "--rw",
                    "mixed",
                    "--qd",
                    "8",
                    "--sessions",
                    "3",
                    "--bs",
                    "64K",
                ][..],
                &["--rw", "randread", "--qd", "32"][..],
            ] {
                let mut all = vec!["bench", "--json", &url, "--ios", "3000"];
                all.extend_from_slice(args);
                let v: serde_json::Value = serde_json::from_str(&ok(&ethersan(&all))).unwrap();
                assert_eq!(v["ios"], 3000, "{opts}: {v}");
            }
            drop(server);
        }
    }
}

#[test]
fn libiscsi_read_write_suites_on_uring_and_direct_luns() {
    require_tool("iscsi-test-cu");
    let dir = tempfile::tempdir().unwrap();
    let suites = [
        "Read10",
        "Read16",
        "Write10",
        "Write16",
        "WriteVerify16",
        "CompareAndWrite",
        "iSCSIResiduals",
    ];
    let mut problems = Vec::new();
    for (i, opts) in VARIANTS[..3].iter().enumerate() {
        for suite in suites {
            let server = start(dir.path(), 100 + i, opts, 512);
            let test = format!("ALL.{suite}");
            let url = server.url(0);
            let out = run(
                "iscsi-test-cu",
                &["-d", "--test", &test, &url],
                Duration::from_secs(240),
            );
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let r = parse_cunit(&text);
            println!(
                "{opts:<22} {suite:<16} passed {} failed {} skipped {}",
                r.passed, r.failed, r.skipped
            );
            if !r.completed || r.passed == 0 || r.failed > 0 {
                problems.push(format!("{opts} {suite}: {:?}\n{text}", r.failed_tests));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

#[test]
fn bench_local_file_with_engine_and_direct() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("local.img");
    std::fs::write(&file, pattern(8 << 20, 3)).unwrap();
    let f = file.to_str().unwrap();
    for (engine, direct) in [
        ("uring", false),
        ("uring", true),
        ("sync", true),
        ("sync", false),
    ] {
        let mut args = vec![
            "bench", "--json", f, "--rw", "mixed", "--ios", "2000", "--engine", engine,
        ];
        if direct {
            args.push("--direct");
        }
        let v: serde_json::Value = serde_json::from_str(&ok(&ethersan(&args))).unwrap();
        assert_eq!(v["ios"], 2000, "{v}");
        assert_eq!(v["io_engine"], engine, "{v}");
        assert_eq!(v["direct"], direct, "{v}");
    }
    let out = ethersan(&["bench", f, "--engine", "aio"]);
    assert!(!out.status.success());
    let out = ethersan(&[
        "bench",
        "iscsi://127.0.0.1:1/iqn.2026-11.org.x:t/0",
        "--direct",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("local FILE"));
}

/// Cut-through WRITE end to end: large WRITEs (1 MiB, 4 MiB, with and
/// without FUA, one at a time and several at once) over iSCSI/TCP to a
/// direct file LUN on the io_uring engine, whose unit writes each 256 KiB
/// piece as its Data-Out arrives, read back byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_writes_cut_through_on_a_direct_uring_lun_read_back() {
    use bytes::Bytes;
    use ethersan_initiator::{connect, LoginOptions};
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), 0, "engine=uring,direct", 512);
    let opts = LoginOptions {
        target_name: Some(common::IQN.into()),
        ..Default::default()
    };
    let s = connect(&server.addr, &opts).await.unwrap();
    s.clear_unit_attention(0).await.unwrap();
    let mut lba = 8u64;
    for (len, fua) in [
        (1 << 20, false),
        (1 << 20, true),
        (4 << 20, false),
        (4 << 20, true),
    ] {
        let data = Bytes::from(pattern(len, lba + u64::from(fua)));
        let r = s.write16(0, lba, data.clone(), 512, fua).await.unwrap();
        assert_eq!(r.status, 0, "{len} bytes, fua {fua}");
        let back = s.read16(0, lba, (len / 512) as u32, 512).await.unwrap();
        assert_eq!(back.status, 0);
        assert!(
            back.data == data[..],
            "{len} bytes, fua {fua}: data differs"
        );
        lba += (len / 512) as u64 + 8;
    }
    // Several at once, next to each other (the range locks of neighbours).
    let base = lba;
    let writes = (0..4u64).map(|i| {
        let s = &s;
        async move {
            let data = Bytes::from(pattern(1 << 20, 100 + i));
            let r = s.write16(0, base + i * 2048, data, 512, i % 2 == 1).await;
            assert_eq!(r.unwrap().status, 0);
        }
    });
    futures::future::join_all(writes).await;
    for i in 0..4u64 {
        let back = s.read16(0, base + i * 2048, 2048, 512).await.unwrap();
        assert!(
            back.data == pattern(1 << 20, 100 + i)[..],
            "write {i} differs"
        );
    }
}
