//! SPC-4 §4.6.4 / SAM-5 §5.9.5: the answers for a LUN that does not exist.
//! INQUIRY returns peripheral qualifier 011b and device type 1Fh, REQUEST
//! SENSE returns LOGICAL UNIT NOT SUPPORTED as data, every other command
//! (REPORT LUNS is handled by the target first) ends with CHECK CONDITION
//! and LOGICAL UNIT NOT SUPPORTED.

use std::sync::Arc;

use crate::disk::LogicalUnit;
use crate::sense::{codes, Sense};
use crate::{ScsiRequest, ScsiResponse, ScsiStatus};

/// SPC-4 §4.6.4 answers for a LUN that does not exist.
pub(crate) fn execute(req: &ScsiRequest<'_>) -> ScsiResponse {
    let cdb = req.cdb;
    match cdb.first() {
        Some(0x12) if cdb.len() >= 6 && cdb[1] & 1 == 0 => {
            let alloc = usize::from(u16::from_be_bytes([cdb[3], cdb[4]]));
            let mut d = vec![0u8; 36];
            d[0] = 0x7f; // qualifier 011b, type 1Fh: no logical unit here
            d[2] = 0x06;
            d[3] = 0x12;
            d[4] = 31;
            d.truncate(alloc);
            ScsiResponse {
                status: ScsiStatus::Good,
                sense: Vec::new(),
                data_in: d.into(),
                data_out_len: None,
            }
        }
        Some(0x03) if cdb.len() >= 6 => {
            let alloc = usize::from(cdb[4]);
            let mut d = codes::LUN_NOT_SUPPORTED.to_bytes(cdb[1] & 1 != 0);
            d.truncate(alloc);
            ScsiResponse {
                status: ScsiStatus::Good,
                sense: Vec::new(),
                data_in: d.into(),
                data_out_len: None,
            }
        }
        _ => plain_check(codes::LUN_NOT_SUPPORTED, None),
    }
}

/// CHECK CONDITION with `s`: from the unit when there is one (its sense
/// format and pending state), else plain fixed-format sense.
pub(crate) fn plain_check(s: Sense, lu: Option<&Arc<LogicalUnit>>) -> ScsiResponse {
    match lu {
        Some(lu) => lu.check(s),
        None => ScsiResponse {
            status: ScsiStatus::CheckCondition,
            sense: s.to_bytes(false),
            data_in: Default::default(),
            data_out_len: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use crate::disk::testing::*;
    use crate::sense::key;

    #[test]
    fn a_missing_lun_answers_inquiry_and_request_sense_only() {
        let (t, _) = target(512);
        for lun in [1, 255, 1 << 40] {
            let d = good(exec_lun(&t, A, lun, &[0x12, 0, 0, 0, 96, 0], &[]));
            assert_eq!(d[0], 0x7f, "qualifier 011b, type 1Fh");
            assert_eq!(d.len(), 36);
            assert_eq!(
                good(exec_lun(&t, A, lun, &[0x12, 0, 0, 0, 1, 0], &[])),
                [0x7f]
            );
            let s = good(exec_lun(&t, A, lun, &[0x03, 0, 0, 0, 252, 0], &[]));
            assert_eq!(sense_of(&s), Some((key::ILLEGAL_REQUEST, 0x25, 0)));
            for cdb in [
                vec![0, 0, 0, 0, 0, 0],
                cdb10(0x28, 0, 0, 1),
                cdb10(0x2a, 0, 0, 1),
                vec![0xff],
                vec![],
            ] {
                check(
                    &exec_lun(&t, A, lun, &cdb, &[0u8; 512]),
                    key::ILLEGAL_REQUEST,
                    0x25,
                    0,
                );
            }
        }
    }
}
