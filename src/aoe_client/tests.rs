//! Tests of the AoE client.
