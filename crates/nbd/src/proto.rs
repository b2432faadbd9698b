//! Requests, replies, and the checks a server makes before running a
//! request (the NBD protocol's transmission phase, simple replies only:
//! what the kernel's driver uses).

/// Magic number at the start of every request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic number at the start of every simple reply.
pub const REPLY_MAGIC: u32 = 0x6744_6698;
/// Bytes in a request header: magic, flags and type, handle, offset,
/// length.
pub const REQUEST_LEN: usize = 28;
/// Bytes in a simple reply header: magic, error, handle.
pub const REPLY_LEN: usize = 16;

/// Transmission flags a device advertises (`NBD_FLAG_*`), given to the
/// kernel as `NBD_ATTR_SERVER_FLAGS`.
pub mod flags {
    /// The other flags are meaningful.
    pub const HAS_FLAGS: u64 = 1 << 0;
    /// The device is read-only.
    pub const READ_ONLY: u64 = 1 << 1;
    /// FLUSH requests are understood.
    pub const SEND_FLUSH: u64 = 1 << 2;
    /// The FUA request flag is understood.
    pub const SEND_FUA: u64 = 1 << 3;
    /// The device is rotational (a scheduler hint).
    pub const ROTATIONAL: u64 = 1 << 4;
    /// TRIM requests are understood.
    pub const SEND_TRIM: u64 = 1 << 5;
    /// WRITE_ZEROES requests are understood.
    pub const SEND_WRITE_ZEROES: u64 = 1 << 6;
    /// Several connections see one consistent device (a flush on one
    /// covers writes completed on all).
    pub const CAN_MULTI_CONN: u64 = 1 << 8;
}

/// Request flag: the write reaches stable storage before the reply.
const CMD_FLAG_FUA: u16 = 1 << 0;
/// Request flag on WRITE_ZEROES: the range must stay allocated.
const CMD_FLAG_NO_HOLE: u16 = 1 << 1;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Read `len` bytes at `offset`; the reply carries them.
    Read,
    /// Write the `len` bytes that follow the request at `offset`.
    Write,
    /// The client is going away: no reply, close the connection.
    Disconnect,
    /// Make every completed write durable.
    Flush,
    /// The range's data is no longer needed (may be deallocated).
    Trim,
    /// Zero the range (deallocating it unless NO_HOLE).
    WriteZeroes,
}

impl Command {
    fn from_wire(t: u16) -> Option<Command> {
        Some(match t {
            0 => Command::Read,
            1 => Command::Write,
            2 => Command::Disconnect,
            3 => Command::Flush,
            4 => Command::Trim,
            6 => Command::WriteZeroes,
            _ => return None,
        })
    }

    fn to_wire(self) -> u16 {
        match self {
            Command::Read => 0,
            Command::Write => 1,
            Command::Disconnect => 2,
            Command::Flush => 3,
            Command::Trim => 4,
            Command::WriteZeroes => 6,
        }
    }
}

/// A request header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The client's tag for it, echoed in the reply.
    pub handle: u64,
    /// What it asks for.
    pub command: Command,
    /// Byte offset on the device.
    pub offset: u64,
    /// Length in bytes (0 for FLUSH and DISCONNECT).
    pub len: u32,
    /// FUA: durable before the reply.
    pub fua: bool,
    /// NO_HOLE (WRITE_ZEROES only): keep the range allocated.
    pub no_hole: bool,
}

/// Why a request header cannot be taken. The connection cannot go on
/// after any of these (the stream's framing is lost or the peer is not
/// speaking NBD), so the server closes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The first four bytes are not the request magic.
    #[error("not an NBD request: magic {0:#010x}, expected 0x25609513 (is the peer the kernel's nbd driver?)")]
    BadMagic(u32),
    /// A command this server does not know.
    #[error("NBD command {0} is not supported (read, write, disconnect, flush, trim and write-zeroes are)")]
    UnknownCommand(u16),
    /// Request flags this server does not know.
    #[error("NBD request flags {0:#06x} are not supported (FUA and NO_HOLE are)")]
    UnknownFlags(u16),
}

impl Request {
    /// Decode a request header.
    pub fn parse(raw: &[u8; REQUEST_LEN]) -> Result<Request, DecodeError> {
        let magic = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
        if magic != REQUEST_MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        let flags = u16::from_be_bytes([raw[4], raw[5]]);
        let t = u16::from_be_bytes([raw[6], raw[7]]);
        let command = Command::from_wire(t).ok_or(DecodeError::UnknownCommand(t))?;
        if flags & !(CMD_FLAG_FUA | CMD_FLAG_NO_HOLE) != 0 {
            return Err(DecodeError::UnknownFlags(flags));
        }
        let mut handle = [0; 8];
        handle.copy_from_slice(&raw[8..16]);
        let mut offset = [0; 8];
        offset.copy_from_slice(&raw[16..24]);
        Ok(Request {
            handle: u64::from_be_bytes(handle),
            command,
            offset: u64::from_be_bytes(offset),
            len: u32::from_be_bytes([raw[24], raw[25], raw[26], raw[27]]),
            fua: flags & CMD_FLAG_FUA != 0,
            no_hole: flags & CMD_FLAG_NO_HOLE != 0,
        })
    }

    /// Encode the header (as the kernel sends it; for tests and tools).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut out = [0; REQUEST_LEN];
        let mut flags = 0;
        if self.fua {
            flags |= CMD_FLAG_FUA;
        }
        if self.no_hole {
            flags |= CMD_FLAG_NO_HOLE;
        }
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.command.to_wire().to_be_bytes());
        out[8..16].copy_from_slice(&self.handle.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    /// Bytes of data that follow this header on the stream (a write's).
    /// They must be read, even when the request is refused, to stay in
    /// step with the stream.
    pub fn payload_len(&self) -> usize {
        match self.command {
            Command::Write => self.len as usize,
            _ => 0,
        }
    }

    /// Bytes of data that follow a successful reply (a read's).
    pub fn reply_payload_len(&self) -> usize {
        match self.command {
            Command::Read => self.len as usize,
            _ => 0,
        }
    }

    /// Whether the request gets a reply at all (DISCONNECT does not).
    pub fn wants_reply(&self) -> bool {
        self.command != Command::Disconnect
    }
}

/// The error numbers a reply carries (the NBD protocol's own values,
/// which match Linux's errno numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Errno {
    /// A write to a read-only device.
    Perm = 1,
    /// The I/O failed.
    Io = 5,
    /// No memory for the request.
    NoMem = 12,
    /// A malformed request (misaligned, a zero length where one is
    /// needed, flags that do not fit the command).
    Inval = 22,
    /// A range beyond the end of the device.
    NoSpc = 28,
    /// A length larger than the server takes.
    Overflow = 75,
    /// A command the device does not support.
    NotSup = 95,
    /// The server is shutting down.
    Shutdown = 108,
}

/// The device's shape, as the kernel was told it: what
/// [`Device::check`] holds a request against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    /// Capacity in bytes.
    pub size: u64,
    /// Logical block size in bytes (a power of two, 512 to 4096).
    pub block_size: u32,
    /// Writes, trims and write-zeroes are refused.
    pub read_only: bool,
}

/// The largest read or write this server takes in one request (the
/// kernel splits at `max_hw_sectors`, far below it).
pub const MAX_TRANSFER: u32 = 32 << 20;

impl Device {
    /// Check `req` against the device before running it: `Ok` or the
    /// error number to reply with. The kernel's driver only sends what
    /// it was configured for, so a refusal here means a confused or
    /// hostile peer, answered and survived.
    pub fn check(&self, req: &Request) -> Result<(), Errno> {
        let writes = matches!(
            req.command,
            Command::Write | Command::Trim | Command::WriteZeroes
        );
        if writes && self.read_only {
            return Err(Errno::Perm);
        }
        if req.no_hole && req.command != Command::WriteZeroes {
            return Err(Errno::Inval);
        }
        match req.command {
            Command::Flush | Command::Disconnect => return Ok(()),
            Command::Read | Command::Write if req.len > MAX_TRANSFER => {
                return Err(Errno::Overflow)
            }
            _ => {}
        }
        let bs = u64::from(self.block_size.max(1));
        if !req.offset.is_multiple_of(bs) || !u64::from(req.len).is_multiple_of(bs) {
            return Err(Errno::Inval);
        }
        match req.offset.checked_add(u64::from(req.len)) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Errno::NoSpc),
        }
    }
}

/// A simple reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// The request's handle.
    pub handle: u64,
    /// 0, or an [`Errno`] value.
    pub error: u32,
}

impl Reply {
    /// Success (a read's data follows it).
    pub fn ok(handle: u64) -> Reply {
        Reply { handle, error: 0 }
    }

    /// Failure with `errno` (no data follows, even for a read).
    pub fn error(handle: u64, errno: Errno) -> Reply {
        Reply {
            handle,
            error: errno as u32,
        }
    }

    /// Encode the header.
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut out = [0; REPLY_LEN];
        out[0..4].copy_from_slice(&REPLY_MAGIC.to_be_bytes());
        out[4..8].copy_from_slice(&self.error.to_be_bytes());
        out[8..16].copy_from_slice(&self.handle.to_be_bytes());
        out
    }

    /// Decode a header (as the kernel does; for tests and tools). `None`
    /// when the magic is wrong.
    pub fn parse(raw: &[u8; REPLY_LEN]) -> Option<Reply> {
        if u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]) != REPLY_MAGIC {
            return None;
        }
        let mut handle = [0; 8];
        handle.copy_from_slice(&raw[8..16]);
        Some(Reply {
            handle: u64::from_be_bytes(handle),
            error: u32::from_be_bytes([raw[4], raw[5], raw[6], raw[7]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(command: Command, offset: u64, len: u32) -> Request {
        Request {
            handle: 0x0102_0304_0506_0708,
            command,
            offset,
            len,
            fua: false,
            no_hole: false,
        }
    }

    const DEV: Device = Device {
        size: 1 << 30,
        block_size: 4096,
        read_only: false,
    };

    #[test]
    fn the_kernels_layout() {
        // A 4 KiB FUA write of handle 1 at 8 KiB, byte for byte as
        // include/uapi/linux/nbd.h lays out struct nbd_request (the type
        // word's high half holds the flags).
        let r = Request {
            fua: true,
            ..req(Command::Write, 8192, 4096)
        };
        let raw = Request { handle: 1, ..r }.encode();
        assert_eq!(
            raw,
            [
                0x25, 0x60, 0x95, 0x13, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x20,
                0, 0, 0, 0x10, 0
            ]
        );
        assert_eq!(
            Reply::error(1, Errno::Io).encode(),
            [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 1]
        );
    }

    #[test]
    fn every_command_round_trips_with_its_payloads() {
        for (c, wire, payload, reply_payload) in [
            (Command::Read, 0u16, 0, 4096),
            (Command::Write, 1, 4096, 0),
            (Command::Disconnect, 2, 0, 0),
            (Command::Flush, 3, 0, 0),
            (Command::Trim, 4, 0, 0),
            (Command::WriteZeroes, 6, 0, 0),
        ] {
            let r = req(c, 4096, 4096);
            let raw = r.encode();
            assert_eq!(u16::from_be_bytes([raw[6], raw[7]]), wire);
            let back = Request::parse(&raw).unwrap();
            assert_eq!(back, r);
            assert_eq!(
                (back.payload_len(), back.reply_payload_len()),
                (payload, reply_payload)
            );
            assert_eq!(back.wants_reply(), c != Command::Disconnect);
        }
    }

    #[test]
    fn malformed_headers_are_refused_with_what_is_wrong() {
        let good = req(Command::Read, 0, 512).encode();
        let mut bad = good;
        bad[0] = 0;
        assert_eq!(
            Request::parse(&bad),
            Err(DecodeError::BadMagic(0x0060_9513))
        );
        let mut cache = good;
        cache[7] = 5; // NBD_CMD_CACHE: not served.
        assert_eq!(Request::parse(&cache), Err(DecodeError::UnknownCommand(5)));
        let mut flags = good;
        flags[5] = 0x04; // NBD_CMD_FLAG_DF, structured replies only.
        assert_eq!(Request::parse(&flags), Err(DecodeError::UnknownFlags(4)));
        let msg = DecodeError::BadMagic(0).to_string();
        assert!(msg.contains("0x25609513"), "{msg}");
    }

    #[test]
    fn checks_against_the_device() {
        assert_eq!(DEV.check(&req(Command::Read, 0, 4096)), Ok(()));
        assert_eq!(
            DEV.check(&req(Command::Write, (1 << 30) - 4096, 4096)),
            Ok(())
        );
        assert_eq!(
            DEV.check(&req(Command::Write, 1 << 30, 4096)),
            Err(Errno::NoSpc)
        );
        assert_eq!(
            DEV.check(&req(Command::Read, u64::MAX - 4095, 4096)),
            Err(Errno::NoSpc),
            "offset + length overflows"
        );
        assert_eq!(DEV.check(&req(Command::Read, 512, 4096)), Err(Errno::Inval));
        assert_eq!(DEV.check(&req(Command::Trim, 0, 512)), Err(Errno::Inval));
        assert_eq!(
            DEV.check(&req(Command::Read, 0, MAX_TRANSFER + 4096)),
            Err(Errno::Overflow)
        );
        // A trim may be larger than any transfer.
        assert_eq!(DEV.check(&req(Command::Trim, 0, 1 << 30)), Ok(()));
        assert_eq!(DEV.check(&req(Command::Flush, 0, 0)), Ok(()));
        let no_hole = Request {
            no_hole: true,
            ..req(Command::Write, 0, 4096)
        };
        assert_eq!(DEV.check(&no_hole), Err(Errno::Inval));
        let zeroes = Request {
            command: Command::WriteZeroes,
            ..no_hole
        };
        assert_eq!(DEV.check(&zeroes), Ok(()));
        let ro = Device {
            read_only: true,
            ..DEV
        };
        for c in [Command::Write, Command::Trim, Command::WriteZeroes] {
            assert_eq!(ro.check(&req(c, 0, 4096)), Err(Errno::Perm));
        }
        assert_eq!(ro.check(&req(Command::Read, 0, 4096)), Ok(()));
        assert_eq!(ro.check(&req(Command::Flush, 0, 0)), Ok(()));
    }

    #[test]
    fn a_reply_with_the_wrong_magic_is_not_a_reply() {
        let mut raw = Reply::ok(9).encode();
        assert_eq!(Reply::parse(&raw), Some(Reply::ok(9)));
        raw[3] ^= 1;
        assert_eq!(Reply::parse(&raw), None);
    }

    proptest! {
        #[test]
        fn any_28_bytes_parse_or_are_refused(raw in proptest::array::uniform28(any::<u8>())) {
            if let Ok(r) = Request::parse(&raw) {
                // What parses encodes back to the same bytes.
                prop_assert_eq!(r.encode(), raw);
                let _ = DEV.check(&r);
            }
        }

        #[test]
        fn requests_round_trip(handle in any::<u64>(), offset in any::<u64>(), len in any::<u32>(),
                               c in 0usize..6, fua in any::<bool>(), no_hole in any::<bool>()) {
            let command = [Command::Read, Command::Write, Command::Disconnect,
                           Command::Flush, Command::Trim, Command::WriteZeroes][c];
            let r = Request { handle, command, offset, len, fua, no_hole };
            prop_assert_eq!(Request::parse(&r.encode()), Ok(r));
        }
    }
}
