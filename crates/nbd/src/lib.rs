//! The transmission phase of the NBD protocol as the Linux kernel's `nbd`
//! driver speaks it on the sockets it is given (over its netlink
//! interface, `NBD_CMD_CONNECT`): fixed 28-byte requests, each followed by
//! its data for a write, and 16-byte replies, each followed by its data
//! for a read. No handshake: the kernel is configured with the device's
//! size and flags directly, so the server side starts at the first
//! request.
//!
//! A protocol core in the manner of the other `ethersan-*` cores: plain
//! functions and values, no I/O. The server that reads requests from the
//! kernel's socket, runs them against a LUN and writes the replies is the
//! `ethersan` CLI's `attach --block`.
//!
//! ```
//! use ethersan_nbd::{Command, Device, Errno, Reply, Request};
//!
//! let dev = Device { size: 1 << 20, block_size: 512, read_only: false };
//! let raw = Request { handle: 7, command: Command::Write, offset: 4096, len: 512, fua: true, no_hole: false }.encode();
//! let req = Request::parse(&raw).unwrap();
//! assert_eq!(req.payload_len(), 512);
//! assert_eq!(dev.check(&req), Ok(()));
//! let reply = Reply::ok(req.handle).encode();
//! assert_eq!(Reply::parse(&reply).unwrap(), Reply { handle: 7, error: 0 });
//! assert_eq!(Reply::error(7, Errno::Io).error, 5);
//! ```

mod proto;

pub use proto::{
    flags, Command, DecodeError, Device, Errno, Reply, Request, MAX_TRANSFER, REPLY_LEN,
    REPLY_MAGIC, REQUEST_LEN, REQUEST_MAGIC,
};
