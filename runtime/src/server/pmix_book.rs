//! The PMIx front end's bookkeeping, without FFI: which core collective a library
//! fence or group operation becomes (and its sequence number), the operations under way
//! and which one a core reply ends, the direct modex requests asked of and served for
//! other nodes (and which of them a rank's end fails), the group invitations of the
//! node's leaders (`invites`: which wait for whom, what a decline or an end fails, the
//! group one formed), and the answers to a query.
//! Generic over the library's reply handles (`M` for data replies, `G` for group
//! replies), so it is tested without libpmix (see `pmix_book/tests.rs`); the actor
//! (`pmix`) hands it the library's requests and passes the replies it returns back to
//! the library.

use std::collections::HashMap;
use std::time::Instant;

use weft_pmix::server::{Failure, ProcName, QueryAnswer, QueryKey};
use weft_wireup::Rank;

use crate::wire::proto::{CollId, CollKind, GroupInfo, Procs, ServerMsg, WireError};

mod invites;

pub(crate) use invites::Action as InviteAction;
use invites::Invites;

/// A fence under way: its id and where the result goes.
#[derive(Debug)]
pub(crate) struct PendingFence<M> {
    pub(crate) id: CollId,
    /// Whether the nodes' contributions are collected.
    pub(crate) collect: bool,
    pub(crate) reply: M,
    /// When the library handed it over (for the debug log of the host's share).
    pub(crate) since: Instant,
}

/// A group operation under way.
#[derive(Debug)]
pub(crate) struct PendingGroup<G> {
    pub(crate) id: CollId,
    pub(crate) reply: G,
}

/// An operation under way that a core reply ended.
#[derive(Debug)]
pub(crate) enum Ended<M, G> {
    /// A fence: `error` says how it failed.
    Fence {
        pending: PendingFence<M>,
        error: Option<WireError>,
    },
    /// A group operation: the group a construct made (`None` for a destruct), or how
    /// it failed.
    Group {
        pending: PendingGroup<G>,
        result: Result<Option<GroupInfo>, WireError>,
    },
}

/// A client's direct modex to ask of the server of `node` (`PmixDmodexReq` of `rank`
/// with `qid`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Ask {
    pub(crate) qid: u64,
    pub(crate) node: u32,
    pub(crate) rank: Rank,
}

/// The PMIx front end's bookkeeping of one server.
#[derive(Debug)]
pub(crate) struct PmixBook<M, G> {
    /// The namespace served.
    nspace: String,
    /// The node of each rank of the namespace (index: rank).
    owners: Vec<u32>,
    node: u32,
    /// The sequence number of the last fence of each set of participants.
    fence_seq: HashMap<Procs, u64>,
    /// The sequence number of the last group operation of each kind, members and id.
    group_seq: HashMap<(CollKind, Procs, String), u64>,
    next_req: u64,
    /// Fences under way, by request.
    fences: HashMap<u64, PendingFence<M>>,
    /// Group operations under way, by request.
    groups: HashMap<u64, PendingGroup<G>>,
    /// Direct modex requests sent to other nodes: the rank asked about and the reply.
    asked: HashMap<u64, (Rank, M)>,
    /// Other nodes' direct modex requests the library has not answered: (asker, rank).
    serving: HashMap<u64, (u32, Rank)>,
    next_qid: u64,
    /// Group invitations of this node's leaders waiting for their invitees.
    invites: Invites,
}

impl<M, G> PmixBook<M, G> {
    /// The bookkeeping of the server of `node` for namespace `nspace`, whose rank `r`
    /// lives on node `owners[r]`.
    pub(crate) fn new(nspace: String, node: u32, owners: Vec<u32>) -> PmixBook<M, G> {
        PmixBook {
            nspace,
            owners,
            node,
            fence_seq: HashMap::new(),
            group_seq: HashMap::new(),
            next_req: 0,
            fences: HashMap::new(),
            groups: HashMap::new(),
            asked: HashMap::new(),
            serving: HashMap::new(),
            next_qid: u64::from(node) << 48,
            invites: Invites::default(),
        }
    }

    fn size(&self) -> Rank {
        self.owners.len() as Rank
    }

    /// The participants a PMIx collective names (`op`), as the core's: every rank for
    /// the wildcard (or none named), else the ranks; another namespace is not served,
    /// a rank outside the namespace not found.
    pub(crate) fn procs(&self, op: &str, procs: &[ProcName]) -> Result<Procs, Failure> {
        let size = self.size();
        let mut all = procs.is_empty();
        let mut ranks = Vec::new();
        for p in procs {
            if p.nspace != self.nspace {
                tracing::warn!(
                    "PMIx {op} over namespace {:?}: only the job's own is served",
                    p.nspace
                );
                return Err(Failure::NotSupported);
            }
            match p.rank {
                None => all = true,
                Some(r) if r < size => ranks.push(r),
                Some(r) => {
                    tracing::warn!("PMIx {op} names rank {r}, outside the job (size {size})");
                    return Err(Failure::NotFound);
                }
            }
        }
        Ok(if all {
            Procs::All
        } else {
            Procs::List(ranks).normalize(size)
        })
    }

    fn next_req(&mut self) -> u64 {
        self.next_req += 1;
        self.next_req
    }

    /// The core fence a library fence over `procs` becomes: the next of these
    /// participants.
    pub(crate) fn fence_id(&mut self, procs: Procs) -> CollId {
        let seq = self.fence_seq.entry(procs.clone()).or_insert(0);
        *seq += 1;
        CollId {
            kind: CollKind::Fence,
            procs,
            seq: *seq,
            name: "pmix".into(),
        }
    }

    /// Fence `id` (`collect`: with data) is under way, answered through `reply`: its
    /// request to the core.
    pub(crate) fn on_fence(&mut self, id: CollId, collect: bool, reply: M, now: Instant) -> u64 {
        let req = self.next_req();
        let pending = PendingFence {
            id,
            collect,
            reply,
            since: now,
        };
        self.fences.insert(req, pending);
        req
    }

    /// The core group operation a library group construct (or destruct) of group
    /// `name` over `procs` becomes: the next of this kind, members and id.
    pub(crate) fn group_id(&mut self, construct: bool, procs: Procs, name: String) -> CollId {
        let kind = if construct {
            CollKind::GroupConstruct
        } else {
            CollKind::GroupDestruct
        };
        let seq = self
            .group_seq
            .entry((kind, procs.clone(), name.clone()))
            .or_insert(0);
        *seq += 1;
        CollId {
            kind,
            procs,
            seq: *seq,
            name,
        }
    }

    /// Group operation `id` is under way, answered through `reply`: its request to the
    /// core.
    pub(crate) fn on_group(&mut self, id: CollId, reply: G) -> u64 {
        let req = self.next_req();
        self.groups.insert(req, PendingGroup { id, reply });
        req
    }

    /// The core's reply `msg` to the front end: the operation it ends, the first time
    /// (each local participant's copy of the same answer comes after: `None`).
    pub(crate) fn on_core_reply(&mut self, msg: &ServerMsg) -> Option<Ended<M, G>> {
        let (req, error) = match msg {
            ServerMsg::Done { req } | ServerMsg::Group { req, .. } => (*req, None),
            ServerMsg::Failed { req, error } => (*req, Some(error.clone())),
            _ => return None,
        };
        if let Some(pending) = self.groups.remove(&req) {
            let result = match (error, msg) {
                (Some(e), _) => Err(e),
                (None, ServerMsg::Group { group, .. }) => Ok(Some(group.clone())),
                (None, _) => Ok(None),
            };
            return Some(Ended::Group { pending, result });
        }
        let pending = self.fences.remove(&req)?;
        Some(Ended::Fence { pending, error })
    }

    /// A client's direct modex of `proc`'s data; `gone` says why a rank is gone. The
    /// request to send, or the reply back with why it fails at once.
    pub(crate) fn on_dmodex<'a>(
        &mut self,
        proc: &ProcName,
        reply: M,
        gone: impl Fn(Rank) -> Option<&'a str>,
    ) -> Result<Ask, (M, Failure)> {
        let rank = match proc.rank {
            Some(r) if proc.nspace == self.nspace && r < self.size() => r,
            _ => {
                tracing::warn!("PMIx direct modex for {proc:?}: not a process of the job");
                return Err((reply, Failure::NotFound));
            }
        };
        if let Some(why) = gone(rank) {
            tracing::debug!("PMIx direct modex for rank {rank}, which {why}");
            return Err((reply, Failure::ProcGone));
        }
        let node = self.owners[rank as usize];
        if node == self.node {
            // The library serves its own node's processes; it asks only for others.
            return Err((reply, Failure::NotFound));
        }
        self.next_qid += 1;
        let qid = self.next_qid;
        self.asked.insert(qid, (rank, reply));
        Ok(Ask { qid, node, rank })
    }

    /// Direct modex `qid` (asked of another node) reached its timeout: its reply, if
    /// it is still waiting.
    pub(crate) fn on_dmodex_timeout(&mut self, qid: u64) -> Option<M> {
        self.asked.remove(&qid).map(|(_, reply)| reply)
    }

    /// Another node answered direct modex `qid`: the rank asked about and the reply, if
    /// it is still waiting (not timed out, its rank not ended).
    pub(crate) fn on_answered(&mut self, qid: u64) -> Option<(Rank, M)> {
        self.asked.remove(&qid)
    }

    /// The library serves node `from`'s direct modex `qid` of local rank `rank`.
    pub(crate) fn on_serving(&mut self, qid: u64, from: u32, rank: Rank) {
        self.serving.insert(qid, (from, rank));
    }

    /// The library answered (or could not take) direct modex `qid`: whether it is still
    /// to be answered (not already, because its rank ended).
    pub(crate) fn on_served(&mut self, qid: u64) -> bool {
        self.serving.remove(&qid).is_some()
    }

    /// Rank `rank` ended before it finalized: the replies of the direct modex requests
    /// about it that wait here, and the (qid, asker) of other nodes' requests about it
    /// that the library will not answer now.
    pub(crate) fn on_rank_ended(&mut self, rank: Rank) -> (Vec<M>, Vec<(u64, u32)>) {
        let mine: Vec<u64> = self
            .asked
            .iter()
            .filter(|(_, (r, _))| *r == rank)
            .map(|(q, _)| *q)
            .collect();
        let mut replies = Vec::new();
        let mut qids = mine;
        qids.sort_unstable();
        for q in qids {
            if let Some((_, reply)) = self.asked.remove(&q) {
                replies.push(reply);
            }
        }
        let mut served: Vec<(u64, u32)> = self
            .serving
            .iter()
            .filter(|(_, (_, r))| *r == rank)
            .map(|(q, (from, _))| (*q, *from))
            .collect();
        served.sort_unstable();
        for (qid, _) in &served {
            self.serving.remove(qid);
        }
        (replies, served)
    }

    /// Local rank `leader` notified `PMIX_GROUP_INVITED` of group `id` to `members`;
    /// `gone` says why a rank is gone. `Err`: the invitation names a gone rank and fails
    /// at once (see [`Invites::on_invite`]).
    pub(crate) fn on_invite<'a>(
        &mut self,
        id: Option<&str>,
        leader: Rank,
        members: &[Rank],
        gone: impl Fn(Rank) -> Option<&'a str>,
    ) -> Result<(), Failure> {
        self.invites.on_invite(id, leader, members, gone)
    }

    /// Rank `invitee` (here or on another node) notified event `code` to `to`: what an
    /// acceptance or a decline does to the invitations of the leaders among them.
    pub(crate) fn on_invite_answer(
        &mut self,
        code: i32,
        invitee: Rank,
        to: &[Rank],
    ) -> Vec<InviteAction> {
        self.invites.on_answer(code, invitee, to)
    }

    /// Rank `leader` (here or on another node) notified `PMIX_GROUP_CONSTRUCT_COMPLETE`
    /// of group `id` to `members`: its invitation is complete, and the group is Weft's
    /// too on this node if some members live here.
    pub(crate) fn on_invite_complete(
        &mut self,
        id: &str,
        leader: Rank,
        members: Vec<Rank>,
    ) -> Vec<InviteAction> {
        let (owners, node) = (&self.owners, self.node);
        let local = |r: Rank| owners.get(r as usize) == Some(&node);
        self.invites.on_complete(id, leader, members, local)
    }

    /// Rank `rank` ended (`reason`), finalized or not: the invitations it led are
    /// forgotten, those waiting for its answer fail.
    pub(crate) fn on_invitee_gone(&mut self, rank: Rank, reason: &str) -> Vec<InviteAction> {
        self.invites.on_proc_gone(rank, reason)
    }
}

/// The answers to a client's query `keys`, from the process sets known (`sets`: name
/// and members) in namespace `nspace`: the sets' names, their number, one's members.
/// Keys this host does not know are left out; none known: not supported; an unknown
/// set: no answer for it.
pub(crate) fn query_answers(
    keys: &[QueryKey],
    sets: &[(String, Vec<Rank>)],
    nspace: &str,
) -> Result<Vec<QueryAnswer>, Failure> {
    let mut answers = Vec::new();
    let mut known = false;
    for k in keys {
        match k.key.as_str() {
            "pmix.qry.psets" => {
                known = true;
                answers.push(QueryAnswer::PsetNames(
                    sets.iter().map(|(n, _)| n.clone()).collect(),
                ));
            }
            "pmix.qry.psetnum" => {
                known = true;
                answers.push(QueryAnswer::NumPsets(sets.len()));
            }
            "pmix.qry.pmems" => {
                known = true;
                let members = k
                    .pset
                    .as_ref()
                    .and_then(|want| sets.iter().find(|(n, _)| n == want));
                if let Some((_, m)) = members {
                    answers.push(QueryAnswer::PsetMembers(
                        m.iter()
                            .map(|&r| ProcName {
                                nspace: nspace.to_owned(),
                                rank: Some(r),
                            })
                            .collect(),
                    ));
                }
            }
            other => tracing::debug!("PMIx query of {other:?}: not served"),
        }
    }
    if !known {
        return Err(Failure::NotSupported);
    }
    Ok(answers)
}

#[cfg(test)]
mod tests;
