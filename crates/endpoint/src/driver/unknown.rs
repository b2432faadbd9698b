//! The endpoint's answers to frames for channels it does not have open:
//! a closed channel that lingers answers its peer's CLOSE; a target
//! answers any other channel frame with an authenticated stateless RESET
//! (rate-limited, never larger than the frame); an initiator fails the
//! channel an authentic RESET names (docs/native-transport.md §Stateless
//! reset).

use std::time::{Duration, Instant};

use ethersan_channel::reset;
use tracing::{debug, info, trace};

use super::{Driver, RESETS_PER_SECOND, RESET_PEERS};
use crate::medium::PeerAddr;
use crate::Role;

impl Driver {
    /// A frame for a channel that is not open: a closed one that still
    /// lingers answers a CLOSE with CLOSE-REPLY.
    pub(super) fn on_lingering_frame(
        &mut self,
        now: Instant,
        peer: PeerAddr,
        dst: u32,
        frame: &mut [u8],
    ) {
        let Some(l) = self.lingering.get_mut(&dst).filter(|l| l.peer == peer) else {
            trace!(%peer, dst, "frame for no channel");
            self.send_reset(now, peer, dst, frame.len());
            return;
        };
        if l.ch.handle_frame(now, frame).is_err() {
            return;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        if l.ch
            .poll_transmit_after(now, &mut buf, self.medium.headroom())
        {
            self.outbox.push((peer, buf));
        } else {
            self.spare.push(buf);
        }
    }

    /// A target answers a channel frame for a channel it does not know
    /// with a RESET, at most [`RESETS_PER_SECOND`] per peer, never larger
    /// than the frame.
    pub(super) fn send_reset(&mut self, now: Instant, peer: PeerAddr, dst: u32, len: usize) {
        if !matches!(self.role, Role::Target { .. }) {
            return;
        }
        if self.resets.len() >= RESET_PEERS && !self.resets.contains_key(&peer) {
            self.resets
                .retain(|_, (since, _)| now.duration_since(*since) < Duration::from_secs(1));
            if self.resets.len() >= RESET_PEERS {
                return;
            }
        }
        let (since, n) = self.resets.entry(peer).or_insert((now, 0));
        if now.duration_since(*since) >= Duration::from_secs(1) {
            (*since, *n) = (now, 0);
        }
        if *n >= RESETS_PER_SECOND {
            return;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.resize(self.medium.headroom(), 0);
        if reset::write(&self.cfg.group, dst, len, &mut buf) {
            *n += 1;
            debug!(%peer, channel = dst, "RESET for an unknown channel");
            self.outbox.push((peer, buf));
        } else {
            self.spare.push(buf);
        }
    }

    /// An initiator's channel to `peer` whose target side was the id an
    /// authentic RESET names fails at once, once the target has answered
    /// on it.
    pub(super) fn on_reset(&mut self, peer: PeerAddr, frame: &[u8]) {
        if !matches!(self.role, Role::Initiator) {
            return;
        }
        let Some(id) = reset::check(&self.cfg.group, frame) else {
            debug!(%peer, "RESET with a wrong token ignored");
            return;
        };
        for c in self.channels.values_mut() {
            // Until the target has answered, its not knowing the channel
            // only means the HELLO_FINISH was lost (it is resent): the
            // RESET says nothing then.
            if c.info.peer == peer && c.info.peer_id == id && c.finish.is_none() {
                info!(%peer, channel = c.info.local_id, "the target no longer knows this channel");
                c.ch.reset();
            }
        }
    }
}
