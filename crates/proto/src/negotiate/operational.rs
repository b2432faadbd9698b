//! The operational keys one side offers or accepts (RFC 7143 §13.7–13.14:
//! MaxRecvDataSegmentLength, MaxBurstLength, FirstBurstLength,
//! InitialR2T, ImmediateData, MaxOutstandingR2T, HeaderDigest,
//! DataDigest): [`OperationalParams`], the one struct both
//! [`TargetSettings`](super::TargetSettings) and
//! [`InitiatorSettings`](super::InitiatorSettings) hold, and the digest
//! choices ([`Digest`]).

/// A digest choice (§13.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Digest {
    /// No digest.
    None,
    /// CRC32C.
    Crc32c,
}

impl Digest {
    /// The key value naming it: `None` or `CRC32C`.
    pub fn name(self) -> &'static str {
        match self {
            Digest::None => "None",
            Digest::Crc32c => "CRC32C",
        }
    }

    /// The digest a key value names, if it is one.
    pub fn parse(s: &str) -> Option<Digest> {
        match s {
            "None" => Some(Digest::None),
            "CRC32C" => Some(Digest::Crc32c),
            _ => None,
        }
    }

    /// A comma-separated list of digests in preference order (`None,CRC32C`),
    /// surrounding spaces allowed; unknown names are left out.
    pub fn parse_list(list: &str) -> Vec<Digest> {
        list.split(',')
            .filter_map(|d| Digest::parse(d.trim()))
            .collect()
    }

    /// A list as a key value, in the order given (`CRC32C,None`).
    pub fn list_value(list: &[Digest]) -> String {
        let names: Vec<&str> = list.iter().map(|d| d.name()).collect();
        names.join(",")
    }
}

/// The operational keys one side offers (initiator) or accepts at most
/// (target). What a login settles from them is in
/// [`SessionParams`](super::SessionParams).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationalParams {
    /// Our MaxRecvDataSegmentLength declaration.
    pub max_recv_data_segment_length: u32,
    /// MaxBurstLength: offered (initiator), largest accepted (target).
    pub max_burst_length: u32,
    /// FirstBurstLength: offered (initiator), largest accepted (target).
    pub first_burst_length: u32,
    /// InitialR2T preference (false: unsolicited data welcome).
    pub initial_r2t: bool,
    /// ImmediateData preference.
    pub immediate_data: bool,
    /// MaxOutstandingR2T: offered (initiator), largest accepted (target).
    pub max_outstanding_r2t: u32,
    /// Header digests offered or accepted, in preference order.
    pub header_digests: Vec<Digest>,
    /// Data digests offered or accepted, in preference order.
    pub data_digests: Vec<Digest>,
}

impl OperationalParams {
    /// The target's defaults: 256 KiB segments, 1 MiB bursts, a 64 KiB
    /// first burst, unsolicited and immediate data welcome, 4 R2Ts, either
    /// digest accepted (none preferred).
    pub fn target_default() -> Self {
        OperationalParams {
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1 << 20,
            first_burst_length: 65_536,
            initial_r2t: false,
            immediate_data: true,
            max_outstanding_r2t: 4,
            header_digests: vec![Digest::None, Digest::Crc32c],
            data_digests: vec![Digest::None, Digest::Crc32c],
        }
    }

    /// The initiator's defaults: as the target's, with a 256 KiB first
    /// burst offered and no digests.
    pub fn initiator_default() -> Self {
        OperationalParams {
            first_burst_length: 262_144,
            header_digests: vec![Digest::None],
            data_digests: vec![Digest::None],
            ..OperationalParams::target_default()
        }
    }

    /// Digest offer of an initiator that wants CRC32C (`on`) or not:
    /// `CRC32C,None` or `None`.
    pub fn digest_offer(on: bool) -> Vec<Digest> {
        if on {
            vec![Digest::Crc32c, Digest::None]
        } else {
            vec![Digest::None]
        }
    }
}

impl Default for OperationalParams {
    /// The target's defaults ([`target_default`](Self::target_default)).
    fn default() -> Self {
        OperationalParams::target_default()
    }
}
