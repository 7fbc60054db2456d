//! Events of the node's PMIx clients that reach beyond the node (the library's
//! `notify_event` upcall): carried to the servers of the nodes they are for
//! (`PeerMsg::PmixEvent`, the infos as the library packed them), whose libraries deliver
//! them to their clients.
//!
//! OpenPMIx 4.2 builds `PMIx_Group_invite` and `PMIx_Group_join` from events alone:
//! the leader notifies `PMIX_GROUP_INVITED` to the invitees, each answers
//! `PMIX_GROUP_INVITE_ACCEPTED` to the leader, and the leader, once all accepted,
//! notifies `PMIX_GROUP_CONSTRUCT_COMPLETE` to the members. The last one makes the group
//! Weft's too: every member's server records it (members, the leader; no PGCID, the
//! invite asks for none), so that `PMIx_Group_destruct` (and a fence naming the group,
//! which each member's library resolves to the members) is Weft's group operation as for
//! a collective construct.
//!
//! The leader's library (4.2) waits for every invitee's acceptance, with no timeout of
//! its own and no way for its host to fail the wait. So an invite that cannot complete
//! ends here: one naming a process that is not a live process of the job fails at once
//! (its `PMIx_Group_invite` returns the error); one whose invitee ends or declines before
//! accepting ends the leader as an abort would (status 1, the job told why), rather than
//! leaving it waiting forever.

use weft_pmix::server::{codes, Failure, Notification, ProcName, Range};

use super::pmix::PendingInvite;
use weft_wireup::Rank;

use super::State;
use crate::wire::proto::{GroupDirectives, GroupInfo, PeerMsg};

impl State {
    /// A local client's event for processes beyond this node.
    pub(super) fn pmix_notify(&mut self, n: Notification) {
        let size = self.plan.job.size();
        let Some(px) = self.pmix.as_ref() else {
            return n.reply.fail(Failure::Other);
        };
        let source = match n.source.rank {
            Some(r) if n.source.nspace == px.nspace && r < size => r,
            _ => {
                tracing::warn!(
                    "PMIx event {} of {:?}: not a process of the job",
                    n.code,
                    n.source
                );
                return n.reply.fail(Failure::NotSupported);
            }
        };
        let targets = match &n.targets {
            Some(t) => match self.pmix_procs("event", t) {
                Ok(p) => Some(p.ranks(size)),
                Err(why) => return n.reply.fail(why),
            },
            None => None,
        };
        if n.code == codes::GROUP_INVITED {
            let gone = targets
                .iter()
                .flatten()
                .find_map(|r| self.procs.why_gone(*r).map(|why| (*r, why.to_owned())));
            if let Some((r, why)) = gone {
                tracing::warn!(
                    "PMIx group invite {:?} of rank {source}: rank {r} {why}; the invite fails",
                    n.group.as_deref().unwrap_or("")
                );
                return n.reply.fail(Failure::ProcGone);
            }
        }
        let all: Vec<u32> = (0..self.plan.job.nodes.len() as u32).collect();
        let nodes = match (n.range, &targets) {
            (Range::Local | Range::ProcLocal, _) => Vec::new(),
            (Range::Custom, Some(t)) => self.groups.nodes_of(t),
            _ => all,
        };
        let members = targets.clone().unwrap_or_default();
        match (&n.group, n.code) {
            (Some(id), codes::GROUP_INVITED) => {
                let waiting = members.iter().copied().filter(|&r| r != source).collect();
                if let Some(px) = self.pmix.as_mut() {
                    let inv = PendingInvite {
                        leader: source,
                        waiting,
                    };
                    px.invites.insert(id.clone(), inv);
                }
            }
            (Some(id), codes::GROUP_CONSTRUCT_COMPLETE) => {
                if let Some(px) = self.pmix.as_mut() {
                    px.invites.remove(id);
                }
                self.pmix_group_formed(id, source, members.clone());
            }
            _ => self.pmix_invite_answered(n.code, source, &members),
        }
        let group = n.group.clone();
        let me = self.node;
        for node in nodes.into_iter().filter(|&x| x != me) {
            let m = PeerMsg::PmixEvent {
                code: n.code,
                source,
                range: n.range.raw(),
                group: group.clone(),
                members: members.clone(),
                info: n.info.clone(),
            };
            self.send_peer(node, &m);
        }
        n.reply.ok();
    }

    /// Another node's client's event for this node's clients.
    pub(super) fn pmix_event_arrived(
        &mut self,
        code: i32,
        source: Rank,
        range: u8,
        group: Option<String>,
        members: Vec<Rank>,
        info: Vec<u8>,
    ) {
        match &group {
            Some(id) if code == codes::GROUP_CONSTRUCT_COMPLETE => {
                self.pmix_group_formed(id, source, members)
            }
            _ => self.pmix_invite_answered(code, source, &members),
        }
        let Some(px) = self.pmix.as_ref() else {
            return;
        };
        let src = ProcName {
            nspace: px.nspace.clone(),
            rank: Some(source),
        };
        if let Err(e) = px
            .server
            .notify_packed(code, &src, Range::from_raw(range), &info)
        {
            tracing::warn!("PMIx event {code} of rank {source} from another node: {e}");
        }
    }

    /// An invitee's answer (`code`) to the invites of the leaders among `to`: an
    /// acceptance is waited for no more; a decline means the invite cannot complete.
    fn pmix_invite_answered(&mut self, code: i32, invitee: Rank, to: &[Rank]) {
        let accepted = match code {
            codes::GROUP_INVITE_ACCEPTED => true,
            codes::GROUP_INVITE_DECLINED => false,
            _ => return,
        };
        let Some(px) = self.pmix.as_mut() else {
            return;
        };
        let mut doomed = Vec::new();
        for (id, inv) in px.invites.iter_mut() {
            if to.contains(&inv.leader) && inv.waiting.remove(&invitee) && !accepted {
                doomed.push(id.clone());
            }
        }
        for id in doomed {
            self.pmix_invite_failed(&id, invitee, "declined");
        }
    }

    /// Rank `rank` ended: the invites it led are forgotten, those still waiting for it
    /// cannot complete.
    pub(super) fn pmix_invites_lose(&mut self, rank: Rank, reason: &str) {
        let Some(px) = self.pmix.as_mut() else {
            return;
        };
        px.invites.retain(|_, inv| inv.leader != rank);
        let doomed: Vec<String> = px
            .invites
            .iter()
            .filter(|(_, inv)| inv.waiting.contains(&rank))
            .map(|(id, _)| id.clone())
            .collect();
        for id in doomed {
            self.pmix_invite_failed(&id, rank, reason);
        }
    }

    /// Invite `id` cannot complete: invitee `rank` `why`. Its leader's library would wait
    /// forever; it is ended as an abort with status 1 would end it.
    fn pmix_invite_failed(&mut self, id: &str, rank: Rank, why: &str) {
        let Some(inv) = self.pmix.as_mut().and_then(|px| px.invites.remove(id)) else {
            return;
        };
        let what = format!(
            "is ended: its PMIx_Group_invite of {id:?} cannot complete (rank {rank} {why} \
             before accepting; OpenPMIx's invite waits for every invitee, with no timeout)"
        );
        self.proc_aborted(inv.leader, 1, &what);
    }

    /// Group `id` that rank `leader` formed by invitation, with `members`: recorded
    /// here when some of them run on this node.
    fn pmix_group_formed(&mut self, id: &str, leader: Rank, mut members: Vec<Rank>) {
        members.sort_unstable();
        members.dedup();
        if !members.iter().any(|r| self.procs.is_local(*r)) {
            return;
        }
        let group = GroupInfo {
            id: id.to_owned(),
            members,
            pgcid: None,
            leader: Some(leader),
            left_out: Vec::new(),
            directives: GroupDirectives::default(),
        };
        tracing::debug!(
            "PMIx group {id:?} formed by invitation: {:?}",
            group.members
        );
        if let Some(old) = self.groups.record(group) {
            tracing::warn!(
                "PMIx group {id:?} formed again (it had members {:?})",
                old.members
            );
        }
    }
}
