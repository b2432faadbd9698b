//! ethersan's client library: a block device across the network, whatever
//! carries it.
//!
//! # Shape
//!
//! - [`BlockTarget`]: the one trait every transport implements — geometry
//!   (capacity, block size, largest transfer), read, write (with FUA),
//!   flush, write-zeroes, close, and [`Capabilities`] saying what the
//!   transport can do. Object-safe: the tools hold a `Box<dyn
//!   BlockTarget>` and never ask which transport it is.
//! - One module per transport: [`iscsi`] (a LUN over an iSCSI session,
//!   its retrying login, the unit-attention handling of its one command
//!   path), [`native`] (the byte stream of `eth://` and `udp://` sessions:
//!   ethersan's own channel on raw Ethernet or UDP), [`aoe`] (the AoE
//!   initiator's driver task), [`nvme`] (NVMe/TCP, `nvme+tcp://`, over
//!   `ethersan_nvme`'s host core), [`local`] (a file or block device through
//!   the server's own I/O engine, for `bench`; and `cp`'s plain files).
//! - [`url`]: the iSCSI and native URL forms; [`open()`] (in `open.rs`)
//!   picks the transport from the URL's scheme through one table,
//!   [`TRANSPORTS`], of each transport's [`Transport`]. A new transport
//!   is one new module and one line in that table.
//!
//! Modules use each other one way only: the tools' dispatch (`open`) uses
//! the transports, the transports use the interface (`target`), the
//! options, the URLs and the SCSI status text; `iscsi` uses `native` for
//! its stream, never the reverse.
//! - [`options`]: how to connect ([`ConnectArgs`], a `clap` argument
//!   group: CHAP, the native group, `--timeout`); [`scsi`]: a command's
//!   status and sense as an error message.
//!
//! The data path copies nothing the transport does not have to: a read
//! hands the transport a spare buffer to reuse (the local engine and AoE
//! read into it, never zeroing it; iSCSI returns the session's own
//! Data-In buffer), a write hands over [`Bytes`](bytes::Bytes) (sent as they are over
//! iSCSI).
#![warn(missing_docs, unreachable_pub)]

pub mod aoe;
pub mod iscsi;
pub mod local;
pub mod native;
pub mod nbd;
pub mod nvme;
mod open;
pub mod options;
pub mod scsi;
mod target;
pub mod url;

pub use open::{is_url, open, transport_of, url_forms, TRANSPORTS};
pub use options::{parse_duration, ConnectArgs, Timeout};
pub use target::{
    write_zero_buffers, BlockTarget, BoxFuture, Capabilities, OpenFn, OpenOptions, Say, Transport,
};
