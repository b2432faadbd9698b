//! Local files and block devices: [`LocalDevice`], a [`BlockTarget`]
//! through the server's own file engine (sync or io_uring, O_DIRECT or
//! not) so that `bench` figures for a local disk compare directly with a
//! LUN's; and [`LocalFile`], a file `cp` reads or writes at any offset
//! and length (it may be shorter than asked, grow, or hold holes).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use ethersan_backend::file::{FileDevice, FileOptions};
use ethersan_backend::{BlockDevice, IoRequest, Submission};

use crate::target::{BlockTarget, BoxFuture, Capabilities};

/// A local file or block device driven by the backend's file engine, as
/// the server drives a LUN's store.
#[derive(Debug)]
pub struct LocalDevice {
    dev: FileDevice,
    name: String,
}

impl LocalDevice {
    /// Open `path` with the engine and options the server would use.
    pub fn open(path: &Path, opts: &FileOptions) -> anyhow::Result<LocalDevice> {
        let dev = FileDevice::open(path, opts).with_context(|| path.display().to_string())?;
        Ok(LocalDevice {
            dev,
            name: path.display().to_string(),
        })
    }

    /// The I/O engine in use ("sync" or "uring").
    pub fn engine(&self) -> String {
        self.dev.engine().to_string()
    }

    /// Whether the file is open with O_DIRECT.
    pub fn is_direct(&self) -> bool {
        self.dev.is_direct()
    }

    /// One request through the engine, as the server submits a READ or
    /// WRITE: done now (page cache), pending on the ring (io_uring), or a
    /// job for the blocking pool (sync).
    async fn submit(&self, req: IoRequest) -> anyhow::Result<Vec<u8>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let r = match self.dev.submit(req, Box::new(move |r| drop(tx.send(r)))) {
            Submission::Done(r) => {
                // Done without an await: let the timer and other tasks run.
                tokio::task::yield_now().await;
                r
            }
            Submission::Pending => rx.await.context("the engine dropped a request")?,
            Submission::Blocking(job) => tokio::task::spawn_blocking(job).await?,
        };
        // The trait's buffers are vectors: a direct read's data moves to
        // the front of its allocation here (the server keeps it in place).
        Ok(r?.into_vec())
    }
}

impl BlockTarget for LocalDevice {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn file_name(&self) -> String {
        Path::new(&self.name)
            .file_name()
            .map_or_else(|| self.name.clone(), |n| n.to_string_lossy().into_owned())
    }

    fn block_size(&self) -> u64 {
        u64::from(self.dev.block_size())
    }

    fn capacity(&self) -> u64 {
        self.dev.num_blocks() * u64::from(self.dev.block_size())
    }

    fn max_transfer(&self) -> u64 {
        crate::options::DEFAULT_MAX_TRANSFER
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fua: true,
            splits: true,
            ..Capabilities::default()
        }
    }

    fn read(
        &self,
        offset: u64,
        len: usize,
        spare: Vec<u8>,
    ) -> BoxFuture<'_, anyhow::Result<Vec<u8>>> {
        // The spare buffer is reused, never zeroed.
        Box::pin(async move {
            let req = IoRequest::Read {
                offset,
                len,
                buf: spare.into(),
            };
            self.submit(req).await.context("read")
        })
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let len = data.len();
            let req = IoRequest::Write {
                offset,
                data: Vec::from(data).into(),
                len,
                fua,
            };
            self.submit(req).await.context("write")?;
            Ok(())
        })
    }

    fn flush(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            self.submit(IoRequest::Flush).await.context("flush")?;
            Ok(())
        })
    }
}

/// A local file or block device `cp` reads or writes, addressed in bytes.
#[derive(Clone, Debug)]
pub struct LocalFile {
    /// The open file.
    pub file: Arc<File>,
    /// Its size in bytes (a block device's capacity).
    pub size: u64,
    /// A regular file (can hold holes), not a device.
    pub regular: bool,
}

impl LocalFile {
    /// Open an existing file or block device for reading.
    pub fn open_read(path: &Path) -> anyhow::Result<LocalFile> {
        let file = File::open(path).with_context(|| format!("open {}", path.display()))?;
        LocalFile::from_file(file, path)
    }

    /// Open (creating or truncating a regular file) for writing.
    pub fn open_write(path: &Path, truncate: bool) -> anyhow::Result<LocalFile> {
        let is_dev = std::fs::metadata(path)
            .map(|m| !m.is_file())
            .unwrap_or(false);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(!is_dev)
            .truncate(truncate && !is_dev)
            .open(path)
            .with_context(|| format!("open {} for writing", path.display()))?;
        LocalFile::from_file(file, path)
    }

    fn from_file(file: File, path: &Path) -> anyhow::Result<LocalFile> {
        let meta = file
            .metadata()
            .with_context(|| format!("stat {}", path.display()))?;
        let regular = meta.is_file();
        let size = if regular {
            meta.len()
        } else {
            use std::io::{Seek, SeekFrom};
            (&file)
                .seek(SeekFrom::End(0))
                .with_context(|| format!("size of {}", path.display()))?
        };
        Ok(LocalFile {
            file: Arc::new(file),
            size,
            regular,
        })
    }

    /// Read up to `len` bytes at `offset` (short only at end of file).
    pub async fn read(&self, offset: u64, len: usize) -> anyhow::Result<Vec<u8>> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let mut buf = vec![0u8; len];
            let mut got = 0;
            while got < len {
                match file.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            buf.truncate(got);
            Ok(buf)
        })
        .await?
        .with_context(|| format!("read at byte {offset}"))
    }

    /// Write all of `data` at `offset`.
    pub async fn write(&self, offset: u64, data: Bytes) -> anyhow::Result<()> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || file.write_all_at(&data, offset))
            .await?
            .with_context(|| format!("write at byte {offset}"))
    }
}
