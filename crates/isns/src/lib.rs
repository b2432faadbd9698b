//! The Internet Storage Name Service protocol (iSNSP, RFC 4171) as far as
//! an iSCSI target needs it: the codec and message builders, free of I/O.
//!
//! - [`pdu`]: the 12-byte PDU header, flags, function IDs, encoding one
//!   message into PDUs and reassembling received PDUs into messages
//!   (§5.1).
//! - [`attr`]: tag-length-value attributes and the tags an iSCSI target
//!   registers (§5.5, §6).
//! - [`message`]: request builders (DevAttrReg, DevAttrQry, DevDereg,
//!   DDReg, DDDereg), response parsing, and the answers to the server's own
//!   requests (ESI, SCN) (§5.6, §5.7).
//! - [`IsnsError`] and [`Status`]: everything that can be wrong with what
//!   came from the network, and the server's status codes (§5.4).
//!
//! Every decoder takes untrusted bytes and returns an error for anything
//! malformed; none panics.
//!
//! ```
//! use ethersan_isns::{attr::Attribute, attr::tag, message, pdu};
//! let source = Attribute::string(tag::ISCSI_NAME, "iqn.2026-11.org.example:t0");
//! let req = message::dev_dereg(source, vec![Attribute::string(tag::ENTITY_IDENTIFIER, "host")]);
//! let bytes = req.encode(7);
//! let (header, _) = pdu::Header::decode(&bytes).unwrap();
//! assert_eq!(header.function, pdu::FunctionId::DevDereg as u16);
//! assert_eq!(header.transaction_id, 7);
//! ```

#![warn(missing_docs)]

pub mod attr;
pub mod message;
pub mod pdu;

mod error;

pub use error::{IsnsError, Status};

/// The IANA port of iSNS, TCP and UDP.
pub const DEFAULT_PORT: u16 = 3205;
