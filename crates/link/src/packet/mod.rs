//! The AF_PACKET link: a raw socket on a named interface, bound to one
//! EtherType, with a TPACKET_V3 (or, for low latency, V2; see
//! [`RingVersion`]) receive ring and a transmit ring shared
//! with the kernel (`ring.rs` states the invariants), a BPF filter on the
//! destination MAC (`bpf.rs`), `PACKET_QDISC_BYPASS` for sends, and optional
//! `PACKET_FANOUT` so several sockets (threads, processes) share the
//! receive load of one interface. Driven from tokio with
//! [`AsyncFd`]: the receive ring is walked when the socket is readable, and
//! a sender waits for writability only when the transmit ring is full.
//!
//! The socket is created with protocol 0 (it receives nothing), given its
//! rings and filter, and only then bound to the interface and EtherType,
//! so no frame of another interface slips into the ring before the bind.
//!
//! Opening needs CAP_NET_RAW; the socket stays in the network namespace of
//! the thread that opened it (so a thread may `setns` into a namespace,
//! open, and leave).

mod bpf;
mod ring;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use crate::frame::{RxFilter, HEADER_LEN};
use crate::{check_mtu, checked_batch, LinkError, MacAddr, RECV_BATCH};
use ring::{Mapping, RxRing, TxRing, Version};

/// How long a sender waits for the interface to free a transmit slot.
const TX_STALL_LIMIT: Duration = Duration::from_secs(2);

/// How sockets in one fanout group share received frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanoutMode {
    /// By the kernel's flow hash. For EtherTypes the flow dissector does
    /// not know (AoE among them) every frame hashes alike, so one socket
    /// gets everything: use [`FanoutMode::Cpu`] or
    /// [`FanoutMode::LoadBalance`] there.
    Hash,
    /// Round robin.
    LoadBalance,
    /// By the CPU that received the frame.
    Cpu,
    /// By the NIC's receive queue.
    QueueMapping,
    /// By a hash of the source MAC address, computed by a classic BPF
    /// program (`PACKET_FANOUT_CBPF`): every frame from one peer reaches
    /// the same socket whatever its EtherType, so a peer's conversation
    /// (a native transport channel) stays on one socket.
    SourceMac,
}

/// Joining a `PACKET_FANOUT` group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fanout {
    /// Group id, shared by the sockets of one group on one interface; 0
    /// makes a new group whose id the kernel picks, unique in the network
    /// namespace (`PACKET_FANOUT_FLAG_UNIQUEID`): the others join it with
    /// [`PacketLink::fanout_group`].
    pub group: u16,
    /// How frames are spread.
    pub mode: FanoutMode,
}

/// The layout of the rings (one TPACKET version per socket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RingVersion {
    /// TPACKET_V3: received frames are packed into blocks the kernel hands
    /// over when full or after [`PacketConfig::rx_block_timeout_ms`]: the
    /// fewest wake-ups under load, but a lone frame waits for the timeout
    /// (about 0.5 ms per hop at the 1 ms minimum).
    #[default]
    V3,
    /// TPACKET_V2: one slot per frame, handed over at once with a wake-up
    /// per frame (under load the reader still drains many per wake-up):
    /// the choice when request/response latency matters.
    V2,
}

/// Counters of a packet socket's receive path ([`PacketLink::take_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Frames that passed the filter (dropped ones included).
    pub packets: u64,
    /// Frames dropped because the receive ring was full.
    pub drops: u64,
}

/// How to open a [`PacketLink`].
#[derive(Debug, Clone)]
pub struct PacketConfig {
    /// The interface, e.g. `eth0`.
    pub ifname: String,
    /// The EtherType carried (the socket's protocol).
    pub ethertype: u16,
    /// Whether multicast destinations pass the filter (the socket then
    /// also asks the interface for all multicast, `PACKET_MR_ALLMULTI`).
    pub multicast: bool,
    /// The ring layout (default [`RingVersion::V3`]).
    pub ring: RingVersion,
    /// Receive ring block size in bytes: a power of two, at least a page,
    /// and room for several frames (default 256 KiB). With
    /// [`RingVersion::V2`] only `rx_block_size * rx_blocks`, the ring's
    /// size, counts.
    pub rx_block_size: usize,
    /// Receive ring blocks (default 32, so an 8 MiB ring).
    pub rx_blocks: usize,
    /// How long the kernel waits before handing over a block that is not
    /// full, in ms (default 1): the latency floor under light load.
    pub rx_block_timeout_ms: u32,
    /// Transmit ring slots (default 256).
    pub tx_frames: usize,
    /// Bypass the interface's queueing discipline on send (default true).
    pub qdisc_bypass: bool,
    /// Join a fanout group (default none).
    pub fanout: Option<Fanout>,
}

impl PacketConfig {
    /// Defaults for `ifname` and `ethertype`.
    pub fn new(ifname: impl Into<String>, ethertype: u16) -> PacketConfig {
        PacketConfig {
            ifname: ifname.into(),
            ethertype,
            multicast: false,
            ring: RingVersion::V3,
            rx_block_size: 256 * 1024,
            rx_blocks: 32,
            rx_block_timeout_ms: 1,
            tx_frames: 256,
            qdisc_bypass: true,
            fanout: None,
        }
    }
}

/// An AF_PACKET link on one interface.
pub struct PacketLink {
    fd: AsyncFd<OwnedFd>,
    ifname: String,
    ifindex: u32,
    filter: RxFilter,
    mtu: usize,
    rx: Mutex<RxRing>,
    tx: Mutex<TxRing>,
    // Last: unmapped after the ring views are gone.
    _map: Mapping,
}

impl std::fmt::Debug for PacketLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketLink")
            .field("ifname", &self.ifname)
            .field("ifindex", &self.ifindex)
            .field("mac", &self.filter.mac)
            .field("mtu", &self.mtu)
            .finish_non_exhaustive()
    }
}

impl PacketLink {
    /// Opens the link. Must be called within a tokio runtime (the socket
    /// is registered with its reactor; panics otherwise); the socket belongs
    /// to the calling thread's network namespace.
    pub fn open(config: PacketConfig) -> Result<PacketLink, LinkError> {
        let name = config.ifname.clone();
        let os = |op: &'static str| {
            let name = name.clone();
            move |source: io::Error| LinkError::Packet {
                op,
                ifname: name,
                source,
            }
        };
        let cname = interface_name(&name)?;
        // SAFETY: plain socket(2) call; the result is checked below.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM | libc::EACCES) => LinkError::NeedsCapNetRaw { ifname: name },
                _ => os("creating a packet socket")(e),
            });
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `cname` is a NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(LinkError::NoSuchInterface { ifname: name });
        }
        let (mac, mtu) = query_interface(raw, &cname, &name)?;
        let filter = RxFilter {
            mac,
            ethertype: config.ethertype,
            multicast: config.multicast,
        };

        let (version, tpacket) = match config.ring {
            RingVersion::V3 => (Version::V3, libc::tpacket_versions::TPACKET_V3),
            RingVersion::V2 => (Version::V2, libc::tpacket_versions::TPACKET_V2),
        };
        setsockopt(
            raw,
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &(tpacket as libc::c_int),
        )
        .map_err(os("selecting the TPACKET version"))?;
        let one: libc::c_int = 1;
        if config.qdisc_bypass {
            setsockopt(raw, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &one)
                .map_err(os("setting PACKET_QDISC_BYPASS"))?;
        }
        // A malformed transmit slot is skipped, not a stop of the ring.
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_LOSS, &one)
            .map_err(os("setting PACKET_LOSS"))?;
        // A fanout member filters out everything until it has joined its
        // group: bound, it receives on its own, and a frame arriving then
        // would reach it and the group's chosen member both.
        let mut prog = if config.fanout.is_some() {
            bpf::drop_all()
        } else {
            bpf::program(&filter)
        };
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_mut_ptr(),
        };
        setsockopt(raw, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
            .map_err(os("attaching the BPF filter"))?;

        let (map, rx, tx) = setup_rings(raw, version, &config, mtu).map_err(|(op, e)| os(op)(e))?;

        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = config.ethertype.to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: binds to a fully initialised sockaddr_ll of the given size.
        let rc = unsafe {
            libc::bind(
                raw,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc < 0 {
            return Err(os("binding the packet socket")(io::Error::last_os_error()));
        }
        if config.multicast {
            // SAFETY: all-zero is a valid packet_mreq.
            let mut mreq: libc::packet_mreq = unsafe { std::mem::zeroed() };
            mreq.mr_ifindex = ifindex as i32;
            mreq.mr_type = libc::PACKET_MR_ALLMULTI as u16;
            setsockopt(raw, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)
                .map_err(os("asking for multicast frames"))?;
        }
        if let Some(fanout) = config.fanout {
            let mode = match fanout.mode {
                FanoutMode::Hash => libc::PACKET_FANOUT_HASH,
                FanoutMode::LoadBalance => libc::PACKET_FANOUT_LB,
                FanoutMode::Cpu => libc::PACKET_FANOUT_CPU,
                FanoutMode::QueueMapping => libc::PACKET_FANOUT_QM,
                FanoutMode::SourceMac => libc::PACKET_FANOUT_CBPF,
            };
            let unique = if fanout.group == 0 {
                libc::PACKET_FANOUT_FLAG_UNIQUEID
            } else {
                0
            };
            let arg = u32::from(fanout.group) | ((mode | unique) << 16);
            setsockopt(raw, libc::SOL_PACKET, libc::PACKET_FANOUT, &arg)
                .map_err(os("joining the fanout group"))?;
            if fanout.mode == FanoutMode::SourceMac {
                // The group's program (the last member's replaces the
                // same program): set after joining, as the kernel wants.
                let mut prog = bpf::source_mac_hash();
                let fprog = libc::sock_fprog {
                    len: prog.len() as u16,
                    filter: prog.as_mut_ptr(),
                };
                setsockopt(raw, libc::SOL_PACKET, libc::PACKET_FANOUT_DATA, &fprog)
                    .map_err(os("setting the fanout group's BPF program"))?;
            }
            // Joined: now the real filter (a frame the group gave this
            // socket in between was dropped, never seen twice).
            let mut prog = bpf::program(&filter);
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_mut_ptr(),
            };
            setsockopt(raw, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
                .map_err(os("attaching the BPF filter"))?;
        }
        // SAFETY: `fd` is an open socket the AsyncFd takes ownership of; it
        // stays open, and `as_raw_fd` returns it, until the AsyncFd drops.
        let fd = unsafe { AsyncFd::register(fd) }
            .map_err(|e| os("registering with the tokio reactor")(e.into_parts().1))?;
        tracing::debug!(ifname = %name, ifindex, %mac, mtu, "packet link open");
        Ok(PacketLink {
            fd,
            ifname: name,
            ifindex,
            filter,
            mtu,
            rx: Mutex::new(rx),
            tx: Mutex::new(tx),
            _map: map,
        })
    }

    /// The interface's MTU (read when the link was opened).
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The receive filter (the interface's MAC, our EtherType).
    pub fn filter(&self) -> RxFilter {
        self.filter
    }

    /// The interface name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The interface index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The id of the fanout group this socket joined (the one the kernel
    /// picked for a [`Fanout`] of group 0), `None` outside any group.
    pub fn fanout_group(&self) -> Result<Option<u16>, LinkError> {
        let mut arg: u32 = 0;
        let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes (a u32) into `arg`
        // and updates `len`.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.get_ref().as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_FANOUT,
                (&mut arg as *mut u32).cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(self.err("reading the fanout group", io::Error::last_os_error()));
        }
        // 0 (and a short answer) outside any group.
        Ok((len as usize == std::mem::size_of::<u32>() && arg != 0).then_some(arg as u16))
    }

    /// The kernel's counters for this socket since the last call (reading
    /// resets them): frames that passed the filter, and of those, frames
    /// dropped because the receive ring was full.
    pub fn take_stats(&self) -> Result<RingStats, LinkError> {
        // SAFETY: all-zero is a valid tpacket_stats_v3.
        let mut st: libc::tpacket_stats_v3 = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into `st` (fewer,
        // a tpacket_stats, for TPACKET_V2) and updates `len`.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.get_ref().as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats_v3).cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(self.err("reading the packet statistics", io::Error::last_os_error()));
        }
        Ok(RingStats {
            packets: u64::from(st.tp_packets),
            drops: u64::from(st.tp_drops),
        })
    }

    /// See [`Link::recv_batch`](crate::Link::recv_batch).
    pub async fn recv_batch<F: FnMut(&[u8])>(&self, mut f: F) -> Result<usize, LinkError> {
        loop {
            self.ready().await?;
            let n = self.try_recv_batch(|frame| f(frame))?;
            if n > 0 {
                return Ok(n);
            }
        }
    }

    /// See [`Link::ready`](crate::Link::ready).
    pub async fn ready(&self) -> Result<(), LinkError> {
        loop {
            let mut ready = self
                .fd
                .readable()
                .await
                .map_err(|e| self.err("waiting to receive", e))?;
            if self
                .rx
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .has_frames()
            {
                return Ok(());
            }
            // Readiness newer than this guard survives the clear (a block
            // retired since the look above).
            ready.clear_ready();
        }
    }

    /// See [`Link::try_recv_batch`](crate::Link::try_recv_batch).
    pub fn try_recv_batch<F: FnMut(&mut [u8])>(&self, mut f: F) -> Result<usize, LinkError> {
        let mut delivered = 0;
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        rx.drain(RECV_BATCH, |frame, pkttype| {
            if pkttype != libc::PACKET_OUTGOING && self.filter.accepts(frame) {
                f(frame);
                delivered += 1;
            }
        });
        Ok(delivered)
    }

    /// See [`Link::send_batch`](crate::Link::send_batch).
    pub async fn send_batch<I, B>(&self, frames: I) -> Result<usize, LinkError>
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        let frames = checked_batch(frames, self.mtu)?;
        let mut sent = 0;
        while sent < frames.len() {
            let full = {
                let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
                while sent < frames.len() && tx.push(frames[sent].as_ref()) {
                    sent += 1;
                }
                sent < frames.len()
            };
            self.kick()?;
            if full {
                self.wait_for_slot().await?;
            }
        }
        Ok(sent)
    }

    /// See [`Link::send_with`](crate::Link::send_with): each frame is
    /// built in its transmit slot, and the ring is kicked once per batch
    /// (and when it fills).
    pub async fn send_with<F>(&self, n: usize, mut build: F) -> Result<usize, LinkError>
    where
        F: FnMut(usize, &mut [u8]) -> usize,
    {
        let max = self.mtu + HEADER_LEN;
        let (mut next, mut sent) = (0, 0);
        while next < n {
            let full = {
                let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
                while next < n {
                    let i = next;
                    let Some(len) = tx.push_with(|slot| {
                        let end = max.min(slot.len());
                        let slot = &mut slot[..end];
                        let len = build(i, slot);
                        // Declined, or longer than the slot offered.
                        if len < HEADER_LEN || len > end {
                            0
                        } else {
                            len
                        }
                    }) else {
                        break;
                    };
                    next += 1;
                    sent += usize::from(len > 0);
                }
                next < n
            };
            if sent > 0 {
                self.kick()?;
            }
            if full {
                self.wait_for_slot().await?;
            }
        }
        Ok(sent)
    }

    /// Asks the kernel to send every requested transmit slot.
    fn kick(&self) -> Result<(), LinkError> {
        loop {
            // SAFETY: a zero-length sendto with no buffer and no address:
            // the kernel sends the requested slots of the transmit ring.
            let rc = unsafe {
                libc::sendto(
                    self.fd.get_ref().as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if rc >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // The device queue is full: the slots stay requested and go
                // out with the next kick.
                Some(libc::EAGAIN | libc::ENOBUFS) => return Ok(()),
                _ => return Err(self.err("sending", e)),
            }
        }
    }

    /// Waits until the next transmit slot is free again.
    async fn wait_for_slot(&self) -> Result<(), LinkError> {
        let start = std::time::Instant::now();
        loop {
            if self
                .tx
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .next_is_free()
            {
                return Ok(());
            }
            // The kernel marks POLLOUT when its head slot is free again; a
            // short timeout covers a slot freed without a wake-up.
            match tokio::time::timeout(Duration::from_millis(1), self.fd.writable()).await {
                Ok(Ok(mut guard)) => {
                    if !self
                        .tx
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .next_is_free()
                    {
                        guard.clear_ready();
                        self.kick()?;
                    }
                }
                Ok(Err(e)) => return Err(self.err("waiting to send", e)),
                Err(_) => self.kick()?,
            }
            if start.elapsed() > TX_STALL_LIMIT {
                return Err(self.err(
                    "waiting for a free transmit slot",
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the interface sent nothing for 2 s",
                    ),
                ));
            }
        }
    }

    fn err(&self, op: &'static str, source: io::Error) -> LinkError {
        LinkError::Packet {
            op,
            ifname: self.ifname.clone(),
            source,
        }
    }
}

/// Reads the MAC address and MTU of interface `name` (as C string
/// `cname`), checking that it is Ethernet and up.
fn query_interface(raw: RawFd, cname: &CString, name: &str) -> Result<(MacAddr, usize), LinkError> {
    let io_err = |op: &'static str| {
        move |source: io::Error| LinkError::Packet {
            op,
            ifname: name.to_string(),
            source,
        }
    };
    let (hwtype, mac) = ifreq_get(raw, cname, libc::SIOCGIFHWADDR, |r| {
        // SAFETY: SIOCGIFHWADDR fills `ifru_hwaddr`.
        let sa = unsafe { r.ifr_ifru.ifru_hwaddr };
        let d = sa.sa_data;
        (
            sa.sa_family,
            MacAddr([
                d[0] as u8, d[1] as u8, d[2] as u8, d[3] as u8, d[4] as u8, d[5] as u8,
            ]),
        )
    })
    .map_err(io_err("reading the MAC address"))?;
    if hwtype != libc::ARPHRD_ETHER {
        return Err(LinkError::NotEthernet {
            ifname: name.to_string(),
            hwtype,
        });
    }
    // SAFETY: SIOCGIFMTU fills `ifru_mtu`.
    let mtu = ifreq_get(raw, cname, libc::SIOCGIFMTU, |r| unsafe {
        r.ifr_ifru.ifru_mtu
    })
    .map_err(io_err("reading the MTU"))? as usize;
    check_mtu(mtu)?;
    // SAFETY: SIOCGIFFLAGS fills `ifru_flags`.
    let flags = ifreq_get(raw, cname, libc::SIOCGIFFLAGS, |r| unsafe {
        r.ifr_ifru.ifru_flags
    })
    .map_err(io_err("reading the interface flags"))?;
    if i32::from(flags) & libc::IFF_UP == 0 {
        return Err(LinkError::InterfaceDown {
            ifname: name.to_string(),
        });
    }
    Ok((mac, mtu))
}

/// Sets up the receive and transmit rings of `fd` for frames of `mtu` and
/// maps them; on failure, says which step failed.
fn setup_rings(
    raw: RawFd,
    version: Version,
    config: &PacketConfig,
    mtu: usize,
) -> Result<(Mapping, RxRing, TxRing), (&'static str, io::Error)> {
    let max_frame = mtu + HEADER_LEN;
    let page = page_size();
    let blocks = config.rx_blocks.max(2);
    let (rx_req, rx_frame_size) = match version {
        Version::V3 => {
            // Blocks of rx_block_size holding frames of any length;
            // frame_size only sets the (unused) frame count.
            let block = config.rx_block_size.max(page).next_power_of_two();
            if block < 2 * (max_frame + 128) {
                return Err((
                    "sizing the receive ring",
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("a {block}-byte block is too small for MTU {mtu}"),
                    ),
                ));
            }
            (
                ring_req(block, blocks, 2048, config.rx_block_timeout_ms.max(1)),
                0,
            )
        }
        Version::V2 => {
            // The same bytes in total, as fixed slots.
            let frame_size = Version::rx_v2_frame_size(max_frame);
            let block = (frame_size * 8).next_power_of_two().max(page);
            let total = config.rx_block_size.max(page) * blocks;
            (
                ring_req(block, (total / block).max(2), frame_size, 0),
                frame_size,
            )
        }
    };
    setsockopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, &rx_req)
        .map_err(|e| ("setting up the receive ring", e))?;
    // Transmit ring: fixed slots of header + frame, 16-byte aligned.
    let tx_frame_size = (version.tx_data_offset() + max_frame + 15) & !15;
    let tx_block = (tx_frame_size * 8).next_power_of_two().max(page);
    let per_block = tx_block / tx_frame_size;
    let tx_blocks = config.tx_frames.max(per_block).div_ceil(per_block);
    let tx_req = ring_req(tx_block, tx_blocks, tx_frame_size, 0);
    setsockopt(raw, libc::SOL_PACKET, libc::PACKET_TX_RING, &tx_req)
        .map_err(|e| ("setting up the transmit ring", e))?;
    let (rx_block, rx_blocks) = (rx_req.tp_block_size as usize, rx_req.tp_block_nr as usize);
    let rx_len = rx_block * rx_blocks;
    let map = Mapping::new(raw, rx_len + tx_block * tx_blocks)
        .map_err(|e| ("mapping the packet rings", e))?;
    let rx = match version {
        // SAFETY: the mapping starts with the receive ring of exactly
        // these dimensions; the caller keeps `map` for as long as the views
        // (the link drops it after them).
        Version::V3 => unsafe { RxRing::blocks(map.base(), rx_block, rx_blocks) },
        // SAFETY: as above, with V2 slots of `rx_frame_size`.
        Version::V2 => unsafe { RxRing::frames(map.base(), rx_block, rx_frame_size, rx_blocks) },
    };
    // SAFETY: the transmit ring follows the receive ring in the mapping,
    // with the dimensions given to PACKET_TX_RING; kept alive likewise.
    let tx = unsafe {
        TxRing::new(
            version,
            map.base().add(rx_len),
            tx_block,
            tx_frame_size,
            tx_blocks,
        )
    };
    Ok((map, rx, tx))
}

/// Checks an interface name and makes it a C string.
fn interface_name(name: &str) -> Result<CString, LinkError> {
    let bad = name.is_empty()
        || name.len() >= libc::IFNAMSIZ
        || name
            .bytes()
            .any(|b| b == b'/' || b == 0 || b.is_ascii_whitespace());
    if bad {
        return Err(LinkError::BadInterfaceName {
            ifname: name.to_string(),
        });
    }
    CString::new(name).map_err(|_| LinkError::BadInterfaceName {
        ifname: name.to_string(),
    })
}

/// Runs an `SIOCGIF*` ioctl for `name` on `fd` and reads the answer.
fn ifreq_get<T>(
    fd: RawFd,
    name: &CString,
    req: libc::c_ulong,
    read: impl FnOnce(&libc::ifreq) -> T,
) -> io::Result<T> {
    // SAFETY: all-zero is a valid ifreq.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(name.as_bytes()) {
        *d = *s as libc::c_char;
    }
    // SAFETY: `r` is a valid ifreq with a NUL-terminated name (checked
    // shorter than IFNAMSIZ); the kernel writes only within it.
    if unsafe { libc::ioctl(fd, req, &mut r) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(read(&r))
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: passes a pointer to a live `T` with its exact size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A ring request; TPACKET_V2 reads only its first four fields.
fn ring_req(block: usize, blocks: usize, frame: usize, timeout_ms: u32) -> libc::tpacket_req3 {
    libc::tpacket_req3 {
        tp_block_size: block as u32,
        tp_block_nr: blocks as u32,
        tp_frame_size: frame as u32,
        tp_frame_nr: (block / frame * blocks) as u32,
        tp_retire_blk_tov: timeout_ms,
        tp_sizeof_priv: 0,
        tp_feature_req_word: 0,
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_checked() {
        for bad in ["", "a/b", "eth 0", "0123456789abcdef", "e\0"] {
            let e = interface_name(bad).unwrap_err();
            assert!(
                e.to_string().contains("not a valid network interface name"),
                "{e}"
            );
        }
        assert!(interface_name("eth0").is_ok());
        assert!(interface_name("0123456789abcde").is_ok());
    }

    #[test]
    fn error_messages() {
        let e = LinkError::NeedsCapNetRaw {
            ifname: "eth0".into(),
        };
        assert_eq!(
            e.to_string(),
            "opening a raw socket on eth0 needs CAP_NET_RAW: run as root, or grant it \
             (setcap cap_net_raw+ep BINARY, or AmbientCapabilities=CAP_NET_RAW in a systemd unit)"
        );
        let e = LinkError::NoSuchInterface {
            ifname: "eth9".into(),
        };
        assert_eq!(
            e.to_string(),
            "no network interface named eth9 (list them with `ip link`)"
        );
        let e = LinkError::InterfaceDown {
            ifname: "eth1".into(),
        };
        assert_eq!(
            e.to_string(),
            "network interface eth1 is down (bring it up with `ip link set eth1 up`)"
        );
    }
}
