//! A target's LUN list: REPORT LUNS, decoded, and the words for a LUN
//! that is not there ("the target has no LUN 5 (it has LUNs 0, 1)").

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::bail;
use bytes::Bytes;
use ethersan_initiator::{CommandResult, Session, UnitAttention};

/// LUN numbers from REPORT LUNS parameter data.
pub fn lun_list(data: &[u8]) -> Vec<u64> {
    let Some(len) = data.get(0..4) else {
        return Vec::new();
    };
    let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
    data.get(8..(8 + len).min(data.len()))
        .unwrap_or_default()
        .chunks_exact(8)
        .map(|e| {
            ethersan_proto::pdu::lun_from_wire(u64::from_be_bytes(e.try_into().expect("8 bytes")))
        })
        .collect()
}

/// Run one command for `ls`/`inquiry`, sending it again after a unit
/// attention (see [`ethersan_initiator::attention`]); a REPORTED LUNS DATA
/// HAS CHANGED seen on the way is noted in `luns_changed`, so that `ls`
/// reads the LUN list again.
pub async fn command(
    s: &Session,
    lun: u64,
    cdb: &[u8],
    read_len: u32,
    luns_changed: &AtomicBool,
) -> anyhow::Result<CommandResult> {
    let a = s.command_attended(lun, cdb, Bytes::new(), read_len).await?;
    for ua in &a.attentions {
        tracing::info!("LUN {lun}: {ua}");
        if *ua == UnitAttention::LunsChanged {
            luns_changed.store(true, Ordering::Relaxed);
        }
    }
    Ok(a.result)
}

/// REPORT LUNS to LUN 0 after its unit attentions are cleared; a REPORTED
/// LUNS DATA HAS CHANGED on the way is noted in `changed`.
pub async fn report_luns(s: &Session, changed: &AtomicBool) -> anyhow::Result<Vec<u64>> {
    s.clear_unit_attention(0).await?;
    let mut cdb = [0u8; 12];
    cdb[0] = 0xa0;
    cdb[6..10].copy_from_slice(&4096u32.to_be_bytes());
    let r = command(s, 0, &cdb, 4096, changed).await?;
    if r.status != 0 {
        bail!(
            "REPORT LUNS: status {:#x} sense {:?}",
            r.status,
            r.sense_key()
        );
    }
    let len = u32::from_be_bytes(r.data[0..4].try_into()?) as usize;
    let mut luns = Vec::new();
    for e in r.data[8..(8 + len).min(r.data.len())].chunks_exact(8) {
        luns.push(ethersan_proto::pdu::lun_from_wire(u64::from_be_bytes(
            e.try_into()?,
        )));
    }
    Ok(luns)
}

/// "the target has no LUN 5 (it has LUNs 0, 1)": which LUNs there are
/// instead, from REPORT LUNS (left out when that fails too).
pub async fn no_such_lun(s: &Session, lun: u64) -> String {
    match report_luns(s, &AtomicBool::new(false)).await {
        Ok(luns) => format!("the target has no LUN {lun} ({})", it_has(&luns)),
        Err(_) => format!("the target has no LUN {lun}"),
    }
}

/// "it has LUN 0", "it has LUNs 0, 1", "it has no LUNs".
pub fn it_has(luns: &[u64]) -> String {
    let list = luns
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match luns.len() {
        0 => "it has no LUNs".into(),
        1 => format!("it has LUN {list}"),
        _ => format!("it has LUNs {list}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn it_has_names_the_luns_as_luns() {
        assert_eq!(super::it_has(&[]), "it has no LUNs");
        assert_eq!(super::it_has(&[0]), "it has LUN 0");
        assert_eq!(super::it_has(&[0, 1, 7]), "it has LUNs 0, 1, 7");
    }
}
