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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;
use weft_shm::StoreWriter;

use crate::client::keys;
use crate::frame::{self, FrameError, MAX_CLIENT_FRAME, MAX_PEER_FRAME};
use crate::job::{transport_secret, NodeNet};
use crate::modex::{self, Answer, GetFlags, Modex};
use crate::proto::{
    AppSpec, ClientMsg, CollId, CollKind, Event as WireEvent, EventCode, ExitKind, FenceMode,
    GroupBlock, GroupDirectives, GroupInfo, GroupSpec, JobPlan, PeerMsg, ProcData, Procs,
    ServerMsg, ToLauncher, ToServer, WireError, MAGIC, PROTOCOL_VERSION,
};
use crate::topology;
use crate::value::{Scope, Value};
use crate::{env, Rank};

/// How long a timed-out fence waits for other servers to say who is missing.
const ARRIVAL_QUERY_WAIT: Duration = Duration::from_millis(300);
/// How many joined-collective digests a server remembers per local process.
const JOINED_HISTORY: usize = 4096;

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
}

/// The name of node `node`'s datastore segment for job `job_id`.
pub fn datastore_name(job_id: &str, node: u32) -> String {
    format!("/weft-{job_id}-n{node}")
}

/// The name prefix of every shared-memory segment of node `node` of job `job_id` other
/// than the datastore (transports name their segments with it, so the server can remove
/// them when the job ends, crash or not).
pub fn segment_prefix(job_id: &str, node: u32) -> String {
    format!("/weft-{job_id}-n{node}-")
}

/// Unlinks every segment in /dev/shm whose name starts with `prefix` (with its `/`).
pub fn unlink_segments(prefix: &str) {
    let bare = prefix.trim_start_matches('/');
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(bare) {
                let _ = weft_shm::unlink(&format!("/{name}"));
            }
        }
    }
}

/// The path of node `node`'s socket in the job directory.
pub fn socket_path(job_dir: &Path, node: u32) -> PathBuf {
    job_dir.join(format!("n{node}.sock"))
}

/// Parses a job secret as printed by [`format_secret`].
pub fn parse_secret(s: &str) -> Option<[u64; 2]> {
    let (a, b) = s.split_once('-')?;
    Some([
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    ])
}

/// Formats a job secret for `WEFT_JOB_SECRET`.
pub fn format_secret(s: [u64; 2]) -> String {
    format!("{:016x}-{:016x}", s[0], s[1])
}

/// Random 64-bit value from the kernel.
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    let mut filled = 0;
    while filled < 8 {
        match rustix::rand::getrandom(&mut b[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => panic!("getrandom failed: {e}"),
        }
    }
    u64::from_le_bytes(b)
}

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

/// How long a child's closed connection waits for its exit status before the server
/// reports a lost connection instead.
const EXIT_STATUS_WAIT: Duration = Duration::from_millis(300);

/// How long a server waits after a peer server's connection closed before it calls that
/// server lost: at a job's end the servers stop at about the same time, and one may see
/// another's close just before its own shutdown (or the last processes' ends) arrives.
const PEER_LOST_GRACE: Duration = Duration::from_millis(250);

enum Out {
    Frame(Vec<u8>),
    Close,
}

enum Event {
    ClientHello {
        conn: ConnId,
        rank: Rank,
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
}

#[derive(Default)]
struct LocalProc {
    token: u64,
    conn: Option<ConnId>,
    /// It finalized as it exits: its end is reported by its exit status.
    finalizing_at_exit: bool,
    joined: VecDeque<u64>,
    pid: Option<u32>,
    exited: bool,
    /// Events for the process that arrived before it connected (delivered at hello).
    early_events: Vec<WireEvent>,
}

struct Gone {
    reason: String,
    joined: HashSet<u64>,
    /// The order in which this server learned of the deaths (0 first).
    order: usize,
}

struct Coll {
    digest: u64,
    mode: Option<FenceMode>,
    local_expected: BTreeSet<Rank>,
    arrived: BTreeSet<Rank>,
    waiters: Vec<(ConnId, u64)>,
    nodes: Vec<u32>,
    me: usize,
    started: bool,
    step: u32,
    sent_step: Option<u32>,
    blocks: BTreeMap<u32, Vec<u8>>,
    inbox: HashMap<u32, Vec<(u32, Vec<u8>)>>,
    deadline: Option<Instant>,
    timing_out: bool,
    /// For group collectives: directives and timeout (sent along with every Gather so
    /// that a server that learns of the collective from a peer knows them too).
    group: Option<GroupSpec>,
}

/// A local invitee: its leader, and its accepting join request once made.
type Invitee = (Rank, Option<(ConnId, u64)>);

/// A group being formed by invitation, at its leader's server.
struct Invitation {
    leader: Rank,
    conn: ConnId,
    req: u64,
    invitees: Vec<Rank>,
    directives: GroupDirectives,
    answered: BTreeSet<Rank>,
    accepted: BTreeSet<Rank>,
    /// The root server was asked for a PGCID.
    asked_pgcid: bool,
}

struct Query {
    id: CollId,
    waiting: HashSet<u32>,
    missing: BTreeSet<Rank>,
}

struct State {
    node: u32,
    plan: Arc<JobPlan>,
    secret: [u64; 2],
    ev: UnboundedSender<Event>,
    store: StoreWriter,
    overflowed: bool,
    procs: BTreeMap<Rank, LocalProc>,
    conns: HashMap<ConnId, (Option<Rank>, UnboundedSender<Out>)>,
    peers: Vec<SocketAddr>,
    peer_tx: HashMap<u32, UnboundedSender<Vec<u8>>>,
    ctl_tx: UnboundedSender<Vec<u8>>,
    gone: HashMap<Rank, Gone>,
    colls: HashMap<CollId, Coll>,
    finished: HashMap<CollId, Option<WireError>>,
    finished_order: VecDeque<CollId>,
    queries: HashMap<u64, Query>,
    next_qid: u64,
    /// Committed data, the cache of other nodes' data, and the gets waiting on them.
    modex: Modex,
    live_children: usize,
    terminating: bool,
    done: bool,
    /// Groups with members on this node, by id.
    groups: BTreeMap<String, GroupInfo>,
    /// The next PGCID to hand out (the root server, node 0, is the only allocator).
    next_pgcid: u64,
    /// Root server: the leader it selected last for each group.
    selected_leaders: HashMap<String, Rank>,
    /// Leadership claims of local processes waiting for the root's decision.
    claims: HashMap<(String, Rank), Vec<(ConnId, u64)>>,
    /// Process sets defined while the job runs (every server holds the same).
    runtime_psets: BTreeMap<String, Vec<Rank>>,
    /// Local requests of process-set changes waiting for the root's answer, by query id.
    pset_waiters: HashMap<u64, (ConnId, u64)>,
    /// Groups being formed by invitation, led by a local process.
    invitations: HashMap<String, Invitation>,
    /// Local invitees of groups being formed, by (id, invitee): the leader, and the join
    /// request waiting for the group once accepted.
    invited: HashMap<(String, Rank), Invitee>,
    /// PGCID requests to the root server, by query id: the invitation they are for.
    pgcid_waiters: HashMap<u64, String>,
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
        version: PROTOCOL_VERSION,
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
    let ds_name = datastore_name(&plan.job_id, node);
    let _ = weft_shm::unlink(&ds_name);
    let mut store = StoreWriter::create(&ds_name, plan.datastore_bytes as usize, 1 << 16)
        .map_err(|source| ServerError::Datastore { node, source })?;
    let job_bytes = postcard::to_stdvec(&plan.job).expect("postcard encoding into a Vec");
    store
        .insert(keys::JOB_INFO, &job_bytes)
        .map_err(|_| ServerError::Setup {
            node,
            what: "datastore".into(),
            source: io::Error::other(format!(
                "job info of {} bytes does not fit the datastore",
                job_bytes.len()
            )),
        })?;
    let net = NodeNet {
        addr: bind_ip,
        transport_secret: transport_secret(args.secret),
    };
    let net_bytes = postcard::to_stdvec(&net).expect("postcard encoding into a Vec");
    store
        .insert(keys::NODE_NET, &net_bytes)
        .map_err(|_| ServerError::Setup {
            node,
            what: "datastore".into(),
            source: io::Error::other("the node's network record does not fit the datastore"),
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
        args.secret,
        ev_tx.clone(),
        store,
        peers,
        ctl_tx,
    );
    // 3. Start the node's processes.
    let ranks: Vec<Rank> = st.procs.keys().copied().collect();
    for r in ranks {
        spawn_child(&st, r, &sock_path, &ds_name, output);
    }

    while !st.done {
        let Some(ev) = ev_rx.recv().await else { break };
        st.handle(ev);
    }
    // Cleanup: kill what is left, remove the socket; the store unlinks on drop.
    st.kill_all(rustix::process::Signal::KILL);
    let job_id = st.plan.job_id.clone();
    // The children's output is written before the launcher connection closes (the
    // launcher may end this process then).
    output.flush();
    drop(st);
    unlink_segments(&segment_prefix(&job_id, node));
    let _ = std::fs::remove_file(&sock_path);
    let _ = std::fs::remove_dir(&args.job_dir);
    Ok(())
}

impl State {
    /// The state of the server of `node` for `plan`, before any event.
    fn new(
        node: u32,
        plan: Arc<JobPlan>,
        secret: [u64; 2],
        ev: UnboundedSender<Event>,
        store: StoreWriter,
        peers: Vec<SocketAddr>,
        ctl_tx: UnboundedSender<Vec<u8>>,
    ) -> State {
        let mut procs = BTreeMap::new();
        for r in plan.job.ranks_on(node) {
            procs.insert(
                r,
                LocalProc {
                    token: random_u64(),
                    ..LocalProc::default()
                },
            );
        }
        State {
            node,
            plan: plan.clone(),
            secret,
            ev,
            store,
            overflowed: false,
            live_children: procs.len(),
            procs,
            conns: HashMap::new(),
            peers,
            peer_tx: HashMap::new(),
            ctl_tx,
            gone: HashMap::new(),
            colls: HashMap::new(),
            finished: HashMap::new(),
            finished_order: VecDeque::new(),
            queries: HashMap::new(),
            // Query ids carry the asking node in their top 16 bits, so answers find their way back.
            next_qid: (u64::from(node) << 48) | 1,
            modex: Modex::new(node, plan.job.procs.iter().map(|p| p.node).collect()),
            terminating: false,
            done: false,
            groups: BTreeMap::new(),
            next_pgcid: plan.job.world_pgcid + 1,
            selected_leaders: HashMap::new(),
            claims: HashMap::new(),
            runtime_psets: BTreeMap::new(),
            pset_waiters: HashMap::new(),
            invitations: HashMap::new(),
            invited: HashMap::new(),
            pgcid_waiters: HashMap::new(),
        }
    }
}

/// What the output thread receives: a chunk of a child's output (stderr or not), or a
/// request to say when everything sent before it is written.
enum Chunk {
    Data(bool, Vec<u8>),
    Flushed(std::sync::mpsc::SyncSender<()>),
}

/// Forwards children's output from a dedicated thread, so a slow terminal never blocks
/// the server.
struct OutputSink {
    tx: std::sync::mpsc::Sender<Chunk>,
    thread: std::thread::JoinHandle<()>,
}

impl OutputSink {
    /// How long [`OutputSink::flush`] waits for a blocked terminal.
    const FLUSH_WAIT: Duration = Duration::from_secs(5);

    fn start() -> OutputSink {
        let (tx, rx) = std::sync::mpsc::channel::<Chunk>();
        let thread = std::thread::spawn(move || {
            for chunk in rx {
                let (is_err, bytes) = match chunk {
                    Chunk::Data(is_err, bytes) => (is_err, bytes),
                    Chunk::Flushed(done) => {
                        let _ = done.send(());
                        continue;
                    }
                };
                let _ = if is_err {
                    let mut e = io::stderr().lock();
                    e.write_all(&bytes).and_then(|_| e.flush())
                } else {
                    let mut o = io::stdout().lock();
                    o.write_all(&bytes).and_then(|_| o.flush())
                };
            }
        });
        OutputSink { tx, thread }
    }

    /// Waits (a bounded time) until the output sent so far is written: before the server
    /// lets go of the launcher, which may then end it.
    fn flush(&self) {
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        if self.tx.send(Chunk::Flushed(done)).is_ok() {
            let _ = wait.recv_timeout(Self::FLUSH_WAIT);
        }
    }

    fn finish(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

async fn forward(
    mut r: impl tokio::io::AsyncRead + Unpin,
    is_err: bool,
    tag: Option<String>,
    tx: std::sync::mpsc::Sender<Chunk>,
) {
    // Whole lines are passed on as they complete, so that the output of processes on
    // other nodes (other servers writing to the same terminal) never lands inside a line
    // written in pieces (`eprintln!` makes several writes). A partial line is passed on
    // when no more comes for a moment (a prompt), when it grows large, or at the end;
    // with --tag-output only at a newline, the end, or when large.
    let mut buf = vec![0u8; 64 << 10];
    let mut pending: Vec<u8> = Vec::new();
    let lines = |bytes: Vec<u8>| -> Vec<u8> {
        match &tag {
            None => bytes,
            Some(t) => {
                let mut out = Vec::with_capacity(bytes.len() + t.len());
                for l in bytes.split_inclusive(|&b| b == b'\n') {
                    out.extend_from_slice(t.as_bytes());
                    out.extend_from_slice(l);
                }
                out
            }
        }
    };
    loop {
        let got = if pending.is_empty() || tag.is_some() {
            Some(r.read(&mut buf).await)
        } else {
            tokio::time::timeout(PARTIAL_LINE_WAIT, r.read(&mut buf))
                .await
                .ok()
        };
        let n = match got {
            None => {
                let _ = tx.send(Chunk::Data(is_err, std::mem::take(&mut pending)));
                continue;
            }
            Some(Ok(0) | Err(_)) => break,
            Some(Ok(n)) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        let cut = match pending.iter().rposition(|&b| b == b'\n') {
            Some(i) => i + 1,
            None if pending.len() >= PARTIAL_LINE_MAX => pending.len(),
            None => continue,
        };
        let rest = pending.split_off(cut);
        let done = std::mem::replace(&mut pending, rest);
        let _ = tx.send(Chunk::Data(is_err, lines(done)));
    }
    if !pending.is_empty() {
        if tag.is_some() {
            pending.push(b'\n');
        }
        let _ = tx.send(Chunk::Data(is_err, lines(pending)));
    }
}

/// How long a partial output line waits for the rest before it is passed on.
const PARTIAL_LINE_WAIT: Duration = Duration::from_millis(20);
/// A partial output line this long is passed on as it is.
const PARTIAL_LINE_MAX: usize = 64 << 10;

fn spawn_child(st: &State, rank: Rank, sock: &Path, ds: &str, output: &OutputSink) {
    let plan = &st.plan;
    let info = &plan.job.procs[rank as usize];
    let app: &AppSpec = &plan.apps[info.app as usize];
    let mut cmd = tokio::process::Command::new(&app.program);
    cmd.args(&app.args)
        .env(env::RANK, rank.to_string())
        .env(env::SIZE, plan.job.size().to_string())
        .env(env::LOCAL_RANK, info.local_rank.to_string())
        .env(env::LOCAL_SIZE, st.procs.len().to_string())
        .env(env::NODE, st.node.to_string())
        .env(env::NSPACE, &plan.job.nspace)
        .env(env::SERVER_SOCKET, sock)
        .env(env::TOKEN, st.procs[&rank].token.to_string())
        .env(env::DATASTORE, ds)
        .env(env::APPNUM, info.app.to_string())
        .env(env::SERVER_PID, std::process::id().to_string())
        .env_remove("WEFT_JOB_SECRET")
        .stdin(if rank == 0 {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    for (k, v) in &plan.env {
        cmd.env(k, v);
    }
    if let Some(cwd) = &app.cwd {
        cmd.current_dir(cwd);
    }
    let bind = plan.bind.get(rank as usize).cloned().flatten();
    let spawned = match bind {
        None => cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", app.program)),
        Some(cpus) => {
            let handle = tokio::runtime::Handle::current();
            std::thread::scope(|s| {
                s.spawn(|| {
                    let _g = handle.enter();
                    topology::bind_current_thread(&cpus)
                        .map_err(|e| format!("cannot bind to cpus {cpus}: {e}"))?;
                    cmd.spawn()
                        .map_err(|e| format!("cannot start {}: {e}", app.program))
                })
                .join()
                .unwrap_or_else(|_| Err("binding thread panicked".into()))
            })
        }
    };
    let ev = st.ev.clone();
    match spawned {
        Err(reason) => {
            tracing::error!("rank {rank}: {reason}");
            let _ = ev.send(Event::ChildExit {
                rank,
                how: ExitKind::SpawnFailed(reason),
            });
        }
        Ok(mut child) => {
            let _ = ev.send(Event::Spawned {
                rank,
                pid: child.id(),
            });
            let tag = |s: &str| {
                plan.tag_output
                    .then(|| format!("[{},{rank}]<{s}>: ", plan.job_id))
            };
            let out = child
                .stdout
                .take()
                .map(|o| tokio::spawn(forward(o, false, tag("stdout"), output.tx.clone())));
            let err = child
                .stderr
                .take()
                .map(|e| tokio::spawn(forward(e, true, tag("stderr"), output.tx.clone())));
            tokio::spawn(async move {
                let status = child.wait().await;
                for t in [out, err].into_iter().flatten() {
                    let _ = t.await;
                }
                let how = match status {
                    Ok(s) => {
                        use std::os::unix::process::ExitStatusExt;
                        match (s.code(), s.signal()) {
                            (Some(c), _) => ExitKind::Code(c),
                            (None, Some(sig)) => ExitKind::Signal(sig),
                            (None, None) => ExitKind::Code(-1),
                        }
                    }
                    Err(e) => ExitKind::SpawnFailed(format!("wait failed: {e}")),
                };
                let _ = ev.send(Event::ChildExit { rank, how });
            });
        }
    }
}

async fn client_conn(s: UnixStream, conn: ConnId, uid: u32, ev: UnboundedSender<Event>) {
    match s.peer_cred() {
        Ok(c) if c.uid() == uid => {}
        Ok(c) => {
            tracing::warn!(
                "dropping client connection: peer uid {} is not the job owner's uid {uid}",
                c.uid()
            );
            return;
        }
        Err(e) => {
            tracing::warn!("dropping client connection: cannot read peer credentials: {e}");
            return;
        }
    }
    let (mut r, mut w) = s.into_split();
    let hello = tokio::time::timeout(
        Duration::from_secs(30),
        frame::read_async::<ClientMsg>(&mut r, MAX_CLIENT_FRAME),
    )
    .await;

    let (rank, token) = match hello {
        Err(_) => return refuse(&mut w, "no hello within 30 s".into()).await,
        Ok(Err(e)) => return refuse(&mut w, format!("bad hello: {e}")).await,
        Ok(Ok(ClientMsg::Hello {
            magic,
            version,
            rank,
            token,
        })) => {
            if magic != MAGIC {
                return refuse(&mut w, format!("bad magic {magic:?} in hello")).await;
            }
            if version != PROTOCOL_VERSION {
                return refuse(&mut w, format!("client speaks protocol version {version}, this server speaks {PROTOCOL_VERSION}")).await;
            }
            (rank, token)
        }
        Ok(Ok(other)) => {
            return refuse(
                &mut w,
                format!("first message is not a hello: {}", msg_name(&other)),
            )
            .await
        }
    };
    let (tx, mut rx) = unbounded_channel::<Out>();
    tokio::spawn(async move {
        while let Some(o) = rx.recv().await {
            match o {
                Out::Frame(f) => {
                    if frame::write_async(&mut w, &f).await.is_err() {
                        break;
                    }
                }
                Out::Close => break,
            }
        }
    });
    if ev
        .send(Event::ClientHello {
            conn,
            rank,
            token,
            tx,
        })
        .is_err()
    {
        return;
    }
    loop {
        match frame::read_async::<ClientMsg>(&mut r, MAX_CLIENT_FRAME).await {
            Ok(msg) => {
                if ev.send(Event::Client { conn, msg }).is_err() {
                    return;
                }
            }
            Err(e) => {
                let reason = match e {
                    FrameError::Closed => String::new(),
                    FrameError::Io(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                        String::new()
                    }
                    e => {
                        tracing::warn!("dropping client connection of rank {rank}: {e}");
                        e.to_string()
                    }
                };
                let _ = ev.send(Event::ClientGone { conn, reason });
                return;
            }
        }
    }
}

async fn refuse(w: &mut tokio::net::unix::OwnedWriteHalf, reason: String) {
    tracing::warn!("dropping client connection: {reason}");
    let _ = frame::write_async(w, &frame::encode(&ServerMsg::Refused { reason })).await;
}

fn msg_name(m: &ClientMsg) -> &'static str {
    match m {
        ClientMsg::Hello { .. } => "hello",
        ClientMsg::Commit { .. } => "commit",
        ClientMsg::Fence { .. } => "fence",
        ClientMsg::Get { .. } => "get",
        ClientMsg::Finalize { .. } => "finalize",
        ClientMsg::Group { .. } => "group",
        ClientMsg::GroupQuery { .. } => "group query",
        ClientMsg::GroupLeave { .. } => "group leave",
        ClientMsg::LeaderClaim { .. } => "leader claim",
        ClientMsg::PsetDefine { .. } => "pset define",
        ClientMsg::PsetDelete { .. } => "pset delete",
        ClientMsg::GroupInvite { .. } => "group invite",
        ClientMsg::GroupJoin { .. } => "group join",
    }
}

async fn peer_reader(s: TcpStream, secret: [u64; 2], ev: UnboundedSender<Event>) {
    s.set_nodelay(true).ok();
    let (mut r, _w) = s.into_split();
    let node = match frame::read_async::<PeerMsg>(&mut r, MAX_PEER_FRAME).await {
        Ok(PeerMsg::Hello {
            magic,
            version,
            secret: s2,
            node,
        }) if magic == MAGIC && version == PROTOCOL_VERSION && s2 == secret => node,
        Ok(PeerMsg::Hello { version, .. }) if version != PROTOCOL_VERSION => {
            tracing::warn!("dropping peer connection: it speaks protocol version {version}, this server {PROTOCOL_VERSION}");
            return;
        }
        Ok(_) => {
            tracing::warn!("dropping peer connection: bad hello (wrong magic or job secret)");
            return;
        }
        Err(e) => {
            tracing::warn!("dropping peer connection: {e}");
            return;
        }
    };
    loop {
        match frame::read_async::<PeerMsg>(&mut r, MAX_PEER_FRAME).await {
            Ok(msg) => {
                if ev.send(Event::Peer { msg }).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = ev.send(Event::PeerLost {
                    node,
                    reason: e.to_string(),
                });
                return;
            }
        }
    }
}

async fn peer_writer(
    addr: SocketAddr,
    hello: Vec<u8>,
    node: u32,
    mut rx: UnboundedReceiver<Vec<u8>>,
    ev: UnboundedSender<Event>,
) {
    let mut s = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => {
            let _ = ev.send(Event::PeerLost {
                node,
                reason: format!("cannot connect to {addr}: {e}"),
            });
            return;
        }
    };
    s.set_nodelay(true).ok();
    if let Err(e) = frame::write_async(&mut s, &hello).await {
        let _ = ev.send(Event::PeerLost {
            node,
            reason: e.to_string(),
        });
        return;
    }
    while let Some(f) = rx.recv().await {
        if let Err(e) = frame::write_async(&mut s, &f).await {
            let _ = ev.send(Event::PeerLost {
                node,
                reason: e.to_string(),
            });
            return;
        }
    }
}

impl State {
    /// Whether the job has ended (or is ending), so that a peer server's close is no
    /// loss: this server terminates, or every process of the job has ended.
    fn job_ended(&self, node: u32, reason: &str) -> bool {
        if self.terminating || self.done {
            return true;
        }
        // At the end of a job a server may see another close before its own shutdown
        // arrives: with every process ended, nothing is lost.
        if self.gone.len() == self.plan.job.size() as usize {
            tracing::debug!("the server of node {node} closed after the job's end: {reason}");
            return true;
        }
        false
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
    fn send_client(&self, conn: ConnId, msg: &ServerMsg) {
        if let Some((_, tx)) = self.conns.get(&conn) {
            let _ = tx.send(Out::Frame(frame::encode(msg)));
        }
    }

    fn send_peer(&mut self, node: u32, msg: &PeerMsg) {
        let f = frame::encode(msg);
        if let Some(tx) = self.peer_tx.get(&node) {
            if tx.send(f.clone()).is_ok() {
                return;
            }
        }
        let Some(&addr) = self.peers.get(node as usize) else {
            tracing::error!("no address for node {node}");
            return;
        };
        let (tx, rx) = unbounded_channel();
        let hello = frame::encode(&PeerMsg::Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            secret: self.secret,
            node: self.node,
        });
        tokio::spawn(peer_writer(addr, hello, node, rx, self.ev.clone()));
        let _ = tx.send(f);
        self.peer_tx.insert(node, tx);
    }

    fn to_launcher(&self, msg: &ToLauncher) {
        let _ = self.ctl_tx.send(frame::encode(msg));
    }

    fn store_put(&mut self, key: &[u8], value: &[u8]) {
        if self.overflowed {
            return;
        }
        if self.store.insert(key, value).is_err() {
            tracing::warn!(
                "node datastore {} is full ({} bytes used); further gets go through the server",
                self.store.name(),
                self.store.bytes_used()
            );
            self.store.set_overflowed();
            self.overflowed = true;
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::ClientHello {
                conn,
                rank,
                token,
                tx,
            } => self.on_hello(conn, rank, token, tx),
            Event::Client { conn, msg } => self.on_client(conn, msg),
            Event::ClientGone { conn, reason } => {
                let acts = self.modex.conn_closed(conn);
                self.apply(acts);
                if let Some((Some(rank), _)) = self.conns.remove(&conn) {
                    let Some(p) = self.procs.get_mut(&rank) else {
                        return;
                    };
                    p.conn = None;
                    if self.gone.contains_key(&rank) {
                        return;
                    }
                    if !reason.is_empty() {
                        let why = format!("was dropped by its server: {reason}");
                        return self.proc_gone_local(rank, why, false);
                    }
                    if p.pid.is_some() && !p.exited {
                        // Our child: its exit status, due any moment when it is exiting,
                        // says how it ended better than the closed connection does.
                        after(&self.ev, EXIT_STATUS_WAIT, Event::ConnLostCheck { rank });
                    } else {
                        let why = "lost its connection to the server before finalize";
                        self.proc_gone_local(rank, why.into(), false);
                    }
                }
            }
            Event::ConnLostCheck { rank } => {
                if !self.gone.contains_key(&rank) {
                    let finalizing = self.procs.get(&rank).is_some_and(|p| p.finalizing_at_exit);
                    let (why, fin) = if finalizing {
                        (crate::FINALIZED.to_owned(), true)
                    } else {
                        let why =
                            "lost its connection to the server (the process is still running)";
                        (why.to_owned(), false)
                    };
                    self.proc_gone_local(rank, why, fin);
                }
            }
            Event::Peer { msg } => self.on_peer(msg),
            Event::PeerLost { node, reason } => {
                self.peer_tx.remove(&node);
                if !self.job_ended(node, &reason) {
                    after(
                        &self.ev,
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
                // Gets waiting on a direct modex from that node can never be answered.
                let acts = self.modex.node_lost(node, &why);
                self.apply(acts);
                for r in self.plan.job.ranks_on(node) {
                    self.proc_gone(r, why.clone(), HashSet::new(), false);
                }
            }
            Event::Ctl(ToServer::Terminate { grace_ms }) => {
                self.terminating = true;
                self.kill_all(rustix::process::Signal::TERM);
                after(&self.ev, Duration::from_millis(grace_ms), Event::KillNow);
            }
            Event::KillNow => self.kill_all(rustix::process::Signal::KILL),
            Event::Ctl(ToServer::Shutdown) => self.done = true,
            Event::Ctl(other) => tracing::warn!("unexpected control message {other:?}"),
            Event::CtlLost(why) => {
                if self.live_children > 0 {
                    tracing::error!("lost the launcher ({why}); killing this node's processes");
                }
                self.done = true;
            }
            Event::Spawned { rank, pid } => {
                if let Some(p) = self.procs.get_mut(&rank) {
                    p.pid = pid;
                }
            }
            Event::ChildExit { rank, how } => {
                if let Some(p) = self.procs.get_mut(&rank) {
                    if p.exited {
                        return;
                    }
                    p.exited = true;
                    p.pid = None;
                }
                self.live_children = self.live_children.saturating_sub(1);
                if !self.gone.contains_key(&rank) {
                    let finalizing = self.procs.get(&rank).is_some_and(|p| p.finalizing_at_exit);
                    let (why, fin) = match &how {
                        ExitKind::Code(0) if finalizing => (crate::FINALIZED.to_owned(), true),
                        ExitKind::Code(c) if !finalizing => {
                            (format!("exited with code {c} before finalize"), false)
                        }
                        other => (other.describe(), false),
                    };
                    self.proc_gone_local(rank, why, fin);
                }
                self.to_launcher(&ToLauncher::ProcExit { rank, how });
            }
            Event::CollTimeout { id } => self.coll_timeout(id),
            Event::QueryTimeout { qid } => self.finish_query(qid),
            Event::InviteTimeout { id } => {
                let late: Vec<Rank> = match self.invitations.get(&id) {
                    Some(inv) => inv
                        .invitees
                        .iter()
                        .copied()
                        .filter(|r| !inv.answered.contains(r))
                        .collect(),
                    None => Vec::new(),
                };
                for r in late {
                    self.invite_failed(&id, r, "did not answer before the timeout".into());
                }
            }
            Event::GetTimeout { rank, conn, req } => {
                let acts = self.modex.get_timeout(rank, conn, req);
                self.apply(acts);
            }
        }
    }

    fn kill_all(&mut self, sig: rustix::process::Signal) {
        for p in self.procs.values() {
            if let (Some(pid), false) = (p.pid, p.exited) {
                crate::launcher::kill(pid, sig);
            }
        }
    }

    fn on_hello(&mut self, conn: ConnId, rank: Rank, token: u64, tx: UnboundedSender<Out>) {
        let refuse = |reason: String| {
            tracing::warn!("dropping client connection claiming rank {rank}: {reason}");
            let _ = tx.send(Out::Frame(frame::encode(&ServerMsg::Refused { reason })));
            let _ = tx.send(Out::Close);
        };
        let Some(p) = self.procs.get_mut(&rank) else {
            return refuse(format!("rank {rank} does not run on node {}", self.node));
        };
        if p.token != token {
            return refuse(format!("wrong token for rank {rank}"));
        }
        if p.conn.is_some() {
            return refuse(format!("rank {rank} is already connected"));
        }
        if self.gone.contains_key(&rank) {
            return refuse(format!("rank {rank} has already finalized or died"));
        }
        p.conn = Some(conn);
        let early = std::mem::take(&mut p.early_events);
        let _ = tx.send(Out::Frame(frame::encode(&ServerMsg::Welcome {
            version: PROTOCOL_VERSION,
            datastore: self.store.name().to_owned(),
            nspace: self.plan.job.nspace.clone(),
        })));
        for e in early {
            let _ = tx.send(Out::Frame(frame::encode(&ServerMsg::Event(e))));
        }
        self.conns.insert(conn, (Some(rank), tx));
    }

    fn on_client(&mut self, conn: ConnId, msg: ClientMsg) {
        let Some(rank) = self.conns.get(&conn).and_then(|(r, _)| *r) else {
            return;
        };
        match msg {
            ClientMsg::Hello { .. } => {
                // A protocol violation like an undecodable frame: drop this client.
                tracing::warn!("dropping rank {rank}'s connection: it sent a second hello");
                if let Some((_, tx)) = self.conns.get(&conn) {
                    let _ = tx.send(Out::Close);
                }
                self.handle(Event::ClientGone {
                    conn,
                    reason: "it sent a second hello".into(),
                });
            }
            ClientMsg::Commit { entries } => self.commit(rank, entries),
            ClientMsg::Fence {
                req,
                id,
                mode,
                timeout_ms,
            } => {
                if id.kind != CollKind::Fence {
                    let error = WireError::Invalid {
                        op: "fence".into(),
                        reason: "a fence request carried a group collective id".into(),
                    };
                    return self.send_client(conn, &ServerMsg::Failed { req, error });
                }
                self.coll_arrive(rank, conn, req, id, mode, timeout_ms, None)
            }
            ClientMsg::Group {
                req,
                id,
                directives,
                timeout_ms,
            } => self.group_arrive(rank, conn, req, id, directives, timeout_ms),
            ClientMsg::GroupQuery { req } => {
                let groups = self.groups.values().cloned().collect();
                self.send_client(conn, &ServerMsg::Groups { req, groups });
            }
            ClientMsg::GroupLeave { req, id } => self.group_leave(rank, conn, req, id),
            ClientMsg::LeaderClaim { req, id } => self.leader_claim(rank, conn, req, id),
            ClientMsg::PsetDefine { req, name, members } => {
                self.pset_request(conn, req, name, Some(members))
            }
            ClientMsg::PsetDelete { req, name } => self.pset_request(conn, req, name, None),
            ClientMsg::GroupInvite {
                req,
                id,
                procs,
                directives,
                timeout_ms,
            } => self.group_invite(rank, conn, req, id, procs, directives, timeout_ms),
            ClientMsg::GroupJoin {
                req,
                id,
                leader,
                accept,
            } => self.group_join(rank, conn, req, id, leader, accept),
            ClientMsg::Get {
                req,
                rank: target,
                key,
                refresh,
                local_only,
                immediate,
                timeout_ms,
            } => self.get(
                conn,
                req,
                target,
                key,
                GetFlags {
                    refresh,
                    local_only,
                    immediate,
                },
                timeout_ms,
            ),
            ClientMsg::Finalize { req, at_exit } => {
                let child = self
                    .procs
                    .get(&rank)
                    .is_some_and(|p| p.pid.is_some() && !p.exited);
                if at_exit && child {
                    // Its exit status decides: "has finalized" for 0, else the code or
                    // signal. The connection closing triggers a check in case it lingers.
                    if let Some(p) = self.procs.get_mut(&rank) {
                        p.finalizing_at_exit = true;
                    }
                } else if !self.gone.contains_key(&rank) {
                    self.proc_gone_local(rank, crate::FINALIZED.into(), true);
                }
                self.send_client(conn, &ServerMsg::Done { req });
            }
        }
    }

    fn commit(&mut self, rank: Rank, entries: Vec<(Scope, String, Value)>) {
        let acts = self.modex.commit(rank, entries);
        self.apply(acts);
    }

    /// Carries out what the data concern decided.
    fn apply(&mut self, acts: Vec<modex::Action>) {
        for a in acts {
            match a {
                modex::Action::Reply { conn, req, answer } => {
                    let msg = match answer {
                        Answer::Value(value) => ServerMsg::Value { req, value },
                        Answer::Missing(reason) => ServerMsg::Missing { req, reason },
                        Answer::Failed(error) => ServerMsg::Failed { req, error },
                    };
                    self.send_client(conn, &msg);
                }
                modex::Action::Store { key, value } => self.store_put(&key, &value),
                modex::Action::Peer { node, msg } => self.send_peer(node, &msg),
                modex::Action::GetTimer {
                    rank,
                    conn,
                    req,
                    ms,
                } => after(
                    &self.ev,
                    Duration::from_millis(ms),
                    Event::GetTimeout { rank, conn, req },
                ),
            }
        }
    }

    /// What a collective carries of local participant `rank`: its generation, and its
    /// data when `with_data`.
    fn proc_block(&self, rank: Rank, with_data: bool) -> (Rank, u64, Option<Vec<(String, Value)>>) {
        (
            rank,
            self.modex.gen(rank),
            with_data.then(|| self.modex.view(rank)),
        )
    }

    fn get(
        &mut self,
        conn: ConnId,
        req: u64,
        target: Rank,
        key: String,
        flags: GetFlags,
        timeout_ms: Option<u64>,
    ) {
        let size = self.plan.job.size();
        if target >= size {
            let error = WireError::Invalid {
                op: "get".into(),
                reason: format!("rank {target} is not in the job (size {size})"),
            };
            return self.send_client(conn, &ServerMsg::Failed { req, error });
        }
        let acts = self.modex.get(conn, req, target, key, flags, timeout_ms);
        self.apply(acts);
    }

    /// Local rank `rank` ended (`finalized`, or otherwise as `reason` says): tells the
    /// other servers and everything here that waits on it.
    fn proc_gone_local(&mut self, rank: Rank, reason: String, finalized: bool) {
        let joined: Vec<u64> = self
            .procs
            .get(&rank)
            .map(|p| p.joined.iter().copied().collect())
            .unwrap_or_default();
        let (nodes, me) = (self.plan.job.num_nodes(), self.node);
        for n in (0..nodes).filter(|&n| n != me) {
            self.send_peer(
                n,
                &PeerMsg::ProcGone {
                    rank,
                    reason: reason.clone(),
                    joined: joined.clone(),
                },
            );
        }
        self.proc_gone(rank, reason, joined.into_iter().collect(), finalized);
    }

    fn proc_gone(&mut self, rank: Rank, reason: String, joined: HashSet<u64>, finalized: bool) {
        if self.gone.contains_key(&rank) {
            return;
        }
        // Gets waiting for keys it never committed (a no-op for other nodes' ranks).
        let acts = self.modex.ended(rank, finalized, &reason);
        self.apply(acts);
        // Published in the datastore so that clients waiting on this rank in a transport
        // notice without a message (a lookup in shared memory).
        let gone_key = keys::gone(rank);
        self.store_put(&gone_key, reason.as_bytes());
        // Collectives the rank never joined can no longer complete, except tolerant
        // groups, which go on without it.
        let mut doomed = Vec::new();
        let mut shrunk = Vec::new();
        for (id, c) in &mut self.colls {
            if !id.procs.contains(rank) || joined.contains(&c.digest) {
                continue;
            }
            if c.group.as_ref().is_some_and(|g| g.directives.tolerant()) {
                if c.local_expected.remove(&rank) {
                    shrunk.push(id.clone());
                }
            } else {
                doomed.push(id.clone());
            }
        }
        let order = self.gone.len();
        self.gone.insert(
            rank,
            Gone {
                reason: reason.clone(),
                joined,
                order,
            },
        );
        for id in doomed {
            let error = WireError::ProcGone {
                op: id.op().into(),
                rank,
                reason: reason.clone(),
            };
            self.fail_coll(&id, error, false);
        }
        for id in shrunk {
            self.maybe_start(&id);
        }
        self.groups_lose(rank, &reason);
        self.invitations_lose(rank, &reason);
    }

    fn new_coll(&self, id: &CollId, group: Option<GroupSpec>) -> Coll {
        let job = &self.plan.job;
        let ranks = id.procs.ranks(job.size());
        let mut nodes: Vec<u32> = ranks.iter().map(|&r| job.procs[r as usize].node).collect();
        let assign = group
            .as_ref()
            .is_some_and(|g| g.directives.assign_context_id);
        if id.kind == CollKind::GroupConstruct && assign {
            // The root server takes part to hand out the PGCID in its block.
            nodes.push(0);
        }
        nodes.sort_unstable();
        nodes.dedup();
        let me = nodes.iter().position(|&n| n == self.node).unwrap_or(0);
        let tolerant = group.as_ref().is_some_and(|g| g.directives.tolerant());
        let digest = id.digest();
        Coll {
            digest,
            mode: None,
            local_expected: ranks
                .into_iter()
                .filter(|r| self.procs.contains_key(r))
                // A tolerant group does not wait for members that are already gone.
                .filter(|r| {
                    !tolerant || self.gone.get(r).is_none_or(|g| g.joined.contains(&digest))
                })
                .collect(),
            arrived: BTreeSet::new(),
            waiters: Vec::new(),
            nodes,
            me,
            started: false,
            step: 0,
            sent_step: None,
            blocks: BTreeMap::new(),
            inbox: HashMap::new(),
            deadline: None,
            timing_out: false,
            group,
        }
    }

    fn remember_finished(&mut self, id: CollId, error: Option<WireError>) {
        self.finished.insert(id.clone(), error);
        self.finished_order.push_back(id);
        while self.finished_order.len() > 100_000 {
            if let Some(old) = self.finished_order.pop_front() {
                self.finished.remove(&old);
            }
        }
    }

    /// Checks a group construct or destruct request, then joins it like a fence.
    fn group_arrive(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        id: CollId,
        directives: GroupDirectives,
        timeout_ms: Option<u64>,
    ) {
        let op = id.op();
        let fail = |st: &Self, reason: String| {
            let error = WireError::Invalid {
                op: format!("{op} of {:?}", id.name),
                reason,
            };
            st.send_client(conn, &ServerMsg::Failed { req, error });
        };
        let job = &self.plan.job;
        match id.kind {
            CollKind::Fence => return fail(self, "a group request carried a fence id".into()),
            CollKind::GroupConstruct => {
                if id.name.is_empty() {
                    return fail(self, "the group id is empty".into());
                }
                if id.name == job.nspace || id.name.starts_with("weft://") {
                    return fail(
                        self,
                        format!(
                            "the group id collides with a namespace ({} or the reserved weft:// prefix)",
                            job.nspace
                        ),
                    );
                }
                if let Some(g) = self.groups.get(&id.name) {
                    return fail(
                        self,
                        format!(
                            "the group id is already in use (members {:?}); destruct it first",
                            g.members
                        ),
                    );
                }
                let busy = self.colls.keys().any(|other| {
                    other.kind == CollKind::GroupConstruct && other.name == id.name && *other != id
                });
                if busy {
                    return fail(
                        self,
                        "the group id is already in use by another construct in progress (the same tag used twice concurrently?)".into(),
                    );
                }
                if directives.local_only {
                    let elsewhere: Vec<Rank> = id
                        .procs
                        .ranks(job.size())
                        .into_iter()
                        .filter(|r| !self.procs.contains_key(r))
                        .collect();
                    if !elsewhere.is_empty() {
                        return fail(
                            self,
                            format!(
                                "local-only, but ranks {elsewhere:?} are not on node {}",
                                self.node
                            ),
                        );
                    }
                }
                if let Some(l) = directives.leader {
                    if !id.procs.contains(l) {
                        return fail(self, format!("the leader {l} is not a member"));
                    }
                }
            }
            CollKind::GroupDestruct => match self.groups.get(&id.name) {
                None => return fail(self, "no such group on this node".into()),
                Some(g) if !g.members.contains(&rank) => {
                    return fail(self, format!("rank {rank} is not a member"))
                }
                // Members that died since the construct may still be listed (every survivor
                // lists the membership the construct returned, so their ids agree).
                Some(g)
                    if g.members.iter().any(|&m| !id.procs.contains(m))
                        || id.procs.ranks(job.size()).iter().any(|r| {
                            g.members.binary_search(r).is_err() && !self.gone.contains_key(r)
                        }) =>
                {
                    return fail(
                        self,
                        format!(
                            "the membership {:?} does not match the group's {:?}",
                            id.procs, g.members
                        ),
                    )
                }
                Some(_) => {}
            },
        }
        let mode = if id.kind == CollKind::GroupConstruct && !directives.no_data {
            FenceMode::Full
        } else {
            FenceMode::SyncOnly
        };
        let spec = GroupSpec {
            directives,
            timeout_ms,
        };
        self.coll_arrive(rank, conn, req, id, mode, timeout_ms, Some(spec));
    }

    /// A local process joins collective `id` (a fence or a group operation).
    #[allow(clippy::too_many_arguments)]
    fn coll_arrive(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        id: CollId,
        mode: FenceMode,
        timeout_ms: Option<u64>,
        group: Option<GroupSpec>,
    ) {
        let size = self.plan.job.size();
        let op = id.op();
        let bad = match &id.procs {
            Procs::List(v) if v.windows(2).any(|w| w[0] >= w[1]) => {
                Some(format!("participants {v:?} are not sorted and distinct"))
            }
            Procs::List(v) if v.iter().any(|&r| r >= size) => Some(format!(
                "participants {v:?} name ranks outside the job (size {size})"
            )),
            p if !p.contains(rank) => Some(format!("rank {rank} is not among the participants")),
            _ => None,
        };
        if let Some(reason) = bad {
            return self.send_client(
                conn,
                &ServerMsg::Failed {
                    req,
                    error: WireError::Invalid {
                        op: op.into(),
                        reason,
                    },
                },
            );
        }
        match self.finished.get(&id) {
            Some(Some(error)) => {
                let error = error.clone();
                return self.send_client(conn, &ServerMsg::Failed { req, error });
            }
            Some(None) if id.is_group() => {
                let error = WireError::Invalid {
                    op: op.into(),
                    reason: format!(
                        "group {:?}: this operation already completed without rank {rank} (it arrived after the deadline)",
                        id.name
                    ),
                };
                return self.send_client(conn, &ServerMsg::Failed { req, error });
            }
            _ => {}
        }
        if !self.colls.contains_key(&id) {
            let c = self.new_coll(&id, group.clone());
            self.colls.insert(id.clone(), c);
        }
        let c = &self.colls[&id];
        if c.arrived.contains(&rank) || (c.started && !c.local_expected.contains(&rank)) {
            let reason = if c.arrived.contains(&rank) {
                format!("rank {rank} joined it twice (the same id used twice concurrently?)")
            } else {
                format!("this node's part completed without rank {rank} (it arrived after the deadline)")
            };
            let error = WireError::Invalid {
                op: format!("{op} {:?}", id.name),
                reason,
            };
            return self.send_client(conn, &ServerMsg::Failed { req, error });
        }
        let digest = c.digest;
        let tolerant = c.group.as_ref().is_some_and(|g| g.directives.tolerant());
        if let Some(p) = self.procs.get_mut(&rank) {
            p.joined.push_back(digest);
            if p.joined.len() > JOINED_HISTORY {
                p.joined.pop_front();
            }
        }
        // A participant that is gone and never joined dooms the collective (unless the
        // group tolerates it: then it was left out of `local_expected`).
        let dead = self
            .gone
            .iter()
            .filter(|(r, g)| !tolerant && id.procs.contains(**r) && !g.joined.contains(&digest))
            // The first death this server learned of: the root cause (later ones, such as
            // peers that finalized because of it, follow from it).
            .min_by_key(|(_, g)| g.order)
            .map(|(r, g)| (*r, g.reason.clone()));
        let c = self.colls.get_mut(&id).expect("just inserted");
        c.waiters.push((conn, req));
        if let Some((dead_rank, reason)) = dead {
            let error = WireError::ProcGone {
                op: op.into(),
                rank: dead_rank,
                reason,
            };
            return self.fail_coll(&id, error, true);
        }
        if let Some(m) = c.mode {
            if m != mode {
                let error = WireError::Invalid {
                    op: op.into(),
                    reason: format!(
                        "rank {rank} asked for mode {mode:?} but others asked for {m:?}"
                    ),
                };
                return self.fail_coll(&id, error, true);
            }
        }
        if let (Some(mine), Some(theirs)) = (&group, &c.group) {
            if mine.directives != theirs.directives {
                let error = WireError::Invalid {
                    op: format!("{op} {:?}", id.name),
                    reason: format!(
                        "rank {rank} gave directives {:?} but others gave {:?}",
                        mine.directives, theirs.directives
                    ),
                };
                return self.fail_coll(&id, error, true);
            }
        }
        c.mode = Some(mode);
        c.arrived.insert(rank);
        if let Some(ms) = timeout_ms {
            self.arm_deadline(&id, ms);
        }
        self.maybe_start(&id);
    }

    /// Sets collective `id`'s deadline `ms` from now, if that is earlier than its own.
    fn arm_deadline(&mut self, id: &CollId, ms: u64) {
        let Some(c) = self.colls.get_mut(id) else {
            return;
        };
        let Some(d) = Instant::now().checked_add(Duration::from_millis(ms)) else {
            return;
        };
        if c.deadline.is_none_or(|old| d < old) {
            c.deadline = Some(d);
            let ev = self.ev.clone();
            let id2 = id.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(d).await;
                let _ = ev.send(Event::CollTimeout { id: id2 });
            });
        }
    }

    /// Starts the inter-node part of `id` once every expected local process has joined.
    fn maybe_start(&mut self, id: &CollId) {
        let Some(c) = self.colls.get(id) else {
            return;
        };
        if c.started || !c.local_expected.is_subset(&c.arrived) {
            return;
        }
        let mode = c.mode.unwrap_or(FenceMode::SyncOnly);
        let block = match id.kind {
            // Every mode carries the participants' generations (so that other nodes learn
            // which of their copies are older); Full carries the data too.
            CollKind::Fence => {
                let data: ProcData = c
                    .local_expected
                    .iter()
                    .map(|&r| self.proc_block(r, mode == FenceMode::Full))
                    .collect();
                postcard::to_stdvec(&data).expect("encode")
            }
            CollKind::GroupDestruct => Vec::new(),
            CollKind::GroupConstruct => {
                let joined: Vec<Rank> = c.arrived.iter().copied().collect();
                let data: ProcData = joined
                    .iter()
                    .map(|&r| self.proc_block(r, mode == FenceMode::Full))
                    .collect();
                let assign = c
                    .group
                    .as_ref()
                    .is_some_and(|g| g.directives.assign_context_id);
                let pgcid = (assign && self.node == 0).then(|| {
                    let p = self.next_pgcid;
                    self.next_pgcid += 1;
                    p
                });
                postcard::to_stdvec(&GroupBlock {
                    joined,
                    data,
                    pgcid,
                })
                .expect("encode")
            }
        };
        let c = self.colls.get_mut(id).expect("exists");
        c.blocks.insert(self.node, block);
        c.started = true;
        self.advance(id);
    }

    /// Drives the Bruck all-gather of collective `id` as far as received data allows.
    fn advance(&mut self, id: &CollId) {
        loop {
            let Some(c) = self.colls.get_mut(id) else {
                return;
            };
            if !c.started {
                return;
            }
            let n = c.nodes.len();
            let dist = 1usize << c.step;
            if dist >= n {
                return self.complete(id);
            }
            if c.sent_step != Some(c.step) {
                let cnt = dist.min(n - dist);
                let to = c.nodes[(c.me + n - dist) % n];
                let blocks: Vec<(u32, Vec<u8>)> = (0..cnt)
                    .filter_map(|j| {
                        let node = c.nodes[(c.me + j) % n];
                        c.blocks.get(&node).map(|b| (node, b.clone()))
                    })
                    .collect();
                c.sent_step = Some(c.step);
                let mode = c.mode.unwrap_or(FenceMode::SyncOnly);
                let group = c.group.as_ref().map(|g| GroupSpec {
                    directives: g.directives.clone(),
                    timeout_ms: c.deadline.map(|d| {
                        let left = d.saturating_duration_since(Instant::now());
                        u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
                    }),
                });
                let msg = PeerMsg::Gather {
                    id: id.clone(),
                    mode,
                    step: c.step,
                    blocks,
                    group,
                };
                self.send_peer(to, &msg);
                continue;
            }
            let Some(got) = c.inbox.remove(&c.step) else {
                return;
            };
            for (node, b) in got {
                c.blocks.insert(node, b);
            }
            c.step += 1;
        }
    }

    fn complete(&mut self, id: &CollId) {
        let Some(c) = self.colls.remove(id) else {
            return;
        };
        let mut err = None;
        let mut record = None;
        match id.kind {
            CollKind::Fence => {
                for (node, b) in &c.blocks {
                    if *node == self.node {
                        continue;
                    }
                    match postcard::from_bytes::<ProcData>(b) {
                        Ok(data) => self.learn_remote(data),
                        Err(e) => {
                            err = Some(WireError::Invalid {
                                op: "fence".into(),
                                reason: format!("corrupt data block from node {node}: {e}"),
                            })
                        }
                    }
                }
            }
            CollKind::GroupConstruct => match self.group_result(id, &c) {
                Ok(r) => record = Some(r),
                Err(e) => err = Some(e),
            },
            CollKind::GroupDestruct => {
                self.groups.remove(&id.name);
            }
        }
        for (conn, req) in &c.waiters {
            let msg = match (&err, &record) {
                (Some(e), _) => ServerMsg::Failed {
                    req: *req,
                    error: e.clone(),
                },
                (None, Some(g)) => ServerMsg::Group {
                    req: *req,
                    group: g.clone(),
                },
                (None, None) => ServerMsg::Done { req: *req },
            };
            self.send_client(*conn, &msg);
        }
        self.remember_finished(id.clone(), err);
    }

    /// The group a completed construct made, from every node's block; records it here
    /// when it has members on this node.
    fn group_result(&mut self, id: &CollId, c: &Coll) -> Result<GroupInfo, WireError> {
        let op = || format!("group construct of {:?}", id.name);
        let mut members = Vec::new();
        let mut pgcid = None;
        for (node, b) in &c.blocks {
            let block: GroupBlock = postcard::from_bytes(b).map_err(|e| WireError::Invalid {
                op: op(),
                reason: format!("corrupt block from node {node}: {e}"),
            })?;
            members.extend(block.joined);
            pgcid = pgcid.or(block.pgcid);
            if *node != self.node {
                self.learn_remote(block.data);
            }
        }
        members.sort_unstable();
        members.dedup();
        let directives = c
            .group
            .as_ref()
            .map(|g| g.directives.clone())
            .unwrap_or_default();
        if directives.assign_context_id && pgcid.is_none() {
            return Err(WireError::Invalid {
                op: op(),
                reason: "the root server's block carried no PGCID".into(),
            });
        }
        let left_out = id
            .procs
            .ranks(self.plan.job.size())
            .into_iter()
            .filter(|r| members.binary_search(r).is_err())
            .collect();
        let record = GroupInfo {
            id: id.name.clone(),
            members,
            pgcid,
            leader: directives.leader,
            left_out,
            directives,
        };
        if record.members.iter().any(|r| self.procs.contains_key(r)) {
            self.groups.insert(id.name.clone(), record.clone());
        }
        Ok(record)
    }

    /// What a collective carried of other nodes' participants.
    fn learn_remote(&mut self, data: ProcData) {
        for (rank, gen, entries) in data {
            if rank < self.plan.job.size() {
                let acts = self.modex.learn(rank, gen, entries);
                self.apply(acts);
            }
        }
    }

    fn fail_coll(&mut self, id: &CollId, error: WireError, broadcast: bool) {
        if let Some(c) = self.colls.remove(id) {
            for (conn, req) in &c.waiters {
                self.send_client(
                    *conn,
                    &ServerMsg::Failed {
                        req: *req,
                        error: error.clone(),
                    },
                );
            }
            if broadcast {
                let me = self.node;
                for &n in c.nodes.iter().filter(|&&n| n != me) {
                    self.send_peer(
                        n,
                        &PeerMsg::Abort {
                            id: id.clone(),
                            error: error.clone(),
                        },
                    );
                }
            }
        } else if broadcast {
            let nodes = self.new_coll(id, None).nodes;
            let me = self.node;
            for n in nodes.into_iter().filter(|&n| n != me) {
                self.send_peer(
                    n,
                    &PeerMsg::Abort {
                        id: id.clone(),
                        error: error.clone(),
                    },
                );
            }
        }
        self.remember_finished(id.clone(), Some(error));
    }

    fn coll_timeout(&mut self, id: CollId) {
        let Some(c) = self.colls.get_mut(&id) else {
            return;
        };
        if c.timing_out || c.deadline.is_none_or(|d| d > Instant::now()) {
            return;
        }
        if c.group.as_ref().is_some_and(|g| g.directives.optional) {
            // An optional group goes on with the members that joined in time.
            if !c.started {
                c.local_expected = c.arrived.clone();
                let id2 = id.clone();
                self.maybe_start(&id2);
            }
            return;
        }
        c.timing_out = true;
        let missing: BTreeSet<Rank> = c.local_expected.difference(&c.arrived).copied().collect();
        let others: HashSet<u32> = c
            .nodes
            .iter()
            .copied()
            .filter(|&n| n != self.node)
            .collect();
        let qid = self.next_qid;
        self.next_qid += 1;
        for &n in &others {
            self.send_peer(
                n,
                &PeerMsg::ArrivalQuery {
                    id: id.clone(),
                    qid,
                },
            );
        }
        self.queries.insert(
            qid,
            Query {
                id,
                waiting: others,
                missing,
            },
        );
        after(&self.ev, ARRIVAL_QUERY_WAIT, Event::QueryTimeout { qid });
        self.maybe_finish_query(qid);
    }

    fn maybe_finish_query(&mut self, qid: u64) {
        if self.queries.get(&qid).is_some_and(|q| q.waiting.is_empty()) {
            self.finish_query(qid);
        }
    }

    fn finish_query(&mut self, qid: u64) {
        let Some(mut q) = self.queries.remove(&qid) else {
            return;
        };
        // Nodes that did not answer: all their participants count as missing.
        for n in &q.waiting {
            for r in self.plan.job.ranks_on(*n) {
                if q.id.procs.contains(r) {
                    q.missing.insert(r);
                }
            }
        }
        if q.missing.is_empty() {
            // Everyone has arrived: the all-gather is only finishing. Aborting now could
            // fail a fence that succeeds elsewhere, so let it complete.
            if let Some(c) = self.colls.get_mut(&q.id) {
                c.timing_out = false;
            }
            return;
        }
        let error = WireError::Timeout {
            op: q.id.op().into(),
            missing: q.missing.into_iter().collect(),
        };
        tracing::debug!("{}", wire_to_text(&error));
        self.fail_coll(&q.id, error, true);
    }

    fn on_peer(&mut self, msg: PeerMsg) {
        let size = self.plan.job.size();
        let bad_id = match &msg {
            PeerMsg::Gather { id, .. }
            | PeerMsg::Abort { id, .. }
            | PeerMsg::ArrivalQuery { id, .. } => match &id.procs {
                Procs::List(v) => {
                    v.iter().any(|&r| r >= size) || v.windows(2).any(|w| w[0] >= w[1])
                }
                Procs::All => false,
            },
            PeerMsg::ModexReq { rank, .. }
            | PeerMsg::ModexResp { rank, .. }
            | PeerMsg::ProcGone { rank, .. } => *rank >= size,
            _ => false,
        };
        if bad_id {
            tracing::error!("ignoring a malformed message from another server (ranks outside the job or unsorted): {msg:?}");
            return;
        }
        match msg {
            PeerMsg::Hello { .. } => {}
            PeerMsg::Gather {
                id,
                mode,
                step,
                blocks,
                group,
            } => {
                if self.finished.contains_key(&id) {
                    return;
                }
                let fresh = !self.colls.contains_key(&id);
                if fresh {
                    let timeout = group.as_ref().and_then(|g| g.timeout_ms);
                    let c = self.new_coll(&id, group.clone());
                    self.colls.insert(id.clone(), c);
                    if let Some(ms) = timeout {
                        self.arm_deadline(&id, ms);
                    }
                }
                let Some(c) = self.colls.get_mut(&id) else {
                    return;
                };
                match c.mode {
                    Some(m) if m != mode => {
                        let reason = format!("participants asked for different modes ({m:?} here, {mode:?} on another node)");
                        return self.fail_coll(
                            &id,
                            WireError::Invalid {
                                op: id.op().into(),
                                reason,
                            },
                            true,
                        );
                    }
                    _ => c.mode = Some(mode),
                }
                let theirs = group.as_ref().map(|g| &g.directives);
                if !fresh && c.group.as_ref().map(|g| &g.directives) != theirs {
                    let reason = format!(
                        "participants gave different directives ({:?} here, {theirs:?} on another node)",
                        c.group.as_ref().map(|g| &g.directives)
                    );
                    return self.fail_coll(
                        &id,
                        WireError::Invalid {
                            op: id.op().into(),
                            reason,
                        },
                        true,
                    );
                }
                c.inbox.insert(step, blocks);
                if fresh {
                    // A node with no process left to wait for (the root server handing
                    // out a PGCID, or one whose members are gone) starts right away.
                    self.maybe_start(&id);
                }
                self.advance(&id);
            }
            PeerMsg::Abort { id, error } => {
                if self.colls.contains_key(&id) {
                    self.fail_coll(&id, error, false);
                } else if !self.finished.contains_key(&id) {
                    self.remember_finished(id, Some(error));
                }
            }
            PeerMsg::ArrivalQuery { id, qid } => {
                let missing = match (self.colls.get(&id), self.finished.contains_key(&id)) {
                    (Some(c), _) => c.local_expected.difference(&c.arrived).copied().collect(),
                    (None, true) => Vec::new(),
                    (None, false) => self
                        .procs
                        .keys()
                        .copied()
                        .filter(|&r| id.procs.contains(r))
                        .collect(),
                };
                let asker = (qid >> 48) as u32;
                let node = self.node;
                self.send_peer(asker, &PeerMsg::ArrivalReply { qid, node, missing });
            }
            PeerMsg::ArrivalReply { qid, node, missing } => {
                if let Some(q) = self.queries.get_mut(&qid) {
                    q.missing.extend(missing);
                    q.waiting.remove(&node);
                }
                self.maybe_finish_query(qid);
            }
            // The owner answers when the rank commits (or dies); each waiter's own
            // timeout is enforced here, so a late answer still serves the waiters left.
            PeerMsg::ModexReq {
                qid,
                rank,
                key,
                wait,
            } => {
                let acts = self.modex.serve(qid, rank, key, wait);
                self.apply(acts);
            }
            PeerMsg::ModexCancel { qid } => self.modex.cancel(qid),
            PeerMsg::ModexResp { qid, rank, result } => {
                let acts = self.modex.answer(qid, rank, result);
                self.apply(acts);
            }
            PeerMsg::ProcGone {
                rank,
                reason,
                joined,
            } => self.proc_gone(rank, reason, joined.into_iter().collect(), false),
            PeerMsg::GroupLeft { id, rank } => self.member_left(&id, rank),
            PeerMsg::LeaderClaim {
                id,
                rank,
                from,
                nodes,
            } => self.decide_leader(id, rank, from, nodes),
            PeerMsg::LeaderDecision {
                id,
                claimant,
                winner,
            } => {
                for (conn, req) in self
                    .claims
                    .remove(&(id.clone(), claimant))
                    .unwrap_or_default()
                {
                    let msg = if winner == claimant {
                        ServerMsg::Done { req }
                    } else {
                        ServerMsg::Failed {
                            req,
                            error: WireError::Invalid {
                                op: format!("leader claim of {id:?}"),
                                reason: format!("rank {winner} leads the group (selected first)"),
                            },
                        }
                    };
                    self.send_client(conn, &msg);
                }
            }
            PeerMsg::LeaderSelected { id, rank } => self.leader_selected(&id, rank),
            PeerMsg::PsetChange {
                name,
                members,
                from,
                qid,
            } => self.decide_pset(name, members, from, qid),
            PeerMsg::Invite {
                id,
                leader,
                rank,
                procs,
            } => self.invite_arrived(id, leader, rank, procs),
            PeerMsg::InviteReply { id, rank, accept } => self.invite_reply(&id, rank, accept),
            PeerMsg::PgcidReq { qid, from } => {
                let pgcid = self.next_pgcid;
                self.next_pgcid += 1;
                self.send_peer(from, &PeerMsg::PgcidResp { qid, pgcid });
            }
            PeerMsg::PgcidResp { qid, pgcid } => {
                if let Some(id) = self.pgcid_waiters.remove(&qid) {
                    self.form_invited(&id, Some(pgcid));
                }
            }
            PeerMsg::GroupFormed { group } => self.group_formed(group),
            PeerMsg::PsetChanged {
                name,
                members,
                qid,
                error,
            } => self.pset_changed(name, members, qid, error),
        }
    }

    /// Sends `event` to local process `rank`; one that has not connected yet gets it
    /// when it does (one that is gone, never).
    fn emit(&mut self, rank: Rank, event: &WireEvent) {
        let gone = self.gone.contains_key(&rank);
        let Some(p) = self.procs.get_mut(&rank) else {
            return;
        };
        match p.conn {
            Some(conn) => self.send_client(conn, &ServerMsg::Event(event.clone())),
            None if !gone && !p.exited => p.early_events.push(event.clone()),
            None => {}
        }
    }

    /// The groups `rank` was in learn of its death: notify-termination groups drop it
    /// and tell their leader (or every member), groups it led tell every member.
    fn groups_lose(&mut self, rank: Rank, reason: &str) {
        let mut out = Vec::new();
        for g in self.groups.values_mut() {
            if !g.members.contains(&rank) {
                continue;
            }
            let mut events = Vec::new();
            let led = g.leader == Some(rank);
            if g.directives.notify_termination {
                g.members.retain(|&r| r != rank);
            }
            // Leader-failed first: a process that reacts to member-failed has seen it.
            if led {
                g.leader = None;
                events.push((g.members.clone(), EventCode::LeaderFailed));
            }
            if g.directives.notify_termination {
                let to: Vec<Rank> = match g.leader {
                    Some(l) => vec![l],
                    None => g.members.clone(),
                };
                events.push((to, EventCode::MemberFailed));
            }
            for (to, code) in events {
                let e = WireEvent {
                    code,
                    group: Some(g.id.clone()),
                    rank: Some(rank),
                    pset: None,
                    members: g.members.clone(),
                    reason: format!("rank {rank} {reason}"),
                };
                out.extend(
                    to.into_iter()
                        .filter(|&r| r != rank)
                        .map(|r| (r, e.clone())),
                );
            }
        }
        for (r, e) in out {
            self.emit(r, &e);
        }
    }

    /// The nodes that hold members of `members`.
    fn nodes_of(&self, members: &[Rank]) -> Vec<u32> {
        let mut nodes: Vec<u32> = members
            .iter()
            .filter_map(|&r| self.plan.job.node_of(r))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    fn group_invalid(&self, conn: ConnId, req: u64, op: &str, id: &str, reason: String) {
        let error = WireError::Invalid {
            op: format!("{op} of {id:?}"),
            reason,
        };
        self.send_client(conn, &ServerMsg::Failed { req, error });
    }

    /// Group `id` as this server knows it, if `rank` is one of its members.
    fn member_group(&self, id: &str, rank: Rank) -> Result<&GroupInfo, String> {
        match self.groups.get(id) {
            None => Err("no such group on this node".into()),
            Some(g) if !g.members.contains(&rank) => Err(format!("rank {rank} is not a member")),
            Some(g) => Ok(g),
        }
    }

    fn group_leave(&mut self, rank: Rank, conn: ConnId, req: u64, id: String) {
        let g = match self.member_group(&id, rank) {
            Ok(g) => g,
            Err(reason) => return self.group_invalid(conn, req, "group leave", &id, reason),
        };
        let me = self.node;
        for n in self.nodes_of(&g.members).into_iter().filter(|&n| n != me) {
            self.send_peer(
                n,
                &PeerMsg::GroupLeft {
                    id: id.clone(),
                    rank,
                },
            );
        }
        self.member_left(&id, rank);
        self.send_client(conn, &ServerMsg::Done { req });
    }

    /// `rank` left group `id`: the remaining local members get a member-left event.
    fn member_left(&mut self, id: &str, rank: Rank) {
        let Some(g) = self.groups.get_mut(id) else {
            return;
        };
        g.members.retain(|&r| r != rank);
        if g.leader == Some(rank) {
            g.leader = None;
        }
        let e = WireEvent {
            code: EventCode::MemberLeft,
            group: Some(id.to_owned()),
            rank: Some(rank),
            pset: None,
            members: g.members.clone(),
            reason: format!("rank {rank} left the group"),
        };
        let to = g.members.clone();
        if !to.iter().any(|r| self.procs.contains_key(r)) {
            self.groups.remove(id);
        }
        for r in to {
            self.emit(r, &e);
        }
    }

    fn leader_claim(&mut self, rank: Rank, conn: ConnId, req: u64, id: String) {
        let g = match self.member_group(&id, rank) {
            Ok(g) => g,
            Err(reason) => return self.group_invalid(conn, req, "leader claim", &id, reason),
        };
        if let Some(l) = g.leader.filter(|l| !self.gone.contains_key(l)) {
            return self.group_invalid(
                conn,
                req,
                "leader claim",
                &id,
                format!("rank {l} still leads the group"),
            );
        }
        let nodes = self.nodes_of(&g.members);
        self.claims
            .entry((id.clone(), rank))
            .or_default()
            .push((conn, req));
        let msg = PeerMsg::LeaderClaim {
            id: id.clone(),
            rank,
            from: self.node,
            nodes: nodes.clone(),
        };
        if self.node == 0 {
            self.decide_leader(id, rank, 0, nodes);
        } else {
            self.send_peer(0, &msg);
        }
    }

    /// Root server: the first claim after the leader's failure wins.
    fn decide_leader(&mut self, id: String, rank: Rank, from: u32, nodes: Vec<u32>) {
        let current = self.selected_leaders.get(&id).copied();
        let winner = match current {
            Some(l) if !self.gone.contains_key(&l) => l,
            _ => rank,
        };
        if winner == rank && current != Some(rank) {
            self.selected_leaders.insert(id.clone(), rank);
            for n in nodes {
                let m = PeerMsg::LeaderSelected {
                    id: id.clone(),
                    rank,
                };
                if n == self.node {
                    self.leader_selected(&id, rank);
                } else {
                    self.send_peer(n, &m);
                }
            }
        }
        let d = PeerMsg::LeaderDecision {
            id: id.clone(),
            claimant: rank,
            winner,
        };
        if from == self.node {
            self.on_peer(d);
        } else {
            self.send_peer(from, &d);
        }
    }

    fn leader_selected(&mut self, id: &str, rank: Rank) {
        let Some(g) = self.groups.get_mut(id) else {
            return;
        };
        g.leader = Some(rank);
        let e = WireEvent {
            code: EventCode::LeaderSelected,
            group: Some(id.to_owned()),
            rank: Some(rank),
            pset: None,
            members: g.members.clone(),
            reason: format!("rank {rank} declared itself the leader"),
        };
        for r in g.members.clone() {
            self.emit(r, &e);
        }
    }

    fn event(
        code: EventCode,
        group: &str,
        rank: Rank,
        members: Vec<Rank>,
        reason: String,
    ) -> WireEvent {
        WireEvent {
            code,
            group: Some(group.to_owned()),
            rank: Some(rank),
            pset: None,
            members,
            reason,
        }
    }

    /// Sends a message to the server of `node`, or handles it here when that is us.
    fn send_node(&mut self, node: u32, msg: PeerMsg) {
        if node == self.node {
            self.on_peer(msg);
        } else {
            self.send_peer(node, &msg);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn group_invite(
        &mut self,
        leader: Rank,
        conn: ConnId,
        req: u64,
        id: String,
        procs: Vec<Rank>,
        directives: GroupDirectives,
        timeout_ms: Option<u64>,
    ) {
        let size = self.plan.job.size();
        let mut invitees = procs;
        invitees.sort_unstable();
        invitees.dedup();
        invitees.retain(|&r| r != leader);
        let bad = if id.is_empty() || id == self.plan.job.nspace || id.starts_with("weft://") {
            Some("the group id is empty, the namespace or reserved".to_owned())
        } else if self.groups.contains_key(&id) || self.invitations.contains_key(&id) {
            Some("the group id is already in use".to_owned())
        } else if invitees.is_empty() {
            Some("nobody to invite".to_owned())
        } else {
            invitees
                .iter()
                .find(|&&r| r >= size)
                .map(|r| format!("rank {r} is not in the job (size {size})"))
        };
        if let Some(reason) = bad {
            return self.group_invalid(conn, req, "group invite", &id, reason);
        }
        self.invitations.insert(
            id.clone(),
            Invitation {
                leader,
                conn,
                req,
                invitees: invitees.clone(),
                directives,
                answered: BTreeSet::new(),
                accepted: BTreeSet::new(),
                asked_pgcid: false,
            },
        );
        if let Some(ms) = timeout_ms {
            after(
                &self.ev,
                Duration::from_millis(ms),
                Event::InviteTimeout { id: id.clone() },
            );
        }
        for &r in &invitees {
            if let Some(g) = self.gone.get(&r) {
                let why = g.reason.clone();
                self.invite_failed(&id, r, why);
                continue;
            }
            let node = self.plan.job.node_of(r).unwrap_or(0);
            let msg = PeerMsg::Invite {
                id: id.clone(),
                leader,
                rank: r,
                procs: invitees.clone(),
            };
            self.send_node(node, msg);
        }
    }

    /// At an invitee's server: tell it, and remember the invitation for its answer.
    fn invite_arrived(&mut self, id: String, leader: Rank, rank: Rank, procs: Vec<Rank>) {
        if !self.procs.contains_key(&rank) {
            return;
        }
        self.invited.insert((id.clone(), rank), (leader, None));
        let reason = format!("rank {leader} invites you into group {id:?}");
        self.emit(
            rank,
            &Self::event(EventCode::Invited, &id, leader, procs, reason),
        );
    }

    fn group_join(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        id: String,
        leader: Rank,
        accept: bool,
    ) {
        match self.invited.get_mut(&(id.clone(), rank)) {
            Some((l, waiting)) if *l == leader && waiting.is_none() => {
                if accept {
                    *waiting = Some((conn, req));
                } else {
                    self.invited.remove(&(id.clone(), rank));
                    self.send_client(conn, &ServerMsg::Done { req });
                }
            }
            _ => {
                return self.group_invalid(
                    conn,
                    req,
                    "group join",
                    &id,
                    format!("rank {rank} has no pending invitation from rank {leader}"),
                )
            }
        }
        let node = self.plan.job.node_of(leader).unwrap_or(0);
        self.send_node(node, PeerMsg::InviteReply { id, rank, accept });
    }

    /// At the leader's server: an invitee answered.
    fn invite_reply(&mut self, id: &str, rank: Rank, accept: bool) {
        let Some(inv) = self.invitations.get_mut(id) else {
            return;
        };
        if !inv.invitees.contains(&rank) || !inv.answered.insert(rank) {
            return;
        }
        if accept {
            inv.accepted.insert(rank);
        }
        let (code, what) = if accept {
            (EventCode::InviteAccepted, "accepted")
        } else {
            (EventCode::InviteDeclined, "declined")
        };
        let leader = inv.leader;
        let e = Self::event(
            code,
            id,
            rank,
            inv.invitees.clone(),
            format!("rank {rank} {what}"),
        );
        self.emit(leader, &e);
        self.maybe_form(id);
    }

    /// At the leader's server: an invitee died or timed out.
    fn invite_failed(&mut self, id: &str, rank: Rank, why: String) {
        let Some(inv) = self.invitations.get_mut(id) else {
            return;
        };
        if !inv.answered.insert(rank) {
            return;
        }
        let leader = inv.leader;
        let e = Self::event(
            EventCode::InviteFailed,
            id,
            rank,
            inv.invitees.clone(),
            format!("rank {rank} {why}"),
        );
        self.emit(leader, &e);
        self.maybe_form(id);
    }

    fn maybe_form(&mut self, id: &str) {
        let Some(inv) = self.invitations.get_mut(id) else {
            return;
        };
        if inv.answered.len() < inv.invitees.len() || inv.asked_pgcid {
            return;
        }
        if !inv.directives.assign_context_id {
            return self.form_invited(id, None);
        }
        if self.node == 0 {
            let p = self.next_pgcid;
            self.next_pgcid += 1;
            return self.form_invited(id, Some(p));
        }
        inv.asked_pgcid = true;
        let qid = self.next_qid;
        self.next_qid += 1;
        self.pgcid_waiters.insert(qid, id.to_owned());
        let from = self.node;
        self.send_peer(0, &PeerMsg::PgcidReq { qid, from });
    }

    fn form_invited(&mut self, id: &str, pgcid: Option<u64>) {
        let Some(inv) = self.invitations.remove(id) else {
            return;
        };
        let mut members: Vec<Rank> = inv.accepted.iter().copied().collect();
        members.push(inv.leader);
        members.sort_unstable();
        let group = GroupInfo {
            id: id.to_owned(),
            left_out: inv
                .invitees
                .iter()
                .copied()
                .filter(|r| !inv.accepted.contains(r))
                .collect(),
            members: members.clone(),
            pgcid,
            leader: Some(inv.leader),
            directives: inv.directives,
        };
        for n in self.nodes_of(&members) {
            self.send_node(
                n,
                PeerMsg::GroupFormed {
                    group: group.clone(),
                },
            );
        }
        self.send_client(
            inv.conn,
            &ServerMsg::Group {
                req: inv.req,
                group,
            },
        );
    }

    /// At every member's server: the invite-formed group exists.
    fn group_formed(&mut self, group: GroupInfo) {
        let local: Vec<Rank> = group
            .members
            .iter()
            .copied()
            .filter(|r| self.procs.contains_key(r))
            .collect();
        if local.is_empty() {
            return;
        }
        self.groups.insert(group.id.clone(), group.clone());
        let e = WireEvent {
            code: EventCode::ConstructComplete,
            group: Some(group.id.clone()),
            rank: group.leader,
            pset: None,
            members: group.members.clone(),
            reason: match group.pgcid {
                Some(p) => format!("group {:?} formed with PGCID {p}", group.id),
                None => format!("group {:?} formed", group.id),
            },
        };
        for r in local {
            if let Some((_, Some((conn, req)))) = self.invited.remove(&(group.id.clone(), r)) {
                self.send_client(
                    conn,
                    &ServerMsg::Group {
                        req,
                        group: group.clone(),
                    },
                );
            }
            self.emit(r, &e);
        }
    }

    /// A death seen by this server: invitations it led are dropped (their local
    /// invitees get construct-abort), and invitees of local leaders count as failed.
    fn invitations_lose(&mut self, rank: Rank, reason: &str) {
        let ids: Vec<String> = self.invitations.keys().cloned().collect();
        for id in ids {
            if self.invitations[&id].leader == rank {
                self.invitations.remove(&id);
            } else if self.invitations[&id].invitees.contains(&rank) {
                self.invite_failed(&id, rank, reason.to_owned());
            }
        }
        let aborted: Vec<(String, Rank)> = self
            .invited
            .iter()
            .filter(|(_, (leader, _))| *leader == rank)
            .map(|(k, _)| k.clone())
            .collect();
        for (id, r) in aborted {
            let Some((_, waiting)) = self.invited.remove(&(id.clone(), r)) else {
                continue;
            };
            let why = format!("the leader, rank {rank}, {reason}");
            if let Some((conn, req)) = waiting {
                let error = WireError::ProcGone {
                    op: format!("group join of {id:?}"),
                    rank,
                    reason: reason.to_owned(),
                };
                self.send_client(conn, &ServerMsg::Failed { req, error });
            }
            self.emit(
                r,
                &Self::event(EventCode::ConstructAbort, &id, rank, Vec::new(), why),
            );
        }
    }

    fn pset_request(&mut self, conn: ConnId, req: u64, name: String, members: Option<Vec<Rank>>) {
        let qid = self.next_qid;
        self.next_qid += 1;
        self.pset_waiters.insert(qid, (conn, req));
        let from = self.node;
        if self.node == 0 {
            self.decide_pset(name, members, from, qid);
        } else {
            self.send_peer(
                0,
                &PeerMsg::PsetChange {
                    name,
                    members,
                    from,
                    qid,
                },
            );
        }
    }

    /// Root server: checks a process-set change and applies it on every server.
    fn decide_pset(&mut self, name: String, members: Option<Vec<Rank>>, from: u32, qid: u64) {
        let size = self.plan.job.size();
        let launch = self.plan.job.psets.iter().any(|p| p.name == name)
            || name == crate::PSET_SELF
            || name.starts_with("mpi://");
        let error = match &members {
            _ if name.is_empty() => Some("the name is empty".to_owned()),
            _ if launch => Some(format!("{name:?} is a built-in or launch process set")),
            Some(_) if self.runtime_psets.contains_key(&name) => {
                Some(format!("process set {name:?} already exists"))
            }
            Some(m) if m.is_empty() => Some("no members".to_owned()),
            Some(m) if m.iter().any(|&r| r >= size) => Some(format!(
                "members {m:?} name ranks outside the job (size {size})"
            )),
            None if !self.runtime_psets.contains_key(&name) => Some(format!(
                "no process set {name:?} was defined while the job runs"
            )),
            _ => None,
        };
        let members = members.map(|mut m| {
            m.sort_unstable();
            m.dedup();
            m
        });
        let msg = PeerMsg::PsetChanged {
            name,
            members,
            qid,
            error: error.clone(),
        };
        if error.is_some() {
            // Only the asker needs to know.
            if from == self.node {
                self.on_peer(msg);
            } else {
                self.send_peer(from, &msg);
            }
            return;
        }
        for n in 0..self.plan.job.num_nodes() {
            if n == self.node {
                self.on_peer(msg.clone());
            } else {
                self.send_peer(n, &msg);
            }
        }
    }

    /// Applies a process-set change decided by the root server (and answers the asker).
    fn pset_changed(
        &mut self,
        name: String,
        members: Option<Vec<Rank>>,
        qid: u64,
        error: Option<String>,
    ) {
        if let Some((conn, req)) = self.pset_waiters.remove(&qid) {
            let msg = match &error {
                None => ServerMsg::Done { req },
                Some(reason) => ServerMsg::Failed {
                    req,
                    error: WireError::Invalid {
                        op: format!("pset change of {name:?}"),
                        reason: reason.clone(),
                    },
                },
            };
            self.send_client(conn, &msg);
        }
        if error.is_some() {
            return;
        }
        let code = match &members {
            Some(m) => {
                self.runtime_psets.insert(name.clone(), m.clone());
                EventCode::PsetDefined
            }
            None => {
                self.runtime_psets.remove(&name);
                EventCode::PsetDeleted
            }
        };
        let names: Vec<String> = self.runtime_psets.keys().cloned().collect();
        let enc = postcard::to_stdvec(&members).expect("encode");
        self.store_put(&keys::pset(&name), &enc);
        let enc = postcard::to_stdvec(&names).expect("encode");
        self.store_put(keys::RUNTIME_PSETS, &enc);
        let e = WireEvent {
            code,
            group: None,
            rank: None,
            pset: Some(name),
            members: members.unwrap_or_default(),
            reason: String::new(),
        };
        let local: Vec<Rank> = self.procs.keys().copied().collect();
        for r in local {
            self.emit(r, &e);
        }
    }
}

#[cfg(test)]
mod fuzz_tests;
