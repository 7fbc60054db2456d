//! Unit tests of the launcher's planning (`launcher::plan`).

use super::*;

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn parses_mpmd_contexts_and_options() {
    let s = parse_run_args(&args(
        "--nodes 2 --map-by node -n 3 --pset ocean ./a x y : -n 2 --pset ice -- ./b -n 5",
    ))
    .unwrap();
    assert_eq!(s.nodes, 2);
    assert_eq!(s.map_by, MapBy::Node);
    assert_eq!(s.apps.len(), 2);
    assert_eq!(
        s.apps[0],
        AppContext {
            n: 3,
            pset: Some("ocean".into()),
            program: "./a".into(),
            args: args("x y")
        }
    );
    assert_eq!(
        s.apps[1],
        AppContext {
            n: 2,
            pset: Some("ice".into()),
            program: "./b".into(),
            args: args("-n 5")
        }
    );
}

#[test]
fn rejects_bad_command_lines_with_a_reason() {
    for (line, want) in [
        ("./a", "no -n"),
        ("-n 0 ./a", "at least 1"),
        ("-n x ./a", "not a valid number"),
        ("-n 2 ./a :", "nothing after"),
        ("--bind-to socket -n 1 ./a", "unknown policy"),
        ("--frobnicate -n 1 ./a", "unknown option"),
        ("-n 1", "missing PROGRAM"),
        ("--timeout -3 -n 1 ./a", "positive"),
    ] {
        let e = parse_run_args(&args(line)).unwrap_err().to_string();
        assert!(e.contains(want), "{line:?} gave {e:?}, wanted {want:?}");
    }
}

#[test]
fn maps_by_slot_and_by_node_and_builds_psets() {
    let mut s = parse_run_args(&args("--nodes 2 -n 3 --pset a ./a : -n 2 --pset b ./b")).unwrap();
    let p = build_plan(&s, "t").unwrap();
    let nodes: Vec<u32> = p.job.procs.iter().map(|p| p.node).collect();
    assert_eq!(nodes, vec![0, 0, 0, 1, 1]);
    assert_eq!(p.job.procs[4].local_rank, 1);
    assert_eq!(p.job.pset_members("b", 0), Some(vec![3, 4]));
    assert_eq!(p.job.apps[1].first_rank, 3);
    s.map_by = MapBy::Node;
    let p = build_plan(&s, "t").unwrap();
    let nodes: Vec<u32> = p.job.procs.iter().map(|p| p.node).collect();
    assert_eq!(nodes, vec![0, 1, 0, 1, 0]);
    assert_eq!(p.job.ranks_on(1), vec![1, 3]);
    assert!(p.job.nodes[1].hostname.ends_with("-n1"));
}

#[test]
fn slot_mapping_uses_every_node_in_balanced_blocks() {
    let s = parse_run_args(&args("--nodes 3 -n 7 ./a")).unwrap();
    let p = build_plan(&s, "t").unwrap();
    let nodes: Vec<u32> = p.job.procs.iter().map(|p| p.node).collect();
    assert_eq!(nodes, vec![0, 0, 0, 1, 1, 2, 2]);
    let s = parse_run_args(&args("--nodes 4 -n 2 ./a")).unwrap();
    assert!(build_plan(&s, "t")
        .unwrap_err()
        .to_string()
        .contains("use --nodes 2 or fewer"));
}

#[test]
fn reserved_pset_names_are_refused() {
    let s = parse_run_args(&args("-n 1 --pset weft://world ./a")).unwrap();
    assert!(build_plan(&s, "t")
        .unwrap_err()
        .to_string()
        .contains("reserved"));
}

#[test]
fn binding_gives_each_process_a_core() {
    let s = parse_run_args(&args("--bind-to core --nodes 2 -n 4 ./a")).unwrap();
    let p = build_plan(&s, "t").unwrap();
    let cores = topology::cores().unwrap();
    for (r, pi) in p.job.procs.iter().enumerate() {
        assert_eq!(
            pi.cpuset.as_ref(),
            Some(&cores[r % cores.len()]),
            "rank {r}"
        );
    }
}
