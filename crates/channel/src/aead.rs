//! Per-direction traffic keys: ChaCha20-Poly1305 with the packet number as
//! nonce, and rekeying every [`REKEY_INTERVAL`] packets.
//!
//! PLACEHOLDER: the interface below is the contract; the implementation is
//! being written.

/// Packets per key epoch: key *e* protects packet numbers
/// `e * REKEY_INTERVAL .. (e + 1) * REKEY_INTERVAL`.
pub const REKEY_INTERVAL: u64 = 1 << 20;

/// Length of a Poly1305 tag.
pub const TAG_LEN: usize = 16;

/// A frame failed authentication.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("frame failed authentication")]
pub struct AeadError;

/// The keys of one channel: one for sending, one for receiving.
pub struct TrafficKeys {
    _send: [u8; 32],
    _recv: [u8; 32],
}

impl std::fmt::Debug for TrafficKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TrafficKeys(..)")
    }
}

impl TrafficKeys {
    /// Keys from the handshake's split: `send` for our frames, `recv` for
    /// the peer's (epoch 0).
    pub fn new(send: [u8; 32], recv: [u8; 32]) -> TrafficKeys {
        TrafficKeys {
            _send: send,
            _recv: recv,
        }
    }

    /// Encrypts `in_out` in place under packet number `pn` (its epoch's
    /// key) with `aad` authenticated, and returns the tag. An empty
    /// `in_out` only authenticates `aad` (level `integrity`).
    pub fn seal(&mut self, _pn: u64, _aad: &[u8], _in_out: &mut [u8]) -> [u8; TAG_LEN] {
        todo!("aead::seal")
    }

    /// Checks `tag` over `aad` and `in_out` under packet number `pn` and
    /// decrypts `in_out` in place. On error `in_out` is unspecified.
    pub fn open(
        &mut self,
        _pn: u64,
        _aad: &[u8],
        _in_out: &mut [u8],
        _tag: &[u8; TAG_LEN],
    ) -> Result<(), AeadError> {
        todo!("aead::open")
    }
}
