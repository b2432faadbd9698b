//! The seed corpus of the `channel_handshake` fuzz target
//! (fuzz/seeds/channel_handshake/): a real message of each handshake and
//! discovery kind, a catalog, and one sequence of frames. Handshake
//! messages are random, so the test checks that the committed seeds are
//! still accepted (the `HELLO` by a target of the fuzz group, the query and
//! its reply at the fixed time and nonce the target uses) rather than
//! comparing bytes; `CHANNEL_WRITE_SEEDS=1 cargo test -p ethersan-channel
//! --test fuzz_seeds` rewrites them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ethersan_channel::discovery::{self, Catalog, CatalogLun, CatalogTarget, DiscoveryResponder};
use ethersan_channel::group::GroupKeys;
use ethersan_channel::handshake::{
    InitiatorHandshake, Responder, HELLO_FINISH_LEN, HELLO_LEN, HELLO_REPLY_LEN,
};
use ethersan_channel::Level;

// The same values as in fuzz/fuzz_targets/channel_handshake.rs.
const GROUP: &str = "fuzz";
const SECRET: &[u8] = b"fuzz group secret";
const SEED_TIME: u64 = 1_800_000_000_000;
const SEED_NONCE: [u8; 16] = *b"fuzz-query-nonce";

fn keys() -> GroupKeys {
    GroupKeys::derive(GROUP, SECRET).unwrap()
}

fn catalog() -> Catalog {
    Catalog {
        server: "fuzz-server".into(),
        targets: vec![
            CatalogTarget {
                name: "iqn.2026-01.org.ethersan:fuzz".into(),
                alias: Some("fuzz disk".into()),
                luns: (0..3)
                    .map(|lun| CatalogLun {
                        lun,
                        blocks: 2048,
                        block_size: 512,
                        level: Level::from_u8(lun as u8).unwrap(),
                    })
                    .collect(),
            },
            CatalogTarget {
                name: "iqn.2026-01.org.ethersan:none".into(),
                alias: None,
                luns: Vec::new(),
            },
        ],
    }
}

/// A sequence frame: selector (0 HELLO, 1 HELLO_FINISH, 2 HELLO_REPLY,
/// 3 DISCOVER), 2-byte length, frame.
fn push_frame(seq: &mut Vec<u8>, sel: u8, f: &[u8]) {
    seq.push(sel);
    seq.extend_from_slice(&(f.len() as u16).to_be_bytes());
    seq.extend_from_slice(f);
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let k = keys();
    let now = Instant::now();
    let mut init = InitiatorHandshake::new(&k, 7, Level::Encrypt, 1500).unwrap();
    let mut resp = Responder::new(k.clone(), 4, Duration::from_secs(5));
    let reply = resp.handle_hello(now, init.hello(), 9, 1500).unwrap().reply;
    let (finish, _) = init.handle_reply(&reply).unwrap();
    let q = discovery::query(&k, SEED_TIME, SEED_NONCE);
    let answer = DiscoveryResponder::new(k.clone())
        .handle_query(&q, SEED_TIME, &catalog(), 1500)
        .unwrap()
        .remove(0);
    let mut seq = Vec::new();
    push_frame(&mut seq, 0, init.hello());
    push_frame(&mut seq, 1, &finish);
    push_frame(&mut seq, 2, &reply);
    push_frame(&mut seq, 3, &q);
    vec![
        ("hello", init.hello().to_vec()),
        ("hello_reply", reply),
        ("hello_finish", finish),
        ("discover", q),
        ("discover_reply", answer),
        ("catalog", catalog().encode().unwrap()),
        ("sequence", seq),
    ]
}

#[test]
fn fuzz_seeds_are_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/channel_handshake");
    if std::env::var_os("CHANNEL_WRITE_SEEDS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds() {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; rerun with CHANNEL_WRITE_SEEDS=1", path.display()))
    };
    let k = keys();
    let stale = "stale; rerun with CHANNEL_WRITE_SEEDS=1";
    let hello = read("hello");
    assert_eq!(hello.len(), HELLO_LEN, "hello {stale}");
    Responder::new(k.clone(), 4, Duration::from_secs(5))
        .handle_hello(Instant::now(), &hello, 9, 1500)
        .unwrap_or_else(|e| panic!("hello {stale}: {e}"));
    assert_eq!(
        read("hello_reply").len(),
        HELLO_REPLY_LEN,
        "hello_reply {stale}"
    );
    assert_eq!(
        read("hello_finish").len(),
        HELLO_FINISH_LEN,
        "hello_finish {stale}"
    );
    DiscoveryResponder::new(k.clone())
        .handle_query(&read("discover"), SEED_TIME, &catalog(), 1500)
        .unwrap_or_else(|e| panic!("discover {stale}: {e}"));
    let part = discovery::open_reply(&k, &SEED_NONCE, &read("discover_reply"))
        .unwrap_or_else(|e| panic!("discover_reply {stale}: {e}"));
    assert_eq!(part.catalog, catalog(), "discover_reply {stale}");
    assert_eq!(
        Catalog::decode(&read("catalog")).unwrap(),
        catalog(),
        "catalog {stale}"
    );
    assert!(read("sequence").len() > HELLO_LEN, "sequence {stale}");
}

/// The `channel_frame` seeds (fuzz/seeds/channel_frame/, hand-made frames)
/// speak this version, and those with a valid CRC32C open (a RESET has a
/// token instead), so the fuzzer
/// starts past the version check.
#[test]
fn channel_frame_seeds_are_current() {
    use ethersan_channel::frame::{MAGIC, VERSION};
    use ethersan_channel::protect::Protector;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/channel_frame");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("channel_frame seeds") {
        let path = entry.expect("a seed").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_owned();
        let mut f = std::fs::read(&path).expect("a seed's bytes");
        assert_eq!(&f[..2], &[MAGIC, VERSION], "{name}: prefix");
        if name == "reset" {
            // A RESET carries a token, not a CRC: its kind and length.
            assert_eq!((f[2], f.len()), (0x04, 24), "{name}");
        } else if !matches!(name.as_str(), "bad_len" | "hello_prefix") {
            Protector::crc_only()
                .open(&mut f)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        n += 1;
    }
    assert!(n >= 9, "{n} seeds");
}
