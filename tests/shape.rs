//! The shape of the code (docs/architecture.md, issue 27 item 7): no
//! module of a crate imports, directly or around a loop, a module that
//! imports it back; and no source file holds more than [`MAX_LINES`] lines
//! of production code (the lines before its `#[cfg(test)]` module; a file
//! that is itself a test module is not counted).
//!
//! Imports are read from the text: `crate::…` and `super::…` paths, in
//! `use` trees (braces expanded) and in code, resolved to the module files
//! they name. A module and its own submodules are one unit here (a child
//! extends its parent, `use super::*` included); what is checked is the
//! graph between sibling modules: `a::x` using `b::y` is an edge from `a`
//! to `b` among the children of the crate root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most lines of production code in one file.
const MAX_LINES: usize = 800;

/// One module file of a crate.
#[derive(Debug)]
struct ModFile {
    /// Path from the repository root.
    rel: String,
    /// Module path from the crate root (empty for the root).
    path: Vec<String>,
    /// Production code: comments removed, the `#[cfg(test)]` module cut.
    code: String,
    /// Lines of production code (comments included).
    lines: usize,
}

/// The crate roots: `src/` of the package and of every member in crates/.
fn crate_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.join("src")];
    let mut members: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|e| e.unwrap().path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    members.sort();
    dirs.extend(members);
    dirs
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            // src/bin/* are crates of their own.
            if p.file_name().is_some_and(|n| n != "bin") {
                rs_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file below `src`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !(parts.is_empty() && (stem == "lib" || stem == "main")) && stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// `text` without `//` and `/* */` comments (string contents that look
/// like comments are cut too: harmless for finding module paths).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    let mut depth = 0;
    while i < b.len() {
        if depth > 0 {
            if b[i..].starts_with(b"*/") {
                depth -= 1;
                i += 2;
            } else if b[i..].starts_with(b"/*") {
                depth += 1;
                i += 2;
            } else {
                if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            depth = 1;
            i += 2;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Production part of a file: the lines before a `#[cfg(test)]` at the
/// start of a line that begins a module (`mod tests {` or `mod tests;`).
fn production(text: &str) -> &str {
    let mut offset = 0;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    for (i, l) in lines.iter().enumerate() {
        if l.trim_end() == "#[cfg(test)]" {
            let next = lines[i + 1..].iter().find(|n| !n.trim().is_empty());
            if next.is_some_and(|n| n.starts_with("mod ") || n.starts_with("pub mod ")) {
                return &text[..offset];
            }
        }
        offset += l.len();
    }
    text
}

/// Names of the modules a file declares under `#[cfg(test)]`.
fn test_children(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.trim() != "#[cfg(test)]" {
            continue;
        }
        for n in lines[i + 1..].iter().take(3) {
            let n = n.trim();
            if n.starts_with("#[") {
                continue;
            }
            let decl = n.strip_prefix("pub ").unwrap_or(n);
            if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                out.push(name.trim().to_string());
            }
            break;
        }
    }
    out
}

/// The files of the crate whose sources are in `src`, test modules left out.
fn crate_files(root: &Path, src: &Path) -> Vec<ModFile> {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    files.sort();
    let mut texts: Vec<(PathBuf, Vec<String>, String)> = files
        .into_iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "build.rs"))
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            let path = module_path(src, &f);
            (f, path, text)
        })
        .collect();
    // A module declared `#[cfg(test)] mod x;` and everything below it.
    let mut test_mods: BTreeSet<Vec<String>> = BTreeSet::new();
    for (_, path, text) in &texts {
        for c in test_children(text) {
            let mut p = path.clone();
            p.push(c);
            test_mods.insert(p);
        }
    }
    texts.retain(|(_, path, _)| !test_mods.iter().any(|t| path.starts_with(t)));
    texts
        .into_iter()
        .map(|(f, path, text)| {
            let prod = production(&text);
            ModFile {
                rel: f.strip_prefix(root).unwrap().to_string_lossy().into_owned(),
                path,
                code: strip_comments(prod),
                lines: prod.lines().count(),
            }
        })
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Expand a `use` tree (the text after `use`, up to the `;`) into paths.
fn use_paths(tree: &str) -> Vec<Vec<String>> {
    fn parse(s: &[char], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut segs = prefix.to_vec();
        loop {
            while *i < s.len() && s[*i].is_whitespace() {
                *i += 1;
            }
            if *i >= s.len() {
                out.push(segs);
                return;
            }
            if s[*i] == '{' {
                *i += 1;
                loop {
                    parse(s, i, &segs, out);
                    while *i < s.len() && s[*i].is_whitespace() {
                        *i += 1;
                    }
                    if *i < s.len() && s[*i] == ',' {
                        *i += 1;
                        continue;
                    }
                    if *i < s.len() && s[*i] == '}' {
                        *i += 1;
                    }
                    return;
                }
            }
            let start = *i;
            while *i < s.len() && (is_ident(s[*i]) || s[*i] == '*') {
                *i += 1;
            }
            let word: String = s[start..*i].iter().collect();
            if !word.is_empty() {
                segs.push(word);
            }
            while *i < s.len() && s[*i].is_whitespace() {
                *i += 1;
            }
            if s[*i..].starts_with(&[':', ':']) {
                *i += 2;
                continue;
            }
            // `as NAME`, then the end of this branch.
            while *i < s.len() && s[*i] != ',' && s[*i] != '}' {
                *i += 1;
            }
            out.push(segs);
            return;
        }
    }
    let chars: Vec<char> = tree.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    parse(&chars, &mut i, &[], &mut out);
    out
}

/// Every `crate::`/`super::` path the code names, as segments.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // `use` items, braces expanded.
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before_ok = at == 0 || !is_ident(rest[..at].chars().next_back().unwrap());
        let after = &rest[at + 4..];
        if before_ok {
            if let Some(end) = after.find(';') {
                out.extend(use_paths(&after[..end]));
            }
        }
        rest = after;
    }
    // Paths in code: `crate::a::b` and `super::a`.
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let at = from + at;
            from = at + start.len();
            if at > 0 && is_ident(code[..at].chars().next_back().unwrap()) {
                continue;
            }
            let mut segs = Vec::new();
            let mut j = at;
            loop {
                let word: String = code[j..].chars().take_while(|c| is_ident(*c)).collect();
                if word.is_empty() {
                    break;
                }
                j += word.len();
                segs.push(word);
                if code[j..].starts_with("::") {
                    j += 2;
                } else {
                    break;
                }
            }
            out.push(segs);
        }
    }
    out
}

/// The module file a path names from module `from`, if it is one of ours.
fn resolve(
    from: &[String],
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut base: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("super") => from.to_vec(),
        _ => return None,
    };
    let mut rest = path;
    if rest[0] == "crate" {
        rest = &rest[1..];
    }
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    for seg in rest {
        let mut next = base.clone();
        next.push(seg.clone());
        if modules.contains(&next) {
            base = next;
        } else {
            break;
        }
    }
    Some(base)
}

/// Edges between sibling modules: `(parent, a, b)` for a child `a` of
/// `parent` whose code (or its submodules') names something in `b`.
fn sibling_edges(files: &[ModFile]) -> BTreeSet<(Vec<String>, String, String, String)> {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| f.path.clone()).collect();
    let mut edges = BTreeSet::new();
    for f in files {
        for p in named_paths(&f.code) {
            let Some(to) = resolve(&f.path, &p, &modules) else {
                continue;
            };
            let common = f.path.iter().zip(&to).take_while(|(a, b)| a == b).count();
            // A module and its ancestors or descendants are one unit.
            if common == f.path.len() || common == to.len() {
                continue;
            }
            edges.insert((
                f.path[..common].to_vec(),
                f.path[common].clone(),
                to[common].clone(),
                f.rel.clone(),
            ));
        }
    }
    edges
}

/// The import cycles among the children of each module: each a list of
/// sibling names (a strongly connected set of two or more) and the files
/// whose imports make it.
fn cycles(files: &[ModFile]) -> Vec<(String, Vec<String>, BTreeSet<String>)> {
    let edges = sibling_edges(files);
    let mut by_parent: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (parent, a, b, _) in &edges {
        by_parent
            .entry(parent.clone())
            .or_default()
            .entry(a.clone())
            .or_default()
            .insert(b.clone());
    }
    let mut found = Vec::new();
    for (parent, graph) in by_parent {
        let reach = |from: &str| -> BTreeSet<String> {
            let mut seen = BTreeSet::new();
            let mut todo = vec![from.to_string()];
            while let Some(n) = todo.pop() {
                for m in graph.get(&n).into_iter().flatten() {
                    if seen.insert(m.clone()) {
                        todo.push(m.clone());
                    }
                }
            }
            seen
        };
        let mut done: BTreeSet<String> = BTreeSet::new();
        for a in graph.keys() {
            if done.contains(a) || !reach(a).contains(a) {
                continue;
            }
            let scc: Vec<String> = reach(a)
                .into_iter()
                .filter(|b| reach(b).contains(a))
                .collect();
            done.extend(scc.iter().cloned());
            let files: BTreeSet<String> = edges
                .iter()
                .filter(|(p, x, y, _)| *p == parent && scc.contains(x) && scc.contains(y))
                .map(|(_, _, _, f)| f.clone())
                .collect();
            let name = if parent.is_empty() {
                "crate".to_string()
            } else {
                format!("crate::{}", parent.join("::"))
            };
            found.push((name, scc, files));
        }
    }
    found
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let root = root();
    let mut failures = Vec::new();
    for src in crate_dirs(&root) {
        let files = crate_files(&root, &src);
        for (parent, scc, files) in cycles(&files) {
            let line = format!(
                "{}: in {parent}, {} import each other (in {})",
                src.strip_prefix(&root).unwrap().display(),
                scc.join(", "),
                files.iter().cloned().collect::<Vec<_>>().join(", ")
            );
            failures.push(line);
        }
    }
    assert!(
        failures.is_empty(),
        "import cycles:\n{}",
        failures.join("\n")
    );
}

#[test]
fn no_file_holds_more_than_800_lines_of_production_code() {
    let root = root();
    let mut failures = Vec::new();
    for src in crate_dirs(&root) {
        for f in crate_files(&root, &src) {
            if f.lines <= MAX_LINES {
                continue;
            }
            failures.push(format!("{}: {} lines of production code", f.rel, f.lines));
        }
    }
    assert!(
        failures.is_empty(),
        "files over {MAX_LINES} lines of production code (split them along their seams):\n{}",
        failures.join("\n")
    );
}

/// The checker itself, on made-up crates.
#[test]
fn the_checker_finds_a_cycle_and_reads_use_trees() {
    assert_eq!(
        use_paths("crate::{a::X, b::{c, d::Y as Z}, e}"),
        [
            vec!["crate", "a", "X"],
            vec!["crate", "b", "c"],
            vec!["crate", "b", "d", "Y"],
            vec!["crate", "e"],
        ]
    );
    let file = |path: &[&str], code: &str| ModFile {
        rel: format!("x/{}.rs", path.join("/")),
        path: path.iter().map(|s| s.to_string()).collect(),
        code: strip_comments(code),
        lines: code.lines().count(),
    };
    let files = [
        file(&[], "mod a; mod b; mod c; pub use a::X;"),
        file(&["a"], "use crate::b::Y; // crate::c::Z\n"),
        file(&["b"], "fn f() { super::c::g() }"),
        file(&["c"], "use crate::{a::X, b};\n/* crate::nothing */"),
        file(&["c", "inner"], "use super::super::a; use super::*;"),
    ];
    let found = cycles(&files);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].1, ["a", "b", "c"]);
    // Parent and child are one unit: no cycle.
    let files = [
        file(&[], "mod a;"),
        file(&["a"], "mod t; use t::X;"),
        file(&["a", "t"], "use super::Y;"),
    ];
    assert!(cycles(&files).is_empty());
    assert_eq!(
        production("fn a() {}\n\n#[cfg(test)]\nmod tests {\n}\n"),
        "fn a() {}\n\n"
    );
    assert_eq!(test_children("#[cfg(test)]\nmod tests;\n"), ["tests"]);
}
