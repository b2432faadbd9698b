//! The path MTU a UDP medium uses when none is configured: the MTU of the
//! interface the traffic crosses, as the kernel's routing table says. TCP
//! takes its segment size from the route by itself; without this the native
//! transport sent 1,472-byte datagrams over loopback (MTU 65,536) and
//! jumbo-frame links alike, ~720 frames per MiB where 17 would do.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use ethersan_link::DEFAULT_MTU;

/// The smallest path MTU used: IPv6's minimum link MTU.
pub const MIN_MTU: usize = 1280;
/// The largest path MTU used: an IP packet's length field (loopback's MTU,
/// 65,536, is one more).
pub const MAX_MTU: usize = 65_535;

/// The MTU of the route to `peer` (`IP_MTU` / `IPV6_MTU` of a socket
/// connected to it; nothing is sent), clamped to [`MIN_MTU`]..=[`MAX_MTU`].
/// `None` if the kernel has no route or does not say.
pub fn route_mtu(peer: SocketAddr) -> Option<usize> {
    let bind: SocketAddr = if peer.is_ipv6() {
        "[::]:0".parse().ok()?
    } else {
        "0.0.0.0:0".parse().ok()?
    };
    let sock = UdpSocket::bind(bind).ok()?;
    sock.connect(peer).ok()?;
    let (level, name) = if peer.is_ipv6() {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU)
    };
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `sock` is an open socket for the whole call; `mtu` and `len`
    // are live locals of the sizes `len` states, which the kernel writes.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            name,
            std::ptr::from_mut(&mut mtu).cast(),
            &mut len,
        )
    };
    (rc == 0 && mtu > 0).then(|| clamp(mtu as usize))
}

/// The path MTU for a UDP socket bound to `local` with no MTU configured:
/// the MTU of the interface holding that address (loopback's for a
/// loopback address), or [`DEFAULT_MTU`] for a wildcard address (any
/// interface may carry the traffic) or when it cannot be found. A channel
/// uses the smaller of both ends' figures, so the initiator's own route
/// MTU still bounds what a wildcard-bound target sends it.
pub fn bound_mtu(local: IpAddr) -> usize {
    if local.is_unspecified() {
        return DEFAULT_MTU;
    }
    if local.is_loopback() {
        return route_mtu(SocketAddr::new(local, 9)).unwrap_or(DEFAULT_MTU);
    }
    interface_of(local)
        .and_then(|name| std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok())
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map(clamp)
        .unwrap_or(DEFAULT_MTU)
}

fn clamp(mtu: usize) -> usize {
    mtu.clamp(MIN_MTU, MAX_MTU)
}

/// The name of the interface that holds address `ip` (`getifaddrs`).
fn interface_of(ip: IpAddr) -> Option<String> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a live local the call fills with a list it
    // allocates; on success the list is freed below, once, after the walk.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list `getifaddrs` returned, not yet
        // freed; nodes are valid until `freeifaddrs`.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points at a sockaddr whose
        // `sa_family` says which of the two layouts read below it has.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes())
                }
                libc::AF_INET6 => {
                    let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    IpAddr::from(sin6.sin6_addr.s6_addr)
                }
                _ => continue,
            }
        };
        if addr == ip {
            // SAFETY: `ifa_name` is non-null and a NUL-terminated string
            // owned by the list, read before the list is freed.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            found = Some(name.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: `head` came from a successful `getifaddrs` and is freed once;
    // no reference into the list outlives this call.
    unsafe { libc::freeifaddrs(head) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_routes_use_the_loopback_mtu() {
        // The loopback device's MTU on Linux is 65,536 unless changed; read
        // it to compare with what the route says.
        let lo: usize = std::fs::read_to_string("/sys/class/net/lo/mtu")
            .expect("lo's MTU")
            .trim()
            .parse()
            .expect("a number");
        let want = clamp(lo);
        assert_eq!(route_mtu("127.0.0.1:3262".parse().unwrap()), Some(want));
        assert_eq!(bound_mtu("127.0.0.1".parse().unwrap()), want);
    }

    #[test]
    fn a_wildcard_address_keeps_the_default() {
        assert_eq!(bound_mtu("0.0.0.0".parse().unwrap()), DEFAULT_MTU);
        assert_eq!(bound_mtu("::".parse().unwrap()), DEFAULT_MTU);
    }

    #[test]
    fn an_address_no_interface_holds_keeps_the_default() {
        // TEST-NET-3 (RFC 5737): documentation only, never assigned.
        assert_eq!(bound_mtu("203.0.113.77".parse().unwrap()), DEFAULT_MTU);
        assert_eq!(interface_of("203.0.113.77".parse().unwrap()), None);
    }

    #[test]
    fn the_loopback_address_is_found_on_its_interface() {
        let name = interface_of("127.0.0.1".parse().unwrap()).expect("lo holds 127.0.0.1");
        let mtu: usize = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(mtu >= MIN_MTU, "{name}: {mtu}");
    }
}
