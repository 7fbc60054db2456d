//! The server side of PMIx: how a Weft server hosts unmodified PMIx clients (Open MPI
//! programs, PMIx tools) through OpenPMIx's server library.
//!
//! [`Server::init`] starts the library (its own progress thread, a Unix socket in the
//! directory given) with Weft's callbacks; [`Server::register_nspace`] tells it the job
//! ([`Nspace`]: sizes, nodes, local peers, per-process data), [`Server::register_client`]
//! and [`Server::setup_fork`] prepare each local child. What the clients ask that needs
//! the host (a fence, another node's data, an abort) reaches the [`Host`] given at init,
//! on the library's thread; the host answers later, from any thread, through the
//! [`ModexReply`] it was handed. A reply that is dropped unanswered fails the operation
//! (the client gets an error rather than waiting forever).
//!
//! One server per process: the library allows no second.

use std::time::Duration;

use crate::PmixError;

/// A process name as the library gives it: namespace and rank (`None`: the wildcard,
/// every process of the namespace).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProcName {
    /// Its namespace.
    pub nspace: String,
    /// Its rank, or `None` for the wildcard.
    pub rank: Option<u32>,
}

/// Why the host could not complete an operation (the status the client sees).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A participant or the process asked about ended (`PMIX_ERR_PROC_ABORTED`).
    ProcGone,
    /// The operation's `PMIX_TIMEOUT` passed (`PMIX_ERR_TIMEOUT`).
    Timeout,
    /// No such data (`PMIX_ERR_NOT_FOUND`).
    NotFound,
    /// The request names what the host does not serve (`PMIX_ERR_NOT_SUPPORTED`).
    NotSupported,
    /// The participants' requests disagree, or one is malformed (`PMIX_ERR_BAD_PARAM`).
    Invalid,
    /// The name is published already (`PMIX_EXISTS`, which Open MPI's
    /// `MPI_Publish_name` turns into `MPI_ERR_FILE_EXISTS`).
    Duplicate,
    /// Not enough resources (`PMIX_ERR_OUT_OF_RESOURCE`).
    OutOfResource,
    /// Anything else (`PMIX_ERROR`).
    Other,
}

/// A collective fence of local clients, handed to [`Host::fence`].
#[derive(Debug)]
pub struct Fence {
    /// The participants.
    pub procs: Vec<ProcName>,
    /// `PMIX_COLLECT_DATA`: the participants' committed data must reach every participant.
    pub collect: bool,
    /// `PMIX_TIMEOUT`, if given.
    pub timeout: Option<Duration>,
    /// This node's contribution (the library's packed data of its local participants).
    pub data: Vec<u8>,
    /// Where the result goes: the contributions of every node, concatenated.
    pub reply: ModexReply,
}

/// A request for another node's process's data, handed to [`Host::direct_modex`].
#[derive(Debug)]
pub struct DirectModex {
    /// Whose data.
    pub proc: ProcName,
    /// `PMIX_TIMEOUT`, if given.
    pub timeout: Option<Duration>,
    /// Where the data goes: what [`Server::dmodex_request`] gave on the owner's node.
    pub reply: ModexReply,
}

/// A group operation of local clients (`PMIx_Group_construct`/`destruct`), handed to
/// [`Host::group`] once the node's members all called it.
#[derive(Debug)]
pub struct Group {
    /// Construct (`true`) or destruct.
    pub construct: bool,
    /// The group's id.
    pub id: String,
    /// Its members.
    pub procs: Vec<ProcName>,
    /// `PMIX_GROUP_ASSIGN_CONTEXT_ID`.
    pub assign_context_id: bool,
    /// `PMIX_GROUP_OPTIONAL`.
    pub optional: bool,
    /// `PMIX_GROUP_NOTIFY_TERMINATION`.
    pub notify_termination: bool,
    /// `PMIX_TIMEOUT`, if given.
    pub timeout: Option<Duration>,
    /// `PMIX_GROUP_ENDPT_DATA`: this node's members' packed contribution.
    pub endpt: Vec<u8>,
    /// Where the result goes.
    pub reply: GroupReply,
}

/// One query of a `PMIx_Query_info` the library passes to its host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryKey {
    /// The key asked for (`pmix.qry.psets`, `pmix.qry.pmems`, ...).
    pub key: String,
    /// The process set it is about (`PMIX_PSET_NAME` qualifier), if any.
    pub pset: Option<String>,
    /// The allocation it is about (`PMIX_ALLOC_ID` qualifier), if any.
    pub alloc_id: Option<String>,
    /// The namespace it is about (`PMIX_NSPACE` qualifier), if any.
    pub nspace: Option<String>,
}

/// What became of a process, as a tool's process table shows it (`pmix_proc_state_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcState {
    /// Being started (`PMIX_PROC_STATE_LAUNCH_UNDERWAY`).
    Starting,
    /// Running (`PMIX_PROC_STATE_RUNNING`).
    Running,
    /// Ended (`PMIX_PROC_STATE_TERMINATED`).
    Terminated,
}

/// One row of a process table (`pmix_proc_info_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    /// Its namespace.
    pub nspace: String,
    /// Its rank.
    pub rank: u32,
    /// The host it runs on.
    pub hostname: String,
    /// Its executable (as started).
    pub executable: String,
    /// Its pid (0 while not started).
    pub pid: u32,
    /// Its exit code, once ended.
    pub exit_code: i32,
    /// Its state.
    pub state: ProcState,
}

/// A tool connecting (`PMIx_tool_init` against this server), handed to
/// [`Host::tool_connected`].
#[derive(Debug)]
pub struct ToolConnect {
    /// The name the tool gave itself (`PMIX_TOOL_NSPACE`, `PMIX_TOOL_RANK`), if any;
    /// without one the host assigns one.
    pub name: Option<ProcName>,
    /// The tool's pid (`PMIX_PROC_PID`), if it said.
    pub pid: Option<u32>,
    /// Its command line (`PMIX_CMD_LINE`), if it said.
    pub cmdline: Option<String>,
    /// Where the name it is given goes.
    pub reply: ToolReply,
}

/// Which tool connections a server accepts ([`Server::init`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolSupport {
    /// Tools of this user, found by the server's pid or namespace, or by URI
    /// (`PMIX_SERVER_TOOL_SUPPORT`; the library writes `pmix.<host>.tool.<pid>` in the
    /// server's directory).
    pub tools: bool,
    /// Also as the node's system server (`PMIX_SERVER_SYSTEM_SUPPORT`:
    /// `pmix.sys.<host>` in the system temporary directory, `$TMPDIR` or `/tmp`; the
    /// library removes it at finalize, [`remove_stale_system_file`] after a crash).
    pub system: bool,
}

/// An answer to one query key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryAnswer {
    /// `PMIX_QUERY_PSET_NAMES`: the process sets' names (sent comma-delimited).
    PsetNames(Vec<String>),
    /// `PMIX_QUERY_NUM_PSETS`: how many there are.
    NumPsets(usize),
    /// `PMIX_QUERY_PSET_MEMBERSHIP`: the members of the set named in the query.
    PsetMembers(Vec<ProcName>),
    /// `PMIX_QUERY_ALLOC_STATUS`: the state of the allocation named in the query.
    AllocStatus(String),
    /// `PMIX_QUERY_NAMESPACES`: the active namespaces (sent comma-delimited).
    Namespaces(Vec<String>),
    /// `PMIX_QUERY_NAMESPACE_INFO`: each active namespace with its command line.
    NamespaceInfo(Vec<(String, String)>),
    /// `PMIX_QUERY_PROC_TABLE` (or `PMIX_QUERY_LOCAL_PROC_TABLE` when `local`): the
    /// processes of the namespace named in the query.
    ProcTable {
        /// Only this node's processes were asked for.
        local: bool,
        /// The rows, in rank order.
        procs: Vec<ProcInfo>,
    },
    /// `PMIX_QUERY_SPAWN_SUPPORT`: the spawn attributes served (sent comma-delimited).
    SpawnSupport(Vec<String>),
    /// `PMIX_QUERY_DEBUG_SUPPORT`: the debugger attributes served (sent comma-delimited).
    DebugSupport(Vec<String>),
    /// `PMIX_JOB_SIZE` of the namespace named in the query.
    JobSize(u32),
    /// `PMIX_QUERY_JOB_STATUS`: the state of the namespace named in the query, as a
    /// status (`PMIX_SUCCESS` while it runs, else how it ended).
    JobStatus(i32),
    /// The answer to an allocation request: `PMIX_SESSION_ID`, `PMIX_ALLOC_ID` and the
    /// nodes (`PMIX_ALLOC_NODE_LIST`, comma-delimited host names).
    Allocated {
        /// The new session's id.
        session: u32,
        /// The allocation's name.
        alloc_id: String,
        /// Its nodes' host names.
        nodes: Vec<String>,
    },
}

/// Removes the system server's rendezvous file (`pmix.sys.<host>` in the system
/// temporary directory) if the server that wrote it (its third line: the pid) is gone.
pub fn remove_stale_system_file(host: &str) {
    let path = std::env::temp_dir().join(format!("pmix.sys.{host}"));
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let pid = text
        .lines()
        .nth(2)
        .and_then(|l| l.trim().parse::<u32>().ok());
    if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
        let _ = std::fs::remove_file(&path);
    }
}

/// `PMIX_SPAWN_CHILD_SEP` of OpenPMIx 5 (not in 4.2's headers).
pub const SPAWN_CHILD_SEP: &[u8] = b"pmix.spchildsep\0";
/// `PMIX_ALLOC_CHILD_SEP` of OpenPMIx 5 (not in 4.2's headers).
pub const ALLOC_CHILD_SEP: &[u8] = b"pmix.alloc.sep\0";

/// What a `PMIx_Allocation_request` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocDirective {
    /// `PMIX_ALLOC_NEW`: a new allocation (a child session).
    New,
    /// `PMIX_ALLOC_EXTEND`: more nodes for an allocation.
    Extend,
    /// `PMIX_ALLOC_RELEASE`: give an allocation (or some of its nodes) back.
    Release,
    /// Anything else (`PMIX_ALLOC_REAQUIRE`, external): this number.
    Other(u8),
}

/// A `PMIx_Allocation_request` of a local client, handed to [`Host::allocate`].
#[derive(Debug)]
pub struct Allocate {
    /// Who asks.
    pub requester: ProcName,
    /// What for.
    pub directive: AllocDirective,
    /// `PMIX_ALLOC_NUM_NODES`.
    pub nodes: Option<u64>,
    /// `PMIX_ALLOC_ID`: the allocation's name (given for a new one, or naming the one to
    /// extend or release).
    pub alloc_id: Option<String>,
    /// `PMIX_ALLOC_REQ_ID`: the requester's own reference.
    pub req_id: Option<String>,
    /// `PMIX_SESSION_ID`: the session to extend or release.
    pub session: Option<u32>,
    /// `PMIX_ALLOC_CHILD_SEP` (`"pmix.alloc.sep"`, OpenPMIx 5's name; not in 4.2's
    /// headers): the session does not end with the job that asked for it.
    pub separate: bool,
    /// The keys given that are not served (CPU counts, memory, fabric, time, ...).
    pub ignored: Vec<String>,
    /// Where the answer goes ([`QueryAnswer::Allocated`], or a failure).
    pub reply: GroupReply,
}

/// A `PMIx_Query_info` of a local client, handed to [`Host::query`].
#[derive(Debug)]
pub struct Query {
    /// Who asks (its namespace says which job the query is about).
    pub requester: ProcName,
    /// What is asked.
    pub keys: Vec<QueryKey>,
    /// Where the answers go.
    pub reply: GroupReply,
}

/// A `PMIx_Log` channel (the key of one entry of the data logged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogChannel {
    /// `PMIX_LOG_STDERR`: the process's standard error, as its launcher forwards it.
    Stderr,
    /// `PMIX_LOG_STDOUT`: its standard output.
    Stdout,
    /// `PMIX_LOG_SYSLOG`: the system log (the local one unless the host says otherwise).
    Syslog,
    /// `PMIX_LOG_LOCAL_SYSLOG`: the node's system log.
    LocalSyslog,
    /// `PMIX_LOG_GLOBAL_SYSLOG`: the system log of the cluster's gateway.
    GlobalSyslog,
    /// Any other channel (`PMIX_LOG_EMAIL`, `PMIX_LOG_GLOBAL_DATASTORE`, ...): its key.
    Other(String),
}

/// A `PMIx_Log` of a local client, handed to [`Host::log`]: what the library's own
/// channels did not take (OpenPMIx 4.2 writes `PMIX_LOG_SYSLOG` and
/// `PMIX_LOG_LOCAL_SYSLOG` to the node's syslog itself, then hands every entry to the
/// host as well).
#[derive(Debug)]
pub struct Log {
    /// Who logs (`PMIX_LOG_SOURCE`, else the client).
    pub source: ProcName,
    /// The entries, in order: channel and text (empty for a value that is not a string).
    pub entries: Vec<(LogChannel, String)>,
    /// `PMIX_LOG_TIMESTAMP` (seconds since the epoch): the client asked for one
    /// (`PMIX_LOG_GENERATE_TIMESTAMP`) or gave it.
    pub timestamp: Option<i64>,
    /// `PMIX_LOG_TIMESTAMP_OUTPUT`: prefix the output with the time it is written.
    pub timestamp_output: bool,
    /// `PMIX_LOG_SYSLOG_PRI`, if given.
    pub syslog_priority: Option<i32>,
    /// `PMIX_LOG_ONCE`: one channel that takes the message is enough.
    pub once: bool,
    /// Where the status goes.
    pub reply: OpReply,
}

/// The range of an event (`pmix_data_range_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// `PMIX_RANGE_LOCAL`: this node's clients only.
    Local,
    /// `PMIX_RANGE_PROC_LOCAL`: the source only.
    ProcLocal,
    /// `PMIX_RANGE_CUSTOM`: the processes named by `PMIX_EVENT_CUSTOM_RANGE`.
    Custom,
    /// Any other (namespace, session, global, resource manager): every node.
    Other(u8),
}

impl Range {
    /// The range of `pmix_data_range_t` `r`.
    pub fn from_raw(r: u8) -> Range {
        match r {
            2 => Range::Local,
            6 => Range::Custom,
            7 => Range::ProcLocal,
            other => Range::Other(other),
        }
    }

    /// Its `pmix_data_range_t`.
    pub fn raw(self) -> u8 {
        match self {
            Range::Local => 2,
            Range::Custom => 6,
            Range::ProcLocal => 7,
            Range::Other(r) => r,
        }
    }
}

/// An event a local client notified (`PMIx_Notify_event`) with a range beyond its node,
/// handed to [`Host::notify_event`] after the library delivered it to the node's
/// clients: the host carries it to the other nodes' servers, whose
/// [`Server::notify_packed`] delivers it there.
#[derive(Debug)]
pub struct Notification {
    /// The event's status code.
    pub code: i32,
    /// Who notified it.
    pub source: ProcName,
    /// Its range.
    pub range: Range,
    /// `PMIX_EVENT_CUSTOM_RANGE`: the processes it is for, if named.
    pub targets: Option<Vec<ProcName>>,
    /// `PMIX_GROUP_ID`, if given (group events).
    pub group: Option<String>,
    /// Every info of the event, packed by the library (for `Server::notify_packed`).
    pub info: Vec<u8>,
    /// Where the status goes (the notifying client's `PMIx_Notify_event` returns it).
    pub reply: OpReply,
}

/// OpenPMIx's event codes the host looks at.
pub mod codes {
    /// `PMIX_GROUP_INVITED`.
    pub const GROUP_INVITED: i32 = -159;
    /// `PMIX_GROUP_INVITE_ACCEPTED`.
    pub const GROUP_INVITE_ACCEPTED: i32 = -161;
    /// `PMIX_GROUP_INVITE_DECLINED`.
    pub const GROUP_INVITE_DECLINED: i32 = -162;
    /// `PMIX_GROUP_CONSTRUCT_COMPLETE`.
    pub const GROUP_CONSTRUCT_COMPLETE: i32 = -166;
    /// `PMIX_ERR_JOB_TERMINATED`.
    pub const JOB_TERMINATED: i32 = -145;
    /// `PMIX_READY_FOR_DEBUG`.
    pub const READY_FOR_DEBUG: i32 = -58;
    /// `PMIX_DEBUGGER_RELEASE`.
    pub const DEBUGGER_RELEASE: i32 = -3;
}

/// What the host does for the library (called on the library's progress thread: return
/// quickly; answer through the replies later, from any thread).
pub trait Host: Send + Sync + 'static {
    /// A local client connected (`PMIx_Init`).
    fn connected(&self, proc: ProcName);
    /// A local client called `PMIx_Finalize`.
    fn finalized(&self, proc: ProcName);
    /// A local client called `PMIx_Abort` with `status` and `message`, naming the
    /// processes to end (empty: its whole namespace).
    fn abort(&self, proc: ProcName, status: i32, message: String, targets: Vec<ProcName>);
    /// The local participants of a fence all arrived.
    fn fence(&self, fence: Fence);
    /// A local client asks for data of a process on another node.
    fn direct_modex(&self, req: DirectModex);
    /// A group construct or destruct of local clients.
    fn group(&self, req: Group);
    /// A query of a local client or a tool (answer with [`GroupReply::answers`]).
    fn query(&self, req: Query);
    /// A tool connects: give it a name (its own, or one assigned) or refuse it. Tools
    /// are refused unless overridden.
    fn tool_connected(&self, req: ToolConnect) {
        req.reply.fail(Failure::NotSupported);
    }
    /// A `PMIx_Log` of a local client.
    fn log(&self, req: Log);
    /// An event a local client notified beyond its node.
    fn notify_event(&self, ev: Notification);
    /// A local client asks for a new job (`PMIx_Spawn`); answer with [`SpawnReply`].
    fn spawn(&self, req: Spawn);
    /// A local client publishes names (`PMIx_Publish`). Not served unless overridden.
    fn publish(&self, req: Publish) {
        req.reply.fail(Failure::NotSupported);
    }
    /// A local client looks names up (`PMIx_Lookup`). Not served unless overridden.
    fn lookup(&self, req: Lookup) {
        req.reply.fail(Failure::NotSupported);
    }
    /// A local client withdraws names (`PMIx_Unpublish`). Not served unless overridden.
    fn unpublish(&self, req: Unpublish) {
        req.reply.fail(Failure::NotSupported);
    }
    /// The local participants of a `PMIx_Connect` or `PMIx_Disconnect` all called it.
    /// Not served unless overridden.
    fn connect(&self, req: Connect) {
        req.reply.fail(Failure::NotSupported);
    }
    /// A local client's `PMIx_Allocation_request`. Not served unless overridden.
    fn allocate(&self, req: Allocate) {
        req.reply.fail(Failure::NotSupported);
    }
    /// A local client's `PMIx_Job_control`. Not served unless overridden.
    fn job_control(&self, req: JobControl) {
        req.reply.fail(Failure::NotSupported);
    }
}

/// A `PMIx_Connect` or `PMIx_Disconnect` (a collective of processes of one or several
/// namespaces), handed to [`Host::connect`] once this node's participants all called it.
#[derive(Debug)]
pub struct Connect {
    /// The participants (a wildcard rank: the whole namespace).
    pub procs: Vec<ProcName>,
    /// `PMIx_Disconnect`.
    pub disconnect: bool,
    /// `PMIX_TIMEOUT`, if given.
    pub timeout: Option<Duration>,
    /// Where the status goes, once every participant called it.
    pub reply: OpReply,
}

/// A published value as the host keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PubValue {
    /// A `PMIX_STRING`.
    Str(String),
    /// A `PMIX_BYTE_OBJECT`.
    Bytes(Vec<u8>),
    /// Any other type: the info as the library packed it (`PMIx_Data_pack`).
    Packed(Vec<u8>),
}

/// How long a published name lives (`PMIX_PERSISTENCE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    /// `PMIX_PERSIST_INDEF`.
    Indef,
    /// `PMIX_PERSIST_FIRST_READ`.
    FirstRead,
    /// `PMIX_PERSIST_PROC`.
    Proc,
    /// `PMIX_PERSIST_APP`.
    App,
    /// `PMIX_PERSIST_SESSION` (also when none is given).
    Session,
}

/// A `PMIx_Publish` of a local client, handed to [`Host::publish`].
#[derive(Debug)]
pub struct Publish {
    /// Who publishes.
    pub requester: ProcName,
    /// `PMIX_RANGE` (`None`: not given).
    pub range: Option<Range>,
    /// `PMIX_PERSISTENCE`.
    pub persist: Persist,
    /// The names: key and value.
    pub data: Vec<(String, PubValue)>,
    /// Where the status goes.
    pub reply: OpReply,
}

/// A `PMIx_Lookup` of a local client, handed to [`Host::lookup`].
#[derive(Debug)]
pub struct Lookup {
    /// Who looks.
    pub requester: ProcName,
    /// `PMIX_RANGE` (`None`: not given).
    pub range: Option<Range>,
    /// The keys.
    pub keys: Vec<String>,
    /// `PMIX_WAIT`: answer once every key is published.
    pub wait: bool,
    /// `PMIX_TIMEOUT`, if given.
    pub timeout: Option<Duration>,
    /// Where the names go.
    pub reply: LookupReply,
}

/// A `PMIx_Unpublish` of a local client, handed to [`Host::unpublish`].
#[derive(Debug)]
pub struct Unpublish {
    /// Who withdraws.
    pub requester: ProcName,
    /// `PMIX_RANGE` (`None`: not given).
    pub range: Option<Range>,
    /// The keys (empty: all the requester published).
    pub keys: Vec<String>,
    /// Where the status goes.
    pub reply: OpReply,
}

/// A name a lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its key.
    pub key: String,
    /// Its publisher.
    pub publisher: ProcName,
    /// Its value.
    pub value: PubValue,
}

/// One app of a [`Spawn`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnApp {
    /// The program.
    pub cmd: String,
    /// Its arguments, without the program's name (`argv[1..]`).
    pub args: Vec<String>,
    /// `NAME=VALUE` settings for its processes.
    pub env: Vec<(String, String)>,
    /// Its working directory, if given.
    pub cwd: Option<String>,
    /// How many processes.
    pub maxprocs: u32,
}

/// A debugger's directives to a [`Spawn`], from the job's or an app's information.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpawnDebug {
    /// `PMIX_DEBUG_STOP_IN_INIT`: the processes wait in `PMIx_Init` for the debugger's
    /// release (`PMIX_ERR_DEBUGGER_RELEASE`).
    pub stop_in_init: bool,
    /// `PMIX_DEBUGGER_DAEMONS`: these are a debugger's daemons.
    pub daemons: bool,
    /// `PMIX_DEBUG_JOB` (or the namespace of `PMIX_DEBUG_TARGET`): the job being debugged;
    /// daemons go one per node of it, and read it as `PMIX_DEBUG_JOB`.
    pub target: Option<String>,
    /// `PMIX_MAPBY` `ppr:N:node`: N processes on every node.
    pub per_node: Option<u32>,
    /// `PMIX_NOTIFY_COMPLETION`: the asker hears `PMIX_ERR_JOB_TERMINATED` at the job's end.
    pub notify_completion: bool,
    /// `PMIX_FWD_STDOUT`: the processes' stdout goes to the asking tool
    /// ([`Server::iof_deliver`]).
    pub fwd_stdout: bool,
    /// `PMIX_FWD_STDERR`: their stderr too.
    pub fwd_stderr: bool,
}

/// What a `PMIx_Job_control` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobCtrl {
    /// Only informational directives (`PMIX_JOB_CTRL_PREEMPTIBLE`,
    /// `PMIX_JOB_CTRL_CHECKPOINT_METHOD`, ...: their keys): nothing to do but note them.
    Note(Vec<String>),
    /// `PMIX_JOB_CTRL_KILL`: SIGKILL.
    Kill,
    /// `PMIX_JOB_CTRL_TERMINATE`: SIGTERM, then SIGKILL after a grace period.
    Terminate,
    /// `PMIX_JOB_CTRL_SIGNAL`: this signal.
    Signal(i32),
    /// `PMIX_JOB_CTRL_PAUSE`: SIGSTOP.
    Pause,
    /// `PMIX_JOB_CTRL_RESUME`: SIGCONT.
    Resume,
}

/// A `PMIx_Job_control` of a local client, handed to [`Host::job_control`].
#[derive(Debug)]
pub struct JobControl {
    /// Who asks.
    pub requestor: ProcName,
    /// The processes it is about (a wildcard rank: a whole namespace; none: the
    /// requestor's namespace).
    pub targets: Vec<ProcName>,
    /// What to do.
    pub action: JobCtrl,
    /// Where the status goes.
    pub reply: GroupReply,
}

/// A `PMIx_Spawn` of a local client, handed to [`Host::spawn`].
#[derive(Debug)]
pub struct Spawn {
    /// Who asks.
    pub requester: ProcName,
    /// What to start.
    pub apps: Vec<SpawnApp>,
    /// `PMIX_SESSION_ID` of the job info: the session to start it in.
    pub session: Option<u32>,
    /// `PMIX_ALLOC_ID` of the job info: the allocation to start it in.
    pub alloc_id: Option<String>,
    /// `PMIX_SPAWN_CHILD_SEP` (`"pmix.spchildsep"`, OpenPMIx 5's name; not in 4.2's
    /// headers) in the job info: the new job is not terminated with its parent.
    pub separate: bool,
    /// What a debugger asked for (job or app info).
    pub debug: SpawnDebug,
    /// Where the new job's namespace goes.
    pub reply: SpawnReply,
}

/// One job as the library must know it before its clients start.
#[derive(Debug, Clone, Default)]
pub struct Nspace {
    /// Its namespace.
    pub nspace: String,
    /// This node's id.
    pub node: u32,
    /// The node names, by node id.
    pub hostnames: Vec<String>,
    /// The node of every rank.
    pub node_of: Vec<u32>,
    /// The application number of every rank.
    pub app_of: Vec<u32>,
    /// The rank of every process among the processes of its node.
    pub local_rank_of: Vec<u32>,
    /// The locality string of every rank, where known.
    pub locality_of: Vec<Option<String>>,
    /// The job's scratch directory (`PMIX_TMPDIR`, `PMIX_NSDIR`).
    pub tmpdir: String,
    /// This node runs more of the job's processes than it has CPUs for them
    /// (`PMIX_NODE_OVERSUBSCRIBED`: MPI libraries then yield while they wait).
    pub oversubscribed: bool,
    /// The process that spawned this job (namespace, rank): `PMIX_SPAWNED` and
    /// `PMIX_PARENT_ID` in the job's information. `None` for a job started otherwise.
    pub parent: Option<(String, u32)>,
    /// Hold every process in `PMIx_Init` until a debugger's `PMIX_DEBUGGER_RELEASE`
    /// (`PMIX_DEBUG_STOP_IN_INIT` in the job's information).
    pub stop_in_init: bool,
    /// A debugger's daemons: the namespace of the job they debug (`PMIX_DEBUG_JOB`).
    pub debug_job: Option<String>,
}

impl Nspace {
    /// The ranks on `node`, ascending.
    pub fn ranks_on(&self, node: u32) -> Vec<u32> {
        (0..self.node_of.len() as u32)
            .filter(|&r| self.node_of[r as usize] == node)
            .collect()
    }

    /// The nodes that hold ranks of the job, ascending (a spawned job may leave some of
    /// the runtime's nodes out; PMIx's maps list only the job's nodes, as PRRTE's do, and
    /// refuse an empty entry).
    pub fn job_nodes(&self) -> Vec<u32> {
        let mut nodes: Vec<u32> = self.node_of.clone();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// PMIx's list of the job's node names (`PMIX_NODE_MAP` unreduced): `n0,n1`.
    pub fn node_map(&self) -> String {
        self.job_nodes()
            .iter()
            .filter_map(|&n| self.hostnames.get(n as usize).map(String::as_str))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// PMIx's per-node list of ranks (`PMIX_PROC_MAP` unreduced) over the job's nodes, in
    /// the order of [`Nspace::node_map`]: `0,1;2,3`.
    pub fn proc_map(&self) -> String {
        self.job_nodes()
            .into_iter()
            .map(|n| {
                self.ranks_on(n)
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect::<Vec<_>>()
            .join(";")
    }
}

#[cfg(weft_pmix)]
pub use imp::{preload, GroupReply, ModexReply, Server};
#[cfg(weft_pmix)]
pub use log::{log_time, OpReply};
#[cfg(weft_pmix)]
pub use names::LookupReply;
#[cfg(weft_pmix)]
pub use spawn::SpawnReply;
#[cfg(weft_pmix)]
pub use tools::ToolReply;
/// Where a query's answers go (the same callback as a group operation's).
pub type QueryReply = GroupReply;

#[cfg(not(weft_pmix))]
pub use stub::{
    log_time, preload, GroupReply, LookupReply, ModexReply, OpReply, Server, SpawnReply, ToolReply,
};

#[cfg(not(weft_pmix))]
mod stub;

#[cfg(weft_pmix)]
mod alloc;
#[cfg(weft_pmix)]
mod imp;
#[cfg(weft_pmix)]
mod jobctl;

#[cfg(weft_pmix)]
mod log;

#[cfg(weft_pmix)]
mod names;

#[cfg(weft_pmix)]
mod connect;

#[cfg(weft_pmix)]
mod spawn;

#[cfg(weft_pmix)]
mod events;

#[cfg(weft_pmix)]
mod quickack;

#[cfg(weft_pmix)]
mod tools;

#[cfg(weft_pmix)]
mod query;

#[cfg(weft_pmix)]
mod attrs_guard;

#[cfg(test)]
mod tests {
    use super::Nspace;

    fn ns(node_of: Vec<u32>) -> Nspace {
        let n = node_of.len();
        Nspace {
            nspace: "j".into(),
            node: 0,
            hostnames: vec!["a".into(), "b".into(), "c".into()],
            node_of,
            app_of: vec![0; n],
            local_rank_of: vec![0; n],
            locality_of: vec![None; n],
            tmpdir: "/tmp".into(),
            oversubscribed: false,
            parent: None,
            stop_in_init: false,
            debug_job: None,
        }
    }

    #[test]
    fn maps_list_only_the_nodes_that_hold_ranks() {
        let all = ns(vec![0, 0, 1, 2]);
        assert_eq!(all.node_map(), "a,b,c");
        assert_eq!(all.proc_map(), "0,1;2;3");
        // A job spawned onto the asking node of a three-node runtime.
        let one = ns(vec![1, 1]);
        assert_eq!(one.job_nodes(), vec![1]);
        assert_eq!(one.node_map(), "b");
        assert_eq!(one.proc_map(), "0,1");
        let gap = ns(vec![2, 0, 2]);
        assert_eq!(gap.node_map(), "a,c");
        assert_eq!(gap.proc_map(), "1;0,2");
    }
}
