//! The name service (`Client::publish`/`lookup`/`unpublish`, `PMIx_Publish`/`Lookup`/
//! `Unpublish`): the root server (node 0) keeps every published name in its
//! [`Registry`], for every job of the runtime; the other servers forward their processes'
//! requests to it (`PeerMsg::Names`) and hand its answers back ([`Names`]).
//!
//! A name's reach is its publisher's node, namespace or the whole runtime (session and
//! global are one while the runtime holds one session); a lookup sees the names whose
//! reach holds the caller, the narrowest first. A waiting lookup is kept until every key it
//! asks for is published, its time passes, or its process or job ends.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use weft_pmix::server as px;
use weft_wireup::{NsId, ProcId, Rank};

use super::{after, Event, State};
use crate::modex::ConnId;
use crate::wire::frame;
use crate::wire::proto::{
    NameCaller, NameFailure, NameOp, NameRange, NameValue, NamesMsg, PeerMsg, Persistence,
    Published, ServerMsg,
};

/// The node whose server keeps the names.
const ROOT: u32 = 0;

/// Where a name is visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Reach {
    Node(u32),
    Ns(NsId),
    All,
}

/// The reach a name published by `who` with `range` gets.
fn reach(range: NameRange, who: &NameCaller) -> Reach {
    match range {
        NameRange::Node => Reach::Node(who.node),
        NameRange::Namespace => Reach::Ns(who.proc.ns),
        NameRange::Session | NameRange::Global => Reach::All,
    }
}

/// The reaches a lookup by `who` with `range` searches, narrowest first.
fn searched(range: NameRange, who: &NameCaller) -> Vec<Reach> {
    match range {
        NameRange::Node => vec![Reach::Node(who.node)],
        NameRange::Namespace => vec![Reach::Ns(who.proc.ns)],
        NameRange::Session | NameRange::Global => {
            vec![Reach::Node(who.node), Reach::Ns(who.proc.ns), Reach::All]
        }
    }
}

#[derive(Debug)]
struct Entry {
    owner: NameCaller,
    value: NameValue,
    persist: Persistence,
}

/// A lookup waiting for its keys: whom to answer (node, request id there).
#[derive(Debug)]
struct Waiter {
    node: u32,
    qid: u64,
    who: NameCaller,
    range: NameRange,
    keys: Vec<String>,
}

/// An answer of the root to request `qid` of node `node`.
#[derive(Debug, PartialEq)]
pub(super) struct Answer {
    pub(super) node: u32,
    pub(super) qid: u64,
    pub(super) result: Result<Vec<Published>, NameFailure>,
}

/// The published names (kept by the root server).
#[derive(Debug, Default)]
pub(super) struct Registry {
    names: BTreeMap<(Reach, String), Entry>,
    /// Waiting lookups, by a number of their own (which their timer names).
    waiting: BTreeMap<u64, Waiter>,
    next: u64,
}

impl Registry {
    /// Request `qid` of node `node`'s process `who`: the answers it completes (its own,
    /// unless it waits, and those of lookups it satisfies), and the timer to set for it
    /// (the waiter's number and how long), if it waits with a limit.
    pub(super) fn request(
        &mut self,
        node: u32,
        qid: u64,
        who: NameCaller,
        op: NameOp,
    ) -> (Vec<Answer>, Option<(u64, Duration)>) {
        match op {
            NameOp::Publish {
                range,
                persist,
                entries,
            } => {
                let result = self.publish(&who, range, persist, entries);
                let ok = result.is_ok();
                let mut out = vec![Answer {
                    node,
                    qid,
                    result: result.map(|()| Vec::new()),
                }];
                if ok {
                    out.extend(self.wake());
                }
                (out, None)
            }
            NameOp::Unpublish { range, keys } => {
                let result = self.unpublish(&who, range, keys).map(|()| Vec::new());
                (vec![Answer { node, qid, result }], None)
            }
            NameOp::Lookup {
                range,
                keys,
                wait_ms,
            } => {
                if keys.is_empty() {
                    let result = Err(NameFailure::Invalid("a lookup of no key".into()));
                    return (vec![Answer { node, qid, result }], None);
                }
                let (found, missing) = self.find(&who, range, &keys);
                let done = match wait_ms {
                    None if found.is_empty() => Some(Err(NameFailure::NotFound(missing))),
                    None => Some(Ok(found)),
                    Some(_) if missing.is_empty() => Some(Ok(found)),
                    Some(_) => None,
                };
                if let Some(result) = done {
                    if let Ok(f) = &result {
                        self.read(&who, range, f);
                    }
                    return (vec![Answer { node, qid, result }], None);
                }
                let id = self.next;
                self.next += 1;
                self.waiting.insert(
                    id,
                    Waiter {
                        node,
                        qid,
                        who,
                        range,
                        keys,
                    },
                );
                let timer = wait_ms
                    .filter(|&ms| ms != u64::MAX)
                    .map(|ms| (id, Duration::from_millis(ms)));
                (Vec::new(), timer)
            }
        }
    }

    fn publish(
        &mut self,
        who: &NameCaller,
        range: NameRange,
        persist: Persistence,
        entries: Vec<(String, NameValue)>,
    ) -> Result<(), NameFailure> {
        if entries.is_empty() {
            return Err(NameFailure::Invalid("nothing to publish".into()));
        }
        let at = reach(range, who);
        let mut dup: Vec<String> = Vec::new();
        for (i, (k, _)) in entries.iter().enumerate() {
            if k.is_empty() {
                return Err(NameFailure::Invalid("an empty key".into()));
            }
            let twice = entries[..i].iter().any(|(o, _)| o == k);
            if (twice || self.names.contains_key(&(at, k.clone()))) && !dup.contains(k) {
                dup.push(k.clone());
            }
        }
        if !dup.is_empty() {
            return Err(NameFailure::Duplicate(dup));
        }
        for (k, value) in entries {
            let owner = who.clone();
            self.names.insert(
                (at, k),
                Entry {
                    owner,
                    value,
                    persist,
                },
            );
        }
        Ok(())
    }

    fn unpublish(
        &mut self,
        who: &NameCaller,
        range: NameRange,
        keys: Vec<String>,
    ) -> Result<(), NameFailure> {
        let at = reach(range, who);
        let mine = |e: &Entry| e.owner.proc == who.proc;
        if keys.is_empty() {
            self.names.retain(|(r, _), e| *r != at || !mine(e));
            return Ok(());
        }
        let missing: Vec<String> = keys
            .iter()
            .filter(|k| !self.names.get(&(at, (*k).clone())).is_some_and(mine))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(NameFailure::NotFound(missing));
        }
        for k in keys {
            self.names.remove(&(at, k));
        }
        Ok(())
    }

    /// The names of `keys` `who` sees with `range` (the narrowest reach first), and the
    /// keys not found.
    fn find(
        &self,
        who: &NameCaller,
        range: NameRange,
        keys: &[String],
    ) -> (Vec<Published>, Vec<String>) {
        let reaches = searched(range, who);
        let (mut found, mut missing) = (Vec::new(), Vec::new());
        for k in keys {
            let hit = reaches
                .iter()
                .find_map(|&r| self.names.get(&(r, k.clone())));
            match hit {
                Some(e) => found.push(Published {
                    key: k.clone(),
                    owner: e.owner.proc,
                    nspace: e.owner.nspace.clone(),
                    value: e.value.clone(),
                }),
                None => missing.push(k.clone()),
            }
        }
        (found, missing)
    }

    /// `found` was returned to `who`: names published to be read once go.
    fn read(&mut self, who: &NameCaller, range: NameRange, found: &[Published]) {
        let reaches = searched(range, who);
        for p in found {
            let at = reaches
                .iter()
                .copied()
                .find(|&r| self.names.contains_key(&(r, p.key.clone())));
            if let Some(at) = at {
                let key = (at, p.key.clone());
                if self.names[&key].persist == Persistence::FirstRead {
                    self.names.remove(&key);
                }
            }
        }
    }

    /// The waiting lookups whose keys are all published now, answered.
    fn wake(&mut self) -> Vec<Answer> {
        let ready: Vec<u64> = self
            .waiting
            .iter()
            .filter(|(_, w)| self.find(&w.who, w.range, &w.keys).1.is_empty())
            .map(|(&id, _)| id)
            .collect();
        let mut out = Vec::new();
        for id in ready {
            let w = self.waiting.remove(&id).expect("listed above");
            // An earlier waiter may have read a name published to be read once.
            let (found, missing) = self.find(&w.who, w.range, &w.keys);
            if !missing.is_empty() {
                self.waiting.insert(id, w);
                continue;
            }
            self.read(&w.who, w.range, &found);
            out.push(Answer {
                node: w.node,
                qid: w.qid,
                result: Ok(found),
            });
        }
        out
    }

    /// Waiting lookup `id`'s time passed: its answer names the keys still missing.
    pub(super) fn expire(&mut self, id: u64) -> Option<Answer> {
        let w = self.waiting.remove(&id)?;
        let (_, missing) = self.find(&w.who, w.range, &w.keys);
        Some(Answer {
            node: w.node,
            qid: w.qid,
            result: Err(NameFailure::Timeout(missing)),
        })
    }

    /// Process `proc` ended: its names kept for its life go, and its waiting lookups
    /// (nobody is left to answer).
    pub(super) fn proc_gone(&mut self, proc: ProcId) {
        self.names
            .retain(|_, e| e.owner.proc != proc || e.persist != Persistence::Proc);
        self.waiting.retain(|_, w| w.who.proc != proc);
    }

    /// Job `ns` ended: its names kept for its life (or its processes') go, with its
    /// waiting lookups.
    pub(super) fn job_ended(&mut self, ns: NsId) {
        self.names.retain(|_, e| {
            e.owner.proc.ns != ns || !matches!(e.persist, Persistence::Proc | Persistence::Job)
        });
        self.waiting.retain(|_, w| w.who.proc.ns != ns);
    }

    /// How many names are published (for tests and `weft ps` to come).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.names.len()
    }
}

/// Who gets the answer to a request a local process made.
#[derive(Debug)]
pub(super) enum NameReply {
    /// A native client: its connection and request id.
    Native { conn: ConnId, req: u64 },
    /// A PMIx client's publish or unpublish.
    PmixOp(px::OpReply),
    /// A PMIx client's lookup.
    PmixLookup(px::LookupReply),
    /// A PMI-1 or PMI-2 client of job `ns` (MPICH's `MPI_Publish_name` and kin).
    Pmi { ns: NsId, rank: Rank, what: PmiName },
}

/// What a PMI client asked the name service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PmiName {
    Publish,
    Unpublish,
    Lookup,
}

impl PmiName {
    /// PMI-1's reply command to it.
    pub(super) fn pmi1_reply(self) -> &'static str {
        match self {
            PmiName::Publish => "publish_result",
            PmiName::Unpublish => "unpublish_result",
            PmiName::Lookup => "lookup_result",
        }
    }

    /// PMI-2's command (its reply adds `-response`).
    pub(super) fn pmi2_command(self) -> &'static str {
        match self {
            PmiName::Publish => "name-publish",
            PmiName::Unpublish => "name-unpublish",
            PmiName::Lookup => "name-lookup",
        }
    }
}

/// A server's part of the name service: its processes' requests in flight, and (on the
/// root) the names.
#[derive(Debug, Default)]
pub(super) struct Names {
    next: u64,
    pending: HashMap<u64, NameReply>,
    pub(super) registry: Registry,
}

impl State {
    /// Local rank `rank` of the focused job makes request `op`; `to` gets the answer.
    pub(super) fn names_request(&mut self, rank: Rank, to: NameReply, op: NameOp) {
        let qid = self.names.next;
        self.names.next += 1;
        self.names.pending.insert(qid, to);
        let who = NameCaller {
            proc: ProcId::new(self.job.ns, rank),
            nspace: self.job.plan.job.nspace.clone(),
            node: self.node,
        };
        if self.node == ROOT {
            self.names_at_root(self.node, qid, who, op);
        } else {
            let from = self.node;
            self.send_names(ROOT, &NamesMsg::Req { qid, from, who, op });
        }
    }

    /// A message of the name service from another server.
    pub(super) fn on_names_msg(&mut self, m: NamesMsg) {
        match m {
            NamesMsg::Req { qid, from, who, op } if self.node == ROOT => {
                self.names_at_root(from, qid, who, op)
            }
            NamesMsg::Req { from, .. } => tracing::error!(
                "node {from} sent a name-service request to node {}, which is not the root",
                self.node
            ),
            NamesMsg::Resp { qid, result } => self.names_done(qid, result),
        }
    }

    /// Waiting lookup `id` (on the root) ran out of time.
    pub(super) fn names_expired(&mut self, id: u64) {
        if let Some(a) = self.names.registry.expire(id) {
            self.names_answer(vec![a]);
        }
    }

    fn names_at_root(&mut self, from: u32, qid: u64, who: NameCaller, op: NameOp) {
        let (answers, timer) = self.names.registry.request(from, qid, who, op);
        if let Some((id, d)) = timer {
            after(&self.io.ev, d, Event::NamesExpired(id));
        }
        self.names_answer(answers);
    }

    fn names_answer(&mut self, answers: Vec<Answer>) {
        for a in answers {
            if a.node == self.node {
                self.names_done(a.qid, a.result);
            } else {
                let m = NamesMsg::Resp {
                    qid: a.qid,
                    result: a.result,
                };
                self.send_names(a.node, &m);
            }
        }
    }

    fn send_names(&mut self, node: u32, m: &NamesMsg) {
        let f = frame::encode(&PeerMsg::Names(m.clone()));
        self.io.peers.send(self.node, node, f, &self.io.ev);
    }

    /// The answer to local request `qid` arrived.
    fn names_done(&mut self, qid: u64, result: Result<Vec<Published>, NameFailure>) {
        let Some(to) = self.names.pending.remove(&qid) else {
            tracing::debug!("a name-service answer to request {qid}, which nobody waits for");
            return;
        };
        match to {
            NameReply::Native { conn, req } => {
                self.send_client(conn, &ServerMsg::Names { req, result })
            }
            NameReply::PmixOp(r) => match result {
                Ok(_) => r.ok(),
                Err(f) => r.fail(pmix_failure(&f)),
            },
            NameReply::PmixLookup(r) => match result {
                Ok(found) => r.found(found.into_iter().map(found_of).collect()),
                Err(f) => r.fail(pmix_failure(&f)),
            },
            NameReply::Pmi { ns, rank, what } => {
                if self.focus(ns) {
                    self.pmi_named(rank, what, result);
                }
            }
        }
    }
}

impl State {
    /// A PMIx client's `PMIx_Publish`.
    pub(super) fn pmix_publish(&mut self, p: px::Publish) {
        let Some(rank) = p.requester.rank else {
            return p.reply.fail(px::Failure::Invalid);
        };
        let range = match range_of(p.range) {
            Ok(r) => r,
            Err(f) => return p.reply.fail(f),
        };
        let persist = match p.persist {
            px::Persist::Indef => Persistence::Indefinite,
            px::Persist::FirstRead => Persistence::FirstRead,
            px::Persist::Proc => Persistence::Proc,
            px::Persist::App => Persistence::Job,
            px::Persist::Session => Persistence::Session,
        };
        let entries = p
            .data
            .into_iter()
            .map(|(k, v)| {
                let v = match v {
                    px::PubValue::Str(s) => NameValue::Str(s),
                    px::PubValue::Bytes(b) => NameValue::Bytes(b),
                    px::PubValue::Packed(b) => NameValue::Pmix(b),
                };
                (k, v)
            })
            .collect();
        let op = NameOp::Publish {
            range,
            persist,
            entries,
        };
        self.names_request(rank, NameReply::PmixOp(p.reply), op);
    }

    /// A PMIx client's `PMIx_Lookup` (`PMIX_WAIT` without `PMIX_TIMEOUT` waits as long
    /// as the process and its job live).
    pub(super) fn pmix_lookup(&mut self, l: px::Lookup) {
        let Some(rank) = l.requester.rank else {
            return l.reply.fail(px::Failure::Invalid);
        };
        let range = match range_of(l.range) {
            Ok(r) => r,
            Err(f) => return l.reply.fail(f),
        };
        let wait_ms = l.wait.then(|| {
            l.timeout.map_or(u64::MAX, |t| {
                u64::try_from(t.as_millis()).unwrap_or(u64::MAX)
            })
        });
        let op = NameOp::Lookup {
            range,
            keys: l.keys,
            wait_ms,
        };
        self.names_request(rank, NameReply::PmixLookup(l.reply), op);
    }

    /// A PMIx client's `PMIx_Unpublish`.
    pub(super) fn pmix_unpublish(&mut self, u: px::Unpublish) {
        let Some(rank) = u.requester.rank else {
            return u.reply.fail(px::Failure::Invalid);
        };
        let range = match range_of(u.range) {
            Ok(r) => r,
            Err(f) => return u.reply.fail(f),
        };
        let op = NameOp::Unpublish {
            range,
            keys: u.keys,
        };
        self.names_request(rank, NameReply::PmixOp(u.reply), op);
    }
}

/// The reach of a PMIx range (`None`: not given, the session). A custom or
/// process-local range is not served.
fn range_of(r: Option<px::Range>) -> Result<NameRange, px::Failure> {
    Ok(match r.map(px::Range::raw) {
        None | Some(0 | 4) => NameRange::Session,
        // The resource manager's range, and global.
        Some(1 | 5) => NameRange::Global,
        Some(2) => NameRange::Node,
        Some(3) => NameRange::Namespace,
        Some(_) => return Err(px::Failure::NotSupported),
    })
}

/// A found name as the PMIx library hands it to the client.
fn found_of(p: Published) -> px::Found {
    px::Found {
        key: p.key,
        publisher: px::ProcName {
            nspace: p.nspace,
            rank: Some(p.owner.rank),
        },
        value: match p.value {
            NameValue::Str(s) => px::PubValue::Str(s),
            NameValue::Bytes(b) => px::PubValue::Bytes(b),
            NameValue::Pmix(b) => px::PubValue::Packed(b),
        },
    }
}

/// The PMIx status a name-service failure gives.
fn pmix_failure(f: &NameFailure) -> px::Failure {
    match f {
        NameFailure::NotFound(_) => px::Failure::NotFound,
        NameFailure::Duplicate(_) => px::Failure::Duplicate,
        NameFailure::Timeout(_) => px::Failure::Timeout,
        NameFailure::Invalid(_) => px::Failure::Invalid,
    }
}

#[cfg(test)]
mod tests;
