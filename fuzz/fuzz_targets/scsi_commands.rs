//! The SCSI layer on arbitrary command sequences (CDB + Data-Out) against a
//! RAM logical unit: never a panic, sense data always well formed, and the
//! unit still answers TEST UNIT READY afterwards.
#![no_main]

use std::sync::Arc;

use ethersan_backend::ram::RamDevice;
use ethersan_scsi::{LogicalUnit, LuConfig, LunPolicy, Nexus, ScsiCommand, ScsiRequest, ScsiStatus, ScsiTarget};
use libfuzzer_sys::fuzz_target;

fn target() -> ScsiTarget {
    let dev = Arc::new(RamDevice::new(1 << 20, 512).expect("ram"));
    let cfg = LuConfig {
        read_only: false,
        removable: true,
        vendor: "FUZZ".into(),
        product: "fuzz".into(),
        revision: "0001".into(),
        serial: "0123456789abcdef".into(),
        naa: [0x60; 16],
        target_name: "iqn.2026-11.org.ethersan:fuzz".into(),
        write_cache: true,
        pr_state_file: None,
        physical_block_size: 4096,
        ..LuConfig::default()
    };
    let t = ScsiTarget::new(vec![Arc::new(LogicalUnit::new(dev, cfg))]);
    // LUN 0 is read-only for the initiator named "ro".
    t.set_policy(0, LunPolicy { visible_to: vec![], read_only_for: vec!["ro".into()], ..Default::default() })
        .expect("LUN 0 exists");
    t
}

fuzz_target!(|data: &[u8]| {
    let t = target();
    let (a, b) = (Nexus(1), Nexus(2));
    t.nexus_added(a);
    t.nexus_added(b);
    // Commands: [len (6..=32), nexus/LUN byte, CDB..., data len, data...]
    let mut rest = data;
    for _ in 0..16 {
        let Some((&len, r)) = rest.split_first() else { break };
        let cdb_len = 6 + usize::from(len % 27);
        let Some((&sel, r)) = r.split_first() else { break };
        if r.len() < cdb_len {
            break;
        }
        let (cdb, r) = r.split_at(cdb_len);
        let Some((&dlen, r)) = r.split_first() else { break };
        let dlen = (usize::from(dlen) * 16).min(r.len());
        let (data_out, r) = r.split_at(dlen);
        rest = r;
        let req = ScsiRequest {
            nexus: if sel & 1 == 0 { a } else { b },
            lun: u64::from(sel >> 7),
            cdb,
            data_out,
            expected_len: 1 << 16,
        };
        // Bit 1: the command comes from the initiator the LUN is read-only for.
        let who = if sel & 2 != 0 { "ro" } else { "rw" };
        let resp = t.submit_and_wait(ScsiCommand::from(&req), Some(who));
        if resp.status == ScsiStatus::CheckCondition {
            let s = &resp.sense;
            assert!(s.len() >= 8, "short sense {s:?}");
            assert!(matches!(s[0] & 0x7f, 0x70 | 0x72), "bad sense format {s:?}");
        }
    }
    let tur = ScsiRequest { nexus: a, lun: 0, cdb: &[0; 6], data_out: &[], expected_len: 0 };
    let _ = t.submit_and_wait(ScsiCommand::from(&tur), None);
});
