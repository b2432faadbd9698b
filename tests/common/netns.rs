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
    /// With [`Veth::with_attacker`]: a third namespace and its interface,
    /// on a hub with the client.
    pub attacker: Option<(String, String)>,
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
            attacker: None,
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

    /// Three namespaces: the target, the client, and an attacker that sees
    /// every frame between them and can send its own. The client's
    /// interface (`ifname[1]`) is a bridge that floods every frame (no MAC
    /// learning, a hub) to the target's veth pair and the attacker's.
    pub fn with_attacker(tag: &str, mtu: usize) -> Veth {
        let pid = std::process::id();
        let (ns_t, ns_c, ns_a) = (
            format!("eat-{pid}-{tag}-t"),
            format!("eat-{pid}-{tag}-c"),
            format!("eat-{pid}-{tag}-a"),
        );
        let n = pid % 10_000;
        let (if_t, if_ct, br, if_a, if_ca) = (
            format!("at{n}{tag}"),
            format!("ct{n}{tag}"),
            format!("br{n}{tag}"),
            format!("aa{n}{tag}"),
            format!("ca{n}{tag}"),
        );
        let v = Veth {
            ns: [ns_t.clone(), ns_c.clone()],
            ifname: [if_t.clone(), br.clone()],
            attacker: Some((ns_a.clone(), if_a.clone())),
        };
        for ns in [&ns_t, &ns_c, &ns_a] {
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        let mtu = mtu.to_string();
        #[rustfmt::skip]
        ip(&["link", "add", &if_t, "netns", &ns_t, "mtu", &mtu, "type", "veth",
             "peer", "name", &if_ct, "netns", &ns_c, "mtu", &mtu]);
        #[rustfmt::skip]
        ip(&["link", "add", &if_a, "netns", &ns_a, "mtu", &mtu, "type", "veth",
             "peer", "name", &if_ca, "netns", &ns_c, "mtu", &mtu]);
        #[rustfmt::skip]
        ip(&["-n", &ns_c, "link", "add", &br, "mtu", &mtu, "type", "bridge",
             "ageing_time", "0", "stp_state", "0"]);
        for port in [&if_ct, &if_ca] {
            ip(&["-n", &ns_c, "link", "set", port, "master", &br]);
            ip(&["-n", &ns_c, "link", "set", port, "up"]);
        }
        ip(&["-n", &ns_c, "link", "set", &br, "up"]);
        ip(&["-n", &ns_t, "link", "set", &if_t, "up"]);
        ip(&["-n", &ns_a, "link", "set", &if_a, "up"]);
        ip(&["-n", &ns_t, "addr", "add", "10.77.0.1/24", "dev", &if_t]);
        ip(&["-n", &ns_c, "addr", "add", "10.77.0.2/24", "dev", &br]);
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
        if let Some((ns, _)) = &self.attacker {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", ns])
                .status();
        }
        for ns in &self.ns {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", ns])
                .status();
        }
    }
}
