//! One NVMe/TCP connection (one queue pair) driven by tokio over the
//! sans-I/O [`Host`]: a reader task feeds received bytes to the host and
//! answers the waiting commands, a writer task sends what the host queues
//! (capsules, H2CData for R2Ts) in order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ethersan_nvme::host::{Completed, Host, HostConfig, HostEvent, Request};
use ethersan_nvme::pdu::IcResp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

use super::error::NvmeError;

type Waiter = oneshot::Sender<Result<Completed, NvmeError>>;

#[derive(Debug)]
struct State {
    host: Host,
    waiters: HashMap<u16, Waiter>,
    /// Why the connection ended, once it has.
    dead: Option<NvmeError>,
}

/// One queue pair over its TCP connection.
#[derive(Debug)]
pub struct QueueConn {
    state: Arc<Mutex<State>>,
    send: mpsc::UnboundedSender<Vec<u8>>,
    slots: Semaphore,
    timeout: Option<Duration>,
    ic: IcResp,
    tasks: [JoinHandle<()>; 2],
}

impl Drop for QueueConn {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn within<T>(
    timeout: Option<Duration>,
    what: &str,
    f: impl std::future::Future<Output = T>,
) -> Result<T, NvmeError> {
    match timeout {
        Some(t) => tokio::time::timeout(t, f)
            .await
            .map_err(|_| NvmeError::Timeout(what.to_string())),
        None => Ok(f.await),
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl QueueConn {
    /// Connects to `addr`, exchanges ICReq/ICResp; `depth` commands may be
    /// in flight at once; `timeout` bounds the connection set-up and each
    /// command.
    pub async fn connect(
        addr: &str,
        config: HostConfig,
        depth: usize,
        timeout: Option<Duration>,
    ) -> Result<QueueConn, NvmeError> {
        let connect_err = |e: std::io::Error| NvmeError::Connect {
            addr: addr.to_string(),
            cause: Arc::new(e),
        };
        let mut stream = within(timeout, "connecting", TcpStream::connect(addr))
            .await?
            .map_err(connect_err)?;
        let _ = stream.set_nodelay(true);
        let mut host = Host::new(config);
        let mut out = Vec::new();
        host.poll_transmit(&mut out);
        // Past the TCP connect, a failure is the set-up's: a controller that
        // closes at once makes the ICReq's write or the read fail (reset,
        // broken pipe) as often as it makes the read see the end.
        let setup_err = |e: std::io::Error| {
            NvmeError::IcRefused(format!("the connection failed before the ICResp: {e}"))
        };
        stream.write_all(&out).await.map_err(setup_err)?;
        let mut buf = Vec::with_capacity(256);
        let ic = within(timeout, "waiting for the ICResp", async {
            loop {
                match host.receive(&buf) {
                    Ok(Some(r)) => match r.event {
                        Some(HostEvent::Connected(ic)) => {
                            buf.drain(..r.consumed);
                            return Ok(ic);
                        }
                        _ => return Err(NvmeError::IcRefused("no ICResp".into())),
                    },
                    Ok(None) => {}
                    Err(e) => return Err(NvmeError::IcRefused(e.to_string())),
                }
                let n = stream.read_buf(&mut buf).await.map_err(setup_err)?;
                if n == 0 {
                    return Err(NvmeError::IcRefused(
                        "the controller closed the connection instead of answering ICReq".into(),
                    ));
                }
            }
        })
        .await??;
        let (mut rd, mut wr) = stream.into_split();
        let state = Arc::new(Mutex::new(State {
            host,
            waiters: HashMap::new(),
            dead: None,
        }));
        let (send, mut to_send) = mpsc::unbounded_channel::<Vec<u8>>();
        let writer_state = state.clone();
        let writer = tokio::spawn(async move {
            while let Some(b) = to_send.recv().await {
                if let Err(e) = wr.write_all(&b).await {
                    fail_all(&writer_state, NvmeError::Closed(format!("send: {e}")));
                    return;
                }
            }
        });
        let reader_state = state.clone();
        let reader_send = send.clone();
        let reader = tokio::spawn(async move {
            let why = loop {
                let n = match rd.read_buf(&mut buf).await {
                    Ok(0) => {
                        break NvmeError::Closed("the controller closed the connection".into())
                    }
                    Ok(n) => n,
                    Err(e) => break NvmeError::Closed(format!("receive: {e}")),
                };
                let _ = n;
                if let Err(e) = deliver(&reader_state, &mut buf, &reader_send) {
                    break e;
                }
                if buf.capacity() - buf.len() < 64 * 1024 {
                    buf.reserve(256 * 1024);
                }
            };
            fail_all(&reader_state, why);
        });
        Ok(QueueConn {
            state,
            send,
            slots: Semaphore::new(depth.max(1)),
            timeout,
            ic,
            tasks: [reader, writer],
        })
    }

    /// The controller's ICResp.
    pub fn ic_resp(&self) -> IcResp {
        self.ic
    }

    /// Changes the largest in-capsule write (IOCCSZ learnt).
    pub fn set_max_in_capsule(&self, bytes: u32) {
        lock(&self.state).host.set_max_in_capsule(bytes);
    }

    /// Sends a command and waits for its end (whatever its status).
    pub async fn call(&self, req: Request) -> Result<Completed, NvmeError> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| NvmeError::Closed("queue closed".into()))?;
        let (tx, rx) = oneshot::channel();
        {
            let mut s = lock(&self.state);
            if let Some(e) = &s.dead {
                return Err(e.clone());
            }
            let cid = s.host.submit(req).map_err(NvmeError::Host)?;
            s.waiters.insert(cid, tx);
            let mut out = Vec::new();
            s.host.poll_transmit(&mut out);
            let _ = self.send.send(out);
        }
        within(self.timeout, "waiting for a command's completion", rx)
            .await?
            .unwrap_or_else(|_| Err(NvmeError::Closed("the connection ended".into())))
    }

    /// Sends a command; a status other than success is an error naming
    /// `what`.
    pub async fn call_ok(&self, what: &str, req: Request) -> Result<Completed, NvmeError> {
        let c = self.call(req).await?;
        if c.cqe.status.is_success() {
            Ok(c)
        } else {
            Err(NvmeError::Status {
                what: what.to_string(),
                status: c.cqe.status,
            })
        }
    }
}

/// Feeds the whole PDUs in `buf` to the host; wakes their commands.
fn deliver(
    state: &Mutex<State>,
    buf: &mut Vec<u8>,
    send: &mpsc::UnboundedSender<Vec<u8>>,
) -> Result<(), NvmeError> {
    let mut s = lock(state);
    let mut at = 0;
    let result = loop {
        match s.host.receive(&buf[at..]) {
            Ok(Some(r)) => {
                at += r.consumed;
                if let Some(HostEvent::Completed(c)) = r.event {
                    if let Some(w) = s.waiters.remove(&c.cqe.cid) {
                        let _ = w.send(Ok(c));
                    }
                }
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(NvmeError::Host(e)),
        }
    };
    buf.drain(..at);
    let mut out = Vec::new();
    if s.host.poll_transmit(&mut out) {
        let _ = send.send(out);
    }
    result
}

fn fail_all(state: &Mutex<State>, why: NvmeError) {
    let mut s = lock(state);
    for (_, w) in s.waiters.drain() {
        let _ = w.send(Err(why.clone()));
    }
    s.dead.get_or_insert(why);
}
