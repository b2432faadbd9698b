//! The manual pages (roff), generated from the command-line definitions so
//! they always match the binary, with the sections clap cannot know:
//! EXAMPLES, ENVIRONMENT, FILES and EXIT STATUS.
//!
//! One page per command at every level, named the way each page's
//! SUBCOMMANDS section points to the next (`ethersan-ctl(1)` lists
//! `ethersan-ctl-lun(1)`, which lists `ethersan-ctl-lun-add(1)`), so every
//! page another one names can be generated: `ethersan man ctl lun add`
//! prints one, `ethersan man --dir DIR` writes them all.

use std::path::{Path, PathBuf};

use clap::Command;

/// Why a page could not be made or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ManualError {
    /// No command has that path.
    #[error("no manual page {page:?}; the pages are: {pages}")]
    NoSuchPage {
        /// The page asked for, as `ethersan-a-b`.
        page: String,
        /// Every page there is, comma-separated.
        pages: String,
    },
    /// Rendering or writing failed.
    #[error("cannot write {path}: {cause} (check that the directory exists and is writable)")]
    Write {
        /// The file (or `stdout`).
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
}

/// Every page's name (`ethersan`, `ethersan-serve`, `ethersan-ctl-lun-add`, …)
/// with the command it documents, named as its page.
pub(crate) fn pages(root: Command) -> Vec<(String, Command)> {
    let mut root = root;
    root.build();
    let mut out = Vec::new();
    collect("ethersan", &root, &mut out);
    out
}

fn collect(name: &str, cmd: &Command, out: &mut Vec<(String, Command)>) {
    // clap names a command with a static string; each page's name is made
    // once per run.
    let page: &'static str = Box::leak(name.to_string().into_boxed_str());
    out.push((name.to_string(), cmd.clone().name(page)));
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        collect(&format!("{name}-{}", sub.get_name()), sub, out);
    }
}

/// The page for `path` (`[]` the main page, `["ctl", "lun", "add"]` or
/// `["ctl-lun-add"]` a subcommand's), as roff.
pub(crate) fn page(root: Command, path: &[String]) -> Result<Vec<u8>, ManualError> {
    let want = std::iter::once("ethersan".to_string())
        .chain(path.iter().cloned())
        .collect::<Vec<_>>()
        .join("-");
    let all = pages(root);
    let Some((name, cmd)) = all.iter().find(|(n, _)| *n == want) else {
        return Err(ManualError::NoSuchPage {
            page: want,
            pages: all
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    render(name, cmd.clone()).map_err(|cause| ManualError::Write {
        path: "stdout".into(),
        cause,
    })
}

/// Write every page into `dir` as `NAME.1`; returns the files written.
pub(crate) fn write_all(root: Command, dir: &Path) -> Result<Vec<PathBuf>, ManualError> {
    let mut written = Vec::new();
    for (name, cmd) in pages(root) {
        let path = dir.join(format!("{name}.1"));
        let roff = render(&name, cmd).map_err(|cause| ManualError::Write {
            path: path.clone(),
            cause,
        })?;
        std::fs::write(&path, roff).map_err(|cause| ManualError::Write {
            path: path.clone(),
            cause,
        })?;
        written.push(path);
    }
    Ok(written)
}

fn render(name: &str, cmd: Command) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd).render(&mut out)?;
    let top = name
        .strip_prefix("ethersan-")
        .map(|rest| rest.split('-').next().unwrap_or(rest));
    out.extend_from_slice(extra_sections(name, top).as_bytes());
    Ok(out)
}

/// Escape text for roff: a backslash doubled, a leading `.` or `'` guarded.
fn roff_text(s: &str) -> String {
    let s = s.replace('\\', "\\e").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}

fn section(out: &mut String, title: &str) {
    out.push_str(".SH ");
    out.push_str(title);
    out.push('\n');
}

/// A paragraph with a hanging tag: `.TP` tag, then the text.
fn item(out: &mut String, tag: &str, text: &str) {
    out.push_str(".TP\n\\fB");
    out.push_str(&roff_text(tag));
    out.push_str("\\fR\n");
    out.push_str(&roff_text(text));
    out.push('\n');
}

/// Commands shown as a literal block.
fn examples(out: &mut String, lines: &[&str]) {
    section(out, "EXAMPLES");
    out.push_str(".nf\n");
    for l in lines {
        out.push_str(&roff_text(l));
        out.push('\n');
    }
    out.push_str(".fi\n");
}

/// The sections after clap's: EXAMPLES (for the command or its top-level
/// subcommand), ENVIRONMENT, FILES, EXIT STATUS and SEE ALSO.
fn extra_sections(name: &str, top: Option<&str>) -> String {
    let mut s = String::new();
    let ex = example_lines(top);
    if !ex.is_empty() {
        examples(&mut s, ex);
    }
    section(&mut s, "ENVIRONMENT");
    let env: &[(&str, &str)] = &[
        ("ETHERSAN_LOG", "The log level and filter (tracing's EnvFilter syntax): info by default, debug for more detail, e.g. ETHERSAN_LOG=debug."),
        ("ETHERSAN_CHAP", "USER:SECRET: for serve, the CHAP credentials initiators must give; for the client, the credentials it logs in with (a URL's own credentials win)."),
        ("ETHERSAN_MUTUAL_CHAP", "USER:SECRET for mutual CHAP: the target proves itself with these."),
        ("ETHERSAN_DISCOVERY_CHAP", "USER:SECRET: serve's credentials for discovery sessions, instead of ETHERSAN_CHAP's."),
        ("ETHERSAN_TIMEOUT", "The client's wait for a connection, a login, each command, discovery and the logout (30s by default; 0 waits forever)."),
        ("ETHERSAN_GROUP", "The native transport's group name (eth:// and udp:// URLs, discover --eth/--udp, serve --eth/--udp)."),
        ("ETHERSAN_GROUP_SECRET", "The native transport's group secret, when no --group-secret-file is given."),
        ("ETHERSAN_API_SOCKET", "ctl: the server's management socket (default ./ethersan-data/ethersan.sock)."),
        ("NOTIFY_SOCKET", "serve: set by systemd for Type=notify units; the server says READY=1 once every portal listens, RELOADING=1 on SIGHUP and STOPPING=1 at shutdown."),
        ("JOURNAL_STREAM", "Set by systemd when stderr is the journal; the log lines then carry no timestamp of their own (the journal adds it)."),
    ];
    for (k, v) in env {
        item(&mut s, k, v);
    }
    section(&mut s, "FILES");
    let files: &[(&str, &str)] = &[
        ("./ethersan-data/", "serve's data directory (--data-dir): the embedded default's LUN file default-lun0.img and the management socket."),
        ("./ethersan-data/ethersan.sock", "The management API's unix socket (mode 0600) that ethersan ctl talks to (--api-socket); removed at a clean stop."),
        ("/etc/ethersan/ethersan.toml", "The packaged service's configuration (serve --config); see docs/config.md and examples/ethersan.toml."),
        ("PATH.id", "Beside a file LUN's backing file: the LUN's WWN and serial, made at its first start and kept."),
        ("PATH.pr", "Beside a LUN's backing file: its persistent reservations when an initiator set APTPL."),
    ];
    for (k, v) in files {
        item(&mut s, k, v);
    }
    section(&mut s, "\"EXIT STATUS\"");
    let status: &[(&str, &str)] = match top {
        Some("serve") => &[
            ("0", "The server stopped cleanly (SIGINT or SIGTERM: in-flight commands finished, every LUN flushed), or serve --check found the configuration good."),
            ("1", "The configuration or a backing store is wrong, a portal could not be bound, or serve --check found a problem; the message says what and what to do."),
            ("2", "The command line is wrong (an unknown option, a missing value)."),
        ],
        Some("discover") => &[
            ("0", "Something answered: at least one target (or AoE device, or native server) is listed."),
            ("1", "Nothing was found, or the portal could not be reached or refused the login."),
            ("2", "The command line is wrong."),
        ],
        _ => &[
            ("0", "Success."),
            ("1", "The command failed: the message on standard error says what and what to do."),
            ("2", "The command line is wrong (an unknown option, a missing value)."),
            ("141", "As for any program, when standard output is a pipe whose reader went away (| head): the shell reports death by SIGPIPE."),
        ],
    };
    for (k, v) in status {
        item(&mut s, k, v);
    }
    section(&mut s, "\"SEE ALSO\"");
    let mut see = vec!["ethersan(1)".to_string()];
    if name != "ethersan" {
        see.retain(|p| p != name);
    } else {
        see.clear();
    }
    see.extend(
        ["iscsiadm(8)", "iscsi-ls(1)", "losetup(8)", "fusermount3(1)"]
            .iter()
            .map(|s| s.to_string()),
    );
    s.push_str(&roff_text(&see.join(", ")));
    s.push_str("\n.PP\nREADME.md and docs/ in the ethersan source: config.md, admin.md, security.md, native-transport.md.\n");
    s
}

/// Examples for a top-level subcommand (or the main page), as a user types
/// them against the embedded default server.
fn example_lines(top: Option<&str>) -> &'static [&'static str] {
    match top {
        None => &[
            "ethersan serve                      # the embedded default on 127.0.0.1:3260",
            "ethersan ls iscsi://127.0.0.1:3260/iqn.2026-11.org.ethersan:default",
            "ethersan cp disk.raw iscsi://127.0.0.1:3260/iqn.2026-11.org.ethersan:default/0 --verify",
            "ethersan man --dir /usr/local/share/man/man1   # every page",
        ],
        Some("serve") => &[
            "ethersan serve",
            "ethersan serve --listen 127.0.0.1:3260 --target iqn.2026-11.org.example:disks --lun ./disk0.img:10G --lun ram:256M",
            "ethersan serve --config /etc/ethersan/ethersan.toml",
            "ethersan serve --check --config /etc/ethersan/ethersan.toml",
        ],
        Some("discover") => &[
            "ethersan discover 127.0.0.1:3260",
            "ethersan discover --aoe eth0",
            "ethersan discover --udp 127.0.0.1 --group lab --group-secret-file lab.secret",
        ],
        Some("ls") => &[
            "ethersan ls iscsi://127.0.0.1:3260/iqn.2026-11.org.ethersan:default",
            "ethersan ls iscsi://127.0.0.1:3260/iqn.2026-11.org.ethersan:default/0 --json",
            "ethersan ls aoe://eth0/0.1",
        ],
        Some("inquiry") => &[
            "ethersan inquiry iscsi://127.0.0.1:3260/iqn.2026-11.org.ethersan:default/0",
            "ethersan inquiry --json aoe://eth0/0.1",
        ],
        Some("cp") => &[
            "ethersan cp disk.raw iscsi://127.0.0.1:3260/iqn.2026-11.org.ethersan:default/0 --verify",
            "ethersan cp iscsi://127.0.0.1:3260/iqn.2026-11.org.ethersan:default/0 backup.raw",
            "ethersan cp iscsi://127.0.0.1:3260/iqn.2026-11.org.ethersan:default/0 - --length 1M | xxd | head",
        ],
        Some("bench") => &[
            "ethersan bench iscsi://127.0.0.1:3260/iqn.2026-11.org.ethersan:default/0 --rw randread --bs 4K --qd 32 --time 10s",
            "ethersan bench ./disk.raw --rw randread",
        ],
        Some("attach") => &[
            "mkdir -p /mnt/lun",
            "ethersan attach iscsi://127.0.0.1:3260/iqn.2026-11.org.ethersan:default/0 /mnt/lun &",
            "dev=$(losetup --find --show --direct-io=on /mnt/lun/lun0)",
            "umount /mnt/lun                     # after losetup -d $dev: flush, log out, exit 0",
        ],
        Some("ctl") => &[
            "ethersan ctl target add iqn.2026-11.org.example:db",
            "ethersan ctl lun add iqn.2026-11.org.example:db ./db.img:1G",
            "ethersan ctl lun resize iqn.2026-11.org.example:db 0 2G",
            "ethersan ctl session ls",
            "ethersan ctl save",
        ],
        Some("completions") => &[
            "ethersan completions bash > /etc/bash_completion.d/ethersan",
        ],
        Some("man") => &[
            "ethersan man serve > /usr/local/share/man/man1/ethersan-serve.1",
            "ethersan man ctl lun add",
            "ethersan man --dir /usr/local/share/man/man1",
        ],
        Some(_) => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli() -> Command {
        <crate::Cli as clap::CommandFactory>::command()
    }

    /// Every page a SUBCOMMANDS section names can itself be generated.
    #[test]
    fn every_page_named_by_another_exists() {
        let all = pages(cli());
        let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"ethersan-ctl-lun-add"), "{names:?}");
        for (name, cmd) in &all {
            let roff = String::from_utf8(render(name, cmd.clone()).unwrap()).unwrap();
            for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
                let pointed = format!("{name}-{}", sub.get_name());
                assert!(
                    roff.contains(&pointed.replace('-', "\\-")),
                    "{name} does not name {pointed}"
                );
                assert!(names.contains(&pointed.as_str()), "{pointed} has no page");
            }
        }
    }

    /// Each page has the sections a manual reader looks for.
    #[test]
    fn pages_have_the_usual_sections() {
        for (name, cmd) in pages(cli()) {
            let roff = String::from_utf8(render(&name, cmd).unwrap()).unwrap();
            for sec in [
                ".SH ENVIRONMENT",
                ".SH FILES",
                ".SH \"EXIT STATUS\"",
                ".SH \"SEE ALSO\"",
            ] {
                assert!(roff.contains(sec), "{name} lacks {sec}");
            }
            let top = name
                .strip_prefix("ethersan-")
                .map(|r| r.split('-').next().unwrap());
            if top.is_none() || !example_lines(top).is_empty() {
                assert!(roff.contains(".SH EXAMPLES"), "{name} lacks EXAMPLES");
            }
        }
    }

    #[test]
    fn a_page_by_words_or_by_name() {
        let a = page(cli(), &["ctl".into(), "lun".into(), "add".into()]).unwrap();
        let b = page(cli(), &["ctl-lun-add".into()]).unwrap();
        assert_eq!(a, b);
        let err = page(cli(), &["nope".into()]).unwrap_err().to_string();
        assert!(
            err.contains("ethersan-nope") && err.contains("ethersan-serve"),
            "{err}"
        );
    }

    /// Every subcommand that takes a LUN's URL says, in its --help, every
    /// scheme it takes.
    #[test]
    fn url_help_lists_every_scheme() {
        let mut cli = cli();
        cli.build();
        for (sub, arg) in [
            ("ls", "url"),
            ("inquiry", "url"),
            ("cp", "src"),
            ("cp", "dst"),
            ("bench", "target"),
            ("attach", "url"),
        ] {
            let cmd = cli.find_subcommand(sub).unwrap();
            let a = cmd
                .get_arguments()
                .find(|a| a.get_id() == arg)
                .unwrap_or_else(|| panic!("{sub} has no argument {arg}"));
            let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
            for scheme in ["iscsi://", "eth://", "udp://", "aoe://", "aoe+unix://"] {
                assert!(
                    help.contains(scheme),
                    "{sub} {arg}: {scheme} missing in {help:?}"
                );
            }
        }
    }

    #[test]
    fn roff_escapes() {
        assert_eq!(roff_text(".x-y\\"), "\\&.x\\-y\\e");
    }
}
