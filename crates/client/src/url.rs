//! iSCSI URLs as libiscsi writes them:
//! `iscsi://[user[%secret]@]host[:port]/target-iqn/lun[?target_user=U&target_password=P]`,
//! and the same session over ethersan's native transport:
//! `eth://IFACE/target-iqn/lun` (raw Ethernet; the target is found by
//! group discovery) and `udp://host[:port]/target-iqn/lun` (port 3262 by
//! default), both with the query keys `security=none|integrity|encrypt`,
//! `mtu=N`, and for `eth://` also `ethertype=0xXXXX` and `mac=MAC` (skip
//! discovery).
//!
//! Secrets never appear in an error: a URL is quoted with its secrets
//! replaced by `***`.

/// A URL that does not parse. Its text quotes the URL with the secrets
/// replaced by `***`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad iSCSI URL: {0}")]
pub struct UrlError(pub String);

/// A parsed iSCSI URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiUrl {
    /// CHAP user, if given.
    pub user: Option<String>,
    /// CHAP secret, if given.
    pub secret: Option<String>,
    /// Mutual CHAP: the target's user (`?target_user=`).
    pub target_user: Option<String>,
    /// Mutual CHAP: the target's secret (`&target_password=`).
    pub target_secret: Option<String>,
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port (3260 by default).
    pub port: u16,
    /// Target name; empty for a portal-only URL.
    pub target: String,
    /// LUN (0 when not given).
    pub lun: u64,
    /// Whether the URL ends in a LUN number.
    pub has_lun: bool,
    /// What carries the session.
    pub transport: Transport,
}

/// What carries an iSCSI session.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Transport {
    /// TCP (`iscsi://`).
    #[default]
    Tcp,
    /// ethersan's native transport on raw Ethernet (`eth://IFACE/…`); the
    /// URL's host is the interface.
    Eth(NativeParams),
    /// ethersan's native transport over UDP (`udp://host:port/…`).
    Udp(NativeParams),
}

/// The native transport's URL parameters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NativeParams {
    /// `security=`: the channel's level (the client's default: encrypt).
    pub security: Option<String>,
    /// `mtu=`: the path MTU (UDP) or frame payload limit (Ethernet).
    pub mtu: Option<usize>,
    /// `ethertype=` (Ethernet).
    pub ethertype: Option<u16>,
    /// `mac=`: the target's MAC (Ethernet), skipping discovery.
    pub mac: Option<String>,
}

impl IscsiUrl {
    /// Parse a URL.
    pub fn parse(url: &str) -> Result<IscsiUrl, UrlError> {
        let s = &redact(url);
        let (rest, mut transport, default_port) = if let Some(r) = url.strip_prefix("iscsi://") {
            (r, Transport::Tcp, 3260)
        } else if let Some(r) = url.strip_prefix("eth://") {
            (r, Transport::Eth(NativeParams::default()), 0)
        } else if let Some(r) = url.strip_prefix("udp://") {
            (r, Transport::Udp(NativeParams::default()), 3262)
        } else {
            return Err(UrlError(format!(
                "{s}: must start with iscsi://, eth:// or udp://"
            )));
        };
        let (auth, rest) = match auth_end(rest) {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (user, secret) = match auth {
            Some(a) => match a.split_once('%') {
                Some((u, p)) => (Some(u.to_string()), Some(p.to_string())),
                None => (Some(a.to_string()), None),
            },
            None => (None, None),
        };
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let (h, after) = h
                .split_once(']')
                .ok_or_else(|| UrlError(format!("{s}: unclosed '['")))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p
                    .parse()
                    .map_err(|_| UrlError(format!("{s}: bad port {p:?}")))?,
                None => default_port,
            };
            (h.to_string(), port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse()
                        .map_err(|_| UrlError(format!("{s}: bad port {p:?}")))?,
                ),
                None => (hostport.to_string(), default_port),
            }
        };
        if host.is_empty() {
            return Err(UrlError(format!("{s}: no host")));
        }
        let (path, query) = match path.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path, None),
        };
        let (mut target_user, mut target_secret) = (None, None);
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            let native = match &mut transport {
                Transport::Eth(p) | Transport::Udp(p) => Some(p),
                Transport::Tcp => None,
            };
            match (pair.split_once('='), native) {
                (Some(("target_user", v)), _) => target_user = Some(v.to_string()),
                (Some(("target_password", v)), _) => target_secret = Some(v.to_string()),
                (Some(("security", v)), Some(p)) => p.security = Some(v.to_string()),
                (Some(("mtu", v)), Some(p)) => {
                    p.mtu = Some(
                        v.parse()
                            .ok()
                            .filter(|m| (576..=65_535).contains(m))
                            .ok_or_else(|| {
                                UrlError(format!("{s}: mtu={v:?}: give a number from 576 to 65535"))
                            })?,
                    )
                }
                (Some(("ethertype", v)), Some(p)) => {
                    let h = v.trim_start_matches("0x").trim_start_matches("0X");
                    p.ethertype = Some(
                        u16::from_str_radix(h, 16)
                            .ok()
                            .filter(|t| *t >= 0x0600)
                            .ok_or_else(|| {
                                UrlError(format!(
                                    "{s}: ethertype={v:?}: give a hex EtherType such as 0x88B5"
                                ))
                            })?,
                    )
                }
                (Some(("mac", v)), Some(p)) => p.mac = Some(v.to_string()),
                // Not echoed: after a target_password with '&' in it, the
                // "parameter" is part of the secret.
                (_, native) => {
                    let known = if native.is_some() {
                        "target_user, target_password, security, mtu, ethertype, mac"
                    } else {
                        "target_user, target_password"
                    };
                    return Err(UrlError(format!(
                        "{s}: unknown parameter in the query (known: {known})"
                    )));
                }
            }
        }
        let path = path.trim_end_matches('/');
        let (target, lun, has_lun) = match path.rsplit_once('/') {
            Some((t, l)) => (
                t.to_string(),
                l.parse()
                    .map_err(|_| UrlError(format!("{s}: bad LUN {l:?}")))?,
                true,
            ),
            None => (path.to_string(), 0, false),
        };
        Ok(IscsiUrl {
            user,
            secret,
            target_user,
            target_secret,
            host,
            port,
            target,
            lun,
            has_lun,
            transport,
        })
    }

    /// `host:port` for connecting (IPv6 in brackets).
    pub fn portal(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// `url` with the CHAP secrets (`user%SECRET@`, `target_password=`)
/// replaced by `***`, fit to print.
pub fn redact(url: &str) -> String {
    let mut out = url.to_string();
    let scheme = ["iscsi://", "eth://", "udp://"]
        .into_iter()
        .find(|p| url.starts_with(p));
    if let Some((scheme, rest)) = scheme.and_then(|p| Some((p, url.strip_prefix(p)?))) {
        if let Some(at) = auth_end(rest) {
            if let Some(pct) = rest[..at].find('%') {
                let start = scheme.len() + pct + 1;
                out.replace_range(start..start + (at - pct - 1), "***");
            }
        }
    }
    // Everything after target_password= (the secret may hold '&').
    if let Some(i) = out.find("target_password=") {
        let start = i + "target_password=".len();
        out.replace_range(start.., "***");
    }
    out
}

/// Where the `user%secret` part of `rest` (a URL after `iscsi://`) ends:
/// the last `@` before the mutual-CHAP query, if any. Hosts, target names
/// and LUNs hold no `@`; a secret may hold `?`, `/` or `@`.
fn auth_end(rest: &str) -> Option<usize> {
    let query = ["?target_user=", "?target_password="]
        .iter()
        .filter_map(|k| rest.find(k))
        .min()
        .unwrap_or(rest.len());
    rest[..query].rfind('@')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_libiscsi_forms() {
        let u =
            IscsiUrl::parse("iscsi://127.0.0.1:3261/iqn.2026-11.org.ethersan:default/2").unwrap();
        assert_eq!(u.host, "127.0.0.1");
        assert_eq!(u.port, 3261);
        assert_eq!(u.target, "iqn.2026-11.org.ethersan:default");
        assert_eq!(u.lun, 2);
        let u = IscsiUrl::parse("iscsi://bob%s3cret@[::1]/iqn.x:y/0").unwrap();
        assert_eq!(u.user.as_deref(), Some("bob"));
        assert_eq!(u.secret.as_deref(), Some("s3cret"));
        assert_eq!(u.portal(), "[::1]:3260");
        let u = IscsiUrl::parse("iscsi://host").unwrap();
        assert_eq!((u.target.as_str(), u.lun), ("", 0));
        assert!(IscsiUrl::parse("http://x/y/0").is_err());
        assert!(IscsiUrl::parse("iscsi://h:99999/t/0").is_err());
        assert!(IscsiUrl::parse("iscsi://h/t/x").is_err());
        let u = IscsiUrl::parse(
            "iscsi://bob%s3cret@h/iqn.x:y/1?target_user=tgt&target_password=tgt-secret",
        )
        .unwrap();
        assert_eq!(u.lun, 1);
        assert_eq!(u.target_user.as_deref(), Some("tgt"));
        assert_eq!(u.target_secret.as_deref(), Some("tgt-secret"));
    }

    #[test]
    fn secrets_may_hold_url_punctuation() {
        let u = IscsiUrl::parse("iscsi://bob%pa?ss/w@rd@h:3261/iqn.x:y/2").unwrap();
        assert_eq!(u.secret.as_deref(), Some("pa?ss/w@rd"));
        assert_eq!((u.host.as_str(), u.port, u.lun), ("h", 3261, 2));
        assert_eq!(redact("iscsi://bob%pa?ss@h/t/0"), "iscsi://bob%***@h/t/0");
        let e = IscsiUrl::parse("iscsi://h/t/0?target_user=t&target_password=ab&cd-secret")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("cd-secret"), "{e}");
        let e = IscsiUrl::parse("iscsi://bob%pa?ss-secret@h:99999/t/0")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("ss-secret"), "{e}");
    }

    #[test]
    fn errors_never_show_secrets() {
        for bad in [
            "iscsi://bob%s3cret-xyz@h:99999/t/0",
            "iscsi://bob%s3cret-xyz@h/t/x",
            "iscsi://bob%s3cret-xyz@/t/0",
            "iscsi://b%s3cret-xyz@h/t/0?target_password=s3cret-xyz&x=1",
            "iscsi://h/t/0?target_user=t&target_password=s3cret-xyz&oops",
        ] {
            let e = IscsiUrl::parse(bad).unwrap_err().to_string();
            assert!(!e.contains("s3cret-xyz"), "{e}");
            assert!(e.contains("***"), "{e}");
        }
        assert_eq!(
            redact("iscsi://u%p@h/t/0?target_user=t&target_password=q"),
            "iscsi://u%***@h/t/0?target_user=t&target_password=***"
        );
    }
}
