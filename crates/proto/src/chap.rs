//! CHAP authentication for the login security stage (RFC 7143 §12.1,
//! RFC 1994), both sides, without I/O: the caller supplies the random
//! identifier and challenge, and feeds the keys of each login request or
//! response.
//!
//! The response to a challenge is `H(identifier || secret || challenge)`
//! with the hash the target chose from the initiator's CHAP_A list.

use base64::Engine;
use subtle::ConstantTimeEq;

/// Longest challenge accepted from a peer (RFC 7143 §12.1.3 allows up to
/// 1024 bytes once decoded).
pub const MAX_CHALLENGE: usize = 1024;
/// Longest CHAP_N accepted.
pub const MAX_NAME: usize = 255;
/// Bytes of the challenges this implementation sends.
pub const CHALLENGE_LEN: usize = 32;
/// Shortest secret accepted (RFC 7143 §12.1.3: at least 96 bits when not
/// protected by IPsec).
pub const MIN_SECRET: usize = 12;

/// Why authentication failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChapError {
    /// A key the step needs is missing.
    #[error("CHAP key {0} missing")]
    Missing(&'static str),
    /// A value could not be decoded or is out of bounds.
    #[error("CHAP key {0} has an invalid value")]
    Invalid(&'static str),
    /// No algorithm in CHAP_A is supported.
    #[error("no supported CHAP algorithm offered")]
    NoAlgorithm,
    /// The response does not match the secret (the user is known).
    #[error("CHAP authentication failed")]
    Failed,
    /// CHAP_N names no user the target knows (what the initiator is told
    /// is the same as for [`ChapError::Failed`]; the target's log tells
    /// them apart).
    #[error("CHAP authentication failed: unknown user")]
    UnknownUser,
    /// The peer sent our own challenge back (a reflection attack).
    #[error("CHAP challenge reflected")]
    Reflected,
    /// The initiator asked the target to authenticate itself and the target
    /// has no credentials for that (or the target did not answer).
    #[error("mutual CHAP not available")]
    NoMutual,
    /// Mutual CHAP: the target's answer to our challenge is wrong, so it
    /// did not prove that it is the target we meant.
    #[error("the target failed to prove itself (mutual CHAP): its name or response does not match the target credentials given")]
    TargetNotProven,
}

/// A CHAP hash, by its CHAP_A number (IANA PPP authentication algorithms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// MD5 (5): what every initiator speaks.
    Md5,
    /// SHA-1 (6).
    Sha1,
    /// SHA-256 (7).
    Sha256,
    /// SHA3-256 (8).
    Sha3_256,
}

impl Algorithm {
    /// What an initiator offers, in order. SHA-256 (7) is left out on
    /// purpose: tgt 1.0.85 (Debian 12) takes CHAP_A=7 for SHA-1 and then
    /// refuses the 32-byte response, so offering it breaks logins to tgt;
    /// SHA3-256 (8) leads instead. As a target we still accept 7.
    pub const PREFERENCE: [Algorithm; 3] = [Algorithm::Sha3_256, Algorithm::Sha1, Algorithm::Md5];

    /// The CHAP_A number.
    pub fn number(self) -> u8 {
        match self {
            Algorithm::Md5 => 5,
            Algorithm::Sha1 => 6,
            Algorithm::Sha256 => 7,
            Algorithm::Sha3_256 => 8,
        }
    }

    /// From a CHAP_A number.
    pub fn from_number(n: &str) -> Option<Algorithm> {
        match n.trim() {
            "5" => Some(Algorithm::Md5),
            "6" => Some(Algorithm::Sha1),
            "7" => Some(Algorithm::Sha256),
            "8" => Some(Algorithm::Sha3_256),
            _ => None,
        }
    }

    /// Bytes of a response.
    // A digest length is never zero, so an `is_empty` would always be false.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(self) -> usize {
        match self {
            Algorithm::Md5 => 16,
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 | Algorithm::Sha3_256 => 32,
        }
    }

    /// `H(id || secret || challenge)`.
    pub fn response(self, id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
        fn run<D: md5::Digest>(id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
            let mut h = D::new();
            h.update([id]);
            h.update(secret);
            h.update(challenge);
            h.finalize().to_vec()
        }
        match self {
            Algorithm::Md5 => run::<md5::Md5>(id, secret, challenge),
            Algorithm::Sha1 => run::<sha1::Sha1>(id, secret, challenge),
            Algorithm::Sha256 => run::<sha2::Sha256>(id, secret, challenge),
            Algorithm::Sha3_256 => run::<sha3::Sha3_256>(id, secret, challenge),
        }
    }
}

/// A CHAP name and secret. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// CHAP_N.
    pub user: String,
    /// The shared secret.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// Parse `USER:SECRET`, checking the lengths RFC 7143 asks for.
    pub fn parse(spec: &str) -> Result<Credentials, String> {
        let (user, secret) = spec.split_once(':').ok_or("expected USER:SECRET")?;
        Credentials::new(user, secret.as_bytes())
    }

    /// Check and build.
    pub fn new(user: &str, secret: &[u8]) -> Result<Credentials, String> {
        if user.is_empty() || user.len() > MAX_NAME {
            return Err(format!("the CHAP user must be 1..={MAX_NAME} bytes"));
        }
        if secret.len() < MIN_SECRET {
            return Err(format!(
                "the CHAP secret must be at least {MIN_SECRET} bytes (RFC 7143 §12.1.3)"
            ));
        }
        if secret.len() > MAX_CHALLENGE {
            return Err(format!(
                "the CHAP secret must be at most {MAX_CHALLENGE} bytes"
            ));
        }
        Ok(Credentials {
            user: user.to_string(),
            secret: secret.to_vec(),
        })
    }
}

/// Encode binary as `0x` hex.
pub fn encode_binary(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * b.len());
    s.push_str("0x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Decode a binary value: `0x`/`0X` hex or `0b`/`0B` base64 (RFC 7143
/// §6.1), at most `max` bytes once decoded.
pub fn decode_binary(v: &str, max: usize, key: &'static str) -> Result<Vec<u8>, ChapError> {
    let bad = ChapError::Invalid(key);
    let out = if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        if h.is_empty() || h.len() > 2 * max + 1 || !h.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad);
        }
        // An odd number of digits has an implied leading zero.
        let padded = if h.len() % 2 == 1 {
            format!("0{h}")
        } else {
            h.to_string()
        };
        (0..padded.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&padded[i..i + 2], 16).map_err(|_| ChapError::Invalid(key)))
            .collect::<Result<Vec<u8>, _>>()?
    } else if let Some(b) = v.strip_prefix("0b").or_else(|| v.strip_prefix("0B")) {
        if b.is_empty() || b.len() > max.div_ceil(3) * 4 + 4 {
            return Err(bad);
        }
        base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|_| ChapError::Invalid(key))?
    } else {
        return Err(bad);
    };
    if out.is_empty() || out.len() > max {
        return Err(bad);
    }
    Ok(out)
}

fn get<'a>(keys: &'a [(String, String)], k: &'static str) -> Option<&'a str> {
    keys.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

type Pairs = Vec<(String, String)>;

/// The target's side of a CHAP exchange.
#[derive(Debug, Clone)]
pub struct TargetChap {
    expect: Credentials,
    mutual: Option<Credentials>,
    id: u8,
    challenge: [u8; CHALLENGE_LEN],
    algorithm: Option<Algorithm>,
    done: bool,
}

impl TargetChap {
    /// `expect`: the name and secret initiators must prove; `mutual`: ours,
    /// for initiators that ask the target to authenticate itself. `id` and
    /// `challenge` must come from a CSPRNG.
    pub fn new(
        expect: Credentials,
        mutual: Option<Credentials>,
        id: u8,
        challenge: [u8; CHALLENGE_LEN],
    ) -> Self {
        TargetChap {
            expect,
            mutual,
            id,
            challenge,
            algorithm: None,
            done: false,
        }
    }

    /// Whether the initiator has authenticated.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Take the CHAP keys of one login request; returns the keys to answer.
    pub fn on_keys(&mut self, keys: &[(String, String)]) -> Result<Pairs, ChapError> {
        if self.done {
            return Ok(Vec::new());
        }
        let Some(alg) = self.algorithm else {
            let list = get(keys, "CHAP_A").ok_or(ChapError::Missing("CHAP_A"))?;
            let offered: Vec<Algorithm> =
                list.split(',').filter_map(Algorithm::from_number).collect();
            // The initiator's order of preference decides among ours.
            let alg = offered.first().copied().ok_or(ChapError::NoAlgorithm)?;
            self.algorithm = Some(alg);
            return Ok(vec![
                ("CHAP_A".into(), alg.number().to_string()),
                ("CHAP_I".into(), self.id.to_string()),
                ("CHAP_C".into(), encode_binary(&self.challenge)),
            ]);
        };
        let name = get(keys, "CHAP_N").ok_or(ChapError::Missing("CHAP_N"))?;
        let r = get(keys, "CHAP_R").ok_or(ChapError::Missing("CHAP_R"))?;
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(ChapError::Invalid("CHAP_N"));
        }
        let r = decode_binary(r, alg.len(), "CHAP_R")?;
        if r.len() != alg.len() {
            return Err(ChapError::Invalid("CHAP_R"));
        }
        let want = alg.response(self.id, &self.expect.secret, &self.challenge);
        let name_ok = name.as_bytes().ct_eq(self.expect.user.as_bytes());
        let resp_ok = r.as_slice().ct_eq(&want);
        // Both compared before either is looked at: the time taken does
        // not say which was wrong.
        match (bool::from(name_ok), bool::from(resp_ok)) {
            (true, true) => {}
            (false, _) => return Err(ChapError::UnknownUser),
            (true, false) => return Err(ChapError::Failed),
        }
        // Mutual: the initiator challenges us.
        let mut out = Vec::new();
        match (get(keys, "CHAP_I"), get(keys, "CHAP_C")) {
            (None, None) => {}
            (Some(i), Some(c)) => {
                let id: u8 = i.trim().parse().map_err(|_| ChapError::Invalid("CHAP_I"))?;
                let c = decode_binary(c, MAX_CHALLENGE, "CHAP_C")?;
                if c == self.challenge {
                    return Err(ChapError::Reflected);
                }
                let mine = self.mutual.as_ref().ok_or(ChapError::NoMutual)?;
                out.push(("CHAP_N".into(), mine.user.clone()));
                out.push((
                    "CHAP_R".into(),
                    encode_binary(&alg.response(id, &mine.secret, &c)),
                ));
            }
            (None, Some(_)) => return Err(ChapError::Missing("CHAP_I")),
            (Some(_), None) => return Err(ChapError::Missing("CHAP_C")),
        }
        self.done = true;
        Ok(out)
    }
}

/// The initiator's side of a CHAP exchange.
#[derive(Debug, Clone)]
pub struct InitiatorChap {
    creds: Credentials,
    /// The target's credentials when we ask it to authenticate itself.
    target: Option<Credentials>,
    id: u8,
    challenge: [u8; CHALLENGE_LEN],
    state: InitiatorState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InitiatorState {
    Start,
    SentAlgorithms,
    SentResponse(Algorithm),
    Done,
}

impl InitiatorChap {
    /// Authenticate as `creds`; with `target`, require the target to prove
    /// those. `id` and `challenge` (for mutual CHAP) from a CSPRNG.
    pub fn new(
        creds: Credentials,
        target: Option<Credentials>,
        id: u8,
        challenge: [u8; CHALLENGE_LEN],
    ) -> Self {
        InitiatorChap {
            creds,
            target,
            id,
            challenge,
            state: InitiatorState::Start,
        }
    }

    /// Whether authentication is complete (both ways if mutual).
    pub fn is_done(&self) -> bool {
        self.state == InitiatorState::Done
    }

    /// The first CHAP keys: the algorithms we accept, in preference order.
    pub fn start(&mut self) -> Pairs {
        self.state = InitiatorState::SentAlgorithms;
        let list: Vec<String> = Algorithm::PREFERENCE
            .iter()
            .map(|a| a.number().to_string())
            .collect();
        vec![("CHAP_A".into(), list.join(","))]
    }

    /// Take the target's CHAP keys; returns what to send next.
    pub fn on_keys(&mut self, keys: &[(String, String)]) -> Result<Pairs, ChapError> {
        match self.state {
            InitiatorState::Start => Ok(self.start()),
            InitiatorState::SentAlgorithms => {
                let alg = Algorithm::from_number(
                    get(keys, "CHAP_A").ok_or(ChapError::Missing("CHAP_A"))?,
                )
                .ok_or(ChapError::NoAlgorithm)?;
                let id: u8 = get(keys, "CHAP_I")
                    .ok_or(ChapError::Missing("CHAP_I"))?
                    .trim()
                    .parse()
                    .map_err(|_| ChapError::Invalid("CHAP_I"))?;
                let c = decode_binary(
                    get(keys, "CHAP_C").ok_or(ChapError::Missing("CHAP_C"))?,
                    MAX_CHALLENGE,
                    "CHAP_C",
                )?;
                if self.target.is_some() && c == self.challenge {
                    return Err(ChapError::Reflected);
                }
                let mut out = vec![
                    ("CHAP_N".into(), self.creds.user.clone()),
                    (
                        "CHAP_R".into(),
                        encode_binary(&alg.response(id, &self.creds.secret, &c)),
                    ),
                ];
                if self.target.is_some() {
                    out.push(("CHAP_I".into(), self.id.to_string()));
                    out.push(("CHAP_C".into(), encode_binary(&self.challenge)));
                    self.state = InitiatorState::SentResponse(alg);
                } else {
                    self.state = InitiatorState::Done;
                }
                Ok(out)
            }
            InitiatorState::SentResponse(alg) => {
                let target = self.target.as_ref().expect("mutual");
                let name = get(keys, "CHAP_N").ok_or(ChapError::NoMutual)?;
                let r = decode_binary(
                    get(keys, "CHAP_R").ok_or(ChapError::NoMutual)?,
                    alg.len(),
                    "CHAP_R",
                )?;
                let want = alg.response(self.id, &target.secret, &self.challenge);
                let ok = name.as_bytes().ct_eq(target.user.as_bytes()) & r.as_slice().ct_eq(&want);
                if !bool::from(ok) {
                    return Err(ChapError::TargetNotProven);
                }
                self.state = InitiatorState::Done;
                Ok(Vec::new())
            }
            InitiatorState::Done => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(u: &str, s: &str) -> Credentials {
        Credentials::new(u, s.as_bytes()).unwrap()
    }

    #[test]
    fn md5_response_is_rfc_1994s_hash() {
        // MD5(0x01 || "secretsecret" || 16 zero bytes), computed independently
        // with `printf '\x01secretsecret' + 16 NULs | md5sum`.
        let r = Algorithm::Md5.response(1, b"secretsecret", &[0u8; 16]);
        assert_eq!(encode_binary(&r), "0xc5dbe38855bed0c5fa134a4857010f08");
        assert_eq!(Algorithm::Sha256.response(1, b"x", b"y").len(), 32);
    }

    #[test]
    fn binary_values_hex_and_base64_with_limits() {
        assert_eq!(decode_binary("0x0a0B", 4, "k").unwrap(), vec![10, 11]);
        assert_eq!(decode_binary("0xabc", 4, "k").unwrap(), vec![0x0a, 0xbc]);
        assert_eq!(decode_binary("0bAAEC", 4, "k").unwrap(), vec![0, 1, 2]);
        for bad in [
            "",
            "0x",
            "0xzz",
            "12",
            "0b!!",
            &format!("0x{}", "00".repeat(5)),
        ] {
            assert!(decode_binary(bad, 4, "k").is_err(), "{bad}");
        }
    }

    #[test]
    fn one_way_and_mutual_exchanges_and_failures() {
        for mutual in [false, true] {
            let mut t = TargetChap::new(
                creds("alice", "alice-secret-12"),
                Some(creds("tgt", "target-secret-1")),
                7,
                [3; 32],
            );
            let mut i = InitiatorChap::new(
                creds("alice", "alice-secret-12"),
                mutual.then(|| creds("tgt", "target-secret-1")),
                9,
                [4; 32],
            );
            let a = i.start();
            let c = t.on_keys(&a).unwrap();
            let r = i.on_keys(&c).unwrap();
            let m = t.on_keys(&r).unwrap();
            assert!(t.is_done());
            i.on_keys(&m).unwrap();
            assert!(i.is_done());
        }
        // Wrong secret, wrong name.
        for (u, s, want) in [
            ("alice", "wrong-secret-xx", ChapError::Failed),
            ("mallory", "alice-secret-12", ChapError::UnknownUser),
        ] {
            let mut t = TargetChap::new(creds("alice", "alice-secret-12"), None, 7, [3; 32]);
            let mut i = InitiatorChap::new(creds(u, s), None, 9, [4; 32]);
            let c = t.on_keys(&i.start()).unwrap();
            let r = i.on_keys(&c).unwrap();
            assert_eq!(t.on_keys(&r), Err(want));
        }
        // Reflection: the initiator sends the target's own challenge back.
        let mut t = TargetChap::new(
            creds("alice", "alice-secret-12"),
            Some(creds("tgt", "target-secret-1")),
            7,
            [3; 32],
        );
        let mut i = InitiatorChap::new(
            creds("alice", "alice-secret-12"),
            Some(creds("tgt", "target-secret-1")),
            9,
            [3; 32],
        );
        let c = t.on_keys(&i.start()).unwrap();
        assert_eq!(i.on_keys(&c), Err(ChapError::Reflected));
        // A target with the wrong mutual secret fails the initiator's check.
        let mut t = TargetChap::new(
            creds("alice", "alice-secret-12"),
            Some(creds("tgt", "not-the-secret")),
            7,
            [3; 32],
        );
        let mut i = InitiatorChap::new(
            creds("alice", "alice-secret-12"),
            Some(creds("tgt", "target-secret-1")),
            9,
            [4; 32],
        );
        let c = t.on_keys(&i.start()).unwrap();
        let r = i.on_keys(&c).unwrap();
        let m = t.on_keys(&r).unwrap();
        assert_eq!(i.on_keys(&m), Err(ChapError::TargetNotProven));
    }

    #[test]
    fn the_target_honours_the_initiators_choice_including_sha256() {
        for (n, alg) in [
            ("7", Algorithm::Sha256),
            ("5", Algorithm::Md5),
            ("8,5", Algorithm::Sha3_256),
        ] {
            let mut t = TargetChap::new(creds("alice", "alice-secret-12"), None, 7, [3; 32]);
            let c = t.on_keys(&[("CHAP_A".into(), n.into())]).unwrap();
            assert_eq!(c[0].1, alg.number().to_string());
            let r = alg.response(7, b"alice-secret-12", &[3; 32]);
            let keys = vec![
                ("CHAP_N".to_string(), "alice".to_string()),
                ("CHAP_R".to_string(), encode_binary(&r)),
            ];
            assert!(t.on_keys(&keys).is_ok() && t.is_done(), "{n}");
        }
    }

    #[test]
    fn bad_values_are_refused() {
        let mut t = TargetChap::new(creds("alice", "alice-secret-12"), None, 7, [3; 32]);
        assert_eq!(
            t.on_keys(&[("CHAP_A".into(), "99".into())]),
            Err(ChapError::NoAlgorithm)
        );
        let _ = t.on_keys(&[("CHAP_A".into(), "5".into())]).unwrap();
        let keys = |r: &str| {
            vec![
                ("CHAP_N".to_string(), "alice".to_string()),
                ("CHAP_R".to_string(), r.to_string()),
            ]
        };
        assert_eq!(t.on_keys(&keys("0x00")), Err(ChapError::Invalid("CHAP_R")));
        assert!(t
            .on_keys(&keys(&format!("0x{}", "ab".repeat(2000))))
            .is_err());
        assert!(t.on_keys(&keys("garbage")).is_err());
        assert!(Credentials::parse("u:short").is_err());
        assert!(format!("{:?}", creds("u", "a-long-secret")).contains("redacted"));
    }
}
