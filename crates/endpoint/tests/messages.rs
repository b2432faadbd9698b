//! A channel as messages with placed data (crates/endpoint/src/message.rs)
//! over the in-memory hub with loss, reordering and duplication: a reader
//! registers a buffer, the peer places data into it out of order and then
//! sends a message; once the message is received the data has landed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ethersan_channel::group::GroupKeys;
use ethersan_channel::Level;
use ethersan_endpoint::{Endpoint, EndpointConfig, Medium, PeerAddr};
use ethersan_link::memory::{Impairments, MemoryHub};
use ethersan_link::{Link, MacAddr};

const ETHERTYPE: u16 = 0x88B5;

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
async fn placed_data_lands_before_the_message_that_follows_it() {
    let hub = MemoryHub::with_impairments(
        7,
        Impairments {
            loss: 0.01,
            reorder: 0.02,
            duplicate: 0.01,
            corrupt: 0.001,
        },
    );
    let target = Endpoint::target(medium(&hub, 1), EndpointConfig::new(keys()));
    let client = Endpoint::initiator(medium(&hub, 2), EndpointConfig::new(keys()));
    let (payload, total) = {
        let v: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let n = v.len();
        (Bytes::from(v), n)
    };
    let sent = payload.clone();
    let server = tokio::spawn(async move {
        let a = target.accept().await.expect("accepted");
        let mut m = a.stream.into_messages();
        // The request names the tag to place under.
        let req = m.receiver.recv().await.expect("recv").expect("a request");
        let tag = u32::from_be_bytes([req[0], req[1], req[2], req[3]]);
        // Out of order, in 3 pieces, the middle one twice.
        let third = sent.len() / 3;
        for (at, end) in [
            (2 * third, sent.len()),
            (0, third),
            (third, 2 * third),
            (third, 2 * third),
        ] {
            m.sender
                .send_placed(tag, at as u64, sent.slice(at..end))
                .await
                .expect("placed");
        }
        m.sender
            .send(&[Bytes::from_static(b"done")])
            .await
            .expect("done");
        // Data for a tag nobody registered is dropped.
        m.sender
            .send_placed(0xdead, 0, sent.slice(..100))
            .await
            .expect("placed");
        m.sender
            .send(&[Bytes::from_static(b"bye")])
            .await
            .expect("bye");
        let _ = m.receiver.recv().await;
    });
    let target_mac = PeerAddr::Mac(MacAddr([2, 0, 0, 0, 0, 1]));
    let stream = client
        .connect(target_mac, Level::Encrypt, Duration::from_secs(10))
        .await
        .expect("connect");
    let mut m = stream.into_messages();
    m.sender.expect_len(42, total);
    m.sender
        .send(&[Bytes::copy_from_slice(&42u32.to_be_bytes())])
        .await
        .expect("request");
    let done = m.receiver.recv().await.expect("recv").expect("done");
    assert_eq!(&done[..], b"done");
    let placed = m.sender.release(42).expect("registered");
    assert!(placed.covers(total as u64), "{:?}", placed.ranges());
    assert_eq!(placed.landed(), total as u64);
    let data = placed.into_data(total).expect("all landed");
    assert!(data == payload[..], "the data landed intact");
    let bye = m.receiver.recv().await.expect("recv").expect("bye");
    assert_eq!(&bye[..], b"bye");
    assert!(m.sender.release(42).is_none(), "released once");
    m.sender.close(true).await.expect("close");
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("server ends")
        .expect("server ok");
}
