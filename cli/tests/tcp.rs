//! Jobs on several logical nodes talking over TCP on the host (no RDMA device needed):
//! the programs the soft-RoCE VM runs over verbs, here with `WEFT_TRANSPORTS=shm,tcp`
//! (so that TCP carries the traffic between nodes even where verbs could), every peer
//! over TCP on one node, and peers that die in the middle of a transfer.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{example, probe, run, segments_of};

const T: Duration = Duration::from_secs(120);
/// Shared memory within a node, TCP between nodes.
const SHM_TCP: &str = "WEFT_TRANSPORTS=shm,tcp";

#[test]
fn a_ring_on_two_and_four_nodes_over_tcp() {
    let ring = example("ring");
    for (name, nodes, n, bytes) in [
        ("tcpring2", "2", "4", "1048576"),
        ("tcpring4", "4", "8", "100000"),
        ("tcpring-small", "2", "4", "8"),
    ] {
        let done = run(
            name,
            &[
                "-x", SHM_TCP, "--nodes", nodes, "--map-by", "node", "-n", n, &ring, "--laps", "3",
                "--bytes", bytes,
            ],
            T,
        );
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert!(done.stdout.contains("ring ok"), "{}", done.dump());
        let left = segments_of(name);
        assert!(left.is_empty(), "{name}: segments left behind: {left:?}");
    }
}

#[test]
fn the_default_transports_reach_another_node_without_rdma() {
    // Outside the soft-RoCE VM verbs cannot open: the default order falls back to TCP.
    // (Inside it verbs carries the job; either way it must work.)
    let ring = example("ring");
    let done = run(
        "tcpdefault",
        &[
            "--nodes", "2", "--map-by", "node", "-n", "4", &ring, "--bytes", "300000",
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert!(done.stdout.contains("ring ok"), "{}", done.dump());
    // Every size from 0 B to 4 MiB across two nodes, and everyone to everyone
    // (non-blocking, shared memory within a node) on four.
    let pp = example("pingpong");
    let done = run(
        "tcpdefault-pp",
        &[
            "--nodes", "2", "--map-by", "node", "-n", "2", &pp, "--iters", "5",
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert!(done.stdout.contains("pingpong ok"), "{}", done.dump());
    assert!(done.stdout.contains("4194304 bytes"), "{}", done.dump());
    let probe = probe("fabric_probe");
    let done = run(
        "tcpdefault-a2a",
        &[
            "--nodes",
            "4",
            "--map-by",
            "node",
            "-n",
            "8",
            &probe,
            "all-to-all",
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok"), 8, "{}", done.dump());
}

#[test]
fn sessions_demo_on_two_nodes_over_tcp() {
    let demo = example("sessions_demo");
    let done = run(
        "tcpsessions",
        &[
            "-x", SHM_TCP, "--nodes", "2", "--map-by", "node", "-n", "4", &demo,
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" size 4 pgcid "), 8, "{}", done.dump());
}

#[test]
fn threads_make_sessions_and_talk_across_nodes_over_tcp() {
    let probe = probe("session_probe");
    let done = run(
        "tcpthreads",
        &[
            "-x", SHM_TCP, "--nodes", "2", "--map-by", "node", "-n", "4", &probe, "thread",
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(
        done.lines_with("threads ok provided single,funneled,serialized,multiple"),
        4,
        "{}",
        done.dump()
    );
}

#[test]
fn every_peer_over_tcp_on_one_node() {
    // WEFT_TRANSPORTS=tcp: even processes of one node talk over TCP (no shared memory).
    let probe = probe("fabric_probe");
    let done = run(
        "tcponly",
        &["-x", "WEFT_TRANSPORTS=tcp", "-n", "5", &probe, "all-to-all"],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok"), 5, "{}", done.dump());
    let pp = example("pingpong");
    let done = run(
        "tcponly-pp",
        &["-x", "WEFT_TRANSPORTS=tcp", "-n", "2", &pp, "--iters", "5"],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert!(done.stdout.contains("pingpong ok"), "{}", done.dump());
    assert!(done.stdout.contains("4194304 bytes"), "{}", done.dump());
}

#[test]
fn a_first_send_to_a_fencing_or_busy_peer_over_tcp_completes() {
    let probe = probe("fabric_probe");
    for scenario in ["first-send-to-a-fencing-peer", "first-send-to-a-busy-peer"] {
        let done = run(
            scenario,
            &[
                "-x", SHM_TCP, "--nodes", "2", "--map-by", "node", "-n", "2", &probe, scenario,
            ],
            T,
        );
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert_eq!(done.lines_with(" ok"), 2, "{scenario}\n{}", done.dump());
    }
}

#[test]
fn a_peer_killed_over_tcp_fails_the_wait_within_two_seconds() {
    let probe = probe("fabric_probe");
    for (scenario, victim) in [
        ("dead-peer", 1),
        ("dead-peer-rendezvous", 1),
        ("dead-receiver-mid-transfer", 1),
        ("dead-sender-mid-transfer", 0),
    ] {
        let done = run(
            scenario,
            &[
                "-x", SHM_TCP, "--nodes", "2", "--map-by", "node", "-n", "2", &probe, scenario,
            ],
            T,
        );
        assert!(
            done.stderr.contains(&format!("rank {victim}"))
                && done.stderr.contains("killed by signal 9"),
            "{scenario}\n{}",
            done.dump()
        );
        let ms = *done.gone_after_ms().first().unwrap_or_else(|| {
            panic!(
                "{scenario}: the survivor did not see the death\n{}",
                done.dump()
            )
        });
        assert!(ms < 2000, "{scenario}: {ms} ms\n{}", done.dump());
        assert!(
            !done.stderr.contains("the transfer ended before the kill")
                && !done.stderr.contains("holds wrong data"),
            "{scenario}\n{}",
            done.dump()
        );
    }
}

#[test]
fn a_receiver_that_does_not_keep_up_stalls_the_sender_and_loses_nothing() {
    let probe = probe("fabric_probe");
    let done = run(
        "tcpflow",
        &[
            "-x",
            SHM_TCP,
            "--nodes",
            "2",
            "--map-by",
            "node",
            "-n",
            "2",
            &probe,
            "flow-control",
        ],
        T,
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok"), 2, "{}", done.dump());
    let early: u32 = done
        .stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("rank 0 sent ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no count\n{}", done.dump()));
    // 60 KiB each: the socket buffers, the endpoint's 4 MiB queue and the fabric's 4 MiB
    // backlog hold a few hundred at most; without a bound all 2000 (120 MB) would go.
    assert!(
        early < 1000,
        "{early} of 2000 sends completed while the receiver slept"
    );
}

/// The first send to a peer that has published its card but computes outside any Weft call
/// waits for the TCP handshake without the engine lock: another thread of the process keeps
/// messaging meanwhile.
#[test]
fn waiting_for_a_busy_peers_handshake_does_not_stall_other_threads() {
    let p = probe("fabric_probe");
    let done = run(
        "tcpbusypeer",
        &["-x", "WEFT_TRANSPORTS=tcp", "-n", "3", &p, "busy-peer"],
        Duration::from_secs(60),
    );
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with(" ok"), 3, "{}", done.dump());
    let (waited, meanwhile, line) = done.slow_peer_figures();
    assert!(
        waited >= 1500,
        "the send did not wait for the busy peer: {line}"
    );
    assert!(meanwhile >= 100, "the other thread was stalled: {line}");
}
