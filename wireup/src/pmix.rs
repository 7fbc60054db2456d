//! The PMIx backend of [`Client`](crate::Client): a process started by an engine that
//! hosts a PMIx server (`mpirun`, `prterun`, `srun --mpi=pmix`) takes its identity, job
//! information and card exchange from that server through `weft-pmix`.
//!
//! What maps how:
//! - job information: size and rank from `PMIx_Init` and `pmix.job.size`; nodes and
//!   placement from `PMIx_Resolve_nodes`/`PMIx_Resolve_peers` (local ranks in rank order
//!   on each node); app numbers from `pmix.appnum`; the PUs the host bound each process
//!   of this node to from `pmix.cpuset` (where the host binds); the process sets
//!   `weft://world` and those the host defines;
//! - put/commit: each committed value as a PMIx byte object (Weft's encoding of the
//!   [`Value`]) with the same scope, then `PMIx_Commit`;
//! - fence: `PMIx_Fence` over the ranks, collecting the data in mode Full, not in Sparse
//!   and SyncOnly (Sparse gets fetch on demand);
//! - get: first from what is on this node (a Full fence that covered the owner
//!   delivered its data); then a direct fetch through the host's servers, waiting up to
//!   the get's timeout for the owner to commit (asking again while a host answers "not
//!   found" before the commit, as Slurm's does), so a committed key never reads as
//!   `NotFound`; `local_only`/`immediate` never ask the server. A key put with a scope
//!   that hides it from the reader is `NotFound` at once: the owner puts a marker with
//!   the other scope ([`Link::commit`]);
//! - ended processes: the host's termination events (`PMIx_Register_event_handler`;
//!   Open MPI's runtime aborts the job instead) and, for hosts that send none (Slurm
//!   22.05), a liveness check of the participants on this node (each publishes its pid
//!   and start time): a fence or get waiting on a process that ended fails naming it
//!   (`ProcGone`), and the fabric's waits on it too ([`Link::gone`]);
//!
//! - groups: each member puts a digest of the membership and directives (and the leader
//!   its count of groups it led); the host's `PMIx_Group_construct`, where the host has
//!   PMIx groups (`weft run`'s server has), moves them with the members' cards and assigns
//!   the PGCID, and a destruct is the host's `PMIx_Group_destruct`. Where it has none
//!   (Open MPI 4.1's runtime and Slurm 22.05 answer "not supported"; every member finds
//!   the same), Weft's own construct: a collecting fence among the members moves them;
//!   the PGCID is computed from the leader and its count ([`groups::pgcid`]), the same at
//!   every member and unique within the job without a server; a destruct is local (no
//!   PGCID is reused). Either way each member checks the others' digests.
//!   With `optional`, `notify_termination` or `ft_collective`, where members may be left
//!   out, the leader decides instead of a fence: it reads each member's contribution
//!   (leaving out one that has not come by the timeout, with `optional`, or that ended,
//!   with the other two) and publishes the outcome, which the members read
//!   ([`Link::decide_by_leader`]); where the host has groups, the PGCID then comes from
//!   a host construct over the members kept.
//!
//! - the transports' shared secret: rank 0 makes one at init and puts it (Global); the
//!   others fetch it on first use.
//!
//! Fences, gets and group constructs run `PMIx_Fence_nb` and `PMIx_Get_nb` and keep the
//! client's progress hook running while they wait (a transport's handshakes), as waits on
//! Weft's servers do.
//!
//! - the address transports listen on for other nodes: the local address that routes
//!   toward the job's other nodes, resolved from their names ([`route_toward`]).
//!
//! - group events: the members of a group made with `notify_termination` (or with a
//!   leader) get member-failed (and leader-failed) events when a member ends, as from
//!   Weft's servers ([`Link::take_events`]), found by the means above.
//!
//! Not mapped yet (errors say so): runtime process sets, group queries, invitations,
//! joins and leader claims. A process that ends on
//! another node is named only when the host sends an event or fails the wait.

mod groups;
mod liveness;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use weft_pmix::{
    keys as pk, query as pq, Event, EventKind, GetOpts as PGetOpts, Pmix, PmixError, PmixValue,
    Scope as PScope,
};

use crate::client::{lock, CommitError, FenceError, GetError, GetOpts, InitError};
use crate::group::GroupError;
use crate::job::WORLD_PGCID;
use crate::job::{AppInfo, JobInfo, NodeInfo, ProcInfo, Pset, PSET_WORLD};
use crate::proto::{CollId, EventCode, GroupDirectives, GroupInfo};
use crate::proto::{FenceMode, Procs};
use crate::value::{Scope, Value};
use crate::Rank;
use groups::Watched;
use liveness::{proc_start, Ends, PidCheck, EVENT_GRACE, LIVENESS_EVERY, PID_KEY};

/// The connection to the host's PMIx server, and what the backend remembers.
#[derive(Debug)]
pub(crate) struct Link {
    px: Pmix,
    /// The ranks covered by the last fence of mode Full (`None`: none since the last
    /// fence of another mode): their committed data is here.
    full: Mutex<Option<Procs>>,
    /// The scope of each key this process committed: PMIx shows a process all of its
    /// own data, Weft hides a Remote key on its owner's node, the owner included.
    mine: Mutex<HashMap<String, Scope>>,
    /// Values of other nodes' processes this process fetched through the host (a
    /// direct fetch): held here, as a Weft node holds what it fetched, for later
    /// local-only and immediate gets, which the host's client library would not answer
    /// from them (`PMIX_OPTIONAL` looks only at what the local server stored).
    fetched: Mutex<HashMap<(Rank, String), PmixValue>>,
    /// This process's groups as the host knows them.
    groups: HostGroups,
    /// The transports' secret, once known (see [`Link::transport_secret`]).
    secret: std::sync::OnceLock<Option<[u64; 2]>>,
    /// Processes in the job.
    size: u32,
    /// The prefix of this node's segment names (a rank's inbox: `{prefix}r{rank}`).
    prefix: String,
    /// The address that reaches the job's other nodes (see [`route_toward`]).
    node_addr: Option<std::net::IpAddr>,
    /// What the host said about its process sets (for `weft info`).
    host_psets: String,
    /// Whether the host's events are watched, in words (for `weft info`).
    events: String,
    /// What is known of the other processes' ends.
    live: Liveness,
}

/// This process's groups at the host: the PGCIDs it led, whether the host has groups, the
/// groups constructed there and the ones whose members' ends are watched.
#[derive(Debug)]
struct HostGroups {
    /// Groups with a PGCID this process led (the next one's count).
    led: AtomicU64,
    /// Whether the host has PMIx groups (`groups::HOST_GROUPS_*`; found by the first
    /// construct, or by [`Link::report`]).
    host_groups: AtomicU8,
    /// Groups constructed at the host (their destruct is the host's too).
    at_host: Mutex<HashSet<String>>,
    /// Groups whose members' ends are reported as events.
    watched: Mutex<Vec<Watched>>,
}

/// What this process knows of the other processes' ends: its neighbours checked here, and
/// what the host's events said.
#[derive(Debug)]
struct Liveness {
    /// The other ranks on this node (their liveness can be checked here).
    neighbours: Vec<Rank>,
    /// Their pids and start times (once read), and when each was last checked.
    pids: Mutex<HashMap<Rank, PidCheck>>,
    /// What the host's events said about the job's processes (see [`Link::gone`]).
    ends: Mutex<Ends>,
    /// Whether `ends` holds anything (read without the lock on every wait-loop turn).
    any_end: AtomicBool,
}

/// The key under which rank 0 publishes the job's transport secret.
const SECRET_KEY: &str = "weft.transport-secret";

/// How long a process waits for rank 0's secret (it is put during rank 0's init).
const SECRET_WAIT: Duration = Duration::from_secs(60);

/// The first pause before a get asks a host that answered "not found" again, and the
/// longest (the pause doubles in between).
const GET_RETRY_FIRST: Duration = Duration::from_millis(2);
const GET_RETRY_MAX: Duration = Duration::from_millis(100);

/// The longest single wait of a get in the host's server (PMIx counts whole seconds).
const GET_SLICE: Duration = Duration::from_secs(1);

/// The key of the marker that says where `key` is hidden (see [`Link::commit`]).
fn hidden_key(key: &str) -> String {
    format!("weft.hidden/{:016x}", digest(key.as_bytes()))
}

/// FNV-1a over bytes.
fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Why the backend cannot go on: the host's message, named as coming from PMIx.
fn init_err(what: &str, e: PmixError) -> InitError {
    InitError::Pmix {
        reason: format!("{what}: {e}"),
    }
}

fn job_u32(px: &Pmix, rank: Option<Rank>, key: &str) -> Result<Option<u32>, PmixError> {
    let opts = PGetOpts {
        local_only: true,
        ..PGetOpts::default()
    };
    match px.get(rank, key, opts) {
        Ok(v) => Ok(v.as_u32()),
        Err(PmixError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The local address that routes toward the job's other nodes (the first of their names
/// that resolves to an IPv4 address; an unbound UDP socket "connected" to it, which
/// sends nothing, names the interface the kernel would use), or `None` for a job on one node
/// or when no other node's name resolves (then transports listen on loopback unless
/// `WEFT_TCP_ADDR`/`WEFT_TCP_IF` say otherwise).
fn route_toward(names: &[String], mine: usize) -> Option<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    for (i, name) in names.iter().enumerate() {
        if i == mine {
            continue;
        }
        let Ok(addrs) = (name.as_str(), 9).to_socket_addrs() else {
            tracing::debug!("node {name}: its name does not resolve");
            continue;
        };
        for a in addrs.filter(std::net::SocketAddr::is_ipv4) {
            // An unbound datagram socket "connected" to it: the kernel binds it to the
            // source address of the route (nothing is sent, nothing listens).
            let local = rustix::net::socket(
                rustix::net::AddressFamily::INET,
                rustix::net::SocketType::DGRAM,
                None,
            )
            .and_then(|s| {
                rustix::net::connect(&s, &a)?;
                rustix::net::getsockname(&s)
            });
            let ip = local
                .ok()
                .and_then(|l| std::net::SocketAddr::try_from(l).ok())
                .map(|l| l.ip());
            if let Some(ip) = ip.filter(|ip| !ip.is_unspecified()) {
                return Some(ip);
            }
        }
    }
    if names.len() > 1 {
        tracing::warn!(
            "no other node of the job ({names:?}) resolves to an address: TCP between nodes \
             needs WEFT_TCP_ADDR or WEFT_TCP_IF"
        );
    }
    None
}

/// How long the process sets query at init waits for the host.
const PSET_QUERY_WAIT: Duration = Duration::from_secs(2);

/// The process sets the host defines over this job's processes (`PMIx_Query_info`:
/// their names, then each one's members), and what the host said, in words.
fn host_psets(px: &Pmix, size: u32) -> (Vec<Pset>, String) {
    let names = match px.query(pq::PSET_NAMES, None, PSET_QUERY_WAIT) {
        Ok(PmixValue::Strings(v)) => v,
        Ok(PmixValue::Str(s)) => s
            .split(',')
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect(),
        Ok(other) => {
            return (
                Vec::new(),
                format!("unreadable answer to the process sets query: {other:?}"),
            )
        }
        Err(PmixError::NotFound { .. }) => return (Vec::new(), "none defined by the host".into()),
        Err(PmixError::Status { message, .. }) if message.contains("NOT-FOUND") => {
            return (Vec::new(), "none defined by the host".into())
        }
        Err(e) => {
            return (
                Vec::new(),
                format!("the host does not answer process-set queries ({e})"),
            )
        }
    };
    let mut sets = Vec::new();
    let mut notes = Vec::new();
    for name in names {
        if name == PSET_WORLD || name == crate::job::PSET_SELF {
            continue;
        }
        match px.query(pq::PSET_MEMBERSHIP, Some(&name), PSET_QUERY_WAIT) {
            Ok(PmixValue::Procs(procs)) => {
                let mut members: Vec<Rank> = procs
                    .iter()
                    .filter(|(ns, r)| ns == px.nspace() && *r < size)
                    .map(|&(_, r)| r)
                    .collect();
                members.sort_unstable();
                members.dedup();
                if !members.is_empty() {
                    sets.push(Pset { name, members });
                }
            }
            other => notes.push(format!("{name}: members unknown ({other:?})")),
        }
    }
    let mut said = format!(
        "{} from the host{}",
        sets.len(),
        if sets.is_empty() { "" } else { ":" }
    );
    for p in &sets {
        said.push_str(&format!(" {} ({} members)", p.name, p.members.len()));
    }
    for n in notes {
        said.push_str(&format!("; {n}"));
    }
    (sets, said)
}

/// Connects to the host's server and builds the job's information from it.
pub(crate) fn connect() -> Result<(Rank, JobInfo, Link), InitError> {
    let px = Pmix::init().map_err(|e| init_err("connecting to the host's PMIx server", e))?;
    // Termination events turn waits on a dead process into errors naming it; a host that
    // sends none leaves those waits to their timeouts (said in the warning).
    let events = match px.watch_events() {
        Ok(()) => "registered (PMIx_Register_event_handler); the processes of this node are also checked for liveness".to_owned(),
        Err(e) => {
            tracing::warn!("the host's PMIx events are not available ({e}): only the processes of this node are checked for liveness");
            format!("unavailable ({e}); the processes of this node are checked for liveness")
        }
    };
    let rank = px.rank();
    let size = job_u32(&px, None, pk::JOB_SIZE)
        .map_err(|e| init_err("reading the job size", e))?
        .ok_or_else(|| InitError::Pmix {
            reason: "the host's PMIx server gives no job size (pmix.job.size)".into(),
        })?;
    let names = px
        .nodes()
        .map_err(|e| init_err("reading the job's nodes", e))?;
    let mut placed: Vec<Option<(u32, u32)>> = vec![None; size as usize];
    for (i, name) in names.iter().enumerate() {
        let peers = px
            .peers_on(name)
            .map_err(|e| init_err(&format!("reading the ranks on node {name}"), e))?;
        for (local, &r) in peers.iter().enumerate() {
            if let Some(slot) = placed.get_mut(r as usize) {
                *slot = Some((i as u32, local as u32));
            }
        }
    }
    let program = std::env::args().next().unwrap_or_default();
    let mut procs = Vec::with_capacity(size as usize);
    let mut apps: Vec<AppInfo> = Vec::new();
    for r in 0..size {
        let Some((node, local_rank)) = placed[r as usize] else {
            return Err(InitError::Pmix {
                reason: format!(
                    "the host's PMIx server places rank {r} on none of its nodes {names:?}"
                ),
            });
        };
        let app = job_u32(&px, Some(r), pk::APPNUM)
            .map_err(|e| init_err("reading app numbers", e))?
            .unwrap_or(0);
        match apps.get_mut(app as usize) {
            Some(a) => a.size += 1,
            None => {
                while apps.len() < app as usize {
                    apps.push(AppInfo {
                        size: 0,
                        first_rank: r,
                        program: String::new(),
                        pset: None,
                    });
                }
                apps.push(AppInfo {
                    size: 1,
                    first_rank: r,
                    program: program.clone(),
                    pset: None,
                });
            }
        }
        // The PUs the host bound it to (`pmix.cpuset`, a cpu list) and where that is in
        // the hardware (`pmix.locstr`), for the processes of this node: Open MPI gives
        // both when it binds.
        let here = (Some(node) == placed[rank as usize].map(|(n, _)| n)).then_some(PGetOpts {
            local_only: true,
            ..PGetOpts::default()
        });
        let string = |key: &str| {
            here.and_then(|opts| px.get(Some(r), key, opts).ok())
                .and_then(|v| v.as_str().map(str::to_string))
        };
        let cpuset = string(pk::CPUSET).and_then(|s| s.parse().ok());
        let locality = string(pk::LOCALITY_STRING).filter(|s| !s.is_empty());
        procs.push(ProcInfo {
            node,
            local_rank,
            app,
            cpuset,
            locality,
        });
    }
    if rank == 0 {
        // The transports' secret: made here, read by the others on demand (direct
        // modex); only the job's processes can ask the host's servers for it.
        let secret = [crate::job::random_u64(), crate::job::random_u64()];
        let bytes = postcard::to_stdvec(&secret).unwrap_or_default();
        px.put(PScope::Global, SECRET_KEY, &bytes)
            .and_then(|()| px.commit())
            .map_err(|e| init_err("publishing the transports' secret", e))?;
    }
    // This process's pid and start time, for the liveness checks of its node's peers
    // (hosts that send no termination events, like Slurm 22.05).
    let me_alive = proc_start(std::process::id())
        .map(|(start, _)| (std::process::id(), start))
        .unwrap_or((std::process::id(), 0));
    let bytes = postcard::to_stdvec(&me_alive).unwrap_or_default();
    px.put(PScope::Local, PID_KEY, &bytes)
        .and_then(|()| px.commit())
        .map_err(|e| init_err("publishing this process's pid to its node", e))?;
    let my_node = placed[rank as usize].map(|(n, _)| n);
    let neighbours: Vec<Rank> = (0..size)
        .filter(|&r| r != rank && placed[r as usize].map(|(n, _)| n) == my_node)
        .collect();
    // No Weft server removes this node's inbox segments when the job ends: a process
    // removes its own at finalize, a dead neighbour's when it finds it dead, and every
    // one of the node's when the host terminates the job (SIGTERM, as mpirun and srun
    // abort a job).
    let prefix = crate::client::segment_prefix_of(px.nspace(), my_node.unwrap_or(0));
    let inboxes: Vec<String> = std::iter::once(rank)
        .chain(neighbours.iter().copied())
        .map(|r| format!("{prefix}r{r}"))
        .collect();
    if !weft_shm::unlink_on_sigterm(&inboxes) {
        tracing::debug!("SIGTERM has a handler already: a terminated job's inboxes stay");
    }
    let (host_sets, host_psets) = host_psets(&px, size);
    let node_addr = my_node.and_then(|n| route_toward(&names, n as usize));
    let job = JobInfo {
        nspace: px.nspace().to_owned(),
        nodes: names
            .iter()
            .enumerate()
            .map(|(i, h)| NodeInfo {
                id: i as u32,
                hostname: h.clone(),
            })
            .collect(),
        procs,
        apps,
        psets: std::iter::once(Pset {
            name: PSET_WORLD.to_owned(),
            members: (0..size).collect(),
        })
        .chain(host_sets.iter().cloned())
        .collect(),
        world_pgcid: WORLD_PGCID,
    };
    Ok((
        rank,
        job,
        Link {
            px,
            full: Mutex::new(None),
            mine: Mutex::new(HashMap::new()),
            fetched: Mutex::new(HashMap::new()),
            groups: HostGroups {
                led: AtomicU64::new(0),
                host_groups: AtomicU8::new(groups::HOST_GROUPS_UNKNOWN),
                at_host: Mutex::new(HashSet::new()),
                watched: Mutex::new(Vec::new()),
            },
            secret: std::sync::OnceLock::new(),
            size,
            prefix,
            node_addr,
            host_psets,
            events,
            live: Liveness {
                neighbours,
                pids: Mutex::new(HashMap::new()),
                ends: Mutex::new(Ends::default()),
                any_end: AtomicBool::new(false),
            },
        },
    ))
}

impl Link {
    /// The address toward the job's other nodes, if it spans several.
    pub(crate) fn node_addr(&self) -> Option<std::net::IpAddr> {
        self.node_addr
    }

    /// What the host offers Weft and what it lacks, one line each (for `weft info`).
    pub(crate) fn report(&self) -> Vec<String> {
        vec![
            format!(
                "namespace {}, rank {} of {}",
                self.px.nspace(),
                self.px.rank(),
                self.size
            ),
            format!("process sets: {}", self.host_psets),
            format!("termination events: {}", self.events),
            format!("groups: {}", self.groups_report()),
            format!(
                "TCP between nodes listens on {} (WEFT_TCP_ADDR or WEFT_TCP_IF to choose)",
                match self.node_addr {
                    Some(a) => format!("{a}, the address that routes toward the other nodes"),
                    None => "loopback (the job runs on one node, or no other node's name resolves)"
                        .into(),
                }
            ),
            "not mapped: group queries, invitations, joins and leader claims, process sets \
             defined while the job runs"
                .to_owned(),
        ]
    }

    /// Runs a host fence over `ranks`, running `while_waiting` meanwhile and giving up
    /// when a participant is reported gone: `Err(Ok((rank, why)))` then, `Err(Err(e))`
    /// for the host's own failure (a participant found gone after it is named too).
    fn host_fence(
        &self,
        ranks: Option<&[Rank]>,
        collect: bool,
        timeout: Option<Duration>,
        while_waiting: impl FnMut(),
    ) -> Result<(), Result<(Rank, String), PmixError>> {
        self.host_collective(ranks, while_waiting, |wait| {
            self.px.fence_with(ranks, collect, timeout, wait)
        })
    }

    /// Runs `call`, a collective of the host over `ranks` (a fence, a group construct
    /// or destruct), handing it a wait hook that runs `while_waiting` and gives up when
    /// a participant is reported gone: `Err(Ok((rank, why)))` then, `Err(Err(e))` for
    /// the host's own failure (a participant found gone after it is named too).
    fn host_collective<T>(
        &self,
        ranks: Option<&[Rank]>,
        mut while_waiting: impl FnMut(),
        call: impl FnOnce(&mut dyn FnMut() -> Result<(), String>) -> Result<T, PmixError>,
    ) -> Result<T, Result<(Rank, String), PmixError>> {
        let mut dead = None;
        let mut probed = Instant::now();
        let out = call(&mut || {
            while_waiting();
            if probed.elapsed() >= LIVENESS_EVERY {
                self.check_neighbours(ranks, true);
                probed = Instant::now();
            }
            match self.first_failed(ranks) {
                Some((r, why)) => {
                    let msg = format!("rank {r} {why}");
                    dead = Some((r, why));
                    Err(msg)
                }
                None => Ok(()),
            }
        });
        match out {
            Ok(v) => Ok(v),
            Err(e @ PmixError::NotSupported { .. }) => Err(Err(e)),
            Err(e) => {
                if dead.is_none() {
                    // The host may fail the call before its event about the dead
                    // process reaches this one: give the event a moment.
                    let until = Instant::now() + EVENT_GRACE;
                    while dead.is_none() && Instant::now() < until {
                        self.check_neighbours(ranks, true);
                        dead = self.first_gone(ranks);
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                Err(dead.ok_or(e))
            }
        }
    }

    /// Job size (the host's).
    fn size(&self) -> u32 {
        self.size
    }

    /// A secret shared by the job's processes (rank 0 made it at init; the others fetch
    /// it once through the host), or `None` if it cannot be had (then the transports
    /// that need it stay closed, saying why).
    pub(crate) fn transport_secret(&self) -> Option<[u64; 2]> {
        *self.secret.get_or_init(|| {
            let deadline = std::time::Instant::now() + SECRET_WAIT;
            let mut again = false;
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let opts = PGetOpts {
                    timeout: Some(left),
                    // Asked again, rank 0's server must be asked again too: the client
                    // library keeps what it fetched of rank 0 (from another node: its
                    // data as of an earlier commit) and would answer from that.
                    refresh: again,
                    ..PGetOpts::default()
                };
                again = true;
                match self.px.get(Some(0), SECRET_KEY, opts) {
                    Ok(v) => return v.as_bytes().and_then(|b| postcard::from_bytes(b).ok()),
                    // Some hosts (Slurm) answer a fetch that arrives before the owner's
                    // commit with "not found" instead of waiting: ask again.
                    Err(PmixError::NotFound { .. }) if !left.is_zero() => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => {
                        tracing::warn!("the transports' secret from rank 0: {e}");
                        return None;
                    }
                }
            }
        })
    }

    /// Puts the committed entries and commits them.
    pub(crate) fn commit(&self, entries: &[(Scope, String, Value)]) -> Result<(), CommitError> {
        let mut mine = lock(&self.mine);
        for (scope, key, value) in entries {
            mine.insert(key.clone(), *scope);
            let scope = match scope {
                Scope::Local => PScope::Local,
                Scope::Remote => PScope::Remote,
                Scope::Global => PScope::Global,
            };
            let bytes = postcard::to_stdvec(value).map_err(|e| CommitError::Pmix {
                reason: format!("encoding {key:?}: {e}"),
            })?;
            self.px
                .put(scope, key, &bytes)
                .map_err(|e| CommitError::Pmix {
                    reason: e.to_string(),
                })?;
            // Where the key is hidden, a marker says so: a reader there tells "put with
            // a scope that hides it from you" (NotFound) from "not committed yet" (wait),
            // which PMIx hosts answer alike.
            let marker = match scope {
                PScope::Local => Some(PScope::Remote),
                PScope::Remote => Some(PScope::Local),
                PScope::Global => None,
            };
            if let Some(m) = marker {
                let note = postcard::to_stdvec(&(key.as_str(), scope == PScope::Local))
                    .unwrap_or_default();
                self.px
                    .put(m, &hidden_key(key), &note)
                    .map_err(|e| CommitError::Pmix {
                        reason: e.to_string(),
                    })?;
            }
        }
        self.px.commit().map_err(|e| CommitError::Pmix {
            reason: e.to_string(),
        })
    }

    /// A fence over `procs` (normalized and checked by the caller).
    pub(crate) fn fence(
        &self,
        procs: &Procs,
        mode: FenceMode,
        timeout: Option<Duration>,
        while_waiting: impl FnMut(),
    ) -> Result<(), FenceError> {
        let ranks = match procs {
            Procs::All => None,
            Procs::List(v) => Some(v.as_slice()),
        };
        let collect = mode == FenceMode::Full;
        match self.host_fence(ranks, collect, timeout, while_waiting) {
            Ok(()) => {
                *lock(&self.full) = collect.then(|| procs.clone());
                Ok(())
            }
            Err(Ok((rank, reason))) => Err(FenceError::ProcGone { rank, reason }),
            // PMIx does not say who was missing.
            Err(Err(PmixError::Timeout { .. })) => Err(FenceError::Timeout {
                missing: Vec::new(),
            }),
            Err(Err(e)) => Err(FenceError::Pmix {
                reason: e.to_string(),
            }),
        }
    }

    /// Reads `key` of `rank` (see the module's documentation).
    pub(crate) fn get(
        &self,
        rank: Rank,
        key: &str,
        opts: GetOpts,
        while_waiting: &mut dyn FnMut(),
    ) -> Result<Value, GetError> {
        if rank == self.px.rank() && lock(&self.mine).get(key) == Some(&Scope::Remote) {
            return Err(GetError::NotFound {
                rank,
                key: key.to_owned(),
                reason: "it was put with scope Remote: visible only on other nodes".into(),
            });
        }
        match self.fetch(rank, key, opts, while_waiting)? {
            PmixValue::Bytes(b) => postcard::from_bytes(&b).map_err(|e| GetError::Corrupt {
                rank,
                key: key.to_owned(),
                reason: e.to_string(),
            }),
            other => Err(GetError::Corrupt {
                rank,
                key: key.to_owned(),
                reason: format!("not a value Weft put (PMIx value {other:?})"),
            }),
        }
    }

    /// The PMIx value of `key` of `rank` (see [`Link::get`]): from this node, else from
    /// the owner's server, waiting for its commit up to the timeout.
    fn fetch(
        &self,
        rank: Rank,
        key: &str,
        opts: GetOpts,
        while_waiting: &mut dyn FnMut(),
    ) -> Result<PmixValue, GetError> {
        let not_found = |reason: String| GetError::NotFound {
            rank,
            key: key.to_owned(),
            reason,
        };
        let failed = |e: PmixError| GetError::Failed {
            rank,
            key: key.to_owned(),
            reason: e.to_string(),
        };
        let timed_out = || GetError::Timeout {
            rank,
            key: key.to_owned(),
            missing: vec![rank],
        };
        let here_only = opts.local_only || opts.immediate;
        let delivered = lock(&self.full).as_ref().is_some_and(|p| p.contains(rank));
        // What is on this node first: all there is for a local-only or immediate get, and
        // what a Full fence that covered the owner delivered.
        if here_only || (delivered && !opts.refresh) {
            let here = PGetOpts {
                local_only: true,
                ..PGetOpts::default()
            };
            match self.px.get(Some(rank), key, here) {
                Ok(v) => return Ok(v),
                Err(PmixError::NotFound { .. }) if here_only => {
                    if let Some(v) = lock(&self.fetched).get(&(rank, key.to_owned())) {
                        return Ok(v.clone());
                    }
                    return Err(not_found(
                        "not on this node (local-only or immediate get, PMIx host)".into(),
                    ));
                }
                // Committed after the fence: fetched from the owner's server below.
                Err(PmixError::NotFound { .. }) => {}
                Err(e) => return Err(failed(e)),
            }
        }
        // A direct fetch through the host's servers, waiting for the owner to commit
        // (until the timeout). Some hosts (Slurm) answer "not found" at once when the
        // owner has not committed the key yet instead of waiting: ask again, with a
        // growing pause, so a committed key never reads as NotFound.
        // The host's server is asked in slices of GET_SLICE, so that an owner that ended
        // meanwhile (which a host may keep waiting for) is named within about one.
        let deadline = opts.timeout.map(|t| Instant::now() + t);
        let mut pause = GET_RETRY_FIRST;
        // A pause that ends at the deadline is followed by one last ask: a key committed
        // during the pause is not a timeout.
        let mut last_ask = false;
        loop {
            if let Some(reason) = self.gone(rank) {
                // What it committed before it ended may still be on this node's server
                // (asked without a direct fetch, which a host may keep waiting on).
                let here = PGetOpts {
                    local_only: true,
                    ..PGetOpts::default()
                };
                if let Ok(v) = self.px.get(Some(rank), key, here) {
                    return Ok(v);
                }
                return Err(GetError::ProcGone {
                    rank,
                    key: key.to_owned(),
                    reason,
                });
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                if last_ask {
                    return Err(timed_out());
                }
                last_ask = true;
            }
            let popts = PGetOpts {
                timeout: Some(left.map_or(GET_SLICE, |l| l.min(GET_SLICE))),
                local_only: false,
                // Asked again, the owner's server must be asked again too: the client
                // library keeps what it fetched of the owner and would answer from that.
                refresh: opts.refresh || pause > GET_RETRY_FIRST,
            };
            match self
                .px
                .get_with(Some(rank), key, popts, &mut *while_waiting)
            {
                Ok(v) => {
                    lock(&self.fetched).insert((rank, key.to_owned()), v.clone());
                    return Ok(v);
                }
                Err(PmixError::NotFound { .. }) => {
                    if let Some(reason) = self.hidden_here(rank, key, &mut *while_waiting) {
                        return Err(not_found(reason));
                    }
                    let nap = left.map_or(pause, |l| l.min(pause));
                    let until = Instant::now() + nap;
                    while Instant::now() < until {
                        while_waiting();
                        std::thread::sleep(
                            until
                                .saturating_duration_since(Instant::now())
                                .min(Duration::from_millis(1)),
                        );
                    }
                    pause = (pause * 2).min(GET_RETRY_MAX);
                }
                // A slice ended: the loop checks the owner and the deadline.
                Err(PmixError::Timeout { .. }) => pause = pause.max(GET_RETRY_FIRST * 2),
                Err(e) => return Err(failed(e)),
            }
        }
    }

    /// Why `key` of `rank` is invisible here, if its owner committed it with a scope
    /// that hides it from this process (its marker is visible here).
    fn hidden_here(
        &self,
        rank: Rank,
        key: &str,
        while_waiting: &mut dyn FnMut(),
    ) -> Option<String> {
        let quick = PGetOpts {
            timeout: Some(Duration::from_secs(1)),
            ..PGetOpts::default()
        };
        let v = self
            .px
            .get_with(Some(rank), &hidden_key(key), quick, while_waiting)
            .ok()?;
        let (k, local): (String, bool) = postcard::from_bytes(v.as_bytes()?).ok()?;
        (k == key).then(|| {
            if local {
                "it was put with scope Local: visible only on its node".to_owned()
            } else {
                "it was put with scope Remote: visible only on other nodes".to_owned()
            }
        })
    }

    /// `PMIx_Finalize`.
    pub(crate) fn finalize(&self) -> Result<(), String> {
        // Neighbours that find this process gone afterwards learn it finalized (the
        // host's server says nothing to them of a clean end).
        if self.px.put(PScope::Local, liveness::FIN_KEY, b"1").is_ok() {
            let _ = self.px.commit();
        }
        self.px.finalize_shared().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_listen_on_the_address_that_routes_toward_the_other_nodes() {
        let lo = Some(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        // The other node "localhost" is reached over loopback: its address is chosen.
        assert_eq!(route_toward(&["me".into(), "localhost".into()], 0), lo);
        // This node's own name is never the one resolved.
        assert_eq!(route_toward(&["localhost".into()], 0), None);
        // A name that does not resolve is skipped; none left: no address.
        assert_eq!(
            route_toward(&["me".into(), "no-such-node.invalid".into()], 0),
            None
        );
        assert_eq!(
            route_toward(
                &[
                    "no-such-node.invalid".into(),
                    "me".into(),
                    "localhost".into()
                ],
                1
            ),
            lo
        );
    }
}
