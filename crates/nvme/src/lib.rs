//! NVMe over TCP (NVMe-oF 1.1 with the TCP transport binding of TP 8000):
//! the target's protocol core and the host's ([`host`]), free of I/O.
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
//! - [`host`]: [`host::Host`], the host side of one connection, the
//!   command builders a host needs and the parsers of what it reads back.
//!
//! # Driving it
//!
//! A front end owns one [`Queue`] per TCP connection and loops:
//!
//! ```text
//! read bytes into buf
//! while let Some(r) = queue.receive(&buf, now) {
//!     match r.event {
//!         Connected { .. }            -> nothing (ICResp is queued)
//!         Command { sqe, data }       -> parse with command::AdminCommand /
//!                                        IoCommand / fabrics::FabricsCommand,
//!                                        run it unless data is Awaiting
//!         Data { cid, offset, range, complete }
//!                                     -> copy buf[range] to the command's
//!                                        buffer at offset; run it if complete
//!         Failed { cid, status }      -> queue.complete(Completion::new(cid, status), &mut out)
//!         HostTerminated(_) | Fatal(_) -> send what poll_transmit gives, close
//!     }
//!     buf.drain(..r.consumed)
//! }
//! queue.poll_transmit(&mut out)   // ICResp, R2Ts, TermReq, self-answered commands
//! on completion: queue.complete(..) or, for a read, queue.c2h_data(..)
//!                (send each PDU head from Pdu::encode_head, then the data
//!                slice, then the digest) or queue.send_read(..)
//! on timer: queue.on_tick(now) at queue.poll_timeout()
//! ```
//!
//! Property Get/Set go to a [`properties::Properties`] per controller;
//! Identify and Get Log Page answers come from [`identify`] and [`log`].
#![warn(missing_docs, unreachable_pub)]

pub mod command;
pub mod cqe;
pub mod digest;
pub mod fabrics;
pub mod host;
pub mod identify;
pub mod keepalive;
pub mod log;
pub mod pdu;
pub mod properties;
mod put;
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
