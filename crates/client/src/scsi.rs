//! A SCSI command's status and sense data as the client reports them:
//! the status by name, the sense key by name, and what to do about it.

use anyhow::bail;
use ethersan_initiator::CommandResult;

/// Human text for a SCSI sense key.
fn sense_key_name(key: u8) -> &'static str {
    match key {
        0x1 => "RECOVERED ERROR",
        0x2 => "NOT READY",
        0x3 => "MEDIUM ERROR",
        0x4 => "HARDWARE ERROR",
        0x5 => "ILLEGAL REQUEST",
        0x6 => "UNIT ATTENTION",
        0x7 => "DATA PROTECT",
        0x8 => "BLANK CHECK",
        0xb => "ABORTED COMMAND",
        0xe => "MISCOMPARE",
        _ => "sense",
    }
}

/// Turn a non-GOOD command result into an error naming the status and sense.
pub fn check(what: &str, r: &CommandResult) -> anyhow::Result<()> {
    if r.status == 0 {
        return Ok(());
    }
    match (r.status, r.sense_key()) {
        (0x18, _) => {
            bail!("{what}: RESERVATION CONFLICT (another initiator holds a reservation on the LUN)")
        }
        (0x08, _) => bail!("{what}: target BUSY"),
        (0x28, _) => bail!("{what}: TASK SET FULL"),
        (_, Some((key, asc, ascq))) => {
            let hint = match (key, asc, ascq) {
                (0x7, 0x27, 0x07) => " — the target's backing store is out of space (free space on the server's filesystem)",
                (0x7, 0x27, _) => " — the LUN is read-only",
                (0x3, 0x11, _) => " — the target could not read its backing store (see the server's log)",
                (0x3, 0x0c, _) => " — the target could not write its backing store (see the server's log)",
                (0x2, 0x3a, _) => " — no medium (ejected)",
                (0x5, 0x21, _) => " — address beyond the end of the LUN",
                (0x5, 0x25, _) => " — no such LUN",
                (0x7, 0x74, 0x71) => " — the LUN needs a channel of a higher security level (?security= in the URL)",
                _ => "",
            };
            bail!(
                "{what}: CHECK CONDITION, {} (ASC {asc:#04x} ASCQ {ascq:#04x}){hint}",
                sense_key_name(key)
            )
        }
        (s, None) => bail!("{what}: SCSI status {s:#04x}"),
    }
}
