//! Running schedules (`crate::sched`): each started schedule is a request whose id has
//! [`SCHED_BIT`] set; `progress` advances every running one: when a round's messages have
//! all completed, the next round's local steps run and its messages are posted.
//!
//! A schedule fails when one of its messages fails, when a message has another size than
//! its step expects, or when a member of its communicator failed (died, exited before
//! finalize: checked with the other dead-peer checks, so a collective fails at every
//! survivor even when it waits on a live member that itself failed; a member that
//! finalized cleanly, after its part, fails only what still waits on it), or when
//! another member tells that its part failed. A member whose schedule fails tells every
//! other live member (a COLL_ABORT frame naming the operation by context id and tag), so
//! that a disagreement one member sees never leaves another waiting. A failing schedule
//! lets go of the caller's buffers before it completes: receives not matched yet are
//! cancelled, sends no receiver has started on are abandoned, and the others (their peer
//! is moving the data) finish.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::wire::{Envelope, Frame};
use super::{Engine, Kind, Req};
use crate::sched::{Buf, Bufs, Schedule, Slice, Step};
use crate::{P2pError, RankMap, Status};

/// Bytes of scratch buffers kept for later schedules, at most.
const SCRATCH_POOL_BYTES: usize = 64 << 20;

/// How long a schedule that failed because a member finalized mid-operation waits for the
/// cause (a member's death or abort, on its way) before reporting the finalize, and one
/// that a transport saw a member leave (a reset connection) waits for the wire-up to say
/// how it ended (exit code, signal).
const ECHO_GRACE: Duration = Duration::from_millis(250);

/// Bytes of the reason an abort carries, at most.
const MAX_ABORT_REASON: usize = 512;

/// Marks a request id as a schedule's.
pub(crate) const SCHED_BIT: u32 = 1 << 31;

/// Another member's abort of a collective operation (a COLL_ABORT frame): who sent it,
/// why, and, when its failure was a member gone, which one (job rank), so that every
/// survivor names the member that is gone rather than the member that told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Abort {
    /// The member that failed its part (job rank).
    pub(crate) from: u32,
    /// Its error; when `gone` is set, only how that member ended.
    pub(crate) why: String,
    /// The member whose end failed the operation (job rank).
    pub(crate) gone: Option<u32>,
}

impl Abort {
    /// The abort of a schedule that failed with `e`: the gone member, if that is why,
    /// and the reason (a COLL_ABORT frame's fields).
    pub(crate) fn encode(e: &P2pError) -> (Option<u32>, Vec<u8>) {
        let (gone, why) = match e {
            P2pError::PeerGone { rank, reason } => (Some(*rank), reason.clone()),
            e => (None, e.to_string()),
        };
        let mut why = why.into_bytes();
        why.truncate(MAX_ABORT_REASON);
        (gone, why)
    }

    /// The abort a COLL_ABORT frame from `from` carries.
    pub(crate) fn decode(from: u32, gone: Option<u32>, why: &[u8]) -> Abort {
        Abort {
            from,
            why: String::from_utf8_lossy(why).into_owned(),
            gone,
        }
    }
}

/// Where a failing schedule is in waiting for a better account of its failure (a member
/// that only finalized, or that only a transport saw go: see `Engine::may_improve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Echo {
    /// Not considered yet (the schedule has not failed).
    Unarmed,
    /// Waiting until then.
    Until(Instant),
    /// The failure is reported as it stands.
    Settled,
}

/// The started schedules, and what later ones reuse.
#[derive(Default)]
pub(crate) struct Scheds {
    /// By slot.
    pub(crate) runs: Vec<Option<SchedRun>>,
    /// Free slots of `runs`.
    pub(crate) free: Vec<u32>,
    /// Schedules in `runs` (running or done but not taken).
    pub(crate) active: usize,
    /// Collective operations (context id, tag) another member aborted: by whom, why.
    pub(crate) aborted: std::collections::HashMap<(u64, u32), Abort>,
    /// Scratch buffers of finished schedules, for the next ones, and their bytes.
    pub(crate) pool: Vec<Vec<u128>>,
    pub(crate) pooled: usize,
}

/// A started schedule.
pub(crate) struct SchedRun {
    pub(crate) sched: Schedule,
    /// The caller's buffers.
    bufs: UserBufs,
    pub(crate) scratch: Vec<Vec<u128>>,
    /// The collective plane's context id.
    pub(crate) ctx: u64,
    /// Communicator rank -> job rank (`None`: the identity).
    pub(crate) map: Option<Arc<RankMap>>,
    /// The communicator's size.
    pub(crate) size: u32,
    /// The next round to start.
    round: usize,
    pending: Vec<Sub>,
    failing: Option<P2pError>,
    /// The others were told of the failure (or told us of theirs).
    abort_sent: bool,
    /// The operation's tag (its first message's), which names it in an abort.
    tag: Option<u32>,
    /// Whether a failure waits for a better account of itself (`better_cause`).
    echo: Echo,
    result: Option<Result<Status, P2pError>>,
    serial: u64,
}

// SAFETY: the raw pointers (in `bufs`) are the caller's buffers, borrowed (by the
// blocking call or the scope of the `Request`) until the schedule completes; the engine
// that holds the run is only touched under its lock, as for `Kind`.
unsafe impl Send for SchedRun {}

/// A schedule's send and receive buffers: the caller's, borrowed until it completes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UserBufs {
    send: *const u8,
    send_len: usize,
    recv: *mut u8,
    recv_len: usize,
}

impl UserBufs {
    /// The caller's `send` and `recv`, which it keeps borrowed until the schedule that
    /// takes them completes.
    pub(crate) fn new(send: &[u8], recv: &mut [u8]) -> UserBufs {
        UserBufs {
            send: send.as_ptr(),
            send_len: send.len(),
            recv: recv.as_mut_ptr(),
            recv_len: recv.len(),
        }
    }
}

impl SchedRun {
    /// A run of `sched` over the given buffers (checked already).
    pub(crate) fn new(
        sched: Schedule,
        bufs: UserBufs,
        ctx: u64,
        map: Option<Arc<RankMap>>,
        size: u32,
    ) -> SchedRun {
        let tag = sched.steps.iter().find_map(|s| match s {
            Step::Send { tag, .. } | Step::Recv { tag, .. } => Some(*tag),
            _ => None,
        });
        let scratch = Vec::new();
        SchedRun {
            sched,
            bufs,
            scratch,
            ctx,
            map,
            size,
            round: 0,
            pending: Vec::new(),
            failing: None,
            abort_sent: false,
            tag,
            echo: Echo::Unarmed,
            result: None,
            serial: 0,
        }
    }

    fn job(&self, r: u32) -> u32 {
        match &self.map {
            None => r,
            Some(m) => m.to_job[r as usize],
        }
    }

    fn ptr(&mut self, s: Slice) -> *mut u8 {
        match s.buf {
            // Only read through (sends); the cast keeps one pointer type.
            Buf::Send => self.bufs.send.cast_mut().wrapping_add(s.off),
            Buf::Recv => self.bufs.recv.wrapping_add(s.off),
            Buf::Scratch(n) => self.scratch[n as usize]
                .as_mut_ptr()
                .cast::<u8>()
                .wrapping_add(s.off),
        }
    }

    /// Runs local step `i` (a copy or a closure) over the buffers.
    fn run_local(&mut self, i: usize) {
        let UserBufs {
            send,
            send_len,
            recv,
            recv_len,
        } = self.bufs;
        let send: &[u8] = if send_len == 0 {
            &[]
        } else {
            // SAFETY: the caller's send buffer, borrowed until the schedule completes;
            // only read.
            unsafe { std::slice::from_raw_parts(send, send_len) }
        };
        let recv: &mut [u8] = if recv_len == 0 {
            &mut []
        } else {
            // SAFETY: the caller's receive buffer, borrowed mutably until the schedule
            // completes; local steps run between rounds, when none of the schedule's
            // messages is in flight, so nothing else touches it meanwhile.
            unsafe { std::slice::from_raw_parts_mut(recv, recv_len) }
        };
        let mut bufs = Bufs {
            send,
            recv,
            scratch: &mut self.scratch,
        };
        match &mut self.sched.steps[i] {
            Step::Copy { from, to } => {
                let (f, t) = bufs.pair(*from, *to);
                t.copy_from_slice(f);
            }
            Step::Local(f) => f(&mut bufs),
            Step::Send { .. } | Step::Recv { .. } => {}
        }
    }
}

/// A message of a running schedule.
#[derive(Debug, Clone, Copy)]
struct Sub {
    id: u32,
    /// For a receive: (job rank of the sender, expected bytes).
    recv: Option<(u32, usize)>,
}

impl Engine {
    /// Starts a schedule; returns its request id. Its first rounds run at once.
    pub(crate) fn start_sched(&mut self, mut run: SchedRun) -> u32 {
        let st = &mut self.st;
        // Scratch buffers from the pool of earlier schedules' (no page faults, no
        // zeroing on the way: a schedule writes its scratch before reading it).
        run.scratch = run
            .sched
            .scratch
            .iter()
            .map(|&b| {
                let words = b.div_ceil(16);
                match st.scheds.pool.iter().position(|v| v.capacity() >= words) {
                    Some(i) => {
                        let mut v = st.scheds.pool.swap_remove(i);
                        st.scheds.pooled -= v.capacity() * 16;
                        v.resize(words, 0);
                        v
                    }
                    None => vec![0u128; words],
                }
            })
            .collect();
        run.serial = st.reqs.next_serial;
        st.reqs.next_serial += 1;
        let slot = match st.scheds.free.pop() {
            Some(s) => s,
            None => {
                st.scheds.runs.push(None);
                st.scheds.runs.len() as u32 - 1
            }
        };
        self.advance(&mut run);
        self.st.scheds.runs[slot as usize] = Some(run);
        self.st.scheds.active += 1;
        slot | SCHED_BIT
    }

    /// Advances every running schedule.
    pub(crate) fn advance_scheds(&mut self) {
        for i in 0..self.st.scheds.runs.len() {
            let Some(mut run) = self.st.scheds.runs[i].take() else {
                continue;
            };
            if run.result.is_none() {
                self.advance(&mut run);
            }
            self.st.scheds.runs[i] = Some(run);
        }
    }

    /// Takes a completed schedule's result (freeing its slot), `None` while it runs.
    pub(crate) fn take_sched(&mut self, id: u32) -> Option<Result<Status, P2pError>> {
        let slot = (id & !SCHED_BIT) as usize;
        let done = self
            .st
            .scheds
            .runs
            .get(slot)?
            .as_ref()
            .is_some_and(|r| r.result.is_some());
        if !done {
            return None;
        }
        let mut run = self.st.scheds.runs[slot].take()?;
        self.st.scheds.free.push(slot as u32);
        self.st.scheds.active -= 1;
        for mut v in run.scratch.drain(..) {
            let bytes = v.capacity() * 16;
            if self.st.scheds.pooled + bytes <= SCRATCH_POOL_BYTES {
                v.clear();
                self.st.scheds.pooled += bytes;
                self.st.scheds.pool.push(v);
            }
        }
        run.result
    }

    /// The serial of schedule `id` while the engine holds it.
    pub(crate) fn sched_serial(&self, id: u32) -> Option<u64> {
        let slot = (id & !SCHED_BIT) as usize;
        self.st.scheds.runs.get(slot)?.as_ref().map(|r| r.serial)
    }

    /// The dead-peer check of a schedule: fails it if a member of its communicator
    /// failed, and runs the check of each of its messages (which fail on a peer they
    /// wait on that is gone in any way, or whose connection failed).
    pub(crate) fn sched_fail_if_gone(&mut self, id: u32) {
        let slot = (id & !SCHED_BIT) as usize;
        let Some(mut run) = self.st.scheds.runs.get_mut(slot).and_then(Option::take) else {
            return;
        };
        if run.result.is_none() {
            if run.failing.is_none() {
                run.failing = self.failed_member(&run);
            }
            for sub in run.pending.clone() {
                self.fail_if_gone(sub.id);
            }
            self.advance(&mut run);
        }
        self.st.scheds.runs[slot] = Some(run);
    }

    /// A member of the schedule's communicator that failed (died, exited before
    /// finalize), as the error to fail it with. A member that finalized cleanly fails
    /// only what waits on it (its messages' own checks).
    fn failed_member(&self, run: &SchedRun) -> Option<P2pError> {
        (0..run.size).find_map(|r| {
            let job = run.job(r);
            if job == self.st.me {
                return None;
            }
            (self.st.wireup.gone)(job)
                .filter(|w| w != weft_wireup::FINALIZED)
                .map(|reason| P2pError::PeerGone { rank: job, reason })
        })
    }

    /// Another member's abort of this schedule's operation, if one came: the member it
    /// names gone (how it ended as this process's wire-up knows it, else as the aborting
    /// member saw it), or the aborting member and its error.
    fn abort_of(&self, run: &SchedRun) -> Option<P2pError> {
        let a = self.st.scheds.aborted.get(&(run.ctx, run.tag?))?;
        Some(match a.gone {
            Some(rank) => P2pError::PeerGone {
                rank,
                reason: (self.st.wireup.gone)(rank).unwrap_or_else(|| a.why.clone()),
            },
            None => P2pError::Aborted {
                rank: a.from,
                reason: a.why.clone(),
            },
        })
    }

    /// A better account of `failing` than it gives, if one is known now: a member that
    /// died (by the wire-up), or another member's abort, rather than a member that only
    /// finalized; how a member the transport saw go ended, once the wire-up knows.
    fn better_cause(&self, run: &SchedRun, failing: &P2pError) -> Option<P2pError> {
        if let Some(cause) = self.failed_member(run) {
            return Some(cause);
        }
        let P2pError::PeerGone { rank, reason } = failing else {
            return None;
        };
        if reason == weft_wireup::FINALIZED {
            return self.abort_of(run).filter(|a| a != failing);
        }
        (self.st.wireup.gone)(*rank)
            .filter(|why| why != reason)
            .map(|why| P2pError::PeerGone {
                rank: *rank,
                reason: why,
            })
    }

    /// Whether `e` may still be replaced by a better account (see `better_cause`): a
    /// member reported gone by a transport before the wire-up said how it ended, or one
    /// that only finalized (most likely after failing the operation itself: its cause
    /// may still be on its way).
    fn may_improve(&self, e: &P2pError) -> bool {
        match e {
            P2pError::PeerGone { rank, reason } => {
                reason == weft_wireup::FINALIZED || (self.st.wireup.gone)(*rank).is_none()
            }
            _ => false,
        }
    }

    /// Advances one schedule as far as its messages allow.
    fn advance(&mut self, run: &mut SchedRun) {
        loop {
            // Collect what completed.
            let mut i = 0;
            while i < run.pending.len() {
                let sub = run.pending[i];
                match self.take(sub.id) {
                    None => i += 1,
                    Some(r) => {
                        run.pending.swap_remove(i);
                        match (r, sub.recv) {
                            (Ok(st), Some((from, want))) if st.count != want => {
                                run.failing.get_or_insert(P2pError::SizeMismatch {
                                    rank: from,
                                    tag: st.tag,
                                    expected: want,
                                    got: st.count,
                                });
                            }
                            (Ok(_), _) => {}
                            // A message larger than its step's exact size: the members
                            // disagree, as with a smaller one.
                            (
                                Err(P2pError::Truncated {
                                    sender,
                                    tag,
                                    size,
                                    capacity,
                                }),
                                _,
                            ) => {
                                run.failing.get_or_insert(P2pError::SizeMismatch {
                                    rank: sender,
                                    tag,
                                    expected: capacity,
                                    got: size,
                                });
                            }
                            (Err(e @ P2pError::PeerGone { .. }), _) if run.failing.is_none() => {
                                // A peer gone in any way; the cause, when another member
                                // died or aborted first, says more (a member that ended
                                // after its own failure is the usual echo).
                                let cause = self.failed_member(run).or_else(|| self.abort_of(run));
                                run.failing = Some(cause.unwrap_or(e));
                            }
                            (Err(e), _) => {
                                run.failing.get_or_insert(e);
                            }
                        }
                    }
                }
            }
            if run.failing.is_none() {
                if let Some(aborted) = self.abort_of(run) {
                    // Another member failed its part; if a member died, say so (the
                    // abort most likely comes from that).
                    run.failing = Some(self.failed_member(run).unwrap_or(aborted));
                    run.abort_sent = true;
                }
            }
            if let Some(failing) = &run.failing {
                if run.echo == Echo::Unarmed {
                    // Once, whatever failed it first (a receive, a send, an abort).
                    run.echo = match self.may_improve(failing) {
                        true => Echo::Until(Instant::now() + ECHO_GRACE),
                        false => Echo::Settled,
                    };
                }
                if let Echo::Until(until) = run.echo {
                    if let Some(cause) = self.better_cause(run, failing) {
                        if !self.may_improve(&cause) || Instant::now() >= until {
                            run.echo = Echo::Settled;
                        }
                        run.failing = Some(cause);
                    } else if Instant::now() >= until {
                        run.echo = Echo::Settled;
                    }
                }
                if !run.abort_sent {
                    run.abort_sent = true;
                    self.tell_abort(run);
                }
                self.let_go(run);
                if run.pending.is_empty() && !matches!(run.echo, Echo::Until(_)) {
                    run.result = run.failing.take().map(Err);
                }
                return;
            }
            if !run.pending.is_empty() {
                return;
            }
            if run.round >= run.sched.rounds.len() {
                run.result = Some(Ok(Status {
                    source: self.st.me,
                    tag: 0,
                    count: run.bufs.recv_len,
                }));
                return;
            }
            let start = run.sched.rounds[run.round];
            let end = run
                .sched
                .rounds
                .get(run.round + 1)
                .copied()
                .unwrap_or(run.sched.steps.len());
            run.round += 1;
            for i in start..end {
                match run.sched.steps[i] {
                    Step::Send { from, to, tag } => {
                        let job = run.job(to);
                        let p = run.ptr(from);
                        match self.st.send(p, from.len, job, run.ctx, tag) {
                            Ok(None) => {}
                            Ok(Some(id)) => run.pending.push(Sub { id, recv: None }),
                            Err(e) => {
                                run.failing.get_or_insert(e);
                                break;
                            }
                        }
                    }
                    Step::Recv { into, from, tag } => {
                        let job = run.job(from);
                        let p = run.ptr(into);
                        let id = self.st.recv(p, into.len, run.ctx, Some(job), Some(tag));
                        run.pending.push(Sub {
                            id,
                            recv: Some((job, into.len)),
                        });
                    }
                    Step::Copy { .. } | Step::Local(_) => run.run_local(i),
                }
            }
        }
    }

    /// Tells every other live member that this schedule failed (a COLL_ABORT frame), so
    /// that none waits for a message from this process that will not come.
    fn tell_abort(&mut self, run: &SchedRun) {
        let Some(tag) = run.tag else {
            return;
        };
        let Some(failing) = &run.failing else {
            return;
        };
        let (gone, why) = Abort::encode(failing);
        let env = Envelope {
            src: self.st.me,
            ctx: run.ctx,
            tag,
        };
        let f = Frame::CollAbort {
            env,
            gone,
            why: &why,
        };
        let hdr = f.head();
        for r in 0..run.size {
            let job = run.job(r);
            if job == self.st.me
                || (self.st.wireup.gone)(job).is_some()
                || self.st.ends.failed.contains_key(&job)
            {
                continue;
            }
            if self.st.path(job).is_ok() {
                self.st.push(job, &hdr, &why);
            }
        }
    }

    /// A failing schedule lets go of its messages that can be let go: receives not
    /// matched yet are cancelled, sends that no receiver has started on are abandoned.
    fn let_go(&mut self, run: &mut SchedRun) {
        run.pending.retain(|sub| {
            if sub.recv.is_some() {
                !self.cancel_recv(sub.id)
            } else {
                !self.abandon_send(sub.id)
            }
        });
    }

    /// Forgets a send whose receiver has not started on it (no stream, no copy): the
    /// engine never touches its buffer again, and a late answer for it is stale. Returns
    /// false if the send must be waited for.
    fn abandon_send(&mut self, id: u32) -> bool {
        let st = &mut self.st;
        let ok = matches!(
            st.reqs.slots.get(id as usize),
            Some(Some(Req {
                kind: Kind::Send { stream: None, .. },
                ..
            }))
        ) && !st.copying(id);
        if !ok {
            return false;
        }
        if let Some(Some(Req {
            kind:
                Kind::Send {
                    registered: Some(region),
                    ..
                },
            result: None,
            ..
        })) = st.reqs.slots.get(id as usize)
        {
            let region = *region;
            st.release_region(region);
        }
        st.reqs.slots[id as usize] = None;
        st.reqs.free.push(id);
        true
    }
}
