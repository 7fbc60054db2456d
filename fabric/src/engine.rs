//! The progress engine: one [`State`] per process, each concern a field of its own:
//!
//! - [`wire`]: the typed frames ([`wire::Frame`]) and their one codec;
//! - [`matching`]: posted receives and unexpected messages (where a message is matched);
//! - [`requests`]: the sends and receives in progress, named on the wire;
//! - [`send`]: path resolution, the one dispatch on the closed [`Path`] enum
//!   (`State::on_link`), the send fast path (the same for every transport) and the choice
//!   of protocol by the path's capabilities;
//! - [`polled`]: the one [`Deliver`](crate::path::Deliver) shape the transports' polls are
//!   generic over;
//! - [`rendezvous`]: RTS, the single-copy read or CTS, DATA, FIN; [`split`]: the split
//!   single-copy rendezvous; [`copy`]: its copies, run without the lock;
//! - the transport-specific steps of a rendezvous: [`shm`] (pipelined DATA streams),
//!   [`verbs`] (RDMA reads), [`tcp`] (bulk transfers); the adapters themselves are
//!   `crate::path`'s;
//! - [`sched`]: running collective schedules;
//! - this module: progress, frame dispatch, failure detection.
//!
//! Everything here runs on the caller's thread inside `progress()`; there is no hidden
//! thread. Frames are `header ++ payload` (see [`wire`]).

use std::collections::{HashMap, VecDeque};

use weft_shm::Inbox;
/// The verbs endpoint a process may have; in a build without verbs, a type with no
/// values (the engine's `verbs` is then always `None`).
#[cfg(feature = "verbs")]
pub(crate) type VerbsEndpoint = weft_verbs::Endpoint;
/// The verbs endpoint a process may have; in a build without verbs, a type with no
/// values (the engine's `verbs` is then always `None`).
#[cfg(not(feature = "verbs"))]
pub(crate) type VerbsEndpoint = std::convert::Infallible;
/// The TCP endpoint a process may have; in a build without TCP, a type with no values
/// (the engine's `tcp` is then always `None`).
#[cfg(feature = "tcp")]
pub(crate) type TcpEndpoint = weft_tcp::Endpoint;
/// The TCP endpoint a process may have; in a build without TCP, a type with no values
/// (the engine's `tcp` is then always `None`).
#[cfg(not(feature = "tcp"))]
pub(crate) type TcpEndpoint = std::convert::Infallible;
/// A send buffer's verbs registration (none can exist in a build without verbs).
#[cfg(feature = "verbs")]
pub(crate) type RemoteRegion = weft_verbs::RemoteRegion;
/// A send buffer's verbs registration (none can exist in a build without verbs).
#[cfg(not(feature = "verbs"))]
pub(crate) type RemoteRegion = std::convert::Infallible;
/// An RDMA read in flight (none can exist in a build without verbs).
#[cfg(feature = "verbs")]
pub(crate) type ReadToken = weft_verbs::ReadToken;
/// An RDMA read in flight (none can exist in a build without verbs).
#[cfg(not(feature = "verbs"))]
pub(crate) type ReadToken = std::convert::Infallible;

use crate::{P2pError, Status};

mod copy;
mod matching;
mod polled;
mod rendezvous;
mod requests;
mod sched;
mod send;
mod shm;
mod split;
#[cfg(feature = "tcp")]
mod tcp;
#[cfg(feature = "verbs")]
mod verbs;
mod wire;

use crate::path::shm::ShmAdapter;
use crate::path::{Adapter, Link};
pub(crate) use crate::path::{Path, Resolved};
use copy::Copies;
pub(crate) use copy::CopyJob;
use matching::Matching;
use matching::{matches, Body, TakeNone, Taker};
use polled::{Handle, Kept, Polled};
use requests::{Kind, Req, Requests};
use sched::Scheds;
pub(crate) use sched::{SchedRun, UserBufs, SCHED_BIT};
use split::Cma;
#[cfg(feature = "verbs")]
use verbs::Reads;
pub(crate) use wire::Frame;
pub(crate) use wire::HDR;
/// The short header's size (what the connection adapters' inline limits leave out).
pub(crate) use wire::SHORT_HDR;
#[cfg(test)]
pub(crate) use wire::{short_header, Envelope};

/// Bytes of eager frames queued for a peer reached over TCP (beyond the socket's buffer
/// and the endpoint's queue) past which messages to it go by rendezvous.
const TCP_BACKLOG_LIMIT: usize = 4 << 20;

/// How long a TCP connection to a peer reported gone may stay up before it is closed
/// (what the peer wrote before it ended is read meanwhile).
const TCP_GONE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Outcome of [`Engine::recv_direct`].
#[derive(Debug)]
pub(crate) enum Direct {
    /// Received (or failed) without a request.
    Done(Result<Status, P2pError>),
    /// Nothing arrived yet.
    NotYet,
    /// The queues may hold a match: take the general path.
    Queue,
}

/// How the single copy of a rendezvous is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SingleCopy {
    /// The receiver reads the sender's buffer with process_vm_readv.
    Cma,
    /// The sender streams the data through the shared-memory rings.
    None,
}

/// Tunables of the engine.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) eager_limit: usize,
    pub(crate) single_copy: SingleCopy,
    /// Keep verbs registrations of user buffers between messages (the user promises not
    /// to free and reuse them); otherwise each is released when its message completes.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) keep_registrations: bool,
    /// Single-copy rendezvous of at least this many bytes are split between the
    /// receiver (reads the head) and the sender (writes the tail) once CMA has worked;
    /// 0: never split.
    pub(crate) cma_split: usize,
    /// Messages up to this many bytes go eagerly to a peer reached over TCP; larger ones
    /// by rendezvous (their payload written straight from the sender's buffer).
    pub(crate) tcp_eager_limit: usize,
}

struct Peer {
    path: Path,
    /// Frames waiting for room in the peer's ring, in order.
    backlog: VecDeque<Vec<u8>>,
    /// Bytes of `backlog`.
    queued: usize,
    /// A single-copy read from this peer has succeeded (so a split rendezvous with it
    /// cannot end with a receiver that may not read).
    cma_ok: bool,
}

impl Peer {
    /// Sends queued frames, in order, while `send` takes them (`Ok(true)`); stops at the
    /// first it refuses, or at an error (returned).
    fn drain<L: Link>(&mut self, mut link: L) -> Result<(), L::Error> {
        while let Some(f) = self.backlog.front() {
            // A whole frame (a short header is shorter than HDR).
            if !link.try_send(f, &[])? {
                break;
            }
            if let Some(f) = self.backlog.pop_front() {
                self.queued -= f.len();
            }
        }
        Ok(())
    }
}

/// Resolves a peer's path (first send): what reaches `rank`.
pub(crate) type Resolver = Box<dyn FnMut(u32) -> Resolved + Send>;
/// Tells why a rank is gone, if it is.
pub(crate) type GoneCheck = Box<dyn Fn(u32) -> Option<String> + Send>;

struct State {
    me: u32,
    pid: i32,
    cfg: Config,
    peers: Vec<Peer>,
    /// Peers with a backlog or a stream to push.
    busy: Vec<u32>,
    /// How peers are found and how their ends are known.
    wireup: Wireup,
    /// Connections that failed, and peers reported gone.
    ends: Ends,
    /// Posted receives and unexpected messages ([`matching`]).
    matching: Matching,
    /// The requests ([`requests`]).
    reqs: Requests,
    /// The verbs endpoint, when the process has one.
    verbs: Option<VerbsEndpoint>,
    /// RDMA reads of the verbs rendezvous (`verbs`).
    #[cfg(feature = "verbs")]
    reads: Reads,
    /// The TCP endpoint, when the process has one.
    tcp: Option<TcpEndpoint>,
    /// What a verbs or TCP poll kept for after it ([`polled`]).
    kept: Kept,
    /// The split single-copy rendezvous ([`split`]).
    cma: Cma,
    /// Copies run without the lock ([`copy`]).
    copies: Copies,
    /// Started schedules ([`sched`]).
    scheds: Scheds,
}

/// How the engine learns about peers from the wire-up.
struct Wireup {
    /// What reaches a rank (first send).
    resolve: Resolver,
    /// Why a rank is gone, if it is.
    gone: GoneCheck,
}

/// What the engine knows of peers' ends beyond the wire-up.
#[derive(Default)]
struct Ends {
    /// Peers whose verbs or TCP connection failed, and why.
    failed: HashMap<u32, String>,
    /// Since when each peer reached over TCP has been reported gone by wire-up while its
    /// connection is still up.
    tcp_since: HashMap<u32, std::time::Instant>,
}

/// One process's engine.
pub(crate) struct Engine {
    /// This process's inbox (none for a single-process job).
    shm: Option<ShmAdapter>,
    st: State,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("me", &self.st.me)
            .field("posted", &self.st.matching.posted.len())
            .field("unexpected", &self.st.matching.unexpected.len())
            .finish()
    }
}

impl Engine {
    /// An engine for rank `me` of a job of `size`, receiving on `inbox` (none for a
    /// single-process job), with `sender_rank` mapping inbox sender ids to ranks.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        me: u32,
        size: u32,
        inbox: Option<Inbox>,
        sender_rank: Vec<u32>,
        cfg: Config,
        resolve: Resolver,
        gone: GoneCheck,
        verbs: Option<VerbsEndpoint>,
        tcp: Option<TcpEndpoint>,
    ) -> Engine {
        let mut peers: Vec<Peer> = (0..size)
            .map(|_| Peer {
                path: Path::Unresolved,
                backlog: VecDeque::new(),
                queued: 0,
                cma_ok: false,
            })
            .collect();
        peers[me as usize].path = Path::Loopback;
        let shm = inbox.map(|i| ShmAdapter::new(i, sender_rank));
        let claims = shm.as_ref().map(ShmAdapter::claim_table);
        Engine {
            shm,
            st: State {
                me,
                pid: std::process::id() as i32,
                cfg,
                peers,
                busy: Vec::new(),
                wireup: Wireup { resolve, gone },
                ends: Ends::default(),
                matching: Matching::default(),
                reqs: Requests::new(),
                verbs,
                #[cfg(feature = "verbs")]
                reads: Reads::default(),
                tcp,
                kept: Kept::default(),
                cma: Cma::new(claims),
                copies: Copies::default(),
                scheds: Scheds::default(),
            },
        }
    }

    /// Polls the inbox and the verbs endpoint and pushes pending output; returns the
    /// number of frames handled.
    #[inline]
    pub(crate) fn progress(&mut self) -> usize {
        let st = &mut self.st;
        st.copies.pass += 1;
        if !st.copies.jobs.is_empty() {
            st.run_stale_copies();
        }
        let mut n = match &mut self.shm {
            Some(shm) => shm.poll(&mut Handle {
                st,
                take: &mut TakeNone,
            }),
            None => 0,
        };
        if st.verbs.is_some() {
            n += st.progress_net(Polled::Verbs, &mut TakeNone);
        }
        if st.tcp.is_some() {
            n += st.progress_net(Polled::Tcp, &mut TakeNone);
        }
        if !st.cma.splits.is_empty() {
            st.check_splits();
        }
        if !st.busy.is_empty() {
            st.flush();
        }
        if st.scheds.active > 0 {
            self.advance_scheds();
        }
        n
    }

    /// Starts a send of `len` bytes at `buf`. `None`: done, the buffer may be reused (eager
    /// and loopback sends); `Some(id)`: a request that completes when it may.
    pub(crate) fn send(
        &mut self,
        buf: *const u8,
        len: usize,
        dest: u32,
        ctx: u64,
        tag: u32,
    ) -> Result<Option<u32>, P2pError> {
        self.st.send(buf, len, dest, ctx, tag)
    }

    /// The fast path of a blocking receive: when no earlier receive is posted and no
    /// arrived message matches, polls the inbox and copies a matching eager message straight
    /// into `buf` (no request, no queue). `Direct(None)`: nothing yet, poll again;
    /// `Queue`: something could match through the queues, use [`Engine::recv`].
    #[inline]
    pub(crate) fn recv_direct(
        &mut self,
        buf: *mut u8,
        cap: usize,
        ctx: u64,
        src: Option<u32>,
        tag: Option<u32>,
    ) -> Direct {
        let st = &mut self.st;
        if !st.matching.posted.is_empty()
            || st
                .matching
                .unexpected
                .iter()
                .any(|u| matches(ctx, src, tag, u.ctx, u.src, u.tag))
        {
            return Direct::Queue;
        }
        let mut taker = Taker {
            buf,
            cap,
            ctx,
            src,
            tag,
            got: None,
            blocked: false,
        };
        if st.verbs.is_some() {
            st.progress_net(Polled::Verbs, &mut taker);
        }
        if st.tcp.is_some() {
            st.progress_net(Polled::Tcp, &mut taker);
        }
        if let Some(shm) = &mut self.shm {
            shm.poll(&mut Handle {
                st,
                take: &mut taker,
            });
        } else if st.verbs.is_none() && st.tcp.is_none() {
            return Direct::Queue;
        }
        if !st.busy.is_empty() {
            st.flush();
        }
        match taker.got {
            Some(r) => Direct::Done(r),
            // A rendezvous (or anything) that arrived meanwhile now sits in the queues.
            None if !st.matching.unexpected.is_empty() => Direct::Queue,
            None => Direct::NotYet,
        }
    }

    /// Whether nothing has arrived since the last progress: nothing waits to be sent, no
    /// message waits unmatched, no RDMA read is under way, and neither transport has a
    /// frame (false otherwise, so callers poll in full). Cheap to spin on: loads only for
    /// shared memory, one completion-queue poll for verbs (whose finds the next progress
    /// delivers).
    #[inline(always)]
    pub(crate) fn quiet(&mut self) -> bool {
        let st = &mut self.st;
        // Nothing unexpected either: another thread may have polled our message into
        // it while the engine was let go.
        if !st.busy.is_empty() || !st.matching.unexpected.is_empty() || !st.copies.jobs.is_empty() {
            return false;
        }
        // Only a poll tells whether a socket has data: never quiet with TCP.
        if st.tcp.is_some() {
            return false;
        }
        #[cfg(feature = "verbs")]
        if let Some(ep) = &mut st.verbs {
            if !st.reads.inflight.is_empty() || !st.reads.pending.is_empty() || !ep.idle() {
                return false;
            }
        }
        match &self.shm {
            Some(shm) => shm.quiet(),
            None => st.verbs.is_some(),
        }
    }

    /// Whether a wait should pause between two looks at [`Engine::quiet`]: yes for shared
    /// memory alone (a look re-shares the cache line the sender is about to write); not
    /// with verbs, where a look is a completion-queue poll (and where PAUSE is costly
    /// under emulation: QEMU's TCG leaves its execution loop on every one).
    #[inline]
    pub(crate) fn pause_between_looks(&self) -> bool {
        self.st.verbs.is_none() && self.st.tcp.is_none()
    }

    pub(crate) fn single_copy(&self) -> SingleCopy {
        self.st.cfg.single_copy
    }

    /// Whether a send to `dest` would go out at once: its path resolved (connecting it if
    /// needed) and, over verbs or TCP, its connection through its handshake. An error
    /// (no path, a failed connection) is the send's to report.
    pub(crate) fn ready_for(&mut self, dest: u32) -> Result<bool, P2pError> {
        self.st.path(dest)?;
        self.st.ready(dest)
    }

    /// Why `rank` is gone, if it is.
    pub(crate) fn gone_reason(&self, rank: u32) -> Option<String> {
        (self.st.wireup.gone)(rank)
    }

    /// Starts a receive into `cap` bytes at `buf`.
    pub(crate) fn recv(
        &mut self,
        buf: *mut u8,
        cap: usize,
        ctx: u64,
        src: Option<u32>,
        tag: Option<u32>,
    ) -> u32 {
        self.st.recv(buf, cap, ctx, src, tag)
    }

    /// Whether a matching message has arrived (without receiving it).
    pub(crate) fn iprobe(
        &mut self,
        ctx: u64,
        src: Option<u32>,
        tag: Option<u32>,
    ) -> Option<Status> {
        self.progress();
        self.st
            .matching
            .unexpected
            .iter()
            .find(|u| matches(ctx, src, tag, u.ctx, u.src, u.tag))
            .map(|u| Status {
                source: u.src,
                tag: u.tag,
                count: match &u.body {
                    Body::Eager(d) => d.len(),
                    Body::Rts { len, .. }
                    | Body::RtsRdma { len, .. }
                    | Body::RtsTcp { len, .. } => *len as usize,
                },
            })
    }

    /// Takes the result of a completed request (freeing it), or `None` if still running.
    pub(crate) fn take(&mut self, id: u32) -> Option<Result<Status, P2pError>> {
        if id & SCHED_BIT != 0 {
            return self.take_sched(id);
        }
        let slot = self.st.reqs.slots.get_mut(id as usize)?;
        let done = slot.as_ref().is_some_and(|r| r.result.is_some());
        if !done {
            return None;
        }
        let req = slot.take();
        if let Some(Req {
            kind: Kind::Recv {
                split: Some(sp), ..
            },
            ..
        }) = &req
        {
            // Ended another way (its sender's process died): the claim word goes back.
            self.st.split_over(id, sp.claim);
        }
        self.st.reqs.free.push(id);
        req.and_then(|r| r.result)
    }

    /// The serial of request `id` while the engine holds it (running, or done but not
    /// taken): a request is still live when its id has the serial it was given.
    pub(crate) fn serial(&self, id: u32) -> Option<u64> {
        if id & SCHED_BIT != 0 {
            return self.sched_serial(id);
        }
        self.st
            .reqs
            .slots
            .get(id as usize)?
            .as_ref()
            .map(|r| r.serial)
    }

    /// The peer a request waits on (for failure detection), if one.
    pub(crate) fn waits_on(&self, id: u32) -> Option<u32> {
        match &self.st.reqs.slots.get(id as usize)?.as_ref()?.kind {
            Kind::Recv {
                pipe: Some((s, ..)),
                ..
            } => Some(*s),
            Kind::Recv { src, .. } => *src,
            Kind::Send { dest, .. } => Some(*dest),
        }
    }

    /// Fails request `id` because `rank` is gone (after one more progress pass).
    pub(crate) fn fail_if_gone(&mut self, id: u32) {
        if id & SCHED_BIT != 0 {
            return self.sched_fail_if_gone(id);
        }
        if self.st.reading(id) || self.st.copying(id) {
            // The NIC may still write into its buffer: its read's completion (success or
            // error) completes it.
            return;
        }
        let (peer, reason) = match self.waits_on(id) {
            Some(peer) if peer == self.st.me => return,
            Some(peer) => match (self.st.wireup.gone)(peer)
                .or_else(|| self.st.ends.failed.get(&peer).cloned())
            {
                Some(reason) => (peer, reason),
                None => return,
            },
            // A wildcard receive can only fail when every possible sender is gone.
            None if self.is_recv(id) => match self.all_others_gone() {
                Some(found) => found,
                None => return,
            },
            None => return,
        };
        // Its sender is gone: a split receive takes the sender's part over first.
        if !self.split_may_fail(id) {
            return;
        }
        let waited = self.waits_on(id);
        self.progress();
        if self.waits_on(id) != waited {
            // Matched meanwhile (a wildcard receive, now lent to one sender): judged again
            // at the next look, by the peer it now waits on.
            return;
        }
        let still = self
            .st
            .reqs
            .slots
            .get(id as usize)
            .and_then(|r| r.as_ref())
            .is_some_and(|r| r.result.is_none());
        if still && self.st.peers[peer as usize].path.is_tcp() {
            // Over TCP the connection's end (EOF or reset, at once when a process dies)
            // says that nothing more comes: what a peer wrote before it finalized may
            // still be in flight. A connection still up 2 s after the peer is reported
            // gone (a stopped process, a lost node) is closed, and its transfers with it.
            if !self.st.ends.failed.contains_key(&peer) {
                let since = *self
                    .st
                    .ends
                    .tcp_since
                    .entry(peer)
                    .or_insert_with(std::time::Instant::now);
                if since.elapsed() < TCP_GONE_GRACE {
                    return;
                }
                self.st.tcp_failed(peer, &reason);
            }
        }
        let still = self
            .st
            .reqs
            .slots
            .get(id as usize)
            .and_then(|r| r.as_ref())
            .is_some_and(|r| r.result.is_none());
        if still {
            self.st.matching.posted.retain(|p| p.id != id);
            self.st
                .complete(id, Err(P2pError::PeerGone { rank: peer, reason }));
        }
    }

    /// If every rank but this one is gone, the lowest of them and why (else `None`).
    pub(crate) fn all_others_gone(&self) -> Option<(u32, String)> {
        self.all_gone_among(0..self.st.peers.len() as u32)
    }

    /// If every rank of `ranks` but this one is gone, one of them and why: the first that
    /// failed of itself, rather than one the runtime terminated after a failure (SIGTERM)
    /// or one that finalized, so that the error names the cause.
    pub(crate) fn all_gone_among(&self, ranks: impl Iterator<Item = u32>) -> Option<(u32, String)> {
        let me = self.st.me;
        let mut best: Option<(u8, u32, String)> = None;
        for r in ranks.filter(|&r| r != me) {
            let why = (self.st.wireup.gone)(r)?;
            let rank = if why.contains("(SIGTERM)") {
                1
            } else if why.contains(weft_wireup::FINALIZED) {
                2
            } else {
                0
            };
            if best.as_ref().is_none_or(|(b, _, _)| rank < *b) {
                best = Some((rank, r, why));
            }
        }
        best.map(|(_, r, why)| (r, format!("{why} (and so is every other possible sender)")))
    }

    /// Cancels a receive that has not matched yet; returns false if it is already
    /// matched (and must be waited for).
    pub(crate) fn cancel_recv(&mut self, id: u32) -> bool {
        let pos = self.st.matching.posted.iter().position(|p| p.id == id);
        match pos {
            Some(i) => {
                self.st.matching.posted.remove(i);
                self.st.reqs.slots[id as usize] = None;
                self.st.reqs.free.push(id);
                true
            }
            None => false,
        }
    }

    /// Number of frames waiting for room, over all peers (for tests and finalize).
    pub(crate) fn backlog(&self) -> usize {
        self.st.peers.iter().map(|p| p.backlog.len()).sum::<usize>()
            + self
                .st
                .reqs
                .slots
                .iter()
                .flatten()
                .filter(|r| {
                    matches!(
                        r.kind,
                        Kind::Send {
                            stream: Some(_),
                            ..
                        }
                    )
                })
                .count()
            + self.st.tcp_queued()
    }
}

impl State {
    #[inline]
    fn alloc(&mut self, kind: Kind) -> u32 {
        self.reqs.alloc(kind)
    }

    #[inline]
    fn wire_id(&self, id: u32) -> u32 {
        self.reqs.wire_id(id)
    }

    #[inline]
    fn own(&self, wire: u32) -> Option<u32> {
        self.reqs.own(wire)
    }

    #[inline]
    fn complete(&mut self, id: u32, r: Result<Status, P2pError>) {
        self.reqs.complete(id, r)
    }

    /// The connection to `peer` is gone (the transport no longer touches its buffers):
    /// drops its backlog and fails every request that waits on it, naming `reason`,
    /// except those whose memory an RDMA read or a copy may still use (their own end
    /// completes them).
    fn fail_waiting_on(&mut self, peer: u32, reason: &str) {
        self.peers[peer as usize].backlog.clear();
        self.peers[peer as usize].queued = 0;
        let ids: Vec<u32> = self
            .reqs
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let r = r.as_ref()?;
                if r.result.is_some() {
                    return None;
                }
                let waits = match &r.kind {
                    Kind::Send { dest, .. } => *dest == peer,
                    Kind::Recv { src, pipe, .. } => {
                        *src == Some(peer) || pipe.is_some_and(|p| p.0 == peer)
                    }
                };
                let id = i as u32;
                let busy = self.read_in_flight(id) || self.copying(id);
                (waits && !busy).then_some(id)
            })
            .collect();
        for id in ids {
            if let Some(Some(Req {
                kind: Kind::Recv { bulk, .. },
                ..
            })) = self.reqs.slots.get_mut(id as usize)
            {
                *bulk = None;
            }
            self.matching.posted.retain(|p| p.id != id);
            let reason = reason.to_string();
            self.complete(id, Err(P2pError::PeerGone { rank: peer, reason }));
        }
    }

    /// A frame from job rank `from` (as the transport knows it): decoded once, handled
    /// by kind.
    fn on_frame_from(&mut self, from: u32, frame: &[u8]) {
        let f = match Frame::decode(from, frame) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(
                    "dropping a frame of {} bytes from rank {from}: {e}",
                    frame.len()
                );
                return;
            }
        };
        let src = f.src();
        if src as usize >= self.peers.len() || src != from {
            tracing::error!("dropping a frame from rank {from} that claims rank {src}");
            return;
        }
        match f {
            Frame::Eager { env, data } => self.on_eager(env, data),
            Frame::Rts {
                env,
                sreq,
                len,
                addr,
                pid,
            } => self.on_rts(env, sreq, len, addr, pid),
            Frame::RtsRdma {
                env,
                sreq,
                len,
                addr,
                rkey,
            } => self.on_rts_rdma(env, sreq, len, addr, rkey),
            Frame::RtsTcp { env, sreq, len } => self.on_rts_tcp(env, sreq, len),
            Frame::Fin { src, tag, sreq } => self.on_fin(src, tag, sreq),
            Frame::Cts {
                src, sreq, rreq, ..
            } => self.on_cts(src, sreq, rreq),
            Frame::Data {
                src,
                rreq,
                off,
                chunk,
            } => self.on_data(src, rreq, off, chunk),
            Frame::CmaWrite {
                src,
                tag,
                sreq,
                req,
            } => self.on_cma_write(src, tag, sreq, req),
            Frame::CmaDone {
                src,
                rreq,
                written,
                serial,
                why,
                ..
            } => self.on_cma_done(src, rreq, written, serial, why),
            Frame::CollAbort { env, gone, why } => {
                let abort = sched::Abort::decode(env.src, gone, why);
                self.scheds
                    .aborted
                    .entry((env.ctx, env.tag))
                    .or_insert(abort);
            }
        }
    }

    /// Pushes backlogs (and shared memory's pipelined streams) as far as each path
    /// allows.
    fn flush(&mut self) {
        let busy = std::mem::take(&mut self.busy);
        for dest in busy {
            let more = match self.peers[dest as usize].path {
                #[cfg(feature = "verbs")]
                Path::Verbs(conn) => self.flush_verbs(dest, conn),
                #[cfg(feature = "tcp")]
                Path::Tcp(conn) => self.flush_tcp(dest, conn),
                Path::Shm(_) => self.flush_shm(dest),
                _ => false,
            };
            if more {
                self.busy.push(dest);
            }
        }
    }
}

/// Without verbs there is never a verbs endpoint, connection or read: nothing to
/// progress, flush or fail.
#[cfg(not(feature = "verbs"))]
impl State {
    fn reads_waiting(&self) -> bool {
        false
    }

    fn start_reads(&mut self) {}

    fn on_read_done(&mut self, token: ReadToken, _res: Result<(), String>) {
        match token {}
    }

    fn verbs_failed(&mut self, peer: u32, reason: &str) {
        tracing::error!("rank {peer}: a verbs failure in a build without verbs: {reason}");
    }

    fn release_region(&mut self, region: RemoteRegion) {
        match region {}
    }

    fn reading(&self, _id: u32) -> bool {
        false
    }

    fn read_in_flight(&self, _id: u32) -> bool {
        false
    }

    /// A peer offered an RDMA read (it can only over a verbs connection, which this
    /// build never makes): the receive fails, naming why.
    fn rdma_matched(&mut self, m: rendezvous::Matched, _addr: u64, _rkey: u32) {
        if let Some(read) = self.rndv_recv(m) {
            let reason = "a verbs rendezvous offer (RTS_RDMA) in a build without verbs".into();
            let rank = read.m.src;
            self.complete(read.m.id, Err(P2pError::Transport { rank, reason }));
        }
    }
}

/// Without TCP there is never a TCP endpoint, connection or bulk transfer: nothing to
/// progress, flush or fail, and an offer over TCP (RTS_TCP) cannot arrive.
#[cfg(not(feature = "tcp"))]
impl State {
    fn tcp_queued(&self) -> usize {
        0
    }

    fn tcp_failed(&mut self, peer: u32, reason: &str) {
        tracing::error!("rank {peer}: a TCP failure in a build without TCP: {reason}");
    }

    fn on_bulk_received(&mut self, peer: u32, _token: u64, _len: usize) {
        tracing::error!("rank {peer}: a TCP bulk transfer in a build without TCP");
    }

    fn on_bulk_sent(&mut self, peer: u32, _token: u64) {
        tracing::error!("rank {peer}: a TCP bulk transfer in a build without TCP");
    }

    /// A TCP offer (RTS_TCP) in a build without TCP: no connection could carry one, so
    /// it is dropped, named in the log.
    fn on_rts_tcp(&mut self, h: wire::Envelope, _sreq: u32, _len: u64) {
        tracing::error!(
            "dropping a TCP rendezvous offer from rank {} in a build without TCP",
            h.src
        );
    }

    /// A receive matched a TCP offer (none can be queued in a build without TCP): it
    /// fails, naming why.
    fn tcp_matched(&mut self, m: rendezvous::Matched) {
        let reason = "a TCP rendezvous offer (RTS_TCP) in a build without TCP".into();
        self.complete(
            m.id,
            Err(P2pError::Transport {
                rank: m.src,
                reason,
            }),
        );
    }
}

#[cfg(test)]
mod tests;
