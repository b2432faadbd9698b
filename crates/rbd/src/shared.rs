//! [`RadosShared`]: the [`SharedState`] of an RBD image, kept in RADOS
//! objects `ethersan.<image id>.<name>` of the image's pool.
//!
//! - `load`: one read op (stat + read) on a dedicated I/O context, under a
//!   mutex so that `rados_get_last_version` answers for that op;
//! - `store`: one write op, `create(EXCLUSIVE)` when the expected version
//!   is 0, `assert_version(expected)` otherwise, then `write_full`; a lost
//!   race (EEXIST, ERANGE, EOVERFLOW, ENOENT) is `Ok(None)`;
//! - `subscribe`: `rados_watch2` on the object (created empty when
//!   missing; an existing one is left as it is, version included); the callback runs the handler unless the
//!   notice came from this client, then acknowledges it; a watch error
//!   (an OSD restarted, the session was reset) re-establishes the watch
//!   from a thread of its own;
//! - `publish`: `rados_notify2`, which returns once every watcher
//!   acknowledged (each after running its handler) or after 10 s.
//!
//! Handlers run on a librados thread and may call [`SharedState::load`]
//! and `store` (tested: no deadlock); they should hold the state through a
//! `Weak`, as dropping its last handle inside a handler would wait for that
//! same handler to finish.
//!
//! An object that `subscribe` created empty loads as empty data with a
//! non-zero version (store against that version), so version 0 means
//! "never written nor watched".

use std::ffi::{c_char, c_int, c_void, CString};
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ethersan_backend::shared::ChangeHandler;
use ethersan_backend::{BackendError, SharedState, Versioned};

use crate::cluster::{errno, Cluster, Ioctx};
use crate::ffi::{self, Lib};
use crate::image::Image;

/// How long `publish` waits for the other subscribers.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// The image metadata key that mirrors the `identity` blob.
pub const IDENTITY_METADATA_KEY: &str = "ethersan.identity";

/// The largest shared-state object read: far above any reservation or
/// group state, far below what would hurt the gateway to allocate.
const MAX_BLOB_BYTES: u64 = 16 << 20;

/// Shared state of one RBD image in RADOS objects of its pool (see the
/// module documentation).
pub struct RadosShared {
    /// load/store: its last version belongs to the op under the lock.
    ops: Mutex<Ioctx>,
    /// Watches and notices.
    notices: Arc<Ioctx>,
    cluster: Arc<Cluster>,
    prefix: String,
    image: Arc<Image>,
    name: String,
    watches: Mutex<Vec<Arc<Watch>>>,
}

impl std::fmt::Debug for RadosShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// One subscription; its address is the watch callbacks' argument, kept
/// alive by `RadosShared::watches` until the watch is removed and flushed.
struct Watch {
    notices: Arc<Ioctx>,
    oid: CString,
    handler: ChangeHandler,
    own_id: u64,
    /// The current watch cookie (`None` while re-establishing).
    cookie: Mutex<Option<u64>>,
    closed: AtomicBool,
}

fn shared_error(write: bool, what: &str, oid: &str, cause: io::Error) -> BackendError {
    let cause = io::Error::new(
        cause.kind(),
        format!("{what} rados object {oid} of the shared state: {cause}"),
    );
    if write {
        BackendError::Write { offset: 0, cause }
    } else {
        BackendError::Read { offset: 0, cause }
    }
}

impl RadosShared {
    pub(crate) fn new(
        cluster: &Arc<Cluster>,
        pool: &str,
        image_id: &str,
        image: Arc<Image>,
        name: &str,
    ) -> Result<RadosShared, crate::RbdError> {
        Ok(RadosShared {
            ops: Mutex::new(Ioctx::create(cluster, pool)?),
            notices: Arc::new(Ioctx::create(cluster, pool)?),
            cluster: cluster.clone(),
            prefix: format!("ethersan.{image_id}."),
            image,
            name: name.to_string(),
            watches: Mutex::new(Vec::new()),
        })
    }

    fn oid(&self, name: &str) -> Result<(String, CString), BackendError> {
        let oid = format!("{}{name}", self.prefix);
        let c = CString::new(oid.clone()).map_err(|_| {
            BackendError::Config(format!("shared state name {name:?} contains a NUL byte"))
        })?;
        Ok((oid, c))
    }

    fn lib(&self) -> &Lib {
        &self.cluster.lib
    }

    /// Create the object empty if it does not exist. An exclusive create
    /// fails on an existing object without touching it; a non-exclusive
    /// one would be a write and bump the version, failing the next
    /// compare-and-swap of whoever loaded it.
    fn ensure_exists(&self, oid: &str, c_oid: &CString) -> Result<(), BackendError> {
        let lib = self.lib();
        let io = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: a fresh write op, released below.
        let op = unsafe { (lib.rados_create_write_op)() };
        // SAFETY: `op` is live; a NULL category is the documented default.
        unsafe { (lib.rados_write_op_create)(op, ffi::CREATE_EXCLUSIVE, ptr::null()) };
        // SAFETY: `op` and the ioctx are live, the oid NUL-terminated.
        let r = unsafe {
            (lib.rados_write_op_operate)(op, io.raw(), c_oid.as_ptr(), ptr::null_mut(), 0)
        };
        // SAFETY: `op` is not used again.
        unsafe { (lib.rados_release_write_op)(op) };
        if r < 0 && r != -libc::EEXIST {
            return Err(shared_error(true, "creating", oid, errno(r.into())));
        }
        Ok(())
    }
}

/// The watch callback (a librados thread): run the handler for notices
/// from other clients, then acknowledge.
unsafe extern "C" fn watch_notice(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    notifier_id: u64,
    _data: *mut c_void,
    _len: usize,
) {
    let _inside = crate::callback::Inside::enter();
    // SAFETY: `arg` is the Watch kept alive by its RadosShared until the
    // watch is removed and `rados_watch_flush` returned.
    let w = unsafe { &*arg.cast::<Watch>() };
    if notifier_id != w.own_id && !w.closed.load(Ordering::Acquire) {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (w.handler)()));
    }
    // SAFETY: the ioctx is live (the Watch holds it); the oid is
    // NUL-terminated; an empty reply.
    unsafe {
        (w.notices.lib().rados_notify_ack)(
            w.notices.raw(),
            w.oid.as_ptr(),
            notify_id,
            cookie,
            ptr::null(),
            0,
        )
    };
}

/// The watch-error callback: the watch was lost (an OSD restarted, the
/// client was disconnected); re-establish it from another thread, as
/// librados must not be re-entered for a watch from its own callback.
unsafe extern "C" fn watch_error(arg: *mut c_void, _cookie: u64, err: c_int) {
    let _inside = crate::callback::Inside::enter();
    // SAFETY: as in `watch_notice`; the count taken here is given to the
    // thread below, so the Watch outlives it.
    let w = unsafe {
        Arc::increment_strong_count(arg.cast::<Watch>());
        Arc::from_raw(arg.cast::<Watch>())
    };
    tracing::warn!(
        "watch on {} lost ({}); re-establishing it",
        w.oid.to_string_lossy(),
        errno(err.into())
    );
    let spawned = std::thread::Builder::new()
        .name("rbd-rewatch".into())
        .spawn(move || rewatch(&w));
    if let Err(e) = spawned {
        tracing::warn!("cannot start a thread to re-establish a watch: {e}");
    }
}

fn rewatch(w: &Arc<Watch>) {
    loop {
        {
            let mut cookie = w.cookie.lock().unwrap_or_else(|e| e.into_inner());
            if w.closed.load(Ordering::Acquire) {
                return;
            }
            let lib = w.notices.lib();
            if let Some(old) = cookie.take() {
                // SAFETY: `old` is this watch's cookie on this ioctx.
                unsafe { (lib.rados_unwatch2)(w.notices.raw(), old) };
            }
            match w.register() {
                Ok(c) => {
                    *cookie = Some(c);
                    drop(cookie);
                    tracing::info!("watch on {} re-established", w.oid.to_string_lossy());
                    // Changes published while the watch was lost were
                    // never announced here: look at the state once.
                    let _ =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (w.handler)()));
                    return;
                }
                Err(e) => tracing::warn!(
                    "re-establishing the watch on {} failed: {e}; retrying",
                    w.oid.to_string_lossy()
                ),
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

impl Watch {
    /// `rados_watch2` with this Watch as the callbacks' argument; the
    /// caller holds `cookie` and keeps the Arc alive.
    fn register(self: &Arc<Watch>) -> Result<u64, io::Error> {
        let mut cookie = 0u64;
        // SAFETY: the ioctx is live, the oid NUL-terminated, `cookie` a
        // valid out pointer; the argument is this Watch, which lives until
        // the watch is removed and flushed.
        let r = unsafe {
            (self.notices.lib().rados_watch2)(
                self.notices.raw(),
                self.oid.as_ptr(),
                &mut cookie,
                watch_notice,
                watch_error,
                Arc::as_ptr(self).cast_mut().cast::<c_void>(),
            )
        };
        if r < 0 {
            return Err(errno(r.into()));
        }
        Ok(cookie)
    }
}

impl SharedState for RadosShared {
    fn load(&self, name: &str) -> Result<Versioned, BackendError> {
        let (oid, c_oid) = self.oid(name)?;
        let lib = self.lib();
        let io = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let mut cap = 64 * 1024usize;
        loop {
            let mut buf = vec![0u8; cap];
            let mut size = 0u64;
            let mut mtime: libc::time_t = 0;
            let mut stat_rval: c_int = 0;
            let mut got = 0usize;
            let mut read_rval: c_int = 0;
            // SAFETY: a fresh read op; every out pointer (size, mtime,
            // bytes read, the per-op results, `cap` bytes of `buf`) lives
            // on this frame until the op is released below.
            let r = unsafe {
                let op = (lib.rados_create_read_op)();
                (lib.rados_read_op_stat)(op, &mut size, &mut mtime, &mut stat_rval);
                (lib.rados_read_op_read)(
                    op,
                    0,
                    cap,
                    buf.as_mut_ptr().cast::<c_char>(),
                    &mut got,
                    &mut read_rval,
                );
                let r = (lib.rados_read_op_operate)(op, io.raw(), c_oid.as_ptr(), 0);
                (lib.rados_release_read_op)(op);
                r
            };
            if r == -libc::ENOENT {
                return Ok(Versioned::default());
            }
            let r = if r < 0 {
                r
            } else {
                stat_rval.min(read_rval).min(0)
            };
            if r < 0 {
                return Err(shared_error(false, "reading", &oid, errno(r.into())));
            }
            if size > MAX_BLOB_BYTES {
                return Err(shared_error(
                    false,
                    "reading",
                    &oid,
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("the object holds {size} bytes, more than any ethersan state ({MAX_BLOB_BYTES}); it is not ethersan's or it is corrupt"),
                    ),
                ));
            }
            if size > cap as u64 {
                cap = usize::try_from(size).map_err(|_| {
                    shared_error(
                        false,
                        "reading",
                        &oid,
                        io::Error::from_raw_os_error(libc::EFBIG),
                    )
                })?;
                continue;
            }
            // SAFETY: the ioctx is live; the last op on it (under the lock)
            // was this read.
            let version = unsafe { (lib.rados_get_last_version)(io.raw()) };
            buf.truncate(got.min(cap));
            return Ok(Versioned { data: buf, version });
        }
    }

    fn store(&self, name: &str, data: &[u8], expected: u64) -> Result<Option<u64>, BackendError> {
        let (oid, c_oid) = self.oid(name)?;
        let lib = self.lib();
        let version = {
            let io = self.ops.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: a fresh write op; `data` outlives the synchronous
            // operate; the op is released before the block ends.
            let r = unsafe {
                let op = (lib.rados_create_write_op)();
                if expected == 0 {
                    (lib.rados_write_op_create)(op, ffi::CREATE_EXCLUSIVE, ptr::null());
                } else {
                    (lib.rados_write_op_assert_version)(op, expected);
                }
                (lib.rados_write_op_write_full)(op, data.as_ptr().cast::<c_char>(), data.len());
                let r =
                    (lib.rados_write_op_operate)(op, io.raw(), c_oid.as_ptr(), ptr::null_mut(), 0);
                (lib.rados_release_write_op)(op);
                r
            };
            if [libc::EEXIST, libc::ERANGE, libc::EOVERFLOW, libc::ENOENT].contains(&-r) {
                return Ok(None);
            }
            if r < 0 {
                return Err(shared_error(true, "writing", &oid, errno(r.into())));
            }
            // SAFETY: the ioctx is live; the last op on it was this write.
            unsafe { (lib.rados_get_last_version)(io.raw()) }
        };
        if name == "identity" {
            // The mirror is for people (`rbd image-meta get`); the blob is
            // stored already, so a failure here is only logged.
            let text = String::from_utf8_lossy(data);
            if let Err(e) = self.image.metadata_set(IDENTITY_METADATA_KEY, &text) {
                tracing::warn!("{}: {e}", self.name);
            }
        }
        Ok(Some(version))
    }

    fn subscribe(&self, name: &str, on_change: ChangeHandler) -> Result<(), BackendError> {
        let (oid, c_oid) = self.oid(name)?;
        self.ensure_exists(&oid, &c_oid)?;
        let w = Arc::new(Watch {
            notices: self.notices.clone(),
            oid: c_oid,
            handler: on_change,
            own_id: self.cluster.instance_id(),
            cookie: Mutex::new(None),
            closed: AtomicBool::new(false),
        });
        {
            let mut cookie = w.cookie.lock().unwrap_or_else(|e| e.into_inner());
            let c = w
                .register()
                .map_err(|e| shared_error(false, "watching", &oid, e))?;
            *cookie = Some(c);
        }
        self.watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(w);
        Ok(())
    }

    fn publish(&self, name: &str) -> Result<(), BackendError> {
        let (oid, c_oid) = self.oid(name)?;
        let lib = self.lib();
        let mut reply: *mut c_char = ptr::null_mut();
        let mut reply_len = 0usize;
        let timeout_ms = NOTIFY_TIMEOUT.as_millis() as u64;
        // SAFETY: the ioctx is live, the oid NUL-terminated, an empty
        // payload; the reply buffer is freed below with rados_buffer_free.
        let r = unsafe {
            (lib.rados_notify2)(
                self.notices.raw(),
                c_oid.as_ptr(),
                ptr::null(),
                0,
                timeout_ms,
                &mut reply,
                &mut reply_len,
            )
        };
        if !reply.is_null() {
            // SAFETY: librados allocated the reply; it is freed once.
            unsafe { (lib.rados_buffer_free)(reply) };
        }
        if r == -libc::ENOENT {
            // Nobody ever subscribed: nobody to tell.
            return Ok(());
        }
        if r < 0 {
            return Err(shared_error(
                true,
                "notifying the watchers of",
                &oid,
                errno(r.into()),
            ));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("{} (rados objects {}*)", self.name, self.prefix)
    }
}

impl Drop for RadosShared {
    fn drop(&mut self) {
        let watches = std::mem::take(&mut *self.watches.lock().unwrap_or_else(|e| e.into_inner()));
        // Flushing watches waits for running callbacks: inside one (a
        // handler dropped the last reference), it runs on a thread of its
        // own, which also holds the image and the client until it is done.
        let (notices, cluster, image) = (
            self.notices.clone(),
            self.cluster.clone(),
            self.image.clone(),
        );
        crate::callback::teardown("shared state", move || {
            for w in &watches {
                let mut cookie = w.cookie.lock().unwrap_or_else(|e| e.into_inner());
                w.closed.store(true, Ordering::Release);
                if let Some(c) = cookie.take() {
                    // SAFETY: `c` is this watch's cookie on this ioctx.
                    let r = unsafe { (cluster.lib.rados_unwatch2)(notices.raw(), c) };
                    if r < 0 {
                        tracing::warn!(
                            "removing the watch on {} failed: {}",
                            w.oid.to_string_lossy(),
                            errno(r.into())
                        );
                    }
                }
            }
            // No callback may still be running with a Watch about to be freed.
            cluster.watch_flush();
            drop((watches, notices, image, cluster));
        });
    }
}
