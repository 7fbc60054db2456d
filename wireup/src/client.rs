//! The wire-up client: one per process, connected to its node's server.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weft_shm::StoreReader;

pub(crate) use crate::conn::lock;
pub(crate) use crate::conn::ConnError;
use crate::conn::{self, Conn, Progress};
use crate::job::{JobInfo, NodeNet};
use crate::proto::{ClientMsg, CollId, CollKind, FenceMode, Procs, ServerMsg, WireError};
use crate::value::{Scope, Value};
use crate::{env, NsId, ProcId, Rank};

/// Largest key accepted by `put`.
pub(crate) const MAX_KEY: usize = 1024;
/// Largest value accepted by `put`.
pub(crate) const MAX_VALUE: usize = 16 << 20;

/// How long finalize waits for the server's acknowledgement.
const FINALIZE_TIMEOUT: Duration = Duration::from_secs(5);

/// Keys of the node datastore (shared with the server).
pub mod keys {
    use crate::Rank;
    /// A process's value for `key`.
    pub fn data(rank: Rank, key: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(5 + key.len());
        k.push(0);
        k.extend_from_slice(&rank.to_le_bytes());
        k.extend_from_slice(key.as_bytes());
        k
    }
    /// Calls `f` with the key of [`data`], built on the stack when it is short (the
    /// client's `get` path: no allocation for a lookup in shared memory).
    #[inline]
    pub fn with_data<R>(rank: Rank, key: &str, f: impl FnOnce(&[u8]) -> R) -> R {
        let mut buf = [0u8; 128];
        let n = 5 + key.len();
        if n > buf.len() {
            return f(&data(rank, key));
        }
        buf[1..5].copy_from_slice(&rank.to_le_bytes());
        buf[5..n].copy_from_slice(key.as_bytes());
        f(&buf[..n])
    }
    /// For a rank of another node whose data this node holds: the generation of that copy
    /// and the one its owner reached as of the last fence (`marker::encode_marker`).
    pub fn complete(rank: Rank) -> [u8; 5] {
        let r = rank.to_le_bytes();
        [1, r[0], r[1], r[2], r[3]]
    }
    /// Present (holding the reason) once `rank` has died or finalized.
    pub fn gone(rank: Rank) -> [u8; 5] {
        let r = rank.to_le_bytes();
        [3, r[0], r[1], r[2], r[3]]
    }
    /// Present (holding the reason) once process `p` of a job connected with this one
    /// (`Client::connect`) has died or finalized.
    pub fn gone_proc(p: crate::ProcId) -> [u8; 9] {
        let (n, r) = (p.ns.0.to_le_bytes(), p.rank.to_le_bytes());
        [9, n[0], n[1], n[2], n[3], r[0], r[1], r[2], r[3]]
    }
    /// The job's [`crate::JobInfo`].
    pub const JOB_INFO: &[u8] = &[2];
    /// The names of the process sets defined while the job runs (postcard `Vec<String>`).
    pub const RUNTIME_PSETS: &[u8] = &[4];
    /// The node's [`crate::job::NodeNet`] (postcard).
    pub const NODE_NET: &[u8] = &[6];
    /// The members of runtime process set `name` (postcard `Option<Vec<Rank>>`; `None`
    /// once deleted).
    pub fn pset(name: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(1 + name.len());
        k.push(5);
        k.extend_from_slice(name.as_bytes());
        k
    }
}

mod backend;
mod errors;
mod handshake;
pub(crate) use backend::Backend;
#[cfg(feature = "pmix")]
use backend::NOT_UNDER_PMIX;
use backend::{backend, Choice};
pub use backend::{backend_choice, in_a_job};
pub use errors::{CommitError, FenceError, FinalizeError, GetError, InitError};

/// Where the process stands with its server: never connected, connected, finalized.
static PROCESS_STATE: AtomicU8 = AtomicU8::new(NEVER_CONNECTED);
const NEVER_CONNECTED: u8 = 0;
const CONNECTED: u8 = 1;
const FINALIZED: u8 = 2;

/// The process's shared client ([`Client::shared`]).
static SHARED: Mutex<Option<Arc<Client>>> = Mutex::new(None);

/// Options of [`Client::get`].
///
/// By default a get waits until the owner commits the key (direct modex: the owner's
/// server answers when the key appears), and ends early only when the owner can no
/// longer commit it: `NotFound` once it has finalized, `ProcGone` once it has died.
/// Set a timeout to bound the wait (`Timeout` names the key and the rank).
#[derive(Debug, Clone, Copy, Default)]
pub struct GetOpts {
    /// Give up after this long (the default waits until the owner commits or ends).
    pub timeout: Option<Duration>,
    /// Never ask another node: a key of another node's rank not already on this node is
    /// `NotFound`, even when the copy here predates the last fence.
    pub local_only: bool,
    /// Ignore what is on the node and re-fetch (sees a value re-published without a
    /// fence in between; after a fence a plain get already sees it).
    pub refresh: bool,
    /// Do not wait: a key the owner has not committed yet is `NotFound` (PMIx's
    /// `PMIX_IMMEDIATE`, as far as the owner's server goes).
    pub immediate: bool,
}

impl GetOpts {
    /// Sets the timeout.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }
    /// Sets local-only.
    pub fn local_only(mut self) -> Self {
        self.local_only = true;
        self
    }
    /// Sets refresh.
    pub fn refresh(mut self) -> Self {
        self.refresh = true;
        self
    }
    /// Sets immediate.
    pub fn immediate(mut self) -> Self {
        self.immediate = true;
        self
    }
}

pub(crate) fn ms(d: Option<Duration>) -> Option<u64> {
    d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A process's connection to the wire-up service.
///
/// `Client` is `Send + Sync`: several threads may fence, get and commit concurrently.
#[derive(Debug)]
pub struct Client {
    rank: Rank,
    /// This process's namespace id (its job's).
    ns: NsId,
    /// The process that spawned this job (only known natively).
    parent: Option<ProcId>,
    node: u32,
    job: JobInfo,
    local_peers: Vec<Rank>,
    /// The wire-up service: Weft's servers or the host's PMIx server.
    backend: Backend,
    /// What a call runs while it waits for the service (see [`Client::set_progress_hook`]).
    progress: Arc<Progress>,
    pending: Mutex<Vec<(Scope, String, Value)>>,
    /// Commits since the last fence, and copies delivered by fences outside the servers.
    pub(crate) handoff: crate::handoff::Handoff,
    seqs: Mutex<HashMap<(CollKind, Procs, String), u64>>,
    /// The groups this process constructed and has not destructed, by id.
    pub(crate) my_groups: Mutex<HashMap<String, crate::GroupInfo>>,
    /// Event handlers and events cached for handlers not registered yet.
    pub(crate) events: Mutex<crate::event::Registry>,
    /// Events read but not dispatched yet (their handlers' registry was busy).
    pub(crate) deferred_events: Mutex<Vec<crate::Event>>,
    finalized: AtomicBool,
}

fn env_var(var: &'static str) -> Result<String, InitError> {
    std::env::var(var).map_err(|_| InitError::MissingEnv { var })
}

fn env_num<T: std::str::FromStr>(var: &'static str) -> Result<T, InitError>
where
    T::Err: std::fmt::Display,
{
    let value = env_var(var)?;
    value.parse().map_err(|e: T::Err| InitError::BadEnv {
        var,
        value,
        reason: e.to_string(),
    })
}

/// The prefix of the shared-memory segments of job `nspace`'s processes on `node` (see
/// [`Client::segment_prefix`]); a process's inbox is this followed by `r{rank}`.
pub(crate) fn segment_prefix_of(nspace: &str, node: u32) -> String {
    let job_id = nspace.strip_prefix("weft-").unwrap_or(nspace);
    format!("/weft-{job_id}-n{node}-")
}

impl Client {
    /// Connects to the node's server using the environment `weft run` sets, checks the
    /// protocol version, and maps the node's datastore (job info is then available).
    ///
    /// A process has one connection: a second `init` (also after a `Session` or
    /// `Fabric` connected the process, or after finalize) is an error that says so. Code
    /// that may share the process with other users of Weft calls [`Client::shared`].
    pub fn init() -> Result<Client, InitError> {
        // SYNC: a flag only; the connection itself is published through `SHARED`'s lock.
        match PROCESS_STATE.compare_exchange(
            NEVER_CONNECTED,
            CONNECTED,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {}
            Err(FINALIZED) => return Err(InitError::Finalized),
            Err(_) => return Err(InitError::AlreadyConnected),
        }
        let c = Self::open();
        if c.is_err() {
            PROCESS_STATE.store(NEVER_CONNECTED, Ordering::Release);
        }
        c
    }

    /// The process's one client, shared: made by the first call (as [`Client::init`]),
    /// handed out again by later ones. The fabric, every `Session` and any other code of
    /// the process reach the same connection this way.
    pub fn shared() -> Result<Arc<Client>, InitError> {
        let mut shared = lock(&SHARED);
        if let Some(c) = shared.as_ref() {
            if c.is_finalized() {
                return Err(InitError::Finalized);
            }
            return Ok(c.clone());
        }
        let c = Arc::new(Client::init()?);
        *shared = Some(c.clone());
        Ok(c)
    }

    /// Finalizes the process's shared client ([`Client::shared`]), if there is one, as the
    /// process ends (see [`Client::finalize_at_exit`]): for an `atexit` handler, so it
    /// never blocks on a thread that holds the shared client's lock.
    pub fn finalize_shared_at_exit() {
        if let Ok(shared) = SHARED.try_lock() {
            if let Some(c) = shared.as_ref() {
                if let Err(e) = c.finalize_at_exit() {
                    tracing::debug!("finalize at exit: {e}");
                }
            }
        }
    }

    /// Runs `hook` about every millisecond while a call of this client waits for the
    /// server (a fence, a get, a group operation). A transport that must answer its peers
    /// (a connection handshake, a rendezvous) installs its progress here, so that a
    /// process blocked in wire-up never stalls a peer that waits for it. Only the first
    /// hook is kept: returns false when one was already installed. The hook must not
    /// block; it runs on the waiting thread, which may be inside the transport already
    /// (take its locks with a try-lock).
    pub fn set_progress_hook(&self, hook: impl Fn() + Send + Sync + 'static) -> bool {
        if !self.progress.set(Box::new(hook)) {
            return false;
        }
        match &self.backend {
            Backend::Native { conn, .. } => conn.shorten_reads(),
            #[cfg(feature = "pmix")]
            Backend::Pmix(_) => {}
        }
        true
    }

    /// Whether this client was finalized (explicitly, at exit or by a drop).
    pub fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    fn open() -> Result<Client, InitError> {
        if backend()? == Choice::Pmix {
            return Self::connect_pmix();
        }
        Self::connect_weft()
    }

    /// Under a host engine's PMIx server (see `crate::pmix`).
    #[cfg(feature = "pmix")]
    fn connect_pmix() -> Result<Client, InitError> {
        let (rank, job, link) = crate::pmix::connect()?;
        let node = job.node_of(rank).ok_or_else(|| InitError::Pmix {
            reason: format!("rank {rank} is not in the job (size {})", job.size()),
        })?;
        // The host's names are strings; the own job is the first this process knows.
        Ok(Client::assemble(
            rank,
            NsId::FIRST,
            node,
            job,
            Backend::Pmix(link),
            Arc::default(),
        ))
    }

    /// Under a host engine's PMIx server, in a build without the PMIx backend: the
    /// error a build without libpmix gives.
    #[cfg(not(feature = "pmix"))]
    fn connect_pmix() -> Result<Client, InitError> {
        Err(InitError::Pmix {
            reason: "connecting to the host's PMIx server: the PMIx client is unavailable: \
                     built without libpmix (the `pmix` feature of weft-wireup is off): enable \
                     it, install libpmix-dev and rebuild"
                .into(),
        })
    }

    /// A client of `rank` on `node` over `backend`, whose waits run `progress`; the rest
    /// starts empty.
    fn assemble(
        rank: Rank,
        ns: NsId,
        node: u32,
        job: JobInfo,
        backend: Backend,
        progress: Arc<Progress>,
    ) -> Client {
        Client {
            rank,
            ns,
            parent: None,
            node,
            local_peers: job.ranks_on(node),
            job,
            backend,
            progress,
            pending: Mutex::new(Vec::new()),
            handoff: crate::handoff::Handoff::default(),
            seqs: Mutex::new(HashMap::new()),
            my_groups: Mutex::new(HashMap::new()),
            events: Mutex::new(crate::event::Registry::default()),
            deferred_events: Mutex::new(Vec::new()),
            finalized: AtomicBool::new(false),
        }
    }

    fn connect_weft() -> Result<Client, InitError> {
        let rank: Rank = env_num(env::RANK)?;
        let token: u64 = env_num(env::TOKEN)?;
        let ns = match env_num::<u32>(env::NSID)? {
            0 => {
                return Err(InitError::BadEnv {
                    var: env::NSID,
                    value: "0".into(),
                    reason: "0 names no namespace".into(),
                })
            }
            n => NsId(n),
        };
        let path = PathBuf::from(env_var(env::SERVER_SOCKET)?);
        let stream = UnixStream::connect(&path).map_err(|source| InitError::Connect {
            path: path.clone(),
            source,
        })?;
        let hs = |reason: String| InitError::Handshake {
            path: path.clone(),
            reason,
        };
        let mut s = stream;
        let (datastore, parent) = handshake::hello(&mut s, ProcId::new(ns, rank), token, hs)?;
        let store = StoreReader::open(&datastore)?;
        let job_bytes = store
            .get(keys::JOB_INFO)
            .ok_or_else(|| hs(format!("datastore {datastore} holds no job info")))?;
        let job: JobInfo = postcard::from_bytes(job_bytes)
            .map_err(|e| hs(format!("job info in {datastore} is corrupt: {e}")))?;
        let node = job.node_of(rank).ok_or_else(|| {
            hs(format!(
                "rank {rank} is not in the job (size {})",
                job.size()
            ))
        })?;
        // Absent only under a server that predates it: transports then choose alone.
        let net = store
            .get(keys::NODE_NET)
            .and_then(|b| postcard::from_bytes::<NodeNet>(b).ok());
        let reader = s.try_clone().map_err(|e| hs(e.to_string()))?;
        // Reads return every READ_SLICE so that callers can check their own deadlines.
        reader
            .set_read_timeout(Some(conn::READ_SLICE))
            .map_err(|e| hs(e.to_string()))?;
        let server_pid = std::env::var(env::SERVER_PID)
            .ok()
            .and_then(|p| p.parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
            .filter(|&p| rustix::process::getppid() == Some(p));
        let progress = Arc::<Progress>::default();
        let conn = Conn::new(s, reader, Arc::clone(&progress));
        let mut client = Client::assemble(
            rank,
            ns,
            node,
            job,
            Backend::Native {
                conn,
                store,
                net,
                server_pid,
            },
            progress,
        );
        client.parent = parent;
        Ok(client)
    }

    /// This process's rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }
    /// This process's namespace id: its job's, as its runtime numbers jobs (the first job
    /// under a PMIx host, whose names are strings: see [`nspace`](Self::nspace)).
    pub fn ns(&self) -> NsId {
        self.ns
    }
    /// This process: its namespace id and rank.
    pub fn me(&self) -> ProcId {
        ProcId::new(self.ns, self.rank)
    }
    /// The process that spawned this job ([`Client::spawn`] or `PMIx_Spawn`), `None` for
    /// a job started by `weft run` or submitted to a runtime. Under a PMIx host (such as
    /// `mpirun`) it is not known here: `None`.
    pub fn parent(&self) -> Option<ProcId> {
        self.parent
    }
    /// The job's size.
    pub fn size(&self) -> u32 {
        self.job.size()
    }
    /// The job's namespace.
    pub fn nspace(&self) -> &str {
        &self.job.nspace
    }
    /// Everything known about the job at launch.
    pub fn job(&self) -> &JobInfo {
        &self.job
    }
    /// The address this node's wire-up server uses to reach the other nodes (the
    /// interface toward the launcher): where a transport that listens for peers on other
    /// nodes listens by default.
    pub fn node_addr(&self) -> Option<std::net::IpAddr> {
        match &self.backend {
            Backend::Native { net, .. } => net.as_ref().map(|n| n.addr),
            #[cfg(feature = "pmix")]
            Backend::Pmix(px) => px.node_addr(),
        }
    }
    /// Whether Weft's own servers serve this process (`weft run`), rather than a host's
    /// PMIx server (such as `mpirun`'s): spawning, connecting and runtime control need them.
    pub fn is_native(&self) -> bool {
        matches!(self.backend, Backend::Native { .. })
    }
    /// A secret shared by the job's processes and no one else (derived by each node's
    /// server from the launcher's job secret), for transports to authenticate the
    /// connections between them.
    pub fn transport_secret(&self) -> Option<[u64; 2]> {
        match &self.backend {
            Backend::Native { net, .. } => net.as_ref().map(|n| n.transport_secret),
            #[cfg(feature = "pmix")]
            Backend::Pmix(px) => px.transport_secret(),
        }
    }
    /// This process's node id.
    pub fn node(&self) -> u32 {
        self.node
    }
    /// This node's hostname label.
    pub fn hostname(&self) -> &str {
        &self.job.nodes[self.node as usize].hostname
    }
    /// Rank among the processes of this node.
    pub fn local_rank(&self) -> u32 {
        self.job.procs[self.rank as usize].local_rank
    }
    /// Number of processes on this node.
    pub fn local_size(&self) -> u32 {
        self.local_peers.len() as u32
    }
    /// The ranks on this node (this one included), ascending.
    pub fn local_peers(&self) -> &[Rank] {
        &self.local_peers
    }
    /// This process's app number.
    pub fn app_num(&self) -> u32 {
        self.job.procs[self.rank as usize].app
    }
    /// Names of all process sets visible to this process: the launch ones, then those
    /// defined while the job runs.
    pub fn pset_names(&self) -> Vec<String> {
        let mut names = self.job.pset_names();
        if let Some(b) = self.store().and_then(|s| s.get(keys::RUNTIME_PSETS)) {
            names.extend(postcard::from_bytes::<Vec<String>>(b).unwrap_or_default());
        }
        names
    }
    /// Members of process set `name` (a launch set, or one defined while the job runs).
    pub fn pset_members(&self, name: &str) -> Option<Vec<Rank>> {
        self.job.pset_members(name, self.rank).or_else(|| {
            let b = self.store()?.get(&keys::pset(name))?;
            postcard::from_bytes::<Option<Vec<Rank>>>(b).ok().flatten()
        })
    }
    /// The process sets `rank` belongs to.
    pub fn psets_of(&self, rank: Rank) -> Vec<String> {
        self.job.psets_of(rank, self.rank)
    }

    /// Why `rank` is gone (died or finalized), if its death has reached this node. A lookup
    /// in the node's shared memory: cheap enough for a transport's wait loop.
    pub fn gone_reason(&self, rank: Rank) -> Option<String> {
        match &self.backend {
            Backend::Native { store, .. } => store
                .get(&keys::gone(rank))
                .map(|b| String::from_utf8_lossy(b).into_owned()),
            // Under a PMIx host: what its termination events said.
            #[cfg(feature = "pmix")]
            Backend::Pmix(px) => px.gone(rank),
        }
    }

    /// Why `rank` cannot be reached, if it cannot: it is gone ([`gone_reason`]), or this
    /// node's server is lost ([`server_lost`]: then no peer's end would ever be told here).
    /// What a wait on a peer checks.
    ///
    /// [`gone_reason`]: Self::gone_reason
    /// [`server_lost`]: Self::server_lost
    pub fn unreachable(&self, rank: Rank) -> Option<String> {
        self.gone_reason(rank).or_else(|| self.server_lost())
    }

    /// Why this node's server is lost, if it is: it died (this process's parent changed)
    /// or the connection to it broke. Then every peer is unreachable: the fabric fails
    /// what waits on them with this reason. One system call (getppid).
    pub fn server_lost(&self) -> Option<String> {
        match &self.backend {
            Backend::Native {
                conn, server_pid, ..
            } => {
                if let Some(pid) = *server_pid {
                    if rustix::process::getppid() != Some(pid) {
                        return Some(format!(
                            "is unreachable: the weft server of node {} (pid {}) is gone",
                            self.node,
                            pid.as_raw_nonzero()
                        ));
                    }
                }
                conn.broken().map(|why| {
                    format!(
                        "is unreachable: the connection to the weft server of node {} broke ({why})",
                        self.node
                    )
                })
            }
            #[cfg(feature = "pmix")]
            Backend::Pmix(px) => px.lost(),
        }
    }

    /// The name prefix this process's shared-memory segments must use, so that its server
    /// removes them when the job ends (normally or not).
    pub fn segment_prefix(&self) -> String {
        segment_prefix_of(&self.job.nspace, self.node)
    }

    /// Stages `key = value` with `scope`; it becomes visible after [`Client::commit`].
    pub fn put(&self, scope: Scope, key: &str, value: impl Into<Value>) -> Result<(), CommitError> {
        if key.is_empty() || key.len() > MAX_KEY {
            return Err(CommitError::InvalidKey {
                key: key.chars().take(64).collect(),
                reason: if key.is_empty() {
                    "empty"
                } else {
                    "longer than 1024 bytes"
                },
            });
        }
        let value = value.into();
        let len = match &value {
            Value::Bytes(b) => b.len(),
            Value::Str(s) => s.len(),
            _ => 8,
        };
        if len > MAX_VALUE {
            return Err(CommitError::TooLarge {
                key: key.to_owned(),
                len,
                max: MAX_VALUE,
            });
        }
        let mut p = lock(&self.pending);
        p.retain(|(_, k, _)| k != key);
        p.push((scope, key.to_owned(), value));
        Ok(())
    }

    /// Sends the staged values to the server; on-node readers see Local/Global keys at
    /// once, other nodes after a fence (Full) or on demand (Sparse).
    pub fn commit(&self) -> Result<(), CommitError> {
        let entries = std::mem::take(&mut *lock(&self.pending));
        self.handoff.record(&entries);
        match &self.backend {
            // No reply is awaited: the server handles a connection's frames in order, so
            // any fence or get sent after this sees the data, and a commit cannot fail on
            // a healthy connection (keys and sizes were checked by `put`).
            Backend::Native { conn, .. } => {
                conn.send("commit", &ClientMsg::Commit { entries })?;
                Ok(())
            }
            #[cfg(feature = "pmix")]
            Backend::Pmix(px) => px.commit(&entries),
        }
    }

    /// Waits until every process of `procs` has called `fence` with the same `procs`
    /// (and, in Full mode, until their committed data is on this node).
    pub fn fence(
        &self,
        procs: Procs,
        mode: FenceMode,
        timeout: Option<Duration>,
    ) -> Result<(), FenceError> {
        let size = self.size();
        let procs = procs.normalize(size);
        if let Procs::List(v) = &procs {
            if let Some(bad) = v.iter().find(|&&r| r >= size) {
                return Err(FenceError::Invalid {
                    reason: format!("rank {bad} is not in the job (size {size})"),
                });
            }
            if !v.contains(&self.rank) {
                return Err(FenceError::Invalid {
                    reason: format!(
                        "the caller (rank {}) is not among the participants",
                        self.rank
                    ),
                });
            }
        }
        let conn = match &self.backend {
            Backend::Native { conn, .. } => conn,
            #[cfg(feature = "pmix")]
            Backend::Pmix(px) => {
                px.fence(&procs, mode, timeout, || self.progress.run())?;
                self.handoff.server_fence(&procs);
                return Ok(());
            }
        };
        let id = self.coll_id(CollKind::Fence, procs.clone(), "");
        let timeout_ms = ms(timeout);
        let reply = conn.call(
            "fence",
            |req| ClientMsg::Fence {
                req,
                id,
                mode,
                timeout_ms,
            },
            timeout,
        );
        self.dispatch_events();
        match reply? {
            ServerMsg::Done { .. } => {
                self.handoff.server_fence(&procs);
                Ok(())
            }
            ServerMsg::Failed { error, .. } => Err(match error {
                WireError::Timeout { missing, .. } => FenceError::Timeout { missing },
                WireError::ProcGone { rank, reason, .. } => FenceError::ProcGone { rank, reason },
                WireError::Aborted { reason, .. } => FenceError::Aborted { reason },
                WireError::Invalid { reason, .. } => FenceError::Invalid { reason },
            }),
            other => Err(FenceError::Invalid {
                reason: format!("unexpected reply {other:?}"),
            }),
        }
    }

    /// The next collective id of `kind` over `procs` (and group `name`): every
    /// participant counts its own calls, so theirs agree.
    pub(crate) fn coll_id(&self, kind: CollKind, procs: Procs, name: &str) -> CollId {
        let seq = {
            let mut seqs = lock(&self.seqs);
            let s = seqs
                .entry((kind, procs.clone(), name.to_owned()))
                .or_insert(0);
            *s += 1;
            *s
        };
        CollId {
            kind,
            procs,
            seq,
            name: name.to_owned(),
        }
    }

    /// Under a host engine's PMIx server: what it offers Weft and what it lacks, one
    /// line each (`weft info` prints them); `None` under `weft run`.
    pub fn host_report(&self) -> Option<Vec<String>> {
        match &self.backend {
            Backend::Native { .. } => None,
            #[cfg(feature = "pmix")]
            Backend::Pmix(px) => Some(px.report()),
        }
    }

    /// The wire-up service this client uses.
    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Runs the progress hook, if one is installed (for waits outside the connection to
    /// a Weft server: calls into the host's PMIx server).
    #[cfg(feature = "pmix")]
    pub(crate) fn run_progress(&self) {
        self.progress.run();
    }

    /// The connection to the node's Weft server, for request `op`; under a PMIx host, the
    /// error saying that `op` needs one.
    pub(crate) fn server(
        &self,
        #[cfg_attr(not(feature = "pmix"), expect(unused_variables))] op: &'static str,
    ) -> Result<&Conn, ConnError> {
        match &self.backend {
            Backend::Native { conn, .. } => Ok(conn),
            #[cfg(feature = "pmix")]
            Backend::Pmix(_) => Err(ConnError::no_server(op, NOT_UNDER_PMIX)),
        }
    }

    /// The node's datastore (Weft's servers only).
    fn store(&self) -> Option<&StoreReader> {
        match &self.backend {
            Backend::Native { store, .. } => Some(store),
            #[cfg(feature = "pmix")]
            Backend::Pmix(_) => None,
        }
    }

    /// Reads `key` of `rank`: from this node's datastore when it is there (no message to
    /// the server), else from the server, which waits for the owner to commit it (on
    /// another node, its server answers when the key appears). See [`GetOpts`].
    ///
    /// After a fence that the owner joined after committing, a get sees everything it
    /// committed before the fence, in every fence mode: the fence tells this node which
    /// copies of other nodes' data it holds are older, and the next get fetches them.
    pub fn get(&self, rank: Rank, key: &str, opts: GetOpts) -> Result<Value, GetError> {
        let size = self.size();
        if rank >= size {
            return Err(GetError::InvalidRank { rank, size });
        }
        if !opts.refresh {
            if let Some(v) = self.handoff.get(rank, key) {
                return Ok(v);
            }
        }
        let (conn, store) = match &self.backend {
            Backend::Native { conn, store, .. } => (conn, store),
            #[cfg(feature = "pmix")]
            Backend::Pmix(px) => return px.get(rank, key, opts, &mut || self.progress.run()),
        };
        let on_node = self.job.procs[rank as usize].node == self.node;
        if !opts.refresh && !store.overflowed() {
            // A copy of another node's rank is used only while it is as new as the owner
            // was at the last fence (or for a local-only get, whatever is here).
            let usable = on_node
                || opts.local_only
                || store
                    .get(&keys::complete(rank))
                    .and_then(crate::marker::marker_fresh)
                    .unwrap_or(false);
            if usable {
                let found = keys::with_data(rank, key, |k| {
                    store.get(k).map(|bytes| {
                        postcard::from_bytes(bytes).map_err(|e| GetError::Corrupt {
                            rank,
                            key: key.to_owned(),
                            reason: e.to_string(),
                        })
                    })
                });
                if let Some(r) = found {
                    return r;
                }
            }
            if opts.local_only && !on_node {
                return Err(GetError::NotFound {
                    rank,
                    key: key.to_owned(),
                    reason: crate::marker::local_only_reason(self.job.procs[rank as usize].node),
                });
            }
        }
        self.get_from_server(conn, ProcId::new(self.ns, rank), key, opts)
    }

    /// A get of `key` of `proc` answered by the server.
    pub(crate) fn get_from_server(
        &self,
        conn: &Conn,
        proc: ProcId,
        key: &str,
        opts: GetOpts,
    ) -> Result<Value, GetError> {
        let rank = proc.rank;
        let key_s = key.to_owned();
        let msg = |req| ClientMsg::Get {
            req,
            proc,
            key: key_s,
            refresh: opts.refresh,
            local_only: opts.local_only,
            immediate: opts.immediate,
            timeout_ms: ms(opts.timeout),
        };
        match conn.call("get", msg, opts.timeout)? {
            ServerMsg::Value { value, .. } => Ok(value),
            ServerMsg::Missing { reason, .. } => Err(GetError::NotFound {
                rank,
                key: key.to_owned(),
                reason,
            }),
            ServerMsg::Failed { error, .. } => Err(match error {
                WireError::Timeout { missing, .. } => GetError::Timeout {
                    rank,
                    key: key.to_owned(),
                    missing,
                },
                WireError::ProcGone { reason, .. } => GetError::ProcGone {
                    rank,
                    key: key.to_owned(),
                    reason,
                },
                WireError::Aborted { reason, .. } | WireError::Invalid { reason, .. } => {
                    GetError::Failed {
                        rank,
                        key: key.to_owned(),
                        reason,
                    }
                }
            }),
            other => Err(GetError::Failed {
                rank,
                key: key.to_owned(),
                reason: format!("unexpected reply {other:?}"),
            }),
        }
    }

    /// Tells the server this process is done with the wire-up service. Fences that
    /// include this process afterwards fail at once instead of waiting for it; its
    /// committed data stays available to the others.
    pub fn finalize(self) -> Result<(), FinalizeError> {
        self.finalize_inner(false)
    }

    /// Finalizes through a shared reference (for owners that hold the client in an `Arc`,
    /// like the fabric); later calls do nothing.
    pub fn finalize_shared(&self) -> Result<(), FinalizeError> {
        self.finalize_inner(false)
    }

    /// Finalizes as the process ends (an `atexit` handler; dropping a client does the
    /// same): the server then reports the process's end to the others by its exit
    /// status ("exited with code 3", "was killed by signal 6 (SIGABRT)"), or as
    /// finalized when it exits with 0 or keeps running without the connection. Later
    /// calls do nothing.
    pub fn finalize_at_exit(&self) -> Result<(), FinalizeError> {
        self.finalize_inner(true)
    }

    fn finalize_inner(&self, at_exit: bool) -> Result<(), FinalizeError> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        PROCESS_STATE.store(FINALIZED, Ordering::Release);
        match &self.backend {
            Backend::Native { conn, .. } => {
                conn.call(
                    "finalize",
                    |req| ClientMsg::Finalize { req, at_exit },
                    Some(FINALIZE_TIMEOUT),
                )?;
                Ok(())
            }
            #[cfg(feature = "pmix")]
            Backend::Pmix(px) => {
                // No server removes this process's shared-memory inbox (the fabric's,
                // named by `segment_prefix`) when the job ends: its name goes now; peers
                // that mapped it keep the memory. (A crash still leaves it behind.)
                let inbox = format!("{}r{}", self.segment_prefix(), self.rank);
                if let Err(e) = weft_shm::unlink(&inbox) {
                    tracing::debug!("finalize: removing {inbox}: {e}");
                }
                px.finalize()
                    .map_err(|reason| FinalizeError::Pmix { reason })
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // A drop is no explicit finalize: it happens on every way out of a scope, errors
        // and panics included. The server reports the process's end by its exit status
        // (finalized when it exits with 0, or when it lives on without the connection).
        if let Err(e) = self.finalize_inner(true) {
            tracing::debug!("finalize on drop: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_keys_equal_heap_keys() {
        for key in [
            "",
            "k",
            "weft.shm.inbox",
            &"x".repeat(123),
            &"y".repeat(124),
            &"z".repeat(500),
        ] {
            keys::with_data(7, key, |k| assert_eq!(k, keys::data(7, key).as_slice()));
        }
    }
}

#[cfg(all(test, not(feature = "pmix")))]
mod without_pmix {
    use super::*;

    #[test]
    fn a_pmix_host_is_refused_naming_the_missing_feature() {
        let err = Client::connect_pmix().unwrap_err();
        assert!(matches!(err, InitError::Pmix { .. }), "{err:?}");
        let text = err.to_string();
        for part in [
            "wire-up through the host's PMIx server",
            "the PMIx client is unavailable: built without libpmix",
            "the `pmix` feature of weft-wireup is off",
        ] {
            assert!(text.contains(part), "{part:?} not in {text:?}");
        }
    }
}
