//! The PDU decoder on arbitrary headers: never a panic, and whatever
//! decodes encodes back to a header that decodes to the same PDU; the
//! framer and the Extended CDB AHS reader on the same bytes never panic.
#![no_main]

use ethersan_proto::pdu::{cdb_from_ahs, Bhs, Framer, Pdu, BHS_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for (hd, dd) in [(false, false), (true, true)] {
        let f = Framer {
            header_digest: hd,
            data_digest: dd,
            max_recv_data_segment_length: 1 << 16,
        };
        if let Ok(Some((_, used))) = f.decode(data) {
            assert!(used <= data.len(), "the framer used more bytes than it had");
        }
    }
    let _ = cdb_from_ahs(&[0; 16], data);
    if data.len() < BHS_LEN {
        return;
    }
    let mut bhs = Bhs::default();
    bhs.0.copy_from_slice(&data[..BHS_LEN]);
    for (hd, dd) in [(false, false), (true, true)] {
        let _ = bhs.layout(hd, dd);
    }
    let _ = bhs.verify_digest(&data[BHS_LEN..], [0; 4]);
    if let Ok(pdu) = Pdu::decode(&bhs) {
        let again = pdu.encode(bhs.data_len());
        let back = Pdu::decode(&again).expect("an encoded PDU decodes");
        assert_eq!(back, pdu, "encode/decode round trip");
    }
});
