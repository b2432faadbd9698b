//! A placed transfer aborted mid-way over the in-memory hub (with loss and
//! reordering): the half that landed is in the released buffer, frames for
//! the aborted tag arriving later are dropped and counted
//! (`ChannelStats::placed_dropped`), and the channel goes on.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ethersan_channel::group::GroupKeys;
use ethersan_channel::Level;
use ethersan_endpoint::{Endpoint, EndpointConfig, Medium, PeerAddr};
use ethersan_link::memory::{Impairments, MemoryHub};
use ethersan_link::{Link, MacAddr};

const ETHERTYPE: u16 = 0x88B5;
const LIMIT: Duration = Duration::from_secs(30);

fn medium(hub: &MemoryHub, last: u8) -> Medium {
    let port = hub
        .port(MacAddr([2, 0, 0, 0, 0, last]), ETHERTYPE, 9000)
        .unwrap();
    Medium::Ethernet(Arc::new(Link::from(port)))
}

fn keys() -> GroupKeys {
    GroupKeys::derive("lab", b"a long enough secret").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_transfer_releases_its_buffer_and_drops_late_frames() {
    let hub = MemoryHub::with_impairments(
        11,
        Impairments {
            loss: 0.01,
            reorder: 0.02,
            duplicate: 0.01,
            corrupt: 0.0,
        },
    );
    let target = Endpoint::target(medium(&hub, 1), EndpointConfig::new(keys()));
    let client = Endpoint::initiator(medium(&hub, 2), EndpointConfig::new(keys()));
    let data: Bytes = (0..400_000u32).map(|i| (i * 3 + i / 97) as u8).collect();
    let half = data.len() / 2;
    let sent = data.clone();
    let server = tokio::spawn(async move {
        let mut m = target
            .accept()
            .await
            .expect("accepted")
            .stream
            .into_messages();
        // The client registers its buffer before it asks.
        let ready = m.receiver.recv().await.expect("recv").expect("ready");
        assert_eq!(&ready[..], b"ready");
        m.sender
            .send_placed(9, 0, sent.slice(..half))
            .await
            .expect("placed");
        m.sender
            .send(&[Bytes::from_static(b"half")])
            .await
            .expect("half");
        let go = m.receiver.recv().await.expect("recv").expect("go");
        assert_eq!(&go[..], b"go");
        m.sender
            .send_placed(9, half as u64, sent.slice(half..))
            .await
            .expect("placed");
        m.sender
            .send(&[Bytes::from_static(b"done")])
            .await
            .expect("done");
        let _ = m.receiver.recv().await;
    });
    let addr = PeerAddr::Mac(MacAddr([2, 0, 0, 0, 0, 1]));
    let mut m = client
        .connect(addr, Level::Encrypt, LIMIT)
        .await
        .expect("connect")
        .into_messages();
    m.sender.expect_len(9, data.len());
    m.sender
        .send(&[Bytes::from_static(b"ready")])
        .await
        .expect("ready");
    let msg = m.receiver.recv().await.expect("recv").expect("half");
    assert_eq!(&msg[..], b"half");
    let p = m.sender.release(9).expect("registered");
    assert!(p.covers(half as u64));
    assert_eq!(p.landed(), half as u64);
    assert!(p.get(0, half).expect("landed") == &data[..half]);
    assert!(p.get(0, half + 1).is_none(), "not landed");
    m.sender
        .send(&[Bytes::from_static(b"go")])
        .await
        .expect("go");
    let msg = m.receiver.recv().await.expect("recv").expect("done");
    assert_eq!(&msg[..], b"done");
    let stats = client.stats().await.expect("stats");
    let dropped: u64 = stats.iter().map(|(_, s)| s.placed_dropped).sum();
    let frames = (data.len() - half).div_ceil(9000 - 40 - 16) as u64;
    assert_eq!(dropped, frames, "every late frame dropped, each once");
    // The channel goes on.
    m.sender
        .send(&[Bytes::from_static(b"bye")])
        .await
        .expect("bye");
    m.sender.close(true).await.expect("close");
    tokio::time::timeout(LIMIT, server)
        .await
        .expect("server ends")
        .expect("server ok");
}
