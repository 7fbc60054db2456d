//! The endpoint: one per process; lazy RC connections, eager frames over a shared receive
//! queue with credit-based flow control, rendezvous RDMA through a registration cache.
//!
//! One [`Endpoint`] owns three parts, each in its own file with its own state:
//!
//! - [`conn`]: connection management. The per-peer [`Conn`] table ([`Links`]), the UD
//!   queue pair the connection handshake travels on, the connection state machine
//!   (request, reply, ready-to-use), handshake retries and timeouts, and the probes that
//!   notice a dead peer.
//! - [`eager`]: eager frames and credits. The shared receive queue and its buffers, the
//!   registered send buffers ([`Eager`]), `try_send` (inline or copied), delivery in
//!   `poll`, reposting and returning credits.
//! - [`rdma`]: rendezvous. The registration cache and exposures ([`Rdma`]), RDMA reads
//!   and writes and their completions, and [`RdmaBuf`], registered memory that RDMA
//!   needs no `unsafe` for.
//!
//! [`sendq`] is what all three post through: one RC send queue per connection whose work
//! requests are retired from one send completion queue.
//!
//! Drop order is the order of the fields: queue pairs first (in [`Links`]), then the
//! registrations and queues they use, memory last; each part orders its own fields so.

mod conn;
mod eager;
mod rdma;
mod sendq;

use std::alloc::{self, Layout};
use std::collections::{HashMap, VecDeque};
use std::hash::Hasher;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::card::{Card, CARD_LEN};
use crate::device::{discover, Config, DeviceInfo};
use crate::rcache::{RcacheStats, RegCache};
use crate::sys::{Context, Cq, Mr, Pd, Qp, QpCaps, QpType, Srq, Wc, POLL_BATCH};
use crate::Error;

use conn::{random_u32, Links, State, Ud, QKEY, UD_RECVS, UD_SENDS, UD_SLOT};
use eager::Eager;
use rdma::Rdma;
pub use rdma::{RdmaBuf, Refused};

/// Frame kinds, in the top 8 bits of the immediate data (the low 24 bits return credits).
const KIND_DATA: u32 = 1;
const KIND_CREDIT: u32 = 2;
/// "Ready to use": the requester's first message, which lets the responder send.
const KIND_RTU: u32 = 4;
const CREDIT_MASK: u32 = 0x00ff_ffff;
/// A reposted receive slot that returns no credit (a control message or a failed one).
const NO_CONN: u32 = u32::MAX;
/// Receive buffers reserved per connection for control messages (one RTU, at most two
/// credit messages unconsumed); control messages need no credits.
const CTRL_SLOTS: u32 = 4;

/// A connection to one peer (index into the endpoint's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId(u32);

/// An RDMA read or write started by [`Endpoint::rdma_read`] or [`Endpoint::rdma_write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdmaToken(u64);

/// The name the fabric engine uses for [`RdmaToken`] (reads were the first RDMA operation).
pub type ReadToken = RdmaToken;

/// A registered region as a peer needs it to RDMA-read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Address to read from (the buffer's own address).
    pub addr: u64,
    /// Length of the buffer.
    pub len: usize,
    /// Remote key.
    pub rkey: u32,
}

/// Counters of an endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Connections (any state).
    pub connections: usize,
    /// Connections made because a peer asked (accepted inside `poll`).
    pub accepted: u64,
    /// Frames sent inline.
    pub sends_inline: u64,
    /// Frames copied into a registered send buffer.
    pub sends_copied: u64,
    /// Frames received.
    pub frames_received: u64,
    /// Explicit credit messages sent.
    pub credit_messages: u64,
    /// Probes sent (liveness or retirement fences).
    pub probes: u64,
    /// `try_send` calls refused for lack of credits.
    pub no_credit: u64,
    /// Eager receive buffers posted to the shared receive queue.
    pub srq_buffers: u32,
    /// RDMA reads completed.
    pub reads: u64,
    /// RDMA writes completed.
    pub writes: u64,
    /// Registration cache counters.
    pub rcache: RcacheStats,
}

/// Page-aligned memory the NIC reads and writes; only accessed through raw pointers.
struct RawBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: plain memory owned by the endpoint; no thread affinity.
unsafe impl Send for RawBuf {}

impl RawBuf {
    pub(super) fn new(len: usize) -> RawBuf {
        let layout = Layout::from_size_align(len.max(1), 4096).expect("buffer size overflows");
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        RawBuf { ptr, layout }
    }

    pub(super) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub(super) fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the endpoint destroys the QPs and SRQ
        // that could still write into it before (field order).
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Where [`Endpoint::poll`] delivers received frames: any `FnMut(peer, frame)`, or a type
/// whose `frame` method is inlined into the poll (a closure's body may not be, and under
/// emulation every call on the path from a frame's arrival to the answer shows).
pub trait Deliver {
    /// Frame `frame` arrived from `peer` (valid for the call only).
    fn frame(&mut self, peer: u32, frame: &[u8]);
}

impl<F: FnMut(u32, &[u8]) + ?Sized> Deliver for F {
    #[inline(always)]
    fn frame(&mut self, peer: u32, frame: &[u8]) {
        self(peer, frame)
    }
}

/// One process's verbs endpoint (see the crate docs for the protocol).
pub struct Endpoint {
    // Field order is drop order: queue pairs first (`links`), then the registrations and
    // queues they use, the protection domain and the device last.
    links: Links,
    rdma: Rdma,
    eager: Eager,
    pd: Arc<Pd>,
    _ctx: Arc<Context>,

    cfg: Config,
    info: DeviceInfo,
    card: Card,
    errors: VecDeque<Error>,
    /// Work completions of one poll (kept to avoid initialising an array per poll).
    wc_buf: Box<[Wc]>,
    /// Signaled send-queue work requests not yet completed (the send CQ is polled on every
    /// `poll` while there are any, else every 32nd).
    signaled_out: usize,
    /// Calls of `poll`.
    polls: u32,
    stats: Stats,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.cfg.id)
            .field("device", &self.info.device)
            .field("connections", &self.links.conns.len())
            .finish_non_exhaustive()
    }
}

/// Hashes a `u32` key (QP number, peer id) with one multiplication: the maps on the
/// receive path need no DoS-resistant hashing.
#[derive(Default)]
struct U32Hasher(u64);

impl Hasher for U32Hasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type U32Map<V> = HashMap<u32, V, std::hash::BuildHasherDefault<U32Hasher>>;

impl Endpoint {
    /// Opens the device `cfg` names, creates the shared resources (PD, CQs, SRQ, the UD
    /// queue pair for handshakes, registered send buffers) and returns the endpoint.
    pub fn open(cfg: Config) -> Result<Endpoint, Error> {
        if cfg.eager_size < 64 {
            return Err(Error::Config {
                name: "WEFT_VERBS_EAGER_SIZE",
                value: cfg.eager_size.to_string(),
                reason: "must be at least 64".into(),
            });
        }
        let ctx = Context::open(cfg.device.as_deref())?;
        let pd = Pd::new(&ctx)?;
        let info = discover(&ctx, &pd, &cfg)?;
        let cqe = |want: u32| want.min(info.max_cqe.max(1));
        let srq_size = cfg.srq_size.min(info.max_srq_wr.max(1));
        let send_cq = Cq::new(&ctx, cqe(16384))?;
        let recv_cq = Cq::new(&ctx, cqe(srq_size + 64))?;
        let ud_cq = Cq::new(&ctx, cqe(2 * (UD_RECVS + UD_SENDS)))?;
        let srq = Srq::new(&pd, srq_size)?;
        let caps = QpCaps {
            max_send_wr: UD_SENDS,
            max_recv_wr: UD_RECVS,
            max_send_sge: 1,
            max_inline: 0,
        };
        let ud = Qp::create(&pd, QpType::Ud, &ud_cq, &ud_cq, None, caps)?
            .activate_ud(cfg.port, QKEY, 0)?;
        let ud_mem = RawBuf::new(UD_SLOT * (UD_RECVS + UD_SENDS) as usize);
        let ud_mr = Mr::register(&pd, ud_mem.ptr.as_ptr(), ud_mem.len())?;
        for i in 0..UD_RECVS {
            let addr = ud_mem.addr() + (i as usize * UD_SLOT) as u64;
            // SAFETY: the slot lies in `ud_mr`; the endpoint only reads it after its
            // completion and the buffer outlives the QP (field order).
            unsafe { ud.post_recv(u64::from(i), addr, UD_SLOT as u32, ud_mr.lkey()) }
                .map_err(|source| Error::PostRecv { source })?;
        }
        let send_mem = RawBuf::new(cfg.eager_size * cfg.send_bufs as usize);
        let send_mr = Mr::register(&pd, send_mem.ptr.as_ptr(), send_mem.len())?;
        let probe_mem = RawBuf::new(64);
        let probe_mr = Mr::register(&pd, probe_mem.ptr.as_ptr(), probe_mem.len())?;
        let card = Card {
            port: cfg.port,
            mtu: info.active_mtu_enum as u8,
            lid: info.lid,
            ud_qpn: ud.qpn(),
            nonce: random_u32(),
            gid: info.gid(),
        };
        tracing::debug!(id = cfg.id, device = %info.device, ud_qpn = ud.qpn(), "verbs endpoint open");
        Ok(Endpoint {
            links: Links {
                conns: Vec::new(),
                ud: Ud {
                    qp: ud,
                    cq: ud_cq,
                    mr: ud_mr,
                    mem: ud_mem,
                    next: 0,
                    outstanding: 0,
                },
                probe_mr,
                probe_mem,
                by_peer: U32Map::default(),
                by_qpn: U32Map::default(),
                timed: 0,
            },
            rdma: Rdma {
                rcache: RegCache::new(cfg.rcache_max),
                exposed: U32Map::default(),
                lent: HashMap::new(),
                done: VecDeque::new(),
                next_token: 1,
                pd: pd.clone(),
                max_mr_size: info.max_mr_size,
                keep: cfg.rcache,
            },
            eager: Eager {
                srq,
                send_cq,
                recv_cq,
                recv_mrs: Vec::new(),
                send_mr,
                recv_mem: Vec::new(),
                send_mem,
                recv_slots: Vec::new(),
                send_free: (0..cfg.send_bufs).rev().collect(),
                stash: vec![Wc::default(); POLL_BATCH].into_boxed_slice(),
                stashed: 0,
                credit_queue: Vec::new(),
                repost: Vec::with_capacity(POLL_BATCH),
            },
            pd,
            _ctx: ctx,
            card,
            errors: VecDeque::new(),
            wc_buf: vec![Wc::default(); POLL_BATCH].into_boxed_slice(),
            signaled_out: 0,
            polls: 0,
            stats: Stats::default(),
            cfg,
            info,
        })
    }

    /// This endpoint's card: what a peer passes to [`Endpoint::connect`] (32 bytes, see the
    /// crate docs for the layout).
    pub fn card(&self) -> Vec<u8> {
        self.card.encode().to_vec()
    }

    /// Largest frame sent inline (copied into the work request: no send buffer, no
    /// registration); larger eager frames are copied into a registered send buffer.
    #[inline]
    pub fn max_inline(&self) -> usize {
        self.info.max_inline as usize
    }

    /// The device and port in use.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// This endpoint's peer id.
    pub fn id(&self) -> u32 {
        self.cfg.id
    }

    /// Largest eager frame (header + payload) to `conn`.
    pub fn max_frame(&self, conn: ConnId) -> usize {
        self.links
            .conns
            .get(conn.0 as usize)
            .map_or(self.cfg.eager_size, |c| c.max_frame)
    }

    /// Largest RDMA read (the port's maximum message size).
    pub fn max_read(&self) -> u64 {
        self.info.max_msg_size
    }

    /// The connection to `peer`, if one exists (made by us or accepted).
    pub fn conn_of(&self, peer: u32) -> Option<ConnId> {
        self.links.by_peer.get(&peer).map(|&i| ConnId(i))
    }

    /// Whether `conn` is ready to send.
    pub fn is_ready(&self, conn: ConnId) -> bool {
        self.links
            .conns
            .get(conn.0 as usize)
            .is_some_and(|c| matches!(c.state, State::Ready))
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        Stats {
            connections: self.links.conns.len(),
            srq_buffers: self.eager.recv_slots.len() as u32,
            rcache: self.rdma.rcache.stats(),
            ..self.stats
        }
    }

    /// The peer of a connection.
    pub fn peer_of(&self, conn: ConnId) -> Option<u32> {
        self.links.conns.get(conn.0 as usize).map(|c| c.peer)
    }

    /// Bytes of a card (for wire-up size checks).
    pub const CARD_LEN: usize = CARD_LEN;

    /// Polls the completion queues: delivers received frames to `deliver(peer, frame)` in
    /// each peer's order, retires sends, answers handshakes (accepting connections from
    /// peers we have not connected to), returns credits, probes starved connections.
    /// Returns the number of frames delivered, or the first error of a peer (a failed
    /// connection: the error names the peer and the completion status).
    #[inline]
    pub fn poll<F: FnMut(u32, &[u8]) + ?Sized>(&mut self, deliver: &mut F) -> Result<usize, Error> {
        self.poll_with(deliver)
    }

    /// [`Endpoint::poll`] delivering to a [`Deliver`] (whose `frame` the poll inlines).
    #[inline]
    pub fn poll_with<D: Deliver + ?Sized>(&mut self, deliver: &mut D) -> Result<usize, Error> {
        if !self.eager.repost.is_empty() {
            self.repost_recvs();
        }
        let delivered = self.poll_recv(deliver);
        self.polls = self.polls.wrapping_add(1);
        // Unsignaled sends that fail still complete (with an error), so the send CQ is
        // drained now and then even with nothing signaled outstanding.
        if self.signaled_out > 0 || self.polls % 32 == 0 {
            self.poll_send();
        }
        // Handshakes: every poll while connecting, else often enough to accept quickly.
        if self.links.timed > 0 || self.polls % 32 == 0 {
            self.poll_ud();
        }
        if self.links.timed > 0 {
            self.check_timers();
        }
        match self.errors.pop_front() {
            Some(e) => Err(e),
            None => Ok(delivered),
        }
    }

    /// Whether a [`poll`](Self::poll) now would have nothing to do: no receive completion,
    /// no work pending (reposts, credit messages, timers, errors, signaled sends or RDMA
    /// operations outstanding). It polls the receive completion queue once and keeps what
    /// it finds for the next `poll`, which delivers it first: cheap to spin on while
    /// waiting for a message (one `ibv_poll_cq` and a few loads).
    #[inline(always)]
    pub fn idle(&mut self) -> bool {
        if self.eager.stashed > 0
            || self.signaled_out > 0
            || self.links.timed > 0
            || !self.eager.repost.is_empty()
            || !self.eager.credit_queue.is_empty()
            || !self.errors.is_empty()
            || !self.rdma.done.is_empty()
        {
            return false;
        }
        match self.eager.recv_cq.poll(&mut self.eager.stash) {
            Ok(0) => true,
            Ok(n) => {
                self.eager.stashed = n;
                false
            }
            Err(source) => {
                self.errors.push_back(Error::PollCq { source });
                false
            }
        }
    }

    pub(super) fn fail(&mut self, idx: u32, err: Error) {
        let c = &mut self.links.conns[idx as usize];
        if matches!(c.state, State::Failed(_)) {
            return;
        }
        if matches!(c.state, State::Connecting { .. }) || c.credits.starved_since.is_some() {
            self.links.timed = self.links.timed.saturating_sub(1);
        }
        c.credits.starved_since = None;
        tracing::warn!(peer = c.peer, "verbs: connection failed: {err}");
        if let Some(qp) = &c.qp {
            let _ = qp.set_error();
        }
        c.state = State::Failed(err.duplicate());
        self.errors.push_back(err);
    }
}
