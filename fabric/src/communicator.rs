//! A communicator: its members, context id and point-to-point operations.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::engine::{Direct, Engine};
use crate::{
    bytes_of, bytes_of_mut, session, Backoff, Inner, P2pError, Pod, Request, RequestScope, Source,
    Status, Tag,
};

/// A communicator: a group of processes with a context id carried in every message.
#[derive(Clone)]
pub struct Communicator {
    pub(crate) inner: Arc<Inner>,
    pub(crate) ctx: u64,
    pub(crate) rank: u32,
    pub(crate) size: u32,
    /// Communicator rank <-> job rank; `None` for the world (the identity).
    pub(crate) map: Option<Arc<RankMap>>,
    /// What a communicator made from a session group needs for free/disconnect.
    pub(crate) origin: Option<Arc<session::CommOrigin>>,
    /// What every handle of this communicator shares.
    pub(crate) shared: Arc<CommShared>,
}

/// What every handle (clone) of one communicator shares.
#[derive(Debug, Default)]
pub(crate) struct CommShared {
    /// Made by [`Communicator::derive`] (freed locally, no group behind it).
    pub(crate) derived: bool,
    /// A collective library's state for this communicator ([`Communicator::coll_state`]).
    pub(crate) coll: std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>,
    /// How many spawns, accepts and connects this communicator made
    /// ([`Communicator::spawn`], [`Communicator::accept`], [`Communicator::connect`]).
    pub(crate) spawns: std::sync::atomic::AtomicU64,
}

/// How a communicator's ranks map to job ranks.
#[derive(Debug)]
pub(crate) struct RankMap {
    pub(crate) to_job: Vec<u32>,
    pub(crate) to_comm: std::collections::HashMap<u32, u32>,
}

impl RankMap {
    pub(crate) fn new(members: &[u32]) -> RankMap {
        RankMap {
            to_job: members.to_vec(),
            to_comm: members
                .iter()
                .enumerate()
                .map(|(i, &r)| (r, i as u32))
                .collect(),
        }
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("ctx", &self.ctx)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl Communicator {
    /// This process's rank in the communicator.
    pub fn rank(&self) -> u32 {
        self.rank
    }
    /// Number of processes in the communicator.
    pub fn size(&self) -> u32 {
        self.size
    }
    /// The context id (a PGCID) carried in every message of this communicator.
    pub fn context_id(&self) -> u64 {
        self.ctx
    }

    /// The wire-up client of this process, when the fabric runs under the wire-up
    /// service (for fences and cards moved by collectives).
    pub fn wire(&self) -> Option<&weft_wireup::Client> {
        self.inner.wire.as_deref()
    }

    /// The job rank of communicator rank `r` (`r < size`).
    #[inline]
    pub fn job_rank(&self, r: u32) -> u32 {
        match &self.map {
            None => r,
            Some(m) => m.to_job[r as usize],
        }
    }

    /// The communicator rank of job rank `job`, if it is a member.
    #[inline]
    fn comm_rank(&self, job: u32) -> Option<u32> {
        match &self.map {
            None => Some(job),
            Some(m) => m.to_comm.get(&job).copied(),
        }
    }

    /// Translates the job ranks of an engine result into communicator ranks.
    #[inline]
    pub(crate) fn fix(&self, r: Result<Status, P2pError>) -> Result<Status, P2pError> {
        if self.map.is_none() {
            return r;
        }
        match r {
            Ok(mut st) => {
                st.source = self.comm_rank(st.source).unwrap_or(st.source);
                Ok(st)
            }
            Err(e) => Err(self.fix_err(e)),
        }
    }

    /// Translates the job ranks an error names into communicator ranks.
    pub(crate) fn fix_err(&self, e: P2pError) -> P2pError {
        let c = |job: u32| self.comm_rank(job).unwrap_or(job);
        match e {
            P2pError::Truncated {
                sender,
                tag,
                size,
                capacity,
            } => P2pError::Truncated {
                sender: c(sender),
                tag,
                size,
                capacity,
            },
            // The reason names the job rank too: the one a user finds in the launcher's
            // and the other processes' messages.
            P2pError::PeerGone { rank, reason }
                if c(rank) != rank || self.inner.procs.is_some() =>
            {
                let who = match self
                    .inner
                    .procs
                    .as_deref()
                    .and_then(|p| p.get(rank as usize))
                {
                    Some(p) => p.to_string(),
                    None => format!("job rank {rank}"),
                };
                P2pError::PeerGone {
                    rank: c(rank),
                    reason: format!("{who} {reason}"),
                }
            }
            P2pError::PeerGone { rank, reason } => P2pError::PeerGone { rank, reason },
            P2pError::NoPath { rank, reason } => P2pError::NoPath {
                rank: c(rank),
                reason,
            },
            P2pError::Transport { rank, reason } => P2pError::Transport {
                rank: c(rank),
                reason,
            },
            P2pError::Aborted { rank, reason } => P2pError::Aborted {
                rank: c(rank),
                reason,
            },
            P2pError::SizeMismatch {
                rank,
                tag,
                expected,
                got,
            } => P2pError::SizeMismatch {
                rank: c(rank),
                tag,
                expected,
                got,
            },
            e => e,
        }
    }

    /// Checks a destination and returns its job rank.
    fn check_dest(&self, dest: u32, tag: Tag) -> Result<u32, P2pError> {
        if dest >= self.size {
            return Err(P2pError::InvalidRank {
                rank: dest,
                size: self.size,
            });
        }
        if tag == Tag::ANY {
            return Err(P2pError::InvalidTag(tag.0));
        }
        Ok(self.job_rank(dest))
    }

    /// The job rank a receive selects, if any.
    fn source(&self, src: Source) -> Result<Option<u32>, P2pError> {
        match src {
            Source::Any => Ok(None),
            Source::Rank(r) if r < self.size => Ok(Some(self.job_rank(r))),
            Source::Rank(r) => Err(P2pError::InvalidRank {
                rank: r,
                size: self.size,
            }),
        }
    }

    /// A member other than this process that is gone, if every other member is.
    fn all_others_gone(&self, e: &Engine) -> Option<(u32, String)> {
        match &self.map {
            None => e.all_others_gone(),
            Some(m) => e.all_gone_among(m.to_job.iter().copied()),
        }
    }

    /// What a receive or probe from `src` (a job rank; `None`: any source) waits for in
    /// vain: the source is gone, or, from any source, every other member is (both when
    /// this node's server is lost), as (job rank, why).
    fn source_gone(&self, e: &Engine, src: Option<u32>) -> Option<(u32, String)> {
        match src {
            Some(r) if r == self.inner.me => None,
            Some(r) => e.gone_reason(r).map(|why| (r, why)),
            // Any member but this process (an intercommunicator's remote group, even of
            // one process; none for a communicator of this process alone).
            None => self.all_others_gone(e),
        }
    }

    fn tag_sel(tag: Tag) -> Option<u32> {
        (tag != Tag::ANY).then_some(tag.0)
    }

    /// Blocks until request `id` completes, failing it if its peer dies.
    pub(crate) fn wait_id(&self, id: u32) -> Result<Status, P2pError> {
        let mut e = self.inner.engine();
        if let Some(r) = e.take(id) {
            return r;
        }
        let mut backoff = Backoff::default();
        loop {
            e.progress();
            if let Some(r) = e.take(id) {
                return r;
            }
            let (g, check) = self.inner.pause(e, &mut backoff);
            e = g;
            if check {
                e.fail_if_gone(id);
            }
        }
    }

    /// Sends `buf` to `dest` with `tag`; returns when `buf` may be reused.
    pub fn send<T: Pod>(&self, buf: &[T], dest: u32, tag: Tag) -> Result<(), P2pError> {
        let job = self.check_dest(dest, tag)?;
        self.inner.before_send(job);
        let (p, n) = bytes_of(buf);
        let pending = self.inner.engine().send(p, n, job, self.ctx, tag.0);
        match pending {
            Ok(None) => Ok(()),
            Ok(Some(id)) => self.fix(self.wait_id(id)).map(|_| ()),
            Err(e) => Err(self.fix_err(e)),
        }
    }

    /// Receives into `buf` a message from `src` with `tag` (wildcards allowed).
    pub fn recv<T: Pod>(&self, buf: &mut [T], src: Source, tag: Tag) -> Result<Status, P2pError> {
        let s = self.source(src)?;
        let t = Self::tag_sel(tag);
        let (p, n) = bytes_of_mut(buf);
        let mut e = self.inner.engine();
        let mut backoff = Backoff::default();
        loop {
            match e.recv_direct(p, n, self.ctx, s, t) {
                Direct::Done(r) => return self.fix(r),
                Direct::Queue => break,
                Direct::NotYet => {}
            }
            // Wait on the transports' next-frame words (loads only) and the verbs receive
            // queue rather than polling in full: a message is then seen within a few
            // nanoseconds of its arrival.
            let check = loop {
                let (g, check) = self.inner.pause(e, &mut backoff);
                e = g;
                if check || !e.quiet() {
                    break check;
                }
                if e.pause_between_looks() {
                    std::hint::spin_loop();
                }
            };
            if check {
                if let Some((rank, reason)) = self.source_gone(&e, s) {
                    // One more pass: its last messages may have arrived before it died.
                    match e.recv_direct(p, n, self.ctx, s, t) {
                        Direct::Done(r) => return self.fix(r),
                        Direct::Queue => break,
                        Direct::NotYet => {
                            return self.fix(Err(P2pError::PeerGone { rank, reason }))
                        }
                    }
                }
            }
        }
        let id = e.recv(p, n, self.ctx, s, t);
        drop(e);
        self.fix(self.wait_id(id))
    }

    /// Runs `f` with a [`RequestScope`] in which non-blocking operations may borrow buffers.
    /// Every operation started in the scope is complete when `scope` returns (receives
    /// that never matched are cancelled), even if its [`Request`] was leaked with
    /// `std::mem::forget`: so the transports never touch a buffer after its borrow ends.
    ///
    /// ```no_run
    /// # use weft_fabric::{Fabric, Source, Tag, wait_all};
    /// # let fabric = Fabric::init()?;
    /// let world = fabric.world();
    /// let (out, mut inb) = ([1u64; 4], [0u64; 4]);
    /// world.scope(|s| {
    ///     let r = s.irecv(&mut inb, Source::Any, Tag(1))?;
    ///     let w = s.isend(&out, (world.rank() + 1) % world.size(), Tag(1))?;
    ///     wait_all(vec![r, w])
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn scope<'env, F, R>(&'env self, f: F) -> R
    where
        F: for<'scope> FnOnce(&'scope RequestScope<'scope, 'env>) -> R,
    {
        let scope = RequestScope {
            comm: self,
            // Room for a window of requests up front (no regrowth while they start).
            started: RefCell::new(Vec::with_capacity(64)),
            _scope: PhantomData,
            _env: PhantomData,
        };
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&scope)));
        scope.complete_all();
        match out {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Starts a send (through [`RequestScope::isend`]).
    pub(crate) fn isend_in<'a, T: Pod>(
        &'a self,
        buf: &'a [T],
        dest: u32,
        tag: Tag,
    ) -> Result<Request<'a>, P2pError> {
        let job = self.check_dest(dest, tag)?;
        self.inner.before_send(job);
        let (p, n) = bytes_of(buf);
        let mut e = self.inner.engine();
        let id = match e.send(p, n, job, self.ctx, tag.0) {
            Ok(Some(id)) => id,
            Ok(None) => {
                // Done already (eager): a request the engine never holds, so waiting on
                // it takes no lock.
                drop(e);
                let status = Status {
                    source: job,
                    tag: tag.0,
                    count: n,
                };
                return Ok(Request {
                    comm: self,
                    id: u32::MAX,
                    serial: 0,
                    recv: false,
                    done: true,
                    result: Some(self.fix(Ok(status))),
                    _buf: PhantomData,
                });
            }
            Err(err) => return Err(self.fix_err(err)),
        };
        let serial = e.serial(id).unwrap_or(0);
        drop(e);
        Ok(Request::pending(self, id, serial, false))
    }

    /// Starts a receive (through [`RequestScope::irecv`]).
    pub(crate) fn irecv_in<'a, T: Pod>(
        &'a self,
        buf: &'a mut [T],
        src: Source,
        tag: Tag,
    ) -> Result<Request<'a>, P2pError> {
        let s = self.source(src)?;
        let (p, n) = bytes_of_mut(buf);
        let mut e = self.inner.engine();
        let id = e.recv(p, n, self.ctx, s, Self::tag_sel(tag));
        let serial = e.serial(id).unwrap_or(0);
        drop(e);
        Ok(Request::pending(self, id, serial, true))
    }

    /// The status of a message that has arrived and matches, without receiving it.
    pub fn iprobe(&self, src: Source, tag: Tag) -> Result<Option<Status>, P2pError> {
        let s = self.source(src)?;
        let st = self.inner.engine().iprobe(self.ctx, s, Self::tag_sel(tag));
        st.map(|st| self.fix(Ok(st))).transpose()
    }

    /// Waits until a matching message has arrived and returns its status.
    pub fn probe(&self, src: Source, tag: Tag) -> Result<Status, P2pError> {
        let s = self.source(src)?;
        let mut backoff = Backoff::default();
        let mut e = self.inner.engine();
        loop {
            if let Some(st) = e.iprobe(self.ctx, s, Self::tag_sel(tag)) {
                return self.fix(Ok(st));
            }
            let (g, check) = self.inner.pause(e, &mut backoff);
            e = g;
            if check {
                if let Some((rank, reason)) = self.source_gone(&e, s) {
                    if let Some(st) = e.iprobe(self.ctx, s, Self::tag_sel(tag)) {
                        return self.fix(Ok(st));
                    }
                    return self.fix(Err(P2pError::PeerGone { rank, reason }));
                }
            }
        }
    }
}
