//! A PMIx tool's spawns, decided without IO: where its job and its debugger daemons go,
//! and what the tool is told (the job's end, its output).

use super::tests::{launch, launched_plan, one_app, start};
use super::*;
use crate::wire::proto::DebugSpawn;

/// A PMIx tool's spawn of `np` processes of `prog` with `debug`, through the server of
/// node 0 (request `qid`).
fn tool_spawn(l: &mut Launch, qid: u64, np: u32, debug: DebugSpawn) -> Vec<Action> {
    l.on_tool_spawn(
        0,
        qid,
        ("tool.1".into(), 0),
        &one_app("/bin/prog", np, debug),
    )
}

#[test]
fn a_tools_job_spreads_over_the_nodes_its_daemons_go_one_per_node_of_their_target_and_the_tool_hears_of_the_end(
) {
    let mut l = launch(3, 3);
    start(&mut l, 3);
    // The application: held in init, spread over the runtime's nodes, no parent.
    let held = DebugSpawn {
        stop_in_init: true,
        ..Default::default()
    };
    let app = launched_plan(&tool_spawn(&mut l, 1, 2, held));
    assert!(app.stop_in_init);
    assert_eq!(app.parent, None);
    assert_eq!(app.debug_job, None);
    let nodes = |p: &JobPlan| p.job.procs.iter().map(|pr| pr.node).collect::<Vec<_>>();
    assert_eq!(nodes(&app), vec![0, 1]);
    for node in 0..3 {
        l.on_launched(node, app.ns, None, true);
    }
    // Its daemons: one per node of the application, whatever the app asked (0), each
    // told its target; the tool asked to hear of their end.
    let daemons = DebugSpawn {
        daemons_for: Some(app.job.nspace.clone()),
        notify_completion: true,
        ..Default::default()
    };
    let d = launched_plan(&tool_spawn(&mut l, 2, 0, daemons.clone()));
    assert_eq!(nodes(&d), vec![0, 1]);
    assert_eq!(d.debug_job.as_deref(), Some(app.job.nspace.as_str()));
    assert!(!d.stop_in_init);
    // Two per node of the runtime.
    let ppr = DebugSpawn {
        per_node: Some(2),
        ..Default::default()
    };
    let p = launched_plan(&tool_spawn(&mut l, 3, 1, ppr));
    assert_eq!(nodes(&p), vec![0, 0, 1, 1, 2, 2]);
    // Daemons for a job that does not run are refused, naming it.
    let lost = DebugSpawn {
        daemons_for: Some("nope.9".into()),
        ..daemons
    };
    match tool_spawn(&mut l, 4, 0, lost).as_slice() {
        [Action::SpawnDone {
            result: Err(why), ..
        }] => assert!(why.contains("nope.9"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The daemons end: the tool's server (node 0) is told, with the exit status.
    for node in 0..3 {
        l.on_launched(node, d.ns, None, true);
    }
    assert!(l
        .on_proc_exit(ProcId::new(d.ns, 0), ExitKind::Code(0))
        .is_empty());
    let end = l.on_proc_exit(ProcId::new(d.ns, 1), ExitKind::Code(0));
    assert!(
        end.contains(&Action::Send(
            0,
            ToServer::JobTerminated {
                to: ("tool.1".into(), 0),
                nspace: d.job.nspace.clone(),
                code: 0,
            }
        )),
        "{end:?}"
    );
    // A tool's job whose stderr it asked for: each line goes to the tool's server with
    // its rank, and to the runtime's own output; its stdout only to the latter.
    let fwd = DebugSpawn {
        forward_stderr: true,
        ..Default::default()
    };
    let f = launched_plan(&tool_spawn(&mut l, 5, 1, fwd));
    assert!(
        f.forward_output,
        "its servers send its output to the launcher"
    );
    assert_eq!(
        l.on_output(f.ns, 0, true, b"e\n".to_vec()),
        vec![
            Action::Send(
                0,
                ToServer::ToolOutput {
                    nspace: f.job.nspace.clone(),
                    rank: 0,
                    stderr: true,
                    bytes: b"e\n".to_vec(),
                }
            ),
            Action::Output {
                stderr: true,
                bytes: b"e\n".to_vec()
            },
        ]
    );
    assert_eq!(
        l.on_output(f.ns, 0, false, b"o\n".to_vec()),
        vec![Action::Output {
            stderr: false,
            bytes: b"o\n".to_vec()
        }]
    );
    // The application's end is told to nobody (no PMIX_NOTIFY_COMPLETION).
    l.on_proc_exit(ProcId::new(app.ns, 0), ExitKind::Code(0));
    let end = l.on_proc_exit(ProcId::new(app.ns, 1), ExitKind::Code(0));
    assert!(
        !end.iter().any(|a| matches!(a, Action::Send(..))),
        "{end:?}"
    );
}
