//! The persistent runtime (issue 33): `weft dvm start`, jobs submitted with
//! `weft run --dvm`, `weft ps`, `weft kill`, `weft dvm stop`, for real (servers, processes,
//! sockets, shared memory).

mod common;
use common::*;

use std::time::{Duration, Instant};

/// The processes of the jobs (not their submitters, whose command lines hold the same
/// words): `sleep`s whose duration contains `marker`.
fn sleepers(marker: &str) -> Vec<u32> {
    pids_whose("cmdline", |c| c.starts_with("sleep ") && c.contains(marker))
}

/// Waits until every server of the runtime has set up each of its jobs (none is
/// "starting" in `weft ps`) and it runs `jobs` jobs.
fn all_running(dvm: &Dvm, jobs: usize) -> String {
    let t0 = Instant::now();
    loop {
        let (code, ps, err) = dvm.ctl(&["ps"], &[]);
        assert_eq!(code, Some(0), "{err}");
        if ps.lines().filter(|l| l.starts_with("job ")).count() == jobs && !ps.contains("starting")
        {
            return ps;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{ps}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until no process of a job whose marker is `marker` is left (a bounded time);
/// returns the ones still there.
fn gone_within(marker: &str, limit: Duration) -> Vec<u32> {
    let t0 = Instant::now();
    loop {
        let left = sleepers(marker);
        if left.is_empty() || t0.elapsed() > limit {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Jobs one after another and at once in a 2-node runtime: a Weft program's output comes
/// back to its submitter, which exits with the job's status; a failing job fails alone;
/// the processes run in the submitter's directory with its environment (and `-x`); the
/// servers keep nothing of ended jobs, and `weft dvm stop` leaves nothing.
#[test]
fn jobs_run_one_after_another_and_at_once_and_a_failing_one_fails_alone() {
    let dvm = Dvm::start("dvm-jobs", &["--nodes", "2"]);
    let ring = example("ring");
    for round in 0..2 {
        let d = dvm
            .submit(&["-n", "4", &ring])
            .wait(Duration::from_secs(60));
        assert_eq!(d.code(), Some(0), "round {round}: {}", d.dump());
        assert_eq!(d.lines_with("ring ok"), 1, "{}", d.dump());
    }
    // At once: a ring, a job that fails, and one that prints its environment.
    let a = dvm.submit(&["-n", "2", &ring, "--laps", "50"]);
    let b = dvm.submit(&["-n", "2", "sh", "-c", "sleep 0.2; exit 3"]);
    let c = dvm.submit(&[
        "-x",
        "WEFT_TEST_X=x1",
        "-n",
        "3",
        "sh",
        "-c",
        "echo \"env $WEFT_RANK $WEFT_TEST_X $HOME $(pwd)\"",
    ]);
    let (a, b, c) = (
        a.wait(Duration::from_secs(60)),
        b.wait(Duration::from_secs(60)),
        c.wait(Duration::from_secs(60)),
    );
    assert_eq!(a.code(), Some(0), "{}", a.dump());
    assert_eq!(a.lines_with("ring ok"), 1, "{}", a.dump());
    assert_eq!(b.code(), Some(3), "{}", b.dump());
    assert!(
        b.stderr.contains("exited with code 3"),
        "the failure is reported to its submitter: {}",
        b.dump()
    );
    assert!(!a.stderr.contains("code 3"), "{}", a.dump());
    assert_eq!(c.code(), Some(0), "{}", c.dump());
    let home = std::env::var("HOME").unwrap_or_default();
    let cwd = std::env::current_dir().unwrap().display().to_string();
    for r in 0..3 {
        let want = format!("env {r} x1 {home} {cwd}");
        assert_eq!(c.lines_with(&want), 1, "{want}\n{}", c.dump());
    }
    // No job is left in the table, and its segments are gone.
    let (code, ps, err) = dvm.ctl(&["ps"], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(ps.contains("node 1"), "{ps}");
    assert!(!ps.contains("job "), "{ps}");
    let (code, ls, err) = dvm.ctl(&["session", "ls"], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(ls, "session 0  the runtime's nodes  nodes [0, 1]\n");
    let t0 = Instant::now();
    while segments_of(&dvm.name).iter().any(|s| s.contains('.')) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "ended jobs' segments stay: {:?}",
            segments_of(&dvm.name)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, err) = dvm.stop();
    assert_eq!(code, Some(0), "{err}");
}

/// `weft ps` lists a running job and its processes; `weft kill` ends it (its submitter
/// exits 128+N); a submitter killed with SIGKILL takes its job with it; `--timeout`
/// works as with `weft run`; `weft dvm stop` terminates a job still running (143).
#[test]
fn ps_kill_a_vanished_submitter_the_time_limit_and_stop_end_jobs() {
    let dvm = Dvm::start("dvm-ctl", &["--nodes", "2"]);
    // Each job's processes are `sleep` for a duration no other test uses: their marker.
    let marker = format!("100.{}", std::process::id());
    let a = dvm.submit(&["-n", "2", "sleep", &format!("{marker}1")]);
    let t0 = Instant::now();
    let ps = loop {
        let (code, ps, err) = dvm.ctl(&["ps"], &[]);
        assert_eq!(code, Some(0), "{err}");
        if ps.contains("2/2 processes running") {
            break ps;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{ps}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(ps.contains(&format!("submitted  sleep {marker}1")), "{ps}");
    assert!(ps.contains("rank 0  node 0  running"), "{ps}");
    assert!(ps.contains("rank 1  node 1  running"), "{ps}");
    let job = ps
        .lines()
        .find_map(|l| l.strip_prefix("job "))
        .and_then(|l| l.split_whitespace().next())
        .expect("a job line")
        .to_owned();
    let (code, _, err) = dvm.ctl(&["kill"], &["--signal", "9", "nope"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no job \"nope\""), "{err}");
    let (code, out, err) = dvm.ctl(&["kill"], &[&job]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(&format!("terminating job {job}")), "{out}");
    let d = a.wait(Duration::from_secs(30));
    assert_eq!(d.code(), Some(143), "{}", d.dump());
    assert!(d.stderr.contains("killed (weft kill)"), "{}", d.dump());
    assert_eq!(
        gone_within(&format!("{marker}1"), Duration::from_secs(5)),
        Vec::<u32>::new()
    );

    // A submitter that vanishes.
    let b = dvm.submit(&["-n", "2", "sleep", &format!("{marker}2")]);
    let t0 = Instant::now();
    while sleepers(&format!("{marker}2")).len() < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the job did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = rustix::process::Pid::from_raw(b.pid() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    let _ = b.wait(Duration::from_secs(5));
    assert_eq!(
        gone_within(&format!("{marker}2"), Duration::from_secs(5)),
        Vec::<u32>::new(),
        "the job of a vanished submitter is terminated"
    );

    // The time limit.
    let d = dvm
        .submit(&["--timeout", "1", "-n", "1", "sleep", "60"])
        .wait(Duration::from_secs(30));
    assert_eq!(d.code(), Some(124), "{}", d.dump());
    assert!(d.stderr.contains("timed out"), "{}", d.dump());

    // Stop with a job running: it is terminated, its submitter told.
    let c = dvm.submit(&["-n", "1", "sleep", &format!("{marker}3")]);
    while sleepers(&format!("{marker}3")).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "the job did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, err) = dvm.stop();
    assert_eq!(code, Some(0), "{err}");
    let d = c.wait(Duration::from_secs(30));
    assert_eq!(d.code(), Some(143), "{}", d.dump());
    assert!(d.stderr.contains("the runtime is stopping"), "{}", d.dump());
    assert_eq!(
        gone_within(&marker, Duration::from_secs(5)),
        Vec::<u32>::new()
    );
}

/// A server of a 2-node runtime killed: the job with processes on its node fails naming
/// it, a job on the other node finishes, and the runtime takes no new job (naming the
/// lost server) until it is stopped.
#[test]
fn a_lost_server_fails_only_the_jobs_on_its_node() {
    let dvm = Dvm::start("dvm-lost", &["--nodes", "2"]);
    let marker = format!("101.{}", std::process::id());
    let a = dvm.submit(&["--nodes", "2", "-n", "2", "sleep", &marker]);
    let on0 = format!("2.{}", std::process::id());
    let b = dvm.submit(&[
        "--nodes",
        "1",
        "-n",
        "1",
        "sh",
        "-c",
        &format!("sleep {on0}; echo survivor"),
    ]);
    // Both jobs run (each was set up on both servers) before the server is killed.
    all_running(&dvm, 2);
    let servers = pids_whose("cmdline", |c| {
        c.contains(" server ") && c.contains(&dvm.name) && c.contains("--node 1 ")
    });
    assert_eq!(servers.len(), 1, "{servers:?}");
    let pid = rustix::process::Pid::from_raw(servers[0] as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    let d = a.wait(Duration::from_secs(30));
    assert_eq!(d.code(), Some(1), "{}", d.dump());
    assert!(d.stderr.contains("server of node 1"), "{}", d.dump());
    let d = b.wait(Duration::from_secs(30));
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    assert_eq!(d.lines_with("survivor"), 1, "{}", d.dump());
    let d = dvm
        .submit(&["-n", "1", "true"])
        .wait(Duration::from_secs(30));
    assert_eq!(d.code(), Some(1), "{}", d.dump());
    assert!(d.stderr.contains("node 1 was lost"), "{}", d.dump());
    let (code, err) = dvm.stop();
    assert_eq!(code, Some(0), "{err}");
    // The process on the killed server's node outlives it (a server killed with SIGKILL
    // cannot end its processes; a known limit): at most that one is left, and it goes.
    let left = gone_within(&marker, Duration::from_secs(5));
    assert!(left.len() <= 1, "{left:?}");
    for pid in left {
        let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// Clear errors: no runtime named (and no `weft run` job to ask), a URI nobody listens
/// at, a wrong secret, an option of `weft dvm start` given to a job.
#[test]
fn submitters_get_clear_errors() {
    // A TMPDIR of its own: no other test's `weft run` job is found there.
    let empty = std::env::temp_dir().join(format!("dvm-errors-none-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let o = std::process::Command::new(weft())
        .args(["ps"])
        .env_remove("WEFT_DVM")
        .env("TMPDIR", &empty)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&empty);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("give --dvm URI or set WEFT_DVM"));
    let dvm = Dvm::start("dvm-errors", &[]);
    let good = std::fs::read_to_string(&dvm.uri).unwrap();
    let bad = format!(
        "{}0000000000000000-0000000000000000",
        &good[..good.find("?s=").unwrap() + 3]
    );
    let o = std::process::Command::new(weft())
        .args(["ps", "--dvm", &bad])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("wrong secret"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let d = dvm
        .submit(&["--hosts", "a", "-n", "1", "true"])
        .wait(Duration::from_secs(30));
    assert_eq!(d.code(), Some(1), "{}", d.dump());
    assert!(
        d.stderr
            .contains("--hosts is an option of `weft dvm start`"),
        "{}",
        d.dump()
    );
    let d = dvm
        .submit(&["--nodes", "2", "-n", "2", "true"])
        .wait(Duration::from_secs(30));
    assert!(d.stderr.contains("the runtime has 1 node"), "{}", d.dump());
    let (code, err) = dvm.stop();
    assert_eq!(code, Some(0), "{err}");
    let o = std::process::Command::new(weft())
        .args(["ps", "--dvm", good.trim()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot reach the runtime"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The scheduling state of process `pid` (`/proc/PID/stat`'s third field: `T` stopped).
fn state_of(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command (second field) is in parentheses and may hold spaces.
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .unwrap_or('?')
}

/// Waits (bounded) until every process in `pids` is in a state `want` accepts.
fn wait_state(pids: &[u32], want: impl Fn(char) -> bool) -> Vec<char> {
    let t0 = Instant::now();
    loop {
        let states: Vec<char> = pids.iter().map(|&p| state_of(p)).collect();
        if states.iter().all(|&s| want(s)) || t0.elapsed() > Duration::from_secs(10) {
            return states;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `weft session new|ls|pause|resume|end` and `weft run --dvm --session`: a session made
/// from the command line holds free nodes, a job submitted into it runs on its nodes
/// only, pause and resume stop and continue its processes, and ending it ends its jobs.
#[test]
fn sessions_are_made_run_in_paused_resumed_and_ended_from_the_command_line() {
    let dvm = Dvm::start("dvm-sess", &["--nodes", "3"]);
    let new = |args: &[&str]| dvm.ctl(&["session", "new"], args);
    let (code, out, err) = new(&["--nodes", "1", "--alloc-id", "a"]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "session 1  a  nodes [0]\n"),
        "{err}"
    );
    let (code, out, err) = new(&["--nodes", "2", "--alloc-id", "grp"]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "session 2  grp  nodes [1, 2]\n"),
        "{err}"
    );
    let (code, _, err) = new(&[]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("weft session new: 1 node asked for, 0 free of the runtime's 3"),
        "{err}"
    );
    let (code, out, err) = dvm.ctl(&["session", "ls"], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("session 2  grp  nodes [1, 2]  made by weft session new"),
        "{out}"
    );

    // A job in the session runs on its nodes: 4 processes, 2 on each of nodes 1 and 2.
    let d = dvm
        .submit(&[
            "--session",
            "grp",
            "-n",
            "4",
            "sh",
            "-c",
            "echo node $WEFT_NODE",
        ])
        .wait(Duration::from_secs(30));
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    let mut nodes: Vec<&str> = d.stdout.lines().collect();
    nodes.sort();
    assert_eq!(
        nodes,
        ["node 1", "node 1", "node 2", "node 2"],
        "{}",
        d.dump()
    );
    let (code, out, err) = dvm.ctl(&["run"], &["--session", "nope", "-n", "1", "true"]);
    assert_ne!(code, Some(0), "{out}");
    assert!(err.contains("--session nope: no such session"), "{err}");
    let plain = std::process::Command::new(weft())
        .args(["run", "--session", "grp", "-n", "1", "true"])
        .env_remove("WEFT_DVM")
        .output()
        .expect("weft run");
    let err = String::from_utf8_lossy(&plain.stderr);
    assert_ne!(plain.status.code(), Some(0), "{err}");
    assert!(
        err.contains("--session grp: sessions are a persistent runtime's"),
        "{err}"
    );

    // Pause and resume reach every process of the session's jobs.
    let marker = format!("200.{}", std::process::id());
    let job = dvm.submit(&["--session", "2", "-n", "2", "sleep", &marker]);
    let t0 = Instant::now();
    while sleepers(&marker).len() < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the job did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pids = sleepers(&marker);
    let (code, out, err) = dvm.ctl(&["session", "pause"], &["grp"]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "paused session 2 (1 job)\n"),
        "{err}"
    );
    let states = wait_state(&pids, |s| s == 'T');
    assert!(states.iter().all(|&s| s == 'T'), "{states:?}");
    let (code, out, err) = dvm.ctl(&["session", "resume"], &["grp"]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "resumed session 2 (1 job)\n"),
        "{err}"
    );
    let states = wait_state(&pids, |s| s != 'T');
    assert!(states.iter().all(|&s| s != 'T'), "{states:?}");
    let (code, _, err) = dvm.ctl(&["session", "pause"], &["nosuch"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no session \"nosuch\""), "{err}");

    // Ending the session ends its job (status 143, naming the session).
    let (code, out, err) = dvm.ctl(&["session", "end"], &["grp"]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "ended session 2 (terminating 1 job)\n"),
        "{err}"
    );
    let d = job.wait(Duration::from_secs(30));
    assert_eq!(d.code(), Some(143), "{}", d.dump());
    assert!(d.stderr.contains("its session 2 ended"), "{}", d.dump());
    assert_eq!(
        gone_within(&marker, Duration::from_secs(5)),
        Vec::<u32>::new()
    );
    let (_, out, _) = dvm.ctl(&["session", "ls"], &[]);
    assert!(!out.contains("grp"), "{out}");
    let (code, err) = dvm.stop();
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn two_jobs_of_a_runtime_accept_and_connect_on_a_port_and_merge() {
    let dvm = Dvm::start("dvmport", &["--nodes", "2"]);
    let probe = probe("intercomm_probe");
    // The server's 2 processes on both nodes accept twice on one port; two client jobs
    // (3 processes, then 1) connect at once: each meets its own accept.
    let server = dvm.submit(&["--map-by", "node", "-n", "2", &probe, "server", "svc", "2"]);
    let c3 = dvm.submit(&["-n", "3", &probe, "client", "svc"]);
    let c1 = dvm.submit(&["-n", "1", &probe, "client", "svc"]);
    let t = Duration::from_secs(120);
    let (s, c3, c1) = (server.wait(t), c3.wait(t), c1.wait(t));
    for d in [&s, &c3, &c1] {
        assert_eq!(d.code(), Some(0), "{}", d.dump());
    }
    let ctx = |out: &str, head: &str| -> String {
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix(head))
            .unwrap_or_else(|| panic!("no {head}\n{out}"));
        line.split_once(" remote ")
            .expect("a remote group")
            .0
            .to_owned()
    };
    // The server met a client of 3 and one of 1, in either order.
    for r in 0..2 {
        let mut sizes: Vec<&str> = s
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("server {r}: exchanged with ")))
            .collect();
        sizes.sort();
        assert_eq!(
            sizes,
            ["1 remote processes", "3 remote processes"],
            "{}",
            s.dump()
        );
        for size in [3, 5] {
            let m = format!(
                "server {r}: merged rank {r} of {size}, sum {}, bcast 4242,",
                size * (size - 1) / 2
            );
            assert!(s.stdout.contains(&m), "{m}\n{}", s.dump());
        }
        let n = s
            .stdout
            .matches(&format!("server {r}: disconnected"))
            .count();
        assert_eq!(n, 2, "{}", s.dump());
    }
    for (c, n) in [(&c3, 3u32), (&c1, 1)] {
        let size = n + 2;
        let mut ids = Vec::new();
        for r in 0..n {
            ids.push(ctx(&c.stdout, &format!("client {r}/{n}: ctx ")));
            let m = format!(
                "client {r}: merged rank {} of {size}, sum {}, bcast 4242,",
                2 + r,
                size * (size - 1) / 2
            );
            assert!(c.stdout.contains(&m), "{m}\n{}", c.dump());
            assert!(
                c.stdout.contains(&format!("client {r}: disconnected")),
                "{}",
                c.dump()
            );
        }
        assert!(ids.iter().all(|x| *x == ids[0]), "{ids:?}");
    }
    let (code, err) = dvm.stop();
    assert_eq!(code, Some(0), "{err}");
}
