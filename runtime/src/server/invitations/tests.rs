//! Invitations driven through their `on_*` methods: three servers exchange the peer
//! messages their actions name by hand (the root's PGCID answer included).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::wire::proto::{EventCode, GroupDirectives, GroupInfo, JobMsg, ServerMsg, WireError};
use weft_fuzz::{run, Mutator};
use weft_wireup::Rank;

use super::{Action, Invitations, Invite};
use crate::modex::ConnId;
use crate::server::pgcids::Pgcids;

const NODES: u32 = 3;
/// Two ranks per node.
const OWNERS: [u32; 6] = [0, 0, 1, 1, 2, 2];

struct Cluster {
    s: Vec<Invitations>,
    pgcids: Vec<Pgcids>,
}

impl Cluster {
    fn new() -> Cluster {
        Cluster {
            s: (0..NODES)
                .map(|n| Invitations::new(n, OWNERS.to_vec()))
                .collect(),
            pgcids: (0..NODES).map(|_| Pgcids::new(0)).collect(),
        }
    }

    /// Delivers `msg` to server `to` (the root answers PGCID requests itself).
    fn deliver(&mut self, to: u32, msg: JobMsg) -> Vec<Action> {
        let t = to as usize;
        match msg {
            JobMsg::PgcidReq { qid, from } => {
                assert_eq!(to, 0, "PGCIDs come from the root");
                let pgcid = self.pgcids[0].take();
                let msg = JobMsg::PgcidResp { qid, pgcid };
                vec![Action::Peer { node: from, msg }]
            }
            msg => self.s[t].on_peer(msg, &mut self.pgcids[t]),
        }
    }

    /// Runs the actions of server `from` to the end; returns the others, by server.
    fn settle(&mut self, from: u32, acts: Vec<Action>) -> Vec<(u32, Action)> {
        let mut queue: VecDeque<(u32, Action)> = acts.into_iter().map(|a| (from, a)).collect();
        let mut rest = Vec::new();
        while let Some((at, a)) = queue.pop_front() {
            match a {
                Action::Peer { node, msg } => {
                    assert_ne!(node, at, "a server sent itself {msg:?}");
                    queue.extend(self.deliver(node, msg).into_iter().map(|a| (node, a)));
                }
                other => rest.push((at, other)),
            }
        }
        rest
    }

    fn invite(
        &mut self,
        leader: Rank,
        req: u64,
        procs: Vec<Rank>,
        assign: bool,
    ) -> Vec<(u32, Action)> {
        let n = OWNERS[leader as usize];
        let inv = Invite {
            leader,
            conn: 100 + ConnId::from(leader),
            req,
            id: "g".into(),
            procs,
            directives: GroupDirectives {
                assign_context_id: assign,
                ..GroupDirectives::default()
            },
            timeout_ms: Some(1000),
        };
        let acts =
            self.s[n as usize].on_invite(inv, false, "job", |_| None, &mut self.pgcids[n as usize]);
        self.settle(n, acts)
    }

    fn join(&mut self, rank: Rank, req: u64, leader: Rank, accept: bool) -> Vec<(u32, Action)> {
        let n = OWNERS[rank as usize] as usize;
        let conn = 100 + ConnId::from(rank);
        let acts = self.s[n].on_join(
            rank,
            conn,
            req,
            "g".into(),
            leader,
            accept,
            &mut self.pgcids[n],
        );
        self.settle(n as u32, acts)
    }
}

/// The local processes sent an event of `code`, in rank order.
fn events(rest: &[(u32, Action)], code: EventCode) -> Vec<Rank> {
    let mut to: Vec<Rank> = rest
        .iter()
        .filter_map(|(_, a)| match a {
            Action::Emit { rank, event } if event.code == code => Some(*rank),
            _ => None,
        })
        .collect();
    to.sort_unstable();
    to
}

fn groups(rest: &[(u32, Action)]) -> Vec<(ConnId, u64, GroupInfo)> {
    rest.iter()
        .filter_map(|(_, a)| match a {
            Action::Reply {
                conn,
                msg: ServerMsg::Group { req, group },
            } => Some((*conn, *req, group.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn an_invitation_forms_the_group_of_those_that_accept_with_a_pgcid_from_the_root() {
    let mut c = Cluster::new();
    // Rank 2 (node 1) invites 0, 4 and 5.
    let rest = c.invite(2, 1, vec![5, 0, 4, 2], true);
    assert_eq!(events(&rest, EventCode::Invited), vec![0, 4, 5]);
    assert!(matches!(rest[0].1, Action::Timer { ref id, .. } if id == "g"));
    let rest = c.join(0, 7, 2, true);
    assert_eq!(events(&rest, EventCode::InviteAccepted), vec![2]);
    assert!(
        groups(&rest).is_empty(),
        "answered before every invitee did"
    );
    let rest = c.join(4, 8, 2, false);
    assert!(
        matches!(
            &rest[..],
            [
                (
                    2,
                    Action::Reply {
                        conn: 104,
                        msg: ServerMsg::Done { req: 8 }
                    }
                ),
                (1, Action::Emit { rank: 2, .. })
            ]
        ),
        "{rest:?}"
    );
    let rest = c.join(5, 9, 2, true);
    let got = groups(&rest);
    assert_eq!(got.len(), 3, "the leader and both acceptors: {got:?}");
    for (_, _, g) in &got {
        assert_eq!(g.members, vec![0, 2, 5]);
        assert_eq!(g.left_out, vec![4]);
        assert_eq!(g.pgcid, Some(1), "the root's first PGCID");
        assert_eq!(g.leader, Some(2));
    }
    let asked: BTreeSet<_> = got.iter().map(|(c, r, _)| (*c, *r)).collect();
    assert_eq!(asked, [(100, 7), (102, 1), (105, 9)].into());
    let recorded: BTreeSet<u32> = rest
        .iter()
        .filter(|(_, a)| matches!(a, Action::Record(_)))
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(recorded, [0, 1, 2].into());
    assert_eq!(events(&rest, EventCode::ConstructComplete), vec![0, 2, 5]);
}

#[test]
fn a_dead_or_late_invitee_fails_and_a_dead_leader_aborts_the_joins() {
    let mut c = Cluster::new();
    c.invite(0, 1, vec![2, 3], false);
    // Rank 2 dies: the leader hears of it; rank 3 times out.
    let acts = c.s[0].on_proc_gone(2, "exited with code 1", &mut c.pgcids[0]);
    let rest = c.settle(0, acts);
    assert_eq!(events(&rest, EventCode::InviteFailed), vec![0]);
    let acts = c.s[0].on_timeout("g", &mut c.pgcids[0]);
    let rest = c.settle(0, acts);
    match &groups(&rest)[..] {
        [(100, 1, g)] => {
            assert_eq!(g.members, vec![0]);
            assert_eq!(g.left_out, vec![2, 3]);
        }
        other => panic!("expected the leader's group alone, got {other:?}"),
    }
    // A leader that dies while an invitee waits to join.
    let mut c = Cluster::new();
    c.invite(0, 1, vec![2, 3], false);
    c.join(2, 5, 0, true);
    let acts = c.s[1].on_proc_gone(0, "was killed", &mut c.pgcids[1]);
    let rest = c.settle(1, acts);
    assert!(rest.iter().any(|(_, a)| matches!(
        a,
        Action::Reply {
            conn: 102,
            msg: ServerMsg::Failed {
                req: 5,
                error: WireError::ProcGone { rank: 0, .. }
            }
        }
    )));
    assert_eq!(events(&rest, EventCode::ConstructAbort), vec![2, 3]);
}

#[test]
fn a_join_that_reaches_the_leader_after_the_timeout_is_answered_with_an_error() {
    let mut c = Cluster::new();
    c.invite(0, 1, vec![2, 3], false);
    // Rank 2 accepts, but its answer is still on its way when the timeout fires.
    let held: Vec<Action> = c.s[1].on_join(2, 102, 5, "g".into(), 0, true, &mut c.pgcids[1]);
    assert!(
        matches!(&held[..], [Action::Peer { node: 0, .. }]),
        "{held:?}"
    );
    let acts = c.s[0].on_timeout("g", &mut c.pgcids[0]);
    let rest = c.settle(0, acts);
    match &groups(&rest)[..] {
        [(100, 1, g)] => assert_eq!(
            (g.members.clone(), g.left_out.clone()),
            (vec![0], vec![2, 3])
        ),
        other => panic!("expected the leader's group alone, got {other:?}"),
    }
    // The waiting join is answered: it timed out.
    let failed: Vec<&Action> = rest
        .iter()
        .filter(|(n, a)| *n == 1 && matches!(a, Action::Reply { conn: 102, .. }))
        .map(|(_, a)| a)
        .collect();
    match &failed[..] {
        [Action::Reply {
            msg:
                ServerMsg::Failed {
                    req: 5,
                    error: WireError::Timeout { op, missing },
                },
            ..
        }] => {
            assert!(op.contains("after the invitation's timeout"), "{op}");
            assert_eq!(missing, &vec![2]);
        }
        other => panic!("expected rank 2's join to fail, got {other:?}"),
    }
    assert!(
        !rest
            .iter()
            .any(|(n, a)| *n == 1 && matches!(a, Action::Record(_))),
        "no member on node 1: no record"
    );
    // The held answer reaches the leader's server: nothing more happens.
    let rest = c.settle(1, held);
    assert!(rest.is_empty(), "{rest:?}");
    // Rank 3 answers after all that: told at once it has no invitation.
    let rest = c.join(3, 6, 0, true);
    assert!(
        matches!(
            &rest[..],
            [(
                1,
                Action::Reply {
                    conn: 103,
                    msg: ServerMsg::Failed {
                        req: 6,
                        error: WireError::Invalid { .. }
                    }
                }
            )]
        ),
        "{rest:?}"
    );
}

#[test]
fn bad_invites_and_joins_without_an_invitation_are_refused() {
    let mut c = Cluster::new();
    let refused = |acts: &[Action], why: &str| matches!(acts, [Action::Reply { msg: ServerMsg::Failed { error: WireError::Invalid { reason, .. }, .. }, .. }] if reason.contains(why));
    for (id, procs, in_use, why) in [
        ("", vec![1], false, "empty"),
        ("job", vec![1], false, "namespace"),
        ("weft://x", vec![1], false, "reserved"),
        ("g", vec![0], false, "nobody to invite"),
        ("g", vec![1, 9], false, "not in the job"),
        ("g", vec![1], true, "already in use"),
    ] {
        let inv = Invite {
            leader: 0,
            conn: 1,
            req: 1,
            id: id.into(),
            procs,
            directives: GroupDirectives::default(),
            timeout_ms: None,
        };
        let acts = c.s[0].on_invite(inv, in_use, "job", |_| None, &mut c.pgcids[0]);
        assert!(refused(&acts, why), "{id:?}: {acts:?}");
    }
    let acts = c.s[0].on_join(1, 1, 2, "g".into(), 0, true, &mut c.pgcids[0]);
    assert!(refused(&acts, "no pending invitation"), "{acts:?}");
    c.invite(0, 3, vec![1], false);
    let acts = c.s[0].on_invite(
        Invite {
            leader: 0,
            conn: 1,
            req: 4,
            id: "g".into(),
            procs: vec![1],
            directives: GroupDirectives::default(),
            timeout_ms: None,
        },
        false,
        "job",
        |_| None,
        &mut c.pgcids[0],
    );
    assert!(refused(&acts, "already in use"), "{acts:?}");
}

/// Random invitations (each with a timeout), joins, deaths and message orders over three
/// servers: no request is answered twice; once every timeout fired, every living
/// leader's invitation is answered, with the leader and only invitees as members and a
/// PGCID never handed out twice.
#[test]
fn fuzz_invitations_answer_once_and_every_living_leader_gets_its_group() {
    run("invitations", 17, |m: &mut Mutator| {
        let mut c = Cluster::new();
        let mut links: BTreeMap<(u32, u32), VecDeque<JobMsg>> = BTreeMap::new();
        let mut answers: HashMap<(ConnId, u64), usize> = HashMap::new();
        let mut invites: Vec<(Rank, u64, Vec<Rank>)> = Vec::new();
        let mut timers: Vec<(u32, String)> = Vec::new();
        let mut dead: BTreeSet<Rank> = BTreeSet::new();
        let mut groups_seen: Vec<GroupInfo> = Vec::new();
        let mut next_req = 1;
        let id_of = |leader: Rank| format!("g{leader}");
        let mut exec = |at: u32,
                        acts: Vec<Action>,
                        c: &mut Cluster,
                        links: &mut BTreeMap<(u32, u32), VecDeque<JobMsg>>,
                        timers: &mut Vec<(u32, String)>| {
            let mut queue: VecDeque<Action> = acts.into();
            while let Some(a) = queue.pop_front() {
                match a {
                    Action::Peer {
                        node,
                        msg: JobMsg::PgcidReq { qid, from },
                    } => {
                        assert_eq!(node, 0);
                        // The root answers at once (its PGCIDs are its own).
                        let pgcid = c.pgcids[0].take();
                        links
                            .entry((0, from))
                            .or_default()
                            .push_back(JobMsg::PgcidResp { qid, pgcid });
                    }
                    Action::Peer { node, msg } => {
                        assert_ne!(node, at);
                        links.entry((at, node)).or_default().push_back(msg);
                    }
                    Action::Reply { conn, msg } => {
                        let req = match &msg {
                            ServerMsg::Done { req } | ServerMsg::Failed { req, .. } => *req,
                            ServerMsg::Group { req, group } => {
                                if conn == 100 + ConnId::from(group.leader.expect("a leader")) {
                                    groups_seen.push(group.clone());
                                }
                                *req
                            }
                            other => panic!("{other:?}"),
                        };
                        *answers.entry((conn, req)).or_default() += 1;
                    }
                    Action::Timer { id, .. } => timers.push((at, id)),
                    Action::Emit { .. } | Action::Record(_) => {}
                }
            }
        };
        for _ in 0..m.below(50) {
            match m.below(6) {
                0 => {
                    let leader = m.below(6) as Rank;
                    if dead.contains(&leader) || invites.iter().any(|i| i.0 == leader) {
                        continue;
                    }
                    let procs: Vec<Rank> = (0..m.below(4)).map(|_| m.below(6) as Rank).collect();
                    let n = OWNERS[leader as usize];
                    let inv = Invite {
                        leader,
                        conn: 100 + ConnId::from(leader),
                        req: next_req,
                        id: id_of(leader),
                        procs: procs.clone(),
                        directives: GroupDirectives {
                            assign_context_id: m.below(2) == 0,
                            ..GroupDirectives::default()
                        },
                        timeout_ms: Some(10),
                    };
                    invites.push((leader, next_req, procs));
                    next_req += 1;
                    let d = dead.clone();
                    let acts = c.s[n as usize].on_invite(
                        inv,
                        false,
                        "job",
                        |r| d.contains(&r).then(|| "died".to_owned()),
                        &mut c.pgcids[n as usize],
                    );
                    exec(n, acts, &mut c, &mut links, &mut timers);
                }
                1 | 2 => {
                    let (rank, leader) = (m.below(6) as Rank, m.below(6) as Rank);
                    if dead.contains(&rank) {
                        continue;
                    }
                    let n = OWNERS[rank as usize];
                    let acts = c.s[n as usize].on_join(
                        rank,
                        100 + ConnId::from(rank),
                        next_req,
                        id_of(leader),
                        leader,
                        m.below(3) != 0,
                        &mut c.pgcids[n as usize],
                    );
                    next_req += 1;
                    exec(n, acts, &mut c, &mut links, &mut timers);
                }
                3 => {
                    let rank = m.below(6) as Rank;
                    if !dead.insert(rank) {
                        continue;
                    }
                    for n in 0..NODES {
                        let acts =
                            c.s[n as usize].on_proc_gone(rank, "died", &mut c.pgcids[n as usize]);
                        exec(n, acts, &mut c, &mut links, &mut timers);
                    }
                }
                _ => {
                    let Some((b, msg)) = crate::server::test_links::pop_any(&mut links, m) else {
                        continue;
                    };
                    let acts = c.s[b as usize].on_peer(msg, &mut c.pgcids[b as usize]);
                    exec(b, acts, &mut c, &mut links, &mut timers);
                }
            }
        }
        loop {
            if let Some((&(a, b), _)) = links.iter().find(|(_, q)| !q.is_empty()) {
                let msg = links
                    .get_mut(&(a, b))
                    .and_then(|q| q.pop_front())
                    .expect("busy");
                let acts = c.s[b as usize].on_peer(msg, &mut c.pgcids[b as usize]);
                exec(b, acts, &mut c, &mut links, &mut timers);
            } else if let Some((n, id)) = timers.pop() {
                let acts = c.s[n as usize].on_timeout(&id, &mut c.pgcids[n as usize]);
                exec(n, acts, &mut c, &mut links, &mut timers);
            } else {
                break;
            }
        }
        for (k, n) in &answers {
            assert_eq!(*n, 1, "request {k:?} answered {n} times");
        }
        for (leader, req, _) in &invites {
            if dead.contains(leader) {
                continue;
            }
            assert_eq!(
                answers.get(&(100 + ConnId::from(*leader), *req)),
                Some(&1),
                "rank {leader}'s invite {req}"
            );
        }
        let mut pgcids = BTreeSet::new();
        for g in &groups_seen {
            let leader = g.leader.expect("a leader");
            let (_, _, procs) = invites.iter().find(|i| i.0 == leader).expect("its invite");
            assert!(g.members.contains(&leader));
            assert!(
                g.members.iter().all(|r| *r == leader || procs.contains(r)),
                "{g:?} from {procs:?}"
            );
            if let Some(p) = g.pgcid {
                assert!(pgcids.insert(p), "PGCID {p} handed out twice");
            }
        }
    });
}
