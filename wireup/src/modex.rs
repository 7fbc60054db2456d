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

use crate::client::keys;
use crate::proto::{ModexData, PeerMsg, WireError};
use crate::value::{Scope, Value};
use crate::Rank;

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
    Peer { node: u32, msg: PeerMsg },
    /// Call [`Modex::get_timeout`] with these after `ms` milliseconds.
    GetTimer {
        rank: Rank,
        conn: ConnId,
        req: u64,
        ms: u64,
    },
}

/// The datastore marker of another node's rank: the generation of the copy on this node
/// and the generation this node knows its owner reached. The copy is fresh while the
/// first is at least the second.
pub(crate) fn encode_marker(gen: u64, want: u64) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&gen.to_le_bytes());
    m[8..].copy_from_slice(&want.to_le_bytes());
    m
}

/// Reads a marker written by [`encode_marker`]: `Some(fresh)`, `None` when malformed.
pub(crate) fn marker_fresh(m: &[u8]) -> Option<bool> {
    let gen = u64::from_le_bytes(m.get(..8)?.try_into().ok()?);
    let want = u64::from_le_bytes(m.get(8..16)?.try_into().ok()?);
    Some(gen >= want)
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
            if scope.visible_on_node() {
                out.push(Action::Store {
                    key: keys::data(rank, &key),
                    value: postcard::to_stdvec(&value).expect("encode a value"),
                });
            }
            l.data.insert(key, (scope, value));
        }
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
        let l = &self.locals[&rank];
        let ready: Vec<u64> = self
            .serving
            .iter()
            .filter(|(_, s)| s.rank == rank && l.data.contains_key(&s.key))
            .map(|(&q, _)| q)
            .collect();
        if !ready.is_empty() {
            let data = self.data_of(rank);
            for qid in ready {
                let s = self.serving.remove(&qid).expect("listed");
                out.push(resp(s.from, qid, rank, Ok(data.clone())));
            }
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
            return vec![reply(Answer::Missing(format!(
                "it runs on node {} and a local-only get does not ask there",
                self.owner(rank)
            )))];
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
                    msg: PeerMsg::ModexReq {
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
        let Some(l) = self.locals.get(&rank) else {
            let error = WireError::Invalid {
                op: "get".into(),
                reason: format!("rank {rank} does not run on node {}", self.node),
            };
            return vec![resp(from, qid, rank, Err(error))];
        };
        if l.data.contains_key(&key) || !wait {
            return vec![resp(from, qid, rank, Ok(self.data_of(rank)))];
        }
        match &l.end {
            Some(e) if e.finalized => vec![resp(from, qid, rank, Ok(self.data_of(rank)))],
            Some(e) => {
                let error = gone_error(rank, &key, &e.reason);
                vec![resp(from, qid, rank, Err(error))]
            }
            None => {
                self.serving.insert(qid, Serve { from, rank, key });
                Vec::new()
            }
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
                for (k, v) in &e {
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
        let mut out = Vec::new();
        let Some(l) = self.locals.get_mut(&rank) else {
            return out;
        };
        if l.end.is_some() {
            return out;
        }
        let end = End {
            finalized,
            reason: reason.to_owned(),
        };
        l.end = Some(end.clone());
        for w in self.waiting.remove(&rank).unwrap_or_default() {
            out.push(Action::Reply {
                conn: w.conn,
                req: w.req,
                answer: gone_answer(rank, &w.key, &end),
            });
        }
        let waiting: Vec<u64> = self
            .serving
            .iter()
            .filter(|(_, s)| s.rank == rank)
            .map(|(&q, _)| q)
            .collect();
        for qid in waiting {
            let s = self.serving.remove(&qid).expect("listed");
            let result = if finalized {
                Ok(self.data_of(rank))
            } else {
                Err(gone_error(rank, &s.key, reason))
            };
            out.push(resp(s.from, qid, rank, result));
        }
        out
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
                msg: PeerMsg::ModexCancel { qid },
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
        msg: PeerMsg::ModexResp { qid, rank, result },
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
mod tests {
    use super::*;

    /// Two servers' states for ranks 0, 1 on node 0 and 2, 3 on node 1.
    fn pair() -> (Modex, Modex) {
        let owners = vec![0, 0, 1, 1];
        (Modex::new(0, owners.clone()), Modex::new(1, owners))
    }

    fn put(key: &str, v: u64) -> Vec<(Scope, String, Value)> {
        vec![(Scope::Global, key.to_owned(), Value::U64(v))]
    }

    fn replies(acts: &[Action]) -> Vec<(ConnId, u64, Answer)> {
        acts.iter()
            .filter_map(|a| match a {
                Action::Reply { conn, req, answer } => Some((*conn, *req, answer.clone())),
                _ => None,
            })
            .collect()
    }

    /// Delivers the peer messages of `acts` to `to` (the server of the other node) and
    /// returns what it did.
    fn deliver(acts: &[Action], to: &mut Modex) -> Vec<Action> {
        let mut out = Vec::new();
        for a in acts {
            if let Action::Peer { node, msg } = a {
                assert_eq!(*node, to.node, "a message for another node");
                out.extend(match msg.clone() {
                    PeerMsg::ModexReq {
                        qid,
                        rank,
                        key,
                        wait,
                    } => to.serve(qid, rank, key, wait),
                    PeerMsg::ModexResp { qid, rank, result } => to.answer(qid, rank, result),
                    PeerMsg::ModexCancel { qid } => {
                        to.cancel(qid);
                        Vec::new()
                    }
                    other => panic!("unexpected {other:?}"),
                });
            }
        }
        out
    }

    fn marker_of(acts: &[Action], rank: Rank) -> Option<bool> {
        acts.iter().rev().find_map(|a| match a {
            Action::Store { key, value } if key[..] == keys::complete(rank)[..] => {
                marker_fresh(value)
            }
            _ => None,
        })
    }

    #[test]
    fn a_remote_get_waits_for_the_key_and_is_answered_at_commit() {
        let (mut n0, mut n1) = pair();
        n1.commit(2, put("early", 1));
        let ask = n0.get(7, 1, 2, "late".into(), GetFlags::default(), None);
        assert!(replies(&ask).is_empty());
        let served = deliver(&ask, &mut n1);
        assert!(
            served.is_empty(),
            "the owner must wait for the key: {served:?}"
        );
        let commit = n1.commit(2, put("late", 5));
        let got = deliver(&commit, &mut n0);
        assert_eq!(replies(&got), vec![(7, 1, Answer::Value(Value::U64(5)))]);
        // The answer filled the node's cache and marked it fresh.
        assert_eq!(marker_of(&got, 2), Some(true));
    }

    #[test]
    fn an_immediate_get_does_not_wait() {
        let (mut n0, mut n1) = pair();
        n1.commit(2, put("a", 1));
        let flags = GetFlags {
            immediate: true,
            ..GetFlags::default()
        };
        let ask = n0.get(1, 1, 2, "b".into(), flags, None);
        let got = deliver(&deliver(&ask, &mut n1), &mut n0);
        assert!(matches!(&replies(&got)[0].2, Answer::Missing(r) if r.contains("not committed")));
        // Locally too.
        let got = n1.get(1, 2, 3, "b".into(), flags, None);
        assert!(matches!(&replies(&got)[0].2, Answer::Missing(_)));
    }

    #[test]
    fn a_fence_marks_an_older_copy_stale_and_the_next_get_sees_the_new_commit() {
        let (mut n0, mut n1) = pair();
        n1.commit(2, put("k1", 1));
        let ask = n0.get(1, 1, 2, "k1".into(), GetFlags::default(), None);
        let got = deliver(&deliver(&ask, &mut n1), &mut n0);
        assert_eq!(replies(&got)[0].2, Answer::Value(Value::U64(1)));
        // Rank 2 commits k2 and k1 again, then fences (Sparse: generations only).
        n1.commit(2, vec![(Scope::Remote, "k1".into(), Value::U64(10))]);
        n1.commit(2, put("k2", 2));
        let learned = n0.learn(2, n1.gen(2), None);
        assert_eq!(
            marker_of(&learned, 2),
            Some(false),
            "the copy must turn stale"
        );
        // The re-put key comes back new: the cached k1 is not used.
        let ask = n0.get(1, 2, 2, "k1".into(), GetFlags::default(), None);
        assert!(replies(&ask).is_empty(), "a stale copy must not answer");
        let got = deliver(&deliver(&ask, &mut n1), &mut n0);
        assert_eq!(replies(&got)[0].2, Answer::Value(Value::U64(10)));
        assert_eq!(marker_of(&got, 2), Some(true));
        // Fresh again, with the new key: answered from the cache.
        let cached = n0.get(1, 3, 2, "k2".into(), GetFlags::default(), None);
        assert_eq!(replies(&cached)[0].2, Answer::Value(Value::U64(2)));
    }

    #[test]
    fn a_get_does_not_join_a_request_sent_before_a_fence() {
        let (mut n0, mut n1) = pair();
        n1.commit(2, put("k", 1));
        // A first get's request is in flight (not yet served) when a fence shows that
        // rank 2 committed again.
        let first = n0.get(1, 1, 2, "k".into(), GetFlags::default(), None);
        n1.commit(2, put("k", 2));
        n0.learn(2, n1.gen(2), None);
        let second = n0.get(1, 2, 2, "k".into(), GetFlags::default(), None);
        assert!(
            second.iter().any(|a| matches!(a, Action::Peer { .. })),
            "the second get needs its own request"
        );
        let got = deliver(&deliver(&second, &mut n1), &mut n0);
        assert_eq!(replies(&got), vec![(1, 2, Answer::Value(Value::U64(2)))]);
        let got = deliver(&deliver(&first, &mut n1), &mut n0);
        assert_eq!(replies(&got).len(), 1);
    }

    #[test]
    fn concurrent_gets_of_one_key_share_one_request() {
        let (mut n0, mut n1) = pair();
        let a = n0.get(1, 1, 3, "k".into(), GetFlags::default(), None);
        let b = n0.get(2, 1, 3, "k".into(), GetFlags::default(), None);
        assert!(
            b.is_empty(),
            "the second get joins the first's request: {b:?}"
        );
        deliver(&a, &mut n1);
        let got = deliver(&n1.commit(3, put("k", 9)), &mut n0);
        assert_eq!(replies(&got).len(), 2);
    }

    #[test]
    fn an_owner_that_finalizes_or_dies_ends_the_waiting_gets() {
        let (mut n0, mut n1) = pair();
        let a = n0.get(1, 1, 2, "never".into(), GetFlags::default(), None);
        let b = n0.get(1, 2, 3, "never".into(), GetFlags::default(), None);
        deliver(&a, &mut n1);
        deliver(&b, &mut n1);
        let local = n1.get(5, 1, 2, "never".into(), GetFlags::default(), None);
        assert!(local.is_empty());
        let fin = n1.ended(2, true, "has finalized");
        assert!(matches!(&replies(&fin)[0].2, Answer::Missing(r) if r.contains("finalized")));
        let got = deliver(&fin, &mut n0);
        assert!(matches!(&replies(&got)[0].2, Answer::Missing(r) if r.contains("finalized")));
        let died = n1.ended(3, false, "exited with code 3");
        let got = deliver(&died, &mut n0);
        match &replies(&got)[0].2 {
            Answer::Failed(WireError::ProcGone {
                rank: 3, reason, ..
            }) => {
                assert!(reason.contains("exited with code 3"), "{reason}")
            }
            other => panic!("expected ProcGone, got {other:?}"),
        }
        // Later gets of the ended ranks do not wait either.
        let late = deliver(
            &n0.get(1, 3, 3, "never".into(), GetFlags::default(), None),
            &mut n1,
        );
        assert_eq!(late.len(), 1);
    }

    #[test]
    fn a_timed_out_get_cancels_its_request_at_the_owner() {
        let (mut n0, mut n1) = pair();
        let ask = n0.get(1, 1, 2, "k".into(), GetFlags::default(), Some(50));
        assert!(ask
            .iter()
            .any(|a| matches!(a, Action::GetTimer { ms: 50, .. })));
        deliver(&ask, &mut n1);
        assert_eq!(n1.serving.len(), 1);
        let t = n0.get_timeout(2, 1, 1);
        assert!(matches!(
            &replies(&t)[0].2,
            Answer::Failed(WireError::Timeout { missing, .. }) if missing == &vec![2]
        ));
        deliver(&t, &mut n1);
        assert!(
            n1.serving.is_empty(),
            "the owner must drop the cancelled request"
        );
        // A timer that fires after the answer does nothing.
        assert!(n0.get_timeout(2, 1, 1).is_empty());
    }

    #[test]
    fn scopes_decide_what_a_get_sees_and_a_hidden_key_does_not_wait() {
        let (mut n0, mut n1) = pair();
        n1.commit(2, vec![(Scope::Local, "l".into(), Value::U64(1))]);
        n1.commit(2, vec![(Scope::Remote, "r".into(), Value::U64(2))]);
        let got = n1.get(1, 1, 2, "r".into(), GetFlags::default(), None);
        assert!(matches!(&replies(&got)[0].2, Answer::Missing(r) if r.contains("Remote")));
        let got = n1.get(1, 2, 2, "l".into(), GetFlags::default(), None);
        assert_eq!(replies(&got)[0].2, Answer::Value(Value::U64(1)));
        let ask = n0.get(1, 1, 2, "l".into(), GetFlags::default(), None);
        let got = deliver(&deliver(&ask, &mut n1), &mut n0);
        assert!(matches!(&replies(&got)[0].2, Answer::Missing(r) if r.contains("Local")));
    }

    #[test]
    fn a_lost_node_fails_the_gets_waiting_on_it() {
        let (mut n0, _n1) = pair();
        n0.get(1, 1, 2, "k".into(), GetFlags::default(), None);
        let got = n0.node_lost(1, "is unreachable");
        assert!(matches!(
            &replies(&got)[0].2,
            Answer::Failed(WireError::ProcGone { rank: 2, .. })
        ));
    }

    #[test]
    fn local_only_never_asks_another_node() {
        let (mut n0, _n1) = pair();
        let got = n0.get(
            1,
            1,
            2,
            "k".into(),
            GetFlags {
                local_only: true,
                ..GetFlags::default()
            },
            None,
        );
        assert_eq!(got.len(), 1);
        assert!(matches!(&replies(&got)[0].2, Answer::Missing(_)));
    }

    /// Random operations on two servers' states, messages between them delivered in any
    /// order: no panic, no get answered twice, every value answered was committed with a
    /// scope the asker may see, and once every rank has ended and every message is
    /// delivered, every get whose connection stayed open has its one answer.
    /// The fuzz's gets: (node, conn, req) -> (rank, key, answers, connection closed).
    type Gets = std::collections::BTreeMap<(usize, ConnId, u64), (Rank, String, u32, bool)>;

    #[test]
    fn fuzz_random_operations_answer_every_get_once() {
        let mut gets_total = 0u64;
        crate::fuzz::tests::run("modex", 3, |m| {
            let (a, b) = pair();
            let mut nodes = [a, b];
            let node_of = |r: Rank| (r / 2) as usize;
            let keys = ["a", "b", "c"];
            let mut flight: Vec<(usize, PeerMsg)> = Vec::new();
            // (node, conn, req) -> (rank, key, answers, abandoned)
            let mut gets = Gets::new();
            let mut values: Vec<(Rank, String, Scope, Value)> = Vec::new();
            let mut ended = [false; 4];
            let mut next_req = 1u64;
            let apply = |node: usize,
                         acts: Vec<Action>,
                         flight: &mut Vec<(usize, PeerMsg)>,
                         gets: &mut Gets,
                         values: &Vec<(Rank, String, Scope, Value)>| {
                for act in acts {
                    match act {
                        Action::Reply { conn, req, answer } => {
                            let g = gets
                                .get_mut(&(node, conn, req))
                                .expect("a reply to a get that was made");
                            g.2 += 1;
                            assert_eq!(g.2, 1, "get {req} of conn {conn} answered twice");
                            if let Answer::Value(v) = answer {
                                let on_node = node_of(g.0) == node;
                                assert!(
                                    values.iter().any(|(r, k, sc, val)| *r == g.0
                                        && *k == g.1
                                        && *val == v
                                        && if on_node {
                                            sc.visible_on_node()
                                        } else {
                                            sc.visible_off_node()
                                        }),
                                    "{v:?} for {}/{} was never committed visibly",
                                    g.0,
                                    g.1
                                );
                            }
                        }
                        Action::Peer { node: to, msg } => flight.push((to as usize, msg)),
                        Action::Store { .. } | Action::GetTimer { .. } => {}
                    }
                }
            };
            let deliver = |nodes: &mut [Modex; 2], to: usize, msg: PeerMsg| -> Vec<Action> {
                match msg {
                    PeerMsg::ModexReq {
                        qid,
                        rank,
                        key,
                        wait,
                    } => nodes[to].serve(qid, rank, key, wait),
                    PeerMsg::ModexResp { qid, rank, result } => nodes[to].answer(qid, rank, result),
                    PeerMsg::ModexCancel { qid } => {
                        nodes[to].cancel(qid);
                        Vec::new()
                    }
                    other => panic!("unexpected {other:?}"),
                }
            };
            for _ in 0..1 + m.below(80) {
                let node = m.below(2);
                match m.below(9) {
                    0 | 1 => {
                        let (conn, req) = (1 + m.below(3) as ConnId, next_req);
                        next_req += 1;
                        let rank = m.below(4) as Rank;
                        let key = keys[m.below(3)].to_owned();
                        let flags = GetFlags {
                            refresh: m.below(4) == 0,
                            local_only: m.below(8) == 0,
                            immediate: m.below(4) == 0,
                        };
                        gets.insert((node, conn, req), (rank, key.clone(), 0, false));
                        gets_total += 1;
                        let acts = nodes[node].get(conn, req, rank, key, flags, Some(10));
                        apply(node, acts, &mut flight, &mut gets, &values);
                    }
                    2 | 3 => {
                        let rank = (node * 2 + m.below(2)) as Rank;
                        if ended[rank as usize] {
                            continue;
                        }
                        let scope = [Scope::Local, Scope::Remote, Scope::Global][m.below(3)];
                        let key = keys[m.below(3)].to_owned();
                        let v = Value::U64(m.below(5) as u64);
                        values.push((rank, key.clone(), scope, v.clone()));
                        let acts = nodes[node].commit(rank, vec![(scope, key, v)]);
                        apply(node, acts, &mut flight, &mut gets, &values);
                    }
                    4 => {
                        // A fence: each node learns the other's generations (and data, Full).
                        let full = m.below(2) == 0;
                        for r in 0..4 {
                            let owner = node_of(r);
                            let gen = nodes[owner].gen(r);
                            let data = full.then(|| nodes[owner].view(r));
                            let acts = nodes[1 - owner].learn(r, gen, data);
                            apply(1 - owner, acts, &mut flight, &mut gets, &values);
                        }
                    }
                    5 | 6 if !flight.is_empty() => {
                        let (to, msg) = flight.swap_remove(m.below(flight.len()));
                        let acts = deliver(&mut nodes, to, msg);
                        apply(to, acts, &mut flight, &mut gets, &values);
                    }
                    7 => {
                        let open: Vec<(usize, ConnId, u64, Rank)> = gets
                            .iter()
                            .filter(|(_, g)| g.2 == 0 && !g.3)
                            .map(|(&(n, c, r), g)| (n, c, r, g.0))
                            .collect();
                        if let Some(&(n, c, r, rank)) = open.get(m.below(open.len().max(1))) {
                            let acts = nodes[n].get_timeout(rank, c, r);
                            apply(n, acts, &mut flight, &mut gets, &values);
                        } else if m.below(2) == 0 {
                            let conn = 1 + m.below(3) as ConnId;
                            for ((n, c, _), g) in gets.iter_mut() {
                                if *n == node && *c == conn && g.2 == 0 {
                                    g.3 = true;
                                }
                            }
                            let acts = nodes[node].conn_closed(conn);
                            apply(node, acts, &mut flight, &mut gets, &values);
                        }
                    }
                    _ => {
                        let rank = (node * 2 + m.below(2)) as Rank;
                        if !ended[rank as usize] {
                            ended[rank as usize] = true;
                            let acts = nodes[node].ended(rank, m.below(2) == 0, "died");
                            apply(node, acts, &mut flight, &mut gets, &values);
                        }
                    }
                }
            }
            // Everyone ends; every message arrives.
            for r in 0..4u32 {
                if !ended[r as usize] {
                    let n = node_of(r);
                    let acts = nodes[n].ended(r, true, "has finalized");
                    apply(n, acts, &mut flight, &mut gets, &values);
                }
            }
            while let Some((to, msg)) = flight.pop() {
                let acts = deliver(&mut nodes, to, msg);
                apply(to, acts, &mut flight, &mut gets, &values);
            }
            for ((n, c, r), g) in &gets {
                assert!(
                    g.3 || g.2 == 1,
                    "get {r} of conn {c} on node {n} ({}/{}) was never answered",
                    g.0,
                    g.1
                );
            }
            for n in &nodes {
                assert!(
                    n.serving.is_empty() && n.waiting.is_empty(),
                    "requests left waiting"
                );
            }
        });
        println!("fuzz modex: {gets_total} gets");
    }
}
