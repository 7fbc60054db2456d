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
// A build with neither TCP nor verbs (shm alone) has no connection to a peer: the
// engine's connection handling (backlogs drained, connections failed, bulk transfers)
// is then unused. Every other build checks it.
#![cfg_attr(not(any(feature = "tcp", feature = "verbs")), allow(dead_code))]

mod backoff;
mod communicator;
mod engine;
mod error;
mod intercomm;
mod lock;
mod message;
mod path;
mod pod;
mod request;
pub use lock::{Guard as SpinGuard, SpinLock};
pub mod sched;
mod session;
mod setup;

pub use session::{
    CommError, ErrHandler, Group, GroupCompare, Info, PsetInfo, Session, SessionError, ThreadLevel,
    MPI_PSET_SELF, MPI_PSET_WORLD, PROVIDED_THREAD_LEVEL,
};

pub use communicator::Communicator;
pub(crate) use communicator::{CommShared, RankMap};
pub use error::{InitError, P2pError};
pub use intercomm::{InterComm, InterCommError, Port};
pub use message::{Source, Status, Tag};
pub(crate) use pod::{bytes_of, bytes_of_mut};
pub use pod::{Loc, Pod};
pub use request::{wait_all, wait_any, Request, RequestScope};

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

pub use backoff::spin_limit;
pub(crate) use backoff::{note_oversubscription, Backoff};
use engine::{Config, Engine, Resolved, Resolver, SingleCopy};
use lock::Guard;
use setup::DEFAULT_TCP_EAGER_LIMIT;
pub use setup::{SHM_CARD_KEY, TCP_CARD_KEY, TUNABLES, VERBS_CARD_KEY};
use weft_shm::Inbox;
use weft_wireup::Client;

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
    /// The processes of an engine over a connect (`intercomm`), by engine rank: errors
    /// name them instead of job ranks. `None` for the world's engine.
    procs: Option<Arc<[weft_wireup::ProcId]>>,
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
            procs: None,
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
        if check {
            progress_others(self);
        }
        (self.engine(), check)
    }
}

/// Every engine of this process (the world's, each intercommunicator's), so that a thread
/// waiting on one progresses the others: a peer's TCP or verbs handshake, or a rendezvous
/// it started, is answered even while this process waits elsewhere.
static ENGINES: Mutex<Vec<std::sync::Weak<Inner>>> = Mutex::new(Vec::new());
/// How many engines `ENGINES` holds (a wait checks it before taking the lock).
static ENGINE_COUNT: AtomicU32 = AtomicU32::new(0);

/// Adds `inner` to the engines every wait progresses.
pub(crate) fn register_engine(inner: &Arc<Inner>) {
    let mut list = ENGINES.lock().unwrap_or_else(PoisonError::into_inner);
    list.retain(|w| w.strong_count() > 0);
    list.push(Arc::downgrade(inner));
    // SYNC: a hint read by `progress_others`; the list itself is under the lock.
    ENGINE_COUNT.store(list.len() as u32, Ordering::Relaxed);
}

/// Progresses every registered engine but `except` that no other thread holds. Called by
/// a wait when it checks for dead peers (after its spinning), and by wire-up waits.
#[cold]
fn progress_others(except: *const Inner) {
    // SYNC: a hint (see `register_engine`): with one engine there is no other.
    if ENGINE_COUNT.load(Ordering::Relaxed) < 2 {
        return;
    }
    let others: Vec<Arc<Inner>> = match ENGINES.try_lock() {
        Ok(list) => list.iter().filter_map(std::sync::Weak::upgrade).collect(),
        Err(_) => return,
    };
    for inner in others {
        if std::ptr::eq(Arc::as_ptr(&inner), except) {
            continue;
        }
        if let Some(mut e) = inner.engine.try_lock() {
            e.progress();
        }
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
            // So does every intercommunicator's engine (`progress_others`).
            let weak = Arc::downgrade(&inner);
            w.set_progress_hook(move || {
                if let Some(inner) = weak.upgrade() {
                    if let Some(mut e) = inner.engine.try_lock() {
                        e.progress();
                    }
                }
                progress_others(std::ptr::null());
            });
        }
        register_engine(&inner);
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
        // Intercommunicators not disconnected: what they buffered goes out too.
        let engines: Vec<Arc<Inner>> = ENGINES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        loop {
            let mut others = 0;
            for inner in &engines {
                if !Arc::ptr_eq(inner, &self.inner) {
                    let mut e = inner.engine();
                    e.progress();
                    others += e.backlog();
                }
            }
            let mut e = self.inner.engine();
            e.progress();
            if e.backlog() + others == 0 {
                break;
            }
            if Instant::now() > deadline {
                tracing::error!(
                    "finalize: {} frames (of which {others} of intercommunicators) could not \
                     be delivered within {wait:?} (peers not receiving? WEFT_FINALIZE_TIMEOUT \
                     sets the wait)",
                    e.backlog() + others
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
    #[cfg(feature = "verbs")]
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
    #[cfg(feature = "tcp")]
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
        (verbs, tcp): (Option<engine::VerbsEndpoint>, Option<engine::TcpEndpoint>),
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
