//! Stateless reset (docs/native-transport.md §Stateless reset): a target
//! that receives a channel frame for a channel id it does not know (it
//! restarted, or closed the channel long ago) answers with a RESET frame
//! the initiator can check, so the initiator fails its channel within a
//! round trip instead of waiting for its dead timer.
//!
//! The frame is the 8-byte prefix (kind RESET, flags 0, `dst` = the id the
//! unknown frame was addressed to: the target's side of the channel, the
//! initiator's `peer_id`) and a 16-byte token: keyed BLAKE2s-256 under the
//! group's reset key ([`GroupKeys::reset_key`]) over a label and that id,
//! truncated. The key is derived from the group secret alone, so it
//! survives the target's restart with nothing stored. Any member of the
//! group can compute a token, for any channel id it sees on the wire: a
//! member on the path could end another member's channel, which it could
//! equally do by dropping its frames; an outsider cannot.

use blake2::digest::{FixedOutput, KeyInit, Mac};
use blake2::Blake2sMac256;
use subtle::ConstantTimeEq;

use crate::frame::{Kind, Prefix, PREFIX_LEN};
use crate::group::GroupKeys;

/// Length of a reset token.
pub const TOKEN_LEN: usize = 16;
/// Length of a RESET frame: the prefix and the token. A frame shorter
/// than this is never answered with a RESET (no amplification).
pub const RESET_LEN: usize = PREFIX_LEN + TOKEN_LEN;

const LABEL: &[u8] = b"ethersan reset token";

/// The token of channel id `id` (the target's side) in `keys`' group.
pub fn token(keys: &GroupKeys, id: u32) -> [u8; TOKEN_LEN] {
    let mut mac = <Blake2sMac256 as KeyInit>::new_from_slice(keys.reset_key())
        .unwrap_or_else(|_| unreachable!("a 32-byte key fits BLAKE2s"));
    mac.update(LABEL);
    mac.update(&id.to_be_bytes());
    let full: [u8; 32] = mac.finalize_fixed().into();
    let mut t = [0; TOKEN_LEN];
    t.copy_from_slice(&full[..TOKEN_LEN]);
    t
}

/// Writes into `out` (appended) the RESET answering a channel frame of
/// `trigger_len` bytes addressed to the unknown id `dst`; false, writing
/// nothing, when the trigger is shorter than a RESET (a RESET is never
/// larger than the frame that caused it).
pub fn write(keys: &GroupKeys, dst: u32, trigger_len: usize, out: &mut Vec<u8>) -> bool {
    if trigger_len < RESET_LEN {
        return false;
    }
    Prefix {
        kind: Kind::Reset,
        flags: 0,
        dst,
    }
    .write(out);
    out.extend_from_slice(&token(keys, dst));
    true
}

/// The channel id (the target's side) an authentic RESET frame names;
/// `None` for anything else: another kind, flags set (a RESET has none),
/// a short frame, a wrong token. Trailing bytes (Ethernet padding) are
/// ignored.
pub fn check(keys: &GroupKeys, frame: &[u8]) -> Option<u32> {
    let p = Prefix::parse(frame).ok()?;
    if p.kind != Kind::Reset || p.flags != 0 || frame.len() < RESET_LEN {
        return None;
    }
    let want = token(keys, p.dst);
    bool::from(want.ct_eq(&frame[PREFIX_LEN..RESET_LEN])).then_some(p.dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(secret: &[u8]) -> GroupKeys {
        GroupKeys::derive("lab", secret).expect("keys")
    }

    #[test]
    fn an_authentic_reset_names_its_channel() {
        let k = keys(b"a long enough secret");
        let mut f = Vec::new();
        assert!(write(&k, 77, 200, &mut f));
        assert_eq!(f.len(), RESET_LEN);
        assert_eq!(check(&k, &f), Some(77));
        // Ethernet padding is ignored.
        f.resize(60, 0);
        assert_eq!(check(&k, &f), Some(77));
        // A RESET has no flags: one with flags set is not what was sent.
        f[3] = 0x18;
        assert_eq!(check(&k, &f), None);
    }

    #[test]
    fn a_forged_or_foreign_reset_is_refused() {
        let k = keys(b"a long enough secret");
        let mut f = Vec::new();
        assert!(write(&k, 77, RESET_LEN, &mut f));
        // Another group's token.
        assert_eq!(check(&keys(b"another long secret"), &f), None);
        // Another channel id under the same token.
        let mut g = f.clone();
        g[4..8].copy_from_slice(&78u32.to_be_bytes());
        assert_eq!(check(&k, &g), None);
        // A flipped token bit.
        let mut g = f.clone();
        g[PREFIX_LEN + 3] ^= 1;
        assert_eq!(check(&k, &g), None);
        // Truncated.
        assert_eq!(check(&k, &f[..RESET_LEN - 1]), None);
    }

    /// The token as docs/native-transport.md §Stateless reset defines it,
    /// computed independently (Python's hashlib.blake2s).
    #[test]
    fn the_token_is_the_documented_one() {
        let k = keys(b"a long enough secret");
        let want = "331da795f644f8223e7f18a69e9c46c8";
        let got: String = token(&k, 77).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn no_reset_is_larger_than_its_trigger() {
        let k = keys(b"a long enough secret");
        let mut f = Vec::new();
        assert!(!write(&k, 1, RESET_LEN - 1, &mut f));
        assert!(f.is_empty());
    }
}
