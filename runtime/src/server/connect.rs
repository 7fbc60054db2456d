//! Collectives across jobs: `PMIx_Connect`, `PMIx_Disconnect`, and a PMIx fence whose
//! participants are of several namespaces (Open MPI's `MPI_Comm_disconnect` fences the
//! processes of both jobs). Each server whose processes take part hands its arrival (and a
//! fence's data) to the root server (node 0) once the PMIx library gathered its local
//! participants; the root answers every such node when all have arrived (with every node's
//! data), or fails the call when a participant ended before its node arrived. After a
//! connect, the participants read each other's data as usual (every server knows every
//! job, and a direct modex is routed by the namespace of the process asked about).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use weft_pmix::server as px;
use weft_wireup::{NsId, ProcId, Rank};

use super::job::Job;
use super::{after, Event, State};
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
}

/// A server's part of connects: its own calls waiting for the root, how many calls of each
/// participant set it made, and (on the root) the calls not complete yet.
#[derive(Debug, Default)]
pub(super) struct Connects {
    waiting: HashMap<ConnectId, Reply>,
    seqs: HashMap<(Participants, CrossKind), u64>,
    open: HashMap<ConnectId, Open>,
}

impl State {
    /// This server's job of namespace `ns`, if it serves it.
    fn job_of(&self, ns: NsId) -> Option<&Job> {
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
    fn connect_lost(&self, id: &ConnectId, arrived: &BTreeMap<u32, Vec<u8>>) -> Option<String> {
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
            ConnectMsg::Done { id, result } => {
                let Some(reply) = self.connects.waiting.remove(&id) else {
                    return; // Timed out here already.
                };
                match (result, reply) {
                    (Ok(_), Reply::Op(r)) => r.ok(),
                    (Ok(data), Reply::Modex(r)) => r.ok(data),
                    (Err(why), reply) => {
                        tracing::warn!("PMIx {:?} of {:?} failed: {why}", id.kind, id.procs);
                        fail(reply, px::Failure::ProcGone);
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
            return self.connect_done(&id, open.need, Ok(all));
        }
        let lost = self.connect_lost(&id, &self.connects.open[&id].arrived);
        if let Some(why) = lost {
            let open = self.connects.open.remove(&id).expect("present");
            self.connect_done(&id, open.arrived.into_keys().collect(), Err(why));
        }
    }

    /// The root: a process ended; connects waiting on it cannot complete.
    pub(super) fn connect_proc_gone(&mut self) {
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
                self.connect_done(&id, o.arrived.into_keys().collect(), Err(why));
            }
        }
    }

    /// Connect `id`'s own call here timed out.
    pub(super) fn connect_timeout(&mut self, id: ConnectId) {
        if let Some(reply) = self.connects.waiting.remove(&id) {
            tracing::warn!("PMIx {:?} of {:?} timed out", id.kind, id.procs);
            fail(reply, px::Failure::Timeout);
        }
    }

    fn connect_done(
        &mut self,
        id: &ConnectId,
        nodes: BTreeSet<u32>,
        result: Result<Vec<u8>, String>,
    ) {
        for n in nodes {
            let m = ConnectMsg::Done {
                id: id.clone(),
                result: result.clone(),
            };
            self.connect_send(n, m);
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
    }
}
