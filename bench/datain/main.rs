//! Data-In send-path micro-benchmark.
//!
//! Measures, side by side over loopback TCP, ways to send a READ's data
//! (an iSCSI Data-In PDU: a 48-byte header followed by the data) from a
//! file: `copy` (read + `writev`, today's path), `zerocopy` (read +
//! `sendmsg(MSG_ZEROCOPY)`), `sendfile`, `splice` (file → pipe → socket)
//! and `uring-send-zc` (read + io_uring `IORING_OP_SEND_ZC` from a
//! registered buffer). Each method runs for a fixed time per source mode
//! (page cache warm, O_DIRECT) and transfer size; the program reports
//! transfers/s, MB/s and CPU time per transfer of the sending thread, of
//! the receiving thread and of the whole process.
//!
//! Usage: `cargo run --release --example datain -- [--seconds S]
//! [--file PATH] [--sizes 4096,131072] [--modes cache,direct]
//! [--methods copy,zerocopy,sendfile,splice,uring-send-zc] [--json]`

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

/// Length of an iSCSI Basic Header Segment.
const HEADER_LEN: usize = 48;
/// Size of the benchmark file.
const FILE_SIZE: u64 = 1 << 30;
/// Default path of the benchmark file.
const DEFAULT_FILE: &str = "/var/tmp/ethersan-datain.bin";
/// Buffers in flight for the zero-copy methods.
const RING_SLOTS: usize = 8;
/// Alignment of data buffers (O_DIRECT needs the logical block size).
const ALIGN: usize = 4096;

/// `SO_ZEROCOPY` socket option (asm-generic/socket.h).
const SO_ZEROCOPY: libc::c_int = 60;
/// `SO_EE_ORIGIN_ZEROCOPY` (linux/errqueue.h).
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED` (linux/errqueue.h).
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;
/// `IORING_SEND_ZC_REPORT_USAGE` (linux/io_uring.h).
const IORING_SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED` (linux/io_uring.h).
const IORING_NOTIF_USAGE_ZC_COPIED: i32 = i32::MIN;

/// A heap buffer aligned to [`ALIGN`].
struct AlignedBuf {
    /// Start of the allocation.
    ptr: *mut u8,
    /// Length in bytes.
    len: usize,
}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes aligned to [`ALIGN`].
    fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len, ALIGN).expect("layout");
        // SAFETY: `len` is non-zero (callers pass at least 4096) and the
        // layout is valid.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "allocation failed");
        Self { ptr, len }
    }

    /// The buffer as a mutable slice.
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `len` initialised bytes owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, ALIGN).expect("layout");
        // SAFETY: allocated in `new` with this very layout.
        unsafe { dealloc(self.ptr, layout) }
    }
}

/// Converts a `-1` return into the current OS error.
fn cvt(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Thread (or process) CPU time in microseconds, user + system.
fn cpu_us(who: libc::c_int) -> f64 {
    // SAFETY: `rusage` is plain data; zeroed is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid out-pointer.
    let r = unsafe { libc::getrusage(who, &mut ru) };
    assert_eq!(r, 0, "getrusage");
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// `RUSAGE_THREAD` (not exported by libc for glibc targets).
const RUSAGE_THREAD: libc::c_int = 1;

/// Reads exactly `buf.len()` bytes at `off` with `pread`.
fn pread_full(fd: RawFd, buf: &mut [u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the pointer and length describe the unread tail of `buf`.
        let r = unsafe {
            libc::pread(
                fd,
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                (off + done as u64) as libc::off_t,
            )
        };
        let n = cvt(r)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
        }
        done += n;
    }
    Ok(())
}

/// The iovecs of what is left of `hdr` then `data` after `done` bytes, and
/// how many of them are non-empty.
fn rest_iovecs(hdr: &[u8], data: &[u8], done: usize) -> ([libc::iovec; 2], i32) {
    let (a, b): (&[u8], &[u8]) = if done < hdr.len() {
        (&hdr[done..], data)
    } else {
        (&data[done - hdr.len()..], &[])
    };
    let iov = [
        libc::iovec {
            iov_base: a.as_ptr() as *mut _,
            iov_len: a.len(),
        },
        libc::iovec {
            iov_base: b.as_ptr() as *mut _,
            iov_len: b.len(),
        },
    ];
    (iov, if b.is_empty() { 1 } else { 2 })
}

/// Writes all of `hdr` then `data` with `writev`, resuming partial writes.
fn writev_all(sock: RawFd, hdr: &[u8], data: &[u8]) -> io::Result<()> {
    let total = hdr.len() + data.len();
    let mut done = 0;
    while done < total {
        let (iov, cnt) = rest_iovecs(hdr, data, done);
        // SAFETY: the iovecs point into live slices for the call's duration.
        let r = unsafe { libc::writev(sock, iov.as_ptr(), cnt) };
        done += cvt(r)?;
    }
    Ok(())
}

/// Sends all of `buf` with `send(flags)`.
fn send_all(sock: RawFd, buf: &[u8], flags: libc::c_int) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: pointer and length describe the unsent tail of `buf`.
        let r = unsafe { libc::send(sock, buf[done..].as_ptr().cast(), buf.len() - done, flags) };
        done += cvt(r)?;
    }
    Ok(())
}

/// Sets an integer socket option.
fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `v` is a live c_int and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    cvt(r as isize).map(|_| ())
}

/// Source mode: where the read's data comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Buffered descriptor, page cache warm.
    Cache,
    /// O_DIRECT descriptor: every read reaches the disk.
    Direct,
}

impl Mode {
    /// Name used in the output.
    fn name(self) -> &'static str {
        match self {
            Mode::Cache => "cache",
            Mode::Direct => "direct",
        }
    }
}

/// Send method under test.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    /// pread + writev (today's path).
    Copy,
    /// pread + sendmsg(MSG_ZEROCOPY).
    ZeroCopy,
    /// send(header, MSG_MORE) + sendfile.
    Sendfile,
    /// send(header, MSG_MORE) + splice file → pipe → socket.
    Splice,
    /// pread + io_uring SEND_ZC from a registered buffer.
    UringSendZc,
}

impl Method {
    /// Name used on the command line and in the output.
    fn name(self) -> &'static str {
        match self {
            Method::Copy => "copy",
            Method::ZeroCopy => "zerocopy",
            Method::Sendfile => "sendfile",
            Method::Splice => "splice",
            Method::UringSendZc => "uring-send-zc",
        }
    }

    /// Parses a method name.
    fn parse(s: &str) -> Option<Self> {
        [
            Method::Copy,
            Method::ZeroCopy,
            Method::Sendfile,
            Method::Splice,
            Method::UringSendZc,
        ]
        .into_iter()
        .find(|m| m.name() == s)
    }
}

/// What one timed run measured.
struct Outcome {
    /// Transfers completed.
    transfers: u64,
    /// Wall time of the run, until the receiver drained everything.
    elapsed: Duration,
    /// Sending thread CPU µs.
    sender_us: f64,
    /// Receiving thread CPU µs.
    receiver_us: f64,
    /// Process CPU µs (includes io_uring workers, if any).
    total_us: f64,
    /// Free-form remark (zero-copy "copied" counts, fallbacks).
    note: String,
}

/// Per-method sender state and loop.
struct Sender {
    /// Socket to the receiver.
    sock: RawFd,
    /// File descriptor to read from (buffered or O_DIRECT).
    file: RawFd,
    /// Transfer size.
    size: usize,
    /// Random generator for offsets.
    rng: fastrand::Rng,
    /// Number of SIZE-aligned blocks in the file.
    blocks: u64,
}

impl Sender {
    /// Next random SIZE-aligned offset.
    fn offset(&mut self) -> u64 {
        self.rng.u64(0..self.blocks) * self.size as u64
    }

    /// A Data-In-like header for transfer `n`.
    fn header(n: u64, size: usize) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0] = 0x25; // SCSI Data-In opcode
        h[5..8].copy_from_slice(&(size as u32).to_be_bytes()[1..]);
        h[16..24].copy_from_slice(&n.to_be_bytes());
        h
    }

    /// Today's path: pread into a reused buffer, writev header + data.
    fn run_copy(&mut self, until: Instant) -> io::Result<(u64, String)> {
        let mut buf = AlignedBuf::new(self.size);
        let mut n = 0;
        while Instant::now() < until {
            let off = self.offset();
            pread_full(self.file, buf.as_mut_slice(), off)?;
            writev_all(self.sock, &Self::header(n, self.size), buf.as_mut_slice())?;
            n += 1;
        }
        Ok((n, String::new()))
    }

    /// pread into a ring of buffers, sendmsg(MSG_ZEROCOPY) header + data,
    /// reap completions from the error queue before reusing a buffer.
    fn run_zerocopy(&mut self, until: Instant) -> io::Result<(u64, String)> {
        setsockopt_int(self.sock, libc::SOL_SOCKET, SO_ZEROCOPY, 1)?;
        let mut bufs: Vec<AlignedBuf> = (0..RING_SLOTS)
            .map(|_| AlignedBuf::new(self.size))
            .collect();
        let mut hdrs = [[0u8; HEADER_LEN]; RING_SLOTS];
        let mut zc = ZcState::default();
        let mut n = 0u64;
        while Instant::now() < until {
            let slot = (n % RING_SLOTS as u64) as usize;
            while zc.pending[slot] > 0 {
                zc.reap(self.sock, true)?;
            }
            let off = self.offset();
            pread_full(self.file, bufs[slot].as_mut_slice(), off)?;
            hdrs[slot] = Self::header(n, self.size);
            let total = HEADER_LEN + self.size;
            let mut done = 0;
            while done < total {
                let (mut iov, cnt) = rest_iovecs(&hdrs[slot], bufs[slot].as_mut_slice(), done);
                // SAFETY: msghdr is plain data; zeroed is valid.
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                msg.msg_iov = iov.as_mut_ptr();
                msg.msg_iovlen = cnt as usize;
                // SAFETY: `msg` points to iovecs into buffers that stay
                // untouched until their zero-copy completion is reaped.
                let r = unsafe { libc::sendmsg(self.sock, &msg, libc::MSG_ZEROCOPY) };
                match cvt(r) {
                    Ok(sent) => {
                        zc.inflight.insert(zc.next_id, slot);
                        zc.next_id = zc.next_id.wrapping_add(1);
                        zc.pending[slot] += 1;
                        done += sent;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        // Too much optmem pinned by notifications: reap one.
                        zc.reap(self.sock, true)?;
                    }
                    Err(e) => return Err(e),
                }
            }
            n += 1;
            // Drain whatever notifications are already queued.
            zc.reap(self.sock, false)?;
        }
        while zc.pending.iter().any(|&p| p > 0) {
            zc.reap(self.sock, true)?;
        }
        Ok((
            n,
            format!(
                "{} sends, {} notifications, {} sends reported COPIED",
                zc.next_id, zc.notifications, zc.copied
            ),
        ))
    }

    /// Header with MSG_MORE, then sendfile from the file descriptor.
    fn run_sendfile(&mut self, until: Instant) -> io::Result<(u64, String)> {
        let mut n = 0;
        while Instant::now() < until {
            let off = self.offset();
            send_all(self.sock, &Self::header(n, self.size), libc::MSG_MORE)?;
            let mut pos = off as libc::off_t;
            let end = pos + self.size as libc::off_t;
            while pos < end {
                // SAFETY: `pos` is a live off_t the kernel advances.
                let r =
                    unsafe { libc::sendfile(self.sock, self.file, &mut pos, (end - pos) as usize) };
                if cvt(r)? == 0 {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "sendfile 0"));
                }
            }
            n += 1;
        }
        Ok((n, self.direct_note()))
    }

    /// Says whether the file descriptor is O_DIRECT (the kernel accepted
    /// it as a splice/sendfile source).
    fn direct_note(&self) -> String {
        // SAFETY: F_GETFL on an open descriptor.
        let fl = unsafe { libc::fcntl(self.file, libc::F_GETFL) };
        if fl >= 0 && fl & libc::O_DIRECT != 0 {
            "O_DIRECT fd accepted".to_string()
        } else {
            String::new()
        }
    }

    /// Header with MSG_MORE, then splice file → pipe → socket.
    fn run_splice(&mut self, until: Instant) -> io::Result<(u64, String)> {
        let mut p = [0 as libc::c_int; 2];
        // SAFETY: `p` is a valid two-int out-array.
        cvt(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } as isize)?;
        let (pr, pw) = (p[0], p[1]);
        let want = self.size.max(65536) as libc::c_int;
        // SAFETY: plain fcntl on our own pipe.
        let got = cvt(unsafe { libc::fcntl(pw, libc::F_SETPIPE_SZ, want) } as isize)?;
        let result = (|| {
            let mut n = 0;
            while Instant::now() < until {
                let off = self.offset();
                send_all(self.sock, &Self::header(n, self.size), libc::MSG_MORE)?;
                let mut pos = off as libc::loff_t;
                let mut left = self.size;
                while left > 0 {
                    // SAFETY: `pos` is a live loff_t; fds are open.
                    let r = unsafe {
                        libc::splice(
                            self.file,
                            &mut pos,
                            pw,
                            std::ptr::null_mut(),
                            left,
                            libc::SPLICE_F_MOVE,
                        )
                    };
                    let mut inpipe = cvt(r)?;
                    if inpipe == 0 {
                        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "splice 0"));
                    }
                    left -= inpipe;
                    while inpipe > 0 {
                        let more = if left > 0 { libc::SPLICE_F_MORE } else { 0 };
                        // SAFETY: both fds are open; no offsets.
                        let r = unsafe {
                            libc::splice(
                                pr,
                                std::ptr::null_mut(),
                                self.sock,
                                std::ptr::null_mut(),
                                inpipe,
                                libc::SPLICE_F_MOVE | more,
                            )
                        };
                        inpipe -= cvt(r)?;
                    }
                }
                n += 1;
            }
            Ok((
                n,
                format!("pipe size {got} {}", self.direct_note())
                    .trim_end()
                    .to_string(),
            ))
        })();
        // SAFETY: closing the pipe we created.
        unsafe {
            libc::close(pr);
            libc::close(pw);
        }
        result
    }

    /// pread into registered buffers, send header + data with one
    /// IORING_OP_SEND_ZC, wait for its result CQE before the next send
    /// (keeps the stream ordered), reap notification CQEs lazily.
    fn run_uring(&mut self, until: Instant) -> io::Result<(u64, String)> {
        use io_uring::{cqueue, opcode, types, IoUring};
        // Each slot: ALIGN bytes of which the last 48 hold the header, then
        // the aligned data, so header + data are one contiguous send.
        let slot_len = ALIGN + self.size;
        let mut bufs: Vec<AlignedBuf> =
            (0..RING_SLOTS).map(|_| AlignedBuf::new(slot_len)).collect();
        let mut ring = IoUring::new(64)?;
        let iovs: Vec<libc::iovec> = bufs
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.ptr.cast(),
                iov_len: b.len,
            })
            .collect();
        // SAFETY: the buffers outlive the ring (dropped after it, below)
        // and are not freed while registered.
        unsafe { ring.submitter().register_buffers(&iovs)? };
        let mut pending = [0u32; RING_SLOTS];
        let (mut notifs, mut copied, mut sends) = (0u64, 0u64, 0u64);
        let mut n = 0u64;
        let mut reap =
            |ring: &mut IoUring, pending: &mut [u32; RING_SLOTS], last: &mut Option<i32>| {
                for cqe in ring.completion() {
                    let slot = cqe.user_data() as usize;
                    if cqueue::notif(cqe.flags()) {
                        notifs += 1;
                        if cqe.result() & IORING_NOTIF_USAGE_ZC_COPIED != 0 {
                            copied += 1;
                        }
                        pending[slot] -= 1;
                    } else {
                        if !cqueue::more(cqe.flags()) {
                            // No notification will follow (e.g. error).
                            pending[slot] -= 1;
                        }
                        *last = Some(cqe.result());
                    }
                }
            };
        let result = (|| {
            while Instant::now() < until {
                let slot = (n % RING_SLOTS as u64) as usize;
                while pending[slot] > 0 {
                    ring.submit_and_wait(1)?;
                    reap(&mut ring, &mut pending, &mut None);
                }
                let off = self.offset();
                let whole = bufs[slot].as_mut_slice();
                whole[ALIGN - HEADER_LEN..ALIGN].copy_from_slice(&Self::header(n, self.size));
                pread_full(self.file, &mut whole[ALIGN..], off)?;
                let base = bufs[slot].ptr;
                let total = HEADER_LEN + self.size;
                let mut done = 0usize;
                while done < total {
                    // SAFETY: within the registered slot buffer.
                    let start = unsafe { base.add(ALIGN - HEADER_LEN + done) };
                    let sqe =
                        opcode::SendZc::new(types::Fd(self.sock), start, (total - done) as u32)
                            .buf_index(Some(slot as u16))
                            .flags(libc::MSG_WAITALL)
                            .zc_flags(IORING_SEND_ZC_REPORT_USAGE)
                            .build()
                            .user_data(slot as u64);
                    // SAFETY: the buffer stays alive and untouched until
                    // its notification CQE is reaped.
                    unsafe { ring.submission().push(&sqe).expect("sq full") };
                    pending[slot] += 1;
                    sends += 1;
                    let mut last = None;
                    while last.is_none() {
                        ring.submit_and_wait(1)?;
                        reap(&mut ring, &mut pending, &mut last);
                    }
                    let res = last.unwrap_or(0);
                    if res < 0 {
                        return Err(io::Error::from_raw_os_error(-res));
                    }
                    done += res as usize;
                }
                n += 1;
            }
            while pending.iter().any(|&p| p > 0) {
                ring.submit_and_wait(1)?;
                reap(&mut ring, &mut pending, &mut None);
            }
            Ok(n)
        })();
        drop(ring);
        drop(iovs);
        bufs.clear();
        let n = result?;
        Ok((
            n,
            format!("{sends} sends, {notifs} notifications, {copied} reported COPIED"),
        ))
    }
}

/// Zero-copy completion bookkeeping for MSG_ZEROCOPY.
#[derive(Default)]
struct ZcState {
    /// Id the kernel will give the next zero-copy send.
    next_id: u32,
    /// In-flight send id → ring slot.
    inflight: HashMap<u32, usize>,
    /// Sends in flight per slot.
    pending: [u32; RING_SLOTS],
    /// Notifications received.
    notifications: u64,
    /// Sends whose notification said the data was copied.
    copied: u64,
}

impl ZcState {
    /// Reads one notification from the error queue; with `wait`, polls
    /// for it first.
    fn reap(&mut self, sock: RawFd, wait: bool) -> io::Result<()> {
        loop {
            let mut control = [0u64; 16];
            // SAFETY: msghdr is plain data; zeroed is valid.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control);
            // SAFETY: `msg` points to a live control buffer, no data iovecs.
            let r =
                unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EAGAIN) {
                    if !wait {
                        return Ok(());
                    }
                    let mut pfd = libc::pollfd {
                        fd: sock,
                        events: 0,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut pfd, 1, 1000) };
                    continue;
                }
                return Err(e);
            }
            // SAFETY: `msg` was filled by recvmsg; walk its control messages.
            let mut cm = unsafe { libc::CMSG_FIRSTHDR(&msg) };
            while !cm.is_null() {
                // SAFETY: `cm` is a control message inside `control`.
                let ee: libc::sock_extended_err =
                    unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast()) };
                if ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY && ee.ee_errno == 0 {
                    self.notifications += 1;
                    let (lo, hi) = (ee.ee_info, ee.ee_data);
                    let mut id = lo;
                    loop {
                        if let Some(slot) = self.inflight.remove(&id) {
                            self.pending[slot] -= 1;
                            if ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0 {
                                self.copied += 1;
                            }
                        }
                        if id == hi {
                            break;
                        }
                        id = id.wrapping_add(1);
                    }
                }
                // SAFETY: advancing within the same control buffer.
                cm = unsafe { libc::CMSG_NXTHDR(&msg, cm) };
            }
            return Ok(());
        }
    }
}

/// Runs one method for `secs` seconds over a fresh loopback connection.
fn run_one(method: Method, file: &File, size: usize, secs: f64) -> io::Result<Outcome> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let receiver = std::thread::spawn(move || -> io::Result<f64> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let start = cpu_us(RUSAGE_THREAD);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(cpu_us(RUSAGE_THREAD) - start)
    });
    let sock = TcpStream::connect(addr)?;
    sock.set_nodelay(true)?;
    let proc0 = cpu_us(libc::RUSAGE_SELF);
    let thr0 = cpu_us(RUSAGE_THREAD);
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(secs);
    let mut sender = Sender {
        sock: sock.as_raw_fd(),
        file: file.as_raw_fd(),
        size,
        rng: fastrand::Rng::with_seed(0x5eed ^ size as u64),
        blocks: FILE_SIZE / size as u64,
    };
    let res = match method {
        Method::Copy => sender.run_copy(until),
        Method::ZeroCopy => sender.run_zerocopy(until),
        Method::Sendfile => sender.run_sendfile(until),
        Method::Splice => sender.run_splice(until),
        Method::UringSendZc => sender.run_uring(until),
    };
    let sender_us = cpu_us(RUSAGE_THREAD) - thr0;
    drop(sock);
    let receiver_us = receiver.join().expect("receiver panicked")?;
    let elapsed = t0.elapsed();
    let total_us = cpu_us(libc::RUSAGE_SELF) - proc0;
    let (transfers, note) = res?;
    Ok(Outcome {
        transfers,
        elapsed,
        sender_us,
        receiver_us,
        total_us,
        note,
    })
}

/// Creates the 1 GiB file of random data unless it already exists.
fn ensure_file(path: &str) -> io::Result<()> {
    if std::fs::metadata(path)
        .map(|m| m.len() >= FILE_SIZE)
        .unwrap_or(false)
    {
        return Ok(());
    }
    eprintln!("creating {path} (1 GiB of random data)");
    let mut f = File::create(path)?;
    let mut rng = fastrand::Rng::with_seed(42);
    let mut chunk = vec![0u8; 1 << 20];
    for _ in 0..(FILE_SIZE >> 20) {
        rng.fill(&mut chunk);
        f.write_all(&chunk)?;
    }
    f.sync_all()
}

/// Reads the whole file once so the page-cache mode starts warm.
fn warm(path: &str) -> io::Result<()> {
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    while f.read(&mut buf)? > 0 {}
    Ok(())
}

/// Command-line options.
struct Opts {
    /// Benchmark file path.
    file: String,
    /// Seconds per method.
    secs: f64,
    /// Transfer sizes.
    sizes: Vec<usize>,
    /// Source modes.
    modes: Vec<Mode>,
    /// Methods.
    methods: Vec<Method>,
    /// Emit JSON instead of markdown.
    json: bool,
}

/// Parses the command line.
fn parse_args() -> Opts {
    let mut o = Opts {
        file: DEFAULT_FILE.to_string(),
        secs: 3.0,
        sizes: vec![4096, 131072],
        modes: vec![Mode::Cache, Mode::Direct],
        methods: vec![
            Method::Copy,
            Method::ZeroCopy,
            Method::Sendfile,
            Method::Splice,
            Method::UringSendZc,
        ],
        json: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--file" => o.file = val(),
            "--seconds" => o.secs = val().parse().expect("--seconds"),
            "--sizes" => {
                o.sizes = val()
                    .split(',')
                    .map(|s| s.parse().expect("--sizes"))
                    .collect()
            }
            "--modes" => {
                o.modes = val()
                    .split(',')
                    .map(|s| match s {
                        "cache" => Mode::Cache,
                        "direct" => Mode::Direct,
                        _ => panic!("unknown mode {s}"),
                    })
                    .collect()
            }
            "--methods" => {
                o.methods = val()
                    .split(',')
                    .map(|s| Method::parse(s).unwrap_or_else(|| panic!("unknown method {s}")))
                    .collect()
            }
            "--json" => o.json = true,
            "-h" | "--help" => {
                println!(
                    "datain [--seconds S] [--file PATH] [--sizes 4096,131072] [--modes cache,direct] \
                     [--methods copy,zerocopy,sendfile,splice,uring-send-zc] [--json]"
                );
                std::process::exit(0);
            }
            _ => panic!("unknown argument {a}"),
        }
    }
    for &s in &o.sizes {
        assert!(
            s >= ALIGN && s % ALIGN == 0,
            "sizes must be multiples of {ALIGN}"
        );
    }
    o
}

fn main() -> io::Result<()> {
    let o = parse_args();
    ensure_file(&o.file)?;
    let mut rows = Vec::new();
    for &mode in &o.modes {
        let file = match mode {
            Mode::Cache => {
                warm(&o.file)?;
                File::open(&o.file)?
            }
            Mode::Direct => OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&o.file)?,
        };
        for &size in &o.sizes {
            for &method in &o.methods {
                let r = run_one(method, &file, size, o.secs);
                let row = match r {
                    Ok(out) => {
                        let t = out.transfers.max(1) as f64;
                        let secs = out.elapsed.as_secs_f64();
                        serde_json::json!({
                            "method": method.name(),
                            "mode": mode.name(),
                            "size": size,
                            "transfers": out.transfers,
                            "seconds": secs,
                            "transfers_per_s": out.transfers as f64 / secs,
                            "mb_per_s": out.transfers as f64 * size as f64 / secs / 1e6,
                            "sender_cpu_us": out.sender_us / t,
                            "receiver_cpu_us": out.receiver_us / t,
                            "total_cpu_us": out.total_us / t,
                            "note": out.note,
                        })
                    }
                    Err(e) => serde_json::json!({
                        "method": method.name(),
                        "mode": mode.name(),
                        "size": size,
                        "error": e.to_string(),
                    }),
                };
                eprintln!("{row}");
                rows.push(row);
            }
        }
    }
    if o.json {
        println!("{}", serde_json::to_string_pretty(&rows).expect("json"));
        return Ok(());
    }
    println!("| method | mode | size | transfers/s | MB/s | sender CPU µs/transfer | receiver CPU µs/transfer | total CPU µs/transfer | note |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---|");
    for r in &rows {
        let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        if let Some(e) = r.get("error") {
            println!(
                "| {} | {} | {} | – | – | – | – | – | error: {} |",
                s("method"),
                s("mode"),
                r["size"],
                e.as_str().unwrap_or("")
            );
        } else {
            println!(
                "| {} | {} | {} | {:.0} | {:.1} | {:.2} | {:.2} | {:.2} | {} |",
                s("method"),
                s("mode"),
                r["size"],
                f("transfers_per_s"),
                f("mb_per_s"),
                f("sender_cpu_us"),
                f("receiver_cpu_us"),
                f("total_cpu_us"),
                s("note")
            );
        }
    }
    Ok(())
}
