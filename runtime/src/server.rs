//! The per-node wire-up server (`weft server`).
//!
//! One server runs per (logical) node. It starts the node's processes, serves their
//! put/commit/fence/get requests over a Unix socket in a 0700 directory, keeps the node's
//! datastore (a shared-memory segment its clients map read-only), and runs the
//! inter-node part of fences with the other servers: a Bruck all-gather over TCP, one
//! message per server per step, O(log nodes) steps.
//!
//! All state lives in one actor task; connection tasks only parse frames and forward
//! events to it, so the logic has no locks.
//!
//! This file holds the actor: its `State` (the node's links, PGCID allocator and PMIx
//! server, and the job it serves: `job::Job`, which holds the job's plan, datastore,
//! processes and the concerns below), the event loop, and the execution of the actions
//! its concerns decide. The concerns that are structs without IO, whose `on_*`
//! methods take an input and return actions (replies, peer messages, timers, datastore
//! writes), each tested and fuzzed without sockets, tasks or time, beside the data
//! concern (`crate::modex`): `fence` (collectives between servers, from arrival to the
//! all-gather, deadlines and failures), `groups` (the checks of a group construct or
//! destruct, the group it made, members that leave or die, leaders), `psets` (process
//! sets), `invitations` (groups formed by invitation), `leaders` (a failed group
//! leader's replacement), `pmi_keys` (PMI key owners and PMI-2 node attributes),
//! `pgcids` (the root server's PGCID allocator), `procs` (the node's processes, the
//! job's ended ranks, and how each process's end is decided: its exit status, its lost
//! connection, an abort's grace, a termination) and `pmix_book` (the PMIx front end's
//! bookkeeping without libpmix: the core collective each library fence or group
//! operation becomes, the operations under way, the direct modex requests and which a
//! rank's end fails, the group invitations of OpenPMIx's `PMIx_Group_invite` (which wait
//! for whom, what a decline or an end fails, the group one formed), query answers).
//! `actions` hands them their inputs and carries out their actions.
//!
//! The rest is still an `impl State` or free functions in a submodule: `native` (the
//! front end of Weft's native protocol: a process's connection and the dispatch of its
//! requests), `pmi` and `pmi2` (the PMI-1 and PMI-2 wire protocols), `pmix` and
//! `pmix_events` (the embedded PMIx server: the library's calls and replies, and its
//! events carried between nodes, around `pmix_book`), `conns` (the other servers'
//! connections, `PeerLinks`, and the dispatch of their messages), `spawn` (starting the
//! processes) and `output` (forwarding their output).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use weft_shm::StoreWriter;

use crate::wire::frame::{self, MAX_PEER_FRAME};
use crate::wire::proto::{
    ClientMsg, CollId, Event as WireEvent, ExitKind, JobMsg, JobPlan, PeerMsg, ServerMsg,
    ToLauncher, ToServer, WireError, MAGIC, RUNTIME_PROTOCOL_VERSION,
};
use weft_wireup::job::{transport_secret, NodeNet};
use weft_wireup::{NsId, ProcId, Rank};

mod actions;
mod allocs;
mod connect;
mod conns;
mod fence;
mod groups;
mod hold;
mod invitations;
mod job;
mod jobctl;
mod jobs;
mod leaders;
mod native;
mod output;
mod pgcids;
mod pids;
mod pmi;
mod pmi2;
mod pmi_keys;
mod pmi_spawn;
mod pmix;
mod pmix_book;
mod pmix_events;
mod pmix_log;
mod pmix_tools;
mod procs;
mod psets;
mod published;
mod spawn;

use conns::{peer_reader, PeerLinks};
use fence::Contrib;
use job::Job;
use jobs::{Spawns, Starter};
use native::client_conn;
use output::OutputSink;
use pgcids::Pgcids;
use spawn::spawn_child;

/// How long a server at its end waits for its killed processes to be reaped (and their
/// output forwarded) before it exits anyway.
const CHILD_REAP_WAIT: Duration = Duration::from_secs(2);

/// Errors that stop a server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Talking to the launcher failed.
    #[error("server for node {node}: launcher at {addr}: {reason}")]
    Launcher {
        /// This server's node.
        node: u32,
        /// The launcher's address.
        addr: SocketAddr,
        /// What went wrong.
        reason: String,
    },
    /// Setting up the node (socket, datastore, listener) failed.
    #[error("server for node {node}: {what}: {source}")]
    Setup {
        /// This server's node.
        node: u32,
        /// What was being set up.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The datastore segment could not be created.
    #[error("server for node {node}: datastore: {source}")]
    Datastore {
        /// This server's node.
        node: u32,
        /// The cause.
        #[source]
        source: weft_shm::SegmentError,
    },
}

/// How a server is started (the `weft server` command line plus environment).
#[derive(Debug, Clone)]
pub struct ServerArgs {
    /// The launcher's control address.
    pub launcher: SocketAddr,
    /// This server's node id.
    pub node: u32,
    /// The job's shared secret (from `WEFT_JOB_SECRET`).
    pub secret: [u64; 2],
    /// The job's 0700 directory for sockets.
    pub job_dir: PathBuf,
    /// How PMIx tools find this server, if it serves them.
    pub tools: ToolAttach,
}

pub(crate) use crate::jobdir::random_u64;
pub use crate::jobdir::{
    datastore_name, format_secret, ompi_shm_dir, parse_secret, pmix_dir, segment_prefix,
    socket_path, unlink_segments,
};
pub use pmix_tools::ToolAttach;

/// Runs a server until the launcher says the job is over (or disappears).
pub fn run(args: ServerArgs) -> Result<(), ServerError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ServerError::Setup {
            node: args.node,
            what: "tokio runtime".into(),
            source,
        })?;
    let output = OutputSink::start();
    let out = rt.block_on(serve(args, &output));
    // The runtime's end drops the tasks forwarding the children's output, and with them
    // their senders: only then can the output thread end. (Joined inside the runtime, it
    // would wait forever for a forwarder that the blocked runtime no longer runs: a
    // launcher killed mid-job left its servers behind that way.)
    rt.shutdown_timeout(Duration::from_millis(200));
    output.finish();
    out
}

use crate::modex::ConnId;

/// How long a server waits after a peer server's connection closed before it calls that
/// server lost: at a job's end the servers stop at about the same time, and one may see
/// another's close just before its own shutdown (or the last processes' ends) arrives.
const PEER_LOST_GRACE: Duration = Duration::from_millis(250);

enum Out {
    Frame(Vec<u8>),
    Close,
}

enum Event {
    /// An event of job `ns`: its processes, their PMI connections, the job's timers.
    Job {
        ns: NsId,
        ev: JobEvent,
    },
    ClientHello {
        conn: ConnId,
        /// Who the hello says the process is.
        proc: ProcId,
        token: u64,
        tx: UnboundedSender<Out>,
    },
    Client {
        conn: ConnId,
        msg: ClientMsg,
    },
    ClientGone {
        conn: ConnId,
        reason: String,
    },
    Peer {
        msg: PeerMsg,
    },
    PeerLost {
        node: u32,
        reason: String,
    },
    /// A peer server's connection closed some time ago while the job still ran: unless
    /// the job has ended since (the servers' shutdowns cross each other), it is lost.
    PeerLostCheck {
        node: u32,
        reason: String,
    },
    Ctl(ToServer),
    CtlLost(String),
    /// This server received signal N (SIGINT, SIGTERM or SIGHUP).
    Signal(i32),
    /// What the PMIx server library asked about the job of `nspace` (`pmix`).
    Pmix {
        nspace: String,
        ev: pmix::PmixEv,
    },
    /// The time of waiting lookup N (on the root server) passed (`published`).
    NamesExpired(u64),
    /// A connect's `PMIX_TIMEOUT` passed here (`connect`).
    ConnectTimeout(crate::wire::proto::ConnectId),
}

/// What happens to one job on this node (inside [`Event::Job`]).
#[derive(Debug)]
enum JobEvent {
    /// A process's PMI-1 connection is up (`pmi`).
    PmiOpen {
        rank: Rank,
        tx: UnboundedSender<Vec<u8>>,
    },
    /// A PMI-1 request line (or why the connection failed).
    Pmi {
        rank: Rank,
        line: Result<String, String>,
    },
    /// A PMI-2 command (or why the connection failed), after an init that asked for
    /// version 2 (`pmi2`).
    Pmi2 {
        rank: Rank,
        cmd: Result<String, String>,
    },
    /// A process's PMI-1 connection closed.
    PmiClosed {
        rank: Rank,
    },
    Spawned {
        rank: Rank,
        pid: Option<u32>,
    },
    ChildExit {
        rank: Rank,
        how: ExitKind,
    },
    CollTimeout {
        id: CollId,
    },
    QueryTimeout {
        qid: u64,
    },
    InviteTimeout {
        id: String,
    },
    GetTimeout {
        rank: Rank,
        conn: ConnId,
        req: u64,
    },
    /// A child's connection closed before finalize some time ago: if its exit status
    /// has not told how it ended since, it lost the connection while running.
    ConnLostCheck {
        rank: Rank,
    },
    KillNow,
    /// An aborting process's grace period ended: kill it if it still runs.
    AbortGraceOver {
        rank: Rank,
    },
}

/// A sender of one job's events to the actor (for the tasks and threads of its
/// processes).
#[derive(Clone)]
struct JobEvents {
    ns: NsId,
    tx: UnboundedSender<Event>,
}

impl JobEvents {
    /// Sends `ev`; false once the actor is gone.
    fn send(&self, ev: JobEvent) -> bool {
        self.tx.send(Event::Job { ns: self.ns, ev }).is_ok()
    }
}

impl Links {
    /// The channels of a server whose peers' addresses are `peers` (by node), in a job
    /// of `secret`, before any native client connected.
    fn new(
        ev: UnboundedSender<Event>,
        ctl: UnboundedSender<Vec<u8>>,
        peers: Vec<SocketAddr>,
        secret: [u64; 2],
    ) -> Links {
        Links {
            ev,
            ctl,
            peers: PeerLinks::new(peers, secret),
            clients: HashMap::new(),
        }
    }
}

/// The actor's channels out: back to itself (timers and tasks report there), to the
/// launcher, to the other servers and to the native clients.
struct Links {
    /// Events to the actor itself.
    ev: UnboundedSender<Event>,
    /// Frames to the launcher.
    ctl: UnboundedSender<Vec<u8>>,
    /// The other servers' connections (`conns`).
    peers: PeerLinks,
    /// The native clients' connections: the process each that said hello is, its writer.
    clients: HashMap<ConnId, (Option<ProcId>, UnboundedSender<Out>)>,
}

struct State {
    node: u32,
    /// The actor's channels out (`Links`).
    io: Links,
    done: bool,
    /// The PGCIDs to hand out (the root server, node 0, is the only allocator).
    pgcids: Pgcids,
    /// The node's PMIx server, when the first job is served PMIx (`pmix`); each job's
    /// part is its `Job::pmix`.
    pmix: Option<pmix::PmixFront>,
    /// The job the event at hand is about (`job`): every handler of a job's event works
    /// on `self.job`, which [`State::focus`] makes the right one first.
    job: Job,
    /// The node's other jobs, while another is `job`.
    parked: BTreeMap<NsId, Job>,
    /// What starting a job's processes needs (`jobs`).
    starter: Starter,
    /// The spawns local processes asked for, waiting for the launcher (`jobs`).
    spawns: Spawns,
    /// The jobs that ended here: what still arrives about them is late, not wrong.
    ended: BTreeSet<NsId>,
    /// The name service: this node's requests in flight, the names on the root
    /// (`published`).
    names: published::Names,
    /// Connects across jobs: this node's calls, the root's open ones (`connect`).
    connects: connect::Connects,
    /// Allocation requests in flight, and every allocation's state (`allocs`).
    allocs: allocs::Allocs,
}

async fn serve(args: ServerArgs, output: &OutputSink) -> Result<(), ServerError> {
    let node = args.node;
    let lerr = |reason: String| ServerError::Launcher {
        node,
        addr: args.launcher,
        reason,
    };
    let setup = |what: &str, source: io::Error| ServerError::Setup {
        node,
        what: what.into(),
        source,
    };

    // The PMIx server's topology loads meanwhile (`pmix`).
    if weft_pmix::built_with().is_some() {
        weft_pmix::server::preload();
    }
    // 1. Launcher handshake and plan.
    let ctl = TcpStream::connect(args.launcher)
        .await
        .map_err(|e| lerr(format!("cannot connect: {e}")))?;
    ctl.set_nodelay(true).ok();
    let bind_ip = ctl
        .local_addr()
        .map_err(|e| setup("control socket", e))?
        .ip();
    let (mut ctl_r, mut ctl_w) = ctl.into_split();
    let hello = ToLauncher::Hello {
        magic: MAGIC,
        version: RUNTIME_PROTOCOL_VERSION,
        secret: args.secret,
        node,
    };
    frame::write_async(&mut ctl_w, &frame::encode(&hello))
        .await
        .map_err(|e| lerr(e.to_string()))?;
    let plan = match frame::read_async::<ToServer>(&mut ctl_r, MAX_PEER_FRAME).await {
        Ok(ToServer::Plan(p)) => Arc::new(*p),
        Ok(other) => return Err(lerr(format!("expected the job plan, got {other:?}"))),
        Err(e) => return Err(lerr(format!("no job plan: {e}"))),
    };

    // 2. Datastore with the job info, Unix socket, peer listener.
    let net = NodeNet {
        addr: bind_ip,
        transport_secret: transport_secret(args.secret),
    };
    let store = jobs::create_store(&plan, node, &net).map_err(|e| ServerError::Setup {
        node,
        what: "datastore".into(),
        source: io::Error::other(e),
    })?;
    std::fs::create_dir_all(&args.job_dir).map_err(|e| setup("job directory", e))?;
    std::fs::set_permissions(&args.job_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| setup("job directory mode", e))?;
    let sock_path = socket_path(&args.job_dir, node);
    let _ = std::fs::remove_file(&sock_path);
    let unix = UnixListener::bind(&sock_path)
        .map_err(|e| setup(&format!("bind {}", sock_path.display()), e))?;
    let tcp = TcpListener::bind(SocketAddr::new(bind_ip, 0))
        .await
        .map_err(|e| setup("peer listener", e))?;
    let peer_addr = tcp.local_addr().map_err(|e| setup("peer listener", e))?;

    let (ctl_tx, mut ctl_out) = unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(f) = ctl_out.recv().await {
            if frame::write_async(&mut ctl_w, &f).await.is_err() {
                break;
            }
        }
    });
    let _ = ctl_tx.send(frame::encode(&ToLauncher::Ready { peer_addr }));
    let peers = match frame::read_async::<ToServer>(&mut ctl_r, MAX_PEER_FRAME).await {
        Ok(ToServer::Start { peers }) => peers,
        Ok(ToServer::Shutdown | ToServer::Terminate { .. }) => {
            let _ = std::fs::remove_file(&sock_path);
            return Ok(());
        }
        Ok(other) => return Err(lerr(format!("expected start, got {other:?}"))),
        Err(e) => {
            let _ = std::fs::remove_file(&sock_path);
            return Err(lerr(format!("lost before start: {e}")));
        }
    };

    let (ev_tx, mut ev_rx) = unbounded_channel::<Event>();
    // Signals, caught before any process starts: a server that died of one would leave
    // its processes unreaped (zombies once it is gone). Its processes do not inherit the
    // handlers (exec resets them).
    for (kind, num) in [
        (tokio::signal::unix::SignalKind::interrupt(), 2),
        (tokio::signal::unix::SignalKind::terminate(), 15),
        (tokio::signal::unix::SignalKind::hangup(), 1),
    ] {
        let mut s = tokio::signal::unix::signal(kind).map_err(|e| setup("signal handlers", e))?;
        let ev = ev_tx.clone();
        tokio::spawn(async move {
            while s.recv().await.is_some() {
                let _ = ev.send(Event::Signal(num));
            }
        });
    }
    // Control reader.
    {
        let ev = ev_tx.clone();
        tokio::spawn(async move {
            loop {
                match frame::read_async::<ToServer>(&mut ctl_r, MAX_PEER_FRAME).await {
                    Ok(m) => {
                        if ev.send(Event::Ctl(m)).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        let _ = ev.send(Event::CtlLost(e.to_string()));
                        break;
                    }
                }
            }
        });
    }
    // Peer listener.
    {
        let ev = ev_tx.clone();
        let secret = args.secret;
        tokio::spawn(async move {
            while let Ok((s, _)) = tcp.accept().await {
                tokio::spawn(peer_reader(s, secret, ev.clone()));
            }
        });
    }
    // Client listener.
    {
        let ev = ev_tx.clone();
        tokio::spawn(async move {
            let uid = rustix::process::getuid().as_raw();
            let mut next: ConnId = 1;
            while let Ok((s, _)) = unix.accept().await {
                tokio::spawn(client_conn(s, next, uid, ev.clone()));
                next += 1;
            }
        });
    }

    let mut st = State::new(
        node,
        plan.clone(),
        store,
        Links::new(ev_tx.clone(), ctl_tx, peers, args.secret),
        Starter {
            sock: sock_path.clone(),
            net,
            out: output.tx.clone(),
        },
    );
    // 3. The PMIx server (Open MPI programs' way in), then the node's processes.
    // A build without libpmix has none to offer (`weft info` says so).
    if plan.pmix && weft_pmix::built_with().is_some() {
        let dir = pmix_dir(&args.job_dir, node);
        let tools = pmix_tools::tool_support(&plan, node, args.tools.system);
        let started = pmix::PmixFront::start(dir.clone(), ev_tx.clone(), output.tx.clone(), tools)
            .and_then(|mut px| {
                let job = px.add_job(&plan, node)?;
                Ok((px, job))
            });
        match started {
            Ok((px, job)) => {
                if tools.tools {
                    px.publish_attach(&args.tools);
                }
                st.pmix = Some(px);
                st.job.pmix = Some(job);
            }
            Err(why) => {
                let _ = std::fs::remove_dir_all(&dir);
                tracing::warn!(
                    "node {node}: no PMIx for this job's processes ({why}); Weft and \
                     MPICH programs are not affected, Open MPI programs cannot start"
                );
            }
        }
    }
    for r in st.job.procs.local_ranks() {
        // A process that cannot start is reported as its end (`SpawnFailed`).
        let _ = spawn_child(&st, r);
    }

    while !st.done {
        let Some(ev) = ev_rx.recv().await else { break };
        st.handle(ev);
    }
    // Cleanup: kill what is left and wait for it (a child not waited for stays a zombie
    // once this server exits), remove the socket; the store unlinks on drop.
    st.kill_all(rustix::process::Signal::KILL);
    reap_children(&mut st, &mut ev_rx).await;
    let mut job_ids = Vec::new();
    st.each_job(|st| job_ids.push(st.job.plan.job_id.clone()));
    for ns in st.namespaces() {
        jobs::say_leftovers(ns, &crate::process::kill_leftovers(ns));
    }
    // The children's output is written before the launcher connection closes (the
    // launcher may end this process then).
    output.flush();
    if let Some(px) = st.pmix.take() {
        let mut jobs = Vec::new();
        st.each_job(|st| jobs.extend(st.job.pmix.take()));
        px.stop(jobs);
    }
    drop(st);
    for job_id in job_ids {
        unlink_segments(&segment_prefix(&job_id, node));
    }
    let _ = std::fs::remove_file(&sock_path);
    // The launcher's `weft ps` socket file: the job is over (and a killed launcher
    // cannot remove it).
    let _ = std::fs::remove_file(args.job_dir.join(crate::jobdir::CONTROL_FILE));
    let _ = std::fs::remove_dir(&args.job_dir);
    Ok(())
}

/// Waits (up to `CHILD_REAP_WAIT`) until every local process has ended, killing any
/// whose start is reported only now. Every process started reports one `ChildExit`, sent
/// once it is reaped and its output forwarded (or once it failed to start).
async fn reap_children(st: &mut State, ev_rx: &mut UnboundedReceiver<Event>) {
    let deadline = tokio::time::Instant::now() + CHILD_REAP_WAIT;
    while st.any_job(|j| !j.procs.unreaped().is_empty()) {
        match tokio::time::timeout_at(deadline, ev_rx.recv()).await {
            Ok(Some(Event::Job {
                ns,
                ev: JobEvent::Spawned { rank, pid },
            })) if st.focus(ns) => {
                let acts = st.job.procs.on_reap_spawned(rank, pid);
                st.apply_procs(acts);
            }
            Ok(Some(Event::Job {
                ns,
                ev: JobEvent::ChildExit { rank, .. },
            })) if st.focus(ns) => st.job.procs.on_reaped(rank),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                st.each_job(|st| {
                    let left = st.job.procs.unreaped();
                    if !left.is_empty() {
                        tracing::warn!(
                            "ranks {left:?} of {} did not end within {} s of SIGKILL \
                             (CHILD_REAP_WAIT)",
                            st.job.ns,
                            CHILD_REAP_WAIT.as_secs()
                        );
                    }
                });
                break;
            }
        }
    }
}

impl State {
    /// The state of the server of `node` for `plan`, before any event.
    fn new(
        node: u32,
        plan: Arc<JobPlan>,
        store: StoreWriter,
        io: Links,
        starter: Starter,
    ) -> State {
        State {
            node,
            io,
            pmix: None,
            done: false,
            pgcids: Pgcids::new(plan.job.world_pgcid),
            job: Job::new(node, plan, store),
            parked: BTreeMap::new(),
            starter,
            spawns: Spawns::default(),
            ended: BTreeSet::new(),
            names: published::Names::default(),
            connects: connect::Connects::default(),
            allocs: allocs::Allocs::default(),
        }
    }

    /// Makes job `ns` `self.job` (parking the one that was); false when this server
    /// serves no such job. A job's handlers run on `self.job`, so every event of a job
    /// focuses it first.
    fn focus(&mut self, ns: NsId) -> bool {
        if self.job.ns == ns {
            return true;
        }
        let Some(next) = self.parked.remove(&ns) else {
            return false;
        };
        let prev = std::mem::replace(&mut self.job, next);
        self.parked.insert(prev.ns, prev);
        true
    }

    /// The namespaces of the jobs this server serves, in order.
    fn namespaces(&self) -> Vec<NsId> {
        let mut v: Vec<NsId> = self.parked.keys().copied().collect();
        v.push(self.job.ns);
        v.sort();
        v
    }

    /// Runs `f` on each job in turn (focused).
    fn each_job(&mut self, mut f: impl FnMut(&mut State)) {
        for ns in self.namespaces() {
            if self.focus(ns) {
                f(self);
            }
        }
    }

    /// Whether any job satisfies `f`.
    fn any_job(&self, f: impl Fn(&Job) -> bool) -> bool {
        f(&self.job) || self.parked.values().any(f)
    }
}

impl State {
    /// Whether the jobs have ended (or are ending), so that a peer server's close is no
    /// loss: this server terminates, or every job is being terminated or has ended.
    fn job_ended(&self, node: u32, reason: &str) -> bool {
        if self.done {
            return true;
        }
        // At the end of a job a server may see another close before its own shutdown
        // arrives: with every process ended, nothing is lost.
        if !self.any_job(|j| !j.procs.all_gone()) {
            tracing::debug!("the server of node {node} closed after the job's end: {reason}");
            return true;
        }
        // One job's termination (a spawned job's failure) is no reason to miss another's
        // loss.
        !self.any_job(|j| !j.procs.terminating() && !j.procs.all_gone())
    }
}

impl State {
    /// `ev` as an event of this server's job.
    fn job_event(&self, ev: JobEvent) -> Event {
        Event::Job {
            ns: self.job.ns,
            ev,
        }
    }

    /// A sender of this server's job's events.
    fn job_events(&self) -> JobEvents {
        JobEvents {
            ns: self.job.ns,
            tx: self.io.ev.clone(),
        }
    }

    /// Sends `ev`, an event of this server's job, to the actor after `d`.
    fn after_job(&self, d: Duration, ev: JobEvent) {
        after(&self.io.ev, d, self.job_event(ev));
    }
}

fn after(ev: &UnboundedSender<Event>, d: Duration, e: Event) {
    let ev = ev.clone();
    tokio::spawn(async move {
        tokio::time::sleep(d).await;
        let _ = ev.send(e);
    });
}

fn wire_to_text(e: &WireError) -> String {
    match e {
        WireError::Timeout { op, missing } => format!("{op} timed out; not arrived: {missing:?}"),
        WireError::ProcGone { op, rank, reason } => format!("{op}: rank {rank} {reason}"),
        WireError::Aborted { op, reason } => format!("{op} aborted: {reason}"),
        WireError::Invalid { op, reason } => format!("{op} invalid: {reason}"),
    }
}

impl State {
    /// The rank of `p` in this server's job, or why it is not of it: the protocol names
    /// processes by namespace and rank (issue 33), and a server serves one job so far.
    pub(super) fn own_rank(&self, p: ProcId) -> Result<Rank, String> {
        if p.ns == self.job.ns {
            return Ok(p.rank);
        }
        let served: Vec<String> = self.namespaces().iter().map(|n| n.to_string()).collect();
        let only = if served.len() == 1 { " only" } else { "" };
        Err(format!(
            "namespace {} is not served here (this server serves {}{only})",
            p.ns,
            served.join(", ")
        ))
    }

    fn send_client(&self, conn: ConnId, msg: &ServerMsg) {
        if conn & pmi::PMI_CONN != 0 {
            return self.pmi_reply(conn, msg);
        }
        if conn & pmix::PMIX_CONN != 0 {
            return self.pmix_reply(msg);
        }
        if let Some((_, tx)) = self.io.clients.get(&conn) {
            let _ = tx.send(Out::Frame(frame::encode(msg)));
        }
    }

    /// Sends `msg` to the server of `node`, in this server's job's envelope.
    fn send_peer(&mut self, node: u32, msg: &JobMsg) {
        let f = PeerMsg::encode_job(self.job.ns, msg);
        self.io.peers.send(self.node, node, f, &self.io.ev);
    }

    fn to_launcher(&self, msg: &ToLauncher) {
        let _ = self.io.ctl.send(frame::encode(msg));
    }
    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Job { ns, ev } => {
                if self.focus(ns) {
                    self.handle_job(ev);
                } else if self.ended.contains(&ns) {
                    tracing::debug!("an event of {ns}, which ended here: {ev:?}");
                } else {
                    tracing::error!(
                        "ignoring an event of namespace {ns}, which this server does not \
                         serve (it serves {:?}): {ev:?}",
                        self.namespaces()
                    );
                }
            }
            Event::ClientHello {
                conn,
                proc,
                token,
                tx,
            } => {
                // Another namespace's hello is refused by `on_hello` (naming the served).
                self.focus(proc.ns);
                self.on_hello(conn, proc, token, tx)
            }
            Event::Client { conn, msg } => {
                if let Some(proc) = self.io.clients.get(&conn).and_then(|(p, _)| *p) {
                    if self.focus(proc.ns) {
                        self.on_client(conn, proc.rank, msg);
                    }
                }
            }
            Event::ClientGone { conn, reason } => {
                if let Some((Some(proc), _)) = self.io.clients.remove(&conn) {
                    if self.focus(proc.ns) {
                        let acts = self.job.modex.conn_closed(conn);
                        self.apply(acts);
                        let acts = self.job.procs.on_conn_closed(proc.rank, &reason);
                        self.apply_procs(acts);
                    }
                }
            }
            Event::Peer { msg } => self.on_peer(msg),
            Event::PeerLost { node, reason } => {
                self.io.peers.lost(node);
                if !self.job_ended(node, &reason) {
                    after(
                        &self.io.ev,
                        PEER_LOST_GRACE,
                        Event::PeerLostCheck { node, reason },
                    );
                }
            }
            Event::PeerLostCheck { node, reason } => {
                if self.job_ended(node, &reason) {
                    return;
                }
                tracing::error!("lost the server of node {node}: {reason}");
                let why = format!("is unreachable (the server of node {node} was lost)");
                self.each_job(|st| {
                    // Gets waiting on a direct modex from that node can never be answered.
                    let acts = st.job.modex.node_lost(node, &why);
                    st.apply(acts);
                    for r in st.job.plan.job.ranks_on(node) {
                        st.proc_gone(r, why.clone(), HashSet::new(), false);
                    }
                });
            }
            Event::Ctl(ToServer::Terminate { grace_ms }) => self.each_job(|st| {
                let acts = st.job.procs.on_terminate(Duration::from_millis(grace_ms));
                st.apply_procs(acts);
            }),
            Event::Pmix { nspace, ev } => self.pmix_call(&nspace, ev),
            Event::NamesExpired(id) => self.names_expired(id),
            Event::ConnectTimeout(id) => self.connect_timeout(id),
            Event::Ctl(ToServer::Shutdown) => self.done = true,
            Event::Ctl(ToServer::Launch(plan)) => self.launch_job(*plan),
            Event::Ctl(ToServer::Pids { ns, pids }) => {
                if self.focus(ns) {
                    self.job.pids.on_report(&pids);
                }
            }
            Event::Ctl(ToServer::TerminateJob { ns, grace_ms }) => {
                if self.focus(ns) {
                    let acts = self.job.procs.on_terminate(Duration::from_millis(grace_ms));
                    self.apply_procs(acts);
                }
            }
            Event::Ctl(ToServer::EndJob { ns }) => self.end_job(ns),
            Event::Ctl(ToServer::SpawnDone { qid, result }) => self.spawn_done(qid, result),
            Event::Ctl(ToServer::Release { ns, pmix_done }) => self.release(ns, pmix_done),
            Event::Ctl(ToServer::JobTerminated { to, nspace, code }) => {
                self.job_terminated(to, &nspace, code)
            }
            Event::Ctl(ToServer::ToolOutput {
                nspace,
                rank,
                stderr,
                bytes,
            }) => self.tool_output(&nspace, rank, stderr, bytes),
            Event::Ctl(ToServer::Signal { procs, sig }) => self.signal_procs(&procs, sig),
            Event::Ctl(ToServer::AllocDone { qid, result }) => self.alloc_done(qid, result),
            Event::Ctl(ToServer::AllocEvent {
                owner,
                alloc_id,
                session,
            }) => self.alloc_event(owner, alloc_id, session),
            Event::Ctl(other) => tracing::warn!("unexpected control message {other:?}"),
            Event::CtlLost(why) => {
                if self.any_job(|j| j.procs.live() > 0) {
                    tracing::error!("lost the launcher ({why}); killing this node's processes");
                }
                self.done = true;
            }
            // Ctrl-C reaches the launcher too (the same process group), which terminates
            // the job in order; the ranks it reached end and are reported as usual.
            Event::Signal(2) => tracing::debug!("SIGINT: left to the launcher"),
            Event::Signal(sig) => {
                tracing::warn!(
                    "received {}; killing this node's processes",
                    crate::wire::proto::signal_name(sig)
                );
                self.done = true;
            }
        }
    }

    /// An event of this server's job.
    fn handle_job(&mut self, ev: JobEvent) {
        match ev {
            JobEvent::PmiOpen { rank, tx } => self.pmi_open(rank, tx),
            JobEvent::Pmi { rank, line } => self.on_pmi(rank, line),
            JobEvent::Pmi2 { rank, cmd } => self.on_pmi2(rank, cmd),
            JobEvent::PmiClosed { rank } => self.pmi_closed(rank),
            JobEvent::ConnLostCheck { rank } => {
                let acts = self.job.procs.on_conn_lost_check(rank);
                self.apply_procs(acts);
            }
            JobEvent::KillNow => {
                let acts = self.job.procs.on_kill_now();
                self.apply_procs(acts);
            }
            JobEvent::AbortGraceOver { rank } => {
                let acts = self.job.procs.on_abort_grace_over(rank);
                self.apply_procs(acts);
            }
            JobEvent::Spawned { rank, pid } => {
                self.job.procs.on_spawned(rank, pid);
                if let Some(pids) = self.job.pids.on_spawned(rank, pid) {
                    let ns = self.job.ns;
                    self.to_launcher(&ToLauncher::Pids { ns, pids });
                }
            }
            JobEvent::ChildExit { rank, how } => {
                let acts = self.job.procs.on_child_exit(rank, how);
                self.apply_procs(acts);
            }
            JobEvent::CollTimeout { id } => {
                let now = std::time::Instant::now();
                let acts = self.job.fences.on_deadline(
                    id,
                    now,
                    Contrib {
                        modex: &self.job.modex,
                        pgcids: &mut self.pgcids,
                    },
                );
                self.apply_fences(acts);
            }
            JobEvent::QueryTimeout { qid } => {
                let acts = self.job.fences.on_query_timeout(qid);
                self.apply_fences(acts);
            }
            JobEvent::InviteTimeout { id } => {
                let acts = self.job.invitations.on_timeout(&id, &mut self.pgcids);
                self.apply_invitations(acts);
            }
            JobEvent::GetTimeout { rank, conn, req } => {
                let acts = self.job.modex.get_timeout(rank, conn, req);
                self.apply(acts);
            }
        }
    }

    /// Sends `sig` to every process of every job on this node.
    fn kill_all(&mut self, sig: rustix::process::Signal) {
        self.each_job(|st| {
            let acts = st.job.procs.kill_all(sig);
            st.apply_procs(acts);
        });
    }

    /// Sends `event` to local process `rank`; one that has not connected yet gets it
    /// when it does (one that is gone, never).
    fn emit(&mut self, rank: Rank, event: &WireEvent) {
        if let Some(conn) = self.job.procs.on_event(rank, event) {
            self.send_client(conn, &ServerMsg::Event(event.clone()));
        }
    }
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod test_links;
#[cfg(test)]
mod tests;
