//! The actor's side of the concerns without IO (`fence`, `psets`, `leaders`,
//! `invitations`): their inputs handed over with the current time and what they read of
//! other concerns, and their actions carried out here, where the sockets, timers and
//! the datastore are.

use crate::wire::proto::{CollId, FenceMode, GroupSpec, PeerMsg, ProcData};
use tokio::time::Instant;
use weft_wireup::Rank;

use super::fence::{self, Arrival, Contrib};
use super::{after, invitations, leaders, psets, Event, State};
use crate::modex::ConnId;

impl State {
    /// A local process joins collective `id` (a fence or a group operation).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn coll_arrive(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        id: CollId,
        mode: FenceMode,
        timeout_ms: Option<u64>,
        group: Option<GroupSpec>,
    ) {
        let a = Arrival {
            rank,
            conn,
            req,
            id,
            mode,
            timeout_ms,
            group,
        };
        let now = std::time::Instant::now();
        let acts = self.fences.on_arrive(
            a,
            now,
            Contrib {
                modex: &self.modex,
                pgcids: &mut self.pgcids,
            },
        );
        self.apply_fences(acts);
    }

    /// A message of another server about a collective.
    pub(super) fn fence_peer(&mut self, msg: PeerMsg) {
        let now = std::time::Instant::now();
        let acts = self.fences.on_peer(
            msg,
            now,
            Contrib {
                modex: &self.modex,
                pgcids: &mut self.pgcids,
            },
        );
        self.apply_fences(acts);
    }

    /// Carries out what the fence concern decided.
    pub(super) fn apply_fences(&mut self, acts: Vec<fence::Action>) {
        for a in acts {
            match a {
                fence::Action::Reply { conn, msg } => self.send_client(conn, &msg),
                fence::Action::Peer { node, msg } => self.send_peer(node, &msg),
                fence::Action::Deadline { id, at } => {
                    let ev = self.ev.clone();
                    let at = Instant::from_std(at);
                    tokio::spawn(async move {
                        tokio::time::sleep_until(at).await;
                        let _ = ev.send(Event::CollTimeout { id });
                    });
                }
                fence::Action::QueryTimer { qid, after: d } => {
                    after(&self.ev, d, Event::QueryTimeout { qid });
                }
                fence::Action::Learn(data) => self.learn_remote(data),
                fence::Action::GroupGathered { id, gathered } => self.group_gathered(id, gathered),
            }
        }
    }

    /// Carries out what the process-set concern decided.
    pub(super) fn apply_psets(&mut self, acts: Vec<psets::Action>) {
        for a in acts {
            match a {
                psets::Action::Reply { conn, msg } => self.send_client(conn, &msg),
                psets::Action::Peer { node, msg } => self.send_peer(node, &msg),
                psets::Action::Store { key, value } => self.store_put(&key, &value),
                psets::Action::Emit(e) => {
                    let local: Vec<Rank> = self.procs.keys().copied().collect();
                    for r in local {
                        self.emit(r, &e);
                    }
                }
            }
        }
    }

    /// Carries out what the invitations decided.
    pub(super) fn apply_invitations(&mut self, acts: Vec<invitations::Action>) {
        for a in acts {
            match a {
                invitations::Action::Reply { conn, msg } => self.send_client(conn, &msg),
                invitations::Action::Peer { node, msg } => self.send_peer(node, &msg),
                invitations::Action::Emit { rank, event } => self.emit(rank, &event),
                invitations::Action::Timer { id, after: d } => {
                    after(&self.ev, d, Event::InviteTimeout { id });
                }
                invitations::Action::Record(group) => {
                    self.groups.insert(group.id.clone(), group);
                }
            }
        }
    }

    /// A message of another server (or of this one) about invitations.
    pub(super) fn invitations_peer(&mut self, msg: PeerMsg) {
        let acts = self.invitations.on_peer(msg, &mut self.pgcids);
        self.apply_invitations(acts);
    }

    /// Carries out what the leader selection decided.
    pub(super) fn apply_leaders(&mut self, acts: Vec<leaders::Action>) {
        for a in acts {
            match a {
                leaders::Action::Reply { conn, msg } => self.send_client(conn, &msg),
                leaders::Action::Peer { node, msg } => self.send_peer(node, &msg),
                leaders::Action::Selected { id, rank } => self.leader_selected(&id, rank),
            }
        }
    }

    /// What a collective carried of other nodes' participants.
    pub(super) fn learn_remote(&mut self, data: ProcData) {
        self.pmi_learn(&data);
        for (rank, gen, entries) in data {
            if rank < self.plan.job.size() {
                let acts = self.modex.learn(rank, gen, entries);
                self.apply(acts);
            }
        }
    }
}
