//! The check of a read's placed data against what its Data-In headers
//! announced.

use ethersan_endpoint::PlacedBuf;

use crate::Error;

/// Check that every byte range the Data-In headers of task `itt`
/// announced has landed in `placed`; the end of the data.
pub(super) fn check_placed(
    itt: u32,
    announced: &[(u32, u32)],
    placed: &PlacedBuf,
) -> Result<u64, Error> {
    let mut end = 0u64;
    for &(off, len) in announced {
        let (s, e) = (u64::from(off), u64::from(off) + u64::from(len));
        let covered = placed.ranges().iter().any(|&(a, b)| a <= s && e <= b);
        if !covered {
            return Err(Error::Protocol(format!(
                "task {itt:#x}: the target announced Data-In bytes {s}..{e} that never arrived (placed data missing): the read's data is incomplete"
            )));
        }
        end = end.max(e);
    }
    Ok(end)
}
