//! Running as a service: the systemd unit in packaging/ passes
//! `systemd-analyze verify`, the packaged configuration checks, the server
//! tells `$NOTIFY_SOCKET` when it is ready, reloading and stopping, and
//! SIGHUP applies a changed configuration file live.

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
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && text.trim().is_empty(), "{text}");
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
