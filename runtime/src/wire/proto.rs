//! The runtime's messages: server <-> server and launcher <-> server, beside the
//! client <-> server protocol it shares with the client (`weft_wireup::proto`, re-exported
//! here so that the runtime names every message through one path).
//!
//! Every connection starts with a hello that carries a magic and a version; a peer
//! speaking another version is refused with a message that says both versions.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use weft_wireup::job::JobInfo;
use weft_wireup::{CpuList, NsId, Rank, Value};

pub use weft_wireup::proto::*;

/// One node's contribution to a group construct's all-gather.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GroupBlock {
    /// The node's members that joined.
    pub joined: Vec<Rank>,
    /// Their committed Remote/Global data (empty with `no_data`).
    pub data: ProcData,
    /// The PGCID, in the root server's block when one was asked for.
    pub pgcid: Option<u64>,
}

/// What a server learns of a group collective from the first message about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSpec {
    pub directives: GroupDirectives,
    /// Time left until the construct's deadline when the message was sent.
    pub timeout_ms: Option<u64>,
}

/// What a collective carries of each participant from its node: its rank, its commit
/// generation when it joined, and its Remote/Global data when the collective gathers data.
pub type ProcData = Vec<(Rank, u64, Option<Vec<(String, Value)>>)>;

/// A rank's Remote/Global data as its server answers a direct modex request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModexData {
    /// How many commits of the rank the data includes.
    pub gen: u64,
    /// The keys other nodes may see.
    pub entries: Vec<(String, Value)>,
    /// The rank has finalized: it commits nothing more.
    pub finalized: bool,
}

/// The version of the runtime's own protocol (server <-> server, launcher <-> server),
/// which the hellos of those connections carry: it changes with `PeerMsg`, `JobMsg`,
/// `ToServer` and `ToLauncher`, independently of the client protocol
/// (`PROTOCOL_VERSION`), so a change between servers does not refuse an application built
/// against the same client protocol. Version 5 puts every message between servers in a
/// job's envelope (`PeerMsg::Job`); before it the runtime used the client protocol's
/// number (4). Version 6 adds the name service (`PeerMsg::Names`) and connects
/// (`PeerMsg::Connect`). Version 7: a spawn asked for through PMI (`SpawnReq`,
/// `JobPlan::pmi_preput`), a job's parent (`JobPlan::parent`), and whether a process that
/// ended had finalized (`JobMsg::ProcGone::finalized`). Version 8: a persistent runtime
/// (`weft dvm`): output sent to the launcher (`JobPlan::forward_output`,
/// `ToLauncher::Output`) and the control protocol of its submitters ([`ToController`]).
/// Version 9: a job control says through which call it was asked (`ToLauncher::JobControl::via`),
/// and submitters control sessions (`ToController::Session`). Version 10: native connects
/// (`CrossKind::NativeConnect`, `NativeDisconnect`), whose completion carries a PGCID
/// (`ConnectMsg::Done::pgcid`), and callers' withdrawal (`ConnectMsg::Withdraw`).
pub const RUNTIME_PROTOCOL_VERSION: u32 = 12;

/// Server to server (TCP): a hello, then messages each about one job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum PeerMsg {
    Hello {
        magic: [u8; 4],
        version: u32,
        secret: [u64; 2],
        node: u32,
    },
    /// A message between the servers of job `ns` (a server may serve several jobs).
    Job { ns: NsId, msg: JobMsg },
    /// The name service: requests to the root server, which keeps the published names,
    /// and its answers.
    Names(NamesMsg),
    /// A connect or disconnect of processes of one or several jobs (PMIx_Connect),
    /// completed by the root server.
    Connect(ConnectMsg),
}

/// Which collective across jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CrossKind {
    Connect,
    Disconnect,
    /// A PMIx fence whose participants are of several namespaces.
    Fence,
    /// A native connect (`Client::connect`): each server gathers its node's callers
    /// itself, and the root hands the connection a PGCID.
    NativeConnect,
    /// A native disconnect (`Client::disconnect`).
    NativeDisconnect,
}

impl CrossKind {
    /// Whether the servers gather the node's callers (a native call) rather than the
    /// node's PMIx library.
    pub fn is_native(self) -> bool {
        matches!(self, CrossKind::NativeConnect | CrossKind::NativeDisconnect)
    }
}

/// One collective across jobs: its participants (namespace, rank or `None` for the whole
/// namespace; sorted), which call, and how many such calls of the same participants came
/// before it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ConnectId {
    pub procs: Vec<(NsId, Option<Rank>)>,
    pub kind: CrossKind,
    pub seq: u64,
}

/// Inside [`PeerMsg::Connect`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConnectMsg {
    /// To the root server: node `node`'s participants of `id` all called it; `data`: their
    /// contribution (a fence's, as the node's PMIx library packed it).
    Arrive {
        id: ConnectId,
        node: u32,
        data: Vec<u8>,
    },
    /// To the root server: a node's callers of native call `id` gave up (their timeout),
    /// and why; the call fails for every node unless it completed already.
    Withdraw { id: ConnectId, reason: String },
    /// From the root server: `id` is complete (every node's contribution, concatenated),
    /// or why it cannot be; a native connect's PGCID.
    Done {
        id: ConnectId,
        result: Result<Vec<u8>, String>,
        pgcid: Option<u64>,
    },
}

/// Who makes a name-service request: the process, its namespace's name and its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameCaller {
    pub proc: weft_wireup::ProcId,
    pub nspace: String,
    pub node: u32,
}

/// Inside [`PeerMsg::Names`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NamesMsg {
    /// To the root server: request `qid` of node `from`'s process `who`.
    Req {
        qid: u64,
        from: u32,
        who: NameCaller,
        op: NameOp,
    },
    /// From the root server: the answer to request `qid`.
    Resp {
        qid: u64,
        result: Result<Vec<Published>, NameFailure>,
    },
}

/// [`PeerMsg::Job`] borrowed, for encoding a job's message without copying it: encodes
/// exactly as the owned envelope does (a unit test pins that).
#[derive(Serialize)]
enum PeerMsgRef<'a> {
    _Hello,
    Job { ns: NsId, msg: &'a JobMsg },
}

impl PeerMsg {
    /// The frame body of [`PeerMsg::Job`] with `ns` and `msg`, without copying `msg`.
    pub fn encode_job(ns: NsId, msg: &JobMsg) -> Vec<u8> {
        super::frame::encode(&PeerMsgRef::Job { ns, msg })
    }
}

/// What the servers of one job tell each other, inside [`PeerMsg::Job`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum JobMsg {
    /// One step of the Bruck all-gather of collective `id`: blocks keyed by node id.
    Gather {
        id: CollId,
        mode: FenceMode,
        step: u32,
        blocks: Vec<(u32, Vec<u8>)>,
        /// For group collectives: their directives and deadline.
        group: Option<GroupSpec>,
    },
    Abort {
        id: CollId,
        error: WireError,
    },
    ArrivalQuery {
        id: CollId,
        qid: u64,
    },
    ArrivalReply {
        qid: u64,
        node: u32,
        missing: Vec<Rank>,
    },
    /// A get of `key` of `rank` from another node: answered at once when `wait` is false
    /// or the key is there, else when the rank commits it or ends.
    ModexReq {
        qid: u64,
        rank: Rank,
        key: String,
        wait: bool,
    },
    ModexResp {
        qid: u64,
        rank: Rank,
        result: Result<ModexData, WireError>,
    },
    /// The asker gave up on request `qid`.
    ModexCancel {
        qid: u64,
    },
    /// `rank` died or finalized (`finalized`: it had finalized before it ended); `joined`
    /// are digests of the collectives it had joined.
    ProcGone {
        rank: Rank,
        reason: String,
        joined: Vec<u64>,
        finalized: bool,
    },
    /// `rank` left group `id`.
    GroupLeft {
        id: String,
        rank: Rank,
    },
    /// To the root server: `rank` (on `from`) claims the leadership of group `id`, whose
    /// members live on `nodes`.
    LeaderClaim {
        id: String,
        rank: Rank,
        from: u32,
        nodes: Vec<u32>,
    },
    /// From the root server: the decision on a claim (`winner` leads group `id`).
    LeaderDecision {
        id: String,
        claimant: Rank,
        winner: Rank,
    },
    /// From the root server: `rank` now leads group `id`.
    LeaderSelected {
        id: String,
        rank: Rank,
    },
    /// To the root server: define (`members: Some`) or delete a runtime process set.
    PsetChange {
        name: String,
        members: Option<Vec<Rank>>,
        from: u32,
        qid: u64,
    },
    /// To an invitee's server: `leader` (on `from`) invites `rank` into group `id`.
    Invite {
        id: String,
        leader: Rank,
        rank: Rank,
        procs: Vec<Rank>,
    },
    /// To the leader's server: `rank` answered the invitation into group `id`.
    InviteReply {
        id: String,
        rank: Rank,
        accept: bool,
    },
    /// To the root server: a PGCID, please (answered with `PgcidResp` to `from`).
    PgcidReq {
        qid: u64,
        from: u32,
    },
    /// From the root server.
    PgcidResp {
        qid: u64,
        pgcid: u64,
    },
    /// An invite-formed group is complete (to every member's node).
    GroupFormed {
        group: GroupInfo,
    },
    /// From the root server: the outcome of a process-set change, applied everywhere.
    PsetChanged {
        name: String,
        members: Option<Vec<Rank>>,
        qid: u64,
        error: Option<String>,
    },
    /// A PMIx client's direct modex: the PMIx server library's data of `rank` (which
    /// runs on the receiving node), once it committed it.
    PmixDmodexReq {
        qid: u64,
        rank: Rank,
    },
    /// The answer to `PmixDmodexReq` `qid`.
    PmixDmodexResp {
        qid: u64,
        result: Result<Vec<u8>, DmodexFailure>,
    },
    /// A PMIx client's event (`PMIx_Notify_event`) for processes on the receiving node:
    /// its status `code`, `source` rank, PMIx `range`, and infos as the notifying node's
    /// PMIx library packed them; `members`: the ranks of its custom range (for a
    /// `PMIX_GROUP_CONSTRUCT_COMPLETE`, the members of group `group`).
    PmixEvent {
        code: i32,
        source: Rank,
        range: u8,
        group: Option<String>,
        members: Vec<Rank>,
        info: Vec<u8>,
    },
    /// A PMIx tool's event (a debugger's `PMIX_DEBUGGER_RELEASE`, say) for the receiving
    /// node's clients: `source` is the tool's name (namespace, rank); the rest as
    /// [`JobMsg::PmixEvent`].
    PmixToolEvent {
        code: i32,
        source: (String, Rank),
        range: u8,
        info: Vec<u8>,
    },
}

/// Why a PMIx direct modex could not be answered (what the asking client is told).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DmodexFailure {
    /// The owner's library has no data of the process (not committed yet).
    NotFound,
    /// The process ended.
    ProcGone(String),
    /// The library timed out.
    Timeout,
    /// Anything else: why.
    Other(String),
}

/// How one process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitKind {
    Code(i32),
    Signal(i32),
    SpawnFailed(String),
}

impl ExitKind {
    /// "exited with code 3", "was killed by signal 9 (SIGKILL)", "could not be started: ...".
    pub fn describe(&self) -> String {
        match self {
            ExitKind::Code(c) => format!("exited with code {c}"),
            ExitKind::Signal(s) => format!("was killed by signal {s} ({})", signal_name(*s)),
            ExitKind::SpawnFailed(e) => format!("could not be started: {e}"),
        }
    }
}

/// The usual name of signal `s`.
pub fn signal_name(s: i32) -> &'static str {
    match s {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => "signal",
    }
}

/// What a server runs for one app context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppSpec {
    pub program: String,
    pub args: Vec<String>,
    pub cwd: Option<String>,
    /// Variables for this app's processes, after the job's (a spawned app's own).
    pub env: Vec<(String, String)>,
}

/// What the launcher tells every server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPlan {
    pub job: JobInfo,
    /// The job's namespace id in its runtime: its processes' hellos name it
    /// (`NsId::FIRST`: a runtime of `weft run` runs one job).
    pub ns: weft_wireup::NsId,
    pub apps: Vec<AppSpec>,
    pub tag_output: bool,
    /// Per rank, the CPUs to bind it to.
    pub bind: Vec<Option<CpuList>>,
    /// Bytes of each node's datastore segment.
    pub datastore_bytes: u64,
    /// Name prefix for shm segments and sockets of this job.
    pub job_id: String,
    /// Extra environment for every process.
    pub env: Vec<(String, String)>,
    /// Serve PMIx to the processes (an embedded PMIx server per node).
    pub pmix: bool,
    /// A job spawned through PMI (MPICH's `MPI_Comm_spawn`): its processes are told so
    /// (`PMI_SPAWNED=1`) and read these keys, the spawner's "preput" (the parent's port),
    /// as their job's own. `None` for every other job.
    pub pmi_preput: Option<Vec<(String, String)>>,
    /// The process that spawned this job, and its namespace's name (`None`: the job
    /// `weft run` started).
    pub parent: Option<(weft_wireup::ProcId, String)>,
    /// Send the processes' output to the launcher ([`ToLauncher::Output`]) instead of
    /// writing it to the server's own stdout and stderr: a job submitted to a persistent
    /// runtime, whose submitter prints it.
    pub forward_output: bool,
    /// Hold every process in `PMIx_Init` until a debugger releases it
    /// (`PMIX_DEBUG_STOP_IN_INIT`; `weft run --stop-in-init`).
    pub stop_in_init: bool,
    /// A debugger's daemons: the namespace of the job they debug (`PMIX_DEBUG_JOB`).
    pub debug_job: Option<String>,
}

/// A new job a running process asks for ([`ToLauncher::Spawn`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnReq {
    pub apps: Vec<SpawnApp>,
    /// Asked for through PMI: the keys its processes read as their job's
    /// ([`JobPlan::pmi_preput`]).
    pub pmi_preput: Option<Vec<(String, String)>>,
    /// The session to run in (`PMIX_SESSION_ID`, `PMIX_ALLOC_ID`); `None`: on the asking
    /// process's node.
    pub session: Option<SessionSel>,
    /// Not terminated with the job of the process that asked (`PMIX_SPAWN_CHILD_SEP`).
    pub separate: bool,
    /// What a debugger asked for.
    pub debug: DebugSpawn,
}

/// A debugger's directives to a spawn (PMIx: `PMIX_DEBUG_STOP_IN_INIT`,
/// `PMIX_DEBUGGER_DAEMONS` with `PMIX_DEBUG_JOB`, `PMIX_MAPBY` `ppr:N:node`,
/// `PMIX_NOTIFY_COMPLETION`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DebugSpawn {
    /// Hold the new job's processes in `PMIx_Init` until a debugger releases them.
    pub stop_in_init: bool,
    /// Debugger daemons for the job of this namespace: one per node of it (or
    /// `per_node`), each reading the namespace as `PMIX_DEBUG_JOB`.
    pub daemons_for: Option<String>,
    /// This many processes on every node (of the debugged job for daemons, else of the
    /// runtime), whatever the app asked for.
    pub per_node: Option<u32>,
    /// Tell the asker when the job ends ([`ToServer::JobTerminated`]).
    pub notify_completion: bool,
    /// The processes' stdout goes to the asking tool (`PMIX_FWD_STDOUT`,
    /// [`ToServer::ToolOutput`]), not to the runtime's output.
    pub forward_stdout: bool,
    /// Their stderr too (`PMIX_FWD_STDERR`).
    pub forward_stderr: bool,
}

/// A session named by a spawn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionSel {
    Id(u32),
    AllocId(String),
}

/// Server to launcher (TCP).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToLauncher {
    Hello {
        magic: [u8; 4],
        version: u32,
        secret: [u64; 2],
        node: u32,
    },
    Ready {
        peer_addr: SocketAddr,
    },
    /// How process `proc` ended.
    ProcExit {
        proc: weft_wireup::ProcId,
        how: ExitKind,
    },
    Failed {
        reason: String,
    },
    /// Process `from` asks for a new job (`Client::spawn`, `PMIx_Spawn`, PMI's spawn); the answer is
    /// [`ToServer::SpawnDone`] with the same `qid`.
    Spawn {
        qid: u64,
        from: weft_wireup::ProcId,
        req: SpawnReq,
    },
    /// A PMIx tool released job `ns`'s processes held in init (`PMIX_DEBUGGER_RELEASE`):
    /// the job's PMIx processes got it from their library; every server releases its
    /// Weft processes ([`ToServer::Release`]).
    Release {
        ns: NsId,
    },
    /// A PMIx tool connected to this server (not a process of any job: `tool` is its
    /// namespace and rank) asks for a new job; answered as [`ToLauncher::Spawn`] is.
    ToolSpawn {
        qid: u64,
        tool: (String, u32),
        req: SpawnReq,
    },
    /// Job `ns` was set up on this server and its processes here started, or why not;
    /// `set_up`: the job exists here, so the ends of its processes here will be reported
    /// (false: none of them was started).
    Launched {
        ns: NsId,
        error: Option<String>,
        set_up: bool,
    },
    /// Process `from` asks (`PMIx_Job_control`, or the native call) for `action` on
    /// `targets` (a rank, or a whole namespace); `via` names the call (in reports).
    JobControl {
        from: weft_wireup::ProcId,
        targets: Vec<(NsId, Option<Rank>)>,
        action: JobAction,
        via: String,
    },
    /// Process `from` asks for an allocation (`PMIx_Allocation_request`); the answer is
    /// [`ToServer::AllocDone`] with the same `qid`.
    Alloc {
        qid: u64,
        from: weft_wireup::ProcId,
        req: AllocReq,
    },
    /// This node's processes of job `ns` all started (or failed to): the pids of those
    /// that did, by rank (for tools: MPIR, `PMIX_QUERY_PROC_TABLE`).
    Pids {
        ns: NsId,
        pids: Vec<(Rank, u32)>,
    },
    /// Output of a process of job `ns` (one whose plan says `forward_output`): whole
    /// lines, sent before the process's `ProcExit`.
    Output {
        ns: NsId,
        rank: Rank,
        stderr: bool,
        bytes: Vec<u8>,
    },
}

/// Launcher to server (TCP).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToServer {
    Plan(Box<JobPlan>),
    Start {
        peers: Vec<SocketAddr>,
    },
    /// Terminate every process of every job.
    Terminate {
        grace_ms: u64,
    },
    Shutdown,
    /// Set up another job (a spawned one) and start its processes on this node; answered
    /// with [`ToLauncher::Launched`].
    Launch(Box<JobPlan>),
    /// Terminate the processes of job `ns` only.
    TerminateJob {
        ns: NsId,
        grace_ms: u64,
    },
    /// Job `ns` is over (every process of it ended): forget it, remove its segments.
    EndJob {
        ns: NsId,
    },
    /// The answer to the [`ToLauncher::Alloc`] of `qid`: the session, or why not.
    AllocDone {
        qid: u64,
        result: Result<SessionInfo, String>,
    },
    /// An allocation request of process `owner` completed (`session`: its session's
    /// state; `None`: it failed): every server records it (for
    /// `PMIX_QUERY_ALLOC_STATUS`) and tells its local processes of `owner`'s job
    /// (`PMIX_NOTIFY_ALLOC_COMPLETE`).
    AllocEvent {
        owner: weft_wireup::ProcId,
        alloc_id: String,
        session: Option<SessionInfo>,
    },
    /// Send signal `sig` to the processes of `procs` on this node (a rank, or every
    /// process of a namespace).
    Signal {
        procs: Vec<(NsId, Option<Rank>)>,
        sig: i32,
    },
    /// Another node's [`ToLauncher::Pids`] for job `ns`, passed on to every server.
    Pids {
        ns: NsId,
        pids: Vec<(Rank, u32)>,
    },
    /// The answer to the [`ToLauncher::Spawn`] of `qid`: the new job's namespace id and
    /// name, or why there is none.
    SpawnDone {
        qid: u64,
        result: Result<(NsId, String), String>,
    },
    /// Job `ns`'s processes held in init for a debugger go on (after `MPIR_Breakpoint`,
    /// or a PMIx tool's release, which its PMIx processes got already: `pmix_done`).
    Release {
        ns: NsId,
        pmix_done: bool,
    },
    /// Job `nspace`, which `to` (a process or tool served here) spawned asking to hear of
    /// its end, ended with status `code`.
    JobTerminated {
        to: (String, u32),
        nspace: String,
        code: i32,
    },
    /// Output of process `rank` of job `nspace`, for the PMIx tool served here that
    /// spawned it asking for it (`PMIX_FWD_STDOUT`, `PMIX_FWD_STDERR`).
    ToolOutput {
        nspace: String,
        rank: Rank,
        stderr: bool,
        bytes: Vec<u8>,
    },
}

/// An allocation request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocReq {
    pub op: AllocOp,
    /// How many nodes (new, extend; default 1).
    pub nodes: Option<u32>,
    /// The allocation's name (chosen for a new one; naming the one to extend or release).
    pub alloc_id: Option<String>,
    /// The requester's own reference.
    pub req_id: Option<String>,
    /// The session to extend or release.
    pub session: Option<u32>,
    /// A new session that does not end with the job that asked (`PMIX_ALLOC_CHILD_SEP`).
    pub separate: bool,
}

/// A session of the runtime as its servers know it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub id: u32,
    pub alloc_id: String,
    /// Its nodes (ids) and their host names.
    pub nodes: Vec<u32>,
    pub hostnames: Vec<String>,
    /// The process that asked for it (it ends with that process's job).
    pub owner: weft_wireup::ProcId,
    /// False once it ended (released, or its owner ended).
    pub active: bool,
}

/// The first bytes of a submitter's hello to a persistent runtime's controller.
pub const CONTROL_MAGIC: [u8; 4] = *b"WFTC";

/// A submitter (`weft run --dvm`, `weft ps`, `weft kill`, `weft dvm stop`) to the
/// controller of a persistent runtime (TCP, the runtime's frames): a hello, then requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToController {
    Hello {
        magic: [u8; 4],
        version: u32,
        secret: [u64; 2],
    },
    /// Run a job: `weft run`'s arguments (`-x VAR` already resolved to `-x VAR=VALUE`),
    /// the submitter's directory and environment, which the job's processes get.
    Submit {
        args: Vec<String>,
        cwd: String,
        env: Vec<(String, String)>,
    },
    /// The submitter received signal `sig`: its job is terminated.
    Signal { sig: i32 },
    /// The table of jobs and processes.
    Ps,
    /// Terminate a job (by namespace name or number) with signal `sig`'s status.
    Kill { job: String, sig: i32 },
    /// End every job and the runtime.
    Stop,
    /// Control the runtime's allocation sessions (`weft session new|end|pause|resume`).
    Session(SessionCtl),
}

/// What `weft session` asks of a persistent runtime (a scheduler's session control). A
/// session is named by its number or allocation id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionCtl {
    /// A new session of `nodes` logical nodes no other session holds; it lasts until
    /// ended (or the runtime stops).
    New {
        nodes: u32,
        alloc_id: Option<String>,
    },
    /// End a session: its jobs are terminated.
    End { session: String },
    /// Stop (SIGSTOP) every process of the session's jobs.
    Pause { session: String },
    /// Continue (SIGCONT) them.
    Resume { session: String },
}

/// The controller to a submitter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromController {
    /// The hello was accepted.
    Welcome { runtime: String },
    /// The submitted job runs, as namespace `nspace`.
    Accepted { ns: NsId, nspace: String },
    /// Output of the job's processes (or of the jobs they spawned).
    Output { stderr: bool, bytes: Vec<u8> },
    /// A line about the job for the submitter's stderr (a failure, the time limit).
    Report(String),
    /// The job ended; `weft run` exits with `code`.
    JobEnd { code: i32 },
    /// The answer to `Ps`, `Kill` or `Stop`.
    Text(String),
    /// A request was refused; why.
    Error(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_borrowed_job_message_encodes_as_the_owned_envelope() {
        let msg = JobMsg::ModexReq {
            qid: 7,
            rank: 3,
            key: "card".into(),
            wait: true,
        };
        let owned = super::super::frame::encode(&PeerMsg::Job {
            ns: NsId(300),
            msg: msg.clone(),
        });
        assert_eq!(PeerMsg::encode_job(NsId(300), &msg), owned);
        let back = super::super::frame::read_sync::<PeerMsg>(&mut &owned[..], 1 << 20).unwrap();
        assert!(matches!(
            back,
            PeerMsg::Job {
                ns: NsId(300),
                msg: JobMsg::ModexReq {
                    qid: 7,
                    rank: 3,
                    ..
                }
            }
        ));
    }
}
