//! The endpoint's task driven in memory: a target and an initiator
//! endpoint on one in-memory Ethernet hub (`ethersan_link::memory`), whose
//! impairments lose frames or silence a peer. The driver reads the clock
//! itself, so the timeouts below are short real ones.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ethersan_channel::aead::Suite;
use ethersan_channel::channel::ChannelConfig;
use ethersan_channel::group::GroupKeys;
use ethersan_channel::handshake::Responder;
use ethersan_channel::{Level, ETHERTYPE_NATIVE};
use ethersan_link::memory::{Impairments, MemoryHub};
use ethersan_link::{Link, MacAddr};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{ChannelStream, Endpoint, EndpointConfig, EndpointError, Medium, PeerAddr};

const TARGET_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
const INITIATOR_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
/// Longest any step below may take before the test fails.
const LIMIT: Duration = Duration::from_secs(10);

fn medium(hub: &MemoryHub, mac: MacAddr) -> Medium {
    let port = hub.port(mac, ETHERTYPE_NATIVE, 1500).expect("a hub port");
    Medium::Ethernet(Arc::new(Link::from(port)))
}

fn config(secret: &[u8], channel: ChannelConfig) -> EndpointConfig {
    let mut cfg = EndpointConfig::new(GroupKeys::derive("test", secret).expect("group keys"));
    cfg.channel = channel;
    cfg
}

/// A target and an initiator endpoint on `hub`, the initiator's channel
/// to the target open and the target's accepted: (target endpoint,
/// initiator endpoint, the initiator's stream, the target's stream).
async fn pair(
    hub: &MemoryHub,
    channel: ChannelConfig,
) -> (Endpoint, Endpoint, ChannelStream, ChannelStream) {
    let target = Endpoint::target(
        medium(hub, TARGET_MAC),
        config(b"group-secret-1", channel.clone()),
    );
    let initiator = Endpoint::initiator(
        medium(hub, INITIATOR_MAC),
        config(b"group-secret-1", channel),
    );
    let ours = initiator
        .connect(PeerAddr::Mac(TARGET_MAC), Level::Encrypt, LIMIT)
        .await
        .expect("the handshake completes");
    let theirs = tokio::time::timeout(LIMIT, target.accept())
        .await
        .expect("the target accepts in time")
        .expect("an accepted channel")
        .stream;
    (target, initiator, ours, theirs)
}

/// Bytes that are not all alike.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test]
async fn a_message_is_delivered_both_ways() {
    let hub = MemoryHub::new(1);
    let (target, initiator, mut ours, mut theirs) = pair(&hub, ChannelConfig::default()).await;
    assert_eq!(ours.info.peer, PeerAddr::Mac(TARGET_MAC));
    assert_eq!(theirs.info.peer, PeerAddr::Mac(INITIATOR_MAC));
    assert_eq!(
        (ours.info.level, theirs.info.level),
        (Level::Encrypt, Level::Encrypt)
    );
    assert_eq!(ours.info.peer_id, theirs.info.local_id);
    assert_eq!(theirs.info.peer_id, ours.info.local_id);

    ours.writer.write_all(b"hello, target").await.unwrap();
    let mut got = [0u8; 13];
    tokio::time::timeout(LIMIT, theirs.reader.read_exact(&mut got))
        .await
        .expect("delivered in time")
        .unwrap();
    assert_eq!(&got, b"hello, target");

    theirs.writer.write_all(b"hello, initiator").await.unwrap();
    let mut got = [0u8; 16];
    tokio::time::timeout(LIMIT, ours.reader.read_exact(&mut got))
        .await
        .expect("delivered in time")
        .unwrap();
    assert_eq!(&got, b"hello, initiator");

    // Both tasks list the one channel.
    let (mine, _) = initiator.stats().await.unwrap().pop().expect("a channel");
    assert_eq!(mine, ours.info);
    let (served, _) = target.stats().await.unwrap().pop().expect("a channel");
    assert_eq!(served, theirs.info);
}

#[tokio::test]
async fn lost_frames_are_recovered() {
    let hub = MemoryHub::new(7);
    let (_target, initiator, mut ours, mut theirs) = pair(&hub, ChannelConfig::default()).await;
    // From now on one delivery in five is lost, both ways.
    hub.set_impairments(Impairments {
        loss: 0.2,
        ..Impairments::default()
    });
    let data = pattern(256 << 10, 3);
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        for chunk in sent.chunks(16 << 10) {
            ours.writer.write_all(chunk).await.unwrap();
        }
        ours
    });
    let mut got = vec![0u8; data.len()];
    tokio::time::timeout(LIMIT, theirs.reader.read_exact(&mut got))
        .await
        .expect("every byte arrives in time")
        .unwrap();
    assert!(got == data, "the data arrived changed or out of order");
    let _ours = writer.await.unwrap();
    assert!(hub.stats().lost > 0, "the hub lost nothing");
    let (_, s) = initiator.stats().await.unwrap().pop().expect("a channel");
    assert!(
        s.retransmits > 0,
        "frames were lost and none retransmitted: {s:?}"
    );
}

#[tokio::test]
async fn a_silent_peer_is_closed_after_its_timeout() {
    let hub = MemoryHub::new(3);
    let dead_after = Duration::from_millis(400);
    let channel = ChannelConfig {
        initial_rto: Duration::from_millis(50),
        max_rto: Duration::from_millis(100),
        dead_after,
        ..ChannelConfig::default()
    };
    let (_target, initiator, mut ours, _theirs) = pair(&hub, channel).await;
    // The target goes silent: nothing reaches it, nothing comes back.
    hub.set_impairments(Impairments {
        loss: 1.0,
        ..Impairments::default()
    });
    let started = Instant::now();
    ours.writer.write_all(b"anyone there?").await.unwrap();
    let mut b = [0u8; 1];
    let r = tokio::time::timeout(LIMIT, ours.reader.read(&mut b))
        .await
        .expect("the channel ends in time");
    let e = r.expect_err("a failed channel is an error, not the end of file");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    assert!(
        started.elapsed() >= dead_after,
        "failed after {:?}, before its timeout of {dead_after:?}",
        started.elapsed()
    );
    assert!(
        initiator.stats().await.unwrap().is_empty(),
        "the failed channel is still listed"
    );
    assert!(ours.writer.write_all(b"more").await.is_err());
}

#[tokio::test]
async fn a_member_of_another_group_gets_no_answer() {
    let hub = MemoryHub::new(5);
    let _target = Endpoint::target(
        medium(&hub, TARGET_MAC),
        config(b"group-secret-1", ChannelConfig::default()),
    );
    let stranger = Endpoint::initiator(
        medium(&hub, INITIATOR_MAC),
        config(b"another-secret", ChannelConfig::default()),
    );
    let r = stranger
        .connect(
            PeerAddr::Mac(TARGET_MAC),
            Level::Encrypt,
            Duration::from_millis(500),
        )
        .await;
    assert!(matches!(r, Err(EndpointError::NoAnswer { .. })), "{r:?}");
}

#[tokio::test]
async fn the_task_ends_once_handles_and_streams_are_gone_and_channels_closed() {
    let hub = MemoryHub::new(9);
    let (target, initiator, ours, theirs) = pair(&hub, ChannelConfig::default()).await;
    let stopped = initiator.stopped();
    drop(initiator);
    // A stream keeps the task alive; dropping it closes the channel, and
    // the task ends once the target has answered the CLOSE.
    drop(ours);
    tokio::time::timeout(LIMIT, stopped.wait())
        .await
        .expect("the initiator's task ends");
    // The target saw the close: its reader ends without an error.
    let mut theirs = theirs;
    let mut b = Vec::new();
    tokio::time::timeout(LIMIT, theirs.reader.read_to_end(&mut b))
        .await
        .expect("the target's stream ends")
        .expect("a close is the end of file");
    assert!(b.is_empty());
    drop(target);
}

/// Channels closed through a hub that loses a third of the frames: the
/// target's end sees the close and the initiator's task ends (its CLOSE
/// answered) within a few seconds, where a CLOSE left unanswered would
/// hold it for its 15 s `dead_after`: the initiator sends CLOSE as a
/// burst, and the target's closed channel lingers to answer every copy.
#[tokio::test]
async fn a_close_through_loss_ends_both_sides_long_before_the_timeout() {
    const BOUND: Duration = Duration::from_secs(3);
    let channel = ChannelConfig::default();
    assert!(channel.dead_after >= 5 * BOUND);
    for seed in 0..6 {
        let hub = MemoryHub::new(40 + seed);
        let (target, initiator, ours, mut theirs) = pair(&hub, channel.clone()).await;
        hub.set_impairments(Impairments {
            loss: 0.33,
            ..Impairments::default()
        });
        let stopped = initiator.stopped();
        drop(initiator);
        drop(ours);
        let mut b = Vec::new();
        tokio::time::timeout(BOUND, theirs.reader.read_to_end(&mut b))
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: the target's stream did not end"))
            .expect("a close is the end of file");
        tokio::time::timeout(BOUND, stopped.wait())
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: the initiator's CLOSE went unanswered"));
        drop(target);
    }
}

/// A target that restarted (a new endpoint took over its address) answers
/// the initiator's next frame with a RESET: the initiator's channel fails
/// at once with a clear error, long before its `dead_after`.
#[tokio::test]
async fn a_restarted_target_resets_the_channel_at_once() {
    let hub = MemoryHub::new(11);
    let (old, initiator, mut ours, mut theirs) = pair(&hub, ChannelConfig::default()).await;
    // The channel carried data both ways (the target has answered on it:
    // before that, a RESET only means the HELLO_FINISH was lost).
    theirs.writer.write_all(b"up").await.unwrap();
    let mut up = [0u8; 2];
    tokio::time::timeout(LIMIT, ours.reader.read_exact(&mut up))
        .await
        .expect("delivered in time")
        .unwrap();
    // The restarted target: same group, same address, no channels.
    let _new = Endpoint::target(
        medium(&hub, TARGET_MAC),
        config(b"group-secret-1", ChannelConfig::default()),
    );
    ours.writer.write_all(b"still there?").await.unwrap();
    let mut b = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_secs(3), ours.reader.read(&mut b))
        .await
        .expect("the RESET ends the channel long before its 15 s timeout");
    let e = r.expect_err("a reset channel is an error");
    assert!(
        e.to_string().contains("no longer knows this channel"),
        "{e}"
    );
    assert!(initiator.stats().await.unwrap().is_empty());
    drop(old);
}

/// A RESET from a member of another group (a wrong token) changes
/// nothing: the channel goes on.
#[tokio::test]
async fn a_forged_reset_changes_nothing() {
    let hub = MemoryHub::new(12);
    let (_target, initiator, mut ours, mut theirs) = pair(&hub, ChannelConfig::default()).await;
    let peer_id = ours.info.peer_id;
    // Forged with the target's address as its source, under another
    // group's key.
    let forger = hub
        .port(MacAddr([2, 0, 0, 0, 0, 3]), ETHERTYPE_NATIVE, 1500)
        .expect("a port");
    let stranger = GroupKeys::derive("test", b"another-secret").expect("keys");
    let mut f = Vec::new();
    f.extend_from_slice(&INITIATOR_MAC.0);
    f.extend_from_slice(&TARGET_MAC.0);
    f.extend_from_slice(&ETHERTYPE_NATIVE.to_be_bytes());
    assert!(ethersan_channel::reset::write(
        &stranger, peer_id, 100, &mut f
    ));
    Link::from(forger).send(&f).await.expect("sent");
    ours.writer.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 4];
    tokio::time::timeout(LIMIT, theirs.reader.read_exact(&mut got))
        .await
        .expect("the channel still works")
        .unwrap();
    assert_eq!(&got, b"ping");
    assert_eq!(initiator.stats().await.unwrap().len(), 1);
}

/// A target answers a channel frame for an unknown channel with a RESET
/// no larger than it, and never answers a RESET.
#[tokio::test]
async fn a_reset_answers_unknown_channels_and_never_a_reset() {
    let hub = MemoryHub::new(13);
    let _target = Endpoint::target(
        medium(&hub, TARGET_MAC),
        config(b"group-secret-1", ChannelConfig::default()),
    );
    let keys = GroupKeys::derive("test", b"group-secret-1").expect("keys");
    let me = MacAddr([2, 0, 0, 0, 0, 4]);
    let link = Link::from(hub.port(me, ETHERTYPE_NATIVE, 1500).expect("a port"));
    let eth = |body: &[u8]| {
        let mut f = Vec::new();
        f.extend_from_slice(&TARGET_MAC.0);
        f.extend_from_slice(&me.0);
        f.extend_from_slice(&ETHERTYPE_NATIVE.to_be_bytes());
        f.extend_from_slice(body);
        f
    };
    // A RESET first (authentic, for id 5): it must go unanswered.
    let mut r = Vec::new();
    assert!(ethersan_channel::reset::write(&keys, 5, 100, &mut r));
    link.send(&eth(&r)).await.expect("sent");
    // Then an ACK-sized channel frame for unknown id 9.
    let mut ack = Vec::new();
    ethersan_channel::frame::Prefix {
        kind: ethersan_channel::frame::Kind::Ack,
        flags: 0,
        dst: 9,
    }
    .write(&mut ack);
    ack.resize(56, 0);
    link.send(&eth(&ack)).await.expect("sent");
    let mut got = Vec::new();
    tokio::time::timeout(
        LIMIT,
        link.recv_batch(|f| {
            if got.is_empty() {
                got = f.to_vec();
            }
        }),
    )
    .await
    .expect("an answer in time")
    .expect("received");
    let body = &got[14..];
    // The first answer is the RESET for id 9: nothing answered the RESET.
    assert_eq!(ethersan_channel::reset::check(&keys, body), Some(9));
    assert!(body.len() <= ack.len());
}

/// Endpoints restricted to suites (as `ETHERSAN_NATIVE_SUITES` does):
/// a target without AES and an initiator preferring it agree on
/// ChaCha20-Poly1305 and carry data; an initiator offering only AES gets
/// a connect error saying there is no suite in common.
#[tokio::test]
async fn forced_suites_are_negotiated() {
    let hub = MemoryHub::new(3);
    let mut tcfg = config(b"group-secret-1", ChannelConfig::default());
    tcfg.suites = vec![Suite::ChaCha20Poly1305];
    let target = Endpoint::target(medium(&hub, TARGET_MAC), tcfg);
    let mut icfg = config(b"group-secret-1", ChannelConfig::default());
    icfg.suites = vec![Suite::Aes256Gcm, Suite::ChaCha20Poly1305];
    let initiator = Endpoint::initiator(medium(&hub, INITIATOR_MAC), icfg);
    let mut ours = initiator
        .connect(PeerAddr::Mac(TARGET_MAC), Level::Encrypt, LIMIT)
        .await
        .expect("the handshake completes on ChaCha20-Poly1305");
    let mut theirs = tokio::time::timeout(LIMIT, target.accept())
        .await
        .expect("the target accepts in time")
        .expect("an accepted channel")
        .stream;
    let data = pattern(20_000, 7);
    ours.writer.write_all(&data).await.unwrap();
    let mut got = vec![0u8; data.len()];
    tokio::time::timeout(LIMIT, theirs.reader.read_exact(&mut got))
        .await
        .expect("delivered in time")
        .unwrap();
    assert_eq!(got, data);
    theirs.writer.write_all(b"back").await.unwrap();
    let mut got = [0u8; 4];
    tokio::time::timeout(LIMIT, ours.reader.read_exact(&mut got))
        .await
        .expect("delivered in time")
        .unwrap();
    assert_eq!(&got, b"back");

    let mut acfg = config(b"group-secret-1", ChannelConfig::default());
    acfg.suites = vec![Suite::Aes256Gcm];
    let aes_only = Endpoint::initiator(medium(&hub, MacAddr([2, 0, 0, 0, 0, 3])), acfg);
    let err = aes_only
        .connect(PeerAddr::Mac(TARGET_MAC), Level::Encrypt, LIMIT)
        .await
        .expect_err("no suite in common");
    assert!(
        matches!(&err, EndpointError::Handshake { cause, .. }
            if cause.contains("no AEAD suite in common") && cause.contains("aes256gcm")),
        "{err}"
    );
}

/// A target answering with a `HELLO_REPLY` of version 1 ends the connect
/// at once with an error naming both versions and what to do.
#[tokio::test]
async fn a_version_1_reply_ends_the_connect_with_the_reason() {
    let hub = MemoryHub::new(4);
    let fake = hub
        .port(TARGET_MAC, ETHERTYPE_NATIVE, 1500)
        .expect("a hub port");
    let initiator = Endpoint::initiator(
        medium(&hub, INITIATOR_MAC),
        config(b"group-secret-1", ChannelConfig::default()),
    );
    let keys = GroupKeys::derive("test", b"group-secret-1").expect("group keys");
    let old_target = async move {
        let mut resp = Responder::new(keys, 4, LIMIT);
        loop {
            let mut frames = Vec::new();
            fake.recv_batch(|f| frames.push(f.to_vec()))
                .await
                .expect("a frame");
            for f in frames {
                let Some(hello) = f.get(14..) else { continue };
                let Ok(out) = resp.handle_hello(Instant::now(), hello, 5, 1500) else {
                    continue;
                };
                // The real reply, as a version-1 target would label it.
                let mut reply = out.reply;
                reply[1] = 1;
                let mut eth = INITIATOR_MAC.0.to_vec();
                eth.extend_from_slice(&TARGET_MAC.0);
                eth.extend_from_slice(&ETHERTYPE_NATIVE.to_be_bytes());
                eth.extend_from_slice(&reply);
                fake.send_batch([eth]).await.expect("sent");
                return fake;
            }
        }
    };
    let (r, _fake) = tokio::join!(
        initiator.connect(PeerAddr::Mac(TARGET_MAC), Level::Encrypt, LIMIT),
        old_target
    );
    let err = r.expect_err("a version-1 reply");
    assert!(
        err.to_string().contains(
            "peer speaks native transport version 1, this ethersan speaks 3: \
             run the same ethersan version on both ends"
        ),
        "{err}"
    );
}
