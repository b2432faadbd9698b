//! A memory-backed block device (`ram:SIZE`): fast, volatile.

use std::sync::RwLock;

use crate::{BackendError, BlockDevice, IoBuf, IoCompletion, IoRequest, Submission};

/// Number of bytes each lock shard covers; writes to different shards run
/// in parallel.
const SHARD_BYTES: u64 = 1 << 20;

/// A block device held in memory, split into independently locked shards.
#[derive(Debug)]
pub struct RamDevice {
    shards: Vec<RwLock<Vec<u8>>>,
    block_size: u32,
    num_blocks: u64,
}

impl RamDevice {
    /// Create a zero-filled device of `size` bytes (a multiple of `block_size`).
    pub fn new(size: u64, block_size: u32) -> Result<Self, BackendError> {
        if block_size != 512 && block_size != 4096 {
            return Err(BackendError::Config(format!(
                "block size {block_size} is not 512 or 4096"
            )));
        }
        if size == 0 || !size.is_multiple_of(u64::from(block_size)) {
            return Err(BackendError::Config(format!(
                "size {size} is not a positive multiple of the block size {block_size}"
            )));
        }
        let mut shards = Vec::new();
        let mut left = size;
        while left > 0 {
            let n = left.min(SHARD_BYTES);
            shards.push(RwLock::new(vec![0u8; n as usize]));
            left -= n;
        }
        Ok(RamDevice {
            shards,
            block_size,
            num_blocks: size / u64::from(block_size),
        })
    }

    /// Visit the shard pieces covering `[offset, offset+len)`.
    fn for_each_piece(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(usize, usize, usize, usize),
    ) {
        let mut done = 0usize;
        while done < len {
            let pos = offset + done as u64;
            let shard = (pos / SHARD_BYTES) as usize;
            let within = (pos % SHARD_BYTES) as usize;
            let n = (len - done).min(SHARD_BYTES as usize - within);
            f(shard, within, done, n);
            done += n;
        }
    }

    /// Copy `len` bytes at `offset` into `buf` (cleared first; its
    /// allocation is reused, never zeroed).
    fn read(&self, offset: u64, len: usize, mut buf: IoBuf) -> Result<IoBuf, BackendError> {
        self.check(offset, len)?;
        buf.reserve_plain(len);
        let v = buf.raw_mut();
        self.for_each_piece(offset, len, |shard, within, _, n| {
            let data = self.shards[shard].read().unwrap_or_else(|e| e.into_inner());
            v.extend_from_slice(&data[within..within + n]);
        });
        Ok(buf)
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BackendError> {
        self.check(offset, buf.len())?;
        self.for_each_piece(offset, buf.len(), |shard, within, done, n| {
            let mut data = self.shards[shard]
                .write()
                .unwrap_or_else(|e| e.into_inner());
            data[within..within + n].copy_from_slice(&buf[done..done + n]);
        });
        Ok(())
    }

    fn check(&self, offset: u64, len: usize) -> Result<(), BackendError> {
        let end = offset.checked_add(len as u64);
        match end {
            Some(end) if end <= self.num_blocks * u64::from(self.block_size) => Ok(()),
            _ => Err(BackendError::Config(format!(
                "access at {offset}+{len} beyond the end of the device"
            ))),
        }
    }
}

impl BlockDevice for RamDevice {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.num_blocks
    }
    /// Always [`Submission::Done`]: memory never waits.
    fn submit(&self, req: IoRequest, _done: IoCompletion) -> Submission {
        Submission::Done(match req {
            IoRequest::Read { offset, len, buf } => self.read(offset, len, buf),
            IoRequest::Write {
                offset, data, len, ..
            } => self
                .write(offset, &data[..len.min(data.len())])
                .map(|()| IoBuf::new()),
            IoRequest::Flush => Ok(IoBuf::new()),
        })
    }
    fn is_persistent(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        format!(
            "ram ({} bytes)",
            self.num_blocks * u64::from(self.block_size)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockDeviceExt;

    #[test]
    fn every_request_completes_inline_without_a_completion() {
        let dev = RamDevice::new(1 << 20, 512).unwrap();
        let never = || -> IoCompletion { Box::new(|_| panic!("completion called")) };
        let w = IoRequest::Write {
            offset: 512,
            data: vec![3; 2048].into(),
            len: 1024,
            fua: true,
        };
        assert!(matches!(dev.submit(w, never()), Submission::Done(Ok(v)) if v.is_empty()));
        // A reused buffer full of garbage comes back with the medium's bytes.
        let garbage = vec![0xee; 4096];
        let ptr = garbage.as_ptr();
        let r = IoRequest::Read {
            offset: 0,
            len: 2048,
            buf: garbage.into(),
        };
        match dev.submit(r, never()) {
            Submission::Done(Ok(v)) => {
                assert_eq!(v.as_ptr(), ptr);
                assert_eq!(v[..512], [0; 512]);
                assert_eq!(v[512..1536], [3; 1024]);
                assert_eq!(v[1536..], [0; 512]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            dev.submit(IoRequest::Flush, never()),
            Submission::Done(Ok(_))
        ));
        assert!(matches!(
            dev.submit(IoRequest::read(1 << 20, 512), never()),
            Submission::Done(Err(BackendError::Config(_)))
        ));
    }

    #[test]
    fn write_then_read_across_shards() {
        let dev = RamDevice::new(3 * SHARD_BYTES, 512).unwrap();
        let data: Vec<u8> = (0..(SHARD_BYTES as usize + 1024))
            .map(|i| (i % 251) as u8)
            .collect();
        let off = SHARD_BYTES - 512;
        dev.write_at(off, &data, false).unwrap();
        let mut back = vec![0u8; data.len()];
        dev.read_at(off, &mut back).unwrap();
        assert_eq!(back, data);
        assert!(dev
            .read_at(3 * SHARD_BYTES - 512, &mut [0u8; 1024])
            .is_err());
    }

    #[test]
    fn rejects_bad_geometry() {
        assert!(RamDevice::new(1000, 512).is_err());
        assert!(RamDevice::new(4096, 1024).is_err());
    }
}
