//! State that several servers exporting the same store share.
//!
//! A store that lives in a cluster (Ceph RBD) may be exported by several
//! ethersan gateways at once. What the SCSI layer keeps about a logical
//! unit beyond its blocks — persistent reservations, ALUA target port
//! groups, the unit's identity — must then be one state for all of them.
//! [`SharedState`] is that state as named, versioned blobs with
//! compare-and-swap updates and change notices; a local store has none
//! ([`crate::BlockDevice::shared`] answers `None`).
//!
//! [`MemoryShared`] keeps the blobs in memory, for tests that put two
//! "gateways" (two logical units) over one store in one process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::BackendError;

/// A blob and its version; version 0 means the blob does not exist yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Versioned {
    /// The bytes (empty when absent).
    pub data: Vec<u8>,
    /// Changes at every successful [`SharedState::store`]; 0: absent.
    pub version: u64,
}

/// Called when another server changed a blob (see [`SharedState::subscribe`]).
pub type ChangeHandler = Arc<dyn Fn() + Send + Sync>;

/// Named blobs shared by every server exporting one store (see the module
/// documentation). Calls block (they may go to the cluster): use them
/// where blocking is fine, never on the READ/WRITE path.
pub trait SharedState: Send + Sync + std::fmt::Debug {
    /// Read blob `name` and its version.
    fn load(&self, name: &str) -> Result<Versioned, BackendError>;
    /// Replace blob `name` with `data` if its version is still `expected`
    /// (0: create it only if it does not exist). `Ok(Some(v))`: stored,
    /// `v` is the new version; `Ok(None)`: someone changed it first —
    /// load it again, reapply the change and retry.
    fn store(&self, name: &str, data: &[u8], expected: u64) -> Result<Option<u64>, BackendError>;
    /// Call `on_change` whenever another server [`publish`](Self::publish)es
    /// a change of blob `name` (from a thread of the implementation; it
    /// should be quick or hand the work off).
    fn subscribe(&self, name: &str, on_change: ChangeHandler) -> Result<(), BackendError>;
    /// Tell every other subscriber of `name` that it changed, and wait
    /// (bounded) until they have run their handlers, so that when this
    /// returns the others act on the new state.
    fn publish(&self, name: &str) -> Result<(), BackendError>;
    /// A short description of where the state lives (for logs).
    fn describe(&self) -> String;
}

#[derive(Default)]
struct MemoryInner {
    blobs: HashMap<String, Versioned>,
    next_version: u64,
    /// (handle id, blob name, handler)
    subscribers: Vec<(u64, String, ChangeHandler)>,
    next_handle: u64,
}

/// In-memory [`SharedState`]: every handle made by [`MemoryShared::handle`]
/// is one "server"; a publish runs the handlers of the other handles,
/// synchronously.
#[derive(Clone)]
pub struct MemoryShared {
    inner: Arc<Mutex<MemoryInner>>,
    id: u64,
}

impl std::fmt::Debug for MemoryShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryShared")
            .field("id", &self.id)
            .finish()
    }
}

impl Default for MemoryShared {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryShared {
    /// A new, empty state with its first handle.
    pub fn new() -> MemoryShared {
        let inner = Arc::new(Mutex::new(MemoryInner::default()));
        let id = {
            let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
            g.next_handle += 1;
            g.next_handle
        };
        MemoryShared { inner, id }
    }

    /// Another handle on the same state: another "server".
    pub fn handle(&self) -> MemoryShared {
        let mut g = self.lock();
        g.next_handle += 1;
        MemoryShared {
            inner: self.inner.clone(),
            id: g.next_handle,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SharedState for MemoryShared {
    fn load(&self, name: &str) -> Result<Versioned, BackendError> {
        Ok(self.lock().blobs.get(name).cloned().unwrap_or_default())
    }

    fn store(&self, name: &str, data: &[u8], expected: u64) -> Result<Option<u64>, BackendError> {
        let mut g = self.lock();
        let current = g.blobs.get(name).map_or(0, |b| b.version);
        if current != expected {
            return Ok(None);
        }
        g.next_version += 1;
        let version = g.next_version;
        g.blobs.insert(
            name.to_string(),
            Versioned {
                data: data.to_vec(),
                version,
            },
        );
        Ok(Some(version))
    }

    fn subscribe(&self, name: &str, on_change: ChangeHandler) -> Result<(), BackendError> {
        let id = self.id;
        self.lock()
            .subscribers
            .push((id, name.to_string(), on_change));
        Ok(())
    }

    fn publish(&self, name: &str) -> Result<(), BackendError> {
        let handlers: Vec<ChangeHandler> = self
            .lock()
            .subscribers
            .iter()
            .filter(|(id, n, _)| *id != self.id && n == name)
            .map(|(_, _, h)| h.clone())
            .collect();
        for h in handlers {
            h();
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("memory (handle {})", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn compare_and_swap_and_notices() {
        let a = MemoryShared::new();
        let b = a.handle();
        assert_eq!(a.load("pr").unwrap().version, 0);
        let v1 = a.store("pr", b"one", 0).unwrap().unwrap();
        assert_eq!(
            b.store("pr", b"two", 0).unwrap(),
            None,
            "create over an existing blob"
        );
        let v2 = b.store("pr", b"two", v1).unwrap().unwrap();
        assert_eq!(a.store("pr", b"three", v1).unwrap(), None, "stale version");
        assert_eq!(
            a.load("pr").unwrap(),
            Versioned {
                data: b"two".to_vec(),
                version: v2
            }
        );
        let seen = Arc::new(AtomicUsize::new(0));
        let s = seen.clone();
        a.subscribe(
            "pr",
            Arc::new(move || {
                s.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
        a.publish("pr").unwrap();
        assert_eq!(
            seen.load(Ordering::SeqCst),
            0,
            "a publisher is not told of its own change"
        );
        b.publish("alua").unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 0, "another blob's notice");
        b.publish("pr").unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }
}
