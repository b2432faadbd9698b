//! The AF_PACKET link over a veth pair joining two network namespaces that
//! each test creates and deletes itself (also on failure, by a guard's
//! Drop). No traffic touches any other interface. Needs root (to create
//! namespaces) and iproute2's `ip`.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ethersan_link::packet::{Fanout, FanoutMode, PacketConfig, PacketLink, RingVersion};
use ethersan_link::{EthernetHeader, Link, LinkError, MacAddr, ETHERTYPE_AOE, HEADER_LEN};

/// An EtherType nobody listens to (IEEE local experimental).
const OTHER_ETHERTYPE: u16 = 0x88b5;

fn ip(args: &[&str]) {
    let out = match Command::new("ip").args(args).output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("iproute2's `ip` is not installed, and these tests need it: apt-get install iproute2 (scripts/test does)")
        }
        Err(e) => panic!("running ip {}: {e}", args.join(" ")),
    };
    assert!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Two namespaces joined by a veth pair; both deleted on drop (which
/// deletes the veth pair with them).
struct VethPair {
    ns: [String; 2],
    ifname: [String; 2],
}

impl VethPair {
    fn new(tag: &str, mtu: usize) -> VethPair {
        VethPair::named("esl", tag, mtu)
    }

    /// As [`VethPair::new`], the namespaces named `PREFIX-PID-TAG-a|b`.
    fn named(prefix: &str, tag: &str, mtu: usize) -> VethPair {
        let pid = std::process::id();
        let pair = VethPair {
            ns: [
                format!("{prefix}-{pid}-{tag}-a"),
                format!("{prefix}-{pid}-{tag}-b"),
            ],
            ifname: [
                format!("v{}{tag}a", pid % 100_000),
                format!("v{}{tag}b", pid % 100_000),
            ],
        };
        for ns in &pair.ns {
            ip(&["netns", "add", ns]);
        }
        let mtu = mtu.to_string();
        #[rustfmt::skip]
        ip(&["link", "add", &pair.ifname[0], "netns", &pair.ns[0], "mtu", &mtu, "type", "veth",
             "peer", "name", &pair.ifname[1], "netns", &pair.ns[1], "mtu", &mtu]);
        for i in 0..2 {
            ip(&["-n", &pair.ns[i], "link", "set", &pair.ifname[i], "up"]);
        }
        pair
    }

    /// Opens a link on side `i` (0 or 1), inside that side's namespace.
    fn open(
        &self,
        i: usize,
        tweak: impl FnOnce(&mut PacketConfig) + Send,
    ) -> Result<PacketLink, LinkError> {
        let mut cfg = PacketConfig::new(&self.ifname[i], ETHERTYPE_AOE);
        tweak(&mut cfg);
        open_in(&self.ns[i], cfg)
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Opens a packet link inside network namespace `ns`: a short-lived thread
/// enters the namespace and creates the socket, which stays in it.
fn open_in(ns: &str, cfg: PacketConfig) -> Result<PacketLink, LinkError> {
    let handle = tokio::runtime::Handle::current();
    let path = format!("/run/netns/{ns}");
    std::thread::scope(|s| {
        s.spawn(move || {
            let f = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: setns on this thread only, with a namespace fd we hold.
            let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
            let _rt = handle.enter();
            PacketLink::open(cfg)
        })
        .join()
        .unwrap()
    })
}

fn frame(dst: MacAddr, src: MacAddr, ethertype: u16, seq: u32, len: usize) -> Vec<u8> {
    let mut f = EthernetHeader {
        dst,
        src,
        ethertype,
    }
    .to_bytes()
    .to_vec();
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend((f.len()..len).map(|i| (i as u32).wrapping_mul(31) as u8 ^ seq as u8));
    f
}

fn seq_of(f: &[u8]) -> u32 {
    u32::from_be_bytes(f[HEADER_LEN..HEADER_LEN + 4].try_into().unwrap())
}

/// Sends `n` frames of `len` bytes from `from` to `to` in batches of 64,
/// with every 10th batch also carrying a frame of another EtherType, one to
/// a stranger MAC and one broadcast; keeps at most `window` frames in
/// flight so the receive ring never overflows. Returns the received frames
/// (in order) after checking them.
async fn stream(from: Arc<Link>, to: Arc<Link>, n: u32, len: usize) {
    const WINDOW: usize = 512;
    let received = Arc::new(AtomicUsize::new(0));
    let stranger = MacAddr([0x02, 0x99, 0x99, 0x99, 0x99, 0x99]);
    let (dst, src) = (to.mac(), from.mac());
    let sender = {
        let received = received.clone();
        let from = from.clone();
        async move {
            let mut next = 0u32;
            let mut sent = 0usize;
            let mut broadcasts = 0u32;
            while next < n {
                while sent >= received.load(Ordering::Acquire) + WINDOW {
                    tokio::time::sleep(Duration::from_micros(100)).await;
                }
                let mut batch = Vec::new();
                for _ in 0..64.min(n - next) {
                    batch.push(frame(dst, src, ETHERTYPE_AOE, next, len));
                    next += 1;
                }
                let mut filtered = 0;
                if next % 640 < 64 {
                    batch.push(frame(dst, src, OTHER_ETHERTYPE, u32::MAX, len));
                    batch.push(frame(stranger, src, ETHERTYPE_AOE, u32::MAX, len));
                    batch.push(frame(
                        MacAddr::BROADCAST,
                        src,
                        ETHERTYPE_AOE,
                        u32::MAX - 1,
                        60,
                    ));
                    broadcasts += 1;
                    filtered = 2;
                }
                sent += batch.len() - filtered;
                from.send_batch(&batch).await.unwrap();
            }
            broadcasts
        }
    };
    let receiver = async move {
        let mut got = Vec::new();
        let mut broadcasts = 0u32;
        loop {
            let mut bad = None;
            to.recv_batch(|f| {
                let h = EthernetHeader::parse(f).unwrap();
                if h.dst.is_broadcast() {
                    broadcasts += 1;
                } else if h.dst != dst || h.ethertype != ETHERTYPE_AOE || seq_of(f) == u32::MAX {
                    bad = Some(h);
                } else {
                    got.push(f.to_vec());
                }
            })
            .await
            .unwrap();
            assert!(
                bad.is_none(),
                "a frame that should have been filtered arrived: {bad:?}"
            );
            received.store(got.len() + broadcasts as usize, Ordering::Release);
            if got.len() == n as usize {
                return (got, broadcasts);
            }
        }
    };
    let (sent_broadcasts, (got, broadcasts)) = tokio::join!(sender, receiver);
    for (i, f) in got.iter().enumerate() {
        assert_eq!(f.len(), len);
        assert!(
            *f == frame(dst, src, ETHERTYPE_AOE, i as u32, len),
            "frame {i} differs (seq {})",
            seq_of(f)
        );
    }
    // The last broadcast may trail the last data frame.
    assert!(broadcasts + 1 >= sent_broadcasts && broadcasts <= sent_broadcasts);
}

async fn both_ways(tag: &str, mtu: usize, n: u32, rings: [RingVersion; 2]) {
    let pair = VethPair::new(tag, mtu);
    let a = Arc::new(Link::from(pair.open(0, |c| c.ring = rings[0]).unwrap()));
    let b = Arc::new(Link::from(pair.open(1, |c| c.ring = rings[1]).unwrap()));
    assert_eq!((a.mtu(), b.mtu()), (mtu, mtu));
    assert!(a.mac().is_unicast() && a.mac() != b.mac());
    let len = mtu + HEADER_LEN;
    let start = Instant::now();
    tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(
            stream(a.clone(), b.clone(), n, len),
            stream(b.clone(), a.clone(), n, len)
        )
    })
    .await
    .expect("exchange timed out");
    eprintln!(
        "{rings:?}: {n} frames of {len} bytes each way in {:?}",
        start.elapsed()
    );
    for l in [&a, &b] {
        let Link::Packet(p) = &**l else {
            unreachable!()
        };
        let st = p.take_stats().unwrap();
        assert_eq!(st.drops, 0, "{st:?}");
        assert!(st.packets >= u64::from(n), "{st:?}");
    }
    let err = a.send(&vec![0; len + 1]).await.unwrap_err();
    assert!(matches!(err, LinkError::FrameSize { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn veth_mtu_1500_both_ways() {
    both_ways("s", 1500, 5000, [RingVersion::V3; 2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn veth_mtu_9000_jumbo_both_ways() {
    both_ways("j", 9000, 3000, [RingVersion::V3; 2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn veth_tpacket_v2_mtu_1500_both_ways() {
    both_ways("t", 1500, 5000, [RingVersion::V2; 2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn veth_tpacket_v2_with_v3_mtu_9000_jumbo() {
    both_ways("u", 9000, 3000, [RingVersion::V2, RingVersion::V3]).await;
}

/// Frames built straight in the transmit slots ([`Link::send_with`]) of
/// every length from the shortest to the MTU, longer and shorter ones
/// reusing the same slots (stale bytes), some builds declining (length 0)
/// or claiming more than the slot: each sent frame arrives intact and in
/// order, the declined ones never.
async fn built_in_slots(tag: &str, mtu: usize, ring: RingVersion) {
    let pair = VethPair::named("lnk", tag, mtu);
    let open = |i| {
        pair.open(i, |c| c.ring = ring)
            .map(|l| Arc::new(Link::from(l)))
    };
    let (a, b) = (open(0).unwrap(), open(1).unwrap());
    let (dst, src) = (b.mac(), a.mac());
    let max = a.max_frame_len();
    assert_eq!(max, mtu + HEADER_LEN);
    // Lengths that sweep up and down, so a short frame follows a long one
    // in a slot.
    let len_of = |seq: u32| {
        let span = (max - 60) as u32;
        let x = seq.wrapping_mul(2_654_435_761) % (2 * span);
        60 + (if x < span { x } else { 2 * span - x }) as usize
    };
    let (mut seq, mut expected) = (0u32, Vec::new());
    for round in 0..40u32 {
        let n = 64;
        let mut declined = 0;
        let sent = a
            .send_with(n, |i, slot| {
                assert_eq!(
                    slot.len(),
                    max,
                    "the slot is offered at the link's frame size"
                );
                match (round + i as u32) % 29 {
                    // Declined: nothing sent, the slot goes to the next frame.
                    0 => {
                        declined += 1;
                        0
                    }
                    // More than the slot: refused like a declined frame.
                    1 => {
                        declined += 1;
                        slot.len() + 1
                    }
                    _ => {
                        let f = frame(dst, src, ETHERTYPE_AOE, seq, len_of(seq));
                        slot[..f.len()].copy_from_slice(&f);
                        expected.push(f);
                        seq += 1;
                        len_of(seq - 1)
                    }
                }
            })
            .await
            .unwrap();
        assert_eq!(sent, n - declined, "round {round}");
        // Lock-step: every frame of the batch is in before the next, so
        // the receive ring never overflows.
        let mut got = 0;
        while got < sent {
            let mut frames = Vec::new();
            tokio::time::timeout(
                Duration::from_secs(10),
                b.recv_batch(|f| frames.push(f.to_vec())),
            )
            .await
            .expect("frames built in slots arrive")
            .unwrap();
            for f in frames {
                let at = expected.len() - sent + got;
                assert!(
                    f == expected[at],
                    "frame {at} (seq {}) arrived changed",
                    seq_of(&f)
                );
                got += 1;
            }
        }
    }
    assert!(seq > 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_built_in_tx_slots_arrive_intact_v3_mtu_9000() {
    built_in_slots("b3", 9000, RingVersion::V3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_built_in_tx_slots_arrive_intact_v2_mtu_1500() {
    built_in_slots("b2", 1500, RingVersion::V2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_shares_the_load() {
    let pair = VethPair::new("f", 1500);
    let a = Link::from(pair.open(0, |_| {}).unwrap());
    let fan = |c: &mut PacketConfig| {
        c.fanout = Some(Fanout {
            group: (std::process::id() & 0xffff) as u16,
            mode: FanoutMode::LoadBalance,
        })
    };
    let b1 = Arc::new(Link::from(pair.open(1, fan).unwrap()));
    let b2 = Arc::new(Link::from(pair.open(1, fan).unwrap()));
    let n = 2000u32;
    let total = Arc::new(AtomicUsize::new(0));
    let count = |l: Arc<Link>| {
        let total = total.clone();
        tokio::spawn(async move {
            let mut mine = 0;
            while total.load(Ordering::Acquire) < n as usize {
                if let Ok(r) =
                    tokio::time::timeout(Duration::from_millis(50), l.recv_batch(|_| mine += 1))
                        .await
                {
                    total.fetch_add(r.unwrap(), Ordering::AcqRel);
                }
            }
            mine
        })
    };
    let (t1, t2) = (count(b1.clone()), count(b2.clone()));
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let batch: Vec<_> = chunk
            .iter()
            .map(|&i| frame(b1.mac(), a.mac(), ETHERTYPE_AOE, i, 100))
            .collect();
        a.send_batch(&batch).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (m1, m2) = tokio::time::timeout(Duration::from_secs(30), async {
        (t1.await.unwrap(), t2.await.unwrap())
    })
    .await
    .expect("fanout receivers timed out");
    assert_eq!(m1 + m2, n as usize);
    assert!(m1 > 0 && m2 > 0, "one socket got everything: {m1} / {m2}");
}

/// Fanout by source MAC: every frame of one sender reaches the same
/// socket, and senders are spread over the group's sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_by_source_mac_keeps_each_sender_on_one_socket() {
    let pair = VethPair::named("fo", "s", 1500);
    let a = Link::from(pair.open(0, |_| {}).unwrap());
    // The first socket makes a group with an id of the kernel's choice,
    // the second joins it.
    let fan = |group: u16| {
        move |c: &mut PacketConfig| {
            c.fanout = Some(Fanout {
                group,
                mode: FanoutMode::SourceMac,
            })
        }
    };
    let first = pair.open(1, fan(0)).unwrap();
    let group = first.fanout_group().unwrap().expect("a fanout group");
    let b1 = Arc::new(Link::from(first));
    let b2 = Arc::new(Link::from(pair.open(1, fan(group)).unwrap()));
    // 16 senders (forged source MACs), 20 frames each.
    let senders: Vec<MacAddr> = (0..16u8)
        .map(|i| MacAddr([0x02, 0, 0x5e, 0x10, i.wrapping_mul(37), i]))
        .collect();
    let per = 20usize;
    let n = senders.len() * per;
    let total = Arc::new(AtomicUsize::new(0));
    let collect = |l: Arc<Link>| {
        let total = total.clone();
        tokio::spawn(async move {
            let mut seen: Vec<(MacAddr, u32)> = Vec::new();
            while total.load(Ordering::Acquire) < n {
                if let Ok(r) = tokio::time::timeout(
                    Duration::from_millis(50),
                    l.recv_batch(|f| seen.push((EthernetHeader::parse(f).unwrap().src, seq_of(f)))),
                )
                .await
                {
                    total.fetch_add(r.unwrap(), Ordering::AcqRel);
                }
            }
            seen
        })
    };
    let (t1, t2) = (collect(b1.clone()), collect(b2.clone()));
    for round in 0..per as u32 {
        let batch: Vec<_> = senders
            .iter()
            .map(|&src| frame(b1.mac(), src, ETHERTYPE_AOE, round, 100))
            .collect();
        a.send_batch(&batch).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (s1, s2) = tokio::time::timeout(Duration::from_secs(30), async {
        (t1.await.unwrap(), t2.await.unwrap())
    })
    .await
    .expect("fanout receivers timed out");
    let mut all: Vec<_> = s1.iter().chain(&s2).copied().collect();
    all.sort();
    let mut dups = all.clone();
    dups.dedup();
    assert_eq!(dups.len(), all.len(), "a frame seen twice: {s1:?} / {s2:?}");
    assert_eq!(s1.len() + s2.len(), n);
    for m in &senders {
        let (c1, c2) = (
            s1.iter().filter(|x| x.0 == *m).count(),
            s2.iter().filter(|x| x.0 == *m).count(),
        );
        assert!(
            (c1, c2) == (per, 0) || (c1, c2) == (0, per),
            "sender {m} split over the sockets: {c1} / {c2}"
        );
    }
    assert!(
        !s1.is_empty() && !s2.is_empty(),
        "one socket got every sender: {} / {}",
        s1.len(),
        s2.len()
    );
}

/// Sockets joining a fanout group while frames arrive: a frame reaches
/// one socket only (a bound socket that has not joined yet receives on
/// its own, so without care a frame then reaches it and the group both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_joined_under_traffic_delivers_each_frame_once() {
    let pair = VethPair::named("fo", "j", 1500);
    let a = Arc::new(Link::from(pair.open(0, |_| {}).unwrap()));
    let fan = |group: u16| {
        move |c: &mut PacketConfig| {
            c.fanout = Some(Fanout {
                group,
                mode: FanoutMode::SourceMac,
            });
            // Small rings: a dozen sockets.
            c.rx_blocks = 4;
            c.tx_frames = 16;
        }
    };
    let first = pair.open(1, fan(0)).unwrap();
    let group = first.fanout_group().unwrap().expect("a fanout group");
    let dst = first.filter().mac;
    let mut members = vec![Arc::new(Link::from(first))];
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let senders: Vec<MacAddr> = (0..8u8)
        .map(|i| MacAddr([0x02, 0, 0, 0, 0x10, i]))
        .collect();
    let sender = {
        let (a, stop, senders) = (a.clone(), stop.clone(), senders.clone());
        tokio::spawn(async move {
            let mut seq = 0u32;
            while !stop.load(Ordering::Acquire) {
                let batch: Vec<_> = senders
                    .iter()
                    .map(|&src| frame(dst, src, ETHERTYPE_AOE, seq, 100))
                    .collect();
                a.send_batch(&batch).await.unwrap();
                seq += 1;
                tokio::task::yield_now().await;
            }
            seq
        })
    };
    let collect = |l: Arc<Link>, stop: Arc<std::sync::atomic::AtomicBool>| {
        tokio::spawn(async move {
            let mut seen: Vec<(MacAddr, u32)> = Vec::new();
            loop {
                let r = tokio::time::timeout(
                    Duration::from_millis(200),
                    l.recv_batch(|f| seen.push((EthernetHeader::parse(f).unwrap().src, seq_of(f)))),
                )
                .await;
                if r.is_err() && stop.load(Ordering::Acquire) {
                    return seen;
                }
            }
        })
    };
    let mut tasks = vec![collect(members[0].clone(), stop.clone())];
    // More sockets join one by one while the frames flow (each join has
    // a short window; several make hitting one likely without the fix).
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let l = Arc::new(Link::from(pair.open(1, fan(group)).unwrap()));
        tasks.push(collect(l.clone(), stop.clone()));
        members.push(l);
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    stop.store(true, Ordering::Release);
    let rounds = sender.await.unwrap();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    assert!(rounds > 0 && !all.is_empty(), "no traffic: {rounds} rounds");
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "{} frames seen twice", n - all.len());
    assert!(n <= rounds as usize * senders.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multicast_only_when_asked() {
    let pair = VethPair::new("m", 1500);
    let a = Link::from(pair.open(0, |_| {}).unwrap());
    let plain = Link::from(pair.open(1, |_| {}).unwrap());
    let multi = Link::from(pair.open(1, |c| c.multicast = true).unwrap());
    let group = MacAddr([0x01, 0x00, 0x5e, 0x00, 0x00, 0x42]);
    let frames = [
        frame(group, a.mac(), ETHERTYPE_AOE, 1, 60),
        frame(plain.mac(), a.mac(), ETHERTYPE_AOE, 2, 60),
    ];
    a.send_batch(&frames).await.unwrap();
    for (link, want) in [(&plain, &frames[1..]), (&multi, &frames[..])] {
        let mut got = Vec::new();
        while got.len() < want.len() {
            tokio::time::timeout(
                Duration::from_secs(5),
                link.recv_batch(|f| got.push(f.to_vec())),
            )
            .await
            .expect("frames did not arrive")
            .unwrap();
        }
        assert_eq!(got, want);
    }
    // Nothing more is pending at the plain socket.
    let more = tokio::time::timeout(Duration::from_millis(50), plain.recv_batch(|_| {})).await;
    assert!(more.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_down_interfaces_are_named() {
    let pair = VethPair::new("e", 1500);
    let err = open_in(&pair.ns[0], PacketConfig::new("nosuch0", ETHERTYPE_AOE)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no network interface named nosuch0 (list them with `ip link`)"
    );
    ip(&["-n", &pair.ns[0], "link", "set", &pair.ifname[0], "down"]);
    let err = pair.open(0, |_| {}).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "network interface {0} is down (bring it up with `ip link set {0} up`)",
            pair.ifname[0]
        )
    );
    // The namespace's loopback is not Ethernet.
    ip(&["-n", &pair.ns[0], "link", "set", "lo", "up"]);
    let err = open_in(&pair.ns[0], PacketConfig::new("lo", ETHERTYPE_AOE)).unwrap_err();
    assert!(
        err.to_string().contains("is not an Ethernet interface"),
        "{err}"
    );
}

/// Runs this test binary again as nobody without capabilities (setpriv),
/// asking it to open a packet link, and checks the one-line message.
#[test]
fn without_cap_net_raw_the_message_says_how_to_grant_it() {
    if std::env::var_os("ETHERSAN_LINK_NOCAP_CHILD").is_some() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    // SAFETY: geteuid has no preconditions.
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("setpriv");
        #[rustfmt::skip]
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-net_raw"]).arg(&exe);
        c
    } else {
        // Not root: the child lacks CAP_NET_RAW already (unless the binary
        // was given it).
        Command::new(&exe)
    };
    let out = cmd
        .args([
            "--exact",
            "nocap_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ETHERSAN_LINK_NOCAP_CHILD", "1")
        .output()
        .expect("running setpriv (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // libtest prints "test nocap_child ... " before the child's line.
    let line = stdout
        .lines()
        .find_map(|l| l.find("ERROR: ").map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("no error line in: {stdout}"));
    assert_eq!(
        line,
        "ERROR: opening a raw socket on lo needs CAP_NET_RAW: run as root, or grant it \
         (setcap cap_net_raw+ep BINARY, or AmbientCapabilities=CAP_NET_RAW in a systemd unit)"
    );
}

/// The child half of the test above (run only by it).
#[tokio::test]
#[ignore = "run by without_cap_net_raw_the_message_says_how_to_grant_it"]
async fn nocap_child() {
    let err = PacketLink::open(PacketConfig::new("lo", ETHERTYPE_AOE)).unwrap_err();
    println!("ERROR: {err}");
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Throughput one way (A sends, B receives) and ping-pong round trips.
/// `cargo test -p ethersan-link --release --test packet -- --ignored bench --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run explicitly"]
async fn bench() {
    #[rustfmt::skip]
    let runs = [("b", 1500usize, RingVersion::V3), ("c", 9000, RingVersion::V3),
                ("d", 1500, RingVersion::V2), ("e", 9000, RingVersion::V2)];
    for (tag, mtu, ring) in runs {
        let pair = VethPair::new(tag, mtu);
        let a = Arc::new(Link::from(pair.open(0, |c| c.ring = ring).unwrap()));
        let b = Arc::new(Link::from(pair.open(1, |c| c.ring = ring).unwrap()));
        let len = mtu + HEADER_LEN;
        let batch: Vec<Vec<u8>> = (0..64)
            .map(|i| frame(b.mac(), a.mac(), ETHERTYPE_AOE, i, len))
            .collect();
        let received = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let rx = {
            let (b, received, stop) = (b.clone(), received.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(r) =
                        tokio::time::timeout(Duration::from_millis(20), b.recv_batch(|_| {})).await
                    {
                        received.fetch_add(r.unwrap(), Ordering::Relaxed);
                    }
                }
            })
        };
        let secs = 2.0;
        let (t0, c0) = (Instant::now(), cpu_time());
        let mut sent = 0usize;
        while t0.elapsed().as_secs_f64() < secs {
            // Stay within the 8 MiB receive ring.
            if sent > received.load(Ordering::Relaxed) + (6 << 20) / (len + 64) {
                tokio::task::yield_now().await;
                continue;
            }
            sent += a.send_batch(&batch).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (dt, dc) = (t0.elapsed(), cpu_time() - c0);
        stop.store(true, Ordering::Relaxed);
        rx.await.unwrap();
        let got = received.load(Ordering::Relaxed);
        println!(
            "{ring:?} MTU {mtu}: sent {sent}, received {got} frames in {dt:.2?}: {:.0} frames/s, {:.2} Gbit/s, {:.2} µs CPU per frame (2 cores)",
            got as f64 / dt.as_secs_f64(),
            (got * len * 8) as f64 / dt.as_secs_f64() / 1e9,
            dc.as_secs_f64() * 1e6 / got.max(1) as f64
        );
        // Ping-pong: B echoes, A waits for each answer.
        let echo = {
            let b = b.clone();
            tokio::spawn(async move {
                loop {
                    let mut out = Vec::new();
                    if b.recv_batch(|f| out.push(f.to_vec())).await.is_err() {
                        return;
                    }
                    for f in &mut out {
                        let (d, s) = (f[..6].to_vec(), f[6..12].to_vec());
                        f[..6].copy_from_slice(&s);
                        f[6..12].copy_from_slice(&d);
                    }
                    b.send_batch(&out).await.unwrap();
                }
            })
        };
        let ping = frame(b.mac(), a.mac(), ETHERTYPE_AOE, 1, 60);
        let rounds = 500;
        let t0 = Instant::now();
        for _ in 0..rounds {
            a.send(&ping).await.unwrap();
            tokio::time::timeout(Duration::from_secs(1), a.recv_batch(|_| {}))
                .await
                .unwrap()
                .unwrap();
        }
        println!(
            "{ring:?} MTU {mtu}: ping-pong round trip {:.1} µs on average ({rounds} rounds)",
            t0.elapsed().as_secs_f64() * 1e6 / f64::from(rounds)
        );
        echo.abort();
    }
}

/// Frames taken where they landed: `ready` waits without taking,
/// `try_recv_batch` never waits and hands each frame over writable in its
/// receive slot. Every frame arrives intact even though each one before
/// it was overwritten in place (frames of a block do not overlap), and
/// once the ring is drained `ready` waits again.
async fn taken_in_rx_slots(tag: &str, mtu: usize, ring: RingVersion) {
    let pair = VethPair::named("lnk", tag, mtu);
    let open = |i| {
        pair.open(i, |c| c.ring = ring)
            .map(|l| Arc::new(Link::from(l)))
    };
    let (a, b) = (open(0).unwrap(), open(1).unwrap());
    let (dst, src) = (b.mac(), a.mac());
    assert_eq!(
        b.try_recv_batch(|_| panic!("no frame was sent")).unwrap(),
        0
    );
    let idle = tokio::time::timeout(Duration::from_millis(200), b.ready()).await;
    assert!(idle.is_err(), "ready() returned with nothing received");
    let max = a.max_frame_len();
    let mut seq = 0u32;
    for round in 0..30u32 {
        let batch: Vec<Vec<u8>> = (0..64)
            .map(|i| {
                frame(
                    dst,
                    src,
                    ETHERTYPE_AOE,
                    seq + i,
                    60 + ((seq + i) as usize * 977) % (max - 60),
                )
            })
            .collect();
        assert_eq!(a.send_batch(&batch).await.unwrap(), batch.len());
        let mut got = 0;
        while got < batch.len() {
            tokio::time::timeout(Duration::from_secs(10), b.ready())
                .await
                .expect("frames arrive")
                .unwrap();
            b.try_recv_batch(|f| {
                assert!(got < batch.len(), "round {round}: more frames than sent");
                assert!(
                    f == &batch[got][..],
                    "round {round}: frame {got} arrived changed"
                );
                // Written over where it lies: the next frames must not see it.
                f.fill(0xa5);
                got += 1;
            })
            .unwrap();
        }
        seq += batch.len() as u32;
    }
    let idle = tokio::time::timeout(Duration::from_millis(200), b.ready()).await;
    assert!(idle.is_err(), "ready() returned after the ring was drained");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_taken_in_their_rx_slots_v3_mtu_9000() {
    taken_in_rx_slots("r3", 9000, RingVersion::V3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_taken_in_their_rx_slots_v2_mtu_1500() {
    taken_in_rx_slots("r2", 1500, RingVersion::V2).await;
}
