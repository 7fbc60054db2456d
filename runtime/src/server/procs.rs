//! Processes: commits, the datastore, gets, and processes that end.

use super::*;

impl State {
    pub(super) fn commit(&mut self, rank: Rank, entries: Vec<(Scope, String, Value)>) {
        let acts = self.modex.commit(rank, entries);
        self.apply(acts);
    }

    /// Carries out what the data concern decided.
    pub(super) fn apply(&mut self, acts: Vec<modex::Action>) {
        for a in acts {
            match a {
                modex::Action::Reply { conn, req, answer } => {
                    let msg = match answer {
                        Answer::Value(value) => ServerMsg::Value { req, value },
                        Answer::Missing(reason) => ServerMsg::Missing { req, reason },
                        Answer::Failed(error) => ServerMsg::Failed { req, error },
                    };
                    self.send_client(conn, &msg);
                }
                modex::Action::Store { key, value } => self.store_put(&key, &value),
                modex::Action::Peer { node, msg } => self.send_peer(node, &msg),
                modex::Action::GetTimer {
                    rank,
                    conn,
                    req,
                    ms,
                } => after(
                    &self.ev,
                    Duration::from_millis(ms),
                    Event::GetTimeout { rank, conn, req },
                ),
            }
        }
    }

    pub(super) fn get(
        &mut self,
        conn: ConnId,
        req: u64,
        target: Rank,
        key: String,
        flags: GetFlags,
        timeout_ms: Option<u64>,
    ) {
        let size = self.plan.job.size();
        if target >= size {
            let error = WireError::Invalid {
                op: "get".into(),
                reason: format!("rank {target} is not in the job (size {size})"),
            };
            return self.send_client(conn, &ServerMsg::Failed { req, error });
        }
        let acts = self.modex.get(conn, req, target, key, flags, timeout_ms);
        self.apply(acts);
    }

    /// Local rank `rank` called abort (PMIx, PMI-1 or PMI-2) with exit code `code`, as
    /// `what` says: logged; unless it exits within `ABORT_GRACE` (Open MPI does, MPICH
    /// waits to be killed, as Hydra does) it is killed, and either way its end is
    /// reported with that code, ending the job like any failed rank.
    pub(super) fn proc_aborted(&mut self, rank: Rank, code: i32, what: &str) {
        tracing::warn!("rank {rank} {what}");
        if let Some(p) = self.procs.get_mut(&rank) {
            p.aborted = Some(code);
            p.finalizing_at_exit = false;
        }
        after(&self.ev, ABORT_GRACE, Event::AbortGraceOver { rank });
    }

    /// Local rank `rank` ended (`finalized`, or otherwise as `reason` says): tells the
    /// other servers and everything here that waits on it.
    pub(super) fn proc_gone_local(&mut self, rank: Rank, reason: String, finalized: bool) {
        let joined = self.fences.joined(rank);
        let (nodes, me) = (self.plan.job.num_nodes(), self.node);
        for n in (0..nodes).filter(|&n| n != me) {
            self.send_peer(
                n,
                &PeerMsg::ProcGone {
                    rank,
                    reason: reason.clone(),
                    joined: joined.clone(),
                },
            );
        }
        self.proc_gone(rank, reason, joined.into_iter().collect(), finalized);
    }

    pub(super) fn proc_gone(
        &mut self,
        rank: Rank,
        reason: String,
        joined: HashSet<u64>,
        finalized: bool,
    ) {
        if self.gone.contains_key(&rank) {
            return;
        }
        // Gets waiting for keys it never committed (a no-op for other nodes' ranks).
        let acts = self.modex.ended(rank, finalized, &reason);
        self.apply(acts);
        self.pmix_rank_ended(rank, &reason, finalized);
        // Published in the datastore so that clients waiting on this rank in a transport
        // notice without a message (a lookup in shared memory).
        let gone_key = keys::gone(rank);
        self.store_put(&gone_key, reason.as_bytes());
        self.gone.insert(
            rank,
            Gone {
                reason: reason.clone(),
            },
        );
        // Collectives the rank never joined can no longer complete, except tolerant
        // groups, which go on without it.
        let now = std::time::Instant::now();
        let acts = self.fences.on_proc_gone(
            rank,
            &reason,
            joined,
            now,
            Contrib {
                modex: &self.modex,
                pgcids: &mut self.pgcids,
            },
        );
        self.apply_fences(acts);
        self.groups_lose(rank, &reason);
        let acts = self
            .invitations
            .on_proc_gone(rank, &reason, &mut self.pgcids);
        self.apply_invitations(acts);
        self.pmix_invites_lose(rank, &reason);
    }
}
