//! The ATA side of AoE r11 §3.1: the command set an AoE target emulates,
//! the status and error register bits it answers with, and the 512-byte
//! IDENTIFY DEVICE data (ATA8-ACS §7.16), built by the target and parsed by
//! the initiator.
//!
//! IDENTIFY data is 256 little-endian words. Strings (serial, firmware,
//! model) hold two characters per word, the first in the high byte, padded
//! with spaces. The Linux aoe driver reads words 83/86 bit 10 (48-bit
//! addressing), words 100–103 (LBA48 capacity) or else 60–61 (LBA28
//! capacity) and 54–56 (geometry), and the three strings.

/// READ SECTORS (LBA28).
pub const CMD_READ_SECTORS: u8 = 0x20;
/// READ SECTORS EXT (LBA48).
pub const CMD_READ_SECTORS_EXT: u8 = 0x24;
/// WRITE SECTORS (LBA28).
pub const CMD_WRITE_SECTORS: u8 = 0x30;
/// WRITE SECTORS EXT (LBA48).
pub const CMD_WRITE_SECTORS_EXT: u8 = 0x34;
/// CHECK POWER MODE.
pub const CMD_CHECK_POWER_MODE: u8 = 0xE5;
/// FLUSH CACHE.
pub const CMD_FLUSH_CACHE: u8 = 0xE7;
/// FLUSH CACHE EXT.
pub const CMD_FLUSH_CACHE_EXT: u8 = 0xEA;
/// IDENTIFY DEVICE.
pub const CMD_IDENTIFY_DEVICE: u8 = 0xEC;

/// Status: busy.
pub const STATUS_BSY: u8 = 0x80;
/// Status: device ready.
pub const STATUS_DRDY: u8 = 0x40;
/// Status: device fault.
pub const STATUS_DF: u8 = 0x20;
/// Status: data request.
pub const STATUS_DRQ: u8 = 0x08;
/// Status: error (details in the error register).
pub const STATUS_ERR: u8 = 0x01;
/// Status bits that are clear when a command succeeded (BSY, DF, DRQ, ERR;
/// the Linux driver tests exactly these).
pub const STATUS_FAILURE_MASK: u8 = STATUS_BSY | STATUS_DF | STATUS_DRQ | STATUS_ERR;

/// Error: uncorrectable data (a read failed).
pub const ERROR_UNC: u8 = 0x40;
/// Error: ID not found (the address is outside the device).
pub const ERROR_IDNF: u8 = 0x10;
/// Error: command aborted (unsupported, not permitted or invalid).
pub const ERROR_ABRT: u8 = 0x04;

/// CHECK POWER MODE sector count: active or idle.
pub const POWER_ACTIVE_OR_IDLE: u8 = 0xFF;
/// The largest LBA28 capacity words 60–61 can report.
pub const LBA28_MAX_SECTORS: u64 = 0x0FFF_FFFF;
/// The largest address LBA48 can express, plus one.
pub const LBA48_LIMIT: u64 = 1 << 48;
/// Length of IDENTIFY DEVICE data.
pub const IDENTIFY_LEN: usize = 512;

/// The ATA commands an AoE target understands, classified once so the
/// target dispatches on a type rather than on opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtaCommand {
    /// IDENTIFY DEVICE (0xEC).
    Identify,
    /// CHECK POWER MODE (0xE5).
    CheckPowerMode,
    /// FLUSH CACHE (0xE7) or FLUSH CACHE EXT (0xEA).
    Flush,
    /// READ SECTORS (0x20) or READ SECTORS EXT (0x24).
    Read {
        /// The EXT (LBA48) form.
        ext: bool,
    },
    /// WRITE SECTORS (0x30) or WRITE SECTORS EXT (0x34).
    Write {
        /// The EXT (LBA48) form.
        ext: bool,
    },
}

impl AtaCommand {
    /// Classify a command register value; `None` for anything else (which
    /// a target aborts).
    pub fn from_opcode(op: u8) -> Option<AtaCommand> {
        Some(match op {
            CMD_IDENTIFY_DEVICE => AtaCommand::Identify,
            CMD_CHECK_POWER_MODE => AtaCommand::CheckPowerMode,
            CMD_FLUSH_CACHE | CMD_FLUSH_CACHE_EXT => AtaCommand::Flush,
            CMD_READ_SECTORS => AtaCommand::Read { ext: false },
            CMD_READ_SECTORS_EXT => AtaCommand::Read { ext: true },
            CMD_WRITE_SECTORS => AtaCommand::Write { ext: false },
            CMD_WRITE_SECTORS_EXT => AtaCommand::Write { ext: true },
            _ => return None,
        })
    }

    /// The LBA a command addresses: 48 bits for EXT commands, 28 for the
    /// others (whose fourth LBA byte carries device/head bits up top).
    pub fn effective_lba(self, raw: u64) -> u64 {
        match self {
            AtaCommand::Read { ext: true } | AtaCommand::Write { ext: true } => {
                raw & (LBA48_LIMIT - 1)
            }
            _ => raw & LBA28_MAX_SECTORS,
        }
    }
}

/// What goes into a device's IDENTIFY data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentifyParams<'a> {
    /// Capacity in 512-byte sectors.
    pub sectors: u64,
    /// Model number (up to 40 characters).
    pub model: &'a str,
    /// Serial number (up to 20 characters).
    pub serial: &'a str,
    /// Firmware revision (up to 8 characters).
    pub firmware: &'a str,
    /// The volatile write cache is enabled (FLUSH CACHE makes writes stable).
    pub write_cache: bool,
}

fn put_word(id: &mut [u8; IDENTIFY_LEN], word: usize, v: u16) {
    id[word * 2..word * 2 + 2].copy_from_slice(&v.to_le_bytes());
}

fn word(id: &[u8], word: usize) -> u16 {
    u16::from_le_bytes([id[word * 2], id[word * 2 + 1]])
}

/// Write `s` into `words` words from `first`, ATA style: space padded, two
/// characters per word with the first in the high byte. Characters outside
/// printable ASCII become '?'.
fn put_string(id: &mut [u8; IDENTIFY_LEN], first: usize, words: usize, s: &str) {
    let mut chars = s.chars().map(|c| {
        if (' '..='~').contains(&c) {
            c as u8
        } else {
            b'?'
        }
    });
    for w in 0..words {
        let hi = chars.next().unwrap_or(b' ');
        let lo = chars.next().unwrap_or(b' ');
        put_word(id, first + w, u16::from(hi) << 8 | u16::from(lo));
    }
}

fn get_string(id: &[u8], first: usize, words: usize) -> String {
    let mut s = String::with_capacity(words * 2);
    for w in first..first + words {
        for b in word(id, w).to_be_bytes() {
            s.push(if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '?'
            });
        }
    }
    s.trim().to_string()
}

/// Build IDENTIFY DEVICE data for a device.
pub fn identify_data(p: &IdentifyParams<'_>) -> [u8; IDENTIFY_LEN] {
    let mut id = [0u8; IDENTIFY_LEN];
    let sectors = p.sectors.min(LBA48_LIMIT);
    // Legacy geometry (words 1, 3, 6 and current 54–58): 16 heads, 63
    // sectors per track, cylinders capped at 16383 as ATA prescribes.
    let cylinders = (sectors / (16 * 63)).min(16383) as u16;
    put_word(&mut id, 0, 0x0040); // fixed device
    put_word(&mut id, 1, cylinders);
    put_word(&mut id, 3, 16);
    put_word(&mut id, 6, 63);
    put_string(&mut id, 10, 10, p.serial);
    put_string(&mut id, 23, 4, p.firmware);
    put_string(&mut id, 27, 20, p.model);
    put_word(&mut id, 47, 0x8000); // READ/WRITE MULTIPLE not supported
    put_word(&mut id, 49, 0x0200); // LBA supported
    put_word(&mut id, 50, 0x4000);
    put_word(&mut id, 53, 0x0001); // words 54–58 valid
    put_word(&mut id, 54, cylinders);
    put_word(&mut id, 55, 16);
    put_word(&mut id, 56, 63);
    let chs = u32::from(cylinders) * 16 * 63;
    put_word(&mut id, 57, chs as u16);
    put_word(&mut id, 58, (chs >> 16) as u16);
    let lba28 = sectors.min(LBA28_MAX_SECTORS) as u32;
    put_word(&mut id, 60, lba28 as u16);
    put_word(&mut id, 61, (lba28 >> 16) as u16);
    put_word(&mut id, 80, 0x01E0); // ATA/ATAPI-5 through ATA8-ACS
    put_word(&mut id, 82, 1 << 5); // volatile write cache supported
                                   // Word 83: bit 14 set, FLUSH CACHE EXT (13), FLUSH CACHE (12), 48-bit
                                   // address feature set (10).
    put_word(&mut id, 83, 0x4000 | 1 << 13 | 1 << 12 | 1 << 10);
    put_word(&mut id, 84, 0x4000);
    put_word(&mut id, 85, if p.write_cache { 1 << 5 } else { 0 });
    put_word(&mut id, 86, 1 << 13 | 1 << 12 | 1 << 10);
    put_word(&mut id, 87, 0x4000);
    for (i, w) in (100..104).enumerate() {
        put_word(&mut id, w, (sectors >> (16 * i)) as u16);
    }
    // Word 106: bit 14 set, one logical sector per physical sector, logical
    // sectors of 256 words (512 bytes; words 117–118 unused).
    put_word(&mut id, 106, 0x4000);
    // Word 255: integrity word, signature 0xA5 and a checksum making the
    // 512 bytes sum to zero.
    id[510] = 0xA5;
    let sum = id[..511].iter().fold(0u8, |a, &b| a.wrapping_add(b));
    id[511] = sum.wrapping_neg();
    id
}

/// What an initiator learns from IDENTIFY DEVICE data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentifyInfo {
    /// Capacity in 512-byte sectors.
    pub sectors: u64,
    /// The device takes LBA48 (EXT) commands.
    pub lba48: bool,
    /// Model number, trimmed.
    pub model: String,
    /// Serial number, trimmed.
    pub serial: String,
    /// Firmware revision, trimmed.
    pub firmware: String,
    /// The volatile write cache is enabled (FLUSH after writes).
    pub write_cache: bool,
}

/// Why IDENTIFY data could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifyError {
    /// Fewer than 512 bytes.
    #[error("IDENTIFY data is {0} bytes, 512 are needed")]
    Short(usize),
    /// The integrity word's signature is present and the checksum wrong.
    #[error("IDENTIFY data checksum mismatch")]
    Checksum,
}

/// Parse IDENTIFY DEVICE data the way the Linux aoe driver reads it.
pub fn parse_identify(data: &[u8]) -> Result<IdentifyInfo, IdentifyError> {
    if data.len() < IDENTIFY_LEN {
        return Err(IdentifyError::Short(data.len()));
    }
    let id = &data[..IDENTIFY_LEN];
    if id[510] == 0xA5 && id.iter().fold(0u8, |a, &b| a.wrapping_add(b)) != 0 {
        return Err(IdentifyError::Checksum);
    }
    let lba48 = (word(id, 83) | word(id, 86)) & (1 << 10) != 0;
    let sectors = if lba48 {
        (0..4).fold(0u64, |acc, i| {
            acc | u64::from(word(id, 100 + i)) << (16 * i)
        })
    } else {
        u64::from(word(id, 60)) | u64::from(word(id, 61)) << 16
    };
    Ok(IdentifyInfo {
        sectors,
        lba48,
        model: get_string(id, 27, 20),
        serial: get_string(id, 10, 10),
        firmware: get_string(id, 23, 4),
        write_cache: word(id, 85) & (1 << 5) != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(sectors: u64) -> IdentifyParams<'static> {
        IdentifyParams {
            sectors,
            model: "ethersan AoE",
            serial: "1.2:host",
            firmware: "0.1.0",
            write_cache: true,
        }
    }

    #[test]
    fn strings_are_byte_swapped_and_padded() {
        let id = identify_data(&params(1000));
        // "ethe" -> words ('e','t'), ('h','e'), each stored low byte first.
        assert_eq!(&id[54..58], b"teeh");
        assert_eq!(&id[46..54], b".0.1 0  ");
        assert_eq!(id[27 * 2 + 39], b' ');
        let info = parse_identify(&id).unwrap();
        assert_eq!(info.model, "ethersan AoE");
        assert_eq!(info.serial, "1.2:host");
        assert_eq!(info.firmware, "0.1.0");
        assert!(info.write_cache);
    }

    #[test]
    fn capacities_and_feature_bits() {
        let small = identify_data(&params(1_000_000));
        assert_eq!(word(&small, 60), (1_000_000u32 & 0xFFFF) as u16);
        assert_eq!(word(&small, 61), (1_000_000u32 >> 16) as u16);
        let big_n = 0x1_2345_6789u64;
        let big = identify_data(&params(big_n));
        assert_eq!(
            u32::from(word(&big, 60)) | u32::from(word(&big, 61)) << 16,
            0x0FFF_FFFF
        );
        assert_eq!(word(&big, 100), 0x6789);
        assert_eq!(word(&big, 101), 0x2345);
        assert_eq!(word(&big, 102), 0x0001);
        assert_ne!(word(&big, 83) & (1 << 10), 0);
        assert_ne!(word(&big, 83) & (1 << 12), 0);
        assert_ne!(word(&big, 83) & (1 << 13), 0);
        assert_ne!(word(&big, 82) & (1 << 5), 0);
        assert_eq!(word(&big, 106), 0x4000);
        assert_eq!(word(&big, 1), 16383);
        let info = parse_identify(&big).unwrap();
        assert!(info.lba48);
        assert_eq!(info.sectors, big_n);
        let no_wc = identify_data(&IdentifyParams {
            write_cache: false,
            ..params(8)
        });
        assert!(!parse_identify(&no_wc).unwrap().write_cache);
    }

    #[test]
    fn checksum_sums_to_zero_and_is_checked() {
        let mut id = identify_data(&params(4096));
        assert_eq!(id.iter().fold(0u8, |a, &b| a.wrapping_add(b)), 0);
        id[0] ^= 1;
        assert_eq!(parse_identify(&id), Err(IdentifyError::Checksum));
        assert_eq!(parse_identify(&id[..100]), Err(IdentifyError::Short(100)));
    }

    #[test]
    fn lba28_only_data_parses_words_60_61() {
        let mut id = [0u8; 512];
        put_word(&mut id, 60, 0x5678);
        put_word(&mut id, 61, 0x0123);
        let info = parse_identify(&id).unwrap();
        assert!(!info.lba48);
        assert_eq!(info.sectors, 0x0123_5678);
    }

    #[test]
    fn non_ascii_becomes_question_mark() {
        let id = identify_data(&IdentifyParams {
            model: "dïsk",
            ..params(1)
        });
        assert_eq!(parse_identify(&id).unwrap().model, "d?sk");
    }

    #[test]
    fn opcodes_classified_and_lba_masked() {
        assert_eq!(
            AtaCommand::from_opcode(0x24),
            Some(AtaCommand::Read { ext: true })
        );
        assert_eq!(
            AtaCommand::from_opcode(0x30),
            Some(AtaCommand::Write { ext: false })
        );
        assert_eq!(AtaCommand::from_opcode(0xEA), Some(AtaCommand::Flush));
        assert_eq!(AtaCommand::from_opcode(0xEF), None);
        // LBA28: the device/head nibble (0xE0 in byte 3) is not address.
        assert_eq!(
            AtaCommand::Read { ext: false }.effective_lba(0xE012_3456),
            0x0012_3456
        );
        assert_eq!(
            AtaCommand::Read { ext: true }.effective_lba(0xFFFF_1234_5678_9ABC),
            0x1234_5678_9ABC
        );
    }
}
