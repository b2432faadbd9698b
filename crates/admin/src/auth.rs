//! Bearer tokens on the TCP listener: compared in constant time; failures
//! answered 401, logged at most a few times a second, and an address that
//! keeps failing is answered 429 for a while.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use subtle::ConstantTimeEq;

use crate::api::Failure;
use crate::AdminError;

/// The shortest token accepted.
const MIN_TOKEN: usize = 16;
/// Failures from one address within [`WINDOW`] before it gets 429.
const MAX_FAILURES: u32 = 10;
/// How long failures are remembered (and how long 429 lasts).
const WINDOW: Duration = Duration::from_secs(60);

/// The API's bearer token.
#[derive(Clone)]
pub struct Token(Arc<Vec<u8>>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// Read the token from a file (one trailing newline dropped); at least
    /// 16 bytes.
    pub fn from_file(path: &Path) -> Result<Token, AdminError> {
        let err = |reason: String| AdminError::Token {
            path: path.to_path_buf(),
            reason,
        };
        let mut t = std::fs::read(path).map_err(|e| err(format!("cannot read it: {e}")))?;
        while t.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            t.pop();
        }
        Token::new(t).map_err(err)
    }

    /// A token from its bytes; at least 16.
    pub fn new(t: Vec<u8>) -> Result<Token, String> {
        if t.len() < MIN_TOKEN {
            return Err(format!(
                "the token is {} bytes; use at least {MIN_TOKEN} (e.g. head -c 32 /dev/urandom | base64 > FILE)",
                t.len()
            ));
        }
        if t.iter()
            .any(|b| b.is_ascii_whitespace() || !b.is_ascii_graphic())
        {
            return Err("the token must be printable ASCII without spaces".into());
        }
        Ok(Token(Arc::new(t)))
    }

    fn matches(&self, header: Option<&[u8]>) -> bool {
        let Some(h) = header else { return false };
        let Some(given) = h.strip_prefix(b"Bearer ") else {
            return false;
        };
        given.len() == self.0.len() && bool::from(given.ct_eq(&self.0))
    }
}

#[derive(Clone)]
struct Guard {
    token: Token,
    failures: Arc<Mutex<HashMap<IpAddr, (u32, Instant)>>>,
    last_log: Arc<Mutex<(Instant, u64)>>,
}

/// Whether a path is served without the token: the dashboard's page and
/// its assets (they hold no data; the page asks for the token).
fn public(path: &str) -> bool {
    path == "/" || path.starts_with("/assets/")
}

async fn check(State(g): State<Guard>, req: Request, next: Next) -> Response {
    if public(req.uri().path()) {
        return next.run(req).await;
    }
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let now = Instant::now();
    if let Some(ip) = ip {
        let mut f = g.failures.lock().unwrap_or_else(|e| e.into_inner());
        f.retain(|_, (_, t)| now.duration_since(*t) < WINDOW);
        if f.get(&ip).is_some_and(|(n, _)| *n >= MAX_FAILURES) {
            return Failure(
                StatusCode::TOO_MANY_REQUESTS,
                "too many requests with a wrong token from this address; wait a minute".into(),
            )
            .into_response();
        }
    }
    let header = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if g.token.matches(header) {
        return next.run(req).await;
    }
    if let Some(ip) = ip {
        let mut f = g.failures.lock().unwrap_or_else(|e| e.into_inner());
        let e = f.entry(ip).or_insert((0, now));
        e.0 += 1;
        e.1 = now;
    }
    {
        let mut l = g.last_log.lock().unwrap_or_else(|e| e.into_inner());
        if now.duration_since(l.0) >= Duration::from_millis(200) {
            tracing::warn!(
                peer = ?ip,
                path = %req.uri().path(),
                not_logged_since_last = l.1,
                "API request without a valid bearer token refused"
            );
            *l = (now, 0);
        } else {
            l.1 += 1;
        }
    }
    let mut r = Failure(
        StatusCode::UNAUTHORIZED,
        "this API needs the header Authorization: Bearer TOKEN (the token in the server's --api-token-file)".into(),
    )
    .into_response();
    r.headers_mut().insert(
        axum::http::header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    r
}

/// `app` with every non-public path behind the token.
pub(crate) fn protect(app: Router, token: Token) -> Router {
    let g = Guard {
        token,
        failures: Arc::default(),
        last_log: Arc::new(Mutex::new((Instant::now() - Duration::from_secs(1), 0))),
    };
    app.layer(axum::middleware::from_fn_with_state(g, check))
}
