//! Tag-length-value attributes (RFC 4171 §5.5) and the tags of §6.

use std::net::{IpAddr, Ipv6Addr};

use crate::IsnsError;

/// Attribute tags (RFC 4171 §6.1) used by an iSCSI target.
pub mod tag {
    /// Separates the message key from the operating attributes (§5.6.1).
    pub const DELIMITER: u32 = 0;
    /// Entity Identifier (EID), a string.
    pub const ENTITY_IDENTIFIER: u32 = 1;
    /// Entity Protocol, a 32-bit value ([`super::ENTITY_PROTOCOL_ISCSI`]).
    pub const ENTITY_PROTOCOL: u32 = 2;
    /// Registration Period in seconds.
    pub const REGISTRATION_PERIOD: u32 = 6;
    /// Entity Index.
    pub const ENTITY_INDEX: u32 = 7;
    /// Portal IP Address, 16 bytes (IPv4 as IPv4-mapped IPv6).
    pub const PORTAL_IP_ADDRESS: u32 = 16;
    /// Portal TCP/UDP Port.
    pub const PORTAL_PORT: u32 = 17;
    /// Portal Symbolic Name.
    pub const PORTAL_SYMBOLIC_NAME: u32 = 18;
    /// ESI Interval.
    pub const ESI_INTERVAL: u32 = 19;
    /// ESI Port.
    pub const ESI_PORT: u32 = 20;
    /// SCN Port.
    pub const SCN_PORT: u32 = 23;
    /// iSCSI Name.
    pub const ISCSI_NAME: u32 = 32;
    /// iSCSI Node Type ([`super::NODE_TYPE_TARGET`], …).
    pub const ISCSI_NODE_TYPE: u32 = 33;
    /// iSCSI Alias.
    pub const ISCSI_ALIAS: u32 = 34;
    /// iSCSI SCN Bitmap.
    pub const ISCSI_SCN_BITMAP: u32 = 35;
    /// iSCSI Node Index.
    pub const ISCSI_NODE_INDEX: u32 = 36;
    /// PG iSCSI Name.
    pub const PG_ISCSI_NAME: u32 = 48;
    /// PG Portal IP Address.
    pub const PG_PORTAL_IP_ADDRESS: u32 = 49;
    /// PG Portal TCP/UDP Port.
    pub const PG_PORTAL_PORT: u32 = 50;
    /// Portal Group Tag.
    pub const PG_TAG: u32 = 51;
    /// Discovery Domain ID.
    pub const DD_ID: u32 = 2065;
    /// Discovery Domain Symbolic Name.
    pub const DD_SYMBOLIC_NAME: u32 = 2066;
    /// DD Member iSCSI Index.
    pub const DD_MEMBER_ISCSI_INDEX: u32 = 2067;
    /// DD Member iSCSI Name.
    pub const DD_MEMBER_ISCSI_NAME: u32 = 2068;
}

/// Entity Protocol value of iSCSI.
pub const ENTITY_PROTOCOL_ISCSI: u32 = 2;
/// iSCSI Node Type bit: target.
pub const NODE_TYPE_TARGET: u32 = 1;
/// iSCSI Node Type bit: initiator.
pub const NODE_TYPE_INITIATOR: u32 = 2;
/// iSCSI Node Type bit: control node.
pub const NODE_TYPE_CONTROL: u32 = 4;

/// One attribute: a tag and its value, whose length is a multiple of 4.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribute {
    /// The tag (see [`tag`]).
    pub tag: u32,
    /// The value, padded to a multiple of 4 bytes.
    pub value: Vec<u8>,
}

impl Attribute {
    /// A string attribute: UTF-8, NUL-terminated, padded with NULs to a
    /// multiple of 4 bytes (§5.5.1).
    pub fn string(tag: u32, s: &str) -> Attribute {
        let mut value = s.as_bytes().to_vec();
        value.push(0);
        while !value.len().is_multiple_of(4) {
            value.push(0);
        }
        Attribute { tag, value }
    }

    /// A 32-bit unsigned attribute.
    pub fn u32(tag: u32, v: u32) -> Attribute {
        Attribute {
            tag,
            value: v.to_be_bytes().to_vec(),
        }
    }

    /// An IP address attribute: 16 bytes, IPv4 as IPv4-mapped IPv6.
    pub fn ip(tag: u32, ip: IpAddr) -> Attribute {
        let v6 = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        Attribute {
            tag,
            value: v6.octets().to_vec(),
        }
    }

    /// A TCP port attribute (the UDP bit clear, §6.3.2).
    pub fn tcp_port(tag: u32, port: u16) -> Attribute {
        Attribute::u32(tag, u32::from(port))
    }

    /// An attribute with no value (a delimiter, or a query's wanted
    /// attribute).
    pub fn empty(tag: u32) -> Attribute {
        Attribute {
            tag,
            value: Vec::new(),
        }
    }

    /// The delimiter between message key and operating attributes.
    pub fn delimiter() -> Attribute {
        Attribute::empty(tag::DELIMITER)
    }

    /// The value as a 32-bit unsigned integer, if it is 4 bytes.
    pub fn as_u32(&self) -> Option<u32> {
        let b: [u8; 4] = self.value.as_slice().try_into().ok()?;
        Some(u32::from_be_bytes(b))
    }

    /// The value as a string (up to its first NUL), if it is UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        let end = self
            .value
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(self.value.len());
        std::str::from_utf8(&self.value[..end]).ok()
    }

    /// The value as an IP address, if it is 16 bytes; IPv4-mapped
    /// addresses come back as IPv4.
    pub fn as_ip(&self) -> Option<IpAddr> {
        let b: [u8; 16] = self.value.as_slice().try_into().ok()?;
        let v6 = Ipv6Addr::from(b);
        Some(match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        })
    }

    /// The value as a port (the low 16 bits), if it is 4 bytes.
    pub fn as_port(&self) -> Option<u16> {
        self.as_u32().map(|v| (v & 0xffff) as u16)
    }

    /// Append the encoded attribute (tag, length, value; the value padded
    /// to a multiple of 4).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let padded = self.value.len().div_ceil(4) * 4;
        out.extend_from_slice(&self.tag.to_be_bytes());
        out.extend_from_slice(&(padded as u32).to_be_bytes());
        out.extend_from_slice(&self.value);
        out.resize(out.len() + (padded - self.value.len()), 0);
    }
}

/// Encode attributes one after another.
pub fn encode_all(attrs: &[Attribute]) -> Vec<u8> {
    let mut out = Vec::new();
    for a in attrs {
        a.encode_into(&mut out);
    }
    out
}

/// Decode a sequence of attributes filling `bytes` exactly.
pub fn decode_all(bytes: &[u8]) -> Result<Vec<Attribute>, IsnsError> {
    let mut attrs = Vec::new();
    let mut off = 0;
    while off < bytes.len() {
        let Some(head) = bytes.get(off..off + 8) else {
            let tag = bytes
                .get(off..off + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                .unwrap_or(0);
            return Err(IsnsError::AttributeOverrun { tag, offset: off });
        };
        let tag = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let len = u32::from_be_bytes([head[4], head[5], head[6], head[7]]) as usize;
        if !len.is_multiple_of(4) {
            return Err(IsnsError::UnalignedAttribute { tag, len });
        }
        let start = off + 8;
        let value = start
            .checked_add(len)
            .and_then(|end| bytes.get(start..end))
            .ok_or(IsnsError::AttributeOverrun { tag, offset: off })?;
        attrs.push(Attribute {
            tag,
            value: value.to_vec(),
        });
        off = start + len;
    }
    Ok(attrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_nul_terminated_and_padded() {
        let a = Attribute::string(tag::ISCSI_NAME, "abc");
        assert_eq!(a.value, b"abc\0");
        let a = Attribute::string(tag::ISCSI_NAME, "abcd");
        assert_eq!(a.value, b"abcd\0\0\0\0");
        assert_eq!(a.as_str(), Some("abcd"));
        let enc = encode_all(std::slice::from_ref(&a));
        assert_eq!(&enc[..8], &[0, 0, 0, 32, 0, 0, 0, 8]);
        assert_eq!(decode_all(&enc).unwrap(), vec![a]);
    }

    #[test]
    fn addresses_and_ports() {
        let a = Attribute::ip(tag::PORTAL_IP_ADDRESS, "10.0.2.2".parse().unwrap());
        assert_eq!(a.value[10..12], [0xff, 0xff]);
        assert_eq!(a.as_ip(), Some("10.0.2.2".parse().unwrap()));
        let a = Attribute::ip(tag::PORTAL_IP_ADDRESS, "fe80::1".parse().unwrap());
        assert_eq!(a.as_ip(), Some("fe80::1".parse().unwrap()));
        assert_eq!(
            Attribute::tcp_port(tag::PORTAL_PORT, 3260).as_port(),
            Some(3260)
        );
        assert_eq!(Attribute::string(1, "x").as_ip(), None);
        assert_eq!(Attribute::string(1, "x").as_u32(), Some(0x7800_0000));
    }

    #[test]
    fn malformed_attributes_are_errors() {
        // Header cut.
        assert!(matches!(
            decode_all(&[0, 0, 0, 1, 0]),
            Err(IsnsError::AttributeOverrun { tag: 1, offset: 0 })
        ));
        // Unaligned length.
        assert!(matches!(
            decode_all(&[0, 0, 0, 1, 0, 0, 0, 3, 1, 2, 3, 0]),
            Err(IsnsError::UnalignedAttribute { tag: 1, len: 3 })
        ));
        // Value past the end, including a length near u32::MAX.
        assert!(matches!(
            decode_all(&[0, 0, 0, 1, 0, 0, 0, 8, 1, 2, 3, 4]),
            Err(IsnsError::AttributeOverrun { .. })
        ));
        assert!(matches!(
            decode_all(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xfc]),
            Err(IsnsError::AttributeOverrun { .. })
        ));
        // Invalid UTF-8 is not a string.
        let bad = Attribute {
            tag: 32,
            value: vec![0xff, 0xfe, 0, 0],
        };
        assert_eq!(bad.as_str(), None);
    }
}
