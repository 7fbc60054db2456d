//! Process groups through the real launcher, servers and sockets, on 1 and 2 logical nodes.
#![allow(missing_docs)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{run, Done};

const T: Duration = Duration::from_secs(60);

fn probe(name: &str, nodes: &str, n: &str, scenario: &str) -> Done {
    let p = common::probe("group_probe");
    run(
        name,
        &["--nodes", nodes, "--map-by", "node", "-n", n, &p, scenario],
        T,
    )
}

/// The value after `key ` on each line that has it.
fn field<'a>(done: &'a Done, key: &str) -> Vec<&'a str> {
    done.stdout
        .lines()
        .filter_map(|l| l.split(&format!(" {key} ")).nth(1))
        .map(|rest| rest.split(' ').next().unwrap_or(""))
        .collect()
}

#[test]
fn constructs_assign_one_pgcid_per_group_never_reused() {
    for (name, nodes) in [("grp-basic1", "1"), ("grp-basic2", "2")] {
        let done = probe(name, nodes, "4", "basic");
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert_eq!(done.lines_with(" ok"), 4, "{}", done.dump());
        // Every member got the same PGCID for the same group, none equal to the world's.
        let first: BTreeSet<&str> = field(&done, "world-copy pgcid").into_iter().collect();
        assert_eq!(first.len(), 1, "{}", done.dump());
        let again: BTreeSet<&str> = field(&done, "reconstructed pgcid").into_iter().collect();
        assert_eq!(again.len(), 1, "{}", done.dump());
        assert_ne!(first, again, "{}", done.dump());
        assert!(
            !first.contains("1"),
            "the world PGCID reused: {}",
            done.dump()
        );
        // The even ranks' group has its own PGCID, the same at both members.
        let evens: BTreeSet<&str> = field(&done, "evens")
            .into_iter()
            .filter(|v| *v != "None")
            .collect();
        assert_eq!(evens.len(), 1, "{}", done.dump());
        // Queries: rank 0 is in both groups, rank 1 only in the world copy.
        let line0 = done
            .stdout
            .lines()
            .find(|l| l.starts_with("rank 0 group"))
            .unwrap();
        assert!(
            line0.contains("\"evens\"") && line0.contains("\"world-copy\""),
            "{line0}"
        );
        let line1 = done
            .stdout
            .lines()
            .find(|l| l.starts_with("rank 1 group"))
            .unwrap();
        assert!(
            !line1.contains("\"evens\"") && line1.contains("\"world-copy\""),
            "{line1}"
        );
    }
}

#[test]
fn an_optional_group_completes_without_a_member_that_never_joins() {
    for (name, nodes) in [("grp-opt1", "1"), ("grp-opt2", "2")] {
        let done = probe(name, nodes, "4", "optional-timeout");
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert_eq!(
            done.lines_with("members [0, 1, 2] left_out [3]"),
            3,
            "{}",
            done.dump()
        );
        let pgcids: BTreeSet<&str> = field(&done, "pgcid").into_iter().collect();
        assert_eq!(pgcids.len(), 1, "{}", done.dump());
    }
}

#[test]
fn a_plain_construct_times_out_naming_the_missing_member() {
    for (name, nodes) in [("grp-to1", "1"), ("grp-to2", "2")] {
        let done = probe(name, nodes, "4", "timeout");
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert_eq!(done.lines_with("timeout missing [3]"), 3, "{}", done.dump());
    }
}

#[test]
fn a_member_killed_before_joining_fails_the_construct_naming_it() {
    for (name, nodes) in [("grp-kill1", "1"), ("grp-kill2", "2")] {
        let done = probe(name, nodes, "4", "killed-member");
        // The launcher reports the abort (SIGABRT = 6).
        assert_eq!(done.code(), Some(134), "{}", done.dump());
        assert_eq!(
            done.lines_with("construct failed: rank 3 gone"),
            3,
            "{}",
            done.dump()
        );
        for ms in done.gone_after_ms() {
            assert!(ms < 2000, "took {ms} ms: {}", done.dump());
        }
    }
}

#[test]
fn notify_termination_completes_without_a_dead_member() {
    for (name, nodes) in [("grp-nt1", "1"), ("grp-nt2", "2")] {
        let done = probe(name, nodes, "4", "killed-member-tolerant");
        assert_eq!(done.code(), Some(134), "{}", done.dump());
        assert_eq!(
            done.lines_with("members [0, 1, 2] left_out [3]"),
            3,
            "{}",
            done.dump()
        );
    }
}

#[test]
fn survivors_destruct_a_notify_termination_group_without_the_dead() {
    for (name, nodes) in [("grp-dd1", "1"), ("grp-dd2", "2")] {
        let done = probe(name, nodes, "4", "destruct-dead");
        assert_eq!(done.code(), Some(134), "{}", done.dump());
        assert_eq!(
            done.lines_with("destructed without 3"),
            3,
            "{}",
            done.dump()
        );
    }
}

#[test]
fn group_ids_in_use_reserved_or_used_twice_concurrently_are_errors() {
    for (name, nodes) in [("grp-ids1", "1"), ("grp-ids2", "2")] {
        let done = probe(name, nodes, "4", "ids");
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert_eq!(
            done.lines_with("in_use true namespace true reserved true twice_errors 1"),
            4,
            "{}",
            done.dump()
        );
    }
}

#[test]
fn local_only_groups_stay_on_their_node_and_still_get_pgcids() {
    let done = probe("grp-local2", "2", "4", "local-only");
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    // --map-by node: node 0 holds ranks 0 and 2, node 1 ranks 1 and 3.
    assert_eq!(
        done.lines_with("node 0 members [0, 2]"),
        2,
        "{}",
        done.dump()
    );
    assert_eq!(
        done.lines_with("node 1 members [1, 3]"),
        2,
        "{}",
        done.dump()
    );
    assert_eq!(done.lines_with("refused_remote true"), 4, "{}", done.dump());
    let pgcids: BTreeSet<&str> = field(&done, "pgcid").into_iter().collect();
    assert_eq!(
        pgcids.len(),
        2,
        "one PGCID per node's group: {}",
        done.dump()
    );
}

#[test]
fn a_nonblocking_construct_completes_under_test() {
    let done = probe("grp-nb2", "2", "4", "nonblocking");
    assert_eq!(done.code(), Some(0), "{}", done.dump());
    assert_eq!(done.lines_with("nb members 4"), 4, "{}", done.dump());
    let pgcids: BTreeSet<&str> = field(&done, "pgcid").into_iter().collect();
    assert_eq!(pgcids.len(), 1, "{}", done.dump());
    // The ranks that arrived first polled while rank 0 was late.
    assert!(done.lines_with("polls many") >= 3, "{}", done.dump());
}

#[test]
fn members_that_disagree_on_directives_get_an_error() {
    for (name, nodes) in [("grp-mm1", "1"), ("grp-mm2", "2")] {
        let done = probe(name, nodes, "4", "mismatch");
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert_eq!(done.lines_with("mismatch error"), 4, "{}", done.dump());
    }
}

#[test]
fn member_failed_events_go_to_the_leader_or_every_member_through_the_handler_chain() {
    for (name, nodes) in [("grp-mf1", "1"), ("grp-mf2", "2")] {
        let done = probe(name, nodes, "4", "member-failed");
        assert_eq!(done.code(), Some(134), "{}", done.dump());
        let line = |r: u32| {
            done.stdout
                .lines()
                .find(|l| l.starts_with(&format!("rank {r} member-failed")))
                .unwrap_or_else(|| panic!("no line of rank {r}: {}", done.dump()))
                .to_owned()
        };
        assert!(
            line(0).contains(r#"groups ["all-hear", "leader-hears"]"#),
            "{}",
            line(0)
        );
        for r in [1, 2] {
            assert!(line(r).contains(r#"groups ["all-hear"] "#), "{}", line(r));
        }
        // single-code, then multi-code, then default, each seeing the results before it.
        assert!(
            line(1).contains(r#""single[]@all-hear", "multi[\"single\"]@all-hear", "default[\"single\", \"multi\"]@all-hear""#),
            "{}",
            line(1)
        );
    }
}

#[test]
fn a_failed_leader_is_replaced_by_the_first_claimant() {
    for (name, nodes) in [("grp-ld1", "1"), ("grp-ld2", "2")] {
        let done = probe(name, nodes, "4", "leader");
        assert_eq!(done.code(), Some(134), "{}", done.dump());
        // The leader-failed event reached each survivor before its handler existed.
        assert_eq!(
            done.lines_with("leader-failed from cache 1"),
            3,
            "{}",
            done.dump()
        );
        assert_eq!(done.lines_with("claim won"), 1, "{}", done.dump());
        assert_eq!(done.lines_with("claim lost"), 1, "{}", done.dump());
        let winners: BTreeSet<&str> = field(&done, "selected").into_iter().collect();
        assert_eq!(winners.len(), 1, "{}", done.dump());
        let w = winners.iter().next().unwrap();
        assert!(*w == "0" || *w == "1", "{}", done.dump());
        let won_line = done
            .stdout
            .lines()
            .find(|l| l.contains("claim won"))
            .unwrap();
        assert!(
            won_line.starts_with(&format!("rank {w} ")),
            "{}",
            done.dump()
        );
    }
}

#[test]
fn a_member_that_leaves_is_an_event_for_the_others() {
    for (name, nodes) in [("grp-lv1", "1"), ("grp-lv2", "2")] {
        let done = probe(name, nodes, "4", "leave");
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert_eq!(
            done.lines_with("member-left rank Some(1) members [0, 2, 3] query [0, 2, 3]"),
            3,
            "{}",
            done.dump()
        );
    }
}

#[test]
fn psets_defined_and_deleted_while_the_job_runs_reach_every_process() {
    for (name, nodes) in [("grp-ps1", "1"), ("grp-ps2", "2")] {
        let done = probe(name, nodes, "4", "psets");
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        assert_eq!(
            done.lines_with("refused twice true builtin true outside true unknown true"),
            1,
            "{}",
            done.dump()
        );
        assert_eq!(
            done.lines_with(
                r#"defined Some("dyn") [1, 2] members Some([1, 2]) listed true after delete None"#
            ),
            4,
            "{}",
            done.dump()
        );
    }
}

#[test]
fn invitations_form_a_group_of_those_that_accept() {
    for (name, nodes) in [("grp-inv1", "1"), ("grp-inv2", "2")] {
        let done = probe(name, nodes, "4", "invite");
        assert_eq!(done.code(), Some(0), "{}", done.dump());
        let leader = done
            .stdout
            .lines()
            .find(|l| l.starts_with("rank 0 formed"))
            .unwrap_or_else(|| panic!("{}", done.dump()));
        assert!(
            leader.contains(r#"members [0, 1] left_out [2, 3]"#)
                && leader.contains(
                    r#"answers ["InviteAccepted:1", "InviteDeclined:2", "InviteFailed:3"]"#
                ),
            "{leader}"
        );
        let p0 = field(&done, "pgcid");
        assert_eq!(p0.len(), 2, "{}", done.dump());
        assert_eq!(p0[0], p0[1], "{}", done.dump());
        assert_eq!(
            done.lines_with("rank 1 joined members [0, 1]"),
            1,
            "{}",
            done.dump()
        );
        assert_eq!(done.lines_with("rank 2 declined"), 1, "{}", done.dump());
        assert_eq!(
            done.lines_with("rank 3 late join refused true"),
            1,
            "{}",
            done.dump()
        );
    }
}

#[test]
fn a_leader_that_dies_during_invitations_aborts_the_construct() {
    for (name, nodes) in [("grp-ia1", "1"), ("grp-ia2", "2")] {
        let done = probe(name, nodes, "3", "invite-abort");
        assert_eq!(done.code(), Some(134), "{}", done.dump());
        assert_eq!(
            done.lines_with("rank 1 join failed abort after"),
            1,
            "{}",
            done.dump()
        );
        assert_eq!(
            done.lines_with("rank 2 join none abort after"),
            1,
            "{}",
            done.dump()
        );
    }
}
