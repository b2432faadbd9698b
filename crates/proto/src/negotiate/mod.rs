//! RFC 7143 §6.2–6.6 and §13: login and text key negotiation.
//!
//! Every key lives in one table ([`KEYS`]) that says how it negotiates;
//! [`TargetNegotiator`] answers an initiator's keys stage by stage and
//! [`InitiatorNegotiator`] is its mirror for our initiator library. Both
//! end in the same [`SessionParams`].
//!
//! Split by seam: the key table and value parsers (`keys`), the settled
//! parameters and negotiation errors (`params`), the operational keys
//! each side offers (`operational`), the target negotiator
//! (`target`) and the initiator negotiator (`initiator`). Everything is
//! re-exported here, so paths stay `ethersan_proto::negotiate::*`.

mod initiator;
mod keys;
mod operational;
mod params;
mod target;

pub use initiator::*;
pub use keys::*;
pub use operational::*;
pub use params::*;
pub use target::*;

#[cfg(test)]
mod tests;
