//! The PDU decoder on arbitrary headers: never a panic, and whatever
//! decodes encodes back to a header that decodes to the same PDU.
#![no_main]

use ethersan_proto::pdu::{Bhs, Pdu, BHS_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
