//! `PMIx_Connect` and `PMIx_Disconnect` across jobs: a collective of processes of one or
//! several namespaces. Each server whose processes take part hands its arrival to the root
//! server (node 0) once the PMIx library gathered its local participants; the root answers
//! every such node when all have arrived, or fails the call when a participant ended
//! before its node arrived. After a connect, the participants read each other's data as
//! usual (every server knows every job, and a direct modex is routed by the namespace of
//! the process asked about).

use std::collections::{BTreeSet, HashMap};

use weft_pmix::server as px;
use weft_wireup::{NsId, ProcId, Rank};

use super::job::Job;
use super::{after, Event, State};
use crate::wire::frame;
use crate::wire::proto::{ConnectId, ConnectMsg, PeerMsg};

/// The node whose server completes connects.
const ROOT: u32 = 0;

/// A connect's participants: namespace and rank (`None`: the whole namespace).
type Participants = Vec<(NsId, Option<Rank>)>;

/// A connect the root waits on.
#[derive(Debug)]
struct Open {
    need: BTreeSet<u32>,
    arrived: BTreeSet<u32>,
}

/// A server's part of connects: its own calls waiting for the root, how many calls of each
/// participant set it made, and (on the root) the calls not complete yet.
#[derive(Debug, Default)]
pub(super) struct Connects {
    waiting: HashMap<ConnectId, px::OpReply>,
    seqs: HashMap<(Participants, bool), u64>,
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

    /// The first participant of `id` that ended on a node that has not arrived, and why.
    fn connect_lost(&self, id: &ConnectId, arrived: &BTreeSet<u32>) -> Option<String> {
        for &(ns, rank) in &id.procs {
            let job = self.job_of(ns)?;
            let ranks: Vec<Rank> = match rank {
                Some(r) => vec![r],
                None => (0..job.plan.job.procs.len() as Rank).collect(),
            };
            for r in ranks {
                let node = job.plan.job.procs.get(r as usize).map(|p| p.node)?;
                if arrived.contains(&node) {
                    continue;
                }
                if let Some(why) = job.procs.why_gone(r) {
                    return Some(format!("{} {why}", ProcId::new(ns, r)));
                }
            }
        }
        None
    }

    /// This node's participants of a `PMIx_Connect`/`PMIx_Disconnect` all called it.
    pub(super) fn pmix_connect(&mut self, c: px::Connect) {
        let mut procs = Vec::with_capacity(c.procs.len());
        for p in &c.procs {
            match self.pmix.as_ref().and_then(|px| px.ns_of(&p.nspace)) {
                Some(ns) => procs.push((ns, p.rank)),
                None => {
                    tracing::warn!(
                        "PMIx_Connect names {:?}, which this runtime does not run",
                        p.nspace
                    );
                    return c.reply.fail(px::Failure::NotFound);
                }
            }
        }
        procs.sort_unstable();
        procs.dedup();
        let seq = self
            .connects
            .seqs
            .entry((procs.clone(), c.disconnect))
            .or_insert(0);
        let id = ConnectId {
            procs,
            disconnect: c.disconnect,
            seq: *seq,
        };
        *seq += 1;
        if let Err(why) = self.connect_nodes(&id) {
            tracing::warn!("PMIx_Connect: {why}");
            return c.reply.fail(px::Failure::NotFound);
        }
        if let Some(t) = c.timeout {
            after(&self.io.ev, t, Event::ConnectTimeout(id.clone()));
        }
        self.connects.waiting.insert(id.clone(), c.reply);
        let node = self.node;
        self.connect_send(ROOT, ConnectMsg::Arrive { id, node });
    }

    /// A connect message of another server (or of this one, on the root).
    pub(super) fn on_connect_msg(&mut self, m: ConnectMsg) {
        match m {
            ConnectMsg::Arrive { id, node } => self.connect_arrive(id, node),
            ConnectMsg::Done { id, result } => {
                let Some(reply) = self.connects.waiting.remove(&id) else {
                    return; // Timed out here already.
                };
                match result {
                    Ok(()) => reply.ok(),
                    Err(why) => {
                        tracing::warn!("PMIx_Connect of {:?} failed: {why}", id.procs);
                        reply.fail(px::Failure::ProcGone);
                    }
                }
            }
        }
    }

    /// The root: node `node` arrived in `id`.
    fn connect_arrive(&mut self, id: ConnectId, node: u32) {
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
                        arrived: BTreeSet::new(),
                    };
                    self.connects.open.insert(id.clone(), open);
                }
                Err(why) => return self.connect_done(&id, [node].into(), Err(why)),
            }
        }
        let open = self.connects.open.get_mut(&id).expect("inserted above");
        open.arrived.insert(node);
        if open.arrived.is_superset(&open.need) {
            let open = self.connects.open.remove(&id).expect("present");
            return self.connect_done(&id, open.need, Ok(()));
        }
        let arrived = open.arrived.clone();
        if let Some(why) = self.connect_lost(&id, &arrived) {
            let open = self.connects.open.remove(&id).expect("present");
            self.connect_done(&id, open.arrived, Err(why));
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
                self.connect_done(&id, o.arrived, Err(why));
            }
        }
    }

    /// Connect `id`'s own call here timed out.
    pub(super) fn connect_timeout(&mut self, id: ConnectId) {
        if let Some(reply) = self.connects.waiting.remove(&id) {
            tracing::warn!("PMIx_Connect of {:?} timed out", id.procs);
            reply.fail(px::Failure::Timeout);
        }
    }

    fn connect_done(&mut self, id: &ConnectId, nodes: BTreeSet<u32>, result: Result<(), String>) {
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
