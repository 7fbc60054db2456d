//! Weft programs under engines that host a PMIx server: Debian's Open MPI 4.1 `mpirun`
//! (its runtime, without PMIx groups), a real Slurm 22.05 (`srun --mpi=pmix`;
//! `ci/slurm.sh start` runs one on this machine), with `Client::init()` choosing the
//! PMIx backend on its own (the environment names a PMIx server, not `weft run`), and
//! `weft run`'s own embedded PMIx server with the backend forced (`WEFT_WIREUP=pmix`),
//! on one node and across 2 logical nodes (fences between the servers, another node's
//! cards by direct modex). Under each, on up to 6 processes (oversubscribed on CI's two cores):
//! `fence_demo` in all three modes, `ring` (the fabric over shared memory, cards
//! exchanged through the host; and over TCP, its secret shared through the host), a first
//! TCP send to a peer waiting in a fence, `sessions_demo` (communicators from session
//! groups: Weft's own group construct over the host's fence, PGCIDs without a server),
//! every collective (`coll_check`), a fabric fence, the fabric's conformance programs
//! (ping-pong to 4 MiB, all-to-all, errors, a dead peer named within 2 s), keys committed
//! after a fence (waited for, never `NotFound`), a rank killed during a fence (the job
//! ends naming it); no shared memory left behind. `weft info` says what each host offers.
//! Under Slurm also `sbatch` and `salloc` of a job script. Under `mpirun` also: group
//! constructs that disagree fail at every member; what is not mapped yet (group queries,
//! some directives) fails with an error that says so. A missing host is skipped with a
//! printed reason, or fails the test when `WEFT_REQUIRE_PMIX_HOSTS` is set (`ci/test.sh`
//! installs and starts both and sets it).
#![allow(missing_docs)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{example, probe, weft};

/// A host engine that starts jobs and serves PMIx to their processes.
enum Host {
    /// Open MPI 4.1's `mpirun.openmpi` (its runtime hosts the PMIx server).
    Mpirun(PathBuf),
    /// A running Slurm (`srun --mpi=pmix`; `ci/slurm.sh start` makes one here).
    Slurm,
    /// `weft run` itself, on this many logical nodes, its embedded PMIx server serving
    /// Weft programs told to use the PMIx backend (`WEFT_WIREUP=pmix`).
    WeftRun(u32),
}

/// `weft run`'s own PMIx server as the host (see [`Host::WeftRun`]).
fn weft_run(nodes: u32) -> Option<Host> {
    if weft_pmix::built_with().is_none() {
        return skip("built without libpmix (apt-get install libpmix-dev)");
    }
    Some(Host::WeftRun(nodes))
}

/// Whether a missing host fails the test instead of skipping it (CI: `ci/test.sh` sets
/// it, having installed and started both).
fn required() -> bool {
    std::env::var_os("WEFT_REQUIRE_PMIX_HOSTS").is_some()
}

fn skip(why: &str) -> Option<Host> {
    assert!(!required(), "WEFT_REQUIRE_PMIX_HOSTS is set, but {why}");
    eprintln!("skipped: {why}");
    None
}

fn mpirun() -> Option<Host> {
    if weft_pmix::built_with().is_none() {
        return skip("built without libpmix (apt-get install libpmix-dev)");
    }
    let path = std::env::var_os("PATH")?;
    match std::env::split_paths(&path)
        .map(|d| d.join("mpirun.openmpi"))
        .find(|p| p.exists())
    {
        Some(p) => Some(Host::Mpirun(p)),
        None => skip("mpirun.openmpi not found (apt-get install openmpi-bin)"),
    }
}

fn slurm() -> Option<Host> {
    if weft_pmix::built_with().is_none() {
        return skip("built without libpmix (apt-get install libpmix-dev)");
    }
    // A node that is still completing the previous test's job ("comp") takes the next
    // one when it is done; a cluster that is not up answers nothing usable for 10 s.
    let usable = || {
        Command::new("sinfo")
            .args(["-h", "-o", "%t"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .is_some_and(|t| {
                t.lines()
                    .any(|l| ["idle", "mix", "alloc", "comp"].contains(&l.trim()))
            })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut up = usable();
    while !up && Instant::now() < deadline && std::env::var_os("SLURM_CONF").is_some() {
        std::thread::sleep(Duration::from_millis(200));
        up = usable();
    }
    if !up {
        return skip("no running Slurm (ci/slurm.sh start, then export SLURM_CONF)");
    }
    Some(Host::Slurm)
}

/// Runs `ARGS` as a job of `n` processes under `host` with `env` set, within 120 s.
fn under(host: &Host, n: u32, env: &[(&str, &str)], args: &[&str]) -> Output {
    under_with(host, n, env, args, true)
}

/// [`under`]; with `kill_on_bad_exit` false, Slurm leaves the other ranks running when
/// one fails (its default), so that they can see the failure themselves.
fn under_with(
    host: &Host,
    n: u32,
    env: &[(&str, &str)],
    args: &[&str],
    kill_on_bad_exit: bool,
) -> Output {
    let start = Instant::now();
    let mut cmd = match host {
        Host::Mpirun(mpirun) => {
            let mut c = Command::new(mpirun);
            c.args([
                "--allow-run-as-root",
                "--oversubscribe",
                "--bind-to",
                "none",
            ]);
            for (k, v) in env {
                c.args(["-x", &format!("{k}={v}")]);
            }
            c
        }
        Host::Slurm => {
            let mut c = Command::new("srun");
            c.args([
                "--mpi=pmix",
                "--overcommit",
                if kill_on_bad_exit {
                    "--kill-on-bad-exit=1"
                } else {
                    "--kill-on-bad-exit=0"
                },
            ]);
            c.envs(env.iter().copied());
            c
        }
        Host::WeftRun(nodes) => {
            // A job id of its own: a random one (digits first) would look like an Open
            // MPI job's segments to a test running under `mpirun` meanwhile.
            static JOBS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let job = format!(
                "pmixhost-{}-{}",
                std::process::id(),
                JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            let mut c = Command::new(weft());
            c.args(["run", "--job-id", &job, "--nodes", &nodes.to_string()]);
            c.args(["-x", "WEFT_WIREUP=pmix"]);
            for (k, v) in env {
                c.args(["-x", &format!("{k}={v}")]);
            }
            c
        }
    };
    let mut child = cmd
        .arg("-n")
        .arg(n.to_string())
        .args(args)
        .env_remove("WEFT_WIREUP")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the host's launcher");
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("{args:?} under the host did not end within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// Runs `ARGS` under `mpirun` (see [`under`]).
fn under_mpirun(host: &Host, n: u32, args: &[&str]) -> Output {
    under(host, n, &[], args)
}

fn dump(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn lines_with(o: &Output, pat: &str) -> usize {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains(pat))
        .count()
}

/// Segments of the jobs `host` ran (Weft names them after the PMIx namespace: digits
/// under Open MPI, `slurm.pmix.<job>.<step>` under Slurm).
fn host_segments(host: &Host) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    n.strip_prefix("weft-")
                        .and_then(|r| r.split('-').next())
                        .is_some_and(|id| match host {
                            Host::Slurm => id.starts_with("slurm."),
                            // Namespace `weft-<job id>`.
                            Host::WeftRun(_) => id == "weft",
                            Host::Mpirun(_) => {
                                !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())
                            }
                        })
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn fence_demo_in_every_mode_ring_sessions_and_collectives_under_open_mpi_mpirun() {
    if let Some(host) = mpirun() {
        programs_under(&host);
    }
}

#[test]
fn fence_demo_in_every_mode_ring_sessions_and_collectives_under_slurm() {
    if let Some(host) = slurm() {
        programs_under(&host);
    }
}

/// Weft's programs, unchanged, under `mpirun` (the host's variables, not `weft run`'s).
fn programs_under(mpirun: &Host) {
    let before = host_segments(mpirun);
    let demo = example("fence_demo");
    for mode in ["full", "sparse", "sync"] {
        let o = under_mpirun(mpirun, 4, &[&demo, "--mode", mode]);
        assert!(o.status.success(), "fence_demo --mode {mode}\n{}", dump(&o));
        assert_eq!(
            lines_with(&o, " ok"),
            4,
            "fence_demo --mode {mode}\n{}",
            dump(&o)
        );
        // Job information from the host: one node, local ranks 0-3, the world pset.
        for r in 0..4 {
            assert_eq!(
                lines_with(&o, &format!("rank {r}/4 on ")),
                1,
                "{}",
                dump(&o)
            );
            assert_eq!(
                lines_with(
                    &o,
                    &format!("local rank {r}/4, app 0), psets [\"weft://world\"")
                ),
                1,
                "{}",
                dump(&o)
            );
        }
    }
    let o = under_mpirun(mpirun, 4, &[&example("ring")]);
    assert!(o.status.success(), "ring\n{}", dump(&o));
    assert_eq!(lines_with(&o, "ring ok"), 1, "{}", dump(&o));
    // Every peer over TCP: the transports' secret comes through the host (rank 0 puts it).
    let o = under(
        mpirun,
        3,
        &[("WEFT_TRANSPORTS", "tcp")],
        &[&example("ring")],
    );
    assert!(o.status.success(), "ring over TCP\n{}", dump(&o));
    assert_eq!(lines_with(&o, "ring ok"), 1, "{}", dump(&o));
    // A first send over TCP to a peer waiting in a fence completes: the fence keeps the
    // fabric's progress running (PMIx_Fence_nb), so the peer answers the handshake.
    let o = under(
        mpirun,
        2,
        &[
            ("WEFT_TRANSPORTS", "tcp"),
            ("WEFT_TCP_HANDSHAKE_TIMEOUT_MS", "1000"),
        ],
        &[&probe("fabric_probe"), "first-send-to-a-fencing-peer"],
    );
    assert!(
        o.status.success(),
        "first send to a fencing peer\n{}",
        dump(&o)
    );
    assert_eq!(lines_with(&o, " ok"), 2, "{}", dump(&o));
    // The same while the peer waits in a get (PMIx_Get_nb, progress kept running).
    let o = under(
        mpirun,
        2,
        &[
            ("WEFT_TRANSPORTS", "tcp"),
            ("WEFT_TCP_HANDSHAKE_TIMEOUT_MS", "1000"),
        ],
        &[&probe("fabric_probe"), "first-send-to-a-getting-peer"],
    );
    assert!(
        o.status.success(),
        "first send to a getting peer\n{}",
        dump(&o)
    );
    assert_eq!(lines_with(&o, " ok"), 2, "{}", dump(&o));
    // Communicators from session groups: the same PGCIDs at every member.
    let o = under_mpirun(mpirun, 4, &[&example("sessions_demo")]);
    assert!(o.status.success(), "sessions_demo\n{}", dump(&o));
    assert_eq!(
        lines_with(&o, "comm org.weft.demo.ring-a rank "),
        4,
        "{}",
        dump(&o)
    );
    assert_eq!(lines_with(&o, " size 4 pgcid 2"), 4, "{}", dump(&o));
    assert_eq!(lines_with(&o, " size 4 pgcid 3"), 4, "{}", dump(&o));
    // Every collective, on the world and on split, dup and node communicators.
    let o = under_mpirun(mpirun, 4, &[&probe("coll_check"), "--max", "65536"]);
    assert!(o.status.success(), "coll_check\n{}", dump(&o));
    assert_eq!(lines_with(&o, "coll ok"), 4, "{}", dump(&o));
    // A fence run by the fabric (cards through the node's segment), not the host.
    let o = under_mpirun(mpirun, 3, &[&probe("coll_probe"), "fence"]);
    assert!(o.status.success(), "coll_probe fence\n{}", dump(&o));
    assert_eq!(lines_with(&o, "fence ok"), 3, "{}", dump(&o));
    let after: Vec<String> = host_segments(mpirun)
        .into_iter()
        .filter(|s| !before.contains(s))
        .collect();
    assert!(after.is_empty(), "shared memory left behind: {after:?}");
}

#[test]
fn fence_demo_in_every_mode_ring_sessions_and_collectives_under_weft_runs_own_pmix_server() {
    if let Some(host) = weft_run(1) {
        programs_under(&host);
        late_commits_under(&host);
        killed_rank_under(&host);
        fabric_programs_under(&host);
    }
}

/// A Weft program on the PMIx backend across 2 logical nodes, `weft run`'s servers as
/// the host (fences between the servers, direct modex of another node's cards): the
/// fence modes, a ring over TCP, communicators from session groups, every collective, a
/// fabric fence, a ping-pong between the nodes, a rank killed during a fence.
#[test]
fn weft_programs_on_the_pmix_backend_across_two_nodes_of_weft_run() {
    let Some(host) = weft_run(2) else { return };
    let before = host_segments(&host);
    let tcp = [("WEFT_TRANSPORTS", "shm,tcp")];
    for mode in ["full", "sparse", "sync"] {
        let o = under(&host, 4, &tcp, &[&example("fence_demo"), "--mode", mode]);
        assert!(o.status.success(), "fence_demo --mode {mode}\n{}", dump(&o));
        assert_eq!(lines_with(&o, " ok"), 4, "{mode}\n{}", dump(&o));
        assert_eq!(
            lines_with(&o, "(node 1 of 2, local rank "),
            2,
            "{}",
            dump(&o)
        );
    }
    let o = under(&host, 4, &tcp, &[&example("ring")]);
    assert!(o.status.success(), "ring\n{}", dump(&o));
    assert_eq!(lines_with(&o, "ring ok"), 1, "{}", dump(&o));
    let o = under(&host, 4, &tcp, &[&example("sessions_demo")]);
    assert!(o.status.success(), "sessions_demo\n{}", dump(&o));
    assert_eq!(lines_with(&o, " size 4 pgcid 2"), 4, "{}", dump(&o));
    assert_eq!(lines_with(&o, " size 4 pgcid 3"), 4, "{}", dump(&o));
    let o = under(&host, 4, &tcp, &[&probe("coll_check"), "--max", "65536"]);
    assert!(o.status.success(), "coll_check\n{}", dump(&o));
    assert_eq!(lines_with(&o, "coll ok"), 4, "{}", dump(&o));
    let o = under(&host, 4, &tcp, &[&probe("coll_probe"), "fence"]);
    assert!(o.status.success(), "coll_probe fence\n{}", dump(&o));
    assert_eq!(lines_with(&o, "fence ok"), 4, "{}", dump(&o));
    let o = under(&host, 2, &tcp, &[&example("pingpong"), "--iters", "20"]);
    assert!(o.status.success(), "pingpong\n{}", dump(&o));
    assert_eq!(lines_with(&o, "pingpong ok"), 1, "{}", dump(&o));
    // Rank 3 (node 1) dies while the others wait in a fence: rank 2 finds it dead on its
    // node, ranks 0 and 1 (node 0) hear it from the host's termination event.
    killed_rank_under(&host);
    let after: Vec<String> = host_segments(&host)
        .into_iter()
        .filter(|s| !before.contains(s))
        .collect();
    assert!(after.is_empty(), "shared memory left behind: {after:?}");
}

/// Groups on the PMIx backend go to the host's PMIx groups where it has them (`weft
/// run`'s server does): the host assigns the PGCIDs (one sequence, as Weft's own servers
/// hand them out, where ids derived without one would give the group led by rank 1 the id
/// 2 + (2^22 - 2) / 4 = 1048577), a destruct is the host's collective (the id is
/// constructed again), an optional construct takes its id from the host too, members
/// that disagree are told, and `weft info` says whose groups a process gets. On one
/// node and across two.
#[test]
fn groups_are_the_hosts_under_weft_runs_own_pmix_server() {
    for nodes in [1, 2] {
        let Some(host) = weft_run(nodes) else { return };
        let probe = probe("group_probe");
        let o = under(&host, 4, &[], &[&probe, "pgcids"]);
        assert!(o.status.success(), "pgcids\n{}", dump(&o));
        assert_eq!(
            lines_with(&o, " pgcids a 2 b 3 a-again 4 c 5"),
            3,
            "{}",
            dump(&o)
        );
        assert_eq!(
            lines_with(&o, "rank 0 pgcids a 2 b - a-again 4 c 5"),
            1,
            "{}",
            dump(&o)
        );
        let o = under(&host, 4, &[], &[&probe, "mismatch"]);
        assert_eq!(
            lines_with(&o, "constructs it with other members or directives"),
            4,
            "{}",
            dump(&o)
        );
        optional_leaves_out_a_latecomer(&host);
    }
    let Some(host) = weft_run(1) else { return };
    let w = weft().display().to_string();
    let o = under(&host, 1, &[], &[&w, "info"]);
    assert!(o.status.success(), "{}", dump(&o));
    assert_eq!(
        lines_with(
            &o,
            "host: groups: the host's PMIx groups (PMIx_Group_construct/destruct), PGCIDs \
             assigned by the host"
        ),
        1,
        "{}",
        dump(&o)
    );
}

/// The process sets of an MPMD job reach a Weft program on the PMIx backend through
/// `weft run`'s PMIx server (its answers to `PMIx_Query_info`).
#[test]
fn process_sets_by_query_under_weft_runs_own_pmix_server() {
    if weft_run(1).is_none() {
        return;
    }
    let demo = example("fence_demo");
    let o = Command::new(weft())
        .args([
            "run",
            "--job-id",
            &format!("pmixpsets-{}", std::process::id()),
        ])
        .args([
            "-x",
            "WEFT_WIREUP=pmix",
            "-n",
            "2",
            "--pset",
            "ocean",
            &demo,
        ])
        .args([":", "-n", "1", "--pset", "ice", &demo])
        .output()
        .expect("weft run");
    assert!(o.status.success(), "{}", dump(&o));
    assert_eq!(
        lines_with(&o, r#"psets ["weft://world", "weft://self", "ocean"]"#),
        2,
        "{}",
        dump(&o)
    );
    assert_eq!(
        lines_with(&o, r#"psets ["weft://world", "weft://self", "ice"]"#),
        1,
        "{}",
        dump(&o)
    );
}

#[test]
fn weft_info_names_the_pmix_backend_and_what_the_host_offers() {
    if let Some(slurm) = slurm() {
        let w = weft().display().to_string();
        let o = under(&slurm, 1, &[], &[&w, "info"]);
        assert!(o.status.success(), "{}", dump(&o));
        for want in [
            "host: namespace slurm.pmix.",
            "host: process sets: the host does not answer process-set queries",
            "host: termination events: registered",
            "host: groups: Weft's own construct over the host's fence",
        ] {
            assert_eq!(lines_with(&o, want), 1, "{want}\n{}", dump(&o));
        }
    }
    let Some(mpirun) = mpirun() else { return };
    // The PUs the host bound each process to (pmix.cpuset) are its job information.
    if let Host::Mpirun(m) = &mpirun {
        let o = Command::new(m)
            .args(["--allow-run-as-root", "--bind-to", "core", "-n", "2"])
            .arg(example("fence_demo"))
            .env_remove("WEFT_WIREUP")
            .output()
            .expect("mpirun");
        assert!(o.status.success(), "{}", dump(&o));
        let mut localities = Vec::new();
        for r in 0..2 {
            assert_eq!(
                lines_with(
                    &o,
                    &format!("), psets [\"weft://world\", \"weft://self\"], cpuset {r}, ")
                ),
                1,
                "rank bound to core {r}\n{}",
                dump(&o)
            );
            // ... and where that core is (pmix.locstr), e.g. SK0:L30:L20:L1r:CRr:HTr.
            let out = String::from_utf8_lossy(&o.stdout);
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("rank {r}/2 ")))
                .unwrap_or_default();
            let loc = line
                .split(", locality ")
                .nth(1)
                .unwrap_or("none")
                .to_string();
            assert!(
                loc.starts_with("SK") && loc.contains(":CR"),
                "rank {r}: a locality string from the host\n{}",
                dump(&o)
            );
            localities.push(loc);
        }
        assert_ne!(localities[0], localities[1], "two cores, two localities");
    }
    let w = weft().display().to_string();
    let o = under_mpirun(&mpirun, 1, &[&w, "info"]);
    assert_eq!(
        lines_with(&o, "host: process sets: none defined by the host"),
        1,
        "{}",
        dump(&o)
    );
    assert!(o.status.success(), "{}", dump(&o));
    assert_eq!(
        lines_with(
            &o,
            "wire-up backend: pmix (the host's PMIx server: namespace "
        ),
        1,
        "{}",
        dump(&o)
    );
    assert_eq!(
        lines_with(&o, "pmix: client library OpenPMIx"),
        1,
        "{}",
        dump(&o)
    );
}

#[test]
fn group_constructs_that_disagree_and_what_is_not_mapped_yet_give_errors_that_say_so() {
    let Some(mpirun) = mpirun() else { return };
    let probe = probe("group_probe");
    // Members that construct one group with different members: every one is told.
    let o = under_mpirun(&mpirun, 4, &[&probe, "mismatch"]);
    assert_eq!(
        lines_with(&o, "constructs it with other members or directives"),
        4,
        "{}",
        dump(&o)
    );
    // The host has no PMIx groups: Weft's own construct, PGCIDs derived from the leader
    // (the group led by rank 1 of 4: 2 + (2^22 - 2) / 4), the same at every member.
    let o = under_mpirun(&mpirun, 4, &[&probe, "pgcids"]);
    assert!(o.status.success(), "pgcids\n{}", dump(&o));
    assert_eq!(
        lines_with(&o, " pgcids a 2 b 1048577 a-again 3 c 4"),
        3,
        "{}",
        dump(&o)
    );
    // Group queries are not mapped yet.
    let o = under_mpirun(&mpirun, 4, &[&probe, "basic"]);
    assert!(!o.status.success(), "basic\n{}", dump(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("not mapped onto PMIx yet"),
        "basic\n{}",
        dump(&o)
    );
    optional_leaves_out_a_latecomer(&mpirun);
}

/// An `optional` construct whose last member sits out: the others complete it without
/// it, with one PGCID, after the timeout (as under `weft run`, `cli/tests/groups.rs`).
fn optional_leaves_out_a_latecomer(host: &Host) {
    let o = under(host, 4, &[], &[&probe("group_probe"), "optional-timeout"]);
    assert!(o.status.success(), "optional-timeout\n{}", dump(&o));
    assert_eq!(
        lines_with(&o, "members [0, 1, 2] left_out [3]"),
        3,
        "{}",
        dump(&o)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let pgcids: std::collections::BTreeSet<&str> = out
        .lines()
        .filter_map(|l| l.split(" pgcid ").nth(1)?.split(' ').next())
        .collect();
    assert_eq!(pgcids.len(), 1, "{}", dump(&o));
}

/// What the survivors of a rank that aborted under Slurm printed: Slurm 22.05's PMIx
/// plugin cancels the job step once it loses a task's connection, so a survivor that is
/// slower than that cancellation prints nothing. At least one must have printed `want`,
/// and none anything else from the probe.
fn survivors_say(o: &Output, want: &str) {
    let said = lines_with(o, want);
    assert!(said >= 1, "no survivor printed {want:?}\n{}", dump(o));
    no_survivor_failed(o);
}

/// No survivor reported an error (one killed by Slurm's cancellation prints nothing).
fn no_survivor_failed(o: &Output) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("group_probe") && !err.contains("wireup_probe"),
        "a survivor failed\n{}",
        dump(o)
    );
}

/// Under Slurm: a plain construct with a member that died fails naming it; with
/// `notify_termination` it completes without it (see [`survivors_say`]).
#[test]
fn group_constructs_with_a_dead_member_under_slurm() {
    let Some(slurm) = slurm() else { return };
    let probe = probe("group_probe");
    for (scenario, want) in [
        ("killed-member", "construct failed: rank 3 gone"),
        ("killed-member-tolerant", "members [0, 1, 2] left_out [3]"),
    ] {
        // Slurm may cancel the step before any survivor prints (see `survivors_say`):
        // up to three runs, each checked for errors, one of which must print.
        let mut runs = Vec::new();
        for _ in 0..3 {
            let o = under_with(&slurm, 4, &[], &[&probe, scenario], false);
            no_survivor_failed(&o);
            let said = lines_with(&o, want) >= 1;
            runs.push(o);
            if said {
                break;
            }
        }
        let last = runs.last().expect("a run");
        survivors_say(last, want);
    }
    optional_leaves_out_a_latecomer(&slurm);
}

#[test]
fn a_bad_or_unusable_wireup_choice_is_named_at_once() {
    let demo = example("fence_demo");
    for (value, want) in [
        (
            "bogus",
            "WEFT_WIREUP=\"bogus\" is not valid: expected one of weft, pmix, auto",
        ),
        ("pmix", "wire-up through the host's PMIx server"),
    ] {
        let start = Instant::now();
        let o = Command::new(&demo)
            .env("WEFT_WIREUP", value)
            .env_remove("PMIX_NAMESPACE")
            .output()
            .expect("run fence_demo");
        assert!(!o.status.success(), "{}", dump(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "WEFT_WIREUP={value}: {}", dump(&o));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "took {:?}",
            start.elapsed()
        );
    }
}

/// A key committed after a Full fence is fetched when asked for (the get waits for it,
/// also under Slurm, whose servers answer "not found" until the owner commits), never
/// `NotFound`; a key nobody commits ends a bounded get with a timeout.
fn late_commits_under(host: &Host) {
    let o = under(host, 4, &[], &[&probe("wireup_probe"), "late-commits"]);
    assert!(o.status.success(), "late-commits\n{}", dump(&o));
    assert_eq!(lines_with(&o, " ok"), 4, "{}", dump(&o));
    let waited: Vec<u64> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split(" waited ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(waited.len(), 3, "{}", dump(&o));
    assert!(
        waited.iter().all(|&w| w >= 900),
        "the gets must have waited for the commit 1 s later: {waited:?}\n{}",
        dump(&o)
    );
}

/// A rank killed while the others wait in a fence: the job ends (no hang), non-zero,
/// with an error naming the rank. Under `mpirun` its runtime aborts the job and names
/// the rank; under Slurm (whose PMIx plugin sends no termination event and fails the
/// fence with "partial success") each survivor's fence fails naming rank 3, found dead
/// on the node.
fn killed_rank_under(host: &Host) {
    let start = Instant::now();
    let o = under(host, 4, &[], &[&probe("wireup_probe"), "kill-during-fence"]);
    let took = start.elapsed();
    assert!(!o.status.success(), "{}", dump(&o));
    assert!(
        took < Duration::from_secs(30),
        "took {took:?}\n{}",
        dump(&o)
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    match host {
        Host::Mpirun(_) => assert!(
            all.contains("process rank 3 with PID"),
            "mpirun names the killed rank\n{}",
            dump(&o)
        ),
        // Every survivor names it: from its node (the pid gone) or from the host's event.
        Host::WeftRun(_) => {
            assert_eq!(lines_with(&o, " saw rank 3 gone after "), 3, "{}", dump(&o));
            assert!(!all.contains("expected ProcGone"), "{}", dump(&o));
        }
        Host::Slurm => {
            let saw = lines_with(&o, " saw rank 3 gone after ");
            assert!(saw >= 1, "the survivors' fences name rank 3\n{}", dump(&o));
            assert!(all.contains("ended: its process (pid "), "{}", dump(&o));
            assert!(
                !all.contains("expected ProcGone"),
                "every survivor names it\n{}",
                dump(&o)
            );
        }
    }
}

#[test]
fn late_commits_are_waited_for_and_a_killed_rank_is_named_under_open_mpi_mpirun() {
    if let Some(host) = mpirun() {
        late_commits_under(&host);
        killed_rank_under(&host);
    }
}

#[test]
fn late_commits_are_waited_for_and_a_killed_rank_is_named_under_slurm() {
    if let Some(host) = slurm() {
        late_commits_under(&host);
        killed_rank_under(&host);
    }
}

/// Runs `script` (a job script calling `srun`) with `sbatch --wait` and through
/// `salloc`, as a user would; both end with the job's status and output.
#[test]
fn sbatch_and_salloc_of_a_job_script_that_calls_srun() {
    let Some(_slurm) = slurm() else { return };
    let dir = std::env::temp_dir().join(format!("weft-sbatch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let script = dir.join("job.sh");
    let out = dir.join("job.out");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n#SBATCH -n 4\n#SBATCH -t 2\nsrun --mpi=pmix {} --mode sparse\n",
            example("fence_demo")
        ),
    )
    .expect("write the job script");
    let o = Command::new("sbatch")
        .args(["--wait", "-o"])
        .arg(&out)
        .arg(&script)
        .output()
        .expect("run sbatch");
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(
        o.status.success(),
        "sbatch\n{}\njob output:\n{text}",
        dump(&o)
    );
    assert_eq!(
        text.lines().filter(|l| l.ends_with(" ok")).count(),
        4,
        "job output:\n{text}"
    );
    let o = Command::new("salloc")
        .args(["-n", "4", "sh"])
        .arg(&script)
        .output()
        .expect("run salloc");
    assert!(o.status.success(), "salloc\n{}", dump(&o));
    assert_eq!(lines_with(&o, " ok"), 4, "{}", dump(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fabric's multi-process conformance programs (as `cli/tests/fabric.rs` runs them under
/// `weft run`) under `host`: ping-pong of every size up to 4 MiB, non-blocking
/// all-to-all on 6 processes, argument errors, and a peer killed during a wait (eager
/// and rendezvous), which the survivor names within 2 s (or the host aborts the job
/// first, naming the rank, as `mpirun` may).
fn fabric_programs_under(host: &Host) {
    let pp = example("pingpong");
    let o = under(host, 2, &[], &[&pp, "--iters", "20"]);
    assert!(o.status.success(), "pingpong\n{}", dump(&o));
    assert_eq!(lines_with(&o, "pingpong ok"), 1, "{}", dump(&o));
    assert_eq!(lines_with(&o, "4194304 bytes"), 1, "{}", dump(&o));
    let probe = probe("fabric_probe");
    let o = under(host, 6, &[], &[&probe, "all-to-all"]);
    assert!(o.status.success(), "all-to-all\n{}", dump(&o));
    assert_eq!(lines_with(&o, " ok"), 6, "{}", dump(&o));
    let o = under(host, 3, &[], &[&probe, "errors"]);
    assert!(o.status.success(), "errors\n{}", dump(&o));
    for want in [
        "outside: rank 5 is not in the communicator (size 3)",
        "anytag: tag 4294967295 is reserved",
        "truncated: message truncated: rank ",
    ] {
        assert_eq!(lines_with(&o, want), 3, "{want}\n{}", dump(&o));
    }
    for scenario in ["dead-peer", "dead-peer-rendezvous"] {
        let o = under(host, 2, &[], &[&probe, scenario]);
        assert!(!o.status.success(), "{scenario}\n{}", dump(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        let seen: Vec<u64> = out
            .lines()
            .filter_map(|l| {
                l.split(" gone after ")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        let aborted = String::from_utf8_lossy(&o.stderr).contains("process rank 1 with PID");
        match (host, seen.first()) {
            (_, Some(&ms)) => assert!(ms < 2000, "{scenario}: {ms} ms\n{}", dump(&o)),
            (Host::Mpirun(_), None) => assert!(aborted, "{scenario}\n{}", dump(&o)),
            (Host::Slurm | Host::WeftRun(_), None) => {
                panic!("{scenario}: rank 0 did not name rank 1\n{}", dump(&o))
            }
        }
    }
}

#[test]
fn the_fabric_conformance_programs_under_open_mpi_mpirun() {
    if let Some(host) = mpirun() {
        fabric_programs_under(&host);
    }
}

#[test]
fn the_fabric_conformance_programs_under_slurm() {
    if let Some(host) = slurm() {
        fabric_programs_under(&host);
    }
}

/// Group events under Slurm (until it cancels the step: see [`survivors_say`]): the last
/// rank aborts in two `notify_termination` groups, one without a leader (every
/// member hears of it) and one led by rank 0 (only rank 0 does), through the handler
/// chain, as under `weft run` (`cli/tests/groups.rs`).
#[test]
fn member_failed_events_under_slurm() {
    let Some(slurm) = slurm() else { return };
    let o = under_with(
        &slurm,
        4,
        &[],
        &[&probe("group_probe"), "member-failed"],
        false,
    );
    assert!(!o.status.success(), "{}", dump(&o));
    survivors_say(&o, " member-failed groups ");
    let out = String::from_utf8_lossy(&o.stdout);
    // Each survivor that printed got the events due to it, through the handler chain.
    let line = |r: u32| {
        out.lines()
            .find(|l| l.starts_with(&format!("rank {r} member-failed")))
            .map(str::to_owned)
    };
    if let Some(l) = line(0) {
        assert!(l.contains(r#"groups ["all-hear", "leader-hears"]"#), "{l}");
    }
    for r in [1, 2] {
        if let Some(l) = line(r) {
            assert!(l.contains(r#"groups ["all-hear"] "#), "{l}");
            assert!(
                l.contains(r#""single[]@all-hear", "multi[\"single\"]@all-hear", "default[\"single\", \"multi\"]@all-hear""#),
                "{l}"
            );
        }
    }
}

/// `weft dvm start` inside a Slurm allocation (`salloc`, issue 33): its servers are started
/// by one `srun` step (a server's parent is Slurm's step daemon), a job submitted with
/// `weft run --dvm` runs there with the node's CPUs (the step is not bound to one), and
/// `weft dvm stop` ends the runtime and with it the allocation.
#[test]
fn a_persistent_runtime_inside_a_slurm_allocation_starts_its_servers_with_srun() {
    let Some(_slurm) = slurm() else { return };
    let dir = std::env::temp_dir().join(format!("weft-sdvm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let uri = dir.join("uri");
    let mut alloc = Command::new("salloc")
        .args(["-N", "1", "-n", "1"])
        .arg(weft())
        .args(["dvm", "start", "--report-uri"])
        .arg(&uri)
        .env("TMPDIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run salloc");
    let t0 = Instant::now();
    while !uri.exists() {
        if let Ok(Some(st)) = alloc.try_wait() {
            let o = alloc.wait_with_output().unwrap();
            panic!(
                "salloc ended ({st}) before the runtime was ready\n{}",
                dump(&o)
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the runtime did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let show = "grep Cpus_allowed_list /proc/self/status; \
                ppid=$(awk '/^PPid/ {print $2}' /proc/$PPID/status); \
                echo \"server parent $(cat /proc/$ppid/comm)\"";
    let o = Command::new(weft())
        .args(["run", "--dvm"])
        .arg(&uri)
        .args(["-n", "2", "sh", "-c", show])
        .env("TMPDIR", &dir)
        .output()
        .expect("weft run --dvm");
    assert!(o.status.success(), "{}", dump(&o));
    assert_eq!(
        lines_with(&o, "server parent slurmstepd"),
        2,
        "{}",
        dump(&o)
    );
    let cpus = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list"))
        .map(|l| l.split_whitespace().last().unwrap_or("").to_owned())
        .unwrap();
    assert_eq!(
        lines_with(&o, &format!("Cpus_allowed_list:\t{cpus}")),
        2,
        "the job's processes are not bound to part of the node: {}",
        dump(&o)
    );
    let o = Command::new(weft())
        .args(["run", "--dvm"])
        .arg(&uri)
        .args(["-n", "2", &example("fence_demo"), "--mode", "sparse"])
        .env("TMPDIR", &dir)
        .output()
        .expect("weft run --dvm");
    assert!(o.status.success(), "{}", dump(&o));
    assert_eq!(lines_with(&o, " ok"), 2, "{}", dump(&o));
    let o = Command::new(weft())
        .args(["dvm", "stop", "--dvm"])
        .arg(&uri)
        .output()
        .expect("weft dvm stop");
    assert!(o.status.success(), "{}", dump(&o));
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = alloc.try_wait().expect("wait") {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "salloc did not end");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(st.success(), "salloc: {st}");
    assert!(!uri.exists(), "the URI file is removed");
    let _ = std::fs::remove_dir_all(&dir);
}
