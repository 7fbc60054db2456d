//! Tests of the server's concerns (fences, group constructs, process sets) driven
//! through its state without sockets: the clients and the other node's server are
//! channels, the datastore a small segment, and what the server sends is decoded and
//! asserted on. No task runs (one test runs a runtime for the timers it checks), and
//! no connection is opened.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use weft_shm::StoreWriter;
use weft_wireup::{NsId, ProcId, Rank, Value};

use super::{Event, Out, State};
use crate::modex::ConnId;
use crate::wire::frame::{self, MAX_CLIENT_FRAME, MAX_PEER_FRAME};
use crate::wire::proto::GroupDirectives;
use crate::wire::proto::{
    ClientMsg, CollId, CollKind, Event as WireEvent, EventCode, FenceMode, GroupInfo, JobMsg,
    PeerMsg, ProcData, Procs, ServerMsg, WireError,
};

/// The server of node 0 of a 4-process job on 2 nodes: ranks 0 and 1 here (connected),
/// 2 and 3 on node 1, whose server is a channel.
struct Node0 {
    st: State,
    _ev: UnboundedReceiver<Event>,
    to_node1: UnboundedReceiver<Vec<u8>>,
    clients: BTreeMap<Rank, (ConnId, UnboundedReceiver<Out>)>,
}

impl Node0 {
    fn new(test: &str) -> Node0 {
        let args: Vec<String> = ["--nodes", "2", "-n", "4", "/bin/true"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let spec = crate::launcher::parse_run_args(&args).expect("spec");
        let plan = Arc::new(crate::launcher::build_plan(&spec, test).expect("plan"));
        assert_eq!(plan.job.ranks_on(0), vec![0, 1]);
        let name = format!("/weft-srvtest{}-{test}-n0", std::process::id());
        let _ = weft_shm::unlink(&name);
        let store = StoreWriter::create(&name, 1 << 20, 1 << 10).expect("datastore");
        let (ev, ev_rx) = unbounded_channel();
        let (ctl_tx, _) = unbounded_channel();
        let nowhere: SocketAddr = "127.0.0.1:1".parse().expect("address");
        let mut st = State::new(
            0,
            plan,
            store,
            super::Links::new(ev, ctl_tx, vec![nowhere; 2], [1, 2]),
            super::jobs::Starter::for_tests(),
        );
        let (peer_tx, to_node1) = unbounded_channel();
        st.io.peers.connected(1, peer_tx);
        let mut clients = BTreeMap::new();
        for (conn, rank) in [(10, 0), (11, 1)] {
            let (tx, rx) = unbounded_channel();
            let token = st.job.procs.token(rank).expect("a local rank");
            st.handle(Event::ClientHello {
                conn,
                proc: ProcId::new(NsId::FIRST, rank),
                token,
                tx,
            });
            clients.insert(rank, (conn, rx));
        }
        let mut n = Node0 {
            st,
            _ev: ev_rx,
            to_node1,
            clients,
        };
        for r in [0, 1] {
            assert!(matches!(n.replies(r)[..], [ServerMsg::Welcome { .. }]));
        }
        n
    }

    /// Local rank `rank` sends `msg`.
    fn client(&mut self, rank: Rank, msg: ClientMsg) {
        let conn = self.clients[&rank].0;
        self.st.handle(Event::Client { conn, msg });
    }

    /// The server of node 1 sends `msg` (about the job, namespace 1).
    fn peer(&mut self, msg: JobMsg) {
        self.peer_about(NsId::FIRST, msg);
    }

    /// The server of node 1 sends `msg` about namespace `ns`.
    fn peer_about(&mut self, ns: NsId, msg: JobMsg) {
        self.st.handle(Event::Peer {
            msg: PeerMsg::Job { ns, msg },
        });
    }

    /// What local rank `rank` was sent since the last call.
    fn replies(&mut self, rank: Rank) -> Vec<ServerMsg> {
        let rx = &mut self.clients.get_mut(&rank).expect("a local rank").1;
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|o| match o {
                Out::Frame(f) => frame::read_sync(&mut &f[..], MAX_CLIENT_FRAME).expect("a frame"),
                Out::Close => panic!("rank {rank}'s connection was closed"),
            })
            .collect()
    }

    /// What the server of node 1 was sent since the last call.
    /// Each is in the envelope of the job's namespace.
    fn sent(&mut self) -> Vec<JobMsg> {
        std::iter::from_fn(|| self.to_node1.try_recv().ok())
            .map(
                |f| match frame::read_sync(&mut &f[..], MAX_PEER_FRAME).expect("a frame") {
                    PeerMsg::Job { ns, msg } if ns == NsId::FIRST => msg,
                    other => panic!("not a message of namespace 1: {other:?}"),
                },
            )
            .collect()
    }
}

fn fence_id(seq: u64) -> CollId {
    CollId {
        kind: CollKind::Fence,
        procs: Procs::All,
        seq,
        name: String::new(),
    }
}

fn fence(req: u64, id: &CollId, mode: FenceMode) -> ClientMsg {
    ClientMsg::Fence {
        req,
        id: id.clone(),
        mode,
        timeout_ms: None,
    }
}

/// Node 1's part of fence `id` (step 0 of the 2-node all-gather): ranks 2 and 3 at
/// generation 1, rank 2 with its card.
fn node1_gather(id: &CollId, mode: FenceMode) -> JobMsg {
    let card = vec![("card".to_owned(), Value::U64(22))];
    let data: ProcData = vec![(2, 1, Some(card)), (3, 1, Some(Vec::new()))];
    JobMsg::Gather {
        id: id.clone(),
        mode,
        step: 0,
        blocks: vec![(1, postcard::to_stdvec(&data).expect("encode"))],
        group: None,
    }
}

fn done(msgs: &[ServerMsg]) -> Vec<u64> {
    msgs.iter()
        .map(|m| match m {
            ServerMsg::Done { req } => *req,
            other => panic!("expected Done, got {other:?}"),
        })
        .collect()
}

#[test]
fn a_fence_releases_each_member_once_when_every_node_contributed() {
    let mut n = Node0::new("fence-all");
    let id = fence_id(1);
    n.client(0, fence(1, &id, FenceMode::Full));
    assert!(n.replies(0).is_empty());
    assert!(
        n.sent().is_empty(),
        "node 0's part must wait for its other member"
    );
    n.client(1, fence(7, &id, FenceMode::Full));
    match &n.sent()[..] {
        [JobMsg::Gather {
            id: sent,
            step: 0,
            blocks,
            ..
        }] => {
            assert_eq!(sent, &id);
            assert_eq!(blocks.iter().map(|b| b.0).collect::<Vec<_>>(), vec![0]);
        }
        other => panic!("expected one gather to node 1, got {other:?}"),
    }
    assert!(n.replies(0).is_empty() && n.replies(1).is_empty());
    n.peer(node1_gather(&id, FenceMode::Full));
    assert_eq!(done(&n.replies(0)), vec![1]);
    assert_eq!(done(&n.replies(1)), vec![7]);
    assert!(n.sent().is_empty());
    // A Full fence carried rank 2's card: a get of it is answered here.
    n.client(
        0,
        ClientMsg::Get {
            req: 2,
            proc: own(2),
            key: "card".into(),
            refresh: false,
            local_only: false,
            immediate: false,
            timeout_ms: None,
        },
    );
    assert!(matches!(
        n.replies(0)[..],
        [ServerMsg::Value {
            req: 2,
            value: Value::U64(22)
        }]
    ));
    assert!(n.sent().is_empty(), "no direct modex after a Full fence");
}

#[test]
fn a_member_gone_before_joining_fails_the_fence_for_the_others() {
    let mut n = Node0::new("fence-gone");
    let id = fence_id(1);
    n.client(0, fence(1, &id, FenceMode::SyncOnly));
    let reason = "exited with code 3 before finalize";
    n.peer(JobMsg::ProcGone {
        rank: 2,
        reason: reason.into(),
        joined: Vec::new(),
        finalized: false,
    });
    let failed = |msgs: &[ServerMsg], want: u64| match msgs {
        [ServerMsg::Failed {
            req,
            error:
                WireError::ProcGone {
                    op,
                    rank: 2,
                    reason: why,
                },
        }] => *req == want && op == "fence" && why == reason,
        _ => false,
    };
    let got = n.replies(0);
    assert!(failed(&got, 1), "{got:?}");
    // A member arriving later learns the same failure; nothing went to node 1.
    n.client(1, fence(5, &id, FenceMode::SyncOnly));
    let got = n.replies(1);
    assert!(failed(&got, 5), "{got:?}");
    assert!(n.replies(0).is_empty());
    assert!(n.sent().is_empty(), "{:?}", n.sent());
}

#[test]
fn a_peer_message_about_another_namespace_changes_nothing_here() {
    let mut n = Node0::new("peer-other-ns");
    let id = fence_id(1);
    n.client(0, fence(1, &id, FenceMode::SyncOnly));
    // Rank 2 of namespace 2 is not rank 2 of this job: its end must not fail the fence.
    n.peer_about(
        NsId(2),
        JobMsg::ProcGone {
            rank: 2,
            reason: "exited with code 3 before finalize".into(),
            joined: Vec::new(),
            finalized: false,
        },
    );
    assert!(n.replies(0).is_empty());
    assert!(n.sent().is_empty());
    // The same message about this job's namespace fails it.
    n.peer(JobMsg::ProcGone {
        rank: 2,
        reason: "exited with code 3 before finalize".into(),
        joined: Vec::new(),
        finalized: false,
    });
    assert!(matches!(
        n.replies(0)[..],
        [ServerMsg::Failed {
            req: 1,
            error: WireError::ProcGone { rank: 2, .. }
        }]
    ));
}

#[test]
fn a_member_that_joined_before_it_ended_does_not_fail_the_fence() {
    let mut n = Node0::new("fence-joined");
    let id = fence_id(2);
    n.client(0, fence(1, &id, FenceMode::SyncOnly));
    // Rank 2 joined the fence at node 1, then finalized.
    n.peer(JobMsg::ProcGone {
        rank: 2,
        reason: weft_wireup::FINALIZED.into(),
        joined: vec![id.digest()],
        finalized: false,
    });
    assert!(n.replies(0).is_empty());
    n.client(1, fence(2, &id, FenceMode::SyncOnly));
    assert_eq!(n.sent().len(), 1);
    n.peer(node1_gather(&id, FenceMode::SyncOnly));
    assert_eq!(done(&n.replies(0)), vec![1]);
    assert_eq!(done(&n.replies(1)), vec![2]);
}

fn construct(req: u64, name: &str, directives: &GroupDirectives) -> ClientMsg {
    ClientMsg::Group {
        req,
        id: CollId {
            kind: CollKind::GroupConstruct,
            procs: Procs::List(vec![0, 1]),
            seq: 0,
            name: name.into(),
        },
        directives: directives.clone(),
        timeout_ms: None,
    }
}

fn group_of(msgs: &[ServerMsg], want: u64) -> GroupInfo {
    match msgs {
        [ServerMsg::Group { req, group }] if *req == want => group.clone(),
        other => panic!("expected the group for request {want}, got {other:?}"),
    }
}

#[test]
fn a_node_local_group_construct_gives_every_member_one_group_and_a_fresh_pgcid() {
    let mut n = Node0::new("group");
    let world = n.st.job.plan.job.world_pgcid;
    let directives = GroupDirectives {
        local_only: true,
        assign_context_id: true,
        notify_termination: true,
        ..GroupDirectives::default()
    };
    n.client(0, construct(1, "g1", &directives));
    assert!(n.replies(0).is_empty(), "answered before rank 1 joined");
    n.client(1, construct(4, "g1", &directives));
    let g0 = group_of(&n.replies(0), 1);
    let g1 = group_of(&n.replies(1), 4);
    assert_eq!(g0, g1);
    assert_eq!(g0.members, vec![0, 1]);
    assert!(g0.left_out.is_empty());
    let pgcid = g0.pgcid.expect("a PGCID");
    assert!(pgcid > world, "PGCID {pgcid} reuses the world's {world}");
    // The root server never hands out a PGCID twice.
    n.client(0, construct(2, "g2", &directives));
    n.client(1, construct(5, "g2", &directives));
    let other = group_of(&n.replies(0), 2).pgcid.expect("a PGCID");
    group_of(&n.replies(1), 5);
    assert_ne!(other, pgcid);
    assert!(n.sent().is_empty(), "a local-only group on the root server");
    // A member that dies leaves the notify-termination groups: the other hears of it.
    n.st.proc_gone_local(1, "exited with code 1 before finalize".into(), false);
    let events: Vec<WireEvent> = n
        .replies(0)
        .into_iter()
        .map(|m| match m {
            ServerMsg::Event(e) => e,
            other => panic!("expected events, got {other:?}"),
        })
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    for (e, g) in events.iter().zip(["g1", "g2"]) {
        assert_eq!(e.code, EventCode::MemberFailed);
        assert_eq!((e.group.as_deref(), e.rank), (Some(g), Some(1)));
        assert_eq!(e.members, vec![0]);
    }
    assert_eq!(n.st.job.groups.get("g1").expect("g1").members, vec![0]);
}

fn pset_events(msgs: &[ServerMsg]) -> Vec<(EventCode, String, Vec<Rank>)> {
    msgs.iter()
        .filter_map(|m| match m {
            ServerMsg::Event(e) => Some((e.code, e.pset.clone()?, e.members.clone())),
            _ => None,
        })
        .collect()
}

/// Rank `r` of the job the test servers serve.
fn own(r: Rank) -> ProcId {
    ProcId::new(NsId::FIRST, r)
}

/// A request naming a process of a namespace the server does not serve fails at once,
/// invalid, naming the namespace; nothing else happens (no pset defined, no peer
/// message, no group, no get sent on).
#[test]
fn a_request_naming_another_namespace_fails_naming_it() {
    let mut n = Node0::new("foreign-ns");
    let other = ProcId::new(NsId(5), 1);
    let requests = [
        (
            "get",
            ClientMsg::Get {
                req: 1,
                proc: other,
                key: "card".into(),
                refresh: false,
                local_only: false,
                immediate: false,
                timeout_ms: None,
            },
        ),
        (
            "pset define",
            ClientMsg::PsetDefine {
                req: 2,
                name: "ice".into(),
                members: vec![own(0), other],
            },
        ),
        (
            "group invite",
            ClientMsg::GroupInvite {
                req: 3,
                id: "g".into(),
                procs: vec![own(1), other],
                directives: GroupDirectives::default(),
                timeout_ms: None,
            },
        ),
        (
            "group join",
            ClientMsg::GroupJoin {
                req: 4,
                id: "g".into(),
                leader: other,
                accept: true,
            },
        ),
    ];
    for (i, (what, msg)) in requests.into_iter().enumerate() {
        n.client(0, msg);
        let got = n.replies(0);
        let want = i as u64 + 1;
        assert!(
            matches!(&got[..], [ServerMsg::Failed { req, error: WireError::Invalid { op, reason } }]
                if *req == want && op == what && reason == "namespace ns5 is not served here (this server serves ns1 only)"),
            "{what}: {got:?}"
        );
        assert!(n.replies(1).is_empty() && n.sent().is_empty(), "{what}");
    }
    assert!(n.st.job.psets.defined().is_empty());
}

#[test]
fn a_pset_change_is_decided_at_the_root_announced_everywhere_and_refused_twice() {
    let mut n = Node0::new("pset");
    n.client(
        0,
        ClientMsg::PsetDefine {
            req: 1,
            name: "ice".into(),
            members: vec![own(3), own(1), own(1)],
        },
    );
    let defined = (EventCode::PsetDefined, "ice".to_owned(), vec![1, 3]);
    let got = n.replies(0);
    assert!(matches!(got[0], ServerMsg::Done { req: 1 }), "{got:?}");
    assert_eq!(pset_events(&got), vec![defined.clone()]);
    assert_eq!(pset_events(&n.replies(1)), vec![defined]);
    match &n.sent()[..] {
        [JobMsg::PsetChanged {
            name,
            members: Some(m),
            error: None,
            ..
        }] => assert_eq!((name.as_str(), &m[..]), ("ice", &[1, 3][..])),
        other => panic!("expected the change sent to node 1, got {other:?}"),
    }
    // Defined twice: only the asker hears, with why.
    n.client(
        1,
        ClientMsg::PsetDefine {
            req: 2,
            name: "ice".into(),
            members: vec![own(0)],
        },
    );
    let got = n.replies(1);
    assert!(
        matches!(&got[..], [ServerMsg::Failed { req: 2, error: WireError::Invalid { reason, .. } }] if reason.contains("already exists")),
        "{got:?}"
    );
    assert!(n.replies(0).is_empty() && n.sent().is_empty());
    assert_eq!(n.st.job.psets.defined()["ice"], vec![1, 3]);
    // Deleted, then deleted again.
    n.client(
        0,
        ClientMsg::PsetDelete {
            req: 3,
            name: "ice".into(),
        },
    );
    let got = n.replies(0);
    assert!(matches!(got[0], ServerMsg::Done { req: 3 }), "{got:?}");
    assert_eq!(
        pset_events(&got),
        vec![(EventCode::PsetDeleted, "ice".to_owned(), Vec::new())]
    );
    assert_eq!(n.sent().len(), 1);
    n.client(
        0,
        ClientMsg::PsetDelete {
            req: 4,
            name: "ice".into(),
        },
    );
    assert!(matches!(
        n.replies(0)[..],
        [ServerMsg::Failed { req: 4, .. }]
    ));
    assert!(n.st.job.psets.defined().is_empty());
}

/// The root's messages to node 1 that are not about a job: connect answers.
fn connect_msgs(n: &mut Node0) -> Vec<crate::wire::proto::ConnectMsg> {
    std::iter::from_fn(|| n.to_node1.try_recv().ok())
        .filter_map(
            |f| match frame::read_sync(&mut &f[..], MAX_PEER_FRAME).expect("a frame") {
                PeerMsg::Connect(m) => Some(m),
                _ => None,
            },
        )
        .collect()
}

fn native_connect(req: u64) -> ClientMsg {
    ClientMsg::Connect {
        req,
        procs: vec![weft_wireup::ProcSel::All(NsId::FIRST)],
        disconnect: false,
        timeout_ms: None,
    }
}

/// Both local ranks got one answer: their connect timed out.
fn assert_connect_timed_out(n: &mut Node0) {
    for r in [0, 1] {
        assert!(
            matches!(
                &n.replies(r)[..],
                [ServerMsg::Connected {
                    result: Err(weft_wireup::ConnectFailure::Timeout(_)),
                    ..
                }]
            ),
            "rank {r}"
        );
    }
}

fn connected(msgs: &[ServerMsg]) -> weft_wireup::Connection {
    match msgs {
        [ServerMsg::Connected {
            result: Ok(Some(c)),
            ..
        }] => c.clone(),
        other => panic!("expected one connection, got {other:?}"),
    }
}

#[test]
fn a_native_connect_gathers_the_nodes_callers_and_the_root_hands_each_connect_a_new_pgcid() {
    use crate::wire::proto::{ConnectId, ConnectMsg, CrossKind};
    let mut n = Node0::new("nconnect");
    let mut pgcids = Vec::new();
    for seq in 0..3u64 {
        n.client(0, native_connect(10 + seq));
        assert!(n.replies(0).is_empty(), "rank 1 has not called yet");
        n.client(1, native_connect(20 + seq));
        assert!(
            n.replies(0).is_empty() && n.replies(1).is_empty(),
            "node 1 has not arrived"
        );
        // The whole namespace, as its processes.
        let id = ConnectId {
            procs: (0..4).map(|r| (NsId::FIRST, Some(r))).collect(),
            kind: CrossKind::NativeConnect,
            seq,
        };
        n.st.handle(Event::Peer {
            msg: PeerMsg::Connect(ConnectMsg::Arrive {
                id: id.clone(),
                node: 1,
                data: Vec::new(),
            }),
        });
        let (a, b) = (connected(&n.replies(0)), connected(&n.replies(1)));
        assert_eq!(a, b);
        assert_eq!(a.procs, (0..4).map(own).collect::<Vec<_>>());
        assert_eq!(a.nodes, [0, 0, 1, 1]);
        // Node 1 gets the same answer.
        match &connect_msgs(&mut n)[..] {
            [ConnectMsg::Done {
                id: got,
                result: Ok(_),
                pgcid: Some(p),
            }] => {
                assert_eq!(got, &id);
                assert_eq!(*p, a.pgcid);
            }
            other => panic!("expected the answer to node 1, got {other:?}"),
        }
        pgcids.push(a.pgcid);
    }
    let mut distinct = pgcids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{pgcids:?}");
}

#[test]
fn a_participant_that_ends_before_calling_fails_the_native_connect_naming_it() {
    let mut n = Node0::new("nconnect-gone");
    n.client(0, native_connect(1));
    assert!(n.replies(0).is_empty());
    n.peer(JobMsg::ProcGone {
        rank: 2,
        reason: "was killed by signal 9".into(),
        joined: Vec::new(),
        finalized: false,
    });
    let replies: Vec<ServerMsg> = n
        .replies(0)
        .into_iter()
        .filter(|m| matches!(m, ServerMsg::Connected { .. }))
        .collect();
    match &replies[..] {
        [ServerMsg::Connected {
            req: 1,
            result: Err(weft_wireup::ConnectFailure::Gone(why)),
        }] => assert!(why.contains("ns1:2 was killed by signal 9"), "{why}"),
        other => panic!("expected the connect to fail, got {other:?}"),
    }
    // Rank 1, calling later, fails at once too.
    n.client(1, native_connect(2));
    let replies: Vec<ServerMsg> = n
        .replies(1)
        .into_iter()
        .filter(|m| matches!(m, ServerMsg::Connected { .. }))
        .collect();
    assert!(
        matches!(
            &replies[..],
            [ServerMsg::Connected {
                req: 2,
                result: Err(weft_wireup::ConnectFailure::Gone(_))
            }]
        ),
        "{replies:?}"
    );
}

#[test]
fn a_native_connect_that_does_not_name_its_caller_is_refused() {
    let mut n = Node0::new("nconnect-bad");
    n.client(
        0,
        ClientMsg::Connect {
            req: 3,
            procs: vec![weft_wireup::ProcSel::One(own(1))],
            disconnect: false,
            timeout_ms: None,
        },
    );
    match &n.replies(0)[..] {
        [ServerMsg::Connected {
            result: Err(weft_wireup::ConnectFailure::Invalid(why)),
            ..
        }] => assert!(why.contains("ns1:0") && why.contains("not among"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    n.client(
        0,
        ClientMsg::Connect {
            req: 4,
            procs: vec![
                weft_wireup::ProcSel::One(own(0)),
                weft_wireup::ProcSel::All(NsId(7)),
            ],
            disconnect: false,
            timeout_ms: None,
        },
    );
    match &n.replies(0)[..] {
        [ServerMsg::Connected {
            result: Err(weft_wireup::ConnectFailure::Invalid(why)),
            ..
        }] => assert!(why.contains("ns7"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_native_connect_whose_callers_time_out_fails_for_every_node() {
    use crate::wire::proto::{ConnectId, ConnectMsg, CrossKind};
    let mut n = Node0::new("nconnect-timeout");
    n.client(0, native_connect(1));
    n.client(1, native_connect(2));
    let id = ConnectId {
        procs: (0..4).map(|r| (NsId::FIRST, Some(r))).collect(),
        kind: CrossKind::NativeConnect,
        seq: 0,
    };
    // This node arrived; its callers' timeout passes before node 1 arrives.
    n.st.handle(Event::ConnectTimeout(id.clone()));
    assert_connect_timed_out(&mut n);
    // Node 1 is told the call failed (its callers must not wait for ever) ...
    assert!(
        matches!(
            &connect_msgs(&mut n)[..],
            [ConnectMsg::Done { result: Err(_), .. }]
        ),
        "node 1 was not told"
    );
    // ... and so is an arrival after it.
    n.st.handle(Event::Peer {
        msg: PeerMsg::Connect(ConnectMsg::Arrive {
            id,
            node: 1,
            data: Vec::new(),
        }),
    });
    assert!(
        matches!(
            &connect_msgs(&mut n)[..],
            [ConnectMsg::Done { result: Err(_), .. }]
        ),
        "a late arrival was not refused"
    );
}

#[test]
fn the_earliest_callers_timeout_fails_a_native_connect_for_every_caller_of_the_node() {
    use crate::wire::proto::{ConnectId, CrossKind};
    use std::time::Duration;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime for the timers");
    let _in_rt = rt.enter();
    let mut n = Node0::new("nconnect-percaller");
    let with_timeout = |req, ms| ClientMsg::Connect {
        req,
        procs: vec![weft_wireup::ProcSel::All(NsId::FIRST)],
        disconnect: false,
        timeout_ms: Some(ms),
    };
    // The first caller would wait a minute; the second only 100 ms.
    n.client(0, with_timeout(1, 60_000));
    n.client(1, with_timeout(2, 100));
    let id = ConnectId {
        procs: (0..4).map(|r| (NsId::FIRST, Some(r))).collect(),
        kind: CrossKind::NativeConnect,
        seq: 0,
    };
    let fired = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), n._ev.recv()).await })
        .expect("the second caller's 100 ms timeout armed no timer");
    match fired {
        Some(Event::ConnectTimeout(got)) => assert_eq!(got, id),
        Some(_) => panic!("expected the connect's timeout, got another event"),
        None => panic!("the server's event channel closed"),
    }
    n.st.handle(Event::ConnectTimeout(id));
    assert_connect_timed_out(&mut n);
}

#[test]
fn an_ended_jobs_connect_counts_failures_and_links_are_pruned() {
    use crate::wire::proto::{ConnectId, CrossKind};
    let mut c = super::connect::Connects::default();
    let (a, b) = (NsId::FIRST, NsId(2));
    let id = ConnectId {
        procs: vec![(a, Some(0)), (b, Some(0))],
        kind: CrossKind::NativeConnect,
        seq: 0,
    };
    c.test_record(&id);
    assert!(c.linked(a, b));
    assert_eq!(c.test_sizes(), (1, 1, 1));
    c.job_ended(b);
    assert!(!c.linked(a, b));
    assert_eq!(c.test_sizes(), (0, 0, 0));
}
