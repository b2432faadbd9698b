use super::*;
use ethersan_backend::file::IoEngine;

#[test]
fn access_rules_from_the_file_old_lists_keep_their_meaning() {
    let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
    let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\nlun = [\"ram:1M\"]\n";
    let c = Config::from_toml_str(
        &format!("{base}allow = [\"iqn.2026-11.x:a\", \"10.0.0.0/8\", \"iqn.2026-11.x:b@192.0.2.0/24\"]\n"),
        "t",
    )
    .unwrap();
    let a = &c.targets[0].access;
    assert_eq!(a.rules.len(), 3);
    assert!(a.allows("iqn.2026-11.x:a", ip("198.51.100.1")));
    assert!(a.allows("iqn.2026-11.x:z", ip("10.9.9.9")));
    assert!(a.allows("iqn.2026-11.x:b", ip("192.0.2.9")));
    assert!(!a.allows("iqn.2026-11.x:b", ip("198.51.100.1")));
    // allow_initiators with allow_networks meant name AND network: still so.
    let c = Config::from_toml_str(
        &format!(
            "{base}allow_initiators = [\"iqn.2026-11.x:a\"]\nallow_networks = [\"10.0.0.0/8\"]\n"
        ),
        "t",
    )
    .unwrap();
    let a = &c.targets[0].access;
    assert_eq!(a.rules[0].to_string(), "iqn.2026-11.x:a@10.0.0.0/8");
    assert!(!a.allows("iqn.2026-11.x:a", ip("192.0.2.1")));
    let e = Config::from_toml_str(&format!("{base}allow = [\"10.0.0.0/33\"]\n"), "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("t:5:") && e.contains("allow"), "{e}");
}

#[test]
fn chap_section_secrets_from_inline_file_or_env() {
    let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\nlun = [\"ram:1M\"]\n";
    let c = Config::from_toml_str(
        &format!("{base}[chap]\nuser = \"alice\"\nsecret = \"alice-secret-123\"\n"),
        "t",
    )
    .unwrap();
    let chap = c.chap.unwrap();
    assert_eq!(chap.initiator.user, "alice");
    assert!(chap.discovery && chap.target.is_none());
    std::env::set_var("ETHERSAN_TEST_CHAP_SECRET", "from-the-environment");
    let dir = std::env::temp_dir().join(format!("ethersan-chap-{}", std::process::id()));
    std::fs::write(&dir, "from-a-file-secret\n").unwrap();
    let text = format!(
        "{base}[chap]\nuser = \"alice\"\nsecret_env = \"ETHERSAN_TEST_CHAP_SECRET\"\nmutual_user = \"tgt\"\nmutual_secret_file = {:?}\ndiscovery = false\n",
        dir.display().to_string()
    );
    let chap = Config::from_toml_str(&text, "t").unwrap().chap.unwrap();
    assert_eq!(chap.initiator.secret, b"from-the-environment");
    assert_eq!(chap.target.unwrap().secret, b"from-a-file-secret");
    assert!(!chap.discovery);
    let _ = std::fs::remove_file(&dir);
    for bad in [
        "[chap]\nuser = \"alice\"\nsecret = \"short\"\n",
        "[chap]\nuser = \"alice\"\n",
        "[chap]\nuser = \"alice\"\nsecret = \"alice-secret-123\"\nsecret_env = \"X\"\n",
        "[chap]\nuser = \"alice\"\nsecret_env = \"ETHERSAN_TEST_UNSET_VARIABLE\"\n",
        "[chap]\nuser = \"alice\"\nsecret = \"alice-secret-123\"\nmutual_user = \"t\"\n",
    ] {
        let e = Config::from_toml_str(&format!("{base}{bad}"), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("t:5:") && e.contains("[chap]"), "{bad}: {e}");
        assert!(!e.contains("alice-secret-123"), "a secret in an error: {e}");
    }
}

#[test]
fn placement_option() {
    let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\nlun = [\"ram:1M\"]\n";
    let c = Config::from_toml_str(base, "t").unwrap();
    assert_eq!(c.options.placement, Placement::Pinned);
    assert!(c.options.worker_rings);
    let c = Config::from_toml_str(
        &format!("{base}[options]\nplacement = \"shared\"\nworker_rings = false\n"),
        "t",
    )
    .unwrap();
    assert_eq!(c.options.placement, Placement::Shared);
    assert!(!c.options.worker_rings);
    let e = Config::from_toml_str(
        &format!("{base}[options]\nplacement = \"everywhere\"\n"),
        "t",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("everywhere") && e.contains("pinned"), "{e}");
    assert_eq!("pinned".parse::<Placement>(), Ok(Placement::Pinned));
    assert!("x".parse::<Placement>().is_err());
}

#[test]
fn per_target_and_discovery_chap() {
    let targets = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:a\"\nlun = [\"ram:1M\"]\n[target.chap]\nuser = \"ua\"\nsecret = \"secret-of-a-123\"\nmutual_user = \"ta\"\nmutual_secret = \"target-a-secret\"\n[[target]]\nname = \"iqn.2026-11.org.x:b\"\nlun = [\"ram:1M\"]\n[[target]]\nname = \"iqn.2026-11.org.x:c\"\nlun = [\"ram:1M\"]\n[target.chap]\nuser = \"uc\"\nsecret = \"secret-of-c-123\"\n";
    let c = Config::from_toml_str(
        &format!("{targets}[chap]\nuser = \"g\"\nsecret = \"global-secret-1\"\n[discovery.chap]\nuser = \"d\"\nsecret = \"discovery-secret\"\n"),
        "t",
    )
    .unwrap();
    let TargetChap::Chap(a) = &c.targets[0].chap else {
        panic!("a has its own [target.chap]: {:?}", c.targets[0].chap);
    };
    assert_eq!(a.initiator.user, "ua");
    assert_eq!(a.target.as_ref().unwrap().user, "ta");
    assert_eq!(
        c.targets[1].chap,
        TargetChap::Inherit,
        "b uses the global [chap]"
    );
    assert_eq!(
        c.targets[2]
            .chap
            .effective(c.chap.as_ref())
            .unwrap()
            .initiator
            .user,
        "uc"
    );
    assert_eq!(c.chap.as_ref().unwrap().initiator.user, "g");
    assert_eq!(
        c.discovery_chap.as_ref().unwrap().initiator.secret,
        b"discovery-secret"
    );
    // Neither global nor discovery CHAP: only the targets that ask.
    let c = Config::from_toml_str(targets, "t").unwrap();
    assert!(c.chap.is_none() && c.discovery_chap.is_none());
    // Mistakes name the table and the line, never the secret.
    for (bad, line, what) in [
        ("[discovery.chap]\nuser = \"d\"\n", 19, "[discovery.chap]"),
        ("[discovery.chap]\nuser = \"d\"\nsecret = \"discovery-secret\"\ndiscovery = true\n", 19, "[discovery.chap]"),
        ("[chap]\nuser = \"g\"\nsecret = \"global-secret-1\"\ndiscovery = false\n[discovery.chap]\nuser = \"d\"\nsecret = \"discovery-secret\"\n", 23, "contradicts"),
        ("[discovery]\nchap_user = \"x\"\n", 20, "unknown field"),
    ] {
        let e = Config::from_toml_str(&format!("{targets}{bad}"), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("t:{line}:")) && e.contains(what), "{bad}: {e}");
        assert!(!e.contains("discovery-secret") && !e.contains("global-secret-1"), "{e}");
    }
    for (bad, what) in [
        ("user = \"x\"\nsecret = \"short\"\n", "at least 12"),
        ("user = \"x\"\n", "needs secret"),
        ("user = \"x\"\nsecret = \"secret-of-x-123\"\ndiscovery = false\n", "belongs in the global"),
        ("user = \"x\"\nsecret = \"secret-of-x-123\"\nmutual_user = \"t\"\nmutual_secret = \"secret-of-x-123\"\n", "must differ"),
    ] {
        let text = format!("portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:a\"\nlun = [\"ram:1M\"]\n[target.chap]\n{bad}");
        let e = Config::from_toml_str(&text, "t").unwrap_err().to_string();
        assert!(
            e.starts_with("t:5:") && e.contains("[target.chap] of \"iqn.2026-11.org.x:a\"") && e.contains(what),
            "{bad}: {e}"
        );
        assert!(!e.contains("secret-of-x-123"), "{e}");
    }
}

#[test]
fn connection_and_key_text_limits() {
    let o = Options::default();
    assert_eq!(o.max_connections_per_address, 128);
    assert_eq!(o.max_key_text_bytes, 65536);
    let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\nlun = [\"ram:1M\"]\n";
    let c = Config::from_toml_str(
        &format!("{base}[options]\nmax_connections_per_address = 0\nmax_key_text_bytes = 8192\n"),
        "t",
    )
    .unwrap();
    assert_eq!(c.options.max_connections_per_address, 0);
    assert_eq!(c.options.max_key_text_bytes, 8192);
    for bad in [
        "max_key_text_bytes = 8191",
        "max_key_text_bytes = 16777217",
        "max_connections_per_address = -1",
    ] {
        let e = Config::from_toml_str(&format!("{base}[options]\n{bad}\n"), "t")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t:"), "{bad}: {e}");
    }
}

#[test]
fn sizes() {
    assert_eq!(parse_size("64M").unwrap(), 64 << 20);
    assert_eq!(parse_size("1G").unwrap(), 1 << 30);
    assert_eq!(parse_size("512K").unwrap(), 512 << 10);
    assert_eq!(parse_size("2TiB").unwrap(), 2 << 40);
    assert_eq!(parse_size("4096").unwrap(), 4096);
    assert!(parse_size("12Q").is_err());
    assert!(parse_size("0").is_err());
    assert!(parse_size("").is_err());
}

#[test]
fn names() {
    assert!(validate_name("iqn.2026-11.org.ethersan:default").is_ok());
    assert!(validate_name("eui.0123456789abcdef").is_ok());
    assert!(validate_name("naa.0123456789abcdef").is_ok());
    assert!(validate_name("iqn.2026-11.Org.x").is_err());
    assert!(validate_name("iqn.26-11.org.x").is_err());
    assert!(validate_name("target0").is_err());
    // NVMe host NQNs: initiator names of access rules, not target names.
    assert!(validate_initiator_name("nqn.2014-08.org.nvmexpress:uuid:1B4E28BA-2FA1").is_ok());
    assert!(validate_initiator_name("iqn.2026-11.org.ethersan:default").is_ok());
    assert!(validate_initiator_name("nqn.x").is_err());
    assert!(validate_initiator_name("nqn.2014-08.org.x:a b").is_err());
    assert!(validate_initiator_name("nqn.2014-08.org.x:a@b").is_err());
    assert!(validate_name("nqn.2014-08.org.x:a").is_err());
    assert!(AclRule::parse("nqn.2014-08.org.x:host@127.0.0.0/8").is_ok());
}

#[test]
fn lun_specs() {
    let l = LunConfig::from_spec("ram:64M").unwrap();
    assert_eq!(l.backing, Backing::Ram { size: 64 << 20 });
    let l = LunConfig::from_spec("/tmp/a:b/disk.img:1G,ro,removable,bs=4096").unwrap();
    assert_eq!(
        l.backing,
        Backing::File {
            path: "/tmp/a:b/disk.img".into(),
            size: Some(1 << 30)
        }
    );
    assert!(l.read_only && l.removable && l.block_size == 4096);
    let l = LunConfig::from_spec("/dev/sdb").unwrap();
    assert_eq!(
        l.backing,
        Backing::File {
            path: "/dev/sdb".into(),
            size: None
        }
    );
    assert!(LunConfig::from_spec("ram:64M,fast")
        .unwrap_err()
        .to_string()
        .contains("unknown option"));
    assert!(LunConfig::from_spec("ram:1000,bs=4096").is_err());
    assert!(LunConfig::from_spec("x:1G,bs=1024").is_err());
    assert!(LunConfig::from_spec("").is_err());
}

#[test]
fn engine_and_direct_keys() {
    let l = LunConfig::from_spec("/tmp/x.img:1G").unwrap();
    assert_eq!((l.engine, l.direct), (DEFAULT_ENGINE, false));
    let l = LunConfig::from_spec("/tmp/x.img:1G,engine=uring,direct").unwrap();
    assert_eq!((l.engine, l.direct), (IoEngine::Uring, true));
    let l = LunConfig::from_spec("/dev/sdb,engine=sync").unwrap();
    assert_eq!(l.engine, IoEngine::Sync);
    let e = LunConfig::from_spec("/tmp/x.img:1G,engine=aio")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("engine") && e.contains("\"aio\"") && e.contains("\"uring\""),
        "{e}"
    );
    let e = LunConfig::from_spec("ram:64M,direct")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not RAM"), "{e}");

    let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\n[[target.lun]]\n";
    let c = Config::from_toml_str(
        &format!("{base}path = \"/tmp/x.img\"\nengine = \"uring\"\ndirect = true\n"),
        "t",
    )
    .unwrap();
    let l = &c.targets[0].luns[0];
    assert_eq!((l.engine, l.direct), (IoEngine::Uring, true));
    let c = Config::from_toml_str(&format!("{base}path = \"/tmp/x.img\"\n"), "t").unwrap();
    let l = &c.targets[0].luns[0];
    assert_eq!((l.engine, l.direct), (DEFAULT_ENGINE, false));
    for (bad, says) in [
        (
            "path = \"/x\"\nengine = \"fast\"\n",
            "engine = unknown I/O engine \"fast\"",
        ),
        ("path = \"/x\"\ndirect = \"yes\"\n", ""),
        ("ram = \"1M\"\ndirect = true\n", "not RAM"),
    ] {
        let e = Config::from_toml_str(&format!("{base}{bad}"), "t")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t:"), "{bad}: {e}");
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn toml_errors_name_the_line() {
    let text = "portals = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\n[[target.lun]]\nram = \"64M\"\nsise = 3\n";
    let e = Config::from_toml_str(text, "bad.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("bad.toml:7:"), "{e}");
    assert!(e.contains("unknown field `sise`"), "{e}");
    assert!(e.contains("expected one of `path`, `ram`, `size`"), "{e}");
    let text = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"Target\"\nluns = []\n";
    let e = Config::from_toml_str(text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("t.toml:"), "{e}");
    let text = "portals = [\"127.0.0.1\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\n[[target.lun]]\nram = \"64M\"\n";
    let e = Config::from_toml_str(text, "p.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("p.toml:1:"), "{e}");
    let text = "portals = [\"127.0.0.1:3260\"]\n[options]\nqueue_depth = 0\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\nlun = [\"ram:1M\"]\n";
    let e = Config::from_toml_str(text, "o.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("queue_depth"), "{e}");
}

#[test]
fn good_toml() {
    let text = r#"
portals = ["127.0.0.1:3260", "[::1]:3260"]
[options]
queue_depth = 64
[[target]]
name = "iqn.2026-11.org.ethersan:a"
alias = "first"
lun = ["ram:64M", "/tmp/x.img:1G,ro"]
[[target]]
name = "iqn.2026-11.org.ethersan:b"
[[target.lun]]
path = "/tmp/y.img"
size = "256M"
block_size = 4096
removable = true
[[target.lun]]
ram = 1048576
"#;
    let c = Config::from_toml_str(text, "x.toml").unwrap();
    assert_eq!(c.portals.len(), 2);
    assert_eq!(c.options.queue_depth, 64);
    assert_eq!(c.targets[0].luns.len(), 2);
    assert!(c.targets[0].luns[1].read_only);
    assert_eq!(c.targets[1].luns[0].block_size, 4096);
    assert_eq!(c.targets[1].luns[1].backing, Backing::Ram { size: 1 << 20 });
}

#[test]
fn example_config_parses() {
    let text = include_str!("../../../../examples/ethersan.toml");
    Config::from_toml_str(text, "examples/ethersan.toml").unwrap();
}

#[test]
fn naa_key_and_spec_option() {
    let l = LunConfig::from_spec("/tmp/x.img:1G,naa=6001405f0102030405060708090a0b0c,serial=S1")
        .unwrap();
    assert_eq!(
        l.naa.map(|n| format_naa(&n)).as_deref(),
        Some("6001405f0102030405060708090a0b0c")
    );
    assert_eq!(l.serial.as_deref(), Some("S1"));
    let l = LunConfig::from_spec("/tmp/x.img:1G,naa=5001405f01020304").unwrap();
    assert_eq!(l.naa.unwrap()[..8], [0x50, 0x01, 0x40, 0x5f, 1, 2, 3, 4]);
    assert_eq!(LunConfig::from_spec("ram:1M").unwrap().naa, None);
    for bad in [
        "naa=7001405f01020304",
        "naa=6001405f01020304",
        "naa=",
        "naa=5zz1405f01020304",
    ] {
        let e = LunConfig::from_spec(&format!("/tmp/x.img:1G,{bad}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("naa") && e.contains("/tmp/x.img"), "{bad}: {e}");
    }
    let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\n[[target.lun]]\npath = \"/tmp/x.img\"\n";
    let c = Config::from_toml_str(
        &format!("{base}naa = \"6001405F0102030405060708090A0B0C\"\n"),
        "t",
    )
    .unwrap();
    assert_eq!(
        format_naa(&c.targets[0].luns[0].naa.unwrap()),
        "6001405f0102030405060708090a0b0c"
    );
    let e = Config::from_toml_str(&format!("{base}naa = \"6001\"\n"), "t")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("t:6:1: naa") && e.contains("NAA-6 needs 32 hex digits"),
        "{e}"
    );
}

#[test]
fn sanitize_rate_key_and_spec_option() {
    assert_eq!(LunConfig::from_spec("ram:1M").unwrap().sanitize_rate, None);
    let l = LunConfig::from_spec("/tmp/x.img:1G,sanitize_rate=16M").unwrap();
    assert_eq!(l.sanitize_rate, Some(16 << 20));
    let e = LunConfig::from_spec("/tmp/x.img:1G,sanitize_rate=fast")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sanitize_rate") && e.contains("/tmp/x.img"),
        "{e}"
    );
    let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\n[[target.lun]]\npath = \"/tmp/x.img\"\n";
    let c = Config::from_toml_str(&format!("{base}sanitize_rate = \"64M\"\n"), "t").unwrap();
    assert_eq!(c.targets[0].luns[0].sanitize_rate, Some(64 << 20));
}

#[test]
fn a_saved_configuration_reads_back_the_same() {
    let text = r#"
portals = ["127.0.0.1:3260", "[::1]:3261"]
[options]
queue_depth = 64
[chap]
user = "alice"
secret = "a-secret-of-12+"
mutual_user = "target"
mutual_secret = "another-secret!"
[nvme]
portals = ["127.0.0.1", "[::1]:4421"]
[[target]]
name = "iqn.2026-11.org.ethersan:a"
alias = "first"
allow_initiators = ["iqn.2026-11.org.ethersan:i"]
allow_networks = ["127.0.0.0/8"]
lun = ["ram:1M", "/tmp/ethersan-save-test.img:1M,ro,bs=4096"]
[[target]]
name = "iqn.2026-11.org.ethersan:b"
lun = []
[[target]]
name = "iqn.2026-11.org.ethersan:c"
[target.chap]
user = "bob"
secret = "bobs-secret-123"
[[target.lun]]
number = 5
ram = "2M"
initiators = ["iqn.2026-11.org.ethersan:i"]
[[target.lun]]
ram = "3M"
security = "none"
aoe = "off"
"#;
    let a = Config::from_toml_str(text, "/etc/ethersan.toml").expect("parses");
    assert_eq!(
        a.nvme.portals,
        vec![
            "127.0.0.1:4420".parse().unwrap(),
            "[::1]:4421".parse().unwrap()
        ]
    );
    let saved = a.to_toml();
    let b = Config::from_toml_str(&saved, "/elsewhere/ethersan.toml")
        .unwrap_or_else(|e| panic!("the saved file does not parse: {e}\n{saved}"));
    assert_eq!(format!("{a:?}"), format!("{b:?}"), "{saved}");
    // Debug hides secrets: compare them too.
    let secrets =
        |c: &Config| {
            let mut v = Vec::new();
            for ch in [&c.chap, &c.discovery_chap].into_iter().flatten().chain(
                c.targets.iter().filter_map(|t| match &t.chap {
                    TargetChap::Chap(c) => Some(c),
                    _ => None,
                }),
            ) {
                v.push(ch.initiator.secret.clone());
                v.extend(ch.target.as_ref().map(|t| t.secret.clone()));
            }
            v
        };
    assert_eq!(secrets(&a), secrets(&b));
    assert_eq!(b.targets[2].numbered(), vec![(5, 0), (6, 1)]);
    assert!(b.targets[1].luns.is_empty());
}

#[test]
fn two_luns_with_one_number_are_refused() {
    let text = r#"
portals = ["127.0.0.1:3260"]
[[target]]
name = "iqn.2026-11.org.ethersan:a"
[[target.lun]]
number = 1
ram = "1M"
[[target.lun]]
number = 1
ram = "1M"
"#;
    let e = Config::from_toml_str(text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("two LUNs are numbered 1"), "{e}");
}

#[test]
fn a_target_opts_out_of_chap() {
    let text = "portals = [\"127.0.0.1:3260\"]\n[chap]\nuser = \"g\"\nsecret = \"global-secret-1\"\n[[target]]\nname = \"iqn.2026-11.org.x:open\"\nchap = \"none\"\nlun = [\"ram:1M\"]\n[[target]]\nname = \"iqn.2026-11.org.x:shut\"\nlun = [\"ram:1M\"]\n";
    let c = Config::from_toml_str(text, "t").unwrap();
    assert_eq!(c.targets[0].chap, TargetChap::None);
    assert_eq!(c.targets[0].chap.effective(c.chap.as_ref()), None);
    assert_eq!(c.targets[1].chap, TargetChap::Inherit);
    assert_eq!(
        c.targets[1]
            .chap
            .effective(c.chap.as_ref())
            .map(|c| c.initiator.user.as_str()),
        Some("g")
    );
    // Any other word is a mistake, reported at its line.
    let bad = text.replace("chap = \"none\"", "chap = \"off\"");
    let e = Config::from_toml_str(&bad, "t").unwrap_err().to_string();
    assert!(
        e.starts_with("t:7:") && e.contains("chap = \"none\""),
        "{e}"
    );
    let bad = text.replace("chap = \"none\"", "chap = 3");
    let e = Config::from_toml_str(&bad, "t").unwrap_err().to_string();
    assert!(e.starts_with("t:7:") && e.contains("\"none\""), "{e}");
}

#[test]
fn portals_with_advertised_addresses() {
    let text = "portals = [\"127.0.0.1:3260\", { listen = \"0.0.0.0:3261\", advertise = \"10.0.0.5:3260\" }, { listen = \"[::1]:3262\" }]\n[[target]]\nname = \"iqn.2026-11.org.x:a\"\nlun = [\"ram:1M\"]\n";
    let c = Config::from_toml_str(text, "t").unwrap();
    let a = |s: &str| s.parse::<SocketAddr>().unwrap();
    assert_eq!(
        c.portals,
        [a("127.0.0.1:3260"), a("0.0.0.0:3261"), a("[::1]:3262")]
    );
    assert_eq!(c.advertise.len(), 1);
    assert_eq!(c.advertise[&a("0.0.0.0:3261")], a("10.0.0.5:3260"));
    for (bad, what) in [
        ("\"127.0.0.1\"", "portal \"127.0.0.1\" is not ADDR:PORT"),
        ("{ listen = \"x:1\" }", "portal \"x:1\" is not ADDR:PORT"),
        (
            "{ listen = \"127.0.0.1:1\", advertise = \"10.0.0.5\" }",
            "advertise \"10.0.0.5\" is not ADDR:PORT",
        ),
        (
            "{ listen = \"127.0.0.1:1\", advertise = \"0.0.0.0:3260\" }",
            "cannot be reached",
        ),
        (
            "{ listen = \"127.0.0.1:1\", advert = \"10.0.0.5:1\" }",
            "advert",
        ),
        ("{ advertise = \"10.0.0.5:1\" }", "listen"),
        ("\"127.0.0.1:5\", \"127.0.0.1:5\"", "listed twice"),
        ("3260", "a portal"),
    ] {
        let text = format!(
            "portals = [{bad}]\n[[target]]\nname = \"iqn.2026-11.org.x:a\"\nlun = [\"ram:1M\"]\n"
        );
        let e = Config::from_toml_str(&text, "t").unwrap_err().to_string();
        assert!(e.starts_with("t:1:") && e.contains(what), "{bad}: {e}");
    }
}

#[test]
fn isns_server_addresses() {
    let c = IsnsConfig::parse_server("isns.example.net").unwrap();
    assert_eq!((c.host.as_str(), c.port), ("isns.example.net", 3205));
    assert_eq!(c.server(), "isns.example.net:3205");
    let c = IsnsConfig::parse_server("127.0.0.1:43205").unwrap();
    assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 43205));
    let c = IsnsConfig::parse_server("[::1]:3206").unwrap();
    assert_eq!(
        (c.host.as_str(), c.port, c.server()),
        ("::1", 3206, "[::1]:3206".into())
    );
    assert_eq!(IsnsConfig::parse_server("[fe80::1]").unwrap().port, 3205);
    for bad in [
        "", ":3205", "h:0", "h:x", "h:70000", "::1", "[::1", "[::1]x", "a b",
    ] {
        let e = IsnsConfig::parse_server(bad).unwrap_err();
        assert!(e.contains("HOST[:PORT]"), "{bad}: {e}");
    }
}

#[test]
fn isns_table() {
    let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\nlun = [\"ram:1M\"]\n";
    let c = Config::from_toml_str(base, "t.toml").unwrap();
    assert_eq!(c.isns, None);
    let c = Config::from_toml_str(
        &format!(
            "{base}[isns]\nserver = \"isns.lan\"\nportals = [\"10.0.2.2:3260\"]\nentity = \"e1\"\n"
        ),
        "t.toml",
    )
    .unwrap();
    let i = c.isns.unwrap();
    assert_eq!((i.host.as_str(), i.port), ("isns.lan", 3205));
    assert_eq!(i.portals, vec!["10.0.2.2:3260".parse().unwrap()]);
    assert_eq!(i.entity.as_deref(), Some("e1"));
    for (bad, want) in [
        ("[isns]\nserver = \"h:x\"\n", "[isns] server"),
        (
            "[isns]\nserver = \"h\"\nportals = [\"nope\"]\n",
            "[isns] portals",
        ),
        ("[isns]\nserver = \"h\"\nentity = \"\"\n", "[isns] entity"),
        ("[isns]\nportals = []\n", "server"),
        ("[isns]\nserver = \"h\"\nbogus = 1\n", "bogus"),
    ] {
        let e = Config::from_toml_str(&format!("{base}{bad}"), "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.toml:") && e.contains(want), "{bad}: {e}");
    }
}

#[test]
fn rbd_luns_in_specs_and_tables_and_saved_back() {
    let l =
        LunConfig::from_spec("rbd:rbd/disk1:10G,conf=/etc/ceph/c.conf,id=gw,bs=4096,timeout=7,ro")
            .unwrap();
    let Backing::Rbd { spec } = &l.backing else {
        panic!("not an RBD LUN: {:?}", l.backing)
    };
    assert_eq!((spec.pool.as_str(), spec.image.as_str()), ("rbd", "disk1"));
    assert_eq!(spec.create_size, Some(10 << 30));
    assert_eq!(
        spec.conf.as_deref(),
        Some(std::path::Path::new("/etc/ceph/c.conf"))
    );
    assert_eq!(spec.id.as_deref(), Some("gw"));
    assert_eq!(spec.timeout, std::time::Duration::from_secs(7));
    // The LUN's own options stay the LUN's.
    assert!(l.read_only && l.block_size == 4096);
    for bad in [
        "rbd:",
        "rbd:pool",
        "rbd:rbd/x:10G,direct",
        "rbd:rbd/x,timeout=soon",
        "rbd:rbd/x:1000,bs=4096",
    ] {
        assert!(LunConfig::from_spec(bad).is_err(), "{bad} accepted");
    }
    let text = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\n[[target.lun]]\nrbd = \"pool1/img\"\nsize = \"1G\"\nceph_conf = \"/etc/ceph/ceph.conf\"\nceph_id = \"gw\"\nceph_timeout = 9\n[options]\ntarget_port_group = 2\nalua_state = \"standby\"\n";
    let c = Config::from_toml_str(text, "t").unwrap();
    let Backing::Rbd { spec } = &c.targets[0].luns[0].backing else {
        panic!("not an RBD LUN")
    };
    assert_eq!(
        (spec.pool.as_str(), spec.image.as_str(), spec.create_size),
        ("pool1", "img", Some(1 << 30))
    );
    assert_eq!(spec.timeout, std::time::Duration::from_secs(9));
    assert_eq!(c.options.target_port_group, 2);
    assert_eq!(c.options.alua_state, super::GatewayState::Standby);
    // What `ctl save` writes reads back the same.
    let again = Config::from_toml_str(&c.to_toml(), "saved").unwrap();
    assert_eq!(
        again.targets[0].luns[0].backing,
        c.targets[0].luns[0].backing
    );
    assert_eq!(again.options.target_port_group, 2);
    assert_eq!(again.options.alua_state, super::GatewayState::Standby);
    // Ceph keys without rbd, rbd with path, and group 0 are refused.
    for bad in [
        "[[target.lun]]\npath = \"/tmp/x\"\nceph_id = \"gw\"\n",
        "[[target.lun]]\npath = \"/tmp/x\"\nrbd = \"p/i\"\n",
    ] {
        let t = format!(
            "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.x:t\"\n{bad}"
        );
        assert!(Config::from_toml_str(&t, "t").is_err(), "{bad} accepted");
    }
    let t = text.replace("target_port_group = 2", "target_port_group = 0");
    assert!(Config::from_toml_str(&t, "t").is_err(), "group 0 accepted");
}

#[test]
fn shared_key_and_spec_option() {
    assert!(!LunConfig::from_spec("/tmp/x.img:1G").unwrap().shared);
    let l = LunConfig::from_spec("/tmp/x.img:1G,shared").unwrap();
    assert!(l.shared);
    assert_eq!(l.lock_mode(), ethersan_backend::lock::LockMode::Shared);
    let ro = LunConfig::from_spec("/tmp/x.img,ro").unwrap();
    assert_eq!(ro.lock_mode(), ethersan_backend::lock::LockMode::Shared);
    let e = LunConfig::from_spec("ram:1M,shared")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not RAM LUNs"), "{e}");
    let base = "portals = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.org.t:a\"\n";
    let two = |opt: &str| {
        format!("{base}[[target.lun]]\npath = \"/tmp/s.img\"\n{opt}[[target.lun]]\npath = \"/tmp/s.img\"\n{opt}")
    };
    // Two LUNs writing one file: refused, unless both are shared.
    let e = Config::from_toml_str(&two(""), "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("shared = true on both"), "{e}");
    let c = Config::from_toml_str(&two("shared = true\n"), "t").unwrap();
    assert!(c.targets[0].luns.iter().all(|l| l.shared));
}
