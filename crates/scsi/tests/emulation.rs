//! The SCSI layer driven directly: good paths and the exact sense for bad
//! input, over RAM and a recording backend, at 512- and 4096-byte blocks.

use std::sync::{Arc, Mutex};

use ethersan_backend::ram::RamDevice;
use ethersan_backend::{BackendError, BlockDevice, IoCompletion, IoRequest, IoResult, Submission};
use ethersan_scsi::{
    LogicalUnit, LuConfig, Nexus, ResetKind, ScsiCommand, ScsiRequest, ScsiResponse, ScsiStatus,
    ScsiTarget,
};
use proptest::prelude::*;

fn cfg(removable: bool, read_only: bool) -> LuConfig {
    LuConfig {
        read_only,
        removable,
        vendor: "ETHERSAN".into(),
        product: "test disk".into(),
        revision: "0001".into(),
        serial: "abc123".into(),
        naa: [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        target_name: "iqn.2026-11.org.ethersan:t".into(),
        write_cache: true,
        pr_state_file: None,
        physical_block_size: 0,
        sanitize_rate: None,
        alua: Default::default(),
    }
}

/// A RAM device that records whether each write asked for FUA.
#[derive(Debug)]
struct Recording {
    inner: RamDevice,
    fua: Mutex<Vec<bool>>,
    flushes: Mutex<usize>,
}

impl BlockDevice for Recording {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn submit(&self, req: IoRequest, done: IoCompletion) -> Submission {
        match &req {
            IoRequest::Write { fua, .. } => self.fua.lock().unwrap().push(*fua),
            IoRequest::Flush => *self.flushes.lock().unwrap() += 1,
            IoRequest::Read { .. } => {}
        }
        self.inner.submit(req, done)
    }
    fn describe(&self) -> String {
        "recording".into()
    }
}

/// Run one command through the target's entry point and wait for it.
fn execute(t: &ScsiTarget, req: &ScsiRequest<'_>) -> ScsiResponse {
    t.submit_and_wait(ScsiCommand::from(req), None)
}

/// Submit as a transport does, for a named initiator (LUN policies apply):
/// take a response that is done now, run a blocking job, or wait for a
/// pending command's completion.
fn submit(t: &ScsiTarget, req: &ScsiRequest<'_>, initiator: Option<&str>) -> ScsiResponse {
    let (tx, rx) = std::sync::mpsc::channel();
    let done = Box::new(move |r| tx.send(r).unwrap());
    match t.submit(ScsiCommand::from(req), initiator, done) {
        ethersan_scsi::Submitted::Done(r) => r,
        ethersan_scsi::Submitted::Blocking(job) => job(),
        ethersan_scsi::Submitted::Pending => rx.recv().unwrap(),
    }
}

const N: Nexus = Nexus(1);
const OTHER: Nexus = Nexus(2);

fn target(bs: u32, removable: bool, read_only: bool) -> ScsiTarget {
    let dev = Arc::new(RamDevice::new(4 << 20, bs).unwrap());
    let t = ScsiTarget::new(vec![Arc::new(LogicalUnit::new(
        dev,
        cfg(removable, read_only),
    ))]);
    t.nexus_added(N);
    t.nexus_added(OTHER);
    // Clear the power-on unit attention of both nexuses.
    for n in [N, OTHER] {
        let r = exec(&t, n, &[0, 0, 0, 0, 0, 0], &[]);
        assert_eq!(sense(&r), Some((6, 0x29, 0)));
    }
    t
}

fn exec(t: &ScsiTarget, nexus: Nexus, cdb: &[u8], data: &[u8]) -> ScsiResponse {
    execute(
        t,
        &ScsiRequest {
            nexus,
            lun: 0,
            cdb,
            data_out: data,
            expected_len: 1 << 20,
        },
    )
}

fn sense(r: &ScsiResponse) -> Option<(u8, u8, u8)> {
    let s = &r.sense;
    match s.first()? & 0x7f {
        0x70 => Some((s[2] & 0xf, s[12], s[13])),
        0x72 => Some((s[1] & 0xf, s[2], s[3])),
        _ => None,
    }
}

fn read10(lba: u32, n: u16) -> Vec<u8> {
    let mut c = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&n.to_be_bytes());
    c
}

fn write10(lba: u32, n: u16, fua: bool) -> Vec<u8> {
    let mut c = read10(lba, n);
    c[0] = 0x2a;
    if fua {
        c[1] = 0x08;
    }
    c
}

#[test]
fn read_write_roundtrip_both_block_sizes() {
    for bs in [512u32, 4096] {
        let t = target(bs, false, false);
        let data: Vec<u8> = (0..bs as usize * 3).map(|i| (i % 253) as u8).collect();
        let r = exec(&t, N, &write10(5, 3, false), &data);
        assert_eq!(r.status, ScsiStatus::Good);
        assert_eq!(r.data_out_len, Some(data.len()));
        let r = exec(&t, N, &read10(5, 3), &[]);
        assert_eq!(r.data_in, data);
        let r = exec(&t, N, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
        let blocks = (4u64 << 20) / u64::from(bs);
        assert_eq!(
            u32::from_be_bytes(r.data_in[0..4].try_into().unwrap()) as u64,
            blocks - 1
        );
        assert_eq!(u32::from_be_bytes(r.data_in[4..8].try_into().unwrap()), bs);
        let mut rc16 = [0u8; 16];
        rc16[0] = 0x9e;
        rc16[1] = 0x10;
        rc16[13] = 32;
        let r = exec(&t, N, &rc16, &[]);
        assert_eq!(r.data_in.len(), 32);
        assert_eq!(
            u64::from_be_bytes(r.data_in[0..8].try_into().unwrap()),
            blocks - 1
        );
    }
}

#[test]
fn bad_requests_get_the_standard_sense() {
    let t = target(512, false, false);
    let blocks = (4u32 << 20) / 512;
    assert_eq!(
        sense(&exec(&t, N, &read10(blocks, 1), &[])),
        Some((5, 0x21, 0))
    );
    assert_eq!(
        sense(&exec(&t, N, &read10(blocks - 1, 2), &[])),
        Some((5, 0x21, 0))
    );
    assert_eq!(
        exec(&t, N, &read10(blocks, 0), &[]).status,
        ScsiStatus::Good
    );
    assert_eq!(
        sense(&exec(&t, N, &read10(blocks + 1, 0), &[])),
        Some((5, 0x21, 0))
    );
    // Unknown opcode, reserved bits, protection fields, NACA.
    assert_eq!(
        sense(&exec(&t, N, &[0xc0, 0, 0, 0, 0, 0], &[])),
        Some((5, 0x20, 0))
    );
    assert_eq!(
        sense(&exec(&t, N, &[0x12, 0x02, 0, 0, 36, 0], &[])),
        Some((5, 0x24, 0))
    );
    let mut c = read10(0, 1);
    c[1] = 0x20;
    assert_eq!(sense(&exec(&t, N, &c, &[])), Some((5, 0x24, 0)));
    let mut c = read10(0, 1);
    c[9] = 0x04;
    assert_eq!(sense(&exec(&t, N, &c, &[])), Some((5, 0x24, 0)));
    // Unsupported VPD page; REPORT LUNS with a tiny allocation length.
    assert_eq!(
        sense(&exec(&t, N, &[0x12, 1, 0x99, 0, 255, 0], &[])),
        Some((5, 0x24, 0))
    );
    assert_eq!(
        sense(&exec(&t, N, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0], &[])),
        Some((5, 0x24, 0))
    );
    // A transfer longer than the LUN is out of range.
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[10..14].copy_from_slice(&0x0010_0000u32.to_be_bytes());
    assert_eq!(sense(&exec(&t, N, &c, &[])), Some((5, 0x21, 0)));
}

#[test]
fn inquiry_and_vpd() {
    let t = target(512, true, false);
    let r = exec(&t, N, &[0x12, 0, 0, 0, 96, 0], &[]);
    assert_eq!(r.data_in[0], 0);
    assert_eq!(r.data_in[1], 0x80, "RMB");
    assert_eq!(&r.data_in[8..16], b"ETHERSAN");
    let r = exec(&t, N, &[0x12, 1, 0, 0, 255, 0], &[]);
    assert_eq!(&r.data_in[4..], &[0x00, 0x80, 0x83, 0x8f, 0xb0, 0xb1, 0xb2]);
    let r = exec(&t, N, &[0x12, 1, 0x80, 0, 255, 0], &[]);
    assert_eq!(&r.data_in[4..], b"abc123");
    let r = exec(&t, N, &[0x12, 1, 0x83, 0, 255, 0], &[]);
    assert_eq!(
        &r.data_in[4..8],
        &[0x01, 0x03, 0, 16],
        "NAA designator first"
    );
    assert_eq!(&r.data_in[8..24], &cfg(false, false).naa);
    assert_eq!(exec(&t, N, &[0x12, 0, 0, 0, 5, 0], &[]).data_in.len(), 5);
    let r = execute(
        &t,
        &ScsiRequest {
            nexus: N,
            lun: 7,
            cdb: &[0x12, 0, 0, 0, 36, 0],
            data_out: &[],
            expected_len: 36,
        },
    );
    assert_eq!(r.data_in[0], 0x7f);
    let r = execute(
        &t,
        &ScsiRequest {
            nexus: N,
            lun: 7,
            cdb: &[0, 0, 0, 0, 0, 0],
            data_out: &[],
            expected_len: 0,
        },
    );
    assert_eq!(sense(&r), Some((5, 0x25, 0)));
}

#[test]
fn wce_off_makes_every_write_durable_and_tells_other_nexuses() {
    let dev = Arc::new(Recording {
        inner: RamDevice::new(1 << 20, 512).unwrap(),
        fua: Mutex::new(vec![]),
        flushes: Mutex::new(0),
    });
    let t = ScsiTarget::new(vec![Arc::new(LogicalUnit::new(
        dev.clone(),
        cfg(false, false),
    ))]);
    for n in [N, OTHER] {
        t.nexus_added(n);
        exec(&t, n, &[0, 0, 0, 0, 0, 0], &[]);
    }
    exec(&t, N, &write10(0, 1, false), &[1u8; 512]);
    exec(&t, N, &write10(0, 1, true), &[1u8; 512]);
    let r = exec(&t, N, &[0x1a, 0x08, 0x08, 0, 255, 0], &[]);
    assert_eq!(r.data_in[3], 0, "DBD: no block descriptor");
    let mut page = r.data_in[4..].to_vec();
    assert_eq!(page[0] & 0x3f, 0x08);
    assert_eq!(page[2] & 0x04, 0x04, "WCE set by default");
    page[2] &= !0x04;
    let mut param = vec![0u8, 0, 0, 0];
    param.extend(&page);
    let r = exec(&t, N, &[0x15, 0x10, 0, 0, param.len() as u8, 0], &param);
    assert_eq!(r.status, ScsiStatus::Good, "{:?}", sense(&r));
    assert_eq!(*dev.flushes.lock().unwrap(), 1, "turning WCE off flushes");
    exec(&t, N, &write10(0, 1, false), &[1u8; 512]);
    assert_eq!(*dev.fua.lock().unwrap(), vec![false, true, true]);
    assert_eq!(
        sense(&exec(&t, OTHER, &[0, 0, 0, 0, 0, 0], &[])),
        Some((6, 0x2a, 1))
    );
    param[4 + 2] |= 0x01; // RCD is not changeable
    assert_eq!(
        sense(&exec(
            &t,
            N,
            &[0x15, 0x10, 0, 0, param.len() as u8, 0],
            &param
        )),
        Some((5, 0x26, 0))
    );
    exec(&t, N, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(*dev.flushes.lock().unwrap(), 2);
}

#[test]
fn d_sense_switches_to_descriptor_format() {
    let t = target(512, false, false);
    let r = exec(&t, N, &[0x1a, 0x08, 0x0a, 0, 255, 0], &[]);
    let mut param = vec![0u8, 0, 0, 0];
    param.extend(&r.data_in[4..]);
    param[4 + 2] |= 0x04;
    assert_eq!(
        exec(&t, N, &[0x15, 0x10, 0, 0, param.len() as u8, 0], &param).status,
        ScsiStatus::Good
    );
    let r = exec(&t, N, &[0xc0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(r.sense[0], 0x72);
    assert_eq!(sense(&r), Some((5, 0x20, 0)));
}

#[test]
fn removable_medium_and_read_only() {
    let t = target(512, true, false);
    assert_eq!(
        exec(&t, N, &[0x1e, 0, 0, 0, 1, 0], &[]).status,
        ScsiStatus::Good
    );
    assert_eq!(
        sense(&exec(&t, N, &[0x1b, 0, 0, 0, 0x02, 0], &[])),
        Some((5, 0x53, 2)),
        "eject prevented"
    );
    assert_eq!(
        exec(&t, N, &[0x1e, 0, 0, 0, 0, 0], &[]).status,
        ScsiStatus::Good
    );
    assert_eq!(
        exec(&t, N, &[0x1b, 0, 0, 0, 0x02, 0], &[]).status,
        ScsiStatus::Good
    );
    assert_eq!(
        sense(&exec(&t, N, &[0, 0, 0, 0, 0, 0], &[])),
        Some((2, 0x3a, 0))
    );
    assert_eq!(sense(&exec(&t, N, &read10(0, 1), &[])), Some((2, 0x3a, 0)));
    assert_eq!(
        exec(&t, N, &[0x1b, 0, 0, 0, 0x03, 0], &[]).status,
        ScsiStatus::Good
    );
    assert_eq!(
        exec(&t, N, &[0, 0, 0, 0, 0, 0], &[]).status,
        ScsiStatus::Good
    );

    let ro = target(512, false, true);
    assert_eq!(
        sense(&exec(&ro, N, &write10(0, 1, false), &[0u8; 512])),
        Some((7, 0x27, 0))
    );
    let r = exec(&ro, N, &[0x1a, 0, 0x3f, 0, 255, 0], &[]);
    assert_eq!(r.data_in[2] & 0x80, 0x80, "WP bit");
    assert_eq!(
        sense(&exec(&ro, N, &[0x1b, 0, 0, 0, 0x02, 0], &[])),
        Some((5, 0x24, 0))
    );
}

#[test]
fn verify_reports_the_first_miscompare() {
    let t = target(512, false, false);
    exec(&t, N, &write10(10, 2, false), &[9u8; 1024]);
    let mut data = vec![9u8; 1024];
    let mut c = read10(10, 2);
    c[0] = 0x2f;
    c[1] = 0x02; // BYTCHK=1
    assert_eq!(exec(&t, N, &c, &data).status, ScsiStatus::Good);
    data[700] = 1;
    let r = exec(&t, N, &c, &data);
    assert_eq!(sense(&r), Some((0xe, 0x1d, 0)));
    assert_eq!(u32::from_be_bytes(r.sense[3..7].try_into().unwrap()), 700);
}

#[test]
fn resets_raise_unit_attentions() {
    let t = target(512, false, false);
    t.reset(ResetKind::LogicalUnit, Some(0), N);
    assert_eq!(
        sense(&exec(&t, OTHER, &[0, 0, 0, 0, 0, 0], &[])),
        Some((6, 0x29, 3))
    );
    assert_eq!(
        exec(&t, N, &[0x12, 0, 0, 0, 36, 0], &[]).status,
        ScsiStatus::Good
    );
    let r = exec(&t, N, &[0x03, 0, 0, 0, 18, 0], &[]);
    assert_eq!((r.data_in[2], r.data_in[12], r.data_in[13]), (6, 0x29, 3));
    assert_eq!(
        exec(&t, N, &[0, 0, 0, 0, 0, 0], &[]).status,
        ScsiStatus::Good
    );
}

#[test]
fn report_supported_opcodes_comes_from_the_table() {
    let t = target(512, false, false);
    let r = exec(&t, N, &[0xa3, 0x0c, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0], &[]);
    let len = u32::from_be_bytes(r.data_in[0..4].try_into().unwrap()) as usize;
    assert_eq!(len, ethersan_scsi::commands::COMMANDS.len() * 8);
    let r = exec(
        &t,
        N,
        &[0xa3, 0x0c, 0x01, 0x28, 0, 0, 0, 0, 1, 0, 0, 0],
        &[],
    );
    assert_eq!(r.data_in[1] & 0x07, 0x03);
    assert_eq!(&r.data_in[4..6], &[0x28, 0xfe]);
    assert_eq!(
        sense(&exec(
            &t,
            N,
            &[0xa3, 0x0c, 0x01, 0x9e, 0, 0, 0, 0, 1, 0, 0, 0],
            &[]
        )),
        Some((5, 0x24, 0))
    );
}

proptest! {
    #[test]
    fn random_cdbs_never_panic(cdb in proptest::collection::vec(any::<u8>(), 1..17), data in proptest::collection::vec(any::<u8>(), 0..2048), lun in 0u64..3) {
        let t = target(512, true, false);
        let r = execute(&t, &ScsiRequest { nexus: N, lun, cdb: &cdb, data_out: &data, expected_len: data.len() as u32 });
        if r.status == ScsiStatus::CheckCondition {
            prop_assert!(!r.sense.is_empty());
        }
    }
}

#[test]
fn thin_provisioning_on_a_sparse_file() {
    use ethersan_backend::file::{FileDevice, FileOptions};
    let dir = tempfile::tempdir().unwrap();
    let dev = FileDevice::open(
        &dir.path().join("thin.img"),
        &FileOptions {
            size: Some(8 << 20),
            block_size: 512,
            read_only: false,
            preallocate: false,
            direct: false,
            engine: Default::default(),
        },
    )
    .unwrap();
    let t = ScsiTarget::new(vec![Arc::new(LogicalUnit::new(
        Arc::new(dev),
        cfg(false, false),
    ))]);
    t.nexus_added(N);
    exec(&t, N, &[0, 0, 0, 0, 0, 0], &[]);
    let get_lba_status = |lba: u64| {
        let mut c = [0u8; 16];
        c[0] = 0x9e;
        c[1] = 0x12;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[13] = 24;
        let r = exec(&t, N, &c, &[]);
        assert_eq!(r.status, ScsiStatus::Good, "{:?}", sense(&r));
        let d = &r.data_in[8..24];
        (
            u64::from_be_bytes(d[0..8].try_into().unwrap()),
            u32::from_be_bytes(d[8..12].try_into().unwrap()),
            d[12],
        )
    };
    // A fresh sparse file is deallocated throughout.
    assert_eq!(get_lba_status(0).2, 1);
    exec(&t, N, &write10(0, 264, false), &vec![b'A'; 264 * 512]);
    assert_eq!(get_lba_status(0), (0, 264, 0));
    // UNMAP 8 blocks (one 4 KiB page) at LBA 0.
    let mut param = vec![0u8, 22, 0, 16, 0, 0, 0, 0];
    param.extend_from_slice(&0u64.to_be_bytes());
    param.extend_from_slice(&8u32.to_be_bytes());
    param.extend_from_slice(&[0; 4]);
    let r = exec(&t, N, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &param);
    assert_eq!(r.status, ScsiStatus::Good, "{:?}", sense(&r));
    assert_eq!(get_lba_status(0), (0, 8, 1));
    let (lba, _, status) = get_lba_status(9);
    assert_eq!((lba, status), (9, 0));
    // Unmapped blocks read as zeros (LBPRZ).
    assert!(exec(&t, N, &read10(0, 8), &[])
        .data_in
        .iter()
        .all(|b| *b == 0));
    // WRITE SAME with UNMAP deallocates too.
    let mut ws = [0u8; 10];
    ws[0] = 0x41;
    ws[1] = 0x08;
    ws[5] = 16;
    ws[8] = 8;
    assert_eq!(exec(&t, N, &ws, &[0u8; 512]).status, ScsiStatus::Good);
    assert_eq!(get_lba_status(16), (16, 8, 1));
}

/// An EXTENDED COPY parameter list: one identification target descriptor
/// per NAA given, one block-to-block segment from target 0 to target 1.
fn xcopy_params(naas: &[[u8; 16]], blocks: u16, src_lba: u64, dst_lba: u64) -> Vec<u8> {
    let mut p = vec![0u8; 16];
    p[0] = 7; // list id
    p[2..4].copy_from_slice(&((naas.len() * 32) as u16).to_be_bytes());
    p[8..12].copy_from_slice(&28u32.to_be_bytes());
    for naa in naas {
        let mut d = vec![0u8; 32];
        d[0] = 0xe4;
        d[4] = 0x01; // binary
        d[5] = 0x03; // NAA, logical unit
        d[7] = 16;
        d[8..24].copy_from_slice(naa);
        d[29..32].copy_from_slice(&512u32.to_be_bytes()[1..]);
        p.extend(d);
    }
    let mut s = vec![0u8; 28];
    s[0] = 0x02;
    s[2..4].copy_from_slice(&24u16.to_be_bytes());
    s[4..6].copy_from_slice(&0u16.to_be_bytes());
    s[6..8].copy_from_slice(&((naas.len() - 1) as u16).to_be_bytes());
    s[10..12].copy_from_slice(&blocks.to_be_bytes());
    s[12..20].copy_from_slice(&src_lba.to_be_bytes());
    s[20..28].copy_from_slice(&dst_lba.to_be_bytes());
    p.extend(s);
    p
}

fn lu_with_naa(last: u8) -> (Arc<LogicalUnit>, [u8; 16]) {
    let mut c = cfg(false, false);
    c.naa[15] = last;
    let naa = c.naa;
    (
        Arc::new(LogicalUnit::new(
            Arc::new(RamDevice::new(1 << 20, 512).unwrap()),
            c,
        )),
        naa,
    )
}

#[test]
fn extended_copy_between_luns_of_one_target_only() {
    let (a, naa_a) = lu_with_naa(1);
    let (b, naa_b) = lu_with_naa(2);
    let (foreign, naa_foreign) = lu_with_naa(3);
    let t = ScsiTarget::new(vec![a, b]);
    let other_target = ScsiTarget::new(vec![foreign]);
    for lun in 0..2 {
        t.nexus_added(N);
        execute(
            &t,
            &ScsiRequest {
                nexus: N,
                lun,
                cdb: &[0, 0, 0, 0, 0, 0],
                data_out: &[],
                expected_len: 0,
            },
        );
    }
    other_target.nexus_added(N);
    exec(&t, N, &write10(0, 4, false), &[0x5a; 2048]);
    let xcopy = |t: &ScsiTarget, params: &[u8]| {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x83;
        cdb[10..14].copy_from_slice(&(params.len() as u32).to_be_bytes());
        execute(
            t,
            &ScsiRequest {
                nexus: N,
                lun: 0,
                cdb: &cdb,
                data_out: params,
                expected_len: params.len() as u32,
            },
        )
    };
    // LUN 0 -> LUN 1 of the same target.
    let r = xcopy(&t, &xcopy_params(&[naa_a, naa_b], 4, 0, 10));
    assert_eq!(r.status, ScsiStatus::Good, "{:?}", sense(&r));
    let r = execute(
        &t,
        &ScsiRequest {
            nexus: N,
            lun: 1,
            cdb: &read10(10, 4),
            data_out: &[],
            expected_len: 2048,
        },
    );
    assert!(r.data_in.iter().all(|b| *b == 0x5a));
    // RECEIVE COPY RESULTS reports it.
    let r = exec(
        &t,
        N,
        &[0x84, 0x00, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0],
        &[],
    );
    assert_eq!(
        (
            r.data_in[4],
            u16::from_be_bytes([r.data_in[5], r.data_in[6]])
        ),
        (0, 1)
    );
    // A unit of another target cannot be named: COPY ABORTED, nothing written.
    let r = xcopy(&t, &xcopy_params(&[naa_a, naa_foreign], 4, 0, 0));
    assert_eq!(sense(&r), Some((0x0a, 0x0d, 0x02)));
    let r = execute(
        &other_target,
        &ScsiRequest {
            nexus: N,
            lun: 0,
            cdb: &read10(0, 4),
            data_out: &[],
            expected_len: 2048,
        },
    );
    assert!(r.data_in.iter().all(|b| *b == 0), "foreign LUN was written");
    // Malformed lists get the standard sense.
    let mut bad = xcopy_params(&[naa_a, naa_b], 4, 0, 10);
    bad[16] = 0xe5;
    assert_eq!(sense(&xcopy(&t, &bad)), Some((5, 0x26, 0x07)));
    let p = xcopy_params(&[naa_a, naa_b], 4, 0, 10);
    assert_eq!(sense(&xcopy(&t, &p[..40])), Some((5, 0x1a, 0)));
}

#[test]
fn extended_copy_obeys_the_destinations_reservation() {
    let (a, naa_a) = lu_with_naa(1);
    let (b, naa_b) = lu_with_naa(2);
    let t = ScsiTarget::new(vec![a, b]);
    let on = |nexus: Nexus, lun: u64, cdb: &[u8], data: &[u8]| {
        execute(
            &t,
            &ScsiRequest {
                nexus,
                lun,
                cdb,
                data_out: data,
                expected_len: 1 << 20,
            },
        )
    };
    for nexus in [N, OTHER] {
        t.nexus_added(nexus);
        for lun in 0..2 {
            on(nexus, lun, &[0, 0, 0, 0, 0, 0], &[]);
        }
    }
    on(N, 0, &write10(0, 4, false), &[0x5a; 2048]);
    // OTHER registers on LUN 1 and reserves it Write Exclusive.
    let pr_out = |action: u8, kind: u8, key: u64, new_key: u64| {
        let cdb = [0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0];
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&new_key.to_be_bytes());
        on(OTHER, 1, &cdb, &p)
    };
    assert_eq!(pr_out(0x00, 0, 0, 0xabc).status, ScsiStatus::Good);
    assert_eq!(pr_out(0x01, 0x01, 0xabc, 0).status, ScsiStatus::Good);
    // N's WRITE to LUN 1 conflicts; so does N's copy into it, which writes
    // nothing.
    assert_eq!(
        on(N, 1, &write10(10, 4, false), &[0x77; 2048]).status,
        ScsiStatus::ReservationConflict
    );
    let mut cdb = [0u8; 16];
    cdb[0] = 0x83;
    let params = xcopy_params(&[naa_a, naa_b], 4, 0, 10);
    cdb[10..14].copy_from_slice(&(params.len() as u32).to_be_bytes());
    let r = on(N, 0, &cdb, &params);
    assert_eq!(sense(&r).map(|s| s.0), Some(0x0a), "{:?}", r.status);
    let r = on(OTHER, 1, &read10(10, 4), &[]);
    assert!(
        r.data_in.iter().all(|b| *b == 0),
        "the reserved LUN was written"
    );
    // The holder of the reservation may copy into it.
    let r = on(OTHER, 0, &cdb, &params);
    assert_eq!(r.status, ScsiStatus::Good, "{:?}", sense(&r));
    let r = on(OTHER, 1, &read10(10, 4), &[]);
    assert!(r.data_in.iter().all(|b| *b == 0x5a));
}

/// A device whose blocks from `bad_from` on fail with EIO, whether the
/// request comes through `submit` or the blocking conveniences.
#[derive(Debug)]
struct Failing {
    inner: RamDevice,
    bad_from: u64,
}

impl Failing {
    fn check(&self, offset: u64, write: bool) -> Result<(), BackendError> {
        if offset + 512 > self.bad_from * 512 {
            let source = std::io::Error::from_raw_os_error(5);
            return Err(if write {
                BackendError::Write {
                    offset,
                    cause: source,
                }
            } else {
                BackendError::Read {
                    offset,
                    cause: source,
                }
            });
        }
        Ok(())
    }
}

impl BlockDevice for Failing {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn submit(&self, req: IoRequest, done: IoCompletion) -> Submission {
        let failed: Option<IoResult> = match &req {
            IoRequest::Read { offset, len, .. } => {
                self.check(offset + *len as u64 - 512, false).err().map(Err)
            }
            IoRequest::Write { offset, len, .. } => {
                self.check(offset + *len as u64 - 512, true).err().map(Err)
            }
            IoRequest::Flush => None,
        };
        match failed {
            Some(r) => Submission::Done(r),
            None => self.inner.submit(req, done),
        }
    }
    fn describe(&self) -> String {
        "failing".into()
    }
}

#[test]
fn backend_errors_become_medium_errors_and_other_luns_keep_serving() {
    let bad = Arc::new(Failing {
        inner: RamDevice::new(1 << 20, 512).unwrap(),
        bad_from: 100,
    });
    let good = Arc::new(RamDevice::new(1 << 20, 512).unwrap());
    let t = ScsiTarget::new(vec![
        Arc::new(LogicalUnit::new(bad, cfg(false, false))),
        Arc::new(LogicalUnit::new(good, cfg(false, false))),
    ]);
    t.nexus_added(N);
    let run = |lun: u64, cdb: &[u8], data: &[u8], nowait: bool| {
        let req = ScsiRequest {
            nexus: N,
            lun,
            cdb,
            data_out: data,
            expected_len: 1 << 16,
        };
        if nowait {
            submit(&t, &req, None)
        } else {
            execute(&t, &req)
        }
    };
    for lun in [0, 1] {
        run(lun, &[0, 0, 0, 0, 0, 0], &[], false);
    }
    for nowait in [false, true] {
        // Healthy blocks work; failing ones report MEDIUM ERROR with the
        // unrecovered read / write error codes.
        assert_eq!(
            run(0, &write10(10, 1, false), &[7u8; 512], nowait).status,
            ScsiStatus::Good
        );
        assert_eq!(
            sense(&run(0, &read10(100, 1), &[], nowait)),
            Some((3, 0x11, 0))
        );
        assert_eq!(
            sense(&run(0, &write10(120, 2, false), &[1u8; 1024], nowait)),
            Some((3, 0x0c, 0))
        );
        // The other LUN and the healthy range keep serving.
        assert_eq!(
            run(1, &write10(100, 1, false), &[9u8; 512], nowait).status,
            ScsiStatus::Good
        );
        let r = run(1, &read10(100, 1), &[], nowait);
        assert!(r.status == ScsiStatus::Good && r.data_in == vec![9u8; 512]);
        let r = run(0, &read10(10, 1), &[], nowait);
        assert!(r.status == ScsiStatus::Good && r.data_in == vec![7u8; 512]);
    }
}

#[test]
fn a_masked_lun_is_invisible_and_out_of_reach_of_extended_copy() {
    let (a, naa_a) = lu_with_naa(1);
    let (b, naa_b) = lu_with_naa(2);
    let t = ScsiTarget::new(vec![a, b]);
    // LUN 1 is visible to "alice" only; "bob" is the masked initiator.
    t.set_policy(
        1,
        ethersan_scsi::LunPolicy {
            visible_to: vec!["alice".into()],
            read_only_for: vec![],
            ..Default::default()
        },
    )
    .unwrap();
    t.nexus_added(N);
    let run = |lun: u64, cdb: &[u8], data: &[u8], masked: bool| {
        let req = ScsiRequest {
            nexus: N,
            lun,
            cdb,
            data_out: data,
            expected_len: 4096,
        };
        if masked {
            submit(&t, &req, Some("bob"))
        } else {
            execute(&t, &req)
        }
    };
    for lun in 0..2 {
        run(lun, &[0; 6], &[], false);
    }
    // LUN 1 holds data the masked initiator must not reach.
    assert_eq!(
        run(1, &write10(0, 4, false), &[0x77; 2048], false).status,
        ScsiStatus::Good
    );
    // REPORT LUNS under the mask lists LUN 0 only.
    let r = run(0, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0], &[], true);
    assert_eq!(r.status, ScsiStatus::Good);
    assert_eq!(&r.data_in[0..4], &8u32.to_be_bytes(), "one LUN listed");
    // Commands to LUN 1 answer as for a LUN that does not exist.
    assert_eq!(sense(&run(1, &read10(0, 1), &[], true)), Some((5, 0x25, 0)));
    assert_eq!(
        sense(&run(1, &write10(0, 1, false), &[1; 512], true)),
        Some((5, 0x25, 0))
    );
    let inq = run(1, &[0x12, 0, 0, 0, 96, 0], &[], true);
    assert_eq!(inq.data_in[0] >> 5, 3, "peripheral qualifier 011b");
    // EXTENDED COPY from LUN 1 to LUN 0 through the visible LUN 0 fails, and
    // nothing of LUN 1 lands on LUN 0.
    let params = xcopy_params(&[naa_b, naa_a], 4, 0, 0);
    let mut cdb = [0u8; 16];
    cdb[0] = 0x83;
    cdb[10..14].copy_from_slice(&(params.len() as u32).to_be_bytes());
    let r = run(0, &cdb, &params, true);
    assert_eq!(
        r.status,
        ScsiStatus::CheckCondition,
        "a copy reached a masked LUN"
    );
    let r = run(0, &read10(0, 4), &[], true);
    assert!(
        r.status == ScsiStatus::Good && r.data_in.iter().all(|b| *b == 0),
        "masked data copied"
    );
    // Without the mask the same copy works.
    assert_eq!(run(0, &cdb, &params, false).status, ScsiStatus::Good);
}

#[test]
fn a_lun_read_only_for_one_initiator() {
    let (a, _) = lu_with_naa(1);
    let t = ScsiTarget::new(vec![a]);
    // Read-only for "bob".
    t.set_policy(
        0,
        ethersan_scsi::LunPolicy {
            visible_to: vec![],
            read_only_for: vec!["bob".into()],
            ..Default::default()
        },
    )
    .unwrap();
    t.nexus_added(N);
    let ro = "bob";
    let run = |cdb: &[u8], data: &[u8], read_only: Option<&str>| {
        let req = ScsiRequest {
            nexus: N,
            lun: 0,
            cdb,
            data_out: data,
            expected_len: 4096,
        };
        submit(&t, &req, read_only)
    };
    run(&[0; 6], &[], None);
    assert_eq!(
        run(&write10(0, 1, false), &[5; 512], None).status,
        ScsiStatus::Good
    );
    assert_eq!(
        sense(&run(&write10(0, 1, false), &[6; 512], Some(ro))),
        Some((7, 0x27, 0))
    );
    let r = run(&read10(0, 1), &[], Some(ro));
    assert!(
        r.status == ScsiStatus::Good && r.data_in == vec![5u8; 512],
        "reads still work, the write did not land"
    );
}

/// SANITIZE OVERWRITE of a whole RAM LU with `cfg`, without IMMED: the
/// time it took, and the LU (to read back).
fn timed_overwrite(bytes: u64, cfg: LuConfig) -> (std::time::Duration, ScsiTarget) {
    let dev = Arc::new(RamDevice::new(bytes, 512).unwrap());
    let t = ScsiTarget::new(vec![Arc::new(LogicalUnit::new(dev, cfg))]);
    t.nexus_added(N);
    assert_eq!(sense(&exec(&t, N, &[0; 6], &[])), Some((6, 0x29, 0)));
    let param = [0x01, 0, 0, 4, 0xde, 0xad, 0xbe, 0xef];
    let cdb = [0x48, 0x01, 0, 0, 0, 0, 0, 0, 8, 0];
    let start = std::time::Instant::now();
    let r = exec(&t, N, &cdb, &param);
    assert_eq!(r.status, ScsiStatus::Good, "{:?}", sense(&r));
    (start.elapsed(), t)
}

#[test]
fn sanitize_overwrite_runs_at_device_speed_unless_a_rate_is_set() {
    // 256 MiB: 16 s at the old fixed 16 MiB/s cap; RAM takes well under a
    // second (the bound is generous for a loaded machine).
    let (took, t) = timed_overwrite(256 << 20, cfg(false, false));
    assert!(
        took < std::time::Duration::from_secs(10),
        "256 MiB overwrite took {took:?}"
    );
    let last = (256 << 20) / 512 - 1;
    for lba in [0, last] {
        let r = exec(&t, N, &read10(lba, 1), &[]);
        assert_eq!(r.status, ScsiStatus::Good);
        assert!(
            r.data_in.chunks(4).all(|c| c == [0xde, 0xad, 0xbe, 0xef]),
            "LBA {lba}"
        );
    }
    // With sanitize_rate the same work is paced: 4 MiB at 16 MiB/s takes
    // at least a quarter of a second.
    let limited = LuConfig {
        sanitize_rate: Some(16 << 20),
        ..cfg(false, false)
    };
    let (took, _) = timed_overwrite(4 << 20, limited);
    assert!(
        took >= std::time::Duration::from_millis(240),
        "paced overwrite took {took:?}"
    );
}
