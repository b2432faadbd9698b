//! See docs/native-transport.md (being written).
