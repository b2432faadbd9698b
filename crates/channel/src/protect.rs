//! What guards each channel frame (docs/native-transport.md §Protection):
//! at level `none` a CRC32C trailer, or nothing beyond the medium's own
//! end-to-end checksum where it has one (UDP: [`Protector::medium_checksum`]), the channel's AEAD tag (AES-256-GCM or
//! ChaCha20-Poly1305, negotiated in the handshake: [`crate::aead::Suite`])
//! over the whole frame at level `integrity`, the AEAD over the payload with
//! the header as associated data at level `encrypt`; and at every level a
//! replay window over packet numbers.
//!
//! The replay window holds the highest packet number accepted and a bitmap
//! of the [`REPLAY_WINDOW`] numbers below it. A frame is checked against it
//! before its trailer is verified (a cheap early rejection) but the window
//! is updated only once the frame has passed the check, so a forged frame
//! can never move it. At level `none` it only drops frames duplicated by
//! the network before the channel looks at them.

use std::mem::MaybeUninit;

use crate::aead::{TrafficKeys, TAG_LEN};
use crate::frame::{peek_pn, FrameError, Header, HEADER_LEN};
use crate::Level;

/// How many packet numbers below the highest one accepted are remembered.
pub const REPLAY_WINDOW: u64 = 1024;

/// Length of the CRC32C trailer (level `none`).
pub const CRC_LEN: usize = 4;

/// A [`Protector`] could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtectError {
    /// Levels `integrity` and `encrypt` need traffic keys.
    #[error("level {0} needs traffic keys")]
    MissingKeys(Level),
}

/// Packet numbers seen recently: the highest, and which of the
/// [`REPLAY_WINDOW`] below it.
#[derive(Debug, Clone)]
struct ReplayWindow {
    highest: Option<u64>,
    bits: [u64; (REPLAY_WINDOW / 64) as usize],
}

impl ReplayWindow {
    fn new() -> ReplayWindow {
        ReplayWindow {
            highest: None,
            bits: [0; (REPLAY_WINDOW / 64) as usize],
        }
    }

    fn slot(pn: u64) -> (usize, u64) {
        let i = pn % REPLAY_WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    /// Whether `pn` may be accepted (not seen, not too old).
    fn check(&self, pn: u64) -> bool {
        match self.highest {
            None => true,
            Some(h) if pn > h => true,
            Some(h) if h - pn >= REPLAY_WINDOW => false,
            Some(_) => {
                let (w, b) = Self::slot(pn);
                self.bits[w] & b == 0
            }
        }
    }

    /// Records `pn` (which passed [`ReplayWindow::check`]).
    fn update(&mut self, pn: u64) {
        match self.highest {
            Some(h) if pn <= h => {}
            Some(h) if pn - h < REPLAY_WINDOW => {
                for p in h + 1..pn {
                    let (w, b) = Self::slot(p);
                    self.bits[w] &= !b;
                }
                self.highest = Some(pn);
            }
            _ => {
                self.bits = [0; (REPLAY_WINDOW / 64) as usize];
                self.highest = Some(pn);
            }
        }
        let (w, b) = Self::slot(pn);
        self.bits[w] |= b;
    }
}

/// One channel's frame protection: its level, its traffic keys and the
/// replay window of the frames it receives.
#[derive(Debug)]
pub struct Protector {
    level: Level,
    keys: Option<TrafficKeys>,
    replay: ReplayWindow,
    /// Level `none` appends and checks a CRC32C trailer (false: the
    /// medium's checksum is the frame's only check).
    crc: bool,
}

impl Protector {
    /// Protection at `level`; `integrity` and `encrypt` need `keys` (at
    /// level `none` they are not used).
    pub fn new(level: Level, keys: Option<TrafficKeys>) -> Result<Protector, ProtectError> {
        if level != Level::None && keys.is_none() {
            return Err(ProtectError::MissingKeys(level));
        }
        Ok(Protector {
            level,
            keys,
            replay: ReplayWindow::new(),
            crc: true,
        })
    }

    /// Level `none` without keys: CRC32C trailers.
    pub fn crc_only() -> Protector {
        Protector {
            level: Level::None,
            keys: None,
            replay: ReplayWindow::new(),
            crc: true,
        }
    }

    /// At level `none`, no CRC32C trailer: the frame's check is the
    /// medium's own end-to-end checksum (UDP's, which the kernel verifies
    /// and the NIC or the loopback computes for free), as iSCSI without
    /// digests relies on TCP's. Both ends of a channel must agree: the
    /// endpoint sets this for every channel on a UDP medium. Other levels
    /// are unchanged (their tag is the check).
    pub fn medium_checksum(mut self) -> Protector {
        self.crc = false;
        self
    }

    /// Whether a sealed frame is its header and payload as they are (level
    /// `none` on the medium's checksum: no trailer, nothing encrypted), so
    /// that the payload may be sent from where it lies.
    pub fn seals_nothing(&self) -> bool {
        self.level == Level::None && !self.crc
    }

    /// The channel's level.
    pub fn level(&self) -> Level {
        self.level
    }

    /// Bytes [`Protector::seal`] appends: 4 (CRC32C), 0 (level `none` on
    /// the medium's checksum) or 16 (AEAD tag).
    pub fn trailer_len(&self) -> usize {
        match self.level {
            Level::None if !self.crc => 0,
            Level::None => CRC_LEN,
            Level::Integrity | Level::Encrypt => TAG_LEN,
        }
    }

    /// Protects `frame`, a channel header (its packet number is the nonce)
    /// followed by the payload: at level `encrypt` the payload is encrypted
    /// in place; then the trailer is appended.
    pub fn seal(&mut self, frame: &mut Vec<u8>) {
        self.seal_from(frame, 0)
    }

    /// [`seal`](Self::seal) for a frame that starts at `start` in `buf`
    /// (what comes before, such as room for an Ethernet header, is left
    /// alone).
    pub fn seal_from(&mut self, buf: &mut Vec<u8>, start: usize) {
        let start = start.min(buf.len());
        let frame = &mut buf[start..];
        let pn = peek_pn(frame).unwrap_or(0);
        let keys = match (&mut self.keys, self.level) {
            (Some(keys), Level::Integrity | Level::Encrypt) => keys,
            _ if !self.crc => return,
            _ => {
                let crc = crc_fast::crc32_iscsi(frame);
                buf.extend_from_slice(&crc.to_be_bytes());
                return;
            }
        };
        let tag = if self.level == Level::Encrypt {
            let split = HEADER_LEN.min(frame.len());
            let (header, payload) = frame.split_at_mut(split);
            keys.seal(pn, header, payload)
        } else {
            keys.sign(pn, frame, HEADER_LEN)
        };
        buf.extend_from_slice(&tag);
    }

    /// Checks a received channel frame (prefix onwards; anything after the
    /// trailer is ignored): header, lengths, replay window, trailer; at
    /// level `encrypt` decrypts the payload in place; then records its
    /// packet number in the replay window. Returns the header and the
    /// payload. On error nothing is recorded.
    pub fn open<'a>(&mut self, frame: &'a mut [u8]) -> Result<(Header, &'a [u8]), FrameError> {
        let (header, payload) = self.verify(frame)?;
        self.record(header.pn);
        Ok((header, payload))
    }

    /// [`Protector::open`] without recording the packet number: for a
    /// caller that checks more before accepting the frame, then calls
    /// [`Protector::record`]. (The traffic keys may advance to a new
    /// epoch.)
    pub fn verify<'a>(&mut self, frame: &'a mut [u8]) -> Result<(Header, &'a [u8]), FrameError> {
        let header = Header::parse(frame)?;
        let trailer = self.trailer_len();
        let end = HEADER_LEN + usize::from(header.len);
        if frame.len() < end + trailer {
            return Err(FrameError::LengthMismatch {
                len: header.len,
                trailer,
                need: end + trailer,
                have: frame.len(),
            });
        }
        if !self.replay.check(header.pn) {
            return Err(FrameError::Replayed { pn: header.pn });
        }
        let (body, rest) = frame.split_at_mut(end);
        let rest = &rest[..trailer];
        match (&mut self.keys, self.level) {
            (Some(keys), Level::Integrity | Level::Encrypt) => {
                let mut tag = [0; TAG_LEN];
                tag.copy_from_slice(rest);
                let result = if self.level == Level::Encrypt {
                    let (h, payload) = body.split_at_mut(HEADER_LEN);
                    keys.open(header.pn, h, payload, &tag)
                } else {
                    keys.verify(header.pn, body, HEADER_LEN, &tag)
                };
                result.map_err(|_| FrameError::Unauthenticated)?;
            }
            _ if !self.crc => {}
            _ => {
                let want = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
                if crc_fast::crc32_iscsi(body) != want {
                    return Err(FrameError::BadCrc);
                }
            }
        }
        let body: &'a [u8] = body;
        Ok((header, &body[HEADER_LEN..]))
    }

    /// Seals a frame whose header is already at `buf[start..start +
    /// HEADER_LEN]` with the payload gathered from `parts` (appended, then
    /// encrypted at level `encrypt`), and appends the trailer: the one pass
    /// from the sender's buffers into the frame. The header's length field
    /// must already give the payload's length.
    pub fn seal_gather(&mut self, buf: &mut Vec<u8>, start: usize, parts: &[&[u8]]) {
        buf.truncate(start.saturating_add(HEADER_LEN).min(buf.len()));
        for p in parts {
            buf.extend_from_slice(p);
        }
        self.seal_from(buf, start);
    }

    /// [`Protector::verify`] out of place: checks `frame` (unchanged) and
    /// writes its payload, decrypted at level `encrypt`, to the start of
    /// `dst`, which must hold at least the payload's length (else
    /// [`FrameError::LengthMismatch`]). The packet number is not recorded
    /// (call [`Protector::record`]). On error `dst` is unspecified.
    ///
    /// At level `encrypt` the ciphertext is copied into `dst` and decrypted
    /// there while it is in cache (`ring` opens in place only), under
    /// either suite.
    pub fn verify_into(&mut self, frame: &[u8], dst: &mut [u8]) -> Result<Header, FrameError> {
        // SAFETY: `verify_into_uninit` only ever writes initialised bytes
        // (a copy of the frame's payload, then the AEAD's output over
        // them), so `dst` holds initialised `u8`s whatever happens; the
        // two types have the same layout.
        let dst = unsafe { &mut *(std::ptr::from_mut::<[u8]>(dst) as *mut [MaybeUninit<u8>]) };
        self.verify_into_uninit(frame, dst)
    }

    /// [`Protector::verify_into`] into memory that may not be initialised
    /// (a read buffer registered for placed data, never zeroed): the
    /// payload is copied into `dst` with one `MaybeUninit` copy, and only
    /// then, once those bytes are initialised, viewed as `&mut [u8]` to be
    /// decrypted in place. On success the first `len` bytes of `dst` (the
    /// header's payload length) hold the payload; on error they are
    /// initialised but unspecified (a forged frame's bytes), or untouched
    /// when the frame was rejected before the copy.
    pub fn verify_into_uninit(
        &mut self,
        frame: &[u8],
        dst: &mut [MaybeUninit<u8>],
    ) -> Result<Header, FrameError> {
        let header = Header::parse(frame)?;
        let trailer = self.trailer_len();
        let len = usize::from(header.len);
        let end = HEADER_LEN + len;
        if frame.len() < end + trailer || dst.len() < len {
            return Err(FrameError::LengthMismatch {
                len: header.len,
                trailer,
                need: end + trailer,
                have: frame.len().min(HEADER_LEN + dst.len() + trailer),
            });
        }
        if !self.replay.check(header.pn) {
            return Err(FrameError::Replayed { pn: header.pn });
        }
        let rest = &frame[end..end + trailer];
        let dst: &mut [u8] = dst[..len].write_copy_of_slice(&frame[HEADER_LEN..end]);
        match (&mut self.keys, self.level) {
            (Some(keys), Level::Integrity | Level::Encrypt) => {
                let mut tag = [0; TAG_LEN];
                tag.copy_from_slice(rest);
                let result = if self.level == Level::Encrypt {
                    keys.open(header.pn, &frame[..HEADER_LEN], dst, &tag)
                } else {
                    keys.verify(header.pn, &frame[..end], HEADER_LEN, &tag)
                };
                result.map_err(|_| FrameError::Unauthenticated)?;
            }
            _ if !self.crc => {}
            _ => {
                let want = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
                if crc_fast::crc32_iscsi(&frame[..end]) != want {
                    return Err(FrameError::BadCrc);
                }
            }
        }
        Ok(header)
    }

    /// Records an authenticated frame's packet number in the replay window.
    pub fn record(&mut self, pn: u64) {
        self.replay.update(pn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Kind, FLAG_LAST};

    fn frame(pn: u64, payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        Header {
            kind: Kind::Data,
            flags: FLAG_LAST,
            dst: 9,
            pn,
            seq: 3,
            frag: 0,
            len: payload.len() as u16,
            ack: 0,
            sack: 0,
            credit: 64,
        }
        .write(&mut f);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn gathered_seal_and_out_of_place_open_at_every_level() {
        for level in [Level::None, Level::Integrity, Level::Encrypt] {
            let keys = |a: u8, b: u8| Some(TrafficKeys::new([a; 32], [b; 32]));
            let mut tx = Protector::new(level, keys(1, 2)).expect("tx");
            let mut rx = Protector::new(level, keys(2, 1)).expect("rx");
            let payload = b"gathered from three parts";
            let mut buf = vec![0xAA; 14];
            let f = frame(7, payload);
            buf.extend_from_slice(&f[..HEADER_LEN]);
            tx.seal_gather(
                &mut buf,
                14,
                &[&payload[..8], &payload[8..8], &payload[8..]],
            );
            let mut whole = frame(7, payload);
            Protector::new(level, keys(1, 2))
                .expect("tx2")
                .seal(&mut whole);
            assert_eq!(&buf[14..], &whole[..], "{level:?}");
            let sealed = buf[14..].to_vec();
            let mut dst = vec![0u8; payload.len()];
            let h = rx.verify_into(&sealed, &mut dst).expect("opens");
            assert_eq!(h.pn, 7);
            assert_eq!(&dst[..], payload);
            assert_eq!(&buf[14..], &sealed[..], "the frame is left alone");
            let mut short = vec![0u8; payload.len() - 1];
            assert!(matches!(
                rx.verify_into(&sealed, &mut short),
                Err(FrameError::LengthMismatch { .. })
            ));
            for bit in [3 * 8, (HEADER_LEN + 2) * 8 + 1, (sealed.len() - 1) * 8] {
                let mut g = sealed.clone();
                g[bit / 8] ^= 1 << (bit % 8);
                assert!(rx.verify_into(&g, &mut dst).is_err(), "{level:?} bit {bit}");
            }
        }
    }

    #[test]
    fn crc_round_trip_with_padding() {
        let mut p = Protector::crc_only();
        assert_eq!(p.trailer_len(), 4);
        assert_eq!(p.level(), Level::None);
        let mut f = frame(0, b"hello");
        p.seal(&mut f);
        assert_eq!(f.len(), HEADER_LEN + 5 + 4);
        f.resize(60, 0);
        let (h, payload) = p.open(&mut f).expect("opens");
        assert_eq!(h.pn, 0);
        assert_eq!(payload, b"hello");
    }

    #[test]
    fn medium_checksum_means_no_trailer_at_level_none_only() {
        let mut tx = Protector::crc_only().medium_checksum();
        let mut rx = Protector::crc_only().medium_checksum();
        assert_eq!(tx.trailer_len(), 0);
        let mut f = frame(3, b"over udp");
        tx.seal(&mut f);
        assert_eq!(f.len(), HEADER_LEN + 8, "nothing appended");
        let mut g = f.clone();
        let (h, payload) = rx.open(&mut g).expect("opens");
        assert_eq!((h.pn, payload), (3, &b"over udp"[..]));
        // A CRC-trailer peer's frame is longer than its header says: the
        // extra bytes are ignored, a frame shorter than its header is not.
        let mut short = f[..f.len() - 1].to_vec();
        assert!(matches!(
            rx.open(&mut short),
            Err(FrameError::LengthMismatch { .. })
        ));
        let mut dst = [0u8; 8];
        let mut f4 = frame(4, b"placed!!");
        tx.seal(&mut f4);
        rx.verify_into(&f4, &mut dst).expect("placed frame opens");
        assert_eq!(&dst, b"placed!!");
        // Levels with keys keep their tag.
        let keys = Some(TrafficKeys::new([1; 32], [2; 32]));
        let p = Protector::new(Level::Integrity, keys)
            .expect("keys")
            .medium_checksum();
        assert_eq!(p.trailer_len(), TAG_LEN);
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let mut tx = Protector::crc_only();
        let mut f = frame(5, b"some payload bytes");
        tx.seal(&mut f);
        for bit in 0..f.len() * 8 {
            let mut g = f.clone();
            g[bit / 8] ^= 1 << (bit % 8);
            let mut rx = Protector::crc_only();
            assert!(rx.open(&mut g).is_err(), "bit {bit} not caught");
        }
        let mut rx = Protector::crc_only();
        assert!(rx.open(&mut f.clone()).is_ok());
    }

    #[test]
    fn length_mismatch() {
        let mut p = Protector::crc_only();
        let mut f = frame(1, b"abcdef");
        p.seal(&mut f);
        f.truncate(f.len() - 1);
        assert!(matches!(
            p.open(&mut f),
            Err(FrameError::LengthMismatch {
                len: 6,
                trailer: 4,
                need: 50,
                have: 49
            })
        ));
    }

    #[test]
    fn replay_window() {
        let mut tx = Protector::crc_only();
        let mut rx = Protector::crc_only();
        let sealed: Vec<Vec<u8>> = (0..3000u64)
            .map(|pn| {
                let mut f = frame(pn, &pn.to_be_bytes());
                tx.seal(&mut f);
                f
            })
            .collect();
        let open = |rx: &mut Protector, pn: usize| rx.open(&mut sealed[pn].clone()).map(|_| ());
        assert_eq!(open(&mut rx, 10), Ok(()));
        assert_eq!(open(&mut rx, 10), Err(FrameError::Replayed { pn: 10 }));
        assert_eq!(open(&mut rx, 3), Ok(()));
        assert_eq!(open(&mut rx, 3), Err(FrameError::Replayed { pn: 3 }));
        assert_eq!(open(&mut rx, 1033), Ok(()));
        // 1033 - 1024 = 9 is the oldest still remembered; 9 is below it.
        assert_eq!(open(&mut rx, 9), Err(FrameError::Replayed { pn: 9 }));
        assert_eq!(open(&mut rx, 10), Err(FrameError::Replayed { pn: 10 }));
        assert_eq!(open(&mut rx, 11), Ok(()));
        assert_eq!(open(&mut rx, 11), Err(FrameError::Replayed { pn: 11 }));
        // A jump past the whole window forgets everything below.
        assert_eq!(open(&mut rx, 2999), Ok(()));
        assert_eq!(open(&mut rx, 1976), Ok(()));
        assert_eq!(open(&mut rx, 1976), Err(FrameError::Replayed { pn: 1976 }));
        assert_eq!(open(&mut rx, 1975), Err(FrameError::Replayed { pn: 1975 }));
        assert_eq!(open(&mut rx, 2998), Ok(()));
    }

    #[test]
    fn a_corrupt_frame_does_not_move_the_window() {
        let mut tx = Protector::crc_only();
        let mut rx = Protector::crc_only();
        let mut good = frame(7, b"x");
        tx.seal(&mut good);
        let mut bad = good.clone();
        let n = bad.len();
        bad[n - 1] ^= 0xFF;
        assert_eq!(rx.open(&mut bad).map(|_| ()), Err(FrameError::BadCrc));
        assert!(rx.open(&mut good).is_ok());
    }

    #[test]
    fn keys_required_above_none() {
        assert_eq!(
            Protector::new(Level::Encrypt, None).map(|_| ()),
            Err(ProtectError::MissingKeys(Level::Encrypt))
        );
        assert_eq!(
            Protector::new(Level::Integrity, None).map(|_| ()),
            Err(ProtectError::MissingKeys(Level::Integrity))
        );
        assert!(Protector::new(Level::None, None).is_ok());
    }
}
