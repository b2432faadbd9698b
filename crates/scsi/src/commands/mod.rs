//! The one table of supported commands (SPC-4, SBC-3).
//!
//! Dispatch, the reserved-bit check of every CDB, REPORT SUPPORTED
//! OPERATION CODES and every per-command rule read [`COMMANDS`]: a command
//! exists, has a CDB layout and is reported exactly when it has a row
//! here, and its row's [`Rules`] say how it stands under reservations, on
//! a read-only LUN, without a medium, during SANITIZE, with a unit
//! attention pending and in each ALUA state. A new command is one row.

pub(crate) mod report;
pub mod rules;

pub use rules::{Access, Rules, ServedIn};

/// What a command does; the logical unit matches on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Op {
    TestUnitReady,
    RequestSense,
    Read,
    Write,
    WriteVerify,
    Verify,
    Inquiry,
    ModeSelect6,
    ModeSense6,
    ModeSelect10,
    ModeSense10,
    StartStopUnit,
    PreventAllow,
    ReadCapacity10,
    ReadCapacity16,
    PreFetch,
    SyncCache,
    ReportLuns,
    ReportOpcodes,
    ReportTmfs,
    /// REPORT TARGET PORT GROUPS (MAINTENANCE IN / 0Ah).
    ReportTpg,
    /// SET TARGET PORT GROUPS (MAINTENANCE OUT / 0Ah).
    SetTpg,
    WriteSame,
    Unmap,
    GetLbaStatus,
    CompareAndWrite,
    OrWrite,
    ReadDefectData,
    Reserve,
    Release,
    PrIn,
    PrOut,
    WriteAtomic,
    ExtendedCopy,
    ReceiveCopyResults,
    Sanitize,
}

/// One supported command.
#[derive(Debug, Clone, Copy)]
pub struct CommandDef {
    /// Operation code.
    pub opcode: u8,
    /// Service action, for commands that have one (in CDB byte 1, bits 4-0).
    pub service_action: Option<u8>,
    /// Name, for logs.
    pub name: &'static str,
    /// CDB length.
    pub cdb_len: usize,
    /// CDB usage data (SPC-4 §6.35.3): the bits an initiator may set.
    pub usage: &'static [u8],
    /// Behaviour.
    pub op: Op,
    /// The rules it follows before it runs.
    pub rules: Rules,
}

const fn c(
    opcode: u8,
    name: &'static str,
    usage: &'static [u8],
    op: Op,
    rules: Rules,
) -> CommandDef {
    CommandDef {
        opcode,
        service_action: None,
        name,
        cdb_len: usage.len(),
        usage,
        op,
        rules,
    }
}

const fn sa(
    opcode: u8,
    action: u8,
    name: &'static str,
    usage: &'static [u8],
    op: Op,
    rules: Rules,
) -> CommandDef {
    CommandDef {
        opcode,
        service_action: Some(action),
        name,
        cdb_len: usage.len(),
        usage,
        op,
        rules,
    }
}

const PR_IN: &[u8] = &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0];
const SANITIZE: &[u8] = &[0x48, 0xbf, 0, 0, 0, 0, 0, 0xff, 0xff, 0];
const RCR: &[u8] = &[
    0x84, 0x1f, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0,
];
const PR_OUT: &[u8] = &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0];

/// Every command the logical unit implements.
pub const COMMANDS: &[CommandDef] = &[
    c(
        0x00,
        "TEST UNIT READY",
        &[0x00, 0, 0, 0, 0, 0],
        Op::TestUnitReady,
        rules::TEST_UNIT_READY,
    ),
    c(
        0x03,
        "REQUEST SENSE",
        &[0x03, 0x01, 0, 0, 0xff, 0],
        Op::RequestSense,
        rules::STATUS,
    ),
    c(
        0x08,
        "READ(6)",
        &[0x08, 0x1f, 0xff, 0xff, 0xff, 0],
        Op::Read,
        rules::MEDIUM_READ,
    ),
    c(
        0x0a,
        "WRITE(6)",
        &[0x0a, 0x1f, 0xff, 0xff, 0xff, 0],
        Op::Write,
        rules::MEDIUM_WRITE,
    ),
    c(
        0x12,
        "INQUIRY",
        &[0x12, 0x01, 0xff, 0xff, 0xff, 0],
        Op::Inquiry,
        rules::STATUS,
    ),
    c(
        0x15,
        "MODE SELECT(6)",
        &[0x15, 0x11, 0, 0, 0xff, 0],
        Op::ModeSelect6,
        rules::MODE_SELECT,
    ),
    c(
        0x16,
        "RESERVE(6)",
        &[0x16, 0, 0, 0, 0, 0],
        Op::Reserve,
        rules::RESERVE_RELEASE,
    ),
    c(
        0x17,
        "RELEASE(6)",
        &[0x17, 0, 0, 0, 0, 0],
        Op::Release,
        rules::RESERVE_RELEASE,
    ),
    c(
        0x1a,
        "MODE SENSE(6)",
        &[0x1a, 0x08, 0xff, 0xff, 0xff, 0],
        Op::ModeSense6,
        rules::MODE_SENSE,
    ),
    c(
        0x1b,
        "START STOP UNIT",
        &[0x1b, 0x01, 0, 0x0f, 0xf7, 0],
        Op::StartStopUnit,
        rules::START_STOP,
    ),
    c(
        0x1e,
        "PREVENT ALLOW MEDIUM REMOVAL",
        &[0x1e, 0, 0, 0, 0x03, 0],
        Op::PreventAllow,
        rules::PREVENT_ALLOW,
    ),
    c(
        0x25,
        "READ CAPACITY(10)",
        &[0x25, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, 0],
        Op::ReadCapacity10,
        rules::CAPACITY,
    ),
    c(
        0x28,
        "READ(10)",
        &[0x28, 0xfe, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0],
        Op::Read,
        rules::MEDIUM_READ,
    ),
    c(
        0x2a,
        "WRITE(10)",
        &[0x2a, 0xfa, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0],
        Op::Write,
        rules::MEDIUM_WRITE,
    ),
    c(
        0x2e,
        "WRITE AND VERIFY(10)",
        &[0x2e, 0xf6, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0],
        Op::WriteVerify,
        rules::MEDIUM_WRITE,
    ),
    c(
        0x2f,
        "VERIFY(10)",
        &[0x2f, 0xf6, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0],
        Op::Verify,
        rules::MEDIUM_READ,
    ),
    c(
        0x34,
        "PRE-FETCH(10)",
        &[0x34, 0x02, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0],
        Op::PreFetch,
        rules::MEDIUM_READ,
    ),
    c(
        0x35,
        "SYNCHRONIZE CACHE(10)",
        &[0x35, 0x06, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0],
        Op::SyncCache,
        rules::SYNC_CACHE,
    ),
    c(
        0x37,
        "READ DEFECT DATA(10)",
        &[0x37, 0, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0],
        Op::ReadDefectData,
        rules::DEFECTS,
    ),
    c(
        0x41,
        "WRITE SAME(10)",
        &[0x41, 0xf8, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0],
        Op::WriteSame,
        rules::MEDIUM_WRITE,
    ),
    c(
        0x42,
        "UNMAP",
        &[0x42, 0x01, 0, 0, 0, 0, 0x3f, 0xff, 0xff, 0],
        Op::Unmap,
        rules::MEDIUM_WRITE,
    ),
    sa(
        0x48,
        0x01,
        "SANITIZE / OVERWRITE",
        SANITIZE,
        Op::Sanitize,
        rules::SANITIZE,
    ),
    sa(
        0x48,
        0x02,
        "SANITIZE / BLOCK ERASE",
        SANITIZE,
        Op::Sanitize,
        rules::SANITIZE,
    ),
    sa(
        0x48,
        0x03,
        "SANITIZE / CRYPTOGRAPHIC ERASE",
        SANITIZE,
        Op::Sanitize,
        rules::SANITIZE,
    ),
    sa(
        0x48,
        0x1f,
        "SANITIZE / EXIT FAILURE MODE",
        SANITIZE,
        Op::Sanitize,
        rules::SANITIZE,
    ),
    c(
        0x55,
        "MODE SELECT(10)",
        &[0x55, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
        Op::ModeSelect10,
        rules::MODE_SELECT,
    ),
    c(
        0x56,
        "RESERVE(10)",
        &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        Op::Reserve,
        rules::RESERVE_RELEASE,
    ),
    c(
        0x57,
        "RELEASE(10)",
        &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        Op::Release,
        rules::RESERVE_RELEASE,
    ),
    c(
        0x5a,
        "MODE SENSE(10)",
        &[0x5a, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0],
        Op::ModeSense10,
        rules::MODE_SENSE,
    ),
    sa(
        0x5e,
        0x00,
        "PERSISTENT RESERVE IN / READ KEYS",
        PR_IN,
        Op::PrIn,
        rules::PERSISTENT_RESERVE,
    ),
    sa(
        0x5e,
        0x01,
        "PERSISTENT RESERVE IN / READ RESERVATION",
        PR_IN,
        Op::PrIn,
        rules::PERSISTENT_RESERVE,
    ),
    sa(
        0x5e,
        0x02,
        "PERSISTENT RESERVE IN / REPORT CAPABILITIES",
        PR_IN,
        Op::PrIn,
        rules::PERSISTENT_RESERVE,
    ),
    sa(
        0x5e,
        0x03,
        "PERSISTENT RESERVE IN / READ FULL STATUS",
        PR_IN,
        Op::PrIn,
        rules::PERSISTENT_RESERVE,
    ),
    sa(
        0x5f,
        0x00,
        "PERSISTENT RESERVE OUT / REGISTER",
        PR_OUT,
        Op::PrOut,
        rules::PERSISTENT_RESERVE,
    ),
    sa(
        0x5f,
        0x01,
        "PERSISTENT RESERVE OUT / RESERVE",
        PR_OUT,
        Op::PrOut,
        rules::PERSISTENT_RESERVE,
    ),
    sa(
        0x5f,
        0x02,
        "PERSISTENT RESERVE OUT / RELEASE",
        PR_OUT,
        Op::PrOut,
        rules::PERSISTENT_RESERVE,
    ),
    sa(
        0x5f,
        0x03,
        "PERSISTENT RESERVE OUT / CLEAR",
        PR_OUT,
        Op::PrOut,
        rules::PERSISTENT_RESERVE,
    ),
    sa(
        0x5f,
        0x04,
        "PERSISTENT RESERVE OUT / PREEMPT",
        PR_OUT,
        Op::PrOut,
        rules::PERSISTENT_RESERVE,
    ),
    sa(
        0x5f,
        0x05,
        "PERSISTENT RESERVE OUT / PREEMPT AND ABORT",
        PR_OUT,
        Op::PrOut,
        rules::PERSISTENT_RESERVE,
    ),
    sa(
        0x5f,
        0x06,
        "PERSISTENT RESERVE OUT / REGISTER AND IGNORE EXISTING KEY",
        PR_OUT,
        Op::PrOut,
        rules::PERSISTENT_RESERVE,
    ),
    sa(
        0x83,
        0x00,
        "EXTENDED COPY(LID1)",
        &[
            0x83, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
        Op::ExtendedCopy,
        rules::EXTENDED_COPY,
    ),
    sa(
        0x84,
        0x00,
        "RECEIVE COPY RESULTS / COPY STATUS",
        RCR,
        Op::ReceiveCopyResults,
        rules::COPY_RESULTS,
    ),
    sa(
        0x84,
        0x03,
        "RECEIVE COPY RESULTS / OPERATING PARAMETERS",
        RCR,
        Op::ReceiveCopyResults,
        rules::COPY_RESULTS,
    ),
    c(
        0x88,
        "READ(16)",
        &[
            0x88, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0,
        ],
        Op::Read,
        rules::MEDIUM_READ,
    ),
    c(
        0x89,
        "COMPARE AND WRITE",
        &[
            0x89, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0x3f, 0,
        ],
        Op::CompareAndWrite,
        rules::MEDIUM_WRITE,
    ),
    c(
        0x8a,
        "WRITE(16)",
        &[
            0x8a, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0,
        ],
        Op::Write,
        rules::MEDIUM_WRITE,
    ),
    c(
        0x8b,
        "ORWRITE(16)",
        &[
            0x8b, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0,
        ],
        Op::OrWrite,
        rules::MEDIUM_WRITE,
    ),
    c(
        0x8e,
        "WRITE AND VERIFY(16)",
        &[
            0x8e, 0xf6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0,
        ],
        Op::WriteVerify,
        rules::MEDIUM_WRITE,
    ),
    c(
        0x8f,
        "VERIFY(16)",
        &[
            0x8f, 0xf6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0,
        ],
        Op::Verify,
        rules::MEDIUM_READ,
    ),
    c(
        0x90,
        "PRE-FETCH(16)",
        &[
            0x90, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0,
        ],
        Op::PreFetch,
        rules::MEDIUM_READ,
    ),
    c(
        0x91,
        "SYNCHRONIZE CACHE(16)",
        &[
            0x91, 0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0,
        ],
        Op::SyncCache,
        rules::SYNC_CACHE,
    ),
    c(
        0x93,
        "WRITE SAME(16)",
        &[
            0x93, 0xf9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0,
        ],
        Op::WriteSame,
        rules::MEDIUM_WRITE,
    ),
    c(
        0x9c,
        "WRITE ATOMIC(16)",
        &[
            0x9c, 0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0xff, 0xff, 0x3f, 0,
        ],
        Op::WriteAtomic,
        rules::MEDIUM_WRITE,
    ),
    sa(
        0x9e,
        0x10,
        "READ CAPACITY(16)",
        &[
            0x9e, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x01, 0,
        ],
        Op::ReadCapacity16,
        rules::CAPACITY,
    ),
    sa(
        0x9e,
        0x12,
        "GET LBA STATUS",
        &[
            0x9e, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
            0,
        ],
        Op::GetLbaStatus,
        rules::MEDIUM_READ,
    ),
    c(
        0xa0,
        "REPORT LUNS",
        &[0xa0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
        Op::ReportLuns,
        rules::STATUS,
    ),
    sa(
        0xa3,
        0x0a,
        "REPORT TARGET PORT GROUPS",
        // PARAMETER DATA FORMAT 000b or 001b: bit 5 only.
        &[0xa3, 0x3f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
        Op::ReportTpg,
        rules::PORT_GROUPS,
    ),
    sa(
        0xa4,
        0x0a,
        "SET TARGET PORT GROUPS",
        &[0xa4, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
        Op::SetTpg,
        rules::PORT_GROUPS,
    ),
    sa(
        0xa3,
        0x0c,
        "REPORT SUPPORTED OPERATION CODES",
        &[
            0xa3, 0x1f, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
        Op::ReportOpcodes,
        rules::SUPPORTED,
    ),
    sa(
        0xa3,
        0x0d,
        "REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS",
        &[0xa3, 0x1f, 0x80, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
        Op::ReportTmfs,
        rules::SUPPORTED,
    ),
    c(
        0xa8,
        "READ(12)",
        &[
            0xa8, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0,
        ],
        Op::Read,
        rules::MEDIUM_READ,
    ),
    c(
        0xaa,
        "WRITE(12)",
        &[
            0xaa, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0,
        ],
        Op::Write,
        rules::MEDIUM_WRITE,
    ),
    c(
        0xb7,
        "READ DEFECT DATA(12)",
        &[0xb7, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
        Op::ReadDefectData,
        rules::DEFECTS,
    ),
    c(
        0xae,
        "WRITE AND VERIFY(12)",
        &[
            0xae, 0xf6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0,
        ],
        Op::WriteVerify,
        rules::MEDIUM_WRITE,
    ),
    c(
        0xaf,
        "VERIFY(12)",
        &[
            0xaf, 0xf6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0,
        ],
        Op::Verify,
        rules::MEDIUM_READ,
    ),
];

/// Whether any command uses this opcode with service actions.
pub fn has_service_actions(opcode: u8) -> bool {
    COMMANDS
        .iter()
        .any(|d| d.opcode == opcode && d.service_action.is_some())
}

/// Find the row for a CDB (by opcode, and service action where the opcode
/// has them).
pub fn lookup(cdb: &[u8]) -> Option<&'static CommandDef> {
    let op = *cdb.first()?;
    let action = cdb.get(1).map(|b| b & 0x1f);
    by_opcode(op)
        .iter()
        .map(|&i| &COMMANDS[usize::from(i)])
        .find(|d| d.service_action.is_none() || d.service_action == action)
}

/// The rows of [`COMMANDS`] for one opcode, in table order: every command
/// looks its CDB up several times on the data path (counters, checks,
/// dispatch), so the lookup is an index, not a scan of the whole table.
fn by_opcode(op: u8) -> &'static [u8] {
    static INDEX: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    let index = INDEX.get_or_init(|| {
        let mut index = vec![Vec::new(); 256];
        for (i, d) in COMMANDS.iter().enumerate() {
            let row = u8::try_from(i).expect("the command table has at most 256 rows");
            index[usize::from(d.opcode)].push(row);
        }
        index
    });
    &index[usize::from(op)]
}

/// Find a row by opcode and optional service action (for REPORT SUPPORTED
/// OPERATION CODES).
pub fn find(opcode: u8, action: Option<u8>) -> Option<&'static CommandDef> {
    COMMANDS
        .iter()
        .find(|d| d.opcode == opcode && d.service_action == action)
}

/// Check the CDB against the usage data: a bit set where the command has
/// none is INVALID FIELD IN CDB at that byte. Returns the offending byte.
pub fn reserved_bits(def: &CommandDef, cdb: &[u8]) -> Option<(u16, u8)> {
    let last = def.cdb_len - 1;
    for i in 1..last {
        let extra = cdb.get(i).copied().unwrap_or(0) & !def.usage[i];
        if extra != 0 {
            return Some((i as u16, 7 - extra.leading_zeros() as u8));
        }
    }
    // Control byte: NACA and the obsolete LINK/FLAG bits are not supported.
    let control = cdb.get(last).copied().unwrap_or(0) & 0x07;
    if control != 0 {
        return Some((last as u16, 7 - control.leading_zeros() as u8));
    }
    None
}

#[cfg(test)]
mod tests;
