//! Programs that bootstrap through PMIx or MPICH's PMI-1 under `weft run` (issue 18; the
//! PMI-1 and PMI-2 wire protocols themselves are `tests/pmi.rs`'s). PMIx: a plain PMIx
//! client in C (`benches/mpi/pmix_client.c`: the job keys, process sets by query, a late
//! key, fences collecting data or not, direct modex, a second fence after new puts, groups
//! with context ids, a missing key) and Open MPI programs built with `mpicc.openmpi`
//! (hello, the ring, the OSU latency) on one node and on 2 logical nodes, a killed rank,
//! `--timeout`, `--no-pmix`; OpenPMIx's own examples `log.c` (`PMIx_Log` to stderr with a
//! time stamp, tagged output, local and global syslog) and `asyncgroup.c` (a group invite
//! joined from its event, a fence across the group, its destruct; an invite that cannot
//! complete), `dynamic.c` (`PMIx_Spawn` of a child job), `pub.c` and `pubi.c`
//! (publish/lookup), `PMIx_Connect` across jobs (`benches/mpi/pmix_connect.c`) and Open
//! MPI's `MPI_Comm_spawn` (`benches/mpi/spawn.c`), a spawned job's failure as an event to
//! its parent (`benches/mpi/pmix_child_failed.c`) on one node and on 2 logical nodes;
//! skipped without Open MPI or libpmix unless `WEFT_REQUIRE_OPENMPI` is set (`ci/test.sh`
//! sets it). MPICH programs built from `benches/mpi/` with Debian's `mpicc.mpich` (a ring
//! with send/recv, bcast, allreduce and barrier; the OSU latency) on one node and on 2
//! logical nodes (MPICH brings its own transports), a killed rank ending the job with its
//! name, nothing left behind. Without `mpicc.mpich` the MPICH tests are skipped with a
//! printed reason, or fail when `WEFT_REQUIRE_MPICH` is set (`ci/test.sh` installs MPICH
//! and sets it).
#![allow(missing_docs)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::progs::{err_lines, openmpi_program, pmix_client, pmix_example, pmix_flags, OMPI_LO};
use common::{available, build_c, clean, run};

/// `benches/mpi/SOURCE.c` built with `mpicc.mpich`, or `None` (skipped, with the reason
/// printed) when MPICH is not installed and `WEFT_REQUIRE_MPICH` is not set.
fn mpich_program(source: &str) -> Option<String> {
    let have = Command::new("mpicc.mpich")
        .arg("-show")
        .output()
        .is_ok_and(|o| o.status.success());
    let hint = "mpicc.mpich is missing (apt-get install mpich libmpich-dev)";
    available(have, "WEFT_REQUIRE_MPICH", hint).then(|| {
        let flags = ["-DIMPL=\"mpich\"".to_string()];
        build_c(
            "mpicc.mpich",
            &format!("{source}.c"),
            &format!("{source}.mpich"),
            &flags,
        )
    })
}

/// The MPI programs built by `build` (`tag` names the jobs, `implementation` is what
/// `osu_p2p` prints as its "impl", `extra` are `weft run` options for 2 nodes): hello on 4
/// ranks, the ring on 1 and 2 logical nodes, the OSU latency and bandwidth on 2 ranks;
/// every output line there, nothing left behind.
fn hello_ring_osu(
    tag: &str,
    implementation: &str,
    build: fn(&str) -> Option<String>,
    extra: &[&str],
) {
    let (Some(hello), Some(ring), Some(osu)) = (build("hello"), build("ring"), build("osu_p2p"))
    else {
        return;
    };
    let name = format!("{tag}-hello");
    let d = run(&name, &["-n", "4", &hello], Duration::from_secs(120));
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    for r in 0..4 {
        assert_eq!(
            d.lines_with(&format!("hello from rank {r} of 4")),
            1,
            "{}",
            d.dump()
        );
    }
    clean(&name, &d);
    for nodes in ["1", "2"] {
        let name = format!("{tag}-ring-{nodes}");
        let mut args = vec!["--nodes", nodes, "-n", "4"];
        args.extend_from_slice(extra);
        args.push(&ring);
        let d = run(&name, &args, Duration::from_secs(120));
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        for r in 0..4 {
            assert_eq!(
                d.lines_with(&format!("rank {r} ring ok")),
                1,
                "{}",
                d.dump()
            );
        }
        clean(&name, &d);
    }
    let name = format!("{tag}-osu");
    let d = run(
        &name,
        &["-n", "2", &osu, "--bench", "latency,bw", "--sizes", "8,64K"],
        Duration::from_secs(120),
    );
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    let want = format!("\"impl\":\"{implementation}\"");
    assert_eq!(d.lines_with(&want), 4, "{}", d.dump());
    clean(&name, &d);
}

#[test]
fn mpich_programs_run_under_weft_run_on_one_and_two_nodes() {
    hello_ring_osu("mpich", "mpich", mpich_program, &[]);
}

/// How a job of the MPI ring built by `build` ends when it fails (`tag` names the jobs,
/// `abort_says` is the server's line about the abort, `extra` are `weft run` options for 2
/// nodes): a rank killed (SIGKILL) on 2 nodes is named with its signal; MPI_Abort ends
/// the job with the abort's code, naming the rank; a job past `--timeout` is killed with
/// status 124 after its output was forwarded; nothing left behind.
fn failing_jobs(tag: &str, build: fn(&str) -> Option<String>, abort_says: &str, extra: &[&str]) {
    let Some(ring) = build("ring") else {
        return;
    };
    let name = format!("{tag}-die");
    let mut args = vec!["--nodes", "2", "-n", "4"];
    args.extend_from_slice(extra);
    args.extend([ring.as_str(), "die", "2"]);
    let d = run(&name, &args, Duration::from_secs(60));
    assert_ne!(d.code(), Some(0), "{}", d.dump());
    assert!(
        d.stderr.contains("rank 2") && d.stderr.contains("SIGKILL"),
        "the job names rank 2 and its signal\n{}",
        d.dump()
    );
    clean(&name, &d);
    let name = format!("{tag}-abort");
    let d = run(
        &name,
        &["-n", "3", &ring, "abort", "1"],
        Duration::from_secs(60),
    );
    assert_eq!(d.code(), Some(3), "{}", d.dump());
    assert!(
        d.stderr.contains(abort_says)
            && d.stderr.contains("rank 1 (node 0")
            && d.stderr.contains("exited with code 3"),
        "{}",
        d.dump()
    );
    clean(&name, &d);
    let name = format!("{tag}-timeout");
    let d = run(
        &name,
        &["--timeout", "3", "-n", "2", &ring, "sleep", "100"],
        Duration::from_secs(60),
    );
    assert_eq!(d.code(), Some(124), "{}", d.dump());
    assert_eq!(d.lines_with("sleeping"), 2, "{}", d.dump());
    assert!(d.elapsed < Duration::from_secs(20), "{}", d.dump());
    clean(&name, &d);
}

#[test]
fn a_killed_aborting_or_late_mpich_job_ends_naming_the_rank_or_the_timeout() {
    failing_jobs(
        "mpich",
        mpich_program,
        "rank 1 called PMI abort (exit code 3)",
        &[],
    );
}

/// Whether `ts` is a time stamp as `ctime` writes it: "Fri Nov 27 16:14:45 2026".
fn is_ctime(ts: &str) -> bool {
    let w: Vec<&str> = ts.split_whitespace().collect();
    w.len() == 5
        && w[3].len() == 8
        && w[3].split(':').count() == 3
        && w[4].len() == 4
        && w[4].bytes().all(|b| b.is_ascii_digit())
}

/// OpenPMIx's `log.c` (issue 31 §4): rank 0's `PMIx_Log` to `PMIX_LOG_STDERR` with
/// `PMIX_LOG_GENERATE_TIMESTAMP` appears once on the job's stderr, prefixed with its time
/// stamp as OpenPMIx/PRRTE write it (`[ctime]<stderr>: `; `[ctime][job,0]<stderr>: ` with
/// `--tag-output`), on 1 and 2 logical nodes, and the program runs to completion
/// (`mpirun.openmpi` prints the message too, without a time stamp). `--syslog` (the local
/// syslog, written by the PMIx library's own syslog component) succeeds; `--global-syslog`
/// is not served and says so (`PMIX_ERR_NOT_SUPPORTED`) instead of dropping the message
/// with a success; the program goes on to its fence either way.
#[test]
fn pmix_log_example_prints_its_message_on_one_and_two_nodes() {
    let Some(log) = pmix_example("log") else {
        return;
    };
    for nodes in ["1", "2"] {
        let name = format!("pmix-log-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "2", &log],
            Duration::from_secs(60),
        );
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        let msg = err_lines(&d, "stderr log message");
        assert_eq!(msg.len(), 1, "{}", d.dump());
        let (ts, rest) = msg[0]
            .strip_prefix('[')
            .and_then(|l| l.split_once(']'))
            .unwrap_or_else(|| panic!("no time stamp in {:?}\n{}", msg[0], d.dump()));
        assert!(is_ctime(ts), "{ts:?}\n{}", d.dump());
        assert_eq!(rest, "<stderr>: stderr log message", "{}", d.dump());
        assert_eq!(err_lines(&d, "failed").len(), 0, "{}", d.dump());
        assert_eq!(
            err_lines(&d, "PMIx_Finalize successfully completed").len(),
            2,
            "{}",
            d.dump()
        );
        clean(&name, &d);
    }
    let name = "pmix-log-tag";
    let d = run(
        name,
        &["--tag-output", "-n", "1", &log],
        Duration::from_secs(60),
    );
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    let msg = err_lines(&d, "stderr log message");
    assert_eq!(msg.len(), 1, "{}", d.dump());
    let job = format!("{name}-{}", std::process::id());
    let want = format!("][{job},0]<stderr>: stderr log message");
    assert!(
        msg[0].starts_with('[') && msg[0].ends_with(&want),
        "{}",
        d.dump()
    );
    assert!(
        is_ctime(&msg[0][1..msg[0].len() - want.len()]),
        "{}",
        d.dump()
    );
    clean(name, &d);
    let name = "pmix-log-syslog";
    let d = run(
        name,
        &["-n", "1", &log, "--syslog"],
        Duration::from_secs(60),
    );
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    assert_eq!(
        err_lines(&d, "LOG TO LOCAL SYSLOG").len(),
        1,
        "{}",
        d.dump()
    );
    assert_eq!(err_lines(&d, "failed").len(), 0, "{}", d.dump());
    assert_eq!(
        err_lines(&d, "successfully completed").len(),
        1,
        "{}",
        d.dump()
    );
    clean(name, &d);
    let name = "pmix-log-gsys";
    let d = run(
        name,
        &["-n", "1", &log, "--global-syslog"],
        Duration::from_secs(60),
    );
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    assert_eq!(
        err_lines(&d, "PMIx_Log GLOBAL syslog failed: NOT-SUPPORTED").len(),
        1,
        "{}",
        d.dump()
    );
    assert_eq!(
        err_lines(&d, "successfully completed").len(),
        1,
        "{}",
        d.dump()
    );
    clean(name, &d);
}

/// OpenPMIx's `asyncgroup.c` (issue 31 §5) on 4 processes: rank 0 invites ranks 2 and 3
/// (`PMIx_Group_invite`), they join from the `PMIX_GROUP_INVITED` event, the three fence
/// across the group and destruct it, everyone completes: on one node and on 2 logical
/// nodes (ranks 2 and 3 on the other node: the events go through the servers). Then an
/// invite that cannot complete (ranks 2 and 3 are `log.c`, which never accept and end)
/// ends the job with an error naming the invite, within seconds, instead of hanging.
/// (`mpirun.openmpi` of Open MPI 4.1 cannot run it: its runtime fails to pack the
/// invite's custom range and the job hangs.)
#[test]
fn pmix_group_invite_example_joins_fences_and_destructs_on_one_and_two_nodes() {
    let (Some(group), Some(log)) = (pmix_example("asyncgroup"), pmix_example("log")) else {
        return;
    };
    for nodes in ["1", "2"] {
        let name = format!("pmix-asyncgroup-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "4", &group],
            Duration::from_secs(60),
        );
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        for (want, n) in [
            ("Group invite complete with status SUCCESS!", 1),
            ("Group complete - executing fence across group", 2),
            ("Executing Group_destruct", 3),
            ("failed", 0),
            (" COMPLETE", 4),
        ] {
            assert_eq!(err_lines(&d, want).len(), n, "{want}\n{}", d.dump());
        }
        assert!(!d.stderr.contains("no such group"), "{}", d.dump());
        clean(&name, &d);
        let name = format!("pmix-asyncgroup-stuck-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "2", &group, ":", "-n", "2", &log],
            Duration::from_secs(60),
        );
        assert_eq!(d.code(), Some(1), "{}", d.dump());
        let named = d
            .stderr
            .contains("PMIx_Group_invite of \"ourgroup\" cannot complete")
            || err_lines(&d, "Group invite complete with status PROC-ABORTED").len() == 1;
        assert!(named, "{}", d.dump());
        assert!(d.elapsed < Duration::from_secs(30), "{}", d.dump());
        clean(&name, &d);
    }
}

/// OpenPMIx's `dynamic.c` (issue 33): rank 0 spawns 2 processes of OpenPMIx's `client.c`
/// with `PMIx_Spawn`, reads the new job's size and a local rank from its namespace; the
/// children (a job of their own namespace, `<job>.2`, served PMIx on the asking node) get
/// their job info, put, fence and read each other's keys; all 4 finalize, on one node and
/// on 2 logical nodes (where the child job leaves the second node out of its maps), and
/// nothing of either job is left behind. (`mpirun.openmpi` runs it too.)
#[test]
fn pmix_spawn_example_starts_a_child_job_on_one_and_two_nodes() {
    let (Some(dynamic), Some(client)) = (pmix_example("dynamic"), pmix_example("client")) else {
        return;
    };
    // dynamic.c spawns `$PWD/client`: a directory holding it, entered by a shell.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pmix-dynamic");
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("client");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&client, &link).unwrap();
    let script = format!("cd {} && exec {dynamic}", dir.display());
    for nodes in ["1", "2"] {
        let name = format!("pmix-dynamic-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "2", "sh", "-c", &script],
            Duration::from_secs(60),
        );
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        let job = format!("weft-{name}-{}", std::process::id());
        let child = format!("{job}.2");
        for (want, n) in [
            (format!("Client {job}:0 job {child} size 2"), 1),
            (format!("Client {job}:0 job {child} local rank "), 1),
            (
                format!("Client ns {child} rank 0: PMIx_Get {child}-1-local returned correct"),
                1,
            ),
            (
                format!("Client ns {child} rank 1: PMIx_Get {child}-0-local returned correct"),
                1,
            ),
            (format!("Client {child}:1 num procs 2"), 1),
            ("PMIx_Finalize successfully completed".to_string(), 4),
            ("failed".to_string(), 0),
        ] {
            assert_eq!(err_lines(&d, &want).len(), n, "{want}\n{}", d.dump());
        }
        clean(&name, &d);
    }
}

/// OpenPMIx's `pub.c` and `pubi.c` (issue 33): rank 0 publishes two keys (a `uint8` and a
/// `size`), the others look one up after a fence and check its value, type and publisher,
/// rank 0 withdraws both: on one node and on 2 logical nodes (the names live on the root
/// server). (`mpirun.openmpi` passes `pub.c`; `pubi.c` hits an Open MPI bug there.)
#[test]
fn pmix_publish_lookup_examples_on_one_and_two_nodes() {
    for example in ["pub", "pubi"] {
        let Some(prog) = pmix_example(example) else {
            return;
        };
        for nodes in ["1", "2"] {
            let name = format!("pmix-{example}-{nodes}");
            let d = run(
                &name,
                &["--nodes", nodes, "-n", "2", &prog],
                Duration::from_secs(60),
            );
            assert_eq!(d.code(), Some(0), "{}", d.dump());
            for (want, n) in [
                ("PUBLISH-LOOKUP SUCCEEDED", 1),
                ("UNPUBLISH SUCCEEDED", 1),
                ("PMIx_Finalize successfully completed", 2),
                ("failed", 0),
                ("wrong", 0),
            ] {
                assert_eq!(err_lines(&d, want).len(), n, "{want}\n{}", d.dump());
            }
            clean(&name, &d);
        }
    }
}

/// `PMIx_Connect` across jobs (`benches/mpi/pmix_connect.c`, issue 33): rank 0 spawns 2
/// children and publishes their namespace, rank 1 looks it up (waiting); all 4 connect the
/// two namespaces, read "who" of the other job's rank 0 (a direct modex across jobs, across
/// nodes with `--nodes 2`), and disconnect. Then children that exit before connecting
/// make the parents' connect fail at once instead of hanging.
#[test]
fn pmix_connect_joins_a_spawned_job_and_fails_when_it_dies() {
    if pmix_client().is_none() {
        return;
    }
    let prog = build_c("cc", "pmix_connect.c", "pmix_connect", &pmix_flags());
    for nodes in ["1", "2"] {
        let name = format!("pmix-connect-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "2", &prog, "2"],
            Duration::from_secs(60),
        );
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        let job = format!("weft-{name}-{}", std::process::id());
        let child = format!("{job}.2");
        for (me, other) in [(&job, &child), (&child, &job)] {
            for r in 0..2 {
                for want in [
                    format!("{me}:{r} connected with {other}"),
                    format!("{me}:{r} read who={other}:0"),
                    format!("{me}:{r} disconnected"),
                ] {
                    assert!(d.stdout.lines().any(|l| l == want), "{want}\n{}", d.dump());
                }
            }
        }
        for r in 0..2 {
            let want = format!("{child}:{r} parent {job}:0");
            assert!(d.stdout.lines().any(|l| l == want), "{want}\n{}", d.dump());
        }
        assert!(!d.stdout.contains("FAILED"), "{}", d.dump());
        // A second publish of the same name: PMIX_EXISTS (-11), as Open MPI expects.
        let again = format!("{job}:0 published again: -11");
        assert!(
            d.stdout.lines().any(|l| l == again),
            "{again}\n{}",
            d.dump()
        );
        clean(&name, &d);
        let name = format!("pmix-connect-die-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "2", &prog, "2", "die"],
            Duration::from_secs(60),
        );
        assert_eq!(d.code(), Some(1), "{}", d.dump());
        let failed = d
            .stdout
            .lines()
            .filter(|l| l.contains("FAILED PMIx_Connect"))
            .count();
        assert!(failed >= 1, "{}", d.dump());
        assert!(d.elapsed < Duration::from_secs(20), "{}", d.dump());
        clean(&name, &d);
    }
}

/// Open MPI's `MPI_Comm_spawn` (`benches/mpi/spawn.c`, issue 33): 2 parents spawn 2
/// children, a message crosses the intercommunicator, both sides merge it and allreduce over
/// the 4 processes, and `MPI_Comm_disconnect` (a PMIx fence over both jobs, through the root
/// server when they span nodes) ends it: on one node and on 2 logical nodes.
#[test]
fn openmpi_comm_spawn_merges_and_disconnects_on_one_and_two_nodes() {
    let Some(prog) = openmpi_program("spawn") else {
        return;
    };
    for nodes in ["1", "2"] {
        let name = format!("ompi-spawn-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "2", "-x", OMPI_LO, &prog],
            Duration::from_secs(120),
        );
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        let mut got: Vec<&str> = d.stdout.lines().collect();
        got.sort_unstable();
        let want = [
            "child 0/2: got 42 merged size 4 sum 4",
            "child 1/2: got 0 merged size 4 sum 4",
            "parent 0/2: spawned 2",
            "parent 0: merged size 4 sum 4",
            "parent 1/2: spawned 2",
            "parent 1: merged size 4 sum 4",
        ];
        assert_eq!(got, want, "{}", d.dump());
        clean(&name, &d);
    }
}

/// `spawn.c 3`: the same job spawns three times, each child job ending before the next
/// spawn. Open MPI registers its job directory for removal (PMIX_REGISTER_CLEANUP_DIR),
/// which the PMIx library carries out since Weft serves job control: with every job's
/// PMIX_NSDIR the server's own directory, that removed the library's store with the first
/// child job and the second spawn failed (as mpi4py's spawn tests did).
#[test]
fn openmpi_spawns_again_after_a_spawned_job_ended() {
    let Some(prog) = openmpi_program("spawn") else {
        return;
    };
    let d = run(
        "ompi-spawn-again",
        &["-n", "2", "-x", OMPI_LO, &prog, "3"],
        Duration::from_secs(120),
    );
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    for want in [
        "parent 0/2: spawned 2",
        "parent 1/2: spawned 2",
        "child 0/2: got 42 merged size 4 sum 4",
        "child 1/2: got 0 merged size 4 sum 4",
    ] {
        assert_eq!(d.lines_with(want), 3, "{want}\n{}", d.dump());
    }
    clean("ompi-spawn-again", &d);
}

#[test]
fn a_spawned_jobs_failure_reaches_the_parent_and_an_orderly_end_does_not_on_one_and_two_nodes() {
    if pmix_client().is_none() {
        return;
    }
    let prog = build_c(
        "cc",
        "pmix_child_failed.c",
        "pmix_child_failed",
        &pmix_flags(),
    );
    for nodes in ["1", "2"] {
        let name = format!("pmix-child-failed-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "2", &prog],
            Duration::from_secs(60),
        );
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        let child = format!("weft-{name}-{}.2", std::process::id());
        for r in 0..2 {
            // On every node: the child's rank 1 ended without finalizing.
            let want = format!("rank {r}: event PROC-ABORTED affected {child}:1");
            assert_eq!(d.lines_with(&want), 1, "{want}\n{}", d.dump());
            assert_eq!(
                d.lines_with(&format!("rank {r}: child failure seen")),
                1,
                "{}",
                d.dump()
            );
        }
        // Rank 1 finalized and ended (on another node, too): no failure event names it.
        assert_eq!(
            d.lines_with("rank 0: events about this job: 0"),
            1,
            "{}",
            d.dump()
        );
        clean(&name, &d);
    }
}

/// Open MPI between logical nodes: its TCP transport on loopback only.
#[test]
fn a_plain_pmix_client_passes_every_check_on_one_and_two_nodes() {
    let Some(client) = pmix_client() else {
        return;
    };
    for nodes in ["1", "2"] {
        let name = format!("pmix-client-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "4", &client, "test"],
            Duration::from_secs(120),
        );
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        assert_eq!(d.lines_with("FAILED"), 0, "{}", d.dump());
        for r in 0..4 {
            for check in [
                "job",
                "psets",
                "late",
                "collect fence",
                "collect",
                "sparse fence",
                "sparse",
                "again fence",
                "again",
                "group",
                "missing",
                "last fence",
            ] {
                assert_eq!(
                    d.lines_with(&format!("rank {r}: {check} ok")),
                    1,
                    "{nodes} node(s), rank {r}: {check}\n{}",
                    d.dump()
                );
            }
        }
        // The job keys count the job's nodes.
        let count = format!("nodes {nodes} ");
        assert_eq!(d.lines_with(&count), 4, "{}", d.dump());
        // Every member got the same context ids (the groups' PGCIDs).
        let ctx: std::collections::BTreeSet<&str> = d
            .stdout
            .lines()
            .filter_map(|l| l.split(": group ctxid ").nth(1))
            .collect();
        assert_eq!(ctx.len(), 1, "{}", d.dump());
        clean(&name, &d);
    }
}

/// More processes on a host than CPUs for them: the job info says so
/// (PMIX_NODE_OVERSUBSCRIBED) and Open MPI 4.1 is told in its own variable, so its ranks
/// yield while they wait instead of spinning through each other's time slices. One CPU
/// (`taskset -c 0`): 2 processes are oversubscribed, 1 is not; a user's own setting wins.
#[test]
fn an_oversubscribed_node_is_named_in_the_job_info_and_to_open_mpi() {
    let Some(client) = pmix_client() else {
        return;
    };
    let cases: [(&str, &[&str], &str, &str); 3] = [
        ("2", &[], "yes", "1"),
        ("1", &[], "no", "unset"),
        ("2", &["-x", "OMPI_MCA_mpi_oversubscribe=0"], "yes", "0"),
    ];
    for (n, extra, osub, var) in cases {
        let mut args = vec!["-n", n];
        args.extend_from_slice(extra);
        args.extend([client.as_str(), "osub"]);
        let name = format!("osub-{n}-{}", extra.len());
        let d = common::Job::start_as(&name, &["taskset", "-c", "0"], &args, Stdio::null())
            .wait(Duration::from_secs(60));
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        let ranks: usize = n.parse().expect("count");
        assert_eq!(
            d.lines_with(&format!("oversubscribed {osub}")),
            ranks,
            "-n {n} {extra:?} on one CPU\n{}",
            d.dump()
        );
        assert_eq!(
            d.lines_with(&format!("OMPI_MCA_mpi_oversubscribe {var}")),
            ranks,
            "-n {n} {extra:?} on one CPU\n{}",
            d.dump()
        );
        clean(&name, &d);
    }
}

#[test]
fn openmpi_programs_run_under_weft_run_on_one_and_two_nodes() {
    hello_ring_osu("ompi", "openmpi", openmpi_program, &["-x", OMPI_LO]);
}

#[test]
fn a_killed_aborting_or_late_openmpi_job_ends_naming_the_rank_or_the_timeout() {
    failing_jobs(
        "ompi",
        openmpi_program,
        "rank 1 called PMIx_Abort (status 3)",
        &["-x", OMPI_LO],
    );
}

#[test]
fn pmix_is_offered_by_default_and_not_with_no_pmix() {
    if weft_pmix::built_with().is_none() {
        eprintln!("skipped: built without libpmix");
        return;
    }
    let d = run(
        "pmix-env",
        &[
            "-n",
            "2",
            "sh",
            "-c",
            "echo rank=$PMIX_RANK ns=$PMIX_NAMESPACE ess=$OMPI_MCA_ess",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    for r in 0..2 {
        assert_eq!(
            d.lines_with(&format!("rank={r} ns=weft-")),
            1,
            "{}",
            d.dump()
        );
    }
    assert_eq!(d.lines_with("ess=pmi"), 2, "{}", d.dump());
    clean("pmix-env", &d);
    let d = run(
        "pmix-off",
        &[
            "--no-pmix",
            "-n",
            "2",
            "sh",
            "-c",
            "echo rank=$PMIX_RANK ess=$OMPI_MCA_ess.",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    assert_eq!(d.lines_with("rank= ess=."), 2, "{}", d.dump());
    clean("pmix-off", &d);
}
