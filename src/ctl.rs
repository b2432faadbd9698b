//! `ethersan ctl`: change a running server through its management API.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use ethersan_admin::client::{Endpoint, Method};
use serde_json::{json, Value};

/// `ethersan ctl [--socket PATH | --api URL --token-file FILE] [--json] NOUN VERB …`
#[derive(Args, Debug)]
pub(crate) struct CtlArgs {
    /// The server's API socket (default: ethersan.sock in ./ethersan-data,
    /// the server's default data directory; also $ETHERSAN_API_SOCKET).
    #[arg(
        long,
        value_name = "PATH",
        env = "ETHERSAN_API_SOCKET",
        conflicts_with = "api"
    )]
    socket: Option<PathBuf>,
    /// The server's TCP API (serve --api), as http://HOST:PORT or HOST:PORT.
    #[arg(long, value_name = "URL", requires = "token_file")]
    api: Option<String>,
    /// A file holding the API's bearer token (with --api).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Print JSON (what the API answered).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    noun: Noun,
}

#[derive(Subcommand, Debug)]
enum Noun {
    /// Targets: ls, add IQN [--alias A], rm IQN [--force].
    Target {
        #[command(subcommand)]
        verb: TargetVerb,
    },
    /// LUNs: ls IQN, add IQN SPEC [--lun N], rm IQN LUN [--force], resize IQN LUN SIZE.
    Lun {
        #[command(subcommand)]
        verb: LunVerb,
    },
    /// Who may log in: ls IQN, add IQN INITIATOR|ADDR/LEN, rm IQN INITIATOR|ADDR/LEN.
    Acl {
        #[command(subcommand)]
        verb: AclVerb,
    },
    /// CHAP: set [IQN] USER (secret from stdin or --secret-file), clear [IQN].
    Chap {
        #[command(subcommand)]
        verb: ChapVerb,
    },
    /// Portals: ls, add ADDR:PORT [--advertise ADDR:PORT], rm ADDR:PORT.
    Portal {
        #[command(subcommand)]
        verb: PortalVerb,
    },
    /// Sessions: ls, logout ID.
    Session {
        #[command(subcommand)]
        verb: SessionVerb,
    },
    /// Look at every LUN's backing store size again.
    Rescan,
    /// Write the running configuration as TOML (default: the server's
    /// --config file, else ethersan.toml in its data directory).
    Save {
        /// Where (on the server's machine).
        file: Option<PathBuf>,
    },
    /// Print the API's OpenAPI description.
    Openapi,
}

#[derive(Subcommand, Debug)]
enum TargetVerb {
    /// List the targets.
    Ls,
    /// Export a new target (with no LUNs yet).
    Add {
        /// Its iSCSI name.
        iqn: String,
        /// Its alias.
        #[arg(long)]
        alias: Option<String>,
    },
    /// Stop exporting a target.
    Rm {
        /// Its iSCSI name.
        iqn: String,
        /// Also when sessions are logged in (they end).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand, Debug)]
enum LunVerb {
    /// List a target's LUNs.
    Ls {
        /// The target.
        iqn: String,
    },
    /// Add a LUN: SPEC as serve --lun (PATH[:SIZE][,opts] or ram:SIZE).
    Add {
        /// The target.
        iqn: String,
        /// The LUN.
        spec: String,
        /// Its number (default: the lowest free).
        #[arg(long)]
        lun: Option<u64>,
    },
    /// Remove a LUN.
    Rm {
        /// The target.
        iqn: String,
        /// The LUN number.
        lun: u64,
        /// Also while sessions are logged in to the target.
        #[arg(long)]
        force: bool,
    },
    /// Resize a file LUN (bytes or 10G, 512M…).
    Resize {
        /// The target.
        iqn: String,
        /// The LUN number.
        lun: u64,
        /// The new size.
        size: String,
    },
}

#[derive(Subcommand, Debug)]
enum AclVerb {
    /// List the access rules and what they mean (no rules: everyone).
    Ls {
        /// The target.
        iqn: String,
    },
    /// Add a rule: an initiator (iqn.…), a network (ADDR/LEN) or a name from a network (NAME@ADDR/LEN). Any rule admits; the first narrows an open target.
    Add {
        /// The target.
        iqn: String,
        /// The rule.
        entry: String,
    },
    /// Remove a rule (the sessions only it admitted end).
    Rm {
        /// The target.
        iqn: String,
        /// The rule, as acl ls shows it.
        entry: String,
    },
}

#[derive(Subcommand, Debug)]
enum ChapVerb {
    /// Require CHAP as USER; the secret is read from stdin or --secret-file.
    Set {
        /// [IQN] USER: with a target, that target's own credentials.
        #[arg(num_args = 1..=2, value_names = ["IQN", "USER"])]
        args: Vec<String>,
        /// A file holding the secret.
        #[arg(long)]
        secret_file: Option<PathBuf>,
    },
    /// Stop requiring CHAP (globally, or a target's own credentials).
    Clear {
        /// The target.
        iqn: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum PortalVerb {
    /// List the portals.
    Ls,
    /// Listen on a new portal.
    Add {
        /// ADDR:PORT.
        address: String,
        /// The address SendTargets announces for it (NAT, containers).
        #[arg(long)]
        advertise: Option<String>,
    },
    /// Stop listening on a portal (its sessions go on).
    Rm {
        /// ADDR:PORT.
        address: String,
    },
}

#[derive(Subcommand, Debug)]
enum SessionVerb {
    /// List the sessions.
    Ls,
    /// End a session (the initiator may log in again).
    Logout {
        /// The session id (from session ls).
        id: u64,
    },
}

/// Percent-encode a path segment (IQNs have ':' and '.', which are fine;
/// anything else unusual is encoded).
fn seg(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn endpoint(a: &CtlArgs) -> anyhow::Result<Endpoint> {
    if let Some(api) = &a.api {
        let file = a
            .token_file
            .as_ref()
            .context("--api needs --token-file FILE")?;
        let token = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read the token file {}", file.display()))?
            .trim_end_matches(['\n', '\r'])
            .to_string();
        let authority = api
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        if api.starts_with("https://") {
            bail!("--api {api}: the API speaks plain HTTP (put a TLS proxy in front for remote use); give http://HOST:PORT");
        }
        return Ok(Endpoint::Tcp { authority, token });
    }
    Ok(Endpoint::Unix(a.socket.clone().unwrap_or_else(|| {
        PathBuf::from("ethersan-data").join("ethersan.sock")
    })))
}

/// A LUN spec's relative path, made absolute (the server does not share
/// this working directory).
fn absolute_spec(spec: &str) -> anyhow::Result<String> {
    if spec.starts_with("ram:") || spec.starts_with('/') {
        return Ok(spec.to_string());
    }
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    Ok(format!("{}/{spec}", cwd.display()))
}

/// An ACL change's warning (it narrowed access, or opened the target),
/// on stderr unless the answer is printed as JSON.
fn acl_warning(v: &Value, json_out: bool) {
    if let (Some(w), false) = (v["warning"].as_str(), json_out) {
        note!("warning: {w}");
    }
}

pub(crate) async fn cmd_ctl(a: CtlArgs) -> anyhow::Result<()> {
    let ep = endpoint(&a)?;
    let json_out = a.json;
    let call = |m: Method, p: String, b: Option<Value>| {
        let ep = ep.clone();
        async move { ep.call(m, &p, b).await.map(|r| r.body) }
    };
    let done = |what: String, body: Value| {
        if json_out {
            out!(
                "{}",
                if body.is_null() {
                    json!({"ok": true})
                } else {
                    body
                }
            );
        } else {
            out!("{what}");
        }
    };
    match a.noun {
        Noun::Openapi => {
            out!("{}", ethersan_admin::openapi::document().trim_end());
        }
        Noun::Target { verb } => match verb {
            TargetVerb::Ls => {
                let v = call(Method::GET, "/api/v1/targets".into(), None).await?;
                if json_out {
                    out!("{v}");
                } else {
                    for t in v.as_array().into_iter().flatten() {
                        out!(
                            "{}  luns={} sessions={}{}",
                            t["name"].as_str().unwrap_or(""),
                            t["luns"].as_array().map_or(0, |l| l.len()),
                            t["sessions"],
                            t["alias"]
                                .as_str()
                                .map(|a| format!(" alias={a}"))
                                .unwrap_or_default()
                        );
                    }
                }
            }
            TargetVerb::Add { iqn, alias } => {
                let v = call(
                    Method::POST,
                    "/api/v1/targets".into(),
                    Some(json!({"name": iqn, "alias": alias})),
                )
                .await?;
                done(format!("added target {iqn}"), v);
            }
            TargetVerb::Rm { iqn, force } => {
                let v = call(
                    Method::DELETE,
                    format!("/api/v1/targets/{}?force={force}", seg(&iqn)),
                    None,
                )
                .await?;
                done(format!("removed target {iqn}"), v);
            }
        },
        Noun::Lun { verb } => match verb {
            LunVerb::Ls { iqn } => {
                let v = call(
                    Method::GET,
                    format!("/api/v1/targets/{}/luns", seg(&iqn)),
                    None,
                )
                .await?;
                if json_out {
                    out!("{v}");
                } else {
                    for l in v.as_array().into_iter().flatten() {
                        out!(
                            "LUN {}  {} bytes  bs={}{}  {}",
                            l["lun"],
                            l["size_bytes"],
                            l["block_size"],
                            if l["read_only"].as_bool() == Some(true) {
                                " ro"
                            } else {
                                ""
                            },
                            l["backend"].as_str().unwrap_or("")
                        );
                    }
                }
            }
            LunVerb::Add { iqn, spec, lun } => {
                let v = call(
                    Method::POST,
                    format!("/api/v1/targets/{}/luns", seg(&iqn)),
                    Some(json!({"spec": absolute_spec(&spec)?, "lun": lun})),
                )
                .await?;
                done(format!("added LUN {} to {iqn}", v["lun"]), v);
            }
            LunVerb::Rm { iqn, lun, force } => {
                let v = call(
                    Method::DELETE,
                    format!("/api/v1/targets/{}/luns/{lun}?force={force}", seg(&iqn)),
                    None,
                )
                .await?;
                done(format!("removed LUN {lun} of {iqn}"), v);
            }
            LunVerb::Resize { iqn, lun, size } => {
                let v = call(
                    Method::PUT,
                    format!("/api/v1/targets/{}/luns/{lun}/size", seg(&iqn)),
                    Some(json!({"size": size})),
                )
                .await?;
                done(
                    format!("LUN {lun} of {iqn} is now {} bytes", v["size_bytes"]),
                    v,
                );
            }
        },
        Noun::Acl { verb } => match verb {
            AclVerb::Ls { iqn } => {
                let v = call(
                    Method::GET,
                    format!("/api/v1/targets/{}/acl", seg(&iqn)),
                    None,
                )
                .await?;
                if json_out {
                    out!("{v}");
                } else {
                    let rules = v["rules"].as_array().cloned().unwrap_or_default();
                    let width = rules
                        .iter()
                        .map(|r| r["rule"].as_str().unwrap_or("").len())
                        .max()
                        .unwrap_or(0);
                    for r in &rules {
                        out!(
                            "{:width$}  {}",
                            r["rule"].as_str().unwrap_or(""),
                            r["meaning"].as_str().unwrap_or("")
                        );
                    }
                    out!("{iqn}: {}", v["access"].as_str().unwrap_or(""));
                }
            }
            AclVerb::Add { iqn, entry } => {
                let v = call(
                    Method::POST,
                    format!("/api/v1/targets/{}/acl", seg(&iqn)),
                    Some(json!({"entry": entry})),
                )
                .await?;
                acl_warning(&v, json_out);
                done(
                    format!(
                        "granted {entry} on {iqn}: {}",
                        v["access"].as_str().unwrap_or("")
                    ),
                    v,
                );
            }
            AclVerb::Rm { iqn, entry } => {
                let v = call(
                    Method::DELETE,
                    format!("/api/v1/targets/{}/acl?entry={}", seg(&iqn), seg(&entry)),
                    None,
                )
                .await?;
                acl_warning(&v, json_out);
                done(
                    format!(
                        "revoked {entry} on {iqn}: {}",
                        v["access"].as_str().unwrap_or("")
                    ),
                    v,
                );
            }
        },
        Noun::Chap { verb } => match verb {
            ChapVerb::Set { args, secret_file } => {
                let (target, user) = match args.as_slice() {
                    [u] => (None, u.clone()),
                    [t, u] => (Some(t.clone()), u.clone()),
                    _ => bail!("chap set takes [IQN] USER"),
                };
                let mut secret = match &secret_file {
                    Some(f) => std::fs::read_to_string(f)
                        .with_context(|| format!("cannot read the secret file {}", f.display()))?,
                    None => {
                        let mut s = String::new();
                        std::io::stdin()
                            .read_to_string(&mut s)
                            .context("cannot read the secret from stdin")?;
                        s
                    }
                };
                while secret.ends_with(['\n', '\r']) {
                    secret.pop();
                }
                if secret.is_empty() {
                    bail!("no secret: give it on stdin (echo SECRET | ethersan ctl chap set …) or with --secret-file FILE");
                }
                let v = call(
                    Method::PUT,
                    "/api/v1/chap".into(),
                    Some(json!({"target": target, "user": user, "secret": secret})),
                )
                .await?;
                done(
                    match &target {
                        Some(t) => format!("target {t} requires CHAP as {user}"),
                        None => format!("CHAP required as {user}"),
                    },
                    v,
                );
            }
            ChapVerb::Clear { iqn } => {
                let q = iqn
                    .as_ref()
                    .map(|t| format!("?target={}", seg(t)))
                    .unwrap_or_default();
                let v = call(Method::DELETE, format!("/api/v1/chap{q}"), None).await?;
                done("CHAP cleared".into(), v);
            }
        },
        Noun::Portal { verb } => match verb {
            PortalVerb::Ls => {
                let v = call(Method::GET, "/api/v1/portals".into(), None).await?;
                if json_out {
                    out!("{v}");
                } else {
                    for p in v.as_array().into_iter().flatten() {
                        let address = p["address"].as_str().unwrap_or("");
                        let reachable: Vec<&str> = p["reachable"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|a| a.as_str())
                            .collect();
                        let note = match p["advertise"].as_str() {
                            Some(a) => format!(" (advertised as {a})"),
                            // A wildcard portal: where initiators reach it.
                            None if reachable.iter().any(|r| *r != address) => {
                                format!(" (reached at {})", reachable.join(", "))
                            }
                            None => String::new(),
                        };
                        out!("{address}{note}");
                    }
                }
            }
            PortalVerb::Add { address, advertise } => {
                let v = call(
                    Method::POST,
                    "/api/v1/portals".into(),
                    Some(json!({"address": address, "advertise": advertise})),
                )
                .await?;
                done(
                    format!("listening on {}", v["address"].as_str().unwrap_or(&address)),
                    v,
                );
            }
            PortalVerb::Rm { address } => {
                let v = call(
                    Method::DELETE,
                    format!("/api/v1/portals/{}", seg(&address)),
                    None,
                )
                .await?;
                done(format!("no longer listening on {address}"), v);
            }
        },
        Noun::Session { verb } => match verb {
            SessionVerb::Ls => {
                let v = call(Method::GET, "/api/v1/sessions".into(), None).await?;
                if json_out {
                    out!("{v}");
                } else {
                    for s in v.as_array().into_iter().flatten() {
                        out!(
                            "{}  {} -> {}  {} {}  reads={} writes={}",
                            s["id"],
                            s["initiator"].as_str().unwrap_or(""),
                            s["target"].as_str().unwrap_or("(discovery)"),
                            s["transport"].as_str().unwrap_or(""),
                            s["address"].as_str().unwrap_or(""),
                            s["counters"]["reads"],
                            s["counters"]["writes"]
                        );
                    }
                }
            }
            SessionVerb::Logout { id } => {
                let v = call(Method::DELETE, format!("/api/v1/sessions/{id}"), None).await?;
                done(format!("session {id} ended"), v);
            }
        },
        Noun::Rescan => {
            let v = call(Method::POST, "/api/v1/rescan".into(), None).await?;
            done("rescanned".into(), v);
        }
        Noun::Save { file } => {
            let path = match file {
                Some(f) if f.is_relative() => Some(
                    std::env::current_dir()
                        .context("cannot read the working directory")?
                        .join(f),
                ),
                f => f,
            };
            let v = call(
                Method::POST,
                "/api/v1/save".into(),
                Some(json!({"path": path.map(|p| p.display().to_string())})),
            )
            .await?;
            done(saved_text(&v), v);
        }
    }
    Ok(())
}

/// What `ctl save` did, for a person: where, how, the backup, the changes.
fn saved_text(v: &Value) -> String {
    let path = v["path"].as_str().unwrap_or("");
    if v["written"] == false {
        return format!("{path} holds the running configuration already; nothing written");
    }
    let mut out = format!("saved the running configuration to {path}");
    match v["note"].as_str() {
        Some(n) => out.push_str(&format!(" (written whole: {n})")),
        None if v["edited"] == true => out.push_str(" (edited in place: comments and layout kept)"),
        None => {}
    }
    if let Some(b) = v["backup"].as_str() {
        out.push_str(&format!("\nprevious version kept in {b}"));
    }
    for c in v["changes"].as_array().into_iter().flatten() {
        out.push_str(&format!("\n  {}", c.as_str().unwrap_or("")));
    }
    out
}
