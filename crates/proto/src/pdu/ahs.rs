//! Additional Header Segments (RFC 7143 §11.2.2): the Extended CDB AHS
//! (type 1, §11.2.2.3) that carries the bytes of a CDB beyond the first 16.

/// AHSType of the Extended CDB AHS (§11.2.2.3).
pub const AHS_EXTENDED_CDB: u8 = 1;
/// AHSType of the Bidirectional Read Expected Data Transfer Length AHS
/// (§11.2.2.4).
pub const AHS_BIDI_READ_LENGTH: u8 = 2;

/// Why the AHS of a PDU could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AhsError {
    /// An AHS header or body runs past the end of the TotalAHSLength bytes.
    #[error("additional header segment truncated at byte {0}")]
    Truncated(usize),
    /// An Extended CDB AHS whose AHSLength does not count its reserved byte.
    #[error("extended CDB AHS with AHSLength 0")]
    EmptyExtendedCdb,
    /// More than one Extended CDB AHS in one PDU.
    #[error("more than one extended CDB AHS")]
    DuplicateExtendedCdb,
}

/// The Extended CDB AHS for `cdb`: empty when the CDB fits the BHS's
/// 16 bytes, else one type-1 segment holding the bytes beyond the first
/// 16, padded to a multiple of 4 (ready to pass to
/// [`Framer::encode`](super::Framer::encode) as the AHS).
pub fn extended_cdb_ahs(cdb: &[u8]) -> Vec<u8> {
    if cdb.len() <= 16 {
        return Vec::new();
    }
    let extra = &cdb[16..];
    // AHSLength counts the reserved byte after AHSType (§11.2.2.3:
    // AHSLength = CDB length - 15).
    let ahs_len = u16::try_from(extra.len() + 1).expect("a CDB of at most 65,550 bytes");
    let mut a = Vec::with_capacity(4 + extra.len() + 3);
    a.extend_from_slice(&ahs_len.to_be_bytes());
    a.push(AHS_EXTENDED_CDB);
    a.push(0);
    a.extend_from_slice(extra);
    a.resize(a.len() + super::pad_len(a.len()), 0);
    a
}

/// The whole CDB of a SCSI Command: the 16 bytes of its BHS followed by
/// the bytes of the Extended CDB AHS in `ahs` (the PDU's whole AHS, every
/// segment padded to 4 bytes), if there is one. Segments of other types
/// are skipped.
pub fn cdb_from_ahs(cdb16: &[u8; 16], ahs: &[u8]) -> Result<Vec<u8>, AhsError> {
    let mut cdb = cdb16.to_vec();
    let mut extended = false;
    let mut at = 0;
    while at < ahs.len() {
        let seg = &ahs[at..];
        if seg.len() < 4 {
            return Err(AhsError::Truncated(at));
        }
        let len = usize::from(u16::from_be_bytes([seg[0], seg[1]]));
        // AHSLength and AHSType (3 bytes), then AHSLength bytes, padded.
        let body_end = 3 + len;
        if body_end > seg.len() {
            return Err(AhsError::Truncated(at));
        }
        if seg[2] == AHS_EXTENDED_CDB {
            if len == 0 {
                return Err(AhsError::EmptyExtendedCdb);
            }
            if extended {
                return Err(AhsError::DuplicateExtendedCdb);
            }
            extended = true;
            cdb.extend_from_slice(&seg[4..body_end]);
        }
        at += (body_end + 3) & !3;
    }
    Ok(cdb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_cdb_needs_no_ahs() {
        assert!(extended_cdb_ahs(&[0x28; 10]).is_empty());
        assert!(extended_cdb_ahs(&[0x88; 16]).is_empty());
        assert_eq!(cdb_from_ahs(&[7; 16], &[]).unwrap(), vec![7; 16]);
    }

    #[test]
    fn extended_cdb_roundtrips() {
        for len in 17..=64 {
            let cdb: Vec<u8> = (0..len as u8).collect();
            let ahs = extended_cdb_ahs(&cdb);
            assert_eq!(ahs.len() % 4, 0);
            assert_eq!(ahs[2], AHS_EXTENDED_CDB);
            assert_eq!(usize::from(u16::from_be_bytes([ahs[0], ahs[1]])), len - 15);
            let mut first = [0u8; 16];
            first.copy_from_slice(&cdb[..16]);
            assert_eq!(cdb_from_ahs(&first, &ahs).unwrap(), cdb, "length {len}");
        }
    }

    #[test]
    fn other_segments_are_skipped() {
        // A bidirectional read length AHS (AHSLength 5, padded to 8), then
        // an extended CDB of 16 + 4 bytes.
        let mut ahs = vec![0, 5, AHS_BIDI_READ_LENGTH, 0, 0, 0, 0x10, 0];
        ahs.extend_from_slice(&[0, 5, AHS_EXTENDED_CDB, 0, 1, 2, 3, 4]);
        let cdb = cdb_from_ahs(&[9; 16], &ahs).unwrap();
        assert_eq!(&cdb[..16], &[9; 16]);
        assert_eq!(&cdb[16..], &[1, 2, 3, 4]);
    }

    #[test]
    fn malformed_ahs_is_an_error() {
        assert_eq!(cdb_from_ahs(&[0; 16], &[0, 1]), Err(AhsError::Truncated(0)));
        assert_eq!(
            cdb_from_ahs(&[0; 16], &[0, 9, AHS_EXTENDED_CDB, 0, 1, 2, 3, 4]),
            Err(AhsError::Truncated(0))
        );
        assert_eq!(
            cdb_from_ahs(&[0; 16], &[0, 0, AHS_EXTENDED_CDB, 0]),
            Err(AhsError::EmptyExtendedCdb)
        );
        let one = extended_cdb_ahs(&[1; 20]);
        let two = [one.clone(), one].concat();
        assert_eq!(
            cdb_from_ahs(&[0; 16], &two),
            Err(AhsError::DuplicateExtendedCdb)
        );
    }

    proptest::proptest! {
        #[test]
        fn random_ahs_never_panics(cdb16 in proptest::array::uniform16(0u8..), ahs in proptest::collection::vec(0u8.., 0..64)) {
            let _ = cdb_from_ahs(&cdb16, &ahs);
        }
    }
}
