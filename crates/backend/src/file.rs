//! Regular files and block devices as logical units (positional I/O).
