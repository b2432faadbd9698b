//! A throw-away single-node Ceph cluster for the RBD tests, started by
//! `scripts/ceph-cluster` in a temporary directory and stopped (daemons
//! killed, directory removed) when the [`Ceph`] is dropped. Stop every
//! librbd client (servers, `rbd` commands) before dropping it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/ceph-cluster")
}

/// A running cluster: one monitor, one OSD, the pool `rbd`.
pub struct Ceph {
    dir: tempfile::TempDir,
    conf: PathBuf,
}

impl Ceph {
    /// Start a cluster (installs the Ceph packages when missing); panics
    /// with the script's output if it does not become usable.
    pub fn start() -> Ceph {
        let dir = tempfile::Builder::new()
            .prefix("ethersan-ceph-")
            .tempdir()
            .expect("temporary directory");
        let out = Command::new(script())
            .arg("start")
            .arg(dir.path())
            .output()
            .expect("run scripts/ceph-cluster");
        if !out.status.success() {
            let logs = std::fs::read_to_string(dir.path().join("osd.0.out")).unwrap_or_default();
            let _ = Command::new(script()).arg("stop").arg(dir.path()).output();
            panic!(
                "scripts/ceph-cluster start failed: {}{}\nosd.0.out: {logs}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let conf = dir.path().join("ceph.conf");
        Ceph { dir, conf }
    }

    /// The cluster's configuration file (its keyring is the admin's).
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The configuration file as a string argument.
    pub fn conf_str(&self) -> String {
        self.conf.to_str().expect("UTF-8 path").to_string()
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Run `rbd -c CONF ARGS` within 60 s.
    pub fn rbd(&self, args: &[&str]) -> Output {
        let mut all = vec!["-c", self.conf.to_str().expect("UTF-8 path")];
        all.extend_from_slice(args);
        super::run("rbd", &all, Duration::from_secs(60))
    }

    /// Run `rbd -c CONF ARGS`, insisting that it succeeds; its stdout.
    pub fn rbd_ok(&self, args: &[&str]) -> String {
        let out = self.rbd(args);
        assert!(
            out.status.success(),
            "rbd {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn script(&self, what: &str) {
        let out = Command::new(script())
            .arg(what)
            .arg(self.dir.path())
            .output()
            .expect("run scripts/ceph-cluster");
        assert!(
            out.status.success(),
            "scripts/ceph-cluster {what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// SIGKILL the OSD.
    pub fn kill_osd(&self) {
        self.script("kill-osd");
    }

    /// Stop the OSD cleanly.
    pub fn stop_osd(&self) {
        self.script("stop-osd");
    }

    /// Start the OSD again and wait until it is up.
    pub fn start_osd(&self) {
        self.script("start-osd");
    }
}

impl Drop for Ceph {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}
