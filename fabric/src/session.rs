//! MPI-4-style sessions: [`Session::init`], process sets, [`Group`]s of processes, and
//! [`Communicator::create_from_group`], whose context id is a PGCID that the root
//! wire-up server hands out (unique within the job, never reused).
//!
//! ```no_run
//! use weft_fabric::{Communicator, ErrHandler, Info, Session, Source, Tag, ThreadLevel};
//! let session = Session::init(Info::new().thread_level(ThreadLevel::Multiple), ErrHandler::Return)?;
//! let world = session.group_from_pset("weft://world")?;
//! let comm = Communicator::create_from_group(&world, "org.example.solver", ErrHandler::Return)?;
//! let right = (comm.rank() + 1) % comm.size();
//! comm.send(&[comm.rank() as u64], right, Tag(7))?;
//! let mut got = [0u64; 1];
//! comm.recv(&mut got, Source::Any, Tag(7))?;
//! comm.disconnect()?;
//! session.finalize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A process has one fabric (one shared-memory inbox, one wire-up connection); any
//! number of sessions share it and cost a few allocations each. Sessions, groups and
//! communicators are `Send` and `Sync`: any thread may make them and use them, several
//! at once (the provided thread level is the requested one, up to `multiple`; see
//! [`Session::thread_level`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use weft_wireup::{GroupDirectives, GroupError, PSET_SELF, PSET_WORLD};

use crate::{Backoff, Communicator, Fabric, InitError, RankMap};

/// The MPI name of the world process set, an alias of `weft://world`.
pub const MPI_PSET_WORLD: &str = "mpi://WORLD";
/// The MPI name of the self process set, an alias of `weft://self`.
pub const MPI_PSET_SELF: &str = "mpi://SELF";

/// A thread support level (MPI's `MPI_THREAD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ThreadLevel {
    /// One thread only.
    Single,
    /// Many threads, only one of them calls.
    Funneled,
    /// Many threads call, never at once.
    Serialized,
    /// Many threads call at once.
    Multiple,
}

impl std::str::FromStr for ThreadLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let l = s.to_ascii_lowercase();
        match l.strip_prefix("mpi_thread_").unwrap_or(&l) {
            "single" => Ok(ThreadLevel::Single),
            "funneled" => Ok(ThreadLevel::Funneled),
            "serialized" => Ok(ThreadLevel::Serialized),
            "multiple" => Ok(ThreadLevel::Multiple),
            _ => Err(format!(
                "unknown thread level {s:?} (single, funneled, serialized or multiple)"
            )),
        }
    }
}

impl std::fmt::Display for ThreadLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ThreadLevel::Single => "single",
            ThreadLevel::Funneled => "funneled",
            ThreadLevel::Serialized => "serialized",
            ThreadLevel::Multiple => "multiple",
        })
    }
}

/// The highest thread level Weft's sessions provide: any thread may call at any time,
/// on any session or communicator (they are `Send` and `Sync`).
pub const PROVIDED_THREAD_LEVEL: ThreadLevel = ThreadLevel::Multiple;

/// Key/value hints for [`Session::init`] (MPI's info object).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Info {
    entries: Vec<(String, String)>,
}

impl Info {
    /// No hints.
    pub fn new() -> Info {
        Info::default()
    }
    /// Requests a thread level.
    pub fn thread_level(self, level: ThreadLevel) -> Info {
        self.set("thread_level", &level.to_string())
    }
    /// Sets `key` to `value`.
    pub fn set(mut self, key: &str, value: &str) -> Info {
        self.entries.retain(|(k, _)| k != key);
        self.entries.push((key.to_owned(), value.to_owned()));
        self
    }
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
    /// Every key and value.
    pub fn entries(&self) -> &[(String, String)] {
        &self.entries
    }
}

/// What happens when an operation on a session or communicator fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ErrHandler {
    /// The error is returned (MPI_ERRORS_RETURN).
    #[default]
    Return,
    /// The error is printed and the process exits with status 1; the launcher then ends
    /// the job (MPI_ERRORS_ARE_FATAL).
    Fatal,
}

impl ErrHandler {
    /// Applies the handler to an error on its way to the caller.
    pub(crate) fn raise<E: std::fmt::Display>(self, e: E) -> E {
        if self == ErrHandler::Fatal {
            eprintln!("weft: fatal error: {e}");
            std::process::exit(1);
        }
        e
    }
}

/// Errors of sessions and groups.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The fabric could not start.
    #[error("session init: {0}")]
    Init(#[from] InitError),
    /// An info value is invalid.
    #[error("session init: info {key}={value:?}: {reason}")]
    BadInfo {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// No such process set.
    #[error("no process set {name:?} (known: {known:?})")]
    NoSuchPset {
        /// The name asked for.
        name: String,
        /// The names that exist.
        known: Vec<String>,
    },
    /// A group operation was given bad ranks.
    #[error("group {op}: {reason}")]
    BadRanks {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Groups of different sessions were combined.
    #[error("group {op}: the groups come from different sessions")]
    DifferentSessions {
        /// The operation.
        op: &'static str,
    },
    /// Session finalize could not synchronise with the peers of its communicators.
    #[error("session finalize: {0}")]
    Finalize(#[source] GroupError),
}

/// Errors of communicator creation and release.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// The caller is not in the group.
    #[error("communicator {tag:?}: the calling process (rank {rank}) is not in the group")]
    NotMember {
        /// The tag.
        tag: String,
        /// The caller's job rank.
        rank: u32,
    },
    /// The tag is empty.
    #[error("communicator: the tag is empty")]
    EmptyTag,
    /// The group construct behind the communicator failed.
    #[error("communicator {tag:?}: {source}")]
    Construct {
        /// The tag.
        tag: String,
        /// What failed.
        #[source]
        source: GroupError,
    },
    /// The world communicator of [`Fabric::world`] cannot be freed or disconnected.
    #[error("the world communicator of Fabric::world cannot be freed or disconnected")]
    Predefined,
    /// The communicator's session was finalized.
    #[error("communicator: its session was finalized")]
    SessionFinalized,
    /// Disconnect could not deliver buffered messages or synchronise with the peers.
    #[error("communicator disconnect: {0}")]
    Disconnect(String),
}

/// Where a communicator stands with respect to its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommState {
    Active,
    Freed,
    Disconnected,
}

/// What a communicator made from a session group remembers of its origin.
#[derive(Debug)]
pub(crate) struct CommOrigin {
    /// The wire-up group behind it.
    group_id: String,
    state: Mutex<CommState>,
    session: Arc<SessionState>,
}

impl CommOrigin {
    fn state(&self) -> CommState {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
    fn set_state(&self, s: CommState) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = s;
    }
}

#[derive(Debug)]
struct SessionState {
    id: u64,
    finalized: AtomicBool,
    comms: Mutex<Vec<Arc<CommOrigin>>>,
}

impl SessionState {
    fn finalized(&self) -> bool {
        // SYNC: pairs with the Release store in `finalize_inner`: a thread that sees the
        // session finalized also sees its communicators taken.
        self.finalized.load(Ordering::Acquire)
    }
    fn comms(&self) -> std::sync::MutexGuard<'_, Vec<Arc<CommOrigin>>> {
        self.comms.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Session ids, unique within the process.
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// Per (tag, members): how many communicators this process made (the group id of the
/// next one; every member counts alike).
static COMM_SEQ: Mutex<CommCounts> = Mutex::new(BTreeMap::new());
type CommCounts = BTreeMap<(String, Vec<u32>), u64>;

/// An MPI-4-style session.
#[derive(Debug)]
pub struct Session {
    fabric: Fabric,
    requested: ThreadLevel,
    errh: ErrHandler,
    state: Arc<SessionState>,
}

/// What [`Session::pset_info`] tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsetInfo {
    /// The name.
    pub name: String,
    /// Number of processes.
    pub size: u32,
}

impl Session {
    /// Starts a session (local; cheap after the first one of the process). `info` may
    /// request a thread level (`thread_level` = single, funneled, serialized or
    /// multiple); the level provided is reported by [`Session::thread_level`].
    pub fn init(info: Info, errh: ErrHandler) -> Result<Session, SessionError> {
        let requested = match info.get("thread_level") {
            None => ThreadLevel::Funneled,
            Some(v) => v.parse().map_err(|reason| {
                errh.raise(SessionError::BadInfo {
                    key: "thread_level".into(),
                    value: v.into(),
                    reason,
                })
            })?,
        };
        let fabric = Fabric::init().map_err(|e| errh.raise(SessionError::Init(e)))?;
        // SYNC: a counter only; no other data is published through it.
        let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        Ok(Session {
            fabric,
            requested,
            errh,
            state: Arc::new(SessionState {
                id,
                finalized: AtomicBool::new(false),
                comms: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The thread level provided: the requested one, at most [`PROVIDED_THREAD_LEVEL`].
    pub fn thread_level(&self) -> ThreadLevel {
        self.requested.min(PROVIDED_THREAD_LEVEL)
    }

    /// The session's properties: `thread_level` (provided), `thread_level_requested`,
    /// `weft.session_id`, `weft.rank`, `weft.size`.
    pub fn info(&self) -> Info {
        let w = self.fabric.wire();
        Info::new()
            .set("thread_level", &self.thread_level().to_string())
            .set("thread_level_requested", &self.requested.to_string())
            .set("weft.session_id", &self.state.id.to_string())
            .set("weft.rank", &w.rank().to_string())
            .set("weft.size", &w.size().to_string())
    }

    /// The process's fabric (wire-up client, world communicator).
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// The names of every process set: `weft://world`, `weft://self`, their MPI aliases
    /// `mpi://WORLD` and `mpi://SELF`, and the launch psets (`--pset`).
    pub fn pset_names(&self) -> Vec<String> {
        let mut names = self.fabric.wire().pset_names();
        names.push(MPI_PSET_WORLD.into());
        names.push(MPI_PSET_SELF.into());
        names
    }

    fn pset_members(&self, name: &str) -> Result<Vec<u32>, SessionError> {
        let canonical = match name {
            MPI_PSET_WORLD => PSET_WORLD,
            MPI_PSET_SELF => PSET_SELF,
            n => n,
        };
        self.fabric.wire().pset_members(canonical).ok_or_else(|| {
            self.errh.raise(SessionError::NoSuchPset {
                name: name.into(),
                known: self.pset_names(),
            })
        })
    }

    /// The size of process set `name`.
    pub fn pset_info(&self, name: &str) -> Result<PsetInfo, SessionError> {
        Ok(PsetInfo {
            name: name.into(),
            size: self.pset_members(name)?.len() as u32,
        })
    }

    /// The group of the processes of set `name`, in ascending job rank.
    pub fn group_from_pset(&self, name: &str) -> Result<Group, SessionError> {
        let members = self.pset_members(name)?;
        Ok(self.group(members))
    }

    fn group(&self, members: Vec<u32>) -> Group {
        Group {
            me: self.fabric.inner.me,
            members: members.into(),
            fabric: self.fabric.clone(),
            session: self.state.clone(),
        }
    }

    /// Ends the session. Local when every communicator made from it was disconnected;
    /// otherwise it synchronises with the peers of the communicators that were only
    /// freed (or are still in use), all of them at once (as the standard describes:
    /// as if every synchronisation happened concurrently).
    pub fn finalize(self) -> Result<(), SessionError> {
        let errh = self.errh;
        self.finalize_inner().map_err(|e| errh.raise(e))
    }

    fn finalize_inner(self) -> Result<(), SessionError> {
        let comms: Vec<Arc<CommOrigin>> = std::mem::take(&mut *self.state.comms());
        // SYNC: pairs with the Acquire load in `SessionState::finalized`.
        self.state.finalized.store(true, Ordering::Release);
        let open: Vec<&Arc<CommOrigin>> = comms
            .iter()
            .filter(|c| c.state() != CommState::Disconnected)
            .collect();
        if open.is_empty() {
            return Ok(());
        }
        flush(&self.fabric).map_err(|why| {
            SessionError::Finalize(GroupError::Invalid {
                op: "group destruct",
                id: "*".into(),
                reason: why,
            })
        })?;
        let wire = self.fabric.wire();
        let mut pending = Vec::new();
        let mut first_err = None;
        for c in &open {
            match wire.group_destruct_nb(&c.group_id, None) {
                Ok(p) => pending.push(p),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        for p in pending {
            if let Err(e) = p.wait() {
                first_err.get_or_insert(e);
            }
        }
        for c in open {
            c.set_state(CommState::Disconnected);
        }
        match first_err {
            None => Ok(()),
            Some(e) => Err(SessionError::Finalize(e)),
        }
    }
}

/// Pushes out every buffered frame (a peer must be receiving), for at most `limit`.
fn flush(fabric: &Fabric) -> Result<(), String> {
    let limit = fabric.inner.finalize_wait;
    let deadline = Instant::now() + limit;
    let mut backoff = Backoff::default();
    loop {
        let mut e = fabric.inner.engine();
        e.progress();
        let left = e.backlog();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{left} frames could not be delivered within {limit:?} (peers not receiving? \
                 WEFT_FINALIZE_TIMEOUT sets the wait)"
            ));
        }
        drop(e);
        backoff.snooze();
    }
}

/// How two groups compare (MPI_IDENT, MPI_SIMILAR, MPI_UNEQUAL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupCompare {
    /// Same members in the same order.
    Ident,
    /// Same members, another order.
    Similar,
    /// Different members.
    Unequal,
}

/// An ordered set of processes (job ranks) of one session.
#[derive(Clone)]
pub struct Group {
    me: u32,
    members: Arc<[u32]>,
    fabric: Fabric,
    session: Arc<SessionState>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("session", &self.session.id)
            .field("members", &self.members)
            .finish()
    }
}

impl Group {
    /// Number of processes.
    pub fn size(&self) -> u32 {
        self.members.len() as u32
    }
    /// This process's rank in the group, if it is a member.
    pub fn rank(&self) -> Option<u32> {
        self.members
            .iter()
            .position(|&r| r == self.me)
            .map(|i| i as u32)
    }
    /// The members' job ranks, in group order.
    pub fn members(&self) -> &[u32] {
        &self.members
    }

    /// A communicator of the group's members (ranks in group order) with context id
    /// `ctx`, made without any message: every member must call it with the same `ctx`.
    /// For collective libraries that agree on an id among the members themselves (the
    /// id must be unique in the job, never a PGCID the root server hands out, and
    /// without [`crate::sched::COLL_PLANE`]). Like a communicator from dup or split, it
    /// has no wire-up group behind it: free is local, disconnect delivers what is
    /// buffered, and the session's finalize has nothing to destruct for it.
    pub fn derive_comm(&self, ctx: u64) -> Result<Communicator, CommError> {
        if self.session.finalized() {
            return Err(CommError::SessionFinalized);
        }
        let Some(rank) = self.rank() else {
            return Err(CommError::NotMember {
                tag: format!("{ctx:#x}"),
                rank: self.me,
            });
        };
        if ctx & crate::sched::COLL_PLANE != 0 {
            return Err(CommError::Disconnect(format!(
                "context id {ctx:#x} has the collective plane's bit"
            )));
        }
        let identity = self.members.iter().enumerate().all(|(i, &r)| i as u32 == r);
        Ok(Communicator {
            inner: self.fabric.inner.clone(),
            ctx,
            rank,
            size: self.members.len() as u32,
            map: (!identity).then(|| Arc::new(RankMap::new(&self.members))),
            origin: None,
            shared: Arc::new(crate::CommShared {
                derived: true,
                ..crate::CommShared::default()
            }),
        })
    }

    fn derive(&self, members: Vec<u32>) -> Group {
        Group {
            me: self.me,
            members: members.into(),
            fabric: self.fabric.clone(),
            session: self.session.clone(),
        }
    }

    fn same_session(&self, other: &Group, op: &'static str) -> Result<(), SessionError> {
        if Arc::ptr_eq(&self.session, &other.session) {
            Ok(())
        } else {
            Err(SessionError::DifferentSessions { op })
        }
    }

    /// The ranks in `other` of this group's `ranks` (`None` where not a member).
    pub fn translate_ranks(
        &self,
        ranks: &[u32],
        other: &Group,
    ) -> Result<Vec<Option<u32>>, SessionError> {
        self.check_ranks("translate_ranks", ranks, false)?;
        Ok(ranks
            .iter()
            .map(|&r| {
                let job = self.members[r as usize];
                other
                    .members
                    .iter()
                    .position(|&m| m == job)
                    .map(|i| i as u32)
            })
            .collect())
    }

    /// Members of this group, then those of `other` not in this one.
    pub fn union(&self, other: &Group) -> Result<Group, SessionError> {
        self.same_session(other, "union")?;
        let mut m = self.members.to_vec();
        m.extend(other.members.iter().filter(|r| !self.members.contains(r)));
        Ok(self.derive(m))
    }

    /// Members of this group that are also in `other`, in this group's order.
    pub fn intersection(&self, other: &Group) -> Result<Group, SessionError> {
        self.same_session(other, "intersection")?;
        let m = self
            .members
            .iter()
            .copied()
            .filter(|r| other.members.contains(r))
            .collect();
        Ok(self.derive(m))
    }

    /// Members of this group that are not in `other`, in this group's order.
    pub fn difference(&self, other: &Group) -> Result<Group, SessionError> {
        self.same_session(other, "difference")?;
        let m = self
            .members
            .iter()
            .copied()
            .filter(|r| !other.members.contains(r))
            .collect();
        Ok(self.derive(m))
    }

    fn check_ranks(
        &self,
        op: &'static str,
        ranks: &[u32],
        distinct: bool,
    ) -> Result<(), SessionError> {
        if let Some(bad) = ranks.iter().find(|&&r| r >= self.size()) {
            return Err(SessionError::BadRanks {
                op,
                reason: format!("rank {bad} is not in the group (size {})", self.size()),
            });
        }
        if distinct {
            let mut seen = ranks.to_vec();
            seen.sort_unstable();
            if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
                return Err(SessionError::BadRanks {
                    op,
                    reason: format!("rank {} is given twice", w[0]),
                });
            }
        }
        Ok(())
    }

    /// The group of the members at `ranks`, in that order.
    pub fn incl(&self, ranks: &[u32]) -> Result<Group, SessionError> {
        self.check_ranks("incl", ranks, true)?;
        Ok(self.derive(ranks.iter().map(|&r| self.members[r as usize]).collect()))
    }

    /// The group without the members at `ranks`.
    pub fn excl(&self, ranks: &[u32]) -> Result<Group, SessionError> {
        self.check_ranks("excl", ranks, true)?;
        let m = self
            .members
            .iter()
            .enumerate()
            .filter(|(i, _)| !ranks.contains(&(*i as u32)))
            .map(|(_, &r)| r)
            .collect();
        Ok(self.derive(m))
    }

    /// How this group compares with `other`.
    pub fn compare(&self, other: &Group) -> GroupCompare {
        if self.members == other.members {
            return GroupCompare::Ident;
        }
        let (mut a, mut b) = (self.members.to_vec(), other.members.to_vec());
        a.sort_unstable();
        b.sort_unstable();
        if a == b {
            GroupCompare::Similar
        } else {
            GroupCompare::Unequal
        }
    }
}

impl Communicator {
    /// Makes a communicator of the processes of `group` (MPI_Comm_create_from_group):
    /// collective over the group's members, which must all call it with the same tag.
    /// It runs a group construct that asks the root server for a PGCID, which becomes
    /// the communicator's context id: two communicators over the same processes never
    /// mix messages. Ranks follow the group's order.
    pub fn create_from_group(
        group: &Group,
        tag: &str,
        errh: ErrHandler,
    ) -> Result<Communicator, CommError> {
        Self::create_inner(group, tag).map_err(|e| errh.raise(e))
    }

    fn create_inner(group: &Group, tag: &str) -> Result<Communicator, CommError> {
        if tag.is_empty() {
            return Err(CommError::EmptyTag);
        }
        if group.session.finalized() {
            return Err(CommError::SessionFinalized);
        }
        let Some(rank) = group.rank() else {
            return Err(CommError::NotMember {
                tag: tag.into(),
                rank: group.me,
            });
        };
        let members = group.members.to_vec();
        let seq = {
            let mut m = COMM_SEQ.lock().unwrap_or_else(PoisonError::into_inner);
            let n = m.entry((tag.to_owned(), members.clone())).or_insert(0);
            *n += 1;
            *n
        };
        // Disjoint groups may use one tag at once (as a split does): the membership's
        // digest keeps their group ids apart.
        let digest = members.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &r| {
            r.to_le_bytes()
                .iter()
                .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
        });
        let group_id = format!("weft.comm/{tag}/{digest:016x}/{seq}");
        // Cards are fetched lazily on first send, so the construct moves no data.
        let directives = GroupDirectives::default().assign_context_id().no_data();
        let info = group
            .fabric
            .wire()
            .group_construct(&group_id, &members, &directives, None)
            .map_err(|source| CommError::Construct {
                tag: tag.into(),
                source,
            })?;
        let ctx = info.pgcid.ok_or_else(|| CommError::Construct {
            tag: tag.into(),
            source: GroupError::Invalid {
                op: "group construct",
                id: group_id.clone(),
                reason: "no PGCID was assigned".into(),
            },
        })?;
        let origin = Arc::new(CommOrigin {
            group_id,
            state: Mutex::new(CommState::Active),
            session: group.session.clone(),
        });
        group.session.comms().push(origin.clone());
        let identity = members.iter().enumerate().all(|(i, &r)| i as u32 == r);
        Ok(Communicator {
            inner: group.fabric.inner.clone(),
            ctx,
            rank,
            size: members.len() as u32,
            map: (!identity).then(|| Arc::new(RankMap::new(&members))),
            origin: Some(origin),
            shared: Arc::default(),
        })
    }

    /// A communicator of `members` (ranks of this one, in the new order, this process
    /// among them) whose context id is a fresh PGCID from the root server: a group
    /// construct named `id` over them, which every member calls with the same
    /// arguments. For collective libraries, when they cannot derive an id locally
    /// (see [`Communicator::derive`]). Freed locally, like a derived communicator.
    pub fn construct_on_server(
        &self,
        members: &[u32],
        id: &str,
    ) -> Result<Communicator, CommError> {
        let tag = format!("weft.coll/{id}");
        let Some(wire) = self.inner.wire.as_ref() else {
            return Err(CommError::Construct {
                tag,
                source: GroupError::Invalid {
                    op: "group construct",
                    id: id.into(),
                    reason: "this fabric has no wire-up service".into(),
                },
            });
        };
        let jobs: Vec<u32> = members
            .iter()
            .filter(|&&m| m < self.size)
            .map(|&m| self.job_rank(m))
            .collect();
        if jobs.len() != members.len() || !members.contains(&self.rank) {
            return Err(CommError::NotMember {
                tag,
                rank: self.inner.me,
            });
        }
        let directives = GroupDirectives::default().assign_context_id().no_data();
        let info = wire
            .group_construct(&tag, &jobs, &directives, None)
            .map_err(|source| CommError::Construct {
                tag: tag.clone(),
                source,
            })?;
        let ctx = info.pgcid.ok_or_else(|| CommError::Construct {
            tag: tag.clone(),
            source: GroupError::Invalid {
                op: "group construct",
                id: tag.clone(),
                reason: "no PGCID was assigned".into(),
            },
        })?;
        self.derive(members, ctx)
            .map_err(|e| CommError::Disconnect(format!("construct {tag}: {e}")))
    }

    /// Releases the communicator (MPI_Comm_free): local; its session's finalize
    /// synchronises with its peers later.
    pub fn free(self) -> Result<(), CommError> {
        let Some(o) = &self.origin else {
            // A communicator derived by dup or split has no group behind it.
            return if self.shared.derived {
                Ok(())
            } else {
                Err(CommError::Predefined)
            };
        };
        let mut st = o.state.lock().unwrap_or_else(PoisonError::into_inner);
        if *st == CommState::Active {
            *st = CommState::Freed;
        }
        Ok(())
    }

    /// Disconnects (MPI_Comm_disconnect): collective over the members; delivers what is
    /// buffered, then destructs the group behind the communicator, so that the
    /// session's finalize has nothing left to synchronise for it.
    pub fn disconnect(self) -> Result<(), CommError> {
        let Some(o) = &self.origin else {
            if !self.shared.derived {
                return Err(CommError::Predefined);
            }
            // Derived by dup or split: deliver what is buffered; no group to destruct.
            let fabric = Fabric {
                inner: self.inner.clone(),
            };
            return flush(&fabric).map_err(CommError::Disconnect);
        };
        if o.session.finalized() {
            return Err(CommError::SessionFinalized);
        }
        if o.state() == CommState::Disconnected {
            return Ok(());
        }
        let fabric = Fabric {
            inner: self.inner.clone(),
        };
        flush(&fabric).map_err(CommError::Disconnect)?;
        fabric
            .wire()
            .group_destruct(&o.group_id, None)
            .map_err(|e| CommError::Disconnect(e.to_string()))?;
        o.set_state(CommState::Disconnected);
        o.session.comms().retain(|c| !Arc::ptr_eq(c, o));
        Ok(())
    }
}
