//! The one place a URL becomes a [`BlockTarget`]: the table of transports
//! by URL scheme. A new transport is a module with a [`Transport`] and
//! one line in [`TRANSPORTS`].

use crate::options::ConnectArgs;
use crate::{aoe, iscsi, BlockTarget, BoxFuture};

/// How the caller wants a target opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// What starts the lines said when a session is replaced ("ethersan
    /// cp").
    pub program: &'static str,
    /// Send a command that lost its session again on a new one (where the
    /// transport has sessions); `bench` measures without.
    pub retry: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            program: "ethersan",
            retry: true,
        }
    }
}

/// Opens a target from a URL of its schemes.
pub type OpenFn = for<'a> fn(
    &'a str,
    &'a ConnectArgs,
    &'a OpenOptions,
) -> BoxFuture<'a, anyhow::Result<Box<dyn BlockTarget>>>;

/// One transport: its URL schemes and how to open a target from one.
pub struct Transport {
    /// Its name in reports (`bench`'s engine column): "iscsi", "aoe".
    pub name: &'static str,
    /// The URL prefixes it takes ("iscsi://", "aoe+unix:").
    pub schemes: &'static [&'static str],
    /// Its URL forms, for help texts and error messages.
    pub forms: &'static str,
    /// Open a target from a URL of its schemes.
    pub open: OpenFn,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .finish()
    }
}

/// Every transport, by URL scheme.
pub static TRANSPORTS: &[&Transport] = &[&iscsi::TRANSPORT, &aoe::TRANSPORT];

/// The transport whose scheme `spec` starts with.
pub fn transport_of(spec: &str) -> Option<&'static Transport> {
    TRANSPORTS
        .iter()
        .copied()
        .find(|t| t.schemes.iter().any(|s| spec.starts_with(s)))
}

/// Whether a command-line argument names a remote target (and so is
/// parsed by [`open`], errors included) rather than a local path.
pub fn is_url(spec: &str) -> bool {
    transport_of(spec).is_some()
}

/// Every transport's URL forms, for help texts and error messages.
pub fn url_forms() -> String {
    TRANSPORTS
        .iter()
        .map(|t| t.forms)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Open the target `spec` names: log in (iSCSI) or find it (AoE) and
/// learn its geometry.
pub async fn open(
    spec: &str,
    how: &ConnectArgs,
    opts: &OpenOptions,
) -> anyhow::Result<Box<dyn BlockTarget>> {
    match transport_of(spec) {
        Some(t) => (t.open)(spec, how, opts).await,
        None => anyhow::bail!("{spec:?} is not a URL of a target: give {}", url_forms()),
    }
}
