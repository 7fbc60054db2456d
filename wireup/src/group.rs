//! Process groups (PMIx chapter "Process Sets and Groups"): collective construct and
//! destruct over any set of processes, with a PGCID handed out by the root server.
//!
//! A construct is a collective identified by (kind, sorted members, sequence, group id),
//! so it never collides with a fence or another group over the same processes. It runs
//! the same Bruck all-gather among the members' servers as a fence; when a context id is
//! asked for, the root server (node 0) takes part and puts a fresh PGCID in its block,
//! so every member gets the same value with no extra round trip. By default the
//! members' committed Remote/Global data travels with it (as in a Full fence): after a
//! construct, `get`s of the members' cards never leave the node.
//!
//! ```no_run
//! use std::time::Duration;
//! use weft_wireup::{Client, GroupDirectives};
//! let wire = Client::init()?;
//! let members: Vec<u32> = (0..wire.size()).collect();
//! let g = wire.group_construct("solver", &members,
//!     &GroupDirectives::default().assign_context_id(), Some(Duration::from_secs(30)))?;
//! println!("group {} has {} members, PGCID {:?}", g.id, g.members.len(), g.pgcid);
//! wire.group_destruct("solver", Some(Duration::from_secs(30)))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Mutex;
use std::time::Duration;

#[cfg(feature = "pmix")]
use crate::client::Backend;
use crate::client::{lock, ms, Client, ConnError};
use crate::proto::{ClientMsg, CollKind, GroupDirectives, GroupInfo, Procs, ServerMsg, WireError};
use crate::{ProcId, Rank};

/// Errors of group operations. Each names the group.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The operation timed out.
    #[error("{op} of group {id:?} timed out; processes that did not arrive: {missing:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The group id.
        id: String,
        /// Ranks that did not join in time.
        missing: Vec<Rank>,
    },
    /// A member died or finalized before joining.
    #[error("{op} of group {id:?} failed: rank {rank} {reason}")]
    ProcGone {
        /// The operation.
        op: &'static str,
        /// The group id.
        id: String,
        /// The rank.
        rank: Rank,
        /// What happened to it.
        reason: String,
    },
    /// The operation was aborted elsewhere.
    #[error("{op} of group {id:?} aborted: {reason}")]
    Aborted {
        /// The operation.
        op: &'static str,
        /// The group id.
        id: String,
        /// Why.
        reason: String,
    },
    /// The request was invalid (id in use, not a member, directives that differ, ...).
    #[error("{op} of group {id:?} is invalid: {reason}")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// The group id.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// The connection failed.
    #[error(transparent)]
    Conn(#[from] ConnError),
}

impl GroupError {
    fn from_wire(op: &'static str, id: &str, e: WireError) -> GroupError {
        let id = id.to_owned();
        match e {
            WireError::Timeout { missing, .. } => GroupError::Timeout { op, id, missing },
            WireError::ProcGone { rank, reason, .. } => GroupError::ProcGone {
                op,
                id,
                rank,
                reason,
            },
            WireError::Aborted { reason, .. } => GroupError::Aborted { op, id, reason },
            WireError::Invalid { reason, .. } => GroupError::Invalid { op, id, reason },
        }
    }

    fn unexpected(op: &'static str, id: &str, m: &ServerMsg) -> GroupError {
        GroupError::Invalid {
            op,
            id: id.to_owned(),
            reason: format!("unexpected reply {m:?}"),
        }
    }
}

impl GroupDirectives {
    /// Names the group's leader.
    pub fn leader(mut self, rank: Rank) -> Self {
        self.leader = Some(rank);
        self
    }
    /// Members that never join or die first are left out instead of failing the construct.
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }
    /// Only processes of this node take part.
    pub fn local_only(mut self) -> Self {
        self.local_only = true;
        self
    }
    /// A member's death is an event that shrinks the group, not an error.
    pub fn notify_termination(mut self) -> Self {
        self.notify_termination = true;
        self
    }
    /// The construct completes among the survivors when a member dies in it.
    pub fn ft_collective(mut self) -> Self {
        self.ft_collective = true;
        self
    }
    /// Asks for a PGCID.
    pub fn assign_context_id(mut self) -> Self {
        self.assign_context_id = true;
        self
    }
    /// Skips the exchange of the members' committed data.
    pub fn no_data(mut self) -> Self {
        self.no_data = true;
        self
    }
}

/// A group construct in progress ([`Client::group_construct_nb`]).
#[derive(Debug)]
pub struct PendingConstruct<'a> {
    client: &'a Client,
    id: String,
    req: u64,
    timeout: Option<Duration>,
    /// The result of a construct that completed when it started (under a PMIx host),
    /// until it is reported.
    ready: Option<Mutex<Option<Result<GroupInfo, GroupError>>>>,
}

impl PendingConstruct<'_> {
    /// The construct's result if it has completed; never blocks.
    pub fn test(&self) -> Option<Result<GroupInfo, GroupError>> {
        if let Some(r) = &self.ready {
            return Some(lock(r).take().unwrap_or_else(|| {
                Err(GroupError::Invalid {
                    op: "group construct",
                    id: self.id.clone(),
                    reason: "its result was reported already".into(),
                })
            }));
        }
        let polled = self
            .client
            .server("group construct")
            .and_then(|c| c.poll("group construct", self.req));
        self.client.dispatch_events();
        match polled {
            Ok(None) => None,
            Ok(Some(m)) => Some(self.client.construct_reply(&self.id, m)),
            Err(e) => Some(Err(e.into())),
        }
    }

    /// Waits for the construct to complete.
    pub fn wait(self) -> Result<GroupInfo, GroupError> {
        if self.ready.is_some() {
            return self
                .test()
                .unwrap_or_else(|| unreachable!("a ready construct"));
        }
        let m = self
            .client
            .server("group construct")
            .and_then(|c| c.wait("group construct", self.req, self.timeout));
        self.client.dispatch_events();
        self.client.construct_reply(&self.id, m?)
    }
}

/// A group destruct in progress ([`Client::group_destruct_nb`]).
#[derive(Debug)]
pub struct PendingDestruct<'a> {
    client: &'a Client,
    id: String,
    /// The request, or `None` for a destruct done locally (under a PMIx host).
    req: Option<u64>,
    timeout: Option<Duration>,
}

impl PendingDestruct<'_> {
    /// Waits for the destruct to complete.
    pub fn wait(self) -> Result<(), GroupError> {
        let op = "group destruct";
        let id = self.id.as_str();
        let Some(req) = self.req else {
            lock(&self.client.my_groups).remove(id);
            return Ok(());
        };
        let m = self
            .client
            .server(op)
            .and_then(|c| c.wait(op, req, self.timeout));
        self.client.dispatch_events();
        match m? {
            ServerMsg::Done { .. } => {
                lock(&self.client.my_groups).remove(id);
                Ok(())
            }
            ServerMsg::Failed { error, .. } => Err(GroupError::from_wire(op, id, error)),
            other => Err(GroupError::unexpected(op, id, &other)),
        }
    }
}

fn check_members(client: &Client, id: &str, procs: &[Rank]) -> Result<Procs, GroupError> {
    let invalid = |reason: String| GroupError::Invalid {
        op: "group construct",
        id: id.to_owned(),
        reason,
    };
    let size = client.size();
    if procs.is_empty() {
        return Err(invalid("no members".into()));
    }
    if let Some(bad) = procs.iter().find(|&&r| r >= size) {
        return Err(invalid(format!(
            "rank {bad} is not in the job (size {size})"
        )));
    }
    if !procs.contains(&client.rank()) {
        return Err(invalid(format!(
            "the caller (rank {}) is not among the members",
            client.rank()
        )));
    }
    Ok(Procs::List(procs.to_vec()).normalize(size))
}

impl Client {
    /// Constructs group `id` over `procs` (which must include the caller); blocks until
    /// every member has called it with the same id, members and directives (or, with
    /// `optional`, until the timeout or the deaths of the missing ones). Returns the
    /// final membership, the PGCID when `assign_context_id` asked for one (the same at
    /// every member), and makes every member's committed data available locally.
    pub fn group_construct(
        &self,
        id: &str,
        procs: &[Rank],
        directives: &GroupDirectives,
        timeout: Option<Duration>,
    ) -> Result<GroupInfo, GroupError> {
        self.group_construct_nb(id, procs, directives, timeout)?
            .wait()
    }

    /// Starts a group construct; complete it with [`PendingConstruct::wait`] or poll it
    /// with [`PendingConstruct::test`].
    pub fn group_construct_nb(
        &self,
        id: &str,
        procs: &[Rank],
        directives: &GroupDirectives,
        timeout: Option<Duration>,
    ) -> Result<PendingConstruct<'_>, GroupError> {
        let procs = check_members(self, id, procs)?;
        let cid = self.coll_id(CollKind::GroupConstruct, procs, id);
        #[cfg(feature = "pmix")]
        if let Backend::Pmix(px) = self.backend() {
            // Under a PMIx host: Weft's own construct over the host's fence.
            let r = px
                .group_construct(self.size(), &cid, directives, timeout, || {
                    self.run_progress()
                })
                .inspect(|g| {
                    lock(&self.my_groups).insert(id.to_owned(), g.clone());
                });
            return Ok(PendingConstruct {
                client: self,
                id: id.to_owned(),
                req: 0,
                timeout,
                ready: Some(Mutex::new(Some(r))),
            });
        }
        let directives = directives.clone();
        let timeout_ms = ms(timeout);
        let req = self
            .server("group construct")?
            .start("group construct", |req| ClientMsg::Group {
                req,
                id: cid,
                directives,
                timeout_ms,
            })?;
        Ok(PendingConstruct {
            client: self,
            id: id.to_owned(),
            req,
            timeout,
            ready: None,
        })
    }

    fn construct_reply(&self, id: &str, m: ServerMsg) -> Result<GroupInfo, GroupError> {
        match m {
            ServerMsg::Group { group, .. } => {
                lock(&self.my_groups).insert(id.to_owned(), group.clone());
                Ok(group)
            }
            ServerMsg::Failed { error, .. } => {
                Err(GroupError::from_wire("group construct", id, error))
            }
            other => Err(GroupError::unexpected("group construct", id, &other)),
        }
    }

    /// Destructs group `id`: a collective over its members (those that died are not
    /// waited for when the group was made with `notify_termination`). The id may be
    /// used again afterwards; its PGCID never is.
    pub fn group_destruct(&self, id: &str, timeout: Option<Duration>) -> Result<(), GroupError> {
        self.group_destruct_nb(id, timeout)?.wait()
    }

    /// Starts a group destruct; complete it with [`PendingDestruct::wait`]. Several
    /// destructs may be in progress at once (a session finalize runs them concurrently).
    pub fn group_destruct_nb(
        &self,
        id: &str,
        timeout: Option<Duration>,
    ) -> Result<PendingDestruct<'_>, GroupError> {
        let op = "group destruct";
        let Some(g) = lock(&self.my_groups).get(id).cloned() else {
            return Err(GroupError::Invalid {
                op,
                id: id.to_owned(),
                reason: format!("rank {} is not a member of such a group", self.rank()),
            });
        };
        #[cfg(feature = "pmix")]
        if let Backend::Pmix(px) = self.backend() {
            // A group constructed at the host is destructed there (a collective of its
            // members); Weft's own construct under a host is destructed locally, as its
            // PGCID is never handed out again (see `crate::pmix`).
            let notify = g.directives.notify_termination;
            px.host_destruct(id, &g.members, notify, timeout, &mut || self.run_progress())?;
            px.forget_group(id);
            return Ok(PendingDestruct {
                client: self,
                id: id.to_owned(),
                req: None,
                timeout,
            });
        }
        let procs = Procs::List(g.members.clone()).normalize(self.size());
        let cid = self.coll_id(CollKind::GroupDestruct, procs, id);
        let timeout_ms = ms(timeout);
        let req = self.server(op)?.start(op, |req| ClientMsg::Group {
            req,
            id: cid,
            directives: g.directives.clone(),
            timeout_ms,
        })?;
        Ok(PendingDestruct {
            client: self,
            id: id.to_owned(),
            req: Some(req),
            timeout,
        })
    }

    /// As leader, forms group `id` by invitation (PMIx_Group_invite): each of `procs`
    /// gets an invited event and answers with [`Client::group_join`]; the leader gets
    /// invite-accepted, invite-declined and invite-failed (death, or no answer within
    /// `timeout`) events. Returns the group (the leader and those that accepted) once
    /// every invitee answered or failed; every member gets a construct-complete event.
    pub fn group_invite(
        &self,
        id: &str,
        procs: &[Rank],
        directives: &GroupDirectives,
        timeout: Option<Duration>,
    ) -> Result<GroupInfo, GroupError> {
        let op = "group invite";
        let procs: Vec<ProcId> = procs.iter().map(|&r| ProcId::new(self.ns(), r)).collect();
        let (idc, directives) = (id.to_owned(), directives.clone());
        let timeout_ms = ms(timeout);
        // The server answers by the timeout at the latest (then the late ones failed).
        let m = self.server(op).and_then(|c| {
            c.call(
                op,
                |req| ClientMsg::GroupInvite {
                    req,
                    id: idc,
                    procs,
                    directives,
                    timeout_ms,
                },
                timeout,
            )
        });
        self.dispatch_events();
        match m? {
            ServerMsg::Group { group, .. } => {
                lock(&self.my_groups).insert(id.to_owned(), group.clone());
                Ok(group)
            }
            ServerMsg::Failed { error, .. } => Err(GroupError::from_wire(op, id, error)),
            other => Err(GroupError::unexpected(op, id, &other)),
        }
    }

    /// Answers an invitation of `leader` into group `id` (after an invited event).
    /// Declining returns `None` at once; accepting waits until the group is formed and
    /// returns it, or fails if the leader dies first (a construct-abort event).
    pub fn group_join(
        &self,
        id: &str,
        leader: Rank,
        accept: bool,
        timeout: Option<Duration>,
    ) -> Result<Option<GroupInfo>, GroupError> {
        let op = "group join";
        let idc = id.to_owned();
        let m = self.server(op).and_then(|c| {
            c.call(
                op,
                |req| ClientMsg::GroupJoin {
                    req,
                    id: idc,
                    leader: ProcId::new(self.ns(), leader),
                    accept,
                },
                timeout,
            )
        });
        self.dispatch_events();
        match m? {
            ServerMsg::Done { .. } => Ok(None),
            ServerMsg::Group { group, .. } => {
                lock(&self.my_groups).insert(id.to_owned(), group.clone());
                Ok(Some(group))
            }
            ServerMsg::Failed { error, .. } => Err(GroupError::from_wire(op, id, error)),
            other => Err(GroupError::unexpected(op, id, &other)),
        }
    }

    /// Every group with members on this node, as this node's server knows them (after a
    /// member's death, groups made with `notify_termination` no longer list it).
    pub fn groups(&self) -> Result<Vec<GroupInfo>, GroupError> {
        let m = self
            .server("group query")?
            .call_bounded("group query", |req| ClientMsg::GroupQuery { req })?;
        match m {
            ServerMsg::Groups { groups, .. } => Ok(groups),
            other => Err(GroupError::unexpected("group query", "*", &other)),
        }
    }

    /// Group `id`, if this node's server knows it.
    pub fn group(&self, id: &str) -> Result<Option<GroupInfo>, GroupError> {
        Ok(self.groups()?.into_iter().find(|g| g.id == id))
    }

    /// The ids of the groups `rank` (a process of this node) is a member of.
    pub fn groups_of(&self, rank: Rank) -> Result<Vec<String>, GroupError> {
        Ok(self
            .groups()?
            .into_iter()
            .filter(|g| g.members.contains(&rank))
            .map(|g| g.id)
            .collect())
    }
}
