use super::*;
use proptest::prelude::*;

const NOW: u64 = 1_800_000_000_000;
const NONCE: [u8; 16] = *b"sixteen byte nce";

fn lab() -> GroupKeys {
    GroupKeys::derive("lab", b"correct horse battery").unwrap()
}

fn lun(n: u64) -> CatalogLun {
    CatalogLun {
        lun: n,
        blocks: 1 << 21,
        block_size: 512,
        level: Level::Encrypt,
    }
}

fn small() -> Catalog {
    Catalog {
        server: "store1".into(),
        targets: vec![
            CatalogTarget {
                name: "iqn.2026-01.org.ethersan:disk0".into(),
                alias: Some("first disk".into()),
                luns: vec![
                    lun(0),
                    CatalogLun {
                        lun: 1,
                        blocks: 8,
                        block_size: 4096,
                        level: Level::None,
                    },
                ],
            },
            CatalogTarget {
                name: "iqn.2026-01.org.ethersan:empty".into(),
                alias: None,
                luns: vec![],
            },
        ],
    }
}

fn big(targets: usize, luns_each: usize) -> Catalog {
    Catalog {
        server: "big-server".into(),
        targets: (0..targets)
            .map(|t| CatalogTarget {
                name: format!("iqn.2026-01.org.ethersan:target-{t}"),
                alias: (t % 2 == 0).then(|| format!("alias {t}")),
                luns: (0..luns_each as u64).map(lun).collect(),
            })
            .collect(),
    }
}

fn ask(resp: &mut DiscoveryResponder, cat: &Catalog, max_frame: usize) -> Catalog {
    let q = query(&lab(), NOW, NONCE);
    let frames = resp.handle_query(&q, NOW + 5, cat, max_frame).unwrap();
    let parts: Vec<ReplyPart> = frames
        .iter()
        .map(|f| {
            assert!(f.len() <= max_frame, "{} > {max_frame}", f.len());
            open_reply(&lab(), &NONCE, f).unwrap()
        })
        .collect();
    assemble(parts).unwrap()
}

#[test]
fn member_query_gets_the_catalog() {
    let mut r = DiscoveryResponder::new(lab());
    assert_eq!(ask(&mut r, &small(), 1500), small());
    assert_eq!(
        ask(
            &mut DiscoveryResponder::new(lab()),
            &Catalog::default(),
            1500
        ),
        Catalog::default()
    );
}

#[test]
fn query_layout() {
    let q = query(&lab(), NOW, NONCE);
    assert_eq!(q.len(), 65 + 3);
    assert_eq!(&q[..8], &[0xE5, 3, 0x20, 0, 0, 0, 0, 0]);
    assert_eq!(&q[8..24], &NONCE);
    assert_eq!(&q[24..32], &NOW.to_be_bytes());
    assert_eq!(&q[32..36], b"\x03lab");
}

#[test]
fn strangers_get_silence() {
    let cat = small();
    let others = [
        GroupKeys::derive("lab", b"wrong secret!").unwrap(),
        GroupKeys::derive("lab2", b"correct horse battery").unwrap(),
    ];
    let mut r = DiscoveryResponder::new(lab());
    assert_eq!(
        r.handle_query(&query(&others[0], NOW, NONCE), NOW, &cat, 1500),
        Err(DiscoveryError::BadMac)
    );
    assert_eq!(
        r.handle_query(&query(&others[1], NOW, NONCE), NOW, &cat, 1500),
        Err(DiscoveryError::OtherGroup)
    );
    let mut q = query(&lab(), NOW, NONCE);
    let last = q.len() - 1;
    q[last] ^= 1;
    assert_eq!(
        r.handle_query(&q, NOW, &cat, 1500),
        Err(DiscoveryError::BadMac)
    );
    // Time outside 60 s either way.
    for t in [NOW - 60_001, NOW + 60_001] {
        assert_eq!(
            r.handle_query(&query(&lab(), t, NONCE), NOW, &cat, 1500),
            Err(DiscoveryError::ClockSkew { skew_ms: 60_001 })
        );
    }
    assert!(r
        .handle_query(&query(&lab(), NOW - 60_000, NONCE), NOW, &cat, 1500)
        .is_ok());
}

#[test]
fn replayed_nonce_is_ignored_for_two_minutes() {
    let cat = small();
    let mut r = DiscoveryResponder::new(lab());
    let q = query(&lab(), NOW, NONCE);
    assert!(r.handle_query(&q, NOW, &cat, 1500).is_ok());
    assert_eq!(
        r.handle_query(&q, NOW + 1, &cat, 1500),
        Err(DiscoveryError::Replayed)
    );
    // The same nonce in a fresh query (new time) is still a replay.
    let q2 = query(&lab(), NOW + 50_000, NONCE);
    assert_eq!(
        r.handle_query(&q2, NOW + 50_000, &cat, 1500),
        Err(DiscoveryError::Replayed)
    );
    let later = NOW + NONCE_MEMORY_MS + 1;
    let q3 = query(&lab(), later, NONCE);
    assert!(r.handle_query(&q3, later, &cat, 1500).is_ok());
}

#[test]
fn nonce_memory_is_bounded() {
    let cat = small();
    let mut r = DiscoveryResponder::new(lab());
    for i in 0..MAX_REMEMBERED_NONCES as u128 {
        let q = query(&lab(), NOW, i.to_be_bytes());
        assert!(r.handle_query(&q, NOW, &cat, 1500).is_ok());
    }
    let q = query(&lab(), NOW, [0xFF; 16]);
    assert_eq!(
        r.handle_query(&q, NOW, &cat, 1500),
        Err(DiscoveryError::Busy)
    );
    // Two minutes on, room again.
    let later = NOW + NONCE_MEMORY_MS + 1;
    let q = query(&lab(), later, [0xFF; 16]);
    assert!(r.handle_query(&q, later, &cat, 1500).is_ok());
    assert_eq!(r.order.len(), 1);
}

#[test]
fn large_catalog_splits_into_parts_that_fit() {
    // One target of 300 LUNs, and 300 LUNs over 30 targets.
    for cat in [big(1, 300), big(30, 10), big(3, 100)] {
        let q = query(&lab(), NOW, NONCE);
        let frames = DiscoveryResponder::new(lab())
            .handle_query(&q, NOW, &cat, 1500)
            .unwrap();
        assert!(frames.len() > 1);
        let mut parts = Vec::new();
        for f in &frames {
            assert!(f.len() <= 1500);
            let p = open_reply(&lab(), &NONCE, f).unwrap();
            assert_eq!(usize::from(p.count), frames.len());
            parts.push(p);
        }
        // Whole targets per part where they fit.
        if cat.targets.len() == 30 {
            for p in &parts {
                assert!(p.catalog.targets.iter().all(|t| t.luns.len() == 10));
            }
        }
        // Merged part by part, in order, the catalog is whole again.
        let mut merged = Catalog {
            server: parts[0].catalog.server.clone(),
            targets: Vec::new(),
        };
        for p in &parts {
            merged.merge(p.catalog.clone());
        }
        assert_eq!(merged, cat);
        parts.reverse();
        assert_eq!(assemble(parts).unwrap(), cat);
    }
    // A jumbo frame holds it all.
    let mut r = DiscoveryResponder::new(lab());
    let q = query(&lab(), NOW, NONCE);
    assert_eq!(
        r.handle_query(&q, NOW, &big(1, 300), 9000).unwrap().len(),
        1
    );
}

#[test]
fn assemble_wants_every_part_once() {
    let q = query(&lab(), NOW, NONCE);
    let frames = DiscoveryResponder::new(lab())
        .handle_query(&q, NOW, &big(1, 300), 1500)
        .unwrap();
    let parts: Vec<_> = frames
        .iter()
        .map(|f| open_reply(&lab(), &NONCE, f).unwrap())
        .collect();
    assert!(assemble(parts[1..].to_vec()).is_err());
    let mut dup = parts.clone();
    dup[1] = dup[0].clone();
    assert!(assemble(dup).is_err());
    assert!(assemble(Vec::new()).is_err());
}

#[test]
fn frame_too_small() {
    let q = query(&lab(), NOW, NONCE);
    let mut r = DiscoveryResponder::new(lab());
    assert!(matches!(
        r.handle_query(&q, NOW, &small(), 60),
        Err(DiscoveryError::TooLarge(_))
    ));
}

#[test]
fn non_members_cannot_open_replies() {
    let q = query(&lab(), NOW, NONCE);
    let frames = DiscoveryResponder::new(lab())
        .handle_query(&q, NOW, &small(), 1500)
        .unwrap();
    let stranger = GroupKeys::derive("lab", b"wrong secret!").unwrap();
    assert_eq!(
        open_reply(&stranger, &NONCE, &frames[0]),
        Err(DiscoveryError::Decrypt)
    );
    assert_eq!(
        open_reply(&lab(), &[0; 16], &frames[0]),
        Err(DiscoveryError::OtherQuery)
    );
    // Tampering anywhere before the padding fails; padding is ignored.
    let f = &frames[0];
    for i in 0..f.len() {
        let mut m = f.clone();
        m[i] ^= 0x04;
        assert!(open_reply(&lab(), &NONCE, &m).is_err(), "byte {i}");
    }
    let mut padded = f.clone();
    padded.resize(f.len() + 20, 0);
    assert_eq!(
        open_reply(&lab(), &NONCE, &padded).unwrap().catalog,
        small()
    );
}

#[test]
fn catalog_encoding_round_trip() {
    for c in [small(), big(4, 7), Catalog::default()] {
        assert_eq!(Catalog::decode(&c.encode().unwrap()).unwrap(), c);
    }
    let e = small().encode().unwrap();
    for i in 0..e.len() {
        assert!(Catalog::decode(&e[..i]).is_err());
    }
    let mut long = e.clone();
    long.push(0);
    assert!(Catalog::decode(&long).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut r = DiscoveryResponder::new(lab());
        let _ = r.handle_query(&bytes, NOW, &small(), 1500);
        let _ = open_reply(&lab(), &NONCE, &bytes);
        let _ = Catalog::decode(&bytes);
    }

    #[test]
    fn mutated_query_is_silent(at in 0usize..68, x in 1u8..=255) {
        let mut q = query(&lab(), NOW, NONCE);
        let n = q.len();
        q[at % n] ^= x;
        let mut r = DiscoveryResponder::new(lab());
        prop_assert!(r.handle_query(&q, NOW, &small(), 1500).is_err());
    }

    #[test]
    fn any_split_reassembles(
        sizes in proptest::collection::vec(0usize..80, 0..12),
        max_frame in 200usize..3000,
    ) {
        let cat = Catalog {
            server: "s".into(),
            targets: sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| CatalogTarget {
                    name: format!("t{i}"),
                    alias: None,
                    luns: (0..n as u64).map(lun).collect(),
                })
                .collect(),
        };
        let q = query(&lab(), NOW, NONCE);
        let frames = DiscoveryResponder::new(lab())
            .handle_query(&q, NOW, &cat, max_frame)
            .unwrap();
        let mut parts = Vec::new();
        for f in &frames {
            prop_assert!(f.len() <= max_frame);
            parts.push(open_reply(&lab(), &NONCE, f).unwrap());
        }
        prop_assert_eq!(assemble(parts).unwrap(), cat);
    }
}
