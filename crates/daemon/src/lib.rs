//! `ethersan serve`: the target server with everything around it, as one
//! [`Daemon`] that owns its tasks.
//!
//! [`Daemon::start`] turns a [`Config`] into a running server: the data
//! directory, the LUNs and the TCP portals ([`Server::bind`]), the AoE
//! link, the native transport's endpoints, the iSNS registration, the
//! management API (unix socket, TCP with a token, `/metrics`) over one
//! [`Control`], and the SIGHUP reload; it says where it serves (the
//! banner, or log events for log collectors), starts accepting and tells
//! the service manager it is ready.
//!
//! [`Daemon::shutdown`] stops them in a defined order ([`Stage`]): stop
//! accepting (portals, AoE, native) → end the sessions → flush every LUN
//! → deregister from iSNS → close the management plane (which removes the
//! API socket). `serve --check` is [`check`].
//!
//! This is its own crate because it needs the management plane
//! (`ethersan-admin`), which depends on the server crate: the server
//! cannot own what is built on it.
#![warn(missing_docs, unreachable_pub)]

mod banner;
mod check;
mod signals;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ethersan_server::config::Config;
use ethersan_server::control::Control;
use ethersan_server::Server;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;

pub use check::{check, CheckError};
pub use signals::termination;

/// Where the daemon's words to the operator go (one line each, without
/// the newline): `ethersan serve` writes them to stderr.
pub type Say = Arc<dyn Fn(&str) + Send + Sync>;

/// How a [`Daemon`] offers its management plane and talks to the operator.
#[derive(Clone)]
pub struct DaemonOptions {
    /// The configuration file it was started from: SIGHUP reads it again,
    /// `ctl save` writes it. `None`: configured from the command line.
    pub config_file: Option<PathBuf>,
    /// The management API's unix socket; `None`: `ethersan.sock` in the
    /// data directory, left out (with a warning) when another server
    /// holds it.
    pub api_socket: Option<PathBuf>,
    /// Also the management API on TCP, with the bearer token of
    /// `api_token_file`.
    pub api_tcp: Option<SocketAddr>,
    /// The file holding the TCP API's bearer token.
    pub api_token_file: Option<PathBuf>,
    /// `GET /metrics` without authentication on this address.
    pub metrics: Option<SocketAddr>,
    /// The log is read by a log collector (JSON lines): no banner, the
    /// portals as log events instead.
    pub json_logs: bool,
    /// Where the banner's lines go.
    pub say: Say,
}

impl Default for DaemonOptions {
    /// No configuration file, the default API socket, no TCP API or
    /// metrics, the banner on stderr.
    fn default() -> Self {
        DaemonOptions {
            config_file: None,
            api_socket: None,
            api_tcp: None,
            api_token_file: None,
            metrics: None,
            json_logs: false,
            say: Arc::new(|line| {
                use std::io::Write;
                // A closed stderr is not worth a panic.
                let _ = writeln!(std::io::stderr(), "{line}");
            }),
        }
    }
}

impl std::fmt::Debug for DaemonOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonOptions")
            .field("config_file", &self.config_file)
            .field("api_socket", &self.api_socket)
            .field("api_tcp", &self.api_tcp)
            .field("metrics", &self.metrics)
            .field("json_logs", &self.json_logs)
            .finish_non_exhaustive()
    }
}

/// Why a daemon could not start. Each message is the one `ethersan serve`
/// prints after `ethersan: `.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The data directory a LUN's file goes into could not be made.
    #[error(
        "cannot create the data directory {}; choose another with --data-dir DIR (data_dir in a config file)",
        .dir.display()
    )]
    DataDir {
        /// The directory.
        dir: PathBuf,
        /// Why not.
        #[source]
        cause: std::io::Error,
    },
    /// The server could not be built (a store, an identity, a portal).
    #[error(transparent)]
    Server(#[from] ethersan_server::ServerError),
    /// The AoE link or its devices.
    #[error(transparent)]
    Aoe(#[from] ethersan_server::aoe::AoeError),
    /// The native transport's links, UDP portals or group.
    #[error(transparent)]
    Native(#[from] ethersan_server::native::NativeError),
    /// An NVMe/TCP portal.
    #[error(transparent)]
    Nvme(#[from] ethersan_server::nvme::NvmeError),
    /// The management API (its socket, its token).
    #[error(transparent)]
    Admin(#[from] ethersan_admin::AdminError),
    /// The TCP API's address could not be bound.
    #[error("cannot listen on {addr} for the API (--api)")]
    ApiListen {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        cause: std::io::Error,
    },
    /// The metrics address could not be bound.
    #[error("cannot listen for metrics on {addr} (--metrics)")]
    MetricsListen {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        cause: std::io::Error,
    },
    /// The SIGHUP handler could not be installed.
    #[error(transparent)]
    Signal(std::io::Error),
}

/// One step of [`Daemon::shutdown`], in the order they are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Every portal's listening socket is shut, the AoE link task and the
    /// native transport's accepting tasks have ended, and the NVMe/TCP
    /// listeners and connections are closed.
    StopAccepting,
    /// Every session was told to end and has ended (at most 10 s).
    EndSessions,
    /// Every LUN's store was flushed.
    Flush,
    /// The iSNS registration was withdrawn (when there was one).
    Deregister,
    /// The management plane is closed: the SIGHUP handler, the TCP API and
    /// metrics listeners have ended, the API socket is removed.
    CloseManagement,
}

/// A running `ethersan serve`: the server and every task around it, which
/// it owns and stops in order ([`Daemon::shutdown`]).
pub struct Daemon {
    server: Server,
    control: Arc<Control>,
    /// The AoE link's task (one link at most).
    aoe: Vec<JoinHandle<()>>,
    native: ethersan_server::native::Native,
    nvme: ethersan_server::nvme::Nvme,
    isns: Option<ethersan_server::isns::IsnsTask>,
    /// Dropping it removes the socket file.
    api_socket: Option<(PathBuf, ethersan_admin::UnixApi)>,
    api_tcp: Option<(SocketAddr, JoinHandle<()>)>,
    metrics: Option<(SocketAddr, JoinHandle<()>)>,
    sighup: JoinHandle<()>,
    reloads: watch::Receiver<u64>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("portals", &self.server.local_addrs())
            .field("aoe", &self.aoe.len())
            .field("native", &self.native.endpoints.len())
            .field("nvme", &self.nvme)
            .field("api_socket", &self.api_socket.as_ref().map(|s| &s.0))
            .field("api_tcp", &self.api_tcp.as_ref().map(|a| a.0))
            .field("metrics", &self.metrics.as_ref().map(|m| m.0))
            .finish_non_exhaustive()
    }
}

impl Daemon {
    /// Start serving `cfg`: everything [`Daemon`] owns, in this order —
    /// the data directory, the server (stores, targets, bound portals),
    /// the AoE link, the native transport, iSNS, the management API, the
    /// SIGHUP handler; then the banner, accepting on the portals, and the
    /// service manager told it is ready. Needs a tokio runtime.
    pub async fn start(cfg: Config, opts: DaemonOptions) -> Result<Daemon, DaemonError> {
        let data_dir = &cfg.options.data_dir;
        info!(
            "data directory {}",
            std::path::absolute(data_dir)
                .unwrap_or_else(|_| data_dir.clone())
                .display()
        );
        check::make_data_dir(&cfg)?;
        let server = Server::bind(&cfg).await?;
        // AoE: the same LUNs (their volumes) on raw Ethernet links.
        let aoe = if cfg.aoe.links.is_empty() {
            Vec::new()
        } else {
            let exports = ethersan_server::aoe::exports(&cfg, server.registry())?;
            ethersan_server::aoe::start(&cfg, &exports)?
        };
        // The native transport: the same targets over group-authenticated
        // channels on raw Ethernet and UDP.
        let native =
            ethersan_server::native::start(&cfg, server.stream_server(), server.registry().clone())
                .await?;
        let group = cfg.ethernet.group.as_deref().unwrap_or("");
        for l in &cfg.ethernet.links {
            line(
                &opts.say,
                format_args!("ethersan: native transport on {l} (group {group})"),
            );
        }
        for u in &cfg.ethernet.udp {
            line(
                &opts.say,
                format_args!("ethersan: native transport on {u} (group {group})"),
            );
        }
        // NVMe/TCP: each target a subsystem, on its own portals.
        let nvme = ethersan_server::nvme::start(&cfg, server.registry().clone()).await?;
        for a in nvme.local_addrs() {
            line(&opts.say, format_args!("ethersan: NVMe/TCP on {a}"));
        }
        // iSNS: register the targets, portals and discovery domains.
        let isns = cfg.isns.clone().map(|i| {
            line(
                &opts.say,
                format_args!("ethersan: registering with iSNS server {}", i.server()),
            );
            ethersan_server::isns::start(i, server.registry().clone())
        });
        // The management plane: every change goes through one Control (and
        // its reloader), whether from the API or from SIGHUP.
        let control = Arc::new(Control::new(
            server.reloader(),
            server.registry().clone(),
            opts.config_file.clone(),
        ));
        let state =
            ethersan_admin::AdminState::new(control.clone()).with_native(native.endpoints.clone());
        let api_socket = api_socket(&cfg, &opts, state.clone())?;
        let api_tcp = match (opts.api_tcp, &opts.api_token_file) {
            (Some(addr), Some(file)) => {
                let token = ethersan_admin::Token::from_file(file)?;
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|cause| DaemonError::ApiListen { addr, cause })?;
                let bound = l.local_addr().unwrap_or(addr);
                if !opts.json_logs {
                    line(
                        &opts.say,
                        format_args!("ethersan: management API and dashboard on http://{bound}/"),
                    );
                }
                info!(%bound, "management API on TCP");
                Some((bound, ethersan_admin::serve_tcp(l, state.clone(), token)))
            }
            _ => None,
        };
        // GET /metrics without authentication on its own listener.
        let metrics = match opts.metrics {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|cause| DaemonError::MetricsListen { addr, cause })?;
                let bound = listener.local_addr().unwrap_or(addr);
                info!(address = %bound, "metrics");
                if !opts.json_logs {
                    line(
                        &opts.say,
                        format_args!("ethersan: metrics on http://{bound}/metrics"),
                    );
                }
                Some((bound, ethersan_admin::serve_metrics(listener, state)))
            }
            None => None,
        };
        // SIGHUP: read the configuration file again and apply what changed,
        // and look at the LUNs' sizes again (after growing a backing file).
        let (reloaded, reloads) = watch::channel(0);
        let sighup = signals::on_sighup(control.clone(), opts.config_file.clone(), reloaded)
            .map_err(DaemonError::Signal)?;
        banner::announce(&server, &cfg, opts.json_logs, &opts.say);
        server.start();
        // The service manager learns that every portal listens (Type=notify).
        signals::notify(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(&format!(
                "serving {} target(s) on {}",
                cfg.targets.len(),
                server
                    .local_addrs()
                    .iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        ]);
        Ok(Daemon {
            server,
            control,
            aoe,
            native,
            nvme,
            isns,
            api_socket,
            api_tcp,
            metrics,
            sighup,
            reloads,
        })
    }

    /// Serve until `stop` resolves (for `ethersan serve`: [`termination`]),
    /// tell the service manager it is stopping, then [`Daemon::shutdown`].
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        stop.await;
        signals::notify(&[sd_notify::NotifyState::Stopping]);
        self.shutdown().await;
    }

    /// Stop everything, in the order of [`Stage`]; returns the stages as
    /// they were taken. Every task the daemon started has ended when it
    /// returns.
    pub async fn shutdown(mut self) -> Vec<Stage> {
        let mut done = Vec::new();
        info!("shutting down: no new connections; ending sessions");
        self.server.stop_accepting();
        for t in self.aoe.drain(..) {
            t.abort();
            let _ = t.await;
        }
        self.native.stop_accepting().await;
        self.nvme.stop().await;
        done.push(Stage::StopAccepting);
        self.server.end_sessions().await;
        done.push(Stage::EndSessions);
        self.server.flush();
        info!("stopped");
        done.push(Stage::Flush);
        if let Some(t) = self.isns.take() {
            t.shutdown().await;
        }
        done.push(Stage::Deregister);
        self.sighup.abort();
        let _ = (&mut self.sighup).await;
        for (_, t) in [self.api_tcp.take(), self.metrics.take()]
            .into_iter()
            .flatten()
        {
            t.abort();
            let _ = t.await;
        }
        drop(self.api_socket.take());
        done.push(Stage::CloseManagement);
        done
    }

    /// Where NVMe/TCP is served (the real port when 0 was asked for).
    pub fn nvme_addrs(&self) -> Vec<SocketAddr> {
        self.nvme.local_addrs()
    }

    /// The server: its registry, portals and addresses.
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// The operations on the running server the management API uses.
    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// The management API's unix socket, when this daemon has one.
    pub fn api_socket(&self) -> Option<&Path> {
        self.api_socket.as_ref().map(|s| s.0.as_path())
    }

    /// Where the TCP API listens (the real port when 0 was asked for).
    pub fn api_addr(&self) -> Option<SocketAddr> {
        self.api_tcp.as_ref().map(|a| a.0)
    }

    /// Where `/metrics` is served (the real port when 0 was asked for).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|m| m.0)
    }

    /// How many SIGHUPs have been handled: changes once each reload has
    /// been applied (or refused).
    pub fn reloads(&self) -> watch::Receiver<u64> {
        self.reloads.clone()
    }

    /// Apply the configuration file again and look at every LUN's size
    /// again, as SIGHUP does (blocking: the stores are opened here).
    pub fn reload(&self, config_file: Option<&Path>) {
        signals::reload(&self.control, config_file);
    }
}

/// The management API on its unix socket: `--api-socket`, else the data
/// directory's `ethersan.sock`, which another server sharing the data
/// directory may hold (then this one serves without a socket).
fn api_socket(
    cfg: &Config,
    opts: &DaemonOptions,
    state: ethersan_admin::AdminState,
) -> Result<Option<(PathBuf, ethersan_admin::UnixApi)>, DaemonError> {
    let socket = opts
        .api_socket
        .clone()
        .unwrap_or_else(|| cfg.options.data_dir.join("ethersan.sock"));
    let shown = std::path::absolute(&socket).unwrap_or_else(|_| socket.clone());
    match ethersan_admin::serve_unix(&socket, state) {
        Ok(task) => {
            info!(socket = %shown.display(), "management API");
            if !opts.json_logs {
                (opts.say)(&format!(
                    "ethersan: management API on {} (ethersan ctl --socket {} …)",
                    shown.display(),
                    shown.display()
                ));
            }
            Ok(Some((socket, task)))
        }
        // The default socket belongs to another server sharing this data
        // directory: this one serves without a socket (an explicit
        // --api-socket that cannot be made is an error).
        Err(e) if opts.api_socket.is_none() => {
            tracing::warn!(
                "{e}; this server has no API socket (another ethersan serve uses the data directory's)"
            );
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Say one line made of `args`.
fn line(say: &Say, args: std::fmt::Arguments<'_>) {
    say(&args.to_string());
}

/// An error with its causes, `: `-separated (as `ethersan` prints errors).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}
