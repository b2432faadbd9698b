//! iSCSI URLs as libiscsi writes them:
//! `iscsi://[user[%secret]@]host[:port]/target-iqn/lun`.

use crate::Error;

/// A parsed iSCSI URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiUrl {
    /// CHAP user, if given.
    pub user: Option<String>,
    /// CHAP secret, if given.
    pub secret: Option<String>,
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port (3260 by default).
    pub port: u16,
    /// Target name; empty for a portal-only URL.
    pub target: String,
    /// LUN (0 when not given).
    pub lun: u64,
}

impl IscsiUrl {
    /// Parse a URL.
    pub fn parse(s: &str) -> Result<IscsiUrl, Error> {
        let rest = s
            .strip_prefix("iscsi://")
            .ok_or_else(|| Error::Url(format!("{s}: must start with iscsi://")))?;
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((a, r)) => (Some(a), r),
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
                .ok_or_else(|| Error::Url(format!("{s}: unclosed '['")))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p
                    .parse()
                    .map_err(|_| Error::Url(format!("{s}: bad port {p:?}")))?,
                None => 3260,
            };
            (h.to_string(), port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse()
                        .map_err(|_| Error::Url(format!("{s}: bad port {p:?}")))?,
                ),
                None => (hostport.to_string(), 3260),
            }
        };
        if host.is_empty() {
            return Err(Error::Url(format!("{s}: no host")));
        }
        let path = path.trim_end_matches('/');
        let (target, lun) = match path.rsplit_once('/') {
            Some((t, l)) => (
                t.to_string(),
                l.parse()
                    .map_err(|_| Error::Url(format!("{s}: bad LUN {l:?}")))?,
            ),
            None => (path.to_string(), 0),
        };
        Ok(IscsiUrl {
            user,
            secret,
            host,
            port,
            target,
            lun,
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
    }
}
