//! The iSCSI protocol core (RFC 7143), free of I/O.
//!
//! Bytes go in, typed PDUs and decisions come out: the same code is driven
//! by the tokio server, by the initiator library and by in-memory tests.
//!
//! - [`pdu`]: Basic Header Segment codec, typed PDUs, the Extended CDB AHS
//!   and [`pdu::Framer`], the one framer of the server and the initiator (§11).
//! - [`digest`]: CRC32C header and data digests (§11.1, Appendix B).
//! - [`text`]: key=value text encoding (§6.1).
//! - [`negotiate`]: login/text key negotiation (§6.2, §13).
//! - [`seq`]: serial-number arithmetic and the CmdSN window (§4.2.2).
//! - [`transfer`]: R2T / Data-Out / Data-In bookkeeping for one command.
#![warn(missing_docs, unreachable_pub)]

pub mod chap;
pub mod digest;
pub mod negotiate;
pub mod pdu;
pub mod seq;
pub mod text;
pub mod transfer;
