//! Collectives across jobs: `PMIx_Connect`, `PMIx_Disconnect`, a PMIx fence whose
//! participants are of several namespaces (Open MPI's `MPI_Comm_disconnect` fences the
//! processes of both jobs), and the native `Client::connect`/`disconnect`. Each server
//! whose processes take part hands its arrival (and a fence's data) to the root server
//! (node 0) once its local participants all called (gathered by the node's PMIx library,
//! or here for a native call); the root answers every such node when all have arrived
//! (with every node's data, and a native connect's PGCID), or fails the call when a
//! participant ended before its node arrived: then every node that has participants is
//! told, so that a node still gathering fails its callers at once. After a connect, the
//! participants read each other's data as usual (every server knows every job, and a
//! direct modex is routed by the namespace of the process asked about); a native connect
//! records the link between the jobs (`Connects::linked`), which a disconnect removes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use weft_pmix::server as px;
use weft_wireup::proto::{ConnectFailure, Connection, ServerMsg};
use weft_wireup::{NsId, ProcId, ProcSel, Rank};

use super::job::Job;
use super::{after, Event, State};
use crate::modex::ConnId;
use crate::wire::frame;
use crate::wire::proto::{ConnectId, ConnectMsg, CrossKind, PeerMsg};

/// The node whose server completes connects.
const ROOT: u32 = 0;

/// A connect's participants: namespace and rank (`None`: the whole namespace).
type Participants = Vec<(NsId, Option<Rank>)>;

/// A collective the root waits on: the nodes it needs, those arrived with their data.
#[derive(Debug)]
struct Open {
    need: BTreeSet<u32>,
    arrived: BTreeMap<u32, Vec<u8>>,
}

/// Where a local call's result goes.
#[derive(Debug)]
enum Reply {
    Op(px::OpReply),
    Modex(px::ModexReply),
    /// Native callers on this node: connection and request.
    Native(Vec<(ConnId, u64)>),
}

/// A native call's participants on this node, gathered before the node arrives at the
/// root: those expected, those that called, and where the answers go.
#[derive(Debug)]
struct Gather {
    expected: BTreeSet<ProcId>,
    called: BTreeSet<ProcId>,
    replies: Vec<(ConnId, u64)>,
    /// The earliest deadline of the callers so far (each caller's timeout is its own; the
    /// first to pass fails the call for all, as a participant that left would).
    deadline: Option<Instant>,
}

/// How many failed native calls a server remembers (a late caller of one fails at once).
const FAILED_KEPT: usize = 4096;

/// A server's part of connects: its own calls waiting for the root, how many calls of each
/// participant set it made, and (on the root) the calls not complete yet.
#[derive(Debug, Default)]
pub(super) struct Connects {
    waiting: HashMap<ConnectId, Reply>,
    seqs: HashMap<(Participants, CrossKind), u64>,
    open: HashMap<ConnectId, Open>,
    /// Native calls: each caller counts its own calls of a participant set, so the k-th
    /// calls of all participants have one id.
    native_seqs: HashMap<(ProcId, Participants, CrossKind), u64>,
    /// Native calls whose local participants have not all called yet.
    gathers: HashMap<ConnectId, Gather>,
    /// Native calls that failed, and why: a participant that calls later fails at once.
    failed: HashMap<ConnectId, ConnectFailure>,
    /// Pairs of namespaces (lower first) that native connects joined, and how many
    /// connects not disconnected join them.
    links: BTreeMap<(NsId, NsId), u32>,
}

impl Connects {
    /// Whether a native connect joins the processes of namespaces `a` and `b` (a
    /// namespace is always linked to itself).
    pub(super) fn linked(&self, a: NsId, b: NsId) -> bool {
        a == b || self.links.contains_key(&(a.min(b), a.max(b)))
    }

    /// Job `ns` ended here: the counts, failures and links that name it go (no call can
    /// name an ended job again).
    pub(super) fn job_ended(&mut self, ns: NsId) {
        let names = |procs: &Participants| procs.iter().any(|&(n, _)| n == ns);
        self.native_seqs
            .retain(|(me, procs, _), _| me.ns != ns && !names(procs));
        self.seqs.retain(|(procs, _), _| !names(procs));
        self.failed.retain(|id, _| !names(&id.procs));
        self.links.retain(|&(a, b), _| a != ns && b != ns);
    }

    /// For tests: `id` made by its first process, failed, and linked.
    #[cfg(test)]
    pub(super) fn test_record(&mut self, id: &ConnectId) {
        let (ns, rank) = id.procs[0];
        let me = ProcId::new(ns, rank.unwrap_or(0));
        self.native_seqs.insert((me, id.procs.clone(), id.kind), 1);
        self.failed
            .insert(id.clone(), ConnectFailure::Timeout("a test".into()));
        self.relink(id);
    }

    /// For tests: how many call counts, failures and links are kept.
    #[cfg(test)]
    pub(super) fn test_sizes(&self) -> (usize, usize, usize) {
        (self.native_seqs.len(), self.failed.len(), self.links.len())
    }

    fn remember_failed(&mut self, id: ConnectId, why: ConnectFailure) {
        if self.failed.len() >= FAILED_KEPT {
            self.failed.clear();
        }
        self.failed.insert(id, why);
    }

    /// Records (or, for a disconnect, removes) the links between the namespaces of `id`.
    fn relink(&mut self, id: &ConnectId) {
        let ns: BTreeSet<NsId> = id.procs.iter().map(|&(ns, _)| ns).collect();
        let ns: Vec<NsId> = ns.into_iter().collect();
        for (i, &a) in ns.iter().enumerate() {
            for &b in &ns[i + 1..] {
                match id.kind {
                    CrossKind::NativeConnect => *self.links.entry((a, b)).or_insert(0) += 1,
                    CrossKind::NativeDisconnect => {
                        if let Some(n) = self.links.get_mut(&(a, b)) {
                            *n -= 1;
                            if *n == 0 {
                                self.links.remove(&(a, b));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

impl State {
    /// This server's job of namespace `ns`, if it serves it.
    pub(super) fn job_of(&self, ns: NsId) -> Option<&Job> {
        if self.job.ns == ns {
            Some(&self.job)
        } else {
            self.parked.get(&ns)
        }
    }

    /// The nodes that hold participants of `id`, or why there are none to wait for.
    fn connect_nodes(&self, id: &ConnectId) -> Result<BTreeSet<u32>, String> {
        let mut nodes = BTreeSet::new();
        for &(ns, rank) in &id.procs {
            let Some(job) = self.job_of(ns) else {
                return Err(format!(
                    "namespace {ns} is not served here (it ended, or never ran)"
                ));
            };
            let procs = &job.plan.job.procs;
            match rank {
                Some(r) => match procs.get(r as usize) {
                    Some(p) => {
                        nodes.insert(p.node);
                    }
                    None => return Err(format!("{ns} has no rank {r}")),
                },
                None => nodes.extend(procs.iter().map(|p| p.node)),
            }
        }
        Ok(nodes)
    }

    /// A participant of `id` on this node whose process has exited, though this server may
    /// not have heard yet: the node's PMIx library counts a participant that died as done,
    /// so its call can come before the process's end is handled here.
    fn local_participant_exited(&self, id: &ConnectId) -> Option<String> {
        use rustix::process::{waitid, Pid, WaitId, WaitIdOptions};
        for (p, job) in self.participants(id)? {
            if job.plan.job.procs.get(p.rank as usize).map(|i| i.node) != Some(self.node) {
                continue;
            }
            if let Some(why) = job.procs.why_gone(p.rank) {
                return Some(format!("{p} {why}"));
            }
            let Some(pid) = job.procs.pid(p.rank).and_then(|p| Pid::from_raw(p as i32)) else {
                continue;
            };
            // Looks without reaping (the process's own task reaps it).
            let opts = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
            if !matches!(waitid(WaitId::Pid(pid), opts), Ok(None)) {
                return Some(format!("{p} has exited"));
            }
        }
        None
    }

    /// Every participant of `id` (a namespace's wildcard expanded) with its job; `None`
    /// when a namespace is not served here.
    fn participants(&self, id: &ConnectId) -> Option<Vec<(ProcId, &Job)>> {
        let mut out = Vec::new();
        for &(ns, rank) in &id.procs {
            let job = self.job_of(ns)?;
            match rank {
                Some(r) => out.push((ProcId::new(ns, r), job)),
                None => out.extend(
                    (0..job.plan.job.procs.len() as Rank).map(|r| (ProcId::new(ns, r), job)),
                ),
            }
        }
        Some(out)
    }

    /// The first participant of `id` that ended on a node that has not arrived, and why.
    /// For a native call, any participant that ended (one that called and died since
    /// cannot use the connection: its node's other callers must not wait for it).
    fn connect_lost(&self, id: &ConnectId, arrived: &BTreeMap<u32, Vec<u8>>) -> Option<String> {
        if id.kind.is_native() {
            return self.connect_any_gone(id);
        }
        for (p, job) in self.participants(id)? {
            let node = job.plan.job.procs.get(p.rank as usize).map(|i| i.node)?;
            if arrived.contains_key(&node) {
                continue;
            }
            if let Some(why) = job.procs.why_gone(p.rank) {
                return Some(format!("{p} {why}"));
            }
        }
        None
    }

    /// This node's participants of a `PMIx_Connect`/`PMIx_Disconnect` all called it.
    pub(super) fn pmix_connect(&mut self, c: px::Connect) {
        let kind = if c.disconnect {
            CrossKind::Disconnect
        } else {
            CrossKind::Connect
        };
        self.cross_start(kind, &c.procs, c.timeout, Vec::new(), Reply::Op(c.reply));
    }

    /// This node's participants of a PMIx fence over processes of several namespaces
    /// all arrived with `data`.
    pub(super) fn pmix_cross_fence(&mut self, f: px::Fence) {
        let data = if f.collect { f.data } else { Vec::new() };
        let reply = Reply::Modex(f.reply);
        self.cross_start(CrossKind::Fence, &f.procs, f.timeout, data, reply);
    }

    fn cross_start(
        &mut self,
        kind: CrossKind,
        names: &[px::ProcName],
        timeout: Option<Duration>,
        data: Vec<u8>,
        reply: Reply,
    ) {
        let mut procs = Vec::with_capacity(names.len());
        for p in names {
            match self.pmix.as_ref().and_then(|px| px.ns_of(&p.nspace)) {
                Some(ns) => procs.push((ns, p.rank)),
                None => {
                    tracing::warn!(
                        "PMIx {kind:?} names {:?}, which this runtime does not run",
                        p.nspace
                    );
                    return fail(reply, px::Failure::NotFound);
                }
            }
        }
        procs.sort_unstable();
        procs.dedup();
        let seq = self.connects.seqs.entry((procs.clone(), kind)).or_insert(0);
        let id = ConnectId {
            procs,
            kind,
            seq: *seq,
        };
        *seq += 1;
        if let Err(why) = self.connect_nodes(&id) {
            tracing::warn!("PMIx {kind:?}: {why}");
            return fail(reply, px::Failure::NotFound);
        }
        if let Some(why) = self.local_participant_exited(&id) {
            tracing::warn!("PMIx {kind:?} of {:?}: {why}", id.procs);
            return fail(reply, px::Failure::ProcGone);
        }
        if let Some(t) = timeout {
            after(&self.io.ev, t, Event::ConnectTimeout(id.clone()));
        }
        self.connects.waiting.insert(id.clone(), reply);
        let node = self.node;
        self.connect_send(ROOT, ConnectMsg::Arrive { id, node, data });
    }

    /// A connect message of another server (or of this one, on the root).
    pub(super) fn on_connect_msg(&mut self, m: ConnectMsg) {
        match m {
            ConnectMsg::Arrive { id, node, data } => self.connect_arrive(id, node, data),
            ConnectMsg::Withdraw { id, reason } => self.connect_withdraw(id, reason),
            ConnectMsg::Done { id, result, pgcid } => {
                if id.kind.is_native() {
                    return self.native_done(id, result, pgcid);
                }
                let Some(reply) = self.connects.waiting.remove(&id) else {
                    return; // Timed out here already, or its node never arrived.
                };
                match (result, reply) {
                    (Ok(_), Reply::Op(r)) => r.ok(),
                    (Ok(data), Reply::Modex(r)) => r.ok(data),
                    (Ok(_), Reply::Native(_)) => {}
                    (Err(why), reply) => {
                        tracing::warn!("PMIx {:?} of {:?} failed: {why}", id.kind, id.procs);
                        self.fail(reply, px::Failure::ProcGone, &why);
                    }
                }
            }
        }
    }

    /// The root: node `node` arrived in `id`.
    fn connect_arrive(&mut self, id: ConnectId, node: u32, data: Vec<u8>) {
        if self.node != ROOT {
            return tracing::error!(
                "node {node} sent a connect to node {}, not the root",
                self.node
            );
        }
        if !self.connects.open.contains_key(&id) {
            if let Some(f) = self.connects.failed.get(&id) {
                let why = match f {
                    ConnectFailure::Invalid(w)
                    | ConnectFailure::Gone(w)
                    | ConnectFailure::Timeout(w) => w.clone(),
                };
                return self.connect_done(&id, [node].into(), Err(why));
            }
            match self.connect_nodes(&id) {
                Ok(need) => {
                    let open = Open {
                        need,
                        arrived: BTreeMap::new(),
                    };
                    self.connects.open.insert(id.clone(), open);
                }
                Err(why) => return self.connect_done(&id, [node].into(), Err(why)),
            }
        }
        let open = self.connects.open.get_mut(&id).expect("inserted above");
        open.arrived.insert(node, data);
        if open.need.iter().all(|n| open.arrived.contains_key(n)) {
            let open = self.connects.open.remove(&id).expect("present");
            // Every node arrived, but a node's PMIx library counts a participant that
            // died before calling as done: a participant gone now never took part.
            if let Some(why) = self.connect_lost(&id, &BTreeMap::new()) {
                return self.connect_done(&id, open.need, Err(why));
            }
            let all: Vec<u8> = open.arrived.into_values().flatten().collect();
            let pgcid = (id.kind == CrossKind::NativeConnect).then(|| self.pgcids.take());
            return self.connect_done_with(&id, open.need, Ok(all), pgcid);
        }
        let lost = self.connect_lost(&id, &self.connects.open[&id].arrived);
        if let Some(why) = lost {
            let open = self.connects.open.remove(&id).expect("present");
            self.connect_done(&id, open.need, Err(why));
        }
    }

    /// The root: a node's callers of native call `id` gave up (their timeout passed):
    /// the call fails for every node, unless it completed already. A call no node arrived
    /// in yet is remembered as failed, for the arrivals to come.
    fn connect_withdraw(&mut self, id: ConnectId, reason: String) {
        if self.node != ROOT {
            return tracing::error!(
                "a connect withdrawal reached node {}, not the root",
                self.node
            );
        }
        let need = match self.connects.open.remove(&id) {
            Some(o) => o.need,
            None => match self.connect_nodes(&id) {
                Ok(need) => need,
                Err(_) => return,
            },
        };
        self.connects
            .remember_failed(id.clone(), ConnectFailure::Timeout(reason.clone()));
        self.connect_done(&id, need, Err(reason));
    }

    /// A process ended: native calls still gathering here that name it fail, and on the
    /// root, connects waiting on it cannot complete.
    pub(super) fn connect_proc_gone(&mut self) {
        let lost: Vec<(ConnectId, String)> = self
            .connects
            .gathers
            .keys()
            .filter_map(|id| self.connect_any_gone(id).map(|w| (id.clone(), w)))
            .collect();
        for (id, why) in lost {
            if let Some(g) = self.connects.gathers.remove(&id) {
                tracing::warn!("native {:?} of {:?} failed: {why}", id.kind, id.procs);
                let failure = ConnectFailure::Gone(why);
                self.answer(&g.replies, Err(failure.clone()));
                self.connects.remember_failed(id, failure);
            }
        }
        if self.node != ROOT || self.connects.open.is_empty() {
            return;
        }
        let lost: Vec<(ConnectId, String)> = self
            .connects
            .open
            .iter()
            .filter_map(|(id, o)| self.connect_lost(id, &o.arrived).map(|w| (id.clone(), w)))
            .collect();
        for (id, why) in lost {
            if let Some(o) = self.connects.open.remove(&id) {
                self.connect_done(&id, o.need, Err(why));
            }
        }
    }

    /// Connect `id`'s own call here timed out.
    pub(super) fn connect_timeout(&mut self, id: ConnectId) {
        if let Some(reply) = self.connects.waiting.remove(&id) {
            tracing::warn!("{:?} of {:?} timed out", id.kind, id.procs);
            let why = "every participant on this node called it, but not all of the \
                       other nodes' had"
                .to_owned();
            self.fail(reply, px::Failure::Timeout, &why);
            if id.kind.is_native() {
                self.connects
                    .remember_failed(id.clone(), ConnectFailure::Timeout(why.clone()));
                let reason = format!("node {}'s callers timed out: {why}", self.node);
                self.connect_send(ROOT, ConnectMsg::Withdraw { id, reason });
            }
        } else if let Some(g) = self.connects.gathers.remove(&id) {
            let missing: Vec<String> = g
                .expected
                .difference(&g.called)
                .map(ProcId::to_string)
                .collect();
            let why = format!("{} had not called it", missing.join(", "));
            tracing::warn!("{:?} of {:?} timed out: {why}", id.kind, id.procs);
            self.answer(&g.replies, Err(ConnectFailure::Timeout(why.clone())));
            self.connects
                .remember_failed(id.clone(), ConnectFailure::Timeout(why.clone()));
            let reason = format!("timed out on node {}: {why}", self.node);
            self.connect_send(ROOT, ConnectMsg::Withdraw { id, reason });
        }
    }

    fn connect_done(
        &mut self,
        id: &ConnectId,
        nodes: BTreeSet<u32>,
        result: Result<Vec<u8>, String>,
    ) {
        self.connect_done_with(id, nodes, result, None);
    }

    fn connect_done_with(
        &mut self,
        id: &ConnectId,
        nodes: BTreeSet<u32>,
        result: Result<Vec<u8>, String>,
        pgcid: Option<u64>,
    ) {
        for n in nodes {
            let m = ConnectMsg::Done {
                id: id.clone(),
                result: result.clone(),
                pgcid,
            };
            self.connect_send(n, m);
        }
    }

    /// Process `p` ended: the datastores of the jobs on this node connected with its job
    /// say so (`keys::gone_proc`), for `Client::gone_proc`.
    pub(super) fn tell_connected_gone(&mut self, p: ProcId, reason: &str) {
        let key = weft_wireup::keys::gone_proc(p);
        let focused = (self.job.ns, &mut self.job);
        let jobs = self
            .parked
            .iter_mut()
            .map(|(&ns, j)| (ns, j))
            .chain([focused]);
        for (ns, job) in jobs {
            if ns == p.ns || !self.connects.linked(ns, p.ns) {
                continue;
            }
            // Into the store's reserve: `gone_proc` has no fallback to the server.
            if job.store.insert_vital(&key, reason.as_bytes()).is_err() {
                tracing::error!(
                    "node datastore {} is full, its reserve too: {p}'s end is not recorded \
                     in it",
                    job.store.name()
                );
                job.store.set_overflowed();
            }
        }
    }

    /// A native connect or disconnect of local rank `rank` of the focused job, on
    /// connection `conn`: gathered with the node's other participants, then sent to the
    /// root.
    pub(super) fn native_connect(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        procs: Vec<ProcSel>,
        disconnect: bool,
        timeout_ms: Option<u64>,
    ) {
        let me = ProcId::new(self.job.ns, rank);
        let kind = if disconnect {
            CrossKind::NativeDisconnect
        } else {
            CrossKind::NativeConnect
        };
        let answer = |st: &State, result| {
            st.send_client(conn, &ServerMsg::Connected { req, result });
        };
        let mut list: Participants = procs
            .iter()
            .map(|p| match *p {
                ProcSel::One(p) => (p.ns, Some(p.rank)),
                ProcSel::All(ns) => (ns, None),
            })
            .collect();
        list.sort_unstable();
        list.dedup();
        // A whole namespace is its processes: callers that name it whole and those that
        // list its ranks make one id.
        let mut expanded = Vec::with_capacity(list.len());
        for (ns, r) in list {
            match (r, self.job_of(ns)) {
                (None, Some(job)) => {
                    expanded.extend((0..job.plan.job.procs.len() as Rank).map(|r| (ns, Some(r))))
                }
                _ => expanded.push((ns, r)),
            }
        }
        expanded.sort_unstable();
        expanded.dedup();
        let list = expanded;
        if !list
            .iter()
            .any(|&(ns, r)| ns == me.ns && r.is_none_or(|r| r == rank))
        {
            let why = format!("the caller ({me}) is not among the processes named");
            return answer(self, Err(ConnectFailure::Invalid(why)));
        }
        let seq = self
            .connects
            .native_seqs
            .entry((me, list.clone(), kind))
            .or_insert(0);
        let id = ConnectId {
            procs: list,
            kind,
            seq: *seq,
        };
        *seq += 1;
        if let Err(why) = self.connect_nodes(&id) {
            return answer(self, Err(ConnectFailure::Invalid(why)));
        }
        if let Some(f) = self.connects.failed.get(&id) {
            return answer(self, Err(f.clone()));
        }
        if let Some(why) = self.connect_any_gone(&id) {
            return answer(self, Err(ConnectFailure::Gone(why)));
        }
        if !self.connects.gathers.contains_key(&id) {
            let expected: BTreeSet<ProcId> = self
                .participants(&id)
                .unwrap_or_default()
                .into_iter()
                .filter(|(p, job)| {
                    job.plan.job.procs.get(p.rank as usize).map(|i| i.node) == Some(self.node)
                })
                .map(|(p, _)| p)
                .collect();
            let g = Gather {
                expected,
                called: BTreeSet::new(),
                replies: Vec::new(),
                deadline: None,
            };
            self.connects.gathers.insert(id.clone(), g);
        }
        let g = self.connects.gathers.get_mut(&id).expect("inserted above");
        g.called.insert(me);
        g.replies.push((conn, req));
        // A timer per caller whose deadline comes before the others': a timer that fires
        // after the call completed (or failed) finds nothing to do.
        if let Some(wait) = timeout_ms.map(Duration::from_millis) {
            let deadline = Instant::now().checked_add(wait);
            if deadline.is_some_and(|d| g.deadline.is_none_or(|old| d < old)) {
                g.deadline = deadline;
                after(&self.io.ev, wait, Event::ConnectTimeout(id.clone()));
            }
        }
        if g.called.len() < g.expected.len() {
            return;
        }
        let g = self.connects.gathers.remove(&id).expect("present");
        self.connects
            .waiting
            .insert(id.clone(), Reply::Native(g.replies));
        let node = self.node;
        self.connect_send(
            ROOT,
            ConnectMsg::Arrive {
                id,
                node,
                data: Vec::new(),
            },
        );
    }

    /// The root's answer to native call `id`.
    fn native_done(&mut self, id: ConnectId, result: Result<Vec<u8>, String>, pgcid: Option<u64>) {
        let replies = match self.connects.waiting.remove(&id) {
            Some(Reply::Native(r)) => r,
            Some(other) => {
                return self.fail(other, px::Failure::Invalid, "a native call's answer");
            }
            // A node still gathering: the call failed elsewhere (or the answer is late).
            None => match self.connects.gathers.remove(&id) {
                Some(g) => g.replies,
                None => Vec::new(),
            },
        };
        if replies.is_empty() {
            return; // Its callers here gave up (timed out) or failed already.
        }
        let result = match result {
            Ok(_) => {
                self.connects.relink(&id);
                // A participant that ended before the link existed: its end was not
                // written into the linked jobs' datastores then.
                let ended: Vec<(ProcId, String)> = self
                    .participants(&id)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|(p, job)| Some((p, job.procs.why_gone(p.rank)?.to_owned())))
                    .collect();
                for (p, why) in ended {
                    self.tell_connected_gone(p, &why);
                }
                match (id.kind, pgcid) {
                    (CrossKind::NativeConnect, Some(pgcid)) => {
                        Ok(Some(self.connection(&id, pgcid)))
                    }
                    (CrossKind::NativeConnect, None) => Err(ConnectFailure::Invalid(
                        "the root server completed the connect without a PGCID".into(),
                    )),
                    _ => Ok(None),
                }
            }
            Err(why) => {
                tracing::warn!("native {:?} of {:?} failed: {why}", id.kind, id.procs);
                let failure = ConnectFailure::Gone(why);
                self.connects.remember_failed(id, failure.clone());
                Err(failure)
            }
        };
        self.answer(&replies, result);
    }

    /// The processes of call `id` and their nodes, with its PGCID.
    fn connection(&self, id: &ConnectId, pgcid: u64) -> Connection {
        let mut procs: Vec<(ProcId, u32)> = self
            .participants(id)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(p, job)| {
                let node = job.plan.job.procs.get(p.rank as usize)?.node;
                Some((p, node))
            })
            .collect();
        procs.sort_unstable();
        procs.dedup();
        Connection {
            pgcid,
            procs: procs.iter().map(|&(p, _)| p).collect(),
            nodes: procs.iter().map(|&(_, n)| n).collect(),
        }
    }

    /// A participant of `id` (on any node) that ended, and why: one that failed rather
    /// than one that finalized (which may have finalized because of that failure).
    fn connect_any_gone(&self, id: &ConnectId) -> Option<String> {
        let mut finalized = None;
        for (p, job) in self.participants(id)? {
            match job.procs.why_gone(p.rank) {
                Some(why) if why == weft_wireup::FINALIZED => {
                    finalized.get_or_insert_with(|| format!("{p} {why}"));
                }
                Some(why) => return Some(format!("{p} {why}")),
                None => {}
            }
        }
        finalized
    }

    fn answer(
        &self,
        replies: &[(ConnId, u64)],
        result: Result<Option<Connection>, ConnectFailure>,
    ) {
        for &(conn, req) in replies {
            let result = result.clone();
            self.send_client(conn, &ServerMsg::Connected { req, result });
        }
    }

    fn fail(&self, reply: Reply, why: px::Failure, reason: &str) {
        match reply {
            Reply::Op(r) => r.fail(why),
            Reply::Modex(r) => r.fail(why),
            Reply::Native(replies) => {
                let failure = match why {
                    px::Failure::Timeout => ConnectFailure::Timeout(reason.to_owned()),
                    _ => ConnectFailure::Gone(reason.to_owned()),
                };
                self.answer(&replies, Err(failure));
            }
        }
    }

    fn connect_send(&mut self, node: u32, m: ConnectMsg) {
        if node == self.node {
            return self.on_connect_msg(m);
        }
        let f = frame::encode(&PeerMsg::Connect(m));
        self.io.peers.send(self.node, node, f, &self.io.ev);
    }
}

fn fail(reply: Reply, why: px::Failure) {
    match reply {
        Reply::Op(r) => r.fail(why),
        Reply::Modex(r) => r.fail(why),
        Reply::Native(_) => tracing::error!("a native connect's callers failed as a PMIx call"),
    }
}
