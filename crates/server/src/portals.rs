//! The server's TCP portals, live: listed, added and removed while the
//! server runs (the management API and the SIGHUP reload use this).
//!
//! A [`Portals`] handle comes from [`crate::Server::portals`] and may be
//! cloned and kept; it works before [`crate::Server::run`] (a portal added
//! then starts accepting when the server runs) and while it runs (a portal
//! added accepts at once). Every portal shares the server's limits: the
//! connections per source address, the session limit, the cap on
//! connections in login, and the placement of connections on workers.
//!
//! Removing a portal closes its listening socket at once: new connections
//! to it are refused. Sessions already connected through it go on until
//! they end by themselves; removing a portal never ends a session.
//!
//! What initiators are told (SendTargets' `TargetAddress`) follows the
//! live list: each portal's advertised address when it has one (NAT,
//! containers), else the address it listens on. A portal on every address
//! of the host (`0.0.0.0`, `[::]`) is never announced as such, which no
//! initiator can connect to: it is announced as the address the asking
//! connection came in on (as LIO does), or, where there is no such address
//! (the native transport), as the host's own addresses
//! ([`PortalInfo::announced`]).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tracing::info;

use crate::accept::AcceptContext;
pub use crate::portal::{host_addresses, PortalInfo};
use crate::registry::Registry;

/// Why a portal could not be added, changed or removed.
#[derive(Debug, thiserror::Error)]
pub enum PortalError {
    /// A portal already listens on this address.
    #[error("already listening on {address}: remove that portal first, or choose another address")]
    AlreadyListening {
        /// The address asked for.
        address: SocketAddr,
    },
    /// The address could not be bound.
    #[error("cannot listen on {address}: {cause}{}", crate::bind_hint(.cause, address))]
    Bind {
        /// The address asked for.
        address: SocketAddr,
        /// The OS error.
        cause: std::io::Error,
    },
    /// No portal listens on this address.
    #[error("no portal listens on {address}; the portals are: {listening}")]
    NotFound {
        /// The address asked for.
        address: SocketAddr,
        /// The portals there are, comma-separated.
        listening: String,
    },
    /// The portal is the only TCP portal left.
    #[error("{address} is the last TCP portal: add another portal before removing this one (without a portal no iSCSI initiator can connect)")]
    LastPortal {
        /// The address asked for.
        address: SocketAddr,
    },
    /// The server has stopped: nothing accepts connections any more.
    #[error("the server has stopped; start it again to add portals")]
    Stopped,
}

/// A live handle on the server's TCP portals; cheap to clone.
#[derive(Clone)]
pub struct Portals {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Portals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Portals")
            .field("portals", &self.list())
            .finish()
    }
}

struct Inner {
    registry: Arc<Registry>,
    /// The runtime the accept loops run on.
    handle: Handle,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    /// Set while the server runs: what every accept loop shares.
    running: Option<Arc<AcceptContext>>,
    stopped: bool,
}

struct Entry {
    /// The address asked for (port 0 possibly).
    requested: SocketAddr,
    info: PortalInfo,
    /// Held here as well as by the accept loop, so that the socket is
    /// still this one when [`Portals::remove`] shuts it.
    listener: Arc<TcpListener>,
    /// The accept loop, once the server runs.
    task: Option<JoinHandle<()>>,
}

impl Entry {
    /// Stop accepting: the listening socket is shut at once (new
    /// connections are refused from now on) and the accept loop ends.
    fn close(self) {
        // The loop first: woken by the shut socket, it would only find it
        // shut.
        if let Some(t) = self.task {
            t.abort();
        }
        shut_listener(&self.listener);
    }
}

/// Shut a listening socket now, whoever else still holds it: Linux
/// refuses new connections to it from here on and resets those waiting
/// in its backlog.
fn shut_listener(l: &TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: shutdown(2) on a descriptor `l` owns and keeps open for the
    // duration of the call; it touches no memory of ours. Its failure
    // (e.g. ENOTCONN on systems that refuse it) leaves the socket to be
    // closed when the accept loop drops it.
    unsafe {
        libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR);
    }
}

impl Portals {
    /// A handle for `registry`'s portals, on the current runtime.
    pub(crate) fn new(registry: Arc<Registry>, handle: Handle) -> Portals {
        Portals {
            inner: Arc::new(Inner {
                registry,
                handle,
                state: Mutex::new(State::default()),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The portals, in the order they were added.
    pub fn list(&self) -> Vec<PortalInfo> {
        self.lock().entries.iter().map(|e| e.info.clone()).collect()
    }

    /// Listen on `address` (port 0: a free port), announcing `advertise`
    /// in SendTargets instead when given. While the server runs the
    /// portal accepts at once. Returns the bound address.
    pub async fn add(
        &self,
        address: SocketAddr,
        advertise: Option<SocketAddr>,
    ) -> Result<SocketAddr, PortalError> {
        self.add_now(address, advertise)
    }

    /// [`add`](Self::add), from synchronous code (the reloader).
    pub(crate) fn add_now(
        &self,
        address: SocketAddr,
        advertise: Option<SocketAddr>,
    ) -> Result<SocketAddr, PortalError> {
        let mut st = self.lock();
        if st.stopped {
            return Err(PortalError::Stopped);
        }
        if address.port() != 0
            && st
                .entries
                .iter()
                .any(|e| e.info.address == address || e.requested == address)
        {
            return Err(PortalError::AlreadyListening { address });
        }
        let listener = Arc::new(self.bind(address)?);
        let bound = listener.local_addr().unwrap_or(address);
        let task = st
            .running
            .as_ref()
            .map(|ctx| self.spawn_accept(listener.clone(), ctx.clone()));
        if task.is_some() {
            info!(portal = %bound, advertise = advertise.map(tracing::field::display), "portal added; listening");
        }
        st.entries.push(Entry {
            requested: address,
            info: PortalInfo {
                address: bound,
                advertise,
            },
            listener,
            task,
        });
        self.publish(&st);
        Ok(bound)
    }

    /// Stop listening on `address` (the bound address, or the address it
    /// was added with): new connections there are refused at once;
    /// sessions already connected through it go on. The last TCP portal
    /// cannot be removed.
    pub fn remove(&self, address: SocketAddr) -> Result<(), PortalError> {
        let mut st = self.lock();
        let Some(i) = find(&st.entries, address) else {
            return Err(PortalError::NotFound {
                address,
                listening: listing(&st.entries),
            });
        };
        if st.entries.len() == 1 {
            return Err(PortalError::LastPortal { address });
        }
        let e = st.entries.remove(i);
        info!(portal = %e.info.address, "portal removed; connections through it go on");
        e.close();
        self.publish(&st);
        Ok(())
    }

    /// Announce `advertise` (or, with `None`, the listening address) for
    /// the portal on `address` in SendTargets answers from now on.
    pub fn set_advertise(
        &self,
        address: SocketAddr,
        advertise: Option<SocketAddr>,
    ) -> Result<(), PortalError> {
        let mut st = self.lock();
        let Some(i) = find(&st.entries, address) else {
            return Err(PortalError::NotFound {
                address,
                listening: listing(&st.entries),
            });
        };
        st.entries[i].info.advertise = advertise;
        self.publish(&st);
        Ok(())
    }

    /// Bind a listening socket now (std, then handed to the runtime).
    fn bind(&self, address: SocketAddr) -> Result<TcpListener, PortalError> {
        let err = |cause| PortalError::Bind { address, cause };
        // std sets SO_REUSEADDR on Unix, as tokio's bind does.
        let l = std::net::TcpListener::bind(address).map_err(err)?;
        l.set_nonblocking(true).map_err(err)?;
        let _rt = self.inner.handle.enter();
        TcpListener::from_std(l).map_err(err)
    }

    fn spawn_accept(&self, l: Arc<TcpListener>, ctx: Arc<AcceptContext>) -> JoinHandle<()> {
        self.inner.handle.spawn(crate::accept::accept_loop(l, ctx))
    }

    /// The server starts running: every portal accepts from now on.
    pub(crate) fn start(&self, ctx: Arc<AcceptContext>) {
        let mut st = self.lock();
        for i in 0..st.entries.len() {
            if st.entries[i].task.is_none() {
                let l = st.entries[i].listener.clone();
                st.entries[i].task = Some(self.spawn_accept(l, ctx.clone()));
            }
        }
        st.running = Some(ctx);
    }

    /// The server stops: no portal accepts any more, and none can be added.
    pub(crate) fn stop(&self) {
        let mut st = self.lock();
        st.stopped = true;
        st.running = None;
        for e in std::mem::take(&mut st.entries) {
            e.close();
        }
    }

    /// The live list to the registry (SendTargets, `portal_addrs`).
    fn publish(&self, st: &State) {
        self.inner
            .registry
            .set_portals(st.entries.iter().map(|e| e.info.clone()).collect());
    }
}

/// The entry for `address`: its bound address, or the one it was added
/// with (when that named a port).
fn find(entries: &[Entry], address: SocketAddr) -> Option<usize> {
    entries
        .iter()
        .position(|e| e.info.address == address)
        .or_else(|| {
            entries
                .iter()
                .position(|e| address.port() != 0 && e.requested == address)
        })
}

fn listing(entries: &[Entry]) -> String {
    if entries.is_empty() {
        return "(none)".into();
    }
    entries
        .iter()
        .map(|e| e.info.address.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn portal(address: &str, advertise: Option<&str>) -> PortalInfo {
        PortalInfo {
            address: a(address),
            advertise: advertise.map(a),
        }
    }

    #[test]
    fn a_wildcard_portal_is_announced_as_the_address_the_connection_reached() {
        let local = Some(a("10.1.2.3:3260"));
        // Through another portal: that address, this portal's port.
        assert_eq!(
            portal("0.0.0.0:3261", None).announced(local),
            [a("10.1.2.3:3261")]
        );
        // An IPv4 initiator on a dual-stack [::] portal shows as
        // ::ffff:10.1.2.3 locally; it is told 10.1.2.3.
        assert_eq!(
            portal("[::]:3260", None).announced(Some(a("[::ffff:10.1.2.3]:3260"))),
            [a("10.1.2.3:3260")]
        );
        assert_eq!(
            portal("[::]:3260", None).announced(Some(a("[2001:db8::7]:3260"))),
            [a("[2001:db8::7]:3260")]
        );
        // Advertised and specific portals are announced as they are.
        assert_eq!(
            portal("0.0.0.0:3260", Some("203.0.113.5:3260")).announced(local),
            [a("203.0.113.5:3260")]
        );
        assert_eq!(
            portal("127.0.0.1:3260", None).announced(local),
            [a("127.0.0.1:3260")]
        );
    }

    #[test]
    fn without_a_connection_address_a_wildcard_portal_names_the_hosts_addresses() {
        // An IPv6 connection cannot reach a 0.0.0.0 portal; the native
        // transport has no address: the host's IPv4 addresses stand in.
        for local in [None, Some(a("[2001:db8::7]:3260"))] {
            let got = portal("0.0.0.0:3260", None).announced(local);
            assert!(
                got.iter()
                    .all(|s| s.is_ipv4() && !s.ip().is_unspecified() && s.port() == 3260),
                "{got:?}"
            );
        }
        let got = host_addresses(a("[::]:3262"));
        assert!(
            got.iter()
                .all(|s| !s.ip().is_unspecified() && s.port() == 3262),
            "{got:?}"
        );
        // Every host has at least its loopback address.
        assert!(!host_addresses(a("0.0.0.0:1")).is_empty());
    }
}
