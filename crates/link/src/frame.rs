//! Ethernet II framing (IEEE 802.3 clause 3.2 with an EtherType): the
//! 14-byte header, and the receive filter every link applies.

use crate::MacAddr;

/// Bytes in an Ethernet header: destination, source, EtherType.
pub const HEADER_LEN: usize = 14;
/// The shortest frame on the wire without its FCS; a real NIC pads shorter
/// frames, a veth or a unix socket does not, so senders pad if they care.
pub const MIN_FRAME_LEN: usize = 60;
/// EtherType of ATA over Ethernet.
pub const ETHERTYPE_AOE: u16 = 0x88a2;
/// The standard Ethernet MTU.
pub const DEFAULT_MTU: usize = 1500;
/// The largest MTU a link accepts (jumbo frames).
pub const MAX_MTU: usize = 9216;

/// The header of an Ethernet II frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetHeader {
    /// Destination address.
    pub dst: MacAddr,
    /// Source address.
    pub src: MacAddr,
    /// EtherType (host order).
    pub ethertype: u16,
}

impl EthernetHeader {
    /// Reads the header at the start of `frame`, or `None` if it is shorter
    /// than [`HEADER_LEN`].
    pub fn parse(frame: &[u8]) -> Option<EthernetHeader> {
        let h: &[u8; HEADER_LEN] = frame.get(..HEADER_LEN)?.try_into().ok()?;
        let mac =
            |at: usize| MacAddr([h[at], h[at + 1], h[at + 2], h[at + 3], h[at + 4], h[at + 5]]);
        Some(EthernetHeader {
            dst: mac(0),
            src: mac(6),
            ethertype: u16::from_be_bytes([h[12], h[13]]),
        })
    }

    /// The header as it goes on the wire.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..6].copy_from_slice(&self.dst.0);
        b[6..12].copy_from_slice(&self.src.0);
        b[12..].copy_from_slice(&self.ethertype.to_be_bytes());
        b
    }
}

/// What a link lets through to its caller: frames of one EtherType sent to
/// its own address or to broadcast, and to any multicast address if asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxFilter {
    /// Our address.
    pub mac: MacAddr,
    /// The EtherType the link was opened for.
    pub ethertype: u16,
    /// Whether multicast (group) destinations other than broadcast pass.
    pub multicast: bool,
}

impl RxFilter {
    /// Whether `frame` passes: long enough for a header, of our EtherType,
    /// and addressed to us, to broadcast, or (if enabled) to a multicast
    /// group.
    pub fn accepts(&self, frame: &[u8]) -> bool {
        let Some(h) = EthernetHeader::parse(frame) else {
            return false;
        };
        h.ethertype == self.ethertype
            && (h.dst == self.mac
                || h.dst.is_broadcast()
                || (self.multicast && h.dst.is_multicast()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = EthernetHeader {
            dst: MacAddr::BROADCAST,
            src: MacAddr([2, 0, 0, 0, 0, 1]),
            ethertype: ETHERTYPE_AOE,
        };
        let b = h.to_bytes();
        assert_eq!(&b[12..], &[0x88, 0xa2]);
        assert_eq!(EthernetHeader::parse(&b), Some(h));
        assert_eq!(EthernetHeader::parse(&b[..13]), None);
    }

    #[test]
    fn filter() {
        let me = MacAddr([2, 0, 0, 0, 0, 1]);
        let other = MacAddr([2, 0, 0, 0, 0, 2]);
        let group = MacAddr([1, 0, 0x5e, 0, 0, 1]);
        let f = RxFilter {
            mac: me,
            ethertype: ETHERTYPE_AOE,
            multicast: false,
        };
        let frame = |dst, ethertype| {
            EthernetHeader {
                dst,
                src: other,
                ethertype,
            }
            .to_bytes()
        };
        assert!(f.accepts(&frame(me, ETHERTYPE_AOE)));
        assert!(f.accepts(&frame(MacAddr::BROADCAST, ETHERTYPE_AOE)));
        assert!(!f.accepts(&frame(other, ETHERTYPE_AOE)));
        assert!(!f.accepts(&frame(me, 0x0800)));
        assert!(!f.accepts(&frame(group, ETHERTYPE_AOE)));
        assert!(RxFilter {
            multicast: true,
            ..f
        }
        .accepts(&frame(group, ETHERTYPE_AOE)));
        assert!(!f.accepts(&frame(me, ETHERTYPE_AOE)[..13]));
    }
}
