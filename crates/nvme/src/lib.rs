//! NVMe over TCP (NVMe-oF 1.1 with the TCP transport binding of TP 8000):
//! the target's protocol core, free of I/O.
//!
//! Bytes go in, events and bytes to send come out; time is an argument.
//!
//! - [`pdu`]: the NVMe/TCP PDUs and their codec (TP 8000 §7.4).
//! - [`digest`]: CRC32C header and data digests.
//! - [`sqe`] and [`cqe`]: submission and completion queue entries, SGLs.
//! - [`status`]: completion status codes.
//! - [`command`]: typed admin and I/O commands.
//! - [`fabrics`]: Connect and Property Get/Set.
//! - [`properties`]: the controller registers (CAP, VS, CC, CSTS).
//! - [`identify`] and [`log`]: Identify data and log pages.
//! - [`keepalive`]: the Keep Alive timer.
//! - [`queue`]: [`Queue`], the target side of one NVMe/TCP connection.
#![warn(missing_docs, unreachable_pub)]

pub mod command;
pub mod cqe;
pub mod digest;
pub mod fabrics;
pub mod identify;
pub mod keepalive;
pub mod log;
pub mod pdu;
pub mod properties;
pub mod queue;
pub mod sqe;
pub mod status;

#[cfg(test)]
mod proptests;

pub use cqe::Cqe;
pub use pdu::{decode, decode_head, Framing, Pdu, PduError};
pub use queue::{Event, Queue, QueueConfig};
pub use sqe::{Sgl, Sqe};
pub use status::Status;
