//! Reads into the spare capacity of a `Vec<u8>`: the kernel writes the
//! bytes and only then does the vector's length cover them, so a read
//! buffer is never zeroed first.

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;

/// Read into `buf` until it holds `skip + len` bytes, the byte at index
/// `skip + k` coming from file offset `offset + k` (the first `skip` bytes
/// are a prefix the caller put there, e.g. to align the data; reading
/// resumes after whatever `buf` already holds past it).
///
/// With `nowait` each step is `preadv2(RWF_NOWAIT)` and an `EAGAIN` ends
/// the call with `Ok(false)`, keeping the bytes read so far. `Ok(true)`:
/// all of it is there. The end of the file before `len` bytes is
/// `UnexpectedEof`; EINTR is retried.
pub(crate) fn read_fill(
    file: &File,
    offset: u64,
    buf: &mut Vec<u8>,
    skip: usize,
    len: usize,
    nowait: bool,
) -> io::Result<bool> {
    debug_assert!(buf.len() >= skip);
    let want = skip + len;
    buf.reserve(want.saturating_sub(buf.len()));
    let flags = if nowait { libc::RWF_NOWAIT } else { 0 };
    while buf.len() < want {
        let have = buf.len();
        let spare = &mut buf.spare_capacity_mut()[..want - have];
        let iov = libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: spare.len(),
        };
        let at = offset + (have - skip) as u64;
        // SAFETY: the iovec describes `want - have` bytes of `buf`'s spare
        // capacity, which is allocated, writable and not otherwise
        // borrowed for the duration of the call; the kernel only writes
        // there. The descriptor is owned by `file` and open.
        let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, at as libc::off_t, flags) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) if nowait => return Ok(false),
                _ => return Err(e),
            }
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "failed to fill whole buffer",
            ));
        }
        // SAFETY: the kernel wrote `n` (at most `want - have`, within the
        // capacity) bytes at the start of the spare capacity, so the first
        // `have + n` bytes are initialized.
        unsafe { buf.set_len(have + n as usize) };
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn fills_past_garbage_and_stops_at_eof() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        let data: Vec<u8> = (0..10000u32).map(|i| (i * 7) as u8).collect();
        f.write_all_at(&data, 0).unwrap();
        // A reused allocation full of garbage: only file bytes come back.
        let mut buf = vec![0xee; 8192];
        let ptr = buf.as_ptr();
        buf.clear();
        assert!(read_fill(&f, 100, &mut buf, 0, 8000, false).unwrap());
        assert_eq!(buf, data[100..8100]);
        assert_eq!(buf.as_ptr(), ptr, "the allocation is reused");
        // After an aligning prefix.
        let mut b = crate::IoBuf::from(vec![0xee; 3]);
        let skip = b.reserve_aligned(4096);
        assert!(read_fill(&f, 0, b.raw_mut(), skip, 4096, false).unwrap());
        assert!(b.is_aligned());
        assert_eq!(b, data[..4096]);
        let mut buf = Vec::new();
        let e = read_fill(&f, 9000, &mut buf, 0, 2000, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
