//! `ethersan attach URL DIR`: a LUN as one regular file in a FUSE mount at
//! DIR, for `losetup`, `qemu-img`, `dd` or any program that takes a file;
//! `ethersan attach --block URL`: a LUN as a kernel block device
//! (/dev/nbdN), and `ethersan detach /dev/nbdN`.
//!
//! - [`file`]: byte offsets to whole-block LUN commands (read-modify-write
//!   at the edges, serialized per block), no FUSE;
//! - [`fs`]: the FUSE file system (one directory, one file) over it;
//! - [`block`]: the NBD block device;
//! - here: the command: options, mount, signals, clean detach.
//!
//! The LUN comes from [`ethersan_client::open`], so every URL scheme the
//! client knows works here too.

mod block;
mod file;
mod fs;
mod served;

pub(crate) use block::cmd_detach;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use tokio::signal::unix::{signal, SignalKind};

use ethersan_client::{BlockTarget, ConnectArgs, OpenOptions};
use file::LunFile;
use fs::{LunFs, Owner};

/// Arguments of `ethersan attach`.
#[derive(Args, Debug)]
pub(crate) struct AttachArgs {
    /// The LUN: iscsi://[USER%SECRET@]host[:port]/IQN/LUN, eth://IFACE/IQN/LUN,
    /// udp://HOST[:PORT]/IQN/LUN, aoe://IFACE/SHELF.SLOT,
    /// aoe+unix://SHELF.SLOT?local=PATH&peer=PATH
    /// or nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN[/NSID].
    url: String,
    /// An existing directory to mount on; the LUN shows in it as one file
    /// (lunN for iSCSI LUN N, eSHELF.SLOT for an AoE device). Not with
    /// --block.
    #[arg(required_unless_present = "block")]
    dir: Option<PathBuf>,
    /// A kernel block device (/dev/nbdN, through the kernel's NBD driver)
    /// instead of a FUSE file: printed once connected; served until
    /// `ethersan detach /dev/nbdN`, SIGTERM or SIGINT.
    #[arg(long, conflicts_with_all = ["dir", "name", "mode", "allow_root"])]
    block: bool,
    /// With --block: sessions to the LUN, each one kernel queue (where the
    /// transport has sessions: iSCSI and the native transport).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "block")]
    connections: usize,
    /// With --block: how long a lost target (restarted, path down) is
    /// waited for, new logins tried all the while, before I/O errors are
    /// returned; the requests in flight go on once it is back (like
    /// open-iscsi's replacement_timeout). --timeout stays each command's
    /// and login's own limit.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "120s",
        value_parser = ethersan_client::parse_duration,
        requires = "block"
    )]
    reconnect_timeout: std::time::Duration,
    /// With --block: use /dev/nbdN (else the kernel picks a free one).
    #[arg(long, value_name = "N", requires = "block")]
    index: Option<u32>,
    /// With --block: print the device as JSON (device, size, block size,
    /// connections, flags).
    #[arg(long, requires = "block")]
    json: bool,
    /// Read-only: the FUSE file's mode 0400 unless --mode says otherwise;
    /// the block device refuses writes.
    #[arg(long)]
    read_only: bool,
    /// The file's name instead of lunN / eSHELF.SLOT.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// The file's permission bits, in octal (default 0600, 0400 with --read-only).
    #[arg(long, value_name = "OCTAL", value_parser = parse_mode)]
    mode: Option<u16>,
    /// Let root use the file too when another user attaches it (FUSE's
    /// allow_other, limited to root; needs user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    allow_root: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// `--mode`: permission bits in octal.
fn parse_mode(s: &str) -> Result<u16, String> {
    let m = u16::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("{s:?} is not an octal mode such as 0600"))?;
    if m > 0o777 {
        return Err(format!("{s} has more than permission bits (0777 at most)"));
    }
    Ok(m)
}

/// A file name given with `--name`: one path component.
fn check_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        bail!("--name {name:?}: give a file name without '/' (not . or ..)");
    }
    if name.len() > 255 {
        bail!("--name: at most 255 bytes");
    }
    Ok(())
}

/// DIR must be an existing directory.
fn check_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!("{} is not a directory", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "{} does not exist: make the directory first (mkdir {})",
            dir.display(),
            dir.display()
        ),
        Err(e) => bail!("{}: {e}", dir.display()),
    }
}

/// The calling user and group, who own the file.
fn caller() -> (u32, u32) {
    // SAFETY: getuid(2) and getgid(2) always succeed and touch no memory.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// Unmount `dir` now, or lazily (detached from the tree, served until the
/// last user of the file closes it) when it is busy.
fn unmount(dir: &Path, mut unmounter: fuser::SessionUnmounter) -> anyhow::Result<bool> {
    match unmounter.unmount() {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            let c = CString::new(dir.as_os_str().as_bytes()).context("mount point")?;
            // SAFETY: `c` is a NUL-terminated string that outlives the call;
            // umount2(2) only reads it.
            let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            if r != 0 {
                bail!(
                    "unmount {}: {}",
                    dir.display(),
                    std::io::Error::last_os_error()
                );
            }
            Ok(false)
        }
        Err(e) => bail!("unmount {}: {e}", dir.display()),
    }
}

/// `ethersan attach`.
pub(crate) async fn cmd_attach(a: AttachArgs) -> anyhow::Result<()> {
    // Mistakes in the arguments before any login.
    if let Some(dir) = &a.dir {
        check_dir(dir)?;
    }
    if let Some(n) = &a.name {
        check_name(n)?;
    }
    if !ethersan_client::is_url(&a.url) {
        // Only the scheme: whatever follows may hold a secret.
        let shown = match a.url.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://…"),
            None => format!("{:?}", a.url),
        };
        bail!(
            "{shown} is not a LUN URL; attach takes {}",
            ethersan_client::url_forms()
        );
    }
    let Some(dir) = &a.dir else {
        return block::cmd_attach_block(block::BlockRequest {
            url: &a.url,
            connect: &a.connect,
            connections: a.connections,
            reconnect: a.reconnect_timeout,
            index: a.index,
            read_only: a.read_only,
            json: a.json,
        })
        .await;
    };
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse is missing: load the FUSE module (modprobe fuse)");
    }
    let dir = std::fs::canonicalize(dir).with_context(|| dir.display().to_string())?;
    let opts = OpenOptions {
        program: "ethersan attach",
        retry: true,
        reconnect: None,
    };
    let lun = ethersan_client::open(&a.url, &a.connect, &opts).await?;
    let file = Arc::new(LunFile::new(lun));
    let result = serve(&a, &dir, file.clone()).await;
    // Whatever happened: what was acknowledged is made durable, the
    // session ended.
    let flushed = file.flush().await;
    file.dev().close().await;
    result?;
    flushed.with_context(|| format!("{}: final cache flush", file.dev().name()))?;
    note!(
        "ethersan attach: detached {} ({} flushed{})",
        dir.display(),
        file.dev().name(),
        if file.dev().capabilities().logout {
            ", logged out"
        } else {
            ""
        }
    );
    Ok(())
}

/// Mount, serve until unmounted or signalled, unmount.
async fn serve(
    a: &AttachArgs,
    dir: &Path,
    file: Arc<LunFile<Box<dyn BlockTarget>>>,
) -> anyhow::Result<()> {
    let name = a.name.clone().unwrap_or_else(|| file.dev().file_name());
    let what = file.dev().name();
    let (uid, gid) = caller();
    let default_perm = if a.read_only { 0o400 } else { 0o600 };
    let owner = Owner {
        perm: a.mode.unwrap_or(default_perm),
        uid,
        gid,
    };
    let fs = LunFs::new(
        file.clone(),
        tokio::runtime::Handle::current(),
        &name,
        &what,
        owner,
    );
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("ethersan".into()),
        fuser::MountOption::Subtype("ethersan".into()),
        // The kernel checks the file's mode against the caller.
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
        fuser::MountOption::NoExec,
        fuser::MountOption::NoAtime,
        if a.read_only {
            fuser::MountOption::RO
        } else {
            fuser::MountOption::RW
        },
    ];
    if a.allow_root {
        config.acl = fuser::SessionACL::RootAndOwner;
    }
    let mount_dir = dir.to_path_buf();
    let mut session =
        tokio::task::spawn_blocking(move || fuser::Session::new(fs, &mount_dir, &config))
            .await?
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot mount a FUSE file system on {}: {e} (as another user than root it needs fusermount3, from the fuse3 package)",
                    dir.display()
                )
            })?;
    let unmounter = session.unmount_callable();
    // The session's loop on a thread of its own: it ends when DIR is
    // unmounted. (Not the runtime's blocking pool, which the runtime
    // would wait for when it shuts down.)
    let (ended_tx, mut ended) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("fuse".into())
        .spawn(move || {
            let _ = ended_tx.send(session.run());
        })
        .context("start the FUSE thread")?;
    let path = dir.join(&name);
    out!(
        "ethersan attach: {what} ({} bytes, {}-byte blocks) is {}{}; as a block device: losetup --find --show --direct-io=on {}",
        file.size(),
        file.dev().block_size(),
        path.display(),
        if a.read_only { " (read-only)" } else { "" },
        path.display()
    );
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let signalled = tokio::select! {
        r = &mut ended => Some(r),
        _ = term.recv() => None,
        _ = int.recv() => None,
    };
    let run = match signalled {
        Some(r) => r,
        None => {
            note!(
                "ethersan attach: stopping: flushing {what} and unmounting {}",
                dir.display()
            );
            if let Err(e) = file.flush().await {
                tracing::error!("{what}: cache flush failed: {e}");
            }
            let d = dir.to_path_buf();
            let now = tokio::task::spawn_blocking(move || unmount(&d, unmounter)).await??;
            if !now {
                note!(
                    "ethersan attach: {} is still open (a loop device? losetup -d it); unmounted lazily, serving it until it is closed (a second signal stops at once)",
                    path.display()
                );
            }
            let r = tokio::select! {
                r = &mut ended => r,
                _ = term.recv() => bail!("stopped by a second signal while {} was open; its user now gets I/O errors", path.display()),
                _ = int.recv() => bail!("stopped by a second signal while {} was open; its user now gets I/O errors", path.display()),
            };
            // Once the file is closed after our own (lazy) unmount, the
            // kernel may end the session with ECONNABORTED rather than
            // ENODEV (the connection is torn down with the superblock):
            // that is the end asked for, not a failure.
            match r {
                Ok(Err(e)) if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(Ok(())),
                other => other,
            }
        }
    };
    run.context("the FUSE thread ended without a word")?
        .with_context(|| format!("FUSE session on {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_permission_bits() {
        assert_eq!(parse_mode("0600"), Ok(0o600));
        assert_eq!(parse_mode("640"), Ok(0o640));
        assert_eq!(parse_mode("0o444"), Ok(0o444));
        assert!(parse_mode("0800").is_err());
        assert!(parse_mode("4755").is_err());
        assert!(parse_mode("rw").is_err());
    }

    #[test]
    fn names_are_one_path_component() {
        assert!(check_name("disk.img").is_ok());
        for bad in ["", ".", "..", "a/b", "/x"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name(&"x".repeat(256)).is_err());
    }
}
