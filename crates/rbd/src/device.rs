//! [`RbdDevice`]: an RBD image as a [`BlockDevice`].
//!
//! Lifetime invariants of the asynchronous path:
//! - every librbd AIO carries one boxed [`AioState`] as its callback
//!   argument; the box owns the request's buffers (the read target, the
//!   data to write, the compare buffer, `mismatch_off`) and is freed only
//!   by [`aio_done`], which librbd calls exactly once per completion;
//! - pointers handed to librbd are taken from the box's heap buffers before
//!   the AIO starts and never touched by the submitter afterwards (the
//!   callback may run, on a librbd thread, before `rbd_aio_*` returns);
//! - when `rbd_aio_*` refuses a request synchronously the completion never
//!   fires: the submitter releases it and frees the box itself.

use std::ffi::{c_char, c_int, c_void};
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use ethersan_backend::{
    BackendError, BlockDevice, IoBuf, IoCompletion, IoRequest, SharedState, Submission,
};

use crate::cluster::{errno, Cluster, Ioctx};
use crate::ffi::{CompletionT, Lib};
use crate::image::{open_or_create, Image};
use crate::shared::RadosShared;
use crate::{RbdError, RbdSpec};

/// The largest COMPARE AND WRITE librbd 16 (Pacific) does atomically: one
/// 512-byte sector (measured; `prune_object_extents` refuses more).
const PACIFIC_MAX_COMPARE_AND_WRITE: u64 = 512;

/// Largest WRITE SAME handed to librbd in one request (its length is a
/// `size_t`, and a bounded request is bounded in time by the OSD timeout).
const WRITE_SAME_CHUNK: u64 = 1 << 30;

/// Longest range one [`BlockDevice::lba_status`] call looks at (it costs
/// one listing per 4 MiB object); the answer may be shorter than asked.
const LBA_STATUS_WINDOW: u64 = 1 << 30;

/// A Ceph RBD image exported as a block device (see the crate
/// documentation for how each operation maps to librbd).
pub struct RbdDevice {
    image: Arc<Image>,
    block_size: u32,
    num_blocks: AtomicU64,
    name: String,
    timeout: Duration,
    shared: Arc<RadosShared>,
    /// `rbd_update_watch` handles and their boxed callbacks.
    size_watches: Mutex<Vec<(u64, SizeWatch)>>,
}

/// The boxed callback of one `rbd_update_watch` (freed after unwatching).
struct SizeWatch(*mut Arc<dyn Fn() + Send + Sync>);

// SAFETY: the pointer is a Box owned by this value; the closure it points
// to is Send + Sync.
unsafe impl Send for SizeWatch {}

impl std::fmt::Debug for RbdDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdDevice")
            .field("image", &self.name)
            .field("block_size", &self.block_size)
            .field("num_blocks", &self.num_blocks.load(Ordering::Relaxed))
            .finish()
    }
}

impl RbdDevice {
    /// Connect to the cluster and open (or, with a size in the spec,
    /// create) the image, with `block_size`-byte logical blocks.
    pub fn open(spec: &RbdSpec, block_size: u32) -> Result<RbdDevice, RbdError> {
        if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
            return Err(RbdError::Invalid(format!(
                "block size {block_size} is not a power of two between 512 and 65536"
            )));
        }
        if let Some(size) = spec.create_size {
            if size % u64::from(block_size) != 0 {
                return Err(RbdError::Invalid(format!(
                    "image size {size} bytes is not a multiple of the {block_size}-byte block size: round it (for example to {})",
                    size.next_multiple_of(u64::from(block_size))
                )));
            }
        }
        let lib = Lib::get()?;
        let cluster = Cluster::connect(lib, spec)?;
        let ioctx = Arc::new(Ioctx::create(&cluster, &spec.pool)?);
        let image = open_or_create(&ioctx, spec)?;
        let size = image.size().map_err(|cause| RbdError::Open {
            pool: spec.pool.clone(),
            image: spec.image.clone(),
            cause,
        })?;
        if size % u64::from(block_size) != 0 {
            return Err(RbdError::Invalid(format!(
                "image {}/{} has {size} bytes, not a multiple of the {block_size}-byte block size: resize it (rbd resize --size ...) or use another block size",
                spec.pool, spec.image
            )));
        }
        if let Some(want) = spec.create_size {
            if want != size {
                tracing::info!(
                    "image {}/{} exists with {size} bytes: the size {want} given is ignored (an existing image is never resized)",
                    spec.pool,
                    spec.image
                );
            }
        }
        let id = image.id().map_err(|cause| RbdError::Open {
            pool: spec.pool.clone(),
            image: spec.image.clone(),
            cause,
        })?;
        let name = format!("rbd:{}/{}", spec.pool, spec.image);
        let image = Arc::new(image);
        let shared = Arc::new(RadosShared::new(
            &cluster,
            &spec.pool,
            &id,
            image.clone(),
            &name,
        )?);
        Ok(RbdDevice {
            image,
            block_size,
            num_blocks: AtomicU64::new(size / u64::from(block_size)),
            name,
            timeout: spec.timeout,
            shared,
            size_watches: Mutex::new(Vec::new()),
        })
    }

    /// The value of image metadata `key` (`rbd image-meta get`), `None`
    /// when it is not set.
    pub fn metadata_get(&self, key: &str) -> Result<Option<String>, RbdError> {
        self.image.metadata_get(key)
    }

    /// Set image metadata `key` to `value` (`rbd image-meta set`).
    pub fn metadata_set(&self, key: &str, value: &str) -> Result<(), RbdError> {
        self.image.metadata_set(key, value)
    }

    /// The shared state over RADOS objects of this image's pool.
    pub fn rados_shared(&self) -> Arc<RadosShared> {
        self.shared.clone()
    }

    /// Start one AIO: `issue` gets the completion and starts the request
    /// with pointers taken from `state` beforehand. On a synchronous
    /// refusal the state (and its completion) is dropped here.
    fn launch(
        &self,
        state: Box<AioState>,
        issue: impl FnOnce(CompletionT) -> i64,
    ) -> Result<(), io::Error> {
        let lib = self.image.lib();
        let raw = Box::into_raw(state);
        let mut c: CompletionT = ptr::null_mut();
        // SAFETY: `raw` is a valid AioState pointer that `aio_done` will
        // reclaim; `c` is a valid out pointer.
        let r = unsafe { (lib.rbd_aio_create_completion)(raw.cast::<c_void>(), aio_done, &mut c) };
        if r < 0 {
            // SAFETY: no completion exists, so nothing else owns `raw`.
            drop(unsafe { Box::from_raw(raw) });
            return Err(errno(r.into()));
        }
        let r = issue(c);
        if r < 0 {
            // SAFETY: librbd refused the request, so the completion will
            // never fire: release it and take the state back.
            unsafe {
                (lib.rbd_aio_release)(c);
                drop(Box::from_raw(raw));
            }
            return Err(errno(r));
        }
        Ok(())
    }

    /// Run one AIO built by `issue` and wait for its return value (and
    /// `mismatch_off`), bounded by a multiple of the cluster timeout.
    fn run_and_wait(
        &self,
        mut state: Box<AioState>,
        issue: impl FnOnce(CompletionT, *mut u64) -> i64,
    ) -> Result<(i64, u64), io::Error> {
        let (tx, rx) = mpsc::sync_channel(1);
        state.finish = Finish::Wait(tx);
        let mismatch: *mut u64 = &mut state.mismatch_off;
        self.launch(state, |c| issue(c, mismatch))?;
        // librbd fails the request itself after the OSD timeout; the bound
        // here only guards against a lost completion.
        rx.recv_timeout(self.timeout * 4 + Duration::from_secs(30))
            .map_err(|_| io::Error::from_raw_os_error(libc::ETIMEDOUT))
    }

    fn check_offset(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        let bs = u64::from(self.block_size);
        if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(BackendError::Config(format!(
                "{}: offset {offset} or length {len} is not a multiple of the {bs}-byte block size",
                self.name
            )));
        }
        Ok(())
    }
}

/// How an AIO reports its outcome.
enum Finish {
    /// A data-path request: call its completion.
    Io(IoCompletion),
    /// A blocking helper waits for (return value, mismatch_off).
    Wait(mpsc::SyncSender<(i64, u64)>),
    /// Not set yet.
    None,
}

/// What one AIO owns until librbd is done with it.
struct AioState {
    lib: LibRef,
    finish: Finish,
    /// The request (its buffers stay here until the callback).
    req: Option<IoRequest>,
    /// Extra buffers (WRITE SAME pattern, COMPARE AND WRITE halves).
    bufs: Vec<Vec<u8>>,
    mismatch_off: u64,
}

/// The two functions the completion callback needs, copied out of the
/// table so the callback does not depend on the device being alive.
struct LibRef {
    get_return_value: unsafe extern "C" fn(CompletionT) -> isize,
    release: unsafe extern "C" fn(CompletionT),
}

impl AioState {
    fn new(lib: &Lib, req: Option<IoRequest>) -> Box<AioState> {
        Box::new(AioState {
            lib: LibRef {
                get_return_value: lib.rbd_aio_get_return_value,
                release: lib.rbd_aio_release,
            },
            finish: Finish::None,
            req,
            bufs: Vec::new(),
            mismatch_off: 0,
        })
    }
}

/// librbd's completion callback (a librbd thread): take the state back,
/// read the outcome, release the completion and report.
unsafe extern "C" fn aio_done(c: CompletionT, arg: *mut c_void) {
    let _inside = crate::callback::Inside::enter();
    // SAFETY: `arg` is the Box<AioState> leaked by `RbdDevice::launch` for
    // this completion, which fires exactly once.
    let mut state = unsafe { Box::from_raw(arg.cast::<AioState>()) };
    // SAFETY: `c` is the live completion this callback is for; it is
    // released here and never used again.
    let r = unsafe {
        let r = (state.lib.get_return_value)(c);
        (state.lib.release)(c);
        r
    } as i64;
    let finish = std::mem::replace(&mut state.finish, Finish::None);
    match finish {
        Finish::Wait(tx) => {
            let _ = tx.send((r, state.mismatch_off));
        }
        Finish::Io(done) => {
            let outcome = match state.req.take() {
                Some(IoRequest::Read { offset, len, buf }) => {
                    if r < 0 {
                        Err(BackendError::Read {
                            offset,
                            cause: errno(r),
                        })
                    } else {
                        let got = usize::try_from(r).unwrap_or(0).min(len);
                        // Empty, starting at 0 (see `submit`): the same
                        // allocation, no copy.
                        let mut buf = buf.into_vec();
                        // SAFETY: librbd wrote `got` (<= len <= capacity)
                        // bytes at the start of the buffer's allocation.
                        unsafe { buf.set_len(got) };
                        buf.resize(len, 0);
                        Ok(buf.into())
                    }
                }
                Some(req) if r < 0 => Err(req.error(errno(r))),
                _ => Ok(IoBuf::new()),
            };
            // A panicking completion must not unwind into librbd.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(outcome)));
        }
        Finish::None => {}
    }
}

/// librbd's image-update callback: the header changed (resize, metadata).
unsafe extern "C" fn size_changed(arg: *mut c_void) {
    let _inside = crate::callback::Inside::enter();
    // SAFETY: `arg` is the boxed callback registered with this watch; it is
    // freed only after `rbd_update_unwatch` returned.
    let f = unsafe { &*arg.cast::<Arc<dyn Fn() + Send + Sync>>() };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f()));
}

struct DiffScan {
    extents: Vec<(u64, u64)>,
}

/// `rbd_diff_iterate2` callback: collect the allocated extents.
unsafe extern "C" fn diff_extent(off: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the DiffScan owned by `lba_status`, alive for the
    // whole (synchronous) iteration and used by no one else meanwhile.
    let scan = unsafe { &mut *arg.cast::<DiffScan>() };
    if exists != 0 {
        scan.extents.push((off, len as u64));
    }
    0
}

/// Whether `offset` lies in one of `extents` and how far (≤ `max`) that
/// state lasts.
fn provisioning(mut extents: Vec<(u64, u64)>, offset: u64, max: u64) -> (bool, u64) {
    extents.sort_unstable();
    let end = offset.saturating_add(max);
    let mut mapped_to: Option<u64> = None;
    for (start, len) in extents.iter().copied() {
        let stop = start.saturating_add(len);
        match mapped_to {
            None if start <= offset && stop > offset => mapped_to = Some(stop),
            None if start > offset => return (false, start.min(end) - offset),
            Some(to) if start <= to => mapped_to = Some(to.max(stop)),
            Some(_) => break,
            None => {}
        }
    }
    match mapped_to {
        Some(to) => (true, to.min(end) - offset),
        None => (false, max),
    }
}

impl BlockDevice for RbdDevice {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn num_blocks(&self) -> u64 {
        self.num_blocks.load(Ordering::Acquire)
    }

    fn submit(&self, req: IoRequest, done: IoCompletion) -> Submission {
        let lib = self.image.lib();
        let image = self.image.raw();
        let mut state = AioState::new(lib, None);
        state.finish = Finish::Io(done);
        let failed = |req: &IoRequest, e: io::Error| Submission::Done(Err(req.error(e)));
        match req {
            IoRequest::Read { offset, len, buf } => {
                let mut buf = buf.into_vec();
                buf.clear();
                buf.reserve(len);
                let p = buf.as_mut_ptr().cast::<c_char>();
                // The vector moves into the request, its heap block stays.
                let buf = IoBuf::from(buf);
                state.req = Some(IoRequest::Read { offset, len, buf });
                // SAFETY: `p` points to `len` writable bytes of the buffer
                // owned by `state`, which lives until the callback.
                let r = self.launch(state, |c| unsafe {
                    (lib.rbd_aio_read)(image, offset, len, p, c).into()
                });
                match r {
                    Ok(()) => Submission::Pending,
                    Err(e) => failed(&IoRequest::read(offset, len), e),
                }
            }
            IoRequest::Write {
                offset,
                data,
                len,
                fua,
            } => {
                let len = len.min(data.len());
                let p = data.as_ptr().cast::<c_char>();
                state.req = Some(IoRequest::Write {
                    offset,
                    data,
                    len,
                    fua,
                });
                // FUA needs nothing more: with rbd_cache off, librbd
                // acknowledges a write only once every replica's OSD has
                // committed it to stable storage, so an acknowledged write
                // is already durable; a chained flush would only wait for
                // other writes in flight.
                // SAFETY: `p` points to `len` readable bytes of the data
                // owned by `state`, which lives until the callback.
                let r = self.launch(state, |c| unsafe {
                    (lib.rbd_aio_write)(image, offset, len, p, c).into()
                });
                match r {
                    Ok(()) => Submission::Pending,
                    Err(e) => Submission::Done(Err(BackendError::Write { offset, cause: e })),
                }
            }
            IoRequest::Flush => {
                state.req = Some(IoRequest::Flush);
                // SAFETY: the image is open; the completion is fresh.
                let r = self.launch(state, |c| unsafe { (lib.rbd_aio_flush)(image, c).into() });
                match r {
                    Ok(()) => Submission::Pending,
                    Err(e) => Submission::Done(Err(BackendError::Flush(e))),
                }
            }
        }
    }

    fn thin_provisioned(&self) -> bool {
        true
    }

    fn unmap(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.check_offset(offset, len)?;
        let lib = self.image.lib();
        let image = self.image.raw();
        let state = AioState::new(lib, None);
        let write_err = |cause| BackendError::Write { offset, cause };
        // SAFETY: the image is open; the completion is fresh.
        let (r, _) = self
            .run_and_wait(state, |c, _| unsafe {
                (lib.rbd_aio_discard)(image, offset, len, c).into()
            })
            .map_err(write_err)?;
        if r < 0 {
            return Err(write_err(errno(r)));
        }
        Ok(())
    }

    fn lba_status(&self, offset: u64, max: u64) -> Result<(bool, u64), BackendError> {
        let size = self.num_blocks() * u64::from(self.block_size);
        let max = max.min(LBA_STATUS_WINDOW).min(size.saturating_sub(offset));
        if max == 0 {
            return Ok((false, 0));
        }
        let mut scan = DiffScan {
            extents: Vec::new(),
        };
        // SAFETY: the image is open; a NULL snapshot compares the head with
        // nothing (every allocated extent); `scan` outlives the synchronous
        // iteration and `diff_extent` is the matching callback.
        let r = unsafe {
            (self.image.lib().rbd_diff_iterate2)(
                self.image.raw(),
                ptr::null(),
                offset,
                max,
                1,
                0,
                diff_extent,
                (&mut scan as *mut DiffScan).cast::<c_void>(),
            )
        };
        if r < 0 {
            return Err(BackendError::Read {
                offset,
                cause: errno(r.into()),
            });
        }
        Ok(provisioning(scan.extents, offset, max))
    }

    fn write_same(
        &self,
        offset: u64,
        len: u64,
        block: &[u8],
        fua: bool,
    ) -> Result<(), BackendError> {
        let _ = fua; // acknowledged writes are durable (see `submit`)
        self.check_offset(offset, len)?;
        if block.is_empty() || !len.is_multiple_of(block.len() as u64) {
            return Err(BackendError::Config(format!(
                "{}: WRITE SAME of {len} bytes is not a multiple of its {}-byte pattern",
                self.name,
                block.len()
            )));
        }
        let lib = self.image.lib();
        let image = self.image.raw();
        let step = WRITE_SAME_CHUNK - WRITE_SAME_CHUNK % block.len() as u64;
        let mut done = 0u64;
        while done < len {
            let at = offset + done;
            let n = (len - done).min(step);
            let mut state = AioState::new(lib, None);
            state.bufs.push(block.to_vec());
            let p = state.bufs[0].as_ptr().cast::<c_char>();
            let plen = block.len();
            let write_err = |cause| BackendError::Write { offset: at, cause };
            // SAFETY: `p` points to `plen` bytes owned by `state`, alive
            // until the callback; `n` is a multiple of `plen`.
            let (r, _) = self
                .run_and_wait(state, |c, _| unsafe {
                    (lib.rbd_aio_writesame)(image, at, n as usize, p, plen, c, 0).into()
                })
                .map_err(write_err)?;
            if r < 0 {
                return Err(write_err(errno(r)));
            }
            done += n;
        }
        Ok(())
    }

    fn max_compare_and_write_bytes(&self) -> Option<u64> {
        Some(PACIFIC_MAX_COMPARE_AND_WRITE)
    }

    fn compare_and_write(
        &self,
        offset: u64,
        compare: &[u8],
        write: &[u8],
        fua: bool,
    ) -> Result<Option<u64>, BackendError> {
        let _ = fua; // acknowledged writes are durable (see `submit`)
                     // Beyond one sector librbd 16 refuses (EINVAL, below): the SCSI
                     // layer then compares and writes under its own lock.
        if compare.len() as u64 > PACIFIC_MAX_COMPARE_AND_WRITE
            || !offset.is_multiple_of(PACIFIC_MAX_COMPARE_AND_WRITE)
        {
            return Err(BackendError::Unsupported);
        }
        if compare.len() != write.len() {
            return Err(BackendError::Config(format!(
                "{}: COMPARE AND WRITE with {} bytes to compare and {} to write",
                self.name,
                compare.len(),
                write.len()
            )));
        }
        self.check_offset(offset, compare.len() as u64)?;
        let lib = self.image.lib();
        let image = self.image.raw();
        let mut state = AioState::new(lib, None);
        state.bufs.push(compare.to_vec());
        state.bufs.push(write.to_vec());
        let cmp = state.bufs[0].as_ptr().cast::<c_char>();
        let data = state.bufs[1].as_ptr().cast::<c_char>();
        let len = compare.len();
        let write_err = |cause| BackendError::Write { offset, cause };
        // SAFETY: both buffers (`len` bytes each) and `mismatch` are owned
        // by `state`, alive until the callback.
        let (r, mismatch) = self
            .run_and_wait(state, |c, mismatch| unsafe {
                (lib.rbd_aio_compare_and_write)(image, offset, len, cmp, data, c, mismatch, 0)
                    as i64
            })
            .map_err(write_err)?;
        if r == -i64::from(libc::EILSEQ) {
            // The first differing byte. Later releases report its image
            // offset. Pacific (16.2.15, measured) reports the image offset
            // of the object's start plus the byte's index in the request:
            // since Pacific takes only requests within one 512-byte sector
            // of one object (object starts are sector multiples), that
            // index is the value modulo 512.
            let len64 = len as u64;
            let at = match mismatch.checked_sub(offset) {
                Some(i) if i < len64 => i,
                _ => mismatch % 512,
            };
            if at >= len64 {
                return Err(write_err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("librbd reported a miscompare at byte {mismatch}, outside the {len} bytes compared at {offset}"),
                )));
            }
            return Ok(Some(at));
        }
        if r == -i64::from(libc::EINVAL) {
            return Err(BackendError::Config(format!(
                "{}: librbd refused COMPARE AND WRITE of {len} bytes at byte {offset} (EINVAL): librbd 16 (Pacific) compares and writes atomically only within one 512-byte sector of one object, so export the image with 512-byte blocks and compare one block at a time",
                self.name
            )));
        }
        if r < 0 {
            return Err(write_err(errno(r)));
        }
        Ok(None)
    }

    fn resize(&self, bytes: u64) -> Result<Option<u64>, BackendError> {
        let bs = u64::from(self.block_size);
        if !bytes.is_multiple_of(bs) {
            return Err(BackendError::Config(format!(
                "{}: new size {bytes} is not a multiple of the {bs}-byte block size",
                self.name
            )));
        }
        let current = self
            .image
            .size()
            .map_err(|cause| BackendError::Read { offset: 0, cause })?;
        if bytes < current {
            return Err(BackendError::Config(format!(
                "{}: shrinking from {current} to {bytes} bytes is refused (the blocks past the new end would be lost)",
                self.name
            )));
        }
        if bytes > current {
            // SAFETY: the image is open.
            let r = unsafe { (self.image.lib().rbd_resize)(self.image.raw(), bytes) };
            if r < 0 {
                return Err(BackendError::Write {
                    offset: current,
                    cause: errno(r.into()),
                });
            }
        }
        self.refresh_size()
    }

    fn refresh_size(&self) -> Result<Option<u64>, BackendError> {
        let size = self
            .image
            .size()
            .map_err(|cause| BackendError::Read { offset: 0, cause })?;
        let blocks = size / u64::from(self.block_size);
        let old = self.num_blocks.swap(blocks, Ordering::AcqRel);
        Ok((old != blocks).then_some(blocks))
    }

    fn watch_size(&self, changed: Arc<dyn Fn() + Send + Sync>) -> bool {
        let boxed = Box::into_raw(Box::new(changed));
        let mut handle = 0u64;
        // SAFETY: the image is open; `boxed` stays alive until after
        // `rbd_update_unwatch` (in Drop), and `size_changed` matches it.
        let r = unsafe {
            (self.image.lib().rbd_update_watch)(
                self.image.raw(),
                &mut handle,
                size_changed,
                boxed.cast::<c_void>(),
            )
        };
        if r < 0 {
            // SAFETY: librbd did not take the watch, so the box is ours.
            drop(unsafe { Box::from_raw(boxed) });
            tracing::warn!(
                "{}: cannot watch the image for resizes: {}",
                self.name,
                errno(r.into())
            );
            return false;
        }
        self.size_watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((handle, SizeWatch(boxed)));
        true
    }

    fn shared(&self) -> Option<Arc<dyn SharedState>> {
        Some(self.shared.clone())
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}

impl Drop for RbdDevice {
    fn drop(&mut self) {
        let watches =
            std::mem::take(&mut *self.size_watches.lock().unwrap_or_else(|e| e.into_inner()));
        // The image and the shared state go with the teardown: when it runs
        // on a thread of its own (see `callback`), that thread holds them,
        // so the image closes there, not in a librbd callback.
        let (image, shared, name) = (self.image.clone(), self.shared.clone(), self.name.clone());
        crate::callback::teardown("image", move || {
            for (handle, SizeWatch(boxed)) in watches {
                // SAFETY: the watch was registered on this open image;
                // unwatching waits for a callback in progress.
                let r = unsafe { (image.lib().rbd_update_unwatch)(image.raw(), handle) };
                if r < 0 {
                    tracing::warn!(
                        "{name}: removing the resize watch failed: {}",
                        errno(r.into())
                    );
                }
                // SAFETY: the watch is gone, so no callback uses the box.
                drop(unsafe { Box::from_raw(boxed) });
            }
            drop((shared, image));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::provisioning;

    #[test]
    fn provisioning_of_extents() {
        let m = 1u64 << 20;
        // Nothing allocated.
        assert_eq!(provisioning(vec![], 0, 8 * m), (false, 8 * m));
        // Inside an extent that touches the next one.
        assert_eq!(
            provisioning(vec![(4 * m, 4 * m), (0, 4 * m)], m, 16 * m),
            (true, 7 * m)
        );
        // Before an extent.
        assert_eq!(provisioning(vec![(4 * m, m)], m, 16 * m), (false, 3 * m));
        // Cut at max.
        assert_eq!(provisioning(vec![(0, 8 * m)], 0, 2 * m), (true, 2 * m));
        // A gap after the first extent ends the run.
        assert_eq!(provisioning(vec![(0, m), (2 * m, m)], 0, 8 * m), (true, m));
    }
}
