//! Disk identity over the wire: every LUN's WWN (VPD 0x83 NAA designator)
//! and serial (VPD 0x80) are unique between servers, survive a restart and
//! follow their backing file when the LUNs are reordered; configured values
//! win, and a corrupt identity file stops the server with a message naming
//! it.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ethersan, require_tool, run, Server, IQN};

/// The default target's name (`Config::embedded_default`).
const DEFAULT_IQN: &str = "iqn.2026-11.org.ethersan:default";

/// `ethersan serve ARGS` run in `cwd` (so the default data directory,
/// `./ethersan-data`, is there), listening on a free loopback port.
fn start_in(cwd: &Path, args: &[&str]) -> Server {
    let mut all: Vec<String> = vec!["serve".into(), "--listen".into(), "127.0.0.1:0".into()];
    all.extend(args.iter().map(|a| a.to_string()));
    Server::start_args_in(&all, Some(cwd))
}

/// (serial, NAA designator) of a LUN, as `ethersan inquiry --json` shows them.
fn identity(url: &str) -> (String, String) {
    let out = ethersan(&["inquiry", "--json", url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let naa: Vec<String> = v["designators"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d.as_str().unwrap().strip_prefix("naa: "))
        .map(str::to_string)
        .collect();
    assert_eq!(naa.len(), 1, "one NAA designator: {v}");
    (v["serial"].as_str().unwrap().to_string(), naa[0].clone())
}

fn default_url(server: &Server) -> String {
    format!("iscsi://{}/{DEFAULT_IQN}/0", server.addr)
}

#[test]
fn default_servers_in_two_directories_differ_and_each_keeps_its_own() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let mut sa = start_in(a.path(), &[]);
    let sb = start_in(b.path(), &[]);
    let ida = identity(&default_url(&sa));
    let idb = identity(&default_url(&sb));
    assert!(
        ida.1.starts_with('6') && ida.1.len() == 32,
        "an NAA-6 designator: {ida:?}"
    );
    assert_ne!(ida.1, idb.1, "two default servers export the same WWN");
    assert_ne!(ida.0, idb.0, "two default servers export the same serial");
    // The identity is the one kept beside the default backing file.
    let side = a.path().join("ethersan-data/default-lun0.img.id");
    let text = std::fs::read_to_string(&side).unwrap();
    assert!(
        text.contains(&format!("naa = \"{}\"", ida.1))
            && text.contains(&format!("serial = \"{}\"", ida.0)),
        "{text}"
    );
    // libiscsi reads the same serial.
    require_tool("iscsi-inq");
    let o = run(
        "iscsi-inq",
        &["-e", "1", "-c", "128", &default_url(&sb)],
        Duration::from_secs(20),
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("Unit Serial Number:[{}]", idb.0)),
        "{text}"
    );
    assert!(sa.stop().is_some_and(|s| s.success()));
    let sa = start_in(a.path(), &[]);
    assert_eq!(
        identity(&default_url(&sa)),
        ida,
        "the identity changed across a restart"
    );
    drop(sb);
}

#[test]
fn reordered_luns_keep_their_files_identities() {
    let dir = tempfile::tempdir().unwrap();
    let one = format!("{}:8M", dir.path().join("one.img").display());
    let two = format!("{}:8M", dir.path().join("two.img").display());
    let mut s = Server::start(&[&one, &two]);
    let (id1, id2) = (identity(&s.url(0)), identity(&s.url(1)));
    assert_ne!(id1, id2);
    assert_ne!(id1.1, id2.1);
    assert!(s.stop().is_some_and(|s| s.success()));
    let s = Server::start(&[&two, &one]);
    assert_eq!(identity(&s.url(0)), id2, "two.img lost its identity");
    assert_eq!(identity(&s.url(1)), id1, "one.img lost its identity");
}

#[test]
fn configured_naa_and_serial_win() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pinned.img");
    let six = "6001405f0a0b0c0d0e0f101112131415";
    let mut s = Server::start(&[&format!("{}:8M,naa={six},serial=PINNED-1", path.display())]);
    assert_eq!(identity(&s.url(0)), ("PINNED-1".into(), six.into()));
    assert!(s.stop().is_some_and(|s| s.success()));
    // NAA-5 (8 bytes), with the serial from the identity file.
    let s = Server::start(&[
        &format!("{}:8M,naa=5001405f0a0b0c0d", path.display()),
        "ram:4M",
    ]);
    let id = identity(&s.url(0));
    assert_eq!(id.1, "5001405f0a0b0c0d");
    assert!(id.0.len() == 16 && id.0 != "PINNED-1", "{id:?}");
    // A RAM LUN gets an identity of its own.
    let ram = identity(&s.url(1));
    assert!(ram.1.starts_with('6') && ram.1 != id.1 && ram.0 != id.0);
}

#[test]
fn corrupt_identity_file_stops_the_server_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
    let side = dir.path().join("disk.img.id");
    std::fs::write(&side, "naa = \"not hex\"\nserial = \"x\"\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args(["serve", "--target", IQN, "--listen", "127.0.0.1:0", "--lun"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server started despite a corrupt identity file");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(
        err.contains(&side.display().to_string()) && err.contains("not a valid LUN identity"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&side).unwrap(),
        "naa = \"not hex\"\nserial = \"x\"\n",
        "the corrupt file was replaced"
    );
}
