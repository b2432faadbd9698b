//! The part of the librados and librbd C APIs (Ceph Pacific, 16.2) this
//! crate calls, written by hand and resolved at run time with `libloading`:
//! nothing of Ceph is needed to build, and a binary without librbd
//! installed runs until an `rbd:` store is opened.
//!
//! [`Lib`] is a table of function pointers resolved once per process
//! ([`Lib::get`]); the [`libloading::Library`] handles it keeps are never
//! closed while the table lives, so the pointers stay valid.

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, OnceLock};

use crate::RbdError;

/// `rados_t`.
pub(crate) type RadosT = *mut c_void;
/// `rados_ioctx_t`.
pub(crate) type IoctxT = *mut c_void;
/// `rbd_image_t`.
pub(crate) type ImageT = *mut c_void;
/// `rbd_completion_t`.
pub(crate) type CompletionT = *mut c_void;
/// `rados_read_op_t`.
pub(crate) type ReadOpT = *mut c_void;
/// `rados_write_op_t`.
pub(crate) type WriteOpT = *mut c_void;

/// `rbd_callback_t`: `void (*)(rbd_completion_t cb, void *arg)`.
pub(crate) type RbdCallback = unsafe extern "C" fn(CompletionT, *mut c_void);
/// `rbd_update_callback_t`: `void (*)(void *arg)`.
pub(crate) type RbdUpdateCallback = unsafe extern "C" fn(*mut c_void);
/// The `rbd_diff_iterate2` callback: `int (*)(uint64_t off, size_t len,
/// int exists, void *arg)`.
pub(crate) type DiffCallback = unsafe extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;
/// `rados_watchcb2_t`: `void (*)(void *arg, uint64_t notify_id, uint64_t
/// handle, uint64_t notifier_id, void *data, size_t data_len)`.
pub(crate) type WatchCallback =
    unsafe extern "C" fn(*mut c_void, u64, u64, u64, *mut c_void, usize);
/// `rados_watcherrcb_t`: `void (*)(void *pre, uint64_t cookie, int err)`.
pub(crate) type WatchErrCallback = unsafe extern "C" fn(*mut c_void, u64, c_int);

/// `LIBRADOS_CREATE_EXCLUSIVE`.
pub(crate) const CREATE_EXCLUSIVE: c_int = 1;

/// `RBD_FEATURE_*` bits of the Pacific default feature set.
pub(crate) const FEATURE_LAYERING: u64 = 1 << 0;
/// `RBD_FEATURE_EXCLUSIVE_LOCK`.
pub(crate) const FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 2;
/// `RBD_FEATURE_OBJECT_MAP`.
pub(crate) const FEATURE_OBJECT_MAP: u64 = 1 << 3;
/// `RBD_FEATURE_FAST_DIFF`.
pub(crate) const FEATURE_FAST_DIFF: u64 = 1 << 4;
/// `RBD_FEATURE_DEEP_FLATTEN`.
pub(crate) const FEATURE_DEEP_FLATTEN: u64 = 1 << 5;

/// The default library names (the Debian packages librbd1 and librados2).
pub(crate) const LIBRBD: &str = "librbd.so.1";
/// See [`LIBRBD`].
pub(crate) const LIBRADOS: &str = "librados.so.2";

macro_rules! fn_table {
    ($( $lib:ident . $name:ident : fn($($arg:ty),*) $(-> $ret:ty)? ;)*) => {
        /// The resolved functions; field names are the C names.
        pub(crate) struct Lib {
            $( pub(crate) $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )*
            _rados: libloading::Library,
            _rbd: libloading::Library,
        }

        impl Lib {
            fn resolve(rbd: libloading::Library, rados: libloading::Library, rbd_name: &str, rados_name: &str) -> Result<Lib, RbdError> {
                $(
                    let $name = {
                        let (lib, lib_name) = fn_table!(@pick $lib, rbd, rados, rbd_name, rados_name);
                        // SAFETY: the symbol is a C function of exactly this
                        // signature in Ceph Pacific's librados.h/librbd.h; the
                        // pointer is copied out and only used while `Lib`
                        // (which owns both libraries) lives.
                        let sym = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                        };
                        match sym {
                            Ok(s) => *s,
                            Err(e) => {
                                return Err(RbdError::Symbol {
                                    library: lib_name.to_string(),
                                    symbol: stringify!($name),
                                    cause: e.to_string(),
                                })
                            }
                        }
                    };
                )*
                Ok(Lib { $( $name, )* _rados: rados, _rbd: rbd })
            }
        }
    };
    (@pick rados, $rbd:ident, $rados:ident, $rbd_name:ident, $rados_name:ident) => { (&$rados, $rados_name) };
    (@pick rbd, $rbd:ident, $rados:ident, $rbd_name:ident, $rados_name:ident) => { (&$rbd, $rbd_name) };
}

fn_table! {
    rados.rados_create2: fn(*mut RadosT, *const c_char, *const c_char, u64) -> c_int;
    rados.rados_conf_read_file: fn(RadosT, *const c_char) -> c_int;
    rados.rados_conf_set: fn(RadosT, *const c_char, *const c_char) -> c_int;
    rados.rados_conf_get: fn(RadosT, *const c_char, *mut c_char, usize) -> c_int;
    rados.rados_connect: fn(RadosT) -> c_int;
    rados.rados_shutdown: fn(RadosT);
    rados.rados_get_instance_id: fn(RadosT) -> u64;
    rados.rados_ioctx_create: fn(RadosT, *const c_char, *mut IoctxT) -> c_int;
    rados.rados_ioctx_destroy: fn(IoctxT);
    rados.rados_get_last_version: fn(IoctxT) -> u64;
    rados.rados_create_read_op: fn() -> ReadOpT;
    rados.rados_release_read_op: fn(ReadOpT);
    rados.rados_read_op_read: fn(ReadOpT, u64, usize, *mut c_char, *mut usize, *mut c_int);
    rados.rados_read_op_stat: fn(ReadOpT, *mut u64, *mut libc::time_t, *mut c_int);
    rados.rados_read_op_operate: fn(ReadOpT, IoctxT, *const c_char, c_int) -> c_int;
    rados.rados_create_write_op: fn() -> WriteOpT;
    rados.rados_release_write_op: fn(WriteOpT);
    rados.rados_write_op_create: fn(WriteOpT, c_int, *const c_char);
    rados.rados_write_op_assert_version: fn(WriteOpT, u64);
    rados.rados_write_op_write_full: fn(WriteOpT, *const c_char, usize);
    rados.rados_write_op_operate: fn(WriteOpT, IoctxT, *const c_char, *mut libc::time_t, c_int) -> c_int;
    rados.rados_watch2: fn(IoctxT, *const c_char, *mut u64, WatchCallback, WatchErrCallback, *mut c_void) -> c_int;
    rados.rados_unwatch2: fn(IoctxT, u64) -> c_int;
    rados.rados_watch_flush: fn(RadosT) -> c_int;
    rados.rados_notify_ack: fn(IoctxT, *const c_char, u64, u64, *const c_char, c_int) -> c_int;
    rados.rados_notify2: fn(IoctxT, *const c_char, *const c_char, c_int, u64, *mut *mut c_char, *mut usize) -> c_int;
    rados.rados_buffer_free: fn(*mut c_char);
    rbd.rbd_open: fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int;
    rbd.rbd_close: fn(ImageT) -> c_int;
    rbd.rbd_create2: fn(IoctxT, *const c_char, u64, u64, *mut c_int) -> c_int;
    rbd.rbd_get_size: fn(ImageT, *mut u64) -> c_int;
    rbd.rbd_get_id: fn(ImageT, *mut c_char, usize) -> c_int;
    rbd.rbd_resize: fn(ImageT, u64) -> c_int;
    rbd.rbd_aio_create_completion: fn(*mut c_void, RbdCallback, *mut CompletionT) -> c_int;
    rbd.rbd_aio_get_return_value: fn(CompletionT) -> isize;
    rbd.rbd_aio_release: fn(CompletionT);
    rbd.rbd_aio_read: fn(ImageT, u64, usize, *mut c_char, CompletionT) -> c_int;
    rbd.rbd_aio_write: fn(ImageT, u64, usize, *const c_char, CompletionT) -> c_int;
    rbd.rbd_aio_flush: fn(ImageT, CompletionT) -> c_int;
    rbd.rbd_aio_discard: fn(ImageT, u64, u64, CompletionT) -> c_int;
    rbd.rbd_aio_writesame: fn(ImageT, u64, usize, *const c_char, usize, CompletionT, c_int) -> c_int;
    rbd.rbd_aio_compare_and_write: fn(ImageT, u64, usize, *const c_char, *const c_char, CompletionT, *mut u64, c_int) -> isize;
    rbd.rbd_diff_iterate2: fn(ImageT, *const c_char, u64, u64, u8, u8, DiffCallback, *mut c_void) -> c_int;
    rbd.rbd_update_watch: fn(ImageT, *mut u64, RbdUpdateCallback, *mut c_void) -> c_int;
    rbd.rbd_update_unwatch: fn(ImageT, u64) -> c_int;
    rbd.rbd_metadata_get: fn(ImageT, *const c_char, *mut c_char, *mut usize) -> c_int;
    rbd.rbd_metadata_set: fn(ImageT, *const c_char, *const c_char) -> c_int;
}

static LIB: OnceLock<Arc<Lib>> = OnceLock::new();

impl Lib {
    /// The process's function table, loading librbd and librados on first
    /// use (a failed load is retried on the next call: the package may have
    /// been installed meanwhile).
    pub(crate) fn get() -> Result<Arc<Lib>, RbdError> {
        if let Some(lib) = LIB.get() {
            return Ok(lib.clone());
        }
        let lib = Arc::new(Lib::load(LIBRBD, LIBRADOS)?);
        Ok(LIB.get_or_init(|| lib).clone())
    }

    /// Load the two libraries by these names (tests name missing ones).
    pub(crate) fn load(rbd_name: &str, rados_name: &str) -> Result<Lib, RbdError> {
        // SAFETY: loading runs the library's initialisers; librbd and
        // librados are ordinary shared libraries whose initialisers have no
        // preconditions on the caller.
        let rbd = unsafe { libloading::Library::new(rbd_name) }.map_err(|e| {
            RbdError::LibraryMissing {
                what: "librbd",
                library: rbd_name.to_string(),
                package: "librbd1",
                cause: e.to_string(),
            }
        })?;
        // SAFETY: as above; librbd has already pulled librados in, so this
        // only takes another reference to it.
        let rados = unsafe { libloading::Library::new(rados_name) }.map_err(|e| {
            RbdError::LibraryMissing {
                what: "librados",
                library: rados_name.to_string(),
                package: "librados2",
                cause: e.to_string(),
            }
        })?;
        Lib::resolve(rbd, rados, rbd_name, rados_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_says_which_package_to_install() {
        let e = match Lib::load("librbd-that-does-not-exist.so.1", LIBRADOS) {
            Err(e) => e,
            Ok(_) => panic!("loaded a library that does not exist"),
        };
        let msg = e.to_string();
        assert!(msg.contains("librbd is not installed"), "{msg}");
        assert!(msg.contains("apt-get install librbd1"), "{msg}");
        assert!(msg.contains("librbd-that-does-not-exist.so.1"), "{msg}");
    }
}
