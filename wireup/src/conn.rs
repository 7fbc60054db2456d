//! The client's connection to its server: requests and replies over one Unix socket,
//! usable from many threads (leader/follower reading), events filed for dispatch; while
//! a call waits, the client's progress hook ([`Progress`]) runs between reads.

use std::collections::HashMap;
use std::io;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::frame::{self, MAX_PEER_FRAME};
use crate::proto::{ClientMsg, ServerMsg};

/// How long one read (or a follower's wait) lasts before the caller checks its deadline.
pub(crate) const READ_SLICE: Duration = Duration::from_millis(200);

/// Why a wait on the server ended at its deadline.
const LATE: &str = "the server did not answer in time";

/// `WEFT_WIREUP_REQUEST_TIMEOUT`, read once (a value it cannot be: the default, with a
/// warning naming it).
fn request_timeout() -> Duration {
    static T: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        let t = weft_tunables::find(crate::TUNABLES, "WEFT_WIREUP_REQUEST_TIMEOUT");
        let (lo, hi) = (
            Duration::from_millis(1),
            Duration::from_secs(365 * 24 * 3600),
        );
        t.millis(lo, hi).unwrap_or_else(|e| {
            tracing::warn!("{e}: using the default, {}", t.default);
            Duration::from_secs(60)
        })
    })
}

/// How long the client waits beyond an operation's own timeout before it declares the
/// server unresponsive (the server enforces the timeout itself and names who is missing).
const SERVER_SLACK: Duration = Duration::from_secs(5);

/// The connection to the server was lost or misbehaved.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {}{reason}", lost_prefix(*.absent))]
pub struct ConnError {
    op: &'static str,
    reason: String,
    /// There never was a connection (the process uses another wire-up backend).
    absent: bool,
    #[source]
    source: Option<io::Error>,
}

fn lost_prefix(absent: bool) -> &'static str {
    if absent {
        "no weft server: "
    } else {
        "connection to the weft server lost: "
    }
}

#[derive(Debug, Default)]
struct Rx {
    replies: HashMap<u64, ServerMsg>,
    /// Events read from the server, not yet dispatched.
    events: Vec<crate::Event>,
    reading: bool,
    broken: Option<String>,
}

/// A request/response connection usable from many threads: whichever waiter finds no
/// reader becomes the reader and files replies for the others (leader/follower).
#[derive(Debug)]
pub(crate) struct Conn {
    writer: Mutex<UnixStream>,
    /// The read side and the bytes of a frame not yet complete (reads resume after a
    /// timeout without losing them).
    reader: Mutex<(UnixStream, Vec<u8>)>,
    rx: Mutex<Rx>,
    cv: Condvar,
    next_req: AtomicU64,
    /// The client's progress hook, run while a call waits for the server.
    progress: Arc<Progress>,
}

/// Work a call does while it waits for the wire-up service (the fabric's progress; see
/// [`Client::set_progress_hook`](crate::Client::set_progress_hook)): the client's, shared
/// with its connection under Weft's servers and run by the PMIx backend's waits under a
/// PMIx host.
#[derive(Default)]
pub(crate) struct Progress(OnceLock<Box<dyn Fn() + Send + Sync>>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Progress(hook)"
        } else {
            "Progress(none)"
        })
    }
}

impl Progress {
    /// Installs the hook; false when one was installed already (only the first is kept).
    pub(crate) fn set(&self, hook: Box<dyn Fn() + Send + Sync>) -> bool {
        self.0.set(hook).is_ok()
    }

    /// Runs the hook, if one is installed.
    pub(crate) fn run(&self) {
        if let Some(hook) = self.0.get() {
            hook();
        }
    }

    /// Whether a hook is installed.
    fn installed(&self) -> bool {
        self.0.get().is_some()
    }
}

/// How often a call that waits for the server runs the progress hook.
const PROGRESS_SLICE: Duration = Duration::from_millis(1);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ConnError {
    /// The error of a request `op` that needs a Weft server the process does not have
    /// (it uses another wire-up backend): `reason` says which and what it lacks.
    #[cfg(feature = "pmix")]
    pub(crate) fn no_server(op: &'static str, reason: &str) -> ConnError {
        ConnError {
            op,
            reason: reason.to_owned(),
            source: None,
            absent: true,
        }
    }
}

impl Conn {
    /// Why the connection broke, once it has.
    pub(crate) fn broken(&self) -> Option<String> {
        lock(&self.rx).broken.clone()
    }

    /// A connection writing to `writer` and reading from `reader` (the same socket),
    /// running `progress` while a call waits.
    pub(crate) fn new(writer: UnixStream, reader: UnixStream, progress: Arc<Progress>) -> Conn {
        Conn {
            writer: Mutex::new(writer),
            reader: Mutex::new((reader, Vec::new())),
            rx: Mutex::new(Rx::default()),
            cv: Condvar::new(),
            next_req: AtomicU64::new(1),
            progress,
        }
    }

    /// Sends a request that expects no reply.
    pub(crate) fn send(&self, op: &'static str, msg: &ClientMsg) -> Result<(), ConnError> {
        let frame = frame::encode(msg);
        let mut w = lock(&self.writer);
        io::Write::write_all(&mut *w, &frame).map_err(|e| ConnError {
            op,
            reason: "cannot send the request".into(),
            source: Some(e),
            absent: false,
        })
    }

    /// Sends a request; its reply is collected with [`Conn::wait`] or [`Conn::poll`].
    pub(crate) fn start(
        &self,
        op: &'static str,
        build: impl FnOnce(u64) -> ClientMsg,
    ) -> Result<u64, ConnError> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let frame = frame::encode(&build(req));
        let mut w = lock(&self.writer);
        io::Write::write_all(&mut *w, &frame).map_err(|e| ConnError {
            op,
            reason: "cannot send the request".into(),
            source: Some(e),
            absent: false,
        })?;
        Ok(req)
    }

    pub(crate) fn call(
        &self,
        op: &'static str,
        build: impl FnOnce(u64) -> ClientMsg,
        timeout: Option<Duration>,
    ) -> Result<ServerMsg, ConnError> {
        let req = self.start(op, build)?;
        self.wait(op, req, timeout)
    }

    /// [`call`](Conn::call) for a request that has no timeout of its own: bounded by
    /// `WEFT_WIREUP_REQUEST_TIMEOUT`, which its timeout error names.
    pub(crate) fn call_bounded(
        &self,
        op: &'static str,
        build: impl FnOnce(u64) -> ClientMsg,
    ) -> Result<ServerMsg, ConnError> {
        let t = request_timeout();
        self.call(op, build, Some(t)).map_err(|mut e| {
            if e.reason == LATE {
                e.reason =
                    format!("the server did not answer within {t:?} (WEFT_WIREUP_REQUEST_TIMEOUT)");
            }
            e
        })
    }

    /// Files one frame read from the server (or the reason the connection broke).
    fn file(&self, rx: &mut Rx, got: Result<Option<ServerMsg>, String>) {
        match got {
            Ok(None) => {}
            Ok(Some(ServerMsg::Event(e))) => rx.events.push(e),
            Ok(Some(m)) => {
                let id = match &m {
                    ServerMsg::Done { req }
                    | ServerMsg::Value { req, .. }
                    | ServerMsg::Missing { req, .. }
                    | ServerMsg::Failed { req, .. }
                    | ServerMsg::Group { req, .. }
                    | ServerMsg::Groups { req, .. }
                    | ServerMsg::Spawned { req, .. }
                    | ServerMsg::Names { req, .. }
                    | ServerMsg::Allocated { req, .. }
                    | ServerMsg::Connected { req, .. } => *req,
                    other => {
                        rx.broken = Some(format!("unexpected message from the server: {other:?}"));
                        self.cv.notify_all();
                        return;
                    }
                };
                rx.replies.insert(id, m);
            }
            Err(why) => rx.broken = Some(why),
        }
        self.cv.notify_all();
    }

    /// Waits for the reply to request `req`.
    pub(crate) fn wait(
        &self,
        op: &'static str,
        req: u64,
        timeout: Option<Duration>,
    ) -> Result<ServerMsg, ConnError> {
        // A huge timeout (Duration::MAX as "no limit") means no deadline.
        let deadline =
            timeout.and_then(|t| Instant::now().checked_add(t)?.checked_add(SERVER_SLACK));
        let late = |op| ConnError {
            op,
            reason: LATE.into(),
            source: None,
            absent: false,
        };
        let mut rx = lock(&self.rx);
        loop {
            if let Some(m) = rx.replies.remove(&req) {
                return Ok(m);
            }
            if let Some(why) = &rx.broken {
                return Err(ConnError {
                    op,
                    reason: why.clone(),
                    source: None,
                    absent: false,
                });
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                // Only this call gives up; the connection stays usable for the others.
                return Err(late(op));
            }
            if rx.reading {
                // A follower wakes up now and then to check its own deadline.
                rx = self
                    .cv
                    .wait_timeout(rx, READ_SLICE)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
                continue;
            }
            rx.reading = true;
            drop(rx);
            let got = self.read_one(false);
            rx = lock(&self.rx);
            rx.reading = false;
            self.file(&mut rx, got);
            if self.progress.installed() && !rx.replies.contains_key(&req) && rx.broken.is_none() {
                drop(rx);
                self.progress.run();
                rx = lock(&self.rx);
            }
        }
    }

    /// Shortens the reads so that the progress hook (installed now) runs about every
    /// [`PROGRESS_SLICE`].
    pub(crate) fn shorten_reads(&self) {
        let guard = lock(&self.reader);
        if let Err(e) = guard.0.set_read_timeout(Some(PROGRESS_SLICE)) {
            tracing::warn!("cannot shorten the wire-up reads for the progress hook: {e}");
        }
    }

    /// Reads whatever the server has sent (never blocks) and returns the events read so
    /// far.
    pub(crate) fn take_events(&self) -> Vec<crate::Event> {
        let mut rx = self.read_available(None);
        std::mem::take(&mut rx.events)
    }

    /// Reads what the server has sent, without blocking, unless another thread is
    /// reading, the connection is broken, or the reply to `req` is already here.
    fn read_available(&self, req: Option<u64>) -> MutexGuard<'_, Rx> {
        let mut rx = lock(&self.rx);
        let have = req.is_some_and(|r| rx.replies.contains_key(&r));
        if !rx.reading && !have && rx.broken.is_none() {
            rx.reading = true;
            drop(rx);
            let got = self.read_one(true);
            rx = lock(&self.rx);
            rx.reading = false;
            self.file(&mut rx, got);
        }
        rx
    }

    /// The reply to request `req` if it has arrived; never blocks.
    pub(crate) fn poll(&self, op: &'static str, req: u64) -> Result<Option<ServerMsg>, ConnError> {
        let mut rx = self.read_available(Some(req));
        if let Some(m) = rx.replies.remove(&req) {
            return Ok(Some(m));
        }
        match &rx.broken {
            Some(why) => Err(ConnError {
                op,
                reason: why.clone(),
                source: None,
                absent: false,
            }),
            None => Ok(None),
        }
    }

    /// Reads for at most [`READ_SLICE`] (or only what is there, with `nonblocking`):
    /// `Ok(Some)` a frame, `Ok(None)` nothing complete yet (the partial frame is kept),
    /// `Err` the connection is broken.
    fn read_one(&self, nonblocking: bool) -> Result<Option<ServerMsg>, String> {
        let mut guard = lock(&self.reader);
        let (sock, buf) = &mut *guard;
        if nonblocking {
            sock.set_nonblocking(true).map_err(|e| e.to_string())?;
        }
        let got = Self::read_frame(sock, buf);
        if nonblocking {
            sock.set_nonblocking(false).map_err(|e| e.to_string())?;
        }
        got
    }

    fn read_frame(sock: &mut UnixStream, buf: &mut Vec<u8>) -> Result<Option<ServerMsg>, String> {
        loop {
            if buf.len() >= 4 {
                let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                if len > MAX_PEER_FRAME {
                    return Err(format!(
                        "the server sent a frame of {len} bytes (limit {MAX_PEER_FRAME})"
                    ));
                }
                if buf.len() >= 4 + len {
                    let m = postcard::from_bytes::<ServerMsg>(&buf[4..4 + len])
                        .map_err(|e| format!("undecodable frame from the server: {e}"));
                    buf.drain(..4 + len);
                    return m.map(Some);
                }
            }
            let mut chunk = [0u8; 64 << 10];
            match io::Read::read(sock, &mut chunk) {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn_pair() -> (Conn, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        let reader = a.try_clone().unwrap();
        reader.set_read_timeout(Some(READ_SLICE)).unwrap();
        (Conn::new(a, reader, Arc::default()), b)
    }

    fn read_req(server: &mut UnixStream) -> u64 {
        match frame::read_sync::<ClientMsg>(server, MAX_PEER_FRAME).unwrap() {
            ClientMsg::Finalize { req, .. } => req,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_reply_split_across_read_slices_is_not_lost() {
        let (conn, mut server) = conn_pair();
        let t = std::thread::spawn(move || {
            let req = read_req(&mut server);
            let f = frame::encode(&ServerMsg::Done { req });
            io::Write::write_all(&mut server, &f[..3]).unwrap();
            std::thread::sleep(READ_SLICE * 3);
            io::Write::write_all(&mut server, &f[3..]).unwrap();
            server
        });
        let m = conn
            .call(
                "test",
                |req| ClientMsg::Finalize {
                    req,
                    at_exit: false,
                },
                None,
            )
            .unwrap();
        assert!(matches!(m, ServerMsg::Done { .. }));
        t.join().unwrap();
    }

    #[test]
    fn one_callers_timeout_leaves_the_connection_usable() {
        let (conn, mut server) = conn_pair();
        let conn = std::sync::Arc::new(conn);
        // The first request is never answered; its caller gives up after its deadline.
        let c2 = conn.clone();
        let slow = std::thread::spawn(move || {
            c2.call(
                "slow",
                |req| ClientMsg::Finalize {
                    req,
                    at_exit: false,
                },
                Some(Duration::from_millis(1)),
            )
        });
        let first = read_req(&mut server);
        // While it waits, another thread's request is answered normally.
        let c3 = conn.clone();
        let fast = std::thread::spawn(move || {
            c3.call(
                "fast",
                |req| ClientMsg::Finalize {
                    req,
                    at_exit: false,
                },
                None,
            )
        });
        let second = read_req(&mut server);
        frame::write_sync(&mut server, &ServerMsg::Done { req: second }).unwrap();
        assert!(matches!(fast.join().unwrap(), Ok(ServerMsg::Done { .. })));
        let e = slow.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("did not answer in time"), "{e}");
        // And the connection still works afterwards.
        let t = std::thread::spawn(move || {
            let req = read_req(&mut server);
            frame::write_sync(&mut server, &ServerMsg::Done { req }).unwrap();
            let _ = first;
            server
        });
        assert!(conn
            .call(
                "after",
                |req| ClientMsg::Finalize {
                    req,
                    at_exit: false
                },
                None
            )
            .is_ok());
        t.join().unwrap();
    }
}

#[cfg(test)]
mod tunable_tests {
    use super::*;

    #[test]
    fn the_request_timeouts_default_parses_and_is_the_fallback() {
        let t = weft_tunables::find(crate::TUNABLES, "WEFT_WIREUP_REQUEST_TIMEOUT");
        let got = t.millis_in(&|_: &str| None, Duration::ZERO, Duration::MAX);
        assert_eq!(got, Ok(Duration::from_secs(60)));
        let w = weft_tunables::find(crate::TUNABLES, "WEFT_WIREUP");
        assert_eq!(
            w.choice_in(&|_: &str| None, &["weft", "pmix", "auto"]),
            Ok("auto")
        );
    }
}
