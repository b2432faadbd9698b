//! `ethersan`: a software iSCSI target and its companion client.
//!
//! `ethersan serve` runs the target; with no arguments it serves the
//! embedded default (127.0.0.1:3260, one target, a 1 GiB sparse LUN under
//! `./ethersan-data/`).

// The doc comments on the clap structs of this binary are its `--help` text,
// written for a terminal: `host[:port]` is syntax, not an intra-doc link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
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
mod nvme_client;
mod serve;

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
    Serve(Box<serve::ServeArgs>),
    /// List the targets and portals a portal offers (SendTargets), or with
    /// --aoe the AoE devices on a link.
    Discover {
        /// HOST[:PORT] of a portal (port 3260 by default), or an iscsi:// URL;
        /// nvme+tcp://HOST[:PORT] lists an NVMe/TCP discovery controller's log.
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
        /// aoe://IFACE/SHELF.SLOT or aoe+unix://SHELF.SLOT?local=PATH&peer=PATH;
        /// nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN[/NSID]
        url: String,
        #[command(flatten)]
        connect: ethersan_client::ConnectArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one LUN's INQUIRY data and VPD pages (an AoE device's IDENTIFY
    /// data, an NVMe namespace's Identify data).
    Inquiry {
        /// iscsi://[USER%SECRET@]host[:port]/TARGET/LUN;
        /// the native transport's eth://IFACE/TARGET/LUN or
        /// udp://HOST[:PORT]/TARGET/LUN (?security=none|integrity|encrypt);
        /// aoe://IFACE/SHELF.SLOT or aoe+unix://SHELF.SLOT?local=PATH&peer=PATH;
        /// nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN[/NSID]
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
    /// qemu-img, dd…) until DIR is unmounted or the command is stopped; or,
    /// with --block, as a kernel block device /dev/nbdN until detached.
    Attach(attach::AttachArgs),
    /// End an `attach --block`: write back /dev/nbdN's cache, disconnect
    /// it, and wait for its server to flush the LUN and log out.
    Detach {
        /// The device attach --block printed (/dev/nbdN).
        device: PathBuf,
        /// Disconnect even while the device is mounted or held (its users
        /// get I/O errors).
        #[arg(long)]
        force: bool,
        /// How long to wait for the server to finish (e.g. 30s).
        #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = ethersan_client::parse_duration)]
        wait: std::time::Duration,
    },
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
        match serve::config(a) {
            Ok(cfg) => {
                workers = serve::runtime_threads(&cfg);
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
        return serve::check(cfg);
    }
    let result = rt.block_on(async {
        let result = match cli.command {
            Command::Serve(a) => {
                serve::serve(
                    *a,
                    serve_cfg.take().expect("parsed above"),
                    cli.log_format == LogFormat::Json,
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
                (None, Some(portal)) if ethersan_client::nvme::is_nvme_url(&portal) => {
                    nvme_client::cmd_discover(&portal, &connect, json).await
                }
                (None, Some(portal)) => client::cmd_discover(&portal, &connect, json).await,
                (None, None) => unreachable!("clap requires one"),
            },
            Command::Ls { url, connect, json } if ethersan_client::aoe::is_aoe_url(&url) => {
                aoe_client::cmd_ls(&url, &connect, json).await
            }
            Command::Ls { url, connect, json } if ethersan_client::nvme::is_nvme_url(&url) => {
                nvme_client::cmd_ls(&url, &connect, json).await
            }
            Command::Ls { url, connect, json } => client::cmd_ls(&url, &connect, json).await,
            Command::Inquiry { url, connect, json } if ethersan_client::aoe::is_aoe_url(&url) => {
                aoe_client::cmd_inquiry(&url, &connect, json).await
            }
            Command::Inquiry { url, connect, json } if ethersan_client::nvme::is_nvme_url(&url) => {
                nvme_client::cmd_inquiry(&url, &connect, json).await
            }
            Command::Inquiry { url, connect, json } => {
                client::cmd_inquiry(&url, &connect, json).await
            }
            Command::Cp(a) => cp::cmd_cp(a).await,
            Command::Bench(a) => bench::cmd_bench(a).await,
            Command::Attach(a) => attach::cmd_attach(a).await,
            Command::Detach {
                device,
                force,
                wait,
            } => attach::cmd_detach(&device, force, wait).await,
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
