//! SAM-5 §5.14: unit attention conditions, one queue per I_T nexus.
//!
//! Every command (except INQUIRY, REPORT LUNS and REQUEST SENSE) first asks
//! whether its nexus has a unit attention pending. That question must be
//! cheap on the READ/WRITE path, so an atomic flag says whether *any* queue
//! is non-empty; only when it is set is the mutex taken.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::sense::Sense;
use crate::Nexus;

/// Most conditions kept per nexus; further ones are dropped (SAM-5 lets a
/// device report only the most important ones).
const MAX_QUEUED: usize = 16;

#[derive(Debug, Default)]
struct Queues {
    /// Pending conditions, oldest first.
    pending: HashMap<Nexus, VecDeque<Sense>>,
    /// Every nexus that has logged in to this logical unit's target.
    known: HashSet<Nexus>,
}

/// The unit attention queues of one logical unit.
#[derive(Debug, Default)]
pub(crate) struct UnitAttentions {
    queues: Mutex<Queues>,
    /// Some queue is non-empty.
    any: AtomicBool,
}

impl UnitAttentions {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, q: &mut Queues, nexus: Nexus, s: Sense) {
        let queue = q.pending.entry(nexus).or_default();
        if !queue.contains(&s) && queue.len() < MAX_QUEUED {
            queue.push_back(s);
        }
        self.any.store(true, Ordering::Release);
    }

    /// Remember `nexus`; returns whether it is new.
    pub(crate) fn register(&self, nexus: Nexus) -> bool {
        self.lock().known.insert(nexus)
    }

    /// Queue `s` for one nexus.
    pub(crate) fn raise(&self, nexus: Nexus, s: Sense) {
        let mut q = self.lock();
        self.push(&mut q, nexus, s);
    }

    /// Queue `s` for every known nexus, optionally except one.
    pub(crate) fn raise_all(&self, s: Sense, except: Option<Nexus>) {
        let mut q = self.lock();
        let targets: Vec<Nexus> = q
            .known
            .iter()
            .copied()
            .filter(|n| Some(*n) != except)
            .collect();
        for n in targets {
            self.push(&mut q, n, s);
        }
    }

    /// Whether any nexus has a condition pending (lock-free).
    pub(crate) fn any_pending(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Report and clear the oldest condition of `nexus`.
    pub(crate) fn take(&self, nexus: Nexus) -> Option<Sense> {
        if !self.any_pending() {
            return None;
        }
        let mut q = self.lock();
        let s = q
            .pending
            .get_mut(&nexus)
            .and_then(|queue| queue.pop_front());
        q.pending.retain(|_, queue| !queue.is_empty());
        if q.pending.is_empty() {
            self.any.store(false, Ordering::Release);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::codes;

    #[test]
    fn queues_are_per_nexus_and_deduplicated() {
        let ua = UnitAttentions::default();
        let (a, b) = (Nexus(1), Nexus(2));
        assert!(ua.register(a));
        assert!(ua.register(b));
        assert!(!ua.register(a));
        assert!(!ua.any_pending());
        ua.raise_all(codes::MODE_PARAMETERS_CHANGED, Some(a));
        ua.raise(b, codes::MODE_PARAMETERS_CHANGED);
        ua.raise(b, codes::LUN_RESET);
        assert!(ua.any_pending());
        assert_eq!(ua.take(a), None);
        assert_eq!(ua.take(b), Some(codes::MODE_PARAMETERS_CHANGED));
        assert_eq!(ua.take(b), Some(codes::LUN_RESET));
        assert_eq!(ua.take(b), None);
        assert!(!ua.any_pending());
    }

    #[test]
    fn queue_is_bounded() {
        let ua = UnitAttentions::default();
        for i in 0..100u8 {
            ua.raise(Nexus(7), Sense::new(6, 0x2a, i));
        }
        let mut n = 0;
        while ua.take(Nexus(7)).is_some() {
            n += 1;
        }
        assert_eq!(n, MAX_QUEUED);
    }
}

#[cfg(test)]
mod lu_tests {
    use crate::disk::testing::*;
    use crate::sense::key;
    use crate::{Nexus, ResetKind};

    const TUR: [u8; 6] = [0, 0, 0, 0, 0, 0];

    #[test]
    fn a_new_nexus_sees_power_on_once_and_exempt_commands_keep_it() {
        let (t, _) = target(512);
        let c = Nexus(3);
        t.nexus_added(c);
        // INQUIRY, REPORT LUNS neither report nor clear it.
        good(exec(&t, c, &[0x12, 0, 0, 0, 36, 0], &[]));
        good(exec(&t, c, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0], &[]));
        check(
            &exec(&t, c, &cdb10(0x28, 0, 0, 1), &[]),
            key::UNIT_ATTENTION,
            0x29,
            0x00,
        );
        good(exec(&t, c, &TUR, &[]));
        // The others are untouched; adding the same nexus again raises nothing.
        good(exec(&t, A, &TUR, &[]));
        t.nexus_added(c);
        good(exec(&t, c, &TUR, &[]));
    }

    #[test]
    fn resets_raise_the_sam_codes() {
        for (kind, ascq) in [
            (ResetKind::LogicalUnit, 0x03),
            (ResetKind::TargetWarm, 0x03),
            (ResetKind::TargetCold, 0x00),
        ] {
            let (t, _) = target(4096);
            t.reset(
                kind,
                if kind == ResetKind::LogicalUnit {
                    Some(0)
                } else {
                    None
                },
                A,
            );
            for n in [A, B] {
                check(&exec(&t, n, &TUR, &[]), key::UNIT_ATTENTION, 0x29, ascq);
                good(exec(&t, n, &TUR, &[]));
            }
        }
        // A reset of another LUN leaves this one alone.
        let (t, _) = target(512);
        t.reset(ResetKind::LogicalUnit, Some(5), A);
        good(exec(&t, A, &TUR, &[]));
    }

    #[test]
    fn nexus_loss_and_cleared_tasks() {
        let (t, _) = target(512);
        t.nexus_lost(B);
        t.nexus_added(B);
        check(&exec(&t, B, &TUR, &[]), key::UNIT_ATTENTION, 0x29, 0x07);
        t.tasks_cleared(0, B, A);
        check(&exec(&t, B, &TUR, &[]), key::UNIT_ATTENTION, 0x2f, 0x00);
        // Clearing one's own tasks is no news.
        t.tasks_cleared(0, A, A);
        good(exec(&t, A, &TUR, &[]));
    }
}
