//! The children's output: forwarded line by line from a dedicated thread.

use std::io::{self, Write};
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::wire::proto::{JobPlan, ToLauncher};
use weft_wireup::{NsId, Rank};

/// What the output thread receives: a chunk of a child's output (stderr or not), or a
/// request to say when everything sent before it is written.
pub(super) enum Chunk {
    Data(bool, Vec<u8>),
    Flushed(std::sync::mpsc::SyncSender<()>),
}

/// Forwards children's output from a dedicated thread, so a slow terminal never blocks
/// the server.
pub(super) struct OutputSink {
    pub(super) tx: std::sync::mpsc::Sender<Chunk>,
    pub(super) thread: std::thread::JoinHandle<()>,
}

impl OutputSink {
    /// How long [`OutputSink::flush`] waits for a blocked terminal.
    const FLUSH_WAIT: Duration = Duration::from_secs(5);

    pub(super) fn start() -> OutputSink {
        let (tx, rx) = std::sync::mpsc::channel::<Chunk>();
        let thread = std::thread::spawn(move || {
            for chunk in rx {
                let (is_err, bytes) = match chunk {
                    Chunk::Data(is_err, bytes) => (is_err, bytes),
                    Chunk::Flushed(done) => {
                        let _ = done.send(());
                        continue;
                    }
                };
                let _ = if is_err {
                    let mut e = io::stderr().lock();
                    e.write_all(&bytes).and_then(|_| e.flush())
                } else {
                    let mut o = io::stdout().lock();
                    o.write_all(&bytes).and_then(|_| o.flush())
                };
            }
        });
        OutputSink { tx, thread }
    }

    /// Waits (a bounded time) until the output sent so far is written: before the server
    /// lets go of the launcher, which may then end it.
    pub(super) fn flush(&self) {
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        if self.tx.send(Chunk::Flushed(done)).is_ok() {
            let _ = wait.recv_timeout(Self::FLUSH_WAIT);
        }
    }

    pub(super) fn finish(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

/// Where a process's output goes: the server's own stdout and stderr (through the output
/// thread), or the launcher's connection (a job whose submitter prints it): there it is
/// queued before the process's end, which the server reports on the same connection.
#[derive(Clone)]
pub(super) enum Sink {
    Local(std::sync::mpsc::Sender<Chunk>),
    Launcher(NsId, Rank, tokio::sync::mpsc::UnboundedSender<Vec<u8>>),
}

impl Sink {
    fn send(&self, stderr: bool, bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        match self {
            Sink::Local(tx) => {
                let _ = tx.send(Chunk::Data(stderr, bytes));
            }
            Sink::Launcher(ns, rank, tx) => {
                let msg = ToLauncher::Output {
                    ns: *ns,
                    rank: *rank,
                    stderr,
                    bytes,
                };
                let _ = tx.send(crate::wire::frame::encode(&msg));
            }
        }
    }
}

/// The `--tag-output` prefix of a line of rank `rank`'s `stream` ("stdout" or "stderr"),
/// if the job asked for tags: `[job,rank]<stream>: `.
pub(super) fn output_tag(plan: &JobPlan, rank: Rank, stream: &str) -> Option<String> {
    plan.tag_output
        .then(|| format!("[{},{rank}]<{stream}>: ", plan.job_id))
}

pub(super) async fn forward(
    mut r: impl tokio::io::AsyncRead + Unpin,
    is_err: bool,
    tag: Option<String>,
    tx: Sink,
) {
    // Whole lines are passed on as they complete, so that the output of processes on
    // other nodes (other servers writing to the same terminal) never lands inside a line
    // written in pieces (`eprintln!` makes several writes). A partial line is passed on
    // when no more comes for a moment (a prompt), when it grows large, or at the end;
    // with --tag-output only at a newline, the end, or when large.
    let mut buf = vec![0u8; 64 << 10];
    let mut pending: Vec<u8> = Vec::new();
    let lines = |bytes: Vec<u8>| -> Vec<u8> {
        match &tag {
            None => bytes,
            Some(t) => {
                let mut out = Vec::with_capacity(bytes.len() + t.len());
                for l in bytes.split_inclusive(|&b| b == b'\n') {
                    out.extend_from_slice(t.as_bytes());
                    out.extend_from_slice(l);
                }
                out
            }
        }
    };
    loop {
        let got = if pending.is_empty() || tag.is_some() {
            Some(r.read(&mut buf).await)
        } else {
            tokio::time::timeout(PARTIAL_LINE_WAIT, r.read(&mut buf))
                .await
                .ok()
        };
        let n = match got {
            None => {
                tx.send(is_err, std::mem::take(&mut pending));
                continue;
            }
            Some(Ok(0) | Err(_)) => break,
            Some(Ok(n)) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        let cut = match pending.iter().rposition(|&b| b == b'\n') {
            Some(i) => i + 1,
            None if pending.len() >= PARTIAL_LINE_MAX => pending.len(),
            None => continue,
        };
        let rest = pending.split_off(cut);
        let done = std::mem::replace(&mut pending, rest);
        tx.send(is_err, lines(done));
    }
    if !pending.is_empty() {
        if tag.is_some() {
            pending.push(b'\n');
        }
        tx.send(is_err, lines(pending));
    }
}

/// How long a partial output line waits for the rest before it is passed on.
pub(super) const PARTIAL_LINE_WAIT: Duration = Duration::from_millis(20);
/// A partial output line this long is passed on as it is.
pub(super) const PARTIAL_LINE_MAX: usize = 64 << 10;
