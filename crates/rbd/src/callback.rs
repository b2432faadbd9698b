//! Whether this thread is inside a librbd/librados callback.
//!
//! A completion or a change handler may drop the last reference to a
//! device or its shared state (a LUN removed while its I/O is in flight).
//! Closing the image (`rbd_close` waits for the image's work) or flushing
//! watches (`rados_watch_flush` waits for running callbacks) from such a
//! callback would wait for itself; the `Drop` impls ask [`inside`] and hand
//! that teardown to a thread of its own instead.

use std::cell::Cell;

thread_local! {
    static INSIDE: Cell<u32> = const { Cell::new(0) };
}

/// Marks the current thread as running a librbd/librados callback until
/// dropped.
pub(crate) struct Inside;

impl Inside {
    /// Enter a callback.
    pub(crate) fn enter() -> Inside {
        INSIDE.with(|c| c.set(c.get() + 1));
        Inside
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Whether the current thread is running a librbd/librados callback.
pub(crate) fn inside() -> bool {
    INSIDE.with(|c| c.get() > 0)
}

/// Run `teardown` here, or on a new thread when inside a callback (where
/// it could wait for the callback itself).
pub(crate) fn teardown(what: &str, teardown: impl FnOnce() + Send + 'static) {
    if !inside() {
        teardown();
        return;
    }
    let spawned = std::thread::Builder::new()
        .name(format!("rbd-close-{what}"))
        .spawn(teardown);
    if let Err(e) = spawned {
        // Leaking beats deadlocking: the handles stay open until exit.
        tracing::error!("cannot start a thread to close {what}: {e}; leaving it open");
    }
}
