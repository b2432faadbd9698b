//! ATA over Ethernet (AoE r11, protocol version 1, ethertype 0x88A2):
//! the protocol core, free of I/O.
//!
//! Frames go in as byte slices, decisions and frames to send come out; time
//! is an argument. The same code is driven by the server's AoE target, by
//! the client's AoE initiator and by in-memory tests.
//!
//! - [`frame`]: Ethernet and AoE headers, error codes, whole-frame decoding
//!   (§2).
//! - [`issue`]: the Issue ATA Command argument (§3.1).
//! - [`config`]: Query Config Information (§3.2).
//! - [`mask`]: MAC Mask List (§3.3).
//! - [`reserve`]: Reserve/Release (§3.4).
//! - [`ata`]: the ATA commands a target emulates and IDENTIFY DEVICE data.
//! - [`target`]: [`AoeTarget`], the per-device target logic.
//! - [`rtt`] and [`window`]: round-trip estimation and the send window.
//! - [`initiator`]: [`Initiator`], one client's state towards one device,
//!   and discovery helpers.
//!
//! # Driving it
//!
//! A target front end feeds every received frame to [`AoeTarget::handle`]
//! and acts on the [`Action`]: send the reply frames, or run the
//! [`IoRequest`] against the volume (a read straight into the buffer
//! [`Pending::prepare_read`] sizes, a write from `frame[data]`) and send
//! what [`Pending::complete`] builds; [`AoeTarget::poll_event`] says what to
//! persist. An initiator front end sends what [`Initiator::poll_transmit`]
//! yields, feeds received frames to [`Initiator::on_frame`], sleeps until
//! [`Initiator::poll_timeout`] and then calls [`Initiator::on_timeout`].
//! Both ends in one thread, with a `Vec<u8>` as the disk:
//!
//! ```
//! use std::time::Instant;
//! use ethersan_aoe::initiator::{discovery_frame, parse_config_response, AtaRequest};
//! use ethersan_aoe::{Action, AoeTarget, DeviceAddr, DeviceConfig, Initiator, InitiatorConfig};
//! use ethersan_aoe::{IoOp, Mac, TargetConfig};
//!
//! let (server, client) = (Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]));
//! let mut target = AoeTarget::new(TargetConfig::new(server, 1500));
//! target.add_device(DeviceAddr::new(1, 0), DeviceConfig::new(8))?;
//! let mut disk = vec![0u8; 8 * 512];
//!
//! // The target front end's handling of one received frame.
//! let mut serve = |target: &mut AoeTarget, frame: &[u8]| -> Vec<Vec<u8>> {
//!     match target.handle(frame) {
//!         Action::Drop(_) => vec![],
//!         Action::Reply(frames) => frames,
//!         Action::Io(io) => {
//!             let mut out = Vec::new();
//!             match io.op {
//!                 IoOp::Read { lba, .. } => {
//!                     let buf = io.pending.prepare_read(&mut out);
//!                     let at = lba as usize * 512;
//!                     buf.copy_from_slice(&disk[at..at + buf.len()]);
//!                 }
//!                 IoOp::Write { lba, data, .. } => {
//!                     let at = lba as usize * 512;
//!                     disk[at..at + data.len()].copy_from_slice(&frame[data]);
//!                 }
//!                 IoOp::Flush => {}
//!             }
//!             io.pending.complete(Ok(()), &mut out);
//!             vec![out]
//!         }
//!     }
//! };
//!
//! // The initiator: discover, then write two sectors and read them back.
//! let now = Instant::now();
//! let answer = serve(&mut target, &discovery_frame(client, 1)).remove(0);
//! let mut init = Initiator::new(InitiatorConfig::new(client), parse_config_response(&answer)?);
//! init.submit(AtaRequest::Write { lba: 2, data: vec![0xAB; 1024] })?;
//! init.submit(AtaRequest::Read { lba: 2, sectors: 2 })?;
//! let mut read_back = Vec::new();
//! while init.outstanding() > 0 {
//!     let frame = init.poll_transmit(now).expect("window open");
//!     for reply in serve(&mut target, &frame) {
//!         let done = init.on_frame(&reply, now).expect("answers a command");
//!         read_back.extend_from_slice(&reply[done.result?.data]);
//!     }
//! }
//! assert_eq!(read_back, vec![0xAB; 1024]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs, unreachable_pub)]

pub mod ata;
pub mod config;
pub mod frame;
pub mod initiator;
pub mod issue;
pub mod mask;
pub mod message;
pub mod reserve;
pub mod rtt;
pub mod target;
pub mod window;

#[cfg(test)]
mod proptests;

pub use frame::{DecodeError, ErrorCode, Header, Mac};
pub use initiator::{Initiator, InitiatorConfig};
pub use message::{decode, Frame, Message};
pub use target::{
    Action, AoeTarget, DeviceAddr, DeviceConfig, IoFailure, IoOp, IoRequest, Pending, TargetConfig,
};
