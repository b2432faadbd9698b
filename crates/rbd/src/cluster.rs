//! A RADOS client connection (`rados_t`) and I/O contexts on a pool
//! (`rados_ioctx_t`), each released when its last user is dropped: an
//! [`Ioctx`] keeps its [`Cluster`] alive, so nothing is shut down under a
//! user.

use std::ffi::{c_char, CStr, CString};
use std::io;
use std::path::Path;
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use crate::ffi::{IoctxT, Lib, RadosT};
use crate::{RbdError, RbdSpec};

/// The `io::Error` for a negative errno returned by librados or librbd.
pub(crate) fn errno(r: i64) -> io::Error {
    let code = i32::try_from(r.unsigned_abs()).unwrap_or(libc::EIO);
    io::Error::from_raw_os_error(code)
}

/// A C string from text that must not contain NUL.
pub(crate) fn cstring(what: &str, s: &str) -> Result<CString, RbdError> {
    CString::new(s).map_err(|_| RbdError::Invalid(format!("{what} {s:?} contains a NUL byte")))
}

/// One connected RADOS client; shut down when dropped.
pub(crate) struct Cluster {
    pub(crate) lib: Arc<Lib>,
    handle: RadosT,
    /// Where the cluster was looked for, for messages: the conf file and
    /// its mon_host.
    pub(crate) described: String,
}

// SAFETY: a `rados_t` may be used from any thread and by several threads
// at once (librados is thread-safe for everything but changing its
// configuration, which happens only before `Cluster::connect` returns).
unsafe impl Send for Cluster {}
// SAFETY: see `Send`.
unsafe impl Sync for Cluster {}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.described)
    }
}

impl Cluster {
    /// Connect as the spec says (conf, id, keyring), with every operation
    /// bounded by the spec's timeout and the librbd cache off.
    pub(crate) fn connect(lib: Arc<Lib>, spec: &RbdSpec) -> Result<Arc<Cluster>, RbdError> {
        let user = format!("client.{}", spec.id.as_deref().unwrap_or("admin"));
        let c_user = cstring("cephx user", &user)?;
        let mut handle: RadosT = ptr::null_mut();
        // SAFETY: `handle` is a valid out pointer; the cluster name and user
        // are NUL-terminated strings that outlive the call.
        let r = unsafe { (lib.rados_create2)(&mut handle, c"ceph".as_ptr(), c_user.as_ptr(), 0) };
        if r < 0 {
            return Err(RbdError::Connect {
                cluster: "(librados could not create a client)".into(),
                cause: errno(r.into()),
            });
        }
        let mut cluster = Cluster {
            lib,
            handle,
            described: String::new(),
        };
        let conf_name = match &spec.conf {
            Some(p) => p.display().to_string(),
            None => "the default ceph.conf".to_string(),
        };
        let c_conf = match &spec.conf {
            Some(p) => Some(cstring("conf path", &path_str(p)?)?),
            None => None,
        };
        // SAFETY: `handle` is a live, unconnected client; the path is a
        // NUL-terminated string or NULL (librados then searches its default
        // places).
        let r = unsafe {
            (cluster.lib.rados_conf_read_file)(
                cluster.handle,
                c_conf.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            )
        };
        if r < 0 && spec.conf.is_some() {
            return Err(RbdError::Conf {
                path: conf_name,
                cause: errno(r.into()),
            });
        }
        if let Some(k) = &spec.keyring {
            cluster.set("keyring", &path_str(k)?)?;
        }
        let secs = spec
            .timeout
            .max(Duration::from_secs(1))
            .as_secs()
            .to_string();
        for opt in [
            "rados_osd_op_timeout",
            "rados_mon_op_timeout",
            "client_mount_timeout",
        ] {
            cluster.set(opt, &secs)?;
        }
        // Every acknowledged write is in the cluster: no client cache.
        cluster.set("rbd_cache", "false")?;
        // A discard of part of an object zeroes that part instead of
        // skipping it, so an unmapped range always reads as zeros.
        cluster.set("rbd_skip_partial_discard", "false")?;
        let mon_host = cluster.get("mon_host").unwrap_or_default();
        cluster.described = if mon_host.is_empty() {
            format!("{conf_name} (no mon_host set)")
        } else {
            format!("{conf_name} (mon_host {mon_host})")
        };
        // SAFETY: `handle` is a live, configured, unconnected client.
        let r = unsafe { (cluster.lib.rados_connect)(cluster.handle) };
        if r < 0 {
            return Err(RbdError::Connect {
                cluster: cluster.described.clone(),
                cause: errno(r.into()),
            });
        }
        Ok(Arc::new(cluster))
    }

    fn set(&self, option: &str, value: &str) -> Result<(), RbdError> {
        let o = cstring("option", option)?;
        let v = cstring("option value", value)?;
        // SAFETY: `handle` is a live client; both strings are NUL-terminated
        // and outlive the call (librados copies them).
        let r = unsafe { (self.lib.rados_conf_set)(self.handle, o.as_ptr(), v.as_ptr()) };
        if r < 0 {
            return Err(RbdError::Invalid(format!(
                "librados refused {option}={value}: {}",
                errno(r.into())
            )));
        }
        Ok(())
    }

    fn get(&self, option: &str) -> Option<String> {
        let o = cstring("option", option).ok()?;
        let mut buf = vec![0u8; 4096];
        // SAFETY: `buf` has `buf.len()` writable bytes; librados writes a
        // NUL-terminated value of at most that many bytes.
        let r = unsafe {
            (self.lib.rados_conf_get)(
                self.handle,
                o.as_ptr(),
                buf.as_mut_ptr().cast::<c_char>(),
                buf.len(),
            )
        };
        if r < 0 {
            return None;
        }
        CStr::from_bytes_until_nul(&buf)
            .ok()
            .map(|s| s.to_string_lossy().into_owned())
    }

    /// This client's id in the cluster (the `notifier_id` of its notices).
    pub(crate) fn instance_id(&self) -> u64 {
        // SAFETY: `handle` is a live, connected client.
        unsafe { (self.lib.rados_get_instance_id)(self.handle) }
    }

    /// Wait until no watch callback of this client is running or queued.
    pub(crate) fn watch_flush(&self) {
        // SAFETY: `handle` is a live, connected client.
        unsafe { (self.lib.rados_watch_flush)(self.handle) };
    }

    pub(crate) fn raw(&self) -> RadosT {
        self.handle
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the last user is gone (every Ioctx holds an Arc to this
        // Cluster); the handle is not used again. With the timeouts set in
        // `connect`, shutting down returns also when the cluster is gone.
        unsafe { (self.lib.rados_shutdown)(self.handle) };
    }
}

fn path_str(p: &Path) -> Result<String, RbdError> {
    p.to_str()
        .map(str::to_string)
        .ok_or_else(|| RbdError::Invalid(format!("path {} is not UTF-8", p.display())))
}

/// An I/O context on one pool; destroyed when dropped.
pub(crate) struct Ioctx {
    pub(crate) cluster: Arc<Cluster>,
    handle: IoctxT,
}

// SAFETY: an ioctx may be used by several threads at once for I/O; the
// one per-ioctx state that is not thread-safe in that sense, the "last
// version", is read only under `RadosShared`'s mutex on its own ioctx.
unsafe impl Send for Ioctx {}
// SAFETY: see `Send`.
unsafe impl Sync for Ioctx {}

impl Ioctx {
    /// An I/O context on `pool`.
    pub(crate) fn create(cluster: &Arc<Cluster>, pool: &str) -> Result<Ioctx, RbdError> {
        let c_pool = cstring("pool", pool)?;
        let mut handle: IoctxT = ptr::null_mut();
        // SAFETY: the cluster is connected; `handle` is a valid out pointer.
        let r = unsafe {
            (cluster.lib.rados_ioctx_create)(cluster.raw(), c_pool.as_ptr(), &mut handle)
        };
        if r < 0 {
            return Err(RbdError::Pool {
                pool: pool.to_string(),
                cause: errno(r.into()),
            });
        }
        Ok(Ioctx {
            cluster: cluster.clone(),
            handle,
        })
    }

    pub(crate) fn raw(&self) -> IoctxT {
        self.handle
    }

    pub(crate) fn lib(&self) -> &Lib {
        &self.cluster.lib
    }
}

impl Drop for Ioctx {
    fn drop(&mut self) {
        // SAFETY: nothing uses the ioctx any more (images and watches on it
        // are closed before their owners drop it).
        unsafe { (self.cluster.lib.rados_ioctx_destroy)(self.handle) };
    }
}
