//! What one SCSI command returns to its caller: status, sense, Data-In
//! and the residual (RFC 7143 §11.4).

use ethersan_scsi::sense::Sense;

/// The outcome of one SCSI command.
#[derive(Debug, Clone, Default)]
pub struct CommandResult {
    /// SCSI status byte.
    pub status: u8,
    /// Sense data (without the 2-byte length), empty if none.
    pub sense: Vec<u8>,
    /// Data-In received.
    pub data: Vec<u8>,
    /// Residual count reported by the target.
    pub residual: u32,
    /// Residual overflow flag.
    pub overflow: bool,
    /// Residual underflow flag.
    pub underflow: bool,
}

impl CommandResult {
    /// Sense key, ASC and ASCQ from fixed or descriptor sense, if present.
    pub fn sense_key(&self) -> Option<(u8, u8, u8)> {
        Sense::parse(&self.sense).map(|s| s.triple())
    }

    /// The INFORMATION field of the sense data (fixed format with VALID
    /// set, or the descriptor format's information descriptor).
    pub fn sense_information(&self) -> Option<u64> {
        Sense::parse(&self.sense)?.info
    }
}
