//! `nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN[/NSID][?hostnqn=NQN&digest=D&queues=N]`:
//! a namespace of an NVMe/TCP subsystem (port 4420 and NSID 1 by default;
//! `digest=none|header|data|both` asks for CRC32C digests, `queues=N`
//! opens N I/O queues, 1 to 16, 1 by default). Without a
//! subsystem NQN the URL names the discovery controller
//! (`nqn.2014-08.org.nvmexpress.discovery`), as `discover` takes it.

/// The well-known NQN of a discovery controller.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// The default NVMe/TCP port (IANA).
pub const DEFAULT_PORT: u16 = 4420;

/// The URL prefix.
pub const SCHEME: &str = "nvme+tcp://";

/// A URL that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad NVMe/TCP URL {url:?}: {why}; give nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN[/NSID][?hostnqn=NQN]")]
pub struct NvmeUrlError {
    /// The URL.
    pub url: String,
    /// What is wrong.
    pub why: String,
}

/// A parsed `nvme+tcp://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeUrl {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Subsystem NQN; the discovery NQN when the URL names none.
    pub subnqn: String,
    /// Namespace ID (1 when not given).
    pub nsid: u32,
    /// Whether the URL names a namespace ID.
    pub has_nsid: bool,
    /// `?hostnqn=`: the host NQN to connect as.
    pub hostnqn: Option<String>,
    /// `?digest=header|both`: ask for header digests.
    pub header_digest: bool,
    /// `?digest=data|both`: ask for data digests.
    pub data_digest: bool,
    /// `?queues=N`: I/O queues to open.
    pub queues: u16,
}

impl NvmeUrl {
    /// Parses a URL.
    pub fn parse(url: &str) -> Result<NvmeUrl, NvmeUrlError> {
        let err = |why: String| NvmeUrlError {
            url: url.to_string(),
            why,
        };
        let rest = url
            .strip_prefix(SCHEME)
            .ok_or_else(|| err(format!("must start with {SCHEME}")))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (hostport, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let (h, after) = h
                .split_once(']')
                .ok_or_else(|| err("unclosed '['".into()))?;
            (h, after.strip_prefix(':'))
        } else if hostport.matches(':').count() > 1 {
            (hostport, None)
        } else {
            match hostport.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        let port = match port {
            Some(p) => p
                .parse()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| err(format!("bad port {p:?}")))?,
            None => DEFAULT_PORT,
        };
        if host.is_empty() {
            return Err(err("no host".into()));
        }
        let path = path.trim_end_matches('/');
        let (subnqn, nsid, has_nsid) = match path.rsplit_once('/') {
            Some((nqn, n)) => {
                let nsid = n
                    .parse::<u32>()
                    .ok()
                    .filter(|&n| n != 0 && n != u32::MAX)
                    .ok_or_else(|| err(format!("bad namespace ID {n:?}")))?;
                (nqn, nsid, true)
            }
            None => (path, 1, false),
        };
        if subnqn.contains('/') || subnqn.len() > 223 {
            return Err(err(format!("bad subsystem NQN {subnqn:?}")));
        }
        let subnqn = if subnqn.is_empty() {
            DISCOVERY_NQN.to_string()
        } else {
            subnqn.to_string()
        };
        let mut hostnqn = None;
        let (mut header_digest, mut data_digest, mut queues) = (false, false, 1);
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.split_once('=') {
                Some(("hostnqn", v)) if !v.is_empty() && v.len() <= 223 => {
                    hostnqn = Some(v.to_string())
                }
                Some(("digest", v)) => {
                    (header_digest, data_digest) = match v {
                        "none" => (false, false),
                        "header" => (true, false),
                        "data" => (false, true),
                        "both" => (true, true),
                        _ => {
                            return Err(err(format!(
                                "digest={v:?}: give none, header, data or both"
                            )))
                        }
                    }
                }
                Some(("queues", v)) => {
                    queues = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=16).contains(n))
                        .ok_or_else(|| err(format!("queues={v:?}: give 1 to 16")))?
                }
                _ => {
                    return Err(err(format!(
                        "unknown query parameter {pair:?} (known: hostnqn=NQN, digest=none|header|data|both, queues=N)"
                    )))
                }
            }
        }
        Ok(NvmeUrl {
            host: host.to_string(),
            port,
            subnqn,
            nsid,
            has_nsid,
            hostnqn,
            header_digest,
            data_digest,
            queues,
        })
    }

    /// `host:port` for connecting (IPv6 in brackets).
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Whether the URL names the discovery controller.
    pub fn is_discovery(&self) -> bool {
        self.subnqn == DISCOVERY_NQN
    }

    /// Parses a URL that must name an NVM subsystem (not the discovery
    /// controller, which has no namespaces).
    pub fn parse_subsystem(url: &str) -> Result<NvmeUrl, NvmeUrlError> {
        let u = NvmeUrl::parse(url)?;
        if u.is_discovery() {
            return Err(NvmeUrlError {
                url: url.to_string(),
                why: format!(
                    "it names the discovery controller, which has no namespaces: \
                     list the subsystems with `ethersan discover {SCHEME}{}`, then add /SUBSYSTEM-NQN",
                    u.address()
                ),
            });
        }
        Ok(u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        let u = NvmeUrl::parse("nvme+tcp://10.0.0.5/nqn.2026-11.org.ethersan:disk").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.subnqn.as_str()),
            ("10.0.0.5", 4420, "nqn.2026-11.org.ethersan:disk")
        );
        assert_eq!((u.nsid, u.has_nsid, u.hostnqn), (1, false, None));
        let u = NvmeUrl::parse(
            "nvme+tcp://host:4421/nqn.2026-11.org.ethersan:disk/3?hostnqn=nqn.2014-08.org.x:h",
        )
        .unwrap();
        assert_eq!((u.port, u.nsid, u.has_nsid), (4421, 3, true));
        assert_eq!(u.hostnqn.as_deref(), Some("nqn.2014-08.org.x:h"));
        assert_eq!(u.address(), "host:4421");
        assert_eq!(
            (u.header_digest, u.data_digest, u.queues),
            (false, false, 1)
        );
        let u = NvmeUrl::parse("nvme+tcp://h/nqn.x:y/1?digest=data&queues=4").unwrap();
        assert_eq!((u.header_digest, u.data_digest, u.queues), (false, true, 4));
        let u = NvmeUrl::parse("nvme+tcp://h/nqn.x:y?queues=2&digest=both").unwrap();
        assert_eq!((u.header_digest, u.data_digest, u.queues), (true, true, 2));
        let u = NvmeUrl::parse("nvme+tcp://[::1]:4430/nqn.x:y/2").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.nsid), ("::1", 4430, 2));
        assert_eq!(u.address(), "[::1]:4430");
        let u = NvmeUrl::parse("nvme+tcp://fe80::1/nqn.x:y").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("fe80::1", 4420));
        let u = NvmeUrl::parse("nvme+tcp://h:4420").unwrap();
        assert!(u.is_discovery());
        assert!(NvmeUrl::parse("nvme+tcp://h/").unwrap().is_discovery());
        let e = NvmeUrl::parse_subsystem("nvme+tcp://h:4420").unwrap_err();
        assert!(
            e.to_string()
                .contains("ethersan discover nvme+tcp://h:4420"),
            "{e}"
        );
        assert!(NvmeUrl::parse_subsystem("nvme+tcp://h/nqn.x:y").is_ok());
    }

    #[test]
    fn errors() {
        for bad in [
            "iscsi://h/t/0",
            "nvme+tcp:///nqn.x:y/1",
            "nvme+tcp://h:99999/nqn.x:y/1",
            "nvme+tcp://h:0/nqn.x:y/1",
            "nvme+tcp://h/nqn.x:y/zero",
            "nvme+tcp://h/nqn.x:y/0",
            "nvme+tcp://h/nqn.x:y/1?hostid=3",
            "nvme+tcp://h/nqn.x:y/1?hostnqn=",
            "nvme+tcp://h/nqn.x:y/1?digest=crc",
            "nvme+tcp://h/nqn.x:y/1?queues=0",
            "nvme+tcp://h/nqn.x:y/1?queues=17",
            "nvme+tcp://[::1/nqn.x:y/1",
        ] {
            let e = NvmeUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains("nvme+tcp://HOST"), "{bad}: {e}");
        }
    }
}
