//! The endpoint's task: the one owner of every channel, handshake and
//! discovery of a medium. It selects between received frames, commands
//! from the stream halves and the API, and the earliest timer; applies
//! each to the protocol core; then sends what the core wants sent, as one
//! batch (the shape of Crucible's upstairs loop).

// Keys the endpoint chooses itself (channel ids, tags, nonces): a fast
// hash without DoS resistance; maps keyed by what a peer sends use std's.
use bytes::Bytes;
use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ethersan_channel::channel::{Channel, ChannelConfig, ChannelState, ChannelStats};
use ethersan_channel::discovery::{self, Catalog, DiscoveryResponder, ReplyPart};
use ethersan_channel::frame::{FrameError, Kind, Prefix};
use ethersan_channel::handshake::{Established, InitiatorHandshake, Responder};
use ethersan_channel::protect::Protector;
use ethersan_channel::Level;
use tokio::sync::{mpsc, oneshot, Notify};
use tracing::{debug, info, trace, warn};

use crate::medium::{Inbox, Medium, PeerAddr};
use crate::stream::{ChannelReader, ChannelStream, ChannelWriter, Shared, RECV_BUDGET};
use crate::{Accepted, ChannelInfo, Command, EndpointConfig, EndpointError, Role};

/// Most frames one channel sends per round before the others get a turn.
const FRAMES_PER_ROUND: usize = 512;
/// First interval between HELLO retransmissions (doubling to a second).
const HELLO_RESEND: Duration = Duration::from_millis(200);
/// How often an initiator resends HELLO_FINISH until the target answers.
const FINISH_RESEND: Duration = Duration::from_millis(200);
/// How long a channel that closed still answers its peer's CLOSE (the
/// peer's copies of a burst, or a CLOSE resent because our reply was
/// lost), so that the peer ends at once instead of after its timeout.
const LINGER: Duration = Duration::from_secs(1);

/// Most RESET frames a target sends one peer per second.
const RESETS_PER_SECOND: u32 = 10;
/// Most peers whose RESET count a target keeps (beyond, the counts start
/// over: the limit per peer then holds per round of the table).
const RESET_PEERS: usize = 4096;

/// A closed channel kept for [`LINGER`]: it holds no application state,
/// only what answers CLOSE with CLOSE-REPLY.
struct Lingering {
    ch: Channel,
    peer: PeerAddr,
    until: Instant,
}

struct Chan {
    ch: Channel,
    info: ChannelInfo,
    to_app: Option<mpsc::UnboundedSender<Vec<u8>>>,
    shared: Arc<Shared>,
    /// Bytes the writer handed over, and how many of them have been
    /// released back to it as acknowledged.
    written: usize,
    released: usize,
    /// Initiator side: HELLO_FINISH, resent until the target answers.
    finish: Option<(Vec<u8>, Instant)>,
    closing: bool,
}

struct Connecting {
    hs: InitiatorHandshake,
    peer: PeerAddr,
    level: Level,
    reply: oneshot::Sender<Result<ChannelStream, EndpointError>>,
    resend_at: Instant,
    interval: Duration,
    deadline: Instant,
}

pub(crate) struct Driver {
    medium: Medium,
    cfg: EndpointConfig,
    cmd_tx: mpsc::WeakUnboundedSender<Command>,
    cmd_rx: mpsc::UnboundedReceiver<Command>,
    channels: HashMap<u32, Chan>,
    lingering: HashMap<u32, Lingering>,
    /// RESET frames sent per peer in the current second.
    resets: std::collections::HashMap<PeerAddr, (Instant, u32)>,
    connecting: HashMap<u32, Connecting>,
    responder: Option<Responder>,
    discovery: Option<DiscoveryResponder>,
    role: Role,
    waiters: HashMap<[u8; 16], mpsc::UnboundedSender<(PeerAddr, ReplyPart)>>,
    outbox: Vec<(PeerAddr, Vec<u8>)>,
    /// Payloads sent from where they lie after their frame's header, by
    /// index into `outbox` (level `none` on UDP).
    tails: Vec<(usize, Vec<Bytes>)>,
    /// Emptied payload lists, kept for reuse.
    spare_tails: Vec<Vec<Bytes>>,
    /// A channel had more to send than one round takes.
    busy: bool,
    spare: Vec<Vec<u8>>,
    /// Woken by readers that drained their queue below half the budget.
    wake: Arc<Notify>,
}

impl Driver {
    pub(crate) fn new(
        medium: Medium,
        cfg: EndpointConfig,
        role: Role,
        cmd_tx: mpsc::WeakUnboundedSender<Command>,
        cmd_rx: mpsc::UnboundedReceiver<Command>,
    ) -> Driver {
        let (responder, discovery) = match &role {
            Role::Target { .. } => (
                Some(
                    Responder::new(cfg.group.clone(), cfg.max_half_open, cfg.handshake_timeout)
                        .with_suites(&cfg.suites),
                ),
                Some(DiscoveryResponder::new(cfg.group.clone())),
            ),
            Role::Initiator => (None, None),
        };
        Driver {
            medium,
            cfg,
            cmd_tx,
            cmd_rx,
            channels: HashMap::default(),
            lingering: HashMap::default(),
            resets: std::collections::HashMap::default(),
            connecting: HashMap::default(),
            responder,
            discovery,
            role,
            waiters: HashMap::default(),
            outbox: Vec::new(),
            tails: Vec::new(),
            spare_tails: Vec::new(),
            busy: false,
            spare: Vec::new(),
            wake: Arc::new(Notify::new()),
        }
    }

    /// Run until every handle and stream is gone and the channels have
    /// closed.
    pub(crate) async fn run(mut self) {
        let mut inbox = Inbox::default();
        let mut handles_open = true;
        loop {
            let deadline = self.next_deadline();
            tokio::select! {
                r = self.medium.recv_batch(&mut inbox) => {
                    if let Err(e) = r {
                        warn!(medium = %self.medium.local(), error = %e, "receiving failed; the endpoint stops");
                        break;
                    }
                    let now = Instant::now();
                    let medium = self.medium.clone();
                    let r = medium.deliver(&mut inbox, |peer, frame| self.on_frame(now, peer, frame));
                    if let Err(e) = r {
                        warn!(medium = %self.medium.local(), error = %e, "receiving failed; the endpoint stops");
                        break;
                    }
                }
                cmd = self.cmd_rx.recv(), if handles_open => {
                    match cmd {
                        Some(c) => {
                            self.on_command(c);
                            // Take what else is queued now, in one round.
                            for _ in 0..256 {
                                match self.cmd_rx.try_recv() {
                                    Ok(c) => self.on_command(c),
                                    Err(_) => break,
                                }
                            }
                        }
                        None => handles_open = false,
                    }
                }
                _ = self.wake.notified() => {}
                _ = sleep_until(deadline) => {}
            }
            let now = Instant::now();
            self.on_timers(now);
            self.pump(now);
            if !self.outbox.is_empty() {
                let r = self.medium.send_batch(&mut self.outbox, &self.tails).await;
                for (_, f) in self.outbox.drain(..) {
                    self.spare.push(f);
                }
                for (_, mut t) in self.tails.drain(..) {
                    t.clear();
                    self.spare_tails.push(t);
                }
                if let Err(e) = r {
                    warn!(medium = %self.medium.local(), error = %e, "sending failed");
                }
            }
            self.spare.truncate(1024);
            self.spare_tails.truncate(1024);
            if !handles_open && self.channels.is_empty() && self.connecting.is_empty() {
                break;
            }
        }
        for (_, c) in self.channels.drain() {
            c.shared.end(Some("the endpoint stopped".into()));
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        if self.busy {
            return Some(Instant::now());
        }
        let mut d: Option<Instant> = None;
        let mut take = |t: Option<Instant>| {
            if let Some(t) = t {
                d = Some(d.map_or(t, |d| d.min(t)));
            }
        };
        for c in self.channels.values() {
            take(c.ch.poll_timeout());
            take(c.finish.as_ref().map(|f| f.1));
        }
        for c in self.connecting.values() {
            take(Some(c.resend_at.min(c.deadline)));
        }
        if self.responder.is_some() {
            take(Some(Instant::now() + Duration::from_secs(1)));
        }
        d
    }

    fn on_frame(&mut self, now: Instant, peer: PeerAddr, frame: &mut [u8]) {
        let prefix = match Prefix::parse(frame) {
            Ok(p) => p,
            Err(e @ FrameError::BadVersion(_)) => {
                // A peer of another version: a HELLO_REPLY for one of our
                // connects ends it with the reason; anything else is logged.
                let dst = frame
                    .get(4..8)
                    .map(|d| u32::from_be_bytes([d[0], d[1], d[2], d[3]]));
                if frame.get(2) == Some(&Kind::HelloReply.to_u8()) {
                    if let Some(c) = dst.and_then(|d| self.connecting.remove(&d)) {
                        let _ = c.reply.send(Err(EndpointError::Handshake {
                            peer,
                            cause: e.to_string(),
                        }));
                        return;
                    }
                }
                warn!(%peer, error = %e, "frame of another native transport version dropped");
                return;
            }
            Err(_) => return,
        };
        match prefix.kind {
            Kind::Data | Kind::Ack | Kind::Close => {
                let Some(c) = self.channels.get_mut(&prefix.dst) else {
                    self.on_lingering_frame(now, peer, prefix.dst, frame);
                    return;
                };
                if c.info.peer != peer {
                    trace!(%peer, dst = prefix.dst, "frame from another peer");
                    return;
                }
                trace!(%peer, dst = prefix.dst, kind = ?prefix.kind, len = frame.len(), "frame in");
                let r =
                    c.ch.handle_frame_placing(now, frame, &mut c.shared.placements.placing());
                if tracing::enabled!(tracing::Level::TRACE) {
                    let s = c.ch.stats();
                    trace!(
                        window_drops = s.window_drops,
                        duplicates = s.duplicates,
                        in_flight = s.in_flight,
                        peer_credit = s.peer_credit,
                        cwnd = s.cwnd,
                        recv_buffered = c.ch.recv_buffered(),
                        send_buffered = c.ch.send_buffered(),
                        "after frame"
                    );
                }
                match r {
                    Ok(()) => {
                        // The target answered: the handshake is complete.
                        c.finish = None;
                    }
                    Err(e) => debug!(channel = prefix.dst, %peer, error = %e, "frame rejected"),
                }
            }
            Kind::Reset => self.on_reset(peer, frame),
            Kind::Hello => self.on_hello(now, peer, frame),
            Kind::HelloReply => self.on_hello_reply(now, peer, prefix.dst, frame),
            Kind::HelloFinish => self.on_finish(now, peer, frame),
            Kind::Discover => self.on_discover(peer, frame),
            Kind::DiscoverReply => {
                for (nonce, tx) in &self.waiters {
                    if let Ok(part) = discovery::open_reply(&self.cfg.group, nonce, frame) {
                        let _ = tx.send((peer, part));
                        break;
                    }
                }
            }
        }
    }

    /// Queues `frame` for `peer`, after the medium's headroom (the
    /// channels write theirs in place; this copy is for the rare handshake
    /// and discovery frames).
    fn push_out(&mut self, peer: PeerAddr, frame: &[u8]) {
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.resize(self.medium.headroom(), 0);
        buf.extend_from_slice(frame);
        self.outbox.push((peer, buf));
    }

    fn fresh_id(&self) -> u32 {
        loop {
            let id = fastrand::u32(1..);
            if !self.channels.contains_key(&id)
                && !self.connecting.contains_key(&id)
                && !self.lingering.contains_key(&id)
            {
                return id;
            }
        }
    }

    fn on_hello(&mut self, now: Instant, peer: PeerAddr, frame: &[u8]) {
        let id = self.fresh_id();
        let max_frame = self.medium.max_frame() as u32;
        let Some(r) = self.responder.as_mut() else {
            return;
        };
        match r.handle_hello(now, frame, id, max_frame) {
            Ok(o) => self.push_out(peer, &o.reply),
            // Silence: a non-member learns nothing.
            Err(e) => debug!(%peer, error = %e, "HELLO ignored"),
        }
    }

    fn on_finish(&mut self, now: Instant, peer: PeerAddr, frame: &[u8]) {
        let Some(r) = self.responder.as_mut() else {
            return;
        };
        match r.handle_finish(now, frame) {
            Ok(est) => {
                let level = est.level;
                let Some(stream) = self.open_channel(now, peer, est, None) else {
                    return;
                };
                info!(%peer, channel = stream.info.local_id, %level, max_frame = stream.info.max_frame, "channel opened");
                if let Role::Target { accept } = &self.role {
                    let id = stream.info.local_id;
                    if accept.try_send(Accepted { stream }).is_err() {
                        warn!(%peer, "too many channels waiting to be served; closing this one");
                        if let Some(c) = self.channels.get_mut(&id) {
                            c.ch.close();
                        }
                    }
                }
            }
            Err(e) => debug!(%peer, error = %e, "HELLO_FINISH ignored"),
        }
    }

    fn on_hello_reply(&mut self, now: Instant, peer: PeerAddr, dst: u32, frame: &[u8]) {
        let Some(c) = self.connecting.get_mut(&dst) else {
            return;
        };
        if c.peer != peer && !matches!(c.peer, PeerAddr::Mac(m) if m.is_broadcast()) {
            return;
        }
        match c.hs.handle_reply(frame) {
            Ok((finish, est)) => {
                let Some(c) = self.connecting.remove(&dst) else {
                    return;
                };
                let level = c.level;
                self.push_out(peer, &finish);
                match self.open_channel(now, peer, est, Some(finish)) {
                    Some(stream) => {
                        debug!(%peer, channel = dst, %level, "channel opened");
                        let _ = c.reply.send(Ok(stream));
                    }
                    None => {
                        let _ = c.reply.send(Err(EndpointError::Stopped));
                    }
                }
            }
            Err(e) => {
                let Some(c) = self.connecting.remove(&dst) else {
                    return;
                };
                let _ = c.reply.send(Err(EndpointError::Handshake {
                    peer,
                    cause: e.to_string(),
                }));
            }
        }
    }

    fn on_discover(&mut self, peer: PeerAddr, frame: &[u8]) {
        let Role::Target { .. } = &self.role else {
            return;
        };
        let Some(d) = self.discovery.as_mut() else {
            return;
        };
        let catalog: Catalog = (self.cfg.catalog)();
        match d.handle_query(frame, unix_ms(), &catalog, self.medium.max_frame()) {
            Ok(replies) => {
                debug!(%peer, parts = replies.len(), "discovery answered");
                for r in replies {
                    self.push_out(peer, &r);
                }
            }
            Err(e) => debug!(%peer, error = %e, "discovery query ignored"),
        }
    }

    fn open_channel(
        &mut self,
        now: Instant,
        peer: PeerAddr,
        est: Established,
        finish: Option<Vec<u8>>,
    ) -> Option<ChannelStream> {
        let cmd_tx = self.cmd_tx.upgrade()?;
        let mut ccfg: ChannelConfig = self.cfg.channel.clone();
        ccfg.max_frame = self
            .medium
            .max_frame()
            .min(est.peer_max_frame as usize)
            .max(ethersan_channel::frame::HEADER_LEN + 64);
        let level = est.level;
        let info = ChannelInfo {
            peer,
            local_id: est.local_id,
            peer_id: est.peer_id,
            level,
            max_frame: ccfg.max_frame,
        };
        debug!(%peer, id = est.local_id, suite = %est.keys.suite(), "channel open");
        let protector = match Protector::new(level, Some(est.keys)) {
            // UDP's checksum covers every datagram end to end: at level
            // `none` it is the frame's check (no CRC32C trailer), as TCP's
            // is for iSCSI without digests. Raw Ethernet keeps the CRC (its
            // FCS is per hop).
            Ok(p) if matches!(self.medium, Medium::Udp { .. }) => p.medium_checksum(),
            Ok(p) => p,
            Err(e) => {
                warn!(%peer, error = %e, "cannot protect the channel");
                return None;
            }
        };
        let ch = Channel::new(ccfg, est.local_id, est.peer_id, protector, now);
        let shared = Arc::new(Shared::new(self.wake.clone()));
        let (to_app, rx) = mpsc::unbounded_channel();
        self.channels.insert(
            est.local_id,
            Chan {
                ch,
                info: info.clone(),
                to_app: Some(to_app),
                shared: shared.clone(),
                written: 0,
                released: 0,
                finish: finish.map(|f| (f, now + FINISH_RESEND)),
                closing: false,
            },
        );
        Some(ChannelStream {
            reader: ChannelReader::new(rx, shared.clone()),
            writer: ChannelWriter::new(est.local_id, cmd_tx, shared),
            info,
        })
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Write { id, parts } => {
                let Some(c) = self.channels.get_mut(&id) else {
                    return;
                };
                let n: usize = parts.iter().map(|p| p.len()).sum();
                c.written += n;
                if n == 0 {
                    return;
                }
                if let Err(e) = c.ch.send_parts(parts) {
                    debug!(channel = id, error = %e, "write refused");
                    c.shared.end(Some(format!("channel {id}: {e}")));
                }
            }
            Command::Placed {
                id,
                tag,
                offset,
                data,
            } => {
                let Some(c) = self.channels.get_mut(&id) else {
                    return;
                };
                c.written += data.len();
                if let Err(e) = c.ch.send_placed(tag, offset, data) {
                    debug!(channel = id, error = %e, "placed data refused");
                    c.shared.end(Some(format!("channel {id}: {e}")));
                }
            }
            Command::Close { id } => {
                let target = matches!(self.role, Role::Target { .. });
                if let Some(c) = self.channels.get_mut(&id) {
                    if !c.closing {
                        log_stats(target, "channel closing", &c.info, &c.ch.stats());
                    }
                    c.closing = true;
                    c.ch.close();
                }
            }
            Command::Connect {
                peer,
                level,
                timeout,
                reply,
            } => {
                let id = self.fresh_id();
                let max_frame = self.medium.max_frame() as u32;
                match InitiatorHandshake::with_suites(
                    &self.cfg.group,
                    id,
                    level,
                    max_frame,
                    &self.cfg.suites,
                ) {
                    Ok(hs) => {
                        let now = Instant::now();
                        let hello = hs.hello().to_vec();
                        self.push_out(peer, &hello);
                        self.connecting.insert(
                            id,
                            Connecting {
                                hs,
                                peer,
                                level,
                                reply,
                                resend_at: now + HELLO_RESEND,
                                interval: HELLO_RESEND,
                                deadline: now + timeout,
                            },
                        );
                    }
                    Err(e) => {
                        let _ = reply.send(Err(EndpointError::Handshake {
                            peer,
                            cause: e.to_string(),
                        }));
                    }
                }
            }
            Command::Discover { dst, parts, nonce } => {
                self.waiters.insert(nonce, parts);
                let q = discovery::query(&self.cfg.group, unix_ms(), nonce);
                self.push_out(dst, &q);
            }
            Command::DiscoverDone { nonce } => {
                self.waiters.remove(&nonce);
            }
            Command::Stats { reply } => {
                let v = self
                    .channels
                    .values()
                    .map(|c| {
                        let mut s = c.ch.stats();
                        s.recv_held += c.shared.app_bytes.load(Ordering::Acquire) as u64;
                        (c.info.clone(), s)
                    })
                    .collect();
                let _ = reply.send(v);
            }
        }
    }

    fn on_timers(&mut self, now: Instant) {
        if let Some(r) = self.responder.as_mut() {
            r.expire(now);
        }
        self.lingering.retain(|_, l| l.until > now);
        self.resets
            .retain(|_, (since, _)| now.duration_since(*since) < Duration::from_secs(1));
        let mut resend: Vec<(PeerAddr, Vec<u8>)> = Vec::new();
        for c in self.channels.values_mut() {
            if c.ch.poll_timeout().is_some_and(|t| t <= now) {
                c.ch.handle_timeout(now);
            }
            if let Some((f, at)) = &mut c.finish {
                if *at <= now {
                    resend.push((c.info.peer, f.clone()));
                    *at = now + FINISH_RESEND;
                }
            }
        }
        // A handshake nobody waits for any more (the caller gave up) ends
        // here, so it does not keep the endpoint running.
        self.connecting.retain(|_, c| !c.reply.is_closed());
        let mut expired = Vec::new();
        for (id, c) in self.connecting.iter_mut() {
            if c.deadline <= now {
                expired.push(*id);
            } else if c.resend_at <= now {
                resend.push((c.peer, c.hs.hello().to_vec()));
                c.interval = (c.interval * 2).min(Duration::from_secs(1));
                c.resend_at = now + c.interval;
            }
        }
        for (peer, f) in resend {
            self.push_out(peer, &f);
        }
        for id in expired {
            if let Some(c) = self.connecting.remove(&id) {
                let _ = c.reply.send(Err(EndpointError::NoAnswer {
                    peer: c.peer,
                    group: self.cfg.group.group().to_string(),
                }));
            }
        }
    }

    /// Take every frame the channels want sent, hand received messages to
    /// the readers, release acknowledged bytes to the writers, and drop
    /// channels that have ended.
    fn pump(&mut self, now: Instant) {
        let mut ended = Vec::new();
        let target = matches!(self.role, Role::Target { .. });
        let headroom = self.medium.headroom();
        self.busy = false;
        for (id, c) in self.channels.iter_mut() {
            // Whole messages go to the reader while it holds less than the
            // budget; the rest stay in the channel, shrinking the window
            // it offers (first, so that a window reopened here goes out
            // in this round).
            if c.to_app.as_ref().is_some_and(|tx| tx.is_closed()) {
                // The reader is gone: nobody reads this channel.
                c.to_app = None;
            }
            loop {
                if c.to_app.is_some() && c.shared.app_bytes.load(Ordering::Acquire) >= RECV_BUDGET {
                    break;
                }
                let Some(m) = c.ch.recv_message() else {
                    break;
                };
                if let Some(tx) = &c.to_app {
                    let n = m.len();
                    c.shared.app_bytes.fetch_add(n, Ordering::AcqRel);
                    if tx.send(m).is_err() {
                        // The reader is gone: nobody reads this channel.
                        c.shared.app_bytes.fetch_sub(n, Ordering::AcqRel);
                        c.to_app = None;
                    }
                }
            }
            let mut sent = 0;
            let mut tail = self.spare_tails.pop().unwrap_or_default();
            while sent < FRAMES_PER_ROUND {
                let mut buf = self.spare.pop().unwrap_or_default();
                if !c
                    .ch
                    .poll_transmit_gather(now, &mut buf, headroom, &mut tail)
                {
                    self.spare.push(buf);
                    break;
                }
                if !tail.is_empty() {
                    let next = self.spare_tails.pop().unwrap_or_default();
                    self.tails
                        .push((self.outbox.len(), std::mem::replace(&mut tail, next)));
                }
                self.outbox.push((c.info.peer, buf));
                sent += 1;
            }
            self.spare_tails.push(tail);
            self.busy |= sent == FRAMES_PER_ROUND;
            let acked = c.written.saturating_sub(c.ch.send_buffered());
            if acked > c.released {
                c.shared
                    .unacked
                    .fetch_sub(acked - c.released, Ordering::AcqRel);
                c.released = acked;
                c.shared.writer.wake();
            }
            match c.ch.state() {
                ChannelState::Open | ChannelState::Closing => {
                    if c.to_app.is_none() && !c.closing {
                        c.closing = true;
                        c.ch.close();
                    }
                }
                ChannelState::Closed => ended.push((*id, None)),
                ChannelState::Failed(why) => ended.push((*id, Some(why))),
            }
        }
        for (id, why) in ended {
            if let Some(c) = self.channels.remove(&id) {
                match &why {
                    Some(w) => {
                        info!(peer = %c.info.peer, channel = id, reason = %w, "channel failed")
                    }
                    None => debug!(peer = %c.info.peer, channel = id, "channel closed"),
                }
                log_stats(target, "channel ended", &c.info, &c.ch.stats());
                let closed = why.is_none();
                c.shared.end(why.map(|w| w.to_string()));
                if closed {
                    self.lingering.insert(
                        id,
                        Lingering {
                            ch: c.ch,
                            peer: c.info.peer,
                            until: now + LINGER,
                        },
                    );
                }
            }
        }
    }
}

/// One line with a channel's counters (window, RTT, retransmissions,
/// rejected frames): at info level on a target (its log keeps every
/// channel), at debug level on a client (a command's stderr shows it only
/// when asked, ETHERSAN_LOG=debug).
fn log_stats(target: bool, what: &str, info: &ChannelInfo, s: &ChannelStats) {
    macro_rules! stats_line {
        ($level:ident) => {
            $level!(
                peer = %info.peer,
                channel = info.local_id,
                level = %info.level,
                max_frame = info.max_frame,
                frames_sent = s.frames_sent,
                frames_received = s.frames_received,
                bytes_sent = s.bytes_sent,
                bytes_received = s.bytes_received,
                retransmits = s.retransmits,
                fast_retransmits = s.fast_retransmits,
                timeouts = s.timeouts,
                duplicates = s.duplicates,
                rejected = s.rejected,
                cwnd = s.cwnd,
                srtt_us = s.srtt.map_or(0, |d| d.as_micros() as u64),
                "{what}"
            )
        };
    }
    if target {
        stats_line!(info);
    } else {
        stats_line!(debug);
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
mod unknown;
