//! The per-command rules, columns of [`COMMANDS`](super::COMMANDS): the
//! types of the columns, and the rules of each family of commands, one
//! place per family (each row of the table names one).

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
/// [`COMMANDS`](super::COMMANDS).
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
