//! The one place a URL becomes a [`BlockTarget`]: the table of transports
//! by URL scheme. A new transport is a module with a [`Transport`] and
//! one line in [`TRANSPORTS`].

use crate::options::ConnectArgs;
use crate::target::{BlockTarget, OpenOptions, Transport};
use crate::{aoe, iscsi, nvme};

/// Every transport, by URL scheme.
pub static TRANSPORTS: &[&Transport] = &[&iscsi::TRANSPORT, &aoe::TRANSPORT, &nvme::TRANSPORT];

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
