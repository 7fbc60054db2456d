//! The PMIx group invitations of this node's leaders, without FFI (OpenPMIx 4.2 builds
//! `PMIx_Group_invite` from events alone; see `pmix_events`): which invitations are
//! pending and whose answer each still waits for, what an invitee's decline or end (or
//! its leader's end) does to them, and the group an invitation formed. Its `on_*`
//! methods return [`Action`]s; the actor notifies through the library and carries them
//! out.

use std::collections::{BTreeMap, BTreeSet};

use weft_pmix::server::{codes, Failure};
use weft_wireup::Rank;

use crate::wire::proto::{GroupDirectives, GroupInfo};

/// What the actor does for an invitation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// The invitation `leader` leads cannot complete and its library would wait for it
    /// forever: the leader is ended as an abort with status 1 would end it, the job told
    /// `what`.
    EndLeader { leader: Rank, what: String },
    /// A group formed by invitation with some members on this node: recorded as Weft's.
    Record(GroupInfo),
}

/// A group invitation of a local leader: the invitees that have not accepted yet.
#[derive(Debug)]
struct Pending {
    leader: Rank,
    waiting: BTreeSet<Rank>,
}

/// The group invitations of this node's leaders that wait for their invitees.
#[derive(Debug, Default)]
pub(crate) struct Invites {
    /// By group id.
    pending: BTreeMap<String, Pending>,
}

impl Invites {
    /// Local rank `leader` invites `members` (itself possibly among them) into group
    /// `id`; `gone` says why a rank is no longer a live process of the job. An
    /// invitation naming such a rank fails at once (its leader's `PMIx_Group_invite`
    /// returns the error); else it waits for the others' acceptance. An invitation
    /// without a group id is only checked.
    pub(crate) fn on_invite<'a>(
        &mut self,
        id: Option<&str>,
        leader: Rank,
        members: &[Rank],
        gone: impl Fn(Rank) -> Option<&'a str>,
    ) -> Result<(), Failure> {
        if let Some((r, why)) = members.iter().find_map(|&r| gone(r).map(|why| (r, why))) {
            tracing::warn!(
                "PMIx group invite {:?} of rank {leader}: rank {r} {why}; the invite fails",
                id.unwrap_or("")
            );
            return Err(Failure::ProcGone);
        }
        let Some(id) = id else {
            return Ok(());
        };
        let waiting: BTreeSet<Rank> = members.iter().copied().filter(|&r| r != leader).collect();
        let pending = Pending { leader, waiting };
        if let Some(old) = self.pending.insert(id.to_owned(), pending) {
            tracing::warn!(
                "PMIx group invite {id:?} of rank {leader} replaces rank {}'s, still pending",
                old.leader
            );
        }
        Ok(())
    }

    /// Invitee `invitee`'s event `code` to the leaders among `to`: an acceptance is
    /// waited for no more; a decline (before accepting) means the invitation cannot
    /// complete. Another code, a second answer, or an answer to no pending invitation
    /// changes nothing.
    pub(crate) fn on_answer(&mut self, code: i32, invitee: Rank, to: &[Rank]) -> Vec<Action> {
        let accepted = match code {
            codes::GROUP_INVITE_ACCEPTED => true,
            codes::GROUP_INVITE_DECLINED => false,
            _ => return Vec::new(),
        };
        let mut doomed = Vec::new();
        for (id, inv) in self.pending.iter_mut() {
            if to.contains(&inv.leader) && inv.waiting.remove(&invitee) && !accepted {
                doomed.push(id.clone());
            }
        }
        doomed
            .iter()
            .filter_map(|id| self.fail(id, invitee, "declined"))
            .collect()
    }

    /// Rank `rank` ended (`reason`): the invitations it led are forgotten, those still
    /// waiting for its answer cannot complete.
    pub(crate) fn on_proc_gone(&mut self, rank: Rank, reason: &str) -> Vec<Action> {
        self.pending.retain(|_, inv| inv.leader != rank);
        let doomed: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, inv)| inv.waiting.contains(&rank))
            .map(|(id, _)| id.clone())
            .collect();
        doomed
            .iter()
            .filter_map(|id| self.fail(id, rank, reason))
            .collect()
    }

    /// Rank `leader` told `members` that group `id` is constructed: its invitation (if
    /// it was this node's) is complete, and the group is recorded when some of the
    /// members are local (`local`).
    pub(crate) fn on_complete(
        &mut self,
        id: &str,
        leader: Rank,
        mut members: Vec<Rank>,
        local: impl Fn(Rank) -> bool,
    ) -> Vec<Action> {
        if self.pending.get(id).is_some_and(|inv| inv.leader == leader) {
            self.pending.remove(id);
        }
        members.sort_unstable();
        members.dedup();
        if !members.iter().any(|&r| local(r)) {
            return Vec::new();
        }
        tracing::debug!("PMIx group {id:?} formed by invitation: {members:?}");
        vec![Action::Record(GroupInfo {
            id: id.to_owned(),
            members,
            pgcid: None,
            leader: Some(leader),
            left_out: Vec::new(),
            directives: GroupDirectives::default(),
        })]
    }

    /// Invitation `id` cannot complete: invitee `rank` `why` before accepting.
    fn fail(&mut self, id: &str, rank: Rank, why: &str) -> Option<Action> {
        let inv = self.pending.remove(id)?;
        let what = format!(
            "is ended: its PMIx_Group_invite of {id:?} cannot complete (rank {rank} {why} \
             before accepting; OpenPMIx's invite waits for every invitee, with no timeout)"
        );
        Some(Action::EndLeader {
            leader: inv.leader,
            what,
        })
    }
}
