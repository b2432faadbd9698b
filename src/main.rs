//! `ethersan`: a software iSCSI target and its companion client.
//!
//! `ethersan serve` runs the target; with no arguments it serves the
//! embedded default (127.0.0.1:3260, one target, a 1 GiB sparse LUN under
//! `./ethersan-data/`).

// The doc comments on the clap structs of this binary are its `--help` text,
// written for a terminal: `host[:port]` is syntax, not an intra-doc link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use ethersan_proto::chap::Credentials;
use ethersan_server::config::{Backing, Config, LunConfig, TargetConfig};
use ethersan_server::Server;
use tracing_subscriber::EnvFilter;

/// mimalloc keeps freed I/O buffers for reuse instead of returning them to
/// the kernel (glibc maps and unmaps every buffer of 128 KiB or more, and
/// each new mapping costs page faults and zeroing).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `println!` that never panics: a reader that went away (`| head -1`)
/// ends the process as SIGPIPE would ([`exit_on_broken_pipe`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_line(&mut std::io::stdout(), format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics on a closed stderr.
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::write_line(&mut std::io::stderr(), format_args!($($arg)*))
    };
}

/// Write one line; a reader that went away ends the process as SIGPIPE
/// would, other errors are ignored (the output has nowhere to go).
fn write_line(w: &mut dyn std::io::Write, args: std::fmt::Arguments) {
    if let Err(e) = writeln!(w, "{args}").and_then(|()| w.flush()) {
        exit_on_broken_pipe(&e);
    }
}

/// The reader of our output went away (`ethersan ls URL | head -1`): end
/// quietly as a process killed by SIGPIPE, the way `cat` and `ls` do (the
/// shell reports status 141), instead of an error and status 1. Rust
/// ignores SIGPIPE so that writes fail with EPIPE and sockets are safe;
/// the default action comes back only here, when the process ends
/// anyway. Other errors return.
pub(crate) fn exit_on_broken_pipe(e: &std::io::Error) {
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        return;
    }
    // SAFETY: signal(2) and raise(3) with constant, valid arguments; no
    // memory is involved, and the default action of SIGPIPE ends the
    // process at once.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(128 + libc::SIGPIPE);
}

/// Writing standard output failed; when its reader went away, `main`
/// ends the process as SIGPIPE would.
#[derive(Debug, thiserror::Error)]
#[error("write stdout: {0}")]
pub(crate) struct StdoutError(pub std::io::Error);

mod aoe_client;
mod attach;
mod bench;
mod client;
mod cp;
mod ctl;
mod manual;
mod native_client;

/// Network block storage in software: an iSCSI target and client.
#[derive(Parser, Debug)]
#[command(name = "ethersan", version, about)]
struct Cli {
    /// Log lines for people (human, the default) or one JSON object per
    /// line for log collectors (json). The level: $ETHERSAN_LOG (info).
    #[arg(
        long,
        value_name = "human|json",
        default_value = "human",
        global = true
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Text for people.
    Human,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the iSCSI target (no arguments: the embedded default).
    Serve(Box<ServeArgs>),
    /// List the targets and portals a portal offers (SendTargets), or with
    /// --aoe the AoE devices on a link.
    Discover {
        /// HOST[:PORT] of a portal (port 3260 by default), or an iscsi:// URL.
        #[arg(required_unless_present_any = ["aoe", "eth", "udp"])]
        portal: Option<String>,
        /// Ask the native transport's group (--group) who serves, by
        /// broadcast on this Ethernet interface (needs CAP_NET_RAW); lists
        /// what answers within 1.5 s (or --timeout, if given).
        #[arg(long, value_name = "IFACE", conflicts_with_all = ["portal", "aoe", "udp"])]
        eth: Option<String>,
        /// Ask the native transport's group at this UDP address (a target,
        /// or a broadcast address): HOST[:PORT], port 3262 by default.
        #[arg(long, value_name = "HOST[:PORT]", conflicts_with_all = ["portal", "aoe"])]
        udp: Option<String>,
        /// Broadcast an AoE Query Config on this link instead and list the
        /// devices that answer within 1 s (or --timeout, if given):
        /// IFACE (AF_PACKET, needs CAP_NET_RAW) or
        /// unix:LOCAL,peer=PEER[,mtu=N][,mac=MAC].
        #[arg(long, value_name = "IFACE", conflicts_with = "portal")]
        aoe: Option<String>,
        #[command(flatten)]
        connect: ethersan_client::ConnectArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List a target's LUNs (or the one LUN the URL names): capacity, block size, identity.
    Ls {
        /// iscsi://[USER%SECRET@]host[:port]/TARGET[/LUN];
        /// the native transport's eth://IFACE/TARGET[/LUN] or
        /// udp://HOST[:PORT]/TARGET[/LUN] (?security=none|integrity|encrypt);
        /// aoe://IFACE/SHELF.SLOT or aoe+unix://SHELF.SLOT?local=PATH&peer=PATH
        url: String,
        #[command(flatten)]
        connect: ethersan_client::ConnectArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one LUN's INQUIRY data and VPD pages (an AoE device's IDENTIFY data).
    Inquiry {
        /// iscsi://[USER%SECRET@]host[:port]/TARGET/LUN;
        /// the native transport's eth://IFACE/TARGET/LUN or
        /// udp://HOST[:PORT]/TARGET/LUN (?security=none|integrity|encrypt);
        /// aoe://IFACE/SHELF.SLOT or aoe+unix://SHELF.SLOT?local=PATH&peer=PATH
        url: String,
        #[command(flatten)]
        connect: ethersan_client::ConnectArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy a file or stdin to a LUN, a LUN to a file or stdout, or LUN to LUN.
    Cp(cp::CpArgs),
    /// Load-generate against a LUN or a local file/block device: IOPS, MB/s, latency.
    Bench(bench::BenchArgs),
    /// Show a LUN as one regular file in a FUSE mount at DIR (for losetup,
    /// qemu-img, dd…) until DIR is unmounted or the command is stopped.
    Attach(attach::AttachArgs),
    /// Change a running server through its management API: targets,
    /// LUNs, grants, CHAP, portals, sessions; save its configuration.
    Ctl(ctl::CtlArgs),
    /// Print shell completions: ethersan completions bash > /etc/bash_completion.d/ethersan
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print a manual page (roff): ethersan man > /usr/local/share/man/man1/ethersan.1; ethersan man serve > …/ethersan-serve.1; ethersan man --dir DIR writes every page
    Man {
        /// A subcommand's page instead of the main one, as words or one
        /// name: `serve`, `ctl lun add` or `ctl-lun-add`.
        #[arg(conflicts_with = "dir")]
        subcommand: Vec<String>,
        /// Write every page (ethersan.1, ethersan-serve.1, ethersan-ctl-lun-add.1, …) into DIR instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Check the configuration and the backing stores, print what would be
    /// served and exit (0: good, 1: not), creating and serving nothing.
    #[arg(long)]
    check: bool,
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

fn parse_ethertype_arg(s: &str) -> Result<u16, String> {
    ethersan_server::config::parse_ethertype(s)
}

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
    cfg.ethernet.group = a.group.clone();
    cfg.ethernet.secret_file = a.group_secret_file.clone();
    if let Some(t) = a.ethertype {
        cfg.ethernet.ethertype = t;
    }
    if cfg.ethernet.enabled() && cfg.ethernet.group.is_none() {
        anyhow::bail!("--eth and --udp need --group NAME (and the group secret: --group-secret-file FILE or $ETHERSAN_GROUP_SECRET)");
    }
    for i in &a.allow_initiator {
        ethersan_server::config::validate_name(i)
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

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Whether a LUN keeps its file in the data directory (the embedded
/// default does), which the server then makes if it is missing.
fn in_data_dir(cfg: &Config, l: &LunConfig) -> bool {
    matches!(&l.backing, Backing::File { path, .. } if path.parent() == Some(cfg.options.data_dir.as_path()))
}

/// Make the data directory if a LUN's file is to be created in it (and
/// only then: a LUN path's own directory must exist).
fn make_data_dir(cfg: &Config) -> anyhow::Result<()> {
    let dir = &cfg.options.data_dir;
    let needed = cfg
        .targets
        .iter()
        .flat_map(|t| &t.luns)
        .any(|l| in_data_dir(cfg, l));
    if needed && !dir.is_dir() {
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "cannot create the data directory {}; choose another with --data-dir DIR (data_dir in a config file)",
                dir.display()
            )
        })?;
        tracing::info!("created the data directory {}", dir.display());
    }
    Ok(())
}

/// How to reach target `t` at `addr`, with the CHAP user when logins need
/// CHAP (the secret is never printed: `SECRET` stands for it).
fn connect_hint(
    addr: &str,
    t: &TargetConfig,
    global_chap: Option<&ethersan_server::config::ChapConfig>,
) -> String {
    let name = &t.name;
    match t.chap.effective(global_chap) {
        None => format!(
            "ethersan: connect with\n  libiscsi/QEMU: iscsi://{addr}/{name}/0\n  ethersan:      ethersan ls iscsi://{addr}/{name}\n  open-iscsi:    iscsiadm -m discovery -t sendtargets -p {addr}\n                 iscsiadm -m node -T {name} -p {addr} --login"
        ),
        Some(c) => {
            let user = &c.initiator.user;
            format!(
                "ethersan: connect with (CHAP required: user {user}; SECRET is the secret given to the server)\n  libiscsi/QEMU: iscsi://{user}%SECRET@{addr}/{name}/0\n  ethersan:      ethersan ls --chap {user}:SECRET iscsi://{addr}/{name}   (or $ETHERSAN_CHAP)\n  open-iscsi:    iscsiadm -m discovery -t sendtargets -p {addr}{disc}\n                 iscsiadm -m node -T {name} -p {addr} -o update -n node.session.auth.authmethod -v CHAP\n                 iscsiadm -m node -T {name} -p {addr} -o update -n node.session.auth.username -v {user}\n                 iscsiadm -m node -T {name} -p {addr} -o update -n node.session.auth.password -v SECRET\n                 iscsiadm -m node -T {name} -p {addr} --login",
                disc = if c.discovery {
                    "   (discovery needs CHAP too: set discovery.sendtargets.auth.* in /etc/iscsi/iscsid.conf)"
                } else {
                    ""
                }
            )
        }
    }
}

/// Tell the service manager (systemd's `$NOTIFY_SOCKET`) how the server
/// is; without a service manager, nothing.
fn notify(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!("cannot notify the service manager: {e}");
    }
}

/// SIGHUP: apply the configuration file again (with `--config`), then
/// look at every LUN's size again.
fn reload(control: &ethersan_server::control::Control, file: Option<&std::path::Path>) {
    let now = sd_notify::NotifyState::monotonic_usec_now().ok();
    let mut states = vec![sd_notify::NotifyState::Reloading];
    states.extend(now);
    notify(&states);
    if let Some(path) = file {
        match Config::from_toml_file(path)
            .map_err(anyhow::Error::from)
            .and_then(|c| Ok(control.reload(c)?))
        {
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
                "reload of {} failed, nothing changed: {e:#}",
                path.display()
            ),
        }
    }
    control.rescan();
    notify(&[sd_notify::NotifyState::Ready]);
}

/// `serve --check`: what would be served, or the first thing wrong.
fn check(cfg: &Config) -> anyhow::Result<()> {
    let mut out = String::new();
    for p in &cfg.portals {
        match cfg.advertise.get(p) {
            Some(a) => out.push_str(&format!("  portal {p} (advertised as {a})\n")),
            None => out.push_str(&format!("  portal {p}\n")),
        }
    }
    let dir = &cfg.options.data_dir;
    for t in &cfg.targets {
        out.push_str(&format!("  target {}\n", t.name));
        out.push_str(&format!("    access: {}\n", t.access.meaning()));
        for (i, idx) in t.numbered() {
            let l = &t.luns[idx];
            let what = match &l.backing {
                // Its directory is made when serving.
                Backing::File {
                    path,
                    size: Some(size),
                } if in_data_dir(cfg, l) && !dir.is_dir() => format!(
                    "{}, {}, will be created in a new data directory",
                    path.display(),
                    ethersan_backend::file::human_bytes(*size)
                ),
                _ => l
                    .check_backing()
                    .with_context(|| format!("target {} LUN {i}", t.name))?,
            };
            out.push_str(&format!("    LUN {i}: {what}\n"));
        }
    }
    for l in &cfg.aoe.links {
        out.push_str(&format!("  AoE link {l}\n"));
    }
    if !cfg.aoe.links.is_empty() {
        for (ti, t) in cfg.targets.iter().enumerate() {
            for (n, idx) in t.numbered() {
                let (i, l) = (usize::try_from(n).unwrap_or(usize::MAX), &t.luns[idx]);
                if let Some(addr) = ethersan_server::aoe::address(&t.name, ti, i, l.aoe)? {
                    if l.block_size != 512 {
                        return Err(ethersan_server::aoe::AoeError::BlockSize {
                            target: t.name.clone(),
                            lun: i,
                            block_size: l.block_size,
                        }
                        .into());
                    }
                    out.push_str(&format!("    AoE {addr}: LUN {i} of {}\n", t.name));
                }
            }
        }
    }
    if cfg.ethernet.enabled() {
        let keys = ethersan_server::native::group_keys(&cfg.ethernet)?;
        for l in &cfg.ethernet.links {
            out.push_str(&format!(
                "  native transport on {l} (group {})\n",
                keys.group()
            ));
        }
        for u in &cfg.ethernet.udp {
            out.push_str(&format!(
                "  native transport on {u} (group {})\n",
                keys.group()
            ));
        }
    }
    if let Some(i) = &cfg.isns {
        let what = if i.portals.is_empty() {
            "the portals above".to_string()
        } else {
            i.portals
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push_str(&format!(
            "  iSNS server {} (registers the targets and {what})\n",
            i.server()
        ));
    }
    for w in ethersan_server::exposure::open_to_anyone(cfg) {
        out.push_str(&format!("  warning: {w}\n"));
    }
    say(format_args!("ethersan: configuration is good\n{out}"));
    Ok(())
}

/// The log's writer: stderr, where a write that fails (a closed pipe, as
/// in `ethersan serve 2>&1 | head -1`) is dropped instead of reported on
/// the same closed stderr, which would panic.
struct QuietStderr;

impl std::io::Write for QuietStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Write generated text to stdout; a closed pipe is an error, not a panic.
fn print_out(bytes: &[u8]) -> ExitCode {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match o.write_all(bytes).and_then(|()| o.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            exit_on_broken_pipe(&e);
            say(format_args!("ethersan: write stdout: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// Print to stderr; a closed stderr is not an error worth a panic.
fn say(args: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{args}");
}

/// Where `serve` offers its management API.
struct ApiArgs {
    socket: Option<PathBuf>,
    tcp: Option<SocketAddr>,
    token_file: Option<PathBuf>,
    /// `--metrics ADDR:PORT`: /metrics without authentication.
    metrics: Option<SocketAddr>,
}

async fn serve(
    cfg: Config,
    json_logs: bool,
    config_file: Option<PathBuf>,
    api: ApiArgs,
) -> anyhow::Result<()> {
    let data_dir = &cfg.options.data_dir;
    tracing::info!(
        "data directory {}",
        std::path::absolute(data_dir)
            .unwrap_or_else(|_| data_dir.clone())
            .display()
    );
    make_data_dir(&cfg)?;
    let server = Server::bind(&cfg).await?;
    // AoE: the same LUNs (their volumes) on raw Ethernet links.
    let _aoe_tasks = if cfg.aoe.links.is_empty() {
        Vec::new()
    } else {
        let exports = ethersan_server::aoe::exports(&cfg, server.registry())?;
        ethersan_server::aoe::start(&cfg, &exports)?
    };
    // The native transport: the same targets over group-authenticated
    // channels on raw Ethernet and UDP.
    let _native =
        ethersan_server::native::start(&cfg, server.stream_server(), server.registry().clone())
            .await?;
    for l in &cfg.ethernet.links {
        say(format_args!(
            "ethersan: native transport on {l} (group {})",
            cfg.ethernet.group.as_deref().unwrap_or("")
        ));
    }
    for u in &cfg.ethernet.udp {
        say(format_args!(
            "ethersan: native transport on {u} (group {})",
            cfg.ethernet.group.as_deref().unwrap_or("")
        ));
    }
    // iSNS: register the targets, portals and discovery domains.
    let isns = cfg.isns.clone().map(|i| {
        say(format_args!(
            "ethersan: registering with iSNS server {}",
            i.server()
        ));
        ethersan_server::isns::start(i, server.registry().clone())
    });
    // The management plane: every change goes through one Control (and
    // its reloader), whether from the API or from SIGHUP.
    let control = Arc::new(ethersan_server::control::Control::new(
        server.reloader(),
        server.registry().clone(),
        config_file.clone(),
    ));
    let state = ethersan_admin::AdminState::new(control.clone()).with_native(_native.clone());
    let socket = api
        .socket
        .clone()
        .unwrap_or_else(|| cfg.options.data_dir.join("ethersan.sock"));
    let socket_shown = std::path::absolute(&socket).unwrap_or_else(|_| socket.clone());
    let _api_unix = match ethersan_admin::serve_unix(&socket, state.clone()) {
        Ok(task) => {
            tracing::info!(socket = %socket_shown.display(), "management API");
            if !json_logs {
                say(format_args!(
                    "ethersan: management API on {} (ethersan ctl --socket {} …)",
                    socket_shown.display(),
                    socket_shown.display()
                ));
            }
            Some(task)
        }
        // The default socket belongs to another server sharing this data
        // directory: this one serves without a socket (an explicit
        // --api-socket that cannot be made is an error).
        Err(e) if api.socket.is_none() => {
            tracing::warn!(
                "{e}; this server has no API socket (another ethersan serve uses the data directory's)"
            );
            None
        }
        Err(e) => return Err(e.into()),
    };
    let _api_tcp = match (api.tcp, &api.token_file) {
        (Some(addr), Some(file)) => {
            let token = ethersan_admin::Token::from_file(file)?;
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} for the API (--api)"))?;
            let bound = l.local_addr().unwrap_or(addr);
            if !json_logs {
                say(format_args!(
                    "ethersan: management API and dashboard on http://{bound}/"
                ));
            }
            tracing::info!(%bound, "management API on TCP");
            Some(ethersan_admin::serve_tcp(l, state.clone(), token))
        }
        _ => None,
    };
    // GET /metrics without authentication on its own listener.
    let _metrics = match api.metrics {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen for metrics on {addr} (--metrics)"))?;
            let bound = listener.local_addr().unwrap_or(addr);
            tracing::info!(address = %bound, "metrics");
            if !json_logs {
                say(format_args!("ethersan: metrics on http://{bound}/metrics"));
            }
            Some(ethersan_admin::serve_metrics(listener, state.clone()))
        }
        None => None,
    };
    // SIGHUP: read the configuration file again and apply what changed,
    // and look at the LUNs' sizes again (after growing a backing file).
    #[cfg(unix)]
    {
        let control = control.clone();
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let (c, file) = (control.clone(), config_file.clone());
                // Its changes are logged as made through SIGHUP.
                let span = tracing::info_span!("admin", via = %"SIGHUP");
                let _ = tokio::task::spawn_blocking(move || {
                    span.in_scope(|| reload(&c, file.as_deref()))
                })
                .await;
            }
        });
    }
    let addrs = server.local_addrs();
    if json_logs {
        // Log collectors get events, not a banner.
        for p in server.portals().list() {
            let reachable: Vec<String> = p.announced(None).iter().map(|a| a.to_string()).collect();
            tracing::info!(portal = %p.address, advertise = p.advertise.map(tracing::field::display), reachable = %reachable.join(", "), "listening");
        }
    }
    for w in ethersan_server::exposure::open_to_anyone(&cfg) {
        tracing::warn!("{w}");
    }
    let portals = server.portals().list();
    for p in portals.iter().filter(|_| !json_logs) {
        say(format_args!("ethersan: listening on {}", p.address));
        if let Some(a) = p.advertise {
            say(format_args!(
                "ethersan: portal {} is advertised as {a}",
                p.address
            ));
        } else if p.is_wildcard() {
            // 0.0.0.0 is no address to connect to: name the real ones.
            let reachable = p.announced(None);
            say(format_args!(
                "ethersan: portal {} answers on this host's addresses: {}",
                p.address,
                if reachable.is_empty() {
                    "(none found)".to_string()
                } else {
                    reachable
                        .iter()
                        .map(|a| a.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
        }
    }
    if let (Some(p), Some(t), false) = (portals.first(), cfg.targets.first(), json_logs) {
        // Initiators reach it at the address it is advertised as (a
        // wildcard portal: at the host's first address).
        let addr = p.announced(None).first().copied().unwrap_or(p.address);
        say(format_args!(
            "{}",
            connect_hint(&addr.to_string(), t, cfg.chap.as_ref())
        ));
    }
    // The service manager learns that every portal listens (Type=notify).
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&format!(
            "serving {} target(s) on {}",
            cfg.targets.len(),
            addrs
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    ]);
    server
        .run(async {
            shutdown_signal().await;
            notify(&[sd_notify::NotifyState::Stopping]);
        })
        .await;
    if let Some(t) = isns {
        t.shutdown().await;
    }
    Ok(())
}

/// Whether stderr is connected to systemd's journal: `JOURNAL_STREAM`
/// names its device and inode (systemd.exec(5)).
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Some((dev, ino)) = std::env::var("JOURNAL_STREAM").ok().and_then(|v| {
        Some((
            v.split_once(':')?.0.parse::<u64>().ok()?,
            v.split_once(':')?.1.parse::<u64>().ok()?,
        ))
    }) else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    std::fs::File::from(fd)
        .metadata()
        .is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

fn main() -> ExitCode {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // `discover --aoe` listens for 1 s unless --timeout (or
    // $ETHERSAN_TIMEOUT) says how long.
    let timeout_given = matches
        .subcommand_matches("discover")
        .and_then(|m| m.value_source("timeout"))
        .is_some_and(|s| s != clap::parser::ValueSource::DefaultValue);
    // Generated from the command-line definitions; no runtime needed.
    match &cli.command {
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut cmd, "ethersan", &mut out);
            return print_out(&out);
        }
        Command::Man { subcommand, dir } => {
            let cmd = <Cli as clap::CommandFactory>::command();
            if let Some(dir) = dir {
                return match manual::write_all(cmd, dir) {
                    Ok(files) => {
                        say(format_args!(
                            "ethersan: wrote {} manual pages into {}",
                            files.len(),
                            dir.display()
                        ));
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        say(format_args!("ethersan: {e}"));
                        ExitCode::FAILURE
                    }
                };
            }
            return match manual::page(cmd, subcommand) {
                Ok(roff) => print_out(&roff),
                Err(e) => {
                    say(format_args!("ethersan: {e}"));
                    ExitCode::FAILURE
                }
            };
        }
        _ => {}
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("ETHERSAN_LOG")
                // fuser (attach's FUSE library) says "Mounting …" at info.
                .unwrap_or_else(|_| EnvFilter::new("info,fuser=warn"))
                // When `umount DIR` ends attach's FUSE session, fuser unmounts
                // again on its way out and warns that it could not ("Failed
                // to umount filesystem: Invalid argument"): not a fault.
                // attach reports its own unmount failures.
                .add_directive("fuser::session=error".parse().expect("a valid directive")),
        )
        .with_writer(|| QuietStderr);
    // The journal stamps every line itself: no second timestamp.
    match (cli.log_format, stderr_is_journal()) {
        (LogFormat::Human, false) => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        (LogFormat::Human, true) => logs.with_ansi(false).without_time().init(),
        // Without the Rust module as `target`: the target's name is a field.
        (LogFormat::Json, false) => logs.json().flatten_event(true).with_target(false).init(),
        (LogFormat::Json, true) => logs
            .json()
            .flatten_event(true)
            .with_target(false)
            .without_time()
            .init(),
    }
    // The server's configuration decides how many worker threads run.
    let mut serve_cfg = None;
    let mut workers = 0;
    if let Command::Serve(a) = &cli.command {
        match serve_config(a) {
            Ok(mut cfg) => {
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
                workers = cfg.options.worker_threads;
                // Pinned workers carry the connections; the main runtime
                // only accepts and handles signals.
                if cfg.options.placement == ethersan_server::config::Placement::Pinned {
                    workers = 1;
                }
                serve_cfg = Some(cfg);
            }
            Err(e) => {
                say(format_args!("ethersan: {e:#}"));
                return ExitCode::FAILURE;
            }
        }
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if workers > 0 {
        builder.worker_threads(workers);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            say(format_args!("ethersan: cannot start runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    if let Some(cfg) = serve_cfg
        .as_ref()
        .filter(|_| matches!(&cli.command, Command::Serve(a) if a.check))
    {
        return match check(cfg) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                say(format_args!("ethersan: {e:#}"));
                ExitCode::FAILURE
            }
        };
    }
    let result = rt.block_on(async {
        let result = match cli.command {
            Command::Serve(a) => {
                let api = ApiArgs {
                    socket: a.api_socket,
                    tcp: a.api,
                    token_file: a.api_token_file,
                    metrics: a.metrics,
                };
                serve(
                    serve_cfg.take().expect("parsed above"),
                    cli.log_format == LogFormat::Json,
                    a.config,
                    api,
                )
                .await
            }
            Command::Discover {
                eth: Some(iface),
                connect,
                json,
                ..
            } => {
                native_client::cmd_discover(
                    &format!("eth://{iface}/"),
                    &connect,
                    timeout_given,
                    json,
                )
                .await
            }
            Command::Discover {
                udp: Some(addr),
                connect,
                json,
                ..
            } => {
                native_client::cmd_discover(
                    &format!("udp://{addr}/"),
                    &connect,
                    timeout_given,
                    json,
                )
                .await
            }
            Command::Discover {
                portal,
                aoe,
                connect,
                json,
                ..
            } => match (aoe, portal) {
                (Some(link), _) => {
                    aoe_client::cmd_discover(&link, &connect, timeout_given, json).await
                }
                (None, Some(portal)) => client::cmd_discover(&portal, &connect, json).await,
                (None, None) => unreachable!("clap requires one"),
            },
            Command::Ls { url, connect, json } if ethersan_client::aoe::is_aoe_url(&url) => {
                aoe_client::cmd_ls(&url, &connect, json).await
            }
            Command::Ls { url, connect, json } => client::cmd_ls(&url, &connect, json).await,
            Command::Inquiry { url, connect, json } if ethersan_client::aoe::is_aoe_url(&url) => {
                aoe_client::cmd_inquiry(&url, &connect, json).await
            }
            Command::Inquiry { url, connect, json } => {
                client::cmd_inquiry(&url, &connect, json).await
            }
            Command::Cp(a) => cp::cmd_cp(a).await,
            Command::Bench(a) => bench::cmd_bench(a).await,
            Command::Attach(a) => attach::cmd_attach(a).await,
            Command::Ctl(a) => ctl::cmd_ctl(a).await,
            Command::Completions { .. } | Command::Man { .. } => {
                unreachable!("handled before the runtime")
            }
        };
        // The native transport's channels close before the process ends
        // (their CLOSE is sent by this process), so the target does not
        // hold them until its channel timeout.
        ethersan_client::native::wait_closed(std::time::Duration::from_secs(2)).await;
        result
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(StdoutError(io)) = e.downcast_ref::<StdoutError>() {
                exit_on_broken_pipe(io);
            }
            say(format_args!("ethersan: {e:#}"));
            ExitCode::FAILURE
        }
    }
}
