//! The data concern of a server, without IO: what the node's processes committed, the
//! node's cache of other nodes' data, gets that wait for a key, and other nodes' direct
//! modex requests waiting for a local key. Every method returns the [`Action`]s the
//! server carries out (replies, datastore writes, peer messages, timers), so the state
//! machine is tested without sockets (see the tests at the end).
//!
//! The rules it keeps:
//! - A get waits until the owner commits the key, and fails only when the owner can no
//!   longer commit it (finalized: `Missing`; died: `ProcGone`), or on its timeout. An
//!   `immediate` get answers with what the owner has committed now.
//! - Each commit of a process bumps its generation. Fences and group constructs carry the
//!   generation of every participant, so after a fence a node knows which cached copies
//!   of other nodes' data are older than what their owners committed before the fence,
//!   and marks them stale in the datastore: the next get fetches them again.

use std::collections::HashMap;

use crate::wire::proto::{JobMsg, ModexData, WireError};
use weft_wireup::keys;
use weft_wireup::marker::{encode_marker, local_only_reason};
use weft_wireup::{Rank, Scope, Value};

/// Keys only the server reads (the PMIx front end's packed fence and group data, under
/// `pmix/`): kept in the data concern, not written to the node's datastore, which no
/// process reads them from (a fence's blob is 32 KiB per process in the PMIx benchmark).
fn server_only(key: &str) -> bool {
    key.starts_with("pmix/")
}

/// A client connection of the server.
pub(crate) type ConnId = u64;

/// What a get asks for besides its key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GetFlags {
    /// Ignore the node's cached copy of another node's data.
    pub(crate) refresh: bool,
    /// Never ask another node.
    pub(crate) local_only: bool,
    /// Do not wait for the key: answer with what the owner has committed now.
    pub(crate) immediate: bool,
}

/// How a get ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// The value.
    Value(Value),
    /// The key is not there and will not be for this get: why.
    Missing(String),
    /// The get failed (owner gone, timeout, ...).
    Failed(WireError),
}

/// What the server must do.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Answer a client's get.
    Reply {
        conn: ConnId,
        req: u64,
        answer: Answer,
    },
    /// Write into the node's datastore segment.
    Store { key: Vec<u8>, value: Vec<u8> },
    /// Send to the server of `node`.
    Peer { node: u32, msg: JobMsg },
    /// Call [`Modex::get_timeout`] with these after `ms` milliseconds.
    GetTimer {
        rank: Rank,
        conn: ConnId,
        req: u64,
        ms: u64,
    },
}

/// How a local process ended.
#[derive(Debug, Clone)]
struct End {
    finalized: bool,
    reason: String,
}

#[derive(Debug, Default)]
struct LocalData {
    /// How many commits the server has applied.
    gen: u64,
    data: HashMap<String, (Scope, Value)>,
    end: Option<End>,
}

#[derive(Debug, Default)]
struct Cache {
    /// The generation of `entries`.
    gen: u64,
    /// The owner's generation as of the last fence this node completed with it.
    want: u64,
    /// The owner's Remote/Global data, once fetched or gathered.
    entries: Option<HashMap<String, Value>>,
}

#[derive(Debug)]
struct Waiter {
    conn: ConnId,
    req: u64,
    key: String,
}

/// A request out to the server of a rank's node.
#[derive(Debug)]
struct Ask {
    rank: Rank,
    key: String,
    wait: bool,
    /// The rank's `want` when the request was sent: gets that need no more may join it.
    sent_want: u64,
    waiters: Vec<(ConnId, u64)>,
}

/// Another node's request waiting for a local key.
#[derive(Debug)]
struct Serve {
    from: u32,
    rank: Rank,
    key: String,
}

/// The data concern of one server.
#[derive(Debug)]
pub(crate) struct Modex {
    node: u32,
    /// The node of every rank of the job.
    owners: Vec<u32>,
    locals: HashMap<Rank, LocalData>,
    remote: HashMap<Rank, Cache>,
    /// Local gets waiting for a local rank's key.
    waiting: HashMap<Rank, Vec<Waiter>>,
    asks: HashMap<u64, Ask>,
    /// Asks that later gets may join: (rank, key, wait) -> qid.
    pending: HashMap<(Rank, String, bool), u64>,
    serving: HashMap<u64, Serve>,
    next_qid: u64,
}

impl Modex {
    /// The state of the server of `node`; `owners[r]` is the node of rank `r`.
    pub(crate) fn new(node: u32, owners: Vec<u32>) -> Modex {
        let locals = owners
            .iter()
            .enumerate()
            .filter(|(_, &n)| n == node)
            .map(|(r, _)| (r as Rank, LocalData::default()))
            .collect();
        Modex {
            node,
            owners,
            locals,
            remote: HashMap::new(),
            waiting: HashMap::new(),
            asks: HashMap::new(),
            pending: HashMap::new(),
            serving: HashMap::new(),
            // Query ids carry the asking node in their top 16 bits (the owner answers
            // there); bit 47 keeps them apart from the server's other query ids.
            next_qid: (u64::from(node) << 48) | (1 << 47) | 1,
        }
    }

    /// The node a query id came from.
    pub(crate) fn asker_of(qid: u64) -> u32 {
        (qid >> 48) as u32
    }

    fn owner(&self, rank: Rank) -> u32 {
        self.owners.get(rank as usize).copied().unwrap_or(u32::MAX)
    }

    /// The generation of local rank `rank` (0 before its first commit).
    pub(crate) fn gen(&self, rank: Rank) -> u64 {
        self.locals.get(&rank).map_or(0, |l| l.gen)
    }

    /// What other nodes may see of local rank `rank`: its Remote/Global data.
    pub(crate) fn view(&self, rank: Rank) -> Vec<(String, Value)> {
        self.locals
            .get(&rank)
            .map(|l| {
                l.data
                    .iter()
                    .filter(|(_, (s, _))| s.visible_off_node())
                    .map(|(k, (_, v))| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The value of `key` of `rank` held here: committed by a local rank, or in the
    /// cache of another node's data.
    pub(crate) fn value(&self, rank: Rank, key: &str) -> Option<&Value> {
        match self.locals.get(&rank) {
            Some(l) => l.data.get(key).map(|(_, v)| v),
            None => self.remote.get(&rank)?.entries.as_ref()?.get(key),
        }
    }

    fn data_of(&self, rank: Rank) -> ModexData {
        let l = self.locals.get(&rank);
        ModexData {
            gen: l.map_or(0, |l| l.gen),
            entries: self.view(rank),
            finalized: l.and_then(|l| l.end.as_ref()).is_some_and(|e| e.finalized),
        }
    }

    /// Applies a commit of local rank `rank` and answers whoever waited for its keys.
    pub(crate) fn commit(
        &mut self,
        rank: Rank,
        entries: Vec<(Scope, String, Value)>,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(l) = self.locals.get_mut(&rank) else {
            return out;
        };
        l.gen += 1;
        for (scope, key, value) in entries {
            if scope.visible_on_node() && !server_only(&key) {
                out.push(Action::Store {
                    key: keys::data(rank, &key),
                    value: postcard::to_stdvec(&value).expect("encode a value"),
                });
            }
            l.data.insert(key, (scope, value));
        }
        out.extend(self.release(rank));
        out
    }

    /// After a commit or the end of local rank `rank`: answers the local gets and other
    /// nodes' requests waiting for it whose answer is now known; the rest keep waiting.
    /// The one place waiters are answered late, by the rules a request that arrives now
    /// is answered with ([`Modex::local_answer`], [`Modex::served`]).
    fn release(&mut self, rank: Rank) -> Vec<Action> {
        let mut out = Vec::new();
        if let Some(ws) = self.waiting.remove(&rank) {
            let mut still = Vec::new();
            for w in ws {
                match self.local_answer(rank, &w.key) {
                    Some(answer) => out.push(Action::Reply {
                        conn: w.conn,
                        req: w.req,
                        answer,
                    }),
                    None => still.push(w),
                }
            }
            if !still.is_empty() {
                self.waiting.insert(rank, still);
            }
        }
        let ready: Vec<(u64, Result<ModexData, WireError>)> = self
            .serving
            .iter()
            .filter(|(_, s)| s.rank == rank)
            .filter_map(|(&q, s)| Some((q, self.served(rank, &s.key, true)?)))
            .collect();
        for (qid, result) in ready {
            let s = self.serving.remove(&qid).expect("listed");
            out.push(resp(s.from, qid, rank, result));
        }
        out
    }

    /// The answer a local get of `key` gets now, if it need not wait.
    fn local_answer(&self, rank: Rank, key: &str) -> Option<Answer> {
        let l = self.locals.get(&rank)?;
        match l.data.get(key) {
            Some((s, v)) if s.visible_on_node() => Some(Answer::Value(v.clone())),
            Some((s, _)) => Some(Answer::Missing(format!(
                "it put the key with scope {s:?}, which is not visible on its own node"
            ))),
            None => l.end.as_ref().map(|e| gone_answer(rank, key, e)),
        }
    }

    /// A client's get of `key` of `rank`.
    pub(crate) fn get(
        &mut self,
        conn: ConnId,
        req: u64,
        rank: Rank,
        key: String,
        flags: GetFlags,
        timeout_ms: Option<u64>,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        let reply = |answer| Action::Reply { conn, req, answer };
        let timer = |ms| Action::GetTimer {
            rank,
            conn,
            req,
            ms,
        };
        if self.locals.contains_key(&rank) {
            if let Some(a) = self.local_answer(rank, &key) {
                return vec![reply(a)];
            }
            if flags.immediate {
                return vec![reply(Answer::Missing("it has not committed it".into()))];
            }
            self.waiting
                .entry(rank)
                .or_default()
                .push(Waiter { conn, req, key });
            return timeout_ms.map(timer).into_iter().collect();
        }
        let cache = self.remote.get(&rank);
        let want = cache.map_or(0, |c| c.want);
        if !flags.refresh {
            if let Some(c) = cache {
                let usable = c.gen >= c.want || flags.local_only;
                if let Some(v) = c
                    .entries
                    .as_ref()
                    .filter(|_| usable)
                    .and_then(|e| e.get(&key))
                {
                    return vec![reply(Answer::Value(v.clone()))];
                }
            }
        }
        if flags.local_only {
            return vec![reply(Answer::Missing(local_only_reason(self.owner(rank))))];
        }
        let wait = !flags.immediate;
        let joinable = (!flags.refresh)
            .then(|| self.pending.get(&(rank, key.clone(), wait)).copied())
            .flatten()
            .filter(|q| self.asks.get(q).is_some_and(|a| a.sent_want >= want));
        match joinable {
            Some(qid) => self
                .asks
                .get_mut(&qid)
                .expect("joinable")
                .waiters
                .push((conn, req)),
            None => {
                let qid = self.next_qid;
                self.next_qid += 1;
                if !flags.refresh {
                    self.pending.insert((rank, key.clone(), wait), qid);
                }
                out.push(Action::Peer {
                    node: self.owner(rank),
                    msg: JobMsg::ModexReq {
                        qid,
                        rank,
                        key: key.clone(),
                        wait,
                    },
                });
                self.asks.insert(
                    qid,
                    Ask {
                        rank,
                        key,
                        wait,
                        sent_want: want,
                        waiters: vec![(conn, req)],
                    },
                );
            }
        }
        out.extend(timeout_ms.map(timer));
        out
    }

    /// Another node's request for `key` of local rank `rank`.
    pub(crate) fn serve(&mut self, qid: u64, rank: Rank, key: String, wait: bool) -> Vec<Action> {
        let from = Self::asker_of(qid);
        if !self.locals.contains_key(&rank) {
            let error = WireError::Invalid {
                op: "get".into(),
                reason: format!("rank {rank} does not run on node {}", self.node),
            };
            return vec![resp(from, qid, rank, Err(error))];
        }
        match self.served(rank, &key, wait) {
            Some(result) => vec![resp(from, qid, rank, result)],
            None => {
                self.serving.insert(qid, Serve { from, rank, key });
                Vec::new()
            }
        }
    }

    /// What the owner answers another node's request for `key` of local rank `rank`
    /// now, or `None` while the request waits (the key may still be committed).
    fn served(&self, rank: Rank, key: &str, wait: bool) -> Option<Result<ModexData, WireError>> {
        let l = self.locals.get(&rank)?;
        if l.data.contains_key(key) || !wait {
            return Some(Ok(self.data_of(rank)));
        }
        match &l.end {
            Some(e) if e.finalized => Some(Ok(self.data_of(rank))),
            Some(e) => Some(Err(gone_error(rank, key, &e.reason))),
            None => None,
        }
    }

    /// The asker gave up on request `qid` (every get that waited on it timed out).
    pub(crate) fn cancel(&mut self, qid: u64) {
        self.serving.remove(&qid);
    }

    /// The owner's answer to request `qid`.
    pub(crate) fn answer(
        &mut self,
        qid: u64,
        rank: Rank,
        result: Result<ModexData, WireError>,
    ) -> Vec<Action> {
        let Some(ask) = self.asks.remove(&qid).filter(|a| a.rank == rank) else {
            return Vec::new();
        };
        self.unpend(qid, &ask);
        let mut out = Vec::new();
        match result {
            Ok(data) => {
                let answer = match data.entries.iter().find(|(k, _)| *k == ask.key) {
                    Some((_, v)) => Answer::Value(v.clone()),
                    None if data.finalized => {
                        Answer::Missing("it finalized without committing it".into())
                    }
                    None if !ask.wait => Answer::Missing("it has not committed it".into()),
                    None => Answer::Missing(
                        "it put the key with scope Local, which is not visible on other nodes"
                            .into(),
                    ),
                };
                out.extend(replies_to(ask.waiters, answer));
                out.extend(self.learn(rank, data.gen, Some(data.entries)));
            }
            Err(error) => out.extend(replies_to(ask.waiters, Answer::Failed(error))),
        }
        out
    }

    fn unpend(&mut self, qid: u64, ask: &Ask) {
        let k = (ask.rank, ask.key.clone(), ask.wait);
        if self.pending.get(&k) == Some(&qid) {
            self.pending.remove(&k);
        }
    }

    /// What a fence or group construct taught this node of rank `rank`: its generation
    /// when it joined, and its data when the collective carried it.
    pub(crate) fn learn(
        &mut self,
        rank: Rank,
        gen: u64,
        entries: Option<Vec<(String, Value)>>,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        if self.locals.contains_key(&rank) {
            return out;
        }
        let c = self.remote.entry(rank).or_default();
        c.want = c.want.max(gen);
        match entries {
            Some(e) if c.entries.is_none() || gen > c.gen => {
                for (k, v) in e.iter().filter(|(k, _)| !server_only(k)) {
                    out.push(Action::Store {
                        key: keys::data(rank, k),
                        value: postcard::to_stdvec(v).expect("encode a value"),
                    });
                }
                c.gen = gen;
                c.entries = Some(e.into_iter().collect());
            }
            // The copy here is as new as the owner was at the collective: nothing to do
            // unless the collective raised `want` past it.
            _ if c.entries.is_none() => return out,
            _ => {}
        }
        out.push(Action::Store {
            key: keys::complete(rank).to_vec(),
            value: encode_marker(c.gen, c.want).to_vec(),
        });
        out
    }

    /// Local rank `rank` ended (finalized, or died with `reason`): gets waiting for keys
    /// it never committed end now.
    pub(crate) fn ended(&mut self, rank: Rank, finalized: bool, reason: &str) -> Vec<Action> {
        let Some(l) = self.locals.get_mut(&rank).filter(|l| l.end.is_none()) else {
            return Vec::new();
        };
        l.end = Some(End {
            finalized,
            reason: reason.to_owned(),
        });
        self.release(rank)
    }

    /// The server of `node` is lost: requests to it fail, its requests are dropped.
    pub(crate) fn node_lost(&mut self, node: u32, reason: &str) -> Vec<Action> {
        self.serving.retain(|_, s| s.from != node);
        let lost: Vec<u64> = self
            .asks
            .iter()
            .filter(|(_, a)| self.owners.get(a.rank as usize) == Some(&node))
            .map(|(&q, _)| q)
            .collect();
        let mut out = Vec::new();
        for qid in lost {
            let ask = self.asks.remove(&qid).expect("listed");
            self.unpend(qid, &ask);
            let error = WireError::ProcGone {
                op: "get".into(),
                rank: ask.rank,
                reason: reason.to_owned(),
            };
            out.extend(replies_to(ask.waiters, Answer::Failed(error)));
        }
        out
    }

    /// The timeout of get `req` of `conn` for a key of `rank` expired.
    pub(crate) fn get_timeout(&mut self, rank: Rank, conn: ConnId, req: u64) -> Vec<Action> {
        let (removed, mut out) = self.remove_waiter(|c, r| c == conn && r == req);
        if removed {
            let answer = Answer::Failed(WireError::Timeout {
                op: "get".into(),
                missing: vec![rank],
            });
            out.push(Action::Reply { conn, req, answer });
        }
        out
    }

    /// Client connection `conn` closed: forget its gets.
    pub(crate) fn conn_closed(&mut self, conn: ConnId) -> Vec<Action> {
        self.remove_waiter(|c, _| c == conn).1
    }

    /// Removes the waiting gets `which` selects; asks left without waiters are
    /// cancelled at their owner. Returns whether any was removed, and the cancels.
    fn remove_waiter(&mut self, which: impl Fn(ConnId, u64) -> bool) -> (bool, Vec<Action>) {
        let mut removed = false;
        for ws in self.waiting.values_mut() {
            let before = ws.len();
            ws.retain(|w| !which(w.conn, w.req));
            removed |= ws.len() != before;
        }
        self.waiting.retain(|_, ws| !ws.is_empty());
        let mut emptied = Vec::new();
        for (&qid, a) in &mut self.asks {
            let before = a.waiters.len();
            a.waiters.retain(|&(c, r)| !which(c, r));
            removed |= a.waiters.len() != before;
            if a.waiters.is_empty() {
                emptied.push(qid);
            }
        }
        let mut out = Vec::new();
        for qid in emptied {
            let ask = self.asks.remove(&qid).expect("listed");
            self.unpend(qid, &ask);
            out.push(Action::Peer {
                node: self.owner(ask.rank),
                msg: JobMsg::ModexCancel { qid },
            });
        }
        (removed, out)
    }
}

/// The same answer to each of `waiters`.
fn replies_to(waiters: Vec<(ConnId, u64)>, answer: Answer) -> impl Iterator<Item = Action> {
    waiters.into_iter().map(move |(conn, req)| Action::Reply {
        conn,
        req,
        answer: answer.clone(),
    })
}

fn resp(node: u32, qid: u64, rank: Rank, result: Result<ModexData, WireError>) -> Action {
    Action::Peer {
        node,
        msg: JobMsg::ModexResp { qid, rank, result },
    }
}

fn gone_error(rank: Rank, key: &str, reason: &str) -> WireError {
    WireError::ProcGone {
        op: "get".into(),
        rank,
        reason: format!("{reason} before committing {key:?}"),
    }
}

fn gone_answer(rank: Rank, key: &str, end: &End) -> Answer {
    if end.finalized {
        Answer::Missing("it finalized without committing it".into())
    } else {
        Answer::Failed(gone_error(rank, key, &end.reason))
    }
}

#[cfg(test)]
mod tests;
