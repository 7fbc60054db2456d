//! The process groups of a server, without IO: the checks of a construct or destruct
//! request before it joins its collective (the `fence` concern gathers it), the group a
//! completed construct made, and the membership afterwards (a member that leaves or
//! dies, a failed leader and its replacement). Every `on_*` method takes an input and
//! returns the [`Action`]s the server carries out (replies, peer messages, events to
//! local processes, arrivals for the fences, claims for the leader selection), so the
//! state machine is tested without sockets, tasks or time (see `groups/tests.rs`).
//!
//! The groups know no job: the node of each rank (`owners`) is given when they are
//! made, and what they read of other concerns (which ranks are gone, which namespace an
//! id must not take, whether a construct of the same id is in progress) is passed in.
//! Groups formed by invitation are recorded here once formed (`invitations` decides
//! that); the leader selection itself is `leaders`, the PGCIDs `pgcids`.

use std::collections::{BTreeMap, BTreeSet};

use weft_wireup::Rank;

use super::fence::{Arrival, Gathered};
use crate::modex::ConnId;
use crate::wire::proto::{
    CollId, CollKind, Event as WireEvent, EventCode, FenceMode, GroupBlock, GroupDirectives,
    GroupInfo, GroupSpec, JobMsg, ProcData, ServerMsg, WireError,
};

/// What the server must do.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Send `msg` to the client connection `conn`.
    Reply { conn: ConnId, msg: ServerMsg },
    /// Send to the server of `node`.
    Peer { node: u32, msg: JobMsg },
    /// Send `event` to local process `rank`.
    Emit { rank: Rank, event: WireEvent },
    /// A checked request joins its collective (the fence concern's `on_arrive`).
    Arrive(Arrival),
    /// What a construct carried of other nodes' members: for the data concern.
    Learn(ProcData),
    /// Collective `id` ended (`error`: how it failed): the fences remember it
    /// (`Fences::finish`).
    Finished {
        id: CollId,
        error: Option<WireError>,
    },
    /// Local rank `rank` claims the leadership of group `id`, whose members live on
    /// `nodes` (request `req` of `conn`): for the leader selection (`Leaders::on_claim`).
    Claim {
        id: String,
        rank: Rank,
        conn: ConnId,
        req: u64,
        nodes: Vec<u32>,
    },
}

/// A group construct or destruct request of a local process.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) rank: Rank,
    pub(crate) conn: ConnId,
    pub(crate) req: u64,
    pub(crate) id: CollId,
    pub(crate) directives: GroupDirectives,
    pub(crate) timeout_ms: Option<u64>,
}

/// What a request's checks read of the rest of the server.
#[derive(Clone, Copy)]
pub(crate) struct Checks<'a> {
    /// The namespace a group id must not take.
    pub(crate) nspace: &'a str,
    /// Whether a construct of the same id is in progress (`Fences::construct_in_progress`).
    pub(crate) busy: bool,
    /// Whether a rank is gone.
    pub(crate) gone: &'a dyn Fn(Rank) -> bool,
}

impl std::fmt::Debug for Checks<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checks")
            .field("nspace", &self.nspace)
            .field("busy", &self.busy)
            .finish_non_exhaustive()
    }
}

/// The groups with members on one server's node.
#[derive(Debug)]
pub(crate) struct Groups {
    node: u32,
    /// The node of each rank (index: rank).
    owners: Vec<u32>,
    /// Groups with members on this node, by id.
    groups: BTreeMap<String, GroupInfo>,
    /// Members that left a group this node has not recorded yet (its construct has
    /// completed at the leaver's node, not here yet), by group id: applied when it is.
    left_early: BTreeMap<String, BTreeSet<Rank>>,
    /// Leaders selected (`leaders`) for a group this node has not recorded yet, by id.
    selected_early: BTreeMap<String, Rank>,
}

impl Groups {
    /// The groups of the server of `node`; rank `r` lives on node `owners[r]`.
    pub(crate) fn new(node: u32, owners: Vec<u32>) -> Groups {
        Groups {
            node,
            owners,
            groups: BTreeMap::new(),
            left_early: BTreeMap::new(),
            selected_early: BTreeMap::new(),
        }
    }

    fn is_local(&self, rank: Rank) -> bool {
        is_on(&self.owners, self.node, rank)
    }

    fn size(&self) -> Rank {
        self.owners.len() as Rank
    }

    /// Group `id`, if it has members on this node.
    #[cfg(test)]
    pub(crate) fn get(&self, id: &str) -> Option<&GroupInfo> {
        self.groups.get(id)
    }

    /// Whether a group `id` has members on this node.
    pub(crate) fn in_use(&self, id: &str) -> bool {
        self.groups.contains_key(id)
    }

    /// Records `group` (formed by invitation, natively or under PMIx) if it has members
    /// on this node; returns the group it replaced.
    pub(crate) fn record(&mut self, group: GroupInfo) -> Option<GroupInfo> {
        if !group.members.iter().any(|r| self.is_local(*r)) {
            return None;
        }
        self.groups.insert(group.id.clone(), group)
    }

    /// The nodes that hold members of `members`, in order.
    pub(crate) fn nodes_of(&self, members: &[Rank]) -> Vec<u32> {
        let mut nodes: Vec<u32> = members
            .iter()
            .filter_map(|&r| self.owners.get(r as usize).copied())
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// A query of the groups this node knows (request `req` of `conn`).
    pub(crate) fn on_query(&self, conn: ConnId, req: u64) -> Vec<Action> {
        let groups = self.groups.values().cloned().collect();
        vec![Action::Reply {
            conn,
            msg: ServerMsg::Groups { req, groups },
        }]
    }

    /// A group construct or destruct request: checked, then it joins its collective.
    pub(crate) fn on_request(&self, r: Request, cx: Checks<'_>) -> Vec<Action> {
        let Request {
            rank,
            conn,
            req,
            id,
            directives,
            timeout_ms,
        } = r;
        if let Err(reason) = self.check(rank, &id, &directives, cx) {
            let error = WireError::Invalid {
                op: format!("{} of {:?}", id.op(), id.name),
                reason,
            };
            let msg = ServerMsg::Failed { req, error };
            return vec![Action::Reply { conn, msg }];
        }
        let mode = if id.kind == CollKind::GroupConstruct && !directives.no_data {
            FenceMode::Full
        } else {
            FenceMode::SyncOnly
        };
        let group = Some(GroupSpec {
            directives,
            timeout_ms,
        });
        vec![Action::Arrive(Arrival {
            rank,
            conn,
            req,
            id,
            mode,
            timeout_ms,
            group,
        })]
    }

    /// Why rank `rank`'s request for `id` is refused, if it is.
    fn check(
        &self,
        rank: Rank,
        id: &CollId,
        directives: &GroupDirectives,
        cx: Checks<'_>,
    ) -> Result<(), String> {
        match id.kind {
            CollKind::Fence => Err("a group request carried a fence id".into()),
            CollKind::GroupConstruct => {
                if id.name.is_empty() {
                    return Err("the group id is empty".into());
                }
                if id.name == cx.nspace || id.name.starts_with("weft://") {
                    return Err(format!(
                        "the group id collides with a namespace ({} or the reserved weft:// prefix)",
                        cx.nspace
                    ));
                }
                if let Some(g) = self.groups.get(&id.name) {
                    return Err(format!(
                        "the group id is already in use (members {:?}); destruct it first",
                        g.members
                    ));
                }
                if cx.busy {
                    return Err("the group id is already in use by another construct in progress (the same tag used twice concurrently?)".into());
                }
                if directives.local_only {
                    let elsewhere: Vec<Rank> = id
                        .procs
                        .ranks(self.size())
                        .into_iter()
                        .filter(|r| !self.is_local(*r))
                        .collect();
                    if !elsewhere.is_empty() {
                        return Err(format!(
                            "local-only, but ranks {elsewhere:?} are not on node {}",
                            self.node
                        ));
                    }
                }
                if let Some(l) = directives.leader {
                    if !id.procs.contains(l) {
                        return Err(format!("the leader {l} is not a member"));
                    }
                }
                Ok(())
            }
            CollKind::GroupDestruct => match self.groups.get(&id.name) {
                None => Err("no such group on this node".into()),
                Some(g) if !g.members.contains(&rank) => {
                    Err(format!("rank {rank} is not a member"))
                }
                // Members that died since the construct may still be listed (every survivor
                // lists the membership the construct returned, so their ids agree).
                Some(g)
                    if g.members.iter().any(|&m| !id.procs.contains(m))
                        || id
                            .procs
                            .ranks(self.size())
                            .iter()
                            .any(|r| g.members.binary_search(r).is_err() && !(cx.gone)(*r)) =>
                {
                    Err(format!(
                        "the membership {:?} does not match the group's {:?}",
                        id.procs, g.members
                    ))
                }
                Some(_) => Ok(()),
            },
        }
    }

    /// A group construct or destruct gathered every node's block (`fence`): its result
    /// answers the local waiters, then the fences remember how it ended. A construct's
    /// group is recorded here less what this node learned before it completed here:
    /// members that left it already, and (`gone`: why a rank is gone) members that died
    /// after they joined; the local members hear of those after the result, as they
    /// would have had it completed here first.
    pub(crate) fn on_gathered(
        &mut self,
        id: CollId,
        c: Gathered,
        gone: impl Fn(Rank) -> Option<String>,
    ) -> Vec<Action> {
        let mut acts = Vec::new();
        let mut err = None;
        let mut record = None;
        if id.kind == CollKind::GroupConstruct {
            match self.construct_result(&id, &c, &mut acts) {
                Ok(r) => record = Some(r),
                Err(e) => err = Some(e),
            }
        } else {
            self.groups.remove(&id.name);
        }
        for &(conn, req) in &c.waiters {
            let msg = match (&err, &record) {
                (Some(e), _) => ServerMsg::Failed {
                    req,
                    error: e.clone(),
                },
                (None, Some(g)) => ServerMsg::Group {
                    req,
                    group: g.clone(),
                },
                (None, None) => ServerMsg::Done { req },
            };
            acts.push(Action::Reply { conn, msg });
        }
        if let Some(g) = record.filter(|g| g.members.iter().any(|r| self.is_local(*r))) {
            let members = g.members.clone();
            self.groups.insert(id.name.clone(), g);
            for rank in self.left_early.remove(&id.name).unwrap_or_default() {
                if !self.in_use(&id.name) {
                    break; // its last local member left
                }
                acts.extend(self.on_member_left(&id.name, rank));
            }
            // A leader selected before a death this node knows of was selected before
            // the other nodes learned of that death too.
            if let Some(rank) = self.selected_early.remove(&id.name) {
                let dead = gone(rank).is_some();
                acts.extend(self.on_leader_selected(&id.name, rank, dead));
            }
            for rank in members {
                if let Some(why) = gone(rank) {
                    acts.extend(self.lose(&id.name, rank, &why));
                }
            }
        } else if id.kind == CollKind::GroupDestruct {
            self.left_early.remove(&id.name);
            self.selected_early.remove(&id.name);
        }
        acts.push(Action::Finished { id, error: err });
        acts
    }

    /// The group a completed construct made, from every node's block (other nodes'
    /// data goes to `acts`).
    fn construct_result(
        &mut self,
        id: &CollId,
        c: &Gathered,
        acts: &mut Vec<Action>,
    ) -> Result<GroupInfo, WireError> {
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
                acts.push(Action::Learn(block.data));
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
            .ranks(self.size())
            .into_iter()
            .filter(|r| members.binary_search(r).is_err())
            .collect();
        // A designated leader that was left out (an optional construct it never joined)
        // leads nothing: the group starts without a leader, and a member may claim it.
        let leader = directives
            .leader
            .filter(|l| members.binary_search(l).is_ok());
        let record = GroupInfo {
            id: id.name.clone(),
            members,
            pgcid,
            leader,
            left_out,
            directives,
        };
        Ok(record)
    }

    /// Rank `rank` is gone (as `reason` says): notify-termination groups drop it and
    /// tell their leader (or every member), groups it led tell every member.
    pub(crate) fn on_proc_gone(&mut self, rank: Rank, reason: &str) -> Vec<Action> {
        let ids: Vec<String> = self.groups.keys().cloned().collect();
        ids.iter()
            .flat_map(|id| self.lose(id, rank, reason))
            .collect()
    }

    /// Group `id` learns of member `rank`'s death (`reason`).
    fn lose(&mut self, id: &str, rank: Rank, reason: &str) -> Vec<Action> {
        let (node, owners) = (self.node, &self.owners);
        let Some(g) = self.groups.get_mut(id) else {
            return Vec::new();
        };
        if !g.members.contains(&rank) {
            return Vec::new();
        }
        let mut acts = Vec::new();
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
            let event = WireEvent {
                code,
                group: Some(g.id.clone()),
                rank: Some(rank),
                pset: None,
                members: g.members.clone(),
                reason: format!("rank {rank} {reason}"),
                proc: None,
            };
            let to = to.into_iter().filter(|&r| r != rank);
            acts.extend(emits(owners, node, to, &event));
        }
        // Its last local member gone, this node keeps no record (as after a leave).
        if !g.members.iter().any(|&r| is_on(owners, node, r)) {
            self.groups.remove(id);
        }
        acts
    }

    /// Group `id` as this server knows it, if `rank` is one of its members.
    fn member_group(&self, id: &str, rank: Rank) -> Result<&GroupInfo, String> {
        match self.groups.get(id) {
            None => Err("no such group on this node".into()),
            Some(g) if !g.members.contains(&rank) => Err(format!("rank {rank} is not a member")),
            Some(g) => Ok(g),
        }
    }

    /// Local rank `rank` leaves group `id` (request `req` of `conn`): the other nodes
    /// with members and the remaining local members learn of it.
    pub(crate) fn on_leave(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        id: String,
    ) -> Vec<Action> {
        let g = match self.member_group(&id, rank) {
            Ok(g) => g,
            Err(reason) => return vec![invalid(conn, req, "group leave", &id, reason)],
        };
        let me = self.node;
        let mut acts: Vec<Action> = self
            .nodes_of(&g.members)
            .into_iter()
            .filter(|&n| n != me)
            .map(|node| Action::Peer {
                node,
                msg: JobMsg::GroupLeft {
                    id: id.clone(),
                    rank,
                },
            })
            .collect();
        acts.extend(self.on_member_left(&id, rank));
        acts.push(Action::Reply {
            conn,
            msg: ServerMsg::Done { req },
        });
        acts
    }

    /// `rank` left group `id`: the remaining local members get a member-left event.
    /// A group this node has not recorded yet remembers it for when it is.
    pub(crate) fn on_member_left(&mut self, id: &str, rank: Rank) -> Vec<Action> {
        let Some(g) = self.groups.get_mut(id) else {
            self.left_early
                .entry(id.to_owned())
                .or_default()
                .insert(rank);
            return Vec::new();
        };
        g.members.retain(|&r| r != rank);
        if g.leader == Some(rank) {
            g.leader = None;
        }
        let event = WireEvent {
            code: EventCode::MemberLeft,
            group: Some(id.to_owned()),
            rank: Some(rank),
            pset: None,
            members: g.members.clone(),
            reason: format!("rank {rank} left the group"),
            proc: None,
        };
        let to = g.members.clone();
        if !to.iter().any(|r| self.is_local(*r)) {
            self.groups.remove(id);
        }
        emits(&self.owners, self.node, to, &event)
    }

    /// Local rank `rank` claims the leadership of group `id` (request `req` of `conn`);
    /// `gone` says which ranks are gone. A living leader keeps it.
    pub(crate) fn on_leader_claim(
        &self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        id: String,
        gone: impl Fn(Rank) -> bool,
    ) -> Vec<Action> {
        let g = match self.member_group(&id, rank) {
            Ok(g) => g,
            Err(reason) => return vec![invalid(conn, req, "leader claim", &id, reason)],
        };
        if let Some(l) = g.leader.filter(|l| !gone(*l)) {
            let reason = format!("rank {l} still leads the group");
            return vec![invalid(conn, req, "leader claim", &id, reason)];
        }
        let nodes = self.nodes_of(&g.members);
        vec![Action::Claim {
            id,
            rank,
            conn,
            req,
            nodes,
        }]
    }

    /// The leader selection chose `rank` to lead group `id`: the local members learn it.
    /// A group this node has not recorded yet remembers it for when it is. A rank that
    /// is no member any more (it left, or died in a notify-termination group) or is
    /// `gone` leads nothing: the other nodes learn of that after the selection, and
    /// drop the leader then.
    pub(crate) fn on_leader_selected(&mut self, id: &str, rank: Rank, gone: bool) -> Vec<Action> {
        let Some(g) = self.groups.get_mut(id) else {
            self.selected_early.insert(id.to_owned(), rank);
            return Vec::new();
        };
        if gone || !g.members.contains(&rank) {
            return Vec::new();
        }
        g.leader = Some(rank);
        let event = WireEvent {
            code: EventCode::LeaderSelected,
            group: Some(id.to_owned()),
            rank: Some(rank),
            pset: None,
            members: g.members.clone(),
            reason: format!("rank {rank} declared itself the leader"),
            proc: None,
        };
        emits(&self.owners, self.node, g.members.iter().copied(), &event)
    }
}

/// Whether rank `rank` lives on `node`, by `owners`.
fn is_on(owners: &[u32], node: u32, rank: Rank) -> bool {
    owners.get(rank as usize) == Some(&node)
}

/// `event` to each rank of `to` that lives on `node` (the others' servers tell them).
fn emits(
    owners: &[u32],
    node: u32,
    to: impl IntoIterator<Item = Rank>,
    event: &WireEvent,
) -> Vec<Action> {
    to.into_iter()
        .filter(|&r| is_on(owners, node, r))
        .map(|rank| Action::Emit {
            rank,
            event: event.clone(),
        })
        .collect()
}

/// The answer refusing request `req` of `conn` (an `op` of group `id`) for `reason`.
fn invalid(conn: ConnId, req: u64, op: &str, id: &str, reason: String) -> Action {
    let error = WireError::Invalid {
        op: format!("{op} of {id:?}"),
        reason,
    };
    Action::Reply {
        conn,
        msg: ServerMsg::Failed { req, error },
    }
}

#[cfg(test)]
pub(super) mod tests;
