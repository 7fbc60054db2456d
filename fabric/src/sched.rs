//! Schedules: the building block of collectives.
//!
//! A [`Schedule`] is a list of rounds; each round runs its local steps (copies, and
//! closures such as a reduction) in order, then posts its sends and receives, and ends
//! when all of them have completed. The next round starts then. The fabric runs a
//! started schedule inside its progress, like any other request: a non-blocking
//! collective is a schedule behind a [`Request`], and it advances
//! whenever the program waits on or tests anything.
//!
//! Steps name byte ranges ([`Slice`]) of three kinds of buffers ([`Buf`]): the caller's
//! send buffer (read only), its receive buffer, and scratch buffers the schedule owns
//! (16-byte aligned). Messages travel on the communicator's collective plane (its
//! context id with [`COLL_PLANE`] set), so they never match point-to-point receives.
//! Ranks are the communicator's.
//!
//! The schedule's messages carry the tags the builder gives them; a collective library
//! makes them unique per operation (for example from a per-communicator sequence
//! number), so that operations running at once never match each other's messages.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::engine::{SchedRun, UserBufs};
use crate::{CommShared, Communicator, P2pError, Pod, RankMap, Request, RequestScope};

/// The bit of a context id that marks collective traffic: a communicator's collective
/// messages travel with its context id with this bit set. No communicator's own id has
/// it.
pub const COLL_PLANE: u64 = 1 << 63;

/// The bit of a context id that marks ids derived locally from a parent's (by a
/// collective library's dup and split), never handed out by the root server, whose
/// PGCIDs count up from 1.
pub const DERIVED_CTX: u64 = 1 << 62;

/// Which buffer a [`Slice`] lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The caller's send buffer (read only).
    Send,
    /// The caller's receive buffer.
    Recv,
    /// Scratch buffer `n` of the schedule ([`Schedule::scratch`]).
    Scratch(u32),
}

impl Buf {
    /// The `len` bytes at offset `off` of this buffer.
    #[inline]
    pub fn at(self, off: usize, len: usize) -> Slice {
        Slice {
            buf: self,
            off,
            len,
        }
    }
}

/// A byte range of one of a schedule's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slice {
    /// The buffer.
    pub buf: Buf,
    /// Offset in bytes.
    pub off: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Slice {
    fn end(&self) -> usize {
        self.off.saturating_add(self.len)
    }
    fn overlaps(&self, o: &Slice) -> bool {
        self.buf == o.buf && self.off < o.end() && o.off < self.end() && self.len > 0 && o.len > 0
    }
}

/// A local step: runs with the schedule's buffers (see [`Bufs`]).
pub type LocalStep = Box<dyn FnMut(&mut Bufs<'_>) + Send>;

pub(crate) enum Step {
    Send { from: Slice, to: u32, tag: u32 },
    Recv { into: Slice, from: u32, tag: u32 },
    Copy { from: Slice, to: Slice },
    Local(LocalStep),
}

/// The rounds of a collective operation, built up front and run by the fabric (see the
/// module's documentation).
#[derive(Default)]
pub struct Schedule {
    pub(crate) steps: Vec<Step>,
    /// Where each round starts in `steps`.
    pub(crate) rounds: Vec<usize>,
    /// Scratch buffer sizes in bytes.
    pub(crate) scratch: Vec<usize>,
    /// The current round has posted steps (a local step then opens a new round).
    posting: bool,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("steps", &self.steps.len())
            .field("rounds", &self.rounds.len())
            .field("scratch", &self.scratch)
            .finish()
    }
}

impl Schedule {
    /// An empty schedule (it completes at once).
    pub fn new() -> Schedule {
        Schedule::default()
    }

    /// A scratch buffer of `bytes` bytes (16-byte aligned, contents unspecified until the
    /// schedule writes them), owned by the schedule.
    pub fn scratch(&mut self, bytes: usize) -> Buf {
        self.scratch.push(bytes);
        Buf::Scratch(self.scratch.len() as u32 - 1)
    }

    /// Ends the current round: later steps start once its messages have completed.
    pub fn round(&mut self) {
        if self.rounds.last().is_none_or(|&s| s < self.steps.len()) {
            self.rounds.push(self.steps.len());
        }
        self.posting = false;
    }

    fn local_step(&mut self, s: Step) {
        if self.posting || self.rounds.is_empty() {
            self.round();
        }
        self.steps.push(s);
    }

    fn posted_step(&mut self, s: Step) {
        if self.rounds.is_empty() {
            self.round();
        }
        self.posting = true;
        self.steps.push(s);
    }

    /// Sends `from` to rank `to` with `tag`, in the current round.
    pub fn send(&mut self, from: Slice, to: u32, tag: u32) {
        self.posted_step(Step::Send { from, to, tag });
    }

    /// Receives from rank `from` with `tag` into `into`, in the current round. The
    /// message must be exactly `into.len` bytes long: a shorter or longer one fails the
    /// schedule (members of a collective that disagree on its arguments).
    pub fn recv(&mut self, into: Slice, from: u32, tag: u32) {
        self.posted_step(Step::Recv { into, from, tag });
    }

    /// Copies `from` to `to` (the same length) before the current round's messages (a
    /// new round if the current one has messages already).
    pub fn copy(&mut self, from: Slice, to: Slice) {
        self.local_step(Step::Copy { from, to });
    }

    /// Runs `f` before the current round's messages (a new round if the current one has
    /// messages already).
    pub fn local(&mut self, f: impl FnMut(&mut Bufs<'_>) + Send + 'static) {
        self.local_step(Step::Local(Box::new(f)));
    }

    /// Appends `other`'s rounds after this schedule's. `other` must have no scratch
    /// buffers (its local steps could not be renumbered); panics otherwise.
    pub fn append(&mut self, other: Schedule) {
        assert!(
            other.scratch.is_empty(),
            "Schedule::append: the appended schedule has scratch buffers"
        );
        self.round();
        let base = self.steps.len();
        self.rounds.extend(other.rounds.iter().map(|r| r + base));
        self.rounds.dedup();
        self.steps.extend(other.steps);
        self.posting = other.posting;
    }

    /// The ranks this schedule sends to.
    pub(crate) fn send_peers(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Send { to, .. } => Some(*to),
                _ => None,
            })
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Checks every step against the buffers' sizes and the communicator's size.
    pub(crate) fn check(&self, send: usize, recv: usize, size: u32) -> Result<(), String> {
        let cap = |b: Buf| match b {
            Buf::Send => Some(send),
            Buf::Recv => Some(recv),
            Buf::Scratch(n) => self.scratch.get(n as usize).copied(),
        };
        let fits = |s: &Slice| cap(s.buf).is_some_and(|c| s.off <= c && s.len <= c - s.off);
        for (i, step) in self.steps.iter().enumerate() {
            let bad = match step {
                Step::Send { from, to, .. } => (!fits(from))
                    .then(|| format!("sends {from:?}"))
                    .or_else(|| (*to >= size).then(|| format!("sends to rank {to}"))),
                Step::Recv { into, from, .. } => (!fits(into) || into.buf == Buf::Send)
                    .then(|| format!("receives into {into:?}"))
                    .or_else(|| (*from >= size).then(|| format!("receives from rank {from}"))),
                Step::Copy { from, to } => (!fits(from)
                    || !fits(to)
                    || to.buf == Buf::Send
                    || from.len != to.len
                    || from.overlaps(to))
                .then(|| format!("copies {from:?} to {to:?}")),
                Step::Local(_) => None,
            };
            if let Some(b) = bad {
                return Err(format!(
                    "step {i} {b}, outside buffers of {send} (send) and {recv} (receive) bytes, scratch {:?}, or a communicator of {size}",
                    self.scratch
                ));
            }
        }
        Ok(())
    }
}

/// The buffers of a running schedule, as a local step sees them.
pub struct Bufs<'a> {
    pub(crate) send: &'a [u8],
    pub(crate) recv: &'a mut [u8],
    pub(crate) scratch: &'a mut [Vec<u128>],
}

impl fmt::Debug for Bufs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bufs")
            .field("send", &self.send.len())
            .field("recv", &self.recv.len())
            .field("scratch", &self.scratch.len())
            .finish()
    }
}

fn scratch_bytes(v: &[u128]) -> &[u8] {
    as_bytes(v)
}

fn scratch_bytes_mut(v: &mut [u128]) -> &mut [u8] {
    as_bytes_mut(v)
}

impl Bufs<'_> {
    fn whole(&self, b: Buf) -> &[u8] {
        match b {
            Buf::Send => self.send,
            Buf::Recv => self.recv,
            Buf::Scratch(n) => scratch_bytes(&self.scratch[n as usize]),
        }
    }

    /// The bytes of `s`. Panics if `s` lies outside its buffer.
    pub fn bytes(&self, s: Slice) -> &[u8] {
        &self.whole(s.buf)[s.off..s.end()]
    }

    /// The bytes of `s`, writable. Panics if `s` lies outside its buffer or in the send
    /// buffer.
    pub fn bytes_mut(&mut self, s: Slice) -> &mut [u8] {
        let end = s.end();
        match s.buf {
            Buf::Send => panic!("a schedule's send buffer is read only"),
            Buf::Recv => &mut self.recv[s.off..end],
            Buf::Scratch(n) => &mut scratch_bytes_mut(&mut self.scratch[n as usize])[s.off..end],
        }
    }

    /// `from` to read and `to` to write at once. Panics if they overlap, if `to` is in
    /// the send buffer, or if either lies outside its buffer.
    pub fn pair(&mut self, from: Slice, to: Slice) -> (&[u8], &mut [u8]) {
        assert!(!from.overlaps(&to), "{from:?} overlaps {to:?}");
        let (fe, te) = (from.end(), to.end());
        match (from.buf, to.buf) {
            (_, Buf::Send) => panic!("a schedule's send buffer is read only"),
            (Buf::Send, Buf::Recv) => (&self.send[from.off..fe], &mut self.recv[to.off..te]),
            (Buf::Send, Buf::Scratch(n)) => (
                &self.send[from.off..fe],
                &mut scratch_bytes_mut(&mut self.scratch[n as usize])[to.off..te],
            ),
            (Buf::Recv, Buf::Recv) => split_pair(self.recv, from, to),
            (Buf::Recv, Buf::Scratch(n)) => (
                &self.recv[from.off..fe],
                &mut scratch_bytes_mut(&mut self.scratch[n as usize])[to.off..te],
            ),
            (Buf::Scratch(n), Buf::Recv) => (
                &scratch_bytes(&self.scratch[n as usize])[from.off..fe],
                &mut self.recv[to.off..te],
            ),
            (Buf::Scratch(a), Buf::Scratch(b)) if a == b => {
                split_pair(scratch_bytes_mut(&mut self.scratch[a as usize]), from, to)
            }
            (Buf::Scratch(a), Buf::Scratch(b)) => {
                let (a, b) = (a as usize, b as usize);
                let (lo, hi) = self.scratch.split_at_mut(a.max(b));
                let (x, y) = if a < b {
                    (&lo[a], &mut hi[0])
                } else {
                    // a > b: `hi[0]` is scratch a, `lo[b]` scratch b.
                    let (l, h) = (&mut lo[b], &hi[0]);
                    return (
                        &scratch_bytes(h)[from.off..fe],
                        &mut scratch_bytes_mut(l)[to.off..te],
                    );
                };
                (
                    &scratch_bytes(x)[from.off..fe],
                    &mut scratch_bytes_mut(y)[to.off..te],
                )
            }
        }
    }
}

/// Two disjoint ranges of one buffer, one to read and one to write.
fn split_pair(buf: &mut [u8], from: Slice, to: Slice) -> (&[u8], &mut [u8]) {
    if from.off < to.off {
        let (lo, hi) = buf.split_at_mut(to.off);
        (&lo[from.off..from.end()], &mut hi[..to.len])
    } else {
        let (lo, hi) = buf.split_at_mut(from.off);
        (&hi[..from.len], &mut lo[to.off..to.end()])
    }
}

impl Communicator {
    /// Runs `sched` over this communicator's collective plane and waits for it; `send`
    /// and `recv` are the buffers its steps call [`Buf::Send`] and [`Buf::Recv`].
    ///
    /// Fails (after letting go of the buffers) when a message fails, when one has
    /// another size than its step expects ([`P2pError::SizeMismatch`]), or when a member
    /// of the communicator is gone; a schedule whose steps lie outside the buffers is
    /// refused before it starts ([`P2pError::Schedule`]).
    pub fn run_schedule(
        &self,
        sched: Schedule,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<(), P2pError> {
        let id = self.start_schedule_raw(sched, send, recv)?;
        self.fix(self.wait_id(id)).map(|_| ())
    }

    /// Swaps `send` with member `peer`'s message of tag `tag` on this communicator's
    /// collective plane: the two-member step of a collective library without a schedule
    /// (a schedule costs a few hundred nanoseconds more, which counts when a message
    /// takes a microsecond or two). The peer's message must hold exactly `recv.len()`
    /// bytes, else [`P2pError::SizeMismatch`]; a peer that is gone fails it, and nothing
    /// refers to `recv` after it returns.
    pub fn coll_exchange(
        &self,
        peer: u32,
        tag: u32,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<(), P2pError> {
        if peer >= self.size {
            return Err(P2pError::InvalidRank {
                rank: peer,
                size: self.size,
            });
        }
        let job = self.job_rank(peer);
        let ctx = self.ctx | COLL_PLANE;
        self.inner.before_send(job);
        let mut e = self.inner.engine();
        let rid = e.recv(recv.as_mut_ptr(), recv.len(), ctx, Some(job), Some(tag));
        let sent = e.send(send.as_ptr(), send.len(), job, ctx, tag);
        drop(e);
        let sent = match sent {
            Ok(sid) => sid.map_or(Ok(()), |id| self.wait_id(id).map(|_| ())),
            Err(err) => Err(err),
        };
        if let Err(err) = sent {
            // Nothing may refer to `recv` after this returns: take the receive back, or
            // let it finish if it already matched.
            let cancelled = self.inner.engine().cancel_recv(rid);
            if !cancelled {
                let _ = self.wait_id(rid);
            }
            return Err(self.fix_err(err));
        }
        match self.wait_id(rid) {
            Ok(st) if st.count != recv.len() => Err(P2pError::SizeMismatch {
                rank: peer,
                tag,
                expected: recv.len(),
                got: st.count,
            }),
            Ok(_) => Ok(()),
            Err(P2pError::Truncated { size, capacity, .. }) => Err(P2pError::SizeMismatch {
                rank: peer,
                tag,
                expected: capacity,
                got: size,
            }),
            Err(err) => Err(self.fix_err(err)),
        }
    }

    /// Checks and starts `sched`; returns its request id. The caller keeps `send` and
    /// `recv` borrowed until the request completes.
    fn start_schedule_raw(
        &self,
        sched: Schedule,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<u32, P2pError> {
        sched
            .check(send.len(), recv.len(), self.size)
            .map_err(P2pError::Schedule)?;
        for to in sched.send_peers() {
            self.inner.before_send(self.job_rank(to));
        }
        let run = SchedRun::new(
            sched,
            UserBufs::new(send, recv),
            self.ctx | COLL_PLANE,
            self.map.clone(),
            self.size,
        );
        Ok(self.inner.engine().start_sched(run))
    }

    /// A communicator of the members `members` (ranks of this one, in the new order;
    /// this process among them) with context id `ctx`, made without any message: every
    /// member must call it with the same arguments. For collective libraries, whose
    /// dup and split agree on `members` and derive `ctx` (which must be unique in the
    /// job, never a PGCID the root server hands out, and without [`COLL_PLANE`]).
    pub fn derive(&self, members: &[u32], ctx: u64) -> Result<Communicator, P2pError> {
        if ctx & COLL_PLANE != 0 {
            return Err(P2pError::Schedule(format!(
                "context id {ctx:#x} has the collective plane's bit"
            )));
        }
        let mut job = Vec::with_capacity(members.len());
        for &m in members {
            if m >= self.size {
                return Err(P2pError::InvalidRank {
                    rank: m,
                    size: self.size,
                });
            }
            job.push(self.job_rank(m));
        }
        let Some(rank) = members.iter().position(|&m| m == self.rank) else {
            return Err(P2pError::InvalidRank {
                rank: self.rank,
                size: self.size,
            });
        };
        let identity = job.iter().enumerate().all(|(i, &r)| i as u32 == r);
        Ok(Communicator {
            inner: self.inner.clone(),
            ctx,
            rank: rank as u32,
            size: members.len() as u32,
            map: (!identity).then(|| Arc::new(RankMap::new(&job))),
            origin: None,
            shared: Arc::new(CommShared {
                derived: true,
                ..CommShared::default()
            }),
        })
    }

    /// Whether this communicator was made by [`Communicator::derive`].
    pub fn is_derived(&self) -> bool {
        self.shared.derived
    }

    /// A collective library's state for this communicator, shared by all its handles:
    /// made by `init` on first use. `None` if the slot holds another type (one library
    /// per communicator).
    pub fn coll_state<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Option<&T> {
        self.shared
            .coll
            .get_or_init(|| Box::new(init()))
            .downcast_ref::<T>()
    }

    /// The node (its index in the job's node list) of member `r`, when the fabric runs
    /// under the wire-up service.
    pub fn node_of(&self, r: u32) -> Option<u32> {
        let w = self.inner.wire.as_ref()?;
        if r >= self.size {
            return None;
        }
        w.job().node_of(self.job_rank(r))
    }

    /// One pass of the fabric's progress (for libraries that wait on something else,
    /// such as shared-memory flags, and must keep this process's transfers moving).
    pub fn progress(&self) {
        self.inner.engine().progress();
    }

    /// A member that failed (died, or exited before finalize), as (communicator rank,
    /// why), if one did; members that finalized cleanly do not count. When this node's
    /// server is lost, every other member is unreachable (its death would never be told
    /// here): the first of them, with that reason.
    pub fn failed_member(&self) -> Option<(u32, String)> {
        let w = self.inner.wire.as_ref()?;
        (0..self.size).find_map(|r| {
            let job = self.job_rank(r);
            if job == self.inner.me {
                return None;
            }
            w.unreachable(job)
                .filter(|why| why != weft_wireup::FINALIZED)
                .map(|why| (r, why))
        })
    }

    /// How member `r` (communicator rank) ended, if it did: died, or finalized (unlike
    /// [`failed_member`](Self::failed_member), a clean finalize or exit counts), or why
    /// it is unreachable when this node's server is lost. For a library waiting on that
    /// member's part of an operation: a member that ended without doing it never will.
    /// `None` for this process and outside the wire-up.
    pub fn member_gone(&self, r: u32) -> Option<String> {
        let w = self.inner.wire.as_ref()?;
        if r >= self.size {
            return None;
        }
        let job = self.job_rank(r);
        if job == self.inner.me {
            return None;
        }
        w.unreachable(job)
    }

    /// When every member is on this node and reached through shared memory: the name
    /// prefix of this node's segments for the job (its server removes them when the job
    /// ends), under which a collective library may make a segment for the communicator.
    pub fn node_segment_prefix(&self) -> Option<String> {
        let w = self.inner.wire.as_ref()?;
        if !self.inner.shm {
            return None;
        }
        let node = w.node();
        (0..self.size)
            .all(|r| w.job().node_of(self.job_rank(r)) == Some(node))
            .then(|| w.segment_prefix())
    }

    /// The job ranks of the members, in rank order.
    pub fn job_ranks(&self) -> Vec<u32> {
        (0..self.size).map(|r| self.job_rank(r)).collect()
    }
}

impl<'scope> RequestScope<'scope, '_> {
    /// Starts `sched` on the scope's communicator (see [`Communicator::run_schedule`]);
    /// `send` and `recv` stay borrowed until the scope ends.
    pub fn start_schedule(
        &'scope self,
        sched: Schedule,
        send: &'scope [u8],
        recv: &'scope mut [u8],
    ) -> Result<Request<'scope>, P2pError> {
        let id = self.comm.start_schedule_raw(sched, send, recv)?;
        let serial = self.comm.inner.engine().serial(id).unwrap_or(0);
        self.started.borrow_mut().push((id, serial));
        Ok(Request::pending(self.comm, id, serial, false))
    }

    /// The scope's communicator.
    pub fn comm(&self) -> &Communicator {
        self.comm
    }
}

/// The bytes of a slice of plain data.
#[inline]
pub fn as_bytes<T: Pod>(s: &[T]) -> &[u8] {
    // SAFETY: `Pod` types have no padding, so every byte of the slice is initialised;
    // the view covers exactly the slice's memory and borrows it.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
}

/// The bytes of a slice of plain data, writable.
#[inline]
pub fn as_bytes_mut<T: Pod>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; `Pod` types accept every bit pattern, so any bytes
    // written through the view leave valid values.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), std::mem::size_of_val(s)) }
}

/// Bytes seen as elements of plain data, if aligned for `T` and a whole number of
/// elements long (always for no bytes).
#[inline]
pub fn cast_slice<T: Pod>(b: &[u8]) -> Option<&[T]> {
    let size = std::mem::size_of::<T>();
    if b.is_empty() {
        return Some(&[]);
    }
    if size == 0 || b.len() % size != 0 || b.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
        return None;
    }
    // SAFETY: aligned and a whole number of `T`s (checked above); `Pod` accepts every
    // bit pattern; the view borrows `b`.
    Some(unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), b.len() / size) })
}

/// Writable bytes seen as elements of plain data (see [`cast_slice`]).
#[inline]
pub fn cast_slice_mut<T: Pod>(b: &mut [u8]) -> Option<&mut [T]> {
    let size = std::mem::size_of::<T>();
    if b.is_empty() {
        return Some(&mut []);
    }
    if size == 0 || b.len() % size != 0 || b.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
        return None;
    }
    // SAFETY: as in `cast_slice`; the view borrows `b` mutably.
    Some(unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast(), b.len() / size) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_steps_after_messages_open_a_new_round() {
        let mut s = Schedule::new();
        let t = s.scratch(8);
        s.copy(Buf::Send.at(0, 8), t.at(0, 8));
        s.send(t.at(0, 8), 1, 0);
        s.recv(Buf::Recv.at(0, 8), 1, 0);
        s.local(|_| {});
        s.send(Buf::Recv.at(0, 8), 1, 1);
        assert_eq!(s.rounds, vec![0, 3]);
        assert_eq!(s.check(8, 8, 2), Ok(()));
        assert!(s.check(8, 4, 2).unwrap_err().contains("receives into"));
        assert!(s.check(8, 8, 1).unwrap_err().contains("to rank 1"));
    }

    #[test]
    fn pair_gives_disjoint_views_of_every_buffer_combination() {
        let send = [1u8, 2, 3, 4];
        let mut recv = [0u8; 8];
        let mut scratch = vec![vec![0u128; 1], vec![0u128; 1]];
        let mut b = Bufs {
            send: &send,
            recv: &mut recv,
            scratch: &mut scratch,
        };
        let (f, t) = b.pair(Buf::Send.at(0, 4), Buf::Recv.at(4, 4));
        t.copy_from_slice(f);
        let (f, t) = b.pair(Buf::Recv.at(4, 4), Buf::Recv.at(0, 4));
        t.copy_from_slice(f);
        let (f, t) = b.pair(Buf::Recv.at(0, 4), Buf::Scratch(1).at(8, 4));
        t.copy_from_slice(f);
        let (f, t) = b.pair(Buf::Scratch(1).at(8, 4), Buf::Scratch(0).at(0, 4));
        t.copy_from_slice(f);
        let (f, t) = b.pair(Buf::Scratch(0).at(0, 4), Buf::Scratch(0).at(12, 4));
        t.copy_from_slice(f);
        assert_eq!(b.bytes(Buf::Scratch(0).at(12, 4)), &[1, 2, 3, 4]);
        assert_eq!(b.bytes(Buf::Recv.at(0, 8)), &[1, 2, 3, 4, 1, 2, 3, 4]);
    }

    #[test]
    #[should_panic(expected = "overlaps")]
    fn pair_refuses_overlapping_ranges() {
        let mut recv = [0u8; 8];
        let mut b = Bufs {
            send: &[],
            recv: &mut recv,
            scratch: &mut [],
        };
        let _ = b.pair(Buf::Recv.at(0, 4), Buf::Recv.at(2, 4));
    }

    #[test]
    fn casts_check_alignment_and_length() {
        let v = [0u64; 2];
        let b = as_bytes(&v);
        assert_eq!(cast_slice::<u64>(b).map(<[u64]>::len), Some(2));
        assert!(cast_slice::<u64>(&b[1..9]).is_none());
        assert!(cast_slice::<u32>(&b[..6]).is_none());
    }
}
