//! Group discovery: a member asks who serves the group, targets of the
//! group answer with their catalog (`docs/native-transport.md`, "Group
//! discovery").
//!
//! `DISCOVER` (after the 8-byte prefix: kind `0x20`, flags 0, destination
//! 0), `65 + n` bytes:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 8 | 16 | query nonce (random) |
//! | 24 | 8 | sender's time, milliseconds since the Unix epoch |
//! | 32 | 1 | group name length *n* (1..=64) |
//! | 33 | *n* | group name (UTF-8) |
//! | 33 + *n* | 32 | keyed BLAKE2s-256 of bytes `0 .. 33 + n` under the group's discovery MAC key |
//!
//! `DISCOVER_REPLY` (kind `0x21`, flags: part index, destination 0):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 8 | 16 | the query's nonce |
//! | 24 | 12 | reply nonce (random; the ChaCha20-Poly1305 nonce) |
//! | 36 | 1 | part count (1..=255; the flags byte, the part index, is below it) |
//! | 37 | 2 | ciphertext length *c* |
//! | 39 | *c* | the part's catalog, encrypted under the group's reply key with bytes `0 .. 39` as associated data |
//! | 39 + *c* | 16 | Poly1305 tag; anything after it (Ethernet padding) is ignored |
//!
//! A part's catalog (integers big-endian, strings UTF-8 with a 2-byte
//! length): server name, target count (2), then per target its name, an
//! alias flag (1: 0 none, 1 present) and the alias if present, a LUN count
//! (2) and per LUN: LUN (8), blocks (8), block size (4), level (1). A
//! catalog too large for one frame is split over several parts, whole
//! targets in each where they fit; a target larger than a frame is split
//! by its LUNs over consecutive parts, each repeating its name (and
//! [`assemble`] joins them again). Each part decodes on its own.

use std::collections::{HashSet, VecDeque};

use blake2::digest::{FixedOutput, KeyInit, Mac};
use blake2::Blake2sMac256;
use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce, Tag};
use subtle::ConstantTimeEq;

use crate::group::GroupKeys;
use crate::Level;

use crate::frame::{Kind, MAGIC, PREFIX_LEN, VERSION};

const KIND_DISCOVER: u8 = Kind::Discover as u8;
const KIND_DISCOVER_REPLY: u8 = Kind::DiscoverReply as u8;

const NONCE_LEN: usize = 16;
const REPLY_NONCE_LEN: usize = 12;
const MAC_LEN: usize = 32;
const TAG_LEN: usize = 16;
/// `DISCOVER` up to the group name.
const QUERY_HEAD: usize = PREFIX_LEN + NONCE_LEN + 8 + 1;
/// `DISCOVER_REPLY` up to the ciphertext (its associated data).
const REPLY_HEAD: usize = PREFIX_LEN + NONCE_LEN + REPLY_NONCE_LEN + 1 + 2;
/// A reply's bytes besides its catalog.
pub const REPLY_OVERHEAD: usize = REPLY_HEAD + TAG_LEN;

/// How far a query's time may be from the target's, in milliseconds.
pub const MAX_CLOCK_SKEW_MS: u64 = 60_000;
/// How long a query nonce is remembered, in milliseconds.
pub const NONCE_MEMORY_MS: u64 = 2 * MAX_CLOCK_SKEW_MS;
/// How many query nonces a target remembers; when that many valid queries
/// came in the last [`NONCE_MEMORY_MS`], further ones are not answered.
pub const MAX_REMEMBERED_NONCES: usize = 4096;

/// Bytes of one LUN in a catalog.
const LUN_LEN: usize = 8 + 8 + 4 + 1;

/// What a discovery responder offers: this server and its targets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    /// The server's name.
    pub server: String,
    /// Its targets.
    pub targets: Vec<CatalogTarget>,
}

/// One target in a catalog.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CatalogTarget {
    /// The iSCSI name.
    pub name: String,
    /// The alias, if any.
    pub alias: Option<String>,
    /// Its LUNs.
    pub luns: Vec<CatalogLun>,
}

/// One LUN in a catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogLun {
    /// The LUN.
    pub lun: u64,
    /// Its size in blocks.
    pub blocks: u64,
    /// Its block size in bytes.
    pub block_size: u32,
    /// The least channel level that may address it.
    pub level: Level,
}

/// Why a discovery frame was refused. A target answers none of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    /// Not a frame of the expected kind (magic, version, kind, flags or
    /// destination).
    #[error("not a {0} frame")]
    WrongKind(&'static str),
    /// The frame is cut short or its lengths disagree.
    #[error("malformed discovery frame: {0}")]
    Malformed(&'static str),
    /// A query for another group.
    #[error("query for another group")]
    OtherGroup,
    /// The query's MAC does not verify: not a member.
    #[error("query MAC does not verify (not a member)")]
    BadMac,
    /// The query's time is too far from ours.
    #[error("query time is {skew_ms} ms off (at most {MAX_CLOCK_SKEW_MS} allowed)")]
    ClockSkew {
        /// How far off, in milliseconds.
        skew_ms: u64,
    },
    /// The query's nonce was seen in the last [`NONCE_MEMORY_MS`].
    #[error("query replayed")]
    Replayed,
    /// Too many queries lately to remember another nonce.
    #[error("too many discovery queries lately")]
    Busy,
    /// A reply to another query.
    #[error("reply to another query")]
    OtherQuery,
    /// A reply that does not decrypt (another group's, or forged).
    #[error("reply failed authentication")]
    Decrypt,
    /// A decrypted catalog that does not decode.
    #[error("bad catalog: {0}")]
    BadCatalog(&'static str),
    /// The catalog cannot be sent within the frame size.
    #[error("catalog does not fit: {0}")]
    TooLarge(&'static str),
    /// The parts given to [`assemble`] are not one complete reply.
    #[error("incomplete reply: {0}")]
    Incomplete(&'static str),
    /// The system's random generator failed.
    #[error("random generator: {0}")]
    Random(String),
}

fn prefix(kind: u8, flags: u8) -> [u8; PREFIX_LEN] {
    [MAGIC, VERSION, kind, flags, 0, 0, 0, 0]
}

/// Checks magic, version, kind and destination 0; returns the flags.
fn check_prefix(frame: &[u8], kind: u8, name: &'static str) -> Result<u8, DiscoveryError> {
    match frame {
        [MAGIC, VERSION, k, flags, 0, 0, 0, 0, ..] if *k == kind => Ok(*flags),
        _ => Err(DiscoveryError::WrongKind(name)),
    }
}

fn query_mac(keys: &GroupKeys, data: &[u8]) -> [u8; MAC_LEN] {
    let mut mac = <Blake2sMac256 as KeyInit>::new_from_slice(keys.discovery_mac_key())
        .unwrap_or_else(|_| unreachable!("a 32-byte key fits BLAKE2s"));
    mac.update(data);
    mac.finalize_fixed().into()
}

fn reply_cipher(keys: &GroupKeys) -> ChaCha20Poly1305 {
    ChaCha20Poly1305::new(Key::from_slice(keys.discovery_reply_key()))
}

/// A `DISCOVER` frame for `keys`' group, sent at `now_unix_ms`, with a
/// random `nonce` (which the replies echo).
pub fn query(keys: &GroupKeys, now_unix_ms: u64, nonce: [u8; 16]) -> Vec<u8> {
    let group = keys.group().as_bytes();
    let mut f = Vec::with_capacity(QUERY_HEAD + group.len() + MAC_LEN);
    f.extend_from_slice(&prefix(KIND_DISCOVER, 0));
    f.extend_from_slice(&nonce);
    f.extend_from_slice(&now_unix_ms.to_be_bytes());
    // GroupKeys holds names of at most 64 bytes.
    f.push(group.len() as u8);
    f.extend_from_slice(group);
    let mac = query_mac(keys, &f);
    f.extend_from_slice(&mac);
    f
}

/// A target's side of discovery: checks queries, remembers their nonces,
/// builds the encrypted replies.
pub struct DiscoveryResponder {
    keys: GroupKeys,
    seen: HashSet<[u8; NONCE_LEN]>,
    /// (time first seen, nonce), oldest first.
    order: VecDeque<(u64, [u8; NONCE_LEN])>,
}

impl std::fmt::Debug for DiscoveryResponder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveryResponder")
            .field("group", &self.keys.group())
            .field("remembered", &self.order.len())
            .finish_non_exhaustive()
    }
}

impl DiscoveryResponder {
    /// A responder for `keys`' group.
    pub fn new(keys: GroupKeys) -> Self {
        DiscoveryResponder {
            keys,
            seen: HashSet::new(),
            order: VecDeque::new(),
        }
    }

    /// Answers a `DISCOVER`: the reply frames (one per part, each at most
    /// `max_frame` bytes) of `catalog`, when the query is for our group, its
    /// MAC verifies, its time is within [`MAX_CLOCK_SKEW_MS`] of
    /// `now_unix_ms` and its nonce is new. Otherwise an error, and nothing
    /// must be sent.
    pub fn handle_query(
        &mut self,
        frame: &[u8],
        now_unix_ms: u64,
        catalog: &Catalog,
        max_frame: usize,
    ) -> Result<Vec<Vec<u8>>, DiscoveryError> {
        if check_prefix(frame, KIND_DISCOVER, "DISCOVER")? != 0 {
            return Err(DiscoveryError::WrongKind("DISCOVER"));
        }
        let Some(&glen) = frame.get(QUERY_HEAD - 1) else {
            return Err(DiscoveryError::Malformed("DISCOVER cut short"));
        };
        let body_len = QUERY_HEAD + usize::from(glen);
        if frame.len() != body_len + MAC_LEN {
            return Err(DiscoveryError::Malformed("DISCOVER length"));
        }
        if &frame[QUERY_HEAD..body_len] != self.keys.group().as_bytes() {
            return Err(DiscoveryError::OtherGroup);
        }
        let mac = query_mac(&self.keys, &frame[..body_len]);
        if !bool::from(mac.ct_eq(&frame[body_len..])) {
            return Err(DiscoveryError::BadMac);
        }
        let mut t = [0u8; 8];
        t.copy_from_slice(&frame[PREFIX_LEN + NONCE_LEN..QUERY_HEAD - 1]);
        let skew_ms = u64::from_be_bytes(t).abs_diff(now_unix_ms);
        if skew_ms > MAX_CLOCK_SKEW_MS {
            return Err(DiscoveryError::ClockSkew { skew_ms });
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&frame[PREFIX_LEN..PREFIX_LEN + NONCE_LEN]);
        self.forget(now_unix_ms);
        if self.seen.contains(&nonce) {
            return Err(DiscoveryError::Replayed);
        }
        if self.seen.len() >= MAX_REMEMBERED_NONCES {
            return Err(DiscoveryError::Busy);
        }
        self.seen.insert(nonce);
        self.order.push_back((now_unix_ms, nonce));
        seal_reply(&self.keys, &nonce, catalog, max_frame)
    }

    /// Forgets nonces older than [`NONCE_MEMORY_MS`] (or from a future the
    /// clock has since left).
    fn forget(&mut self, now: u64) {
        while let Some(&(at, nonce)) = self.order.front() {
            if at.abs_diff(now) <= NONCE_MEMORY_MS {
                break;
            }
            self.seen.remove(&nonce);
            self.order.pop_front();
        }
    }
}

/// The reply frames of `catalog` for the query with `nonce`.
fn seal_reply(
    keys: &GroupKeys,
    query_nonce: &[u8; NONCE_LEN],
    catalog: &Catalog,
    max_frame: usize,
) -> Result<Vec<Vec<u8>>, DiscoveryError> {
    let budget = max_frame
        .checked_sub(REPLY_OVERHEAD)
        .ok_or(DiscoveryError::TooLarge(
            "frame smaller than a reply's header",
        ))?
        .min(usize::from(u16::MAX));
    let parts = split(catalog, budget)?;
    let count =
        u8::try_from(parts.len()).map_err(|_| DiscoveryError::TooLarge("more than 255 parts"))?;
    let cipher = reply_cipher(keys);
    let mut frames = Vec::with_capacity(parts.len());
    for (index, plain) in parts.into_iter().enumerate() {
        let mut reply_nonce = [0u8; REPLY_NONCE_LEN];
        getrandom::fill(&mut reply_nonce).map_err(|e| DiscoveryError::Random(e.to_string()))?;
        let mut f = Vec::with_capacity(REPLY_OVERHEAD + plain.len());
        // index < count <= 255.
        f.extend_from_slice(&prefix(KIND_DISCOVER_REPLY, index as u8));
        f.extend_from_slice(query_nonce);
        f.extend_from_slice(&reply_nonce);
        f.push(count);
        // plain.len() <= budget <= u16::MAX.
        f.extend_from_slice(&(plain.len() as u16).to_be_bytes());
        let mut body = plain;
        let tag = cipher
            .encrypt_in_place_detached(Nonce::from_slice(&reply_nonce), &f, &mut body)
            .map_err(|_| DiscoveryError::TooLarge("ciphertext"))?;
        f.extend_from_slice(&body);
        f.extend_from_slice(&tag);
        frames.push(f);
    }
    Ok(frames)
}

/// One part of a reply, opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyPart {
    /// Its index, `0 .. count`.
    pub index: u8,
    /// How many parts the reply has.
    pub count: u8,
    /// This part's targets (a target split over parts appears in each,
    /// with some of its LUNs).
    pub catalog: Catalog,
}

/// Opens a `DISCOVER_REPLY` to our query with `query_nonce`.
pub fn open_reply(
    keys: &GroupKeys,
    query_nonce: &[u8; 16],
    frame: &[u8],
) -> Result<ReplyPart, DiscoveryError> {
    let index = check_prefix(frame, KIND_DISCOVER_REPLY, "DISCOVER_REPLY")?;
    if frame.len() < REPLY_OVERHEAD {
        return Err(DiscoveryError::Malformed("DISCOVER_REPLY cut short"));
    }
    if &frame[PREFIX_LEN..PREFIX_LEN + NONCE_LEN] != query_nonce {
        return Err(DiscoveryError::OtherQuery);
    }
    let count = frame[REPLY_HEAD - 3];
    if index >= count {
        return Err(DiscoveryError::Malformed("part index beyond count"));
    }
    let clen = usize::from(u16::from_be_bytes([
        frame[REPLY_HEAD - 2],
        frame[REPLY_HEAD - 1],
    ]));
    let end = REPLY_HEAD + clen;
    if frame.len() < end + TAG_LEN {
        return Err(DiscoveryError::Malformed("DISCOVER_REPLY cut short"));
    }
    let nonce = Nonce::from_slice(&frame[PREFIX_LEN + NONCE_LEN..REPLY_HEAD - 3]);
    let mut body = frame[REPLY_HEAD..end].to_vec();
    reply_cipher(keys)
        .decrypt_in_place_detached(
            nonce,
            &frame[..REPLY_HEAD],
            &mut body,
            Tag::from_slice(&frame[end..end + TAG_LEN]),
        )
        .map_err(|_| DiscoveryError::Decrypt)?;
    Ok(ReplyPart {
        index,
        count,
        catalog: Catalog::decode(&body)?,
    })
}

/// Joins the parts of one reply (any order) into the whole catalog: every
/// index `0 .. count` exactly once, one server; a target split over
/// consecutive parts becomes one again (see [`Catalog::merge`]).
pub fn assemble(mut parts: Vec<ReplyPart>) -> Result<Catalog, DiscoveryError> {
    parts.sort_by_key(|p| p.index);
    let Some(first) = parts.first() else {
        return Err(DiscoveryError::Incomplete("no parts"));
    };
    let count = first.count;
    if parts.len() != usize::from(count) {
        return Err(DiscoveryError::Incomplete("parts missing or repeated"));
    }
    let mut whole = Catalog {
        server: first.catalog.server.clone(),
        targets: Vec::new(),
    };
    for (i, p) in parts.into_iter().enumerate() {
        if usize::from(p.index) != i || p.count != count || p.catalog.server != whole.server {
            return Err(DiscoveryError::Incomplete("parts of different replies"));
        }
        whole.merge(p.catalog);
    }
    Ok(whole)
}

// ---- catalog encoding ----

fn str_len(s: &str) -> usize {
    2 + s.len()
}

/// Bytes of a target's header (name, alias, LUN count).
fn target_head_len(t: &CatalogTarget) -> usize {
    str_len(&t.name) + 1 + t.alias.as_deref().map_or(0, str_len) + 2
}

fn put_str(out: &mut Vec<u8>, s: &str, what: &'static str) -> Result<(), DiscoveryError> {
    let len = u16::try_from(s.len()).map_err(|_| DiscoveryError::TooLarge(what))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put_target(
    out: &mut Vec<u8>,
    t: &CatalogTarget,
    luns: &[CatalogLun],
) -> Result<(), DiscoveryError> {
    put_str(out, &t.name, "target name longer than 65535 bytes")?;
    match &t.alias {
        None => out.push(0),
        Some(a) => {
            out.push(1);
            put_str(out, a, "alias longer than 65535 bytes")?;
        }
    }
    let n =
        u16::try_from(luns.len()).map_err(|_| DiscoveryError::TooLarge("more than 65535 LUNs"))?;
    out.extend_from_slice(&n.to_be_bytes());
    for l in luns {
        out.extend_from_slice(&l.lun.to_be_bytes());
        out.extend_from_slice(&l.blocks.to_be_bytes());
        out.extend_from_slice(&l.block_size.to_be_bytes());
        out.push(l.level.to_u8());
    }
    Ok(())
}

/// A part being built: (target, range of its LUNs).
type Piece<'a> = (&'a CatalogTarget, std::ops::Range<usize>);

fn encode_part(server: &str, pieces: &[Piece<'_>]) -> Result<Vec<u8>, DiscoveryError> {
    let mut out = Vec::new();
    put_str(&mut out, server, "server name longer than 65535 bytes")?;
    let n = u16::try_from(pieces.len())
        .map_err(|_| DiscoveryError::TooLarge("more than 65535 targets"))?;
    out.extend_from_slice(&n.to_be_bytes());
    for (t, r) in pieces {
        put_target(&mut out, t, &t.luns[r.clone()])?;
    }
    Ok(out)
}

/// Splits a catalog into encoded parts of at most `budget` bytes each.
fn split(catalog: &Catalog, budget: usize) -> Result<Vec<Vec<u8>>, DiscoveryError> {
    let base = str_len(&catalog.server) + 2;
    let mut parts = Vec::new();
    let mut pieces: Vec<Piece<'_>> = Vec::new();
    let mut size = base;
    for t in &catalog.targets {
        let head = target_head_len(t);
        let whole = head + LUN_LEN * t.luns.len();
        if size + whole > budget && !pieces.is_empty() && base + whole <= budget {
            // Whole targets: start a new part rather than split this one.
            parts.push(encode_part(&catalog.server, &pieces)?);
            pieces.clear();
            size = base;
        }
        let mut next = 0;
        loop {
            let fit = budget.saturating_sub(size + head) / LUN_LEN;
            let rest = t.luns.len() - next;
            if size + head <= budget && (fit >= rest || fit > 0) {
                let take = fit.min(rest);
                pieces.push((t, next..next + take));
                size += head + LUN_LEN * take;
                next += take;
                if next == t.luns.len() {
                    break;
                }
            }
            if pieces.is_empty() {
                return Err(DiscoveryError::TooLarge(
                    "a target's name and one LUN do not fit in a frame",
                ));
            }
            parts.push(encode_part(&catalog.server, &pieces)?);
            pieces.clear();
            size = base;
        }
    }
    if !pieces.is_empty() || parts.is_empty() {
        if base > budget {
            return Err(DiscoveryError::TooLarge(
                "server name does not fit in a frame",
            ));
        }
        parts.push(encode_part(&catalog.server, &pieces)?);
    }
    Ok(parts)
}

/// A bounded reader over a catalog's bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DiscoveryError> {
        if self.0.len() < n {
            return Err(DiscoveryError::BadCatalog("cut short"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DiscoveryError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DiscoveryError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, DiscoveryError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_be_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, DiscoveryError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }
    fn string(&mut self) -> Result<String, DiscoveryError> {
        let n = usize::from(self.u16()?);
        let b = self.take(n)?;
        std::str::from_utf8(b)
            .map(str::to_string)
            .map_err(|_| DiscoveryError::BadCatalog("not UTF-8"))
    }
    /// Checks `count` items of at least `min` bytes each can be there.
    fn room_for(&self, count: usize, min: usize) -> Result<(), DiscoveryError> {
        if count.saturating_mul(min) > self.0.len() {
            return Err(DiscoveryError::BadCatalog("count beyond the bytes"));
        }
        Ok(())
    }
}

impl Catalog {
    /// Adds a reply part's targets (of the same server): a target already
    /// here (split over parts) gets the part's LUNs appended, others are
    /// appended. Parts may come in any order and some may be missing;
    /// [`assemble`] checks a reply is complete.
    pub fn merge(&mut self, part: Catalog) {
        for t in part.targets {
            match self.targets.iter_mut().find(|have| have.name == t.name) {
                Some(have) => have.luns.extend(t.luns),
                None => self.targets.push(t),
            }
        }
    }

    /// The catalog's encoding (one part holding everything).
    pub fn encode(&self) -> Result<Vec<u8>, DiscoveryError> {
        let pieces: Vec<Piece<'_>> = self.targets.iter().map(|t| (t, 0..t.luns.len())).collect();
        encode_part(&self.server, &pieces)
    }

    /// Decodes a catalog (a part's, or [`Catalog::encode`]'s): every length
    /// checked against the bytes there, nothing after the end.
    pub fn decode(bytes: &[u8]) -> Result<Catalog, DiscoveryError> {
        let mut r = Reader(bytes);
        let server = r.string()?;
        let nt = usize::from(r.u16()?);
        // A target is at least a name length, an alias flag and a count.
        r.room_for(nt, 5)?;
        let mut targets = Vec::with_capacity(nt);
        for _ in 0..nt {
            let name = r.string()?;
            let alias = match r.u8()? {
                0 => None,
                1 => Some(r.string()?),
                _ => return Err(DiscoveryError::BadCatalog("alias flag")),
            };
            let nl = usize::from(r.u16()?);
            r.room_for(nl, LUN_LEN)?;
            let mut luns = Vec::with_capacity(nl);
            for _ in 0..nl {
                luns.push(CatalogLun {
                    lun: r.u64()?,
                    blocks: r.u64()?,
                    block_size: r.u32()?,
                    level: Level::from_u8(r.u8()?).ok_or(DiscoveryError::BadCatalog("level"))?,
                });
            }
            targets.push(CatalogTarget { name, alias, luns });
        }
        if !r.0.is_empty() {
            return Err(DiscoveryError::BadCatalog("bytes after the end"));
        }
        Ok(Catalog { server, targets })
    }
}

#[cfg(test)]
mod tests;
