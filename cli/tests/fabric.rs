//! The fabric through the real launcher: processes, shared memory, wire-up.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{alive, example, pids_whose, probe, run, segments_of, Job};

const T: Duration = Duration::from_secs(120);

#[test]
fn ring_over_shared_memory() {
    let ring = example("ring");
    for (name, n, bytes) in [
        ("ring2", "2", "8"),
        ("ring4", "4", "1048576"),
        ("ring5", "5", "100000"),
    ] {
        let done = run(name, &["-n", n, &ring, "--laps", "3", "--bytes", bytes], T);
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert!(done.stdout.contains("ring ok"), "{}", done.dump());
    }
}

#[test]
fn ring_with_pipelined_copies() {
    let ring = example("ring");
    let done = run(
        "ringpipe",
        &[
            "-x",
            "WEFT_SHM_SINGLE_COPY=none",
            "-n",
            "3",
            &ring,
            "--bytes",
            "3000000",
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert!(done.stdout.contains("ring ok"), "{}", done.dump());
}

#[test]
fn pingpong_every_size() {
    let pp = example("pingpong");
    let done = run(
        "pingpong",
        &["--bind-to", "core", "-n", "2", &pp, "--iters", "20"],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert!(done.stdout.contains("pingpong ok"), "{}", done.dump());
    assert!(done.stdout.contains("4194304 bytes"), "{}", done.dump());
}

#[test]
fn all_to_all_nonblocking() {
    let probe = probe("fabric_probe");
    let done = run("a2a", &["-n", "6", &probe, "all-to-all"], T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok"), 6, "{}", done.dump());
}

#[test]
fn bad_arguments_are_clear_errors() {
    let probe = probe("fabric_probe");
    let done = run("fabricerr", &["-n", "3", &probe, "errors"], T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    for want in [
        "rank 0 outside: rank 5 is not in the communicator (size 3)",
        "rank 1 anytag: tag 4294967295 is reserved",
        "rank 2 truncated: message truncated: rank 1 sent 300 bytes with tag 4, the receive buffer holds 3",
    ] {
        assert!(done.stdout.contains(want), "missing {want:?}\n{}", done.dump());
    }
}

#[test]
fn a_dead_peer_fails_the_wait_within_two_seconds() {
    let probe = probe("fabric_probe");
    for scenario in ["dead-peer", "dead-peer-rendezvous"] {
        let done = run(scenario, &["-n", "2", &probe, scenario], T);
        assert!(
            done.stderr.contains("rank 1") && done.stderr.contains("killed by signal 9"),
            "{}",
            done.dump()
        );
        let ms = *done
            .gone_after_ms()
            .first()
            .unwrap_or_else(|| panic!("rank 0 did not see the death\n{}", done.dump()));
        assert!(ms < 2000, "{scenario}: {ms} ms\n{}", done.dump());
        if scenario == "dead-peer" {
            assert!(
                done.stdout.contains("wildcard receive failed too"),
                "{}",
                done.dump()
            );
        }
    }
}

/// A wildcard receive fails when every possible sender is gone, and names the one that
/// failed of itself, not one terminated (SIGTERM) after it.
#[test]
fn a_failed_wildcard_receive_names_the_cause_not_a_terminated_rank() {
    let probe = probe("fabric_probe");
    let done = run(
        "wildcard-cause",
        &["--keep-going", "-n", "3", &probe, "wildcard-cause"],
        T,
    );
    assert!(
        done.stdout
            .contains("wildcard receive failed naming rank 2: exited with code 5"),
        "{}",
        done.dump()
    );
}

#[test]
fn a_process_on_another_node_without_verbs_or_tcp_is_a_clear_no_path_error() {
    let probe = probe("fabric_probe");
    // With shared memory alone another node is unreachable, and the error says why for
    // each transport.
    let done = run(
        "nopath",
        &[
            "-x",
            "WEFT_TRANSPORTS=shm",
            "--nodes",
            "2",
            "-n",
            "2",
            &probe,
            "errors",
        ],
        T,
    );
    assert_ne!(done.code(), Some(0));
    assert!(
        done.stderr
            .contains("no path to rank 1: it runs on node 1; WEFT_TRANSPORTS excludes verbs; WEFT_TRANSPORTS excludes tcp"),
        "{}",
        done.dump()
    );
    let done = run(
        "nopath-bad",
        &[
            "-x",
            "WEFT_TRANSPORTS=shm,carrier-pigeon",
            "-n",
            "2",
            &probe,
            "errors",
        ],
        T,
    );
    assert_ne!(done.code(), Some(0));
    assert!(
        done.stderr.contains("WEFT_TRANSPORTS")
            && done.stderr.contains("unknown transport \"carrier-pigeon\""),
        "{}",
        done.dump()
    );
}

#[test]
fn cma_single_copy_and_its_fallback_when_the_kernel_refuses_it() {
    let probe = probe("fabric_probe");
    let done = run(
        "cmaok",
        &["-x", "WEFT_SHM_SINGLE_COPY=cma", "-n", "2", &probe, "cma"],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert!(
        done.stdout.contains("rank 1 received 1 MiB by cma"),
        "{}",
        done.dump()
    );
    // A real refusal: as an unprivileged user, process_vm_readv of a non-dumpable process
    // fails with EPERM. That needs root to switch users; say so instead of passing silently.
    if !rustix::process::getuid().is_root() || !std::path::Path::new("/usr/bin/setpriv").exists() {
        eprintln!(
            "SKIPPED part: the CMA refusal case needs root and setpriv to run the job as nobody"
        );
        return;
    }
    // `nobody` must be able to reach the binaries and the working directory.
    let cwd = std::env::current_dir().unwrap();
    for p in [common::weft(), std::path::PathBuf::from(&probe), cwd] {
        let blocked = p.ancestors().skip(1).find(|a| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(a).map_or(true, |m| m.permissions().mode() & 0o001 == 0)
        });
        if let Some(dir) = blocked {
            eprintln!(
                "SKIPPED part: the CMA refusal case runs the job as nobody, who cannot enter {}",
                dir.display()
            );
            return;
        }
    }
    let prefix = [
        "/usr/bin/setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    // Runs `weft run ARGS` as nobody; it must succeed and print `expect`.
    let as_nobody = |name: &str, args: &[&str], expect: &str| {
        let job = common::Job::start_as(name, &prefix, args, std::process::Stdio::null());
        let done = job.wait(T);
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert!(done.stdout.contains(expect), "{}", done.dump());
    };
    as_nobody(
        "cmarefused",
        &[
            "-x",
            "WEFT_SHM_SINGLE_COPY=cma",
            "-n",
            "2",
            &probe,
            "cma-refused",
        ],
        "rank 1 received 1 MiB by pipelined",
    );
    // A split single copy whose sender may not write into the receiver: the receiver
    // reads that part itself.
    as_nobody(
        "cmasplitrefused",
        &["-n", "2", &probe, "cma-split-refused"],
        "rank 1 received 1052897 bytes by cma",
    );
}

/// Issue 14, item 9: the first send to a peer that has not published its card yet waits
/// for it without the engine lock: another thread of the process keeps messaging.
#[test]
fn waiting_for_a_late_peers_card_does_not_stall_other_threads() {
    let p = probe("fabric_probe");
    let done = run(
        "slowpeer",
        &["-n", "3", &p, "slow-peer"],
        Duration::from_secs(60),
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok"), 3, "{}", done.dump());
    let (waited, meanwhile, line) = done.slow_peer_figures();
    assert!(
        waited >= 1500,
        "the send did not wait for the late card: {line}"
    );
    assert!(meanwhile >= 100, "the other thread was stalled: {line}");
}

/// The wait for a late peer's card is `WEFT_CARD_TIMEOUT`: set to 1 s against a peer that
/// starts its fabric 3 s late, the first send fails, naming the peer, the wait and the
/// variable.
#[test]
fn a_card_that_does_not_come_within_weft_card_timeout_names_it() {
    let p = probe("fabric_probe");
    let t0 = Instant::now();
    let done = run(
        "cardwait",
        &["-x", "WEFT_CARD_TIMEOUT=1s", "-n", "3", &p, "slow-peer"],
        Duration::from_secs(60),
    );
    assert_ne!(done.code(), Some(0), "{}", done.dump());
    let want = "no path to rank 2: no shared-memory card after waiting 1s (WEFT_CARD_TIMEOUT)";
    assert!(done.stderr.contains(want), "{}", done.dump());
    assert!(t0.elapsed() < Duration::from_secs(30), "{}", done.dump());
}

/// `WEFT_OVERSUBSCRIBED` takes a switch (or auto): anything else fails the fabric's init,
/// naming the variable and its value.
#[test]
fn a_bad_weft_oversubscribed_fails_init_naming_it() {
    let p = probe("fabric_probe");
    let done = run(
        "oversub-bad",
        &[
            "-x",
            "WEFT_OVERSUBSCRIBED=maybe",
            "-n",
            "2",
            &p,
            "slow-peer",
        ],
        Duration::from_secs(60),
    );
    assert_ne!(done.code(), Some(0), "{}", done.dump());
    let want = "WEFT_OVERSUBSCRIBED=\"maybe\"";
    assert!(done.stderr.contains(want), "{}", done.dump());
    // Set on (and off), the job runs.
    for v in ["on", "off"] {
        let done = run(
            &format!("oversub-{v}"),
            &[
                "-x",
                &format!("WEFT_OVERSUBSCRIBED={v}"),
                "-n",
                "2",
                &p,
                "all-to-all",
            ],
            Duration::from_secs(60),
        );
        assert_eq!(done.code(), Some(0), "{v}: {}", done.dump());
    }
}

/// When a node's server dies, its processes, waiting on each other in shared memory
/// (nothing in their datastore will ever say a peer is gone), notice that their server
/// is lost and end within seconds instead of waiting for ever; the job leaves nothing.
#[test]
fn the_processes_of_a_killed_server_end() {
    orphans_end("orphans", "recv");
}

/// As [`the_processes_of_a_killed_server_end`], the orphans waiting in a probe for a
/// message from any source.
#[test]
fn the_processes_of_a_killed_server_end_from_a_probe() {
    orphans_end("orphprobe", "probe");
}

/// As [`the_processes_of_a_killed_server_end`], one orphan waiting in the node's
/// shared-memory part of a broadcast for the broadcast's root, the other orphan, which
/// waits for a message instead and ends (its server lost) without a word to the first:
/// its dead server can no longer say so (the chaos runs found such a rank waiting for
/// ever).
#[test]
fn the_processes_of_a_killed_server_end_from_a_collective() {
    orphans_end("orphbcast", "bcast");
}

fn orphans_end(name: &str, how: &str) {
    let p = probe("fabric_probe");
    let job = Job::start(name, &["--nodes", "2", "-n", "4", &p, "wait-forever", how]);
    let name = job.name.clone();
    let ranks_of_node1 = || {
        pids_whose("environ", |e| {
            e.contains(&format!("WEFT_NSPACE=weft-{name} ")) && e.contains("WEFT_NODE=1 ")
        })
    };
    let t0 = Instant::now();
    while ranks_of_node1().len() < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the job did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let orphans = ranks_of_node1();
    let server = pids_whose("cmdline", |c| {
        c.contains(" server ") && c.contains(&format!("/{name} ")) && c.contains("--node 1 ")
    });
    assert_eq!(server.len(), 1, "one server of node 1: {server:?}");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(server[0] as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let t0 = Instant::now();
    while orphans.iter().any(|&o| alive(o)) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the ranks of the killed server still run after 10 s: {orphans:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let done = job.wait(Duration::from_secs(30));
    assert_ne!(done.code(), Some(0), "{}", done.dump());
    assert!(
        segments_of(&name).is_empty(),
        "segments left: {:?}",
        segments_of(&name)
    );
}

/// Issue 14, item 9: a split single-copy receive does not depend on its sender's progress:
/// with the sender computing for 2 s, the receiver takes the sender's half over (the
/// claim word in its inbox) and completes at once; the data is exact.
#[test]
fn a_split_receive_completes_while_its_sender_computes() {
    let p = probe("fabric_probe");
    let done = run("splitbusy", &["-n", "2", &p, "split-busy-sender"], T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok"), 2, "{}", done.dump());
    let ms: u64 = done
        .stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("rank 1 received 4 MiB from a busy sender in ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no timing line\n{}", done.dump()));
    assert!(ms < 1000, "the receive waited {ms} ms for its busy sender");
}

/// The lines of `out` that start with `prefix`, without it.
fn after<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter_map(|l| l.strip_prefix(prefix)).collect()
}

/// What the process of merged rank `rank` prints after the merge of 2 parents (first)
/// and `children`: the allreduce of the ranks, rank 0's bcast, and the split in even and
/// odd ranks with the sum of its half's ranks.
fn merged(rank: u32, children: u32) -> String {
    let size = 2 + children;
    let half: Vec<u32> = (0..size).filter(|r| r % 2 == rank % 2).collect();
    format!(
        "merged rank {rank} of {size}, sum {}, bcast 4242, half {} of {} sum {}",
        size * (size - 1) / 2,
        half.iter().position(|&r| r == rank).expect("a member"),
        half.len(),
        half.iter().sum::<u32>()
    )
}

/// A parent world of 2 spawns `children` through `Communicator::spawn`; each side checks
/// the 8 B and 1 MiB messages the other sent (one received by a wildcard) and
/// disconnects. `prefix`: what runs `weft run` (an `env` that sets the transports).
fn intercomm_job(name: &str, prefix: &[&str], args: &[&str], children: u32) {
    let probe = probe("intercomm_probe");
    let mut all: Vec<&str> = args.to_vec();
    let n = children.to_string();
    all.extend([probe.as_str(), "parent", n.as_str()]);
    let done = common::Job::start_as(name, prefix, &all, std::process::Stdio::null()).wait(T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    let parents = "[ns1:0 ns1:1]";
    let kids: Vec<String> = (0..children).map(|c| format!("ns2:{c}")).collect();
    let kids = format!("[{}]", kids.join(" "));
    let mut ctx = Vec::new();
    for r in 0..2 {
        let head = after(&done.stdout, &format!("parent {r}/2: ctx "));
        assert_eq!(head.len(), 1, "{}", done.dump());
        let (c, remote) = head[0].split_once(" remote ").expect("a remote group");
        assert_eq!(remote, kids, "{}", done.dump());
        ctx.push(c.to_owned());
        let mine = after(&done.stdout, &format!("parent {r}: "));
        assert_eq!(
            mine,
            [
                format!("exchanged with {children} children").as_str(),
                &merged(r, children),
                "disconnected"
            ],
            "{}",
            done.dump()
        );
    }
    for c in 0..children {
        let head = after(&done.stdout, &format!("child {c}/{children}: ctx "));
        assert_eq!(head.len(), 1, "{}", done.dump());
        let (x, remote) = head[0].split_once(" remote ").expect("a remote group");
        assert_eq!(remote, parents, "{}", done.dump());
        ctx.push(x.to_owned());
        let mine = after(&done.stdout, &format!("child {c}: "));
        assert_eq!(mine.len(), 3, "{}", done.dump());
        assert!(
            mine[0].starts_with("exchanged with 2 parents (first from "),
            "{}",
            done.dump()
        );
        assert_eq!(mine[1], merged(2 + c, children), "{}", done.dump());
        assert_eq!(mine[2], "disconnected", "{}", done.dump());
    }
    // One context id for the connect, not the world's (1).
    assert!(ctx.iter().all(|c| *c == ctx[0]) && ctx[0] != "1", "{ctx:?}");
}

#[test]
fn a_spawned_job_and_its_parents_exchange_messages_through_an_intercommunicator() {
    // Parents on nodes 0 and 1, children on node 1: parent 0 reaches them by TCP,
    // parent 1 by shared memory (CMA for 1 MiB).
    intercomm_job(
        "icomm",
        &[],
        &["--nodes", "2", "--map-by", "node", "-n", "2"],
        3,
    );
}

#[test]
fn an_intercommunicator_over_tcp_alone() {
    intercomm_job("icommtcp", &["env", "WEFT_TRANSPORTS=tcp"], &["-n", "2"], 2);
}

#[test]
fn a_child_that_dies_fails_its_parents_exchange_naming_a_child() {
    let probe = probe("intercomm_probe");
    let done = common::Job::start(
        "icommdie",
        &[
            "--nodes", "2", "--map-by", "node", "-n", "2", &probe, "parent", "3", "die",
        ],
    )
    .wait(T);
    // The parents handle the failure: their job ends well, the spawned one failed.
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    for r in 0..2 {
        let mine = after(&done.stdout, &format!("parent {r}: failed: rank "));
        assert_eq!(mine.len(), 1, "{}", done.dump());
        assert!(mine[0].contains(" is gone: ns2:"), "{}", done.dump());
    }
}

/// A wildcard receive on an intercommunicator whose remote group is one process fails
/// when that process dies (a one-process remote group has no other sender to wait for).
#[test]
fn a_wildcard_receive_from_a_lone_parent_fails_when_it_dies() {
    let probe = probe("intercomm_probe");
    // --keep-going: the parent job's failure does not end the child, which must notice.
    let done = run(
        "icommlone",
        &["--keep-going", "-n", "1", &probe, "lone-parent"],
        T,
    );
    assert_eq!(done.code(), Some(3), "{}", done.dump());
    assert!(
        done.stdout
            .contains("lone child: rank 0 is gone: ns1:0 exited with code 3"),
        "{}",
        done.dump()
    );
    // A child that waits on nothing ends with its parent job's failure all the same.
    let done = run("icommidle", &["-n", "1", &probe, "lone-parent", "idle"], T);
    assert_eq!(done.code(), Some(3), "{}", done.dump());
    assert!(done.elapsed < Duration::from_secs(30), "{}", done.dump());
    assert!(!done.stdout.contains("slept"), "{}", done.dump());
}

#[test]
fn a_job_spawned_without_an_intercommunicator_has_no_parent_one() {
    let probe = probe("intercomm_probe");
    let done = run("icommplain", &["-n", "1", &probe, "plain-parent"], T);
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    for r in 0..2 {
        let want = format!("plain child {r}: parent none, in 0 s");
        assert!(done.stdout.contains(&want), "{want}\n{}", done.dump());
    }
}

#[test]
fn a_process_waiting_in_its_worlds_barrier_answers_an_intercommunicators_handshake() {
    // Over TCP the parent's first send to child 0 needs child 0 to take the connection's
    // handshake, while child 0 waits in a barrier for child 1, which waits for the
    // parent's message to it, sent after child 0's: without the wait progressing every
    // engine of the process, this never ends.
    let probe = probe("intercomm_probe");
    let done = common::Job::start_as(
        "icommprog",
        &["env", "WEFT_TRANSPORTS=tcp"],
        &["-n", "1", &probe, "progress-parent", "2"],
        std::process::Stdio::null(),
    )
    .wait(Duration::from_secs(60));
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(
        after(&done.stdout, "parent: "),
        ["sent to 2 children"],
        "{}",
        done.dump()
    );
    assert_eq!(
        after(&done.stdout, "child 0: "),
        ["got 10"],
        "{}",
        done.dump()
    );
    assert_eq!(
        after(&done.stdout, "child 1: "),
        ["got 11"],
        "{}",
        done.dump()
    );
}

/// `weft bench mr --pairs 2` (osu_mbw_mr): a job of 4 started by the benchmark itself, one
/// JSON row per size with the pairs' aggregate; `--pairs` is for `mr` only.
#[test]
fn bench_mr_pairs_prints_the_aggregate_rate_in_json() {
    let tmp = std::env::temp_dir().join(format!("weft-tests/bench-mr-{}", std::process::id()));
    let (rows, stdout) = common::bench_json(
        &[
            "bench", "mr", "--pairs", "2", "--sizes", "8,100", "--iters", "5", "--warmup", "1",
            "--json",
        ],
        &tmp,
    );
    assert_eq!(rows.len(), 2, "{stdout}");
    for (r, size) in rows.iter().zip([8, 100]) {
        assert_eq!(r["bench"], "mr", "{stdout}");
        assert_eq!(r["pairs"], 2, "{stdout}");
        assert_eq!(r["size"], size, "{stdout}");
        assert!(r["msg_rate"].as_f64().unwrap() > 0.0, "{stdout}");
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let out = std::process::Command::new(common::weft())
        .args(["bench", "latency", "--pairs", "2"])
        .output()
        .expect("weft bench");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("--pairs is for `weft bench mr`"), "{err}");
}
