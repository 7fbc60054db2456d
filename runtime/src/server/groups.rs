//! Process groups: constructs (collective and by invitation), leaders, members that leave or die.

use weft_wireup::Rank;

use super::{fence, invitations, State};
use crate::modex::ConnId;
use crate::wire::proto::{
    CollId, CollKind, Event as WireEvent, EventCode, FenceMode, GroupBlock, GroupDirectives,
    GroupInfo, GroupSpec, PeerMsg, ServerMsg, WireError,
};

impl State {
    /// Checks a group construct or destruct request, then joins it like a fence.
    pub(super) fn group_arrive(
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
                let busy = self.fences.construct_in_progress(&id);
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
                        .filter(|r| !self.procs.is_local(*r))
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
                            g.members.binary_search(r).is_err() && !self.procs.is_gone(*r)
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

    /// A group construct or destruct gathered every node's block (`fence`): its result
    /// answers the local waiters, and the fences remember how it ended.
    pub(super) fn group_gathered(&mut self, id: CollId, c: fence::Gathered) {
        let mut err = None;
        let mut record = None;
        if id.kind == CollKind::GroupConstruct {
            match self.group_result(&id, &c) {
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
            self.send_client(conn, &msg);
        }
        self.fences.finish(id, err);
    }

    /// The group a completed construct made, from every node's block; records it here
    /// when it has members on this node.
    pub(super) fn group_result(
        &mut self,
        id: &CollId,
        c: &fence::Gathered,
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
        if record.members.iter().any(|r| self.procs.is_local(*r)) {
            self.groups.insert(id.name.clone(), record.clone());
        }
        Ok(record)
    }

    /// The groups `rank` was in learn of its death: notify-termination groups drop it
    /// and tell their leader (or every member), groups it led tell every member.
    pub(super) fn groups_lose(&mut self, rank: Rank, reason: &str) {
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
    pub(super) fn nodes_of(&self, members: &[Rank]) -> Vec<u32> {
        let mut nodes: Vec<u32> = members
            .iter()
            .filter_map(|&r| self.plan.job.node_of(r))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    pub(super) fn group_invalid(&self, conn: ConnId, req: u64, op: &str, id: &str, reason: String) {
        let error = WireError::Invalid {
            op: format!("{op} of {id:?}"),
            reason,
        };
        self.send_client(conn, &ServerMsg::Failed { req, error });
    }

    /// Group `id` as this server knows it, if `rank` is one of its members.
    pub(super) fn member_group(&self, id: &str, rank: Rank) -> Result<&GroupInfo, String> {
        match self.groups.get(id) {
            None => Err("no such group on this node".into()),
            Some(g) if !g.members.contains(&rank) => Err(format!("rank {rank} is not a member")),
            Some(g) => Ok(g),
        }
    }

    pub(super) fn group_leave(&mut self, rank: Rank, conn: ConnId, req: u64, id: String) {
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
    pub(super) fn member_left(&mut self, id: &str, rank: Rank) {
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
        if !to.iter().any(|r| self.procs.is_local(*r)) {
            self.groups.remove(id);
        }
        for r in to {
            self.emit(r, &e);
        }
    }

    pub(super) fn leader_claim(&mut self, rank: Rank, conn: ConnId, req: u64, id: String) {
        let g = match self.member_group(&id, rank) {
            Ok(g) => g,
            Err(reason) => return self.group_invalid(conn, req, "leader claim", &id, reason),
        };
        if let Some(l) = g.leader.filter(|l| !self.procs.is_gone(*l)) {
            return self.group_invalid(
                conn,
                req,
                "leader claim",
                &id,
                format!("rank {l} still leads the group"),
            );
        }
        let nodes = self.nodes_of(&g.members);
        let ended = &self.procs;
        let acts = self
            .leaders
            .on_claim(id, rank, (conn, req), nodes, |r| ended.is_gone(r));
        self.apply_leaders(acts);
    }

    pub(super) fn leader_selected(&mut self, id: &str, rank: Rank) {
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

    #[allow(clippy::too_many_arguments)]
    pub(super) fn group_invite(
        &mut self,
        leader: Rank,
        conn: ConnId,
        req: u64,
        id: String,
        procs: Vec<Rank>,
        directives: GroupDirectives,
        timeout_ms: Option<u64>,
    ) {
        let in_use = self.groups.contains_key(&id);
        let inv = invitations::Invite {
            leader,
            conn,
            req,
            id,
            procs,
            directives,
            timeout_ms,
        };
        let ended = &self.procs;
        let acts = self.invitations.on_invite(
            inv,
            in_use,
            &self.plan.job.nspace,
            |r| ended.why_gone(r).map(str::to_owned),
            &mut self.pgcids,
        );
        self.apply_invitations(acts);
    }

    pub(super) fn group_join(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        id: String,
        leader: Rank,
        accept: bool,
    ) {
        let acts = self
            .invitations
            .on_join(rank, conn, req, id, leader, accept, &mut self.pgcids);
        self.apply_invitations(acts);
    }
}
