//! The daemon and its process: SIGINT/SIGTERM end it, SIGHUP reloads its
//! configuration, and the service manager (systemd, `Type=notify`) is told
//! when it is ready, reloading and stopping (sd_notify(3)).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ethersan_server::config::Config;
use ethersan_server::control::Control;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Resolves at the first SIGINT (Ctrl-C) or SIGTERM: when `ethersan serve`
/// stops. The handlers are installed when this is called (inside a tokio
/// runtime), not when the future is first polled: call it before the
/// server announces itself, so that a signal sent as soon as it is ready
/// stops it cleanly rather than killing it.
pub fn termination() -> impl std::future::Future<Output = ()> + Send {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = int.recv() => {},
                    _ = term.recv() => {},
                }
            }
            (term, int) => {
                if let Err(e) = term.as_ref().and(int.as_ref()) {
                    tracing::warn!("cannot handle SIGTERM or SIGINT: {e}");
                }
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

/// Tell the service manager (systemd's `$NOTIFY_SOCKET`) how the server
/// is; without a service manager, nothing.
pub(crate) fn notify(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!("cannot notify the service manager: {e}");
    }
}

/// The SIGHUP task: each SIGHUP applies `file` again (see [`reload`]) on
/// the blocking pool, then counts one more in `reloaded`.
pub(crate) fn on_sighup(
    control: Arc<Control>,
    file: Option<PathBuf>,
    reloaded: watch::Sender<u64>,
) -> std::io::Result<JoinHandle<()>> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let (c, file) = (control.clone(), file.clone());
            // Its changes are logged as made through SIGHUP.
            let span = tracing::info_span!("admin", via = %"SIGHUP");
            let _ =
                tokio::task::spawn_blocking(move || span.in_scope(|| reload(&c, file.as_deref())))
                    .await;
            reloaded.send_modify(|n| *n += 1);
        }
    }))
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
enum ReloadError {
    /// The file could not be read or is not a good configuration.
    #[error(transparent)]
    Config(#[from] ethersan_server::config::ConfigError),
    /// The new configuration could not be applied.
    #[error(transparent)]
    Apply(#[from] ethersan_server::ServerError),
}

/// SIGHUP: apply the configuration file again (with `--config`), then
/// look at every LUN's size again.
pub(crate) fn reload(control: &Control, file: Option<&Path>) {
    let now = sd_notify::NotifyState::monotonic_usec_now().ok();
    let mut states = vec![sd_notify::NotifyState::Reloading];
    states.extend(now);
    notify(&states);
    if let Some(path) = file {
        let applied = Config::from_toml_file(path)
            .map_err(ReloadError::from)
            .and_then(|c| Ok(control.reload(c)?));
        match applied {
            Ok(r) => {
                for c in &r.changed {
                    tracing::info!("reload: {c}");
                }
                if r.changed.is_empty() {
                    tracing::info!("reload: {} has no changes to apply", path.display());
                }
                if !r.needs_restart.is_empty() {
                    tracing::warn!(
                        "reload: changes to {} take effect at the next restart",
                        r.needs_restart.join(" and ")
                    );
                }
            }
            Err(e) => tracing::error!(
                "reload of {} failed, nothing changed: {}",
                path.display(),
                crate::chain(&e)
            ),
        }
    }
    control.rescan();
    notify(&[sd_notify::NotifyState::Ready]);
}
