//! Checks and parsers for single values: sizes and iSCSI names.

use super::ConfigError;

/// Parse a size: bytes, or a number with K, M, G, T (powers of 1024; an
/// optional trailing "iB" or "B" is accepted).
pub fn parse_size(s: &str) -> Result<u64, ConfigError> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "bad size {s:?}: unknown unit '{c}' (use K, M, G, T)"
                    )))
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| ConfigError::Invalid(format!("bad size {s:?}")))?;
    n.checked_mul(mult)
        .filter(|v| *v > 0)
        .ok_or_else(|| ConfigError::Invalid(format!("bad size {s:?}")))
}

/// Check an iSCSI name (RFC 7143 §4.2.7): `iqn.YYYY-MM.reverse.domain[:x]`,
/// `eui.` + 16 hex digits, or `naa.` + 16 or 32 hex digits; at most 223 bytes.
pub fn validate_name(name: &str) -> Result<(), ConfigError> {
    let bad = |why: &str| {
        Err(ConfigError::Invalid(format!(
            "invalid iSCSI name {name:?}: {why}"
        )))
    };
    if name.len() > 223 {
        return bad("longer than 223 bytes");
    }
    if let Some(rest) = name.strip_prefix("iqn.") {
        let b = rest.as_bytes();
        let date_ok = b.len() > 8
            && b[..4].iter().all(u8::is_ascii_digit)
            && b[4] == b'-'
            && b[5..7].iter().all(u8::is_ascii_digit)
            && b[7] == b'.';
        if !date_ok {
            return bad("expected iqn.YYYY-MM.reverse.domain");
        }
        if !name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b".-:".contains(&c))
        {
            return bad("only lower-case letters, digits, '.', '-' and ':' are allowed");
        }
        Ok(())
    } else if let Some(hex) = name.strip_prefix("eui.") {
        if hex.len() == 16 && hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            Ok(())
        } else {
            bad("eui. needs 16 hex digits")
        }
    } else if let Some(hex) = name.strip_prefix("naa.") {
        if (hex.len() == 16 || hex.len() == 32) && hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            Ok(())
        } else {
            bad("naa. needs 16 or 32 hex digits")
        }
    } else {
        bad("must start with iqn., eui. or naa.")
    }
}
