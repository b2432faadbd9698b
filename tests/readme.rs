//! The README's examples, run as a newcomer runs them: every shell block
//! marked `<!-- readme-test -->` is run line by line, literally, against
//! the README's own default server (`ethersan serve` with no arguments, on
//! 127.0.0.1:3260) with `ethersan` on PATH.
//!
//! The server and the examples run in a network namespace and a mount
//! namespace of their own (`unshare --net --mount`), so the default port is
//! free whatever else runs on this machine, and the examples' mounts
//! vanish with them. Needs root and util-linux's `unshare`.

mod common;

use std::path::Path;
use std::process::Command;

/// The marker before a block the test runs.
const MARK: &str = "<!-- readme-test -->";

/// Each marked block's lines (comments and blank lines dropped; a trailing
/// `# comment` kept, bash ignores it), with the line number of the block.
fn marked_blocks(readme: &str) -> Vec<(usize, Vec<String>)> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == MARK {
            let start = i + 1;
            assert!(
                lines
                    .get(start)
                    .is_some_and(|l| l.trim_start().starts_with("```sh")),
                "README.md:{}: {MARK} must stand right before a ```sh block",
                i + 1
            );
            let mut block = Vec::new();
            let mut j = start + 1;
            while j < lines.len() && !lines[j].trim_start().starts_with("```") {
                let l = lines[j].trim_end();
                if !l.trim().is_empty() && !l.trim_start().starts_with('#') {
                    block.push(l.to_string());
                }
                j += 1;
            }
            out.push((start + 1, block));
            i = j;
        }
        i += 1;
    }
    out
}

#[test]
fn marker_parsing() {
    let text = "x\n<!-- readme-test -->\n```sh\n# c\na b   # x\n\nc\n```\n```sh\nno\n```\n";
    let b = marked_blocks(text);
    assert_eq!(b, vec![(3, vec!["a b   # x".to_string(), "c".to_string()])]);
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The script: start the default server, wait for its portal, run each
/// example line (stop at the first that fails, naming it), stop the server.
fn script(blocks: &[(usize, Vec<String>)], bin_dir: &Path, work: &Path) -> String {
    let mut s = String::new();
    // As in an interactive shell: a pipeline's status is its last command's.
    s.push_str("set -u\n");
    let work = shell_quote(&work.display().to_string());
    // Everything the examples print also goes to a file, for a timeout.
    s.push_str(&format!("exec > >(tee -a {work}/examples.log) 2>&1\n"));
    // The examples' files (a 1 GiB LUN, its 1 GiB download, a 200 GiB
    // sparse LUN) live in a tmpfs of this mount namespace: gone with it,
    // with nothing to delete from the disk afterwards.
    s.push_str(&format!(
        "mkdir {work}/run && mount -t tmpfs -o size=4g tmpfs {work}/run && cd {work}/run || exit 1\n"
    ));
    s.push_str("ip link set lo up\n");
    s.push_str(&format!(
        "export PATH={}:$PATH\n",
        shell_quote(&bin_dir.display().to_string())
    ));
    // The files the examples read.
    s.push_str("head -c 8M /dev/urandom > disk.raw\n");
    s.push_str("head -c 1M /dev/urandom > image\n");
    s.push_str("ethersan serve > server.log 2>&1 &\nserver=$!\n");
    s.push_str(
        "for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/3260) 2>/dev/null && break; sleep 0.1; done\n",
    );
    for (line_no, block) in blocks {
        for line in block {
            let shown = shell_quote(&format!("README.md block at line {line_no}: {line}"));
            s.push_str(&format!("echo \"+ [$SECONDS s] \"{shown} >&2\n"));
            s.push_str(&format!(
                "{line}\nrc=$?\nif [ $rc -ne 0 ]; then echo \"README example failed (exit $rc): \"{shown} >&2; kill $server; wait; exit 1; fi\n"
            ));
        }
    }
    s.push_str("echo \"+ [$SECONDS s] stopping the server\" >&2\n");
    s.push_str("kill -TERM $server; wait $server; rc=$?\n");
    s.push_str("echo \"+ [$SECONDS s] the server stopped (exit $rc)\" >&2\n");
    s.push_str(
        "[ $rc -eq 0 ] || { echo \"the server exited $rc\" >&2; cat server.log >&2; exit 1; }\n",
    );
    s.push_str("cd / && umount -l \"$OLDPWD\"\n");
    s
}

#[test]
fn readme_examples_work_against_the_default_server() {
    common::require_tool("unshare");
    common::require_tool("iscsi-ls");
    common::require_tool("xxd");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("read README.md");
    let blocks = marked_blocks(&readme);
    assert!(
        blocks.len() >= 3,
        "README.md has {} blocks marked {MARK}; the client, ctl and libiscsi examples should be",
        blocks.len()
    );
    let bin = Path::new(env!("CARGO_BIN_EXE_ethersan"));
    let dir = tempfile::tempdir().unwrap();
    let text = script(&blocks, bin.parent().unwrap(), dir.path());
    std::fs::write(dir.path().join("readme.sh"), &text).unwrap();
    let status = Command::new("timeout")
        .args(["--kill-after=5", "300", "unshare", "--net", "--mount"])
        .args(["--propagation", "private", "bash"])
        .arg(dir.path().join("readme.sh"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run unshare");
    let log = std::fs::read_to_string(dir.path().join("examples.log")).unwrap_or_default();
    assert_ne!(
        status.code(),
        Some(124),
        "the README's examples did not finish within 300 s:\n{log}"
    );
    assert!(status.success(), "the README's examples failed:\n{log}");
    println!("{log}");
}

/// Each dependency's features, as `cargo tree` resolves them for `args`.
fn features(
    args: &[&str],
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let out = Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--offline", "--prefix", "none", "-f", "{p}|{f}"])
        .args(args)
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut map = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim().trim_end_matches(" (*)");
        if let Some((pkg, f)) = line.split_once('|') {
            map.entry(pkg.to_string())
                .or_default()
                .extend(f.split(',').filter(|x| !x.is_empty()).map(str::to_string));
        }
    }
    map
}

/// `cargo run --release` (the README's quick start) builds every shared
/// dependency with the features `./scripts/test` built it with, so neither
/// rebuilds what the other built (the unification list in Cargo.toml).
#[test]
fn cargo_run_and_the_test_build_share_every_crate() {
    let run = features(&["-e", "normal,build"]);
    let test = features(&["--workspace", "-e", "normal,build,dev"]);
    let differ: Vec<String> = run
        .iter()
        .filter_map(|(pkg, f)| {
            let t = test.get(pkg)?;
            (t != f).then(|| {
                format!(
                    "{pkg}: the tests add {:?}",
                    t.difference(f).collect::<Vec<_>>()
                )
            })
        })
        .collect();
    assert!(
        differ.is_empty(),
        "these crates would be built twice; add the features to the unification list in Cargo.toml:\n{}",
        differ.join("\n")
    );
}
