//! The process-set concern driven through its `on_*` methods: three servers exchange
//! the peer messages their actions name by hand.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::wire::proto::{EventCode, JobMsg, ServerMsg, WireError};
use weft_fuzz::{run, Mutator};
use weft_wireup::{keys, Rank};

use super::{Action, Psets};
use crate::modex::ConnId;

const NODES: u32 = 3;

fn servers() -> Vec<Psets> {
    (0..NODES)
        .map(|n| Psets::new(n, NODES, 6, vec!["launch-set".into()]))
        .collect()
}

/// Delivers a peer message to the server it is for.
fn deliver(s: &mut [Psets], node: u32, msg: JobMsg) -> Vec<Action> {
    match msg {
        JobMsg::PsetChange {
            name,
            members,
            from,
            qid,
        } => {
            assert_eq!(node, 0, "a change goes to the root server");
            s[0].on_change(name, members, from, qid)
        }
        JobMsg::PsetChanged {
            name,
            members,
            qid,
            error,
        } => s[node as usize].on_changed(name, members, qid, error),
        other => panic!("not a process-set message: {other:?}"),
    }
}

/// Runs `acts` of server `from` to the end; returns each server's other actions.
fn settle(s: &mut [Psets], from: u32, acts: Vec<Action>) -> Vec<(u32, Action)> {
    let mut queue: VecDeque<(u32, Action)> = acts.into_iter().map(|a| (from, a)).collect();
    let mut rest = Vec::new();
    while let Some((at, a)) = queue.pop_front() {
        match a {
            Action::Peer { node, msg } => {
                assert_ne!(node, at);
                queue.extend(deliver(s, node, msg).into_iter().map(|a| (node, a)));
            }
            other => rest.push((at, other)),
        }
    }
    rest
}

fn reply_of(rest: &[(u32, Action)]) -> Vec<(u32, ConnId, ServerMsg)> {
    rest.iter()
        .filter_map(|(n, a)| match a {
            Action::Reply { conn, msg } => Some((*n, *conn, msg.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_pset_defined_on_any_node_is_decided_at_the_root_and_announced_everywhere() {
    let mut s = servers();
    let acts = s[2].on_request(7, 1, "ice".into(), Some(vec![3, 1, 3]));
    assert!(
        matches!(
            &acts[..],
            [Action::Peer {
                node: 0,
                msg: JobMsg::PsetChange { from: 2, .. }
            }]
        ),
        "{acts:?}"
    );
    let rest = settle(&mut s, 2, acts);
    let got = reply_of(&rest);
    assert!(
        matches!(&got[..], [(2, 7, ServerMsg::Done { req: 1 })]),
        "only the asker is answered, once: {got:?}"
    );
    for (n, p) in s.iter().enumerate() {
        assert_eq!(p.defined()["ice"], vec![1, 3], "node {n}");
        let events: Vec<_> = rest
            .iter()
            .filter_map(|(at, a)| match a {
                Action::Emit(e) if *at == n as u32 => Some(e.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(events.len(), 1, "node {n}: {events:?}");
        assert_eq!(events[0].code, EventCode::PsetDefined);
        assert_eq!(events[0].members, vec![1, 3]);
        let names = rest.iter().find_map(|(at, a)| match a {
            Action::Store { key, value } if *at == n as u32 && key == keys::RUNTIME_PSETS => {
                Some(postcard::from_bytes::<Vec<String>>(value).expect("names"))
            }
            _ => None,
        });
        assert_eq!(names, Some(vec!["ice".to_owned()]), "node {n}");
    }
    // Deleted from the root itself: gone everywhere.
    let acts = s[0].on_request(3, 2, "ice".into(), None);
    let rest = settle(&mut s, 0, acts);
    let got = reply_of(&rest);
    assert!(
        matches!(&got[..], [(0, 3, ServerMsg::Done { req: 2 })]),
        "{got:?}"
    );
    assert!(s.iter().all(|p| p.defined().is_empty()));
    assert!(rest
        .iter()
        .any(|(_, a)| matches!(a, Action::Emit(e) if e.code == EventCode::PsetDeleted)));
}

#[test]
fn bad_changes_are_refused_to_the_asker_only() {
    let mut s = servers();
    let acts = s_req(&mut s, 1, "ice", Some(vec![0]));
    let rest = settle(&mut s, 1, acts);
    assert_eq!(reply_of(&rest).len(), 1);
    for (name, members, why) in [
        ("ice", Some(vec![2]), "already exists"),
        ("", Some(vec![2]), "the name is empty"),
        ("launch-set", None, "built-in or launch"),
        ("weft://self", Some(vec![1]), "built-in or launch"),
        ("mpi://world", Some(vec![1]), "built-in or launch"),
        ("fire", Some(vec![]), "no members"),
        ("fire", Some(vec![6]), "outside the job"),
        ("fire", None, "no process set \"fire\" was defined"),
    ] {
        let acts = s_req(&mut s, 1, name, members);
        let rest = settle(&mut s, 1, acts);
        match &reply_of(&rest)[..] {
            [(
                1,
                9,
                ServerMsg::Failed {
                    error: WireError::Invalid { reason, .. },
                    ..
                },
            )] => {
                assert!(reason.contains(why), "{name:?}: {reason}")
            }
            other => panic!("{name:?}: expected a refusal, got {other:?}"),
        }
        assert!(
            !rest
                .iter()
                .any(|(_, a)| matches!(a, Action::Emit(_) | Action::Store { .. })),
            "{name:?}: a refused change changed something: {rest:?}"
        );
    }
    assert!(s.iter().all(|p| p.defined().keys().eq(["ice"].iter())));
}

fn s_req(s: &mut [Psets], node: u32, name: &str, members: Option<Vec<Rank>>) -> Vec<Action> {
    s[node as usize].on_request(9, 1, name.into(), members)
}

/// Random defines and deletes from every node, messages delivered in random order
/// (each link FIFO): every request is answered once, and every server ends with the
/// root's process sets, the datastore's list naming them.
#[test]
fn fuzz_psets_every_request_answered_once_and_every_server_agrees() {
    run("psets", 11, |m: &mut Mutator| {
        let mut s = servers();
        let mut links: BTreeMap<(u32, u32), VecDeque<JobMsg>> = BTreeMap::new();
        let mut answers: HashMap<(u32, u64), usize> = HashMap::new();
        let mut listed: HashMap<u32, Vec<String>> = HashMap::new();
        let mut next_req = 1;
        let names = ["a", "b", "c", "", "launch-set"];
        let mut exec = |at: u32,
                        acts: Vec<Action>,
                        links: &mut BTreeMap<(u32, u32), VecDeque<JobMsg>>,
                        answers: &mut HashMap<(u32, u64), usize>| {
            for a in acts {
                match a {
                    Action::Peer { node, msg } => {
                        links.entry((at, node)).or_default().push_back(msg)
                    }
                    Action::Reply { msg, .. } => {
                        let req = match msg {
                            ServerMsg::Done { req } | ServerMsg::Failed { req, .. } => req,
                            other => panic!("{other:?}"),
                        };
                        *answers.get_mut(&(at, req)).expect("asked") += 1;
                    }
                    Action::Store { key, value } if key == keys::RUNTIME_PSETS => {
                        listed.insert(at, postcard::from_bytes(&value).expect("names"));
                    }
                    Action::Store { .. } | Action::Emit(_) => {}
                }
            }
        };
        for _ in 0..m.below(40) {
            if m.below(2) == 0 {
                let node = m.below(NODES as usize) as u32;
                let name = names[m.below(names.len())];
                let members = (m.below(3) != 0)
                    .then(|| (0..m.below(4)).map(|_| m.below(7) as Rank).collect());
                answers.insert((node, next_req), 0);
                let acts = s[node as usize].on_request(1, next_req, name.into(), members);
                next_req += 1;
                exec(node, acts, &mut links, &mut answers);
            } else {
                let Some((b, msg)) = crate::server::test_links::pop_any(&mut links, m) else {
                    continue;
                };
                let acts = deliver(&mut s, b, msg);
                exec(b, acts, &mut links, &mut answers);
            }
        }
        while let Some((&(a, b), _)) = links.iter().find(|(_, q)| !q.is_empty()) {
            let msg = links
                .get_mut(&(a, b))
                .and_then(|q| q.pop_front())
                .expect("busy");
            let acts = deliver(&mut s, b, msg);
            exec(b, acts, &mut links, &mut answers);
        }
        for (k, n) in &answers {
            assert_eq!(*n, 1, "request {k:?} answered {n} times");
        }
        let root = s[0].defined().clone();
        for (n, p) in s.iter().enumerate() {
            assert_eq!(p.defined(), &root, "node {n} disagrees with the root");
            if let Some(l) = listed.get(&(n as u32)) {
                assert!(l.iter().eq(root.keys()), "node {n} lists {l:?}");
            }
        }
        assert!(root
            .values()
            .all(|m| !m.is_empty() && m.windows(2).all(|w| w[0] < w[1])));
    });
}
