//! Spawning a job from a running one (`Client::spawn`) through the real launcher and
//! servers: the new job's processes wire up among themselves, `weft run` waits for them,
//! a failure stays in the spawned job, nothing is left behind (each `wait` checks the
//! job's segments and files, the spawned job's included: they carry the job's name).
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{alive, probe, Job};

const T: Duration = Duration::from_secs(60);

/// The lines of `out` that start with `prefix`.
fn lines<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn a_spawned_job_wires_up_on_its_own_and_weft_run_waits_for_it() {
    let p = probe("wireup_probe");
    let job = Job::start("spawn3", &["-n", "1", &p, "spawn", "3"]);
    let name = job.name.clone();
    let done = job.wait(T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    let parent = lines(&done.stdout, "parent ");
    assert_eq!(
        parent,
        [format!(
            "parent 0 of weft-{name}: spawned weft-{name}.2 (ns2)"
        )],
        "{}",
        done.dump()
    );
    // The job weft run started has no parent; the spawned one's is the spawner.
    assert_eq!(
        lines(&done.stdout, "spawner "),
        ["spawner 0: parent none"],
        "{}",
        done.dump()
    );
    // Each child sleeps 300 ms after its parent has finalized, then fences with its job
    // and reads the next child's key: weft run waited for them.
    let children = lines(&done.stdout, "child ");
    assert_eq!(children.len(), 3, "{}", done.dump());
    for r in 0..3 {
        let next = (r + 1) % 3;
        let want = format!(
            "child {r} of 3 in weft-{name}.2 (ns2), parent weft-{name} (ns1:0), \
             read Str(\"child {next}\") from rank {next}"
        );
        assert!(children.contains(&want.as_str()), "{want}\n{}", done.dump());
    }
    assert!(
        done.elapsed >= Duration::from_millis(300),
        "{}",
        done.dump()
    );
}

#[test]
fn processes_on_two_nodes_spawn_at_once_and_each_gets_its_own_job() {
    let p = probe("wireup_probe");
    let job = Job::start(
        "spawn2n",
        &[
            "--nodes", "2", "--map-by", "node", "-n", "2", &p, "spawn", "2",
        ],
    );
    let name = job.name.clone();
    let done = job.wait(T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    let mut spawned: Vec<String> = lines(&done.stdout, "parent ")
        .iter()
        .map(|l| l.rsplit_once(": spawned ").expect("a spawn").1.to_owned())
        .collect();
    spawned.sort();
    assert_eq!(
        spawned,
        [
            format!("weft-{name}.2 (ns2)"),
            format!("weft-{name}.3 (ns3)")
        ],
        "{}",
        done.dump()
    );
    for ns in [2, 3] {
        let of_job = lines(&done.stdout, "child ")
            .into_iter()
            .filter(|l| l.contains(&format!(" of 2 in weft-{name}.{ns} (ns{ns}),")))
            .count();
        assert_eq!(of_job, 2, "job {ns}\n{}", done.dump());
    }
}

#[test]
fn a_program_that_cannot_start_fails_the_spawn_naming_it() {
    let p = probe("wireup_probe");
    let done = Job::start(
        "spawnbad",
        &["-n", "1", &p, "spawn", "2", "/nonexistent/weft-prog"],
    )
    .wait(T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    let parent = lines(&done.stdout, "parent ");
    assert_eq!(parent.len(), 1, "{}", done.dump());
    assert!(
        parent[0].contains(
            "spawn refused: node 0: rank 0: cannot start /nonexistent/weft-prog: No such file"
        ),
        "{}",
        done.dump()
    );
}

#[test]
fn a_failing_spawned_process_ends_its_job_only_and_the_status_stays_the_parents() {
    let p = probe("wireup_probe");
    // Rank 0 of the spawned job exits 3 at once; rank 1 would sleep 20 s.
    let job = Job::start(
        "spawnfail",
        &["-n", "1", &p, "spawn", "2", &p, "exit", "0", "3"],
    );
    let name = job.name.clone();
    let done = job.wait(T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert!(
        done.stderr.contains(&format!(
            "weft run: spawned job weft-{name}.2: rank 0 (node 0, "
        )) && done
            .stderr
            .contains("exited with code 3; terminating the job"),
        "{}",
        done.dump()
    );
    assert!(done.elapsed < Duration::from_secs(15), "{}", done.dump());
    assert!(
        !done.stdout.contains("finished its sleep"),
        "{}",
        done.dump()
    );
}

#[test]
fn the_time_limit_ends_what_was_spawned_after_the_job_ended() {
    let p = probe("wireup_probe");
    let job = Job::start(
        "spawntime",
        &[
            "--timeout",
            "2",
            "-n",
            "1",
            &p,
            "spawn",
            "1",
            &p,
            "sleep",
            "30000",
        ],
    );
    let done = job.wait(T);
    assert_eq!(done.code(), Some(124), "{}", done.dump());
    assert!(done.stderr.contains("timed out"), "{}", done.dump());
    let pid: u32 = done
        .stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("rank 0 pid ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .expect("the spawned process started");
    assert!(!alive(pid), "the spawned process {pid} outlived weft run");
    assert!(done.elapsed < Duration::from_secs(20), "{}", done.dump());
}

#[test]
fn bench_spawn_prints_both_times_in_json() {
    let tmp = std::env::temp_dir().join(format!("weft-tests/bench-spawn-{}", std::process::id()));
    let (rows, stdout) = common::bench_json(
        &[
            "bench", "spawn", "--procs", "2", "--iters", "3", "--warmup", "1", "--json",
        ],
        &tmp,
    );
    assert_eq!(rows.len(), 3, "{stdout}");
    let median = |what: &str| {
        let r = rows
            .iter()
            .find(|r| r["what"] == what)
            .unwrap_or_else(|| panic!("no {what} row: {stdout}"));
        assert_eq!(r["bench"], "spawn");
        assert_eq!(r["procs"], 2);
        assert_eq!(r["samples"], 3);
        r["median_us"].as_f64().unwrap()
    };
    let (started, inited) = (median("started"), median("initialized"));
    assert!(started > 0.0 && inited >= started, "{stdout}");
    // What the runtime holds, before and after the timed spawns: no descriptor or segment
    // more once their processes are gone.
    let held = rows
        .iter()
        .find(|r| r["what"] == "held")
        .unwrap_or_else(|| panic!("no held row: {stdout}"));
    for what in ["server_fds", "launcher_fds", "segments"] {
        let v = held[what]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: {stdout}"));
        let (before, after) = (v[0].as_u64().unwrap(), v[1].as_u64().unwrap());
        assert!(before > 0 || what == "segments", "{what}: {stdout}");
        assert!(after <= before, "{what} grew: {stdout}");
    }
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("weft-bench-spawn"))
        .collect();
    assert!(left.is_empty(), "the benchmark left {left:?}");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn bench_spawn_connect_times_the_intercommunicator_in_json() {
    let tmp = std::env::temp_dir().join(format!("weft-tests/bench-spawnc-{}", std::process::id()));
    let (rows, stdout) = common::bench_json(
        &[
            "bench",
            "spawn",
            "--connect",
            "--procs",
            "2",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--json",
        ],
        &tmp,
    );
    assert_eq!(rows.len(), 3, "{stdout}");
    let median = |what: &str| {
        let r = rows
            .iter()
            .find(|r| r["what"] == what)
            .unwrap_or_else(|| panic!("no {what} row: {stdout}"));
        assert_eq!(r["impl"], "weft-intercomm");
        assert_eq!(r["procs"], 2);
        assert_eq!(r["samples"], 3);
        r["median_us"].as_f64().unwrap()
    };
    let (c, t, d) = (
        median("connected"),
        median("first round trip"),
        median("disconnected"),
    );
    assert!(c > 0.0 && t >= c && d >= t, "{stdout}");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn a_spawned_process_killed_with_its_fabric_open_leaves_no_segment() {
    // The spawned job's rank 1 opens the fabric (its shared-memory inbox) and kills
    // itself; its server removes the job's segments when the job ends (Job::wait checks
    // that none of `weft-<name>.2-...` is left).
    let w = probe("wireup_probe");
    let f = probe("fabric_probe");
    // The parent looks 3 s later, while the runtime still runs: the job has ended by then.
    let job = Job::start(
        "spawnkill",
        &[
            "-x",
            "WEFT_PROBE_WAIT_MS=3000",
            "-n",
            "1",
            &w,
            "spawn",
            "2",
            &f,
            "dead-peer",
        ],
    );
    let name = job.name.clone();
    let done = job.wait(T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert!(
        done.stdout
            .contains(&format!("parent 0: segments of weft-{name}.2 left: []")),
        "{}",
        done.dump()
    );
    assert!(
        done.stdout.contains("rank 1 killing itself"),
        "{}",
        done.dump()
    );
    assert!(
        done.stderr.contains(&format!(
            "weft run: spawned job weft-{name}.2: rank 1 (node 0, "
        )) && done.stderr.contains("was killed by signal 9"),
        "{}",
        done.dump()
    );
}

#[test]
fn native_runtime_control_allocates_sessions_spawns_into_them_signals_and_terminates_jobs() {
    // wireup_probe's `control`: rank 0 of a job on 2 logical nodes asks for two sessions
    // of one node (a third is refused: none free), spawns 2 shell children into the
    // second, signals their job once they are ready (each prints it got SIGUSR1 and
    // where it runs), terminates a `sleep 30` job, tries bad requests, and releases both
    // sessions (a spawn into one then is refused, naming it).
    let p = probe("wireup_probe");
    let dir = std::env::temp_dir().join(format!("weft-control-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("probe dir");
    let set = format!("WEFT_PROBE_DIR={}", dir.display());
    let job = Job::start(
        "control",
        &["--nodes", "2", "-n", "2", "-x", &set, &p, "control"],
    );
    let name = job.name.clone();
    let done = job.wait(T);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    let want = [
        "allocated session 1 probe-a nodes [0] active true",
        "allocated session 2 probe-b nodes [1]",
        "third allocation: allocation refused: 1 node asked for, 0 free of the runtime's 2",
        "signalled ns2",
        // Spawned into session 2: on its node, not the parent's.
        "child 0 on node 1 got USR1",
        "child 1 on node 1 got USR1",
        "terminated ns3",
        "unknown job: job control: no job ns99 in this runtime (it ended, or never was)",
        "rank beyond: job control: ns1:5: job ns1 has 2 processes",
        "no signal: job control: 0 is not a signal number",
        "no target: job control: no target",
        "released session 1 active false",
        "released session 2 active false",
        "spawn into the released session: spawn refused: no allocation \"probe-b\" in this runtime",
    ];
    for w in want {
        assert!(done.stdout.lines().any(|l| l == w), "{w}\n{}", done.dump());
    }
    // The sleeper's job was ended by the request, long before its 30 s.
    assert!(
        done.stderr.contains(&format!(
            "weft run: spawned job weft-{name}.3: terminated by rank 0 of weft-{name} (job control)"
        )),
        "{}",
        done.dump()
    );
    assert!(done.elapsed < Duration::from_secs(20), "{}", done.dump());
}

#[test]
fn a_spawned_process_that_ends_without_finalizing_is_an_event_for_its_parent_job() {
    // wireup_probe's `spawn-watch`: 2 shell children exit with status 3 without ever
    // connecting; the parent's handler of `SpawnedProcEnded` gets one event for each,
    // naming it (its namespace and rank) and how it ended. The parent's status stays 0.
    let p = probe("wireup_probe");
    let job = Job::start("spawnwatch", &["-n", "1", &p, "spawn-watch"]);
    let name = job.name.clone();
    let done = job.wait(T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    for r in 0..2 {
        let want = format!(
            "event SpawnedProcEnded ns2:{r}: rank {r} of spawned job weft-{name}.2 (ns2) \
             exited with code 3 before finalize"
        );
        assert!(
            done.stdout.lines().any(|l| l == want),
            "{want}\n{}",
            done.dump()
        );
    }
}

#[test]
fn a_parent_job_and_its_children_connect_read_each_others_data_disconnect_and_see_an_end() {
    let p = probe("wireup_probe");
    // Parents on nodes 0 and 1; the 3 children continue from the parent's last node (1).
    let job = Job::start(
        "connect3",
        &[
            "--nodes", "2", "--map-by", "node", "-n", "2", &p, "connect", "3",
        ],
    );
    let done = job.wait(T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    let all = [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2)];
    let members = "procs [ns1:0 ns1:1 ns2:0 ns2:1 ns2:2] nodes [0, 1, 1, 1, 1]";
    let mut pgcids = Vec::new();
    for (ns, r) in all {
        let me = format!("connect ns{ns}:{r}: ");
        let mine: Vec<&str> = lines(&done.stdout, &me)
            .iter()
            .map(|l| &l[me.len()..])
            .collect();
        let first = mine
            .iter()
            .find(|l| l.starts_with("pgcid "))
            .unwrap_or_else(|| panic!("no connect of ns{ns}:{r}\n{}", done.dump()));
        let again = mine
            .iter()
            .find(|l| l.starts_with("again pgcid "))
            .unwrap_or_else(|| panic!("no second connect of ns{ns}:{r}\n{}", done.dump()));
        assert!(first.ends_with(members), "{first}\n{}", done.dump());
        assert!(again.ends_with(members), "{again}\n{}", done.dump());
        let pgcid = |l: &str| -> u64 {
            l.split_whitespace()
                .skip_while(|w| *w != "pgcid")
                .nth(1)
                .and_then(|w| w.parse().ok())
                .expect("a pgcid")
        };
        pgcids.push((pgcid(first), pgcid(again)));
        // Each side read the other's key, through the servers.
        let read = if ns == 1 {
            "read Str(\"child 0\") from ns2:0".to_owned()
        } else {
            "read Str(\"parent 1\") from ns1:1".to_owned()
        };
        assert!(mine.contains(&read.as_str()), "{read}\n{}", done.dump());
        if ns == 1 {
            // After the disconnect the children's data is refused; after the second
            // connect, a child's end shows in the parent's datastore.
            assert!(
                mine.iter().any(|l| l.starts_with("after disconnect: ")
                    && l.contains("ns2:0 is of job ns2, which is not connected with job ns1")),
                "{}",
                done.dump()
            );
            assert!(mine.contains(&"ns2:0 has finalized"), "{}", done.dump());
        } else {
            let unconnected = format!("child ns2:{r}: unconnected: ");
            assert!(
                lines(&done.stdout, &unconnected).iter().any(|l| l
                    .contains("ns1:0 is of job ns1, which is not connected with job ns2")),
                "{}",
                done.dump()
            );
        }
    }
    // One PGCID per connect, the same for every process, the two different.
    let (a, b) = pgcids[0];
    assert_ne!(a, b, "{pgcids:?}");
    assert!(pgcids.iter().all(|&x| x == (a, b)), "{pgcids:?}");
}

#[test]
fn a_child_that_dies_before_connecting_fails_the_connect_for_all_naming_it() {
    let p = probe("wireup_probe");
    let job = Job::start(
        "connectdie",
        &[
            "--nodes", "2", "--map-by", "node", "-n", "2", &p, "connect", "3", "die",
        ],
    );
    let done = job.wait(T);
    // The parent's job handled the failure and ends well; the spawned job failed alone.
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    for r in [0, 1] {
        let line = format!("connect ns1:{r}: failed: connect failed: ns2:1 exited with code 3");
        // A parent slow enough (a loaded machine) calls after the spawned job ended (a
        // second after its failure): then the job is named, no longer its process.
        let late =
            format!("connect ns1:{r}: failed: connect: namespace ns2 is not served here (it ended");
        assert!(
            done.stdout
                .lines()
                .any(|l| l.starts_with(&line) || l.starts_with(&late)),
            "{line}\n{}",
            done.dump()
        );
    }
    assert!(
        !done.stdout.contains(" pgcid "),
        "no one may connect: {}",
        done.dump()
    );
}
