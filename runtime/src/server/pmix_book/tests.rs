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
