//! Weft's benchmark programs, run as `weft bench NAME`.
//!
//! Each prints an OSU-style table, or one JSON object per line with `--json`.
//!
//! | name      | what it measures                                                        |
//! |-----------|-------------------------------------------------------------------------|
//! | `latency` | one-way latency of blocking send/recv between 2 processes (osu_latency) |
//! | `bw`      | bandwidth of windows of 64 isends, each window acked (osu_bw)           |
//! | `bibw`    | the same in both directions at once (osu_bibw)                          |
//! | `mr`      | message rate of windows of 64 isends (osu_mbw_mr with one pair)         |
//! | `coll`    | collective latency (osu_barrier, osu_bcast, osu_allreduce, ...)        |
//! | `fence`   | put + commit + fence in Full, Sparse and SyncOnly modes; `get` latency  |
//! | `group`   | group construct with a PGCID; communicator creation from a group        |
//! | `limit`   | the floor: cache-line ping-pong one-way time, single-core memcpy        |
//! | `spawn`   | `Client::spawn` of N processes: until it returns, until all initialized |
//! | `names`   | the name service: lookup, publish, a waiting lookup after the publish   |
//!
//! `latency`, `bw`, `bibw`, `mr` and `limit` run between two processes: started alone they
//! launch themselves as a job of two (bound to different cores when there are two), under
//! `weft run -n 2` they measure the job they run in. `latency` and `bw` also measure the
//! floor of `limit` in the same job (`--no-limit` skips it) and print the ratio to it.
//!
//! The sweep benchmarks share their options and output (`--sizes`, `--json`, `--plot`,
//! OSU-style tables, a progress bar) through the crate-internal `osu` module.

mod coll;
mod fence;
mod group;
mod limit;
mod names;
mod osu;
mod p2p;
mod spawn;
mod stats;

use p2p::Bench;

/// The benchmarks, with a one-line description each (for `weft bench --help`).
const BENCHES: &[(&str, &str)] = &[
    (Bench::Latency.name(), Bench::Latency.about()),
    (Bench::Bw.name(), Bench::Bw.about()),
    (Bench::Bibw.name(), Bench::Bibw.about()),
    (Bench::Mr.name(), Bench::Mr.about()),
    (
        "coll",
        "collective latency: barrier, bcast, reduce, allreduce, allgather, alltoall",
    ),
    (
        "fence",
        "put + commit + fence (Full, Sparse, SyncOnly) and get latency",
    ),
    (
        "group",
        "group construct with a PGCID, communicator creation from a session group",
    ),
    (
        "limit",
        "this machine's floor: cache-line ping-pong and single-core memcpy",
    ),
    (
        "spawn",
        "Client::spawn of N processes: until it returns, until they all initialized",
    ),
    (
        "names",
        "the name service: lookup, publish, a waiting lookup after the publish",
    ),
];

fn usage() -> String {
    let mut s = String::from(
        "usage: weft bench NAME [OPTIONS]   (weft bench NAME --help for the options)\n\nbenchmarks:\n",
    );
    for (name, what) in BENCHES {
        s.push_str(&format!("  {name:<8} {what}\n"));
    }
    s
}

/// Runs `weft bench ARGS...` and returns the exit status: `ARGS[0]` names the benchmark,
/// the rest are its options.
///
/// A benchmark started alone launches itself as a job of several processes by running
/// `std::env::current_exe()` with `bench NAME OPTIONS...` under Weft's launcher, so the
/// calling executable must be one that dispatches `bench` here (the `weft` command).
pub fn main(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        Some("latency") => p2p::main(Bench::Latency, &args[1..]),
        Some("bw") => p2p::main(Bench::Bw, &args[1..]),
        Some("bibw") => p2p::main(Bench::Bibw, &args[1..]),
        Some("mr") => p2p::main(Bench::Mr, &args[1..]),
        Some("coll") => coll::main(&args[1..]),
        Some("fence") => fence::main(&args[1..]),
        Some("group") => group::main(&args[1..]),
        Some("spawn") => spawn::main(&args[1..]),
        Some("names") => names::main(&args[1..]),
        Some("limit") => limit::main(&args[1..]),
        None => {
            eprint!("{}", usage());
            2
        }
        Some("--help" | "-h" | "help") => {
            print!("{}", usage());
            0
        }
        Some(other) => {
            eprint!("weft bench: unknown benchmark {other:?}\n{}", usage());
            2
        }
    }
}
