//! Unit tests of the AoE target: every command, error code and ATA path.

use super::*;
