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
}

/// A `PMIx_Query_info` of a local client, handed to [`Host::query`].
#[derive(Debug)]
pub struct Query {
    /// What is asked.
    pub keys: Vec<QueryKey>,
    /// Where the answers go.
    pub reply: GroupReply,
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
    /// A query of a local client (answer with [`GroupReply::answers`]).
    fn query(&self, req: Query);
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
}

impl Nspace {
    /// The ranks on `node`, ascending.
    pub fn ranks_on(&self, node: u32) -> Vec<u32> {
        (0..self.node_of.len() as u32)
            .filter(|&r| self.node_of[r as usize] == node)
            .collect()
    }

    /// PMIx's per-node list of ranks (`PMIX_PROC_MAP` unreduced): `0,1;2,3`.
    pub fn proc_map(&self) -> String {
        (0..self.hostnames.len() as u32)
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
/// Where a query's answers go (the same callback as a group operation's).
pub type QueryReply = GroupReply;

#[cfg(not(weft_pmix))]
pub use stub::{preload, GroupReply, ModexReply, Server};

#[cfg(not(weft_pmix))]
mod stub;

#[cfg(weft_pmix)]
mod imp;
