//! `ethersan serve`: its arguments, the configuration they make, and the
//! [`ethersan_daemon::Daemon`] that serves it (or `--check`, which only
//! says what would be served).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use ethersan_proto::chap::Credentials;
use ethersan_server::config::{Config, LunConfig, TargetConfig};

use crate::say;

/// `ethersan serve`'s arguments (the doc comments are its `--help`).
#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Check the configuration and the backing stores, print what would be
    /// served and exit (0: good, 1: not), creating and serving nothing.
    #[arg(long)]
    pub(crate) check: bool,
    /// Full configuration file (TOML); see docs/config.md.
    #[arg(long, value_name = "FILE.toml", conflicts_with_all = ["listen", "target", "lun"])]
    config: Option<PathBuf>,
    /// Portal to listen on, ADDR:PORT (repeatable; IPv6 as [::1]:3260).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Vec<SocketAddr>,
    /// Announce ADVERTISED instead of the --listen address LISTEN in
    /// SendTargets answers (NAT, containers), as LISTEN=ADVERTISED, e.g.
    /// 0.0.0.0:3260=203.0.113.5:3260 (repeatable).
    #[arg(long, value_name = "LISTEN=ADVERTISED", value_parser = parse_advertise_arg, conflicts_with = "config")]
    advertise: Vec<(SocketAddr, SocketAddr)>,
    /// Target name (IQN).
    #[arg(long, value_name = "IQN")]
    target: Option<String>,
    /// A LUN: PATH[:SIZE][,ro][,removable][,shared][,bs=4096][,engine=sync|uring][,direct][,serial=S][,naa=HEX] or ram:SIZE (repeatable, numbered from 0). A file LUN's WWN and serial are kept in PATH.id; the file is locked while served (shared: by other servers too).
    #[arg(long, value_name = "SPEC")]
    lun: Vec<String>,
    /// Directory for the default LUN's backing file (and block devices' identity files).
    #[arg(long, value_name = "DIR", default_value = "./ethersan-data")]
    data_dir: PathBuf,
    /// Only this initiator may log in and see the target (repeatable; default: any).
    #[arg(long, value_name = "IQN", conflicts_with = "config")]
    allow_initiator: Vec<String>,
    /// Initiators must authenticate with CHAP as USER:SECRET (secret ≥ 12 bytes); also from $ETHERSAN_CHAP.
    #[arg(
        long,
        value_name = "USER:SECRET",
        env = "ETHERSAN_CHAP",
        hide_env_values = true,
        conflicts_with = "config"
    )]
    chap: Option<String>,
    /// The target authenticates itself to initiators that ask (mutual CHAP) as USER:SECRET; also from $ETHERSAN_MUTUAL_CHAP.
    #[arg(
        long,
        value_name = "USER:SECRET",
        env = "ETHERSAN_MUTUAL_CHAP",
        hide_env_values = true,
        requires = "chap",
        conflicts_with = "config"
    )]
    mutual_chap: Option<String>,
    /// Discovery sessions must authenticate with these credentials (instead of --chap's) as USER:SECRET; also from $ETHERSAN_DISCOVERY_CHAP.
    #[arg(
        long,
        value_name = "USER:SECRET",
        env = "ETHERSAN_DISCOVERY_CHAP",
        hide_env_values = true,
        conflicts_with = "config"
    )]
    discovery_chap: Option<String>,
    /// Threads running sessions (0: one per CPU); overrides the config file's worker_threads.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=1024))]
    workers: Option<u16>,
    /// How connections are spread over worker threads: pinned (the
    /// default: one runtime and one io_uring per CPU, each connection stays
    /// on the least-loaded one) or shared (tokio's work-stealing runtime);
    /// overrides the config file's placement.
    #[arg(long, value_name = "shared|pinned")]
    placement: Option<ethersan_server::config::Placement>,
    /// Also serve the LUNs over ATA over Ethernet on this link (repeatable):
    /// a network interface (needs CAP_NET_RAW) or
    /// unix:LOCAL.sock,peer=PEER.sock[,mtu=N][,mac=MAC] (QEMU's -netdev
    /// dgram). LUN n is shelf 0 slot n unless its spec says aoe=SHELF.SLOT.
    #[arg(long, value_name = "IFACE|unix:…", conflicts_with = "config")]
    aoe: Vec<String>,
    /// Also serve the LUNs over ethersan's native transport on this raw
    /// Ethernet link (repeatable): a network interface (needs CAP_NET_RAW)
    /// or unix:LOCAL.sock,peer=PEER.sock[,mtu=N][,mac=MAC]. Needs --group.
    #[arg(long, value_name = "IFACE|unix:…", conflicts_with = "config")]
    eth: Vec<String>,
    /// Also serve the native transport on this UDP address
    /// (repeatable): ADDR:PORT[,mtu=N], e.g. 0.0.0.0:3262. Needs --group.
    #[arg(long, value_name = "ADDR:PORT[,mtu=N]", conflicts_with = "config")]
    udp: Vec<String>,
    /// Also serve the LUNs over NVMe/TCP on this address (repeatable):
    /// ADDR[:PORT], port 4420 when only an address is given. Each target
    /// is a subsystem (see docs/nvme.md), LUN n namespace n+1.
    #[arg(long, value_name = "ADDR[:PORT]", conflicts_with = "config")]
    nvme: Vec<String>,
    /// The native transport's group: only members (same name and secret)
    /// discover and reach the target.
    #[arg(long, value_name = "NAME", conflicts_with = "config")]
    group: Option<String>,
    /// A file holding the group secret (else $ETHERSAN_GROUP_SECRET, or
    /// the config file's [ethernet] secret).
    #[arg(long, value_name = "FILE")]
    group_secret_file: Option<PathBuf>,
    /// The native transport's EtherType on raw Ethernet (default 0x88B5).
    #[arg(long, value_name = "0xXXXX", value_parser = parse_ethertype_arg, conflicts_with = "config")]
    ethertype: Option<u16>,
    /// Most connections open at once from one source address (0: no limit; default 128); overrides the config file's max_connections_per_address.
    #[arg(long, value_name = "N")]
    max_connections_per_address: Option<usize>,
    /// The management API's unix socket (mode 0600), for `ethersan ctl`
    /// (default: ethersan.sock in the data directory).
    #[arg(long, value_name = "PATH")]
    api_socket: Option<PathBuf>,
    /// Also serve the management API, /metrics and the dashboard on TCP
    /// (every request but the dashboard's page needs the bearer token of
    /// --api-token-file).
    #[arg(long, value_name = "ADDR:PORT", requires = "api_token_file")]
    api: Option<SocketAddr>,
    /// A file holding the TCP API's bearer token (16 bytes or more; never
    /// given on the command line).
    #[arg(long, value_name = "FILE")]
    api_token_file: Option<PathBuf>,
    /// This gateway's ALUA target port group id (also its relative target
    /// port and portal group tag), 1..=65535; gateways exporting one RBD
    /// image need different ones (see docs/rbd.md). Overrides the config
    /// file's target_port_group.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    tpg: Option<u16>,
    /// The ALUA state this gateway starts in: active-optimized (default),
    /// active-non-optimized or standby. Overrides the config file's
    /// alua_state.
    #[arg(long, value_name = "STATE")]
    alua_state: Option<ethersan_server::config::GatewayState>,
    /// Most connections in the login phase at once, over every portal (0: no limit; default 512); overrides the config file's max_logins_in_progress.
    #[arg(long, value_name = "N")]
    max_logins_in_progress: Option<usize>,
    /// Register the targets, portals and discovery domains with this iSNS
    /// server, HOST[:PORT] (port 3205 by default), and deregister them at
    /// shutdown; overrides the config file's [isns] server. See docs/isns.md.
    #[arg(long, value_name = "HOST[:PORT]")]
    isns: Option<String>,
    /// The portal address to register with iSNS instead of the listening
    /// ones, ADDR:PORT (repeatable), for initiators that reach this server
    /// through NAT; overrides [isns] portals.
    #[arg(long, value_name = "ADDR:PORT", requires = "isns")]
    isns_portal: Vec<SocketAddr>,
    /// Serve GET /metrics (Prometheus/OpenMetrics text, no authentication:
    /// a trusted network only) on ADDR:PORT, e.g. 127.0.0.1:9368.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<SocketAddr>,
}

/// `--advertise LISTEN=ADVERTISED`.
fn parse_advertise_arg(s: &str) -> Result<(SocketAddr, SocketAddr), String> {
    let (l, a) = s.split_once('=').ok_or_else(|| {
        format!("{s:?} is not LISTEN=ADVERTISED (e.g. 0.0.0.0:3260=203.0.113.5:3260)")
    })?;
    let addr = |v: &str, what: &str| {
        v.trim().parse::<SocketAddr>().map_err(|_| {
            format!("{what} {v:?} is not ADDR:PORT (an IP address and a port, IPv6 as [::1]:3260)")
        })
    };
    let (l, a) = (addr(l, "LISTEN")?, addr(a, "ADVERTISED")?);
    if a.ip().is_unspecified() || a.port() == 0 {
        return Err(format!(
            "ADVERTISED {a} cannot be reached by initiators: give the address and port they connect to"
        ));
    }
    Ok((l, a))
}

/// Apply `serve --isns` and `--isns-portal` to the configuration.
fn apply_isns_args(a: &ServeArgs, cfg: &mut Config) -> anyhow::Result<()> {
    let Some(server) = &a.isns else {
        return Ok(());
    };
    let mut isns = ethersan_server::config::IsnsConfig::parse_server(server)
        .map_err(|e| anyhow::anyhow!("--isns: {e}"))?;
    if let Some(old) = cfg.isns.take() {
        isns.portals = old.portals;
        isns.entity = old.entity;
    }
    if !a.isns_portal.is_empty() {
        isns.portals = a.isns_portal.clone();
    }
    cfg.isns = Some(isns);
    Ok(())
}

/// `--ethertype 0xXXXX`.
fn parse_ethertype_arg(s: &str) -> Result<u16, String> {
    ethersan_server::config::parse_ethertype(s)
}

/// The configuration `--config` names, or the embedded default changed
/// by the other arguments.
fn serve_config(a: &ServeArgs) -> anyhow::Result<Config> {
    if let Some(path) = &a.config {
        let mut cfg = Config::from_toml_file(path)?;
        if let Some(f) = &a.group_secret_file {
            cfg.ethernet.secret_file = Some(f.clone());
        }
        apply_isns_args(a, &mut cfg)?;
        return Ok(cfg);
    }
    let mut cfg = Config::embedded_default(&a.data_dir);
    if !a.listen.is_empty() {
        cfg.portals = a.listen.clone();
    }
    for (listen, advertised) in &a.advertise {
        if !cfg.portals.contains(listen) {
            bail!(
                "--advertise {listen}={advertised}: {listen} is not a portal; give it with --listen {listen} too"
            );
        }
        cfg.advertise.insert(*listen, *advertised);
    }
    let target: &mut TargetConfig = cfg
        .targets
        .first_mut()
        .context("embedded default has a target")?;
    if let Some(name) = &a.target {
        ethersan_server::config::validate_name(name).with_context(|| format!("--target {name}"))?;
        target.name = name.clone();
    }
    for l in &a.aoe {
        cfg.aoe
            .links
            .push(ethersan_server::config::AoeLink::parse(l).map_err(anyhow::Error::msg)?);
    }
    for l in &a.eth {
        cfg.ethernet.links.push(
            ethersan_server::config::AoeLink::parse_option(l, "--eth")
                .map_err(anyhow::Error::msg)?,
        );
    }
    for u in &a.udp {
        cfg.ethernet
            .udp
            .push(ethersan_server::config::UdpPortal::parse(u).map_err(anyhow::Error::msg)?);
    }
    for n in &a.nvme {
        cfg.nvme.portals.push(
            ethersan_server::config::NvmeConfig::parse_portal(n).map_err(anyhow::Error::msg)?,
        );
    }
    cfg.ethernet.group = a.group.clone();
    cfg.ethernet.secret_file = a.group_secret_file.clone();
    if let Some(t) = a.ethertype {
        cfg.ethernet.ethertype = t;
    }
    if cfg.ethernet.enabled() && cfg.ethernet.group.is_none() {
        anyhow::bail!("--eth and --udp need --group NAME (and the group secret: --group-secret-file FILE or $ETHERSAN_GROUP_SECRET)");
    }
    for i in &a.allow_initiator {
        ethersan_server::config::validate_initiator_name(i)
            .with_context(|| format!("--allow-initiator {i}"))?;
        target
            .access
            .rules
            .push(ethersan_server::config::AclRule::initiator(i.clone()));
    }
    if !a.lun.is_empty() {
        target.luns = a
            .lun
            .iter()
            .map(|s| LunConfig::from_spec(s).with_context(|| format!("--lun {s}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
    }
    if let Some((_, l, msg)) = ethersan_server::config::shared_backing_file(&cfg.targets) {
        bail!("--lun {}: {msg}", a.lun.get(l).map_or("", String::as_str));
    }
    if cfg.portals.is_empty() {
        bail!("no portal to listen on");
    }
    apply_isns_args(a, &mut cfg)?;
    if let Some(spec) = &a.chap {
        let initiator = Credentials::parse(spec).map_err(|e| anyhow::anyhow!("--chap: {e}"))?;
        let target = match &a.mutual_chap {
            Some(m) => {
                Some(Credentials::parse(m).map_err(|e| anyhow::anyhow!("--mutual-chap: {e}"))?)
            }
            None => None,
        };
        if target
            .as_ref()
            .is_some_and(|t| t.secret == initiator.secret)
        {
            bail!("--mutual-chap: the target's secret must differ from the initiators'");
        }
        cfg.chap = Some(ethersan_server::config::ChapConfig {
            initiator,
            target,
            discovery: true,
        });
    }
    if let Some(spec) = &a.discovery_chap {
        let initiator =
            Credentials::parse(spec).map_err(|e| anyhow::anyhow!("--discovery-chap: {e}"))?;
        cfg.discovery_chap = Some(ethersan_server::config::ChapConfig {
            initiator,
            target: None,
            discovery: true,
        });
    }
    Ok(cfg)
}

/// The configuration `serve` runs: [`serve_config`] with the options the
/// command line overrides (workers, placement, limits, ALUA).
pub(crate) fn config(a: &ServeArgs) -> anyhow::Result<Config> {
    let mut cfg = serve_config(a)?;
    if let Some(n) = a.workers {
        cfg.options.worker_threads = usize::from(n);
    }
    if let Some(p) = a.placement {
        cfg.options.placement = p;
    }
    if let Some(n) = a.max_logins_in_progress {
        cfg.options.max_logins_in_progress = n;
    }
    if let Some(n) = a.tpg {
        cfg.options.target_port_group = n;
    }
    if let Some(s) = a.alua_state {
        cfg.options.alua_state = s;
    }
    if let Some(n) = a.max_connections_per_address {
        cfg.options.max_connections_per_address = n;
    }
    Ok(cfg)
}

/// Threads of the main runtime for `cfg` (0: one per CPU): the worker
/// threads, or one when pinned workers carry the connections and the main
/// runtime only accepts and handles signals.
pub(crate) fn runtime_threads(cfg: &Config) -> usize {
    if cfg.options.placement == ethersan_server::config::Placement::Pinned {
        1
    } else {
        cfg.options.worker_threads
    }
}

/// `serve --check`: what would be served, or the first thing wrong.
pub(crate) fn check(cfg: &Config) -> ExitCode {
    match ethersan_daemon::check(cfg) {
        Ok(out) => {
            say(format_args!("ethersan: configuration is good\n{out}"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            say(format_args!("ethersan: {:#}", anyhow::Error::from(e)));
            ExitCode::FAILURE
        }
    }
}

/// Serve `cfg` (made from `a`) until SIGINT or SIGTERM.
pub(crate) async fn serve(a: ServeArgs, cfg: Config, json_logs: bool) -> anyhow::Result<()> {
    let opts = ethersan_daemon::DaemonOptions {
        config_file: a.config,
        api_socket: a.api_socket,
        api_tcp: a.api,
        api_token_file: a.api_token_file,
        metrics: a.metrics,
        json_logs,
        say: Arc::new(|line| say(format_args!("{line}"))),
    };
    // Signal handlers first: a SIGTERM as soon as the server is ready
    // (its control socket exists) stops it cleanly.
    let stop = ethersan_daemon::termination();
    let daemon = ethersan_daemon::Daemon::start(cfg, opts).await?;
    daemon.run(stop).await;
    Ok(())
}
