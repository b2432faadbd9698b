//! Per-direction traffic keys: an AEAD suite (AES-256-GCM or
//! ChaCha20-Poly1305, from `ring`) with the packet number as nonce, and
//! rekeying every [`Suite::rekey_interval`] packets
//! (`docs/native-transport.md`, "Protection"). The suite is negotiated in
//! the handshake (`crate::handshake`).
//!
//! The nonce is Noise's nonce for the suite: 4 zero bytes, then the packet
//! number, little-endian for ChaCha20-Poly1305 and big-endian for
//! AES-256-GCM. Key epoch *e* protects packet numbers
//! `e * I .. (e + 1) * I` where *I* is the suite's rekey interval; key
//! *e* + 1 is Noise's
//! `REKEY` of key *e* (the first 32 bytes of the suite's cipher encrypting
//! 32 zero bytes with nonce 2^64 − 1), so a key, once replaced, is dropped
//! and cannot be derived again from later ones.
//!
//! Usage limits (RFC 9001 §6.6, for packets of up to 2^16 bytes; ours are
//! at most 64 KiB): AES-GCM's confidentiality limit is 2^23 packets per
//! key, ChaCha20-Poly1305's is above 2^62. Both suites rekey every 2^20
//! packets: AES-GCM at 1/8 of its limit (an attacker's advantage stays
//! below 2^-60), ChaCha20-Poly1305 far below its own, at the interval
//! version 1 used (a rekey is one block of the cipher, so a longer one
//! would buy nothing). The integrity limit bounds the forgeries a receiver
//! may try to open under one key: 2^52 for AES-GCM, 2^36 for
//! ChaCha20-Poly1305 (each keeps a forger's success chance near 2^-57). A
//! receiver opens under at most two epochs' keys and a failed frame is
//! counted and dropped; minimum-size forgeries at 10 Gbit/s line rate
//! (~15 M frames/s) need over an hour of one key for 2^36 and about nine
//! years for 2^52, so no per-key forgery count is enforced (the
//! channel's failed-frame counter shows such a flood long before).
//!
//! The sender steps its key forward as its packet numbers cross epochs. The
//! receiver keeps the current and the previous epoch's keys (frames of the
//! previous epoch may still be in flight) and steps forward, by at most
//! [`MAX_EPOCH_STEP`] epochs, only once a frame of a later epoch has been
//! authenticated under the candidate key: a forged frame changes nothing.

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use subtle::ConstantTimeEq;
use zeroize::Zeroize;

/// Packets per key epoch of both suites ([`Suite::rekey_interval`]): 2^20
/// is 1/8 of AES-GCM's confidentiality limit of 2^23 packets (RFC 9001
/// §6.6).
pub const REKEY_INTERVAL: u64 = 1 << 20;

/// Length of an AEAD tag (both suites).
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

/// The AEAD protecting a channel's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Suite {
    /// ChaCha20-Poly1305 (RFC 8439): fast without AES instructions.
    ChaCha20Poly1305,
    /// AES-256-GCM: several times faster where the CPU has AES and
    /// carry-less multiply instructions.
    Aes256Gcm,
}

impl Suite {
    /// Its wire value.
    pub fn to_u8(self) -> u8 {
        match self {
            Suite::ChaCha20Poly1305 => 1,
            Suite::Aes256Gcm => 2,
        }
    }

    /// The suite with this wire value.
    pub fn from_u8(v: u8) -> Option<Suite> {
        match v {
            1 => Some(Suite::ChaCha20Poly1305),
            2 => Some(Suite::Aes256Gcm),
            _ => None,
        }
    }

    /// Its name in `ETHERSAN_NATIVE_SUITES`: `chacha20` or `aes256gcm`.
    pub fn name(self) -> &'static str {
        match self {
            Suite::ChaCha20Poly1305 => "chacha20",
            Suite::Aes256Gcm => "aes256gcm",
        }
    }

    /// Parses a comma-separated list of suite names (as in
    /// `ETHERSAN_NATIVE_SUITES`); `None` if a name is unknown or the list
    /// is empty.
    pub fn parse_list(s: &str) -> Option<Vec<Suite>> {
        let mut out = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let suite = match name {
                "chacha20" | "chacha20poly1305" => Suite::ChaCha20Poly1305,
                "aes256gcm" | "aes-256-gcm" => Suite::Aes256Gcm,
                _ => return None,
            };
            if !out.contains(&suite) {
                out.push(suite);
            }
        }
        (!out.is_empty()).then_some(out)
    }

    /// Packets per key epoch under this suite: key *e* protects packet
    /// numbers `e * I .. (e + 1) * I`. AES-256-GCM: 2^20, 1/8 of its
    /// confidentiality limit (2^23 packets, RFC 9001 §6.6);
    /// ChaCha20-Poly1305: 2^20 too, far below its limit (2^62).
    pub fn rekey_interval(self) -> u64 {
        match self {
            Suite::Aes256Gcm => REKEY_INTERVAL,
            Suite::ChaCha20Poly1305 => REKEY_INTERVAL,
        }
    }

    /// The suites this machine should offer, in preference order:
    /// AES-256-GCM first when the CPU has AES and PCLMULQDQ instructions,
    /// then ChaCha20-Poly1305.
    pub fn preferred() -> Vec<Suite> {
        if aes_hardware() {
            vec![Suite::Aes256Gcm, Suite::ChaCha20Poly1305]
        } else {
            vec![Suite::ChaCha20Poly1305, Suite::Aes256Gcm]
        }
    }

    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Suite::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
            Suite::Aes256Gcm => &aead::AES_256_GCM,
        }
    }

    /// Noise's nonce for `n` under this suite.
    fn nonce(self, n: u64) -> Nonce {
        let mut b = [0u8; 12];
        match self {
            Suite::ChaCha20Poly1305 => b[4..].copy_from_slice(&n.to_le_bytes()),
            Suite::Aes256Gcm => b[4..].copy_from_slice(&n.to_be_bytes()),
        }
        Nonce::assume_unique_for_key(b)
    }
}

impl std::fmt::Display for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Suite::ChaCha20Poly1305 => "ChaCha20-Poly1305",
            Suite::Aes256Gcm => "AES-256-GCM",
        })
    }
}

/// Whether the CPU has the AES and carry-less multiply instructions
/// AES-GCM needs to be fast.
pub fn aes_hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// One epoch's key and its cipher, built once.
struct EpochKey {
    epoch: u64,
    suite: Suite,
    key: [u8; 32],
    cipher: LessSafeKey,
}

impl EpochKey {
    fn new(suite: Suite, epoch: u64, key: [u8; 32]) -> EpochKey {
        // Both algorithms take 32-byte keys: `new` cannot fail.
        let unbound = match UnboundKey::new(suite.algorithm(), &key) {
            Ok(k) => k,
            Err(_) => unreachable!("32-byte key for a 256-bit AEAD"),
        };
        EpochKey {
            epoch,
            suite,
            cipher: LessSafeKey::new(unbound),
            key,
        }
    }

    /// The next epoch's key (Noise `REKEY`).
    fn next(&self) -> EpochKey {
        let mut k = [0u8; 32];
        // 32 bytes are far below either suite's length limit: the call
        // cannot fail, and the tag is not part of the key.
        let _ = self.cipher.seal_in_place_separate_tag(
            self.suite.nonce(u64::MAX),
            Aad::empty(),
            &mut k,
        );
        EpochKey::new(self.suite, self.epoch + 1, k)
    }

    fn seal(&self, pn: u64, aad: &[u8], in_out: &mut [u8]) -> [u8; TAG_LEN] {
        match self
            .cipher
            .seal_in_place_separate_tag(self.suite.nonce(pn), Aad::from(aad), in_out)
        {
            Ok(tag) => {
                let mut t = [0; TAG_LEN];
                t.copy_from_slice(tag.as_ref());
                t
            }
            Err(_) => {
                // Only a buffer beyond the suite's limit fails, before
                // encrypting: never send its plaintext.
                in_out.fill(0);
                [0; TAG_LEN]
            }
        }
    }

    fn open(
        &self,
        pn: u64,
        aad: &[u8],
        in_out: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), AeadError> {
        self.cipher
            .open_in_place_separate_tag(
                self.suite.nonce(pn),
                Aad::from(aad),
                aead::Tag::from(*tag),
                in_out,
                0..,
            )
            .map(|_| ())
            .map_err(|_| AeadError)
    }
}

impl EpochKey {
    /// The level-`integrity` tag of `frame` (sent in clear) under packet
    /// number `pn`; `frame[..split]` is its header. ChaCha20-Poly1305
    /// authenticates the whole frame as associated data (Poly1305 takes it
    /// at full speed). AES-256-GCM computes the tag the payload would have
    /// if it were encrypted (header as associated data, the payload
    /// encrypted in `scratch` and thrown away): `ring` hashes associated
    /// data one 16-byte block per call and ciphertext eight at a time, and
    /// the whole frame as associated data ran at a quarter of level
    /// `encrypt`'s speed.
    fn mac(&self, pn: u64, frame: &[u8], split: usize, scratch: &mut Vec<u8>) -> [u8; TAG_LEN] {
        match self.suite {
            Suite::ChaCha20Poly1305 => self.seal(pn, frame, &mut []),
            Suite::Aes256Gcm => {
                let (header, payload) = frame.split_at(split.min(frame.len()));
                scratch.clear();
                scratch.extend_from_slice(payload);
                self.seal(pn, header, scratch)
            }
        }
    }

    /// Checks a level-`integrity` `tag` of `frame` ([`EpochKey::mac`]) in
    /// constant time.
    fn check_mac(
        &self,
        pn: u64,
        frame: &[u8],
        split: usize,
        tag: &[u8; TAG_LEN],
        scratch: &mut Vec<u8>,
    ) -> Result<(), AeadError> {
        match self.suite {
            Suite::ChaCha20Poly1305 => self.open(pn, frame, &mut [], tag),
            Suite::Aes256Gcm => {
                let want = self.mac(pn, frame, split, scratch);
                if bool::from(want.ct_eq(tag)) {
                    Ok(())
                } else {
                    Err(AeadError)
                }
            }
        }
    }
}

impl Drop for EpochKey {
    fn drop(&mut self) {
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
    /// Where level `integrity` under AES-256-GCM encrypts a payload to
    /// compute its tag ([`EpochKey::mac`]); kept between frames.
    scratch: Vec<u8>,
}

impl std::fmt::Debug for TrafficKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrafficKeys")
            .field("suite", &self.send.suite)
            .field("send_epoch", &self.send.epoch)
            .field("recv_epoch", &self.recv.epoch)
            .finish_non_exhaustive()
    }
}

impl TrafficKeys {
    /// ChaCha20-Poly1305 keys from the handshake's split: `send` for our
    /// frames, `recv` for the peer's (epoch 0).
    pub fn new(send: [u8; 32], recv: [u8; 32]) -> TrafficKeys {
        TrafficKeys::with_suite(Suite::ChaCha20Poly1305, send, recv)
    }

    /// Keys of `suite` from the handshake's split: `send` for our frames,
    /// `recv` for the peer's (epoch 0).
    pub fn with_suite(suite: Suite, mut send: [u8; 32], mut recv: [u8; 32]) -> TrafficKeys {
        let keys = TrafficKeys {
            send: EpochKey::new(suite, 0, send),
            recv: EpochKey::new(suite, 0, recv),
            recv_prev: None,
            scratch: Vec::new(),
        };
        send.zeroize();
        recv.zeroize();
        keys
    }

    /// The suite of these keys.
    pub fn suite(&self) -> Suite {
        self.send.suite
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
        let epoch = pn / self.send.suite.rekey_interval();
        while self.send.epoch < epoch {
            self.send = self.send.next();
        }
        self.send.seal(pn, aad, in_out)
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
        self.with_recv_key(pn, |key| key.open(pn, aad, in_out, tag))
    }

    /// Seals a frame at level `integrity`: returns the tag of `frame`
    /// (header `frame[..split]` and payload, both sent in clear) under
    /// packet number `pn`. The key steps forward as in
    /// [`TrafficKeys::seal`].
    pub fn sign(&mut self, pn: u64, frame: &[u8], split: usize) -> [u8; TAG_LEN] {
        let epoch = pn / self.send.suite.rekey_interval();
        while self.send.epoch < epoch {
            self.send = self.send.next();
        }
        self.send.mac(pn, frame, split, &mut self.scratch)
    }

    /// Checks a level-`integrity` `tag` of `frame` ([`TrafficKeys::sign`]),
    /// choosing the receiving key as [`TrafficKeys::open`] does.
    pub fn verify(
        &mut self,
        pn: u64,
        frame: &[u8],
        split: usize,
        tag: &[u8; TAG_LEN],
    ) -> Result<(), AeadError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let result =
            self.with_recv_key(pn, |key| key.check_mac(pn, frame, split, tag, &mut scratch));
        self.scratch = scratch;
        result
    }

    /// Runs `check` (an open or a tag check) under the receiving key of
    /// `pn`'s epoch: the current or the previous one, or one up to
    /// [`MAX_EPOCH_STEP`] epochs later, derived for it and made current
    /// (the one before it previous) only if `check` succeeds. Older or
    /// further epochs fail.
    fn with_recv_key(
        &mut self,
        pn: u64,
        check: impl FnOnce(&EpochKey) -> Result<(), AeadError>,
    ) -> Result<(), AeadError> {
        let epoch = pn / self.recv.suite.rekey_interval();
        if epoch == self.recv.epoch {
            return check(&self.recv);
        }
        if epoch < self.recv.epoch {
            return match &self.recv_prev {
                Some(prev) if prev.epoch == epoch => check(prev),
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
        check(&cand)?;
        let old = std::mem::replace(&mut self.recv, cand);
        self.recv_prev = Some(prev.unwrap_or(old));
        Ok(())
    }
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
        // Noise REKEY: ENCRYPT(k, 2^64-1, "", zeros(32)) truncated to 32,
        // checked against the RustCrypto ChaCha20-Poly1305 the previous
        // version used (RFC 8439 keystream): the key schedule is unchanged.
        use chacha20poly1305::aead::{AeadInPlace, KeyInit};
        let k = EpochKey::new(Suite::ChaCha20Poly1305, 0, [7; 32]);
        let c =
            chacha20poly1305::ChaCha20Poly1305::new(chacha20poly1305::Key::from_slice(&[7; 32]));
        let mut z = [0u8; 32];
        c.encrypt_in_place_detached(
            &chacha20poly1305::Nonce::from([0, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 255]),
            &[],
            &mut z,
        )
        .unwrap();
        assert_eq!(k.next().key, z);
        assert_eq!(k.next().epoch, 1);
    }

    fn pair_of(suite: Suite) -> (TrafficKeys, TrafficKeys) {
        let a = [0x11; 32];
        let b = [0x22; 32];
        (
            TrafficKeys::with_suite(suite, a, b),
            TrafficKeys::with_suite(suite, b, a),
        )
    }

    #[test]
    fn integrity_tags_check_every_byte_under_both_suites_and_cross_epochs() {
        for suite in [Suite::Aes256Gcm, Suite::ChaCha20Poly1305] {
            let (mut a, mut b) = pair_of(suite);
            let frame: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
            for pn in [0, 5, REKEY_INTERVAL + 3, 3 * REKEY_INTERVAL] {
                let tag = a.sign(pn, &frame, 40);
                b.verify(pn, &frame, 40, &tag)
                    .unwrap_or_else(|_| panic!("{suite}: pn {pn} verifies"));
                // A flipped byte in the header or the payload, another
                // packet number, or another tag fails.
                for at in [0, 39, 40, 299] {
                    let mut bad = frame.clone();
                    bad[at] ^= 0x20;
                    assert!(b.verify(pn, &bad, 40, &tag).is_err(), "{suite}: byte {at}");
                }
                assert!(b.verify(pn + 1, &frame, 40, &tag).is_err(), "{suite}: pn");
                let mut t2 = tag;
                t2[15] ^= 1;
                assert!(b.verify(pn, &frame, 40, &t2).is_err(), "{suite}: tag");
            }
        }
    }

    #[test]
    fn an_aes_gcm_integrity_tag_is_the_tag_the_payload_would_have_encrypted() {
        // The definition on the wire (docs/native-transport.md §Protection):
        // the tag of sealing the payload with the header as associated data.
        let (mut a, _) = pair_of(Suite::Aes256Gcm);
        let (mut c, _) = pair_of(Suite::Aes256Gcm);
        let frame: Vec<u8> = (0..100u8).collect();
        let mut payload = frame[40..].to_vec();
        let sealed = c.seal(9, &frame[..40], &mut payload);
        assert_eq!(a.sign(9, &frame, 40), sealed);
        // Under ChaCha20-Poly1305 the whole frame is associated data.
        let (mut a, _) = pair_of(Suite::ChaCha20Poly1305);
        let (mut c, _) = pair_of(Suite::ChaCha20Poly1305);
        assert_eq!(a.sign(9, &frame, 40), c.seal(9, &frame, &mut []));
    }

    #[test]
    fn aes_gcm_epochs_crossed_and_tampering() {
        let (mut a, mut b) = pair_of(Suite::Aes256Gcm);
        assert_eq!(a.suite(), Suite::Aes256Gcm);
        for pn in [
            0,
            REKEY_INTERVAL - 1,
            REKEY_INTERVAL,
            3 * REKEY_INTERVAL + 5,
        ] {
            roundtrip(&mut a, &mut b, pn).unwrap();
            roundtrip(&mut b, &mut a, pn).unwrap();
        }
        assert_eq!(a.send_epoch(), 3);
        assert_eq!(b.recv_epoch(), 3);
        let pn = 3 * REKEY_INTERVAL + 6;
        let mut buf = b"payload".to_vec();
        let tag = a.seal(pn, b"hdr", &mut buf);
        let mut t = tag;
        t[0] ^= 1;
        assert!(b.open(pn, b"hdr", &mut buf.clone(), &t).is_err());
        assert!(b.open(pn, b"hdR", &mut buf.clone(), &tag).is_err());
        let mut c = buf.clone();
        c[0] ^= 1;
        assert!(b.open(pn, b"hdr", &mut c, &tag).is_err());
        b.open(pn, b"hdr", &mut buf, &tag).unwrap();
        assert_eq!(buf, b"payload");
    }

    #[test]
    fn suites_do_not_interoperate() {
        let (mut a, _) = pair_of(Suite::Aes256Gcm);
        let (_, mut b) = pair_of(Suite::ChaCha20Poly1305);
        let mut buf = b"x".to_vec();
        let tag = a.seal(0, b"", &mut buf);
        assert!(b.open(0, b"", &mut buf, &tag).is_err());
    }

    #[test]
    fn suite_lists() {
        assert_eq!(
            Suite::parse_list("aes256gcm, chacha20"),
            Some(vec![Suite::Aes256Gcm, Suite::ChaCha20Poly1305])
        );
        assert_eq!(
            Suite::parse_list("chacha20"),
            Some(vec![Suite::ChaCha20Poly1305])
        );
        assert_eq!(Suite::parse_list(""), None);
        assert_eq!(Suite::parse_list("des"), None);
        for s in [Suite::Aes256Gcm, Suite::ChaCha20Poly1305] {
            assert_eq!(Suite::from_u8(s.to_u8()), Some(s));
        }
        assert_eq!(Suite::preferred().len(), 2);
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

    /// Seal+open throughput of one core, both suites (`cargo test --release
    /// --workspace --lib -- --ignored --nocapture aead::tests::throughput`;
    /// docs/native-transport.md, "Why `ring`").
    #[test]
    #[ignore]
    fn throughput() {
        for size in [1500usize, 9000, 8192, 65536] {
            for suite in [Suite::Aes256Gcm, Suite::ChaCha20Poly1305] {
                let (mut a, mut b) = pair_of(suite);
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
                "{suite} seal+open {size}-byte frames: {:.0} MB/s per CPU-second ({:.0} frames/s; wall clock {:.0} MB/s)",
                bytes / cpu / 1e6,
                n as f64 / cpu,
                bytes / wall / 1e6
            );
            }
        }
    }
}
