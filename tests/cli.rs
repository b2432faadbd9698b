//! The `ethersan` command line: configuration errors, the client commands,
//! and identifiers that survive a restart.

mod common;

use std::process::Command;

use common::{ethersan, Server, IQN};

#[test]
fn bad_config_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "portals = [\"127.0.0.1:0\"]\n\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\n[[target.lun]]\nram = \"64M\"\nsise = 3\n").unwrap();
    let out = ethersan(&["serve", "--config", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:", path.display())), "{err}");
    assert!(
        err.contains(":5:") || err.contains(":7:"),
        "no line number: {err}"
    );

    let path2 = dir.path().join("badname.toml");
    std::fs::write(
        &path2,
        "portals = [\"127.0.0.1:0\"]\n[[target]]\nname = \"Target_One\"\nlun = [\"ram:1M\"]\n",
    )
    .unwrap();
    let out = ethersan(&["serve", "--config", path2.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("badname.toml:3:"), "{err}");

    let out = ethersan(&["serve", "--listen", "127.0.0.1:0", "--lun", "ram:64M,turbo"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown option"));
}

#[test]
fn client_commands_and_stable_identity() {
    let dir = tempfile::tempdir().unwrap();
    let lun = format!("{}:32M", dir.path().join("disk.img").display());
    let mut server = Server::start(&[&lun, "ram:4M,bs=4096"]);

    let out = ethersan(&["discover", "--json", &server.addr]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["name"], IQN);
    assert_eq!(v[0]["portals"][0], format!("{},1", server.addr));

    let url = format!("iscsi://{}/{}", server.addr, IQN);
    let out = ethersan(&["ls", "--json", &url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(v[0]["capacity_bytes"], 32 << 20);
    assert_eq!(v[1]["block_size"], 4096);

    let inquiry = |server: &Server| {
        let out = ethersan(&["inquiry", "--json", &server.url(0)]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v["serial"].clone(), v["designators"].clone())
    };
    let first = inquiry(&server);
    assert!(
        first
            .1
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d.as_str().unwrap().starts_with("naa: 6")),
        "{:?}",
        first.1
    );
    assert!(server.stop().is_some_and(|s| s.success()));
    let server = Server::start(&[&lun, "ram:4M,bs=4096"]);
    assert_eq!(
        inquiry(&server),
        first,
        "identifiers changed across a restart"
    );

    // A login refused: a target that does not exist.
    let out = ethersan(&[
        "inquiry",
        &format!("iscsi://{}/iqn.2026-11.org.ethersan:nope/0", server.addr),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("target not found"));
}

/// Growing a LUN's backing file and sending SIGHUP: the new capacity shows
/// and every session gets CAPACITY DATA HAS CHANGED.
#[test]
fn sighup_picks_up_a_grown_backing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grow.img");
    let server = Server::start(&[&format!("{}:16M", path.display())]);
    let url = server.url(0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let opts = ethersan_initiator::LoginOptions {
            target_name: Some(IQN.into()),
            ..Default::default()
        };
        let s = ethersan_initiator::connect(&server.addr, &opts)
            .await
            .unwrap();
        s.clear_unit_attention(0).await.unwrap();
        assert_eq!(s.read_capacity(0).await.unwrap(), (16 << 11, 512));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(48 << 20)
            .unwrap();
        let hup = Command::new("kill")
            .args(["-HUP", &server.child.id().to_string()])
            .status()
            .unwrap();
        assert!(hup.success());
        let mut seen = None;
        for _ in 0..50 {
            let r = s.command(0, &[0; 6], bytes::Bytes::new(), 0).await.unwrap();
            if r.status != 0 {
                seen = r.sense_key();
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(
            seen,
            Some((6, 0x2a, 0x09)),
            "no CAPACITY DATA HAS CHANGED unit attention"
        );
        assert_eq!(s.read_capacity(0).await.unwrap(), (48 << 11, 512));
    });
    let out = ethersan(&["inquiry", "--json", &url]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["capacity_bytes"], 48 << 20, "{v}");
}
