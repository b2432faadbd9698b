//! iSNS registration (RFC 4171): one task keeps an iSNS server's view of
//! this server current.
//!
//! It registers one network entity (protocol iSCSI) holding every
//! portal, every target (node type target, with its alias) and a portal
//! group per (target, portal) with the server's portal group tag; and per
//! target whose access list names initiators, a discovery domain
//! `ethersan:TARGET` with the target and those initiators. Targets without
//! initiator names are in no discovery domain: initiators see them through
//! the iSNS server's default discovery domain (open-isns:
//! `DefaultDiscoveryDomain = 1`), which holds every node in no domain.
//!
//! Every two seconds it compares the live directory with what it
//! registered and registers what is new and deregisters what is gone; it
//! refreshes the registration well before the registration period ends.
//! When the iSNS server cannot be reached it warns once and retries with
//! back-off (serving is not affected). At shutdown it deregisters the
//! entity and the discovery domains, within two seconds.
//!
//! Portal addresses: the listening portals, an unspecified address
//! (`0.0.0.0`, `[::]`) replaced by the local address of the connection to
//! the iSNS server (the address this host uses towards the network the
//! iSNS server is on), or `[isns] portals` when given (NAT).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ethersan_isns::attr::{tag, Attribute};
use ethersan_isns::message::{self, Request, ServerMessage};
use ethersan_isns::pdu::{Assembler, Header, Message, Pdu, HEADER_LEN};
use ethersan_isns::IsnsError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::config::IsnsConfig;
use crate::registry::Registry;

/// How often the live directory is compared with the registration.
const POLL: Duration = Duration::from_secs(2);
/// How long one request may wait for its response.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The most deregistration at shutdown may take.
const SHUTDOWN_BUDGET: Duration = Duration::from_millis(1800);
/// The longest wait between attempts while the server is unreachable.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The registration period asked for, in seconds.
pub const REGISTRATION_PERIOD: u32 = 900;
/// The prefix of the discovery domains' symbolic names.
pub const DD_PREFIX: &str = "ethersan:";

/// Why talking to the iSNS server failed.
#[derive(Debug, thiserror::Error)]
pub enum IsnsClientError {
    /// The server's name did not resolve.
    #[error("cannot resolve the iSNS server {server}: {cause} (check --isns / [isns] server)")]
    Resolve {
        /// `HOST:PORT`.
        server: String,
        /// Why.
        cause: String,
    },
    /// No TCP connection.
    #[error("cannot connect to the iSNS server {server}: {cause} (is isnsd running and listening there?)")]
    Connect {
        /// `HOST:PORT`.
        server: String,
        /// The OS error.
        cause: std::io::Error,
    },
    /// The connection failed.
    #[error("iSNS connection lost: {0}")]
    Io(#[from] std::io::Error),
    /// No answer in time.
    #[error("the iSNS server did not answer {0} within {secs} s", secs = REQUEST_TIMEOUT.as_secs())]
    Timeout(&'static str),
    /// A malformed message or an error status.
    #[error(transparent)]
    Protocol(#[from] IsnsError),
}

/// What should be registered: portals and targets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Portal addresses to register.
    pub portals: BTreeSet<SocketAddr>,
    /// Targets by name.
    pub targets: BTreeMap<String, TargetInfo>,
}

/// One target as registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetInfo {
    /// Its alias.
    pub alias: Option<String>,
    /// The initiators its access list names (empty: any, no discovery
    /// domain).
    pub initiators: BTreeSet<String>,
}

/// The portal addresses to register: `overrides` when given, else the
/// listening portals with an unspecified address replaced by `local`.
pub fn advertised_portals(
    listening: &[SocketAddr],
    overrides: &[SocketAddr],
    local: IpAddr,
) -> BTreeSet<SocketAddr> {
    if !overrides.is_empty() {
        return overrides.iter().copied().collect();
    }
    listening
        .iter()
        .map(|p| {
            if p.ip().is_unspecified() {
                SocketAddr::new(local, p.port())
            } else {
                *p
            }
        })
        .collect()
}

/// What the registry exports now, as iSNS should see it.
pub fn desired(registry: &Registry, overrides: &[SocketAddr], local: IpAddr) -> Desired {
    let targets = registry
        .targets()
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                TargetInfo {
                    alias: t.alias.clone(),
                    initiators: t.access.initiator_names().into_iter().collect(),
                },
            )
        })
        .collect();
    Desired {
        // A portal's `advertise` is what initiators reach it at, here too.
        portals: advertised_portals(
            &registry
                .portals()
                .iter()
                .map(|p| p.advertise.unwrap_or(p.address))
                .collect::<Vec<_>>(),
            overrides,
            local,
        ),
        targets,
    }
}

/// The running registration task.
#[derive(Debug)]
pub struct IsnsTask {
    stop: watch::Sender<bool>,
    join: tokio::task::JoinHandle<()>,
}

impl IsnsTask {
    /// Deregister everything and end the task; returns within about two
    /// seconds even when the iSNS server does not answer.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let mut join = self.join;
        if tokio::time::timeout(SHUTDOWN_BUDGET + Duration::from_millis(150), &mut join)
            .await
            .is_err()
        {
            join.abort();
            tracing::warn!("iSNS deregistration did not finish in time");
        }
    }
}

/// Start registering with the iSNS server `cfg` names.
pub fn start(cfg: IsnsConfig, registry: Arc<Registry>) -> IsnsTask {
    let (stop, rx) = watch::channel(false);
    let join = tokio::spawn(run(cfg, registry, rx));
    IsnsTask { stop, join }
}

/// The entity identifier: `[isns] entity`, else `HOSTNAME.ethersan`.
pub fn entity_id(cfg: &IsnsConfig) -> String {
    if let Some(e) = &cfg.entity {
        return e.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}.ethersan")
}

/// One connection to the iSNS server.
struct Conn {
    stream: TcpStream,
    asm: Assembler,
    xid: u16,
    local: IpAddr,
}

impl Conn {
    async fn connect(server: &str) -> Result<Conn, IsnsClientError> {
        let addrs: Vec<SocketAddr> =
            tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host(server))
                .await
                .map_err(|_| IsnsClientError::Resolve {
                    server: server.into(),
                    cause: "timed out".into(),
                })?
                .map_err(|e| IsnsClientError::Resolve {
                    server: server.into(),
                    cause: e.to_string(),
                })?
                .collect();
        let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
        for a in addrs {
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a)).await {
                Ok(Ok(stream)) => {
                    let local = stream.local_addr()?.ip();
                    let _ = stream.set_nodelay(true);
                    return Ok(Conn {
                        stream,
                        asm: Assembler::new(),
                        xid: 0,
                        local,
                    });
                }
                Ok(Err(e)) => last = e,
                Err(_) => {
                    last = std::io::Error::new(std::io::ErrorKind::TimedOut, "connection timed out")
                }
            }
        }
        Err(IsnsClientError::Connect {
            server: server.into(),
            cause: last,
        })
    }

    async fn read_message(&mut self) -> Result<Message, IsnsClientError> {
        loop {
            let mut head = [0u8; HEADER_LEN];
            self.stream.read_exact(&mut head).await?;
            let (header, len) = Header::decode(&head)?;
            let mut payload = vec![0u8; len];
            self.stream.read_exact(&mut payload).await?;
            if let Some(m) = self.asm.push(Pdu { header, payload })? {
                return Ok(m);
            }
        }
    }

    /// Send a request and wait for its response, answering the server's
    /// own requests (ESI, SCN) meanwhile.
    async fn call(&mut self, req: &Request) -> Result<Vec<Attribute>, IsnsClientError> {
        self.xid = self.xid.wrapping_add(1).max(1);
        let xid = self.xid;
        let bytes = req.try_encode(xid)?;
        let exchange = async {
            self.stream.write_all(&bytes).await?;
            loop {
                let msg = self.read_message().await?;
                match message::from_server(&msg)? {
                    ServerMessage::Response(r) if r.transaction_id == xid => {
                        return Ok(r.check(req.function, xid)?);
                    }
                    // A late answer to an abandoned request.
                    ServerMessage::Response(_) => {}
                    ServerMessage::Request { reply, .. }
                    | ServerMessage::Unsupported { reply, .. } => {
                        self.stream.write_all(&reply).await?;
                    }
                }
            }
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| IsnsClientError::Timeout(req.function.name()))?
    }
}

/// What this task has registered.
#[derive(Debug, Default)]
struct Registered {
    entity: bool,
    portals: BTreeSet<SocketAddr>,
    targets: BTreeMap<String, Option<String>>,
    /// Per target: its discovery domain's ID and initiators.
    dds: BTreeMap<String, (u32, BTreeSet<String>)>,
    /// The registration period granted, in seconds.
    period: u32,
    refreshed: Option<Instant>,
}

impl Registered {
    /// A registered node to name as the source of a request.
    fn source(&self) -> Option<&str> {
        self.targets.keys().next().map(String::as_str)
    }
}

fn eid_attr(eid: &str) -> Attribute {
    Attribute::string(tag::ENTITY_IDENTIFIER, eid)
}

/// Bring the registration from `reg` to `want`.
async fn sync(
    c: &mut Conn,
    reg: &mut Registered,
    want: &Desired,
    eid: &str,
) -> Result<(), IsnsClientError> {
    if want.targets.is_empty() {
        return deregister_all(c, reg, eid).await;
    }
    let pgt = 1;
    if !reg.entity {
        // A whole registration, replacing whatever an earlier run of
        // this server left under the same entity identifier.
        let mut op = message::entity(eid, REGISTRATION_PERIOD);
        for p in &want.portals {
            op.extend(message::portal(*p));
        }
        for (name, t) in &want.targets {
            op.extend(message::target_node(name, t.alias.as_deref()));
        }
        for name in want.targets.keys() {
            for p in &want.portals {
                op.extend(message::portal_group(name, *p, pgt));
            }
        }
        let first = want.targets.keys().next().map_or("", String::as_str);
        let attrs = c
            .call(&message::dev_attr_reg(
                message::source(first),
                vec![eid_attr(eid)],
                op,
                true,
            ))
            .await?;
        reg.entity = true;
        reg.period = message::registration_period(&attrs)
            .filter(|p| *p > 0)
            .unwrap_or(REGISTRATION_PERIOD)
            .min(REGISTRATION_PERIOD);
        reg.refreshed = Some(Instant::now());
        reg.portals = want.portals.clone();
        reg.targets = want
            .targets
            .iter()
            .map(|(n, t)| (n.clone(), t.alias.clone()))
            .collect();
        tracing::info!(
            entity = eid,
            targets = reg.targets.len(),
            portals = ?reg.portals,
            "registered with the iSNS server"
        );
    } else {
        // Targets gone: their discovery domain, then the node.
        let gone: Vec<String> = reg
            .targets
            .keys()
            .filter(|n| !want.targets.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            if let Some((id, _)) = reg.dds.remove(&name) {
                c.call(&message::dd_dereg(message::source(&name), id, Vec::new()))
                    .await?;
            }
            c.call(&message::dev_dereg(
                message::source(&name),
                vec![Attribute::string(tag::ISCSI_NAME, &name)],
            ))
            .await?;
            reg.targets.remove(&name);
            tracing::info!(target = %name, "deregistered from the iSNS server");
        }
        if reg.targets.is_empty() {
            // Nothing left to name as the source: register anew.
            reg.entity = false;
            return Box::pin(sync(c, reg, want, eid)).await;
        }
        let gone: Vec<SocketAddr> = reg.portals.difference(&want.portals).copied().collect();
        for p in gone {
            let src = reg.source().unwrap_or_default().to_string();
            c.call(&message::dev_dereg(
                message::source(&src),
                message::portal(p),
            ))
            .await?;
            reg.portals.remove(&p);
        }
        // New portals, new or changed targets, and their portal groups.
        let new_portals: Vec<SocketAddr> = want.portals.difference(&reg.portals).copied().collect();
        let changed: Vec<&String> = want
            .targets
            .iter()
            .filter(|(n, t)| reg.targets.get(*n) != Some(&t.alias))
            .map(|(n, _)| n)
            .collect();
        if !new_portals.is_empty() || !changed.is_empty() {
            let mut op = vec![eid_attr(eid)];
            for p in &new_portals {
                op.extend(message::portal(*p));
            }
            for n in &changed {
                op.extend(message::target_node(n, want.targets[*n].alias.as_deref()));
            }
            for n in want.targets.keys() {
                let is_new = changed.contains(&n);
                for p in &want.portals {
                    if is_new || new_portals.contains(p) {
                        op.extend(message::portal_group(n, *p, pgt));
                    }
                }
            }
            let src = reg.source().unwrap_or_default().to_string();
            c.call(&message::dev_attr_reg(
                message::source(&src),
                vec![eid_attr(eid)],
                op,
                false,
            ))
            .await?;
            reg.portals.extend(new_portals);
            for n in changed {
                reg.targets.insert(n.clone(), want.targets[n].alias.clone());
                tracing::info!(target = %n, "registered with the iSNS server");
            }
        }
    }
    // Discovery domains.
    for (name, t) in &want.targets {
        let src = message::source(name);
        match reg.dds.get(name).cloned() {
            None if t.initiators.is_empty() => {}
            None => {
                let mut op = vec![Attribute::string(
                    tag::DD_SYMBOLIC_NAME,
                    &format!("{DD_PREFIX}{name}"),
                )];
                op.extend(message::dd_members(
                    std::iter::once(name.as_str()).chain(t.initiators.iter().map(String::as_str)),
                ));
                let attrs = c.call(&message::dd_reg(src, None, op)).await?;
                let id = message::dd_id(&attrs)?;
                reg.dds.insert(name.clone(), (id, t.initiators.clone()));
            }
            Some((id, _)) if t.initiators.is_empty() => {
                c.call(&message::dd_dereg(src, id, Vec::new())).await?;
                reg.dds.remove(name);
            }
            Some((id, old)) if old != t.initiators => {
                let added: Vec<&str> = t.initiators.difference(&old).map(String::as_str).collect();
                if !added.is_empty() {
                    c.call(&message::dd_reg(
                        src.clone(),
                        Some(id),
                        message::dd_members(added),
                    ))
                    .await?;
                }
                let removed: Vec<&str> =
                    old.difference(&t.initiators).map(String::as_str).collect();
                if !removed.is_empty() {
                    c.call(&message::dd_dereg(src, id, message::dd_members(removed)))
                        .await?;
                }
                reg.dds.insert(name.clone(), (id, t.initiators.clone()));
            }
            Some(_) => {}
        }
    }
    // Refresh before the registration period ends (a third of it).
    let period = Duration::from_secs(u64::from(reg.period.max(3)));
    if reg.refreshed.is_some_and(|r| r.elapsed() >= period / 3) {
        let src = reg.source().unwrap_or_default().to_string();
        c.call(&message::dev_attr_reg(
            message::source(&src),
            vec![eid_attr(eid)],
            vec![eid_attr(eid)],
            false,
        ))
        .await?;
        reg.refreshed = Some(Instant::now());
    }
    Ok(())
}

/// Remove the discovery domains and the entity (with everything in it).
async fn deregister_all(
    c: &mut Conn,
    reg: &mut Registered,
    eid: &str,
) -> Result<(), IsnsClientError> {
    let src = reg
        .source()
        .or_else(|| reg.dds.keys().next().map(String::as_str))
        .unwrap_or_default()
        .to_string();
    for (id, _) in std::mem::take(&mut reg.dds).into_values() {
        c.call(&message::dd_dereg(message::source(&src), id, Vec::new()))
            .await?;
    }
    if reg.entity {
        c.call(&message::dev_dereg(
            message::source(&src),
            vec![eid_attr(eid)],
        ))
        .await?;
        tracing::info!(entity = eid, "deregistered from the iSNS server");
    }
    *reg = Registered::default();
    Ok(())
}

/// A fresh connection: the entity is registered anew (replacing), and
/// discovery domains from an earlier connection are removed to be made
/// again (the server may have restarted and lost or reused their IDs).
async fn reconnect(server: &str, reg: &mut Registered) -> Result<Conn, IsnsClientError> {
    let mut c = Conn::connect(server).await?;
    let src = reg.source().unwrap_or_default().to_string();
    for (name, (id, _)) in std::mem::take(&mut reg.dds) {
        let s = if src.is_empty() { &name } else { &src };
        let _ = c
            .call(&message::dd_dereg(message::source(s), id, Vec::new()))
            .await;
    }
    reg.entity = false;
    Ok(c)
}

async fn run(cfg: IsnsConfig, registry: Arc<Registry>, mut stop: watch::Receiver<bool>) {
    let server = cfg.server();
    let eid = entity_id(&cfg);
    let mut reg = Registered::default();
    let mut conn: Option<Conn> = None;
    let mut backoff = Duration::from_secs(1);
    let mut failing = false;
    loop {
        let step = async {
            let c = match conn.as_mut() {
                Some(c) => c,
                None => conn.insert(reconnect(&server, &mut reg).await?),
            };
            let want = desired(&registry, &cfg.portals, c.local);
            sync(c, &mut reg, &want, &eid).await
        };
        let result = tokio::select! {
            r = step => Some(r),
            _ = stop.changed() => None,
        };
        let wait = match result {
            None => {
                // Stopped mid-exchange: the connection's state is unknown.
                conn = None;
                break;
            }
            Some(Ok(())) => {
                if failing {
                    tracing::info!(server = %server, "the iSNS server is reachable again; registration restored");
                }
                failing = false;
                backoff = Duration::from_secs(1);
                POLL
            }
            Some(Err(e)) => {
                conn = None;
                if !failing {
                    tracing::warn!(server = %server, "iSNS registration failed: {e}; retrying in the background (serving is not affected)");
                } else {
                    tracing::debug!(server = %server, "iSNS registration failed again: {e}");
                }
                failing = true;
                let w = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                w
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => break,
        }
    }
    // Shutdown: deregister within the budget.
    if !reg.entity && reg.dds.is_empty() {
        return;
    }
    let work = async {
        let mut c = match conn.take() {
            Some(c) => c,
            None => Conn::connect(&server).await?,
        };
        deregister_all(&mut c, &mut reg, &eid).await
    };
    match tokio::time::timeout(SHUTDOWN_BUDGET, work).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(server = %server, "iSNS deregistration failed: {e}"),
        Err(_) => {
            tracing::warn!(server = %server, "iSNS deregistration timed out; the iSNS server drops the registration when its period ends")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_portals_take_the_local_address() {
        let local: IpAddr = "192.0.2.7".parse().unwrap();
        let l: Vec<SocketAddr> = vec![
            "0.0.0.0:3260".parse().unwrap(),
            "127.0.0.1:3261".parse().unwrap(),
        ];
        let got = advertised_portals(&l, &[], local);
        assert_eq!(
            got.into_iter().collect::<Vec<_>>(),
            vec![
                "127.0.0.1:3261".parse::<SocketAddr>().unwrap(),
                "192.0.2.7:3260".parse().unwrap()
            ]
        );
        let o: Vec<SocketAddr> = vec!["10.0.2.2:3260".parse().unwrap()];
        assert_eq!(
            advertised_portals(&l, &o, local)
                .into_iter()
                .collect::<Vec<_>>(),
            o
        );
    }

    #[test]
    fn entity_id_defaults_to_the_host_name() {
        let mut c = IsnsConfig::parse_server("127.0.0.1").unwrap();
        assert!(entity_id(&c).ends_with(".ethersan"));
        c.entity = Some("e1".into());
        assert_eq!(entity_id(&c), "e1");
    }
}
