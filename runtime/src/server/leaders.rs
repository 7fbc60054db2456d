//! The leader selection of groups, without IO: a group whose leader failed gets a new
//! one from the root server (node 0), which takes the first claim after the failure and
//! tells every node with members; each claimant's server answers it (won or not). Every
//! `on_*` method returns the [`Action`]s the server carries out (see
//! `leaders/tests.rs`).

use std::collections::HashMap;

use crate::wire::proto::{JobMsg, ServerMsg, WireError};
use weft_wireup::Rank;

use crate::modex::ConnId;

/// What the server must do.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Send `msg` to the client connection `conn`.
    Reply { conn: ConnId, msg: ServerMsg },
    /// Send to the server of `node`.
    Peer { node: u32, msg: JobMsg },
    /// Rank `rank` now leads group `id` here (the groups concern records it and tells
    /// the local members).
    Selected { id: String, rank: Rank },
}

/// The leader selection of one server.
#[derive(Debug)]
pub(crate) struct Leaders {
    node: u32,
    /// Root server: the leader it selected last for each group.
    selected: HashMap<String, Rank>,
    /// Leadership claims of local processes waiting for the root's decision.
    claims: HashMap<(String, Rank), Vec<(ConnId, u64)>>,
}

impl Leaders {
    /// The leader selection of the server of `node`.
    pub(crate) fn new(node: u32) -> Leaders {
        Leaders {
            node,
            selected: HashMap::new(),
            claims: HashMap::new(),
        }
    }

    /// Local rank `rank` claims the leadership of group `id`, whose members live on
    /// `nodes` (request `req` of connection `conn`); `gone` says which ranks are gone.
    pub(crate) fn on_claim(
        &mut self,
        id: String,
        rank: Rank,
        (conn, req): (ConnId, u64),
        nodes: Vec<u32>,
        gone: impl Fn(Rank) -> bool,
    ) -> Vec<Action> {
        self.claims
            .entry((id.clone(), rank))
            .or_default()
            .push((conn, req));
        if self.node == 0 {
            return self.on_decide(id, rank, 0, nodes, gone);
        }
        let msg = JobMsg::LeaderClaim {
            id,
            rank,
            from: self.node,
            nodes,
        };
        vec![Action::Peer { node: 0, msg }]
    }

    /// Root server: rank `rank` (at node `from`) claims group `id`'s leadership; the
    /// first claim after the leader's failure wins.
    pub(crate) fn on_decide(
        &mut self,
        id: String,
        rank: Rank,
        from: u32,
        nodes: Vec<u32>,
        gone: impl Fn(Rank) -> bool,
    ) -> Vec<Action> {
        let mut acts = Vec::new();
        let current = self.selected.get(&id).copied();
        let winner = match current {
            Some(l) if !gone(l) => l,
            _ => rank,
        };
        if winner == rank && current != Some(rank) {
            self.selected.insert(id.clone(), rank);
            for n in nodes {
                if n == self.node {
                    acts.push(Action::Selected {
                        id: id.clone(),
                        rank,
                    });
                } else {
                    let msg = JobMsg::LeaderSelected {
                        id: id.clone(),
                        rank,
                    };
                    acts.push(Action::Peer { node: n, msg });
                }
            }
        }
        if from == self.node {
            acts.extend(self.on_decision(id, rank, winner));
        } else {
            let msg = JobMsg::LeaderDecision {
                id,
                claimant: rank,
                winner,
            };
            acts.push(Action::Peer { node: from, msg });
        }
        acts
    }

    /// The root decided `claimant`'s claim of group `id`: `winner` leads it.
    pub(crate) fn on_decision(&mut self, id: String, claimant: Rank, winner: Rank) -> Vec<Action> {
        let waiting = self.claims.remove(&(id.clone(), claimant));
        waiting
            .unwrap_or_default()
            .into_iter()
            .map(|(conn, req)| {
                let msg = if winner == claimant {
                    ServerMsg::Done { req }
                } else {
                    ServerMsg::Failed {
                        req,
                        error: WireError::Invalid {
                            op: format!("leader claim of {id:?}"),
                            reason: format!("rank {winner} leads the group (selected first)"),
                        },
                    }
                };
                Action::Reply { conn, msg }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
