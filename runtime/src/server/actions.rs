//! The actor's side of the concerns without IO (`modex`, `fence`, `groups`, `psets`,
//! `leaders`, `invitations`, `procs`): their inputs handed over with the current time and what they read of
//! other concerns, and their actions carried out here, where the sockets, timers and
//! the datastore are.

use std::collections::HashSet;
use std::time::Duration;

use crate::wire::proto::{
    CollId, FenceMode, GroupDirectives, GroupSpec, JobMsg, ProcData, ServerMsg, ToLauncher,
    WireError,
};
use tokio::time::Instant;
use weft_wireup::{keys, ProcId, Rank, Scope, Value};

use super::fence::{self, Arrival, Contrib};
use super::{groups, invitations, leaders, procs, psets, JobEvent, State};
use crate::modex::{self, Answer, ConnId, GetFlags};

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
        self.arrive(a);
    }

    /// An arrival at a collective, for the fences.
    fn arrive(&mut self, a: Arrival) {
        let now = std::time::Instant::now();
        let acts = self.job.fences.on_arrive(
            a,
            now,
            Contrib {
                modex: &self.job.modex,
                pgcids: &mut self.pgcids,
            },
        );
        self.apply_fences(acts);
    }

    /// A message of another server about a collective.
    pub(super) fn fence_peer(&mut self, msg: JobMsg) {
        let now = std::time::Instant::now();
        let acts = self.job.fences.on_peer(
            msg,
            now,
            Contrib {
                modex: &self.job.modex,
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
                    let ev = self.io.ev.clone();
                    let at = Instant::from_std(at);
                    let e = self.job_event(JobEvent::CollTimeout { id });
                    tokio::spawn(async move {
                        tokio::time::sleep_until(at).await;
                        let _ = ev.send(e);
                    });
                }
                fence::Action::QueryTimer { qid, after: d } => {
                    self.after_job(d, JobEvent::QueryTimeout { qid });
                }
                fence::Action::Learn(data) => self.learn_remote(data),
                fence::Action::GroupGathered { id, gathered } => {
                    let ended = &self.job.procs;
                    let acts = self
                        .job
                        .groups
                        .on_gathered(id, gathered, |r| ended.why_gone(r).map(str::to_owned));
                    self.apply_groups(acts);
                }
            }
        }
    }

    /// A local process's group construct or destruct request (native or PMIx).
    pub(super) fn group_arrive(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        id: CollId,
        directives: GroupDirectives,
        timeout_ms: Option<u64>,
    ) {
        let busy = self.job.fences.construct_in_progress(&id);
        let r = groups::Request {
            rank,
            conn,
            req,
            id,
            directives,
            timeout_ms,
        };
        let ended = &self.job.procs;
        let cx = groups::Checks {
            nspace: &self.job.plan.job.nspace,
            busy,
            gone: &|r| ended.is_gone(r),
        };
        let acts = self.job.groups.on_request(r, cx);
        self.apply_groups(acts);
    }

    /// Local rank `rank` claims the leadership of group `id`.
    pub(super) fn leader_claim(&mut self, rank: Rank, conn: ConnId, req: u64, id: String) {
        let ended = &self.job.procs;
        let acts = self
            .job
            .groups
            .on_leader_claim(rank, conn, req, id, |r| ended.is_gone(r));
        self.apply_groups(acts);
    }

    /// Carries out what the groups concern decided.
    pub(super) fn apply_groups(&mut self, acts: Vec<groups::Action>) {
        for a in acts {
            match a {
                groups::Action::Reply { conn, msg } => self.send_client(conn, &msg),
                groups::Action::Peer { node, msg } => self.send_peer(node, &msg),
                groups::Action::Emit { rank, event } => self.emit(rank, &event),
                groups::Action::Arrive(a) => self.arrive(a),
                groups::Action::Learn(data) => self.learn_remote(data),
                groups::Action::Finished { id, error } => self.job.fences.finish(id, error),
                groups::Action::Claim {
                    id,
                    rank,
                    conn,
                    req,
                    nodes,
                } => {
                    let ended = &self.job.procs;
                    let acts = self
                        .job
                        .leaders
                        .on_claim(id, rank, (conn, req), nodes, |r| ended.is_gone(r));
                    self.apply_leaders(acts);
                }
            }
        }
    }

    /// Local rank `leader` invites `procs` to form group `id`.
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
        let in_use = self.job.groups.in_use(&id);
        let inv = invitations::Invite {
            leader,
            conn,
            req,
            id,
            procs,
            directives,
            timeout_ms,
        };
        let ended = &self.job.procs;
        let acts = self.job.invitations.on_invite(
            inv,
            in_use,
            &self.job.plan.job.nspace,
            |r| ended.why_gone(r).map(str::to_owned),
            &mut self.pgcids,
        );
        self.apply_invitations(acts);
    }

    /// Local rank `rank` answers `leader`'s invitation to group `id`.
    pub(super) fn group_join(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        id: String,
        leader: Rank,
        accept: bool,
    ) {
        let acts =
            self.job
                .invitations
                .on_join(rank, conn, req, id, leader, accept, &mut self.pgcids);
        self.apply_invitations(acts);
    }

    /// Carries out what the process-set concern decided.
    pub(super) fn apply_psets(&mut self, acts: Vec<psets::Action>) {
        for a in acts {
            match a {
                psets::Action::Reply { conn, msg } => self.send_client(conn, &msg),
                psets::Action::Peer { node, msg } => self.send_peer(node, &msg),
                psets::Action::Store { key, value } => self.store_put(&key, &value),
                psets::Action::Emit(e) => {
                    for r in self.job.procs.local_ranks() {
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
                    self.after_job(d, JobEvent::InviteTimeout { id });
                }
                invitations::Action::Record(group) => {
                    self.job.groups.record(group);
                }
            }
        }
    }

    /// A message of another server (or of this one) about invitations.
    pub(super) fn invitations_peer(&mut self, msg: JobMsg) {
        let acts = self.job.invitations.on_peer(msg, &mut self.pgcids);
        self.apply_invitations(acts);
    }

    /// Carries out what the leader selection decided.
    pub(super) fn apply_leaders(&mut self, acts: Vec<leaders::Action>) {
        for a in acts {
            match a {
                leaders::Action::Reply { conn, msg } => self.send_client(conn, &msg),
                leaders::Action::Peer { node, msg } => self.send_peer(node, &msg),
                leaders::Action::Selected { id, rank } => {
                    let gone = self.job.procs.is_gone(rank);
                    let acts = self.job.groups.on_leader_selected(&id, rank, gone);
                    self.apply_groups(acts);
                }
            }
        }
    }

    /// What a collective carried of other nodes' participants.
    pub(super) fn learn_remote(&mut self, data: ProcData) {
        self.pmi_learn(&data);
        for (rank, gen, entries) in data {
            if rank < self.job.plan.job.size() {
                let acts = self.job.modex.learn(rank, gen, entries);
                self.apply(acts);
            }
        }
    }
}

impl State {
    pub(super) fn commit(&mut self, rank: Rank, entries: Vec<(Scope, String, Value)>) {
        let acts = self.job.modex.commit(rank, entries);
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
                } => self.after_job(
                    Duration::from_millis(ms),
                    JobEvent::GetTimeout { rank, conn, req },
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
        let size = self.job.plan.job.size();
        if target >= size {
            let error = WireError::Invalid {
                op: "get".into(),
                reason: format!("rank {target} is not in the job (size {size})"),
            };
            return self.send_client(conn, &ServerMsg::Failed { req, error });
        }
        let acts = self
            .job
            .modex
            .get(conn, req, target, key, flags, timeout_ms);
        self.apply(acts);
    }

    /// Local rank `rank` called abort (PMIx, PMI-1 or PMI-2) with exit code `code`, as
    /// `what` says: logged, and left to the processes concern (`procs::on_abort`),
    /// ending the job like any failed rank.
    pub(super) fn proc_aborted(&mut self, rank: Rank, code: i32, what: &str) {
        tracing::warn!("rank {rank} {what}");
        let acts = self.job.procs.on_abort(rank, code);
        self.apply_procs(acts);
    }

    /// Carries out what the processes concern decided.
    pub(super) fn apply_procs(&mut self, acts: Vec<procs::Action>) {
        for a in acts {
            match a {
                procs::Action::Ended {
                    rank,
                    reason,
                    finalized,
                } => self.proc_gone_local(rank, reason, finalized),
                procs::Action::Kill { pid, sig } => crate::process::kill(pid, sig),
                procs::Action::Timer { after: d, timer } => {
                    let e = match timer {
                        procs::Timer::ConnLost(rank) => JobEvent::ConnLostCheck { rank },
                        procs::Timer::AbortGrace(rank) => JobEvent::AbortGraceOver { rank },
                        procs::Timer::KillNow => JobEvent::KillNow,
                    };
                    self.after_job(d, e);
                }
                procs::Action::Report { rank, how } => {
                    self.to_launcher(&ToLauncher::ProcExit {
                        proc: ProcId::new(self.job.ns, rank),
                        how,
                    });
                }
            }
        }
    }

    /// Local rank `rank` ended (`finalized`, or otherwise as `reason` says): tells the
    /// other servers and everything here that waits on it.
    pub(super) fn proc_gone_local(&mut self, rank: Rank, reason: String, finalized: bool) {
        let joined = self.job.fences.joined(rank);
        let (nodes, me) = (self.job.plan.job.num_nodes(), self.node);
        for n in (0..nodes).filter(|&n| n != me) {
            self.send_peer(
                n,
                &JobMsg::ProcGone {
                    rank,
                    reason: reason.clone(),
                    joined: joined.clone(),
                    finalized,
                },
            );
        }
        self.proc_gone(rank, reason, joined.into_iter().collect(), finalized);
    }

    /// Rank `rank` of the focused job, a spawned one, ended without finalizing: the
    /// native processes of the job that spawned it, on this node, get a
    /// `SpawnedProcEnded` event naming it (PMIx programs get `PMIX_ERR_PROC_ABORTED`).
    fn tell_parent(&self, rank: Rank, reason: &str) {
        let Some((parent, _)) = &self.job.plan.parent else {
            return;
        };
        let proc = ProcId::new(self.job.ns, rank);
        let event = weft_wireup::Event {
            code: weft_wireup::EventCode::SpawnedProcEnded,
            group: None,
            rank: None,
            pset: None,
            members: Vec::new(),
            reason: format!(
                "rank {rank} of spawned job {} ({}) {reason}",
                self.job.plan.job.nspace, self.job.ns
            ),
            proc: Some(proc),
        };
        let frame = crate::wire::frame::encode(&ServerMsg::Event(event));
        for (who, tx) in self.io.clients.values() {
            if who.is_some_and(|p| p.ns == parent.ns) {
                let _ = tx.send(super::Out::Frame(frame.clone()));
            }
        }
    }

    pub(super) fn proc_gone(
        &mut self,
        rank: Rank,
        reason: String,
        joined: HashSet<u64>,
        finalized: bool,
    ) {
        if self.job.procs.is_gone(rank) {
            return;
        }
        // Gets waiting for keys it never committed (a no-op for other nodes' ranks).
        let acts = self.job.modex.ended(rank, finalized, &reason);
        self.apply(acts);
        self.pmix_rank_ended(rank, &reason, finalized);
        if !finalized {
            self.tell_parent(rank, &reason);
        }
        let proc = weft_wireup::ProcId::new(self.job.ns, rank);
        self.names.registry.proc_gone(proc);
        // Published in the datastore so that clients waiting on this rank in a transport
        // notice without a message (a lookup in shared memory).
        let gone_key = keys::gone(rank);
        self.store_put_vital(&gone_key, reason.as_bytes());
        self.tell_connected_gone(proc, &reason);
        self.job.procs.on_ended(rank, &reason);
        // Collectives the rank never joined can no longer complete, except tolerant
        // groups, which go on without it.
        let now = std::time::Instant::now();
        let acts = self.job.fences.on_proc_gone(
            rank,
            &reason,
            joined,
            now,
            Contrib {
                modex: &self.job.modex,
                pgcids: &mut self.pgcids,
            },
        );
        self.apply_fences(acts);
        let acts = self.job.groups.on_proc_gone(rank, &reason);
        self.apply_groups(acts);
        let acts = self
            .job
            .invitations
            .on_proc_gone(rank, &reason, &mut self.pgcids);
        self.apply_invitations(acts);
        self.pmix_invites_lose(rank, &reason);
        self.connect_proc_gone();
    }
}
