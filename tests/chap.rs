//! CHAP against real initiators: libiscsi's tools, QEMU's iSCSI driver and
//! ethersan's own client; one-way and mutual; wrong secrets refused with
//! authentication failure; repeated failures slowed down.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{require_tool, run, Server, IQN};

const USER: &str = "alice";
const SECRET: &str = "alice-secret-123";
const TARGET_USER: &str = "tgt";
const TARGET_SECRET: &str = "target-secret-456";

fn server() -> Server {
    Server::start_with(
        "ram:16M",
        &[
            "--chap",
            &format!("{USER}:{SECRET}"),
            "--mutual-chap",
            &format!("{TARGET_USER}:{TARGET_SECRET}"),
        ],
    )
}

fn url(server: &Server, user: &str, secret: &str, query: &str) -> String {
    format!("iscsi://{user}%{secret}@{}/{IQN}/0{query}", server.addr)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ethersan(args: &[&str], mutual: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ethersan"));
    c.args(args).env_remove("ETHERSAN_MUTUAL_CHAP");
    if let Some(m) = mutual {
        c.env("ETHERSAN_MUTUAL_CHAP", m);
    }
    c.output().unwrap()
}

#[test]
fn libiscsi_and_qemu_log_in_with_chap_and_wrong_secrets_are_refused() {
    require_tool("iscsi-inq");
    let server = server();
    let limit = Duration::from_secs(30);
    let ok = run("iscsi-inq", &[&url(&server, USER, SECRET, "")], limit);
    assert!(ok.status.success(), "one-way CHAP: {}", text(&ok));
    let mutual = url(
        &server,
        USER,
        SECRET,
        &format!("?target_user={TARGET_USER}&target_password={TARGET_SECRET}"),
    );
    let ok = run("iscsi-inq", &[&mutual], limit);
    assert!(ok.status.success(), "mutual CHAP: {}", text(&ok));
    // The target proves a secret the initiator does not expect: libiscsi refuses.
    let bad_target = url(
        &server,
        USER,
        SECRET,
        &format!("?target_user={TARGET_USER}&target_password=not-the-target-secret"),
    );
    let o = run("iscsi-inq", &[&bad_target], limit);
    assert!(
        !o.status.success() && text(&o).contains("CHAP_R"),
        "{}",
        text(&o)
    );
    // Wrong secret, unknown user, no CHAP at all: authentication failure.
    for u in [
        url(&server, USER, "wrong-secret-999", ""),
        url(&server, "mallory", SECRET, ""),
        format!("iscsi://{}/{IQN}/0", server.addr),
    ] {
        let o = run("iscsi-inq", &[&u], limit);
        assert!(!o.status.success(), "{u} logged in");
        assert!(
            text(&o).contains("Authentication failure"),
            "{u}: {}",
            text(&o)
        );
    }
    // Discovery sessions authenticate too.
    let ls = run(
        "iscsi-ls",
        &[&format!("iscsi://{USER}%{SECRET}@{}", server.addr)],
        limit,
    );
    assert!(
        ls.status.success() && text(&ls).contains(IQN),
        "{}",
        text(&ls)
    );
    // QEMU's iSCSI driver (libiscsi inside QEMU).
    if require_qemu() {
        let o = run(
            "qemu-img",
            &["info", "-f", "raw", &url(&server, USER, SECRET, "")],
            limit,
        );
        assert!(
            o.status.success() && text(&o).contains("16 MiB"),
            "{}",
            text(&o)
        );
        let o = run(
            "qemu-img",
            &[
                "info",
                "-f",
                "raw",
                &url(&server, USER, "wrong-secret-999", ""),
            ],
            limit,
        );
        assert!(
            !o.status.success(),
            "qemu-img logged in with a wrong secret"
        );
    }
}

fn require_qemu() -> bool {
    require_tool("qemu-img");
    true
}

#[test]
fn ethersan_client_one_way_and_mutual() {
    let server = server();
    let u = url(&server, USER, SECRET, "");
    let o = ethersan(&["inquiry", "--json", &u], None);
    assert!(o.status.success(), "{}", text(&o));
    let o = ethersan(
        &["inquiry", &u],
        Some(&format!("{TARGET_USER}:{TARGET_SECRET}")),
    );
    assert!(o.status.success(), "mutual: {}", text(&o));
    let o = ethersan(
        &["inquiry", &u],
        Some(&format!("{TARGET_USER}:not-the-target-secret")),
    );
    assert!(
        !o.status.success() && text(&o).contains("authentication"),
        "{}",
        text(&o)
    );
    let o = ethersan(
        &["inquiry", &url(&server, USER, "wrong-secret-999", "")],
        None,
    );
    assert!(
        !o.status.success() && text(&o).contains("authentication failure"),
        "{}",
        text(&o)
    );
    let o = ethersan(&["inquiry", &url(&server, USER, "short", "")], None);
    assert!(
        !o.status.success() && text(&o).contains("at least 12 bytes"),
        "{}",
        text(&o)
    );
    // Discovery with and without CHAP.
    let o = ethersan(
        &[
            "discover",
            "--json",
            "--chap",
            &format!("{USER}:{SECRET}"),
            &server.addr,
        ],
        None,
    );
    assert!(o.status.success() && text(&o).contains(IQN), "{}", text(&o));
    let o = ethersan(&["discover", &server.addr], None);
    assert!(
        !o.status.success() && text(&o).contains("authentication failure"),
        "{}",
        text(&o)
    );
    // The server refuses a too-short secret at start.
    let o = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--lun",
            "ram:1M",
            "--chap",
            "u:short",
        ])
        .output()
        .unwrap();
    assert!(
        !o.status.success() && text(&o).contains("at least 12 bytes"),
        "{}",
        text(&o)
    );
}

#[test]
fn repeated_failures_from_one_address_are_slowed_down() {
    let server = server();
    let bad = url(&server, USER, "wrong-secret-999", "");
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let o = ethersan(&["inquiry", &bad], None);
        assert!(!o.status.success());
        times.push(t.elapsed());
    }
    assert!(
        times[..3].iter().all(|t| *t < Duration::from_millis(900)),
        "{times:?}"
    );
    assert!(
        times[3] >= Duration::from_millis(900) && times[4] >= Duration::from_millis(1900),
        "no back-off: {times:?}"
    );
    // The log says who failed and from where, never the secret.
    let log = server.log.lock().unwrap().join("\n");
    assert!(log.contains("login refused: wrong CHAP response"), "{log}");
    assert!(
        !log.contains("wrong-secret-999") && !log.contains(SECRET),
        "a secret reached the log"
    );
}

/// tgt as the CHAP peer of ethersan's client (tgt 1.0.85 reads CHAP_A=7 as
/// SHA-1, so the client does not offer 7).
#[test]
fn ethersan_client_speaks_chap_to_tgt() {
    require_tool("tgtd");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tgt.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let server = Server::start_tgt(&path, false, false);
    let port: u16 = server.addr.rsplit(':').next().unwrap().parse().unwrap();
    let control = (port % 10000 + 20000).to_string();
    for args in [
        vec![
            "--op",
            "new",
            "--mode",
            "account",
            "--user",
            USER,
            "--password",
            SECRET,
        ],
        vec![
            "--op", "bind", "--mode", "account", "--tid", "1", "--user", USER,
        ],
    ] {
        let ok = Command::new("tgtadm")
            .args(["-C", &control, "--lld", "iscsi"])
            .args(&args)
            .status()
            .unwrap()
            .success();
        assert!(ok, "tgtadm {args:?}");
    }
    let u = format!("iscsi://{USER}%{SECRET}@{}/{IQN}/1", server.addr);
    let o = ethersan(&["inquiry", &u], None);
    assert!(o.status.success(), "CHAP login to tgt: {}", text(&o));
    let bad = format!("iscsi://{USER}%wrong-secret-999@{}/{IQN}/1", server.addr);
    let o = ethersan(&["inquiry", &bad], None);
    assert!(!o.status.success(), "tgt accepted a wrong secret");
}

const TARGET_A: &str = "iqn.2026-11.org.ethersan:a";
const TARGET_B: &str = "iqn.2026-11.org.ethersan:b";
const TARGET_C: &str = "iqn.2026-11.org.ethersan:c";

/// Target A takes credentials X, target B takes Y (its secret from a
/// file), target C none, discovery takes Z: each refuses the others'.
#[test]
fn per_target_and_discovery_credentials() {
    require_tool("iscsi-inq");
    require_tool("iscsi-ls");
    let dir = tempfile::tempdir().unwrap();
    let y_file = dir.path().join("y.secret");
    std::fs::write(&y_file, "y-secret-67890\n").unwrap();
    let cfg = dir.path().join("chap.toml");
    std::fs::write(
        &cfg,
        format!(
            "portals = [\"127.0.0.1:0\"]\n\
             [[target]]\nname = \"{TARGET_A}\"\nlun = [\"ram:4M\"]\n\
             [target.chap]\nuser = \"xuser\"\nsecret = \"x-secret-12345\"\n\
             [[target]]\nname = \"{TARGET_B}\"\nlun = [\"ram:4M\"]\n\
             [target.chap]\nuser = \"yuser\"\nsecret_file = {:?}\n\
             [[target]]\nname = \"{TARGET_C}\"\nlun = [\"ram:4M\"]\n\
             [discovery.chap]\nuser = \"zuser\"\nsecret = \"z-secret-12345\"\n",
            y_file.display().to_string()
        ),
    )
    .unwrap();
    let server =
        Server::start_args(&["serve".into(), "--config".into(), cfg.display().to_string()]);
    let limit = Duration::from_secs(30);
    let x = ("xuser", "x-secret-12345");
    let y = ("yuser", "y-secret-67890");
    let z = ("zuser", "z-secret-12345");
    let lun_url = |t: &str, c: Option<(&str, &str)>| match c {
        Some((u, s)) => format!("iscsi://{u}%{s}@{}/{t}/0", server.addr),
        None => format!("iscsi://{}/{t}/0", server.addr),
    };
    // One initiator name per group keeps each under the back-off threshold.
    let inq = |name: &str, url: &str| run("iscsi-inq", &["-i", name, url], limit);
    let ok = |o: &Output, what: &str| assert!(o.status.success(), "{what}: {}", text(o));
    let refused = |o: &Output, what: &str| {
        assert!(
            !o.status.success() && text(o).contains("Authentication failure"),
            "{what} was not refused: {}",
            text(o)
        )
    };
    let ia = "iqn.2026-11.org.test:ia";
    ok(&inq(ia, &lun_url(TARGET_A, Some(x))), "A with X");
    refused(&inq(ia, &lun_url(TARGET_A, Some(y))), "A with Y");
    refused(&inq(ia, &lun_url(TARGET_A, Some(z))), "A with Z");
    refused(&inq(ia, &lun_url(TARGET_A, None)), "A without CHAP");
    let ib = "iqn.2026-11.org.test:ib";
    ok(&inq(ib, &lun_url(TARGET_B, Some(y))), "B with Y");
    refused(&inq(ib, &lun_url(TARGET_B, Some(x))), "B with X");
    refused(&inq(ib, &lun_url(TARGET_B, Some(z))), "B with Z");
    ok(
        &inq("iqn.2026-11.org.test:ic", &lun_url(TARGET_C, None)),
        "C needs no CHAP",
    );
    // Discovery: Z only; it lists every target.
    let id = "iqn.2026-11.org.test:id";
    let portal = |c: Option<(&str, &str)>| match c {
        Some((u, s)) => format!("iscsi://{u}%{s}@{}", server.addr),
        None => format!("iscsi://{}", server.addr),
    };
    let ls = run("iscsi-ls", &["-i", id, &portal(Some(z))], limit);
    assert!(
        ls.status.success()
            && [TARGET_A, TARGET_B, TARGET_C]
                .iter()
                .all(|t| text(&ls).contains(t)),
        "{}",
        text(&ls)
    );
    for (c, what) in [
        (Some(x), "discovery with X"),
        (None, "discovery without CHAP"),
    ] {
        let o = run("iscsi-ls", &["-i", id, &portal(c)], limit);
        assert!(
            !text(&o).contains(TARGET_A),
            "{what} listed targets: {}",
            text(&o)
        );
    }
    // ethersan's own client: discover --chap and user%secret URLs.
    let zc = format!("{}:{}", z.0, z.1);
    let o = ethersan(&["discover", "--json", "--chap", &zc, &server.addr], None);
    assert!(
        o.status.success() && text(&o).contains(TARGET_B),
        "{}",
        text(&o)
    );
    let xc = format!("{}:{}", x.0, x.1);
    let o = ethersan(&["discover", "--chap", &xc, &server.addr], None);
    assert!(
        !o.status.success() && text(&o).contains("authentication failure"),
        "{}",
        text(&o)
    );
    let o = ethersan(&["inquiry", &lun_url(TARGET_B, Some(y))], None);
    assert!(o.status.success(), "{}", text(&o));
    // The log names who failed, never a secret.
    let log = server.log.lock().unwrap().join("\n");
    assert!(log.contains("login refused: unknown CHAP user"), "{log}");
    for s in [x.1, y.1, z.1] {
        assert!(!log.contains(s), "a secret reached the log");
    }
}

/// Back-off is per (initiator name, address): hammering one name slows
/// that name, not another initiator from the same address; failing with
/// many names from one address slows every name from it.
#[test]
fn back_off_follows_the_name_and_caps_the_address() {
    require_tool("iscsi-inq");
    let server = server();
    let limit = Duration::from_secs(60);
    let timed = |f: &dyn Fn() -> Output| {
        let t = Instant::now();
        let o = f();
        (o, t.elapsed())
    };
    // The client's name fails five times: the 4th and 5th wait.
    let bad = url(&server, USER, "wrong-secret-999", "");
    let mut times = Vec::new();
    for _ in 0..5 {
        let (o, t) = timed(&|| ethersan(&["inquiry", &bad], None));
        assert!(!o.status.success());
        times.push(t);
    }
    assert!(
        times[3] >= Duration::from_millis(900) && times[4] >= Duration::from_millis(1900),
        "no back-off: {times:?}"
    );
    // Another initiator name from the same address logs in at once.
    let good = url(&server, USER, SECRET, "");
    let (o, t) = timed(&|| {
        run(
            "iscsi-inq",
            &["-i", "iqn.2026-11.org.test:other", &good],
            limit,
        )
    });
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        t < Duration::from_millis(900),
        "another name was slowed: {t:?}"
    );
    // The hammered name itself waits, even with the right secret.
    let (o, t) = timed(&|| ethersan(&["inquiry", &good], None));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        t >= Duration::from_millis(1900),
        "the failing name was not slowed: {t:?}"
    );
    // Rotating names: eight failing names (the client's success above
    // cleared its own record) and then every new name from this address
    // waits.
    for i in 0..8 {
        let name = format!("iqn.2026-11.org.test:rot{i}");
        let (o, t) = timed(&|| run("iscsi-inq", &["-i", &name, &bad], limit));
        assert!(!o.status.success());
        assert!(t < Duration::from_millis(900), "{name}: {t:?}");
    }
    let (o, t) = timed(&|| {
        run(
            "iscsi-inq",
            &["-i", "iqn.2026-11.org.test:fresh", &good],
            limit,
        )
    });
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        t >= Duration::from_millis(900),
        "name rotation was not slowed: {t:?}"
    );
}

/// The back-off wait does not count against the login timeout: with a 1 s
/// timeout, a login slowed by 2 s with the right secret still succeeds.
#[test]
fn a_slowed_login_with_the_right_secret_is_not_cut_off_by_the_login_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("slow.toml");
    std::fs::write(
        &cfg,
        format!(
            "portals = [\"127.0.0.1:0\"]\n[options]\nlogin_timeout_secs = 1\n\
             [[target]]\nname = \"{IQN}\"\nlun = [\"ram:4M\"]\n\
             [chap]\nuser = \"{USER}\"\nsecret = \"{SECRET}\"\n"
        ),
    )
    .unwrap();
    let server =
        Server::start_args(&["serve".into(), "--config".into(), cfg.display().to_string()]);
    let bad = url(&server, USER, "wrong-secret-999", "");
    for i in 0..4 {
        let o = ethersan(&["inquiry", &bad], None);
        assert!(
            !o.status.success() && text(&o).contains("authentication failure"),
            "attempt {i}: {}",
            text(&o)
        );
    }
    let t = Instant::now();
    let o = ethersan(&["inquiry", &url(&server, USER, SECRET, "")], None);
    let took = t.elapsed();
    assert!(o.status.success(), "after {took:?}: {}", text(&o));
    assert!(took >= Duration::from_millis(1900), "not slowed: {took:?}");
}

/// `serve --discovery-chap`: discovery sessions take their own credentials.
#[test]
fn discovery_chap_on_the_command_line() {
    let server = Server::start_with(
        "ram:4M",
        &[
            "--chap",
            &format!("{USER}:{SECRET}"),
            "--discovery-chap",
            "zuser:z-secret-12345",
        ],
    );
    let o = ethersan(
        &["discover", "--chap", "zuser:z-secret-12345", &server.addr],
        None,
    );
    assert!(o.status.success() && text(&o).contains(IQN), "{}", text(&o));
    for wrong in [
        format!("{USER}:{SECRET}"),
        "zuser:wrong-secret-99".to_string(),
    ] {
        let o = ethersan(&["discover", "--chap", &wrong, &server.addr], None);
        assert!(
            !o.status.success() && text(&o).contains("authentication failure"),
            "{wrong}: {}",
            text(&o)
        );
    }
    let o = ethersan(&["inquiry", &url(&server, USER, SECRET, "")], None);
    assert!(o.status.success(), "{}", text(&o));
    let o = ethersan(
        &["inquiry", &url(&server, "zuser", "z-secret-12345", "")],
        None,
    );
    assert!(
        !o.status.success(),
        "discovery credentials opened the target"
    );
}

/// `chap = "none"` in a target's table: logins to it need no CHAP while a
/// global `[chap]` still guards the other target and discovery.
#[test]
fn a_target_that_opts_out_of_chap() {
    require_tool("iscsi-inq");
    require_tool("iscsi-ls");
    const OPEN: &str = "iqn.2026-11.org.test:open";
    const SHUT: &str = "iqn.2026-11.org.test:shut";
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("optout.toml");
    std::fs::write(
        &cfg,
        format!(
            "portals = [\"127.0.0.1:0\"]\n\
             [chap]\nuser = \"{USER}\"\nsecret = \"{SECRET}\"\n\
             [[target]]\nname = \"{OPEN}\"\nchap = \"none\"\nlun = [\"ram:4M\"]\n\
             [[target]]\nname = \"{SHUT}\"\nlun = [\"ram:4M\"]\n"
        ),
    )
    .unwrap();
    let server =
        Server::start_args(&["serve".into(), "--config".into(), cfg.display().to_string()]);
    let limit = Duration::from_secs(30);
    let lun_url = |t: &str, chap: bool| {
        if chap {
            format!("iscsi://{USER}%{SECRET}@{}/{t}/0", server.addr)
        } else {
            format!("iscsi://{}/{t}/0", server.addr)
        }
    };
    let inq = |name: &str, url: &str| run("iscsi-inq", &["-i", name, url], limit);
    let open = inq("iqn.2026-11.org.test:o1", &lun_url(OPEN, false));
    assert!(
        open.status.success(),
        "open target without CHAP: {}",
        text(&open)
    );
    let shut = inq("iqn.2026-11.org.test:s1", &lun_url(SHUT, false));
    assert!(
        !shut.status.success() && text(&shut).contains("Authentication failure"),
        "the other target let a login without CHAP in: {}",
        text(&shut)
    );
    let shut = inq("iqn.2026-11.org.test:s2", &lun_url(SHUT, true));
    assert!(
        shut.status.success(),
        "the other target with CHAP: {}",
        text(&shut)
    );
    // ethersan's own client, without credentials, to the open target.
    let o = ethersan(&["inquiry", &lun_url(OPEN, false)], None);
    assert!(o.status.success(), "{}", text(&o));
    // Discovery follows the global [chap] (discovery = true by default):
    // without CHAP nothing is listed; with it, both targets are.
    let portal = format!("iscsi://{}", server.addr);
    let o = run(
        "iscsi-ls",
        &["-i", "iqn.2026-11.org.test:d1", &portal],
        limit,
    );
    assert!(
        !o.status.success() && !text(&o).contains(OPEN),
        "discovery without CHAP: {}",
        text(&o)
    );
    let with = format!("iscsi://{USER}%{SECRET}@{}", server.addr);
    let o = run("iscsi-ls", &["-i", "iqn.2026-11.org.test:d2", &with], limit);
    assert!(
        o.status.success() && text(&o).contains(OPEN) && text(&o).contains(SHUT),
        "discovery with CHAP: {}",
        text(&o)
    );
    // The start says which targets are open, and only those.
    let log = server.log.lock().unwrap().join("\n");
    let line = log
        .lines()
        .find(|l| l.contains("CHAP opt-out"))
        .unwrap_or_else(|| panic!("no line naming the open targets: {log}"));
    assert!(line.contains(OPEN) && !line.contains(SHUT), "{line}");
    assert!(!line.contains("WARN"), "{line}");
}
