//! The PMI-1 and PMI-2 wire protocols under `weft run` (issue 18, section 2; spawn: issue
//! 33). PMI-1: a plain client written in the shell (every request, replies checked line by
//! line, malformed and unknown requests refused with an error reply, keys of another node
//! found after a barrier), and a spawn as MPICH 4.0's `PMI_Spawn_multiple` writes it (the
//! children told they were spawned, reading the parent's preput key; a malformed spawn
//! refused), and its name service (publish, lookup, unpublish, refusals). PMI-2: a shell client (framing, errors) and Slurm's PMI-2 library
//! (`benches/mpi/pmi2_client.c`: init, job id, process mapping, node attributes,
//! put/fence/get with escaped values; `PMI2_Job_Spawn` with a preput key, a name published
//! by the parent and looked up by the children) on one and two
//! nodes, skipped without it unless `WEFT_REQUIRE_PMI2` is set. (Debian's MPICH 4.0.2,
//! built for UCX, cannot `MPI_Comm_spawn` even under its own `mpiexec`: its port name does
//! not hold a UCX address, so the protocol is tested as MPICH speaks it.)
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{available, build_c, clean, run, script};

/// A PMI-1 client in the shell: each request line, then the reply as `rank R: REPLY`.
const PMI_SH: &str = r#"
fd=$PMI_FD
ask() { echo "$1" >&$fd; read -r line <&$fd; echo "rank $PMI_RANK: $2 $line"; }
ask "cmd=init pmi_version=1 pmi_subversion=1" init
ask "cmd=get_maxes" maxes
ask "cmd=get_appnum" appnum
ask "cmd=get_universe_size" universe
ask "cmd=put kvsname=x key=card$PMI_RANK value=v$PMI_RANK" put
ask "cmd=barrier_in" barrier
ask "cmd=get kvsname=x key=card$(( (PMI_RANK + 1) % PMI_SIZE ))" next
ask "cmd=get kvsname=x key=nobody" nobody
ask "cmd=get kvsname=x key=PMI_process_mapping" mapping
ask "this is not pmi" malformed
ask "cmd=frobnicate" unknown
ask "cmd=finalize" finalize
"#;

#[test]
fn a_plain_pmi1_client_gets_every_reply_on_one_and_two_nodes() {
    for (nodes, mapping) in [("1", "(vector,(0,1,2))"), ("2", "(vector,(0,2,1))")] {
        let name = format!("pmi1-sh-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "2", "bash", "-c", PMI_SH],
            Duration::from_secs(60),
        );
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        for r in 0..2 {
            let next = (r + 1) % 2;
            for want in [
                "init cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0".to_string(),
                "maxes cmd=maxes rc=0 kvsname_max=256 keylen_max=256 vallen_max=1024".into(),
                "appnum cmd=appnum rc=0 appnum=0".into(),
                "universe cmd=universe_size rc=0 size=2".into(),
                "put cmd=put_result rc=0 msg=success".into(),
                "barrier cmd=barrier_out rc=0".into(),
                format!("next cmd=get_result rc=0 msg=success value=v{next}"),
                "nobody cmd=get_result rc=-1 msg=key_not_found".into(),
                format!("mapping cmd=get_result rc=0 msg=success value={mapping}"),
                "malformed cmd=error rc=-1 msg=malformed_request".into(),
                "unknown cmd=frobnicate rc=-1 msg=unsupported_PMI-1_request".into(),
                "finalize cmd=finalize_ack rc=0".into(),
            ] {
                assert_eq!(
                    d.lines_with(&format!("rank {r}: {want}")),
                    1,
                    "{nodes} node(s), rank {r}: {want}\n{}",
                    d.dump()
                );
            }
        }
        clean(&name, &d);
    }
}

/// A PMI-1 spawn as MPICH 4.0's `PMI_Spawn_multiple` writes it (one line per key, the
/// arguments first, `endcmd`), from rank 0 of a shell job: 2 children of this script with
/// 2 arguments (one with a space and an `=`), the preput key MPICH's `MPI_Comm_spawn`
/// passes, the `wdir` info key. The children (told by `PMI_SPAWNED`) read the key and print
/// what they got; then a spawn block without `execname` and one with a count that is not
/// a number are refused.
const PMI_SPAWN_SH: &str = r#"
fd=$PMI_FD
echo "cmd=init pmi_version=1 pmi_subversion=1" >&$fd; read -r line <&$fd
if [ -n "$PMI_SPAWNED" ]; then
  echo "cmd=get kvsname=k key=PARENT_ROOT_PORT_NAME" >&$fd; read -r line <&$fd
  echo "child $PMI_RANK/$PMI_SIZE spawned=$PMI_SPAWNED pwd=$PWD args=$1|$2 $line"
  echo "cmd=finalize" >&$fd; read -r line <&$fd
  exit 0
fi
if [ "$PMI_RANK" = 0 ]; then
  printf 'mcmd=spawn\nnprocs=2\nexecname=bash\ntotspawns=1\nspawnssofar=1\narg1=%s\n' "$0" >&$fd
  printf 'arg2=one two=three\n' >&$fd
  printf 'arg3=four\nargcnt=3\npreput_num=1\npreput_key_0=PARENT_ROOT_PORT_NAME\npreput_val_0=tag#0$port=1$\ninfo_num=1\ninfo_key_0=wdir\ninfo_val_0=/\nendcmd\n' >&$fd
  read -r line <&$fd; echo "parent: $line"
  printf 'mcmd=spawn\nnprocs=2\ntotspawns=1\nspawnssofar=1\nendcmd\n' >&$fd
  read -r line <&$fd; echo "parent: no execname: $line"
  printf 'mcmd=spawn\nnprocs=two\nexecname=bash\ntotspawns=1\nspawnssofar=1\nendcmd\n' >&$fd
  read -r line <&$fd; echo "parent: bad count: $line"
fi
echo "cmd=finalize" >&$fd; read -r line <&$fd
"#;

#[test]
fn a_pmi1_spawn_starts_children_that_read_the_preput_key_on_one_and_two_nodes() {
    let sh = script("pmi1-spawn", "pmi-spawn.sh", PMI_SPAWN_SH);
    for nodes in ["1", "2"] {
        let name = format!("pmi1-spawn-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "2", "bash", &sh],
            Duration::from_secs(60),
        );
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        assert_eq!(
            d.lines_with("parent: cmd=spawn_result rc=0 errcodes=0,0"),
            1,
            "{}",
            d.dump()
        );
        for r in 0..2 {
            let want = format!(
                "child {r}/2 spawned=1 pwd=/ args=one two=three|four \
                 cmd=get_result rc=0 msg=success value=tag#0$port=1$"
            );
            assert_eq!(d.lines_with(&want), 1, "{want}\n{}", d.dump());
        }
        assert_eq!(
            d.lines_with(
                "parent: no execname: cmd=spawn_result rc=-1 msg=a_spawn_block_without_execname"
            ),
            1,
            "{}",
            d.dump()
        );
        assert_eq!(
            d.lines_with(
                "parent: bad count: cmd=spawn_result rc=-1 msg=nprocs_\"two\"_is_not_a_count"
            ),
            1,
            "{}",
            d.dump()
        );
        clean(&name, &d);
    }
}

/// PMI-1's name service (MPICH's `MPI_Publish_name`, `MPI_Lookup_name`,
/// `MPI_Unpublish_name`) between two ranks: a name published by one is found by the other,
/// not published twice, not withdrawn by another, gone once withdrawn; bad requests refused.
const PMI_NAMES_SH: &str = r#"
fd=$PMI_FD
ask() { echo "$1" >&$fd; read -r line <&$fd; echo "rank $PMI_RANK: $2 $line"; }
ask "cmd=init pmi_version=1 pmi_subversion=1" init
[ "$PMI_RANK" = 0 ] && ask "cmd=publish_name service=svc-a port=tag#0\$p=1\$" publish
ask "cmd=barrier_in" barrier
[ "$PMI_RANK" = 1 ] && ask "cmd=lookup_name service=svc-a" lookup
[ "$PMI_RANK" = 1 ] && ask "cmd=lookup_name service=nobody" lookup-missing
[ "$PMI_RANK" = 1 ] && ask "cmd=unpublish_name service=svc-a" unpublish-other
[ "$PMI_RANK" = 0 ] && ask "cmd=publish_name service=svc-a port=again" publish-again
ask "cmd=barrier_in" barrier
[ "$PMI_RANK" = 0 ] && ask "cmd=unpublish_name service=svc-a" unpublish
ask "cmd=barrier_in" barrier
[ "$PMI_RANK" = 1 ] && ask "cmd=lookup_name service=svc-a" lookup-gone
ask "cmd=publish_name service=x" publish-bad
ask "cmd=finalize" finalize
"#;

#[test]
fn pmi1_names_are_published_looked_up_and_withdrawn_on_one_and_two_nodes() {
    let sh = script("pmi1-names", "pmi-names.sh", PMI_NAMES_SH);
    for nodes in ["1", "2"] {
        let name = format!("pmi1-names-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "2", "bash", &sh],
            Duration::from_secs(60),
        );
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        for want in [
            "rank 0: publish cmd=publish_result rc=0 msg=success",
            "rank 1: lookup cmd=lookup_result rc=0 msg=success port=tag#0$p=1$",
            "rank 1: lookup-missing cmd=lookup_result rc=-1 msg=not_published",
            "rank 1: unpublish-other cmd=unpublish_result rc=-1 msg=not_published",
            "rank 0: publish-again cmd=publish_result rc=-1 msg=published_already",
            "rank 0: unpublish cmd=unpublish_result rc=0 msg=success",
            "rank 1: lookup-gone cmd=lookup_result rc=-1 msg=not_published",
            "rank 0: publish-bad cmd=publish_result rc=-1 msg=publish_name_needs_service_and_port",
            "rank 1: publish-bad cmd=publish_result rc=-1 msg=publish_name_needs_service_and_port",
        ] {
            assert_eq!(
                d.lines_with(want),
                1,
                "{nodes} node(s): {want}\n{}",
                d.dump()
            );
        }
        clean(&name, &d);
    }
}

/// A PMI-2 client in the shell: the PMI-1 init asking for version 2, then PMI-2 commands
/// framed with their length, each reply printed as `rank R: WHAT REPLY`.
const PMI2_SH: &str = r#"
fd=$PMI_FD
echo "cmd=init pmi_version=2 pmi_subversion=0" >&$fd
read -r line <&$fd; echo "rank $PMI_RANK: init $line"
ask() { printf '%-6d%s' "${#1}" "$1" >&$fd; read -r -N 6 len <&$fd; read -r -N "$len" body <&$fd; echo "rank $PMI_RANK: $2 $body"; }
ask "cmd=fullinit;pmirank=$PMI_RANK;threaded=FALSE;" fullinit
ask "cmd=frobnicate;" unknown
ask "cmd=kvs-put;key=a" malformed
ask "cmd=info-getjobattr;key=universeSize;" universe
ask "cmd=finalize;" finalize
"#;

/// `benches/mpi/pmi2_client.c` built against Slurm's PMI-2 library, or `None` (skipped,
/// with the reason printed) when it is not installed and `WEFT_REQUIRE_PMI2` is not set.
fn pmi2_client() -> Option<String> {
    let have = std::path::Path::new("/usr/include/slurm/pmi2.h").exists();
    let hint = "Slurm's PMI-2 library is missing (apt-get install libpmi2-0-dev)";
    available(have, "WEFT_REQUIRE_PMI2", hint).then(|| {
        let flags = ["-Wall", "-lpmi2", "-lpthread"].map(str::to_owned);
        build_c("cc", "pmi2_client.c", "pmi2_client", &flags)
    })
}

#[test]
fn pmi2_clients_get_every_reply_on_one_and_two_nodes() {
    let d = run(
        "pmi2-sh",
        &["-n", "2", "bash", "-c", PMI2_SH],
        Duration::from_secs(60),
    );
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    for r in 0..2 {
        for want in [
            "init cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0".to_string(),
            format!(
                "fullinit cmd=fullinit-response;pmi-version=2;pmi-subversion=0;rank={r};size=2;appnum=0;"
            ),
            "unknown cmd=frobnicate-response;rc=-1;errmsg=unsupported PMI-2 command;".into(),
            "malformed cmd=error-response;rc=-1;errmsg=malformed command".into(),
            "universe cmd=info-getjobattr-response;found=TRUE;value=2;rc=0;".into(),
            "finalize cmd=finalize-response;rc=0;".into(),
        ] {
            assert_eq!(
                d.lines_with(&format!("rank {r}: {want}")),
                1,
                "rank {r}: {want}\n{}",
                d.dump()
            );
        }
    }
    clean("pmi2-sh", &d);
    let Some(client) = pmi2_client() else {
        return;
    };
    for (nodes, mapping) in [("1", "(vector,(0,1,4))"), ("2", "(vector,(0,2,2))")] {
        let name = format!("pmi2-slurm-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "4", &client],
            Duration::from_secs(60),
        );
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        assert_eq!(d.lines_with("FAILED"), 0, "{}", d.dump());
        for r in 0..4 {
            for check in ["init", "jobid", "mapping", "nodeattr", "kvs", "finalize"] {
                assert_eq!(
                    d.lines_with(&format!("rank {r}: {check} ok")),
                    1,
                    "{nodes} node(s), rank {r}: {check}\n{}",
                    d.dump()
                );
            }
            assert_eq!(
                d.lines_with(&format!("rank {r}: mapping {mapping}")),
                1,
                "{}",
                d.dump()
            );
        }
        clean(&name, &d);
    }
}

#[test]
fn a_pmi2_job_spawn_starts_children_told_their_spawner_on_one_and_two_nodes() {
    let Some(client) = pmi2_client() else {
        return;
    };
    for nodes in ["1", "2"] {
        let name = format!("pmi2-spawn-{nodes}");
        let d = run(
            &name,
            &["--nodes", nodes, "-n", "2", &client, "spawn"],
            Duration::from_secs(60),
        );
        assert_eq!(d.code(), Some(0), "{}", d.dump());
        assert_eq!(d.lines_with("parent: spawn rc 0 jobid "), 1, "{}", d.dump());
        assert_eq!(d.lines_with("parent: publish rc 0"), 1, "{}", d.dump());
        assert_eq!(d.lines_with("errors 0,0"), 1, "{}", d.dump());
        for r in 0..2 {
            let want = format!(
                "child {r}/2: spawned 1 appnum 0 args a b c=d parent port tag#0$port-of-parent$"
            );
            assert_eq!(d.lines_with(&want), 1, "{want}\n{}", d.dump());
            let want = format!("child {r}: lookup rc 0 port port;by=name");
            assert_eq!(d.lines_with(&want), 1, "{want}\n{}", d.dump());
        }
        clean(&name, &d);
    }
}
