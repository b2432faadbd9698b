//! How the client connects: CHAP (in the URL or from the flags), mutual
//! CHAP, the native transport's group, and how long it waits. Every
//! command that talks to a target takes these as [`ConnectArgs`] (a
//! `clap` argument group).

use std::time::Duration;

use anyhow::bail;
use ethersan_initiator::LoginOptions;
use ethersan_proto::chap::Credentials;

use crate::url::IscsiUrl;

/// Initiator name the client logs in with.
pub const CLIENT_IQN: &str = "iqn.2026-11.org.ethersan:client";

/// Largest single command the client sends when the target sets no limit.
pub const DEFAULT_MAX_TRANSFER: u64 = 1 << 20;

/// How the client logs in: CHAP (in the URL or here), mutual CHAP, and
/// how long it waits. Every subcommand that talks to a target takes these.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConnectArgs {
    /// Log in with CHAP as USER:SECRET (also $ETHERSAN_CHAP); credentials
    /// in the URL (iscsi://USER%SECRET@host/...) win.
    #[arg(
        long,
        value_name = "USER:SECRET",
        env = "ETHERSAN_CHAP",
        hide_env_values = true
    )]
    pub chap: Option<String>,
    /// Mutual CHAP: the target must prove itself as USER:SECRET (also
    /// $ETHERSAN_MUTUAL_CHAP); ?target_user=U&target_password=P in the URL
    /// wins.
    #[arg(
        long,
        value_name = "USER:SECRET",
        env = "ETHERSAN_MUTUAL_CHAP",
        hide_env_values = true
    )]
    pub mutual_chap: Option<String>,
    /// Longest wait for the connection, the login, each command and the
    /// logout (e.g. 30s, 500ms, 2m; 0: forever). A command that times out
    /// closes its session. Also $ETHERSAN_TIMEOUT.
    #[arg(
        long,
        value_name = "DURATION",
        env = "ETHERSAN_TIMEOUT",
        default_value = "30s",
        value_parser = parse_timeout
    )]
    pub timeout: Timeout,
    /// The native transport's group (eth:// and udp:// URLs).
    #[arg(long, value_name = "NAME", env = "ETHERSAN_GROUP")]
    pub group: Option<String>,
    /// A file holding the group secret (else $ETHERSAN_GROUP_SECRET).
    #[arg(long, value_name = "FILE")]
    pub group_secret_file: Option<std::path::PathBuf>,
}

/// `--timeout`: `None` waits forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout(pub Option<std::time::Duration>);

impl Default for Timeout {
    fn default() -> Self {
        Timeout(Some(ethersan_initiator::DEFAULT_TIMEOUT))
    }
}

fn parse_timeout(s: &str) -> Result<Timeout, String> {
    let digits = s.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if digits.trim().parse::<f64>() == Ok(0.0) {
        return Ok(Timeout(None));
    }
    parse_duration(s).map(|d| Timeout(Some(d)))
}

impl ConnectArgs {
    /// The native transport group's keys, from --group and the secret
    /// (--group-secret-file, else $ETHERSAN_GROUP_SECRET).
    pub fn group_keys(&self) -> anyhow::Result<ethersan_channel::group::GroupKeys> {
        let Some(group) = &self.group else {
            bail!("eth:// and udp:// URLs need the group: give --group NAME (or set ETHERSAN_GROUP) and its secret (--group-secret-file FILE or ETHERSAN_GROUP_SECRET)");
        };
        let env = std::env::var("ETHERSAN_GROUP_SECRET").ok();
        let secret = ethersan_channel::group::load_secret(
            self.group_secret_file.as_deref(),
            env.as_deref(),
            None,
        )
        .map_err(|e| anyhow::anyhow!("group {group:?}: {e}"))?;
        ethersan_channel::group::GroupKeys::derive(group, &secret)
            .map_err(|e| anyhow::anyhow!("group {group:?}: {e}"))
    }

    /// Login options for `url` (`None`: a discovery session), with the
    /// URL's credentials before the flags'.
    pub fn options(&self, url: Option<&IscsiUrl>) -> anyhow::Result<LoginOptions> {
        let chap = match url.and_then(|u| u.user.as_ref().map(|user| (user, &u.secret))) {
            Some((user, Some(secret))) => Some(
                Credentials::new(user, secret.as_bytes())
                    .map_err(|e| anyhow::anyhow!("CHAP in the URL: {e}"))?,
            ),
            Some((_, None)) => {
                bail!("the URL names a CHAP user but no secret: write iscsi://USER%SECRET@host/... or give --chap USER:SECRET")
            }
            None => match &self.chap {
                Some(c) => Some(Credentials::parse(c).map_err(|e| anyhow::anyhow!("--chap: {e}"))?),
                None => None,
            },
        };
        let target_chap = match url.map(|u| (&u.target_user, &u.target_secret)) {
            Some((Some(user), Some(secret))) => Some(
                Credentials::new(user, secret.as_bytes())
                    .map_err(|e| anyhow::anyhow!("mutual CHAP in the URL: {e}"))?,
            ),
            Some((Some(_), None)) | Some((None, Some(_))) => {
                bail!("the URL's mutual CHAP needs both target_user and target_password")
            }
            _ => match &self.mutual_chap {
                Some(c) => {
                    Some(Credentials::parse(c).map_err(|e| anyhow::anyhow!("--mutual-chap: {e}"))?)
                }
                None => None,
            },
        };
        if target_chap.is_some() && chap.is_none() {
            bail!("mutual CHAP (--mutual-chap, $ETHERSAN_MUTUAL_CHAP or target_user in the URL) needs CHAP credentials of our own too: add --chap USER:SECRET");
        }
        Ok(LoginOptions {
            initiator_name: CLIENT_IQN.to_string(),
            target_name: url.map(|u| u.target.clone()),
            chap,
            target_chap,
            timeout: self.timeout.0,
            ..Default::default()
        })
    }
}

/// A duration: a number with an optional ms, s or m suffix (seconds by default).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad duration {s:?} (e.g. 10s, 500ms, 2m)"))?;
    if !(v > 0.0 && v.is_finite()) {
        return Err(format!("bad duration {s:?}: must be positive"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}
