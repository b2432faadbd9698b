//! Target access lists: allowed initiator names and source networks decide
//! who may log in (others get an authorization failure) and which targets
//! SendTargets shows.

mod common;

use std::process::Output;
use std::time::Duration;

use common::{require_tool, run, Server, IQN};

const CLIENT: &str = "iqn.2026-11.org.ethersan:client";

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ethersan(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(args)
        .env_remove("ETHERSAN_CHAP")
        .output()
        .unwrap()
}

#[test]
fn only_allowed_initiators_log_in_and_see_the_target() {
    require_tool("iscsi-inq");
    let server = Server::start_with("ram:8M", &["--allow-initiator", CLIENT]);
    let url = server.url(0);
    let limit = Duration::from_secs(30);
    // ethersan's client logs in as CLIENT: allowed.
    let o = ethersan(&["inquiry", &url]);
    assert!(o.status.success(), "{}", text(&o));
    // libiscsi's default name is not on the list.
    let o = run("iscsi-inq", &[&url], limit);
    assert!(
        !o.status.success() && text(&o).contains("514"),
        "want authorization failure: {}",
        text(&o)
    );
    // The same tool under an allowed name.
    let o = run("iscsi-inq", &["-i", CLIENT, &url], limit);
    assert!(o.status.success(), "{}", text(&o));
    // SendTargets lists the target only to an allowed initiator.
    let o = ethersan(&["discover", &server.addr]);
    assert!(o.status.success() && text(&o).contains(IQN), "{}", text(&o));
    let o = run("iscsi-ls", &[&format!("iscsi://{}", server.addr)], limit);
    assert!(
        !text(&o).contains(IQN),
        "a disallowed initiator saw the target: {}",
        text(&o)
    );
}

#[test]
fn source_networks_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("acl.toml");
    let write = |nets: &str| {
        std::fs::write(
            &cfg,
            format!("portals = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\nlun = [\"ram:4M\"]\nallow_networks = [{nets}]\n"),
        )
        .unwrap();
    };
    write("\"10.0.0.0/8\"");
    let server =
        Server::start_args(&["serve".into(), "--config".into(), cfg.display().to_string()]);
    let o = ethersan(&["inquiry", &server.url(0)]);
    assert!(
        !o.status.success() && text(&o).contains("authorization failure"),
        "{}",
        text(&o)
    );
    drop(server);
    write("\"10.0.0.0/8\", \"127.0.0.0/8\"");
    let server =
        Server::start_args(&["serve".into(), "--config".into(), cfg.display().to_string()]);
    let o = ethersan(&["inquiry", &server.url(0)]);
    assert!(o.status.success(), "{}", text(&o));
    // A bad network is a configuration error with its line.
    write("\"10.0.0.0/33\"");
    let o = ethersan(&["serve", "--config", cfg.to_str().unwrap()]);
    assert!(
        !o.status.success() && text(&o).contains("acl.toml:5:"),
        "{}",
        text(&o)
    );
}

#[test]
fn lun_masking_hides_a_lun_from_other_initiators() {
    require_tool("iscsi-ls");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("mask.toml");
    std::fs::write(
        &cfg,
        format!(
            "portals = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nram = \"4M\"\n[[target.lun]]\nram = \"8M\"\ninitiators = [\"{CLIENT}\"]\n"
        ),
    )
    .unwrap();
    let server =
        Server::start_args(&["serve".into(), "--config".into(), cfg.display().to_string()]);
    let limit = Duration::from_secs(30);
    let luns_seen_by = |name: Option<&str>| {
        let portal = format!("iscsi://{}", server.addr);
        let mut args = vec!["-s"];
        if let Some(n) = name {
            args.extend(["-i", n]);
        }
        args.push(&portal);
        let o = run("iscsi-ls", &args, limit);
        assert!(o.status.success(), "{}", text(&o));
        text(&o).lines().filter(|l| l.contains("Lun:")).count()
    };
    assert_eq!(luns_seen_by(None), 1, "another initiator sees only LUN 0");
    assert_eq!(
        luns_seen_by(Some(CLIENT)),
        2,
        "the listed initiator sees both"
    );
    let lun1 = server.url(1);
    let o = run("iscsi-inq", &["-i", CLIENT, &lun1], limit);
    assert!(o.status.success(), "{}", text(&o));
    let o = run("iscsi-readcapacity16", &[&lun1], limit);
    assert!(
        !o.status.success(),
        "a masked LUN answered READ CAPACITY: {}",
        text(&o)
    );
    let o = ethersan(&["ls", "--json", &format!("iscsi://{}/{IQN}", server.addr)]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v.as_array().unwrap().len(),
        2,
        "ethersan's client is on the list: {v}"
    );
}

fn ctl(sock: &std::path::Path, args: &[&str]) -> Output {
    let mut all = vec!["ctl", "--socket", sock.to_str().unwrap()];
    all.extend_from_slice(args);
    ethersan(&all)
}

fn ctl_ok(sock: &std::path::Path, args: &[&str]) -> Output {
    let o = ctl(sock, args);
    assert!(o.status.success(), "ctl {args:?}: {}", text(&o));
    o
}

/// Issue 26: rules are ORed. Granting a network to a target that admits
/// one initiator widens access (it used to lock that initiator out while
/// printing "granted"); the first rule on an open target and a removal
/// narrow it and say so, naming the sessions that end; `acl ls` shows
/// the rules and their meaning; the refused client gets a hint.
#[test]
fn a_grant_widens_access_and_narrowing_changes_warn() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let server = Server::start_with(
        "ram:4M",
        &[
            "--api-socket",
            sock.to_str().unwrap(),
            "--data-dir",
            dir.path().to_str().unwrap(),
        ],
    );
    let url = server.url(0);
    // Open: our client logs in.
    let o = ethersan(&["inquiry", &url]);
    assert!(o.status.success(), "{}", text(&o));
    // The first rule narrows the open target: a warning.
    let o = ctl_ok(
        &sock,
        &["acl", "add", IQN, "iqn.2026-11.org.ethersan:someone-else"],
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("warning: target")
            && text(&o).contains("admitted every initiator"),
        "{}",
        text(&o)
    );
    // Our client is refused now, with a hint that says what to do.
    let o = ethersan(&["inquiry", &url]);
    assert!(!o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("authorization failure") && t.contains("ethersan ctl acl add"),
        "no hint: {t}"
    );
    // Granting our name admits us; granting a network too keeps us in
    // (the old lists were ANDed: 10.0.0.0/8 locked 127.0.0.1 out).
    let o = ctl_ok(&sock, &["acl", "add", IQN, CLIENT]);
    assert!(
        !text(&o).contains("warning"),
        "a widening grant warned: {}",
        text(&o)
    );
    let o = ctl_ok(&sock, &["acl", "add", IQN, "10.0.0.0/8"]);
    assert!(!text(&o).contains("warning"), "{}", text(&o));
    let o = ethersan(&["inquiry", &url]);
    assert!(
        o.status.success(),
        "a grant locked an allowed initiator out: {}",
        text(&o)
    );
    // A name from a network is one rule.
    ctl_ok(
        &sock,
        &[
            "acl",
            "add",
            IQN,
            "iqn.2026-11.org.ethersan:third@127.0.0.0/8",
        ],
    );
    let ls = String::from_utf8_lossy(&ctl_ok(&sock, &["acl", "ls", IQN]).stdout).into_owned();
    for want in [
        "iqn.2026-11.org.ethersan:someone-else",
        "any initiator from 10.0.0.0/8",
        "initiator iqn.2026-11.org.ethersan:third from 127.0.0.0/8",
        &format!("initiator {CLIENT} from any address"),
    ] {
        assert!(ls.contains(want), "acl ls lacks {want:?}:\n{ls}");
    }
    // Removing our rule narrows access: a warning that names what the
    // rule admitted.
    let o = ctl_ok(&sock, &["acl", "rm", IQN, CLIENT]);
    assert!(
        text(&o).contains("warning:") && text(&o).contains("no longer admits"),
        "{}",
        text(&o)
    );
    let o = ethersan(&["inquiry", &url]);
    assert!(!o.status.success(), "{}", text(&o));
    // A bad rule: what is wrong and the forms a rule takes.
    let o = ctl(&sock, &["acl", "add", IQN, "iqn.2026-11.x:y@10.0.0.0/40"]);
    assert!(
        !o.status.success() && text(&o).contains("prefix length"),
        "{}",
        text(&o)
    );
}

/// Revoking a rule while its initiator is logged in names the session
/// that ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowing_change_names_the_sessions_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let server = Server::start_with(
        "ram:4M",
        &[
            "--api-socket",
            sock.to_str().unwrap(),
            "--data-dir",
            dir.path().to_str().unwrap(),
        ],
    );
    let opts = ethersan_initiator::LoginOptions {
        initiator_name: CLIENT.into(),
        target_name: Some(IQN.into()),
        ..Default::default()
    };
    let s = ethersan_initiator::connect(&server.addr, &opts)
        .await
        .expect("login");
    let sock2 = sock.clone();
    let o = tokio::task::spawn_blocking(move || {
        ctl_ok(
            &sock2,
            &["acl", "add", IQN, "iqn.2026-11.org.ethersan:other"],
        )
    })
    .await
    .unwrap();
    assert!(
        text(&o).contains(&format!("{CLIENT} from 127.0.0.1")),
        "the warning does not name the session that ends: {}",
        text(&o)
    );
    let gone = s.command(0, &[0; 6], bytes::Bytes::new(), 0).await;
    assert!(gone.is_err(), "the session still answers: {gone:?}");
}

fn check(config: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("check.toml");
    std::fs::write(&path, config).unwrap();
    let o = ethersan(&["serve", "--check", "--config", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    text(&o)
}

/// Issue 26 item 4: `serve --check` names the targets anyone on the
/// network may use, shows each target's access, and the packaged
/// configuration ships closed.
#[test]
fn serve_check_names_targets_open_to_the_network() {
    let target = format!("[[target]]\nname = \"{IQN}\"\nlun = [\"ram:4M\"]\n");
    let t = check(&format!("portals = [\"0.0.0.0:3260\"]\n{target}"));
    let warning = t
        .lines()
        .find(|l| l.contains("warning:"))
        .unwrap_or_else(|| panic!("no warning: {t}"));
    assert!(
        warning.contains(IQN) && warning.contains("0.0.0.0:3260"),
        "{t}"
    );
    assert!(t.contains("access: open"), "{t}");
    let t = check(&format!("portals = [\"127.0.0.1:3260\"]\n{target}"));
    assert!(!t.contains("warning"), "loopback only: {t}");
    let t = check(&format!(
        "portals = [\"0.0.0.0:3260\"]\n{target}allow = [\"{CLIENT}@10.0.0.0/8\"]\n"
    ));
    assert!(!t.contains("warning"), "{t}");
    assert!(
        t.contains(&format!("access: only initiator {CLIENT} from 10.0.0.0/8")),
        "{t}"
    );
    // Old lists together still mean name AND network, and say so.
    let t = check(&format!(
        "portals = [\"127.0.0.1:3260\"]\n{target}allow_initiators = [\"{CLIENT}\"]\nallow_networks = [\"10.0.0.0/8\"]\n"
    ));
    assert!(
        t.contains(&format!("access: only initiator {CLIENT} from 10.0.0.0/8")),
        "{t}"
    );
    assert!(
        t.contains(&format!("allow = [\"{CLIENT}@10.0.0.0/8\"]")),
        "no migration hint: {t}"
    );
    // The packaged configuration: good, and closed.
    let packaged = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/ethersan.toml"
    ))
    .unwrap();
    assert!(
        packaged.contains("0.0.0.0:3260"),
        "the packaged portal is for the network"
    );
    let t = check(&packaged);
    assert!(
        !t.contains("warning"),
        "the packaged configuration is open: {t}"
    );
    assert!(t.contains("access: only"), "{t}");
}

/// Issue 26 item 4: a server whose portal is on a real network (a veth
/// pair between namespaces) warns at start, once, naming the open
/// target, and a client on that network can indeed log in; a loopback
/// server does not warn.
#[test]
fn an_open_target_on_a_network_portal_is_warned_about_at_start() {
    let veth = common::netns::Veth::new("access", 1500);
    let portal = format!("{}:3260", common::netns::Veth::TARGET_IP);
    let server = veth.serve(&[
        "serve".into(),
        "--listen".into(),
        portal.clone(),
        "--target".into(),
        IQN.into(),
        "--lun".into(),
        "ram:4M".into(),
    ]);
    let o = veth.in_client(
        &["inquiry", &format!("iscsi://{portal}/{IQN}/0")],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    let log = server.log.lock().unwrap().clone();
    let warnings: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("WARN") && l.contains("no CHAP and no access rules"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log:#?}");
    assert!(
        warnings[0].contains(IQN) && warnings[0].contains(&portal),
        "{}",
        warnings[0]
    );
    drop(server);
    let mut local = Server::start_with("ram:4M", &[]);
    // Every line it logged, up to its exit.
    local.stop();
    let log = local.log.lock().unwrap().clone();
    assert!(
        !log.iter()
            .any(|l| l.contains("no CHAP and no access rules")),
        "a loopback server warned: {log:#?}"
    );
}
