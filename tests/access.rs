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
