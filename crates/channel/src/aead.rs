//! Per-direction traffic keys: ChaCha20-Poly1305 with the packet number as
//! nonce, and rekeying every [`REKEY_INTERVAL`] packets
//! (`docs/native-transport.md`, "Protection").
//!
//! The nonce is Noise's ChaChaPoly nonce: 4 zero bytes, then the packet
//! number little-endian. Key epoch *e* protects packet numbers
//! `e * REKEY_INTERVAL .. (e + 1) * REKEY_INTERVAL`; key *e* + 1 is Noise's
//! `REKEY` of key *e* (the first 32 bytes of ChaCha20-Poly1305 encrypting 32
//! zero bytes with nonce 2^64 − 1), so a key, once replaced, is dropped
//! and cannot be derived again from later ones.
//!
//! The sender steps its key forward as its packet numbers cross epochs. The
//! receiver keeps the current and the previous epoch's keys (frames of the
//! previous epoch may still be in flight) and steps forward, by at most
//! [`MAX_EPOCH_STEP`] epochs, only once a frame of a later epoch has been
//! authenticated under the candidate key: a forged frame changes nothing.

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce, Tag};
use zeroize::Zeroize;

/// Packets per key epoch: key *e* protects packet numbers
/// `e * REKEY_INTERVAL .. (e + 1) * REKEY_INTERVAL`.
pub const REKEY_INTERVAL: u64 = 1 << 20;

/// Length of a Poly1305 tag.
pub const TAG_LEN: usize = 16;

/// How many epochs ahead of its current one a receiver accepts a frame
/// from. Each step costs one key derivation before the tag can be checked,
/// so the bound keeps a forged packet number from buying a long
/// computation; 8 epochs are 8 Mi frames lost in a row, far beyond any
/// window in flight.
pub const MAX_EPOCH_STEP: u64 = 8;

/// A frame failed authentication.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("frame failed authentication")]
pub struct AeadError;

/// The epoch of a packet number.
fn epoch_of(pn: u64) -> u64 {
    pn / REKEY_INTERVAL
}

/// Noise's ChaChaPoly nonce for `n`: 4 zero bytes, then `n` little-endian.
fn nonce(n: u64) -> Nonce {
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&n.to_le_bytes());
    Nonce::from(b)
}

/// One epoch's key and its cipher, built once.
struct EpochKey {
    epoch: u64,
    key: [u8; 32],
    cipher: ChaCha20Poly1305,
}

impl EpochKey {
    fn new(epoch: u64, key: [u8; 32]) -> EpochKey {
        EpochKey {
            epoch,
            cipher: ChaCha20Poly1305::new(Key::from_slice(&key)),
            key,
        }
    }

    /// The next epoch's key (Noise `REKEY`).
    fn next(&self) -> EpochKey {
        let mut k = [0u8; 32];
        // 32 bytes are far below ChaCha20-Poly1305's length limit: the call
        // cannot fail, and the tag is not part of the key.
        let _ = self
            .cipher
            .encrypt_in_place_detached(&nonce(u64::MAX), &[], &mut k);
        EpochKey::new(self.epoch + 1, k)
    }
}

impl Drop for EpochKey {
    fn drop(&mut self) {
        // The cipher zeroes its own copy on drop.
        self.key.zeroize();
    }
}

/// The keys of one channel: one for sending, one for receiving.
pub struct TrafficKeys {
    /// The sending key of the epoch last used.
    send: EpochKey,
    /// The receiving key of the latest epoch authenticated.
    recv: EpochKey,
    /// The receiving key of the epoch before `recv`'s (none at epoch 0).
    recv_prev: Option<EpochKey>,
}

impl std::fmt::Debug for TrafficKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrafficKeys")
            .field("send_epoch", &self.send.epoch)
            .field("recv_epoch", &self.recv.epoch)
            .finish_non_exhaustive()
    }
}

impl TrafficKeys {
    /// Keys from the handshake's split: `send` for our frames, `recv` for
    /// the peer's (epoch 0).
    pub fn new(mut send: [u8; 32], mut recv: [u8; 32]) -> TrafficKeys {
        let keys = TrafficKeys {
            send: EpochKey::new(0, send),
            recv: EpochKey::new(0, recv),
            recv_prev: None,
        };
        send.zeroize();
        recv.zeroize();
        keys
    }

    /// The epoch of the key that sealed the last frame (0 before any).
    pub fn send_epoch(&self) -> u64 {
        self.send.epoch
    }

    /// The latest epoch a received frame was authenticated in (0 before
    /// any).
    pub fn recv_epoch(&self) -> u64 {
        self.recv.epoch
    }

    /// Encrypts `in_out` in place under packet number `pn` (its epoch's
    /// key) with `aad` authenticated, and returns the tag. An empty
    /// `in_out` only authenticates `aad` (level `integrity`).
    ///
    /// Packet numbers of a direction only grow: the key steps forward to
    /// `pn`'s epoch, and the old key is dropped. A packet number of an
    /// epoch already left is sealed under the current key, which the peer
    /// rejects (no nonce is ever reused under a key).
    pub fn seal(&mut self, pn: u64, aad: &[u8], in_out: &mut [u8]) -> [u8; TAG_LEN] {
        let epoch = epoch_of(pn);
        while self.send.epoch < epoch {
            self.send = self.send.next();
        }
        match self
            .send
            .cipher
            .encrypt_in_place_detached(&nonce(pn), aad, in_out)
        {
            Ok(tag) => tag.into(),
            Err(_) => {
                // Only a buffer beyond 256 GiB fails, before encrypting:
                // never send its plaintext.
                in_out.fill(0);
                [0; TAG_LEN]
            }
        }
    }

    /// Checks `tag` over `aad` and `in_out` under packet number `pn` and
    /// decrypts `in_out` in place. On error `in_out` is unspecified.
    ///
    /// A frame of the current or the previous receiving epoch opens under
    /// that epoch's key; one up to [`MAX_EPOCH_STEP`] epochs later opens
    /// under a key derived for it, which becomes current (and the one
    /// before it previous) only once the tag verifies. Older or further
    /// frames fail.
    pub fn open(
        &mut self,
        pn: u64,
        aad: &[u8],
        in_out: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), AeadError> {
        let epoch = epoch_of(pn);
        let tag = Tag::from_slice(tag);
        let n = nonce(pn);
        if epoch == self.recv.epoch {
            return decrypt(&self.recv, &n, aad, in_out, tag);
        }
        if epoch < self.recv.epoch {
            return match &self.recv_prev {
                Some(prev) if prev.epoch == epoch => decrypt(prev, &n, aad, in_out, tag),
                _ => Err(AeadError),
            };
        }
        if epoch - self.recv.epoch > MAX_EPOCH_STEP {
            return Err(AeadError);
        }
        // A later epoch: derive a candidate, commit only if authentic.
        let mut prev: Option<EpochKey> = None;
        let mut cand = self.recv.next();
        while cand.epoch < epoch {
            let next = cand.next();
            prev = Some(cand);
            cand = next;
        }
        decrypt(&cand, &n, aad, in_out, tag)?;
        let old = std::mem::replace(&mut self.recv, cand);
        self.recv_prev = Some(prev.unwrap_or(old));
        Ok(())
    }
}

fn decrypt(
    key: &EpochKey,
    n: &Nonce,
    aad: &[u8],
    in_out: &mut [u8],
    tag: &Tag,
) -> Result<(), AeadError> {
    key.cipher
        .decrypt_in_place_detached(n, aad, in_out, tag)
        .map_err(|_| AeadError)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (TrafficKeys, TrafficKeys) {
        let a = [0x11; 32];
        let b = [0x22; 32];
        (TrafficKeys::new(a, b), TrafficKeys::new(b, a))
    }

    fn roundtrip(tx: &mut TrafficKeys, rx: &mut TrafficKeys, pn: u64) -> Result<(), AeadError> {
        let aad = pn.to_be_bytes();
        let plain = format!("frame {pn}").into_bytes();
        let mut buf = plain.clone();
        let tag = tx.seal(pn, &aad, &mut buf);
        assert_ne!(buf, plain, "encrypted");
        rx.open(pn, &aad, &mut buf, &tag)?;
        assert_eq!(buf, plain);
        Ok(())
    }

    #[test]
    fn rekey_matches_noise() {
        // Noise REKEY: ENCRYPT(k, 2^64-1, "", zeros(32)) truncated to 32.
        let k = EpochKey::new(0, [7; 32]);
        let c = ChaCha20Poly1305::new(Key::from_slice(&[7; 32]));
        let mut z = [0u8; 32];
        c.encrypt_in_place_detached(
            &Nonce::from([0, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 255]),
            &[],
            &mut z,
        )
        .unwrap();
        assert_eq!(k.next().key, z);
        assert_eq!(k.next().epoch, 1);
    }

    #[test]
    fn seal_open_across_epoch_boundaries() {
        let (mut a, mut b) = pair();
        for pn in REKEY_INTERVAL - 2..=REKEY_INTERVAL + 2 {
            roundtrip(&mut a, &mut b, pn).unwrap();
            roundtrip(&mut b, &mut a, pn).unwrap();
        }
        assert_eq!(a.send_epoch(), 1);
        assert_eq!(b.recv_epoch(), 1);
    }

    #[test]
    fn previous_epoch_still_opens_two_ago_does_not() {
        let (mut a, mut b) = pair();
        let mut late = Vec::new();
        for pn in [REKEY_INTERVAL - 1, 2 * REKEY_INTERVAL - 1] {
            let mut buf = b"late".to_vec();
            let tag = a.seal(pn, b"h", &mut buf);
            late.push((pn, buf, tag));
        }
        roundtrip(&mut a, &mut b, 2 * REKEY_INTERVAL).unwrap();
        assert_eq!(b.recv_epoch(), 2);
        // Epoch 1 (previous) still opens; epoch 0 (two ago) does not.
        let (pn, mut buf, tag) = late.pop().unwrap();
        b.open(pn, b"h", &mut buf, &tag).unwrap();
        assert_eq!(buf, b"late");
        let (pn, mut buf, tag) = late.pop().unwrap();
        assert_eq!(b.open(pn, b"h", &mut buf, &tag), Err(AeadError));
    }

    #[test]
    fn jump_of_several_epochs() {
        let (mut a, mut b) = pair();
        roundtrip(&mut a, &mut b, 3).unwrap();
        let pn = 5 * REKEY_INTERVAL + 9;
        roundtrip(&mut a, &mut b, pn).unwrap();
        assert_eq!(b.recv_epoch(), 5);
        // The previous epoch (4) is derived on the way and kept.
        let mut tx = TrafficKeys::new([0x11; 32], [0; 32]);
        let mut buf = b"x".to_vec();
        let tag = tx.seal(4 * REKEY_INTERVAL + 1, b"", &mut buf);
        b.open(4 * REKEY_INTERVAL + 1, b"", &mut buf, &tag).unwrap();
        // Too far ahead: refused without deriving.
        let far = (5 + MAX_EPOCH_STEP + 1) * REKEY_INTERVAL;
        let mut buf = b"x".to_vec();
        let tag = a.seal(far, b"", &mut buf);
        assert_eq!(b.open(far, b"", &mut buf, &tag), Err(AeadError));
        assert_eq!(b.recv_epoch(), 5);
    }

    #[test]
    fn forged_later_epoch_commits_nothing() {
        let (mut a, mut b) = pair();
        let pn = 2 * REKEY_INTERVAL;
        let mut buf = b"data".to_vec();
        let mut tag = a.seal(pn, b"", &mut buf);
        tag[0] ^= 1;
        assert_eq!(b.open(pn, b"", &mut buf.clone(), &tag), Err(AeadError));
        assert_eq!(b.recv_epoch(), 0);
        tag[0] ^= 1;
        b.open(pn, b"", &mut buf, &tag).unwrap();
        assert_eq!(b.recv_epoch(), 2);
    }

    #[test]
    fn tampering_is_rejected() {
        let (mut a, mut b) = pair();
        let mut buf = b"payload bytes".to_vec();
        let tag = a.seal(42, b"header", &mut buf);
        let mut t = tag;
        t[15] ^= 0x80;
        assert!(b.open(42, b"header", &mut buf.clone(), &t).is_err());
        assert!(b.open(42, b"headeR", &mut buf.clone(), &tag).is_err());
        let mut c = buf.clone();
        c[3] ^= 1;
        assert!(b.open(42, b"header", &mut c, &tag).is_err());
        assert!(b.open(43, b"header", &mut buf.clone(), &tag).is_err());
        b.open(42, b"header", &mut buf, &tag).unwrap();
        assert_eq!(buf, b"payload bytes");
    }

    #[test]
    fn integrity_only_authenticates_aad() {
        let (mut a, mut b) = pair();
        let frame = b"whole frame, readable".to_vec();
        let tag = a.seal(0, &frame, &mut []);
        b.open(0, &frame, &mut [], &tag).unwrap();
        let mut bad = frame.clone();
        bad[0] ^= 1;
        assert!(b.open(0, &bad, &mut [], &tag).is_err());
    }

    #[test]
    fn directions_use_their_own_keys() {
        let (mut a, _) = pair();
        let mut buf = b"x".to_vec();
        let tag = a.seal(0, b"", &mut buf);
        // A frame reflected back at its sender does not open.
        assert!(a.open(0, b"", &mut buf, &tag).is_err());
    }

    /// This thread's time on a CPU (Linux `schedstat`), so that a busy
    /// machine does not skew the rate.
    fn cpu_ns() -> Option<u64> {
        let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        s.split_whitespace().next()?.parse().ok()
    }

    /// Seal+open throughput of one core (release: `cargo test -p
    /// ethersan-channel --release -- --ignored --nocapture throughput`).
    #[test]
    #[ignore]
    fn throughput() {
        for size in [1500usize, 9000] {
            let (mut a, mut b) = pair();
            let mut buf = vec![0x5A; size];
            let n = (2_000_000_000 / size) as u64;
            let start = std::time::Instant::now();
            let cpu0 = cpu_ns();
            for pn in 0..n {
                let tag = a.seal(pn, &[0; 40], &mut buf);
                b.open(pn, &[0; 40], &mut buf, &tag).unwrap();
            }
            let wall = start.elapsed().as_secs_f64();
            let cpu = match (cpu0, cpu_ns()) {
                (Some(x), Some(y)) => (y - x) as f64 / 1e9,
                _ => wall,
            };
            let bytes = n as f64 * size as f64;
            println!(
                "seal+open {size}-byte frames: {:.0} MB/s per CPU-second ({:.0} frames/s; wall clock {:.0} MB/s)",
                bytes / cpu / 1e6,
                n as f64 / cpu,
                bytes / wall / 1e6
            );
        }
    }
}
