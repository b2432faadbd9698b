//! Unit tests of the reservations: the shared blob, ALL_TG_PT.

use super::*;

fn param(rkey: u64, sakey: u64, flags: u8) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&rkey.to_be_bytes());
    p[8..16].copy_from_slice(&sakey.to_be_bytes());
    p[20] = flags;
    p
}

#[test]
fn the_shared_blob_round_trips_and_rejects_corruption() {
    let mut a = Reservations::with_state_file(None, 1);
    a.set_name(Nexus(7), "iqn.2026-11.org.example:a");
    a.pr_out(Nexus(7), 0, 0, &param(0, 0xa, 0x04)).ok().unwrap();
    a.pr_out(Nexus(7), 1, pr_type::WE_REGISTRANTS_ONLY, &param(0xa, 0, 0))
        .ok()
        .unwrap();
    let mut b = Reservations::with_state_file(None, 2);
    b.decode_shared(&a.encode()).unwrap();
    b.pr_out(Nexus(8), 0, 0, &param(0, 0xb, 0)).ok().unwrap();
    let mut notices = b
        .pr_out(Nexus(8), 4, pr_type::WRITE_EXCLUSIVE, &param(0xb, 0xa, 0))
        .ok()
        .unwrap();
    assert_eq!(notices.len(), 1);
    assert!(notices[0].all_ports, "the victim registered with ALL_TG_PT");
    b.log_notices(&mut notices);
    b.log_notices(&mut [Notice::to_all(2, codes::LUN_RESET)]);
    let blob = b.encode();
    let mut c = Reservations::with_state_file(None, 1);
    c.decode_shared(&blob).unwrap();
    assert_eq!(c.encode(), blob);
    assert_eq!(c.last_seq(), 2);
    let seen: Vec<_> = c.notices_after(0).filter(|n| n.for_port(1)).collect();
    assert_eq!(seen.len(), 2, "the preempted registrant and the reset");
    assert_eq!(c.notices_after(1).count(), 1);
    // Gateway 1's nexus 8 is not gateway 2's.
    assert!(c.check(Nexus(8), Access::Write).is_err());
    // Unknown kinds of line are skipped; broken known ones are errors.
    let mut future = blob.clone();
    future.extend_from_slice(b"lease 5 2026\n");
    c.decode_shared(&future).unwrap();
    for bad in [
        &b"ethersan-pr\n"[..],
        b"ethersan-pr 1\nreg 1 2 0 zz -\n",
        b"ethersan-pr 1\nholder 1 1 9\n",
        b"ethersan-pr 1\nnotice 1 2\n",
        b"\xff",
    ] {
        assert!(c.decode_shared(bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        c.encode(),
        future[..blob.len()],
        "unchanged by a failed decode"
    );
}

#[test]
fn all_tg_pt_over_a_registration_through_another_port_conflicts() {
    let mut p1 = Reservations::with_state_file(None, 1);
    p1.pr_out(Nexus(7), 0, 0, &param(0, 0xa, 0)).ok().unwrap();
    p1.pr_out(Nexus(7), 1, pr_type::WRITE_EXCLUSIVE, &param(0xa, 0, 0))
        .ok()
        .unwrap();
    let mut p2 = Reservations::with_state_file(None, 2);
    p2.decode_shared(&p1.encode()).unwrap();
    assert!(matches!(
        p2.pr_out(Nexus(7), 0, 0, &param(0, 0xb, 0x04)),
        Err(PrError::Conflict)
    ));
    // Without ALL_TG_PT it is a second I_T nexus, registered apart.
    p2.pr_out(Nexus(7), 0, 0, &param(0, 0xb, 0)).ok().unwrap();
    assert!(
        p2.check(Nexus(7), Access::Write).is_err(),
        "not the holder here"
    );
    assert!(p1.check(Nexus(7), Access::Write).is_ok());
}
