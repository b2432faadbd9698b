//! Unit tests of the initiator state: submission, window, RTO, matching.

use super::*;
