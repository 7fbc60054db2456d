//! Tests of the data state machine: two servers' states side by side, messages between
//! them delivered by hand, and a fuzz target of random operations and orders.

use super::*;
use weft_wireup::marker::marker_fresh;

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
                JobMsg::ModexReq {
                    qid,
                    rank,
                    key,
                    wait,
                } => to.serve(qid, rank, key, wait),
                JobMsg::ModexResp { qid, rank, result } => to.answer(qid, rank, result),
                JobMsg::ModexCancel { qid } => {
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
        Action::Store { key, value } if key[..] == keys::complete(rank)[..] => marker_fresh(value),
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
    weft_fuzz::run("modex", 3, |m| {
        let (a, b) = pair();
        let mut nodes = [a, b];
        let node_of = |r: Rank| (r / 2) as usize;
        let keys = ["a", "b", "c"];
        let mut flight: Vec<(usize, JobMsg)> = Vec::new();
        // (node, conn, req) -> (rank, key, answers, abandoned)
        let mut gets = Gets::new();
        let mut values: Vec<(Rank, String, Scope, Value)> = Vec::new();
        let mut ended = [false; 4];
        let mut next_req = 1u64;
        let apply = |node: usize,
                     acts: Vec<Action>,
                     flight: &mut Vec<(usize, JobMsg)>,
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
        let deliver = |nodes: &mut [Modex; 2], to: usize, msg: JobMsg| -> Vec<Action> {
            match msg {
                JobMsg::ModexReq {
                    qid,
                    rank,
                    key,
                    wait,
                } => nodes[to].serve(qid, rank, key, wait),
                JobMsg::ModexResp { qid, rank, result } => nodes[to].answer(qid, rank, result),
                JobMsg::ModexCancel { qid } => {
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

#[test]
fn server_only_keys_stay_out_of_the_datastore_but_are_held_and_learned() {
    let (mut a, _) = pair();
    let stores = |acts: &[Action]| {
        acts.iter()
            .filter(|x| matches!(x, Action::Store { .. }))
            .count()
    };
    // A PMIx fence blob: kept, not written to the node's segment.
    let acts = a.commit(0, put("pmix/fence", 7));
    assert_eq!(stores(&acts), 0);
    assert_eq!(a.value(0, "pmix/fence"), Some(&Value::U64(7)));
    // An ordinary key is written.
    assert_eq!(stores(&a.commit(0, put("card", 1))), 1);
    // Learned from another node (a Full fence's data): held, only the card stored.
    let entries = vec![
        ("pmix/fence".to_string(), Value::U64(9)),
        ("card".to_string(), Value::U64(2)),
    ];
    let acts = a.learn(2, 1, Some(entries));
    assert_eq!(
        stores(&acts),
        2,
        "the card and the completeness marker: {acts:?}"
    );
    assert_eq!(a.value(2, "pmix/fence"), Some(&Value::U64(9)));
}

/// The replies of `acts` to connection `conn`.
fn replies_to_conn(acts: &[Action], conn: ConnId) -> Vec<(u64, Answer)> {
    replies(acts)
        .into_iter()
        .filter(|r| r.0 == conn)
        .map(|(_, req, a)| (req, a))
        .collect()
}

fn peer_msgs(acts: &[Action]) -> Vec<&JobMsg> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Peer { msg, .. } => Some(msg),
            _ => None,
        })
        .collect()
}

#[test]
fn a_local_get_waits_for_the_key_and_is_answered_once_at_commit() {
    let (_, mut n1) = pair();
    let wait = n1.get(5, 1, 2, "card".into(), GetFlags::default(), Some(1000));
    assert!(replies(&wait).is_empty(), "no answer before the commit");
    // Another key's commit does not answer it.
    assert!(replies(&n1.commit(2, put("other", 1))).is_empty());
    let got = n1.commit(2, put("card", 42));
    assert_eq!(replies(&got), vec![(5, 1, Answer::Value(Value::U64(42)))]);
    // Its timer firing later answers nothing: the get was answered once.
    assert!(n1.get_timeout(2, 5, 1).is_empty());
    assert!(n1.waiting.is_empty());
}

#[test]
fn a_committed_card_never_reads_as_missing() {
    let (mut n0, mut n1) = pair();
    n1.commit(2, put("card", 7));
    let card = Answer::Value(Value::U64(7));
    let immediate = GetFlags {
        immediate: true,
        ..GetFlags::default()
    };
    let refresh = GetFlags {
        refresh: true,
        ..GetFlags::default()
    };
    // On its node, waiting or not.
    for (req, flags) in [(1, GetFlags::default()), (2, immediate)] {
        let got = n1.get(1, req, 2, "card".into(), flags, Some(10));
        assert_eq!(replies(&got), vec![(1, req, card.clone())], "{flags:?}");
    }
    // From the other node, waiting or not, fresh or not.
    for (req, flags) in [(1, GetFlags::default()), (2, immediate), (3, refresh)] {
        let ask = n0.get(1, req, 2, "card".into(), flags, Some(10));
        let got = deliver(&deliver(&ask, &mut n1), &mut n0);
        assert_eq!(
            replies_to_conn(&ask, 1)
                .into_iter()
                .chain(replies_to_conn(&got, 1))
                .collect::<Vec<_>>(),
            vec![(req, card.clone())],
            "{flags:?}"
        );
    }
    // Once its owner has ended, finalized or not, the card still reads as committed.
    n1.commit(3, put("card", 8));
    n1.ended(2, true, "has finalized");
    n1.ended(3, false, "exited with code 1");
    for (rank, v) in [(2, 7), (3, 8)] {
        let got = n1.get(1, 9, rank, "card".into(), GetFlags::default(), None);
        assert_eq!(replies(&got), vec![(1, 9, Answer::Value(Value::U64(v)))]);
        let ask = n0.get(2, 9, rank, "card".into(), refresh, None);
        let got = deliver(&deliver(&ask, &mut n1), &mut n0);
        assert_eq!(replies(&got), vec![(2, 9, Answer::Value(Value::U64(v)))]);
    }
}

#[test]
fn a_get_of_a_key_never_committed_fails_only_at_its_timeout_or_the_owners_end() {
    let (mut n0, mut n1) = pair();
    let local = n1.get(1, 1, 2, "card".into(), GetFlags::default(), Some(50));
    assert!(matches!(
        local[..],
        [Action::GetTimer {
            rank: 2,
            conn: 1,
            req: 1,
            ms: 50
        }]
    ));
    let remote = n0.get(1, 1, 2, "card".into(), GetFlags::default(), Some(50));
    assert!(deliver(&remote, &mut n1).is_empty());
    // Commits of other keys, and a fence, answer neither.
    let other = n1.commit(2, put("other", 1));
    assert!(replies(&other).is_empty());
    assert!(replies(&deliver(&other, &mut n0)).is_empty());
    assert!(replies(&n0.learn(2, n1.gen(2), None)).is_empty());
    // The timeout answers each once, with the rank that did not commit.
    for n in [&mut n1, &mut n0] {
        let t = n.get_timeout(2, 1, 1);
        assert!(
            matches!(
                &replies(&t)[..],
                [(1, 1, Answer::Failed(WireError::Timeout { missing, .. }))] if missing == &vec![2]
            ),
            "{t:?}"
        );
    }
    // Rank 3 is still running: a get of its key waits (never Missing); when it dies
    // without committing, the get fails with the reason, and is not Missing either.
    assert!(replies(&n1.get(1, 2, 3, "card".into(), GetFlags::default(), None)).is_empty());
    let died = n1.ended(3, false, "exited with code 3");
    assert!(matches!(
        &replies(&died)[..],
        [(1, 2, Answer::Failed(WireError::ProcGone { rank: 3, .. }))]
    ));
}

#[test]
fn a_cancelled_wait_is_not_answered() {
    let (mut n0, mut n1) = pair();
    // Locally: a get whose timeout fired.
    n1.get(1, 1, 2, "card".into(), GetFlags::default(), Some(10));
    n1.get_timeout(2, 1, 1);
    // Remotely: the asker's timeout cancels the request at the owner.
    let ask = n0.get(1, 2, 2, "card".into(), GetFlags::default(), Some(10));
    deliver(&ask, &mut n1);
    let t = n0.get_timeout(2, 1, 2);
    assert!(matches!(peer_msgs(&t)[..], [JobMsg::ModexCancel { .. }]));
    deliver(&t, &mut n1);
    let commit = n1.commit(2, put("card", 1));
    assert!(replies(&commit).is_empty(), "{commit:?}");
    assert!(
        peer_msgs(&commit).is_empty(),
        "a cancelled request is answered: {commit:?}"
    );
}

#[test]
fn a_closed_connections_waits_are_dropped_and_the_others_answered() {
    let (mut n0, mut n1) = pair();
    // Local: conns 1 and 2 wait for the same key; conn 1 closes.
    n1.get(1, 1, 2, "card".into(), GetFlags::default(), None);
    n1.get(2, 1, 2, "card".into(), GetFlags::default(), None);
    assert!(n1.conn_closed(1).is_empty());
    // Remote: conns 1 and 2 share one request; conn 1 closing does not cancel it.
    let ask = n0.get(1, 2, 2, "card".into(), GetFlags::default(), None);
    n0.get(2, 2, 2, "card".into(), GetFlags::default(), None);
    deliver(&ask, &mut n1);
    let closed = n0.conn_closed(1);
    assert!(closed.is_empty(), "conn 2 still waits: {closed:?}");
    let commit = n1.commit(2, put("card", 5));
    assert_eq!(replies(&commit), vec![(2, 1, Answer::Value(Value::U64(5)))]);
    let got = deliver(&commit, &mut n0);
    assert_eq!(replies(&got), vec![(2, 2, Answer::Value(Value::U64(5)))]);
    // When the last waiter of a request closes, the owner forgets the request.
    let ask = n0.get(3, 3, 3, "card".into(), GetFlags::default(), None);
    deliver(&ask, &mut n1);
    assert_eq!(n1.serving.len(), 1);
    let closed = n0.conn_closed(3);
    assert!(matches!(
        peer_msgs(&closed)[..],
        [JobMsg::ModexCancel { .. }]
    ));
    deliver(&closed, &mut n1);
    assert!(n1.serving.is_empty());
    assert!(peer_msgs(&n1.commit(3, put("card", 6))).is_empty());
}
