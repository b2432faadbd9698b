//! ethersan's management plane: a JSON API over a running server's
//! [`Control`] (what `ethersan ctl` talks to), `/metrics` for Prometheus
//! and the web dashboard.
//!
//! The API listens on a unix socket (mode 0600: the file's permissions
//! are the access control) and optionally on TCP, where every request
//! but the dashboard's static page needs `Authorization: Bearer TOKEN`
//! (401 otherwise, logged and rate-limited per address). The OpenAPI
//! description ([`openapi::ApiDoc`]) is generated from the handlers.
#![warn(missing_docs, unreachable_pub)]

pub mod api;
mod auth;
pub mod client;
pub mod dashboard;
pub mod metrics;
pub mod openapi;
mod procfs;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::routing::{delete, get, post, put};
use axum::Router;
use ethersan_server::control::Control;
use tokio::net::{TcpListener, UnixListener};

pub use auth::Token;
pub use metrics::{render, serve_metrics};

/// What every handler shares: the server's control.
#[derive(Clone, Debug)]
pub struct AdminState {
    /// The operations on the running server.
    pub control: Arc<Control>,
    /// The native transport's endpoints (their channels' counters are
    /// metrics).
    pub native: Arc<Vec<ethersan_endpoint::Endpoint>>,
}

impl AdminState {
    /// The state for a server's control.
    pub fn new(control: Arc<Control>) -> Self {
        AdminState {
            control,
            native: Arc::default(),
        }
    }

    /// The same, with the native transport's endpoints.
    pub fn with_native(mut self, endpoints: Vec<ethersan_endpoint::Endpoint>) -> Self {
        self.native = Arc::new(endpoints);
        self
    }
}

/// Errors starting the management listeners.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The unix socket could not be made.
    #[error(
        "cannot listen on the API socket {path}: {cause}; choose another with --api-socket PATH"
    )]
    Socket {
        /// Its path.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// The token file could not be read or is too short.
    #[error("API token file {path}: {reason}")]
    Token {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The API's routes (no authentication: the listeners add it).
pub fn api_router() -> Router<AdminState> {
    use api::*;
    Router::new()
        .route("/api/v1/targets", get(list_targets).post(add_target))
        .route("/api/v1/targets/{target}", delete(remove_target))
        .route(
            "/api/v1/targets/{target}/luns",
            get(list_luns).post(add_lun),
        )
        .route("/api/v1/targets/{target}/luns/{lun}", delete(remove_lun))
        .route("/api/v1/targets/{target}/luns/{lun}/size", put(resize_lun))
        .route(
            "/api/v1/targets/{target}/acl",
            get(list_acl).post(grant).delete(revoke),
        )
        .route("/api/v1/chap", put(set_chap).delete(clear_chap))
        .route("/api/v1/portals", get(list_portals).post(add_portal))
        .route("/api/v1/portals/{address}", delete(remove_portal))
        .route("/api/v1/sessions", get(list_sessions))
        .route("/api/v1/sessions/{id}", delete(logout))
        .route("/api/v1/rescan", post(rescan))
        .route("/api/v1/save", post(save))
        .route("/api/openapi.json", get(openapi::serve))
        .route("/metrics", get(metrics::handler))
        .route("/api/v1/stats/stream", get(dashboard::stream))
        .route("/", get(dashboard::index))
        .route("/assets/{file}", get(dashboard::asset))
}

/// Everything the API listeners serve, with the state.
pub fn router(state: AdminState) -> Router {
    api_router()
        .fallback(|| async {
            api::Failure(
                axum::http::StatusCode::NOT_FOUND,
                "no such API path (GET /api/openapi.json describes the API)".into(),
            )
        })
        .with_state(state)
}

/// Serve the API on a unix socket at `path` (an old socket file there is
/// replaced; the new one is mode 0600) until the [`UnixApi`] is dropped,
/// which removes the socket file.
pub fn serve_unix(path: &Path, state: AdminState) -> Result<UnixApi, AdminError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let err = |cause| AdminError::Socket {
        path: path.to_path_buf(),
        cause,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    // A socket left by a server that did not stop cleanly: a live one
    // answers, so it is only removed when nothing listens.
    if path.exists() && std::os::unix::net::UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    let made = std::fs::symlink_metadata(path).map_err(err)?;
    let app = router(state).layer(axum::middleware::from_fn(|req, next| {
        in_span("socket", req, next)
    }));
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(%e, "the API socket stopped");
        }
    });
    Ok(UnixApi {
        task,
        path: path.to_path_buf(),
        file: (made.dev(), made.ino()),
    })
}

/// The API served on a unix socket ([`serve_unix`]). Dropping it stops
/// serving and removes the socket file, unless another server has put
/// its own socket there since.
#[derive(Debug)]
pub struct UnixApi {
    task: tokio::task::JoinHandle<()>,
    path: std::path::PathBuf,
    /// The socket file's device and inode.
    file: (u64, u64),
}

impl Drop for UnixApi {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        self.task.abort();
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if (m.dev(), m.ino()) == self.file {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// Serve the API on TCP, every request but the dashboard's page needing
/// the bearer `token`.
pub fn serve_tcp(
    listener: TcpListener,
    state: AdminState,
    token: Token,
) -> tokio::task::JoinHandle<()> {
    let app = auth::protect(router(state), token).layer(axum::middleware::from_fn(|req, next| {
        in_span("api-token", req, next)
    }));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        {
            tracing::warn!(%e, "the API listener stopped");
        }
    })
}

/// Run a request in a span naming the interface it came through (`socket`,
/// `api-token`) and the client's address, so that the changes it makes are
/// logged with who made them (`admin{via=socket}: configuration changed: …`).
async fn in_span(
    via: &'static str,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use tracing::Instrument;
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
    let span = tracing::info_span!(
        "admin",
        via = %via,
        peer = peer.map(tracing::field::display)
    );
    next.run(req).instrument(span).await
}
