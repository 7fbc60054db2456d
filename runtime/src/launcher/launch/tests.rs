use super::*;
use crate::launcher::job::tests::info;
use crate::wire::proto::DebugSpawn;
use weft_wireup::SpawnApp;

/// The plan of a job of `n` processes on `nodes` nodes.
pub(crate) fn plan(nodes: u32, n: u32) -> JobPlan {
    JobPlan {
        job: info(nodes, n),
        ns: NsId::FIRST,
        apps: Vec::new(),
        tag_output: false,
        bind: vec![None; n as usize],
        datastore_bytes: 1 << 20,
        job_id: "t".into(),
        env: Vec::new(),
        pmix: false,
        pmi_preput: None,
        parent: None,
        forward_output: false,
        stop_in_init: false,
        debug_job: None,
    }
}

pub(super) fn launch(nodes: u32, n: u32) -> Launch {
    Launch::new(
        plan(nodes, n),
        EndPolicy {
            timeout: None,
            keep_going: false,
            grace: Duration::from_millis(100),
        },
    )
}

/// Rank `r` of the launch's job.
fn own(r: u32) -> ProcId {
    ProcId::new(NsId::FIRST, r)
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

pub(super) fn start(l: &mut Launch, nodes: u32) -> Vec<Action> {
    let mut out = Vec::new();
    for node in 0..nodes {
        assert_eq!(l.on_hello(node), vec![Action::SendPlan(node)]);
    }
    for node in 0..nodes {
        out.extend(l.on_ready(node, addr(10 + node as u16)));
    }
    out
}

#[test]
fn a_job_that_ends_well_starts_once_shuts_down_and_is_over_when_every_server_is_gone() {
    let mut l = launch(2, 2);
    assert_eq!(
        l.timers(),
        vec![Action::Arm(Timer::StartupTimeout, SERVER_START_TIMEOUT)]
    );
    assert_eq!(
        start(&mut l, 2),
        vec![Action::SendAll(ToServer::Start {
            peers: vec![addr(10), addr(11)]
        })]
    );
    assert!(l.started());
    assert_eq!(l.on_timer(Timer::StartupTimeout), vec![]);
    assert_eq!(l.on_proc_exit(own(0), ExitKind::Code(0)), vec![]);
    // Rank 1 of another namespace is not the job's rank 1: the job goes on.
    let other = ProcId::new(NsId(2), 1);
    assert_eq!(l.on_proc_exit(other, ExitKind::Code(0)), vec![]);
    assert_eq!(
        l.on_proc_exit(own(1), ExitKind::Code(0)),
        vec![Action::SendAll(ToServer::Shutdown)]
    );
    // The servers then end: each reports twice (connection, process), silently.
    for node in 0..2 {
        assert!(!l.is_over());
        assert_eq!(l.on_server_lost(node, "eof"), vec![]);
        assert_eq!(l.on_server_lost(node, "exit status: 0"), vec![]);
    }
    assert!(l.is_over());
    assert_eq!(l.exit_code(), 0);
}

#[test]
fn a_server_lost_before_hello_fails_the_launch_once_and_the_others_are_terminated() {
    let mut l = launch(2, 2);
    let a = l.on_server_lost(1, "exit status: 127");
    assert_eq!(a.len(), 3, "{a:?}");
    assert!(matches!(&a[0], Action::Report(s) if s.contains("node 1") && s.contains("127")));
    assert_eq!(l.on_server_lost(1, "exit status: 127"), vec![]);
    // Node 0 still comes up: it is started, and told to terminate at once.
    assert_eq!(l.on_hello(0), vec![Action::SendPlan(0)]);
    let a = l.on_ready(0, addr(10));
    assert!(matches!(&a[0], Action::SendAll(ToServer::Start { peers }) if peers.len() == 2));
    assert!(a.contains(&Action::Arm(
        Timer::ForceKill,
        super::super::job::FORCE_KILL_AFTER
    )));
    assert!(!l.is_over());
    l.on_server_lost(0, "eof");
    assert!(l.is_over());
    assert_eq!(l.exit_code(), crate::launcher::EXIT_LAUNCH_FAILED);
}

#[test]
fn the_startup_timeout_kills_the_servers_and_exits_1_only_before_the_start() {
    let mut l = launch(3, 3);
    l.on_hello(0);
    l.on_ready(0, addr(10));
    let a = l.on_timer(Timer::StartupTimeout);
    assert_eq!(
        a,
        vec![
            Action::Report(
                "weft run: only 1 of 3 servers started within 60 s (SERVER_START_TIMEOUT); giving up"
                    .into()
            ),
            Action::KillServers,
        ]
    );
    assert_eq!(l.exit_code(), crate::launcher::EXIT_LAUNCH_FAILED);
    let mut ok = launch(1, 1);
    start(&mut ok, 1);
    assert_eq!(ok.on_timer(Timer::StartupTimeout), vec![]);
    assert_eq!(ok.exit_code(), 0);
}

#[test]
fn a_server_lost_after_the_start_ends_its_ranks_and_the_job_ends_when_the_rest_have() {
    let mut l = launch(2, 4);
    start(&mut l, 2);
    l.on_proc_exit(own(0), ExitKind::Code(0));
    l.on_proc_exit(own(1), ExitKind::Code(0));
    let a = l.on_server_lost(1, "connection reset");
    // Node 1's ranks (2, 3) count as ended: every process has, so shut down now.
    assert!(a.contains(&Action::SendAll(ToServer::Shutdown)), "{a:?}");
    assert_eq!(l.exit_code(), crate::launcher::EXIT_LAUNCH_FAILED);
}

/// A request for `np` processes of `prog` (no arguments, environment or directory), with
/// a debugger's directives `debug`.
pub(super) fn one_app(prog: &str, np: u32, debug: DebugSpawn) -> SpawnReq {
    let app = SpawnApp {
        program: prog.into(),
        args: Vec::new(),
        np,
        env: Vec::new(),
        cwd: None,
    };
    SpawnReq {
        apps: vec![app],
        pmi_preput: None,
        session: None,
        separate: false,
        debug,
    }
}

/// Spawn `np` processes of `prog` from rank 0 of the launch's job on `node`.
fn spawn(l: &mut Launch, node: u32, qid: u64, prog: &str, np: u32) -> Vec<Action> {
    let mut req = one_app(prog, np, DebugSpawn::default());
    req.apps[0].args = vec!["x".into()];
    req.apps[0].env = vec![("K".into(), "V".into())];
    l.on_spawn(node, qid, own(0), &req)
}

/// The plan the actions send to every server.
pub(super) fn launched_plan(acts: &[Action]) -> JobPlan {
    match acts {
        [Action::SendAll(ToServer::Launch(p))] => (**p).clone(),
        other => panic!("expected one launch order, got {other:?}"),
    }
}

#[test]
fn a_spawn_is_planned_sent_to_every_server_and_answered_once_all_set_it_up() {
    let mut l = launch(2, 2);
    start(&mut l, 2);
    let p = launched_plan(&spawn(&mut l, 1, 7, "/bin/child", 3));
    assert_eq!(p.ns, NsId(2));
    assert_eq!(p.job.nspace, format!("{}.2", l.plan.job.nspace));
    assert_eq!(p.job_id, "t.2");
    assert_eq!(
        p.job.nspace,
        format!("weft-{}", p.job_id),
        "segments named alike"
    );
    assert_eq!(p.job.size(), 3);
    assert_eq!(p.job.nodes, l.plan.job.nodes, "every node of the runtime");
    // The parent's last process runs on node 1: the children go there.
    let nodes: Vec<u32> = p.job.procs.iter().map(|pr| pr.node).collect();
    assert_eq!(
        nodes,
        vec![1, 1, 1],
        "continuing from the parent's last node"
    );
    assert_eq!(
        p.job
            .procs
            .iter()
            .map(|pr| pr.local_rank)
            .collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(p.apps[0].env, vec![("K".to_owned(), "V".to_owned())]);
    assert_ne!(p.job.world_pgcid, l.plan.job.world_pgcid);
    // A second spawn gets the next namespace and its own world.
    let q = launched_plan(&spawn(&mut l, 0, 8, "/bin/other", 1));
    assert_eq!(q.ns, NsId(3));
    assert_ne!(q.job.world_pgcid, p.job.world_pgcid);
    // Answered once both servers said so, to the asker's server only.
    assert_eq!(l.on_launched(0, NsId(2), None, true), vec![]);
    assert_eq!(
        l.on_launched(1, NsId(2), None, true),
        vec![Action::SpawnDone {
            node: 1,
            qid: 7,
            result: Ok((NsId(2), p.job.nspace.clone())),
        }]
    );
    assert_eq!(
        l.on_launched(1, NsId(2), None, true),
        vec![],
        "answered once"
    );
}

#[test]
fn a_spawn_a_server_could_not_set_up_fails_naming_it_and_its_job_is_terminated() {
    let mut l = launch(2, 2);
    start(&mut l, 2);
    spawn(&mut l, 0, 4, "/nope", 2);
    assert_eq!(
        l.on_launched(1, NsId(2), Some("rank 0: cannot start /nope".into()), true),
        vec![]
    );
    assert_eq!(
        l.on_launched(0, NsId(2), None, true),
        vec![
            Action::SendAll(ToServer::TerminateJob {
                ns: NsId(2),
                grace_ms: 0
            }),
            Action::SpawnDone {
                node: 0,
                qid: 4,
                result: Err("node 1: rank 0: cannot start /nope".into()),
            },
        ]
    );
}

#[test]
fn bad_spawns_are_refused_at_once() {
    let mut l = launch(1, 1);
    let refused = |a: &[Action]| matches!(a, [Action::SpawnDone { result: Err(_), .. }]);
    // Before the job started, no spawn.
    assert!(refused(&spawn(&mut l, 0, 1, "/bin/true", 1)));
    start(&mut l, 1);
    assert!(refused(&spawn(&mut l, 0, 2, "/bin/true", 0)));
    assert!(refused(&spawn(&mut l, 0, 3, "", 1)));
    let none = SpawnReq {
        apps: Vec::new(),
        pmi_preput: None,
        session: None,
        separate: false,
        debug: Default::default(),
    };
    assert!(refused(&l.on_spawn(0, 4, own(0), &none)));
    assert!(refused(&spawn(&mut l, 0, 5, "/bin/true", u32::MAX)));
    // Nothing was planned: the next good spawn is namespace 2.
    assert_eq!(
        launched_plan(&spawn(&mut l, 0, 6, "/bin/true", 1)).ns,
        NsId(2)
    );
}

#[test]
fn the_servers_shut_down_once_the_job_and_what_it_spawned_have_ended() {
    let mut l = launch(1, 2);
    start(&mut l, 1);
    spawn(&mut l, 0, 1, "/bin/child", 2);
    l.on_launched(0, NsId(2), None, true);
    assert_eq!(l.on_proc_exit(own(0), ExitKind::Code(0)), vec![]);
    // The job ends first: the servers stay for its children.
    assert_eq!(l.on_proc_exit(own(1), ExitKind::Code(0)), vec![]);
    let child = |r| ProcId::new(NsId(2), r);
    assert_eq!(l.on_proc_exit(child(0), ExitKind::Code(0)), vec![]);
    assert_eq!(
        l.on_proc_exit(child(1), ExitKind::Code(0)),
        vec![
            Action::SendAll(ToServer::EndJob { ns: NsId(2) }),
            Action::SendAll(ToServer::Shutdown)
        ]
    );
    assert_eq!(l.exit_code(), 0);
    // No spawn once the job has ended.
    assert!(matches!(
        &spawn(&mut l, 0, 2, "/bin/true", 1)[..],
        [Action::SpawnDone { result: Err(_), .. }]
    ));
}

#[test]
fn a_spawned_job_that_fails_is_terminated_alone_and_the_exit_status_stays_the_jobs() {
    let mut l = launch(1, 1);
    start(&mut l, 1);
    spawn(&mut l, 0, 1, "/bin/child", 2);
    l.on_launched(0, NsId(2), None, true);
    let a = l.on_proc_exit(ProcId::new(NsId(2), 1), ExitKind::Code(3));
    assert!(
        matches!(&a[0], Action::Report(s) if s.starts_with("weft run: spawned job ")
            && s.contains(".2: rank 1 (node 0") && s.contains("exited with code 3")),
        "{a:?}"
    );
    assert!(a.contains(&Action::ArmJob(
        NsId(2),
        Timer::GraceOver,
        Duration::from_secs(1)
    )));
    // Its grace ends: only it is terminated.
    assert_eq!(
        l.on_job_timer(NsId(2), Timer::GraceOver),
        vec![
            Action::SendAll(ToServer::TerminateJob {
                ns: NsId(2),
                grace_ms: 500
            }),
            Action::ArmJob(
                NsId(2),
                Timer::ForceKill,
                super::super::job::FORCE_KILL_AFTER
            )
        ]
    );
    // Its force-kill backstop kills no server.
    assert_eq!(l.on_job_timer(NsId(2), Timer::ForceKill), vec![]);
    l.on_proc_exit(ProcId::new(NsId(2), 0), ExitKind::Signal(15));
    assert_eq!(
        l.on_proc_exit(own(0), ExitKind::Code(0)),
        vec![Action::SendAll(ToServer::Shutdown)]
    );
    assert_eq!(l.exit_code(), 0, "the first job's status");
}

#[test]
fn the_time_limit_ends_what_the_job_spawned_after_the_job_ended() {
    let mut l = Launch::new(
        plan(1, 1),
        EndPolicy {
            timeout: Some(Duration::from_secs(5)),
            keep_going: false,
            grace: Duration::from_millis(100),
        },
    );
    start(&mut l, 1);
    spawn(&mut l, 0, 1, "/bin/sleeper", 1);
    l.on_launched(0, NsId(2), None, true);
    assert_eq!(l.on_proc_exit(own(0), ExitKind::Code(0)), vec![]);
    let a = l.on_timer(Timer::Timeout);
    assert!(
        matches!(&a[0], Action::Report(s) if s.contains("timed out")),
        "{a:?}"
    );
    assert!(a.contains(&Action::SendAll(ToServer::Terminate { grace_ms: 500 })));
    // Its end after the terminate is no failure of its own.
    assert_eq!(
        l.on_proc_exit(ProcId::new(NsId(2), 0), ExitKind::Signal(15)),
        vec![
            Action::SendAll(ToServer::EndJob { ns: NsId(2) }),
            Action::SendAll(ToServer::Shutdown)
        ]
    );
    assert_eq!(l.exit_code(), crate::launcher::EXIT_TIMEOUT);
}

#[test]
fn a_spawn_waiting_for_a_lost_server_fails_naming_it() {
    let mut l = launch(2, 2);
    start(&mut l, 2);
    spawn(&mut l, 0, 9, "/bin/child", 1);
    assert_eq!(l.on_launched(0, NsId(2), None, true), vec![]);
    let a = l.on_server_lost(1, "eof");
    let done = a.iter().find_map(|a| match a {
        Action::SpawnDone {
            node: 0,
            qid: 9,
            result,
        } => Some(result.clone()),
        _ => None,
    });
    assert_eq!(
        done,
        Some(Err("node 1: the server of node 1 was lost: eof".into())),
        "{a:?}"
    );
}

#[test]
fn a_spawned_job_no_server_could_set_up_ends_and_lets_the_runtime_end() {
    let mut l = launch(1, 1);
    start(&mut l, 1);
    spawn(&mut l, 0, 3, "/bin/child", 2);
    // The datastore could not be made: no process of the job started.
    let a = l.on_launched(0, NsId(2), Some("datastore full".into()), false);
    assert!(
        a.contains(&Action::SpawnDone {
            node: 0,
            qid: 3,
            result: Err("node 0: datastore full".into()),
        }),
        "{a:?}"
    );
    assert!(
        a.contains(&Action::SendAll(ToServer::EndJob { ns: NsId(2) })),
        "{a:?}"
    );
    // The job's end is not held back by it.
    assert_eq!(
        l.on_proc_exit(own(0), ExitKind::Code(0)),
        vec![Action::SendAll(ToServer::Shutdown)]
    );
    // Nor does a late report of it count.
    assert_eq!(
        l.on_proc_exit(ProcId::new(NsId(2), 0), ExitKind::Code(0)),
        vec![]
    );
}

/// A persistent runtime of `nodes` nodes, started.
fn dvm(nodes: u32) -> Launch {
    let spec = crate::launcher::LaunchSpec {
        nodes,
        ..Default::default()
    };
    let base = crate::launcher::plan::runtime_plan(&spec, "t").unwrap();
    let mut l = Launch::new_dvm(base);
    start(&mut l, nodes);
    l
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

/// Submitter `sub` submits `args`; every server sets the job up; returns its plan and
/// the actions of the last server's answer.
fn submit(l: &mut Launch, sub: u64, args: &str) -> (JobPlan, Vec<Action>) {
    let env = vec![
        ("HOME".to_owned(), "/h".to_owned()),
        ("V".to_owned(), "1".to_owned()),
    ];
    let p = launched_plan(&l.on_submit(sub, &words(args), "/work", env));
    let n = l.nodes.num_nodes();
    for node in 0..n - 1 {
        assert_eq!(l.on_launched(node, p.ns, None, true), vec![]);
    }
    let acts = l.on_launched(n - 1, p.ns, None, true);
    (p, acts)
}

#[test]
fn a_submitted_job_runs_on_the_runtimes_nodes_and_its_end_and_status_go_to_its_submitter() {
    let mut l = dvm(2);
    let (p, acts) = submit(&mut l, 7, "--timeout 9 -x V -n 3 /bin/prog a");
    assert_eq!(p.ns, NsId(2));
    assert_eq!(p.job.nspace, "weft-t.2");
    assert_eq!(p.job.nodes.len(), 2);
    assert_eq!(
        p.job.procs.iter().map(|pr| pr.node).collect::<Vec<_>>(),
        vec![0, 0, 1]
    );
    assert!(p.forward_output);
    assert_eq!(p.apps[0].cwd.as_deref(), Some("/work"));
    // The submitter's environment, then -x V (its value from the submitter's).
    assert!(p.env.contains(&("HOME".to_owned(), "/h".to_owned())));
    assert!(p.env.contains(&("V".to_owned(), "1".to_owned())));
    assert_eq!(
        acts,
        vec![
            Action::Tell(
                7,
                FromController::Accepted {
                    ns: NsId(2),
                    nspace: "weft-t.2".into()
                }
            ),
            Action::ArmJob(NsId(2), Timer::Timeout, Duration::from_secs(9)),
        ]
    );
    assert!(l
        .table()
        .contains("job 2  weft-t.2  running  3/3 processes running  submitted  /bin/prog a"));
    // Its output goes to its submitter; a job nobody owns prints here.
    assert_eq!(
        l.on_output(NsId(2), 0, true, b"x\n".to_vec()),
        vec![Action::Tell(
            7,
            FromController::Output {
                stderr: true,
                bytes: b"x\n".to_vec()
            }
        )]
    );
    assert_eq!(
        l.on_output(NsId(9), 0, false, b"y".to_vec()),
        vec![Action::Output {
            stderr: false,
            bytes: b"y".to_vec()
        }]
    );
    let p2 = |r| ProcId::new(NsId(2), r);
    l.on_proc_exit(p2(0), ExitKind::Code(0));
    l.on_proc_exit(p2(1), ExitKind::Code(0));
    let a = l.on_proc_exit(p2(2), ExitKind::Code(5));
    assert!(
        matches!(&a[0], Action::Tell(7, FromController::Report(r)) if r.contains("rank 2") && r.contains("code 5")),
        "{a:?}"
    );
    assert!(
        a.contains(&Action::SendAll(ToServer::EndJob { ns: NsId(2) })),
        "{a:?}"
    );
    assert!(
        a.contains(&Action::Tell(7, FromController::JobEnd { code: 5 })),
        "{a:?}"
    );
    // The runtime stays: no shutdown, and the next job is namespace 3.
    assert!(!a.contains(&Action::SendAll(ToServer::Shutdown)));
    assert_eq!(submit(&mut l, 8, "-n 1 /bin/true").0.ns, NsId(3));
}

#[test]
fn bad_submissions_are_refused_naming_what_was_wrong() {
    let mut l = dvm(2);
    let refused = |a: Vec<Action>, what: &str| match &a[..] {
        [Action::Tell(_, FromController::Error(e))] => assert!(e.contains(what), "{e}"),
        other => panic!("{other:?}"),
    };
    refused(
        l.on_submit(1, &words("--nodes 3 -n 3 /bin/x"), "/", vec![]),
        "the runtime has 2 nodes",
    );
    refused(
        l.on_submit(1, &words("--hosts a,b -n 2 /bin/x"), "/", vec![]),
        "--hosts is an option of `weft dvm start`",
    );
    refused(
        l.on_submit(1, &words("-n 0 /bin/x"), "/", vec![]),
        "at least 1",
    );
    // One job per submitter.
    submit(&mut l, 1, "-n 1 /bin/x");
    refused(
        l.on_submit(1, &words("-n 1 /bin/x"), "/", vec![]),
        "submitted a job already",
    );
    // A plain `weft run` takes none.
    let mut plain = launch(1, 1);
    start(&mut plain, 1);
    refused(
        plain.on_submit(1, &words("-n 1 /bin/x"), "/", vec![]),
        "takes no submitted job",
    );
    // Nor does a runtime that lost a server.
    l.on_server_lost(1, "eof");
    refused(
        l.on_submit(2, &words("-n 1 /bin/x"), "/", vec![]),
        "node 1 was lost",
    );
}

#[test]
fn a_submitter_that_leaves_or_signals_takes_its_job_and_a_kill_names_a_job() {
    let mut l = dvm(1);
    let (a, _) = submit(&mut l, 1, "-n 1 /bin/a");
    let (b, _) = submit(&mut l, 2, "-n 1 /bin/b");
    let gone = l.on_submitter_gone(1);
    assert!(
        gone.contains(&Action::SendAll(ToServer::TerminateJob {
            ns: a.ns,
            grace_ms: 500
        })),
        "{gone:?}"
    );
    // Its reports now go to the runtime's own stderr.
    assert!(
        matches!(&gone[0], Action::Report(r) if r.contains("submitter is gone")),
        "{gone:?}"
    );
    let sig = l.on_submitter_signal(2, 2);
    assert!(
        sig.contains(&Action::SendAll(ToServer::TerminateJob {
            ns: b.ns,
            grace_ms: 500
        })),
        "{sig:?}"
    );
    let end = l.on_proc_exit(ProcId::new(b.ns, 0), ExitKind::Signal(15));
    assert!(
        end.contains(&Action::Tell(2, FromController::JobEnd { code: 130 })),
        "{end:?}"
    );
    assert!(
        matches!(&l.on_kill(3, "nope", 15)[..], [Action::Tell(3, FromController::Error(e))] if e.contains("no job \"nope\""))
    );
    let (c, _) = submit(&mut l, 4, "-n 1 /bin/c");
    let k = l.on_kill(3, &c.job.nspace, 9);
    assert!(
        k.contains(&Action::Tell(
            3,
            FromController::Text(format!("terminating job {}\n", c.ns.0))
        )),
        "{k:?}"
    );
    let end = l.on_proc_exit(ProcId::new(c.ns, 0), ExitKind::Signal(15));
    assert!(
        end.contains(&Action::Tell(4, FromController::JobEnd { code: 137 })),
        "{end:?}"
    );
}

#[test]
fn stopping_ends_every_job_then_the_servers_and_a_lost_server_fails_only_its_jobs() {
    let mut l = dvm(2);
    let (on1, _) = submit(&mut l, 1, "--nodes 2 -n 2 /bin/a");
    let (on0, _) = submit(&mut l, 2, "--nodes 1 -n 1 /bin/b");
    let lost = l.on_server_lost(1, "killed");
    assert!(
        matches!(&lost[0], Action::Report(r) if r.contains("node 1") && r.contains("killed")),
        "{lost:?}"
    );
    assert!(
        lost.contains(&Action::SendAll(ToServer::TerminateJob {
            ns: on1.ns,
            grace_ms: 500
        })),
        "{lost:?}"
    );
    assert!(
        !lost.iter().any(
            |a| matches!(a, Action::SendAll(ToServer::TerminateJob { ns, .. }) if *ns == on0.ns)
        ),
        "{lost:?}"
    );
    let end = l.on_proc_exit(ProcId::new(on1.ns, 0), ExitKind::Signal(15));
    assert!(
        end.contains(&Action::Tell(
            1,
            FromController::JobEnd {
                code: crate::launcher::EXIT_LAUNCH_FAILED
            }
        )),
        "{end:?}"
    );
    // Stop: the job left is terminated, the servers shut down once it ended.
    let stop = l.on_stop();
    assert!(
        stop.contains(&Action::SendAll(ToServer::TerminateJob {
            ns: on0.ns,
            grace_ms: 500
        })),
        "{stop:?}"
    );
    assert!(!stop.contains(&Action::SendAll(ToServer::Shutdown)));
    assert_eq!(l.on_stop(), vec![], "once");
    let end = l.on_proc_exit(ProcId::new(on0.ns, 0), ExitKind::Signal(15));
    assert!(
        end.contains(&Action::Tell(2, FromController::JobEnd { code: 143 })),
        "{end:?}"
    );
    assert!(
        end.contains(&Action::SendAll(ToServer::Shutdown)),
        "{end:?}"
    );
    // An idle runtime shuts down at once.
    let mut idle = dvm(1);
    assert_eq!(idle.on_stop(), vec![Action::SendAll(ToServer::Shutdown)]);
}

#[test]
fn a_submitter_hears_of_its_jobs_end_once_what_it_spawned_has_ended_and_gets_their_output() {
    let mut l = dvm(1);
    let (p, _) = submit(&mut l, 3, "-n 1 /bin/parent");
    let req = one_app("/bin/child", 1, DebugSpawn::default());
    let c = launched_plan(&l.on_spawn(0, 1, ProcId::new(p.ns, 0), &req));
    assert_eq!(c.env, p.env, "the parent's environment");
    assert!(c.forward_output);
    l.on_launched(0, c.ns, None, true);
    assert_eq!(
        l.on_output(c.ns, 0, false, b"c".to_vec()),
        vec![Action::Tell(
            3,
            FromController::Output {
                stderr: false,
                bytes: b"c".to_vec()
            }
        )]
    );
    let a = l.on_proc_exit(ProcId::new(p.ns, 0), ExitKind::Code(0));
    assert_eq!(a, vec![Action::SendAll(ToServer::EndJob { ns: p.ns })]);
    let a = l.on_proc_exit(ProcId::new(c.ns, 0), ExitKind::Code(0));
    assert_eq!(
        a,
        vec![
            Action::SendAll(ToServer::EndJob { ns: c.ns }),
            Action::Tell(3, FromController::JobEnd { code: 0 })
        ]
    );
}

#[test]
fn job_control_terminates_whole_jobs_and_signals_processes_through_the_servers() {
    const PMIX: &str = "PMIx_Job_control";
    let mut l = launch(2, 2);
    start(&mut l, 2);
    spawn(&mut l, 0, 1, "/bin/child", 2);
    l.on_launched(0, NsId(2), None, true);
    l.on_launched(1, NsId(2), None, true);
    // A rank paused, a namespace signalled: one signal order to every server.
    let a = l.on_job_control(
        own(0),
        &[(NsId(2), Some(1)), (NsId::FIRST, None)],
        JobAction::Pause,
        PMIX,
    );
    assert_eq!(
        a,
        vec![Action::SendAll(ToServer::Signal {
            procs: vec![(NsId(2), Some(1)), (NsId::FIRST, None)],
            sig: 19
        })]
    );
    // A namespace that runs no more is skipped.
    assert_eq!(
        l.on_job_control(own(0), &[(NsId(9), None)], JobAction::Kill, PMIX),
        vec![]
    );
    // The child job terminated as a whole, naming who asked; its status is 143.
    let a = l.on_job_control(own(1), &[(NsId(2), None)], JobAction::Terminate, PMIX);
    assert!(
        matches!(&a[0], Action::Report(r) if r.contains("terminated by rank 1 of") && r.contains("PMIx_Job_control")),
        "{a:?}"
    );
    assert!(
        a.contains(&Action::SendAll(ToServer::TerminateJob {
            ns: NsId(2),
            grace_ms: 500
        })),
        "{a:?}"
    );
    // Its own job: the launch's exit status is 143.
    let a = l.on_job_control(
        own(0),
        &[(NsId::FIRST, None)],
        JobAction::Terminate,
        "job control",
    );
    assert!(
        a.contains(&Action::SendAll(ToServer::Terminate { grace_ms: 500 })),
        "{a:?}"
    );
    assert_eq!(l.exit_code(), 143);
}

#[test]
fn a_terminated_job_takes_what_it_spawned_unless_separated() {
    let mut l = launch(1, 1);
    start(&mut l, 1);
    let spawn_from = |l: &mut Launch, qid: u64, from: ProcId, separate: bool| {
        let req = SpawnReq {
            apps: vec![SpawnApp {
                program: "/bin/x".into(),
                args: Vec::new(),
                np: 1,
                env: Vec::new(),
                cwd: None,
            }],
            pmi_preput: None,
            session: None,
            separate,
            debug: Default::default(),
        };
        let ns = launched_plan(&l.on_spawn(0, qid, from, &req)).ns;
        l.on_launched(0, ns, None, true);
        ns
    };
    let child = spawn_from(&mut l, 1, own(0), false);
    let grandchild = spawn_from(&mut l, 2, ProcId::new(child, 0), false);
    let apart = spawn_from(&mut l, 3, ProcId::new(child, 0), true);
    let a = l.on_job_control(
        own(0),
        &[(child, None)],
        JobAction::Terminate,
        "PMIx_Job_control",
    );
    let terminated: Vec<NsId> = (a.iter())
        .filter_map(|a| match a {
            Action::SendAll(ToServer::TerminateJob { ns, .. }) => Some(*ns),
            _ => None,
        })
        .collect();
    assert_eq!(terminated, vec![child, grandchild], "{a:?}");
    assert!(
        a.iter().any(|a| matches!(a, Action::Report(r) if r.contains("its parent job") && r.contains(".2 was terminated"))),
        "{a:?}"
    );
    assert!(!terminated.contains(&apart));
}

#[test]
fn the_first_jobs_end_ends_its_sessions_and_their_jobs() {
    let mut l = launch(2, 2);
    start(&mut l, 2);
    let req = AllocReq {
        op: AllocOp::New,
        nodes: Some(1),
        alloc_id: Some("A".into()),
        req_id: None,
        session: None,
        separate: false,
    };
    let a = l.on_alloc(0, 1, own(0), &req);
    assert!(
        matches!(&a[0], Action::AllocDone { node: 0, qid: 1, result: Ok(s) } if s.id == 1 && s.nodes == vec![0]),
        "{a:?}"
    );
    let sreq = SpawnReq {
        apps: vec![SpawnApp {
            program: "/bin/x".into(),
            args: Vec::new(),
            np: 1,
            env: Vec::new(),
            cwd: None,
        }],
        pmi_preput: None,
        session: Some(SessionSel::AllocId("A".into())),
        separate: false,
        debug: Default::default(),
    };
    let p = launched_plan(&l.on_spawn(0, 2, own(0), &sreq));
    l.on_launched(0, p.ns, None, true);
    l.on_launched(1, p.ns, None, true);
    // A spawn from the job in the session that names none runs in that session too (on
    // its node 0; outside it, it would continue on node 1).
    let inner = SpawnReq {
        session: None,
        ..sreq.clone()
    };
    let q = launched_plan(&l.on_spawn(0, 3, ProcId::new(p.ns, 0), &inner));
    assert!(q.job.procs.iter().all(|pr| pr.node == 0), "{q:?}");
    l.on_launched(0, q.ns, None, true);
    l.on_launched(1, q.ns, None, true);
    // The job ends: its session ends, the jobs in it are terminated, the servers wait.
    assert_eq!(l.on_proc_exit(own(1), ExitKind::Code(0)), vec![]);
    let a = l.on_proc_exit(own(0), ExitKind::Code(0));
    assert!(a.iter().any(|a| matches!(a, Action::SendAll(ToServer::AllocEvent { session: Some(s), .. }) if !s.active)), "{a:?}");
    assert!(
        a.contains(&Action::SendAll(ToServer::TerminateJob {
            ns: p.ns,
            grace_ms: 500
        })),
        "{a:?}"
    );
    assert!(
        a.contains(&Action::SendAll(ToServer::TerminateJob {
            ns: q.ns,
            grace_ms: 500
        })),
        "{a:?}"
    );
    assert!(!a.contains(&Action::SendAll(ToServer::Shutdown)), "{a:?}");
    let a = l.on_proc_exit(ProcId::new(p.ns, 0), ExitKind::Signal(15));
    assert!(!a.contains(&Action::SendAll(ToServer::Shutdown)), "{a:?}");
    let a = l.on_proc_exit(ProcId::new(q.ns, 0), ExitKind::Signal(15));
    assert!(a.contains(&Action::SendAll(ToServer::Shutdown)), "{a:?}");
    assert_eq!(l.exit_code(), 0);
}

#[test]
fn a_spawn_outside_sessions_continues_from_the_parents_last_node() {
    // Ranks 0, 1 on node 0 and 2, 3 on node 1: rank 0 (node 0) asks, the children run on
    // node 1, where the parent's last process runs.
    let mut l = launch(2, 4);
    start(&mut l, 2);
    let p = launched_plan(&spawn(&mut l, 0, 1, "/bin/child", 3));
    let nodes: Vec<u32> = p.job.procs.iter().map(|pr| pr.node).collect();
    assert_eq!(nodes, vec![1, 1, 1]);
    // A spawned job's own spawn continues from its last node: node 1 again, whichever
    // node asks.
    l.on_launched(0, p.ns, None, true);
    l.on_launched(1, p.ns, None, true);
    let req = SpawnReq {
        apps: vec![SpawnApp {
            program: "/bin/grandchild".into(),
            args: vec![],
            np: 2,
            env: vec![],
            cwd: None,
        }],
        pmi_preput: None,
        session: None,
        separate: false,
        debug: Default::default(),
    };
    let g = launched_plan(&l.on_spawn(0, 2, ProcId::new(p.ns, 2), &req));
    assert!(g.job.procs.iter().all(|pr| pr.node == 1), "{g:?}");
    // A job of one node keeps its children there.
    let mut one = launch(1, 1);
    start(&mut one, 1);
    let q = launched_plan(&spawn(&mut one, 0, 1, "/bin/child", 3));
    assert!(q.job.procs.iter().all(|pr| pr.node == 0));
}
