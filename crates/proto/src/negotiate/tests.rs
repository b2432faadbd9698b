//! Tests of login and text negotiation: both negotiators, alone and talking
//! to each other (RFC 7143 §6, §13).

use super::*;
use proptest::prelude::*;

fn pairs(v: &[(&str, &str)]) -> Pairs {
    v.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn get<'a>(p: &'a Pairs, k: &str) -> Option<&'a str> {
    p.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.as_str())
}

#[test]
fn target_answers_by_rule() {
    let mut n = TargetNegotiator::new(TargetSettings::default());
    let sec = n
        .security_keys(&pairs(&[
            ("InitiatorName", "iqn.1994-05.com.example:x"),
            ("SessionType", "Normal"),
            ("TargetName", "iqn.2026-11.org.ethersan:default"),
            ("AuthMethod", "CHAP,None"),
        ]))
        .unwrap();
    assert_eq!(get(&sec, "AuthMethod"), Some("None"));
    assert_eq!(get(&sec, "TargetPortalGroupTag"), Some("1"));
    assert!(n.can_transit(0, 1));
    let op = n
        .operational_keys(&pairs(&[
            ("HeaderDigest", "CRC32C,None"),
            ("DataDigest", "None"),
            ("MaxBurstLength", "0x800000"),
            ("FirstBurstLength", "131072"),
            ("InitialR2T", "Yes"),
            ("ImmediateData", "Yes"),
            ("MaxRecvDataSegmentLength", "65536"),
            ("MaxOutstandingR2T", "8"),
            ("ErrorRecoveryLevel", "2"),
            ("DefaultTime2Wait", "0"),
            ("X-com.example.Foo", "1"),
            ("Bogus", "1"),
            ("MaxConnections", "70000"),
            ("DataPDUInOrder", "Maybe"),
        ]))
        .unwrap();
    assert_eq!(get(&op, "HeaderDigest"), Some("CRC32C"));
    assert_eq!(get(&op, "DataDigest"), Some("None"));
    assert_eq!(get(&op, "MaxBurstLength"), Some("1048576"));
    assert_eq!(get(&op, "FirstBurstLength"), Some("65536"));
    assert_eq!(get(&op, "InitialR2T"), Some("Yes"));
    assert_eq!(get(&op, "ImmediateData"), Some("Yes"));
    assert_eq!(get(&op, "MaxOutstandingR2T"), Some("4"));
    assert_eq!(get(&op, "ErrorRecoveryLevel"), Some("0"));
    assert_eq!(get(&op, "DefaultTime2Wait"), Some("2"));
    assert_eq!(get(&op, "X-com.example.Foo"), Some("NotUnderstood"));
    assert_eq!(get(&op, "Bogus"), Some("NotUnderstood"));
    assert_eq!(get(&op, "MaxConnections"), Some("Reject"));
    assert_eq!(get(&op, "DataPDUInOrder"), Some("Reject"));
    assert_eq!(get(&op, "MaxRecvDataSegmentLength"), Some("262144"));
    let p = n.finish().unwrap();
    assert_eq!(p.max_send_data_segment_length, 65536);
    assert_eq!(p.max_recv_data_segment_length, 262144);
    assert!(p.initial_r2t);
    assert_eq!(p.first_burst_length, 65536);
}

#[test]
fn header_digest_preference_follows_initiator_order() {
    let mut n = TargetNegotiator::new(TargetSettings::default());
    n.security_keys(&pairs(&[
        ("InitiatorName", "iqn.a:b"),
        ("SessionType", "Discovery"),
        ("AuthMethod", "None"),
    ]))
    .unwrap();
    let op = n
        .operational_keys(&pairs(&[
            ("HeaderDigest", "CRC32C,None"),
            ("MaxBurstLength", "4096"),
        ]))
        .unwrap();
    assert_eq!(get(&op, "HeaderDigest"), Some("CRC32C"));
    // Discovery sessions: session-wide data keys are irrelevant.
    assert_eq!(get(&op, "MaxBurstLength"), Some("Irrelevant"));
    assert!(n.finish().unwrap().is_discovery());
}

#[test]
fn errors() {
    let mut n = TargetNegotiator::new(TargetSettings::default());
    assert_eq!(
        n.security_keys(&pairs(&[
            ("InitiatorName", "iqn.a:b"),
            ("InitiatorName", "iqn.a:c")
        ])),
        Err(NegotiationError::Duplicate("InitiatorName".into()))
    );
    let mut n = TargetNegotiator::new(TargetSettings::default());
    n.security_keys(&pairs(&[
        ("InitiatorName", "iqn.a:b"),
        ("AuthMethod", "None"),
    ]))
    .unwrap();
    assert_eq!(n.finish().unwrap_err().login_status(), (0x02, 0x07));
    let mut n = TargetNegotiator::new(TargetSettings::default());
    assert!(n
        .security_keys(&pairs(&[("TargetAddress", "1.2.3.4")]))
        .is_err());
    let mut n = TargetNegotiator::new(TargetSettings::default());
    let r = n.security_keys(&pairs(&[("AuthMethod", "CHAP")])).unwrap();
    assert_eq!(get(&r, "AuthMethod"), Some("Reject"));
    assert!(!n.can_transit(0, 1));
}

#[test]
fn per_target_and_discovery_policies() {
    let chap = |u: &str, s: &str| AuthPolicy::Chap {
        initiator: crate::chap::Credentials::new(u, s.as_bytes()).unwrap(),
        target: None,
    };
    let settings = TargetSettings {
        auth: AuthPolicy::None,
        target_auth: vec![("iqn.2026-11.x:a".into(), chap("ua", "secret-of-a-123"))],
        discovery_auth: Some(chap("ud", "discovery-secret")),
        ..TargetSettings::default()
    };
    assert_eq!(
        settings.auth_for(false, Some("iqn.2026-11.x:a")),
        &chap("ua", "secret-of-a-123")
    );
    assert_eq!(
        settings.auth_for(false, Some("iqn.2026-11.x:b")),
        &AuthPolicy::None
    );
    assert_eq!(settings.auth_for(false, None), &AuthPolicy::None);
    assert_eq!(
        settings.auth_for(true, None),
        &chap("ud", "discovery-secret")
    );
    let old_style = TargetSettings {
        auth: chap("g", "global-secret-1"),
        auth_discovery: false,
        ..TargetSettings::default()
    };
    assert_eq!(old_style.auth_for(true, None), &AuthPolicy::None);
    assert_eq!(
        old_style.auth_for(false, Some("x")),
        &chap("g", "global-secret-1")
    );
    let nonce = (1, [7u8; crate::chap::CHALLENGE_LEN]);
    let new = || TargetNegotiator::new(settings.clone()).with_nonce(nonce.0, nonce.1);
    // TargetName after AuthMethod still decides the policy.
    let mut n = new();
    let a = n
        .security_keys(&pairs(&[
            ("InitiatorName", "iqn.x:i"),
            ("AuthMethod", "CHAP,None"),
            ("TargetName", "iqn.2026-11.x:a"),
        ]))
        .unwrap();
    assert_eq!(get(&a, "AuthMethod"), Some("CHAP"));
    let mut n = new();
    assert_eq!(
        n.security_keys(&pairs(&[
            ("AuthMethod", "None"),
            ("InitiatorName", "iqn.x:i"),
            ("TargetName", "iqn.2026-11.x:a"),
        ])),
        Err(NegotiationError::AuthFailed)
    );
    // Target b needs nothing.
    let mut n = new();
    let a = n
        .security_keys(&pairs(&[
            ("InitiatorName", "iqn.x:i"),
            ("AuthMethod", "CHAP,None"),
            ("TargetName", "iqn.2026-11.x:b"),
        ]))
        .unwrap();
    assert_eq!(get(&a, "AuthMethod"), Some("None"));
    n.operational_keys(&[]).unwrap();
    n.finish().unwrap();
    // Skipping the security stage does not skip a target's CHAP …
    let mut n = new();
    assert_eq!(
        n.operational_keys(&pairs(&[
            ("InitiatorName", "iqn.x:i"),
            ("MaxBurstLength", "65536"),
            ("TargetName", "iqn.2026-11.x:a"),
        ])),
        Err(NegotiationError::AuthFailed)
    );
    // … nor discovery's.
    let mut n = new();
    assert_eq!(
        n.operational_keys(&pairs(&[
            ("InitiatorName", "iqn.x:i"),
            ("SessionType", "Discovery"),
        ])),
        Err(NegotiationError::AuthFailed)
    );
    // Authenticated for nothing, then naming a CHAP target: refused.
    let mut n = new();
    let a = n
        .security_keys(&pairs(&[
            ("InitiatorName", "iqn.x:i"),
            ("AuthMethod", "None"),
        ]))
        .unwrap();
    assert_eq!(get(&a, "AuthMethod"), Some("None"));
    assert!(n
        .operational_keys(&pairs(&[("TargetName", "iqn.2026-11.x:a")]))
        .is_err());
    assert_eq!(n.finish(), Err(NegotiationError::AuthFailed));
}

#[test]
fn initiator_and_target_agree() {
    let mut t = TargetNegotiator::new(TargetSettings::default());
    let mut i = InitiatorNegotiator::new(InitiatorSettings {
        target_name: Some("iqn.2026-11.org.ethersan:default".into()),
        operational: OperationalParams {
            header_digests: OperationalParams::digest_offer(true),
            ..OperationalParams::initiator_default()
        },
        ..Default::default()
    });
    let a = t.security_keys(&i.security_proposal()).unwrap();
    i.accept_response(&a).unwrap();
    let b = t.operational_keys(&i.operational_proposal()).unwrap();
    i.accept_response(&b).unwrap();
    let tp = t.finish().unwrap();
    let ip = i.finish();
    assert!(tp.header_digest && ip.header_digest);
    assert_eq!(tp.max_burst_length, ip.max_burst_length);
    assert_eq!(tp.first_burst_length, ip.first_burst_length);
    assert_eq!(tp.immediate_data, ip.immediate_data);
    assert_eq!(tp.initial_r2t, ip.initial_r2t);
    assert_eq!(tp.max_outstanding_r2t, ip.max_outstanding_r2t);
    // Each side's receive limit is the other's send limit.
    assert_eq!(
        tp.max_recv_data_segment_length,
        ip.max_recv_data_segment_length
    );
    assert_eq!(
        tp.max_send_data_segment_length,
        ip.max_send_data_segment_length
    );
    assert_eq!(i.portal_group_tag, Some(1));
}

#[test]
fn both_sides_read_the_segment_limits_by_direction() {
    let mut t = TargetNegotiator::new(TargetSettings {
        operational: OperationalParams {
            max_recv_data_segment_length: 65_536,
            ..OperationalParams::target_default()
        },
        ..TargetSettings::default()
    });
    let mut i = InitiatorNegotiator::new(InitiatorSettings {
        target_name: Some("iqn.2026-11.org.ethersan:default".into()),
        operational: OperationalParams {
            max_recv_data_segment_length: 16_384,
            data_digests: OperationalParams::digest_offer(true),
            ..OperationalParams::initiator_default()
        },
        ..Default::default()
    });
    let a = t.security_keys(&i.security_proposal()).unwrap();
    i.accept_response(&a).unwrap();
    let b = t.operational_keys(&i.operational_proposal()).unwrap();
    i.accept_response(&b).unwrap();
    for p in [t.finish().unwrap(), i.finish()] {
        assert_eq!(p.max_data_out_segment(), 65_536, "{p:?}");
        assert_eq!(p.max_data_in_segment(), 16_384, "{p:?}");
        assert_eq!(p.target_framer().max_recv_data_segment_length, 65_536);
        assert_eq!(p.initiator_framer().max_recv_data_segment_length, 16_384);
        assert!(p.target_framer().data_digest && p.initiator_framer().data_digest);
    }
}

proptest! {
    #[test]
    fn negotiator_never_panics(keys in proptest::collection::vec(("[A-Za-z#.-]{1,20}", "[ -~]{0,20}"), 0..20)) {
        let mut n = TargetNegotiator::new(TargetSettings::default());
        let _ = n.security_keys(&keys);
        let _ = n.operational_keys(&keys);
        let _ = n.finish();
    }
}
