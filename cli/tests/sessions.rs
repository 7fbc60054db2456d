//! Sessions, groups and communicators from groups, through the real launcher and servers.
#![allow(missing_docs)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{example, run, Done};

const T: Duration = Duration::from_secs(60);

fn probe(name: &str, n: &str, scenario: &str) -> Done {
    let p = common::probe("session_probe");
    run(name, &["-n", n, &p, scenario], T)
}

/// The number after `key ` on the line of `rank`.
fn num(done: &Done, rank: u32, key: &str) -> u64 {
    let line = done
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("rank {rank} ")))
        .unwrap_or_else(|| panic!("no line of rank {rank}: {}", done.dump()));
    line.split(&format!("{key} "))
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

#[test]
fn sessions_demo_rings_on_two_communicators_with_distinct_pgcids() {
    let demo = example("sessions_demo");
    let done = run("sess-demo", &["-n", "4", &demo], T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    let mut pgcids = BTreeSet::new();
    for tag in ["org.weft.demo.ring-a", "org.weft.demo.ring-b"] {
        let lines: Vec<&str> = done
            .stdout
            .lines()
            .filter(|l| l.starts_with(&format!("comm {tag} rank ")))
            .collect();
        assert_eq!(lines.len(), 4, "{}", done.dump());
        let ranks: BTreeSet<&str> = lines.iter().map(|l| l.split(' ').nth(3).unwrap()).collect();
        assert_eq!(ranks.len(), 4, "{}", done.dump());
        let p: BTreeSet<&str> = lines
            .iter()
            .map(|l| l.rsplit(' ').next().unwrap())
            .collect();
        assert_eq!(p.len(), 1, "one PGCID per communicator: {}", done.dump());
        assert!(lines.iter().all(|l| l.contains(" size 4 pgcid ")));
        pgcids.extend(p);
    }
    assert_eq!(pgcids.len(), 2, "{}", done.dump());
    assert!(
        !pgcids.contains("1"),
        "the world's PGCID reused: {}",
        done.dump()
    );
}

#[test]
fn psets_and_group_operations_follow_mpi() {
    let done = probe("sess-groups", "4", "groups");
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with("groups ok"), 4, "{}", done.dump());
}

#[test]
fn two_sessions_side_by_side_keep_their_messages_apart() {
    let done = probe("sess-two", "4", "two-sessions");
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(
        done.lines_with("two sessions ok levels funneled multiple"),
        4,
        "{}",
        done.dump()
    );
}

#[test]
fn the_standards_three_process_example_finalizes_concurrently() {
    let done = probe("sess-std", "3", "standard-example");
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with("standard example ok"), 3, "{}", done.dump());
    // Rank 2 synchronised with rank 0 alone: rank 0's finalize waited on A (rank 1, late
    // by 600 ms) and B at once, so B finished without waiting for rank 1.
    let r2 = num(&done, 2, "took");
    assert!(r2 < 400, "rank 2's finalize took {r2} ms: {}", done.dump());
    let r0 = num(&done, 0, "after");
    assert!(r0 >= 500, "rank 0 did not wait for rank 1: {}", done.dump());
}

#[test]
fn subcommunicators_speak_in_their_own_ranks() {
    let done = probe("sess-sub", "4", "subcomm");
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with("subcomm ok"), 4, "{}", done.dump());
}

#[test]
fn finalize_is_local_after_disconnect_and_synchronises_after_free() {
    let done = probe("sess-fin", "2", "finalize-sync");
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert!(num(&done, 0, "local") < 300, "{}", done.dump());
    assert!(num(&done, 0, "sync") >= 400, "{}", done.dump());
}

#[test]
fn sessions_made_concurrently_on_several_threads_work_side_by_side() {
    let done = probe("sess-thread", "3", "thread");
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(
        done.lines_with("threads ok provided single,funneled,serialized,multiple default funneled"),
        3,
        "{}",
        done.dump()
    );
}

#[test]
fn a_fatal_error_handler_ends_the_process_with_a_message() {
    let done = probe("sess-fatal", "2", "fatal");
    assert_eq!(done.code(), Some(1), "{}", done.dump());
    assert!(
        done.stderr
            .contains("weft: fatal error: communicator: the tag is empty"),
        "{}",
        done.dump()
    );
}

#[test]
fn disjoint_groups_may_use_one_tag_at_once() {
    let done = probe("sess-split", "4", "split");
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with("split ok"), 4, "{}", done.dump());
}

#[test]
fn communicators_from_groups_agreed_over_the_fabric() {
    // Three in a row from the world, both halves at once with one tag, a dup: five
    // distinct ids, the same at every member; on one node and on two over TCP.
    let done = probe("sess-fabric-comm", "4", "fabric-comm");
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with("fabric-comm ok 5"), 4, "{}", done.dump());
    let p = common::probe("session_probe");
    let done = run(
        "sess-fabric-comm-tcp",
        &[
            "-x",
            "WEFT_TRANSPORTS=shm,tcp",
            "--nodes",
            "2",
            "-n",
            "3",
            &p,
            "fabric-comm",
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with("fabric-comm ok 5"), 3, "{}", done.dump());
}

#[test]
fn bench_group_prints_one_json_row_per_operation_and_job() {
    let tmp = std::env::temp_dir().join(format!("weft-tests/bench-group-{}", std::process::id()));
    let (rows, stdout) = common::bench_json(
        &[
            "bench", "group", "-n", "4", "--nodes", "1,2", "--iters", "3", "--warmup", "1",
            "--json",
        ],
        &tmp,
    );
    assert_eq!(rows.len(), 8, "{stdout}");
    for nodes in [1, 2] {
        for op in [
            "construct",
            "construct+data",
            "comm_create",
            "comm_create_fabric",
        ] {
            let r = rows
                .iter()
                .find(|r| r["op"] == op && r["nodes"] == nodes)
                .unwrap_or_else(|| panic!("no {op} on {nodes} nodes: {stdout}"));
            assert_eq!(r["bench"], "group");
            assert_eq!(r["procs"], 4);
            assert_eq!(r["samples"], 3);
            let m = r["median_us"].as_f64().unwrap();
            assert!(m > 0.0 && m <= r["max_us"].as_f64().unwrap(), "{r}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Issue 14, bug 3: the others learn how a rank ended: finalized, exited with a code,
/// killed by a signal (a Rust panic exits with 101).
#[test]
fn the_end_of_a_rank_is_named_by_how_it_ended() {
    let p = common::probe("session_probe");
    for (how, want, code) in [
        ("finalize", "rank 1 has finalized", 0),
        ("exit3", "rank 1 exited with code 3", 3),
        ("panic", "rank 1 exited with code 101", 101),
        ("abort", "rank 1 was killed by signal 6 (SIGABRT)", 134),
    ] {
        let done = run(
            &format!("end-{how}"),
            &["-n", "3", "--keep-going", &p, "end", how],
            T,
        );
        assert_eq!(done.code(), Some(code), "{how}: {}", done.dump());
        for r in [0, 2] {
            let fence = format!("rank {r} fence: {want}");
            assert!(
                done.stdout.contains(&fence),
                "{how}: no {fence:?}: {}",
                done.dump()
            );
            let recv = done
                .stdout
                .lines()
                .find(|l| l.starts_with(&format!("rank {r} recv: ")))
                .unwrap_or_else(|| panic!("{how}: no recv line of rank {r}: {}", done.dump()));
            assert!(
                recv.contains(&want[7..]),
                "{how}: {recv:?} does not say {want:?}"
            );
        }
        // In a communicator where rank 1 has another rank, the error names both.
        let sub = format!("rank 2 sub: rank 0 is gone: job {want}");
        assert!(
            done.stdout.contains(&sub),
            "{how}: no {sub:?}: {}",
            done.dump()
        );
    }
}

/// Issue 14, bugs 5 and 6: a second connection and a re-initialization after
/// `Fabric::finalize` are refused with errors that say what to do instead.
#[test]
fn a_second_connection_and_a_reinit_are_refused_clearly() {
    let done = probe("sess-reinit", "2", "reinit");
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok"), 2, "{}", done.dump());
    assert_eq!(done.lines_with("second init: this process is already connected to its weft server (one connection per process): share it with Client::shared(), or in a Session/Fabric program use session.fabric().wire()"), 2, "{}", done.dump());
    assert_eq!(
        done.lines_with("init after finalize: "),
        2,
        "{}",
        done.dump()
    );
    assert!(
        done.stdout.contains("cannot be initialized again"),
        "{}",
        done.dump()
    );
    assert!(
        !done.stderr.contains("already connected"),
        "no server warning: {}",
        done.dump()
    );
}
