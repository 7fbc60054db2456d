//! Copies between two processes' memories (`process_vm_readv` / `process_vm_writev`) of
//! the split single-copy rendezvous, run without the engine lock.
//!
//! The engine queues a [`CopyJob`] (of at least 512 KiB: the halves of messages from 1 MiB)
//! instead of copying; a thread in a wait loop takes the
//! jobs ([`Engine::take_copies`]), lets go of the engine, runs them, and hands the
//! results back ([`Engine::copies_done`]), so a large copy never stalls the process's
//! other threads. A job that no wait loop took within one progress pass is run by the
//! next pass, under the lock, so nothing depends on a wait loop coming by. A request with
//! a copy queued or running is never failed under it (`Engine::fail_if_gone`).

use super::{Engine, Req, State};

/// Copies shorter than this run at once, under the lock (up to ~30 us; handing
/// them to a wait loop measured 5-10% slower for 64 and 256 KiB messages).
const DEFER_MIN: usize = 512 << 10;

/// Copies queued for a caller to run without the lock, and those running.
#[derive(Debug, Default)]
pub(super) struct Copies {
    /// Queued.
    pub(super) jobs: Vec<CopyJob>,
    /// Requests whose copies a caller runs now.
    pub(super) in_flight: Vec<u32>,
    /// Progress passes so far (how old a queued copy is).
    pub(super) pass: u64,
}

/// What a copy does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CopyWhat {
    /// The receiver reads part of a split message from rank `from` into its buffer.
    Read { from: u32 },
    /// The sender writes the tail of its message into the receiver (rank `to`); CMA_DONE
    /// answers receive `rreq` (of serial `rserial`).
    Write {
        to: u32,
        tag: u32,
        rreq: u32,
        rserial: [u8; 8],
    },
}

/// One queued copy.
#[derive(Debug)]
pub(crate) struct CopyJob {
    /// The engine pass it was queued in.
    pass: u64,
    /// The request it serves, and that request's serial (results for a request that is
    /// no longer the one it was are dropped).
    id: u32,
    serial: u64,
    what: CopyWhat,
    /// The other process, and the address in it.
    pid: i32,
    remote: usize,
    /// This process's memory: `len` bytes of the request's buffer.
    local: *mut u8,
    len: usize,
}

// SAFETY: `local` is a user buffer borrowed by the request the job serves (`&mut [T]` or
// `&[T]` of `Pod` data, themselves `Send`) until that request completes, which it cannot
// while the job exists; the engine holding the job is only touched under its lock, and a
// job taken out is run by the thread that took it.
unsafe impl Send for CopyJob {}

/// A copy that ran, and how it went.
#[derive(Debug)]
pub(crate) struct CopyDone {
    job: CopyJob,
    res: std::io::Result<()>,
}

impl CopyJob {
    /// Runs the copy (one system call; no engine state touched).
    pub(crate) fn run(self) -> CopyDone {
        let res = match self.what {
            CopyWhat::Read { .. } => {
                // SAFETY: `local` is `len` bytes of a live receive's buffer that nothing
                // else writes meanwhile: the request cannot complete while its copy is
                // queued or running (it completes through `copies_done`, and
                // `fail_if_gone` skips it), and the sender does not write these bytes.
                let dst = unsafe { std::slice::from_raw_parts_mut(self.local, self.len) };
                weft_shm::cma_read(self.pid, self.remote, dst)
            }
            CopyWhat::Write { .. } => {
                // SAFETY: `local` is `len` bytes of a live send's buffer: the send
                // completes only on FIN, which the receiver sends after this copy's
                // CMA_DONE, and `fail_if_gone` skips it while the copy is queued or runs.
                let src = unsafe { std::slice::from_raw_parts(self.local.cast_const(), self.len) };
                weft_shm::cma_write(self.pid, self.remote, src)
            }
        };
        CopyDone { job: self, res }
    }
}

impl State {
    /// Queues a copy for request `id` (run without the lock by a wait loop, or by the
    /// next progress pass).
    pub(super) fn queue_copy(
        &mut self,
        id: u32,
        what: CopyWhat,
        pid: i32,
        remote: usize,
        local: *mut u8,
        len: usize,
    ) {
        let serial = self
            .reqs
            .slots
            .get(id as usize)
            .and_then(|r| r.as_ref())
            .map_or(0, |r: &Req| r.serial);
        let job = CopyJob {
            pass: self.copies.pass,
            id,
            serial,
            what,
            pid,
            remote,
            local,
            len,
        };
        if len < DEFER_MIN {
            // Short enough that handing it over costs more than it holds the lock.
            let d = job.run();
            return self.copy_done(d);
        }
        self.copies.jobs.push(job);
    }

    /// Whether request `id` has a copy queued or running.
    pub(super) fn copying(&self, id: u32) -> bool {
        self.copies.in_flight.contains(&id) || self.copies.jobs.iter().any(|j| j.id == id)
    }

    /// Runs, under the lock, the copies that no wait loop took since an earlier pass.
    pub(super) fn run_stale_copies(&mut self) {
        let pass = self.copies.pass;
        let mut stale = Vec::new();
        self.copies.jobs.retain_mut(|j| {
            if j.pass + 1 < pass {
                stale.push(CopyJob {
                    pass: j.pass,
                    id: j.id,
                    serial: j.serial,
                    what: j.what,
                    pid: j.pid,
                    remote: j.remote,
                    local: j.local,
                    len: j.len,
                });
                false
            } else {
                true
            }
        });
        for j in stale {
            let d = j.run();
            self.copy_done(d);
        }
    }

    /// Accounts for a copy that ran.
    fn copy_done(&mut self, d: CopyDone) {
        let CopyDone { job, res } = d;
        if let Some(i) = self.copies.in_flight.iter().position(|&x| x == job.id) {
            self.copies.in_flight.swap_remove(i);
        }
        let live = self
            .reqs
            .slots
            .get(job.id as usize)
            .and_then(|r| r.as_ref())
            .is_some_and(|r| r.serial == job.serial && r.result.is_none());
        match job.what {
            CopyWhat::Read { from } => {
                if !live {
                    return;
                }
                if let Err(e) = res {
                    let reason = format!("single-copy read from rank {from} failed: {e}");
                    self.split_error(job.id, reason);
                }
                self.split_progress(job.id, from, job.len);
            }
            CopyWhat::Write {
                to,
                tag,
                rreq,
                rserial,
            } => {
                let (written, why) = match res {
                    Ok(()) => (job.len as u64, String::new()),
                    // The receiver reads the part itself.
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::Unsupported
                        ) =>
                    {
                        (0, String::new())
                    }
                    Err(e) => (0, format!("single-copy write to rank {to} failed: {e}")),
                };
                self.cma_done(to, tag, rreq, rserial, written, &why);
            }
        }
    }
}

impl Engine {
    /// Whether copies wait to be run.
    #[inline(always)]
    pub(crate) fn has_copies(&self) -> bool {
        !self.st.copies.jobs.is_empty()
    }

    /// Takes the queued copies, to run without the engine lock; hand the results back
    /// with [`Engine::copies_done`].
    pub(crate) fn take_copies(&mut self) -> Vec<CopyJob> {
        let jobs = std::mem::take(&mut self.st.copies.jobs);
        self.st.copies.in_flight.extend(jobs.iter().map(|j| j.id));
        jobs
    }

    /// Accounts for copies taken with [`Engine::take_copies`] that ran.
    pub(crate) fn copies_done(&mut self, done: Vec<CopyDone>) {
        for d in done {
            self.st.copy_done(d);
        }
    }
}
