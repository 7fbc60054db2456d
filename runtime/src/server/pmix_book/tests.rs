//! The PMIx front end's bookkeeping through its `on_*` methods, without libpmix: the
//! library's reply handles are plain labels here. The group invitations' tests are at
//! the end.

use std::time::Instant;

use weft_pmix::server::codes::{
    GROUP_CONSTRUCT_COMPLETE, GROUP_INVITED, GROUP_INVITE_ACCEPTED as ACCEPTED,
    GROUP_INVITE_DECLINED as DECLINED,
};
use weft_pmix::server::{Failure, ProcName, QueryAnswer, QueryKey};

use super::{query_answers, Ask, Ended, InviteAction, PmixBook};
use crate::wire::proto::{CollKind, GroupDirectives, GroupInfo, Procs, ServerMsg, WireError};

/// Node 0's book of a 4-process namespace on 2 nodes (ranks 0, 1 here; 2, 3 on node 1).
fn book() -> PmixBook<&'static str, &'static str> {
    PmixBook::new("ns".into(), 0, vec![0, 0, 1, 1])
}

fn p(nspace: &str, rank: Option<u32>) -> ProcName {
    ProcName {
        nspace: nspace.into(),
        rank,
    }
}

#[test]
fn the_participants_are_the_namespaces_ranks_or_the_request_is_refused() {
    let b = book();
    assert_eq!(b.procs("fence", &[]), Ok(Procs::All));
    assert_eq!(b.procs("fence", &[p("ns", None)]), Ok(Procs::All));
    assert_eq!(
        b.procs(
            "fence",
            &[p("ns", Some(2)), p("ns", Some(0)), p("ns", Some(2))]
        ),
        Ok(Procs::List(vec![0, 2]))
    );
    assert_eq!(
        b.procs(
            "fence",
            &[
                p("ns", Some(3)),
                p("ns", Some(1)),
                p("ns", Some(0)),
                p("ns", Some(2))
            ]
        ),
        Ok(Procs::All)
    );
    assert_eq!(
        b.procs("fence", &[p("other", Some(0))]),
        Err(Failure::NotSupported)
    );
    assert_eq!(
        b.procs("fence", &[p("ns", Some(4))]),
        Err(Failure::NotFound)
    );
}

#[test]
fn each_set_of_participants_counts_its_fences_and_a_reply_ends_a_fence_once() {
    let mut b = book();
    let now = Instant::now();
    let a1 = b.fence_id(Procs::All);
    let r1 = b.on_fence(a1.clone(), true, "a1", now);
    let s1 = b.fence_id(Procs::List(vec![0, 2]));
    let r2 = b.on_fence(s1.clone(), false, "s1", now);
    let a2 = b.fence_id(Procs::All);
    let r3 = b.on_fence(a2.clone(), false, "a2", now);
    assert_eq!((a1.seq, s1.seq, a2.seq), (1, 1, 2));
    assert_eq!((a1.kind, a1.name.as_str()), (CollKind::Fence, "pmix"));
    assert!(r1 != r2 && r2 != r3 && r1 != r3);
    // The first local participant's copy of the answer ends it; the others find nothing.
    match b.on_core_reply(&ServerMsg::Done { req: r1 }) {
        Some(Ended::Fence {
            pending,
            error: None,
        }) => {
            assert_eq!(
                (pending.reply, pending.collect, pending.id),
                ("a1", true, a1)
            );
        }
        other => panic!("expected fence a1 done, got {other:?}"),
    }
    assert!(b.on_core_reply(&ServerMsg::Done { req: r1 }).is_none());
    let error = WireError::Timeout {
        op: "fence".into(),
        missing: vec![2],
    };
    match b.on_core_reply(&ServerMsg::Failed {
        req: r3,
        error: error.clone(),
    }) {
        Some(Ended::Fence {
            pending,
            error: Some(e),
        }) => {
            assert_eq!((pending.reply, e), ("a2", error));
        }
        other => panic!("expected fence a2 failed, got {other:?}"),
    }
    // Not a reply that ends anything.
    assert!(b
        .on_core_reply(&ServerMsg::Missing {
            req: r2,
            reason: "x".into()
        })
        .is_none());
    assert!(matches!(
        b.on_core_reply(&ServerMsg::Done { req: r2 }),
        Some(Ended::Fence { .. })
    ));
}

#[test]
fn group_operations_count_by_kind_members_and_id_and_end_with_the_group() {
    let mut b = book();
    let c1 = b.group_id(true, Procs::All, "g".into());
    let rc1 = b.on_group(c1.clone(), "c1");
    let d1 = b.group_id(false, Procs::All, "g".into());
    let rd1 = b.on_group(d1.clone(), "d1");
    let c2 = b.group_id(true, Procs::All, "g".into());
    let rc2 = b.on_group(c2.clone(), "c2");
    let h1 = b.group_id(true, Procs::All, "h".into());
    assert_eq!((c1.kind, c1.seq), (CollKind::GroupConstruct, 1));
    assert_eq!((d1.kind, d1.seq), (CollKind::GroupDestruct, 1));
    assert_eq!((c2.seq, h1.seq, h1.name.as_str()), (2, 1, "h"));
    let group = GroupInfo {
        id: "g".into(),
        members: vec![0, 1, 2, 3],
        pgcid: Some(5),
        leader: None,
        left_out: Vec::new(),
        directives: GroupDirectives::default(),
    };
    match b.on_core_reply(&ServerMsg::Group {
        req: rc1,
        group: group.clone(),
    }) {
        Some(Ended::Group {
            pending,
            result: Ok(Some(g)),
        }) => {
            assert_eq!((pending.reply, pending.id, g), ("c1", c1, group.clone()));
        }
        other => panic!("expected the group, got {other:?}"),
    }
    assert!(b
        .on_core_reply(&ServerMsg::Group { req: rc1, group })
        .is_none());
    match b.on_core_reply(&ServerMsg::Done { req: rd1 }) {
        Some(Ended::Group {
            pending,
            result: Ok(None),
        }) => assert_eq!(pending.reply, "d1"),
        other => panic!("expected the destruct done, got {other:?}"),
    }
    let error = WireError::ProcGone {
        op: "group construct".into(),
        rank: 3,
        reason: "exited".into(),
    };
    match b.on_core_reply(&ServerMsg::Failed {
        req: rc2,
        error: error.clone(),
    }) {
        Some(Ended::Group {
            pending,
            result: Err(e),
        }) => assert_eq!((pending.reply, e), ("c2", error)),
        other => panic!("expected the construct failed, got {other:?}"),
    }
}

#[test]
fn a_direct_modex_asks_the_owner_and_is_answered_once_or_failed_by_its_ranks_end() {
    let mut b = book();
    let alive = |_| None;
    // Not a process of the namespace, a local one (the library serves those), a gone one.
    assert_eq!(
        b.on_dmodex(&p("other", Some(2)), "x", alive).unwrap_err().1,
        Failure::NotFound
    );
    assert_eq!(
        b.on_dmodex(&p("ns", Some(9)), "x", alive).unwrap_err().1,
        Failure::NotFound
    );
    assert_eq!(
        b.on_dmodex(&p("ns", None), "x", alive).unwrap_err().1,
        Failure::NotFound
    );
    assert_eq!(
        b.on_dmodex(&p("ns", Some(1)), "x", alive).unwrap_err().1,
        Failure::NotFound
    );
    let gone = |r| (r == 3).then_some("exited with code 1");
    assert_eq!(
        b.on_dmodex(&p("ns", Some(3)), "x", gone),
        Err(("x", Failure::ProcGone))
    );
    // Asked of node 1; answered once.
    let Ok(Ask {
        qid: q1,
        node: 1,
        rank: 2,
    }) = b.on_dmodex(&p("ns", Some(2)), "q1", alive)
    else {
        panic!("expected a request to node 1");
    };
    assert_eq!(b.on_answered(q1), Some((2, "q1")));
    assert_eq!(b.on_answered(q1), None);
    // Timed out: the late answer finds nothing.
    let Ok(Ask { qid: q2, .. }) = b.on_dmodex(&p("ns", Some(2)), "q2", alive) else {
        panic!("expected a request");
    };
    assert_ne!(q1, q2);
    assert_eq!(b.on_dmodex_timeout(q2), Some("q2"));
    assert_eq!(b.on_dmodex_timeout(q2), None);
    assert_eq!(b.on_answered(q2), None);
    // Rank 2 ends: what waits on it fails; a request about rank 3 waits on.
    let Ok(Ask { qid: q3, .. }) = b.on_dmodex(&p("ns", Some(2)), "q3", alive) else {
        panic!("expected a request");
    };
    let Ok(Ask { qid: q4, .. }) = b.on_dmodex(&p("ns", Some(3)), "q4", alive) else {
        panic!("expected a request");
    };
    // Node 1 and node 1 again ask about local rank 0 and 1.
    b.on_serving(7, 1, 0);
    b.on_serving(8, 1, 1);
    let (failed, served) = b.on_rank_ended(2);
    assert_eq!((failed, served), (vec!["q3"], Vec::new()));
    assert_eq!(b.on_answered(q3), None);
    let (failed, served) = b.on_rank_ended(0);
    assert_eq!((failed, served), (Vec::new(), vec![(7, 1)]));
    // The library's answer for the ended rank comes after: not answered twice.
    assert!(!b.on_served(7));
    assert!(b.on_served(8));
    assert!(!b.on_served(8));
    assert_eq!(b.on_answered(q4), Some((3, "q4")));
}

#[test]
fn a_query_answers_the_keys_it_knows_and_refuses_when_it_knows_none() {
    let sets = vec![("a".to_string(), vec![0, 1]), ("b".to_string(), vec![3])];
    let key = |k: &str, pset: Option<&str>| QueryKey {
        key: k.into(),
        pset: pset.map(Into::into),
        alloc_id: None,
        nspace: None,
    };
    assert_eq!(
        query_answers(&[key("pmix.qry.nodes", None)], &sets, "ns"),
        Err(Failure::NotSupported)
    );
    let got = query_answers(
        &[
            key("pmix.qry.psets", None),
            key("pmix.qry.nodes", None),
            key("pmix.qry.psetnum", None),
            key("pmix.qry.pmems", Some("b")),
            key("pmix.qry.pmems", Some("nope")),
        ],
        &sets,
        "ns",
    );
    assert_eq!(
        got,
        Ok(vec![
            QueryAnswer::PsetNames(vec!["a".into(), "b".into()]),
            QueryAnswer::NumPsets(2),
            QueryAnswer::PsetMembers(vec![p("ns", Some(3))]),
        ])
    );
}

// Group invitations (OpenPMIx's `PMIx_Group_invite`, built from events).

fn alive(_: u32) -> Option<&'static str> {
    None
}

/// The leader that `acts` end and the text the job is told, or nothing.
fn ended(acts: &[InviteAction]) -> Vec<(u32, String)> {
    acts.iter()
        .map(|a| match a {
            InviteAction::EndLeader { leader, what } => (*leader, what.clone()),
            other => panic!("not an end: {other:?}"),
        })
        .collect()
}

#[test]
fn an_invitation_accepted_by_all_forms_the_group_here_once_a_member_is_local() {
    let mut b = book();
    b.on_invite(Some("g"), 0, &[0, 1, 2], alive)
        .expect("all alive");
    assert_eq!(b.on_invite_answer(ACCEPTED, 1, &[0]), vec![]);
    assert_eq!(b.on_invite_answer(ACCEPTED, 2, &[0]), vec![]);
    let acts = b.on_invite_complete("g", 0, vec![2, 0, 1, 0]);
    assert_eq!(
        acts,
        vec![InviteAction::Record(GroupInfo {
            id: "g".into(),
            members: vec![0, 1, 2],
            pgcid: None,
            leader: Some(0),
            left_out: Vec::new(),
            directives: GroupDirectives::default(),
        })]
    );
    // Complete: a member's end or late decline fails nothing now.
    assert_eq!(b.on_invitee_gone(2, "exited with status 0"), vec![]);
    assert_eq!(b.on_invite_answer(DECLINED, 1, &[0]), vec![]);
    // A group of node 1's ranks only is not recorded here.
    assert_eq!(b.on_invite_complete("h", 2, vec![3, 2]), vec![]);
    // A leader that completes without an invitee's answer waits for it no more.
    b.on_invite(Some("m"), 1, &[1, 3], alive).expect("alive");
    assert_eq!(b.on_invite_complete("m", 1, vec![1]).len(), 1);
    assert_eq!(b.on_invitee_gone(3, "exited with status 0"), vec![]);
}

#[test]
fn a_decline_ends_the_leader_once_and_only_that_leaders_invitation() {
    let mut b = book();
    b.on_invite(Some("g"), 0, &[0, 1, 2, 3], alive)
        .expect("alive");
    b.on_invite(Some("k"), 1, &[1, 3], alive).expect("alive");
    assert_eq!(b.on_invite_answer(ACCEPTED, 1, &[0]), vec![]);
    // Rank 3 declines leader 0's invitation only; leader 1's still waits for it.
    let acts = ended(&b.on_invite_answer(DECLINED, 3, &[0]));
    assert_eq!(acts.len(), 1, "{acts:?}");
    assert_eq!(acts[0].0, 0);
    assert!(
        acts[0].1.contains("\"g\"") && acts[0].1.contains("rank 3 declined"),
        "{}",
        acts[0].1
    );
    // The invitation is over: another decline ends no one again.
    assert_eq!(b.on_invite_answer(DECLINED, 2, &[0]), vec![]);
    let acts = ended(&b.on_invite_answer(DECLINED, 3, &[1]));
    assert_eq!(acts.iter().map(|a| a.0).collect::<Vec<_>>(), vec![1]);
    assert!(acts[0].1.contains("\"k\""), "{}", acts[0].1);
}

#[test]
fn an_invitee_that_ends_before_answering_ends_every_leader_waiting_for_it() {
    let mut b = book();
    b.on_invite(Some("a"), 0, &[0, 2], alive).expect("alive");
    b.on_invite(Some("b"), 1, &[1, 2, 3], alive).expect("alive");
    b.on_invite(Some("c"), 0, &[3], alive).expect("alive");
    let acts = ended(&b.on_invitee_gone(2, "was killed by signal 9"));
    assert_eq!(acts.iter().map(|a| a.0).collect::<Vec<_>>(), vec![0, 1]);
    assert!(acts[0].1.contains("\"a\"") && acts[0].1.contains("rank 2 was killed by signal 9"));
    assert!(acts[1].1.contains("\"b\""));
    // Invitation "c" does not wait for rank 2; an invitee that accepted may end.
    assert_eq!(b.on_invite_answer(ACCEPTED, 3, &[0]), vec![]);
    assert_eq!(b.on_invitee_gone(3, "exited with status 0"), vec![]);
    // A new invitation naming the ended rank fails at once and is not kept.
    let gone = |r: u32| (r == 2).then_some("exited with status 1");
    assert_eq!(
        b.on_invite(Some("d"), 0, &[0, 2], gone),
        Err(Failure::ProcGone)
    );
    assert_eq!(b.on_invite_answer(DECLINED, 1, &[0]), vec![]);
    // An invitation without a group id is checked, not kept.
    assert_eq!(b.on_invite(None, 0, &[0, 1], alive), Ok(()));
    assert_eq!(b.on_invite_answer(DECLINED, 1, &[0]), vec![]);
}

#[test]
fn a_leader_that_ends_leaves_nothing_to_fail() {
    let mut b = book();
    b.on_invite(Some("g"), 0, &[0, 2, 3], alive).expect("alive");
    b.on_invite(Some("h"), 1, &[1, 2], alive).expect("alive");
    assert_eq!(b.on_invitee_gone(0, "exited with status 2"), vec![]);
    assert_eq!(b.on_invite_answer(DECLINED, 3, &[0]), vec![]);
    // Leader 1's invitation is still waiting for rank 2.
    let acts = ended(&b.on_invitee_gone(2, "exited with status 0"));
    assert_eq!(acts.iter().map(|a| a.0).collect::<Vec<_>>(), vec![1]);
}

#[test]
fn a_second_answer_changes_nothing() {
    let mut b = book();
    b.on_invite(Some("g"), 0, &[0, 2, 3], alive).expect("alive");
    assert_eq!(b.on_invite_answer(ACCEPTED, 2, &[0]), vec![]);
    assert_eq!(b.on_invite_answer(ACCEPTED, 2, &[0]), vec![]);
    // Declining after accepting does not undo the acceptance.
    assert_eq!(b.on_invite_answer(DECLINED, 2, &[0]), vec![]);
    // Rank 3 is still awaited.
    let acts = ended(&b.on_invitee_gone(3, "exited with status 0"));
    assert_eq!(acts.iter().map(|a| a.0).collect::<Vec<_>>(), vec![0]);
}

#[test]
fn an_answer_for_no_pending_invitation_changes_nothing() {
    let mut b = book();
    // No invitation at all.
    assert_eq!(b.on_invite_answer(DECLINED, 2, &[0, 1]), vec![]);
    b.on_invite(Some("g"), 0, &[0, 2], alive).expect("alive");
    // To another leader, from a rank not invited, or an event that is no answer.
    assert_eq!(b.on_invite_answer(DECLINED, 2, &[1]), vec![]);
    assert_eq!(b.on_invite_answer(DECLINED, 3, &[0]), vec![]);
    assert_eq!(b.on_invite_answer(GROUP_INVITED, 2, &[0]), vec![]);
    assert_eq!(
        b.on_invite_answer(GROUP_CONSTRUCT_COMPLETE, 2, &[0]),
        vec![]
    );
    // Another leader's completion of the same id does not end leader 0's invitation.
    assert_eq!(b.on_invite_complete("g", 3, vec![3]), vec![]);
    let acts = ended(&b.on_invite_answer(DECLINED, 2, &[0]));
    assert_eq!(acts.iter().map(|a| a.0).collect::<Vec<_>>(), vec![0]);
}

/// What the fuzz model knows of a request it handed the book.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Fence,
    Group,
}

/// Random library calls, core replies, direct modex traffic and rank ends against one
/// book (reply handles are numbers), checked against a model: every handle the book
/// gives back is one it holds, each exactly once (a reply the library gets twice, or
/// never, is a crash or a hang in the real host); a core reply ends the operation it
/// names, of the right kind, once; sequence numbers count up per participants; a direct
/// modex is refused at once exactly when it must be (not of the job, gone, on this
/// node) and otherwise asked of the rank's node; a rank's end hands back exactly the
/// requests about it. After everything is answered or timed out, nothing is left.
#[test]
fn fuzz_pmix_book_hands_every_reply_back_exactly_once() {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use weft_fuzz::{run, Mutator};

    const OWNERS: [u32; 6] = [0, 0, 1, 1, 2, 2];
    let size = OWNERS.len() as u32;
    let mut checked = 0usize;
    run("pmix_book", 13, |m: &mut Mutator| {
        let node = m.below(3) as u32;
        let mut b: PmixBook<u64, u64> = PmixBook::new("ns".into(), node, OWNERS.to_vec());
        let mut held: BTreeSet<u64> = BTreeSet::new();
        let mut next_handle = 0u64;
        let mut handle = |held: &mut BTreeSet<u64>| {
            next_handle += 1;
            held.insert(next_handle);
            next_handle
        };
        let back = |held: &mut BTreeSet<u64>, h: u64, what: &str| {
            assert!(
                held.remove(&h),
                "{what}: handle {h} came back twice or was never given"
            );
        };
        // Core requests under way: req -> (kind, handle); and every req handed out.
        let mut reqs: BTreeMap<u64, (Op, u64)> = BTreeMap::new();
        let mut all_reqs: BTreeSet<u64> = BTreeSet::new();
        let mut seqs: HashMap<(Op, Procs, String), u64> = HashMap::new();
        // Direct modex asked of other nodes: qid -> (rank, handle).
        let mut asked: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
        let mut all_qids: BTreeSet<u64> = BTreeSet::new();
        // Other nodes' requests the library serves: qid -> rank.
        let mut serving: BTreeMap<u64, u32> = BTreeMap::new();
        let mut next_served = 1u64 << 60;
        let mut gone: BTreeSet<u32> = BTreeSet::new();
        let procs_of = |m: &mut Mutator| match m.below(3) {
            0 => Procs::All,
            _ => Procs::List((0..size).filter(|_| m.below(2) == 0).collect()).normalize(size),
        };
        for _ in 0..m.below(60) {
            match m.below(9) {
                0 | 1 => {
                    let procs = procs_of(m);
                    let (op, name) = if m.below(2) == 0 {
                        (Op::Fence, String::new())
                    } else {
                        (Op::Group, format!("g{}", m.below(2)))
                    };
                    let id = match op {
                        Op::Fence => b.fence_id(procs.clone()),
                        Op::Group => b.group_id(true, procs.clone(), name.clone()),
                    };
                    // Per participants (and, for a group, per id): 1, 2, 3, ...
                    let seq = seqs.entry((op, procs, name)).or_insert(0);
                    *seq += 1;
                    assert_eq!(id.seq, *seq, "{op:?} sequence numbers count up");
                    let h = handle(&mut held);
                    let req = match op {
                        Op::Fence => b.on_fence(id, m.below(2) == 0, h, Instant::now()),
                        Op::Group => b.on_group(id, h),
                    };
                    assert!(all_reqs.insert(req), "request {req} handed out twice");
                    reqs.insert(req, (op, h));
                }
                2 => {
                    // A core reply: to a request under way, one ended, or none.
                    let req = match m.below(3) {
                        0 => m.below(1000) as u64 + 500,
                        _ => match all_reqs.iter().nth(m.below(all_reqs.len().max(1))) {
                            Some(&r) => r,
                            None => continue,
                        },
                    };
                    let msg = match m.below(3) {
                        0 => ServerMsg::Done { req },
                        1 => ServerMsg::Failed {
                            req,
                            error: WireError::Timeout {
                                op: "fence".into(),
                                missing: vec![1],
                            },
                        },
                        _ => ServerMsg::Group {
                            req,
                            group: GroupInfo {
                                id: "g0".into(),
                                members: vec![0, 1],
                                pgcid: Some(9),
                                leader: None,
                                left_out: Vec::new(),
                                directives: GroupDirectives::default(),
                            },
                        },
                    };
                    match (b.on_core_reply(&msg), reqs.remove(&req)) {
                        (None, None) => {}
                        (Some(Ended::Fence { pending, error }), Some((Op::Fence, h))) => {
                            assert_eq!(pending.reply, h);
                            assert_eq!(error.is_some(), matches!(msg, ServerMsg::Failed { .. }));
                            back(&mut held, h, "a fence's reply");
                        }
                        (Some(Ended::Group { pending, result }), Some((Op::Group, h))) => {
                            assert_eq!(pending.reply, h);
                            match (&msg, &result) {
                                (ServerMsg::Failed { .. }, Err(_))
                                | (ServerMsg::Done { .. }, Ok(None))
                                | (ServerMsg::Group { .. }, Ok(Some(_))) => {}
                                _ => panic!("{msg:?} ended a group as {result:?}"),
                            }
                            back(&mut held, h, "a group's reply");
                        }
                        (got, want) => panic!("core reply {msg:?}: {got:?}, expected {want:?}"),
                    }
                }
                3 => {
                    let rank = m.below(size as usize + 1) as u32;
                    let nspace = if m.below(8) == 0 { "other" } else { "ns" };
                    let wild = m.below(10) == 0;
                    let proc = p(nspace, (!wild).then_some(rank));
                    let h = handle(&mut held);
                    let dead = |r: u32| gone.contains(&r).then_some("exited");
                    match b.on_dmodex(&proc, h, dead) {
                        Ok(Ask {
                            qid,
                            node: n,
                            rank: r,
                        }) => {
                            assert!(nspace == "ns" && !wild && rank < size);
                            assert!(!gone.contains(&rank), "a gone rank's data was asked for");
                            assert_eq!((r, n), (rank, OWNERS[rank as usize]));
                            assert_ne!(n, node, "this node's own data was asked of a peer");
                            assert!(all_qids.insert(qid), "qid {qid} handed out twice");
                            asked.insert(qid, (rank, h));
                        }
                        Err((reply, why)) => {
                            assert_eq!(reply, h);
                            let want = if nspace != "ns" || wild || rank >= size {
                                Failure::NotFound
                            } else if gone.contains(&rank) {
                                Failure::ProcGone
                            } else {
                                assert_eq!(OWNERS[rank as usize], node, "refused: {why:?}");
                                Failure::NotFound
                            };
                            assert_eq!(why, want);
                            back(&mut held, h, "a refused direct modex");
                        }
                    }
                }
                4 | 5 => {
                    // An answer or a timeout: to a qid asked, one done, or none.
                    let qid = match all_qids.iter().nth(m.below(all_qids.len() + 1)) {
                        Some(&q) => q,
                        None => m.next_u64(),
                    };
                    let want = asked.remove(&qid);
                    if m.below(2) == 0 {
                        let got = b.on_answered(qid);
                        assert_eq!(got, want, "answer to qid {qid}");
                    } else {
                        let got = b.on_dmodex_timeout(qid);
                        assert_eq!(got, want.map(|(_, h)| h), "timeout of qid {qid}");
                    }
                    if let Some((_, h)) = want {
                        back(&mut held, h, "a direct modex reply");
                    }
                }
                6 => {
                    // Another node asks for a local rank's data; the library answers.
                    if m.below(2) == 0 {
                        next_served += 1;
                        let rank = m.below(size as usize) as u32;
                        b.on_serving(next_served, m.below(3) as u32, rank);
                        serving.insert(next_served, rank);
                    } else {
                        let qid = match serving.keys().nth(m.below(serving.len() + 1)) {
                            Some(&q) => q,
                            None => next_served + 1,
                        };
                        let want = serving.remove(&qid).is_some();
                        assert_eq!(b.on_served(qid), want, "served qid {qid}");
                    }
                }
                _ => {
                    let rank = m.below(size as usize) as u32;
                    gone.insert(rank);
                    let (replies, served) = b.on_rank_ended(rank);
                    let mut want: Vec<u64> = Vec::new();
                    asked.retain(|_, (r, h)| {
                        let keep = *r != rank;
                        if !keep {
                            want.push(*h);
                        }
                        keep
                    });
                    let mut got = replies.clone();
                    got.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(got, want, "rank {rank}'s end: the replies about it");
                    for h in replies {
                        back(&mut held, h, "a direct modex failed by an end");
                    }
                    let mut want_served: Vec<u64> = Vec::new();
                    serving.retain(|q, r| {
                        let keep = *r != rank;
                        if !keep {
                            want_served.push(*q);
                        }
                        keep
                    });
                    let got_served: Vec<u64> = served.iter().map(|(q, _)| *q).collect();
                    assert_eq!(got_served, want_served, "rank {rank}'s end: served");
                }
            }
        }
        // Everything ends: each request answered, each direct modex timed out.
        for (req, (_, h)) in std::mem::take(&mut reqs) {
            let ended = b
                .on_core_reply(&ServerMsg::Done { req })
                .expect("still under way");
            let reply = match ended {
                Ended::Fence { pending, .. } => pending.reply,
                Ended::Group { pending, .. } => pending.reply,
            };
            assert_eq!(reply, h);
            back(&mut held, h, "a reply at the end");
        }
        for (qid, (_, h)) in std::mem::take(&mut asked) {
            assert_eq!(b.on_dmodex_timeout(qid), Some(h));
            back(&mut held, h, "a timeout at the end");
        }
        assert!(held.is_empty(), "replies never handed back: {held:?}");
        checked += 1;
    });
    assert!(checked > 0);
}

/// Random invitations, answers, completions and ends against the invitations' book:
/// a leader is ended only for an invitation of its own that was still pending, never
/// twice for one invitation, and only when an invitee it waited for declined or ended
/// before accepting; a completed invitation ends no one; a group is recorded only with
/// a local member.
#[test]
fn fuzz_pmix_invitations_end_a_leader_only_for_its_own_pending_invite() {
    use std::collections::{BTreeMap, BTreeSet};
    use weft_fuzz::{run, Mutator};

    const OWNERS: [u32; 6] = [0, 0, 1, 1, 2, 2];
    let size = OWNERS.len();
    run("pmix_invites", 17, |m: &mut Mutator| {
        let mut b: PmixBook<u64, u64> = PmixBook::new("ns".into(), 0, OWNERS.to_vec());
        // Model: group id -> (leader, waiting for).
        let mut pending: BTreeMap<String, (u32, BTreeSet<u32>)> = BTreeMap::new();
        let mut gone: BTreeSet<u32> = BTreeSet::new();
        for _ in 0..m.below(50) {
            let id = format!("g{}", m.below(3));
            match m.below(5) {
                0 | 1 => {
                    let leader = m.below(2) as u32; // local
                    let members: Vec<u32> = (0..size as u32).filter(|_| m.below(2) == 0).collect();
                    let dead = |r: u32| gone.contains(&r).then_some("exited");
                    let r = b.on_invite(Some(&id), leader, &members, dead);
                    if members.iter().any(|r| gone.contains(r)) {
                        assert_eq!(r, Err(Failure::ProcGone));
                    } else {
                        assert_eq!(r, Ok(()));
                        let waiting = members.iter().copied().filter(|&r| r != leader).collect();
                        pending.insert(id, (leader, waiting));
                    }
                }
                2 => {
                    let invitee = m.below(size) as u32;
                    let accept = m.below(3) != 0;
                    let code = if accept { ACCEPTED } else { DECLINED };
                    let to: Vec<u32> = (0..size as u32).filter(|_| m.below(2) == 0).collect();
                    let acts = b.on_invite_answer(code, invitee, &to);
                    let mut want = Vec::new();
                    for (gid, (leader, waiting)) in pending.iter_mut() {
                        if to.contains(leader) && waiting.remove(&invitee) && !accept {
                            want.push((gid.clone(), *leader));
                        }
                    }
                    let ended: Vec<u32> = acts
                        .iter()
                        .map(|a| match a {
                            InviteAction::EndLeader { leader, .. } => *leader,
                            other => panic!("an answer did {other:?}"),
                        })
                        .collect();
                    let want_leaders: Vec<u32> = want.iter().map(|(_, l)| *l).collect();
                    assert_eq!(ended, want_leaders, "invitee {invitee} answered {code}");
                    for (gid, _) in want {
                        pending.remove(&gid);
                    }
                }
                3 => {
                    let leader = m.below(size) as u32;
                    let members: Vec<u32> = (0..size as u32).filter(|_| m.below(2) == 0).collect();
                    let acts = b.on_invite_complete(&id, leader, members.clone());
                    if pending.get(&id).is_some_and(|(l, _)| *l == leader) {
                        pending.remove(&id);
                    }
                    let local = members.iter().any(|&r| OWNERS[r as usize] == 0);
                    match acts.as_slice() {
                        [] => assert!(!local, "a group with a local member not recorded"),
                        [InviteAction::Record(g)] => {
                            assert!(local);
                            assert_eq!((g.id.as_str(), g.leader), (id.as_str(), Some(leader)));
                        }
                        other => panic!("a completion did {other:?}"),
                    }
                }
                _ => {
                    let rank = m.below(size) as u32;
                    gone.insert(rank);
                    let acts = b.on_invitee_gone(rank, "exited");
                    pending.retain(|_, (l, _)| *l != rank);
                    let doomed: Vec<String> = pending
                        .iter()
                        .filter(|(_, (_, w))| w.contains(&rank))
                        .map(|(g, _)| g.clone())
                        .collect();
                    let want: Vec<u32> = doomed.iter().map(|g| pending[g].0).collect();
                    let ended: Vec<u32> = acts
                        .iter()
                        .map(|a| match a {
                            InviteAction::EndLeader { leader, what } => {
                                assert!(what.contains(&format!("rank {rank} exited")), "{what}");
                                *leader
                            }
                            other => panic!("an end did {other:?}"),
                        })
                        .collect();
                    assert_eq!(ended, want, "rank {rank}'s end");
                    for g in doomed {
                        pending.remove(&g);
                    }
                }
            }
        }
    });
}
