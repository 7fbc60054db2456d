//! Hostile client and peer messages through the server's real decoding path and
//! handlers (a server state driven without sockets).

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use weft_shm::StoreWriter;
use weft_wireup::{NsId, ProcId, Rank};

use super::{Event, JobEvent, Out, State};
use crate::modex::ConnId;
use crate::wire::frame;
use crate::wire::fuzz::peer_msgs;
use crate::wire::proto::{ClientMsg, ExitKind, JobPlan, PeerMsg, PROTOCOL_VERSION};
use weft_fuzz::run;
use weft_fuzz::Mutator;
use weft_testkit::corpus::client_corpus;

/// A server state of node 0 of a 4-process job on 2 nodes, in a runtime (its timers
/// and peer connections are real tasks; peers are unreachable loopback ports).
struct Rig {
    st: State,
    ev_rx: UnboundedReceiver<Event>,
    outs: Vec<UnboundedReceiver<Out>>,
    next_conn: ConnId,
    /// Connections that passed the hello, by rank.
    live: Vec<(ConnId, Rank)>,
}

impl Rig {
    fn new(plan: &Arc<JobPlan>, n: u64) -> Rig {
        let name = format!("/weft-fuzzsrv{}-{n}-n0", std::process::id());
        let _ = weft_shm::unlink(&name);
        let store = StoreWriter::create(&name, 4 << 20, 1 << 12).expect("datastore");
        let (ev, ev_rx) = unbounded_channel();
        let (ctl_tx, _) = unbounded_channel();
        let dead: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let st = State::new(
            0,
            plan.clone(),
            store,
            super::Links::new(ev, ctl_tx, vec![dead, dead], [1, 2]),
            super::jobs::Starter::for_tests(),
        );
        Rig {
            st,
            ev_rx,
            outs: Vec::new(),
            next_conn: 1,
            live: Vec::new(),
        }
    }

    /// A connection of local rank `rank` that passed the hello, if it may connect.
    fn conn_of(&mut self, rank: Rank) -> Option<ConnId> {
        if let Some(&(c, _)) = self.live.iter().find(|(_, r)| *r == rank) {
            return Some(c);
        }
        if self.st.job.procs.is_gone(rank) {
            return None;
        }
        let (tx, rx) = unbounded_channel();
        let conn = self.next_conn;
        self.next_conn += 1;
        let token = self.st.job.procs.token(rank).expect("a local rank");
        self.st.handle(Event::ClientHello {
            conn,
            proc: ProcId::new(NsId::FIRST, rank),
            token,
            tx,
        });
        self.outs.push(rx);
        self.live.push((conn, rank));
        Some(conn)
    }

    /// Runs what the handlers spawned, feeds back what it produced, drops replies.
    async fn settle(&mut self) {
        tokio::task::yield_now().await;
        while let Ok(ev) = self.ev_rx.try_recv() {
            self.st.handle(ev);
        }
        for o in &mut self.outs {
            while o.try_recv().is_ok() {}
        }
    }
}

/// The plan of a 4-process job on 2 nodes.
fn plan() -> Arc<JobPlan> {
    let args: Vec<String> = ["--nodes", "2", "-n", "4", "/bin/true"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let spec = crate::launcher::parse_run_args(&args).expect("spec");
    Arc::new(crate::launcher::build_plan(&spec, "fuzzsrv").expect("plan"))
}

/// A second hello is a protocol violation: the client is dropped (closed, and reported
/// gone with the reason), not logged and ignored (a hostile client could flood the log).
#[test]
fn a_second_hello_drops_the_client() {
    let plan = plan();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let mut rig = Rig::new(&plan, 1_000_000);
    let rank = plan.job.ranks_on(0)[0];
    let conn = rig.conn_of(rank).expect("connected");
    let token = rig.st.job.procs.token(rank).expect("a local rank");
    rig.st.handle(Event::Client {
        conn,
        msg: ClientMsg::Hello {
            magic: crate::wire::proto::MAGIC,
            version: PROTOCOL_VERSION,
            rank,
            token,
            ns: NsId::FIRST,
        },
    });
    let closed =
        std::iter::from_fn(|| rig.outs[0].try_recv().ok()).any(|o| matches!(o, Out::Close));
    assert!(closed, "the connection must be closed");
    let why = rig.st.job.procs.why_gone(rank).map(str::to_owned);
    assert_eq!(
        why.as_deref(),
        Some("was dropped by its server: it sent a second hello")
    );
}

#[test]
fn fuzz_server_handlers_with_hostile_client_and_peer_messages() {
    let plan = plan();
    let local = plan.job.ranks_on(0);
    let client: Vec<Vec<u8>> = client_corpus(local[0], 4)
        .into_iter()
        .chain(weft_testkit::corpus::inputs::saved("client"))
        .collect();
    let peer: Vec<Vec<u8>> = peer_msgs()
        .iter()
        .map(frame::encode)
        .chain(weft_testkit::corpus::inputs::saved("peer"))
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let mut rigs = 0u64;
    let mut rig = Rig::new(&plan, rigs);
    let mut handled = 0u64;
    let n = run("server-handlers", 2, |m: &mut Mutator| {
        // A fresh server now and then (and once every local rank was dropped).
        if m.below(400) == 0 || local.iter().all(|r| rig.st.job.procs.is_gone(*r)) {
            rigs += 1;
            rig = Rig::new(&plan, rigs);
        }
        match m.below(10) {
            0..=5 => {
                let rank = local[m.below(local.len())];
                let Some(conn) = rig.conn_of(rank) else {
                    return;
                };
                // Mostly frames that decode (the handlers are the target); now and
                // then one that does not (the client is dropped).
                let i = m.below(client.len());
                let mut bytes = client[i].clone();
                let want_bad = m.below(50) == 0;
                for _ in 0..8 {
                    let b = m.mutate(&client[i]);
                    if weft_testkit::corpus::is_client_frame(&b) != want_bad {
                        bytes = b;
                        break;
                    }
                }
                let mut r = &bytes[..];
                match frame::read_sync::<ClientMsg>(&mut r, frame::MAX_CLIENT_FRAME) {
                    Ok(msg) => {
                        handled += 1;
                        rig.st.handle(Event::Client { conn, msg });
                    }
                    // The real connection task drops a client whose frame is bad.
                    Err(e) => {
                        rig.live.retain(|(c, _)| *c != conn);
                        rig.st.handle(Event::ClientGone {
                            conn,
                            reason: e.to_string(),
                        });
                    }
                }
            }
            6..=8 => {
                let i = m.below(peer.len());
                let bytes = if m.below(4) == 0 {
                    peer[i].clone()
                } else {
                    m.mutate(&peer[i])
                };
                let mut r = &bytes[..];
                if let Ok(msg) = frame::read_sync::<PeerMsg>(&mut r, frame::MAX_PEER_FRAME) {
                    handled += 1;
                    rig.st.handle(Event::Peer { msg });
                }
            }
            _ => {
                let rank = m.below(6) as Rank;
                // Mostly the job's own namespace; now and then another, which changes nothing.
                let ns = if m.below(8) == 0 {
                    NsId(2)
                } else {
                    NsId::FIRST
                };
                let job = |ev| Event::Job { ns, ev };
                let ev = match m.below(5) {
                    0 => job(JobEvent::ChildExit {
                        rank,
                        how: ExitKind::Code(m.below(3) as i32),
                    }),
                    1 => job(JobEvent::GetTimeout {
                        rank,
                        conn: m.below(4) as ConnId,
                        req: m.below(16) as u64,
                    }),
                    2 => Event::PeerLost {
                        node: m.below(3) as u32,
                        reason: "fuzz".into(),
                    },
                    3 => job(JobEvent::ConnLostCheck { rank }),
                    _ => job(JobEvent::QueryTimeout {
                        qid: (m.next_u64() % 8) | (1 << 48),
                    }),
                };
                rig.st.handle(ev);
            }
        }
        rt.block_on(rig.settle());
    });
    println!(
        "fuzz server-handlers: {handled} decoded messages handled by {} servers",
        rigs + 1
    );
    assert!(n >= 16);
}

/// What the groups fuzz knows of one group id: how it is constructed, and which
/// members left it.
struct Planned {
    id: crate::wire::proto::CollId,
    directives: crate::wire::proto::GroupDirectives,
    /// Members that left (after they got the result).
    left: BTreeSet<Rank>,
}

/// Random constructs (strict and tolerant, with and without a leader and a PGCID),
/// deaths before and after joining, leaves, leadership claims and message orders among
/// three servers' groups (with their fences and leader selection). Then every living
/// member joins the construct it has not and everything is delivered: every request is
/// answered exactly once; every member got the same result; no PGCID is handed out
/// twice; every server that knows a group knows the same membership and leader, which
/// is the result less the members that left and, where termination is notified, died.
#[test]
fn fuzz_groups_answer_once_agree_everywhere_and_never_reuse_a_pgcid() {
    use super::groups::tests::{conn_of, Got, World};
    use crate::wire::proto::{CollId, CollKind, GroupDirectives, Procs, ServerMsg};

    const OWNERS: [u32; 6] = [0, 0, 1, 1, 2, 2];
    const GROUPS: usize = 3;
    let size = OWNERS.len() as Rank;
    let mut formed = 0usize;
    run("groups", 11, |m: &mut Mutator| {
        let mut w = World::new(&OWNERS);
        let mut plans: Vec<Planned> = (0..GROUPS)
            .map(|g| {
                let procs = match m.below(3) {
                    0 => Procs::All,
                    _ => {
                        let v: Vec<Rank> = (0..size).filter(|_| m.below(2) == 0).collect();
                        if v.is_empty() {
                            Procs::List(vec![m.below(size as usize) as Rank])
                        } else {
                            Procs::List(v)
                        }
                    }
                };
                let members = procs.ranks(size);
                let leader = (m.below(2) == 0).then(|| members[m.below(members.len())]);
                let directives = GroupDirectives {
                    leader,
                    notify_termination: m.below(2) == 0,
                    optional: m.below(4) == 0,
                    assign_context_id: m.below(2) == 0,
                    no_data: m.below(2) == 0,
                    ..GroupDirectives::default()
                };
                Planned {
                    id: CollId {
                        kind: CollKind::GroupConstruct,
                        procs,
                        seq: 0,
                        name: format!("g{g}"),
                    },
                    directives,
                    left: BTreeSet::new(),
                }
            })
            .collect();
        // Requests by (rank, req): what each asked.
        let mut asked: HashMap<(Rank, u64), &'static str> = HashMap::new();
        let mut arrived: BTreeSet<(Rank, usize)> = BTreeSet::new();
        let mut dead: BTreeSet<Rank> = BTreeSet::new();
        let mut next_req = 1u64;
        // (rank, group) pairs whose construct result reached the rank.
        let mut has: BTreeSet<(Rank, String)> = BTreeSet::new();
        for _ in 0..m.below(80) {
            let rank = m.below(size as usize) as Rank;
            let g = m.below(GROUPS);
            let p = &plans[g];
            let name = p.id.name.clone();
            let has_result = has.contains(&(rank, name.clone()));
            match m.below(9) {
                0..=2 => {
                    if dead.contains(&rank) || !p.id.procs.contains(rank) {
                        continue;
                    }
                    if !arrived.insert((rank, g)) {
                        continue;
                    }
                    asked.insert((rank, next_req), "construct");
                    w.request(rank, next_req, &p.id, &p.directives);
                    next_req += 1;
                }
                3 => {
                    if dead.len() < 2 && dead.insert(rank) {
                        w.kill(rank);
                    }
                }
                4 => {
                    if dead.contains(&rank) || !has_result || plans[g].left.contains(&rank) {
                        continue;
                    }
                    plans[g].left.insert(rank);
                    asked.insert((rank, next_req), "leave");
                    w.leave(rank, next_req, &name);
                    next_req += 1;
                }
                5 => {
                    if dead.contains(&rank) || !has_result || plans[g].left.contains(&rank) {
                        continue;
                    }
                    asked.insert((rank, next_req), "claim");
                    w.claim(rank, next_req, &name);
                    next_req += 1;
                }
                _ => {
                    w.step(m);
                }
            }
            // The first result of each construct, as it reaches its members.
            for (_, got) in &w.got {
                if let Got::Reply {
                    conn,
                    msg: ServerMsg::Group { group, .. },
                } = got
                {
                    if let Some(r) = (0..size).find(|&r| conn_of(r) == *conn) {
                        has.insert((r, group.id.clone()));
                    }
                }
            }
        }
        // Every living member joins what it has not; everything is delivered.
        for (g, p) in plans.iter().enumerate() {
            for rank in p.id.procs.ranks(size) {
                if !dead.contains(&rank) && arrived.insert((rank, g)) {
                    asked.insert((rank, next_req), "construct");
                    w.request(rank, next_req, &p.id, &p.directives);
                    next_req += 1;
                }
            }
        }
        w.settle();
        // Every request answered exactly once; every member got the same result.
        let mut answered: HashMap<(Rank, u64), usize> = HashMap::new();
        let mut results: HashMap<String, crate::wire::proto::GroupInfo> = HashMap::new();
        for (_, got) in &w.got {
            let Got::Reply { conn, msg } = got else {
                continue;
            };
            let rank = (0..size)
                .find(|&r| conn_of(r) == *conn)
                .expect("a rank's connection");
            let req = match msg {
                ServerMsg::Done { req } | ServerMsg::Failed { req, .. } => *req,
                ServerMsg::Group { req, group } => {
                    let first = results
                        .entry(group.id.clone())
                        .or_insert_with(|| group.clone());
                    assert_eq!(first, group, "two results of one construct");
                    *req
                }
                other => panic!("the groups answered {other:?}"),
            };
            assert!(
                asked.contains_key(&(rank, req)),
                "an answer to nothing: {msg:?}"
            );
            *answered.entry((rank, req)).or_default() += 1;
        }
        for (k, what) in &asked {
            assert_eq!(
                answered.get(k),
                Some(&1),
                "{what} {k:?} answered {:?} times",
                answered.get(k)
            );
        }
        // No PGCID twice.
        let pgcids: Vec<u64> = results.values().filter_map(|g| g.pgcid).collect();
        let distinct: BTreeSet<u64> = pgcids.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            pgcids.len(),
            "a PGCID handed out twice: {pgcids:?}"
        );
        // Every server that knows a group knows it alike, as the model says.
        for p in &plans {
            let Some(result) = results.get(&p.id.name) else {
                for n in 0..3 {
                    assert!(
                        w.group(n, &p.id.name).is_none(),
                        "a failed construct recorded"
                    );
                }
                continue;
            };
            formed += 1;
            let mut members = result.members.clone();
            members.retain(|r| {
                let dropped = p.directives.notify_termination && dead.contains(r);
                !p.left.contains(r) && !dropped
            });
            for n in 0..3u32 {
                let here = members.iter().any(|&r| OWNERS[r as usize] == n);
                match w.group(n, &p.id.name) {
                    Some(g) => {
                        assert_eq!(g.members, members, "node {n}'s {:?}", p.id.name);
                    }
                    None => assert!(
                        !here,
                        "node {n} forgot {:?} with members {members:?}",
                        p.id.name
                    ),
                }
            }
            let leaders: BTreeSet<Option<Rank>> = (0..3u32)
                .filter_map(|n| w.group(n, &p.id.name).map(|g| g.leader))
                .collect();
            assert!(
                leaders.len() <= 1,
                "{:?}: leaders differ: {leaders:?}",
                p.id.name
            );
        }
    });
    println!("fuzz groups: {formed} groups formed");
    assert!(formed > 0);
}
