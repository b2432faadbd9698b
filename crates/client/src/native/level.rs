//! A LUN refused because the native transport channel is below the LUN's
//! security level (docs/native-transport.md): DATA PROTECT, LOGICAL UNIT
//! ACCESS NOT AUTHORIZED, the level the LUN needs in the sense data's
//! INFORMATION field.

use ethersan_channel::Level;
use ethersan_initiator::CommandResult;

/// A LUN the target refused because the native transport channel is below
/// the LUN's security level.
#[derive(Debug, thiserror::Error)]
#[error("LUN {lun} needs a channel at security={needed} and this one is at security={channel}: connect with ?security={needed} in the URL")]
pub struct LevelTooLow {
    /// The LUN.
    pub lun: u64,
    /// The least level it needs.
    pub needed: Level,
    /// The channel's level.
    pub channel: Level,
}

/// When an ethersan target refused `r` for the channel's security level:
/// the level the LUN needs.
pub fn level_needed(r: &CommandResult) -> Option<Level> {
    if r.status != 0x02 || r.sense_key() != Some((0x7, 0x74, 0x71)) {
        return None;
    }
    Level::from_u8(u8::try_from(r.sense_information()?).ok()?)
}

/// The error for `r`, the answer of a command to `lun` over a channel at
/// `channel` (`None`: TCP), when the target refused it for the channel's
/// security level.
pub fn level_too_low(channel: Option<Level>, lun: u64, r: &CommandResult) -> Option<LevelTooLow> {
    Some(LevelTooLow {
        lun,
        needed: level_needed(r)?,
        channel: channel?,
    })
}
