//! Interop with the Linux kernel's iSCSI initiator (iscsi_tcp + open-iscsi):
//! `scripts/kernel-initiator-test` boots a throwaway VM under qemu (TCG)
//! whose kernel logs in to `ethersan serve` on this host, runs ext4 and fio
//! workloads, survives a kill -9 + restart of the server mid-write, sees
//! LUNs added and grown and its session ended through `ethersan ctl`, and
//! keeps writing through dm-multipath when one of two gateways is killed.
//! See docs/kernel-initiator.md.
//!
//! The script installs what it needs (qemu, the guest's Debian packages);
//! if it cannot, it exits nonzero and this test fails: it never skips.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn linux_kernel_initiator_workloads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("scripts/kernel-initiator-test");
    assert!(script.is_file(), "missing {}", script.display());

    // The script bounds the VM itself (KERNEL_VM_TIMEOUT, 15 minutes by
    // default); the outer limit also covers a first run's downloads.
    let mut child = Command::new("timeout")
        .args([
            "--kill-after=30",
            "1500",
            "bash",
            "-c",
            "exec \"$0\" \"$1\" 2>&1",
        ])
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_ethersan"))
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));

    // Progress goes straight to the terminal (a run takes minutes); the
    // whole output is kept for the failure message.
    let mut out = Vec::new();
    let stdout = child.stdout.take().expect("stdout");
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let _ = writeln!(std::io::stderr(), "kernel-initiator-test: {line}");
        out.push(line);
    }
    let status = child.wait().expect("wait for kernel-initiator-test");

    let tail = out[out.len().saturating_sub(80)..].join("\n");
    assert_ne!(
        status.code(),
        Some(124),
        "kernel-initiator-test did not finish within 25 minutes:\n{tail}"
    );
    assert!(
        status.success(),
        "kernel-initiator-test failed ({status}):\n{tail}"
    );
    // Exit 0 means every workload reported PASS; check the table anyway.
    for w in [
        "iscsistart_ext4",
        "discovery_fio",
        "isns_discovery",
        "recovery",
        "ctl_live",
        "multipath",
    ] {
        assert!(
            out.iter().any(|l| {
                let mut words = l.split_whitespace();
                words.next() == Some(w) && words.next() == Some("PASS")
            }),
            "no PASS line for {w} in the summary:\n{tail}"
        );
    }
}
