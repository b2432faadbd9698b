//! The iSCSI transport: a LUN over an iSCSI session, over TCP
//! (`iscsi://`) or ethersan's native transport (`eth://`, `udp://`, the
//! stream from [`crate::native`]).
//!
//! - [`login`]: the login a URL names, and its errors with what to do;
//! - [`Lun`]: one LUN over one session, and its one command path (a
//!   command answered with a unit attention is sent again, what the
//!   attention says is acted on: `ethersan_initiator::attention`);
//! - [`RetryingLun`]: a LUN whose commands survive a lost session;
//! - [`luns`]: the target's LUN list.
//!
//! [`IscsiLun`] and [`RetryingLun`] are the [`BlockTarget`]s the
//! dispatch hands out (without and with retries).

mod login;
mod lun;
pub mod luns;
mod retry;

use bytes::Bytes;

pub use login::{is_iscsi_url, login, login_error, LoggedIn};
pub use lun::{Known, Lun};
pub use retry::RetryingLun;

use crate::options::ConnectArgs;
use crate::target::{BlockTarget, BoxFuture, Capabilities, OpenOptions, Say};
use crate::url::IscsiUrl;

/// The iSCSI transport: `iscsi://`, `eth://` and `udp://` URLs.
pub static TRANSPORT: crate::target::Transport = crate::target::Transport {
    name: "iscsi",
    schemes: &["iscsi://", "eth://", "udp://"],
    forms: "iscsi://[USER%SECRET@]HOST[:PORT]/IQN/LUN, \
         eth://IFACE/IQN/LUN, udp://HOST[:PORT]/IQN/LUN",
    open: open_target,
};

/// The dispatch's entry: log in and learn the LUN's geometry.
fn open_target<'a>(
    spec: &'a str,
    how: &'a ConnectArgs,
    opts: &'a OpenOptions,
) -> BoxFuture<'a, anyhow::Result<Box<dyn BlockTarget>>> {
    Box::pin(async move {
        let url = IscsiUrl::parse(spec)?;
        Ok(if opts.retry {
            Box::new(
                RetryingLun::open(&url, how)
                    .await?
                    .said_by(opts.program)
                    .within(opts.reconnect),
            ) as Box<dyn BlockTarget>
        } else {
            Box::new(IscsiLun::open(&url, how).await?)
        })
    })
}

/// A LUN over one session, commands not retried (what `bench` measures);
/// it can open more sessions to the same LUN, which share what unit
/// attentions teach.
#[derive(Debug)]
pub struct IscsiLun {
    lun: Lun,
    url: IscsiUrl,
    how: ConnectArgs,
}

impl IscsiLun {
    /// Log in and learn the LUN's geometry.
    pub async fn open(url: &IscsiUrl, how: &ConnectArgs) -> anyhow::Result<IscsiLun> {
        Ok(IscsiLun {
            lun: Lun::open(url, how).await?,
            url: url.clone(),
            how: how.clone(),
        })
    }

    /// The LUN.
    pub fn lun(&self) -> &Lun {
        &self.lun
    }
}

/// What a LUN over iSCSI can do.
fn capabilities(lun: &Lun) -> Capabilities {
    Capabilities {
        fua: true,
        write_zeroes: true,
        unmap: lun.zeros_after_unmap,
        splits: false,
        sessions: true,
        logout: true,
    }
}

/// Zero `len` bytes at `at` with WRITE SAME (16) of at most `step` bytes
/// each (`same`: one such command, false when the target has none), and
/// with written zeros from where the target has no WRITE SAME.
async fn zero_range<T, F, Fut>(t: &T, step: u64, at: u64, len: u64, same: F) -> anyhow::Result<()>
where
    T: BlockTarget + ?Sized,
    F: Fn(u64, u64) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let mut done = 0;
    while done < len {
        let n = (len - done).min(step);
        if !same(at + done, n).await? {
            break;
        }
        done += n;
    }
    if done == len {
        return Ok(());
    }
    crate::target::write_zero_buffers(t, at + done, len - done).await
}

impl BlockTarget for IscsiLun {
    fn name(&self) -> String {
        format!("LUN {}", self.lun.lun)
    }

    fn file_name(&self) -> String {
        format!("lun{}", self.lun.lun)
    }

    fn block_size(&self) -> u64 {
        u64::from(self.lun.block_size)
    }

    fn capacity(&self) -> u64 {
        self.lun.capacity()
    }

    fn max_transfer(&self) -> u64 {
        self.lun.max_transfer
    }

    fn capabilities(&self) -> Capabilities {
        capabilities(&self.lun)
    }

    fn read(&self, offset: u64, len: usize, _: Vec<u8>) -> BoxFuture<'_, anyhow::Result<Vec<u8>>> {
        Box::pin(self.lun.read(offset, len))
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.lun.write(offset, data, fua))
    }

    fn flush(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.lun.flush())
    }

    fn write_zeroes(&self, at: u64, len: u64, unmap: bool) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(zero_range(
            self,
            self.lun.max_write_same,
            at,
            len,
            move |a, n| self.lun.write_zeroes(a, n, unmap),
        ))
    }

    fn another_session(&self) -> BoxFuture<'_, anyhow::Result<Box<dyn BlockTarget>>> {
        Box::pin(async move {
            let logged = login(&self.url, &self.how).await?;
            let lun = Lun::on_known(logged, self.url.lun, self.lun.known()).await?;
            Ok(Box::new(IscsiLun {
                lun,
                url: self.url.clone(),
                how: self.how.clone(),
            }) as Box<dyn BlockTarget>)
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = self.lun.session.logout().await;
        })
    }
}

impl BlockTarget for RetryingLun {
    fn name(&self) -> String {
        format!("LUN {}", self.lun().lun)
    }

    fn file_name(&self) -> String {
        format!("lun{}", self.lun().lun)
    }

    fn block_size(&self) -> u64 {
        u64::from(self.lun().block_size)
    }

    fn capacity(&self) -> u64 {
        self.lun().capacity()
    }

    fn max_transfer(&self) -> u64 {
        self.lun().max_transfer
    }

    fn capabilities(&self) -> Capabilities {
        capabilities(&self.lun())
    }

    fn read(&self, offset: u64, len: usize, _: Vec<u8>) -> BoxFuture<'_, anyhow::Result<Vec<u8>>> {
        Box::pin(RetryingLun::read(self, offset, len))
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(RetryingLun::write(self, offset, data, fua))
    }

    fn flush(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(RetryingLun::flush(self))
    }

    fn write_zeroes(&self, at: u64, len: u64, unmap: bool) -> BoxFuture<'_, anyhow::Result<()>> {
        let step = self.lun().max_write_same;
        Box::pin(zero_range(self, step, at, len, move |a, n| {
            RetryingLun::write_zeroes(self, a, n, unmap)
        }))
    }

    fn another_session(&self) -> BoxFuture<'_, anyhow::Result<Box<dyn BlockTarget>>> {
        Box::pin(async move { Ok(Box::new(self.another().await?) as Box<dyn BlockTarget>) })
    }

    fn set_say(&self, say: Say) {
        RetryingLun::set_say(self, say);
    }

    fn retries(&self) -> (u64, u64) {
        RetryingLun::retries(self)
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.logout())
    }
}
