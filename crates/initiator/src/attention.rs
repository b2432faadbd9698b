//! Unit attentions on the initiator side (SAM-5 §5.14, SPC-4 §5.14): a
//! command answered CHECK CONDITION with sense key UNIT ATTENTION was not
//! executed, so it is sent again, a bounded number of times, as the Linux
//! SCSI midlayer does (`scsi_decide_disposition`: NEEDS_RETRY while the
//! command's retries last). What the target wanted to say (its capacity
//! changed, its LUN inventory changed, a reset) is handed back to the
//! caller, who re-reads what it keeps ([`Attended::attentions`]).
//!
//! The retry loop takes the command as a closure and runs no I/O of its
//! own, so its rules are unit tested without a target.

use std::future::Future;

use crate::{CommandResult, Error};

/// How often one command is sent again after a unit attention. Linux's sd
/// allows 5 retries per command (`SD_MAX_RETRIES`); a target that keeps
/// raising unit attentions past that has a problem a retry will not fix.
pub const UA_RETRIES: u32 = 5;

/// What a unit attention reported (sense key 6, by ASC/ASCQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnitAttention {
    /// 29/xx POWER ON, RESET, OR BUS DEVICE RESET OCCURRED (and the other
    /// reset codes): the LUN's state (reservations, mode pages) may be new.
    Reset {
        /// ASCQ: which reset.
        ascq: u8,
    },
    /// 2A/09 CAPACITY DATA HAS CHANGED: read the capacity again.
    CapacityChanged,
    /// 3F/0E REPORTED LUNS DATA HAS CHANGED: read the LUN list again.
    LunsChanged,
    /// 2A/01 MODE PARAMETERS CHANGED.
    ModeParametersChanged,
    /// Any other unit attention.
    Other {
        /// Additional sense code.
        asc: u8,
        /// Its qualifier.
        ascq: u8,
    },
}

impl UnitAttention {
    /// The unit attention `r` reports, if it is one (CHECK CONDITION,
    /// sense key UNIT ATTENTION).
    pub fn of(r: &CommandResult) -> Option<UnitAttention> {
        if r.status != 0x02 {
            return None;
        }
        let (key, asc, ascq) = r.sense_key()?;
        if key != 0x6 {
            return None;
        }
        Some(match (asc, ascq) {
            (0x29, q) => UnitAttention::Reset { ascq: q },
            (0x2a, 0x09) => UnitAttention::CapacityChanged,
            (0x3f, 0x0e) => UnitAttention::LunsChanged,
            (0x2a, 0x01) => UnitAttention::ModeParametersChanged,
            (asc, ascq) => UnitAttention::Other { asc, ascq },
        })
    }
}

impl std::fmt::Display for UnitAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnitAttention::Reset { ascq } => {
                write!(
                    f,
                    "POWER ON, RESET, OR BUS DEVICE RESET OCCURRED (29/{ascq:02X})"
                )
            }
            UnitAttention::CapacityChanged => f.write_str("CAPACITY DATA HAS CHANGED (2A/09)"),
            UnitAttention::LunsChanged => f.write_str("REPORTED LUNS DATA HAS CHANGED (3F/0E)"),
            UnitAttention::ModeParametersChanged => f.write_str("MODE PARAMETERS CHANGED (2A/01)"),
            UnitAttention::Other { asc, ascq } => {
                write!(f, "UNIT ATTENTION (ASC {asc:#04x} ASCQ {ascq:#04x})")
            }
        }
    }
}

/// A command's final answer and the unit attentions it met on the way.
#[derive(Debug, Clone, Default)]
pub struct Attended {
    /// The last answer: not a unit attention, unless the retries ran out.
    pub result: CommandResult,
    /// The unit attentions the command was answered with before, in order.
    pub attentions: Vec<UnitAttention>,
}

/// Run `send` (one command) until it is answered with something other
/// than a unit attention, at most [`UA_RETRIES`] more times. A unit
/// attention means the command was not executed (SAM-5 §5.14), so sending
/// it again is safe whatever it does. Transport errors end the loop.
pub async fn through_attentions<F, Fut>(mut send: F) -> Result<Attended, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<CommandResult, Error>>,
{
    let mut attentions = Vec::new();
    loop {
        let result = send().await?;
        match UnitAttention::of(&result) {
            Some(ua) if attentions.len() < UA_RETRIES as usize => attentions.push(ua),
            _ => return Ok(Attended { result, attentions }),
        }
    }
}

impl crate::Session {
    /// Run one SCSI command as [`Session::command`](crate::Session::command)
    /// does, sending it again while it is answered with a unit attention
    /// (see [`through_attentions`]).
    pub async fn command_attended(
        &self,
        lun: u64,
        cdb: &[u8],
        data_out: bytes::Bytes,
        read_len: u32,
    ) -> Result<Attended, Error> {
        through_attentions(|| self.command(lun, cdb, data_out.clone(), read_len)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(key: u8, asc: u8, ascq: u8) -> CommandResult {
        let mut sense = vec![0u8; 18];
        sense[0] = 0x70;
        sense[2] = key;
        sense[7] = 10;
        sense[12] = asc;
        sense[13] = ascq;
        CommandResult {
            status: 0x02,
            sense,
            ..Default::default()
        }
    }

    #[test]
    fn unit_attentions_are_told_apart_by_their_codes() {
        assert_eq!(
            UnitAttention::of(&check(6, 0x3f, 0x0e)),
            Some(UnitAttention::LunsChanged)
        );
        assert_eq!(
            UnitAttention::of(&check(6, 0x2a, 0x09)),
            Some(UnitAttention::CapacityChanged)
        );
        assert_eq!(
            UnitAttention::of(&check(6, 0x29, 0x00)),
            Some(UnitAttention::Reset { ascq: 0 })
        );
        assert_eq!(
            UnitAttention::of(&check(6, 0x2a, 0x01)),
            Some(UnitAttention::ModeParametersChanged)
        );
        assert_eq!(
            UnitAttention::of(&check(6, 0x2a, 0x06)),
            Some(UnitAttention::Other {
                asc: 0x2a,
                ascq: 0x06
            })
        );
        // Not unit attentions: another sense key, GOOD, no sense.
        assert_eq!(UnitAttention::of(&check(5, 0x25, 0)), None);
        assert_eq!(UnitAttention::of(&CommandResult::default()), None);
        let mut busy = check(6, 0x29, 0);
        busy.status = 0x08;
        assert_eq!(UnitAttention::of(&busy), None);
    }

    fn answers(
        mut script: Vec<Result<CommandResult, Error>>,
    ) -> (
        std::sync::Arc<std::sync::atomic::AtomicU32>,
        impl FnMut() -> std::future::Ready<Result<CommandResult, Error>>,
    ) {
        script.reverse();
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let s = sent.clone();
        let send = move || {
            s.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::future::ready(script.pop().unwrap_or_else(|| Ok(CommandResult::default())))
        };
        (sent, send)
    }

    #[tokio::test]
    async fn a_command_is_sent_again_after_each_unit_attention_and_they_are_reported() {
        let (sent, send) = answers(vec![
            Ok(check(6, 0x3f, 0x0e)),
            Ok(check(6, 0x2a, 0x09)),
            Ok(CommandResult::default()),
        ]);
        let a = through_attentions(send).await.unwrap();
        assert_eq!(a.result.status, 0);
        assert_eq!(
            a.attentions,
            vec![UnitAttention::LunsChanged, UnitAttention::CapacityChanged]
        );
        assert_eq!(sent.load(std::sync::atomic::Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn retries_are_bounded_and_the_last_unit_attention_is_the_answer() {
        let (sent, send) = answers((0..20).map(|_| Ok(check(6, 0x29, 0))).collect());
        let a = through_attentions(send).await.unwrap();
        assert_eq!(
            sent.load(std::sync::atomic::Ordering::Relaxed),
            UA_RETRIES + 1
        );
        assert_eq!(a.attentions.len(), UA_RETRIES as usize);
        assert_eq!(
            UnitAttention::of(&a.result),
            Some(UnitAttention::Reset { ascq: 0 })
        );
    }

    #[tokio::test]
    async fn other_errors_are_not_retried() {
        let (sent, send) = answers(vec![Ok(check(5, 0x21, 0))]);
        let a = through_attentions(send).await.unwrap();
        assert!(a.attentions.is_empty());
        assert_eq!(a.result.sense_key(), Some((5, 0x21, 0)));
        assert_eq!(sent.load(std::sync::atomic::Ordering::Relaxed), 1);
        let (sent, send) = answers(vec![Err(Error::Closed)]);
        assert!(matches!(through_attentions(send).await, Err(Error::Closed)));
        assert_eq!(sent.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
