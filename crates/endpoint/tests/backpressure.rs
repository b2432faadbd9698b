//! Back-pressure end to end (issue 28, docs/native-transport.md §Receive
//! budget): a target whose reader stops while the client floods messages
//! holds no more than the stated budget for that channel (the counter
//! `ChannelStats::recv_held`), the client's sends stop, a second channel
//! on the same endpoints keeps working meanwhile; once reading resumes
//! every message arrives, in order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ethersan_channel::channel::ChannelConfig;
use ethersan_channel::group::GroupKeys;
use ethersan_channel::Level;
use ethersan_endpoint::stream::RECV_BUDGET;
use ethersan_endpoint::{Endpoint, EndpointConfig, Medium, PeerAddr};
use ethersan_link::memory::MemoryHub;
use ethersan_link::{Link, MacAddr};

const ETHERTYPE: u16 = 0x88B5;
const MTU: usize = 9000;
const MSG: usize = 64 << 10;
const COUNT: usize = 1024; // 64 MiB in all
const LIMIT: Duration = Duration::from_secs(60);

fn medium(hub: &MemoryHub, last: u8) -> Medium {
    let port = hub
        .port(MacAddr([2, 0, 0, 0, 0, last]), ETHERTYPE, MTU)
        .unwrap();
    Medium::Ethernet(Arc::new(Link::from(port)))
}

fn keys() -> GroupKeys {
    GroupKeys::derive("lab", b"a long enough secret").unwrap()
}

fn message(i: usize) -> Bytes {
    let mut v = vec![(i % 251) as u8; MSG];
    v[..8].copy_from_slice(&(i as u64).to_be_bytes());
    Bytes::from(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_stops_the_peer_within_the_budget() {
    let hub = MemoryHub::new(3);
    let target = Endpoint::target(medium(&hub, 1), EndpointConfig::new(keys()));
    let client = Endpoint::initiator(medium(&hub, 2), EndpointConfig::new(keys()));
    let addr = PeerAddr::Mac(MacAddr([2, 0, 0, 0, 0, 1]));
    let flood = client
        .connect(addr, Level::Encrypt, LIMIT)
        .await
        .expect("connect")
        .into_messages();
    let stalled = target.accept().await.expect("accepted").stream;
    let stalled_id = stalled.info.local_id;
    let mut stalled = stalled.into_messages();
    let other = client
        .connect(addr, Level::Encrypt, LIMIT)
        .await
        .expect("connect")
        .into_messages();
    let echo = target
        .accept()
        .await
        .expect("accepted")
        .stream
        .into_messages();

    // The flood: 64 MiB of 64 KiB messages; nobody reads them (yet).
    let sent = Arc::new(AtomicUsize::new(0));
    let progress = sent.clone();
    let mut flood_tx = flood.sender;
    let flooder = tokio::spawn(async move {
        for i in 0..COUNT {
            flood_tx.send(&[message(i)]).await.expect("send");
            progress.store(i + 1, Ordering::Release);
        }
        flood_tx
    });

    // Wait until the sender has stopped (its sends wait for room).
    let mut last = usize::MAX;
    let mut still = 0;
    while still < 10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = sent.load(Ordering::Acquire);
        if now == last && now > 0 {
            still += 1;
        } else {
            still = 0;
        }
        last = now;
        assert!(now < COUNT, "the sender never stopped: {now} messages sent");
    }
    let stats = target.stats().await.expect("stats");
    let (_, s) = stats
        .iter()
        .find(|(i, _)| i.local_id == stalled_id)
        .expect("the stalled channel");
    let cfg = ChannelConfig::default();
    let budget = RECV_BUDGET + MSG + cfg.recv_window as usize * MTU + MSG;
    eprintln!(
        "stalled reader: {} bytes held for it (budget {budget}), {} of {COUNT} messages sent",
        s.recv_held,
        sent.load(Ordering::Acquire)
    );
    assert!(
        (s.recv_held as usize) <= budget,
        "held {} bytes, budget {budget}",
        s.recv_held
    );
    assert!(
        s.recv_held as usize >= RECV_BUDGET,
        "the reader's queue is full"
    );

    // The other channel works meanwhile.
    let mut echo_rx = echo.receiver;
    let mut echo_tx = echo.sender;
    let echoer = tokio::spawn(async move {
        while let Ok(Some(m)) = echo_rx.recv().await {
            echo_tx.send(&[m]).await.expect("echo");
        }
    });
    let mut other_tx = other.sender;
    let mut other_rx = other.receiver;
    for i in 0..20u8 {
        other_tx
            .send(&[Bytes::from(vec![i; 3000])])
            .await
            .expect("send");
        let back = tokio::time::timeout(LIMIT, other_rx.recv())
            .await
            .expect("an echo in time")
            .expect("recv")
            .expect("a message");
        assert_eq!(back, vec![i; 3000]);
    }

    // Reading resumes: everything arrives, in order.
    for i in 0..COUNT {
        let m = tokio::time::timeout(LIMIT, stalled.receiver.recv())
            .await
            .expect("a message in time")
            .expect("recv")
            .expect("a message");
        assert_eq!(m, message(i), "message {i}");
    }
    let flood_tx = tokio::time::timeout(LIMIT, flooder)
        .await
        .expect("the sender finishes")
        .expect("sender ok");
    flood_tx.close(true).await.expect("close");
    other_tx.close(true).await.expect("close");
    drop(stalled);
    let _ = tokio::time::timeout(LIMIT, echoer).await;
}
