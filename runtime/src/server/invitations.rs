//! Groups formed by invitation, without IO: a leader invites ranks into a group, each
//! invitee's server tells it and carries its answer back, and once every invitee has
//! answered (accepted, declined, died or timed out) the leader's server forms the group
//! of those that accepted, with a PGCID from the root server when asked, and tells every
//! member's server. Every `on_*` method returns the [`Action`]s the server carries out
//! (see `invitations/tests.rs`); messages to this server's own processes are handled
//! here directly.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use crate::wire::proto::{
    Event, EventCode, GroupDirectives, GroupInfo, JobMsg, ServerMsg, WireError,
};
use weft_wireup::Rank;

use super::pgcids::Pgcids;
use crate::modex::ConnId;

/// What the server must do.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Send `msg` to the client connection `conn`.
    Reply { conn: ConnId, msg: ServerMsg },
    /// Send to the server of `node` (never this one).
    Peer { node: u32, msg: JobMsg },
    /// Send `event` to local process `rank`.
    Emit { rank: Rank, event: Event },
    /// Call [`Invitations::on_timeout`] with `id` after `after`.
    Timer { id: String, after: Duration },
    /// The group has members here: the groups concern records it (before the replies
    /// and events that follow).
    Record(GroupInfo),
}

/// A group being formed by invitation, at its leader's server.
#[derive(Debug)]
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

/// A local invitee: its leader, and its accepting join request once made.
type Invitee = (Rank, Option<(ConnId, u64)>);

/// What an invite asks.
#[derive(Debug, Clone)]
pub(crate) struct Invite {
    pub(crate) leader: Rank,
    pub(crate) conn: ConnId,
    pub(crate) req: u64,
    pub(crate) id: String,
    pub(crate) procs: Vec<Rank>,
    pub(crate) directives: GroupDirectives,
    pub(crate) timeout_ms: Option<u64>,
}

/// The invitations of one server.
#[derive(Debug)]
pub(crate) struct Invitations {
    node: u32,
    /// The node of every rank of the job.
    owners: Vec<u32>,
    /// Groups being formed, led by a local process.
    leading: HashMap<String, Invitation>,
    /// Local invitees of groups being formed, by (id, invitee).
    invited: HashMap<(String, Rank), Invitee>,
    /// PGCID requests to the root server, by query id: the invitation they are for.
    pgcid_waiters: HashMap<u64, String>,
    next_qid: u64,
}

fn event(code: EventCode, group: &str, rank: Rank, members: Vec<Rank>, reason: String) -> Event {
    Event {
        code,
        group: Some(group.to_owned()),
        rank: Some(rank),
        pset: None,
        members,
        reason,
        proc: None,
    }
}

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

impl Invitations {
    /// The invitations of the server of `node`; `owners[r]` is the node of rank `r`.
    pub(crate) fn new(node: u32, owners: Vec<u32>) -> Invitations {
        Invitations {
            node,
            owners,
            leading: HashMap::new(),
            invited: HashMap::new(),
            pgcid_waiters: HashMap::new(),
            // Query ids carry the asking node in their top 16 bits.
            next_qid: (u64::from(node) << 48) | 1,
        }
    }

    fn node_of(&self, rank: Rank) -> u32 {
        self.owners.get(rank as usize).copied().unwrap_or(0)
    }

    fn is_local(&self, rank: Rank) -> bool {
        self.owners.get(rank as usize) == Some(&self.node)
    }

    /// Sends `msg` to the server of `node`, or handles it here when that is this one.
    fn send(&mut self, node: u32, msg: JobMsg, pgcids: &mut Pgcids, acts: &mut Vec<Action>) {
        if node != self.node {
            return acts.push(Action::Peer { node, msg });
        }
        acts.extend(self.on_peer(msg, pgcids));
    }

    /// A message of another server (or of this one) about invitations: `Invite`,
    /// `InviteReply`, `PgcidResp` and `GroupFormed`; others are ignored.
    pub(crate) fn on_peer(&mut self, msg: JobMsg, pgcids: &mut Pgcids) -> Vec<Action> {
        let mut acts = Vec::new();
        match msg {
            JobMsg::Invite {
                id,
                leader,
                rank,
                procs,
            } => self.invite_arrived(id, leader, rank, procs, &mut acts),
            JobMsg::InviteReply { id, rank, accept } => {
                self.invite_reply(&id, rank, accept, pgcids, &mut acts)
            }
            JobMsg::PgcidResp { qid, pgcid } => {
                if let Some(id) = self.pgcid_waiters.remove(&qid) {
                    self.form(&id, Some(pgcid), pgcids, &mut acts);
                }
            }
            JobMsg::GroupFormed { group } => self.formed(group, &mut acts),
            other => tracing::error!("not a message about invitations: {other:?}"),
        }
        acts
    }

    /// A local leader invites `inv.procs` into group `inv.id`; `in_use` says whether a
    /// group of that id exists here, `nspace` is the job's namespace, `gone` says why a
    /// rank is gone (`None`: it is not).
    pub(crate) fn on_invite(
        &mut self,
        inv: Invite,
        in_use: bool,
        nspace: &str,
        gone: impl Fn(Rank) -> Option<String>,
        pgcids: &mut Pgcids,
    ) -> Vec<Action> {
        let Invite {
            leader,
            conn,
            req,
            id,
            procs,
            directives,
            timeout_ms,
        } = inv;
        let size = self.owners.len() as u32;
        let mut invitees = procs;
        invitees.sort_unstable();
        invitees.dedup();
        invitees.retain(|&r| r != leader);
        let bad = if id.is_empty() || id == nspace || id.starts_with("weft://") {
            Some("the group id is empty, the namespace or reserved".to_owned())
        } else if in_use || self.leading.contains_key(&id) {
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
            return vec![invalid(conn, req, "group invite", &id, reason)];
        }
        self.leading.insert(
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
        let mut acts = Vec::new();
        if let Some(ms) = timeout_ms {
            acts.push(Action::Timer {
                id: id.clone(),
                after: Duration::from_millis(ms),
            });
        }
        for &r in &invitees {
            if let Some(why) = gone(r) {
                self.invite_failed(&id, r, why, pgcids, &mut acts);
                continue;
            }
            let node = self.node_of(r);
            let msg = JobMsg::Invite {
                id: id.clone(),
                leader,
                rank: r,
                procs: invitees.clone(),
            };
            self.send(node, msg, pgcids, &mut acts);
        }
        acts
    }

    /// At an invitee's server: tell it, and remember the invitation for its answer.
    fn invite_arrived(
        &mut self,
        id: String,
        leader: Rank,
        rank: Rank,
        procs: Vec<Rank>,
        acts: &mut Vec<Action>,
    ) {
        if !self.is_local(rank) {
            return;
        }
        self.invited.insert((id.clone(), rank), (leader, None));
        let reason = format!("rank {leader} invites you into group {id:?}");
        let event = event(EventCode::Invited, &id, leader, procs, reason);
        acts.push(Action::Emit { rank, event });
    }

    /// Local invitee `rank` answers `leader`'s invitation into group `id`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_join(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        id: String,
        leader: Rank,
        accept: bool,
        pgcids: &mut Pgcids,
    ) -> Vec<Action> {
        let mut acts = Vec::new();
        match self.invited.get_mut(&(id.clone(), rank)) {
            Some((l, waiting)) if *l == leader && waiting.is_none() => {
                if accept {
                    *waiting = Some((conn, req));
                } else {
                    self.invited.remove(&(id.clone(), rank));
                    acts.push(Action::Reply {
                        conn,
                        msg: ServerMsg::Done { req },
                    });
                }
            }
            _ => {
                let reason = format!("rank {rank} has no pending invitation from rank {leader}");
                return vec![invalid(conn, req, "group join", &id, reason)];
            }
        }
        let node = self.node_of(leader);
        self.send(
            node,
            JobMsg::InviteReply { id, rank, accept },
            pgcids,
            &mut acts,
        );
        acts
    }

    /// At the leader's server: an invitee answered.
    fn invite_reply(
        &mut self,
        id: &str,
        rank: Rank,
        accept: bool,
        pgcids: &mut Pgcids,
        acts: &mut Vec<Action>,
    ) {
        let Some(inv) = self.leading.get_mut(id) else {
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
        let reason = format!("rank {rank} {what}");
        let e = event(code, id, rank, inv.invitees.clone(), reason);
        acts.push(Action::Emit {
            rank: inv.leader,
            event: e,
        });
        self.maybe_form(id, pgcids, acts);
    }

    /// Invitation `id`'s timeout passed: the invitees that have not answered fail.
    pub(crate) fn on_timeout(&mut self, id: &str, pgcids: &mut Pgcids) -> Vec<Action> {
        let late: Vec<Rank> = match self.leading.get(id) {
            Some(inv) => inv
                .invitees
                .iter()
                .copied()
                .filter(|r| !inv.answered.contains(r))
                .collect(),
            None => Vec::new(),
        };
        let mut acts = Vec::new();
        for r in late {
            let why = "did not answer before the timeout".to_owned();
            self.invite_failed(id, r, why, pgcids, &mut acts);
        }
        acts
    }

    /// At the leader's server: an invitee died or timed out.
    fn invite_failed(
        &mut self,
        id: &str,
        rank: Rank,
        why: String,
        pgcids: &mut Pgcids,
        acts: &mut Vec<Action>,
    ) {
        let Some(inv) = self.leading.get_mut(id) else {
            return;
        };
        if !inv.answered.insert(rank) {
            return;
        }
        let reason = format!("rank {rank} {why}");
        let e = event(
            EventCode::InviteFailed,
            id,
            rank,
            inv.invitees.clone(),
            reason,
        );
        acts.push(Action::Emit {
            rank: inv.leader,
            event: e,
        });
        self.maybe_form(id, pgcids, acts);
    }

    fn maybe_form(&mut self, id: &str, pgcids: &mut Pgcids, acts: &mut Vec<Action>) {
        let Some(inv) = self.leading.get_mut(id) else {
            return;
        };
        if inv.answered.len() < inv.invitees.len() || inv.asked_pgcid {
            return;
        }
        if !inv.directives.assign_context_id {
            return self.form(id, None, pgcids, acts);
        }
        if self.node == 0 {
            let p = pgcids.take();
            return self.form(id, Some(p), pgcids, acts);
        }
        inv.asked_pgcid = true;
        let qid = self.next_qid;
        self.next_qid += 1;
        self.pgcid_waiters.insert(qid, id.to_owned());
        let from = self.node;
        acts.push(Action::Peer {
            node: 0,
            msg: JobMsg::PgcidReq { qid, from },
        });
    }

    fn form(&mut self, id: &str, pgcid: Option<u64>, pgcids: &mut Pgcids, acts: &mut Vec<Action>) {
        let Some(inv) = self.leading.remove(id) else {
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
        // The invitees' nodes too: a late invitee's join is answered there.
        let mut nodes: Vec<u32> = members
            .iter()
            .chain(&inv.invitees)
            .map(|&r| self.node_of(r))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        for n in nodes {
            let msg = JobMsg::GroupFormed {
                group: group.clone(),
            };
            self.send(n, msg, pgcids, acts);
        }
        acts.push(Action::Reply {
            conn: inv.conn,
            msg: ServerMsg::Group {
                req: inv.req,
                group,
            },
        });
    }

    /// At every member's (and invitee's) server: the invite-formed group exists. A
    /// local invitee left out of it (it declined, died, or did not answer before the
    /// timeout) has no invitation any more: a join it sent too late fails now.
    fn formed(&mut self, group: GroupInfo, acts: &mut Vec<Action>) {
        let late: Vec<Rank> = group
            .left_out
            .iter()
            .copied()
            .filter(|&r| self.is_local(r))
            .collect();
        for r in late {
            if let Some((_, Some((conn, req)))) = self.invited.remove(&(group.id.clone(), r)) {
                let error = WireError::Timeout {
                    op: format!(
                        "group join of {:?} (the group formed without rank {r}: its answer \
                         reached the leader after the invitation's timeout)",
                        group.id
                    ),
                    missing: vec![r],
                };
                let msg = ServerMsg::Failed { req, error };
                acts.push(Action::Reply { conn, msg });
            }
        }
        let local: Vec<Rank> = group
            .members
            .iter()
            .copied()
            .filter(|&r| self.is_local(r))
            .collect();
        if local.is_empty() {
            return;
        }
        acts.push(Action::Record(group.clone()));
        let e = Event {
            code: EventCode::ConstructComplete,
            group: Some(group.id.clone()),
            rank: group.leader,
            pset: None,
            members: group.members.clone(),
            reason: match group.pgcid {
                Some(p) => format!("group {:?} formed with PGCID {p}", group.id),
                None => format!("group {:?} formed", group.id),
            },
            proc: None,
        };
        for r in local {
            if let Some((_, Some((conn, req)))) = self.invited.remove(&(group.id.clone(), r)) {
                let msg = ServerMsg::Group {
                    req,
                    group: group.clone(),
                };
                acts.push(Action::Reply { conn, msg });
            }
            acts.push(Action::Emit {
                rank: r,
                event: e.clone(),
            });
        }
    }

    /// A death seen by this server: invitations it led are dropped (their local
    /// invitees get construct-abort), and invitees of local leaders count as failed.
    pub(crate) fn on_proc_gone(
        &mut self,
        rank: Rank,
        reason: &str,
        pgcids: &mut Pgcids,
    ) -> Vec<Action> {
        let mut acts = Vec::new();
        let ids: Vec<String> = self.leading.keys().cloned().collect();
        for id in ids {
            if self.leading[&id].leader == rank {
                self.leading.remove(&id);
            } else if self.leading[&id].invitees.contains(&rank) {
                self.invite_failed(&id, rank, reason.to_owned(), pgcids, &mut acts);
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
                acts.push(Action::Reply {
                    conn,
                    msg: ServerMsg::Failed { req, error },
                });
            }
            let e = event(EventCode::ConstructAbort, &id, rank, Vec::new(), why);
            acts.push(Action::Emit { rank: r, event: e });
        }
        acts
    }
}

#[cfg(test)]
mod tests;
