//! A Ceph RBD image as an ethersan [`BlockDevice`](ethersan_backend::BlockDevice),
//! through librbd and librados **loaded at run time**.
//!
//! # Nothing is linked at build time
//!
//! The crate declares the few C functions it uses itself (`ffi`) and
//! resolves them with `libloading` from `librbd.so.1` and `librados.so.2`
//! the first time an image is opened; the table is kept for the life of
//! the process. Building needs no Ceph headers or libraries, and a server
//! without them runs fine until an `rbd:` store is configured, which then
//! fails with "librbd is not installed … install the package librbd1
//! (apt-get install librbd1)". The declarations follow Ceph Pacific (16.2)
//! and are unchanged in later releases.
//!
//! # Specs
//!
//! [`RbdSpec::parse`] reads the text after `rbd:`:
//! `POOL/IMAGE[:SIZE][,conf=PATH][,id=USER][,keyring=PATH][,timeout=SECS]`.
//! With a size the image is created when missing (features layering,
//! exclusive-lock, object-map, fast-diff, deep-flatten: the Pacific
//! defaults); an existing image is used at its own size.
//!
//! # How operations map to librbd
//!
//! | [`BlockDevice`](ethersan_backend::BlockDevice) | librbd / librados |
//! | --- | --- |
//! | `submit` READ / WRITE / flush | `rbd_aio_read` / `rbd_aio_write` / `rbd_aio_flush`, answered `Pending`; the completion callback (a librbd thread) calls the `IoCompletion` |
//! | `unmap` | `rbd_aio_discard`, waited for (partial-object discards zero the range: `rbd_skip_partial_discard = false`) |
//! | `lba_status` | `rbd_diff_iterate2` from no snapshot (allocated extents of the head, parent included) |
//! | `write_same` | `rbd_aio_writesame` (in chunks of at most 1 GiB) |
//! | `compare_and_write` | `rbd_aio_compare_and_write`; `-EILSEQ` and `mismatch_off` give the first differing byte. Pacific refuses (EINVAL) any range beyond one 512-byte sector: that is an error, never a non-atomic fallback |
//! | `num_blocks` / `refresh_size` / `resize` | an atomic / `rbd_get_size` / `rbd_resize` (grow only) |
//! | `watch_size` | `rbd_update_watch` (unwatched when the device is dropped) |
//! | `shared` | [`RadosShared`]: RADOS objects `ethersan.<image id>.<name>`, compare-and-swap with object versions, `rados_watch2` / `rados_notify2` |
//!
//! Errors keep librbd's errno (`io::Error::from_raw_os_error`), so that
//! ETIMEDOUT, ENOSPC or EIO reach the SCSI layer unchanged.
//!
//! # Durability
//!
//! The librbd cache is turned off (`rbd_cache = false`): librbd
//! acknowledges a write only when the OSDs of every replica have committed
//! it, so an acknowledged write is in the cluster and survives a gateway
//! crash. A FUA write therefore needs nothing more than the write itself,
//! and a flush (`rbd_aio_flush`) only waits for writes in flight.
//!
//! # Timeouts
//!
//! The spec's timeout (20 s by default) is set as `rados_osd_op_timeout`,
//! `rados_mon_op_timeout` and `client_mount_timeout`: connecting to an
//! unreachable cluster fails after it, and an I/O the cluster cannot serve
//! (OSDs down) completes with ETIMEDOUT instead of waiting forever. The
//! same bounds let dropping a device (closing the image, shutting the
//! client down) return when the cluster is gone.
//!
//! # Several gateways on one image
//!
//! Images are created with exclusive-lock. When two gateways write to one
//! image, librbd passes the lock back and forth between them
//! transparently: every write is correct, but each hand-over costs round
//! trips, so interleaved writes from two gateways are much slower than
//! from one. Active/passive (ALUA) use keeps the lock in one place.
//! State the gateways must agree on (reservations, port groups, identity)
//! lives in [`RadosShared`]; the `identity` blob is mirrored into the
//! image metadata key `ethersan.identity` for people to read.
//!
//! # Connections
//!
//! Every [`RbdDevice`] has its own RADOS client connection (`rados_t`, in
//! an `Arc` shared by the image and its [`RadosShared`], shut down when
//! both are gone). One connection per device costs a few threads and
//! sockets, and in return each device is a client of its own in the
//! cluster: watch notices tell devices apart by client id, so two devices
//! in one process behave as two gateways.
#![warn(missing_docs, unreachable_pub)]

use std::io;

mod callback;
mod cluster;
mod device;
mod ffi;
mod image;
mod shared;
mod spec;

pub use device::RbdDevice;
pub use shared::{RadosShared, IDENTITY_METADATA_KEY};
pub use spec::{RbdSpec, SpecError, DEFAULT_TIMEOUT};

use ethersan_backend::BackendError;

/// Why an RBD image could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum RbdError {
    /// librbd or librados cannot be loaded.
    #[error("{what} is not installed ({library}: {cause}): install the package {package} (apt-get install {package})")]
    LibraryMissing {
        /// "librbd" or "librados".
        what: &'static str,
        /// The file name tried.
        library: String,
        /// The Debian package that provides it.
        package: &'static str,
        /// The loader's message.
        cause: String,
    },
    /// The library lacks a function this crate needs.
    #[error("{library} has no function {symbol} ({cause}): it is too old; install librbd1 and librados2 16.2 (Pacific) or newer")]
    Symbol {
        /// The library file name.
        library: String,
        /// The missing function.
        symbol: &'static str,
        /// The loader's message.
        cause: String,
    },
    /// The Ceph configuration file cannot be read.
    #[error(
        "cannot read the Ceph configuration {path}: {cause}; check the conf= path of the rbd spec"
    )]
    Conf {
        /// The path given.
        path: String,
        /// The error.
        cause: io::Error,
    },
    /// The cluster cannot be reached or refused the client.
    #[error("cannot connect to the Ceph cluster of {cluster}: {cause}; check that its monitors are up and reachable and that id= and keyring= name a valid cephx user")]
    Connect {
        /// The conf file and monitor addresses.
        cluster: String,
        /// The error.
        cause: io::Error,
    },
    /// The pool cannot be opened.
    #[error("cannot open the Ceph pool {pool}: {cause}; name an existing pool or create it (ceph osd pool create {pool}; rbd pool init {pool})")]
    Pool {
        /// The pool.
        pool: String,
        /// The error.
        cause: io::Error,
    },
    /// The image does not exist and no size was given to create it.
    #[error("the RBD image {pool}/{image} does not exist: give a size to create it (rbd:{pool}/{image}:SIZE, for example rbd:{pool}/{image}:10G) or create it with rbd create")]
    ImageMissing {
        /// The pool.
        pool: String,
        /// The image.
        image: String,
    },
    /// Creating the image failed.
    #[error("cannot create the RBD image {pool}/{image}: {cause}")]
    Create {
        /// The pool.
        pool: String,
        /// The image.
        image: String,
        /// The error.
        cause: io::Error,
    },
    /// Opening the image failed.
    #[error("cannot open the RBD image {pool}/{image}: {cause}")]
    Open {
        /// The pool.
        pool: String,
        /// The image.
        image: String,
        /// The error.
        cause: io::Error,
    },
    /// Another operation on the image failed.
    #[error("{what} failed: {cause}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        cause: io::Error,
    },
    /// A parameter is unusable (the message says which and why).
    #[error("{0}")]
    Invalid(String),
    /// The spec text is malformed.
    #[error(transparent)]
    Spec(#[from] SpecError),
}

impl From<RbdError> for BackendError {
    fn from(e: RbdError) -> BackendError {
        BackendError::Config(e.to_string())
    }
}
