//! The kernel NBD driver's generic netlink interface (family `nbd`,
//! include/uapi/linux/nbd-netlink.h): CONNECT a device to sockets, with
//! its size, block size, flags and timeouts; RECONFIGURE it with new
//! sockets after a dead connection; DISCONNECT it. The messages are built
//! here (and tested as bytes); [`Nbd`] sends them with `neli`.

use std::os::fd::RawFd;
use std::time::Duration;

use neli::consts::genl::{Cmd, NlAttrType};
use neli::consts::nl::NlmF;
use neli::consts::socket::NlFamily;
use neli::genl::{AttrTypeBuilder, Genlmsghdr, GenlmsghdrBuilder, Nlattr, NlattrBuilder};
use neli::neli_enum;
use neli::nl::NlPayload;
use neli::router::synchronous::NlRouter;
use neli::types::{Buffer, GenlBuffer};
use neli::utils::Groups;

/// The family's version (`NBD_GENL_VERSION`).
const VERSION: u8 = 1;

/// The family's commands.
#[neli_enum(serialized_type = "u8")]
pub enum NbdCmd {
    /// Unused.
    Unspec = 0,
    /// Configure a device and connect it to sockets.
    Connect = 1,
    /// Disconnect a device.
    Disconnect = 2,
    /// Change a connected device (new sockets, timeouts).
    Reconfigure = 3,
    /// A connection died (the kernel's multicast notice).
    LinkDead = 4,
    /// Ask for devices' states.
    Status = 5,
}
impl Cmd for NbdCmd {}

/// The family's attributes.
#[neli_enum(serialized_type = "u16")]
pub enum NbdAttr {
    /// Unused.
    Unspec = 0,
    /// The device's index (N of /dev/nbdN), u32.
    Index = 1,
    /// Capacity in bytes, u64.
    SizeBytes = 2,
    /// Logical block size in bytes, u64.
    BlockSizeBytes = 3,
    /// Per-request timeout in seconds, u64.
    Timeout = 4,
    /// Transmission flags (`NBD_FLAG_*`), u64.
    ServerFlags = 5,
    /// Client flags (`NBD_CFLAG_*`), u64.
    ClientFlags = 6,
    /// The sockets, nested.
    Sockets = 7,
    /// How long to wait for a dead connection's replacement, seconds, u64.
    DeadConnTimeout = 8,
    /// Devices' states (STATUS), nested.
    DeviceList = 9,
    /// A name for the backend, NUL-terminated string (kernel 5.16+).
    BackendIdentifier = 10,
}
impl NlAttrType for NbdAttr {}

/// The item inside [`NbdAttr::Sockets`].
#[neli_enum(serialized_type = "u16")]
pub enum NbdSockItem {
    /// Unused.
    Unspec = 0,
    /// One socket, nested.
    Item = 1,
}
impl NlAttrType for NbdSockItem {}

/// The attribute inside a socket item.
#[neli_enum(serialized_type = "u16")]
pub enum NbdSock {
    /// Unused.
    Unspec = 0,
    /// The socket's file descriptor, u32.
    Fd = 1,
}
impl NlAttrType for NbdSock {}

/// Client flag: the device is freed when it disconnects.
pub const CFLAG_DESTROY_ON_DISCONNECT: u64 = 1 << 0;
/// Client flag: the device disconnects when its last opener closes the
/// block device (each `mkfs`, `dd` or unmount would end it: not for a
/// device that is served until detached).
pub const CFLAG_DISCONNECT_ON_CLOSE: u64 = 1 << 1;

/// What CONNECT tells the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// A device index to use, or any free one.
    pub index: Option<u32>,
    /// Capacity in bytes.
    pub size: u64,
    /// Logical block size in bytes.
    pub block_size: u64,
    /// Transmission flags (`ethersan_nbd::flags`).
    pub server_flags: u64,
    /// Client flags ([`CFLAG_DESTROY_ON_DISCONNECT`], …).
    pub client_flags: u64,
    /// How long a request may take before the kernel gives up on its
    /// connection (marks it dead and requeues the request), in whole
    /// seconds; zero: never, the kernel only warns of a stuck request and
    /// the server answers every request itself in its own time.
    pub timeout: Duration,
    /// How long the kernel waits for a dead connection to be replaced
    /// (RECONFIGURE) before failing I/O.
    pub dead_conn_timeout: Duration,
    /// Named in /sys/block/nbdN/backend, where the kernel has it.
    pub backend: Option<String>,
    /// One socket per connection (hardware queue).
    pub sockets: Vec<RawFd>,
}

/// Why the kernel's NBD driver could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// No `nbd` generic netlink family: the driver is not loaded.
    #[error("the kernel has no NBD driver loaded (no generic netlink family \"nbd\"): run `modprobe nbd`, or use `ethersan attach` (a FUSE file) instead")]
    NoDriver,
    /// Building or sending a message, or the kernel's answer.
    #[error("NBD netlink {what}: {detail}")]
    Kernel {
        /// What was being done.
        what: &'static str,
        /// What went wrong.
        detail: String,
    },
}

fn err(what: &'static str, e: impl std::fmt::Display) -> NetlinkError {
    NetlinkError::Kernel {
        what,
        detail: e.to_string(),
    }
}

type Msg = Genlmsghdr<NbdCmd, NbdAttr>;

/// A netlink failure; the kernel's own refusal as its error number (the
/// NBD driver logs its reason in the kernel log).
fn kernel_err<T, P>(what: &'static str, e: neli::err::RouterError<T, P>) -> NetlinkError
where
    neli::err::RouterError<T, P>: std::fmt::Display,
{
    match &e {
        neli::err::RouterError::Nlmsgerr(m) => err(
            what,
            format!(
                "the kernel refused: {} (its log says why: dmesg | tail)",
                std::io::Error::from_raw_os_error(-*m.error())
            ),
        ),
        _ => err(what, e),
    }
}

fn attr<T: NlAttrType, P: neli::Size + neli::ToBytes>(
    t: T,
    nested: bool,
    payload: P,
) -> Result<Nlattr<T, Buffer>, NetlinkError> {
    let ty = AttrTypeBuilder::default()
        .nla_type(t)
        .nla_nested(nested)
        .build()
        .map_err(|e| err("building an attribute", e))?;
    NlattrBuilder::default()
        .nla_type(ty)
        .nla_payload(payload)
        .build()
        .map_err(|e| err("building an attribute", e))
}

fn u64_secs(d: Duration) -> u64 {
    d.as_secs().max(1)
}

fn message(cmd: NbdCmd, attrs: Vec<Nlattr<NbdAttr, Buffer>>) -> Result<Msg, NetlinkError> {
    GenlmsghdrBuilder::default()
        .cmd(cmd)
        .version(VERSION)
        .attrs(attrs.into_iter().collect::<GenlBuffer<_, _>>())
        .build()
        .map_err(|e| err("building a message", e))
}

/// The nested list of `sockets`.
fn sockets(fds: &[RawFd]) -> Result<Nlattr<NbdAttr, Buffer>, NetlinkError> {
    let mut list = attr(NbdAttr::Sockets, true, Buffer::from(Vec::<u8>::new()))?;
    for &fd in fds {
        let fd = u32::try_from(fd).map_err(|e| err("passing a socket", e))?;
        let item = attr(NbdSockItem::Item, true, Buffer::from(Vec::<u8>::new()))?
            .nest(&attr(NbdSock::Fd, false, fd)?)
            .map_err(|e| err("nesting a socket", e))?;
        list = list.nest(&item).map_err(|e| err("nesting a socket", e))?;
    }
    Ok(list)
}

/// The CONNECT message for `c`.
pub fn connect_message(c: &Connect) -> Result<Msg, NetlinkError> {
    let mut attrs = Vec::new();
    if let Some(i) = c.index {
        attrs.push(attr(NbdAttr::Index, false, i)?);
    }
    attrs.push(attr(NbdAttr::SizeBytes, false, c.size)?);
    attrs.push(attr(NbdAttr::BlockSizeBytes, false, c.block_size)?);
    attrs.push(attr(NbdAttr::ServerFlags, false, c.server_flags)?);
    attrs.push(attr(NbdAttr::ClientFlags, false, c.client_flags)?);
    push_timeouts(&mut attrs, c)?;
    if let Some(b) = &c.backend {
        attrs.push(backend_attr(b)?);
    }
    attrs.push(sockets(&c.sockets)?);
    message(NbdCmd::Connect, attrs)
}

/// `c`'s request timeout and dead-connection timeout, in whole seconds.
fn push_timeouts(
    attrs: &mut Vec<Nlattr<NbdAttr, Buffer>>,
    c: &Connect,
) -> Result<(), NetlinkError> {
    attrs.push(attr(NbdAttr::Timeout, false, c.timeout.as_secs())?);
    attrs.push(attr(
        NbdAttr::DeadConnTimeout,
        false,
        u64_secs(c.dead_conn_timeout),
    )?);
    Ok(())
}

/// The RECONFIGURE message giving device `index` `c`'s sockets (each
/// replaces a dead connection) and timeouts; `c.backend` must repeat the
/// name the device was connected with, if it was given one (the kernel
/// checks that it is the same backend). Sizes and flags stay as they are.
pub fn reconfigure_message(index: u32, c: &Connect) -> Result<Msg, NetlinkError> {
    let mut attrs = vec![attr(NbdAttr::Index, false, index)?];
    if let Some(b) = &c.backend {
        attrs.push(backend_attr(b)?);
    }
    push_timeouts(&mut attrs, c)?;
    attrs.push(sockets(&c.sockets)?);
    message(NbdCmd::Reconfigure, attrs)
}

fn backend_attr(b: &str) -> Result<Nlattr<NbdAttr, Buffer>, NetlinkError> {
    let mut s = b.as_bytes().to_vec();
    s.push(0);
    attr(NbdAttr::BackendIdentifier, false, Buffer::from(s))
}

/// The DISCONNECT message for device `index`.
pub fn disconnect_message(index: u32) -> Result<Msg, NetlinkError> {
    message(
        NbdCmd::Disconnect,
        vec![attr(NbdAttr::Index, false, index)?],
    )
}

/// A generic netlink socket to the kernel's NBD driver.
pub struct Nbd {
    router: NlRouter,
    family: u16,
}

impl std::fmt::Debug for Nbd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nbd").field("family", &self.family).finish()
    }
}

impl Nbd {
    /// Open the socket and look the `nbd` family up
    /// ([`NetlinkError::NoDriver`] when the driver is not loaded).
    pub fn open() -> Result<Nbd, NetlinkError> {
        let (router, _) = NlRouter::connect(NlFamily::Generic, Some(0), Groups::empty())
            .map_err(|e| err("opening a generic netlink socket", e))?;
        let family = router
            .resolve_genl_family("nbd")
            .map_err(|_| NetlinkError::NoDriver)?;
        Ok(Nbd { router, family })
    }

    /// Send `msg` and return the kernel's answer's attributes' device
    /// index, if it named one.
    fn call(&self, what: &'static str, msg: Msg) -> Result<Option<u32>, NetlinkError> {
        let recv = self
            .router
            .send::<_, _, u16, Msg>(
                self.family,
                NlmF::REQUEST | NlmF::ACK,
                NlPayload::Payload(msg),
            )
            .map_err(|e| kernel_err(what, e))?;
        let mut index = None;
        for answer in recv {
            let answer = answer.map_err(|e| kernel_err(what, e))?;
            if let NlPayload::Payload(p) = answer.nl_payload() {
                if let Ok(i) = p
                    .attrs()
                    .get_attr_handle()
                    .get_attr_payload_as::<u32>(NbdAttr::Index)
                {
                    index = Some(i);
                }
            }
        }
        Ok(index)
    }

    /// CONNECT: the device's index (N of /dev/nbdN).
    pub fn connect(&self, c: &Connect) -> Result<u32, NetlinkError> {
        let index = self.call("connect", connect_message(c)?)?;
        index
            .or(c.index)
            .ok_or_else(|| err("connect", "the kernel named no device"))
    }

    /// RECONFIGURE device `index` with new sockets and timeouts (after
    /// a dead connection, within the dead-connection timeout), as
    /// [`reconfigure_message`] says.
    pub fn reconfigure(&self, index: u32, c: &Connect) -> Result<(), NetlinkError> {
        self.call("reconfigure", reconfigure_message(index, c)?)
            .map(|_| ())
    }

    /// DISCONNECT device `index`.
    pub fn disconnect(&self, index: u32) -> Result<(), NetlinkError> {
        self.call("disconnect", disconnect_message(index)?)
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neli::ToBytes;
    use std::io::Cursor;

    fn bytes(m: &Msg) -> Vec<u8> {
        let mut c = Cursor::new(Vec::new());
        m.to_bytes(&mut c).unwrap();
        c.into_inner()
    }

    /// (type without flags, nested flag, payload) of each attribute in
    /// `b`, a netlink attribute list.
    fn attrs(mut b: &[u8]) -> Vec<(u16, bool, Vec<u8>)> {
        let mut out = Vec::new();
        while b.len() >= 4 {
            let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
            let ty = u16::from_ne_bytes([b[2], b[3]]);
            out.push((ty & 0x3fff, ty & 0x8000 != 0, b[4..len].to_vec()));
            let padded = (len + 3) & !3;
            b = &b[padded.min(b.len())..];
        }
        out
    }

    #[test]
    fn connect_as_the_kernel_reads_it() {
        let c = Connect {
            index: None,
            size: 1 << 30,
            block_size: 4096,
            server_flags: 0x6d,
            client_flags: CFLAG_DESTROY_ON_DISCONNECT,
            timeout: Duration::from_secs(30),
            dead_conn_timeout: Duration::from_millis(500),
            backend: Some("iqn.x:lun0".into()),
            sockets: vec![5, 6],
        };
        let b = bytes(&connect_message(&c).unwrap());
        // genlmsghdr: cmd CONNECT, version 1, reserved.
        assert_eq!(&b[..4], &[1, 1, 0, 0]);
        let a = attrs(&b[4..]);
        let ty: Vec<u16> = a.iter().map(|x| x.0).collect();
        assert_eq!(ty, vec![2, 3, 5, 6, 4, 8, 10, 7]);
        let u64_of = |i: usize| u64::from_ne_bytes(a[i].2[..8].try_into().unwrap());
        assert_eq!(
            (
                u64_of(0),
                u64_of(1),
                u64_of(2),
                u64_of(3),
                u64_of(4),
                u64_of(5)
            ),
            (1 << 30, 4096, 0x6d, 1, 30, 1),
            "sizes, flags, and timeouts in whole seconds (at least 1)"
        );
        assert_eq!(a[6].2, b"iqn.x:lun0\0");
        // Sockets: nested items, each a nested FD.
        assert!(a[7].1, "NBD_ATTR_SOCKETS is nested");
        let items = attrs(&a[7].2);
        assert_eq!(items.len(), 2);
        for (item, fd) in items.iter().zip([5u32, 6]) {
            assert_eq!((item.0, item.1), (1, true));
            let inner = attrs(&item.2);
            assert_eq!(inner, vec![(1, false, fd.to_ne_bytes().to_vec())]);
        }
    }

    /// Without the driver (this host's kernel has none) the error says
    /// what to do; with it, the family is found.
    #[test]
    fn opening_says_whether_the_driver_is_there() {
        let loaded = std::path::Path::new("/sys/module/nbd").exists();
        match Nbd::open() {
            Ok(n) => assert!(loaded, "found family {} without nbd loaded", n.family),
            Err(NetlinkError::NoDriver) => {
                assert!(!loaded, "nbd is loaded but its family was not found");
                let msg = NetlinkError::NoDriver.to_string();
                assert!(
                    msg.contains("modprobe nbd") && msg.contains("ethersan attach"),
                    "{msg}"
                );
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn reconfigure_and_disconnect_name_the_device() {
        let mut c = Connect {
            index: None,
            size: 512,
            block_size: 512,
            server_flags: 1,
            client_flags: 0,
            timeout: Duration::from_secs(40),
            dead_conn_timeout: Duration::from_secs(7),
            backend: None,
            sockets: vec![9],
        };
        let b = bytes(&reconfigure_message(3, &c).unwrap());
        assert_eq!(b[0], 3);
        let a = attrs(&b[4..]);
        assert_eq!(a.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 4, 8, 7]);
        assert_eq!(a[0].2, 3u32.to_ne_bytes().to_vec());
        assert_eq!(a[1].2, 40u64.to_ne_bytes().to_vec());
        assert_eq!(a[2].2, 7u64.to_ne_bytes().to_vec());
        // With the backend the device was connected with, before the rest.
        c.backend = Some("b".into());
        let a = attrs(&bytes(&reconfigure_message(3, &c).unwrap())[4..]);
        assert_eq!(
            a.iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![1, 10, 4, 8, 7]
        );
        assert_eq!(a[1].2, b"b\0");
        let b = bytes(&disconnect_message(7).unwrap());
        assert_eq!(b[0], 2);
        assert_eq!(
            attrs(&b[4..]),
            vec![(1, false, 7u32.to_ne_bytes().to_vec())]
        );
        let with_index = Connect {
            index: Some(4),
            size: 512,
            block_size: 512,
            server_flags: 1,
            client_flags: 0,
            timeout: Duration::from_secs(5),
            dead_conn_timeout: Duration::from_secs(5),
            backend: None,
            sockets: vec![],
        };
        let a = attrs(&bytes(&connect_message(&with_index).unwrap())[4..]);
        assert_eq!((a[0].0, a[0].2.clone()), (1, 4u32.to_ne_bytes().to_vec()));
    }
}
