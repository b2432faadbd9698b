//! Test hosts in network namespaces joined by a veth pair.

use std::process::Output;
use std::time::Duration;

use super::{run, Server};

/// Two namespaces joined by a veth pair, deleted (with the pair) on drop.
pub struct Veth {
    /// The namespaces: [target, client].
    pub ns: [String; 2],
    /// The interfaces: [target's, client's].
    pub ifname: [String; 2],
}

pub fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("iproute2's ip (scripts/test installs it)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Veth {
    pub fn new(tag: &str, mtu: usize) -> Veth {
        let pid = std::process::id();
        let v = Veth {
            ns: [format!("eat-{pid}-{tag}-t"), format!("eat-{pid}-{tag}-c")],
            ifname: [
                format!("at{}{tag}", pid % 10_000),
                format!("ac{}{tag}", pid % 10_000),
            ],
        };
        for ns in &v.ns {
            ip(&["netns", "add", ns]);
        }
        let mtu = mtu.to_string();
        #[rustfmt::skip]
        ip(&["link", "add", &v.ifname[0], "netns", &v.ns[0], "mtu", &mtu, "type", "veth",
             "peer", "name", &v.ifname[1], "netns", &v.ns[1], "mtu", &mtu]);
        for i in 0..2 {
            ip(&["-n", &v.ns[i], "link", "set", "lo", "up"]);
            ip(&["-n", &v.ns[i], "link", "set", &v.ifname[i], "up"]);
            // 10.77.0.1 the target, 10.77.0.2 the client (for UDP).
            let addr = format!("10.77.0.{}/24", i + 1);
            ip(&["-n", &v.ns[i], "addr", "add", &addr, "dev", &v.ifname[i]]);
        }
        v
    }

    /// The target's IPv4 address on the pair.
    pub const TARGET_IP: &'static str = "10.77.0.1";

    /// `program ARGS` inside the client's namespace, bounded by `limit`.
    pub fn in_client(&self, args: &[&str], limit: Duration) -> Output {
        let mut all = vec!["netns", "exec", &self.ns[1], env!("CARGO_BIN_EXE_ethersan")];
        all.extend_from_slice(args);
        run("ip", &all, limit)
    }

    /// [`in_client`](Self::in_client) with environment variables.
    pub fn in_client_env(&self, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
        let mut all: Vec<String> = vec![
            "netns".into(),
            "exec".into(),
            self.ns[1].clone(),
            "env".into(),
        ];
        all.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        all.push(env!("CARGO_BIN_EXE_ethersan").into());
        all.extend(args.iter().map(|a| a.to_string()));
        let refs: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
        run("ip", &refs, limit)
    }

    /// The client's packet link, opened inside its namespace by a thread
    /// that enters it (the socket stays there).
    pub fn client_link(&self, ethertype: u16) -> ethersan_link::packet::PacketLink {
        use std::os::fd::AsRawFd;
        let handle = tokio::runtime::Handle::current();
        let path = format!("/run/netns/{}", self.ns[1]);
        let cfg = ethersan_link::packet::PacketConfig {
            ring: ethersan_link::packet::RingVersion::V2,
            ..ethersan_link::packet::PacketConfig::new(&self.ifname[1], ethertype)
        };
        std::thread::scope(|s| {
            s.spawn(move || {
                let f = std::fs::File::open(&path).unwrap();
                // SAFETY: setns on this short-lived thread only, with a
                // namespace fd we hold open.
                let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns {path}");
                let _rt = handle.enter();
                ethersan_link::packet::PacketLink::open(cfg).unwrap()
            })
            .join()
            .unwrap()
        })
    }

    /// `ethersan serve ARGS` inside the target's namespace, once it listens.
    pub fn serve(&self, args: &[String]) -> Server {
        let mut all = vec![
            "netns".to_string(),
            "exec".into(),
            self.ns[0].clone(),
            env!("CARGO_BIN_EXE_ethersan").into(),
        ];
        all.extend(args.iter().cloned());
        Server::start_program("ip", &all)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", ns])
                .status();
        }
    }
}
