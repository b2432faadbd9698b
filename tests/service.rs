//! Running as a service: the systemd units in packaging/ pass
//! `systemd-analyze verify`, the packaged configuration checks, the
//! attach template's command line is one `ethersan attach` takes, the
//! server tells `$NOTIFY_SOCKET` when it is ready, reloading and stopping,
//! and SIGHUP applies a changed configuration file live.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn the_systemd_unit_verifies_and_its_configuration_checks() {
    require_tool("systemd-analyze");
    let dir = tempfile::tempdir().unwrap();
    // Installed, the unit runs /usr/local/bin/ethersan; here, the build.
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/ethersan.service"
    ))
    .unwrap()
    .replace("/usr/local/bin/ethersan", env!("CARGO_BIN_EXE_ethersan"));
    let path = dir.path().join("ethersan.service");
    std::fs::write(&path, unit).unwrap();
    verify_unit(&path);
    // The configuration it serves is good as shipped.
    let out = ethersan(&[
        "serve",
        "--check",
        "--config",
        concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/ethersan.toml"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `systemd-analyze verify` on `unit` (a path; an instance of a template
/// is found as the template in the same directory): no output, success.
fn verify_unit(unit: &Path) {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(unit)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && text.trim().is_empty(), "{text}");
}

/// packaging/ethersan-attach@.service as installed, running the build.
fn attach_template() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/ethersan-attach@.service"
    ))
    .unwrap()
    .replace("/usr/local/bin/ethersan", env!("CARGO_BIN_EXE_ethersan"))
}

/// The values of `key=` in a unit.
fn unit_setting<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("{key}=");
    unit.lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .collect()
}

/// The unit's ExecStart= as systemd runs it: `${URL}` and
/// `${CREDENTIALS_DIRECTORY}` put in, `$ARGS` split into words.
fn attach_command(unit: &str, url: &str, args: &[&str], credentials: &Path) -> Vec<String> {
    let exec = unit_setting(unit, "ExecStart");
    assert_eq!(exec.len(), 1, "one ExecStart=: {exec:?}");
    let mut words = Vec::new();
    for w in exec[0].split_whitespace() {
        if w == "$ARGS" {
            words.extend(args.iter().map(|a| a.to_string()));
            continue;
        }
        let w = w.replace("${URL}", url).replace(
            "${CREDENTIALS_DIRECTORY}",
            &credentials.display().to_string(),
        );
        assert!(
            !w.contains('$'),
            "ExecStart= uses a variable the test does not set: {w}"
        );
        words.push(w);
    }
    assert_eq!(words[0], env!("CARGO_BIN_EXE_ethersan"));
    words
}

/// What a credential holds when its file is missing: the unit's
/// `SetCredential=ID:VALUE`, C escapes undone (`\n` is all it uses).
fn credential_default(unit: &str, id: &str) -> String {
    let values: Vec<&str> = unit_setting(unit, "SetCredential")
        .into_iter()
        .filter_map(|v| v.strip_prefix(id)?.strip_prefix(':'))
        .collect();
    assert_eq!(values.len(), 1, "one SetCredential={id}: {values:?}");
    values[0].replace("\\n", "\n")
}

#[test]
fn the_attach_template_verifies_and_its_command_line_is_one_attach_takes() {
    require_tool("systemd-analyze");
    let dir = tempfile::tempdir().unwrap();
    let unit = attach_template();
    std::fs::write(dir.path().join("ethersan-attach@.service"), &unit).unwrap();
    // What `systemctl enable --now ethersan-attach@lun0` starts.
    verify_unit(&dir.path().join("ethersan-attach@lun0.service"));

    // Every secret is an optional credential with a default, and the
    // command line reads each from the credentials directory.
    for id in ["chap", "group-secret"] {
        let load = format!("{id}:/etc/ethersan/attach/%i.{id}");
        assert!(
            unit_setting(&unit, "LoadCredential").contains(&load.as_str()),
            "LoadCredential={load}"
        );
    }
    let creds = dir.path().join("credentials");
    std::fs::create_dir(&creds).unwrap();
    for id in ["chap", "group-secret"] {
        std::fs::write(creds.join(id), credential_default(&unit, id)).unwrap();
    }
    let url = "iscsi://127.0.0.1:1/iqn.2026-11.org.ethersan:disk/0";
    // The ARGS= of docs/block-device.md and the unit's header, and more.
    let args = [
        "--index",
        "0",
        "--connections",
        "4",
        "--reconnect-timeout",
        "60s",
        "--read-only",
        "--timeout",
        "10s",
    ];
    let run = |words: &[String], extra: &[&str]| {
        Command::new(&words[0])
            .args(&words[1..])
            .args(extra)
            .env_remove("ETHERSAN_CHAP")
            .env_remove("ETHERSAN_GROUP_SECRET")
            .output()
            .unwrap()
    };
    // With the credentials' defaults (no files under /etc), every
    // argument parses: --help, last, stops clap once all before it are
    // taken (an unknown flag or a refused value fails instead).
    let words = attach_command(&unit, url, &args, &creds);
    let out = run(&words, &["--help"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("--chap-file"),
        "{words:?}: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And the chap credential is what --chap-file reads: a missing one is
    // named, before any device or connection.
    std::fs::remove_file(creds.join("chap")).unwrap();
    let out = run(&words, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let chap = creds.join("chap").display().to_string();
    assert!(
        !out.status.success()
            && stderr.contains(&format!("invalid value '{chap}' for '--chap-file <FILE>'"))
            && stderr.contains("no such file"),
        "{stderr}"
    );
}

/// The datagrams the server sends to its notify socket.
struct Notifications(UnixDatagram);

impl Notifications {
    fn bind(dir: &Path) -> (Notifications, String) {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        (Notifications(sock), path.display().to_string())
    }

    /// The next message that contains `what`, skipping others.
    fn wait_for(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut buf = [0u8; 4096];
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            if let Ok(n) = self.0.recv(&mut buf) {
                let m = String::from_utf8_lossy(&buf[..n]).into_owned();
                if m.lines().any(|l| l == what || l.starts_with(what)) {
                    return m;
                }
                seen.push(m);
            }
        }
        panic!("no {what} notification; got {seen:?}");
    }
}

fn write_config(path: &Path, targets: &str) {
    std::fs::write(
        path,
        format!("portals = [\"127.0.0.1:0\"]\n[options]\nnop_interval_secs = 0\n{targets}"),
    )
    .unwrap();
}

fn luns_of(url: &str) -> String {
    let out = ethersan(&["ls", "--json", url]);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn readiness_reload_and_stop_are_notified_and_sighup_applies_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (notes, socket) = Notifications::bind(dir.path());
    let conf = dir.path().join("ethersan.toml");
    let one = format!("[[target]]\nname = \"{IQN}\"\nlun = [\"a.img:1M\"]\n");
    write_config(&conf, &one);
    let mut s = Server::start_args_env(
        &[
            "serve".to_string(),
            "--config".to_string(),
            conf.display().to_string(),
        ],
        Some(dir.path()),
        &[("NOTIFY_SOCKET", &socket)],
    );
    let ready = notes.wait_for("READY=1");
    assert!(
        ready.contains("STATUS=serving 1 target(s) on 127.0.0.1:"),
        "{ready}"
    );
    let portal = s.addr.clone();

    // A second LUN and a second target, applied by SIGHUP.
    let two = format!(
        "[[target]]\nname = \"{IQN}\"\nlun = [\"a.img:1M\", \"ram:2M\"]\n[[target]]\nname = \"{IQN}2\"\nlun = [\"ram:1M\"]\n"
    );
    write_config(&conf, &two);
    let hup = |s: &Server| {
        // SAFETY: kill with a pid we spawned; no memory involved.
        unsafe { libc::kill(s.child.id() as i32, libc::SIGHUP) };
    };
    hup(&s);
    let reloading = notes.wait_for("RELOADING=1");
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    notes.wait_for("READY=1");
    let ls = luns_of(&format!("iscsi://{portal}/{IQN}"));
    assert!(
        ls.contains("\"lun\":1") || ls.contains("\"lun\": 1"),
        "LUN 1 not added: {ls}"
    );
    let disc = ok(&ethersan(&["discover", &portal]));
    assert!(
        disc.contains(&format!("{IQN}2")),
        "target not added: {disc}"
    );

    // A broken file changes nothing.
    std::fs::write(
        &conf,
        "portals = [\"127.0.0.1:0\"]\n[[target]]\nname = \"bad name\"\n",
    )
    .unwrap();
    hup(&s);
    notes.wait_for("READY=1");
    let disc = ok(&ethersan(&["discover", &portal]));
    assert!(
        disc.contains(&format!("{IQN}2")),
        "a failed reload changed the targets: {disc}"
    );

    // Back to one target with one LUN.
    write_config(&conf, &one);
    hup(&s);
    notes.wait_for("READY=1");
    let disc = ok(&ethersan(&["discover", &portal]));
    assert!(
        !disc.contains(&format!("{IQN}2")),
        "target not removed: {disc}"
    );
    let ls = luns_of(&format!("iscsi://{portal}/{IQN}"));
    assert!(
        !(ls.contains("\"lun\":1") || ls.contains("\"lun\": 1")),
        "LUN 1 not removed: {ls}"
    );

    s.stop();
    notes.wait_for("STOPPING=1");
    let log = s.log.lock().unwrap().clone();
    assert!(
        log.iter()
            .any(|l| l.contains(&format!("reload: target {IQN}: added LUN 1"))),
        "{log:?}"
    );
    assert!(
        log.iter()
            .any(|l| l.contains("failed, nothing changed") && l.contains("bad name")),
        "{log:?}"
    );
}

#[test]
fn completions_and_manual_pages_are_generated() {
    // bash loads the completion and registers it for ethersan.
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source <({} completions bash) && complete -p ethersan",
            env!("CARGO_BIN_EXE_ethersan")
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("ethersan"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bash = ok(&ethersan(&["completions", "bash"]));
    for word in ["serve", "--lun", "--check", "cp", "bench", "--log-format"] {
        assert!(bash.contains(word), "bash completion lacks {word}");
    }
    assert!(ok(&ethersan(&["completions", "zsh"])).starts_with("#compdef ethersan"));
    assert!(ok(&ethersan(&["completions", "fish"])).contains("complete -c ethersan"));
    // The manual: the main page and one per subcommand, at every level.
    let man = ok(&ethersan(&["man"]));
    assert!(
        man.contains(".TH ethersan 1") && man.contains("serve"),
        "{man}"
    );
    let serve = ok(&ethersan(&["man", "serve"]));
    assert!(
        serve.contains(".TH ethersan-serve 1") && serve.contains("lun"),
        "{serve}"
    );
    let add = ok(&ethersan(&["man", "ctl", "lun", "add"]));
    assert!(
        add.contains(".TH ethersan-ctl-lun-add 1") && add.contains(".SH EXAMPLES"),
        "{add}"
    );
    let out = ethersan(&["man", "nope"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("no manual page \"ethersan-nope\"")
            && err.contains("ethersan-serve, ethersan-discover"),
        "{err}"
    );
}
