//! The progress engine: matching (posted and unexpected queues), the eager and rendezvous
//! protocols, and dispatch per peer over a closed set of paths.
//!
//! Everything here runs on the caller's thread inside `progress()`; there is no hidden
//! thread. Frames are `header ++ payload`, the header a fixed 32-byte little-endian record.

use std::collections::{HashMap, VecDeque};

use weft_shm::{Inbox, Outbox};
use weft_verbs::{ConnId, Endpoint, ReadToken, RemoteRegion};

use crate::{P2pError, Status};

/// Bytes of the frame header.
pub(crate) const HDR: usize = 32;
/// The request slot in a wire id ([`State::wire_id`]): 16 M requests at once at most.
const WIRE_SLOT_MASK: u32 = 0x00ff_ffff;

const EAGER: u8 = 1;
const RTS: u8 = 2;
const FIN: u8 = 3;
const CTS: u8 = 4;
const DATA: u8 = 5;
/// Rendezvous over verbs: the payload is the sender's registered region (addr, rkey);
/// the receiver RDMA-reads it and answers FIN.
const RTS_RDMA: u8 = 6;
/// Single-copy rendezvous split in two (receiver -> sender): the sender writes the tail
/// of the message straight into the receiver's buffer (`process_vm_writev`) while the
/// receiver reads the head (`process_vm_readv`). aux: the sender's request; payload:
/// the receiver's request (u32), the destination address (u64), the receiver's pid
/// (i32), the source offset (u64) and the byte count (u64).
const CMA_WRITE: u8 = 7;
/// The sender's part of a split rendezvous is done (sender -> receiver). aux: the
/// receiver's request; len: bytes written, or 0 when the kernel refused the write (the
/// receiver then reads them itself); payload: an error message, if the write failed.
const CMA_DONE: u8 = 8;

/// A short eager message: `[SHORT, tag u32, ctx u64, payload]`, no source (the transport
/// knows the sender) and no length (the frame's). Small enough (13 bytes of header) that an
/// 8-byte message fits the 24 bytes of a pair line. Shared memory sends it for payloads up
/// to [`SHORT_MAX`], verbs for any frame it sends inline from the send fast path.
const SHORT: u8 = 9;
/// Bytes of the short header.
const SHORT_HDR: usize = 13;
/// Largest payload sent as a short message.
pub(crate) const SHORT_MAX: usize = weft_shm::layout::PAIR_FRAME_MAX - SHORT_HDR;

/// The short header of an eager message.
#[inline]
fn short_header(ctx: u64, tag: u32) -> [u8; SHORT_HDR] {
    let mut b = [0u8; SHORT_HDR];
    b[0] = SHORT;
    b[1..5].copy_from_slice(&tag.to_le_bytes());
    b[5..13].copy_from_slice(&ctx.to_le_bytes());
    b
}

/// The header and payload of a frame from rank `from`: a full header, or a short one
/// (an eager message) completed with `from`. `None` if too short for either.
#[inline]
fn decode_frame(from: u32, frame: &[u8]) -> Option<(Hdr, &[u8])> {
    if frame.first() == Some(&SHORT) {
        let b: &[u8; SHORT_HDR] = frame.get(..SHORT_HDR)?.try_into().ok()?;
        let payload = &frame[SHORT_HDR..];
        return Some((
            Hdr {
                kind: EAGER,
                src: from,
                tag: u32::from_le_bytes([b[1], b[2], b[3], b[4]]),
                ctx: u64::from_le_bytes([b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12]]),
                aux: 0,
                len: payload.len() as u64,
            },
            payload,
        ));
    }
    Some((Hdr::decode(frame)?, frame.get(HDR..)?))
}

/// The frame header: what every message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hdr {
    pub(crate) kind: u8,
    /// The sender's rank in the job.
    pub(crate) src: u32,
    /// The communicator's context id (a PGCID).
    pub(crate) ctx: u64,
    pub(crate) tag: u32,
    /// A request id: the sender's (RTS, FIN, CTS) or the receiver's (DATA).
    pub(crate) aux: u32,
    /// Message length (EAGER, RTS) or chunk offset (DATA).
    pub(crate) len: u64,
}

impl Hdr {
    #[inline]
    pub(crate) fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        b[0] = self.kind;
        b[4..8].copy_from_slice(&self.src.to_le_bytes());
        b[8..16].copy_from_slice(&self.ctx.to_le_bytes());
        b[16..20].copy_from_slice(&self.tag.to_le_bytes());
        b[20..24].copy_from_slice(&self.aux.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    #[inline]
    pub(crate) fn decode(b: &[u8]) -> Option<Hdr> {
        let b: &[u8; HDR] = b.get(..HDR)?.try_into().ok()?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Some(Hdr {
            kind: b[0],
            src: u32_at(4),
            ctx: u64_at(8),
            tag: u32_at(16),
            aux: u32_at(20),
            len: u64_at(24),
        })
    }
}

/// The result of a receive of a `size`-byte message into `cap` bytes.
#[inline]
fn outcome(sender: u32, tag: u32, size: usize, cap: usize) -> Result<Status, P2pError> {
    if size > cap {
        Err(P2pError::Truncated {
            sender,
            tag,
            size,
            capacity: cap,
        })
    } else {
        Ok(Status {
            source: sender,
            tag,
            count: size,
        })
    }
}

/// What [`Engine::recv_direct`] offers each frame to: takes the first matching eager frame
/// straight into the caller's buffer. A method rather than a closure so that it is inlined
/// into the transports' polls (the path from a frame's arrival to the receive's return).
struct Taker {
    buf: *mut u8,
    cap: usize,
    ctx: u64,
    src: Option<u32>,
    tag: Option<u32>,
    got: Option<Result<Status, P2pError>>,
    /// Once a matching message had to be queued (a rendezvous), later matching frames
    /// must queue behind it: messages never overtake each other.
    blocked: bool,
}

/// Something a poll offers each arrived frame to before queueing it.
trait TakeFrame {
    /// Takes `frame` from rank `from`, or returns false: not taken (it goes to the
    /// queues).
    fn offer(&mut self, from: u32, frame: &[u8]) -> bool;
}

/// Takes nothing: every frame goes to the queues.
struct TakeNone;

impl TakeFrame for TakeNone {
    #[inline(always)]
    fn offer(&mut self, _: u32, _: &[u8]) -> bool {
        false
    }
}

/// The verbs endpoint's [`Deliver`](weft_verbs::Deliver) for a progress pass: frames go to
/// `take` first, the others are kept for the queues.
struct VerbsSink<'a, T> {
    take: &'a mut T,
    taken: usize,
    scratch: &'a mut Vec<u8>,
    spans: &'a mut Vec<(u32, usize)>,
}

impl<T: TakeFrame> weft_verbs::Deliver for VerbsSink<'_, T> {
    #[inline(always)]
    fn frame(&mut self, peer: u32, frame: &[u8]) {
        if self.take.offer(peer, frame) {
            self.taken += 1;
        } else {
            keep_frame(self.scratch, self.spans, peer, frame);
        }
    }
}

impl TakeFrame for Taker {
    /// Takes `frame` from rank `from` if it is the first matching eager frame.
    #[inline(always)]
    fn offer(&mut self, from: u32, frame: &[u8]) -> bool {
        if self.got.is_some() || self.blocked {
            return false;
        }
        let Some((h, data)) = decode_frame(from, frame) else {
            return false;
        };
        if !(matches(self.ctx, self.src, self.tag, h.ctx, h.src, h.tag) && h.src == from) {
            return false;
        }
        if h.kind != EAGER {
            self.blocked = true;
            return false;
        }
        let n = data.len().min(self.cap);
        // SAFETY: `buf` is the receive buffer of `cap` >= n bytes that the caller of
        // `recv_direct` lends for the whole call; `data` is in the transport's receive
        // memory.
        unsafe { weft_shm::copy_short(data.as_ptr(), self.buf, n) };
        self.got = Some(outcome(h.src, h.tag, data.len(), self.cap));
        true
    }
}

/// Keeps a verbs frame that no receive took, for `on_frame_from` once the poll is over
/// (off the path of a frame a receive takes).
#[cold]
#[inline(never)]
fn keep_frame(scratch: &mut Vec<u8>, spans: &mut Vec<(u32, usize)>, peer: u32, frame: &[u8]) {
    scratch.extend_from_slice(frame);
    spans.push((peer, scratch.len()));
}

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

/// The way to one peer (a closed set: no `dyn` on the hot path).
#[derive(Debug)]
pub(crate) enum Path {
    /// Not connected yet (connections are made on first send).
    Unresolved,
    /// Ourselves.
    Loopback,
    /// A peer on this node: its inbox.
    Shm(Box<Outbox>),
    /// A peer reached over verbs: its RC connection.
    Verbs(ConnId),
    /// No way to reach it, and why.
    Unreachable(String),
}

/// What the resolver finds for a peer on first contact.
#[derive(Debug)]
pub(crate) enum Resolved {
    /// Its shared-memory inbox, connected.
    Shm(Box<Outbox>),
    /// Its verbs card: the engine connects to it.
    VerbsCard(Vec<u8>),
    /// No way to reach it, and why.
    Unreachable(String),
}

/// Tunables of the engine.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) eager_limit: usize,
    pub(crate) single_copy: SingleCopy,
    /// Keep verbs registrations of user buffers between messages (the user promises not
    /// to free and reuse them); otherwise each is released when its message completes.
    pub(crate) keep_registrations: bool,
    /// Single-copy rendezvous of at least this many bytes are split between the
    /// receiver (reads the head) and the sender (writes the tail) once CMA has worked;
    /// 0: never split.
    pub(crate) cma_split: usize,
}

struct Peer {
    path: Path,
    /// Frames waiting for room in the peer's ring, in order.
    backlog: VecDeque<Vec<u8>>,
    /// A single-copy read from this peer has succeeded (so a split rendezvous with it
    /// cannot end with a receiver that may not read).
    cma_ok: bool,
}

enum Body {
    Eager(Vec<u8>),
    Rts {
        sreq: u32,
        addr: u64,
        pid: i32,
        len: u64,
    },
    RtsRdma {
        sreq: u32,
        addr: u64,
        rkey: u32,
        len: u64,
    },
}

struct Unexpected {
    ctx: u64,
    src: u32,
    tag: u32,
    body: Body,
}

#[derive(Debug)]
enum Kind {
    Recv {
        buf: *mut u8,
        cap: usize,
        /// The sender it waits for (the match itself is in `State::posted`).
        src: Option<u32>,
        /// Pipelined rendezvous in progress: (sender, tag, total, received so far).
        pipe: Option<(u32, u32, usize, usize)>,
        /// A split single-copy rendezvous in progress.
        split: Option<Box<Split>>,
    },
    Send {
        buf: *const u8,
        len: usize,
        dest: u32,
        /// Pipelined rendezvous: the receiver's request and the next offset to stream.
        stream: Option<(u32, usize)>,
        /// The buffer's registration with the verbs endpoint (released on FIN).
        registered: Option<RemoteRegion>,
    },
}

/// A rendezvous offer (RTS) from `src`: its send request, buffer, pid and length.
#[derive(Debug, Clone, Copy)]
struct Offer {
    src: u32,
    tag: u32,
    sreq: u32,
    addr: u64,
    pid: i32,
    len: usize,
}

/// A single-copy rendezvous split between the receiver (head) and the sender (tail).
#[derive(Debug)]
struct Split {
    /// What the sender offered (its request, buffer and pid: to read the tail if the
    /// sender may not write it).
    offer: Offer,
    head: usize,
    tail: usize,
    /// The first failure; the receive completes with it once both parts are over.
    err: Option<String>,
    /// Since when the sender has been reported gone while its part is outstanding.
    gone_since: Option<std::time::Instant>,
}

/// An RDMA read of a rendezvous in flight: the receive it fills.
#[derive(Debug, Clone, Copy)]
struct Read {
    id: u32,
    src: u32,
    tag: u32,
    sreq: u32,
    len: usize,
    cap: usize,
    buf: *mut u8,
}

/// An RDMA read waiting for room on its connection.
#[derive(Debug, Clone, Copy)]
struct PendingRead {
    read: Read,
    addr: u64,
    rkey: u32,
}

#[derive(Debug)]
struct Req {
    kind: Kind,
    result: Option<Result<Status, P2pError>>,
    /// Which request this is, for ever: ids are reused once taken, serials never.
    serial: u64,
}

// SAFETY: the raw pointers of `Kind` and `Read` are user buffers that the call or the
// `Request` that posted them borrows (`&mut [T]` / `&[T]` of `Pod` data, themselves
// `Send`) until the request completes or is cancelled; the engine that holds them is
// only touched under its mutex, so moving it (or handing the mutex) to another thread
// moves nothing that another thread could use at the same time.
unsafe impl Send for Kind {}
// SAFETY: as for `Kind`: `buf` is a receive buffer borrowed by its request.
unsafe impl Send for Read {}

/// Resolves a peer's path (first send): what reaches `rank`.
pub(crate) type Resolver = Box<dyn FnMut(u32) -> Resolved + Send>;
/// Tells why a rank is gone, if it is.
pub(crate) type GoneCheck = Box<dyn Fn(u32) -> Option<String> + Send>;

/// A posted receive: its request and what it matches.
#[derive(Debug, Clone, Copy)]
struct Posted {
    id: u32,
    ctx: u64,
    src: Option<u32>,
    tag: Option<u32>,
}

struct State {
    me: u32,
    pid: i32,
    cfg: Config,
    peers: Vec<Peer>,
    /// Inbox sender id (local rank) -> job rank.
    sender_rank: Vec<u32>,
    /// Posted receives in posting order, with what they match (so that matching reads
    /// no request).
    posted: VecDeque<Posted>,
    unexpected: VecDeque<Unexpected>,
    reqs: Vec<Option<Req>>,
    free: Vec<u32>,
    /// The serial of the next request.
    next_serial: u64,
    /// Peers with a backlog or a stream to push.
    busy: Vec<u32>,
    resolve: Resolver,
    gone: GoneCheck,
    cma_warned: bool,
    /// The verbs endpoint, when the process has one.
    verbs: Option<Endpoint>,
    /// RDMA reads in flight.
    reads: HashMap<ReadToken, Read>,
    /// RDMA reads waiting for room.
    pending_reads: VecDeque<PendingRead>,
    /// Peers whose verbs connection failed, and why.
    failed: HashMap<u32, String>,
    /// Frames polled from the verbs endpoint, copied here so that handling them may use
    /// the endpoint (reused: no allocation in the steady state).
    scratch: Vec<u8>,
    /// (peer, end offset in `scratch`) of each polled frame.
    spans: Vec<(u32, usize)>,
}

/// One process's engine.
pub(crate) struct Engine {
    inbox: Option<Inbox>,
    st: State,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("me", &self.st.me)
            .field("posted", &self.st.posted.len())
            .field("unexpected", &self.st.unexpected.len())
            .finish()
    }
}

fn matches(
    ctx: u64,
    src: Option<u32>,
    tag: Option<u32>,
    m_ctx: u64,
    m_src: u32,
    m_tag: u32,
) -> bool {
    ctx == m_ctx && src.is_none_or(|s| s == m_src) && tag.is_none_or(|t| t == m_tag)
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
        verbs: Option<Endpoint>,
    ) -> Engine {
        let mut peers: Vec<Peer> = (0..size)
            .map(|_| Peer {
                path: Path::Unresolved,
                backlog: VecDeque::new(),
                cma_ok: false,
            })
            .collect();
        peers[me as usize].path = Path::Loopback;
        Engine {
            inbox,
            st: State {
                me,
                pid: std::process::id() as i32,
                cfg,
                peers,
                sender_rank,
                posted: VecDeque::new(),
                unexpected: VecDeque::new(),
                reqs: Vec::new(),
                free: Vec::new(),
                next_serial: 1,
                busy: Vec::new(),
                resolve,
                gone,
                cma_warned: false,
                verbs,
                reads: HashMap::new(),
                pending_reads: VecDeque::new(),
                failed: HashMap::new(),
                scratch: Vec::new(),
                spans: Vec::new(),
            },
        }
    }

    /// Polls the inbox and the verbs endpoint and pushes pending output; returns the
    /// number of frames handled.
    #[inline]
    pub(crate) fn progress(&mut self) -> usize {
        let st = &mut self.st;
        let mut n = match &mut self.inbox {
            Some(inbox) => inbox.poll(&mut |sid, frame| st.on_frame(sid, frame)),
            None => 0,
        };
        if st.verbs.is_some() {
            n += st.progress_verbs();
        }
        if !st.busy.is_empty() {
            st.flush();
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
        if !st.posted.is_empty()
            || st
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
            st.progress_verbs_with(&mut taker);
        }
        if let Some(inbox) = &mut self.inbox {
            inbox.poll(&mut |sid, frame| {
                if let Some(&from) = st.sender_rank.get(sid as usize) {
                    if taker.offer(from, frame) {
                        return;
                    }
                }
                st.on_frame(sid, frame)
            });
        } else if st.verbs.is_none() {
            return Direct::Queue;
        }
        if !st.busy.is_empty() {
            st.flush();
        }
        match taker.got {
            Some(r) => Direct::Done(r),
            // A rendezvous (or anything) that arrived meanwhile now sits in the queues.
            None if !st.unexpected.is_empty() => Direct::Queue,
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
        if !st.busy.is_empty() || !st.unexpected.is_empty() {
            return false;
        }
        if let Some(ep) = &mut st.verbs {
            if !st.reads.is_empty() || !st.pending_reads.is_empty() || !ep.idle() {
                return false;
            }
        }
        match &self.inbox {
            Some(inbox) => inbox.quiet(),
            None => st.verbs.is_some(),
        }
    }

    /// Whether a wait should pause between two looks at [`Engine::quiet`]: yes for shared
    /// memory alone (a look re-shares the cache line the sender is about to write); not
    /// with verbs, where a look is a completion-queue poll (and where PAUSE is costly
    /// under emulation: QEMU's TCG leaves its execution loop on every one).
    #[inline]
    pub(crate) fn pause_between_looks(&self) -> bool {
        self.st.verbs.is_none()
    }

    pub(crate) fn single_copy(&self) -> SingleCopy {
        self.st.cfg.single_copy
    }

    /// Why `rank` is gone, if it is.
    pub(crate) fn gone_reason(&self, rank: u32) -> Option<String> {
        (self.st.gone)(rank)
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
            .unexpected
            .iter()
            .find(|u| matches(ctx, src, tag, u.ctx, u.src, u.tag))
            .map(|u| Status {
                source: u.src,
                tag: u.tag,
                count: match &u.body {
                    Body::Eager(d) => d.len(),
                    Body::Rts { len, .. } | Body::RtsRdma { len, .. } => *len as usize,
                },
            })
    }

    /// Takes the result of a completed request (freeing it), or `None` if still running.
    pub(crate) fn take(&mut self, id: u32) -> Option<Result<Status, P2pError>> {
        let slot = self.st.reqs.get_mut(id as usize)?;
        let done = slot.as_ref().is_some_and(|r| r.result.is_some());
        if !done {
            return None;
        }
        let r = slot.take().and_then(|r| r.result);
        self.st.free.push(id);
        r
    }

    /// The serial of request `id` while the engine holds it (running, or done but not
    /// taken): a request is still live when its id has the serial it was given.
    pub(crate) fn serial(&self, id: u32) -> Option<u64> {
        self.st.reqs.get(id as usize)?.as_ref().map(|r| r.serial)
    }

    /// The peer a request waits on (for failure detection), if one.
    pub(crate) fn waits_on(&self, id: u32) -> Option<u32> {
        match &self.st.reqs.get(id as usize)?.as_ref()?.kind {
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
        if self.st.reads.values().any(|r| r.id == id)
            || self.st.pending_reads.iter().any(|p| p.read.id == id)
        {
            // The NIC may still write into its buffer: its read's completion (success or
            // error) completes it.
            return;
        }
        if !self.split_may_fail(id) {
            return;
        }
        let (peer, reason) = match self.waits_on(id) {
            Some(peer) if peer == self.st.me => return,
            Some(peer) => match (self.st.gone)(peer).or_else(|| self.st.failed.get(&peer).cloned())
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
        self.progress();
        let still = self
            .st
            .reqs
            .get(id as usize)
            .and_then(|r| r.as_ref())
            .is_some_and(|r| r.result.is_none());
        if still {
            self.st.posted.retain(|p| p.id != id);
            self.st
                .complete(id, Err(P2pError::PeerGone { rank: peer, reason }));
        }
    }

    /// Whether split receive `id` (if it is one) may fail now that its sender is
    /// reported gone: a sender marked gone may still be alive (finalized, dropped by its
    /// server) and write its part into the buffer, so only once its process is dead, or
    /// after 30 s (then with a warning).
    fn split_may_fail(&mut self, id: u32) -> bool {
        let Some(Some(Req {
            kind:
                Kind::Recv {
                    split: Some(sp),
                    pipe: Some((src, ..)),
                    ..
                },
            result: None,
            ..
        })) = self.st.reqs.get_mut(id as usize)
        else {
            return true;
        };
        let Some(pid) = rustix::process::Pid::from_raw(sp.offer.pid) else {
            return true;
        };
        if rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH) {
            return true;
        }
        let since = *sp.gone_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() < std::time::Duration::from_secs(30) {
            return false;
        }
        tracing::warn!(
            "rank {src} is reported gone but its process {} lives on; failing a split receive from it after 30 s",
            sp.offer.pid
        );
        true
    }

    fn is_recv(&self, id: u32) -> bool {
        matches!(
            self.st.reqs.get(id as usize),
            Some(Some(Req {
                kind: Kind::Recv { .. },
                ..
            }))
        )
    }

    /// If every rank but this one is gone, the lowest of them and why (else `None`).
    pub(crate) fn all_others_gone(&self) -> Option<(u32, String)> {
        self.all_gone_among(0..self.st.peers.len() as u32)
    }

    /// If every rank of `ranks` but this one is gone, the first of them and why.
    pub(crate) fn all_gone_among(&self, ranks: impl Iterator<Item = u32>) -> Option<(u32, String)> {
        let me = self.st.me;
        let mut first = None;
        for r in ranks.filter(|&r| r != me) {
            let why = (self.st.gone)(r)?;
            first.get_or_insert((r, format!("{why} (and so is every other possible sender)")));
        }
        first
    }

    /// Cancels a receive that has not matched yet; returns false if it is already
    /// matched (and must be waited for).
    pub(crate) fn cancel_recv(&mut self, id: u32) -> bool {
        let pos = self.st.posted.iter().position(|p| p.id == id);
        match pos {
            Some(i) => {
                self.st.posted.remove(i);
                self.st.reqs[id as usize] = None;
                self.st.free.push(id);
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
    }
}

impl State {
    fn alloc(&mut self, kind: Kind) -> u32 {
        let req = Req {
            kind,
            result: None,
            serial: self.next_serial,
        };
        self.next_serial += 1;
        match self.free.pop() {
            Some(id) => {
                self.reqs[id as usize] = Some(req);
                id
            }
            None => {
                // Wire ids name 2^24 slots (16 M requests at once, far past any memory).
                debug_assert!(self.reqs.len() < WIRE_SLOT_MASK as usize);
                self.reqs.push(Some(req));
                (self.reqs.len() - 1) as u32
            }
        }
    }

    /// How request `id` is named on the wire: its slot (24 bits) and the low 8 bits of
    /// its serial, so that a late frame for an earlier request of the same slot (a FIN,
    /// CTS, DATA or split-copy answer) is recognised as stale 255 times in 256.
    fn wire_id(&self, id: u32) -> u32 {
        let gen = self
            .reqs
            .get(id as usize)
            .and_then(|r| r.as_ref())
            .map_or(0, |r| r.serial as u32 & 0xff);
        (id & WIRE_SLOT_MASK) | (gen << 24)
    }

    /// The live request a wire id from a peer names, if it still is the one it was.
    fn own(&self, wire: u32) -> Option<u32> {
        let id = wire & WIRE_SLOT_MASK;
        let r = self.reqs.get(id as usize)?.as_ref()?;
        (r.serial as u32 & 0xff == wire >> 24).then_some(id)
    }

    fn complete(&mut self, id: u32, r: Result<Status, P2pError>) {
        if let Some(Some(req)) = self.reqs.get_mut(id as usize) {
            req.result = Some(r);
        }
    }

    fn path(&mut self, dest: u32) -> Result<(), P2pError> {
        let size = self.peers.len() as u32;
        let Some(peer) = self.peers.get_mut(dest as usize) else {
            return Err(P2pError::InvalidRank { rank: dest, size });
        };
        if let (Path::Unresolved, Some(c)) = (
            &peer.path,
            self.verbs.as_ref().and_then(|ep| ep.conn_of(dest)),
        ) {
            // It connected to us first: answer on that connection.
            peer.path = Path::Verbs(c);
        }
        if let Path::Unresolved = peer.path {
            peer.path = match (self.resolve)(dest) {
                Resolved::Shm(o) => Path::Shm(o),
                Resolved::Unreachable(why) => Path::Unreachable(why),
                Resolved::VerbsCard(card) => match &mut self.verbs {
                    None => Path::Unreachable("the verbs transport is not open".into()),
                    Some(ep) => match ep.connect(dest, &card) {
                        Ok(c) => Path::Verbs(c),
                        Err(e) => Path::Unreachable(format!("verbs connection failed: {e}")),
                    },
                },
            };
        }
        match &self.peers[dest as usize].path {
            Path::Unreachable(why) => Err(P2pError::NoPath {
                rank: dest,
                reason: why.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Sends a frame to `dest` or queues it behind earlier ones.
    fn push(&mut self, dest: u32, hdr: &[u8], payload: &[u8]) {
        if let Path::Unresolved = self.peers[dest as usize].path {
            // A control frame (FIN, CTS) to a peer we never sent to: connect now. A peer
            // that sent us a frame is reachable; if not, the frame is dropped with a log.
            if let Err(e) = self.path(dest) {
                tracing::error!("cannot answer rank {dest}: {e}");
                return;
            }
        }
        let peer = &mut self.peers[dest as usize];
        if peer.backlog.is_empty() {
            let sent = match &mut peer.path {
                Path::Shm(out) => Ok(out.try_send(hdr, payload)),
                Path::Verbs(conn) => match &mut self.verbs {
                    Some(ep) => ep.try_send(*conn, hdr, payload),
                    None => Ok(false),
                },
                _ => Ok(false),
            };
            match sent {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => return self.verbs_failed(dest, &e),
            }
        }
        let mut f = Vec::with_capacity(hdr.len() + payload.len());
        f.extend_from_slice(hdr);
        f.extend_from_slice(payload);
        peer.backlog.push_back(f);
        if !self.busy.contains(&dest) {
            self.busy.push(dest);
        }
    }

    fn max_payload(&self, dest: u32) -> usize {
        match &self.peers[dest as usize].path {
            Path::Shm(o) => o.max_frame().saturating_sub(HDR),
            Path::Verbs(c) => self
                .verbs
                .as_ref()
                .map_or(0, |ep| ep.max_frame(*c).saturating_sub(HDR)),
            _ => usize::MAX,
        }
    }

    fn send(
        &mut self,
        buf: *const u8,
        len: usize,
        dest: u32,
        ctx: u64,
        tag: u32,
    ) -> Result<Option<u32>, P2pError> {
        // The fast path: a short message to a connected local peer with nothing queued.
        if len <= SHORT_MAX && len <= self.cfg.eager_limit {
            if let Some(Peer {
                path: Path::Shm(out),
                backlog,
                ..
            }) = self.peers.get_mut(dest as usize)
            {
                // SAFETY: the caller guarantees `buf` points to `len` readable bytes for
                // the duration of this call.
                let data = unsafe { std::slice::from_raw_parts(buf, len) };
                if backlog.is_empty() && out.try_send(&short_header(ctx, tag), data) {
                    return Ok(None);
                }
            }
        }
        // The same for a peer reached by verbs: small frames go inline, the endpoint
        // checks the rest (readiness, credits, room) and says no when it must queue.
        if len <= self.cfg.eager_limit {
            if let (
                Some(Peer {
                    path: Path::Verbs(conn),
                    backlog,
                    ..
                }),
                Some(ep),
            ) = (self.peers.get_mut(dest as usize), self.verbs.as_mut())
            {
                if backlog.is_empty() && len + SHORT_HDR <= ep.max_inline() {
                    // A short header: the endpoint names the sender and the frame's length
                    // is the message's.
                    let hdr = short_header(ctx, tag);
                    // SAFETY: as above, `buf` holds `len` readable bytes during this call.
                    let data = unsafe { std::slice::from_raw_parts(buf, len) };
                    // Not sent (Ok(false), or an error the slow path reports): go on.
                    if let Ok(true) = ep.try_send(*conn, &hdr, data) {
                        return Ok(None);
                    }
                }
            }
        }
        self.send_general(buf, len, dest, ctx, tag)
    }

    /// [`State::send`] beyond its fast paths: unconnected peers, loopback, queued
    /// frames, larger eager messages, rendezvous.
    #[inline(never)]
    fn send_general(
        &mut self,
        buf: *const u8,
        len: usize,
        dest: u32,
        ctx: u64,
        tag: u32,
    ) -> Result<Option<u32>, P2pError> {
        self.path(dest)?;
        let me = self.me;
        if dest == me {
            // Loopback is always buffered (one copy when the receive is already posted),
            // so a send to oneself never waits for its own receive.
            // SAFETY: the caller guarantees `buf` points to `len` readable bytes for the
            // duration of this call (it is borrowed by the send request).
            let data = unsafe { std::slice::from_raw_parts(buf, len) };
            let hdr = Hdr {
                kind: EAGER,
                src: me,
                ctx,
                tag,
                aux: 0,
                len: len as u64,
            };
            self.on_eager(hdr, data);
            return Ok(None);
        }
        if let Path::Verbs(conn) = self.peers[dest as usize].path {
            self.wait_connected(dest, conn)?;
        }
        let eager = len <= self.cfg.eager_limit.min(self.max_payload(dest));
        if eager && len <= SHORT_MAX && matches!(self.peers[dest as usize].path, Path::Shm(_)) {
            // SAFETY: as above, `buf` holds `len` readable bytes during this call.
            let data = unsafe { std::slice::from_raw_parts(buf, len) };
            self.push(dest, &short_header(ctx, tag), data);
            return Ok(None);
        }
        if eager {
            let hdr = Hdr {
                kind: EAGER,
                src: me,
                ctx,
                tag,
                aux: 0,
                len: len as u64,
            }
            .encode();
            // SAFETY: as above, `buf` holds `len` readable bytes during this call.
            let data = unsafe { std::slice::from_raw_parts(buf, len) };
            self.push(dest, &hdr, data);
            return Ok(None);
        }
        if let Path::Verbs(_) = self.peers[dest as usize].path {
            return self.send_rdma(buf, len, dest, ctx, tag).map(Some);
        }
        let id = self.alloc(Kind::Send {
            buf,
            len,
            dest,
            stream: None,
            registered: None,
        });
        let hdr = Hdr {
            kind: RTS,
            src: me,
            ctx,
            tag,
            aux: self.wire_id(id),
            len: len as u64,
        }
        .encode();
        let mut p = [0u8; 12];
        p[..8].copy_from_slice(&(buf as u64).to_le_bytes());
        p[8..].copy_from_slice(&self.pid.to_le_bytes());
        self.push(dest, &hdr, &p);
        Ok(Some(id))
    }

    fn recv(
        &mut self,
        buf: *mut u8,
        cap: usize,
        ctx: u64,
        src: Option<u32>,
        tag: Option<u32>,
    ) -> u32 {
        let id = self.alloc(Kind::Recv {
            buf,
            cap,
            src,
            pipe: None,
            split: None,
        });
        if let Some(i) = self
            .unexpected
            .iter()
            .position(|u| matches(ctx, src, tag, u.ctx, u.src, u.tag))
        {
            let u = self.unexpected.remove(i).expect("index from position");
            match u.body {
                Body::Eager(data) => self.fill(id, u.src, u.tag, &data),
                Body::Rts {
                    sreq,
                    addr,
                    pid,
                    len,
                } => self.rts_matched(id, u.src, u.tag, sreq, addr, pid, len),
                Body::RtsRdma {
                    sreq,
                    addr,
                    rkey,
                    len,
                } => self.rdma_matched(id, u.src, u.tag, sreq, addr, rkey, len),
            }
        } else {
            self.posted.push_back(Posted { id, ctx, src, tag });
        }
        id
    }

    /// The buffer and capacity of live receive request `id`.
    fn recv_buffer(&self, id: u32) -> Option<(*mut u8, usize)> {
        match self.reqs.get(id as usize) {
            Some(Some(Req {
                kind: Kind::Recv { buf, cap, .. },
                ..
            })) => Some((*buf, *cap)),
            _ => None,
        }
    }

    /// Removes and returns the first posted receive matching a message.
    #[inline]
    fn match_posted(&mut self, ctx: u64, src: u32, tag: u32) -> Option<u32> {
        let i = self
            .posted
            .iter()
            .position(|p| matches(p.ctx, p.src, p.tag, ctx, src, tag))?;
        // Usually the oldest posted receive: a pop, not a general removal.
        let p = if i == 0 {
            self.posted.pop_front()
        } else {
            self.posted.remove(i)
        };
        p.map(|p| p.id)
    }

    /// Copies an eager message into a receive and completes it.
    #[inline]
    fn fill(&mut self, id: u32, src: u32, tag: u32, data: &[u8]) {
        let Some((buf, cap)) = self.recv_buffer(id) else {
            return;
        };
        let n = data.len().min(cap);
        // SAFETY: `buf` is the receive buffer of a live request (borrowed mutably by it for
        // its whole life) with room for `cap` >= n bytes; `data` is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf, n) };
        let r = outcome(src, tag, data.len(), cap);
        self.complete(id, r);
    }

    fn on_eager(&mut self, h: Hdr, data: &[u8]) {
        match self.match_posted(h.ctx, h.src, h.tag) {
            Some(id) => self.fill(id, h.src, h.tag, data),
            None => self.unexpected.push_back(Unexpected {
                ctx: h.ctx,
                src: h.src,
                tag: h.tag,
                body: Body::Eager(data.to_vec()),
            }),
        }
    }

    fn on_rts(&mut self, h: Hdr, addr: u64, pid: i32) {
        match self.match_posted(h.ctx, h.src, h.tag) {
            Some(id) => self.rts_matched(id, h.src, h.tag, h.aux, addr, pid, h.len),
            None => self.unexpected.push_back(Unexpected {
                ctx: h.ctx,
                src: h.src,
                tag: h.tag,
                body: Body::Rts {
                    sreq: h.aux,
                    addr,
                    pid,
                    len: h.len,
                },
            }),
        }
    }

    /// Tells `to` that its rendezvous send `sreq` is over (its buffer is free).
    fn fin(&mut self, to: u32, tag: u32, sreq: u32) {
        self.control(to, FIN, tag, sreq, 0, &[]);
    }

    /// Sends control frame `kind` (no communicator) to `to`.
    fn control(&mut self, to: u32, kind: u8, tag: u32, aux: u32, len: u64, payload: &[u8]) {
        let hdr = Hdr {
            kind,
            src: self.me,
            ctx: 0,
            tag,
            aux,
            len,
        }
        .encode();
        self.push(to, &hdr, payload);
    }

    #[allow(clippy::too_many_arguments)]
    fn rts_matched(
        &mut self,
        id: u32,
        src: u32,
        tag: u32,
        sreq: u32,
        addr: u64,
        pid: i32,
        len: u64,
    ) {
        let Some((buf, cap)) = self.recv_buffer(id) else {
            return;
        };
        let len = len as usize;
        let n = len.min(cap);
        let done = |st: &mut State| {
            let r = outcome(src, tag, len, cap);
            st.complete(id, r);
        };
        if self.cfg.single_copy == SingleCopy::Cma
            && self.peers[src as usize].cma_ok
            && self.cfg.cma_split > 0
            && n >= self.cfg.cma_split
        {
            let offer = Offer {
                src,
                tag,
                sreq,
                addr,
                pid,
                len,
            };
            return self.cma_split(id, offer, buf, n);
        }
        if self.cfg.single_copy == SingleCopy::Cma {
            // SAFETY: `buf` is this receive's buffer, valid for `cap` >= n bytes.
            let dst = unsafe { std::slice::from_raw_parts_mut(buf, n) };
            match weft_shm::cma_read(pid, addr as usize, dst) {
                Ok(()) => {
                    self.peers[src as usize].cma_ok = true;
                    self.fin(src, tag, sreq);
                    return done(self);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::Unsupported
                    ) =>
                {
                    if !self.cma_warned {
                        tracing::info!("single-copy (CMA) refused ({e}); using pipelined copies through shared memory");
                        self.cma_warned = true;
                    }
                    self.cfg.single_copy = SingleCopy::None;
                }
                Err(e) => {
                    let reason = format!("single-copy read from rank {src} failed: {e}");
                    return self.complete(id, Err(P2pError::PeerGone { rank: src, reason }));
                }
            }
        }
        // Pipelined: ask the sender to stream the data.
        if let Some(Some(Req {
            kind: Kind::Recv { pipe, .. },
            ..
        })) = self.reqs.get_mut(id as usize)
        {
            *pipe = Some((src, tag, len, 0));
        }
        let rreq = self.wire_id(id);
        self.control(src, CTS, tag, sreq, 0, &rreq.to_le_bytes());
        if len == 0 {
            done(self);
        }
    }

    /// A split single-copy rendezvous (receiver side): asks the sender to write the
    /// tail of the `n` bytes into `buf` while this process reads the head. The receive
    /// completes, and FIN releases the sender's buffer, when both parts are in
    /// (`split_progress`).
    fn cma_split(&mut self, id: u32, o: Offer, buf: *mut u8, n: usize) {
        let (src, tag, sreq, len) = (o.src, o.tag, o.sreq, o.len);
        let head = (n / 2) & !4095;
        let tail = n - head;
        let serial = self
            .reqs
            .get(id as usize)
            .and_then(|r| r.as_ref())
            .map_or(0, |r| r.serial);
        let mut p = [0u8; 40];
        p[32..40].copy_from_slice(&serial.to_le_bytes());
        p[..4].copy_from_slice(&self.wire_id(id).to_le_bytes());
        p[4..12].copy_from_slice(&(buf as u64 + head as u64).to_le_bytes());
        p[12..16].copy_from_slice(&self.pid.to_le_bytes());
        p[16..24].copy_from_slice(&(head as u64).to_le_bytes());
        p[24..32].copy_from_slice(&(tail as u64).to_le_bytes());
        self.control(src, CMA_WRITE, tag, sreq, 0, &p);
        if let Some(Some(Req {
            kind: Kind::Recv { pipe, split, .. },
            ..
        })) = self.reqs.get_mut(id as usize)
        {
            // Counted in message bytes: what truncation drops is done already.
            *pipe = Some((src, tag, len, len - n));
            *split = Some(Box::new(Split {
                offer: o,
                head,
                tail,
                err: None,
                gone_since: None,
            }));
        }
        // SAFETY: `buf` is this receive's buffer, valid for `cap` >= n >= head bytes; the
        // sender writes only bytes head..n.
        let dst = unsafe { std::slice::from_raw_parts_mut(buf, head) };
        if let Err(e) = weft_shm::cma_read(o.pid, o.addr as usize, dst) {
            self.split_error(id, format!("single-copy read from rank {src} failed: {e}"));
        }
        self.split_progress(id, src, head);
    }

    /// Records the first error of a split receive (it completes with it).
    fn split_error(&mut self, id: u32, reason: String) {
        if let Some(Some(Req {
            kind: Kind::Recv {
                split: Some(sp), ..
            },
            ..
        })) = self.reqs.get_mut(id as usize)
        {
            sp.err.get_or_insert(reason);
        }
    }

    /// Adds `bytes` (done, or failed for good) to split receive `id`; when every byte is
    /// accounted for, tells the sender (FIN) and completes the receive.
    fn split_progress(&mut self, id: u32, from: u32, bytes: usize) {
        let Some(Some(Req {
            kind:
                Kind::Recv {
                    cap,
                    pipe: Some((src, tag, total, got)),
                    split,
                    ..
                },
            result: None,
            ..
        })) = self.reqs.get_mut(id as usize)
        else {
            return;
        };
        if *src != from || split.is_none() {
            return;
        }
        *got += bytes;
        if *got < *total {
            return;
        }
        let (src, tag, total, cap) = (*src, *tag, *total, *cap);
        let Some(sp) = split.take() else { return };
        self.fin(src, tag, sp.offer.sreq);
        let r = match sp.err {
            Some(reason) => Err(P2pError::Transport { rank: src, reason }),
            None => outcome(src, tag, total, cap),
        };
        self.complete(id, r);
    }

    /// The sender side of a split rendezvous: writes its part into the receiver, then
    /// says so (CMA_DONE: the byte count, 0 if the kernel refused, or an error).
    fn on_cma_write(&mut self, h: Hdr, p: &[u8]) {
        let word = |a: usize, b: usize| -> u64 {
            let mut w = [0u8; 8];
            w[..b - a].copy_from_slice(&p[a..b]);
            u64::from_le_bytes(w)
        };
        let serial = word(32, 40).to_le_bytes();
        let (rreq, dst, pid, off, count) = (
            word(0, 4) as u32,
            word(4, 12),
            word(12, 16) as u32 as i32,
            word(16, 24) as usize,
            word(24, 32) as usize,
        );
        let send = match self.own(h.aux).and_then(|id| self.reqs.get(id as usize)) {
            Some(Some(Req {
                kind: Kind::Send { buf, len, dest, .. },
                result: None,
                ..
            })) if *dest == h.src => Some((*buf, *len)),
            _ => None,
        };
        let Some((buf, _)) =
            send.filter(|&(_, len)| off.checked_add(count).is_some_and(|e| e <= len))
        else {
            let why = format!(
                "rank {} asked rank {} to write bytes {off}..{} of send {}, which it does not have",
                h.src,
                self.me,
                off.saturating_add(count),
                h.aux
            );
            tracing::error!("{why}");
            return self.cma_done(h.src, h.tag, rreq, serial, 0, &why);
        };
        // Write only into the process that owns the inbox we reach this rank through:
        // a wrong pid (a bug, or a pid reused after the receiver died) is refused.
        let owner = match &self.peers.get(h.src as usize).map(|p| &p.path) {
            Some(Path::Shm(o)) => Some(o.receiver_pid()),
            _ => None,
        };
        if owner != Some(pid as u32) {
            let why = format!(
                "rank {} asked for a single-copy write into pid {pid}, but its inbox belongs to {}",
                h.src,
                owner.map_or_else(|| "no known process".to_string(), |p| format!("pid {p}"))
            );
            tracing::error!("{why}");
            return self.cma_done(h.src, h.tag, rreq, serial, 0, &why);
        }
        // SAFETY: the send request is live (its FIN, which the receiver sends only after
        // this part, has not come), so its buffer is borrowed; off + count <= len.
        let part = unsafe { std::slice::from_raw_parts(buf.add(off), count) };
        let (written, why) = match weft_shm::cma_write(pid, dst as usize, part) {
            Ok(()) => (count as u64, String::new()),
            // The receiver reads the part itself.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::Unsupported
                ) =>
            {
                (0, String::new())
            }
            Err(e) => (
                0,
                format!("single-copy write to rank {} failed: {e}", h.src),
            ),
        };
        self.cma_done(h.src, h.tag, rreq, serial, written, &why);
    }

    /// CMA_DONE to `to`: the receive `rreq` (with its serial), bytes written, and an
    /// error message if the write failed.
    fn cma_done(&mut self, to: u32, tag: u32, rreq: u32, serial: [u8; 8], written: u64, why: &str) {
        let mut p = Vec::with_capacity(8 + why.len());
        p.extend_from_slice(&serial);
        p.extend_from_slice(why.as_bytes());
        self.control(to, CMA_DONE, tag, rreq, written, &p);
    }

    /// The sender's part of a split rendezvous is done, refused or failed.
    fn on_cma_done(&mut self, h: Hdr, p: &[u8]) {
        let Some(id) = self.own(h.aux) else {
            return;
        };
        let Some((serial, why)) = p.split_first_chunk::<8>() else {
            return;
        };
        let serial = u64::from_le_bytes(*serial);
        // Only the live split receive this answer is for: ids are reused, serials not.
        let (buf, sp_addr, sp_pid, head, tail) = match self.reqs.get(id as usize) {
            Some(Some(Req {
                kind:
                    Kind::Recv {
                        buf,
                        pipe: Some((src, ..)),
                        split: Some(sp),
                        ..
                    },
                result: None,
                serial: live,
            })) if *src == h.src && *live == serial => {
                (*buf, sp.offer.addr, sp.offer.pid, sp.head, sp.tail)
            }
            _ => return,
        };
        if !why.is_empty() {
            self.split_error(id, String::from_utf8_lossy(why).into_owned());
        } else if h.len == 0 {
            // Refused: the sender's buffer is still ours to read (no FIN yet).
            // SAFETY: bytes head..head+tail of this receive's buffer, which the sender
            // did not write.
            let dst = unsafe { std::slice::from_raw_parts_mut(buf.add(head), tail) };
            if let Err(e) = weft_shm::cma_read(sp_pid, sp_addr as usize + head, dst) {
                let reason = format!("single-copy read from rank {} failed: {e}", h.src);
                self.split_error(id, reason);
            }
        }
        self.split_progress(id, h.src, tail);
    }

    /// A frame from the inbox, from local sender `sid`.
    fn on_frame(&mut self, sid: u32, frame: &[u8]) {
        match self.sender_rank.get(sid as usize) {
            Some(&rank) => self.on_frame_from(rank, frame),
            None => tracing::error!("dropping a frame from unknown local sender {sid}"),
        }
    }

    /// A frame from job rank `from` (as the transport knows it).
    fn on_frame_from(&mut self, from: u32, frame: &[u8]) {
        let Some((h, payload)) = decode_frame(from, frame) else {
            tracing::error!(
                "dropping a frame of {} bytes from rank {from}: shorter than a header",
                frame.len()
            );
            return;
        };
        if h.src as usize >= self.peers.len() || h.src != from {
            tracing::error!(
                "dropping a frame from rank {from} that claims rank {}",
                h.src
            );
            return;
        }
        match h.kind {
            EAGER => self.on_eager(h, payload),
            RTS if payload.len() >= 12 => {
                let addr = u64::from_le_bytes(payload[..8].try_into().unwrap_or([0; 8]));
                let pid = i32::from_le_bytes(payload[8..12].try_into().unwrap_or([0; 4]));
                self.on_rts(h, addr, pid)
            }
            RTS_RDMA if payload.len() >= 12 => {
                let addr = u64::from_le_bytes(payload[..8].try_into().unwrap_or([0; 8]));
                let rkey = u32::from_le_bytes(payload[8..12].try_into().unwrap_or([0; 4]));
                match self.match_posted(h.ctx, h.src, h.tag) {
                    Some(id) => self.rdma_matched(id, h.src, h.tag, h.aux, addr, rkey, h.len),
                    None => self.unexpected.push_back(Unexpected {
                        ctx: h.ctx,
                        src: h.src,
                        tag: h.tag,
                        body: Body::RtsRdma {
                            sreq: h.aux,
                            addr,
                            rkey,
                            len: h.len,
                        },
                    }),
                }
            }
            FIN => {
                // Only the peer a pending send went to may complete it.
                if let Some(Some(Req {
                    kind:
                        Kind::Send {
                            dest,
                            len,
                            buf,
                            registered,
                            ..
                        },
                    result: None, ..
                })) = self.own(h.aux).and_then(|id| self.reqs.get(id as usize)).filter(|r| matches!(r, Some(Req { kind: Kind::Send { dest, .. }, .. }) if *dest == h.src))
                {
                    let s = Status {
                        source: *dest,
                        tag: h.tag,
                        count: *len,
                    };
                    let (buf, len, registered) = (*buf, *len, *registered);
                    if let (Some(region), Some(ep)) = (registered, &mut self.verbs) {
                        // Ends this send's exposure only (other sends of the same buffer may
                        // still be read). Without kept registrations the endpoint never looks
                        // registrations up again (WEFT_VERBS_RCACHE off), so a buffer freed
                        // and reused is registered afresh.
                        ep.release(region);
                    }
                    let _ = (buf, len);
                    if let Some(id) = self.own(h.aux) {
                        self.complete(id, Ok(s));
                    }
                }
            }
            CTS if payload.len() >= 4 => {
                let rreq = u32::from_le_bytes(payload[..4].try_into().unwrap_or([0; 4]));
                if let Some(Some(Req {
                    kind: Kind::Send { stream: stream @ None, dest, .. },
                    result: None, ..
                })) = self.own(h.aux).and_then(|id| self.reqs.get_mut(id as usize)).filter(|r| matches!(r, Some(Req { kind: Kind::Send { dest, .. }, .. }) if *dest == h.src))
                {
                    *stream = Some((rreq, 0));
                    let d = *dest;
                    if !self.busy.contains(&d) {
                        self.busy.push(d);
                    }
                }
            }
            DATA => self.on_data(h, payload),
            // Five fields and the receive's serial: 40 bytes.
            CMA_WRITE if payload.len() >= 40 => self.on_cma_write(h, payload),
            CMA_DONE => self.on_cma_done(h, payload),
            k => tracing::error!(
                "dropping a frame of kind {k} ({} bytes) from rank {}: unknown kind or too short",
                frame.len(),
                h.src
            ),
        }
    }

    fn on_data(&mut self, h: Hdr, chunk: &[u8]) {
        let Some(id) = self.own(h.aux) else {
            return;
        };
        let Some(Some(Req {
            kind:
                Kind::Recv {
                    buf,
                    cap,
                    pipe: Some((src, tag, total, got)),
                    split: None,
                    ..
                },
            result: None,
            ..
        })) = self.reqs.get_mut(id as usize)
        else {
            return;
        };
        if *src != h.src {
            tracing::error!(
                "dropping a data chunk from rank {} for a receive from rank {src}",
                h.src
            );
            return;
        }
        let off = h.len as usize;
        if off < *cap {
            let n = chunk.len().min(*cap - off);
            // SAFETY: `buf` is the live receive buffer of `cap` bytes and off + n <= cap.
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), buf.add(off), n) };
        }
        *got += chunk.len();
        if *got >= *total {
            let (src, tag, total, cap) = (*src, *tag, *total, *cap);
            let r = outcome(src, tag, total, cap);
            self.complete(id, r);
        }
    }

    /// Waits until the verbs connection to `dest` is up (the first send to a peer pays
    /// its handshake), so that a send that returns has handed its frame to the NIC
    /// rather than left it waiting for a handshake the caller might never progress.
    fn wait_connected(&mut self, dest: u32, conn: ConnId) -> Result<(), P2pError> {
        let mut spins = 0u32;
        loop {
            match &self.verbs {
                Some(ep) if ep.is_ready(conn) => return Ok(()),
                Some(_) => {}
                None => return Ok(()),
            }
            self.progress_verbs();
            if let Some(reason) = self.failed.get(&dest) {
                return Err(P2pError::PeerGone {
                    rank: dest,
                    reason: reason.clone(),
                });
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                if let Some(reason) = (self.gone)(dest) {
                    return Err(P2pError::PeerGone { rank: dest, reason });
                }
                std::thread::yield_now();
            }
        }
    }

    /// A rendezvous send over verbs: registers the buffer and offers it with RTS_RDMA;
    /// the receiver reads it and answers FIN.
    fn send_rdma(
        &mut self,
        buf: *const u8,
        len: usize,
        dest: u32,
        ctx: u64,
        tag: u32,
    ) -> Result<u32, P2pError> {
        let Some(ep) = &mut self.verbs else {
            return Err(P2pError::NoPath {
                rank: dest,
                reason: "the verbs transport is not open".into(),
            });
        };
        // An empty message has nothing to read (and an empty buffer nothing to register).
        let region = if len == 0 {
            None
        } else {
            Some(ep.register(buf, len).map_err(|e| P2pError::Transport {
                rank: dest,
                reason: format!("registering the {len}-byte send buffer: {e}"),
            })?)
        };
        let (addr, rkey) = region.map_or((0, 0), |r| (r.addr, r.rkey));
        let id = self.alloc(Kind::Send {
            buf,
            len,
            dest,
            stream: None,
            registered: region,
        });
        let hdr = Hdr {
            kind: RTS_RDMA,
            src: self.me,
            ctx,
            tag,
            aux: self.wire_id(id),
            len: len as u64,
        }
        .encode();
        let mut p = [0u8; 12];
        p[..8].copy_from_slice(&addr.to_le_bytes());
        p[8..].copy_from_slice(&rkey.to_le_bytes());
        self.push(dest, &hdr, &p);
        Ok(id)
    }

    /// A receive matched an RTS_RDMA: read the data straight into its buffer.
    #[allow(clippy::too_many_arguments)]
    fn rdma_matched(
        &mut self,
        id: u32,
        src: u32,
        tag: u32,
        sreq: u32,
        addr: u64,
        rkey: u32,
        len: u64,
    ) {
        let Some((buf, cap)) = self.recv_buffer(id) else {
            return;
        };
        let read = Read {
            id,
            src,
            tag,
            sreq,
            len: len as usize,
            cap,
            buf,
        };
        self.pending_reads
            .push_back(PendingRead { read, addr, rkey });
        self.start_reads();
    }

    /// Starts the RDMA reads waiting for room, in order.
    fn start_reads(&mut self) {
        while let Some(p) = self.pending_reads.front().copied() {
            let r = p.read;
            let n = r.len.min(r.cap);
            if n == 0 {
                self.pending_reads.pop_front();
                self.read_done(r, Ok(()));
                continue;
            }
            if let Err(e) = self.path(r.src) {
                self.pending_reads.pop_front();
                self.complete(r.id, Err(e));
                continue;
            }
            let Path::Verbs(conn) = self.peers[r.src as usize].path else {
                self.pending_reads.pop_front();
                let reason = "a verbs rendezvous from a peer not reached over verbs".into();
                self.complete(
                    r.id,
                    Err(P2pError::Transport {
                        rank: r.src,
                        reason,
                    }),
                );
                continue;
            };
            let Some(ep) = &mut self.verbs else { return };
            // SAFETY: `r.buf` is the buffer of a live receive request, valid for `cap` >= n
            // bytes; the request cannot complete (and so release the buffer) before this
            // read is reported by `poll_reads`: `fail_if_gone` skips requests with reads
            // in flight, and only `read_done` completes it.
            match unsafe { ep.rdma_read(conn, r.buf, n, p.addr, p.rkey) } {
                Ok(Some(token)) => {
                    self.pending_reads.pop_front();
                    self.reads.insert(token, r);
                }
                Ok(None) => return,
                Err(e) => {
                    self.pending_reads.pop_front();
                    self.read_done(r, Err(e.to_string()));
                }
            }
        }
    }

    /// An RDMA read finished: complete the receive, tell the sender.
    fn read_done(&mut self, r: Read, res: Result<(), String>) {
        if !self.cfg.keep_registrations && r.len.min(r.cap) > 0 {
            if let Some(ep) = &mut self.verbs {
                ep.invalidate(r.buf, r.len.min(r.cap));
            }
        }
        match res {
            Ok(()) => {
                self.fin(r.src, r.tag, r.sreq);
                self.complete(r.id, outcome(r.src, r.tag, r.len, r.cap));
            }
            Err(reason) => {
                self.failed.entry(r.src).or_insert_with(|| reason.clone());
                self.complete(
                    r.id,
                    Err(P2pError::PeerGone {
                        rank: r.src,
                        reason: format!("RDMA read failed: {reason}"),
                    }),
                );
            }
        }
    }

    /// Polls the verbs endpoint: frames, finished reads, waiting reads.
    fn progress_verbs(&mut self) -> usize {
        self.progress_verbs_with(&mut TakeNone)
    }

    /// [`State::progress_verbs`], offering each frame to `take` first (a direct receive:
    /// true when it consumed the frame).
    #[inline(always)]
    fn progress_verbs_with<T: TakeFrame>(&mut self, take: &mut T) -> usize {
        let Some(ep) = &mut self.verbs else {
            return 0;
        };
        // `scratch` and `spans` are empty between calls.
        let mut sink = VerbsSink {
            take,
            taken: 0,
            scratch: &mut self.scratch,
            spans: &mut self.spans,
        };
        let polled = ep.poll_with(&mut sink);
        let taken = sink.taken;
        // The idle poll (and a frame taken straight into a receive) ends here: this runs
        // in every spin of a wait.
        if self.spans.is_empty()
            && polled.is_ok()
            && self.reads.is_empty()
            && self.pending_reads.is_empty()
        {
            return taken;
        }
        let mut done = Vec::new();
        if !self.reads.is_empty() {
            ep.poll_reads(&mut |token, res| done.push((token, res.map_err(|e| e.to_string()))));
        }
        let frames = self.spans.len() + taken;
        let (scratch, spans) = (
            std::mem::take(&mut self.scratch),
            std::mem::take(&mut self.spans),
        );
        let mut start = 0;
        for &(peer, end) in &spans {
            self.on_frame_from(peer, &scratch[start..end]);
            start = end;
        }
        let (mut scratch, mut spans) = (scratch, spans);
        scratch.clear();
        spans.clear();
        (self.scratch, self.spans) = (scratch, spans);
        if let Err(e) = polled {
            match e.peer() {
                Some(peer) => self.verbs_failed(peer, &e),
                None => tracing::error!("verbs: {e}"),
            }
        }
        for (token, res) in done {
            if let Some(r) = self.reads.remove(&token) {
                self.read_done(r, res);
            }
        }
        if !self.pending_reads.is_empty() {
            self.start_reads();
        }
        frames
    }

    /// The verbs connection to `peer` failed: everything waiting on it fails, naming the
    /// completion status.
    fn verbs_failed(&mut self, peer: u32, e: &weft_verbs::Error) {
        let reason = e.to_string();
        tracing::error!("verbs connection to rank {peer} failed: {reason}");
        self.failed.entry(peer).or_insert_with(|| reason.clone());
        self.peers[peer as usize].backlog.clear();
        let ids: Vec<u32> = self
            .reqs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let r = r.as_ref()?;
                if r.result.is_some() {
                    return None;
                }
                let waits = match &r.kind {
                    Kind::Send { dest, .. } => *dest == peer,
                    Kind::Recv { src, .. } => *src == Some(peer),
                };
                let reading = self.reads.values().any(|x| x.id == i as u32);
                (waits && !reading).then_some(i as u32)
            })
            .collect();
        for id in ids {
            self.posted.retain(|p| p.id != id);
            self.complete(
                id,
                Err(P2pError::PeerGone {
                    rank: peer,
                    reason: reason.clone(),
                }),
            );
        }
    }

    /// Pushes backlogs and pipelined streams as far as the rings allow.
    fn flush(&mut self) {
        let busy = std::mem::take(&mut self.busy);
        for dest in busy {
            let peer = &mut self.peers[dest as usize];
            if let Path::Verbs(conn) = peer.path {
                let Some(ep) = &mut self.verbs else {
                    continue;
                };
                let mut failure = None;
                while let Some(f) = peer.backlog.front() {
                    // The whole frame: a short header is shorter than HDR.
                    match ep.try_send(conn, f, &[]) {
                        Ok(true) => {
                            peer.backlog.pop_front();
                        }
                        Ok(false) => break,
                        Err(e) => {
                            failure = Some(e);
                            break;
                        }
                    }
                }
                if let Some(e) = failure {
                    self.verbs_failed(dest, &e);
                } else if !self.peers[dest as usize].backlog.is_empty() {
                    self.busy.push(dest);
                }
                continue;
            }
            let Path::Shm(out) = &mut peer.path else {
                continue;
            };
            while let Some(f) = peer.backlog.front() {
                // A whole frame (a short header is shorter than HDR).
                if out.try_send(f, &[]) {
                    peer.backlog.pop_front();
                } else {
                    break;
                }
            }
            let mut more = !peer.backlog.is_empty();
            if !more {
                let chunk = out.max_frame() - HDR;
                let me = self.me;
                for (id, slot) in self.reqs.iter_mut().enumerate() {
                    let Some(Req {
                        kind:
                            Kind::Send {
                                buf,
                                len,
                                dest: d,
                                stream,
                                ..
                            },
                        result,
                        ..
                    }) = slot
                    else {
                        continue;
                    };
                    if *d != dest {
                        continue;
                    }
                    let Some((rreq, off)) = stream else { continue };
                    while *off < *len {
                        let n = chunk.min(*len - *off);
                        let hdr = Hdr {
                            kind: DATA,
                            src: me,
                            ctx: 0,
                            tag: 0,
                            aux: *rreq,
                            len: *off as u64,
                        }
                        .encode();
                        // SAFETY: the send request keeps its buffer of `len` bytes alive
                        // until it completes, and off + n <= len.
                        let data = unsafe { std::slice::from_raw_parts(buf.add(*off), n) };
                        if !out.try_send(&hdr, data) {
                            break;
                        }
                        *off += n;
                    }
                    if *off >= *len {
                        *result = Some(Ok(Status {
                            source: dest,
                            tag: 0,
                            count: *len,
                        }));
                        *stream = None;
                        let _ = id;
                    } else {
                        more = true;
                    }
                }
            }
            if more {
                self.busy.push(dest);
            }
        }
    }
}

#[cfg(test)]
mod tests;
