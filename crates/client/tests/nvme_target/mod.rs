//! A tiny NVMe/TCP target for tests, made from `ethersan_nvme`'s target
//! `Queue` over real TCP on 127.0.0.1: one subsystem with one RAM
//! namespace (NSID 1), a discovery controller, Connect, properties,
//! Identify, the Discovery log, Keep Alive, Read, Write, Flush, Write
//! Zeroes. Shared by the client's and the CLI's tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ethersan_nvme::command::{AdminCommand, Cns, IoCommand};
use ethersan_nvme::fabrics::{ConnectData, FabricsCommand};
use ethersan_nvme::identify::{
    active_namespace_list, namespace_descriptors, ControllerInfo, ControllerType, NamespaceId,
    NamespaceInfo,
};
use ethersan_nvme::log::{
    discovery_log, lid, window, AddressFamily, DiscoveryEntry, SubsystemType,
};
use ethersan_nvme::properties::{Capabilities, Properties};
use ethersan_nvme::queue::{CommandData, Completion, Event, Queue, QueueConfig};
use ethersan_nvme::sqe::{Sqe, FABRICS_OPCODE};
use ethersan_nvme::Status;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The discovery NQN.
pub const DISCOVERY: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// The test subsystem's NQN.
pub const SUBNQN: &str = "nqn.2026-11.org.ethersan:nvme-test";
/// The namespace's NGUID.
pub const NGUID: [u8; 16] = [0x5e; 16];

/// A running target.
pub struct RamTarget {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The namespace's bytes.
    pub disk: Arc<Mutex<Vec<u8>>>,
    /// Keep Alive commands received.
    pub keep_alives: Arc<AtomicUsize>,
}

struct Shared {
    disk: Arc<Mutex<Vec<u8>>>,
    keep_alives: Arc<AtomicUsize>,
    lbads: u8,
    port: u16,
}

impl RamTarget {
    /// Starts a target with a namespace of `blocks` blocks of 2^`lbads`
    /// bytes, on a runtime's task.
    pub async fn start(blocks: u64, lbads: u8) -> RamTarget {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let disk = Arc::new(Mutex::new(vec![0u8; (blocks << lbads) as usize]));
        let keep_alives = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(Shared {
            disk: disk.clone(),
            keep_alives: keep_alives.clone(),
            lbads,
            port: addr.port(),
        });
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s, shared.clone()));
            }
        });
        RamTarget {
            addr,
            disk,
            keep_alives,
        }
    }

    /// The URL of namespace `nsid`.
    pub fn url(&self, nsid: u32) -> String {
        format!("nvme+tcp://{}/{SUBNQN}/{nsid}", self.addr)
    }
}

struct Conn {
    q: Queue,
    props: Properties,
    discovery: bool,
    pending: HashMap<u16, (Sqe, Vec<u8>)>,
    out: Vec<u8>,
}

async fn serve(mut s: TcpStream, shared: Arc<Shared>) {
    let config = QueueConfig {
        max_h2c_data: 32 * 1024,
        r2t_len: 128 * 1024,
        c2h_data_len: 64 * 1024,
        ..QueueConfig::default()
    };
    let mut c = Conn {
        q: Queue::new(config),
        props: Properties::new(Capabilities {
            mqes: 63,
            timeout: 1,
            mpsmin: 0,
        }),
        discovery: false,
        pending: HashMap::new(),
        out: Vec::new(),
    };
    let mut buf = Vec::with_capacity(1 << 20);
    loop {
        match s.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        while let Some(r) = c.q.receive(&buf, Instant::now()) {
            let end = match r.event {
                Some(Event::Command { sqe, data }) => {
                    match data {
                        CommandData::Awaiting { len } => {
                            c.pending.insert(sqe.cid(), (sqe, vec![0; len as usize]));
                        }
                        CommandData::InCapsule(range) => {
                            let d = buf[range].to_vec();
                            c.execute(&shared, sqe, &d);
                        }
                        _ => c.execute(&shared, sqe, &[]),
                    }
                    false
                }
                Some(Event::Data {
                    cid,
                    offset,
                    range,
                    complete,
                }) => {
                    if let Some((_, b)) = c.pending.get_mut(&cid) {
                        b[offset as usize..][..range.len()].copy_from_slice(&buf[range]);
                    }
                    if complete {
                        if let Some((sqe, b)) = c.pending.remove(&cid) {
                            c.execute(&shared, sqe, &b);
                        }
                    }
                    false
                }
                Some(Event::Failed { cid, status }) => {
                    let _ = c.q.complete(Completion::new(cid, status), &mut c.out);
                    false
                }
                Some(Event::HostTerminated(_)) | Some(Event::Fatal(_)) => true,
                _ => false,
            };
            buf.drain(..r.consumed);
            if end {
                break;
            }
        }
        c.q.poll_transmit(&mut c.out);
        if !c.out.is_empty() {
            if s.write_all(&c.out).await.is_err() {
                return;
            }
            c.out.clear();
        }
        if c.q.is_closed() {
            return;
        }
    }
}

impl Conn {
    fn done(&mut self, cid: u16, status: Status, value: u64) {
        let c = Completion {
            cid,
            status,
            dw0: value as u32,
            dw1: (value >> 32) as u32,
        };
        let _ = self.q.complete(c, &mut self.out);
    }

    fn send(&mut self, cid: u16, data: &[u8]) {
        let _ = self
            .q
            .send_read(Completion::new(cid, Status::SUCCESS), data, &mut self.out);
    }

    fn execute(&mut self, shared: &Shared, sqe: Sqe, data: &[u8]) {
        let cid = sqe.cid();
        if sqe.opcode() == FABRICS_OPCODE {
            let (status, value) = match FabricsCommand::parse(&sqe) {
                Ok(FabricsCommand::Connect(conn)) => match ConnectData::parse(data) {
                    Ok(d) if d.subnqn == DISCOVERY && conn.qid == 0 => {
                        self.discovery = true;
                        (Status::SUCCESS, 2)
                    }
                    Ok(d) if d.subnqn != SUBNQN => (Status::CONNECT_INVALID_PARAMETERS, 0),
                    Ok(d) if d.hostnqn.contains("denied") => (Status::CONNECT_INVALID_HOST, 0),
                    Ok(d) if conn.qid > 0 && d.cntlid != 1 => {
                        (Status::CONNECT_INVALID_PARAMETERS, 0)
                    }
                    Ok(_) => (Status::SUCCESS, 1),
                    Err(s) => (s, 0),
                },
                Ok(FabricsCommand::PropertyGet { size, offset }) => {
                    match self.props.get(offset, size) {
                        Ok(v) => (Status::SUCCESS, v),
                        Err(s) => (s, 0),
                    }
                }
                Ok(FabricsCommand::PropertySet {
                    size,
                    offset,
                    value,
                }) => match self.props.set(offset, size, value) {
                    Ok(()) => (Status::SUCCESS, 0),
                    Err(s) => (s, 0),
                },
                Ok(FabricsCommand::Disconnect) => (Status::SUCCESS, 0),
                Err(s) => (s, 0),
            };
            return self.done(cid, status, value);
        }
        let blocks = shared.disk.lock().unwrap().len() as u64 >> shared.lbads;
        if self.q.connect().is_some_and(|c| c.qid == 0) {
            let page = match AdminCommand::parse(&sqe) {
                Ok(AdminCommand::Identify { cns, nsid, .. }) => match cns {
                    Cns::Controller if self.discovery => {
                        let mut i = ControllerInfo::new("DISC", "ethersan test", DISCOVERY, 2);
                        i.cntrltype = ControllerType::Discovery;
                        i.nn = 0;
                        i.build()
                    }
                    Cns::Controller => {
                        let mut i = ControllerInfo::new("SN-TEST-1", "ethersan test", SUBNQN, 1);
                        i.vwc = 1;
                        i.build()
                    }
                    Cns::Namespace if nsid == 1 => {
                        let mut n = NamespaceInfo::new(blocks, shared.lbads);
                        n.nguid = NGUID;
                        n.build()
                    }
                    Cns::Namespace => vec![0; 4096],
                    Cns::ActiveNamespaces => active_namespace_list(&[1], nsid),
                    Cns::NamespaceDescriptors => {
                        namespace_descriptors(&[NamespaceId::Nguid(NGUID)])
                    }
                },
                Ok(AdminCommand::GetLogPage {
                    lid: lid::DISCOVERY,
                    len,
                    offset,
                    ..
                }) if self.discovery => {
                    let e = DiscoveryEntry {
                        adrfam: AddressFamily::Ipv4,
                        subtype: SubsystemType::Nvme,
                        treq: 0,
                        portid: 1,
                        asqsz: 32,
                        trsvcid: shared.port.to_string(),
                        subnqn: SUBNQN.into(),
                        traddr: "127.0.0.1".into(),
                        sectype: 0,
                    };
                    window(&discovery_log(1, &[e]), offset, len).unwrap_or_default()
                }
                Ok(AdminCommand::GetLogPage { .. }) => {
                    return self.done(cid, Status::INVALID_LOG_PAGE, 0)
                }
                Ok(AdminCommand::KeepAlive) => {
                    shared.keep_alives.fetch_add(1, Ordering::Relaxed);
                    return self.done(cid, Status::SUCCESS, 0);
                }
                Ok(_) => return self.done(cid, Status::SUCCESS, 0),
                Err(s) => return self.done(cid, s, 0),
            };
            return self.send(cid, &page);
        }
        let bs = 1usize << shared.lbads;
        let in_range = |slba: u64, n: u32| slba + u64::from(n) <= blocks;
        match IoCommand::parse(&sqe) {
            Ok(IoCommand::Read { range, .. }) if in_range(range.slba, range.blocks) => {
                let at = range.slba as usize * bs;
                let d = shared.disk.lock().unwrap()[at..at + range.blocks as usize * bs].to_vec();
                self.send(cid, &d);
            }
            Ok(IoCommand::Write { range, .. })
                if in_range(range.slba, range.blocks)
                    && data.len() == range.blocks as usize * bs =>
            {
                let at = range.slba as usize * bs;
                shared.disk.lock().unwrap()[at..at + data.len()].copy_from_slice(data);
                self.done(cid, Status::SUCCESS, 0);
            }
            Ok(IoCommand::WriteZeroes { range, .. }) if in_range(range.slba, range.blocks) => {
                let at = range.slba as usize * bs;
                shared.disk.lock().unwrap()[at..at + range.blocks as usize * bs].fill(0);
                self.done(cid, Status::SUCCESS, 0);
            }
            Ok(IoCommand::Flush) => self.done(cid, Status::SUCCESS, 0),
            Ok(
                IoCommand::Read { .. } | IoCommand::Write { .. } | IoCommand::WriteZeroes { .. },
            ) => self.done(cid, Status::LBA_OUT_OF_RANGE, 0),
            Ok(_) => self.done(cid, Status::INVALID_OPCODE, 0),
            Err(s) => self.done(cid, s, 0),
        }
    }
}
