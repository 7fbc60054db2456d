//! The processes driven through their `on_*` methods: how each kind of end is told,
//! once, and a fuzz of two servers' processes checking it.

use std::collections::HashMap;
use std::time::Duration;

use rustix::process::Signal;
use weft_fuzz::{run, Mutator};
use weft_wireup::{Rank, FINALIZED};

use super::{Action, Processes, Timer, ABORT_GRACE, EXIT_STATUS_WAIT};
use crate::wire::proto::{Event as WireEvent, EventCode, ExitKind};

/// Node 0 of a 4-rank job on 2 nodes: ranks 0 and 1 here (tokens 10 and 11), started
/// as pids 100 and 101.
fn node0() -> Processes {
    let mut p = Processes::new(0, 4, [(0, 10), (1, 11)]);
    p.on_spawned(0, Some(100));
    p.on_spawned(1, Some(101));
    p
}

fn ended(rank: Rank, reason: &str, finalized: bool) -> Action {
    Action::Ended {
        rank,
        reason: reason.into(),
        finalized,
    }
}

/// Carries out the `Ended` actions as the server does (it records the end).
fn record(p: &mut Processes, acts: &[Action]) {
    for a in acts {
        if let Action::Ended { rank, reason, .. } = a {
            assert!(p.on_ended(*rank, reason), "rank {rank} ended twice");
        }
    }
}

#[test]
fn a_process_that_finalizes_at_exit_and_exits_0_has_finalized() {
    let mut p = node0();
    assert!(p.on_finalize(0, true).is_empty(), "its exit status decides");
    let acts = p.on_child_exit(0, ExitKind::Code(0));
    assert_eq!(
        acts,
        vec![
            ended(0, FINALIZED, true),
            Action::Report {
                rank: 0,
                how: ExitKind::Code(0)
            }
        ]
    );
    record(&mut p, &acts);
    assert_eq!(p.live(), 1);
    assert_eq!(p.why_gone(0), Some(FINALIZED));
    // A second exit status (it cannot come, but a duplicate must not count twice).
    assert!(p.on_child_exit(0, ExitKind::Code(0)).is_empty());
    assert_eq!(p.live(), 1);
}

#[test]
fn a_finalize_not_at_exit_ends_the_process_at_once_and_its_exit_is_only_reported() {
    let mut p = node0();
    let acts = p.on_finalize(1, false);
    assert_eq!(acts, vec![ended(1, FINALIZED, true)]);
    record(&mut p, &acts);
    assert!(p.on_finalize(1, false).is_empty(), "it ended once");
    let acts = p.on_child_exit(1, ExitKind::Code(3));
    let report = Action::Report {
        rank: 1,
        how: ExitKind::Code(3),
    };
    assert_eq!(acts, vec![report]);
}

#[test]
fn a_non_zero_exit_and_a_kill_are_failures_with_their_cause() {
    let mut p = node0();
    let acts = p.on_child_exit(0, ExitKind::Code(3));
    assert_eq!(
        acts[0],
        ended(0, "exited with code 3 before finalize", false)
    );
    record(&mut p, &acts);
    // Killed after a finalize at exit: the signal, not "finalized".
    assert!(p.on_finalize(1, true).is_empty());
    let acts = p.on_child_exit(1, ExitKind::Signal(9));
    assert_eq!(acts[0], ended(1, &ExitKind::Signal(9).describe(), false));
    record(&mut p, &acts);
    // A non-zero code after a finalize at exit is told as the exit kind says.
    let mut q = node0();
    q.on_finalize(0, true);
    let acts = q.on_child_exit(0, ExitKind::Code(2));
    assert_eq!(acts[0], ended(0, &ExitKind::Code(2).describe(), false));
    assert_eq!(q.live(), 1);
    assert!(!p.all_gone(), "ranks 2 and 3 of node 1 have not ended");
    assert!(p.on_ended(2, "exited with code 1 before finalize"));
    assert!(p.on_ended(3, FINALIZED));
    assert!(p.all_gone());
    assert!(!p.on_ended(3, FINALIZED), "an end is recorded once");
}

#[test]
fn a_lost_connection_of_a_running_child_waits_for_its_exit_status() {
    let mut p = node0();
    p.on_hello(0, 10, 5).expect("hello");
    let acts = p.on_conn_closed(0, "");
    let timer = Timer::ConnLost(0);
    let wait = Action::Timer {
        after: EXIT_STATUS_WAIT,
        timer,
    };
    assert_eq!(acts, vec![wait]);
    // The exit status arrives first: it tells.
    let acts = p.on_child_exit(0, ExitKind::Signal(11));
    assert_eq!(acts[0], ended(0, &ExitKind::Signal(11).describe(), false));
    record(&mut p, &acts);
    assert!(
        p.on_conn_lost_check(0).is_empty(),
        "the check finds it ended"
    );
    // No exit status in time: lost while running.
    p.on_hello(1, 11, 6).expect("hello");
    assert_eq!(p.on_conn_closed(1, "").len(), 1);
    let acts = p.on_conn_lost_check(1);
    let why = "lost its connection to the server (the process is still running)";
    assert_eq!(acts, vec![ended(1, why, false)]);
    record(&mut p, &acts);
    let acts = p.on_child_exit(1, ExitKind::Code(0));
    assert_eq!(acts.len(), 1, "only reported: {acts:?}");
}

#[test]
fn a_lost_connection_after_a_finalize_at_exit_has_finalized() {
    let mut p = node0();
    p.on_hello(0, 10, 5).expect("hello");
    p.on_finalize(0, true);
    assert_eq!(p.on_conn_closed(0, "").len(), 1);
    assert_eq!(p.on_conn_lost_check(0), vec![ended(0, FINALIZED, true)]);
    // A PMI process finalizing at exit the same way.
    p.on_finalize_at_exit(1);
    assert_eq!(p.on_conn_lost_check(1), vec![ended(1, FINALIZED, true)]);
}

#[test]
fn a_connection_dropped_by_the_server_or_of_a_process_not_ours_ends_it_at_once() {
    let mut p = node0();
    p.on_hello(0, 10, 5).expect("hello");
    let acts = p.on_conn_closed(0, "it sent a second hello");
    let why = "was dropped by its server: it sent a second hello";
    assert_eq!(acts, vec![ended(0, why, false)]);
    // Rank 1's process was not started by this server (no pid).
    let mut q = Processes::new(0, 2, [(1, 11)]);
    q.on_hello(1, 11, 7).expect("hello");
    let why = "lost its connection to the server before finalize";
    assert_eq!(q.on_conn_closed(1, ""), vec![ended(1, why, false)]);
    // Another node's rank: nothing here.
    assert!(q.on_conn_closed(0, "").is_empty());
}

#[test]
fn an_abort_is_killed_after_its_grace_and_reported_with_its_code() {
    let mut p = node0();
    let grace = Action::Timer {
        after: ABORT_GRACE,
        timer: Timer::AbortGrace(0),
    };
    assert_eq!(p.on_abort(0, 7), vec![grace]);
    let kill = Action::Kill {
        pid: 100,
        sig: Signal::KILL,
    };
    assert_eq!(p.on_abort_grace_over(0), vec![kill]);
    let acts = p.on_child_exit(0, ExitKind::Signal(9));
    let why = "exited with code 7 before finalize";
    let report = Action::Report {
        rank: 0,
        how: ExitKind::Code(7),
    };
    assert_eq!(acts, vec![ended(0, why, false), report]);
    // One that exits 0 within its grace, though it finalized at exit before: its code.
    p.on_finalize(1, true);
    p.on_abort(1, 4);
    let acts = p.on_child_exit(1, ExitKind::Code(0));
    assert_eq!(
        acts[0],
        ended(1, "exited with code 4 before finalize", false)
    );
    assert!(p.on_abort_grace_over(1).is_empty(), "it exited: no kill");
}

#[test]
fn a_hello_needs_a_local_rank_its_token_one_connection_and_a_running_process() {
    let mut p = node0();
    let e = |n: u32| WireEvent {
        code: EventCode::MemberFailed,
        group: Some("g".into()),
        rank: Some(n),
        pset: None,
        members: vec![0, 1, n],
        reason: format!("event {n}"),
        proc: None,
    };
    // An event before the hello waits for it; after it, it goes to the connection.
    assert_eq!(p.on_event(0, &e(1)), None);
    assert_eq!(
        p.on_hello(2, 12, 4),
        Err("rank 2 does not run on node 0".into())
    );
    assert_eq!(p.on_hello(0, 11, 4), Err("wrong token for rank 0".into()));
    assert_eq!(p.on_hello(0, 10, 4), Ok(vec![e(1)]));
    assert_eq!(
        p.on_hello(0, 10, 5),
        Err("rank 0 is already connected".into())
    );
    assert_eq!(p.on_event(0, &e(2)), Some(4));
    let acts = p.on_finalize(1, false);
    record(&mut p, &acts);
    assert_eq!(p.on_event(1, &e(3)), None, "not kept for a gone rank");
    assert_eq!(
        p.on_hello(1, 11, 6),
        Err("rank 1 has already finalized or died".into())
    );
}

#[test]
fn a_termination_sends_term_then_kill_to_the_running_processes() {
    let mut p = node0();
    let acts = p.on_child_exit(1, ExitKind::Code(0));
    record(&mut p, &acts);
    assert!(!p.terminating());
    let acts = p.on_terminate(Duration::from_millis(300));
    let term = Action::Kill {
        pid: 100,
        sig: Signal::TERM,
    };
    let timer = Action::Timer {
        after: Duration::from_millis(300),
        timer: Timer::KillNow,
    };
    assert_eq!(acts, vec![term, timer]);
    assert!(p.terminating());
    let kill = Action::Kill {
        pid: 100,
        sig: Signal::KILL,
    };
    assert_eq!(p.on_kill_now(), vec![kill]);
    assert_eq!(p.unreaped(), vec![0]);
    // A server at its end: a start reported only now is killed; a reaped one is done.
    let mut q = Processes::new(0, 4, [(0, 10)]);
    let kill = Action::Kill {
        pid: 9,
        sig: Signal::KILL,
    };
    assert_eq!(q.on_reap_spawned(0, Some(9)), vec![kill]);
    q.on_reaped(0);
    assert!(q.unreaped().is_empty());
}

/// Two servers' processes (ranks 0 and 1 on node 0, 2 and 3 on node 1) fed random
/// inputs, each server's `Ended` relayed to both as the servers do: every rank ends
/// once everywhere, its exit is reported once and after its end, a kill never targets
/// an exited process, an abort is a failure (reported with a non-zero code, and not
/// finalized unless the rank finalized after it), `live` counts
/// the exits not reported, and the job has ended everywhere exactly when every rank
/// has; at the end every process exits and the job has ended.
#[test]
fn fuzz_procs_each_process_ends_once_and_the_job_ends_when_all_have() {
    run("procs", 11, |m: &mut Mutator| {
        let on = |r: Rank| (r / 2) as usize;
        let mut s = [
            Processes::new(0, 4, [(0, 10), (1, 11)]),
            Processes::new(1, 4, [(2, 12), (3, 13)]),
        ];
        let mut ends: HashMap<Rank, (String, bool)> = HashMap::new();
        let mut reports: HashMap<Rank, ExitKind> = HashMap::new();
        let mut aborted: HashMap<Rank, i32> = HashMap::new();
        let mut pending: Vec<(Rank, Timer)> = Vec::new();
        let mut next_conn = 1;
        let apply = |s: &mut [Processes; 2],
                     acts: Vec<Action>,
                     ends: &mut HashMap<Rank, (String, bool)>,
                     reports: &mut HashMap<Rank, ExitKind>,
                     pending: &mut Vec<(Rank, Timer)>,
                     node: usize| {
            for a in acts {
                match a {
                    Action::Ended {
                        rank,
                        reason,
                        finalized,
                    } => {
                        assert_eq!(on(rank), node, "only a rank's own server ends it");
                        assert_eq!(finalized, reason == FINALIZED, "{reason}");
                        assert!(ends.insert(rank, (reason.clone(), finalized)).is_none());
                        for p in s.iter_mut() {
                            assert!(p.on_ended(rank, &reason), "rank {rank} ended twice");
                        }
                    }
                    Action::Report { rank, how } => {
                        assert!(reports.insert(rank, how).is_none(), "reported twice");
                        assert!(ends.contains_key(&rank), "reported before it ended");
                    }
                    Action::Kill { pid, .. } => {
                        let r = (pid - 100) as Rank;
                        assert!(!reports.contains_key(&r), "killed after its exit");
                    }
                    Action::Timer { timer, .. } => pending.push((node as Rank, timer)),
                }
            }
        };
        let steps = 1 + m.below(40);
        for _ in 0..steps {
            let r = m.below(4) as Rank;
            let n = on(r);
            let acts = match m.below(12) {
                0 => {
                    s[n].on_spawned(r, Some(100 + r));
                    Vec::new()
                }
                1 => {
                    let conn = next_conn;
                    next_conn += 1;
                    let _ = s[n].on_hello(r, 10 + r as u64, conn);
                    Vec::new()
                }
                2 => {
                    aborted.remove(&r);
                    s[n].on_finalize(r, m.below(2) == 0)
                }
                3 => {
                    aborted.remove(&r);
                    s[n].on_finalize_at_exit(r);
                    Vec::new()
                }
                4 => {
                    let code = 1 + m.below(5) as i32;
                    if !reports.contains_key(&r) && !ends.contains_key(&r) {
                        aborted.insert(r, code);
                    }
                    s[n].on_abort(r, code)
                }
                5 => s[n].on_conn_closed(r, if m.below(4) == 0 { "bad frame" } else { "" }),
                6 | 7 => {
                    let how = match m.below(3) {
                        0 => ExitKind::Code(0),
                        1 => ExitKind::Code(m.below(4) as i32),
                        _ => ExitKind::Signal(9),
                    };
                    s[n].on_child_exit(r, how)
                }
                8 => s[n].on_terminate(Duration::from_millis(10)),
                9 => s[n].on_kill_now(),
                _ => match pending.is_empty() {
                    true => Vec::new(),
                    false => {
                        let (node, t) = pending.swap_remove(m.below(pending.len()));
                        let p = &mut s[node as usize];
                        let acts = match t {
                            Timer::ConnLost(r) => p.on_conn_lost_check(r),
                            Timer::AbortGrace(r) => p.on_abort_grace_over(r),
                            Timer::KillNow => p.on_kill_now(),
                        };
                        apply(
                            &mut s,
                            acts,
                            &mut ends,
                            &mut reports,
                            &mut pending,
                            node as usize,
                        );
                        Vec::new()
                    }
                },
            };
            apply(&mut s, acts, &mut ends, &mut reports, &mut pending, n);
            for (i, p) in s.iter().enumerate() {
                let reported = (0..4).filter(|r| on(*r) == i && reports.contains_key(r));
                assert_eq!(p.live(), 2 - reported.count());
                assert_eq!(p.all_gone(), ends.len() == 4);
                for r in 0..4 {
                    assert_eq!(p.is_gone(r), ends.contains_key(&r));
                }
            }
        }
        // Every process exits at last: the job has ended on both servers.
        for r in 0..4 {
            let n = on(r);
            let acts = s[n].on_child_exit(r, ExitKind::Signal(9));
            apply(&mut s, acts, &mut ends, &mut reports, &mut pending, n);
        }
        assert!(s.iter().all(|p| p.all_gone() && p.live() == 0));
        assert_eq!(reports.len(), 4);
        for (r, code) in aborted {
            // An abort is a failure (unless the rank finalized after it): its code
            // unless the process failed otherwise.
            assert_ne!(
                reports[&r],
                ExitKind::Code(0),
                "rank {r} aborted with {code}"
            );
            assert!(!ends[&r].1, "rank {r} aborted and did not finalize since");
        }
    });
}
