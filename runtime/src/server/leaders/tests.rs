//! The leader selection driven through its `on_*` methods: three servers exchange the
//! peer messages their actions name by hand.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::wire::proto::{JobMsg, ServerMsg, WireError};
use weft_fuzz::{run, Mutator};
use weft_wireup::Rank;

use super::{Action, Leaders};
use crate::modex::ConnId;

const NODES: u32 = 3;

/// The node of rank `r` (two ranks per node).
fn node_of(r: Rank) -> u32 {
    r / 2
}

/// Delivers a peer message to server `to`; `gone` as the root sees it.
fn deliver(s: &mut [Leaders], to: u32, msg: JobMsg, gone: &BTreeSet<Rank>) -> Vec<Action> {
    match msg {
        JobMsg::LeaderClaim {
            id,
            rank,
            from,
            nodes,
        } => {
            assert_eq!(to, 0, "claims go to the root server");
            s[0].on_decide(id, rank, from, nodes, |r| gone.contains(&r))
        }
        JobMsg::LeaderDecision {
            id,
            claimant,
            winner,
        } => s[to as usize].on_decision(id, claimant, winner),
        JobMsg::LeaderSelected { id, rank } => vec![Action::Selected { id, rank }],
        other => panic!("not a leader message: {other:?}"),
    }
}

/// Runs the actions of server `from` to the end: the replies and selections, by server.
fn settle(
    s: &mut [Leaders],
    from: u32,
    acts: Vec<Action>,
    gone: &BTreeSet<Rank>,
) -> Vec<(u32, Action)> {
    let mut queue: VecDeque<(u32, Action)> = acts.into_iter().map(|a| (from, a)).collect();
    let mut rest = Vec::new();
    while let Some((at, a)) = queue.pop_front() {
        match a {
            Action::Peer { node, msg } => {
                assert_ne!(node, at);
                queue.extend(deliver(s, node, msg, gone).into_iter().map(|a| (node, a)));
            }
            other => rest.push((at, other)),
        }
    }
    rest
}

fn servers() -> Vec<Leaders> {
    (0..NODES).map(Leaders::new).collect()
}

fn claim(s: &mut [Leaders], rank: Rank, req: u64, gone: &BTreeSet<Rank>) -> Vec<(u32, Action)> {
    let node = node_of(rank);
    let conn = 100 + ConnId::from(rank);
    let acts = s[node as usize].on_claim("g".into(), rank, (conn, req), vec![0, 1, 2], |r| {
        gone.contains(&r)
    });
    settle(s, node, acts, gone)
}

#[test]
fn the_first_claim_wins_and_every_node_with_members_is_told() {
    let mut s = servers();
    let gone = BTreeSet::new();
    let rest = claim(&mut s, 3, 1, &gone);
    let mut selected: Vec<u32> = Vec::new();
    let mut replies = Vec::new();
    for (at, a) in &rest {
        match a {
            Action::Selected { id, rank: 3 } if id == "g" => selected.push(*at),
            Action::Reply { conn, msg } => replies.push((*at, *conn, msg.clone())),
            other => panic!("unexpected {other:?}"),
        }
    }
    selected.sort_unstable();
    assert_eq!(selected, vec![0, 1, 2]);
    assert!(
        matches!(&replies[..], [(1, 103, ServerMsg::Done { req: 1 })]),
        "{replies:?}"
    );
    // A later claimant loses to the living leader, and nobody is told anything new.
    let rest = claim(&mut s, 4, 2, &gone);
    match &rest[..] {
        [(
            2,
            Action::Reply {
                conn: 104,
                msg:
                    ServerMsg::Failed {
                        req: 2,
                        error: WireError::Invalid { reason, .. },
                    },
            },
        )] => {
            assert!(reason.contains("rank 3 leads the group"), "{reason}")
        }
        other => panic!("expected the claim refused, got {other:?}"),
    }
    // The leader claiming again keeps it without a new announcement.
    let rest = claim(&mut s, 3, 3, &gone);
    assert!(
        matches!(
            &rest[..],
            [(
                1,
                Action::Reply {
                    msg: ServerMsg::Done { req: 3 },
                    ..
                }
            )]
        ),
        "{rest:?}"
    );
}

#[test]
fn a_claim_after_the_selected_leader_died_wins() {
    let mut s = servers();
    let mut gone = BTreeSet::new();
    claim(&mut s, 1, 1, &gone);
    gone.insert(1);
    let rest = claim(&mut s, 5, 2, &gone);
    let sel: Vec<_> = rest
        .iter()
        .filter(|(_, a)| matches!(a, Action::Selected { rank: 5, .. }))
        .collect();
    assert_eq!(sel.len(), 3, "{rest:?}");
    assert!(rest.iter().any(|(at, a)| *at == 2
        && matches!(
            a,
            Action::Reply {
                conn: 105,
                msg: ServerMsg::Done { req: 2 }
            }
        )));
}

/// Random claims from every node, deaths, and messages delivered in random order (each
/// link FIFO): every claim is answered once, won exactly when the decision names its
/// claimant, and every node's last selection is the root's.
#[test]
fn fuzz_leaders_each_claim_answered_once_and_every_node_ends_with_the_roots_choice() {
    run("leaders", 13, |m: &mut Mutator| {
        let mut s = servers();
        let mut gone: BTreeSet<Rank> = BTreeSet::new();
        let mut links: BTreeMap<(u32, u32), VecDeque<JobMsg>> = BTreeMap::new();
        let mut asked: HashMap<(ConnId, u64), Option<bool>> = HashMap::new();
        let mut last: HashMap<u32, Rank> = HashMap::new();
        let mut root_choice: Option<Rank> = None;
        let mut next_req = 1;
        let mut exec = |at: u32,
                        acts: Vec<Action>,
                        links: &mut BTreeMap<(u32, u32), VecDeque<JobMsg>>,
                        asked: &mut HashMap<(ConnId, u64), Option<bool>>| {
            for a in acts {
                match a {
                    Action::Peer { node, msg } => {
                        if let JobMsg::LeaderSelected { rank, .. } = &msg {
                            root_choice = Some(*rank);
                        }
                        links.entry((at, node)).or_default().push_back(msg)
                    }
                    Action::Selected { rank, .. } => {
                        if at == 0 {
                            root_choice = Some(rank);
                        }
                        last.insert(at, rank);
                    }
                    Action::Reply { conn, msg } => {
                        let (req, won) = match msg {
                            ServerMsg::Done { req } => (req, true),
                            ServerMsg::Failed { req, .. } => (req, false),
                            other => panic!("{other:?}"),
                        };
                        let a = asked.get_mut(&(conn, req)).expect("a claim");
                        assert!(a.is_none(), "claim {req} answered twice");
                        *a = Some(won);
                    }
                }
            }
        };
        for _ in 0..m.below(40) {
            match m.below(4) {
                0 | 1 => {
                    let rank = m.below(6) as Rank;
                    if gone.contains(&rank) {
                        continue;
                    }
                    let node = node_of(rank);
                    let conn = 100 + ConnId::from(rank);
                    asked.insert((conn, next_req), None);
                    let g = gone.clone();
                    let acts = s[node as usize].on_claim(
                        "g".into(),
                        rank,
                        (conn, next_req),
                        vec![0, 1, 2],
                        |r| g.contains(&r),
                    );
                    next_req += 1;
                    exec(node, acts, &mut links, &mut asked);
                }
                2 => {
                    gone.insert(m.below(6) as Rank);
                }
                _ => {
                    let Some((b, msg)) = crate::server::test_links::pop_any(&mut links, m) else {
                        continue;
                    };
                    let acts = deliver(&mut s, b, msg, &gone);
                    exec(b, acts, &mut links, &mut asked);
                }
            }
        }
        while let Some((&(a, b), _)) = links.iter().find(|(_, q)| !q.is_empty()) {
            let msg = links
                .get_mut(&(a, b))
                .and_then(|q| q.pop_front())
                .expect("busy");
            let acts = deliver(&mut s, b, msg, &gone);
            exec(b, acts, &mut links, &mut asked);
        }
        for (k, a) in &asked {
            assert!(a.is_some(), "claim {k:?} never answered");
        }
        if let Some(choice) = root_choice {
            for n in 0..NODES {
                assert_eq!(last.get(&n), Some(&choice), "node {n}'s leader");
            }
        }
    });
}
