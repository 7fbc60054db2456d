//! Weft's fabric core: a [`Fabric`] per process, [`Communicator`]s whose context ids are
//! PGCIDs, and tagged point-to-point messaging with MPI semantics over the transports.
//!
//! Paths are chosen per peer: loopback for the process itself, shared memory for the
//! other processes of its node (cards exchanged through the wire-up service, connections
//! made on first send). Progress happens inside the calls (`send`, `recv`, `test`,
//! `wait`, ...): there is no hidden thread.
//!
//! ```no_run
//! use weft_fabric::{Fabric, Source, Tag};
//! let fabric = Fabric::init()?;
//! let world = fabric.world();
//! let (rank, size) = (world.rank(), world.size());
//! world.send(&[rank as u64], (rank + 1) % size, Tag(7))?;
//! let mut got = [0u64; 1];
//! let status = world.recv(&mut got, Source::Any, Tag(7))?;
//! println!("rank {rank} got {got:?} from {}", status.source);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod backoff;
mod engine;
mod lock;
pub use lock::{Guard as SpinGuard, SpinLock};
pub mod sched;
mod session;
mod setup;

pub use session::{
    CommError, ErrHandler, Group, GroupCompare, Info, PsetInfo, Session, SessionError, ThreadLevel,
    MPI_PSET_SELF, MPI_PSET_WORLD, PROVIDED_THREAD_LEVEL,
};

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

pub use backoff::spin_limit;
pub(crate) use backoff::{note_oversubscription, Backoff};
use engine::{Config, Direct, Engine, Resolved, Resolver, SingleCopy};
use lock::Guard;
use setup::DEFAULT_TCP_EAGER_LIMIT;
pub use setup::{SHM_CARD_KEY, TCP_CARD_KEY, TUNABLES, VERBS_CARD_KEY};
use weft_shm::Inbox;
use weft_wireup::Client;

/// A message tag. [`Tag::ANY`] matches any tag in a receive and is not a valid send tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tag(pub u32);

impl Tag {
    /// Matches any tag (receive side only).
    pub const ANY: Tag = Tag(u32::MAX);
}

/// Where a receive accepts a message from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Any rank of the communicator.
    Any,
    /// This rank of the communicator.
    Rank(u32),
}

/// What a completed operation tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// The sender's rank in the communicator (receives), or the destination (sends).
    pub source: u32,
    /// The message's tag.
    pub tag: u32,
    /// The message's size in bytes.
    pub count: usize,
}

impl Status {
    /// The sender's rank.
    pub fn source(&self) -> u32 {
        self.source
    }
    /// Number of `T` elements the message holds.
    pub fn count_of<T: Pod>(&self) -> usize {
        self.count / std::mem::size_of::<T>().max(1)
    }
}

/// Errors of point-to-point operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum P2pError {
    /// The message is larger than the receive buffer (its first `capacity` bytes were received).
    #[error("message truncated: rank {sender} sent {size} bytes with tag {tag}, the receive buffer holds {capacity}")]
    Truncated {
        /// The sender.
        sender: u32,
        /// The tag.
        tag: u32,
        /// The message's real size.
        size: usize,
        /// The receive buffer's size.
        capacity: usize,
    },
    /// The peer died or finalized while the operation waited on it.
    #[error("rank {rank} is gone: {reason}")]
    PeerGone {
        /// The peer.
        rank: u32,
        /// What happened to it.
        reason: String,
    },
    /// The rank is outside the communicator.
    #[error("rank {rank} is not in the communicator (size {size})")]
    InvalidRank {
        /// The rank.
        rank: u32,
        /// The communicator's size.
        size: u32,
    },
    /// The tag is not valid for a send.
    #[error("tag {0} is reserved (Tag::ANY) and cannot be sent")]
    InvalidTag(u32),
    /// No transport reaches the peer.
    #[error("no path to rank {rank}: {reason}")]
    NoPath {
        /// The peer.
        rank: u32,
        /// Why.
        reason: String,
    },
    /// A message of a collective operation had another size than this member expected:
    /// the members disagree on the operation's arguments (a count, a type or the root).
    #[error("rank {rank} sent {got} bytes (tag {tag}) where this member expected {expected}: the members of the collective disagree on its arguments")]
    SizeMismatch {
        /// The sender.
        rank: u32,
        /// The message's tag.
        tag: u32,
        /// Bytes expected.
        expected: usize,
        /// Bytes that came.
        got: usize,
    },
    /// Another member failed its part of the collective operation (and told the others,
    /// so that none waits for it).
    #[error("rank {rank} failed its part of the collective operation: {reason}")]
    Aborted {
        /// The member that failed.
        rank: u32,
        /// Its error.
        reason: String,
    },
    /// A schedule (`sched`) was refused before it started: a step outside its buffers or
    /// the communicator.
    #[error("schedule refused: {0}")]
    Schedule(String),
    /// The transport refused the operation (a buffer it cannot register, a message
    /// beyond the device's limits).
    #[error("transport error with rank {rank}: {reason}")]
    Transport {
        /// The peer.
        rank: u32,
        /// What failed.
        reason: String,
    },
}

/// Errors of [`Fabric::init`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// The wire-up client could not start.
    #[error("fabric init: {0}")]
    Wire(#[from] weft_wireup::InitError),
    /// The shared-memory inbox could not be created.
    #[error("fabric init: shared-memory inbox: {0}")]
    Shm(#[from] weft_shm::ShmError),
    /// The card could not be published.
    #[error("fabric init: publishing the shared-memory card: {0}")]
    Card(#[from] weft_wireup::CommitError),
    /// The verbs transport was asked for (`WEFT_TRANSPORTS=verbs`) but cannot open.
    #[error("fabric init: WEFT_TRANSPORTS asks for verbs only, but the verbs transport cannot open: {0}")]
    Verbs(#[source] weft_verbs::Error),
    /// TCP is the only way to the other processes (`WEFT_TRANSPORTS=tcp`, or verbs did
    /// not open either) but the TCP transport cannot open.
    #[error(
        "fabric init: the TCP transport is the only way to other processes but cannot open: {0}"
    )]
    Tcp(String),
    /// A tunable has a bad value.
    #[error("fabric init: {var}={value:?}: {reason}")]
    Tunable {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
}

/// Plain data that may be sent as bytes.
///
/// # Safety
/// Implementors must have no padding, no pointers and accept every bit pattern.
pub unsafe trait Pod: Copy + Send + Sync + 'static {}
macro_rules! pod {
    ($($t:ty),*) => { $(
        // SAFETY: a primitive number type: no padding, every bit pattern valid.
        unsafe impl Pod for $t {}
    )* };
}
pod!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize, f32, f64);
// SAFETY: an array of Pod has no padding between elements and inherits their validity.
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}

/// A value with an index: the element of min/max-with-location reductions (MPI's
/// `MINLOC`/`MAXLOC` pair types, such as `MPI_DOUBLE_INT`). Plain data for the pairs
/// whose two fields have the same size (so no padding): `(f64|i64|u64, i64)` and
/// `(f32|i32|u32, i32)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Loc<V, I> {
    /// The value compared.
    pub value: V,
    /// Where it came from (a rank, an index); the smaller one wins ties.
    pub index: I,
}

macro_rules! loc_pod {
    ($(($v:ty, $i:ty)),*) => { $(
        const _: () = assert!(
            std::mem::size_of::<Loc<$v, $i>>()
                == std::mem::size_of::<$v>() + std::mem::size_of::<$i>()
        );
        // SAFETY: `repr(C)` with two fields of one size and alignment: no padding (the
        // size is asserted above), and both fields accept every bit pattern.
        unsafe impl Pod for Loc<$v, $i> {}
    )* };
}
loc_pod!(
    (f64, i64),
    (i64, i64),
    (u64, i64),
    (f32, i32),
    (i32, i32),
    (u32, i32)
);

fn bytes_of<T: Pod>(s: &[T]) -> (*const u8, usize) {
    (s.as_ptr().cast(), std::mem::size_of_val(s))
}

fn bytes_of_mut<T: Pod>(s: &mut [T]) -> (*mut u8, usize) {
    (s.as_mut_ptr().cast(), std::mem::size_of_val(s))
}

/// The process's fabric, shared by every thread and session.
static SHARED: Mutex<Option<Arc<Inner>>> = Mutex::new(None);

extern "C" fn finalize_wire_at_exit() {
    // Not a plain finalize: the server reports a nonzero exit as such.
    Client::finalize_shared_at_exit();
}

/// The process's wire-up client (`Client::shared`: one connection to the node's server,
/// shared by the fabric, every session and every thread), finalized when the process
/// exits.
pub(crate) fn process_wire() -> Result<Arc<Client>, weft_wireup::InitError> {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    let c = Client::shared()?;
    AT_EXIT.call_once(|| {
        // SAFETY: atexit records a plain `extern "C"` function with no captured state; it
        // runs during exit and only touches wire-up's shared client (through a try-lock).
        let rc = unsafe { libc::atexit(finalize_wire_at_exit) };
        if rc != 0 {
            tracing::warn!("atexit failed: the wire-up client will not finalize at exit");
        }
    });
    Ok(c)
}

struct Inner {
    /// The transports and the matching state. Every call takes it for as long as it
    /// touches them; wait loops let go of it whenever another thread waits for it.
    engine: SpinLock<Engine>,
    /// Threads blocked on `engine`: a thread that holds it in a wait loop lets go when
    /// this is not zero, so that a receive on one thread never starves the send on
    /// another that it waits for.
    waiters: AtomicU32,
    wire: Option<Arc<Client>>,
    me: u32,
    size: u32,
    world_ctx: u64,
    /// Shared memory is among the transports (WEFT_TRANSPORTS).
    shm: bool,
    /// Fetches a peer's card into the node's datastore (a wire-up get that may wait for
    /// the peer to publish it), run before the first send to it without the engine lock,
    /// so that a slow peer never stalls this process's other threads.
    prefetch: Option<Prefetch>,
    /// Per job rank: the first send to it found its connection through its handshake
    /// (or gave up on it), so later sends skip the check.
    connected: Vec<AtomicBool>,
    /// What every handle of the world communicator shares.
    world_shared: Arc<CommShared>,
    /// How long a finalize keeps pushing out frames (`WEFT_FINALIZE_TIMEOUT`).
    finalize_wait: Duration,
}

/// A peer's card fetched once: the fetch, and per peer whether it ran.
struct Prefetch {
    fetch: Box<dyn Fn(u32) + Send + Sync>,
    done: Arc<Vec<AtomicBool>>,
}

impl Inner {
    fn new(
        engine: Engine,
        wire: Option<Arc<Client>>,
        me: u32,
        size: u32,
        world_ctx: u64,
        shm: bool,
        prefetch: Option<Prefetch>,
    ) -> Inner {
        Inner {
            engine: SpinLock::new(engine),
            waiters: AtomicU32::new(0),
            wire,
            me,
            size,
            world_ctx,
            shm,
            prefetch,
            connected: (0..size).map(|_| AtomicBool::new(false)).collect(),
            world_shared: Arc::default(),
            finalize_wait: setup::finalize_wait(),
        }
    }

    /// Before a send to job rank `job`: the first one fetches its card, then waits for
    /// the connection's handshake, both without holding the engine for long (one relaxed
    /// load afterwards).
    #[inline(always)]
    fn before_send(&self, job: u32) {
        if job == self.me {
            // Loopback: no card, no connection (a process alone on its node publishes
            // no shared-memory card, so a fetch of its own would wait in vain).
            return;
        }
        if let Some(p) = &self.prefetch {
            // Relaxed: a hint; a second fetch only finds the card already on the node.
            if !p
                .done
                .get(job as usize)
                .is_some_and(|d| d.load(Ordering::Relaxed))
            {
                self.prefetch_card(p, job);
            }
        }
        // Relaxed: a hint too; the engine checks readiness itself on every send.
        if self
            .connected
            .get(job as usize)
            .is_some_and(|c| !c.load(Ordering::Relaxed))
        {
            self.connect_first(job);
        }
    }

    /// The first send to `job`: resolves its path and waits until a verbs or TCP
    /// connection to it is through its handshake, progressing the engine meanwhile and
    /// letting go of it whenever another thread wants it (a busy peer never stalls this
    /// process's other threads). Gives up at once on an error or a peer that is gone:
    /// the send then reports it.
    #[cold]
    fn connect_first(&self, job: u32) {
        let mut e = self.engine();
        let mut backoff = Backoff::default();
        loop {
            match e.ready_for(job) {
                Ok(true) | Err(_) => break,
                Ok(false) => {}
            }
            e.progress();
            let (g, check) = self.pause(e, &mut backoff);
            e = g;
            if check && e.gone_reason(job).is_some() {
                break;
            }
        }
        drop(e);
        if let Some(c) = self.connected.get(job as usize) {
            c.store(true, Ordering::Relaxed);
        }
    }

    #[cold]
    fn prefetch_card(&self, p: &Prefetch, job: u32) {
        (p.fetch)(job);
        if let Some(d) = p.done.get(job as usize) {
            d.store(true, Ordering::Relaxed);
        }
    }

    /// The engine, for this thread alone until the guard drops. Uncontended (one
    /// thread, or threads taking turns), this is one atomic compare-and-swap.
    #[inline]
    fn engine(&self) -> Guard<'_, Engine> {
        match self.engine.try_lock() {
            Some(g) => g,
            None => {
                // SYNC: a hint only, read by `pause`; the lock orders the engine's data.
                self.waiters.fetch_add(1, Ordering::Relaxed);
                let g = self.engine.lock();
                self.waiters.fetch_sub(1, Ordering::Relaxed);
                g
            }
        }
    }

    /// One round of a wait loop: snoozes, letting go of the engine meanwhile when
    /// another thread waits for it or when the backoff yields or sleeps. Returns the
    /// engine again and whether it is time to check for dead peers.
    #[inline(always)]
    fn pause<'a>(
        &'a self,
        g: Guard<'a, Engine>,
        backoff: &mut Backoff,
    ) -> (Guard<'a, Engine>, bool) {
        let mut g = g;
        if g.has_copies() {
            // Large copies between processes run without the engine lock.
            let jobs = g.take_copies();
            drop(g);
            let done = jobs.into_iter().map(engine::CopyJob::run).collect();
            g = self.engine();
            g.copies_done(done);
            return (g, false);
        }
        // SYNC: a hint only (see `engine`).
        if self.waiters.load(Ordering::Relaxed) == 0 && backoff.spinning() {
            let check = backoff.snooze();
            return (g, check);
        }
        drop(g);
        let check = backoff.snooze();
        if backoff.spinning() {
            // Spinning, yet another thread wanted the engine: give it a turn.
            std::thread::yield_now();
        }
        (self.engine(), check)
    }
}

/// One process's fabric: the wire-up client plus the transports.
///
/// `Send` and `Sync`: every thread of the process shares it, and its communicators may
/// be used from several threads at once (MPI's `MPI_THREAD_MULTIPLE`).
#[derive(Clone)]
pub struct Fabric {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("rank", &self.inner.me)
            .field("size", &self.inner.size)
            .finish()
    }
}

impl Fabric {
    /// Joins the job: connects to the wire-up server, creates this process's
    /// shared-memory inbox and publishes its card (no fence: peers fetch it on first
    /// send, waiting for it if needed).
    ///
    /// A process has one fabric: later calls, from any thread (and every
    /// [`Session::init`]), share it. Concurrent first calls from several threads make
    /// one fabric: the others wait for it. Sessions may come and go (a new session after
    /// every earlier one finalized is fine), but after [`Fabric::finalize`] the process
    /// is done with Weft: a later `Fabric::init` or `Session::init` fails with
    /// [`weft_wireup::InitError::Finalized`] (re-initialization is not supported).
    pub fn init() -> Result<Fabric, InitError> {
        let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(inner) = shared.as_ref() {
            if inner.wire.as_ref().is_some_and(|w| w.is_finalized()) {
                return Err(InitError::Wire(weft_wireup::InitError::Finalized));
            }
            return Ok(Fabric {
                inner: inner.clone(),
            });
        }
        let inner = Arc::new(Self::build(process_wire()?)?);
        if let Some(w) = &inner.wire {
            // A process blocked in a fence or group operation still answers its peers'
            // connection handshakes and rendezvous (a thread already in the engine,
            // including this one, leaves the work to that thread).
            let weak = Arc::downgrade(&inner);
            w.set_progress_hook(move || {
                if let Some(inner) = weak.upgrade() {
                    if let Some(mut e) = inner.engine.try_lock() {
                        e.progress();
                    }
                }
            });
        }
        *shared = Some(inner.clone());
        Ok(Fabric { inner })
    }

    /// The communicator of every process of the job (`weft://world`).
    pub fn world(&self) -> Communicator {
        Communicator {
            inner: self.inner.clone(),
            ctx: self.inner.world_ctx,
            rank: self.inner.me,
            size: self.inner.size,
            map: None,
            origin: None,
            shared: self.inner.world_shared.clone(),
        }
    }

    /// Whether messages to job rank `rank` go through shared memory (a peer on this node,
    /// with shm among `WEFT_TRANSPORTS`) rather than verbs.
    pub fn reaches_by_shm(&self, rank: u32) -> bool {
        let Some(w) = &self.inner.wire else {
            return self.inner.shm;
        };
        self.inner.shm && w.job().node_of(rank) == Some(w.node())
    }

    /// The wire-up client (job info, psets, put/get).
    pub fn wire(&self) -> &Client {
        self.inner
            .wire
            .as_deref()
            .expect("a fabric made by init has a wire-up client")
    }

    /// How large messages are copied now: `"cma"` (single copy with process_vm_readv, the
    /// default where the kernel allows it) or `"pipelined"` (through the rings: the
    /// fallback when the kernel refuses CMA, or `WEFT_SHM_SINGLE_COPY=none`).
    pub fn rendezvous_copy(&self) -> &'static str {
        match self.inner.engine().single_copy() {
            SingleCopy::Cma => "cma",
            SingleCopy::None => "pipelined",
        }
    }

    /// Pushes out every buffered frame, then finalizes the wire-up client: the process is
    /// then done with Weft (no later `Fabric::init` or `Session::init`).
    pub fn finalize(self) -> Result<(), weft_wireup::FinalizeError> {
        let wait = self.inner.finalize_wait;
        let deadline = Instant::now() + wait;
        let mut backoff = Backoff::default();
        loop {
            let mut e = self.inner.engine();
            e.progress();
            if e.backlog() == 0 {
                break;
            }
            if Instant::now() > deadline {
                tracing::error!(
                    "finalize: {} frames could not be delivered within {wait:?} (peers not \
                     receiving? WEFT_FINALIZE_TIMEOUT sets the wait)",
                    e.backlog()
                );
                break;
            }
            drop(e);
            backoff.snooze();
        }
        match &self.inner.wire {
            Some(w) => w.finalize_shared(),
            None => Ok(()),
        }
    }

    /// A fabric over explicit pieces, for tests of the engine with several endpoints in
    /// one process.
    #[doc(hidden)]
    pub fn from_parts(
        me: u32,
        size: u32,
        inbox: Option<Inbox>,
        local: Vec<u32>,
        peers: Vec<Option<String>>,
        eager_limit: usize,
        cma: bool,
    ) -> Fabric {
        let my_local = local.iter().position(|&r| r == me).unwrap_or(0) as u32;
        let pairs = inbox.as_ref().map(Inbox::pair_host);
        let resolve = card_table(peers, move |name: String| {
            crate::setup::connect_shm(&name, my_local, pairs.as_ref())
                .unwrap_or_else(|e| Resolved::Unreachable(e.to_string()))
        });
        let cfg = Config {
            eager_limit,
            single_copy: if cma {
                SingleCopy::Cma
            } else {
                SingleCopy::None
            },
            keep_registrations: false,
            cma_split: weft_shm::PathConfig::default().cma_split,
            tcp_eager_limit: DEFAULT_TCP_EAGER_LIMIT,
        };
        let engine = Engine::new(
            me,
            size,
            inbox,
            local,
            cfg,
            resolve,
            Box::new(|_| None),
            None,
            None,
        );
        Fabric::without_wire(engine, me, size)
    }
}

impl Fabric {
    /// A fabric without a wire-up client (tests of the engine within one process).
    fn without_wire(engine: Engine, me: u32, size: u32) -> Fabric {
        Fabric {
            inner: Arc::new(Inner::new(engine, None, me, size, 1, true, None)),
        }
    }

    /// A fabric over a verbs endpoint alone, for tests of the engine with several
    /// endpoints in one process: `cards[r]` is rank r's verbs card.
    #[doc(hidden)]
    pub fn from_verbs(
        me: u32,
        size: u32,
        endpoint: weft_verbs::Endpoint,
        cards: Vec<Option<Vec<u8>>>,
        eager_limit: usize,
    ) -> Fabric {
        let eps = (Some(endpoint), None);
        Self::from_endpoint(me, size, eps, cards, eager_limit, Resolved::VerbsCard)
    }

    /// A fabric over a TCP endpoint alone, for tests of the engine with several
    /// endpoints in one process: `cards[r]` is rank r's TCP card. Messages up to
    /// `eager_limit` bytes go eagerly, larger ones by rendezvous.
    #[doc(hidden)]
    pub fn from_tcp(
        me: u32,
        size: u32,
        endpoint: weft_tcp::Endpoint,
        cards: Vec<Option<Vec<u8>>>,
        eager_limit: usize,
    ) -> Fabric {
        let eps = (None, Some(endpoint));
        Self::from_endpoint(me, size, eps, cards, eager_limit, Resolved::TcpCard)
    }

    /// A fabric over one endpoint (verbs or TCP) whose peers' cards are `cards`, made
    /// into a path by `card`.
    fn from_endpoint(
        me: u32,
        size: u32,
        (verbs, tcp): (Option<weft_verbs::Endpoint>, Option<weft_tcp::Endpoint>),
        cards: Vec<Option<Vec<u8>>>,
        eager_limit: usize,
        card: fn(Vec<u8>) -> Resolved,
    ) -> Fabric {
        let resolve = card_table(cards, card);
        let cfg = Config {
            eager_limit,
            single_copy: SingleCopy::None,
            keep_registrations: false,
            cma_split: 0,
            tcp_eager_limit: eager_limit,
        };
        let gone = Box::new(|_| None);
        let engine = Engine::new(me, size, None, vec![me], cfg, resolve, gone, verbs, tcp);
        Fabric::without_wire(engine, me, size)
    }
}

/// The resolver of a fabric made from explicit pieces: rank r's card is `cards[r]`, made
/// into a path by `path`; a rank without one is unreachable.
fn card_table<C: Clone + Send + 'static>(
    cards: Vec<Option<C>>,
    mut path: impl FnMut(C) -> Resolved + Send + 'static,
) -> Resolver {
    Box::new(
        move |rank: u32| match cards.get(rank as usize).cloned().flatten() {
            Some(c) => path(c),
            None => Resolved::Unreachable("no card".into()),
        },
    )
}

/// A communicator: a group of processes with a context id carried in every message.
#[derive(Clone)]
pub struct Communicator {
    inner: Arc<Inner>,
    ctx: u64,
    rank: u32,
    size: u32,
    /// Communicator rank <-> job rank; `None` for the world (the identity).
    map: Option<Arc<RankMap>>,
    /// What a communicator made from a session group needs for free/disconnect.
    pub(crate) origin: Option<Arc<session::CommOrigin>>,
    /// What every handle of this communicator shares.
    pub(crate) shared: Arc<CommShared>,
}

/// What every handle (clone) of one communicator shares.
#[derive(Debug, Default)]
pub(crate) struct CommShared {
    /// Made by [`Communicator::derive`] (freed locally, no group behind it).
    derived: bool,
    /// A collective library's state for this communicator ([`Communicator::coll_state`]).
    coll: std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>,
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
    fn fix(&self, r: Result<Status, P2pError>) -> Result<Status, P2pError> {
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
    fn fix_err(&self, e: P2pError) -> P2pError {
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
            P2pError::PeerGone { rank, reason } if c(rank) != rank => P2pError::PeerGone {
                rank: c(rank),
                reason: format!("job rank {rank} {reason}"),
            },
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

    fn tag_sel(tag: Tag) -> Option<u32> {
        (tag != Tag::ANY).then_some(tag.0)
    }

    /// Blocks until request `id` completes, failing it if its peer dies.
    fn wait_id(&self, id: u32) -> Result<Status, P2pError> {
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
                let gone = match s {
                    Some(r) if r == self.inner.me => None,
                    Some(r) => e.gone_reason(r).map(|why| (r, why)),
                    None if self.size > 1 => self.all_others_gone(&e),
                    None => None,
                };
                if let Some((rank, reason)) = gone {
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

    /// Runs `f` with a [`Scope`] in which non-blocking operations may borrow buffers.
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
    fn isend_in<'a, T: Pod>(
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
    fn irecv_in<'a, T: Pod>(
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
                if let (Some(r), Some(w)) = (s, &self.inner.wire) {
                    if let Some(reason) = w.gone_reason(r) {
                        if let Some(st) = e.iprobe(self.ctx, s, Self::tag_sel(tag)) {
                            return self.fix(Ok(st));
                        }
                        return self.fix(Err(P2pError::PeerGone { rank: r, reason }));
                    }
                }
            }
        }
    }
}

/// The region of [`Communicator::scope`]: non-blocking operations started here may borrow
/// buffers that outlive the scope, and are all complete when it ends.
pub struct RequestScope<'scope, 'env: 'scope> {
    comm: &'env Communicator,
    /// (id, serial) of every request started here.
    started: RefCell<Vec<(u32, u64)>>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl std::fmt::Debug for RequestScope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestScope")
            .field("started", &self.started.borrow().len())
            .finish()
    }
}

impl<'scope, 'env> RequestScope<'scope, 'env> {
    /// Starts a send of `buf` to `dest`; `buf` stays borrowed until the scope ends.
    pub fn isend<T: Pod>(
        &'scope self,
        buf: &'scope [T],
        dest: u32,
        tag: Tag,
    ) -> Result<Request<'scope>, P2pError> {
        let r = self.comm.isend_in(buf, dest, tag)?;
        if !r.done {
            self.started.borrow_mut().push((r.id, r.serial));
        }
        Ok(r)
    }

    /// Starts a receive into `buf`; `buf` stays borrowed until the scope ends.
    pub fn irecv<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
        src: Source,
        tag: Tag,
    ) -> Result<Request<'scope>, P2pError> {
        let r = self.comm.irecv_in(buf, src, tag)?;
        self.started.borrow_mut().push((r.id, r.serial));
        Ok(r)
    }
}

impl RequestScope<'_, '_> {
    fn complete_all(&self) {
        // Requests that were waited on are gone from the engine; the rest (dropped
        // requests complete in their own Drop, leaked ones here) are cancelled if they are
        // unmatched receives, otherwise waited for.
        // Ids are reused (by other threads' requests, too): the serial tells whether
        // the id still names the request started here.
        let ids = std::mem::take(&mut *self.started.borrow_mut());
        // One lock for the lot; let go only to wait for a request.
        let mut e = self.comm.inner.engine();
        for (id, serial) in ids {
            if e.serial(id) == Some(serial) && !e.cancel_recv(id) {
                drop(e);
                let _ = self.comm.wait_id(id);
                e = self.comm.inner.engine();
            }
        }
    }
}

/// A pending non-blocking operation. Its buffer stays borrowed until it completes.
///
/// Dropping a receive that has not matched cancels it; dropping any other incomplete
/// request waits for it (a peer may still be reading the send buffer).
#[derive(Debug)]
pub struct Request<'a> {
    comm: &'a Communicator,
    id: u32,
    /// The engine's serial of `id` (see [`RequestScope`]).
    serial: u64,
    recv: bool,
    done: bool,
    /// The result, once `test` has seen it (so that a later `wait` returns it).
    result: Option<Result<Status, P2pError>>,
    _buf: PhantomData<&'a mut [u8]>,
}

impl<'a> Request<'a> {
    /// A request the engine holds as `id` (with `serial`), not complete yet.
    fn pending(comm: &'a Communicator, id: u32, serial: u64, recv: bool) -> Request<'a> {
        Request {
            comm,
            id,
            serial,
            recv,
            done: false,
            result: None,
            _buf: PhantomData,
        }
    }
}

impl Request<'_> {
    /// Progresses and returns the result if the operation has completed.
    pub fn test(&mut self) -> Option<Result<Status, P2pError>> {
        if let Some(r) = &self.result {
            return Some(r.clone());
        }
        let mut e = self.comm.inner.engine();
        e.progress();
        let mut r = e.take(self.id);
        if r.is_none() {
            e.fail_if_gone(self.id);
            r = e.take(self.id);
        }
        drop(e);
        let r = r.map(|r| self.comm.fix(r));
        self.done = r.is_some();
        self.result.clone_from(&r);
        r
    }

    /// Waits for the operation to complete.
    pub fn wait(mut self) -> Result<Status, P2pError> {
        if let Some(r) = self.result.take() {
            return r;
        }
        self.done = true;
        self.comm.fix(self.comm.wait_id(self.id))
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.recv && self.comm.inner.engine().cancel_recv(self.id) {
            return;
        }
        let _ = self.comm.wait_id(self.id);
    }
}

/// Waits for every request; returns their statuses in order, or the first error.
pub fn wait_all(reqs: Vec<Request<'_>>) -> Result<Vec<Status>, P2pError> {
    let mut out = Vec::with_capacity(reqs.len());
    let mut first_err = None;
    for r in reqs {
        match r.wait() {
            Ok(s) => out.push(s),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        None => Ok(out),
        Some(e) => Err(e),
    }
}

/// Waits until one of the requests completes; removes it and returns its index and result.
/// Panics if `reqs` is empty.
pub fn wait_any(reqs: &mut Vec<Request<'_>>) -> (usize, Result<Status, P2pError>) {
    assert!(!reqs.is_empty(), "wait_any on no requests");
    let mut backoff = Backoff::default();
    loop {
        for i in 0..reqs.len() {
            if let Some(r) = reqs[i].test() {
                let req = reqs.remove(i);
                drop(req);
                return (i, r);
            }
        }
        backoff.snooze();
    }
}
