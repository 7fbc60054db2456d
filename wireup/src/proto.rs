//! The wire-up protocol between a client and its node's server (the server-to-server and
//! launcher messages are the runtime's: `weft_runtime::wire::proto`).
//!
//! Every connection starts with a hello that carries a magic and a version; a peer
//! speaking another version is refused with a message that says both versions. The
//! hello and the welcome keep their first fields in every version ([`HelloHead`],
//! [`WelcomeHead`]): a frame of another version that does not decode whole still says
//! its version, so the refusal names it instead of calling the frame undecodable.
//!
//! Version 4 (issue 33): the hello names the process's namespace ([`NsId`]) beside its
//! rank, and the welcome the namespace the server took it into; requests name other
//! processes by [`ProcId`] (a get's owner, a process set's members, a group's invitees and
//! leader). Replies, events and group records still name ranks of the one job. Version 5
//! adds `Spawn` (a new job in the caller's runtime) and its answer `Spawned`. Version 6 adds
//! `Names` (publish, lookup, unpublish). Version 7: a spawn carries [`SpawnOptions`] (the
//! session to run in, separation from the caller's job), and runtime control: `JobControl`
//! (signal, pause, resume, terminate, kill jobs or processes) and `Allocate` (allocation
//! sessions), answered by `Allocated`. Version 8: the welcome names the process that
//! spawned the job (`parent`), and processes of several jobs connect (`Connect`, answered
//! by `Connected`; `Disconnect`).

use serde::{Deserialize, Serialize};

use crate::names::{NsId, ProcId, ProcSel};
use crate::value::{Scope, Value};
use crate::Rank;

/// The version of the wire-up protocol this build speaks.
pub const PROTOCOL_VERSION: u32 = 8;
/// First bytes of every hello.
pub const MAGIC: [u8; 4] = *b"WEFT";
/// How long either end of a new client connection waits for the other's first frame
/// (the client's hello, the server's welcome) before giving up on it.
pub const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Which processes take part in a fence (or another collective).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Procs {
    /// Every process of the job (the wildcard rank).
    All,
    /// These ranks (any order, duplicates ignored).
    List(Vec<Rank>),
}

impl Procs {
    /// Sorted, deduplicated participants; a list naming every rank becomes `All`.
    pub fn normalize(self, size: u32) -> Procs {
        match self {
            Procs::All => Procs::All,
            Procs::List(mut v) => {
                v.sort_unstable();
                v.dedup();
                if v.len() == size as usize && v.last().is_some_and(|&l| l + 1 == size) {
                    Procs::All
                } else {
                    Procs::List(v)
                }
            }
        }
    }
    /// Whether `rank` takes part.
    pub fn contains(&self, rank: Rank) -> bool {
        match self {
            Procs::All => true,
            Procs::List(v) => v.binary_search(&rank).is_ok(),
        }
    }
    /// The participants as a list.
    pub fn ranks(&self, size: u32) -> Vec<Rank> {
        match self {
            Procs::All => (0..size).collect(),
            Procs::List(v) => v.clone(),
        }
    }
}

/// How much data a fence moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FenceMode {
    /// Every participant's committed Remote/Global data reaches every participating
    /// node; a `get` afterwards never leaves the node.
    Full,
    /// Only synchronises; a `get` of another node's key pulls that process's data on
    /// demand from the owning node's server (direct modex) and caches it.
    Sparse,
    /// A barrier; moves no data.
    SyncOnly,
}

/// Kind of a collective among servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CollKind {
    Fence,
    /// A group construct (the collective's `name` is the group id).
    GroupConstruct,
    /// A group destruct (the collective's `name` is the group id).
    GroupDestruct,
}

/// Identity of one collective: (kind, sorted participants, sequence number, and for
/// group operations the group id), so a fence and a group construct over the same
/// processes never collide.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CollId {
    pub kind: CollKind,
    pub procs: Procs,
    pub seq: u64,
    /// The group id (empty for fences).
    pub name: String,
}

impl CollId {
    /// Whether this is a group construct or destruct.
    pub fn is_group(&self) -> bool {
        matches!(
            self.kind,
            CollKind::GroupConstruct | CollKind::GroupDestruct
        )
    }
    /// The operation's name in errors.
    pub fn op(&self) -> &'static str {
        match self.kind {
            CollKind::Fence => "fence",
            CollKind::GroupConstruct => "group construct",
            CollKind::GroupDestruct => "group destruct",
        }
    }
}

/// The directives of a group construct (PMIx's `PMIX_GROUP_*` attributes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GroupDirectives {
    /// The group's leader (it receives the group's events, may be replaced on failure).
    pub leader: Option<Rank>,
    /// Members that never join (timeout) or die first are left out: the construct
    /// succeeds with the final membership instead of failing.
    pub optional: bool,
    /// Only processes of the caller's node take part: no inter-node collective (except
    /// the request of a context id from the root server, when one is asked for).
    pub local_only: bool,
    /// A member that dies during the construct (or later, instead of destructing) is
    /// an event and leaves the membership, not an error.
    pub notify_termination: bool,
    /// Fault-tolerant collective: a member that dies mid-construct is dropped and the
    /// construct completes among the others.
    pub ft_collective: bool,
    /// Ask the root server for a PGCID (unique within the job, never reused).
    pub assign_context_id: bool,
    /// Skip the exchange of the members' committed Remote/Global data. By default a
    /// construct moves it as a Full fence would, so that `get`s of members' cards never
    /// leave the node afterwards.
    pub no_data: bool,
}

impl GroupDirectives {
    /// Whether a member's death or absence shrinks the group instead of failing it.
    pub fn tolerant(&self) -> bool {
        self.optional || self.notify_termination || self.ft_collective
    }
}

/// What the servers know of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    /// The group id.
    pub id: String,
    /// Its members, ascending.
    pub members: Vec<Rank>,
    /// Its PGCID, if one was assigned.
    pub pgcid: Option<u64>,
    /// Its leader, if one was named.
    pub leader: Option<Rank>,
    /// Requested members that are not in the group (never joined, or died first):
    /// empty when the construct was a full success.
    pub left_out: Vec<Rank>,
    /// The directives it was constructed with.
    pub directives: GroupDirectives,
}

impl CollId {
    /// A stable 64-bit digest (same on every server of the job: FNV-1a of the encoding).
    pub fn digest(&self) -> u64 {
        let bytes = postcard::to_stdvec(self).expect("postcard encoding into a Vec");
        bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }
}

/// An error a server reports for an operation, carried over the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireError {
    /// The operation timed out; `missing` did not arrive.
    Timeout { op: String, missing: Vec<Rank> },
    /// A process the operation needs died or finalized.
    ProcGone {
        op: String,
        rank: Rank,
        reason: String,
    },
    /// The operation was aborted elsewhere.
    Aborted { op: String, reason: String },
    /// The request was invalid.
    Invalid { op: String, reason: String },
}

/// Client to server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ClientMsg {
    /// Must be the first frame; never reorder: old and new versions must decode its
    /// first fields ([`HelloHead`]).
    Hello {
        magic: [u8; 4],
        version: u32,
        rank: Rank,
        token: u64,
        /// The process's namespace (its job), since version 4.
        ns: NsId,
    },
    /// Not acknowledged: the server handles a connection's frames in order.
    Commit {
        entries: Vec<(Scope, String, Value)>,
    },
    Fence {
        req: u64,
        id: CollId,
        mode: FenceMode,
        timeout_ms: Option<u64>,
    },
    Get {
        req: u64,
        /// Whose key (its namespace and rank; since version 4).
        proc: ProcId,
        key: String,
        refresh: bool,
        local_only: bool,
        /// Do not wait for the key: answer with what the owner has committed now.
        immediate: bool,
        timeout_ms: Option<u64>,
    },
    Finalize {
        req: u64,
        /// Sent as the process ends (at exit, or a dropped client): the server reports
        /// its end by its exit status.
        at_exit: bool,
    },
    /// A group construct or destruct (`id.kind` tells which).
    Group {
        req: u64,
        id: CollId,
        directives: GroupDirectives,
        timeout_ms: Option<u64>,
    },
    /// The groups this node's server knows.
    GroupQuery { req: u64 },
    /// Leave group `id` (the others get a member-left event).
    GroupLeave { req: u64, id: String },
    /// Declare oneself the leader of group `id` after its leader failed.
    LeaderClaim { req: u64, id: String },
    /// Define a process set while the job runs.
    PsetDefine {
        req: u64,
        name: String,
        members: Vec<ProcId>,
    },
    /// Delete a process set defined while the job runs.
    PsetDelete { req: u64, name: String },
    /// As leader, invite `procs` into new group `id`; answered with the group once every
    /// invitee accepted, declined, failed or timed out.
    GroupInvite {
        req: u64,
        id: String,
        procs: Vec<ProcId>,
        directives: GroupDirectives,
        timeout_ms: Option<u64>,
    },
    /// Answer an invitation of `leader` into group `id`; when accepting, answered with
    /// the group once it is formed.
    GroupJoin {
        req: u64,
        id: String,
        leader: ProcId,
        accept: bool,
    },
    /// Start a new job of `apps` in the caller's runtime (since version 5); answered with
    /// [`ServerMsg::Spawned`] once every process of it was started.
    Spawn {
        req: u64,
        apps: Vec<SpawnApp>,
        /// Where it runs and whether it outlives the caller's job (since version 7).
        opts: SpawnOptions,
    },
    /// Publish, look up or unpublish names (since version 6); answered with
    /// [`ServerMsg::Names`].
    Names { req: u64, op: NameOp },
    /// Apply `action` to `targets` (jobs or processes of the runtime; since version 7);
    /// answered with `Done` once the runtime was told, or `Failed` naming an unknown
    /// target.
    JobControl {
        req: u64,
        targets: Vec<ProcSel>,
        action: JobAction,
    },
    /// An allocation request (since version 7); answered with [`ServerMsg::Allocated`].
    Allocate { req: u64, request: AllocRequest },
    /// Connect (or, `disconnect`, disconnect) with the processes `procs` (the caller's
    /// included; of any jobs of the runtime): answered with [`ServerMsg::Connected`] once
    /// every one of them made the same call, or why they cannot (since version 8).
    Connect {
        req: u64,
        procs: Vec<ProcSel>,
        disconnect: bool,
        timeout_ms: Option<u64>,
    },
}

/// A completed connect: the processes connected and their context id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    /// A process-group context id no other group or connect of the runtime has.
    pub pgcid: u64,
    /// Every process connected, sorted (a whole namespace's expanded).
    pub procs: Vec<ProcId>,
    /// The logical node of each of `procs`.
    pub nodes: Vec<u32>,
}

/// Why a connect or disconnect failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConnectFailure {
    /// The request is wrong: no participant, the caller not among them, an unknown job
    /// or rank.
    Invalid(String),
    /// A participant ended before it took part (the reason names it).
    Gone(String),
    /// The caller's timeout passed first (the reason says who had not called).
    Timeout(String),
}

/// Where a spawned job runs, and whether it ends with the job that asked for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnOptions {
    /// The allocation session to run in (its nodes); `None`: the caller's job's session
    /// (the runtime's nodes unless the caller runs in a child session).
    pub session: Option<SessionRef>,
    /// Not terminated when the caller's job is (PMIx's `PMIX_SPAWN_CHILD_SEP`).
    pub separate: bool,
}

/// An allocation session, by its number or by its allocation id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionRef {
    /// Its session number.
    Id(u32),
    /// The allocation id it was asked for under (or given).
    AllocId(String),
}

/// What [`ClientMsg::JobControl`] does to its targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobAction {
    /// A whole job: ended as `weft kill` ends it (its processes get SIGTERM, then
    /// SIGKILL, and its jobs not spawned separate go with it; exit status 143); a
    /// process: SIGTERM.
    Terminate,
    /// SIGKILL.
    Kill,
    /// This signal (a number, as `kill(2)` takes it).
    Signal(i32),
    /// SIGSTOP.
    Pause,
    /// SIGCONT.
    Resume,
}

impl JobAction {
    /// The signal it sends to a process.
    pub fn signal(self) -> i32 {
        match self {
            JobAction::Kill => 9,
            JobAction::Terminate => 15,
            JobAction::Signal(s) => s,
            JobAction::Pause => 19,
            JobAction::Resume => 18,
        }
    }
}

/// What an allocation request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocOp {
    /// A new child session of free logical nodes.
    New,
    /// More free nodes for an existing session.
    Extend,
    /// Ends a session (its jobs are terminated).
    Release,
}

/// An allocation request: build it with [`AllocRequest::new`], [`AllocRequest::extend`]
/// or [`AllocRequest::release`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocRequest {
    /// What to do.
    pub op: AllocOp,
    /// How many logical nodes (new, extend).
    pub nodes: Option<u32>,
    /// The allocation id: chosen for a new one (the runtime picks one otherwise), or naming
    /// the session to extend or release.
    pub alloc_id: Option<String>,
    /// The session to extend or release, by number.
    pub session: Option<u32>,
    /// A new session that does not end with the job that asked for it.
    pub separate: bool,
}

impl AllocRequest {
    /// A new session of `nodes` free logical nodes, ending with the caller's job.
    pub fn new(nodes: u32) -> AllocRequest {
        AllocRequest {
            op: AllocOp::New,
            nodes: Some(nodes),
            alloc_id: None,
            session: None,
            separate: false,
        }
    }
    /// `nodes` more free nodes for session `session`.
    pub fn extend(session: SessionRef, nodes: u32) -> AllocRequest {
        AllocRequest {
            op: AllocOp::Extend,
            nodes: Some(nodes),
            ..AllocRequest::release(session)
        }
    }
    /// Ends session `session`, terminating its jobs.
    pub fn release(session: SessionRef) -> AllocRequest {
        let (session, alloc_id) = match session {
            SessionRef::Id(id) => (Some(id), None),
            SessionRef::AllocId(a) => (None, Some(a)),
        };
        AllocRequest {
            op: AllocOp::Release,
            nodes: None,
            alloc_id,
            session,
            separate: false,
        }
    }
    /// Names a new session's allocation id.
    pub fn alloc_id(mut self, id: &str) -> AllocRequest {
        self.alloc_id = Some(id.to_owned());
        self
    }
    /// A new session that outlives the caller's job (PMIx's `PMIX_ALLOC_CHILD_SEP`).
    pub fn separate(mut self) -> AllocRequest {
        self.separate = true;
        self
    }
}

/// An allocation session, as an allocation request answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// Its session number.
    pub session: u32,
    /// Its allocation id.
    pub alloc_id: String,
    /// Its logical nodes.
    pub nodes: Vec<u32>,
    /// Their host names.
    pub hostnames: Vec<String>,
    /// False once it ended (the answer to a release).
    pub active: bool,
}

/// Who may look a published name up.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub enum NameRange {
    /// Processes on the publisher's node.
    Node,
    /// Processes of the publisher's job (namespace).
    Namespace,
    /// Processes of the publisher's session: every job of the runtime (Weft's runtime
    /// holds one session so far). The default, as in PMIx.
    #[default]
    Session,
    /// Every process the runtime serves.
    Global,
}

/// How long a published name lives (at most as long as the runtime).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Persistence {
    /// Until unpublished (or the runtime ends).
    Indefinite,
    /// Until the first lookup that returns it.
    FirstRead,
    /// Until the publishing process ends.
    Proc,
    /// Until the publishing job ends.
    Job,
    /// Until the session ends (the runtime, so far). The default, as in PMIx.
    #[default]
    Session,
}

/// A published value: what the publisher gave, kept as given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NameValue {
    /// Bytes (the native API, a PMIx byte object).
    Bytes(Vec<u8>),
    /// A string (a PMIx string: MPI port names).
    Str(String),
    /// Another PMIx value, as the publisher's PMIx library packed its info.
    Pmix(Vec<u8>),
}

/// A name-service request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NameOp {
    /// Publish `entries` (key, value): all or none (a key already published in the same
    /// reach fails the request, naming it).
    Publish {
        range: NameRange,
        persist: Persistence,
        entries: Vec<(String, NameValue)>,
    },
    /// Look `keys` up. Without `wait_ms`, answered at once with the keys found (none
    /// found: [`NameFailure::NotFound`]); with it, once every key is published, or
    /// [`NameFailure::Timeout`] after that many milliseconds (`u64::MAX`: no limit).
    Lookup {
        range: NameRange,
        keys: Vec<String>,
        wait_ms: Option<u64>,
    },
    /// Withdraw the caller's `keys` (empty: all it published in `range`).
    Unpublish { range: NameRange, keys: Vec<String> },
}

/// A name found by a lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    /// Its key.
    pub key: String,
    /// Who published it.
    pub owner: ProcId,
    /// The publisher's namespace name.
    pub nspace: String,
    /// Its value.
    pub value: NameValue,
}

/// Why a name-service request failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NameFailure {
    /// None of these keys is published where the caller may see it (or, unpublishing,
    /// by the caller).
    NotFound(Vec<String>),
    /// These keys are published already in that reach.
    Duplicate(Vec<String>),
    /// A waiting lookup's time passed before these keys were published.
    Timeout(Vec<String>),
    /// The request was malformed, or the runtime cannot serve it: why.
    Invalid(String),
}

impl std::fmt::Display for NameFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameFailure::NotFound(k) => write!(f, "not published: {k:?}"),
            NameFailure::Duplicate(k) => write!(f, "published already: {k:?}"),
            NameFailure::Timeout(k) => write!(f, "still not published when the wait ended: {k:?}"),
            NameFailure::Invalid(why) => f.write_str(why),
        }
    }
}

/// One app context of a spawned job: `np` copies of `program` with `args`, `env` added
/// to the parent job's environment, in `cwd` (else the server's working directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnApp {
    /// The program (a path, or a name looked up in `PATH`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// How many processes.
    pub np: u32,
    /// Variables set for them on top of the job's environment.
    pub env: Vec<(String, String)>,
    /// Their working directory.
    pub cwd: Option<String>,
}

/// What an event is about (PMIx event codes of groups and process sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EventCode {
    /// A member of a notify-termination group died (to the leader, or every member).
    MemberFailed,
    /// A member left a group.
    MemberLeft,
    /// A group's leader died.
    LeaderFailed,
    /// A member declared itself the group's new leader.
    LeaderSelected,
    /// A process set was defined while the job runs.
    PsetDefined,
    /// A process set defined while the job ran was deleted.
    PsetDeleted,
    /// The process is invited into a group (`rank` is the leader).
    Invited,
    /// To the leader: an invitee accepted.
    InviteAccepted,
    /// To the leader: an invitee declined.
    InviteDeclined,
    /// To the leader: an invitee died or did not answer in time.
    InviteFailed,
    /// To every member: an invite-formed group is complete (its members in `members`).
    ConstructComplete,
    /// To the invitees that accepted: the construct was abandoned (the leader died).
    ConstructAbort,
    /// To the processes of a job on the node where it happened: a process of a job it
    /// spawned ended without finalizing ([`Event::proc`] names it; its job is being
    /// terminated). Since protocol version 7.
    SpawnedProcEnded,
}

/// An event delivered to a process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// What happened.
    pub code: EventCode,
    /// The group it concerns.
    pub group: Option<String>,
    /// The process it concerns (the failed, departed or new leader process).
    pub rank: Option<Rank>,
    /// The process set it concerns.
    pub pset: Option<String>,
    /// The members of the group or set afterwards.
    pub members: Vec<Rank>,
    /// A human-readable reason.
    pub reason: String,
    /// The process of another job it concerns (`SpawnedProcEnded`: the spawned process;
    /// since protocol version 7).
    pub proc: Option<ProcId>,
}

/// The first fields of a [`ClientMsg::Hello`], the same in every protocol version (a
/// postcard decode reads them and ignores the rest): what a server reads from a hello
/// that does not decode whole, to refuse another version by its number.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum HelloHead {
    Hello { magic: [u8; 4], version: u32 },
}

/// The first field of a [`ServerMsg::Welcome`], the same in every protocol version: what a
/// client reads from a welcome that does not decode whole.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum WelcomeHead {
    Welcome { version: u32 },
}

/// Server to client.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ServerMsg {
    /// The first frame; never reorder: old and new versions must decode its first field
    /// ([`WelcomeHead`]).
    Welcome {
        version: u32,
        datastore: String,
        nspace: String,
        /// The namespace the process was taken into (the one its hello named), since
        /// version 4.
        ns: NsId,
        /// The process that spawned this job (`None`: a job started by `weft run` or
        /// submitted to a runtime), since version 8.
        parent: Option<ProcId>,
    },
    Refused {
        reason: String,
    },
    Done {
        req: u64,
    },
    Value {
        req: u64,
        value: Value,
    },
    /// A get's key is not there and will not be for this get: why.
    Missing {
        req: u64,
        reason: String,
    },
    Failed {
        req: u64,
        error: WireError,
    },
    /// A group construct completed.
    Group {
        req: u64,
        group: GroupInfo,
    },
    /// The answer to a group query.
    Groups {
        req: u64,
        groups: Vec<GroupInfo>,
    },
    /// An event (unsolicited).
    Event(Event),
    /// A spawn's new job: its namespace id and name (since version 5).
    Spawned {
        req: u64,
        ns: NsId,
        nspace: String,
    },
    /// The answer to [`ClientMsg::Names`] (since version 6): the names a lookup found
    /// (none for a publish or unpublish), or why the request failed.
    Names {
        req: u64,
        result: Result<Vec<Published>, NameFailure>,
    },
    /// The answer to [`ClientMsg::Allocate`] (since version 7): the session, or why
    /// there is none.
    Allocated {
        req: u64,
        result: Result<Allocation, String>,
    },
    /// The answer to [`ClientMsg::Connect`] (since version 8): the connection (`None`
    /// for a disconnect), or why there is none.
    Connected {
        req: u64,
        result: Result<Option<Connection>, ConnectFailure>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_sorts_and_widens_to_all() {
        assert_eq!(Procs::List(vec![2, 0, 1, 1]).normalize(3), Procs::All);
        assert_eq!(
            Procs::List(vec![3, 1, 1]).normalize(5),
            Procs::List(vec![1, 3])
        );
        assert!(Procs::List(vec![1, 3]).contains(3));
        assert!(!Procs::List(vec![1, 3]).contains(2));
    }

    #[test]
    fn collective_ids_differ_by_kind_procs_and_seq() {
        let a = CollId {
            kind: CollKind::Fence,
            procs: Procs::All,
            seq: 0,
            name: String::new(),
        };
        let g = CollId {
            kind: CollKind::GroupConstruct,
            name: "g".into(),
            ..a.clone()
        };
        let h = CollId {
            name: "h".into(),
            ..g.clone()
        };
        assert_ne!(a.digest(), g.digest());
        assert_ne!(g.digest(), h.digest());
        let b = CollId {
            seq: 1,
            ..a.clone()
        };
        let c = CollId {
            procs: Procs::List(vec![0, 1]),
            ..a.clone()
        };
        assert_ne!(a.digest(), b.digest());
        assert_ne!(a.digest(), c.digest());
        assert_eq!(a.digest(), a.clone().digest());
    }

    #[test]
    fn hello_is_variant_zero() {
        // The handshake must stay decodable across versions: Hello is the first variant.
        let enc = postcard::to_stdvec(&ClientMsg::Hello {
            magic: MAGIC,
            version: 7,
            rank: 1,
            token: 2,
            ns: NsId(3),
        })
        .unwrap();
        assert_eq!(enc[0], 0);
        assert_eq!(&enc[1..5], b"WEFT");
    }

    /// A version 3 hello (no namespace) is not a version 4 one, but its head still says
    /// version 3; the v4 hello's head says 4. Likewise the welcomes.
    #[test]
    fn the_heads_read_the_version_of_hellos_and_welcomes_of_either_version() {
        #[derive(Serialize)]
        enum V3Hello {
            Hello {
                magic: [u8; 4],
                version: u32,
                rank: Rank,
                token: u64,
            },
        }
        #[derive(Serialize)]
        enum V3Welcome {
            Welcome {
                version: u32,
                datastore: String,
                nspace: String,
            },
        }
        let v3 = postcard::to_stdvec(&V3Hello::Hello {
            magic: MAGIC,
            version: 3,
            rank: 1,
            token: u64::MAX,
        })
        .unwrap();
        assert!(postcard::from_bytes::<ClientMsg>(&v3).is_err());
        assert_eq!(
            postcard::from_bytes::<HelloHead>(&v3).unwrap(),
            HelloHead::Hello {
                magic: MAGIC,
                version: 3
            }
        );
        let v4 = postcard::to_stdvec(&ClientMsg::Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            rank: 1,
            token: u64::MAX,
            ns: NsId(9),
        })
        .unwrap();
        assert_eq!(
            postcard::from_bytes::<HelloHead>(&v4).unwrap(),
            HelloHead::Hello {
                magic: MAGIC,
                version: PROTOCOL_VERSION
            }
        );
        let w3 = postcard::to_stdvec(&V3Welcome::Welcome {
            version: 3,
            datastore: "/weft-x".into(),
            nspace: "weft-x".into(),
        })
        .unwrap();
        assert!(postcard::from_bytes::<ServerMsg>(&w3).is_err());
        assert_eq!(
            postcard::from_bytes::<WelcomeHead>(&w3).unwrap(),
            WelcomeHead::Welcome { version: 3 }
        );
        let w4 = postcard::to_stdvec(&ServerMsg::Welcome {
            version: PROTOCOL_VERSION,
            datastore: "/weft-x".into(),
            nspace: "weft-x".into(),
            ns: NsId(9),
            parent: None,
        })
        .unwrap();
        assert_eq!(
            postcard::from_bytes::<WelcomeHead>(&w4).unwrap(),
            WelcomeHead::Welcome {
                version: PROTOCOL_VERSION
            }
        );
    }
}
