//! The endpoint: one per process; lazy RC connections, eager frames over a shared receive
//! queue with credit-based flow control, rendezvous RDMA reads through a registration cache.

use std::alloc::{self, Layout};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::card::{Card, Handshake, HsKind, CARD_LEN, HS_LEN};
use crate::device::{discover, Config, DeviceInfo};
use crate::rcache::{page_range, Key, RcacheStats, RegCache};
use crate::sys::{
    self, AddrVec, Ah, Context, Cq, Init, Mr, Pd, Qp, QpCaps, QpType, RtrAttr, Rts, RtsAttr,
    SendOp, Srq, Wc, POLL_BATCH,
};
use crate::Error;

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
const QKEY: u32 = 0x5746_0001;
/// UD receives carry a 40-byte global route header before the payload.
const GRH: usize = 40;
const UD_SLOT: usize = 128;
const UD_RECVS: u32 = 64;
const UD_SENDS: u32 = 64;
/// A peer that leaves us without credits this long gets a probe: an 8-byte RDMA read of its
/// probe word, answered by its NIC without consuming a receive, so a dead peer is noticed.
const STARVED_PROBE_AFTER: Duration = Duration::from_millis(100);

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
    fn new(len: usize) -> RawBuf {
        let layout = Layout::from_size_align(len.max(1), 4096).expect("buffer size overflows");
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        RawBuf { ptr, layout }
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn len(&self) -> usize {
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

#[derive(Debug)]
enum State {
    /// Request sent, waiting for the reply.
    Connecting {
        since: Instant,
        last_req: Instant,
        tries: u32,
    },
    /// We answered a request: our QP is ready, but we send only once the requester's first
    /// message shows its QP is ready too.
    Accepted,
    Ready,
    Failed(Error),
}

/// An RDMA read or write to post.
struct RdmaOp {
    token: u64,
    mr: Arc<Mr>,
    local: u64,
    len: u32,
    remote_addr: u64,
    rkey: u32,
    write: bool,
}

/// Exposures of one registration (one rkey): its cache entry and the `(addr, len)` of each
/// `register` not yet released (one pin each).
struct Exposure {
    key: Key,
    spans: Vec<(u64, usize)>,
}

/// One outstanding send-queue work request.
struct Wr {
    seq: u32,
    /// Send buffer it uses.
    buf: Option<u32>,
    /// A probe (clears `probe_out` when retired).
    probe: bool,
    /// Asked for a completion.
    signaled: bool,
    /// RDMA read or write: its token, the local registration it uses, whether a write.
    read: Option<(u64, Arc<Mr>, bool)>,
}

struct Conn {
    peer: u32,
    card: Card,
    state: State,
    init_qp: Option<Qp<Init>>,
    qp: Option<Qp<Rts>>,
    ah: Ah,
    qpn: u32,
    psn: u32,
    remote_qpn: u32,
    depth: usize,
    /// Eager frames we may still send.
    send_credits: u32,
    /// Eager receives of the peer's we consumed and have not yet reported.
    to_return: u32,
    /// Largest frame the peer can receive.
    max_frame: usize,
    inflight: VecDeque<Wr>,
    seq: u32,
    unsignaled: u32,
    starved_since: Option<Instant>,
    /// A probe (RDMA read of the peer's probe word) is outstanding.
    probe_out: bool,
    /// The peer's probe word: (address, rkey).
    remote_probe: (u64, u32),
    credit_due: bool,
}

impl Conn {
    /// Whether the next send on this connection asks for a completion (selective
    /// signaling): every `signal_every`-th one, and whenever the send queue is half full.
    #[inline]
    fn wants_signal(&self, signal_every: u32) -> bool {
        self.unsignaled + 1 >= signal_every || self.inflight.len() + 1 >= self.depth / 2
    }

    /// Accounts for a data frame just posted: it used one of our credits, and the
    /// credits it carried back leave no explicit credit message due.
    #[inline]
    fn spent_credit(&mut self) {
        self.send_credits -= 1;
        if self.to_return == 0 {
            self.credit_due = false;
        }
    }

    /// Books a work request just posted: the sequence number it used, the count of
    /// unsignaled sends, and the in-flight entry that retires it.
    #[inline]
    fn book(&mut self, wr: Wr) {
        self.seq = self.seq.wrapping_add(1);
        self.unsignaled = if wr.signaled { 0 } else { self.unsignaled + 1 };
        self.inflight.push_back(wr);
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
    // Field order is drop order: queue pairs first, then what they use, memory last.
    conns: Vec<Conn>,
    ud: Qp<Rts>,
    rcache: RegCache<Mr>,
    srq: Arc<Srq>,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    ud_cq: Arc<Cq>,
    recv_mrs: Vec<Mr>,
    send_mr: Mr,
    ud_mr: Mr,
    probe_mr: Mr,
    pd: Arc<Pd>,
    _ctx: Arc<Context>,
    recv_mem: Vec<RawBuf>,
    send_mem: RawBuf,
    ud_mem: RawBuf,
    probe_mem: RawBuf,

    cfg: Config,
    info: DeviceInfo,
    card: Card,
    /// (address, lkey) of each eager receive buffer; the SRQ work-request id is the index.
    recv_slots: Vec<(u64, u32)>,
    send_free: Vec<u32>,
    ud_next: u32,
    ud_outstanding: u32,
    by_peer: U32Map<u32>,
    by_qpn: U32Map<u32>,
    rdma_done: VecDeque<(RdmaToken, Result<(), Error>)>,
    errors: VecDeque<Error>,
    next_token: u64,
    /// Work completions of one poll (kept to avoid initialising an array per poll).
    wc_buf: Box<[Wc]>,
    /// Receive completions [`Endpoint::idle`] polled, not yet delivered: the first
    /// `stashed` entries of `stash`.
    stash: Box<[Wc]>,
    stashed: usize,
    /// Signaled send-queue work requests not yet completed (the send CQ is polled on every
    /// `poll` while there are any, else every 32nd).
    signaled_out: usize,
    /// Calls of `poll`.
    polls: u32,
    /// Exposed registrations not yet released, by rkey.
    exposed: U32Map<Exposure>,
    /// Connections that owe the peer an explicit credit message.
    credit_queue: Vec<u32>,
    /// Receive slots delivered and not yet posted again, with the connection whose
    /// credit each returns ([`NO_CONN`]: none); see [`Endpoint::repost_recvs`].
    repost: Vec<(u32, u32)>,
    /// Connections connecting or starved of credits (timers to check in `poll`).
    timed: usize,
    stats: Stats,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.cfg.id)
            .field("device", &self.info.device)
            .field("connections", &self.conns.len())
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

fn random_u32() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish() as u32
}

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
            conns: Vec::new(),
            ud,
            rcache: RegCache::new(cfg.rcache_max),
            srq,
            send_cq,
            recv_cq,
            ud_cq,
            recv_mrs: Vec::new(),
            send_mr,
            ud_mr,
            probe_mr,
            probe_mem,
            pd,
            _ctx: ctx,
            recv_mem: Vec::new(),
            send_free: (0..cfg.send_bufs).rev().collect(),
            send_mem,
            ud_mem,
            card,
            recv_slots: Vec::new(),
            ud_next: 0,
            ud_outstanding: 0,
            by_peer: U32Map::default(),
            by_qpn: U32Map::default(),
            rdma_done: VecDeque::new(),
            errors: VecDeque::new(),
            next_token: 1,
            credit_queue: Vec::new(),
            repost: Vec::with_capacity(POLL_BATCH),
            exposed: U32Map::default(),
            wc_buf: vec![Wc::default(); POLL_BATCH].into_boxed_slice(),
            stash: vec![Wc::default(); POLL_BATCH].into_boxed_slice(),
            stashed: 0,
            signaled_out: 0,
            polls: 0,
            timed: 0,
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
        self.conns
            .get(conn.0 as usize)
            .map_or(self.cfg.eager_size, |c| c.max_frame)
    }

    /// Largest RDMA read (the port's maximum message size).
    pub fn max_read(&self) -> u64 {
        self.info.max_msg_size
    }

    /// The connection to `peer`, if one exists (made by us or accepted).
    pub fn conn_of(&self, peer: u32) -> Option<ConnId> {
        self.by_peer.get(&peer).map(|&i| ConnId(i))
    }

    /// Whether `conn` is ready to send.
    pub fn is_ready(&self, conn: ConnId) -> bool {
        self.conns
            .get(conn.0 as usize)
            .is_some_and(|c| matches!(c.state, State::Ready))
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        Stats {
            connections: self.conns.len(),
            srq_buffers: self.recv_slots.len() as u32,
            rcache: self.rcache.stats(),
            ..self.stats
        }
    }

    /// Starts (or returns) the connection to `peer`, whose card is `card`. The RC queue pair
    /// is connected by a handshake over the UD queue pairs that `poll` drives; `try_send`
    /// returns `Ok(false)` until it is ready.
    pub fn connect(&mut self, peer: u32, card: &[u8]) -> Result<ConnId, Error> {
        if let Some(&i) = self.by_peer.get(&peer) {
            return Ok(ConnId(i));
        }
        let card = Card::decode(card)?;
        if card == self.card {
            return Err(Error::BadCard {
                reason: format!("peer {peer}'s card is this endpoint's own"),
            });
        }
        let idx = self.new_conn(peer, card)?;
        let now = Instant::now();
        self.conns[idx as usize].state = State::Connecting {
            since: now,
            last_req: now,
            tries: 0,
        };
        self.timed += 1;
        self.send_hs(idx, HsKind::Req, 0);
        Ok(ConnId(idx))
    }

    fn new_conn(&mut self, peer: u32, card: Card) -> Result<u32, Error> {
        let av = AddrVec {
            port: self.cfg.port,
            dlid: card.lid,
            dgid: card.gid,
            sgid_index: self.info.gid_index as u8,
            global: self.info.is_roce(),
        };
        let ah = Ah::new(&self.pd, av)?;
        let caps = QpCaps {
            max_send_wr: self.cfg.sq_depth.min(self.info.max_qp_wr),
            max_recv_wr: 0,
            max_send_sge: 2,
            max_inline: self.info.max_inline,
        };
        let qp = Qp::create(
            &self.pd,
            QpType::Rc,
            &self.send_cq,
            &self.recv_cq,
            Some(&self.srq),
            caps,
        )?
        .init_rc(self.cfg.port)?;
        self.grow_recvs(self.cfg.credits + CTRL_SLOTS)?;
        let idx = self.conns.len() as u32;
        self.by_peer.insert(peer, idx);
        self.by_qpn.insert(qp.qpn(), idx);
        self.conns.push(Conn {
            peer,
            card,
            state: State::Accepted,
            qpn: qp.qpn(),
            depth: qp.max_send_wr().max(8) as usize,
            init_qp: Some(qp),
            qp: None,
            ah,
            psn: random_u32() & 0x00ff_ffff,
            remote_qpn: 0,
            send_credits: 0,
            to_return: 0,
            max_frame: self.cfg.eager_size,
            inflight: VecDeque::new(),
            seq: 0,
            unsignaled: 0,
            starved_since: None,
            probe_out: false,
            remote_probe: (0, 0),
            credit_due: false,
        });
        Ok(idx)
    }

    /// Posts `n` more eager receive buffers to the SRQ (as far as it has room).
    fn grow_recvs(&mut self, n: u32) -> Result<(), Error> {
        let room = self
            .srq
            .max_wr()
            .saturating_sub(self.recv_slots.len() as u32);
        if room < n {
            tracing::warn!(
                "verbs: shared receive queue full ({} buffers): new connections are not fully \
                 backed by receives (raise WEFT_VERBS_SRQ_SIZE); RNR retries cover the gap",
                self.recv_slots.len()
            );
        }
        let n = n.min(room);
        if n == 0 {
            return Ok(());
        }
        let size = self.cfg.eager_size;
        let mem = RawBuf::new(size * n as usize);
        let mr = Mr::register(&self.pd, mem.ptr.as_ptr(), mem.len())?;
        let (base, lkey) = (mem.addr(), mr.lkey());
        // Kept before anything is posted: a failed post below must not free posted memory.
        self.recv_mrs.push(mr);
        self.recv_mem.push(mem);
        for i in 0..n as usize {
            let slot = self.recv_slots.len() as u64;
            let addr = base + (i * size) as u64;
            self.recv_slots.push((addr, lkey));
            // SAFETY: the slot lies in the registration just kept; it is read only after
            // its completion; the memory outlives the SRQ (field order).
            unsafe { self.srq.post_recv(slot, addr, size as u32, lkey) }
                .map_err(|source| Error::PostRecv { source })?;
        }
        Ok(())
    }

    fn send_hs(&mut self, idx: u32, kind: HsKind, echo_qpn: u32) {
        if self.ud_outstanding >= UD_SENDS {
            self.poll_ud();
            if self.ud_outstanding >= UD_SENDS {
                return; // retransmitted later (requests) or on the duplicate request (replies)
            }
        }
        let c = &self.conns[idx as usize];
        let msg = Handshake {
            kind,
            from: self.cfg.id,
            qpn: c.qpn,
            psn: c.psn,
            credits: self.cfg.credits,
            echo_qpn,
            eager_size: self.cfg.eager_size as u32,
            mtu: self.info.active_mtu_enum as u8,
            card: self.card,
            probe_addr: self.probe_mem.addr(),
            probe_rkey: self.probe_mr.rkey(),
        }
        .encode();
        let slot = UD_RECVS + self.ud_next % UD_SENDS;
        self.ud_next = self.ud_next.wrapping_add(1);
        let addr = self.ud_mem.addr() + (slot as usize * UD_SLOT) as u64;
        // SAFETY: the slot lies in `ud_mem`, which no work request uses now (at most
        // UD_SENDS sends are outstanding and slots are used round robin).
        unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), addr as *mut u8, HS_LEN) };
        let op = SendOp::UdSend {
            ah: &c.ah,
            remote_qpn: c.card.ud_qpn,
            qkey: QKEY,
        };
        // SAFETY: the SGE lies in `ud_mr`; the slot is not rewritten before this send
        // completes (see above); the AH lives as long as the connection (the endpoint).
        let r = unsafe {
            self.ud.post_send(
                u64::from(slot),
                &[(addr, HS_LEN as u32, self.ud_mr.lkey())],
                op,
                true,
                false,
            )
        };
        match r {
            Ok(()) => self.ud_outstanding += 1,
            Err(e) => tracing::warn!(peer = c.peer, "verbs: handshake send failed: {e}"),
        }
    }

    /// Moves the connection's QP to RTR and RTS towards the peer's QP.
    fn connect_qp(&mut self, idx: u32, hs: &Handshake) -> Result<(), Error> {
        let av = AddrVec {
            port: self.cfg.port,
            dlid: hs.card.lid,
            dgid: hs.card.gid,
            sgid_index: self.info.gid_index as u8,
            global: self.info.is_roce(),
        };
        let c = &mut self.conns[idx as usize];
        let Some(qp) = c.init_qp.take() else {
            return Ok(());
        };
        let rtr = RtrAttr {
            dest_qpn: hs.qpn,
            rq_psn: hs.psn,
            mtu: self.info.active_mtu_enum.min(u32::from(hs.mtu)),
            av,
            max_dest_rd_atomic: self.info.max_dest_rd_atomic.clamp(1, 16) as u8,
        };
        let rts = RtsAttr {
            sq_psn: c.psn,
            timeout: self.cfg.ack_timeout,
            retry_cnt: self.cfg.retry_cnt,
            rnr_retry: 7,
            max_rd_atomic: self.info.max_rd_atomic.clamp(1, 16) as u8,
        };
        c.qp = Some(qp.rtr(rtr)?.rts(rts)?);
        c.remote_qpn = hs.qpn;
        c.remote_probe = (hs.probe_addr, hs.probe_rkey);
        c.send_credits = hs.credits;
        c.max_frame = self.cfg.eager_size.min(hs.eager_size as usize);
        Ok(())
    }

    fn fail(&mut self, idx: u32, err: Error) {
        let c = &mut self.conns[idx as usize];
        if matches!(c.state, State::Failed(_)) {
            return;
        }
        if matches!(c.state, State::Connecting { .. }) || c.starved_since.is_some() {
            self.timed = self.timed.saturating_sub(1);
        }
        c.starved_since = None;
        tracing::warn!(peer = c.peer, "verbs: connection failed: {err}");
        if let Some(qp) = &c.qp {
            let _ = qp.set_error();
        }
        c.state = State::Failed(err.duplicate());
        self.errors.push_back(err);
    }

    fn handle_hs(&mut self, hs: Handshake) {
        let known = self.by_peer.get(&hs.from).copied();
        match hs.kind {
            HsKind::Req => {
                let idx = match known {
                    Some(idx) => {
                        let c = &self.conns[idx as usize];
                        match c.state {
                            // Both sides connect at once: the request of the lower id wins.
                            State::Connecting { .. } if self.cfg.id < hs.from => return,
                            State::Connecting { .. } => {
                                self.timed = self.timed.saturating_sub(1);
                                idx
                            }
                            State::Accepted | State::Ready if c.remote_qpn == hs.qpn => {
                                self.send_hs(idx, HsKind::Rep, hs.qpn); // our reply was lost
                                return;
                            }
                            _ => {
                                tracing::warn!(
                                    peer = hs.from,
                                    "verbs: ignoring a second connection request"
                                );
                                return;
                            }
                        }
                    }
                    None => match self.new_conn(hs.from, hs.card) {
                        Ok(idx) => {
                            self.stats.accepted += 1;
                            idx
                        }
                        Err(e) => {
                            tracing::warn!(
                                peer = hs.from,
                                "verbs: cannot accept a connection: {e}"
                            );
                            self.errors.push_back(e);
                            return;
                        }
                    },
                };
                match self.connect_qp(idx, &hs) {
                    Ok(()) => {
                        self.conns[idx as usize].state = State::Accepted;
                        self.send_hs(idx, HsKind::Rep, hs.qpn);
                    }
                    Err(e) => self.fail(idx, e),
                }
            }
            HsKind::Rep => {
                let Some(idx) = known else { return };
                let c = &self.conns[idx as usize];
                if !matches!(c.state, State::Connecting { .. }) || hs.echo_qpn != c.qpn {
                    return;
                }
                self.timed = self.timed.saturating_sub(1);
                match self.connect_qp(idx, &hs) {
                    Ok(()) => {
                        self.conns[idx as usize].state = State::Ready;
                        // Tell the responder our QP is ready (it sends only after this).
                        if let Err(e) = self.post(idx, &[], KIND_RTU, None, None, false) {
                            self.fail(idx, e);
                        }
                    }
                    Err(e) => self.fail(idx, e),
                }
            }
        }
    }

    fn poll_ud(&mut self) {
        let mut wcs = std::mem::take(&mut self.wc_buf);
        self.poll_ud_into(&mut wcs);
        self.wc_buf = wcs;
    }

    fn poll_ud_into(&mut self, wcs: &mut [Wc]) {
        loop {
            let n = match self.ud_cq.poll(wcs) {
                Ok(n) => n,
                Err(source) => {
                    self.errors.push_back(Error::PollCq { source });
                    return;
                }
            };
            for wc in &wcs[..n] {
                let slot = wc.wr_id as u32;
                if slot >= UD_RECVS {
                    self.ud_outstanding = self.ud_outstanding.saturating_sub(1);
                    if wc.status != sys::WC_SUCCESS {
                        tracing::warn!("verbs: handshake send: {}", sys::wc_status_str(wc.status));
                    }
                    continue;
                }
                let addr = self.ud_mem.addr() + (slot as usize * UD_SLOT) as u64;
                if wc.status == sys::WC_SUCCESS && wc.byte_len as usize >= GRH + HS_LEN {
                    // SAFETY: the receive completed, so the NIC is done with the slot; it
                    // is reposted only below.
                    let bytes = unsafe {
                        std::slice::from_raw_parts((addr as usize + GRH) as *const u8, HS_LEN)
                    };
                    if let Some(hs) = Handshake::decode(bytes) {
                        self.handle_hs(hs);
                    }
                }
                // SAFETY: as in `open`.
                if let Err(source) = unsafe {
                    self.ud
                        .post_recv(u64::from(slot), addr, UD_SLOT as u32, self.ud_mr.lkey())
                } {
                    self.errors.push_back(Error::PostRecv { source });
                }
            }
            if n < POLL_BATCH {
                return;
            }
        }
    }

    /// Posts a frame (or control message) of `kind` on connection `idx`.
    fn post(
        &mut self,
        idx: u32,
        parts: &[&[u8]],
        kind: u32,
        buf: Option<u32>,
        read: Option<RdmaOp>,
        force_signal: bool,
    ) -> Result<(), Error> {
        let low_bufs = self.send_free.len() < self.cfg.signal_every as usize;
        let c = &mut self.conns[idx as usize];
        let Some(qp) = &c.qp else { return Ok(()) };
        let seq = c.seq;
        let signaled = force_signal
            || read.is_some()
            || c.wants_signal(self.cfg.signal_every)
            || (buf.is_some() && low_bufs);
        let wr_id = (u64::from(idx) << 32) | u64::from(seq);
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let r = if let Some(o) = &read {
            let (remote_addr, rkey) = (o.remote_addr, o.rkey);
            let op = if o.write {
                SendOp::Write { remote_addr, rkey }
            } else {
                SendOp::Read { remote_addr, rkey }
            };
            // SAFETY: the local range lies in `mr` (registered by the cache), which the
            // work-request entry keeps alive until completion; the caller of `rdma_read`
            // (`rdma_write`) guarantees nobody accesses (modifies) it meanwhile.
            unsafe { qp.post_send(wr_id, &[(o.local, o.len, o.mr.lkey())], op, true, false) }
        } else {
            let imm = (kind << 24) | c.to_return.min(CREDIT_MASK);
            let op = SendOp::SendImm { imm };
            if let Some(b) = buf {
                let addr = self.send_mem.addr() + b as u64 * self.cfg.eager_size as u64;
                let mut off = 0;
                for p in parts {
                    // SAFETY: the send buffer `b` is ours (taken from the free list) and
                    // `len` <= eager_size was checked by the caller.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            p.as_ptr(),
                            (addr as usize + off) as *mut u8,
                            p.len(),
                        )
                    };
                    off += p.len();
                }
                // SAFETY: the SGE lies in `send_mr`; buffer `b` returns to the free list
                // only when this request is retired.
                unsafe {
                    qp.post_send(
                        wr_id,
                        &[(addr, len as u32, self.send_mr.lkey())],
                        op,
                        signaled,
                        false,
                    )
                }
            } else {
                let mut sges: [sys::Sge; 2] = [(0, 0, 0); 2];
                for (s, p) in sges.iter_mut().zip(parts) {
                    *s = (p.as_ptr() as u64, p.len() as u32, 0);
                }
                let n = parts.len().min(2);
                // SAFETY: inline: the bytes are copied during the call (total length <=
                // max inline, checked by the caller); no memory is referenced after it.
                unsafe { qp.post_send(wr_id, &sges[..n], op, signaled, true) }
            }
        };
        match r {
            Ok(()) => {
                if read.is_none() {
                    c.to_return = c.to_return.saturating_sub(CREDIT_MASK);
                }
                self.signaled_out += usize::from(signaled);
                c.book(Wr {
                    seq,
                    buf,
                    probe: false,
                    signaled,
                    read: read.map(|o| (o.token, o.mr, o.write)),
                });
                Ok(())
            }
            Err(source) => {
                if let Some(b) = buf {
                    self.send_free.push(b);
                }
                Err(Error::PostSend {
                    peer: c.peer,
                    source,
                })
            }
        }
    }

    /// Sends the frame `header ++ payload` to `conn`. `Ok(false)`: no room now (connection
    /// not ready yet, no credits, send queue or buffers full): call `poll` and retry.
    /// Errors: the frame exceeds [`Endpoint::max_frame`], or the connection failed (an
    /// error naming the peer).
    #[inline(always)]
    pub fn try_send(&mut self, conn: ConnId, header: &[u8], payload: &[u8]) -> Result<bool, Error> {
        match self.try_send_inline(conn.0, header, payload) {
            Some(r) => r,
            None => self.try_send_general(conn.0, header, payload),
        }
    }

    /// [`Endpoint::try_send`] beyond the common case: a frame sent from a registered
    /// buffer, or no credit, no room, no ready connection, a frame too large.
    #[inline(never)]
    fn try_send_general(&mut self, idx: u32, header: &[u8], payload: &[u8]) -> Result<bool, Error> {
        let eager_limit_low = self.send_free.is_empty();
        let max_inline = self.info.max_inline as usize;
        let c = self
            .conns
            .get_mut(idx as usize)
            .ok_or(Error::UnknownConn(idx))?;
        match &c.state {
            State::Ready => {}
            State::Failed(e) => return Err(e.duplicate()),
            _ => return Ok(false),
        }
        let len = header.len() + payload.len();
        if len > c.max_frame {
            return Err(Error::MessageTooLarge {
                what: "eager frame",
                len,
                max: c.max_frame,
            });
        }
        if c.send_credits == 0 {
            self.stats.no_credit += 1;
            if c.starved_since.is_none() {
                c.starved_since = Some(Instant::now());
                self.timed += 1;
            }
            return Ok(false);
        }
        if c.inflight.len() + 2 >= c.depth {
            self.poll_send();
            let c = &self.conns[idx as usize];
            if c.inflight.len() + 2 >= c.depth {
                return Ok(false);
            }
        }
        let buf = if len <= max_inline {
            None
        } else {
            if eager_limit_low {
                self.poll_send();
            }
            match self.send_free.pop() {
                Some(b) => Some(b),
                None => {
                    self.fence_all();
                    return Ok(false);
                }
            }
        };
        self.post(idx, &[header, payload], KIND_DATA, buf, None, false)
            .inspect_err(|e| self.fail(idx, e.duplicate()))?;
        self.conns[idx as usize].spent_credit();
        if buf.is_some() {
            self.stats.sends_copied += 1;
        } else {
            self.stats.sends_inline += 1;
        }
        Ok(true)
    }

    /// The common case of [`Endpoint::try_send`], on the path of every small message: an
    /// inline frame on a ready connection with a credit and room in its send queue. `None`:
    /// not that case, take the general path.
    #[inline(always)]
    fn try_send_inline(
        &mut self,
        idx: u32,
        header: &[u8],
        payload: &[u8],
    ) -> Option<Result<bool, Error>> {
        let len = header.len() + payload.len();
        if len > self.info.max_inline as usize {
            return None;
        }
        let c = self.conns.get_mut(idx as usize)?;
        let (State::Ready, Some(qp)) = (&c.state, &c.qp) else {
            return None;
        };
        if c.send_credits == 0 || len > c.max_frame || c.inflight.len() + 2 >= c.depth {
            return None;
        }
        let signaled = c.wants_signal(self.cfg.signal_every);
        let seq = c.seq;
        let returned = c.to_return.min(CREDIT_MASK);
        let wr_id = (u64::from(idx) << 32) | u64::from(seq);
        if let Err(source) = qp.post_send_inline_imm(
            wr_id,
            header,
            payload,
            (KIND_DATA << 24) | returned,
            signaled,
        ) {
            let err = Error::PostSend {
                peer: c.peer,
                source,
            };
            self.fail(idx, err.duplicate());
            return Some(Err(err));
        }
        c.to_return -= returned;
        c.spent_credit();
        c.book(Wr {
            seq,
            buf: None,
            probe: false,
            signaled,
            read: None,
        });
        self.signaled_out += usize::from(signaled);
        self.stats.sends_inline += 1;
        Some(Ok(true))
    }

    /// Sends a signaled probe on every connection holding unsignaled sends, so their send
    /// buffers are retired (all send buffers are taken).
    fn fence_all(&mut self) {
        for idx in 0..self.conns.len() as u32 {
            let c = &self.conns[idx as usize];
            if matches!(c.state, State::Ready)
                && c.unsignaled > 0
                && !c.probe_out
                && c.inflight.len() < c.depth
            {
                self.probe(idx);
            }
        }
    }

    /// Posts a signaled 8-byte RDMA read of the peer's probe word: it needs no receive
    /// buffer and no attention from the peer process, completes when the peer's queue pair
    /// answers, and fails (transport retries exhausted) when the peer is gone. It also
    /// retires the unsignaled sends before it.
    fn probe(&mut self, idx: u32) {
        let local = self.probe_mem.addr() + 8;
        let lkey = self.probe_mr.lkey();
        let c = &mut self.conns[idx as usize];
        let Some(qp) = &c.qp else { return };
        let seq = c.seq;
        let wr_id = (u64::from(idx) << 32) | u64::from(seq);
        let (remote_addr, rkey) = c.remote_probe;
        // SAFETY: the destination lies in `probe_mr` (its bytes 8..16 are only ever written
        // by probes and never read); the registration lives as long as the endpoint.
        let r = unsafe {
            qp.post_send(
                wr_id,
                &[(local, 8, lkey)],
                SendOp::Read { remote_addr, rkey },
                true,
                false,
            )
        };
        match r {
            Ok(()) => {
                c.probe_out = true;
                self.signaled_out += 1;
                c.book(Wr {
                    seq,
                    buf: None,
                    probe: true,
                    signaled: true,
                    read: None,
                });
                self.stats.probes += 1;
            }
            Err(source) => {
                let peer = c.peer;
                self.fail(idx, Error::PostSend { peer, source });
            }
        }
    }

    /// Retires completed send-queue work requests; reports failures.
    fn poll_send(&mut self) {
        let mut wcs = std::mem::take(&mut self.wc_buf);
        self.poll_send_into(&mut wcs);
        self.wc_buf = wcs;
    }

    fn poll_send_into(&mut self, wcs: &mut [Wc]) {
        loop {
            let n = match self.send_cq.poll(wcs) {
                Ok(n) => n,
                Err(source) => {
                    self.errors.push_back(Error::PollCq { source });
                    return;
                }
            };
            for wc in &wcs[..n] {
                let idx = (wc.wr_id >> 32) as u32;
                let seq = wc.wr_id as u32;
                let Some(c) = self.conns.get_mut(idx as usize) else {
                    continue;
                };
                let mut what = "send";
                while let Some(wr) = c.inflight.pop_front() {
                    if let Some(b) = wr.buf {
                        self.send_free.push(b);
                    }
                    if wr.probe {
                        c.probe_out = false;
                    }
                    let done = wr.seq == seq;
                    if done && wr.signaled {
                        self.signaled_out = self.signaled_out.saturating_sub(1);
                    }
                    if let Some((token, _mr, write)) = wr.read {
                        what = if write { "rdma-write" } else { "rdma-read" };
                        let result = if done && wc.status == sys::WC_SUCCESS {
                            if write {
                                self.stats.writes += 1;
                            } else {
                                self.stats.reads += 1;
                            }
                            Ok(())
                        } else if let State::Failed(e) = &c.state {
                            Err(e.duplicate())
                        } else {
                            Err(Error::WorkCompletion {
                                peer: c.peer,
                                opcode: what,
                                status: sys::wc_status_str(wc.status),
                            })
                        };
                        self.rdma_done.push_back((RdmaToken(token), result));
                    }
                    if done {
                        break;
                    }
                }
                if wc.status != sys::WC_SUCCESS && !matches!(c.state, State::Failed(_)) {
                    let err = Error::WorkCompletion {
                        peer: c.peer,
                        opcode: what,
                        status: sys::wc_status_str(wc.status),
                    };
                    self.fail(idx, err);
                }
            }
            if n < POLL_BATCH {
                return;
            }
        }
    }

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
        if !self.repost.is_empty() {
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
        if self.timed > 0 || self.polls % 32 == 0 {
            self.poll_ud();
        }
        if self.timed > 0 {
            self.check_timers();
        }
        match self.errors.pop_front() {
            Some(e) => Err(e),
            None => Ok(delivered),
        }
    }

    /// Posts again the receive buffers delivered since the last call and grants their
    /// credits to the peers that used them. Done at the start of the next poll rather
    /// than right after delivery, so that it is off the path from a frame's arrival to the
    /// answer the application sends; a credit is returned only for a reposted buffer, so
    /// a peer never holds a credit without a posted buffer behind it.
    fn repost_recvs(&mut self) {
        let half = (self.cfg.credits / 2).max(1);
        // Taken and put back (cleared) to keep its allocation.
        let mut list = std::mem::take(&mut self.repost);
        for &(slot, idx) in &list {
            let (addr, lkey) = self.recv_slots[slot as usize];
            // SAFETY: the slot lies in its registration (see `grow_recvs`), and its frame
            // was delivered: nothing reads it any more.
            if let Err(source) = unsafe {
                self.srq
                    .post_recv(u64::from(slot), addr, self.cfg.eager_size as u32, lkey)
            } {
                self.errors.push_back(Error::PostRecv { source });
                continue;
            }
            if let Some(c) = self.conns.get_mut(idx as usize) {
                c.to_return += 1;
                if c.to_return >= half && !c.credit_due {
                    c.credit_due = true;
                    self.credit_queue.push(idx);
                }
            }
        }
        list.clear();
        self.repost = list;
    }

    #[inline(always)]
    fn poll_recv<D: Deliver + ?Sized>(&mut self, deliver: &mut D) -> usize {
        if self.stashed > 0 {
            // `poll_recv_into` starts with the completions `idle` left in `stash`.
            let mut wcs = std::mem::take(&mut self.stash);
            let n = self.poll_recv_into(&mut wcs, deliver);
            self.stash = wcs;
            return n;
        }
        let mut wcs = std::mem::take(&mut self.wc_buf);
        let n = self.poll_recv_into(&mut wcs, deliver);
        self.wc_buf = wcs;
        n
    }

    /// Whether a [`poll`](Self::poll) now would have nothing to do: no receive completion,
    /// no work pending (reposts, credit messages, timers, errors, signaled sends or RDMA
    /// operations outstanding). It polls the receive completion queue once and keeps what
    /// it finds for the next `poll`, which delivers it first: cheap to spin on while
    /// waiting for a message (one `ibv_poll_cq` and a few loads).
    #[inline(always)]
    pub fn idle(&mut self) -> bool {
        if self.stashed > 0
            || self.signaled_out > 0
            || self.timed > 0
            || !self.repost.is_empty()
            || !self.credit_queue.is_empty()
            || !self.errors.is_empty()
            || !self.rdma_done.is_empty()
        {
            return false;
        }
        match self.recv_cq.poll(&mut self.stash) {
            Ok(0) => true,
            Ok(n) => {
                self.stashed = n;
                false
            }
            Err(source) => {
                self.errors.push_back(Error::PollCq { source });
                false
            }
        }
    }

    #[inline(always)]
    fn poll_recv_into<D: Deliver + ?Sized>(&mut self, wcs: &mut [Wc], deliver: &mut D) -> usize {
        let mut delivered = 0;
        loop {
            // Completions `idle` took from the queue (into `wcs`, see `poll_recv`) go
            // first.
            let stashed = std::mem::take(&mut self.stashed);
            let n = if stashed > 0 {
                Ok(stashed)
            } else {
                self.recv_cq.poll(wcs)
            };
            let n = match n {
                Ok(n) => n,
                Err(source) => {
                    self.errors.push_back(Error::PollCq { source });
                    break;
                }
            };
            for wc in &wcs[..n] {
                let slot = wc.wr_id as usize;
                let addr = self.recv_slots[slot].0;
                let idx = self.by_qpn.get(&wc.qp_num).copied();
                if let Some(idx) = idx {
                    if wc.status != sys::WC_SUCCESS {
                        let c = &self.conns[idx as usize];
                        let err = Error::WorkCompletion {
                            peer: c.peer,
                            opcode: "recv",
                            status: sys::wc_status_str(wc.status),
                        };
                        self.fail(idx, err);
                    } else {
                        let imm = wc.imm.unwrap_or(0);
                        let c = &mut self.conns[idx as usize];
                        let credits = imm & CREDIT_MASK;
                        if credits > 0 {
                            c.send_credits += credits;
                            if c.starved_since.take().is_some() {
                                self.timed = self.timed.saturating_sub(1);
                            }
                        }
                        if matches!(c.state, State::Accepted) {
                            c.state = State::Ready;
                        }
                        if imm >> 24 == KIND_DATA {
                            // SAFETY: the receive completed, so the NIC is done with the
                            // slot; `byte_len` <= eager_size; it is reposted only by the
                            // next `repost_recvs`, after `deliver` returned.
                            let frame = unsafe {
                                std::slice::from_raw_parts(addr as *const u8, wc.byte_len as usize)
                            };
                            deliver.frame(c.peer, frame);
                            delivered += 1;
                            // Its credit goes back to the peer once the slot is reposted.
                            self.repost.push((slot as u32, idx));
                            continue;
                        }
                    }
                }
                self.repost.push((slot as u32, NO_CONN));
            }
            if n < POLL_BATCH {
                break;
            }
        }
        self.stats.frames_received += delivered as u64;
        // Explicit credit messages for the connections that owe some (kept when the send
        // queue is full: retried on the next poll).
        if !self.credit_queue.is_empty() {
            let mut queue = std::mem::take(&mut self.credit_queue);
            queue.retain(|&idx| !self.return_credits(idx));
            self.credit_queue = queue;
        }
        delivered
    }

    /// Sends an explicit credit message if `idx` still owes one; false: no room now.
    fn return_credits(&mut self, idx: u32) -> bool {
        let c = &self.conns[idx as usize];
        if !c.credit_due || !matches!(c.state, State::Ready) {
            return true; // a frame carried the credits, or the connection is gone
        }
        if c.inflight.len() + 1 >= c.depth {
            return false;
        }
        match self.post(idx, &[], KIND_CREDIT, None, None, false) {
            Ok(()) => {
                self.conns[idx as usize].credit_due = false;
                self.stats.credit_messages += 1;
            }
            Err(e) => self.fail(idx, e),
        }
        true
    }

    fn check_timers(&mut self) {
        enum Act {
            Wait,
            Timeout(u32, u64),
            Resend,
            Probe,
        }
        let now = Instant::now();
        for idx in 0..self.conns.len() as u32 {
            let c = &mut self.conns[idx as usize];
            let act = match &mut c.state {
                State::Connecting {
                    since,
                    last_req,
                    tries,
                } => {
                    if now - *since > self.cfg.handshake_timeout && self.cfg.patient_handshakes {
                        tracing::warn!(
                            "verbs: peer {} has not answered the connection handshake for {} ms; still asking (a peer busy outside any Weft call answers when it next enters one)",
                            c.peer,
                            self.cfg.handshake_timeout.as_millis()
                        );
                        *since = now;
                        Act::Wait
                    } else if now - *since > self.cfg.handshake_timeout {
                        Act::Timeout(c.peer, (now - *since).as_millis() as u64)
                    } else if now - *last_req > Duration::from_millis(100 << (*tries).min(3)) {
                        *last_req = now;
                        *tries += 1;
                        Act::Resend
                    } else {
                        Act::Wait
                    }
                }
                State::Ready => match c.starved_since {
                    Some(t)
                        if now - t > STARVED_PROBE_AFTER
                            && !c.probe_out
                            && c.inflight.len() < c.depth =>
                    {
                        Act::Probe
                    }
                    _ => Act::Wait,
                },
                _ => Act::Wait,
            };
            match act {
                Act::Wait => {}
                Act::Timeout(peer, waited_ms) => {
                    self.fail(idx, Error::HandshakeTimeout { peer, waited_ms })
                }
                Act::Resend => self.send_hs(idx, HsKind::Req, 0),
                Act::Probe => self.probe(idx),
            }
        }
    }

    /// Registers `[ptr, ptr + len)` so a peer can RDMA-read it (rendezvous send), through
    /// the registration cache; returns what the peer needs. The memory is only pinned, never
    /// accessed here; an unmapped range is an error (`Error::RegMr`, EFAULT).
    ///
    /// The registration stays in place (its cache entry pinned) until
    /// [`Endpoint::release`] of the returned region, which the sender calls once the peer
    /// reported its read done; after that it stays cached for reuse until evicted. Memory
    /// that is freed or reused must be [`Endpoint::invalidate`]d first.
    pub fn register(&mut self, ptr: *const u8, len: usize) -> Result<RemoteRegion, Error> {
        let (key, mr) = self.mr_for(ptr as u64, len)?;
        self.rcache.pin(key);
        let x = self.exposed.entry(mr.rkey()).or_insert(Exposure {
            key,
            spans: Vec::new(),
        });
        x.spans.push((ptr as u64, len));
        Ok(RemoteRegion {
            addr: ptr as u64,
            len,
            rkey: mr.rkey(),
        })
    }

    /// Ends one exposure made by [`Endpoint::register`] (the peer finished its transfer).
    /// With `WEFT_VERBS_RCACHE=0` the registration goes with its last exposure.
    pub fn release(&mut self, region: RemoteRegion) {
        let Some(x) = self.exposed.get_mut(&region.rkey) else {
            return;
        };
        let Some(i) = x.spans.iter().position(|&s| s == (region.addr, region.len)) else {
            return;
        };
        x.spans.swap_remove(i);
        let key = x.key;
        if x.spans.is_empty() {
            self.exposed.remove(&region.rkey);
        }
        self.rcache.unpin(key);
        if !self.cfg.rcache && !self.rcache.is_pinned(key) {
            self.rcache.remove(key);
        }
    }

    /// The registration covering `[addr, addr + len)`: from the cache, or made and cached.
    fn mr_for(&mut self, addr: u64, len: usize) -> Result<(Key, Arc<Mr>), Error> {
        if len as u64 > self.info.max_mr_size {
            return Err(Error::MessageTooLarge {
                what: "registration",
                len,
                max: self.info.max_mr_size as usize,
            });
        }
        let (start, end) = page_range(addr, len);
        if self.cfg.rcache {
            if let Some(hit) = self.rcache.lookup(start, end) {
                return Ok(hit);
            }
        }
        let pages = (end - start) as usize;
        let mr = match Mr::register(&self.pd, start as *const u8, pages) {
            Ok(mr) => mr,
            // A range the page rounding made invalid: register the exact bytes. Memory
            // that cannot be written (a send buffer in read-only data) is registered for
            // remote reads only, which is all a rendezvous exposure needs.
            Err(first) => Mr::register(&self.pd, addr as *const u8, len)
                .or_else(|_| Mr::register_read_only(&self.pd, start as *const u8, pages))
                .or_else(|_| Mr::register_read_only(&self.pd, addr as *const u8, len))
                .map_err(|_| first)?,
        };
        let mr = Arc::new(mr);
        let key = self
            .rcache
            .insert(mr.addr(), mr.addr() + mr.len() as u64, mr.clone());
        Ok((key, mr))
    }

    /// Call before `[ptr, ptr + len)` is freed or reused (or when done with it, to
    /// register afresh next time). Exposures of exactly this buffer end (as by `release`);
    /// cached registrations overlapping its pages are dropped, except those still exposed
    /// for other buffers sharing a page: those are never looked up again and go when their
    /// own exposure ends. An RDMA operation in flight keeps its registration until it
    /// completes. Returns how many cached registrations were affected.
    pub fn invalidate(&mut self, ptr: *const u8, len: usize) -> usize {
        let span = (ptr as u64, len);
        let mine: Vec<u32> = self
            .exposed
            .iter()
            .filter(|(_, x)| x.spans.contains(&span))
            .map(|(&rkey, _)| rkey)
            .collect();
        for rkey in mine {
            while self
                .exposed
                .get(&rkey)
                .is_some_and(|x| x.spans.contains(&span))
            {
                self.release(RemoteRegion {
                    addr: span.0,
                    len,
                    rkey,
                });
            }
        }
        let (start, end) = page_range(ptr as u64, len);
        self.rcache.invalidate(start, end)
    }

    /// Starts an RDMA read of `len` bytes from the peer's `(remote_addr, rkey)` into
    /// `[local, local + len)`; `Ok(None)`: no room now (connection not ready, send queue
    /// full), retry after `poll`. Its completion is reported by [`Endpoint::poll_rdma`].
    ///
    /// # Safety
    /// `[local, local + len)` must be valid for writes and must not be read or written by
    /// anyone until `poll_rdma` reports this token (success or error), or the endpoint is
    /// dropped.
    pub unsafe fn rdma_read(
        &mut self,
        conn: ConnId,
        local: *mut u8,
        len: usize,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<Option<RdmaToken>, Error> {
        self.rdma(conn, local as u64, len, remote_addr, rkey, false)
    }

    /// Starts an RDMA write of `[local, local + len)` to the peer's `(remote_addr, rkey)`
    /// (a region the peer exposed with [`Endpoint::register`]); `Ok(None)`: no room now.
    /// Its completion (the data is placed in the peer's memory) is reported by
    /// [`Endpoint::poll_rdma`]. On rxe under emulation writes measured faster than reads
    /// (`ib_write_bw` vs `ib_read_bw`), so a receiver-driven rendezvous (the receiver
    /// exposes its buffer, the sender writes, then says so) may prefer it.
    ///
    /// # Safety
    /// `[local, local + len)` must be valid for reads and must not be modified by anyone
    /// until `poll_rdma` reports this token, or the endpoint is dropped.
    pub unsafe fn rdma_write(
        &mut self,
        conn: ConnId,
        local: *const u8,
        len: usize,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<Option<RdmaToken>, Error> {
        self.rdma(conn, local as u64, len, remote_addr, rkey, true)
    }

    fn rdma(
        &mut self,
        conn: ConnId,
        local: u64,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        write: bool,
    ) -> Result<Option<RdmaToken>, Error> {
        let idx = conn.0;
        let c = self
            .conns
            .get(idx as usize)
            .ok_or(Error::UnknownConn(idx))?;
        match &c.state {
            State::Ready => {}
            State::Failed(e) => return Err(e.duplicate()),
            _ => return Ok(None),
        }
        if len as u64 > self.info.max_msg_size {
            return Err(Error::MessageTooLarge {
                what: if write { "RDMA write" } else { "RDMA read" },
                len,
                max: self.info.max_msg_size as usize,
            });
        }
        let token = self.next_token;
        if len == 0 {
            self.next_token += 1;
            self.rdma_done.push_back((RdmaToken(token), Ok(())));
            return Ok(Some(RdmaToken(token)));
        }
        if c.inflight.len() + 2 >= c.depth {
            self.poll_send();
            let c = &self.conns[idx as usize];
            if c.inflight.len() + 2 >= c.depth {
                return Ok(None);
            }
        }
        let (_, mr) = self.mr_for(local, len)?;
        self.next_token += 1;
        let op = RdmaOp {
            token,
            mr,
            local,
            len: len as u32,
            remote_addr,
            rkey,
            write,
        };
        self.post(idx, &[], 0, None, Some(op), true)
            .inspect_err(|e| self.fail(idx, e.duplicate()))?;
        Ok(Some(RdmaToken(token)))
    }

    /// Same as [`Endpoint::poll_rdma`] (the name the fabric engine uses).
    pub fn poll_reads(&mut self, done: &mut dyn FnMut(RdmaToken, Result<(), Error>)) -> usize {
        self.poll_rdma(done)
    }

    /// Reports finished RDMA reads and writes: `done(token, Ok(()))`, or an error naming the peer.
    /// Returns how many were reported.
    pub fn poll_rdma(&mut self, done: &mut dyn FnMut(RdmaToken, Result<(), Error>)) -> usize {
        // RDMA operations are always signaled: with none outstanding there is nothing to
        // find on the send queue (an ibv_poll_cq less on every idle poll).
        if self.signaled_out > 0 {
            self.poll_send();
        }
        let n = self.rdma_done.len();
        while let Some((t, r)) = self.rdma_done.pop_front() {
            done(t, r);
        }
        n
    }

    /// The peer of a connection.
    pub fn peer_of(&self, conn: ConnId) -> Option<u32> {
        self.conns.get(conn.0 as usize).map(|c| c.peer)
    }

    /// Bytes of a card (for wire-up size checks).
    pub const CARD_LEN: usize = CARD_LEN;
}
