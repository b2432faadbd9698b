//! SPC-4 §6.35 REPORT SUPPORTED OPERATION CODES and §6.40 REPORT
//! SUPPORTED TASK MANAGEMENT FUNCTIONS, generated from [`COMMANDS`].

use super::{find, has_service_actions, COMMANDS};
use crate::be::{be16, be32};
use crate::sense::Sense;

/// Nominal and recommended command timeouts (seconds) for RCTD.
const TIMEOUTS: [u8; 12] = [0x00, 0x0a, 0, 0, 0, 0, 0, 30, 0, 0, 0, 60];

/// REPORT SUPPORTED OPERATION CODES (SPC-4 §6.35), generated from
/// [`COMMANDS`]: reporting option 0 lists every row, 1 and 2 return one
/// command's CDB usage data (1: opcode without service actions, 2: opcode
/// and service action); RCTD adds the command timeouts descriptor.
pub(crate) fn report_supported_opcodes(cdb: &[u8]) -> Result<Vec<u8>, Sense> {
    let rctd = cdb[2] & 0x80 != 0;
    let options = cdb[2] & 0x07;
    let req_op = cdb[3];
    let req_sa = be16(&cdb[4..6]);
    let alloc = be32(&cdb[6..10]) as usize;
    let mut out = Vec::new();
    match options {
        0 => {
            let mut descs = Vec::new();
            for d in COMMANDS {
                descs.push(d.opcode);
                descs.push(0);
                descs.extend_from_slice(&u16::from(d.service_action.unwrap_or(0)).to_be_bytes());
                descs.push(0);
                descs.push((if rctd { 0x02 } else { 0 }) | u8::from(d.service_action.is_some()));
                descs.extend_from_slice(&(d.cdb_len as u16).to_be_bytes());
                if rctd {
                    descs.extend_from_slice(&TIMEOUTS);
                }
            }
            out.extend_from_slice(&(descs.len() as u32).to_be_bytes());
            out.extend(descs);
        }
        1 | 2 => {
            let has_sa = has_service_actions(req_op);
            if options == 1 && has_sa {
                return Err(Sense::invalid_cdb_field(2, Some(2)));
            }
            if options == 2 && !has_sa && find(req_op, None).is_some() {
                return Err(Sense::invalid_cdb_field(2, Some(2)));
            }
            let action = if options == 2 {
                Some(req_sa as u8).filter(|_| req_sa < 0x20)
            } else {
                None
            };
            let found = if options == 2 && req_sa >= 0x20 {
                None
            } else {
                find(req_op, action)
            };
            match found {
                Some(d) => {
                    out.push(0);
                    out.push((if rctd { 0x80 } else { 0 }) | 0x03);
                    out.extend_from_slice(&(d.cdb_len as u16).to_be_bytes());
                    out.extend_from_slice(d.usage);
                    if rctd {
                        out.extend_from_slice(&TIMEOUTS);
                    }
                }
                None => out.extend_from_slice(&[0, 0x01, 0, 0]),
            }
        }
        _ => return Err(Sense::invalid_cdb_field(2, Some(2))),
    }
    out.truncate(alloc);
    Ok(out)
}

/// REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS (SPC-4 §6.40).
pub(crate) fn report_supported_tmfs(cdb: &[u8]) -> Result<Vec<u8>, Sense> {
    let alloc = be32(&cdb[6..10]) as usize;
    let repd = cdb[2] & 0x80 != 0;
    // ATS, ATSS, CTSS, LURS and TRS; no CLEAR ACA, QUERY TASK or wakeup.
    let mut d = vec![0xda, 0, 0, 0];
    if repd {
        d.resize(16, 0);
        d[3] = 0x0c;
    }
    d.truncate(alloc);
    Ok(d)
}
