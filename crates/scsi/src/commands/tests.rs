//! Unit tests of the command table, its rules and the reports made from it.

use super::report::{report_supported_opcodes, report_supported_tmfs};
use super::*;
use crate::sense::Sense;

#[test]
fn indexed_lookup_matches_a_scan_of_the_table() {
    for op in 0..=255u8 {
        for byte1 in 0..=255u8 {
            let action = byte1 & 0x1f;
            let scan = COMMANDS.iter().find(|d| {
                d.opcode == op && (d.service_action.is_none() || d.service_action == Some(action))
            });
            let found = lookup(&[op, byte1]);
            assert_eq!(
                found.map(|d| d.name),
                scan.map(|d| d.name),
                "{op:#04x} {byte1:#04x}"
            );
        }
        let alone = COMMANDS
            .iter()
            .find(|d| d.opcode == op && d.service_action.is_none());
        assert_eq!(lookup(&[op]).map(|d| d.name), alone.map(|d| d.name));
    }
}

#[test]
fn table_is_consistent() {
    for d in COMMANDS {
        assert_eq!(d.usage[0], d.opcode, "{}", d.name);
        assert!(matches!(d.cdb_len, 6 | 10 | 12 | 16), "{}", d.name);
        if let Some(a) = d.service_action {
            assert_eq!(d.usage[1] & 0x1f, 0x1f, "{}", d.name);
            assert!(a < 0x20);
        }
        let dups = COMMANDS
            .iter()
            .filter(|o| o.opcode == d.opcode && o.service_action == d.service_action)
            .count();
        assert_eq!(dups, 1, "{}", d.name);
    }
    assert_eq!(lookup(&[0x9e, 0x10]).unwrap().op, Op::ReadCapacity16);
    assert!(lookup(&[0x9e, 0x11]).is_none());
    assert!(lookup(&[0xff]).is_none());
}

/// The columns of every row agree with each other, and every row of
/// one command kind has the same rules.
#[test]
fn every_row_has_consistent_rules() {
    for d in COMMANDS {
        let r = d.rules;
        // Writing the medium conflicts under Write Exclusive (SPC-4
        // table 46): WRITE ATOMIC(16) was the one that did not.
        if r.changes_medium {
            assert_eq!(r.access, Access::Write, "{}", d.name);
        }
        // Writing the medium needs one, except SANITIZE (it is how a
        // unit leaves the failure mode a failed SANITIZE left) and
        // EXTENDED COPY (it writes the LUNs its descriptors name).
        if r.changes_medium && !matches!(d.op, Op::Sanitize | Op::ExtendedCopy) {
            assert!(r.needs_medium, "{}", d.name);
        }
        // What runs during a SANITIZE touches no medium and conflicts
        // with nothing; what reports no unit attention also runs then,
        // in every ALUA state.
        if r.during_sanitize {
            assert!(!r.needs_medium && r.access == Access::Free, "{}", d.name);
            assert_eq!(r.alua, ServedIn::EveryState, "{}", d.name);
        }
        if r.ua_exempt {
            assert!(r.during_sanitize, "{}", d.name);
        }
        // Standby and unavailable serve nothing that needs the medium.
        if r.alua != ServedIn::ActiveOnly {
            assert!(!r.needs_medium, "{}", d.name);
        }
        // Every block read or write of the data path needs the medium.
        if matches!(d.op, Op::Read | Op::Write | Op::WriteVerify | Op::SyncCache) {
            assert!(r.needs_medium && r.access != Access::Free, "{}", d.name);
        }
        for o in COMMANDS.iter().filter(|o| o.op == d.op) {
            assert_eq!(o.rules, r, "{} and {}", d.name, o.name);
        }
    }
}

#[test]
fn reserved_bit_check() {
    let d = lookup(&[0x12]).unwrap();
    assert_eq!(reserved_bits(d, &[0x12, 0x02, 0, 0, 36, 0]), Some((1, 1)));
    assert_eq!(reserved_bits(d, &[0x12, 0x01, 0x80, 0, 36, 0]), None);
    assert_eq!(reserved_bits(d, &[0x12, 0, 0, 0, 36, 0x04]), Some((5, 2)));
}

fn rsoc(rctd: bool, options: u8, opcode: u8, sa: u16, alloc: u32) -> Vec<u8> {
    let (s, a) = (sa.to_be_bytes(), alloc.to_be_bytes());
    vec![
        0xa3,
        0x0c,
        u8::from(rctd) << 7 | options,
        opcode,
        s[0],
        s[1],
        a[0],
        a[1],
        a[2],
        a[3],
        0,
        0,
    ]
}

#[test]
fn all_commands_come_from_the_table() {
    for rctd in [false, true] {
        let d = report_supported_opcodes(&rsoc(rctd, 0, 0, 0, 1 << 16)).unwrap();
        let len = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
        assert_eq!(len, d.len() - 4);
        let size = if rctd { 20 } else { 8 };
        assert_eq!(len, COMMANDS.len() * size);
        for (desc, def) in d[4..].chunks(size).zip(COMMANDS) {
            assert_eq!(desc[0], def.opcode);
            assert_eq!(
                desc[5] & 1,
                u8::from(def.service_action.is_some()),
                "SERVACTV"
            );
            assert_eq!(
                u16::from_be_bytes([desc[2], desc[3]]),
                u16::from(def.service_action.unwrap_or(0))
            );
            assert_eq!(
                usize::from(u16::from_be_bytes([desc[6], desc[7]])),
                def.cdb_len
            );
            assert_eq!(desc[5] & 2 != 0, rctd, "CTDP");
            if rctd {
                assert_eq!(&desc[8..10], &[0, 0x0a], "timeouts descriptor length");
            }
        }
    }
    // Truncated to the allocation length.
    assert_eq!(
        report_supported_opcodes(&rsoc(false, 0, 0, 0, 10))
            .unwrap()
            .len(),
        10
    );
}

#[test]
fn one_command_returns_its_usage_data() {
    // Option 1: an opcode without service actions.
    let d = report_supported_opcodes(&rsoc(false, 1, 0x28, 0, 64)).unwrap();
    assert_eq!(d[1] & 0x07, 3, "supported as the standard says");
    assert_eq!(u16::from_be_bytes([d[2], d[3]]), 10);
    assert_eq!(&d[4..14], lookup(&[0x28]).unwrap().usage);
    // Option 2: opcode and service action, with the timeouts descriptor.
    let d = report_supported_opcodes(&rsoc(true, 2, 0x9e, 0x10, 64)).unwrap();
    assert_eq!(d[1], 0x83);
    assert_eq!(d[4], 0x9e);
    assert_eq!(d.len(), 4 + 16 + 12);
    // Not supported: SUPPORT = 1, no usage data.
    assert_eq!(
        report_supported_opcodes(&rsoc(false, 1, 0xff, 0, 64)).unwrap(),
        [0, 1, 0, 0]
    );
    assert_eq!(
        report_supported_opcodes(&rsoc(false, 2, 0x9e, 0x1f, 64)).unwrap(),
        [0, 1, 0, 0]
    );
    assert_eq!(
        report_supported_opcodes(&rsoc(false, 2, 0x9e, 0x100, 64)).unwrap(),
        [0, 1, 0, 0]
    );
}

#[test]
fn reporting_option_mismatches_are_invalid_fields() {
    let bad = Sense::invalid_cdb_field(2, Some(2));
    // Option 1 for an opcode with service actions, option 2 for one without.
    assert_eq!(
        report_supported_opcodes(&rsoc(false, 1, 0x9e, 0, 64)),
        Err(bad)
    );
    assert_eq!(
        report_supported_opcodes(&rsoc(false, 2, 0x28, 0, 64)),
        Err(bad)
    );
    for options in 3..8 {
        assert_eq!(
            report_supported_opcodes(&rsoc(false, options, 0, 0, 64)),
            Err(bad)
        );
    }
}

#[test]
fn task_management_functions() {
    let d = report_supported_tmfs(&[0xa3, 0x0d, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0]).unwrap();
    assert_eq!(d.len(), 4);
    assert_ne!(d[0] & 0x08, 0, "LOGICAL UNIT RESET supported");
    let d = report_supported_tmfs(&[0xa3, 0x0d, 0x80, 0, 0, 0, 0, 0, 0, 255, 0, 0]).unwrap();
    assert_eq!(d.len(), 16);
}
