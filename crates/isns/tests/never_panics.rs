//! Arbitrary bytes from the network never make the decoders panic.

use ethersan_isns::attr::{self, Attribute};
use ethersan_isns::message::{self, Response};
use ethersan_isns::pdu::{Assembler, Pdu};
use proptest::prelude::*;

/// Feed bytes as a stream of PDUs, as the client does; stop at the first
/// error.
fn feed(bytes: &[u8]) {
    let mut asm = Assembler::new();
    let mut off = 0;
    while off < bytes.len() {
        let Ok((pdu, used)) = Pdu::decode(&bytes[off..]) else {
            return;
        };
        off += used;
        match asm.push(pdu) {
            Ok(Some(m)) => {
                let _ = message::from_server(&m);
                if let Ok(r) = Response::parse(&m) {
                    let _ = message::dd_id(&r.attributes);
                    let _ = message::registration_period(&r.attributes);
                    for a in &r.attributes {
                        let _ = (a.as_str(), a.as_ip(), a.as_u32(), a.as_port());
                    }
                }
            }
            Ok(None) => {}
            Err(_) => return,
        }
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        feed(&bytes);
        let _ = attr::decode_all(&bytes);
    }

    /// A valid header in front of arbitrary payloads reaches the attribute
    /// decoder.
    #[test]
    fn arbitrary_payloads(function in any::<u16>(), flags in any::<u16>(),
                          words in proptest::collection::vec(any::<u32>(), 0..64)) {
        let payload: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
        let mut b = vec![0, 1];
        b.extend_from_slice(&function.to_be_bytes());
        b.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&[0, 1, 0, 0]);
        b.extend_from_slice(&payload);
        feed(&b);
    }

    /// Attributes survive encoding and decoding.
    #[test]
    fn attributes_round_trip(items in proptest::collection::vec((any::<u32>(), "[a-z0-9.:-]{0,40}"), 0..16)) {
        let attrs: Vec<Attribute> = items.iter().map(|(t, s)| Attribute::string(*t, s)).collect();
        let back = attr::decode_all(&attr::encode_all(&attrs)).unwrap();
        prop_assert_eq!(&back, &attrs);
        for (a, (_, s)) in back.iter().zip(&items) {
            prop_assert_eq!(a.as_str(), Some(s.as_str()));
        }
    }
}
