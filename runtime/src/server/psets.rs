//! The process-set concern of a server, without IO: process sets defined while the job
//! runs (every server holds the same), changed only by the root server (node 0), which
//! checks a change and announces it to every server. Every `on_*` method returns the
//! [`Action`]s the server carries out (see `psets/tests.rs`).

use std::collections::{BTreeMap, HashMap};

use crate::wire::proto::{Event, EventCode, JobMsg, ServerMsg, WireError};
use weft_wireup::keys;
use weft_wireup::Rank;

use crate::modex::ConnId;

/// What the server must do.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Send `msg` to the client connection `conn`.
    Reply { conn: ConnId, msg: ServerMsg },
    /// Send to the server of `node`.
    Peer { node: u32, msg: JobMsg },
    /// Write into the node's datastore segment.
    Store { key: Vec<u8>, value: Vec<u8> },
    /// Tell every local process.
    Emit(Event),
}

/// The process sets of one server.
#[derive(Debug)]
pub(crate) struct Psets {
    node: u32,
    num_nodes: u32,
    /// The job's size.
    size: u32,
    /// The names of the launch process sets (they cannot be changed).
    launch: Vec<String>,
    /// Process sets defined while the job runs, by name.
    defined: BTreeMap<String, Vec<Rank>>,
    /// Local requests waiting for the root's answer, by query id.
    waiters: HashMap<u64, (ConnId, u64)>,
    next_qid: u64,
}

impl Psets {
    /// The process sets of the server of `node`, in a job of `size` ranks over
    /// `num_nodes` nodes whose launch process sets are named `launch`.
    pub(crate) fn new(node: u32, num_nodes: u32, size: u32, launch: Vec<String>) -> Psets {
        Psets {
            node,
            num_nodes,
            size,
            launch,
            defined: BTreeMap::new(),
            waiters: HashMap::new(),
            // Query ids carry the asking node in their top 16 bits.
            next_qid: (u64::from(node) << 48) | 1,
        }
    }

    /// The process sets defined while the job runs.
    pub(crate) fn defined(&self) -> &BTreeMap<String, Vec<Rank>> {
        &self.defined
    }

    /// A local process asks to define process set `name` with `members`, or to delete
    /// it (`None`).
    pub(crate) fn on_request(
        &mut self,
        conn: ConnId,
        req: u64,
        name: String,
        members: Option<Vec<Rank>>,
    ) -> Vec<Action> {
        let qid = self.next_qid;
        self.next_qid += 1;
        self.waiters.insert(qid, (conn, req));
        let from = self.node;
        if self.node == 0 {
            return self.on_change(name, members, from, qid);
        }
        let msg = JobMsg::PsetChange {
            name,
            members,
            from,
            qid,
        };
        vec![Action::Peer { node: 0, msg }]
    }

    /// Root server: checks a process-set change asked by node `from` and applies it on
    /// every server.
    pub(crate) fn on_change(
        &mut self,
        name: String,
        members: Option<Vec<Rank>>,
        from: u32,
        qid: u64,
    ) -> Vec<Action> {
        let size = self.size;
        let launch = self.launch.contains(&name)
            || name == weft_wireup::PSET_SELF
            || name.starts_with("mpi://");
        let error = match &members {
            _ if name.is_empty() => Some("the name is empty".to_owned()),
            _ if launch => Some(format!("{name:?} is a built-in or launch process set")),
            Some(_) if self.defined.contains_key(&name) => {
                Some(format!("process set {name:?} already exists"))
            }
            Some(m) if m.is_empty() => Some("no members".to_owned()),
            Some(m) if m.iter().any(|&r| r >= size) => Some(format!(
                "members {m:?} name ranks outside the job (size {size})"
            )),
            None if !self.defined.contains_key(&name) => Some(format!(
                "no process set {name:?} was defined while the job runs"
            )),
            _ => None,
        };
        let members = members.map(|mut m| {
            m.sort_unstable();
            m.dedup();
            m
        });
        // Only the asker needs to know of a refusal.
        let to: Vec<u32> = if error.is_some() {
            vec![from]
        } else {
            (0..self.num_nodes).collect()
        };
        let mut acts = Vec::new();
        for n in to {
            if n == self.node {
                acts.extend(self.on_changed(name.clone(), members.clone(), qid, error.clone()));
            } else {
                let msg = JobMsg::PsetChanged {
                    name: name.clone(),
                    members: members.clone(),
                    qid,
                    error: error.clone(),
                };
                acts.push(Action::Peer { node: n, msg });
            }
        }
        acts
    }

    /// Applies a process-set change decided by the root server (and answers the asker).
    pub(crate) fn on_changed(
        &mut self,
        name: String,
        members: Option<Vec<Rank>>,
        qid: u64,
        error: Option<String>,
    ) -> Vec<Action> {
        let mut acts = Vec::new();
        if let Some((conn, req)) = self.waiters.remove(&qid) {
            let msg = match &error {
                None => ServerMsg::Done { req },
                Some(reason) => ServerMsg::Failed {
                    req,
                    error: WireError::Invalid {
                        op: format!("pset change of {name:?}"),
                        reason: reason.clone(),
                    },
                },
            };
            acts.push(Action::Reply { conn, msg });
        }
        if error.is_some() {
            return acts;
        }
        let code = match &members {
            Some(m) => {
                self.defined.insert(name.clone(), m.clone());
                EventCode::PsetDefined
            }
            None => {
                self.defined.remove(&name);
                EventCode::PsetDeleted
            }
        };
        let names: Vec<String> = self.defined.keys().cloned().collect();
        acts.push(Action::Store {
            key: keys::pset(&name),
            value: postcard::to_stdvec(&members).expect("encode"),
        });
        acts.push(Action::Store {
            key: keys::RUNTIME_PSETS.to_vec(),
            value: postcard::to_stdvec(&names).expect("encode"),
        });
        acts.push(Action::Emit(Event {
            code,
            group: None,
            rank: None,
            pset: Some(name),
            members: members.unwrap_or_default(),
            reason: String::new(),
            proc: None,
        }));
        acts
    }
}

#[cfg(test)]
mod tests;
