//! docs/architecture.md's table of dependencies between the workspace's
//! crates, checked against `cargo metadata`: a crate that gains or loses a
//! dependency on another of ours fails this test until the document says
//! so, so the drawing cannot drift silently.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// The heading of the section whose table the test reads.
const SECTION: &str = "## Dependencies between crates";

/// Crate name (without the `ethersan-` prefix; `ethersan` for the CLI) →
/// the crates of ours it depends on (normal dependencies, not dev or
/// build), as `cargo metadata` sees them.
fn actual() -> BTreeMap<String, BTreeSet<String>> {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let short = |n: &str| n.strip_prefix("ethersan-").unwrap_or(n).to_string();
    let mut graph = BTreeMap::new();
    for p in meta["packages"].as_array().expect("packages") {
        let name = p["name"].as_str().expect("name");
        let deps = p["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|d| d["kind"].is_null() && d["path"].is_string())
            .map(|d| short(d["name"].as_str().expect("dependency name")))
            .collect();
        graph.insert(short(name), deps);
    }
    graph
}

/// The table under [`SECTION`]: rows `| `crate` | `dep`, `dep` |` (or `—`
/// for none).
fn documented(doc: &str) -> BTreeMap<String, BTreeSet<String>> {
    let start = doc
        .find(SECTION)
        .unwrap_or_else(|| panic!("docs/architecture.md has no '{SECTION}' section"));
    let names = |cell: &str| -> BTreeSet<String> {
        cell.split(',')
            .map(|s| s.trim().trim_matches('`').to_string())
            .filter(|s| !s.is_empty() && s != "—")
            .collect()
    };
    let mut graph = BTreeMap::new();
    for line in doc[start..].lines().skip(1) {
        if line.starts_with("## ") {
            break;
        }
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        let [krate, deps, ..] = cells[..] else {
            continue;
        };
        let krate = krate.trim();
        // Only rows naming a crate in backticks; the header and the rule
        // line have none.
        if !krate.starts_with('`') {
            continue;
        }
        let prev = graph.insert(krate.trim_matches('`').to_string(), names(deps));
        assert!(prev.is_none(), "{krate} has two rows in the table");
    }
    assert!(!graph.is_empty(), "no table rows under '{SECTION}'");
    graph
}

#[test]
fn the_documented_crate_graph_is_the_one_cargo_builds() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"))
            .expect("read docs/architecture.md");
    let (doc, cargo) = (documented(&doc), actual());
    let mut wrong = Vec::new();
    for (krate, deps) in &cargo {
        match doc.get(krate) {
            None => wrong.push(format!("{krate}: in the workspace, not in the table")),
            Some(d) if d != deps => wrong.push(format!(
                "{krate}: the table says {d:?}, Cargo.toml says {deps:?}"
            )),
            Some(_) => {}
        }
    }
    for krate in doc.keys().filter(|k| !cargo.contains_key(*k)) {
        wrong.push(format!("{krate}: in the table, not in the workspace"));
    }
    assert!(
        wrong.is_empty(),
        "docs/architecture.md '{SECTION}' has drifted:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_table_reader_sees_a_missing_dependency() {
    let doc = format!(
        "{SECTION}\n\n| crate | depends on |\n|---|---|\n| `scsi` | `volume`, `backend` |\n| `proto` | — |\n\n## Next\n| `x` | `y` |\n"
    );
    let g = documented(&doc);
    assert_eq!(g.len(), 2, "{g:?}");
    assert_eq!(
        g["scsi"],
        BTreeSet::from(["volume".into(), "backend".into()])
    );
    assert!(g["proto"].is_empty());
}
