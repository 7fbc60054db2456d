//! Process groups: constructs (collective and by invitation), leaders, members that leave or die.

use super::*;

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
        if record.members.iter().any(|r| self.procs.contains_key(r)) {
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
        if !to.iter().any(|r| self.procs.contains_key(r)) {
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
        let gone = &self.gone;
        let acts = self
            .leaders
            .on_claim(id, rank, (conn, req), nodes, |r| gone.contains_key(&r));
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
    pub(super) fn invite_arrived(
        &mut self,
        id: String,
        leader: Rank,
        rank: Rank,
        procs: Vec<Rank>,
    ) {
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

    pub(super) fn group_join(
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
    pub(super) fn invite_reply(&mut self, id: &str, rank: Rank, accept: bool) {
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
    pub(super) fn invite_failed(&mut self, id: &str, rank: Rank, why: String) {
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

    pub(super) fn maybe_form(&mut self, id: &str) {
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
            let p = self.pgcids.take();
            return self.form_invited(id, Some(p));
        }
        inv.asked_pgcid = true;
        let qid = self.next_qid;
        self.next_qid += 1;
        self.pgcid_waiters.insert(qid, id.to_owned());
        let from = self.node;
        self.send_peer(0, &PeerMsg::PgcidReq { qid, from });
    }

    pub(super) fn form_invited(&mut self, id: &str, pgcid: Option<u64>) {
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
    pub(super) fn group_formed(&mut self, group: GroupInfo) {
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
    pub(super) fn invitations_lose(&mut self, rank: Rank, reason: &str) {
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
}
