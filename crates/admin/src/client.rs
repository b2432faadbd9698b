//! A client of the management API (what `ethersan ctl` uses): one HTTP/1.1
//! request per call over the unix socket or TCP with a bearer token.

use std::path::PathBuf;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
pub use hyper::Method;
use hyper::Request;
use hyper_util::rt::TokioIo;

/// Where the API is.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// The server's unix socket.
    Unix(PathBuf),
    /// `http://HOST:PORT` with a bearer token.
    Tcp {
        /// `HOST:PORT`.
        authority: String,
        /// The token.
        token: String,
    },
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached.
    #[error("cannot reach the ethersan API at {at}: {cause}{hint}")]
    Connect {
        /// Where.
        at: String,
        /// The OS error.
        cause: std::io::Error,
        /// What to do.
        hint: &'static str,
    },
    /// The HTTP exchange failed.
    #[error("the API request failed: {0}")]
    Http(String),
    /// The server refused the request; the message is its answer.
    #[error("{message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The server's explanation.
        message: String,
    },
}

/// A response: status and JSON body (`null` when empty).
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: serde_json::Value,
}

impl Endpoint {
    fn describe(&self) -> String {
        match self {
            Endpoint::Unix(p) => p.display().to_string(),
            Endpoint::Tcp { authority, .. } => format!("http://{authority}"),
        }
    }

    /// Send one request; a status of 400 or more becomes
    /// [`ClientError::Refused`] with the server's message.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Answer, ClientError> {
        let connect_err = |cause: std::io::Error| {
            ClientError::Connect {
            at: self.describe(),
            hint: match self {
                Endpoint::Unix(_) => {
                    "; is `ethersan serve` running? (it prints its API socket at start; give it with --socket PATH)"
                }
                Endpoint::Tcp { .. } => "; is the server started with --api ADDR:PORT?",
            },
            cause,
        }
        };
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "ethersan")
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Endpoint::Tcp { token, .. } = self {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let data = body.map(|b| b.to_string()).unwrap_or_default();
        let req = req
            .body(Full::new(Bytes::from(data)))
            .map_err(|e| ClientError::Http(e.to_string()))?;
        let resp = match self {
            Endpoint::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(connect_err)?;
                send(s, req).await?
            }
            Endpoint::Tcp { authority, .. } => {
                let s = tokio::net::TcpStream::connect(authority.as_str())
                    .await
                    .map_err(connect_err)?;
                send(s, req).await?
            }
        };
        let status = resp.0;
        let body: serde_json::Value = if resp.1.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&resp.1).unwrap_or_else(|_| {
                serde_json::Value::String(String::from_utf8_lossy(&resp.1).into_owned())
            })
        };
        if status >= 400 {
            let message = body
                .get("error")
                .and_then(|e| e.as_str())
                .map(str::to_string)
                .unwrap_or_else(|| format!("the server answered {status}: {body}"));
            return Err(ClientError::Refused { status, message });
        }
        Ok(Answer { status, body })
    }
}

async fn send<S>(stream: S, req: Request<Full<Bytes>>) -> Result<(u16, Bytes), ClientError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ClientError::Http(e.to_string()))?;
    let driver = tokio::spawn(conn);
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| ClientError::Http(e.to_string()))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| ClientError::Http(e.to_string()))?
        .to_bytes();
    driver.abort();
    Ok((status, body))
}
