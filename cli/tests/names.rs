//! The name service through the real launcher and servers (`Client::publish`, `lookup`,
//! `unpublish`; issue 33): a name published by one job is found by its other ranks and by
//! a job it spawned, a lookup waits for a name published later, on one node and across
//! two (where the requests travel to the root server); a duplicate, a lookup of a name
//! nobody publishes (at once and after a wait) and a withdrawal of another process's name
//! fail, each naming the key; `weft bench names` reports its three times. (PMIx programs:
//! OpenPMIx's `pub.c` and `pubi.c` in `mpi.rs`.)
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{probe, Job};

#[test]
fn names_cross_jobs_and_nodes_and_wrong_requests_name_the_key() {
    let p = probe("names_probe");
    for nodes in ["1", "2"] {
        let job = Job::start(
            &format!("names-{nodes}"),
            &["--nodes", nodes, "-n", "2", &p, "pair"],
        );
        let name = job.name.clone();
        let done = job.wait(Duration::from_secs(60));
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        let parent = format!("weft-{name}");
        let mut want = vec![
            format!("rank 0 spawned {parent}.2"),
            format!("rank 1 found parent-port=p0 from {parent}:0"),
            format!("child found parent-port=p0 from {parent}:0"),
            "rank 0 again: publish: published already: [\"parent-port\"]".to_string(),
            "child withdrawing: unpublish: not published: [\"parent-port\"]".to_string(),
            format!("rank 0 found child-port=c0 from {parent}.2:0"),
            "rank 0 at once: lookup: not published: [\"nobody\"]".to_string(),
            "rank 0 briefly: lookup: still not published when the wait ended: [\"nobody\"]"
                .to_string(),
        ];
        let mut got: Vec<String> = done.stdout.lines().map(str::to_owned).collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{}", done.dump());
    }
}

#[test]
fn bench_names_prints_lookup_publish_and_wait_times_in_json_on_one_and_two_nodes() {
    for nodes in ["1", "2"] {
        let tmp = std::env::temp_dir().join(format!(
            "weft-tests/bench-names-{nodes}-{}",
            std::process::id()
        ));
        let (rows, stdout) = common::bench_json(
            &[
                "bench", "names", "--nodes", nodes, "--iters", "20", "--waits", "3", "--json",
            ],
            &tmp,
        );
        assert_eq!(rows.len(), 3, "{stdout}");
        for (what, samples) in [("lookup", 20), ("publish", 20), ("wait", 3)] {
            let r = rows
                .iter()
                .find(|r| r["what"] == what)
                .unwrap_or_else(|| panic!("no {what} row: {stdout}"));
            assert_eq!(r["bench"], "names", "{stdout}");
            assert_eq!(r["nodes"], nodes.parse::<u64>().unwrap(), "{stdout}");
            assert_eq!(r["samples"], samples, "{stdout}");
            let median = r["median_us"].as_f64().unwrap();
            // (A waiting lookup answered before its publish would show 0: the time is
            // the answer's minus the publish's, saturating.)
            assert!(median > 0.0, "{what}: {stdout}");
        }
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
