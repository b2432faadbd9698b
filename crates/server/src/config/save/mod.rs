//! Writing the running configuration back as TOML (`ethersan ctl save`).
//!
//! Into a file that holds a configuration already (the one `serve
//! --config` read), a save is an edit, not a rewrite:
//! [`Config::edit_toml`] compares the running configuration with the one
//! the file describes, table by table and key by key, and changes only
//! what differs, through `toml_edit`, which keeps the comments, order and
//! layout of everything else. Both sides are compared in one canonical
//! form ([`Tab`](canonical::Tab)): only keys whose value is not the default, paths
//! relative to the file's directory, LUN numbers only where the order does
//! not imply them. So a CHAP secret that comes from `secret_file` or
//! `secret_env` stays a reference while it is unchanged, defaults are not
//! written (a later change of a default applies), paths keep their form
//! (no `./` added per save), and saving an unchanged configuration gives
//! the same bytes. A new file (or one that cannot be edited) is written
//! whole from the canonical form.

use std::path::Path;

mod canonical;
mod document;
mod editor;

use canonical::canonical;
use document::fresh;
use editor::Editor;

use toml_edit::DocumentMut;

use super::Config;

/// The header of a configuration file written whole.
const HEADER: &str = "# Written by `ethersan ctl save`: the running configuration of an\n\
# ethersan server (`ethersan serve --config THIS_FILE` serves it again).\n\
# Keys left out have their default value (docs/config.md).\n\n";

/// What [`Config::edit_toml`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditedToml {
    /// The text to write.
    pub text: String,
    /// What differs from the existing text, one line each
    /// (`target[iqn…].lun[1] added`); empty when nothing does.
    pub changes: Vec<String>,
    /// The existing text was kept where nothing changed (false: the text
    /// is written whole, because there was none or it could not be
    /// edited).
    pub edited: bool,
    /// Why an existing text could not be edited, if it could not.
    pub note: Option<String>,
}

impl Config {
    /// This configuration as a new TOML document, paths as they are.
    pub fn to_toml(&self) -> String {
        let mut out = String::from(HEADER);
        out.push_str(&fresh(&canonical(self, Path::new(""))).to_string());
        out
    }

    /// The TOML text of this configuration, made by editing `existing`
    /// (the file's text now, if there is one) where it differs.
    /// `origin` names the file in messages; `base` is its directory
    /// (relative paths are written relative to it, as the file is read).
    pub fn edit_toml(&self, existing: Option<&str>, origin: &str, base: &Path) -> EditedToml {
        let new = canonical(self, base);
        let whole = |note: Option<String>| EditedToml {
            text: format!("{HEADER}{}", fresh(&new)),
            changes: vec![match existing {
                Some(_) => format!("{origin} written anew"),
                None => format!("{origin} created"),
            }],
            edited: false,
            note,
        };
        let Some(text) = existing else {
            return whole(None);
        };
        let mut doc: DocumentMut = match text.parse() {
            Ok(d) => d,
            Err(e) => return whole(Some(format!("it is not TOML ({e})"))),
        };
        let old = match Config::parse_toml(text, origin, base) {
            Ok(c) => canonical(&c, base),
            Err(e) => {
                return whole(Some(format!(
                    "it is not a configuration ethersan reads ({e})"
                )))
            }
        };
        let mut ed = Editor::default();
        ed.table(doc.as_table_mut(), &old, &new, "", true, false);
        let edited = doc.to_string();
        // What the edited text reads as must be what runs: anything the
        // edit missed (a key written in a form it does not know) makes the
        // file be written whole instead.
        match Config::parse_toml(&edited, origin, base) {
            Ok(c) if canonical(&c, base) == new => EditedToml {
                text: edited,
                changes: ed.changes,
                edited: true,
                note: None,
            },
            Ok(_) => whole(Some(
                "editing it in place would not give the running configuration".into(),
            )),
            Err(e) => whole(Some(format!("the edited file would not read ({e})"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    use crate::config::{LunConfig, Options};

    /// A hand-written file: comments, an order of its own, a secret in a
    /// file, spec strings and tables, explicit defaults.
    const FILE: &str = r#"# Storage for the lab.
portals = ["127.0.0.1:3260"]  # loopback only for now

[options]
queue_depth = 64   # the old HBA cannot take more

# CHAP for everyone; the secret stays out of this file.
[chap]
user = "lab"
secret_file = "chap.secret"

[[target]]
name = "iqn.2026-11.org.ethersan:lab"
# who may log in
allow_initiators = ["iqn.2026-11.org.ethersan:a"]

# The system disk.
[[target.lun]]
path = "disk0.img"
size = "16M"
write_cache = true   # explicit default, kept

# Scratch space.
[[target.lun]]
ram = "8M"

[[target]]
name = "iqn.2026-11.org.ethersan:other"
lun = ["ram:4M"]  # spec strings
"#;

    fn setup() -> (tempfile::TempDir, PathBuf, Config) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("chap.secret"), "a-secret-of-12+\n").unwrap();
        let file = dir.path().join("ethersan.toml");
        std::fs::write(&file, FILE).unwrap();
        let cfg = Config::from_toml_file(&file).unwrap();
        (dir, file, cfg)
    }

    fn edit(cfg: &Config, file: &Path) -> EditedToml {
        let text = std::fs::read_to_string(file).unwrap();
        cfg.edit_toml(Some(&text), "ethersan.toml", file.parent().unwrap())
    }

    #[test]
    fn an_unchanged_configuration_saves_to_the_same_bytes() {
        let (_dir, file, cfg) = setup();
        let e = edit(&cfg, &file);
        assert_eq!(e.text, FILE);
        assert!(e.edited && e.changes.is_empty(), "{e:?}");
        // The saved text reads back the same, and again saves the same.
        let again = Config::from_toml_file(&file).unwrap();
        assert_eq!(edit(&again, &file).text, FILE);
    }

    #[test]
    fn a_change_touches_only_its_keys_and_keeps_comments_and_references() {
        let (dir, file, mut cfg) = setup();
        // What `ctl lun add`, `ctl lun rm`, `ctl acl add` do: numbers
        // pinned, a LUN added and one removed, a network granted.
        let t = &mut cfg.targets[0];
        for (n, i) in t.numbered() {
            t.luns[i].number = Some(n);
        }
        let mut l = LunConfig::from_spec(&format!("{}:1M", dir.path().join("disk2.img").display()))
            .unwrap();
        l.number = Some(2);
        t.luns.push(l);
        t.luns.remove(1);
        t.access.rules.push(super::super::access::AclRule::network((
            "10.0.0.0".parse().unwrap(),
            8,
        )));
        let e = edit(&cfg, &file);
        let expected = FILE
            .replace(
                "allow_initiators = [\"iqn.2026-11.org.ethersan:a\"]\n",
                "allow = [\"iqn.2026-11.org.ethersan:a\", \"10.0.0.0/8\"]\n",
            )
            .replace(
                "# Scratch space.\n[[target.lun]]\nram = \"8M\"\n",
                "[[target.lun]]\nnumber = 2\npath = \"disk2.img\"\nsize = 1048576\n",
            );
        assert_eq!(e.text, expected, "{:?}", e.changes);
        assert!(e.edited, "{e:?}");
        assert_eq!(
            e.changes,
            vec![
                "target iqn.2026-11.org.ethersan:lab allow added",
                "target iqn.2026-11.org.ethersan:lab LUN 1 removed",
                "target iqn.2026-11.org.ethersan:lab LUN 2 added",
            ]
        );
        // It reads back as what runs (numbers included).
        std::fs::write(&file, &e.text).unwrap();
        let back = Config::from_toml_file(&file).unwrap();
        assert_eq!(canonical(&back, dir.path()), canonical(&cfg, dir.path()));
        assert_eq!(back.targets[0].numbered(), vec![(0, 0), (2, 1)]);
    }

    #[test]
    fn a_list_of_spec_strings_keeps_its_strings() {
        let (_dir, file, mut cfg) = setup();
        let t = &mut cfg.targets[1];
        t.luns.push(LunConfig::from_spec("ram:2M").unwrap());
        t.access
            .rules
            .push(super::super::access::AclRule::initiator(
                "iqn.2026-11.org.ethersan:b",
            ));
        let e = edit(&cfg, &file);
        assert!(
            e.text.ends_with(
                "name = \"iqn.2026-11.org.ethersan:other\"\nlun = [\"ram:4M\", { ram = 2097152 }]  # spec strings\nallow = [\"iqn.2026-11.org.ethersan:b\"]\n"
            ),
            "{}",
            e.text
        );
        assert!(e.text.starts_with(
            &FILE[..FILE
                .find("[[target]]\nname = \"iqn.2026-11.org.ethersan:other")
                .unwrap()]
        ));
    }

    #[test]
    fn a_new_secret_replaces_the_reference_and_defaults_are_not_written() {
        let (dir, file, mut cfg) = setup();
        let c = cfg.chap.as_mut().unwrap();
        c.initiator = ethersan_proto::chap::Credentials::new("lab", b"another-secret-1").unwrap();
        cfg.options.queue_depth = Options::default().queue_depth;
        let e = edit(&cfg, &file);
        assert!(
            e.text
                .contains("user = \"lab\"\nsecret = \"another-secret-1\"\n"),
            "{}",
            e.text
        );
        assert!(!e.text.contains("secret_file"), "{}", e.text);
        assert!(!e.text.contains("queue_depth"), "{}", e.text);
        assert!(e
            .text
            .contains("write_cache = true   # explicit default, kept"));
        std::fs::write(&file, &e.text).unwrap();
        let back = Config::from_toml_file(&file).unwrap();
        assert_eq!(canonical(&back, dir.path()), canonical(&cfg, dir.path()));
    }

    #[test]
    fn a_new_file_has_no_defaults_and_no_dot_paths() {
        let (dir, _file, cfg) = setup();
        let e = cfg.edit_toml(None, "new.toml", dir.path());
        assert!(!e.edited);
        for default in ["max_burst_length", "read_only", "engine", "data_dir", "./"] {
            assert!(!e.text.contains(default), "{default} in\n{}", e.text);
        }
        assert!(e.text.contains("path = \"disk0.img\""), "{}", e.text);
        // Saved, read and saved again: the same text (no `./` per save).
        let file = dir.path().join("new.toml");
        std::fs::write(&file, &e.text).unwrap();
        let back = Config::from_toml_file(&file).unwrap();
        assert_eq!(format!("{:?}", back.options), format!("{:?}", cfg.options));
        let again = back.edit_toml(None, "new.toml", dir.path());
        assert_eq!(again.text, e.text);
    }
}
