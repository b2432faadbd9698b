//! An open RBD image ([`Image`]): the librbd handle shared by the device
//! and its shared state, with the few calls both make on it (size, id,
//! image metadata), and how an image is opened or created.

use std::ffi::{c_char, c_int, CStr};
use std::io;
use std::ptr;
use std::sync::Arc;

use crate::cluster::{cstring, errno, Ioctx};
use crate::ffi::{self, ImageT, Lib};
use crate::{RbdError, RbdSpec};

/// The features of an image this crate creates: Pacific's defaults.
const CREATE_FEATURES: u64 = ffi::FEATURE_LAYERING
    | ffi::FEATURE_EXCLUSIVE_LOCK
    | ffi::FEATURE_OBJECT_MAP
    | ffi::FEATURE_FAST_DIFF
    | ffi::FEATURE_DEEP_FLATTEN;

/// An open image; closed when the last holder (the device, its shared
/// state) drops it.
pub(crate) struct Image {
    pub(crate) ioctx: Arc<Ioctx>,
    handle: ImageT,
}

// SAFETY: librbd image handles are thread-safe: AIO, size queries,
// metadata and watch registration may be called from several threads at
// once.
unsafe impl Send for Image {}
// SAFETY: see `Send`.
unsafe impl Sync for Image {}

impl Image {
    pub(crate) fn lib(&self) -> &Lib {
        self.ioctx.lib()
    }

    pub(crate) fn raw(&self) -> ImageT {
        self.handle
    }

    pub(crate) fn size(&self) -> Result<u64, io::Error> {
        let mut size = 0u64;
        // SAFETY: the image is open; `size` is a valid out pointer.
        let r = unsafe { (self.lib().rbd_get_size)(self.handle, &mut size) };
        if r < 0 {
            return Err(errno(r.into()));
        }
        Ok(size)
    }

    pub(crate) fn id(&self) -> Result<String, io::Error> {
        let mut len = 64usize;
        loop {
            let mut buf = vec![0u8; len];
            // SAFETY: `buf` has `len` writable bytes; librbd writes a
            // NUL-terminated id or answers -ERANGE.
            let r = unsafe {
                (self.lib().rbd_get_id)(self.handle, buf.as_mut_ptr().cast::<c_char>(), len)
            };
            if r == -libc::ERANGE && len < 4096 {
                len *= 4;
                continue;
            }
            if r < 0 {
                return Err(errno(r.into()));
            }
            return Ok(CStr::from_bytes_until_nul(&buf)
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default());
        }
    }

    pub(crate) fn metadata_set(&self, key: &str, value: &str) -> Result<(), RbdError> {
        let k = cstring("metadata key", key)?;
        let v = cstring("metadata value", value)?;
        // SAFETY: the image is open; both strings are NUL-terminated and
        // outlive the call.
        let r = unsafe { (self.lib().rbd_metadata_set)(self.handle, k.as_ptr(), v.as_ptr()) };
        if r < 0 {
            return Err(RbdError::Io {
                what: format!("setting image metadata {key}"),
                cause: errno(r.into()),
            });
        }
        Ok(())
    }

    pub(crate) fn metadata_get(&self, key: &str) -> Result<Option<String>, RbdError> {
        let k = cstring("metadata key", key)?;
        let mut len = 256usize;
        for _ in 0..4 {
            let mut buf = vec![0u8; len];
            let mut got = len;
            // SAFETY: `buf` has `got` writable bytes; librbd writes at most
            // that many (NUL-terminated) or answers -ERANGE with the size
            // it needs in `got`.
            let r = unsafe {
                (self.lib().rbd_metadata_get)(
                    self.handle,
                    k.as_ptr(),
                    buf.as_mut_ptr().cast::<c_char>(),
                    &mut got,
                )
            };
            match r {
                0 => {
                    return Ok(Some(
                        CStr::from_bytes_until_nul(&buf)
                            .map(|s| s.to_string_lossy().into_owned())
                            .unwrap_or_default(),
                    ))
                }
                r if r == -libc::ENOENT => return Ok(None),
                r if r == -libc::ERANGE => len = got.max(len * 2),
                r => {
                    return Err(RbdError::Io {
                        what: format!("reading image metadata {key}"),
                        cause: errno(r.into()),
                    })
                }
            }
        }
        Err(RbdError::Io {
            what: format!("reading image metadata {key}"),
            cause: io::Error::from_raw_os_error(libc::ERANGE),
        })
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: the last holder is gone, so no AIO is being started and
        // every watch on the image was removed; rbd_close waits for the
        // AIO in flight (bounded by the OSD timeout) and releases the
        // exclusive lock.
        let r = unsafe { (self.lib().rbd_close)(self.handle) };
        if r < 0 {
            tracing::warn!("closing an rbd image failed: {}", errno(r.into()));
        }
    }
}

/// Open the image `spec` names, creating it first when it is missing and
/// the spec gives a size to create it with.
pub(crate) fn open_or_create(ioctx: &Arc<Ioctx>, spec: &RbdSpec) -> Result<Image, RbdError> {
    let c_name = cstring("image", &spec.image)?;
    let lib = ioctx.lib();
    let open = || -> Result<ImageT, c_int> {
        let mut h: ImageT = ptr::null_mut();
        // SAFETY: the ioctx is live; `h` is a valid out pointer; a NULL
        // snapshot name opens the image head read-write.
        let r = unsafe { (lib.rbd_open)(ioctx.raw(), c_name.as_ptr(), &mut h, ptr::null()) };
        if r < 0 {
            Err(r)
        } else {
            Ok(h)
        }
    };
    let open_err = |r: c_int| RbdError::Open {
        pool: spec.pool.clone(),
        image: spec.image.clone(),
        cause: errno(r.into()),
    };
    let handle = match open() {
        Ok(h) => h,
        Err(r) if r == -libc::ENOENT => {
            let Some(size) = spec.create_size else {
                return Err(RbdError::ImageMissing {
                    pool: spec.pool.clone(),
                    image: spec.image.clone(),
                });
            };
            let mut order: c_int = 0;
            // SAFETY: the ioctx is live, the name NUL-terminated, `order` a
            // valid in/out pointer (0: librbd's default object size).
            let r = unsafe {
                (lib.rbd_create2)(
                    ioctx.raw(),
                    c_name.as_ptr(),
                    size,
                    CREATE_FEATURES,
                    &mut order,
                )
            };
            if r < 0 && r != -libc::EEXIST {
                return Err(RbdError::Create {
                    pool: spec.pool.clone(),
                    image: spec.image.clone(),
                    cause: errno(r.into()),
                });
            }
            if r == 0 {
                tracing::info!(
                    "created rbd image {}/{} of {size} bytes",
                    spec.pool,
                    spec.image
                );
            }
            open().map_err(open_err)?
        }
        Err(r) => return Err(open_err(r)),
    };
    Ok(Image {
        ioctx: ioctx.clone(),
        handle,
    })
}
