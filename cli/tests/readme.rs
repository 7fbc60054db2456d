//! Issue 31, item 7: every ```rust block of README.md is real code. Each occurs verbatim
//! (modulo indentation) in an example program between `// README: <name>` and
//! `// README end`, and every such region is a README block, so the two cannot drift;
//! the examples run under `weft run` and print what a reader of the README expects.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{example, run};

const T: Duration = Duration::from_secs(120);

/// A block's lines with leading and trailing white space removed, blank ends dropped.
fn normalize(lines: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = lines.iter().map(|l| l.trim().to_owned()).collect();
    while v.first().is_some_and(String::is_empty) {
        v.remove(0);
    }
    while v.last().is_some_and(String::is_empty) {
        v.pop();
    }
    v
}

/// The ```rust blocks of README.md (line number, lines).
fn readme_blocks() -> Vec<(usize, Vec<String>)> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_start().starts_with("```rust") {
            let start = i + 1;
            let end = (start..lines.len())
                .find(|&j| lines[j].trim_start().starts_with("```"))
                .unwrap_or_else(|| panic!("README.md:{}: unclosed ```rust block", i + 1));
            out.push((i + 1, normalize(&lines[start..end])));
            i = end;
        }
        i += 1;
    }
    out
}

/// The marked regions of examples/*.rs: (file:name, lines).
fn example_regions() -> Vec<(String, Vec<String>)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let mut i = 0;
        while i < lines.len() {
            if let Some(name) = lines[i].trim().strip_prefix("// README: ") {
                let end = (i + 1..lines.len())
                    .find(|&j| lines[j].trim() == "// README end")
                    .unwrap_or_else(|| panic!("{file}:{}: no `// README end`", i + 1));
                out.push((format!("{file}:{name}"), normalize(&lines[i + 1..end])));
                i = end;
            }
            i += 1;
        }
    }
    out
}

#[test]
fn every_readme_rust_block_is_an_example_and_every_marked_example_a_readme_block() {
    let blocks = readme_blocks();
    let regions = example_regions();
    assert!(
        blocks.len() >= 6,
        "README.md has {} rust blocks",
        blocks.len()
    );
    for (line, block) in &blocks {
        assert!(
            regions.iter().any(|(_, r)| r == block),
            "README.md:{line}: this ```rust block is in no example between `// README: <name>` \
             and `// README end` (edit the example with the README):\n{}",
            block.join("\n")
        );
    }
    for (name, region) in &regions {
        assert!(
            blocks.iter().any(|(_, b)| b == region),
            "examples/{name}: the marked region is no longer a README.md block \
             (edit the README with the example):\n{}",
            region.join("\n")
        );
    }
}

/// Runs `prog` under `weft run ARGS`, expecting exit 0; returns stdout's lines, sorted.
fn run_example(name: &str, args: &[&str], prog: &str) -> Vec<String> {
    let exe = example(prog);
    let mut a = args.to_vec();
    a.push(&exe);
    let done = run(name, &a, T);
    assert_eq!(done.code(), Some(0), "{prog} {args:?}: {}", done.dump());
    let mut lines: Vec<String> = done.stdout.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

fn expect(got: &[String], want: &[String], what: &str) {
    assert_eq!(
        got, want,
        "{what}: stdout (sorted) is not what the README promises"
    );
}

#[test]
fn readme_wireup_client_and_groups_run() {
    for (name, args) in [
        ("rd-wire1", &["-n", "6"][..]),
        ("rd-wire2", &["--nodes", "2", "-n", "6"]),
    ] {
        let got = run_example(name, args, "readme_wireup");
        let mut want = Vec::new();
        for r in 0..6 {
            want.push(format!("rank {r} got \"card of rank 5\""));
            want.push(format!("rank {r} group of 6 pgcid Some(2)"));
            want.push("readme_wireup ok".to_owned());
        }
        want.sort();
        expect(&got, &want, &format!("readme_wireup {args:?}"));
    }
}

#[test]
fn readme_messaging_runs() {
    for (name, args) in [
        ("rd-msg1", &["-n", "4"][..]),
        ("rd-msg2", &["--nodes", "2", "-n", "4"]),
    ] {
        let got = run_example(name, args, "readme_messaging");
        let want: Vec<String> = (0..4)
            .map(|r| format!("rank {r} got [{0}] from {0}, big intact: true", (r + 3) % 4))
            .collect();
        expect(&got, &want, &format!("readme_messaging {args:?}"));
    }
}

#[test]
fn readme_sessions_run() {
    for (name, args) in [
        ("rd-ses1", &["-n", "4"][..]),
        ("rd-ses2", &["--nodes", "2", "-n", "4"]),
    ] {
        let got = run_example(name, args, "readme_sessions");
        let mut want: Vec<String> = (0..4)
            .map(|r| format!("rank {r} of 4, context id (PGCID) 2"))
            .chain((0..4).map(|_| "evens has 2 members".to_owned()))
            .collect();
        want.sort();
        expect(&got, &want, &format!("readme_sessions {args:?}"));
    }
}

/// The scan with the README's user operation: member r of each half gets r+1 ones.
#[test]
fn readme_collectives_scan_gives_1_11_111_1111() {
    for (name, n, nodes) in [("rd-coll1", 4u32, 1u32), ("rd-coll2", 8, 2)] {
        let (ns, nn) = (n.to_string(), nodes.to_string());
        let got = run_example(name, &["--nodes", &nn, "-n", &ns], "readme_collectives");
        let ones = |k: u32| "1".repeat(k as usize);
        let mut want: Vec<String> = (0..n)
            .map(|r| {
                format!(
                    "rank {r} of a node of {}: total {n}, scan {}",
                    n / nodes,
                    ones(r / 2 + 1)
                )
            })
            .chain((0..n).map(|_| format!("sum [{n}.0, {n}.0, {n}.0, {n}.0]")))
            .collect();
        want.sort();
        expect(
            &got,
            &want,
            &format!("readme_collectives -n {n} --nodes {nodes}"),
        );
    }
}

#[test]
fn readme_fabric_fence_and_create_comm_run() {
    for (name, args) in [
        ("rd-fw1", &["-n", "4"][..]),
        ("rd-fw2", &["--nodes", "2", "-n", "4"]),
    ] {
        let got = run_example(name, args, "readme_fabric_wire");
        let want: Vec<String> = (0..4)
            .map(|r| format!("rank {r} card of 64 bytes, comm of 4"))
            .collect();
        expect(&got, &want, &format!("readme_fabric_wire {args:?}"));
    }
}
