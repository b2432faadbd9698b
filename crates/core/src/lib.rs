//! The ethersan target core: everything a SCSI target does that does not
//! depend on the transport that carries the commands.
//!
//! - [`task_set`]: the SAM-5 task set of one I_T nexus — task attributes,
//!   task management functions and their waits — as a synchronous state
//!   machine.
//! - [`directory`]: the live directory of targets and LUNs, with per-LUN
//!   access checks looked up per command, changed while sessions run.
//! - [`executor`]: the one place that runs a SCSI command (no-wait attempt,
//!   asynchronous engine, blocking fallback; a panic becomes INTERNAL
//!   TARGET FAILURE).
//! - [`counters`]: per-LUN and per-initiator counters (commands, bytes,
//!   errors by sense key, a latency histogram), cheap on the data path.
//! - [`budget`]: a per-session memory budget for command data buffers.
//!
//! No tokio in its API: front ends (iSCSI over TCP today, AoE and the
//! Ethernet transport next) drive it by plain method calls and inject how
//! blocking work is run.
#![warn(missing_docs, unreachable_pub)]

pub mod budget;
pub mod counters;
pub mod directory;
pub mod executor;
pub mod task_set;
