//! The management plane against a running `ethersan serve`: every
//! `ethersan ctl` operation applied live while a session is logged in
//! (which learns of each change through its unit attentions), the saved
//! configuration served again by a new server, SIGHUP, the TCP API's
//! bearer token, and the checked-in OpenAPI description.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use bytes::Bytes;
use ethersan_initiator::{connect, LoginOptions, Session};
use serde_json::Value;

const IQN: &str = "iqn.2026-11.org.ethersan:admin";
const ME: &str = "iqn.2026-11.org.ethersan:client";
const TUR: [u8; 6] = [0; 6];
const REPORT_LUNS: [u8; 12] = [0xa0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];

fn ctl(sock: &Path, args: &[&str]) -> Output {
    ctl_stdin(sock, args, "")
}

fn ctl_stdin(sock: &Path, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .arg("ctl")
        .arg("--socket")
        .arg(sock)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ethersan ctl");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("ethersan ctl")
}

fn ctl_ok(sock: &Path, args: &[&str]) -> String {
    common::ok_out(
        &ctl(sock, args),
        &format!("ethersan ctl {}", args.join(" ")),
    )
}

fn ctl_json(sock: &Path, args: &[&str]) -> Value {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let out = ctl_ok(sock, &a);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// The error line of a ctl command that must fail.
fn ctl_err(sock: &Path, args: &[&str]) -> String {
    let o = ctl(sock, args);
    assert!(
        !o.status.success(),
        "ethersan ctl {} should have failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn sense(s: &Session, lun: u64) -> Option<(u8, u8, u8)> {
    s.command(lun, &TUR, Bytes::new(), 0)
        .await
        .expect("TEST UNIT READY")
        .sense_key()
}

/// Commands until one answers without a unit attention; returns the
/// unit attentions seen (ASC, ASCQ).
async fn drain_attentions(s: &Session, lun: u64) -> Vec<(u8, u8)> {
    let mut seen = Vec::new();
    for _ in 0..8 {
        match sense(s, lun).await {
            Some((6, asc, ascq)) => seen.push((asc, ascq)),
            _ => return seen,
        }
    }
    panic!("unit attentions without end: {seen:?}");
}

async fn report_luns(s: &Session) -> Vec<u64> {
    let r = s
        .command(0, &REPORT_LUNS, Bytes::new(), 1024)
        .await
        .expect("REPORT LUNS");
    assert_eq!(r.status, 0, "REPORT LUNS failed: {:?}", r.sense_key());
    let d = &r.data;
    let n = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize / 8;
    (0..n)
        .map(|i| u64::from(u16::from_be_bytes([d[8 + 8 * i], d[9 + 8 * i]]) & 0x3fff))
        .collect()
}

fn login_opts(name: &str) -> LoginOptions {
    LoginOptions {
        initiator_name: name.into(),
        target_name: Some(IQN.into()),
        timeout: Some(Duration::from_secs(10)),
        ..LoginOptions::default()
    }
}

fn start(dir: &Path, config: &Path) -> (common::Server, std::path::PathBuf) {
    let sock = dir.join("api.sock");
    let srv = common::Server::start_args(&[
        "serve".into(),
        "--config".into(),
        common::path_str(config),
        "--api-socket".into(),
        common::path_str(&sock),
    ]);
    (srv, sock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ctl_operation_applies_live_while_a_session_is_logged_in() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ethersan.toml");
    std::fs::write(
        &config,
        format!(
            "portals = [\"127.0.0.1:0\"]\n[options]\nnop_interval_secs = 0\ndata_dir = \"{}\"\n[[target]]\nname = \"{IQN}\"\nlun = [\"ram:16M\"]\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let (srv, sock) = start(dir.path(), &config);
    let addr = srv.addr.clone();

    let s = connect(&addr, &login_opts(ME)).await.expect("login");
    drain_attentions(&s, 0).await;

    // target ls: the target, its LUN and our session.
    let t = ctl_json(&sock, &["target", "ls"]);
    assert_eq!(t[0]["name"], IQN, "{t}");
    assert_eq!(t[0]["sessions"], 1, "{t}");
    assert_eq!(t[0]["luns"][0]["size_bytes"], 16 << 20, "{t}");

    // session ls: who, from where, over what, negotiated what, counters.
    let _ = s.read_capacity(0).await.unwrap();
    let ss = ctl_json(&sock, &["session", "ls"]);
    let mine = ss
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["target"] == IQN)
        .unwrap_or_else(|| panic!("no session of {IQN}: {ss}"));
    assert_eq!(mine["initiator"], ME, "{mine}");
    assert_eq!(mine["transport"], "iscsi", "{mine}");
    assert!(
        mine["address"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{mine}"
    );
    assert!(mine["parameters"]["MaxBurstLength"].is_string(), "{mine}");
    assert!(mine["counters"]["others"].as_u64().unwrap() >= 2, "{mine}");

    // lun add: the session is told, REPORT LUNS lists it, I/O works.
    let img = dir.path().join("disk1.img");
    let added = ctl_json(
        &sock,
        &["lun", "add", IQN, &format!("{}:8M", img.display())],
    );
    assert_eq!(added["lun"], 1, "{added}");
    assert!(drain_attentions(&s, 0).await.contains(&(0x3f, 0x0e)));
    assert_eq!(report_luns(&s).await, vec![0, 1]);
    drain_attentions(&s, 1).await;
    assert_eq!(s.read_capacity(1).await.unwrap(), (8 << 20 >> 9, 512));
    // A chosen number, and one taken already.
    ctl_ok(&sock, &["lun", "add", IQN, "ram:4M", "--lun", "7"]);
    let e = ctl_err(&sock, &["lun", "add", IQN, "ram:4M", "--lun", "7"]);
    assert!(e.contains("has a LUN 7 already"), "{e}");
    drain_attentions(&s, 0).await;
    assert_eq!(report_luns(&s).await, vec![0, 1, 7]);

    // lun resize: CAPACITY DATA HAS CHANGED, then the new size.
    let r = ctl_json(&sock, &["lun", "resize", IQN, "1", "12M"]);
    assert_eq!(r["size_bytes"], 12 << 20, "{r}");
    assert!(
        drain_attentions(&s, 1).await.contains(&(0x2a, 0x09)),
        "no CAPACITY DATA HAS CHANGED"
    );
    assert_eq!(s.read_capacity(1).await.unwrap(), (12 << 20 >> 9, 512));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 12 << 20);
    // rescan: a file grown by hand is seen after `ctl rescan`.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    ctl_ok(&sock, &["rescan"]);
    assert!(
        drain_attentions(&s, 1).await.contains(&(0x2a, 0x09)),
        "no CAPACITY DATA HAS CHANGED after rescan"
    );
    assert_eq!(s.read_capacity(1).await.unwrap(), (16 << 20 >> 9, 512));

    // lun rm: refused while in use, done with --force.
    let e = ctl_err(&sock, &["lun", "rm", IQN, "7"]);
    assert!(e.contains("in use") && e.contains("--force"), "{e}");
    ctl_ok(&sock, &["lun", "rm", IQN, "7", "--force"]);
    drain_attentions(&s, 0).await;
    assert_eq!(report_luns(&s).await, vec![0, 1]);
    let e = ctl_err(&sock, &["lun", "rm", IQN, "9", "--force"]);
    assert!(e.contains("has no LUN 9"), "{e}");

    // acl: granting ourselves and another keeps our session; revoking
    // ourselves ends it and refuses our logins; granting back admits us.
    ctl_ok(&sock, &["acl", "add", IQN, ME]);
    ctl_ok(
        &sock,
        &["acl", "add", IQN, "iqn.2026-11.org.ethersan:other"],
    );
    ctl_ok(&sock, &["acl", "add", IQN, "10.0.0.0/8"]);
    let acl = ctl_json(&sock, &["acl", "ls", IQN]);
    assert_eq!(acl["rules"][2]["rule"], "10.0.0.0/8", "{acl}");
    assert_eq!(sense(&s, 0).await, None, "the session survives grants");
    let e = ctl_err(&sock, &["acl", "add", IQN, "not a name"]);
    assert!(
        e.contains("initiator name") && e.contains("NAME@ADDR/LEN"),
        "{e}"
    );
    ctl_ok(&sock, &["acl", "rm", IQN, ME]);
    let gone = s.command(0, &TUR, Bytes::new(), 0).await;
    assert!(gone.is_err(), "the revoked session still answers: {gone:?}");
    assert!(
        connect(&addr, &login_opts(ME)).await.is_err(),
        "a revoked initiator logged in"
    );
    ctl_ok(&sock, &["acl", "add", IQN, ME]);
    let s = connect(&addr, &login_opts(ME))
        .await
        .expect("login after the grant");
    drain_attentions(&s, 0).await;

    // chap: required for logins from now on (the running session goes
    // on), then cleared. The secret comes from stdin, never an argument.
    let o = ctl_stdin(&sock, &["chap", "set", IQN, "alice"], "alice-secret-123\n");
    common::ok_out(&o, "ctl chap set");
    assert!(
        connect(&addr, &login_opts(ME)).await.is_err(),
        "login without CHAP"
    );
    let mut with = login_opts(ME);
    with.chap = Some(ethersan_proto::chap::Credentials::new("alice", b"alice-secret-123").unwrap());
    with.isid = [0x80, 0, 0, 0, 0, 9];
    let s2 = connect(&addr, &with).await.expect("login with CHAP");
    assert_eq!(sense(&s, 0).await, None, "the old session goes on");
    let listed = ctl_json(&sock, &["target", "ls"]);
    assert_eq!(listed[0]["chap_user"], "alice");
    assert!(
        !listed.to_string().contains("alice-secret"),
        "a secret came back: {listed}"
    );
    s2.logout().await.unwrap();
    ctl_ok(&sock, &["chap", "clear", IQN]);
    let mut other = login_opts(ME);
    other.isid = [0x80, 0, 0, 0, 0, 10];
    connect(&addr, &other)
        .await
        .expect("login once CHAP is cleared")
        .logout()
        .await
        .unwrap();

    // target add/rm: a new target with a LUN is found by iscsi-ls; a
    // target in use is not removed without --force.
    let t2 = "iqn.2026-11.org.ethersan:admin2";
    ctl_ok(&sock, &["target", "add", t2, "--alias", "second"]);
    ctl_ok(&sock, &["lun", "add", t2, "ram:8M"]);
    let ls = common::must_run(
        "iscsi-ls",
        &["-s", &format!("iscsi://{addr}")],
        Duration::from_secs(20),
    );
    assert!(ls.contains(t2), "iscsi-ls does not list {t2}:\n{ls}");
    let e = ctl_err(&sock, &["target", "add", t2]);
    assert!(e.contains("exists already"), "{e}");
    let e = ctl_err(&sock, &["target", "rm", IQN]);
    assert!(e.contains("--force"), "{e}");

    // portal add/rm: a new portal listens at once (logins through it
    // work, SendTargets announces its advertised address), and removed it
    // refuses connections while the sessions elsewhere go on.
    let port = common::free_port();
    let new_portal = format!("127.0.0.1:{port}");
    ctl_ok(
        &sock,
        &[
            "portal",
            "add",
            &new_portal,
            "--advertise",
            "127.0.0.2:3999",
        ],
    );
    let portals = ctl_json(&sock, &["portal", "ls"]);
    assert!(
        portals
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["address"] == new_portal.as_str()
                && p["advertise"] == "127.0.0.2:3999"
                && p["reachable"] == serde_json::json!(["127.0.0.2:3999"])),
        "{portals}"
    );
    let mut via = login_opts(ME);
    via.isid = [0x80, 0, 0, 0, 0, 11];
    let s3 = connect(&new_portal, &via)
        .await
        .expect("login through the new portal");
    drain_attentions(&s3, 0).await;
    let found = ethersan_initiator::discover_with(&new_portal, &LoginOptions::default())
        .await
        .expect("SendTargets");
    assert!(
        format!("{found:?}").contains("127.0.0.2:3999"),
        "SendTargets does not announce the advertised address: {found:?}"
    );
    let e = ctl_err(&sock, &["portal", "add", &new_portal]);
    assert!(e.contains("already listening"), "{e}");
    ctl_ok(&sock, &["portal", "rm", &new_portal]);
    assert!(
        std::net::TcpStream::connect(&new_portal).is_err(),
        "a removed portal still accepts"
    );
    assert_eq!(sense(&s3, 0).await, None, "a session through it goes on");
    s3.logout().await.unwrap();
    let e = ctl_err(&sock, &["portal", "rm", &new_portal]);
    assert!(e.contains("no portal"), "{e}");
    let e = ctl_err(&sock, &["portal", "rm", &addr]);
    assert!(e.contains("last portal"), "{e}");

    // save: the running configuration, which a new server serves the same.
    let saved = dir.path().join("saved.toml");
    ctl_ok(&sock, &["save", &common::path_str(&saved)]);
    let text = std::fs::read_to_string(&saved).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&saved).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(
        text.contains(t2) && text.contains("allow = [") && text.contains("10.0.0.0/8"),
        "{text}"
    );

    // session logout: ended, and gone from the list.
    let id = ctl_json(&sock, &["session", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["target"] == IQN)
        .map(|x| x["id"].as_u64().unwrap())
        .expect("our session");
    ctl_ok(&sock, &["session", "logout", &id.to_string()]);
    assert!(s.command(0, &TUR, Bytes::new(), 0).await.is_err());
    let e = ctl_err(&sock, &["session", "logout", "999999"]);
    assert!(e.contains("no session 999999"), "{e}");
    ctl_ok(&sock, &["target", "rm", t2]);

    let before = shape(&ctl_json(&sock, &["target", "ls"]));
    drop(srv);

    // The saved file, served by a new server, gives the same targets.
    let dir2 = tempfile::tempdir().unwrap();
    let (_srv2, sock2) = start(dir2.path(), &saved);
    let mut after = shape(&ctl_json(&sock2, &["target", "ls"]));
    // t2 was removed after the save.
    after.retain(|t| t.0 != t2);
    assert_eq!(before, after);
}

/// Targets as (name, LUNs as (number, bytes), access rules, their meaning).
type Shape = Vec<(String, Vec<(u64, u64)>, Value, Value)>;

fn shape(v: &Value) -> Shape {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["luns"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| {
                        (
                            l["lun"].as_u64().unwrap(),
                            l["size_bytes"].as_u64().unwrap(),
                        )
                    })
                    .collect(),
                t["rules"].clone(),
                t["access"].clone(),
            )
        })
        .collect()
}

#[test]
fn sighup_applies_the_changed_file_and_ctl_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ethersan.toml");
    let base = format!(
        "portals = [\"127.0.0.1:0\"]\n[options]\ndata_dir = \"{}\"\n[[target]]\nname = \"{IQN}\"\n",
        dir.path().display()
    );
    std::fs::write(&config, format!("{base}lun = [\"ram:16M\"]\n")).unwrap();
    let (srv, sock) = start(dir.path(), &config);
    std::fs::write(
        &config,
        format!("{base}allow_initiators = [\"{ME}\"]\nlun = [\"ram:16M\", \"ram:8M\"]\n"),
    )
    .unwrap();
    let pid = srv.child.id().to_string();
    common::must_run("kill", &["-HUP", &pid], Duration::from_secs(5));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let t = ctl_json(&sock, &["target", "ls"]);
        if t[0]["luns"].as_array().unwrap().len() == 2 && t[0]["rules"][0] == ME {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not applied: {t}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_tcp_api_needs_the_token_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "0123456789abcdef-token\n").unwrap();
    let srv = common::Server::start_args(&[
        "serve".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--target".into(),
        IQN.into(),
        "--lun".into(),
        "ram:8M".into(),
        "--data-dir".into(),
        common::path_str(dir.path()),
        "--api".into(),
        "127.0.0.1:0".into(),
        "--api-token-file".into(),
        common::path_str(&token),
    ]);
    let api = srv
        .log
        .lock()
        .unwrap()
        .iter()
        .find_map(|l| {
            l.split("dashboard on http://")
                .nth(1)
                .map(|r| r.trim_end_matches('/').to_string())
        })
        .expect("the API address is printed");
    let get = |auth: Option<&str>| -> (u16, String) {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(&api).unwrap();
        let mut req =
            String::from("GET /api/v1/targets HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
        if let Some(a) = auth {
            req.push_str(&format!("Authorization: {a}\r\n"));
        }
        req.push_str("\r\n");
        c.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        let status = out[9..12].parse().unwrap();
        (status, out)
    };
    let (st, body) = get(Some("Bearer 0123456789abcdef-token"));
    assert_eq!(st, 200, "{body}");
    assert!(body.contains(IQN), "{body}");
    let (st, body) = get(None);
    assert_eq!(st, 401, "{body}");
    assert!(body.contains("Authorization: Bearer"), "{body}");
    let (st, _) = get(Some("Bearer 0123456789abcdef-wrong"));
    assert_eq!(st, 401);
    // ctl over TCP with the token file.
    let o = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(["ctl", "--api", &api, "--token-file"])
        .arg(&token)
        .args(["target", "ls"])
        .output()
        .unwrap();
    assert!(common::ok_out(&o, "ctl --api").contains(IQN));
    // A change over TCP is logged as made through the token, with the
    // client's address.
    let o = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(["ctl", "--api", &api, "--token-file"])
        .arg(&token)
        .args(["acl", "add", IQN, "10.0.0.0/8"])
        .output()
        .unwrap();
    common::ok_out(&o, "ctl --api acl add");
    let changed = srv.wait_log(
        "access rules changed: added 10.0.0.0/8",
        Duration::from_secs(10),
    );
    assert!(
        changed.contains("via=api-token") && changed.contains("peer=127.0.0.1:"),
        "{changed}"
    );
    // An address that keeps failing is slowed down.
    let mut last = 0;
    for _ in 0..12 {
        last = get(Some("Bearer nope-nope-nope-nope")).0;
    }
    assert_eq!(last, 429);
    let refused = srv
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("without a valid bearer token"))
        .count();
    assert!(refused >= 1, "refusals are logged");
    assert!(
        refused < 12,
        "refusals are rate-limited in the log ({refused})"
    );
}

#[test]
fn the_checked_in_openapi_description_matches_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(["ctl", "openapi"])
        .output()
        .unwrap();
    let now = common::ok_out(&o, "ctl openapi");
    let file = root.join("docs/openapi.json");
    let checked_in = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        now == checked_in,
        "docs/openapi.json is not what the code generates; run: cargo run --release -- ctl openapi > docs/openapi.json"
    );
    let v: Value = serde_json::from_str(&now).unwrap();
    for p in [
        "/api/v1/targets",
        "/api/v1/targets/{target}/luns",
        "/api/v1/sessions",
        "/api/v1/save",
    ] {
        assert!(v["paths"].get(p).is_some(), "{p} is not described");
    }
}

/// `ctl save` into the hand-written `--config` file: only what changed is
/// edited (comments, order and the `secret_file` reference kept, no
/// defaults, no `./`), the previous file is kept as FILE.bak, ctl says so,
/// and the next SIGHUP finds nothing to change and no `[options]` change.
#[test]
fn ctl_save_edits_the_hand_written_config_and_sighup_finds_no_change() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("chap.secret"), "a-secret-of-12+\n").unwrap();
    let config = dir.path().join("ethersan.toml");
    let original = format!(
        r#"# The lab's storage.
portals = ["127.0.0.1:0"]  # loopback only

[options]
nop_interval_secs = 0   # the old initiator cannot take NOPs

# CHAP for every target; the secret stays out of this file.
[chap]
user = "lab"
secret_file = "chap.secret"
discovery = false

[[target]]
name = "{IQN}"
# Who may log in.
allow_initiators = ["{ME}"]

# The system disk.
[[target.lun]]
path = "disk0.img"
size = "8M"

# Scratch space, gone soon.
[[target.lun]]
ram = "4M"
"#
    );
    std::fs::write(&config, &original).unwrap();
    let (srv, sock) = start(dir.path(), &config);

    let disk2 = dir.path().join("disk2.img");
    ctl_ok(
        &sock,
        &["lun", "add", IQN, &format!("{}:1M", disk2.display())],
    );
    ctl_ok(&sock, &["lun", "rm", IQN, "1"]);
    ctl_ok(&sock, &["acl", "add", IQN, "127.0.0.0/8"]);
    let said = ctl_ok(&sock, &["save"]);
    let backup = dir.path().join("ethersan.toml.bak");
    assert!(
        said.contains(&format!("to {}", config.display()))
            && said.contains(&format!("previous version kept in {}", backup.display()))
            && said.contains("edited in place")
            && said.contains("LUN 1 removed")
            && said.contains("LUN 2 added"),
        "ctl save does not say what it wrote where: {said}"
    );
    let expected = original
        .replace(
            &format!("allow_initiators = [\"{ME}\"]\n"),
            &format!("allow = [\"{ME}\", \"127.0.0.0/8\"]\n"),
        )
        .replace(
            "# Scratch space, gone soon.\n[[target.lun]]\nram = \"4M\"\n",
            "[[target.lun]]\nnumber = 2\npath = \"disk2.img\"\nsize = 1048576\n",
        );
    let saved = std::fs::read_to_string(&config).unwrap();
    assert_eq!(
        saved, expected,
        "the saved file differs from the expected edit"
    );
    assert_eq!(std::fs::read_to_string(&backup).unwrap(), original);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&config).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // SIGHUP: the saved file is what runs; no `[options]` warning.
    let pid = srv.child.id().to_string();
    common::must_run("kill", &["-HUP", &pid], Duration::from_secs(5));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let reload: Vec<String> = loop {
        let lines: Vec<String> = srv
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("reload"))
            .cloned()
            .collect();
        if !lines.is_empty() {
            break lines;
        }
        assert!(std::time::Instant::now() < deadline, "no reload logged");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        reload.iter().any(|l| l.contains("has no changes to apply"))
            && !reload
                .iter()
                .any(|l| l.contains("[options]") || l.contains("WARN")),
        "the reload of the saved file changed something: {reload:?}"
    );
    // A second save has nothing to write.
    let again = ctl_ok(&sock, &["save"]);
    assert!(again.contains("nothing written"), "{again}");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), expected);
}
