//! SPC-4 §6.33 REPORT LUNS parameter data, answered by the target device
//! (and by a unit for itself, LUN 0).

use crate::sense::Sense;

/// REPORT LUNS parameter data for `luns` (peripheral addressing below 256,
/// flat space above).
pub(crate) fn report_luns(cdb: &[u8], luns: &[u64]) -> Result<Vec<u8>, Sense> {
    if cdb.len() < 12 {
        return Err(crate::sense::codes::INVALID_FIELD_IN_CDB);
    }
    let select = cdb[2];
    if select > 2 {
        return Err(Sense::invalid_cdb_field(2, None));
    }
    let alloc = u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]) as usize;
    if alloc < 16 {
        return Err(Sense::invalid_cdb_field(6, None));
    }
    // Select 1 (well-known LUNs only): we have none.
    let listed: Vec<u64> = if select == 1 {
        Vec::new()
    } else {
        luns.to_vec()
    };
    let mut d = Vec::with_capacity(8 + 8 * listed.len());
    d.extend_from_slice(&((listed.len() * 8) as u32).to_be_bytes());
    d.extend_from_slice(&[0; 4]);
    for l in listed {
        let wire: u64 = if l < 256 {
            l << 48
        } else {
            (0x4000 | (l & 0x3fff)) << 48
        };
        d.extend_from_slice(&wire.to_be_bytes());
    }
    d.truncate(alloc);
    Ok(d)
}
