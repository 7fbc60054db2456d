//! Wire-up through the real launcher, servers, sockets and shared memory.
#![allow(missing_docs)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{alive, example, pids_whose, probe, run, script, segments_of, Job};

const T: Duration = Duration::from_secs(60);

fn demo(name: &str, extra: &[&str], n: &str, mode: &str) {
    let d = example("fence_demo");
    let mut args: Vec<&str> = extra.to_vec();
    args.extend(["-n", n, &d, "--mode", mode]);
    let done = run(name, &args, T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    let n: usize = n.parse().unwrap();
    assert_eq!(done.lines_with(" ok"), n, "{}", done.dump());
}

#[test]
fn full_fence_one_node() {
    demo("full1", &[], "4", "full");
}

#[test]
fn full_fence_three_nodes_round_robin() {
    demo("full3", &["--nodes", "3", "--map-by", "node"], "7", "full");
}

#[test]
fn sparse_fence_four_nodes() {
    demo("sparse4", &["--nodes", "4"], "8", "sparse");
}

#[test]
fn sync_only_fence_two_nodes() {
    demo("sync2", &["--nodes", "2", "--map-by", "node"], "5", "sync");
}

#[test]
fn hosts_mode_starts_servers_through_the_launch_agent() {
    // A launch agent that behaves like ssh (first argument is the host) but runs locally.
    let agent_s = script(
        "weft-agent",
        "fake-ssh",
        "#!/bin/sh\necho \"$1\" >> \"$(dirname \"$0\")/hosts.log\"\nshift\nexec \"$@\"\n",
    );
    let dir = std::path::Path::new(&agent_s)
        .parent()
        .unwrap()
        .to_path_buf();
    let probe = probe("wireup_probe");
    let done = run(
        "hosts",
        &[
            "--hosts",
            "alpha,beta",
            "--launch-agent",
            &agent_s,
            "-n",
            "4",
            &probe,
            "info",
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    let log = std::fs::read_to_string(dir.join("hosts.log")).unwrap();
    let mut hosts: Vec<&str> = log.lines().collect();
    hosts.sort();
    assert_eq!(hosts, ["alpha", "beta"]);
    assert!(done.stdout.contains("3:hostname=beta"), "{}", done.dump());
    assert!(
        done.stdout.contains("0:node_list=[\"alpha\", \"beta\"]"),
        "{}",
        done.dump()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn facts(stdout: &str) -> HashMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[test]
fn job_info_and_psets_are_there_right_after_init() {
    let probe = probe("wireup_probe");
    let done = run(
        "info",
        &[
            "--nodes", "2", "--map-by", "node", "-n", "3", "--pset", "ocean", &probe, "info", ":",
            "-n", "2", "--pset", "ice", &probe, "info",
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    let f = facts(&done.stdout);
    let host = f["0:hostname"].trim_end_matches("-n0").to_owned();
    for r in 0..5 {
        assert_eq!(f[&format!("{r}:size")], "5");
        assert_eq!(f[&format!("{r}:env_rank")], r.to_string());
        assert_eq!(f[&format!("{r}:env_size")], "5");
        assert_eq!(f[&format!("{r}:node")], (r % 2).to_string(), "map-by node");
        assert_eq!(f[&format!("{r}:nodes")], "2");
        assert_eq!(f[&format!("{r}:app_sizes")], "[3, 2]");
        assert_eq!(f[&format!("{r}:sockdir_mode")], "700");
        assert_eq!(f[&format!("{r}:cpuset")], "none");
        assert_eq!(f[&format!("{r}:pset[weft://world]")], "[0, 1, 2, 3, 4]");
        assert_eq!(f[&format!("{r}:pset[weft://self]")], format!("[{r}]"));
        assert_eq!(f[&format!("{r}:pset[ocean]")], "[0, 1, 2]");
        assert_eq!(f[&format!("{r}:pset[ice]")], "[3, 4]");
        assert_eq!(
            f[&format!("{r}:pset_names")],
            "[\"weft://world\", \"weft://self\", \"ocean\", \"ice\"]"
        );
        assert_eq!(
            f[&format!("{r}:hosts_of_ranks")],
            format!("[\"{host}-n0\", \"{host}-n1\", \"{host}-n0\", \"{host}-n1\", \"{host}-n0\"]")
        );
    }
    assert_eq!(f["0:local_peers"], "[0, 2, 4]");
    assert_eq!(f["3:local_peers"], "[1, 3]");
    assert_eq!(f["4:local_rank"], "2");
    assert_eq!(f["4:local_size"], "3");
    assert_eq!(f["3:app"], "1");
    assert_eq!(
        f["1:psets_of_me"],
        "[\"weft://world\", \"weft://self\", \"ocean\"]"
    );
    assert_eq!(
        f["4:psets_of_me"],
        "[\"weft://world\", \"weft://self\", \"ice\"]"
    );
    assert_eq!(f["4:psets_of_0"], "[\"weft://world\", \"ocean\"]");
}

#[test]
fn bind_to_core_binds_and_reports_the_cpuset() {
    let probe = probe("wireup_probe");
    let done = run(
        "bind",
        &[
            "--bind-to",
            "core",
            "--nodes",
            "2",
            "-n",
            "2",
            &probe,
            "info",
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    let f = facts(&done.stdout);
    for r in 0..2 {
        let cpuset = &f[&format!("{r}:cpuset")];
        assert_ne!(cpuset, "none");
        assert_eq!(
            cpuset,
            &f[&format!("{r}:allowed")],
            "rank {r} runs where the job info says"
        );
    }
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if ncpu > 1 {
        assert_ne!(f["0:cpuset"], f["1:cpuset"], "two ranks, two cores");
    }
}

#[test]
fn fence_timeout_names_the_missing_process_on_one_and_two_nodes() {
    let probe = probe("wireup_probe");
    for (name, nodes) in [("ftimeout1", "1"), ("ftimeout2", "2")] {
        let done = run(
            name,
            &["--nodes", nodes, "-n", "4", &probe, "fence-timeout"],
            T,
        );
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert_eq!(
            done.lines_with("fence timed out after"),
            3,
            "{}",
            done.dump()
        );
        assert_eq!(done.lines_with("missing [3]"), 3, "{}", done.dump());
        assert_eq!(done.lines_with(" ok"), 4, "{}", done.dump());
    }
}

#[test]
fn get_timeout_names_the_owner_then_waits_for_its_commit() {
    let probe = probe("wireup_probe");
    for (name, nodes) in [("gtimeout1", "1"), ("gtimeout2", "2")] {
        let done = run(
            name,
            &["--nodes", nodes, "-n", "2", &probe, "get-timeout"],
            T,
        );
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert!(
            done.stdout.contains("get timed out after"),
            "{}",
            done.dump()
        );
        assert!(
            done.stdout.contains("never-put timed out after"),
            "{}",
            done.dump()
        );
        assert_eq!(done.lines_with(" ok"), 2, "{}", done.dump());
    }
}

/// Issue 14, bug 1: after a Sparse (or any) fence, a get sees every key its owner
/// committed before the fence, new or re-put, even when the node holds an older copy
/// of the owner's data from an earlier get.
#[test]
fn gets_after_each_fence_see_what_was_committed_before_it() {
    let probe = probe("wireup_probe");
    for (name, n) in [("rounds4", "4"), ("rounds8", "8")] {
        let done = run(name, &["--nodes", "2", "-n", n, &probe, "sparse-rounds"], T);
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert_eq!(
            done.lines_with(" ok"),
            n.parse::<usize>().unwrap(),
            "{}",
            done.dump()
        );
    }
}

/// Issue 14, bug 2: a get waits for a key its owner commits late (with or without a
/// fence before it), instead of answering NotFound.
#[test]
fn gets_wait_for_keys_committed_late() {
    let probe = probe("wireup_probe");
    let done = run(
        "getwaits",
        &["--nodes", "2", "-n", "4", &probe, "get-waits"],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok"), 4, "{}", done.dump());
    let waited: Vec<u64> = done
        .stdout
        .lines()
        .filter_map(|l| l.split(" waited ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(waited.len(), 1, "{}", done.dump());
    assert!(
        waited[0] >= 1500,
        "the get must have waited for the commit: {waited:?}"
    );
}

#[test]
fn a_process_killed_during_a_fence_is_reported_within_two_seconds() {
    let probe = probe("wireup_probe");
    for (name, nodes) in [("kill1", "1"), ("kill3", "3")] {
        let done = run(
            name,
            &["--nodes", nodes, "-n", "6", &probe, "kill-during-fence"],
            T,
        );
        // The launcher reports the first failure: rank 5's SIGKILL (128 + 9).
        assert_eq!(done.code(), Some(137), "{}", done.dump());
        assert!(
            done.stderr.contains("rank 5") && done.stderr.contains("killed by signal 9 (SIGKILL)"),
            "{}",
            done.dump()
        );
        let saw = done.gone_after_ms();
        assert_eq!(
            saw.len(),
            5,
            "every survivor saw the dead rank\n{}",
            done.dump()
        );
        assert!(saw.iter().all(|&ms| ms < 2000), "{saw:?}\n{}", done.dump());
    }
}

#[test]
fn a_finalized_process_fails_later_fences_but_keeps_its_data() {
    let probe = probe("wireup_probe");
    let done = run(
        "finalized",
        &[
            "--nodes",
            "2",
            "--map-by",
            "node",
            "-n",
            "3",
            &probe,
            "finalized-peer",
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(
        done.lines_with("saw: rank 1 has finalized"),
        2,
        "{}",
        done.dump()
    );
    assert_eq!(done.lines_with(" ok"), 2, "{}", done.dump());
}

/// A node's datastore that other keys filled still records a process's end (its reserve),
/// which waits on a peer look for without asking the server.
#[test]
fn a_full_datastore_still_records_a_processs_end() {
    let probe = probe("wireup_probe");
    let done = common::Job::start_as(
        "full-store",
        &["env", "WEFT_DATASTORE_BYTES=1m"],
        &["-n", "2", &probe, "full-store"],
        std::process::Stdio::null(),
    )
    .wait(T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(
        done.lines_with("read its peer's keys"),
        2,
        "{}",
        done.dump()
    );
    assert_eq!(
        done.lines_with("saw: rank 1 has finalized"),
        1,
        "{}",
        done.dump()
    );
    assert!(done.stderr.contains("is full"), "{}", done.dump());
}

#[test]
fn bad_connections_are_dropped_and_the_job_carries_on() {
    let probe = probe("wireup_probe");
    let done = run(
        "garbage",
        &["--nodes", "2", "-n", "4", &probe, "garbage"],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok"), 4, "{}", done.dump());
    let reply = |case: &str| {
        done.stdout
            .lines()
            .find(|l| l.starts_with(&format!("case {case}:")))
            .unwrap_or_else(|| panic!("no case {case}\n{}", done.dump()))
            .to_owned()
    };
    // Each bad connection got a reason (where the server could still answer) and a log line.
    assert!(
        reply("version99").contains("protocol version 99"),
        "{}",
        done.dump()
    );
    // A version 3 hello does not decode as this version's; its version is still named.
    let v = weft_wireup::PROTOCOL_VERSION;
    assert!(
        reply("version3").contains(&format!(
            "client speaks protocol version 3, this server speaks {v}"
        )),
        "{}",
        done.dump()
    );
    assert!(
        reply("foreign-ns")
            .contains("namespace ns7 is not served here (this server serves ns1 only)"),
        "{}",
        done.dump()
    );
    assert!(
        reply("wrong-token").contains("wrong token for rank 1"),
        "{}",
        done.dump()
    );
    assert!(
        reply("duplicate").contains("rank 0 is already connected"),
        "{}",
        done.dump()
    );
    assert!(
        reply("foreign-rank").contains("rank 999 does not run on node 0"),
        "{}",
        done.dump()
    );
    for log in [
        "bad hello: undecodable frame",
        "connection closed in the middle of a frame (10 of 100 bytes)",
        "frame of 4294967295 bytes exceeds the limit",
        "client speaks protocol version 99",
        "client speaks protocol version 3",
        "namespace ns7 is not served here",
        "wrong token for rank 1",
    ] {
        assert!(
            done.stderr.contains(log),
            "server log lacks {log:?}\n{}",
            done.dump()
        );
    }
}

#[test]
fn concurrent_fences_over_different_subsets_and_repeated_fences() {
    let probe = probe("wireup_probe");
    let done = run(
        "subsets",
        &[
            "--nodes", "2", "--map-by", "node", "-n", "6", &probe, "subsets",
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok"), 6, "{}", done.dump());
}

#[test]
fn get_local_only_and_refresh() {
    let probe = probe("wireup_probe");
    let done = run(
        "getopts",
        &["--nodes", "2", "-n", "4", &probe, "get-opts"],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok"), 4, "{}", done.dump());
}

#[test]
fn invalid_requests_get_clear_errors() {
    let probe = probe("wireup_probe");
    let done = run("badreq", &["-n", "2", &probe, "bad-requests"], T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    for want in [
        "get outside: get: rank 5 is not in the job (size 2)",
        "fence outside: fence invalid: rank 3 is not in the job (size 2)",
        "empty key: put: invalid key \"\": empty",
        "huge value: put: value of 17825792 bytes for key \"big\" exceeds the limit",
        "fence without me: fence invalid: the caller (rank 0) is not among the participants",
    ] {
        assert!(
            done.stdout.contains(want),
            "missing {want:?}\n{}",
            done.dump()
        );
    }
    assert_eq!(done.lines_with(" ok"), 2, "{}", done.dump());
}

#[test]
fn exit_status_is_the_first_failure_and_the_rest_are_terminated() {
    let probe = probe("wireup_probe");
    let done = run(
        "exit3",
        &["--nodes", "2", "-n", "3", &probe, "exit", "1", "3"],
        T,
    );
    assert_eq!(done.code(), Some(3), "{}", done.dump());
    assert!(
        done.stderr.contains("rank 1 (node 0,")
            && done
                .stderr
                .contains("exited with code 3; terminating the job"),
        "{}",
        done.dump()
    );
    assert!(
        done.elapsed < Duration::from_secs(10),
        "the sleepers were not terminated: {:?}",
        done.elapsed
    );
    assert_eq!(done.lines_with("finished its sleep"), 0, "{}", done.dump());
}

#[test]
fn keep_going_lets_the_others_finish() {
    let probe = probe("wireup_probe");
    let done = run(
        "keepgoing",
        &["--keep-going", "-n", "3", &probe, "exit", "2", "7", "500"],
        T,
    );
    assert_eq!(done.code(), Some(7), "{}", done.dump());
    assert_eq!(done.lines_with("finished its sleep"), 2, "{}", done.dump());
}

/// A launcher tunable set to what it cannot be is named, with the default used instead,
/// not silently ignored.
#[test]
fn a_bad_launcher_tunable_is_named_and_its_default_used() {
    let tmp = std::env::temp_dir()
        .join("weft-tests")
        .join(format!("bad-tunable-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("test tmp dir");
    let out = std::process::Command::new(common::weft())
        .args(["run", "-n", "1", "true"])
        .env("WEFT_RUN_GRACE_MS", "soon")
        .env("TMPDIR", &tmp)
        .output()
        .expect("weft run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("WEFT_RUN_GRACE_MS")
            && err.contains("\"soon\"")
            && err.contains("using the default"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn timeout_kills_the_job_with_a_message() {
    let probe = probe("wireup_probe");
    let done = run(
        "timeout",
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
        T,
    );
    assert_eq!(done.code(), Some(124), "{}", done.dump());
    assert!(
        done.stderr.contains("job timed out after 1.0 s"),
        "{}",
        done.dump()
    );
    assert!(done.elapsed < Duration::from_secs(10), "{:?}", done.elapsed);
}

#[test]
fn a_missing_program_is_a_clear_error() {
    let done = run("noprog", &["-n", "2", "/nonexistent/program"], T);
    assert_eq!(done.code(), Some(127), "{}", done.dump());
    assert!(
        done.stderr
            .contains("could not be started: cannot start /nonexistent/program"),
        "{}",
        done.dump()
    );
}

#[test]
fn bad_command_lines_are_refused_before_anything_starts() {
    let out = std::process::Command::new(common::weft())
        .args(["run", "--map-by", "socket", "-n", "2", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--map-by: unknown policy \"socket\""));
}

#[test]
fn stdin_goes_to_rank_zero_and_output_can_be_tagged() {
    let probe = probe("wireup_probe");
    let mut job = Job::start_with_stdin(
        "stdin",
        &["--tag-output", "-n", "2", &probe, "stdin"],
        std::process::Stdio::piped(),
    );
    job.feed_stdin(b"hello rank zero\n");
    let done = job.wait(T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    let tag = |r: u32| format!("[{}-{},{r}]<stdout>: ", "stdin", std::process::id());
    assert!(
        done.stdout
            .contains(&format!("{}rank 0 read \"hello rank zero\"", tag(0))),
        "{}",
        done.dump()
    );
    assert!(
        done.stdout.contains(&format!("{}rank 1 read \"\"", tag(1))),
        "{}",
        done.dump()
    );
}

#[test]
fn a_killed_launcher_leaves_no_process_segment_or_socket_behind() {
    let probe = probe("wireup_probe");
    let job = Job::start(
        "killlauncher",
        &["--nodes", "2", "-n", "3", &probe, "sleep", "60000"],
    );
    let name = job.name.clone();
    let tmp = job.tmp.clone();
    // Wait until the job is up: both segments exist and the sockets are bound.
    let t0 = Instant::now();
    while segments_of(&name).len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(20), "job did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let pids = pids_whose("environ", |env| {
        env.contains(&format!("WEFT_NSPACE=weft-{name}"))
    });
    assert_eq!(pids.len(), 3, "three ranks should run");
    // The job's two servers (their job directory names the job).
    let servers = pids_whose("cmdline", |c| {
        c.contains(" server ") && c.contains(&format!("/{name}"))
    });
    assert_eq!(servers.len(), 2, "two servers should run");
    // SIGKILL the launcher: the servers notice and clean up.
    let launcher = job.pid();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(launcher as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let t0 = Instant::now();
    loop {
        let segs = segments_of(&name);
        let left = common::leftovers(&tmp);
        let live: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        let live_servers: Vec<u32> = servers.iter().copied().filter(|&p| alive(p)).collect();
        if segs.is_empty() && left.is_empty() && live.is_empty() && live_servers.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "after 10 s: segments {segs:?}, files {left:?}, live ranks {live:?}, live servers {live_servers:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(job);
}

/// Issue 14, part 2: hostile requests over a real server socket (mutations of every
/// request kind) while the other ranks use the same servers: they keep getting right
/// answers, and the job ends cleanly.
#[test]
fn a_server_under_hostile_requests_keeps_serving_the_others() {
    let probe = probe("wireup_probe");
    let done = run(
        "fuzzserver",
        &["--nodes", "2", "-n", "4", &probe, "fuzz-server"],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok after "), 3, "{}", done.dump());
    let sent: u64 = done
        .stdout
        .lines()
        .find_map(|l| l.split("sent ").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no fuzz line: {}", done.dump()));
    assert!(sent > 100, "only {sent} requests sent: {}", done.dump());
    for l in done
        .stdout
        .lines()
        .filter(|l| l.contains(" fuzz: ") || l.contains(" ok after "))
    {
        println!("fuzz live-server: {l}");
    }
}

/// Lines written in pieces (several writes each) by processes on different nodes reach
/// the job's output whole: servers pass on complete lines.
#[test]
fn lines_written_in_pieces_are_not_interleaved() {
    let probe = probe("wireup_probe");
    let done = run("pieces", &["--nodes", "4", "-n", "4", &probe, "pieces"], T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    // A clean job's servers closing one after another is no lost server.
    assert!(!done.stderr.contains("lost the server"), "{}", done.dump());
    for (k, out) in [(0, &done.stderr), (1, &done.stdout)] {
        let mut whole = 0;
        for l in out.lines().filter(|l| l.starts_with('r')) {
            let words: Vec<&str> = l.split(' ').collect();
            let first = words[0].rsplit_once('.').map(|(p, _)| p).unwrap_or("");
            let want: Vec<String> = (0..8).map(|p| format!("{first}.{p}")).collect();
            assert_eq!(
                words,
                want,
                "a line mixed with another: {l:?}\n{}",
                done.dump()
            );
            assert!(first.split('.').nth(1) == Some(&k.to_string()), "{l:?}");
            whole += 1;
        }
        assert_eq!(whole, 20, "{}", done.dump());
    }
}
