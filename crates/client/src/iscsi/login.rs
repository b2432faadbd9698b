//! Logging in to the target a URL names: over TCP (`iscsi://`) or over
//! the native transport (`eth://`, `udp://`, through [`crate::native`]),
//! and the error of a failed login with what to do about it.

use anyhow::bail;
use ethersan_channel::Level;
use ethersan_initiator::{connect, Session};

use crate::options::{ConnectArgs, CLIENT_IQN};
use crate::url::{IscsiUrl, Transport};

/// A session logged in, and the security level of the native transport
/// channel under it (`None`: TCP).
#[derive(Clone, Debug)]
pub struct LoggedIn {
    /// The session.
    pub session: Session,
    /// The native channel's security level; `None` over TCP.
    pub channel: Option<Level>,
}

/// Whether `s` is a URL of an iSCSI session: over TCP (`iscsi://`) or
/// the native transport (`eth://`, `udp://`).
pub fn is_iscsi_url(s: &str) -> bool {
    ["iscsi://", "eth://", "udp://"]
        .iter()
        .any(|p| s.starts_with(p))
}

/// Log in to the target a URL names (a new session each call).
pub async fn login(url: &IscsiUrl, how: &ConnectArgs) -> anyhow::Result<LoggedIn> {
    if url.target.is_empty() {
        bail!("the URL names no target: iscsi://host[:port]/TARGET/LUN");
    }
    let opts = how.options(Some(url))?;
    let what = format!("login to {}", url.target);
    if url.transport != Transport::Tcp {
        let keys = how.group_keys()?;
        let place = match &url.transport {
            Transport::Eth(_) => format!("eth://{}", url.host),
            _ => format!("udp://{}", url.portal()),
        };
        return match crate::native::connect(url, &keys, &opts).await {
            Ok((session, level)) => Ok(LoggedIn {
                session,
                channel: Some(level),
            }),
            Err(crate::native::Error::Login(e)) => Err(login_error(e, &what, &place)),
            Err(e) => Err(anyhow::anyhow!("cannot reach {place} for {what}: {e}")),
        };
    }
    let portal = url.portal();
    match connect(&portal, &opts).await {
        Ok(session) => Ok(LoggedIn {
            session,
            channel: None,
        }),
        Err(e) => Err(login_error(e, &what, &portal)),
    }
}

/// The error of a failed login to `target` at `portal`, with what to do.
pub fn login_error(e: ethersan_initiator::Error, what: &str, portal: &str) -> anyhow::Error {
    use ethersan_initiator::Error as E;
    match &e {
        E::Auth(_) => anyhow::anyhow!("{what} at {portal} failed: {e}"),
        E::LoginRefused {
            class: 2, detail: 1, ..
        } => anyhow::anyhow!(
            "{what} at {portal} refused: {e} (give CHAP credentials with --chap USER:SECRET, $ETHERSAN_CHAP or iscsi://USER%SECRET@host/..., and check them)"
        ),
        E::LoginRefused {
            class: 2, detail: 2, ..
        } => anyhow::anyhow!(
            "{what} at {portal} refused: {e} (the target's access rules do not admit initiator {CLIENT_IQN} from this host: on the server, ethersan ctl acl ls TARGET shows them and ethersan ctl acl add TARGET {CLIENT_IQN} admits this client, or add this host's network ADDR/LEN)"
        ),
        E::LoginRefused { .. } => anyhow::anyhow!("{what} at {portal} refused: {e}"),
        E::Timeout { .. } => anyhow::anyhow!(
            "{what} at {portal}: {e} (is the target running and not overloaded? --timeout waits longer)"
        ),
        _ => anyhow::anyhow!("cannot reach {portal} for {what}: {e}"),
    }
}
