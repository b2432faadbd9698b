//! Counts of logins and connections for the management plane's metrics:
//! relaxed atomics bumped once per login or connection, never on the
//! command path.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a login ended without a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginFailure {
    /// CHAP (or another method) failed: status 0x0201.
    Authentication,
    /// The initiator may not use the target (access list): 0x0202.
    NotAuthorized,
    /// No such target: 0x0203.
    NotFound,
    /// Any other rejection: bad keys, version, session, stage.
    Negotiation,
    /// The login did not finish within the login timeout.
    Timeout,
    /// The connection failed or closed during the login.
    Connection,
    /// The connection was refused before its login (per-address
    /// connection limit or session limit).
    RefusedLimit,
}

impl LoginFailure {
    /// Every reason, in [`LoginSnapshot::failures`] order.
    pub const ALL: [LoginFailure; 7] = [
        LoginFailure::Authentication,
        LoginFailure::NotAuthorized,
        LoginFailure::NotFound,
        LoginFailure::Negotiation,
        LoginFailure::Timeout,
        LoginFailure::Connection,
        LoginFailure::RefusedLimit,
    ];

    /// The reason's name (a metric label value).
    pub fn name(self) -> &'static str {
        match self {
            LoginFailure::Authentication => "authentication",
            LoginFailure::NotAuthorized => "not_authorized",
            LoginFailure::NotFound => "not_found",
            LoginFailure::Negotiation => "negotiation",
            LoginFailure::Timeout => "timeout",
            LoginFailure::Connection => "connection",
            LoginFailure::RefusedLimit => "refused_limit",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Logins, login failures by reason, open connections and CHAP back-off
/// waits, since the server started.
#[derive(Debug, Default)]
pub struct LoginStats {
    logins: AtomicU64,
    failures: [AtomicU64; 7],
    /// Open connections: TCP (iSCSI) and native transport streams.
    connections: [AtomicU64; 2],
    auth_delays: AtomicU64,
    auth_delay_us: AtomicU64,
}

/// A copy of [`LoginStats`] at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoginSnapshot {
    /// Logins that made a session (discovery ones included).
    pub logins: u64,
    /// Failed logins by reason, in [`LoginFailure::ALL`] order.
    pub failures: [u64; 7],
    /// Connections open now (TCP and native streams, logged in or not).
    pub connections: u64,
    /// Of those, native transport streams.
    pub native_connections: u64,
    /// Logins delayed by the back-off after failed authentications.
    pub auth_delays: u64,
    /// The sum of those delays, µs.
    pub auth_delay_us: u64,
}

impl LoginStats {
    /// Count a login that made a session.
    pub fn login(&self) {
        self.logins.fetch_add(1, Ordering::Relaxed);
    }

    /// Count a failed login.
    pub fn failed(&self, why: LoginFailure) {
        self.failures[why.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Count a login delayed by the authentication back-off.
    pub fn delayed(&self, wait: std::time::Duration) {
        self.auth_delays.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
        self.auth_delay_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Count a connection (a native transport stream when `native`)
    /// open until the guard is dropped.
    pub fn connection(self: &std::sync::Arc<Self>, native: bool) -> ConnectionCount {
        let i = usize::from(native);
        self.connections[i].fetch_add(1, Ordering::Relaxed);
        ConnectionCount(self.clone(), i)
    }

    /// The counts now.
    pub fn snapshot(&self) -> LoginSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LoginSnapshot {
            logins: l(&self.logins),
            failures: std::array::from_fn(|i| l(&self.failures[i])),
            connections: l(&self.connections[0]) + l(&self.connections[1]),
            native_connections: l(&self.connections[1]),
            auth_delays: l(&self.auth_delays),
            auth_delay_us: l(&self.auth_delay_us),
        }
    }
}

/// One open connection in [`LoginStats`]; uncounted when dropped.
#[derive(Debug)]
pub struct ConnectionCount(std::sync::Arc<LoginStats>, usize);

impl Drop for ConnectionCount {
    fn drop(&mut self) {
        self.0.connections[self.1].fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_logins_failures_and_connections() {
        let s = std::sync::Arc::new(LoginStats::default());
        s.login();
        s.failed(LoginFailure::Authentication);
        s.failed(LoginFailure::RefusedLimit);
        s.failed(LoginFailure::RefusedLimit);
        s.delayed(std::time::Duration::from_millis(2));
        let c = s.connection(true);
        let snap = s.snapshot();
        assert_eq!(snap.logins, 1);
        assert_eq!(snap.failures[0], 1);
        assert_eq!(snap.failures[6], 2);
        assert_eq!(
            (
                snap.connections,
                snap.native_connections,
                snap.auth_delays,
                snap.auth_delay_us
            ),
            (1, 1, 1, 2000)
        );
        drop(c);
        assert_eq!(s.snapshot().connections, 0);
        for (i, r) in LoginFailure::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }
}
