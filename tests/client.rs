//! The `ethersan` client as a general iSCSI initiator: discover, ls,
//! inquiry, cp and bench against `ethersan serve` and against tgt.

mod common;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{ethersan, ok, pattern, require_tool, said_once, Server, IQN};

fn fails_with(out: &Output, text: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected a failure mentioning {text:?}"
    );
    assert!(err.contains(text), "expected {text:?} in: {err}");
    // Each cause once, on the one error line.
    let line = err
        .lines()
        .rev()
        .find(|l| l.starts_with("ethersan: "))
        .unwrap_or_else(|| panic!("no error line in: {err}"));
    said_once(line);
}

/// Which server a client test talks to.
enum Peer {
    Ethersan,
    Tgt,
}

fn start(peer: &Peer, dir: &Path) -> Server {
    let path = dir.join("lun.img");
    match peer {
        Peer::Ethersan => Server::start(&[&format!("{}:32M", path.display())]),
        Peer::Tgt => {
            require_tool("tgtd");
            std::fs::File::create(&path)
                .unwrap()
                .set_len(32 << 20)
                .unwrap();
            Server::start_tgt(&path, false, false)
        }
    }
}

fn cp_on(peer: Peer) {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&peer, dir.path());
    let url = server.url(0);

    // A file whose length is not a whole number of blocks: the tail block
    // is read, merged and written back.
    let data = pattern((5 << 20) + 123, 7);
    let src = dir.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    // Something at the tail on the LUN, which the tail write must keep.
    let marker = dir.path().join("marker.bin");
    std::fs::write(&marker, vec![0xabu8; 4096]).unwrap();
    ok(&ethersan(&[
        "cp",
        "-q",
        marker.to_str().unwrap(),
        &url,
        "--offset",
        "6M",
    ]));
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

    // Download the same range to a file and compare.
    let back = dir.path().join("back.bin");
    let len = data.len().to_string();
    ok(&ethersan(&[
        "cp",
        "-q",
        &url,
        back.to_str().unwrap(),
        "--offset",
        "1M",
        "--length",
        &len,
        "--verify",
    ]));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "downloaded bytes differ"
    );

    // The whole LUN: holes stay holes, the data lands where it belongs.
    let whole = dir.path().join("whole.bin");
    ok(&ethersan(&[
        "cp",
        "-q",
        &url,
        whole.to_str().unwrap(),
        "--depth",
        "32",
    ]));
    let meta = std::fs::metadata(&whole).unwrap();
    assert_eq!(meta.len(), 32 << 20);
    let allocated = meta.blocks() * 512;
    assert!(
        allocated < 12 << 20,
        "download of a mostly empty LUN allocated {allocated} bytes"
    );
    let all = std::fs::read(&whole).unwrap();
    assert!(all[1 << 20..(1 << 20) + data.len()] == data[..]);
    assert!(all[..1 << 20].iter().all(|b| *b == 0));
    // The data ends 123 bytes into the marker's first block: the rest of
    // that block and the marker's other blocks are kept.
    assert!(
        all[(6 << 20) + 123..(6 << 20) + 4096]
            .iter()
            .all(|b| *b == 0xab),
        "the tail write clobbered the rest of its block"
    );

    // stdin to the LUN and the LUN to stdout.
    let small = pattern(300_000, 9);
    let mut child = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(["cp", "-q", "-", &url, "--offset", "8M", "--verify"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&small).unwrap();
    ok(&child.wait_with_output().unwrap());
    let out = ok_bytes(&ethersan(&[
        "cp", "-q", &url, "-", "--offset", "8M", "--length", "300000",
    ]));
    assert!(out == small, "stdout download differs");

    // Clear errors.
    let big = dir.path().join("big.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(40 << 20)
        .unwrap();
    fails_with(
        &ethersan(&["cp", big.to_str().unwrap(), &url]),
        "LUN too small",
    );
    fails_with(
        &ethersan(&["cp", src.to_str().unwrap(), &url, "--offset", "1000"]),
        "not a multiple of the block size",
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    fails_with(
        &ethersan(&[
            "cp",
            src.to_str().unwrap(),
            &format!("iscsi://{closed}/{IQN}/0"),
        ]),
        "cannot reach",
    );
    fails_with(
        &ethersan(&[
            "cp",
            src.to_str().unwrap(),
            &format!("iscsi://{}/iqn.2026-11.org.ethersan:nope/0", server.addr),
        ]),
        "refused",
    );
    fails_with(
        &ethersan(&["cp", src.to_str().unwrap(), back.to_str().unwrap()]),
        "one side of cp must be a LUN's URL: iscsi://",
    );
}

fn ok_bytes(out: &Output) -> Vec<u8> {
    assert!(
        out.status.success(),
        "ethersan failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout.clone()
}

#[test]
fn cp_against_ethersan() {
    cp_on(Peer::Ethersan);
}

#[test]
fn cp_against_tgt() {
    cp_on(Peer::Tgt);
}

fn bench_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ok(&ethersan(&all))).expect("bench --json prints JSON")
}

fn bench_on(peer: Peer) {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&peer, dir.path());
    let url = server.url(0);
    for (rw, reads, writes) in [
        ("randread", true, false),
        ("randwrite", false, true),
        ("write", false, true),
        ("read", true, false),
    ] {
        let v = bench_json(&[&url, "--rw", rw, "--ios", "3000", "--qd", "8"]);
        assert_eq!(v["ios"], 3000, "{v}");
        assert_eq!(v["reads"].as_u64().unwrap() > 0, reads, "{v}");
        assert_eq!(v["writes"].as_u64().unwrap() > 0, writes, "{v}");
        assert!(
            v["iops"].as_f64().unwrap() > 0.0 && v["latency_us"]["p50"].as_f64().unwrap() > 0.0,
            "{v}"
        );
        assert!(
            v["latency_us"]["p50"].as_f64() <= v["latency_us"]["p99"].as_f64(),
            "{v}"
        );
    }
    let v = bench_json(&[
        &url,
        "--rw",
        "mixed",
        "--read-pct",
        "70",
        "--ios",
        "4000",
        "--sessions",
        "4",
        "--qd",
        "4",
        "--bs",
        "8K",
    ]);
    let (r, w) = (v["reads"].as_f64().unwrap(), v["writes"].as_f64().unwrap());
    assert!(
        (0.6..0.8).contains(&(r / (r + w))),
        "mixed 70% read gave {r} reads, {w} writes"
    );
    assert_eq!(v["sessions"], 4);
    // Duration-bound, and the table form.
    let out = ok(&ethersan(&[
        "bench", &url, "--rw", "read", "--bs", "128K", "--qd", "4", "--time", "1s",
    ]));
    assert!(out.contains("IOPS") && out.contains("128K"), "{out}");
}

#[test]
fn bench_against_ethersan_tgt_and_a_local_file() {
    bench_on(Peer::Ethersan);
    bench_on(Peer::Tgt);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("local.img");
    std::fs::write(&file, pattern(8 << 20, 3)).unwrap();
    let v = bench_json(&[file.to_str().unwrap(), "--rw", "randwrite", "--ios", "2000"]);
    assert_eq!(v["engine"], "local");
    assert_eq!(v["writes"], 2000);
    fails_with(
        &ethersan(&["bench", "/nonexistent/disk.img"]),
        "no such file",
    );
    fails_with(
        &ethersan(&["bench", file.to_str().unwrap(), "--bs", "1000"]),
        "not a multiple",
    );
}

#[test]
fn discover_ls_inquiry_against_tgt() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&Peer::Tgt, dir.path());
    let v: serde_json::Value =
        serde_json::from_str(&ok(&ethersan(&["discover", "--json", &server.addr]))).unwrap();
    assert_eq!(v[0]["name"], IQN, "{v}");
    let v: serde_json::Value = serde_json::from_str(&ok(&ethersan(&[
        "ls",
        "--json",
        &format!("iscsi://{}/{IQN}", server.addr),
    ])))
    .unwrap();
    let disk = v
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["peripheral_type"] == 0)
        .expect("a disk LUN");
    assert_eq!(disk["capacity_bytes"], 32 << 20, "{v}");
    let v: serde_json::Value =
        serde_json::from_str(&ok(&ethersan(&["inquiry", "--json", &server.url(0)]))).unwrap();
    assert!(!v["vendor"].as_str().unwrap().is_empty(), "{v}");
    assert_eq!(v["block_size"], 512, "{v}");
}

#[test]
fn inquiry_decodes_the_vpd_pages() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&Peer::Ethersan, dir.path());
    let v: serde_json::Value =
        serde_json::from_str(&ok(&ethersan(&["inquiry", "--json", &server.url(0)]))).unwrap();
    assert_eq!(v["provisioning"]["thin"], true, "{v}");
    assert_eq!(v["provisioning"]["unmap"], true, "{v}");
    assert!(
        v["block_limits"]["max_transfer_blocks"].as_u64().unwrap() > 0,
        "{v}"
    );
    assert!(
        v["block_limits"]["max_compare_and_write_blocks"]
            .as_u64()
            .unwrap()
            > 0,
        "{v}"
    );
    let text = ok(&ethersan(&["inquiry", &server.url(0)]));
    assert!(text.contains("Provisioning: thin, UNMAP"), "{text}");
    assert!(text.contains("Block limits: max transfer"), "{text}");
}

/// `--placement pinned`: connections run on per-CPU workers; several
/// clients at once each write their own region and read it back intact.
#[test]
fn pinned_placement_serves_concurrent_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let lun = format!("{}:32M", dir.path().join("lun.img").display());
    let server = Server::start_with(&lun, &["--placement", "pinned", "--workers", "2"]);
    let url = server.url(0);
    let clients: Vec<_> = (0..4u64)
        .map(|i| {
            let src = dir.path().join(format!("part{i}"));
            std::fs::write(&src, pattern(4 << 20, i + 11)).unwrap();
            Command::new(env!("CARGO_BIN_EXE_ethersan"))
                .args(["cp", src.to_str().unwrap(), &url, "--verify", "--offset"])
                .arg(format!("{}M", i * 4))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run ethersan cp")
        })
        .collect();
    for c in clients {
        ok(&c.wait_with_output().unwrap());
    }
    // Everything each client wrote is where it belongs.
    let all = ok_bytes(&ethersan(&["cp", &url, "-", "--length", "16M"]));
    for i in 0..4u64 {
        let at = (i as usize) << 22;
        assert!(
            all[at..at + (4 << 20)] == pattern(4 << 20, i + 11)[..],
            "region {i} differs"
        );
    }
    let v = bench_json(&[
        &url,
        "--rw",
        "mixed",
        "--ios",
        "4000",
        "--sessions",
        "8",
        "--qd",
        "4",
    ]);
    assert_eq!(v["ios"], 4000, "{v}");
    assert!(
        server
            .log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("pinned workers")),
        "no placement line in the log"
    );
}

/// One host with 64 sessions (what bench/compare runs) is within the
/// default per-address connection limit.
#[test]
fn sixty_four_sessions_from_one_host_by_default() {
    let server = Server::start(&["ram:16M"]);
    let url = server.url(0);
    let v = bench_json(&[
        &url,
        "--rw",
        "mixed",
        "--ios",
        "1280",
        "--sessions",
        "64",
        "--qd",
        "2",
    ]);
    assert_eq!(v["sessions"], 64, "{v}");
    assert_eq!(v["ios"], 1280, "{v}");
}

/// `ethersan ARGS` with its standard output a pipe whose reader has
/// already gone (`| head` that has read what it wanted).
fn into_closed_pipe(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// Output into a pipe nobody reads any more ends as `cat` or `ls` do:
/// killed by SIGPIPE (status 141 in a shell), nothing on stderr — for
/// every subcommand that prints, not `Broken pipe` and exit status 1 (or
/// a silent exit 0 that reads as success).
#[test]
fn output_into_a_closed_pipe_ends_as_sigpipe() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let server = start(&Peer::Ethersan, dir.path());
    let url = server.url(0);
    let runs: Vec<Vec<&str>> = vec![
        vec!["man"],
        vec!["completions", "bash"],
        vec!["ctl", "openapi"],
        vec!["discover", &server.addr],
        vec!["discover", "--json", &server.addr],
        vec!["ls", &url],
        vec!["ls", "--json", &url],
        vec!["inquiry", &url],
        vec!["cp", &url, "-", "--length", "4M"],
        vec!["bench", &url, "--time", "1s"],
        vec!["bench", &url, "--time", "1s", "--json"],
    ];
    for args in runs {
        let o = into_closed_pipe(&args);
        assert_eq!(
            o.status.signal(),
            Some(libc::SIGPIPE),
            "ethersan {}: {:?}, stderr: {}",
            args.join(" "),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains("Broken pipe") && !err.contains("ethersan: "),
            "ethersan {}: {err}",
            args.join(" ")
        );
    }
}

/// A URL naming a LUN the target does not have says which it has: "it has
/// LUN 0", "it has LUNs 0, 1" (not "it has 0", which reads as none).
#[test]
fn a_missing_lun_names_the_luns_there_are() {
    let one = Server::start(&["ram:4M"]);
    let two = Server::start(&["ram:4M", "ram:4M"]);
    for (server, has) in [(&one, "(it has LUN 0)"), (&two, "(it has LUNs 0, 1)")] {
        let url = format!("iscsi://{}/{IQN}/5", server.addr);
        for args in [
            vec!["ls", url.as_str()],
            vec!["inquiry", url.as_str()],
            vec!["cp", url.as_str(), "/dev/null", "--length", "4K"],
            vec!["bench", url.as_str(), "--time", "1s"],
        ] {
            let o = ethersan(&args);
            fails_with(&o, &format!("the target has no LUN 5 {has}"));
        }
    }
}

/// `discover` that finds no target fails (exit status 1) and says why;
/// with --json the empty list is still printed.
#[test]
fn discover_that_finds_nothing_fails() {
    // The only target is for another initiator: SendTargets lists none.
    let server = Server::start_with(
        "ram:4M",
        &["--allow-initiator", "iqn.2026-11.org.example:other"],
    );
    let o = ethersan(&["discover", &server.addr]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    fails_with(&o, "offers no targets");
    assert!(o.stdout.is_empty());
    let o = ethersan(&["discover", "--json", &server.addr]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    fails_with(&o, "offers no targets");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");
    // A target there: found, status 0.
    let open = Server::start(&["ram:4M"]);
    let o = ethersan(&["discover", &open.addr]);
    assert!(o.status.success(), "{o:?}");
    // AoE: a link where nobody answers the Query Config.
    let dir = tempfile::tempdir().unwrap();
    let peer = dir.path().join("silent.sock");
    let _silent = std::os::unix::net::UnixDatagram::bind(&peer).unwrap();
    let link = format!(
        "unix:{},peer={}",
        dir.path().join("client.sock").display(),
        peer.display()
    );
    for json in [false, true] {
        let mut args = vec!["discover", "--aoe", &link];
        if json {
            args.push("--json");
        }
        let o = ethersan(&args);
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        fails_with(&o, "no AoE device answered");
    }
}
