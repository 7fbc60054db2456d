//! The fence concern driven through its `on_*` methods: no socket, task or timer. Two
//! (or, in the fuzz, three) servers' fences exchange the peer messages their actions
//! name by hand; time is an `Instant` the test moves.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::wire::proto::{
    CollId, CollKind, FenceMode, GroupBlock, GroupDirectives, GroupSpec, JobMsg, Procs, ServerMsg,
    WireError,
};
use weft_fuzz::{run, Mutator};
use weft_wireup::{Rank, Scope, Value};

use super::{Action, Arrival, Contrib, Fences, ARRIVAL_QUERY_WAIT};
use crate::modex::{ConnId, Modex};
use crate::server::pgcids::Pgcids;

/// One server's concerns that fences use: its fences, its data, its PGCIDs.
struct Server {
    fences: Fences,
    modex: Modex,
    pgcids: Pgcids,
}

impl Server {
    fn new(node: u32, owners: &[u32]) -> Server {
        Server {
            fences: Fences::new(node, owners.to_vec()),
            modex: Modex::new(node, owners.to_vec()),
            pgcids: Pgcids::new(0),
        }
    }

    fn arrive(&mut self, a: Arrival, now: Instant) -> Vec<Action> {
        let cx = Contrib {
            modex: &self.modex,
            pgcids: &mut self.pgcids,
        };
        self.fences.on_arrive(a, now, cx)
    }

    fn peer(&mut self, msg: JobMsg, now: Instant) -> Vec<Action> {
        let cx = Contrib {
            modex: &self.modex,
            pgcids: &mut self.pgcids,
        };
        self.fences.on_peer(msg, now, cx)
    }

    fn gone(
        &mut self,
        rank: Rank,
        reason: &str,
        joined: HashSet<u64>,
        now: Instant,
    ) -> Vec<Action> {
        let cx = Contrib {
            modex: &self.modex,
            pgcids: &mut self.pgcids,
        };
        self.fences.on_proc_gone(rank, reason, joined, now, cx)
    }

    fn deadline(&mut self, id: CollId, now: Instant) -> Vec<Action> {
        let cx = Contrib {
            modex: &self.modex,
            pgcids: &mut self.pgcids,
        };
        self.fences.on_deadline(id, now, cx)
    }
}

/// A 4-process job on 2 nodes: ranks 0 and 1 on node 0, 2 and 3 on node 1.
fn pair() -> [Server; 2] {
    let owners = [0, 0, 1, 1];
    [Server::new(0, &owners), Server::new(1, &owners)]
}

fn fence_id(seq: u64) -> CollId {
    CollId {
        kind: CollKind::Fence,
        procs: Procs::All,
        seq,
        name: String::new(),
    }
}

/// Rank `rank` joins `id` as request `req` of connection `10 + rank`.
fn arrival(rank: Rank, req: u64, id: &CollId, mode: FenceMode) -> Arrival {
    Arrival {
        rank,
        conn: 10 + u64::from(rank),
        req,
        id: id.clone(),
        mode,
        timeout_ms: None,
        group: None,
    }
}

/// The replies among `acts`, as (connection, message).
fn replies(acts: &[Action]) -> Vec<(ConnId, ServerMsg)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Reply { conn, msg } => Some((*conn, msg.clone())),
            _ => None,
        })
        .collect()
}

/// The peer messages among `acts`, as (node, message).
fn sent(acts: &[Action]) -> Vec<(u32, JobMsg)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Peer { node, msg } => Some((*node, msg.clone())),
            _ => None,
        })
        .collect()
}

/// Delivers the peer messages among `acts` (from either server) until none is left;
/// returns every other action, with the server it came from.
fn settle(
    servers: &mut [Server; 2],
    first: Vec<(u32, Action)>,
    now: Instant,
) -> Vec<(u32, Action)> {
    let mut queue: VecDeque<(u32, Action)> = first.into();
    let mut rest = Vec::new();
    while let Some((from, a)) = queue.pop_front() {
        match a {
            Action::Peer { node, msg } => {
                assert_ne!(node, from, "a server sent itself {msg:?}");
                let acts = servers[node as usize].peer(msg, now);
                queue.extend(acts.into_iter().map(|a| (node, a)));
            }
            other => rest.push((from, other)),
        }
    }
    rest
}

fn from(node: u32, acts: Vec<Action>) -> Vec<(u32, Action)> {
    acts.into_iter().map(|a| (node, a)).collect()
}

fn done_reqs(acts: &[(u32, Action)]) -> BTreeSet<(ConnId, u64)> {
    acts.iter()
        .filter_map(|(_, a)| match a {
            Action::Reply {
                conn,
                msg: ServerMsg::Done { req },
            } => Some((*conn, *req)),
            Action::Reply { msg, .. } => panic!("expected Done, got {msg:?}"),
            _ => None,
        })
        .collect()
}

#[test]
fn a_fence_completes_once_every_node_contributed_and_carries_the_data() {
    let [mut s0, mut s1] = pair();
    let now = Instant::now();
    s1.modex
        .commit(2, vec![(Scope::Global, "card".into(), Value::U64(22))]);
    let id = fence_id(1);
    let a = s0.arrive(arrival(0, 1, &id, FenceMode::Full), now);
    assert!(a.is_empty(), "node 0 must wait for rank 1: {a:?}");
    let a = s1.arrive(arrival(2, 2, &id, FenceMode::Full), now);
    assert!(a.is_empty(), "node 1 must wait for rank 3: {a:?}");
    let a0 = s0.arrive(arrival(1, 3, &id, FenceMode::Full), now);
    assert!(matches!(
        &sent(&a0)[..],
        [(1, JobMsg::Gather { step: 0, .. })]
    ));
    let a1 = s1.arrive(arrival(3, 4, &id, FenceMode::Full), now);
    let mut servers = [s0, s1];
    let mut first = from(0, a0);
    first.extend(from(1, a1));
    let rest = settle(&mut servers, first, now);
    let want: BTreeSet<_> = [(10, 1), (11, 3), (12, 2), (13, 4)].into();
    assert_eq!(done_reqs(&rest), want, "each member released once");
    // Node 0 learned rank 2's card (and generation) from node 1's block.
    let learned: Vec<_> = rest
        .iter()
        .filter_map(|(n, a)| match a {
            Action::Learn(d) if *n == 0 => Some(d.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(learned.len(), 1, "{rest:?}");
    let rank2 = learned[0]
        .iter()
        .find(|p| p.0 == 2)
        .expect("rank 2's block");
    assert_eq!(rank2.1, 1, "rank 2's generation");
    assert_eq!(rank2.2, Some(vec![("card".to_owned(), Value::U64(22))]));
    assert_eq!(servers[0].fences.in_progress(), 0);
    assert_eq!(servers[1].fences.in_progress(), 0);
}

#[test]
fn a_duplicate_arrival_and_bad_participants_are_refused() {
    let [mut s0, _] = pair();
    let now = Instant::now();
    let id = fence_id(1);
    assert!(s0
        .arrive(arrival(0, 1, &id, FenceMode::Full), now)
        .is_empty());
    let got = replies(&s0.arrive(arrival(0, 2, &id, FenceMode::Full), now));
    match &got[..] {
        [(
            10,
            ServerMsg::Failed {
                req: 2,
                error: WireError::Invalid { reason, .. },
            },
        )] => {
            assert!(reason.contains("joined it twice"), "{reason}")
        }
        other => panic!("expected the duplicate refused, got {other:?}"),
    }
    for (procs, why) in [
        (Procs::List(vec![1, 0]), "not sorted and distinct"),
        (Procs::List(vec![0, 9]), "outside the job"),
        (Procs::List(vec![1, 2]), "not among the participants"),
    ] {
        let bad = CollId {
            procs,
            ..fence_id(2)
        };
        let got = replies(&s0.arrive(arrival(0, 3, &bad, FenceMode::Full), now));
        match &got[..] {
            [(
                10,
                ServerMsg::Failed {
                    req: 3,
                    error: WireError::Invalid { reason, .. },
                },
            )] => {
                assert!(reason.contains(why), "{reason}")
            }
            other => panic!("expected {why:?}, got {other:?}"),
        }
    }
    assert_eq!(s0.fences.in_progress(), 1, "only the valid fence is held");
}

#[test]
fn a_member_that_dies_before_joining_fails_the_fence_for_every_member() {
    let [mut s0, _] = pair();
    let now = Instant::now();
    let id = fence_id(1);
    assert!(s0
        .arrive(arrival(0, 1, &id, FenceMode::SyncOnly), now)
        .is_empty());
    let reason = "exited with code 3 before finalize";
    let acts = s0.gone(2, reason, HashSet::new(), now);
    let is_gone = |got: &[(ConnId, ServerMsg)], conn: ConnId, want: u64| match got {
        [(
            c,
            ServerMsg::Failed {
                req,
                error:
                    WireError::ProcGone {
                        op,
                        rank: 2,
                        reason: why,
                    },
            },
        )] => *c == conn && *req == want && op == "fence" && why == reason,
        _ => false,
    };
    assert!(is_gone(&replies(&acts), 10, 1), "{acts:?}");
    assert!(
        sent(&acts).is_empty(),
        "every server learns of the death itself"
    );
    // A member arriving later learns the same failure.
    let acts = s0.arrive(arrival(1, 5, &id, FenceMode::SyncOnly), now);
    assert!(is_gone(&replies(&acts), 11, 5), "{acts:?}");
    // And a fence started after the death fails at the first arrival.
    let acts = s0.arrive(arrival(0, 6, &fence_id(2), FenceMode::SyncOnly), now);
    assert!(is_gone(&replies(&acts), 10, 6), "{acts:?}");
    // A second report of the same death changes nothing.
    assert!(s0.gone(2, "again", HashSet::new(), now).is_empty());
}

#[test]
fn a_member_that_dies_after_joining_does_not_fail_the_fence() {
    let [mut s0, mut s1] = pair();
    let now = Instant::now();
    let id = fence_id(1);
    assert!(s1
        .arrive(arrival(2, 1, &id, FenceMode::SyncOnly), now)
        .is_empty());
    // Rank 2 joined at node 1, then died: its node tells the others what it joined.
    let joined: HashSet<u64> = s1.fences.joined(2).into_iter().collect();
    assert!(joined.contains(&id.digest()));
    assert!(s0
        .gone(2, "killed by signal 9", joined.clone(), now)
        .is_empty());
    assert!(s1.gone(2, "killed by signal 9", joined, now).is_empty());
    let mut first = from(0, s0.arrive(arrival(0, 2, &id, FenceMode::SyncOnly), now));
    first.extend(from(
        0,
        s0.arrive(arrival(1, 3, &id, FenceMode::SyncOnly), now),
    ));
    first.extend(from(
        1,
        s1.arrive(arrival(3, 4, &id, FenceMode::SyncOnly), now),
    ));
    let rest = settle(&mut [s0, s1], first, now);
    let want: BTreeSet<_> = [(10, 2), (11, 3), (12, 1), (13, 4)].into();
    assert_eq!(done_reqs(&rest), want);
}

#[test]
fn a_timeout_names_the_missing_members_everywhere() {
    let [mut s0, mut s1] = pair();
    let t0 = Instant::now();
    let id = fence_id(1);
    let a = Arrival {
        timeout_ms: Some(100),
        ..arrival(0, 1, &id, FenceMode::Full)
    };
    let acts = s0.arrive(a, t0);
    let at = t0 + Duration::from_millis(100);
    assert!(
        matches!(&acts[..], [Action::Deadline { id: i, at: a }] if *i == id && *a == at),
        "{acts:?}"
    );
    // A deadline timer that fires early (a later arrival armed an earlier one) is ignored.
    assert!(s0
        .deadline(id.clone(), t0 + Duration::from_millis(50))
        .is_empty());
    let acts = s0.deadline(id.clone(), at);
    let qid = match &acts[..] {
        [Action::Peer {
            node: 1,
            msg: JobMsg::ArrivalQuery { qid, .. },
        }, Action::QueryTimer { qid: q2, after }]
            if q2 == qid && *after == ARRIVAL_QUERY_WAIT =>
        {
            *qid
        }
        other => panic!("expected an arrival query to node 1, got {other:?}"),
    };
    // Node 1 has not heard of the fence: all its participants are missing.
    let reply = s1.peer(
        JobMsg::ArrivalQuery {
            id: id.clone(),
            qid,
        },
        at,
    );
    let acts = settle(&mut [s0, s1], from(1, reply), at);
    let got: Vec<_> = acts
        .iter()
        .filter_map(|(n, a)| match a {
            Action::Reply { conn, msg } => Some((*n, *conn, msg.clone())),
            _ => None,
        })
        .collect();
    match &got[..] {
        [(
            0,
            10,
            ServerMsg::Failed {
                req: 1,
                error: WireError::Timeout { op, missing },
            },
        )] => {
            assert_eq!(op, "fence");
            assert_eq!(missing, &vec![1, 2, 3]);
        }
        other => panic!("expected rank 0's fence to time out, got {other:?}"),
    }
}

#[test]
fn a_timeout_with_nobody_missing_lets_the_fence_finish() {
    let [mut s0, mut s1] = pair();
    let t0 = Instant::now();
    let id = fence_id(1);
    let timed = |rank, req| Arrival {
        timeout_ms: Some(10),
        ..arrival(rank, req, &id, FenceMode::SyncOnly)
    };
    let mut held = from(0, s0.arrive(timed(0, 1), t0));
    held.extend(from(0, s0.arrive(timed(1, 2), t0)));
    held.extend(from(1, s1.arrive(timed(2, 3), t0)));
    held.extend(from(1, s1.arrive(timed(3, 4), t0)));
    // Every member arrived, but the gathers are still in flight when node 0's deadline
    // passes: node 1 says nobody is missing, and the fence is let finish.
    let at = t0 + Duration::from_millis(10);
    let acts = s0.deadline(id.clone(), at);
    let mut servers = [s0, s1];
    let rest = settle(&mut servers, from(0, acts), at);
    assert!(done_reqs(&rest).is_empty());
    let queries: Vec<u64> = rest
        .iter()
        .filter_map(|(_, a)| match a {
            Action::QueryTimer { qid, .. } => Some(*qid),
            _ => None,
        })
        .collect();
    assert_eq!(queries.len(), 1);
    let rest = settle(&mut servers, held, at);
    let want: BTreeSet<_> = [(10, 1), (11, 2), (12, 3), (13, 4)].into();
    assert_eq!(done_reqs(&rest), want);
    // The query's timer, fired after, finds nothing to fail.
    assert!(servers[0].fences.on_query_timeout(queries[0]).is_empty());
}

#[test]
fn an_unanswered_arrival_query_counts_the_silent_nodes_participants_missing() {
    let [mut s0, _] = pair();
    let t0 = Instant::now();
    let id = fence_id(1);
    let a = Arrival {
        timeout_ms: Some(1),
        ..arrival(0, 1, &id, FenceMode::SyncOnly)
    };
    s0.arrive(a, t0);
    let acts = s0.deadline(id.clone(), t0 + Duration::from_millis(1));
    let Some(qid) = acts.iter().find_map(|a| match a {
        Action::QueryTimer { qid, .. } => Some(*qid),
        _ => None,
    }) else {
        panic!("no query timer in {acts:?}");
    };
    let acts = s0.fences.on_query_timeout(qid);
    match &replies(&acts)[..] {
        [(
            10,
            ServerMsg::Failed {
                req: 1,
                error: WireError::Timeout { missing, .. },
            },
        )] => {
            assert_eq!(missing, &vec![1, 2, 3])
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    // Node 1 is told to abort its part.
    assert!(matches!(&sent(&acts)[..], [(1, JobMsg::Abort { .. })]));
    // A member arriving after the failure gets the same error.
    let got = replies(&s0.arrive(arrival(1, 2, &id, FenceMode::SyncOnly), t0));
    assert!(
        matches!(
            &got[..],
            [(
                11,
                ServerMsg::Failed {
                    error: WireError::Timeout { .. },
                    ..
                }
            )]
        ),
        "{got:?}"
    );
}

#[test]
fn members_that_disagree_on_the_mode_fail_the_fence_on_every_node() {
    let [mut s0, mut s1] = pair();
    let now = Instant::now();
    let id = fence_id(1);
    s0.arrive(arrival(0, 1, &id, FenceMode::Full), now);
    // Two local members that disagree: failed here, and the other node is told.
    let acts = s0.arrive(arrival(1, 2, &id, FenceMode::SyncOnly), now);
    assert_eq!(replies(&acts).len(), 2, "{acts:?}");
    assert!(matches!(&sent(&acts)[..], [(1, JobMsg::Abort { .. })]));
    // Across nodes: node 1's gather in another mode than node 0's.
    let id = fence_id(2);
    s0.arrive(arrival(0, 3, &id, FenceMode::Full), now);
    let gather = s0.arrive(arrival(1, 4, &id, FenceMode::Full), now);
    s1.arrive(arrival(2, 5, &id, FenceMode::SyncOnly), now);
    let acts1 = s1.arrive(arrival(3, 6, &id, FenceMode::SyncOnly), now);
    let mut first = from(0, gather);
    first.extend(from(1, acts1));
    let rest = settle(&mut [s0, s1], first, now);
    let mut failed = BTreeSet::new();
    for (_, a) in &rest {
        if let Action::Reply {
            conn,
            msg:
                ServerMsg::Failed {
                    req,
                    error: WireError::Invalid { reason, .. },
                },
        } = a
        {
            assert!(reason.contains("different modes"), "{reason}");
            failed.insert((*conn, *req));
        } else if let Action::Reply { msg, .. } = a {
            panic!("expected only failures, got {msg:?}");
        }
    }
    assert_eq!(failed, [(10, 3), (11, 4), (12, 5), (13, 6)].into());
}

#[test]
fn a_gather_after_every_local_participant_died_without_joining_fails_at_once() {
    let [mut s0, mut s1] = pair();
    let now = Instant::now();
    let id = fence_id(1);
    // Node 1's ranks arrive before node 1 hears of any death: its gather leaves.
    s1.arrive(arrival(2, 1, &id, FenceMode::SyncOnly), now);
    let gather = s1.arrive(arrival(3, 2, &id, FenceMode::SyncOnly), now);
    let msg = match &sent(&gather)[..] {
        [(0, m @ JobMsg::Gather { .. })] => m.clone(),
        other => panic!("expected node 1's gather, got {other:?}"),
    };
    // Node 0's ranks die without joining, before the gather reaches it.
    s0.gone(0, "exited with code 1 before finalize", HashSet::new(), now);
    s0.gone(1, "was killed by SIGKILL", HashSet::new(), now);
    // The gather cannot complete here: no collective is left waiting.
    let acts = s0.peer(msg, now);
    assert!(acts.is_empty(), "{acts:?}");
    assert_eq!(
        s0.fences.in_progress(),
        0,
        "a collective that never completes"
    );
    // Node 1 hears of the first death: its members are told.
    let acts = s1.gone(0, "exited with code 1 before finalize", HashSet::new(), now);
    let failed: Vec<(ConnId, ServerMsg)> = replies(&acts);
    assert_eq!(failed.len(), 2, "{failed:?}");
    for (_, m) in failed {
        assert!(
            matches!(
                m,
                ServerMsg::Failed {
                    error: WireError::ProcGone { rank: 0, .. },
                    ..
                }
            ),
            "{m:?}"
        );
    }
}

#[test]
fn a_tolerant_group_goes_on_without_a_member_that_died_before_joining() {
    let [mut s0, _] = pair();
    let now = Instant::now();
    let id = CollId {
        kind: CollKind::GroupConstruct,
        procs: Procs::List(vec![0, 1]),
        seq: 0,
        name: "g".into(),
    };
    let spec = GroupSpec {
        directives: GroupDirectives {
            notify_termination: true,
            assign_context_id: true,
            ..GroupDirectives::default()
        },
        timeout_ms: None,
    };
    let a = Arrival {
        group: Some(spec.clone()),
        ..arrival(0, 1, &id, FenceMode::Full)
    };
    assert!(s0.arrive(a, now).is_empty());
    assert!(s0.fences.construct_in_progress(&CollId {
        seq: 1,
        ..id.clone()
    }));
    // Rank 1 dies without joining: the group forms with rank 0 alone, and node 0 (the
    // root server) hands out its PGCID in its block.
    let acts = s0.gone(1, "exited with code 1 before finalize", HashSet::new(), now);
    match &acts[..] {
        [Action::GroupGathered { id: got, gathered }] => {
            assert_eq!(got, &id);
            assert_eq!(gathered.waiters, vec![(10, 1)]);
            let block: GroupBlock =
                postcard::from_bytes(&gathered.blocks[&0]).expect("node 0's block");
            assert_eq!(block.joined, vec![0]);
            assert_eq!(block.pgcid, Some(1));
        }
        other => panic!("expected the group gathered, got {other:?}"),
    }
    // The groups concern answers, then the fences remember: a late member is told.
    s0.fences.finish(id.clone(), None);
    let a = Arrival {
        group: Some(spec),
        ..arrival(1, 2, &id, FenceMode::Full)
    };
    let got = replies(&s0.arrive(a, now));
    assert!(
        matches!(&got[..], [(11, ServerMsg::Failed { error: WireError::Invalid { reason, .. }, .. })] if reason.contains("already completed")),
        "{got:?}"
    );
}

/// What the fuzz knows of one request: its fence and the answers it got.
struct Asked {
    fence: u64,
    timed: bool,
    answers: Vec<ServerMsg>,
}

/// Random arrivals, deaths (before and after joining), deadlines, query timeouts and
/// message orders among three servers. Then every live member joins every fence it has
/// not and everything is delivered: every request is answered exactly once, and the
/// members of a fence without a deadline all agree on its outcome.
#[test]
fn fuzz_fences_answer_every_request_once_and_agree() {
    const NODES: u32 = 3;
    const FENCES: u64 = 4;
    let owners: Vec<u32> = vec![0, 0, 1, 1, 2, 2];
    let size = owners.len() as Rank;
    let mut total = 0usize;
    run("fences", 7, |m: &mut Mutator| {
        let mut servers: Vec<Server> = (0..NODES).map(|n| Server::new(n, &owners)).collect();
        let t0 = Instant::now();
        let mut now = t0;
        // Links between servers are FIFO, as TCP connections are.
        let mut links: BTreeMap<(u32, u32), VecDeque<JobMsg>> = BTreeMap::new();
        let mut gone_msgs: Vec<(u32, Rank, String, HashSet<u64>)> = Vec::new();
        let mut deadlines: Vec<(u32, CollId, Instant)> = Vec::new();
        let mut query_timers: Vec<(u32, u64)> = Vec::new();
        let mut asked: HashMap<(u32, ConnId, u64), Asked> = HashMap::new();
        let mut dead: BTreeSet<Rank> = BTreeSet::new();
        let mut arrived: BTreeSet<(Rank, u64)> = BTreeSet::new();
        let ids: Vec<CollId> = (0..FENCES)
            .map(|seq| {
                let procs = if m.below(2) == 0 {
                    Procs::All
                } else {
                    let v: Vec<Rank> = (0..size).filter(|_| m.below(3) != 0).collect();
                    if v.is_empty() {
                        Procs::All
                    } else {
                        Procs::List(v)
                    }
                };
                CollId {
                    kind: CollKind::Fence,
                    procs,
                    seq,
                    name: String::new(),
                }
            })
            .collect();
        let modes: Vec<FenceMode> = (0..FENCES)
            .map(|_| {
                if m.below(2) == 0 {
                    FenceMode::Full
                } else {
                    FenceMode::SyncOnly
                }
            })
            .collect();
        let timed: Vec<bool> = (0..FENCES).map(|_| m.below(3) == 0).collect();
        let mut next_req = 1u64;
        let exec = |node: u32,
                    acts: Vec<Action>,
                    links: &mut BTreeMap<(u32, u32), VecDeque<JobMsg>>,
                    deadlines: &mut Vec<(u32, CollId, Instant)>,
                    query_timers: &mut Vec<(u32, u64)>,
                    asked: &mut HashMap<(u32, ConnId, u64), Asked>| {
            for a in acts {
                match a {
                    Action::Reply { conn, msg } => {
                        let req = match &msg {
                            ServerMsg::Done { req } | ServerMsg::Failed { req, .. } => *req,
                            other => panic!("a fence answered {other:?}"),
                        };
                        let q = asked.get_mut(&(node, conn, req)).expect("a request asked");
                        q.answers.push(msg);
                    }
                    Action::Peer { node: to, msg } => {
                        assert_ne!(to, node);
                        links.entry((node, to)).or_default().push_back(msg);
                    }
                    Action::Deadline { id, at } => deadlines.push((node, id, at)),
                    Action::QueryTimer { qid, after } => {
                        assert_eq!(after, ARRIVAL_QUERY_WAIT);
                        query_timers.push((node, qid));
                    }
                    Action::Learn(_) => {}
                    Action::GroupGathered { .. } => panic!("no group in this fuzz"),
                }
            }
        };
        let arrive = |servers: &mut Vec<Server>,
                      rank: Rank,
                      f: u64,
                      req: u64,
                      now: Instant,
                      asked: &mut HashMap<(u32, ConnId, u64), Asked>| {
            let node = owners[rank as usize];
            let conn = 100 + u64::from(rank);
            asked.insert(
                (node, conn, req),
                Asked {
                    fence: f,
                    timed: timed[f as usize],
                    answers: Vec::new(),
                },
            );
            let a = Arrival {
                rank,
                conn,
                req,
                id: ids[f as usize].clone(),
                mode: modes[f as usize],
                timeout_ms: timed[f as usize].then_some(50),
                group: None,
            };
            (node, servers[node as usize].arrive(a, now))
        };
        for _ in 0..m.below(60) {
            match m.below(6) {
                0 | 1 => {
                    let rank = m.below(size as usize) as Rank;
                    let f = m.below(FENCES as usize) as u64;
                    if dead.contains(&rank)
                        || !ids[f as usize].procs.contains(rank)
                        || !arrived.insert((rank, f))
                    {
                        continue;
                    }
                    let (node, acts) = arrive(&mut servers, rank, f, next_req, now, &mut asked);
                    next_req += 1;
                    exec(
                        node,
                        acts,
                        &mut links,
                        &mut deadlines,
                        &mut query_timers,
                        &mut asked,
                    );
                }
                2 => {
                    // A rank dies: its server learns first, the others by message.
                    let rank = m.below(size as usize) as Rank;
                    if !dead.insert(rank) {
                        continue;
                    }
                    let node = owners[rank as usize];
                    let joined: HashSet<u64> = servers[node as usize]
                        .fences
                        .joined(rank)
                        .into_iter()
                        .collect();
                    let why = format!("rank {rank} died");
                    let acts = servers[node as usize].gone(rank, &why, joined.clone(), now);
                    exec(
                        node,
                        acts,
                        &mut links,
                        &mut deadlines,
                        &mut query_timers,
                        &mut asked,
                    );
                    for n in (0..NODES).filter(|&n| n != node) {
                        gone_msgs.push((n, rank, why.clone(), joined.clone()));
                    }
                }
                3 => {
                    let Some((b, msg)) = crate::server::test_links::pop_any(&mut links, m) else {
                        continue;
                    };
                    let acts = servers[b as usize].peer(msg, now);
                    exec(
                        b,
                        acts,
                        &mut links,
                        &mut deadlines,
                        &mut query_timers,
                        &mut asked,
                    );
                }
                4 if !gone_msgs.is_empty() => {
                    let (n, rank, why, joined) = gone_msgs.swap_remove(m.below(gone_msgs.len()));
                    let acts = servers[n as usize].gone(rank, &why, joined, now);
                    exec(
                        n,
                        acts,
                        &mut links,
                        &mut deadlines,
                        &mut query_timers,
                        &mut asked,
                    );
                }
                _ => {
                    // Time passes; a deadline or an arrival query's timer may fire.
                    now += Duration::from_millis(m.below(80) as u64);
                    if !deadlines.is_empty() && m.below(2) == 0 {
                        let (n, id, at) = deadlines.swap_remove(m.below(deadlines.len()));
                        now = now.max(at);
                        let acts = servers[n as usize].deadline(id, now);
                        exec(
                            n,
                            acts,
                            &mut links,
                            &mut deadlines,
                            &mut query_timers,
                            &mut asked,
                        );
                    } else if !query_timers.is_empty() {
                        let (n, qid) = query_timers.swap_remove(m.below(query_timers.len()));
                        let acts = servers[n as usize].fences.on_query_timeout(qid);
                        exec(
                            n,
                            acts,
                            &mut links,
                            &mut deadlines,
                            &mut query_timers,
                            &mut asked,
                        );
                    }
                }
            }
        }
        // The end: deaths reach every server, every live member joins what it has not,
        // then every message is delivered and every timer fires.
        for (n, rank, why, joined) in std::mem::take(&mut gone_msgs) {
            let acts = servers[n as usize].gone(rank, &why, joined, now);
            exec(
                n,
                acts,
                &mut links,
                &mut deadlines,
                &mut query_timers,
                &mut asked,
            );
        }
        for f in 0..FENCES {
            for rank in 0..size {
                if dead.contains(&rank)
                    || !ids[f as usize].procs.contains(rank)
                    || !arrived.insert((rank, f))
                {
                    continue;
                }
                let (node, acts) = arrive(&mut servers, rank, f, next_req, now, &mut asked);
                next_req += 1;
                exec(
                    node,
                    acts,
                    &mut links,
                    &mut deadlines,
                    &mut query_timers,
                    &mut asked,
                );
            }
        }
        loop {
            if let Some((&(a, b), _)) = links.iter().find(|(_, q)| !q.is_empty()) {
                let msg = links
                    .get_mut(&(a, b))
                    .and_then(|q| q.pop_front())
                    .expect("busy");
                let acts = servers[b as usize].peer(msg, now);
                exec(
                    b,
                    acts,
                    &mut links,
                    &mut deadlines,
                    &mut query_timers,
                    &mut asked,
                );
            } else if let Some((n, id, at)) = deadlines.pop() {
                now = now.max(at);
                let acts = servers[n as usize].deadline(id, now);
                exec(
                    n,
                    acts,
                    &mut links,
                    &mut deadlines,
                    &mut query_timers,
                    &mut asked,
                );
            } else if let Some((n, qid)) = query_timers.pop() {
                let acts = servers[n as usize].fences.on_query_timeout(qid);
                exec(
                    n,
                    acts,
                    &mut links,
                    &mut deadlines,
                    &mut query_timers,
                    &mut asked,
                );
            } else {
                break;
            }
        }
        let mut outcome: HashMap<u64, (usize, usize)> = HashMap::new();
        for ((node, conn, req), q) in &asked {
            assert_eq!(
                q.answers.len(),
                1,
                "request {req} of connection {conn} at node {node} (fence {}): {:?}",
                q.fence,
                q.answers
            );
            let o = outcome.entry(q.fence).or_default();
            match q.answers[0] {
                ServerMsg::Done { .. } => o.0 += 1,
                _ => o.1 += 1,
            }
            if !q.timed {
                let (ok, failed) = outcome[&q.fence];
                assert!(
                    ok == 0 || failed == 0,
                    "fence {} both completed and failed without a deadline",
                    q.fence
                );
            }
        }
        total += asked.len();
    });
    println!("fuzz fences: {total} requests");
}
