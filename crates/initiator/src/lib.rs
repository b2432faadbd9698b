//! An iSCSI initiator library.
