//! Checks and parsers for single values: sizes and iSCSI names.

use super::ConfigError;

/// Parse a size: bytes, or a number with K, M, G, T (powers of 1024; an
/// optional trailing "iB" or "B" is accepted).
pub fn parse_size(s: &str) -> Result<u64, ConfigError> {
    const FORMS: &str =
        "a size is a whole number of bytes with an optional unit K, M, G or T (powers of 1024), e.g. 512M or 10G";
    let bad = |why: &str| ConfigError::Invalid(format!("bad size {s:?}: {why}; {FORMS}"));
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
                _ => return Err(bad(&format!("unknown unit '{c}'"))),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    if num.starts_with('-') {
        return Err(bad("a size cannot be negative"));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| bad(&format!("{num:?} is not a whole number")))?;
    if n == 0 {
        return Err(bad("a size must be more than zero"));
    }
    n.checked_mul(mult).ok_or_else(|| bad("too large"))
}

/// Check an initiator name of an access rule or LUN masking list: an
/// iSCSI name ([`validate_name`]) or an NVMe host NQN
/// (`nqn.YYYY-MM.reverse.domain:…`, e.g. `nqn.2014-08.org.nvmexpress:uuid:…`,
/// at most 223 bytes, no spaces or `@`): NVMe/TCP hosts are known by it.
pub fn validate_initiator_name(name: &str) -> Result<(), ConfigError> {
    let Some(rest) = name.strip_prefix("nqn.") else {
        return validate_name(name);
    };
    let b = rest.as_bytes();
    let date_ok = b.len() > 8
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'.';
    let chars_ok = !name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '@');
    if name.len() <= 223 && date_ok && chars_ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "invalid NVMe host NQN {name:?}: expected nqn.YYYY-MM.reverse.domain:… (at most 223 bytes, no spaces or '@')"
        )))
    }
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
        // The year and month the naming authority held the domain.
        let month = (b[5] - b'0') * 10 + (b[6] - b'0');
        if !(1..=12).contains(&month) {
            return bad(&format!(
                "month {:02} in the date (iqn.YYYY-MM.…): use 01 to 12",
                month
            ));
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

/// Parse a configured NAA designator: 32 hex digits starting with `6`
/// (NAA IEEE Registered Extended, 16 bytes) or 16 hex digits starting with
/// `5` (NAA IEEE Registered, 8 bytes, returned in the first 8 bytes with
/// the rest zero). An optional `0x` or `naa.` prefix is ignored.
pub fn parse_naa(s: &str) -> Result<[u8; 16], String> {
    let t = s.trim();
    let hex = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("naa."))
        .unwrap_or(t);
    if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("naa {s:?}: only hex digits are allowed"));
    }
    let want = match hex.as_bytes().first() {
        Some(b'6') => 32,
        Some(b'5') => 16,
        _ => {
            return Err(format!(
                "naa {s:?}: use 32 hex digits starting with 6 (NAA-6) or 16 starting with 5 (NAA-5)"
            ))
        }
    };
    if hex.len() != want {
        return Err(format!(
            "naa {s:?}: NAA-{} needs {want} hex digits, not {}",
            &hex[..1],
            hex.len()
        ));
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().take(want / 2).enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("naa {s:?}: only hex digits are allowed"))?;
    }
    Ok(out)
}

/// The text form of an NAA designator as [`parse_naa`] reads it: 32 hex
/// digits for NAA-6, 16 for NAA-5 (its first 8 bytes).
pub fn format_naa(naa: &[u8; 16]) -> String {
    let len = if naa[0] >> 4 == 5 { 8 } else { 16 };
    naa[..len].iter().map(|b| format!("{b:02x}")).collect()
}
