//! The ethersan iSCSI target server.
