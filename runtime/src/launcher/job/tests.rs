//! The job's decisions through its `on_*` methods only: no socket, process or timer.

use super::*;
use crate::launcher::plan::{build_plan, parse_run_args};

/// A job of `n` processes on `nodes` logical nodes (mapped by slot: with 2 nodes and 4
/// processes, ranks 0 and 1 on node 0, 2 and 3 on node 1).
pub(crate) fn info(nodes: u32, n: u32) -> JobInfo {
    let args: Vec<String> = format!("--nodes {nodes} -n {n} ./a")
        .split(' ')
        .map(String::from)
        .collect();
    build_plan(&parse_run_args(&args).expect("args"), "t")
        .expect("plan")
        .job
}

fn policy(keep_going: bool) -> EndPolicy {
    EndPolicy {
        timeout: Some(Duration::from_secs(7)),
        keep_going,
        grace: Duration::from_millis(250),
    }
}

fn job(nodes: u32, n: u32) -> Job {
    Job::new(info(nodes, n), policy(false))
}

fn reports(actions: &[Action]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Report(s) => Some(s.as_str()),
            _ => None,
        })
        .collect()
}

fn terminates(actions: &[Action]) -> bool {
    actions.contains(&Action::SendAll(ToServer::Terminate {
        grace_ms: KILL_AFTER.as_millis() as u64,
    })) && actions.contains(&Action::Arm(Timer::ForceKill, FORCE_KILL_AFTER))
}

fn shuts_down(actions: &[Action]) -> bool {
    actions.contains(&Action::SendAll(ToServer::Shutdown))
}

#[test]
fn every_process_exiting_0_shuts_the_servers_down_once_and_exits_0() {
    let mut j = job(2, 4);
    assert_eq!(
        j.timers(),
        vec![Action::Arm(Timer::Timeout, Duration::from_secs(7))]
    );
    for r in 0..3 {
        assert_eq!(j.on_proc_exit(r, ExitKind::Code(0)), vec![]);
    }
    // A repeated report of an ended rank does not count twice.
    assert_eq!(j.on_proc_exit(2, ExitKind::Code(0)), vec![]);
    assert_eq!(
        j.on_proc_exit(3, ExitKind::Code(0)),
        vec![Action::SendAll(ToServer::Shutdown)]
    );
    assert_eq!(j.on_proc_exit(3, ExitKind::Code(0)), vec![]);
    assert_eq!(j.exit_code(), 0);
    // Timers that fire after the end change nothing.
    assert_eq!(j.on_timer(Timer::Timeout), vec![]);
    assert_eq!(j.on_timer(Timer::GraceOver), vec![]);
    assert_eq!(j.exit_code(), 0);
}

#[test]
fn the_first_failure_is_reported_once_arms_the_grace_and_decides_the_exit_status() {
    let mut j = job(2, 4);
    let a = j.on_proc_exit(2, ExitKind::Code(3));
    assert_eq!(
        reports(&a),
        vec![format!(
            "weft run: rank 2 (node 1, {}) exited with code 3; terminating the job in 0.2 s",
            j.info.nodes[1].hostname
        )]
    );
    assert!(a.contains(&Action::Arm(Timer::GraceOver, Duration::from_millis(250))));
    // Not terminated yet: the others get the grace period to see the failure.
    assert!(!terminates(&a));
    // Several ranks fail: the first one's status stays, and nothing more is reported.
    assert_eq!(j.on_proc_exit(0, ExitKind::Code(5)), vec![]);
    assert_eq!(j.on_proc_exit(1, ExitKind::Signal(9)), vec![]);
    assert_eq!(j.exit_code(), 3);
    // The grace period ends with the others still running: they are terminated, and the
    // servers killed if that is not enough.
    assert!(terminates(&j.on_timer(Timer::GraceOver)));
    assert_eq!(j.on_timer(Timer::ForceKill), vec![Action::KillServers]);
    assert!(shuts_down(&j.on_proc_exit(3, ExitKind::Signal(15))));
    assert_eq!(j.exit_code(), 3);
}

#[test]
fn the_exit_status_of_a_killed_or_unstartable_first_failure() {
    let mut j = job(1, 2);
    j.on_proc_exit(1, ExitKind::Signal(9));
    j.on_proc_exit(0, ExitKind::Code(2));
    assert_eq!(j.exit_code(), 128 + 9);
    let mut j = job(1, 2);
    let a = j.on_proc_exit(0, ExitKind::SpawnFailed("no such file".into()));
    assert!(reports(&a)[0].contains("could not be started: no such file"));
    assert_eq!(j.exit_code(), 127);
}

#[test]
fn an_abort_from_one_rank_while_the_others_finish_ends_with_its_status() {
    let mut j = job(2, 4);
    assert!(!reports(&j.on_proc_exit(1, ExitKind::Code(6))).is_empty());
    // The others finish within the grace period: the job ends without a terminate.
    let mut all = Vec::new();
    for r in [0, 2, 3] {
        all.extend(j.on_proc_exit(r, ExitKind::Code(0)));
    }
    assert_eq!(all, vec![Action::SendAll(ToServer::Shutdown)]);
    assert_eq!(j.on_timer(Timer::GraceOver), vec![]);
    assert_eq!(j.exit_code(), 6);
}

#[test]
fn keep_going_reports_a_failure_but_neither_arms_the_grace_nor_terminates() {
    let mut j = Job::new(info(1, 3), policy(true));
    let a = j.on_proc_exit(0, ExitKind::Code(4));
    assert_eq!(reports(&a).len(), 1);
    assert!(reports(&a)[0].ends_with("exited with code 4"));
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(j.on_proc_exit(1, ExitKind::Code(0)), vec![]);
    assert!(shuts_down(&j.on_proc_exit(2, ExitKind::Code(0))));
    assert_eq!(j.exit_code(), 4);
}

#[test]
fn the_time_limit_terminates_the_rest_and_exits_124_over_a_failure() {
    let mut j = job(1, 4);
    j.on_proc_exit(0, ExitKind::Code(3));
    let a = j.on_timer(Timer::Timeout);
    assert_eq!(
        reports(&a),
        vec!["weft run: job timed out after 7.0 s; terminating 3 of 4 processes"]
    );
    assert!(terminates(&a));
    assert_eq!(j.exit_code(), EXIT_TIMEOUT);
}

#[test]
fn a_second_signal_terminates_at_once_and_the_first_decides_the_status() {
    let mut j = job(1, 2);
    let a = j.on_signal(2);
    assert_eq!(
        reports(&a),
        vec!["weft run: received SIGINT; terminating the job"]
    );
    assert!(terminates(&a));
    let a = j.on_signal(15);
    assert_eq!(
        a,
        vec![
            Action::Report("weft run: received SIGTERM; terminating the job".into()),
            Action::SendAll(ToServer::Terminate { grace_ms: 0 }),
        ]
    );
    // Killed processes after a signal are not "the first failure" reported.
    assert_eq!(j.on_proc_exit(0, ExitKind::Signal(15)), vec![]);
    assert!(shuts_down(&j.on_proc_exit(1, ExitKind::Signal(15))));
    assert_eq!(j.exit_code(), 128 + 2);
}

#[test]
fn a_signal_before_the_start_terminates_again_once_every_server_knows_the_job() {
    let mut j = job(2, 2);
    assert!(terminates(&j.on_signal(1)));
    assert!(terminates(&j.on_started()));
    let mut quiet = job(2, 2);
    assert_eq!(quiet.on_started(), vec![]);
}

#[test]
fn a_server_lost_ends_its_ranks_terminates_the_job_and_exits_1() {
    let mut j = job(2, 4);
    j.on_proc_exit(0, ExitKind::Code(0));
    let a = j.on_server_lost(1, "connection reset");
    assert_eq!(
        reports(&a),
        vec![format!(
            "weft run: the server of node 1 ({}) ended unexpectedly: connection reset",
            j.info.nodes[1].hostname
        )]
    );
    assert!(terminates(&a));
    assert!(!shuts_down(&a));
    // Ranks 2 and 3 ended with their server; rank 1 is the last.
    assert!(shuts_down(&j.on_proc_exit(1, ExitKind::Signal(15))));
    assert_eq!(j.exit_code(), EXIT_LAUNCH_FAILED);
}

#[test]
fn a_server_lost_after_every_process_ended_changes_nothing() {
    let mut j = job(2, 2);
    j.on_proc_exit(0, ExitKind::Code(0));
    j.on_proc_exit(1, ExitKind::Code(0));
    assert_eq!(j.on_server_lost(0, "eof"), vec![]);
    assert_eq!(j.exit_code(), 0);
}

#[test]
fn a_server_failure_terminates_once_and_exits_1_even_after_a_process_failure() {
    let mut j = job(2, 2);
    j.on_proc_exit(0, ExitKind::Code(9));
    let a = j.on_server_failed(1, "cannot bind");
    assert_eq!(
        reports(&a),
        vec!["weft run: the server of node 1 failed: cannot bind"]
    );
    // Already terminating (the grace period runs): no second terminate.
    assert!(!terminates(&a));
    let mut j = job(2, 2);
    assert!(terminates(&j.on_server_failed(0, "x")));
    assert!(!terminates(&j.on_server_failed(1, "y")));
    assert_eq!(j.exit_code(), EXIT_LAUNCH_FAILED);
}
