//! Placed Data-Out (native transport, docs/native-transport.md "iSCSI over
//! the channel"): a write's buffer is registered with the channel under
//! the task's ITT before the first R2T asks for data, the initiator places
//! the solicited data straight into it and sends each Data-Out as its
//! header alone, and the session takes the buffer back when the transfer
//! is complete — checking that every range the headers announced landed.
//! Unsolicited data (immediate data, the first burst) still comes in
//! messages; arriving after the registration, it is copied in
//! ([`Output::Place`]).

use ethersan_core::executor::check_condition;
use ethersan_endpoint::PlacedBuf;
use ethersan_scsi::IoBuf;
use tracing::warn;

use super::{Output, Session};

impl Session {
    /// Before the first R2T of task `itt`: hand its buffer (the whole
    /// expected length, what arrived so far at its start) to the channel,
    /// when this session places writes.
    pub(super) fn register_write(&mut self, itt: u32) {
        if !self.setup.placed_writes || self.setup.params.data_digest {
            return;
        }
        let Some(task) = self.tasks.get_mut(itt) else {
            return;
        };
        if task.placed.is_some() || task.fail.is_some() {
            return;
        }
        // Not zeroed: the rest of the buffer is readable only where data
        // lands (see `on_reclaimed`).
        let len = task.cmd.expected_len as usize;
        // Aligned, with room for the whole write, so that it stays where
        // it lands (a plain buffer moves here once, before any data is
        // placed in it).
        let mut prefix = std::mem::take(&mut task.data);
        if !prefix.is_aligned() {
            let mut b = IoBuf::aligned_with_capacity(len);
            b.extend_from_slice(&prefix);
            prefix = b;
        }
        prefix.reserve_total(len);
        task.placed = Some(Vec::new());
        self.outputs.push_back(Output::Expect { itt, prefix, len });
    }

    /// The data of one accepted Data-Out of a registered task: a placed
    /// one's range is noted, a message's data copied into the registered
    /// buffer.
    pub(super) fn placed_data_out(
        &mut self,
        itt: u32,
        offset: u32,
        data: Vec<u8>,
        placed_len: Option<u32>,
    ) {
        let Some(task) = self.tasks.get_mut(itt) else {
            return;
        };
        let Some(ranges) = &mut task.placed else {
            return;
        };
        match placed_len {
            Some(len) => ranges.push((offset, len)),
            None if !data.is_empty() => self.outputs.push_back(Output::Place { itt, offset, data }),
            None => {}
        }
    }

    /// Task `itt` no longer collects data into its registration (failed or
    /// aborted): drop it, so late placed frames are dropped too.
    pub(super) fn forget_write(&mut self, itt: u32) {
        if let Some(task) = self.tasks.get_mut(itt) {
            if task.placed.take().is_some() {
                self.outputs.push_back(Output::Forget(itt));
            }
        }
    }

    /// The buffer of task `itt`, taken back from the channel once its
    /// last Data-Out arrived (every placed frame before it has landed):
    /// it becomes the command's data if every announced range is in it.
    pub(super) fn on_reclaimed(&mut self, itt: u32, placed: Option<PlacedBuf>) {
        let Some(task) = self.tasks.get_mut(itt) else {
            // Aborted meanwhile: the buffer goes with it.
            return;
        };
        let Some(announced) = task.placed.take() else {
            return;
        };
        let gap = match &placed {
            None => Some("its buffer was gone".to_string()),
            Some(p) => first_gap(&announced, p)
                .map(|(s, e)| format!("the initiator announced bytes {s}..{e} that never arrived"))
                .or_else(|| {
                    // Immediate data, Data-Out messages and placed frames
                    // together must fill the buffer: it was not zeroed.
                    let len = p.len() as u64;
                    (!p.covers(len)).then(|| {
                        let (s, e) = first_hole(p.ranges(), len);
                        format!("no data for bytes {s}..{e} of {len}")
                    })
                }),
        };
        match (gap, placed) {
            (None, Some(p)) => {
                if task.fail.is_none() {
                    let len = p.len();
                    task.data = p
                        .into_parts(len)
                        .map(|(v, start)| IoBuf::from_parts(v, start))
                        .unwrap_or_default();
                }
            }
            (gap, _) => {
                let gap = gap.unwrap_or_default();
                warn!(
                    session = self.setup.id,
                    itt, "placed Data-Out incomplete: {gap}; failing the command"
                );
                // ABORTED COMMAND / DATA PHASE ERROR.
                task.fail = Some(check_condition(0x0b, 0x4b, 0x00));
            }
        }
        self.tasks.set_data_ready(itt);
        self.dispatch();
    }
}

/// The first bytes `[start, end)` of `[0, len)` that `ranges` (sorted,
/// merged) leave out.
fn first_hole(ranges: &[(u64, u64)], len: u64) -> (u64, u64) {
    let mut at = 0;
    for &(s, e) in ranges {
        if s > at {
            return (at, s.min(len));
        }
        at = at.max(e);
    }
    (at, len)
}

/// The first range `(offset, len)` of `announced` that has not wholly
/// landed in `placed`, as `(start, end)`.
fn first_gap(announced: &[(u32, u32)], placed: &PlacedBuf) -> Option<(u64, u64)> {
    announced.iter().find_map(|&(o, l)| {
        let (s, e) = (u64::from(o), u64::from(o) + u64::from(l));
        let landed = placed.ranges().iter().any(|&(a, b)| a <= s && e <= b);
        (!landed).then_some((s, e))
    })
}
