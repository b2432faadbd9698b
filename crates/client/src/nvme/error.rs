//! What can go wrong talking to an NVMe/TCP controller, each with a
//! message that says what happened; completion statuses decoded.

use std::sync::Arc;

use ethersan_nvme::host::HostError;
use ethersan_nvme::status::{Status, StatusCodeType};

/// A failure of the NVMe/TCP transport.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NvmeError {
    /// The TCP connection could not be made.
    #[error("cannot connect to the NVMe/TCP controller at {addr}: {cause}")]
    Connect {
        /// `host:port`.
        addr: String,
        /// Why (connection refused, no route…); in the message, not a
        /// source, so that a report of the error chain says it once.
        cause: Arc<std::io::Error>,
    },
    /// The controller refused or botched the connection set-up.
    #[error("the controller refused the NVMe/TCP connection set-up (ICReq/ICResp): {0}")]
    IcRefused(String),
    /// Connect failed.
    #[error("the controller refused Connect to {subnqn} as {hostnqn}: {}", describe(*status))]
    ConnectRefused {
        /// Subsystem asked for.
        subnqn: String,
        /// Host NQN connected as.
        hostnqn: String,
        /// The completion status.
        status: Status,
    },
    /// A command ended with an error status.
    #[error("{what} failed: {}", describe(*status))]
    Status {
        /// The command.
        what: String,
        /// Its status.
        status: Status,
    },
    /// The URL names a namespace the subsystem does not have.
    #[error("namespace {nsid} not found in {subnqn} (active namespaces: {active})")]
    NamespaceNotFound {
        /// NSID asked for.
        nsid: u32,
        /// Subsystem.
        subnqn: String,
        /// The active NSIDs, as text.
        active: String,
    },
    /// The controller did not become ready after CC.EN = 1.
    #[error("the controller did not become ready: {0}")]
    NotReady(String),
    /// No answer in time.
    #[error("timed out {0}")]
    Timeout(String),
    /// The connection failed (protocol error, termination request).
    #[error("NVMe/TCP connection: {0}")]
    Host(HostError),
    /// The connection ended.
    #[error("NVMe/TCP connection lost: {0}")]
    Closed(String),
}

/// A completion status as words.
pub fn describe(s: Status) -> String {
    let words = match (s.sct, s.sc) {
        (StatusCodeType::Generic, 0x00) => "success",
        (StatusCodeType::Generic, 0x01) => "invalid command opcode",
        (StatusCodeType::Generic, 0x02) => "invalid field in command",
        (StatusCodeType::Generic, 0x03) => "command ID conflict",
        (StatusCodeType::Generic, 0x04) => "data transfer error",
        (StatusCodeType::Generic, 0x06) => "internal error",
        (StatusCodeType::Generic, 0x07) => "command aborted",
        (StatusCodeType::Generic, 0x0B) => "invalid namespace or format",
        (StatusCodeType::Generic, 0x0C) => "command sequence error",
        (StatusCodeType::Generic, 0x22) => "transient transport error (data digest?)",
        (StatusCodeType::Generic, 0x80) => "LBA out of range",
        (StatusCodeType::Generic, 0x81) => "capacity exceeded",
        (StatusCodeType::Generic, 0x82) => "namespace not ready",
        (StatusCodeType::Generic, 0x83) => "reservation conflict",
        (StatusCodeType::CommandSpecific, 0x80) => "Connect: incompatible format",
        (StatusCodeType::CommandSpecific, 0x81) => "Connect: controller busy",
        (StatusCodeType::CommandSpecific, 0x82) => {
            "Connect: invalid parameters (no such subsystem NQN, or a bad controller ID)"
        }
        (StatusCodeType::CommandSpecific, 0x83) => "Connect: restart discovery",
        (StatusCodeType::CommandSpecific, 0x84) => {
            "Connect: invalid host (this host NQN is not allowed to the subsystem)"
        }
        (StatusCodeType::Media, 0x80) => "write fault",
        (StatusCodeType::Media, 0x81) => "unrecovered read error",
        (StatusCodeType::Media, 0x86) => "access denied",
        (StatusCodeType::Path, _) => "path error (ANA inaccessible or in transition)",
        _ => "",
    };
    if words.is_empty() {
        format!("status {s}")
    } else {
        format!("{words} ({s})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_in_words() {
        let e = NvmeError::ConnectRefused {
            subnqn: "nqn.s".into(),
            hostnqn: "nqn.h".into(),
            status: Status::CONNECT_INVALID_HOST,
        };
        let t = e.to_string();
        assert!(t.contains("nqn.s") && t.contains("invalid host"), "{t}");
        assert!(describe(Status::LBA_OUT_OF_RANGE).starts_with("LBA out of range"));
        assert!(describe(Status::new(StatusCodeType::Vendor, 9)).starts_with("status SCT 0x7"));
    }
}
