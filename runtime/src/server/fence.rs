//! The fence concern of a server, without IO: collectives between servers (fences, and
//! the gather under group constructs and destructs), from a local process's arrival to
//! the Bruck all-gather with the other servers, its completion, its deadline, and its
//! failures (a participant that died, a disagreement, a timeout). Every `on_*` method
//! takes an input and returns the [`Action`]s the server carries out (replies, peer
//! messages, timers, data learned), so the state machine is tested without sockets,
//! tasks or time (see `fence/tests.rs`).
//!
//! The rules it keeps:
//! - A collective completes once every expected participant has joined on every
//!   participating node: each node contributes one block (its participants'
//!   generations, and their data for a full fence), and the all-gather takes one
//!   message per node per step, O(log nodes) steps.
//! - A participant that is gone and never joined fails the collective (`ProcGone`, the
//!   first death this server learned of), unless the group tolerates it: then it is not
//!   waited for.
//! - At the deadline, the servers are asked who has not arrived; the collective fails
//!   with `Timeout` naming them, everywhere, unless everyone had arrived (then it is
//!   only finishing). An optional group goes on with the members that joined in time.
//! - A finished collective's outcome is remembered, so a late or repeated arrival gets
//!   the same answer (or is told it came too late).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::wire::proto::{
    CollId, CollKind, FenceMode, GroupBlock, GroupSpec, JobMsg, ProcData, Procs, ServerMsg,
    WireError,
};
use weft_wireup::Rank;

use super::pgcids::Pgcids;
use crate::modex::{ConnId, Modex};

/// How long a timed-out fence waits for other servers to say who is missing.
pub(crate) const ARRIVAL_QUERY_WAIT: Duration = Duration::from_millis(300);
/// How many joined-collective digests a server remembers per local process.
const JOINED_HISTORY: usize = 4096;
/// How many finished collectives a server remembers the outcome of.
const FINISHED_HISTORY: usize = 100_000;

/// What the server must do.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Send `msg` to the client connection `conn`.
    Reply { conn: ConnId, msg: ServerMsg },
    /// Send to the server of `node`.
    Peer { node: u32, msg: JobMsg },
    /// Call [`Fences::on_deadline`] with `id` at `at`.
    Deadline { id: CollId, at: Instant },
    /// Call [`Fences::on_query_timeout`] with `qid` after `after`.
    QueryTimer { qid: u64, after: Duration },
    /// What a completed fence carried of other nodes' participants: for the data concern.
    Learn(ProcData),
    /// A group construct or destruct gathered every node's block: the groups concern makes
    /// its result, answers `waiters`, then calls [`Fences::finish`].
    GroupGathered { id: CollId, gathered: Gathered },
}

/// What a completed group collective gathered.
#[derive(Debug, Clone)]
pub(crate) struct Gathered {
    /// Every participating node's block.
    pub(crate) blocks: BTreeMap<u32, Vec<u8>>,
    /// The local requests waiting for the result.
    pub(crate) waiters: Vec<(ConnId, u64)>,
    /// The group's directives and timeout.
    pub(crate) group: Option<GroupSpec>,
}

/// What a local process's arrival at a collective says.
#[derive(Debug, Clone)]
pub(crate) struct Arrival {
    pub(crate) rank: Rank,
    pub(crate) conn: ConnId,
    pub(crate) req: u64,
    pub(crate) id: CollId,
    pub(crate) mode: FenceMode,
    pub(crate) timeout_ms: Option<u64>,
    /// For group collectives: their directives and timeout.
    pub(crate) group: Option<GroupSpec>,
}

/// What a collective's block is made of, held by other concerns: the participants'
/// data (the data concern) and, at the root server, the PGCIDs to hand out.
#[derive(Debug)]
pub(crate) struct Contrib<'a> {
    pub(crate) modex: &'a Modex,
    pub(crate) pgcids: &'a mut Pgcids,
}

/// A participant that is gone, as the fences know it.
#[derive(Debug)]
struct Death {
    reason: String,
    /// The digests of the collectives it joined before it went.
    joined: HashSet<u64>,
    /// The order in which this server learned of the deaths (0 first).
    order: usize,
}

#[derive(Debug)]
struct Coll {
    digest: u64,
    mode: Option<FenceMode>,
    local_expected: BTreeSet<Rank>,
    arrived: BTreeSet<Rank>,
    waiters: Vec<(ConnId, u64)>,
    nodes: Vec<u32>,
    me: usize,
    started: bool,
    step: u32,
    sent_step: Option<u32>,
    blocks: BTreeMap<u32, Vec<u8>>,
    inbox: HashMap<u32, Vec<(u32, Vec<u8>)>>,
    deadline: Option<Instant>,
    timing_out: bool,
    /// For group collectives: directives and timeout (sent along with every Gather so
    /// that a server that learns of the collective from a peer knows them too).
    group: Option<GroupSpec>,
}

impl Coll {
    fn tolerant(&self) -> bool {
        self.group.as_ref().is_some_and(|g| g.directives.tolerant())
    }
}

/// An arrival query of a timed-out collective: the nodes yet to answer, and the
/// participants known not to have arrived.
#[derive(Debug)]
struct Query {
    id: CollId,
    waiting: HashSet<u32>,
    missing: BTreeSet<Rank>,
}

/// The fence concern of one server.
#[derive(Debug)]
pub(crate) struct Fences {
    node: u32,
    /// The node of every rank of the job.
    owners: Vec<u32>,
    colls: HashMap<CollId, Coll>,
    /// The outcome of finished collectives (`None`: succeeded), the oldest forgotten first.
    finished: HashMap<CollId, Option<WireError>>,
    finished_order: VecDeque<CollId>,
    queries: HashMap<u64, Query>,
    next_qid: u64,
    deaths: HashMap<Rank, Death>,
    /// The digests of the collectives each local process joined, the latest last.
    joined: HashMap<Rank, VecDeque<u64>>,
}

impl Fences {
    /// The fences of the server of `node`; `owners[r]` is the node of rank `r`.
    pub(crate) fn new(node: u32, owners: Vec<u32>) -> Fences {
        Fences {
            node,
            owners,
            colls: HashMap::new(),
            finished: HashMap::new(),
            finished_order: VecDeque::new(),
            queries: HashMap::new(),
            // Query ids carry the asking node in their top 16 bits, so answers find their
            // way back.
            next_qid: (u64::from(node) << 48) | 1,
            deaths: HashMap::new(),
            joined: HashMap::new(),
        }
    }

    fn size(&self) -> u32 {
        self.owners.len() as u32
    }

    fn is_local(&self, rank: Rank) -> bool {
        self.owners.get(rank as usize) == Some(&self.node)
    }

    fn ranks_on(&self, node: u32) -> impl Iterator<Item = Rank> + '_ {
        (0..self.size()).filter(move |&r| self.owners[r as usize] == node)
    }

    /// The digests of the collectives local rank `rank` joined (what its death tells
    /// the other servers).
    pub(crate) fn joined(&self, rank: Rank) -> Vec<u64> {
        self.joined
            .get(&rank)
            .map(|j| j.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Whether another construct of group `id.name` is in progress.
    pub(crate) fn construct_in_progress(&self, id: &CollId) -> bool {
        self.colls.keys().any(|other| {
            other.kind == CollKind::GroupConstruct && other.name == id.name && other != id
        })
    }

    /// How many collectives are in progress here.
    #[cfg(test)]
    pub(crate) fn in_progress(&self) -> usize {
        self.colls.len()
    }

    /// The first participant of `id` (digest `digest`) this server learned is gone
    /// without having joined it, and why: the root cause (later deaths, such as peers
    /// that finalized because of it, follow from it). None for a `tolerant` group.
    fn first_dead(&self, id: &CollId, digest: u64, tolerant: bool) -> Option<(Rank, String)> {
        if tolerant {
            return None;
        }
        self.deaths
            .iter()
            .filter(|(r, g)| id.procs.contains(**r) && !g.joined.contains(&digest))
            .min_by_key(|(_, g)| g.order)
            .map(|(r, g)| (*r, g.reason.clone()))
    }

    fn new_coll(&self, id: &CollId, group: Option<GroupSpec>) -> Coll {
        let ranks = id.procs.ranks(self.size());
        let mut nodes: Vec<u32> = ranks.iter().map(|&r| self.owners[r as usize]).collect();
        let assign = group
            .as_ref()
            .is_some_and(|g| g.directives.assign_context_id);
        if id.kind == CollKind::GroupConstruct && assign {
            // The root server takes part to hand out the PGCID in its block.
            nodes.push(0);
        }
        nodes.sort_unstable();
        nodes.dedup();
        let me = nodes.iter().position(|&n| n == self.node).unwrap_or(0);
        let tolerant = group.as_ref().is_some_and(|g| g.directives.tolerant());
        let digest = id.digest();
        Coll {
            digest,
            mode: None,
            local_expected: ranks
                .into_iter()
                .filter(|&r| self.is_local(r))
                // A tolerant group does not wait for members that are already gone.
                .filter(|r| {
                    !tolerant
                        || self
                            .deaths
                            .get(r)
                            .is_none_or(|g| g.joined.contains(&digest))
                })
                .collect(),
            arrived: BTreeSet::new(),
            waiters: Vec::new(),
            nodes,
            me,
            started: false,
            step: 0,
            sent_step: None,
            blocks: BTreeMap::new(),
            inbox: HashMap::new(),
            deadline: None,
            timing_out: false,
            group,
        }
    }

    /// Remembers how collective `id` ended (`None`: it succeeded); the groups concern
    /// calls it once it has answered a group collective's waiters.
    pub(crate) fn finish(&mut self, id: CollId, error: Option<WireError>) {
        self.finished.insert(id.clone(), error);
        self.finished_order.push_back(id);
        while self.finished_order.len() > FINISHED_HISTORY {
            if let Some(old) = self.finished_order.pop_front() {
                self.finished.remove(&old);
            }
        }
    }

    /// A local process joins a collective (a fence or a group operation) at `now`.
    pub(crate) fn on_arrive(&mut self, a: Arrival, now: Instant, mut cx: Contrib) -> Vec<Action> {
        let Arrival {
            rank,
            conn,
            req,
            id,
            mode,
            timeout_ms,
            group,
        } = a;
        let size = self.size();
        let op = id.op();
        let fail = |error| {
            vec![Action::Reply {
                conn,
                msg: ServerMsg::Failed { req, error },
            }]
        };
        let bad = match &id.procs {
            Procs::List(v) if v.windows(2).any(|w| w[0] >= w[1]) => {
                Some(format!("participants {v:?} are not sorted and distinct"))
            }
            Procs::List(v) if v.iter().any(|&r| r >= size) => Some(format!(
                "participants {v:?} name ranks outside the job (size {size})"
            )),
            p if !p.contains(rank) => Some(format!("rank {rank} is not among the participants")),
            _ => None,
        };
        if let Some(reason) = bad {
            return fail(WireError::Invalid {
                op: op.into(),
                reason,
            });
        }
        match self.finished.get(&id) {
            Some(Some(error)) => return fail(error.clone()),
            Some(None) if id.is_group() => {
                return fail(WireError::Invalid {
                    op: op.into(),
                    reason: format!(
                        "group {:?}: this operation already completed without rank {rank} (it arrived after the deadline)",
                        id.name
                    ),
                });
            }
            _ => {}
        }
        if !self.colls.contains_key(&id) {
            let c = self.new_coll(&id, group.clone());
            self.colls.insert(id.clone(), c);
        }
        let c = &self.colls[&id];
        if c.arrived.contains(&rank) || (c.started && !c.local_expected.contains(&rank)) {
            let reason = if c.arrived.contains(&rank) {
                format!("rank {rank} joined it twice (the same id used twice concurrently?)")
            } else {
                format!("this node's part completed without rank {rank} (it arrived after the deadline)")
            };
            return fail(WireError::Invalid {
                op: format!("{op} {:?}", id.name),
                reason,
            });
        }
        let digest = c.digest;
        let tolerant = c.tolerant();
        if self.is_local(rank) {
            let j = self.joined.entry(rank).or_default();
            j.push_back(digest);
            if j.len() > JOINED_HISTORY {
                j.pop_front();
            }
        }
        // A participant that is gone and never joined dooms the collective (unless the
        // group tolerates it: then it was left out of `local_expected`).
        let dead = self.first_dead(&id, digest, tolerant);
        let c = self.colls.get_mut(&id).expect("just inserted");
        c.waiters.push((conn, req));
        if let Some((dead_rank, reason)) = dead {
            let error = WireError::ProcGone {
                op: op.into(),
                rank: dead_rank,
                reason,
            };
            return self.fail(&id, error, true);
        }
        if let Some(m) = c.mode {
            if m != mode {
                let error = WireError::Invalid {
                    op: op.into(),
                    reason: format!(
                        "rank {rank} asked for mode {mode:?} but others asked for {m:?}"
                    ),
                };
                return self.fail(&id, error, true);
            }
        }
        if let (Some(mine), Some(theirs)) = (&group, &c.group) {
            if mine.directives != theirs.directives {
                let error = WireError::Invalid {
                    op: format!("{op} {:?}", id.name),
                    reason: format!(
                        "rank {rank} gave directives {:?} but others gave {:?}",
                        mine.directives, theirs.directives
                    ),
                };
                return self.fail(&id, error, true);
            }
        }
        c.mode = Some(mode);
        c.arrived.insert(rank);
        let mut acts = Vec::new();
        if let Some(ms) = timeout_ms {
            self.arm_deadline(&id, ms, now, &mut acts);
        }
        self.maybe_start(&id, now, &mut cx, &mut acts);
        acts
    }

    /// A message of another server about a collective (`Gather`, `Abort`,
    /// `ArrivalQuery`, `ArrivalReply`); other messages are not the fences' and are
    /// ignored.
    pub(crate) fn on_peer(&mut self, msg: JobMsg, now: Instant, mut cx: Contrib) -> Vec<Action> {
        let mut acts = Vec::new();
        match msg {
            JobMsg::Gather {
                id,
                mode,
                step,
                blocks,
                group,
            } => {
                if self.finished.contains_key(&id) {
                    return acts;
                }
                let fresh = !self.colls.contains_key(&id);
                if fresh {
                    let timeout = group.as_ref().and_then(|g| g.timeout_ms);
                    let c = self.new_coll(&id, group.clone());
                    // A participant this server knows is gone and never joined dooms
                    // it at once (as at an arrival): otherwise, with no local process
                    // left to arrive, it would wait here for ever.
                    let dead = self.first_dead(&id, c.digest, c.tolerant());
                    self.colls.insert(id.clone(), c);
                    if let Some((rank, reason)) = dead {
                        let error = WireError::ProcGone {
                            op: id.op().into(),
                            rank,
                            reason,
                        };
                        return self.fail(&id, error, false);
                    }
                    if let Some(ms) = timeout {
                        self.arm_deadline(&id, ms, now, &mut acts);
                    }
                }
                let Some(c) = self.colls.get_mut(&id) else {
                    return acts;
                };
                match c.mode {
                    Some(m) if m != mode => {
                        let reason = format!("participants asked for different modes ({m:?} here, {mode:?} on another node)");
                        acts.extend(self.fail_disagreement(&id, reason));
                        return acts;
                    }
                    _ => c.mode = Some(mode),
                }
                let theirs = group.as_ref().map(|g| &g.directives);
                if !fresh && c.group.as_ref().map(|g| &g.directives) != theirs {
                    let reason = format!(
                        "participants gave different directives ({:?} here, {theirs:?} on another node)",
                        c.group.as_ref().map(|g| &g.directives)
                    );
                    acts.extend(self.fail_disagreement(&id, reason));
                    return acts;
                }
                c.inbox.insert(step, blocks);
                if fresh {
                    // A node with no process left to wait for (the root server handing
                    // out a PGCID, or one whose members are gone) starts right away.
                    self.maybe_start(&id, now, &mut cx, &mut acts);
                }
                self.advance(&id, now, &mut acts);
            }
            JobMsg::Abort { id, error } => {
                if self.colls.contains_key(&id) {
                    acts = self.fail(&id, error, false);
                } else if !self.finished.contains_key(&id) {
                    self.finish(id, Some(error));
                }
            }
            JobMsg::ArrivalQuery { id, qid } => {
                let missing = match (self.colls.get(&id), self.finished.contains_key(&id)) {
                    (Some(c), _) => c.local_expected.difference(&c.arrived).copied().collect(),
                    (None, true) => Vec::new(),
                    (None, false) => self
                        .ranks_on(self.node)
                        .filter(|&r| id.procs.contains(r))
                        .collect(),
                };
                let asker = (qid >> 48) as u32;
                let node = self.node;
                acts.push(Action::Peer {
                    node: asker,
                    msg: JobMsg::ArrivalReply { qid, node, missing },
                });
            }
            JobMsg::ArrivalReply { qid, node, missing } => {
                if let Some(q) = self.queries.get_mut(&qid) {
                    q.missing.extend(missing);
                    q.waiting.remove(&node);
                }
                self.maybe_finish_query(qid, &mut acts);
            }
            other => tracing::error!("not a message about a collective: {other:?}"),
        }
        acts
    }

    /// Rank `rank` is gone (`reason`), having joined the collectives of digests
    /// `joined`: the collectives it never joined can no longer complete, except in
    /// tolerant groups, which go on without it.
    pub(crate) fn on_proc_gone(
        &mut self,
        rank: Rank,
        reason: &str,
        joined: HashSet<u64>,
        now: Instant,
        mut cx: Contrib,
    ) -> Vec<Action> {
        if self.deaths.contains_key(&rank) {
            return Vec::new();
        }
        let mut doomed = Vec::new();
        let mut shrunk = Vec::new();
        for (id, c) in &mut self.colls {
            if !id.procs.contains(rank) || joined.contains(&c.digest) {
                continue;
            }
            if c.tolerant() {
                if c.local_expected.remove(&rank) {
                    shrunk.push(id.clone());
                }
            } else {
                doomed.push(id.clone());
            }
        }
        let order = self.deaths.len();
        self.deaths.insert(
            rank,
            Death {
                reason: reason.to_owned(),
                joined,
                order,
            },
        );
        let mut acts = Vec::new();
        for id in doomed {
            let error = WireError::ProcGone {
                op: id.op().into(),
                rank,
                reason: reason.to_owned(),
            };
            acts.extend(self.fail(&id, error, false));
        }
        for id in shrunk {
            self.maybe_start(&id, now, &mut cx, &mut acts);
        }
        acts
    }

    /// Collective `id`'s deadline timer fired at `now`: an optional group goes on with
    /// the members that joined; otherwise the other servers are asked who is missing.
    pub(crate) fn on_deadline(&mut self, id: CollId, now: Instant, mut cx: Contrib) -> Vec<Action> {
        let mut acts = Vec::new();
        let Some(c) = self.colls.get_mut(&id) else {
            return acts;
        };
        if c.timing_out || c.deadline.is_none_or(|d| d > now) {
            return acts;
        }
        if c.group.as_ref().is_some_and(|g| g.directives.optional) {
            // An optional group goes on with the members that joined in time.
            if !c.started {
                c.local_expected = c.arrived.clone();
                self.maybe_start(&id, now, &mut cx, &mut acts);
            }
            return acts;
        }
        c.timing_out = true;
        let missing: BTreeSet<Rank> = c.local_expected.difference(&c.arrived).copied().collect();
        let others: HashSet<u32> = c
            .nodes
            .iter()
            .copied()
            .filter(|&n| n != self.node)
            .collect();
        let qid = self.next_qid;
        self.next_qid += 1;
        for &n in &others {
            acts.push(Action::Peer {
                node: n,
                msg: JobMsg::ArrivalQuery {
                    id: id.clone(),
                    qid,
                },
            });
        }
        self.queries.insert(
            qid,
            Query {
                id,
                waiting: others,
                missing,
            },
        );
        acts.push(Action::QueryTimer {
            qid,
            after: ARRIVAL_QUERY_WAIT,
        });
        self.maybe_finish_query(qid, &mut acts);
        acts
    }

    /// The arrival query `qid` waited long enough: the nodes that did not answer count
    /// all their participants as missing.
    pub(crate) fn on_query_timeout(&mut self, qid: u64) -> Vec<Action> {
        let mut acts = Vec::new();
        self.finish_query(qid, &mut acts);
        acts
    }

    fn maybe_finish_query(&mut self, qid: u64, acts: &mut Vec<Action>) {
        if self.queries.get(&qid).is_some_and(|q| q.waiting.is_empty()) {
            self.finish_query(qid, acts);
        }
    }

    fn finish_query(&mut self, qid: u64, acts: &mut Vec<Action>) {
        let Some(mut q) = self.queries.remove(&qid) else {
            return;
        };
        // Nodes that did not answer: all their participants count as missing.
        for n in &q.waiting {
            for r in self.ranks_on(*n) {
                if q.id.procs.contains(r) {
                    q.missing.insert(r);
                }
            }
        }
        if q.missing.is_empty() {
            // Everyone has arrived: the all-gather is only finishing. Aborting now could
            // fail a fence that succeeds elsewhere, so let it complete.
            if let Some(c) = self.colls.get_mut(&q.id) {
                c.timing_out = false;
            }
            return;
        }
        let error = WireError::Timeout {
            op: q.id.op().into(),
            missing: q.missing.into_iter().collect(),
        };
        tracing::debug!("{}", super::wire_to_text(&error));
        acts.extend(self.fail(&q.id, error, true));
    }

    /// Sets collective `id`'s deadline `ms` after `now`, if that is earlier than its own.
    fn arm_deadline(&mut self, id: &CollId, ms: u64, now: Instant, acts: &mut Vec<Action>) {
        let Some(c) = self.colls.get_mut(id) else {
            return;
        };
        let Some(d) = now.checked_add(Duration::from_millis(ms)) else {
            return;
        };
        if c.deadline.is_none_or(|old| d < old) {
            c.deadline = Some(d);
            acts.push(Action::Deadline {
                id: id.clone(),
                at: d,
            });
        }
    }

    /// Starts the inter-node part of `id` once every expected local process has joined.
    fn maybe_start(&mut self, id: &CollId, now: Instant, cx: &mut Contrib, acts: &mut Vec<Action>) {
        let Some(c) = self.colls.get(id) else {
            return;
        };
        if c.started || !c.local_expected.is_subset(&c.arrived) {
            return;
        }
        let mode = c.mode.unwrap_or(FenceMode::SyncOnly);
        let block_of = |r: Rank| {
            let with_data = mode == FenceMode::Full;
            (r, cx.modex.gen(r), with_data.then(|| cx.modex.view(r)))
        };
        let block = match id.kind {
            // Every mode carries the participants' generations (so that other nodes learn
            // which of their copies are older); Full carries the data too.
            CollKind::Fence => {
                let data: ProcData = c.local_expected.iter().map(|&r| block_of(r)).collect();
                postcard::to_stdvec(&data).expect("encode")
            }
            CollKind::GroupDestruct => Vec::new(),
            CollKind::GroupConstruct => {
                let joined: Vec<Rank> = c.arrived.iter().copied().collect();
                let data: ProcData = joined.iter().map(|&r| block_of(r)).collect();
                let assign = c
                    .group
                    .as_ref()
                    .is_some_and(|g| g.directives.assign_context_id);
                let pgcid = (assign && self.node == 0).then(|| cx.pgcids.take());
                postcard::to_stdvec(&GroupBlock {
                    joined,
                    data,
                    pgcid,
                })
                .expect("encode")
            }
        };
        let c = self.colls.get_mut(id).expect("exists");
        c.blocks.insert(self.node, block);
        c.started = true;
        self.advance(id, now, acts);
    }

    /// Drives the Bruck all-gather of collective `id` as far as received data allows.
    fn advance(&mut self, id: &CollId, now: Instant, acts: &mut Vec<Action>) {
        loop {
            let Some(c) = self.colls.get_mut(id) else {
                return;
            };
            if !c.started {
                return;
            }
            let n = c.nodes.len();
            let dist = 1usize << c.step;
            if dist >= n {
                return self.complete(id, acts);
            }
            if c.sent_step != Some(c.step) {
                let cnt = dist.min(n - dist);
                let to = c.nodes[(c.me + n - dist) % n];
                let blocks: Vec<(u32, Vec<u8>)> = (0..cnt)
                    .filter_map(|j| {
                        let node = c.nodes[(c.me + j) % n];
                        c.blocks.get(&node).map(|b| (node, b.clone()))
                    })
                    .collect();
                c.sent_step = Some(c.step);
                let mode = c.mode.unwrap_or(FenceMode::SyncOnly);
                let group = c.group.as_ref().map(|g| GroupSpec {
                    directives: g.directives.clone(),
                    timeout_ms: c.deadline.map(|d| {
                        let left = d.saturating_duration_since(now);
                        u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
                    }),
                });
                let msg = JobMsg::Gather {
                    id: id.clone(),
                    mode,
                    step: c.step,
                    blocks,
                    group,
                };
                acts.push(Action::Peer { node: to, msg });
                continue;
            }
            let Some(got) = c.inbox.remove(&c.step) else {
                return;
            };
            for (node, b) in got {
                c.blocks.insert(node, b);
            }
            c.step += 1;
        }
    }

    fn complete(&mut self, id: &CollId, acts: &mut Vec<Action>) {
        let Some(c) = self.colls.remove(id) else {
            return;
        };
        if id.kind != CollKind::Fence {
            let gathered = Gathered {
                blocks: c.blocks,
                waiters: c.waiters,
                group: c.group,
            };
            acts.push(Action::GroupGathered {
                id: id.clone(),
                gathered,
            });
            return;
        }
        let mut err = None;
        for (node, b) in &c.blocks {
            if *node == self.node {
                continue;
            }
            match postcard::from_bytes::<ProcData>(b) {
                Ok(data) => acts.push(Action::Learn(data)),
                Err(e) => {
                    err = Some(WireError::Invalid {
                        op: "fence".into(),
                        reason: format!("corrupt data block from node {node}: {e}"),
                    })
                }
            }
        }
        for (conn, req) in c.waiters {
            let msg = match &err {
                Some(e) => ServerMsg::Failed {
                    req,
                    error: e.clone(),
                },
                None => ServerMsg::Done { req },
            };
            acts.push(Action::Reply { conn, msg });
        }
        self.finish(id.clone(), err);
    }

    /// Fails collective `id` everywhere because its participants disagree (`reason`).
    fn fail_disagreement(&mut self, id: &CollId, reason: String) -> Vec<Action> {
        let error = WireError::Invalid {
            op: id.op().into(),
            reason,
        };
        self.fail(id, error, true)
    }

    /// Fails collective `id` here with `error` (and on the other participating nodes
    /// when `broadcast`).
    fn fail(&mut self, id: &CollId, error: WireError, broadcast: bool) -> Vec<Action> {
        let mut acts = Vec::new();
        let nodes = match self.colls.remove(id) {
            Some(c) => {
                for (conn, req) in c.waiters {
                    let msg = ServerMsg::Failed {
                        req,
                        error: error.clone(),
                    };
                    acts.push(Action::Reply { conn, msg });
                }
                c.nodes
            }
            None => self.new_coll(id, None).nodes,
        };
        if broadcast {
            let me = self.node;
            for n in nodes.into_iter().filter(|&n| n != me) {
                let msg = JobMsg::Abort {
                    id: id.clone(),
                    error: error.clone(),
                };
                acts.push(Action::Peer { node: n, msg });
            }
        }
        self.finish(id.clone(), Some(error));
        acts
    }
}

#[cfg(test)]
mod tests;
