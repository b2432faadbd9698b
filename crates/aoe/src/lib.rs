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
#![warn(missing_docs, unreachable_pub)]

pub mod ata;
pub mod config;
pub mod frame;
pub mod initiator;
pub mod issue;
pub mod mask;
pub mod reserve;
pub mod rtt;
pub mod target;
pub mod window;

#[cfg(test)]
mod proptests;

pub use frame::{decode, DecodeError, ErrorCode, Frame, Header, Mac, Message};
pub use initiator::{Initiator, InitiatorConfig};
pub use target::{
    Action, AoeTarget, DeviceAddr, DeviceConfig, IoFailure, IoOp, IoRequest, Pending, TargetConfig,
};
