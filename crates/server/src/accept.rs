//! Accepting TCP connections on the portals: the limits every portal
//! shares (connections per source address, sessions, connections in
//! login), the placement of a connection on a worker, and the hand-over
//! of an accepted socket to the login and its session.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use ethersan_proto::negotiate::TargetSettings;
use tokio::net::{TcpListener, TcpStream};
use tracing::warn;

use crate::config::Options;
use crate::registry::Registry;
use crate::{limits, placement, stats};

/// What every accept loop shares: the limits, the settings and where
/// connections run.
pub(crate) struct AcceptContext {
    registry: Arc<Registry>,
    options: Options,
    settings: Arc<ArcSwap<TargetSettings>>,
    /// Connections per source address, over every portal.
    limiter: Arc<limits::ConnectionLimiter>,
    refusals: Refusals,
    placement: Option<Arc<placement::Placement>>,
}

impl AcceptContext {
    /// What the accept loops of a server share; starts the pinned workers
    /// when the placement says so and they have not started yet (the
    /// shared runtime when they cannot start).
    pub(crate) fn new(
        registry: Arc<Registry>,
        options: Options,
        settings: Arc<ArcSwap<TargetSettings>>,
        workers: &placement::Workers,
    ) -> AcceptContext {
        let placement = workers.get();
        // Shared by every portal: the limit is per address, not per portal.
        AcceptContext {
            limiter: limits::ConnectionLimiter::new(options.max_connections_per_address),
            refusals: Refusals {
                per_address: limits::LogThrottle::new(Duration::from_secs(1)),
                sessions: limits::LogThrottle::new(Duration::from_secs(1)),
            },
            registry,
            options,
            settings,
            placement,
        }
    }
}

/// Accept connections on one portal until the task is aborted (the
/// portal removed, the server stopping).
pub(crate) async fn accept_loop(l: Arc<TcpListener>, ctx: Arc<AcceptContext>) {
    loop {
        match l.accept().await {
            Ok((sock, peer)) => admit(sock, peer, &ctx),
            // The listening socket was shut (the portal removed, the
            // server stopping): nothing more to accept, nothing wrong.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
            Err(e) => {
                warn!(%e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Admit an accepted connection, or close it before any PDU is read when
/// a limit says so (the log says so at most once a second, with how many
/// it did not mention).
fn admit(sock: TcpStream, peer: SocketAddr, ctx: &AcceptContext) {
    let options = &ctx.options;
    let Some(guard) = ctx.limiter.try_acquire(peer.ip()) else {
        ctx.registry
            .login_stats()
            .failed(stats::LoginFailure::RefusedLimit);
        if let Some(more) = ctx.refusals.per_address.allow() {
            warn!(
                peer = %peer.ip(),
                limit = options.max_connections_per_address,
                refused_since_last_warning = more,
                "too many connections from one address; refusing connection"
            );
        }
        return;
    };
    if ctx.registry.session_count() >= options.max_sessions {
        ctx.registry
            .login_stats()
            .failed(stats::LoginFailure::RefusedLimit);
        if let Some(more) = ctx.refusals.sessions.allow() {
            warn!(%peer, refused_since_last_warning = more, "session limit reached; refusing connection");
        }
        return;
    }
    let Some(slot) = crate::login_slot(&ctx.registry, &peer.to_string()) else {
        return;
    };
    let registry = ctx.registry.clone();
    let options = options.clone();
    // The settings of the moment: a reload applies to the connections
    // after it.
    let settings = ctx.settings.load_full();
    match &ctx.placement {
        // The socket moves to the worker's own reactor.
        Some(p) => match sock.into_std() {
            Ok(std_sock) => p.spawn(async move {
                // Held until the connection ends, however.
                let _guard = guard;
                match TcpStream::from_std(std_sock) {
                    Ok(sock) => {
                        handle_connection(sock, peer, registry, options, settings, slot).await
                    }
                    Err(e) => warn!(%peer, %e, "cannot move connection to its worker"),
                }
            }),
            Err(e) => warn!(%peer, %e, "cannot move connection to its worker"),
        },
        None => {
            tokio::spawn(async move {
                // Held until the connection ends, however.
                let _guard = guard;
                handle_connection(sock, peer, registry, options, settings, slot).await;
            });
        }
    }
}

/// Warnings about refused connections, each at most once a second.
struct Refusals {
    per_address: limits::LogThrottle,
    sessions: limits::LogThrottle,
}

async fn handle_connection(
    sock: TcpStream,
    peer: SocketAddr,
    registry: Arc<Registry>,
    options: Options,
    settings: Arc<TargetSettings>,
    slot: limits::LoginSlot,
) {
    let _ = sock.set_nodelay(true);
    let local = sock.local_addr().ok();
    let (rd, wr) = sock.into_split();
    let conn = crate::Connection {
        peer: peer.to_string(),
        local,
        channel_level: None,
        login_slot: Some(slot),
    };
    crate::serve_stream(rd, wr, conn, registry, options, settings).await;
}
