//! RFC 7143 §6.1: text keys, `key=value` pairs separated by NUL bytes,
//! and their reassembly across PDUs (the C bit, §11.10.2, §11.12.2).

/// Limits applied when parsing key text.
#[derive(Debug, Clone, Copy)]
pub struct TextLimits {
    /// Longest key name (§6.1: 63 bytes).
    pub max_key_len: usize,
    /// Longest value (§6.1: 255 bytes for most keys, 8192 for a few).
    pub max_value_len: usize,
    /// Most pairs in one text.
    pub max_pairs: usize,
}

impl Default for TextLimits {
    fn default() -> Self {
        TextLimits {
            max_key_len: 63,
            max_value_len: 8192,
            max_pairs: 256,
        }
    }
}

/// Malformed key text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// Not valid UTF-8.
    #[error("key text is not UTF-8")]
    NotUtf8,
    /// A pair without '='.
    #[error("pair {0:?} has no '='")]
    NoEquals(String),
    /// An empty key or one with characters §6.1 forbids.
    #[error("invalid key name {0:?}")]
    BadKey(String),
    /// A key or value over the limit.
    #[error("key or value of {0:?} too long")]
    TooLong(String),
    /// More pairs than allowed.
    #[error("too many keys")]
    TooMany,
    /// Reassembled text over the limit.
    #[error("key text longer than {0} bytes")]
    TextTooLong(usize),
    /// A PDU with the C bit set but no data (nothing to continue).
    #[error("continued text PDU with an empty data segment")]
    EmptyContinue,
}

fn key_ok(k: &str) -> bool {
    !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-+@_#".contains(&b))
}

/// Parse `key=value\0...`. A missing final NUL and zero padding are tolerated.
pub fn parse_text(data: &[u8], limits: &TextLimits) -> Result<Vec<(String, String)>, TextError> {
    let mut out = Vec::new();
    for item in data.split(|b| *b == 0) {
        if item.is_empty() {
            continue;
        }
        let s = std::str::from_utf8(item).map_err(|_| TextError::NotUtf8)?;
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| TextError::NoEquals(s.chars().take(64).collect()))?;
        if !key_ok(k) {
            return Err(TextError::BadKey(k.chars().take(64).collect()));
        }
        if k.len() > limits.max_key_len || v.len() > limits.max_value_len {
            return Err(TextError::TooLong(k.chars().take(64).collect()));
        }
        if out.len() >= limits.max_pairs {
            return Err(TextError::TooMany);
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

/// Encode pairs as `key=value\0...`.
pub fn encode_text<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref().as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_ref().as_bytes());
        out.push(0);
    }
    out
}

/// Reassembles key text sent over several PDUs with the C bit.
#[derive(Debug, Clone)]
pub struct TextAssembler {
    buf: Vec<u8>,
    max: usize,
}

impl Default for TextAssembler {
    fn default() -> Self {
        TextAssembler::new(64 * 1024)
    }
}

impl TextAssembler {
    /// An assembler that refuses texts longer than `max` bytes.
    pub fn new(max: usize) -> Self {
        TextAssembler {
            buf: Vec::new(),
            max,
        }
    }

    /// Add one PDU's data. Returns the whole text once the PDU without the
    /// C bit arrives.
    pub fn push(&mut self, data: &[u8], continue_bit: bool) -> Result<Option<Vec<u8>>, TextError> {
        if continue_bit && data.is_empty() {
            self.buf.clear();
            return Err(TextError::EmptyContinue);
        }
        if self.buf.len() + data.len() > self.max {
            self.buf.clear();
            return Err(TextError::TextTooLong(self.max));
        }
        self.buf.extend_from_slice(data);
        if continue_bit {
            Ok(None)
        } else {
            Ok(Some(std::mem::take(&mut self.buf)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip_and_tolerance() {
        let pairs = vec![
            ("InitiatorName".to_string(), "iqn.x:y".to_string()),
            ("MaxBurstLength".into(), "262144".into()),
        ];
        let enc = encode_text(&pairs);
        assert_eq!(parse_text(&enc, &TextLimits::default()).unwrap(), pairs);
        let mut padded = enc.clone();
        padded.extend_from_slice(&[0, 0]);
        assert_eq!(parse_text(&padded, &TextLimits::default()).unwrap(), pairs);
        assert_eq!(
            parse_text(b"A=1", &TextLimits::default()).unwrap(),
            vec![("A".to_string(), "1".to_string())]
        );
    }

    #[test]
    fn rejects_bad_text() {
        let l = TextLimits::default();
        assert!(matches!(
            parse_text(b"novalue\0", &l),
            Err(TextError::NoEquals(_))
        ));
        assert!(matches!(parse_text(b"=x\0", &l), Err(TextError::BadKey(_))));
        assert!(matches!(
            parse_text(b"a b=x\0", &l),
            Err(TextError::BadKey(_))
        ));
        assert!(matches!(
            parse_text(&[0xff, b'=', b'1'], &l),
            Err(TextError::NotUtf8)
        ));
        let long = format!("{}=1", "k".repeat(64));
        assert!(matches!(
            parse_text(long.as_bytes(), &l),
            Err(TextError::TooLong(_))
        ));
    }

    #[test]
    fn assembler() {
        let mut a = TextAssembler::new(10);
        assert_eq!(a.push(b"A=1\0", true).unwrap(), None);
        assert_eq!(
            a.push(b"B=2\0", false).unwrap(),
            Some(b"A=1\0B=2\0".to_vec())
        );
        assert_eq!(a.push(b"", true), Err(TextError::EmptyContinue));
        assert_eq!(
            a.push(b"0123456789A", false),
            Err(TextError::TextTooLong(10))
        );
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_text(&bytes, &TextLimits::default());
        }
    }
}
