//! Events of the node's PMIx clients that reach beyond the node (the library's
//! `notify_event` upcall): carried to the servers of the nodes they are for
//! (`JobMsg::PmixEvent`, the infos as the library packed them), whose libraries deliver
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
//!
//! Which invitations wait for whom, what fails them and the group one formed are
//! `pmix_book`'s (`PmixBook::on_invite` and the other `on_invite*` methods); this file
//! notifies through the library and carries out the actions they return.

use weft_pmix::server::{codes, Failure, Notification, ProcName, Range};
use weft_wireup::Rank;

use super::pmix_book::InviteAction;
use super::State;
use crate::wire::proto::JobMsg;

impl State {
    /// A local client's event for processes beyond this node.
    pub(super) fn pmix_notify(&mut self, n: Notification) {
        let size = self.job.plan.job.size();
        let Some(px) = self.job.pmix.as_ref() else {
            return n.reply.fail(Failure::Other);
        };
        // Processes wait in PMIx_Init for the debugger's release (`hold`): OpenPMIx 4.2's
        // server library says so once for all of the node's (source rank
        // `PMIX_RANK_LOCAL_NODE`), once each has registered for the release.
        if n.code == codes::READY_FOR_DEBUG && n.source.nspace == px.nspace {
            let ranks = match n.source.rank.filter(|&r| r < size) {
                Some(r) => vec![r],
                None => self.job.procs.local_ranks(),
            };
            self.pmix_waits(&ranks);
            return n.reply.ok();
        }
        let source = match n.source.rank {
            Some(r) if n.source.nspace == px.nspace && r < size => r,
            // The library's own notice that this node's processes wait for a debugger
            // (`PMIX_READY_FOR_DEBUG`, range RM: for the host): nothing to pass on.
            _ if n.code == codes::READY_FOR_DEBUG && n.source.nspace == px.nspace => {
                tracing::debug!("{}: processes wait in init for a debugger", px.nspace);
                return n.reply.ok();
            }
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
        let all: Vec<u32> = (0..self.job.plan.job.nodes.len() as u32).collect();
        let nodes = match (n.range, &targets) {
            (Range::Local | Range::ProcLocal, _) => Vec::new(),
            (Range::Custom, Some(t)) => self.job.groups.nodes_of(t),
            _ => all,
        };
        let members = targets.unwrap_or_default();
        if n.code == codes::GROUP_INVITED {
            let Some(px) = self.job.pmix.as_mut() else {
                return n.reply.fail(Failure::Other);
            };
            let procs = &self.job.procs;
            let gone = |r: Rank| procs.why_gone(r);
            let invited = px
                .book
                .get_mut()
                .on_invite(n.group.as_deref(), source, &members, gone);
            if let Err(why) = invited {
                return n.reply.fail(why);
            }
        } else {
            self.pmix_invite_event(n.code, source, n.group.as_deref(), &members);
        }
        let me = self.node;
        for node in nodes.into_iter().filter(|&x| x != me) {
            let m = JobMsg::PmixEvent {
                code: n.code,
                source,
                range: n.range.raw(),
                group: n.group.clone(),
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
        if code != codes::GROUP_INVITED {
            self.pmix_invite_event(code, source, group.as_deref(), &members);
        }
        let (Some(px), Some(front)) = (self.job.pmix.as_ref(), self.pmix.as_ref()) else {
            return;
        };
        let src = ProcName {
            nspace: px.nspace.clone(),
            rank: Some(source),
        };
        if let Err(e) = front
            .server
            .notify_packed(code, &src, Range::from_raw(range), &info)
        {
            tracing::warn!("PMIx event {code} of rank {source} from another node: {e}");
        }
    }

    /// Event `code` of rank `source` (here or on another node) to `members`, other than
    /// an invitation: a group constructed by invitation, or an invitee's answer.
    fn pmix_invite_event(&mut self, code: i32, source: Rank, group: Option<&str>, to: &[Rank]) {
        let Some(px) = self.job.pmix.as_mut() else {
            return;
        };
        let book = px.book.get_mut();
        let acts = match group {
            Some(id) if code == codes::GROUP_CONSTRUCT_COMPLETE => {
                book.on_invite_complete(id, source, to.to_vec())
            }
            _ => book.on_invite_answer(code, source, to),
        };
        self.apply_invites(acts);
    }

    /// Rank `rank` ended (`reason`): the invitations it led are forgotten, those still
    /// waiting for it cannot complete.
    pub(super) fn pmix_invites_lose(&mut self, rank: Rank, reason: &str) {
        let Some(px) = self.job.pmix.as_mut() else {
            return;
        };
        let acts = px.book.get_mut().on_invitee_gone(rank, reason);
        self.apply_invites(acts);
    }

    /// Carries out what the invitations' bookkeeping decided.
    fn apply_invites(&mut self, acts: Vec<InviteAction>) {
        for a in acts {
            match a {
                InviteAction::EndLeader { leader, what } => self.proc_aborted(leader, 1, &what),
                InviteAction::Record(group) => {
                    let id = group.id.clone();
                    if let Some(old) = self.job.groups.record(group) {
                        tracing::warn!(
                            "PMIx group {id:?} formed again (it had members {:?})",
                            old.members
                        );
                    }
                }
            }
        }
    }
}
