//! The error type of every link: each message is one line that names the
//! interface or socket and, where there is one, the fix.

use std::io;
use std::path::PathBuf;

/// Why opening a link, or sending or receiving on it, failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// `socket(AF_PACKET, …)` was refused: the process lacks CAP_NET_RAW.
    #[error(
        "opening a raw socket on {ifname} needs CAP_NET_RAW: run as root, or grant it \
         (setcap cap_net_raw+ep BINARY, or AmbientCapabilities=CAP_NET_RAW in a systemd unit)"
    )]
    NeedsCapNetRaw {
        /// The interface the link was for.
        ifname: String,
    },
    /// No interface has that name (in this network namespace).
    #[error("no network interface named {ifname} (list them with `ip link`)")]
    NoSuchInterface {
        /// The name asked for.
        ifname: String,
    },
    /// The name cannot be an interface name.
    #[error("{ifname:?} is not a valid network interface name (1 to 15 bytes, no '/', NUL or whitespace)")]
    BadInterfaceName {
        /// The name asked for.
        ifname: String,
    },
    /// The interface exists but is administratively down.
    #[error("network interface {ifname} is down (bring it up with `ip link set {ifname} up`)")]
    InterfaceDown {
        /// The interface.
        ifname: String,
    },
    /// The interface does not carry Ethernet frames (loopback, tun, …).
    #[error(
        "network interface {ifname} is not an Ethernet interface (ARP hardware type {hwtype})"
    )]
    NotEthernet {
        /// The interface.
        ifname: String,
        /// Its `ARPHRD_*` type.
        hwtype: u16,
    },
    /// An MTU outside 68..=9216.
    #[error("MTU {mtu} is out of range (68 to {max})", max = crate::frame::MAX_MTU)]
    BadMtu {
        /// The MTU asked for or found.
        mtu: usize,
    },
    /// A frame to send is shorter than a header or longer than MTU + 14.
    #[error("a frame of {len} bytes cannot be sent: frames are 14 to {max} bytes (the MTU plus the Ethernet header)")]
    FrameSize {
        /// The frame's length.
        len: usize,
        /// The largest frame the link sends.
        max: usize,
    },
    /// A system call on an AF_PACKET socket failed.
    #[error("{op} on {ifname}: {source}")]
    Packet {
        /// What was being done, e.g. "mapping the packet ring".
        op: &'static str,
        /// The interface.
        ifname: String,
        /// The OS error.
        source: io::Error,
    },
    /// A system call on a unix datagram socket failed.
    #[error("{op} {}: {source}", path.display())]
    Unix {
        /// What was being done, e.g. "binding".
        op: &'static str,
        /// The socket path concerned.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}
