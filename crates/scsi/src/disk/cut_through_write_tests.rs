//! Tests of cut-through WRITE (see `cut_through_write`).
