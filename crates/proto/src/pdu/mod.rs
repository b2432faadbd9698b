//! RFC 7143 §11: the Basic Header Segment and typed PDUs.
//!
//! Framing works in two steps so a driver can read straight into its own
//! buffers: [`Bhs::layout`] tells from the 48-byte header how many AHS, digest
//! and data bytes follow; [`Pdu::decode`] turns a complete header into a
//! typed PDU. Encoding is the reverse: [`Pdu::encode`] fills a [`Bhs`] whose
//! data segment the caller sends after it.
//!
//! The module is split by seam: [`Bhs`] and its common fields, opcodes and
//! LUN encoding (`bhs`); the typed headers of initiator PDUs
//! (`initiator`) and target PDUs (`target`); the [`Pdu`] codec (`codec`);
//! whole-PDU framing on a byte stream, the [`Framer`] both the target and
//! the initiator use (`frame`); and the Extended CDB AHS (`ahs`). Everything is
//! re-exported here, so paths stay `ethersan_proto::pdu::*`.

mod ahs;
mod bhs;
mod codec;
mod frame;
mod initiator;
mod target;

pub use ahs::*;
pub use bhs::*;
pub use codec::*;
pub use frame::*;
pub use initiator::*;
pub use target::*;

#[cfg(test)]
mod tests;
