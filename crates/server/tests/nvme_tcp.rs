//! The NVMe/TCP target end to end over real TCP sockets on 127.0.0.1,
//! driven by a small NVMe/TCP host written here from the `ethersan-nvme`
//! codec: connection set-up, controllers, Identify, discovery, reads and
//! writes (in-capsule and R2T/H2CData), the statuses the SCSI rules give,
//! and bad input.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ethersan_nvme::cqe::Cqe;
use ethersan_nvme::fabrics::{Connect, ConnectData, FabricsCommand, PropertySize};
use ethersan_nvme::pdu::{H2cData, IcReq};
use ethersan_nvme::{decode, Framing, Pdu, Sgl, Sqe, Status};
use ethersan_server::config::Config;
use ethersan_server::nvme::{self, Nvme};
use ethersan_server::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TARGET: &str = "iqn.2026-11.org.ethersan:nvme";
const SUBNQN: &str = "nqn.2014-08.org.ethersan:iqn.2026-11.org.ethersan:nvme";
const HOSTNQN: &str = "nqn.2014-08.org.example:host1";
const DISCOVERY: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// A server with a 16 MiB file LUN 0 and a read-only 1 MiB file LUN 1,
/// NVMe/TCP on an ephemeral port.
async fn server(dir: &Path) -> (Arc<Server>, Nvme, SocketAddr) {
    let rw = dir.join("rw.img");
    let ro = dir.join("ro.img");
    if !ro.exists() {
        std::fs::File::create(&ro)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
    }
    let text = format!(
        "portals = [\"127.0.0.1:0\"]\n[options]\ndata_dir = {:?}\n[nvme]\nportals = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{TARGET}\"\nlun = [\"{}:16M\", \"{},ro\"]\n",
        dir.display().to_string(),
        rw.display(),
        ro.display()
    );
    let cfg = Config::from_toml_str(&text, "test").unwrap();
    let srv = Arc::new(Server::bind(&cfg).await.unwrap());
    let n = nvme::start(&cfg, srv.registry().clone()).await.unwrap();
    let addr = n.local_addrs()[0];
    (srv, n, addr)
}

/// One NVMe/TCP connection, host side.
struct Host {
    s: TcpStream,
    buf: Vec<u8>,
    cid: u16,
    maxh2c: u32,
    /// Digests agreed (plain until ICResp).
    framing: Framing,
}

/// A command's outcome: its completion and the data that came back.
struct Outcome {
    cqe: Cqe,
    data: Vec<u8>,
}

impl Outcome {
    fn ok(&self) -> &Self {
        assert_eq!(self.cqe.status, Status::SUCCESS, "command failed");
        self
    }
}

impl Host {
    async fn open(addr: SocketAddr) -> Host {
        Host::open_with(addr, false).await
    }

    /// A connection asking for header and data digests when `digests`.
    async fn open_with(addr: SocketAddr, digests: bool) -> Host {
        Host::open_from(addr, digests, None).await
    }

    /// [`Host::open_with`] from local address `from` (any loopback one).
    async fn open_from(addr: SocketAddr, digests: bool, from: Option<&str>) -> Host {
        let s = match from {
            None => TcpStream::connect(addr).await.unwrap(),
            Some(ip) => {
                let sock = tokio::net::TcpSocket::new_v4().unwrap();
                sock.bind(format!("{ip}:0").parse().unwrap()).unwrap();
                sock.connect(addr).await.unwrap()
            }
        };
        let mut h = Host {
            s,
            buf: Vec::new(),
            cid: 0,
            maxh2c: 0,
            framing: Framing::plain(1 << 24),
        };
        let mut out = Vec::new();
        Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            header_digest: digests,
            data_digest: digests,
            maxr2t: 0,
        })
        .encode(&[], &Framing::plain(0), &mut out)
        .unwrap();
        h.s.write_all(&out).await.unwrap();
        match h.recv().await {
            (Pdu::IcResp(r), _) => {
                assert_eq!((r.header_digest, r.data_digest), (digests, digests));
                h.maxh2c = r.maxh2cdata;
                h.framing.header_digest = digests;
                h.framing.data_digest = digests;
            }
            other => panic!("expected ICResp, got {:?}", other.0),
        }
        h
    }

    /// The next PDU and its data.
    async fn recv(&mut self) -> (Pdu, Vec<u8>) {
        loop {
            if let Some(d) = decode(&self.buf, &self.framing).unwrap() {
                assert!(d.data_digest_ok, "bad data digest from the target");
                let data = self.buf[d.data.clone()].to_vec();
                self.buf.drain(..d.len);
                return (d.pdu, data);
            }
            let n = tokio::time::timeout(Duration::from_secs(10), self.s.read_buf(&mut self.buf))
                .await
                .expect("no answer within 10 s")
                .unwrap();
            assert!(n > 0, "the target closed the connection");
        }
    }

    async fn send(&mut self, pdu: Pdu, data: &[u8]) {
        let mut out = Vec::new();
        pdu.encode(data, &self.framing, &mut out).unwrap();
        self.s.write_all(&out).await.unwrap();
    }

    /// Send `sqe` with `out` (in the capsule when `in_capsule`, else on
    /// R2Ts) or a buffer of `in_len` bytes for data to the host.
    async fn cmd(&mut self, mut sqe: Sqe, out: &[u8], in_capsule: bool, in_len: u32) -> Outcome {
        self.cid = self.cid.wrapping_add(1);
        let cid = self.cid;
        sqe.0[2..4].copy_from_slice(&cid.to_le_bytes());
        let sgl = if in_capsule {
            Sgl::InCapsule {
                offset: 0,
                len: out.len() as u32,
            }
        } else {
            Sgl::Transport {
                len: (out.len() as u32).max(in_len),
            }
        };
        sqe.set_sgl(sgl);
        let capsule = if in_capsule { out } else { &[][..] };
        self.send(Pdu::CapsuleCmd(sqe), capsule).await;
        let mut data = vec![0u8; in_len as usize];
        loop {
            match self.recv().await {
                (Pdu::CapsuleResp(cqe), _) => {
                    assert_eq!(cqe.cid, cid);
                    return Outcome { cqe, data };
                }
                (Pdu::C2hData(d), bytes) => {
                    assert_eq!(d.cccid, cid);
                    let at = d.datao as usize;
                    data[at..at + bytes.len()].copy_from_slice(&bytes);
                    if d.success {
                        return Outcome {
                            cqe: Cqe::new(cid, Status::SUCCESS),
                            data,
                        };
                    }
                }
                (Pdu::R2t(r), _) => {
                    assert_eq!(r.cccid, cid);
                    let (start, end) = (r.r2to as usize, (r.r2to + r.r2tl) as usize);
                    let mut at = start;
                    while at < end {
                        let n = (end - at).min(self.maxh2c as usize);
                        let h = H2cData {
                            cccid: cid,
                            ttag: r.ttag,
                            datao: at as u32,
                            last: at + n == end,
                        };
                        self.send(Pdu::H2cData(h), &out[at..at + n]).await;
                        at += n;
                    }
                }
                (other, _) => panic!("unexpected {:?}", other.pdu_type()),
            }
        }
    }

    async fn connect(&mut self, qid: u16, subnqn: &str, hostnqn: &str, cntlid: u16) -> Outcome {
        let kato = if qid == 0 { 30_000 } else { 0 };
        self.connect_kato(qid, subnqn, hostnqn, cntlid, kato).await
    }

    async fn connect_kato(
        &mut self,
        qid: u16,
        subnqn: &str,
        hostnqn: &str,
        cntlid: u16,
        kato: u32,
    ) -> Outcome {
        let sqe = FabricsCommand::Connect(Connect {
            recfmt: 0,
            qid,
            sqsize: 31,
            cattr: 0,
            kato,
        })
        .to_sqe(0);
        let data = ConnectData {
            host_id: [7; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode();
        self.cmd(sqe, &data, true, 0).await
    }

    async fn property_set(&mut self, offset: u32, value: u64) -> Outcome {
        let sqe = FabricsCommand::PropertySet {
            size: PropertySize::Four,
            offset,
            value,
        }
        .to_sqe(0);
        self.cmd(sqe, &[], true, 0).await
    }

    async fn property_get(&mut self, offset: u32, size: PropertySize) -> u64 {
        let sqe = FabricsCommand::PropertyGet { size, offset }.to_sqe(0);
        let o = self.cmd(sqe, &[], true, 0).await;
        o.ok();
        u64::from(o.cqe.dw0) | u64::from(o.cqe.dw1) << 32
    }

    /// An admin queue to `subnqn`, enabled: the CNTLID.
    async fn admin(addr: SocketAddr, subnqn: &str) -> (Host, u16) {
        Host::admin_kato(addr, subnqn, 30_000).await
    }

    /// An admin queue with Keep Alive Timeout `kato` ms.
    async fn admin_kato(addr: SocketAddr, subnqn: &str, kato: u32) -> (Host, u16) {
        let mut h = Host::open(addr).await;
        let c = h.connect_kato(0, subnqn, HOSTNQN, 0xFFFF, kato).await;
        c.ok();
        let cntlid = c.cqe.dw0 as u16;
        // CC: EN, IOSQES 6, IOCQES 4.
        h.property_set(0x14, 1 | 6 << 16 | 4 << 20).await.ok();
        let csts = h.property_get(0x1C, PropertySize::Four).await;
        assert_eq!(csts & 1, 1, "CSTS.RDY");
        (h, cntlid)
    }

    async fn identify(&mut self, cns: u32, nsid: u32) -> Outcome {
        let mut sqe = Sqe::new(0x06, 0);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, cns);
        self.cmd(sqe, &[], false, 4096).await
    }

    async fn get_log(&mut self, lid: u8, len: u32) -> Outcome {
        let mut sqe = Sqe::new(0x02, 0);
        let numd = len / 4 - 1;
        sqe.set_cdw(10, u32::from(lid) | (numd & 0xFFFF) << 16);
        sqe.set_cdw(11, numd >> 16);
        self.cmd(sqe, &[], false, len).await
    }

    async fn rw(&mut self, op: u8, nsid: u32, slba: u64, blocks: u32) -> Sqe {
        let mut sqe = Sqe::new(op, 0);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, slba as u32);
        sqe.set_cdw(11, (slba >> 32) as u32);
        sqe.set_cdw(12, blocks - 1);
        sqe
    }

    async fn read(&mut self, nsid: u32, slba: u64, blocks: u32) -> Outcome {
        let sqe = self.rw(0x02, nsid, slba, blocks).await;
        self.cmd(sqe, &[], false, blocks * 512).await
    }

    async fn write(&mut self, nsid: u32, slba: u64, data: &[u8], in_capsule: bool) -> Outcome {
        let sqe = self.rw(0x01, nsid, slba, (data.len() / 512) as u32).await;
        self.cmd(sqe, data, in_capsule, 0).await
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[tokio::test]
async fn identify_io_and_statuses_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let (_srv, mut n, addr) = server(dir.path()).await;
    let (mut a, cntlid) = Host::admin(addr, SUBNQN).await;
    assert_ne!(cntlid, 0xFFFF);
    // CAP.MQES and VS 1.4.
    assert_eq!(a.property_get(0, PropertySize::Eight).await & 0xFFFF, 127);
    assert_eq!(a.property_get(0x08, PropertySize::Four).await, 0x0001_0400);

    let ctrl = a.identify(1, 0).await;
    ctrl.ok();
    let c = &ctrl.data;
    assert_eq!(u16::from_le_bytes([c[78], c[79]]), cntlid);
    assert_eq!(u32_at(c, 516), 2, "NN: two LUNs");
    assert_eq!(&c[768..768 + SUBNQN.len()], SUBNQN.as_bytes());
    assert_eq!(&c[24..32], b"ethersan");

    let list = a.identify(2, 0).await;
    list.ok();
    assert_eq!((u32_at(&list.data, 0), u32_at(&list.data, 4)), (1, 2));
    assert_eq!(u32_at(&list.data, 8), 0);

    let ns = a.identify(0, 1).await;
    ns.ok();
    assert_eq!(u64_at(&ns.data, 0), 16 << 20 >> 9, "NSZE");
    assert_eq!(ns.data[128 + 2], 9, "LBADS: 512-byte blocks");
    assert_eq!(ns.data[99], 0, "LUN 0 writable");
    let nguid = ns.data[104..120].to_vec();
    assert_ne!(nguid, vec![0u8; 16]);
    let ns2 = a.identify(0, 2).await;
    assert_eq!(ns2.data[99], 1, "LUN 1 read-only");
    assert_eq!(u64_at(&ns2.data, 0), 1 << 20 >> 9);
    let desc = a.identify(3, 1).await;
    desc.ok();
    // The NGUID descriptor carries the same NGUID.
    let mut at = 0;
    let mut found = false;
    while at + 4 <= desc.data.len() && desc.data[at] != 0 {
        let (t, l) = (desc.data[at], desc.data[at + 1] as usize);
        if t == 2 {
            assert_eq!(&desc.data[at + 4..at + 4 + l], &nguid[..]);
            found = true;
        }
        at += 4 + l;
    }
    assert!(found, "no NGUID descriptor");
    assert_eq!(a.identify(0, 0).await.cqe.status, Status::INVALID_NAMESPACE);
    // Keep Alive, Get Features (Number of Queues), an unknown opcode.
    a.cmd(Sqe::new(0x18, 0), &[], true, 0).await.ok();
    let mut gf = Sqe::new(0x0A, 0);
    gf.set_cdw(10, 7);
    let q = a.cmd(gf, &[], true, 0).await;
    q.ok();
    assert_eq!(q.cqe.dw0, 63 | 63 << 16);
    assert_eq!(
        a.cmd(Sqe::new(0xC3, 0), &[], true, 0).await.cqe.status,
        Status::INVALID_OPCODE
    );
    let smart = a.get_log(0x02, 512).await;
    smart.ok();
    assert_eq!(smart.data.len(), 512);

    // An I/O queue joins the controller.
    let mut io = Host::open(addr).await;
    io.connect(1, SUBNQN, HOSTNQN, cntlid).await.ok();
    // In-capsule 4 KiB, then 128 KiB on R2T/H2CData.
    let small = pattern(4096, 1);
    io.write(1, 8, &small, true).await.ok();
    assert_eq!(io.read(1, 8, 8).await.ok().data, small);
    let big = pattern(128 * 1024, 2);
    io.write(1, 100, &big, false).await.ok();
    assert_eq!(io.read(1, 100, 256).await.ok().data, big);
    // Flush.
    let flush = io.rw(0x00, 1, 0, 1).await;
    let mut flush = flush;
    flush.set_cdw(10, 0);
    flush.set_cdw(12, 0);
    io.cmd(flush, &[], true, 0).await.ok();
    // Write Zeroes over part of the big write.
    let wz = io.rw(0x08, 1, 100, 16).await;
    io.cmd(wz, &[], true, 0).await.ok();
    let back = io.read(1, 100, 32).await;
    back.ok();
    assert_eq!(&back.data[..16 * 512], &vec![0u8; 16 * 512][..]);
    assert_eq!(&back.data[16 * 512..], &big[16 * 512..32 * 512]);
    // Dataset Management, deallocate: UNMAP of the range.
    let mut dsm = Sqe::new(0x09, 0);
    dsm.set_nsid(1);
    dsm.set_cdw(11, 1 << 2);
    let mut range = vec![0u8; 16];
    range[4..8].copy_from_slice(&64u32.to_le_bytes());
    range[8..16].copy_from_slice(&1000u64.to_le_bytes());
    io.cmd(dsm, &range, true, 0).await.ok();
    // A range past the end fails as the UNMAP does.
    let mut dsm = Sqe::new(0x09, 0);
    dsm.set_nsid(1);
    dsm.set_cdw(11, 1 << 2);
    range[8..16].copy_from_slice(&(16u64 << 20 >> 9).to_le_bytes());
    assert_eq!(
        io.cmd(dsm, &range, true, 0).await.cqe.status,
        Status::LBA_OUT_OF_RANGE
    );
    // Compare: the same data matches, other data fails.
    let cmp = io.rw(0x05, 1, 8, 8).await;
    io.cmd(cmp, &small, true, 0).await.ok();
    let cmp = io.rw(0x05, 1, 8, 8).await;
    assert_eq!(
        io.cmd(cmp, &pattern(4096, 9), true, 0).await.cqe.status,
        Status::COMPARE_FAILURE
    );
    // Past the end: LBA Out of Range.
    let end = 16 << 20 >> 9;
    assert_eq!(
        io.read(1, end - 1, 2).await.cqe.status,
        Status::LBA_OUT_OF_RANGE
    );
    // The read-only LUN: Namespace is Write Protected (generic 20h).
    let ro = io.write(2, 0, &small, true).await;
    assert_eq!((ro.cqe.status.sc, ro.cqe.status.dnr), (0x20, true));
    // A namespace that does not exist.
    assert_eq!(io.read(9, 0, 1).await.cqe.status, Status::INVALID_NAMESPACE);

    // An I/O queue naming another host is refused.
    let mut stranger = Host::open(addr).await;
    let r = stranger
        .connect(1, SUBNQN, "nqn.2014-08.org.example:other", cntlid)
        .await;
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(r.cqe.dw0, 1 << 16 | 512);

    // The admin queue ends: so do its I/O queues.
    drop(a);
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), io.s.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the I/O queue outlived its controller");
    n.stop().await;
}

#[tokio::test]
async fn discovery_lists_the_subsystem_and_nguid_persists() {
    let dir = tempfile::tempdir().unwrap();
    let mut nguids = Vec::new();
    for _ in 0..2 {
        let (srv, mut n, addr) = server(dir.path()).await;
        let (mut d, _) = Host::admin(addr, DISCOVERY).await;
        let id = d.identify(1, 0).await;
        id.ok();
        assert_eq!(id.data[111], 2, "a discovery controller");
        let head = d.get_log(0x70, 1024).await;
        head.ok();
        assert_eq!(u64_at(&head.data, 8), 1, "one record");
        let log = d.get_log(0x70, 2048).await;
        log.ok();
        let r = &log.data[1024..2048];
        assert_eq!((r[0], r[1], r[2]), (3, 1, 2), "TCP, IPv4, NVM subsystem");
        assert_eq!(&r[256..256 + SUBNQN.len()], SUBNQN.as_bytes());
        assert_eq!(r[256 + SUBNQN.len()], 0);
        let port = addr.port().to_string();
        assert_eq!(&r[32..32 + port.len()], port.as_bytes());
        assert_eq!(&r[512..521], b"127.0.0.1");

        let (mut a, _) = Host::admin(addr, SUBNQN).await;
        let ns = a.identify(0, 1).await;
        ns.ok();
        nguids.push(ns.data[104..120].to_vec());
        drop((a, d));
        n.stop().await;
        drop(srv);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(nguids[0], nguids[1], "the NGUID changed across runs");
    // An unknown subsystem is refused.
    let (_srv, mut n, addr) = server(dir.path()).await;
    let mut h = Host::open(addr).await;
    let r = h
        .connect(0, "nqn.2014-08.org.ethersan:nope", HOSTNQN, 0xFFFF)
        .await;
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(r.cqe.dw0, 1 << 16 | 256);
    n.stop().await;
}

#[tokio::test]
async fn a_malformed_pdu_ends_only_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (_srv, mut n, addr) = server(dir.path()).await;
    let (mut a, cntlid) = Host::admin(addr, SUBNQN).await;
    let mut io = Host::open(addr).await;
    io.connect(1, SUBNQN, HOSTNQN, cntlid).await.ok();

    // A second connection sends a PDU of an unknown type.
    let mut bad = Host::open(addr).await;
    let mut junk = vec![0xEEu8, 0, 8, 0, 8, 0, 0, 0];
    junk.extend_from_slice(&[0; 8]);
    bad.s.write_all(&junk).await.unwrap();
    match bad.recv().await {
        (Pdu::C2hTermReq(t), _) => assert_eq!(t.fes, 1, "invalid header field"),
        (other, _) => panic!("expected C2HTermReq, got {:?}", other.pdu_type()),
    }
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), bad.s.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the bad connection stayed open");

    // The good connection's I/O goes on.
    let data = pattern(8192, 5);
    io.write(1, 0, &data, true).await.ok();
    assert_eq!(io.read(1, 0, 16).await.ok().data, data);
    a.cmd(Sqe::new(0x18, 0), &[], true, 0).await.ok();
    n.stop().await;
}

/// A PERSISTENT RESERVE OUT over iSCSI: its CDB and parameter list.
fn pr_out(action: u8, rtype: u8, key: u64, sa_key: u64) -> (Vec<u8>, bytes::Bytes) {
    let mut c = vec![0u8; 10];
    c[0] = 0x5F;
    c[1] = action;
    c[2] = rtype;
    c[8] = 24;
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    (c, p.into())
}

/// Reservation Register/Acquire/Release data: two keys, little-endian.
fn keys(a: u64, b: u64) -> Vec<u8> {
    let mut d = a.to_le_bytes().to_vec();
    d.extend_from_slice(&b.to_le_bytes());
    d
}

#[tokio::test]
async fn an_iscsi_reservation_fences_nvme_writes_and_nvme_preempts_it() {
    use ethersan_initiator::{login, LoginOptions};
    let dir = tempfile::tempdir().unwrap();
    let (srv, mut n, addr) = server(dir.path()).await;
    // An iSCSI initiator registers key 0xAA and reserves LUN 0 (Write
    // Exclusive).
    let (client, tgt) = tokio::io::duplex(1 << 20);
    let (trd, twr) = tokio::io::split(tgt);
    let s2 = srv.clone();
    tokio::spawn(async move { s2.serve_stream(trd, twr, "memory").await });
    let (crd, cwr) = tokio::io::split(client);
    let opts = LoginOptions {
        target_name: Some(TARGET.to_string()),
        ..LoginOptions::default()
    };
    let iscsi = login(crd, cwr, &opts).await.unwrap();
    for _ in 0..4 {
        let r = iscsi
            .command(0, &[0; 6], bytes::Bytes::new(), 0)
            .await
            .unwrap();
        if r.status == 0 {
            break;
        }
    }
    for (sa, t, k, sk) in [(0x00, 0, 0, 0xAA), (0x01, 1, 0xAA, 0)] {
        let (cdb, p) = pr_out(sa, t, k, sk);
        let r = iscsi.command(0, &cdb, p, 0).await.unwrap();
        assert_eq!(r.status, 0, "PERSISTENT RESERVE OUT {sa}");
    }

    let (_a, cntlid) = Host::admin(addr, SUBNQN).await;
    let mut io = Host::open(addr).await;
    io.connect(1, SUBNQN, HOSTNQN, cntlid).await.ok();
    let data = pattern(4096, 3);
    let w = io.write(1, 0, &data, true).await;
    assert_eq!(w.cqe.status, Status::RESERVATION_CONFLICT);
    // Reading is allowed under Write Exclusive.
    io.read(1, 0, 8).await.ok();

    // The report shows the iSCSI holder's key.
    let mut rep = Sqe::new(0x0E, 0);
    rep.set_nsid(1);
    rep.set_cdw(10, 4096 / 4 - 1);
    let r = io.cmd(rep, &[], false, 4096).await;
    r.ok();
    assert_eq!(r.data[4], 1, "Write Exclusive");
    assert_eq!(u16::from_le_bytes([r.data[5], r.data[6]]), 1);
    assert_eq!(&r.data[24 + 16..24 + 24], &0xAAu64.to_le_bytes());
    assert_eq!(r.data[24 + 2], 1, "the key holds the reservation");

    // The NVMe host registers 0xBB and preempts 0xAA.
    let mut reg = Sqe::new(0x0D, 0);
    reg.set_nsid(1);
    io.cmd(reg, &keys(0, 0xBB), true, 0).await.ok();
    let mut acq = Sqe::new(0x11, 0);
    acq.set_nsid(1);
    acq.set_cdw(10, 1 | 1 << 8);
    io.cmd(acq, &keys(0xBB, 0xAA), true, 0).await.ok();
    io.write(1, 0, &data, true).await.ok();
    assert_eq!(io.read(1, 0, 8).await.ok().data, data);
    // Now the iSCSI initiator's writes conflict.
    let r = iscsi
        .command(
            0,
            &[0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            vec![0u8; 512].into(),
            0,
        )
        .await
        .unwrap();
    assert_ne!(r.status, 0);
    // Release and unregister.
    let mut rel = Sqe::new(0x15, 0);
    rel.set_nsid(1);
    rel.set_cdw(10, 1 << 8);
    io.cmd(rel, &keys(0xBB, 0), true, 0).await.ok();
    let mut unreg = Sqe::new(0x0D, 0);
    unreg.set_nsid(1);
    unreg.set_cdw(10, 1);
    io.cmd(unreg, &keys(0xBB, 0), true, 0).await.ok();
    n.stop().await;
}

#[tokio::test]
async fn a_host_the_access_list_leaves_out_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "portals = [\"127.0.0.1:0\"]\n[options]\ndata_dir = {:?}\n[nvme]\nportals = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{TARGET}\"\nallow = [\"{HOSTNQN}\"]\nlun = [\"ram:1M\"]\n",
        dir.path().display().to_string(),
    );
    let cfg = Config::from_toml_str(&text, "test").unwrap();
    let srv = Server::bind(&cfg).await.unwrap();
    let mut n = nvme::start(&cfg, srv.registry().clone()).await.unwrap();
    let addr = n.local_addrs()[0];
    let mut other = Host::open(addr).await;
    let r = other
        .connect(0, SUBNQN, "nqn.2014-08.org.example:other", 0xFFFF)
        .await;
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_HOST);
    // The host it allows gets in, and the discovery log lists the
    // subsystem for it only.
    let (mut a, _) = Host::admin(addr, SUBNQN).await;
    a.identify(1, 0).await.ok();
    let (mut d, _) = Host::admin(addr, DISCOVERY).await;
    let head = d.get_log(0x70, 1024).await;
    assert_eq!(u64_at(&head.ok().data, 8), 1);
    n.stop().await;
}

#[tokio::test]
async fn digests_and_keep_alive_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let (_srv, mut n, addr) = server(dir.path()).await;
    // Header and data digests on the I/O queue: a 128 KiB write on
    // R2T/H2CData and its read back in C2HData, every PDU digested.
    let (mut a, cntlid) = Host::admin_kato(addr, SUBNQN, 600).await;
    let mut io = Host::open_with(addr, true).await;
    io.connect(1, SUBNQN, HOSTNQN, cntlid).await.ok();
    let big = pattern(128 * 1024, 7);
    io.write(1, 2048, &big, false).await.ok();
    assert_eq!(io.read(1, 2048, 256).await.ok().data, big);
    let small = pattern(2048, 8);
    io.write(1, 0, &small, true).await.ok();
    assert_eq!(io.read(1, 0, 4).await.ok().data, small);
    // Keep Alive holds the controller past its 600 ms...
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        a.cmd(Sqe::new(0x18, 0), &[], true, 0).await.ok();
    }
    assert_eq!(n.controllers(), 1);
    // ...and without it the controller ends, its I/O queue too.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), a.s.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the admin queue outlived its Keep Alive Timeout"
    );
    let closed = tokio::time::timeout(Duration::from_secs(5), io.s.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the I/O queue outlived its controller");
    assert_eq!(n.controllers(), 0);
    n.stop().await;
}

#[tokio::test]
async fn a_namespace_added_live_completes_an_async_event_request() {
    let dir = tempfile::tempdir().unwrap();
    let (srv, mut n, addr) = server(dir.path()).await;
    let (mut a, _) = Host::admin(addr, SUBNQN).await;
    // Namespace attribute notices on.
    let mut sf = Sqe::new(0x09, 0);
    sf.set_cdw(10, 0x0B);
    sf.set_cdw(11, 1 << 8);
    a.cmd(sf, &[], true, 0).await.ok();
    let ctrl = a.identify(1, 0).await;
    assert_eq!(u32_at(&ctrl.data, 92) & 1 << 8, 1 << 8, "OAES");
    // The controller has seen its namespaces at least once.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let lu = ethersan_scsi::LogicalUnit::new(
        Arc::new(ethersan_backend::ram::RamDevice::new(1 << 20, 512).unwrap()),
        ethersan_scsi::LuConfig::default(),
    );
    srv.registry()
        .target(TARGET)
        .unwrap()
        .add_lun(
            5,
            ethersan_scsi::LunSlot {
                lu: Arc::new(lu),
                policy: ethersan_scsi::LunPolicy::default(),
            },
        )
        .unwrap();
    let aer = a.cmd(Sqe::new(0x0C, 0), &[], true, 0).await;
    aer.ok();
    assert_eq!(aer.cqe.dw0, 2 | 0x04 << 16, "a namespace attribute notice");
    let log = a.get_log(0x04, 4096).await;
    log.ok();
    assert_eq!((u32_at(&log.data, 0), u32_at(&log.data, 4)), (6, 0));
    let list = a.identify(2, 0).await;
    assert_eq!(u32_at(&list.ok().data, 8), 6);
    // Read: the list is empty again.
    let again = a.get_log(0x04, 4096).await;
    assert_eq!(u32_at(&again.ok().data, 0), 0);
    n.stop().await;
}

/// Whether the target closes `h`'s connection within 5 s (reading and
/// dropping whatever it sends first).
async fn closed(h: &mut Host) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(5), h.s.read_to_end(&mut rest)).await,
        Ok(Ok(_))
    )
}

/// Input a host must not send, each refused without harm to the others:
/// an I/O command before an accepted Connect ends its connection (no
/// buffer is made for it); a host that sends reads and takes no answer
/// makes the target queue a few MiB, not every read's data; a Get Log Page asking for 16 GiB gets only its buffer's worth;
/// fused commands and a Write Zeroes with FUA (WRITE SAME has no FUA) are
/// refused with Invalid Field.
#[tokio::test]
async fn a_misbehaving_host_is_refused_without_harm() {
    let dir = tempfile::tempdir().unwrap();
    let (_srv, mut n, addr) = server(dir.path()).await;
    let (mut a, cntlid) = Host::admin(addr, SUBNQN).await;
    let mut io = Host::open(addr).await;
    io.connect(1, SUBNQN, HOSTNQN, cntlid).await.ok();

    // A Connect whose data never comes (not accepted yet), then a write
    // waiting for 1 MiB of data.
    let mut early = Host::open(addr).await;
    let mut sqe = FabricsCommand::Connect(Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    })
    .to_sqe(1);
    sqe.set_sgl(Sgl::Transport { len: 1024 });
    early.send(Pdu::CapsuleCmd(sqe), &[]).await;
    let mut sqe = early.rw(0x01, 1, 0, 2048).await;
    sqe.0[2..4].copy_from_slice(&2u16.to_le_bytes());
    sqe.set_sgl(Sgl::Transport { len: 1 << 20 });
    early.send(Pdu::CapsuleCmd(sqe), &[]).await;
    assert!(
        closed(&mut early).await,
        "a command before an accepted Connect was taken"
    );

    // 400 reads of 1 MiB sent at once by a host that reads no answer: the
    // target queues a few MiB of answers and reads no further commands
    // until they are taken (without that, 400 MiB waited here; the server
    // runs in this process, so its memory is this test's).
    let rss = || {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let l = s
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .unwrap()
            .to_string();
        l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
    };
    let before = rss();
    let mut flood = Host::open(addr).await;
    flood.connect(2, SUBNQN, HOSTNQN, cntlid).await.ok();
    let mut burst = Vec::new();
    for cid in 1..=400u16 {
        let mut sqe = flood.rw(0x02, 1, 0, 2048).await;
        sqe.0[2..4].copy_from_slice(&cid.to_le_bytes());
        sqe.set_sgl(Sgl::Transport { len: 1 << 20 });
        Pdu::CapsuleCmd(sqe)
            .encode(&[], &flood.framing, &mut burst)
            .unwrap();
    }
    flood.s.write_all(&burst).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Meanwhile the other queue is served.
    assert_eq!(io.read(1, 0, 8).await.ok().data.len(), 4096);
    let grown = rss().saturating_sub(before);
    assert!(
        grown < 100 << 20,
        "{} MiB more memory with 400 MiB of reads unread",
        grown >> 20
    );
    drop(flood);

    // Get Log Page (SMART) with NUMD at its largest and a 4 KiB buffer.
    let mut sqe = Sqe::new(0x02, 0);
    sqe.set_cdw(10, 0x02 | 0xFFFF << 16);
    sqe.set_cdw(11, 0xFFFF);
    let log = a.cmd(sqe, &[], false, 4096).await;
    log.ok();
    assert_eq!(log.data.len(), 4096);

    // A fused first command, and a Write Zeroes with FUA.
    let mut sqe = io.rw(0x02, 1, 0, 1).await;
    sqe.0[1] |= 1;
    assert_eq!(
        io.cmd(sqe, &[], false, 512).await.cqe.status,
        Status::INVALID_FIELD
    );
    let mut sqe = io.rw(0x08, 1, 0, 8).await;
    sqe.set_cdw(12, 7 | 1 << 30);
    assert_eq!(
        io.cmd(sqe, &[], false, 0).await.cqe.status,
        Status::INVALID_FIELD
    );

    // The well-behaved queues go on.
    let data = pattern(4096, 9);
    io.write(1, 8, &data, true).await.ok();
    assert_eq!(io.read(1, 8, 8).await.ok().data, data);
    a.cmd(Sqe::new(0x18, 0), &[], true, 0).await.ok();
    n.stop().await;
}

/// An access rule that admits a host from one address: its admin queue
/// connects from there; an I/O queue Connect naming its controller, host
/// NQN and host ID from another address is refused (Connect Invalid Host),
/// one from the admitted address is taken.
#[tokio::test]
async fn an_io_queue_from_an_address_the_rules_leave_out_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "portals = [\"127.0.0.1:0\"]\n[options]\ndata_dir = {:?}\n[nvme]\nportals = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{TARGET}\"\nallow = [\"{HOSTNQN}@127.0.0.1\"]\nlun = [\"ram:1M\"]\n",
        dir.path().display().to_string(),
    );
    let cfg = Config::from_toml_str(&text, "test").unwrap();
    let srv = Server::bind(&cfg).await.unwrap();
    let mut n = nvme::start(&cfg, srv.registry().clone()).await.unwrap();
    let addr = n.local_addrs()[0];
    let (mut a, cntlid) = Host::admin(addr, SUBNQN).await;
    let mut elsewhere = Host::open_from(addr, false, Some("127.0.0.2")).await;
    let r = elsewhere.connect(1, SUBNQN, HOSTNQN, cntlid).await;
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_HOST);
    let mut here = Host::open(addr).await;
    here.connect(1, SUBNQN, HOSTNQN, cntlid).await.ok();
    assert_eq!(here.read(1, 0, 1).await.ok().data.len(), 512);
    a.cmd(Sqe::new(0x18, 0), &[], true, 0).await.ok();
    n.stop().await;
}

/// A TCP connection that never sends ICReq, and one that sends ICReq but
/// no Connect, are closed after 10 s: an idle socket does not hold a task
/// for ever.
#[tokio::test]
async fn a_connection_without_a_controller_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (_srv, mut n, addr) = server(dir.path()).await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut h = Host::open(addr).await;
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(20), silent.read_to_end(&mut rest)).await;
    assert!(matches!(r, Ok(Ok(0))), "the silent connection stayed open");
    assert!(
        started.elapsed() >= Duration::from_secs(8),
        "closed after {:?}",
        started.elapsed()
    );
    assert!(
        closed(&mut h).await,
        "the connection without Connect stayed open"
    );
    n.stop().await;
}
