//! The one table of supported commands (SPC-4, SBC-3).
//!
//! Dispatch, the reserved-bit check of every CDB, REPORT SUPPORTED
//! OPERATION CODES and every per-command rule read [`COMMANDS`]: a command
//! exists, has a CDB layout and is reported exactly when it has a row
//! here, and its row's [`Rules`] say how it stands under reservations, on
//! a read-only LUN, without a medium, during SANITIZE, with a unit
//! attention pending and in each ALUA state. A new command is one row.

use crate::be::{be16, be32};
use crate::sense::Sense;

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

/// How a command touches the medium, which decides when it conflicts
/// with a reservation another I_T nexus holds (SPC-4 §5.9.1 table 46,
/// SBC-4 §4.17 table 13): under Write Exclusive (and its registrants-only
/// and all-registrants types, for a nexus that holds no registration)
/// [`Access::Write`] conflicts; under Exclusive Access (and its types)
/// [`Access::Read`] conflicts too. RESERVE(6/10) held by another nexus
/// refuses both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Never conflicts (INQUIRY, REPORT LUNS, REQUEST SENSE, TEST UNIT
    /// READY, READ CAPACITY, PERSISTENT RESERVE IN/OUT, ...).
    Free,
    /// Reads the medium or its parameters.
    Read,
    /// Changes the medium or its parameters.
    Write,
}

/// The asymmetric access states that serve a command (SPC-4 §5.16.2.4);
/// in the others it ends with NOT READY, ASYMMETRIC ACCESS STATE
/// TRANSITION... (04h/0Bh standby, 04h/0Ch unavailable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedIn {
    /// Every state this unit has, unavailable included (INQUIRY, REPORT
    /// LUNS, REQUEST SENSE, the REPORT SUPPORTED commands, REPORT/SET
    /// TARGET PORT GROUPS; §5.16.2.4.5).
    EveryState,
    /// The active states and standby (MODE SENSE/SELECT, PERSISTENT
    /// RESERVE IN/OUT; §5.16.2.4.4).
    Standby,
    /// The active states only.
    ActiveOnly,
}

/// The rules one command follows, checked before it runs; columns of
/// [`COMMANDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// How it stands under reservations.
    pub access: Access,
    /// It writes the medium: a LUN read-only for the initiator answers
    /// DATA PROTECT, WRITE PROTECTED.
    pub changes_medium: bool,
    /// It needs the medium: without one (ejected) it ends with MEDIUM NOT
    /// PRESENT, after a failed SANITIZE with SANITIZE FAILED.
    pub needs_medium: bool,
    /// It may run while a SANITIZE is in progress (SBC-4 §4.11.2); every
    /// other command ends with NOT READY, SANITIZE IN PROGRESS.
    pub during_sanitize: bool,
    /// It reports no unit attention (SAM-5 §5.14): a pending one stays
    /// queued for the next command.
    pub ua_exempt: bool,
    /// The ALUA states that serve it.
    pub alua: ServedIn,
}

impl Rules {
    /// Touches nothing, served in the active states only; the builders
    /// below add to it.
    const fn new(access: Access) -> Rules {
        Rules {
            access,
            changes_medium: false,
            needs_medium: false,
            during_sanitize: false,
            ua_exempt: false,
            alua: ServedIn::ActiveOnly,
        }
    }
    const fn needs_medium(self) -> Rules {
        Rules {
            needs_medium: true,
            ..self
        }
    }
    const fn changes_medium(self) -> Rules {
        Rules {
            changes_medium: true,
            ..self
        }
    }
    const fn served_in(self, alua: ServedIn) -> Rules {
        Rules { alua, ..self }
    }
    const fn during_sanitize(self) -> Rules {
        Rules {
            during_sanitize: true,
            ..self
        }
    }
    const fn ua_exempt(self) -> Rules {
        Rules {
            ua_exempt: true,
            ..self
        }
    }
}

/// The rules of each family of commands, one place per family; each row
/// of [`COMMANDS`] names one.
pub mod rules {
    use super::{Access, Rules, ServedIn};

    /// INQUIRY, REQUEST SENSE, REPORT LUNS: what an initiator asks first,
    /// answered in every state, with no unit attention.
    pub const STATUS: Rules = Rules::new(Access::Free)
        .served_in(ServedIn::EveryState)
        .during_sanitize()
        .ua_exempt();
    /// REPORT SUPPORTED OPERATION CODES / TASK MANAGEMENT FUNCTIONS.
    pub const SUPPORTED: Rules = Rules::new(Access::Free)
        .served_in(ServedIn::EveryState)
        .during_sanitize();
    /// REPORT/SET TARGET PORT GROUPS: how a path checker finds and moves
    /// the active path.
    pub const PORT_GROUPS: Rules = Rules::new(Access::Free).served_in(ServedIn::EveryState);
    /// TEST UNIT READY: says whether the medium is there.
    pub const TEST_UNIT_READY: Rules = Rules::new(Access::Free).needs_medium();
    /// READ CAPACITY (10/16).
    pub const CAPACITY: Rules = Rules::new(Access::Free).needs_medium();
    /// READ, VERIFY, PRE-FETCH, GET LBA STATUS: read the medium.
    pub const MEDIUM_READ: Rules = Rules::new(Access::Read).needs_medium();
    /// WRITE, WRITE AND VERIFY, WRITE SAME, UNMAP, COMPARE AND WRITE,
    /// ORWRITE, WRITE ATOMIC: write the medium.
    pub const MEDIUM_WRITE: Rules = Rules::new(Access::Write).needs_medium().changes_medium();
    /// SYNCHRONIZE CACHE: makes writes durable (conflicts as a write,
    /// SBC-4 table 13; changes no data).
    pub const SYNC_CACHE: Rules = Rules::new(Access::Write).needs_medium();
    /// MODE SENSE (6/10).
    pub const MODE_SENSE: Rules = Rules::new(Access::Read).served_in(ServedIn::Standby);
    /// MODE SELECT (6/10): changes the unit's parameters, not its data.
    pub const MODE_SELECT: Rules = Rules::new(Access::Write).served_in(ServedIn::Standby);
    /// PERSISTENT RESERVE IN/OUT (PERSISTENT RESERVE OUT checks its own
    /// conflicts, SPC-4 table 47).
    pub const PERSISTENT_RESERVE: Rules = Rules::new(Access::Free).served_in(ServedIn::Standby);
    /// RESERVE/RELEASE (6/10): check their own conflicts.
    pub const RESERVE_RELEASE: Rules = Rules::new(Access::Free);
    /// START STOP UNIT: loads and ejects the medium.
    pub const START_STOP: Rules = Rules::new(Access::Write);
    /// PREVENT ALLOW MEDIUM REMOVAL.
    pub const PREVENT_ALLOW: Rules = Rules::new(Access::Free);
    /// READ DEFECT DATA (10/12): reads the unit's parameters.
    pub const DEFECTS: Rules = Rules::new(Access::Read);
    /// EXTENDED COPY: writes the LUNs its descriptors name (the copy
    /// manager reaches them, not this unit's medium).
    pub const EXTENDED_COPY: Rules = Rules::new(Access::Write).changes_medium();
    /// RECEIVE COPY RESULTS.
    pub const COPY_RESULTS: Rules = Rules::new(Access::Free);
    /// SANITIZE: erases the medium; runs without one being usable, since
    /// it is how a unit leaves the failure mode a failed SANITIZE left.
    pub const SANITIZE: Rules = Rules::new(Access::Write).changes_medium();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexed_lookup_matches_a_scan_of_the_table() {
        for op in 0..=255u8 {
            for byte1 in 0..=255u8 {
                let action = byte1 & 0x1f;
                let scan = COMMANDS.iter().find(|d| {
                    d.opcode == op
                        && (d.service_action.is_none() || d.service_action == Some(action))
                });
                let found = lookup(&[op, byte1]);
                assert_eq!(
                    found.map(|d| d.name),
                    scan.map(|d| d.name),
                    "{op:#04x} {byte1:#04x}"
                );
            }
            let alone = COMMANDS
                .iter()
                .find(|d| d.opcode == op && d.service_action.is_none());
            assert_eq!(lookup(&[op]).map(|d| d.name), alone.map(|d| d.name));
        }
    }

    #[test]
    fn table_is_consistent() {
        for d in COMMANDS {
            assert_eq!(d.usage[0], d.opcode, "{}", d.name);
            assert!(matches!(d.cdb_len, 6 | 10 | 12 | 16), "{}", d.name);
            if let Some(a) = d.service_action {
                assert_eq!(d.usage[1] & 0x1f, 0x1f, "{}", d.name);
                assert!(a < 0x20);
            }
            let dups = COMMANDS
                .iter()
                .filter(|o| o.opcode == d.opcode && o.service_action == d.service_action)
                .count();
            assert_eq!(dups, 1, "{}", d.name);
        }
        assert_eq!(lookup(&[0x9e, 0x10]).unwrap().op, Op::ReadCapacity16);
        assert!(lookup(&[0x9e, 0x11]).is_none());
        assert!(lookup(&[0xff]).is_none());
    }

    /// The columns of every row agree with each other, and every row of
    /// one command kind has the same rules.
    #[test]
    fn every_row_has_consistent_rules() {
        for d in COMMANDS {
            let r = d.rules;
            // Writing the medium conflicts under Write Exclusive (SPC-4
            // table 46): WRITE ATOMIC(16) was the one that did not.
            if r.changes_medium {
                assert_eq!(r.access, Access::Write, "{}", d.name);
            }
            // Writing the medium needs one, except SANITIZE (it is how a
            // unit leaves the failure mode a failed SANITIZE left) and
            // EXTENDED COPY (it writes the LUNs its descriptors name).
            if r.changes_medium && !matches!(d.op, Op::Sanitize | Op::ExtendedCopy) {
                assert!(r.needs_medium, "{}", d.name);
            }
            // What runs during a SANITIZE touches no medium and conflicts
            // with nothing; what reports no unit attention also runs then,
            // in every ALUA state.
            if r.during_sanitize {
                assert!(!r.needs_medium && r.access == Access::Free, "{}", d.name);
                assert_eq!(r.alua, ServedIn::EveryState, "{}", d.name);
            }
            if r.ua_exempt {
                assert!(r.during_sanitize, "{}", d.name);
            }
            // Standby and unavailable serve nothing that needs the medium.
            if r.alua != ServedIn::ActiveOnly {
                assert!(!r.needs_medium, "{}", d.name);
            }
            // Every block read or write of the data path needs the medium.
            if matches!(d.op, Op::Read | Op::Write | Op::WriteVerify | Op::SyncCache) {
                assert!(r.needs_medium && r.access != Access::Free, "{}", d.name);
            }
            for o in COMMANDS.iter().filter(|o| o.op == d.op) {
                assert_eq!(o.rules, r, "{} and {}", d.name, o.name);
            }
        }
    }

    #[test]
    fn reserved_bit_check() {
        let d = lookup(&[0x12]).unwrap();
        assert_eq!(reserved_bits(d, &[0x12, 0x02, 0, 0, 36, 0]), Some((1, 1)));
        assert_eq!(reserved_bits(d, &[0x12, 0x01, 0x80, 0, 36, 0]), None);
        assert_eq!(reserved_bits(d, &[0x12, 0, 0, 0, 36, 0x04]), Some((5, 2)));
    }

    fn rsoc(rctd: bool, options: u8, opcode: u8, sa: u16, alloc: u32) -> Vec<u8> {
        let (s, a) = (sa.to_be_bytes(), alloc.to_be_bytes());
        vec![
            0xa3,
            0x0c,
            u8::from(rctd) << 7 | options,
            opcode,
            s[0],
            s[1],
            a[0],
            a[1],
            a[2],
            a[3],
            0,
            0,
        ]
    }

    #[test]
    fn all_commands_come_from_the_table() {
        for rctd in [false, true] {
            let d = report_supported_opcodes(&rsoc(rctd, 0, 0, 0, 1 << 16)).unwrap();
            let len = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
            assert_eq!(len, d.len() - 4);
            let size = if rctd { 20 } else { 8 };
            assert_eq!(len, COMMANDS.len() * size);
            for (desc, def) in d[4..].chunks(size).zip(COMMANDS) {
                assert_eq!(desc[0], def.opcode);
                assert_eq!(
                    desc[5] & 1,
                    u8::from(def.service_action.is_some()),
                    "SERVACTV"
                );
                assert_eq!(
                    u16::from_be_bytes([desc[2], desc[3]]),
                    u16::from(def.service_action.unwrap_or(0))
                );
                assert_eq!(
                    usize::from(u16::from_be_bytes([desc[6], desc[7]])),
                    def.cdb_len
                );
                assert_eq!(desc[5] & 2 != 0, rctd, "CTDP");
                if rctd {
                    assert_eq!(&desc[8..10], &[0, 0x0a], "timeouts descriptor length");
                }
            }
        }
        // Truncated to the allocation length.
        assert_eq!(
            report_supported_opcodes(&rsoc(false, 0, 0, 0, 10))
                .unwrap()
                .len(),
            10
        );
    }

    #[test]
    fn one_command_returns_its_usage_data() {
        // Option 1: an opcode without service actions.
        let d = report_supported_opcodes(&rsoc(false, 1, 0x28, 0, 64)).unwrap();
        assert_eq!(d[1] & 0x07, 3, "supported as the standard says");
        assert_eq!(u16::from_be_bytes([d[2], d[3]]), 10);
        assert_eq!(&d[4..14], lookup(&[0x28]).unwrap().usage);
        // Option 2: opcode and service action, with the timeouts descriptor.
        let d = report_supported_opcodes(&rsoc(true, 2, 0x9e, 0x10, 64)).unwrap();
        assert_eq!(d[1], 0x83);
        assert_eq!(d[4], 0x9e);
        assert_eq!(d.len(), 4 + 16 + 12);
        // Not supported: SUPPORT = 1, no usage data.
        assert_eq!(
            report_supported_opcodes(&rsoc(false, 1, 0xff, 0, 64)).unwrap(),
            [0, 1, 0, 0]
        );
        assert_eq!(
            report_supported_opcodes(&rsoc(false, 2, 0x9e, 0x1f, 64)).unwrap(),
            [0, 1, 0, 0]
        );
        assert_eq!(
            report_supported_opcodes(&rsoc(false, 2, 0x9e, 0x100, 64)).unwrap(),
            [0, 1, 0, 0]
        );
    }

    #[test]
    fn reporting_option_mismatches_are_invalid_fields() {
        let bad = Sense::invalid_cdb_field(2, Some(2));
        // Option 1 for an opcode with service actions, option 2 for one without.
        assert_eq!(
            report_supported_opcodes(&rsoc(false, 1, 0x9e, 0, 64)),
            Err(bad)
        );
        assert_eq!(
            report_supported_opcodes(&rsoc(false, 2, 0x28, 0, 64)),
            Err(bad)
        );
        for options in 3..8 {
            assert_eq!(
                report_supported_opcodes(&rsoc(false, options, 0, 0, 64)),
                Err(bad)
            );
        }
    }

    #[test]
    fn task_management_functions() {
        let d = report_supported_tmfs(&[0xa3, 0x0d, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0]).unwrap();
        assert_eq!(d.len(), 4);
        assert_ne!(d[0] & 0x08, 0, "LOGICAL UNIT RESET supported");
        let d = report_supported_tmfs(&[0xa3, 0x0d, 0x80, 0, 0, 0, 0, 0, 0, 255, 0, 0]).unwrap();
        assert_eq!(d.len(), 16);
    }
}
