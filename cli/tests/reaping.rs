//! Issue 31, item 6: `weft run` reaps every process it starts (its servers, directly or
//! through a launch agent) and every server reaps its ranks, however the job ends: when
//! `weft run` returns, no process of the job is left, neither running nor a zombie.
//!
//! The test process makes itself a child subreaper, so a process orphaned by the
//! launcher or a server is reparented to it (not to init, which may reap it at once, or
//! never): an unreaped process is then always seen as a zombie until the test reaps it.
#![allow(missing_docs)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{probe, script, Done, Job};

const T: Duration = Duration::from_secs(60);

/// `(ppid, state, starttime)` of `pid` from `/proc/PID/stat`.
fn stat_of(pid: u32) -> Option<(u32, char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // rest: state(3) ppid(4) ... starttime(22): indices 0, 1, 19.
    Some((
        f.get(1)?.parse().ok()?,
        f.first()?.chars().next()?,
        f.get(19)?.parse().ok()?,
    ))
}

/// A process seen under the launcher while the job ran.
#[derive(Debug, Clone)]
struct Seen {
    starttime: u64,
    cmdline: String,
}

/// The command line of `pid` (empty once it is gone).
fn cmdline_of(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Every descendant of `root` now: pid -> what it is. A process seen before is seen
/// again: one first seen between its fork and its exec had its parent's command line.
fn descendants(root: u32, into: &mut HashMap<u32, Seen>) {
    let table: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter_map(|pid| stat_of(pid).map(|(ppid, _, start)| (pid, ppid, start)))
        .collect();
    for &(pid, _, starttime) in &table {
        if let Some(seen) = into.get_mut(&pid) {
            let now = cmdline_of(pid);
            if seen.starttime == starttime && !now.is_empty() {
                seen.cmdline = now;
            }
        }
    }
    let mut parents = vec![root];
    parents.extend(into.keys().copied());
    loop {
        let mut grew = false;
        for &(pid, ppid, starttime) in &table {
            if parents.contains(&ppid) && !parents.contains(&pid) {
                let cmdline = cmdline_of(pid);
                into.insert(pid, Seen { starttime, cmdline });
                parents.push(pid);
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
}

/// Makes this test process the reaper of the orphans of its descendants (call before
/// the job starts).
fn adopt_orphans() {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .expect("PR_SET_CHILD_SUBREAPER");
}

/// Runs `job` to its end while recording every process under its launcher (`during`
/// runs once sampling is under way); returns the result and those processes.
fn watch(job: Job, during: impl FnOnce(&Job)) -> (Done, HashMap<u32, Seen>) {
    let launcher = job.pid();
    let stop = Arc::new(AtomicBool::new(false));
    let mut seen = HashMap::new();
    descendants(launcher, &mut seen);
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                descendants(launcher, &mut seen);
                std::thread::sleep(Duration::from_millis(10));
            }
            seen
        })
    };
    during(&job);
    let done = job.wait(T);
    stop.store(true, Ordering::Relaxed);
    (done, sampler.join().unwrap())
}

/// Asserts that none of `seen` is left (running or zombie; a pid reused since by another
/// process does not count); reaps the zombies the test inherited.
fn assert_none_left(what: &str, done: &Done, seen: &HashMap<u32, Seen>, servers: usize) {
    let n_servers = seen
        .values()
        .filter(|s| s.cmdline.contains(" server "))
        .count();
    assert!(
        n_servers >= servers,
        "{what}: saw {n_servers} servers, expected {servers}: {seen:?}\n{}",
        done.dump()
    );
    let left: Vec<String> = seen
        .iter()
        .filter_map(|(&pid, s)| {
            let (_, state, start) = stat_of(pid)?;
            (start == s.starttime).then(|| format!("{pid} [{state}] {}", s.cmdline))
        })
        .collect();
    // What this test inherited (as the subreaper) is reaped here, not left behind.
    for pid in seen.keys() {
        if let Some(p) = rustix::process::Pid::from_raw(*pid as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG);
        }
    }
    assert!(
        left.is_empty(),
        "{what}: after weft run returned, processes it started (or their ranks) are left \
         (Z = an unreaped zombie): {left:#?}\n{}",
        done.dump()
    );
}

#[test]
fn a_normal_job_leaves_no_server_or_rank_behind() {
    let probe = probe("wireup_probe");
    adopt_orphans();
    let job = Job::start(
        "reap-normal",
        &["--nodes", "2", "-n", "3", &probe, "sleep", "1000"],
    );
    let (done, seen) = watch(job, |_| {});
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_none_left("normal job", &done, &seen, 2);
}

#[test]
fn a_failing_job_leaves_no_server_or_rank_behind() {
    let probe = probe("wireup_probe");
    adopt_orphans();
    let job = Job::start(
        "reap-failing",
        &["--nodes", "2", "-n", "3", &probe, "exit", "1", "3"],
    );
    let (done, seen) = watch(job, |_| {});
    assert_eq!(done.code(), Some(3), "{}", done.dump());
    assert_none_left("failing job", &done, &seen, 2);
}

#[test]
fn a_timed_out_job_leaves_no_server_or_rank_behind() {
    let probe = probe("wireup_probe");
    adopt_orphans();
    let job = Job::start(
        "reap-timeout",
        &[
            "--timeout",
            "1",
            "--nodes",
            "2",
            "-n",
            "2",
            &probe,
            "sleep",
            "60000",
        ],
    );
    let (done, seen) = watch(job, |_| {});
    assert_eq!(done.code(), Some(124), "{}", done.dump());
    assert_none_left("timed-out job", &done, &seen, 2);
}

/// Waits until the job's ranks run (`n` "started" lines cannot be read before the end, so
/// by its processes: `n` ranks under the launcher's servers).
fn wait_for_ranks(job: &Job, n: usize) {
    let t0 = Instant::now();
    loop {
        let mut seen = HashMap::new();
        descendants(job.pid(), &mut seen);
        let ranks = seen
            .values()
            .filter(|s| s.cmdline.contains("wireup_probe"))
            .count();
        if ranks >= n {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the job did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `weft run` interrupted as by Ctrl-C (SIGINT to its whole process group: the launcher,
/// its servers and the ranks), and terminated by SIGTERM to the launcher alone.
#[test]
fn an_interrupted_or_terminated_launcher_leaves_nothing_behind() {
    let probe = probe("wireup_probe");
    adopt_orphans();
    for (sig, group) in [
        (rustix::process::Signal::INT, true),
        (rustix::process::Signal::TERM, false),
    ] {
        // `setsid` (not a group leader here, it execs without forking): the launcher
        // leads a process group of its own, as a shell's foreground job does.
        let job = Job::start_as(
            &format!("reap-sig{}", sig.as_raw()),
            &["setsid"],
            &["--nodes", "2", "-n", "3", &probe, "sleep", "60000"],
            std::process::Stdio::null(),
        );
        let (done, seen) = watch(job, |job| {
            wait_for_ranks(job, 3);
            let pid = rustix::process::Pid::from_raw(job.pid() as i32).unwrap();
            if group {
                rustix::process::kill_process_group(pid, sig).unwrap();
            } else {
                rustix::process::kill_process(pid, sig).unwrap();
            }
        });
        assert_eq!(
            done.code(),
            Some(128 + sig.as_raw()),
            "{sig:?}: {}",
            done.dump()
        );
        assert_none_left(&format!("{sig:?}"), &done, &seen, 2);
    }
}

/// With `--hosts`, the processes the launcher starts are its launch agent's (here a fake
/// ssh that execs the server locally). The agent for one host fails after half a second
/// (the other servers are up by then), as ssh does for an unreachable host: the job
/// fails and nothing is left of it.
#[test]
fn a_server_that_fails_to_start_through_the_launch_agent_leaves_nothing_behind() {
    let agent_s = script(
        "weft-reap-agent",
        "fake-ssh",
        "#!/bin/sh\nhost=\"$1\"\nshift\n[ \"$host\" = beta ] && { sleep 0.5; echo \"ssh: beta: unreachable\" >&2; exit 255; }\nexec \"$@\"\n",
    );
    let dir = std::path::Path::new(&agent_s)
        .parent()
        .unwrap()
        .to_path_buf();
    let probe = probe("wireup_probe");
    adopt_orphans();
    for hosts in ["alpha,beta", "beta,alpha,gamma"] {
        let job = Job::start(
            "reap-agent",
            &[
                "--hosts",
                hosts,
                "--launch-agent",
                &agent_s,
                "-n",
                "3",
                &probe,
                "sleep",
                "60000",
            ],
        );
        let (done, seen) = watch(job, |_| {});
        assert_eq!(done.code(), Some(1), "{hosts}: {}", done.dump());
        assert!(
            done.stderr.contains("ended unexpectedly"),
            "{hosts}: {}",
            done.dump()
        );
        // The agents that did exec a server; beta's may have exited before a sample.
        let servers = hosts.split(',').filter(|h| *h != "beta").count();
        assert_none_left(&format!("--hosts {hosts}"), &done, &seen, servers);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A launcher killed hard (SIGKILL) cannot reap its servers (they are orphans, here the
/// test's), but its servers, which notice the lost launcher and kill their ranks, still
/// reap those ranks before they exit.
#[test]
fn servers_of_a_killed_launcher_reap_their_ranks() {
    let probe = probe("wireup_probe");
    adopt_orphans();
    let job = Job::start(
        "reap-sigkill",
        &["--nodes", "2", "-n", "3", &probe, "sleep", "60000"],
    );
    wait_for_ranks(&job, 3);
    let mut seen = HashMap::new();
    descendants(job.pid(), &mut seen);
    let launcher = rustix::process::Pid::from_raw(job.pid() as i32).unwrap();
    rustix::process::kill_process(launcher, rustix::process::Signal::KILL).unwrap();
    // The servers end (zombies of this test, or reaped by it below).
    let servers: Vec<u32> = seen
        .iter()
        .filter(|(_, s)| s.cmdline.contains(" server "))
        .map(|(p, _)| *p)
        .collect();
    assert_eq!(servers.len(), 2, "{seen:?}");
    let t0 = Instant::now();
    while servers
        .iter()
        .any(|&p| stat_of(p).is_some_and(|(_, state, _)| state != 'Z'))
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "servers still run");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ranks: HashMap<u32, Seen> = seen
        .into_iter()
        .filter(|(_, s)| s.cmdline.contains("wireup_probe"))
        .collect();
    assert_eq!(ranks.len(), 3, "{ranks:?}");
    let left: Vec<String> = ranks
        .iter()
        .filter_map(|(&pid, s)| {
            let (_, state, start) = stat_of(pid)?;
            (start == s.starttime).then(|| format!("{pid} [{state}] {}", s.cmdline))
        })
        .collect();
    for pid in ranks.keys().chain(&servers) {
        if let Some(p) = rustix::process::Pid::from_raw(*pid as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty());
        }
    }
    drop(job);
    assert!(left.is_empty(), "ranks left by their servers: {left:#?}");
}

/// A rank that leaves a process of its own running, holding its output open (a shell's
/// background job): the job still ends with its ranks (the rest of that output is
/// dropped after a grace), and the process is killed with the job.
#[test]
fn a_process_a_rank_left_running_ends_with_the_job() {
    let job = Job::start(
        "reap-leftover",
        &[
            "--nodes",
            "2",
            "-n",
            "2",
            "/bin/sh",
            "-c",
            "sleep 3137 & echo started",
        ],
    );
    let done = job.wait(T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with("started"), 2, "{}", done.dump());
    assert!(done.elapsed < Duration::from_secs(20), "{}", done.dump());
    assert!(
        done.stderr.contains("still holds its output open"),
        "{}",
        done.dump()
    );
    let left = common::pids_whose("cmdline", |c| c.starts_with("sleep 3137"));
    for &pid in &left {
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
    assert!(left.is_empty(), "left running: {left:?}\n{}", done.dump());
}
