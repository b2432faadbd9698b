//! A LUN whose commands survive a lost session: reads, whole-block writes
//! and WRITE SAME are sent again on a new session when a command times
//! out or the connection is lost (at most [`RETRIES`] times); a cache
//! flush is not (see [`RetryingLun::flush`]).

use bytes::Bytes;

use super::login::login;
use super::lun::Lun;
use crate::options::ConnectArgs;
use crate::target::Say;
use crate::url::IscsiUrl;

/// How often a command that lost its session is tried again, each time on
/// a new session (without a reconnect window).
const RETRIES: u32 = 3;

/// With a reconnect window, once it has passed: how often a command may
/// try one login before failing at once.
const DOWN_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// With the target marked down: the longest that one login may take.
const DOWN_LOGIN: std::time::Duration = std::time::Duration::from_secs(5);

/// A LUN whose reads and whole-block writes are retried on a new session
/// when a command times out or the connection is lost: each of them can be
/// repeated without changing the outcome (a write sends the same bytes to
/// the same blocks again). A cache flush is not (see
/// [`RetryingLun::flush`]). Used by `cp` and `attach`.
pub struct RetryingLun {
    url: IscsiUrl,
    how: ConnectArgs,
    /// The current session's LUN and its generation (bumped per new session).
    current: std::sync::Mutex<(u64, Lun)>,
    /// One new login at a time.
    relogin: tokio::sync::Mutex<()>,
    /// Commands retried, and new sessions opened for them.
    retried: std::sync::atomic::AtomicU64,
    sessions: std::sync::atomic::AtomicU64,
    /// Where to say what happened (above a progress bar when there is
    /// one); standard error when not set.
    say: std::sync::Mutex<Option<Say>>,
    /// What starts those lines ("ethersan cp").
    program: &'static str,
    /// How long a lost target is waited for ([`RetryingLun::within`]);
    /// `None`: [`RETRIES`] immediate tries.
    window: Option<std::time::Duration>,
    /// When the last reconnect window ran out without a session (the
    /// target is down); cleared by the next login.
    down: std::sync::Mutex<Option<std::time::Instant>>,
}

impl std::fmt::Debug for RetryingLun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryingLun")
            .field("target", &self.url.target)
            .field("lun", &self.url.lun)
            .field("program", &self.program)
            .finish_non_exhaustive()
    }
}

impl RetryingLun {
    /// Log in and learn the LUN's geometry.
    pub async fn open(url: &IscsiUrl, how: &ConnectArgs) -> anyhow::Result<RetryingLun> {
        let lun = Lun::open(url, how).await?;
        Ok(RetryingLun::over(url, how, lun))
    }

    /// `lun` (a session already logged in) with the defaults: `cp`'s
    /// name in messages, [`RETRIES`] immediate tries, standard error.
    fn over(url: &IscsiUrl, how: &ConnectArgs, lun: Lun) -> RetryingLun {
        RetryingLun {
            url: url.clone(),
            how: how.clone(),
            current: std::sync::Mutex::new((0, lun)),
            relogin: tokio::sync::Mutex::new(()),
            retried: 0.into(),
            sessions: 0.into(),
            say: std::sync::Mutex::new(None),
            program: "ethersan cp",
            window: None,
            down: std::sync::Mutex::new(None),
        }
    }

    /// Wait up to `window` for a lost target (new logins tried all the
    /// while, with a growing pause) before a command fails, and retry a
    /// cache flush on the new session too (see [`RetryingLun::flush`]):
    /// the block device's replacement timeout.
    pub fn within(mut self, window: Option<std::time::Duration>) -> RetryingLun {
        self.window = window;
        self
    }

    /// Another session to the same LUN, with the same retry policy, name
    /// and place to say things.
    pub async fn another(&self) -> anyhow::Result<RetryingLun> {
        let logged = login(&self.url, &self.how).await?;
        let lun = Lun::on_known(logged, self.url.lun, self.lun().known()).await?;
        let other = RetryingLun::over(&self.url, &self.how, lun)
            .said_by(self.program)
            .within(self.window);
        if let Some(say) = self.say.lock().expect("not poisoned").clone() {
            other.set_say(say);
        }
        Ok(other)
    }

    /// Start the lines said when a session is replaced with `program`.
    pub fn said_by(mut self, program: &'static str) -> RetryingLun {
        self.program = program;
        self
    }

    /// The LUN as of now (its block size does not change between sessions;
    /// its capacity follows CAPACITY DATA HAS CHANGED, shared by them all).
    pub fn lun(&self) -> Lun {
        self.current.lock().expect("not poisoned").1.clone()
    }

    /// (commands retried, new sessions opened) so far.
    pub fn retries(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.retried.load(Relaxed), self.sessions.load(Relaxed))
    }

    /// Say what happened from now on through `say`.
    pub fn set_say(&self, say: Say) {
        *self.say.lock().expect("not poisoned") = Some(say);
    }

    fn say(&self, msg: &str) {
        match &*self.say.lock().expect("not poisoned") {
            Some(say) => say(msg),
            None => crate::target::say_on_stderr(msg),
        }
    }

    /// Run `op` on the current session; when the session fails (timeout,
    /// connection lost), log in again and run it again: up to [`RETRIES`]
    /// times, or for as long as the reconnect window allows
    /// ([`RetryingLun::within`]).
    async fn run<T, F, Fut>(&self, what: &str, op: F) -> anyhow::Result<T>
    where
        F: Fn(Lun) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<T>>,
    {
        let mut tries = 0;
        // Set when this command first lost its session.
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            let (generation, lun) = self.current.lock().expect("not poisoned").clone();
            let err = match op(lun).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let failed = err
                .downcast_ref::<ethersan_initiator::Error>()
                .is_some_and(|e| e.is_session_failure());
            let give_up = match self.window {
                None => tries == RETRIES,
                Some(w) => {
                    let d = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + w);
                    tokio::time::Instant::now() >= d
                }
            };
            if !failed || give_up {
                return Err(if tries > 0 {
                    err.context(format!(
                        "{what} failed after {tries} retries on new sessions"
                    ))
                } else {
                    err
                });
            }
            tries += 1;
            self.retried
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.renew(generation, &err, deadline).await?;
        }
    }

    /// A new session in place of generation `generation`, unless another
    /// command has already replaced it: [`RETRIES`] logins at once, or
    /// logins with a growing pause until `deadline`. Past a deadline the
    /// target is marked down: until a login succeeds again, each command
    /// tries one login (at most one a second) and fails at once.
    async fn renew(
        &self,
        generation: u64,
        why: &anyhow::Error,
        deadline: Option<tokio::time::Instant>,
    ) -> anyhow::Result<()> {
        let _one = self.relogin.lock().await;
        let old = {
            let cur = self.current.lock().expect("not poisoned");
            if cur.0 != generation {
                return Ok(());
            }
            cur.1.clone()
        };
        old.session.abandon();
        let down = *self.down.lock().expect("not poisoned");
        let (tries, deadline) = match (deadline, down) {
            (None, _) => {
                self.say(&format!(
                    "{}: {why:#}; logging in again to retry",
                    self.program
                ));
                (RETRIES, None)
            }
            (Some(_), Some(last)) => {
                if last.elapsed() < DOWN_RETRY {
                    anyhow::bail!(
                        "{why:#}; the target has been unreachable for longer than the reconnect timeout"
                    );
                }
                // One login, bounded: a host that drops packets must not
                // hold the commands queued behind it for a whole --timeout.
                (1, Some(tokio::time::Instant::now() + DOWN_LOGIN))
            }
            (Some(d), None) => {
                self.say(&format!(
                    "{}: {why:#}; logging in again (for up to {:.0} s)",
                    self.program,
                    d.saturating_duration_since(tokio::time::Instant::now())
                        .as_secs_f64()
                ));
                (u32::MAX, Some(d))
            }
        };
        let mut last = None;
        let mut pause = std::time::Duration::from_millis(100);
        for attempt in 0..tries {
            if attempt > 0 {
                if let Some(d) = deadline {
                    let now = tokio::time::Instant::now();
                    if now >= d {
                        break;
                    }
                    tokio::time::sleep(pause.min(d - now)).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(2));
                    // No login begun at the deadline: it would be cut at
                    // once, its "no login before the reconnect timeout"
                    // hiding why the last real one failed.
                    if tokio::time::Instant::now() >= d {
                        break;
                    }
                }
            }
            let login_once = async {
                match login(&self.url, &self.how).await {
                    Ok(logged) => Lun::on_known(logged, self.url.lun, old.known()).await,
                    Err(e) => Err(e),
                }
            };
            let opened = match deadline {
                Some(d) => match tokio::time::timeout_at(d, login_once).await {
                    Ok(r) => r,
                    Err(_) => Err(anyhow::anyhow!("no login before the reconnect timeout")),
                },
                None => login_once.await,
            };
            match opened {
                Ok(lun) => {
                    self.sessions
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    *self.current.lock().expect("not poisoned") = (generation + 1, lun);
                    if self.down.lock().expect("not poisoned").take().is_some()
                        || deadline.is_some()
                    {
                        self.say(&format!("{}: logged in again", self.program));
                    }
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        if self.window.is_some() {
            *self.down.lock().expect("not poisoned") = Some(std::time::Instant::now());
        }
        let last = last.unwrap_or_else(|| anyhow::anyhow!("no login before the reconnect timeout"));
        Err(last.context(format!("{why:#}, and logging in again failed")))
    }

    /// Read `len` bytes at `offset` (both block-aligned).
    pub async fn read(&self, offset: u64, len: usize) -> anyhow::Result<Vec<u8>> {
        self.run("read", |l| async move { l.read(offset, len).await })
            .await
    }

    /// Write `data` at `offset` (both block-aligned).
    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> anyhow::Result<()> {
        self.run("write", |l| {
            let data = data.clone();
            async move { l.write(offset, data, fua).await }
        })
        .await
    }

    /// Zero `len` bytes at `offset` (see [`Lun::write_zeroes`]); false
    /// when the target has no WRITE SAME (16). Repeatable like a write.
    pub async fn write_zeroes(&self, offset: u64, len: u64, unmap: bool) -> anyhow::Result<bool> {
        self.run("write same", |l| async move {
            l.write_zeroes(offset, len, unmap).await
        })
        .await
    }

    /// SYNCHRONIZE CACHE over the whole LUN. Without a reconnect window
    /// it is not repeated on a new session: writes the old session had
    /// acknowledged but the target had not yet made durable may be gone
    /// with it, and a flush on the new session would report them durable.
    /// With one (the block device) it is, as the kernel's own iSCSI
    /// initiator does after a session recovery: a target process that
    /// restarted kept what it acknowledged in its host's page cache or on
    /// disk; only a target host that lost power can have lost them, and
    /// no SCSI status tells a new session that.
    pub async fn flush(&self) -> anyhow::Result<()> {
        if self.window.is_some() {
            return self
                .run("synchronize cache", |l| async move { l.flush().await })
                .await;
        }
        let lun = self.lun();
        lun.flush().await.map_err(|e| {
            let lost = e
                .downcast_ref::<ethersan_initiator::Error>()
                .is_some_and(|e| e.is_session_failure());
            if lost {
                e.context("SYNCHRONIZE CACHE lost its session, so the copy's durability is unknown: run cp --sync again")
            } else {
                e
            }
        })
    }

    /// Log out of the current session.
    pub async fn logout(&self) {
        let _ = self.lun().session.logout().await;
    }
}
