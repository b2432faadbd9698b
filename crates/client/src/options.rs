//! How the client connects: CHAP (in the URL, from the flags or from a
//! file), mutual CHAP, the native transport's group, and how long it
//! waits. Every command that talks to a target takes these as
//! [`ConnectArgs`] (a `clap` argument group).

use std::io::Read;
use std::path::{Path, PathBuf};
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
    /// Log in with CHAP as the USER:SECRET this file holds (one line; an
    /// empty file: no CHAP), so the secret is on no command line and in no
    /// environment; credentials in the URL win. Not with --chap or
    /// $ETHERSAN_CHAP.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "chap",
        value_parser = parse_chap_file
    )]
    pub chap_file: Option<ChapFile>,
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
    pub group_secret_file: Option<PathBuf>,
}

/// `--chap-file`: the file, read when the arguments are parsed (before
/// any device is set up or any connection made), and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapFile {
    /// Where the credentials were read from.
    pub path: PathBuf,
    /// `None`: the file is empty (no CHAP).
    pub credentials: Option<Credentials>,
}

/// Longest `--chap-file` read: a name, a colon and a secret at their
/// RFC 7143 limits, and a line end.
const MAX_CHAP_FILE: u64 =
    (ethersan_proto::chap::MAX_NAME + 1 + ethersan_proto::chap::MAX_CHALLENGE + 2) as u64;

fn parse_chap_file(s: &str) -> Result<ChapFile, String> {
    let path = PathBuf::from(s);
    let credentials = read_chap_file(&path)?;
    Ok(ChapFile { path, credentials })
}

/// The credentials in a `--chap-file`: `USER:SECRET` on one line (one
/// trailing newline, or CRLF, dropped); `None` when the file is empty.
/// The errors never show what the file holds: clap puts the file's name
/// in front of them.
fn read_chap_file(path: &Path) -> Result<Option<Credentials>, String> {
    let mut held = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CHAP_FILE + 1).read_to_end(&mut held))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                "no such file: create it holding USER:SECRET on one line".to_string()
            }
            _ => format!("cannot read it: {e}"),
        })?;
    if held.len() as u64 > MAX_CHAP_FILE {
        return Err(format!(
            "longer than {MAX_CHAP_FILE} bytes: it should hold USER:SECRET on one line"
        ));
    }
    if held.last() == Some(&b'\n') {
        held.pop();
        if held.last() == Some(&b'\r') {
            held.pop();
        }
    }
    if held.is_empty() {
        return Ok(None);
    }
    if held.contains(&b'\n') {
        return Err("holds more than one line: write USER:SECRET on one line".to_string());
    }
    let Some(colon) = held.iter().position(|&b| b == b':') else {
        return Err(
            "does not hold USER:SECRET: write the CHAP user, a colon and the secret on one line"
                .to_string(),
        );
    };
    let user = std::str::from_utf8(&held[..colon])
        .map_err(|_| "the CHAP user in it is not UTF-8 text".to_string())?;
    Credentials::new(user, &held[colon + 1..]).map(Some)
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
                bail!("the URL names a CHAP user but no secret: write iscsi://USER%SECRET@host/... or give --chap USER:SECRET or --chap-file FILE")
            }
            // clap lets only one of them through (with $ETHERSAN_CHAP too).
            None => match (&self.chap, &self.chap_file) {
                (Some(c), _) => {
                    Some(Credentials::parse(c).map_err(|e| anyhow::anyhow!("--chap: {e}"))?)
                }
                (None, Some(file)) => file.credentials.clone(),
                (None, None) => None,
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
            bail!("mutual CHAP (--mutual-chap, $ETHERSAN_MUTUAL_CHAP or target_user in the URL) needs CHAP credentials of our own too: add --chap USER:SECRET or --chap-file FILE");
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `ConnectArgs` as a command line of its own.
    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        connect: ConnectArgs,
    }

    fn parse(args: &[&str]) -> Result<ConnectArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied())).map(|c| c.connect)
    }

    fn write(dir: &Path, name: &str, held: &[u8]) -> String {
        let p = dir.join(name);
        std::fs::write(&p, held).unwrap();
        p.display().to_string()
    }

    #[test]
    fn a_chap_file_holds_user_colon_secret_on_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let good = Credentials::new("initiator", b"s3cret:with-colon").unwrap();
        for held in [
            &b"initiator:s3cret:with-colon\n"[..],
            b"initiator:s3cret:with-colon\r\n",
            b"initiator:s3cret:with-colon",
        ] {
            let f = write(d, "chap", held);
            assert_eq!(read_chap_file(Path::new(&f)), Ok(Some(good.clone())));
        }
        // Empty: no CHAP (a service unit passes a file either way).
        for held in [&b""[..], b"\n"] {
            let f = write(d, "empty", held);
            assert_eq!(read_chap_file(Path::new(&f)), Ok(None));
        }
        // What is wrong and what to do, never what the file holds.
        let cases: [(&[u8], &str); 5] = [
            (b"just-a-secret-value\n", "does not hold USER:SECRET"),
            (b"initiator:s3cret-s3cret\n\n", "more than one line"),
            (b"initiator:short\n", "at least 12 bytes"),
            (b":s3cret-s3cret\n", "the CHAP user must be"),
            (b"\xff:s3cret-s3cret\n", "not UTF-8"),
        ];
        for (held, want) in cases {
            let f = write(d, "bad", held);
            let e = read_chap_file(Path::new(&f)).unwrap_err();
            assert!(e.contains(want), "{e}");
            assert!(!e.contains("s3cret") && !e.contains("just-a-secret"), "{e}");
        }
        let long = vec![b'x'; MAX_CHAP_FILE as usize + 1];
        let f = write(d, "long", &long);
        let e = read_chap_file(Path::new(&f)).unwrap_err();
        assert!(e.contains("longer than"), "{e}");
        let e = read_chap_file(&d.join("missing")).unwrap_err();
        assert!(
            e.contains("no such file") && e.contains("USER:SECRET"),
            "{e}"
        );
    }

    #[test]
    fn the_chap_file_logs_in_unless_the_url_has_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), "chap", b"from-file:file-secret-1234\n");
        let args = parse(&["--chap-file", &f]).unwrap();
        assert_eq!(args.chap_file.as_ref().unwrap().path, Path::new(&f));
        let chap = args.options(None).unwrap().chap.unwrap();
        assert_eq!(
            (chap.user.as_str(), chap.secret.as_slice()),
            ("from-file", &b"file-secret-1234"[..])
        );
        let url = IscsiUrl::parse("iscsi://from-url%url-secret-1234@127.0.0.1/iqn.x:y/0").unwrap();
        let chap = args.options(Some(&url)).unwrap().chap.unwrap();
        assert_eq!(chap.user, "from-url");
        // Mutual CHAP with the file's credentials as ours.
        let args = parse(&["--chap-file", &f, "--mutual-chap", "tgt:target-secret-1"]).unwrap();
        assert!(args.options(None).unwrap().target_chap.is_some());
        // An empty file: no CHAP, and mutual CHAP says what is missing.
        let empty = write(dir.path(), "empty", b"");
        let args = parse(&["--chap-file", &empty]).unwrap();
        assert!(args.options(None).unwrap().chap.is_none());
        let args = parse(&[
            "--chap-file",
            &empty,
            "--mutual-chap",
            "tgt:target-secret-1",
        ])
        .unwrap();
        let e = args.options(None).unwrap_err().to_string();
        assert!(e.contains("--chap-file FILE"), "{e}");
    }

    #[test]
    fn chap_and_chap_file_conflict_and_a_bad_file_names_itself() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), "chap", b"from-file:file-secret-1234\n");
        let e = parse(&["--chap", "u:flag-secret-1234", "--chap-file", &f]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{e}");
        let bad = write(dir.path(), "bad", b"no colon here\n");
        let e = parse(&["--chap-file", &bad]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&bad) && text.contains("--chap-file") && text.contains("USER:SECRET"),
            "{text}"
        );
    }
}
