//! The shared-memory transport: one receiver-side inbox per process, written
//! by its local senders.
//!
//! An [`Inbox`] is a segment (layout in [`crate::layout`]) that holds
//! `fastbox_peers` single-producer rings (fastboxes, see `crate::fastbox`)
//! and one bounded multi-producer queue (see `crate::queue`). A sender's
//! [`Outbox`] claims a free fastbox on connect (first come first served) and
//! otherwise uses the queue, so memory stays bounded whatever the number of
//! local processes. The receiver polls only the claimed fastboxes (claims
//! are made in index order; it reads their count with one load) and the
//! queue.
//!
//! Liveness: every `Outbox` holds a record lock on byte `sender_id` of the
//! inbox's shm object (`crate::liveness`). A sender that dies leaves its
//! fastbox with whole frames only (the header word is stored last); a
//! successor with the same `sender_id` takes the fastbox over and resumes it.
//! A sender that dies holding a reserved queue slot is detected after the
//! slot stayed busy for a while, and the slot is recycled.

use core::fmt;
use core::sync::atomic::Ordering;

use crate::claim::ClaimTable;
use crate::config::{Geometry, InboxConfig};
use crate::error::ShmError;
use crate::fastbox::{Consumer, PollEnd, Producer, ShmRing};
use crate::layout::{
    FastboxCtl, InboxHeader, PairLine, QueueProducerLine, CLAIM_ATTACHED, CLAIM_GENERATION_ONE,
    CLAIM_SENDER_MASK, FASTBOX_CTL_BYTES, FASTBOX_SLOT_BYTES, INBOX_HEADER_OFFSET, NO_OWNER,
    PAIR_LINE_BYTES, QUEUE_PRODUCER_OFFSET,
};
use crate::liveness::{lock_sender, sender_locked_elsewhere};
use crate::pair::{HostShared, InLine, LineSite, OutLine, PairHost, Pending};
use crate::queue::{Head, ShmQueue};
use crate::segment::{SegmentError, SegmentKind, SharedSegment, WritableSegment};

/// Most frames taken from one fastbox, and from the queue, per poll.
const POLL_BATCH: usize = 64;
/// Polls that the queue's head slot may stay busy before the receiver asks
/// whether its owner is still alive (then again every as many polls).
const STALL_CHECK_POLLS: u32 = 4096;
/// Largest sender id plus one.
const SENDER_ID_LIMIT: u32 = 1 << 24;

/// Pointers to the parts of a mapped inbox segment.
#[derive(Debug)]
struct Parts {
    header: *const InboxHeader,
    base: *mut u8,
    geometry: Geometry,
    cfg: InboxConfig,
}

impl Parts {
    /// # Safety
    ///
    /// `base` must be a mapping of at least `geometry.total_bytes` bytes that
    /// outlives every use of the result and of the rings and queue made from
    /// it, page aligned, and `geometry` must be `cfg`'s geometry.
    unsafe fn new(base: *mut u8, geometry: Geometry, cfg: InboxConfig) -> Parts {
        Parts {
            // SAFETY: the header lies inside the mapping (contract).
            header: unsafe { base.add(INBOX_HEADER_OFFSET).cast() },
            base,
            geometry,
            cfg,
        }
    }

    fn header(&self) -> &InboxHeader {
        // SAFETY: inside the mapping (contract of `new`), 8-byte aligned,
        // all fields atomics.
        unsafe { &*self.header }
    }

    fn ctl(&self, i: usize) -> &FastboxCtl {
        debug_assert!(i < self.cfg.fastbox_peers as usize);
        // SAFETY: i < fastbox_peers, so the control block lies inside the
        // mapping at a 128-byte aligned offset; all shared fields atomics.
        unsafe {
            &*self
                .base
                .add(self.geometry.ctl_offset + i * FASTBOX_CTL_BYTES)
                .cast()
        }
    }

    fn ring(&self, i: usize) -> ShmRing {
        let bytes = self.cfg.fastbox_bytes as usize;
        // SAFETY: ring i lies inside the mapping (i < fastbox_peers, checked
        // by `ctl`), page aligned; the mapping outlives the ring (contract
        // of `new`); fastbox_bytes is a power of two, so is the slot count.
        unsafe {
            ShmRing::new(
                self.base.add(self.geometry.ring_offset + i * bytes),
                self.ctl(i),
                (bytes / FASTBOX_SLOT_BYTES) as u64,
            )
        }
    }

    fn queue(&self) -> ShmQueue {
        // SAFETY: the queue and its producer line lie inside the mapping
        // (geometry), page and 128-byte aligned; the mapping outlives the
        // queue (contract of `new`); the config was validated (slot bytes a
        // multiple of 64 above the header, slots a power of two >= 2).
        unsafe {
            ShmQueue::new(
                self.base.add(self.geometry.queue_offset),
                self.base
                    .add(QUEUE_PRODUCER_OFFSET)
                    .cast::<QueueProducerLine>(),
                u64::from(self.cfg.queue_slots),
                self.cfg.queue_slot_bytes as usize,
            )
        }
    }
}

/// The receiver's state of one claimed fastbox.
#[derive(Debug)]
struct BoxReader {
    ring: ShmRing,
    consumer: Consumer,
    sender_id: u32,
    /// Set once the ring held an invalid header: no longer polled.
    broken: bool,
    /// The pair line with this sender, once both sides paired.
    line: Option<InLine>,
}

/// A process's inbox: the receiving end of the shared-memory transport.
///
/// Owns its segment; dropping it unlinks the segment (senders keep their
/// mappings, and their sends then go nowhere).
pub struct Inbox {
    seg: WritableSegment,
    parts: Parts,
    /// Readers of fastboxes `0..boxes.len()`, the claimed ones seen so far.
    boxes: Vec<BoxReader>,
    queue: ShmQueue,
    /// Next queue ticket to read.
    queue_head: u64,
    /// Ticket the queue's head was found busy at, and for how many polls.
    stall: (u64, u32),
    /// Queue slots recycled from dead producers (for tests and inspection).
    recycled: u64,
    /// Shared with [`PairHost`]s: our pair lines and the lines to adopt.
    host: std::sync::Arc<HostShared>,
    /// Pair lines whose sender's fastbox we have not discovered yet.
    waiting: Vec<Pending>,
}

// SAFETY: the raw pointers point into the segment the Inbox owns; nothing is
// tied to the creating thread.
unsafe impl Send for Inbox {}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field("name", &self.seg.name())
            .field("bytes", &self.seg.bytes())
            .field("fastboxes_claimed", &self.boxes.len())
            .field("queue_head", &self.queue_head)
            .finish_non_exhaustive()
    }
}

impl Inbox {
    /// Creates the inbox segment `name` (a POSIX shm name such as
    /// `/weft-<job>-<rank>`, which must not exist) with the geometry of
    /// `cfg`, and publishes it. Pages are only touched when used. The inbox
    /// has no owner id, so no pair lines (see [`create_for`](Self::create_for)).
    pub fn create(name: &str, cfg: &InboxConfig) -> Result<Inbox, ShmError> {
        Self::create_for(name, cfg, NO_OWNER)
    }

    /// [`create`](Self::create) for the process that sends to its local peers
    /// as sender `owner_id` (its local rank): small frames between it and
    /// each peer then share one cache line once both sides paired their
    /// outbox ([`PairHost::pair`]).
    pub fn create_for(name: &str, cfg: &InboxConfig, owner_id: u32) -> Result<Inbox, ShmError> {
        let geometry = cfg.geometry()?;
        let seg = WritableSegment::create(name, geometry.total_bytes, SegmentKind::INBOX)?;
        // SAFETY: the segment is `total_bytes` long, page aligned, and owned
        // by the Inbox together with every part made from it.
        let parts = unsafe { Parts::new(seg.as_ptr(), geometry, cfg.clone()) };
        let h = parts.header();
        // Relaxed: published by the Release store of the state in `publish`.
        h.fastbox_peers.store(cfg.fastbox_peers, Ordering::Relaxed);
        h.fastbox_bytes.store(cfg.fastbox_bytes, Ordering::Relaxed);
        h.queue_slots.store(cfg.queue_slots, Ordering::Relaxed);
        h.queue_slot_bytes
            .store(cfg.queue_slot_bytes, Ordering::Relaxed);
        h.receiver_pid.store(std::process::id(), Ordering::Relaxed);
        h.ctl_offset
            .store(geometry.ctl_offset as u64, Ordering::Relaxed);
        h.ring_offset
            .store(geometry.ring_offset as u64, Ordering::Relaxed);
        h.queue_offset
            .store(geometry.queue_offset as u64, Ordering::Relaxed);
        h.owner_id.store(owner_id, Ordering::Relaxed);
        h.pair_lines.store(cfg.pair_lines, Ordering::Relaxed);
        h.pair_offset
            .store(geometry.pair_offset as u64, Ordering::Relaxed);
        seg.publish();
        let host = std::sync::Arc::new(HostShared {
            owner_id,
            pair_lines: if owner_id == NO_OWNER {
                0
            } else {
                cfg.pair_lines
            },
            lines: parts.base.wrapping_add(geometry.pair_offset) as usize,
            keep: seg.keepalive(),
            pending: std::sync::Mutex::new(Vec::new()),
            has_pending: std::sync::atomic::AtomicBool::new(false),
        });
        Ok(Inbox {
            queue: parts.queue(),
            boxes: Vec::with_capacity(cfg.fastbox_peers as usize),
            seg,
            parts,
            queue_head: 0,
            stall: (u64::MAX, 0),
            recycled: 0,
            host,
            waiting: Vec::new(),
        })
    }

    /// The inbox's split-copy claim words (see [`ClaimTable`]): take it once, and keep
    /// it with the inbox's other receiving state.
    pub fn claim_table(&self) -> ClaimTable {
        // SAFETY: the claim words lie at `claims_offset` inside the mapping (geometry),
        // 64-byte aligned (queue slots are multiples of 64), and the keepalive holds the
        // mapping.
        unsafe {
            ClaimTable::new(
                self.parts
                    .base
                    .add(self.parts.geometry.claims_offset)
                    .cast::<std::sync::atomic::AtomicU64>(),
                self.seg.keepalive(),
            )
        }
    }

    /// What pairs this process's outboxes with this inbox (see
    /// [`PairHost::pair`]).
    pub fn pair_host(&self) -> PairHost {
        PairHost {
            shared: self.host.clone(),
        }
    }

    /// The inbox's segment name (what senders pass to [`Outbox::connect`]).
    pub fn name(&self) -> &str {
        self.seg.name()
    }

    /// Delivers every frame that has arrived (up to an internal batch per
    /// fastbox and for the queue), in per-sender FIFO order, calling
    /// `f(sender_id, frame_bytes)`; the bytes are valid only during the call
    /// and their slot is released when it returns. Returns the number of
    /// frames delivered.
    ///
    /// No syscalls, no locks, no allocation. Cheap when nothing arrived: one
    /// load of the claimed-fastbox count, one per claimed fastbox and one for
    /// the queue. (The one exception is cold: while the queue's next slot
    /// stays reserved but unpublished, every 4096th poll makes one `fcntl`
    /// to ask whether its sender is still alive.)
    pub fn poll<F: FnMut(u32, &[u8]) + ?Sized>(&mut self, f: &mut F) -> usize {
        // SYNC: pairs with the Release `fetch_max` of a sender that claimed a
        // fastbox in `Outbox::connect`.
        let claimed = self.parts.header().fastbox_claimed.load(Ordering::Acquire) as usize;
        if claimed > self.boxes.len() {
            self.discover(claimed);
        }
        // Relaxed: a hint; `adopt` takes the lock, which orders the rest.
        if self.host.has_pending.load(Ordering::Relaxed) {
            self.adopt();
        }
        let mut n = 0;
        for (i, b) in self.boxes.iter_mut().enumerate() {
            if b.broken {
                continue;
            }
            let sender = b.sender_id;
            let (k, end) = b.consumer.poll_with(
                &b.ring,
                b.line.as_mut().map(|l| (&l.mem, &mut l.reader)),
                POLL_BATCH,
                |bytes| f(sender, bytes),
            );
            if let (Some(l), 1..) = (&b.line, k) {
                // The peer talks to us: our sends to it may try the line again.
                l.local.set_try_line(true);
                l.local.set_consumed(l.reader.consumed());
            }
            n += k;
            match end {
                PollEnd::Idle => {}
                PollEnd::Corrupt { pos, header } => {
                    b.broken = true;
                    broken_fastbox(self.seg.name(), i, sender, pos, header);
                }
                PollEnd::CorruptLine { word } => {
                    b.broken = true;
                    broken_line(self.seg.name(), sender, word);
                }
            }
        }
        let (k, head) = self
            .queue
            .poll(&mut self.queue_head, POLL_BATCH, |s, bytes| f(s, bytes));
        n += k;
        if let Head::Busy { sender_id } = head {
            if self.queue_stalled(sender_id) {
                let (k, _) = self
                    .queue
                    .poll(&mut self.queue_head, POLL_BATCH, |s, bytes| f(s, bytes));
                n += k;
            }
        }
        n
    }

    /// Whether nothing has arrived: true means a [`poll`](Self::poll) now
    /// would deliver nothing (up to the timing of concurrent senders). One
    /// load per polled ring, pair line and the queue, no stores: cheap to
    /// spin on while waiting, then poll when it turns false.
    #[inline]
    pub fn quiet(&self) -> bool {
        // Relaxed: hints; `poll` acquires what it delivers.
        if self.parts.header().fastbox_claimed.load(Ordering::Relaxed) as usize != self.boxes.len()
            || self.host.has_pending.load(Ordering::Relaxed)
        {
            return false;
        }
        for b in &self.boxes {
            if b.broken {
                continue;
            }
            if !b.consumer.quiet(&b.ring) {
                return false;
            }
            if let Some(l) = &b.line {
                if !l.reader.quiet(&l.mem) {
                    return false;
                }
            }
        }
        self.queue.quiet(self.queue_head)
    }

    /// Starts polling the fastboxes claimed since the last call.
    #[cold]
    fn discover(&mut self, claimed: usize) {
        let peers = self.parts.cfg.fastbox_peers as usize;
        while self.boxes.len() < claimed.min(peers) {
            let i = self.boxes.len();
            // SYNC: pairs with the AcqRel claim CAS in `Outbox::connect`
            // (already ordered by the Acquire load of the claimed count).
            let claim = self.parts.ctl(i).claim.load(Ordering::Acquire);
            let sender_plus_one = (claim & CLAIM_SENDER_MASK) as u32;
            if sender_plus_one == 0 {
                break;
            }
            let ring = self.parts.ring(i);
            let max_frame = self.parts.cfg.fastbox_max_frame();
            let sender_id = sender_plus_one - 1;
            let line = self
                .waiting
                .iter()
                .position(|p| p.peer == sender_id)
                .map(|k| self.waiting.swap_remove(k).line);
            if let Some(l) = &line {
                l.reader.listen(&l.mem, true);
            }
            self.boxes.push(BoxReader {
                consumer: Consumer::new(
                    (self.parts.cfg.fastbox_bytes as usize / FASTBOX_SLOT_BYTES) as u64,
                    max_frame,
                ),
                ring,
                sender_id,
                broken: false,
                line,
            });
        }
    }

    /// Takes the pair lines handed over by [`PairHost::pair`]: polls each
    /// with its sender's fastbox once that is discovered, and then starts
    /// listening on it.
    #[cold]
    fn adopt(&mut self) {
        let new = {
            let mut pending = self
                .host
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.host.has_pending.store(false, Ordering::Relaxed);
            std::mem::take(&mut *pending)
        };
        for p in new {
            match self.boxes.iter_mut().find(|b| b.sender_id == p.peer) {
                Some(b) if b.line.is_none() => {
                    p.line.reader.listen(&p.line.mem, true);
                    b.line = Some(p.line);
                }
                Some(_) => {}
                None => self.waiting.push(p),
            }
        }
    }

    /// The queue's head slot is reserved but not published: after a while,
    /// check whether its owner is still alive, and recycle the slot if not.
    /// Returns whether it recycled the slot.
    #[cold]
    fn queue_stalled(&mut self, sender_id: u32) -> bool {
        let (ticket, polls) = self.stall;
        if ticket != self.queue_head {
            self.stall = (self.queue_head, 1);
            return false;
        }
        let polls = polls.wrapping_add(1);
        self.stall.1 = polls;
        if polls % STALL_CHECK_POLLS != 0 {
            return false;
        }
        match sender_locked_elsewhere(self.seg.fd(), sender_id) {
            Ok(true) => {}
            Ok(false) => {
                if self.queue.recycle(&mut self.queue_head, sender_id) {
                    self.recycled += 1;
                    tracing::warn!(
                        inbox = self.seg.name(),
                        sender_id,
                        ticket,
                        "sender died while writing a shared-queue slot; slot recycled"
                    );
                    return true;
                }
            }
            Err(e) => {
                if polls == STALL_CHECK_POLLS {
                    tracing::warn!(
                        inbox = self.seg.name(),
                        sender_id,
                        error = %e,
                        "cannot check whether a stalled shared-queue sender is alive"
                    );
                }
            }
        }
        false
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        // Peers stop using the lines: nobody reads them any more.
        for b in &self.boxes {
            if let Some(l) = &b.line {
                l.reader.listen(&l.mem, false);
            }
        }
    }
}

#[cold]
fn broken_line(inbox: &str, sender_id: u32, word: u64) {
    tracing::error!(
        inbox,
        sender_id,
        word = format_args!("{word:#018x}"),
        "pair line holds an invalid frame; no longer polling this sender"
    );
}

#[cold]
fn broken_fastbox(inbox: &str, index: usize, sender_id: u32, pos: u64, header: u64) {
    tracing::error!(
        inbox,
        fastbox = index,
        sender_id,
        pos,
        header = format_args!("{header:#018x}"),
        "fastbox holds an invalid frame header; no longer polling it"
    );
}

/// How an [`Outbox`] reaches its inbox.
#[derive(Debug)]
enum Path {
    /// A fastbox of its own.
    Fastbox {
        ring: ShmRing,
        producer: Producer,
        ctl: *const FastboxCtl,
        /// The claim word as we attached it.
        claim: u64,
        /// The pair line with the receiver, once paired.
        line: Option<OutLine>,
        /// Where that line is (found on connect).
        site: LineSite,
    },
    /// The shared queue.
    Queue(ShmQueue),
}

/// A sender's handle on one peer's inbox.
pub struct Outbox {
    seg: SharedSegment,
    sender_id: u32,
    path: Path,
    /// The pid of the process that created the inbox.
    receiver_pid: u32,
    /// The inbox owner's sender id ([`NO_OWNER`] if it has none).
    receiver_id: u32,
    /// The inbox's split-copy claim words.
    claims: *const std::sync::atomic::AtomicU64,
}

// SAFETY: the raw pointers point into the segment the Outbox maps and owns;
// the ring protocol needs a single producer per fastbox, which `&mut self`
// on `try_send` and the claim protocol guarantee, not a particular thread.
unsafe impl Send for Outbox {}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("inbox", &self.seg.name())
            .field("sender_id", &self.sender_id)
            .field("fastbox", &self.uses_fastbox())
            .field("max_frame", &self.max_frame())
            .finish_non_exhaustive()
    }
}

impl Outbox {
    /// Maps the inbox `inbox_name` read-write, validates its header (magic,
    /// layout version, kind, ready, geometry) and claims a fastbox for
    /// `sender_id` (a CAS on a claim word; first come first served), or, when
    /// all are taken, uses the shared queue. `sender_id` is the sender's
    /// local rank (< 2^24); it is what [`Inbox::poll`] reports.
    ///
    /// A sender that reconnects gets its fastbox back. If another `Outbox`
    /// of the same `sender_id` is alive, this one uses the queue; if that
    /// one's process died, this one takes its fastbox over.
    pub fn connect(inbox_name: &str, sender_id: u32) -> Result<Outbox, ShmError> {
        if sender_id >= SENDER_ID_LIMIT {
            return Err(ShmError::BadSenderId { sender_id });
        }
        let seg = SharedSegment::open(inbox_name, SegmentKind::INBOX).map_err(|e| match e {
            SegmentError::NotFound { name } => ShmError::NoSuchInbox { name },
            e => ShmError::Segment(e),
        })?;
        let (geometry, cfg) = validate(&seg)?;
        // SAFETY: `validate` checked that the geometry fits the mapping,
        // which the Outbox owns together with every part made from it.
        let parts = unsafe { Parts::new(seg.as_ptr(), geometry, cfg.clone()) };
        lock_sender(seg.fd(), sender_id).map_err(|source| ShmError::Lock {
            name: inbox_name.to_owned(),
            sender_id,
            source,
        })?;
        // Relaxed: published with the header by the creator's Release store of the
        // segment state, which `validate` acquired.
        let receiver_id = parts.header().owner_id.load(Ordering::Relaxed);
        let path = match claim_fastbox(&seg, &parts, sender_id)? {
            Some((i, claim, fresh)) => {
                let site = line_site(&parts, sender_id, receiver_id, fresh);
                let ring = parts.ring(i);
                let max_frame = cfg.fastbox_max_frame();
                let producer = if fresh {
                    Producer::new(
                        (cfg.fastbox_bytes as usize / FASTBOX_SLOT_BYTES) as u64,
                        max_frame,
                    )
                } else {
                    Producer::resume(&ring, max_frame)
                };
                Path::Fastbox {
                    ring,
                    producer,
                    ctl: parts.ctl(i),
                    claim,
                    line: None,
                    site,
                }
            }
            None => Path::Queue(parts.queue()),
        };
        // Relaxed: as `receiver_id`.
        let receiver_pid = parts.header().receiver_pid.load(Ordering::Relaxed);
        // SAFETY: `validate` checked that the geometry, claim words included, fits the
        // mapping, which the Outbox owns.
        let claims = unsafe { seg.as_ptr().add(geometry.claims_offset) }.cast();
        Ok(Outbox {
            seg,
            sender_id,
            path,
            receiver_pid,
            receiver_id,
            claims,
        })
    }

    /// The sender id of the inbox's owner (as given to
    /// [`Inbox::create_for`]; `u32::MAX` when it has none).
    pub fn receiver_id(&self) -> u32 {
        self.receiver_id
    }

    /// Whether small frames to the receiver go through a pair line.
    pub fn uses_pair_line(&self) -> bool {
        matches!(self.path, Path::Fastbox { line: Some(_), .. })
    }

    /// Where the pair line with the receiver is, and a handle keeping the
    /// receiver's inbox mapped.
    pub(crate) fn line_site(&self) -> (LineSite, crate::segment::Keepalive) {
        let site = match &self.path {
            Path::Fastbox {
                site, line: None, ..
            } => *site,
            _ => LineSite::None,
        };
        (site, self.seg.keepalive())
    }

    /// Installs the sending end of the pair line; false if there is one.
    pub(crate) fn set_line(&mut self, l: OutLine) -> bool {
        match &mut self.path {
            Path::Fastbox {
                line: line @ None, ..
            } => {
                *line = Some(l);
                true
            }
            _ => false,
        }
    }

    /// Takes the receiver's split-copy claim `slot` of `generation` for this sender: true
    /// when it was still open (this sender copies its part), false when the receiver took
    /// it (or the slot or generation names no open claim).
    pub fn claim_for_sender(&self, slot: u32, generation: u64) -> bool {
        crate::claim::take_for_sender(self.claims, slot, generation)
    }

    /// The pid of the inbox's process (as it recorded when it created the inbox).
    pub fn receiver_pid(&self) -> u32 {
        self.receiver_pid
    }

    /// Sends one frame, `header ++ payload` (`header.len() + payload.len()
    /// <= max_frame()`, else this panics). Returns false, writing nothing,
    /// when there is no room; the caller progresses its own inbox and
    /// retries. No syscalls, no locks, no allocation.
    ///
    /// Sending to an inbox whose process has exited goes nowhere (the
    /// mapping stays valid): it succeeds until the ring is full, then
    /// returns false; peers learn of a death through wire-up.
    #[inline]
    pub fn try_send(&mut self, header: &[u8], payload: &[u8]) -> bool {
        match &mut self.path {
            Path::Fastbox {
                ring,
                producer,
                line,
                ..
            } => {
                if let Some(l) = line {
                    if l.try_send(header, payload, producer.frames()) {
                        return true;
                    }
                }
                producer.try_send(ring, header, payload)
            }
            Path::Queue(q) => q.try_send(self.sender_id, header, payload),
        }
    }

    /// Largest frame [`try_send`](Self::try_send) takes: a quarter of the
    /// fastbox ring, or a queue slot minus its 16-byte header.
    pub fn max_frame(&self) -> usize {
        match &self.path {
            Path::Fastbox { producer, .. } => producer.max_frame(),
            Path::Queue(q) => q.max_frame(),
        }
    }

    /// Whether this sender has a fastbox (else it uses the shared queue).
    pub fn uses_fastbox(&self) -> bool {
        matches!(self.path, Path::Fastbox { .. })
    }

    /// The sender id given to [`connect`](Self::connect).
    pub fn sender_id(&self) -> u32 {
        self.sender_id
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        if let Path::Fastbox { ctl, claim, .. } = &self.path {
            // SAFETY: `ctl` points into the mapping `self.seg`, still alive.
            let ctl = unsafe { &**ctl };
            // SYNC: pairs with the Acquire of a successor's claim CAS in
            // `claim_fastbox`: our last head store is visible to it.
            let _ = ctl.claim.compare_exchange(
                *claim,
                *claim & !CLAIM_ATTACHED,
                Ordering::Release,
                Ordering::Relaxed,
            );
        }
        // `self.seg` drops after this: unmaps, and closes the descriptor,
        // which releases the sender lock.
    }
}

/// Reads the inbox header and checks that its geometry is valid and fits
/// the segment.
fn validate(seg: &SharedSegment) -> Result<(Geometry, InboxConfig), ShmError> {
    let mismatch = |what: String| ShmError::LayoutMismatch {
        name: seg.name().to_owned(),
        what,
    };
    if seg.bytes() < QUEUE_PRODUCER_OFFSET {
        return Err(mismatch(format!(
            "segment of {} bytes is too small for an inbox header",
            seg.bytes()
        )));
    }
    // SAFETY: the mapping holds at least the inbox header (checked above),
    // at an 8-byte aligned offset; its fields are atomics.
    let h = unsafe { &*seg.as_ptr().add(INBOX_HEADER_OFFSET).cast::<InboxHeader>() };
    // Relaxed: the segment's state was acquired by `SharedSegment::open`.
    let cfg = InboxConfig {
        fastbox_peers: h.fastbox_peers.load(Ordering::Relaxed),
        fastbox_bytes: h.fastbox_bytes.load(Ordering::Relaxed),
        queue_slots: h.queue_slots.load(Ordering::Relaxed),
        queue_slot_bytes: h.queue_slot_bytes.load(Ordering::Relaxed),
        pair_lines: h.pair_lines.load(Ordering::Relaxed),
    };
    let geometry = cfg
        .geometry()
        .map_err(|e| mismatch(format!("header holds an invalid geometry ({e})")))?;
    let recorded = (
        h.ctl_offset.load(Ordering::Relaxed),
        h.pair_offset.load(Ordering::Relaxed),
        h.ring_offset.load(Ordering::Relaxed),
        h.queue_offset.load(Ordering::Relaxed),
    );
    let expected = (
        geometry.ctl_offset as u64,
        geometry.pair_offset as u64,
        geometry.ring_offset as u64,
        geometry.queue_offset as u64,
    );
    if recorded != expected {
        return Err(mismatch(format!(
            "offsets (ctl, pair, ring, queue) {recorded:?} differ from {expected:?} computed \
             from {cfg:?}"
        )));
    }
    if geometry.total_bytes > seg.bytes() {
        return Err(mismatch(format!(
            "{cfg:?} needs {} bytes, the segment has {}",
            geometry.total_bytes,
            seg.bytes()
        )));
    }
    Ok((geometry, cfg))
}

/// Where the pair line of `sender_id` and the inbox's owner is: ours when we
/// have the lower id, theirs (in this inbox, at our index) when we have the
/// higher one; none without owner ids, out of the inbox's range, on a
/// fastbox taken over from a previous sender, or with rings of more than
/// 2^16 slots.
fn line_site(parts: &Parts, sender_id: u32, receiver_id: u32, fresh: bool) -> LineSite {
    // A line frame's place among the ring frames is a count mod 2^16: a ring
    // that can hold more unconsumed frames could make it look due too early.
    let ring_slots = parts.cfg.fastbox_bytes as usize / FASTBOX_SLOT_BYTES;
    if !fresh || receiver_id == NO_OWNER || receiver_id == sender_id || ring_slots > 1 << 16 {
        return LineSite::None;
    }
    if sender_id < receiver_id {
        return LineSite::Ours;
    }
    if sender_id >= parts.cfg.pair_lines {
        return LineSite::None;
    }
    // SAFETY: the pair lines lie inside the mapping (`validate` checked the
    // geometry, which places `pair_lines` of them at `pair_offset`), 64-byte
    // aligned.
    LineSite::Theirs(unsafe {
        parts
            .base
            .add(parts.geometry.pair_offset + sender_id as usize * PAIR_LINE_BYTES)
            .cast::<PairLine>()
    })
}

/// Claims a fastbox for `sender_id`: its own (reattach, or takeover from a
/// dead process) or the first free one. `None` if all are taken or a live
/// `Outbox` of the same sender holds its fastbox. Returns the index, the
/// claim word as attached, and whether the ring is fresh.
fn claim_fastbox(
    seg: &SharedSegment,
    parts: &Parts,
    sender_id: u32,
) -> Result<Option<(usize, u64, bool)>, ShmError> {
    let me = u64::from(sender_id) + 1;
    for i in 0..parts.cfg.fastbox_peers as usize {
        let ctl = parts.ctl(i);
        loop {
            // SYNC: pairs with the AcqRel claim CAS of other senders and the
            // Release detach in `Outbox::drop`.
            let c = ctl.claim.load(Ordering::Acquire);
            if c == 0 {
                let new = me | CLAIM_ATTACHED | CLAIM_GENERATION_ONE;
                // SYNC: AcqRel pairs with other senders' Acquire loads of the
                // claim word (claims form a prefix: a sender only tries box
                // i + 1 after seeing box i claimed).
                if ctl
                    .claim
                    .compare_exchange(0, new, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    // SYNC: pairs with the receiver's Acquire load of the
                    // count in `Inbox::poll`.
                    parts
                        .header()
                        .fastbox_claimed
                        .fetch_max(i as u32 + 1, Ordering::Release);
                    return Ok(Some((i, new, true)));
                }
                continue;
            }
            if c & CLAIM_SENDER_MASK != me {
                break;
            }
            if c & CLAIM_ATTACHED != 0 {
                let alive = sender_locked_elsewhere(seg.fd(), sender_id).map_err(|source| {
                    ShmError::Lock {
                        name: seg.name().to_owned(),
                        sender_id,
                        source,
                    }
                })?;
                if alive {
                    return Ok(None);
                }
            }
            let new = (c | CLAIM_ATTACHED).wrapping_add(CLAIM_GENERATION_ONE);
            // SYNC: AcqRel: Acquire pairs with the previous holder's Release
            // detach (its head store is visible); Release orders our attach
            // for concurrent connects of the same sender.
            if ctl
                .claim
                .compare_exchange(c, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Ok(Some((i, new, false)));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests;
